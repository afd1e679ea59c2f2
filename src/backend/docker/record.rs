//! A background run's record on Docker, which any server process on the
//! same daemon reads: the token, `timeout_s`, the command summary, the
//! expiry, the cancel mark and the verdict.
//!
//! Labels are the only metadata Docker keeps for any process to read, and
//! they cannot change after a container's create. So each fact that comes
//! later is a container of its own, created and never started, whose
//! labels hold it and whose name is the run's:
//!
//! - `mcp-record-<run_id>` (role `record`), made with the run: the record
//!   survives the run's own container being removed from outside (the
//!   truthful reason then still reaches `fetch_job`);
//! - `mcp-cancel-<run_id>` (role `cancel`): when the run was cancelled;
//! - `mcp-verdict-<run_id>` (role `verdict`): the verdict's text
//!   (`engine::run::verdict`), with the whole record and the cancel mark
//!   copied in. Once it is there the record and cancel containers hold
//!   nothing it does not, and its writer removes them: a finished run
//!   keeps its own stopped container (its output, for any process to read
//!   again) and this one record for its retention, not four containers.
//!
//! First writer wins because Docker refuses a second container of one name
//! with 409: whoever created `mcp-verdict-<run_id>` decided, and everyone
//! else reads that container's labels. A named volume with labels would do
//! the same, but the client has no volume create and a created container
//! costs about as little (a few files in the data root, no process). The
//! record containers use the run's own image, which the daemon has, and
//! carry the run's ownership and expiry labels, so `remove` and the reaper
//! treat them like the run's container.
//!
//! Knows the labels and the client; not how a run is followed or judged.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::backend::docker::{classify, spec};
use crate::docker::objects::{ContainerInspect, ContainerSpec, ContainerSummary, HostConfig};
use crate::docker::{self, Filters};
use crate::engine::port::facts::Recorded;
use crate::engine::port::{Settled, Stored};
use crate::engine::run::verdict;
use crate::log;

pub const ROLE_RECORD: &str = "record";
const ROLE_VERDICT: &str = "verdict";
const ROLE_CANCEL: &str = "cancel";
/// On the verdict container: `engine::run::verdict`'s text.
const LABEL_VERDICT: &str = "mcp-k8s-ephemeral-job/verdict";
/// On the cancel container, and copied onto the verdict: RFC 3339 UTC.
const LABEL_CANCELLED_AT: &str = "mcp-k8s-ephemeral-job/cancelled-at";
/// On the verdict container: when the run was created, in seconds since
/// the epoch (the verdict container's own creation is the run's end).
const LABEL_CREATED: &str = "mcp-k8s-ephemeral-job/created";

/// The name of a run's container of `role`.
pub fn container_name(role: &str, run_id: &str) -> String {
    format!("mcp-{role}-{run_id}")
}

/// The containers of one run, by role, as listed.
#[derive(Clone, Debug, Default)]
pub struct RunContainers {
    pub run: Option<ContainerSummary>,
    pub record: Option<ContainerSummary>,
    pub verdict: Option<ContainerSummary>,
    pub cancel: Option<ContainerSummary>,
}

impl RunContainers {
    /// Sorts `containers` (one run's) by their role label.
    fn from_list(containers: Vec<ContainerSummary>) -> RunContainers {
        let mut sorted = RunContainers::default();
        for container in containers {
            let slot = match container.labels.get(spec::LABEL_ROLE).map(String::as_str) {
                Some(spec::ROLE_RUN) => &mut sorted.run,
                Some(ROLE_RECORD) => &mut sorted.record,
                Some(ROLE_VERDICT) => &mut sorted.verdict,
                Some(ROLE_CANCEL) => &mut sorted.cancel,
                _ => continue,
            };
            *slot = Some(container);
        }
        sorted
    }

    /// The verdict, if one was recorded.
    pub fn verdict(&self) -> Option<Recorded> {
        verdict::decode(self.verdict.as_ref()?.labels.get(LABEL_VERDICT)?)
    }

    /// The verdict container when it carries the whole record (a server of
    /// an earlier version wrote the verdict alone).
    fn whole_verdict(&self) -> Option<&ContainerSummary> {
        self.verdict.as_ref().filter(|verdict| verdict.labels.contains_key(spec::LABEL_TOKEN))
    }

    /// The container whose labels hold the run's record: the verdict once
    /// it has the whole record, else the record container, else the run's
    /// own.
    fn record_holder(&self) -> Option<&ContainerSummary> {
        self.whole_verdict().or(self.record.as_ref()).or(self.run.as_ref())
    }

    /// When the run was cancelled: its mark, or the mark the verdict keeps.
    fn cancelled_at(&self) -> Option<&String> {
        [&self.cancel, &self.verdict].into_iter().flatten().find_map(|container| container.labels.get(LABEL_CANCELLED_AT))
    }

    /// The record and cancel containers, once a verdict with the whole
    /// record holds what they held.
    fn superseded(&self) -> Vec<&ContainerSummary> {
        if self.whole_verdict().is_none() {
            return Vec::new();
        }
        [&self.record, &self.cancel].into_iter().flatten().collect()
    }
}

/// Every container of `run_id`, sorted by role.
pub fn containers_of(client: &docker::Client, run_id: &str) -> Result<RunContainers, docker::Error> {
    let filters =
        Filters { labels: vec![format!("{}={}", spec::LABEL_MANAGED_BY, spec::MANAGED_BY), format!("{}={run_id}", spec::LABEL_RUN_ID)] };
    Ok(RunContainers::from_list(client.container_list(&filters)?))
}

/// Every background run's containers, grouped by run id.
pub fn background_runs(client: &docker::Client) -> Result<BTreeMap<String, RunContainers>, docker::Error> {
    let filters = Filters {
        labels: vec![format!("{}={}", spec::LABEL_MANAGED_BY, spec::MANAGED_BY), format!("{}={}", spec::LABEL_MODE, spec::MODE_BACKGROUND)],
    };
    let mut by_run: BTreeMap<String, Vec<ContainerSummary>> = BTreeMap::new();
    for container in client.container_list(&filters)? {
        if let Some(run_id) = container.labels.get(spec::LABEL_RUN_ID).cloned() {
            by_run.entry(run_id).or_default().push(container);
        }
    }
    Ok(by_run.into_iter().map(|(run_id, containers)| (run_id, RunContainers::from_list(containers))).collect())
}

/// The record container of a background run: the run's labels with role
/// `record`, never started.
pub fn record_container(image: &str, run_labels: &BTreeMap<String, String>) -> ContainerSpec {
    let mut labels = run_labels.clone();
    labels.insert(spec::LABEL_ROLE.to_string(), ROLE_RECORD.to_string());
    never_started(image, labels)
}

/// A background run as the engine sees it: from its record's labels (the
/// verdict's, the record container's or the run's own, which carry the
/// same), with the run's container's state when it was inspected. `None`
/// when nothing with a token is left.
pub fn stored(run_id: &str, containers: &RunContainers, run: Option<&ContainerInspect>) -> Option<Stored> {
    let source = containers.record_holder()?;
    let labels = &source.labels;
    let token = labels.get(spec::LABEL_TOKEN)?.clone();
    let created = labels.get(LABEL_CREATED).and_then(|seconds| seconds.parse().ok()).or(u64::try_from(source.created).ok());
    let created_at = created.map(|seconds| SystemTime::UNIX_EPOCH + Duration::from_secs(seconds));
    Some(Stored {
        run_id: run_id.to_string(),
        token,
        command: labels.get(spec::LABEL_COMMAND).cloned().unwrap_or_default(),
        fingerprint: labels.get(spec::LABEL_ARGUMENTS_SHA256).cloned(),
        traceparent: labels.get(spec::LABEL_TRACEPARENT).cloned(),
        owner: labels.get(spec::LABEL_CALLER).cloned(),
        created_at,
        ended_at: run.and_then(classify::finished_at),
        active: run.is_some_and(classify::is_running),
        timeout: labels.get(spec::LABEL_TIMEOUT_S).and_then(|text| text.parse().ok()).map(Duration::from_secs),
        run_deadline: spec::labelled_run_deadline(labels),
        memory_limit: labels.get(spec::LABEL_MEMORY_LIMIT).cloned(),
        expires_at: labels.get(spec::LABEL_EXPIRES_AT).cloned().unwrap_or_default(),
        cancelled_at: containers.cancelled_at().cloned(),
        // A background run never takes a warm container here (its record
        // lives in labels, which a started container cannot gain).
        warm: false,
        verdict: containers.verdict(),
        sandbox: None,
    })
}

/// Writes the verdict as the run's `verdict` container, with the whole
/// record and the cancel mark, first writer wins; the writer then removes
/// the record and cancel containers it supersedes.
pub fn write_verdict(client: &docker::Client, run_id: &str, recorded: &Recorded) -> Result<Settled, docker::Error> {
    let containers = containers_of(client, run_id)?;
    if let Some(recorded) = containers.verdict() {
        return Ok(Settled::AlreadyRecorded(recorded));
    }
    let Some(source) = containers.record_holder() else { return Ok(Settled::NoRecord) };
    let labels = verdict_labels(source, containers.cancelled_at(), recorded);
    match client.container_create(&container_name(ROLE_VERDICT, run_id), &never_started(&source.image, labels)) {
        Ok(_) if taken_back_when_moot(client, run_id, ROLE_VERDICT)? => Ok(Settled::NoRecord),
        Ok(_) => {
            remove_superseded(client, run_id);
            Ok(Settled::Recorded)
        }
        Err(error) if error.is_conflict() => {
            // Someone wrote first: theirs is the run's verdict.
            let written = containers_of(client, run_id)?.verdict();
            Ok(written.map_or(Settled::NoRecord, Settled::AlreadyRecorded))
        }
        Err(error) => Err(error),
    }
}

/// Marks the run cancelled at `at`; a mark already there stays, and a
/// run with a verdict has ended: it is final, and no mark is made.
pub fn mark_cancelled(client: &docker::Client, run_id: &str, at: SystemTime) -> Result<(), docker::Error> {
    let containers = containers_of(client, run_id)?;
    if containers.verdict.is_some() {
        return Ok(());
    }
    let Some(source) = containers.record_holder() else {
        log::warn("no record to mark cancelled: the run's containers are gone", &[("run_id", run_id.into())]);
        return Ok(());
    };
    let mut labels = mark_labels(&source.labels, ROLE_CANCEL);
    labels.insert(LABEL_CANCELLED_AT.to_string(), log::rfc3339_utc(at));
    match client.container_create(&container_name(ROLE_CANCEL, run_id), &never_started(&source.image, labels)) {
        Ok(_) => taken_back_when_moot(client, run_id, ROLE_CANCEL).map(drop),
        Err(error) if error.is_conflict() => Ok(()),
        Err(error) => Err(error),
    }
}

/// Removes the mark of `role` just made when it is moot by now
/// (`is_moot`); whether it did.
fn taken_back_when_moot(client: &docker::Client, run_id: &str, role: &str) -> Result<bool, docker::Error> {
    if !is_moot(role, &containers_of(client, run_id)?) {
        return Ok(false);
    }
    super::try_remove_container(client, &container_name(role, run_id))?;
    Ok(true)
}

/// Whether a mark of `role` just made, with the run's containers listed
/// after it as `after`, must go again:
/// - when the run's own containers are gone: a removal (`cancel_job`'s,
///   the retention's, or one from outside) that listed the run before the
///   mark existed would leave it alone until its expiry (a removal lists
///   again until it finds nothing, so between the two no mark outlives
///   its run);
/// - a cancel mark, when a verdict is there: the run had ended, and the
///   verdict's writer, which removes the cancel container it supersedes,
///   may have listed the run before this mark existed.
fn is_moot(role: &str, after: &RunContainers) -> bool {
    let orphaned = after.run.is_none() && after.record.is_none();
    orphaned || (role == ROLE_CANCEL && after.verdict.is_some())
}

/// The verdict container's labels: the record's (`source`'s), with the
/// run's creation, the verdict and the cancel mark.
fn verdict_labels(source: &ContainerSummary, cancelled_at: Option<&String>, recorded: &Recorded) -> BTreeMap<String, String> {
    let mut labels = source.labels.clone();
    labels.insert(spec::LABEL_ROLE.to_string(), ROLE_VERDICT.to_string());
    labels.insert(LABEL_VERDICT.to_string(), verdict::encode_recorded(recorded));
    labels.insert(LABEL_CREATED.to_string(), source.created.to_string());
    if let Some(at) = cancelled_at {
        labels.insert(LABEL_CANCELLED_AT.to_string(), at.clone());
    }
    labels
}

/// Removes the record and cancel containers the verdict just written
/// supersedes. A failure is logged: they go with the run at its expiry.
fn remove_superseded(client: &docker::Client, run_id: &str) {
    match containers_of(client, run_id) {
        Ok(containers) => {
            for container in containers.superseded() {
                super::remove_container(client, &container.id, "a record the verdict supersedes was not removed; the reaper will");
            }
        }
        Err(error) => log::warn(
            "could not list the run's containers to remove the records its verdict supersedes; the reaper will",
            &[("run_id", run_id.into()), ("error", error.to_string().into())],
        ),
    }
}

/// The ownership and expiry labels of the run, with `role`.
fn mark_labels(run_labels: &BTreeMap<String, String>, role: &str) -> BTreeMap<String, String> {
    let keep = [spec::LABEL_MANAGED_BY, spec::LABEL_RUN_ID, spec::LABEL_MODE, spec::LABEL_EXPIRES_AT];
    let mut labels: BTreeMap<String, String> =
        run_labels.iter().filter(|(key, _)| keep.contains(&key.as_str())).map(|(key, value)| (key.clone(), value.clone())).collect();
    labels.insert(spec::LABEL_ROLE.to_string(), role.to_string());
    labels
}

/// A container that only carries labels: nothing starts it, and were it
/// started it could do nothing (no network, no capabilities, read-only).
pub(crate) fn never_started(image: &str, labels: BTreeMap<String, String>) -> ContainerSpec {
    ContainerSpec {
        image: image.to_string(),
        entrypoint: Some(vec!["/nonexistent".to_string()]),
        labels,
        host_config: HostConfig {
            readonly_rootfs: true,
            cap_drop: vec!["ALL".to_string()],
            security_opt: vec!["no-new-privileges".to_string()],
            network_mode: "none".to_string(),
            ..HostConfig::default()
        },
        ..ContainerSpec::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::port::facts::DecidedBy;
    use crate::engine::port::spec::{RunReason, RunStatus};

    fn summary(role: &str, extra: &[(&str, &str)]) -> ContainerSummary {
        let mut labels = BTreeMap::from([
            (spec::LABEL_MANAGED_BY.to_string(), spec::MANAGED_BY.to_string()),
            (spec::LABEL_RUN_ID.to_string(), "r".to_string()),
            (spec::LABEL_ROLE.to_string(), role.to_string()),
        ]);
        labels.extend(extra.iter().map(|(key, value)| (key.to_string(), value.to_string())));
        ContainerSummary { created: 1_800_000_000, labels, image: "busybox".into(), ..ContainerSummary::default() }
    }

    #[test]
    fn the_record_reads_back_with_its_verdict_and_cancel_mark() {
        let recorded = cancelled_by_server();
        let record_labels = [
            (spec::LABEL_TOKEN, "t"),
            (spec::LABEL_TIMEOUT_S, "30"),
            (spec::LABEL_COMMAND, "busybox sh"),
            (spec::LABEL_RUN_DEADLINE_S, "184"),
            (spec::LABEL_MEMORY_LIMIT, "64Mi"),
            (spec::LABEL_EXPIRES_AT, "2027-01-01T00:00:00Z"),
        ];
        let text = verdict::encode_recorded(&recorded);
        let containers = RunContainers::from_list(vec![
            summary(ROLE_RECORD, &record_labels),
            summary(ROLE_VERDICT, &[(LABEL_VERDICT, &text)]),
            summary(ROLE_CANCEL, &[(LABEL_CANCELLED_AT, "2026-12-01T00:00:00Z")]),
            summary("something-else", &[]),
        ]);
        assert!(containers.run.is_none(), "the run's container was removed from outside");
        let stored = stored("r", &containers, None).unwrap();
        assert_eq!(stored.token, "t");
        assert_eq!(stored.timeout, Some(Duration::from_secs(30)));
        assert_eq!(stored.run_deadline, Duration::from_secs(184));
        assert_eq!(stored.memory_limit.as_deref(), Some("64Mi"));
        assert_eq!(stored.cancelled_at.as_deref(), Some("2026-12-01T00:00:00Z"));
        assert_eq!(stored.verdict, Some(recorded));
        assert!(!stored.active && stored.ended_at.is_none());
        assert!(stored.created_at.is_some());
    }

    fn cancelled_by_server() -> Recorded {
        Recorded {
            status: RunStatus::Cancelled,
            reason: Some(RunReason::Cancelled),
            message: "m".into(),
            exit_code: None,
            signal: None,
            by: DecidedBy::Server,
            ended_at: None,
        }
    }

    #[test]
    fn the_verdict_alone_holds_the_whole_record_and_the_cancel_mark() {
        let mut record =
            summary(ROLE_RECORD, &[(spec::LABEL_TOKEN, "t"), (spec::LABEL_COMMAND, "busybox sh"), (spec::LABEL_TIMEOUT_S, "30")]);
        record.created = 1_700_000_000;
        let cancel = summary(ROLE_CANCEL, &[(LABEL_CANCELLED_AT, "2026-12-01T00:00:00Z")]);
        let recorded = cancelled_by_server();
        let before = RunContainers::from_list(vec![record.clone(), cancel]);
        let mut verdict = summary(ROLE_VERDICT, &[]);
        verdict.labels = verdict_labels(&record, before.cancelled_at(), &recorded);
        // Only the verdict is left: the run's container was removed from
        // outside, the record and the mark were superseded.
        let after = RunContainers::from_list(vec![verdict]);
        let stored = stored("r", &after, None).unwrap();
        assert_eq!((stored.token.as_str(), stored.command.as_str()), ("t", "busybox sh"));
        assert_eq!(stored.timeout, Some(Duration::from_secs(30)));
        assert_eq!(
            stored.created_at,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            "the run's creation, not the verdict's"
        );
        assert_eq!(stored.cancelled_at.as_deref(), Some("2026-12-01T00:00:00Z"));
        assert_eq!(stored.verdict, Some(recorded));
    }

    #[test]
    fn a_verdict_with_the_whole_record_supersedes_the_record_and_the_cancel_mark() {
        let whole = summary(ROLE_VERDICT, &[(spec::LABEL_TOKEN, "t")]);
        // An earlier version's verdict: the verdict only.
        let bare = summary(ROLE_VERDICT, &[]);
        let run = summary(spec::ROLE_RUN, &[(spec::LABEL_TOKEN, "t")]);
        let record = summary(ROLE_RECORD, &[(spec::LABEL_TOKEN, "t")]);
        let cancel = summary(ROLE_CANCEL, &[]);
        // The containers listed, and the roles that go.
        let cases: [(Vec<&ContainerSummary>, &[&str]); 5] = [
            (vec![&run, &record, &cancel, &whole], &[ROLE_RECORD, ROLE_CANCEL]),
            (vec![&run, &record, &whole], &[ROLE_RECORD]),
            (vec![&run, &whole], &[]),
            (vec![&run, &record, &cancel, &bare], &[]),
            (vec![&run, &record, &cancel], &[]),
        ];
        for (listed, gone) in cases {
            let containers = RunContainers::from_list(listed.into_iter().cloned().collect());
            let roles: Vec<&str> = containers.superseded().iter().map(|container| container.labels[spec::LABEL_ROLE].as_str()).collect();
            assert_eq!(roles, gone, "{containers:?}");
        }
    }

    #[test]
    fn a_mark_just_made_goes_again_when_its_run_is_gone_or_a_cancel_comes_after_the_verdict() {
        let (run, record, verdict) = (summary(spec::ROLE_RUN, &[]), summary(ROLE_RECORD, &[]), summary(ROLE_VERDICT, &[]));
        // The role of the mark, what is listed after it, and whether it goes.
        let cases: [(&str, Vec<&ContainerSummary>, bool); 8] = [
            (ROLE_VERDICT, vec![&run, &record, &verdict], false),
            (ROLE_VERDICT, vec![&record, &verdict], false),
            (ROLE_VERDICT, vec![&run, &verdict], false),
            (ROLE_VERDICT, vec![&verdict], true),
            (ROLE_CANCEL, vec![&run, &record], false),
            (ROLE_CANCEL, vec![&run, &record, &verdict], true),
            (ROLE_CANCEL, vec![&verdict], true),
            (ROLE_CANCEL, vec![], true),
        ];
        for (role, listed, moot) in cases {
            let after = RunContainers::from_list(listed.into_iter().cloned().collect());
            assert_eq!(is_moot(role, &after), moot, "{role}: {after:?}");
        }
    }

    #[test]
    fn a_run_without_a_token_is_no_background_record() {
        let containers = RunContainers::from_list(vec![summary(spec::ROLE_RUN, &[])]);
        assert!(stored("r", &containers, None).is_none());
    }

    #[test]
    fn marks_keep_ownership_and_expiry_only() {
        let run_labels = summary(spec::ROLE_RUN, &[(spec::LABEL_TOKEN, "secret-ish"), (spec::LABEL_EXPIRES_AT, "x")]).labels;
        let labels = mark_labels(&run_labels, ROLE_CANCEL);
        assert_eq!(labels.get(spec::LABEL_ROLE).map(String::as_str), Some(ROLE_CANCEL));
        assert_eq!(labels.get(spec::LABEL_EXPIRES_AT).map(String::as_str), Some("x"));
        assert!(!labels.contains_key(spec::LABEL_TOKEN));
    }
}
