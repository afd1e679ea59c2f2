//! A run ends once (issue 12): its verdict is written onto its Job before
//! anyone is told, and an end this server decided (start timeout,
//! unschedulable, lost result, an API failure it gave up on...) stops the
//! sandbox for good first, so that a pod cannot run after the caller was
//! told it did not.
//!
//! The verdict is the annotation `ANNOTATION_OUTCOME`: status, reason,
//! message, exit code and signal, who decided (the runner's result frame or
//! this server) and when. Every replica and a restarted server read it
//! before judging anything, and a process that finds one already written
//! takes it instead of its own: the first writer wins, through the Job's
//! `resourceVersion` as a precondition on the patch. Output is not part of
//! it: a process re-reads that from the pod's log while the pod exists.
//!
//! Stopping for good: the Job's `activeDeadlineSeconds` is set to 1, so the
//! Job controller fails the Job and deletes its pods and never creates
//! another, then the run's pods that have not ended are deleted at once
//! (a pod being deleted never starts a container). Knows Kubernetes and the
//! engine's types; nothing of MCP.

use std::time::SystemTime;

use serde_json::{Value, json};

use crate::backend::kubernetes::classify;
use crate::backend::kubernetes::manifest;
use crate::engine::run::Ctx;
use crate::engine::spec::{RunOutcome, RunReason, RunStatus};
use crate::kube;
use crate::kube::objects;
use crate::log;

/// The verdict of a run, on its Job.
pub const ANNOTATION_OUTCOME: &str = "mcp-k8s-ephemeral-job/outcome";
/// Longest message kept in the annotation; annotations share 256 KiB.
const MESSAGE_CHARS: usize = 2000;
/// Attempts at the conditional patch when another writer got in between.
const PATCH_ATTEMPTS: usize = 4;

/// Who decided a run's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecidedBy {
    /// The runner's result frame: the pod ends on its own, and its log
    /// keeps the output for any process that reads it.
    Runner,
    /// This server, without a result (deadlines, pod state, API trouble,
    /// a cancel): the sandbox must be stopped before the answer goes out.
    Server,
}

/// A run's end as `run::follow` decided it.
#[derive(Clone, Debug)]
pub struct Ended {
    pub outcome: RunOutcome,
    pub by: DecidedBy,
}

/// A verdict read from a Job.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    pub status: RunStatus,
    pub reason: Option<RunReason>,
    pub message: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub by: DecidedBy,
    pub ended_at: Option<SystemTime>,
}

/// What `settle` found.
#[derive(Debug, PartialEq)]
pub enum Settled {
    /// This process's verdict is now the Job's.
    Recorded,
    /// Another process (or an earlier life of this one) wrote first: its
    /// verdict is the run's.
    AlreadyRecorded(Recorded),
    /// Nothing to record on: the Job is gone (a sync run, or deleted).
    NoJob,
}

/// Whether the Job keeps the verdict: background Jobs do (any process
/// reads it); a sync run's Job is deleted right after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Yes,
    No,
}

/// Makes `ended` final: records it on the Job (with `Record::Yes`) and,
/// when this server decided it, stops the run's pods for good. An `Err`
/// means the verdict could not be written (the API did not answer): the
/// caller must not present it as the run's final result.
pub fn settle(ctx: &Ctx, run_id: &str, ended: &Ended, record: Record) -> Result<Settled, kube::Error> {
    if ended.by == DecidedBy::Runner && record == Record::No {
        return Ok(Settled::NoJob);
    }
    match record {
        // A verdict that could not be written decides nothing yet: the pod
        // is left alone, and the next reader judges again.
        Record::Yes => {
            let settled = write(ctx, run_id, ended)?;
            if ended.by == DecidedBy::Server && settled == Settled::Recorded {
                delete_live_pods(ctx, run_id);
            }
            Ok(settled)
        }
        // A sync run's caller is told either way, so its pods go even if
        // the Job could not be patched.
        Record::No => {
            let stopped = stop_job(ctx, run_id);
            delete_live_pods(ctx, run_id);
            stopped.map(|()| Settled::NoJob)
        }
    }
}

/// The verdict on `job`, if one was written.
pub fn recorded(job: &Value) -> Option<Recorded> {
    recorded_view(&objects::Job::from_value(job))
}

/// The verdict on the view of a Job, if one was written.
pub fn recorded_view(job: &objects::Job) -> Option<Recorded> {
    decode(job.metadata.annotations.get(ANNOTATION_OUTCOME)?)
}

/// `outcome` with the recorded verdict in place of its own (the output it
/// read stays).
pub fn apply(outcome: &mut RunOutcome, recorded: &Recorded) {
    outcome.status = recorded.status;
    outcome.reason = recorded.reason;
    outcome.message = recorded.message.clone();
    outcome.exit_code = recorded.exit_code.or(outcome.exit_code);
    outcome.signal = recorded.signal.or(outcome.signal);
}

/// The outcome a process that did not see the run returns from the
/// verdict alone (the pod and its log are gone, or were never read).
pub fn outcome_of(run_id: &str, recorded: &Recorded) -> RunOutcome {
    let reason = recorded.reason.unwrap_or(RunReason::ResultLost);
    let mut outcome = RunOutcome::without_result(run_id, recorded.status, reason, recorded.message.clone());
    outcome.reason = recorded.reason;
    outcome.exit_code = recorded.exit_code;
    outcome.signal = recorded.signal;
    outcome.times.finished = recorded.ended_at;
    outcome
}

/// The annotation's text (pure).
pub fn encode(outcome: &RunOutcome, by: DecidedBy, ended_at: SystemTime) -> String {
    let mut message = outcome.message.clone();
    if let Some((cut, _)) = message.char_indices().nth(MESSAGE_CHARS) {
        message.truncate(cut);
        message.push('…');
    }
    encode_recorded(&Recorded {
        status: outcome.status,
        reason: outcome.reason,
        message,
        exit_code: outcome.exit_code,
        signal: outcome.signal,
        by,
        ended_at: Some(ended_at),
    })
}

/// The annotation's text for a verdict as it stands (pure): the one
/// format `encode` writes and `decode` reads.
pub fn encode_recorded(recorded: &Recorded) -> String {
    json!({
        "status": recorded.status.name(),
        "reason": recorded.reason.map(RunReason::name),
        "message": recorded.message,
        "exit_code": recorded.exit_code,
        "signal": recorded.signal,
        "by": match recorded.by { DecidedBy::Runner => "runner", DecidedBy::Server => "server" },
        "ended_at": recorded.ended_at.map(log::rfc3339_utc),
    })
    .to_string()
}

/// The inverse of `encode`; `None` for text it did not write.
pub fn decode(text: &str) -> Option<Recorded> {
    let value: Value = serde_json::from_str(text).ok()?;
    let field = |key: &str| value.get(key).unwrap_or(&Value::Null);
    let status = RunStatus::from_name(field("status").as_str()?)?;
    let reason = match field("reason") {
        Value::Null => None,
        name => Some(RunReason::from_name(name.as_str()?)?),
    };
    let number = |key: &str| field(key).as_i64().and_then(|number| i32::try_from(number).ok());
    let by = match field("by").as_str()? {
        "runner" => DecidedBy::Runner,
        "server" => DecidedBy::Server,
        _ => return None,
    };
    Some(Recorded {
        status,
        reason,
        message: field("message").as_str().unwrap_or_default().to_string(),
        exit_code: number("exit_code"),
        signal: number("signal"),
        by,
        ended_at: field("ended_at").as_str().and_then(classify::parse_time),
    })
}

/// Writes the verdict, first writer wins. A Job this server decided to
/// stop also gets the deadline that makes the Job controller end it.
fn write(ctx: &Ctx, run_id: &str, ended: &Ended) -> Result<Settled, kube::Error> {
    let namespace = &ctx.policy.namespace;
    let name = manifest::job_name(run_id);
    let text = encode(&ended.outcome, ended.by, SystemTime::now());
    let mut last_conflict = None;
    for _ in 0..PATCH_ATTEMPTS {
        let Some(job) = ctx.client.get_if_exists(kube::Resource::JOBS, namespace, &name)? else { return Ok(Settled::NoJob) };
        let job = objects::Job::from_value(&job);
        if let Some(recorded) = recorded_view(&job) {
            return Ok(Settled::AlreadyRecorded(recorded));
        }
        let resource_version = &job.metadata.resource_version;
        let mut patch = json!({"metadata": {"resourceVersion": resource_version, "annotations": {ANNOTATION_OUTCOME: text}}});
        if ended.by == DecidedBy::Server && job.finished_condition().is_none() {
            patch["spec"] = json!({"activeDeadlineSeconds": 1});
        }
        match ctx.client.merge_patch(kube::Resource::JOBS, namespace, &name, &patch) {
            Ok(_) => return Ok(Settled::Recorded),
            // Someone changed the Job since it was read: read it again.
            Err(error) if error.is_conflict() => last_conflict = Some(error),
            Err(error) if error.is_not_found() => return Ok(Settled::NoJob),
            Err(error) => return Err(error),
        }
    }
    Err(last_conflict.unwrap_or_else(|| kube::Error::Config(format!("the Job `{name}` kept changing while its outcome was written"))))
}

/// Sets the Job's deadline so that its controller deletes its pods and
/// creates no other (a sync run's Job is deleted right after anyway; this
/// closes the gap until the garbage collector gets to the pods).
fn stop_job(ctx: &Ctx, run_id: &str) -> Result<(), kube::Error> {
    let patch = json!({"spec": {"activeDeadlineSeconds": 1}});
    match ctx.client.merge_patch(kube::Resource::JOBS, &ctx.policy.namespace, &manifest::job_name(run_id), &patch) {
        Ok(_) => Ok(()),
        // Gone already, or finished (a finished Job refuses nothing here,
        // but an older API server may): either way it starts no pod.
        Err(error) if error.is_not_found() || error.is_invalid() => Ok(()),
        Err(error) => Err(error),
    }
}

/// Deletes the run's pods that have not ended; ended ones keep their log.
/// Failures are logged: the Job's deadline and the pod's own deadline
/// stop the pod anyway.
fn delete_live_pods(ctx: &Ctx, run_id: &str) {
    let namespace = &ctx.policy.namespace;
    let params = kube::ListParams { label_selector: Some(format!("{}={run_id}", manifest::LABEL_RUN_ID)), field_selector: None };
    let pods = match ctx.client.list(kube::Resource::PODS, namespace, &params) {
        Ok(pods) => pods.items,
        Err(error) => {
            log::warn("could not list the run's pods to stop them", &[("run_id", run_id.into()), ("error", error.to_string().into())]);
            return;
        }
    };
    for pod in pods.iter().map(objects::Pod::from_value).filter(|pod| classify::finished_pod_view(pod).is_none()) {
        let name = pod.metadata.name.as_str();
        if let Err(error) = ctx.client.delete(kube::Resource::PODS, namespace, name) {
            log::warn("could not delete the run's pod", &[("pod", name.into()), ("error", error.to_string().into())]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_round_trips_and_foreign_text_is_ignored() {
        let mut outcome =
            RunOutcome::without_result("r", RunStatus::Error, RunReason::Unschedulable, "no node can run the pod: 0/1 nodes".into());
        outcome.exit_code = Some(3);
        let at = classify::parse_time("2026-01-01T00:00:00Z").unwrap();
        let recorded = decode(&encode(&outcome, DecidedBy::Server, at)).unwrap();
        assert_eq!(
            recorded,
            Recorded {
                status: RunStatus::Error,
                reason: Some(RunReason::Unschedulable),
                message: outcome.message.clone(),
                exit_code: Some(3),
                signal: None,
                by: DecidedBy::Server,
                ended_at: Some(at),
            }
        );
        let succeeded =
            RunOutcome { reason: None, ..RunOutcome::without_result("r", RunStatus::Succeeded, RunReason::ResultLost, "ok".into()) };
        assert_eq!(decode(&encode(&succeeded, DecidedBy::Runner, at)).unwrap().reason, None);
        for foreign in ["", "{}", "null", r#"{"status":"weird","by":"server"}"#, r#"{"status":"error","reason":"Nope","by":"server"}"#] {
            assert_eq!(decode(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn a_long_message_is_cut_to_fit_an_annotation() {
        let outcome = RunOutcome::without_result("r", RunStatus::Error, RunReason::ResultLost, "x".repeat(10_000));
        let recorded = decode(&encode(&outcome, DecidedBy::Server, SystemTime::now())).unwrap();
        assert_eq!(recorded.message.chars().count(), MESSAGE_CHARS + 1);
    }
}
