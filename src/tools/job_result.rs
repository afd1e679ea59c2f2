//! `RunOutcome` → the `run_job` result: the JSON in `structuredContent`
//! (and repeated as text), plus MCP `image` blocks for PNG/JPEG/GIF/WebP
//! artifacts so a model can see them, and `resource_link` blocks for the
//! streams and files kept whole in the output store. Wire names are
//! decided here only.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::engine::port::spec::{Artifact, PhaseTimes, RunOutcome, RunReason, RunStatus};
use crate::outputs::{self, Link};

pub fn status_name(status: RunStatus) -> &'static str {
    status.name()
}

fn reason_name(reason: RunReason) -> &'static str {
    reason.name()
}

/// The structured result. Output that is not valid UTF-8 is also given as
/// base64 (`stdout_b64`), so binary output is never silently mangled.
/// Large values are moved in after `json!`, which would copy them (it
/// serialises a reference): with artifacts near the cap, each copy cost
/// the server tens of MB.
pub fn outcome_json(outcome: &RunOutcome) -> Value {
    let mut result = json!({
        "run_id": outcome.run_id,
        "status": status_name(outcome.status),
        "reason": outcome.reason.map(reason_name),
        "message": outcome.message,
        "exit_code": outcome.exit_code.unwrap_or(-1),
        "signal": outcome.signal,
        "duration_ms": outcome.duration.as_millis() as u64,
        "stdout": String::from_utf8_lossy(&outcome.stdout),
        "stderr": String::from_utf8_lossy(&outcome.stderr),
        "stdout_total_bytes": outcome.stdout_total_bytes,
        "stderr_total_bytes": outcome.stderr_total_bytes,
        "truncated": {
            "stdout": outcome.truncated.stdout,
            "stderr": outcome.truncated.stderr,
            "artifacts": outcome.truncated.artifacts,
        },
        "timings": timings_json(&outcome.times),
        "notes": outcome.notes,
    });
    result["artifacts"] = Value::Array(outcome.artifacts.iter().map(artifact_json).collect());
    // Only when the store kept something: a small result is unchanged.
    if !outcome.links.is_empty() {
        result["links"] = Value::Array(outcome.links.iter().map(link_json).collect());
    }
    for (name, bytes) in [("stdout_b64", &outcome.stdout), ("stderr_b64", &outcome.stderr)] {
        if std::str::from_utf8(bytes).is_err() {
            result[name] = Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
        }
    }
    result
}

/// The content blocks besides the JSON text: pictures, then links.
pub fn content_blocks(outcome: &RunOutcome) -> Vec<Value> {
    let mut blocks = image_blocks(outcome);
    blocks.extend(outcome.links.iter().map(link_block));
    blocks
}

fn link_json(link: &Link) -> Value {
    json!({
        "uri": link.uri,
        "name": link.name,
        "mime_type": link.mime_type,
        "size": link.size,
        "total_bytes": link.total,
        "complete": link.complete,
        "expires_at": crate::log::rfc3339_utc(link.expires_at),
    })
}

/// A `resource_link` block: what `resources/read` reads, and how to page.
fn link_block(link: &Link) -> Value {
    let whole = if link.complete {
        format!("the whole {} ({} bytes)", link.name, link.size)
    } else {
        format!("the first {} of {} bytes of {} (the rest could not be kept)", link.size, link.total, link.name)
    };
    json!({
        "type": "resource_link",
        "uri": link.uri,
        "name": link.name,
        "mimeType": link.mime_type,
        "size": link.size,
        "description": format!(
            "{whole}, readable until {}: resources/read returns it in pieces of {} bytes (up to {} with length); add ?offset=<byte>&length=<bytes> to the URI, or follow the next URI in each piece's _meta",
            crate::log::rfc3339_utc(link.expires_at),
            outputs::DEFAULT_PIECE,
            outputs::MAX_PIECE
        ),
    })
}

/// `image` content blocks for artifacts that are pictures.
fn image_blocks(outcome: &RunOutcome) -> Vec<Value> {
    outcome
        .artifacts
        .iter()
        .filter_map(|artifact| {
            let content = artifact.content.as_ref()?;
            let mime_type = image_mime_type(content)?;
            let mut block = json!({"type": "image", "mimeType": mime_type});
            block["data"] = Value::String(base64::engine::general_purpose::STANDARD.encode(content));
            Some(block)
        })
        .collect()
}

/// Recognises pictures by their magic bytes, not their names.
fn image_mime_type(content: &[u8]) -> Option<&'static str> {
    if content.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if content.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if content.starts_with(b"GIF87a") || content.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if content.len() >= 12 && &content[..4] == b"RIFF" && &content[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

fn artifact_json(artifact: &Artifact) -> Value {
    let mut value = json!({
        "path": artifact.path,
        "size": artifact.size,
        "mode": format!("{:04o}", artifact.mode),
        "sha256": artifact.sha256,
    });
    value["content_b64"] =
        artifact.content.as_ref().map_or(Value::Null, |content| Value::String(base64::engine::general_purpose::STANDARD.encode(content)));
    value
}

fn timings_json(times: &PhaseTimes) -> Value {
    let times = &times.ordered();
    let stamp = |time: Option<SystemTime>| time.map(crate::log::rfc3339_utc);
    let between = |from: Option<SystemTime>, to: Option<SystemTime>| -> Option<u64> {
        Some(to?.duration_since(from?).unwrap_or(Duration::ZERO).as_millis() as u64)
    };
    json!({
        "warm": times.warm,
        "submitted_at": stamp(times.submitted),
        "created_at": stamp(times.created),
        "scheduled_at": stamp(times.scheduled),
        "started_at": stamp(times.started),
        "first_output_at": stamp(times.first_output),
        "finished_at": stamp(times.finished),
        "answered_at": stamp(times.answered),
        "queued_ms": between(times.created, times.scheduled),
        "starting_ms": between(times.scheduled, times.started),
        "first_output_ms": between(times.submitted, times.first_output),
        "answer_ms": between(times.submitted, times.answered),
    })
}

/// The `outputSchema` of `run_job` and `execute_code`. Types only, apart
/// from the few fields whose meaning the name does not carry: every tool's
/// schema is paid in the agent's context before its first call, and
/// docs/run-result.md says the rest (the reasons, the timings, the links).
pub fn output_schema() -> Value {
    let string = json!({"type": "string"});
    let integer = json!({"type": "integer"});
    let integer_or_null = json!({"type": ["integer", "null"]});
    let object = json!({"type": "object"});
    json!({
        "type": "object",
        "required": ["status", "exit_code", "stdout", "stderr", "duration_ms", "artifacts", "truncated", "message"],
        "properties": {
            "run_id": string,
            "status": {"type": "string", "enum": ["succeeded", "failed", "timeout", "error", "cancelled"]},
            "reason": {"type": ["string", "null"], "description": "why, when not succeeded: NonZeroExit, OOMKilled, ImagePullFailed, ..."},
            "message": {"type": "string", "description": "what happened and what to do"},
            "exit_code": {"type": "integer", "description": "-1 when the command did not exit by itself"},
            "signal": integer_or_null,
            "duration_ms": integer,
            "stdout": string,
            "stderr": string,
            "stdout_b64": {"type": "string", "description": "when stdout is not UTF-8"},
            "stderr_b64": string,
            "stdout_total_bytes": integer,
            "stderr_total_bytes": integer,
            "artifacts": {"type": "array", "items": {"type": "object", "description": "path, size, mode, sha256, content_b64 (null: over the cap)"}},
            "truncated": {"type": "object", "description": "stdout, stderr, artifacts: true when cut at the cap"},
            "timings": object,
            "notes": {"type": "array", "items": string},
            "links": {"type": "array", "items": object, "description": "output kept whole past its cap: resources/read"},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::port::spec::RunOutcome;

    #[test]
    fn binary_output_also_travels_as_base64() {
        let mut outcome = RunOutcome::without_result("r", RunStatus::Succeeded, RunReason::NonZeroExit, "m".into());
        outcome.stdout = vec![0xff, 0x00];
        outcome.stderr = b"plain".to_vec();
        let json = outcome_json(&outcome);
        assert_eq!(json["stdout_b64"], "/wA=");
        assert!(json.get("stderr_b64").is_none());
        assert_eq!(json["exit_code"], -1);
        assert_eq!(json["reason"], "NonZeroExit");
    }

    #[test]
    fn timings_are_ordered_with_time_to_first_output_and_answer() {
        let at = |ms: u64| Some(std::time::UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms));
        let mut outcome = RunOutcome::without_result("r", RunStatus::Succeeded, RunReason::NonZeroExit, "m".into());
        outcome.times = PhaseTimes {
            submitted: at(0),
            created: at(40),
            scheduled: at(50),
            started: at(90),
            first_output: at(130),
            finished: at(120),
            answered: at(150),
            warm: true,
        };
        let timings = &outcome_json(&outcome)["timings"];
        assert_eq!(timings["warm"], true);
        assert_eq!(timings["submitted_at"], "2027-01-15T08:00:00.000Z");
        assert_eq!(timings["first_output_at"], timings["finished_at"], "brought back to the runner's finish: {timings}");
        assert_eq!((timings["first_output_ms"].as_u64(), timings["answer_ms"].as_u64()), (Some(120), Some(150)));
        let documented = include_str!("../../docs/run-result.md");
        for key in timings.as_object().unwrap().keys() {
            assert!(documented.contains(&format!("`{key}`")), "docs/run-result.md names `{key}`");
        }
        let cold = outcome_json(&RunOutcome::without_result("r", RunStatus::Error, RunReason::ApiError, "m".into()));
        assert_eq!((cold["timings"]["warm"].as_bool(), cold["timings"]["answer_ms"].is_null()), (Some(false), true));
    }

    #[test]
    fn pictures_are_recognised_by_content() {
        let cases: [(&[u8], Option<&str>); 5] = [
            (b"\x89PNG\r\n\x1a\nrest", Some("image/png")),
            (&[0xff, 0xd8, 0xff, 0xe0], Some("image/jpeg")),
            (b"GIF89a..", Some("image/gif")),
            (b"RIFF\0\0\0\0WEBPVP8 ", Some("image/webp")),
            (b"hello.png", None),
        ];
        for (content, expected) in cases {
            assert_eq!(image_mime_type(content), expected);
        }
    }
}
