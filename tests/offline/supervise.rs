//! Panics in the server's own threads, seen through the binary. The test
//! hook `MCP_K8S_TEST_PANIC_THREAD=<kind>` makes the first thread of that
//! kind panic as it starts (inside `supervise::spawn`, so the real
//! supervisor handles it), and the server must say so: one `error` line
//! naming the thread, `mcp_k8s_thread_panics_total{thread="<kind>"}` up
//! from 0 to 1, and, for an essential thread (the reaper, a pool's
//! manager, the stdio threads), a `/readyz` that fails naming it. A
//! helper's panic (a connection) leaves `/readyz` ready.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::TempDir;
use crate::support::fake_api::FakeApi;
use crate::support::render_fixture;
use crate::support::server::{HttpServer, StdioServer};

const INJECTED: &str = "panic injected by MCP_K8S_TEST_PANIC_THREAD";

/// A server whose cluster is `fake`, with `env` on top.
fn against(fake: &FakeApi, env: &[(&str, &str)]) -> (HttpServer, TempDir) {
    let temp = TempDir::new("supervise");
    let ca_data = crate::support::base64(&fake.pki.ca_pem);
    let kubeconfig = temp.write("kubeconfig", &render_fixture("live/token.yaml", &[("SERVER", &fake.url), ("CA_DATA", &ca_data)]));
    let mut all_env = vec![("MCP_K8S_KUBECONFIG", kubeconfig.to_str().unwrap_or_default()), ("MCP_K8S_NAMESPACE", "live-ns")];
    all_env.extend_from_slice(env);
    (HttpServer::start(&all_env), temp)
}

/// `mcp_k8s_thread_panics_total{thread="<kind>"}`, `None` when `/metrics` has no such series.
fn panics_counted(server: &HttpServer, kind: &str) -> Option<u64> {
    let metrics = server.request("GET", "/metrics", &[], "");
    assert_eq!(metrics.status, 200);
    let prefix = format!("mcp_k8s_thread_panics_total{{thread=\"{kind}\"}} ");
    metrics.body.lines().find_map(|line| line.strip_prefix(&prefix)).map(|count| count.parse().expect("a count"))
}

fn is_panic_line(line: &str, thread: &str) -> Option<Value> {
    let log: Value = serde_json::from_str(line).expect("stderr lines are JSON");
    (log["msg"] == "thread stopped by a panic" && log["thread"] == thread).then_some(log)
}

/// The supervisor's line for `thread`, from `earlier` lines or the next
/// ones on `stderr` (within 10 s); panics when none comes.
fn panic_line(earlier: &[String], stderr: &Receiver<String>, thread: &str) -> Value {
    if let Some(log) = earlier.iter().find_map(|line| is_panic_line(line, thread)) {
        return log;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let wait = deadline.saturating_duration_since(Instant::now());
        let line = stderr.recv_timeout(wait).unwrap_or_else(|_| panic!("no `thread stopped by a panic` line for {thread}"));
        if let Some(log) = is_panic_line(&line, thread) {
            return log;
        }
    }
}

/// `/readyz`, asked once the panic line is seen: the supervisor records
/// the panic (its count, a lost essential thread) before it writes the
/// line, on the thread that panicked.
fn readyz(server: &HttpServer) -> (u16, String) {
    let readyz = server.request("GET", "/readyz", &[], "");
    (readyz.status, readyz.body)
}

fn assert_logged(log: &Value, kind: &str, essential: bool) {
    assert_eq!(log["level"], "error", "{log}");
    assert_eq!(log["kind"], kind, "{log}");
    assert_eq!(log["essential"], essential, "{log}");
    assert_eq!(log["message"], INJECTED, "{log}");
}

#[test]
fn without_a_panic_readyz_is_ready_and_every_started_kind_counts_zero() {
    let fake = FakeApi::start();
    let (server, _temp) = against(&fake, &[]);
    assert_eq!(readyz(&server), (200, "ready\n".to_string()));
    assert_eq!(panics_counted(&server, "reaper"), Some(0));
    assert_eq!(panics_counted(&server, "signals"), Some(0));
    assert_eq!(panics_counted(&server, "http-connection"), Some(0));
    let lines: Vec<String> = server.startup_log.iter().cloned().chain(server.stderr.try_iter()).collect();
    assert!(lines.iter().all(|line| !line.contains("thread stopped by a panic")), "{lines:#?}");
}

#[test]
fn a_panic_in_the_reaper_is_logged_counted_and_fails_readyz() {
    let fake = FakeApi::start();
    let (server, _temp) = against(&fake, &[("MCP_K8S_TEST_PANIC_THREAD", "reaper")]);
    assert_logged(&panic_line(&server.startup_log, &server.stderr, "reaper"), "reaper", true);
    assert_eq!(readyz(&server), (503, "essential thread stopped by a panic: reaper\n".to_string()));
    assert_eq!(panics_counted(&server, "reaper"), Some(1));
    // Alive, and still serving: only readiness says something is wrong.
    assert_eq!(server.request("GET", "/healthz", &[], "").status, 200);
    server.initialize();
}

#[test]
fn a_panic_in_a_pool_manager_fails_readyz_naming_the_pool() {
    let fake = FakeApi::start();
    let temp = TempDir::new("supervise-pools");
    let pools = json!([{"name": "quick", "image": "busybox:1.36", "network": "open", "size": 1, "max_idle_s": 300}]);
    let pools_file = temp.write("pools.json", &pools.to_string());
    let (server, _temp) = against(
        &fake,
        &[
            ("MCP_K8S_TEST_PANIC_THREAD", "pool"),
            ("MCP_K8S_ALLOWED_IMAGES", "busybox:1.36"),
            ("MCP_K8S_WARM_POOLS", pools_file.to_str().unwrap_or_default()),
        ],
    );
    assert_logged(&panic_line(&server.startup_log, &server.stderr, "pool-quick"), "pool", true);
    assert_eq!(readyz(&server), (503, "essential thread stopped by a panic: pool-quick\n".to_string()));
    assert_eq!(panics_counted(&server, "pool"), Some(1));
    assert_eq!(panics_counted(&server, "reaper"), Some(0));
}

#[test]
fn a_panic_in_a_connection_thread_is_logged_and_counted_and_readyz_stays_ready() {
    // A backend that answers: without one, `/readyz` is 503 for that.
    let fake = FakeApi::start();
    let (server, _temp) = against(&fake, &[("MCP_K8S_TEST_PANIC_THREAD", "http-connection")]);
    // The first connection's thread panics before it reads: closed unanswered.
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = write!(stream, "GET /healthz HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", server.addr);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    assert_logged(&panic_line(&server.startup_log, &server.stderr, "http-connection"), "http-connection", false);
    assert_eq!(panics_counted(&server, "http-connection"), Some(1));
    assert_eq!(readyz(&server), (200, "ready\n".to_string()));
}

#[test]
fn a_panic_in_the_stdio_reader_is_logged_as_essential() {
    let server = StdioServer::start(&[("MCP_K8S_TEST_PANIC_THREAD", "stdio-reader")]);
    assert_logged(&panic_line(&[], &server.stderr, "stdio-reader"), "stdio-reader", true);
}

/// The pod watch every run shares dies (a panic in its thread, injected
/// before its body): the run watching it starts a new one and ends as it
/// would have, instead of going blind until its hard deadline.
#[test]
fn a_run_whose_pod_watch_dies_watches_again_and_succeeds() {
    use crate::engine_faults::{JOBS, is_pod_list, play_successful_pod, wait_for};
    let (mut client, fake, _temp) =
        crate::hostile_stdio::client_against_with(FakeApi::start(), &[("MCP_K8S_TEST_PANIC_THREAD", "pod-watch")]);
    client.initialize();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "run_job", "arguments": {"image": "busybox:1.36", "command": ["echo", "hi"], "timeout_s": 60},
    }});
    client.send(call.to_string(), None);
    wait_for("the Job", || !fake.names(JOBS).is_empty());
    let job = fake.names(JOBS).pop().expect("the Job");
    play_successful_pod(&fake, job.trim_start_matches("mcpk8s-"));
    let answer = client.wait_all(vec!["1".into()], Duration::from_secs(60)).remove("1").expect("an answer");
    assert_eq!(answer["result"]["structuredContent"]["status"], "succeeded", "{answer}");
    let pod_lists = fake.requests().iter().filter(|request| request.method == "GET" && is_pod_list(&request.target)).count();
    assert_eq!(pod_lists, 1, "the first watch died before it listed; the second listed the pods");
    assert_eq!(client.panics_logged.load(std::sync::atomic::Ordering::SeqCst), 1, "the injected panic fired");
}
