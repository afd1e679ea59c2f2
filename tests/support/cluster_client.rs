//! Finding the real test cluster built by `tests/cluster/up`: its state
//! directory, kubeconfigs and image names. When the cluster is missing,
//! every helper panics with a message naming `tests/cluster/up`, so cluster
//! tests fail loudly instead of passing silently.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use mcp_k8s_ephemeral_job::kube::{Client, Options, Source};

/// `${MCP_K8S_TEST_CLUSTER_DIR:-/var/lib/mcp-k8s-test-cluster}`.
pub fn state_dir() -> PathBuf {
    std::env::var_os("MCP_K8S_TEST_CLUSTER_DIR")
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/mcp-k8s-test-cluster"))
}

/// `admin.kubeconfig` or `server.kubeconfig`; panics when the cluster is not up.
pub fn kubeconfig(name: &str) -> PathBuf {
    let path = state_dir().join(name);
    assert!(path.is_file(), "the test cluster is not up: `{}` is missing; start it with `tests/cluster/up` (as root)", path.display());
    path
}

pub fn client(name: &str) -> Client {
    let source = Source::KubeconfigFile { path: kubeconfig(name), context: None };
    Client::new(&source).unwrap_or_else(|error| panic!("client from {name}: {error}"))
}

/// Admin credentials in the jobs namespace, for tests of the client itself
/// that need verbs the server's Role does not grant (it grants exactly
/// `engine::permissions::REQUIRED`, see deploy/role.yaml).
pub fn admin_client_in_jobs_namespace() -> Client {
    let source = Source::KubeconfigFile { path: kubeconfig("admin.kubeconfig"), context: None };
    let mut config = source.load().unwrap_or_else(|error| panic!("admin.kubeconfig: {error}"));
    config.namespace = namespace();
    Client::from_config(config, Options::default()).unwrap_or_else(|error| panic!("client from admin.kubeconfig: {error}"))
}

/// A value from the cluster's `env` file (`KEY=VALUE` lines).
pub fn env_value(key: &str) -> Option<String> {
    let text = std::fs::read_to_string(state_dir().join("env")).ok()?;
    text.lines().find_map(|line| line.strip_prefix(&format!("{key}=")).map(str::to_string))
}

pub fn busybox_image() -> String {
    env_value("IMAGE_BUSYBOX").unwrap_or_else(|| "mcp-k8s-test.local/busybox:1.35".to_string())
}

pub fn namespace() -> String {
    env_value("NAMESPACE").unwrap_or_else(|| "mcp-ephemeral".to_string())
}

/// A name no other test run uses.
pub fn unique_name(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("{prefix}-{}-{nanos:09}", std::process::id() % 100_000)
}

/// The restricted-compliant pod spec issue 2 asks for.
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
