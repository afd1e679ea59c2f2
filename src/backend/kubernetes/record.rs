//! The record a background Job carries in its annotations: everything a
//! process that did not create the run needs to answer for it (the job
//! token, `timeout_s`, the command summary, the expiry, a cancel mark and
//! the verdict). One type, `JobRecord`, is written by `background::submit`
//! and read back by every reader, so the schema lives in one place.
//!
//! The keys and their formats are a stored contract: Jobs written by a
//! running (or older) server must still read, so none of them may change.
//! The verdict's text is `verdict`'s (`encode_recorded` / `decode`), the
//! expiry's key is `manifest`'s (sync runs carry it too, for the reaper).
//! The deadlines and the memory limit are not in the record: the Job's
//! spec already holds them (`activeDeadlineSeconds`, the main container's
//! limits, written by the golden-tested `manifest`), and a second copy in
//! an annotation could only disagree; readers take them from the typed
//! Job view. The output is not kept either.
//! Knows the annotations, not how a run is followed or judged; the move
//! to `backend/kubernetes/record.rs` is planned (architecture-next.md).

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use crate::backend::kubernetes::manifest;
use crate::engine::port::facts::{DecidedBy, Recorded};
use crate::engine::port::{BackgroundRecord, Settled, Stored};
use crate::engine::run::verdict;
use crate::kube;
use crate::kube::objects::Job;
use crate::log;

/// The job token (`run_id` and submit time, signed): the key a caller
/// fetches with, and the proof a Job is the one the token names.
pub const ANNOTATION_TOKEN: &str = "mcp-k8s-ephemeral-job/job-token";
const ANNOTATION_TIMEOUT_S: &str = "mcp-k8s-ephemeral-job/timeout-s";
/// The image and the program's name, so `list_jobs` can tell runs apart.
/// Not the arguments: they are the caller's data (scripts, sometimes
/// secrets), and a Job annotation keeps them in etcd, and its backups, for
/// the whole retention.
const ANNOTATION_COMMAND: &str = "mcp-k8s-ephemeral-job/command";
/// The SHA-256 of the tool and arguments of a run made with an
/// idempotency key (`engine::background::idempotency`): the run's name comes from the
/// key, and a retry compares this. Only a hash: the arguments are the
/// caller's data.
const ANNOTATION_ARGUMENTS_SHA256: &str = "mcp-k8s-ephemeral-job/arguments-sha256";
/// The submitting call's span (`BackgroundRecord::traceparent`).
const ANNOTATION_TRACEPARENT: &str = "mcp-k8s-ephemeral-job/traceparent";
/// The caller the run is recorded for (`BackgroundRecord::owner`), on a
/// server with several callers: only it sees the run.
const ANNOTATION_CALLER: &str = "mcp-k8s-ephemeral-job/caller";
/// Set by `cancel`: the run was stopped on purpose, even if its pod (and
/// the partial output in its log) is gone when another process looks.
const ANNOTATION_CANCELLED_AT: &str = "mcp-k8s-ephemeral-job/cancelled-at";
/// The verdict of a run (`engine::run::verdict`'s text): every replica and a
/// restarted server read it before judging anything.
pub const ANNOTATION_OUTCOME: &str = "mcp-k8s-ephemeral-job/outcome";

/// What a background Job's annotations say.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    pub token: String,
    /// `None` when absent or not a number: the reader falls back to the
    /// pod's deadline, as it always did.
    pub timeout_s: Option<u64>,
    /// `image program`; empty when absent.
    pub command: String,
    /// Only on a run made with an idempotency key.
    pub fingerprint: Option<String>,
    /// Only when the submitting call was traced.
    pub traceparent: Option<String>,
    /// Only on a server with several callers.
    pub owner: Option<String>,
    /// RFC 3339 UTC as written; `manifest` writes it at creation.
    pub expires_at: Option<String>,
    /// RFC 3339 UTC as written by `cancel`.
    pub cancelled_at: Option<String>,
    /// The verdict; `None` when absent or not text `verdict` wrote.
    pub outcome: Option<Recorded>,
}

/// Why a Job's annotations are not a background run's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// No job token: a sync run's Job, or not one of ours.
    MissingToken { job: String },
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::MissingToken { job } => {
                write!(f, "the Job `{job}` has no `{ANNOTATION_TOKEN}` annotation; it is not a background run")
            }
        }
    }
}

impl JobRecord {
    /// The record of a background Job; `Err` when it carries no token.
    fn from_job(job: &Job) -> Result<JobRecord, RecordError> {
        JobRecord::from_annotations(&job.metadata.name, &job.metadata.annotations)
    }

    /// The record in `annotations`; `job` names the object in the error.
    fn from_annotations(job: &str, annotations: &BTreeMap<String, String>) -> Result<JobRecord, RecordError> {
        let text = |key: &str| annotations.get(key).cloned();
        let token = text(ANNOTATION_TOKEN).ok_or_else(|| RecordError::MissingToken { job: job.to_string() })?;
        Ok(JobRecord {
            token,
            timeout_s: annotations.get(ANNOTATION_TIMEOUT_S).and_then(|text| text.parse().ok()),
            command: text(ANNOTATION_COMMAND).unwrap_or_default(),
            fingerprint: text(ANNOTATION_ARGUMENTS_SHA256),
            traceparent: text(ANNOTATION_TRACEPARENT),
            owner: text(ANNOTATION_CALLER),
            expires_at: text(manifest::ANNOTATION_EXPIRES_AT),
            cancelled_at: text(ANNOTATION_CANCELLED_AT),
            outcome: annotations.get(ANNOTATION_OUTCOME).and_then(|text| verdict::decode(text)),
        })
    }

    /// The annotations that say this record; the fields that are `None`
    /// are left out, so a fresh record is what `submit` writes.
    fn to_annotations(&self) -> BTreeMap<String, String> {
        let mut annotations = BTreeMap::new();
        annotations.insert(ANNOTATION_TOKEN.to_string(), self.token.clone());
        if let Some(timeout_s) = self.timeout_s {
            annotations.insert(ANNOTATION_TIMEOUT_S.to_string(), timeout_s.to_string());
        }
        annotations.insert(ANNOTATION_COMMAND.to_string(), self.command.clone());
        if let Some(fingerprint) = &self.fingerprint {
            annotations.insert(ANNOTATION_ARGUMENTS_SHA256.to_string(), fingerprint.clone());
        }
        if let Some(traceparent) = &self.traceparent {
            annotations.insert(ANNOTATION_TRACEPARENT.to_string(), traceparent.clone());
        }
        if let Some(owner) = &self.owner {
            annotations.insert(ANNOTATION_CALLER.to_string(), owner.clone());
        }
        if let Some(expires_at) = &self.expires_at {
            annotations.insert(manifest::ANNOTATION_EXPIRES_AT.to_string(), expires_at.clone());
        }
        if let Some(cancelled_at) = &self.cancelled_at {
            annotations.insert(ANNOTATION_CANCELLED_AT.to_string(), cancelled_at.clone());
        }
        if let Some(outcome) = &self.outcome {
            annotations.insert(ANNOTATION_OUTCOME.to_string(), verdict::encode_recorded(outcome));
        }
        annotations
    }
}

/// The annotations of a merge patch that marks a run cancelled at `at`.
pub fn cancel_mark(at: SystemTime) -> BTreeMap<String, String> {
    BTreeMap::from([(ANNOTATION_CANCELLED_AT.to_string(), log::rfc3339_utc(at))])
}

/// The verdict recorded on a Job as the API returned it, if any.
pub fn recorded(job: &serde_json::Value) -> Option<Recorded> {
    verdict::decode(Job::from_value(job).metadata.annotations.get(ANNOTATION_OUTCOME)?)
}

/// The annotations `submit` writes on a background Job.
pub fn background_annotations(background: &BackgroundRecord) -> serde_json::Map<String, serde_json::Value> {
    let job_record = JobRecord {
        token: background.token.clone(),
        timeout_s: Some(background.timeout_s),
        command: background.command.clone(),
        fingerprint: background.fingerprint.clone(),
        traceparent: background.traceparent.clone(),
        owner: background.owner.clone(),
        expires_at: None,
        cancelled_at: None,
        outcome: None,
    };
    job_record.to_annotations().into_iter().map(|(key, value)| (key, serde_json::Value::String(value))).collect()
}

/// A background Job as the engine sees it; `None` for a Job that is not
/// one (no token) or whose run id cannot be read.
pub fn stored(job: &Job) -> Option<Stored> {
    let record = JobRecord::from_job(job).ok()?;
    let run_id = job.metadata.labels.get(manifest::LABEL_RUN_ID)?.clone();
    let pod_spec = &job.spec.template.spec;
    let memory_limit = pod_spec
        .containers
        .iter()
        .find(|container| container.name == manifest::MAIN_CONTAINER)
        .and_then(|main| main.resources.limits.get("memory"))
        .cloned();
    let time = |text: Option<&str>| crate::time::parse_rfc3339(text?);
    let ended_at = job.finished_condition().map(|finished| time(finished.last_transition_time.as_deref()).unwrap_or_else(SystemTime::now));
    Some(Stored {
        run_id,
        token: record.token,
        command: record.command,
        fingerprint: record.fingerprint,
        traceparent: record.traceparent,
        owner: record.owner,
        // A warm sandbox's Job is older than its run.
        created_at: time(job.metadata.annotations.get(manifest::ANNOTATION_ASSIGNED_AT).map(String::as_str))
            .or_else(|| time(job.metadata.creation_timestamp.as_deref())),
        ended_at,
        active: job.status.active > 0,
        timeout: record.timeout_s.map(Duration::from_secs),
        run_deadline: Duration::from_secs(pod_spec.active_deadline_seconds.unwrap_or(0)),
        memory_limit,
        expires_at: record.expires_at.unwrap_or_default(),
        cancelled_at: record.cancelled_at,
        // Only a claim writes when the Job was handed to its run.
        warm: job.metadata.annotations.contains_key(manifest::ANNOTATION_ASSIGNED_AT),
        verdict: record.outcome,
        sandbox: None,
    })
}

/// Attempts at the conditional patch when another writer got in between.
const PATCH_ATTEMPTS: usize = 4;

/// Writes the verdict onto the Job, first writer wins (the Job's
/// `resourceVersion` is the patch's precondition). A verdict this server
/// decided also gets the deadline that makes the Job controller end the
/// Job and start no other pod.
pub fn write_verdict(client: &kube::Client, namespace: &str, run_id: &str, verdict: &Recorded) -> Result<Settled, kube::Error> {
    let name = manifest::job_name(run_id);
    let text = verdict::encode_recorded(verdict);
    let mut last_conflict = None;
    for _ in 0..PATCH_ATTEMPTS {
        let Some(job) = client.get_if_exists(kube::Resource::JOBS, namespace, &name)? else { return Ok(Settled::NoRecord) };
        let job = Job::from_value(&job);
        if let Some(recorded) = job.metadata.annotations.get(ANNOTATION_OUTCOME).and_then(|text| verdict::decode(text)) {
            return Ok(Settled::AlreadyRecorded(recorded));
        }
        let resource_version = &job.metadata.resource_version;
        let mut patch = serde_json::json!({"metadata": {"resourceVersion": resource_version, "annotations": {ANNOTATION_OUTCOME: text}}});
        if verdict.by == DecidedBy::Server && job.finished_condition().is_none() {
            patch["spec"] = serde_json::json!({"activeDeadlineSeconds": 1});
        }
        match client.merge_patch(kube::Resource::JOBS, namespace, &name, &patch) {
            Ok(_) => return Ok(Settled::Recorded),
            // Someone changed the Job since it was read: read it again.
            Err(error) if error.is_conflict() => last_conflict = Some(error),
            Err(error) if error.is_not_found() => return Ok(Settled::NoRecord),
            Err(error) => return Err(error),
        }
    }
    Err(last_conflict.unwrap_or_else(|| kube::Error::Config(format!("the Job `{name}` kept changing while its outcome was written"))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::kubernetes::classify;
    use crate::engine::port::facts::DecidedBy;
    use crate::engine::port::spec::{RunReason, RunStatus};

    fn full_record() -> JobRecord {
        JobRecord {
            owner: Some("team-a".into()),
            token: "run-1.1767225600.sig".into(),
            timeout_s: Some(300),
            command: "python:3.12 python3".into(),
            fingerprint: Some("5d41402a".into()),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            expires_at: Some("2026-01-01T01:00:00.000Z".into()),
            cancelled_at: Some("2026-01-01T00:00:30.000Z".into()),
            outcome: Some(Recorded {
                status: RunStatus::Cancelled,
                reason: Some(RunReason::Cancelled),
                message: "the job was cancelled".into(),
                exit_code: None,
                signal: Some(9),
                by: DecidedBy::Server,
                ended_at: classify::parse_time("2026-01-01T00:00:31.250Z"),
            }),
        }
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
    }

    #[test]
    fn a_record_round_trips_through_its_annotations() {
        let full = full_record();
        let fresh = JobRecord {
            timeout_s: None,
            fingerprint: None,
            traceparent: None,
            owner: None,
            expires_at: None,
            cancelled_at: None,
            outcome: None,
            ..full_record()
        };
        for record in [full, fresh] {
            let read = JobRecord::from_annotations("j", &record.to_annotations());
            assert_eq!(read, Ok(record));
        }
    }

    #[test]
    fn the_keys_and_formats_are_the_stored_ones() {
        let written = full_record().to_annotations();
        let keys: Vec<&str> = written.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "mcp-k8s-ephemeral-job/arguments-sha256",
                "mcp-k8s-ephemeral-job/caller",
                "mcp-k8s-ephemeral-job/cancelled-at",
                "mcp-k8s-ephemeral-job/command",
                "mcp-k8s-ephemeral-job/expires-at",
                "mcp-k8s-ephemeral-job/job-token",
                "mcp-k8s-ephemeral-job/outcome",
                "mcp-k8s-ephemeral-job/timeout-s",
                "mcp-k8s-ephemeral-job/traceparent",
            ]
        );
        assert_eq!(written["mcp-k8s-ephemeral-job/timeout-s"], "300");
        assert_eq!(
            written["mcp-k8s-ephemeral-job/outcome"],
            r#"{"by":"server","ended_at":"2026-01-01T00:00:31.250Z","exit_code":null,"message":"the job was cancelled","reason":"Cancelled","signal":9,"status":"cancelled"}"#
        );
        let mark = cancel_mark(classify::parse_time("2026-01-01T00:00:30Z").unwrap());
        assert_eq!(mark, annotations(&[("mcp-k8s-ephemeral-job/cancelled-at", "2026-01-01T00:00:30.000Z")]));
    }

    #[test]
    fn malformed_or_missing_annotations() {
        let token = ("mcp-k8s-ephemeral-job/job-token", "t");
        type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Result<JobRecord, RecordError>);
        let cases: Vec<Case> = vec![
            ("no annotations", vec![], Err(RecordError::MissingToken { job: "j".into() })),
            (
                "a sync run's Job",
                vec![("mcp-k8s-ephemeral-job/expires-at", "2026-01-01T00:00:00Z")],
                Err(RecordError::MissingToken { job: "j".into() }),
            ),
            (
                "only a token",
                vec![token],
                Ok(JobRecord {
                    owner: None,
                    token: "t".into(),
                    timeout_s: None,
                    command: String::new(),
                    fingerprint: None,
                    traceparent: None,
                    expires_at: None,
                    cancelled_at: None,
                    outcome: None,
                }),
            ),
        ];
        for (name, pairs, expected) in cases {
            assert_eq!(JobRecord::from_annotations("j", &annotations(&pairs)), expected, "{name}");
        }
        let defaults: Vec<(&str, (&str, &str))> = vec![
            ("a timeout that is not a number", ("mcp-k8s-ephemeral-job/timeout-s", "5m")),
            ("a negative timeout", ("mcp-k8s-ephemeral-job/timeout-s", "-1")),
            ("a foreign verdict", ("mcp-k8s-ephemeral-job/outcome", r#"{"status":"weird","by":"server"}"#)),
            ("a verdict that is not JSON", ("mcp-k8s-ephemeral-job/outcome", "succeeded")),
        ];
        for (name, pair) in defaults {
            let record = JobRecord::from_annotations("j", &annotations(&[token, pair])).unwrap();
            assert_eq!((record.timeout_s, record.outcome), (None, None), "{name}");
        }
        let error = JobRecord::from_annotations("job-x", &BTreeMap::new()).unwrap_err();
        assert_eq!(error.to_string(), "the Job `job-x` has no `mcp-k8s-ephemeral-job/job-token` annotation; it is not a background run");
    }

    #[test]
    fn a_background_job_ends_with_its_complete_or_failed_condition() {
        let job = |conditions: serde_json::Value| {
            Job::from_value(&serde_json::json!({
                "metadata": {"labels": {manifest::LABEL_RUN_ID: "r"}, "annotations": {ANNOTATION_TOKEN: "t"}},
                "status": {"conditions": conditions}
            }))
        };
        let ended = |conditions| stored(&job(conditions)).unwrap().ended_at;
        let at = "2026-01-01T00:00:00Z";
        assert_eq!(
            ended(serde_json::json!([{"type": "Complete", "status": "True", "lastTransitionTime": at}])),
            crate::time::parse_rfc3339(at)
        );
        assert!(ended(serde_json::json!([{"type": "Failed", "status": "True", "lastTransitionTime": at}])).is_some());
        assert!(ended(serde_json::json!([{"type": "Suspended", "status": "True"}])).is_none());
        assert!(ended(serde_json::json!([{"type": "Failed", "status": "False"}])).is_none());
        assert!(stored(&Job::default()).is_none(), "a Job without a token is no background run");
    }
}
