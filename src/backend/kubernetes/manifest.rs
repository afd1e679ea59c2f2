//! The Job and the inputs Secret for one run, built in code from a checked
//! `RunSpec`, the operator's `Policy` and the cluster's `Settings`. Pure
//! and deterministic (sorted env, fixed names), so tests compare JSON
//! text. Never built from caller YAML.
//!
//! Pod shape: a container `prepare` from the runner image copies this
//! binary into a shared volume and writes the input files; the `main`
//! container runs the caller's image with the runner as its command (no
//! shell or exec needed). `prepare` is listed before `main` with a
//! postStart hook (`runner await-ready`) that returns once the copy is
//! done: the kubelet starts a pod's containers in order and waits for each
//! one's postStart hook, so `main` starts in the same pass (an init
//! container made the kubelet wait for its next status pass, about a
//! second, before starting `main`). With `clone`, `prepare` and
//! a second step `clone` from the operator's git image (which runs the
//! copied runner's `runner clone` and alone mounts the clone Secret) are
//! init containers, as the clone must finish before `main` starts. Every container passes the
//! restricted Pod Security Standard and has resources; the pod gets no ServiceAccount token.
//!
//! Disk: every container's root file system is
//! read-only, so nothing can be written outside the volumes below, and every
//! volume is an `emptyDir` with a size limit. The caller's command writes to
//! the workdir and to `/tmp` (also its `$HOME` unless the caller or the
//! operator sets one). The runner's watcher (`runner::disk`) stops the
//! command within a fraction of a second once both together hold more than
//! `MCP_K8S_WORKDIR_SIZE`; behind it, the kubelet evicts the pod (about a
//! minute late) past each volume's size limit or the main container's
//! ephemeral-storage limit.

use std::time::Duration;

use serde_json::{Value, json};

use crate::backend::kubernetes::settings::Settings;
use crate::backend::kubernetes::template::PodTemplate;
use crate::engine::port::spec::{CloneSpec, CloneStep, Policy, RunSpec, command_env, exec_options, run_deadline, separate_tmp, shm_bytes};
use crate::sandbox::args::{self, AssignOptions, AwaitOptions, CloneOptions, Endpoint, InitOptions, Preload};
use crate::sandbox::assignment::{Assignment, KEY_DIR, KEY_FILE, KEY_SECRET_DIR, KEY_SECRET_FILE, PORT};
use crate::sandbox::frame::to_base64;
use crate::sandbox::held::{self, HoldOptions};
use crate::sandbox::inputs::{self, InputFile as ManifestEntry, MANIFEST_KEY};
use crate::sandbox::{BIN_DIR, CREDS_DIR, INPUTS_DIR, TMP_DIR};

/// Label on every object we create, so the reaper and `list_jobs` find them.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "mcp-k8s-ephemeral-job";
/// Label carrying the run id, on the Job, its pod and its Secret.
pub const LABEL_RUN_ID: &str = "mcp-k8s-ephemeral-job/run-id";
/// Label on the pod only: its network mode (`none`, `restricted`, `open`),
/// which the NetworkPolicies of `deploy/networkpolicy-jobs.yaml` select
/// (the contract with them is this key and these three values).
pub const LABEL_NETWORK: &str = "mcp-k8s-ephemeral-job/network";
/// Label on background Jobs only, so `list_jobs` selects them in one call.
pub const LABEL_MODE: &str = "mcp-k8s-ephemeral-job/mode";
pub const MODE_BACKGROUND: &str = "background";
/// Label on the pod when its runner holds output for the server to fetch
/// on its port (`sandbox::held`): what deploy/outputs.optional.yaml's
/// NetworkPolicy selects to let the API server in.
pub const LABEL_OUTPUTS: &str = "mcp-k8s-ephemeral-job/outputs";
const OUTPUTS_HELD: &str = "held";
/// Annotation (RFC 3339, UTC) after which the reaper deletes the object,
/// whoever created it: see `backend::kubernetes::reaper`.
pub const ANNOTATION_EXPIRES_AT: &str = "mcp-k8s-ephemeral-job/expires-at";
/// A warm pool's sandboxes: the pool's name, and the server process that
/// keeps them (each process keeps its own pools, so two replicas never
/// count or delete each other's).
pub const LABEL_POOL: &str = "mcp-k8s-ephemeral-job/pool";
pub const LABEL_POOL_OWNER: &str = "mcp-k8s-ephemeral-job/pool-owner";
/// When a warm sandbox was handed its run: the run's start, for a process
/// that re-attaches (the Job itself is older).
pub const ANNOTATION_ASSIGNED_AT: &str = "mcp-k8s-ephemeral-job/assigned-at";
/// The key Secret's one entry.
pub const KEY_ENTRY: &str = "key";
/// Names of the containers, used when reading statuses and logs.
pub const MAIN_CONTAINER: &str = "main";
pub const PREPARE_CONTAINER: &str = "prepare";
pub const CLONE_CONTAINER: &str = "clone";
/// Ephemeral storage the main container may use on top of the workdir
/// size: its container log (the runner's frames: capped output and
/// artifacts, about 25 MiB at the default caps), the runner copy (`bin`,
/// about 4 MiB) and what the runtime writes itself.
const STORAGE_SLACK_BYTES: i128 = 256 << 20;
/// What the main container asks the scheduler for: small, so that the
/// workdir bound does not reserve a node's disk for runs that write little.
const MAIN_STORAGE_REQUEST: &str = "64Mi";

/// Name of the Job (and of its Secret) for a run id.
pub fn job_name(run_id: &str) -> String {
    format!("mcpk8s-{run_id}")
}

/// The Job for one run.
pub fn job(spec: &RunSpec, policy: &Policy, cluster: &Settings, run_id: &str) -> Value {
    job_with(spec, policy, cluster, run_id, Keyed::No)
}

/// Whether `prepare` hands the main container's runner a key
/// (`runner::key`): a warm or open sandbox's Job.
#[derive(Clone, Copy, PartialEq)]
enum Keyed {
    No,
    Yes,
}

fn job_with(spec: &RunSpec, policy: &Policy, cluster: &Settings, run_id: &str, keyed: Keyed) -> Value {
    let name = job_name(run_id);
    let pod_deadline = run_deadline(spec, policy);
    let mut volumes = vec![
        json!({"name": "work", "emptyDir": {"sizeLimit": policy.workdir_size_limit.as_str()}}),
        json!({"name": "bin", "emptyDir": {"sizeLimit": "64Mi"}}),
        // Over the runtime's own /dev/shm: sized (a memory emptyDir's tmpfs
        // is its sizeLimit), so filling it cannot take all the pod's memory.
        json!({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_bytes(spec, policy).to_string()}}),
    ];
    if separate_tmp(spec) {
        volumes.push(json!({"name": "tmp", "emptyDir": {"sizeLimit": policy.workdir_size_limit.as_str()}}));
    }
    if !spec.files.is_empty() {
        volumes.push(json!({
            "name": "inputs",
            "secret": {"secretName": name, "defaultMode": 0o444},
        }));
    }
    if let Some(cache) = &policy.cache {
        volumes.push(json!({"name": "cache", "persistentVolumeClaim": {"claimName": cache.claim_name}}));
    }
    if let Some(bytes) = held_volume_bytes(policy) {
        volumes.push(json!({"name": "held", "emptyDir": {"sizeLimit": bytes.to_string()}}));
    }
    let mut init_containers = Vec::new();
    let mut containers = Vec::new();
    if let (Some(clone_spec), Some(clone_step)) = (&spec.clone, &policy.clone) {
        volumes.push(json!({"name": "git-creds", "secret": {"secretName": clone_step.secret_name, "defaultMode": 0o440}}));
        volumes.push(json!({"name": "clone-tmp", "emptyDir": {"sizeLimit": "64Mi"}}));
        init_containers.push(prepare_container(spec, policy, cluster, Prepare::Before, keyed));
        init_containers.push(clone_container(spec, clone_spec, clone_step, policy));
    } else if cluster.await_network_policy.bound_for(spec.network).is_some() {
        // Waiting for the fence beside `main` would never end: its hook
        // holds the kubelet's first pass, so the pod's IP is not reported,
        // and a plugin that fences by the reported IP (kube-router) never
        // fences it. As an init container, one pass later, it is.
        init_containers.push(prepare_container(spec, policy, cluster, Prepare::Before, keyed));
    } else {
        containers.push(prepare_container(spec, policy, cluster, Prepare::Beside, keyed));
    }
    containers.push(main_container(spec, policy, run_id));
    let mut pod_spec = json!({
        "restartPolicy": "Never",
        "activeDeadlineSeconds": pod_deadline.as_secs(),
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": policy.run_as_user,
            "runAsGroup": policy.run_as_user,
            "fsGroup": policy.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": containers,
        "volumes": volumes,
    });
    if !init_containers.is_empty() {
        pod_spec["initContainers"] = json!(init_containers);
    }
    if let Some(runtime_class) = &cluster.runtime_class {
        pod_spec["runtimeClassName"] = json!(runtime_class);
    }
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": cluster.namespace, "labels": labels(run_id)},
        "spec": {
            "backoffLimit": 0,
            "completions": 1,
            "parallelism": 1,
            // A backstop only: the pod's own deadline ends the run with its
            // logs intact, while a Job-level deadline deletes the pod.
            "activeDeadlineSeconds": (pod_deadline + JOB_DEADLINE_SLACK).as_secs(),
            "ttlSecondsAfterFinished": cluster.finished_ttl.as_secs(),
            "template": {
                "metadata": {"labels": pod_labels(spec, policy, run_id)},
                "spec": pod_spec,
            },
        },
    })
}

/// Which warm pool a sandbox belongs to, and how long its runner waits.
pub struct PoolSandbox<'a> {
    pub pool: &'a str,
    pub owner: &'a str,
    /// `runner await-assignment --max-wait-ms`.
    pub max_wait: Duration,
    /// `runner await-assignment --preload`.
    pub preload: Option<&'a Preload>,
}

/// A warm pool's Job: the cold Job for `spec` (the pool's shape, with no
/// files and the longest timeout a run may give), whose main container
/// waits for its one assignment instead of running a command, with the
/// key handed to its runner alone (`waiting_job`).
pub fn pool_job(spec: &RunSpec, policy: &Policy, cluster: &Settings, run_id: &str, sandbox: &PoolSandbox) -> Value {
    let mut job = waiting_job(spec, policy, cluster, run_id, (sandbox.max_wait, sandbox.preload), None);
    for labels in ["/metadata/labels", "/spec/template/metadata/labels"] {
        if let Some(labels) = job.pointer_mut(labels) {
            labels[LABEL_POOL] = json!(sandbox.pool);
            labels[LABEL_POOL_OWNER] = json!(sandbox.owner);
        }
    }
    job
}

/// Every object of an open sandbox carries its public name.
pub const LABEL_SANDBOX: &str = "mcp-k8s-ephemeral-job/sandbox";
/// On an open sandbox's Job: its record (`engine::sandboxes::rules::Record`).
pub const ANNOTATION_SANDBOX_RECORD: &str = "mcp-k8s-ephemeral-job/sandbox-record";
/// On an open sandbox's Job: the call that runs (`CallMark`), if any.
pub const ANNOTATION_SANDBOX_CALL: &str = "mcp-k8s-ephemeral-job/sandbox-call";
/// On an open sandbox's Job: when its last call ended, Unix milliseconds.
pub const ANNOTATION_SANDBOX_USED_MS: &str = "mcp-k8s-ephemeral-job/sandbox-used-ms";

/// An open sandbox's Job: a warm pool's Job for the sandbox's shape whose
/// runner takes call after call (`runner await-assignment
/// --session-until-ms`) until it has been idle `idle` or `until_ms`
/// passes; the Job's and the pod's deadlines are its lifetime's. `name` is
/// the sandbox's public name, its run id here. Its record is an annotation
/// the caller writes after the retention's (`apply_retention` sets them all).
pub fn session_job(spec: &RunSpec, policy: &Policy, cluster: &Settings, name: &str, idle: Duration, lifetime: Duration) -> Value {
    let until_ms = crate::time::unix_ms(std::time::SystemTime::now() + lifetime);
    let mut job = waiting_job(spec, policy, cluster, name, (idle, None), Some(until_ms));
    for labels in ["/metadata/labels", "/spec/template/metadata/labels"] {
        if let Some(labels) = job.pointer_mut(labels) {
            labels[LABEL_SANDBOX] = json!(name);
        }
    }
    job["spec"]["template"]["spec"]["activeDeadlineSeconds"] = json!(lifetime.as_secs());
    job["spec"]["activeDeadlineSeconds"] = json!((lifetime + JOB_DEADLINE_SLACK).as_secs());
    job
}

/// The volume of the key Secret, mounted into `prepare` alone, and the
/// memory-backed one `prepare` copies the key into for the main
/// container's runner, which removes it before any command runs
/// (`runner::key`).
const KEY_SECRET_VOLUME: &str = "mcp-key-secret";
const KEY_VOLUME: &str = "mcp-key";

/// The cold Job for `spec` whose main container waits for its assignment
/// (or, with `session_until_ms`, assignment after assignment) on `PORT`
/// instead of running a command. Its key Secret (named like the Job, see
/// `key_secret`) is mounted into `prepare` alone, which hands the key to
/// the runner through a folder of their own (`runner::key`): mounted into
/// the main container, it would be readable by every command there.
fn waiting_job(
    spec: &RunSpec,
    policy: &Policy,
    cluster: &Settings,
    run_id: &str,
    (max_wait, preload): (Duration, Option<&Preload>),
    session_until_ms: Option<u64>,
) -> Value {
    let name = job_name(run_id);
    let mut job = job_with(spec, policy, cluster, run_id, Keyed::Yes);
    let pod_spec = &mut job["spec"]["template"]["spec"];
    if let Some(volumes) = pod_spec["volumes"].as_array_mut() {
        volumes.push(json!({"name": KEY_SECRET_VOLUME, "secret": {"secretName": name, "defaultMode": 0o440}}));
        // In memory, so the key is never written to the node's disk.
        volumes.push(json!({"name": KEY_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}));
    }
    let assign = AssignOptions {
        listen: Endpoint::Port(PORT),
        key_file: Some(KEY_FILE.into()),
        workdir: spec.workdir.clone().into(),
        max_wait,
        session_until_ms,
        preload: preload.cloned(),
    };
    let mut command = vec![runner_path()];
    command.extend(args::assign_args(&assign));
    let main = pod_spec["containers"].as_array_mut().and_then(|containers| containers.iter_mut().find(|c| c["name"] == MAIN_CONTAINER));
    if let Some(main) = main {
        main["command"] = json!(command.iter().map(|arg| escape_dollars(arg)).collect::<Vec<_>>());
        main["ports"] = json!([{"name": "assign", "containerPort": PORT, "protocol": "TCP"}]);
        if let Some(mounts) = main["volumeMounts"].as_array_mut() {
            // Writable: the runner removes the key once read.
            mounts.push(json!({"name": KEY_VOLUME, "mountPath": KEY_DIR}));
        }
    }
    job
}

/// A warm sandbox's key (hex), in a Secret named like its Job and owned by
/// it, so that it goes with the Job.
pub fn key_secret(cluster: &Settings, run_id: &str, job_uid: &str, key_hex: &str) -> Value {
    job_secret(cluster, run_id, job_uid, json!({KEY_ENTRY: to_base64(key_hex.as_bytes())}))
}

/// A Secret named like the run's Job and owned by it (the inputs, a warm
/// sandbox's key): the garbage collector removes it with the Job.
fn job_secret(cluster: &Settings, run_id: &str, job_uid: &str, data: Value) -> Value {
    let name = job_name(run_id);
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": cluster.namespace,
            "labels": labels(run_id),
            "ownerReferences": [{
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name,
                "uid": job_uid,
                "controller": false,
                "blockOwnerDeletion": false,
            }],
        },
        "data": data,
    })
}

/// The Secret holding the input files, owned by the Job so that deleting
/// the Job (or the garbage collector) removes it. `None` without files.
pub fn inputs_secret(spec: &RunSpec, cluster: &Settings, run_id: &str, job_uid: &str) -> Option<Value> {
    if spec.files.is_empty() {
        return None;
    }
    let mut data = serde_json::Map::new();
    let mut entries = Vec::new();
    for (index, file) in spec.files.iter().enumerate() {
        let key = inputs::content_key(index);
        data.insert(key.clone(), json!(to_base64(&file.content)));
        entries.push(ManifestEntry { key, path: file.path.clone(), mode: file.mode });
    }
    let manifest = inputs::encode_manifest(&entries);
    data.insert(MANIFEST_KEY.to_string(), json!(to_base64(&manifest)));
    Some(job_secret(cluster, run_id, job_uid, Value::Object(data)))
}

/// Merges the operator's pod template into a Job built by `job`: its pod
/// spec fields, labels and annotations go onto the pod, never over a field
/// or key the server set (the template's checks refuse those anyway;
/// `runtimeClassName` can only agree with `MCP_K8S_RUNTIME_CLASS`). Pure,
/// like `job`, and never given anything from a caller.
pub fn apply_pod_template(job: &mut Value, template: &PodTemplate) {
    let pod = &mut job["spec"]["template"];
    if let Value::Object(pod_spec) = &mut pod["spec"] {
        for (field, value) in &template.pod_spec {
            pod_spec.entry(field.clone()).or_insert_with(|| value.clone());
        }
    }
    merge_strings(&mut pod["metadata"]["labels"], &template.labels);
    if !template.annotations.is_empty() {
        merge_strings(&mut pod["metadata"]["annotations"], &template.annotations);
    }
}

/// How long an object of this run may outlive its creation before the
/// reaper deletes it, and how long the TTL controller keeps its finished
/// Job. Sync runs keep theirs briefly (the server deletes them itself);
/// background runs keep theirs for the result retention.
pub struct Retention {
    /// RFC 3339 UTC, written to `ANNOTATION_EXPIRES_AT`.
    pub expires_at: String,
    pub finished_ttl: Duration,
    /// Background runs: extra annotations (`engine::background` owns
    /// their names) and the mode label.
    pub background: Option<serde_json::Map<String, Value>>,
}

/// Applies `retention` to a Job (or Secret) built above: pure, so the
/// manifest stays deterministic for a given `Retention`.
pub fn apply_retention(object: &mut Value, retention: &Retention) {
    let mut annotations = serde_json::Map::new();
    annotations.insert(ANNOTATION_EXPIRES_AT.to_string(), json!(retention.expires_at));
    if let Some(extra) = &retention.background {
        annotations.extend(extra.clone());
        object["metadata"]["labels"][LABEL_MODE] = json!(MODE_BACKGROUND);
    }
    object["metadata"]["annotations"] = Value::Object(annotations);
    if object["kind"] == "Job" {
        object["spec"]["ttlSecondsAfterFinished"] = json!(retention.finished_ttl.as_secs());
    }
}

/// Tells the main container's runner not to start the command after
/// `deadline_ms` (ms since the Unix epoch; `sandbox::args::with_start_deadline`).
/// Applied after `job`, which stays a pure function of the run.
pub fn apply_start_deadline(job: &mut Value, deadline_ms: u64) {
    let Some(containers) = job["spec"]["template"]["spec"]["containers"].as_array_mut() else { return };
    for container in containers.iter_mut().filter(|container| container["name"] == "main") {
        let Some(command) = container["command"].as_array() else { continue };
        let mut command: Vec<String> = command.iter().filter_map(|arg| arg.as_str().map(str::to_string)).collect();
        args::with_start_deadline(&mut command, deadline_ms);
        container["command"] = json!(command);
    }
}

/// Makes the `prepare` step's fence wait, where there is one, last until
/// `until_ms` (ms since the Unix epoch; `sandbox::args::with_fence_until`):
/// a background run waits out a late fence up to its start deadline
/// instead of the fence setting. Applied after `job`, like the start
/// deadline.
pub fn apply_fence_deadline(job: &mut Value, until_ms: u64) {
    // `get_mut`, not indexing: a job without init containers stays without.
    let Some(init_containers) = job["spec"]["template"]["spec"].get_mut("initContainers").and_then(Value::as_array_mut) else { return };
    for container in init_containers.iter_mut().filter(|container| container["name"] == PREPARE_CONTAINER) {
        let Some(command) = container["command"].as_array() else { continue };
        let mut command: Vec<String> = command.iter().filter_map(|arg| arg.as_str().map(str::to_string)).collect();
        args::with_fence_until(&mut command, until_ms);
        container["command"] = json!(command);
    }
}

/// The Job-level deadline's margin over the pod's (see `job`).
pub const JOB_DEADLINE_SLACK: Duration = Duration::from_secs(60);

/// Kubernetes expands `$(VAR)` in `command`, `args` and env values; `$$`
/// is its escape for a literal `$`. Doubling every `$` therefore reaches
/// the process exactly as the caller wrote it.
pub fn escape_dollars(text: &str) -> String {
    text.replace('$', "$$")
}

/// Adds `extra` to the string map at `into` (made one if it is null),
/// keeping every key already there.
fn merge_strings(into: &mut Value, extra: &std::collections::BTreeMap<String, String>) {
    if into.is_null() {
        *into = json!({});
    }
    if let Value::Object(map) = into {
        for (key, value) in extra {
            map.entry(key.clone()).or_insert_with(|| json!(value));
        }
    }
}

fn labels(run_id: &str) -> Value {
    json!({LABEL_MANAGED_BY: MANAGED_BY, LABEL_RUN_ID: run_id})
}

/// The pod's labels: the Job's, and the network mode its policies select.
fn pod_labels(spec: &RunSpec, policy: &Policy, run_id: &str) -> Value {
    let mut labels = labels(run_id);
    labels[LABEL_NETWORK] = json!(spec.network.name());
    if holds_output(policy) {
        labels[LABEL_OUTPUTS] = json!(OUTPUTS_HELD);
    }
    labels
}

/// With an output store, what the runner sends whole is held in the pod
/// and fetched through `pods/proxy` (`sandbox::held`), not written to the
/// container log, which the kubelet rotates at 10 MiB by default.
fn holds_output(policy: &Policy) -> bool {
    policy.outputs.is_some()
}

/// How the runner holds output for `run_id`, with an output store.
fn hold(policy: &Policy, run_id: &str) -> Option<HoldOptions> {
    holds_output(policy).then(|| HoldOptions { port: held::PORT, key_sha256: held::digest(&held::key(run_id)) })
}

/// A warm pool's assignment with the hold of its run: the pool's pod has
/// the held volume and label already (`pool_job` is the cold Job's shape).
pub fn with_hold(mut assignment: Assignment, policy: &Policy) -> Assignment {
    assignment.exec.hold = hold(policy, &assignment.run_id);
    assignment
}

/// The held volume's size limit, with an output store.
fn held_volume_bytes(policy: &Policy) -> Option<u64> {
    policy.outputs.as_ref().map(|store| held::volume_bytes(store.max_run_bytes()))
}

/// Where the runner is in every job pod's `main` container.
pub(crate) fn runner_path() -> String {
    format!("{BIN_DIR}/mcp-k8s-ephemeral-job")
}

/// The same for every container. The root is read-only everywhere: an
/// earlier version left the main container's writable, and a job wrote
/// 1.5 GB to /tmp past every bound.
fn container_security(policy: &Policy) -> Value {
    json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "privileged": false,
        "readOnlyRootFilesystem": true,
        "runAsNonRoot": true,
        "runAsUser": policy.run_as_user,
        "runAsGroup": policy.run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

/// Where `prepare` runs: before the other steps as an init container (a
/// clone needs the runner first), or beside `main`, holding it back with
/// its postStart hook.
#[derive(Clone, Copy, PartialEq)]
enum Prepare {
    Before,
    Beside,
}

fn ready_file() -> String {
    format!("{BIN_DIR}/.ready")
}

fn prepare_container(spec: &RunSpec, policy: &Policy, cluster: &Settings, place: Prepare, keyed: Keyed) -> Value {
    let mut mounts = vec![json!({"name": "bin", "mountPath": BIN_DIR}), json!({"name": "work", "mountPath": spec.workdir})];
    let mut init = InitOptions {
        copy_to: runner_path().into(),
        inputs: None,
        ready_file: None,
        await_fence: cluster.await_network_policy.bound_for(spec.network),
        await_fence_until_ms: None,
        key: None,
    };
    if keyed == Keyed::Yes {
        init.key = Some((KEY_SECRET_FILE.into(), KEY_FILE.into()));
        mounts.push(json!({"name": KEY_SECRET_VOLUME, "mountPath": KEY_SECRET_DIR, "readOnly": true}));
        mounts.push(json!({"name": KEY_VOLUME, "mountPath": KEY_DIR}));
    }
    if !spec.files.is_empty() {
        init.inputs = Some((INPUTS_DIR.into(), spec.workdir.clone().into()));
        mounts.push(json!({"name": "inputs", "mountPath": INPUTS_DIR, "readOnly": true}));
    }
    if place == Prepare::Beside {
        init.ready_file = Some(ready_file().into());
    }
    let mut command = vec![cluster.runner_binary_path.clone()];
    command.extend(args::init_args(&init));
    let mut container = json!({
        "name": PREPARE_CONTAINER,
        "image": cluster.runner_image,
        "imagePullPolicy": "IfNotPresent",
        "command": command.iter().map(|arg| escape_dollars(arg)).collect::<Vec<_>>(),
        // Its root is read-only and it writes only to volumes, so its own
        // ephemeral storage is its log: a few lines.
        "resources": {
            "requests": {"cpu": "50m", "memory": "32Mi", "ephemeral-storage": "1Mi"},
            "limits": {"cpu": "500m", "memory": "128Mi", "ephemeral-storage": "64Mi"},
        },
        "securityContext": container_security(policy),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    });
    if place == Prepare::Beside {
        // Bounded by the start timeout: past it the server gives up anyway.
        let wait = AwaitOptions { ready_file: ready_file().into(), timeout: policy.start_timeout };
        // Hook commands get no `$(VAR)` expansion, so no escaping either.
        let mut hook = vec![cluster.runner_binary_path.clone()];
        hook.extend(args::await_args(&wait));
        container["lifecycle"] = json!({"postStart": {"exec": {"command": hook}}});
    }
    container
}

/// Checks the repository out into the workdir. Runs the runner copied by
/// `prepare` in the operator's git image, so the image needs only git (and
/// the `sh` git uses to start its credential helper). The operator's extra
/// env reaches it too, for proxy settings.
fn clone_container(spec: &RunSpec, clone_spec: &CloneSpec, clone_step: &CloneStep, policy: &Policy) -> Value {
    let dest = if clone_spec.subdir.is_empty() { spec.workdir.clone() } else { format!("{}/{}", spec.workdir, clone_spec.subdir) };
    let options = CloneOptions {
        repo_url: clone_spec.repo_url.clone(),
        git_ref: clone_spec.git_ref.clone(),
        dest: dest.into(),
        creds_dir: CREDS_DIR.into(),
    };
    let mut command = vec![runner_path()];
    command.extend(args::clone_args(&options));
    let mut env = policy.extra_env.clone();
    env.insert("HOME".to_string(), "/tmp".to_string());
    let env: Vec<Value> = env.iter().map(|(name, value)| json!({"name": name, "value": escape_dollars(value)})).collect();
    json!({
        "name": CLONE_CONTAINER,
        "image": clone_step.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command.iter().map(|arg| escape_dollars(arg)).collect::<Vec<_>>(),
        "env": env,
        "resources": {
            "requests": {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "1Mi"},
            "limits": {"cpu": "1", "memory": "512Mi", "ephemeral-storage": "64Mi"},
        },
        "securityContext": container_security(policy),
        // The runner writes git's masked output tail to the termination
        // log; the classifier turns it into the CloneFailed message.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "bin", "mountPath": BIN_DIR, "readOnly": true},
            {"name": "work", "mountPath": spec.workdir},
            {"name": "git-creds", "mountPath": CREDS_DIR, "readOnly": true},
            {"name": "clone-tmp", "mountPath": "/tmp"},
        ],
    })
}

fn main_container(spec: &RunSpec, policy: &Policy, run_id: &str) -> Value {
    let mut exec_options = exec_options(spec, policy);
    exec_options.hold = hold(policy, run_id);
    let mut command = vec![runner_path()];
    command.extend(args::exec_args(&exec_options));
    let env = command_env(spec, policy);
    let env: Vec<Value> = env.iter().map(|(name, value)| json!({"name": name, "value": escape_dollars(value)})).collect();
    // /tmp comes before the workdir, which may lie under it: mounts are
    // made in order, and a later one over an earlier one stays visible.
    let mut mounts = vec![json!({"name": "bin", "mountPath": BIN_DIR, "readOnly": true}), json!({"name": "dshm", "mountPath": "/dev/shm"})];
    if separate_tmp(spec) {
        mounts.push(json!({"name": "tmp", "mountPath": TMP_DIR}));
    }
    mounts.push(json!({"name": "work", "mountPath": spec.workdir}));
    if let Some(cache) = &policy.cache {
        mounts.push(json!({"name": "cache", "mountPath": cache.mount_path}));
    }
    if holds_output(policy) {
        mounts.push(json!({"name": "held", "mountPath": held::DIR}));
    }
    json!({
        "name": MAIN_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command.iter().map(|arg| escape_dollars(arg)).collect::<Vec<_>>(),
        "workingDir": spec.workdir,
        "env": env,
        "resources": main_resources(spec, policy),
        "securityContext": container_security(policy),
        "volumeMounts": mounts,
    })
}

/// The original's rules: the defaults are requests; CPU and memory limits
/// only when the caller asks; a memory limit raises the memory request to
/// match, and a CPU limit below the default request lowers the request (a
/// request above its limit is invalid). Ephemeral storage always has a
/// limit: disk is the one bound the caller cannot choose.
fn main_resources(spec: &RunSpec, policy: &Policy) -> Value {
    let mut cpu_request = policy.default_cpu.clone();
    let mut memory_request = policy.default_memory.clone();
    let mut limits = serde_json::Map::new();
    if let Some(cpu) = &spec.cpu_limit {
        if *cpu < cpu_request {
            cpu_request = cpu.clone();
        }
        limits.insert("cpu".into(), json!(cpu.as_str()));
    }
    if let Some(memory) = &spec.memory_limit {
        memory_request = memory.clone();
        limits.insert("memory".into(), json!(memory.as_str()));
    }
    limits.insert("ephemeral-storage".into(), json!(main_storage_limit(policy)));
    json!({
        "requests": {"cpu": cpu_request.as_str(), "memory": memory_request.as_str(), "ephemeral-storage": MAIN_STORAGE_REQUEST},
        "limits": Value::Object(limits),
    })
}

/// The main container's ephemeral-storage limit, in bytes: the workdir size
/// plus `STORAGE_SLACK_BYTES`. The kubelet counts the pod's emptyDir
/// volumes, logs and writable layers against the sum of its containers'
/// limits, so this bounds the workdir and /tmp together.
fn main_storage_limit(policy: &Policy) -> String {
    let workdir_bytes = policy.workdir_size_limit.nanos() / 1_000_000_000;
    let held_bytes = i128::from(held_volume_bytes(policy).unwrap_or(0));
    (workdir_bytes + STORAGE_SLACK_BYTES + held_bytes).to_string()
}
