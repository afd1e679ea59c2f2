//! The Docker backend end to end: the built server over stdio with
//! `MCP_K8S_BACKEND=docker` against the test daemon, running the static
//! runner binary (`tests/build-project-image` builds it) inside the test
//! images. Each test checks afterwards that no container of its runs is
//! left (background runs are removed by a guard, as the reaper would after
//! their retention).

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::support::server::StdioServer;
use crate::{BUSYBOX, client, socket};
use mcp_k8s_ephemeral_job::docker;

pub const PYTHON: &str = "mcp-k8s-test.local/python:3.11";
/// Allowed, and never loaded into the test daemon.
const MISSING_IMAGE: &str = "mcp-k8s-test.local/does-not-exist:1";
const RUN_ID_LABEL: &str = "mcp-k8s-ephemeral-job/run-id";

/// The static runner the containers run.
pub fn runner_binary() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/x86_64-unknown-linux-musl/release/mcp-k8s-ephemeral-job");
    assert!(path.is_file(), "{} is missing; build it with tests/build-project-image", path.display());
    path.display().to_string()
}

/// The settings of a server on the Docker backend, `extra` on top.
pub fn server_env(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let docker_host = format!("unix://{}", socket().display());
    let runner = runner_binary();
    let images = format!("{BUSYBOX},{PYTHON},{MISSING_IMAGE}");
    let mut env: Vec<(&str, &str)> = vec![
        ("MCP_K8S_BACKEND", "docker"),
        ("MCP_K8S_DOCKER_HOST", &docker_host),
        ("MCP_K8S_RUNNER_BINARY", &runner),
        ("MCP_K8S_ALLOWED_IMAGES", &images),
        ("MCP_K8S_DEFAULT_CPU", "500m"),
        ("MCP_K8S_DEFAULT_MEMORY", "64Mi"),
    ];
    env.extend_from_slice(extra);
    let network_default = crate::support::server::network_default_override();
    if let Some((name, mode)) = &network_default {
        env.push((name, mode.as_str()));
    }
    env.into_iter().map(|(name, value)| (name.to_string(), value.to_string())).collect()
}

/// A server on the Docker backend, with `extra` settings on top, initialized.
pub fn server(extra: &[(&str, &str)]) -> StdioServer {
    let env = server_env(extra);
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let mut server = StdioServer::start(&env);
    server.initialize();
    server
}

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(100);

/// A tool call; returns (the tools/call result, progress messages).
pub fn call(server: &mut StdioServer, name: &str, arguments: Value) -> (Value, Vec<String>) {
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let params = json!({"name": name, "arguments": arguments, "_meta": {"progressToken": "p"}});
    server.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string());
    let mut progress = Vec::new();
    loop {
        let message = server.recv_within(Duration::from_secs(120));
        if message["id"] == id {
            return (message["result"].clone(), progress);
        }
        if message["method"] == "notifications/progress" {
            progress.push(message["params"]["message"].as_str().unwrap_or_default().to_string());
        }
    }
}

/// A tool call that must succeed; its structured content.
pub fn ok(server: &mut StdioServer, name: &str, arguments: Value) -> Value {
    let (result, _) = call(server, name, arguments);
    assert_eq!(result["isError"], false, "{name}: {result}");
    result["structuredContent"].clone()
}

/// `run_job`, then nothing of the run may be left.
pub fn run(server: &mut StdioServer, arguments: Value) -> Value {
    let out = ok(server, "run_job", arguments);
    assert_nothing_left(out["run_id"].as_str().expect("run_id"));
    out
}

/// The containers of `run_id` (any role).
fn containers_of(client: &docker::Client, run_id: &str) -> Vec<docker::objects::ContainerSummary> {
    client.container_list(&docker::Filters { labels: vec![format!("{RUN_ID_LABEL}={run_id}")] }).expect("list")
}

/// Waits until no container (and so no anonymous volume) of `run_id` is left.
pub fn assert_nothing_left(run_id: &str) {
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = containers_of(&client, run_id);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "containers of {run_id} left: {:?}", left.iter().map(|c| &c.names).collect::<Vec<_>>());
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn run_id_of(token: &str) -> &str {
    &token[4..36]
}

/// Background runs are kept for their retention; tests remove theirs.
pub struct Removed(pub Vec<String>);

impl Drop for Removed {
    fn drop(&mut self) {
        let client = client();
        for token in &self.0 {
            for container in containers_of(&client, run_id_of(token)) {
                let _ = client.container_remove(&container.id);
            }
            assert_nothing_left(run_id_of(token));
        }
    }
}

fn submit(server: &mut StdioServer, command: &str) -> String {
    let submitted = ok(server, "submit_job", json!({"image": BUSYBOX, "command": ["sh", "-c", command]}));
    assert_eq!(submitted["status"], "submitted", "{submitted}");
    submitted["job_token"].as_str().unwrap().to_string()
}

pub fn fetch(server: &mut StdioServer, token: &str, wait_s: u64) -> Value {
    ok(server, "fetch_job", json!({"job_token": token, "wait_s": wait_s}))
}

pub fn fetch_done(server: &mut StdioServer, token: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let view = fetch(server, token, 20);
        if view["status"] == "done" {
            return view;
        }
        assert!(Instant::now() < deadline, "{token} did not finish: {view}");
    }
}

/// Waits until the run's container runs and has said `marker`.
pub fn wait_for_output(server: &mut StdioServer, token: &str, marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !fetch(server, token, 2)["stdout"].as_str().unwrap_or_default().contains(marker) {
        assert!(Instant::now() < deadline, "no `{marker}` from {token}");
    }
}

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn exit_code_and_separate_streams() {
    let mut server = server(&[]);
    let (result, progress) =
        call(&mut server, "run_job", json!({"image": BUSYBOX, "command": ["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"]}));
    let out = &result["structuredContent"];
    assert_eq!(
        (out["status"].as_str(), out["reason"].as_str(), out["exit_code"].as_i64()),
        (Some("failed"), Some("NonZeroExit"), Some(3)),
        "{out}"
    );
    assert_eq!(out["stdout"], "to-stdout\n");
    assert_eq!(out["stderr"], "to-stderr\n");
    assert!(progress.iter().any(|p| p.contains("to-stdout")), "live output reaches progress: {progress:?}");
    assert_nothing_left(out["run_id"].as_str().unwrap());
}

#[test]
fn input_files_env_and_workdir_and_the_hardening_inside() {
    let mut server = server(&[]);
    let script = "cat data/in.txt; echo \"$GREETING from $(pwd) as $(id -u)\"; echo made > out.txt; \
                  touch /root-file 2>/dev/null || echo root-read-only; grep -c . /proc/self/status >/dev/null; \
                  grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status; grep Seccomp: /proc/self/status; \
                  ls /sys/class/net";
    let out = run(
        &mut server,
        json!({
            "image": BUSYBOX,
            "command": ["sh", "-c", script],
            "files": [{"path": "data/in.txt", "content_b64": b64(b"input\n")}],
            "env": {"GREETING": "hello"},
            "workdir": "/home/job/src",
            "network": "none",
        }),
    );
    assert_eq!(out["status"], "succeeded", "{out}");
    let stdout = out["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("input\nhello from /home/job/src as 65532\nroot-read-only\n"), "{stdout}");
    assert!(stdout.contains("CapEff:\t0000000000000000"), "{stdout}");
    assert!(stdout.contains("NoNewPrivs:\t1"), "{stdout}");
    assert!(stdout.contains("Seccomp:\t2"), "the default seccomp profile filters: {stdout}");
    assert!(stdout.ends_with("lo\n"), "network none: only loopback: {stdout}");
    let artifacts = out["artifacts"].as_array().unwrap();
    let made = artifacts.iter().find(|artifact| artifact["path"] == "out.txt").expect("out.txt is an artifact");
    assert_eq!(made["content_b64"], b64(b"made\n"), "{made}");
    assert_eq!(made["sha256"], "9ccbd3f1b19a1cdfd8d7c6ae48e9e822e2345f5be1a6187b19e41486c6941004", "{made}");
}

#[test]
fn artifacts_carry_their_sha256() {
    let mut server = server(&[]);
    let script = "head -c 100000 /dev/urandom > blob.bin; sha256sum blob.bin >&2";
    let out = run(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", script], "artifacts": ["blob.bin"]}));
    assert_eq!(out["status"], "succeeded", "{out}");
    let blob = &out["artifacts"][0];
    let sha256 = blob["sha256"].as_str().unwrap();
    assert!(out["stderr"].as_str().unwrap().starts_with(sha256), "the runner's checksum matches the command's: {out}");
    assert_eq!(base64::engine::general_purpose::STANDARD.decode(blob["content_b64"].as_str().unwrap()).unwrap().len(), 100_000);
}

#[test]
fn timeout_stops_the_command_and_keeps_partial_output() {
    let mut server = server(&[]);
    let out = run(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", "echo partial; sleep 60"], "timeout_s": 2}));
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("timeout"), Some("DeadlineExceeded")), "{out}");
    assert_eq!(out["stdout"], "partial\n");
}

#[test]
fn out_of_memory_is_named() {
    let mut server = server(&[]);
    let out = run(
        &mut server,
        json!({"image": PYTHON, "command": ["python3", "-c", "b = bytearray(400 * 1024 * 1024); print(len(b))"], "limits": {"memory": "64Mi"}}),
    );
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("failed"), Some("OOMKilled")), "{out}");
    assert!(out["message"].as_str().unwrap().contains("64Mi"), "{out}");
}

#[test]
fn a_sigkill_without_oom_is_an_exit_code_not_oom() {
    let mut server = server(&[]);
    let out = run(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", "kill -9 $$"]}));
    assert_eq!(out["status"], "failed", "{out}");
    assert_ne!(out["reason"], "OOMKilled", "{out}");
}

#[test]
fn a_missing_image_is_a_clear_error_naming_it() {
    let mut server = server(&[]);
    let started = Instant::now();
    let out = run(&mut server, json!({"image": MISSING_IMAGE, "command": ["true"]}));
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("error"), Some("ImagePullFailed")), "{out}");
    let message = out["message"].as_str().unwrap();
    assert!(message.contains(MISSING_IMAGE) && message.contains("MCP_K8S_DOCKER_PULL"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(5), "fail fast: {:?}", started.elapsed());
}

#[test]
fn a_background_run_survives_a_server_restart_and_is_listed() {
    let mut first = server(&[]);
    let token = submit(&mut first, "echo started; sleep 3; echo done");
    let _removed = Removed(vec![token.clone()]);
    wait_for_output(&mut first, &token, "started");
    let listed = ok(&mut first, "list_jobs", json!({}));
    let entry = listed["jobs"].as_array().unwrap().iter().find(|job| job["job_token"] == token).cloned();
    assert!(entry.is_some(), "{listed}");
    first.child.kill().unwrap();
    let _ = first.child.wait();
    let mut second = server(&[]);
    let done = fetch_done(&mut second, &token);
    let outcome = &done["result"];
    assert_eq!(outcome["status"], "succeeded", "{done}");
    assert_eq!(outcome["stdout"], "started\ndone\n", "{done}");
    let listed = ok(&mut second, "list_jobs", json!({}));
    assert!(listed["jobs"].as_array().unwrap().iter().any(|job| job["job_token"] == token), "{listed}");
}

#[test]
fn cancel_stops_the_run_and_keeps_its_partial_output() {
    let mut server = server(&[]);
    let token = submit(&mut server, "echo before-cancel; sleep 300; echo never");
    let _removed = Removed(vec![token.clone()]);
    wait_for_output(&mut server, &token, "before-cancel");
    let cancelled = ok(&mut server, "cancel_job", json!({"job_token": token}));
    assert_eq!(cancelled["cancel_requested"], true, "{cancelled}");
    let done = fetch_done(&mut server, &token);
    let outcome = &done["result"];
    assert_eq!((outcome["status"].as_str(), outcome["reason"].as_str()), (Some("cancelled"), Some("Cancelled")), "{outcome}");
    assert!(outcome["stdout"].as_str().unwrap().contains("before-cancel"), "{outcome}");
    let running = client().container_inspect(&format!("mcp-run-{}", run_id_of(&token))).map(|c| c.state.running).unwrap_or(false);
    assert!(!running, "the container is stopped");
    // Another process reads the same verdict.
    let mut other = self::server(&[]);
    assert_eq!(fetch(&mut other, &token, 5)["result"]["status"], "cancelled");
}

/// The roles of `run_id`'s containers, sorted.
fn roles_of(run_id: &str) -> Vec<String> {
    let mut roles: Vec<String> = containers_of(&client(), run_id)
        .iter()
        .map(|container| container.labels.get("mcp-k8s-ephemeral-job/role").cloned().unwrap_or_default())
        .collect();
    roles.sort();
    roles
}

/// A finished background run keeps, for its retention, its own stopped
/// container (its output) and one record container with its verdict (and
/// its cancel mark, when it was cancelled): the record and cancel
/// containers made along the way go once the verdict holds what they
/// held. A server that did not follow the run still reads all of it.
#[test]
fn a_finished_background_run_keeps_its_container_and_one_record() {
    let mut server = server(&[]);
    let finished = submit(&mut server, "echo finished");
    let cancelled = submit(&mut server, "echo before-cancel; sleep 300");
    let _removed = Removed(vec![finished.clone(), cancelled.clone()]);
    assert_eq!(fetch_done(&mut server, &finished)["result"]["status"], "succeeded");
    wait_for_output(&mut server, &cancelled, "before-cancel");
    ok(&mut server, "cancel_job", json!({"job_token": cancelled}));
    assert_eq!(fetch_done(&mut server, &cancelled)["result"]["status"], "cancelled");
    for token in [&finished, &cancelled] {
        assert_eq!(roles_of(run_id_of(token)), ["run", "verdict"], "{token}");
    }
    let mut other = self::server(&[]);
    let done = fetch(&mut other, &finished, 5);
    assert_eq!((done["result"]["status"].as_str(), &done["result"]["stdout"]), (Some("succeeded"), &json!("finished\n")), "{done}");
    assert_eq!(fetch(&mut other, &cancelled, 5)["result"]["status"], "cancelled");
    let listed = ok(&mut other, "list_jobs", json!({}));
    let entry = listed["jobs"].as_array().unwrap().iter().find(|job| job["job_token"] == cancelled).cloned();
    assert_eq!(
        entry.as_ref().map(|entry| (&entry["result_status"], &entry["cancelled"])),
        Some((&json!("cancelled"), &json!(true))),
        "{listed}"
    );
    // The run's own container removed from outside: the record alone
    // still answers with the verdict.
    client().container_remove(&format!("mcp-run-{}", run_id_of(&finished))).expect("docker rm -f");
    assert_eq!(roles_of(run_id_of(&finished)), ["verdict"]);
    let mut third = self::server(&[]);
    let done = fetch(&mut third, &finished, 5);
    assert_eq!(done["result"]["status"], "succeeded", "{done}");
}

/// `auto` resolved to Docker at start (no cluster credentials, the test
/// daemon answers): the agent reads of containers, never of pods or a
/// namespace, and is offered only the modes Docker runs here (no
/// `restricted` without MCP_K8S_DOCKER_NETWORK).
#[test]
fn auto_resolved_to_docker_speaks_of_containers_and_offers_only_dockers_modes() {
    let env = server_env(&[("MCP_K8S_BACKEND", "auto"), ("MCP_K8S_NETWORK_MODES", "none,restricted,open")]);
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let words = StdioServer::start(&env).backend_words();
    let instructions = words["instructions"].as_str().unwrap_or_default();
    assert!(instructions.contains("throwaway Docker container."), "{words}");
    assert!(words["run_job_title"].as_str().unwrap_or_default().contains("Docker container"), "{words}");
    assert_eq!((&words["network_enum"], &words["described_modes"]), (&json!(["none", "open"]), &json!(["none", "open"])), "{words}");
    assert!(words["namespace"].is_null(), "{words}");
}

#[test]
fn a_container_killed_from_outside_is_not_cancelled() {
    let mut server = server(&[]);
    let token = submit(&mut server, "echo up; sleep 300");
    let _removed = Removed(vec![token.clone()]);
    wait_for_output(&mut server, &token, "up");
    client().container_kill(&format!("mcp-run-{}", run_id_of(&token)), "KILL").expect("docker kill");
    let done = fetch_done(&mut server, &token);
    let outcome = &done["result"];
    assert_ne!(outcome["status"], "cancelled", "{outcome}");
    assert_eq!(outcome["status"], "error", "{outcome}");
    assert_eq!(outcome["reason"], "ResultLost", "the runner was killed before its result: {outcome}");
    assert!(outcome["stdout"].as_str().unwrap().contains("up"), "{outcome}");
    assert_eq!(outcome["stdout_total_bytes"], 3, "without the result, what arrived is the floor of the total: {outcome}");
    assert_eq!(outcome["truncated"]["stdout"], true, "and there may have been more: {outcome}");
}

#[test]
fn a_container_removed_from_outside_is_not_cancelled() {
    let mut server = server(&[]);
    let token = submit(&mut server, "echo up; sleep 300");
    let _removed = Removed(vec![token.clone()]);
    wait_for_output(&mut server, &token, "up");
    client().container_remove(&format!("mcp-run-{}", run_id_of(&token))).expect("docker rm -f");
    let done = fetch_done(&mut server, &token);
    let outcome = &done["result"];
    assert_ne!(outcome["status"], "cancelled", "{outcome}");
    assert_eq!(outcome["reason"], "PodDeleted", "{outcome}");
}

/// `docker rm -f` kills first and removes after; a look between the two
/// sees a plain kill. Here the two halves come 300 ms apart, wider than
/// the watch's poll, so the kill is always seen first: the end must still
/// be the removal (it was `ResultLost` when judged at the kill).
#[test]
fn a_kill_then_a_removal_a_moment_later_is_a_removal() {
    let mut server = server(&[]);
    let token = submit(&mut server, "echo up; sleep 300");
    let _removed = Removed(vec![token.clone()]);
    wait_for_output(&mut server, &token, "up");
    let name = format!("mcp-run-{}", run_id_of(&token));
    client().container_kill(&name, "KILL").expect("docker kill");
    std::thread::sleep(Duration::from_millis(300));
    client().container_remove(&name).expect("docker rm");
    let outcome = &fetch_done(&mut server, &token)["result"];
    assert_eq!((outcome["status"].as_str(), outcome["reason"].as_str()), (Some("error"), Some("PodDeleted")), "{outcome}");
}

#[test]
fn a_sync_run_removed_from_outside_ends_at_once_and_says_so() {
    let mut server = server(&[]);
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let arguments = json!({"image": BUSYBOX, "command": ["sh", "-c", "echo up; sleep 300"]});
    let params = json!({"name": "run_job", "arguments": arguments, "_meta": {"progressToken": "p"}});
    server.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string());
    // The progress names the container (`created container mcp-run-…`); once the
    // command's output arrives as progress, it runs.
    let mut container = None;
    loop {
        let message = server.recv_within(Duration::from_secs(30));
        assert_ne!(message["id"], id, "ended before it was removed: {message}");
        let text = message["params"]["message"].as_str().unwrap_or_default();
        if let Some(name) = text.strip_prefix("created container ") {
            container = Some(name.to_string());
        }
        if text.contains("up") && container.is_some() {
            break;
        }
    }
    let started = Instant::now();
    client().container_remove(&container.unwrap()).expect("docker rm -f");
    let message = loop {
        let message = server.recv_within(Duration::from_secs(30));
        if message["id"] == id {
            break message;
        }
    };
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    let out = &message["result"]["structuredContent"];
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("error"), Some("PodDeleted")), "{out}");
    assert_nothing_left(out["run_id"].as_str().unwrap());
}

#[test]
fn the_reaper_removes_only_expired_containers_of_this_server() {
    use mcp_k8s_ephemeral_job::backend::docker::{reaper, spec};
    let client = client();
    let cleanup = crate::Cleanup::new(&client, "reaper");
    let make = |suffix: &str, labels: &[(&str, &str)]| {
        let mut body = crate::hardened(&cleanup, &["true"]);
        body.labels.extend(labels.iter().map(|(key, value)| (key.to_string(), value.to_string())));
        client.container_create(&format!("{}-{suffix}", cleanup.value), &body).expect("create").id
    };
    let ours = (spec::LABEL_MANAGED_BY, spec::MANAGED_BY);
    let expired = make("expired", &[ours, (spec::LABEL_EXPIRES_AT, "2026-01-01T00:00:00Z")]);
    let current = make("current", &[ours, (spec::LABEL_EXPIRES_AT, "2099-01-01T00:00:00Z")]);
    let foreign = make("foreign", &[(spec::LABEL_EXPIRES_AT, "2026-01-01T00:00:00Z")]);
    reaper::reap_once(&client, std::time::SystemTime::now());
    assert!(client.container_inspect(&expired).is_err_and(|error| error.is_not_found()), "the expired one goes");
    assert!(client.container_inspect(&current).is_ok(), "one not yet expired stays");
    assert!(client.container_inspect(&foreign).is_ok(), "one not labelled as ours stays");
}

/// A runner binary that is not there stops the start, naming the setting
/// and the path (waiting would not fix it, so even a lazy server stops),
/// and nothing is created at that path on the host.
#[test]
fn a_missing_runner_binary_is_named_and_no_host_path_is_created() {
    let missing = format!("/tmp/mcp-k8s-no-runner-{}/runner", std::process::id());
    let env = server_env(&[("MCP_K8S_RUNNER_BINARY", &missing)]);
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let output = crate::support::server::command(&env).arg("serve").stdin(std::process::Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("MCP_K8S_RUNNER_BINARY") && stderr.contains(&missing), "{stderr}");
    assert!(!std::path::Path::new(&missing).exists(), "Docker did not create the bind source");
}

#[test]
fn with_pulls_allowed_a_missing_image_is_pulled_and_its_failure_named() {
    let mut server = server(&[("MCP_K8S_DOCKER_PULL", "missing")]);
    let out = run(&mut server, json!({"image": MISSING_IMAGE, "command": ["true"]}));
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("error"), Some("ImagePullFailed")), "{out}");
    let message = out["message"].as_str().unwrap();
    assert!(message.contains(MISSING_IMAGE) && message.contains("could not be pulled"), "{message}");
}

/// The removal comes after the answer, on a thread of its own: a server
/// that exits right after the answer still removes everything first.
#[test]
fn a_server_that_exits_right_after_the_answer_has_removed_the_run() {
    let mut server = server(&[]);
    let out = ok(&mut server, "run_job", json!({"image": BUSYBOX, "command": ["true"]}));
    assert_eq!(out["status"], "succeeded", "{out}");
    server.close_stdin();
    let exited = crate::support::server::wait_exit(&mut server.child, Duration::from_secs(30));
    assert!(exited.is_some_and(|status| status.success()), "the server exits cleanly: {exited:?}");
    let left = containers_of(&client(), out["run_id"].as_str().expect("run_id"));
    let names: Vec<_> = left.iter().map(|c| c.names.clone()).collect();
    for container in &left {
        let _ = client().container_remove(&container.id);
    }
    assert!(names.is_empty(), "containers left at the exit: {names:?}");
}

/// A sandbox needs an engine that keeps a container's stdin open from one
/// attach to the next. On dockerd `open_sandbox` opens one (the contract's
/// sandbox cases use it at length); on Podman, which ends stdin with the
/// first attach, it is refused with the reason and what to use instead,
/// and no container is made (`tests/podman/run` runs this against Podman).
#[test]
fn open_sandbox_opens_only_on_an_engine_that_keeps_stdin_across_attaches() {
    let podman = client().version().is_podman();
    let mut server = server(&[]);
    let (result, _) = call(&mut server, "open_sandbox", json!({"image": BUSYBOX}));
    let opened = &result["structuredContent"];
    if podman {
        assert_eq!(opened["status"], "error", "{result}");
        assert_eq!(opened["reason"], "Rejected", "{result}");
        let message = opened["message"].as_str().unwrap_or_default();
        assert!(message.contains("Podman") && message.contains("run_job"), "{result}");
        let filters = docker::Filters { labels: vec![mcp_k8s_ephemeral_job::backend::docker::spec::LABEL_SANDBOX.to_string()] };
        let made = client().container_list(&filters).expect("list the sandbox containers");
        assert!(made.is_empty(), "a refused sandbox makes no container: {made:?}");
    } else {
        let id = opened["sandbox"].as_str().unwrap_or_else(|| panic!("dockerd opens the sandbox: {result}"));
        assert_eq!(opened["state"], "idle", "{result}");
        ok(&mut server, "close_sandbox", json!({"sandbox": id}));
    }
}
