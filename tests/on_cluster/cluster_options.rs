//! The operator's options on the real test cluster: private git
//! clones from a token-protected HTTPS git server (branch, tag, SHA; the
//! token never in argv, in the main container's environment or under
//! `.git`; bad ref and bad token give CloneFailed), the cache volume shared
//! between runs, MCP_K8S_JOB_EXTRA_ENV under the caller's env, start-up
//! refusal of a missing PVC or clone Secret, and `doctor` passing on the
//! test namespace and failing, naming the permission, when a verb is
//! missing from the Role, or naming the address, when a job in network mode
//! `open` reaches the API server at a node address outside the policy's
//! `except`.
//!
//! The git server runs on this machine (git http-backend behind
//! tests/support/git_server.py) on the bridge address pods reach the host
//! at, with a certificate from a throwaway CA that reaches git through the
//! clone Secret's `_ca.crt` key.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::support::cluster::{self, BUSYBOX, NAMESPACE};
use crate::support::server::StdioServer;
use base64::Engine as _;
use mcp_k8s_ephemeral_job::backend::kubernetes::permissions::{REQUIRED, SANDBOXES};
use mcp_k8s_ephemeral_job::kube;
use serde_json::{Value, json};

const GIT: &str = "mcp-k8s-test.local/git:2.39";

// ---------------------------------------------------------------------------
// Clone

#[test]
fn clone_of_a_branch_a_tag_and_a_sha_without_leaking_the_token() {
    let git = GitServer::start();
    let secret = CloneSecret::create(&[(&git.secret_key(), &git.token)], &git.ca_pem);
    let mut server = server_with(&[("MCP_K8S_CLONE_IMAGE", GIT), ("MCP_K8S_CLONE_SECRET", &secret.name)]);

    // The branch run also gathers what the three leak checks need: the
    // main container's environment and every process's argv (stdout),
    // every byte under .git (stderr), and, read while it runs, the pod as
    // the API stores it and the clone container's log (the git argv).
    let script = "cd src; cat version.txt; git rev-parse HEAD; git rev-list --count HEAD; \
                  echo ---env; env; echo ---argv; for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < $f; echo; done; \
                  echo ---mcp; ls /mcp; find .git -type f -exec cat {} + >&2; sleep 3";
    let request_id = send_run(
        &mut server,
        json!({"image": GIT, "command": ["sh", "-c", script], "workdir": "/work", "clone": {"repo_url": git.url(), "ref": "main", "subdir": "src"}}),
    );
    let (pod, clone_log) = pod_and_clone_log(&git.url());
    let out = receive_run(&mut server, request_id);
    assert_eq!(out["status"], "succeeded", "{out}");
    let stdout = out["stdout"].as_str().unwrap();
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("three"), "the branch tip is checked out: {stdout}");
    assert_eq!(lines.next(), Some(git.tip.as_str()));
    assert_eq!(lines.next(), Some("1"), "the clone is shallow");
    assert!(stdout.contains("---mcp\nbin\n"), "main mounts no credentials: {stdout}");
    assert!(clone_log.contains("running: git fetch --depth 1 --no-tags origin main"), "{clone_log}");
    let dot_git = output_bytes(&out, "stderr");
    assert!(dot_git.windows(6).any(|w| w == b"[core]"), "the .git dump came back");
    for (place, haystack) in [
        ("the pod spec (every container's argv and env)", pod.to_string().into_bytes()),
        ("the clone container's log (git's argv)", clone_log.into_bytes()),
        ("the main container's environment and argv", stdout.as_bytes().to_vec()),
        ("the files under .git", dot_git),
    ] {
        for needle in git.token_forms() {
            assert!(!contains(&haystack, needle.as_bytes()), "the token leaked into {place}");
        }
    }

    let out = run(
        &mut server,
        json!({"image": GIT, "command": ["sh", "-c", "cat version.txt; git rev-parse HEAD"], "clone": {"repo_url": git.url(), "ref": "v1"}, "workdir": "/work"}),
        "repo",
    );
    assert_eq!(out["stdout"], format!("one\n{}\n", git.first), "the tag: {out}");
    let out = run(
        &mut server,
        json!({"image": GIT, "command": ["sh", "-c", "cat version.txt; git rev-parse HEAD"], "clone": {"repo_url": git.url(), "ref": git.middle}}),
        "repo",
    );
    assert_eq!(out["stdout"], format!("two\n{}\n", git.middle), "the SHA of a commit that is no branch tip: {out}");
    let out = run(
        &mut server,
        json!({"image": BUSYBOX, "command": ["cat", "version.txt"], "clone": {"repo_url": git.url(), "ref": "main", "subdir": "."}}),
        "",
    );
    assert_eq!(out["stdout"], "three\n", "subdir `.` is the workdir itself: {out}");
}

#[test]
fn a_bad_ref_a_bad_token_and_a_host_without_a_token_give_clone_failed() {
    let git = GitServer::start();
    let good = CloneSecret::create(&[(&git.secret_key(), &git.token)], &git.ca_pem);
    let mut server = server_with(&[("MCP_K8S_CLONE_IMAGE", GIT), ("MCP_K8S_CLONE_SECRET", &good.name)]);
    let (out, log) = clone_failure(&mut server, &git, "no-such-branch");
    assert!(out.contains("couldn't find remote ref no-such-branch"), "{out}\nthe git server's log:\n{log}");
    assert!(out.contains("check that `ref` exists"), "{out}");
    drop(server);

    let wrong_token = format!("wrong-{}", git.token);
    let bad = CloneSecret::create(&[(&git.secret_key(), &wrong_token)], &git.ca_pem);
    let mut server = server_with(&[("MCP_K8S_CLONE_IMAGE", GIT), ("MCP_K8S_CLONE_SECRET", &bad.name)]);
    let (out, log) = clone_failure(&mut server, &git, "main");
    assert!(out.contains("Authentication failed"), "{out}\nthe git server's log:\n{log}");
    assert!(!out.contains(&wrong_token) && !out.contains(&git.token), "the token is masked: {out}");
    drop(server);

    let no_key = CloneSecret::create(&[("other.example.com", "x")], &git.ca_pem);
    let mut server = server_with(&[("MCP_K8S_CLONE_IMAGE", GIT), ("MCP_K8S_CLONE_SECRET", &no_key.name)]);
    let (out, log) = clone_failure(&mut server, &git, "main");
    assert!(out.contains(&format!("the clone Secret has no key `{}`", git.secret_key())), "{out}\nthe git server's log:\n{log}");
}

/// Runs a clone that must fail; returns the outcome's message and the git
/// server's log (for the caller's assertion messages).
fn clone_failure(server: &mut StdioServer, git: &GitServer, git_ref: &str) -> (String, String) {
    let out = run(server, json!({"image": BUSYBOX, "command": ["true"], "clone": {"repo_url": git.url(), "ref": git_ref}}), "");
    let log = git.log();
    assert_eq!(out["status"], "error", "{out}\nthe git server's log:\n{log}");
    assert_eq!(out["reason"], "CloneFailed", "{out}\nthe git server's log:\n{log}");
    (out["message"].as_str().unwrap().to_string(), log)
}

// ---------------------------------------------------------------------------
// Cache volume, extra env, start-up checks

#[test]
fn a_file_written_to_the_cache_by_one_job_is_read_by_the_next() {
    let cache = CacheVolume::create();
    let mut server = server_with(&[("MCP_K8S_CACHE_PVC", &cache.claim), ("MCP_K8S_CACHE_MOUNT_PATH", "/cache")]);
    let stamp = unique("stamp");
    let out = run(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", format!("echo {stamp} > /cache/stamp")]}), "");
    assert_eq!(out["status"], "succeeded", "{out}");
    let out = run(&mut server, json!({"image": BUSYBOX, "command": ["cat", "/cache/stamp"]}), "");
    assert_eq!(out["stdout"], format!("{stamp}\n"), "{out}");
}

#[test]
fn operator_env_reaches_every_job_and_the_caller_wins() {
    let extra_env = r#"{"FROM_OPERATOR":"operator-value","SHARED":"operator"}"#;
    let mut server = server_with(&[("MCP_K8S_JOB_EXTRA_ENV", extra_env)]);
    let out = run(
        &mut server,
        json!({"image": BUSYBOX, "command": ["sh", "-c", "echo $FROM_OPERATOR $SHARED $CALLER"], "env": {"SHARED": "caller", "CALLER": "c"}}),
        "",
    );
    assert_eq!(out["stdout"], "operator-value caller c\n", "{out}");
}

#[test]
fn a_missing_cache_pvc_or_clone_secret_stops_the_server() {
    let cases = [
        (
            [("MCP_K8S_CACHE_PVC", "no-such-claim"), ("MCP_K8S_CACHE_MOUNT_PATH", "/cache")],
            "MCP_K8S_CACHE_PVC: PersistentVolumeClaim `no-such-claim` does not exist in namespace `mcp-ephemeral`",
        ),
        (
            [("MCP_K8S_CLONE_IMAGE", GIT), ("MCP_K8S_CLONE_SECRET", "no-such-secret")],
            "MCP_K8S_CLONE_SECRET: Secret `no-such-secret` does not exist in namespace `mcp-ephemeral`",
        ),
    ];
    for (settings, expected) in cases {
        let output = binary(&settings).arg("serve").stdin(Stdio::null()).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
    }
}

// ---------------------------------------------------------------------------
// doctor

#[test]
fn doctor_passes_on_the_test_namespace() {
    let _turn = no_fake_node();
    let git_secret = CloneSecret::create(&[("git.example.com", "t")], "");
    let output = binary(&[("MCP_K8S_CLONE_IMAGE", GIT), ("MCP_K8S_CLONE_SECRET", &git_secret.name)]).arg("doctor").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    // One line per permission the code needs, in REQUIRED's own words.
    for permission in REQUIRED {
        let expected = format!("ok    permission: {} on `{}` in `mcp-ephemeral`", permission.verbs.join(", "), permission.resource_name());
        assert!(stdout.contains(&expected), "missing `{expected}` in:\n{stdout}");
    }
    for expected in [
        "ok    Kubernetes API answers",
        "ok    namespace `mcp-ephemeral` is usable",
        &format!("ok    MCP_K8S_CLONE_SECRET: Secret `{}` exists with keys `git.example.com`", git_secret.name),
        "ok    MCP_K8S_ALLOWED_IMAGES allows",
        "ok    runner image (MCP_K8S_RUNNER_IMAGE)",
        // The kubelet's podPidsLimit (tests/cluster/up: 1024), measured.
        "ok    pids limit: a job pod can run about",
        "ok    clone image (MCP_K8S_CLONE_IMAGE) `mcp-k8s-test.local/git:2.39` runs a job: `git --version` printed `git version 2.39",
        // deploy/doctor.optional.yaml is applied: the API server's endpoint
        // and the node's kubelet, both on the bridge, inside `except`.
        "ok    network mode `open` keeps off the API server, the kubelets and pool pods: a job pod reached none of",
        "10.244.0.1:6443",
        "10.244.0.1:10250",
        "all checks passed",
    ] {
        assert!(stdout.contains(expected), "missing `{expected}` in:\n{stdout}");
    }
    assert_eq!(stdout.lines().filter(|line| line.starts_with("FAIL")).count(), 0, "{stdout}");
}

#[test]
fn doctor_fails_naming_the_permission_a_role_lacks() {
    let namespace = DoctorNamespace::create("secrets", "delete");
    // A namespace of its own, without the jobs namespace's NetworkPolicies:
    // its pods are never fenced, so the wait for the fence is off here.
    let settings = [
        ("MCP_K8S_KUBECONFIG", namespace.kubeconfig.to_str().unwrap()),
        ("MCP_K8S_NAMESPACE", namespace.name.as_str()),
        ("MCP_K8S_AWAIT_NETWORK_POLICY", "0"),
    ];
    let output = binary(&settings).arg("doctor").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let failures: Vec<&str> = stdout.lines().filter(|line| line.starts_with("FAIL")).collect();
    let expected = format!("FAIL  permission: `delete` on `secrets` in `{}` not granted", namespace.name);
    assert_eq!(failures.len(), 1, "only the missing verb fails:\n{stdout}");
    assert!(failures[0].starts_with(&expected), "{stdout}");
    assert!(stdout.contains("ok    runner image"), "the rest still works:\n{stdout}");
    assert!(stdout.ends_with("some checks failed\n"), "{stdout}");
}

/// A node whose address lies outside the `open` policy's `except` (here a
/// documentation address this test puts on the machine, where the API
/// server listens on every address): a job in mode `open` reaches the API
/// server there, and doctor fails naming the address and the `except` entry
/// that closes it. The node is an object only (no kubelet, unschedulable).
#[test]
fn doctor_fails_when_an_open_job_reaches_the_api_server_at_a_node_address() {
    let _turn = no_fake_node();
    let address = "203.0.113.77";
    let _on_this_machine = HostAddress::add(address);
    let _node = FakeNode::create(address);
    let output = binary(&[]).arg("doctor").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let failures: Vec<&str> = stdout.lines().filter(|line| line.starts_with("FAIL")).collect();
    assert_eq!(failures.len(), 1, "only the open mode's reach fails:\n{stdout}");
    let failure = failures[0];
    assert!(failure.starts_with("FAIL  network mode `open`: a job pod reached "), "{failure}");
    assert!(failure.contains(&format!("{address}:6443 (the API server's port on node `")), "{failure}");
    assert!(failure.contains(&format!("add {address}/32 to the `open` policy's `except`")), "{failure}");
    assert!(!failure.contains("10.244.0.1"), "the bridge addresses stay refused: {failure}");
}

/// Held by the doctor tests that see every node: the fake node must not
/// be there while another expects doctor to pass.
fn no_fake_node() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An address of this machine, on a bridge of its own with no ports
/// (this kernel has no dummy links); removed on drop.
struct HostAddress {
    link: String,
}

impl HostAddress {
    fn add(address: &str) -> HostAddress {
        let link = format!("mcpnode{}", std::process::id() % 100_000);
        host("ip", &["link", "add", &link, "type", "bridge"]);
        let added = HostAddress { link };
        host("ip", &["addr", "add", &format!("{address}/32"), "dev", &added.link]);
        host("ip", &["link", "set", &added.link, "up"]);
        added
    }
}

impl Drop for HostAddress {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.link]).status();
    }
}

/// A Node object with one InternalIP and no kubelet behind it,
/// unschedulable and tainted so no pod lands on it; deleted on drop.
struct FakeNode {
    name: String,
}

impl FakeNode {
    fn create(address: &str) -> FakeNode {
        let name = unique("fake-node");
        let nodes = kube::Resource { api_path: "/api/v1", plural: "nodes", namespaced: false };
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"mcp-k8s-test/fake": "true"}},
            "spec": {"unschedulable": true, "taints": [{"key": "mcp-k8s-test/fake", "effect": "NoSchedule"}]},
        });
        cluster::admin_client().create(nodes, "", &node).expect("the fake node");
        let created = FakeNode { name };
        // Status is the status subresource's: set it as a kubelet would.
        let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": address}], "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}});
        kubectl(&["patch", "node", &created.name, "--subresource=status", "--type=merge", "-p", &status.to_string()]);
        created
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        let nodes = kube::Resource { api_path: "/api/v1", plural: "nodes", namespaced: false };
        let _ = cluster::admin_client().delete(nodes, "", &self.name);
    }
}

fn host(program: &str, args: &[&str]) {
    let output = Command::new(program).args(args).output().unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(output.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

/// kubectl with the admin kubeconfig.
fn kubectl(args: &[&str]) {
    let kubectl = cluster::env_value("KUBECTL").expect("KUBECTL in the test cluster's env file");
    let admin = cluster::admin_kubeconfig();
    let mut full = vec!["--kubeconfig", admin.to_str().expect("a UTF-8 path")];
    full.extend_from_slice(args);
    host(&kubectl, &full);
}

// ---------------------------------------------------------------------------
// Helpers: servers and runs

/// The server binary with `environment(settings)`.
fn binary(settings: &[(&str, &str)]) -> Command {
    let env = environment(settings);
    crate::support::server::command(&env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect::<Vec<_>>())
}

fn server_with(settings: &[(&str, &str)]) -> StdioServer {
    let env = environment(settings);
    let mut server = StdioServer::start(&env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect::<Vec<_>>());
    server.initialize();
    server
}

/// `cluster::server_env()` with the git image allowed too, and `settings`
/// on top (later entries win).
fn environment(settings: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = cluster::server_env();
    let allowed = env.iter().find(|(name, _)| name == "MCP_K8S_ALLOWED_IMAGES").map(|(_, value)| value.clone()).unwrap_or_default();
    env.push(("MCP_K8S_ALLOWED_IMAGES".into(), format!("{allowed},{GIT}")));
    env.extend(settings.iter().map(|(name, value)| (name.to_string(), value.to_string())));
    env
}

static NEXT_ID: AtomicU32 = AtomicU32::new(100);

fn send_run(server: &mut StdioServer, arguments: Value) -> u32 {
    let id = NEXT_ID.fetch_add(1, Ordering::SeqCst);
    let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "run_job", "arguments": arguments}});
    server.send(&request.to_string());
    id
}

/// Waits for the run's result, and for the cluster to be clean after it.
fn receive_run(server: &mut StdioServer, id: u32) -> Value {
    loop {
        let message = server.recv_within(Duration::from_secs(180));
        if message["id"] == id {
            let result = &message["result"];
            assert_eq!(result["isError"], false, "{result}");
            let out = result["structuredContent"].clone();
            cluster::assert_nothing_left(out["run_id"].as_str().expect("run_id"));
            return out;
        }
    }
}

/// Runs in `workdir/subdir` (the clone's folder) when a clone is given.
fn run(server: &mut StdioServer, mut arguments: Value, subdir: &str) -> Value {
    if !subdir.is_empty() {
        arguments["workdir"] = json!("/work");
        arguments["clone"]["subdir"] = json!(subdir);
        let command = arguments["command"].as_array().unwrap().clone();
        let mut wrapped = vec![json!("sh"), json!("-c"), json!(format!("cd {subdir} && exec \"$@\"")), json!("sh")];
        wrapped.extend(command);
        arguments["command"] = json!(wrapped);
    }
    let id = send_run(server, arguments);
    receive_run(server, id)
}

/// The pod of the run cloning `url` (seen through the admin kubeconfig
/// while it runs) and its clone container's log.
fn pod_and_clone_log(url: &str) -> (Value, String) {
    let client = cluster::admin_client();
    let params =
        kube::ListParams { label_selector: Some("app.kubernetes.io/managed-by=mcp-k8s-ephemeral-job".into()), field_selector: None };
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let pods = client.list(kube::Resource::PODS, NAMESPACE, &params).expect("list pods");
        let ours = pods.items.into_iter().find(|pod| pod["spec"]["initContainers"].to_string().contains(url));
        if let Some(pod) = ours {
            let clone_done = pod["status"]["initContainerStatuses"]
                .as_array()
                .is_some_and(|statuses| statuses.iter().any(|s| s["name"] == "clone" && s["state"]["terminated"]["exitCode"] == 0));
            if clone_done {
                let name = pod["metadata"]["name"].as_str().unwrap();
                let log_params = kube::LogParams { container: Some("clone".into()), ..kube::LogParams::default() };
                let log = client.pod_logs(NAMESPACE, name, &log_params).expect("clone log");
                return (pod, String::from_utf8_lossy(&log).into_owned());
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!("no pod cloning {url} finished its clone within 120 s");
}

/// `stdout`/`stderr` as bytes, whether it came as text or as base64.
fn output_bytes(out: &Value, stream: &str) -> Vec<u8> {
    match out[format!("{stream}_b64")].as_str() {
        Some(encoded) => base64::engine::general_purpose::STANDARD.decode(encoded).unwrap(),
        None => out[stream].as_str().unwrap_or_default().as_bytes().to_vec(),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}-{}-{}-{nanos:x}", std::process::id(), COUNTER.fetch_add(1, Ordering::SeqCst))
}

/// `KEY=value` lines of the cluster's `env` file.
fn cluster_setting(key: &str) -> String {
    let text = std::fs::read_to_string(cluster::dir().join("env")).expect("the cluster's env file");
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} missing from the cluster's env file"))
        .to_string()
}

fn run_tool(program: &str, args: &[&str], dir: &Path) -> String {
    let output = Command::new(program).args(args).current_dir(dir).output().unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(output.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

// ---------------------------------------------------------------------------
// Helpers: cluster objects and the git server, removed on drop

/// A git server on the bridge address with one repository, `test.git`:
/// three commits on `main` (version.txt = one, two, three), tag `v1` on
/// the first.
struct GitServer {
    child: Child,
    dir: PathBuf,
    authority: String,
    token: String,
    ca_pem: String,
    first: String,
    middle: String,
    tip: String,
}

impl GitServer {
    fn start() -> GitServer {
        let dir = std::env::temp_dir().join(unique("opts-git"));
        std::fs::create_dir_all(dir.join("work")).unwrap();
        std::fs::create_dir_all(dir.join("root")).unwrap();
        let api_from_pods = cluster_setting("API_SERVER_FROM_PODS");
        let host = api_from_pods.trim_start_matches("https://").split(':').next().unwrap().to_string();
        make_certificates(&dir, &host);
        let work = dir.join("work");
        let git = |args: &[&str]| run_tool("git", args, &work);
        git(&["init", "--quiet", "--initial-branch=main"]);
        let mut shas = Vec::new();
        for version in ["one", "two", "three"] {
            std::fs::write(work.join("version.txt"), format!("{version}\n")).unwrap();
            git(&["add", "version.txt"]);
            git(&["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "--quiet", "-m", version]);
            shas.push(git(&["rev-parse", "HEAD"]));
        }
        git(&["tag", "v1", &shas[0]]);
        run_tool("git", &["clone", "--quiet", "--bare", work.to_str().unwrap(), "test.git"], &dir.join("root"));
        run_tool("git", &["config", "uploadpack.allowAnySHA1InWant", "true"], &dir.join("root/test.git"));
        let token = unique("token");
        std::fs::write(dir.join("token"), &token).unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/git_server.py");
        let path = |name: &str| dir.join(name).display().to_string();
        let mut child = Command::new("python3")
            .args([
                script,
                "--bind",
                &host,
                "--root",
                &path("root"),
                "--token-file",
                &path("token"),
                "--cert",
                &path("cert.pem"),
                "--key",
                &path("key.pem"),
            ])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("server.log")).expect("the git server's log file"))
            .spawn()
            .expect("python3 starts the git server");
        let mut first_line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first_line).unwrap();
        let port = first_line.trim().strip_prefix("listening ").unwrap_or_else(|| panic!("git server said `{first_line}`")).to_string();
        let ca_pem = std::fs::read_to_string(dir.join("ca.pem")).unwrap();
        let [first, middle, tip] = <[String; 3]>::try_from(shas).unwrap();
        GitServer { child, dir, authority: format!("{host}:{port}"), token, ca_pem, first, middle, tip }
    }

    fn url(&self) -> String {
        format!("https://{}/test.git", self.authority)
    }

    /// What the server logged (a line per request, handshake errors), for
    /// the message of a failed assertion.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// The rule of `runner::clone`: `host_port`.
    fn secret_key(&self) -> String {
        self.authority.replace(':', "_")
    }

    /// The token as text and as it would appear in a Basic header.
    fn token_forms(&self) -> Vec<String> {
        let header = base64::engine::general_purpose::STANDARD.encode(format!("oauth2:{}", self.token));
        vec![self.token.clone(), header]
    }
}

impl Drop for GitServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CA and a server certificate for `ip`, made with the openssl command.
fn make_certificates(dir: &Path, ip: &str) {
    let openssl = |args: &[&str]| run_tool("openssl", args, dir);
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(
        &[&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=mcp-k8s test git CA"]].concat(),
    );
    openssl(&[&["req"][..], &ec, &["-keyout", "key.pem", "-out", "server.csr", "-subj", "/CN=test git server"]].concat());
    std::fs::write(dir.join("san.cnf"), format!("subjectAltName=IP:{ip}\n")).unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "cert.pem",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
    ]);
}

/// A clone Secret in the test namespace: `tokens` by key, plus `_ca.crt`.
struct CloneSecret {
    name: String,
}

impl CloneSecret {
    fn create(tokens: &[(&str, &str)], ca_pem: &str) -> CloneSecret {
        let name = unique("opts-git");
        let mut data = serde_json::Map::new();
        for (key, token) in tokens {
            data.insert(key.to_string(), json!(token));
        }
        if !ca_pem.is_empty() {
            data.insert("_ca.crt".into(), json!(ca_pem));
        }
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data});
        cluster::admin_client().create(kube::Resource::SECRETS, NAMESPACE, &secret).expect("create the clone Secret");
        CloneSecret { name }
    }
}

impl Drop for CloneSecret {
    fn drop(&mut self) {
        let _ = cluster::admin_client().delete(kube::Resource::SECRETS, NAMESPACE, &self.name);
    }
}

const PERSISTENT_VOLUMES: kube::Resource = kube::Resource { api_path: "/api/v1", plural: "persistentvolumes", namespaced: false };

/// A hostPath PersistentVolume (no provisioner needed on one node) and a
/// claim bound to it, on a directory UID 65532 can write.
struct CacheVolume {
    volume: String,
    claim: String,
    dir: PathBuf,
}

impl CacheVolume {
    fn create() -> CacheVolume {
        let volume = unique("opts-cache");
        let claim = volume.clone();
        let dir = std::env::temp_dir().join(&volume);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65532), Some(65532)).expect("chown the cache directory (the tests run as root)");
        let client = cluster::admin_client();
        let pv = json!({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": dir.display().to_string(), "type": "Directory"},
                "claimRef": {"namespace": NAMESPACE, "name": claim},
            },
        });
        client.create(PERSISTENT_VOLUMES, "", &pv).expect("create the PersistentVolume");
        let pvc = json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume, "resources": {"requests": {"storage": "64Mi"}}},
        });
        client.create(kube::Resource::PERSISTENT_VOLUME_CLAIMS, NAMESPACE, &pvc).expect("create the claim");
        // A pod on an unbound claim is unschedulable; under load the binder
        // can take seconds, so the test waits for it rather than race it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let claim_object = client.get(kube::Resource::PERSISTENT_VOLUME_CLAIMS, NAMESPACE, &claim).expect("read the claim");
            if claim_object["status"]["phase"] == "Bound" {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the claim `{claim}` was not bound within 60 s");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        CacheVolume { volume, claim, dir }
    }
}

impl Drop for CacheVolume {
    fn drop(&mut self) {
        let client = cluster::admin_client();
        let _ = client.delete(kube::Resource::PERSISTENT_VOLUME_CLAIMS, NAMESPACE, &self.claim);
        let _ = client.delete(PERSISTENT_VOLUMES, "", &self.volume);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A namespace of its own with a ServiceAccount whose Role is
/// `backend::kubernetes::permissions::REQUIRED` and `SANDBOXES` minus one verb, and a kubeconfig with a
/// token for it: the shared namespace's Role stays untouched.
struct DoctorNamespace {
    name: String,
    kubeconfig: PathBuf,
}

impl DoctorNamespace {
    fn create(resource_without_verb: &str, missing_verb: &str) -> DoctorNamespace {
        let name = unique("opts-doctor");
        let client = cluster::admin_client();
        let namespaces = kube::Resource::NAMESPACES;
        client.create(namespaces, "", &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})).expect("namespace");
        // The kustomize base's grants: REQUIRED and, sandboxes being on by
        // default, SANDBOXES (deploy/sandboxes.yaml).
        let rules: Vec<Value> = REQUIRED
            .iter()
            .chain(SANDBOXES)
            .map(|permission| {
                let resource = permission.role_resource();
                let verbs: Vec<&str> =
                    permission.verbs.iter().copied().filter(|verb| !(resource == resource_without_verb && *verb == missing_verb)).collect();
                json!({"apiGroups": [permission.group], "resources": [resource], "verbs": verbs})
            })
            .collect();
        let rbac = |plural: &'static str| kube::Resource { api_path: "/apis/rbac.authorization.k8s.io/v1", plural, namespaced: true };
        let service_accounts = kube::Resource { api_path: "/api/v1", plural: "serviceaccounts", namespaced: true };
        client
            .create(service_accounts, &name, &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "doctor"}}))
            .expect("sa");
        client
            .create(
                rbac("roles"),
                &name,
                &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "doctor"}, "rules": rules}),
            )
            .expect("role");
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "doctor"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "doctor"},
            "subjects": [{"kind": "ServiceAccount", "name": "doctor", "namespace": name}],
        });
        client.create(rbac("rolebindings"), &name, &binding).expect("rolebinding");
        let token_request = kube::Resource { api_path: "/api/v1", plural: "serviceaccounts/doctor/token", namespaced: true };
        let answer = client
            .create(
                token_request,
                &name,
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}),
            )
            .expect("TokenRequest");
        let token = answer["status"]["token"].as_str().expect("a token").to_string();
        // The shared server kubeconfig with this token and namespace.
        let template = std::fs::read_to_string(cluster::server_kubeconfig()).unwrap();
        let kubeconfig_text: String = template
            .lines()
            .map(|line| {
                let trimmed = line.trim_start();
                let indent = &line[..line.len() - trimmed.len()];
                if trimmed.starts_with("token:") {
                    format!("{indent}token: {token}")
                } else if trimmed.starts_with("namespace:") {
                    format!("{indent}namespace: {name}")
                } else {
                    line.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let kubeconfig = std::env::temp_dir().join(format!("{name}.kubeconfig"));
        std::fs::write(&kubeconfig, kubeconfig_text + "\n").unwrap();
        DoctorNamespace { name, kubeconfig }
    }
}

impl Drop for DoctorNamespace {
    fn drop(&mut self) {
        let _ = cluster::admin_client().delete(kube::Resource::NAMESPACES, "", &self.name);
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// `auto` resolved to Kubernetes at start (the test cluster's kubeconfig):
/// the agent reads of pods and the namespace, and is offered every mode.
#[test]
fn auto_resolved_to_kubernetes_speaks_of_pods() {
    let mut env = cluster::server_env();
    env.extend([
        ("MCP_K8S_BACKEND".to_string(), "auto".to_string()),
        ("MCP_K8S_NETWORK_MODES".to_string(), "none,restricted,open".to_string()),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let words = StdioServer::start(&env).backend_words();
    assert!(words["instructions"].as_str().unwrap_or_default().contains("throwaway Kubernetes pod."), "{words}");
    assert!(words["run_job_title"].as_str().unwrap_or_default().contains("Kubernetes pod"), "{words}");
    let all = json!(["none", "restricted", "open"]);
    assert_eq!((&words["network_enum"], &words["described_modes"]), (&all, &all), "{words}");
    assert_eq!(words["namespace"], NAMESPACE, "{words}");
}
