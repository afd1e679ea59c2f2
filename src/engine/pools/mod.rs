//! The one warm pool manager, the shell around `engine::pools::pool::PoolState`
//! for every backend: a thread per pool does what the machine's steps say
//! (make a sandbox, delete one), looks at the pool's sandboxes about every
//! second and feeds what it sees back as events; `claim` hands a ready
//! sandbox to a run (after a fresh look at it), `deliver` gives it the run,
//! `drain` deletes what nobody took and waits for a creation in flight. The
//! refill clock, the lock and the pool metrics live here too.
//!
//! A backend plugs in through `PoolSandboxes`: make a sandbox of the pool's
//! shape under a run id, list the pool's sandboxes with their health, look
//! at one, deliver an assignment to one, delete one. What it must remember
//! of a sandbox between its creation and its delivery (the Kubernetes
//! backend: the key and the Job's creation time) is its `Made`.
//!
//! A pool sandbox is made under a fresh run id, and the run that takes it
//! takes that id (`Backend::claim`), so every by-name and by-label lookup
//! of a cold run works for a warm one unchanged. Knows no backend and
//! nothing of MCP; the decisions (when to make, replace, hand out) are
//! `engine::pools::pool`'s.

pub mod pool;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::engine::pools::pool::{DeleteWhy, Event, PoolRules, PoolShape, PoolState, Step};
use crate::engine::port::spec::{Policy, RunSpec};
use crate::engine::port::{self, PoolFigures};
use crate::log;
use crate::metrics;
use crate::sandbox::assignment::Assignment;
use crate::supervise;

/// What a backend does for its warm pools. The methods are named apart
/// from `Backend`'s (`create`, `list`), which the same type implements.
pub trait PoolSandboxes: Send + Sync + 'static {
    /// What the backend keeps of one sandbox from its creation to its
    /// delivery (nothing, `()`, when the run id says it all).
    type Made: Send + 'static;

    /// The policy runs are made under: which run fits a pool
    /// (`engine::pools::pool::pick`), and what its assignment says.
    fn pool_policy(&self) -> &Policy;

    /// Makes one sandbox of the pool's shape, ready to wait for its
    /// assignment. On an error, whatever was made of it is gone again; the
    /// message is logged with the pool's name.
    fn create_sandbox(&self, sandbox: &NewSandbox) -> Result<Self::Made, port::Error>;

    /// The pool's sandboxes, as the backend sees them now.
    fn list_sandboxes(&self, pool: &str, owner: &str) -> Result<Vec<Listed>, port::Error>;

    /// A fresh look at one sandbox (`Listed::name`) before it is handed
    /// out: is it still waiting? When the backend cannot be asked, `true`:
    /// the delivery will say so, and a cold run would meet the same API.
    fn sandbox_is_ready(&self, name: &str) -> bool;

    /// Gives a reserved sandbox its run.
    fn deliver(&self, reserved: &Reserved<Self::Made>, assignment: &Assignment) -> Result<(), port::Error>;

    /// Deletes one sandbox by its run id; what this misses, the sandbox's
    /// expiry and the reaper remove.
    fn delete_sandbox(&self, run_id: &str);
}

/// A sandbox to make, as `PoolSandboxes::create_sandbox` is asked for it.
pub struct NewSandbox<'a> {
    pub run_id: &'a str,
    pub pool: &'a str,
    /// This process's id, on every sandbox so that replicas keep apart.
    pub owner: &'a str,
    /// The run a sandbox is made for: the pool's shape, no command yet, a
    /// timeout that holds the wait and the longest run.
    pub template: &'a RunSpec,
    /// How long its runner waits for the assignment
    /// (`engine::pools::pool::runner_max_wait`).
    pub max_wait: Duration,
    /// What its runner starts ahead (`engine::pools::pool::PoolShape::preload`).
    pub preload: Option<&'a crate::sandbox::args::Preload>,
}

/// One of a pool's sandboxes in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub run_id: String,
    /// What `sandbox_is_ready` and the delivery look it up by (a pod's
    /// name, a container's name).
    pub name: String,
    pub health: Health,
}

/// How a listed sandbox is doing. One missing from a listing after it was
/// seen is gone, which the manager tells by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Made, not waiting yet.
    Starting,
    /// Its runner waits for the assignment.
    Ready,
    /// Ended, failed, or on its way out.
    Ended,
}

/// A sandbox handed to a run, until its assignment is delivered.
pub struct Reserved<M> {
    pub pool: String,
    /// As listed (`Listed::name`).
    pub name: String,
    pub made: M,
}

/// The server's pools on one backend.
pub struct Pools<S: PoolSandboxes> {
    managed: Vec<Arc<Managed<S::Made>>>,
    sandboxes: Arc<S>,
}

/// How often a pool looks at its sandboxes when nothing wakes it.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How long a drain waits for a creation in flight, so that the sandbox
/// it makes is deleted too rather than left to its expiry.
const DRAIN_WAITS_FOR: Duration = Duration::from_secs(10);

impl<S: PoolSandboxes> Pools<S> {
    /// The pools, not started (`start` starts their threads). `pools`:
    /// each pool's shape and rules (`backend::pool_shapes` makes them from
    /// `MCP_K8S_WARM_POOLS`); `max_timeout`: the longest `timeout_s` a run
    /// may give, which a sandbox's deadline and expiry must hold.
    pub fn new(sandboxes: S, pools: &[(PoolShape, PoolRules)], max_timeout: Duration) -> Pools<S> {
        let managed = pools.iter().map(|(shape, rules)| Arc::new(Managed::new(shape, *rules, max_timeout))).collect();
        Pools { managed, sandboxes: Arc::new(sandboxes) }
    }

    /// Starts a thread per pool; `owner` goes onto every sandbox.
    pub fn start(self: &Arc<Self>, owner: &str) -> std::io::Result<()> {
        for managed in &self.managed {
            let shell = Shell { managed: managed.clone(), sandboxes: self.sandboxes.clone(), owner: owner.to_string() };
            supervise::spawn_named(supervise::Kind::PoolManager, format!("pool-{}", managed.shape.name), move || shell.run())?;
        }
        Ok(())
    }

    /// A ready sandbox for `spec`, reserved for it, by its run id: the run
    /// takes that id. `None`: no pool fits, or none is ready (a miss).
    pub fn claim(&self, spec: &RunSpec) -> Option<String> {
        let shapes: Vec<PoolShape> = self.managed.iter().map(|managed| managed.shape.clone()).collect();
        let shape = crate::engine::pools::pool::pick(spec, self.sandboxes.pool_policy(), &shapes)?;
        let managed = self.managed.iter().find(|managed| managed.shape.name == shape.name)?;
        loop {
            let (run_id, reserved) = managed.hand_out()?;
            // The listing is up to a second old: a fresh look keeps a
            // sandbox that ended since from being handed out.
            if self.sandboxes.sandbox_is_ready(&reserved.name) {
                metrics::pool_claim(&managed.shape.name, true);
                let mut state = lock(&managed.state);
                state.hits += 1;
                state.reserved.insert(run_id.clone(), reserved);
                return Some(run_id);
            }
            managed.push(Step::Delete { sandbox: run_id, why: DeleteWhy::Died });
        }
    }

    /// Each pool's live figures, in the order the operator listed them.
    pub fn figures(&self) -> Vec<PoolFigures> {
        let figures = |managed: &Arc<Managed<S::Made>>| {
            let state = lock(&managed.state);
            PoolFigures { name: managed.shape.name.clone(), ready: state.machine.ready(), hits: state.hits, misses: state.misses }
        };
        self.managed.iter().map(figures).collect()
    }

    /// The reserved sandbox of `run_id`, taken for its delivery.
    pub fn take_reserved(&self, run_id: &str) -> Option<Reserved<S::Made>> {
        self.managed.iter().find_map(|managed| lock(&managed.state).reserved.remove(run_id))
    }

    /// Sends the run to its sandbox: the assignment a cold run's sandbox
    /// would be started with (`engine::pools::pool::assignment`).
    pub fn deliver(&self, reserved: &Reserved<S::Made>, run_id: &str, spec: &RunSpec) -> Result<(), port::Error> {
        let assignment = crate::engine::pools::pool::assignment(run_id, spec, self.sandboxes.pool_policy());
        self.sandboxes.deliver(reserved, &assignment)
    }

    /// Deletes every pool sandbox not handed out and makes no more (the
    /// server stops). A creation in flight is waited for (a while), and
    /// the sandbox it made deleted too.
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
                self.sandboxes.delete_sandbox(&sandbox);
            }
        }
    }
}

/// One pool: its machine, what the backend made, and the thread's queue.
struct Managed<M> {
    shape: PoolShape,
    rules: PoolRules,
    /// The run a sandbox is made for: the pool's shape, no command yet.
    template: RunSpec,
    max_wait: Duration,
    state: Mutex<State<M>>,
    wake: Condvar,
}

struct Sandbox<M> {
    made: M,
    /// As last listed.
    name: Option<String>,
    /// It was listed once: missing later means it is gone.
    seen: bool,
}

struct State<M> {
    machine: PoolState,
    /// The pool's sandboxes by run id, until handed out or deleted.
    sandboxes: BTreeMap<String, Sandbox<M>>,
    /// Steps for the pool's thread: creations and deletions.
    pending: Vec<Step>,
    /// Handed out, waiting for their run's `create`.
    reserved: BTreeMap<String, Reserved<M>>,
    /// When the pool last fell below its size, for the refill time.
    short_since: Option<Instant>,
    /// The pool's thread is doing steps (a creation may be in flight).
    shell_busy: bool,
    /// Claims that took a sandbox, and claims that found none ready.
    hits: u64,
    misses: u64,
}

impl<M> Managed<M> {
    fn new(shape: &PoolShape, rules: PoolRules, max_timeout: Duration) -> Managed<M> {
        let max_wait = crate::engine::pools::pool::runner_max_wait(&rules);
        let template = RunSpec {
            image: shape.image.clone(),
            command: Vec::new(),
            files: Vec::new(),
            env: BTreeMap::new(),
            cpu_limit: shape.cpu.clone(),
            memory_limit: shape.memory.clone(),
            // Its deadline and expiry must hold the wait and the longest run.
            timeout: max_wait + max_timeout,
            workdir: shape.workdir.clone(),
            artifacts: Vec::new(),
            clone: None,
            network: shape.network,
            owner: None,
        };
        let state = State {
            machine: PoolState::new(rules),
            sandboxes: BTreeMap::new(),
            pending: Vec::new(),
            reserved: BTreeMap::new(),
            short_since: None,
            shell_busy: false,
            hits: 0,
            misses: 0,
        };
        Managed { shape: shape.clone(), rules, template, max_wait, state: Mutex::new(state), wake: Condvar::new() }
    }

    /// The machine's pick for a claim, out of the pool: its run id and
    /// what its delivery needs. `None` on a miss.
    fn hand_out(&self) -> Option<(String, Reserved<M>)> {
        let mut state = lock(&self.state);
        let steps = state.machine.on(Event::Claim, Instant::now());
        let mut handed = None;
        for step in steps {
            match step {
                Step::HandOut { sandbox } => match state.sandboxes.remove(&sandbox) {
                    Some(Sandbox { made, name: Some(name), .. }) => {
                        handed = Some((sandbox, Reserved { pool: self.shape.name.clone(), name, made }));
                    }
                    // Ready means listed, and listed means named: this is
                    // not expected; the sandbox goes rather than leak.
                    _ => state.pending.push(Step::Delete { sandbox, why: DeleteWhy::Died }),
                },
                Step::Miss => {
                    state.misses += 1;
                    metrics::pool_claim(&self.shape.name, false);
                }
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
struct Shell<S: PoolSandboxes> {
    managed: Arc<Managed<S::Made>>,
    sandboxes: Arc<S>,
    owner: String,
}

impl<S: PoolSandboxes> Shell<S> {
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
                self.sandboxes.delete_sandbox(&sandbox);
            }
            // Claims handle these themselves.
            Step::HandOut { .. } | Step::Miss => {}
        }
    }

    /// Makes one sandbox under a fresh run id; the pool knows it from now
    /// on (so this round's look already sees it).
    fn create(&self) -> Event {
        let run_id = crate::engine::run::new_run_id();
        let managed = &self.managed;
        let sandbox = NewSandbox {
            run_id: &run_id,
            pool: &managed.shape.name,
            owner: &self.owner,
            template: &managed.template,
            max_wait: managed.max_wait,
            preload: managed.shape.preload.as_ref(),
        };
        match self.sandboxes.create_sandbox(&sandbox) {
            Ok(made) => {
                lock(&managed.state).sandboxes.insert(run_id.clone(), Sandbox { made, name: None, seen: false });
                Event::Created { sandbox: run_id }
            }
            Err(error) => {
                log::warn(
                    "could not create a pool sandbox",
                    &[("pool", managed.shape.name.as_str().into()), ("error", error.to_string().into())],
                );
                Event::CreateFailed
            }
        }
    }

    /// The pool's sandboxes as events: ready, ended, or gone since last
    /// seen.
    fn look(&self) -> Vec<Event> {
        let listed = match self.sandboxes.list_sandboxes(&self.managed.shape.name, &self.owner) {
            Ok(listed) => listed,
            Err(error) => {
                log::debug("could not list a pool's sandboxes", &[("error", error.to_string().into())]);
                return Vec::new();
            }
        };
        let mut state = lock(&self.managed.state);
        sightings(&mut state.sandboxes, &listed)
    }
}

/// What one listing says of the pool's sandboxes: ready, ended, and one
/// seen before and missing now is gone. Listed sandboxes that are not the
/// pool's (handed out, or deleted) are passed over.
fn sightings<M>(sandboxes: &mut BTreeMap<String, Sandbox<M>>, listed: &[Listed]) -> Vec<Event> {
    let mut found = BTreeSet::new();
    let mut events = Vec::new();
    for listed in listed {
        let Some(sandbox) = sandboxes.get_mut(&listed.run_id) else { continue };
        found.insert(listed.run_id.clone());
        sandbox.seen = true;
        sandbox.name = Some(listed.name.clone());
        match listed.health {
            Health::Ready => events.push(Event::Ready { sandbox: listed.run_id.clone() }),
            Health::Ended => events.push(Event::Died { sandbox: listed.run_id.clone() }),
            Health::Starting => {}
        }
    }
    for (run_id, sandbox) in sandboxes.iter() {
        if sandbox.seen && !found.contains(run_id) {
            events.push(Event::Died { sandbox: run_id.clone() });
        }
    }
    events
}

/// Starts or ends the refill clock: short of its size means a refill is
/// under way.
fn note_shortage<M>(state: &mut State<M>) {
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

fn lock<M>(state: &Mutex<State<M>>) -> MutexGuard<'_, State<M>> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_says_which_sandboxes_are_ready_ended_or_gone() {
        let mut sandboxes: BTreeMap<String, Sandbox<()>> = ["starting", "ready", "ended", "vanished"]
            .iter()
            .map(|name| (name.to_string(), Sandbox { made: (), name: None, seen: false }))
            .collect();
        let listed = |pairs: &[(&str, Health)]| {
            pairs
                .iter()
                .map(|(id, health)| Listed { run_id: id.to_string(), name: format!("sandbox-{id}"), health: *health })
                .collect::<Vec<_>>()
        };
        let first = listed(&[
            ("starting", Health::Starting),
            ("ready", Health::Ready),
            ("ended", Health::Ended),
            ("vanished", Health::Ready),
            ("other", Health::Ready),
        ]);
        assert_eq!(
            sightings(&mut sandboxes, &first),
            [
                Event::Ready { sandbox: "ready".into() },
                Event::Died { sandbox: "ended".into() },
                Event::Ready { sandbox: "vanished".into() }
            ],
            "a sandbox not among the pool's (handed out) is passed over"
        );
        assert_eq!(sandboxes["ready"].name.as_deref(), Some("sandbox-ready"), "the name a claim looks it up by");
        let second = listed(&[("starting", Health::Ready), ("ready", Health::Ready)]);
        let events = sightings(&mut sandboxes, &second);
        assert!(events.contains(&Event::Died { sandbox: "vanished".into() }), "seen before, missing now: {events:?}");
        assert!(events.contains(&Event::Ready { sandbox: "starting".into() }));
    }
}
