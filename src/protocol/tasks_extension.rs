//! Tasks as the `io.modelcontextprotocol/tasks` extension (revision
//! 2026-07-28, SEP-2663): a long `tools/call` answers `resultType:"task"`
//! with the task's fields flat (`ttlMs`, `pollIntervalMs`); `tasks/get`
//! answers the task with the tool's result inlined once it completed (an
//! `isError` result is still `completed`); `tasks/cancel` answers an empty
//! result and the next `tasks/get` shows `cancelled`; `tasks/update` is
//! refused, since no product task asks for input (the conformance
//! fixtures' tasks that do are `fixtures::tasks`'). There is no
//! `tasks/result` and no `tasks/list` in this era.
//!
//! Backed by the same background runs as `submit_job` and the 2025-11-25
//! tasks (`tools::background`), so any replica answers any task and a
//! restart loses nothing. Knows the wire shapes only.

use std::time::SystemTime;

use serde_json::{Map, Value, json};

use super::jsonrpc::ResponseError;
use super::tasks::{EXTENSION_KEYS, RawHandler, response_error, task_id, task_json_with};
use crate::tools::background::{self, TaskStart, TaskState, TaskStatus};
use crate::tools::{self, Call};

/// The handler for an extension method, with the method's name.
pub fn handler(method: &str) -> Option<(&'static str, RawHandler)> {
    match method {
        "tasks/get" => Some(("tasks/get", get)),
        "tasks/cancel" => Some(("tasks/cancel", cancel)),
        "tasks/update" => Some(("tasks/update", update)),
        _ => None,
    }
}

/// `tools/call` that the server chose to run as a task: starts the run and
/// answers the task at once. `call.arguments` is the whole `params`; the
/// tool was found and runs as a task.
pub fn create(ctx: &tools::Ctx, call: &Call<'_>) -> Result<Value, ResponseError> {
    let name = call.arguments.get("name").and_then(Value::as_str).unwrap_or_default();
    let empty = Map::new();
    let arguments = call.arguments.get("arguments").and_then(Value::as_object).unwrap_or(&empty);
    let task_id = match background::task_submit(ctx, call.caller, name, arguments, call.trace).map_err(response_error)? {
        TaskStart::Task(task_id) => task_id,
        // No run to make a task of: the answer is the tool's result, complete.
        TaskStart::Answered(outcome) => return Ok(super::complete(tools::result_json(outcome))),
    };
    let now = SystemTime::now();
    let state = TaskState { task_id, status: TaskStatus::Working, message: None, created: now, updated: now };
    Ok(created(ctx, &state))
}

/// The `CreateTaskResult` of a task just made.
pub(super) fn created(ctx: &tools::Ctx, state: &TaskState) -> Value {
    let mut task = task_json(ctx, state);
    task["resultType"] = json!("task");
    task
}

fn get(ctx: &tools::Ctx, call: &Call<'_>) -> Result<Value, ResponseError> {
    detailed(ctx, call.caller, call.cancel, task_id(call)?)
}

/// The `DetailedTask`: a completed one carries the tool result, without
/// the 2025-11-25 `related-task` `_meta` (the task id is already here).
pub(super) fn detailed(
    ctx: &tools::Ctx,
    caller: &crate::callers::Caller,
    stop: &crate::cancel::CancelToken,
    task_id: &str,
) -> Result<Value, ResponseError> {
    let state = background::task_status(ctx, caller, task_id).map_err(response_error)?;
    let mut task = task_json(ctx, &state);
    if state.status == TaskStatus::Completed {
        // Terminal, so this reads the recorded outcome without waiting.
        let outcome = background::task_result(ctx, caller, task_id, stop).map_err(response_error)?;
        task["result"] = super::complete(tools::result_json(outcome));
    }
    Ok(task)
}

/// Cooperative cancel: an empty acknowledgement, also for a task that has
/// already ended (only an unknown id is -32602).
fn cancel(ctx: &tools::Ctx, call: &Call<'_>) -> Result<Value, ResponseError> {
    let task_id = task_id(call)?;
    let state = background::task_status(ctx, call.caller, task_id).map_err(response_error)?;
    if state.status == TaskStatus::Working {
        background::task_cancel(ctx, call.caller, task_id).map_err(response_error)?;
    }
    Ok(json!({}))
}

/// `tasks/update` answers a task's `inputRequests`; this server's tasks
/// never ask for input (`input_required` never happens), so a known task
/// refuses it and an unknown one is -32602 like everywhere else.
fn update(ctx: &tools::Ctx, call: &Call<'_>) -> Result<Value, ResponseError> {
    let task_id = task_id(call)?;
    background::task_status(ctx, call.caller, task_id).map_err(response_error)?;
    Err(super::invalid_params(format!(
        "task `{}` is not waiting for input; this server's tasks never ask for any",
        crate::echo::shorten(task_id)
    )))
}

/// A task's wire fields in this era.
pub(super) fn task_json(ctx: &tools::Ctx, state: &TaskState) -> Value {
    task_json_with(ctx, state, &EXTENSION_KEYS)
}
