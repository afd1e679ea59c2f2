//! Warm pools on the real test cluster, through the built binary
//! over stdio: a run that fits a pool takes a pod that was already running
//! (seen in `describe_environment`'s hit count, never in a timing) and keeps
//! the run contract (exit code, streams apart, live output, files in and
//! out, env, timeout with partial output, background runs, cancel); a run
//! that does not fit runs cold; the pool leaves nothing behind when its
//! server stops, nor, within its bounded age, after a SIGKILL.
//!
//! Each test has a pool of its own name, so it counts and lists only its
//! own sandboxes while the rest of the tier runs beside it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::support::TempDir;
use crate::support::cluster::{self, BUSYBOX, NAMESPACE};
use crate::support::server::{self, StdioServer};
use mcp_k8s_ephemeral_job::kube;

static NEXT_ID: AtomicU64 = AtomicU64::new(7000);

/// A server with one pool of `size` busybox sandboxes (network `open`, the
/// default mode, no limits), and the folder holding its pools file.
struct Warm {
    server: StdioServer,
    pool: String,
    _dir: TempDir,
}

impl Warm {
    fn start(size: u32, extra: &[(&str, &str)]) -> Warm {
        let dir = TempDir::new("warm-pool");
        // A DNS label of at most 32 characters, unique to this test.
        let pool = format!("t{}", cluster::unique_name("w").replace('-', ""));
        let file = dir.path.join("pools.json");
        let pools = json!([{"name": pool, "image": BUSYBOX, "network": "open", "size": size, "max_idle_s": 120}]);
        std::fs::write(&file, pools.to_string()).expect("the pools file is written");
        let file_text = file.display().to_string();
        let mut env: Vec<(&str, &str)> = vec![("MCP_K8S_WARM_POOLS", file_text.as_str()), ("MCP_K8S_NETWORK_DEFAULT", "open")];
        env.extend_from_slice(extra);
        let mut server = cluster::server(&env);
        // A failing test still drains its pool when the server is dropped.
        server.stop_gently = true;
        Warm { server, pool, _dir: dir }
    }

    fn call(&mut self, name: &str, arguments: Value) -> (Value, Vec<String>) {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let params = json!({"name": name, "arguments": arguments, "_meta": {"progressToken": format!("w{id}")}});
        self.server.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string());
        let mut progress = Vec::new();
        loop {
            let message = self.server.recv_within(Duration::from_secs(180));
            if message["id"] == id {
                return (message["result"].clone(), progress);
            }
            if message["method"] == "notifications/progress" {
                progress.push(message["params"]["message"].as_str().unwrap_or_default().to_string());
            }
        }
    }

    fn ok(&mut self, name: &str, arguments: Value) -> Value {
        let (result, _) = self.call(name, arguments);
        assert_eq!(result["isError"], false, "{name}: {result}");
        result["structuredContent"].clone()
    }

    /// This test's pool as `describe_environment` shows it.
    fn pool_view(&mut self) -> Value {
        let described = self.ok("describe_environment", json!({}));
        let pools = described["warm_pools"].as_array().cloned().unwrap_or_default();
        let pool = pools.into_iter().find(|pool| pool["name"] == self.pool.as_str());
        pool.unwrap_or_else(|| panic!("pool {} is not in describe_environment: {described}", self.pool))
    }

    /// Waits until the pool has `ready` sandboxes ready.
    fn await_ready(&mut self, ready: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(150);
        loop {
            let view = self.pool_view();
            if view["ready"].as_u64() >= Some(ready) {
                return view;
            }
            assert!(Instant::now() < deadline, "the pool never had {ready} ready: {view}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn hits(&mut self) -> u64 {
        self.pool_view()["hits"].as_u64().unwrap_or_default()
    }

    /// `run_job` on a ready pool sandbox: waits for one, and checks the
    /// run took it and left nothing behind.
    fn run_warm(&mut self, arguments: Value) -> (Value, Vec<String>) {
        let before = self.await_ready(1)["hits"].as_u64().unwrap_or_default();
        let (result, progress) = self.call("run_job", arguments);
        assert_eq!(result["isError"], false, "{result}");
        let out = result["structuredContent"].clone();
        assert_eq!(self.hits(), before + 1, "the run did not take a warm pod: {out}");
        assert_eq!(out["timings"]["warm"], true, "the result says so: {out}");
        cluster::assert_nothing_left(out["run_id"].as_str().unwrap_or_default());
        (out, progress)
    }

    /// Closes stdin and waits for the server to stop (it drains its pools).
    fn stop(mut self) -> String {
        self.server.close_stdin();
        let status = server::wait_exit(&mut self.server.child, Duration::from_secs(60));
        assert!(status.is_some_and(|status| status.success()), "the server did not stop cleanly: {status:?}");
        self.pool.clone()
    }
}

/// The names of the pool's Jobs, pods and Secrets that exist now.
fn pool_objects(pool: &str) -> Vec<String> {
    let client = cluster::admin_client();
    let params = kube::ListParams { label_selector: Some(format!("mcp-k8s-ephemeral-job/pool={pool}")), field_selector: None };
    let mut found = Vec::new();
    for resource in [kube::Resource::JOBS, kube::Resource::PODS] {
        let list = client.list(resource, NAMESPACE, &params).expect("list works with the admin kubeconfig");
        found.extend(list.items.iter().map(|item| format!("{} {}", resource.plural, item["metadata"]["name"])));
    }
    found
}

fn await_no_pool_objects(pool: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let left = pool_objects(pool);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "pool {pool} left objects behind after {within:?}: {left:?}");
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn sh(script: &str) -> Value {
    json!(["sh", "-c", script])
}

#[test]
fn a_warm_run_keeps_the_run_contract() {
    let mut warm = Warm::start(2, &[]);

    let (out, progress) = warm.run_warm(json!({"image": BUSYBOX, "command": sh("echo to-stdout; echo to-stderr >&2; exit 3")}));
    assert_eq!((out["status"].as_str(), out["reason"].as_str(), out["exit_code"].as_i64()), (Some("failed"), Some("NonZeroExit"), Some(3)));
    assert_eq!((out["stdout"].as_str(), out["stderr"].as_str()), (Some("to-stdout\n"), Some("to-stderr\n")), "{out}");
    assert!(progress.iter().any(|line| line.contains("to-stdout")), "live output reaches progress: {progress:?}");
    assert!(out["timings"]["started_at"].is_string(), "{out}");

    let input = base64::engine::general_purpose::STANDARD.encode("from the caller\n");
    let (out, _) = warm.run_warm(json!({
        "image": BUSYBOX,
        "command": sh("cat in.txt; echo \"$GREETING\"; mkdir -p out; echo made > out/result.txt"),
        "files": [{"path": "in.txt", "content_b64": input}],
        "env": {"GREETING": "hello $HOME"},
        "artifacts": ["out/*"],
    }));
    assert_eq!(out["status"], "succeeded", "{out}");
    assert_eq!(out["stdout"], "from the caller\nhello $HOME\n", "files and env arrive as a cold run's: {out}");
    let artifacts = out["artifacts"].as_array().cloned().unwrap_or_default();
    let result = artifacts.iter().find(|artifact| artifact["path"] == "out/result.txt");
    let content = result.and_then(|artifact| artifact["content_b64"].as_str()).unwrap_or_else(|| panic!("no artifact: {out}"));
    assert_eq!(base64::engine::general_purpose::STANDARD.decode(content).unwrap(), b"made\n");

    let (out, _) = warm.run_warm(json!({"image": BUSYBOX, "command": sh("echo partial; sleep 30"), "timeout_s": 2}));
    assert_eq!(out["status"], "timeout", "{out}");
    assert_eq!(out["stdout"], "partial\n", "output so far is kept: {out}");

    // A run that does not fit the pool (a memory limit) runs cold.
    let hits = warm.hits();
    let out = warm.ok("run_job", json!({"image": BUSYBOX, "command": ["true"], "limits": {"memory": "96Mi"}}));
    assert_eq!(out["status"], "succeeded", "{out}");
    assert_eq!(warm.hits(), hits, "a run with limits the pool lacks must not take its pod");
    cluster::assert_nothing_left(out["run_id"].as_str().unwrap_or_default());

    let pool = warm.stop();
    await_no_pool_objects(&pool, Duration::from_secs(60));
}

/// An idle pool pod's runner port takes the hand-off from the API server
/// (its node, which Kubernetes always admits, or kube-system's proxies),
/// and from no pod of the jobs: an `open` job that tries it is refused,
/// and the pool's next warm run still works.
#[test]
fn a_job_cannot_reach_an_idle_pool_pods_runner_port() {
    let mut warm = Warm::start(2, &[]);
    warm.await_ready(2);
    let client = cluster::admin_client();
    let params = kube::ListParams { label_selector: Some(format!("mcp-k8s-ephemeral-job/pool={}", warm.pool)), field_selector: None };
    let pods = client.list(kube::Resource::PODS, NAMESPACE, &params).expect("list works with the admin kubeconfig");
    let address = pods.items.iter().find_map(|pod| pod["status"]["podIP"].as_str().map(str::to_string)).expect("an idle pod has an IP");
    let script = format!("nc -w 2 {address} 7777 </dev/null && echo reached || echo refused");
    let out = warm.ok("run_job", json!({"image": BUSYBOX, "command": sh(&script), "network": "open", "limits": {"memory": "96Mi"}}));
    assert_eq!(out["stdout"], "refused\n", "{out}");
    cluster::assert_nothing_left(out["run_id"].as_str().unwrap_or_default());

    let (out, _) = warm.run_warm(json!({"image": BUSYBOX, "command": sh("echo handed-off")}));
    assert_eq!(out["stdout"], "handed-off\n", "{out}");
    let pool = warm.stop();
    await_no_pool_objects(&pool, Duration::from_secs(60));
}

#[test]
fn a_background_run_on_a_warm_pod_is_fetched_listed_and_cancelled() {
    let mut warm = Warm::start(1, &[]);
    let before = warm.await_ready(1)["hits"].as_u64().unwrap_or_default();
    let submitted = warm.ok("submit_job", json!({"image": BUSYBOX, "command": sh("echo background-out; exit 4")}));
    let token = submitted["job_token"].as_str().unwrap_or_default().to_string();
    assert!(!token.is_empty(), "{submitted}");
    let mut tokens = vec![token.clone()];
    assert_eq!(warm.hits(), before + 1, "the background run took the warm pod");
    let listed = warm.ok("list_jobs", json!({}));
    assert!(listed.to_string().contains(&token), "list_jobs shows the warm run: {listed}");
    let fetched = warm.ok("fetch_job", json!({"job_token": token, "wait_s": 60}));
    let result = &fetched["result"];
    assert_eq!((result["status"].as_str(), result["exit_code"].as_i64()), (Some("failed"), Some(4)), "{fetched}");
    assert_eq!(result["stdout"], "background-out\n", "{fetched}");
    // From the Job's record, as any process reads it: warm, and submitted
    // at its token's time.
    assert_eq!(result["timings"]["warm"], true, "{fetched}");
    assert!(result["timings"]["submitted_at"].is_string(), "{fetched}");

    let before = warm.await_ready(1)["hits"].as_u64().unwrap_or_default();
    let submitted = warm.ok("submit_job", json!({"image": BUSYBOX, "command": sh("echo started; sleep 120")}));
    let token = submitted["job_token"].as_str().unwrap_or_default().to_string();
    tokens.push(token.clone());
    assert_eq!(warm.hits(), before + 1);
    warm.ok("cancel_job", json!({"job_token": token}));
    let fetched = warm.ok("fetch_job", json!({"job_token": token, "wait_s": 60}));
    assert_eq!((fetched["status"].as_str(), fetched["result"]["status"].as_str()), (Some("done"), Some("cancelled")), "{fetched}");

    let pool = warm.stop();
    // The two runs' Jobs are theirs now, kept for their result retention
    // like any background run's: removed here as the reaper would later.
    let client = cluster::admin_client();
    for token in &tokens {
        let run_id = token.trim_start_matches("job-").split('-').next().unwrap_or_default();
        let _ = client.delete(kube::Resource::JOBS, NAMESPACE, &format!("mcpk8s-{run_id}"));
    }
    await_no_pool_objects(&pool, Duration::from_secs(90));
}

/// After a SIGKILL nobody drains the pool: each sandbox's runner stops
/// waiting on its own (the start timeout + `max_idle_s` + a minute) and its
/// Job, unclaimed, is deleted as soon as it ends.
#[test]
fn a_sigkilled_servers_pool_is_gone_within_its_bounded_age() {
    let mut warm = Warm::start(1, &[("MCP_K8S_START_TIMEOUT_S", "10")]);
    warm.await_ready(1);
    let pool = warm.pool.clone();
    assert!(!pool_objects(&pool).is_empty(), "the pool has its sandbox");
    server::send_signal(&warm.server.child, libc::SIGKILL);
    let _ = server::wait_exit(&mut warm.server.child, Duration::from_secs(10));
    // The bound: 10 s + 120 s + 60 s of waiting, then the end and the
    // deletion; the start counts from the container's start, a few
    // seconds before the pool saw it ready.
    await_no_pool_objects(&pool, Duration::from_secs(10 + 120 + 60 + 60));
}
