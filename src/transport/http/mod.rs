//! The HTTP transports on one listener of our own (std only, a thread per
//! connection): Streamable HTTP at `/mcp`, legacy HTTP+SSE at `GET /sse` +
//! `POST /messages?sessionId=`, and `/healthz`, `/readyz`, `/metrics`.
//!
//! This file accepts connections and shuts down. The accept loop never
//! waits on a client: past `MCP_K8S_MAX_CONNECTIONS` a small reserve of
//! connections serves only the probes (so liveness holds while every slot
//! is taken), and beyond that a 503 is written without blocking and the
//! connection closed. With MCP_K8S_PROBE_ADDR the probes also get a
//! listener of their own, with its own accept thread and backlog, which a
//! flood on the MCP port cannot reach.
//! A connection that only waits for a request head gives up its slot to a
//! newcomer when all are taken (`waiting`; its client is sent a 503 to
//! retry), so idle and slowloris floods cannot hold them; so does one
//! blocked writing answers its client does not read (pipelined requests
//! whose answers nobody takes). `head` parses request heads, `conn` reads and writes
//! one connection under its bounds, `response` is an answer and its bytes
//! (and the error body every refusal uses), `routes` picks the handler, `access`
//! checks who may call, `mcp` serves the MCP endpoints, `sessions` keeps
//! sessions, `sse` writes event streams, `budget` counts shared bytes and
//! connections, `waiting` lists connections that may be evicted, `socket`
//! has the calls std lacks. Messages go to
//! `protocol::Server::handle` untouched.
//!
//! tiny_http was replaced by this server: 0.12.0, its newest
//! release, allocates a body's declared length when dropping an unread
//! request, so one `Content-Length: 1125899906842624` aborted the process,
//! and it bounds neither heads, connections nor time.

pub mod head;

mod access;
mod budget;
mod conn;
mod mcp;
mod response;
mod routes;
mod sessions;
mod socket;
mod sse;
mod waiting;

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cancel::CancelToken;
use crate::config::Config;
use crate::log;
use crate::protocol::Server;
use crate::supervise;
use budget::{Budget, Counter, CounterGuard};
use conn::{Conn, ConnLimits, Next};
use head::HeadLimits;
use sessions::Sessions;
use socket::Readiness;
use waiting::{EvictAfter, Seat, Waiting};

/// Connections kept beyond `MCP_K8S_MAX_CONNECTIONS` for the probes alone,
/// one request each.
const PROBE_RESERVE: usize = 16;

/// How long a connection waits for its request head before a newcomer
/// may take its slot: time for a client that has just connected to write
/// its request, even on a loaded machine (a probe was evicted 4 ms after
/// it connected), and short beside the time a flood takes to fill every
/// slot, so that a probe during one still finds a slot to take.
const EVICT_AFTER: Duration = Duration::from_millis(50);
/// How long a connection blocked writing an answer its client takes none
/// of waits before a newcomer may take its slot: a client that pipelines
/// requests and reads no answer never takes any, while one reading a large
/// answer over a slow link pauses for less than this between the bytes it
/// takes.
const EVICT_BLOCKED_AFTER: Duration = Duration::from_secs(1);
/// How long a probe connection may take to send its head: kubelet and
/// Prometheus send theirs at once.
const PROBE_HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections the kernel holds for the accept loop. std's 128 made a
/// burst of 1,200 connections wait in SYN retries (a `/healthz` took
/// 1.4 s); the kernel caps this at net.core.somaxconn (4096 by default
/// since Linux 5.4). The accept loop admits or refuses each at once, so a
/// full queue is only ever a burst.
const LISTEN_BACKLOG: libc::c_int = 4096;

/// How long a body waits for room in `MCP_K8S_BODY_BUDGET_BYTES` before 503.
pub(super) const BUDGET_WAIT: Duration = Duration::from_secs(5);

/// Serves until `stop` is cancelled, then stops accepting, lets in-flight
/// calls finish within the grace period and closes the SSE streams.
pub fn serve(server: Arc<Server>, config: &Config, stop: CancelToken) -> io::Result<()> {
    let listener = socket::listen(config.addr, LISTEN_BACKLOG)?;
    // Non-blocking, so that accept never waits once poll said "ready"
    // (the client may have gone in between).
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr().map_or_else(|_| config.addr.to_string(), |addr| addr.to_string());
    let state = Arc::new(HttpState::new(Arc::clone(&server), config, stop.clone()));
    // Before `listening`, which says the server is up.
    let probe_listener = match config.probe_addr {
        Some(addr) => Some(start_probe_listener(&state, addr)?),
        None => None,
    };
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
    while !stop.is_cancelled() {
        match socket::wait(&listener, Readiness::Readable, Duration::from_millis(200)) {
            Ok(true) => accept_ready(&state, &listener),
            Ok(false) => {}
            Err(error) => {
                log::warn("waiting for connections failed", &[("error", json!(error.to_string()))]);
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
    // Dropping the listener closes the socket: no new connections. The
    // probes' listener ends within its wait, answering "shutting down"
    // until then.
    drop(listener);
    if let Some(probe_listener) = probe_listener {
        let _ = probe_listener.join();
    }
    log::info("shutting down", &[("grace_s", json!(config.shutdown_grace_s))]);
    let still_running = server.shut_down(Duration::from_secs(config.shutdown_grace_s), Duration::from_secs(5));
    if still_running > 0 {
        log::warn("calls did not stop in time", &[("calls", json!(still_running))]);
    }
    state.sessions.end_all();
    // Give request threads a moment to write what the calls returned. Idle
    // keep-alive connections are not waited for: they end with the process.
    let deadline = Instant::now() + Duration::from_secs(5);
    while state.requests.in_use() > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// What every connection thread shares.
struct HttpState {
    server: Arc<Server>,
    sessions: Sessions,
    access: access::Access,
    limits: ConnLimits,
    budget: Arc<Budget>,
    max_connections: usize,
    max_reply_queue_bytes: usize,
    stop: CancelToken,
    /// Regular connections open, at most `max_connections`.
    connections: Arc<Counter>,
    /// Connections of the probe reserve open, at most `PROBE_RESERVE`.
    probe_connections: Arc<Counter>,
    /// Regular connections waiting for a request head: evicted, oldest
    /// first, when a newcomer finds every slot taken.
    waiting: Arc<Waiting>,
    /// Requests being answered (not idle connections), for shutdown.
    requests: Arc<Counter>,
}

impl HttpState {
    fn new(server: Arc<Server>, config: &Config, stop: CancelToken) -> HttpState {
        let limits = &config.http_limits;
        HttpState {
            server,
            sessions: Sessions::new(Duration::from_secs(config.session_ttl_s), limits.max_sessions),
            access: access::Access {
                auth_token: config.auth_token.as_ref().map(|token| token.0.clone()),
                callers: config.callers.clone(),
                whole_server: access::Access::whole_server_caller(config.auth_token.as_ref().map(|token| token.0.as_str())),
                allowed_origins: config.allowed_origins.clone(),
                check_host: config.binds_loopback(),
            },
            limits: ConnLimits {
                head: HeadLimits { max_bytes: limits.max_header_bytes, max_headers: limits.max_headers },
                max_body_bytes: config.max_message_bytes,
                head_timeout: Duration::from_secs(limits.head_timeout_s),
                body_timeout: Duration::from_secs(limits.body_timeout_s),
                idle_timeout: Duration::from_secs(limits.idle_timeout_s),
                write_timeout: Duration::from_secs(limits.write_timeout_s),
                budget_wait: BUDGET_WAIT,
                keep_alive: true,
            },
            budget: Budget::new(limits.body_budget_bytes),
            max_connections: limits.max_connections,
            max_reply_queue_bytes: config.max_reply_queue_bytes,
            stop,
            connections: Arc::new(Counter::default()),
            probe_connections: Arc::new(Counter::default()),
            waiting: Arc::new(Waiting::default()),
            requests: Arc::new(Counter::default()),
        }
    }
}

/// Which kind of connection a thread serves.
#[derive(Clone, Copy)]
enum Lane {
    Regular,
    /// The probe reserve: probes only, a short head timeout, no keep-alive.
    Probes,
    /// The probes' own listener (MCP_K8S_PROBE_ADDR): probes only, as the
    /// reserve, and a 404 that points anything else at the MCP port.
    ProbePort,
}

/// Connections the probes' own listener serves at once: the kubelet's two
/// probes and a scrape, several times over.
const PROBE_PORT_CONNECTIONS: usize = 16;

/// MCP_K8S_PROBE_ADDR: binds the probes' listener (an error stops the
/// start, as MCP_K8S_ADDR's does) and accepts on a thread of its own, so
/// that a flood on the MCP port, its accept loop or its backlog never
/// stands between the kubelet and `/healthz`.
fn start_probe_listener(state: &Arc<HttpState>, addr: SocketAddr) -> io::Result<thread::JoinHandle<()>> {
    let listener = socket::listen(addr, LISTEN_BACKLOG)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr().map_or_else(|_| addr.to_string(), |addr| addr.to_string());
    log::info("listening for probes", &[("addr", json!(bound)), ("endpoints", json!(["/healthz", "/readyz", "/metrics"]))]);
    let state = Arc::clone(state);
    supervise::spawn(supervise::Kind::ProbeListener, move || {
        let connections = Arc::new(Counter::default());
        while !state.stop.is_cancelled() {
            match socket::wait(&listener, Readiness::Readable, Duration::from_millis(200)) {
                Ok(true) => accept_probes(&state, &listener, &connections),
                Ok(false) => {}
                Err(error) => {
                    log::warn("waiting for probe connections failed", &[("error", json!(error.to_string()))]);
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
    })
}

/// Accepts every probe connection waiting: a thread each up to
/// `PROBE_PORT_CONNECTIONS`, beyond that an answer only to a head that has
/// already arrived.
fn accept_probes(state: &Arc<HttpState>, listener: &TcpListener, connections: &Arc<Counter>) {
    loop {
        let socket = match listener.accept() {
            Ok((socket, _)) => socket,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                log::warn("accepting a probe connection failed", &[("error", json!(error.to_string()))]);
                thread::sleep(Duration::from_millis(50));
                return;
            }
        };
        if socket.set_nonblocking(false).is_err() {
            continue;
        }
        let _ = socket.set_nodelay(true);
        let Some(slot) = connections.try_take(PROBE_PORT_CONNECTIONS) else {
            refuse_without_blocking(state, socket);
            continue;
        };
        let thread_state = Arc::clone(state);
        let spawned =
            supervise::spawn(supervise::Kind::HttpConnection, move || serve_connection(&thread_state, socket, Lane::ProbePort, slot));
        if let Err(error) = spawned {
            log::error("could not start a probe connection thread", &[("error", json!(error.to_string()))]);
        }
    }
}

/// Accepts every connection that is waiting, without blocking.
fn accept_ready(state: &Arc<HttpState>, listener: &TcpListener) {
    loop {
        match listener.accept() {
            Ok((socket, _)) => admit(state, socket),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => {
                // Out of file descriptors, typically: let some close.
                log::warn("accepting a connection failed", &[("error", json!(error.to_string()))]);
                thread::sleep(Duration::from_millis(50));
                return;
            }
        }
    }
}

/// Gives the connection a thread, or refuses it at once. With every slot
/// taken, the connection that has waited longest for a request head gives
/// up its slot; with none waiting (every slot inside a request, such as an
/// event stream), the probe reserve takes it.
fn admit(state: &Arc<HttpState>, socket: TcpStream) {
    // Accepted sockets do not inherit O_NONBLOCK on Linux, but say so.
    if socket.set_nonblocking(false).is_err() {
        return;
    }
    // Each SSE event and answer is one write; Nagle would hold them back.
    let _ = socket.set_nodelay(true);
    let regular = state.connections.try_take(state.max_connections).or_else(|| evict_oldest_waiting(state));
    let (lane, slot) = match regular {
        Some(slot) => (Lane::Regular, slot),
        None => match state.probe_connections.try_take(PROBE_RESERVE) {
            Some(slot) => (Lane::Probes, slot),
            None => return refuse_without_blocking(state, socket),
        },
    };
    let thread_state = Arc::clone(state);
    let spawned = supervise::spawn(supervise::Kind::HttpConnection, move || serve_connection(&thread_state, socket, lane, slot));
    if let Err(error) = spawned {
        // The socket went down with the closure and is closed.
        log::error("could not start a connection thread", &[("error", json!(error.to_string()))]);
    }
}

/// Takes the slot of the connection that has waited longest for a request
/// head. Its client is sent the 503 of a full server, with Retry-After,
/// rather than a bare close: it may have been about to send a request (or
/// have sent part of one), and a silent close reads as a crash. Evicting
/// stays (rather than refusing the newcomer) so that an idle or slowloris
/// flood cannot hold every slot; the 503 costs nothing when the client
/// was a flood, and tells a real one to come back.
fn evict_oldest_waiting(state: &HttpState) -> Option<CounterGuard> {
    let farewell = routes::connection_limit_response(state.max_connections).encode(false, true);
    state.waiting.evict_oldest(&farewell, EvictAfter { for_head: EVICT_AFTER, for_peer_to_read: EVICT_BLOCKED_AFTER })
}

/// Answers requests on one connection until it closes.
fn serve_connection(state: &Arc<HttpState>, socket: TcpStream, lane: Lane, slot: CounterGuard) {
    let mut limits = state.limits.clone();
    // Only regular connections may be evicted while they wait on their
    // client: the probe reserve is what remains when nothing can be.
    let (seat, _probe_slot) = match lane {
        Lane::Regular => (Some(Seat::new(&state.waiting, slot)), None),
        Lane::Probes | Lane::ProbePort => {
            limits.head_timeout = limits.head_timeout.min(PROBE_HEAD_TIMEOUT);
            limits.keep_alive = false;
            // Held for the connection's life: the reserve counts it.
            (None, Some(slot))
        }
    };
    let mut conn = Conn::new(Arc::new(socket), limits, state.stop.clone(), seat);
    let mut first = true;
    while let Next::Request(head) = conn.next_request(first) {
        first = false;
        // Unbounded only in theory: `requests` never exceeds the
        // connections, each of which answers one request at a time.
        let Some(_request) = state.requests.try_take(usize::MAX) else {
            break;
        };
        match lane {
            Lane::Regular => routes::route(state, &mut conn, &head),
            Lane::Probes => routes::route_probe_only(state, &mut conn, &head),
            Lane::ProbePort => routes::route_probe_port(state, &mut conn, &head),
        }
    }
    conn.close();
}

/// Answers a connection beyond every limit only as far as the socket takes
/// it at once: the accept loop must never wait on a client. A probe whose
/// head has already arrived still gets its answer; anything else gets 503.
fn refuse_without_blocking(state: &HttpState, mut socket: TcpStream) {
    if socket.set_nonblocking(true).is_err() {
        return;
    }
    // Reading what already arrived also makes a reset (which can destroy
    // the answer before the client reads it) less likely when we close.
    let mut scratch = [0u8; 4096];
    let received = socket.read(&mut scratch).unwrap_or(0);
    let arrived = &scratch[..received];
    let head = head::head_end(arrived).and_then(|end| head::parse_head(&arrived[..end], &state.limits.head).ok());
    let response = match &head {
        Some(head) => routes::probe_only(state, head),
        None => routes::connection_limit_response(state.max_connections),
    };
    crate::metrics::http_request(conn::route_label(head.as_ref()), response.status);
    let with_body = !head.is_some_and(|head| head.method == head::Method::Head);
    let _ = socket.write(&response.encode(false, with_body));
    let _ = socket.shutdown(Shutdown::Write);
}
