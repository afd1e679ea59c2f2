//! The Docker backend's warm pools, the twin of
//! `backend::kubernetes::pool`: the thin shell around
//! `engine::pool::PoolState`. A thread per pool makes and removes what the
//! machine's steps say (a pool sandbox is a run's container, created and
//! started ahead, whose runner waits for one assignment on its stdin:
//! `spec::pool_container`), lists the pool's containers about every second
//! and feeds what it sees back as events. `claim` hands a running one to a
//! run, and `deliver` writes the run into its stdin through the Docker API
//! (`docker::Client::container_attach_stdin`): no network, no host
//! directory, no key file, so a pool of network mode `none` is warm too
//! and a server in a container with only the Docker socket can keep pools.
//!
//! A pool sandbox is made under a fresh run id and the run that takes it
//! takes that id (`Backend::claim`), so every by-name and by-label lookup
//! of a cold run works for a warm one unchanged. Knows nothing of MCP; the
//! decisions (when to make, replace, hand out) are `engine::pool`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crate::backend::docker::{Docker, spec};
use crate::docker::{self, Filters};
use crate::engine::pool::{DeleteWhy, Event, PoolRules, PoolShape, PoolState, Step};
use crate::engine::spec::{RunSpec, run_deadline};
use crate::log;
use crate::metrics;
use crate::sandbox::assignment::{self, KEY_BYTES, Key};

/// How often a pool looks at its containers when nothing wakes it.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How long a drain waits for a creation in flight, so that the container
/// it makes is removed too rather than left to its expiry.
const DRAIN_WAITS_FOR: Duration = Duration::from_secs(10);

/// The key an assignment on stdin carries: the format has one, and the
/// runner reading stdin checks none (`runner await-assignment --stdin`).
/// Only a Docker API client can write to a container's stdin, and such a
/// client can `exec` in the container anyway, so a key would guard
/// nothing; it would cost a volume per sandbox (the root is read-only and
/// a tmpfs is not mounted before the start, so `put-archive` has nowhere
/// else to put it).
const STDIN_KEY: Key = Key::from_bytes([0; KEY_BYTES]);

/// The server's pools on one daemon.
pub struct Pools {
    managed: Vec<Arc<Managed>>,
    /// The backend without pools: its image and network checks, its client.
    backend: Docker,
}

/// A sandbox handed to a run, until its assignment is delivered.
pub struct Reserved {
    pub pool: String,
    pub container: String,
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
    /// Its container was listed once: missing later means it is gone.
    seen: bool,
}

struct State {
    machine: PoolState,
    /// The pool's sandboxes by run id, until handed out or removed.
    sandboxes: BTreeMap<String, Sandbox>,
    /// Steps for the pool's thread: creations and removals.
    pending: Vec<Step>,
    /// Handed out, waiting for their run's `create`.
    reserved: BTreeMap<String, Reserved>,
    /// When the pool last fell below its size, for the refill time.
    short_since: Option<Instant>,
    /// The pool's thread is doing steps (a creation may be in flight).
    shell_busy: bool,
}

impl Pools {
    /// The pools, not started (`start` starts their threads). `pools`:
    /// each pool's shape and rules (`tools::warm_pools`); `max_timeout`:
    /// the longest `timeout_s` a run may give, which a sandbox's expiry
    /// must hold.
    pub fn new(backend: Docker, pools: &[(PoolShape, PoolRules)], max_timeout: Duration) -> Pools {
        let managed = pools.iter().map(|(shape, rules)| Arc::new(Managed::new(shape, *rules, max_timeout))).collect();
        Pools { managed, backend }
    }

    /// Starts a thread per pool; `owner` goes into every sandbox's labels.
    pub fn start(self: &Arc<Pools>, owner: &str) -> std::io::Result<()> {
        for managed in &self.managed {
            let shell = Shell { managed: managed.clone(), backend: self.backend.clone(), owner: owner.to_string() };
            std::thread::Builder::new().name(format!("pool-{}", managed.shape.name)).spawn(move || shell.run())?;
        }
        Ok(())
    }

    /// A ready sandbox for `spec`, reserved for it, by its run id: the run
    /// takes that id. `None`: no pool fits, or none is ready (a miss).
    pub fn claim(&self, spec: &RunSpec) -> Option<String> {
        let shapes: Vec<PoolShape> = self.managed.iter().map(|managed| managed.shape.clone()).collect();
        let shape = crate::engine::pool::pick(spec, &self.backend.policy, &shapes)?;
        let managed = self.managed.iter().find(|managed| managed.shape.name == shape.name)?;
        loop {
            let run_id = managed.hand_out()?;
            let container = spec::container_name(&run_id);
            // The list is up to a second old: a fresh look keeps a
            // container that ended since from being handed out.
            if self.is_running(&container) {
                metrics::pool_claim(&managed.shape.name, true);
                let reserved = Reserved { pool: managed.shape.name.clone(), container };
                lock(&managed.state).reserved.insert(run_id.clone(), reserved);
                return Some(run_id);
            }
            managed.push(Step::Delete { sandbox: run_id, why: DeleteWhy::Died });
        }
    }

    /// The reserved sandbox of `run_id`, taken for its delivery.
    pub fn take_reserved(&self, run_id: &str) -> Option<Reserved> {
        self.managed.iter().find_map(|managed| lock(&managed.state).reserved.remove(run_id))
    }

    /// Sends the run to its sandbox: the assignment, on its stdin. dockerd
    /// takes an attach to a container that has ended (and the bytes go
    /// nowhere), so the container is looked at first: one that ended since
    /// the claim is an error here, not a run without a result later.
    pub fn deliver(&self, reserved: &Reserved, run_id: &str, spec: &RunSpec) -> Result<(), String> {
        let client = &self.backend.client;
        let inspect = client.container_inspect(&reserved.container).map_err(|error| error.to_string())?;
        if !inspect.state.running {
            return Err(format!("the container is `{}`, no longer waiting", inspect.state.status));
        }
        let assignment = crate::engine::pool::assignment(run_id, spec, &self.backend.policy);
        client.container_attach_stdin(&reserved.container, &assignment::encode(&STDIN_KEY, &assignment)).map_err(|error| error.to_string())
    }

    /// Removes every pool sandbox not handed out and makes no more (the
    /// server stops). A creation in flight is waited for (a while), and
    /// the container it made removed too.
    pub fn drain(&self) {
        for managed in &self.managed {
            let steps = {
                let mut state = lock(&managed.state);
                let mut steps = std::mem::take(&mut state.pending);
                steps.extend(state.machine.on(Event::Drain, Instant::now()));
                steps
            };
            self.remove_all(steps);
        }
        for managed in &self.managed {
            let steps = {
                let state = lock(&managed.state);
                let (mut state, _) = managed
                    .wake
                    .wait_timeout_while(state, DRAIN_WAITS_FOR, |state| state.shell_busy)
                    .unwrap_or_else(PoisonError::into_inner);
                // What came of it: the machine asks to remove it.
                std::mem::take(&mut state.pending)
            };
            self.remove_all(steps);
        }
    }

    fn remove_all(&self, steps: Vec<Step>) {
        for step in steps {
            if let Step::Delete { sandbox, .. } = step {
                remove_sandbox(&self.backend.client, &sandbox);
            }
        }
    }

    fn is_running(&self, container: &str) -> bool {
        match self.backend.client.container_inspect(container) {
            Ok(inspect) => inspect.state.running,
            Err(error) if error.is_not_found() => false,
            // The daemon is away: the delivery will say so; a cold run
            // would meet the same daemon.
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
            // Its deadline and expiry must hold the wait and the longest run.
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

    /// The machine's pick for a claim, out of the pool: its run id. `None`
    /// on a miss.
    fn hand_out(&self) -> Option<String> {
        let mut state = lock(&self.state);
        let steps = state.machine.on(Event::Claim, Instant::now());
        let mut handed = None;
        for step in steps {
            match step {
                Step::HandOut { sandbox } => {
                    state.sandboxes.remove(&sandbox);
                    handed = Some(sandbox);
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
    backend: Docker,
    owner: String,
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
                log::debug("removing a pool sandbox", &[("run_id", sandbox.as_str().into()), ("why", format!("{why:?}").into())]);
                remove_sandbox(&self.backend.client, &sandbox);
            }
            // Claims handle these themselves.
            Step::HandOut { .. } | Step::Miss => {}
        }
    }

    /// Makes one sandbox: its image and network checked as a cold run's
    /// are, its container created (its volume workdir owned by the run's
    /// user where the engine has no owned tmpfs) and started.
    fn create(&self) -> Event {
        let run_id = crate::engine::run::new_run_id();
        let name = spec::container_name(&run_id);
        match self.create_and_start(&run_id, &name) {
            Ok(()) => Event::Created { sandbox: run_id },
            Err(message) => {
                metrics::api_error("create_pool_container");
                log::warn(
                    "could not create a pool sandbox",
                    &[("pool", self.managed.shape.name.as_str().into()), ("error", message.into())],
                );
                remove_sandbox(&self.backend.client, &run_id);
                Event::CreateFailed
            }
        }
    }

    fn create_and_start(&self, run_id: &str, name: &str) -> Result<(), String> {
        let template = &self.managed.template;
        let backend = &self.backend;
        backend.ensure_image(&template.image).map_err(|refused| refused.message)?;
        backend.ensure_network(template.network, &template.image).map_err(|refused| refused.message)?;
        let expires_at = SystemTime::now() + run_deadline(template, &backend.policy) + crate::engine::run::EXPIRY_SLACK;
        let sandbox =
            spec::PoolSandbox { run_id, pool: &self.managed.shape.name, owner: &self.owner, max_wait: self.managed.max_wait, expires_at };
        let body = spec::pool_container(template, &backend.policy, &backend.options, &sandbox);
        backend.client.container_create(name, &body).map_err(|error| error.to_string())?;
        if spec::workdir_is_volume(template, &backend.options) {
            let root = spec::inputs_archive(template, backend.policy.run_as_user)?;
            backend.client.container_put_archive(name, &template.workdir, &root).map_err(|error| error.to_string())?;
        }
        backend.client.container_start(name).map_err(|error| error.to_string())
    }

    /// The pool's containers as events: running, ended, or gone since last
    /// seen.
    fn look(&self) -> Vec<Event> {
        let filters = Filters {
            labels: vec![
                format!("{}={}", spec::LABEL_MANAGED_BY, spec::MANAGED_BY),
                format!("{}={}", spec::LABEL_POOL, self.managed.shape.name),
                format!("{}={}", spec::LABEL_POOL_OWNER, self.owner),
            ],
        };
        let containers = match self.backend.client.container_list(&filters) {
            Ok(containers) => containers,
            Err(error) => {
                log::debug("could not list a pool's containers", &[("error", error.to_string().into())]);
                return Vec::new();
            }
        };
        let listed: Vec<(String, String)> = containers
            .into_iter()
            .filter_map(|container| Some((container.labels.get(spec::LABEL_RUN_ID)?.clone(), container.state)))
            .collect();
        let mut state = lock(&self.managed.state);
        sightings(&mut state.sandboxes, &listed)
    }
}

/// What one listing says of the pool's sandboxes (`listed`: run id and
/// container state): `running` is ready, `exited` or `dead` died, and one
/// seen before and missing now is gone. Containers that are not the pool's
/// sandboxes (handed out, or removed) are passed over.
fn sightings(sandboxes: &mut BTreeMap<String, Sandbox>, listed: &[(String, String)]) -> Vec<Event> {
    let mut found = BTreeSet::new();
    let mut events = Vec::new();
    for (run_id, status) in listed {
        let Some(sandbox) = sandboxes.get_mut(run_id) else { continue };
        found.insert(run_id.clone());
        sandbox.seen = true;
        match status.as_str() {
            "running" => events.push(Event::Ready { sandbox: run_id.clone() }),
            "exited" | "dead" | "removing" => events.push(Event::Died { sandbox: run_id.clone() }),
            _ => {}
        }
    }
    for (run_id, sandbox) in sandboxes.iter() {
        if sandbox.seen && !found.contains(run_id) {
            events.push(Event::Died { sandbox: run_id.clone() });
        }
    }
    events
}

/// Removes the sandbox's container (with its volume); the expiry label and
/// the reaper remove one this misses.
fn remove_sandbox(client: &docker::Client, run_id: &str) {
    let name = spec::container_name(run_id);
    super::remove_container(client, &name, "pool sandbox not removed; its expiry and the reaper remove it");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_says_which_sandboxes_are_ready_ended_or_gone() {
        let mut sandboxes: BTreeMap<String, Sandbox> =
            ["starting", "ready", "ended", "vanished"].iter().map(|name| (name.to_string(), Sandbox::default())).collect();
        let listed = |pairs: &[(&str, &str)]| pairs.iter().map(|(id, status)| (id.to_string(), status.to_string())).collect::<Vec<_>>();
        let first =
            listed(&[("starting", "created"), ("ready", "running"), ("ended", "exited"), ("vanished", "running"), ("other", "running")]);
        assert_eq!(
            sightings(&mut sandboxes, &first),
            [
                Event::Ready { sandbox: "ready".into() },
                Event::Died { sandbox: "ended".into() },
                Event::Ready { sandbox: "vanished".into() }
            ],
            "a container not among the pool's (handed out) is passed over"
        );
        let second = listed(&[("starting", "running"), ("ready", "running")]);
        let events = sightings(&mut sandboxes, &second);
        assert!(events.contains(&Event::Died { sandbox: "vanished".into() }), "seen before, missing now: {events:?}");
        assert!(events.contains(&Event::Ready { sandbox: "starting".into() }));
    }
}
