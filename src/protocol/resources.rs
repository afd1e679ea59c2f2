//! MCP resources (server feature `resources`), declared only when there is
//! something to serve:
//! - the snippets folder's files as `snippet://<name>` resources, so
//!   clients can list and show them (MCP_K8S_SNIPPETS_DIR). The folder is
//!   read at each request, so the list is always current; `listChanged`
//!   and subscriptions are not offered (the folder is not watched);
//! - the output store's entries (MCP_K8S_OUTPUTS_DIR), `job://<run id>/…`,
//!   which results link to: read in pieces, never listed (each URI holds
//!   its run id, a capability), described by `resources/templates/list`.
//!
//! Knows the JSON-RPC shapes only; which files are snippets, and their
//! bounds, is `tools::snippets`'s; what a stored output's read answers,
//! `tools::links`'s.

use std::path::Path;

use serde_json::{Map, Value, json};

use super::jsonrpc::{ErrorCode, ResponseError};
use crate::callers::Caller;
use crate::config::Config;
use crate::tools::snippets::{self, Entry};
use crate::tools::{Ctx, links};

/// Methods this module answers.
pub const METHODS: [&str; 3] = ["resources/list", "resources/read", "resources/templates/list"];

/// Whether the server offers resources at all: a snippets folder, or an
/// output store.
pub fn offered(config: &Config) -> bool {
    config.snippets_dir.is_some() || config.outputs.is_some()
}

/// Whether a request reads a stored output: its answer is one caller's,
/// never to be shared by a cache.
pub fn is_private(params: &Map<String, Value>) -> bool {
    params.get("uri").and_then(Value::as_str).is_some_and(links::is_ours)
}

/// Answers one of `METHODS`.
/// A stored output is read only by the caller whose run made it.
pub fn handle(method: &str, ctx: &Ctx, caller: &Caller, params: &Map<String, Value>) -> Result<Value, ResponseError> {
    let config = &ctx.config;
    let dir = config.snippets_dir.as_deref();
    match method {
        "resources/list" => match dir {
            Some(dir) => list(dir, config, params),
            None => Ok(json!({ "resources": [] })),
        },
        "resources/read" => {
            let uri = uri_param(params)?;
            match dir {
                _ if links::is_ours(uri) => read_output(ctx, caller, uri),
                Some(dir) => read(dir, config, uri),
                None => read_missing(uri),
            }
        }
        // Every snippet is listed by its own URI; stored outputs have
        // templates.
        _ => Ok(json!({ "resourceTemplates": if config.outputs.is_some() { links::templates() } else { json!([]) } })),
    }
}

/// A turn for a `resources/read` of a stored output, held by the caller
/// until its answer is sent (`links::piece_turn`); `None` for any other
/// request, which holds nothing large.
pub fn piece_turn(method: &str, params: &Map<String, Value>) -> Option<links::PieceTurn> {
    let uri = params.get("uri").and_then(Value::as_str)?;
    (method == "resources/read" && links::is_ours(uri)).then(links::piece_turn)
}

fn read_output(ctx: &Ctx, caller: &Caller, uri: &str) -> Result<Value, ResponseError> {
    match links::read(ctx, caller, uri) {
        Ok(content) => Ok(json!({ "contents": [content] })),
        Err(links::ReadFailure::NotFound(message)) => Err(ResponseError::new(ErrorCode::ResourceNotFound, message)),
        Err(links::ReadFailure::Invalid(message)) => Err(ResponseError::new(ErrorCode::InvalidParams, message)),
        Err(links::ReadFailure::Internal(message)) => Err(ResponseError::new(ErrorCode::InternalError, message)),
    }
}

/// The `uri` of a `resources/read`: a string, or the params are wrong
/// whatever resources the server has.
fn uri_param(params: &Map<String, Value>) -> Result<&str, ResponseError> {
    match params.get("uri") {
        Some(Value::String(uri)) => Ok(uri),
        Some(_) => Err(ResponseError::new(ErrorCode::InvalidParams, "`uri` must be a string")),
        None => Err(ResponseError::new(ErrorCode::InvalidParams, "missing `uri`")),
    }
}

/// A read of anything but a stored output on a server without snippets.
fn read_missing(uri: &str) -> Result<Value, ResponseError> {
    Err(ResponseError::new(
        ErrorCode::ResourceNotFound,
        format!(
            "resource not found: `{}`; resources here are {}<run id>/…, which results link to",
            crate::echo::shorten(uri),
            links::SCHEME
        ),
    ))
}

fn list(dir: &Path, config: &Config, params: &Map<String, Value>) -> Result<Value, ResponseError> {
    // One page: the folder is bounded (snippets::MAX_SNIPPET_FILES).
    if let Some(cursor) = params.get("cursor").filter(|cursor| !cursor.is_null()) {
        return Err(ResponseError::new(
            ErrorCode::InvalidParams,
            format!("unknown cursor {}; resources/list has a single page", crate::echo::shorten(&cursor.to_string())),
        ));
    }
    let entries =
        snippets::list(dir, &config.languages).map_err(|error| ResponseError::new(ErrorCode::InternalError, error.to_string()))?;
    let resources: Vec<Value> = entries.iter().map(resource_json).collect();
    Ok(json!({ "resources": resources }))
}

fn read(dir: &Path, config: &Config, uri: &str) -> Result<Value, ResponseError> {
    let not_found = |why: String| ResponseError::new(ErrorCode::ResourceNotFound, why);
    let Some(name) = uri.strip_prefix(snippets::URI_PREFIX) else {
        return Err(not_found(format!(
            "resource not found: `{}`; resources here are {}<name>",
            crate::echo::shorten(uri),
            snippets::URI_PREFIX
        )));
    };
    match snippets::read(dir, &config.languages, name) {
        Ok((entry, source)) => Ok(json!({ "contents": [{ "uri": entry.uri(), "mimeType": entry.mime_type(), "text": source }] })),
        Err(error @ (snippets::Error::Unknown { .. } | snippets::Error::BadName { .. })) => {
            Err(not_found(format!("resource not found: {error}")))
        }
        // The file is there but unusable as it is: the operator's to fix,
        // so the caller is told why, not that the server failed.
        Err(error) if error.is_the_files() => Err(ResponseError::new(ErrorCode::InvalidParams, error.to_string())),
        Err(error) => Err(ResponseError::new(ErrorCode::InternalError, error.to_string())),
    }
}

fn resource_json(entry: &Entry) -> Value {
    let description = match &entry.language {
        Some(language) => format!("{language} snippet; run it with execute_code {{\"snippet_name\": \"{}\"}}", entry.name),
        None if entry.extension.is_empty() => "no extension, so no language profile claims it and execute_code cannot run it".to_string(),
        None => format!("no language profile claims `.{}`, so execute_code cannot run it", entry.extension),
    };
    json!({
        "uri": entry.uri(),
        "name": entry.name,
        "description": description,
        "mimeType": entry.mime_type(),
        "size": entry.size,
    })
}
