//! An open sandbox's record, as every backend keeps it with the sandbox
//! (a Job's annotation, a container's labels) and the port carries it:
//! what the sandbox is (`Record`), the call that runs in it (`CallMark`),
//! and how the backend shows it now (`Seen`). The rules over them are
//! `engine::sandboxes::rules`'.

use serde::{Deserialize, Serialize};

/// What a sandbox is, as its record keeps it: fixed when it is opened.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The capability the opener got. Never logged.
    pub id: String,
    /// Whose it is, on a server with several callers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub image: String,
    /// The `execute_code` language it was opened for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    pub network: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    pub workdir: String,
    pub opened_at_ms: u64,
    /// The end of its life (`max_lifetime_s` from its opening).
    pub expires_at_ms: u64,
    pub idle_timeout_s: u64,
}

/// The call that runs in a sandbox, as its mark says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallMark {
    pub call_id: String,
    pub started_ms: u64,
    /// After this, plus `CALL_MARK_SLACK`, the mark is stale: the server
    /// that wrote it did not finish the call.
    pub until_ms: u64,
}

/// A sandbox as the backend shows it now.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub record: Record,
    /// When it was last ready for a call: marked when its runner first
    /// waits, then at the end of each call. `None` while it is opening: an
    /// opening sandbox is never idle (its lifetime still bounds it).
    pub last_used_ms: Option<u64>,
    pub call: Option<CallMark>,
    /// What the backend's compare-and-set compares (a `resourceVersion`,
    /// the stale mark's container): opaque here.
    pub version: String,
    /// Its sandbox still runs (its runner waits or works).
    pub alive: bool,
}

/// The record as the backend stores it (one line of JSON).
pub fn encode_record(record: &Record) -> String {
    serde_json::to_string(record).unwrap_or_default()
}

pub fn decode_record(text: &str) -> Option<Record> {
    serde_json::from_str(text).ok()
}

pub fn encode_call(call: &CallMark) -> String {
    serde_json::to_string(call).unwrap_or_default()
}

pub fn decode_call(text: &str) -> Option<CallMark> {
    serde_json::from_str(text).ok()
}
