//! The server as operators run it: deployed into the test cluster from
//! `deploy/` (through a kustomize overlay that only swaps in the locally
//! built image, the test token, the test images and a NodePort), reached
//! over HTTP on the node's bridge address, authenticated with its token,
//! and running a job with its in-cluster ServiceAccount, which has exactly
//! the shipped Role.
//!
//! Each run renames the two namespaces to its own, so it never touches the
//! shared `mcp-ephemeral` (other cluster tests run there at the same time)
//! and deletes them at the end. The image is `tests/build-project-image`'s
//! (`cluster::project_image`). `helm_install.rs` reuses the checks and the
//! helpers on the Helm chart's install.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::cluster::{self, BUSYBOX};
use crate::support::server::{HttpResponse, INITIALIZE, raw_request, raw_request_within};
use base64::Engine as _;
use serde_json::json;

/// Only these tests know it; the server must never log it.
pub(crate) const TOKEN: &str = "in-cluster-e2e-token-7f3a9c";
/// The node's address on the pod bridge, where kube-proxy serves NodePorts.
const NODE_IP: &str = "10.244.0.1";

#[test]
fn the_deployed_server_runs_a_job_over_http_with_its_token() {
    deployed_server_runs_a_job(&cluster::project_image(), "tests/build-project-image");
}

/// The whole check with `image` as the server image and the runner image;
/// `builds_it` is the command that loads that image into the cluster (named
/// when the rollout fails). Also run by `dockerfile_image`.
pub(crate) fn deployed_server_runs_a_job(image: &str, builds_it: &str) {
    let deployment = Deployment::apply(image);
    let addr = deployment.wait_until_reachable(builds_it);
    assert_serves_a_job_with_its_token(&deployment, &addr);
}

/// The checks of a deployed server (`helm_install.rs` runs them on the
/// chart's): the token is required, a run succeeds with the pod's own
/// ServiceAccount, metrics count it, the logs leak nothing.
pub(crate) fn assert_serves_a_job_with_its_token(deployment: &Deployment, addr: &str) {
    let addr = addr.to_string();
    let refused = post(&addr, &[], INITIALIZE);
    assert_eq!(refused.status, 401, "no token: {}", refused.body);
    let wrong = post(&addr, &[("Authorization", "Bearer not-the-token")], INITIALIZE);
    assert_eq!(wrong.status, 401, "wrong token: {}", wrong.body);

    let bearer = format!("Bearer {TOKEN}");
    let initialized = post(&addr, &[("Authorization", &bearer)], INITIALIZE);
    assert_eq!(initialized.status, 200, "{}", initialized.body);
    let session = initialized.header("mcp-session-id").expect("Mcp-Session-Id").to_string();
    let headers = [("Authorization", bearer.as_str()), ("Mcp-Session-Id", session.as_str())];
    let notified = post(&addr, &headers, r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    assert_eq!(notified.status, 202, "{}", notified.body);

    // A file as well as a command, so the run also needs the inputs Secret:
    // every verb of the Role is used by the pod's own ServiceAccount.
    let call = json!({
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "run_job", "arguments": {
            "image": BUSYBOX,
            "command": ["sh", "-c", "echo hi; cat note.txt >&2"],
            "files": [{"path": "note.txt", "content_b64": base64::engine::general_purpose::STANDARD.encode("from a file\n")}],
        }},
    });
    let answer = raw_request_within(&addr, "POST", "/mcp", &with_json(&headers), call.to_string().as_bytes(), Duration::from_secs(180));
    assert_eq!(answer.status, 200, "{}", answer.body);
    let result = &answer.json()["result"];
    let structured = &result["structuredContent"];
    assert_eq!(structured["status"], "succeeded", "{result}");
    assert_eq!(structured["stdout"], "hi\n");
    assert_eq!(structured["stderr"], "from a file\n");
    cluster::assert_nothing_left_in(&deployment.jobs_namespace, structured["run_id"].as_str().expect("run_id"));

    let metrics = raw_request(&addr, "GET", "/metrics", &[], b"");
    assert_eq!(metrics.status, 200);
    assert!(metrics.body.contains("mcp_k8s_runs_total{site=\"default\",status=\"succeeded\",reason=\"\"} 1"), "{}", metrics.body);

    let logs = deployment.server_logs();
    assert!(logs.contains("in-cluster ServiceAccount"), "the server must use in-cluster credentials:\n{logs}");
    assert!(!logs.contains(TOKEN) && !logs.contains("from a file"), "the logs leak a secret:\n{logs}");
}

/// The server's objects in two namespaces of this test's own; deleted
/// (with everything in them) on drop, whatever happened.
pub(crate) struct Deployment {
    pub(crate) jobs_namespace: String,
    pub(crate) system_namespace: String,
}

impl Deployment {
    fn apply(image: &str) -> Deployment {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
        let suffix = format!("{}-{}", std::process::id() % 100_000, nanos % 10_000);
        let deployment = Deployment { jobs_namespace: format!("mcp-e2e-jobs-{suffix}"), system_namespace: format!("mcp-e2e-sys-{suffix}") };
        let overlay = Overlay::write(image, &suffix);
        let rendered = kubectl(&["kustomize", &overlay.dir.display().to_string()], None);
        let renamed = rendered.replace("mcp-ephemeral", &deployment.jobs_namespace).replace("mcp-system", &deployment.system_namespace);
        kubectl(&["apply", "-f", "-"], Some(&renamed));
        deployment
    }

    /// Waits for the rollout and for the NodePort to answer; the address.
    pub(crate) fn wait_until_reachable(&self, builds_it: &str) -> String {
        let rollout =
            run_kubectl(&["-n", &self.system_namespace, "rollout", "status", "deployment/mcp-k8s-ephemeral-job", "--timeout=180s"], None);
        assert!(
            rollout.is_ok(),
            "the server did not become ready: {rollout:?}\n{}\nIs the image loaded? Run `{builds_it}`.",
            run_kubectl(&["-n", &self.system_namespace, "describe", "pods"], None).unwrap_or_else(|error| error)
        );
        let service = ["-n", &self.system_namespace, "get", "service", "mcp-k8s-ephemeral-job"];
        let node_port = kubectl(&[&service[..], &["-o", "jsonpath={.spec.ports[0].nodePort}"]].concat(), None);
        let addr = format!("{NODE_IP}:{}", node_port.trim());
        // kube-proxy programs the NodePort shortly after the Service exists.
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect_timeout(&addr.parse().expect("address"), Duration::from_secs(2)).is_err() {
            assert!(Instant::now() < deadline, "nothing answers on the NodePort {addr}");
            std::thread::sleep(Duration::from_millis(300));
        }
        assert_eq!(raw_request(&addr, "GET", "/readyz", &[], b"").status, 200);
        addr
    }

    fn server_logs(&self) -> String {
        kubectl(&["-n", &self.system_namespace, "logs", "deployment/mcp-k8s-ephemeral-job"], None)
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        let _ = run_kubectl(&["delete", "namespace", &self.jobs_namespace, &self.system_namespace, "--wait=false"], None);
    }
}

/// A kustomize overlay on `deploy/` in a temporary directory.
struct Overlay {
    dir: PathBuf,
}

impl Overlay {
    /// `suffix` keeps two deployments of one test process apart.
    fn write(image: &str, suffix: &str) -> Overlay {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("overlay-{suffix}"));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        // kustomize takes bases by relative path only.
        let deploy = relative_path(&dir, &Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy"));
        let (name, tag) = image.rsplit_once(':').expect("the image has a tag");
        let kustomization = format!(
            r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {deploy}
images:
  - name: mcp-k8s-ephemeral-job
    newName: {name}
    newTag: {tag}
secretGenerator:
  - name: mcp-k8s-ephemeral-job-auth
    namespace: mcp-system
    literals: ["token={TOKEN}"]
generatorOptions:
  disableNameSuffixHash: true
patches:
  - patch: |
      apiVersion: apps/v1
      kind: Deployment
      metadata:
        name: mcp-k8s-ephemeral-job
        namespace: mcp-system
      spec:
        template:
          spec:
            containers:
              - name: server
                imagePullPolicy: IfNotPresent
                env:
                  - name: MCP_K8S_RUNNER_IMAGE
                    value: {image}
                  - name: MCP_K8S_ALLOWED_IMAGES
                    value: {BUSYBOX}
                  - name: MCP_K8S_DEFAULT_CPU
                    value: 50m
                  - name: MCP_K8S_DEFAULT_MEMORY
                    value: 64Mi
  - patch: |
      apiVersion: v1
      kind: Service
      metadata:
        name: mcp-k8s-ephemeral-job
        namespace: mcp-system
      spec:
        type: NodePort
"#,
            deploy = deploy.display()
        );
        std::fs::write(dir.join("kustomization.yaml"), kustomization).expect("overlay written");
        Overlay { dir }
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `to` as seen from the directory `from`; both absolute.
fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path: PathBuf = std::iter::repeat_n(std::path::Component::ParentDir, from.len() - common).collect();
    path.extend(&to[common..]);
    path
}

fn post(addr: &str, headers: &[(&str, &str)], body: &str) -> HttpResponse {
    raw_request(addr, "POST", "/mcp", &with_json(headers), body.as_bytes())
}

fn with_json<'a>(headers: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut all = vec![("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    all.extend_from_slice(headers);
    all
}

/// kubectl as the cluster admin; panics with its stderr on failure.
pub(crate) fn kubectl(args: &[&str], stdin: Option<&str>) -> String {
    run_kubectl(args, stdin).unwrap_or_else(|error| panic!("kubectl {}: {error}", args.join(" ")))
}

pub(crate) fn run_kubectl(args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let kubectl = cluster_env("KUBECTL").unwrap_or_else(|| "/var/cache/mcp-k8s-test-cluster/bin/kubectl".into());
    let mut child = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(cluster::admin_kubeconfig())
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("cannot start kubectl: {error}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        std::io::Write::write_all(&mut pipe, text.as_bytes()).map_err(|error| error.to_string())?;
    }
    let output = child.wait_with_output().map_err(|error| error.to_string())?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!("{}\n{}", output.status, String::from_utf8_lossy(&output.stderr)))
    }
}

/// A value from the cluster's `env` file (`KEY=VALUE` lines).
fn cluster_env(key: &str) -> Option<String> {
    let text = std::fs::read_to_string(cluster::dir().join("env")).ok()?;
    text.lines().find_map(|line| line.strip_prefix(&format!("{key}=")).map(str::to_string))
}
