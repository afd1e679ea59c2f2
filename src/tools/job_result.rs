//! `RunOutcome` → the `run_job` result: the JSON in `structuredContent`
//! (and repeated as text), plus MCP `image` blocks for PNG/JPEG/GIF/WebP
//! artifacts so a model can see them, and `resource_link` blocks for the
//! streams and files kept whole in the output store. Wire names are
//! decided here only.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::engine::outputs::{self, Link};
use crate::engine::spec::{Artifact, PhaseTimes, RunOutcome, RunReason, RunStatus};

pub fn status_name(status: RunStatus) -> &'static str {
    status.name()
}

pub fn reason_name(reason: RunReason) -> &'static str {
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
pub fn image_blocks(outcome: &RunOutcome) -> Vec<Value> {
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
pub fn image_mime_type(content: &[u8]) -> Option<&'static str> {
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

/// Every reason a result can carry, from the one list (a hand-written one
/// here once missed two).
fn reason_description() -> String {
    let names: Vec<&str> = RunReason::ALL.iter().map(|reason| reason.name()).collect();
    format!("Why, when not plainly succeeded: {}", names.join(", "))
}

/// The `outputSchema` of `run_job` (and of a finished `fetch_job`).
pub fn output_schema() -> Value {
    let string_or_null = json!({"type": ["string", "null"]});
    json!({
        "type": "object",
        "required": ["status", "exit_code", "stdout", "stderr", "duration_ms", "artifacts", "truncated", "message"],
        "properties": {
            "run_id": {"type": "string"},
            "status": {"type": "string", "enum": ["succeeded", "failed", "timeout", "error", "cancelled"]},
            "reason": {"type": ["string", "null"], "description": reason_description()},
            "message": {"type": "string", "description": "What happened and what to do about it"},
            "exit_code": {"type": "integer", "description": "-1 when the command did not exit by itself"},
            "signal": {"type": ["integer", "null"]},
            "duration_ms": {"type": "integer"},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "stdout_b64": {"type": "string", "description": "Present when stdout is not valid UTF-8"},
            "stderr_b64": {"type": "string", "description": "Present when stderr is not valid UTF-8"},
            "stdout_total_bytes": {"type": "integer"},
            "stderr_total_bytes": {"type": "integer"},
            "artifacts": {"type": "array", "items": {
                "type": "object",
                "required": ["path", "size", "mode", "sha256"],
                "properties": {
                    "path": {"type": "string"},
                    "size": {"type": "integer"},
                    "mode": {"type": "string"},
                    "sha256": {"type": "string"},
                    "content_b64": {"type": ["string", "null"], "description": "null when the file did not fit under the artifact cap"},
                },
            }},
            "truncated": {"type": "object", "required": ["stdout", "stderr", "artifacts"], "properties": {
                "stdout": {"type": "boolean"}, "stderr": {"type": "boolean"}, "artifacts": {"type": "boolean"},
            }},
            "timings": {"type": "object", "description": "The run's phases in order (submitted, created, scheduled, started, first output, finished, answered; null when not seen) and whether it took a warm sandbox", "properties": {
                "warm": {"type": "boolean", "description": "The run took a warm pool's sandbox"},
                "submitted_at": string_or_null, "created_at": string_or_null, "scheduled_at": string_or_null,
                "started_at": string_or_null, "first_output_at": string_or_null, "finished_at": string_or_null,
                "answered_at": string_or_null,
                "queued_ms": {"type": ["integer", "null"]}, "starting_ms": {"type": ["integer", "null"]},
                "first_output_ms": {"type": ["integer", "null"], "description": "Time to first output, from submission"},
                "answer_ms": {"type": ["integer", "null"], "description": "Time to answer, from submission"},
            }},
            "notes": {"type": "array", "items": {"type": "string"}},
            "links": {"type": "array", "description": "Present when a stream or file was too big to inline and the server keeps it whole (MCP_K8S_OUTPUTS_DIR): read each with resources/read, in pieces", "items": {
                "type": "object",
                "required": ["uri", "name", "size", "complete"],
                "properties": {
                    "uri": {"type": "string", "description": "job://<run id>/stdout, /stderr or /files/<path>; add ?offset=<byte>&length=<bytes> to read a piece"},
                    "name": {"type": "string", "description": "stdout, stderr or the file's path"},
                    "mime_type": {"type": "string"},
                    "size": {"type": "integer", "description": "Bytes kept, all readable"},
                    "total_bytes": {"type": "integer", "description": "Bytes the command wrote"},
                    "complete": {"type": "boolean", "description": "false when the store could not keep all of it (size < total_bytes) or the log was cut"},
                    "expires_at": {"type": "string"},
                },
            }},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::spec::RunOutcome;

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
        let keys: Vec<&String> = timings.as_object().unwrap().keys().collect();
        let schema = output_schema();
        let described: Vec<&String> = schema["properties"]["timings"]["properties"].as_object().unwrap().keys().collect();
        assert_eq!(keys, described, "the schema names every field");
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
