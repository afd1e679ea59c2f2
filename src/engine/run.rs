//! One run, start to finish: take a slot, create the Job (and its inputs
//! Secret), watch the pod, fail fast with a reason when it cannot start,
//! follow the main container's log while the command runs, judge the
//! outcome, and delete everything it created, whatever happened.
//!
//! Threads are scoped to the run: one follows the pod watch, one the log;
//! the run's own thread is the shell around `decide::RunState`, the pure
//! machine that owns every rule of when and why a run ends. The shell
//! turns pods (through `classify`) and the follower's end into its events,
//! does the I/O its steps ask for (follow the log, list the pod during an
//! outage, read the Job's and the pod's events, report the start) and
//! turns its verdict into the `Ended`. Cancellation (an MCP cancel, a
//! shutdown) deletes the Job at once and returns what was read so far.
//!
//! API trouble does not end a run whose pod may still exist (issue 12,
//! finding 10): the watch and the log are resumed (the log re-read from
//! the start) for as long as the run's own deadlines allow, and a 401/403
//! right after a reconnect gets `DENIED_GRACE`.

use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::backend::kubernetes::classify::{self, Finished};
use crate::backend::kubernetes::manifest;
use crate::cancel::CancelToken;
use crate::engine::collect::{Collector, LiveChunk};
use crate::engine::decide::{Away, Deadlines, Event, LogEnd, RunState, ServerEnd, Step, Verdict};
use crate::engine::jobs::Lookup;
use crate::engine::outcome::{self, Judged};
use crate::engine::slots::{SlotError, Slots};
use crate::engine::spec::{Policy, RunOutcome, RunReason, RunSpec, RunStatus};
use crate::engine::verdict::{self, DecidedBy, Ended};
use crate::kube;
use crate::log;
use crate::metrics;

/// Everything a run needs from the server: shared by all runs.
#[derive(Clone)]
pub struct Ctx {
    pub client: kube::Client,
    pub policy: Policy,
    pub slots: Slots,
    /// Background runs known to this process (`engine::background`).
    pub jobs: crate::engine::jobs::Jobs,
}

/// What a caller may want to know while a run is in flight.
#[derive(Debug, PartialEq)]
pub enum Progress {
    Queued,
    Created { job_name: String },
    Started,
    Output(LiveChunk),
}

/// How long an unschedulable pod is given before the run gives up: long
/// enough for a finishing pod to free its resources, short enough that a
/// request no node can ever satisfy fails fast.
pub const UNSCHEDULABLE_GRACE: Duration = Duration::from_secs(20);
/// How long the log may take to end after the container has.
const LOG_DRAIN: Duration = Duration::from_secs(30);

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

/// Runs `spec` to its end. Always returns an outcome: API refusals and
/// cancellation are outcomes with `status: error` or `cancelled`.
pub fn run(ctx: &Ctx, spec: &RunSpec, run_id: &str, cancel: &CancelToken, on_progress: &(dyn Fn(Progress) + Sync)) -> RunOutcome {
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
    let namespace = ctx.policy.namespace.clone();
    let job_name = manifest::job_name(run_id);
    // The server deletes the Job itself; the annotation and the short TTL
    // only matter when it could not (crash, lost connection).
    let retention = manifest::Retention {
        expires_at: rfc3339_after(manifest::pod_deadline(spec, &ctx.policy) + manifest::JOB_DEADLINE_SLACK),
        finished_ttl: ctx.policy.finished_ttl,
        background: None,
    };
    let followed = Followed::from_spec(spec, &ctx.policy);
    let created = match create(ctx, spec, run_id, &retention) {
        Ok(created) => created,
        Err(outcome) => return *outcome,
    };
    let _cleanup = Cleanup { client: &ctx.client, namespace: &namespace, job_name: &job_name, job: true, secret: created.has_secret };
    on_progress(Progress::Created { job_name: job_name.clone() });
    let inputs = InputsSecret::new(created.has_secret);
    let on_progress = |progress: Progress| {
        inputs.on_progress(ctx, run_id, &progress);
        on_progress(progress)
    };
    let ended = follow(ctx, &followed, run_id, cancel, &on_progress);
    // The Job is deleted below; an end decided here also stops its pods at
    // once, so nothing runs after the answer (issue 12, findings 1 and 3).
    let settled = verdict::settle(ctx, run_id, &ended, verdict::Record::No);
    let mut outcome = ended.outcome;
    if let Err(error) = settled {
        outcome.notes.push(format!("the pod could not be stopped through the API ({error}); it ends at its own deadline"));
    }
    outcome.times.created = classify_time(&created.job["metadata"]["creationTimestamp"]);
    log_finished(run_id, &outcome, started);
    outcome
}

/// What `create` made.
pub struct Created {
    /// The Job as stored by the API server.
    pub job: Value,
    pub has_secret: bool,
}

/// Creates the Job and its inputs Secret, marked with `retention`. Leaves
/// nothing behind when it fails: the refusal comes back as an outcome
/// (boxed: it is large, and the happy path should not carry it).
pub fn create(ctx: &Ctx, spec: &RunSpec, run_id: &str, retention: &manifest::Retention) -> Result<Created, Box<RunOutcome>> {
    let namespace = &ctx.policy.namespace;
    let job_name = manifest::job_name(run_id);
    let mut cleanup = Cleanup { client: &ctx.client, namespace, job_name: &job_name, job: false, secret: false };
    let mut job_manifest = manifest::job(spec, &ctx.policy, run_id);
    manifest::apply_retention(&mut job_manifest, retention);
    let job = ctx.client.create(kube::Resource::JOBS, namespace, &job_manifest).map_err(|error| {
        metrics::api_error("create_job");
        Box::new(api_refusal(run_id, "create the Job", &error))
    })?;
    cleanup.job = true;
    log::info("job created", &[("run_id", run_id.into()), ("job", job_name.as_str().into())]);
    let job_uid = job["metadata"]["uid"].as_str().unwrap_or_default();
    let mut has_secret = false;
    if let Some(mut secret) = manifest::inputs_secret(spec, &ctx.policy, run_id, job_uid) {
        manifest::apply_retention(&mut secret, retention);
        ctx.client.create(kube::Resource::SECRETS, namespace, &secret).map_err(|error| {
            metrics::api_error("create_secret");
            Box::new(api_refusal(run_id, "create the inputs Secret", &error))
        })?;
        has_secret = true;
    }
    // Everything exists: from here on the caller owns it.
    cleanup.job = false;
    Ok(Created { job, has_secret })
}

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
    /// and then ends `Unschedulable` (issue 12, finding 15).
    pub unschedulable_grace: Option<Duration>,
    /// The pod's own deadline plus slack: only reached if the runner and
    /// the kubelet both failed to end the run.
    pub hard_deadline: Instant,
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
            hard_deadline: now + manifest::pod_deadline(spec, policy) + HARD_DEADLINE_SLACK,
        }
    }

    /// The deadlines the decision holds the run to.
    pub fn deadlines(&self) -> Deadlines {
        Deadlines { start: self.start_deadline, unschedulable_grace: self.unschedulable_grace, hard: self.hard_deadline }
    }
}

/// Margin of `Followed::hard_deadline` over the pod's deadline.
pub const HARD_DEADLINE_SLACK: Duration = Duration::from_secs(30);

/// Deletes a run's inputs Secret as soon as its command starts (issue 12,
/// finding 9): the inputs may hold secrets, and once the main container
/// runs, `prepare` has written them and nothing reads the Secret again.
/// Only once; the end of the run deletes it anyway (a 404 is no error).
pub struct InputsSecret {
    pending: std::sync::atomic::AtomicBool,
}

impl InputsSecret {
    pub fn new(exists: bool) -> InputsSecret {
        InputsSecret { pending: std::sync::atomic::AtomicBool::new(exists) }
    }

    /// Called with every progress of the run.
    pub fn on_progress(&self, ctx: &Ctx, run_id: &str, progress: &Progress) {
        if matches!(progress, Progress::Started) && self.pending.swap(false, std::sync::atomic::Ordering::Relaxed) {
            delete_inputs_secret(ctx, run_id);
        }
    }
}

/// Deletes `run_id`'s inputs Secret; a background run calls it once its pod
/// is done with the inputs. Failures are logged: the Secret is owned by the
/// Job, so the garbage collector removes it with the Job anyway.
pub fn delete_inputs_secret(ctx: &Ctx, run_id: &str) {
    delete_secret(&ctx.client, &ctx.policy.namespace, &manifest::job_name(run_id));
}

fn delete_secret(client: &kube::Client, namespace: &str, name: &str) {
    if let Err(error) = client.delete(kube::Resource::SECRETS, namespace, name) {
        metrics::api_error("delete_secret");
        log::warn(
            "inputs secret not deleted; the garbage collector will remove it with its Job",
            &[("secret", name.into()), ("error", error.to_string().into())],
        );
    }
}

/// The metadata-only log line every run ends with, and its metrics: one
/// place for synchronous and background runs alike.
pub fn log_finished(run_id: &str, outcome: &RunOutcome, started: Instant) {
    let reason = outcome.reason.map_or("", RunReason::name);
    metrics::record_run(outcome.status.name(), reason, started.elapsed(), outcome.duration);
    log::info(
        "run finished",
        &[
            ("run_id", run_id.into()),
            ("status", outcome.status.name().into()),
            ("reason", reason.into()),
            ("stdout_bytes", outcome.stdout_total_bytes.into()),
            ("stderr_bytes", outcome.stderr_total_bytes.into()),
            ("artifacts", outcome.artifacts.len().into()),
            ("elapsed_ms", (started.elapsed().as_millis() as u64).into()),
        ],
    );
}

/// `now + after` as RFC 3339 UTC, for expiry annotations.
pub fn rfc3339_after(after: Duration) -> String {
    log::rfc3339_utc(SystemTime::now() + after)
}

/// Deletes what the run created when it goes out of scope: on success,
/// failure, timeout, cancellation or a panic in between.
struct Cleanup<'a> {
    client: &'a kube::Client,
    namespace: &'a str,
    job_name: &'a str,
    job: bool,
    secret: bool,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        // Background propagation: the Job goes at once and the garbage
        // collector removes the pod; nothing here waits for it.
        if self.job
            && let Err(error) = self.client.delete(kube::Resource::JOBS, self.namespace, self.job_name)
        {
            metrics::api_error("delete_job");
            log::warn(
                "job not deleted; ttlSecondsAfterFinished and the reaper will remove it",
                &[("job", self.job_name.into()), ("error", error.to_string().into())],
            );
        }
        if self.secret {
            delete_secret(self.client, self.namespace, self.job_name);
        }
    }
}

/// What the pod watch thread tells the decision loop.
enum Watched {
    /// The complete set of the run's pods (at the start, after a re-list).
    Listed(Vec<Value>),
    Pod(Value),
    /// A `DELETED` event: the pod is gone.
    Gone(Value),
    /// The watch failed and is being retried; the text says why.
    Trouble(String),
    /// The watch failed in a way retrying cannot fix.
    Failed(String),
}

/// How long 401/403 answers to the watch are taken for an API server
/// whose caches are still cold after a restart (it answered 403 for a few
/// seconds in issue 12, finding 10) before they count as a real refusal.
pub const DENIED_GRACE: Duration = Duration::from_secs(30);

/// Follows the pod from creation to the end of the command, and judges
/// it. Works the same for a pod that already finished: its log is read from
/// the start. The caller makes the end final (`verdict::settle`).
pub fn follow(ctx: &Ctx, followed: &Followed, run_id: &str, cancel: &CancelToken, on_progress: &(dyn Fn(Progress) + Sync)) -> Ended {
    let namespace = &ctx.policy.namespace;
    let params = kube::watch::WatchParams { list: run_pods(run_id), ..kube::watch::WatchParams::default() };
    let watcher = ctx.client.watch(kube::Resource::PODS, namespace, params);
    let watch_abort = watcher.abort_handle();
    let (sender, receiver) = mpsc::channel::<Watched>();
    std::thread::scope(|scope| {
        scope.spawn(move || watch_pods(watcher, &sender));
        let ended = decide(ctx, followed, run_id, cancel, on_progress, &receiver, scope);
        watch_abort.abort();
        ended
    })
}

/// Feeds pod events to the decision loop until it stops listening. API
/// trouble is retried here for as long as the run lasts (the decision
/// loop's deadlines bound it), except refusals that outlive `DENIED_GRACE`
/// and answers that retrying cannot change.
fn watch_pods(mut watcher: kube::watch::Watcher, sender: &mpsc::Sender<Watched>) {
    let abort = watcher.abort_handle();
    let mut health = WatchHealth::default();
    loop {
        let sent = match watcher.next() {
            Ok(event) => {
                health.on_success();
                match event {
                    kube::watch::WatchEvent::Listed(pods) => sender.send(Watched::Listed(pods)).is_ok(),
                    kube::watch::WatchEvent::Added(pod) | kube::watch::WatchEvent::Modified(pod) => sender.send(Watched::Pod(pod)).is_ok(),
                    kube::watch::WatchEvent::Deleted(pod) => sender.send(Watched::Gone(pod)).is_ok(),
                }
            }
            Err(_) if abort.is_aborted() => return,
            Err(error) => match health.on_error(&error, Instant::now()) {
                Some(delay) => {
                    let sent = sender.send(Watched::Trouble(error.to_string())).is_ok();
                    sleep_unless_aborted(delay, &abort);
                    sent
                }
                None => {
                    let _ = sender.send(Watched::Failed(error.to_string()));
                    return;
                }
            },
        };
        if !sent {
            return;
        }
    }
}

/// Which watch errors are retried, and after how long (pure, for tests).
#[derive(Debug, Default)]
struct WatchHealth {
    failures: u32,
    /// Start of the current run of 401/403 answers.
    denied_since: Option<Instant>,
}

impl WatchHealth {
    fn on_success(&mut self) {
        self.failures = 0;
        self.denied_since = None;
    }

    /// The delay before the next try, or `None` to give up.
    fn on_error(&mut self, error: &kube::Error, now: Instant) -> Option<Duration> {
        let retry = if error.is_forbidden() || error.is_unauthorized() {
            let since = *self.denied_since.get_or_insert(now);
            now.duration_since(since) < DENIED_GRACE
        } else {
            // A refusal right after this counts as "right after reconnecting".
            self.denied_since = None;
            is_transient(error)
        };
        if !retry {
            return None;
        }
        self.failures = self.failures.saturating_add(1);
        Some(Duration::from_millis(250).saturating_mul(1 << self.failures.min(4)).min(Duration::from_secs(4)))
    }
}

/// Errors an API server that is restarting or overloaded gives.
fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Transport { .. } => true,
        kube::Error::Api { status, .. } => matches!(status.code, 408 | 410 | 429 | 500..=599),
        _ => false,
    }
}

fn sleep_unless_aborted(delay: Duration, abort: &kube::watch::Abort) {
    let deadline = Instant::now() + delay;
    while !abort.is_aborted() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The run's decision loop: the machine in `decide` decides; this feeds it
/// what the watch and the log follower report and does what it asks.
fn decide<'scope>(
    ctx: &'scope Ctx,
    followed: &Followed,
    run_id: &str,
    cancel: &CancelToken,
    on_progress: &'scope (dyn Fn(Progress) + Sync),
    pods: &mpsc::Receiver<Watched>,
    scope: &'scope std::thread::Scope<'scope, '_>,
) -> Ended {
    let mut machine = RunState::new(followed.deadlines(), Instant::now());
    let mut shell = Shell { ctx, followed, run_id, cancel, on_progress, last_pod: None, log: LogState::NotStarted };
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
    last_pod: Option<Value>,
    log: LogState<'scope>,
}

impl<'scope> Shell<'scope, '_> {
    /// What happened since the last look: a cancel, the watch's news (or a
    /// tick after 200 ms without any), a follower that finished.
    fn next_events(&mut self, machine: &RunState, pods: &mpsc::Receiver<Watched>) -> Vec<Event> {
        if self.cancel.is_cancelled() {
            return vec![Event::Cancelled];
        }
        let mut events = match pods.recv_timeout(Duration::from_millis(200)) {
            Ok(watched) => self.watched(machine, watched),
            Err(mpsc::RecvTimeoutError::Timeout) => vec![Event::Tick],
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(Duration::from_millis(200));
                vec![Event::Tick]
            }
        };
        if let LogState::Following((handle, _)) = &self.log
            && handle.is_finished()
        {
            let collector = std::mem::replace(&mut self.log, LogState::NotStarted).join(self.cancel);
            let end = LogEnd {
                has_result: collector.result.is_some(),
                terminated_by_request: collector.result.as_ref().is_some_and(|result| result.terminated_by_request),
                stop_asked_here: cancel_requested(self.ctx, self.run_id, self.cancel),
                reported: collector.live_stdout.len() + collector.live_stderr.len(),
            };
            self.log = LogState::Ended(Box::new(collector));
            events.push(Event::LogEnded(end));
        }
        events
    }

    fn watched(&mut self, machine: &RunState, watched: Watched) -> Vec<Event> {
        match watched {
            Watched::Listed(pods) => self.listed(pods),
            Watched::Pod(pod) => vec![self.seen(pod)],
            Watched::Gone(pod) => {
                let same = self.last_pod.as_ref().is_none_or(|last| last["metadata"]["name"] == pod["metadata"]["name"]);
                if !same {
                    return vec![Event::ApiBack];
                }
                let view = classify::sandbox_view(&pod);
                self.last_pod = Some(pod);
                vec![Event::Gone(view)]
            }
            Watched::Trouble(why) => {
                match machine.outage() {
                    None => {
                        metrics::api_error("watch_pods");
                        log::warn(
                            "the pod watch is failing; riding it out",
                            &[("run_id", self.run_id.into()), ("error", why.as_str().into())],
                        );
                    }
                    Some(current) if current != why => {
                        log::debug("the pod watch is still failing", &[("run_id", self.run_id.into()), ("error", why.as_str().into())]);
                    }
                    Some(_) => {}
                }
                vec![Event::ApiTrouble(why)]
            }
            Watched::Failed(message) => {
                metrics::api_error("watch_pods");
                vec![Event::ApiFailed(message)]
            }
        }
    }

    fn seen(&mut self, pod: Value) -> Event {
        let view = classify::sandbox_view(&pod);
        self.last_pod = Some(pod);
        Event::Seen(view)
    }

    /// A complete list of the run's pods: the newest is the one to judge;
    /// an empty list after a pod was seen means it is gone (deleted while
    /// the watch was away).
    fn listed(&mut self, pods: Vec<Value>) -> Vec<Event> {
        match newest_pod(pods) {
            Some(pod) => vec![Event::ApiBack, self.seen(pod)],
            None => match &self.last_pod {
                Some(last) => vec![Event::ApiBack, Event::Gone(classify::sandbox_view(last))],
                None => vec![Event::ApiBack],
            },
        }
    }

    /// Does what the machine asked; what came of it, as events.
    fn execute(&mut self, step: Step, scope: &'scope std::thread::Scope<'scope, '_>) -> Vec<Event> {
        match step {
            Step::FollowOutput { reported } => {
                if let Some(pod) = &self.last_pod {
                    self.log = LogState::Following(start_follower(self.ctx, pod, reported, self.on_progress, scope));
                }
                Vec::new()
            }
            Step::ReportStarted => {
                (self.on_progress)(Progress::Started);
                Vec::new()
            }
            Step::PollStartFailures => {
                let job_name = manifest::job_name(self.run_id);
                match job_failed_create(self.ctx, &self.ctx.policy.namespace, &job_name) {
                    Some((reason, message)) => vec![Event::StartFailed { reason, message: refusal_message(reason, &message) }],
                    None => Vec::new(),
                }
            }
            Step::ProbeSandbox => match self.ctx.client.list(kube::Resource::PODS, &self.ctx.policy.namespace, &run_pods(self.run_id)) {
                Ok(list) => {
                    log::info("the API server answers again", &[("run_id", self.run_id.into())]);
                    self.listed(list.items)
                }
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
                return Ended { outcome: judged_with_pod(&facts, collector, self.last_pod.as_ref()), by };
            }
            Verdict::Server(end) => end,
        };
        let outcome = match end {
            ServerEnd::Cancelled => cancelled(run_id, self.log.stop()),
            ServerEnd::StartTimeout => start_timeout(self.ctx, run_id, self.last_pod.as_ref()),
            ServerEnd::Unschedulable { message } => unschedulable(run_id, &message),
            ServerEnd::Refused { reason, message } => RunOutcome::without_result(run_id, RunStatus::Error, reason, message),
            ServerEnd::PastHardDeadline { outage } => {
                let facts = judged_facts(self.ctx, run_id, self.followed, None, self.cancel);
                past_hard_deadline(&facts, self.log.stop(), outage.as_ref())
            }
            ServerEnd::WatchFailed { message } => watch_failed(run_id, self.log.stop(), &message),
        };
        Ended { outcome, by: DecidedBy::Server }
    }
}

/// The judging facts besides the log, owned (the judge borrows them).
struct Facts {
    run_id: String,
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
        }
    }
}

fn judged_facts(ctx: &Ctx, run_id: &str, followed: &Followed, finished: Option<Finished>, cancel: &CancelToken) -> Facts {
    Facts {
        run_id: run_id.to_string(),
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

/// Judges a run from its collected log and the pod's last known status.
fn judged_with_pod(facts: &Facts, collector: Collector, pod: Option<&Value>) -> RunOutcome {
    let mut outcome = outcome::judge(&facts.judged(), collector);
    if let Some(pod) = pod {
        outcome.times.scheduled = classify::scheduled_at(pod);
        outcome.times.started = outcome.times.started.or_else(|| classify::main_started_at(pod));
        outcome.times.finished = outcome.times.finished.or_else(|| classify::main_finished_at(pod));
    }
    outcome
}

/// The pod did not start in time: says what it was doing, from its status
/// and events (issue 12, finding 3). The caller stops it for good.
/// No node could take the pod within the grace (sync) or the start
/// timeout (background); the pod is stopped by the caller of this.
fn unschedulable(run_id: &str, message: &str) -> RunOutcome {
    RunOutcome::without_result(
        run_id,
        RunStatus::Error,
        RunReason::Unschedulable,
        format!(
            "no node can run the pod: {message}; the pod was deleted and will not run; lower limits.cpu / limits.memory or ask the operator for capacity"
        ),
    )
}

fn start_timeout(ctx: &Ctx, run_id: &str, pod: Option<&Value>) -> RunOutcome {
    let events = pod.and_then(|pod| pod["metadata"]["name"].as_str()).map(|name| pod_events(ctx, name)).unwrap_or_default();
    let progress = classify::start_progress(pod, &events);
    RunOutcome::without_result(
        run_id,
        RunStatus::Error,
        RunReason::StartTimeout,
        format!(
            "the pod did not start within {} s (MCP_K8S_START_TIMEOUT_S): {progress}; the pod was stopped and the command will not run; retry, or ask the operator to raise MCP_K8S_START_TIMEOUT_S or pre-pull the image",
            ctx.policy.start_timeout.as_secs()
        ),
    )
}

/// The pod's events, oldest first; none when they cannot be read.
fn pod_events(ctx: &Ctx, pod_name: &str) -> Vec<Value> {
    let params =
        kube::ListParams { label_selector: None, field_selector: Some(format!("involvedObject.kind=Pod,involvedObject.name={pod_name}")) };
    let mut events = match ctx.client.list(kube::Resource::EVENTS, &ctx.policy.namespace, &params) {
        Ok(list) => list.items,
        Err(_) => {
            metrics::api_error("list_events");
            return Vec::new();
        }
    };
    let time = |event: &Value| {
        let text = event["lastTimestamp"].as_str().or_else(|| event["eventTime"].as_str()).unwrap_or_default();
        text.to_string()
    };
    events.sort_by_key(time);
    events
}

/// The hard deadline passed: the pod's own deadline is behind us, so the
/// kubelet has stopped the pod whatever this server saw.
fn past_hard_deadline(facts: &Facts, collector: Collector, outage: Option<&Away>) -> RunOutcome {
    let mut outcome = outcome::judge(&facts.judged(), collector);
    match outage {
        Some(outage) => {
            outcome.status = RunStatus::Error;
            outcome.reason = Some(RunReason::ApiError);
            outcome.message = format!(
                "the API server has not answered for {} s ({}); the pod's own deadline has passed, so the kubelet stopped it, but its result could not be read; the output read so far is included",
                outage.duration.as_secs(),
                outage.why
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

fn watch_failed(run_id: &str, collector: Collector, message: &str) -> RunOutcome {
    let mut outcome = RunOutcome::without_result(
        run_id,
        RunStatus::Error,
        RunReason::ApiError,
        // Whether the pod could be stopped is said by the caller of
        // `follow` (a note when it could not): this text makes no claim.
        format!("watching the pod failed: {message}; the server gave up on the run; check its permissions (mcp-k8s-ephemeral-job doctor)"),
    );
    outcome.stdout = collector.live_stdout;
    outcome.stderr = collector.live_stderr;
    outcome
}

fn run_pods(run_id: &str) -> kube::ListParams {
    kube::ListParams { label_selector: Some(format!("{}={run_id}", manifest::LABEL_RUN_ID)), field_selector: None }
}

/// The most recently created of the run's pods.
fn newest_pod(pods: Vec<Value>) -> Option<Value> {
    pods.into_iter().max_by_key(|pod| pod["metadata"]["creationTimestamp"].as_str().unwrap_or_default().to_string())
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
                handle.join().unwrap_or_else(|_| Collector::new(0, 0))
            }
            LogState::Ended(collector) => *collector,
        }
    }

    /// What was read, closing the stream at once.
    fn stop(&mut self) -> Collector {
        match std::mem::replace(self, LogState::NotStarted) {
            LogState::Following((handle, stop)) => {
                stop.stop();
                handle.join().unwrap_or_else(|_| Collector::new(0, 0))
            }
            other => other.join(&CancelToken::new()),
        }
    }
}

/// Stops the log follower from the decision thread: closes the stream that
/// is open now and keeps any later one from opening.
#[derive(Clone, Default)]
struct StreamStop {
    stopped: std::sync::Arc<std::sync::atomic::AtomicBool>,
    current: std::sync::Arc<std::sync::Mutex<Option<kube::watch::Abort>>>,
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
    fn set(&self, abort: kube::watch::Abort) {
        let mut current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.is_stopped() {
            abort.abort();
        } else {
            *current = Some(abort);
        }
    }
}

/// Starts following the main container's log on its own thread; the
/// first `already_reported` live bytes were reported by an earlier reader.
fn start_follower<'scope>(
    ctx: &'scope Ctx,
    pod: &Value,
    already_reported: usize,
    on_progress: &'scope (dyn Fn(Progress) + Sync),
    scope: &'scope std::thread::Scope<'scope, '_>,
) -> Follower<'scope> {
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let stop = StreamStop::default();
    let follower_stop = stop.clone();
    let handle = scope.spawn(move || follow_log(ctx, &pod_name, &follower_stop, already_reported, on_progress));
    (handle, stop)
}

/// Reads the followed log into a collector. A stream that breaks before the
/// result arrived is opened again from the start (the collector restarts,
/// so nothing is counted twice, and live output already reported is not
/// reported again). A container that is not ready yet (400) and an API
/// server that does not answer are waited for: the decision loop's
/// deadlines stop this reader, so it never gives up on its own, except
/// when the pod is gone (404).
fn follow_log(
    ctx: &Ctx,
    pod_name: &str,
    stop: &StreamStop,
    mut already_reported: usize,
    on_progress: &(dyn Fn(Progress) + Sync),
) -> Collector {
    let policy = &ctx.policy;
    let params = kube::LogParams { container: Some(manifest::MAIN_CONTAINER.to_string()), ..kube::LogParams::default() };
    let mut collector = Collector::new(policy.max_output_bytes, policy.max_artifact_bytes);
    let mut failures = 0u32;
    while !stop.is_stopped() {
        let mut stream = match ctx.client.follow_pod_logs(&policy.namespace, pod_name, &params) {
            Ok(stream) => stream,
            Err(error) if error.is_not_found() => {
                metrics::api_error("follow_log");
                collector.problems.push(format!("the log could not be read: {error}"));
                break;
            }
            Err(_) => {
                failures = failures.saturating_add(1);
                let delay = Duration::from_millis(300).saturating_mul(failures.min(7));
                let until = Instant::now() + delay;
                while !stop.is_stopped() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(50));
                }
                continue;
            }
        };
        stop.set(stream.abort_handle());
        let mut fresh = Collector::new(policy.max_output_bytes, policy.max_artifact_bytes);
        let mut seen = 0usize;
        let read = fresh.read_all(&mut stream, &mut |mut chunk| {
            let end = seen + chunk.bytes.len();
            if end > already_reported {
                chunk.bytes.drain(..already_reported.saturating_sub(seen));
                on_progress(Progress::Output(chunk));
            }
            seen = end;
        });
        already_reported = already_reported.max(seen);
        collector = fresh;
        if read.is_ok() || collector.result.is_some() || stop.is_stopped() {
            break;
        }
    }
    collector
}

fn cancelled(run_id: &str, collector: Collector) -> RunOutcome {
    let mut outcome = RunOutcome::without_result(
        run_id,
        RunStatus::Cancelled,
        RunReason::Cancelled,
        "the run was cancelled and its pod deleted; the output read so far is included".into(),
    );
    outcome.stdout = collector.live_stdout;
    outcome.stderr = collector.live_stderr;
    outcome.truncated.stdout = true;
    outcome.truncated.stderr = true;
    outcome
}

fn job_failed_create(ctx: &Ctx, namespace: &str, job_name: &str) -> Option<(RunReason, String)> {
    let params =
        kube::ListParams { label_selector: None, field_selector: Some(format!("involvedObject.kind=Job,involvedObject.name={job_name}")) };
    // A failed look is not fatal: the start timeout still ends the run.
    let events = match ctx.client.list(kube::Resource::EVENTS, namespace, &params) {
        Ok(events) => events,
        Err(_) => {
            metrics::api_error("list_events");
            return None;
        }
    };
    classify::failed_create(&events.items)
}

fn refusal_message(reason: RunReason, api_message: &str) -> String {
    match reason {
        RunReason::QuotaExceeded => format!(
            "the namespace's ResourceQuota has no room for this pod: {api_message}; wait for other runs to finish, lower limits, or ask the operator to raise the quota"
        ),
        _ => format!("the cluster refused the pod: {api_message}"),
    }
}

fn api_refusal(run_id: &str, what: &str, error: &kube::Error) -> RunOutcome {
    let reason = if error.is_quota_exceeded() {
        RunReason::QuotaExceeded
    } else if (error.is_forbidden() && error.permission_denied().is_none()) || error.is_invalid() {
        // An RBAC refusal is the server's own missing permission, not the
        // pod being refused: it stays ApiError, whose message names the
        // verb and resource to grant (issue 12, finding 13).
        RunReason::Rejected
    } else {
        RunReason::ApiError
    };
    let message = match reason {
        RunReason::QuotaExceeded | RunReason::Rejected => refusal_message(reason, &error.to_string()),
        _ => format!("could not {what}: {error}; the run did not start"),
    };
    RunOutcome::without_result(run_id, RunStatus::Error, reason, message)
}

fn classify_time(value: &Value) -> Option<SystemTime> {
    classify::parse_time(value.as_str()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        let status = kube::error::Status { code, reason: String::new(), message: String::new(), ..kube::error::Status::default() };
        kube::Error::Api { verb: "GET", path: "/api/v1/namespaces/ns/pods?watch=1".into(), status: Box::new(status) }
    }

    fn refused() -> kube::Error {
        kube::Error::Transport { verb: "GET", path: "/api/v1/namespaces/ns/pods".into(), message: "Connection refused".into() }
    }

    /// Issue 12, finding 10: an outage is ridden out, a 403 right after it
    /// gets `DENIED_GRACE`, a refusal that lasts ends the run.
    #[test]
    fn issue_12_10_watch_errors_are_retried_within_bounds() {
        let start = Instant::now();
        let mut health = WatchHealth::default();
        for second in 0..25 {
            assert!(health.on_error(&refused(), start + Duration::from_secs(second)).is_some(), "refused at {second} s");
        }
        assert!(health.on_error(&api_error(503), start + Duration::from_secs(26)).is_some());
        let back = start + Duration::from_secs(27);
        assert!(health.on_error(&api_error(403), back).is_some(), "403 right after the outage");
        assert!(health.on_error(&api_error(403), back + Duration::from_secs(29)).is_some());
        assert!(health.on_error(&api_error(403), back + DENIED_GRACE).is_none(), "403 for DENIED_GRACE is real");
        let mut health = WatchHealth::default();
        assert!(health.on_error(&api_error(401), start).is_some());
        health.on_success();
        assert!(health.on_error(&api_error(403), start + Duration::from_secs(40)).is_some(), "a success resets the grace");
        assert!(WatchHealth::default().on_error(&api_error(404), start).is_none(), "the namespace is gone");
        let decode = kube::Error::Decode { verb: "GET", path: "/x".into(), message: "bad".into() };
        assert!(WatchHealth::default().on_error(&decode, start).is_none());
    }

    #[test]
    fn retry_delays_grow_and_stay_bounded() {
        let mut health = WatchHealth::default();
        let delays: Vec<Duration> = (0..8).filter_map(|_| health.on_error(&refused(), Instant::now())).collect();
        assert_eq!(delays[0], Duration::from_millis(500));
        assert!(delays.windows(2).all(|pair| pair[0] <= pair[1]));
        assert_eq!(*delays.last().unwrap(), Duration::from_secs(4));
    }

    #[test]
    fn a_pods_view_sees_deletion_before_the_final_status() {
        let running = serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Running"}});
        let view = classify::sandbox_view(&running);
        assert_eq!(view.ended, None);
        assert!(view.if_gone.deleted, "a running pod that disappears was deleted");
        let deleting =
            serde_json::json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}});
        assert!(classify::sandbox_view(&deleting).ended.unwrap().deleted);
        let evicted = serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Failed", "reason": "Evicted", "message": "m"}});
        let facts = classify::sandbox_view(&evicted).ended.unwrap();
        assert_eq!((facts.pod_reason.as_deref(), facts.deleted), (Some("Evicted"), false));
    }
}
