//! The Docker backend: a run is one fresh container on a Docker Engine
//! (API 1.41 or later, over its Unix socket) running the caller's image
//! with the runner, bind-mounted read-only from the host, as its
//! entrypoint. `spec` builds the create body, `classify` reads container
//! state into the engine's neutral views, `watch` follows the container,
//! `record` keeps a background run's record, verdict and cancel mark in
//! labels, `removal` removes a run's containers after its answer, `reaper`
//! removes what expired, `doctor` checks a daemon against the
//! configuration, `pool` is the warm pool sandboxes (containers that wait
//! for their run on stdin) for the engine's pool manager.
//!
//! A run: the image is looked up (pulled only when the operator allows),
//! the container is created, its workdir volume gets the input files by
//! `put-archive` (a run without files has a tmpfs workdir and skips it),
//! and it starts; the runner's stdout (its frames) is the
//! container's log. Clone and the cache volume are Kubernetes-only for now
//! and refused with the setting to unset. The run's network mode picks its
//! Docker network (`spec::network_mode`); the one of `open` runs is made
//! here on first use.
//!
//! Speaks to the daemon only through `docker`; decides nothing about a
//! run's end (the engine's `decide` does).

pub mod classify;
pub mod connect;
pub mod doctor;
pub mod pool;
pub mod reaper;
pub mod record;
pub mod removal;
pub mod sandbox;
pub mod spec;
pub mod watch;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use crate::docker;
use crate::engine::port::facts::{Recorded, Wording};
use crate::engine::port::spec::{Policy, RunReason};
use crate::engine::port::{
    self, Abort, Backend, Created, ErrorKind, Keep, NewRun, Output, OutputError, Refused, RunKind, Settled, Sighting, Stop, Stored, Watch,
};
use crate::log;
use crate::metrics;
use crate::network::NetworkMode;
use crate::supervise;

/// Runs on one Docker daemon.
#[derive(Clone)]
pub struct Docker {
    pub client: docker::Client,
    pub policy: Policy,
    pub options: spec::Options,
    /// Held while the open network is looked up or made.
    open_network: std::sync::Arc<std::sync::Mutex<()>>,
    /// The warm pools (`MCP_K8S_WARM_POOLS`), when the server keeps any.
    pools: Option<std::sync::Arc<pool::Pools>>,
    /// The output of warm runs, by container name, from the attach that
    /// delivered their assignment, until `output` takes it (shared by the
    /// clones the pools hold).
    attached: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, docker::stream::LogStream>>>,
}

/// How long the process waits at exit for removals under way.
const SHUTDOWN_REMOVALS: Duration = Duration::from_secs(10);

/// dockerd's words for a container on a network name two networks share.
const AMBIGUOUS: &str = "is ambiguous";

/// The daemon-wide lock around making the open network: a container of
/// this name, created and never started. Container names are unique on a
/// daemon, network names are not, so servers starting at once make the
/// network one at a time.
const OPEN_NETWORK_LOCK: &str = "mcp-k8s-open-network-lock";
/// How long a server waits for another one holding the lock; past it the
/// lock is taken to be a crashed server's and removed.
const OPEN_NETWORK_LOCK_WAIT: Duration = Duration::from_secs(10);

impl Docker {
    pub fn new(client: docker::Client, policy: Policy, options: spec::Options) -> Docker {
        Docker {
            client,
            policy,
            options,
            open_network: std::sync::Arc::new(std::sync::Mutex::new(())),
            pools: None,
            attached: std::sync::Arc::default(),
        }
    }

    /// The backend that hands runs to `pools`' sandboxes.
    pub fn with_pools(self, pools: Option<std::sync::Arc<pool::Pools>>) -> Docker {
        Docker { pools, ..self }
    }

    /// A run that took a warm sandbox (`claim`): its assignment on the
    /// container's stdin. A failed delivery removes the container (a
    /// sandbox that may have half-taken a run is never offered again).
    fn create_warm(&self, run: &NewRun, pools: &pool::Pools, reserved: &pool::Reserved) -> Result<Created, Refused> {
        if let Err(error) = pools.deliver(reserved, run.run_id, run.spec) {
            metrics::api_error("deliver_assignment");
            self.remove_now_or_log(run.run_id);
            return Err(Refused {
                reason: RunReason::ApiError,
                message: format!(
                    "could not hand the run to its warm container `{}` (pool `{}`): {}; the run did not start; try again (the pool replaces the container)",
                    reserved.name, reserved.pool, error.message
                ),
            });
        }
        log::info(
            "run handed to a warm container",
            &[("run_id", run.run_id.into()), ("container", reserved.name.as_str().into()), ("pool", reserved.pool.as_str().into())],
        );
        Ok(Created { name: reserved.name.clone(), created_at: Some(SystemTime::now()) })
    }

    /// The image is there, or pulled when the operator allows it.
    fn ensure_image(&self, image: &str) -> Result<(), Refused> {
        match self.client.image_exists(image) {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(error) => return Err(api_refusal("look up the image", &error)),
        }
        if self.options.pull == spec::Pull::Never {
            return Err(Refused {
                reason: RunReason::ImagePullFailed,
                message: format!(
                    "image `{image}` is not present on the Docker daemon, and images are never pulled (MCP_K8S_DOCKER_PULL=never); load it (`docker pull`, `docker load`) or set MCP_K8S_DOCKER_PULL=missing"
                ),
            });
        }
        self.client.image_pull(image, self.policy.start_timeout).map_err(|error| Refused {
            reason: RunReason::ImagePullFailed,
            message: format!("image `{image}` is not present on the Docker daemon and could not be pulled: {error}"),
        })
    }

    /// The run's network is there: the operator's for `restricted` (it
    /// must exist; the server never makes it), this server's for `open`,
    /// made when missing and checked when found.
    fn ensure_network(&self, mode: NetworkMode, image: &str) -> Result<(), Refused> {
        match mode {
            NetworkMode::None => Ok(()),
            NetworkMode::Restricted if self.options.restricted_network.is_none() => Err(Refused {
                reason: RunReason::Rejected,
                message: "network `restricted` is not available on this Docker backend: MCP_K8S_DOCKER_NETWORK names no network for it; ask for `none` or `open`, or have the operator set MCP_K8S_DOCKER_NETWORK".to_string(),
            }),
            NetworkMode::Restricted => self.ensure_restricted_network(),
            NetworkMode::Open => self.ensure_open_network(image),
        }
    }

    /// Looked up first: the daemon's 404 for a create on a missing network
    /// would read as a missing image.
    fn ensure_restricted_network(&self) -> Result<(), Refused> {
        let Some(network) = &self.options.restricted_network else { return Ok(()) };
        match self.client.network_inspect(network) {
            Ok(_) => Ok(()),
            Err(error) if error.is_not_found() => Err(Refused {
                reason: RunReason::Rejected,
                message: format!(
                    "the restricted network `{network}` (MCP_K8S_DOCKER_NETWORK) does not exist on the Docker daemon; the operator must create it, or ask for `none` or `open`"
                ),
            }),
            Err(error) => Err(api_refusal("look up the restricted network", &error)),
        }
    }

    /// This server's open network, made when missing. Servers on one
    /// daemon make it under the daemon-wide lock (`OPEN_NETWORK_LOCK`): two
    /// creates of one name at once would both succeed (Docker's duplicate
    /// check is best effort), and a container on a name two networks share
    /// cannot start. Duplicates made anyway (by an older server, by hand)
    /// are removed when empty. `image` is present: the lock is made of it.
    fn ensure_open_network(&self, image: &str) -> Result<(), Refused> {
        let _one_at_a_time = self.open_network.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut deadline = Instant::now() + OPEN_NETWORK_LOCK_WAIT;
        loop {
            if self.open_network_kept()?.is_some() {
                return Ok(());
            }
            match self.client.container_create(OPEN_NETWORK_LOCK, &record::never_started(image, BTreeMap::new())) {
                Ok(_) => {
                    let made = self.create_open_network_if_missing();
                    if let Err(error) = self.client.container_remove(OPEN_NETWORK_LOCK) {
                        log::warn("could not remove the open network's lock", &[("why", error.to_string().into())]);
                    }
                    return made;
                }
                // Another server holds it: its network will show.
                Err(error) if error.is_conflict() && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                Err(error) if error.is_conflict() => {
                    log::warn("removed a stale lock of the open network (a server that crashed while making it)", &[]);
                    let _ = self.client.container_remove(OPEN_NETWORK_LOCK);
                    // A live server may take the lock next: it gets the
                    // whole wait too, not an immediate removal.
                    deadline = Instant::now() + OPEN_NETWORK_LOCK_WAIT;
                }
                Err(error) => return Err(api_refusal("lock the making of the open network", &error)),
            }
        }
    }

    /// Under the lock: looks again (the last holder may have made it) and
    /// makes the network when it is still missing.
    fn create_open_network_if_missing(&self) -> Result<(), Refused> {
        if self.open_network_kept()?.is_some() {
            return Ok(());
        }
        match self.client.network_create(&spec::open_network()) {
            Ok(_) => log::info("created the network of open runs", &[("network", spec::OPEN_NETWORK.into())]),
            Err(error) if error.is_conflict() => {}
            Err(error) => return Err(api_refusal("create the open network", &error)),
        }
        match self.open_network_kept()? {
            Some(_) => Ok(()),
            None => Err(Refused {
                reason: RunReason::ApiError,
                message: format!("the Docker network `{}` was created but is not listed; run the job again", spec::OPEN_NETWORK),
            }),
        }
    }

    /// The open network's id, once its duplicates are gone.
    fn open_network_kept(&self) -> Result<Option<String>, Refused> {
        let networks = self.client.network_list().map_err(|error| api_refusal("look up the open network", &error))?;
        let found = spec::open_networks(&networks).map_err(|message| Refused { reason: RunReason::Rejected, message })?;
        for duplicate in &found.duplicates {
            match self.client.network_remove(duplicate) {
                Ok(()) => log::info("removed a duplicate of the network of open runs", &[("network", duplicate.as_str().into())]),
                // Gone already: another server removed it.
                Err(error) if error.is_not_found() => {}
                // A run still uses it ("has active endpoints"): open runs
                // cannot start on the shared name until that one ends.
                Err(error) => {
                    return Err(Refused {
                        reason: RunReason::ApiError,
                        message: format!(
                            "two Docker networks are named `{}` and the other one ({}) is still used by a run, so no open run can start: {error}; it is removed as soon as that run ends: run the job again then, or ask for network `none`",
                            spec::OPEN_NETWORK,
                            crate::echo::shorten(duplicate)
                        ),
                    });
                }
            }
        }
        Ok(found.keep)
    }

    /// Creates, fills and starts the containers; the caller removes what
    /// is left on a refusal.
    fn create_and_start(&self, run: &NewRun, name: &str) -> Result<(), CreateFailed> {
        let body = spec::container(run, &self.policy, &self.options);
        self.client.container_create(name, &body).map_err(|error| {
            let refused = create_refusal(&error, &run.spec.image);
            if error.is_conflict() { CreateFailed::NameTaken(refused) } else { CreateFailed::Refused(refused) }
        })?;
        if let Keep::Background { .. } = run.keep {
            let record = record::record_container(&run.spec.image, &body.labels);
            self.client
                .container_create(&record::container_name(record::ROLE_RECORD, run.run_id), &record)
                .map_err(|error| create_refusal(&error, &run.spec.image))?;
        }
        if spec::workdir_is_volume(run.spec, &self.options) {
            self.write_inputs(run, name)?;
        }
        self.client.container_start(name).map_err(|error| CreateFailed::Refused(start_refusal(&error, &self.options.runner_binary)))
    }

    /// The input files into the workdir volume, before the start.
    fn write_inputs(&self, run: &NewRun, name: &str) -> Result<(), Refused> {
        let archive = spec::inputs_archive(run.spec, self.policy.run_as_user).map_err(|message| Refused {
            reason: RunReason::InputFailed,
            message: format!("the input files cannot be archived: {message}"),
        })?;
        self.client.container_put_archive(name, &run.spec.workdir, &archive).map_err(|error| Refused {
            reason: RunReason::InputFailed,
            message: format!("the input files could not be written into the container: {error}"),
        })
    }

    fn kill(&self, run_id: &str, signal: &str) {
        match self.client.container_kill(&spec::container_name(run_id), signal) {
            // Not running (ended, or never started) or gone: nothing runs.
            Ok(()) => {}
            Err(error) if error.is_conflict() || error.is_not_found() => {}
            Err(error) => log::warn(
                "could not stop the run's container",
                &[("run_id", run_id.into()), ("signal", signal.into()), ("error", error.to_string().into())],
            ),
        }
    }

    /// SIGTERM (the runner reports the output so far), then SIGKILL after
    /// the runner's kill grace on a thread of its own.
    fn stop_container(&self, run_id: &str) -> Result<(), port::Error> {
        match self.client.container_inspect(&spec::container_name(run_id)) {
            Ok(inspect) if inspect.state.running => {}
            Ok(_) => return Ok(()),
            Err(error) if error.is_not_found() => return Ok(()),
            Err(error) => return Err(api_error("look at the run's container", &error)),
        }
        self.kill(run_id, "TERM");
        let backend = self.clone();
        let run_id = run_id.to_string();
        let spawned = supervise::spawn(supervise::Kind::ContainerKill, move || {
            std::thread::sleep(crate::sandbox::KILL_GRACE + Duration::from_secs(1));
            backend.kill(&run_id, "KILL");
        });
        if let Err(error) = spawned {
            // The runner ends on the SIGTERM; only a runner that hangs
            // outlives it, until its own timeout or the reaper.
            log::warn("could not start the thread that kills a stopped container after its grace", &[("error", error.to_string().into())]);
        }
        Ok(())
    }

    /// Keeps a warm run's output stream for `output`.
    fn keep_attached(&self, container: &str, stream: docker::stream::LogStream) {
        self.attached.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(container.to_string(), stream);
    }

    fn take_attached(&self, container: &str) -> Option<docker::stream::LogStream> {
        self.attached.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(container)
    }

    /// Every container of the run: the sandbox and a background run's
    /// record, verdict and cancel mark; the first failure, if any (every
    /// container is tried). Lists again until nothing is left, since a
    /// watcher may write the verdict while this removes (the writer takes
    /// its mark back when it finds the run gone: `record`).
    fn remove_now(&self, run_id: &str) -> Result<(), String> {
        for _ in 0..REMOVAL_ROUNDS {
            let containers =
                record::containers_of(&self.client, run_id).map_err(|error| format!("could not list the run's containers: {error}"))?;
            let all = [&containers.run, &containers.record, &containers.verdict, &containers.cancel];
            if all.iter().all(|container| container.is_none()) {
                return Ok(());
            }
            let mut first_failure = Ok(());
            for container in all.into_iter().flatten() {
                if let Err(error) = try_remove_container(&self.client, &container.id) {
                    metrics::api_error("remove_container");
                    first_failure = first_failure.and(Err(format!("could not remove container {}: {error}", container.id)));
                }
            }
            first_failure?;
        }
        Err(format!("the run's containers were still there after {REMOVAL_ROUNDS} rounds of removal"))
    }

    /// `remove_now` where the caller goes on either way (a create that
    /// failed): a failure is logged, and the reaper removes what is left.
    fn remove_now_or_log(&self, run_id: &str) {
        if let Err(error) = self.remove_now(run_id) {
            log::warn("the run's containers were not removed; the reaper will", &[("run_id", run_id.into()), ("error", error.into())]);
        }
    }

    fn find_stored(&self, run_id: &str, with_sandbox: bool) -> Result<Option<Stored>, docker::Error> {
        let containers = record::containers_of(&self.client, run_id)?;
        let inspect = match &containers.run {
            Some(run) => match self.client.container_inspect(&run.id) {
                Ok(inspect) => Some(inspect),
                Err(error) if error.is_not_found() => None,
                Err(error) => return Err(error),
            },
            None => None,
        };
        let Some(mut stored) = record::stored(run_id, &containers, inspect.as_ref()) else { return Ok(None) };
        if with_sandbox {
            stored.sandbox = inspect.as_ref().map(|inspect| sighting(&self.client, inspect));
        }
        Ok(Some(stored))
    }
}

/// A create that failed, by whether what it made may be removed.
enum CreateFailed {
    /// The run's container name is taken: another process's run of the
    /// same id (two calls with one idempotency key) holds it.
    NameTaken(Refused),
    /// Anything else: what this create made of the run is removed.
    Refused(Refused),
}

impl From<Refused> for CreateFailed {
    fn from(refused: Refused) -> CreateFailed {
        CreateFailed::Refused(refused)
    }
}

/// Removes one container (with its anonymous volumes); one already gone
/// is fine, any other failure is counted and logged as `unremoved`.
pub(crate) fn remove_container(client: &docker::Client, container: &str, unremoved: &str) {
    if let Err(error) = try_remove_container(client, container) {
        metrics::api_error("remove_container");
        log::warn(unremoved, &[("container", container.into()), ("error", error.to_string().into())]);
    }
}

/// Removes one container (with its anonymous volumes); one already gone
/// is fine.
/// How many times `remove_now` lists and removes: a mark written during
/// the first round is found by the second; more means something keeps
/// making the run's containers.
const REMOVAL_ROUNDS: usize = 4;

fn try_remove_container(client: &docker::Client, container: &str) -> Result<(), docker::Error> {
    match client.container_remove(container) {
        Err(error) if error.is_not_found() => Ok(()),
        other => other,
    }
}

impl Backend for Docker {
    fn claim(&self, spec: &crate::engine::port::spec::RunSpec, kind: RunKind) -> Option<String> {
        // A background run is listed and kept by its containers' labels
        // (mode, token, expiry: `record`), which a container made ahead
        // cannot carry (labels never change): it runs cold.
        match kind {
            RunKind::Sync => self.pools.as_ref()?.claim(spec),
            RunKind::Background => None,
        }
    }

    fn create(&self, run: &NewRun) -> Result<Created, Refused> {
        if let Some(pools) = &self.pools
            && let Some(reserved) = pools.take_reserved(run.run_id)
        {
            if let Keep::UntilRemoved { .. } = run.keep {
                return self.create_warm(run, pools, &reserved);
            }
            // Never claimed for one (`claim`); should it happen, it runs
            // cold under the id it claimed, in a container of its own.
            self.remove_now_or_log(run.run_id);
        }
        if run.spec.clone.is_some() || self.policy.clone.is_some() {
            return Err(Refused {
                reason: RunReason::Rejected,
                message: "`clone` is not supported on the Docker backend yet; unset MCP_K8S_CLONE_IMAGE and MCP_K8S_CLONE_SECRET, pass the files in `files`, or use MCP_K8S_BACKEND=kubernetes".to_string(),
            });
        }
        if self.policy.cache.is_some() {
            return Err(Refused {
                reason: RunReason::Rejected,
                message: "the cache volume is not supported on the Docker backend yet; unset MCP_K8S_CACHE_PVC and MCP_K8S_CACHE_MOUNT_PATH, or use MCP_K8S_BACKEND=kubernetes".to_string(),
            });
        }
        self.ensure_image(&run.spec.image)?;
        self.ensure_network(run.spec.network, &run.spec.image)?;
        let name = spec::container_name(run.run_id);
        let mut attempt = self.create_and_start(run, &name);
        let ambiguous = |attempt: &Result<(), CreateFailed>| matches!(attempt, Err(CreateFailed::Refused(refused)) if refused.message.contains(AMBIGUOUS));
        if run.spec.network == NetworkMode::Open && ambiguous(&attempt) {
            // Another server made a duplicate of the open network between
            // this one's check and its create: remove it and go again, once.
            self.remove_now_or_log(run.run_id);
            self.ensure_network(run.spec.network, &run.spec.image)?;
            attempt = self.create_and_start(run, &name);
        }
        match attempt {
            Ok(()) => {}
            // Another process's run holds the name (an idempotency key's,
            // made at the same moment): it is theirs, left as it is.
            Err(CreateFailed::NameTaken(refused)) => return Err(refused),
            Err(CreateFailed::Refused(refused)) => {
                metrics::api_error("create_container");
                self.remove_now_or_log(run.run_id);
                return Err(refused);
            }
        }
        log::info("container started", &[("run_id", run.run_id.into()), ("container", name.as_str().into())]);
        Ok(Created { name, created_at: Some(SystemTime::now()) })
    }

    fn watch(&self, run_id: &str) -> Watch {
        watch::start(self.client.clone(), spec::container_name(run_id))
    }

    fn probe(&self, run_id: &str) -> Result<Option<Sighting>, port::Error> {
        match self.client.container_inspect(&spec::container_name(run_id)) {
            Ok(inspect) => Ok(Some(sighting(&self.client, &inspect))),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(api_error("inspect the run's container", &error)),
        }
    }

    /// Every refusal comes back from `create` itself.
    fn start_failure(&self, _run_id: &str) -> Option<(RunReason, String)> {
        None
    }

    fn start_progress(&self, run_id: &str) -> String {
        match self.client.container_inspect(&spec::container_name(run_id)) {
            Ok(inspect) => format!("the container was `{}`", inspect.state.status),
            Err(error) => format!("the container could not be inspected: {error}"),
        }
    }

    /// The container's log, followed: stdout carries the runner's frames
    /// (stderr only the runner's own complaints, kept aside by the client).
    /// A warm run's output comes back on the attach that delivered it,
    /// once; the log is read after that (a stream that broke, another
    /// process).
    ///
    /// The log of a container that has ended is read to its end without
    /// `follow`: Podman 4.3 ends a followed log of an exited container at
    /// a point of its own (measured: mid-line, megabytes before the end,
    /// in 5 of 11 runs with ~10 MB of frames) and reads the whole log
    /// without it (11 of 11). dockerd reads the same either way. Only a
    /// log read looks at the container: a warm run's attach needs no look.
    fn output(&self, sandbox: &str) -> Result<Output, OutputError> {
        let read_log = || {
            let ended = matches!(self.client.container_inspect(sandbox), Ok(inspect) if !inspect.state.running);
            self.client.container_logs(sandbox, &docker::LogParams { follow: !ended, idle_timeout: None })
        };
        match self.take_attached(sandbox).map(Ok).unwrap_or_else(read_log) {
            Ok(stream) => {
                let handle = stream.abort_handle();
                Ok(Output { reader: Box::new(stream), abort: Abort::new(move || handle.abort()) })
            }
            Err(error) if error.is_not_found() => Err(OutputError::Gone(format!("the log could not be read: {error}"))),
            Err(error) => Err(OutputError::Unavailable(error.to_string())),
        }
    }

    /// The inputs are files in the workdir, which the command owns now.
    fn inputs_used(&self, _run_id: &str) {}

    /// A container does not restart on its own (no restart policy), so a
    /// stopped one never runs again: every kind of stop is the same, and
    /// the container stays, with its log, until `remove` or the reaper.
    fn stop(&self, run_id: &str, _how: Stop) -> Result<(), port::Error> {
        self.stop_container(run_id)
    }

    /// After the answer: on a thread of its own (`removal`), which the
    /// process waits for before it exits.
    fn remove(&self, run_id: &str) {
        // An output stream nobody took (the run ended before it was read)
        // closes now: an attach nobody reads could hold the container's
        // writes up.
        drop(self.take_attached(&spec::container_name(run_id)));
        let backend = self.clone();
        let owned = run_id.to_string();
        removal::spawn(run_id, move || backend.remove_now(&owned));
    }

    fn find(&self, run_id: &str) -> Result<Option<Stored>, port::Error> {
        self.find_stored(run_id, true).map_err(|error| api_error("look up the run's containers", &error))
    }

    fn list(&self) -> Result<Vec<Stored>, port::Error> {
        let runs = record::background_runs(&self.client).map_err(|error| api_error("list the background runs", &error))?;
        let mut stored = Vec::new();
        for (run_id, containers) in &runs {
            let inspect = containers.run.as_ref().and_then(|run| self.client.container_inspect(&run.id).ok());
            stored.extend(record::stored(run_id, containers, inspect.as_ref()));
        }
        Ok(stored)
    }

    fn record(&self, run_id: &str, verdict: &Recorded) -> Result<Settled, port::Error> {
        record::write_verdict(&self.client, run_id, verdict).map_err(|error| api_error("record the outcome", &error))
    }

    fn mark_cancelled(&self, run_id: &str, at: SystemTime) -> Result<(), port::Error> {
        record::mark_cancelled(&self.client, run_id, at).map_err(|error| api_error("mark the run cancelled", &error))
    }

    fn reap(&self, now: SystemTime) -> usize {
        reaper::reap_once(&self.client, now)
    }

    fn wording(&self) -> &'static Wording {
        &WORDING
    }

    fn sandbox_store(&self) -> Option<&dyn crate::engine::port::SandboxStore> {
        Some(self)
    }

    /// A run's containers are removed after its answer on threads of their
    /// own (`removal`): they end before the process does.
    fn shutdown(&self) {
        removal::finish(SHUTDOWN_REMOVALS);
        if let Some(pools) = &self.pools {
            pools.drain();
        }
    }

    fn pool_figures(&self) -> Vec<port::PoolFigures> {
        self.pools.as_ref().map(|pools| pools.figures()).unwrap_or_default()
    }
}

/// What Docker users call the parts of a run.
pub const WORDING: Wording = Wording {
    sandbox: "container",
    created: "container",
    stopper: "this server",
    pids_limit: "the container's pids limit, 1024",
    outside_deleters: "docker rm, docker kill, a cleanup script",
    api: "the Docker daemon",
};

/// A container as the engine sees it, its end named as the daemon's when
/// it came while the daemon was away (`classify::with_outage`).
pub fn sighting(client: &docker::Client, inspect: &docker::objects::ContainerInspect) -> Sighting {
    let seen = classify::sighting(inspect);
    let outage = seen.times.finished.and_then(|at| client.outage_around(at));
    classify::with_outage(seen, outage)
}

fn api_error(what: &'static str, error: &docker::Error) -> port::Error {
    port::Error { what, kind: error_kind(error), message: error.to_string() }
}

/// What a daemon's failure means for whoever asked.
fn error_kind(error: &docker::Error) -> ErrorKind {
    use docker::Error as E;
    match error {
        E::SocketMissing { .. }
        | E::DaemonNotRunning { .. }
        | E::Connect { .. }
        | E::Timeout { .. }
        | E::Transport { .. }
        | E::Aborted { .. } => ErrorKind::Transient,
        E::Status { code, .. } if *code == 429 || *code >= 500 => ErrorKind::Transient,
        E::PermissionDenied { .. } => ErrorKind::Denied,
        E::Status { code: 401 | 403, .. } => ErrorKind::Denied,
        E::NotFound { .. } => ErrorKind::NotFound,
        E::UnsupportedHost { .. }
        | E::ApiTooOld { .. }
        | E::InvalidName { .. }
        | E::Conflict { .. }
        | E::Status { .. }
        | E::Protocol { .. }
        | E::Decode { .. }
        | E::TooLarge { .. }
        | E::Progress { .. } => ErrorKind::Refused,
    }
}

fn api_refusal(what: &str, error: &docker::Error) -> Refused {
    Refused { reason: RunReason::ApiError, message: format!("could not {what}: {error}; the run did not start") }
}

/// A refused create: the image vanished, the daemon refused the body, or
/// the daemon is away.
fn create_refusal(error: &docker::Error, image: &str) -> Refused {
    match error {
        docker::Error::NotFound { .. } => {
            Refused { reason: RunReason::ImagePullFailed, message: format!("image `{image}` is not present on the Docker daemon: {error}") }
        }
        docker::Error::Status { .. } => {
            Refused { reason: RunReason::ContainerFailed, message: format!("the Docker daemon refused the container: {error}") }
        }
        _ => api_refusal("create the container", error),
    }
}

/// A start the runtime refused: most often the runner binary (a bind of a
/// path that does not exist, or a binary that cannot run in the image).
fn start_refusal(error: &docker::Error, runner_binary: &str) -> Refused {
    if error.is_unreachable() {
        return api_refusal("start the container", error);
    }
    Refused {
        reason: RunReason::StartFailed,
        message: format!(
            "the container could not start: {error}; check that MCP_K8S_RUNNER_BINARY (`{runner_binary}`) is a static Linux binary of this server on the daemon's host"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn the_daemons_failures_keep_their_kind() {
        let socket = || PathBuf::from("/run/docker.sock");
        let status = |code: u16| docker::Error::Status { verb: "GET", path: "/x".into(), code, message: String::new() };
        let cases = [
            (docker::Error::DaemonNotRunning { socket: socket() }, ErrorKind::Transient),
            (docker::Error::SocketMissing { socket: socket() }, ErrorKind::Transient),
            (docker::Error::Timeout { verb: "GET", path: "/x".into() }, ErrorKind::Transient),
            (status(500), ErrorKind::Transient),
            (status(429), ErrorKind::Transient),
            (docker::Error::PermissionDenied { socket: socket() }, ErrorKind::Denied),
            (status(403), ErrorKind::Denied),
            (docker::Error::NotFound { verb: "GET", path: "/x".into(), message: "no such container".into() }, ErrorKind::NotFound),
            (docker::Error::Conflict { verb: "POST", path: "/x".into(), message: "name in use".into() }, ErrorKind::Refused),
            (status(400), ErrorKind::Refused),
            (docker::Error::Protocol { verb: "GET", path: "/x".into(), message: "bad chunk".into() }, ErrorKind::Refused),
        ];
        for (error, kind) in cases {
            assert_eq!(api_error("look", &error).kind, kind, "{error}");
        }
    }
}
