//! Background runs: submit, fetch, cancel and list, with the
//! cluster as the source of truth so a restart or a second replica loses
//! nothing.
//!
//! A background run is the same engine run as `run::run`, but its Job is
//! kept when it ends: `ttlSecondsAfterFinished` is the result retention, and
//! annotations carry what a process that did not create it needs (the job
//! token, `timeout_s`, the expiry). Its pod and container log (which holds
//! the runner's result frame) stay readable by any replica until the TTL
//! controller deletes the Job. The `jobs::Jobs` store caches state and
//! outcomes; a token it does not know is looked up in the cluster and
//! re-attached: one follower thread per run, shared by every waiter.
//! A run's verdict is written onto its Job (`engine::run::verdict`) before it is
//! cached or returned, and a re-attach reads it before anything else, so a
//! token has one result in every process.
//!
//! A background call in an open sandbox (`submit_call`) has a token of the
//! same kind that also names its sandbox; its result is read from that
//! sandbox, by any process (the section at the end).
//!
//! Background runs do not take an `MCP_K8S_MAX_CONCURRENT` slot: a slot
//! bounds what this process waits on, while a background Job lives in the
//! cluster whether or not this process does, and waiting for a slot in
//! memory would make a submitted run vanish with a restart. The store caps
//! how many are in flight instead (`Limits::max_running`).
//!
//! Knows Kubernetes and the engine; nothing of MCP.

pub mod idempotency;

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::audit;
use crate::cancel::CancelToken;
use crate::engine::background::idempotency::{Judged, Keyed};
use crate::engine::port::facts::{DecidedBy, Recorded, SandboxState, Wording};
use crate::engine::port::jobs::{Lookup, OnEnd, Phase, Seen, View};
use crate::engine::port::spec::{PhaseTimes, RunOutcome, RunReason, RunSpec, RunStatus, run_deadline};
use crate::engine::port::{BackgroundRecord, ErrorKind, Keep, Settled, Stop, Stored};
use crate::engine::run::verdict::{self, Ended};
use crate::engine::run::{self, Ctx, Followed, Progress};
use crate::log;
use crate::outputs::{Link, visible_to};
use crate::sandbox::frame::Stream;
use crate::supervise;
use crate::trace::{self, SpanContext};

/// How long the runner may take to report the output so far after a
/// cancel deleted its pod, before the follower is stopped outright.
const CANCEL_DRAIN: Duration = Duration::from_secs(15);
/// How long the first look at a running run waits for its output, which
/// nobody read before (a run's output is read once someone asks or at its
/// end): one kubelet log request, and the first frames.
const FIRST_LOOK: Duration = Duration::from_secs(1);
/// Longest program name kept in a run's record.
const PROGRAM_NAME_CHARS: usize = 64;
/// A follower that re-attaches gets at least this long to see the pod
/// before the start or hard deadline (counted from the Job's creation)
/// can end it.
const ATTACH_GRACE: Duration = Duration::from_secs(10);

/// A submitted run.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub token: String,
    pub run_id: String,
}

/// Why a background call could not be answered.
#[derive(Clone, Debug)]
pub enum Error {
    /// Not a token this server hands out, or its Job never existed here.
    Unknown { token: String },
    /// The result was kept for `result_ttl_s` after the run and is gone.
    Expired { token: String, result_ttl_s: u64 },
    /// Too many background runs in flight.
    Full { running: usize },
    /// The cluster refused to create the run: the outcome a sync run
    /// would have had (status, reason, message), so a caller can give it
    /// as the run's result.
    Refused { outcome: Box<RunOutcome> },
    /// `cancel` on a run that has already finished.
    AlreadyFinished { token: String },
    /// An idempotency key given again with other arguments.
    KeyReused { key: String },
    /// A call in an open sandbox whose sandbox is gone: its result went
    /// with it.
    SandboxClosed { token: String },
    /// An API call failed; `kind` says whether retrying can help.
    Api { what: &'static str, kind: ErrorKind, message: String },
}

impl fmt::Display for Error {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unknown { token } => {
                write!(formatter, "no background run `{token}` exists here: it never did, or it ended and was removed")
            }
            Error::Expired { token, result_ttl_s } => write!(
                formatter,
                "job_token `{token}` has expired: results are kept {result_ttl_s} s after the job ends (MCP_K8S_RESULT_TTL_S); submit the job again"
            ),
            Error::Full { running } => write!(
                formatter,
                "{running} background jobs are in flight, the most this server allows (MCP_K8S_MAX_CONCURRENT + MCP_K8S_MAX_QUEUED); fetch or cancel some, then retry"
            ),
            Error::Refused { outcome } => write!(formatter, "{}", outcome.message),
            Error::AlreadyFinished { token } => {
                write!(formatter, "run `{token}` has already finished; its result can be read")
            }
            Error::KeyReused { key } => write!(
                formatter,
                "idempotency_key `{}` was already used for a call with other arguments (or another tool); a key stands for one call: use a new key for new arguments",
                crate::echo::shorten(key)
            ),
            Error::SandboxClosed { token } => write!(
                formatter,
                "the sandbox that call `{}` ran in is closed (closed, idle too long, or past its max_lifetime_s), and its calls' results went with it; a call's result is kept as long as its sandbox",
                crate::echo::shorten(token)
            ),
            Error::Api { what, kind, message } => write!(formatter, "could not {what}: {message}; {}", kind.advice()),
        }
    }
}

impl std::error::Error for Error {}

/// One background Job as `list` finds it.
#[derive(Clone, Debug)]
pub struct Listed {
    pub token: String,
    pub created: Option<SystemTime>,
    /// From the store when known here, else from the Job's status.
    pub phase: Phase,
    /// The result's status when this process has it.
    pub result_status: Option<RunStatus>,
    pub cancelled: bool,
    pub command: String,
    pub expires_at: String,
}

/// What a background run was asked for: a command (`run_job`,
/// `submit_job`) or a piece of code (`execute_code`). The token carries it
/// (`job-…`, `code-…`), so every process, a restarted one or another
/// replica, answers a task's result in the shape of the tool that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    Job,
    Code,
}

impl TokenKind {
    fn prefix(self) -> &'static str {
        match self {
            TokenKind::Job => "job-",
            TokenKind::Code => "code-",
        }
    }
}

/// A token as `token_for` writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    pub kind: TokenKind,
    pub run_id: String,
    pub submitted: SystemTime,
    /// The site the run is on, on a server with named sites.
    pub site: Option<String>,
    /// A call in an open sandbox: which one, and the call's timeout.
    pub sandbox: Option<InSandbox>,
}

/// What a background call's token says of the open sandbox it runs in:
/// enough for any process to find its frames in that sandbox's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InSandbox {
    /// The sandbox's public name (never its id).
    pub name: String,
    pub timeout_s: u64,
}

/// The token for a run submitted at `submitted`: its kind, the run id (128
/// random bits, so unguessable) and the submit time, so that a token whose
/// Job is gone can be told apart as expired rather than unknown; on a
/// server with named sites, `.` and the run's site, so any call on the
/// token finds the site without being told.
fn token_for(kind: TokenKind, run_id: &str, submitted: SystemTime, site: Option<&str>) -> String {
    let seconds = submitted.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    match site {
        Some(site) => format!("{}{run_id}-{seconds}.{site}", kind.prefix()),
        None => format!("{}{run_id}-{seconds}", kind.prefix()),
    }
}

/// The token of a background call in an open sandbox: `token_for`'s,
/// with the sandbox's public name and the call's timeout after the time.
fn call_token_for(kind: TokenKind, run_id: &str, submitted: SystemTime, in_sandbox: &InSandbox, site: Option<&str>) -> String {
    let seconds = submitted.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let InSandbox { name, timeout_s } = in_sandbox;
    match site {
        Some(site) => format!("{}{run_id}-{seconds}-{name}-{timeout_s}.{site}", kind.prefix()),
        None => format!("{}{run_id}-{seconds}-{name}-{timeout_s}", kind.prefix()),
    }
}

/// A token's parts; `None` unless it has the exact shape `token_for`
/// writes, so nothing else reaches a Kubernetes name.
pub fn parse_token(token: &str) -> Option<Token> {
    let (kind, rest) = [TokenKind::Job, TokenKind::Code].into_iter().find_map(|kind| Some((kind, token.strip_prefix(kind.prefix())?)))?;
    let (run_id, rest) = rest.split_once('-')?;
    let (rest, site) = match rest.split_once('.') {
        Some((rest, site)) => (rest, Some(site)),
        None => (rest, None),
    };
    let (seconds, sandbox) = match rest.split_once('-') {
        Some((seconds, in_sandbox)) => (seconds, Some(parse_in_sandbox(in_sandbox)?)),
        None => (rest, None),
    };
    let site_ok = site.is_none_or(|site| {
        !site.is_empty() && site.len() <= 32 && site.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
    });
    let hex = crate::sandbox::is_lower_hex(run_id, 16);
    let digits = !seconds.is_empty() && seconds.len() <= 12 && seconds.bytes().all(|byte| byte.is_ascii_digit());
    if !hex || !digits || !site_ok {
        return None;
    }
    let submitted = UNIX_EPOCH + Duration::from_secs(seconds.parse().ok()?);
    let parsed = Token { kind, run_id: run_id.to_string(), submitted, site: site.map(str::to_string), sandbox };
    // Only the text `token_for` writes: another spelling of the same parts
    // (a leading zero) would name the same run under another token.
    let written = match &parsed.sandbox {
        Some(in_sandbox) => call_token_for(kind, &parsed.run_id, submitted, in_sandbox, parsed.site.as_deref()),
        None => token_for(kind, &parsed.run_id, submitted, parsed.site.as_deref()),
    };
    (written == token).then_some(parsed)
}

fn parse_in_sandbox(text: &str) -> Option<InSandbox> {
    let (name, timeout_s) = text.split_once('-')?;
    let hex = crate::sandbox::is_lower_hex(name, 16);
    let digits = !timeout_s.is_empty() && timeout_s.len() <= 9 && timeout_s.bytes().all(|byte| byte.is_ascii_digit());
    (hex && digits).then(|| Some(InSandbox { name: name.to_string(), timeout_s: timeout_s.parse().ok()? })).flatten()
}

/// Creates the run's Job (kept after it ends) and starts following it.
/// Returns once the Job exists, so the token is durable when returned.
/// With a key (`idempotency`), the key's run when it exists already.
/// `traced` is the submitting call's span, when traces are sent: the
/// run's spans go under it when its verdict is recorded.
/// `on_end` is called with the run's outcome if this process records it
/// (dropped otherwise): the caller's limits count the run until then.
pub fn submit(
    ctx: &Ctx,
    spec: &RunSpec,
    kind: TokenKind,
    keyed: Option<&Keyed>,
    traced: Option<SpanContext>,
    on_end: Option<OnEnd>,
) -> Result<Submitted, Error> {
    let traceparent = traced.map(|span| span.traceparent());
    match keyed {
        Some(keyed) => submit_keyed(ctx, spec, kind, keyed, (traceparent, on_end)),
        None => {
            let run_id = ctx.backend.claim(spec, crate::engine::port::RunKind::Background).unwrap_or_else(run::new_run_id);
            submit_new(ctx, spec, kind, &run_id, (None, traceparent, on_end))
        }
    }
}

/// Keyed submits of this process, striped by run id: two calls with one
/// key here take turns, so the second finds the first's run; between
/// processes the create of the key's run name decides.
static KEYED: [Mutex<()>; 16] = [const { Mutex::new(()) }; 16];

/// The run `keyed` names: found (a retry), or made now. A warm sandbox
/// is never claimed for it (its run id is the key's, not the sandbox's).
fn submit_keyed(
    ctx: &Ctx,
    spec: &RunSpec,
    kind: TokenKind,
    keyed: &Keyed,
    (traceparent, on_end): (Option<String>, Option<OnEnd>),
) -> Result<Submitted, Error> {
    let stripe = usize::from_str_radix(&keyed.run_id[..1], 16).unwrap_or(0) % KEYED.len();
    let _turn = KEYED[stripe].lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(found) = keyed_run(ctx, keyed)? {
        return found;
    }
    match submit_new(ctx, spec, kind, &keyed.run_id, (Some(keyed.fingerprint.clone()), traceparent, on_end)) {
        // Another process made the key's run between the look and the
        // create (the name was taken): its run is the answer.
        Err(refused @ Error::Refused { .. }) => {
            for pause in TAKEN_LOOKS {
                std::thread::sleep(pause);
                if let Some(found) = keyed_run(ctx, keyed)? {
                    return found;
                }
            }
            Err(refused)
        }
        made => made,
    }
}

/// Pauses between the looks for the run that took a key's name when a
/// create collided: dockerd reserves a name before the container it is
/// making is listed (a Kubernetes create is whole at once). About a
/// second and a half in all; a create that fails afterwards removes what
/// it made, and the caller then gets this create's refusal.
const TAKEN_LOOKS: [Duration; 6] = [
    Duration::ZERO,
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
];

/// The answer for a key whose run exists: its token for the same
/// arguments, an error naming the key for others; `None` when no run of
/// the key exists (never made, or removed at its retention's end).
fn keyed_run(ctx: &Ctx, keyed: &Keyed) -> Result<Option<Result<Submitted, Error>>, Error> {
    let Some(stored) = ctx.backend.find(&keyed.run_id).map_err(api)? else { return Ok(None) };
    Ok(Some(match idempotency::judge(&keyed.fingerprint, &stored.token, stored.fingerprint.as_deref()) {
        Judged::Same { token } => Ok(Submitted { token, run_id: stored.run_id }),
        Judged::Different => Err(Error::KeyReused { key: keyed.key.clone() }),
    }))
}

/// Creates the background run `run_id` and starts following it.
/// `recorded` is what the record keeps besides the token: the arguments'
/// fingerprint of a keyed run and the submitting call's `traceparent`;
/// and what to call at the run's end here.
fn submit_new(
    ctx: &Ctx,
    spec: &RunSpec,
    kind: TokenKind,
    run_id: &str,
    (fingerprint, traceparent, on_end): (Option<String>, Option<String>, Option<OnEnd>),
) -> Result<Submitted, Error> {
    let run_id = run_id.to_string();
    let token = token_for(kind, &run_id, SystemTime::now(), ctx.site.as_deref());
    let cancel = CancelToken::new();
    if let Err(full) = ctx.jobs.insert_new(&run_id, &token, cancel.clone()) {
        // A warm sandbox claimed for it goes, as a cold run's nothing would.
        ctx.backend.remove(&run_id);
        return Err(Error::Full { running: full.running });
    }
    ctx.jobs.set_owner(&run_id, spec.owner.clone(), on_end);
    let mut followed = Followed::from_spec(spec, &ctx.policy);
    // Nobody waits on a background run, so it waits for capacity (a node
    // freeing CPU) up to its start timeout instead of the sync grace, and
    // its output is read once someone asks (or at its end), so a run
    // nobody watches holds no stream while it runs.
    followed.unschedulable_grace = None;
    followed.output_on_demand = on_demand(ctx);
    let result_ttl = ctx.jobs.limits().result_ttl;
    let keep = Keep::Background {
        record: BackgroundRecord {
            token: token.clone(),
            timeout_s: spec.timeout.as_secs(),
            command: command_summary(spec),
            fingerprint,
            traceparent,
            owner: spec.owner.clone(),
        },
        result_ttl,
        expires_at: SystemTime::now() + run_deadline(spec, &ctx.policy) + run::EXPIRY_SLACK + result_ttl,
    };
    let created = match run::create(ctx, spec, &run_id, keep) {
        Ok(created) => created,
        Err(outcome) => {
            ctx.jobs.remove(&run_id);
            return Err(Error::Refused { outcome });
        }
    };
    let created_at = created.created_at;
    start_follower(ctx, &run_id, followed, created_at, cancel);
    Ok(Submitted { token, run_id })
}

/// The run's current view, waiting up to `wait` for it to finish. New live
/// output goes to `on_output` while waiting; `stop` ends the wait early.
/// `reader`: the caller asking, on a server with several; another
/// caller's run reads as unknown, as a token that names no run.
pub fn fetch(
    ctx: &Ctx,
    token: &str,
    reader: Option<&str>,
    wait: Duration,
    stop: &CancelToken,
    on_output: &mut dyn FnMut(Stream, &[u8]),
) -> Result<View, Error> {
    let deadline = Instant::now() + wait;
    // Seen output starts at "everything so far": the reply carries it.
    let mut seen: Option<Seen> = None;
    // Two rounds: an entry evicted while waiting is found in the cluster.
    for _ in 0..2 {
        let (run_id, _) = ensure_known(ctx, token, reader)?;
        if ctx.jobs.want_output(&run_id) {
            // Its output is read from now on: give this first look the
            // output so far, as a run followed all along would have it.
            ctx.jobs.wait_for_output(&run_id, Instant::now() + FIRST_LOOK, &Seen::default());
        }
        let seen = seen.get_or_insert_with(|| match ctx.jobs.lookup(&run_id) {
            Lookup::Found(view) => Seen { stdout: view.stdout_seen, stderr: view.stderr_seen },
            _ => Seen::default(),
        });
        match ctx.jobs.wait(&run_id, deadline, stop, seen, on_output) {
            Lookup::Found(view) => return Ok(view),
            Lookup::Expired => return Err(expired(ctx, token)),
            Lookup::Missing => continue,
        }
    }
    Err(Error::Unknown { token: token.to_string() })
}

/// Stops the run: marks its Job cancelled and deletes its pod (the runner
/// then reports the output so far), and answers as soon as both are done.
/// It used to wait for that report too, and ten cancels at once took 2 to
/// 11 s each; the rest now happens on a thread of
/// its own (`finish_cancel`), and `fetch_job` returns the `cancelled`
/// result once the follower has it.
pub fn cancel(ctx: &Ctx, token: &str, reader: Option<&str>) -> Result<View, Error> {
    let (run_id, view) = ensure_known(ctx, token, reader)?;
    if view.phase == Phase::Finished {
        return Err(Error::AlreadyFinished { token: token.to_string() });
    }
    if parse_token(token).is_some_and(|parsed| parsed.sandbox.is_some()) {
        return cancel_call(ctx, token, &run_id);
    }
    // A run that already ended, but whose output is still being read
    // here, must keep its sandbox: the result is in that output.
    let stored = ctx.backend.find(&run_id).map_err(api)?;
    if stored.as_ref().is_some_and(|stored| stored.ended_at.is_some() || stored.verdict.is_some()) {
        // Let this process's follower take the ended run's result first, so
        // a fetch_job right after this answer has it.
        ctx.jobs.wait(&run_id, Instant::now() + CANCEL_DRAIN, &CancelToken::new(), &mut Seen::default(), &mut |_, _| {});
        return Err(Error::AlreadyFinished { token: token.to_string() });
    }
    let Some(follower) = ctx.jobs.request_cancel(&run_id) else {
        return Err(Error::Unknown { token: token.to_string() });
    };
    if let Err(error) = ctx.backend.mark_cancelled(&run_id, SystemTime::now()) {
        // The run is still stopped; only another process's view of why
        // its sandbox vanished is poorer.
        log::warn("could not mark the run cancelled", &[("run_id", run_id.as_str().into()), ("error", error.to_string().into())]);
    }
    stop_all(ctx, &run_id);
    // Nothing of a cancelled run stays in the output store.
    if let Some(outputs) = &ctx.policy.outputs {
        outputs.remove(&run_id);
    }
    let thread_ctx = ctx.clone();
    let thread_run_id = run_id.clone();
    let spawned =
        supervise::spawn_named(supervise::Kind::CancelFinisher, format!("cancel-{}", &run_id[..8.min(run_id.len())]), move || {
            finish_cancel(&thread_ctx, &thread_run_id, &follower)
        });
    if let Err(error) = spawned {
        // The pod is deleted already; without the thread, a runner that
        // never reports leaves the follower to its own deadlines.
        log::warn(
            "could not start the thread that finishes a cancel",
            &[("run_id", run_id.as_str().into()), ("error", error.to_string().into())],
        );
    }
    match ctx.jobs.lookup(&run_id) {
        Lookup::Found(view) => Ok(view),
        _ => Err(Error::Unknown { token: token.to_string() }),
    }
}

/// Stops a call in an open sandbox: whichever process follows it asks the
/// sandbox to stop the call (the sandbox stays open); the `cancelled`
/// result follows in a moment.
fn cancel_call(ctx: &Ctx, token: &str, run_id: &str) -> Result<View, Error> {
    if let Some(follower) = ctx.jobs.request_cancel(run_id) {
        follower.cancel();
    }
    match ctx.jobs.lookup(run_id) {
        Lookup::Found(view) => Ok(view),
        _ => Err(Error::Unknown { token: token.to_string() }),
    }
}

/// The rest of a cancel: gives the runner `CANCEL_DRAIN` to report the
/// output so far, then stops the follower outright, and deletes a pod the
/// Job controller may have created after the first sweep.
fn finish_cancel(ctx: &Ctx, run_id: &str, follower: &CancelToken) {
    let never = CancelToken::new();
    let mut seen = Seen::default();
    let drained = ctx.jobs.wait(run_id, Instant::now() + CANCEL_DRAIN, &never, &mut seen, &mut |_, _| {});
    if !matches!(&drained, Lookup::Found(view) if view.phase == Phase::Finished) {
        follower.cancel();
        ctx.jobs.wait(run_id, Instant::now() + CANCEL_DRAIN, &never, &mut seen, &mut |_, _| {});
    }
    stop_all(ctx, run_id);
}

/// The background runs `reader` may see (all of them on a server with
/// one caller), newest first.
pub fn list(ctx: &Ctx, reader: Option<&str>) -> Result<Vec<Listed>, Error> {
    let stored = ctx.backend.list().map_err(api)?;
    let mut listed: Vec<Listed> =
        stored.iter().filter(|stored| visible_to(stored.owner.as_deref(), reader)).filter_map(|stored| listed_run(ctx, stored)).collect();
    listed.sort_by_key(|listed| std::cmp::Reverse(listed.created));
    Ok(listed)
}

/// The run's view without waiting (`tasks/get`).
pub fn status(ctx: &Ctx, token: &str, reader: Option<&str>) -> Result<View, Error> {
    fetch(ctx, token, reader, Duration::ZERO, &CancelToken::new(), &mut |_, _| {})
}

/// Makes sure the store knows the run: from memory, or by re-attaching to
/// its Job. Returns the run id and the current view.
fn ensure_known(ctx: &Ctx, token: &str, reader: Option<&str>) -> Result<(String, View), Error> {
    let Some(Token { run_id, .. }) = parse_token(token) else {
        return Err(Error::Unknown { token: token.to_string() });
    };
    match ctx.jobs.lookup(&run_id) {
        Lookup::Found(view) if view.token == token && !visible_to(view.owner.as_deref(), reader) => return Err(gone(ctx, token)),
        Lookup::Found(view) if view.token == token => return Ok((run_id, view)),
        Lookup::Found(_) => return Err(Error::Unknown { token: token.to_string() }),
        Lookup::Expired => return Err(expired(ctx, token)),
        Lookup::Missing => {}
    }
    match parse_token(token) {
        Some(parsed) if parsed.sandbox.is_some() => attach_call(ctx, &parsed, token, reader)?,
        _ => attach(ctx, token, &run_id, reader)?,
    }
    match ctx.jobs.lookup(&run_id) {
        Lookup::Found(view) if !visible_to(view.owner.as_deref(), reader) => Err(gone(ctx, token)),
        Lookup::Found(view) => Ok((run_id, view)),
        Lookup::Expired => Err(expired(ctx, token)),
        // The Job exists (attach found it), but its outcome could not be
        // recorded or it could not be followed: nothing is cached.
        Lookup::Missing => Err(Error::Api {
            what: "settle the job's outcome",
            kind: ErrorKind::Transient,
            message: "the API server did not accept the outcome (see the server log)".into(),
        }),
    }
}

/// Finds the run's Job and makes the store know it, before the caller
/// answers: a recorded verdict is taken as it is
/// (never judged again over a later pod), a run that has ended is read to
/// its end on this thread, and only a run still going gets a follower. The
/// Job must carry exactly this token, so a token with a forged time does
/// not reach it.
fn attach(ctx: &Ctx, token: &str, run_id: &str, reader: Option<&str>) -> Result<(), Error> {
    let stored = ctx.backend.find(run_id).map_err(api)?;
    let Some(stored) = stored.filter(|stored| stored.token == token && visible_to(stored.owner.as_deref(), reader)) else {
        return Err(gone(ctx, token));
    };
    let recorded = stored.verdict.clone();
    let ended_at = recorded.as_ref().and_then(|recorded| recorded.ended_at).or(stored.ended_at);
    if ended_at.is_some_and(|at| at + ctx.jobs.limits().result_ttl <= SystemTime::now()) {
        // The backend's expiry has not got to it yet; the result is
        // expired all the same.
        return Err(expired(ctx, token));
    }
    let created = stored.created_at;
    let cancel = CancelToken::new();
    if !ctx.jobs.insert_found(run_id, token, created.unwrap_or_else(SystemTime::now), cancel.clone()) {
        return Ok(());
    }
    ctx.jobs.set_owner(run_id, stored.owner.clone(), None);
    log::info("re-attaching to a background job", &[("run_id", run_id.into())]);
    let followed = followed_from_stored(ctx, &stored);
    let sandbox_state = stored.sandbox.as_ref().map(|sighting| &sighting.view.state);
    match (&recorded, sandbox_state) {
        // The runner's verdict, and its output is still there: read it;
        // `follow_to_end` keeps the recorded verdict.
        (Some(recorded), Some(_)) if recorded.by == DecidedBy::Runner => follow_to_end(ctx, run_id, &followed, created, &cancel),
        (Some(recorded), _) => {
            let kept = kept_links(ctx, run_id, reader);
            let outcome = outcome_without_sandbox(run_id, ctx.backend.wording(), &stored, created, (Some(recorded), kept));
            ctx.jobs.finish(run_id, outcome, ended_at.unwrap_or_else(SystemTime::now));
        }
        (None, None) if stored.ended_at.is_some() => {
            let ended = Ended {
                outcome: outcome_without_sandbox(run_id, ctx.backend.wording(), &stored, created, (None, None)),
                by: DecidedBy::Server,
            };
            record_and_finish(ctx, run_id, ended, ended_at.unwrap_or_else(SystemTime::now), Some(&stored));
        }
        (None, Some(state)) if stored.ended_at.is_some() || matches!(state, SandboxState::Finished { .. }) => {
            follow_to_end(ctx, run_id, &followed, created, &cancel);
        }
        (None, state) => {
            if state == Some(&SandboxState::Running) {
                ctx.jobs.set_phase(run_id, Phase::Running);
            }
            start_follower(ctx, run_id, followed, created, cancel);
        }
    }
    Ok(())
}

/// Follows the run on its own thread until it ends, then records the
/// outcome. The Job is kept; the inputs Secret goes (it may hold secrets,
/// and nothing reads it once the pod has run).
fn start_follower(ctx: &Ctx, run_id: &str, followed: Followed, created: Option<SystemTime>, cancel: CancelToken) {
    let thread_ctx = ctx.clone();
    let thread_run_id = run_id.to_string();
    let spawned =
        supervise::spawn_named(supervise::Kind::BackgroundFollower, format!("job-{}", &run_id[..8.min(run_id.len())]), move || {
            follow_to_end(&thread_ctx, &thread_run_id, &followed, created, &cancel)
        });
    if let Err(error) = spawned {
        let message = format!("could not start a thread to follow the job: {error}; fetch_job will try again");
        // Forgetting the entry lets the next fetch re-attach.
        log::error("background follower not started", &[("run_id", run_id.into()), ("error", message.into())]);
        ctx.jobs.remove(run_id);
    }
}

fn follow_to_end(ctx: &Ctx, run_id: &str, followed: &Followed, created: Option<SystemTime>, cancel: &CancelToken) {
    let started = Instant::now();
    // Re-attached runs may have inputs too; dropping missing ones is no error.
    let inputs = run::InputsUsed::new();
    let on_progress = |progress: Progress| {
        inputs.on_progress(ctx, run_id, &progress);
        match progress {
            Progress::Started => ctx.jobs.set_phase(run_id, Phase::Running),
            Progress::Output(chunk) => ctx.jobs.push_output(run_id, chunk.stream, &chunk.bytes),
            Progress::Queued | Progress::Created { .. } => {}
        }
    };
    let mut ended = run::follow(ctx, followed, run_id, cancel, &on_progress);
    ended.outcome.times.created = created;
    // The record as it is now: whether another process cancelled the run,
    // and when it ended if that was before this process re-read it.
    let stored = ctx.backend.find(run_id).ok().flatten();
    if let Some(stored) = &stored {
        stored_times(stored, &mut ended.outcome.times);
    }
    let marked_cancelled = stored.as_ref().is_some_and(|stored| stored.cancelled_at.is_some());
    let cancel_requested = matches!(ctx.jobs.lookup(run_id), Lookup::Found(view) if view.cancel_requested);
    if (cancel_requested || marked_cancelled) && mark_cancelled(&mut ended.outcome, ctx.backend.wording()) {
        ended.by = DecidedBy::Server;
    }
    run::log_finished(ctx, run_id, &ended.outcome, started);
    let ended_at = stored.as_ref().and_then(|stored| stored.ended_at).unwrap_or_else(SystemTime::now);
    record_and_finish(ctx, run_id, ended, ended_at, stored.as_ref());
}

/// Makes the end final on the Job, then
/// caches it. A verdict another process recorded first wins. When it
/// cannot be recorded (the API does not answer) nothing is cached: the
/// entry goes, and the next `fetch_job` reads the cluster again, so this
/// process never holds a result the Job does not.
fn record_and_finish(ctx: &Ctx, run_id: &str, mut ended: Ended, ended_at: SystemTime, stored: Option<&Stored>) {
    match verdict::settle(ctx.backend.as_ref(), run_id, &ended, verdict::Record::Yes) {
        Ok(Settled::AlreadyRecorded(recorded)) => verdict::apply(&mut ended.outcome, &recorded),
        // The first writer of the verdict, whichever process that is,
        // writes the one `ended` line of the run's audit trail.
        // So does it send the run's spans.
        Ok(Settled::Recorded) => {
            let owner = match ctx.jobs.lookup(run_id) {
                Lookup::Found(view) => view.owner,
                _ => stored.and_then(|stored| stored.owner.clone()),
            };
            audit::record(&audit::Entry {
                ended: Some(ended.outcome.audited()),
                caller: owner.as_deref(),
                site: ctx.site.as_deref(),
                ..audit::Entry::new(audit::Event::Ended, run_id)
            });
            send_spans(stored, &ended.outcome);
        }
        Ok(Settled::NoRecord) => {}
        Err(error) => {
            log::warn(
                "the outcome could not be recorded on the job; the next fetch_job reads the cluster again",
                &[("run_id", run_id.into()), ("error", error.to_string().into())],
            );
            ctx.jobs.remove(run_id);
            return;
        }
    }
    ctx.backend.inputs_used(run_id);
    ctx.jobs.finish(run_id, ended.outcome, ended_at);
}

/// A cancelled run whose runner could not report in time ends as
/// `cancelled`, not as a lost result; one that finished on its own first
/// keeps its real outcome. Returns whether it changed the outcome.
fn mark_cancelled(outcome: &mut RunOutcome, wording: &Wording) -> bool {
    if matches!(outcome.status, RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled) {
        return false;
    }
    outcome.status = RunStatus::Cancelled;
    outcome.reason = Some(RunReason::Cancelled);
    outcome.message = format!("the job was cancelled (cancel_job) and its {} deleted; the output read so far is included", wording.sandbox);
    true
}

/// The outcome of a finished run whose sandbox (and so its output) is
/// gone, or whose verdict was recorded by the process that decided it.
/// `kept`: the links the output store holds of the run (`kept_links`).
fn outcome_without_sandbox(
    run_id: &str,
    wording: &Wording,
    stored: &Stored,
    created: Option<SystemTime>,
    (recorded, kept): (Option<&Recorded>, Option<Vec<Link>>),
) -> RunOutcome {
    let cancelled = recorded.is_none_or(|recorded| recorded.status == RunStatus::Cancelled);
    let mut outcome = match stored.cancelled_at.as_deref().filter(|_| cancelled) {
        Some(at) => {
            // An earlier version wrote the output's tail onto the Job for
            // this case; the caller's output does not belong in etcd for
            // the retention, so only the process that
            // cancelled the run has it.
            let mut outcome = RunOutcome::without_result(
                run_id,
                RunStatus::Cancelled,
                RunReason::Cancelled,
                format!(
                    "the job was cancelled at {at}; its partial output was held by the server process that cancelled it and is not kept in the cluster"
                ),
            );
            outcome.truncated.stdout = true;
            outcome.truncated.stderr = true;
            outcome
        }
        None => match recorded {
            Some(recorded) => {
                let mut outcome = verdict::outcome_of(run_id, recorded);
                match kept.filter(|_| recorded.by == DecidedBy::Runner) {
                    Some(links) => keep_links(&mut outcome, links, wording),
                    None if recorded.by == DecidedBy::Runner => outcome.notes.push(format!(
                        "the {} and its output are gone, so the output cannot be returned; the status is the one recorded when the job ended",
                        wording.sandbox
                    )),
                    None => {}
                }
                outcome
            }
            None => RunOutcome::without_result(
                run_id,
                RunStatus::Error,
                RunReason::ResultLost,
                format!(
                    "the job finished but its {} and output are gone (deleted or garbage-collected), so the result cannot be read; submit the job again",
                    wording.sandbox
                ),
            ),
        },
    };
    outcome.times.created = created;
    stored_times(stored, &mut outcome.times);
    outcome
}

/// What the output store holds of a run another process read: a run the
/// runner judged whose sandbox was gone before this process read it. The
/// store is every replica's, so its links are the output this process can
/// still give. `None` without a store or without entries.
fn kept_links(ctx: &Ctx, run_id: &str, reader: Option<&str>) -> Option<Vec<Link>> {
    let store = ctx.policy.outputs.as_ref()?;
    store.links_of(run_id, SystemTime::now(), reader).filter(|links| !links.is_empty())
}

/// The outcome answers `links` instead of the inline output, which is not
/// kept: each linked stream is marked truncated with its total.
fn keep_links(outcome: &mut RunOutcome, links: Vec<Link>, wording: &Wording) {
    for link in &links {
        match link.name.as_str() {
            "stdout" => (outcome.truncated.stdout, outcome.stdout_total_bytes) = (true, link.total),
            "stderr" => (outcome.truncated.stderr, outcome.stderr_total_bytes) = (true, link.total),
            _ => {}
        }
    }
    outcome.notes.push(format!(
        "the {} is gone, so the inline output cannot be returned; what went past the inline caps is whole in the output store: read it through links",
        wording.sandbox
    ));
    outcome.links = links;
}

/// What a background run's record says of its times, for any process:
/// when it was submitted (its token's time) and whether it took a warm
/// sandbox. Its first output and answer are not stamped: a process that
/// re-reads the log would stamp its reading, not the run.
fn stored_times(stored: &Stored, times: &mut PhaseTimes) {
    times.submitted = parse_token(&stored.token).map(|token| token.submitted);
    times.warm = stored.warm;
}

/// Deletes every sandbox of a cancelled run. Failures are the backend's
/// to log: the run's own deadline stops it anyway.
fn stop_all(ctx: &Ctx, run_id: &str) {
    if let Err(error) = ctx.backend.stop(run_id, Stop::All) {
        log::warn("could not stop the run's sandboxes", &[("run_id", run_id.into()), ("error", error.to_string().into())]);
    }
}

/// The deadlines and judging facts of a run this process did not create,
/// counted from its creation (with `ATTACH_GRACE` to see the sandbox).
fn followed_from_stored(ctx: &Ctx, stored: &Stored) -> Followed {
    let age = stored.created_at.and_then(|created| SystemTime::now().duration_since(created).ok()).unwrap_or_default();
    let now = Instant::now();
    let since_creation = |after: Duration| (now + after.saturating_sub(age)).max(now + ATTACH_GRACE);
    Followed {
        timeout: stored.timeout.unwrap_or(stored.run_deadline),
        memory_limit: stored.memory_limit.clone(),
        start_deadline: since_creation(ctx.policy.start_timeout),
        unschedulable_grace: None,
        hard_deadline: since_creation(stored.run_deadline + run::HARD_DEADLINE_SLACK),
        output_on_demand: on_demand(ctx),
        owner: stored.owner.clone(),
    }
}

/// Whether a background run's output waits for someone to ask. Not with
/// an output store: a runner that holds what it sent whole in the sandbox
/// (`sandbox::held`) waits for this server to fetch it before its sandbox
/// ends, so a reader that waited for the end would find it gone.
fn on_demand(ctx: &Ctx) -> bool {
    ctx.policy.outputs.is_none()
}

fn listed_run(ctx: &Ctx, stored: &Stored) -> Option<Listed> {
    let token = stored.token.clone();
    let Token { run_id, .. } = parse_token(&token)?;
    let known = match ctx.jobs.lookup(&run_id) {
        Lookup::Found(view) if view.token == token => Some(view),
        _ => None,
    };
    let recorded = stored.verdict.as_ref();
    let phase = match &known {
        Some(view) => view.phase,
        None if stored.ended_at.is_some() || recorded.is_some() => Phase::Finished,
        None if stored.active => Phase::Running,
        None => Phase::Pending,
    };
    Some(Listed {
        token,
        created: stored.created_at,
        phase,
        result_status: known
            .as_ref()
            .and_then(|view| view.outcome.as_ref())
            .map(|outcome| outcome.status)
            .or(recorded.map(|recorded| recorded.status)),
        cancelled: stored.cancelled_at.is_some() || known.is_some_and(|view| view.cancel_requested),
        command: stored.command.clone(),
        expires_at: stored.expires_at.clone(),
    })
}

/// `image program`: the program's file name without its folder or its
/// arguments, at most `PROGRAM_NAME_CHARS` characters.
/// A background run's spans, under the call that submitted it (its
/// record's `traceparent`), when traces are sent.
fn send_spans(stored: Option<&Stored>, outcome: &RunOutcome) {
    let parent = stored.and_then(|stored| stored.traceparent.as_deref()).and_then(trace::parse_traceparent);
    let (Some(parent), Some(stored), true) = (parent, stored, trace::enabled()) else { return };
    // The record keeps `image program`.
    let image = stored.command.split(' ').next().unwrap_or_default();
    let facts = crate::engine::run::spans::RunFacts { image, network: None };
    crate::engine::run::spans::run_spans(parent, &facts, outcome).into_iter().for_each(trace::record);
}

fn command_summary(spec: &RunSpec) -> String {
    let program = spec.command.first().map(String::as_str).unwrap_or_default();
    let name = program.rsplit('/').next().unwrap_or(program);
    match name.char_indices().nth(PROGRAM_NAME_CHARS) {
        Some((cut, _)) => format!("{} {}…", spec.image, &name[..cut]),
        None => format!("{} {name}", spec.image),
    }
}

/// The error for a token whose Job is not in the cluster: expired if its
/// result could have outlived the retention by now, unknown otherwise.
fn gone(ctx: &Ctx, token: &str) -> Error {
    let result_ttl = ctx.jobs.limits().result_ttl;
    match parse_token(token) {
        Some(Token { submitted, .. }) if submitted + result_ttl <= SystemTime::now() => expired(ctx, token),
        _ => Error::Unknown { token: token.to_string() },
    }
}

fn expired(ctx: &Ctx, token: &str) -> Error {
    Error::Expired { token: token.to_string(), result_ttl_s: ctx.jobs.limits().result_ttl.as_secs() }
}

fn api(error: crate::engine::port::Error) -> Error {
    Error::Api { what: error.what, kind: error.kind, message: error.message }
}

// ---------------------------------------------------------------------------
// Background calls in open sandboxes (`submit_job`, and tasks, with
// `sandbox`): the call is taken and handed over as a waited-for call is
// (`engine::sandboxes`), its outcome kept in the jobs store under a
// token like a background run's.
//
// The sandbox is the record, not this process: the token names the
// sandbox (its public name) and the call's timeout, and the call's tag is
// derived from the sandbox's id and the run id (`sandboxes::call_tag`), so
// any process (this one restarted, another replica) that holds the token
// and may see the sandbox reads the call's frames from the sandbox's log,
// to its one result. That result lasts as long as the sandbox does (and
// as long as the jobs store keeps it here).

/// Takes the caller's sandbox for the call now (a busy or closed
/// sandbox is refused at once, as a waited-for call is) and runs the call
/// on a thread of its own. Returns once the sandbox is the call's.
pub fn submit_call(
    ctx: &Ctx,
    sandbox: &crate::engine::sandboxes::Named,
    spec: &RunSpec,
    kind: TokenKind,
    on_end: Option<OnEnd>,
) -> Result<Submitted, Error> {
    let run_id = run::new_run_id();
    let submitted = SystemTime::now();
    let taken = crate::engine::sandboxes::take(ctx, sandbox, spec, &run_id).map_err(|refused| refused_error(&run_id, refused))?;
    let in_sandbox = InSandbox { name: taken.name.clone(), timeout_s: spec.timeout.as_secs() };
    let token = call_token_for(kind, &run_id, submitted, &in_sandbox, ctx.site.as_deref());
    let cancel = CancelToken::new();
    if let Err(full) = ctx.jobs.insert_new(&run_id, &token, cancel.clone()) {
        crate::engine::sandboxes::give_back(ctx, &taken);
        return Err(Error::Full { running: full.running });
    }
    ctx.jobs.set_owner(&run_id, spec.owner.clone(), on_end);
    // Its output is read live all along: a first look has nothing to wait for.
    ctx.jobs.want_output(&run_id);
    let tag = crate::engine::sandboxes::rules::call_tag(&taken.seen.record.id, &run_id);
    let (thread_ctx, thread_spec, thread_run_id, thread_taken) = (ctx.clone(), spec.clone(), run_id.clone(), taken.clone());
    let spawned = supervise::spawn_named(supervise::Kind::BackgroundFollower, format!("job-{}", &run_id[..8]), move || {
        let taken = thread_taken;
        let (ctx, run_id) = (&thread_ctx, thread_run_id.as_str());
        let started = Instant::now();
        let ran = crate::engine::sandboxes::run_taken(ctx, &taken, &thread_spec, (run_id, tag, true), &cancel, &|progress| {
            call_progress(ctx, run_id, progress)
        });
        let outcome = crate::engine::sandboxes::finished(ctx, run_id, ran, (submitted, started));
        // The run's one `ended` line, from the server that ran it (a server
        // that reads the result after this one died writes none).
        audit::record(&audit::Entry {
            ended: Some(outcome.audited()),
            caller: thread_spec.owner.as_deref(),
            site: ctx.site.as_deref(),
            ..audit::Entry::new(audit::Event::Ended, run_id)
        });
        ctx.jobs.finish(run_id, outcome, SystemTime::now());
    });
    if let Err(error) = spawned {
        crate::engine::sandboxes::give_back(ctx, &taken);
        ctx.jobs.remove(&run_id);
        return Err(Error::Api {
            what: "start the call",
            kind: crate::engine::port::ErrorKind::Transient,
            message: format!("no thread for it: {error}"),
        });
    }
    Ok(Submitted { token, run_id })
}

/// Makes the jobs store know a call this process did not submit: its
/// sandbox is looked up by the token's name, and the call is followed
/// from the sandbox's log (on this thread when it is over already, so
/// the answer has its result; on a thread of its own while it runs).
fn attach_call(ctx: &Ctx, token: &Token, text: &str, reader: Option<&str>) -> Result<(), Error> {
    let Some(in_sandbox) = &token.sandbox else { return Err(Error::Unknown { token: text.to_string() }) };
    let Some(store) = ctx.backend.sandbox_store() else { return Err(Error::Unknown { token: text.to_string() }) };
    let seen = match store.look(&in_sandbox.name) {
        Ok(Some(seen)) => seen,
        Ok(None) => return Err(Error::SandboxClosed { token: text.to_string() }),
        Err(error) => return Err(api(error)),
    };
    if !visible_to(seen.record.owner.as_deref(), reader) {
        return Err(Error::Unknown { token: text.to_string() });
    }
    let cancel = CancelToken::new();
    if !ctx.jobs.insert_found(&token.run_id, text, token.submitted, cancel.clone()) {
        return Ok(());
    }
    ctx.jobs.set_owner(&token.run_id, seen.record.owner.clone(), None);
    ctx.jobs.want_output(&token.run_id);
    let running = seen.call.as_ref().is_some_and(|mark| mark.call_id == token.run_id);
    log::info(
        "re-attaching to a call in a sandbox",
        &[("run_id", token.run_id.as_str().into()), ("sandbox", in_sandbox.name.as_str().into())],
    );
    let follow = {
        let (ctx, run_id) = (ctx.clone(), token.run_id.clone());
        let since_ms = crate::time::unix_ms(token.submitted);
        let timeout = std::time::Duration::from_secs(in_sandbox.timeout_s);
        move || {
            let tag = crate::engine::sandboxes::rules::call_tag(&seen.record.id, &run_id);
            let outcome = crate::engine::sandboxes::follow(&ctx, &seen, (&run_id, tag, since_ms), timeout, &cancel, &|progress| {
                call_progress(&ctx, &run_id, progress)
            });
            ctx.jobs.finish(&run_id, outcome, SystemTime::now());
        }
    };
    if !running {
        follow();
        return Ok(());
    }
    ctx.jobs.set_phase(&token.run_id, Phase::Running);
    if let Err(error) = supervise::spawn_named(supervise::Kind::BackgroundFollower, format!("job-{}", &token.run_id[..8]), follow) {
        // Forgetting the entry lets the next fetch re-attach.
        log::error("call follower not started", &[("run_id", token.run_id.as_str().into()), ("error", error.to_string().into())]);
        ctx.jobs.remove(&token.run_id);
    }
    Ok(())
}

/// A call's progress, into the jobs store.
fn call_progress(ctx: &Ctx, run_id: &str, progress: Progress) {
    match progress {
        Progress::Started => ctx.jobs.set_phase(run_id, Phase::Running),
        Progress::Output(chunk) => ctx.jobs.push_output(run_id, chunk.stream, &chunk.bytes),
        Progress::Queued | Progress::Created { .. } => {}
    }
}

/// A refusal before the call exists, as the result a waited-for call gets.
fn refused_error(run_id: &str, refused: crate::engine::sandboxes::Refusal) -> Error {
    Error::Refused { outcome: Box::new(refused.outcome(run_id)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_nothing_else_parses() {
        let run_id = "0123456789abcdef0123456789abcdef";
        let submitted = UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        for (kind, written) in
            [(TokenKind::Job, format!("job-{run_id}-1767225600")), (TokenKind::Code, format!("code-{run_id}-1767225600"))]
        {
            let token = token_for(kind, run_id, submitted, None);
            assert_eq!(token, written);
            assert_eq!(parse_token(&token), Some(Token { kind, run_id: run_id.to_string(), submitted, site: None, sandbox: None }));
        }
        let on_site = token_for(TokenKind::Job, run_id, submitted, Some("eu-1"));
        assert_eq!(on_site, format!("job-{run_id}-1767225600.eu-1"), "a named site's runs carry it");
        let parsed = parse_token(&on_site).unwrap();
        assert_eq!((parsed.site.as_deref(), parsed.run_id.as_str()), (Some("eu-1"), run_id));
        for bad_site in ["", "EU", "a/b", "a.b", &"x".repeat(33)] {
            assert_eq!(parse_token(&format!("job-{run_id}-1767225600.{bad_site}")), None, "{bad_site}");
        }
        for bad in [
            "",
            "job-",
            &format!("job-{run_id}"),
            &format!("job-{run_id}-"),
            &format!("job-{run_id}-12a"),
            &format!("job-{}-1", run_id.to_uppercase()),
            &format!("job-{run_id}0-1"),
            &format!("job-../{}-1", &run_id[3..]),
            &format!("job-{run_id}-1234567890123"),
            &format!("code{run_id}-1"),
            &format!("Code-{run_id}-1"),
            &format!("job-code-{run_id}-1"),
        ] {
            assert_eq!(parse_token(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_sandbox_calls_token_names_its_sandbox_and_timeout_and_round_trips() {
        let run_id = "0123456789abcdef0123456789abcdef";
        let name = "fedcba9876543210fedcba9876543210";
        let submitted = UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        let in_sandbox = InSandbox { name: name.to_string(), timeout_s: 30 };
        for (site, written) in
            [(None, format!("code-{run_id}-1767225600-{name}-30")), (Some("eu-1"), format!("code-{run_id}-1767225600-{name}-30.eu-1"))]
        {
            let token = call_token_for(TokenKind::Code, run_id, submitted, &in_sandbox, site);
            assert_eq!(token, written);
            let parsed = parse_token(&token).unwrap();
            assert_eq!(parsed.sandbox.as_ref(), Some(&in_sandbox));
            assert_eq!(
                (parsed.kind, parsed.run_id.as_str(), parsed.submitted, parsed.site.as_deref()),
                (TokenKind::Code, run_id, submitted, site)
            );
        }
        for bad in [
            format!("job-{run_id}-1-{name}"),
            format!("job-{run_id}-1-{name}-"),
            format!("job-{run_id}-1-{name}-3x"),
            format!("job-{run_id}-1-{}-3", name.to_uppercase()),
            format!("job-{run_id}-1-{name}0-3"),
            format!("job-{run_id}-1-{name}-3-4"),
            format!("job-{run_id}-1-{name}-1234567890"),
            format!("job-{run_id}-1-{name}-030"),
            format!("job-{run_id}-01-{name}-30"),
        ] {
            assert_eq!(parse_token(&bad), None, "{bad}");
        }
    }

    /// The whole command sat in a Job annotation for
    /// the retention.
    #[test]
    fn the_command_annotation_keeps_the_program_name_only() {
        let spec = |command: &[&str]| RunSpec {
            owner: None,
            image: "python:3.12".into(),
            command: command.iter().map(|arg| arg.to_string()).collect(),
            files: Vec::new(),
            env: Default::default(),
            cpu_limit: None,
            memory_limit: None,
            timeout: Duration::from_secs(5),
            workdir: "/work".into(),
            artifacts: Vec::new(),
            clone: None,
            network: crate::network::NetworkMode::None,
        };
        assert_eq!(command_summary(&spec(&["python3", "-c", "TOKEN=secret"])), "python:3.12 python3");
        assert_eq!(command_summary(&spec(&["/usr/local/bin/tool", "--password=x"])), "python:3.12 tool");
        let long = "x".repeat(70);
        assert_eq!(command_summary(&spec(&[&long])), format!("python:3.12 {}…", "x".repeat(64)));
    }

    #[test]
    fn a_cancelled_run_keeps_a_real_ending_and_otherwise_becomes_cancelled() {
        let cases = [
            (RunStatus::Succeeded, RunStatus::Succeeded),
            (RunStatus::Failed, RunStatus::Failed),
            (RunStatus::Error, RunStatus::Cancelled),
            (RunStatus::TimedOut, RunStatus::Cancelled),
        ];
        for (before, after) in cases {
            let mut outcome = RunOutcome::without_result("r", before, RunReason::ResultLost, "m".into());
            assert_eq!(mark_cancelled(&mut outcome, &crate::engine::run::outcome::POD_WORDING), before != after, "{before:?}");
            assert_eq!(outcome.status, after, "{before:?}");
        }
    }
}
