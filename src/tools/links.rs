//! The output store's entries as MCP resources: the `contents` entry a
//! `resources/read` of a `job://` URI answers (one piece, with where it is
//! and the next piece's URI in `_meta`) and the URI templates that
//! describe them. The protocol layer wraps these in JSON-RPC; what is
//! stored and how a range is cut is `outputs`'s.

use std::time::SystemTime;

use base64::Engine as _;
use serde_json::{Value, json};

use super::Ctx;
use crate::outputs::{self, ReadError};

pub use crate::outputs::{SCHEME, is_ours};

/// Stored-output pieces being read and answered at once, in the whole
/// process. A piece (up to `outputs::MAX_PIECE`) is held as bytes, as
/// base64 or text and as the serialised reply until it is handed to the
/// transport: some 4 MiB each. Past this many, readers wait their turn, so
/// 128 clients reading at once hold what 4 do.
static PIECES_AT_ONCE: crate::engine::run::slots::Gate = crate::engine::run::slots::Gate::new(4);

/// A turn to read a stored output's piece and hand its answer on: held
/// from before the read until the reply is queued (`PIECES_AT_ONCE`); the
/// turn ends when it is dropped.
pub struct PieceTurn {
    _inside: crate::engine::run::slots::Inside<'static>,
}

pub fn piece_turn() -> PieceTurn {
    PieceTurn { _inside: PIECES_AT_ONCE.enter() }
}

/// Why a read answered nothing, as the protocol sorts it.
#[derive(Debug, PartialEq)]
pub enum ReadFailure {
    /// No such entry, or its retention ended.
    NotFound(String),
    /// The URI or its range is wrong.
    Invalid(String),
    /// The store could not be read.
    Internal(String),
}

/// The URI forms of stored outputs, RFC 6570 templates.
pub fn templates() -> Value {
    let range = format!(
        "Add ?offset=<byte>&length=<bytes> for a piece (at most {} bytes; {} without length); each answer's _meta gives the size and the next piece's URI",
        outputs::MAX_PIECE,
        outputs::DEFAULT_PIECE
    );
    json!([
        {
            "uriTemplate": "job://{run_id}/stdout{?offset,length}",
            "name": "stdout",
            "description": format!("A run's whole stdout when it was too big to inline; results link to it. {range}"),
            "mimeType": "text/plain",
        },
        {
            "uriTemplate": "job://{run_id}/stderr{?offset,length}",
            "name": "stderr",
            "description": format!("A run's whole stderr when it was too big to inline; results link to it. {range}"),
            "mimeType": "text/plain",
        },
        {
            "uriTemplate": "job://{run_id}/files/{+path}{?offset,length}",
            "name": "file",
            "description": format!("A file a run wrote that was past the artifact cap, its path percent-encoded; results link to it. {range}"),
        },
    ])
}

/// A piece of a stored output, as one `contents` entry: text when its
/// bytes are UTF-8, its type is text and it escapes in JSON to at most
/// 7/4 of its size, else a blob; `_meta` says where
/// it is and what comes next.
/// Only `caller`'s runs are read, on a server with several callers.
pub fn read(ctx: &Ctx, caller: &crate::callers::Caller, uri: &str) -> Result<Value, ReadFailure> {
    // Every site shares the one store: any connected site's will do.
    let store = ctx.sites.iter().find_map(|site| site.engine.as_ref().ok()?.policy.outputs.as_ref());
    let Some(store) = store else {
        return Err(ReadFailure::NotFound(format!(
            "`{}`: this server keeps no outputs (MCP_K8S_OUTPUTS_DIR is not set, or no backend is connected)",
            crate::echo::shorten(uri)
        )));
    };
    let request = outputs::parse_uri(uri).map_err(read_error)?;
    let piece = store.read(&request, SystemTime::now(), caller.owner()).map_err(read_error)?;
    let end = piece.offset + piece.bytes.len() as u64;
    let length = if request.length == outputs::DEFAULT_PIECE { String::new() } else { format!("&length={}", request.length) };
    let next = (end < piece.size).then(|| format!("{}?offset={end}{length}", outputs::uri(&request.run_id, &request.entry)));
    let mut content = json!({
        "uri": uri,
        "mimeType": piece.mime_type,
        "_meta": {
            "offset": piece.offset,
            "length": piece.bytes.len(),
            "size": piece.size,
            "total_bytes": piece.total,
            "complete": piece.complete,
            "next": next,
        },
    });
    let blob = |bytes: &[u8]| Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    if !piece.mime_type.starts_with("text/") {
        content["blob"] = blob(&piece.bytes);
    } else {
        match String::from_utf8(piece.bytes) {
            Ok(text) if escapes_compactly(&text) => content["text"] = Value::String(text),
            Ok(text) => content["blob"] = blob(text.as_bytes()),
            Err(error) => content["blob"] = blob(error.as_bytes()),
        }
    }
    Ok(content)
}

/// Whether `text` written as a JSON string takes at most 7/4 of its size.
/// Control characters other than whitespace take six bytes each, and a
/// reply is held whole until it is written: a piece of NUL bytes would
/// grow sixfold as text, and grows by a third as a blob. Coloured output
/// (an escape every few characters, about 1.6) stays text, readable; a
/// default piece (512 KiB) as text stays under a 1 MiB event.
fn escapes_compactly(text: &str) -> bool {
    let escaped: usize = text
        .bytes()
        .map(|byte| match byte {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum();
    4 * escaped <= 7 * text.len()
}

fn read_error(error: ReadError) -> ReadFailure {
    let message = error.to_string();
    match error {
        ReadError::NotFound(_) | ReadError::Expired(_) => ReadFailure::NotFound(message),
        ReadError::BadUri(_) | ReadError::BadRange(_) => ReadFailure::Invalid(message),
        ReadError::Io(_) => ReadFailure::Internal(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_is_text_unless_escaping_takes_more_than_seven_quarters() {
        let table: [(&str, String, bool); 10] = [
            ("empty", String::new(), true),
            ("lines of text", "a log line, with \"quotes\"\n".repeat(100), true),
            ("unicode", "données ✓ 完成\n".repeat(50), true),
            ("coloured output", "\u{1b}[32mok\u{1b}[0m passed\n".repeat(100), true),
            ("a progress bar redrawn: twice", "\r\u{1b}[2K#".repeat(100), false),
            ("quotes and backslashes only: twice", "\\\"".repeat(100), false),
            ("empty lines: twice", "\n".repeat(1000), false),
            ("a quote in every other byte: 3/2", "a\"".repeat(100), true),
            ("NUL bytes", "\0".repeat(1000), false),
            ("one NUL in text", format!("{}\0", "x".repeat(100)), true),
        ];
        for (case, text, as_text) in table {
            let escaped = serde_json::to_string(&text).unwrap().len() - 2;
            assert_eq!(escapes_compactly(&text), as_text, "{case}: {escaped} escaped of {}", text.len());
            assert_eq!(as_text, 4 * escaped <= 7 * text.len(), "{case}: the table agrees with serde_json: {escaped} of {}", text.len());
        }
    }
}
