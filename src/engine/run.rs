//! One run, start to finish: take a slot, create the Job (and its inputs
//! Secret), watch the pod, fail fast with a reason when it cannot start,
//! follow the main container's log while the command runs, judge the
//! outcome, and delete everything it created, whatever happened.
//!
//! Threads are scoped to the run: one follows the pod watch, one the log;
//! the run's own thread decides. Cancellation (an MCP cancel, a shutdown)
//! deletes the Job at once and returns what was read so far.

use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::engine::cancel::CancelToken;
use crate::engine::classify::{self, PodState};
use crate::engine::collect::{Collector, LiveChunk};
use crate::engine::manifest;
use crate::engine::outcome::{self, Judged};
use crate::engine::slots::{SlotError, Slots};
use crate::engine::spec::{Policy, RunOutcome, RunReason, RunSpec, RunStatus};
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
/// How often Job events are checked while no pod exists.
const EVENT_POLL: Duration = Duration::from_secs(2);

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
    let mut outcome = follow(ctx, &followed, run_id, cancel, &on_progress);
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
    /// `UNSCHEDULABLE_GRACE` for a caller who waits; a background run
    /// waits for capacity up to its start deadline (issue 12, finding 15).
    pub unschedulable_grace: Duration,
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
            unschedulable_grace: UNSCHEDULABLE_GRACE,
            hard_deadline: now + manifest::pod_deadline(spec, policy) + HARD_DEADLINE_SLACK,
        }
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

enum Watched {
    Pod(Value),
    Failed(String),
}

/// Follows the pod from creation to the end of the command, and judges
/// it. Works the same for a pod that already finished: its log is read from
/// the start.
pub fn follow(ctx: &Ctx, followed: &Followed, run_id: &str, cancel: &CancelToken, on_progress: &(dyn Fn(Progress) + Sync)) -> RunOutcome {
    let namespace = &ctx.policy.namespace;
    let selector = format!("{}={run_id}", manifest::LABEL_RUN_ID);
    let params = kube::watch::WatchParams {
        list: kube::ListParams { label_selector: Some(selector), field_selector: None },
        ..kube::watch::WatchParams::default()
    };
    let mut watcher = ctx.client.watch(kube::Resource::PODS, namespace, params);
    let watch_abort = watcher.abort_handle();
    let (sender, receiver) = mpsc::channel::<Watched>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            loop {
                let sent = match watcher.next() {
                    Ok(kube::watch::WatchEvent::Listed(pods)) => pods.into_iter().all(|pod| sender.send(Watched::Pod(pod)).is_ok()),
                    Ok(kube::watch::WatchEvent::Added(pod) | kube::watch::WatchEvent::Modified(pod)) => {
                        sender.send(Watched::Pod(pod)).is_ok()
                    }
                    Ok(kube::watch::WatchEvent::Deleted(_)) => true,
                    Err(error) => {
                        let _ = sender.send(Watched::Failed(error.to_string()));
                        false
                    }
                };
                if !sent {
                    return;
                }
            }
        });
        let outcome = decide(ctx, followed, run_id, cancel, on_progress, &receiver, scope);
        watch_abort.abort();
        outcome
    })
}

/// The run's decision loop; see the module doc.
fn decide<'scope>(
    ctx: &'scope Ctx,
    followed: &Followed,
    run_id: &str,
    cancel: &CancelToken,
    on_progress: &'scope (dyn Fn(Progress) + Sync),
    pods: &mpsc::Receiver<Watched>,
    scope: &'scope std::thread::Scope<'scope, '_>,
) -> RunOutcome {
    let namespace = &ctx.policy.namespace;
    let job_name = manifest::job_name(run_id);
    let (start_deadline, hard_deadline) = (followed.start_deadline, followed.hard_deadline);
    let mut last_pod: Option<Value> = None;
    let mut unschedulable_since: Option<Instant> = None;
    let mut last_waiting = String::from("the pod was not created yet");
    let mut next_event_poll = Instant::now() + EVENT_POLL;
    let mut log = LogState::NotStarted;
    let mut started_reported = false;

    loop {
        if cancel.is_cancelled() {
            return cancelled(run_id, log.stop());
        }
        let now = Instant::now();
        if matches!(log, LogState::NotStarted) && now >= start_deadline {
            // A background run waits for capacity up to here; if it never
            // came, that is the reason to report.
            let (reason, advice) = match unschedulable_since {
                Some(_) => (RunReason::Unschedulable, "; lower limits.cpu / limits.memory or ask the operator for capacity"),
                None => (RunReason::StartTimeout, ""),
            };
            return RunOutcome::without_result(
                run_id,
                RunStatus::Error,
                reason,
                format!(
                    "the pod did not start within {} s (MCP_K8S_START_TIMEOUT_S): {last_waiting}{advice}",
                    ctx.policy.start_timeout.as_secs()
                ),
            );
        }
        if now >= hard_deadline {
            let memory_limit = followed.memory_limit.as_deref();
            let facts = Judged { run_id, timeout: followed.timeout, memory_limit, finished: None };
            let mut outcome = outcome::judge(&facts, log.stop());
            outcome.status = RunStatus::TimedOut;
            outcome.reason = Some(RunReason::DeadlineExceeded);
            outcome.message = "the run passed its hard deadline without the runner reporting; output so far is included".into();
            return outcome;
        }
        if last_pod.is_none() && now >= next_event_poll {
            next_event_poll = now + EVENT_POLL;
            if let Some((reason, message)) = job_failed_create(ctx, namespace, &job_name) {
                return RunOutcome::without_result(run_id, RunStatus::Error, reason, refusal_message(reason, &message));
            }
        }
        match pods.recv_timeout(Duration::from_millis(200)) {
            Ok(Watched::Pod(pod)) => last_pod = Some(pod),
            Ok(Watched::Failed(message)) => {
                metrics::api_error("watch_pods");
                let collector = log.stop();
                let mut outcome = RunOutcome::without_result(
                    run_id,
                    RunStatus::Error,
                    RunReason::ApiError,
                    format!("watching the pod failed: {message}; the run was stopped"),
                );
                outcome.stdout = collector.live_stdout;
                outcome.stderr = collector.live_stderr;
                return outcome;
            }
            // No news: the pod's state is judged again anyway, because
            // some decisions (the unschedulable grace) depend on time alone.
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(200)),
        }
        // The runner's result is its last word: once the follower has it,
        // the run is over even if the pod's status has not caught up.
        if let LogState::Following((handle, _)) = &log
            && handle.is_finished()
        {
            let collector = std::mem::replace(&mut log, LogState::NotStarted).join(cancel);
            if collector.result.is_some() {
                return judged_with_pod(run_id, followed, collector, last_pod.as_ref());
            }
            // The log ended without a result: wait for the pod's final
            // status to say why.
            log = LogState::Ended(Box::new(collector));
        }
        let Some(pod) = &last_pod else { continue };
        let state = classify::pod_state(pod);
        if !matches!(state, PodState::Unschedulable { .. }) {
            unschedulable_since = None;
        }
        match state {
            PodState::Pending { waiting_reason, message } => {
                last_waiting = match (waiting_reason, message) {
                    (Some(reason), Some(message)) => format!("{reason}: {message}"),
                    (Some(reason), None) => reason,
                    _ => "the pod is pending".to_string(),
                };
            }
            PodState::Unschedulable { message } => {
                let since = *unschedulable_since.get_or_insert(now);
                last_waiting = format!("unschedulable: {message}");
                if now.duration_since(since) >= followed.unschedulable_grace {
                    return RunOutcome::without_result(
                        run_id,
                        RunStatus::Error,
                        RunReason::Unschedulable,
                        format!("no node can run the pod: {message}; lower limits.cpu / limits.memory or ask the operator for capacity"),
                    );
                }
            }
            PodState::FailFast { reason, message } => {
                return RunOutcome::without_result(run_id, RunStatus::Error, reason, message);
            }
            PodState::Running => {
                if !started_reported {
                    started_reported = true;
                    on_progress(Progress::Started);
                }
                if matches!(log, LogState::NotStarted) {
                    log = LogState::Following(start_follower(ctx, pod, on_progress, scope));
                }
            }
            PodState::Finished(_) => {
                if matches!(log, LogState::NotStarted) {
                    log = LogState::Following(start_follower(ctx, pod, on_progress, scope));
                }
                return judged_with_pod(run_id, followed, log.join(cancel), Some(pod));
            }
        }
    }
}

/// Judges a run from its collected log and the pod's last known status.
fn judged_with_pod(run_id: &str, followed: &Followed, collector: Collector, pod: Option<&Value>) -> RunOutcome {
    let finished = match pod.map(classify::pod_state) {
        Some(PodState::Finished(finished)) => Some(finished),
        _ => None,
    };
    let memory_limit = followed.memory_limit.as_deref();
    let facts = Judged { run_id, timeout: followed.timeout, memory_limit, finished: finished.as_ref() };
    let mut outcome = outcome::judge(&facts, collector);
    if let Some(pod) = pod {
        outcome.times.scheduled = classify::scheduled_at(pod);
        outcome.times.started = outcome.times.started.or_else(|| classify::main_started_at(pod));
        outcome.times.finished = outcome.times.finished.or_else(|| classify::main_finished_at(pod));
    }
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

/// Starts following the main container's log on its own thread.
fn start_follower<'scope>(
    ctx: &'scope Ctx,
    pod: &Value,
    on_progress: &'scope (dyn Fn(Progress) + Sync),
    scope: &'scope std::thread::Scope<'scope, '_>,
) -> Follower<'scope> {
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let stop = StreamStop::default();
    let follower_stop = stop.clone();
    let handle = scope.spawn(move || follow_log(ctx, &pod_name, &follower_stop, on_progress));
    (handle, stop)
}

/// Reads the followed log into a collector. A stream that breaks before the
/// result arrived is opened again from the start (the collector restarts,
/// so nothing is counted twice); a container that is not ready yet (400) is
/// waited for.
fn follow_log(ctx: &Ctx, pod_name: &str, stop: &StreamStop, on_progress: &(dyn Fn(Progress) + Sync)) -> Collector {
    let policy = &ctx.policy;
    let params = kube::LogParams { container: Some(manifest::MAIN_CONTAINER.to_string()), ..kube::LogParams::default() };
    let mut collector = Collector::new(policy.max_output_bytes, policy.max_artifact_bytes);
    for attempt in 0..20 {
        if stop.is_stopped() {
            break;
        }
        let mut stream = match ctx.client.follow_pod_logs(&policy.namespace, pod_name, &params) {
            Ok(stream) => stream,
            Err(error) => {
                if attempt == 19 {
                    metrics::api_error("follow_log");
                    collector.problems.push(format!("the log could not be read: {error}"));
                }
                std::thread::sleep(Duration::from_millis(300));
                continue;
            }
        };
        stop.set(stream.abort_handle());
        let mut fresh = Collector::new(policy.max_output_bytes, policy.max_artifact_bytes);
        // Live output already reported before a reconnect is not reported again.
        let already_live = collector.live_stdout.len() + collector.live_stderr.len();
        let mut seen = 0usize;
        let read = fresh.read_all(&mut stream, &mut |chunk| {
            seen += chunk.bytes.len();
            if seen > already_live {
                on_progress(Progress::Output(chunk));
            }
        });
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
    } else if error.is_forbidden() || error.is_invalid() {
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
