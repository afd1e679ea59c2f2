//! `run_job` on the real test cluster, through the built binary over stdio
//! with the ServiceAccount kubeconfig: one test per field, status and
//! reason of the contract, and after each, nothing left in the cluster.

use std::time::{Duration, Instant};

use crate::support::cluster::{self, BUSYBOX, NONEXISTENT_IMAGE, PYTHON};
use crate::support::server::StdioServer;
use base64::Engine as _;
use serde_json::{Value, json};

/// A server connected to the test cluster, with extra settings on top.
fn server(extra: &[(&str, &str)]) -> StdioServer {
    cluster::server(extra)
}

/// Request ids must not repeat within a session (MCP), so each call takes
/// a fresh one.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(100);

/// Calls run_job and returns (the tools/call result, progress messages).
fn call(server: &mut StdioServer, arguments: Value) -> (Value, Vec<String>) {
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let request = json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "run_job", "arguments": arguments, "_meta": {"progressToken": "t"}},
    });
    server.send(&request.to_string());
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

/// Runs and returns the structured result, checking the cluster is clean.
fn run(server: &mut StdioServer, arguments: Value) -> Value {
    let (result, _) = call(server, arguments);
    assert_eq!(result["isError"], false, "{result}");
    let structured = result["structuredContent"].clone();
    cluster::assert_nothing_left(structured["run_id"].as_str().expect("run_id"));
    structured
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn exit_code_and_separate_streams() {
    let mut server = server(&[]);
    let (result, progress) =
        call(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"]}));
    let out = &result["structuredContent"];
    assert_eq!(out["status"], "failed", "{out}");
    assert_eq!(out["reason"], "NonZeroExit");
    assert_eq!(out["exit_code"], 3);
    assert_eq!(out["stdout"], "to-stdout\n");
    assert_eq!(out["stderr"], "to-stderr\n");
    assert!(out["timings"]["started_at"].is_string(), "{out}");
    assert_eq!(out["timings"]["warm"], false, "no pools here: {out}");
    assert!(progress.iter().any(|p| p.contains("to-stdout")), "live output reaches progress: {progress:?}");
    cluster::assert_nothing_left(out["run_id"].as_str().unwrap());
}

#[test]
fn success_with_input_files_env_and_workdir() {
    let mut server = server(&[]);
    let out = run(
        &mut server,
        json!({
            "image": BUSYBOX,
            "command": ["sh", "./bin/greet.sh"],
            "files": [{"path": "bin/greet.sh", "content_b64": b64(b"echo \"$GREETING from $(pwd)\"\n"), "mode": "0755"}],
            "env": {"GREETING": "hello"},
            "workdir": "/home/job/src",
        }),
    );
    assert_eq!(out["status"], "succeeded", "{out}");
    assert_eq!(out["exit_code"], 0);
    assert_eq!(out["stdout"], "hello from /home/job/src\n");
    assert_eq!(out["artifacts"], json!([]), "inputs that were not changed are not artifacts");
}

#[test]
fn dollar_parentheses_reach_the_command_literally() {
    let mut server = server(&[]);
    let out = run(&mut server, json!({"image": BUSYBOX, "command": ["echo", "$(HOME)", "$$", "${X}"], "env": {"V": "$(HOME)"}}));
    assert_eq!(out["stdout"], "$(HOME) $$ ${X}\n", "{out}");
}

#[test]
fn binary_output_comes_back_exactly() {
    let mut server = server(&[]);
    let out = run(&mut server, json!({"image": BUSYBOX, "command": ["printf", "\\000\\377\\001"]}));
    assert_eq!(out["stdout_b64"], b64(&[0, 255, 1]), "{out}");
}

#[test]
fn timeout_stops_the_command_and_keeps_partial_output_and_files() {
    let mut server = server(&[]);
    let started = Instant::now();
    let out =
        run(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", "echo partial; echo x > made.txt; sleep 60"], "timeout_s": 3}));
    assert_eq!(out["status"], "timeout", "{out}");
    assert_eq!(out["reason"], "DeadlineExceeded");
    assert_eq!(out["stdout"], "partial\n");
    assert_eq!(out["artifacts"][0]["path"], "made.txt");
    assert!(started.elapsed() < Duration::from_secs(50), "the timeout applies to the command, not more");
}

#[test]
fn out_of_memory_is_named() {
    let mut server = server(&[]);
    let out = run(
        &mut server,
        json!({"image": PYTHON, "command": ["python3", "-c", "b = bytearray(400 * 1024 * 1024); print(len(b))"], "limits": {"memory": "64Mi"}}),
    );
    assert_eq!(out["status"], "failed", "{out}");
    assert_eq!(out["reason"], "OOMKilled", "{out}");
    assert!(out["message"].as_str().unwrap().contains("limits.memory=64Mi"));
}

#[test]
fn an_image_that_does_not_exist_fails_fast_with_the_reason() {
    let mut server = server(&[]);
    let started = Instant::now();
    let out = run(&mut server, json!({"image": NONEXISTENT_IMAGE, "command": ["true"]}));
    assert_eq!(out["status"], "error", "{out}");
    assert_eq!(out["reason"], "ImagePullFailed");
    assert!(out["message"].as_str().unwrap().contains(NONEXISTENT_IMAGE), "{out}");
    assert!(started.elapsed() < Duration::from_secs(60), "fails fast, not after the start timeout");
}

#[test]
fn a_request_no_node_can_satisfy_is_unschedulable() {
    // 30Gi: not beside another such test, or the quota refuses one of them.
    let _turn = cluster::more_memory_than_the_node();
    let mut server = server(&[]);
    let out = run(&mut server, json!({"image": BUSYBOX, "command": ["true"], "limits": {"memory": "30Gi"}}));
    assert_eq!(out["status"], "error", "{out}");
    assert_eq!(out["reason"], "Unschedulable");
    assert!(out["message"].as_str().unwrap().contains("Insufficient memory"), "{out}");
}

#[test]
fn a_full_quota_is_named() {
    // A namespace of its own with a quota of zero pods, so the Job
    // controller's pod creation is refused.
    let namespace = "mcp-quota-test";
    let admin = cluster::admin_client();
    let _ = admin.create(
        mcp_k8s_ephemeral_job::kube::Resource::NAMESPACES,
        "",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}),
    );
    let _ = admin.create(
        mcp_k8s_ephemeral_job::kube::Resource { api_path: "/api/v1", plural: "resourcequotas", namespaced: true },
        namespace,
        &json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}),
    );
    let admin_kubeconfig = cluster::admin_kubeconfig().display().to_string();
    let mut server = server(&[("MCP_K8S_KUBECONFIG", admin_kubeconfig.as_str()), ("MCP_K8S_NAMESPACE", namespace)]);
    let (result, _) = call(&mut server, json!({"image": BUSYBOX, "command": ["true"]}));
    let out = &result["structuredContent"];
    assert_eq!(out["status"], "error", "{out}");
    assert_eq!(out["reason"], "QuotaExceeded", "{out}");
    assert!(out["message"].as_str().unwrap().contains("exceeded quota"), "{out}");
    cluster::assert_nothing_left_in(namespace, out["run_id"].as_str().unwrap());
}

#[test]
fn a_png_comes_back_as_an_image_block() {
    let mut server = server(&[]);
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
    let (result, _) = call(
        &mut server,
        json!({"image": BUSYBOX, "command": ["cp", "in.bin", "plot.png"], "files": [{"path": "in.bin", "content_b64": b64(png)}]}),
    );
    let out = &result["structuredContent"];
    assert_eq!(out["status"], "succeeded", "{out}");
    assert_eq!(out["artifacts"][0]["path"], "plot.png");
    let image = result["content"].as_array().unwrap().iter().find(|block| block["type"] == "image").expect("an image block");
    assert_eq!(image["mimeType"], "image/png");
    assert_eq!(image["data"], b64(png));
    cluster::assert_nothing_left(out["run_id"].as_str().unwrap());
}

#[test]
fn an_image_without_a_shell_runs() {
    // The project's own image holds nothing but the static binary.
    let mut server = server(&[]);
    let out = run(&mut server, json!({"image": cluster::project_image(), "command": ["/mcp-k8s-ephemeral-job", "--version"]}));
    assert_eq!(out["status"], "succeeded", "{out}");
    assert!(out["stdout"].as_str().unwrap().starts_with("mcp-k8s-ephemeral-job "), "{out}");
}

#[test]
fn a_program_that_does_not_exist_is_start_failed() {
    let mut server = server(&[]);
    let out = run(&mut server, json!({"image": BUSYBOX, "command": ["no-such-program"]}));
    assert_eq!(out["status"], "error", "{out}");
    assert_eq!(out["reason"], "StartFailed");
    assert_eq!(out["exit_code"], 127);
}

#[test]
fn cancelling_the_call_deletes_the_pod_at_once() {
    let mut server = server(&[]);
    let request = json!({
        "jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "run_job", "arguments": {"image": BUSYBOX, "command": ["sh", "-c", "echo begun; sleep 300"]}, "_meta": {"progressToken": "c"}},
    });
    server.send(&request.to_string());
    // Wait until the command runs (its output arrives as progress).
    let mut job_name = String::new();
    loop {
        let message = server.recv_within(Duration::from_secs(120));
        let text = message["params"]["message"].as_str().unwrap_or_default();
        if let Some(name) = text.strip_prefix("created Job ") {
            job_name = name.to_string();
        }
        if text.contains("begun") {
            break;
        }
    }
    let run_id = job_name.strip_prefix("mcpk8s-").expect("the job name carries the run id").to_string();
    server.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":9,"reason":"test"}}"#);
    let cancelled_at = Instant::now();
    cluster::assert_nothing_left(&run_id);
    assert!(cancelled_at.elapsed() < Duration::from_secs(30), "the pod went at once, not after its timeout");
    assert!(server.nothing_within(Duration::from_millis(500)).is_none(), "a cancelled request gets no response");
}

#[test]
fn invalid_arguments_are_tool_errors_and_create_nothing() {
    let mut server = server(&[]);
    let cases = [
        (json!({"image": "", "command": ["true"]}), "`image` must not be empty"),
        (json!({"image": "evil:latest", "command": ["true"]}), "is not allowed; allowed:"),
        (json!({"image": BUSYBOX, "command": []}), "`command` must not be empty"),
        (json!({"image": BUSYBOX, "command": ["true"], "timeout_s": 100000}), "over the server's maximum"),
        (json!({"image": BUSYBOX, "command": ["true"], "limits": {"cpu": "lots"}}), "not a Kubernetes quantity"),
        (json!({"image": BUSYBOX, "command": ["true"], "files": [{"path": "../x", "content_b64": ""}]}), "`files[0].path`"),
    ];
    for (arguments, expected) in cases {
        let (result, _) = call(&mut server, arguments.clone());
        assert_eq!(result["isError"], true, "{arguments}: {result}");
        let text = result["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(expected), "{arguments}: {text}");
    }
}

#[test]
fn results_at_the_caps_survive_log_rotation() {
    // With an 8 MiB output cap the log carries ~11 MiB of live output frames
    // while the command runs for ~20 s, then ~11 MiB of final capture and a
    // 6 MiB artifact: well past the kubelet's 10 MiB rotation size, which it
    // checks every 10 s on running containers. The result must arrive whole,
    // or say what it lost.
    let mut server = server(&[("MCP_K8S_MAX_OUTPUT_BYTES", "8388608")]);
    let script = "i=0; while [ $i -lt 20 ]; do head -c 600000 /dev/urandom | base64 -w 100; i=$((i+1)); sleep 1; done; \
                  echo END-OF-STDOUT; head -c 6291456 /dev/urandom > blob.bin; sha256sum blob.bin >&2";
    let out = run(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", script], "timeout_s": 180, "artifacts": ["blob.bin"]}));
    assert_eq!(out["status"], "succeeded", "{}: {}", out["message"], out["notes"]);
    assert_eq!(out["truncated"]["stdout"], true, "over the cap is flagged");
    assert!(out["stdout"].as_str().unwrap().ends_with("END-OF-STDOUT\n"), "the tail survived");
    assert!(out["stdout_total_bytes"].as_u64().unwrap() > 16_000_000);
    let blob = &out["artifacts"][0];
    let sha256 = blob["sha256"].as_str().unwrap();
    assert!(out["stderr"].as_str().unwrap().contains(sha256), "the runner's checksum matches the command's: {sha256}");
    match blob["content_b64"].as_str() {
        Some(content) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(content).unwrap();
            let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
            let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(hex, sha256, "the artifact arrived whole");
        }
        None => assert_eq!(out["truncated"]["artifacts"], true, "{out}"),
    }
}

#[test]
fn max_concurrent_is_a_real_limit_and_a_full_queue_is_refused() {
    let mut server = server(&[("MCP_K8S_MAX_CONCURRENT", "1"), ("MCP_K8S_MAX_QUEUED", "0")]);
    let long = json!({"jsonrpc": "2.0", "id": 20, "method": "tools/call",
        "params": {"name": "run_job", "arguments": {"image": BUSYBOX, "command": ["sh", "-c", "echo running; sleep 5"]}, "_meta": {"progressToken": "a"}}});
    server.send(&long.to_string());
    // Wait until the first run holds the only slot.
    loop {
        let message = server.recv_within(Duration::from_secs(120));
        if message["params"]["message"].as_str().is_some_and(|m| m.starts_with("created Job")) {
            break;
        }
    }
    let second = json!({"jsonrpc": "2.0", "id": 21, "method": "tools/call",
        "params": {"name": "run_job", "arguments": {"image": BUSYBOX, "command": ["true"]}}});
    server.send(&second.to_string());
    let mut results = std::collections::HashMap::new();
    while results.len() < 2 {
        let message = server.recv_within(Duration::from_secs(120));
        if let Some(id) = message["id"].as_i64() {
            results.insert(id, message["result"]["structuredContent"].clone());
        }
    }
    assert_eq!(results[&21]["status"], "error", "{}", results[&21]);
    assert_eq!(results[&21]["reason"], "QueueFull");
    assert!(results[&21]["message"].as_str().unwrap().contains("MCP_K8S_MAX_CONCURRENT"));
    assert_eq!(results[&20]["status"], "succeeded", "{}", results[&20]);
    cluster::assert_nothing_left(results[&20]["run_id"].as_str().unwrap());
}
