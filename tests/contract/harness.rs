//! The contract table's harness: a real server process over stdio on one
//! backend (`Kind`), tool calls through MCP, and the check that a run left
//! nothing behind. The cases (`cases.rs`) call only this, so the same case
//! text runs on every backend.
//!
//! What differs per backend lives here and nowhere else: the server's
//! settings, how to see a run's leftovers (Kubernetes: Jobs, pods and
//! Secrets labelled with the run id; Docker: containers and volumes whose
//! name or labels carry the run id) and how to remove a background run's
//! kept objects. Every check selects by the run ids of this process's own
//! runs, never by a broad label, so other tests on the same cluster or
//! daemon keep their objects.
//!
//! It knows no expected result: those are the table's.

// Each tier builds the harness for one backend; the other's half is unused
// there.
#![allow(dead_code)]

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::support::cluster;
use super::support::faults;
use super::support::server::StdioServer;

/// The backend a tier runs the table on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Kubernetes,
    /// Kubernetes with a warm pool for each image the table
    /// runs without limits: its runs that fit take a pod that was already
    /// running, and must keep the same promises.
    KubernetesWarm,
    Docker,
    /// Docker with a warm pool for each image the table runs without
    /// limits, as `KubernetesWarm`.
    DockerWarm,
}

impl Kind {
    /// The backend underneath: a warm kind is its backend's.
    pub fn backend(self) -> Kind {
        match self {
            Kind::Kubernetes | Kind::KubernetesWarm => Kind::Kubernetes,
            Kind::Docker | Kind::DockerWarm => Kind::Docker,
        }
    }
}

/// Images every backend has: the test cluster loads them into containerd,
/// `tests/docker/up` into the test dockerd, under the same names.
pub const BUSYBOX: &str = cluster::BUSYBOX;
pub const PYTHON: &str = cluster::PYTHON;
/// A reference no backend has and none can pull (nothing listens on
/// loopback port 5000).
pub const MISSING_IMAGE: &str = cluster::NONEXISTENT_IMAGE;

/// The socket `tests/docker/up` makes, used when `DOCKER_HOST` is unset (the
/// system's own Docker is never used by accident).
const TEST_DOCKER_HOST: &str = "unix:///var/lib/mcp-k8s-test-docker/docker.sock";
/// The static runner binary the Docker backend mounts into each container
/// (`tests/build-project-image` builds it).
const RUNNER_BINARY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/x86_64-unknown-linux-musl/release/mcp-k8s-ephemeral-job");
/// How long one message (a tool result, a progress notification) may take:
/// a run on a busy shared cluster can wait for its image and its node.
const MESSAGE_WAIT: Duration = Duration::from_secs(180);

static NEXT_ID: AtomicU64 = AtomicU64::new(1000);

/// A tool call's result and the progress messages that came before it.
pub struct Called {
    pub result: Value,
    pub progress: Vec<String>,
}

/// The server under test on one backend.
pub struct Server {
    pub kind: Kind,
    pub stdio: StdioServer,
    /// The warm server's pools file, kept while it runs.
    _pools: Option<super::support::TempDir>,
}

impl Server {
    /// A server on `kind` with `extra` settings on top, initialized.
    pub fn start(kind: Kind, extra: &[(&str, &str)]) -> Server {
        let (stdio, pools) = match kind {
            Kind::Kubernetes => (cluster::server(extra), None),
            Kind::KubernetesWarm => {
                let (stdio, pools) = start_warm(extra);
                (stdio, Some(pools))
            }
            Kind::Docker => (start_on_docker(extra), None),
            Kind::DockerWarm => {
                let (stdio, pools) = start_warm_on_docker(extra);
                (stdio, Some(pools))
            }
        };
        let mut server = Server { kind, stdio, _pools: pools };
        if kind != kind.backend() {
            server.await_pools_ready();
        }
        server
    }

    /// Until every pool has a ready pod, so the case's first run can be warm.
    fn await_pools_ready(&mut self) {
        let deadline = Instant::now() + MESSAGE_WAIT;
        loop {
            let described = self.ok("describe_environment", json!({}));
            let pools = described["warm_pools"].as_array().cloned().unwrap_or_default();
            if !pools.is_empty() && pools.iter().all(|pool| pool["ready"].as_u64() >= Some(1)) {
                return;
            }
            assert!(Instant::now() < deadline, "the warm pools never got ready: {described}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Sends a `tools/call` (with a progress token) and returns its id
    /// without waiting.
    pub fn send_call(&mut self, tool: &str, arguments: Value) -> u64 {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let params = json!({"name": tool, "arguments": arguments, "_meta": {"progressToken": format!("p{id}")}});
        self.stdio.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string());
        id
    }

    /// Progress messages until the response to `id`, then that response's
    /// result.
    pub fn answer(&self, id: u64) -> Called {
        let mut progress = Vec::new();
        loop {
            let message = self.stdio.recv_within(MESSAGE_WAIT);
            if message["id"] == id {
                return Called { result: message["result"].clone(), progress };
            }
            if message["method"] == "notifications/progress" {
                progress.push(message["params"]["message"].as_str().unwrap_or_default().to_string());
            }
        }
    }

    pub fn call(&mut self, tool: &str, arguments: Value) -> Called {
        let id = self.send_call(tool, arguments);
        self.answer(id)
    }

    /// Any other request; its whole response (`result` or `error`).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        self.stdio.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string());
        loop {
            let message = self.stdio.recv_within(MESSAGE_WAIT);
            if message["id"] == id {
                return message;
            }
        }
    }

    /// A tool call that must not be a tool error; its structured content.
    pub fn ok(&mut self, tool: &str, arguments: Value) -> Value {
        let called = self.call(tool, arguments);
        assert_eq!(called.result["isError"], false, "{tool} on {:?}: {}", self.kind, called.result);
        called.result["structuredContent"].clone()
    }

    /// `run_job` to its end; its structured result, after checking the run
    /// left nothing behind.
    pub fn run(&mut self, arguments: Value) -> Value {
        let out = self.ok("run_job", arguments);
        let run_id = out["run_id"].as_str().unwrap_or_else(|| panic!("no run_id in {out}"));
        assert_nothing_left(self.kind, run_id);
        out
    }

    /// `submit_job`; its token.
    pub fn submit(&mut self, arguments: Value) -> String {
        let submitted = self.ok("submit_job", arguments);
        assert_eq!(submitted["status"], "submitted", "{submitted}");
        submitted["job_token"].as_str().unwrap_or_else(|| panic!("no job_token in {submitted}")).to_string()
    }

    /// `fetch_job` until `done` (each poll waits up to 30 s).
    pub fn fetch_done(&mut self, token: &str) -> Value {
        let deadline = Instant::now() + MESSAGE_WAIT;
        loop {
            let view = self.ok("fetch_job", json!({"job_token": token, "wait_s": 30}));
            if view["status"] == "done" {
                return view;
            }
            assert!(Instant::now() < deadline, "{token} did not finish on {:?}: {view}", self.kind);
        }
    }

    /// Waits for progress of request `id` containing `text`; returns the
    /// run id named in the `created …` progress message (the backend's name
    /// for the sandbox carries it on both backends).
    pub fn wait_progress(&self, id: u64, text: &str) -> String {
        let mut run_id = None;
        loop {
            let message = self.stdio.recv_within(MESSAGE_WAIT);
            assert_ne!(message["id"], id, "request {id} ended before printing {text:?}: {message}");
            let line = message["params"]["message"].as_str().unwrap_or_default();
            if line.starts_with("created ") {
                run_id = run_id_in(line);
            }
            if line.contains(text) {
                return run_id.unwrap_or_else(|| panic!("no `created <name with the run id>` progress before {text:?}"));
            }
        }
    }
}

/// The network of the warm servers' pools: `open`, or the test run's own
/// default (Podman's `none`: the server refuses `open` there). A case that
/// asks for it is a warm hit on a warm server.
pub fn pools_network() -> String {
    super::support::server::network_default_override().map_or_else(|| "open".to_string(), |(_, mode)| mode)
}

/// The pools file of a warm server: a pool of one sandbox for busybox and
/// one for python (`pools_network`, no limits), in a folder of its own.
fn warm_pools_file() -> super::support::TempDir {
    let dir = super::support::TempDir::new("contract-pools");
    let tag = cluster::unique_name("c").replace('-', "");
    let network = pools_network();
    let pools = json!([
        {"name": format!("b{tag}"), "image": BUSYBOX, "network": network, "size": 1, "max_idle_s": 300},
        {"name": format!("p{tag}"), "image": PYTHON, "network": network, "size": 1, "max_idle_s": 300},
    ]);
    std::fs::write(dir.path.join("pools.json"), pools.to_string()).expect("the pools file is written");
    dir
}

/// A server on the test cluster with `warm_pools_file`'s pools, and the
/// folder of its pools file.
fn start_warm(extra: &[(&str, &str)]) -> (StdioServer, super::support::TempDir) {
    let dir = warm_pools_file();
    let file_text = dir.path.join("pools.json").display().to_string();
    let mut env = vec![("MCP_K8S_WARM_POOLS", file_text.as_str())];
    env.extend_from_slice(extra);
    let mut stdio = cluster::server(&env);
    // It stops through its stdin, so that it deletes its idle pool pods (a
    // kill would leave them to their bounded age, holding the namespace's
    // pod quota while the rest of the tier runs).
    stdio.stop_gently = true;
    (stdio, dir)
}

/// `start_warm` on the Docker backend. It stops through its stdin too, so
/// that it removes its idle pool containers.
fn start_warm_on_docker(extra: &[(&str, &str)]) -> (StdioServer, super::support::TempDir) {
    let dir = warm_pools_file();
    let file_text = dir.path.join("pools.json").display().to_string();
    let mut env = vec![("MCP_K8S_WARM_POOLS", file_text.as_str())];
    env.extend_from_slice(extra);
    let mut stdio = start_on_docker(&env);
    stdio.stop_gently = true;
    (stdio, dir)
}

/// A background run's token carries its run id (`job-<run id>-<seconds>`).
pub fn run_id_of_token(token: &str) -> String {
    faults::run_id_of(token)
}

/// The first 32-hex-digit word in `text`: a run id.
fn run_id_in(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    (0..bytes.len().saturating_sub(31))
        .find(|&start| bytes[start..start + 32].iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)))
        .map(|start| text[start..start + 32].to_string())
}

// ---------------------------------------------------------------------------
// Docker

fn docker_host() -> String {
    std::env::var("DOCKER_HOST").ok().filter(|host| !host.is_empty()).unwrap_or_else(|| TEST_DOCKER_HOST.to_string())
}

/// Starts the server with `MCP_K8S_BACKEND=docker` and fails loudly when
/// this build does not take that setting: it exits naming it, or it ignores
/// it and goes looking for Kubernetes credentials without a word of Docker.
fn start_on_docker(extra: &[(&str, &str)]) -> StdioServer {
    let host = docker_host();
    let allowed = format!("{BUSYBOX},{PYTHON},{MISSING_IMAGE}");
    let mut env = vec![
        ("MCP_K8S_BACKEND", "docker"),
        ("DOCKER_HOST", host.as_str()),
        ("MCP_K8S_RUNNER_BINARY", RUNNER_BINARY),
        ("MCP_K8S_ALLOWED_IMAGES", allowed.as_str()),
    ];
    env.extend_from_slice(extra);
    let network_default = crate::support::server::network_default_override();
    if let Some((name, mode)) = &network_default {
        env.push((name, mode.as_str()));
    }
    let mut server = StdioServer::start(&env);
    let log = start_log(&server);
    let said = log.join("\n");
    let exited = server.child.try_wait().ok().flatten().is_some();
    assert!(!exited, "the server did not start on Docker ({host}); it said:\n{said}");
    assert!(
        std::path::Path::new(RUNNER_BINARY).is_file(),
        "no runner binary at {RUNNER_BINARY}: build it with tests/build-project-image (or cargo build --release --target x86_64-unknown-linux-musl)"
    );
    server.initialize();
    server
}

/// The server's log lines up to `serving MCP on stdio` (or its exit): where
/// it says which backend it took and why.
fn start_log(server: &StdioServer) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut lines = Vec::new();
    while let Ok(line) = server.stderr.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        let serving = line.contains("serving MCP on stdio");
        lines.push(line);
        if serving {
            break;
        }
    }
    lines
}

/// The Docker CLI against the test daemon; its stdout.
fn docker(args: &[&str]) -> String {
    let output = Command::new("docker")
        .args(args)
        .env("DOCKER_HOST", docker_host())
        .output()
        .unwrap_or_else(|error| panic!("docker {args:?}: {error} (the Docker CLI comes with Debian's docker.io)"));
    assert!(output.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Containers and volumes whose name or labels carry `run_id`. Anonymous
/// volumes carry neither once their container is gone; the on_docker
/// tier's own tests check that the backend removes them with the container.
fn docker_leftovers(run_id: &str) -> Vec<String> {
    let containers = docker(&["ps", "--all", "--no-trunc", "--format", "container {{.ID}} {{.Names}} {{.Labels}} ({{.Status}})"]);
    let volumes = docker(&["volume", "ls", "--format", "volume {{.Name}} {{.Labels}}"]);
    containers.lines().chain(volumes.lines()).filter(|line| line.contains(run_id)).map(str::to_string).collect()
}

/// Removes what is listed, and lists again: a server still watching the
/// run may write its verdict while this removes (and takes it back when it
/// finds the run gone, which a single pass could miss).
fn docker_remove(run_id: &str) {
    for _ in 0..4 {
        let left = docker_leftovers(run_id);
        if left.is_empty() {
            return;
        }
        for line in left {
            let mut words = line.split_whitespace();
            match (words.next(), words.next()) {
                (Some("container"), Some(id)) => drop(docker(&["rm", "--force", "--volumes", id])),
                (Some("volume"), Some(name)) => drop(docker(&["volume", "rm", "--force", name])),
                _ => {}
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Both

/// Whether nothing of `run_id` is left on `kind` now.
pub fn nothing_left(kind: Kind, run_id: &str) -> bool {
    match kind {
        Kind::Kubernetes | Kind::KubernetesWarm => cluster::leftovers(run_id).is_empty(),
        Kind::Docker | Kind::DockerWarm => docker_leftovers(run_id).is_empty(),
    }
}

/// Waits until nothing of `run_id` is left on `kind` (a pod or a container
/// takes a moment to go).
pub fn assert_nothing_left(kind: Kind, run_id: &str) {
    match kind {
        Kind::Kubernetes | Kind::KubernetesWarm => cluster::assert_nothing_left(run_id),
        Kind::Docker | Kind::DockerWarm => {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let left = docker_leftovers(run_id);
                if left.is_empty() {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "run {run_id} left objects behind: {left:?}; the daemon said:\n{}",
                    daemon_said_of(&left)
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
}

/// The test dockerd's warnings and errors about the containers in
/// `leftovers` (`tests/docker/up` keeps its log beside its socket): why a
/// removal failed, when it did.
fn daemon_said_of(leftovers: &[String]) -> String {
    let ids: Vec<&str> = leftovers.iter().filter_map(|line| line.split_whitespace().nth(1)).collect();
    let log_path =
        docker_host().strip_prefix("unix://").and_then(|socket| Some(std::path::Path::new(socket).parent()?.join("dockerd.log")));
    let Some(log) = log_path.and_then(|path| std::fs::read_to_string(path).ok()) else {
        return "(no dockerd.log beside the socket)".to_string();
    };
    let said: Vec<&str> = log
        .lines()
        .filter(|line| !line.contains("level=info") && !line.contains("level=debug") && ids.iter().any(|id| line.contains(id)))
        .collect();
    said[said.len().saturating_sub(20)..].join("\n")
}

/// Removes the objects a background run keeps for its result retention
/// when dropped, then checks nothing of them is left.
pub struct Cleanup {
    pub kind: Kind,
    pub run_ids: Vec<String>,
}

impl Cleanup {
    /// For the background runs of these tokens.
    pub fn tokens(kind: Kind, tokens: &[&str]) -> Cleanup {
        Cleanup { kind, run_ids: tokens.iter().map(|token| run_id_of_token(token)).collect() }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        match self.kind {
            // faults::Cleanup deletes the Jobs and Secrets and, unless the
            // test is failing already, waits until nothing is left.
            Kind::Kubernetes | Kind::KubernetesWarm => drop(faults::Cleanup(std::mem::take(&mut self.run_ids))),
            Kind::Docker | Kind::DockerWarm => {
                for run_id in &self.run_ids {
                    docker_remove(run_id);
                }
                if !std::thread::panicking() {
                    for run_id in &self.run_ids {
                        assert_nothing_left(Kind::Docker, run_id);
                    }
                }
            }
        }
    }
}
