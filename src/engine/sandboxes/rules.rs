//! Open sandboxes (sessions): a sandbox that stays between calls, its
//! record, the rules that decide who may run a call in it and when it
//! ends, and the port a backend implements to keep them
//! (`backend::SandboxStore`, part of the port). Pure: the shells that open, call,
//! close, list and reap are `engine::sandboxes`'s.
//!
//! The record lives with the sandbox in the backend (a Job's annotation,
//! a container's labels), never in this process: every replica, and a
//! server restarted, sees the same sandboxes. Whose turn it is comes from
//! the record's `call` mark, written by a compare-and-set the backend
//! provides (a `resourceVersion` precondition, a container name that can
//! be created once), never from a lock in one process.
//!
//! A sandbox's id is the caller's capability: 128 random bits, shown to
//! its opener and kept in the record, never in a log or an object's name.
//! Objects and logs use its `public_name`, a digest of it.

use std::time::Duration;

use crate::engine::port::sandbox_record::{CallMark, Record, Seen};

/// How long a sandbox may sit idle, when its opener names nothing.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a sandbox may live, when its opener names nothing (and the
/// operator's cap allows).
pub const DEFAULT_MAX_LIFETIME: Duration = Duration::from_secs(3600);
/// A call's mark outlives its deadline by this much before another call
/// may take the sandbox over (the server that wrote it died mid-call). A
/// call still collecting its files then is safe: the runner refuses a
/// second call while one runs.
pub const CALL_MARK_SLACK: Duration = Duration::from_secs(5);

/// The name a sandbox's objects and log lines carry: the first 128 bits of
/// its id's SHA-256, in hex (a run id's shape), so that nothing that
/// lists objects or reads logs learns the id.
pub fn public_name(id: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, id.as_bytes());
    crate::sandbox::to_hex(&digest.as_ref()[..16])
}

/// An id as a caller gives it: 32 lowercase hex digits after `sbx-`.
pub fn parse_id(text: &str) -> Option<&str> {
    let hex = text.strip_prefix("sbx-")?;
    crate::sandbox::is_lower_hex(hex, 16).then_some(text)
}

/// A fresh id: `sbx-` and 128 random bits.
pub fn new_id() -> String {
    // The kernel's random source failing means no safe capability can be
    // made at all.
    let bytes: [u8; 16] = crate::sandbox::random_bytes().expect("the kernel random source is unavailable");
    format!("sbx-{}", crate::sandbox::to_hex(&bytes))
}

/// The tag of a background call (`submit_job` with `sandbox`): derived
/// from the sandbox's id and the call's run id, so that any process that
/// holds the call's token and can read the sandbox's record finds the
/// call's frames in its log, and nothing in the sandbox can (its id is
/// never inside it). A call waited for in one process gets a random tag.
pub fn call_tag(id: &str, run_id: &str) -> crate::sandbox::frame::Tag {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in ["mcp-sandbox-call", id, run_id] {
        context.update(part.as_bytes());
        context.update(&[0]);
    }
    let digest = context.finish();
    let mut bytes = [0u8; crate::sandbox::frame::TAG_BYTES];
    bytes.copy_from_slice(&digest.as_ref()[..crate::sandbox::frame::TAG_BYTES]);
    crate::sandbox::frame::Tag::from_bytes(bytes)
}

/// Why a sandbox is over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Over {
    /// Idle for its whole `idle_timeout_s`.
    Idle { idle_s: u64 },
    /// Its `max_lifetime_s` passed.
    Lifetime,
    /// Its sandbox is no longer running (it ended, or was removed).
    Ended,
}

impl Over {
    /// Its reason in `mcp_k8s_sandboxes_closed_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Over::Idle { .. } => "idle",
            Over::Lifetime => "lifetime",
            Over::Ended => "ended",
        }
    }

    /// For a caller who names a sandbox that is over.
    pub fn explain(&self) -> String {
        match self {
            Over::Idle { idle_s } => format!("it was idle for {idle_s} s, its idle_timeout_s; open a new one"),
            Over::Lifetime => "it reached its max_lifetime_s; open a new one".to_string(),
            Over::Ended => "its sandbox ended (closed, or stopped from outside); open a new one".to_string(),
        }
    }
}

/// Margin of the runner's own idle bound over the sandbox's idle timeout.
const RUNNER_IDLE_SLACK: Duration = Duration::from_secs(30);

/// How long the sandbox's runner waits for a call before it ends itself: a
/// backstop for a sandbox no server looks after any more. The reaper
/// closes it at its idle timeout; the runner's clock starts before the
/// server sees it ready, so it gets a margin.
pub fn runner_idle_bound(record: &Record) -> Duration {
    Duration::from_secs(record.idle_timeout_s) + RUNNER_IDLE_SLACK
}

/// Whether a sandbox is over at `now_ms`, and why. A call in progress keeps
/// it from being idle, never past its lifetime.
pub fn over(seen: &Seen, now_ms: u64) -> Option<Over> {
    if now_ms >= seen.record.expires_at_ms {
        return Some(Over::Lifetime);
    }
    if !seen.alive {
        return Some(Over::Ended);
    }
    let busy = seen.call.as_ref().is_some_and(|call| !stale(call, now_ms));
    let idle_ms = seen.last_used_ms.map(|used| now_ms.saturating_sub(used));
    if !busy && idle_ms.is_some_and(|idle_ms| idle_ms >= seen.record.idle_timeout_s.saturating_mul(1000)) {
        return Some(Over::Idle { idle_s: seen.record.idle_timeout_s });
    }
    None
}

/// A mark whose writer is past its deadline and slack.
pub fn stale(call: &CallMark, now_ms: u64) -> bool {
    now_ms >= call.until_ms.saturating_add(CALL_MARK_SLACK.as_millis() as u64)
}

/// Whether a call may take the sandbox now.
#[derive(Clone, Debug, PartialEq)]
pub enum Take {
    /// Nobody runs a call in it (or the one who did is gone).
    Free,
    /// Another call runs; since when, and until when at most.
    Busy {
        started_ms: u64,
        until_ms: u64,
    },
    Over(Over),
}

pub fn take(seen: &Seen, now_ms: u64) -> Take {
    if let Some(over) = over(seen, now_ms) {
        return Take::Over(over);
    }
    match &seen.call {
        Some(call) if !stale(call, now_ms) => Take::Busy { started_ms: call.started_ms, until_ms: call.until_ms },
        _ => Take::Free,
    }
}

/// A call's deadline must fall within the sandbox's life: a call that
/// would be cut by the lifetime is refused before it starts, with the
/// time that is left.
pub fn fits(record: &Record, now_ms: u64, call_budget: Duration) -> Result<(), String> {
    let left_ms = record.expires_at_ms.saturating_sub(now_ms);
    if call_budget.as_millis() as u64 > left_ms {
        return Err(format!(
            "the sandbox ends in {} s (its max_lifetime_s) and this call may take {} s; give a shorter timeout_s or open a new sandbox",
            left_ms / 1000,
            call_budget.as_secs()
        ));
    }
    Ok(())
}

/// A sandbox's state word in `list_sandboxes`.
pub fn state_name(seen: &Seen, now_ms: u64) -> &'static str {
    match take(seen, now_ms) {
        Take::Free => "idle",
        Take::Busy { .. } => "busy",
        Take::Over(_) => "expired",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENED: u64 = 1_000_000;

    #[test]
    fn a_background_calls_tag_is_fixed_by_its_sandbox_and_run_and_differs_otherwise() {
        let tag = |id: &str, run: &str| call_tag(id, run).to_hex();
        assert_eq!(tag("sbx-a", "r1"), tag("sbx-a", "r1"));
        assert_ne!(tag("sbx-a", "r1"), tag("sbx-a", "r2"));
        assert_ne!(tag("sbx-a", "r1"), tag("sbx-b", "r1"));
        // The parts are kept apart: moving a character across does not
        // give the same tag.
        assert_ne!(tag("sbx-ab", "c"), tag("sbx-a", "bc"));
    }

    const S: u64 = 1000;

    fn seen(last_used_ms: u64, call: Option<CallMark>, alive: bool) -> Seen {
        Seen { last_used_ms: Some(last_used_ms), ..opening(call, alive) }
    }

    fn opening(call: Option<CallMark>, alive: bool) -> Seen {
        Seen {
            record: Record {
                id: "sbx-x".into(),
                owner: None,
                image: "python".into(),
                language: None,
                network: "none".into(),
                cpu: None,
                memory: None,
                workdir: "/work".into(),
                opened_at_ms: OPENED,
                expires_at_ms: OPENED + 3600 * S,
                idle_timeout_s: 600,
            },
            last_used_ms: None,
            call,
            version: "1".into(),
            alive,
        }
    }

    fn mark(started: u64, until: u64) -> Option<CallMark> {
        Some(CallMark { call_id: "c".into(), started_ms: started, until_ms: until })
    }

    fn busy(started: u64, until: u64) -> Take {
        Take::Busy { started_ms: started, until_ms: until }
    }

    /// Who may run a call, at which moment: one call at a time, a mark
    /// past its deadline and slack is taken over, idle and lifetime end it,
    /// and a running call is never idle.
    #[test]
    fn who_may_take_a_sandbox_and_when_it_is_over() {
        let slack = CALL_MARK_SLACK.as_millis() as u64;
        let cases: Vec<(&str, Seen, u64, Take)> = vec![
            ("fresh", seen(OPENED, None, true), OPENED + S, Take::Free),
            ("a call runs", seen(OPENED, mark(OPENED, OPENED + 60 * S), true), OPENED + 10 * S, busy(OPENED, OPENED + 60 * S)),
            (
                "past its deadline, within slack",
                seen(OPENED, mark(OPENED, OPENED + 60 * S), true),
                OPENED + 60 * S + slack - 1,
                busy(OPENED, OPENED + 60 * S),
            ),
            ("a dead server's mark", seen(OPENED, mark(OPENED, OPENED + 60 * S), true), OPENED + 60 * S + slack, Take::Free),
            ("idle to its timeout", seen(OPENED, None, true), OPENED + 600 * S, Take::Over(Over::Idle { idle_s: 600 })),
            ("idle just short", seen(OPENED + 100 * S, None, true), OPENED + 699 * S, Take::Free),
            (
                "a long call is not idle",
                seen(OPENED, mark(OPENED, OPENED + 900 * S), true),
                OPENED + 800 * S,
                busy(OPENED, OPENED + 900 * S),
            ),
            ("lifetime", seen(OPENED + 3599 * S, None, true), OPENED + 3600 * S, Take::Over(Over::Lifetime)),
            (
                "lifetime, mid-call",
                seen(OPENED, mark(OPENED + 3500 * S, OPENED + 3700 * S), true),
                OPENED + 3600 * S,
                Take::Over(Over::Lifetime),
            ),
            ("its sandbox ended", seen(OPENED, None, false), OPENED + S, Take::Over(Over::Ended)),
            ("opening for long: never idle", opening(None, true), OPENED + 900 * S, Take::Free),
            ("opening past its lifetime", opening(None, true), OPENED + 3600 * S, Take::Over(Over::Lifetime)),
        ];
        for (name, seen, now, expected) in cases {
            assert_eq!(take(&seen, now), expected, "{name}");
        }
    }

    #[test]
    fn a_call_must_fit_in_what_is_left_of_the_lifetime() {
        let record = seen(OPENED, None, true).record;
        assert!(fits(&record, OPENED, Duration::from_secs(3600)).is_ok());
        let refused = fits(&record, OPENED + 3500 * S, Duration::from_secs(120)).unwrap_err();
        assert!(refused.contains("ends in 100 s") && refused.contains("120 s"), "{refused}");
    }

    #[test]
    fn ids_are_capabilities_and_names_say_nothing_of_them() {
        let id = new_id();
        assert_eq!(parse_id(&id), Some(id.as_str()));
        let name = public_name(&id);
        assert_eq!(name.len(), 32);
        assert!(!id.contains(&name) && !name.contains(&id[4..]));
        assert_eq!(public_name(&id), name, "stable");
        for bad in ["", "sbx-", "sbx-XYZ", "abc", &format!("{id}0"), &id.to_uppercase()] {
            assert_eq!(parse_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn records_and_marks_round_trip() {
        use crate::engine::port::sandbox_record::{decode_call, decode_record, encode_call, encode_record};
        let record = seen(OPENED, None, true).record;
        assert_eq!(decode_record(&encode_record(&record)), Some(record));
        let call = mark(1, 2).unwrap();
        assert_eq!(decode_call(&encode_call(&call)), Some(call));
        assert_eq!(decode_record("{"), None);
    }
}
