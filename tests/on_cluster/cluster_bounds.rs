//! The sandbox's bounds on the real test cluster (7
//! and 15), through the built binary over stdio: a read-only root with a
//! writable /tmp, HOME and workdir; disk writes stopped at the size bound;
//! a fork storm stopped by the pod's pid limit and named `PidsExhausted`;
//! an artifact over the cap named in the notes with the cap; the inputs
//! Secret deleted once the command runs; a background job waiting for
//! capacity up to its start timeout; ten cancels at once answered at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support::cluster::{self, BUSYBOX, NAMESPACE, PYTHON};
use crate::support::server::StdioServer;
use mcp_k8s_ephemeral_job::kube;
use serde_json::{Value, json};

static NEXT_ID: AtomicU64 = AtomicU64::new(100);

/// Sends one tools/call and returns its request id.
fn send_call(server: &mut StdioServer, name: &str, arguments: Value) -> u64 {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}});
    server.send(&request.to_string());
    id
}

/// Reads messages until the response to `id`; returns its result.
fn response_to(server: &StdioServer, id: u64, wait: Duration) -> Value {
    loop {
        let message = server.recv_within(wait);
        if message["id"] == id {
            return message["result"].clone();
        }
    }
}

/// A tool call that must succeed; its structured content.
fn ok(server: &mut StdioServer, name: &str, arguments: Value) -> Value {
    let id = send_call(server, name, arguments);
    let result = response_to(server, id, Duration::from_secs(300));
    assert_eq!(result["isError"], false, "{name}: {result}");
    result["structuredContent"].clone()
}

/// `run_job`, and nothing of it left in the cluster afterwards.
fn run(server: &mut StdioServer, arguments: Value) -> Value {
    let outcome = ok(server, "run_job", arguments);
    cluster::assert_nothing_left(outcome["run_id"].as_str().expect("run_id"));
    outcome
}

#[test]
fn the_root_is_read_only_and_tmp_home_and_the_workdir_are_writable() {
    let mut server = cluster::server(&[]);
    // Python itself must still start and import with a read-only root.
    let program = r#"
import json, os, sys
def attempt(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        return "written"
    except OSError as error:
        return error.strerror
home = os.environ["HOME"]
os.makedirs(os.path.join(home, ".cache"), exist_ok=True)
print(json.dumps({
    "home": home,
    "root": attempt("/bounds-probe"),
    "usr": attempt("/usr/bounds-probe"),
    "tmp": attempt("/tmp/bounds-probe"),
    "home_cache": attempt(os.path.join(home, ".cache", "probe")),
    "workdir": attempt("out.txt"),
    "python": sys.version_info[0],
}))
"#;
    let outcome = run(&mut server, json!({"image": PYTHON, "command": ["python3", "-c", program]}));
    assert_eq!(outcome["status"], "succeeded", "{outcome}");
    let seen: Value = serde_json::from_str(outcome["stdout"].as_str().unwrap().trim()).expect("the program's JSON");
    assert_eq!(
        seen,
        json!({
            "home": "/tmp", "root": "Read-only file system", "usr": "Read-only file system",
            "tmp": "written", "home_cache": "written", "workdir": "written", "python": 3,
        }),
        "{outcome}"
    );
    // Files in /tmp are not the workdir's, so they are not artifacts.
    let paths: Vec<&str> = outcome["artifacts"].as_array().unwrap().iter().filter_map(|a| a["path"].as_str()).collect();
    assert_eq!(paths, ["out.txt"], "{outcome}");

    // A HOME the caller sets is kept.
    let outcome = run(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", "echo $HOME"], "env": {"HOME": "/work/home"}}));
    assert_eq!(outcome["stdout"], "/work/home\n", "{outcome}");
}

/// 1.5 GB went to /tmp while the workdir limit was
/// 1Gi. The kubelet enforces the bound by evicting the pod on its own
/// schedule (its volume stats refresh about once a minute: at 8 MiB/s, a
/// 64Mi /tmp held 576 MiB when it came), so the runner watches the folders
/// itself and stops the command within a fraction of a second of the limit.
#[test]
fn writing_past_the_disk_bound_stops_the_run_at_the_bound() {
    let mut server = cluster::server(&[("MCP_K8S_WORKDIR_SIZE", "64Mi")]);
    let script = "i=0; while [ $i -lt 256 ]; do dd if=/dev/zero of=/tmp/fill-$i bs=1M count=4 2>/dev/null || { echo write-failed-at-$i; exit 1; }; \
                  i=$((i+1)); echo mib=$((i*4)); sleep 0.5; done; echo all-written";
    let started = Instant::now();
    let outcome = run(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", script], "timeout_s": 240}));
    let stdout = outcome["stdout"].as_str().unwrap_or_default();
    let written_mib = stdout.lines().filter_map(|line| line.strip_prefix("mib=")).filter_map(|n| n.parse::<u64>().ok()).max().unwrap_or(0);
    eprintln!("disk bound: {written_mib} MiB written to /tmp in {:?}; {}: {}", started.elapsed(), outcome["reason"], outcome["message"]);
    assert_eq!((outcome["status"].as_str(), outcome["reason"].as_str()), (Some("failed"), Some("DiskLimitExceeded")), "{outcome}");
    assert!(outcome["message"].as_str().unwrap().contains("`/tmp` "), "{outcome}");
    assert!(outcome["message"].as_str().unwrap().contains("MCP_K8S_WORKDIR_SIZE"), "{outcome}");
    // 64 MiB, plus what 8 MiB/s adds between two of the watcher's measurements.
    assert!((64..=96).contains(&written_mib), "{written_mib} MiB written past a 64Mi bound: {outcome}");
}

/// Pids.max was `max`, one pod ran 5,005 processes,
/// and a fork storm under 512Mi ended as OOMKilled with the advice to
/// raise the memory limit. Needs the kubelet's podPidsLimit, which
/// `tests/cluster/up` sets to 1024.
#[test]
fn a_fork_storm_is_stopped_by_the_pid_limit_and_named() {
    let mut server = cluster::server(&[]);
    let storm = "i=0; while [ $i -lt 3000 ]; do sleep 60 & i=$((i+1)); done; echo started-all; wait";
    let outcome =
        run(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", storm], "timeout_s": 60, "limits": {"memory": "512Mi"}}));
    assert!(
        !outcome["stdout"].as_str().unwrap_or_default().contains("started-all"),
        "3000 processes started in one pod: is the kubelet's podPidsLimit set (tests/cluster/up sets 1024; restart the kubelet after changing it)? {outcome}"
    );
    assert_eq!((outcome["status"].as_str(), outcome["reason"].as_str()), (Some("failed"), Some("PidsExhausted")), "{outcome}");
    assert!(outcome["message"].as_str().unwrap().contains("podPidsLimit"), "{outcome}");
}

/// An artifact over the cap came back without
/// content and with empty `notes`.
#[test]
fn an_artifact_over_the_cap_is_named_with_the_cap() {
    let mut server = cluster::server(&[("MCP_K8S_MAX_ARTIFACT_BYTES", "4096")]);
    let script = "head -c 10000 /dev/zero > big.bin; echo small > small.txt";
    let outcome = run(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", script], "artifacts": ["*"]}));
    assert_eq!(outcome["status"], "succeeded", "{outcome}");
    let big = outcome["artifacts"].as_array().unwrap().iter().find(|a| a["path"] == "big.bin").cloned().expect("big.bin listed");
    assert!(big["content_b64"].is_null(), "{outcome}");
    assert_eq!(outcome["truncated"]["artifacts"], true, "{outcome}");
    let notes = outcome["notes"].to_string();
    assert!(notes.contains("`big.bin` (10000 bytes) was listed without content"), "{outcome}");
    assert!(notes.contains("the artifact cap is 4096 bytes") && notes.contains("MCP_K8S_MAX_ARTIFACT_BYTES"), "{outcome}");
}

/// Ten concurrent cancel_job calls took 2 to 11 s
/// each, while the README said "at once". Each now answers once the cancel
/// is recorded and the pod deletion issued; fetch_job has the result.
#[test]
fn ten_cancels_at_once_answer_at_once() {
    let mut server = cluster::server(&[]);
    let mut tokens = Vec::new();
    for _ in 0..10 {
        let submitted = ok(&mut server, "submit_job", json!({"image": BUSYBOX, "command": ["sh", "-c", "echo up; sleep 300"]}));
        tokens.push(submitted["job_token"].as_str().unwrap().to_string());
    }
    let _cleanup = Cleanup(tokens.clone());
    let deadline = Instant::now() + Duration::from_secs(180);
    for token in &tokens {
        while !ok(&mut server, "fetch_job", json!({"job_token": token, "wait_s": 2}))["stdout"].as_str().unwrap_or_default().contains("up")
        {
            assert!(Instant::now() < deadline, "{token} did not start");
        }
    }
    let sent_at = Instant::now();
    let ids: Vec<u64> = tokens.iter().map(|token| send_call(&mut server, "cancel_job", json!({"job_token": token}))).collect();
    let mut latencies = Vec::new();
    let mut pending: Vec<u64> = ids.clone();
    while !pending.is_empty() {
        let message = server.recv_within(Duration::from_secs(60));
        let Some(position) = pending.iter().position(|id| message["id"] == *id) else { continue };
        pending.remove(position);
        latencies.push(sent_at.elapsed());
        let result = &message["result"];
        assert_eq!(result["isError"], false, "{result}");
        assert_eq!(result["structuredContent"]["cancel_requested"], true, "{result}");
    }
    eprintln!("10 concurrent cancel_job answered after {latencies:?}");
    assert!(latencies.iter().all(|latency| *latency < Duration::from_secs(5)), "{latencies:?}");
    for token in &tokens {
        let view = ok(&mut server, "fetch_job", json!({"job_token": token, "wait_s": 60}));
        assert_eq!((view["status"].as_str(), view["result"]["status"].as_str()), (Some("done"), Some("cancelled")), "{view}");
        assert!(view["result"]["stdout"].as_str().unwrap().contains("up"), "the output so far is kept: {view}");
    }
}

/// The inputs sat in a Secret until the run ended
/// (background runs: until the follower finished). It goes once the
/// command has started, for sync and background runs alike.
#[test]
fn the_inputs_secret_is_gone_once_the_command_runs() {
    let mut server = cluster::server(&[]);
    let files = json!([{"path": "in.txt", "content_b64": "c2VjcmV0LWlucHV0Cg=="}]);
    let submitted =
        ok(&mut server, "submit_job", json!({"image": BUSYBOX, "command": ["sh", "-c", "cat in.txt; sleep 30"], "files": files}));
    let token = submitted["job_token"].as_str().unwrap().to_string();
    let _cleanup = Cleanup(vec![token.clone()]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ok(&mut server, "fetch_job", json!({"job_token": token, "wait_s": 2}))["stdout"]
        .as_str()
        .unwrap_or_default()
        .contains("secret-input")
    {
        assert!(Instant::now() < deadline, "{token} did not start");
    }
    let secret_name = format!("mcpk8s-{}", &token[4..36]);
    let gone_by = Instant::now() + Duration::from_secs(10);
    while cluster::admin_client().get_if_exists(kube::Resource::SECRETS, NAMESPACE, &secret_name).unwrap().is_some() {
        assert!(Instant::now() < gone_by, "the inputs Secret {secret_name} outlived the start of the command");
        std::thread::sleep(Duration::from_millis(250));
    }
    let view = ok(&mut server, "fetch_job", json!({"job_token": token}));
    assert_eq!(view["status"], "running", "the command still runs: {view}");
}

/// Background jobs got the sync 20 s Unschedulable
/// grace; they now wait for capacity up to MCP_K8S_START_TIMEOUT_S.
#[test]
fn a_background_job_waits_for_capacity_up_to_its_start_timeout() {
    // 30Gi: not beside another such test, or the quota refuses one of them.
    let _turn = cluster::more_memory_than_the_node();
    let mut server = cluster::server(&[("MCP_K8S_START_TIMEOUT_S", "35")]);
    let started = Instant::now();
    let submitted = ok(&mut server, "submit_job", json!({"image": BUSYBOX, "command": ["true"], "limits": {"memory": "30Gi"}}));
    let token = submitted["job_token"].as_str().unwrap().to_string();
    let _cleanup = Cleanup(vec![token.clone()]);
    let view = loop {
        let view = ok(&mut server, "fetch_job", json!({"job_token": token, "wait_s": 30}));
        if view["status"] == "done" {
            break view;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{view}");
    };
    let waited = started.elapsed();
    assert_eq!((view["result"]["status"].as_str(), view["result"]["reason"].as_str()), (Some("error"), Some("Unschedulable")), "{view}");
    assert!(view["result"]["message"].as_str().unwrap().contains("Insufficient memory"), "{view}");
    assert!(waited >= Duration::from_secs(30), "gave up after {waited:?}, before its start timeout: {view}");
}

/// Background Jobs are kept for the retention; the test deletes its own.
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let client = cluster::admin_client();
        for token in &self.0 {
            let name = format!("mcpk8s-{}", &token[4..36]);
            let _ = client.delete(kube::Resource::JOBS, NAMESPACE, &name);
            let _ = client.delete(kube::Resource::SECRETS, NAMESPACE, &name);
        }
    }
}
