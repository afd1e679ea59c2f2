//! The engine's plain types: what to run (`RunSpec`, checked before it gets
//! here), the operator's fixed choices (`Policy`), and what happened
//! (`RunOutcome`). No serde: `tools` converts these to and from the wire by
//! hand, so the MCP contract can change without touching the engine.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::network::NetworkMode;
use crate::quantity::Quantity;
use crate::sandbox::args::ExecOptions;
use crate::sandbox::{KILL_GRACE, TERMINATION_LOG, TMP_DIR};

/// One run, fully checked by `tools`: the image is allowed, paths are
/// relative and inside the workdir, contents are decoded, the timeout is
/// within bounds. The engine never checks these again.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub image: String,
    pub command: Vec<String>,
    pub files: Vec<InputFile>,
    pub env: BTreeMap<String, String>,
    pub cpu_limit: Option<Quantity>,
    pub memory_limit: Option<Quantity>,
    pub timeout: Duration,
    pub workdir: String,
    /// Glob patterns selecting artifacts; empty means "what the command
    /// created or changed".
    pub artifacts: Vec<String>,
    pub clone: Option<CloneSpec>,
    /// What the sandbox may reach; `tools` picked an allowed one.
    pub network: NetworkMode,
    /// The caller the run is recorded for, on a server with several
    /// (`callers`): only it sees the run, its token and its links.
    pub owner: Option<String>,
}

#[derive(Clone, Debug)]
pub struct InputFile {
    /// Relative to the workdir, `/`-separated, no `..`.
    pub path: String,
    pub content: Vec<u8>,
    pub mode: u32,
}

#[derive(Clone, Debug)]
pub struct CloneSpec {
    /// `https://host[:port]/path`, without credentials.
    pub repo_url: String,
    /// A branch, a tag or a full commit SHA.
    pub git_ref: String,
    /// Relative to the workdir, normalised; `""` is the workdir itself.
    pub subdir: String,
}

/// Slack on a run's deadline for collecting artifacts after the command.
const COLLECT_SLACK: Duration = Duration::from_secs(30);

/// The sandbox's own deadline, counted from its creation: start budget +
/// command timeout + kill grace + time to collect artifacts. The runner
/// enforces `timeout_s` itself; this only catches a sandbox that never gets
/// that far, and every backend holds its sandbox to it.
pub fn run_deadline(spec: &RunSpec, policy: &Policy) -> Duration {
    // With an output store a Kubernetes runner may wait for the server to
    // fetch what it held before it writes its result (`sandbox::held`).
    let held = if policy.outputs.is_some() { crate::sandbox::held::WAIT } else { Duration::ZERO };
    policy.start_timeout + spec.timeout + crate::sandbox::KILL_GRACE + COLLECT_SLACK + held
}

/// The runner's `exec` options for a run: the same contract on every
/// backend (the command, its timeout and kill grace, the operator's caps,
/// the folders whose disk use the runner watches).
pub fn exec_options(spec: &RunSpec, policy: &Policy) -> ExecOptions {
    let mut disk_paths = vec![std::path::PathBuf::from(&spec.workdir)];
    if separate_tmp(spec) {
        disk_paths.push(TMP_DIR.into());
    }
    ExecOptions {
        workdir: spec.workdir.clone().into(),
        timeout: spec.timeout,
        kill_grace: KILL_GRACE,
        max_output_bytes: policy.max_output_bytes as usize,
        max_artifact_bytes: policy.max_artifact_bytes,
        spill_bytes: policy.outputs.as_ref().map_or(0, |store| store.max_run_bytes()),
        hold: None,
        artifact_patterns: spec.artifacts.clone(),
        disk_paths,
        disk_limit_bytes: u64::try_from(policy.workdir_size_limit.nanos() / 1_000_000_000).unwrap_or(0),
        termination_log: TERMINATION_LOG.into(),
        start_deadline_ms: None,
        argv: spec.command.clone(),
    }
}

/// Whether the sandbox gets a scratch `/tmp` of its own: not when the
/// workdir is `/tmp` itself (a second mount at the same path would be
/// invalid on Kubernetes and hide the workdir on Docker).
pub fn separate_tmp(spec: &RunSpec) -> bool {
    spec.workdir != TMP_DIR
}

/// Bytes of the sandbox's `/dev/shm`: half its memory (its limit, else the
/// default), at most 64 MiB (Docker's own default). Shared memory is
/// tmpfs, charged to the sandbox's memory and not freed when the process
/// that wrote it dies: uncapped, a command filling it leaves no memory for
/// the runner, which is then killed in the command's place and an open
/// sandbox ends with it. Capped, the writer gets "no space left" and the
/// runner keeps the other half.
pub fn shm_bytes(spec: &RunSpec, policy: &Policy) -> u64 {
    const MOST: u64 = 64 << 20;
    let memory = spec.memory_limit.as_ref().unwrap_or(&policy.default_memory);
    let bytes = u64::try_from(memory.nanos() / 1_000_000_000).unwrap_or(u64::MAX);
    (bytes / 2).min(MOST)
}

/// The command's environment: the operator's variables, the caller's on
/// top (the caller wins), and `HOME` in `/tmp` unless one of them set it:
/// the root is read-only, so an image's own HOME (often under /root or
/// /home) is not writable, and tools that keep caches there get /tmp.
pub fn command_env(spec: &RunSpec, policy: &Policy) -> BTreeMap<String, String> {
    env_over(&policy.extra_env, &spec.env)
}

/// `command_env` for a run whose own variables are `env`, under the
/// operator's `extra_env`.
pub fn env_over(extra_env: &BTreeMap<String, String>, env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut merged = extra_env.clone();
    merged.extend(env.clone());
    merged.entry("HOME".to_string()).or_insert_with(|| TMP_DIR.to_string());
    merged
}

/// What the operator configured, the same for every run.
#[derive(Clone, Debug)]
pub struct Policy {
    pub run_as_user: u32,
    pub default_cpu: Quantity,
    pub default_memory: Quantity,
    pub max_output_bytes: u64,
    pub max_artifact_bytes: u64,
    /// Budget for scheduling, image pull and container start, separate from
    /// the command's own `timeout_s`.
    pub start_timeout: Duration,
    pub workdir_size_limit: Quantity,
    pub extra_env: BTreeMap<String, String>,
    pub cache: Option<CacheVolume>,
    /// The clone step, when MCP_K8S_CLONE_IMAGE and MCP_K8S_CLONE_SECRET
    /// are set; `tools` refuses `clone` arguments without it.
    pub clone: Option<CloneStep>,
    /// The output store (MCP_K8S_OUTPUTS_DIR): where streams and files
    /// past the inline caps are kept whole, behind resource links.
    pub outputs: Option<std::sync::Arc<crate::outputs::Store>>,
    /// Open sandboxes (sessions): how many, how long.
    pub sandboxes: SandboxLimits,
}

/// The operator's bounds on open sandboxes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SandboxLimits {
    /// Open at once, over every caller (MCP_K8S_MAX_SANDBOXES); 0: none
    /// may be opened.
    pub max_open: usize,
    /// The longest `max_lifetime_s` (MCP_K8S_SANDBOX_MAX_LIFETIME_S).
    pub max_lifetime: Duration,
}

impl Default for SandboxLimits {
    fn default() -> SandboxLimits {
        SandboxLimits { max_open: 4, max_lifetime: Duration::from_secs(3600) }
    }
}

#[derive(Clone, Debug)]
pub struct CacheVolume {
    pub claim_name: String,
    pub mount_path: String,
}

/// The image that runs `runner clone` and the Secret with one token per
/// git host (layout: `runner::clone`).
#[derive(Clone, Debug)]
pub struct CloneStep {
    pub image: String,
    pub secret_name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStatus {
    Succeeded,
    Failed,
    TimedOut,
    Error,
    Cancelled,
}

/// Declares `RunReason` and `ALL` from one list, so a new reason cannot be
/// missing from `ALL` (and so from `from_name`, which reads outcomes
/// recorded on a Job). A reason's wire name is its variant's name, so the
/// two cannot drift apart.
macro_rules! run_reasons {
    ($($(#[$doc:meta])* $variant:ident,)*) => {
        /// Why a run did not simply succeed or fail on its own.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum RunReason {
            $($(#[$doc])* $variant,)*
        }

        impl RunReason {
            /// Every reason, in declaration order.
            pub const ALL: &'static [RunReason] = &[$(RunReason::$variant,)*];

            /// The one name of a reason: in tool results, logs and metrics alike.
            pub fn name(self) -> &'static str {
                match self {
                    $(RunReason::$variant => stringify!($variant),)*
                }
            }
        }
    };
}

run_reasons! {
    /// The command exited non-zero.
    NonZeroExit,
    /// The command was killed by a signal it did not get from us.
    Signaled,
    /// The kernel's OOM killer ended the command (the memory limit).
    OOMKilled,
    /// The pod reached its process limit (the kubelet's `podPidsLimit`)
    /// and the command failed: a fork storm, or too many threads.
    PidsExhausted,
    /// The workdir or /tmp outgrew MCP_K8S_WORKDIR_SIZE; the runner
    /// stopped the command.
    DiskLimitExceeded,
    ImagePullFailed,
    Unschedulable,
    QuotaExceeded,
    /// Admission (Pod Security, LimitRange, validation) refused the pod.
    Rejected,
    /// `timeout_s` passed while the command ran.
    DeadlineExceeded,
    /// The pod did not start within the start timeout.
    StartTimeout,
    /// The kubelet evicted the pod (workdir over its size limit, node
    /// pressure) or the eviction API did; the message carries its text.
    Evicted,
    /// Something other than this server deleted the pod.
    PodDeleted,
    /// The runner was sent SIGTERM by something other than this server,
    /// and neither an eviction nor a deletion was seen to explain it.
    Terminated,
    /// The command could not be started (not found, not executable), or
    /// the container runtime could not start the container (`StartError`).
    StartFailed,
    /// The container could not be created (bad config, missing volume).
    ContainerFailed,
    /// The init container that writes inputs failed.
    InputFailed,
    /// With MCP_K8S_AWAIT_NETWORK_POLICY, the pod's network policy was not
    /// seen in force in time: the command was never started.
    NetworkPolicyNotEnforced,
    CloneFailed,
    /// The pod ended without the runner's result frame.
    ResultLost,
    Cancelled,
    /// The API server refused or failed a call the run needed.
    ApiError,
    /// The server was at MCP_K8S_MAX_CONCURRENT with a full queue.
    QueueFull,
    /// The named open sandbox does not exist (never did, closed, expired,
    /// or another caller's).
    SandboxNotFound,
    /// Another call runs in the named open sandbox.
    SandboxBusy,
    /// MCP_K8S_MAX_SANDBOXES are open already.
    SandboxLimit,
    /// The open sandbox ended while the call ran (closed, its lifetime
    /// over, or stopped from outside).
    SandboxEnded,
    /// The call's `timeout_s` would outlast the open sandbox's lifetime.
    SandboxExpiring,
}

impl RunStatus {
    /// The one name of a status: in tool results, logs and metrics alike.
    pub fn name(self) -> &'static str {
        match self {
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::TimedOut => "timeout",
            RunStatus::Error => "error",
            RunStatus::Cancelled => "cancelled",
        }
    }
}

impl RunStatus {
    /// The inverse of `name`, for outcomes recorded on a Job.
    pub fn from_name(name: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|status| status.name() == name)
    }

    const ALL: [RunStatus; 5] = [RunStatus::Succeeded, RunStatus::Failed, RunStatus::TimedOut, RunStatus::Error, RunStatus::Cancelled];
}

impl RunReason {
    /// The inverse of `name`, for outcomes recorded on a Job.
    pub fn from_name(name: &str) -> Option<RunReason> {
        RunReason::ALL.iter().copied().find(|reason| reason.name() == name)
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Truncation {
    pub stdout: bool,
    pub stderr: bool,
    pub artifacts: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Artifact {
    pub path: String,
    pub size: u64,
    pub mode: u32,
    pub sha256: String,
    /// `None` when the file did not fit under the artifact cap.
    pub content: Option<Vec<u8>>,
}

/// Wall-clock instants of the run's phases, as far as they happened, and
/// whether the run took a warm sandbox.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseTimes {
    /// The engine took the run (before it waited for a slot; a background
    /// run's submission).
    pub submitted: Option<SystemTime>,
    /// Its sandbox was created, or a warm one was handed to it.
    pub created: Option<SystemTime>,
    pub scheduled: Option<SystemTime>,
    pub started: Option<SystemTime>,
    /// The first output reached the server, for a run it followed from its
    /// start (a run answered in the call).
    pub first_output: Option<SystemTime>,
    pub finished: Option<SystemTime>,
    /// The answer was ready (a run answered in the call).
    pub answered: Option<SystemTime>,
    /// The run took a warm pool's sandbox: it was never cold underneath.
    pub warm: bool,
}

impl PhaseTimes {
    /// The stamps in their phases' order, `submitted` ≤ `created` ≤
    /// `scheduled` ≤ `started` ≤ `first_output` ≤ `finished` ≤ `answered`.
    /// They come from different observers (the server's clock, the API's
    /// status in whole seconds, the runtime's start record, the runner's
    /// own clock, in ms) and can disagree; the later phase's observer is
    /// the closer one, so an earlier stamp past a later one is brought back
    /// to it. `submitted` and `answered` are the server's own stamps of
    /// the call and bound the run: they are never moved, and a stamp that a
    /// coarser one brought back before `submitted` is raised to it. A
    /// missing stamp stays missing.
    pub fn ordered(&self) -> PhaseTimes {
        let mut times = self.clone();
        let submitted = times.submitted;
        let mut bound = times.answered;
        for stamp in [&mut times.finished, &mut times.first_output, &mut times.started, &mut times.scheduled, &mut times.created] {
            if let (Some(value), Some(limit)) = (*stamp, bound) {
                *stamp = Some(value.min(limit));
            }
            if let (Some(value), Some(floor)) = (*stamp, submitted) {
                *stamp = Some(value.max(floor));
            }
            bound = stamp.or(bound);
        }
        times
    }
}

/// Everything a run produced. A non-zero exit, a timeout, an OOM kill or a
/// pod that never started are all outcomes, not errors.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub run_id: String,
    pub status: RunStatus,
    pub reason: Option<RunReason>,
    /// What happened and, when something went wrong, what to do about it.
    pub message: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_total_bytes: u64,
    pub stderr_total_bytes: u64,
    pub truncated: Truncation,
    pub artifacts: Vec<Artifact>,
    /// Streams and files kept whole in the output store, in order:
    /// stdout, stderr, then files.
    pub links: Vec<crate::outputs::Link>,
    /// How long the command itself ran (zero if it never started).
    pub duration: Duration,
    pub times: PhaseTimes,
    /// Things that were lost or odd but did not decide the status.
    pub notes: Vec<String>,
}

impl RunOutcome {
    /// How the run ended, for its audit line (metadata only).
    pub fn audited(&self) -> crate::audit::Ended {
        crate::audit::Ended {
            status: self.status.name(),
            reason: self.reason.map(RunReason::name),
            exit_code: self.exit_code,
            signal: self.signal,
            duration: self.duration,
        }
    }

    /// An outcome for a run whose command never produced a result.
    pub fn without_result(run_id: &str, status: RunStatus, reason: RunReason, message: String) -> RunOutcome {
        RunOutcome {
            run_id: run_id.to_string(),
            status,
            reason: Some(reason),
            message,
            exit_code: None,
            signal: None,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_total_bytes: 0,
            stderr_total_bytes: 0,
            truncated: Truncation::default(),
            artifacts: Vec::new(),
            links: Vec::new(),
            duration: Duration::ZERO,
            times: PhaseTimes::default(),
            notes: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row: created, scheduled, started, finished in ms (None: not
    /// seen), and what `ordered` makes of them.
    #[test]
    fn phase_times_are_always_in_their_phases_order() {
        // submitted, created, scheduled, started, first output, finished, answered
        type Row = [Option<u64>; 7];
        let cases: &[(Row, Row)] = &[
            (
                [Some(1), Some(2), Some(3), Some(4), Some(5), Some(6), Some(7)],
                [Some(1), Some(2), Some(3), Some(4), Some(5), Some(6), Some(7)],
            ),
            // A Docker run: the create returned after the runtime's start
            // record, which came after the runner's first stamp.
            (
                [None, Some(235), Some(229), Some(227), None, Some(900), None],
                [None, Some(227), Some(227), Some(227), None, Some(900), None],
            ),
            ([None, Some(5), None, Some(3), None, Some(9), None], [None, Some(3), None, Some(3), None, Some(9), None]),
            ([None, Some(5), Some(6), None, None, None, None], [None, Some(5), Some(6), None, None, None, None]),
            ([None, Some(8), Some(7), Some(6), None, Some(5), None], [None, Some(5), Some(5), Some(5), None, Some(5), None]),
            // The first output reached the server after the runner's
            // clock said the command had finished; the answer after both.
            (
                [Some(100), Some(150), Some(160), Some(170), Some(420), Some(400), Some(430)],
                [Some(100), Some(150), Some(160), Some(170), Some(400), Some(400), Some(430)],
            ),
            // The runner's clock ahead of the server's answer.
            (
                [Some(100), Some(150), Some(160), Some(170), None, Some(440), Some(430)],
                [Some(100), Some(150), Some(160), Some(170), None, Some(430), Some(430)],
            ),
            // The API's whole-second scheduling stamp, truncated to before
            // the call: the server's own stamps stay, the coarse one is
            // raised to the submission.
            (
                [Some(1800), Some(1850), Some(1000), Some(1900), Some(2100), Some(2500), Some(2600)],
                [Some(1800), Some(1800), Some(1800), Some(1900), Some(2100), Some(2500), Some(2600)],
            ),
            ([None; 7], [None; 7]),
        ];
        let at = |ms: Option<u64>| ms.map(|ms| std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms));
        let times = |row: &Row| PhaseTimes {
            submitted: at(row[0]),
            created: at(row[1]),
            scheduled: at(row[2]),
            started: at(row[3]),
            first_output: at(row[4]),
            finished: at(row[5]),
            answered: at(row[6]),
            warm: true,
        };
        for (input, expected) in cases {
            assert_eq!(times(input).ordered(), times(expected), "{input:?}");
        }
    }

    #[test]
    fn names_round_trip_and_every_reason_is_listed() {
        for &reason in RunReason::ALL {
            assert_eq!(RunReason::from_name(reason.name()), Some(reason));
        }
        let mut names: Vec<&str> = RunReason::ALL.iter().map(|reason| reason.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), RunReason::ALL.len(), "two reasons share a name");
        for status in RunStatus::ALL {
            assert_eq!(RunStatus::from_name(status.name()), Some(status));
        }
        assert_eq!(RunReason::from_name("nope"), None);
    }
}
