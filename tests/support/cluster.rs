//! The real test cluster, as `tests/cluster/up` leaves it: where its
//! kubeconfigs are, which images it has, admin clients for checking what the
//! server did, and a server under test connected to it. A missing cluster
//! fails the test with a message naming `tests/cluster/up`; it never passes
//! silently. It knows nothing of the fake API server (`fake_api`).

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mcp_k8s_ephemeral_job::kube;

pub const NAMESPACE: &str = "mcp-ephemeral";
pub const BUSYBOX: &str = "mcp-k8s-test.local/busybox:1.35";
pub const PYTHON: &str = "mcp-k8s-test.local/python:3.11";
pub const PROJECT_IMAGE: &str = "mcp-k8s-test.local/mcp-k8s-ephemeral-job:dev";
/// A reference whose pull fails at once, on loopback (nothing listens there).
pub const NONEXISTENT_IMAGE: &str = "127.0.0.1:5000/mcp-k8s-test/does-not-exist:1";

/// The project's image as `tests/build-project-image` loaded it: `PROJECT_IMAGE`,
/// or `$MCP_K8S_PROJECT_IMAGE` when set (the variable that script takes), so
/// work in parallel on one cluster can load and test its own build.
pub fn project_image() -> String {
    std::env::var("MCP_K8S_PROJECT_IMAGE").ok().filter(|image| !image.is_empty()).unwrap_or_else(|| PROJECT_IMAGE.to_string())
}

pub fn dir() -> PathBuf {
    // Empty counts as unset, as in `tests/cluster/lib.sh` (`${VAR:-default}`).
    let dir = std::env::var_os("MCP_K8S_TEST_CLUSTER_DIR")
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/mcp-k8s-test-cluster"));
    assert!(
        dir.join("admin.kubeconfig").exists(),
        "no test cluster at {}: run `tests/cluster/up` first (the README's test command does)",
        dir.display()
    );
    dir
}

/// The cluster's build cache (`bin/kubectl`, ...), as `tests/cluster/up`
/// names it.
pub fn cache_dir() -> PathBuf {
    PathBuf::from(std::env::var("MCP_K8S_TEST_CLUSTER_CACHE").unwrap_or_else(|_| "/var/cache/mcp-k8s-test-cluster".into()))
}

pub fn admin_kubeconfig() -> PathBuf {
    dir().join("admin.kubeconfig")
}

pub fn server_kubeconfig() -> PathBuf {
    dir().join("server.kubeconfig")
}

pub fn admin_client() -> kube::Client {
    client("admin.kubeconfig")
}

/// A client from one of the cluster's kubeconfigs (`admin.kubeconfig`,
/// `server.kubeconfig`).
pub fn client(name: &str) -> kube::Client {
    let path = dir().join(name);
    assert!(path.is_file(), "the test cluster has no `{}`; start it with `tests/cluster/up` (as root)", path.display());
    let source = kube::Source::KubeconfigFile { path, context: None };
    kube::Client::new(&source).unwrap_or_else(|error| panic!("client from {name}: {error}"))
}

/// Admin credentials in the jobs namespace, for tests of the client itself
/// that need verbs the server's Role does not grant (it grants exactly
/// `backend::kubernetes::permissions::REQUIRED`, see deploy/role.yaml).
pub fn admin_client_in_jobs_namespace() -> kube::Client {
    let source = kube::Source::KubeconfigFile { path: admin_kubeconfig(), context: None };
    let mut config = source.load().unwrap_or_else(|error| panic!("admin.kubeconfig: {error}"));
    config.namespace = namespace();
    kube::Client::from_config(config, kube::Options::default()).unwrap_or_else(|error| panic!("client from admin.kubeconfig: {error}"))
}

/// A value from the cluster's `env` file (`KEY=VALUE` lines).
pub fn env_value(key: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir().join("env")).ok()?;
    text.lines().find_map(|line| line.strip_prefix(&format!("{key}=")).map(str::to_string))
}

/// The busybox image as the cluster's `env` file names it (`BUSYBOX` unless
/// the cluster was built with another).
pub fn busybox_image() -> String {
    env_value("IMAGE_BUSYBOX").unwrap_or_else(|| BUSYBOX.to_string())
}

/// The jobs namespace as the cluster's `env` file names it (`NAMESPACE` unless
/// the cluster was built with another).
pub fn namespace() -> String {
    env_value("NAMESPACE").unwrap_or_else(|| NAMESPACE.to_string())
}

/// A name no other test run uses.
pub fn unique_name(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("{prefix}-{}-{nanos:09}", std::process::id() % 100_000)
}

/// Taken by every test that asks for more memory than the node has (24Gi,
/// 30Gi): two of them at once pass the namespace's quota (32Gi of requests,
/// deploy/resourcequota.yaml) and fail as "exceeded quota" instead of
/// Unschedulable. One lock for the whole cluster tier, since its files now
/// share one process; hold it until the run's pods are gone.
pub fn more_memory_than_the_node() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The environment a server under test gets: the ServiceAccount kubeconfig
/// (exactly the shipped Role's permissions), the test images, small
/// requests so many runs fit on the one node, and the wait for the pod's
/// network policy: the test cluster's kube-router fences a pod only ~0.6 s
/// after its containers started.
pub fn server_env() -> Vec<(String, String)> {
    vec![
        ("MCP_K8S_AWAIT_NETWORK_POLICY".into(), "1".into()),
        ("MCP_K8S_KUBECONFIG".into(), server_kubeconfig().display().to_string()),
        ("MCP_K8S_ALLOWED_IMAGES".into(), format!("{BUSYBOX},{PYTHON},{},{NONEXISTENT_IMAGE}", project_image())),
        ("MCP_K8S_RUNNER_IMAGE".into(), project_image()),
        ("MCP_K8S_DEFAULT_CPU".into(), "50m".into()),
        ("MCP_K8S_DEFAULT_MEMORY".into(), "64Mi".into()),
    ]
}

/// A server on stdio connected to the test cluster (`server_env`), with
/// `extra` settings on top, initialized.
pub fn server(extra: &[(&str, &str)]) -> super::server::StdioServer {
    let mut env = server_env();
    env.extend(extra.iter().map(|(name, value)| (name.to_string(), value.to_string())));
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let mut server = super::server::StdioServer::start(&env_refs);
    server.initialize();
    server
}

/// Waits until nothing labelled with `run_id` is left: no Job, pod or
/// Secret. Pods go through a short termination, hence the wait.
pub fn assert_nothing_left(run_id: &str) {
    assert_nothing_left_in(NAMESPACE, run_id);
}

/// The Jobs, pods and Secrets of `run_id` in the test namespace, now.
pub fn leftovers(run_id: &str) -> Vec<String> {
    leftovers_in(&admin_client(), NAMESPACE, run_id)
}

fn leftovers_in(client: &kube::Client, namespace: &str, run_id: &str) -> Vec<String> {
    let params = kube::ListParams { label_selector: Some(format!("mcp-k8s-ephemeral-job/run-id={run_id}")), field_selector: None };
    let mut left = Vec::new();
    for resource in [kube::Resource::JOBS, kube::Resource::PODS, kube::Resource::SECRETS] {
        let list = client.list(resource, namespace, &params).expect("list works with the admin kubeconfig");
        left.extend(list.items.iter().map(|item| format!("{} {}", resource.plural, item["metadata"]["name"])));
    }
    left
}

pub fn assert_nothing_left_in(namespace: &str, run_id: &str) {
    let client = admin_client();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = leftovers_in(&client, namespace, run_id);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "run {run_id} left objects behind: {left:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The restricted-compliant pod spec the security model asks for.
pub fn restricted_pod_spec(image: &str, script: &str) -> serde_json::Value {
    serde_json::json!({
        "restartPolicy": "Never",
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "containers": [{
            "name": "main",
            "image": image,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", script],
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": { "drop": ["ALL"] },
                "readOnlyRootFilesystem": true,
            },
            "resources": {
                "requests": { "cpu": "50m", "memory": "32Mi" },
                "limits": { "cpu": "500m", "memory": "64Mi" },
            },
        }],
    })
}
