//! Background jobs on the real test cluster, through the built
//! binary over stdio: submit, long-poll, fetch twice, expiry, cancel with
//! partial output, list; a SIGKILLed server and a second server losing
//! nothing; the reaper cleaning up after a crashed server; and the same
//! runs seen as MCP tasks through raw JSON-RPC.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support::cluster::{self, BUSYBOX, NAMESPACE};
use crate::support::server::StdioServer;
use mcp_k8s_ephemeral_job::kube;
use serde_json::{Value, json};

static NEXT_ID: AtomicU64 = AtomicU64::new(100);

/// A server connected to the test cluster, with extra settings on top.
fn server(extra: &[(&str, &str)]) -> StdioServer {
    cluster::server(extra)
}

/// One request; returns (its response, progress messages before it).
fn request(server: &mut StdioServer, method: &str, params: Value) -> (Value, Vec<String>) {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    server.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string());
    let mut progress = Vec::new();
    loop {
        let message = server.recv_within(Duration::from_secs(180));
        if message["id"] == id {
            return (message, progress);
        }
        if message["method"] == "notifications/progress" {
            progress.push(message["params"]["message"].as_str().unwrap_or_default().to_string());
        }
    }
}

/// A tool call; returns (the tools/call result, progress messages).
fn call(server: &mut StdioServer, name: &str, arguments: Value) -> (Value, Vec<String>) {
    let params = json!({"name": name, "arguments": arguments, "_meta": {"progressToken": "p"}});
    let (response, progress) = request(server, "tools/call", params);
    (response["result"].clone(), progress)
}

/// A tool call that must succeed; its structured content.
fn ok(server: &mut StdioServer, name: &str, arguments: Value) -> Value {
    let (result, _) = call(server, name, arguments);
    assert_eq!(result["isError"], false, "{name}: {result}");
    result["structuredContent"].clone()
}

/// A tool call that must fail; its text.
fn tool_error(server: &mut StdioServer, name: &str, arguments: Value) -> String {
    let (result, _) = call(server, name, arguments);
    assert_eq!(result["isError"], true, "{name}: {result}");
    result["content"][0]["text"].as_str().unwrap().to_string()
}

fn submit(server: &mut StdioServer, command: &str) -> String {
    let submitted = ok(server, "submit_job", json!({"image": BUSYBOX, "command": ["sh", "-c", command]}));
    assert_eq!(submitted["status"], "submitted", "{submitted}");
    submitted["job_token"].as_str().unwrap().to_string()
}

fn fetch(server: &mut StdioServer, token: &str, wait_s: u64) -> Value {
    ok(server, "fetch_job", json!({"job_token": token, "wait_s": wait_s}))
}

/// Fetches until done (each poll waits up to 30 s).
fn fetch_done(server: &mut StdioServer, token: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let view = fetch(server, token, 30);
        if view["status"] == "done" {
            return view;
        }
        assert!(Instant::now() < deadline, "{token} did not finish: {view}");
    }
}

fn run_id_of(token: &str) -> &str {
    &token[4..36]
}

/// Background Jobs are kept for the retention; tests delete theirs.
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let client = cluster::admin_client();
        for token in &self.0 {
            let name = format!("mcpk8s-{}", run_id_of(token));
            let _ = client.delete(kube::Resource::JOBS, NAMESPACE, &name);
            let _ = client.delete(kube::Resource::SECRETS, NAMESPACE, &name);
        }
    }
}

fn job_of(token: &str) -> Option<Value> {
    let name = format!("mcpk8s-{}", run_id_of(token));
    cluster::admin_client().get_if_exists(kube::Resource::JOBS, NAMESPACE, &name).unwrap()
}

/// Waits until the Job reports Complete or Failed.
fn wait_job_finished(token: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let job = job_of(token).expect("the job exists");
        let finished = job["status"]["conditions"].as_array().is_some_and(|conditions| {
            conditions.iter().any(|c| matches!(c["type"].as_str(), Some("Complete" | "Failed")) && c["status"] == "True")
        });
        if finished {
            return;
        }
        assert!(Instant::now() < deadline, "job of {token} did not finish: {}", job["status"]);
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn a_long_poll_returns_when_the_job_ends_and_the_result_can_be_fetched_twice() {
    let mut server = server(&[]);
    let token = submit(&mut server, "echo start; sleep 6; echo end >&2; exit 3");
    let _cleanup = Cleanup(vec![token.clone()]);
    let first = fetch(&mut server, &token, 0);
    assert_eq!(first["status"], "running", "{first}");

    let started = Instant::now();
    let (result, progress) = call(&mut server, "fetch_job", json!({"job_token": token, "wait_s": 120}));
    let done = &result["structuredContent"];
    assert!(started.elapsed() < Duration::from_secs(100), "the long-poll sat out its wait: {:?}", started.elapsed());
    assert_eq!(done["status"], "done", "{done}");
    let outcome = &done["result"];
    assert_eq!((outcome["status"].as_str(), outcome["exit_code"].as_i64()), (Some("failed"), Some(3)), "{outcome}");
    assert_eq!((outcome["stdout"].as_str(), outcome["stderr"].as_str()), (Some("start\n"), Some("end\n")));
    assert_eq!(outcome["run_id"], run_id_of(&token));
    assert!(outcome["timings"]["created_at"].is_string(), "{outcome}");
    assert!(progress.iter().any(|message| message.contains("[stderr] end")), "new output streams as progress: {progress:?}");

    let again = fetch(&mut server, &token, 0);
    assert_eq!(again["result"], *outcome, "a result can be fetched again");
    let job = job_of(&token).expect("a finished background Job is kept for the retention");
    assert_eq!(job["spec"]["ttlSecondsAfterFinished"], 3600);
    assert_eq!(job["metadata"]["annotations"]["mcp-k8s-ephemeral-job/job-token"], token);
}

#[test]
fn submit_checks_every_argument_before_creating_anything() {
    let mut server = server(&[]);
    let cases = [
        (json!({"image": "evil:1", "command": ["true"]}), "image `evil:1` is not allowed"),
        (json!({"image": BUSYBOX, "command": ["true"], "files": [{"path": "a", "content_b64": "%%%"}]}), "base64"),
        (json!({"image": BUSYBOX, "command": ["true"], "limits": {"memory": "lots"}}), "lots"),
        (json!({"image": BUSYBOX, "command": ["true"], "timeout_s": 100000}), "timeout_s"),
        (json!({"image": BUSYBOX, "command": ["true"], "files": [{"path": "../x", "content_b64": ""}]}), "../x"),
    ];
    for (arguments, expected) in cases {
        let text = tool_error(&mut server, "submit_job", arguments.clone());
        assert!(text.contains(expected), "{arguments}: {text}");
    }
    let listed = ok(&mut server, "list_jobs", json!({}));
    assert!(!listed.to_string().contains("evil"), "nothing was created: {listed}");
}

#[test]
fn unknown_and_malformed_tokens_are_refused_by_name() {
    let mut server = server(&[]);
    let unknown =
        format!("job-{}-{}", "0".repeat(32), std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs());
    let text = tool_error(&mut server, "fetch_job", json!({"job_token": unknown}));
    assert!(text.starts_with(&format!("no such job: `{unknown}` names no job")), "{text}");
    for token in ["job-nope", "../../etc"] {
        let text = tool_error(&mut server, "fetch_job", json!({"job_token": token}));
        assert!(text.starts_with(&format!("no such job: `{token}` is not a job_token this server hands out")), "{text}");
    }
    let text = tool_error(&mut server, "fetch_job", json!({"job_token": unknown, "wait_s": 121}));
    assert!(text.contains("`wait_s`"), "{text}");
}

#[test]
fn cancel_stops_the_job_and_keeps_its_partial_output() {
    let mut server = server(&[]);
    let token = submit(&mut server, "echo before-cancel; sleep 300; echo never");
    let _cleanup = Cleanup(vec![token.clone()]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !fetch(&mut server, &token, 2)["stdout"].as_str().unwrap_or_default().contains("before-cancel") {
        assert!(Instant::now() < deadline, "no output from {token}");
    }
    // cancel_job answers once the cancel is recorded and the pod deletion
    // issued; fetch_job then has the result.
    let started = Instant::now();
    let cancelled = ok(&mut server, "cancel_job", json!({"job_token": token}));
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(cancelled["cancel_requested"], true, "{cancelled}");
    let cancelled = fetch_done(&mut server, &token);
    let outcome = &cancelled["result"];
    assert_eq!((outcome["status"].as_str(), outcome["reason"].as_str()), (Some("cancelled"), Some("Cancelled")), "{outcome}");
    assert!(outcome["stdout"].as_str().unwrap().contains("before-cancel"), "{outcome}");
    assert!(!outcome["stdout"].as_str().unwrap().contains("never"), "{outcome}");

    assert_eq!(fetch(&mut server, &token, 0)["result"], *outcome, "the partial result stays fetchable");
    let text = tool_error(&mut server, "cancel_job", json!({"job_token": token}));
    assert!(text.contains("already finished"), "{text}");
    let job = job_of(&token).expect("the Job is kept");
    assert!(job["metadata"]["annotations"]["mcp-k8s-ephemeral-job/cancelled-at"].is_string(), "{job}");
    let pods = cluster::admin_client()
        .list(
            kube::Resource::PODS,
            NAMESPACE,
            &kube::ListParams { label_selector: Some(format!("mcp-k8s-ephemeral-job/run-id={}", run_id_of(&token))), field_selector: None },
        )
        .unwrap();
    let running: Vec<_> = pods.items.iter().filter(|pod| pod["metadata"]["deletionTimestamp"].is_null()).collect();
    assert!(running.is_empty(), "the pod is deleted: {running:?}");

    // A fresh server knows it was cancelled once the pod and its log are
    // gone; the output is not kept in the cluster.
    let job = job_of(&token).expect("the Job is kept");
    assert!(job["metadata"]["annotations"]["mcp-k8s-ephemeral-job/cancelled-output"].is_null(), "{job}");
    let gone_by = Instant::now() + Duration::from_secs(60);
    let selector =
        kube::ListParams { label_selector: Some(format!("mcp-k8s-ephemeral-job/run-id={}", run_id_of(&token))), field_selector: None };
    while !cluster::admin_client().list(kube::Resource::PODS, NAMESPACE, &selector).unwrap().items.is_empty() {
        assert!(Instant::now() < gone_by, "the cancelled pod did not go");
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut other = self::server(&[]);
    let seen = fetch(&mut other, &token, 30);
    assert_eq!(seen["result"]["status"], "cancelled", "{seen}");
    assert_eq!(seen["result"]["stdout"], "", "{seen}");
    assert!(seen["result"]["message"].as_str().unwrap().contains("not kept in the cluster"), "{seen}");
    assert_eq!(seen["result"]["truncated"]["stdout"], true, "{seen}");
}

/// A cancelled run whose runner holds its output for the store in the pod
/// ends without fetching it: a cancelled run keeps nothing in the store,
/// and its runner, stopped, serves nothing (nor says it holds any). The
/// server used to try the fetch again and again (some 25 s, and a note
/// that it failed) before it said `cancelled`. One run is cancelled by the
/// server that follows it, the other by a second server, which the
/// follower learns of only from the pod.
#[test]
fn a_cancelled_run_holding_output_in_its_pod_ends_without_fetching_it() {
    let outputs = crate::support::TempDir::new("cancel-held");
    let settings = [("MCP_K8S_OUTPUTS_DIR", outputs.path.to_str().unwrap())];
    let mut server = server(&settings);
    let mut other = self::server(&settings);
    let script = "head -c 2359296 /dev/urandom | base64; echo printed >&2; sleep 300";
    let tokens = [submit(&mut server, script), submit(&mut server, script)];
    let _cleanup = Cleanup(tokens.to_vec());
    for token in &tokens {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !fetch(&mut server, token, 2)["stderr"].as_str().unwrap_or_default().contains("printed") {
            assert!(Instant::now() < deadline, "no output from {token}");
        }
    }
    for (token, canceller) in tokens.iter().zip([&mut server, &mut other]) {
        let cancelled = ok(canceller, "cancel_job", json!({"job_token": token}));
        assert_eq!(cancelled["cancel_requested"], true, "{cancelled}");
    }
    for token in &tokens {
        let outcome = fetch_done(&mut server, token)["result"].clone();
        let brief =
            json!({"status": outcome["status"], "reason": outcome["reason"], "message": outcome["message"], "notes": outcome["notes"]});
        assert_eq!((outcome["status"].as_str(), outcome["reason"].as_str()), (Some("cancelled"), Some("Cancelled")), "{brief}");
        assert!(!brief.to_string().contains("could not be fetched"), "{brief}");
    }
    let log: Vec<String> = server.stderr.try_iter().filter(|line| line.contains("held output")).collect();
    assert!(log.is_empty(), "no fetch of the held output was tried: {log:?}");
}

#[test]
fn list_jobs_finds_a_lost_token() {
    let mut server = server(&[]);
    let token = submit(&mut server, "sleep 3; echo listed-job");
    let _cleanup = Cleanup(vec![token.clone()]);
    let listed = ok(&mut server, "list_jobs", json!({}));
    let entry = listed["jobs"].as_array().unwrap().iter().find(|job| job["job_token"] == token).cloned();
    let entry = entry.unwrap_or_else(|| panic!("{token} not in {listed}"));
    assert_eq!(entry["status"], "running", "{entry}");
    // The image and the program, not the arguments.
    assert_eq!(entry["command"], format!("{BUSYBOX} sh"), "{entry}");
    assert!(entry["expires_at"].as_str().unwrap().ends_with('Z'), "{entry}");

    fetch_done(&mut server, &token);
    let listed = ok(&mut server, "list_jobs", json!({}));
    let entry = listed["jobs"].as_array().unwrap().iter().find(|job| job["job_token"] == token).cloned().unwrap();
    assert_eq!((entry["status"].as_str(), entry["result_status"].as_str()), (Some("done"), Some("succeeded")), "{entry}");
}

#[test]
fn a_result_expires_after_the_retention() {
    // 60 s is the smallest retention MCP_K8S_RESULT_TTL_S accepts.
    let mut server = server(&[("MCP_K8S_RESULT_TTL_S", "60")]);
    let token = submit(&mut server, "echo soon-gone");
    let _cleanup = Cleanup(vec![token.clone()]);
    let done = fetch_done(&mut server, &token);
    assert_eq!(done["result"]["stdout"], "soon-gone\n");
    std::thread::sleep(Duration::from_secs(62));
    let text = tool_error(&mut server, "fetch_job", json!({"job_token": token}));
    assert!(text.contains("has expired"), "{text}");
    // A process that never saw it says the same, from the cluster alone,
    // once the Job's own end (its condition may trail the runner's result
    // by a second or two) is a retention ago.
    let mut other = self::server(&[("MCP_K8S_RESULT_TTL_S", "60")]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (result, _) = call(&mut other, "fetch_job", json!({"job_token": token}));
        if result["isError"] == true {
            let text = result["content"][0]["text"].as_str().unwrap();
            assert!(text.contains("has expired"), "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "still fetchable: {result}");
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_killed_server_loses_neither_running_jobs_nor_unfetched_results() {
    let mut first = server(&[]);
    let running = submit(&mut first, "sleep 10; echo long-done");
    let finished = submit(&mut first, "echo short-done; echo to-stderr >&2");
    let _cleanup = Cleanup(vec![running.clone(), finished.clone()]);
    wait_job_finished(&finished);
    assert_eq!(fetch(&mut first, &running, 0)["status"], "running");
    first.child.kill().unwrap(); // SIGKILL: no shutdown code runs.
    first.child.wait().unwrap();

    let mut second = server(&[]);
    let short = fetch_done(&mut second, &finished);
    assert_eq!((short["result"]["stdout"].as_str(), short["result"]["stderr"].as_str()), (Some("short-done\n"), Some("to-stderr\n")));
    assert_eq!(short["result"]["status"], "succeeded");
    let long = fetch_done(&mut second, &running);
    assert_eq!(long["result"]["stdout"], "long-done\n", "{long}");
    assert_eq!(long["result"]["status"], "succeeded");
}

#[test]
fn a_second_server_fetches_what_the_first_submitted() {
    let mut first = server(&[]);
    let mut second = server(&[]);
    let token = submit(&mut first, "sleep 2; echo shared");
    let _cleanup = Cleanup(vec![token.clone()]);
    let from_second = fetch_done(&mut second, &token);
    let from_first = fetch_done(&mut first, &token);
    assert_eq!(from_second["result"]["stdout"], "shared\n");
    assert_eq!(from_first["result"]["stdout"], from_second["result"]["stdout"]);
    assert_eq!(from_first["result"]["status"], from_second["result"]["status"]);
    let listed = ok(&mut second, "list_jobs", json!({}));
    assert!(listed.to_string().contains(&token), "{listed}");
}

#[test]
fn the_reaper_removes_what_a_crashed_server_left() {
    let mut crashed = server(&[]);
    let submitted = ok(
        &mut crashed,
        "submit_job",
        json!({"image": BUSYBOX, "command": ["sleep", "300"], "files": [{"path": "in.txt", "content_b64": "aGk="}]}),
    );
    let token = submitted["job_token"].as_str().unwrap().to_string();
    let _cleanup = Cleanup(vec![token.clone()]);
    crashed.child.kill().unwrap();
    crashed.child.wait().unwrap();
    // Pretend the crash happened long ago: its expiry has passed.
    let admin = cluster::admin_client();
    let name = format!("mcpk8s-{}", run_id_of(&token));
    let past = json!({"metadata": {"annotations": {"mcp-k8s-ephemeral-job/expires-at": "2020-01-01T00:00:00Z"}}});
    admin.merge_patch(kube::Resource::JOBS, NAMESPACE, &name, &past).unwrap();
    admin.merge_patch(kube::Resource::SECRETS, NAMESPACE, &name, &past).unwrap();

    let _restarted = server(&[]);
    cluster::assert_nothing_left(run_id_of(&token));
}

#[test]
fn tasks_are_background_jobs_seen_through_mcp_tasks() {
    let mut server = server(&[]);
    let params = json!({
        "name": "run_job",
        "arguments": {"image": BUSYBOX, "command": ["sh", "-c", "sleep 2; echo from-a-task"]},
        "task": {"ttl": 60000},
    });
    let (created, _) = request(&mut server, "tools/call", params);
    let task = &created["result"]["task"];
    assert_eq!(task["status"], "working", "{created}");
    assert_eq!(task["ttl"], 3_600_000);
    let task_id = task["taskId"].as_str().unwrap().to_string();
    let _cleanup = Cleanup(vec![task_id.clone()]);
    assert!(task_id.starts_with("job-"), "a task id is a job token: {task_id}");

    let (got, _) = request(&mut server, "tasks/get", json!({"taskId": task_id}));
    assert_eq!(got["result"]["taskId"], task_id, "{got}");
    let (listed, _) = request(&mut server, "tasks/list", json!({}));
    assert!(listed["result"]["tasks"].as_array().unwrap().iter().any(|task| task["taskId"] == task_id), "{listed}");

    let (result, _) = request(&mut server, "tasks/result", json!({"taskId": task_id}));
    let result = &result["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"]["stdout"], "from-a-task\n", "{result}");
    assert_eq!(result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"], task_id);
    let (got, _) = request(&mut server, "tasks/get", json!({"taskId": task_id}));
    assert_eq!(got["result"]["status"], "completed", "{got}");
    let fetched = fetch(&mut server, &task_id, 0);
    assert_eq!(fetched["result"], result["structuredContent"], "the job token view shows the same run");
    let (refused, _) = request(&mut server, "tasks/cancel", json!({"taskId": task_id}));
    assert_eq!(refused["error"]["code"], -32602, "{refused}");

    let params = json!({"name": "run_job", "arguments": {"image": BUSYBOX, "command": ["sleep", "300"]}, "task": {}});
    let (created, _) = request(&mut server, "tools/call", params);
    let long_id = created["result"]["task"]["taskId"].as_str().unwrap().to_string();
    let _cleanup_long = Cleanup(vec![long_id.clone()]);
    let (cancelled, _) = request(&mut server, "tasks/cancel", json!({"taskId": long_id}));
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    let (result, _) = request(&mut server, "tasks/result", json!({"taskId": long_id}));
    assert_eq!(result["result"]["structuredContent"]["status"], "cancelled", "{result}");
}

/// A background job waits for a full quota as it waits for capacity: in a
/// namespace whose quota admits no pod, the job is still waiting after the
/// first refusal; once the quota is raised the Job controller makes its pod
/// and the command runs. (One whose quota stays full ends `QuotaExceeded`
/// at its start timeout: `engine::run::decide`'s table.)
#[test]
fn a_background_job_waits_for_a_full_quota() {
    let namespace = &cluster::unique_name("mcp-quota-wait");
    let admin = cluster::admin_client();
    let quotas = kube::Resource { api_path: "/api/v1", plural: "resourcequotas", namespaced: true };
    let labels = json!({"pod-security.kubernetes.io/enforce": "restricted"});
    let _ = admin.create(
        kube::Resource::NAMESPACES,
        "",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}}),
    );
    let quota =
        |pods: &str| json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods"}, "spec": {"hard": {"pods": pods}}});
    let _ = admin.delete(quotas, namespace, "pods");
    admin.create(quotas, namespace, &quota("0")).expect("the quota is created");
    let admin_kubeconfig = cluster::admin_kubeconfig().display().to_string();
    // The namespace is the test's own, without deploy/'s network policies,
    // so there is no fence to wait for.
    let settings = [
        ("MCP_K8S_KUBECONFIG", admin_kubeconfig.as_str()),
        ("MCP_K8S_NAMESPACE", namespace),
        ("MCP_K8S_START_TIMEOUT_S", "90"),
        ("MCP_K8S_AWAIT_NETWORK_POLICY", "0"),
    ];
    let mut server = server(&settings);
    let token = submit(&mut server, "echo ran");
    // The Job controller's creation is refused (its FailedCreate event).
    let deadline = Instant::now() + Duration::from_secs(60);
    let job_name = format!("mcpk8s-{}", run_id_of(&token));
    let events = kube::Resource { api_path: "/api/v1", plural: "events", namespaced: true };
    loop {
        let listed = admin.list(events, namespace, &kube::ListParams::default()).expect("events are listed");
        let refused = listed.items.iter().any(|event| {
            event["involvedObject"]["name"] == job_name.as_str() && event["message"].as_str().unwrap_or_default().contains("exceeded quota")
        });
        if refused {
            break;
        }
        assert!(Instant::now() < deadline, "no quota refusal for {job_name}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let waiting = fetch(&mut server, &token, 0);
    assert_eq!(waiting["status"], "running", "a full quota is waited for: {waiting}");
    admin.delete(quotas, namespace, "pods").expect("the quota is removed");
    admin.create(quotas, namespace, &quota("10")).expect("the quota is raised");
    let done = fetch_done(&mut server, &token);
    assert_eq!((done["result"]["status"].as_str(), done["result"]["stdout"].as_str()), (Some("succeeded"), Some("ran\n")), "{done}");
    let _ = admin.delete(kube::Resource::NAMESPACES, "", namespace);
}

/// A background run waits out a late fence up to its start deadline, where
/// a `run_job` gives up at MCP_K8S_NETWORK_POLICY_WAIT_S. In a namespace of
/// the test's own with no policy yet, a `none` run_job ends
/// `NetworkPolicyNotEnforced` after the 1 s setting; a `none` background
/// run is still waiting well past it, and once the test applies a deny-all
/// policy (kube-router then refuses the pod's connections) its command
/// runs.
#[test]
fn a_background_job_waits_for_a_late_fence_up_to_its_start_deadline() {
    let namespace = &cluster::unique_name("mcp-late-fence");
    let admin = cluster::admin_client();
    let labels = json!({"pod-security.kubernetes.io/enforce": "restricted"});
    admin
        .create(
            kube::Resource::NAMESPACES,
            "",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}}),
        )
        .expect("the namespace is created");
    let _gone = NamespaceGone(namespace.clone());
    let admin_kubeconfig = cluster::admin_kubeconfig().display().to_string();
    let settings = [
        ("MCP_K8S_KUBECONFIG", admin_kubeconfig.as_str()),
        ("MCP_K8S_NAMESPACE", namespace),
        ("MCP_K8S_START_TIMEOUT_S", "90"),
        ("MCP_K8S_AWAIT_NETWORK_POLICY", "auto"),
        ("MCP_K8S_NETWORK_POLICY_WAIT_S", "1"),
    ];
    let mut server = server(&settings);
    let unfenced = ok(&mut server, "run_job", json!({"image": BUSYBOX, "command": ["echo", "ran"], "network": "none"}));
    assert_eq!(
        (unfenced["status"].as_str(), unfenced["reason"].as_str()),
        (Some("error"), Some("NetworkPolicyNotEnforced")),
        "a run_job waits only the setting's 1 s: {unfenced}"
    );
    let submitted = ok(&mut server, "submit_job", json!({"image": BUSYBOX, "command": ["sh", "-c", "echo ran"], "network": "none"}));
    let token = submitted["job_token"].as_str().expect("a token").to_string();
    let prepare_running_for = |at_least: Duration| {
        let pods = admin
            .list(
                kube::Resource::PODS,
                namespace,
                &kube::ListParams {
                    label_selector: Some(format!("mcp-k8s-ephemeral-job/run-id={}", run_id_of(&token))),
                    field_selector: None,
                },
            )
            .expect("pods are listed");
        pods.items.iter().any(|pod| {
            pod["status"]["initContainerStatuses"].as_array().into_iter().flatten().any(|status| {
                status["name"] == "prepare"
                    && status["state"]["running"]["startedAt"].as_str().and_then(started_ago).is_some_and(|ago| ago >= at_least)
            })
        })
    };
    // Three times the setting's bound, and the fence wait still holds the run.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !prepare_running_for(Duration::from_secs(3)) {
        let view = fetch(&mut server, &token, 0);
        assert_eq!(view["status"], "running", "the run is still waiting for its fence: {view}");
        assert!(Instant::now() < deadline, "the pod's prepare step never ran for 3 s: {view}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let policies = kube::Resource { api_path: "/apis/networking.k8s.io/v1", plural: "networkpolicies", namespaced: true };
    let deny_all = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny-all"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []},
    });
    admin.create(policies, namespace, &deny_all).expect("the policy is created");
    let done = fetch_done(&mut server, &token);
    assert_eq!((done["result"]["status"].as_str(), done["result"]["stdout"].as_str()), (Some("succeeded"), Some("ran\n")), "{done}");
}

/// How long ago an RFC 3339 time (`2026-12-03T10:00:00Z`) was.
fn started_ago(rfc3339: &str) -> Option<Duration> {
    let at = mcp_k8s_ephemeral_job::time::parse_rfc3339(rfc3339)?;
    std::time::SystemTime::now().duration_since(at).ok()
}

/// Deletes the test's namespace (and so everything in it) on drop.
struct NamespaceGone(String);

impl Drop for NamespaceGone {
    fn drop(&mut self) {
        let _ = cluster::admin_client().delete(kube::Resource::NAMESPACES, "", &self.0);
    }
}
