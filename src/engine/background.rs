//! Background runs (issue 6): submit, fetch, cancel and list, with the
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
//! A run's verdict is written onto its Job (`engine::verdict`) before it is
//! cached or returned, and a re-attach reads it before anything else, so a
//! token has one result in every process (issue 12).
//!
//! Background runs do not take an `MCP_K8S_MAX_CONCURRENT` slot: a slot
//! bounds what this process waits on, while a background Job lives in the
//! cluster whether or not this process does, and waiting for a slot in
//! memory would make a submitted run vanish with a restart. The store caps
//! how many are in flight instead (`Limits::max_running`).
//!
//! Knows Kubernetes and the engine; nothing of MCP.

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::backend::kubernetes::classify;
use crate::backend::kubernetes::manifest;
use crate::backend::kubernetes::record::{self, JobRecord};
use crate::cancel::CancelToken;
use crate::engine::jobs::{Lookup, Phase, Seen, View};
use crate::engine::run::{self, Ctx, Followed, Progress};
use crate::engine::spec::{RunOutcome, RunReason, RunSpec, RunStatus};
use crate::engine::verdict::{self, DecidedBy, Ended, Recorded, Settled};
use crate::kube;
use crate::kube::objects::{Job, Pod};
use crate::log;
use crate::sandbox::frame::Stream;

/// How long the runner may take to report the output so far after a
/// cancel deleted its pod, before the follower is stopped outright.
const CANCEL_DRAIN: Duration = Duration::from_secs(15);
/// Longest program name kept in `record::ANNOTATION_COMMAND`.
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
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// Not a token this server hands out, or its Job never existed here.
    Unknown { token: String },
    /// The result was kept for `result_ttl_s` after the run and is gone.
    Expired { token: String, result_ttl_s: u64 },
    /// Too many background runs in flight.
    Full { running: usize },
    /// The cluster refused to create the run; the message says why.
    Refused { message: String },
    /// `cancel` on a run that has already finished.
    AlreadyFinished { token: String },
    /// An API call failed.
    Api { what: &'static str, message: String },
}

impl fmt::Display for Error {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unknown { token } => write!(
                formatter,
                "unknown job_token `{token}`: no such background job in this namespace; use the token submit_job returned, or find it with list_jobs"
            ),
            Error::Expired { token, result_ttl_s } => write!(
                formatter,
                "job_token `{token}` has expired: results are kept {result_ttl_s} s after the job ends (MCP_K8S_RESULT_TTL_S); submit the job again"
            ),
            Error::Full { running } => write!(
                formatter,
                "{running} background jobs are in flight, the most this server allows (MCP_K8S_MAX_CONCURRENT + MCP_K8S_MAX_QUEUED); fetch or cancel some, then retry"
            ),
            Error::Refused { message } => write!(formatter, "{message}"),
            Error::AlreadyFinished { token } => {
                write!(formatter, "job `{token}` has already finished; fetch_job returns its result")
            }
            Error::Api { what, message } => write!(formatter, "could not {what}: {message}; retry shortly"),
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

/// The token for a run submitted at `submitted`: the run id (128 random
/// bits, so unguessable) and the submit time, so that a token whose Job is
/// gone can be told apart as expired rather than unknown.
pub fn token_for(run_id: &str, submitted: SystemTime) -> String {
    let seconds = submitted.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    format!("job-{run_id}-{seconds}")
}

/// `(run_id, submitted)` from a token; `None` unless it has the exact shape
/// `token_for` writes, so nothing else reaches a Kubernetes name.
pub fn parse_token(token: &str) -> Option<(String, SystemTime)> {
    let rest = token.strip_prefix("job-")?;
    let (run_id, seconds) = rest.split_once('-')?;
    let hex = run_id.len() == 32 && run_id.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'));
    let digits = !seconds.is_empty() && seconds.len() <= 12 && seconds.bytes().all(|byte| byte.is_ascii_digit());
    if !hex || !digits {
        return None;
    }
    Some((run_id.to_string(), UNIX_EPOCH + Duration::from_secs(seconds.parse().ok()?)))
}

/// Creates the run's Job (kept after it ends) and starts following it.
/// Returns once the Job exists, so the token is durable when returned.
pub fn submit(ctx: &Ctx, spec: &RunSpec) -> Result<Submitted, Error> {
    let run_id = run::new_run_id();
    let token = token_for(&run_id, SystemTime::now());
    let cancel = CancelToken::new();
    ctx.jobs.insert_new(&run_id, &token, cancel.clone()).map_err(|full| Error::Full { running: full.running })?;
    let mut followed = Followed::from_spec(spec, &ctx.policy);
    // Nobody waits on a background run, so it waits for capacity (a node
    // freeing CPU) up to its start timeout instead of the sync grace.
    followed.unschedulable_grace = None;
    let retention = manifest::Retention {
        expires_at: run::rfc3339_after(
            manifest::pod_deadline(spec, &ctx.policy) + manifest::JOB_DEADLINE_SLACK + ctx.jobs.limits().result_ttl,
        ),
        finished_ttl: ctx.jobs.limits().result_ttl,
        background: Some(background_annotations(spec, &token)),
    };
    let created = match run::create(ctx, spec, &run_id, &retention) {
        Ok(created) => created,
        Err(outcome) => {
            ctx.jobs.remove(&run_id);
            return Err(Error::Refused { message: outcome.message });
        }
    };
    let created_at = time_of(Job::from_value(&created.job).metadata.creation_timestamp.as_deref());
    start_follower(ctx, &run_id, followed, created_at, cancel);
    Ok(Submitted { token, run_id })
}

/// The run's current view, waiting up to `wait` for it to finish. New live
/// output goes to `on_output` while waiting; `stop` ends the wait early.
pub fn fetch(ctx: &Ctx, token: &str, wait: Duration, stop: &CancelToken, on_output: &mut dyn FnMut(Stream, &[u8])) -> Result<View, Error> {
    let deadline = Instant::now() + wait;
    // Seen output starts at "everything so far": the reply carries it.
    let mut seen: Option<Seen> = None;
    // Two rounds: an entry evicted while waiting is found in the cluster.
    for _ in 0..2 {
        let (run_id, _) = ensure_known(ctx, token)?;
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
/// 11 s each (issue 12, finding 15); the rest now happens on a thread of
/// its own (`finish_cancel`), and `fetch_job` returns the `cancelled`
/// result once the follower has it.
pub fn cancel(ctx: &Ctx, token: &str) -> Result<View, Error> {
    let (run_id, view) = ensure_known(ctx, token)?;
    if view.phase == Phase::Finished {
        return Err(Error::AlreadyFinished { token: token.to_string() });
    }
    let namespace = &ctx.policy.namespace;
    // A Job that already ended, but whose log is still being read here,
    // must keep its pod: the result is in that log.
    let job = ctx
        .client
        .get_if_exists(kube::Resource::JOBS, namespace, &manifest::job_name(&run_id))
        .map_err(|error| Error::Api { what: "look up the Job", message: error.to_string() })?;
    let job = job.map(|job| Job::from_value(&job));
    if job.as_ref().is_some_and(|job| job_finished_at(job).is_some() || verdict::recorded_view(job).is_some()) {
        // Let this process's follower take the ended run's result first, so
        // a fetch_job right after this answer has it.
        ctx.jobs.wait(&run_id, Instant::now() + CANCEL_DRAIN, &CancelToken::new(), &mut Seen::default(), &mut |_, _| {});
        return Err(Error::AlreadyFinished { token: token.to_string() });
    }
    let Some(follower) = ctx.jobs.request_cancel(&run_id) else {
        return Err(Error::Unknown { token: token.to_string() });
    };
    let patch = json!({"metadata": {"annotations": record::cancel_mark(SystemTime::now())}});
    if let Err(error) = ctx.client.merge_patch(kube::Resource::JOBS, namespace, &manifest::job_name(&run_id), &patch) {
        // The run is still stopped; only another process's view of why
        // its pod vanished is poorer.
        log::warn("could not mark the job cancelled", &[("run_id", run_id.as_str().into()), ("error", error.to_string().into())]);
    }
    delete_pods(ctx, &run_id);
    let thread_ctx = ctx.clone();
    let thread_run_id = run_id.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("cancel-{}", &run_id[..8.min(run_id.len())]))
        .spawn(move || finish_cancel(&thread_ctx, &thread_run_id, &follower));
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
    delete_pods(ctx, run_id);
}

/// The background Jobs in the namespace, newest first.
pub fn list(ctx: &Ctx) -> Result<Vec<Listed>, Error> {
    let params = kube::ListParams {
        label_selector: Some(format!(
            "{}={},{}={}",
            manifest::LABEL_MANAGED_BY,
            manifest::MANAGED_BY,
            manifest::LABEL_MODE,
            manifest::MODE_BACKGROUND
        )),
        field_selector: None,
    };
    let jobs = ctx
        .client
        .list(kube::Resource::JOBS, &ctx.policy.namespace, &params)
        .map_err(|error| Error::Api { what: "list the background Jobs", message: error.to_string() })?;
    let mut listed: Vec<Listed> = jobs.items.iter().filter_map(|job| listed_job(ctx, job)).collect();
    listed.sort_by_key(|listed| std::cmp::Reverse(listed.created));
    Ok(listed)
}

/// The run's view without waiting (`tasks/get`).
pub fn status(ctx: &Ctx, token: &str) -> Result<View, Error> {
    fetch(ctx, token, Duration::ZERO, &CancelToken::new(), &mut |_, _| {})
}

/// Makes sure the store knows the run: from memory, or by re-attaching to
/// its Job. Returns the run id and the current view.
fn ensure_known(ctx: &Ctx, token: &str) -> Result<(String, View), Error> {
    let Some((run_id, _)) = parse_token(token) else {
        return Err(Error::Unknown { token: token.to_string() });
    };
    match ctx.jobs.lookup(&run_id) {
        Lookup::Found(view) if view.token == token => return Ok((run_id, view)),
        Lookup::Found(_) => return Err(Error::Unknown { token: token.to_string() }),
        Lookup::Expired => return Err(expired(ctx, token)),
        Lookup::Missing => {}
    }
    attach(ctx, token, &run_id)?;
    match ctx.jobs.lookup(&run_id) {
        Lookup::Found(view) => Ok((run_id, view)),
        Lookup::Expired => Err(expired(ctx, token)),
        // The Job exists (attach found it), but its outcome could not be
        // recorded or it could not be followed: nothing is cached.
        Lookup::Missing => Err(Error::Api {
            what: "settle the job's outcome",
            message: "the API server did not accept the outcome (see the server log)".into(),
        }),
    }
}

/// Finds the run's Job and makes the store know it, before the caller
/// answers (issue 12, finding 4): a recorded verdict is taken as it is
/// (never judged again over a later pod), a run that has ended is read to
/// its end on this thread, and only a run still going gets a follower. The
/// Job must carry exactly this token, so a token with a forged time does
/// not reach it.
fn attach(ctx: &Ctx, token: &str, run_id: &str) -> Result<(), Error> {
    let namespace = &ctx.policy.namespace;
    let job = ctx
        .client
        .get_if_exists(kube::Resource::JOBS, namespace, &manifest::job_name(run_id))
        .map_err(|error| Error::Api { what: "look up the Job", message: error.to_string() })?;
    // A Job without a record (no token) is not a background run's.
    let job = job.map(|job| Job::from_value(&job));
    let job_record = job.as_ref().and_then(|job| JobRecord::from_job(job).ok());
    let (Some(job), Some(job_record)) = (job, job_record.filter(|job_record| job_record.token == token)) else {
        return Err(gone(ctx, token));
    };
    let recorded = job_record.outcome.clone();
    let ended_at = recorded.as_ref().and_then(|recorded| recorded.ended_at).or_else(|| job_finished_at(&job));
    if ended_at.is_some_and(|at| at + ctx.jobs.limits().result_ttl <= SystemTime::now()) {
        // The TTL controller has not got to it yet; the result is expired
        // all the same.
        return Err(expired(ctx, token));
    }
    let pods = ctx
        .client
        .list(kube::Resource::PODS, namespace, &run_selector(run_id))
        .map_err(|error| Error::Api { what: "list the job's pods", message: error.to_string() })?;
    let pod = pods.items.iter().map(Pod::from_value).max_by_key(|pod| pod.metadata.creation_timestamp.clone().unwrap_or_default());
    let created = time_of(job.metadata.creation_timestamp.as_deref());
    let cancel = CancelToken::new();
    if !ctx.jobs.insert_found(run_id, token, created.unwrap_or_else(SystemTime::now), cancel.clone()) {
        return Ok(());
    }
    log::info("re-attaching to a background job", &[("run_id", run_id.into())]);
    let followed = followed_from_job(ctx, &job, &job_record);
    match (&recorded, &pod) {
        // The runner's verdict, and its log is still there: read the
        // output; `follow_to_end` keeps the recorded verdict.
        (Some(recorded), Some(_)) if recorded.by == DecidedBy::Runner => follow_to_end(ctx, run_id, &followed, created, &cancel),
        (Some(recorded), _) => {
            let outcome = outcome_without_pod(run_id, &job_record, created, Some(recorded));
            ctx.jobs.finish(run_id, outcome, ended_at.unwrap_or_else(SystemTime::now));
        }
        (None, None) if job_finished_at(&job).is_some() => {
            let ended = Ended { outcome: outcome_without_pod(run_id, &job_record, created, None), by: DecidedBy::Server };
            record_and_finish(ctx, run_id, ended, ended_at.unwrap_or_else(SystemTime::now));
        }
        (None, Some(pod)) if job_finished_at(&job).is_some() || classify::finished_pod_view(pod).is_some() => {
            follow_to_end(ctx, run_id, &followed, created, &cancel);
        }
        (None, pod) => {
            if pod.as_ref().is_some_and(|pod| classify::pod_state_view(pod) == classify::PodState::Running) {
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
    let spawned = std::thread::Builder::new()
        .name(format!("job-{}", &run_id[..8.min(run_id.len())]))
        .spawn(move || follow_to_end(&thread_ctx, &thread_run_id, &followed, created, &cancel));
    if let Err(error) = spawned {
        let message = format!("could not start a thread to follow the job: {error}; fetch_job will try again");
        // Forgetting the entry lets the next fetch re-attach.
        log::error("background follower not started", &[("run_id", run_id.into()), ("error", message.into())]);
        ctx.jobs.remove(run_id);
    }
}

fn follow_to_end(ctx: &Ctx, run_id: &str, followed: &Followed, created: Option<SystemTime>, cancel: &CancelToken) {
    let started = Instant::now();
    // Re-attached runs may have one too; deleting a missing Secret is no error.
    let inputs = run::InputsSecret::new(true);
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
    // The Job as it is now: whether another process cancelled it, and when
    // it ended if that was before this process re-read it.
    let job = ctx.client.get_if_exists(kube::Resource::JOBS, &ctx.policy.namespace, &manifest::job_name(run_id));
    let job = job.ok().flatten().map(|job| Job::from_value(&job)).unwrap_or_default();
    let marked_cancelled = JobRecord::from_job(&job).is_ok_and(|job_record| job_record.cancelled_at.is_some());
    let cancel_requested = matches!(ctx.jobs.lookup(run_id), Lookup::Found(view) if view.cancel_requested);
    if (cancel_requested || marked_cancelled) && mark_cancelled(&mut ended.outcome) {
        ended.by = DecidedBy::Server;
    }
    run::log_finished(run_id, &ended.outcome, started);
    record_and_finish(ctx, run_id, ended, job_finished_at(&job).unwrap_or_else(SystemTime::now));
}

/// Makes the end final on the Job (issue 12, findings 1 and 11), then
/// caches it. A verdict another process recorded first wins. When it
/// cannot be recorded (the API does not answer) nothing is cached: the
/// entry goes, and the next `fetch_job` reads the cluster again, so this
/// process never holds a result the Job does not.
fn record_and_finish(ctx: &Ctx, run_id: &str, mut ended: Ended, ended_at: SystemTime) {
    match verdict::settle(ctx, run_id, &ended, verdict::Record::Yes) {
        Ok(Settled::AlreadyRecorded(recorded)) => verdict::apply(&mut ended.outcome, &recorded),
        Ok(Settled::Recorded | Settled::NoJob) => {}
        Err(error) => {
            log::warn(
                "the outcome could not be recorded on the job; the next fetch_job reads the cluster again",
                &[("run_id", run_id.into()), ("error", error.to_string().into())],
            );
            ctx.jobs.remove(run_id);
            return;
        }
    }
    run::delete_inputs_secret(ctx, run_id);
    ctx.jobs.finish(run_id, ended.outcome, ended_at);
}

/// A cancelled run whose runner could not report in time ends as
/// `cancelled`, not as a lost result; one that finished on its own first
/// keeps its real outcome. Returns whether it changed the outcome.
fn mark_cancelled(outcome: &mut RunOutcome) -> bool {
    if matches!(outcome.status, RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled) {
        return false;
    }
    outcome.status = RunStatus::Cancelled;
    outcome.reason = Some(RunReason::Cancelled);
    outcome.message = "the job was cancelled (cancel_job) and its pod deleted; the output read so far is included".into();
    true
}

/// The outcome of a finished Job whose pod (and so its log) is gone, or
/// whose verdict was recorded by the process that decided it.
fn outcome_without_pod(run_id: &str, job_record: &JobRecord, created: Option<SystemTime>, recorded: Option<&Recorded>) -> RunOutcome {
    let cancelled = recorded.is_none_or(|recorded| recorded.status == RunStatus::Cancelled);
    let mut outcome = match job_record.cancelled_at.as_deref().filter(|_| cancelled) {
        Some(at) => {
            // An earlier version wrote the output's tail onto the Job for
            // this case; the caller's output does not belong in etcd for
            // the retention (issue 12, finding 9), so only the process that
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
                if recorded.by == DecidedBy::Runner {
                    outcome.notes.push("the pod and its log are gone, so the output cannot be returned; the status is the one recorded when the job ended".into());
                }
                outcome
            }
            None => RunOutcome::without_result(
                run_id,
                RunStatus::Error,
                RunReason::ResultLost,
                "the Job finished but its pod and log are gone (deleted or garbage-collected), so the result cannot be read; submit the job again".into(),
            ),
        },
    };
    outcome.times.created = created;
    outcome
}

fn delete_pods(ctx: &Ctx, run_id: &str) {
    let namespace = &ctx.policy.namespace;
    let pods = match ctx.client.list(kube::Resource::PODS, namespace, &run_selector(run_id)) {
        Ok(pods) => pods.items,
        Err(error) => {
            log::warn("could not list the job's pods to cancel it", &[("run_id", run_id.into()), ("error", error.to_string().into())]);
            return;
        }
    };
    for pod in pods.iter().map(Pod::from_value) {
        let name = pod.metadata.name.as_str();
        if let Err(error) = ctx.client.delete(kube::Resource::PODS, namespace, name) {
            log::warn("could not delete the job's pod", &[("pod", name.into()), ("error", error.to_string().into())]);
        }
    }
}

fn run_selector(run_id: &str) -> kube::ListParams {
    kube::ListParams { label_selector: Some(format!("{}={run_id}", manifest::LABEL_RUN_ID)), field_selector: None }
}

/// The deadlines and judging facts of a Job this process did not create,
/// counted from the Job's creation (with `ATTACH_GRACE` to see the pod).
fn followed_from_job(ctx: &Ctx, job: &Job, job_record: &JobRecord) -> Followed {
    let pod_spec = &job.spec.template.spec;
    let pod_deadline = Duration::from_secs(pod_spec.active_deadline_seconds.unwrap_or(0));
    let timeout = job_record.timeout_s.map(Duration::from_secs);
    let memory_limit = pod_spec
        .containers
        .iter()
        .find(|container| container.name == manifest::MAIN_CONTAINER)
        .and_then(|main| main.resources.limits.get("memory"))
        .cloned();
    let age = time_of(job.metadata.creation_timestamp.as_deref())
        .and_then(|created| SystemTime::now().duration_since(created).ok())
        .unwrap_or_default();
    let now = Instant::now();
    let since_creation = |after: Duration| (now + after.saturating_sub(age)).max(now + ATTACH_GRACE);
    Followed {
        timeout: timeout.unwrap_or(pod_deadline),
        memory_limit,
        start_deadline: since_creation(ctx.policy.start_timeout),
        unschedulable_grace: None,
        hard_deadline: since_creation(pod_deadline + run::HARD_DEADLINE_SLACK),
    }
}

fn listed_job(ctx: &Ctx, job: &Value) -> Option<Listed> {
    let job = Job::from_value(job);
    let job_record = JobRecord::from_job(&job).ok()?;
    let token = job_record.token.clone();
    let (run_id, _) = parse_token(&token)?;
    let known = match ctx.jobs.lookup(&run_id) {
        Lookup::Found(view) if view.token == token => Some(view),
        _ => None,
    };
    let recorded = job_record.outcome;
    let phase = match &known {
        Some(view) => view.phase,
        None if job_finished_at(&job).is_some() || recorded.is_some() => Phase::Finished,
        None if job.status.active > 0 => Phase::Running,
        None => Phase::Pending,
    };
    Some(Listed {
        token,
        created: time_of(job.metadata.creation_timestamp.as_deref()),
        phase,
        result_status: known
            .as_ref()
            .and_then(|view| view.outcome.as_ref())
            .map(|outcome| outcome.status)
            .or(recorded.map(|recorded| recorded.status)),
        cancelled: job_record.cancelled_at.is_some() || known.is_some_and(|view| view.cancel_requested),
        command: job_record.command,
        expires_at: job_record.expires_at.unwrap_or_default(),
    })
}

/// The record a new background Job starts with; `manifest` adds the
/// expiry, `cancel` and `verdict` the rest later.
fn background_annotations(spec: &RunSpec, token: &str) -> serde_json::Map<String, Value> {
    let job_record = JobRecord {
        token: token.to_string(),
        timeout_s: Some(spec.timeout.as_secs()),
        command: command_summary(spec),
        expires_at: None,
        cancelled_at: None,
        outcome: None,
    };
    job_record.to_annotations().into_iter().map(|(key, value)| (key, Value::String(value))).collect()
}

/// `image program`: the program's file name without its folder or its
/// arguments, at most `PROGRAM_NAME_CHARS` characters.
fn command_summary(spec: &RunSpec) -> String {
    let program = spec.command.first().map(String::as_str).unwrap_or_default();
    let name = program.rsplit('/').next().unwrap_or(program);
    match name.char_indices().nth(PROGRAM_NAME_CHARS) {
        Some((cut, _)) => format!("{} {}…", spec.image, &name[..cut]),
        None => format!("{} {name}", spec.image),
    }
}

/// When the Job reached `Complete` or `Failed`, if it has.
fn job_finished_at(job: &Job) -> Option<SystemTime> {
    let finished = job.finished_condition()?;
    Some(time_of(finished.last_transition_time.as_deref()).unwrap_or_else(SystemTime::now))
}

/// The error for a token whose Job is not in the cluster: expired if its
/// result could have outlived the retention by now, unknown otherwise.
fn gone(ctx: &Ctx, token: &str) -> Error {
    let result_ttl = ctx.jobs.limits().result_ttl;
    match parse_token(token) {
        Some((_, submitted)) if submitted + result_ttl <= SystemTime::now() => expired(ctx, token),
        _ => Error::Unknown { token: token.to_string() },
    }
}

fn expired(ctx: &Ctx, token: &str) -> Error {
    Error::Expired { token: token.to_string(), result_ttl_s: ctx.jobs.limits().result_ttl.as_secs() }
}

fn time_of(text: Option<&str>) -> Option<SystemTime> {
    classify::parse_time(text?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_nothing_else_parses() {
        let run_id = "0123456789abcdef0123456789abcdef";
        let submitted = UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        let token = token_for(run_id, submitted);
        assert_eq!(token, format!("job-{run_id}-1767225600"));
        assert_eq!(parse_token(&token), Some((run_id.to_string(), submitted)));
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
        ] {
            assert_eq!(parse_token(bad), None, "{bad}");
        }
    }

    /// Issue 12, finding 9: the whole command sat in a Job annotation for
    /// the retention.
    #[test]
    fn the_command_annotation_keeps_the_program_name_only() {
        let spec = |command: &[&str]| RunSpec {
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
        };
        assert_eq!(command_summary(&spec(&["python3", "-c", "TOKEN=secret"])), "python:3.12 python3");
        assert_eq!(command_summary(&spec(&["/usr/local/bin/tool", "--password=x"])), "python:3.12 tool");
        // What submit writes through `manifest` is what every reader gets back.
        let retention = manifest::Retention {
            expires_at: "2026-01-01T01:00:00.000Z".into(),
            finished_ttl: Duration::from_secs(300),
            background: Some(background_annotations(&spec(&["/bin/sh", "-c", "exit 3"]), "tok")),
        };
        let mut job = json!({"kind": "Job", "metadata": {"name": "j", "labels": {}}, "spec": {}});
        manifest::apply_retention(&mut job, &retention);
        let job_record = JobRecord::from_job(&Job::from_value(&job)).unwrap();
        assert_eq!(
            job_record,
            JobRecord {
                token: "tok".into(),
                timeout_s: Some(5),
                command: "python:3.12 sh".into(),
                expires_at: Some("2026-01-01T01:00:00.000Z".into()),
                cancelled_at: None,
                outcome: None,
            }
        );
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
            assert_eq!(mark_cancelled(&mut outcome), before != after, "{before:?}");
            assert_eq!(outcome.status, after, "{before:?}");
        }
    }

    #[test]
    fn a_job_is_finished_by_its_complete_or_failed_condition() {
        let job = |conditions: Value| Job::from_value(&json!({"status": {"conditions": conditions}}));
        let at = "2026-01-01T00:00:00Z";
        assert!(job_finished_at(&job(json!([{"type": "Complete", "status": "True", "lastTransitionTime": at}]))).is_some());
        assert!(job_finished_at(&job(json!([{"type": "Failed", "status": "True", "lastTransitionTime": at}]))).is_some());
        assert!(job_finished_at(&job(json!([{"type": "Suspended", "status": "True"}]))).is_none());
        assert!(job_finished_at(&job(json!([{"type": "Failed", "status": "False"}]))).is_none());
        assert!(job_finished_at(&Job::default()).is_none());
    }
}
