//! The background job tools: `submit_job`, `fetch_job`,
//! `cancel_job` and `list_jobs`, plus the task operations the protocol
//! layer maps MCP tasks onto, so a task and a `job_token` are two views of
//! one run. Arguments are checked here (`submit_job` and a task's by the
//! same one parse as `run_job`'s, `call_args`, before anything is
//! created); the runs themselves are `engine::background`'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value, json};

use crate::callers::Caller;
use crate::cancel::CancelToken;
use crate::engine;
use crate::engine::background::{self, Listed, Submitted, TokenKind};
use crate::engine::port::jobs::{Phase, View};
use crate::engine::port::spec::RunStatus;
use crate::engine::run::Progress;
use crate::engine::run::collect::LiveChunk;
use crate::engine::run::slots::Gate;
use crate::tools::call_args::{self, CallArgsError, RunCall, RunTool};
use crate::tools::{Annotations, Call, Ctx, Tool, ToolOutcome, check_known_arguments, execute_code, job_result, run_job};

/// Longest `fetch_job` long-poll: clients give up on calls after about a
/// minute or two, and a poll loop is cheap.
const MAX_WAIT_S: u64 = 120;

/// Tools that may be called as MCP tasks (`execution.taskSupport`).
pub const TASK_TOOLS: &[&str] = &["run_job", execute_code::NAME];

/// The tool that starts a run in the background; a caller needs it for
/// tasks too (a task is a background run).
pub const SUBMIT_JOB: &str = "submit_job";

/// The four tools, in `tools/list` order.
pub fn tools(config: &crate::config::Config) -> Vec<Tool> {
    vec![submit_job_tool(config), fetch_job_tool(), cancel_job_tool(), list_jobs_tool()]
}

/// A task's state, as `tasks/get` and `tasks/list` report it.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskState {
    pub task_id: String,
    pub status: TaskStatus,
    pub message: Option<String>,
    pub created: SystemTime,
    pub updated: SystemTime,
}

/// MCP task statuses this server uses (`input_required` never happens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskStatus {
    Working,
    Completed,
    Cancelled,
}

/// Why a job or task operation failed, by whose move it is (once, a
/// cluster outage or a full queue was answered as "invalid
/// params"). The protocol layer answers `Invalid` with -32602 and
/// `Unavailable` with -32603; tools put either into a tool error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallError {
    /// The caller must change the request: a token that names no job,
    /// bad arguments, a job that already finished.
    Invalid(String),
    /// The request was fine; the server or the cluster could not serve it
    /// now (no cluster, API failure, too many jobs). Retrying may work.
    Unavailable(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Invalid(message) | CallError::Unavailable(message) => formatter.write_str(message),
        }
    }
}

impl From<background::Error> for CallError {
    fn from(error: background::Error) -> CallError {
        match error {
            background::Error::Unknown { token } => CallError::Invalid(no_such_job(&token)),
            // The engine says "expired" also for a well-formed token whose
            // Job it cannot find and whose time is past the retention: it
            // may as well never have existed.
            background::Error::Expired { token, result_ttl_s } => CallError::Invalid(format!(
                "no such job: `{}` has expired and was removed, or never existed here (results are kept {result_ttl_s} s after a job ends, MCP_K8S_RESULT_TTL_S); submit the job again, or find a live one with list_jobs",
                crate::echo::shorten(&token)
            )),
            background::Error::AlreadyFinished { token } => {
                CallError::Invalid(format!("job `{token}` has already finished; fetch_job returns its result"))
            }
            error @ (background::Error::KeyReused { .. } | background::Error::SandboxClosed { .. }) => {
                CallError::Invalid(error.to_string())
            }
            error @ (background::Error::Full { .. } | background::Error::Refused { .. } | background::Error::Api { .. }) => {
                CallError::Unavailable(error.to_string())
            }
        }
    }
}

/// How a task-augmented call started.
#[derive(Debug)]
pub enum TaskStart {
    /// The run is under way; the task id is the job token.
    Task(String),
    /// The cluster refused the run before it existed: the call's answer is
    /// the tool's own result for it (status `error`, the refusal's reason),
    /// exactly what the call without a task returns, never a protocol error.
    Answered(ToolOutcome),
}

/// Background runs being started at once (their arguments checked, their
/// objects created), over every caller. A start holds its parsed
/// arguments, the objects being built and the connections creating them;
/// 2,000 task-augmented calls at once, 256 of them in flight, peaked at
/// 146 MB before and at 26 MB with this. Starts are short: the rest wait.
static STARTING: Gate = Gate::new(8);

/// Starts `tool_name` as a task.
/// `traced`: the call's span, which the run's spans go under.
pub fn task_submit(
    ctx: &Ctx,
    caller: &Caller,
    tool_name: &str,
    arguments: &Map<String, Value>,
    traced: Option<crate::trace::SpanContext>,
) -> Result<TaskStart, CallError> {
    let _starting = STARTING.enter();
    if !TASK_TOOLS.contains(&tool_name) {
        return Err(CallError::Invalid(format!("tool `{tool_name}` cannot run as a task; tasks: {}", TASK_TOOLS.join(", "))));
    }
    let tool = if tool_name == execute_code::NAME { RunTool::ExecuteCode(execute_code::parse_execute_args) } else { RunTool::RunJob };
    let mut run_call = match call_args::parse(ctx, caller, tool, arguments) {
        Ok(run_call) => run_call,
        Err(CallArgsError::Refused(refused)) => {
            let outcome = refused.outcome(&engine::run::new_run_id());
            let answer = if tool_name == execute_code::NAME { execute_code::outcome(&outcome) } else { run_job_outcome(&outcome) };
            return Ok(TaskStart::Answered(answer));
        }
        Err(error) => return Err(error.into()),
    };
    // A refusal is the tool's own error, as the call without a task gets.
    let admitted = match ctx.admit(caller, run_call.site, &mut run_call.spec) {
        Ok(admitted) => admitted,
        Err(message) => return Ok(TaskStart::Answered(ToolOutcome::Failure(message))),
    };
    let arrived = std::time::Instant::now();
    let submitted = start(&run_call, traced, Some(admitted.on_end()));
    super::audit_submit(caller, run_call.site, tool_name, &run_call.spec, &submitted, arrived);
    match submitted {
        Ok(submitted) => Ok(TaskStart::Task(submitted.token)),
        Err(background::Error::Refused { outcome }) if tool_name == execute_code::NAME => {
            Ok(TaskStart::Answered(execute_code::outcome(&outcome)))
        }
        Err(background::Error::Refused { outcome }) => Ok(TaskStart::Answered(run_job_outcome(&outcome))),
        Err(error) => Err(error.into()),
    }
}

pub fn task_status(ctx: &Ctx, caller: &Caller, task_id: &str) -> Result<TaskState, CallError> {
    let engine = engine_for_token(ctx, task_id)?;
    let view = background::status(engine, task_id, caller.owner())?;
    Ok(task_state(&view))
}

/// Waits until the task ends (or `stop`), then returns exactly what
/// `run_job` would have.
pub fn task_result(ctx: &Ctx, caller: &Caller, task_id: &str, stop: &CancelToken) -> Result<ToolOutcome, CallError> {
    let engine = engine_for_token(ctx, task_id)?;
    loop {
        let wait = Duration::from_secs(MAX_WAIT_S);
        let view = background::fetch(engine, task_id, caller.owner(), wait, stop, &mut |_, _| {})?;
        if let Some(outcome) = &view.outcome {
            if background::parse_token(task_id).is_some_and(|token| token.kind == TokenKind::Code) {
                return Ok(execute_code::outcome(outcome));
            }
            return Ok(run_job_outcome(outcome));
        }
        if stop.is_cancelled() {
            return Err(CallError::Unavailable(format!("the wait for task `{task_id}` was cancelled; the task goes on")));
        }
    }
}

pub fn task_list(ctx: &Ctx, caller: &Caller) -> Result<Vec<TaskState>, CallError> {
    let (listed, _) = list_everywhere(ctx, caller)?;
    Ok(listed.iter().map(|(_, run)| listed_task_state(run)).collect())
}

pub fn task_cancel(ctx: &Ctx, caller: &Caller, task_id: &str) -> Result<TaskState, CallError> {
    let engine = engine_for_token(ctx, task_id)?;
    let view = background::cancel(engine, task_id, caller.owner())?;
    let mut state = task_state(&view);
    // The spec answers a cancel with the task as `cancelled`, even while
    // the runner's last report is still on its way.
    state.status = TaskStatus::Cancelled;
    Ok(state)
}

// ---------------------------------------------------------------------------
// submit_job

fn submit_job_tool(config: &crate::config::Config) -> Tool {
    Tool {
        name: SUBMIT_JOB,
        title: format!("Start a command in a throwaway {}, in the background", super::backend_words::runs(config).sandbox()),
        description: format!(
            "run_job in the background, for work over a minute: checks the arguments, returns a job_token at once. \
             fetch_job gives run_job's result once done (kept {} s); cancel_job stops it; list_jobs finds lost tokens. {}",
            config.result_ttl_s,
            super::answer::RULE
        ),
        input_schema: run_job::run_job_schema(config),
        output_schema: json!({
            "type": "object",
            "required": ["job_token", "status"],
            "properties": {
                "job_token": {"type": "string", "description": "pass to fetch_job or cancel_job"},
                "status": {"type": "string", "enum": ["submitted"]},
            },
        }),
        annotations: Annotations { read_only: false, destructive: false, idempotent: false, open_world: true },
        handler: submit_job,
    }
}

fn submit_job(ctx: &Ctx, call: &Call<'_>) -> ToolOutcome {
    match submit(ctx, call) {
        Ok(submitted) => ToolOutcome::Success(json!({"job_token": submitted.token, "status": "submitted"})),
        // As run_job answers the same refusal (a busy sandbox, a quota):
        // a result with its status, reason and message.
        Err(NotSubmitted::Refused(outcome)) => {
            ToolOutcome::SuccessWithContent { structured: job_result::outcome_json(&outcome), extra_content: Vec::new() }
        }
        Err(NotSubmitted::Call(error)) => ToolOutcome::Failure(error.to_string()),
    }
}

/// Why submit_job started nothing: refused by the sandbox or the cluster
/// before the run existed, or a call the caller must change or retry.
enum NotSubmitted {
    Refused(Box<crate::engine::port::spec::RunOutcome>),
    Call(CallError),
}

impl From<CallError> for NotSubmitted {
    fn from(error: CallError) -> NotSubmitted {
        NotSubmitted::Call(error)
    }
}

impl From<background::Error> for NotSubmitted {
    fn from(error: background::Error) -> NotSubmitted {
        match error {
            background::Error::Refused { outcome } => NotSubmitted::Refused(outcome),
            error => NotSubmitted::Call(error.into()),
        }
    }
}

fn submit(ctx: &Ctx, call: &Call<'_>) -> Result<Submitted, NotSubmitted> {
    let _starting = STARTING.enter();
    let mut run_call = match call_args::parse(ctx, call.caller, RunTool::SubmitJob, call.arguments) {
        Ok(run_call) => run_call,
        Err(CallArgsError::Refused(refused)) => {
            return Err(NotSubmitted::Refused(Box::new(refused.outcome(&engine::run::new_run_id()))));
        }
        Err(error) => return Err(CallError::from(error).into()),
    };
    let admitted = ctx.admit(call.caller, run_call.site, &mut run_call.spec).map_err(CallError::Unavailable)?;
    let arrived = std::time::Instant::now();
    let submitted = start(&run_call, call.trace, Some(admitted.on_end()));
    super::audit_submit(call.caller, run_call.site, SUBMIT_JOB, &run_call.spec, &submitted, arrived);
    Ok(submitted?)
}

/// Starts a call's background run: a call in the open sandbox named, or
/// a run of its own (the key's, with one).
/// `traced`: the call's span, which the run's spans go under.
fn start(
    run_call: &RunCall<'_>,
    traced: Option<crate::trace::SpanContext>,
    on_end: Option<engine::port::jobs::OnEnd>,
) -> Result<Submitted, background::Error> {
    let RunCall { tool, spec, engine, sandbox, keyed, .. } = run_call;
    match sandbox {
        Some(sandbox) => background::submit_call(engine, sandbox, spec, tool.token_kind(), on_end),
        None => background::submit(engine, spec, tool.token_kind(), keyed.as_ref(), traced, on_end),
    }
}

/// A run call's arguments that make no run (a sandbox's refusal aside,
/// which is answered as a result): the caller's to fix, or the server's.
impl From<CallArgsError> for CallError {
    fn from(error: CallArgsError) -> CallError {
        match error {
            CallArgsError::Invalid(why) => CallError::Invalid(why),
            CallArgsError::Unavailable(why) => CallError::Unavailable(why),
            CallArgsError::Refused(refused) => CallError::Unavailable(refused.message),
        }
    }
}

// ---------------------------------------------------------------------------
// fetch_job

fn fetch_job_tool() -> Tool {
    Tool {
        name: "fetch_job",
        title: "Get the state or result of a background job".to_string(),
        description: format!(
            "A job_token's state: `running` (phase, output so far) or `done` with run_job's `result`. wait_s (up to \
             {MAX_WAIT_S}) waits for the end: keep it below your client's timeout (60 s in the TypeScript SDK). An \
             unknown or expired token is a tool error."
        ),
        input_schema: token_schema(true),
        output_schema: view_schema(),
        annotations: Annotations { read_only: true, destructive: false, idempotent: true, open_world: true },
        handler: fetch_job,
    }
}

fn fetch_job(ctx: &Ctx, call: &Call<'_>) -> ToolOutcome {
    let checked = check_known_arguments(call.arguments, &["job_token", "wait_s"])
        .and_then(|()| crate::tools::optional_integer(call.arguments, "wait_s", 0, MAX_WAIT_S));
    let wait_s = match checked {
        Ok(wait_s) => wait_s.unwrap_or(0),
        Err(error) => return ToolOutcome::Failure(error.to_string()),
    };
    let (token, engine) = match token_and_engine(ctx, call) {
        Ok(found) => found,
        Err(error) => return ToolOutcome::Failure(error.to_string()),
    };
    let steps = AtomicU64::new(0);
    let mut on_output = |stream, bytes: &[u8]| {
        let step = steps.fetch_add(1, Ordering::Relaxed) + 1;
        let message = run_job::progress_message(&Progress::Output(LiveChunk { stream, bytes: bytes.to_vec() }));
        call.events.progress(step as f64, None, Some(&message));
    };
    match background::fetch(engine, token, call.caller.owner(), Duration::from_secs(wait_s), call.cancel, &mut on_output) {
        Ok(view) => view_outcome(&view),
        Err(error) => ToolOutcome::Failure(CallError::from(error).to_string()),
    }
}

// ---------------------------------------------------------------------------
// cancel_job

fn cancel_job_tool() -> Tool {
    Tool {
        name: "cancel_job",
        title: "Stop a background job".to_string(),
        description: "Stops a background job at once; answers like fetch_job (`cancel_requested: true`), and fetch_job \
                      then returns its `cancelled` result with the output so far. A finished job cannot be cancelled."
            .to_string(),
        input_schema: token_schema(false),
        output_schema: view_schema(),
        annotations: Annotations { read_only: false, destructive: true, idempotent: true, open_world: true },
        handler: cancel_job,
    }
}

fn cancel_job(ctx: &Ctx, call: &Call<'_>) -> ToolOutcome {
    if let Err(error) = check_known_arguments(call.arguments, &["job_token"]) {
        return ToolOutcome::Failure(error.to_string());
    }
    let (token, engine) = match token_and_engine(ctx, call) {
        Ok(found) => found,
        Err(error) => return ToolOutcome::Failure(error.to_string()),
    };
    match background::cancel(engine, token, call.caller.owner()) {
        Ok(view) => view_outcome(&view),
        Err(error) => ToolOutcome::Failure(CallError::from(error).to_string()),
    }
}

// ---------------------------------------------------------------------------
// list_jobs

fn list_jobs_tool() -> Tool {
    Tool {
        name: "list_jobs",
        title: "List background jobs".to_string(),
        description: "Your background jobs not yet expired, newest first, with job_token and status: finds a lost token.".to_string(),
        input_schema: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        output_schema: json!({
            "type": "object",
            "required": ["jobs"],
            "properties": {"jobs": {"type": "array", "items": {
                "type": "object",
                "description": "job_token, status (running|done), phase, result_status, cancelled, command, created_at, expires_at",
            }}},
        }),
        annotations: Annotations { read_only: true, destructive: false, idempotent: true, open_world: true },
        handler: list_jobs,
    }
}

fn list_jobs(ctx: &Ctx, call: &Call<'_>) -> ToolOutcome {
    if let Err(error) = check_known_arguments(call.arguments, &[]) {
        return ToolOutcome::Failure(error.to_string());
    }
    match list_everywhere(ctx, call.caller) {
        Ok((listed, unreachable)) => {
            let jobs: Vec<Value> = listed
                .iter()
                .map(|(site, run)| {
                    let mut job = listed_json(run);
                    if ctx.named_sites {
                        job["site"] = json!(site);
                    }
                    job
                })
                .collect();
            let mut answer = json!({ "jobs": jobs });
            if !unreachable.is_empty() {
                answer["unreachable_sites"] = json!(unreachable);
            }
            ToolOutcome::Success(answer)
        }
        Err(error) => ToolOutcome::Failure(error.to_string()),
    }
}

fn listed_json(listed: &Listed) -> Value {
    json!({
        "job_token": listed.token,
        "status": if listed.phase == Phase::Finished { "done" } else { "running" },
        "phase": phase_name(listed.phase),
        "result_status": listed.result_status.map(job_result::status_name),
        "cancelled": listed.cancelled,
        "command": listed.command,
        "created_at": listed.created.map(crate::log::rfc3339_utc),
        "expires_at": listed.expires_at,
    })
}

// ---------------------------------------------------------------------------
// Shared shapes.

/// `fetch_job` and `cancel_job` answers: `running` with the output so far,
/// or `done` with run_job's result (and its picture blocks).
fn view_outcome(view: &View) -> ToolOutcome {
    let Some(outcome) = &view.outcome else {
        return ToolOutcome::Success(json!({
            "job_token": view.token,
            "status": "running",
            "phase": phase_name(view.phase),
            "stdout": String::from_utf8_lossy(&view.stdout),
            "stderr": String::from_utf8_lossy(&view.stderr),
            "stdout_seen_bytes": view.stdout_seen,
            "stderr_seen_bytes": view.stderr_seen,
            "cancel_requested": view.cancel_requested,
        }));
    };
    ToolOutcome::SuccessWithContent {
        structured: json!({
            "job_token": view.token,
            "status": "done",
            "phase": phase_name(view.phase),
            "result": job_result::outcome_json(outcome),
        }),
        extra_content: job_result::content_blocks(outcome),
    }
}

fn run_job_outcome(outcome: &engine::port::spec::RunOutcome) -> ToolOutcome {
    ToolOutcome::SuccessWithContent { structured: job_result::outcome_json(outcome), extra_content: job_result::content_blocks(outcome) }
}

fn view_schema() -> Value {
    let integer = json!({"type": "integer"});
    json!({
        "type": "object",
        "required": ["job_token", "status", "phase"],
        "properties": {
            "job_token": {"type": "string"},
            "status": {"type": "string", "enum": ["running", "done"]},
            "phase": {"type": "string", "enum": ["pending", "running", "finished"]},
            "stdout": {"type": "string", "description": "the last 64 KiB"},
            "stderr": {"type": "string"},
            "stdout_seen_bytes": integer,
            "stderr_seen_bytes": integer,
            "cancel_requested": {"type": "boolean"},
            // run_job's outputSchema, not repeated here: it is in the list
            // once already, and every copy is paid in the agent's context.
            "result": {"type": "object", "description": "when done: run_job's result"},
        },
    })
}

fn token_schema(with_wait: bool) -> Value {
    let mut properties = json!({"job_token": {"type": "string"}});
    if with_wait {
        properties["wait_s"] = json!({"type": "integer", "minimum": 0, "maximum": MAX_WAIT_S, "description": "default 0: at once"});
    }
    json!({"type": "object", "required": ["job_token"], "additionalProperties": false, "properties": properties})
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Pending => "pending",
        Phase::Running => "running",
        Phase::Finished => "finished",
    }
}

fn task_state(view: &View) -> TaskState {
    let status = match view.outcome.as_ref().map(|outcome| outcome.status) {
        None => TaskStatus::Working,
        Some(RunStatus::Cancelled) => TaskStatus::Cancelled,
        Some(_) => TaskStatus::Completed,
    };
    TaskState {
        task_id: view.token.clone(),
        status,
        message: view.outcome.as_ref().map(|outcome| outcome.message.clone()),
        created: view.created,
        updated: view.updated,
    }
}

fn listed_task_state(listed: &Listed) -> TaskState {
    let status = match (listed.phase, listed.result_status) {
        (Phase::Finished, Some(RunStatus::Cancelled)) => TaskStatus::Cancelled,
        (Phase::Finished, None) if listed.cancelled => TaskStatus::Cancelled,
        (Phase::Finished, _) => TaskStatus::Completed,
        _ => TaskStatus::Working,
    };
    let created = listed.created.unwrap_or(SystemTime::UNIX_EPOCH);
    TaskState { task_id: listed.token.clone(), status, message: None, created, updated: created }
}

fn token_and_engine<'a>(ctx: &'a Ctx, call: &'a Call<'_>) -> Result<(&'a str, &'a engine::run::Ctx), CallError> {
    let token = match call.arguments.get("job_token") {
        Some(Value::String(token)) => token.as_str(),
        Some(other) => {
            return Err(CallError::Invalid(format!("argument `job_token` must be a string, not {}", crate::json::json_kind(other))));
        }
        None => return Err(CallError::Invalid("missing required argument `job_token`; submit_job returns it, list_jobs finds it".into())),
    };
    Ok((token, engine_for_token(ctx, token)?))
}

/// The engine, once `token` has the shape this server hands out: a token
/// that could never name a job is the caller's mistake, whether or not a
/// cluster is reachable.
/// The token's site (the default for a token that names none) is the
/// one asked.
fn engine_for_token<'a>(ctx: &'a Ctx, token: &str) -> Result<&'a engine::run::Ctx, CallError> {
    let Some(parsed) = background::parse_token(token) else {
        return Err(CallError::Invalid(unknown_token(token)));
    };
    // A site this server does not have: as a token that names no job.
    let Ok(site) = ctx.site(parsed.site.as_deref()) else {
        return Err(CallError::Invalid(no_such_job(token)));
    };
    site.engine.as_ref().map_err(|why| CallError::Unavailable(super::no_backend(why)))
}

fn unknown_token(token: &str) -> String {
    format!(
        "no such job: `{}` is not a job_token this server hands out; use the token submit_job returned (a task's taskId), or find it with list_jobs",
        crate::echo::shorten(token)
    )
}

/// A token of the right shape whose Job this server cannot find.
fn no_such_job(token: &str) -> String {
    format!(
        "no such job: `{}` names no job of this server: it never existed here, or it ended and was removed; find your jobs with list_jobs, or submit again",
        crate::echo::shorten(token)
    )
}

/// Runs listed with their sites, and the sites that could not answer.
type Everywhere = (Vec<(String, Listed)>, Vec<Value>);

/// The background runs `caller` may see on every site, newest first,
/// each with its site; a site that cannot answer is named in `unreachable`
/// rather than failing the others' list.
fn list_everywhere(ctx: &Ctx, caller: &Caller) -> Result<Everywhere, CallError> {
    // One site: its failure is the call's, as it always was.
    if let [site] = ctx.sites.as_slice() {
        let engine = site.engine.as_ref().map_err(|why| CallError::Unavailable(super::no_backend(why)))?;
        let listed = background::list(engine, caller.owner())?;
        return Ok((listed.into_iter().map(|run| (site.name.clone(), run)).collect(), Vec::new()));
    }
    let owner = caller.owner().map(str::to_string);
    let answers = ctx.ask_sites(LIST_WAIT, move |engine| background::list(engine, owner.as_deref()).map_err(|error| error.to_string()));
    let mut listed = Vec::new();
    let mut unreachable = Vec::new();
    for (site, answer) in ctx.sites.iter().zip(answers) {
        match answer {
            Ok(runs) => listed.extend(runs.into_iter().map(|run| (site.name.clone(), run))),
            Err(error) => unreachable.push(json!({"site": site.name, "error": error})),
        }
    }
    listed.sort_by_key(|(_, run)| std::cmp::Reverse(run.created));
    Ok((listed, unreachable))
}

/// How long a list waits for the sites: one that is down is named as
/// unreachable instead of holding the others' answer.
const LIST_WAIT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the caller's mistakes are `Invalid`.
    #[test]
    fn engine_errors_are_sorted_by_whose_move_it_is() {
        let token = "job-0123456789abcdef0123456789abcdef-1767225600".to_string();
        let cases = [
            (background::Error::Unknown { token: token.clone() }, true, "no such job: `job-0123"),
            (
                background::Error::Expired { token: token.clone(), result_ttl_s: 3600 },
                true,
                "has expired and was removed, or never existed here",
            ),
            (background::Error::AlreadyFinished { token: token.clone() }, true, "has already finished"),
            (background::Error::Full { running: 110 }, false, "110 background jobs are in flight"),
            (
                background::Error::Refused {
                    outcome: Box::new(crate::engine::port::spec::RunOutcome::without_result(
                        "r1",
                        crate::engine::port::spec::RunStatus::Error,
                        crate::engine::port::spec::RunReason::QuotaExceeded,
                        "quota".into(),
                    )),
                },
                false,
                "quota",
            ),
            (
                background::Error::Api {
                    what: "list the background Jobs",
                    kind: crate::engine::port::ErrorKind::Transient,
                    message: "connection refused".into(),
                },
                false,
                "retry shortly",
            ),
            (
                background::Error::Api {
                    what: "list the background Jobs",
                    kind: crate::engine::port::ErrorKind::Denied,
                    message: "403 Forbidden".into(),
                },
                false,
                "this is for the operator to fix",
            ),
        ];
        for (error, invalid, expected) in cases {
            let shown = format!("{error:?}");
            let call_error = CallError::from(error);
            assert_eq!(matches!(call_error, CallError::Invalid(_)), invalid, "{shown}");
            assert!(call_error.to_string().contains(expected), "{shown}: {call_error}");
        }
    }
}
