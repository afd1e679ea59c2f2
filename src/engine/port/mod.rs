//! The engine's port: what a run needs from the place its sandbox lives.
//! The engine owns this interface and every backend (`crate::backend::*`)
//! implements it, so the engine imports no backend at all: `main` picks
//! one and hands it over as `Arc<dyn Backend>`.
//!
//! A backend speaks its own API and translates both ways: a `NewRun` into
//! its objects, its objects' status into neutral `Sighting`s (the
//! `facts::View` the state machine judges, plus the sandbox's name and
//! times), its record of a background run into a `Stored`. It makes no
//! decision about a run's end; `decide` does.
//!
//! Knows nothing of Kubernetes, Docker or MCP.

pub mod facts;
pub mod jobs;
pub mod sandbox_record;
pub mod spec;

use std::fmt;
use std::io::BufRead;
use std::sync::{Arc, mpsc};
use std::time::{Duration, SystemTime};

use crate::engine::port::facts::{Recorded, View, Wording};
use crate::engine::port::sandbox_record::{CallMark, Record, Seen};
use crate::engine::port::spec::{RunReason, RunSpec};
use crate::sandbox::assignment::Assignment;
use crate::sandbox::frame::Tag;

/// Which kind of run asks `Backend::claim` for a warm sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunKind {
    /// `run_job`, `execute_code`: answered in the call.
    Sync,
    /// `submit_job`: kept with its record until fetched or expired.
    Background,
}

/// Where sandboxes run. Blocking calls, from any thread.
pub trait Backend: Send + Sync {
    /// A warm sandbox for `spec`, taken out of its pool for this run, by
    /// the run id it was made under: the run takes that id, and its
    /// `create` hands the run to the sandbox. `None` (the default): the
    /// run is cold, under an id of its own. A run that claims and then
    /// does not `create` must `remove` the id. `kind`: a backend whose
    /// warm sandboxes cannot hold a background run's record says `None`
    /// for those, so no sandbox is taken (nor a hit counted) for a run that
    /// goes cold anyway.
    fn claim(&self, _spec: &RunSpec, _kind: RunKind) -> Option<String> {
        None
    }

    /// Creates the run's sandbox (not yet started is fine: the watch says
    /// when it runs). A refusal leaves nothing behind.
    fn create(&self, run: &NewRun) -> Result<Created, Refused>;

    /// Starts following the run's sandbox: a thread of the backend's sends
    /// what it sees until `Watch::abort` (or the receiver is dropped).
    fn watch(&self, run_id: &str) -> Watch;

    /// A fresh look, for when the watch is in trouble: `Ok(None)` when the
    /// run has no sandbox (yet, or any more).
    fn probe(&self, run_id: &str) -> Result<Option<Sighting>, Error>;

    /// A refusal to create the sandbox that came after `create` returned
    /// (the Job controller's quota refusal): reason and a message that says
    /// what to do.
    fn start_failure(&self, run_id: &str) -> Option<(RunReason, String)>;

    /// What the sandbox was doing when its start timed out ("pulling image
    /// x"), for the `StartTimeout` message.
    fn start_progress(&self, run_id: &str) -> String;

    /// The runner's output stream (its frames) from the first byte,
    /// followed until the sandbox ends.
    fn output(&self, sandbox: &str) -> Result<Output, OutputError>;

    /// The run's inputs were read by the sandbox and may go (they can hold
    /// secrets). Failures are the backend's to log.
    fn inputs_used(&self, run_id: &str);

    /// Stops the run's sandboxes; see `Stop`.
    fn stop(&self, run_id: &str, how: Stop) -> Result<(), Error>;

    /// Deletes everything of a run nobody will read again (a sync run's
    /// end). Failures are logged: the backend's own expiry removes it.
    fn remove(&self, run_id: &str);

    /// A background run's record, if its sandbox (or its record) exists.
    fn find(&self, run_id: &str) -> Result<Option<Stored>, Error>;

    /// Every background run's record, in no order.
    fn list(&self) -> Result<Vec<Stored>, Error>;

    /// Writes the verdict onto the run's record unless one is there: the
    /// first writer wins, every process reads the same.
    fn record(&self, run_id: &str, verdict: &Recorded) -> Result<Settled, Error>;

    /// Marks the run cancelled on its record, for processes that find its
    /// sandbox gone.
    fn mark_cancelled(&self, run_id: &str, at: SystemTime) -> Result<(), Error>;

    /// Deletes every expired object this server created; how many.
    fn reap(&self, now: SystemTime) -> usize;

    /// The words this backend's users know its parts by, for messages.
    fn wording(&self) -> &'static Wording;

    /// The server stops, after its last call: warm sandboxes nobody will
    /// take go, and clean-up still under way finishes before the process
    /// ends. Also when a start-up check stops the server.
    fn shutdown(&self) {}

    /// Called after each of the reaper's turns: when nothing of the
    /// backend is in use, it lets go of what only a later call would use
    /// (connections kept open for the next calls), so that a site nobody
    /// uses costs next to nothing. A backend that keeps nothing does
    /// nothing.
    fn rest(&self) {}

    /// Open sandboxes (sessions), when the backend keeps them.
    fn sandbox_store(&self) -> Option<&dyn SandboxStore> {
        None
    }

    /// Output its runners hold in the sandbox for the server to fetch,
    /// when the backend's runs do that (`sandbox::held`).
    fn held_outputs(&self) -> Option<&dyn HeldOutputs> {
        None
    }

    /// The warm pools' live figures, by pool (none without pools).
    fn pool_figures(&self) -> Vec<PoolFigures> {
        Vec::new()
    }
}

/// One warm pool as it is now, for `describe_environment`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolFigures {
    pub name: String,
    /// Sandboxes waiting for a run.
    pub ready: usize,
    /// Runs that took a sandbox, and runs the pool fitted but had none ready.
    pub hits: u64,
    pub misses: u64,
}

/// A run to create.
pub struct NewRun<'a> {
    pub run_id: &'a str,
    pub spec: &'a RunSpec,
    pub keep: Keep,
    /// When the server gives up on a run that has not started: the runner
    /// does not start the command after it (`None`: no such bound).
    pub start_by: Option<SystemTime>,
}

/// How long a run's objects outlive its end.
#[derive(Clone, Debug)]
pub enum Keep {
    /// A sync run: the engine removes it at its end; `expires_at` is the
    /// backstop should the server die first.
    UntilRemoved { expires_at: SystemTime },
    /// A background run: kept `result_ttl` after its end for any process
    /// to read, with its record.
    Background { record: BackgroundRecord, result_ttl: Duration, expires_at: SystemTime },
}

/// What a process that did not create a background run needs to know of
/// it. Not the command's arguments: they are the caller's data.
#[derive(Clone, Debug, PartialEq)]
pub struct BackgroundRecord {
    pub token: String,
    pub timeout_s: u64,
    /// `image program`, for `list_jobs`.
    pub command: String,
    /// The arguments' fingerprint of a run made with an idempotency key
    /// (`idempotency::Keyed`): a retry with the same key compares it.
    pub fingerprint: Option<String>,
    /// The `traceparent` of the call that submitted the run, when traces
    /// are sent: whichever process records the verdict sends the run's
    /// spans under it.
    pub traceparent: Option<String>,
    /// `RunSpec::owner`: only that caller sees the run.
    pub owner: Option<String>,
}

/// What `create` made.
#[derive(Clone, Debug)]
pub struct Created {
    /// The backend's name for the run's objects (a Job's name).
    pub name: String,
    pub created_at: Option<SystemTime>,
}

/// A creation the backend refused; `reason` for the outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Refused {
    pub reason: RunReason,
    pub message: String,
}

/// One look at a sandbox.
#[derive(Clone, Debug, PartialEq)]
pub struct Sighting {
    /// The backend's name of the sandbox (a pod's name): `output` takes it.
    pub sandbox: String,
    pub view: View,
    pub times: Times,
}

/// When the sandbox reached each phase, as far as the backend knows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Times {
    pub scheduled: Option<SystemTime>,
    pub started: Option<SystemTime>,
    pub finished: Option<SystemTime>,
}

/// What the watch thread reports.
#[derive(Clone, Debug, PartialEq)]
pub enum Watched {
    /// A complete look (at the start, after a reconnect): the newest
    /// sandbox, or none.
    Listed(Option<Sighting>),
    Seen(Sighting),
    /// The sandbox is gone; its last look.
    Gone(Sighting),
    /// The watch fails and is being retried; why.
    Trouble(String),
    /// The watch failed in a way retrying cannot fix.
    Failed(String),
    /// The watch stopped without a word on the sandbox (its thread died):
    /// the run watches again.
    Ended,
    /// Not the backend's: the engine's output reader number `n` finished,
    /// sent on `Watch::wake` so the run acts on the runner's result at
    /// once instead of at its next look.
    OutputEnded(u64),
}

/// A running watch.
pub struct Watch {
    pub events: mpsc::Receiver<Watched>,
    pub abort: Abort,
    /// A sender into `events`, for the engine's own `Watched::OutputEnded`.
    pub wake: mpsc::Sender<Watched>,
}

/// The output stream of a sandbox, and how to close it from elsewhere.
pub struct Output {
    pub reader: Box<dyn BufRead + Send>,
    pub abort: Abort,
}

/// Why the output could not be opened.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputError {
    /// The sandbox is gone: there is nothing to wait for.
    Gone(String),
    /// Not yet, or the API is away: worth another try.
    Unavailable(String),
}

/// How `Backend::stop` stops a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The server decided the end: no sandbox of the run may run or start
    /// again, ever.
    ForGood,
    /// The sandboxes that have not ended go; ended ones keep their output.
    Live,
    /// Every sandbox of the run goes (a cancel).
    All,
}

/// What `record` found.
#[derive(Clone, Debug, PartialEq)]
pub enum Settled {
    /// This process's verdict is now the run's.
    Recorded,
    /// Another process (or an earlier life of this one) wrote first.
    AlreadyRecorded(Recorded),
    /// There is no record to write on (the run's objects are gone).
    NoRecord,
}

/// A background run as its backend keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    pub run_id: String,
    pub token: String,
    pub command: String,
    /// As `BackgroundRecord::fingerprint`.
    pub fingerprint: Option<String>,
    /// As `BackgroundRecord::traceparent`.
    pub traceparent: Option<String>,
    /// As `BackgroundRecord::owner`.
    pub owner: Option<String>,
    pub created_at: Option<SystemTime>,
    /// When the backend saw the run end, if it did.
    pub ended_at: Option<SystemTime>,
    /// A sandbox of the run is running.
    pub active: bool,
    /// The command's timeout, and the whole run's deadline from creation.
    pub timeout: Option<Duration>,
    pub run_deadline: Duration,
    pub memory_limit: Option<String>,
    pub expires_at: String,
    pub cancelled_at: Option<String>,
    /// The run took a warm pool's sandbox.
    pub warm: bool,
    pub verdict: Option<Recorded>,
    /// The newest sandbox (`find` only; `list` leaves it out).
    pub sandbox: Option<Sighting>,
}

/// A backend call that failed: what it tried, what kind of failure it met
/// (for a caller to match on), and the API's or daemon's own words.
#[derive(Clone, Debug, PartialEq)]
pub struct Error {
    pub what: &'static str,
    pub kind: ErrorKind,
    pub message: String,
}

/// What a failed backend call means for whoever asked. Each backend sorts
/// its API's failures into these; the engine and the tools decide on the
/// kind, never on the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The API or daemon could not be reached, timed out, or said it is
    /// busy or failing (429, 5xx): the same call may work shortly.
    Transient,
    /// The server's own credentials may not do this (401, 403, no usable
    /// credentials): only the operator can fix it.
    Denied,
    /// What the call named is not there (any more).
    NotFound,
    /// The request was refused as it is (another 4xx, a conflict, an
    /// answer not understood): sending it again unchanged will not help.
    Refused,
    /// What the call named is busy with other work that must end first
    /// (a sandbox's runner runs another call: one call at a time).
    Busy,
}

impl ErrorKind {
    /// What the caller of a tool can do about it, for messages.
    pub fn advice(self) -> &'static str {
        match self {
            ErrorKind::Transient => "retry shortly",
            ErrorKind::Denied => {
                "the server's credentials are not allowed to; this is for the operator to fix (`doctor` lists the permissions missing)"
            }
            ErrorKind::NotFound => "it is not there any more; list_jobs shows what exists",
            ErrorKind::Refused => {
                "the request was refused as it is, so retrying it unchanged will not help; the server's log has the details"
            }
            ErrorKind::Busy => "it is busy with another call; try again once that call has ended",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "could not {}: {}", self.what, self.message)
    }
}

impl std::error::Error for Error {}

/// Stops a stream from another thread.
#[derive(Clone)]
pub struct Abort(Arc<dyn Fn() + Send + Sync>);

impl Abort {
    pub fn new(abort: impl Fn() + Send + Sync + 'static) -> Abort {
        Abort(Arc::new(abort))
    }

    pub fn abort(&self) {
        (self.0)()
    }
}

impl fmt::Debug for Abort {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("Abort")
    }
}

/// Output a runner holds in its sandbox until this server has fetched it
/// (`sandbox::held`): for a backend whose container logs cannot carry a
/// run's whole output (a kubelet rotates a big log away). A backend
/// without it is never asked: its runners send everything on the log.
pub trait HeldOutputs: Send + Sync {
    /// The held frames from byte `offset` on, fetched from the sandbox's
    /// `port` with the run's `key`; the error says what to fix.
    fn fetch(&self, sandbox: &str, port: u16, key: &str, offset: u64) -> Result<Output, Error>;
    /// Tells the runner holding output that it may go on (and write its
    /// result).
    fn release(&self, sandbox: &str, port: u16, key: &str) -> Result<(), Error>;
}

/// What a backend does for open sandboxes. A sandbox's objects are named
/// by its `public_name`, as a run's are by its run id, so the backend's
/// `probe` and `remove` work on it unchanged.
pub trait SandboxStore: Send + Sync {
    /// Makes and starts the sandbox for `spec` (image, limits, network,
    /// workdir; no command), its record on it, and returns once it exists.
    fn open_sandbox(&self, name: &str, spec: &RunSpec, record: &Record) -> Result<(), Refused>;
    /// The sandbox named `name`, if it exists.
    fn look(&self, name: &str) -> Result<Option<Seen>, Error>;
    /// Every open sandbox this backend keeps (every owner, every replica's).
    fn list_sandboxes(&self) -> Result<Vec<Seen>, Error>;
    /// Writes `call` as the running call if the sandbox is as `seen` shows
    /// it (no call, or the stale one `seen` holds): `Ok(false)` when
    /// another call got there first.
    fn begin_call(&self, seen: &Seen, call: &CallMark) -> Result<bool, Error>;
    /// Records the sandbox used at `at_ms` (its idle time counts from the
    /// newest such mark): when it is ready, and after each call.
    fn mark_used(&self, name: &str, at_ms: u64) -> Result<(), Error>;
    /// Clears `call`'s mark (only its own) and records the sandbox used at
    /// `at_ms`; `seen`: the sandbox as the call's take saw it.
    fn end_call(&self, seen: &Seen, call: &CallMark, at_ms: u64) -> Result<(), Error>;
    /// Gives the sandbox its call: the stream of its output from then on,
    /// read until the call's result (`read_for`: the longest quiet stretch),
    /// and how to ask the sandbox to stop it. `ErrorKind::Busy` when its
    /// runner still runs another call (one whose server gave up on it).
    fn deliver_call(&self, name: &str, call: &Assignment, read_for: Duration) -> Result<Delivered, Error>;
    /// The sandbox's output from `since` (Unix ms, a little earlier on
    /// backends that count whole seconds or another clock), followed or
    /// (`follow: false`) to what it holds now: the record a call's frames
    /// are read again from when the stream that brought them broke, or by
    /// a process that did not deliver the call.
    fn call_log(&self, name: &str, since_ms: u64, follow: bool) -> Result<Output, Error>;
    /// Asks the sandbox to stop the call tagged `tag`, from any process (a
    /// call this process did not deliver: a background call whose server
    /// died); nothing happens when that call is not running.
    fn cancel_call(&self, name: &str, tag: Tag) -> Result<(), Error>;
    /// Deletes the sandbox and everything of it (key, marks, volume).
    fn close_sandbox(&self, name: &str);
}

/// A call handed to its sandbox.
pub struct Delivered {
    pub output: Output,
    /// Asks the runner to stop the call (its command, as a SIGTERM would);
    /// the call's frames then end as a one-shot run's do.
    pub cancel: Box<dyn Fn() -> Result<(), Error> + Send + Sync>,
}
