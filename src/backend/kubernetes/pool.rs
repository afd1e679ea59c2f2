//! The Kubernetes backend's warm pools: the thin shell around
//! `engine::pool::PoolState`. A thread per pool makes and deletes what the
//! machine's steps say (a pool sandbox is a Job like a cold run's, whose
//! runner waits for one assignment, and a key Secret), lists the pool's
//! pods every second and feeds what it sees back as events. `claim` hands
//! a ready sandbox to a run, and `deliver` sends it the run through the API
//! server's `pods/proxy`.
//!
//! A pool sandbox is made under a fresh run id, and the run that takes it
//! takes that id (`Backend::claim`), so every by-name and by-label lookup
//! of a cold run works for a warm one unchanged. Knows nothing of MCP; the
//! decisions (when to make, replace, hand out) are `engine::pool`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use crate::backend::kubernetes::manifest::{self, PoolSandbox};
use crate::backend::kubernetes::template::PodTemplate;
use crate::engine::pool::{Event, PoolRules, PoolShape, PoolState, Step};
use crate::engine::spec::{Policy, RunSpec};
use crate::kube::objects::Pod;
use crate::kube::{self, ListParams, Resource};
use crate::log;
use crate::metrics;
use crate::sandbox::assignment::{self, Key};

/// How often a pool looks at its pods when nothing wakes it.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How long a delivery keeps trying while the runner's port is not open
/// yet (its container runs, its listener is a few milliseconds away).
const DELIVERY_RETRY_FOR: Duration = Duration::from_secs(3);
/// How long the hand-off may wait for the runner's answer: it writes the
/// input files and answers at once, so a longer wait is a hand-off gone
/// wrong, which ends the run with a message naming it, not its whole start
/// timeout later.
const DELIVERY_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a drain waits for a creation in flight, so that the sandbox
/// it makes is deleted too rather than left to its expiry.
const DRAIN_WAITS_FOR: Duration = Duration::from_secs(10);

/// The server's pools, and the process's id their sandboxes carry.
pub struct Pools {
    managed: Vec<Arc<Managed>>,
    client: kube::Client,
    policy: Policy,
}

/// A sandbox handed to a run, until its assignment is delivered.
pub struct Reserved {
    pub pool: String,
    pub pod: String,
    pub key: Key,
    /// When its Job was made: the Job's deadline counts from there.
    pub created: SystemTime,
}

struct Managed {
    shape: PoolShape,
    rules: PoolRules,
    /// The run a sandbox is made for: the pool's shape, no command yet.
    template: RunSpec,
    max_wait: Duration,
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct Sandbox {
    key: Option<Key>,
    pod: Option<String>,
    created: Option<SystemTime>,
    /// Its pod was listed once: missing later means it is gone.
    seen: bool,
}

struct State {
    machine: PoolState,
    /// The pool's sandboxes by run id, until handed out or deleted.
    sandboxes: BTreeMap<String, Sandbox>,
    /// Steps for the pool's thread: creations and deletions.
    pending: Vec<Step>,
    /// Handed out, waiting for their run's `create`.
    reserved: BTreeMap<String, Reserved>,
    /// When the pool last fell below its size, for the refill time.
    short_since: Option<Instant>,
    /// The pool's thread is doing steps (a creation may be in flight).
    shell_busy: bool,
}

impl Pools {
    /// The pools, not started (`start` starts their threads).
    /// `pools`: each pool's shape and rules (`tools::warm_pools` makes
    /// them from `MCP_K8S_WARM_POOLS`); `max_timeout`: the longest
    /// `timeout_s` a run may give, which a sandbox's deadline must hold.
    pub fn new(client: kube::Client, policy: Policy, pools: &[(PoolShape, PoolRules)], max_timeout: Duration) -> Pools {
        let managed = pools.iter().map(|(shape, rules)| Arc::new(Managed::new(shape, *rules, max_timeout))).collect();
        Pools { managed, client, policy }
    }

    /// Starts a thread per pool; `owner` goes into every sandbox's labels.
    pub fn start(self: &Arc<Pools>, owner: &str, pod_template: Option<Arc<PodTemplate>>) -> std::io::Result<()> {
        for managed in &self.managed {
            let shell = Shell {
                managed: managed.clone(),
                client: self.client.clone(),
                policy: self.policy.clone(),
                owner: owner.to_string(),
                pod_template: pod_template.clone(),
            };
            std::thread::Builder::new().name(format!("pool-{}", managed.shape.name)).spawn(move || shell.run())?;
        }
        Ok(())
    }

    /// A ready sandbox for `spec`, reserved for it, by its run id: the run
    /// takes that id. `None`: no pool fits, or none is ready (a miss).
    pub fn claim(&self, spec: &RunSpec) -> Option<String> {
        let shapes: Vec<PoolShape> = self.managed.iter().map(|managed| managed.shape.clone()).collect();
        let shape = crate::engine::pool::pick(spec, &self.policy, &shapes)?;
        let managed = self.managed.iter().find(|managed| managed.shape.name == shape.name)?;
        loop {
            let handed = managed.hand_out()?;
            // The list is up to a second old: a fresh look keeps a pod
            // that died since from being handed out.
            if self.pod_is_ready(&handed.1.pod) {
                let (run_id, reserved) = handed;
                metrics::pool_claim(&managed.shape.name, true);
                lock(&managed.state).reserved.insert(run_id.clone(), reserved);
                return Some(run_id);
            }
            managed.push(Step::Delete { sandbox: handed.0, why: crate::engine::pool::DeleteWhy::Died });
        }
    }

    /// The reserved sandbox of `run_id`, taken for its delivery.
    pub fn take_reserved(&self, run_id: &str) -> Option<Reserved> {
        self.managed.iter().find_map(|managed| lock(&managed.state).reserved.remove(run_id))
    }

    /// Sends the run to its sandbox: the assignment, through `pods/proxy`.
    pub fn deliver(&self, reserved: &Reserved, run_id: &str, spec: &RunSpec) -> Result<(), kube::Error> {
        let body = assignment::encode(&reserved.key, &crate::engine::pool::assignment(run_id, spec, &self.policy));
        let started = Instant::now();
        loop {
            let sent = self.client.proxy_post(
                &self.policy.namespace,
                &reserved.pod,
                assignment::PORT,
                assignment::PATH,
                body.clone(),
                DELIVERY_READ_TIMEOUT,
            );
            match sent {
                Ok(_) => return Ok(()),
                // The API server says 503 while the port is not open yet.
                Err(error) if error.code() == Some(503) && started.elapsed() < DELIVERY_RETRY_FOR => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Deletes every pool sandbox not handed out and makes no more (the
    /// server stops).
    pub fn drain(&self) {
        for managed in &self.managed {
            let steps = {
                let mut state = lock(&managed.state);
                let mut steps = std::mem::take(&mut state.pending);
                steps.extend(state.machine.on(Event::Drain, Instant::now()));
                steps
            };
            self.delete_all(steps);
        }
        for managed in &self.managed {
            let steps = {
                let state = lock(&managed.state);
                let (mut state, _) = managed
                    .wake
                    .wait_timeout_while(state, DRAIN_WAITS_FOR, |state| state.shell_busy)
                    .unwrap_or_else(PoisonError::into_inner);
                // What came of it: the machine asks to delete it.
                std::mem::take(&mut state.pending)
            };
            self.delete_all(steps);
        }
    }

    fn delete_all(&self, steps: Vec<Step>) {
        for step in steps {
            if let Step::Delete { sandbox, .. } = step {
                delete_sandbox(&self.client, &self.policy.namespace, &sandbox);
            }
        }
    }

    fn pod_is_ready(&self, pod: &str) -> bool {
        match self.client.get_if_exists(Resource::PODS, &self.policy.namespace, pod) {
            Ok(Some(value)) => is_ready(&Pod::from_value(&value)),
            Ok(None) => false,
            // The API is away: the delivery will say so; a cold run would
            // meet the same API.
            Err(_) => true,
        }
    }
}

impl Managed {
    fn new(shape: &PoolShape, rules: PoolRules, max_timeout: Duration) -> Managed {
        let max_wait = crate::engine::pool::runner_max_wait(&rules);
        let template = RunSpec {
            image: shape.image.clone(),
            command: Vec::new(),
            files: Vec::new(),
            env: BTreeMap::new(),
            cpu_limit: shape.cpu.clone(),
            memory_limit: shape.memory.clone(),
            // The pod's own deadline must hold the wait and the longest run.
            timeout: max_wait + max_timeout,
            workdir: shape.workdir.clone(),
            artifacts: Vec::new(),
            clone: None,
            network: shape.network,
        };
        let state = State {
            machine: PoolState::new(rules),
            sandboxes: BTreeMap::new(),
            pending: Vec::new(),
            reserved: BTreeMap::new(),
            short_since: None,
            shell_busy: false,
        };
        Managed { shape: shape.clone(), rules, template, max_wait, state: Mutex::new(state), wake: Condvar::new() }
    }

    /// The machine's pick for a claim, out of the pool: its run id and
    /// what its run needs. `None` on a miss.
    fn hand_out(&self) -> Option<(String, Reserved)> {
        let mut state = lock(&self.state);
        let steps = state.machine.on(Event::Claim, Instant::now());
        let mut handed = None;
        for step in steps {
            match step {
                Step::HandOut { sandbox } => {
                    let known = state.sandboxes.remove(&sandbox).unwrap_or_default();
                    if let (Some(key), Some(pod)) = (known.key, known.pod) {
                        let created = known.created.unwrap_or_else(SystemTime::now);
                        handed = Some((sandbox, Reserved { pool: self.shape.name.clone(), pod, key, created }));
                    }
                }
                Step::Miss => metrics::pool_claim(&self.shape.name, false),
                other => state.pending.push(other),
            }
        }
        note_shortage(&mut state);
        // What describe_environment and /metrics say is true at once: the
        // sandbox handed out is no longer ready (the thread's next look
        // may be a second and a creation away).
        metrics::pool_size(&self.shape.name, state.machine.size(), state.machine.ready());
        drop(state);
        self.wake.notify_all();
        handed
    }

    fn push(&self, step: Step) {
        lock(&self.state).pending.push(step);
        self.wake.notify_all();
    }
}

/// One pool's thread.
struct Shell {
    managed: Arc<Managed>,
    client: kube::Client,
    policy: Policy,
    owner: String,
    pod_template: Option<Arc<PodTemplate>>,
}

impl Shell {
    fn run(self) {
        log::info("warm pool started", &[("pool", self.managed.shape.name.as_str().into()), ("size", self.managed.rules.size.into())]);
        // The first look asks for the sandboxes.
        self.feed(Vec::new());
        loop {
            let steps = {
                let state = lock(&self.managed.state);
                let (mut state, _) = self
                    .managed
                    .wake
                    .wait_timeout_while(state, LOOK_EVERY, |state| state.pending.is_empty())
                    .unwrap_or_else(PoisonError::into_inner);
                state.shell_busy = true;
                std::mem::take(&mut state.pending)
            };
            let mut events = Vec::new();
            for step in steps {
                self.apply(step, &mut events);
            }
            events.extend(self.look());
            self.feed(events);
        }
    }

    /// Feeds events (then a tick) to the machine; its steps go pending.
    fn feed(&self, events: Vec<Event>) {
        let now = Instant::now();
        let mut state = lock(&self.managed.state);
        let mut steps = Vec::new();
        for event in events {
            if let Event::Created { sandbox } = &event {
                state.sandboxes.entry(sandbox.clone()).or_default();
            }
            steps.extend(state.machine.on(event, now));
        }
        steps.extend(state.machine.on(Event::Tick, now));
        for step in &steps {
            if let Step::Delete { sandbox, .. } = step {
                state.sandboxes.remove(sandbox);
            }
        }
        state.pending.extend(steps);
        note_shortage(&mut state);
        metrics::pool_size(&self.managed.shape.name, state.machine.size(), state.machine.ready());
        state.shell_busy = false;
        drop(state);
        // New work for this thread, or a drain waiting for it to be idle.
        self.managed.wake.notify_all();
    }

    fn apply(&self, step: Step, events: &mut Vec<Event>) {
        match step {
            Step::Create { count } => {
                for _ in 0..count {
                    events.push(self.create());
                }
            }
            Step::Delete { sandbox, why } => {
                log::debug("deleting a pool sandbox", &[("run_id", sandbox.as_str().into()), ("why", format!("{why:?}").into())]);
                delete_sandbox(&self.client, &self.policy.namespace, &sandbox);
            }
            // Claims handle these themselves.
            Step::HandOut { .. } | Step::Miss => {}
        }
    }

    /// Makes one sandbox: its Job, then its key Secret.
    fn create(&self) -> Event {
        let run_id = crate::engine::run::new_run_id();
        let key = match Key::random() {
            Ok(key) => key,
            Err(why) => {
                log::error("cannot make a pool sandbox's key", &[("error", why.into())]);
                return Event::CreateFailed;
            }
        };
        let sandbox = PoolSandbox { pool: &self.managed.shape.name, owner: &self.owner, max_wait: self.managed.max_wait };
        let mut job = manifest::pool_job(&self.managed.template, &self.policy, &run_id, &sandbox);
        if let Some(template) = &self.pod_template {
            manifest::apply_pod_template(&mut job, template);
        }
        // Unclaimed, it is useless once its runner stops waiting; a claim
        // writes the run's own expiry.
        let expires_at = SystemTime::now() + self.managed.max_wait + crate::engine::run::EXPIRY_SLACK;
        // A pool Job that ends unclaimed (its runner stopped waiting) holds
        // nothing anyone reads: it goes at once. A claim writes the run's TTL.
        let retention = manifest::Retention { expires_at: log::rfc3339_utc(expires_at), finished_ttl: Duration::ZERO, background: None };
        manifest::apply_retention(&mut job, &retention);
        let namespace = &self.policy.namespace;
        let created = match self.client.create(Resource::JOBS, namespace, &job) {
            Ok(created) => kube::objects::Job::from_value(&created),
            Err(error) => {
                metrics::api_error("create_pool_job");
                log::warn(
                    "could not create a pool sandbox",
                    &[("pool", self.managed.shape.name.as_str().into()), ("error", error.to_string().into())],
                );
                return Event::CreateFailed;
            }
        };
        let mut secret = manifest::key_secret(&self.policy, &run_id, &created.metadata.uid, &key.to_hex());
        manifest::apply_retention(&mut secret, &retention);
        if let Err(error) = self.client.create(Resource::SECRETS, namespace, &secret) {
            metrics::api_error("create_secret");
            log::warn("could not create a pool sandbox's key", &[("error", error.to_string().into())]);
            delete_sandbox(&self.client, namespace, &run_id);
            return Event::CreateFailed;
        }
        let mut state = lock(&self.managed.state);
        let entry = state.sandboxes.entry(run_id.clone()).or_default();
        entry.key = Some(key);
        entry.created = Some(SystemTime::now());
        Event::Created { sandbox: run_id }
    }

    /// The pool's pods as events: ready, dead, or gone since last seen.
    fn look(&self) -> Vec<Event> {
        let selector = format!("{}={},{}={}", manifest::LABEL_POOL, self.managed.shape.name, manifest::LABEL_POOL_OWNER, self.owner);
        let params = ListParams { label_selector: Some(selector), field_selector: None };
        let pods = match self.client.list(Resource::PODS, &self.policy.namespace, &params) {
            Ok(list) => list.items.iter().map(Pod::from_value).collect::<Vec<_>>(),
            Err(error) => {
                log::debug("could not list a pool's pods", &[("error", error.to_string().into())]);
                return Vec::new();
            }
        };
        let mut state = lock(&self.managed.state);
        let mut listed = BTreeSet::new();
        let mut events = Vec::new();
        for pod in &pods {
            let Some(run_id) = pod.metadata.labels.get(manifest::LABEL_RUN_ID) else { continue };
            let Some(sandbox) = state.sandboxes.get_mut(run_id) else { continue };
            listed.insert(run_id.clone());
            sandbox.seen = true;
            sandbox.pod = Some(pod.metadata.name.clone());
            if is_ready(pod) {
                events.push(Event::Ready { sandbox: run_id.clone() });
            } else if is_dead(pod) {
                events.push(Event::Died { sandbox: run_id.clone() });
            }
        }
        for (run_id, sandbox) in &state.sandboxes {
            if sandbox.seen && !listed.contains(run_id) {
                events.push(Event::Died { sandbox: run_id.clone() });
            }
        }
        events
    }
}

/// The runner waits for its assignment: the main container runs and
/// nobody is deleting the pod.
fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.phase.as_deref() == Some("Running")
        && pod.status.container_statuses.iter().any(|status| status.name == manifest::MAIN_CONTAINER && status.state.running.is_some())
}

fn is_dead(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || matches!(pod.status.phase.as_deref(), Some("Succeeded" | "Failed"))
        || pod.status.container_statuses.iter().any(|status| status.name == manifest::MAIN_CONTAINER && status.state.terminated.is_some())
}

/// The Job goes (its pod and key Secret with it, by the garbage
/// collector); the Secret is deleted too, so the key never outlives it.
fn delete_sandbox(client: &kube::Client, namespace: &str, run_id: &str) {
    let name = manifest::job_name(run_id);
    if let Err(error) = client.delete(Resource::JOBS, namespace, &name) {
        metrics::api_error("delete_job");
        log::warn(
            "pool sandbox not deleted; its expiry and the reaper remove it",
            &[("job", name.as_str().into()), ("error", error.to_string().into())],
        );
    }
    let _ = client.delete(Resource::SECRETS, namespace, &name);
}

/// Starts or ends the refill clock: short of its size means a refill is
/// under way.
fn note_shortage(state: &mut State) {
    let full = state.machine.ready() >= state.machine.size();
    match (full, state.short_since) {
        (false, None) => state.short_since = Some(Instant::now()),
        (true, Some(since)) => {
            metrics::pool_refilled(since.elapsed());
            state.short_since = None;
        }
        _ => {}
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The merge patch that makes a pool sandbox's Job the run's: its
/// retention (expiry, TTL, a background run's record and label), the hand
/// out time, and a Job deadline counted from the Job's creation.
pub fn claim_patch(retention: &manifest::Retention, job_age: Duration, run_deadline: Duration) -> serde_json::Value {
    let mut job = json!({"metadata": {"labels": {}}, "spec": {}});
    manifest::apply_retention(&mut job, retention);
    job["metadata"]["annotations"][manifest::ANNOTATION_ASSIGNED_AT] = json!(log::rfc3339_utc(SystemTime::now()));
    job["spec"]["activeDeadlineSeconds"] = json!((job_age + run_deadline + manifest::JOB_DEADLINE_SLACK).as_secs());
    // `apply_retention` writes the TTL only onto a Job it knows as one.
    job["spec"]["ttlSecondsAfterFinished"] = json!(retention.finished_ttl.as_secs());
    job
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claim makes the pool Job the run's: the run's expiry and TTL, a
    /// background run's record and label, the hand-out time, and a Job
    /// deadline that counts the Job's idle age (it runs from the Job's
    /// start) on top of the run's own.
    #[test]
    fn a_claim_patch_gives_the_job_the_runs_retention_and_deadline() {
        let mut record = serde_json::Map::new();
        record.insert("mcp-k8s-ephemeral-job/token".into(), json!("job-abc-1"));
        let retention = manifest::Retention {
            expires_at: "2026-12-01T00:00:00Z".into(),
            finished_ttl: Duration::from_secs(3600),
            background: Some(record),
        };
        let patch = claim_patch(&retention, Duration::from_secs(200), Duration::from_secs(300));
        assert_eq!(patch["spec"]["activeDeadlineSeconds"], 200 + 300 + manifest::JOB_DEADLINE_SLACK.as_secs());
        assert_eq!(patch["spec"]["ttlSecondsAfterFinished"], 3600);
        let annotations = &patch["metadata"]["annotations"];
        assert_eq!(annotations[manifest::ANNOTATION_EXPIRES_AT], "2026-12-01T00:00:00Z");
        assert_eq!(annotations["mcp-k8s-ephemeral-job/token"], "job-abc-1");
        assert!(annotations[manifest::ANNOTATION_ASSIGNED_AT].is_string(), "{patch}");
        assert_eq!(patch["metadata"]["labels"][manifest::LABEL_MODE], manifest::MODE_BACKGROUND);

        let sync = manifest::Retention { expires_at: "x".into(), finished_ttl: Duration::from_secs(300), background: None };
        let patch = claim_patch(&sync, Duration::ZERO, Duration::from_secs(100));
        assert!(patch["metadata"]["labels"].get(manifest::LABEL_MODE).is_none(), "a sync run is not listed: {patch}");
    }
}
