//! Checks of the cluster set-up against the configuration: `doctor` (every
//! check, one line each, for an operator) and `check_at_start` (the ones
//! `serve` stops on: a cache PVC or clone Secret that does not exist would
//! otherwise fail every run, or hang it until the start timeout).
//!
//! The last checks run tiny jobs: the runner (and clone) image starts, the
//! pod's real process limit, which only a job can measure, and whether the
//! cluster enforces the jobs' NetworkPolicy (a job tries a connection every
//! network mode refuses; when it opens, doctor warns, without failing).
//!
//! The pod template's references (RuntimeClass, PriorityClass, image pull
//! Secrets) are checked for existence only; the Secrets' content is never
//! read.
//!
//! Knows `Config`, the engine (to run a tiny job), the runner's probe line
//! and `kube`; nothing of MCP.

use std::sync::Arc;

use crate::backend::kubernetes::Kubernetes;
use crate::backend::kubernetes::manifest;
use crate::backend::kubernetes::open_reach;
use crate::backend::kubernetes::permissions::{self, Permission};
use crate::backend::kubernetes::settings::{AwaitFence, Settings};
use crate::backend::kubernetes::template::PodTemplate;
use crate::backend::{self, Check};
use crate::config::Config;
use crate::engine;
use crate::engine::port::spec::{RunOutcome, RunStatus};
use crate::kube;
use crate::kube::objects;
use crate::network::{FenceModes, NetworkMode};
use crate::sandbox;

/// Runs every check, handing each to `report` as soon as it is done (the
/// last one starts a pod and takes a few seconds). Returns true when all
/// passed.
pub fn run(config: &Config, kubernetes: &Kubernetes, ctx: &engine::run::Ctx, report: &mut dyn FnMut(&Check)) -> bool {
    let client = &kubernetes.client;
    let pod_template = kubernetes.pod_template.as_deref();
    let ctx = &unfenced(kubernetes, ctx);
    let mut all_passed = true;
    let mut emit = |check: Check| {
        all_passed &= check.passed;
        report(&check);
    };
    let api = check_api(client);
    let api_down = api.cause.is_some();
    emit(api);
    if api_down {
        // Every other check asks the API and would fail the same way, each
        // after its own connect timeout and retries: said once, not run.
        emit(check_allowlist(config));
        if let Some(left_out) = backend::languages_left_out(config) {
            emit(left_out);
        }
        return false;
    }
    emit(check_namespace(client, &config.namespace));
    for permission in permissions::REQUIRED {
        emit(check_permission(client, &config.namespace, permission));
    }
    if !config.warm_pools.is_empty() {
        for permission in permissions::WARM_POOLS {
            emit(check_permission(client, &config.namespace, permission));
        }
    }
    if config.max_sandboxes > 0 {
        for permission in permissions::SANDBOXES {
            emit(check_permission(client, &config.namespace, permission));
        }
    }
    if config.outputs.is_some() {
        for permission in permissions::OUTPUTS {
            emit(check_permission(client, &config.namespace, permission));
        }
    }
    if let Some(cache) = &config.cache {
        emit(check_cache_pvc(client, &config.namespace, &cache.pvc));
    }
    if let Some(clone) = &config.clone {
        emit(check_clone_secret(client, &config.namespace, &clone.secret));
    }
    let runtime_class = pod_template.and_then(PodTemplate::runtime_class_name).or(config.runtime_class.as_deref());
    if let Some(runtime_class) = runtime_class {
        emit(check_cluster_object(client, &RUNTIME_CLASSES, runtime_class));
    }
    if let Some(pod_template) = pod_template {
        if let Some(priority_class) = pod_template.priority_class_name() {
            emit(check_cluster_object(client, &PRIORITY_CLASSES, priority_class));
        }
        for secret in pod_template.image_pull_secrets() {
            emit(check_pull_secret(client, &config.namespace, secret));
        }
    }
    emit(check_allowlist(config));
    emit(check_image_runs(ctx, "runner image (MCP_K8S_RUNNER_IMAGE)", &config.runner_image, &[&config.runner_binary_path, "--version"]));
    emit(check_pids_limit(ctx, config));
    emit(check_network_policy(ctx, config));
    emit(check_open_reach(ctx, config, client));
    if let Some(clone) = &config.clone {
        emit(check_image_runs(ctx, "clone image (MCP_K8S_CLONE_IMAGE)", &clone.image, &["git", "--version"]));
    }
    // The runner itself is the command: it is in every pod, whatever the
    // image has (a distroless image has no `true`).
    let runner = manifest::runner_path();
    for (image, names) in backend::language_images(config) {
        let what = format!("execute_code image of {}", names.join(", "));
        emit(check_image_runs(ctx, &what, &image, &[&runner, "--version"]));
    }
    if let Some(left_out) = backend::languages_left_out(config) {
        emit(left_out);
    }
    all_passed
}

/// What `serve` refuses to start without: the cache PVC and the clone
/// Secret, when configured. The message names the variable.
pub fn check_at_start(config: &Config, client: &kube::Client) -> Result<(), String> {
    let mut checks = Vec::new();
    if let Some(cache) = &config.cache {
        checks.push(check_cache_pvc(client, &config.namespace, &cache.pvc));
    }
    if let Some(clone) = &config.clone {
        checks.push(check_clone_secret(client, &config.namespace, &clone.secret));
    }
    match checks.into_iter().find(|check| !check.passed) {
        Some(failed) => Err(failed.text),
        None => Ok(()),
    }
}

/// The API check's subject when no call can succeed: the others are not run.
const API_DOWN: &str = "Kubernetes API (the namespace, permission, pod template and check job checks need it and were not run)";

fn check_api(client: &kube::Client) -> Check {
    match client.version() {
        Ok(version) => Check::pass(format!(
            "Kubernetes API answers: {} ({})",
            objects::Version::from_value(&version).git_version.as_deref().unwrap_or("unknown version"),
            client.description()
        )),
        Err(error) => match api_down_cause(&error) {
            Some(cause) => Check::fail_because(API_DOWN, cause),
            None => Check::fail(format!("Kubernetes API: {error} ({})", client.description())),
        },
    }
}

/// The cause when `error` means no call to the API can succeed: it cannot
/// be reached, or it refuses the credentials. `None` for an error of one
/// call. The client's words already say what to check (the server URL and
/// the kubeconfig's context; which credentials and how to renew them).
fn api_down_cause(error: &kube::Error) -> Option<String> {
    match error {
        kube::Error::Transport { message, .. } => Some(format!("the Kubernetes API cannot be reached: {message}")),
        kube::Error::Unauthorized { .. } | kube::Error::Credentials(_) => {
            Some(format!("the Kubernetes API refused the server's credentials: {error}"))
        }
        _ => None,
    }
}

/// The server's Role is namespaced, so reading the Namespace object itself
/// is usually forbidden; then listing Jobs in it stands in, since a Role
/// (and so that permission) cannot exist in a namespace that does not.
fn check_namespace(client: &kube::Client, namespace: &str) -> Check {
    match client.get(kube::Resource::NAMESPACES, "", namespace) {
        Ok(_) => Check::pass(format!("namespace `{namespace}` exists")),
        Err(error) if error.is_not_found() => {
            Check::fail(format!("namespace `{namespace}` does not exist; create it (deploy/namespace.yaml) or set MCP_K8S_NAMESPACE"))
        }
        Err(error) if error.is_forbidden() => match client.list(kube::Resource::JOBS, namespace, &kube::ListParams::default()) {
            Ok(_) => Check::pass(format!("namespace `{namespace}` is usable (Jobs can be listed in it)")),
            Err(error) => Check::fail(format!(
                "namespace `{namespace}`: cannot list Jobs in it: {error}; check MCP_K8S_NAMESPACE and the RoleBinding"
            )),
        },
        Err(error) => Check::fail(format!("namespace `{namespace}`: {error}")),
    }
}

fn check_permission(client: &kube::Client, namespace: &str, permission: &Permission) -> Check {
    let resource = permission.resource_name();
    let mut missing = Vec::new();
    for verb in permission.verbs {
        let access_check = kube::AccessCheck {
            namespace: namespace.to_string(),
            verb: verb.to_string(),
            group: permission.group.to_string(),
            resource: permission.resource.to_string(),
            subresource: permission.subresource.to_string(),
            name: String::new(),
        };
        match client.access_review(&access_check) {
            Ok(decision) if decision.allowed => {}
            Ok(_) => missing.push(format!("`{verb}`")),
            // The same for every permission: said once (`backend::group`).
            Err(error) => {
                return Check::fail_because(format!("permission on `{resource}`"), format!("the access review failed: {error}"));
            }
        }
    }
    let verbs = permission.verbs.join(", ");
    if missing.is_empty() {
        Check::pass(format!("permission: {verbs} on `{resource}` in `{namespace}` ({})", permission.used_for))
    } else {
        Check::fail(format!(
            "permission: {} on `{resource}` in `{namespace}` not granted (needed for {}); add it to the Role, as in deploy/role.yaml",
            missing.join(", "),
            permission.used_for
        ))
    }
}

fn check_cache_pvc(client: &kube::Client, namespace: &str, pvc: &str) -> Check {
    match client.get_if_exists(kube::Resource::PERSISTENT_VOLUME_CLAIMS, namespace, pvc) {
        Ok(Some(claim)) => {
            let claim = objects::PersistentVolumeClaim::from_value(&claim);
            let phase = claim.status.phase.as_deref().unwrap_or("unknown");
            Check::pass(format!("MCP_K8S_CACHE_PVC: PersistentVolumeClaim `{pvc}` exists (phase {phase})"))
        }
        Ok(None) => Check::fail(format!(
            "MCP_K8S_CACHE_PVC: PersistentVolumeClaim `{pvc}` does not exist in namespace `{namespace}`; create it, or unset MCP_K8S_CACHE_PVC and MCP_K8S_CACHE_MOUNT_PATH"
        )),
        Err(error) => Check::fail(format!("MCP_K8S_CACHE_PVC: cannot read PersistentVolumeClaim `{pvc}`: {error}")),
    }
}

/// Lists the Secret's keys (git hosts, never values) so an operator sees
/// which hosts have a token.
fn check_clone_secret(client: &kube::Client, namespace: &str, secret: &str) -> Check {
    match client.get_if_exists(kube::Resource::SECRETS, namespace, secret) {
        Ok(Some(object)) => {
            let keys: Vec<String> = objects::Secret::from_value(&object).data.keys().map(|key| format!("`{key}`")).collect();
            if keys.is_empty() {
                Check::fail(format!(
                    "MCP_K8S_CLONE_SECRET: Secret `{secret}` has no keys; add one token per git host (key: the host, `host_port` with a port)"
                ))
            } else {
                Check::pass(format!("MCP_K8S_CLONE_SECRET: Secret `{secret}` exists with keys {}", keys.join(", ")))
            }
        }
        Ok(None) => Check::fail(format!(
            "MCP_K8S_CLONE_SECRET: Secret `{secret}` does not exist in namespace `{namespace}`; create it with one token per git host, or unset MCP_K8S_CLONE_IMAGE and MCP_K8S_CLONE_SECRET"
        )),
        Err(error) => Check::fail(format!("MCP_K8S_CLONE_SECRET: cannot read Secret `{secret}`: {error}")),
    }
}

/// A cluster-scoped object a job pod names, and how doctor says so.
struct ClusterObject {
    resource: kube::Resource,
    /// `RuntimeClass`, as the operator knows it.
    kind: &'static str,
    /// `runtimeclasses.node.k8s.io`, for the ClusterRole that lets doctor look.
    resource_name: &'static str,
}

const RUNTIME_CLASSES: ClusterObject = ClusterObject {
    resource: kube::Resource { api_path: "/apis/node.k8s.io/v1", plural: "runtimeclasses", namespaced: false },
    kind: "RuntimeClass",
    resource_name: "runtimeclasses.node.k8s.io",
};

const PRIORITY_CLASSES: ClusterObject = ClusterObject {
    resource: kube::Resource { api_path: "/apis/scheduling.k8s.io/v1", plural: "priorityclasses", namespaced: false },
    kind: "PriorityClass",
    resource_name: "priorityclasses.scheduling.k8s.io",
};

/// RuntimeClasses and PriorityClasses are cluster-scoped, so the server's
/// namespaced Role cannot grant reading them: the check is optional. It
/// passes, saying it could not look, unless the operator adds a ClusterRole
/// with `get` on the resource (the server never needs one to run jobs).
fn check_cluster_object(client: &kube::Client, object: &ClusterObject, name: &str) -> Check {
    let kind = object.kind;
    match client.get_if_exists(object.resource, "", name) {
        Ok(Some(_)) => Check::pass(format!("{kind} `{name}` exists")),
        Ok(None) => Check::fail(format!(
            "{kind} `{name}` does not exist; every job pod would be refused: create it, or change MCP_K8S_POD_TEMPLATE (or MCP_K8S_RUNTIME_CLASS)"
        )),
        Err(error) if error.is_forbidden() => Check::pass(format!(
            "{kind} `{name}`: not checked (cluster-scoped; a ClusterRole granting `get` on `{}` lets doctor look)",
            object.resource_name
        )),
        Err(error) => Check::fail(format!("{kind} `{name}`: cannot read it: {error}")),
    }
}

/// An image pull Secret exists. The server has no reason to read it (the
/// kubelet does), so this asks with the `list` the reaper already holds,
/// selected by name and metadata only (the API server sends no data), and
/// looks only at how many came back: no `get` on a Secret the server does
/// not own, and nothing of it is received, kept or shown.
fn check_pull_secret(client: &kube::Client, namespace: &str, secret: &str) -> Check {
    let params = kube::ListParams { label_selector: None, field_selector: Some(format!("metadata.name={secret}")) };
    match client.list_metadata(kube::Resource::SECRETS, namespace, &params) {
        Ok(list) if !list.items.is_empty() => Check::pass(format!("imagePullSecrets: Secret `{secret}` exists in `{namespace}`")),
        Ok(_) => Check::fail(format!(
            "imagePullSecrets: Secret `{secret}` does not exist in namespace `{namespace}`; pods pulling from that registry would fail with ErrImagePull: create it (kubectl create secret docker-registry), or remove it from MCP_K8S_POD_TEMPLATE"
        )),
        Err(error) => Check::fail(format!("imagePullSecrets: cannot look for Secret `{secret}`: {error}")),
    }
}

fn check_allowlist(config: &Config) -> Check {
    if config.allowed_images.is_empty() {
        Check::fail("MCP_K8S_ALLOWED_IMAGES is empty: every job will be refused; list the images jobs may use")
    } else {
        Check::pass(format!("MCP_K8S_ALLOWED_IMAGES allows {}", config.allowed_images.as_written.join(", ")))
    }
}

/// Runs `command` in `image` through the engine, exactly as a job would run
/// (same pod shape, runner, security context), and expects exit code 0.
fn check_image_runs(ctx: &engine::run::Ctx, what: &str, image: &str, command: &[&str]) -> Check {
    let outcome = engine::run::run_check(ctx, image, command, NetworkMode::None);
    if outcome.status == RunStatus::Succeeded {
        let first_line = String::from_utf8_lossy(&outcome.stdout).lines().next().unwrap_or("").to_string();
        return Check::pass(format!("{what} `{image}` runs a job: `{}` printed `{first_line}`", command.join(" ")));
    }
    Check::fail(format!("{what} `{image}`: `{}` did not succeed: {}", command.join(" "), failure_text(&outcome)))
}

/// The pid limit a job pod really has. The server
/// cannot read the kubelet's configuration, and a container's own cgroup
/// says `max`, so a job of the runner image counts the threads it can
/// start (`runner probe-pids`).
fn check_pids_limit(ctx: &engine::run::Ctx, config: &Config) -> Check {
    let ceiling = sandbox::PROBE_CEILING.to_string();
    let command = [config.runner_binary_path.as_str(), "runner", "probe-pids", "--ceiling", &ceiling];
    let outcome = engine::run::run_check(ctx, &config.runner_image, &command, NetworkMode::None);
    let stdout = String::from_utf8_lossy(&outcome.stdout);
    let probe = stdout.lines().find_map(sandbox::probe::parse_probe_line);
    match (outcome.status, probe) {
        (RunStatus::Succeeded, Some(probe)) => pids_check(&probe),
        _ => Check::fail(format!("pids limit: the probe job did not report: {}", failure_text(&outcome))),
    }
}

/// The verdict on one probe: a pod without a pid limit fails, since one
/// fork storm can then exhaust the node's pids.
fn pids_check(probe: &sandbox::probe::PidsProbe) -> Check {
    if probe.limited {
        Check::pass(format!(
            "pids limit: a job pod can run about {} processes or threads (a probe's next thread was refused; the kubelet's podPidsLimit, container pids.max `{}`)",
            probe.threads_started + 1,
            probe.own_pids_max
        ))
    } else {
        Check::fail(format!(
            "pids limit: none found; a probe job started {} threads; set podPidsLimit in the kubelet configuration (e.g. 1024), see the README's security model",
            probe.threads_started
        ))
    }
}

/// Whether job pods are really fenced in: a job of the runner
/// image tries to connect to the API server's Service (`runner
/// probe-connect`), which deploy/'s policies refuse in every network mode.
/// Doctor cannot see the CNI, so this is the only way to tell that the
/// NetworkPolicy objects are enforced rather than merely accepted.
fn check_network_policy(ctx: &engine::run::Ctx, config: &Config) -> Check {
    let command = [config.runner_binary_path.as_str(), "runner", "probe-connect"];
    // The probe job is not held for its fence (run_check_job), so it
    // measures the network plugin itself; the verdict says whether the
    // setting covers what it saw.
    let outcome = engine::run::run_check(ctx, &config.runner_image, &command, NetworkMode::None);
    let stdout = String::from_utf8_lossy(&outcome.stdout);
    match (outcome.status, stdout.lines().find_map(sandbox::probe::parse_connect_line)) {
        (RunStatus::Succeeded, Some(probe)) => network_policy_check(&probe, config.await_network_policy),
        _ => Check::warn(format!("NetworkPolicy: the probe job did not report, so enforcement is unknown: {}", failure_text(&outcome))),
    }
}

/// Whether network mode `open` keeps off the API server (by any of its
/// addresses and the nodes'), the kubelets and pool pods: a job in `open`
/// tries each (`open_reach`). Not checked when `open` is not offered.
fn check_open_reach(ctx: &engine::run::Ctx, config: &Config, client: &kube::Client) -> Check {
    if !config.network_modes.contains(&NetworkMode::Open) {
        return Check::pass("network mode `open`: not offered (MCP_K8S_NETWORK_MODES), so not checked");
    }
    let seen = open_reach::look(client, &config.namespace);
    let targets = open_reach::targets(&seen);
    let missing = open_reach::not_looked_up(&seen);
    if targets.is_empty() {
        return open_reach::verdict(&targets, &[], &missing);
    }
    let addresses: Vec<String> = targets.iter().map(|target| target.address.to_string()).collect();
    let mut command = vec![config.runner_binary_path.as_str(), "runner", "probe-reach"];
    command.extend(addresses.iter().map(String::as_str));
    let outcome = engine::run::run_check(ctx, &config.runner_image, &command, NetworkMode::Open);
    let stdout = String::from_utf8_lossy(&outcome.stdout);
    let probes: Vec<_> = stdout.lines().filter_map(sandbox::probe::parse_reach_line).collect();
    if outcome.status != RunStatus::Succeeded && probes.is_empty() {
        return Check::warn(format!(
            "network mode `open`: the probe job did not report, so what it reaches is unknown: {}",
            failure_text(&outcome)
        ));
    }
    open_reach::verdict(&targets, &probes, &missing)
}

/// The verdict on one connection probe: a job pod that reached the API
/// server means the network modes are not enforced.
fn network_policy_check(probe: &sandbox::probe::ConnectProbe, waits: FenceModes) -> Check {
    if probe.connected {
        Check::warn(format!(
            "NetworkPolicy: a job pod connected to the API server's Service ({}), which every network mode refuses: the cluster does not appear to enforce NetworkPolicy; use a CNI that enforces it (Calico, Cilium, kube-router, ...) and apply deploy/networkpolicy-jobs*.yaml (on a cluster whose API server endpoint is public, add it to the open policy's `except`) before trusting a network mode",
            probe.target
        ))
    } else if probe.target == "none" {
        Check::warn("NetworkPolicy: not checked (the probe pod had no KUBERNETES_SERVICE_HOST to try)")
    } else if probe.connected_at_start {
        late_fence_check(&probe.target, waits)
    } else {
        Check::pass(format!(
            "NetworkPolicy: a job pod cannot connect to the API server's Service ({}: {}), as deploy/'s policies say",
            probe.target, probe.error
        ))
    }
}

/// The engine on this backend, its check jobs run exactly as a job would
/// run except that they are not held for their fence: the checks need no
/// network, the connection probe must see the plugin unaided, and on a
/// cluster that does not enforce NetworkPolicy the other checks still
/// measure what they are for instead of ending NetworkPolicyNotEnforced.
fn unfenced(kubernetes: &Kubernetes, ctx: &engine::run::Ctx) -> engine::run::Ctx {
    let cluster = Settings { await_network_policy: AwaitFence::NEVER, ..kubernetes.cluster.clone() };
    engine::run::Ctx {
        backend: Arc::new(Kubernetes { cluster, ..kubernetes.clone() }),
        policy: ctx.policy.clone(),
        slots: ctx.slots.clone(),
        jobs: ctx.jobs.clone(),
        site: ctx.site.clone(),
    }
}

/// A plugin that fences a pod only once it has seen it: whether the fence
/// wait (MCP_K8S_AWAIT_NETWORK_POLICY) holds the commands that must not
/// run unfenced.
fn late_fence_check(target: &str, waits: FenceModes) -> Check {
    let seen = format!(
        "NetworkPolicy: enforced only after a pod has started: a job pod connected to the API server's Service ({target}) at once, and was refused 2 s later; the CNI fences a pod once it has seen it (kube-router does)"
    );
    match waits {
        FenceModes::All => Check::pass(format!("{seen}; every command waits for its fence (MCP_K8S_AWAIT_NETWORK_POLICY=1)")),
        FenceModes::Closed => Check::warn(format!(
            "{seen}; `none` and `restricted` commands wait for their fence (MCP_K8S_AWAIT_NETWORK_POLICY=auto), `open` ones do not and can reach the API server in their first moments: set it to 1 to hold them too"
        )),
        FenceModes::Never => Check::warn(format!(
            "{seen}, and MCP_K8S_AWAIT_NETWORK_POLICY=0 here, so a job's first moments are not fenced in any mode: set it to `auto` (the default) or 1, or use a CNI that applies policies before the pod runs (Calico, Cilium)"
        )),
    }
}

/// Reason, message and stderr of a check job that did not succeed.
fn failure_text(outcome: &RunOutcome) -> String {
    let stderr = String::from_utf8_lossy(&outcome.stderr);
    let reason = outcome.reason.map(|reason| format!("{reason:?}: ")).unwrap_or_default();
    let stderr = if stderr.trim().is_empty() { String::new() } else { format!("; stderr: {}", stderr.trim()) };
    format!("{reason}{}{stderr}", outcome.message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RawConfig;

    #[test]
    fn lines_start_with_the_verdict() {
        assert_eq!(Check::pass("a").line(), "ok    a");
        assert_eq!(Check::fail("b").line(), "FAIL  b");
    }

    #[test]
    fn a_pod_without_a_pid_limit_fails() {
        let probe = |threads_started, limited| sandbox::probe::PidsProbe { threads_started, limited, own_pids_max: "max".into() };
        let limited = pids_check(&probe(1019, true));
        assert!(limited.passed && limited.text.contains("about 1020 processes"), "{limited:?}");
        let unlimited = pids_check(&probe(4096, false));
        assert!(!unlimited.passed && unlimited.text.contains("set podPidsLimit"), "{unlimited:?}");
    }

    #[test]
    fn a_job_pod_that_reaches_the_api_server_warns() {
        let probe = |connected_at_start, connected, error: &str| sandbox::probe::ConnectProbe {
            target: "10.96.0.1:443".into(),
            connected_at_start,
            connected,
            error: error.into(),
        };
        let enforced = network_policy_check(&probe(false, false, "ConnectionRefused"), FenceModes::Never);
        assert_eq!(
            enforced.line(),
            "ok    NetworkPolicy: a job pod cannot connect to the API server's Service (10.96.0.1:443: ConnectionRefused), as deploy/'s policies say"
        );
        for (waits, warns, says) in [
            (FenceModes::Never, true, "MCP_K8S_AWAIT_NETWORK_POLICY=0 here"),
            (FenceModes::Closed, true, "set it to 1 to hold them too"),
            (FenceModes::All, false, "every command waits for its fence"),
        ] {
            let late = network_policy_check(&probe(true, false, "ConnectionRefused"), waits);
            assert!(late.passed && late.warning == warns, "{waits:?}: {late:?}");
            assert!(late.text.starts_with("NetworkPolicy: enforced only after a pod has started") && late.text.contains(says), "{late:?}");
        }
        let open = network_policy_check(&probe(true, true, "none"), FenceModes::Closed);
        assert!(open.passed && open.warning, "a warning does not fail doctor: {open:?}");
        assert!(
            open.line().starts_with("WARN  NetworkPolicy: a job pod connected to the API server's Service (10.96.0.1:443)"),
            "{open:?}"
        );
        assert!(open.text.contains("use a CNI that enforces it"), "{open:?}");
    }

    #[test]
    fn an_empty_allowlist_fails() {
        let config = Config::from_raw(&RawConfig::default()).unwrap();
        assert!(!check_allowlist(&config).passed);
        let raw = RawConfig { allowed_images: Some("busybox".into()), ..RawConfig::default() };
        let config = Config::from_raw(&raw).unwrap();
        assert_eq!(check_allowlist(&config), Check::pass("MCP_K8S_ALLOWED_IMAGES allows busybox"));
    }
}
