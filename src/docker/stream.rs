//! Long-lived reads from the Docker socket: a followed container log and the
//! `/events` stream, each closable from another thread through an `Abort`.
//!
//! Logs of a container without a TTY come multiplexed: each frame is an
//! 8-byte header (stream type 0/1/2, three zero bytes, a big-endian u32
//! length) and then that many bytes. `LogStream` is a `BufRead` of the
//! stdout frames only, because the runner writes its frames to stdout;
//! stderr frames are set aside (the first `STDERR_KEEP_BYTES`, and a count),
//! for diagnostics. TTY containers (a raw stream) are not supported: this
//! server never creates one.
//!
//! It knows the wire formats and nothing about what the runner's frames or
//! the events mean.

#![allow(unsafe_code)] // poll(2) on the daemon's socket with a deadline (std has no readiness wait).

use std::io::{BufRead, Read};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::docker::http::Body;
use crate::docker::{Error, objects};

/// The stderr bytes a `LogStream` keeps (the rest are only counted).
const STDERR_KEEP_BYTES: usize = 64 * 1024;
/// The longest line of the events stream (one JSON event).
pub const MAX_EVENT_LINE_BYTES: usize = 1024 * 1024;

/// The connection a response body is read from.
pub(crate) type Connection = std::io::BufReader<UnixStream>;

/// Closes a call's connection from another thread; pending and later reads
/// fail promptly with `Error::Aborted`. Clones control the same call.
#[derive(Clone, Debug, Default)]
pub struct Abort {
    inner: Arc<AbortInner>,
}

#[derive(Debug, Default)]
struct AbortInner {
    aborted: AtomicBool,
    socket: Mutex<Option<UnixStream>>,
}

impl Abort {
    pub fn new() -> Abort {
        Abort::default()
    }

    pub fn abort(&self) {
        self.inner.aborted.store(true, Ordering::SeqCst);
        if let Some(socket) = self.lock_socket().take() {
            // A shutdown wakes a read blocked on another handle of the same socket.
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn is_aborted(&self) -> bool {
        self.inner.aborted.load(Ordering::SeqCst)
    }

    /// Makes `socket` (a clone of the call's connection) the one `abort`
    /// shuts down. Fails when the abort came first.
    pub(crate) fn register(&self, socket: UnixStream) -> Result<(), ()> {
        let mut slot = self.lock_socket();
        if self.is_aborted() {
            let _ = socket.shutdown(std::net::Shutdown::Both);
            return Err(());
        }
        *slot = Some(socket);
        Ok(())
    }

    fn lock_socket(&self) -> std::sync::MutexGuard<'_, Option<UnixStream>> {
        self.inner.socket.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Which stream a multiplexed frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    Stdin,
    Stdout,
    Stderr,
}

/// Decodes one 8-byte frame header (pure).
fn parse_frame_header(header: [u8; 8]) -> Result<(StreamKind, u32), String> {
    let kind = match header[0] {
        0 => StreamKind::Stdin,
        1 => StreamKind::Stdout,
        2 => StreamKind::Stderr,
        other => return Err(format!("frame header names stream {other}; is the container a TTY?")),
    };
    if header[1..4] != [0, 0, 0] {
        return Err(format!("frame header {header:02x?} has non-zero padding; is the container a TTY?"));
    }
    Ok((kind, u32::from_be_bytes([header[4], header[5], header[6], header[7]])))
}

/// Splits a multiplexed stream: a `BufRead` of its stdout frames, with
/// stderr kept aside. Generic over the reader so tests feed it bytes.
#[derive(Debug)]
pub struct Demux<R> {
    reader: R,
    /// The stream of the current frame and the bytes left in it.
    current: StreamKind,
    remaining: u64,
    ended: bool,
    stderr_head: Vec<u8>,
    stderr_bytes: u64,
}

impl<R: BufRead> Demux<R> {
    pub fn new(reader: R) -> Demux<R> {
        Demux { reader, current: StreamKind::Stdout, remaining: 0, ended: false, stderr_head: Vec::new(), stderr_bytes: 0 }
    }

    /// The first `STDERR_KEEP_BYTES` of stderr read so far.
    pub fn stderr_head(&self) -> &[u8] {
        &self.stderr_head
    }

    /// All stderr bytes read so far, kept or not.
    pub fn stderr_bytes(&self) -> u64 {
        self.stderr_bytes
    }

    /// Advances until the current frame is a stdout frame with bytes left,
    /// or the stream ended. Stderr (and stdin) frames are consumed here.
    fn seek_stdout(&mut self) -> std::io::Result<()> {
        while !self.ended && !self.in_stdout_frame() {
            if self.remaining == 0 {
                self.read_header()?;
                continue;
            }
            let available = self.reader.fill_buf()?;
            if available.is_empty() {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "log stream ended inside a frame"));
            }
            let amount = available.len().min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
            if self.current == StreamKind::Stderr {
                let keep = amount.min(STDERR_KEEP_BYTES - self.stderr_head.len());
                self.stderr_head.extend_from_slice(&available[..keep]);
                self.stderr_bytes += amount as u64;
            }
            self.reader.consume(amount);
            self.remaining -= amount as u64;
        }
        Ok(())
    }

    fn in_stdout_frame(&self) -> bool {
        self.current == StreamKind::Stdout && self.remaining > 0
    }

    fn read_header(&mut self) -> std::io::Result<()> {
        let mut header = [0u8; 8];
        let mut filled = 0;
        while filled < header.len() {
            let read = self.reader.read(&mut header[filled..])?;
            if read == 0 {
                if filled == 0 {
                    self.ended = true;
                    return Ok(());
                }
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "log stream ended inside a frame header"));
            }
            filled += read;
        }
        let (kind, length) = parse_frame_header(header).map_err(|message| std::io::Error::new(std::io::ErrorKind::InvalidData, message))?;
        self.current = kind;
        self.remaining = u64::from(length);
        Ok(())
    }
}

impl<R: BufRead> BufRead for Demux<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.seek_stdout()?;
        if self.ended {
            return Ok(&[]);
        }
        let remaining = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        let available = self.reader.fill_buf()?;
        if available.is_empty() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "log stream ended inside a frame"));
        }
        Ok(&available[..available.len().min(remaining)])
    }

    fn consume(&mut self, amount: usize) {
        self.reader.consume(amount);
        self.remaining -= amount as u64;
    }
}

impl<R: BufRead> Read for Demux<R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        crate::docker::http::read_through_buffer(self, buffer)
    }
}

/// A container's log (followed or not) as a `BufRead` of its stdout; EOF
/// when the container has exited and everything was read.
pub struct LogStream {
    path: String,
    demux: Demux<Body<Connection>>,
    abort: Abort,
}

impl std::fmt::Debug for LogStream {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("LogStream").field("path", &self.path).finish_non_exhaustive()
    }
}

impl LogStream {
    pub(crate) fn new(path: String, body: Body<Connection>, abort: Abort) -> LogStream {
        LogStream { path, demux: Demux::new(body), abort }
    }

    /// A handle another thread can use to close this stream.
    pub fn abort_handle(&self) -> Abort {
        self.abort.clone()
    }

    /// Ends an attach's input (half-closes the connection) and reads what
    /// is left until the daemon closes it, at most `wait`. An attach to a
    /// container without `StdinOnce` must end so: dockerd loses the input
    /// of the next attach when one is closed without its input ended first.
    pub fn end_input(&mut self, wait: std::time::Duration) {
        use std::io::Read;
        let mut socket: &UnixStream = self.demux.reader.get_ref().get_ref();
        if socket.shutdown(std::net::Shutdown::Write).is_err() || socket.set_read_timeout(Some(wait)).is_err() {
            return;
        }
        let deadline = std::time::Instant::now() + wait;
        let mut scratch = [0u8; 4096];
        while std::time::Instant::now() < deadline {
            match socket.read(&mut scratch) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// A second handle on an attach's connection, to write more input from
    /// another thread while this one reads.
    pub fn input_handle(&self) -> std::io::Result<UnixStream> {
        self.demux.reader.get_ref().get_ref().try_clone()
    }

    /// Writes more input into an attach's open input.
    pub fn write_input(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        let mut socket: &UnixStream = self.demux.reader.get_ref().get_ref();
        socket.write_all(bytes)
    }

    /// Whether output arrives within `wait` (or has arrived already), not
    /// consuming it; the end of the stream counts as arriving.
    pub fn output_within(&self, wait: std::time::Duration) -> std::io::Result<bool> {
        use std::os::fd::AsRawFd;
        let connection = self.demux.reader.get_ref();
        if !connection.buffer().is_empty() {
            return Ok(true);
        }
        let mut poll = libc::pollfd { fd: connection.get_ref().as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let millis = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: poll(2) on one pollfd this function owns for the call; the
        // descriptor is the connection's, open while `self` lives.
        match unsafe { libc::poll(&mut poll, 1, millis) } {
            -1 => Err(std::io::Error::last_os_error()),
            ready => Ok(ready > 0),
        }
    }

    /// See `Demux::stderr_head`.
    pub fn stderr_head(&self) -> &[u8] {
        self.demux.stderr_head()
    }

    /// See `Demux::stderr_bytes`.
    pub fn stderr_bytes(&self) -> u64 {
        self.demux.stderr_bytes()
    }

    fn map_error(abort: &Abort, path: &str, error: std::io::Error) -> std::io::Error {
        if abort.is_aborted() {
            return std::io::Error::new(std::io::ErrorKind::ConnectionAborted, format!("GET {path}: aborted"));
        }
        error
    }
}

impl BufRead for LogStream {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.abort.is_aborted() {
            return Err(LogStream::map_error(&self.abort, &self.path, std::io::Error::other("aborted")));
        }
        let abort = &self.abort;
        let path = &self.path;
        match self.demux.fill_buf() {
            // A shutdown by `abort` reads as EOF; it must not look like the container's end.
            Ok([]) if abort.is_aborted() => Err(LogStream::map_error(abort, path, std::io::Error::other("aborted"))),
            Ok(bytes) => Ok(bytes),
            Err(error) => Err(LogStream::map_error(abort, path, error)),
        }
    }

    fn consume(&mut self, amount: usize) {
        self.demux.consume(amount);
    }
}

impl Read for LogStream {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        crate::docker::http::read_through_buffer(self, buffer)
    }
}

/// The `/events` stream: one JSON object per line.
pub struct EventStream {
    path: String,
    body: Body<Connection>,
    abort: Abort,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("EventStream").field("path", &self.path).finish_non_exhaustive()
    }
}

impl EventStream {
    pub(crate) fn new(path: String, body: Body<Connection>, abort: Abort) -> EventStream {
        EventStream { path, body, abort }
    }

    /// A handle another thread can use to close this stream.
    pub fn abort_handle(&self) -> Abort {
        self.abort.clone()
    }

    /// The next event; `Ok(None)` when the daemon ended the stream (its
    /// `until` passed, or it shut down).
    #[allow(clippy::should_implement_trait)] // Blocking and fallible; an Iterator would hide both.
    pub fn next(&mut self) -> Result<Option<objects::Event>, Error> {
        loop {
            let line = read_line_capped(&mut self.body, MAX_EVENT_LINE_BYTES);
            if self.abort.is_aborted() {
                return Err(Error::Aborted { verb: "GET", path: self.path.clone() });
            }
            let line = line.map_err(|source| Error::from_io("GET", &self.path, source))?;
            let Some(line) = line else { return Ok(None) };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return decode_event(&line).map(Some).map_err(|message| Error::Decode { verb: "GET", path: self.path.clone(), message });
        }
    }
}

/// Decodes one line of the events stream (pure).
fn decode_event(line: &[u8]) -> Result<objects::Event, String> {
    serde_json::from_slice(line).map_err(|error| error.to_string())
}

/// One line without its newline; `None` at a clean EOF. A line longer than
/// `limit` is an `InvalidData` error.
fn read_line_capped(reader: &mut impl BufRead, limit: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let read = reader.take(limit as u64 + 1).read_until(b'\n', &mut line)?;
    if read == 0 {
        return Ok(None);
    }
    if line.ends_with(b"\n") {
        line.pop();
        return Ok(Some(line));
    }
    if read > limit {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("event line longer than {limit} bytes")));
    }
    // The daemon closed after a last line without a newline.
    Ok(Some(line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut bytes = vec![kind, 0, 0, 0];
        bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn frame_headers() {
        assert_eq!(parse_frame_header([1, 0, 0, 0, 0, 0, 1, 2]), Ok((StreamKind::Stdout, 258)));
        assert_eq!(parse_frame_header([2, 0, 0, 0, 0, 0, 0, 0]), Ok((StreamKind::Stderr, 0)));
        assert!(parse_frame_header([3, 0, 0, 0, 0, 0, 0, 1]).is_err());
        // A TTY's raw output starts with text, not a header.
        assert!(parse_frame_header(*b"hello wo").is_err());
    }

    #[test]
    fn stdout_is_read_through_and_stderr_kept_aside() {
        let mut wire = frame(1, b"line one\nli");
        wire.extend(frame(2, b"oops\n"));
        wire.extend(frame(1, b""));
        wire.extend(frame(1, b"ne two\n"));
        wire.extend(frame(2, b"again\n"));
        let mut demux = Demux::new(&wire[..]);
        let lines: Vec<String> = (&mut demux).lines().map(|line| line.unwrap()).collect();
        assert_eq!(lines, ["line one", "line two"]);
        assert_eq!(demux.stderr_head(), b"oops\nagain\n");
        assert_eq!(demux.stderr_bytes(), 11);
    }

    #[test]
    fn stderr_beyond_the_cap_is_counted_not_kept() {
        let big = vec![b'e'; STDERR_KEEP_BYTES + 10];
        let mut wire = frame(2, &big);
        wire.extend(frame(1, b"out"));
        let mut demux = Demux::new(&wire[..]);
        let mut stdout = String::new();
        demux.read_to_string(&mut stdout).unwrap();
        assert_eq!(stdout, "out");
        assert_eq!(demux.stderr_head().len(), STDERR_KEEP_BYTES);
        assert_eq!(demux.stderr_bytes(), big.len() as u64);
    }

    #[test]
    fn a_stream_cut_inside_a_frame_is_an_error_not_an_end() {
        let mut wire = frame(1, b"hello");
        wire.truncate(wire.len() - 2);
        let mut stdout = Vec::new();
        let error = Demux::new(&wire[..]).read_to_end(&mut stdout).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
        assert_eq!(stdout, b"hel");
        let error = Demux::new(&[1u8, 0, 0][..]).read_to_end(&mut Vec::new()).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn event_lines() {
        let event = decode_event(
            br#"{"status":"die","id":"abc","from":"busybox","Type":"container","Action":"die","Actor":{"ID":"abc","Attributes":{"exitCode":"3","run":"r1"}},"scope":"local","time":1700000000,"timeNano":1700000000123456789}"#,
        )
        .unwrap();
        assert_eq!(event.kind, "container");
        assert_eq!(event.action, "die");
        assert_eq!(event.actor.id, "abc");
        assert_eq!(event.actor.attributes.get("exitCode").map(String::as_str), Some("3"));
        assert_eq!(event.time_nano, 1_700_000_000_123_456_789);
        assert!(decode_event(b"not json").is_err());
    }

    #[test]
    fn event_lines_are_bounded() {
        let mut wire = vec![b'x'; 20];
        wire.push(b'\n');
        assert!(read_line_capped(&mut &wire[..], 10).is_err());
        assert_eq!(read_line_capped(&mut &b"{}\n{}"[..], 10).unwrap(), Some(b"{}".to_vec()));
        assert_eq!(read_line_capped(&mut &b""[..], 10).unwrap(), None);
    }
}
