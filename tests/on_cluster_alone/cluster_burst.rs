//! A burst of background jobs on the real test cluster: 60 `submit_job` at
//! once on the 2-core node, with a start timeout the burst makes tight, so
//! that some runs end `StartTimeout` ("… the command will not run"). Each
//! command's first act is to send its marker to a listener on the host.
//! Once every run has its result and none of their pods exists any more
//! (a command cannot start after its pod is gone), no run reported as not
//! run may have reached the listener, and every run that succeeded must
//! have. It guards the start deadline against a stale view of the pod: the
//! fresh look at the sandbox before a start timeout (`engine::run::decide`'s
//! `Step::ProbeSandbox`) and the runner that never starts a command after
//! the run's start deadline (`--start-deadline-ms`).
//!
//! Why it is in this binary: 60 pods on the node change the timing of
//! every other test on the cluster, and they fill the namespace's pod
//! quota (50, deploy/resourcequota.yaml).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crate::support::cluster::{self, NAMESPACE};
use crate::support::faults;
use mcp_k8s_ephemeral_job::kube;
use serde_json::{Value, json};

const N_JOBS: usize = 60;
/// The first round's start timeout, tight for the burst (the security
/// review's finding used 30 s). How far the burst spreads its starts
/// depends on the machine: measured on two, the last of 60 pods started
/// 27 s and over 30 s after its Job was created. A round in which every
/// run started, or none did, proves nothing, so the next round's deadline
/// is put inside the starts that round showed (`next_start_timeout`).
const FIRST_START_TIMEOUT_S: u64 = 20;
const MAX_ROUNDS: usize = 3;
/// The server's least `MCP_K8S_START_TIMEOUT_S`.
const LEAST_START_TIMEOUT_S: u64 = 5;
/// How long each command stays after it reached the listener, so that the
/// node is busy with running pods as well as starting ones.
const HOLD_S: u64 = 3;
/// The node's address on the pod bridge. Job pods in network mode `open`
/// reach its ephemeral ports only (tests/cluster/networkpolicy-test-node.yaml).
const NODE_ADDRESS: &str = "10.244.0.1";
const PORTS_JOB_PODS_REACH: RangeInclusive<u16> = 32768..=60999;

/// The words of a result that says the command did not run, and will not:
/// the reasons this server gives before a command starts, and the phrases
/// of their messages (the runner's own "was not started" included).
const NOT_RUN_REASONS: &[&str] = &["StartTimeout", "QuotaExceeded", "Unschedulable", "NetworkPolicyNotEnforced"];
const NOT_RUN_PHRASES: &[&str] = &["will not run", "was not started", "no pod was made"];

/// Under the burst the API's view of a pod lags its node by up to a
/// minute (`main` shown PodInitializing 60 s after its command finished),
/// so a start timeout judged on that view alone killed commands that had
/// run (5 to 27 per burst here). The fresh look at the start deadline asks
/// the node too (the main container's log, where the runner's Started
/// frame is its first line): measured here, 11 of 60 succeed and none of
/// the 49 reported as not run reached the listener.
#[test]
fn under_a_burst_no_job_reported_as_not_run_ever_ran() {
    let _turn = crate::take_turn();
    let listener = MarkerListener::start();
    let mut start_timeout_s = FIRST_START_TIMEOUT_S;
    let mut rounds_tried: Vec<String> = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let round = burst_round(&listener, start_timeout_s);
        if round.start_timeouts > 0 && round.succeeded > 0 {
            return;
        }
        rounds_tried.push(format!("{start_timeout_s} s: {} succeeded, {} StartTimeout", round.succeeded, round.start_timeouts));
        match next_start_timeout(start_timeout_s, &round) {
            Some(next) => start_timeout_s = next,
            None => break,
        }
    }
    panic!(
        "no round of the burst both ran commands and gave others up at their start deadline, so this test proved nothing \
         about a StartTimeout (start timeouts tried: {})",
        rounds_tried.join("; ")
    );
}

/// What one burst showed, for choosing the next round's deadline.
struct Round {
    succeeded: usize,
    start_timeouts: usize,
    latest_start: Option<Duration>,
}

/// The next round's start timeout, or none when no deadline is left to
/// try: where no run started, twice the last one; where every run
/// started, half the time the latest of them took, so that the deadline
/// falls inside the burst's starts.
fn next_start_timeout(tried_s: u64, round: &Round) -> Option<u64> {
    if round.succeeded == 0 {
        return Some(tried_s * 2);
    }
    if tried_s <= LEAST_START_TIMEOUT_S {
        return None;
    }
    let halfway = round.latest_start?.as_secs() / 2;
    Some(halfway.clamp(LEAST_START_TIMEOUT_S, tried_s - 1))
}

/// One burst of `N_JOBS` with `start_timeout_s`: fails on a run reported
/// as not run that ran, and on a run that succeeded without reaching the
/// listener.
fn burst_round(listener: &MarkerListener, start_timeout_s: u64) -> Round {
    let marker_prefix = faults::marker("burst");
    let markers: Vec<String> = (0..N_JOBS).map(|job_idx| format!("{marker_prefix}-{job_idx}")).collect();
    let mut server = cluster::server(&[("MCP_K8S_START_TIMEOUT_S", &start_timeout_s.to_string())]);
    let mut cleanup = faults::Cleanup(Vec::new());

    // Every submit_job at once: the server takes each call on its own thread.
    let burst_started = Instant::now();
    let mut submits: HashMap<u64, usize> = HashMap::new();
    for (job_idx, marker) in markers.iter().enumerate() {
        let script = format!(
            "reply=$(echo {marker} | nc -w 10 {NODE_ADDRESS} {port}) && [ \"$reply\" = ok ] \
             || {{ echo \"the listener did not answer: $reply\" >&2; exit 3; }}; sleep {HOLD_S}; echo done",
            port = listener.port
        );
        // Half a CPU as the limit, so that the quota's 32 CPUs of limits
        // are not what holds the burst back (at the default of 1 CPU, 16
        // of the 60 ended QuotaExceeded): its 50 pods and the node's CPU are.
        let arguments = json!({
            "image": cluster::busybox_image(),
            "command": ["sh", "-c", script],
            "network": "open",
            "timeout_s": 60,
            "limits": {"cpu": "500m"},
        });
        submits.insert(faults::send_call(&mut server, "submit_job", arguments), job_idx);
    }
    let mut tokens: Vec<Option<String>> = vec![None; N_JOBS];
    let deadline = Instant::now() + Duration::from_secs(120);
    while !submits.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{} submit_job calls unanswered within 120 s", submits.len());
        let message = server.recv_within(left);
        let Some(job_idx) = message["id"].as_u64().and_then(|id| submits.remove(&id)) else { continue };
        let result = &message["result"];
        assert_eq!(result["isError"], false, "submit_job {job_idx}: {result}");
        let token = result["structuredContent"]["job_token"].as_str().expect("a job_token").to_string();
        cleanup.0.push(faults::run_id_of(&token));
        tokens[job_idx] = Some(token);
    }
    let submitted_in = burst_started.elapsed();
    let tokens: Vec<String> = tokens.into_iter().map(|token| token.expect("every submit answered")).collect();

    // Long-polls for every job at once; one that answers `running` is asked
    // again, so each answer comes as its job ends.
    let send_fetch = |server: &mut crate::support::server::StdioServer, job_idx: usize| {
        faults::send_call(server, "fetch_job", json!({"job_token": tokens[job_idx], "wait_s": 30}))
    };
    let mut fetches: HashMap<u64, usize> = (0..N_JOBS).map(|job_idx| (send_fetch(&mut server, job_idx), job_idx)).collect();
    let mut results: Vec<Option<Value>> = vec![None; N_JOBS];
    let mut fetch_errors: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    while !fetches.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{} jobs without a result within 240 s", fetches.len());
        let message = server.recv_within(left);
        let Some(job_idx) = message["id"].as_u64().and_then(|id| fetches.remove(&id)) else { continue };
        let answer = &message["result"];
        if answer["isError"] == false && answer["structuredContent"]["status"] == "done" {
            results[job_idx] = Some(answer["structuredContent"]["result"].clone());
            continue;
        }
        if answer["isError"] != false {
            // Retried, not failed: under the burst the API may be slow.
            fetch_errors.push(format!("fetch_job {job_idx}: {answer}"));
            assert!(fetch_errors.len() <= 100, "fetch_job keeps failing: {fetch_errors:#?}");
        }
        fetches.insert(send_fetch(&mut server, job_idx), job_idx);
    }
    let burst_took = burst_started.elapsed();
    let results: Vec<Value> = results.into_iter().map(|result| result.expect("every job has a result")).collect();
    let not_run: Vec<usize> = (0..N_JOBS).filter(|job_idx| says_it_did_not_run(&results[*job_idx])).collect();
    let (succeeded, start_timeouts) = (count(&results, "status", "succeeded"), count(&results, "reason", "StartTimeout"));
    eprintln!(
        "cluster_burst: {N_JOBS} jobs, MCP_K8S_START_TIMEOUT_S={start_timeout_s}: submits answered in {:.1} s, every result in {:.1} s \
         ({} fetch_job errors retried); {succeeded} succeeded, {start_timeouts} StartTimeout, {} reported as not run in all\n{}",
        submitted_in.as_secs_f64(),
        burst_took.as_secs_f64(),
        fetch_errors.len(),
        not_run.len(),
        results_by_kind(&results),
    );

    // The server stops the pod of a run it gave up on; the test deletes
    // nothing of those before they are gone (or ended: an ended pod
    // starts nothing either, and it says whether the command ran).
    let not_run_ids: Vec<String> = not_run.iter().map(|job_idx| faults::run_id_of(&tokens[*job_idx])).collect();
    let ended_pods = wait_until_gone_or_ended(&not_run_ids, Duration::from_secs(120));
    let settled_after = burst_started.elapsed();
    // Background Jobs are kept for the retention by design: `Cleanup`
    // deletes them and waits until no Job, pod or Secret of any run is left.
    drop(cleanup);
    let all_gone_after = burst_started.elapsed();
    let arrivals = listener.arrivals_once_quiet(Duration::from_secs(30));

    // The first arrival of each marker; a second one would mean a command
    // ran twice, which the log reports.
    let mut seen: HashMap<&str, SystemTime> = HashMap::new();
    for arrival in &arrivals {
        seen.entry(arrival.marker.as_str()).or_insert(arrival.at);
    }
    let reached =
        |job_idxs: &mut dyn Iterator<Item = usize>| job_idxs.filter(|job_idx| seen.contains_key(markers[*job_idx].as_str())).count();
    eprintln!(
        "cluster_burst: the pods of the runs reported as not run gone or ended after {:.1} s, everything gone after {:.1} s; \
         the listener saw {} of {N_JOBS} markers ({} arrived more than once): {} of the {succeeded} that succeeded, \
         {} of the {} reported as not run{}",
        settled_after.as_secs_f64(),
        all_gone_after.as_secs_f64(),
        seen.len(),
        arrivals.len() - seen.len(),
        reached(&mut (0..N_JOBS).filter(|job_idx| results[*job_idx]["status"] == "succeeded")),
        reached(&mut not_run.iter().copied()),
        not_run.len(),
        latest_start_of_a_success(&results).map_or_else(String::new, |latest| format!(
            "; the latest start of a run that succeeded: {:.1} s after its Job was created",
            latest.as_secs_f64()
        )),
    );

    let ran_anyway: Vec<usize> = not_run
        .iter()
        .copied()
        .filter(|job_idx| {
            seen.contains_key(markers[*job_idx].as_str())
                || ended_pods.get(&faults::run_id_of(&tokens[*job_idx])).is_some_and(|pod| pod.succeeded)
        })
        .collect();
    if !ran_anyway.is_empty() {
        let run_ids: Vec<String> = ran_anyway.iter().map(|job_idx| faults::run_id_of(&tokens[*job_idx])).collect();
        // Their lines, and the server's warnings and errors (the first 20).
        let server_log: Vec<String> = server
            .stderr
            .try_iter()
            .filter(|line| run_ids.iter().any(|run_id| line.contains(run_id.as_str())) || !line.contains(r#""level":"info""#))
            .take(20 + 2 * run_ids.len())
            .collect();
        let described: Vec<String> = ran_anyway
            .iter()
            .map(|job_idx| {
                let run_id = faults::run_id_of(&tokens[*job_idx]);
                let pod = ended_pods.get(&run_id).map_or("gone".to_string(), |pod| pod.text.clone());
                let arrived = seen.get(markers[*job_idx].as_str()).copied();
                describe_run(*job_idx, &run_id, &results[*job_idx], start_timeout_s, arrived, &pod)
            })
            .collect();
        panic!(
            "runs reported as not run whose commands ran (they reached the listener, or their pod succeeded):\n{}\nthe server's log of them:\n{}",
            described.join("\n"),
            server_log.join("\n")
        );
    }
    let unreached: Vec<String> = (0..N_JOBS)
        .filter(|job_idx| results[*job_idx]["status"] == "succeeded" && !seen.contains_key(markers[*job_idx].as_str()))
        .map(|job_idx| format!("job {job_idx}: {}", results[job_idx]))
        .collect();
    assert!(unreached.is_empty(), "runs that succeeded never reached the listener (is the route open?):\n{}", unreached.join("\n"));
    Round { succeeded, start_timeouts, latest_start: latest_start_of_a_success(&results) }
}

/// Whether `result` says its command did not run and will not.
fn says_it_did_not_run(result: &Value) -> bool {
    let reason = result["reason"].as_str().unwrap_or_default();
    let message = result["message"].as_str().unwrap_or_default();
    NOT_RUN_REASONS.contains(&reason) || NOT_RUN_PHRASES.iter().any(|phrase| message.contains(phrase))
}

/// A run reported as not run that ran: its verdict, when its marker
/// arrived against its Job's creation (the start deadline is
/// `start_timeout_s` after it), and its pod.
fn describe_run(job_idx: usize, run_id: &str, result: &Value, start_timeout_s: u64, arrived: Option<SystemTime>, pod: &str) -> String {
    let created = result["timings"]["created_at"].as_str().and_then(mcp_k8s_ephemeral_job::time::parse_rfc3339);
    let arrival = match (arrived, created) {
        (None, _) => "no marker arrived".to_string(),
        (Some(at), None) => format!("marker at {}", mcp_k8s_ephemeral_job::log::rfc3339_utc(at)),
        (Some(at), Some(created)) => format!(
            "marker at {}, {:.1} s after the Job was created (the start deadline: {start_timeout_s} s)",
            mcp_k8s_ephemeral_job::log::rfc3339_utc(at),
            at.duration_since(created).unwrap_or_default().as_secs_f64()
        ),
    };
    format!("job {job_idx} (run {run_id}): {arrival}; result {result}; pod: {pod}")
}

/// How many results have `value` at `field`.
fn count(results: &[Value], field: &str, value: &str) -> usize {
    results.iter().filter(|result| result[field] == value).count()
}

/// One line per status and reason: how many, and one message.
fn results_by_kind(results: &[Value]) -> String {
    let mut by_kind: BTreeMap<String, (usize, &str)> = BTreeMap::new();
    for result in results {
        let kind = format!("{}/{}", result["status"].as_str().unwrap_or("?"), result["reason"].as_str().unwrap_or("-"));
        by_kind.entry(kind).or_insert((0, result["message"].as_str().unwrap_or_default())).0 += 1;
    }
    let lines: Vec<String> = by_kind.iter().map(|(kind, (n_runs, message))| format!("  {kind}: {n_runs}; e.g. {message:?}")).collect();
    lines.join("\n")
}

/// How close to its start deadline a run that ran began: the edge the
/// burst is meant to reach.
fn latest_start_of_a_success(results: &[Value]) -> Option<Duration> {
    results
        .iter()
        .filter(|result| result["status"] == "succeeded")
        .filter_map(|result| {
            let time = |field: &str| result["timings"][field].as_str().and_then(mcp_k8s_ephemeral_job::time::parse_rfc3339);
            time("started_at")?.duration_since(time("created_at")?).ok()
        })
        .max()
}

/// A pod that ended and is still there: whether it succeeded (its
/// command ran and exited 0), and what it says of its containers.
struct EndedPod {
    succeeded: bool,
    text: String,
}

/// Waits until every pod of `run_ids` is gone or ended; fails naming those
/// that are neither. Returns the ended ones, by run id.
fn wait_until_gone_or_ended(run_ids: &[String], within: Duration) -> HashMap<String, EndedPod> {
    let client = cluster::admin_client();
    let params =
        kube::ListParams { label_selector: Some("app.kubernetes.io/managed-by=mcp-k8s-ephemeral-job".into()), field_selector: None };
    let deadline = Instant::now() + within;
    loop {
        let pods = client.list(kube::Resource::PODS, NAMESPACE, &params).expect("list pods").items;
        let run_id_of = |pod: &Value| pod["metadata"]["labels"]["mcp-k8s-ephemeral-job/run-id"].as_str().unwrap_or_default().to_string();
        let ours: Vec<&Value> = pods.iter().filter(|pod| run_ids.contains(&run_id_of(pod))).collect();
        let ended = |pod: &Value| matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
        let live: Vec<String> =
            ours.iter().filter(|pod| !ended(pod)).map(|pod| format!("{} {}", pod["metadata"]["name"], pod["status"]["phase"])).collect();
        if live.is_empty() {
            return ours
                .iter()
                .map(|pod| {
                    let text = format!(
                        "{} {}; init containers {}; containers {}",
                        pod["metadata"]["name"],
                        pod["status"]["phase"],
                        pod["status"]["initContainerStatuses"],
                        pod["status"]["containerStatuses"]
                    );
                    (run_id_of(pod), EndedPod { succeeded: pod["status"]["phase"] == "Succeeded", text })
                })
                .collect();
        }
        assert!(Instant::now() < deadline, "pods of runs reported as not run still live {within:?} after every result: {live:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A marker a command sent, and when it arrived.
struct Arrival {
    marker: String,
    at: SystemTime,
}

/// A TCP listener on the node's bridge address that job pods reach: each
/// connection sends one line, its marker, which is recorded with the time
/// and answered `ok`. Stopped when dropped.
struct MarkerListener {
    port: u16,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    connections_open: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    accepting: Option<JoinHandle<()>>,
}

impl MarkerListener {
    fn start() -> MarkerListener {
        let listener = TcpListener::bind((NODE_ADDRESS, 0))
            .unwrap_or_else(|error| panic!("bind {NODE_ADDRESS}:0, the pod bridge of `tests/cluster/up`: {error}"));
        let port = listener.local_addr().expect("the listener's address").port();
        assert!(
            PORTS_JOB_PODS_REACH.contains(&port),
            "port {port} is outside the ports job pods may reach ({PORTS_JOB_PODS_REACH:?}, \
             tests/cluster/networkpolicy-test-node.yaml); see net.ipv4.ip_local_port_range"
        );
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let connections_open = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let accepting = {
            let (arrivals, connections_open, stop) = (arrivals.clone(), connections_open.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    connections_open.fetch_add(1, Ordering::SeqCst);
                    let (arrivals, connections_open) = (arrivals.clone(), connections_open.clone());
                    std::thread::spawn(move || {
                        take_marker(stream, &arrivals);
                        connections_open.fetch_sub(1, Ordering::SeqCst);
                    });
                }
            })
        };
        MarkerListener { port, arrivals, connections_open, stop, accepting: Some(accepting) }
    }

    /// Every marker received, once no connection is open (one still being
    /// read could carry a marker).
    fn arrivals_once_quiet(&self, within: Duration) -> Vec<Arrival> {
        let deadline = Instant::now() + within;
        while self.connections_open.load(Ordering::SeqCst) > 0 {
            assert!(Instant::now() < deadline, "connections to the marker listener still open after {within:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::mem::take(&mut *self.arrivals.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Drop for MarkerListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // A connection of its own wakes the accept loop to see the flag.
        let _ = TcpStream::connect((NODE_ADDRESS, self.port));
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
    }
}

/// Reads one line (at most 256 bytes, 10 s) and records it with the time
/// it arrived; answers `ok`.
fn take_marker(stream: TcpStream, arrivals: &Mutex<Vec<Arrival>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut line = String::new();
    let _ = BufReader::new((&stream).take(256)).read_line(&mut line);
    let at = SystemTime::now();
    let marker = line.trim().to_string();
    if marker.is_empty() {
        return;
    }
    arrivals.lock().unwrap_or_else(PoisonError::into_inner).push(Arrival { marker, at });
    let _ = (&stream).write_all(b"ok\n");
}
