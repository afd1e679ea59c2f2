//! A session sandbox's messages: what the server sends a runner that takes
//! many calls (`runner await-assignment --session-until-ms`). A call is an
//! assignment (`sandbox::assignment`) whose `tag` the server chose; a
//! cancel names the call by that tag and carries the sandbox's key.
//!
//! On Kubernetes both go through `pods/proxy` as `POST /assign` and
//! `POST /cancel`, and the answer to an assignment is the call's frames,
//! streamed until its result (they go to the container log too, which
//! stays the record). On Docker they are lines on the container's stdin,
//! which stays open between calls (`OpenStdin` without `StdinOnce`), and
//! the attach that wrote the line brings the output back.
//!
//! Knows nothing of sockets or of the engine; both halves use `encode_*`
//! and `decode`, so they cannot drift.

use serde::{Deserialize, Serialize};

use crate::sandbox::assignment::{self, Assignment, Key};
use crate::sandbox::frame::Tag;

/// Where a cancel is posted on Kubernetes (assignments go to
/// `assignment::PATH`).
pub const CANCEL_PATH: &str = "/cancel";

/// A call that finds another running: the runner's answer on its port
/// (`409` with this text) and, on stdin, the refused call's own result's
/// `start_error`; the server turns either into `SandboxBusy`.
pub const BUSY: &str = "another call runs in this sandbox; one call at a time";

/// What a session runner was sent.
#[derive(Debug, PartialEq)]
pub enum Message {
    /// Run this call (its tag is set).
    Call(Box<Assignment>),
    /// Stop the call with this tag, if it still runs.
    Cancel(Tag),
}

/// A call's body: the assignment, which must carry its tag.
pub fn encode_call(key: &Key, call: &Assignment) -> Vec<u8> {
    assignment::encode(key, call)
}

/// A cancel's body.
pub fn encode_cancel(key: &Key, tag: Tag) -> Vec<u8> {
    let wire = CancelWire { v: assignment::VERSION, key: key.to_hex(), cancel: tag.to_hex() };
    // Three plain fields always serialize; the fallback is never used.
    serde_json::to_vec(&wire).unwrap_or_default()
}

/// One line for a Docker session's stdin: the body and its newline (JSON
/// as `serde_json` writes it has no raw newline inside).
pub fn stdin_line(body: &[u8]) -> Vec<u8> {
    let mut line = body.to_vec();
    line.push(b'\n');
    line
}

/// The inverse of `encode_call` and `encode_cancel`: the key the body
/// carries (the runner compares it) and the message. A call without a tag
/// is refused: its frames could not be told from another call's.
pub fn decode(body: &[u8]) -> Result<(Key, Message), String> {
    if let Ok(cancel) = serde_json::from_slice::<CancelWire>(body) {
        if cancel.v != assignment::VERSION {
            return Err(format!("message version {} is not known; this runner reads version {}", cancel.v, assignment::VERSION));
        }
        let key = Key::from_hex(&cancel.key)?;
        let tag = Tag::from_hex(&cancel.cancel).ok_or("a cancel names its call by a 32-hex-digit tag")?;
        return Ok((key, Message::Cancel(tag)));
    }
    let (key, call) = assignment::decode(body).map_err(|error| error.to_string())?;
    if call.tag.is_none() {
        return Err("a session's call must carry its tag".to_string());
    }
    Ok((key, Message::Call(Box::new(call))))
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelWire {
    v: u32,
    key: String,
    cancel: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::assignment::KEY_BYTES;
    use crate::sandbox::frame::TAG_BYTES;

    fn key() -> Key {
        Key::from_bytes([3; KEY_BYTES])
    }

    fn call(tag: Option<Tag>) -> Assignment {
        let exec = crate::sandbox::args::parse_exec(["--", "true"].iter().map(Into::into).collect()).unwrap();
        Assignment { run_id: "call-1".into(), exec, env: Default::default(), files: Vec::new(), tag }
    }

    #[test]
    fn calls_and_cancels_round_trip_and_a_call_without_its_tag_is_refused() {
        let tag = Tag::from_bytes([5; TAG_BYTES]);
        let (got_key, message) = decode(&encode_call(&key(), &call(Some(tag)))).unwrap();
        assert!(got_key.matches(&key()));
        assert!(matches!(message, Message::Call(call) if call.tag == Some(tag)));

        let (got_key, message) = decode(&encode_cancel(&key(), tag)).unwrap();
        assert!(got_key.matches(&key()));
        assert_eq!(message, Message::Cancel(tag));

        let untagged = decode(&encode_call(&key(), &call(None))).unwrap_err();
        assert!(untagged.contains("must carry its tag"), "{untagged}");
        for bad in [&b"{}"[..], b"not json", br#"{"v":9,"key":"00","cancel":"00"}"#] {
            assert!(decode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_stdin_line_is_the_body_and_one_newline() {
        let line = stdin_line(&encode_cancel(&key(), Tag::from_bytes([1; TAG_BYTES])));
        assert_eq!(line.iter().filter(|byte| **byte == b'\n').count(), 1);
        assert!(line.ends_with(b"\n"));
    }
}
