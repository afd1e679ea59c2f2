//! Helpers of the real-cluster fault suites (`on_cluster::cluster_faults`,
//! `on_cluster::cluster_outage`, `on_cluster_alone::cluster_node_faults`):
//! MCP calls to a server over stdio, a
//! request left in flight while the test breaks something, the pods of a
//! run, and cleanup of background Jobs (kept for the retention by design).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mcp_k8s_ephemeral_job::kube;
use serde_json::{Value, json};

use super::cluster::{self, NAMESPACE};
use super::server::StdioServer;

static NEXT_ID: AtomicU64 = AtomicU64::new(100);

/// Sends a `tools/call` and returns its id without waiting.
pub fn send_call(server: &mut StdioServer, name: &str, arguments: Value) -> u64 {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let params = json!({"name": name, "arguments": arguments});
    server.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string());
    id
}

/// Waits for the response to `id` (notifications in between are skipped).
pub fn response(server: &StdioServer, id: u64, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no response to request {id} within {within:?}");
        let message = server.recv_within(left);
        if message["id"] == id {
            return message["result"].clone();
        }
    }
}

/// A tool call that must not be a tool error; its structured content.
pub fn ok(server: &mut StdioServer, name: &str, arguments: Value) -> Value {
    let id = send_call(server, name, arguments);
    let result = response(server, id, Duration::from_secs(240));
    assert_eq!(result["isError"], false, "{name}: {result}");
    result["structuredContent"].clone()
}

pub fn submit(server: &mut StdioServer, arguments: Value) -> String {
    let submitted = ok(server, "submit_job", arguments);
    submitted["job_token"].as_str().expect("a job_token").to_string()
}

pub fn fetch(server: &mut StdioServer, token: &str, wait_s: u64) -> Value {
    ok(server, "fetch_job", json!({"job_token": token, "wait_s": wait_s}))
}

/// Fetches until done; `fetch_job` errors (API unreachable) are retried.
pub fn fetch_done(server: &mut StdioServer, token: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let id = send_call(server, "fetch_job", json!({"job_token": token, "wait_s": 20}));
        let result = response(server, id, Duration::from_secs(60));
        if result["isError"] == false && result["structuredContent"]["status"] == "done" {
            return result["structuredContent"].clone();
        }
        assert!(Instant::now() < deadline, "{token} not done within {within:?}: {result}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The run id inside a job token (`job-<run_id>-<seconds>`).
pub fn run_id_of(token: &str) -> String {
    token[4..36].to_string()
}

pub fn job_name(run_id: &str) -> String {
    format!("mcpk8s-{run_id}")
}

/// Deletes the background Jobs (and any Secret) of these runs when
/// dropped, then checks nothing of them is left.
pub struct Cleanup(pub Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let client = cluster::admin_client();
        for run_id in &self.0 {
            let _ = client.delete(kube::Resource::JOBS, NAMESPACE, &job_name(run_id));
            let _ = client.delete(kube::Resource::SECRETS, NAMESPACE, &job_name(run_id));
        }
        if !std::thread::panicking() {
            for run_id in &self.0 {
                cluster::assert_nothing_left(run_id);
            }
        }
    }
}

/// The run's pods, by its label.
pub fn pods_of(run_id: &str) -> Vec<Value> {
    let params = kube::ListParams { label_selector: Some(format!("mcp-k8s-ephemeral-job/run-id={run_id}")), field_selector: None };
    cluster::admin_client().list(kube::Resource::PODS, NAMESPACE, &params).expect("list pods").items
}

/// Waits for the pod whose command mentions `marker` to run its main
/// container; returns (run id, pod name).
pub fn wait_running_with_marker(marker: &str, within: Duration) -> (String, String) {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = running_with_marker(marker) {
            return found;
        }
        assert!(Instant::now() < deadline, "no running pod with `{marker}` within {within:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The pod whose command mentions `marker`, once its main container runs:
/// (run id, pod name).
pub fn running_with_marker(marker: &str) -> Option<(String, String)> {
    let params =
        kube::ListParams { label_selector: Some("app.kubernetes.io/managed-by=mcp-k8s-ephemeral-job".into()), field_selector: None };
    let pods = cluster::admin_client().list(kube::Resource::PODS, NAMESPACE, &params).expect("list pods").items;
    let pod = pods.iter().find(|pod| pod["spec"]["containers"].to_string().contains(marker))?;
    let running = pod["status"]["containerStatuses"]
        .as_array()
        .is_some_and(|statuses| statuses.iter().any(|status| status["name"] == "main" && status["state"]["running"].is_object()));
    let run_id = pod["metadata"]["labels"]["mcp-k8s-ephemeral-job/run-id"].as_str().unwrap_or_default().to_string();
    let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
    running.then_some((run_id, name))
}

/// A marker no other run on the cluster uses.
pub fn marker(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}
