//! The real test cluster, as `tests/cluster/up` leaves it: where its
//! kubeconfigs are, which images it has, and an admin client for checking
//! what the server did. A missing cluster fails the test with a message
//! naming `tests/cluster/up`; it never passes silently.

use std::path::PathBuf;
use std::time::{Duration, Instant};

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
    let dir = PathBuf::from(std::env::var("MCP_K8S_TEST_CLUSTER_DIR").unwrap_or_else(|_| "/var/lib/mcp-k8s-test-cluster".into()));
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
    let source = kube::Source::KubeconfigFile { path: admin_kubeconfig(), context: None };
    kube::Client::new(&source).expect("the admin kubeconfig loads")
}

/// The environment a server under test gets: the ServiceAccount kubeconfig
/// (exactly the shipped Role's permissions), the test images, small
/// requests so many runs fit on the one node.
pub fn server_env() -> Vec<(String, String)> {
    vec![
        ("MCP_K8S_KUBECONFIG".into(), server_kubeconfig().display().to_string()),
        ("MCP_K8S_ALLOWED_IMAGES".into(), format!("{BUSYBOX},{PYTHON},{},{NONEXISTENT_IMAGE}", project_image())),
        ("MCP_K8S_RUNNER_IMAGE".into(), project_image()),
        ("MCP_K8S_DEFAULT_CPU".into(), "50m".into()),
        ("MCP_K8S_DEFAULT_MEMORY".into(), "64Mi".into()),
    ]
}

/// A server on stdio connected to the test cluster (`server_env`), with
/// `extra` settings on top, initialized.
pub fn server(extra: &[(&str, &str)]) -> super::StdioServer {
    let mut env = server_env();
    env.extend(extra.iter().map(|(name, value)| (name.to_string(), value.to_string())));
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let mut server = super::StdioServer::start(&env_refs);
    server.initialize();
    server
}

/// Waits until nothing labelled with `run_id` is left: no Job, pod or
/// Secret. Pods go through a short termination, hence the wait.
pub fn assert_nothing_left(run_id: &str) {
    assert_nothing_left_in(NAMESPACE, run_id);
}

pub fn assert_nothing_left_in(namespace: &str, run_id: &str) {
    let client = admin_client();
    let params = kube::ListParams { label_selector: Some(format!("mcp-k8s-ephemeral-job/run-id={run_id}")), field_selector: None };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut left = Vec::new();
        for resource in [kube::Resource::JOBS, kube::Resource::PODS, kube::Resource::SECRETS] {
            let list = client.list(resource, namespace, &params).expect("list works with the admin kubeconfig");
            left.extend(list.items.iter().map(|item| format!("{} {}", resource.plural, item["metadata"]["name"])));
        }
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "run {run_id} left objects behind: {left:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}
