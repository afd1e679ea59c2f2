//! One run, start to finish: take a slot, create the sandbox through the
//! backend, follow it (its watch and the runner's output), let the
//! decision (`decide`) say when and how it ended, judge the outcome, and
//! remove everything it created, whatever happened.
//!
//! Threads are scoped to the run: the backend's watch thread reports the
//! sandbox, one thread reads the output (a background run's only once
//! someone asks for it, or at its end); the run's own thread feeds both
//! to the state machine and does what its steps ask. The output reader
//! says on the watch's stream when it ends, so the runner's result is
//! acted on at once, not at the next look. Cancellation (an MCP cancel,
//! a shutdown) ends the run at once with what was read so far.
//!
//! Knows no backend: everything about the sandbox goes through
//! `engine::port::Backend`.

pub mod collect;
pub mod decide;
pub mod outcome;
pub mod slots;
pub mod spans;
pub mod verdict;

use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime};

use crate::cancel::CancelToken;
use crate::engine::port::facts::{DecidedBy, Finished, Wording};
use crate::engine::port::jobs::Lookup;
use crate::engine::port::spec::{Policy, RunOutcome, RunReason, RunSpec, RunStatus, run_deadline};
use crate::engine::port::{Abort, Backend, Created, Keep, NewRun, OutputError, Sighting, Watch, Watched};
use crate::engine::run::collect::{Collector, LiveChunk};
use crate::engine::run::decide::{Away, Deadlines, Event, LOG_DRAIN, LogEnd, RunState, ServerEnd, Step, Verdict};
use crate::engine::run::outcome::Judged;
use crate::engine::run::slots::{Gate, SlotError, Slots};
use crate::engine::run::verdict::Ended;
use crate::log;
use crate::metrics;
use crate::network::NetworkMode;

/// Everything a run needs from the server: shared by all runs.
#[derive(Clone)]
pub struct Ctx {
    /// Where sandboxes run.
    pub backend: Arc<dyn Backend>,
    pub policy: Policy,
    pub slots: Slots,
    /// Background runs known to this process (`engine::background`).
    pub jobs: crate::engine::port::jobs::Jobs,
    /// The site's name, on a server with named sites: background runs'
    /// tokens carry it.
    pub site: Option<String>,
}

/// What a caller may want to know while a run is in flight.
#[derive(Debug, PartialEq)]
pub enum Progress {
    Queued,
    /// The backend made the run's objects: "Job mcpk8s-…", "container …".
    Created {
        what: String,
    },
    Started,
    Output(LiveChunk),
}

/// How long an unschedulable pod is given before the run gives up: long
/// enough for a finishing pod to free its resources, short enough that a
/// request no node can ever satisfy fails fast.
const UNSCHEDULABLE_GRACE: Duration = Duration::from_secs(20);

/// A fresh run id: 128 random bits as 32 hex digits, unguessable, so it can
/// double as a job token.
pub fn new_run_id() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    // SystemRandom reads the kernel's getrandom; failing means the system
    // has no entropy source at all, and no safe token can be made.
    ring::rand::SystemRandom::new().fill(&mut bytes).expect("the kernel random source is unavailable");
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A `doctor` check's tiny job: `command` in `image` run through the
/// engine exactly as a job would run (the hardening, the mode's network),
/// with no files and no caller environment, for 30 s at most.
pub fn run_check(ctx: &Ctx, image: &str, command: &[&str], network: NetworkMode) -> RunOutcome {
    let spec = RunSpec {
        image: image.to_string(),
        command: command.iter().map(|arg| arg.to_string()).collect(),
        files: Vec::new(),
        env: std::collections::BTreeMap::new(),
        cpu_limit: None,
        memory_limit: None,
        timeout: Duration::from_secs(30),
        workdir: crate::sandbox::WORKDIR.to_string(),
        artifacts: Vec::new(),
        clone: None,
        network,
        owner: None,
    };
    run(ctx, &spec, &new_run_id(), &CancelToken::new(), &|_| {})
}

/// Runs `spec` to its end. Always returns an outcome: API refusals and
/// cancellation are outcomes with `status: error` or `cancelled`. Its
/// timings hold, on the server's clock, when the run was taken, when its
/// first output arrived and when the answer was ready.
pub fn run(ctx: &Ctx, spec: &RunSpec, run_id: &str, cancel: &CancelToken, on_progress: &(dyn Fn(Progress) + Sync)) -> RunOutcome {
    let submitted = SystemTime::now();
    let first_output = std::sync::OnceLock::new();
    let on_progress = |progress: Progress| {
        if matches!(&progress, Progress::Output(chunk) if !chunk.bytes.is_empty()) {
            let _ = first_output.set(SystemTime::now());
        }
        on_progress(progress)
    };
    let mut outcome = run_taken(ctx, spec, run_id, cancel, &on_progress);
    outcome.times.submitted = Some(submitted);
    outcome.times.first_output = first_output.get().copied();
    outcome.times.answered = Some(SystemTime::now());
    outcome
}

/// `run` itself: the slot, the sandbox, the end; `run` adds its own
/// stamps of the call around it.
fn run_taken(ctx: &Ctx, spec: &RunSpec, run_id: &str, cancel: &CancelToken, on_progress: &(dyn Fn(Progress) + Sync)) -> RunOutcome {
    if ctx.slots.counts().running > 0 {
        on_progress(Progress::Queued);
    }
    let queued = metrics::track(metrics::Gauge::RunsQueued);
    let acquired = ctx.slots.acquire(cancel);
    drop(queued);
    let _permit = match acquired {
        Ok(permit) => permit,
        Err(SlotError::Cancelled) => {
            return RunOutcome::without_result(run_id, RunStatus::Cancelled, RunReason::Cancelled, "cancelled before it started".into());
        }
        Err(error @ SlotError::QueueFull { .. }) => {
            return RunOutcome::without_result(run_id, RunStatus::Error, RunReason::QueueFull, error.to_string());
        }
    };
    let _in_flight = metrics::track(metrics::Gauge::RunsInFlight);
    let started = Instant::now();
    let claimed = ctx.backend.claim(spec, crate::engine::port::RunKind::Sync);
    let run_id = claimed.as_deref().unwrap_or(run_id);
    // The server removes the run itself; the expiry only matters when it
    // could not (crash, lost connection).
    let keep = Keep::UntilRemoved { expires_at: SystemTime::now() + run_deadline(spec, &ctx.policy) + EXPIRY_SLACK };
    let followed = Followed::from_spec(spec, &ctx.policy);
    let created = match create(ctx, spec, run_id, keep) {
        Ok(created) => created,
        Err(outcome) => return *outcome,
    };
    let _cleanup = Remove { backend: ctx.backend.as_ref(), run_id };
    on_progress(Progress::Created { what: format!("{} {}", ctx.backend.wording().created, created.name) });
    let inputs = InputsUsed::new();
    let on_progress = |progress: Progress| {
        inputs.on_progress(ctx, run_id, &progress);
        on_progress(progress)
    };
    let ended = follow(ctx, &followed, run_id, cancel, &on_progress);
    // Everything is removed below; an end decided here also stops the
    // sandbox at once, so nothing runs after the answer.
    let settled = verdict::settle(ctx.backend.as_ref(), run_id, &ended, verdict::Record::No);
    let mut outcome = ended.outcome;
    if let Err(error) = settled {
        outcome.notes.push(format!("the sandbox could not be stopped ({error}); it ends at its own deadline"));
    }
    outcome.times.created = created.created_at;
    outcome.times.warm = claimed.is_some();
    log_finished(ctx, run_id, &outcome, started);
    outcome
}

/// Margin of a run's expiry over its deadline, for the backend's reaper.
pub const EXPIRY_SLACK: Duration = Duration::from_secs(60);

/// Creates the run's sandbox. A refusal comes back as the run's outcome
/// (boxed: it is large, and the happy path should not carry it).
pub fn create(ctx: &Ctx, spec: &RunSpec, run_id: &str, keep: Keep) -> Result<Created, Box<RunOutcome>> {
    let _creating = CREATING.enter();
    ctx.backend
        .create(&NewRun { run_id, spec, keep, start_by: Some(start_by(&ctx.policy)) })
        .map_err(|refused| Box::new(RunOutcome::without_result(run_id, RunStatus::Error, refused.reason, refused.message)))
}

/// The moment after which the runner must not start the command: the
/// server's start deadline (`Followed::from_spec`, taken just before the
/// create), less `start_by_margin`.
fn start_by(policy: &Policy) -> SystemTime {
    SystemTime::now() + policy.start_timeout.saturating_sub(start_by_margin(policy.start_timeout))
}

/// Between the runner's last moment to start the command and the server's
/// start deadline: the clocks, and the time a node takes to know it
/// started a container, so that the fresh look at the deadline (which asks
/// the node) sees every command that did start. A fifth of the start
/// timeout, from 1 to 3 s, so a short one still leaves the sandbox most of
/// its time.
fn start_by_margin(start_timeout: Duration) -> Duration {
    (start_timeout / 5).clamp(Duration::from_secs(1), Duration::from_secs(3))
}

/// Runs being created at once, over every caller. A create is a burst of
/// API calls, each on a connection with its TLS state and buffers; later
/// callers wait here, as threads that hold next to nothing, and creates
/// are short, so the wait is too.
static CREATING: Gate = Gate::new(8);

/// What following a run needs besides its id: the deadlines it is held to
/// and the facts it is judged on. Built from the `RunSpec` for a run this
/// process creates, or from the Job for one it re-attaches to.
#[derive(Clone, Debug)]
pub struct Followed {
    pub timeout: Duration,
    pub memory_limit: Option<String>,
    /// When a pod that has not started is given up on.
    pub start_deadline: Instant,
    /// How long a pod may stay unschedulable before the run gives up:
    /// `UNSCHEDULABLE_GRACE` for a caller who waits; `None` for a
    /// background run, which waits for capacity up to its start deadline
    /// and then ends `Unschedulable`.
    pub unschedulable_grace: Option<Duration>,
    /// The pod's own deadline plus slack: only reached if the runner and
    /// the kubelet both failed to end the run.
    pub hard_deadline: Instant,
    /// Read the command's output only once someone asks for it (in the
    /// jobs store: `Jobs::output_wanted`) or the sandbox ends: a
    /// background run. A sync run's caller always waits on it.
    pub output_on_demand: bool,
    /// `RunSpec::owner`: whose the run's stored outputs are.
    pub owner: Option<String>,
}

impl Followed {
    /// For a run about to be created now.
    pub fn from_spec(spec: &RunSpec, policy: &Policy) -> Followed {
        let now = Instant::now();
        Followed {
            timeout: spec.timeout,
            memory_limit: spec.memory_limit.as_ref().map(|quantity| quantity.as_str().to_string()),
            start_deadline: now + policy.start_timeout,
            unschedulable_grace: Some(UNSCHEDULABLE_GRACE),
            hard_deadline: now + run_deadline(spec, policy) + HARD_DEADLINE_SLACK,
            output_on_demand: false,
            owner: spec.owner.clone(),
        }
    }

    /// The deadlines the decision holds the run to.
    pub fn deadlines(&self) -> Deadlines {
        Deadlines { start: self.start_deadline, unschedulable_grace: self.unschedulable_grace, hard: self.hard_deadline }
    }
}

/// Margin of `Followed::hard_deadline` over the pod's deadline.
pub const HARD_DEADLINE_SLACK: Duration = Duration::from_secs(30);

/// Lets the backend drop a run's inputs as soon as its command starts
///: the inputs may hold secrets, and once the
/// command runs nothing reads them again. Only once; the end of the run
/// removes them anyway.
pub struct InputsUsed {
    pending: std::sync::atomic::AtomicBool,
}

impl InputsUsed {
    pub fn new() -> InputsUsed {
        InputsUsed { pending: std::sync::atomic::AtomicBool::new(true) }
    }

    /// Called with every progress of the run.
    pub fn on_progress(&self, ctx: &Ctx, run_id: &str, progress: &Progress) {
        if matches!(progress, Progress::Started) && self.pending.swap(false, std::sync::atomic::Ordering::Relaxed) {
            ctx.backend.inputs_used(run_id);
        }
    }
}

impl Default for InputsUsed {
    fn default() -> InputsUsed {
        InputsUsed::new()
    }
}

/// The metadata-only log line every run ends with, and its metrics: one
/// place for synchronous and background runs alike.
pub fn log_finished(ctx: &Ctx, run_id: &str, outcome: &RunOutcome, started: Instant) {
    let reason = outcome.reason.map_or("", RunReason::name);
    let site = ctx.site.as_deref().unwrap_or("default");
    metrics::record_run(site, outcome.status.name(), reason, started.elapsed(), outcome.duration);
    log::info(
        "run finished",
        &[
            ("run_id", run_id.into()),
            ("status", outcome.status.name().into()),
            ("reason", reason.into()),
            ("stdout_bytes", outcome.stdout_total_bytes.into()),
            ("stderr_bytes", outcome.stderr_total_bytes.into()),
            ("artifacts", outcome.artifacts.len().into()),
            ("warm", outcome.times.warm.into()),
            ("elapsed_ms", (started.elapsed().as_millis() as u64).into()),
        ],
    );
}

/// Removes what the run created when it goes out of scope: on success,
/// failure, timeout, cancellation or a panic in between.
struct Remove<'a> {
    backend: &'a dyn Backend,
    run_id: &'a str,
}

impl Drop for Remove<'_> {
    fn drop(&mut self) {
        self.backend.remove(self.run_id);
    }
}

/// Follows the sandbox from creation to the end of the command, and judges
/// it. Works the same for a pod that already finished: its log is read from
/// the start. The caller makes the end final (`verdict::settle`).
pub fn follow(ctx: &Ctx, followed: &Followed, run_id: &str, cancel: &CancelToken, on_progress: &(dyn Fn(Progress) + Sync)) -> Ended {
    let mut watch = ctx.backend.watch(run_id);
    let ended = std::thread::scope(|scope| decide(ctx, followed, run_id, cancel, on_progress, &mut watch, scope));
    watch.abort.abort();
    ended
}

/// The run's decision loop: the machine in `decide` decides; this feeds it
/// what the watch and the log follower report and does what it asks.
fn decide<'scope>(
    ctx: &'scope Ctx,
    followed: &Followed,
    run_id: &str,
    cancel: &CancelToken,
    on_progress: &'scope (dyn Fn(Progress) + Sync),
    pods: &mut Watch,
    scope: &'scope std::thread::Scope<'scope, '_>,
) -> Ended {
    let mut machine = RunState::new(followed.deadlines(), Instant::now());
    if followed.output_on_demand {
        machine = machine.reading_on_demand();
    }
    let mut shell = Shell {
        ctx,
        followed,
        run_id,
        cancel,
        on_progress,
        last: None,
        log: LogState::NotStarted,
        wanted_told: false,
        wake: pods.wake.clone(),
        followers: 0,
    };
    let mut queue = std::collections::VecDeque::new();
    loop {
        if queue.is_empty() {
            queue.extend(shell.next_events(&machine, pods));
        }
        let Some(event) = queue.pop_front() else { continue };
        for step in machine.on(event, Instant::now()) {
            match step {
                Step::Done(verdict) => return shell.ended(verdict),
                step => queue.extend(shell.execute(step, scope)),
            }
        }
    }
}

/// The I/O side of the decision loop: the last pod as the API returned it
/// (its name, its times, what it was doing) and the log follower.
struct Shell<'scope, 'run> {
    ctx: &'scope Ctx,
    followed: &'run Followed,
    run_id: &'run str,
    cancel: &'run CancelToken,
    on_progress: &'scope (dyn Fn(Progress) + Sync),
    /// The sandbox as last seen: its name (to read its output) and times.
    last: Option<Sighting>,
    log: LogState<'scope>,
    /// `Event::OutputWanted` was fed (once is enough).
    wanted_told: bool,
    /// Into the watch's stream: each output reader says there when it ends.
    wake: mpsc::Sender<Watched>,
    /// Output readers started; the last one's number is the current one.
    followers: u64,
}

impl<'scope> Shell<'scope, '_> {
    /// What happened since the last look: a cancel, the watch's news (or a
    /// tick after 200 ms without any), a follower that finished.
    fn next_events(&mut self, machine: &RunState, pods: &mut Watch) -> Vec<Event> {
        if self.cancel.is_cancelled() {
            return vec![Event::Cancelled];
        }
        let mut output_ended = false;
        let mut events = match pods.events.recv_timeout(Duration::from_millis(200)) {
            Ok(Watched::OutputEnded(number)) => {
                output_ended = number == self.followers;
                Vec::new()
            }
            // The backend's watch ended without a word (its thread died):
            // watch again, which starts a new one, rather than go blind
            // until the hard deadline.
            Ok(Watched::Ended) => {
                std::thread::sleep(Duration::from_millis(200));
                pods.abort.abort();
                *pods = self.ctx.backend.watch(self.run_id);
                self.wake = pods.wake.clone();
                vec![Event::Tick]
            }
            Ok(watched) => self.watched(machine, watched),
            // The stream never closes: the run holds a sender of it (`wake`).
            Err(_) => vec![Event::Tick],
        };
        if self.followed.output_on_demand && !self.wanted_told && self.ctx.jobs.output_wanted(self.run_id) {
            self.wanted_told = true;
            events.push(Event::OutputWanted);
        }
        // The reader's own word that it ended comes just before its thread
        // does: joining it then waits only for that.
        if let LogState::Following((handle, _)) = &self.log
            && (output_ended || handle.is_finished())
        {
            let collector = std::mem::replace(&mut self.log, LogState::NotStarted).join(self.cancel);
            let end = LogEnd {
                has_result: collector.result.is_some(),
                terminated_by_request: collector.result.as_ref().is_some_and(|result| result.terminated_by_request),
                stop_asked_here: cancel_requested(self.ctx, self.run_id, self.cancel),
                reported: collector.live_stdout.len() + collector.live_stderr.len(),
                read_bytes: collector.log_bytes,
            };
            self.log = LogState::Ended(Box::new(collector));
            events.push(Event::LogEnded(end));
        }
        events
    }

    fn watched(&mut self, machine: &RunState, watched: Watched) -> Vec<Event> {
        match watched {
            Watched::Listed(newest) => self.listed(newest),
            Watched::Seen(sighting) => vec![self.seen(sighting)],
            Watched::Gone(sighting) => {
                let same = self.last.as_ref().is_none_or(|last| last.sandbox == sighting.sandbox);
                if !same {
                    return vec![Event::ApiBack];
                }
                let view = sighting.view.clone();
                self.last = Some(sighting);
                vec![Event::Gone(view)]
            }
            Watched::Trouble(why) => {
                match machine.outage() {
                    None => {
                        metrics::api_error("watch_sandbox");
                        log::warn(
                            "the sandbox watch is failing; riding it out",
                            &[("run_id", self.run_id.into()), ("error", why.as_str().into())],
                        );
                    }
                    Some(current) if current != why => {
                        log::debug("the sandbox watch is still failing", &[("run_id", self.run_id.into()), ("error", why.as_str().into())]);
                    }
                    Some(_) => {}
                }
                vec![Event::ApiTrouble(why)]
            }
            Watched::Failed(message) => {
                metrics::api_error("watch_sandbox");
                vec![Event::ApiFailed(message)]
            }
            // Handled by `next_events` before it gets here.
            Watched::Ended | Watched::OutputEnded(_) => Vec::new(),
        }
    }

    fn seen(&mut self, sighting: Sighting) -> Event {
        let view = sighting.view.clone();
        self.last = Some(sighting);
        Event::Seen(view)
    }

    /// A complete look: the newest sandbox is the one to judge; none after
    /// one was seen means it is gone (deleted while the watch was away).
    fn listed(&mut self, newest: Option<Sighting>) -> Vec<Event> {
        match newest {
            Some(sighting) => vec![Event::ApiBack, self.seen(sighting)],
            None => match &self.last {
                Some(last) => vec![Event::ApiBack, Event::Gone(last.view.clone())],
                None => vec![Event::ApiBack],
            },
        }
    }

    /// Does what the machine asked; what came of it, as events.
    fn execute(&mut self, step: Step, scope: &'scope std::thread::Scope<'scope, '_>) -> Vec<Event> {
        match step {
            Step::FollowOutput { reported } => {
                if let Some(last) = &self.last {
                    self.followers += 1;
                    let wake = (self.wake.clone(), self.followers);
                    // One spool for the run: a reading that starts again
                    // (the kubelet ends a followed log when it rotates the
                    // file) adds to what the last one stored.
                    let spool = self.log.take_spool().or_else(|| {
                        self.ctx
                            .policy
                            .outputs
                            .clone()
                            .map(|store| crate::outputs::Spool::new(store, self.run_id, self.followed.owner.as_deref()))
                    });
                    let reading = Reading { run_id: self.run_id, sandbox: &last.sandbox, reported, spool };
                    self.log = LogState::Following(start_follower(self.ctx, reading, self.on_progress, wake, scope));
                }
                Vec::new()
            }
            Step::ReportStarted => {
                (self.on_progress)(Progress::Started);
                Vec::new()
            }
            Step::PollStartFailures => match self.ctx.backend.start_failure(self.run_id) {
                Some((reason, message)) => vec![Event::StartFailed { reason, message }],
                None => Vec::new(),
            },
            Step::ProbeSandbox => match self.ctx.backend.probe(self.run_id) {
                // Asked for during an outage, or for a fresh look at a
                // sandbox past its start deadline; either way, what is there.
                Ok(newest) => self.listed(newest),
                Err(_) => Vec::new(),
            },
            // The loop in `decide` ends the run itself; nothing to do here.
            Step::Done(_) => Vec::new(),
        }
    }

    /// Turns the machine's verdict into the run's end.
    fn ended(mut self, verdict: Verdict) -> Ended {
        let run_id = self.run_id;
        let end = match verdict {
            Verdict::Judge { finished } => {
                let collector = self.log.join(self.cancel);
                let by = if collector.result.is_some() { DecidedBy::Runner } else { DecidedBy::Server };
                let facts = judged_facts(self.ctx, run_id, self.followed, finished, self.cancel);
                return Ended { outcome: judged_with_times(&facts, collector, self.last.as_ref()), by };
            }
            Verdict::Server(end) => end,
        };
        let outcome = match end {
            ServerEnd::Cancelled => cancelled(run_id, self.ctx.backend.wording(), self.log.stop()),
            ServerEnd::StartTimeout => start_timeout(self.ctx, run_id),
            ServerEnd::Unschedulable { message } => unschedulable(run_id, self.ctx.backend.wording(), &message),
            ServerEnd::Refused { reason, message } => RunOutcome::without_result(run_id, RunStatus::Error, reason, message),
            ServerEnd::PastHardDeadline { outage } => {
                let facts = judged_facts(self.ctx, run_id, self.followed, None, self.cancel);
                past_hard_deadline(&facts, self.log.stop(), outage.as_ref())
            }
            ServerEnd::WatchFailed { message } => watch_failed(run_id, self.ctx.backend.wording(), self.log.stop(), &message),
        };
        Ended { outcome, by: DecidedBy::Server }
    }
}

/// The judging facts besides the log, owned (the judge borrows them).
struct Facts {
    run_id: String,
    wording: &'static Wording,
    timeout: Duration,
    memory_limit: Option<String>,
    finished: Option<Finished>,
    cancel_requested: bool,
}

impl Facts {
    fn judged(&self) -> Judged<'_> {
        Judged {
            run_id: &self.run_id,
            timeout: self.timeout,
            memory_limit: self.memory_limit.as_deref(),
            finished: self.finished.as_ref(),
            cancel_requested: self.cancel_requested,
            wording: self.wording,
        }
    }
}

fn judged_facts(ctx: &Ctx, run_id: &str, followed: &Followed, finished: Option<Finished>, cancel: &CancelToken) -> Facts {
    Facts {
        run_id: run_id.to_string(),
        wording: ctx.backend.wording(),
        timeout: followed.timeout,
        memory_limit: followed.memory_limit.clone(),
        finished,
        cancel_requested: cancel_requested(ctx, run_id, cancel),
    }
}

/// Whether this server asked for the run to stop: an MCP cancel of a sync
/// run, or `cancel_job` of a background one.
fn cancel_requested(ctx: &Ctx, run_id: &str, cancel: &CancelToken) -> bool {
    cancel.is_cancelled() || matches!(ctx.jobs.lookup(run_id), Lookup::Found(view) if view.cancel_requested)
}

/// Judges a run from its collected log and the sandbox's last known times.
/// What the output store kept becomes the outcome's links here, once the
/// streams' totals are known (a run without the runner's result has none:
/// its stored streams are marked incomplete). A cancelled run keeps
/// nothing: its spool is dropped, which deletes what it wrote.
fn judged_with_times(facts: &Facts, collector: Collector, last: Option<&Sighting>) -> RunOutcome {
    let mut outcome = judge_collected(&facts.judged(), collector);
    if let Some(last) = last {
        outcome.times.scheduled = last.times.scheduled;
        outcome.times.started = outcome.times.started.or(last.times.started);
        outcome.times.finished = outcome.times.finished.or(last.times.finished);
    }
    outcome
}

/// Judges a run from its collected log; what the output store kept
/// becomes the outcome's links, once the streams' totals are known.
pub fn judge_collected(judged: &Judged, mut collector: Collector) -> RunOutcome {
    let spool = collector.spool.take().filter(|_| !judged.cancel_requested);
    let reported = collector.result.is_some();
    let mut outcome = outcome::judge(judged, collector);
    if let Some(spool) = spool {
        let totals = reported.then_some([outcome.stdout_total_bytes, outcome.stderr_total_bytes]);
        let (links, note) = spool.finish(totals, SystemTime::now());
        outcome.links = links;
        outcome.notes.extend(note);
    }
    outcome
}

/// No node could take the sandbox within the grace (sync) or the start
/// timeout (background); the caller of this stops it for good.
fn unschedulable(run_id: &str, wording: &Wording, message: &str) -> RunOutcome {
    let sandbox = wording.sandbox;
    RunOutcome::without_result(
        run_id,
        RunStatus::Error,
        RunReason::Unschedulable,
        format!(
            "no node can run the {sandbox}: {message}; the {sandbox} was deleted and will not run; lower limits.cpu / limits.memory or ask the operator for capacity"
        ),
    )
}

/// The sandbox did not start in time: says what it was doing. The caller stops it for good.
fn start_timeout(ctx: &Ctx, run_id: &str) -> RunOutcome {
    let progress = ctx.backend.start_progress(run_id);
    let sandbox = ctx.backend.wording().sandbox;
    RunOutcome::without_result(
        run_id,
        RunStatus::Error,
        RunReason::StartTimeout,
        format!(
            "the {sandbox} did not start within {} s (MCP_K8S_START_TIMEOUT_S): {progress}; the {sandbox} was stopped and the command will not run; retry, or ask the operator to raise MCP_K8S_START_TIMEOUT_S or pre-pull the image",
            ctx.policy.start_timeout.as_secs()
        ),
    )
}

/// The hard deadline passed: the sandbox's own deadline is behind us, so
/// the backend has stopped it whatever this server saw.
fn past_hard_deadline(facts: &Facts, collector: Collector, outage: Option<&Away>) -> RunOutcome {
    let mut outcome = outcome::judge(&facts.judged(), collector);
    match outage {
        Some(outage) => {
            outcome.status = RunStatus::Error;
            outcome.reason = Some(RunReason::ApiError);
            let wording = facts.wording;
            outcome.message = format!(
                "{} has not answered for {} s ({}); the {}'s own deadline has passed, so {} stopped it, but its result could not be read; the output read so far is included",
                wording.api,
                outage.duration.as_secs(),
                outage.why,
                wording.sandbox,
                wording.stopper
            );
        }
        None => {
            outcome.status = RunStatus::TimedOut;
            outcome.reason = Some(RunReason::DeadlineExceeded);
            outcome.message = "the run passed its hard deadline without the runner reporting; output so far is included".into();
        }
    }
    outcome
}

fn watch_failed(run_id: &str, wording: &Wording, collector: Collector, message: &str) -> RunOutcome {
    let mut outcome = RunOutcome::without_result(
        run_id,
        RunStatus::Error,
        RunReason::ApiError,
        // Whether the sandbox could be stopped is said by the caller of
        // `follow` (a note when it could not): this text makes no claim.
        format!(
            "watching the {} failed: {message}; the server gave up on the run; check its permissions (mcp-k8s-ephemeral-job doctor)",
            wording.sandbox
        ),
    );
    outcome.stdout = collector.live_stdout;
    outcome.stderr = collector.live_stderr;
    outcome
}

type Follower<'scope> = (std::thread::ScopedJoinHandle<'scope, Collector>, StreamStop);

/// Where the reading of the main container's log stands. One value, so the
/// decision loop cannot mistake "the log ended without a result" for "the
/// pod never started" (an earlier version kept two options and did).
enum LogState<'scope> {
    NotStarted,
    Following(Follower<'scope>),
    /// The log ended without the runner's result; kept until the pod's
    /// status says why (boxed: the collector is large, the others small).
    Ended(Box<Collector>),
}

impl LogState<'_> {
    /// The spool of a reading that ended, for the next one.
    fn take_spool(&mut self) -> Option<crate::outputs::Spool> {
        match self {
            LogState::Ended(collector) => collector.spool.take(),
            _ => None,
        }
    }

    /// What was read, waiting up to `LOG_DRAIN` for a follower to finish.
    fn join(self, cancel: &CancelToken) -> Collector {
        match self {
            LogState::NotStarted => Collector::new(0, 0),
            LogState::Following((handle, stop)) => {
                let deadline = Instant::now() + LOG_DRAIN;
                while !handle.is_finished() && Instant::now() < deadline && !cancel.is_cancelled() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if !handle.is_finished() {
                    stop.stop();
                }
                handle.join().unwrap_or_else(|_| lost_reading())
            }
            LogState::Ended(collector) => *collector,
        }
    }

    /// What was read, closing the stream at once.
    fn stop(&mut self) -> Collector {
        match std::mem::replace(self, LogState::NotStarted) {
            LogState::Following((handle, stop)) => {
                stop.stop();
                handle.join().unwrap_or_else(|_| lost_reading())
            }
            other => other.join(&CancelToken::new()),
        }
    }
}

/// What a log reader that panicked leaves: nothing read, and a note that
/// says so, never an empty output passed off as the command's. The panic
/// itself is logged and counted by the panic hook.
fn lost_reading() -> Collector {
    let mut collector = Collector::new(0, 0);
    collector.problems.push(LOST_READING_NOTE.to_string());
    collector
}

const LOST_READING_NOTE: &str = "the server's reader of the log failed (an internal error, in the server's log); the output and files shown may be incomplete: run the command again";

/// Stops the log follower from the decision thread: closes the stream that
/// is open now and keeps any later one from opening.
#[derive(Clone, Default)]
struct StreamStop {
    stopped: std::sync::Arc<std::sync::atomic::AtomicBool>,
    current: std::sync::Arc<std::sync::Mutex<Option<Abort>>>,
}

impl StreamStop {
    fn stop(&self) {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(abort) = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take() {
            abort.abort();
        }
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Registers the stream now open; closes it at once if already stopped.
    fn set(&self, abort: Abort) {
        let mut current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.is_stopped() {
            abort.abort();
        } else {
            *current = Some(abort);
        }
    }
}

/// What a new reading of the log starts from: the sandbox, the live bytes
/// an earlier reader reported, and the run's spool (output store).
struct Reading<'a> {
    run_id: &'a str,
    sandbox: &'a str,
    reported: usize,
    spool: Option<crate::outputs::Spool>,
}

/// Starts following the main container's log on its own thread; the
/// first `reported` live bytes were reported by an earlier reader.
/// It says on `wake`, with its number, when it has ended.
fn start_follower<'scope>(
    ctx: &'scope Ctx,
    reading: Reading<'_>,
    on_progress: &'scope (dyn Fn(Progress) + Sync),
    (wake, number): (mpsc::Sender<Watched>, u64),
    scope: &'scope std::thread::Scope<'scope, '_>,
) -> Follower<'scope> {
    let Reading { run_id, sandbox, reported, spool } = reading;
    let (run_id, sandbox) = (run_id.to_string(), sandbox.to_string());
    let stop = StreamStop::default();
    let follower_stop = stop.clone();
    let handle = scope.spawn(move || {
        let collector = follow_output(ctx, (&run_id, &sandbox), spool, &follower_stop, reported, on_progress);
        let _ = wake.send(Watched::OutputEnded(number));
        collector
    });
    (handle, stop)
}

/// Reads the followed output into a collector. A stream that breaks
/// before the result arrived is opened again from the start (the collector
/// restarts, so nothing is counted twice, and live output already reported
/// is not reported again). An output not ready yet and a backend that does
/// not answer are waited for: the decision's deadlines stop this reader,
/// so it never gives up on its own, except when the sandbox is gone.
/// With an output store, the run's spool goes from one reading to the
/// next: a second reading writes the same bytes at the same offsets.
fn follow_output(
    ctx: &Ctx,
    (run_id, sandbox): (&str, &str),
    spool: Option<crate::outputs::Spool>,
    stop: &StreamStop,
    mut already_reported: usize,
    on_progress: &(dyn Fn(Progress) + Sync),
) -> Collector {
    let policy = &ctx.policy;
    let mut collector = Collector::new(policy.max_output_bytes, policy.max_artifact_bytes);
    collector.spool = spool;
    let mut failures = 0u32;
    while !stop.is_stopped() {
        let mut output = match ctx.backend.output(sandbox) {
            Ok(output) => output,
            Err(OutputError::Gone(why)) => {
                collector.problems.push(why);
                break;
            }
            Err(OutputError::Unavailable(_)) => {
                failures = failures.saturating_add(1);
                let delay = Duration::from_millis(300).saturating_mul(failures.min(7));
                let until = Instant::now() + delay;
                while !stop.is_stopped() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(50));
                }
                continue;
            }
        };
        stop.set(output.abort.clone());
        let mut fresh = Collector::new(policy.max_output_bytes, policy.max_artifact_bytes);
        fresh.spool = collector.spool.take();
        let mut seen = 0usize;
        let mut on_live = |mut chunk: LiveChunk| {
            let end = seen + chunk.bytes.len();
            if end > already_reported {
                chunk.bytes.drain(..already_reported.saturating_sub(seen));
                on_progress(Progress::Output(chunk));
            }
            seen = end;
        };
        let read = loop {
            let read = fresh.read_all(&mut output.reader, &mut on_live);
            match fresh.held.take() {
                Some(held) if !stop.is_stopped() => {
                    fetch_held(ctx, (run_id, sandbox), &held, &mut fresh, stop);
                    stop.set(output.abort.clone());
                }
                _ => break read,
            }
        };
        already_reported = already_reported.max(seen);
        collector = fresh;
        if read.is_ok() || collector.result.is_some() || stop.is_stopped() {
            break;
        }
    }
    collector
}

/// Fetches what the runner held in the sandbox into the run's spool, once
/// per run (a log read again says `Held` again), then releases the
/// runner, which writes its result only after that. A fetch that fails
/// is said in the result's notes; the links then say what is missing.
fn fetch_held(
    ctx: &Ctx,
    (run_id, sandbox): (&str, &str),
    held: &crate::sandbox::frame::Held,
    collector: &mut Collector,
    stop: &StreamStop,
) {
    let key = crate::sandbox::held::key(run_id);
    // A cancelled run keeps nothing in the output store (the cancel removed
    // its place there), and its stopped runner serves nothing: a fetch
    // would only wait, try after try, for a runner that is gone.
    if matches!(ctx.jobs.lookup(run_id), crate::engine::port::jobs::Lookup::Found(view) if view.cancel_requested) {
        return;
    }
    // Another process that read the run first fetched it and finished the
    // run in the store: its links stand, and the runner it released is
    // gone (a fetch or a release would wait for the connect timeout).
    if collector.spool.as_ref().is_some_and(|spool| spool.finished_elsewhere(SystemTime::now()).is_some()) {
        return;
    }
    let wanted = collector.spool.as_ref().is_some_and(|spool| !spool.held_fetched);
    if wanted {
        match fetch_held_frames(ctx, (sandbox, &key), held, collector, stop) {
            Ok(()) => {
                if let Some(spool) = collector.spool.as_mut() {
                    spool.held_fetched = true;
                }
            }
            Err(why) => collector.problems.push(format!(
                "the output the runner kept in the sandbox for the store ({} bytes of frames) could not be fetched: {why}; the stored links are incomplete",
                held.bytes
            )),
        }
    }
    let released = ctx.backend.held_outputs().map(|outputs| outputs.release(sandbox, held.port, &key));
    if let Some(Err(why)) = released {
        log::warn(
            "the runner holding output could not be released; it goes on after its wait",
            &[("run_id", run_id.into()), ("error", why.to_string().into())],
        );
    }
}

/// How many times a fetch cut off is resumed without progress.
const HELD_FETCH_TRIES: u32 = 5;

/// Reads the held frames into the spool, resuming a fetch cut off where
/// its last whole frame ended (a connection through the API server can
/// break mid-way); gives up after `HELD_FETCH_TRIES` tries in a row that
/// add nothing.
fn fetch_held_frames(
    ctx: &Ctx,
    (sandbox, key): (&str, &str),
    held: &crate::sandbox::frame::Held,
    collector: &mut Collector,
    stop: &StreamStop,
) -> Result<(), String> {
    let mut offset = 0u64;
    let mut fruitless = 0u32;
    loop {
        let before = offset;
        let fetched = match ctx.backend.held_outputs() {
            Some(outputs) => outputs.fetch(sandbox, held.port, key, offset).map_err(|error| error.to_string()),
            None => Err("this backend does not keep output in the sandbox".to_string()),
        };
        let read = fetched.and_then(|mut output| {
            stop.set(output.abort.clone());
            collector.read_held(&mut output.reader, &mut offset).map_err(|error| error.to_string())
        });
        match read {
            Ok(()) if offset >= held.bytes => return Ok(()),
            Err(why) if stop.is_stopped() => return Err(why),
            other => {
                if let Err(why) = &other {
                    log::warn("a fetch of held output broke; resuming", &[("offset", offset.into()), ("error", why.as_str().into())]);
                }
                fruitless = if offset > before { 0 } else { fruitless + 1 };
                if fruitless >= HELD_FETCH_TRIES {
                    let why = other.err().unwrap_or_else(|| format!("it ended after {offset} of {} bytes", held.bytes));
                    return Err(format!("{why} ({HELD_FETCH_TRIES} tries without progress)"));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200).saturating_mul(fruitless));
    }
}

fn cancelled(run_id: &str, wording: &Wording, collector: Collector) -> RunOutcome {
    let mut outcome = RunOutcome::without_result(
        run_id,
        RunStatus::Cancelled,
        RunReason::Cancelled,
        format!("the run was cancelled and its {} deleted; the output read so far is included", wording.sandbox),
    );
    outcome.stdout = collector.live_stdout;
    outcome.stderr = collector.live_stderr;
    outcome.truncated.stdout = true;
    outcome.truncated.stderr = true;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_reader_that_panicked_leaves_a_note_not_an_empty_output() {
        let collector = std::thread::scope(|scope| {
            let handle = scope.spawn(|| -> Collector { panic!("a reader's bug") });
            while !handle.is_finished() {
                std::thread::yield_now();
            }
            LogState::Following((handle, StreamStop::default())).join(&CancelToken::new())
        });
        assert_eq!(collector.problems, [LOST_READING_NOTE]);
        assert!(collector.result.is_none());
    }

    #[test]
    fn the_runner_stops_starting_commands_a_fifth_of_the_start_timeout_early_from_1_to_3_s() {
        for (timeout_s, margin_ms) in [(5, 1_000), (10, 2_000), (15, 3_000), (120, 3_000)] {
            assert_eq!(start_by_margin(Duration::from_secs(timeout_s)), Duration::from_millis(margin_ms), "{timeout_s} s");
        }
    }
}
