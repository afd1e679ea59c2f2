//! Warm pools, backend-neutral and pure: which run may take a
//! pool's sandbox (`pick`), and one pool's life as a state machine (events
//! in, steps out, synthetic time, as `decide.rs` does for a run): keep
//! `size` sandboxes ready, replace one that stays idle past `max_idle`,
//! that does not get ready in time or that dies, and hand out the oldest
//! ready one. One run per sandbox, never reused: a sandbox handed out
//! leaves the pool at once and the pool makes another.
//!
//! `assignment` turns a run into what the sandbox is told (the same
//! contract as a cold pod's).
//!
//! Deliberately knows no Kubernetes, no threads, no clock and nothing of
//! how an assignment reaches the sandbox (`sandbox::assignment`): the
//! backend's pool manager creates and deletes what the steps say, feeds
//! what it sees as events, and delivers the run to the sandbox handed out.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::engine::port::spec::{Policy, RunSpec, command_env, exec_options};
use crate::network::NetworkMode;
use crate::quantity::Quantity;
use crate::sandbox::args::Preload;
use crate::sandbox::assignment::{AssignedFile, Assignment};

/// What a run must have for a pool's sandboxes to serve it: the pool
/// sandbox was made with these before the run was known.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolShape {
    pub name: String,
    /// Normalised, as `RunSpec::image` is.
    pub image: String,
    /// The CPU limit; `None` for runs that give none.
    pub cpu: Option<Quantity>,
    /// The memory limit; `None` for runs that give none.
    pub memory: Option<Quantity>,
    pub network: NetworkMode,
    /// The workdir its sandboxes mount (their volumes are fixed at
    /// creation): `sandbox::WORKDIR`.
    pub workdir: String,
    /// The interpreter its sandboxes start ahead, for the runs that fit it
    /// (`Preload::fits`, in the sandbox); others take them all the same.
    pub preload: Option<Preload>,
}

/// Why a run cannot take a pool's sandbox: it runs cold. The first
/// difference found, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// A checkout is an init step before the command; a warm sandbox has
    /// passed that point.
    Clone,
    /// Every run mounts the operator's cache volume and pool sandboxes do
    /// not (config refuses pools with a cache; this keeps the rule here).
    Cache,
    Image,
    Cpu,
    Memory,
    Network,
    /// The workdir is a volume mounted at creation.
    Workdir,
}

/// The pool whose sandbox `spec` may take, if any (pools have distinct
/// shapes, so at most one fits).
pub fn pick<'a>(spec: &RunSpec, policy: &Policy, pools: &'a [PoolShape]) -> Option<&'a PoolShape> {
    pools.iter().find(|shape| mismatch(spec, policy.cache.is_some(), shape).is_none())
}

/// The first reason `spec` cannot take a sandbox of `shape`; `None` when it
/// can. Input files, env, timeout, artifacts and argv do not matter: they
/// travel with the assignment.
pub fn mismatch(spec: &RunSpec, mounts_cache: bool, shape: &PoolShape) -> Option<Mismatch> {
    if spec.clone.is_some() {
        return Some(Mismatch::Clone);
    }
    if mounts_cache {
        return Some(Mismatch::Cache);
    }
    if spec.image != shape.image {
        return Some(Mismatch::Image);
    }
    // `Quantity` compares by value: `1` and `1000m` are one limit.
    if spec.cpu_limit != shape.cpu {
        return Some(Mismatch::Cpu);
    }
    if spec.memory_limit != shape.memory {
        return Some(Mismatch::Memory);
    }
    if spec.network != shape.network {
        return Some(Mismatch::Network);
    }
    if spec.workdir != shape.workdir {
        return Some(Mismatch::Workdir);
    }
    None
}

/// What a warm sandbox is told to run for `spec`: the very `exec` options
/// and environment a cold pod's main container gets (`exec_options`,
/// `command_env`), and the input files a cold run puts into its inputs
/// Secret. One contract for both paths.
pub fn assignment(run_id: &str, spec: &RunSpec, policy: &Policy) -> Assignment {
    Assignment {
        run_id: run_id.to_string(),
        exec: exec_options(spec, policy),
        env: command_env(spec, policy),
        files: spec
            .files
            .iter()
            .map(|file| AssignedFile { path: file.path.clone(), mode: file.mode, content: file.content.clone() })
            .collect(),
        tag: None,
    }
}

/// The rules one pool is held to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolRules {
    /// Sandboxes kept, ready or on their way.
    pub size: usize,
    /// How long a ready sandbox may wait for a run.
    pub max_idle: Duration,
    /// How long a sandbox may take to get ready (MCP_K8S_START_TIMEOUT_S).
    pub start_timeout: Duration,
}

/// Margin by which a pool sandbox's runner outlasts the pool's own
/// replacement of it.
const RUNNER_WAIT_MARGIN: Duration = Duration::from_secs(60);

/// How long a pool sandbox's runner waits for its assignment before it
/// ends itself (`runner await-assignment --max-wait-ms`): longer than the
/// pool keeps it (its start, then `max_idle`), so the server normally
/// deletes it first; bounded, so that one whose server is gone (a crash, a
/// SIGKILL) ends on its own and its Job's TTL removes it.
pub fn runner_max_wait(rules: &PoolRules) -> Duration {
    rules.start_timeout + rules.max_idle + RUNNER_WAIT_MARGIN
}

/// What happened to the pool.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A sandbox asked for by `Step::Create` exists now, by this name.
    Created { sandbox: String },
    /// A creation asked for by `Step::Create` was refused.
    CreateFailed,
    /// The sandbox's runner listens for its assignment.
    Ready { sandbox: String },
    /// The sandbox died, was evicted or deleted by someone else, or failed.
    Died { sandbox: String },
    /// A run wants a sandbox of this pool.
    Claim,
    /// Time passed.
    Tick,
    /// The server stops: delete every sandbox, make no more.
    Drain,
}

/// What the shell is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Make this many sandboxes; report each as `Created` or `CreateFailed`.
    Create { count: usize },
    /// Delete this sandbox (it is already out of the pool).
    Delete { sandbox: String, why: DeleteWhy },
    /// The claiming run takes this sandbox; it is the run's now (the run
    /// deletes it at its end, as every run does).
    HandOut { sandbox: String },
    /// No sandbox is ready: the claiming run runs cold.
    Miss,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteWhy {
    IdleTooLong,
    NotReadyInTime,
    /// It died or failed; deleting removes what is left of it.
    Died,
    Draining,
}

/// Least wait before the next creation after a sandbox failed to get
/// ready, doubled with each failure in a row up to `MAX_BACKOFF`: a pool
/// of an image that cannot be pulled must not churn sandboxes.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug, PartialEq)]
enum SandboxState {
    Creating { since: Instant },
    Idle { since: Instant },
}

/// One pool's state.
#[derive(Debug)]
pub struct PoolState {
    rules: PoolRules,
    /// The sandboxes of the pool, by name: never one handed out or deleted.
    sandboxes: BTreeMap<String, SandboxState>,
    /// Creations asked for and not yet reported.
    creations_pending: usize,
    /// Sandboxes in a row that failed to get ready.
    start_failures: u32,
    /// No creation before this (the backoff after failures).
    next_creation: Option<Instant>,
    draining: bool,
}

impl PoolState {
    pub fn new(rules: PoolRules) -> PoolState {
        PoolState { rules, sandboxes: BTreeMap::new(), creations_pending: 0, start_failures: 0, next_creation: None, draining: false }
    }

    /// Sandboxes ready to be handed out, for `/metrics`.
    pub fn ready(&self) -> usize {
        self.sandboxes.values().filter(|state| matches!(state, SandboxState::Idle { .. })).count()
    }

    /// The sandboxes the pool keeps.
    pub fn size(&self) -> usize {
        self.rules.size
    }

    /// Applies `event` at `now` and says what to do.
    pub fn on(&mut self, event: Event, now: Instant) -> Vec<Step> {
        let mut steps = Vec::new();
        let is_claim = event == Event::Claim;
        match event {
            Event::Created { sandbox } => {
                self.creations_pending = self.creations_pending.saturating_sub(1);
                if self.draining {
                    steps.push(Step::Delete { sandbox, why: DeleteWhy::Draining });
                } else {
                    self.sandboxes.insert(sandbox, SandboxState::Creating { since: now });
                }
            }
            Event::CreateFailed => {
                self.creations_pending = self.creations_pending.saturating_sub(1);
                self.failed_to_start(now);
            }
            Event::Ready { sandbox } => {
                if let Some(state @ SandboxState::Creating { .. }) = self.sandboxes.get_mut(&sandbox) {
                    *state = SandboxState::Idle { since: now };
                    self.start_failures = 0;
                    self.next_creation = None;
                }
            }
            Event::Died { sandbox } => {
                if let Some(state) = self.sandboxes.remove(&sandbox) {
                    if matches!(state, SandboxState::Creating { .. }) {
                        self.failed_to_start(now);
                    }
                    steps.push(Step::Delete { sandbox, why: DeleteWhy::Died });
                }
            }
            Event::Drain => {
                self.draining = true;
                let sandboxes = std::mem::take(&mut self.sandboxes);
                steps.extend(sandboxes.into_keys().map(|sandbox| Step::Delete { sandbox, why: DeleteWhy::Draining }));
            }
            Event::Claim | Event::Tick => {}
        }
        // The order the rules apply in: what expired goes first, so it is
        // never handed out; the refill counts what was just handed out.
        self.expire(now, &mut steps);
        if is_claim {
            steps.push(self.hand_out());
        }
        self.refill(now, &mut steps);
        steps
    }

    /// Deletes the sandboxes past their bounds.
    fn expire(&mut self, now: Instant, steps: &mut Vec<Step>) {
        let rules = self.rules;
        let expired: Vec<(String, DeleteWhy)> = self
            .sandboxes
            .iter()
            .filter_map(|(sandbox, state)| match *state {
                SandboxState::Creating { since } if now >= since + rules.start_timeout => {
                    Some((sandbox.clone(), DeleteWhy::NotReadyInTime))
                }
                SandboxState::Idle { since } if now >= since + rules.max_idle => Some((sandbox.clone(), DeleteWhy::IdleTooLong)),
                _ => None,
            })
            .collect();
        for (sandbox, why) in expired {
            self.sandboxes.remove(&sandbox);
            if why == DeleteWhy::NotReadyInTime {
                self.failed_to_start(now);
            }
            steps.push(Step::Delete { sandbox, why });
        }
    }

    /// The ready sandbox that has waited longest (the nearest to its
    /// expiry), out of the pool; `Miss` when none is ready.
    fn hand_out(&mut self) -> Step {
        let oldest = self
            .sandboxes
            .iter()
            .filter_map(|(sandbox, state)| match state {
                SandboxState::Idle { since } => Some((*since, sandbox.clone())),
                SandboxState::Creating { .. } => None,
            })
            .min();
        match oldest {
            Some((_, sandbox)) => {
                self.sandboxes.remove(&sandbox);
                Step::HandOut { sandbox }
            }
            None => Step::Miss,
        }
    }

    /// Asks for the sandboxes the pool lacks, unless backing off.
    fn refill(&mut self, now: Instant, steps: &mut Vec<Step>) {
        if self.draining || self.next_creation.is_some_and(|next| now < next) {
            return;
        }
        let have = self.sandboxes.len() + self.creations_pending;
        let count = self.rules.size.saturating_sub(have);
        if count > 0 {
            self.creations_pending += count;
            steps.push(Step::Create { count });
        }
    }

    fn failed_to_start(&mut self, now: Instant) {
        self.start_failures = self.start_failures.saturating_add(1);
        let doublings = self.start_failures.saturating_sub(1).min(16);
        let backoff = FIRST_BACKOFF.saturating_mul(1 << doublings).min(MAX_BACKOFF);
        self.next_creation = Some(now + backoff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quantity(text: &str) -> Quantity {
        Quantity::parse(text).unwrap()
    }

    fn shape() -> PoolShape {
        PoolShape {
            name: "busybox".into(),
            image: "docker.io/library/busybox:1.36".into(),
            cpu: Some(quantity("500m")),
            memory: Some(quantity("64Mi")),
            network: NetworkMode::None,
            workdir: crate::sandbox::WORKDIR.into(),
            preload: None,
        }
    }

    fn spec() -> RunSpec {
        RunSpec {
            owner: None,
            image: "docker.io/library/busybox:1.36".into(),
            command: vec!["true".into()],
            files: vec![crate::engine::port::spec::InputFile { path: "in.txt".into(), content: b"x".to_vec(), mode: 0o644 }],
            env: [("A".to_string(), "1".to_string())].into(),
            cpu_limit: Some(quantity("0.5")),
            memory_limit: Some(quantity("67108864")),
            timeout: Duration::from_secs(5),
            workdir: crate::sandbox::WORKDIR.into(),
            artifacts: vec!["*.txt".into()],
            clone: None,
            network: NetworkMode::None,
        }
    }

    #[test]
    fn a_run_takes_a_pool_sandbox_only_when_everything_fixed_at_creation_matches() {
        let clone = crate::engine::port::spec::CloneSpec { repo_url: "https://h/r".into(), git_ref: "main".into(), subdir: String::new() };
        let cases: Vec<(&str, RunSpec, bool, Option<Mismatch>)> = vec![
            ("same shape, files, env and artifacts travel along", spec(), false, None),
            ("a clone", RunSpec { clone: Some(clone), ..spec() }, false, Some(Mismatch::Clone)),
            ("a cache volume", spec(), true, Some(Mismatch::Cache)),
            ("another image", RunSpec { image: "docker.io/library/busybox:1.37".into(), ..spec() }, false, Some(Mismatch::Image)),
            ("another cpu limit", RunSpec { cpu_limit: Some(quantity("1")), ..spec() }, false, Some(Mismatch::Cpu)),
            ("no cpu limit", RunSpec { cpu_limit: None, ..spec() }, false, Some(Mismatch::Cpu)),
            ("another memory limit", RunSpec { memory_limit: Some(quantity("128Mi")), ..spec() }, false, Some(Mismatch::Memory)),
            ("another network mode", RunSpec { network: NetworkMode::Open, ..spec() }, false, Some(Mismatch::Network)),
            ("another workdir", RunSpec { workdir: "/src".into(), ..spec() }, false, Some(Mismatch::Workdir)),
        ];
        for (case, spec, mounts_cache, expected) in cases {
            assert_eq!(mismatch(&spec, mounts_cache, &shape()), expected, "{case}");
        }
        let unlimited = PoolShape { cpu: None, memory: None, ..shape() };
        let plain = RunSpec { cpu_limit: None, memory_limit: None, ..spec() };
        assert_eq!(mismatch(&plain, false, &unlimited), None, "a pool without limits serves calls that give none");
    }

    #[test]
    fn the_assignment_is_what_a_cold_pod_would_run() {
        let policy = Policy {
            run_as_user: 65532,
            default_cpu: quantity("1"),
            default_memory: quantity("512Mi"),
            max_output_bytes: 4096,
            max_artifact_bytes: 8192,
            start_timeout: Duration::from_secs(120),
            workdir_size_limit: quantity("1Gi"),
            extra_env: [("PROXY".to_string(), "operator".to_string())].into(),
            cache: None,
            clone: None,
            outputs: None,
            sandboxes: Default::default(),
        };
        let assignment = assignment("run-1", &spec(), &policy);
        assert_eq!(assignment.exec, exec_options(&spec(), &policy), "the argv, caps, timeout and disk bound of runner exec");
        assert_eq!(assignment.exec.disk_paths, [std::path::PathBuf::from("/work"), "/tmp".into()]);
        let env: Vec<(&str, &str)> = assignment.env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
        assert_eq!(env, [("A", "1"), ("HOME", "/tmp"), ("PROXY", "operator")], "the operator's, the caller's and HOME");
        assert_eq!(assignment.files, [AssignedFile { path: "in.txt".into(), mode: 0o644, content: b"x".to_vec() }]);
        assert_eq!(assignment.run_id, "run-1");
    }

    const START: Duration = Duration::from_secs(120);
    const IDLE: Duration = Duration::from_secs(600);

    /// A pool of `size` at time zero, and the clock.
    fn pool(size: usize) -> (PoolState, Instant) {
        (PoolState::new(PoolRules { size, max_idle: IDLE, start_timeout: START }), Instant::now())
    }

    fn created(name: &str) -> Event {
        Event::Created { sandbox: name.into() }
    }

    fn ready(name: &str) -> Event {
        Event::Ready { sandbox: name.into() }
    }

    fn delete(name: &str, why: DeleteWhy) -> Step {
        Step::Delete { sandbox: name.into(), why }
    }

    fn hand_out(name: &str) -> Step {
        Step::HandOut { sandbox: name.into() }
    }

    /// A pool of two with `a` and `b` ready, at `t0 + 10 s`.
    fn two_ready() -> (PoolState, Instant) {
        let (mut state, t0) = pool(2);
        assert_eq!(state.on(Event::Tick, t0), [Step::Create { count: 2 }]);
        for event in [created("a"), created("b"), ready("a")] {
            assert_eq!(state.on(event, t0), []);
        }
        assert_eq!(state.on(ready("b"), t0 + Duration::from_secs(1)), []);
        assert_eq!(state.ready(), 2);
        (state, t0)
    }

    #[test]
    fn a_new_pool_asks_for_its_size_once() {
        let (mut state, t0) = pool(3);
        assert_eq!(state.on(Event::Tick, t0), [Step::Create { count: 3 }]);
        assert_eq!(state.on(Event::Tick, t0 + Duration::from_secs(1)), [], "creations on their way count");
        assert_eq!(state.on(created("a"), t0), []);
        assert_eq!(state.on(Event::CreateFailed, t0), [], "a refused creation backs off first");
        assert_eq!(state.on(Event::Tick, t0 + Duration::from_secs(1)), [Step::Create { count: 1 }]);
    }

    #[test]
    fn a_claim_gets_the_oldest_ready_sandbox_and_the_pool_refills() {
        let (mut state, t0) = two_ready();
        assert_eq!(state.on(Event::Claim, t0 + Duration::from_secs(2)), [hand_out("a"), Step::Create { count: 1 }]);
        assert_eq!(state.on(Event::Claim, t0 + Duration::from_secs(2)), [hand_out("b"), Step::Create { count: 1 }]);
        assert_eq!(state.on(Event::Claim, t0 + Duration::from_secs(2)), [Step::Miss], "nothing ready: the run goes cold");
        assert_eq!(state.on(created("c"), t0), []);
        assert_eq!(state.on(Event::Claim, t0 + Duration::from_secs(3)), [Step::Miss], "a sandbox still starting is not handed out");
    }

    #[test]
    fn a_sandbox_handed_out_is_never_handed_out_again() {
        let (mut state, t0) = two_ready();
        assert_eq!(state.on(Event::Claim, t0), [hand_out("a"), Step::Create { count: 1 }]);
        assert_eq!(state.on(ready("a"), t0), [], "a late readiness of a handed-out sandbox changes nothing");
        assert_eq!(state.on(Event::Died { sandbox: "a".into() }, t0), [], "the run owns it and deletes it");
        assert_eq!(state.on(Event::Claim, t0), [hand_out("b"), Step::Create { count: 1 }]);
    }

    #[test]
    fn an_idle_sandbox_is_replaced_after_max_idle() {
        let (mut state, t0) = two_ready();
        assert_eq!(state.on(Event::Tick, t0 + IDLE - Duration::from_millis(1)), []);
        assert_eq!(state.on(Event::Tick, t0 + IDLE), [delete("a", DeleteWhy::IdleTooLong), Step::Create { count: 1 }]);
        assert_eq!(
            state.on(Event::Claim, t0 + IDLE + Duration::from_secs(1)),
            [delete("b", DeleteWhy::IdleTooLong), Step::Miss, Step::Create { count: 1 }],
            "an expired sandbox is deleted, not handed out"
        );
    }

    #[test]
    fn a_sandbox_that_dies_while_idle_is_replaced_and_never_handed_out() {
        let (mut state, t0) = two_ready();
        assert_eq!(state.on(Event::Died { sandbox: "a".into() }, t0), [delete("a", DeleteWhy::Died), Step::Create { count: 1 }]);
        assert_eq!(state.on(Event::Claim, t0), [hand_out("b"), Step::Create { count: 1 }]);
        assert_eq!(state.on(Event::Claim, t0), [Step::Miss]);
        assert_eq!(state.on(Event::Died { sandbox: "nobody".into() }, t0), [], "an unknown sandbox is not the pool's");
    }

    #[test]
    fn sandboxes_that_do_not_get_ready_are_replaced_with_a_growing_backoff() {
        let (mut state, t0) = pool(1);
        assert_eq!(state.on(Event::Tick, t0), [Step::Create { count: 1 }]);
        assert_eq!(state.on(created("a"), t0), []);
        assert_eq!(state.on(Event::Tick, t0 + START), [delete("a", DeleteWhy::NotReadyInTime)], "backing off 1 s");
        let t1 = t0 + START + Duration::from_secs(1);
        assert_eq!(state.on(Event::Tick, t1), [Step::Create { count: 1 }]);
        assert_eq!(state.on(created("b"), t1), []);
        assert_eq!(state.on(Event::Died { sandbox: "b".into() }, t1), [delete("b", DeleteWhy::Died)], "backing off 2 s");
        assert_eq!(state.on(Event::Tick, t1 + Duration::from_secs(1)), []);
        assert_eq!(state.on(Event::Tick, t1 + Duration::from_secs(2)), [Step::Create { count: 1 }]);
        assert_eq!(state.on(created("c"), t1), []);
        assert_eq!(state.on(ready("c"), t1 + Duration::from_secs(3)), [], "ready: the backoff is over");
        assert_eq!(state.on(Event::Claim, t1 + Duration::from_secs(3)), [hand_out("c"), Step::Create { count: 1 }]);
    }

    #[test]
    fn the_runner_waits_longer_than_the_pool_keeps_it() {
        let rules = PoolRules { size: 1, max_idle: IDLE, start_timeout: START };
        assert_eq!(runner_max_wait(&rules), START + IDLE + Duration::from_secs(60));
    }

    #[test]
    fn the_backoff_stops_growing_at_its_maximum() {
        let (mut state, t0) = pool(1);
        for _ in 0..40 {
            state.failed_to_start(t0);
        }
        assert_eq!(state.next_creation, Some(t0 + MAX_BACKOFF));
    }

    #[test]
    fn draining_deletes_every_sandbox_and_makes_no_more() {
        let (mut state, t0) = two_ready();
        assert_eq!(state.on(Event::Claim, t0), [hand_out("a"), Step::Create { count: 1 }]);
        assert_eq!(state.on(Event::Drain, t0), [delete("b", DeleteWhy::Draining)]);
        assert_eq!(state.on(created("late"), t0), [delete("late", DeleteWhy::Draining)], "one on its way is deleted when it comes");
        assert_eq!(state.on(Event::Claim, t0), [Step::Miss]);
        assert_eq!(state.on(Event::Tick, t0 + IDLE), []);
    }
}
