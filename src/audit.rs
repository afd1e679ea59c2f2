//! The audit trail: who ran what, when, and how it ended, one JSON object
//! per line, to stderr or a file the operator names (`MCP_K8S_AUDIT_LOG`).
//!
//! Apart from the structured log on purpose: the log is for operating the
//! server (its level can hide lines), the audit trail is a record kept
//! whole. It carries metadata only, never a command, arguments,
//! environment values, file contents, output or tokens: `Entry` has no
//! field that could hold them.
//!
//! A synchronous run is one `run` line when it ends. A background run
//! (`submit_job`, a task, a call with an idempotency key) is a `submitted`
//! line from the process that accepted the call and an `ended` line from
//! the process that recorded its verdict (the first writer, so one line
//! however many replicas watched it); `run_id` joins them.
//!
//! Lines are written by a thread of their own, from a bounded queue: a
//! sink that stops taking them (a disk that hangs, a stderr nobody reads)
//! holds that thread, never a run or the shutdown. While it is stalled
//! new runs are refused (`check`, asked before any run is admitted), so
//! no run goes unrecorded for long: the trail fails closed.
//!
//! A leaf: it knows no layer (the engine turns its outcome into `Ended`);
//! written to by the tools and the engine, it reads nothing back.

#![allow(unsafe_code)] // geteuid(2), to refuse a trail file another user owns.

use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value, json};

use crate::network::NetworkMode;

/// Where the trail goes: `MCP_K8S_AUDIT_LOG`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sink {
    Stderr,
    /// Appended to; made (readable by its owner only) when missing, made
    /// so when present (`open_file`).
    File(PathBuf),
}

/// What an audit line records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A synchronous run ended (or was refused before it started).
    Run,
    /// A background run was accepted: made, or found again by its key.
    Submitted,
    /// A background run's verdict was recorded.
    Ended,
}

impl Event {
    fn name(self) -> &'static str {
        match self {
            Event::Run => "run",
            Event::Submitted => "submitted",
            Event::Ended => "ended",
        }
    }
}

/// How a run ended, as the trail says it (the engine's `RunOutcome`
/// makes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub status: &'static str,
    pub reason: Option<&'static str>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The command's own run time.
    pub duration: Duration,
}

/// One line's facts; what is `None` is left out of the line.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    pub event: Event,
    pub run_id: &'a str,
    pub caller: Option<&'a str>,
    /// The site the run went to; `default` when unnamed.
    pub site: Option<&'a str>,
    pub tool: Option<&'a str>,
    pub image: Option<&'a str>,
    pub network: Option<NetworkMode>,
    pub ended: Option<Ended>,
    /// From the call's arrival to its answer (synchronous runs).
    pub elapsed: Option<Duration>,
}

impl<'a> Entry<'a> {
    pub fn new(event: Event, run_id: &'a str) -> Entry<'a> {
        Entry { event, run_id, caller: None, site: None, tool: None, image: None, network: None, ended: None, elapsed: None }
    }
}

/// The site of a server without named sites.
const SITE: &str = "default";

/// The line for `entry`, written at `at`.
pub fn line(entry: &Entry<'_>, at: SystemTime) -> Value {
    let mut fields = Map::new();
    fields.insert("time".into(), json!(crate::log::rfc3339_utc(at)));
    fields.insert("event".into(), json!(entry.event.name()));
    fields.insert("run_id".into(), json!(entry.run_id));
    fields.insert("site".into(), json!(entry.site.unwrap_or(SITE)));
    let mut put = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            fields.insert(key.into(), value);
        }
    };
    put("caller", entry.caller.map(Value::from));
    put("tool", entry.tool.map(Value::from));
    put("image", entry.image.map(Value::from));
    put("network", entry.network.map(|mode| json!(mode.name())));
    if let Some(ended) = entry.ended {
        put("status", Some(json!(ended.status)));
        put("reason", Some(json!(ended.reason)));
        put("exit_code", ended.exit_code.map(Value::from));
        put("signal", ended.signal.map(Value::from));
        put("duration_ms", Some(json!(ended.duration.as_millis() as u64)));
    }
    put("elapsed_ms", entry.elapsed.map(|elapsed| json!(elapsed.as_millis() as u64)));
    Value::Object(fields)
}

/// Lines waiting for the writer at most. A sink that keeps up empties
/// the queue as fast as runs end; past the bound it has stopped taking
/// lines, a line that finds the queue full is lost (and logged), and runs
/// are refused (`check`) until it drains.
const MAX_QUEUED: usize = 1024;
/// How long one line's write may take before the trail counts as stalled
/// and runs are refused: far above a healthy disk or a reader of stderr,
/// far below the shutdown grace a blocked run used to hold.
const STALL_AFTER: Duration = Duration::from_secs(5);

/// Why a run is refused: the trail is not taking lines, and a run it
/// cannot record must not start (the trail is the record of who ran what).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stalled {
    /// One write has not returned for this long.
    Writing(Duration),
    /// This many lines wait to be written.
    Full(usize),
}

impl fmt::Display for Stalled {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self {
            Stalled::Writing(waited) => format!("has not finished writing a line for {} s", waited.as_secs()),
            Stalled::Full(lines) => format!("has {lines} lines waiting to be written"),
        };
        write!(
            formatter,
            "the audit trail (MCP_K8S_AUDIT_LOG) {why}, so no run starts until it takes them; check that its disk answers, or that whoever reads the server's stderr still does"
        )
    }
}

/// The trail's lines on their way: `record` queues them, one thread
/// writes them, so a sink that stops holds that thread, never a run.
struct Trail {
    state: Mutex<Queue>,
    wake: Condvar,
}

struct Queue {
    lines: VecDeque<String>,
    /// When the write under way began; `None` between writes.
    writing_since: Option<Instant>,
    /// Lines queued and lines done with (written, or failed and logged)
    /// since start: a line queued as the n-th is written once `written`
    /// reaches n.
    queued: u64,
    written: u64,
}

/// What became of a line handed to the trail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Written {
    Done,
    /// Still queued: the sink is slow or stalled.
    Pending,
    /// The queue was full.
    Lost,
}

impl Queue {
    /// Whether runs are refused at `now`.
    fn stalled(&self, now: Instant) -> Option<Stalled> {
        let waited = self.writing_since.map(|since| now.saturating_duration_since(since));
        match waited {
            Some(waited) if waited >= STALL_AFTER => Some(Stalled::Writing(waited)),
            _ => (self.lines.len() >= MAX_QUEUED).then_some(Stalled::Full(self.lines.len())),
        }
    }
}

impl Trail {
    fn new() -> Trail {
        Trail { state: Mutex::new(Queue { lines: VecDeque::new(), writing_since: None, queued: 0, written: 0 }), wake: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues one line and waits up to `wait` for it to be written, so a
    /// healthy sink holds a run's line before the run's answer goes, as
    /// when lines were written in place. A trail already stalled is not
    /// waited on: only the first calls after a sink stops wait, once.
    fn write(&self, line: String, wait: Duration) -> Written {
        let deadline = Instant::now() + wait;
        let mut queue = self.lock();
        if queue.lines.len() >= MAX_QUEUED {
            return Written::Lost;
        }
        queue.lines.push_back(line);
        queue.queued += 1;
        let number = queue.queued;
        self.wake.notify_all();
        while queue.written < number {
            let now = Instant::now();
            if now >= deadline || queue.stalled(now).is_some() {
                return Written::Pending;
            }
            queue = self.wake.wait_timeout(queue, deadline - now).map_or_else(|poisoned| poisoned.into_inner().0, |(queue, _)| queue);
        }
        Written::Done
    }

    fn check(&self, now: Instant) -> Result<(), Stalled> {
        self.lock().stalled(now).map_or(Ok(()), Err)
    }

    /// The writer's loop: one line at a time, whole, in order.
    fn write_lines(&self, sink: &mut dyn Write) {
        loop {
            let line = {
                let mut queue = self.lock();
                let line = loop {
                    match queue.lines.pop_front() {
                        Some(line) => break line,
                        None => queue = self.wake.wait(queue).unwrap_or_else(PoisonError::into_inner),
                    }
                };
                queue.writing_since = Some(Instant::now());
                line
            };
            let written = sink.write_all(line.as_bytes()).and_then(|()| sink.flush());
            let mut queue = self.lock();
            queue.writing_since = None;
            queue.written += 1;
            drop(queue);
            self.wake.notify_all();
            if let Err(error) = written {
                crate::log::error("could not write the audit trail", &[("error", error.to_string().into())]);
            }
        }
    }

    /// Waits up to `timeout` for every queued line to be written; `false`
    /// when some are left (the sink has stalled).
    fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut queue = self.lock();
        while queue.written < queue.queued {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            queue = self.wake.wait_timeout(queue, left).map_or_else(|poisoned| poisoned.into_inner().0, |(queue, _)| queue);
        }
        true
    }
}

static TRAIL: OnceLock<Arc<Trail>> = OnceLock::new();

/// Opens the trail once at start, so a path that cannot be written stops
/// the server instead of losing the record, and starts its writer; `None`
/// keeps no trail.
pub fn init(sink: Option<&Sink>) -> Result<(), String> {
    let mut writer: Box<dyn Write + Send> = match sink {
        None => return Ok(()),
        Some(Sink::Stderr) => Box::new(std::io::stderr()),
        Some(Sink::File(path)) => Box::new(open_file(path)?),
    };
    let trail = Arc::new(Trail::new());
    TRAIL.set(Arc::clone(&trail)).map_err(|_| "the audit trail was opened twice".to_string())?;
    crate::supervise::spawn(crate::supervise::Kind::AuditWriter, move || trail.write_lines(&mut *writer))
        .map_err(|error| format!("MCP_K8S_AUDIT_LOG: cannot start the audit trail's writer: {error}"))?;
    Ok(())
}

/// Opens the trail's file for appending. Its lines hold run ids, which
/// are capabilities, so it is the file named, readable by the server's
/// user only: a symlink is not followed (lines would go wherever it
/// points, and a dangling one would make its target), a FIFO or device is
/// refused (a reader that stops would hold the trail), a file of another
/// user is refused and an existing one is made mode 0600.
fn open_file(path: &Path) -> Result<File, String> {
    let refuse = |why: String| format!("MCP_K8S_AUDIT_LOG: `{}` {why}", path.display());
    let not_regular = |what: &str| refuse(format!("is {what}, not a regular file; name a regular file the server can append to"));
    // O_NONBLOCK: opening a FIFO to write would wait for a reader (it
    // fails with ENXIO instead); a regular file's appends ignore it.
    let opened =
        std::fs::OpenOptions::new().append(true).create(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path);
    let file = match opened {
        Ok(file) => file,
        Err(error) => {
            // ELOOP (a symlink) and ENXIO (a FIFO) say little: say what is there.
            let found = std::fs::symlink_metadata(path).ok();
            return Err(match found.as_ref().and_then(|metadata| crate::settings_file::not_regular(&metadata.file_type())) {
                Some(what) => not_regular(what),
                None => format!("MCP_K8S_AUDIT_LOG: cannot open {} for appending: {error}", path.display()),
            });
        }
    };
    let metadata = file.metadata().map_err(|error| refuse(format!("cannot be examined: {error}")))?;
    if let Some(what) = crate::settings_file::not_regular(&metadata.file_type()) {
        return Err(not_regular(what));
    }
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    let server_uid = unsafe { libc::geteuid() };
    if metadata.uid() != server_uid {
        return Err(refuse(format!(
            "belongs to uid {}, not to the server's uid {server_uid}; chown it to the server's user, or name a new file",
            metadata.uid()
        )));
    }
    if metadata.permissions().mode() & 0o7777 != 0o600 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|error| refuse(format!("cannot be made mode 0600: {error}")))?;
    }
    Ok(file)
}

/// Writes `entry` when a trail is kept, waiting at most `STALL_AFTER`
/// for a sink that stopped (then the line stays queued). A line that finds
/// the queue full is lost and logged: runs are refused by then (`check`),
/// so only runs already under way lose theirs.
pub fn record(entry: &Entry<'_>) {
    let Some(trail) = TRAIL.get() else { return };
    let mut text = line(entry, SystemTime::now()).to_string();
    text.push('\n');
    if trail.write(text, STALL_AFTER) == Written::Lost {
        crate::log::error("the audit trail is not taking lines; a line was lost", &[("event", entry.event.name().into())]);
    }
}

/// Whether a run may start: `Err` while the trail takes no lines.
pub fn check() -> Result<(), Stalled> {
    TRAIL.get().map_or(Ok(()), |trail| trail.check(Instant::now()))
}

/// Waits up to `timeout` for the queued lines to be written (at shutdown).
pub fn flush(timeout: Duration) {
    if let Some(trail) = TRAIL.get()
        && !trail.flush(timeout)
    {
        crate::log::error("the audit trail did not take its last lines before shutdown", &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_holds_the_facts_given_and_nothing_else() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let ended = Ended {
            status: "failed",
            reason: Some("OOMKilled"),
            exit_code: Some(137),
            signal: None,
            duration: Duration::from_millis(1500),
        };
        let base = Entry::new(Event::Run, "r1");
        let cases: Vec<(&str, Entry<'_>, Value)> = vec![
            (
                "a synchronous run",
                Entry {
                    caller: Some("stdio"),
                    tool: Some("run_job"),
                    image: Some("busybox:1.36"),
                    network: Some(NetworkMode::None),
                    ended: Some(ended),
                    elapsed: Some(Duration::from_millis(2100)),
                    ..base
                },
                json!({"time": "2027-01-15T08:00:00.000Z", "event": "run", "run_id": "r1", "site": "default",
                       "caller": "stdio", "tool": "run_job", "image": "busybox:1.36", "network": "none",
                       "status": "failed", "reason": "OOMKilled", "exit_code": 137, "duration_ms": 1500, "elapsed_ms": 2100}),
            ),
            (
                "a background run accepted",
                Entry {
                    caller: Some("token"),
                    tool: Some("submit_job"),
                    image: Some("busybox:1.36"),
                    network: Some(NetworkMode::Open),
                    ..Entry::new(Event::Submitted, "r2")
                },
                json!({"time": "2027-01-15T08:00:00.000Z", "event": "submitted", "run_id": "r2", "site": "default",
                       "caller": "token", "tool": "submit_job", "image": "busybox:1.36", "network": "open"}),
            ),
            (
                "a background run's end",
                Entry { ended: Some(ended), ..Entry::new(Event::Ended, "r1") },
                json!({"time": "2027-01-15T08:00:00.000Z", "event": "ended", "run_id": "r1", "site": "default",
                       "status": "failed", "reason": "OOMKilled", "exit_code": 137, "duration_ms": 1500}),
            ),
        ];
        for (name, entry, want) in cases {
            assert_eq!(line(&entry, at), want, "{name}");
        }
    }

    /// A sink whose writes wait until the test lets them go, telling the
    /// test each time one starts: a pipe whose reader stopped.
    struct HeldSink {
        started: std::sync::mpsc::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
        taken: Arc<Mutex<String>>,
    }

    impl Write for HeldSink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let _ = self.started.send(());
            let _ = self.release.recv();
            self.taken.lock().unwrap().push_str(&String::from_utf8_lossy(bytes));
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Regression: lines were written in place under one lock, so a sink
    /// that stopped held every run's call, and the shutdown, for good.
    #[test]
    fn a_stalled_sink_holds_no_caller_and_refuses_runs_until_it_drains() {
        let trail = Arc::new(Trail::new());
        let (started_tx, started) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let taken = Arc::new(Mutex::new(String::new()));
        let mut sink = HeldSink { started: started_tx, release: release_rx, taken: Arc::clone(&taken) };
        let writer = Arc::clone(&trail);
        std::thread::spawn(move || writer.write_lines(&mut sink));

        // The first line waits its bound (none here), then stays queued.
        assert_eq!(trail.write("first\n".into(), Duration::ZERO), Written::Pending);
        started.recv_timeout(Duration::from_secs(10)).expect("the writer took the line");
        let now = Instant::now();
        assert_eq!(trail.check(now), Ok(()), "a write under way is no stall yet");
        assert!(matches!(trail.check(now + STALL_AFTER), Err(Stalled::Writing(_))), "a write held past the bound is");
        for _ in 0..MAX_QUEUED {
            assert_eq!(trail.write("queued\n".into(), Duration::ZERO), Written::Pending);
        }
        assert_eq!(trail.check(now), Err(Stalled::Full(MAX_QUEUED)));
        assert_eq!(trail.write("lost\n".into(), Duration::from_secs(3600)), Written::Lost, "a full queue is not waited on");
        assert!(!trail.flush(Duration::ZERO), "the shutdown's flush gives up at its bound");

        // The sink drains: every queued line is written, in order, and
        // runs are admitted again.
        for _ in 0..=MAX_QUEUED {
            release.send(()).unwrap();
        }
        assert!(trail.flush(Duration::from_secs(10)));
        assert_eq!(trail.check(Instant::now()), Ok(()));
        let text = taken.lock().unwrap().clone();
        assert_eq!(text.lines().count(), MAX_QUEUED + 1);
        assert!(text.starts_with("first\nqueued\n") && !text.contains("lost"), "{}", &text[..40]);
        // A healthy sink has the line before `write` returns.
        while started.try_recv().is_ok() {}
        let (done_tx, done) = std::sync::mpsc::channel();
        let before = Arc::clone(&trail);
        std::thread::spawn(move || done_tx.send(before.write("last\n".into(), Duration::from_secs(3600))).unwrap());
        started.recv_timeout(Duration::from_secs(10)).expect("the writer took the line");
        release.send(()).unwrap();
        assert_eq!(done.recv_timeout(Duration::from_secs(10)), Ok(Written::Done));
        assert!(taken.lock().unwrap().ends_with("queued\nlast\n"));
    }

    #[test]
    fn the_trail_is_stalled_by_a_write_held_past_the_bound_or_a_full_queue() {
        let now = Instant::now();
        let second = Duration::from_secs(1);
        // (the write under way began this long ago, lines waiting, verdict)
        let cases = [
            (None, 0, None),
            (None, MAX_QUEUED - 1, None),
            (None, MAX_QUEUED, Some(Stalled::Full(MAX_QUEUED))),
            (Some(STALL_AFTER - second), 3, None),
            (Some(STALL_AFTER), 3, Some(Stalled::Writing(STALL_AFTER))),
            (Some(STALL_AFTER + second), MAX_QUEUED, Some(Stalled::Writing(STALL_AFTER + second))),
        ];
        for (began_ago, waiting, want) in cases {
            let queue = Queue {
                lines: std::iter::repeat_n(String::new(), waiting).collect(),
                writing_since: began_ago.map(|ago| now - ago),
                queued: 0,
                written: 0,
            };
            assert_eq!(queue.stalled(now), want, "{began_ago:?} {waiting}");
        }
    }

    #[test]
    fn a_refused_run_names_the_audit_log_and_what_to_check() {
        let cases = [
            (
                Stalled::Writing(Duration::from_secs(7)),
                "the audit trail (MCP_K8S_AUDIT_LOG) has not finished writing a line for 7 s, so no run starts until it takes them; check that its disk answers, or that whoever reads the server's stderr still does",
            ),
            (
                Stalled::Full(1024),
                "the audit trail (MCP_K8S_AUDIT_LOG) has 1024 lines waiting to be written, so no run starts until it takes them; check that its disk answers, or that whoever reads the server's stderr still does",
            ),
        ];
        for (stalled, want) in cases {
            assert_eq!(stalled.to_string(), want);
        }
    }
}
