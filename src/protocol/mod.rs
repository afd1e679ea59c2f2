//! The MCP lifecycle and method dispatch, independent of any transport.
//!
//! Transports hand each incoming message (one stdio line, one HTTP body) to
//! `Server::handle` together with the `Session` it belongs to and an
//! `Outbox` for what goes back. Quick methods answer before `handle`
//! returns; `tools/call` runs on its own thread (so a long call never blocks
//! `ping`, `notifications/cancelled` or another call) and sends its
//! notifications and response through the outbox later. `jsonrpc` holds the
//! message model; this file knows the MCP methods and nothing about bytes,
//! sockets or HTTP.
//!
//! Two eras are served side by side: the `initialize` handshake
//! (revisions 2024-11-05 to 2025-11-25, this file) and the stateless
//! revision 2026-07-28 (`modern`). `era` decides which one a request
//! belongs to, in `Server::on_request`; both run their calls through the
//! same `start_call`/`spawn_call` below, and differ only in how a request
//! is checked and how a result is tagged (`EraCall`).

pub mod era;
// The conformance suite's fixtures are a test server's only: a build
// without the `testing` feature (a release) has none of their code.
#[cfg(feature = "testing")]
pub mod fixtures;
pub mod jsonrpc;
pub mod modern;
pub mod resources;
pub mod scan;
pub mod tasks;
mod tasks_extension;

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::callers::Caller;
use crate::cancel::CancelToken;
use crate::echo;
use crate::log::{self, Level};
use crate::supervise;
use crate::tools::{self, CallEvents, ToolOutcome};
use crate::trace;
use jsonrpc::{ErrorCode, Message, Notification, Request, RequestId, Response, ResponseError};

/// Revisions this server speaks, newest first.
pub const SUPPORTED_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The revision answered to a client that asks for one we do not know.
const LATEST_VERSION: &str = SUPPORTED_VERSIONS[0];

const SERVER_NAME: &str = "mcp-k8s-ephemeral-job";

/// What the server tells a client about itself, in both eras: where its
/// runs go, in the words of the backend in use.
fn instructions(config: &crate::config::Config) -> String {
    format!(
        "Runs each command in a throwaway {}. Call describe_environment first to learn the allowed images, timeouts and size limits.",
        tools::backend_words::runs(config).sandbox()
    )
}

/// A message for the client, already serialized.
#[derive(Clone, Debug, PartialEq)]
pub enum Outgoing {
    Notification(String),
    /// The answer to a request; `error` (its code, for an error) lets HTTP
    /// pick a status code for requests made outside a session.
    Response {
        text: String,
        error: Option<ErrorCode>,
    },
}

/// Where a session's messages go: a stdio writer thread, an HTTP request
/// waiting for its answer, or a legacy SSE stream.
pub type Outbox = Sender<Outgoing>;

/// What `Server::handle` tells the transport to expect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// A notification or a response: nothing will be sent back.
    Accepted,
    /// A request: its response arrives through the outbox (possibly after
    /// notifications), or never if the client cancels it, in which case
    /// every sender of the outbox is dropped once the work stops.
    Reply,
}

/// One MCP session: the negotiated revision, the client's log level and the
/// calls in flight. stdio has one per process; HTTP one per
/// `Mcp-Session-Id` or legacy SSE stream.
pub struct Session {
    state: Mutex<SessionState>,
    calls: Mutex<HashMap<RequestId, CallHandle>>,
    /// The headers of the HTTP request this session was made for (HTTP
    /// outside a session); checked against a modern request's body.
    headers: Option<modern::RequestHeaders>,
    /// Who calls: the transport says, once, when the session is made.
    caller: Arc<Caller>,
}

/// Tool calls can run in parallel up to this many per server; beyond it
/// the call is refused rather than spawning threads without bound.
pub const MAX_CALLS_IN_FLIGHT: usize = 256;

/// The dispatcher shared by all transports and sessions.
pub struct Server {
    ctx: Arc<tools::Ctx>,
    registry: tools::Registry,
    calls: Calls,
}

impl Session {
    pub fn new(caller: Arc<Caller>) -> Session {
        let state = SessionState { protocol_version: None, log_level: Level::Info, era: None };
        Session { state: Mutex::new(state), calls: Mutex::new(HashMap::new()), headers: None, caller }
    }

    /// A session of a server's one caller (stdio), `name`d as the audit
    /// trail says it.
    pub fn whole_server(name: &str) -> Session {
        Session::new(Arc::new(Caller::whole_server(name)))
    }

    /// A session for one HTTP request made outside any session: it serves
    /// a modern request (checked against `headers`) or an `initialize`,
    /// after which the transport may keep it.
    pub fn for_http_request(headers: modern::RequestHeaders, caller: Arc<Caller>) -> Session {
        Session { headers: Some(headers), ..Session::new(caller) }
    }

    /// Who calls on this session.
    pub fn caller(&self) -> &Arc<Caller> {
        &self.caller
    }

    /// The era of the last request this session served, `None` before any.
    pub fn era(&self) -> Option<era::Era> {
        lock(&self.state).era
    }

    fn headers(&self) -> Option<&modern::RequestHeaders> {
        self.headers.as_ref()
    }

    fn era_hint(&self) -> era::Hint {
        let modern_header = self
            .headers
            .as_ref()
            .and_then(|headers| headers.protocol_version.as_deref())
            .is_some_and(|version| !SUPPORTED_VERSIONS.contains(&version.trim()));
        era::Hint { initialized: self.protocol_version().is_some(), modern_header }
    }

    /// The revision agreed in `initialize`, or `None` before it.
    pub fn protocol_version(&self) -> Option<&'static str> {
        lock(&self.state).protocol_version
    }

    pub fn calls_in_flight(&self) -> usize {
        lock(&self.calls).len()
    }

    /// Cancels every call of this session (it ended: DELETE, closed stream).
    /// Their responses, if any, go nowhere.
    pub fn cancel_all(&self) {
        for handle in lock(&self.calls).values() {
            handle.cancel.cancel();
        }
    }
}

impl Server {
    pub fn new(ctx: tools::Ctx) -> Server {
        let registry = tools::Registry::new(&ctx.config);
        let calls = Calls::new(ctx.config.max_inflight_bytes);
        if ctx.config.conformance_fixtures {
            // Loud, so that a server started with it by mistake says so.
            log::warn("serving the conformance suite's fixtures beside the real tools: a test server only", &[]);
        }
        Server { ctx: Arc::new(ctx), registry, calls }
    }

    /// The one entry point of every transport: handles one incoming
    /// message (a complete JSON text).
    pub fn handle(self: &Arc<Self>, session: &Arc<Session>, text: &str, outbox: Outbox) -> Dispatch {
        let (parsed, values) = jsonrpc::parse_counted(text);
        match parsed {
            Err(rejection) => {
                // The code only: the message may quote caller input.
                log::debug("invalid message", &[("code", json!(rejection.error.code.code()))]);
                let _ = outbox.send(Outgoing::Response { text: rejection.to_text(), error: Some(rejection.error.code) });
                Dispatch::Reply
            }
            Ok(Message::Request(request)) => {
                self.on_request(session, request, outbox, scan::parsed_cost(text.len(), values));
                Dispatch::Reply
            }
            Ok(Message::Notification(notification)) => {
                self.on_notification(session, &notification);
                Dispatch::Accepted
            }
            // The server sends no requests, so client responses answer
            // nothing; they are accepted and dropped.
            Ok(Message::Response(_)) => Dispatch::Accepted,
        }
    }

    /// Stops accepting new tool calls, waits up to `grace` for the running
    /// ones, then cancels the rest and waits up to `after_cancel` for them
    /// to wind down. Returns the number still running at the end.
    pub fn shut_down(&self, grace: Duration, after_cancel: Duration) -> usize {
        self.calls.stop_accepting();
        let running = self.calls.wait_idle(grace);
        if running == 0 {
            return 0;
        }
        log::info("cancelling calls still running", &[("calls", json!(running))]);
        self.calls.cancel_all();
        self.calls.wait_idle(after_cancel)
    }

    /// Cancels every running call at once (a second signal).
    pub fn cancel_all(&self) {
        self.calls.cancel_all();
    }

    /// Whether any site can run a job now, or why none can: `/readyz`.
    pub fn readiness(&self) -> Result<(), String> {
        tools::readiness::check(&self.ctx)
    }

    /// Takes the request apart: `params` moves on to the call that needs
    /// it rather than being copied.
    /// `message_bytes` is what the message the request came in costs as
    /// parsed values (`scan::parsed_cost`), which a call holds until it ends.
    fn on_request(self: &Arc<Self>, session: &Arc<Session>, request: Request, outbox: Outbox, message_bytes: usize) {
        let era = era::of_request(&request.method, &request.params, session.era_hint());
        lock(&session.state).era = Some(era);
        if era == era::Era::Modern {
            return self.on_modern_request(session, request, outbox, message_bytes);
        }
        let Request { id, method, params } = request;
        // Held until the answer is sent, below.
        let _piece = resources::piece_turn(&method, &params);
        let result = match method.as_str() {
            "initialize" => self.initialize(session, &params),
            "ping" => Ok(json!({})),
            method if !is_known_method(method) => {
                // Includes `server/discover` inside a session that ran
                // `initialize` (outside one, `era::of_request` sends it to
                // the 2026-07-28 adapter): that session speaks the
                // handshake era, which has no such method.
                Err(ResponseError::new(ErrorCode::MethodNotFound, format!("method not found: `{}`", echo::shorten(method))))
            }
            method if session.protocol_version().is_none() => {
                Err(ResponseError::new(ErrorCode::InvalidRequest, format!("`{method}` before `initialize`; initialize the session first")))
            }
            "tools/list" => list_tools(&self.registry, self.fixture_tools(), session.caller(), &params),
            // Declared only with a snippets folder; otherwise -32601, as for
            // any undeclared capability.
            method if resources::METHODS.contains(&method) => match resources::offered(&self.ctx.config) {
                true => resources::handle(method, &self.ctx, session.caller(), &params),
                false => Err(ResponseError::new(ErrorCode::MethodNotFound, format!("method not found: `{method}`"))),
            },
            "logging/setLevel" => set_log_level(session, &params),
            // The fixtures belong to 2026-07-28: a request of this era has
            // no `_meta` capabilities, so what needs one (or the tasks
            // extension) is refused and a task fixture runs to its end. The
            // input-required ones answer as in 2026-07-28, which only the
            // conformance suite calls.
            #[cfg(feature = "testing")]
            "tools/call" if let Some(fixture) = self.fixture_called(&params) => {
                match self.start_fixture(session, &id, fixture, params, outbox.clone(), message_bytes, EraCall::Handshake) {
                    Ok(()) => return,
                    Err(error) => Err(error),
                }
            }
            "tools/call" => match self.start_call(session, &id, params, outbox.clone(), message_bytes, EraCall::Handshake) {
                // The call's thread owns the response now.
                Ok(()) => return,
                Err(error) => Err(error),
            },
            // Task methods may wait on the cluster: they get a call thread.
            method if let Some((name, handler)) = tasks::handler(method) => {
                let work = Work::Raw(handler);
                let trace = CallTrace::of(name, &params);
                let call = CallStart { name, trace, work, arguments: params, progress_token: None, message_bytes, era: EraCall::Handshake };
                match self.spawn_call(session, &id, call, outbox.clone()) {
                    Ok(()) => return,
                    Err(error) => Err(error),
                }
            }
            method => Err(ResponseError::new(ErrorCode::MethodNotFound, format!("method not found: `{}`", echo::shorten(method)))),
        };
        send_response(&outbox, &Response { id: Some(id), result });
    }

    fn on_notification(&self, session: &Session, notification: &Notification) {
        match notification.method.as_str() {
            "notifications/cancelled" => {
                // Unknown or finished ids are ignored, as the spec says:
                // the response may already be on its way.
                let Some(request_id) = notification.params.get("requestId").and_then(RequestId::from_json) else {
                    return;
                };
                if let Some(handle) = lock(&session.calls).get(&request_id) {
                    handle.answer.store(false, Ordering::SeqCst);
                    handle.cancel.cancel();
                    log::info("call cancelled by client", &[("request_id", json!(echo::shorten(&request_id.to_string())))]);
                }
            }
            // Nothing to do: requests are served from the initialize
            // response on, which every client tolerates.
            "notifications/initialized" => {}
            other => log::debug("ignored notification", &[("method", json!(echo::shorten(other)))]),
        }
    }

    fn initialize(&self, session: &Session, params: &Map<String, Value>) -> Result<Value, ResponseError> {
        let requested = match params.get("protocolVersion") {
            Some(Value::String(version)) => version.as_str(),
            Some(other) => {
                return Err(invalid_params(format!("`protocolVersion` must be a string, not {}", crate::json::json_kind(other))));
            }
            None => return Err(invalid_params("missing `protocolVersion`")),
        };
        // Echo a revision we speak; otherwise answer our newest and let the
        // client decide (lifecycle: "MUST respond with another version").
        let version = SUPPORTED_VERSIONS.into_iter().find(|supported| *supported == requested).unwrap_or(LATEST_VERSION);
        {
            let mut state = lock(&session.state);
            if state.protocol_version.is_some() {
                return Err(ResponseError::new(ErrorCode::InvalidRequest, "session is already initialized"));
            }
            state.protocol_version = Some(version);
        }
        log::info("session initialized", &[("protocol_version", json!(version)), ("requested", json!(echo::shorten(requested)))]);
        let mut capabilities = json!({ "tools": {}, "logging": {}, "tasks": tasks::capability() });
        if resources::offered(&self.ctx.config) {
            capabilities["resources"] = json!({});
        }
        Ok(json!({
            "protocolVersion": version,
            // Only what is implemented: clients gate features on these.
            "capabilities": capabilities,
            "serverInfo": server_info(),
            "instructions": instructions(&self.ctx.config),
        }))
    }

    /// Starts a `tools/call` on its own thread. Errors here are the
    /// protocol-level ones (-32602 unknown tool, bad params shape).
    fn start_call(
        self: &Arc<Self>,
        session: &Arc<Session>,
        request_id: &RequestId,
        mut params: Map<String, Value>,
        outbox: Outbox,
        message_bytes: usize,
        era: EraCall,
    ) -> Result<(), ResponseError> {
        let name = match params.get("name") {
            Some(Value::String(name)) => name.as_str(),
            Some(other) => return Err(invalid_params(format!("`name` must be a string, not {}", crate::json::json_kind(other)))),
            None => return Err(invalid_params("missing `name`")),
        };
        let Some(tool) = self.registry.find(name) else {
            let available = self.registry.names().join(", ");
            return Err(invalid_params(format!("unknown tool: `{}`; available: {available}", echo::shorten(name))));
        };
        let (tool_name, handler) = (tool.name, tool.handler);
        refuse_input_answers(&params)?;
        let task = params.get("task").is_some_and(|task| !task.is_null());
        self.check_tool_allowed(session.caller(), tool_name, task)?;
        let progress_token = params.get("_meta").and_then(|meta| meta.get("progressToken")).and_then(RequestId::from_json);
        // A task-augmented call (tasks utility): the run starts and the
        // task comes back at once. Tools without `taskSupport` forbid it.
        if task {
            if !tools::background::TASK_TOOLS.contains(&tool_name) {
                return Err(ResponseError::new(
                    ErrorCode::MethodNotFound,
                    format!("tool `{tool_name}` does not support tasks; call it without `task`"),
                ));
            }
            let work = Work::Raw(tasks::create);
            let trace = CallTrace::of("tools/call", &params);
            let call = CallStart { name: tool_name, trace, work, arguments: params, progress_token: None, message_bytes, era };
            return self.spawn_call(session, request_id, call, outbox);
        }
        let trace = CallTrace::of("tools/call", &params);
        let arguments = match params.remove("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(arguments)) => arguments,
            Some(other) => return Err(invalid_params(format!("`arguments` must be an object, not {}", crate::json::json_kind(&other)))),
        };
        let call = CallStart { name: tool_name, trace, work: Work::Tool(handler), arguments, progress_token, message_bytes, era };
        self.spawn_call(session, request_id, call, outbox)
    }

    /// The caller's `tools` limit for a call of `tool`. A task is a run in
    /// the background, which is what `submit_job` starts: a caller needs
    /// that tool too, so a limit without it keeps the caller's runs in
    /// the foreground on every path.
    fn check_tool_allowed(&self, caller: &Caller, tool: &str, task: bool) -> Result<(), ResponseError> {
        let allowed = || self.registry.names().into_iter().filter(|name| caller.may_use_tool(name)).collect::<Vec<_>>().join(", ");
        if !caller.may_use_tool(tool) {
            return Err(invalid_params(format!(
                "tool `{tool}` is not allowed for caller `{}` (its limit `tools`); allowed: {}",
                caller.name,
                allowed()
            )));
        }
        if task && !caller.may_use_tool(tools::background::SUBMIT_JOB) {
            return Err(invalid_params(format!(
                "a task runs in the background, as submit_job does, which caller `{}` may not use (its limit `tools`); \
                 call `{tool}` without `task`; allowed: {}",
                caller.name,
                allowed()
            )));
        }
        Ok(())
    }

    /// The conformance fixtures' `tools/list` entries, when they are
    /// served; none in a build without them.
    fn fixture_tools(&self) -> Vec<Value> {
        #[cfg(feature = "testing")]
        if self.ctx.config.conformance_fixtures {
            return fixtures::tools_json();
        }
        Vec::new()
    }

    /// The conformance fixture a `tools/call` names, when they are served.
    #[cfg(feature = "testing")]
    fn fixture_called(&self, params: &Map<String, Value>) -> Option<&'static fixtures::Fixture> {
        let name = params.get("name").and_then(Value::as_str)?;
        if self.ctx.config.conformance_fixtures { fixtures::find(name) } else { None }
    }

    /// Starts a fixture's `tools/call` on its call thread, as its plan
    /// says; both eras' dispatchers call it.
    #[cfg(feature = "testing")]
    #[allow(clippy::too_many_arguments, reason = "start_call's arguments and the fixture")]
    fn start_fixture(
        self: &Arc<Self>,
        session: &Arc<Session>,
        request_id: &RequestId,
        fixture: &'static fixtures::Fixture,
        params: Map<String, Value>,
        outbox: Outbox,
        message_bytes: usize,
        era: EraCall,
    ) -> Result<(), ResponseError> {
        let plan = fixtures::plan(fixture, &params, self.ctx.config.max_timeout_s);
        let call = self.fixture_call(fixture.name, plan, params, message_bytes, era)?;
        self.spawn_call(session, request_id, call, outbox)
    }

    /// A fixture's `tools/call` as the call to start, from its plan.
    #[cfg(feature = "testing")]
    fn fixture_call(
        &self,
        name: &'static str,
        plan: fixtures::Plan,
        params: Map<String, Value>,
        message_bytes: usize,
        era: EraCall,
    ) -> Result<CallStart, ResponseError> {
        let progress_token = params.get("_meta").and_then(|meta| meta.get("progressToken")).and_then(RequestId::from_json);
        let trace = CallTrace::of("tools/call", &params);
        let (work, arguments) = match plan {
            fixtures::Plan::Refuse(error) => return Err(error),
            fixtures::Plan::Raw(handler) => (Work::Raw(handler), params),
            fixtures::Plan::ExecuteCode(arguments) => match self.registry.find(tools::execute_code::NAME) {
                Some(tool) => (Work::Tool(tool.handler), arguments),
                None => return Err(ResponseError::new(ErrorCode::InternalError, "execute_code is not registered")),
            },
        };
        Ok(CallStart { name, trace, work, arguments, progress_token, message_bytes, era })
    }

    /// Registers a call and runs it on its own thread, which sends the
    /// response.
    fn spawn_call(
        self: &Arc<Self>,
        session: &Arc<Session>,
        request_id: &RequestId,
        call: CallStart,
        outbox: Outbox,
    ) -> Result<(), ResponseError> {
        let CallStart { name, trace, work, arguments, progress_token, message_bytes, era } = call;
        let handle = CallHandle { cancel: CancelToken::new(), answer: Arc::new(AtomicBool::new(true)) };
        {
            let mut calls = lock(&session.calls);
            if calls.contains_key(request_id) {
                let shown = echo::shorten(&request_id.to_string()).into_owned();
                return Err(ResponseError::new(ErrorCode::InvalidRequest, format!("request id {shown} is already in use")));
            }
            let call_number = self.calls.register(&handle.cancel, message_bytes)?;
            calls.insert(request_id.clone(), handle.clone());
            let running = RunningCall {
                server: Arc::clone(self),
                session: Arc::clone(session),
                request_id: request_id.clone(),
                call_number,
                tool_name: name,
                trace,
                work,
                arguments,
                handle,
                era,
                events: Notifier {
                    session: Arc::clone(session),
                    outbox,
                    progress_token,
                    last_progress: Mutex::new(None),
                    logger: name,
                    era,
                },
            };
            let spawned = supervise::spawn_named(supervise::Kind::Call, format!("call-{name}"), move || running.run());
            if let Err(error) = spawned {
                calls.remove(request_id);
                self.calls.unregister(call_number);
                return Err(ResponseError::new(ErrorCode::InternalError, format!("could not start a thread: {error}")));
            }
        }
        Ok(())
    }
}

/// A call about to start: what it runs, on what, and the size of the
/// message it came in (counted against `MCP_K8S_MAX_INFLIGHT_BYTES`).
struct CallStart {
    /// The tool's name, or the task method's.
    name: &'static str,
    /// The MCP method and the client's span, for the call's span.
    trace: CallTrace,
    work: Work,
    arguments: Map<String, Value>,
    progress_token: Option<RequestId>,
    message_bytes: usize,
    era: EraCall,
}

/// What differs for a call between the eras.
#[derive(Clone, Copy, Debug)]
enum EraCall {
    /// Logs at the session's level (`logging/setLevel`); plain results.
    Handshake,
    /// Logs only when the request's `_meta` names a level; results carry
    /// `resultType`.
    Modern { log_level: Option<Level> },
}

/// What the dispatcher knows per call: the token to cancel it and whether
/// its response is still wanted (false after `notifications/cancelled`).
#[derive(Clone)]
struct CallHandle {
    cancel: CancelToken,
    answer: Arc<AtomicBool>,
}

struct SessionState {
    protocol_version: Option<&'static str>,
    /// Lowest level sent as `notifications/message`; `logging/setLevel`
    /// changes it.
    log_level: Level,
    /// The era of the last request served.
    era: Option<era::Era>,
}

/// Every call in flight on the server, for shutdown, and the bytes of the
/// messages they hold: a call keeps its arguments (as values, and again as
/// what they were checked into) until it ends, so without a bound a client
/// could park `MAX_CALLS_IN_FLIGHT` maximal messages in long runs.
struct Calls {
    state: Mutex<CallsState>,
    idle: Condvar,
    max_bytes_in_flight: usize,
}

struct CallsState {
    accepting: bool,
    next_number: u64,
    /// Each call's cancel token and the size of its message.
    running: HashMap<u64, (CancelToken, usize)>,
    bytes_in_flight: usize,
    /// Calls whose answer is being queued: they hold no slot (a client
    /// that sends its next call once it has an answer is never refused),
    /// but shutdown still waits for them.
    answering: usize,
}

impl Calls {
    fn new(max_bytes_in_flight: usize) -> Calls {
        let state = CallsState { accepting: true, next_number: 0, running: HashMap::new(), bytes_in_flight: 0, answering: 0 };
        Calls { state: Mutex::new(state), idle: Condvar::new(), max_bytes_in_flight }
    }

    /// A call is refused when it would take the bytes in flight over the
    /// cap, except when nothing runs: one message within
    /// `MCP_K8S_MAX_MESSAGE_BYTES` is always served. `message_bytes` is
    /// what the call's message costs as parsed values
    /// (`scan::parsed_cost`), which the call holds until it ends.
    fn register(&self, cancel: &CancelToken, message_bytes: usize) -> Result<u64, ResponseError> {
        let mut state = lock(&self.state);
        if !state.accepting {
            return Err(ResponseError::new(ErrorCode::InternalError, "server is shutting down; no new calls are accepted"));
        }
        if state.running.len() >= MAX_CALLS_IN_FLIGHT {
            return Err(ResponseError::new(
                ErrorCode::InternalError,
                format!("too many calls in flight ({MAX_CALLS_IN_FLIGHT}); retry when some have finished"),
            ));
        }
        if !state.running.is_empty() && state.bytes_in_flight + message_bytes > self.max_bytes_in_flight {
            return Err(ResponseError::new(
                ErrorCode::InternalError,
                format!(
                    "the calls in flight hold up to {} bytes of parsed messages and this one up to {message_bytes}, more than this server holds at once (MCP_K8S_MAX_INFLIGHT_BYTES, {}); retry when some have finished",
                    state.bytes_in_flight, self.max_bytes_in_flight
                ),
            ));
        }
        state.next_number += 1;
        let number = state.next_number;
        state.running.insert(number, (cancel.clone(), message_bytes));
        state.bytes_in_flight += message_bytes;
        Ok(number)
    }

    fn unregister(&self, number: u64) {
        let mut state = lock(&self.state);
        if let Some((_, message_bytes)) = state.running.remove(&number) {
            state.bytes_in_flight -= message_bytes;
        }
        if state.running.is_empty() && state.answering == 0 {
            self.idle.notify_all();
        }
    }

    /// The call's work is done and its answer is about to be queued: its
    /// slot and bytes are free from now on; `answered` ends it.
    fn finishing(&self, number: u64) {
        let mut state = lock(&self.state);
        if let Some((_, message_bytes)) = state.running.remove(&number) {
            state.bytes_in_flight -= message_bytes;
            state.answering += 1;
        }
    }

    /// The answer of a call passed to `finishing` is queued (or dropped).
    fn answered(&self) {
        let mut state = lock(&self.state);
        state.answering = state.answering.saturating_sub(1);
        if state.running.is_empty() && state.answering == 0 {
            self.idle.notify_all();
        }
    }

    fn stop_accepting(&self) {
        lock(&self.state).accepting = false;
    }

    fn cancel_all(&self) {
        for (cancel, _) in lock(&self.state).running.values() {
            cancel.cancel();
        }
    }

    /// Waits until no call runs or `timeout` passes; returns how many run.
    fn wait_idle(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut state = lock(&self.state);
        while !state.running.is_empty() || state.answering > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            state = self.idle.wait_timeout(state, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        state.running.len() + state.answering
    }
}

/// A tool result as a session's revision knows it: `resource_link` blocks
/// came with 2025-06-18, so an older client gets the links only in the
/// result's JSON (text and `links`), never a block it cannot parse.
fn for_version(mut result: Value, version: Option<&str>) -> Value {
    if matches!(version, Some("2024-11-05" | "2025-03-26"))
        && let Some(Value::Array(content)) = result.get_mut("content")
    {
        content.retain(|block| block.get("type").and_then(Value::as_str) != Some("resource_link"));
    }
    result
}

/// What a call thread runs.
enum Work {
    /// A tool: its outcome becomes a `tools/call` result.
    Tool(tools::Handler),
    /// A task method (or a task-augmented `tools/call`): a plain result.
    Raw(tasks::RawHandler),
}

/// Everything a call's thread owns.
struct RunningCall {
    server: Arc<Server>,
    session: Arc<Session>,
    request_id: RequestId,
    call_number: u64,
    /// The tool's name, or the task method's.
    tool_name: &'static str,
    trace: CallTrace,
    work: Work,
    arguments: Map<String, Value>,
    handle: CallHandle,
    era: EraCall,
    events: Notifier,
}

impl RunningCall {
    fn run(self) {
        let started = Instant::now();
        let started_at = std::time::SystemTime::now();
        let span = self.trace.span();
        let call = tools::Call {
            arguments: &self.arguments,
            cancel: &self.handle.cancel,
            events: &self.events,
            trace: span,
            caller: &self.session.caller,
        };
        // A panicking tool must not take the server down: it becomes -32603
        // for this call only. Needs `panic = "unwind"` (Cargo.toml).
        let outcome = match self.work {
            Work::Tool(handler) => catch_unwind(AssertUnwindSafe(|| handler(&self.server.ctx, &call))).map(Ok),
            Work::Raw(handler) => catch_unwind(AssertUnwindSafe(|| handler(&self.server.ctx, &call))).map(Err),
        };
        let (result, status) = match outcome {
            Ok(Ok(outcome @ (ToolOutcome::Success(_) | ToolOutcome::SuccessWithContent { .. }))) => {
                (Ok(tools::result_json(outcome)), "success")
            }
            Ok(Ok(outcome @ (ToolOutcome::Failure(_) | ToolOutcome::Rendered { is_error: true, .. }))) => {
                (Ok(tools::result_json(outcome)), "tool_error")
            }
            Ok(Ok(outcome @ ToolOutcome::Rendered { is_error: false, .. })) => (Ok(tools::result_json(outcome)), "success"),
            Ok(Err(Ok(value))) => (Ok(value), "success"),
            Ok(Err(Err(error))) => (Err(error), "error"),
            Err(_) => (
                Err(ResponseError::new(
                    ErrorCode::InternalError,
                    format!("internal error: tool `{}` failed unexpectedly; see the server log", self.tool_name),
                )),
                "panic",
            ),
        };
        let result = match self.era {
            EraCall::Modern { .. } => result.map(complete),
            EraCall::Handshake => result.map(|result| for_version(result, self.session.protocol_version())),
        };
        let answered = self.handle.answer.load(Ordering::SeqCst);
        crate::metrics::tool_call(self.tool_name, if answered { status } else { "cancelled" }, started.elapsed());
        if let Some(context) = span {
            let status = if answered { status } else { "cancelled" };
            trace::record(self.trace.server_span(
                context,
                &self.request_id,
                self.tool_name,
                started_at,
                status,
                self.session.protocol_version(),
            ));
        }
        log::info(
            "tool call finished",
            &[
                ("tool", json!(self.tool_name)),
                ("status", json!(if answered { status } else { "cancelled" })),
                ("duration_ms", json!(started.elapsed().as_millis() as u64)),
            ],
        );
        // The slot is free before the answer goes out, so a client that
        // sends its next call on reading this answer finds it free.
        self.server.calls.finishing(self.call_number);
        // A call the client cancelled gets no response (cancellation
        // utility: "SHOULD NOT send a response").
        if answered {
            send_response(&self.events.outbox, &Response { id: Some(self.request_id.clone()), result });
        }
        // Ended only after the response is queued, so a shutdown that
        // sees no calls left knows every answer is already in an outbox.
        lock(&self.session.calls).remove(&self.request_id);
        self.server.calls.answered();
    }
}

/// What a call's span needs to know from its request.
#[derive(Clone, Copy, Debug)]
struct CallTrace {
    /// `tools/call`, or the task method.
    method: &'static str,
    /// The client's span, from `params._meta.traceparent`.
    parent: Option<trace::SpanContext>,
}

impl CallTrace {
    fn of(method: &'static str, params: &Map<String, Value>) -> CallTrace {
        let traceparent = params.get("_meta").and_then(|meta| meta.get("traceparent")).and_then(Value::as_str);
        CallTrace { method, parent: traceparent.and_then(trace::parse_traceparent) }
    }

    /// The call's own span, when traces are sent and the client's span,
    /// if any, is sampled.
    fn span(&self) -> Option<trace::SpanContext> {
        if !trace::enabled() {
            return None;
        }
        match self.parent {
            Some(parent) if !parent.sampled => None,
            Some(parent) => Some(parent.child()),
            None => Some(trace::SpanContext::root()),
        }
    }

    /// The finished call as a server span, with the MCP semantic
    /// conventions' attributes: never the arguments.
    fn server_span(
        &self,
        context: trace::SpanContext,
        request_id: &RequestId,
        name: &'static str,
        started: std::time::SystemTime,
        status: &'static str,
        protocol_version: Option<&'static str>,
    ) -> trace::Span {
        use trace::Attr;
        // The id as the client wrote it (a string without quotes),
        // shortened: it is the client's text.
        let request_id = match request_id {
            RequestId::Integer(number) => number.to_string(),
            RequestId::String(text) => echo::shorten(text).into_owned(),
        };
        let mut attributes = vec![("mcp.method.name", Attr::Text(self.method.to_string())), ("jsonrpc.request.id", Attr::Text(request_id))];
        let is_tool = self.method == "tools/call";
        if is_tool {
            attributes.push(("gen_ai.tool.name", Attr::Text(name.to_string())));
            attributes.push(("gen_ai.operation.name", Attr::Text("execute_tool".to_string())));
        }
        if let Some(version) = protocol_version {
            attributes.push(("mcp.protocol.version", Attr::Text(version.to_string())));
        }
        let error = match status {
            "success" => None,
            other => Some(other.to_string()),
        };
        if let Some(kind) = &error {
            attributes.push(("error.type", Attr::Text(kind.clone())));
        }
        trace::Span {
            context,
            parent: self.parent.map(|parent| parent.span_id),
            name: if is_tool { format!("tools/call {name}") } else { self.method.to_string() },
            kind: trace::Kind::Server,
            start: started,
            end: std::time::SystemTime::now(),
            attributes,
            error,
        }
    }
}

/// `CallEvents` for one call: progress goes out only when the request
/// carried a `progressToken`; logs only at or above the session's level.
struct Notifier {
    session: Arc<Session>,
    outbox: Outbox,
    progress_token: Option<RequestId>,
    last_progress: Mutex<Option<f64>>,
    logger: &'static str,
    era: EraCall,
}

impl CallEvents for Notifier {
    fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        let Some(token) = &self.progress_token else {
            return;
        };
        {
            let mut last = lock(&self.last_progress);
            if last.is_some_and(|last| progress <= last) || !progress.is_finite() {
                return;
            }
            *last = Some(progress);
        }
        let mut params = json!({ "progressToken": token.to_json(), "progress": number_json(progress) });
        if let Some(total) = total {
            params["total"] = number_json(total);
        }
        if let Some(message) = message {
            params["message"] = json!(message);
        }
        send_notification(&self.outbox, &Notification::new("notifications/progress", params));
    }

    fn log(&self, level: Level, message: &str) {
        let lowest = match self.era {
            EraCall::Handshake => lock(&self.session.state).log_level,
            // 2026-07-28: no level in `_meta`, no log notifications.
            EraCall::Modern { log_level: None } => return,
            EraCall::Modern { log_level: Some(level) } => level,
        };
        if level < lowest {
            return;
        }
        let params = json!({ "level": level.as_str(), "logger": self.logger, "data": message });
        send_notification(&self.outbox, &Notification::new("notifications/message", params));
    }
}

/// Whole numbers are written without `.0`, which reads better in clients
/// that show progress as text.
fn number_json(number: f64) -> Value {
    if number.fract() == 0.0 && number.abs() < 9.0e15 { json!(number as i64) } else { json!(number) }
}

/// `serverInfo`, the same in both eras.
fn server_info() -> Value {
    json!({ "name": SERVER_NAME, "title": "Ephemeral Kubernetes jobs", "version": env!("CARGO_PKG_VERSION") })
}

fn is_known_method(method: &str) -> bool {
    matches!(method, "tools/list" | "tools/call" | "logging/setLevel")
        || tasks::METHODS.contains(&method)
        || resources::METHODS.contains(&method)
}

/// The tools `caller` may call (all of them, unless its limit `tools`
/// names some).
/// `fixture_tools` (the conformance fixtures', when served) follow the
/// real tools.
fn list_tools(
    registry: &tools::Registry,
    fixture_tools: Vec<Value>,
    caller: &Caller,
    params: &Map<String, Value>,
) -> Result<Value, ResponseError> {
    // All tools fit on one page, so no cursor was ever handed out.
    match params.get("cursor") {
        None | Some(Value::Null) => {
            let mut listed = registry.list_json(|tool| caller.may_use_tool(tool));
            if let Some(Value::Array(tools)) = listed.get_mut("tools") {
                tools.extend(fixture_tools);
            }
            Ok(listed)
        }
        Some(cursor) => Err(invalid_params(format!("unknown cursor {}; tools/list has a single page", echo::shorten(&cursor.to_string())))),
    }
}

fn set_log_level(session: &Session, params: &Map<String, Value>) -> Result<Value, ResponseError> {
    let accepted = "debug, info, notice, warning, error, critical, alert, emergency";
    let level = match params.get("level") {
        Some(Value::String(text)) => Level::parse(text)
            .ok_or_else(|| invalid_params(format!("unknown log level `{}`; accepted: {accepted}", echo::shorten(text))))?,
        Some(other) => return Err(invalid_params(format!("`level` must be a string, not {}", crate::json::json_kind(other)))),
        None => return Err(invalid_params(format!("missing `level`; accepted: {accepted}"))),
    };
    lock(&session.state).log_level = level;
    Ok(json!({}))
}

/// Tags a 2026-07-28 result as complete unless it says otherwise (a
/// task): what `EraCall::Modern`'s results carry. Here, beside the
/// dispatcher that tags each modern call's result, rather than in `modern`:
/// `tasks_extension` needs it too (a task's inlined tool result), and
/// `modern` imports `tasks_extension`.
fn complete(mut result: Value) -> Value {
    if let Value::Object(object) = &mut result
        && !object.contains_key("resultType")
    {
        object.insert("resultType".into(), json!("complete"));
    }
    result
}

/// `inputResponses` and `requestState` answer an input-required result,
/// which only the conformance fixtures give (`fixtures::input`): a tool of
/// this server never asks, so a call carrying them is refused rather than
/// run as if the answers had been read.
fn refuse_input_answers(params: &Map<String, Value>) -> Result<(), ResponseError> {
    let given = ["inputResponses", "requestState"].iter().any(|key| params.get(*key).is_some_and(|value| !value.is_null()));
    match given {
        true => Err(invalid_params(
            "`inputResponses` and `requestState` answer an input request, and this server's tools never ask for input; call again without them",
        )),
        false => Ok(()),
    }
}

fn invalid_params(message: impl Into<String>) -> ResponseError {
    ResponseError::new(ErrorCode::InvalidParams, message)
}

/// A send fails only when the receiver is gone (HTTP client disconnected,
/// stdio writer stopped); there is nobody left to tell.
fn send_response(outbox: &Outbox, response: &Response) {
    let error = response.result.as_ref().err().map(|error| error.code);
    let _ = outbox.send(Outgoing::Response { text: response.to_text(), error });
}

fn send_notification(outbox: &Outbox, notification: &Notification) {
    let _ = outbox.send(Outgoing::Notification(notification.to_json().to_string()));
}

/// Locks, ignoring poison: a panicking tool thread never holds these locks
/// across the handler, and the data stays consistent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
