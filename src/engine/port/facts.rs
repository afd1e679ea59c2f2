//! What a backend reports about a run's sandbox, in the engine's own
//! words: `View` (what the sandbox is doing, and how it ended if it did)
//! with its `SandboxState` and `Finished` facts, `Wording` (what the
//! backend's users call its parts, for messages) and `Recorded` (a verdict
//! as kept with a background run, and who decided it).
//!
//! Plain types at the bottom of the engine: the port (`backend`) carries
//! them, `decide` judges a `View`, `outcome` words a `Finished`, `verdict`
//! writes and reads a `Recorded`. They live here, apart from all four, so
//! that those files' imports point one way. No logic, no I/O; knows nothing
//! of any backend, of the state machine or of MCP.

use std::time::SystemTime;

use crate::engine::port::spec::{RunReason, RunStatus};

/// What the sandbox is doing, in the backend's own words made neutral.
#[derive(Clone, Debug, PartialEq)]
pub enum SandboxState {
    /// Not decisive yet: scheduling, pulling, preparing.
    Pending,
    /// No node can take it (yet); the scheduler's message.
    Unschedulable { message: String },
    /// The command runs: its output can be followed.
    Running,
    /// It cannot start, and will not fix itself within the run. A state,
    /// not an event like `decide::Event::StartFailed`: a sandbox that is gone or
    /// whose SIGTERM awaits evidence is judged first, as before.
    FailFast { reason: RunReason, message: String },
    /// The command (or the sandbox) ended; `ran`: the command's process
    /// started, so there is output to read.
    Finished { ran: bool },
}

/// A fresh view of the run's sandbox.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    pub state: SandboxState,
    /// How it ended, when its status says so or someone is deleting it;
    /// `None` while it runs and nobody asked it to go.
    pub ended: Option<Finished>,
    /// What it is judged on if it disappears now: its last status, marked
    /// deleted.
    pub if_gone: Finished,
}

/// How the sandbox ended, as the backend saw it (for Kubernetes: the
/// pod's status, read by `classify`). Facts only, in the engine's own
/// words: each backend translates its API's words into these.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Finished {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The runtime killed the container for its memory limit.
    pub oom_killed: bool,
    /// What stopped the sandbox from outside its command, when something did.
    pub stopped: Option<Stopped>,
    /// The pod's `DisruptionTarget` condition, `reason: message`: set by
    /// the kubelet or the control plane when they stop a pod (eviction,
    /// preemption, node shutdown), never by a plain delete.
    pub disruption: Option<String>,
    /// The pod has a `deletionTimestamp` or is gone: someone deleted it.
    pub deleted: bool,
    /// The runtime never started the command's process; its text, for the
    /// caller as it is.
    pub start_failure: Option<String>,
}

/// What stopped a sandbox from outside its command: a closed set the
/// engine judges, each with the words the caller is shown.
#[derive(Clone, Debug, PartialEq)]
pub enum Stopped {
    /// Evicted by the node (a workdir over its size limit, memory or disk
    /// pressure); the node's words.
    Evicted { message: String },
    /// The sandbox's own deadline passed, and its backend stopped it.
    DeadlinePassed,
    /// The runtime that ran it went away itself (a Docker daemon restarted
    /// or stopped mid-run); what the backend saw.
    RuntimeGone { seen: String },
    /// Stopped for another reason its backend gave (a node lost or shut
    /// down, ...): `reason: message` in the backend's words, judged as a
    /// stop from outside with no more said.
    Other { why: String },
}

/// What the engine's messages call a backend's parts, so that a message
/// names what the caller can look at ("the pod", "the container").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wording {
    /// The sandbox: "pod", "container".
    pub sandbox: &'static str,
    /// What `create` makes, as progress names it: "Job", "container".
    pub created: &'static str,
    /// What stops a sandbox at its own deadline: "the kubelet".
    pub stopper: &'static str,
    /// The process limit, by the name an operator sets it with.
    pub pids_limit: &'static str,
    /// Who else deletes sandboxes, as examples.
    pub outside_deleters: &'static str,
    /// The API the server talks to: "the API server", "the Docker daemon".
    pub api: &'static str,
}

/// Who decided a run's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecidedBy {
    /// The runner's result frame: the pod ends on its own, and its log
    /// keeps the output for any process that reads it.
    Runner,
    /// This server, without a result (deadlines, pod state, API trouble,
    /// a cancel): the sandbox must be stopped before the answer goes out.
    Server,
}

/// A verdict as recorded with a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    pub status: RunStatus,
    pub reason: Option<RunReason>,
    pub message: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub by: DecidedBy,
    pub ended_at: Option<SystemTime>,
}
