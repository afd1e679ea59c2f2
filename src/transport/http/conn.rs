//! One HTTP/1.1 connection: reads request heads and bodies off the socket
//! under byte caps and deadlines, writes responses, and decides whether
//! the connection may carry another request (keep-alive).
//!
//! Every wait has a deadline (`MCP_K8S_HEAD_TIMEOUT_S`,
//! `MCP_K8S_BODY_TIMEOUT_S`, `MCP_K8S_IDLE_TIMEOUT_S`,
//! `MCP_K8S_WRITE_TIMEOUT_S`), every buffer a cap, and a body is only read
//! when a handler asks for it, within the shared `Budget`. A body nobody
//! read is never drained: the connection closes instead (tiny_http's drain
//! of a declared length is what an earlier build crashed on). Routing and what the
//! requests mean belong to `routes` and `mcp`; a response's bytes, to
//! `response`.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::budget::{Budget, Reservation};
use super::head::{self, Framing, Head, HeadError, HeadLimits, Method, Version};
use super::response::{Response, error_response};
use super::socket::{self, Readiness};
use super::waiting::{Seat, Wait};
use crate::cancel::CancelToken;

/// The bounds one connection works under.
#[derive(Clone, Debug)]
pub struct ConnLimits {
    pub head: HeadLimits,
    /// `MCP_K8S_MAX_MESSAGE_BYTES`.
    pub max_body_bytes: usize,
    pub head_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub write_timeout: Duration,
    /// How long a body may wait for room in the budget before 503.
    pub budget_wait: Duration,
    /// False for the probe reserve: one request, then close.
    pub keep_alive: bool,
}

/// Why a body could not be read. Each says which setting applies.
#[derive(Debug)]
pub enum BodyError {
    TooLarge {
        limit: usize,
    },
    /// The shared budget stayed full for `budget_wait`.
    Busy {
        budget: usize,
    },
    TimedOut {
        timeout: Duration,
    },
    /// The client closed before the body was complete.
    Incomplete,
    /// A chunked body that does not follow RFC 9112 section 7.1.
    BadChunk {
        what: &'static str,
    },
    Io(io::Error),
}

/// One client connection and the bytes read ahead of what was parsed.
pub struct Conn {
    /// Shared with `Waiting`, which may shut it down to evict it.
    socket: Arc<TcpStream>,
    /// Bytes read but not yet consumed: the start of the next head or of
    /// the current body. Never more than the head cap plus one read.
    buffer: Vec<u8>,
    limits: ConnLimits,
    stop: CancelToken,
    /// Whether the current request's body was read (or it has none).
    body_consumed: bool,
    /// Whether the last response left the connection fit for another request.
    reusable: bool,
    /// A head was refused: the client may still be sending it.
    refused: bool,
    /// A regular connection's slot, given up to a newcomer while the
    /// connection waits on its client (`None`: the probe reserve, which
    /// is never evicted).
    seat: Option<Seat>,
    /// The slot went to a newcomer: the socket is shut down.
    evicted: bool,
}

/// What waiting for the next request gave.
pub enum Next {
    Request(Head),
    /// The client closed, went idle too long, or sent a head that was
    /// answered with an error; the connection is done.
    Done,
}

/// Bytes read per call while looking for the end of a head.
const READ_CHUNK: usize = 4096;

/// A body (or an event's data) up to this size is copied behind its head
/// and written with it; a larger one is written on its own, never copied.
pub(super) const COPIED_UP_TO: usize = 16 * 1024;

/// Bodies up to this size take nothing from the shared budget.
pub(super) const UNBUDGETED_BYTES: usize = 8 << 10;

/// How long and how much `close` reads and discards from a client that
/// may still be sending.
const LINGER_TIME: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1 << 20;

/// Cap on one chunk-size line (size plus extensions, RFC 9112 7.1.1).
const MAX_CHUNK_LINE: usize = 1024;
const LINE_TOO_LONG: &str = "a chunk-size or trailer line too long";

/// The `route` label of a request's answers in `/metrics`: the path when
/// the server serves it, else `other` (as for a head that could not be
/// read), so a client choosing paths cannot make new series.
pub fn route_label(head: Option<&Head>) -> &'static str {
    let path = head.map_or("", Head::path);
    crate::metrics::ROUTES.into_iter().find(|route| *route == path).unwrap_or("other")
}

/// Writes `response`; a client that left gets nothing and is not told.
pub fn answer(conn: &mut Conn, head: &Head, response: Response) {
    let _ = conn.respond(Some(head), response);
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge { limit } => write!(formatter, "message exceeds {limit} bytes; raise MCP_K8S_MAX_MESSAGE_BYTES"),
            BodyError::Busy { budget } => write!(
                formatter,
                "request bodies being read already hold the {budget} bytes of MCP_K8S_BODY_BUDGET_BYTES; retry shortly or raise it"
            ),
            BodyError::TimedOut { timeout } => {
                write!(formatter, "the body did not arrive within {} s; raise MCP_K8S_BODY_TIMEOUT_S", timeout.as_secs())
            }
            BodyError::Incomplete => write!(formatter, "the connection closed before the body was complete"),
            BodyError::BadChunk { what } => write!(formatter, "malformed chunked body: {what}"),
            BodyError::Io(error) => write!(formatter, "could not read the body: {error}"),
        }
    }
}

impl BodyError {
    pub fn status(&self) -> u16 {
        match self {
            BodyError::TooLarge { .. } => 413,
            BodyError::Busy { .. } => 503,
            BodyError::TimedOut { .. } => 408,
            BodyError::Incomplete | BodyError::BadChunk { .. } | BodyError::Io(_) => 400,
        }
    }
}

impl Conn {
    pub fn new(socket: Arc<TcpStream>, limits: ConnLimits, stop: CancelToken, seat: Option<Seat>) -> Conn {
        Conn { socket, buffer: Vec::new(), limits, stop, body_consumed: true, reusable: true, refused: false, seat, evicted: false }
    }

    pub fn socket(&self) -> &TcpStream {
        &self.socket
    }

    pub fn limits(&self) -> &ConnLimits {
        &self.limits
    }

    /// Waits for and parses the next request head. The first request gets
    /// the head timeout from the start; later ones may idle for the
    /// keep-alive timeout first. Refused heads are answered here. While it
    /// waits, the connection's slot may go to a newcomer (`Waiting`).
    pub fn next_request(&mut self, first: bool) -> Next {
        if !first && (!self.reusable || !self.body_consumed || !self.limits.keep_alive || self.stop.is_cancelled()) {
            return Next::Done;
        }
        self.while_evictable(Wait::ForHead, |conn| conn.read_request(first)).unwrap_or(Next::Done)
    }

    fn read_request(&mut self, first: bool) -> Next {
        let wait_for_first_byte = if first { self.limits.head_timeout } else { self.limits.idle_timeout };
        let mut deadline = Instant::now() + wait_for_first_byte;
        let mut started = false;
        loop {
            // Empty lines before a request line are ignored (RFC 9112 2.2).
            while self.buffer.starts_with(b"\r\n") {
                self.buffer.drain(..2);
            }
            // The head timeout runs from the connection for a first request
            // and from its first byte for a kept-alive one.
            if !started && !self.buffer.is_empty() {
                started = true;
                if !first {
                    deadline = Instant::now() + self.limits.head_timeout;
                }
            }
            if let Some(end) = head::head_end(&self.buffer) {
                let parsed = head::parse_head(&self.buffer[..end], &self.limits.head);
                self.buffer.drain(..end);
                return match parsed {
                    Ok(head) => {
                        self.body_consumed = matches!(head.framing, Framing::None | Framing::Length(0));
                        self.reusable = true;
                        Next::Request(head)
                    }
                    Err(error) => self.refuse_head(&error),
                };
            }
            if head::has_bare_line_end(&self.buffer) {
                return self.refuse_head(&head::BARE_LINE_END);
            }
            if self.buffer.len() >= self.limits.head.max_bytes {
                return self.refuse_head(&HeadError::TooLarge { limit: self.limits.head.max_bytes });
            }
            match self.read_more(deadline, self.limits.head.max_bytes + 4 - self.buffer.len()) {
                Ok(0) => return Next::Done,
                Ok(_) => {}
                Err(ReadError::TimedOut) if started => {
                    self.refused = true;
                    let message = format!(
                        "the request head did not arrive within {} s; raise MCP_K8S_HEAD_TIMEOUT_S",
                        self.limits.head_timeout.as_secs()
                    );
                    let _ = self.respond(None, error_response(408, &message));
                    return Next::Done;
                }
                Err(_) => return Next::Done,
            }
        }
    }

    /// Reads the whole body of `head` within the body cap, the budget and
    /// the body deadline. The reservation must live as long as the body.
    pub fn read_body(&mut self, head: &Head, budget: &Arc<Budget>) -> Result<(Vec<u8>, Reservation), BodyError> {
        let limit = self.limits.max_body_bytes;
        let declared = match head.framing {
            Framing::None => None,
            Framing::Length(length) if length > limit as u64 => return Err(BodyError::TooLarge { limit }),
            Framing::Length(length) => Some(length as usize),
            Framing::Chunked => None,
        };
        // Small bodies (pings, notifications) take no budget: the
        // connection cap already bounds them, and a few large messages
        // holding the budget must not stall every small one.
        let budgeted = declared.filter(|length| *length > UNBUDGETED_BYTES).unwrap_or(0);
        let mut reservation = budget.reserve(budgeted, self.limits.budget_wait).ok_or(BodyError::Busy { budget: budget.total() })?;
        if head.framing != Framing::None && expects_continue(head) {
            // The client waits for this before sending (RFC 9110 10.1.1).
            write_all_within(&self.socket, b"HTTP/1.1 100 Continue\r\n\r\n", self.limits.write_timeout).map_err(BodyError::Io)?;
        }
        let deadline = Instant::now() + self.limits.body_timeout;
        let body = match head.framing {
            Framing::None => Vec::new(),
            Framing::Length(_) => {
                let length = declared.unwrap_or(0);
                let mut body = Vec::with_capacity(length);
                self.take_exact(&mut body, length, deadline)?;
                body
            }
            Framing::Chunked => self.read_chunked(&mut reservation, budget, deadline)?,
        };
        self.body_consumed = true;
        Ok((body, reservation))
    }

    /// Writes one complete response. `head` is the request it answers
    /// (`None` when the head itself was refused). Decides keep-alive.
    pub fn respond(&mut self, head: Option<&Head>, response: Response) -> io::Result<()> {
        crate::metrics::http_request(route_label(head), response.status);
        let keep_alive = head.is_some_and(|head| self.may_keep_alive(head)) && response.status < 500 && response.status != 408;
        self.reusable = keep_alive;
        // HEAD gets the headers GET would, without the body (RFC 9110 9.3.2).
        let with_body = !head.is_some_and(|head| head.method == Method::Head);
        // A small body goes out with its head in one write; a large one
        // after it, as it is, rather than copied next to it.
        let body_apart = with_body && response.body.len() > COPIED_UP_TO;
        let mut bytes = response.encode_head(keep_alive);
        if with_body && !body_apart {
            bytes.extend_from_slice(&response.body);
        }
        let mut written = self.write_evictable(&bytes);
        if body_apart && written.is_ok() {
            written = self.write_evictable(&response.body);
        }
        if written.is_err() {
            // Part of an answer may have gone: nothing more can follow it.
            self.reusable = false;
        }
        if !keep_alive {
            // Half-close, so the client reads our answer to the end before
            // it sees the connection go.
            let _ = self.socket.shutdown(Shutdown::Write);
        }
        written
    }

    /// Marks the connection as ending after this request (an event stream
    /// took it over).
    pub fn close_after(&mut self) {
        self.reusable = false;
    }

    fn may_keep_alive(&self, head: &Head) -> bool {
        // An Upgrade we do not perform is ignored (RFC 9110 7.8), and the
        // connection closes so that no other protocol's bytes follow on it.
        let upgrade = head.connection_has("upgrade") || head.header("Upgrade").is_some();
        self.limits.keep_alive
            && self.body_consumed
            && head.version == Version::Http11
            && !head.connection_has("close")
            && !upgrade
            && !self.stop.is_cancelled()
    }

    /// Ends the connection. When the client may still be sending (a body
    /// we did not read, a refused head), a little of it is read and thrown
    /// away first, into a fixed buffer: closing with unread bytes makes the
    /// kernel send a reset, which can destroy our answer before the client
    /// reads it (the "lingering close" of RFC 9112 9.6).
    /// The lingering may take a second; meanwhile the slot may go to a
    /// newcomer, as while waiting for a head. Without this a burst of
    /// requests with unread bodies held every slot for that second and
    /// the probes, finding the reserve taken too, got 503.
    pub fn close(mut self) {
        let _ = self.socket.shutdown(Shutdown::Write);
        if (self.body_consumed && !self.refused) || self.evicted {
            return;
        }
        self.while_evictable(Wait::ForHead, |conn| {
            let deadline = Instant::now() + LINGER_TIME;
            let mut discarded = 0;
            let mut scratch = [0u8; READ_CHUNK];
            while discarded < LINGER_BYTES {
                match read_by(&conn.socket, &mut scratch, deadline) {
                    Ok(0) | Err(_) => return,
                    Ok(read) => discarded += read,
                }
            }
        });
    }

    /// Runs `wait` (a wait on the client) with the slot up for eviction;
    /// `None` when it was evicted, before or meanwhile.
    fn while_evictable<T>(&mut self, wait: Wait, body: impl FnOnce(&mut Conn) -> T) -> Option<T> {
        let ticket = match self.seat.as_mut().map(|seat| seat.list(&self.socket, wait)) {
            None => None,
            Some(Ok(ticket)) => Some(ticket),
            Some(Err(_)) => {
                self.evicted = true;
                return None;
            }
        };
        let result = body(self);
        if let (Some(seat), Some(ticket)) = (self.seat.as_mut(), ticket)
            && seat.unlist(ticket).is_err()
        {
            self.evicted = true;
            return None;
        }
        Some(result)
    }

    /// Writes `bytes` as the client takes them. While the client takes
    /// none, the connection waits on it and its slot may go to a
    /// newcomer: a client that pipelines requests and never reads the
    /// answers held a slot per connection until the write timeout, and
    /// enough of them held every slot. Gives up when the client takes no
    /// bytes for `write_timeout` (like nginx's `send_timeout`, between two
    /// writes, so that a large answer to a slow but live client still goes
    /// out).
    fn write_evictable(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut sent = 0;
        loop {
            sent += socket::send_some(&*self.socket, &bytes[sent..])?;
            if sent == bytes.len() {
                return Ok(());
            }
            let timeout = self.limits.write_timeout;
            let room = self.while_evictable(Wait::ForPeerToRead, |conn| socket::wait(&*conn.socket, Readiness::Writable, timeout));
            match room {
                None => return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "the slot went to a newcomer")),
                Some(Ok(true)) => {}
                Some(Ok(false)) => return Err(io::Error::new(io::ErrorKind::TimedOut, WRITE_TIMED_OUT)),
                Some(Err(error)) => return Err(error),
            }
        }
    }

    fn refuse_head(&mut self, error: &HeadError) -> Next {
        self.refused = true;
        let _ = self.respond(None, error_response(error.status(), &error.to_string()));
        Next::Done
    }

    /// Reads more bytes into the buffer, at most `max`, by `deadline`.
    fn read_more(&mut self, deadline: Instant, max: usize) -> Result<usize, ReadError> {
        let mut chunk = [0u8; READ_CHUNK];
        let max = max.clamp(1, READ_CHUNK);
        let read = read_by(&self.socket, &mut chunk[..max], deadline)?;
        self.buffer.extend_from_slice(&chunk[..read]);
        Ok(read)
    }

    /// Appends exactly `length` bytes to `out`: first what was read ahead,
    /// then straight from the socket.
    fn take_exact(&mut self, out: &mut Vec<u8>, length: usize, deadline: Instant) -> Result<(), BodyError> {
        let from_buffer = length.min(self.buffer.len());
        out.extend(self.buffer.drain(..from_buffer));
        let mut missing = length - from_buffer;
        while missing > 0 {
            let start = out.len();
            out.resize(start + missing.min(64 << 10), 0);
            let read = read_by(&self.socket, &mut out[start..], deadline);
            let read = match read {
                Ok(0) => Err(BodyError::Incomplete),
                Ok(read) => Ok(read),
                Err(ReadError::TimedOut) => Err(BodyError::TimedOut { timeout: self.limits.body_timeout }),
                Err(ReadError::Io(error)) => Err(BodyError::Io(error)),
            };
            let read = read.inspect_err(|_| out.truncate(start))?;
            out.truncate(start + read);
            missing -= read;
        }
        Ok(())
    }

    /// One line ending in CRLF, without it, at most `max` bytes; a longer
    /// one is `BadChunk` with `too_long`.
    fn take_line(&mut self, max: usize, too_long: &'static str, deadline: Instant) -> Result<Vec<u8>, BodyError> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|pair| pair == b"\r\n") {
                // The cap holds for a line that arrived whole with earlier
                // bytes (the head, the previous chunk) as for one still coming.
                if end > max {
                    return Err(BodyError::BadChunk { what: too_long });
                }
                let line = self.buffer[..end].to_vec();
                self.buffer.drain(..end + 2);
                return Ok(line);
            }
            // No CRLF yet: `max` bytes and a CR whose LF is still coming
            // may be a line within the cap.
            if self.buffer.len() > max + 1 {
                return Err(BodyError::BadChunk { what: too_long });
            }
            match self.read_more(deadline, max + 2 - self.buffer.len()) {
                Ok(0) => return Err(BodyError::Incomplete),
                Ok(_) => {}
                Err(ReadError::TimedOut) => return Err(BodyError::TimedOut { timeout: self.limits.body_timeout }),
                Err(ReadError::Io(error)) => return Err(BodyError::Io(error)),
            }
        }
    }

    /// Decodes a chunked body (RFC 9112 7.1), growing the reservation
    /// chunk by chunk under the same cap; trailers are read and dropped.
    fn read_chunked(&mut self, reservation: &mut Reservation, budget: &Budget, deadline: Instant) -> Result<Vec<u8>, BodyError> {
        let limit = self.limits.max_body_bytes;
        let mut body = Vec::new();
        loop {
            let line = self.take_line(MAX_CHUNK_LINE, LINE_TOO_LONG, deadline)?;
            let size = parse_chunk_size(&line)?;
            if size == 0 {
                break;
            }
            if size > (limit - body.len()) as u64 {
                return Err(BodyError::TooLarge { limit });
            }
            let size = size as usize;
            if !reservation.grow(size, self.limits.budget_wait) {
                return Err(BodyError::Busy { budget: budget.total() });
            }
            self.take_exact(&mut body, size, deadline)?;
            const DATA_TOO_LONG: &str = "chunk data longer than its size";
            if !self.take_line(0, DATA_TOO_LONG, deadline)?.is_empty() {
                return Err(BodyError::BadChunk { what: DATA_TOO_LONG });
            }
        }
        let mut trailer_bytes = 0;
        loop {
            let line = self.take_line(self.limits.head.max_bytes, LINE_TOO_LONG, deadline)?;
            if line.is_empty() {
                return Ok(body);
            }
            trailer_bytes += line.len() + 2;
            if trailer_bytes > self.limits.head.max_bytes {
                return Err(BodyError::BadChunk { what: "trailers longer than MCP_K8S_MAX_HEADER_BYTES" });
            }
        }
    }
}

enum ReadError {
    TimedOut,
    Io(io::Error),
}

/// `Expect: 100-continue`; other expectations are refused by `routes`.
fn expects_continue(head: &Head) -> bool {
    head.version == Version::Http11 && head.header("Expect").is_some_and(|value| value.eq_ignore_ascii_case("100-continue"))
}

/// Hex digits, then optional `;extensions`; a size too large for u64 is
/// as good as too large for the cap.
fn parse_chunk_size(line: &[u8]) -> Result<u64, BodyError> {
    let digits = line.split(|byte| *byte == b';').next().unwrap_or_default();
    let digits = digits.strip_suffix(b" ").unwrap_or(digits);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_hexdigit) {
        return Err(BodyError::BadChunk { what: "a chunk size that is not hexadecimal" });
    }
    let mut size: u64 = 0;
    for digit in digits {
        let value = char::from(*digit).to_digit(16).unwrap_or(0);
        size = size.saturating_mul(16).saturating_add(u64::from(value));
    }
    Ok(size)
}

/// One read that gives up at `deadline`.
fn read_by(socket: &TcpStream, buffer: &mut [u8], deadline: Instant) -> Result<usize, ReadError> {
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(ReadError::TimedOut);
        }
        socket.set_read_timeout(Some(remaining)).map_err(ReadError::Io)?;
        match (&mut &*socket).read(buffer) {
            Ok(read) => return Ok(read),
            Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(ReadError::Io(error)),
        }
    }
}

/// `write_all` that gives up when the client takes no bytes for
/// `timeout` (like nginx's `send_timeout`, between two writes, so that a
/// large answer to a slow but live client still goes out).
pub fn write_all_within(socket: &TcpStream, bytes: &[u8], timeout: Duration) -> io::Result<()> {
    socket.set_write_timeout(Some(timeout))?;
    (&mut &*socket).write_all(bytes).map_err(|error| match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(io::ErrorKind::TimedOut, WRITE_TIMED_OUT),
        _ => error,
    })
}

const WRITE_TIMED_OUT: &str = "the client took no bytes within MCP_K8S_WRITE_TIMEOUT_S";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes() {
        let cases: [(&[u8], Option<u64>); 8] = [
            (b"0", Some(0)),
            (b"1a", Some(26)),
            (b"FF;name=value", Some(255)),
            (b"10 ;x", Some(16)),
            (b"ffffffffffffffffffffffff", Some(u64::MAX)),
            (b"", None),
            (b"-1", None),
            (b"0x10", None),
        ];
        for (line, expected) in cases {
            assert_eq!(parse_chunk_size(line).ok(), expected, "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn route_labels_are_the_served_paths_or_other() {
        let cases = [
            ("GET /metrics HTTP/1.1", "/metrics"),
            ("POST /mcp?x=1 HTTP/1.1", "/mcp"),
            ("GET /sse HTTP/1.1", "/sse"),
            ("GET /a-path-a-client-made-up HTTP/1.1", "other"),
            ("GET /mcp/ HTTP/1.1", "other"),
        ];
        for (request_line, expected) in cases {
            let text = format!("{request_line}\r\nHost: x\r\n\r\n");
            let head = head::parse_head(text.as_bytes(), &Default::default()).unwrap();
            assert_eq!(route_label(Some(&head)), expected, "{request_line}");
        }
        assert_eq!(route_label(None), "other", "a head that could not be read");
    }
}
