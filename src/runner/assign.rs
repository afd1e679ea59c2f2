//! `runner await-assignment`'s listener: a warm pool sandbox's
//! runner waits for exactly one valid assignment (`sandbox::assignment`),
//! sent by the server through the API server's `pods/proxy` as one
//! `POST /assign` with a `Content-Length`. Every connection is read under
//! bounds (head size, body size, a deadline per connection) and answered
//! with one status and a line of text, then closed:
//!
//! - `202`: the key matched and the assignment is taken; the listener is
//!   closed before the command starts, so a second assignment finds the
//!   port refused;
//! - `401` (a wrong key), `400` (a malformed head or body, an assignment
//!   for another workdir), `404`, `405`, `411`, `413`, `431`, `408`: the
//!   runner keeps waiting for a valid one.
//!
//! A minimal HTTP/1.1 reader of our own, not `tiny_http` (which aborted on
//! a huge Content-Length and bounded nothing) nor the server's transport
//! (the runner imports only `sandbox`): one request per connection, each
//! connection read on a thread of its own (up to `MAX_READERS`), no
//! keep-alive, no chunked bodies. The only peer should be the API server,
//! but a slow or silent connection holds only itself, never the delivery
//! behind it; each costs at most `CONNECTION_DEADLINE`.
//!
//! A Docker sandbox takes its assignment on stdin instead (`--stdin`,
//! `await_stdin`): it may have no network at all, and only a Docker API
//! client can write to a container's stdin, which the daemon closes when
//! that one attach ends (`StdinOnce`). The body alone arrives, ended by
//! end-of-file, under the same size bound and a deadline once it began;
//! there is nobody to answer, so a refusal ends the runner (the server
//! sees a container that ended without a result).
//!
//! Knows nothing of pools, of the engine or of what the command does: the
//! caller (`runner::run_await_assignment`) writes the files and runs it.

#![allow(unsafe_code)] // poll(2) on the assignment's socket with a deadline (std has no readiness wait).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::http1;
use crate::sandbox::assignment::{self, Assignment, Key};

/// Request line and headers together, at most.
pub const MAX_HEAD_BYTES: usize = 8 << 10;
/// The most header lines a request head may have: a server's delivery
/// sends a handful.
const MAX_HEADERS: usize = 32;
/// How long one connection may take to send its whole request.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);

/// Why no assignment was taken.
#[derive(Debug)]
pub enum Error {
    /// `max_wait` passed without a valid assignment.
    NoAssignment { waited: Duration },
    /// The listener itself failed.
    Listen(io::Error),
    /// The assignment was taken but the sandbox could not be made ready
    /// for it (an input file could not be written).
    Prepare(String),
    /// What came on stdin is not an assignment for this sandbox: nothing
    /// runs (stdin is one-shot, so there is no second try).
    Refused(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NoAssignment { waited } => write!(formatter, "no assignment arrived within {} ms; giving up", waited.as_millis()),
            Error::Listen(error) => write!(formatter, "cannot listen for the assignment: {error}"),
            Error::Prepare(why) => write!(formatter, "the assignment was taken but could not be prepared: {why}"),
            Error::Refused(why) => write!(formatter, "the assignment on stdin was refused: {why}"),
        }
    }
}

/// Listens on every address of `port` (IPv6 and IPv4 where the pod has
/// both, else IPv4 alone).
pub fn listen(port: u16) -> io::Result<TcpListener> {
    TcpListener::bind(("::", port)).or_else(|_| TcpListener::bind(("0.0.0.0", port)))
}

/// A listening socket the runner waits on (`--port`).
pub trait Listener: AsRawFd {
    type Stream: Connection;
    fn accept_one(&self) -> io::Result<Self::Stream>;
}

/// One accepted connection, whichever the listener.
pub trait Connection: Read + Write + Sized {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn shutdown_write(&self) -> io::Result<()>;
    /// A second handle on the same connection, to close it from elsewhere.
    fn another_handle(&self) -> io::Result<Self>;
    /// Closes both directions: a read blocked on it returns.
    fn shutdown_both(&self) -> io::Result<()>;
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    fn accept_one(&self) -> io::Result<TcpStream> {
        self.accept().map(|(stream, _peer)| stream)
    }
}

impl Connection for TcpStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, timeout)
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
    fn another_handle(&self) -> io::Result<TcpStream> {
        self.try_clone()
    }
    fn shutdown_both(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Both)
    }
}

/// Connections read at once. Each is read on a thread of its own, so a
/// slow or silent peer holds only itself, not the listener: the delivery
/// that follows it is read at once. Past this many, the oldest is closed
/// to make room, so peers that hold many connections cannot keep the
/// delivery out either (each holds a thread and at most one body).
const MAX_READERS: usize = 16;

/// Serves `listener` until one request carries `key` and an assignment
/// for `workdir`, then closes the listener (nothing more is accepted),
/// lets `prepare` make the sandbox ready for it (write the input files),
/// and answers `202`, or `500` with `prepare`'s error, which ends the
/// wait: a sandbox that failed half-way is not offered again.
pub fn await_assignment<L: Listener>(
    listener: L,
    key: &Key,
    workdir: &Path,
    max_wait: Duration,
    prepare: impl FnOnce(&Assignment) -> Result<(), String>,
) -> Result<Assignment, Error>
where
    L::Stream: Send + 'static,
{
    let deadline = Instant::now() + max_wait;
    let (taken, verdicts) = std::sync::mpsc::channel::<(L::Stream, Assignment)>();
    // The connections being read, oldest first: whether each reader is
    // done, and a handle to close it with.
    let mut readers: std::collections::VecDeque<(std::sync::Arc<std::sync::atomic::AtomicBool>, L::Stream)> =
        std::collections::VecDeque::new();
    loop {
        if let Ok((mut stream, assignment)) = verdicts.try_recv() {
            drop(listener);
            if let Err(why) = prepare(&assignment) {
                let _ = respond(&mut stream, 500, &why);
                return Err(Error::Prepare(why));
            }
            let text = format!("assignment for run `{}` taken", assignment.run_id);
            // The command runs whether or not the answer got through: the
            // server follows the log either way.
            let _ = respond(&mut stream, 202, &text);
            return Ok(assignment);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::NoAssignment { waited: max_wait });
        }
        readers.retain(|(done, _)| !done.load(std::sync::atomic::Ordering::SeqCst));
        // While a connection is being read, wake often for its verdict.
        let slice = if readers.is_empty() { deadline - now } else { Duration::from_millis(5) };
        if !readable(&listener, slice.min(deadline - now)).map_err(Error::Listen)? {
            continue;
        }
        let stream = match listener.accept_one() {
            Ok(stream) => stream,
            // A peer that gave up between poll and accept; keep waiting.
            Err(error) if is_transient(&error) => continue,
            Err(error) => return Err(Error::Listen(error)),
        };
        if readers.len() >= MAX_READERS
            && let Some((_, oldest)) = readers.pop_front()
        {
            let _ = oldest.shutdown_both();
        }
        let Ok(handle) = stream.another_handle() else { continue };
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (key, workdir, taken, finished) = (key.clone(), workdir.to_path_buf(), taken.clone(), done.clone());
        let spawned = std::thread::Builder::new().name("assignment-reader".into()).spawn(move || {
            read_one(stream, &key, &workdir, &taken);
            finished.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        if spawned.is_ok() {
            readers.push_back((done, handle));
        }
    }
}

/// Reads and judges one connection: a valid assignment goes to `taken`
/// (the waiting loop answers it), anything else is answered here.
fn read_one<S: Connection>(mut stream: S, key: &Key, workdir: &Path, taken: &std::sync::mpsc::Sender<(S, Assignment)>) {
    match read_request(&mut stream).and_then(|body| judge(&body, key, workdir)) {
        // After another was taken the loop is gone, and so is this one.
        Ok(assignment) => drop(taken.send((stream, assignment))),
        Err(Refusal::Silent) => {}
        Err(Refusal::Status(code, text)) => {
            let _ = respond(&mut stream, code, &text);
            close_gently(stream);
        }
    }
}

/// Takes one assignment from `input` (the runner's stdin): waits up to
/// `max_wait` for its first byte, then reads the body to end-of-file
/// within `CONNECTION_DEADLINE` and `assignment::MAX_BODY_BYTES`, checks
/// it is for `workdir`, and lets `prepare` make the sandbox ready for it.
/// Stdin carries no key: only a Docker API client can write to it.
pub fn await_stdin<R: Read + AsRawFd>(
    mut input: R,
    workdir: &Path,
    max_wait: Duration,
    prepare: impl FnOnce(&Assignment) -> Result<(), String>,
) -> Result<Assignment, Error> {
    let body = read_to_end_of_file(&mut input, max_wait)?;
    let (_unchecked, assignment) = assignment::decode(&body).map_err(|error| Error::Refused(error.to_string()))?;
    check_workdir(&assignment, workdir).map_err(Error::Refused)?;
    prepare(&assignment).map_err(Error::Prepare)?;
    Ok(assignment)
}

/// The whole of `input` up to its end-of-file, bounded in size and time.
fn read_to_end_of_file(input: &mut (impl Read + AsRawFd), max_wait: Duration) -> Result<Vec<u8>, Error> {
    let mut deadline = Instant::now() + max_wait;
    let mut body = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(if body.is_empty() {
                Error::NoAssignment { waited: max_wait }
            } else {
                Error::Refused(format!("the body did not end within {} s of its first byte", CONNECTION_DEADLINE.as_secs()))
            });
        }
        if !readable(input, deadline - now).map_err(Error::Listen)? {
            continue;
        }
        let read = match input.read(&mut chunk) {
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(Error::Listen(error)),
        };
        if read == 0 {
            return if body.is_empty() { Err(Error::Refused("stdin ended before an assignment arrived".to_string())) } else { Ok(body) };
        }
        if body.is_empty() {
            // Under way: the rest comes at once or not at all.
            deadline = now + CONNECTION_DEADLINE;
        }
        if body.len() + read > assignment::MAX_BODY_BYTES {
            return Err(Error::Refused(format!("more than {} bytes arrived; an assignment is at most that", assignment::MAX_BODY_BYTES)));
        }
        body.extend_from_slice(&chunk[..read]);
    }
}

/// Why one request was not taken: an answer, or none when the peer sent
/// nothing at all (a TCP readiness probe connects and closes).
#[derive(Debug, PartialEq)]
pub enum Refusal {
    Silent,
    Status(u16, String),
}

fn refuse(code: u16, text: impl Into<String>) -> Refusal {
    Refusal::Status(code, text.into())
}

/// The body, once the head says it is a POST to the assignment path with
/// a bounded `Content-Length`.
fn read_request(stream: &mut impl Connection) -> Result<Vec<u8>, Refusal> {
    read_request_to(stream, &Served { paths: &[assignment::PATH], max_body: assignment::MAX_BODY_BYTES }).map(|(_, body)| body)
}

/// What a listener of the runner's serves: the paths it answers (each a
/// `POST`) and the largest body it reads.
pub struct Served<'a> {
    pub paths: &'a [&'a str],
    pub max_body: usize,
}

/// The path and body of one request to `served`, read under the same
/// bounds as an assignment.
pub fn read_request_to(stream: &mut impl Connection, served: &Served) -> Result<(String, Vec<u8>), Refusal> {
    let deadline = Instant::now() + CONNECTION_DEADLINE;
    let mut buffer = Vec::with_capacity(1024);
    let head_end = loop {
        if let Some(end) = http1::head_end(&buffer) {
            break end;
        }
        if buffer.len() >= MAX_HEAD_BYTES {
            return Err(refuse(431, format!("the request head is over {MAX_HEAD_BYTES} bytes")));
        }
        match read_some(stream, &mut buffer, MAX_HEAD_BYTES, deadline) {
            Ok(0) if buffer.is_empty() => return Err(Refusal::Silent),
            Ok(0) => return Err(refuse(400, "the connection closed inside the request head")),
            Ok(_) => {}
            Err(error) => return Err(timeout_or_silent(&error, "the request head")),
        }
    };
    let head = parse_head_for(&buffer[..head_end], served)?;
    let mut body = buffer.split_off(head_end);
    if body.len() > head.content_length {
        return Err(refuse(400, "more bytes than Content-Length says: one request per connection"));
    }
    if head.expects_continue {
        let _ = stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    while body.len() < head.content_length {
        match read_some(stream, &mut body, head.content_length, deadline) {
            Ok(0) => return Err(refuse(400, format!("the body ended after {} of {} bytes", body.len(), head.content_length))),
            Ok(_) => {}
            Err(error) => return Err(timeout_or_silent(&error, "the body")),
        }
    }
    Ok((head.target, body))
}

fn timeout_or_silent(error: &io::Error, part: &str) -> Refusal {
    if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
        refuse(408, format!("{part} did not arrive within {} s", CONNECTION_DEADLINE.as_secs()))
    } else {
        Refusal::Silent
    }
}

/// What the runner needs of a request head.
#[derive(Debug, PartialEq)]
struct Head {
    target: String,
    content_length: usize,
    expects_continue: bool,
}

/// A complete head (its `\r\n\r\n` included), its lines and fields read
/// by `http1` like every head here.
#[cfg(test)]
fn parse_head(head: &[u8]) -> Result<Head, Refusal> {
    parse_head_for(head, &Served { paths: &[assignment::PATH], max_body: assignment::MAX_BODY_BYTES })
}

fn parse_head_for(head: &[u8], served: &Served) -> Result<Head, Refusal> {
    let (request_line, fields) = http1::split(head, MAX_HEADERS).map_err(|error| refuse(400, error.to_string()))?;
    let request_line = std::str::from_utf8(request_line).map_err(|_| refuse(400, "the request line is not UTF-8"))?;
    let mut parts = request_line.split(' ');
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    let (Some(method), Some(target), Some(version), None) = (method, target, version, parts.next()) else {
        return Err(refuse(400, "the request line is not `METHOD PATH HTTP/1.1`"));
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(refuse(400, format!("`{}` is not HTTP/1.1", crate::echo::shorten(version))));
    }
    if !served.paths.contains(&target) {
        return Err(refuse(404, format!("only {} is served here", served.paths.join(" and "))));
    }
    if method != "POST" {
        return Err(refuse(405, format!("{target} takes POST only")));
    }
    if http1::values(&fields, "transfer-encoding").next().is_some() {
        return Err(refuse(411, "send the body with a Content-Length, not a Transfer-Encoding"));
    }
    let mut content_length = None;
    for value in http1::values(&fields, "content-length") {
        let length = http1::content_length(value)
            .and_then(|length| usize::try_from(length).ok())
            .ok_or_else(|| refuse(400, "Content-Length is not a number"))?;
        if content_length.is_some_and(|earlier| earlier != length) {
            return Err(refuse(400, "two different Content-Length headers"));
        }
        content_length = Some(length);
    }
    let expects_continue = http1::values(&fields, "expect").last().is_some_and(|value| value.eq_ignore_ascii_case("100-continue"));
    let content_length = content_length.ok_or_else(|| refuse(411, "the request needs a Content-Length"))?;
    if content_length > served.max_body {
        return Err(refuse(413, format!("the body is {content_length} bytes; {target} takes at most {}", served.max_body)));
    }
    Ok(Head { target: target.to_string(), content_length, expects_continue })
}

/// The assignment in `body`, if it carries `key` and is for `workdir`.
/// The key is compared before anything else of the body is acted on.
fn judge(body: &[u8], key: &Key, workdir: &Path) -> Result<Assignment, Refusal> {
    let (offered, assignment) = assignment::decode(body).map_err(|error| refuse(400, error.to_string()))?;
    if !offered.matches(key) {
        return Err(refuse(401, "the key does not match this sandbox's"));
    }
    check_workdir(&assignment, workdir).map_err(|why| refuse(400, why))?;
    Ok(assignment)
}

pub fn check_workdir(assignment: &Assignment, workdir: &Path) -> Result<(), String> {
    if assignment.exec.workdir == workdir {
        return Ok(());
    }
    Err(format!("the assignment's workdir `{}` is not this sandbox's `{}`", assignment.exec.workdir.display(), workdir.display()))
}

/// Reads more bytes into `buffer` before `deadline`, never past `up_to` in all.
fn read_some(stream: &mut impl Connection, buffer: &mut Vec<u8>, up_to: usize, deadline: Instant) -> io::Result<usize> {
    let limit = up_to.saturating_sub(buffer.len());
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::ErrorKind::TimedOut.into());
    }
    stream.set_read_timeout(Some(left))?;
    let mut chunk = [0u8; 16 << 10];
    let wanted = limit.min(chunk.len());
    let read = stream.read(&mut chunk[..wanted])?;
    buffer.extend_from_slice(&chunk[..read]);
    Ok(read)
}

pub fn respond(stream: &mut impl Connection, code: u16, text: &str) -> io::Result<()> {
    let reason = match code {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        500 => "Internal Server Error",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    let body = format!("{text}\n");
    stream.set_write_timeout(Some(CONNECTION_DEADLINE))?;
    let response = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes())?;
    stream.flush()
}

/// Closes after a refusal without resetting the connection: bytes the
/// peer sent past what was read (a body not read after a 413) would make
/// the kernel answer with a reset, which can destroy the answer in flight.
/// A bounded amount is read and dropped first.
pub fn close_gently(mut stream: impl Connection) {
    let _ = stream.shutdown_write();
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut drained = 0usize;
    let mut chunk = [0u8; 16 << 10];
    while drained < 1 << 20 {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(read) => drained += read,
        }
    }
}

/// Waits up to `timeout` (at most a second at a time) for a connection
/// or for bytes.
pub fn readable(listener: &impl AsRawFd, timeout: Duration) -> io::Result<bool> {
    let mut poll_fd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let millis = timeout.as_millis().clamp(1, 1000) as libc::c_int;
    // SAFETY: one valid pollfd for the length of the call.
    let ready = unsafe { libc::poll(&mut poll_fd, 1, millis) };
    match ready {
        -1 => {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(error) }
        }
        0 => Ok(false),
        _ => Ok(true),
    }
}

pub fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::args::ExecOptions;
    use std::net::SocketAddr;

    fn key() -> Key {
        Key::from_bytes([9; assignment::KEY_BYTES])
    }

    fn an_assignment(workdir: &str) -> Assignment {
        Assignment {
            run_id: "r1".into(),
            exec: ExecOptions {
                workdir: workdir.into(),
                timeout: Duration::from_secs(5),
                kill_grace: Duration::from_secs(2),
                max_output_bytes: 1024,
                max_artifact_bytes: 1024,
                spill_bytes: 0,
                hold: None,
                artifact_patterns: Vec::new(),
                disk_paths: Vec::new(),
                disk_limit_bytes: 0,
                termination_log: crate::sandbox::TERMINATION_LOG.into(),
                start_deadline_ms: None,
                argv: vec!["true".into()],
            },
            env: Default::default(),
            files: Vec::new(),
            tag: None,
        }
    }

    fn post(body: &[u8]) -> Vec<u8> {
        let mut request = format!("POST /assign HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
        request.extend_from_slice(body);
        request
    }

    /// A runner waiting on a loopback port, and its address.
    fn waiting_runner(max_wait: Duration) -> (SocketAddr, std::thread::JoinHandle<Result<Assignment, Error>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let runner = std::thread::spawn(move || await_assignment(listener, &key(), Path::new("/work"), max_wait, |_| Ok(())));
        (address, runner)
    }

    /// Sends `request` (closing the write side) and returns the answer's
    /// status code and text.
    fn send(address: SocketAddr, request: &[u8]) -> (u16, String) {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(request).unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let code = answer.get(9..12).and_then(|code| code.parse().ok()).unwrap_or(0);
        let text = answer.split("\r\n\r\n").nth(1).unwrap_or_default().trim_end().to_string();
        (code, text)
    }

    /// Peers that hold more connections than are read at once make room
    /// for the delivery: the oldest are closed, and the delivery is taken.
    #[test]
    fn more_held_connections_than_readers_cannot_keep_the_delivery_out() {
        let (address, runner) = waiting_runner(Duration::from_secs(30));
        let held: Vec<TcpStream> = (0..MAX_READERS + 4)
            .map(|_| {
                let mut stream = TcpStream::connect(address).unwrap();
                stream.write_all(b"POST /assign HTTP/1.1\r\n").unwrap();
                stream
            })
            .collect();
        let (code, _) = send(address, &post(&assignment::encode(&key(), &an_assignment("/work"))));
        assert_eq!(code, 202);
        assert_eq!(runner.join().unwrap().unwrap(), an_assignment("/work"));
        let mut oldest = &held[0];
        let mut byte = [0u8; 1];
        assert_eq!(oldest.read(&mut byte).unwrap_or(0), 0, "the oldest held connection was closed to make room");
    }

    /// Slow peers (a job holding connections to an idle sandbox's port)
    /// hold only themselves: the delivery behind them is taken while they
    /// are still open and unanswered.
    #[test]
    fn slow_connections_do_not_hold_up_the_delivery_behind_them() {
        let (address, runner) = waiting_runner(Duration::from_secs(30));
        let slow: Vec<TcpStream> = (0..3)
            .map(|_| {
                let mut stream = TcpStream::connect(address).unwrap();
                stream.write_all(b"POST /assign HTTP/1.1\r\nHost: x\r\n").unwrap();
                stream
            })
            .collect();
        let (code, _) = send(address, &post(&assignment::encode(&key(), &an_assignment("/work"))));
        assert_eq!(code, 202);
        assert_eq!(runner.join().unwrap().unwrap(), an_assignment("/work"));
        for mut stream in slow {
            stream.set_nonblocking(true).unwrap();
            let mut byte = [0u8; 1];
            let unanswered = matches!(stream.read(&mut byte), Err(error) if error.kind() == io::ErrorKind::WouldBlock);
            assert!(unanswered, "a slow connection is still being read when the delivery was taken");
        }
    }

    #[test]
    fn refused_requests_leave_the_runner_waiting_and_the_first_valid_one_is_taken() {
        let (address, runner) = waiting_runner(Duration::from_secs(30));
        let wrong_key = assignment::encode(&Key::from_bytes([1; assignment::KEY_BYTES]), &an_assignment("/work"));
        let valid = assignment::encode(&key(), &an_assignment("/work"));
        let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
            ("a wrong key", post(&wrong_key), 401, "the key does not match this sandbox's"),
            ("another workdir", post(&assignment::encode(&key(), &an_assignment("/src"))), 400, "the assignment's workdir `/src`"),
            ("a malformed body", post(b"{\"v\":1}"), 400, "the body is not an assignment: missing field"),
            ("another path", b"POST /run HTTP/1.1\r\nContent-Length: 0\r\n\r\n".to_vec(), 404, "only /assign is served here"),
            ("another method", b"GET /assign HTTP/1.1\r\n\r\n".to_vec(), 405, "/assign takes POST only"),
            ("no length", b"POST /assign HTTP/1.1\r\n\r\n".to_vec(), 411, "the request needs a Content-Length"),
            (
                "a chunked body",
                b"POST /assign HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
                411,
                "send the body with a Content-Length",
            ),
            (
                "an oversized body",
                format!("POST /assign HTTP/1.1\r\nContent-Length: {}\r\n\r\n", assignment::MAX_BODY_BYTES + 1).into_bytes(),
                413,
                "the body is 8388609 bytes; /assign takes at most 8388608",
            ),
            (
                "an oversized head",
                format!("POST /assign HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD_BYTES)).into_bytes(),
                431,
                "the request head is over",
            ),
            ("a body cut short", post(&valid)[..100].to_vec(), 400, "the body ended after"),
            ("not HTTP", b"hello\r\n\r\n".to_vec(), 400, "the request line is not"),
        ];
        for (case, request, code, text) in cases {
            let (got_code, got_text) = send(address, &request);
            assert_eq!(got_code, code, "{case}: {got_text}");
            assert!(got_text.starts_with(text), "{case}: {got_text}");
        }
        // A readiness probe connects and closes without a word.
        drop(TcpStream::connect(address).unwrap());
        let (code, text) = send(address, &post(&valid));
        assert_eq!((code, text.as_str()), (202, "assignment for run `r1` taken"));
        let taken = runner.join().unwrap().unwrap();
        assert_eq!(taken, an_assignment("/work"));
        let second = TcpStream::connect(address);
        assert!(second.is_err(), "the listener is closed once assigned: a second assignment is refused");
    }

    #[test]
    fn a_large_assignment_arrives_whole() {
        let (address, runner) = waiting_runner(Duration::from_secs(30));
        let mut large = an_assignment("/work");
        let content: Vec<u8> = (0..768 * 1024).map(|index| (index % 251) as u8).collect();
        large.files.push(assignment::AssignedFile { path: "big.bin".into(), mode: 0o644, content });
        let (code, _) = send(address, &post(&assignment::encode(&key(), &large)));
        assert_eq!(code, 202);
        assert_eq!(runner.join().unwrap().unwrap(), large);
    }

    #[test]
    fn an_expect_100_continue_gets_its_interim_answer() {
        let (address, runner) = waiting_runner(Duration::from_secs(30));
        let body = assignment::encode(&key(), &an_assignment("/work"));
        let mut stream = TcpStream::connect(address).unwrap();
        let head = format!("POST /assign HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n", body.len());
        stream.write_all(head.as_bytes()).unwrap();
        let mut interim = [0u8; 25];
        stream.read_exact(&mut interim).unwrap();
        assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
        stream.write_all(&body).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 202 Accepted\r\n"), "{answer}");
        assert!(runner.join().unwrap().is_ok());
    }

    #[test]
    fn a_request_cut_off_in_its_head_is_refused_and_the_runner_gives_up_after_max_wait() {
        let (address, runner) = waiting_runner(Duration::from_millis(300));
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(b"POST /assign HTTP/1.1\r\n").unwrap();
        drop(stream);
        let started = Instant::now();
        match runner.join().unwrap() {
            Err(Error::NoAssignment { waited }) => assert_eq!(waited, Duration::from_millis(300)),
            other => panic!("expected NoAssignment, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5), "max_wait bounds the wait");
    }

    #[test]
    fn a_sandbox_that_cannot_be_prepared_answers_500_and_stops_waiting() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let runner = std::thread::spawn(move || {
            await_assignment(listener, &key(), Path::new("/work"), Duration::from_secs(30), |_| Err("disk full".to_string()))
        });
        let (code, text) = send(address, &post(&assignment::encode(&key(), &an_assignment("/work"))));
        assert_eq!((code, text.as_str()), (500, "disk full"));
        assert!(matches!(runner.join().unwrap(), Err(Error::Prepare(why)) if why == "disk full"));
        assert!(TcpStream::connect(address).is_err(), "not offered again");
    }

    /// A pipe whose write end `feed` gets; the read end is what the runner
    /// reads as its stdin.
    fn stdin_runner(max_wait: Duration, feed: impl FnOnce(std::fs::File) + Send + 'static) -> Result<Assignment, Error> {
        let mut fds = [0; 2];
        // SAFETY: two ints for the pipe's ends; both become owned files at once.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        use std::os::fd::FromRawFd;
        // SAFETY: fresh descriptors from pipe(2), owned by nobody else.
        let (reader, writer) = unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) };
        let feeder = std::thread::spawn(move || feed(writer));
        let taken = await_stdin(reader, Path::new("/work"), max_wait, |_| Ok(()));
        feeder.join().unwrap();
        taken
    }

    #[test]
    fn stdin_takes_one_body_to_its_end_and_refuses_the_rest() {
        let body = assignment::encode(&key(), &an_assignment("/work"));
        let whole = body.clone();
        let taken = stdin_runner(Duration::from_secs(30), move |mut writer| writer.write_all(&whole).unwrap());
        assert_eq!(taken.unwrap(), an_assignment("/work"), "any key: stdin has none to check");

        let cut = body[..body.len() / 2].to_vec();
        let refused = stdin_runner(Duration::from_secs(30), move |mut writer| writer.write_all(&cut).unwrap());
        assert!(matches!(&refused, Err(Error::Refused(why)) if why.starts_with("the body is not an assignment")), "{refused:?}");

        let other = assignment::encode(&key(), &an_assignment("/src"));
        let refused = stdin_runner(Duration::from_secs(30), move |mut writer| writer.write_all(&other).unwrap());
        assert!(matches!(&refused, Err(Error::Refused(why)) if why.contains("workdir `/src`")), "{refused:?}");

        let empty = stdin_runner(Duration::from_secs(30), drop);
        assert!(matches!(&empty, Err(Error::Refused(why)) if why == "stdin ended before an assignment arrived"), "{empty:?}");

        let huge = stdin_runner(Duration::from_secs(30), |mut writer| {
            let _ = writer.write_all(&vec![b' '; assignment::MAX_BODY_BYTES + 1]);
        });
        assert!(matches!(&huge, Err(Error::Refused(why)) if why.starts_with("more than 8388608 bytes")), "{huge:?}");
    }

    #[test]
    fn stdin_without_a_body_gives_up_after_max_wait() {
        let started = Instant::now();
        // The write end stays open past the wait: nothing, not even an end.
        let waited = stdin_runner(Duration::from_millis(300), |writer| {
            std::thread::sleep(Duration::from_millis(800));
            drop(writer);
        });
        assert!(matches!(waited, Err(Error::NoAssignment { waited }) if waited == Duration::from_millis(300)));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn heads_are_parsed_strictly() {
        let head = |text: &str| parse_head(format!("{text}\r\n\r\n").as_bytes());
        assert_eq!(
            head("POST /assign HTTP/1.1\r\ncontent-length: 12\r\nexpect: 100-Continue"),
            Ok(Head { target: "/assign".into(), content_length: 12, expects_continue: true })
        );
        assert!(head("POST /assign HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2").is_err());
        assert_eq!(head("POST /assign HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1").map(|head| head.content_length), Ok(1));
        assert!(head("POST /assign?x=1 HTTP/1.1\r\nContent-Length: 1").is_err());
        assert!(head("POST /assign HTTP/2\r\nContent-Length: 1").is_err());
        assert!(head("POST  /assign HTTP/1.1\r\nContent-Length: 1").is_err());
        assert!(head("POST /assign HTTP/1.1\r\nContent-Length: -1").is_err());
        assert!(head("POST /assign HTTP/1.1\r\nContent-Length: +1").is_err());
        assert!(head("POST /assign HTTP/1.1\nContent-Length: 1").is_err(), "a bare LF");
        assert!(head("POST /assign HTTP/1.1\r\nContent-Length : 1").is_err(), "space before the colon");
        assert!(head("POST /assign HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked").is_err());
        let many = format!("POST /assign HTTP/1.1\r\nContent-Length: 1{}", "\r\nA: b".repeat(MAX_HEADERS));
        assert!(head(&many).is_err(), "more than {MAX_HEADERS} header lines");
    }
}
