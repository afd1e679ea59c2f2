//! The server's cost as background work grows: `submit_job` runs in
//! flight at once on one server over stdio, against the fake API playing
//! the cluster and the kubelet (each Job gets a running pod whose log
//! holds the runner's frames), so the cluster is not what limits it. Per
//! level: the time until every submit is answered, the server's RSS and
//! threads while every run is in flight, then once each was looked at
//! (`fetch_job`) and so follows its log, as a `run_job` call does; its
//! peak RSS, its CPU per run
//! and the API requests per run; every run must end `succeeded` with its
//! output. It prints one markdown row per level.
//!
//! As a test it runs 1 and 10 runs; `bench/scaling` runs it with the
//! release build at 1, 10, 100 and 1,000 (`MCP_K8S_SCALING_LEVELS`).

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::engine_faults::{JOBS, NAMESPACE, PODS, end_pod_succeeded, frame_line, pod, pod_name, result_frame};
use crate::hostile_stdio::{Client, client_against_with};
use crate::support::fake_api::FakeApi;
use crate::support::faults;
use mcp_k8s_ephemeral_job::sandbox::frame::{self, Frame, Output, Started, Stream};
use serde_json::{Value, json};

/// Calls sent before their answers are awaited: under the server's
/// limit of calls in flight (256).
const SUBMIT_WINDOW: usize = 200;
/// Generous: a hang, not a slow machine, should fail it.
const WITHIN: Duration = Duration::from_secs(300);

#[test]
fn background_runs_in_flight_all_end_with_their_output_and_print_their_cost() {
    let levels: Vec<usize> = std::env::var("MCP_K8S_SCALING_LEVELS")
        .ok()
        .map(|levels| levels.split(',').filter_map(|level| level.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 10]);
    eprintln!(
        "| runs in flight | all accepted (s) | RSS in flight (MiB) | RSS, every log followed (MiB) | peak RSS (MiB) | threads in flight | threads, every log followed | CPU per run (ms) | API requests per run |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|");
    for n_runs in levels {
        let row = level(n_runs);
        eprintln!(
            "| {n_runs} | {:.2} | {:.1} | {:.1} | {:.1} | {} | {} | {:.2} | {:.1} |",
            row.accepted.as_secs_f64(),
            row.rss_in_flight_mib,
            row.rss_following_mib,
            row.peak_rss_mib,
            row.threads_in_flight,
            row.threads_following,
            row.cpu_per_run_ms,
            row.requests_per_run
        );
    }
}

struct Row {
    accepted: Duration,
    rss_in_flight_mib: f64,
    /// Once every run follows its log.
    rss_following_mib: f64,
    threads_following: u64,
    peak_rss_mib: f64,
    threads_in_flight: u64,
    cpu_per_run_ms: f64,
    requests_per_run: f64,
}

/// `n_runs` background runs at once on a fresh server, each held running
/// until every one is in flight, then ended.
fn level(n_runs: usize) -> Row {
    let limit = n_runs.clamp(1, 1000).to_string();
    let (mut client, fake, _temp) = client_against_with(
        FakeApi::start(),
        &[("MCP_K8S_MAX_CONCURRENT", &limit), ("MCP_K8S_MAX_QUEUED", &limit), ("MCP_K8S_START_TIMEOUT_S", "300")],
    );
    client.initialize();
    let cpu_before = client.cpu_seconds();

    let started = Instant::now();
    let answers = call_in_windows(&mut client, n_runs, |id| {
        let arguments = json!({"image": "busybox:1.36", "command": ["echo", format!("run {id}")]});
        (json!(id), json!({"name": "submit_job", "arguments": arguments}))
    });
    let accepted = started.elapsed();
    let tokens: Vec<String> = (0..n_runs)
        .map(|id| {
            let answer = &answers[&id.to_string()];
            answer["result"]["structuredContent"]["job_token"].as_str().unwrap_or_else(|| panic!("submit_job {id}: {answer}")).to_string()
        })
        .collect();
    let run_ids: Vec<String> = tokens.iter().map(|token| faults::run_id_of(token)).collect();

    // The kubelet: every pod runs and has written its Started frame; the
    // figures are taken once the watch has delivered every pod, and every
    // run is seen running (a run nobody looks at reads its log only at its
    // end) before anything ends.
    for run_id in &run_ids {
        wait_for("the Job", || fake.object(JOBS, &faults::job_name(run_id)).is_some());
        let name = pod_name(run_id);
        fake.set_log(NAMESPACE, &name, &frame_line(Frame::Started(Started { started_at_ms: 1 })), false);
        fake.insert(PODS, pod(run_id, json!({"running": {"startedAt": "2026-01-01T00:00:01Z"}})));
    }
    wait_for("the pod watch to deliver every pod", || fake.watch_delivered_all(PODS));
    let (rss_in_flight_mib, threads_in_flight) = (client.status_field("VmRSS") as f64 / 1024.0, client.status_field("Threads"));
    let listings = wait_until_all_running(&mut client, n_runs);
    assert_eq!(fake.count("/log?"), 0, "no run nobody looked at opened its log while it ran");

    // Then every run is looked at once while it runs: each follows its
    // log from then on, as a run_job call does all along.
    let looked = call_in_windows(&mut client, n_runs, |id| {
        (json!(format!("look-{id}")), json!({"name": "fetch_job", "arguments": {"job_token": tokens[id], "wait_s": 0}}))
    });
    assert_eq!(looked.len(), n_runs, "every run looked at");
    wait_for("every run to follow its log", || run_ids.iter().all(|run_id| fake.log_followed(NAMESPACE, &pod_name(run_id))));
    let (rss_following_mib, threads_following) = (client.status_field("VmRSS") as f64 / 1024.0, client.status_field("Threads"));

    for (id, run_id) in run_ids.iter().enumerate() {
        let name = pod_name(run_id);
        let stdout = format!("run {id}\n");
        let captured = Frame::Captured(Output { stream: Stream::Stdout, data_b64: frame::to_base64(stdout.as_bytes()) });
        fake.append_log(NAMESPACE, &name, &frame_line(captured));
        fake.append_log(NAMESPACE, &name, &frame_line(result_frame(stdout.as_bytes())));
        end_pod_succeeded(&fake, &name);
    }
    let fetched = call_in_windows(&mut client, n_runs, |id| {
        (json!(format!("fetch-{id}")), json!({"name": "fetch_job", "arguments": {"job_token": tokens[id], "wait_s": 60}}))
    });
    for id in 0..n_runs {
        let answer = &fetched[&format!("fetch-{id}")];
        let content = &answer["result"]["structuredContent"];
        assert_eq!(content["status"], "done", "fetch_job {id}: {answer}");
        assert_eq!(content["result"]["status"], "succeeded", "run {id}: {}", content["result"]);
        assert_eq!(content["result"]["stdout"], format!("run {id}\n"), "run {id}");
    }
    assert!(listings > 0, "the runs were listed");
    Row {
        accepted,
        rss_in_flight_mib,
        rss_following_mib,
        threads_following,
        // VmHWM is brought up to date lazily: it may lag the RSS sampled.
        peak_rss_mib: client.peak_rss_mib().max(rss_in_flight_mib).max(rss_following_mib),
        threads_in_flight,
        cpu_per_run_ms: (client.cpu_seconds() - cpu_before) * 1000.0 / n_runs as f64,
        requests_per_run: fake.requests().iter().filter(|request| !is_listing(request)).count() as f64 / n_runs as f64,
    }
}

/// One `tools/call` per id in 0..n, from `call(id)` (the request id and
/// the params), sent in windows: the server answers more calls in flight
/// than `MAX_CALLS_IN_FLIGHT` with an error that says to retry. The
/// answers by id, string ids without their quotes.
fn call_in_windows(client: &mut Client, n: usize, call: impl Fn(usize) -> (Value, Value)) -> HashMap<String, Value> {
    let mut answers = HashMap::new();
    for window in (0..n).collect::<Vec<usize>>().chunks(SUBMIT_WINDOW) {
        let mut raw_ids = Vec::new();
        for id in window {
            let (request_id, params) = call(*id);
            raw_ids.push(request_id.to_string());
            client.send(json!({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).to_string(), None);
        }
        answers.extend(client.wait_all(raw_ids, WITHIN));
    }
    answers
}

/// Asks `list_jobs` until every run is `running` as this server knows
/// it (seen running by its pod watch); how many times it asked.
fn wait_until_all_running(client: &mut Client, n_runs: usize) -> usize {
    let deadline = Instant::now() + WITHIN;
    for asked in 1.. {
        let id = json!(format!("list-{asked}"));
        client.send(
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "list_jobs", "arguments": {}}}).to_string(),
            None,
        );
        let answer = client.wait_all(vec![id.to_string()], WITHIN).remove(&format!("list-{asked}")).expect("an answer to list_jobs");
        let jobs = answer["result"]["structuredContent"]["jobs"].as_array().cloned().unwrap_or_else(|| panic!("list_jobs: {answer}"));
        let running = jobs.iter().filter(|job| job["phase"] == "running").count();
        if running == n_runs {
            return asked;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for every run to be seen running: {running} of {} listed running",
            jobs.len()
        );
        thread::sleep(Duration::from_millis(50));
    }
    unreachable!()
}

/// This test's own `list_jobs` calls, which are not the runs' cost.
fn is_listing(request: &crate::support::fake_api::Recorded) -> bool {
    request.method == "GET" && request.target.strip_prefix(JOBS).is_some_and(|rest| rest.starts_with('?'))
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WITHIN;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}
