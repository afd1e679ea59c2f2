//! The shells around `engine::sandboxes`' rules: open a sandbox (within
//! MCP_K8S_MAX_SANDBOXES, ready before the answer), run one call in it
//! (take it by the backend's compare-and-set, hand the runner its call
//! with a tag chosen here, read the call's frames until its result, judge
//! them as a one-shot run's, give the sandbox back), close it, list them,
//! and reap those that are over.
//!
//! Knows no backend: everything goes through `SandboxStore` and the
//! port's `probe` (is the sandbox running, and if it ended, how).

use std::time::{Duration, Instant, SystemTime};

use crate::cancel::CancelToken;
use crate::engine::backend::Output;
use crate::engine::backend::{Delivered, SandboxStore};
use crate::engine::collect::{Collector, LiveChunk};
use crate::engine::facts::{Finished, SandboxState};
use crate::engine::outcome::Judged;
use crate::engine::run::{Ctx, Progress};
use crate::engine::sandboxes::{self, CallMark, Over, Record, Seen, Take};
use crate::engine::spec::{RunOutcome, RunReason, RunSpec, RunStatus};
use crate::log;
use crate::sandbox::frame::Tag;
use crate::sandbox::session;

/// Time a call may take past its command's timeout: the kill grace and
/// the artifacts' collection.
const CALL_SLACK: Duration = Duration::from_secs(10);
/// How long a cancelled call's runner is given to send what it has.
const CANCEL_WAIT: Duration = Duration::from_secs(10);
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
    let id = sandboxes::new_id();
    let name = sandboxes::public_name(&id);
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
    Ok(all.into_iter().filter(|seen| sandboxes::over(seen, now).is_none()).collect())
}

/// The caller's open sandboxes (every one without callers).
pub fn list(ctx: &Ctx, owner: Option<&str>) -> Result<Vec<Seen>, Refusal> {
    let store = store(ctx)?;
    let now = now_ms();
    let mut listed =
        store.list_sandboxes().map_err(|error| refusal(RunReason::ApiError, format!("the sandboxes could not be listed: {error}")))?;
    listed.retain(|seen| owner.is_none() || seen.record.owner.as_deref() == owner);
    listed.retain(|seen| !matches!(sandboxes::over(seen, now), Some(Over::Ended)));
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
    let id = sandboxes::parse_id(id).ok_or_else(not_found)?;
    let seen = store
        .look(&sandboxes::public_name(id))
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
    let name = sandboxes::public_name(&seen.record.id);
    store.close_sandbox(&name);
    log::info("sandbox closed", &[("sandbox", name.as_str().into())]);
    Ok(seen)
}

/// Closes every sandbox that is over (idle, past its lifetime, ended);
/// returns how many.
pub fn reap(backend: &dyn crate::engine::backend::Backend) -> usize {
    let Some(store) = backend.sandbox_store() else { return 0 };
    let Ok(all) = store.list_sandboxes() else { return 0 };
    let now = now_ms();
    let mut closed = 0;
    for seen in all {
        if let Some(over) = sandboxes::over(&seen, now) {
            let name = sandboxes::public_name(&seen.record.id);
            store.close_sandbox(&name);
            log::info("sandbox reaped", &[("sandbox", name.as_str().into()), ("why", format!("{over:?}").into())]);
            closed += 1;
        }
    }
    closed
}

/// Runs `spec` in the caller's open sandbox `id`: same result shape as a
/// one-shot run, with `run_id` the call's id.
pub fn call(
    ctx: &Ctx,
    id: &str,
    spec: &RunSpec,
    call_id: &str,
    cancel: &CancelToken,
    on_progress: &(dyn Fn(Progress) + Sync),
) -> RunOutcome {
    let started = Instant::now();
    let submitted = SystemTime::now();
    let mut outcome = match take_and_run(ctx, id, spec, call_id, cancel, on_progress) {
        Ok(outcome) => outcome,
        Err(refused) => {
            let status = if refused.reason == RunReason::Cancelled { RunStatus::Cancelled } else { RunStatus::Error };
            RunOutcome::without_result(call_id, status, refused.reason, refused.message)
        }
    };
    outcome.times.submitted = Some(submitted);
    outcome.times.answered = Some(SystemTime::now());
    outcome.times.warm = true;
    crate::engine::run::log_finished(ctx, call_id, &outcome, started);
    outcome
}

fn take_and_run(
    ctx: &Ctx,
    id: &str,
    spec: &RunSpec,
    call_id: &str,
    cancel: &CancelToken,
    on_progress: &(dyn Fn(Progress) + Sync),
) -> Result<RunOutcome, Refusal> {
    let store = store(ctx)?;
    let seen = find(store, id, spec.owner.as_deref())?;
    let name = sandboxes::public_name(&seen.record.id);
    if spec.image != seen.record.image {
        return Err(refusal(
            RunReason::SandboxNotFound,
            format!(
                "this sandbox runs image `{}`, not `{}`; leave `image` out, or open a sandbox of that image",
                crate::echo::shorten(&seen.record.image),
                crate::echo::shorten(&spec.image)
            ),
        ));
    }
    let budget = spec.timeout + CALL_SLACK;
    let (mark, deadline) = take_sandbox(store, &name, seen.clone(), call_id, budget)?;
    let _release = Release { store, name: &name, mark: &mark };
    let tag = Tag::random().map_err(|why| refusal(RunReason::ApiError, format!("cannot make the call's tag: {why}")))?;
    let mut call = crate::engine::pool::assignment(call_id, spec, &ctx.policy);
    call.tag = Some(tag);
    on_progress(Progress::Created { what: format!("call in sandbox {}", &name[..8]) });
    let delivered = match store.deliver_call(&name, &call, budget) {
        Ok(delivered) => delivered,
        Err(why) if why == session::BUSY => return Err(refusal(RunReason::SandboxBusy, busy_in_runner())),
        Err(why) => {
            let ended = ended_facts(ctx, &name);
            let message = match &ended {
                Some(_) => "the sandbox had ended; open a new one".to_string(),
                None => format!("the call could not be handed to the sandbox: {why}"),
            };
            let reason = if ended.is_some() { RunReason::SandboxEnded } else { RunReason::ApiError };
            return Err(refusal(reason, message));
        }
    };
    on_progress(Progress::Started);
    let mut collector = Collector::for_call(ctx.policy.max_output_bytes, ctx.policy.max_artifact_bytes, tag);
    collector.spool =
        ctx.policy.outputs.as_ref().map(|store| crate::engine::outputs::Spool::new(store.clone(), call_id, spec.owner.as_deref()));
    let Delivered { output, cancel: cancel_call } = delivered;
    let reading = Reading { name: &name, cancel_call: cancel_call.as_ref(), cancel, deadline };
    let mut collector = read_call(&reading, output, collector, on_progress);
    let mut finished = if collector.result.is_none() { ended_facts(ctx, &name) } else { None };
    if collector.result.is_none() && finished.is_none() && !cancel.is_cancelled() && Instant::now() < deadline {
        // The stream that brought the frames broke while the sandbox runs
        // on: the log keeps them, tagged with this call's tag alone.
        collector = reread_from_log(ctx, store, &reading, tag, mark.started_ms, collector);
        finished = if collector.result.is_none() { ended_facts(ctx, &name) } else { None };
    }
    let runner_busy = collector.result.as_ref().and_then(|result| result.start_error.as_deref()) == Some(session::BUSY);
    let judged = Judged {
        run_id: call_id,
        timeout: spec.timeout,
        memory_limit: seen.record.memory.as_deref(),
        finished: finished.as_ref(),
        cancel_requested: cancel.is_cancelled(),
        wording: ctx.backend.wording(),
    };
    let mut outcome = crate::engine::run::judge_collected(&judged, collector);
    if runner_busy {
        outcome.reason = Some(RunReason::SandboxBusy);
        outcome.message = busy_in_runner();
    }
    // A SIGTERM this server did not send is the sandbox's own end (closed,
    // its lifetime over, deleted from outside): its runner passes it on to
    // the call. Without a result, only a sandbox seen ended is.
    let sandbox_stopped = outcome.reason == Some(RunReason::Terminated);
    if sandbox_stopped || (finished.is_some() && outcome.status == RunStatus::Error) {
        outcome.reason = Some(RunReason::SandboxEnded);
        outcome.message = format!(
            "the sandbox ended while the call ran ({}); it is gone with its files: open a new one",
            if outcome.message.is_empty() { "no result arrived" } else { outcome.message.as_str() }
        );
    }
    Ok(outcome)
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
        match sandboxes::take(&seen, now) {
            Take::Free => {}
            Take::Busy { started_ms, until_ms } => return Err(busy(now, started_ms, until_ms)),
            Take::Over(over) => return Err(refusal(RunReason::SandboxNotFound, format!("the sandbox is closed: {}", over.explain()))),
        }
        sandboxes::fits(&seen.record, now, budget).map_err(|why| refusal(RunReason::SandboxExpiring, why))?;
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
/// start; what the broken stream had read stays if this one gets no
/// further.
fn reread_from_log(ctx: &Ctx, store: &dyn SandboxStore, reading: &Reading, tag: Tag, since_ms: u64, mut broken: Collector) -> Collector {
    let output = match store.call_log(reading.name, since_ms) {
        Ok(output) => output,
        Err(why) => {
            broken.problems.push(format!("the call's output could not be read again from the sandbox's log: {why}"));
            return broken;
        }
    };
    let mut fresh = Collector::for_call(ctx.policy.max_output_bytes, ctx.policy.max_artifact_bytes, tag);
    fresh.problems.extend(broken.problems.iter().cloned());
    fresh.problems.push("the call's output stream broke; its output was read again from the sandbox's log".to_string());
    // The same bytes land at the same offsets of the output store.
    fresh.spool = broken.spool.take();
    let mut read = read_call(reading, output, fresh, &|_| {});
    if read.result.is_some() {
        return read;
    }
    broken.spool = read.spool.take();
    broken
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
    cancel_call: &'a (dyn Fn() -> Result<(), String> + Send + Sync),
    cancel: &'a CancelToken,
    deadline: Instant,
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
        let mut stop_sent: Option<Instant> = None;
        while !read.is_finished() {
            let now = Instant::now();
            if stop_sent.is_some_and(|sent| now >= sent + CANCEL_WAIT) {
                abort.abort();
                break;
            }
            if (reading.cancel.is_cancelled() || now >= reading.deadline) && stop_sent.is_none() {
                if let Err(why) = (reading.cancel_call)() {
                    log::warn("a call's stop did not reach its sandbox", &[("sandbox", reading.name.into()), ("error", why.into())]);
                }
                stop_sent = Some(now);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        read.join().unwrap_or_else(|_| Collector::new(0, 0))
    })
}

/// Gives the sandbox back when the call is over, whatever happened.
struct Release<'a> {
    store: &'a dyn SandboxStore,
    name: &'a str,
    mark: &'a CallMark,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        if let Err(error) = self.store.end_call(self.name, self.mark, now_ms()) {
            log::warn(
                "a call's mark was not cleared; the sandbox is busy until the mark is stale",
                &[("sandbox", self.name.into()), ("error", error.to_string().into())],
            );
        }
    }
}
