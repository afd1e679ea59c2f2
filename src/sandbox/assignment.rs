//! A warm sandbox's assignment: the one run a pool sandbox's
//! runner (`runner await-assignment`) waits for, sent by the server
//! through the API server's `pods/proxy` as the body of one
//! `POST /assign`. It carries the per-sandbox key and everything a cold
//! run's pod spec would: the run id, the runner's `exec` options (argv,
//! timeout, kill grace, caps, artifact patterns, disk bound), the
//! command's environment and the input files. Encoded as one JSON object
//! with a version; both halves use `encode` and `decode`, so they cannot
//! drift.
//!
//! The key travels in the body, not in a header: the API server's proxy
//! strips `Authorization` from what it forwards to a pod
//! (kubernetes/kubernetes#34076, #38775), and the body is what the runner
//! reads anyway.
//!
//! Knows nothing of HTTP, sockets, pools or who makes the key: the
//! runner's reader is `runner::assign`, the pool's life `engine::pools::pool`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sandbox::TERMINATION_LOG;
use crate::sandbox::args::ExecOptions;
use crate::sandbox::frame::Tag;
use crate::sandbox::held::HoldOptions;

/// The assignment format; a runner refuses any other.
pub const VERSION: u32 = 1;
/// The port the runner listens on until it is assigned.
pub const PORT: u16 = 7777;
/// The one path it answers.
pub const PATH: &str = "/assign";
/// Where the runner in the main container takes its key from: a small
/// memory-backed folder of its own, where `prepare` copies the key and
/// the runner removes it once read, before any command runs. The key
/// Secret is never mounted into the main container: there it would stay
/// readable by every command (they run as the runner's user), and a
/// command holding it could hand the runner calls of its own.
pub const KEY_DIR: &str = "/mcp-key";
pub const KEY_FILE: &str = "/mcp-key/key";
/// Where the key Secret is mounted in `prepare` alone, and its file.
pub const KEY_SECRET_DIR: &str = "/mcp/key-secret";
pub const KEY_SECRET_FILE: &str = "/mcp/key-secret/key";
/// Bytes of a key: 256 random bits, unguessable within any pool's life.
pub const KEY_BYTES: usize = 32;
/// The largest body a runner reads. The call's bounds make the largest
/// assignment: input files of 768 KiB (paths included) are 1 MiB as
/// base64, and argv and env of 1 MiB can grow six-fold as JSON (a control
/// character is written `\u0001`); the rest is small.
pub const MAX_BODY_BYTES: usize = 8 << 20;

/// A sandbox's key. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; KEY_BYTES]);

impl Key {
    pub const fn from_bytes(bytes: [u8; KEY_BYTES]) -> Key {
        Key(bytes)
    }

    /// A fresh key from the kernel's random source.
    pub fn random() -> Result<Key, String> {
        super::random_bytes().map(Key)
    }

    /// The key as the Secret holds it and the body carries it: hex.
    pub fn to_hex(&self) -> String {
        super::to_hex(&self.0)
    }

    /// The inverse of `to_hex` (either case); the Secret's file may end in
    /// a newline when an operator wrote one by hand.
    pub fn from_hex(text: &str) -> Result<Key, String> {
        let text = text.trim_end_matches(['\n', '\r']);
        super::from_hex(text).map(Key).ok_or_else(|| format!("a key is {} hex digits", 2 * KEY_BYTES))
    }

    /// Compares without an early exit, so the time taken says nothing about
    /// how much of a guess was right.
    pub fn matches(&self, other: &Key) -> bool {
        super::constant_time_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("Key(***)")
    }
}

/// One run for a warm sandbox. Its `Debug` shows no env value, argument
/// or file content (style.md §14).
#[derive(Clone, PartialEq)]
pub struct Assignment {
    pub run_id: String,
    /// What `runner exec` would get on its command line; the termination
    /// log is the sandbox's own and does not travel.
    pub exec: ExecOptions,
    /// The command's environment on top of the container's own (the image's
    /// `PATH` and the like), as a cold pod's `env` is.
    pub env: BTreeMap<String, String>,
    pub files: Vec<AssignedFile>,
    /// The tag the runner writes this run's frames with; `None`: a fresh
    /// one of its own. A session's calls share one log, so the server
    /// picks each call's tag and reads only the frames that carry it.
    pub tag: Option<Tag>,
}

impl fmt::Debug for Assignment {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Assignment")
            .field("run_id", &self.run_id)
            .field("argv", &format_args!("{} arguments", self.exec.argv.len()))
            .field("env", &format_args!("{} variables", self.env.len()))
            .field("files", &format_args!("{} files", self.files.len()))
            .finish()
    }
}

/// An input file, with its content.
#[derive(Clone, Debug, PartialEq)]
pub struct AssignedFile {
    /// Relative to the workdir, `/`-separated, no `..`.
    pub path: String,
    pub mode: u32,
    pub content: Vec<u8>,
}

/// Why a body is not an assignment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Not JSON, or not the assignment's fields.
    Malformed(String),
    UnknownVersion(u32),
    /// A field holds something a runner must not run with.
    Field {
        field: &'static str,
        message: String,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Malformed(why) => write!(formatter, "the body is not an assignment: {why}"),
            DecodeError::UnknownVersion(version) => {
                write!(formatter, "assignment version {version} is not known; this runner reads version {VERSION}")
            }
            DecodeError::Field { field, message } => write!(formatter, "assignment field `{field}`: {message}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The body the server sends.
pub fn encode(key: &Key, assignment: &Assignment) -> Vec<u8> {
    let exec = &assignment.exec;
    let wire = Wire {
        v: VERSION,
        key: key.to_hex(),
        run_id: assignment.run_id.clone(),
        argv: exec.argv.clone(),
        env: assignment.env.clone(),
        workdir: exec.workdir.to_string_lossy().into_owned(),
        timeout_ms: exec.timeout.as_millis() as u64,
        kill_grace_ms: exec.kill_grace.as_millis() as u64,
        max_output_bytes: exec.max_output_bytes as u64,
        max_artifact_bytes: exec.max_artifact_bytes,
        spill_bytes: exec.spill_bytes,
        hold_port: exec.hold.as_ref().map(|hold| hold.port),
        hold_key_sha256: exec.hold.as_ref().map(|hold| hold.key_sha256.clone()),
        artifacts: exec.artifact_patterns.clone(),
        disk_paths: exec.disk_paths.iter().map(|path| path.to_string_lossy().into_owned()).collect(),
        disk_limit_bytes: exec.disk_limit_bytes,
        files: assignment
            .files
            .iter()
            .map(|file| WireFile { path: file.path.clone(), mode: file.mode, content_b64: crate::sandbox::frame::to_base64(&file.content) })
            .collect(),
        tag: assignment.tag.map(Tag::to_hex),
    };
    // Plain strings, numbers and maps always serialize; the fallback is never used.
    serde_json::to_vec(&wire).unwrap_or_default()
}

/// The inverse of `encode`: the key it carries (for the runner to compare)
/// and the assignment, checked as far as the runner relies on it.
pub fn decode(body: &[u8]) -> Result<(Key, Assignment), DecodeError> {
    let wire: Wire = serde_json::from_slice(body).map_err(|error| DecodeError::Malformed(error.to_string()))?;
    if wire.v != VERSION {
        return Err(DecodeError::UnknownVersion(wire.v));
    }
    let field = |field: &'static str, message: &str| DecodeError::Field { field, message: message.to_string() };
    let key = Key::from_hex(&wire.key).map_err(|why| field("key", &why))?;
    if !is_run_id(&wire.run_id) {
        return Err(field("run_id", "must be 1 to 63 lowercase letters, digits or '-'"));
    }
    if wire.argv.is_empty() || wire.argv[0].is_empty() {
        return Err(field("argv", "must name a program"));
    }
    if !wire.workdir.starts_with('/') {
        return Err(field("workdir", "must be absolute"));
    }
    let mut files = Vec::with_capacity(wire.files.len());
    for file in wire.files {
        if !is_relative_inside(&file.path) {
            return Err(field("files", "a path must be relative, without `..`, empty or absolute parts"));
        }
        if file.mode > 0o777 {
            return Err(field("files", "a mode must be at most 0777"));
        }
        let content = crate::sandbox::frame::from_base64(&file.content_b64).map_err(|error| field("files", &error.to_string()))?;
        files.push(AssignedFile { path: file.path, mode: file.mode, content });
    }
    let hold = match (wire.hold_port, wire.hold_key_sha256) {
        (Some(port), Some(key_sha256)) if key_sha256.len() == 64 && key_sha256.bytes().all(|byte| byte.is_ascii_hexdigit()) => {
            Some(HoldOptions { port, key_sha256 })
        }
        (None, None) => None,
        _ => return Err(field("hold_key_sha256", "a hold needs a port and a 64-hex-digit key digest")),
    };
    let exec = ExecOptions {
        workdir: PathBuf::from(wire.workdir),
        timeout: Duration::from_millis(wire.timeout_ms),
        kill_grace: Duration::from_millis(wire.kill_grace_ms),
        max_output_bytes: usize::try_from(wire.max_output_bytes).unwrap_or(usize::MAX),
        max_artifact_bytes: wire.max_artifact_bytes,
        spill_bytes: wire.spill_bytes,
        hold,
        artifact_patterns: wire.artifacts,
        disk_paths: wire.disk_paths.into_iter().map(PathBuf::from).collect(),
        disk_limit_bytes: wire.disk_limit_bytes,
        termination_log: PathBuf::from(TERMINATION_LOG),
        start_deadline_ms: None,
        argv: wire.argv,
    };
    let tag = match wire.tag {
        Some(text) => Some(Tag::from_hex(&text).ok_or_else(|| field("tag", "must be 32 lowercase hex digits"))?),
        None => None,
    };
    Ok((key, Assignment { run_id: wire.run_id, exec, env: wire.env, files, tag }))
}

/// The body on the wire. Unknown fields are refused: a field this runner
/// does not know is a promise it would silently not keep.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    v: u32,
    key: String,
    run_id: String,
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    workdir: String,
    timeout_ms: u64,
    kill_grace_ms: u64,
    max_output_bytes: u64,
    max_artifact_bytes: u64,
    /// Absent from an older server's assignment: nothing extra is sent.
    #[serde(default)]
    spill_bytes: u64,
    /// Where what is sent whole is held (`held`); absent: on the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold_key_sha256: Option<String>,
    artifacts: Vec<String>,
    disk_paths: Vec<String>,
    disk_limit_bytes: u64,
    files: Vec<WireFile>,
    /// A session call's tag (`Assignment::tag`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tag: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireFile {
    path: String,
    mode: u32,
    content_b64: String,
}

fn is_run_id(text: &str) -> bool {
    (1..=63).contains(&text.len()) && text.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
}

/// The runner checks again where it writes (`runner::init::join_inside`);
/// this refuses the body before anything is written.
fn is_relative_inside(path: &str) -> bool {
    !path.is_empty() && !path.starts_with('/') && path.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::from_bytes([7; KEY_BYTES])
    }

    fn assignment() -> Assignment {
        Assignment {
            run_id: "3f2a9c".into(),
            exec: ExecOptions {
                workdir: "/work".into(),
                timeout: Duration::from_millis(1500),
                kill_grace: Duration::from_secs(2),
                max_output_bytes: 4096,
                max_artifact_bytes: 8192,
                spill_bytes: 1 << 28,
                hold: None,
                artifact_patterns: vec!["out/*.txt".into()],
                disk_paths: vec!["/work".into(), "/tmp".into()],
                disk_limit_bytes: 1 << 30,
                termination_log: TERMINATION_LOG.into(),
                start_deadline_ms: None,
                argv: vec!["sh".into(), "-c".into(), "echo $A".into()],
            },
            env: [("A".to_string(), "secret value".to_string())].into(),
            files: vec![AssignedFile { path: "bin/run.sh".into(), mode: 0o755, content: vec![0, 255, b'\n'] }],
            tag: Some(Tag::from_bytes([9; crate::sandbox::frame::TAG_BYTES])),
        }
    }

    /// The body as JSON, with `change` applied, for the refusal cases.
    fn body_with(change: impl Fn(&mut serde_json::Value)) -> Vec<u8> {
        let mut value: serde_json::Value = serde_json::from_slice(&encode(&key(), &assignment())).unwrap();
        change(&mut value);
        serde_json::to_vec(&value).unwrap()
    }

    #[test]
    fn an_assignment_round_trips_with_its_key() {
        let body = encode(&key(), &assignment());
        let (decoded_key, decoded) = decode(&body).unwrap();
        assert!(decoded_key.matches(&key()));
        assert_eq!(decoded, assignment());
        let text = String::from_utf8(body).unwrap();
        assert!(text.starts_with(r#"{"v":1,"key":"0707"#), "{text}");
        assert!(text.contains(r#""content_b64":"AP8K""#), "{text}");
        assert!(!text.contains("hold"), "no hold, no fields: an older runner reads it");
        let mut holding = assignment();
        holding.exec.hold = Some(HoldOptions { port: 7777, key_sha256: "ab".repeat(32) });
        assert_eq!(decode(&encode(&key(), &holding)).unwrap().1, holding);
        let half = body_with(|value| value["hold_port"] = 7777.into());
        assert!(matches!(decode(&half), Err(DecodeError::Field { field: "hold_key_sha256", .. })), "a port without a digest");
    }

    #[test]
    fn bodies_that_are_not_assignments_are_refused_with_the_field() {
        let field = |field: &'static str, message: &str| DecodeError::Field { field, message: message.into() };
        let cases: Vec<(&str, Vec<u8>, DecodeError)> = vec![
            ("another version", body_with(|v| v["v"] = 2.into()), DecodeError::UnknownVersion(2)),
            ("a short key", body_with(|v| v["key"] = "abcd".into()), field("key", "a key is 64 hex digits")),
            (
                "a run id with a slash",
                body_with(|v| v["run_id"] = "a/b".into()),
                field("run_id", "must be 1 to 63 lowercase letters, digits or '-'"),
            ),
            ("no program", body_with(|v| v["argv"] = serde_json::json!([])), field("argv", "must name a program")),
            ("a relative workdir", body_with(|v| v["workdir"] = "work".into()), field("workdir", "must be absolute")),
            (
                "a file outside the workdir",
                body_with(|v| v["files"][0]["path"] = "../etc/passwd".into()),
                field("files", "a path must be relative, without `..`, empty or absolute parts"),
            ),
            ("a setuid file", body_with(|v| v["files"][0]["mode"] = 0o4755.into()), field("files", "a mode must be at most 0777")),
        ];
        for (case, body, expected) in cases {
            assert_eq!(decode(&body).unwrap_err(), expected, "{case}");
        }
        for (case, body) in [
            ("not JSON", b"{".to_vec()),
            ("an unknown field", body_with(|v| v["privileged"] = true.into())),
            ("a missing field", body_with(|v| drop(v.as_object_mut().unwrap().remove("argv")))),
            ("bad base64", body_with(|v| v["files"][0]["content_b64"] = "!!".into())),
        ] {
            assert!(matches!(decode(&body), Err(DecodeError::Malformed(_) | DecodeError::Field { .. })), "{case}");
        }
    }

    #[test]
    fn keys_compare_whole_and_never_show() {
        let last_byte_differs = Key::from_hex(&format!("{}08", "07".repeat(31))).unwrap();
        assert!(!key().matches(&last_byte_differs));
        assert!(key().matches(&Key::from_hex(&key().to_hex().to_uppercase()).unwrap()), "either case");
        assert!(key().matches(&Key::from_hex(&format!("{}\n", key().to_hex())).unwrap()), "a trailing newline is allowed");
        assert!(Key::from_hex(&"0g".repeat(32)).is_err());
        assert_ne!(Key::random().unwrap(), Key::random().unwrap());
        assert_eq!(format!("{:?}", key()), "Key(***)");
        let shown = format!("{:?}", assignment());
        assert!(!shown.contains("secret") && !shown.contains("echo"), "{shown}");
    }
}
