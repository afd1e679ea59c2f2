//! The wire format between the in-pod runner and the server: framed,
//! versioned lines on the runner's stdout, which the server reads back from
//! the container log (followed while the command runs).
//!
//! Every frame is one line `MCPK8S/2 <tag> <json>` so that it survives the
//! kubelet's log handling (CRI splits long lines into partial records and
//! joins them again when serving the log) and can be parsed one line at a
//! time with bounded memory. Payload bytes travel as base64 inside the JSON,
//! in chunks of at most `CHUNK_BYTES`, so no line grows past ~90 KiB: the
//! final output and every artifact are sent as chunk frames, never inside
//! the result frame. (A first version put the captured output into the
//! result frame; at the 1 MiB default cap that line passed 2.7 MiB and the
//! reader's line bound dropped the whole result.)
//! Lines that do not start with the prefix are not ours (for example a
//! message from the container runtime) and are ignored by the reader.
//!
//! The tag is the run's own: 128 random bits the runner draws before the
//! command exists and writes on every frame. The command cannot read the
//! runner's memory or its stdout (the runner is not dumpable, and the
//! command's streams are pipes to it), so a line it manages to put in the
//! log cannot carry the tag, and the reader, which takes the first frame's
//! tag as the run's, ignores it. That is the second wall; the first is that
//! the command cannot reach the runner's stdout at all.
//!
//! Both halves live here: the runner encodes, the engine decodes. A change
//! to the format bumps `VERSION`; the engine rejects versions it does not know.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The format version written in every line's prefix.
pub const VERSION: u32 = 2;
/// Prefix of every frame line, including the version.
const PREFIX: &str = "MCPK8S/2 ";
/// Bytes of randomness in a run's tag.
pub const TAG_BYTES: usize = 16;
/// Largest payload carried by one `Output` or `ArtifactChunk` frame.
pub const CHUNK_BYTES: usize = 48 * 1024;
/// Longest log line the engine keeps; the runner's own frames stay far
/// below this (a chunk frame is about 4/3 of `CHUNK_BYTES`), so a longer
/// line is something else (a process writing to the container's stdout
/// directly) and is skipped.
pub const MAX_LINE_BYTES: usize = 1 << 20;
const _: () = assert!(CHUNK_BYTES * 2 < MAX_LINE_BYTES, "a chunk frame must fit in one kept line");

/// Which of the command's streams a chunk of output came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    /// 0 for stdout, 1 for stderr: where a per-stream pair keeps it.
    pub fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }
}

/// One frame. The order on the wire is: `Started`, any number of `Output`
/// (live output, capped), then after the command ends `Ended`, the `Captured` chunks
/// (head and tail of stdout, then of stderr), the `Artifact` headers each
/// followed by their `ArtifactChunk`s, and `Result` last. A log that
/// ends without `Result` means the runner was killed before it could finish.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Frame {
    Started(Started),
    Output(Output),
    /// A chunk of the final, capped capture of a stream (head and tail).
    Captured(Output),
    Artifact(ArtifactHeader),
    ArtifactChunk(ArtifactChunk),
    /// A piece of a stream's whole text, for the output store: sent only
    /// when the engine asked for it (`--spill-bytes`) and the stream grew
    /// past the inline cap, from offset 0 on.
    Spill(SpillChunk),
    /// The runner holds what it sends whole in the sandbox (`held`): the
    /// server fetches it from `port` before the result comes.
    Held(Held),
    /// The command (its whole group) has ended, and how: written before
    /// the runner collects anything, so that a runner that dies collecting
    /// (killed for memory the command left full) is not taken for the
    /// command dying. Absent from older runners' logs.
    Ended(Ended),
    Result(RunResult),
}

/// How the command ended, as soon as it had: its exit code or signal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ended {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

/// Output held in the sandbox, `bytes` of frames in the held file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Held {
    pub port: u16,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Started {
    /// Milliseconds since the Unix epoch when the command was started.
    pub started_at_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Output {
    pub stream: Stream,
    pub data_b64: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArtifactHeader {
    /// Path relative to the workdir, with `/` separators.
    pub path: String,
    pub size: u64,
    pub mode: u32,
    pub sha256: String,
    /// False when the file did not fit under the artifact cap: its metadata
    /// is reported, its content is not, and no chunks follow.
    pub content_included: bool,
    /// True when a file past the cap is sent whole for the output store
    /// anyway: its `ArtifactChunk`s follow, and the engine stores them
    /// instead of inlining them. Absent from older runners' frames.
    #[serde(default, skip_serializing_if = "is_false")]
    pub spilled: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArtifactChunk {
    pub data_b64: String,
}

/// Bytes of a stream at `offset` of its whole text. The offset makes a
/// second reading of the same log (a follower that started again) write
/// the same bytes in the same place, and a missing piece a visible gap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpillChunk {
    pub stream: Stream,
    pub offset: u64,
    pub data_b64: String,
}

/// How the command ended, as the runner saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The exit code, or `None` when the command was killed by a signal or
    /// never started.
    pub exit_code: Option<i32>,
    /// The signal that ended the command, if one did.
    pub signal: Option<i32>,
    /// True when the runner stopped the command because `timeout_s` passed.
    pub timed_out: bool,
    /// True when the runner stopped the command because it was told to stop
    /// (SIGTERM to the container, as on pod deletion).
    pub terminated_by_request: bool,
    /// True when the kernel's OOM killer fired in this container's cgroup.
    pub oom_killed: bool,
    /// Process creations (fork, clone, threads) the pids controller refused
    /// while the command ran: the pod reached its pid limit (the kubelet's
    /// `podPidsLimit`). Zero when none were, or when the cgroup's
    /// `pids.events` cannot be read. Absent from older runners' frames.
    #[serde(default)]
    pub pids_fork_failures: u64,
    /// Set when the runner stopped the command because a folder it may
    /// write outgrew its limit (`runner::disk`): which one, and by how much.
    #[serde(default)]
    pub disk_limit_exceeded: Option<String>,
    /// Set when the command could not be started at all (not found, not
    /// executable, bad workdir): the operating system's message.
    pub start_error: Option<String>,
    pub started_at_ms: u64,
    pub finished_at_ms: u64,
    /// Bytes of each stream's final capture sent in `Captured` frames, so
    /// the reader can tell whether all of them arrived.
    pub stdout_captured_bytes: u64,
    pub stderr_captured_bytes: u64,
    pub stdout_total_bytes: u64,
    pub stderr_total_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Bytes of each stream sent in `Spill` frames: its whole text when
    /// this equals the total. Zero without an output store.
    #[serde(default)]
    pub stdout_spilled_bytes: u64,
    #[serde(default)]
    pub stderr_spilled_bytes: u64,
    /// How many `Artifact` frames were written before this one.
    pub artifact_count: u32,
    /// True when some matching files were left out or sent without content.
    pub artifacts_truncated: bool,
    /// Problems that did not stop the run but lost something (an unreadable
    /// file, a workdir scan error), so the caller is told, not just a log.
    pub notes: Vec<String>,
}

impl RunResult {
    /// A result for a command started at `started_at_ms` about which
    /// nothing else is known yet; the runner fills it in as the run ends.
    pub fn started(started_at_ms: u64) -> RunResult {
        RunResult {
            exit_code: None,
            signal: None,
            timed_out: false,
            terminated_by_request: false,
            oom_killed: false,
            pids_fork_failures: 0,
            disk_limit_exceeded: None,
            start_error: None,
            started_at_ms,
            finished_at_ms: 0,
            stdout_captured_bytes: 0,
            stderr_captured_bytes: 0,
            stdout_total_bytes: 0,
            stderr_total_bytes: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_spilled_bytes: 0,
            stderr_spilled_bytes: 0,
            artifact_count: 0,
            artifacts_truncated: false,
            notes: Vec::new(),
        }
    }
}

/// The run's tag, written on every frame. Its `Debug` never shows it: a
/// command that could read the server's log must not learn it there.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Tag([u8; TAG_BYTES]);

impl Tag {
    pub const fn from_bytes(bytes: [u8; TAG_BYTES]) -> Tag {
        Tag(bytes)
    }

    /// A fresh tag from the kernel's random source.
    pub fn random() -> Result<Tag, String> {
        super::random_bytes().map(Tag)
    }

    pub fn to_hex(self) -> String {
        super::to_hex(&self.0)
    }

    /// The inverse of `to_hex`; only the lowercase form the runner writes.
    pub fn from_hex(text: &str) -> Option<Tag> {
        if text.bytes().any(|byte| byte.is_ascii_uppercase()) {
            return None;
        }
        super::from_hex(text).map(Tag)
    }
}

impl std::fmt::Debug for Tag {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Tag(***)")
    }
}

/// Encodes one frame as a full line, newline included.
pub fn encode(tag: Tag, frame: &Frame) -> String {
    // Serialising these plain structs cannot fail: every key is a string and
    // there are no maps with non-string keys or floats.
    let json = serde_json::to_string(frame).unwrap_or_else(|_| String::from("{}"));
    format!("{PREFIX}{} {json}\n", tag.to_hex())
}

/// Why a line could not be decoded.
#[derive(Debug, PartialEq)]
pub enum DecodeError {
    /// The line carries our marker with a version this build does not know.
    UnknownVersion(String),
    /// The line has our prefix but no tag, or its JSON is not a frame.
    Malformed(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::UnknownVersion(prefix) => write!(
                formatter,
                "runner frame version `{prefix}` is not supported; use the runner image built with this server (MCP_K8S_RUNNER_IMAGE)"
            ),
            DecodeError::Malformed(message) => write!(formatter, "malformed runner frame: {message}"),
        }
    }
}

/// Decodes one log line into its tag and frame. `Ok(None)` means the line
/// is not a frame at all. Whether the tag is the run's is the reader's
/// business (`engine::run::collect`).
pub fn decode(line: &str) -> Result<Option<(Tag, Frame)>, DecodeError> {
    let line = line.trim_end_matches(['\n', '\r']);
    if let Some(rest) = line.strip_prefix(PREFIX) {
        let (tag, json) = rest.split_once(' ').unwrap_or((rest, ""));
        let tag = Tag::from_hex(tag).ok_or_else(|| DecodeError::Malformed("a frame without a valid tag".to_string()))?;
        let frame = serde_json::from_str(json).map_err(|error| DecodeError::Malformed(error.to_string()))?;
        return Ok(Some((tag, frame)));
    }
    if let Some(rest) = line.strip_prefix("MCPK8S/") {
        let version = rest.split(' ').next().unwrap_or_default();
        return Err(DecodeError::UnknownVersion(format!("MCPK8S/{version}")));
    }
    Ok(None)
}

/// Whether the start of a runner's output shows the command started: a
/// `Started` frame among its whole lines. Any tag counts: the runner writes
/// that frame before the command exists, so no command can have written
/// one that did not start.
pub fn shows_start(log: &[u8]) -> bool {
    let whole_lines = match log.iter().rposition(|byte| *byte == b'\n') {
        Some(last) => &log[..=last],
        None => return false,
    };
    String::from_utf8_lossy(whole_lines).lines().any(|line| matches!(decode(line), Ok(Some((_, Frame::Started(_))))))
}

pub fn to_base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub fn from_base64(text: &str) -> Result<Vec<u8>, DecodeError> {
    base64::engine::general_purpose::STANDARD.decode(text).map_err(|error| DecodeError::Malformed(format!("bad base64 in frame: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAG: Tag = Tag::from_bytes([7; TAG_BYTES]);

    #[test]
    fn a_log_shows_a_start_by_its_started_frame_only() {
        let tag = Tag::from_hex("00112233445566778899aabbccddeeff").unwrap();
        let started = encode(tag, &Frame::Started(Started { started_at_ms: 5 }));
        let mut not_started = RunResult::started(0);
        not_started.start_error = Some("the run's start deadline passed".into());
        let late = encode(tag, &Frame::Result(not_started));
        let cases: Vec<(&str, String, bool)> = vec![
            ("nothing yet", String::new(), false),
            ("the started frame", format!("{started}\n"), true),
            ("started, then output", format!("{started}\nhello\n"), true),
            ("a late start: a result, no start", format!("{late}\n"), false),
            ("a line still being written", started.trim_end().to_string(), false),
            ("other text", "waiting\n".to_string(), false),
        ];
        for (case, log, shows) in cases {
            assert_eq!(shows_start(log.as_bytes()), shows, "{case}");
        }
    }

    #[test]
    fn every_kind_round_trips_as_one_line() {
        let frames = [
            Frame::Started(Started { started_at_ms: 5 }),
            Frame::Output(Output { stream: Stream::Stderr, data_b64: to_base64(b"a\nb") }),
            Frame::Artifact(ArtifactHeader {
                path: "out/x.png".into(),
                size: 3,
                mode: 0o644,
                sha256: "ab".into(),
                content_included: true,
                spilled: false,
            }),
            Frame::Artifact(ArtifactHeader {
                path: "big.bin".into(),
                size: 3 << 20,
                mode: 0o644,
                sha256: "cd".into(),
                content_included: false,
                spilled: true,
            }),
            Frame::Spill(SpillChunk { stream: Stream::Stdout, offset: 1 << 20, data_b64: to_base64(b"x") }),
            Frame::Held(Held { port: 7777, bytes: 1 << 30 }),
            Frame::ArtifactChunk(ArtifactChunk { data_b64: to_base64(&[0, 255, 10]) }),
        ];
        for frame in frames {
            let line = encode(TAG, &frame);
            assert!(line.starts_with(PREFIX));
            assert_eq!(line.matches('\n').count(), 1, "{line}");
            assert_eq!(decode(&line), Ok(Some((TAG, frame))));
        }
    }

    #[test]
    fn foreign_lines_are_not_frames() {
        for line in ["", "hello", "MCPK8S", "mcpk8s/2 result {}"] {
            assert_eq!(decode(line), Ok(None), "{line:?}");
        }
    }

    #[test]
    fn unknown_version_and_bad_json_are_errors() {
        assert_eq!(decode("MCPK8S/9 {\"kind\":\"started\"}"), Err(DecodeError::UnknownVersion("MCPK8S/9".into())));
        assert_eq!(decode("MCPK8S/1 {\"kind\":\"started\"}"), Err(DecodeError::UnknownVersion("MCPK8S/1".into())));
        let tag = "07".repeat(TAG_BYTES);
        assert!(matches!(decode(&format!("MCPK8S/2 {tag} {{not json")), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn a_frame_needs_a_tag_of_32_lowercase_hex_digits() {
        let json = r#"{"kind":"started","started_at_ms":5}"#;
        let cases = [
            (format!("MCPK8S/2 {} {json}", "07".repeat(TAG_BYTES)), true),
            (format!("MCPK8S/2 {json}"), false),
            (format!("MCPK8S/2 {} {json}", "07".repeat(TAG_BYTES - 1)), false),
            (format!("MCPK8S/2 {} {json}", "0A".repeat(TAG_BYTES)), false),
            (format!("MCPK8S/2 {}", "07".repeat(TAG_BYTES)), false),
        ];
        for (line, decodes) in cases {
            assert_eq!(decode(&line).is_ok(), decodes, "{line}");
        }
    }

    #[test]
    fn a_tag_is_never_shown_by_debug() {
        assert_eq!(format!("{TAG:?}"), "Tag(***)");
    }
}
