//! The audit trail: who ran what, when, and how it ended, one JSON object
//! per line, to stderr or a file the operator names (`MCP_K8S_AUDIT_LOG`).
//!
//! Apart from the structured log on purpose: the log is for operating the
//! server (its level can hide lines), the audit trail is a record kept
//! whole. It carries metadata only, never a command, arguments,
//! environment values, file contents, output or tokens: `Entry` has no
//! field that could hold them.
//!
//! A synchronous run is one `run` line when it ends. A background run
//! (`submit_job`, a task, a call with an idempotency key) is a `submitted`
//! line from the process that accepted the call and an `ended` line from
//! the process that recorded its verdict (the first writer, so one line
//! however many replicas watched it); `run_id` joins them.
//!
//! A leaf: it knows no layer (the engine turns its outcome into `Ended`);
//! written to by the tools and the engine, it reads nothing back.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value, json};

use crate::network::NetworkMode;

/// Where the trail goes: `MCP_K8S_AUDIT_LOG`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sink {
    Stderr,
    /// Appended to; made (readable by its owner only) when missing.
    File(PathBuf),
}

/// What an audit line records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A synchronous run ended (or was refused before it started).
    Run,
    /// A background run was accepted: made, or found again by its key.
    Submitted,
    /// A background run's verdict was recorded.
    Ended,
}

impl Event {
    fn name(self) -> &'static str {
        match self {
            Event::Run => "run",
            Event::Submitted => "submitted",
            Event::Ended => "ended",
        }
    }
}

/// How a run ended, as the trail says it (the engine's `RunOutcome`
/// makes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub status: &'static str,
    pub reason: Option<&'static str>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The command's own run time.
    pub duration: Duration,
}

/// One line's facts; what is `None` is left out of the line.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    pub event: Event,
    pub run_id: &'a str,
    pub caller: Option<&'a str>,
    /// The site the run went to; `default` when unnamed.
    pub site: Option<&'a str>,
    pub tool: Option<&'a str>,
    pub image: Option<&'a str>,
    pub network: Option<NetworkMode>,
    pub ended: Option<Ended>,
    /// From the call's arrival to its answer (synchronous runs).
    pub elapsed: Option<Duration>,
}

impl<'a> Entry<'a> {
    pub fn new(event: Event, run_id: &'a str) -> Entry<'a> {
        Entry { event, run_id, caller: None, site: None, tool: None, image: None, network: None, ended: None, elapsed: None }
    }
}

/// The site of a server without named sites.
const SITE: &str = "default";

/// The line for `entry`, written at `at`.
pub fn line(entry: &Entry<'_>, at: SystemTime) -> Value {
    let mut fields = Map::new();
    fields.insert("time".into(), json!(crate::log::rfc3339_utc(at)));
    fields.insert("event".into(), json!(entry.event.name()));
    fields.insert("run_id".into(), json!(entry.run_id));
    fields.insert("site".into(), json!(entry.site.unwrap_or(SITE)));
    let mut put = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            fields.insert(key.into(), value);
        }
    };
    put("caller", entry.caller.map(Value::from));
    put("tool", entry.tool.map(Value::from));
    put("image", entry.image.map(Value::from));
    put("network", entry.network.map(|mode| json!(mode.name())));
    if let Some(ended) = entry.ended {
        put("status", Some(json!(ended.status)));
        put("reason", Some(json!(ended.reason)));
        put("exit_code", ended.exit_code.map(Value::from));
        put("signal", ended.signal.map(Value::from));
        put("duration_ms", Some(json!(ended.duration.as_millis() as u64)));
    }
    put("elapsed_ms", entry.elapsed.map(|elapsed| json!(elapsed.as_millis() as u64)));
    Value::Object(fields)
}

enum Writer {
    Stderr,
    File(File),
}

static WRITER: OnceLock<Mutex<Writer>> = OnceLock::new();

/// Opens the trail once at start, so a path that cannot be written stops
/// the server instead of losing the record; `None` keeps no trail.
pub fn init(sink: Option<&Sink>) -> Result<(), String> {
    let writer = match sink {
        None => return Ok(()),
        Some(Sink::Stderr) => Writer::Stderr,
        Some(Sink::File(path)) => {
            use std::os::unix::fs::OpenOptionsExt;
            let file = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(path)
                .map_err(|error| format!("MCP_K8S_AUDIT_LOG: cannot open {} for appending: {error}", path.display()))?;
            Writer::File(file)
        }
    };
    WRITER.set(Mutex::new(writer)).map_err(|_| "the audit trail was opened twice".to_string())
}

/// Writes `entry` when a trail is kept. A line is written whole under the
/// lock, so lines of concurrent runs never interleave; a failed write is
/// logged (the run goes on: the trail is a record, not a gate).
pub fn record(entry: &Entry<'_>) {
    let Some(writer) = WRITER.get() else { return };
    let mut text = line(entry, SystemTime::now()).to_string();
    text.push('\n');
    let mut writer = writer.lock().unwrap_or_else(PoisonError::into_inner);
    let written = match &mut *writer {
        Writer::Stderr => std::io::stderr().lock().write_all(text.as_bytes()),
        Writer::File(file) => file.write_all(text.as_bytes()),
    };
    if let Err(error) = written {
        crate::log::error("could not write the audit trail", &[("error", error.to_string().into())]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_holds_the_facts_given_and_nothing_else() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let ended = Ended {
            status: "failed",
            reason: Some("OOMKilled"),
            exit_code: Some(137),
            signal: None,
            duration: Duration::from_millis(1500),
        };
        let base = Entry::new(Event::Run, "r1");
        let cases: Vec<(&str, Entry<'_>, Value)> = vec![
            (
                "a synchronous run",
                Entry {
                    caller: Some("stdio"),
                    tool: Some("run_job"),
                    image: Some("busybox:1.36"),
                    network: Some(NetworkMode::None),
                    ended: Some(ended),
                    elapsed: Some(Duration::from_millis(2100)),
                    ..base
                },
                json!({"time": "2027-01-15T08:00:00.000Z", "event": "run", "run_id": "r1", "site": "default",
                       "caller": "stdio", "tool": "run_job", "image": "busybox:1.36", "network": "none",
                       "status": "failed", "reason": "OOMKilled", "exit_code": 137, "duration_ms": 1500, "elapsed_ms": 2100}),
            ),
            (
                "a background run accepted",
                Entry {
                    caller: Some("token"),
                    tool: Some("submit_job"),
                    image: Some("busybox:1.36"),
                    network: Some(NetworkMode::Open),
                    ..Entry::new(Event::Submitted, "r2")
                },
                json!({"time": "2027-01-15T08:00:00.000Z", "event": "submitted", "run_id": "r2", "site": "default",
                       "caller": "token", "tool": "submit_job", "image": "busybox:1.36", "network": "open"}),
            ),
            (
                "a background run's end",
                Entry { ended: Some(ended), ..Entry::new(Event::Ended, "r1") },
                json!({"time": "2027-01-15T08:00:00.000Z", "event": "ended", "run_id": "r1", "site": "default",
                       "status": "failed", "reason": "OOMKilled", "exit_code": 137, "duration_ms": 1500}),
            ),
        ];
        for (name, entry, want) in cases {
            assert_eq!(line(&entry, at), want, "{name}");
        }
    }
}
