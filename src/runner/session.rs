//! A session sandbox's runner (`runner await-assignment
//! --session-until-ms`): it takes call after call (`sandbox::session`),
//! one at a time, each run in the same workdir as `runner exec` runs a
//! command, with the frames tagged by the call's own tag, until it has
//! been idle for `--max-wait-ms`, its lifetime ends, or it is stopped.
//!
//! - On a port (Kubernetes), every connection is one `POST`: `/assign`
//!   with a call while none runs is answered `200` and then the call's
//!   frames, streamed until its result (the log gets them too, which stays
//!   the record); while one runs, `409`; `/cancel` naming the running
//!   call's tag stops it (`202`), any other `409`. A wrong key is `401`.
//! - On stdin (Docker), each line is one message; nobody is answered: the
//!   attach that wrote the line reads the container's output.
//!
//! What a call started ends with it: its process group, and (the runner
//! being the sandbox's first process) every process that left the group
//! (`process::kill_strays`). A command's death (timeout, OOM kill) is the
//! call's; the runner goes on to the next call.

#![allow(unsafe_code)] // waitpid(-1) reaps what a call started, which std cannot name.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use crate::runner::assign::{self, Refusal, Served};
use crate::runner::capture::{self, FrameSink};
use crate::runner::init;
use crate::sandbox::args::{AssignOptions, Endpoint};
use crate::sandbox::assignment::{self, Assignment, Key};
use crate::sandbox::frame::{Frame, RunResult, Tag};
use crate::sandbox::session::{self, Message};

/// How often the waiting loop looks at the clock and the stop flag.
const TICK: Duration = Duration::from_millis(100);

/// A call taken, for the main loop to run: where to stream its frames (a
/// connection, on a port) and the flag a cancel sets.
struct Taken {
    call: Assignment,
    tag: Tag,
    reply: Option<TcpStream>,
    stop: Arc<AtomicBool>,
}

/// The call that runs now, if any (its tag and stop flag), and the tags
/// of the calls taken before it, newest last.
#[derive(Default)]
struct Calls {
    running: Option<(Tag, Arc<AtomicBool>)>,
    taken: std::collections::VecDeque<Tag>,
}

type Current = Arc<Mutex<Calls>>;

/// Tags remembered: a call sent again (a delivery that could not tell it
/// arrived) is recognised for this many calls after it.
const REMEMBERED_TAGS: usize = 64;

/// What a message does, given the call that runs now.
#[derive(Debug, PartialEq)]
enum Decision {
    /// Run it; the call is now the current one.
    Run,
    /// Another call runs.
    Busy,
    /// The current call was asked to stop.
    Cancelled,
    /// A cancel for a call that is not running (over, or never was).
    NoSuchCall,
    /// A call taken already, sent again: ignored.
    Again,
}

/// The one rule of a session's runner: one call at a time, and a cancel
/// reaches only the call it names.
fn decide(current: &Current, message: &Message) -> (Decision, Option<Arc<AtomicBool>>) {
    let mut calls = current.lock().unwrap_or_else(PoisonError::into_inner);
    let Calls { running, taken } = &mut *calls;
    match (message, running.as_ref()) {
        (Message::Call(call), _) if call.tag.is_some_and(|tag| taken.contains(&tag)) => (Decision::Again, None),
        (Message::Call(call), None) => {
            let stop = Arc::new(AtomicBool::new(false));
            // `session::decode` refused a call without its tag.
            let Some(tag) = call.tag else { return (Decision::NoSuchCall, None) };
            *running = Some((tag, stop.clone()));
            remember(taken, tag);
            (Decision::Run, Some(stop))
        }
        (Message::Call(call), Some(_)) => {
            // Refused once: the same call sent again is refused no more
            // (its sender has its answer), nor run later.
            if let Some(tag) = call.tag {
                remember(taken, tag);
            }
            (Decision::Busy, None)
        }
        (Message::Cancel(tag), Some((running, stop))) if tag == running => {
            stop.store(true, Ordering::SeqCst);
            (Decision::Cancelled, None)
        }
        (Message::Cancel(_), _) => (Decision::NoSuchCall, None),
    }
}

fn remember(taken: &mut std::collections::VecDeque<Tag>, tag: Tag) {
    if taken.len() == REMEMBERED_TAGS {
        taken.pop_front();
    }
    taken.push_back(tag);
}

/// The session: calls until idle for `max_wait`, past `until_ms`, or a
/// SIGTERM. Returns the runner's exit code.
pub fn run_session(options: &AssignOptions, until_ms: u64) -> Result<i32, String> {
    let terminate = Arc::new(AtomicBool::new(false));
    for signal in [libc::SIGTERM, libc::SIGINT] {
        signal_hook::flag::register(signal, terminate.clone()).map_err(|error| format!("cannot handle signal {signal}: {error}"))?;
    }
    let current: Current = Arc::new(Mutex::new(Calls::default()));
    let (sender, calls) = mpsc::channel::<Taken>();
    match &options.listen {
        Endpoint::Port(port) => {
            let key_file = options.key_file.as_deref().ok_or("--port needs --key-file")?;
            let key = super::key::take(key_file)?;
            let listener = assign::listen(*port).map_err(|error| format!("cannot listen on port {port}: {error}"))?;
            let readers = start_readers(&key, &options.workdir, &current, &sender)?;
            drop(sender);
            std::thread::Builder::new()
                .name("session-listener".into())
                .spawn(move || serve_port(&listener, &readers))
                .map_err(|error| format!("cannot start the listener: {error}"))?;
        }
        Endpoint::Stdin => {
            let stdin = io::stdin().as_fd().try_clone_to_owned().map_err(|error| format!("cannot read stdin: {error}"))?;
            let (current, workdir) = (current.clone(), options.workdir.clone());
            std::thread::Builder::new()
                .name("session-stdin".into())
                .spawn(move || serve_stdin(std::fs::File::from(stdin), &workdir, &current, &sender))
                .map_err(|error| format!("cannot start the stdin reader: {error}"))?;
        }
    }
    let mut idle_since = Instant::now();
    loop {
        if terminate.load(Ordering::SeqCst) || super::now_ms() >= until_ms || idle_since.elapsed() >= options.max_wait {
            return Ok(0);
        }
        match calls.recv_timeout(TICK) {
            Ok(taken) => {
                run_call(&options.workdir, taken, &terminate);
                current.lock().unwrap_or_else(PoisonError::into_inner).running = None;
                idle_since = Instant::now();
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            // The reader is gone (stdin closed): no call can come.
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(0),
        }
    }
}

/// One call: its files, then its command as `runner exec` runs it, its
/// frames to the log and to the connection that brought it.
fn run_call(workdir: &Path, taken: Taken, terminate: &Arc<AtomicBool>) {
    let Taken { call, tag, reply, stop } = taken;
    let reply = reply.and_then(|mut stream| {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n";
        stream.write_all(head.as_bytes()).ok().map(|()| stream)
    });
    // Ended gently after the call: a close with bytes still unread would
    // reset the connection, and the proxy in between would drop the frames
    // it had not passed on yet.
    let gentle = reply.as_ref().and_then(|stream| stream.try_clone().ok());
    let sink = FrameSink::tagged(tag, Box::new(Tee { log: io::stdout(), reply }));
    run_with(workdir, &call, &sink, stop, terminate);
    if let Some(stream) = gentle {
        assign::close_gently(stream);
    }
}

/// The call's files, then its command, frames to `sink`.
fn run_with(workdir: &Path, call: &Assignment, sink: &FrameSink, stop: Arc<AtomicBool>, terminate: &Arc<AtomicBool>) {
    let prepared = call.files.iter().try_for_each(|file| init::write_input(workdir, &file.path, &file.content, file.mode));
    if let Err(why) = prepared {
        let mut result = RunResult::started(super::now_ms());
        result.start_error = Some(format!("the call's input files could not be written: {why}"));
        result.finished_at_ms = result.started_at_ms;
        capture::write_frame(sink, &Frame::Result(result));
        return;
    }
    // A SIGTERM to the session stops the call that runs, as it would a
    // one-shot run's command.
    let (call_over, over) = mpsc::channel::<()>();
    let relay = {
        let (terminate, stop) = (terminate.clone(), stop.clone());
        std::thread::spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = over.recv_timeout(TICK) {
                if terminate.load(Ordering::SeqCst) {
                    stop.store(true, Ordering::SeqCst);
                }
            }
        })
    };
    super::run_exec_until(&call.exec, &call.env, sink, &stop);
    drop(call_over);
    let _ = relay.join();
    reap_orphans();
}

/// How long the processes a call left are waited for after their kill.
const ORPHAN_WAIT: Duration = Duration::from_secs(1);

/// Waits for the processes the call left (killed by `kill_strays`, and
/// re-parented to the runner, the sandbox's first process), so that none
/// lingers as a zombie the next call would see with `kill -0` or `ps`.
fn reap_orphans() {
    if std::process::id() != 1 {
        return;
    }
    let deadline = Instant::now() + ORPHAN_WAIT;
    while Instant::now() < deadline {
        let mut status = 0;
        // SAFETY: waitpid(2) for any child, not blocking; it touches only the
        // status integer it is given.
        match unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } {
            // No child left at all.
            -1 => return,
            // Children left, none ended yet: they are dying from SIGKILL.
            0 => std::thread::sleep(Duration::from_millis(5)),
            _reaped => {}
        }
    }
}

/// Frames to the log (the record) and, while it takes them, to the
/// connection that brought the call. A connection that fails is dropped:
/// the server reads the log then.
struct Tee {
    log: io::Stdout,
    reply: Option<TcpStream>,
}

impl Write for Tee {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.log.write_all(bytes)?;
        if let Some(reply) = &mut self.reply
            && reply.write_all(bytes).is_err()
        {
            self.reply = None;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if let Some(reply) = &mut self.reply {
            let _ = reply.flush();
        }
        self.log.flush()
    }
}

/// How long a reply may block the runner: a server that stopped reading
/// loses the stream, never the call.
const REPLY_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections read at once on a session's port. The server sends one
/// call at a time and, at most, its cancel; a few more leave room for a
/// peer that stalls. Each may hold a body of up to
/// `assignment::MAX_BODY_BYTES`, so the bound is also the memory's.
const MAX_SESSION_READERS: usize = 4;

/// A connection accepted on the port, for a reader, with the flag its
/// reader sets once the request is read.
type Accepted = (TcpStream, Arc<AtomicBool>);

/// Starts the port's `MAX_SESSION_READERS` reader threads, before any call
/// runs. An earlier version started a thread per connection: a command
/// that forked until the sandbox's process limit (threads count against
/// it too) left the runner no thread to read the cancel that would stop
/// it, so the connection was dropped (the API server answered 503) and
/// the command ran on to its timeout.
fn start_readers(key: &Key, workdir: &Path, current: &Current, calls: &mpsc::Sender<Taken>) -> Result<mpsc::Sender<Accepted>, String> {
    let (accepted, queue) = mpsc::channel::<Accepted>();
    let queue = Arc::new(Mutex::new(queue));
    for _ in 0..MAX_SESSION_READERS {
        let (key, workdir, current, calls, queue) = (key.clone(), workdir.to_path_buf(), current.clone(), calls.clone(), queue.clone());
        std::thread::Builder::new()
            .name("session-reader".into())
            .spawn(move || {
                loop {
                    // The lock is held only while waiting for the next one.
                    let next = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
                    let Ok((stream, read)) = next else { return };
                    serve_connection(stream, &key, &workdir, &current, &calls, &read);
                }
            })
            .map_err(|error| format!("cannot start a reader of the port: {error}"))?;
    }
    Ok(accepted)
}

/// The port's accept loop: each connection goes to a reader (`start_readers`),
/// at most `MAX_SESSION_READERS` being read or waiting to be; when a new one
/// comes, the oldest still unread is closed, so a peer that holds
/// connections open can keep out no delivery behind it.
fn serve_port(listener: &std::net::TcpListener, readers: &mpsc::Sender<Accepted>) {
    let mut unread: std::collections::VecDeque<(Arc<AtomicBool>, TcpStream)> = std::collections::VecDeque::new();
    loop {
        let stream = match listener.accept() {
            Ok((stream, _peer)) => stream,
            Err(error) if assign::is_transient(&error) => continue,
            Err(_) => return,
        };
        unread.retain(|(read, _)| !read.load(Ordering::SeqCst));
        if unread.len() >= MAX_SESSION_READERS
            && let Some((_, oldest)) = unread.pop_front()
        {
            let _ = oldest.shutdown(std::net::Shutdown::Both);
        }
        let Ok(handle) = stream.try_clone() else { continue };
        let read = Arc::new(AtomicBool::new(false));
        if readers.send((stream, read.clone())).is_err() {
            return;
        }
        unread.push_back((read, handle));
    }
}

/// One connection: a call (kept open to stream its frames) or a cancel.
/// `read` is set once the request is read: from then on the connection is
/// no longer one the accept loop may close to make room.
fn serve_connection(mut stream: TcpStream, key: &Key, workdir: &Path, current: &Current, calls: &mpsc::Sender<Taken>, read: &AtomicBool) {
    let served = Served { paths: &[assignment::PATH, session::CANCEL_PATH], max_body: assignment::MAX_BODY_BYTES };
    let request = assign::read_request_to(&mut stream, &served);
    read.store(true, Ordering::SeqCst);
    let (path, body) = match request {
        Ok(request) => request,
        Err(Refusal::Silent) => return,
        Err(Refusal::Status(code, text)) => return answer(stream, code, &text),
    };
    let message = match session::decode(&body) {
        Ok((sent_key, _)) if !sent_key.matches(key) => return answer(stream, 401, "wrong key"),
        Ok((_, message)) => message,
        Err(why) => return answer(stream, 400, &why),
    };
    let right_path = match &message {
        Message::Call(_) => path == assignment::PATH,
        Message::Cancel(_) => path == session::CANCEL_PATH,
    };
    if !right_path {
        return answer(stream, 400, "a call goes to /assign and a cancel to /cancel");
    }
    if let Message::Call(call) = &message
        && let Err(why) = assign::check_workdir(call, workdir)
    {
        return answer(stream, 400, &why);
    }
    let _ = stream.set_write_timeout(Some(REPLY_WRITE_TIMEOUT));
    let _ = stream.set_read_timeout(None);
    dispatch(message, Some(stream), current, calls);
}

fn answer(mut stream: TcpStream, code: u16, text: &str) {
    let _ = assign::respond(&mut stream, code, text);
    assign::close_gently(stream);
}

/// How long a call that finds another running waits for it to end before
/// it is refused: the server sends the next call as soon as it has read the
/// last one's result, which the runner writes a moment before it is done.
const BUSY_WAIT: Duration = Duration::from_secs(2);

/// `decide`, giving a running call `BUSY_WAIT` to end first when a new
/// call comes (a call sent again is decided at once).
fn decide_waiting(current: &Current, message: &Message) -> (Decision, Option<Arc<AtomicBool>>) {
    if let Message::Call(call) = message {
        let deadline = Instant::now() + BUSY_WAIT;
        let waits = || {
            let calls = current.lock().unwrap_or_else(PoisonError::into_inner);
            calls.running.is_some() && !call.tag.is_some_and(|tag| calls.taken.contains(&tag))
        };
        while Instant::now() < deadline && waits() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    decide(current, message)
}

/// What every message comes to, on a port or on stdin: the decision, and
/// the answer where there is a connection to answer on.
fn dispatch(message: Message, reply: Option<TcpStream>, current: &Current, calls: &mpsc::Sender<Taken>) {
    let (decision, stop) = decide_waiting(current, &message);
    let answered = |code: u16, text: &str| {
        if let Some(stream) = reply.as_ref().and_then(|stream| stream.try_clone().ok()) {
            answer(stream, code, text);
        }
    };
    match (decision, message, stop) {
        (Decision::Run, Message::Call(call), Some(stop)) => {
            let Some(tag) = call.tag else { return };
            let taken = Taken { call: *call, tag, reply, stop };
            if let Err(mpsc::SendError(taken)) = calls.send(taken) {
                // The main loop is gone (the session ends): nothing runs.
                current.lock().unwrap_or_else(PoisonError::into_inner).running = None;
                if let Some(stream) = taken.reply {
                    answer(stream, 503, "the session is ending");
                }
            }
        }
        (Decision::Busy, Message::Call(call), _) if reply.is_none() && call.tag.is_some() => {
            let Some(tag) = call.tag else { return };
            // Nobody to answer on stdin: the refused call's own frames say it.
            let mut result = RunResult::started(super::now_ms());
            result.start_error = Some(session::BUSY.to_string());
            result.finished_at_ms = result.started_at_ms;
            capture::write_frame(&FrameSink::tagged(tag, Box::new(io::stdout())), &Frame::Result(result));
        }
        (Decision::Busy, ..) => answered(409, session::BUSY),
        (Decision::Again, ..) => answered(409, "this call was taken already"),
        (Decision::Cancelled, ..) => answered(202, "the call is being stopped"),
        (Decision::NoSuchCall, ..) | (Decision::Run, ..) => answered(409, "no such call runs in this sandbox"),
    }
}

/// Stdin's lines, each one message, each bounded by
/// `assignment::MAX_BODY_BYTES` (a longer one is skipped to its end).
/// Stdin carries no key: only a Docker API client can write to it.
fn serve_stdin(input: impl Read, workdir: &Path, current: &Current, calls: &mpsc::Sender<Taken>) {
    let mut input = BufReader::new(input);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = read_line_bounded(&mut input, &mut line, assignment::MAX_BODY_BYTES);
        match read {
            Ok((0, _)) | Err(_) => return,
            Ok((_, true)) => eprintln!("mcp-k8s-ephemeral-job runner: a message on stdin was longer than its bound; skipped"),
            Ok((_, false)) => match session::decode(&line) {
                Ok((_, Message::Call(call))) if assign::check_workdir(&call, workdir).is_err() => {
                    eprintln!("mcp-k8s-ephemeral-job runner: a call for another workdir was refused");
                }
                Ok((_, message)) => dispatch(message, None, current, calls),
                Err(why) => eprintln!("mcp-k8s-ephemeral-job runner: a message on stdin was refused: {why}"),
            },
        }
    }
}

/// One line into `line` (without its newline), keeping at most `max`
/// bytes: the bytes consumed (0 at the end of the input) and whether the
/// line was longer than `max`.
fn read_line_bounded(input: &mut impl BufRead, line: &mut Vec<u8>, max: usize) -> io::Result<(usize, bool)> {
    let (mut consumed, mut overlong) = (0, false);
    loop {
        let available = input.fill_buf()?;
        if available.is_empty() {
            return Ok((consumed, overlong));
        }
        let (part, ends) = match available.iter().position(|byte| *byte == b'\n') {
            Some(end) => (&available[..end], Some(end + 1)),
            None => (available, None),
        };
        if overlong || line.len() + part.len() > max {
            overlong = true;
            line.clear();
        } else {
            line.extend_from_slice(part);
        }
        let used = ends.unwrap_or(available.len());
        input.consume(used);
        consumed += used;
        if ends.is_some() {
            return Ok((consumed, overlong));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::frame::TAG_BYTES;

    fn call(tag: u8) -> Message {
        let exec = crate::sandbox::args::parse_exec(["--", "true"].iter().map(Into::into).collect()).unwrap();
        let tag = Some(Tag::from_bytes([tag; TAG_BYTES]));
        Message::Call(Box::new(Assignment { run_id: "call".into(), exec, env: Default::default(), files: Vec::new(), tag }))
    }

    fn cancel(tag: u8) -> Message {
        Message::Cancel(Tag::from_bytes([tag; TAG_BYTES]))
    }

    /// One call at a time; a cancel reaches only the call it names; the
    /// next call is taken once the first is over.
    #[test]
    fn one_call_at_a_time_and_a_cancel_reaches_only_its_call() {
        let current: Current = Arc::new(Mutex::new(Calls::default()));
        assert_eq!(decide(&current, &cancel(1)).0, Decision::NoSuchCall, "nothing runs");
        let (first, stop) = decide(&current, &call(1));
        assert_eq!(first, Decision::Run);
        let stop = stop.unwrap();
        assert_eq!(decide(&current, &call(2)).0, Decision::Busy);
        assert_eq!(decide(&current, &call(2)).0, Decision::Again, "refused once, a call sent again is not run later");
        assert_eq!(decide(&current, &cancel(2)).0, Decision::NoSuchCall, "another call's tag");
        assert!(!stop.load(Ordering::SeqCst));
        assert_eq!(decide(&current, &cancel(1)).0, Decision::Cancelled);
        assert!(stop.load(Ordering::SeqCst));
        assert_eq!(decide(&current, &call(1)).0, Decision::Again, "a call sent again while it runs");
        current.lock().unwrap().running = None;
        assert_eq!(decide(&current, &call(1)).0, Decision::Again, "a call sent again after it ran");
        assert_eq!(decide(&current, &call(3)).0, Decision::Run, "the next call, once the first is over");
    }

    #[test]
    fn stdin_lines_are_bounded_and_an_overlong_one_is_skipped_whole() {
        let mut input = BufReader::with_capacity(4, &b"short\nmuch too long a line\nnext\nlast"[..]);
        let mut line = Vec::new();
        let mut lines = Vec::new();
        loop {
            line.clear();
            let (consumed, overlong) = read_line_bounded(&mut input, &mut line, 8).unwrap();
            if consumed == 0 {
                break;
            }
            lines.push((String::from_utf8_lossy(&line).into_owned(), overlong));
        }
        let expected = [("short", false), ("", true), ("next", false), ("last", false)];
        assert_eq!(lines, expected.map(|(text, overlong)| (text.to_string(), overlong)));
    }
}
