//! The Docker daemon restarts while runs are in progress (a sync run and a
//! background run, each on a server of its own): both must end with the
//! truth, that the daemon went away (never `succeeded`, never
//! `cancelled`), nothing of the sync run may be left and nothing may run
//! once the daemon is back, and another server reading the background
//! token later must read the same result.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::server::StdioServer;
use crate::{BUSYBOX, PrivateDaemon};
use mcp_k8s_ephemeral_job::docker;

const RUN_ID_LABEL: &str = "mcp-k8s-ephemeral-job/run-id";
const SCRIPT: &str = "echo up; sleep 120; echo never";

fn runner_binary() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/x86_64-unknown-linux-musl/release/mcp-k8s-ephemeral-job");
    assert!(path.is_file(), "{} is missing; build it with tests/build-project-image", path.display());
    path.display().to_string()
}

pub fn server(daemon: &PrivateDaemon) -> StdioServer {
    let (docker_host, runner) = (daemon.docker_host(), runner_binary());
    let mut server = StdioServer::start(&[
        ("MCP_K8S_BACKEND", "docker"),
        ("MCP_K8S_DOCKER_HOST", &docker_host),
        ("MCP_K8S_RUNNER_BINARY", &runner),
        ("MCP_K8S_ALLOWED_IMAGES", BUSYBOX),
        ("MCP_K8S_DEFAULT_CPU", "500m"),
        ("MCP_K8S_DEFAULT_MEMORY", "64Mi"),
    ]);
    server.initialize();
    server
}

pub fn send_call(server: &mut StdioServer, id: u64, name: &str, arguments: Value) {
    let params = json!({"name": name, "arguments": arguments, "_meta": {"progressToken": "p"}});
    server.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string());
}

/// Reads messages until the answer to `id`; the progress messages seen
/// until then go to `progress`.
pub fn answer(server: &StdioServer, id: u64, within: Duration, mut progress: impl FnMut(&str) -> bool) -> Option<Value> {
    let deadline = Instant::now() + within;
    loop {
        let message = server.recv_within(deadline.saturating_duration_since(Instant::now()));
        if message["id"] == id {
            return Some(message["result"].clone());
        }
        if progress(message["params"]["message"].as_str().unwrap_or_default()) {
            return None;
        }
    }
}

pub fn call(server: &mut StdioServer, id: u64, name: &str, arguments: Value) -> Value {
    send_call(server, id, name, arguments);
    let result = answer(server, id, Duration::from_secs(180), |_| false).expect("an answer");
    assert_eq!(result["isError"], false, "{name}: {result}");
    result["structuredContent"].clone()
}

fn containers_of(client: &docker::Client, run_id: &str) -> Vec<docker::objects::ContainerSummary> {
    client.container_list(&docker::Filters { labels: vec![format!("{RUN_ID_LABEL}={run_id}")] }).expect("list")
}

/// An end that says the daemon went away, and nothing else.
fn assert_daemon_named(outcome: &Value) {
    let status = outcome["status"].as_str().unwrap_or_default();
    assert!(status != "succeeded" && status != "cancelled", "the restart is neither a success nor a cancel: {outcome}");
    let message = outcome["message"].as_str().unwrap_or_default().to_lowercase();
    assert!(message.contains("docker daemon"), "the message names the daemon: {outcome}");
    assert!(outcome["stdout"].as_str().unwrap_or_default().contains("up"), "the output so far is kept: {outcome}");
}

#[test]
fn a_daemon_restart_mid_run_is_reported_as_such_and_leaves_nothing_running() {
    let daemon = PrivateDaemon::start("restart");
    let mut sync_server = server(&daemon);
    send_call(&mut sync_server, 1, "run_job", json!({"image": BUSYBOX, "command": ["sh", "-c", SCRIPT], "timeout_s": 150}));
    let early = answer(&sync_server, 1, Duration::from_secs(60), |text| text.contains("up"));
    assert!(early.is_none(), "the sync run ended before the restart: {early:?}");

    let mut background_server = server(&daemon);
    let submitted =
        call(&mut background_server, 2, "submit_job", json!({"image": BUSYBOX, "command": ["sh", "-c", SCRIPT], "timeout_s": 150}));
    let token = submitted["job_token"].as_str().expect("a job token").to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next_id = 10;
    loop {
        next_id += 1;
        let view = call(&mut background_server, next_id, "fetch_job", json!({"job_token": token, "wait_s": 2}));
        if view["stdout"].as_str().unwrap_or_default().contains("up") {
            break;
        }
        assert!(Instant::now() < deadline, "the background run did not start: {view}");
    }

    daemon.restart(Duration::from_secs(2));

    let sync = answer(&sync_server, 1, Duration::from_secs(180), |_| false).expect("the sync run's answer");
    let sync = &sync["structuredContent"];
    eprintln!("sync run after the restart: {sync}");
    assert_daemon_named(sync);

    let done = loop {
        next_id += 1;
        let view = call(&mut background_server, next_id, "fetch_job", json!({"job_token": token, "wait_s": 20}));
        if view["status"] == "done" {
            break view;
        }
        assert!(Instant::now() < deadline + Duration::from_secs(180), "the background run did not end: {view}");
    };
    let background = &done["result"];
    eprintln!("background run after the restart: {background}");
    assert_daemon_named(background);

    // Another server, started after the restart, reads the same result.
    let mut other = server(&daemon);
    let again = call(&mut other, 100, "fetch_job", json!({"job_token": token, "wait_s": 5}));
    for field in ["status", "reason", "message", "exit_code"] {
        assert_eq!(again["result"][field], background[field], "{field}: {again} vs {done}");
    }

    let client = daemon.client();
    let sync_run_id = sync["run_id"].as_str().expect("run_id");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !containers_of(&client, sync_run_id).is_empty() {
        assert!(Instant::now() < deadline, "the sync run's containers are left: {:?}", containers_of(&client, sync_run_id));
        std::thread::sleep(Duration::from_millis(100));
    }
    let running = client.container_list(&docker::Filters::default()).expect("list");
    let running: Vec<_> = running.iter().filter(|container| container.state == "running").collect();
    assert!(running.is_empty(), "containers run after the restart: {running:?}");
}
