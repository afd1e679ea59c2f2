//! MCP tasks (revision 2025-11-25, experimental; `basic/utilities/tasks`):
//! the JSON shapes of `tools/call` with `params.task`, `tasks/get`,
//! `tasks/result`, `tasks/list` and `tasks/cancel`. Each runs on a call
//! thread like a tool (they may wait on the cluster) and maps onto the
//! background job machinery through `tools::background`, so a task id is a
//! job token. Knows the wire shapes only; what a task is lives below.

use std::time::SystemTime;

use serde_json::{Map, Value, json};

use super::jsonrpc::{ErrorCode, ResponseError};
use crate::tools::background::{self, CallError, TaskStart, TaskState, TaskStatus};
use crate::tools::{self, Call};

/// Methods this module answers.
pub const METHODS: [&str; 4] = ["tasks/get", "tasks/result", "tasks/list", "tasks/cancel"];

/// How often a client should poll `tasks/get`, in milliseconds.
pub(super) const POLL_INTERVAL_MS: u64 = 2000;

/// A handler for a request answered with a plain JSON-RPC result.
pub type RawHandler = fn(&tools::Ctx, &Call<'_>) -> Result<Value, ResponseError>;

/// The `capabilities.tasks` of `initialize`.
pub fn capability() -> Value {
    json!({ "list": {}, "cancel": {}, "requests": { "tools": { "call": {} } } })
}

/// The handler for a `tasks/*` method, with the method's name.
pub fn handler(method: &str) -> Option<(&'static str, RawHandler)> {
    let handler: RawHandler = match method {
        "tasks/get" => get,
        "tasks/result" => result,
        "tasks/list" => list,
        "tasks/cancel" => cancel,
        _ => return None,
    };
    METHODS.into_iter().find(|name| *name == method).map(|name| (name, handler))
}

/// `tools/call` with `params.task`: starts the run and answers with the
/// task at once (`CreateTaskResult`). `call.arguments` is the whole
/// `params`; the tool was found and allows tasks.
pub fn create(ctx: &tools::Ctx, call: &Call<'_>) -> Result<Value, ResponseError> {
    let name = call.arguments.get("name").and_then(Value::as_str).unwrap_or_default();
    let empty = Map::new();
    let arguments = call.arguments.get("arguments").and_then(Value::as_object).unwrap_or(&empty);
    let task_id = match background::task_submit(ctx, call.caller, name, arguments, call.trace).map_err(response_error)? {
        TaskStart::Task(task_id) => task_id,
        // A receiver may answer a task-augmented request as a plain one;
        // here there is no run to make a task of.
        TaskStart::Answered(outcome) => return Ok(tools::result_json(outcome)),
    };
    let now = SystemTime::now();
    let state = TaskState { task_id, status: TaskStatus::Working, message: None, created: now, updated: now };
    Ok(json!({ "task": task_json(ctx, &state) }))
}

fn get(ctx: &tools::Ctx, call: &Call<'_>) -> Result<Value, ResponseError> {
    let task_id = task_id(call)?;
    background::task_status(ctx, call.caller, task_id).map(|state| task_json(ctx, &state)).map_err(response_error)
}

/// Blocks until the task ends, then answers exactly what the tool call
/// would have, tagged with the task it belongs to.
fn result(ctx: &tools::Ctx, call: &Call<'_>) -> Result<Value, ResponseError> {
    let task_id = task_id(call)?;
    let outcome = background::task_result(ctx, call.caller, task_id, call.cancel).map_err(response_error)?;
    let mut result = tools::result_json(outcome);
    result["_meta"] = json!({ "io.modelcontextprotocol/related-task": { "taskId": task_id } });
    Ok(result)
}

fn list(ctx: &tools::Ctx, call: &Call<'_>) -> Result<Value, ResponseError> {
    // Every task fits on one page, so no cursor was ever handed out.
    if let Some(cursor) = call.arguments.get("cursor").filter(|cursor| !cursor.is_null()) {
        return Err(invalid_params(format!("unknown cursor {}; tasks/list has a single page", crate::echo::shorten(&cursor.to_string()))));
    }
    let states = background::task_list(ctx, call.caller).map_err(response_error)?;
    let tasks: Vec<Value> = states.iter().map(|state| task_json(ctx, state)).collect();
    Ok(json!({ "tasks": tasks }))
}

fn cancel(ctx: &tools::Ctx, call: &Call<'_>) -> Result<Value, ResponseError> {
    let task_id = task_id(call)?;
    background::task_cancel(ctx, call.caller, task_id).map(|state| task_json(ctx, &state)).map_err(response_error)
}

/// The two eras name a task's durations differently; the rest is shared.
pub(super) struct DurationKeys {
    ttl: &'static str,
    poll_interval: &'static str,
}

/// 2025-11-25's `Task`.
const LEGACY_KEYS: DurationKeys = DurationKeys { ttl: "ttl", poll_interval: "pollInterval" };
/// The 2026-07-28 tasks extension's.
pub(super) const EXTENSION_KEYS: DurationKeys = DurationKeys { ttl: "ttlMs", poll_interval: "pollIntervalMs" };

fn task_json(ctx: &tools::Ctx, state: &TaskState) -> Value {
    task_json_with(ctx, state, &LEGACY_KEYS)
}

/// A task's wire fields, durations named by `keys`.
pub(super) fn task_json_with(ctx: &tools::Ctx, state: &TaskState, keys: &DurationKeys) -> Value {
    let mut task = json!({
        "taskId": state.task_id,
        "status": status_name(state.status),
        "createdAt": crate::log::rfc3339_utc(state.created),
        "lastUpdatedAt": crate::log::rfc3339_utc(state.updated),
    });
    task[keys.ttl] = json!(ctx.config.result_ttl_s * 1000);
    task[keys.poll_interval] = json!(POLL_INTERVAL_MS);
    if let Some(message) = &state.message {
        task["statusMessage"] = json!(message);
    }
    task
}

/// The wire name of a task's status, in both eras.
pub(super) fn status_name(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Working => "working",
        TaskStatus::Completed => "completed",
        TaskStatus::Cancelled => "cancelled",
    }
}

pub(super) fn task_id<'a>(call: &'a Call<'_>) -> Result<&'a str, ResponseError> {
    match call.arguments.get("taskId") {
        Some(Value::String(task_id)) => Ok(task_id),
        Some(other) => Err(invalid_params(format!("`taskId` must be a string, not {}", crate::json::json_kind(other)))),
        None => Err(invalid_params("missing `taskId`")),
    }
}

/// -32602 only for what the caller must change; an unreachable cluster or
/// a full server is -32603.
pub(super) fn response_error(error: CallError) -> ResponseError {
    match error {
        CallError::Invalid(message) => invalid_params(message),
        CallError::Unavailable(message) => ResponseError::new(ErrorCode::InternalError, message),
    }
}

fn invalid_params(message: impl Into<String>) -> ResponseError {
    ResponseError::new(ErrorCode::InvalidParams, message)
}
