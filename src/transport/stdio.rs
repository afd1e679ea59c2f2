//! stdio transport: one JSON-RPC message per line on stdin, one per line on
//! stdout, and nothing else on stdout (logs go to stderr). A reader thread
//! hands lines to the protocol; a writer thread owns stdout, so concurrent
//! tool calls never interleave bytes. Input lines are capped; a longer line
//! is skipped and answered with an error instead of being buffered whole.
//!
//! What waits for stdout is bounded too (a client
//! that never read stdout grew the server by every reply). Replies queue
//! in a `ReplyQueue` counted in bytes; while it holds more than its cap,
//! the reader stops reading stdin (the client's writes then block: that is
//! the backpressure), and progress and log notifications are dropped and
//! counted instead of queued. Responses are never dropped.

use std::collections::VecDeque;
use std::io::{self, BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::json;

use crate::cancel::CancelToken;
use crate::log;
use crate::protocol::jsonrpc::{self, ErrorCode, Rejection, ResponseError};
use crate::protocol::{Outbox, Outgoing, Server, Session};
use crate::supervise;

/// One line of input as the reader sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line without its `\n` (or `\r\n`).
    Text(Vec<u8>),
    /// A line longer than the cap; its bytes were read and dropped but for
    /// the first `TOO_LONG_HEAD_BYTES`, where its id usually is.
    TooLong { head: Vec<u8> },
}

/// What is kept of an oversize line to find its id in.
const TOO_LONG_HEAD_BYTES: usize = 64 * 1024;

/// The sizes stdio bounds, from `MCP_K8S_MAX_MESSAGE_BYTES` and
/// `MCP_K8S_MAX_REPLY_QUEUE_BYTES`.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_message_bytes: usize,
    pub max_reply_queue_bytes: usize,
}

/// Serves the session on stdin/stdout until stdin ends or `stop` is
/// cancelled (a signal), then lets in-flight calls finish within `grace`.
pub fn serve(server: Arc<Server>, limits: Limits, grace: Duration, stop: CancelToken) -> io::Result<()> {
    let (outbox, outgoing) = mpsc::channel();
    let queue = Arc::new(ReplyQueue::new(limits.max_reply_queue_bytes));
    let writing_done = Arc::new(AtomicBool::new(false));
    let mover = {
        let (queue, writing_done) = (Arc::clone(&queue), Arc::clone(&writing_done));
        supervise::spawn(supervise::Kind::StdioQueue, move || queue_loop(&outgoing, &queue, &writing_done))?
    };
    let writer = {
        let queue = Arc::clone(&queue);
        supervise::spawn(supervise::Kind::StdioWriter, move || write_loop(&queue))?
    };
    {
        let (server, queue, stop) = (Arc::clone(&server), Arc::clone(&queue), stop.clone());
        // The reader is never joined: after a signal it may sit in a
        // blocking read of stdin that only the process exit ends.
        supervise::spawn(supervise::Kind::StdioReader, move || {
            read_loop(&server, limits.max_message_bytes, &outbox, &queue);
            log::info("stdin closed", &[]);
            stop.cancel();
        })?;
    }
    log::info("serving MCP on stdio", &[]);
    while !stop.wait_timeout(Duration::from_secs(3600)) {}
    let still_running = server.shut_down(grace, Duration::from_secs(5));
    if still_running > 0 {
        log::warn("calls did not stop in time", &[("calls", json!(still_running))]);
    }
    writing_done.store(true, Ordering::SeqCst);
    let _ = mover.join();
    let _ = writer.join();
    Ok(())
}

/// Serialized messages on their way to stdout, with what they weigh.
pub struct ReplyQueue {
    state: Mutex<QueueState>,
    changed: Condvar,
    max_bytes: usize,
}

struct QueueState {
    messages: VecDeque<String>,
    /// Bytes queued, including the message being written.
    bytes: usize,
    dropped_notifications: u64,
    /// No more messages will come; the writer stops once it is empty.
    closed: bool,
}

/// Most bytes `ReplyQueue::take_batch` gathers for one write, unless one
/// message alone is larger.
const BATCH_BYTES: usize = 64 * 1024;

/// What `ReplyQueue::take_batch` took.
#[derive(Debug, PartialEq)]
enum Batch {
    /// The queue is closed and empty.
    Closed,
    /// Lines of this many bytes, in the caller's buffer.
    Lines(usize),
    /// One message larger than a batch, without its newline.
    Alone(String),
}

/// What `ReplyQueue::push` did with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    Queued,
    /// A notification over the cap; this many have been dropped so far.
    Dropped {
        n_dropped: u64,
    },
    /// The queue is closed: stdout can no longer be written.
    Discarded,
}

impl ReplyQueue {
    pub fn new(max_bytes: usize) -> ReplyQueue {
        let state = QueueState { messages: VecDeque::new(), bytes: 0, dropped_notifications: 0, closed: false };
        ReplyQueue { state: Mutex::new(state), changed: Condvar::new(), max_bytes }
    }

    /// Queues a response always, a notification only while it fits under
    /// the cap: a client that does not read loses progress, never answers.
    /// Once closed (stdout failed), nothing is queued: nobody would write it.
    pub fn push(&self, message: Outgoing) -> Queued {
        let mut state = self.lock();
        if state.closed {
            return Queued::Discarded;
        }
        let text = match message {
            Outgoing::Response { text, .. } => text,
            Outgoing::Notification(text) if state.bytes + text.len() > self.max_bytes => {
                state.dropped_notifications += 1;
                return Queued::Dropped { n_dropped: state.dropped_notifications };
            }
            Outgoing::Notification(text) => text,
        };
        state.bytes += text.len() + 1;
        state.messages.push_back(text);
        self.changed.notify_all();
        Queued::Queued
    }

    /// Moves the next messages, each followed by `\n`, into `out`: at
    /// least one (waiting for it), more while they fit in `BATCH_BYTES`,
    /// so a flood of small answers costs one write each batch, not one
    /// each. A message larger than a batch comes alone, as it is, so a
    /// large answer is not copied. Taken bytes stay counted until
    /// `written`.
    fn take_batch(&self, out: &mut Vec<u8>) -> Batch {
        let mut state = self.lock();
        while state.messages.is_empty() {
            if state.closed {
                return Batch::Closed;
            }
            state = self.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        let start = out.len();
        while let Some(text) = state.messages.front() {
            if out.len() > start && out.len() - start + text.len() + 1 > BATCH_BYTES {
                break;
            }
            let alone = text.len() + 1 > BATCH_BYTES;
            let Some(text) = state.messages.pop_front() else { break };
            if alone {
                return Batch::Alone(text);
            }
            out.extend_from_slice(text.as_bytes());
            out.push(b'\n');
        }
        Batch::Lines(out.len() - start)
    }

    /// `bytes` taken by `take_batch` have reached stdout.
    pub fn written(&self, bytes: usize) {
        let mut state = self.lock();
        state.bytes = state.bytes.saturating_sub(bytes);
        self.changed.notify_all();
    }

    /// Blocks while more than the cap waits for stdout.
    fn wait_for_room(&self) {
        let mut state = self.lock();
        while state.bytes > self.max_bytes && !state.closed {
            state = self.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }

    pub fn queued_bytes(&self) -> usize {
        self.lock().bytes
    }

    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reads one line of at most `max` bytes. `Ok(None)` at end of input; a
/// final line without `\n` still counts.
pub fn read_line(reader: &mut impl BufRead, max: usize) -> io::Result<Option<Line>> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if available.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Some(Line::TooLong { head: line }),
                (false, true) => None,
                (false, false) => Some(Line::Text(line)),
            });
        }
        let (chunk, found_newline) = match available.iter().position(|byte| *byte == b'\n') {
            Some(index) => (&available[..index], true),
            None => (available, false),
        };
        if !too_long && line.len() + chunk.len() <= max {
            line.extend_from_slice(chunk);
        } else if !too_long {
            too_long = true;
            let room = TOO_LONG_HEAD_BYTES.saturating_sub(line.len()).min(chunk.len());
            line.extend_from_slice(&chunk[..room]);
            line.truncate(TOO_LONG_HEAD_BYTES);
            line.shrink_to_fit();
        }
        let consumed = chunk.len() + usize::from(found_newline);
        reader.consume(consumed);
        if found_newline {
            if too_long {
                return Ok(Some(Line::TooLong { head: line }));
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Some(Line::Text(line)));
        }
    }
}

fn read_loop(server: &Arc<Server>, max_message_bytes: usize, outbox: &Outbox, queue: &ReplyQueue) {
    let session = Arc::new(Session::whole_server("stdio"));
    let mut stdin = io::stdin().lock();
    loop {
        // Backpressure: no new request is read while the client leaves
        // earlier answers unread.
        queue.wait_for_room();
        let line = match read_line(&mut stdin, max_message_bytes) {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(error) => {
                log::error("reading stdin failed", &[("error", json!(error.to_string()))]);
                return;
            }
        };
        match line {
            Line::TooLong { head } => {
                log::warn("message too large", &[("limit_bytes", json!(max_message_bytes))]);
                let message = format!("message exceeds {max_message_bytes} bytes and was dropped; raise MCP_K8S_MAX_MESSAGE_BYTES");
                let id = jsonrpc::id_in_prefix(utf8_prefix(&head));
                send_error(outbox, id, ErrorCode::InvalidRequest, message);
            }
            Line::Text(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => {}
            Line::Text(bytes) => match String::from_utf8(bytes) {
                Ok(text) => {
                    server.handle(&session, &text, outbox.clone());
                }
                Err(_) => send_error(outbox, None, ErrorCode::ParseError, "parse error: message is not UTF-8".into()),
            },
        }
    }
}

fn send_error(outbox: &Outbox, id: Option<String>, code: ErrorCode, message: String) {
    let text = Rejection { id, error: ResponseError::new(code, message) }.to_text();
    let _ = outbox.send(Outgoing::Response { text, error: Some(code) });
}

/// The longest valid UTF-8 start of `bytes` (a cut may split a character).
fn utf8_prefix(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(error) => std::str::from_utf8(&bytes[..error.valid_up_to()]).unwrap_or_default(),
    }
}

/// Moves what the protocol sends into the reply queue, until `done` is
/// set and the channel is empty (the reader keeps a sender for ever, so
/// the channel alone never says it is over). The outbox is an unbounded
/// channel, shared with HTTP; this thread empties it at once, so the
/// queue's count is what waits.
fn queue_loop(outgoing: &Receiver<Outgoing>, queue: &ReplyQueue, done: &AtomicBool) {
    loop {
        let message = match outgoing.recv_timeout(Duration::from_millis(50)) {
            Ok(message) => message,
            Err(RecvTimeoutError::Timeout) if done.load(Ordering::SeqCst) => match outgoing.try_recv() {
                Ok(message) => message,
                Err(_) => break,
            },
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if let Queued::Dropped { n_dropped } = queue.push(message) {
            // Logged at 1, 2, 4, 8, ... so a client that never reads does
            // not flood the log either.
            if n_dropped.is_power_of_two() {
                log::warn("stdout is not being read; notifications dropped", &[("dropped", json!(n_dropped))]);
            }
        }
    }
    queue.close();
}

/// Writes each message as one line and flushes it, until the queue is
/// closed and empty.
fn write_loop(queue: &ReplyQueue) {
    let mut stdout = io::stdout().lock();
    let mut batch = Vec::new();
    loop {
        batch.clear();
        // Stdout is line-buffered: a batch, ending in a newline, goes out
        // in one write; a message alone in two, without a copy.
        let (taken, written) = match queue.take_batch(&mut batch) {
            Batch::Closed => return,
            Batch::Lines(taken) => (taken, stdout.write_all(&batch).and_then(|()| stdout.flush())),
            Batch::Alone(text) => {
                let written = stdout.write_all(text.as_bytes()).and_then(|()| stdout.write_all(b"\n")).and_then(|()| stdout.flush());
                (text.len() + 1, written)
            }
        };
        queue.written(taken);
        // A large batch is not kept around between writes.
        if batch.capacity() > BATCH_BYTES {
            batch = Vec::new();
        }
        if let Err(error) = written {
            // The client closed stdout; nothing more can reach it. Closing
            // the queue lets a reader waiting for room go on (its answers
            // go nowhere, as before).
            log::warn("writing stdout failed", &[("error", json!(error.to_string()))]);
            queue.close();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<Line> {
        // A tiny buffer makes lines span several fill_buf calls.
        let mut reader = io::BufReader::with_capacity(3, input);
        let mut lines = Vec::new();
        while let Some(line) = read_line(&mut reader, max).unwrap() {
            lines.push(line);
        }
        lines
    }

    fn text(value: &str) -> Line {
        Line::Text(value.as_bytes().to_vec())
    }

    #[test]
    fn splits_lines_and_strips_crlf() {
        assert_eq!(lines(b"ab\r\ncdef\n\ngh", 10), [text("ab"), text("cdef"), text(""), text("gh")]);
        assert_eq!(lines(b"", 10), []);
    }

    #[test]
    fn the_reply_queue_drops_notifications_over_its_cap_but_never_responses() {
        let queue = ReplyQueue::new(10);
        let response = |text: &str| Outgoing::Response { text: text.into(), error: None };
        assert_eq!(queue.push(Outgoing::Notification("12345".into())), Queued::Queued);
        assert_eq!(queue.push(response("123456789")), Queued::Queued);
        assert_eq!(queue.push(Outgoing::Notification("n".into())), Queued::Dropped { n_dropped: 1 });
        assert_eq!(queue.push(response("r")), Queued::Queued);
        assert_eq!(queue.queued_bytes(), 6 + 10 + 2);
        let mut batch = Vec::new();
        assert_eq!(queue.take_batch(&mut batch), Batch::Lines(18));
        assert_eq!(batch, b"12345\n123456789\nr\n");
        // Still counted until written: a reader would wait for room here.
        assert_eq!(queue.queued_bytes(), 18);
        queue.written(18);
        queue.wait_for_room();
        assert_eq!(queue.push(Outgoing::Notification("fits".into())), Queued::Queued);
        queue.close();
        assert_eq!(queue.push(response("late")), Queued::Discarded);
        batch.clear();
        assert_eq!(queue.take_batch(&mut batch), Batch::Lines(5));
        assert_eq!(batch, b"fits\n");
        batch.clear();
        assert_eq!(queue.take_batch(&mut batch), Batch::Closed);
    }

    #[test]
    fn a_message_larger_than_a_batch_comes_alone_between_batches() {
        let queue = ReplyQueue::new(1 << 30);
        let big = "b".repeat(BATCH_BYTES);
        for text in ["s1", &big, "s2", "s3"] {
            queue.push(Outgoing::Response { text: text.into(), error: None });
        }
        queue.close();
        let mut taken = Vec::new();
        loop {
            let mut batch = Vec::new();
            match queue.take_batch(&mut batch) {
                Batch::Closed => break,
                Batch::Lines(bytes) => {
                    taken.push(format!("lines {bytes}: {}", String::from_utf8(batch).unwrap().escape_debug()));
                    queue.written(bytes);
                }
                Batch::Alone(text) => {
                    taken.push(format!("alone {}", text.len()));
                    queue.written(text.len() + 1);
                }
            }
        }
        let alone = format!("alone {BATCH_BYTES}");
        assert_eq!(taken, ["lines 3: s1\\n", alone.as_str(), "lines 6: s2\\ns3\\n"]);
        assert_eq!(queue.queued_bytes(), 0, "what was written is what was counted");
    }

    #[test]
    fn an_oversize_line_is_skipped_without_losing_the_next() {
        let too_long = || Line::TooLong { head: b"0123456789AB".to_vec() };
        assert_eq!(lines(b"0123456789AB\nok\n", 10), [too_long(), text("ok")]);
        assert_eq!(lines(b"0123456789AB", 10), [too_long()]);
        assert_eq!(lines(b"0123456789\n", 10), [text("0123456789")]);
    }
}
