//! The engine's run loop against the fake API server, for what a real
//! cluster cannot do on demand: a pod watch dropped mid-run, an API server
//! that answers 503 for a while, a log stream that breaks, 5xx while
//! deleting, an outage with every stream cut and 403s after it, and the
//! shapes of the run-truth faults (a start timeout that must stay final, a restart
//! that must answer the truth at once, terminations nobody here asked
//! for, a container that could not start). The test plays the kubelet: it
//! adds the pod, writes the runner's frames into the log and ends the
//! container. Each injected fault is checked to have fired.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::fake_api::{FakeApi, Fault};
use mcp_k8s_ephemeral_job::backend::kubernetes::settings::{AwaitFence, Settings};
use mcp_k8s_ephemeral_job::backend::kubernetes::{Kubernetes, record};
use mcp_k8s_ephemeral_job::cancel::CancelToken;
use mcp_k8s_ephemeral_job::engine::background;
use mcp_k8s_ephemeral_job::engine::port::jobs::{Jobs, Limits, Phase};
use mcp_k8s_ephemeral_job::engine::port::spec::{Policy, RunOutcome, RunReason, RunSpec, RunStatus};
use mcp_k8s_ephemeral_job::engine::run::slots::Slots;
use mcp_k8s_ephemeral_job::engine::run::{self, Ctx};
use mcp_k8s_ephemeral_job::network::NetworkMode;
use mcp_k8s_ephemeral_job::quantity::Quantity;
use mcp_k8s_ephemeral_job::sandbox::frame::{self, Frame, Output, RunResult, Started, Stream};
use serde_json::{Value, json};

pub(crate) const NAMESPACE: &str = "live-ns";
pub(crate) const JOBS: &str = "/apis/batch/v1/namespaces/live-ns/jobs";
pub(crate) const PODS: &str = "/api/v1/namespaces/live-ns/pods";

fn policy() -> Policy {
    Policy {
        run_as_user: 65532,
        default_cpu: Quantity::parse("100m").unwrap(),
        default_memory: Quantity::parse("64Mi").unwrap(),
        max_output_bytes: 1 << 20,
        max_artifact_bytes: 1 << 20,
        start_timeout: Duration::from_secs(30),
        workdir_size_limit: Quantity::parse("1Gi").unwrap(),
        extra_env: BTreeMap::new(),
        cache: None,
        clone: None,
        outputs: None,
        sandboxes: Default::default(),
    }
}

fn cluster() -> Settings {
    Settings {
        namespace: NAMESPACE.into(),
        runner_image: "runner:1".into(),
        runner_binary_path: "/mcp-k8s-ephemeral-job".into(),
        finished_ttl: Duration::from_secs(300),
        runtime_class: None,
        await_network_policy: AwaitFence::NEVER,
    }
}

fn spec() -> RunSpec {
    RunSpec {
        owner: None,
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
        network: NetworkMode::Open,
    }
}

/// A fresh server process's context: its own (empty) job store.
fn new_ctx(fake: &FakeApi, start_timeout: Duration) -> (Ctx, crate::support::TempDir) {
    let (client, temp) = crate::support::connect(fake);
    let jobs = Jobs::new(Limits::new(Duration::from_secs(600), 4));
    let policy = Policy { start_timeout, ..policy() };
    (
        Ctx {
            backend: std::sync::Arc::new(Kubernetes::new(client, policy.clone(), cluster())),
            policy,
            slots: Slots::new(4, 4),
            jobs,
            site: None,
        },
        temp,
    )
}

/// Starts a run on its own thread; returns its run id and the handle.
fn start_run(fake: &FakeApi) -> (String, thread::JoinHandle<RunOutcome>, crate::support::TempDir) {
    let (ctx, temp) = new_ctx(fake, policy().start_timeout);
    let run_id = run::new_run_id();
    let thread_run_id = run_id.clone();
    let handle = thread::spawn(move || run::run(&ctx, &spec(), &thread_run_id, &CancelToken::new(), &|_| {}));
    (run_id, handle, temp)
}

pub(crate) fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn pod_name(run_id: &str) -> String {
    format!("mcpk8s-{run_id}-abcde")
}

/// What the kubelet would report for the pod at each step.
pub(crate) fn pod(run_id: &str, main_state: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(run_id), "labels": {"app.kubernetes.io/managed-by": "mcp-k8s-ephemeral-job", "mcp-k8s-ephemeral-job/run-id": run_id}},
        "status": {"phase": "Running", "containerStatuses": [{"name": "main", "state": main_state}]},
    })
}

pub(crate) fn frame_line(frame: Frame) -> String {
    frame::encode(frame::Tag::from_bytes([3; frame::TAG_BYTES]), &frame)
}

pub(crate) fn result_frame(stdout: &[u8]) -> Frame {
    Frame::Result(RunResult {
        exit_code: Some(0),
        finished_at_ms: 2,
        stdout_captured_bytes: stdout.len() as u64,
        stdout_total_bytes: stdout.len() as u64,
        ..RunResult::started(1)
    })
}

/// Plays a pod that starts, prints `hi`, and exits 0, for a run whose
/// caller waits: its log is followed while the command runs.
pub(crate) fn play_successful_pod(fake: &FakeApi, run_id: &str) {
    let name = start_pod_printing_hi(fake, run_id);
    wait_for("the log follower to have the output so far", || fake.log_followed(NAMESPACE, &name));
    end_pod_printing_hi(fake, &name);
}

/// The same pod for a background run nobody looks at: it is seen running
/// (its phase says so) and its log is read only once the pod has ended.
fn play_successful_background_pod(fake: &FakeApi, ctx: &Ctx, run_id: &str) {
    let name = start_pod_printing_hi(fake, run_id);
    wait_seen_running(ctx, run_id);
    end_pod_printing_hi(fake, &name);
}

/// Waits until the run's follower has seen its pod running.
fn wait_seen_running(ctx: &Ctx, run_id: &str) {
    wait_for(
        "the run to be seen running",
        || matches!(ctx.jobs.lookup(run_id), mcp_k8s_ephemeral_job::engine::port::jobs::Lookup::Found(view) if view.phase == Phase::Running),
    );
}

/// A running pod whose log holds the runner's start and `hi`; its name.
fn start_pod_printing_hi(fake: &FakeApi, run_id: &str) -> String {
    wait_for("the Job", || fake.object(JOBS, &format!("mcpk8s-{run_id}")).is_some());
    let name = pod_name(run_id);
    fake.set_log(NAMESPACE, &name, "", true);
    fake.insert(PODS, pod(run_id, json!({"running": {"startedAt": "2026-01-01T00:00:01Z"}})));
    fake.set_log(NAMESPACE, &name, &frame_line(Frame::Started(Started { started_at_ms: 1 })), false);
    fake.append_log(NAMESPACE, &name, &frame_line(Frame::Output(Output { stream: Stream::Stdout, data_b64: frame::to_base64(b"hi\n") })));
    name
}

fn end_pod_printing_hi(fake: &FakeApi, name: &str) {
    fake.append_log(NAMESPACE, name, &frame_line(Frame::Captured(Output { stream: Stream::Stdout, data_b64: frame::to_base64(b"hi\n") })));
    fake.append_log(NAMESPACE, name, &frame_line(result_frame(b"hi\n")));
    end_pod_succeeded(fake, name);
}

/// The container exited 0: its log ends and the pod says so.
pub(crate) fn end_pod_succeeded(fake: &FakeApi, name: &str) {
    fake.finish_log(NAMESPACE, name);
    fake.update(PODS, name, |pod| {
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
    fake.assert_fired("watch=");
}

#[test]
fn an_api_server_answering_503_for_a_while_is_ridden_out() {
    let fake = FakeApi::start();
    fake.inject("GET /api/v1/namespaces/live-ns/pods", Fault::Status { code: 503, retry_after: None }, 3);
    let (run_id, handle, _temp) = start_run(&fake);
    play_successful_pod(&fake, &run_id);
    let outcome = handle.join().unwrap();
    assert_succeeded_and_cleaned(&fake, &run_id, &outcome);
    fake.assert_fired("GET /api/v1/namespaces/live-ns/pods");
}

#[test]
fn a_broken_log_stream_is_opened_again() {
    let fake = FakeApi::start();
    fake.inject("/log?", Fault::Status { code: 500, retry_after: None }, 2);
    let (run_id, handle, _temp) = start_run(&fake);
    play_successful_pod(&fake, &run_id);
    let outcome = handle.join().unwrap();
    assert_succeeded_and_cleaned(&fake, &run_id, &outcome);
    fake.assert_fired("/log?");
}

/// Runs one after another (an agent's calls) share one pod watch: the
/// second joins the first's, still open, instead of listing every managed
/// pod again.
#[test]
fn runs_one_after_another_share_one_listed_pod_watch() {
    let fake = FakeApi::start();
    let (ctx, _temp) = new_ctx(&fake, policy().start_timeout);
    for _ in 0..2 {
        let (run_ctx, run_id) = (ctx.clone(), run::new_run_id());
        let thread_run_id = run_id.clone();
        let handle = thread::spawn(move || run::run(&run_ctx, &spec(), &thread_run_id, &CancelToken::new(), &|_| {}));
        play_successful_pod(&fake, &run_id);
        assert_succeeded_and_cleaned(&fake, &run_id, &handle.join().unwrap());
    }
    let pod_lists = fake.requests().iter().filter(|request| request.method == "GET" && is_pod_list(&request.target)).count();
    assert_eq!(pod_lists, 1, "one list of the managed pods for both runs");
}

pub(crate) fn is_pod_list(target: &str) -> bool {
    target.strip_prefix(PODS).is_some_and(|rest| rest.starts_with('?') && !rest.contains("watch="))
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
    fake.assert_fired("DELETE /apis/batch/v1");
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
    wait_for("the log follower to have the output so far", || fake.log_followed(NAMESPACE, &name));
    fake.finish_log(NAMESPACE, &name);
    fake.update(PODS, &name, |pod| {
        pod["status"]["phase"] = "Failed".into();
        pod["status"]["containerStatuses"][0]["state"] = json!({"terminated": {"exitCode": 137, "reason": "Error"}});
    });
    let outcome = handle.join().unwrap();
    assert_eq!(outcome.status, RunStatus::Error, "{}", outcome.message);
    assert_eq!(outcome.reason, Some(mcp_k8s_ephemeral_job::engine::port::spec::RunReason::ResultLost));
    assert_eq!(outcome.stdout, b"partial\n");
    assert!(outcome.truncated.stdout, "lost output is flagged, never silent");
    assert_eq!(outcome.exit_code, Some(137));
}

/// The pod ends while its log is followed, and that reading ends before
/// the runner's result (an engine that ends a followed log early): the
/// run waits for the reading's end and reads the log again, rather than
/// judge the result lost.
#[test]
fn a_reading_that_ends_before_the_result_after_the_pod_ended_is_read_again() {
    let fake = FakeApi::start();
    let (run_id, handle, _temp) = start_run(&fake);
    // The log `start_pod_printing_hi` and `end_pod_printing_hi` write; the
    // first follow stops 20 bytes before its end, in the result's line.
    let hi = || frame::to_base64(b"hi\n");
    let log = [
        frame_line(Frame::Started(Started { started_at_ms: 1 })),
        frame_line(Frame::Output(Output { stream: Stream::Stdout, data_b64: hi() })),
        frame_line(Frame::Captured(Output { stream: Stream::Stdout, data_b64: hi() })),
        frame_line(result_frame(b"hi\n")),
    ]
    .concat();
    let name = pod_name(&run_id);
    let followed = format!("/pods/{name}/log?container=main&follow=true");
    fake.inject(&followed, Fault::EndLogAfter(log.len() - 20), 1);
    // The log is there before the pod, so the first request for it follows
    // it (and takes the fault) rather than hear that the container waits.
    wait_for("the Job", || fake.object(JOBS, &format!("mcpk8s-{run_id}")).is_some());
    fake.set_log(NAMESPACE, &name, &frame_line(Frame::Started(Started { started_at_ms: 1 })), false);
    fake.append_log(NAMESPACE, &name, &frame_line(Frame::Output(Output { stream: Stream::Stdout, data_b64: hi() })));
    fake.insert(PODS, pod(&run_id, json!({"running": {"startedAt": "2026-01-01T00:00:01Z"}})));
    wait_for("the log follower to have the output so far", || fake.log_followed(NAMESPACE, &name));
    // The pod's end reaches the run before the rest of its log does.
    fake.update(PODS, &name, |pod| {
        pod["status"]["phase"] = "Succeeded".into();
        pod["status"]["containerStatuses"][0]["state"] =
            json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-01-01T00:00:01Z", "finishedAt": "2026-01-01T00:00:02Z"}});
    });
    wait_for("the pod's end to reach the run's watch", || fake.watch_delivered_all(PODS));
    end_pod_printing_hi(&fake, &name);
    let outcome = handle.join().unwrap();
    fake.assert_fired(&followed);
    assert_succeeded_and_cleaned(&fake, &run_id, &outcome);
}

/// Plays a running pod whose runner reports a SIGTERM (what it does for a
/// cancel, an eviction and a `kubectl delete pod` alike), then ends it with
/// the pod status `change` writes.
fn play_sigterm(fake: &FakeApi, run_id: &str, change: fn(&mut Value)) {
    wait_for("the Job", || fake.object(JOBS, &format!("mcpk8s-{run_id}")).is_some());
    let name = pod_name(run_id);
    fake.insert(PODS, pod(run_id, json!({"running": {"startedAt": "2026-01-01T00:00:01Z"}})));
    fake.set_log(NAMESPACE, &name, &frame_line(Frame::Started(Started { started_at_ms: 1 })), false);
    wait_for("the log follower to have the output so far", || fake.log_followed(NAMESPACE, &name));
    fake.update(PODS, &name, change);
    let result = RunResult { exit_code: None, signal: Some(15), terminated_by_request: true, finished_at_ms: 2, ..RunResult::started(1) };
    fake.append_log(NAMESPACE, &name, &frame_line(Frame::Result(result)));
    fake.finish_log(NAMESPACE, &name);
    fake.update(PODS, &name, |pod| {
        pod["status"]["phase"] = "Failed".into();
        pod["status"]["containerStatuses"][0]["state"] = json!({"terminated": {"exitCode": 143, "reason": "Error"}});
    });
}

#[test]
fn a_pod_deleted_from_outside_is_not_cancelled() {
    let fake = FakeApi::start();
    let (run_id, handle, _temp) = start_run(&fake);
    play_sigterm(&fake, &run_id, |pod| pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:03Z".into());
    let outcome = handle.join().unwrap();
    assert_eq!((outcome.status, outcome.reason), (RunStatus::Error, Some(RunReason::PodDeleted)), "{}", outcome.message);
    assert!(outcome.message.contains("other than this server"), "{}", outcome.message);
}

#[test]
fn an_eviction_is_evicted_with_the_kubelets_text() {
    let fake = FakeApi::start();
    let (run_id, handle, _temp) = start_run(&fake);
    play_sigterm(&fake, &run_id, |pod| {
        pod["status"]["reason"] = "Evicted".into();
        pod["status"]["message"] = "Usage of EmptyDir volume \"work\" exceeds the limit \"1Gi\". ".into();
    });
    let outcome = handle.join().unwrap();
    assert_eq!((outcome.status, outcome.reason), (RunStatus::Error, Some(RunReason::Evicted)), "{}", outcome.message);
    assert!(outcome.message.contains("EmptyDir volume \"work\" exceeds the limit"), "{}", outcome.message);
}

#[test]
fn a_container_the_runtime_could_not_start_is_start_failed() {
    let fake = FakeApi::start();
    let (run_id, handle, _temp) = start_run(&fake);
    wait_for("the Job", || fake.object(JOBS, &format!("mcpk8s-{run_id}")).is_some());
    let name = pod_name(&run_id);
    fake.set_log(NAMESPACE, &name, "", false);
    fake.finish_log(NAMESPACE, &name);
    let mut failed = pod(
        &run_id,
        json!({"terminated": {"exitCode": 128, "reason": "StartError",
        "message": "failed to create containerd task: failed to create shim task: OCI runtime create failed: unable to set memory limit to 64 (current usage: 2117632, peak usage: 2117632)"}}),
    );
    failed["status"]["phase"] = "Failed".into();
    fake.insert(PODS, failed);
    let outcome = handle.join().unwrap();
    assert_eq!((outcome.status, outcome.reason), (RunStatus::Error, Some(RunReason::StartFailed)), "{}", outcome.message);
    assert!(outcome.message.contains("unable to set memory limit to 64"), "{}", outcome.message);
}

/// The API server goes away mid-run (every stream
/// cut, every request failing for 3 s), then answers 403 to the next two
/// watches (cold RBAC cache) while logs stay unreadable for 8 s; meanwhile
/// the pod succeeds. The run succeeds, on a log read again from the start.
#[test]
fn an_api_outage_and_403s_after_it_do_not_fail_a_run_that_succeeds() {
    let fake = FakeApi::start();
    let (run_id, handle, _temp) = start_run(&fake);
    wait_for("the Job", || fake.object(JOBS, &format!("mcpk8s-{run_id}")).is_some());
    let name = pod_name(&run_id);
    fake.insert(PODS, pod(&run_id, json!({"running": {"startedAt": "2026-01-01T00:00:01Z"}})));
    fake.set_log(NAMESPACE, &name, &frame_line(Frame::Started(Started { started_at_ms: 1 })), false);
    fake.append_log(NAMESPACE, &name, &frame_line(Frame::Output(Output { stream: Stream::Stdout, data_b64: frame::to_base64(b"hi\n") })));
    wait_for("the log follower to have the output so far", || fake.log_followed(NAMESPACE, &name));

    // Rules match in order: the outage first, then what follows it.
    fake.inject_for("", Fault::Stall(Duration::ZERO), Duration::from_secs(3));
    fake.inject_for("/log?", Fault::Stall(Duration::ZERO), Duration::from_secs(8));
    fake.inject("watch=", Fault::Status { code: 403, retry_after: None }, 2);
    fake.cut_streams();
    // The pod finishes while the API is away.
    fake.append_log(NAMESPACE, &name, &frame_line(Frame::Captured(Output { stream: Stream::Stdout, data_b64: frame::to_base64(b"hi\n") })));
    fake.append_log(NAMESPACE, &name, &frame_line(result_frame(b"hi\n")));
    fake.finish_log(NAMESPACE, &name);
    fake.update(PODS, &name, |pod| {
        pod["status"]["phase"] = "Succeeded".into();
        pod["status"]["containerStatuses"][0]["state"] = json!({"terminated": {"exitCode": 0, "reason": "Completed"}});
    });

    let outcome = handle.join().unwrap();
    assert_succeeded_and_cleaned(&fake, &run_id, &outcome);
    assert!(fake.fired("") > 0, "the outage never hit a request");
    assert!(fake.fired("/log?") > 0, "the log outage never hit a request");
    assert!(fake.fired("watch=") > 0, "the 403s after the outage never fired");
    assert!(fake.streams_cut() >= 1, "no watch or followed log was open when the API went away");
}

fn submit(ctx: &Ctx) -> background::Submitted {
    let mut spec = spec();
    spec.image = "busybox:1".into();
    background::submit(ctx, &spec, background::TokenKind::Job, None, None, None).expect("submit_job")
}

fn fetch(ctx: &Ctx, token: &str, wait: Duration) -> mcp_k8s_ephemeral_job::engine::port::jobs::View {
    background::fetch(ctx, token, None, wait, &CancelToken::new(), &mut |_, _| {}).expect("fetch_job")
}

/// A start timeout is final. The verdict is on
/// the Job before the answer, the pod is gone and the Job cannot make
/// another; a pod that "runs anyway" afterwards changes nothing for a new
/// server process.
#[test]
fn a_start_timeout_is_final_for_every_process() {
    let fake = FakeApi::start();
    let (first, _temp) = new_ctx(&fake, Duration::from_secs(3));
    let submitted = submit(&first);
    let job_name = format!("mcpk8s-{}", submitted.run_id);
    wait_for("the Job", || fake.object(JOBS, &job_name).is_some());
    let name = pod_name(&submitted.run_id);
    let mut pending = pod(&submitted.run_id, json!({"waiting": {"reason": "PodInitializing"}}));
    pending["status"]["phase"] = "Pending".into();
    fake.insert(PODS, pending);
    fake.insert(
        "/api/v1/namespaces/live-ns/events",
        json!({"metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": name}, "reason": "Pulling", "message": "Pulling image \"busybox:1\""}),
    );

    let view = fetch(&first, &submitted.token, Duration::from_secs(30));
    let outcome = view.outcome.expect("done");
    assert_eq!(outcome.reason, Some(RunReason::StartTimeout), "{}", outcome.message);
    assert!(outcome.message.contains("still pulling the image `busybox:1`"), "{}", outcome.message);
    let job = fake.object(JOBS, &job_name).expect("a background Job is kept");
    let recorded = record::recorded(&job).expect("the verdict is on the Job");
    assert_eq!(recorded.reason, Some(RunReason::StartTimeout));
    assert_eq!(job["spec"]["activeDeadlineSeconds"], 1, "the Job controller ends it");
    assert!(fake.object(PODS, &name).is_none(), "the pending pod was deleted");

    // The kubelet "starts it anyway" (what 1b16dbf let happen).
    fake.insert(PODS, pod(&submitted.run_id, json!({"terminated": {"exitCode": 0, "reason": "Completed"}})));
    fake.set_log(NAMESPACE, &name, &frame_line(result_frame(b"")), false);
    fake.finish_log(NAMESPACE, &name);
    let (second, _temp2) = new_ctx(&fake, Duration::from_secs(3));
    let view = fetch(&second, &submitted.token, Duration::ZERO);
    let outcome = view.outcome.expect("the first fetch of a new process is done");
    assert_eq!((outcome.status, outcome.reason), (RunStatus::Error, Some(RunReason::StartTimeout)), "{}", outcome.message);
}

/// The first fetch of a restarted server answers a
/// job that finished long ago with its result, not `pending`.
#[test]
fn the_first_fetch_after_a_restart_has_the_result() {
    let fake = FakeApi::start();
    let (first, _temp) = new_ctx(&fake, Duration::from_secs(30));
    let submitted = submit(&first);
    play_successful_background_pod(&fake, &first, &submitted.run_id);
    let job_name = format!("mcpk8s-{}", submitted.run_id);
    wait_for("the verdict", || fake.object(JOBS, &job_name).is_some_and(|job| record::recorded(&job).is_some()));
    // As if the first process was SIGKILLed before it could record it.
    fake.update(JOBS, &job_name, |job| {
        job["metadata"]["annotations"].as_object_mut().unwrap().remove(record::ANNOTATION_OUTCOME);
    });

    let (second, _temp2) = new_ctx(&fake, Duration::from_secs(30));
    let view = fetch(&second, &submitted.token, Duration::ZERO);
    assert_eq!(view.phase, Phase::Finished, "the first fetch answers done");
    let outcome = view.outcome.unwrap();
    assert_eq!((outcome.status, outcome.stdout.as_slice()), (RunStatus::Succeeded, &b"hi\n"[..]), "{}", outcome.message);
    let job = fake.object(JOBS, &job_name).unwrap();
    assert_eq!(record::recorded(&job).map(|recorded| recorded.status), Some(RunStatus::Succeeded), "recorded again");
}

/// A submitted run whose pod runs and has printed `hi`, seen running by
/// its follower; the pod's name.
fn background_run_printing_hi(fake: &FakeApi) -> (Ctx, crate::support::TempDir, background::Submitted, String) {
    let (ctx, temp) = new_ctx(fake, Duration::from_secs(30));
    let submitted = submit(&ctx);
    let name = start_pod_printing_hi(fake, &submitted.run_id);
    wait_seen_running(&ctx, &submitted.run_id);
    (ctx, temp, submitted, name)
}

/// A background run nobody looks at opens no log stream while its
/// command runs (at 1,000 runs in flight, a stream each is most of the
/// server's memory); its output is read once the pod has ended, and the
/// result is whole.
#[test]
fn a_background_run_nobody_looks_at_reads_its_log_once_at_its_end() {
    let fake = FakeApi::start();
    let (ctx, _temp, submitted, name) = background_run_printing_hi(&fake);
    // The watch's next events (or ticks) would have started a follower by now.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(fake.count("/log?"), 0, "no log was opened while nobody looked");
    end_pod_printing_hi(&fake, &name);
    let view = fetch(&ctx, &submitted.token, Duration::from_secs(20));
    let outcome = view.outcome.expect("done");
    assert_eq!((outcome.status, outcome.stdout.as_slice()), (RunStatus::Succeeded, &b"hi\n"[..]), "{}", outcome.message);
    assert_eq!(fake.count("/log?"), 1, "one read, at the end");
}

/// The first look at a running background run has its output so far, as
/// if it had been followed all along, and from then on it is followed.
#[test]
fn the_first_fetch_of_a_running_background_run_has_its_output_so_far() {
    let fake = FakeApi::start();
    let (ctx, _temp, submitted, name) = background_run_printing_hi(&fake);
    let view = fetch(&ctx, &submitted.token, Duration::ZERO);
    assert_eq!((view.phase, view.stdout.as_slice()), (Phase::Running, &b"hi\n"[..]), "the output so far");
    wait_for("the log follower to have the output so far", || fake.log_followed(NAMESPACE, &name));
    end_pod_printing_hi(&fake, &name);
    let outcome = fetch(&ctx, &submitted.token, Duration::from_secs(20)).outcome.expect("done");
    assert_eq!((outcome.status, outcome.stdout.as_slice()), (RunStatus::Succeeded, &b"hi\n"[..]), "{}", outcome.message);
}

/// A verdict that could not be written onto the Job
/// (the API failed the patch) is not cached either; the next fetch reads
/// the cluster again, records it, and answers the truth.
#[test]
fn a_verdict_that_could_not_be_recorded_is_not_cached() {
    let fake = FakeApi::start();
    let (ctx, _temp) = new_ctx(&fake, Duration::from_secs(30));
    let submitted = submit(&ctx);
    let job_name = format!("mcpk8s-{}", submitted.run_id);
    fake.inject(&format!("PATCH {JOBS}/{job_name}"), Fault::Status { code: 503, retry_after: None }, 1);
    play_successful_background_pod(&fake, &ctx, &submitted.run_id);
    wait_for("the failed patch", || fake.fired(&format!("PATCH {JOBS}/{job_name}")) == 1);
    wait_for("the entry to go", || {
        matches!(ctx.jobs.lookup(&submitted.run_id), mcp_k8s_ephemeral_job::engine::port::jobs::Lookup::Missing)
    });

    let view = fetch(&ctx, &submitted.token, Duration::ZERO);
    let outcome = view.outcome.expect("done");
    assert_eq!((outcome.status, outcome.stdout.as_slice()), (RunStatus::Succeeded, &b"hi\n"[..]), "{}", outcome.message);
    let job = fake.object(JOBS, &job_name).unwrap();
    assert_eq!(record::recorded(&job).map(|recorded| recorded.status), Some(RunStatus::Succeeded));
}

/// A task-augmented call whose Job the cluster refuses (422 here) has no
/// run to make a task of: the call is answered with the tool's own result,
/// status `error` with the refusal, as the same call without a task is,
/// never as a protocol-level internal error.
#[test]
fn a_task_whose_job_the_cluster_refuses_is_answered_with_the_runs_result() {
    use mcp_k8s_ephemeral_job::config::{Config, RawConfig};
    use mcp_k8s_ephemeral_job::tools::{self, background::TaskStart};
    let fake = FakeApi::start();
    fake.inject(&format!("POST {JOBS}"), Fault::Status { code: 422, retry_after: None }, 1);
    let (engine, _temp) = new_ctx(&fake, policy().start_timeout);
    let config =
        Config::from_raw(&RawConfig::from_lookup(|name| (name == "MCP_K8S_ALLOWED_IMAGES").then(|| "busybox:1.36".into()))).unwrap();
    let ctx = tools::Ctx::new(config, Ok(engine));
    let Value::Object(arguments) = json!({"image": "busybox:1.36", "command": ["true"]}) else { unreachable!() };
    let started =
        tools::background::task_submit(&ctx, &mcp_k8s_ephemeral_job::callers::Caller::whole_server("stdio"), "run_job", &arguments, None)
            .expect("not a protocol error");
    let TaskStart::Answered(outcome) = started else { panic!("no task for a refused run: {started:?}") };
    let result = tools::result_json(outcome);
    assert_eq!(result["structuredContent"]["status"], json!("error"), "{result}");
    assert!(result["structuredContent"]["reason"].is_string(), "{result}");
    assert!(fake.fired(&format!("POST {JOBS}")) >= 1, "the 422 was served");
}

/// An idempotency key names one run for every process: a second replica
/// given the key and the same arguments answers the first's token, with
/// other arguments an error that names the key. When the key's run is made
/// between a replica's look and its create (here the look is made to miss
/// it), the create's conflict decides: the answer is the existing run, and
/// nothing of it is touched.
#[test]
fn an_idempotency_key_names_one_run_for_every_process() {
    use mcp_k8s_ephemeral_job::engine::background::idempotency::Keyed;
    let fake = FakeApi::start();
    let (first, _first_temp) = new_ctx(&fake, policy().start_timeout);
    let (second, _second_temp) = new_ctx(&fake, policy().start_timeout);
    let spec = RunSpec { image: "busybox:1".into(), ..spec() };
    let arguments = |command: &str| json!({"image": "busybox:1", "command": [command]}).as_object().cloned().unwrap();
    let keyed = Keyed::new("retry-me", "submit_job", &arguments("true")).unwrap();

    let made = background::submit(&first, &spec, background::TokenKind::Job, Some(&keyed), None, None).expect("the first submit");
    assert_eq!(made.run_id, keyed.run_id, "the key names the run");
    let again = background::submit(&second, &spec, background::TokenKind::Job, Some(&keyed), None, None).expect("the retry");
    assert_eq!(again.token, made.token, "a retry on another replica answers the first run");

    let other = Keyed::new("retry-me", "submit_job", &arguments("false")).unwrap();
    let error = background::submit(&second, &spec, background::TokenKind::Job, Some(&other), None, None).unwrap_err();
    assert!(matches!(error, background::Error::KeyReused { .. }), "{error}");
    assert!(error.to_string().contains("idempotency_key `retry-me` was already used"), "{error}");

    let job_name = format!("mcpk8s-{}", keyed.run_id);
    let look = format!("GET {JOBS}/{job_name}");
    fake.inject(&look, Fault::Status { code: 404, retry_after: None }, 1);
    let (third, _third_temp) = new_ctx(&fake, policy().start_timeout);
    let raced = background::submit(&third, &spec, background::TokenKind::Job, Some(&keyed), None, None).expect("the raced submit");
    fake.assert_fired(&look);
    assert_eq!(raced.token, made.token, "the conflict on create makes the existing run the answer");
    assert_eq!(fake.count(&format!("POST {JOBS}")), 2, "one create made the run, the raced one collided");
    let job = fake.object(JOBS, &job_name).expect("the run's Job is still there");
    assert_eq!(job["metadata"]["annotations"][record::ANNOTATION_TOKEN], made.token.as_str());
}
