//! The shells around `engine::sandboxes::rules`' rules: open a sandbox (within
//! MCP_K8S_MAX_SANDBOXES, ready before the answer), run one call in it
//! (take it by the backend's compare-and-set, hand the runner its call
//! with a tag chosen here, read the call's frames until its result, judge
//! them as a one-shot run's, give the sandbox back), close it, list them,
//! and reap those that are over.
//!
//! Knows no backend: everything goes through `SandboxStore` and the
//! port's `probe` (is the sandbox running, and if it ended, how).

pub mod rules;

use std::time::{Duration, Instant, SystemTime};

use crate::cancel::CancelToken;
use crate::engine::port::Output;
use crate::engine::port::facts::{Finished, SandboxState};
use crate::engine::port::sandbox_record::{CallMark, Record, Seen};
use crate::engine::port::spec::{RunOutcome, RunReason, RunSpec, RunStatus};
use crate::engine::port::{self, Delivered, ErrorKind, SandboxStore};
use crate::engine::run::collect::{Collector, LiveChunk};
use crate::engine::run::outcome::Judged;
use crate::engine::run::{Ctx, Progress};
use crate::engine::sandboxes::rules::{Over, Take};
use crate::log;
use crate::sandbox::frame::Tag;
use crate::sandbox::session;

/// Time a call may take past its command's timeout: the kill grace and
/// the artifacts' collection.
const CALL_SLACK: Duration = Duration::from_secs(10);
/// How long a call past its deadline is given to send what it has.
const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// How often a stop that has not ended the call yet is sent again.
const STOP_AGAIN: Duration = Duration::from_secs(2);
/// How often a call read from its sandbox's log is looked at, to know
/// whether it still runs.
const RUNNING_LOOK: Duration = Duration::from_secs(1);
/// How long the followed log of a call that no longer runs is read on,
/// before it is read whole (`read_followed`).
const LOG_AFTER_END: Duration = Duration::from_secs(1);
/// How often an opening sandbox is looked at until it runs.
const READY_POLL: Duration = Duration::from_millis(200);

/// A sandbox to open, as `tools` checked it.
pub struct Opening {
    /// The sandbox's shape: image, limits, network, workdir; no command.
    pub spec: RunSpec,
    pub language: Option<String>,
    pub idle_timeout: Duration,
    pub max_lifetime: Duration,
}

/// A refusal, with the reason a tool result carries.
#[derive(Debug)]
pub struct Refusal {
    pub reason: RunReason,
    pub message: String,
}

impl Refusal {
    /// The result of a call refused before it ran (`cancelled` for a
    /// cancel, an error otherwise).
    pub fn outcome(self, call_id: &str) -> RunOutcome {
        let status = if self.reason == RunReason::Cancelled { RunStatus::Cancelled } else { RunStatus::Error };
        RunOutcome::without_result(call_id, status, self.reason, self.message)
    }
}

fn refusal(reason: RunReason, message: impl Into<String>) -> Refusal {
    Refusal { reason, message: message.into() }
}

fn store(ctx: &Ctx) -> Result<&dyn SandboxStore, Refusal> {
    ctx.backend.sandbox_store().ok_or_else(|| refusal(RunReason::SandboxNotFound, "this server's backend keeps no open sandboxes"))
}

fn now_ms() -> u64 {
    crate::time::unix_ms(SystemTime::now())
}

/// Opens a sandbox and waits until its runner waits for calls.
pub fn open(ctx: &Ctx, opening: &Opening) -> Result<Seen, Refusal> {
    let store = store(ctx)?;
    let limits = ctx.policy.sandboxes;
    if limits.max_open == 0 {
        return Err(refusal(RunReason::SandboxLimit, "this server opens no sandboxes (MCP_K8S_MAX_SANDBOXES=0); use run_job"));
    }
    let opening_here = ctx.slots.sandbox_opening();
    let now = now_ms();
    let open_now = list_open(store, now)?.len();
    if open_now >= limits.max_open {
        return Err(refusal(
            RunReason::SandboxLimit,
            format!(
                "{open_now} sandboxes are open, the most this server allows (MCP_K8S_MAX_SANDBOXES); close one you no longer need (list_sandboxes shows yours)"
            ),
        ));
    }
    let id = rules::new_id();
    let name = rules::public_name(&id);
    let spec = &opening.spec;
    let record = Record {
        id,
        owner: spec.owner.clone(),
        image: spec.image.clone(),
        language: opening.language.clone(),
        network: spec.network.name().to_string(),
        cpu: spec.cpu_limit.as_ref().map(|quantity| quantity.as_str().to_string()),
        memory: spec.memory_limit.as_ref().map(|quantity| quantity.as_str().to_string()),
        workdir: spec.workdir.clone(),
        opened_at_ms: now,
        expires_at_ms: now + opening.max_lifetime.as_millis() as u64,
        idle_timeout_s: opening.idle_timeout.as_secs(),
    };
    store.open_sandbox(&name, spec, &record).map_err(|refused| refusal(refused.reason, refused.message))?;
    // Two opens at once (here or on another replica) both saw room: the
    // oldest `max_open` stay, the others go again.
    let mut open_now = list_open(store, now_ms()).unwrap_or_default();
    open_now.sort_by(|a, b| (a.record.opened_at_ms, &a.record.id).cmp(&(b.record.opened_at_ms, &b.record.id)));
    if open_now.iter().position(|seen| seen.record.id == record.id).is_some_and(|place| place >= limits.max_open) {
        store.close_sandbox(&name);
        return Err(refusal(
            RunReason::SandboxLimit,
            format!(
                "{} sandboxes are open, the most this server allows (MCP_K8S_MAX_SANDBOXES); close one you no longer need (list_sandboxes shows yours)",
                limits.max_open
            ),
        ));
    }
    drop(opening_here);
    match await_running(ctx, &name) {
        Ok(()) => {}
        Err(refused) => {
            store.close_sandbox(&name);
            return Err(refused);
        }
    }
    // Its idle time counts from now, when its runner waits for calls (its
    // own idle clock started a moment ago).
    let ready = now_ms();
    if let Err(error) = store.mark_used(&name, ready) {
        log::warn("a sandbox's ready time was not recorded", &[("sandbox", name.as_str().into()), ("error", error.to_string().into())]);
    }
    crate::metrics::sandbox_opened();
    log::info("sandbox opened", &[("sandbox", name.as_str().into()), ("image", record.image.as_str().into())]);
    Ok(Seen { last_used_ms: Some(ready), call: None, version: String::new(), alive: true, record })
}

/// Waits for the sandbox to run, within the start timeout; a sandbox that
/// cannot start says why.
fn await_running(ctx: &Ctx, name: &str) -> Result<(), Refusal> {
    let deadline = Instant::now() + ctx.policy.start_timeout;
    let mut last = String::from("it was not seen yet");
    while Instant::now() < deadline {
        if let Ok(Some(sighting)) = ctx.backend.probe(name) {
            match sighting.view.state {
                SandboxState::Running => return Ok(()),
                SandboxState::FailFast { reason, message } => return Err(refusal(reason, message)),
                SandboxState::Finished { .. } => return Err(refusal(RunReason::StartFailed, "the sandbox ended as it started")),
                SandboxState::Unschedulable { message } => last = message,
                SandboxState::Pending => last = ctx.backend.start_progress(name),
            }
        }
        std::thread::sleep(READY_POLL);
    }
    Err(refusal(RunReason::StartTimeout, format!("the sandbox did not start within {} s: {last}", ctx.policy.start_timeout.as_secs())))
}

/// The open sandboxes that are not over, every owner's.
fn list_open(store: &dyn SandboxStore, now: u64) -> Result<Vec<Seen>, Refusal> {
    let all =
        store.list_sandboxes().map_err(|error| refusal(RunReason::ApiError, format!("the sandboxes could not be listed: {error}")))?;
    Ok(all.into_iter().filter(|seen| rules::over(seen, now).is_none()).collect())
}

/// The caller's open sandboxes (every one without callers).
pub fn list(ctx: &Ctx, owner: Option<&str>) -> Result<Vec<Seen>, Refusal> {
    let store = store(ctx)?;
    let now = now_ms();
    let mut listed =
        store.list_sandboxes().map_err(|error| refusal(RunReason::ApiError, format!("the sandboxes could not be listed: {error}")))?;
    listed.retain(|seen| owner.is_none() || seen.record.owner.as_deref() == owner);
    listed.retain(|seen| !matches!(rules::over(seen, now), Some(Over::Ended)));
    listed.sort_by_key(|seen| seen.record.opened_at_ms);
    Ok(listed)
}

/// The sandbox `id` names, if it is the caller's: a wrong id, another
/// caller's sandbox and a closed one look the same.
fn find(store: &dyn SandboxStore, id: &str, owner: Option<&str>) -> Result<Seen, Refusal> {
    let not_found = || {
        refusal(
            RunReason::SandboxNotFound,
            "no open sandbox has this id (it was closed, it expired, or it is not yours); open_sandbox opens a new one",
        )
    };
    let id = rules::parse_id(id).ok_or_else(not_found)?;
    let seen = store
        .look(&rules::public_name(id))
        .map_err(|error| refusal(RunReason::ApiError, format!("the sandbox could not be read: {error}")))?
        .ok_or_else(not_found)?;
    let same_id = crate::sandbox::constant_time_eq(seen.record.id.as_bytes(), id.as_bytes());
    let owned = owner.is_none() || seen.record.owner.as_deref() == owner;
    if !same_id || !owned {
        return Err(not_found());
    }
    Ok(seen)
}

/// The caller's open sandbox `id` names.
pub fn find_yours(ctx: &Ctx, id: &str, owner: Option<&str>) -> Result<Seen, Refusal> {
    find(store(ctx)?, id, owner)
}

/// Closes the caller's sandbox: everything of it is deleted, a call that
/// runs in it included (that call ends `SandboxEnded`).
pub fn close(ctx: &Ctx, id: &str, owner: Option<&str>) -> Result<Seen, Refusal> {
    let store = store(ctx)?;
    let seen = find(store, id, owner)?;
    let name = rules::public_name(&seen.record.id);
    store.close_sandbox(&name);
    crate::metrics::sandbox_closed("closed");
    log::info("sandbox closed", &[("sandbox", name.as_str().into())]);
    Ok(seen)
}

/// Closes every sandbox that is over (idle, past its lifetime, ended);
/// returns how many.
pub fn reap(backend: &dyn crate::engine::port::Backend) -> usize {
    let Some(store) = backend.sandbox_store() else { return 0 };
    let Ok(all) = store.list_sandboxes() else { return 0 };
    let listed = all.len();
    let now = now_ms();
    let mut closed = 0;
    for seen in all {
        if let Some(over) = rules::over(&seen, now) {
            let name = rules::public_name(&seen.record.id);
            store.close_sandbox(&name);
            crate::metrics::sandbox_closed(over.label());
            log::info("sandbox reaped", &[("sandbox", name.as_str().into()), ("why", format!("{over:?}").into())]);
            closed += 1;
        }
    }
    // The store holds every replica's sandboxes, so this is the whole
    // deployment's count, the same on each replica; a gauge each process
    // kept for its own openings could not be, since any replica's reaper
    // closes any sandbox.
    crate::metrics::sandboxes_open(listed - closed);
    closed
}

/// An open sandbox a call names: its id, and how it was seen a moment
/// ago when the caller looked it up already (`find_yours`), which spares
/// the call a look (the take's compare-and-set still holds: a sandbox
/// that changed since is looked at again).
#[derive(Clone, Debug)]
pub struct Named {
    pub id: String,
    pub seen: Option<Seen>,
}

/// Runs `spec` in the caller's open sandbox `sandbox`: same result shape
/// as a one-shot run, with `run_id` the call's id.
pub fn call(
    ctx: &Ctx,
    sandbox: &Named,
    spec: &RunSpec,
    call_id: &str,
    cancel: &CancelToken,
    on_progress: &(dyn Fn(Progress) + Sync),
) -> RunOutcome {
    let started = Instant::now();
    let submitted = SystemTime::now();
    let ran = take(ctx, sandbox, spec, call_id).and_then(|taken| {
        let tag = Tag::random().map_err(|why| refusal(RunReason::ApiError, format!("cannot make the call's tag: {why}")))?;
        run_taken(ctx, &taken, spec, (call_id, tag, false), cancel, on_progress)
    });
    finished(ctx, call_id, ran, (submitted, started))
}

/// The call's outcome, a refusal included, with its times; logged.
pub fn finished(ctx: &Ctx, call_id: &str, ran: Result<RunOutcome, Refusal>, (submitted, started): (SystemTime, Instant)) -> RunOutcome {
    let mut outcome = ran.unwrap_or_else(|refused| refused.outcome(call_id));
    outcome.times.submitted = Some(submitted);
    outcome.times.answered = Some(SystemTime::now());
    outcome.times.warm = true;
    crate::engine::run::log_finished(ctx, call_id, &outcome, started);
    outcome
}

/// A sandbox taken for one call: nobody else's call runs in it until
/// `run_taken` (or `give_back`) ends the call's mark.
#[derive(Clone)]
pub struct Taken {
    pub seen: Seen,
    pub name: String,
    pub mark: CallMark,
    /// When the call must be over: its timeout and slack, from the mark.
    pub deadline: Instant,
}

/// Takes the caller's sandbox for the call `call_id` of `spec`.
pub fn take(ctx: &Ctx, sandbox: &Named, spec: &RunSpec, call_id: &str) -> Result<Taken, Refusal> {
    let store = store(ctx)?;
    let seen = match &sandbox.seen {
        Some(seen) => seen.clone(),
        None => find(store, &sandbox.id, spec.owner.as_deref())?,
    };
    let name = rules::public_name(&seen.record.id);
    if spec.image != seen.record.image {
        return Err(refusal(
            RunReason::SandboxNotFound,
            format!(
                // No argument named: run_job leaves `image` out, execute_code
                // has none and picks a language; the engine knows neither.
                "this sandbox runs image `{}`, not `{}`; call it with its own image, or open a sandbox of `{}`",
                crate::echo::shorten(&seen.record.image),
                crate::echo::shorten(&spec.image),
                crate::echo::shorten(&spec.image)
            ),
        ));
    }
    let budget = spec.timeout + CALL_SLACK;
    let (mark, deadline) = take_sandbox(store, &name, seen.clone(), call_id, budget)?;
    Ok(Taken { seen, name, mark, deadline })
}

/// Ends a taken sandbox's call mark without running anything.
pub fn give_back(ctx: &Ctx, taken: &Taken) {
    if let Ok(store) = store(ctx) {
        drop(Release { store, seen: &taken.seen, mark: &taken.mark });
    }
}

/// Runs the call in the sandbox taken for it, tagged `tag`, and gives the
/// sandbox back; `background`: a background call, which another process
/// may cancel.
pub fn run_taken(
    ctx: &Ctx,
    taken: &Taken,
    spec: &RunSpec,
    (call_id, tag, background): (&str, Tag, bool),
    cancel: &CancelToken,
    on_progress: &(dyn Fn(Progress) + Sync),
) -> Result<RunOutcome, Refusal> {
    let store = store(ctx)?;
    let Taken { seen, name, mark, deadline } = taken;
    let _release = Release { store, seen, mark };
    let mut call = crate::engine::pools::pool::assignment(call_id, spec, &ctx.policy);
    call.tag = Some(tag);
    on_progress(Progress::Created { what: format!("call in sandbox {}", &name[..8]) });
    let delivered = match store.deliver_call(name, &call, spec.timeout + CALL_SLACK) {
        Ok(delivered) => delivered,
        Err(why) if why.kind == ErrorKind::Busy => return Err(refusal(RunReason::SandboxBusy, busy_in_runner())),
        Err(why) => {
            let ended = ended_facts(ctx, name);
            let message = match &ended {
                Some(_) => "the sandbox had ended; open a new one".to_string(),
                None => format!("the call could not be handed to the sandbox: {}", why.message),
            };
            let reason = if ended.is_some() { RunReason::SandboxEnded } else { RunReason::ApiError };
            return Err(refusal(reason, message));
        }
    };
    on_progress(Progress::Started);
    let Delivered { output, cancel: cancel_call } = delivered;
    let reading = Reading { name, cancel_call: cancel_call.as_ref(), cancel, deadline: *deadline, running: None };
    let read = read_and_judge(ctx, &reading, (call_id, tag, mark.started_ms), (output, spec.owner.as_deref()), on_progress);
    let facts = CallFacts {
        call_id,
        timeout: spec.timeout,
        memory: seen.record.memory.as_deref(),
        cancel_requested: cancel.is_cancelled(),
        background,
    };
    Ok(judge_call(ctx, name, &facts, read))
}

/// A background call whose process is gone (or another's), followed from
/// the sandbox's log: its frames from `since_ms`, tagged `tag`, followed
/// while the sandbox's mark shows the call running (again after a stream
/// that ended early, its cancel sent again), then the log as it is, to
/// its end. A cancel here reaches the call through any process
/// (`SandboxStore::cancel_call`). The mark is cleared here only when its
/// server is gone: the result was read, or the mark is stale.
pub fn follow(
    ctx: &Ctx,
    seen: &Seen,
    (call_id, tag, since_ms): (&str, Tag, u64),
    timeout: Duration,
    cancel: &CancelToken,
    on_progress: &(dyn Fn(Progress) + Sync),
) -> RunOutcome {
    let started = Instant::now();
    let submitted = std::time::UNIX_EPOCH + Duration::from_millis(since_ms);
    let ran = store(ctx).map(|store| {
        let name = rules::public_name(&seen.record.id);
        let running = || still_running(store, &name, call_id);
        let cancel_call = || store.cancel_call(&name, tag);
        // A call that is not over yet holds its mark at most until its
        // deadline; past it, what the log has is all there is.
        let until_ms = seen.call.as_ref().filter(|mark| mark.call_id == call_id).map(|mark| mark.until_ms);
        let left = until_ms.map_or(timeout + CALL_SLACK, |until_ms| Duration::from_millis(until_ms.saturating_sub(now_ms())));
        let deadline = Instant::now() + left + CANCEL_WAIT;
        let reading = Reading { name: &name, cancel_call: &cancel_call, cancel, deadline, running: Some(&running) };
        let read = read_followed(ctx, store, &reading, (call_id, tag, since_ms), seen.record.owner.as_deref(), on_progress);
        let got_result = read.collector.result.is_some();
        let facts = CallFacts {
            call_id,
            timeout,
            memory: seen.record.memory.as_deref(),
            cancel_requested: cancel.is_cancelled(),
            background: true,
        };
        let outcome = judge_call(ctx, &name, &facts, read);
        if let Ok(Some(now)) = store.look(&name)
            && let Some(mark) = now.call.as_ref().filter(|mark| mark.call_id == call_id)
            && (got_result || rules::stale(mark, now_ms()))
        {
            drop(Release { store, seen: &now, mark });
        }
        outcome
    });
    finished(ctx, call_id, ran, (submitted, started))
}

/// How long a follower waits before it follows the log again after a
/// stream that ended while the call ran.
const FOLLOW_AGAIN: Duration = Duration::from_secs(1);

/// The frames of a call this process did not deliver: followed while it
/// runs (`reading.running`), then read whole once it does not.
fn read_followed(
    ctx: &Ctx,
    store: &dyn SandboxStore,
    reading: &Reading,
    (call_id, tag, since_ms): (&str, Tag, u64),
    owner: Option<&str>,
    on_progress: &(dyn Fn(Progress) + Sync),
) -> Read {
    let fresh = |spool| call_collector(ctx, tag, spool);
    let mut spool = new_spool(ctx, call_id, owner);
    let mut problems = Vec::new();
    // Each read starts at the call's start: what one passed on live, the
    // next does not pass on again.
    let relay = LiveRelay::new(on_progress);
    let relayed = |progress| relay.pass(progress);
    let running = reading.running.unwrap_or(&|| false);
    while running() && Instant::now() < reading.deadline {
        relay.restart();
        match store.call_log(reading.name, since_ms, true) {
            Ok(output) => {
                let mut read = read_call(reading, output, fresh(spool.take()), &relayed);
                if read.result.is_some() {
                    return Read { collector: read, finished: None };
                }
                spool = read.spool.take();
            }
            Err(why) => problems.push(format!("the sandbox's log could not be followed: {}", why.message)),
        }
        std::thread::sleep(FOLLOW_AGAIN);
    }
    // Over (or out of time): the log as it is holds every frame it wrote.
    let mut collector = fresh(spool.take());
    collector.problems = problems;
    relay.restart();
    match store.call_log(reading.name, since_ms, false) {
        Ok(Output { mut reader, abort: _ }) => {
            let mut on_live = |chunk: LiveChunk| relayed(Progress::Output(chunk));
            if let Err(error) = collector.read_all(&mut reader, &mut on_live)
                && collector.result.is_none()
            {
                collector.problems.push(format!("the sandbox's log could not be read to its end: {error}"));
            }
        }
        Err(why) => collector.problems.push(format!("the sandbox's log could not be read: {}", why.message)),
    }
    read_of(ctx, reading.name, collector)
}

/// Whether the call `call_id` still holds the sandbox (its mark is there
/// and not stale); `true` when the sandbox could not be read.
fn still_running(store: &dyn SandboxStore, name: &str, call_id: &str) -> bool {
    match store.look(name) {
        Ok(Some(seen)) => seen.alive && seen.call.as_ref().is_some_and(|mark| mark.call_id == call_id && !rules::stale(mark, now_ms())),
        Ok(None) => false,
        Err(_) => true,
    }
}

/// What judging a call needs besides its frames.
struct CallFacts<'a> {
    call_id: &'a str,
    timeout: Duration,
    memory: Option<&'a str>,
    cancel_requested: bool,
    /// A background call, which another process may cancel.
    background: bool,
}

/// A call's frames as read, and how its sandbox ended if it did.
struct Read {
    collector: Collector,
    finished: Option<Finished>,
}

/// Reads the call's frames from the stream that brought them; from the
/// sandbox's log too when that stream broke while the sandbox ran on.
fn read_and_judge(
    ctx: &Ctx,
    reading: &Reading,
    (call_id, tag, since_ms): (&str, Tag, u64),
    (delivered, owner): (Output, Option<&str>),
    on_progress: &(dyn Fn(Progress) + Sync),
) -> Read {
    let relay = LiveRelay::new(on_progress);
    let relayed = |progress| relay.pass(progress);
    let collector = read_call(reading, delivered, call_collector(ctx, tag, new_spool(ctx, call_id, owner)), &relayed);
    let read = read_of(ctx, reading.name, collector);
    let broke =
        read.collector.result.is_none() && read.finished.is_none() && !reading.cancel.is_cancelled() && Instant::now() < reading.deadline;
    match store(ctx) {
        // The stream broke while the sandbox runs on: the log keeps the
        // frames, tagged with this call's tag alone.
        Ok(store) if broke => {
            relay.restart();
            read_of(ctx, reading.name, reread_from_log(ctx, store, reading, (tag, since_ms), read.collector, &relayed))
        }
        _ => read,
    }
}

/// A collector of one call's frames (those tagged `tag`), writing to
/// `spool`.
fn call_collector(ctx: &Ctx, tag: Tag, spool: Option<crate::outputs::Spool>) -> Collector {
    let mut collector = Collector::for_call(ctx.policy.max_output_bytes, ctx.policy.max_artifact_bytes, tag);
    collector.spool = spool;
    collector
}

/// The call's place in the output store, when the server keeps one.
fn new_spool(ctx: &Ctx, call_id: &str, owner: Option<&str>) -> Option<crate::outputs::Spool> {
    ctx.policy.outputs.as_ref().map(|outputs| crate::outputs::Spool::new(outputs.clone(), call_id, owner))
}

/// What was read, with how the sandbox ended when no result came, or
/// when the result says a SIGTERM stopped the command: the runner of a
/// deleted or evicted pod reports the SIGTERM it got and nothing of who
/// sent it, which only the sandbox's own state tells (a deletion marks
/// the pod before its containers are stopped).
fn read_of(ctx: &Ctx, name: &str, collector: Collector) -> Read {
    let look = collector.result.as_ref().is_none_or(|result| result.terminated_by_request);
    let finished = if look { ended_facts(ctx, name) } else { None };
    Read { collector, finished }
}

/// The call's outcome from its frames, as a one-shot run's, with the
/// sandbox's own reasons.
fn judge_call(ctx: &Ctx, name: &str, facts: &CallFacts, read: Read) -> RunOutcome {
    let Read { collector, finished } = read;
    let runner_busy = collector.result.as_ref().and_then(|result| result.start_error.as_deref()) == Some(session::BUSY);
    let judged = Judged {
        run_id: facts.call_id,
        timeout: facts.timeout,
        memory_limit: facts.memory,
        finished: finished.as_ref(),
        cancel_requested: facts.cancel_requested,
        wording: ctx.backend.wording(),
    };
    let mut outcome = crate::engine::run::judge_collected(&judged, collector);
    if runner_busy {
        outcome.reason = Some(RunReason::SandboxBusy);
        outcome.message = busy_in_runner();
    }
    // A SIGTERM this process did not send is the sandbox's own end
    // (closed, its lifetime over, deleted or drained from outside), which
    // its runner passes on to the call; or, for a background call only,
    // another process's cancel, while the sandbox lives on and nothing is
    // ending it. Without a result, only a sandbox seen ended is.
    let terminated = outcome.reason == Some(RunReason::Terminated);
    if terminated && facts.background && ended_facts(ctx, name).is_none() && sandbox_lives(ctx, name) {
        outcome.status = RunStatus::Cancelled;
        outcome.reason = Some(RunReason::Cancelled);
        outcome.message =
            "the call was cancelled (cancel_job, from this server or another); the output so far is included; the sandbox stays open"
                .to_string();
    } else if outcome.reason == Some(RunReason::ResultLost) && finished.is_none() {
        // The sandbox lives on: it is the call's result that is missing.
        outcome.message = format!(
            "no result of this call reached this server, nor is one in the sandbox's log (the server that handed it over stopped before the call started, or its output was lost); the output read so far is included, and the sandbox stays open{}",
            if outcome.message.is_empty() { String::new() } else { format!(" ({})", outcome.message) }
        );
    } else if terminated
        || (finished.is_some() && outcome.status == RunStatus::Error)
        // Stopped from outside at its own deadline (its lifetime): the
        // sandbox's end, not the call's timeout.
        || finished.as_ref().is_some_and(|finished| finished.stopped.is_some())
    {
        outcome.reason = Some(RunReason::SandboxEnded);
        outcome.message = ended_message(finished.as_ref(), &outcome.message, ctx.backend.wording());
    }
    outcome
}

/// Why a call ended with its sandbox: a deletion seen (and nothing else
/// that stopped it, such as an eviction) says so, naming who may delete
/// a sandbox, rather than the one-shot run's words for a deleted sandbox
/// (whose own server never deletes it mid-run) or for a SIGTERM nobody
/// was seen sending.
fn ended_message(finished: Option<&Finished>, said: &str, wording: &crate::engine::port::facts::Wording) -> String {
    if finished.is_some_and(|finished| finished.deleted && finished.disruption.is_none() && finished.stopped.is_none()) {
        return format!(
            "the sandbox's {} was deleted while the call ran (close_sandbox, its idle timeout or lifetime, or something outside this server: {}), and the call's command was stopped with it; the output so far is included; the sandbox is gone with its files: open a new one",
            wording.sandbox, wording.outside_deleters
        );
    }
    format!(
        "the sandbox ended while the call ran ({}); it is gone with its files: open a new one",
        if said.is_empty() { "no result arrived" } else { said }
    )
}

/// The sandbox still runs, and neither its lifetime nor its idle time is
/// over.
fn sandbox_lives(ctx: &Ctx, name: &str) -> bool {
    let Ok(store) = store(ctx) else { return false };
    matches!(store.look(name), Ok(Some(seen)) if seen.alive && rules::over(&seen, now_ms()).is_none())
}

/// How many times a take is tried again when the record changed under it
/// without anyone taking the sandbox (on Kubernetes, the Job controller's
/// status updates change the `resourceVersion` too).
const TAKE_ATTEMPTS: usize = 4;

/// Takes the sandbox for the call: its mark, and the call's deadline, from
/// the same moment as the mark's.
fn take_sandbox(
    store: &dyn SandboxStore,
    name: &str,
    mut seen: Seen,
    call_id: &str,
    budget: Duration,
) -> Result<(CallMark, Instant), Refusal> {
    for _ in 0..TAKE_ATTEMPTS {
        let now = now_ms();
        let marked_at = Instant::now();
        match rules::take(&seen, now) {
            Take::Free => {}
            Take::Busy { started_ms, until_ms } => return Err(busy(now, started_ms, until_ms)),
            Take::Over(over) => return Err(refusal(RunReason::SandboxNotFound, format!("the sandbox is closed: {}", over.explain()))),
        }
        rules::fits(&seen.record, now, budget).map_err(|why| refusal(RunReason::SandboxExpiring, why))?;
        let mark = CallMark { call_id: call_id.to_string(), started_ms: now, until_ms: now + budget.as_millis() as u64 };
        match store.begin_call(&seen, &mark) {
            Ok(true) => return Ok((mark, marked_at + budget)),
            Ok(false) => {}
            Err(error) => return Err(refusal(RunReason::ApiError, format!("the sandbox could not be taken: {error}"))),
        }
        // Someone changed the record: look again, and take it if it is free.
        seen = match store.look(name) {
            Ok(Some(seen)) => seen,
            Ok(None) => return Err(refusal(RunReason::SandboxNotFound, "the sandbox was closed; open_sandbox opens a new one")),
            Err(error) => return Err(refusal(RunReason::ApiError, format!("the sandbox could not be read: {error}"))),
        };
    }
    let now = now_ms();
    Err(busy(now, now, now))
}

fn busy_in_runner() -> String {
    "another call still runs in this sandbox (its server gave up on it or died); a sandbox runs one call at a time: wait a moment and call again"
        .to_string()
}

/// The call's frames read again from the sandbox's log, from the call's
/// start; what the broken stream had read stays if this one gets less
/// far (`reread_got_as_far`).
fn reread_from_log(
    ctx: &Ctx,
    store: &dyn SandboxStore,
    reading: &Reading,
    (tag, since_ms): (Tag, u64),
    mut broken: Collector,
    on_progress: &(dyn Fn(Progress) + Sync),
) -> Collector {
    let output = match store.call_log(reading.name, since_ms, true) {
        Ok(output) => output,
        Err(why) => {
            broken.problems.push(format!("the call's output could not be read again from the sandbox's log: {}", why.message));
            return broken;
        }
    };
    // The same bytes land at the same offsets of the output store.
    let mut fresh = call_collector(ctx, tag, broken.spool.take());
    fresh.problems.extend(broken.problems.iter().cloned());
    fresh.problems.push("the call's output stream broke; its output was read again from the sandbox's log".to_string());
    let mut read = read_call(reading, output, fresh, on_progress);
    if reread_got_as_far(&broken, &read) {
        return read;
    }
    broken.spool = read.spool.take();
    broken
}

/// Whether the log, read again, got at least as far as the broken stream:
/// it has the result, or as much live output. The log holds the call from
/// its start, so it usually does; a stream that broke before the command
/// wrote anything, then a sandbox deleted while the log was read, leaves
/// the output only the log brought.
fn reread_got_as_far(broken: &Collector, reread: &Collector) -> bool {
    let live = |collector: &Collector| collector.live_stdout.len() + collector.live_stderr.len();
    reread.result.is_some() || (broken.result.is_none() && live(reread) >= live(broken))
}

fn busy(now: u64, started_ms: u64, until_ms: u64) -> Refusal {
    refusal(
        RunReason::SandboxBusy,
        format!(
            "another call has run in this sandbox for {} s (it may run {} s more); a sandbox runs one call at a time: wait for it, cancel it, or use another sandbox",
            now.saturating_sub(started_ms) / 1000,
            until_ms.saturating_sub(now) / 1000
        ),
    )
}

/// How the sandbox ended, if it did (or is gone).
fn ended_facts(ctx: &Ctx, name: &str) -> Option<Finished> {
    match ctx.backend.probe(name) {
        Ok(Some(sighting)) => match sighting.view.state {
            SandboxState::Finished { .. } | SandboxState::FailFast { .. } => Some(sighting.view.ended.unwrap_or(sighting.view.if_gone)),
            _ => sighting.view.ended,
        },
        Ok(None) => Some(Finished { deleted: true, ..Finished::default() }),
        Err(_) => None,
    }
}

/// What reading a call's frames needs besides the stream.
struct Reading<'a> {
    name: &'a str,
    /// Asks the runner to stop the call.
    cancel_call: &'a (dyn Fn() -> Result<(), port::Error> + Send + Sync),
    cancel: &'a CancelToken,
    deadline: Instant,
    /// Whether the call still runs, for a reader that did not deliver it:
    /// once it does not, the log is read a moment more and no longer.
    running: Option<&'a (dyn Fn() -> bool + Sync)>,
}

/// Reads the call's frames until its result, the end of the stream, the
/// deadline, or a cancel. A cancel, and the deadline, ask the runner to
/// stop the call, and wait a moment for what it sends: the sandbox is
/// given back only with nothing of the call running.
fn read_call(reading: &Reading, output: Output, mut collector: Collector, on_progress: &(dyn Fn(Progress) + Sync)) -> Collector {
    let Output { mut reader, abort } = output;
    std::thread::scope(|scope| {
        let read = scope.spawn(move || {
            let mut on_live = |chunk: LiveChunk| on_progress(Progress::Output(chunk));
            if let Err(error) = collector.read_all(&mut reader, &mut on_live)
                && collector.result.is_none()
            {
                collector.problems.push(format!("the call's output stream broke: {error}"));
            }
            collector
        });
        // When the stop was first sent, and last.
        let mut stop_sent: Option<(Instant, Instant)> = None;
        let mut looked = Instant::now();
        let mut over_since: Option<Instant> = None;
        let send_stop = || {
            if let Err(why) = (reading.cancel_call)() {
                log::warn(
                    "a call's stop did not reach its sandbox",
                    &[("sandbox", reading.name.into()), ("error", why.to_string().into())],
                );
            }
        };
        while !read.is_finished() {
            let now = Instant::now();
            let stop = stop_sent.map(|(first, last)| stopping(now, (first, last), reading.deadline));
            if stop == Some(Stopping::GiveUp) || over_since.is_some_and(|over| now >= over + LOG_AFTER_END) {
                abort.abort();
                break;
            }
            if let (Some(Stopping::SendAgain), Some((first, _))) = (stop, stop_sent) {
                send_stop();
                stop_sent = Some((first, now));
            }
            if let Some(running) = reading.running
                && over_since.is_none()
                && now >= looked + RUNNING_LOOK
            {
                looked = now;
                if !running() {
                    over_since = Some(now);
                }
            }
            if (reading.cancel.is_cancelled() || now >= reading.deadline) && stop_sent.is_none() {
                send_stop();
                stop_sent = Some((now, now));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        read.join().unwrap_or_else(|_| Collector::new(0, 0))
    })
}

/// What the reader of a call it asked to stop does now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stopping {
    /// Waits for the runner's result.
    Wait,
    /// Asks the runner again: the last ask may not have reached it.
    SendAgain,
    /// Stops reading: the call is judged on what came.
    GiveUp,
}

/// Once the call was asked to stop (`first`, asked last at `last`), its
/// reader waits for the result until the later of the call's `deadline`
/// and `CANCEL_WAIT` past the first ask, asking again every `STOP_AGAIN`.
/// The call keeps the sandbox meanwhile: its command may still run. An
/// earlier version stopped reading `CANCEL_WAIT` after a cancel, judged
/// the call `cancelled` and gave the sandbox back, while a command whose
/// runner never got the cancel (one that had forked up to the sandbox's
/// process limit) ran on to its timeout and refused the next calls.
fn stopping(now: Instant, (first, last): (Instant, Instant), deadline: Instant) -> Stopping {
    if now >= deadline.max(first + CANCEL_WAIT) {
        Stopping::GiveUp
    } else if now >= last + STOP_AGAIN {
        Stopping::SendAgain
    } else {
        Stopping::Wait
    }
}

/// Gives the sandbox back when the call is over, whatever happened.
struct Release<'a> {
    store: &'a dyn SandboxStore,
    seen: &'a Seen,
    mark: &'a CallMark,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        if let Err(error) = self.store.end_call(self.seen, self.mark, now_ms()) {
            log::warn(
                "a call's mark was not cleared; the sandbox is busy until the mark is stale",
                &[("sandbox", rules::public_name(&self.seen.record.id).into()), ("error", error.to_string().into())],
            );
        }
    }
}

/// Live output across several reads of one call's frames, each from the
/// call's start (a delivered stream that broke, then the log; a log
/// followed again after it ended early): each byte goes on once, with
/// the first read that reaches it. Other progress goes on as it comes.
struct LiveRelay<'a> {
    on_progress: &'a (dyn Fn(Progress) + Sync),
    /// Per stream (stdout, stderr): bytes passed on, and bytes the
    /// current read has reached.
    counts: std::sync::Mutex<[(usize, usize); 2]>,
}

impl<'a> LiveRelay<'a> {
    fn new(on_progress: &'a (dyn Fn(Progress) + Sync)) -> Self {
        LiveRelay { on_progress, counts: std::sync::Mutex::new([(0, 0); 2]) }
    }

    /// A new read, from the call's start.
    fn restart(&self) {
        let mut counts = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, reached) in counts.iter_mut() {
            *reached = 0;
        }
    }

    fn pass(&self, progress: Progress) {
        let Progress::Output(LiveChunk { stream, bytes }) = progress else {
            return (self.on_progress)(progress);
        };
        let new = {
            let mut counts = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let (passed, reached) = &mut counts[stream.index()];
            let new = unseen(*passed, *reached, bytes.len());
            *reached += bytes.len();
            *passed = (*passed).max(*reached);
            new
        };
        if !new.is_empty() {
            (self.on_progress)(Progress::Output(LiveChunk { stream, bytes: bytes[new].to_vec() }));
        }
    }
}

/// The part of a chunk of `len` bytes at offset `at` of its stream that
/// lies past the first `passed` bytes, as a range of the chunk.
fn unseen(passed: usize, at: usize, len: usize) -> std::ops::Range<usize> {
    passed.saturating_sub(at).min(len)..len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::frame::Stream;

    #[test]
    fn the_log_read_again_is_kept_when_it_got_as_far_as_the_broken_stream() {
        let collector = |stdout: &str, result: bool| {
            let mut collector = Collector::new(1 << 20, 1 << 20);
            collector.live_stdout = stdout.as_bytes().to_vec();
            collector.result = result.then(|| crate::sandbox::frame::RunResult::started(1));
            collector
        };
        // (the broken stream's, the log's) → the log's is kept
        let cases = [
            // The stream broke before any output; the log brought it, then
            // the sandbox was deleted: the log's output stays.
            (collector("", false), collector("started\n", false), true),
            (collector("started\n", false), collector("started\nmore\n", false), true),
            (collector("started\n", false), collector("started\n", false), true),
            (collector("started\nmore\n", false), collector("started\n", false), false),
            (collector("started\nmore\n", false), collector("", true), true),
        ];
        for (broken, reread, kept) in cases {
            assert_eq!(reread_got_as_far(&broken, &reread), kept, "{:?} then {:?}", broken.live_stdout, reread.live_stdout);
        }
    }

    #[test]
    fn a_call_ended_by_a_deletion_says_the_sandbox_was_deleted() {
        let wording = crate::engine::run::outcome::POD_WORDING;
        let deleted = Finished { deleted: true, signal: Some(15), ..Finished::default() };
        let evicted = Finished { disruption: Some("EvictionByEvictionAPI: evicted".into()), ..deleted.clone() };
        let said = "the pod was evicted: EvictionByEvictionAPI";
        // (facts, what the judge said) → the message starts with
        let cases = [
            (Some(&deleted), "", "the sandbox's pod was deleted while the call ran (close_sandbox"),
            (Some(&evicted), said, "the sandbox ended while the call ran (the pod was evicted"),
            (None, "", "the sandbox ended while the call ran (no result arrived)"),
        ];
        for (finished, said, want) in cases {
            let message = ended_message(finished, said, &wording);
            assert!(message.starts_with(want), "{finished:?}: {message}");
        }
    }

    #[test]
    fn a_stopped_call_is_waited_for_until_its_deadline_and_asked_again() {
        let base = Instant::now();
        let at = |s: u64| base + Duration::from_secs(s);
        // (now, first ask, last ask, deadline) → what the reader does
        let cases = [
            ((1, 0, 0, 600), Stopping::Wait),
            ((2, 0, 0, 600), Stopping::SendAgain),
            ((3, 0, 2, 600), Stopping::Wait),
            // A cancel long before the deadline: still waited for, asked again.
            ((30, 0, 28, 600), Stopping::SendAgain),
            ((599, 0, 598, 600), Stopping::Wait),
            ((600, 0, 598, 600), Stopping::GiveUp),
            // Stopped at its deadline: CANCEL_WAIT to send what it has.
            ((605, 600, 604, 600), Stopping::Wait),
            ((610, 600, 608, 600), Stopping::GiveUp),
        ];
        for ((now, first, last, deadline), want) in cases {
            assert_eq!(
                stopping(at(now), (at(first), at(last)), at(deadline)),
                want,
                "now {now}, asked {first}/{last}, deadline {deadline}"
            );
        }
    }

    #[test]
    fn a_chunk_goes_on_only_past_what_was_passed_on() {
        // (passed, at, len) → the chunk's range that goes on
        let cases = [((0, 0, 5), 0..5), ((5, 5, 3), 0..3), ((5, 0, 3), 3..3), ((5, 3, 4), 2..4), ((5, 5, 0), 0..0), ((9, 0, 4), 4..4)];
        for ((passed, at, len), want) in cases {
            assert_eq!(unseen(passed, at, len), want, "passed {passed}, at {at}, len {len}");
        }
    }

    #[test]
    fn a_read_again_from_the_start_passes_on_only_what_is_new() {
        let got = std::sync::Mutex::new(Vec::new());
        let record = |progress: Progress| {
            if let Progress::Output(chunk) = progress {
                got.lock().unwrap().push((chunk.stream, String::from_utf8(chunk.bytes).unwrap()));
            }
        };
        let relay = LiveRelay::new(&record);
        let chunk = |stream, text: &str| Progress::Output(LiveChunk { stream, bytes: text.as_bytes().to_vec() });
        relay.pass(chunk(Stream::Stdout, "started\n"));
        relay.pass(chunk(Stream::Stderr, "warn"));
        relay.restart();
        relay.pass(chunk(Stream::Stdout, "start"));
        relay.pass(chunk(Stream::Stdout, "ed\nfinished\n"));
        relay.pass(chunk(Stream::Stderr, "warning\n"));
        relay.restart();
        relay.pass(chunk(Stream::Stdout, "started\nfinished\n"));
        let got = got.into_inner().unwrap();
        let want = [(Stream::Stdout, "started\n"), (Stream::Stderr, "warn"), (Stream::Stdout, "finished\n"), (Stream::Stderr, "ing\n")];
        assert_eq!(got, want.map(|(stream, text)| (stream, text.to_string())));
    }
}
