//! stdio transport: one JSON-RPC message per line on stdin, one per line on
//! stdout, and nothing else on stdout (logs go to stderr). A reader thread
//! hands lines to the protocol; a writer thread owns stdout, so concurrent
//! tool calls never interleave bytes. Input lines are capped; a longer line
//! is skipped and answered with an error instead of being buffered whole.

use std::io::{self, BufRead, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::Duration;

use serde_json::json;

use crate::engine::cancel::CancelToken;
use crate::log;
use crate::protocol::jsonrpc::{ErrorCode, Response};
use crate::protocol::{Outbox, Outgoing, Server, Session};

/// One line of input as the reader sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line without its `\n` (or `\r\n`).
    Text(Vec<u8>),
    /// A line longer than the cap; its bytes were read and dropped.
    TooLong,
}

/// Serves the session on stdin/stdout until stdin ends or `stop` is
/// cancelled (a signal), then lets in-flight calls finish within `grace`.
pub fn serve(server: Arc<Server>, max_message_bytes: usize, grace: Duration, stop: CancelToken) -> io::Result<()> {
    let (outbox, outgoing) = mpsc::channel();
    let writing_done = Arc::new(AtomicBool::new(false));
    let writer = {
        let writing_done = Arc::clone(&writing_done);
        thread::Builder::new().name("stdio-writer".into()).spawn(move || write_loop(outgoing, &writing_done))?
    };
    {
        let server = Arc::clone(&server);
        let stop = stop.clone();
        // The reader is never joined: after a signal it may sit in a
        // blocking read of stdin that only the process exit ends.
        thread::Builder::new().name("stdio-reader".into()).spawn(move || {
            read_loop(&server, max_message_bytes, &outbox);
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
    let _ = writer.join();
    Ok(())
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
                (true, _) => Some(Line::TooLong),
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
        } else {
            too_long = true;
            line = Vec::new();
        }
        let consumed = chunk.len() + usize::from(found_newline);
        reader.consume(consumed);
        if found_newline {
            if too_long {
                return Ok(Some(Line::TooLong));
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Some(Line::Text(line)));
        }
    }
}

fn read_loop(server: &Arc<Server>, max_message_bytes: usize, outbox: &Outbox) {
    let session = Arc::new(Session::new());
    let mut stdin = io::stdin().lock();
    loop {
        let line = match read_line(&mut stdin, max_message_bytes) {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(error) => {
                log::error("reading stdin failed", &[("error", json!(error.to_string()))]);
                return;
            }
        };
        match line {
            Line::TooLong => {
                log::warn("message too large", &[("limit_bytes", json!(max_message_bytes))]);
                let message = format!("message exceeds {max_message_bytes} bytes and was dropped; raise MCP_K8S_MAX_MESSAGE_BYTES");
                send_error(outbox, ErrorCode::InvalidRequest, message);
            }
            Line::Text(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => {}
            Line::Text(bytes) => match String::from_utf8(bytes) {
                Ok(text) => {
                    server.handle(&session, &text, outbox.clone());
                }
                Err(_) => send_error(outbox, ErrorCode::ParseError, "parse error: message is not UTF-8".into()),
            },
        }
    }
}

fn send_error(outbox: &Outbox, code: ErrorCode, message: String) {
    let text = Response::error(None, code, message).to_json().to_string();
    let _ = outbox.send(Outgoing::Response { text, is_error: true });
}

/// Writes each message as one line and flushes it, until `done` is set and
/// the queue is empty.
fn write_loop(outgoing: Receiver<Outgoing>, done: &AtomicBool) {
    let mut stdout = io::stdout().lock();
    loop {
        let message = match outgoing.recv_timeout(Duration::from_millis(50)) {
            Ok(message) => message,
            Err(RecvTimeoutError::Timeout) if done.load(Ordering::SeqCst) => match outgoing.try_recv() {
                Ok(message) => message,
                Err(_) => return,
            },
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let text = match message {
            Outgoing::Notification(text) | Outgoing::Response { text, .. } => text,
        };
        let written = stdout.write_all(text.as_bytes()).and_then(|()| stdout.write_all(b"\n")).and_then(|()| stdout.flush());
        if let Err(error) = written {
            // The client closed stdout; nothing more can reach it.
            log::warn("writing stdout failed", &[("error", json!(error.to_string()))]);
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
    fn an_oversize_line_is_skipped_without_losing_the_next() {
        assert_eq!(lines(b"0123456789AB\nok\n", 10), [Line::TooLong, text("ok")]);
        assert_eq!(lines(b"0123456789AB", 10), [Line::TooLong]);
        assert_eq!(lines(b"0123456789\n", 10), [text("0123456789")]);
    }
}
