//! MCP resources (server feature `resources`): the snippets folder's files
//! as `snippet://<name>` resources, so clients can list and show them
//!. Declared in `initialize` only when MCP_K8S_SNIPPETS_DIR is
//! set. The folder is read at each request, so the list is always current;
//! `listChanged` and subscriptions are not offered (the folder is not
//! watched).
//!
//! Knows the JSON-RPC shapes only; which files are snippets, and their
//! bounds, is `tools::snippets`'s.

use std::path::Path;

use serde_json::{Map, Value, json};

use super::jsonrpc::{ErrorCode, ResponseError};
use crate::config::Config;
use crate::tools::snippets::{self, Entry};

/// Methods this module answers.
pub const METHODS: [&str; 3] = ["resources/list", "resources/read", "resources/templates/list"];

/// Answers one of `METHODS` from the snippets folder `dir`.
pub fn handle(method: &str, dir: &Path, config: &Config, params: &Map<String, Value>) -> Result<Value, ResponseError> {
    match method {
        "resources/list" => list(dir, config, params),
        "resources/read" => read(dir, config, params),
        // Every snippet is listed by its own URI: there are no templates.
        _ => Ok(json!({ "resourceTemplates": [] })),
    }
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

fn read(dir: &Path, config: &Config, params: &Map<String, Value>) -> Result<Value, ResponseError> {
    let uri = match params.get("uri") {
        Some(Value::String(uri)) => uri,
        Some(_) => return Err(ResponseError::new(ErrorCode::InvalidParams, "`uri` must be a string")),
        None => return Err(ResponseError::new(ErrorCode::InvalidParams, "missing `uri`")),
    };
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
