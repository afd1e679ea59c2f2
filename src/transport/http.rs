//! HTTP transports on one tiny_http listener: Streamable HTTP at `/mcp`
//! (revisions 2025-03-26 to 2025-11-25), legacy HTTP+SSE at `GET /sse` +
//! `POST /messages?sessionId=` (2024-11-05), and `/healthz`, `/readyz`,
//! `/metrics` (the text of `metrics::render`).
//!
//! This file owns HTTP concerns only: auth, Origin and Host checks,
//! sessions (`Mcp-Session-Id`, expiry), status codes, body caps and SSE
//! framing. Messages go to `protocol::Server::handle` untouched.
//!
//! Each request is served on its own thread, so a long tool call holding
//! its POST open never blocks another request. SSE is written by hand
//! through `Request::into_writer` with a flush per event: tiny_http's own
//! chunked encoder holds back 8 KiB, which would deliver progress only at
//! the end.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;
use tiny_http::{Header, Method, Request};

use crate::config::Config;
use crate::engine::cancel::CancelToken;
use crate::log;
use crate::protocol::jsonrpc::{ErrorCode, Response};
use crate::protocol::{Dispatch, Outbox, Outgoing, SUPPORTED_VERSIONS, Server, Session};

/// Sessions kept at once; beyond it `initialize` is refused with 503.
pub const MAX_SESSIONS: usize = 1000;

/// Requests served at once; beyond it new ones get 503. Each holds a thread.
pub const MAX_ACTIVE_REQUESTS: usize = 512;

/// Serves until `stop` is cancelled, then stops accepting, lets in-flight
/// calls finish within the grace period and closes the SSE streams.
pub fn serve(server: Arc<Server>, config: &Config, stop: CancelToken) -> io::Result<()> {
    let listener = tiny_http::Server::http(config.addr).map_err(|error| io::Error::other(error.to_string()))?;
    let bound = listener.server_addr().to_ip().map_or_else(|| config.addr.to_string(), |addr| addr.to_string());
    log::info(
        "listening",
        &[("addr", json!(bound)), ("endpoints", json!(["/mcp", "/sse", "/messages", "/healthz", "/readyz", "/metrics"]))],
    );
    if !config.binds_loopback() && config.auth_token.is_none() {
        log::warn(
            "listening beyond loopback without MCP_K8S_AUTH_TOKEN: anyone who can reach the port can run jobs",
            &[("addr", json!(bound))],
        );
    }
    let state = Arc::new(HttpState {
        server: Arc::clone(&server),
        sessions: Sessions::new(Duration::from_secs(config.session_ttl_s)),
        auth_token: config.auth_token.as_ref().map(|token| token.0.clone()),
        allowed_origins: config.allowed_origins.clone(),
        check_host: config.binds_loopback(),
        max_message_bytes: config.max_message_bytes,
        stop: stop.clone(),
        active_requests: AtomicUsize::new(0),
    });
    while !stop.is_cancelled() {
        match listener.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(request)) => dispatch(&state, request),
            Ok(None) => {}
            Err(error) => log::warn("accepting a request failed", &[("error", json!(error.to_string()))]),
        }
    }
    // Dropping the listener closes the socket: no new connections.
    drop(listener);
    log::info("shutting down", &[("grace_s", json!(config.shutdown_grace_s))]);
    let still_running = server.shut_down(Duration::from_secs(config.shutdown_grace_s), Duration::from_secs(5));
    if still_running > 0 {
        log::warn("calls did not stop in time", &[("calls", json!(still_running))]);
    }
    state.sessions.end_all();
    // Give handler threads a moment to write what the calls returned.
    let deadline = Instant::now() + Duration::from_secs(5);
    while state.active_requests.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

struct HttpState {
    server: Arc<Server>,
    sessions: Sessions,
    /// Plain text, compared in constant time, never logged.
    auth_token: Option<String>,
    allowed_origins: Vec<String>,
    /// Host header check against DNS rebinding; only meaningful when the
    /// listener is on loopback (otherwise the server's names are unknown).
    check_host: bool,
    max_message_bytes: usize,
    stop: CancelToken,
    active_requests: AtomicUsize,
}

/// Decrements the active request count when a handler thread ends.
struct ActiveGuard(Arc<HttpState>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active_requests.fetch_sub(1, Ordering::SeqCst);
    }
}

fn dispatch(state: &Arc<HttpState>, request: Request) {
    if state.active_requests.fetch_add(1, Ordering::SeqCst) >= MAX_ACTIVE_REQUESTS {
        state.active_requests.fetch_sub(1, Ordering::SeqCst);
        let _ = request.respond(error_response(503, "too many requests in progress; retry shortly", &[]));
        return;
    }
    let guard = ActiveGuard(Arc::clone(state));
    let spawned = thread::Builder::new().name("http-request".into()).spawn(move || {
        let state = Arc::clone(&guard.0);
        route(&state, request);
        drop(guard);
    });
    if let Err(error) = spawned {
        // The request moved into the failed closure and was dropped, which
        // makes tiny_http answer 500.
        log::error("could not start a request thread", &[("error", json!(error.to_string()))]);
    }
}

fn route(state: &Arc<HttpState>, request: Request) {
    let path = request.url().split('?').next().unwrap_or("").to_string();
    let method = request.method().clone();
    match (path.as_str(), &method) {
        ("/healthz", Method::Get) => {
            let _ = request.respond(tiny_http::Response::from_string("ok\n"));
        }
        // Counters only, no caller data: served without a token, like the
        // probes, so a Prometheus scrape needs no MCP credentials.
        ("/metrics", Method::Get) => {
            let response = tiny_http::Response::from_string(crate::metrics::render());
            let _ = request.respond(with_headers(response, &[("Content-Type", crate::metrics::CONTENT_TYPE)]));
        }
        ("/readyz", Method::Get) => {
            let (status, body) = if state.stop.is_cancelled() { (503, "shutting down\n") } else { (200, "ready\n") };
            let _ = request.respond(tiny_http::Response::from_string(body).with_status_code(status));
        }
        ("/mcp" | "/sse" | "/messages", Method::Options) => preflight(state, request),
        ("/mcp" | "/sse" | "/messages", _) => {
            let cors = match check_access(state, &request) {
                Ok(cors) => cors,
                Err(response) => {
                    let _ = request.respond(response);
                    return;
                }
            };
            match (path.as_str(), method) {
                ("/mcp", Method::Post) => post_mcp(state, request, &cors),
                ("/mcp", Method::Delete) => delete_mcp(state, request, &cors),
                // No server-initiated stream: 405 is what the spec allows
                // and what clients expect (never 404 or 400).
                ("/mcp", _) => {
                    respond_error(request, 405, "GET is not supported on /mcp; POST messages instead", &[("Allow", "POST, DELETE")])
                }
                ("/sse", Method::Get) => legacy_stream(state, request, &cors),
                ("/messages", Method::Post) => legacy_post(state, request, &cors),
                (_, _) => respond_error(request, 405, "method not allowed", &[]),
            }
        }
        _ => respond_error(request, 404, "not found; the MCP endpoint is /mcp (or /sse for legacy clients)", &[]),
    }
}

// ---------------------------------------------------------------------------
// Access checks.

/// Headers to add to every answer for a browser origin we allow.
type Cors = Vec<(&'static str, String)>;

/// Host (DNS rebinding), Origin and token checks, in that order: a browser
/// on a foreign page is refused before its token is even looked at.
fn check_access(state: &HttpState, request: &Request) -> Result<Cors, tiny_http::Response<io::Cursor<Vec<u8>>>> {
    if state.check_host
        && let Some(host) = header(request, "Host")
        && !is_loopback_authority(host)
    {
        log::warn("request refused: foreign Host header", &[]);
        return Err(error_response(421, "Host header does not name this server; expected localhost", &[]));
    }
    let mut cors = Vec::new();
    if let Some(origin) = header(request, "Origin") {
        if !origin_allowed(origin, &state.allowed_origins) {
            log::warn("request refused: foreign Origin", &[]);
            return Err(error_response(403, "Origin is not allowed; set MCP_K8S_ALLOWED_ORIGINS to allow it", &[]));
        }
        cors.push(("Access-Control-Allow-Origin", origin.to_string()));
        cors.push(("Access-Control-Expose-Headers", "Mcp-Session-Id".to_string()));
        cors.push(("Vary", "Origin".to_string()));
    }
    if let Some(expected) = &state.auth_token {
        match presented_token(request) {
            Some(token) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => {}
            presented => {
                let challenge = if presented.is_some() { r#"Bearer error="invalid_token""# } else { "Bearer" };
                let message = if presented.is_some() { "wrong token" } else { "missing token; send X-MCP-AUTH or Authorization: Bearer" };
                log::warn("request refused: authentication", &[("token_present", json!(presented.is_some()))]);
                return Err(error_response(401, message, &[("WWW-Authenticate", challenge)]));
            }
        }
    }
    Ok(cors)
}

/// `X-MCP-AUTH: <token>` (the original's header) or
/// `Authorization: Bearer <token>`. Never from the query string.
fn presented_token(request: &Request) -> Option<&str> {
    if let Some(token) = header(request, "X-MCP-AUTH") {
        return Some(token.trim());
    }
    let authorization = header(request, "Authorization")?.trim();
    let (scheme, token) = authorization.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Compares without an early exit, so timing does not reveal how much of a
/// guess was right. Lengths may differ in time; they are not secret enough
/// to matter.
pub fn constant_time_eq(left: &[u8], right: &[u8]) -> bool {
    if left.len() != right.len() {
        return false;
    }
    let difference = left.iter().zip(right).fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(difference) == 0
}

/// `localhost`, `127.0.0.1` or `[::1]`, with any port.
pub fn is_loopback_authority(authority: &str) -> bool {
    let authority = authority.trim().to_ascii_lowercase();
    let host = if authority.starts_with('[') {
        authority.split(']').next().map(|inside| format!("{inside}]")).unwrap_or_default()
    } else {
        authority.split(':').next().unwrap_or_default().to_string()
    };
    matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]")
}

/// Loopback origins (any scheme and port) plus the configured ones, exactly.
pub fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    if allowed.iter().any(|candidate| candidate.eq_ignore_ascii_case(origin)) {
        return true;
    }
    match origin.split_once("://") {
        Some(("http" | "https", authority)) => !authority.contains('/') && is_loopback_authority(authority),
        _ => false,
    }
}

fn preflight(state: &HttpState, request: Request) {
    let Some(origin) = header(&request, "Origin").map(str::to_string) else {
        return respond_error(request, 405, "OPTIONS is only for browser preflight", &[]);
    };
    if !origin_allowed(&origin, &state.allowed_origins) {
        return respond_error(request, 403, "Origin is not allowed; set MCP_K8S_ALLOWED_ORIGINS to allow it", &[]);
    }
    let headers = [
        ("Access-Control-Allow-Origin", origin.as_str()),
        ("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"),
        (
            "Access-Control-Allow-Headers",
            "content-type, accept, authorization, x-mcp-auth, mcp-session-id, mcp-protocol-version, last-event-id",
        ),
        ("Access-Control-Expose-Headers", "Mcp-Session-Id"),
        ("Access-Control-Max-Age", "600"),
        ("Vary", "Origin"),
    ];
    let _ = request.respond(with_headers(tiny_http::Response::from_data(Vec::new()).with_status_code(204), &headers));
}

// ---------------------------------------------------------------------------
// Streamable HTTP.

fn post_mcp(state: &Arc<HttpState>, mut request: Request, cors: &Cors) {
    let body = match read_body(&mut request, state.max_message_bytes) {
        Ok(body) => body,
        Err(response) => {
            let _ = request.respond(response);
            return;
        }
    };
    // Without Mcp-Session-Id the message may only be `initialize` (or a
    // session-less ping or probe): it gets a fresh session that is kept
    // only if initialize succeeds.
    let (session, session_id) = match header(&request, "Mcp-Session-Id").map(str::to_string) {
        Some(id) => match state.sessions.streamable(&id) {
            Some(session) => (session, Some(id)),
            None => return respond_error(request, 404, "unknown or expired session; initialize a new one", &[]),
        },
        None => (Arc::new(Session::new()), None),
    };
    if session_id.is_some()
        && let Err(message) = check_protocol_version(&request)
    {
        return respond_error(request, 400, &message, &[]);
    }
    let wants_sse = accepts(&request, "text/event-stream");
    let (outbox, replies) = mpsc::channel();
    match state.server.handle(&session, &body, outbox) {
        Dispatch::Accepted if session_id.is_none() => {
            respond_error(request, 400, "missing Mcp-Session-Id header; initialize a session first", &[])
        }
        Dispatch::Accepted => {
            let response = tiny_http::Response::from_data(Vec::new()).with_status_code(202);
            let _ = request.respond(with_cors(response, cors));
        }
        Dispatch::Reply => {
            let mut headers = cors.clone();
            let new_session = session_id.is_none() && session.protocol_version().is_some();
            if new_session {
                match state.sessions.insert(Arc::clone(&session), SessionKind::Streamable) {
                    Some(id) => headers.push(("Mcp-Session-Id", id)),
                    None => return respond_error(request, 503, "too many sessions; retry later", &[]),
                }
            }
            let reply = Reply { headers, wants_sse, outside_session: session_id.is_none() && !new_session };
            reply.send(request, &replies);
        }
    }
}

/// How to answer one POSTed request once its messages come in.
struct Reply {
    headers: Cors,
    wants_sse: bool,
    /// A request made without a session that did not create one: its
    /// errors are answered with 400, so probing clients see a 4xx.
    outside_session: bool,
}

impl Reply {
    /// Answers with `application/json` when the response comes first, or
    /// switches to `text/event-stream` at the first notification.
    fn send(self, request: Request, replies: &Receiver<Outgoing>) {
        let mut stream: Option<SseWriter> = None;
        let mut request = Some(request);
        loop {
            match replies.recv() {
                Ok(Outgoing::Response { text, is_error }) => {
                    if let Some(mut writer) = stream.take() {
                        let _ = writer.event(None, &text).and_then(|()| writer.finish());
                    } else if let Some(request) = request.take() {
                        let status = if is_error && self.outside_session { 400 } else { 200 };
                        let response = json_response(status, text);
                        let _ = request.respond(with_cors(response, &self.headers));
                    }
                    return;
                }
                Ok(Outgoing::Notification(text)) => {
                    if !self.wants_sse {
                        continue;
                    }
                    if let Some(request) = request.take() {
                        match SseWriter::start(request, &self.headers) {
                            Ok(writer) => stream = Some(writer),
                            Err(_) => return,
                        }
                    }
                    if let Some(writer) = stream.as_mut()
                        && writer.event(None, &text).is_err()
                    {
                        // The client went away; the call continues (a
                        // disconnect is not a cancellation) but its
                        // messages have nowhere to go.
                        stream = None;
                    }
                }
                // Every sender is gone without a response: the client
                // cancelled the request. End what was started.
                Err(_) => {
                    if let Some(writer) = stream.take() {
                        let _ = writer.finish();
                    } else if let Some(request) = request.take() {
                        let response = tiny_http::Response::from_data(Vec::new()).with_status_code(202);
                        let _ = request.respond(with_cors(response, &self.headers));
                    }
                    return;
                }
            }
        }
    }
}

fn delete_mcp(state: &HttpState, request: Request, cors: &Cors) {
    let Some(id) = header(&request, "Mcp-Session-Id").map(str::to_string) else {
        return respond_error(request, 400, "missing Mcp-Session-Id header", &[]);
    };
    if state.sessions.remove_streamable(&id) {
        log::info("session ended by client", &[]);
        let _ = request.respond(with_cors(tiny_http::Response::from_data(Vec::new()).with_status_code(204), cors));
    } else {
        respond_error(request, 404, "unknown or expired session", &[]);
    }
}

/// A present `MCP-Protocol-Version` must name a revision we speak; an
/// absent one means 2025-03-26, which we do.
fn check_protocol_version(request: &Request) -> Result<(), String> {
    match header(request, "MCP-Protocol-Version") {
        Some(version) if !SUPPORTED_VERSIONS.contains(&version.trim()) => {
            Err(format!("unsupported MCP-Protocol-Version `{version}`; supported: {}", SUPPORTED_VERSIONS.join(", ")))
        }
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------
// Legacy HTTP+SSE (2024-11-05).

/// `GET /sse`: opens a session whose messages all flow on this stream.
fn legacy_stream(state: &Arc<HttpState>, request: Request, cors: &Cors) {
    let session = Arc::new(Session::new());
    let (outbox, outgoing) = mpsc::channel();
    let Some(id) = state.sessions.insert(Arc::clone(&session), SessionKind::Legacy(outbox)) else {
        return respond_error(request, 503, "too many sessions; retry later", &[]);
    };
    let Ok(mut writer) = SseWriter::start(request, cors) else {
        state.sessions.remove(&id);
        return;
    };
    log::info("legacy SSE stream opened", &[]);
    if writer.event(Some("endpoint"), &format!("/messages?sessionId={id}")).is_ok() {
        pump_legacy_stream(&mut writer, &outgoing);
    }
    let _ = writer.finish();
    state.sessions.remove(&id);
    session.cancel_all();
    log::info("legacy SSE stream closed", &[]);
}

/// Forwards the session's messages until the client goes away or every
/// sender is gone: at shutdown `Sessions::end_all` drops the session's
/// outbox, and the calls still running drop theirs once they have answered,
/// so their answers still reach the client.
fn pump_legacy_stream(writer: &mut SseWriter, outgoing: &Receiver<Outgoing>) {
    // A comment every 15 s keeps proxies from closing an idle stream and
    // is how a vanished client is noticed.
    let keepalive = Duration::from_secs(15);
    let mut last_write = Instant::now();
    loop {
        let text = match outgoing.recv_timeout(Duration::from_millis(500)) {
            Ok(Outgoing::Notification(text) | Outgoing::Response { text, .. }) => text,
            Err(RecvTimeoutError::Timeout) if last_write.elapsed() >= keepalive => {
                if writer.comment("keepalive").is_err() {
                    return;
                }
                last_write = Instant::now();
                continue;
            }
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if writer.event(Some("message"), &text).is_err() {
            return;
        }
        last_write = Instant::now();
    }
}

/// `POST /messages?sessionId=…`: the answer travels on the stream; the
/// POST itself only gets 202.
fn legacy_post(state: &Arc<HttpState>, mut request: Request, cors: &Cors) {
    let Some(id) = query_parameter(request.url(), "sessionId").or_else(|| query_parameter(request.url(), "session_id")) else {
        return respond_error(request, 400, "missing sessionId query parameter", &[]);
    };
    let Some((session, outbox)) = state.sessions.legacy(&id) else {
        return respond_error(request, 404, "unknown session; open GET /sse first", &[]);
    };
    let body = match read_body(&mut request, state.max_message_bytes) {
        Ok(body) => body,
        Err(response) => {
            let _ = request.respond(response);
            return;
        }
    };
    state.server.handle(&session, &body, outbox);
    let response = tiny_http::Response::from_string("Accepted").with_status_code(202);
    let _ = request.respond(with_cors(response, cors));
}

fn query_parameter(url: &str, name: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_string())
        .filter(|value| !value.is_empty())
}

// ---------------------------------------------------------------------------
// Sessions.

enum SessionKind {
    /// Lives until DELETE or `MCP_K8S_SESSION_TTL_S` of idleness.
    Streamable,
    /// Lives while its GET /sse stream is open; the outbox feeds it.
    Legacy(Outbox),
}

struct SessionEntry {
    session: Arc<Session>,
    kind: SessionKind,
    last_used: Instant,
}

struct Sessions {
    entries: Mutex<HashMap<String, SessionEntry>>,
    ttl: Duration,
}

impl Sessions {
    fn new(ttl: Duration) -> Sessions {
        Sessions { entries: Mutex::new(HashMap::new()), ttl }
    }

    /// Adds a session under a new unguessable id; `None` when full.
    fn insert(&self, session: Arc<Session>, kind: SessionKind) -> Option<String> {
        let mut entries = self.lock();
        self.sweep(&mut entries);
        if entries.len() >= MAX_SESSIONS {
            log::warn("session limit reached", &[("sessions", json!(entries.len()))]);
            return None;
        }
        let id = new_session_id()?;
        entries.insert(id.clone(), SessionEntry { session, kind, last_used: Instant::now() });
        Some(id)
    }

    fn streamable(&self, id: &str) -> Option<Arc<Session>> {
        let mut entries = self.lock();
        self.sweep(&mut entries);
        let entry = entries.get_mut(id).filter(|entry| matches!(entry.kind, SessionKind::Streamable))?;
        entry.last_used = Instant::now();
        Some(Arc::clone(&entry.session))
    }

    fn legacy(&self, id: &str) -> Option<(Arc<Session>, Outbox)> {
        let entries = self.lock();
        match &entries.get(id)?.kind {
            SessionKind::Legacy(outbox) => Some((Arc::clone(&entries[id].session), outbox.clone())),
            SessionKind::Streamable => None,
        }
    }

    fn remove_streamable(&self, id: &str) -> bool {
        let mut entries = self.lock();
        if !entries.get(id).is_some_and(|entry| matches!(entry.kind, SessionKind::Streamable)) {
            return false;
        }
        if let Some(entry) = entries.remove(id) {
            entry.session.cancel_all();
        }
        true
    }

    fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Ends every session at shutdown: cancels leftovers and closes the
    /// legacy streams (dropping their outboxes).
    fn end_all(&self) {
        for (_, entry) in self.lock().drain() {
            entry.session.cancel_all();
        }
    }

    /// Drops idle Streamable sessions, but never one with a call running.
    fn sweep(&self, entries: &mut HashMap<String, SessionEntry>) {
        let now = Instant::now();
        entries.retain(|_, entry| {
            let expired = matches!(entry.kind, SessionKind::Streamable)
                && now.duration_since(entry.last_used) > self.ttl
                && entry.session.calls_in_flight() == 0;
            if expired {
                log::info("session expired", &[]);
            }
            !expired
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SessionEntry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// 128 random bits as hex: visible ASCII, as the spec requires.
fn new_session_id() -> Option<String> {
    let mut bytes = [0u8; 16];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
        log::error("no randomness for a session id", &[]);
        return None;
    }
    Some(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

// ---------------------------------------------------------------------------
// HTTP helpers.

/// Hand-written `text/event-stream` response, chunked on HTTP/1.1.
struct SseWriter {
    writer: Box<dyn Write + Send>,
    chunked: bool,
}

impl SseWriter {
    fn start(request: Request, headers: &Cors) -> io::Result<SseWriter> {
        let chunked = request.http_version() != &tiny_http::HTTPVersion(1, 0);
        let mut head = String::from("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n");
        // Proxies such as nginx buffer event streams unless told not to.
        head.push_str("X-Accel-Buffering: no\r\n");
        head.push_str(if chunked { "Transfer-Encoding: chunked\r\n" } else { "Connection: close\r\n" });
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let mut writer = request.into_writer();
        writer.write_all(head.as_bytes())?;
        writer.flush()?;
        Ok(SseWriter { writer, chunked })
    }

    /// One event; `data` is one line (our JSON never contains newlines).
    fn event(&mut self, event: Option<&str>, data: &str) -> io::Result<()> {
        let mut text = String::new();
        if let Some(event) = event {
            text.push_str(&format!("event: {event}\n"));
        }
        text.push_str(&format!("data: {data}\n\n"));
        self.write_chunk(text.as_bytes())
    }

    fn comment(&mut self, comment: &str) -> io::Result<()> {
        self.write_chunk(format!(": {comment}\n\n").as_bytes())
    }

    fn write_chunk(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.chunked {
            write!(self.writer, "{:x}\r\n", bytes.len())?;
            self.writer.write_all(bytes)?;
            self.writer.write_all(b"\r\n")?;
        } else {
            self.writer.write_all(bytes)?;
        }
        self.writer.flush()
    }

    fn finish(mut self) -> io::Result<()> {
        if self.chunked {
            self.writer.write_all(b"0\r\n\r\n")?;
        }
        self.writer.flush()
    }
}

/// Reads the body up to `max` bytes. Refuses early on a declared length
/// over the cap, so a huge upload is never read.
fn read_body(request: &mut Request, max: usize) -> Result<String, tiny_http::Response<io::Cursor<Vec<u8>>>> {
    let too_large = || {
        log::warn("message too large", &[("limit_bytes", json!(max))]);
        let message = format!("message exceeds {max} bytes; raise MCP_K8S_MAX_MESSAGE_BYTES");
        error_response(413, &message, &[])
    };
    if let Some(content_type) = header(request, "Content-Type") {
        let media_type = content_type.split(';').next().unwrap_or("").trim();
        if !media_type.eq_ignore_ascii_case("application/json") {
            return Err(error_response(415, &format!("Content-Type must be application/json, not `{media_type}`"), &[]));
        }
    }
    if request.body_length().is_some_and(|length| length > max) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    if let Err(error) = request.as_reader().take(limit).read_to_end(&mut body) {
        return Err(error_response(400, &format!("could not read the body: {error}"), &[]));
    }
    if body.len() > max {
        return Err(too_large());
    }
    String::from_utf8(body).map_err(|_| {
        let text = Response::error(None, ErrorCode::ParseError, "parse error: body is not UTF-8").to_json().to_string();
        json_response(400, text)
    })
}

fn header<'a>(request: &'a Request, name: &str) -> Option<&'a str> {
    request.headers().iter().find(|header| header.field.as_str().as_str().eq_ignore_ascii_case(name)).map(|header| header.value.as_str())
}

/// Whether `Accept` lists `media_type` (or `*/*`). A missing Accept
/// accepts anything.
fn accepts(request: &Request, media_type: &str) -> bool {
    let Some(accept) = header(request, "Accept") else {
        return true;
    };
    accept
        .split(',')
        .map(|item| item.split(';').next().unwrap_or("").trim())
        .any(|item| item.eq_ignore_ascii_case(media_type) || item == "*/*")
}

fn json_response(status: u16, text: String) -> tiny_http::Response<io::Cursor<Vec<u8>>> {
    with_headers(tiny_http::Response::from_string(text).with_status_code(status), &[("Content-Type", "application/json")])
}

/// A transport-level refusal: HTTP status plus a JSON-RPC error body
/// without an id, which both SDKs can show to a user.
fn error_response(status: u16, message: &str, headers: &[(&str, &str)]) -> tiny_http::Response<io::Cursor<Vec<u8>>> {
    let text = Response::error(None, ErrorCode::InvalidRequest, message).to_json().to_string();
    with_headers(json_response(status, text), headers)
}

fn respond_error(request: Request, status: u16, message: &str, headers: &[(&str, &str)]) {
    let _ = request.respond(error_response(status, message, headers));
}

fn with_cors<R: Read>(response: tiny_http::Response<R>, cors: &Cors) -> tiny_http::Response<R> {
    let pairs: Vec<(&str, &str)> = cors.iter().map(|(name, value)| (*name, value.as_str())).collect();
    with_headers(response, &pairs)
}

fn with_headers<R: Read>(mut response: tiny_http::Response<R>, headers: &[(&str, &str)]) -> tiny_http::Response<R> {
    for (name, value) in headers {
        // Values come from us or from request headers that already parsed
        // as headers; one that does not convert is dropped, not fatal.
        if let Ok(header) = Header::from_bytes(name.as_bytes(), value.as_bytes()) {
            response.add_header(header);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_authorities() {
        let cases = [
            ("localhost", true),
            ("localhost:8080", true),
            ("127.0.0.1:1", true),
            ("[::1]:3000", true),
            ("[::1]", true),
            ("LOCALHOST:80", true),
            ("evil.example.com", false),
            ("127.0.0.1.evil.com", false),
            ("localhost.evil.com:80", false),
            ("[::2]:80", false),
            ("", false),
        ];
        for (authority, expected) in cases {
            assert_eq!(is_loopback_authority(authority), expected, "{authority}");
        }
    }

    #[test]
    fn origins() {
        let allowed = vec!["https://app.example.com".to_string()];
        let cases = [
            ("http://localhost:6274", true),
            ("https://127.0.0.1", true),
            ("http://[::1]:80", true),
            ("https://app.example.com", true),
            ("https://APP.example.com", true),
            ("https://app.example.com:444", false),
            ("http://evil.example.com", false),
            ("null", false),
            ("file://localhost", false),
            ("http://localhost/path", false),
        ];
        for (origin, expected) in cases {
            assert_eq!(origin_allowed(origin, &allowed), expected, "{origin}");
        }
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3creT"));
        assert!(!constant_time_eq(b"s3cret", b"s3cre"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn query_parameters() {
        assert_eq!(query_parameter("/messages?sessionId=abc", "sessionId").as_deref(), Some("abc"));
        assert_eq!(query_parameter("/messages?x=1&sessionId=abc&y", "sessionId").as_deref(), Some("abc"));
        assert_eq!(query_parameter("/messages?sessionId=", "sessionId"), None);
        assert_eq!(query_parameter("/messages", "sessionId"), None);
    }
}
