//! The MCP endpoints. Streamable HTTP (revisions 2025-03-26 to
//! 2025-11-25): `POST /mcp` hands one message to `protocol::Server::handle`
//! and answers `application/json`, or `text/event-stream` once the request
//! produces notifications or runs past `STREAM_AFTER` (then keepalive
//! comments flow until the answer); `DELETE /mcp` ends a session. Legacy
//! HTTP+SSE (2024-11-05): `GET /sse` opens a session whose answers all flow
//! on that stream, `POST /messages?sessionId=` feeds it.
//!
//! This file owns the HTTP side of messages: bodies (media type, size,
//! UTF-8), `Mcp-Session-Id` and `MCP-Protocol-Version`, status codes. It
//! never looks inside a message.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::access::Cors;
use super::budget::Reservation;
use super::conn::{BodyError, Conn, UNBUDGETED_BYTES, answer};
use super::head::Head;
use super::response::{Response, error_response};
use super::sessions::SessionKind;
use super::socket;
use super::sse::{ANSWER_KEEPALIVE, End, SESSION_KEEPALIVE, SseStream, TICK};
use super::{BUDGET_WAIT, HttpState};
use crate::callers;
use crate::log;
use crate::protocol::era::Era;
use crate::protocol::jsonrpc::{self, ErrorCode};
use crate::protocol::modern::RequestHeaders;
use crate::protocol::scan;
use crate::protocol::{Dispatch, Outgoing, SUPPORTED_VERSIONS, Session};

/// A POSTed request whose answer has not come within this, from a client
/// that accepts `text/event-stream`, is answered as an event stream so
/// that keepalive comments can flow while the call runs: until then the
/// client receives nothing, and a client with a read timeout (httpx's
/// default is 5 s) gives up on a call that is still running. Quick answers (ping, tools/list, describe_environment)
/// stay plain JSON. A second leaves more than 3 s of a 5 s read timeout
/// for the response head and the first comment.
const STREAM_AFTER: Duration = Duration::from_secs(1);

/// What the access checks let through: the CORS headers to answer with
/// and who calls.
pub struct Checked {
    pub cors: Cors,
    pub caller: Arc<callers::Caller>,
}

/// `POST /mcp`.
pub fn post(state: &HttpState, conn: &mut Conn, head: &Head, checked: &Checked) {
    let cors = &checked.cors;
    let (body, reservation) = match read_message(state, conn, head) {
        Ok(message) => message,
        Err(response) => return answer(conn, head, response),
    };
    // Without Mcp-Session-Id the message may only be `initialize` (or a
    // session-less ping or probe): it gets a fresh session that is kept
    // only if initialize succeeds.
    let (session, session_id) = match head.header("Mcp-Session-Id") {
        Some(id) => match state.sessions.streamable(id, &checked.caller) {
            Some(session) => (session, Some(id.to_string())),
            None => return answer(conn, head, error_response(404, "unknown or expired session; initialize a new one")),
        },
        // Revision 2026-07-28 has no sessions: its requests come this way
        // too, with the headers the protocol checks against the body.
        None => (Arc::new(Session::for_http_request(request_headers(head), Arc::clone(&checked.caller))), None),
    };
    if session_id.is_some()
        && let Err(message) = check_protocol_version(head)
    {
        return answer(conn, head, error_response(400, &message));
    }
    let (outbox, replies) = mpsc::channel();
    let dispatch = state.server.handle(&session, &body, outbox);
    // Parsed: the bytes and their share of the budget are not needed while
    // a call runs.
    drop((body, reservation));
    match dispatch {
        // A 2026-07-28 notification needs no session.
        Dispatch::Accepted if session_id.is_none() && names_modern_version(head) => {
            answer(conn, head, Response::empty(202).with_headers(cors));
        }
        Dispatch::Accepted if session_id.is_none() => {
            answer(conn, head, error_response(400, "missing Mcp-Session-Id header; initialize a session first"));
        }
        Dispatch::Accepted => answer(conn, head, Response::empty(202).with_headers(cors)),
        Dispatch::Reply => {
            let mut headers = cors.clone();
            let new_session = session_id.is_none() && session.protocol_version().is_some();
            if new_session {
                match state.sessions.insert(Arc::clone(&session), SessionKind::Streamable) {
                    Ok(id) => headers.push(("Mcp-Session-Id", id)),
                    Err(error) => return answer(conn, head, error_response(503, &error.to_string())),
                }
            }
            let modern = session_id.is_none() && session.era() == Some(Era::Modern);
            let reply = Reply {
                headers,
                wants_sse: accepts(head, "text/event-stream"),
                outside_session: session_id.is_none() && !new_session,
                stateless: modern.then(|| Arc::clone(&session)),
                max_queued_bytes: state.max_reply_queue_bytes,
            };
            reply.send(conn, head, &replies);
        }
    }
}

/// `DELETE /mcp`.
pub fn delete(state: &HttpState, conn: &mut Conn, head: &Head, checked: &Checked) {
    let cors = &checked.cors;
    let Some(id) = head.header("Mcp-Session-Id") else {
        return answer(conn, head, error_response(400, "missing Mcp-Session-Id header"));
    };
    if state.sessions.remove_streamable(id, &checked.caller) {
        log::info("session ended by client", &[]);
        answer(conn, head, Response::empty(204).with_headers(cors));
    } else {
        answer(conn, head, error_response(404, "unknown or expired session"));
    }
}

/// `GET /sse`: opens a session whose messages all flow on this stream.
pub fn legacy_stream(state: &HttpState, conn: &mut Conn, head: &Head, checked: &Checked) {
    let cors = &checked.cors;
    let session = Arc::new(Session::new(Arc::clone(&checked.caller)));
    let (outbox, outgoing) = mpsc::channel();
    let id = match state.sessions.insert(Arc::clone(&session), SessionKind::Legacy(outbox)) {
        Ok(id) => id,
        Err(error) => return answer(conn, head, error_response(503, &error.to_string())),
    };
    let Ok(mut stream) = SseStream::start(conn, head, cors, state.max_reply_queue_bytes, SESSION_KEEPALIVE) else {
        state.sessions.remove(&id);
        return;
    };
    log::info("legacy SSE stream opened", &[]);
    // Forwards the session's messages until the client goes away or every
    // sender is gone: at shutdown `Sessions::end_all` drops the session's
    // outbox, and the calls still running drop theirs once they have
    // answered, so their answers still reach the client.
    let end = match stream.queue_event(Some("endpoint"), &format!("/messages?sessionId={id}")) {
        Ok(()) => stream.pump(&outgoing, Some("message"), false),
        Err(end) => end,
    };
    state.sessions.remove(&id);
    // Whatever still runs for this session has nobody to answer.
    session.cancel_all();
    log_stream_end("legacy SSE stream closed", end);
}

/// `POST /messages?sessionId=…`: the answer travels on the stream; the
/// POST itself only gets 202.
pub fn legacy_post(state: &HttpState, conn: &mut Conn, head: &Head, checked: &Checked) {
    let cors = &checked.cors;
    let query = head.query().unwrap_or("");
    let Some(id) = query_parameter(query, "sessionId").or_else(|| query_parameter(query, "session_id")) else {
        return answer(conn, head, error_response(400, "missing sessionId query parameter"));
    };
    let Some((session, outbox)) = state.sessions.legacy(id, &checked.caller) else {
        return answer(conn, head, error_response(404, "unknown session; open GET /sse first"));
    };
    let (body, _reservation) = match read_message(state, conn, head) {
        Ok(message) => message,
        Err(response) => return answer(conn, head, response),
    };
    state.server.handle(&session, &body, outbox);
    answer(conn, head, Response::new(202, "text/plain; charset=utf-8", "Accepted").with_headers(cors));
}

/// How to answer one POSTed request once its messages come in.
struct Reply {
    headers: Cors,
    wants_sse: bool,
    /// A request made without a session that did not create one: its
    /// errors are answered with 400, so probing clients see a 4xx.
    outside_session: bool,
    /// A 2026-07-28 request: its session is its own. Errors get the
    /// spec's status codes, and a client that closes the connection
    /// cancels the request (the era has no `notifications/cancelled` over
    /// HTTP).
    stateless: Option<Arc<Session>>,
    max_queued_bytes: usize,
}

impl Reply {
    /// Answers with `application/json` when the response comes first, or
    /// switches to `text/event-stream` at the first notification or after
    /// `STREAM_AFTER`, whichever comes first. A client that accepts only
    /// JSON waits for the response. A client that leaves meanwhile is
    /// noticed within a tick, freeing its connection; its call goes on (a
    /// disconnect is not a cancellation).
    fn send(self, conn: &mut Conn, head: &Head, replies: &Receiver<Outgoing>) {
        let started = Instant::now();
        loop {
            match replies.recv_timeout(TICK) {
                Ok(Outgoing::Response { text, error }) => {
                    let status = match (error, &self.stateless) {
                        (Some(code), Some(_)) => modern_status(code),
                        (Some(_), None) if self.outside_session => 400,
                        _ => 200,
                    };
                    return answer(conn, head, Response::json(status, text).with_headers(&self.headers));
                }
                Ok(Outgoing::Notification(_)) if !self.wants_sse => {}
                Ok(Outgoing::Notification(text)) => return self.stream(conn, head, replies, Some(&text)),
                Err(RecvTimeoutError::Timeout) if socket::peer_closed(conn.socket()) => {
                    log::debug("client left before its answer", &[]);
                    self.cancel_if_stateless();
                    conn.close_after();
                    return;
                }
                Err(RecvTimeoutError::Timeout) if self.wants_sse && started.elapsed() >= STREAM_AFTER => {
                    return self.stream(conn, head, replies, None);
                }
                Err(RecvTimeoutError::Timeout) => {}
                // Every sender is gone without a response: the client
                // cancelled the request.
                Err(RecvTimeoutError::Disconnected) => return answer(conn, head, Response::empty(202).with_headers(&self.headers)),
            }
        }
    }

    /// Answers as an event stream: `first` (the notification that made
    /// the switch, if one did), then every message up to the response,
    /// with a comment every `ANSWER_KEEPALIVE` while nothing else comes.
    fn stream(&self, conn: &mut Conn, head: &Head, replies: &Receiver<Outgoing>, first: Option<&str>) {
        let Ok(mut stream) = SseStream::start(conn, head, &self.headers, self.max_queued_bytes, ANSWER_KEEPALIVE) else {
            return;
        };
        let queued = match first {
            Some(text) => stream.queue_event(None, text),
            None => Ok(()),
        };
        let end = match queued {
            Ok(()) => stream.pump(replies, None, true),
            Err(end) => end,
        };
        if end != End::Finished {
            log_stream_end("answer stream ended early", end);
            self.cancel_if_stateless();
        }
    }

    /// Revision 2026-07-28 over HTTP: closing the stream is the cancel.
    /// A handshake-era disconnect is not (the call goes on, as before).
    fn cancel_if_stateless(&self) {
        if let Some(session) = &self.stateless {
            if session.calls_in_flight() > 0 {
                log::info("call cancelled: the client closed its stream", &[]);
            }
            session.cancel_all();
        }
    }
}

/// The status of a 2026-07-28 error response (Streamable HTTP, "Error
/// handling"): a method the server lacks is 404, a request the client must
/// change 400, a failure of the server 500.
fn modern_status(code: ErrorCode) -> u16 {
    match code {
        ErrorCode::MethodNotFound => 404,
        ErrorCode::InternalError => 500,
        ErrorCode::ParseError
        | ErrorCode::InvalidRequest
        | ErrorCode::InvalidParams
        // Not sent in this era (a missing resource is -32602 there).
        | ErrorCode::ResourceNotFound
        | ErrorCode::HeaderMismatch
        | ErrorCode::MissingRequiredClientCapability
        | ErrorCode::UnsupportedProtocolVersion => 400,
    }
}

/// The headers a 2026-07-28 request must repeat from its body.
fn request_headers(head: &Head) -> RequestHeaders {
    let header = |name: &str| head.header(name).map(str::to_string);
    const PARAM: &str = "mcp-param-";
    let params = head
        .headers
        .iter()
        .filter(|(name, _)| {
            name.len() > PARAM.len() && name.is_char_boundary(PARAM.len()) && name[..PARAM.len()].eq_ignore_ascii_case(PARAM)
        })
        .map(|(name, value)| (name[PARAM.len()..].to_string(), value.clone()))
        .collect();
    RequestHeaders { protocol_version: header("MCP-Protocol-Version"), method: header("Mcp-Method"), name: header("Mcp-Name"), params }
}

/// Whether `MCP-Protocol-Version` names a revision past the handshake era.
fn names_modern_version(head: &Head) -> bool {
    head.header("MCP-Protocol-Version").is_some_and(|version| !SUPPORTED_VERSIONS.contains(&version.trim()))
}

fn log_stream_end(message: &str, end: End) {
    if end == End::Finished || end == End::ClientGone {
        log::info(message, &[("reason", serde_json::json!(end.as_str()))]);
    } else {
        log::warn(message, &[("reason", serde_json::json!(end.as_str()))]);
    }
}

/// The body as text, within the size cap and the shared budget. The
/// reservation covers the text and what parsing it will cost
/// (`scan::parsed_cost_of`: its values can take several times its bytes),
/// and must be kept until the message is parsed.
fn read_message(state: &HttpState, conn: &mut Conn, head: &Head) -> Result<(String, Reservation), Response> {
    if let Some(content_type) = head.header("Content-Type") {
        let media_type = content_type.split(';').next().unwrap_or("").trim();
        if !media_type.eq_ignore_ascii_case("application/json") {
            let shown: String = media_type.chars().take(64).collect();
            return Err(error_response(415, &format!("Content-Type must be application/json, not `{shown}`")));
        }
    }
    let (body, reservation) = conn.read_body(head, &state.budget).map_err(|error| {
        log::warn(
            "request body refused",
            &[("status", serde_json::json!(error.status())), ("error", serde_json::json!(error.to_string()))],
        );
        error_response(error.status(), &error.to_string())
    })?;
    match String::from_utf8(body) {
        Ok(text) => {
            let mut reservation = reservation;
            let needed = text.len().saturating_add(scan::parsed_cost_of(&text));
            if needed > UNBUDGETED_BYTES && !reservation.grow_to(needed, BUDGET_WAIT) {
                let error = BodyError::Busy { budget: state.budget.total() };
                return Err(error_response(error.status(), &error.to_string()));
            }
            Ok((text, reservation))
        }
        Err(_) => {
            let text = jsonrpc::Response::error(None, ErrorCode::ParseError, "parse error: body is not UTF-8").to_json().to_string();
            Err(Response::json(400, text))
        }
    }
}

/// A present `MCP-Protocol-Version` must name a revision we speak; an
/// absent one means 2025-03-26, which we do.
fn check_protocol_version(head: &Head) -> Result<(), String> {
    match head.header("MCP-Protocol-Version") {
        Some(version) if !SUPPORTED_VERSIONS.contains(&version.trim()) => {
            let shown: String = version.chars().take(64).collect();
            Err(format!("unsupported MCP-Protocol-Version `{shown}`; supported: {}", SUPPORTED_VERSIONS.join(", ")))
        }
        _ => Ok(()),
    }
}

/// Whether `Accept` lists `media_type` (or `*/*`). A missing Accept
/// accepts anything.
fn accepts(head: &Head, media_type: &str) -> bool {
    let Some(accept) = head.header("Accept") else {
        return true;
    };
    accept
        .split(',')
        .map(|item| item.split(';').next().unwrap_or("").trim())
        .any(|item| item.eq_ignore_ascii_case(media_type) || item == "*/*")
}

fn query_parameter<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters() {
        assert_eq!(query_parameter("sessionId=abc", "sessionId"), Some("abc"));
        assert_eq!(query_parameter("x=1&sessionId=abc&y", "sessionId"), Some("abc"));
        assert_eq!(query_parameter("sessionId=", "sessionId"), None);
        assert_eq!(query_parameter("", "sessionId"), None);
    }
}
