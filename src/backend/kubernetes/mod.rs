//! The Kubernetes backend: a run is a Job (with an inputs Secret it owns)
//! whose pod runs the caller's image with the runner as its entrypoint.
//! `manifest` builds the objects, `classify` reads pod status into the
//! engine's neutral views, `watch` follows the run's pods, `record` keeps a
//! background run's record and verdict in the Job's annotations, `reaper`
//! deletes what expired, `permissions` lists the RBAC the server needs,
//! `template` checks the operator's pod template (merged into every Job by
//! `manifest`), `doctor` checks a cluster's set-up against the configuration,
//! `pool` makes, watches, hands runs to and deletes warm pool sandboxes for
//! the engine's pool manager.
//!
//! Speaks to the API server only through `kube`; decides nothing about a
//! run's end (the engine's `decide` does).

pub mod classify;
pub mod connect;
pub mod doctor;
pub mod manifest;
pub mod open_reach;
pub mod permissions;
pub mod pool;
pub mod reaper;
pub mod record;
pub mod sandbox;
pub mod settings;
pub mod template;
pub mod watch;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::backend::kubernetes::settings::Settings;
use crate::backend::kubernetes::template::PodTemplate;
use crate::engine::port::facts::{Recorded, SandboxState, Wording};
use crate::engine::port::spec::{Policy, RunReason, RunSpec};
use crate::engine::port::{
    self, Abort, Backend, Created, ErrorKind, Keep, NewRun, Output, OutputError, Refused, Settled, Sighting, Stop, Stored, Watch,
};
use crate::kube::objects::{Event, Job, Pod};
use crate::kube::{self, ListParams, Resource};
use crate::log;
use crate::metrics;
use crate::sandbox::held;

/// Runs on a cluster, in `cluster.namespace`.
#[derive(Clone)]
pub struct Kubernetes {
    pub client: kube::Client,
    pub policy: Policy,
    /// What only a cluster run reads (namespace, runner image, fence wait).
    pub cluster: Settings,
    /// The operator's pod template (`MCP_K8S_POD_TEMPLATE`), checked at
    /// start; merged into every Job this backend creates. Kept here, not in
    /// the engine's `Policy`, because its fields are Kubernetes' own.
    pub pod_template: Option<Arc<PodTemplate>>,
    /// The warm pools (`MCP_K8S_WARM_POOLS`), if any.
    pub pools: Option<Arc<pool::Pools>>,
    /// The one pod watch every run reads.
    pods: watch::PodHub,
}

impl Kubernetes {
    pub fn new(client: kube::Client, policy: Policy, cluster: Settings) -> Kubernetes {
        let pods = watch::PodHub::new(client.clone(), cluster.namespace.clone());
        Kubernetes { client, policy, cluster, pod_template: None, pools: None, pods }
    }

    pub fn with_pod_template(mut self, pod_template: Option<PodTemplate>) -> Kubernetes {
        self.pod_template = pod_template.map(Arc::new);
        self
    }

    pub fn with_pools(mut self, pools: Option<Arc<pool::Pools>>) -> Kubernetes {
        self.pools = pools;
        self
    }

    /// Hands the run to the warm sandbox it claimed: the Job becomes the
    /// run's (retention, record, deadline), then the runner gets its
    /// assignment. A failure deletes the sandbox; the run did not start.
    fn create_warm(&self, run: &NewRun, pools: &pool::Pools, reserved: &pool::Reserved) -> Result<Created, Refused> {
        let name = manifest::job_name(run.run_id);
        let job_age = SystemTime::now().duration_since(reserved.made.created).unwrap_or_default();
        let patch =
            pool::claim_patch(&retention(run, &self.cluster), job_age, crate::engine::port::spec::run_deadline(run.spec, &self.policy));
        let handed = self
            .client
            .merge_patch(Resource::JOBS, self.namespace(), &name, &patch)
            .map_err(|error| ("make the warm Job the run's", error.to_string()))
            .and_then(|_| pools.deliver(reserved, run.run_id, run.spec).map_err(|error| ("hand the run to its warm pod", error.message)));
        if let Err((what, error)) = handed {
            metrics::api_error("deliver_assignment");
            self.remove(run.run_id);
            return Err(Refused {
                reason: RunReason::ApiError,
                message: format!(
                    "could not {what} `{}` (pool `{}`): {error}; the warm pod was removed, so nothing of the run is running; try again (the pool replaces the pod)",
                    reserved.name, reserved.pool
                ),
            });
        }
        log::info(
            "run handed to a warm pod",
            &[("run_id", run.run_id.into()), ("pod", reserved.name.as_str().into()), ("pool", reserved.pool.as_str().into())],
        );
        Ok(Created { name, created_at: Some(SystemTime::now()) })
    }

    fn namespace(&self) -> &str {
        &self.cluster.namespace
    }

    /// The run's pods, as typed views.
    fn pods(&self, run_id: &str) -> Result<Vec<Pod>, kube::Error> {
        let list = self.client.list(Resource::PODS, self.namespace(), &run_pods(run_id))?;
        Ok(list.items.iter().map(Pod::from_value).collect())
    }

    fn job(&self, run_id: &str) -> Result<Option<Job>, kube::Error> {
        let job = self.client.get_if_exists(Resource::JOBS, self.namespace(), &manifest::job_name(run_id))?;
        Ok(job.as_ref().map(Job::from_value))
    }

    fn delete_secret(&self, name: &str) {
        if let Err(error) = self.client.delete(Resource::SECRETS, self.namespace(), name) {
            metrics::api_error("delete_secret");
            log::warn(
                "inputs secret not deleted; the garbage collector will remove it with its Job",
                &[("secret", name.into()), ("error", error.to_string().into())],
            );
        }
    }

    /// Deletes the run's pods that `keep` does not spare. Failures are
    /// logged: the Job's deadline and the pod's own deadline stop the pod
    /// anyway.
    fn delete_pods(&self, run_id: &str, spare_finished: bool) {
        let pods = match self.pods(run_id) {
            Ok(pods) => pods,
            Err(error) => {
                log::warn("could not list the run's pods to stop them", &[("run_id", run_id.into()), ("error", error.to_string().into())]);
                return;
            }
        };
        for pod in pods.iter().filter(|pod| !spare_finished || classify::finished_pod(pod).is_none()) {
            let name = pod.metadata.name.as_str();
            if let Err(error) = self.client.delete(Resource::PODS, self.namespace(), name) {
                log::warn("could not delete the run's pod", &[("pod", name.into()), ("error", error.to_string().into())]);
            }
        }
    }

    /// Sets the Job's deadline so that its controller deletes its pods and
    /// creates no other.
    fn stop_job(&self, run_id: &str) -> Result<(), kube::Error> {
        let patch = serde_json::json!({"spec": {"activeDeadlineSeconds": 1}});
        match self.client.merge_patch(Resource::JOBS, self.namespace(), &manifest::job_name(run_id), &patch) {
            Ok(_) => Ok(()),
            // Gone already, or finished (a finished Job refuses nothing here,
            // but an older API server may): either way it starts no pod.
            Err(error) if error.is_not_found() || error.is_invalid() => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Whether the main container's log, as its node serves it now, shows
    /// the runner started the command. A container the node has not
    /// started answers with an error: not started.
    fn node_shows_start(&self, pod: &str) -> bool {
        let params = kube::LogParams {
            container: Some(manifest::MAIN_CONTAINER.to_string()),
            limit_bytes: Some(START_PROOF_BYTES),
            ..kube::LogParams::default()
        };
        self.client.pod_logs(self.namespace(), pod, &params).is_ok_and(|log| crate::sandbox::frame::shows_start(&log))
    }

    /// The pod's events, oldest first; none when they cannot be read.
    fn pod_events(&self, pod_name: &str) -> Vec<Event> {
        let params =
            ListParams { label_selector: None, field_selector: Some(format!("involvedObject.kind=Pod,involvedObject.name={pod_name}")) };
        let mut events = match self.client.list(Resource::EVENTS, self.namespace(), &params) {
            Ok(list) => Event::from_values(&list.items),
            Err(_) => {
                metrics::api_error("list_events");
                return Vec::new();
            }
        };
        events.sort_by_key(|event| event.last_timestamp.clone().or_else(|| event.event_time.clone()).unwrap_or_default());
        events
    }
}

/// How long each wait for the held output's next bytes may take.
const HELD_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a 503 (the sandbox's port not reachable yet) is retried.
const HELD_RETRY_FOR: Duration = Duration::from_secs(5);

fn held_target<'a>(namespace: &'a str, pod: &'a str, port: u16, path: &'a str) -> kube::ProxyTarget<'a> {
    kube::ProxyTarget { namespace, pod, port, path, read_timeout: HELD_READ_TIMEOUT }
}

/// What an operator does about a held output the server could not fetch.
fn held_error(what: &'static str, error: &kube::Error, namespace: &str) -> port::Error {
    port::Error { what, kind: error_kind(error), message: held_advice(error, namespace) }
}

fn held_advice(error: &kube::Error, namespace: &str) -> String {
    match error.code() {
        Some(403) => format!(
            "the server may not create pods/proxy in namespace `{namespace}` ({error}); grant it with deploy/outputs.optional.yaml or the chart's outputs values"
        ),
        _ => format!(
            "the API server could not fetch it from the sandbox's port {} ({error}); a NetworkPolicy must let the API server reach the job pods labelled {}=held on that port (deploy/outputs.optional.yaml)",
            held::PORT,
            manifest::LABEL_OUTPUTS
        ),
    }
}

impl port::HeldOutputs for Kubernetes {
    /// Through `pods/proxy`, as a warm pool's assignment goes: the server
    /// needs no route to pod IPs.
    fn fetch(&self, sandbox: &str, port: u16, key: &str, offset: u64) -> Result<Output, port::Error> {
        let started = std::time::Instant::now();
        let to = held_target(self.namespace(), sandbox, port, held::FETCH_PATH);
        loop {
            match self.client.proxy_post_stream(&to, held::fetch_body(key, offset).into_bytes()) {
                Ok(stream) => {
                    let handle = stream.abort_handle();
                    return Ok(Output { reader: Box::new(stream), abort: Abort::new(move || handle.abort()) });
                }
                // The API server says 503 while it cannot reach the port yet.
                Err(error) if error.code() == Some(503) && started.elapsed() < HELD_RETRY_FOR => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(error) => return Err(held_error("fetch the output held in the sandbox", &error, self.namespace())),
            }
        }
    }

    fn release(&self, sandbox: &str, port: u16, key: &str) -> Result<(), port::Error> {
        let to = held_target(self.namespace(), sandbox, port, held::RELEASE_PATH);
        self.client
            .proxy_post(&to, key.as_bytes().to_vec())
            .map(drop)
            .map_err(|error| held_error("release the runner holding output", &error, self.namespace()))
    }
}

impl Backend for Kubernetes {
    /// The Job, then its inputs Secret (owned by the Job); nothing is left
    /// when either is refused.
    fn create(&self, run: &NewRun) -> Result<Created, Refused> {
        if let Some(pools) = &self.pools
            && let Some(reserved) = pools.take_reserved(run.run_id)
        {
            return self.create_warm(run, pools, &reserved);
        }
        let namespace = self.namespace();
        let name = manifest::job_name(run.run_id);
        let retention = retention(run, &self.cluster);
        let mut job_manifest = manifest::job(run.spec, &self.policy, &self.cluster, run.run_id);
        if let Some(pod_template) = &self.pod_template {
            manifest::apply_pod_template(&mut job_manifest, pod_template);
        }
        manifest::apply_retention(&mut job_manifest, &retention);
        if let Some(start_by) = run.start_by {
            manifest::apply_start_deadline(&mut job_manifest, crate::time::unix_ms(start_by));
        }
        if let Some(until) = fence_until(run) {
            manifest::apply_fence_deadline(&mut job_manifest, crate::time::unix_ms(until));
        }
        let job = self.client.create(Resource::JOBS, namespace, &job_manifest).map_err(|error| {
            metrics::api_error("create_job");
            refusal("create the Job", &error)
        })?;
        log::info("job created", &[("run_id", run.run_id.into()), ("job", name.as_str().into())]);
        let job = Job::from_value(&job);
        if let Some(mut secret) = manifest::inputs_secret(run.spec, &self.cluster, run.run_id, &job.metadata.uid) {
            manifest::apply_retention(&mut secret, &retention);
            if let Err(error) = self.client.create(Resource::SECRETS, namespace, &secret) {
                metrics::api_error("create_secret");
                self.remove(run.run_id);
                return Err(refusal("create the inputs Secret", &error));
            }
        }
        Ok(Created { name, created_at: time_of(job.metadata.creation_timestamp.as_deref()) })
    }

    fn claim(&self, spec: &RunSpec, _kind: crate::engine::port::RunKind) -> Option<String> {
        // Both kinds: a background run's record goes on the Job by patch.
        self.pools.as_ref()?.claim(spec)
    }

    fn watch(&self, run_id: &str) -> Watch {
        self.pods.watch(run_id)
    }

    /// The pod's status, and, while it says the command has not started,
    /// the node's own word: on a loaded node the kubelet's status reports
    /// reach the API seconds to a minute late, so a pod the API shows
    /// waiting may be running its command. The kubelet serves the main
    /// container's log from what it knows now; a `Started` frame there
    /// means the command started, and the run is followed, never judged
    /// as not started.
    fn probe(&self, run_id: &str) -> Result<Option<Sighting>, port::Error> {
        let pods = self.pods(run_id).map_err(|error| api_error("list the run's pods", &error))?;
        let Some(pod) = watch::newest(pods) else { return Ok(None) };
        let mut sighting = watch::sighting(&pod);
        if sighting.view.state == SandboxState::Pending && pod.spec.node_name.is_some() && self.node_shows_start(&pod.metadata.name) {
            sighting.view.state = SandboxState::Running;
        }
        Ok(Some(sighting))
    }

    fn start_failure(&self, run_id: &str) -> Option<(RunReason, String)> {
        let job_name = manifest::job_name(run_id);
        let params =
            ListParams { label_selector: None, field_selector: Some(format!("involvedObject.kind=Job,involvedObject.name={job_name}")) };
        // A failed look is not fatal: the start timeout still ends the run.
        let events = match self.client.list(Resource::EVENTS, self.namespace(), &params) {
            Ok(events) => Event::from_values(&events.items),
            Err(_) => {
                metrics::api_error("list_events");
                return None;
            }
        };
        let (reason, message) = classify::failed_create(&events)?;
        Some((reason, refusal_message(reason, &message)))
    }

    fn start_progress(&self, run_id: &str) -> String {
        let pod = self.pods(run_id).ok().and_then(watch::newest);
        let events = pod.as_ref().map(|pod| self.pod_events(&pod.metadata.name)).unwrap_or_default();
        classify::start_progress(pod.as_ref(), &events)
    }

    /// The main container's log: a container that is not ready yet (400)
    /// and an API server away are worth another try; a pod that is gone
    /// (404) is not.
    fn output(&self, sandbox: &str) -> Result<Output, OutputError> {
        let params = kube::LogParams { container: Some(manifest::MAIN_CONTAINER.to_string()), ..kube::LogParams::default() };
        match self.client.follow_pod_logs(self.namespace(), sandbox, &params) {
            Ok(stream) => {
                let handle = stream.abort_handle();
                Ok(Output { reader: Box::new(stream), abort: Abort::new(move || handle.abort()) })
            }
            Err(error) if error.is_not_found() => {
                metrics::api_error("follow_log");
                Err(OutputError::Gone(format!("the log could not be read: {error}")))
            }
            Err(error) => Err(OutputError::Unavailable(error.to_string())),
        }
    }

    fn inputs_used(&self, run_id: &str) {
        self.delete_secret(&manifest::job_name(run_id));
    }

    fn stop(&self, run_id: &str, how: Stop) -> Result<(), port::Error> {
        match how {
            Stop::ForGood => {
                let stopped = self.stop_job(run_id);
                self.delete_pods(run_id, true);
                stopped.map_err(|error| api_error("stop the Job", &error))
            }
            Stop::Live => {
                self.delete_pods(run_id, true);
                Ok(())
            }
            Stop::All => {
                self.delete_pods(run_id, false);
                Ok(())
            }
        }
    }

    /// Background propagation: the Job goes at once and the garbage
    /// collector removes the pod; nothing here waits for it.
    fn remove(&self, run_id: &str) {
        let name = manifest::job_name(run_id);
        if let Err(error) = self.client.delete(Resource::JOBS, self.namespace(), &name) {
            metrics::api_error("delete_job");
            log::warn(
                "job not deleted; ttlSecondsAfterFinished and the reaper will remove it",
                &[("job", name.as_str().into()), ("error", error.to_string().into())],
            );
        }
        self.delete_secret(&name);
    }

    fn find(&self, run_id: &str) -> Result<Option<Stored>, port::Error> {
        let Some(job) = self.job(run_id).map_err(|error| api_error("look up the Job", &error))? else { return Ok(None) };
        let Some(mut stored) = record::stored(&job) else { return Ok(None) };
        let pods = self.pods(run_id).map_err(|error| api_error("list the job's pods", &error))?;
        stored.sandbox = watch::newest(pods).map(|pod| watch::sighting(&pod));
        Ok(Some(stored))
    }

    fn list(&self) -> Result<Vec<Stored>, port::Error> {
        let params = ListParams {
            label_selector: Some(format!(
                "{}={},{}={}",
                manifest::LABEL_MANAGED_BY,
                manifest::MANAGED_BY,
                manifest::LABEL_MODE,
                manifest::MODE_BACKGROUND
            )),
            field_selector: None,
        };
        let jobs =
            self.client.list(Resource::JOBS, self.namespace(), &params).map_err(|error| api_error("list the background Jobs", &error))?;
        Ok(jobs.items.iter().map(Job::from_value).filter_map(|job| record::stored(&job)).collect())
    }

    fn record(&self, run_id: &str, verdict: &Recorded) -> Result<Settled, port::Error> {
        record::write_verdict(&self.client, self.namespace(), run_id, verdict)
            .map_err(|error| api_error("record the outcome on the Job", &error))
    }

    fn mark_cancelled(&self, run_id: &str, at: SystemTime) -> Result<(), port::Error> {
        let patch = serde_json::json!({"metadata": {"annotations": record::cancel_mark(at)}});
        self.client
            .merge_patch(Resource::JOBS, self.namespace(), &manifest::job_name(run_id), &patch)
            .map(|_| ())
            .map_err(|error| api_error("mark the Job cancelled", &error))
    }

    fn reap(&self, now: SystemTime) -> usize {
        reaper::reap_once(&self.client, self.namespace(), now)
    }

    fn sandbox_store(&self) -> Option<&dyn crate::engine::port::SandboxStore> {
        Some(self)
    }

    fn held_outputs(&self) -> Option<&dyn port::HeldOutputs> {
        Some(self)
    }

    fn wording(&self) -> &'static Wording {
        &WORDING
    }

    fn shutdown(&self) {
        if let Some(pools) = &self.pools {
            pools.drain();
        }
    }

    /// A site with no run watching its pods (none for the watch's
    /// `LINGER`) and no warm pool (whose thread calls the API all along)
    /// keeps no connection open: its next call connects anew.
    fn rest(&self) {
        if self.pools.is_some() || self.pods.is_open() {
            return;
        }
        if let Err(error) = self.client.close_idle_connections() {
            log::warn("could not close the idle API connections", &[("error", serde_json::json!(error.to_string()))]);
        }
    }

    fn pool_figures(&self) -> Vec<port::PoolFigures> {
        self.pools.as_ref().map(|pools| pools.figures()).unwrap_or_default()
    }
}

/// What Kubernetes users call the parts of a run.
pub const WORDING: Wording = Wording {
    sandbox: "pod",
    created: "Job",
    stopper: "the kubelet",
    pids_limit: "the kubelet's podPidsLimit",
    outside_deleters: "kubectl delete, a controller, a node drain",
    api: "the API server",
};

/// The retention of a run's objects, as annotations and the Job's TTL.
fn retention(run: &NewRun, cluster: &Settings) -> manifest::Retention {
    match &run.keep {
        Keep::UntilRemoved { expires_at } => {
            manifest::Retention { expires_at: log::rfc3339_utc(*expires_at), finished_ttl: cluster.finished_ttl, background: None }
        }
        Keep::Background { record: background, result_ttl, expires_at } => manifest::Retention {
            expires_at: log::rfc3339_utc(*expires_at),
            finished_ttl: *result_ttl,
            background: Some(record::background_annotations(background)),
        },
    }
}

/// How much of the main container's log the start check reads: the
/// `Started` frame is the runner's first line.
const START_PROOF_BYTES: u64 = 4096;

/// How long before its start deadline a background run's fence wait
/// gives up: time for the kubelet to report the failed `prepare` step, so
/// the run ends `NetworkPolicyNotEnforced` rather than `StartTimeout`.
const FENCE_VERDICT_MARGIN: Duration = Duration::from_secs(3);

/// Until when a run waits for a late fence beyond the fence setting: a
/// background run exists to wait, so up to its start deadline (less the
/// margin); a sync run, whose caller is waiting, only the setting's bound.
fn fence_until(run: &NewRun) -> Option<SystemTime> {
    match (&run.keep, run.start_by) {
        (Keep::Background { .. }, Some(start_by)) => start_by.checked_sub(FENCE_VERDICT_MARGIN),
        _ => None,
    }
}

fn run_pods(run_id: &str) -> ListParams {
    ListParams { label_selector: Some(format!("{}={run_id}", manifest::LABEL_RUN_ID)), field_selector: None }
}

fn api_error(what: &'static str, error: &kube::Error) -> port::Error {
    port::Error { what, kind: error_kind(error), message: error.to_string() }
}

/// What an API server's failure means for whoever asked; the watch's
/// retries follow the same table.
fn error_kind(error: &kube::Error) -> ErrorKind {
    match error {
        kube::Error::Transport { .. } => ErrorKind::Transient,
        // Only a stream this process closed on purpose: nothing to retry.
        kube::Error::Aborted { .. } => ErrorKind::Refused,
        kube::Error::Api { status, .. } => match status.code {
            401 | 403 => ErrorKind::Denied,
            404 => ErrorKind::NotFound,
            408 | 410 | 429 | 500..=599 => ErrorKind::Transient,
            _ => ErrorKind::Refused,
        },
        kube::Error::Unauthorized { .. } | kube::Error::Config(_) | kube::Error::NoConfiguration { .. } | kube::Error::Credentials(_) => {
            ErrorKind::Denied
        }
        kube::Error::Decode { .. } => ErrorKind::Refused,
    }
}

fn refusal_message(reason: RunReason, api_message: &str) -> String {
    match reason {
        RunReason::QuotaExceeded => format!(
            "the namespace's ResourceQuota has no room for this pod: {api_message}; wait for other runs to finish, lower limits, or ask the operator to raise the quota"
        ),
        _ => format!("the cluster refused the pod: {api_message}"),
    }
}

/// A refused create as the run's reason: quota, admission, or the API.
fn refusal(what: &str, error: &kube::Error) -> Refused {
    let reason = if error.is_quota_exceeded() {
        RunReason::QuotaExceeded
    } else if (error.is_forbidden() && error.permission_denied().is_none()) || error.is_invalid() {
        // An RBAC refusal is the server's own missing permission, not the
        // pod being refused: it stays ApiError, whose message names the
        // verb and resource to grant.
        RunReason::Rejected
    } else {
        RunReason::ApiError
    };
    let message = match reason {
        RunReason::QuotaExceeded | RunReason::Rejected => refusal_message(reason, &error.to_string()),
        _ => format!("could not {what}: {error}; the run did not start"),
    };
    Refused { reason, message }
}

fn time_of(text: Option<&str>) -> Option<SystemTime> {
    crate::time::parse_rfc3339(text?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::port::BackgroundRecord;
    use std::time::UNIX_EPOCH;

    #[test]
    fn the_api_servers_failures_keep_their_kind() {
        let api = |code: u16| kube::Error::Api {
            verb: "GET",
            path: "/x".into(),
            status: Box::new(kube::error::Status { code, ..Default::default() }),
        };
        let cases = [
            (api(403), ErrorKind::Denied),
            (api(401), ErrorKind::Denied),
            (api(404), ErrorKind::NotFound),
            (api(409), ErrorKind::Refused),
            (api(422), ErrorKind::Refused),
            (api(429), ErrorKind::Transient),
            (api(500), ErrorKind::Transient),
            (api(503), ErrorKind::Transient),
            (kube::Error::Transport { verb: "GET", path: "/x".into(), message: "connection refused".into() }, ErrorKind::Transient),
            (kube::Error::Credentials("the exec plugin failed".into()), ErrorKind::Denied),
            (kube::Error::Decode { verb: "GET", path: "/x".into(), message: "not JSON".into() }, ErrorKind::Refused),
            (kube::Error::Aborted { verb: "GET", path: "/x".into() }, ErrorKind::Refused),
        ];
        for (error, kind) in cases {
            assert_eq!(api_error("look", &error).kind, kind, "{error}");
        }
    }

    #[test]
    fn only_a_background_run_waits_for_its_fence_up_to_its_start_deadline() {
        let spec = RunSpec {
            owner: None,
            image: "busybox".into(),
            command: vec!["true".into()],
            files: Vec::new(),
            env: Default::default(),
            cpu_limit: None,
            memory_limit: None,
            timeout: Duration::from_secs(5),
            workdir: crate::sandbox::WORKDIR.into(),
            artifacts: Vec::new(),
            clone: None,
            network: crate::network::NetworkMode::None,
        };
        let start_by = UNIX_EPOCH + Duration::from_secs(1_000);
        let background = Keep::Background {
            record: BackgroundRecord {
                owner: None,
                token: "t".into(),
                timeout_s: 5,
                command: "busybox true".into(),
                fingerprint: None,
                traceparent: None,
            },
            result_ttl: Duration::from_secs(60),
            expires_at: UNIX_EPOCH,
        };
        let sync = Keep::UntilRemoved { expires_at: UNIX_EPOCH };
        for (keep, start_by, expected) in
            [(&background, Some(start_by), Some(start_by - FENCE_VERDICT_MARGIN)), (&background, None, None), (&sync, Some(start_by), None)]
        {
            let run = NewRun { run_id: "r", spec: &spec, keep: keep.clone(), start_by };
            assert_eq!(fence_until(&run), expected, "{keep:?} {start_by:?}");
        }
    }
}
