//! The engine's run loop against the fake API server, for what a real
//! cluster cannot do on demand: a pod watch dropped mid-run, an API server
//! that answers 503 for a while, a log stream that breaks, 5xx while
//! deleting. The test plays the kubelet: it adds the pod, writes the
//! runner's frames into the log and ends the container.

mod support;

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use mcp_k8s_ephemeral_job::engine::cancel::CancelToken;
use mcp_k8s_ephemeral_job::engine::jobs::{Jobs, Limits};
use mcp_k8s_ephemeral_job::engine::run::{self, Ctx};
use mcp_k8s_ephemeral_job::engine::slots::Slots;
use mcp_k8s_ephemeral_job::engine::spec::{Policy, RunOutcome, RunSpec, RunStatus};
use mcp_k8s_ephemeral_job::quantity::Quantity;
use mcp_k8s_ephemeral_job::runner::frame::{self, Frame, Output, RunResult, Started, Stream};
use serde_json::{Value, json};
use support::fake_api::{FakeApi, Fault};

const NAMESPACE: &str = "live-ns";
const JOBS: &str = "/apis/batch/v1/namespaces/live-ns/jobs";
const PODS: &str = "/api/v1/namespaces/live-ns/pods";

fn policy() -> Policy {
    Policy {
        namespace: NAMESPACE.into(),
        runner_image: "runner:1".into(),
        runner_binary_path: "/mcp-k8s-ephemeral-job".into(),
        run_as_user: 65532,
        default_cpu: Quantity::parse("100m").unwrap(),
        default_memory: Quantity::parse("64Mi").unwrap(),
        max_output_bytes: 1 << 20,
        max_artifact_bytes: 1 << 20,
        start_timeout: Duration::from_secs(30),
        workdir_size_limit: Quantity::parse("1Gi").unwrap(),
        extra_env: BTreeMap::new(),
        cache: None,
        finished_ttl: Duration::from_secs(300),
        runtime_class: None,
        clone: None,
    }
}

fn spec() -> RunSpec {
    RunSpec {
        image: "busybox:1".into(),
        command: vec!["echo".into(), "hi".into()],
        files: Vec::new(),
        env: BTreeMap::new(),
        cpu_limit: None,
        memory_limit: None,
        timeout: Duration::from_secs(30),
        workdir: "/work".into(),
        artifacts: Vec::new(),
        clone: None,
    }
}

/// Starts a run on its own thread; returns its run id and the handle.
fn start_run(fake: &FakeApi) -> (String, thread::JoinHandle<RunOutcome>, support::TempDir) {
    let (client, temp) = support::connect(fake);
    let jobs = Jobs::new(Limits::new(Duration::from_secs(60), 4));
    let ctx = Ctx { client, policy: policy(), slots: Slots::new(4, 4), jobs };
    let run_id = run::new_run_id();
    let thread_run_id = run_id.clone();
    let handle = thread::spawn(move || run::run(&ctx, &spec(), &thread_run_id, &CancelToken::new(), &|_| {}));
    (run_id, handle, temp)
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

fn pod_name(run_id: &str) -> String {
    format!("mcpk8s-{run_id}-abcde")
}

/// What the kubelet would report for the pod at each step.
fn pod(run_id: &str, main_state: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(run_id), "labels": {"mcp-k8s-ephemeral-job/run-id": run_id}},
        "status": {"phase": "Running", "containerStatuses": [{"name": "main", "state": main_state}]},
    })
}

fn frame_line(frame: Frame) -> String {
    frame::encode(&frame)
}

fn result_frame(stdout: &[u8]) -> Frame {
    Frame::Result(RunResult {
        exit_code: Some(0),
        finished_at_ms: 2,
        stdout_captured_bytes: stdout.len() as u64,
        stdout_total_bytes: stdout.len() as u64,
        ..RunResult::started(1)
    })
}

/// Plays a pod that starts, prints `hi`, and exits 0.
fn play_successful_pod(fake: &FakeApi, run_id: &str) {
    wait_for("the Job", || fake.object(JOBS, &format!("mcpk8s-{run_id}")).is_some());
    let name = pod_name(run_id);
    fake.set_log(NAMESPACE, &name, "", true);
    fake.insert(PODS, pod(run_id, json!({"running": {"startedAt": "2026-01-01T00:00:01Z"}})));
    fake.set_log(NAMESPACE, &name, &frame_line(Frame::Started(Started { started_at_ms: 1 })), false);
    fake.append_log(NAMESPACE, &name, &frame_line(Frame::Output(Output { stream: Stream::Stdout, data_b64: frame::to_base64(b"hi\n") })));
    thread::sleep(Duration::from_millis(300));
    fake.append_log(NAMESPACE, &name, &frame_line(Frame::Captured(Output { stream: Stream::Stdout, data_b64: frame::to_base64(b"hi\n") })));
    fake.append_log(NAMESPACE, &name, &frame_line(result_frame(b"hi\n")));
    fake.finish_log(NAMESPACE, &name);
    fake.update(PODS, &name, |pod| {
        pod["status"]["phase"] = "Succeeded".into();
        pod["status"]["containerStatuses"][0]["state"] =
            json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-01-01T00:00:01Z", "finishedAt": "2026-01-01T00:00:02Z"}});
    });
}

fn assert_succeeded_and_cleaned(fake: &FakeApi, run_id: &str, outcome: &RunOutcome) {
    assert_eq!(outcome.status, RunStatus::Succeeded, "{}: {:?}", outcome.message, outcome.notes);
    assert_eq!(outcome.stdout, b"hi\n");
    assert!(fake.object(JOBS, &format!("mcpk8s-{run_id}")).is_none(), "the Job was deleted");
}

#[test]
fn a_pod_watch_dropped_mid_run_resumes() {
    let fake = FakeApi::start();
    fake.inject("watch=", Fault::CloseAfterEvents(1), 2);
    let (run_id, handle, _temp) = start_run(&fake);
    play_successful_pod(&fake, &run_id);
    let outcome = handle.join().unwrap();
    assert_succeeded_and_cleaned(&fake, &run_id, &outcome);
}

#[test]
fn an_api_server_answering_503_for_a_while_is_ridden_out() {
    let fake = FakeApi::start();
    fake.inject("GET /api/v1/namespaces/live-ns/pods", Fault::Status { code: 503, retry_after: None }, 3);
    let (run_id, handle, _temp) = start_run(&fake);
    play_successful_pod(&fake, &run_id);
    let outcome = handle.join().unwrap();
    assert_succeeded_and_cleaned(&fake, &run_id, &outcome);
}

#[test]
fn a_broken_log_stream_is_opened_again() {
    let fake = FakeApi::start();
    fake.inject("/log?", Fault::Status { code: 500, retry_after: None }, 2);
    let (run_id, handle, _temp) = start_run(&fake);
    play_successful_pod(&fake, &run_id);
    let outcome = handle.join().unwrap();
    assert_succeeded_and_cleaned(&fake, &run_id, &outcome);
}

#[test]
fn server_errors_while_deleting_are_retried() {
    let fake = FakeApi::start();
    fake.inject("DELETE /apis/batch/v1", Fault::Status { code: 500, retry_after: None }, 2);
    let (run_id, handle, _temp) = start_run(&fake);
    play_successful_pod(&fake, &run_id);
    let outcome = handle.join().unwrap();
    assert_succeeded_and_cleaned(&fake, &run_id, &outcome);
    assert!(fake.count("DELETE /apis/batch/v1") >= 3, "two failed deletes and one that worked");
}

#[test]
fn a_container_killed_before_its_result_is_result_lost_with_live_output() {
    let fake = FakeApi::start();
    let (run_id, handle, _temp) = start_run(&fake);
    wait_for("the Job", || fake.object(JOBS, &format!("mcpk8s-{run_id}")).is_some());
    let name = pod_name(&run_id);
    fake.insert(PODS, pod(&run_id, json!({"running": {"startedAt": "2026-01-01T00:00:01Z"}})));
    fake.set_log(
        NAMESPACE,
        &name,
        &frame_line(Frame::Output(Output { stream: Stream::Stdout, data_b64: frame::to_base64(b"partial\n") })),
        false,
    );
    thread::sleep(Duration::from_millis(300));
    fake.finish_log(NAMESPACE, &name);
    fake.update(PODS, &name, |pod| {
        pod["status"]["phase"] = "Failed".into();
        pod["status"]["containerStatuses"][0]["state"] = json!({"terminated": {"exitCode": 137, "reason": "Error"}});
    });
    let outcome = handle.join().unwrap();
    assert_eq!(outcome.status, RunStatus::Error, "{}", outcome.message);
    assert_eq!(outcome.reason, Some(mcp_k8s_ephemeral_job::engine::spec::RunReason::ResultLost));
    assert_eq!(outcome.stdout, b"partial\n");
    assert!(outcome.truncated.stdout, "lost output is flagged, never silent");
    assert_eq!(outcome.exit_code, Some(137));
}
