//! Which handler answers a request: the probes (`/healthz`, `/readyz`,
//! `/metrics`, with GET or HEAD and no token), the MCP endpoints (`/mcp`,
//! `/sse`, `/messages`, behind the access checks), CORS preflight, and the
//! 404 and 405 answers that name what would have worked. What the MCP
//! endpoints do is `mcp`'s; the error body is `response`'s.

use std::sync::Arc;

use super::HttpState;
use super::access;
use super::conn::{Conn, answer};
use super::head::{Head, Method};
use super::mcp;
use super::response::{Response, error_response};
use crate::supervise;

/// Answers one request on a regular connection.
pub fn route(state: &Arc<HttpState>, conn: &mut Conn, head: &Head) {
    if let Some(expect) = head.header("Expect")
        && !expect.eq_ignore_ascii_case("100-continue")
    {
        let message = format!("Expect `{expect}` is not supported; only 100-continue is");
        return answer(conn, head, error_response(417, &message));
    }
    match head.path() {
        "/healthz" | "/readyz" | "/metrics" => answer(conn, head, probe(state, head)),
        "/mcp" | "/sse" | "/messages" => mcp_endpoint(state, conn, head),
        _ => answer(conn, head, error_response(404, "not found; the MCP endpoint is /mcp (or /sse for legacy clients)")),
    }
}

/// Answers one request on a connection of the probe reserve, taken when
/// every regular connection is in use: probes only.
pub fn route_probe_only(state: &Arc<HttpState>, conn: &mut Conn, head: &Head) {
    let response = probe_only(state, head);
    answer(conn, head, response);
}

/// Answers one request on the probes' own listener (MCP_K8S_PROBE_ADDR).
pub fn route_probe_port(state: &Arc<HttpState>, conn: &mut Conn, head: &Head) {
    let response = match head.path() {
        "/healthz" | "/readyz" | "/metrics" => probe(state, head),
        _ => error_response(404, "not found; this port answers /healthz, /readyz and /metrics only; MCP is served on MCP_K8S_ADDR"),
    };
    answer(conn, head, response);
}

/// The probe's answer, or the 503 of a full server for any other request.
pub fn probe_only(state: &HttpState, head: &Head) -> Response {
    match head.path() {
        "/healthz" | "/readyz" | "/metrics" => probe(state, head),
        _ => connection_limit_response(state.max_connections),
    }
}

/// The 503 for a connection beyond `MCP_K8S_MAX_CONNECTIONS`.
pub fn connection_limit_response(max_connections: usize) -> Response {
    let message = format!("all {max_connections} connections are in use; retry shortly or raise MCP_K8S_MAX_CONNECTIONS");
    error_response(503, &message).with_header("Retry-After", "1")
}

/// `/healthz` (always 200), `/readyz` (503 once shutting down, once a
/// panic ended an essential thread, which it names: the server can no
/// longer do its whole job, and only a restart brings the thread back; or
/// while no site can run a job, saying why: `tools::readiness`, whose
/// asks are shared and bounded, so a probe never waits long nor starts a
/// thread of its own)
/// and `/metrics`: counters only, no caller data, so no token, like the
/// probes (a Prometheus scrape needs no MCP credentials).
fn probe(state: &HttpState, head: &Head) -> Response {
    if !matches!(head.method, Method::Get | Method::Head) {
        return method_not_allowed(head, "use GET or HEAD", "GET, HEAD");
    }
    match head.path() {
        "/healthz" => Response::new(200, "text/plain; charset=utf-8", "ok\n"),
        "/readyz" if state.stop.is_cancelled() => Response::new(503, "text/plain; charset=utf-8", "shutting down\n"),
        "/readyz" => match (supervise::lost_essential_threads(), state.server.readiness()) {
            (lost, _) if !lost.is_empty() => {
                Response::new(503, "text/plain; charset=utf-8", format!("essential thread stopped by a panic: {}\n", lost.join(", ")))
            }
            (_, Err(why)) => Response::new(503, "text/plain; charset=utf-8", format!("not ready: {why}\n")),
            (_, Ok(())) => Response::new(200, "text/plain; charset=utf-8", "ready\n"),
        },
        _ => Response::new(200, crate::metrics::CONTENT_TYPE, crate::metrics::render()),
    }
}

fn mcp_endpoint(state: &Arc<HttpState>, conn: &mut Conn, head: &Head) {
    if head.method == Method::Options {
        return answer(conn, head, access::preflight(&state.access, head));
    }
    let (cors, caller) = match access::check(&state.access, head) {
        Ok(checked) => checked,
        Err(response) => return answer(conn, head, response),
    };
    let cors = &mcp::Checked { cors, caller };
    match (head.path(), &head.method) {
        ("/mcp", Method::Post) => mcp::post(state, conn, head, cors),
        ("/mcp", Method::Delete) => mcp::delete(state, conn, head, cors),
        // No server-initiated stream: 405 is what the spec allows and
        // what clients expect (never 404 or 400).
        ("/mcp", _) => answer(conn, head, method_not_allowed(head, "POST messages instead", "POST, DELETE")),
        ("/sse", Method::Get) => mcp::legacy_stream(state, conn, head, cors),
        ("/sse", _) => answer(conn, head, method_not_allowed(head, "open the stream with GET", "GET")),
        ("/messages", Method::Post) => mcp::legacy_post(state, conn, head, cors),
        (_, _) => answer(conn, head, method_not_allowed(head, "POST messages instead", "POST")),
    }
}

/// 405 naming the method that was used and, in `Allow`, the ones that work.
fn method_not_allowed(head: &Head, hint: &str, allow: &'static str) -> Response {
    let method: String = head.method.as_str().chars().take(32).collect();
    let message = format!("{method} is not supported on {}; {hint}", head.path());
    error_response(405, &message).with_header("Allow", allow)
}
