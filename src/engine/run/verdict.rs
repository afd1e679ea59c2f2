//! A run ends once: its verdict is recorded by the backend
//! before anyone is told, and an end this server decided (start timeout,
//! unschedulable, lost result, an API failure it gave up on...) stops the
//! sandbox for good first, so that it cannot run after the caller was told
//! it did not.
//!
//! The verdict is status, reason, message, exit code and signal, who
//! decided (the runner's result frame or this server) and when, as one
//! JSON text the backend keeps with the run (a Job annotation, a label).
//! Every replica and a restarted server read it before judging anything,
//! and a process that finds one already written takes it instead of its
//! own: the first writer wins. Output is not part of it: a process re-reads
//! that from the sandbox while it exists.
//!
//! Knows the engine's types and the port; no backend, nothing of MCP.

use std::time::SystemTime;

use serde_json::{Value, json};

use crate::engine::port::facts::{DecidedBy, Recorded};
use crate::engine::port::spec::{RunOutcome, RunReason, RunStatus};
use crate::engine::port::{Backend, Error, Settled, Stop};
use crate::log;

/// Longest message kept in a record (Kubernetes annotations share 256 KiB).
const MESSAGE_CHARS: usize = 2000;

/// A run's end as `run::follow` decided it.
#[derive(Clone, Debug)]
pub struct Ended {
    pub outcome: RunOutcome,
    pub by: DecidedBy,
}

/// Whether the verdict is recorded: background runs' are (any process
/// reads it); a sync run's objects are removed right after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Yes,
    No,
}

/// Makes `ended` final: records it (with `Record::Yes`) and, when this
/// server decided it, stops the run's sandbox for good. An `Err` means the
/// verdict could not be written (the backend did not answer): the caller
/// must not present it as the run's final result.
pub fn settle(backend: &dyn Backend, run_id: &str, ended: &Ended, record: Record) -> Result<Settled, Error> {
    if ended.by == DecidedBy::Runner && record == Record::No {
        return Ok(Settled::NoRecord);
    }
    match record {
        // A verdict that could not be written decides nothing yet: the
        // sandbox is left alone, and the next reader judges again.
        Record::Yes => {
            let settled = backend.record(run_id, &recorded_of(ended, SystemTime::now()))?;
            if ended.by == DecidedBy::Server && settled == Settled::Recorded {
                backend.stop(run_id, Stop::Live)?;
            }
            Ok(settled)
        }
        // A sync run's caller is told either way, so its sandbox goes even
        // if the stop could not be recorded.
        Record::No => backend.stop(run_id, Stop::ForGood).map(|()| Settled::NoRecord),
    }
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

/// The verdict of `ended` at `ended_at`, its message cut to what a record
/// keeps (pure).
fn recorded_of(ended: &Ended, ended_at: SystemTime) -> Recorded {
    let outcome = &ended.outcome;
    let mut message = outcome.message.clone();
    if let Some((cut, _)) = message.char_indices().nth(MESSAGE_CHARS) {
        message.truncate(cut);
        message.push('…');
    }
    Recorded {
        status: outcome.status,
        reason: outcome.reason,
        message,
        exit_code: outcome.exit_code,
        signal: outcome.signal,
        by: ended.by,
        ended_at: Some(ended_at),
    }
}

/// The verdict's text for `outcome` (pure).
pub fn encode(outcome: &RunOutcome, by: DecidedBy, ended_at: SystemTime) -> String {
    encode_recorded(&recorded_of(&Ended { outcome: outcome.clone(), by }, ended_at))
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
        ended_at: field("ended_at").as_str().and_then(crate::time::parse_rfc3339),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_round_trips_and_foreign_text_is_ignored() {
        let mut outcome =
            RunOutcome::without_result("r", RunStatus::Error, RunReason::Unschedulable, "no node can run the pod: 0/1 nodes".into());
        outcome.exit_code = Some(3);
        let at = crate::time::parse_rfc3339("2026-01-01T00:00:00Z").unwrap();
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
