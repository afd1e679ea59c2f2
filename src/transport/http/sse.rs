//! `text/event-stream` answers, written by hand and flushed event by
//! event: the legacy `GET /sse` stream and POSTs whose request produced
//! notifications.
//!
//! The socket is non-blocking for the life of a stream, and messages wait
//! in a queue bounded in bytes (`MCP_K8S_MAX_REPLY_QUEUE_BYTES`): a client
//! that does not read fills it and is disconnected, rather than growing
//! memory without bound. The stream also ends when the client
//! closes (noticed within `TICK`, not at the next keepalive) or stops
//! taking bytes for `MCP_K8S_WRITE_TIMEOUT_S`. What the messages say is
//! `protocol`'s; which session they belong to is `mcp`'s.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::TcpStream;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use super::access::Cors;
use super::conn::{self, Conn};
use super::head::{Head, Version};
use super::socket::{self, Readiness};
use crate::protocol::Outgoing;

/// How often a waiting stream looks at its client and its queue.
pub const TICK: Duration = Duration::from_millis(250);

/// A comment this often on a legacy `GET /sse` stream keeps proxies from
/// closing it while idle. Its clients need nothing sooner: the Python SDK's
/// `sse_client` reads it with a 300 s timeout whatever HTTP client it is
/// given, and the TypeScript SDK's `EventSource` has none.
pub const SESSION_KEEPALIVE: Duration = Duration::from_secs(15);

/// A comment this often on a POST answered as a stream, below httpx's
/// default 5 s read timeout: the Python SDK given a plain
/// `httpx2.AsyncClient` otherwise gives up on a call that runs longer
///. SSE parsers skip comment lines (httpx2's
/// `EventSource`, eventsource-parser in the TypeScript SDK).
pub const ANSWER_KEEPALIVE: Duration = Duration::from_secs(2);

/// Why a stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Everything was written: the response went out, or every sender of
    /// the outbox is gone.
    Finished,
    ClientGone,
    /// The client took no bytes for the write timeout.
    Stalled,
    /// More than `max_queued_bytes` waited for the client.
    Overflow,
}

/// An open event stream with its queue of framed bytes.
pub struct SseStream<'a> {
    socket: &'a TcpStream,
    chunked: bool,
    queue: VecDeque<Vec<u8>>,
    queued_bytes: usize,
    /// How much of the queue's front is already written.
    front_written: usize,
    max_queued_bytes: usize,
    write_timeout: Duration,
    /// Since when bytes are waiting without the client taking any.
    stalled_since: Option<Instant>,
    last_write: Instant,
    /// A comment goes out after this long without a write.
    keepalive: Duration,
}

impl Drop for SseStream<'_> {
    /// The connection's own reads and writes (a lingering close) expect a
    /// blocking socket again.
    fn drop(&mut self) {
        let _ = self.socket.set_nonblocking(false);
    }
}

impl End {
    pub fn as_str(self) -> &'static str {
        match self {
            End::Finished => "finished",
            End::ClientGone => "client closed",
            End::Stalled => "client stopped reading (MCP_K8S_WRITE_TIMEOUT_S)",
            End::Overflow => "client did not keep up (MCP_K8S_MAX_REPLY_QUEUE_BYTES)",
        }
    }
}

impl<'a> SseStream<'a> {
    /// Writes the response head and switches the socket to non-blocking.
    /// The connection closes after the stream. `keepalive` is
    /// `SESSION_KEEPALIVE` or `ANSWER_KEEPALIVE`.
    pub fn start(
        conn: &'a mut Conn,
        head: &Head,
        headers: &Cors,
        max_queued_bytes: usize,
        keepalive: Duration,
    ) -> io::Result<SseStream<'a>> {
        conn.close_after();
        crate::metrics::http_request(conn::route_label(Some(head)), 200);
        let write_timeout = conn.limits().write_timeout;
        let socket = conn.socket();
        let chunked = head.version == Version::Http11;
        let mut text = String::from("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n");
        // Proxies such as nginx buffer event streams unless told not to.
        text.push_str("X-Accel-Buffering: no\r\n");
        text.push_str(if chunked { "Transfer-Encoding: chunked\r\n" } else { "Connection: close\r\n" });
        for (name, value) in headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str("\r\n");
        conn::write_all_within(socket, text.as_bytes(), write_timeout)?;
        socket.set_nonblocking(true)?;
        Ok(SseStream {
            socket,
            chunked,
            queue: VecDeque::new(),
            queued_bytes: 0,
            front_written: 0,
            max_queued_bytes,
            write_timeout,
            stalled_since: None,
            last_write: Instant::now(),
            keepalive,
        })
    }

    /// Queues one event; `data` is one line (our JSON never contains
    /// newlines). One event larger than the cap still goes out alone.
    pub fn queue_event(&mut self, event: Option<&str>, data: &str) -> Result<(), End> {
        self.queue_event_owned(event, data.to_string())
    }

    /// `queue_event` for a message the stream may keep: its bytes are
    /// queued as they are, between the event's head and tail, so a large
    /// answer is held once, not copied into the frame.
    fn queue_event_owned(&mut self, event: Option<&str>, data: String) -> Result<(), End> {
        let mut head = String::new();
        if let Some(event) = event {
            head.push_str(&format!("event: {event}\n"));
        }
        head.push_str("data: ");
        self.queue_frame(head.into_bytes(), data.into_bytes(), b"\n\n")
    }

    /// Forwards `outgoing` to the client as `event` events until the
    /// stream ends; with `until_response`, it ends after the first
    /// response (a POST's stream).
    pub fn pump(mut self, outgoing: &Receiver<Outgoing>, event: Option<&str>, until_response: bool) -> End {
        match self.pump_until_done(outgoing, event, until_response) {
            Ok(()) => self.finish(),
            Err(end) => end,
        }
    }

    fn pump_until_done(&mut self, outgoing: &Receiver<Outgoing>, event: Option<&str>, until_response: bool) -> Result<(), End> {
        loop {
            // Take everything already sent, so the queue (which is
            // counted) holds it rather than the channel (which is not).
            loop {
                match outgoing.try_recv() {
                    Ok(message) => {
                        if self.queue_message(message, event)? && until_response {
                            return Ok(());
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return Ok(()),
                }
            }
            self.write_some()?;
            if !self.queue.is_empty() {
                self.wait_writable()?;
                continue;
            }
            match outgoing.recv_timeout(TICK) {
                Ok(message) => {
                    if self.queue_message(message, event)? && until_response {
                        return Ok(());
                    }
                }
                Err(RecvTimeoutError::Timeout) => self.check_idle_client()?,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
        }
    }

    /// Queues a message; true when it was a response.
    fn queue_message(&mut self, message: Outgoing, event: Option<&str>) -> Result<bool, End> {
        match message {
            Outgoing::Notification(text) => self.queue_event_owned(event, text).map(|()| false),
            Outgoing::Response { text, .. } => self.queue_event_owned(event, text).map(|()| true),
        }
    }

    /// With nothing to send: has the client gone, and is a keepalive due?
    fn check_idle_client(&mut self) -> Result<(), End> {
        if socket::peer_closed(self.socket) {
            return Err(End::ClientGone);
        }
        if self.last_write.elapsed() >= self.keepalive {
            self.queue_chunk(b": keepalive\n\n")?;
        }
        Ok(())
    }

    fn queue_chunk(&mut self, bytes: &[u8]) -> Result<(), End> {
        self.queue_frame(Vec::new(), bytes.to_vec(), b"")
    }

    /// Queues `head`, `data` and `tail` as one frame (one chunk when the
    /// stream is chunked). Small data is copied between them, for one
    /// write; large data is queued as it is, never copied.
    fn queue_frame(&mut self, head: Vec<u8>, data: Vec<u8>, tail: &[u8]) -> Result<(), End> {
        let (mut first, last) = match self.chunked {
            true => {
                let size = head.len() + data.len() + tail.len();
                (format!("{size:x}\r\n").into_bytes(), [tail, b"\r\n"].concat())
            }
            false => (Vec::new(), tail.to_vec()),
        };
        first.extend_from_slice(&head);
        if data.len() <= conn::COPIED_UP_TO {
            first.extend_from_slice(&data);
            first.extend_from_slice(&last);
            return self.push(vec![first]);
        }
        self.push(vec![first, data, last])
    }

    /// Queues the pieces of one frame, all or none.
    fn push(&mut self, pieces: Vec<Vec<u8>>) -> Result<(), End> {
        let size: usize = pieces.iter().map(Vec::len).sum();
        if !self.queue.is_empty() && self.queued_bytes + size > self.max_queued_bytes {
            return Err(End::Overflow);
        }
        self.queued_bytes += size;
        self.queue.extend(pieces.into_iter().filter(|piece| !piece.is_empty()));
        Ok(())
    }

    /// Writes what the socket takes now, without blocking.
    fn write_some(&mut self) -> Result<(), End> {
        while let Some(front) = self.queue.front() {
            match (&mut &*self.socket).write(&front[self.front_written..]) {
                Ok(0) => return Err(End::ClientGone),
                Ok(written) => {
                    self.front_written += written;
                    self.stalled_since = None;
                    self.last_write = Instant::now();
                    if self.front_written == front.len() {
                        self.queued_bytes -= front.len();
                        self.queue.pop_front();
                        self.front_written = 0;
                    }
                }
                Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                    self.stalled_since.get_or_insert_with(Instant::now);
                    return Ok(());
                }
                Err(_) => return Err(End::ClientGone),
            }
        }
        Ok(())
    }

    /// Waits up to a tick for room in the socket; `Stalled` once the
    /// client has taken nothing for the write timeout.
    fn wait_writable(&mut self) -> Result<(), End> {
        if self.stalled_since.is_some_and(|since| since.elapsed() >= self.write_timeout) {
            return Err(End::Stalled);
        }
        match socket::wait(self.socket, Readiness::Writable, TICK) {
            Ok(_) => Ok(()),
            Err(_) => Err(End::ClientGone),
        }
    }

    /// Ends the stream: the last chunk, then everything queued, within the
    /// write timeout.
    fn finish(mut self) -> End {
        if self.chunked {
            self.queued_bytes += 5;
            self.queue.push_back(b"0\r\n\r\n".to_vec());
        }
        loop {
            if let Err(end) = self.write_some() {
                return end;
            }
            if self.queue.is_empty() {
                return End::Finished;
            }
            if let Err(end) = self.wait_writable() {
                return end;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cancel::CancelToken;
    use crate::transport::http::conn::ConnLimits;
    use crate::transport::http::head::{self, HeadLimits};
    use std::net::TcpListener;
    use std::sync::Arc;
    use std::sync::mpsc;

    /// A server-side `Conn` with its client, and a parsed `GET /sse` head.
    fn connection() -> (Conn, TcpStream, Head) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (socket, _) = listener.accept().unwrap();
        let limits = ConnLimits {
            head: HeadLimits::default(),
            max_body_bytes: 1 << 20,
            head_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(30),
            budget_wait: Duration::from_secs(1),
            keep_alive: true,
        };
        let head = head::parse_head(b"GET /sse HTTP/1.1\r\nHost: localhost\r\n\r\n", &HeadLimits::default()).unwrap();
        (Conn::new(Arc::new(socket), limits, CancelToken::new(), None), client, head)
    }

    #[test]
    fn a_client_that_does_not_read_overflows_the_queue_instead_of_growing_memory() {
        let (mut conn, _client, head) = connection();
        let (outbox, outgoing) = mpsc::channel();
        // Far more than the socket buffers and the 1 MiB queue can hold.
        for _ in 0..64 {
            outbox.send(Outgoing::Notification("x".repeat(1 << 20))).unwrap();
        }
        let stream = SseStream::start(&mut conn, &head, &Vec::new(), 1 << 20, SESSION_KEEPALIVE).unwrap();
        assert_eq!(stream.pump(&outgoing, None, false), End::Overflow);
    }

    #[test]
    fn a_closed_client_is_noticed_within_a_tick() {
        let (mut conn, client, head) = connection();
        let (_outbox, outgoing) = mpsc::channel();
        let stream = SseStream::start(&mut conn, &head, &Vec::new(), 1 << 20, SESSION_KEEPALIVE).unwrap();
        drop(client);
        let started = Instant::now();
        assert_eq!(stream.pump(&outgoing, None, false), End::ClientGone);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_post_stream_ends_after_its_response() {
        let (mut conn, mut client, head) = connection();
        let (outbox, outgoing) = mpsc::channel();
        outbox.send(Outgoing::Notification("{\"n\":1}".into())).unwrap();
        outbox.send(Outgoing::Response { text: "{\"r\":1}".into(), error: None }).unwrap();
        let stream = SseStream::start(&mut conn, &head, &Vec::new(), 1 << 20, SESSION_KEEPALIVE).unwrap();
        assert_eq!(stream.pump(&outgoing, None, true), End::Finished);
        drop(conn);
        let mut text = String::new();
        std::io::Read::read_to_string(&mut client, &mut text).unwrap();
        assert!(text.contains("data: {\"n\":1}\n\n") && text.contains("data: {\"r\":1}\n\n"), "{text}");
        assert!(text.ends_with("0\r\n\r\n"), "the last chunk ends the stream: {text}");
    }

    /// The body of a chunked stream, each chunk checked against its size.
    fn dechunk(mut wire: &str) -> String {
        let mut body = String::new();
        loop {
            let (size, rest) = wire.split_once("\r\n").expect("a chunk size line");
            let size = usize::from_str_radix(size, 16).expect("a hex chunk size");
            if size == 0 {
                return body;
            }
            body.push_str(&rest[..size]);
            wire = rest[size..].strip_prefix("\r\n").expect("a chunk ends in CRLF");
        }
    }

    #[test]
    fn small_and_large_events_are_framed_alike() {
        // The answer is its `size` x's and 8 bytes of JSON: 16 KiB exactly goes
        // as one piece, a byte more as three.
        for size in [10, conn::COPIED_UP_TO - 8, conn::COPIED_UP_TO - 7, 3 << 20] {
            let (mut conn, mut client, head) = connection();
            let (outbox, outgoing) = mpsc::channel();
            let response = format!("{{\"r\":\"{}\"}}", "x".repeat(size));
            outbox.send(Outgoing::Notification("{\"n\":1}".into())).unwrap();
            outbox.send(Outgoing::Response { text: response.clone(), error: None }).unwrap();
            let stream = SseStream::start(&mut conn, &head, &Vec::new(), 8 << 20, SESSION_KEEPALIVE).unwrap();
            let reader = std::thread::spawn(move || {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut client, &mut text).unwrap();
                text
            });
            assert_eq!(stream.pump(&outgoing, Some("message"), true), End::Finished);
            drop(conn);
            let text = reader.join().unwrap();
            let body = dechunk(&text[text.find("\r\n\r\n").unwrap() + 4..]);
            assert_eq!(body, format!("event: message\ndata: {{\"n\":1}}\n\nevent: message\ndata: {response}\n\n"), "{size}");
        }
    }

    #[test]
    fn an_idle_stream_writes_a_keepalive_comment_each_interval() {
        let (mut conn, mut client, head) = connection();
        let (outbox, outgoing) = mpsc::channel();
        let stream = SseStream::start(&mut conn, &head, &Vec::new(), 1 << 20, Duration::from_millis(300)).unwrap();
        let answer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1100));
            outbox.send(Outgoing::Response { text: "{\"r\":1}".into(), error: None }).unwrap();
        });
        assert_eq!(stream.pump(&outgoing, None, true), End::Finished);
        answer.join().unwrap();
        drop(conn);
        let mut text = String::new();
        std::io::Read::read_to_string(&mut client, &mut text).unwrap();
        let comments = text.matches(": keepalive\n\n").count();
        assert!((2..=4).contains(&comments), "{comments} comments in 1.1 s at 0.3 s: {text}");
        assert!(text.contains("data: {\"r\":1}\n\n"), "{text}");
    }
}
