//! Hostile input over stdio: each attack runs against a fresh
//! server (no cluster needed: tool calls fail fast at their arguments or
//! at the missing engine), and the server must stay alive, answer every
//! request with its id or the right error, keep answering `ping`, and
//! stay under `PEAK_RSS_LIMIT_MIB` of peak RSS (VmHWM). Each attack
//! prints a markdown row on stderr; `bench/hostile-stdio` runs this suite
//! with `--nocapture` and collects them into a table.
//!
//! Timing is only checked against generous bounds (a hang, not a slow
//! machine, should fail the suite); the figures themselves are reported.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::support::fake_api::{FakeApi, Fault};
use crate::support::{TempDir, render_fixture};
use mcp_k8s_ephemeral_job::protocol::scan;
use serde_json::{Value, json};

/// The binary under attack: this build's, or `$MCP_K8S_BIN` (to measure
/// another build, such as the one before the hostile-input hardening, with the same attacks).
fn binary() -> String {
    std::env::var("MCP_K8S_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_mcp-k8s-ephemeral-job").to_string())
}
/// The server's default `MCP_K8S_MAX_MESSAGE_BYTES`.
const MAX_MESSAGE_BYTES: usize = 4 << 20;
const PEAK_RSS_LIMIT_MIB: f64 = 64.0;
/// The test hooks (`test_sleep`), for the attacks that call one: only
/// those, so that the others (and `scaling`) also run against a release
/// build (`MCP_K8S_BIN`), which refuses the setting.
const TEST_TOOLS: (&str, &str) = ("MCP_K8S_TEST_TOOLS", "1");
/// A ping answered later than this means the server hung. A ping waits
/// behind the attack in the same pipe, and a debug build reads megabytes
/// many times slower than the release build `bench/hostile-stdio` uses.
const PING_TIMEOUT: Duration = Duration::from_secs(if cfg!(debug_assertions) { 15 } else { 5 });
/// Attack requests may take longer: megabytes through a debug build.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[test]
fn max_size_ping() {
    let pad = "x".repeat(MAX_MESSAGE_BYTES - 100);
    let line = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{pad}"}}}}"#);
    // The same size in the smallest values there are: 2 bytes each.
    let zeros = format!(r#"{{"jsonrpc":"2.0","id":2,"method":"ping","params":{{"pad":[{}0]}}}}"#, "0,".repeat(MAX_MESSAGE_BYTES / 2 - 100));
    let oversize = format!(r#"{{"jsonrpc":"2.0","id":40,"method":"ping","params":{{"pad":"{}"}}}}"#, "x".repeat(2 * MAX_MESSAGE_BYTES));
    run_attack("max-size ping (4 MiB string, 4 MiB of zeros, 8 MiB line)", vec![line, zeros, oversize], |answers| {
        assert_eq!(answers["1"]["result"], json!({}));
        expect_error(&answers["2"], -32600, "more than 100000 JSON values");
        expect_error(&answers["40"], -32600, "message exceeds 4194304 bytes and was dropped");
    });
}

#[test]
fn numbers_and_ids_beyond_f64_and_i64() {
    let digits = "9".repeat(400);
    let lines = vec![
        tool_call(3, "run_job", json!({"image": "busybox:1.36", "command": ["true"]}))
            .replace("\"command\"", "\"timeout_s\":1e400,\"command\""),
        format!(r#"{{"jsonrpc":"2.0","id":{digits},"method":"ping"}}"#),
        r#"{"jsonrpc":"2.0","id":9223372036854775808,"method":"ping"}"#.to_string(),
    ];
    run_attack("1e400 and 400-digit ids", lines, |answers| {
        expect_error(&answers["3"], -32600, "the number `1e400` is outside the range of a 64-bit float");
        assert!(answers.contains_key(&"9".repeat(400)), "the 400-digit id is echoed exactly");
        expect_error(&answers["9223372036854775808"], -32600, "`id` `9223372036854775808` is an integer outside the 64-bit range");
    });
}

#[test]
fn huge_arrays_and_deep_nesting() {
    let lines = vec![
        format!(r#"{{"jsonrpc":"2.0","id":4,"method":"ping","params":{{"a":[{}0]}}}}"#, "0,".repeat(100_000)),
        format!(r#"{{"jsonrpc":"2.0","id":5,"method":"ping","params":{{"a":{}{}}}}}"#, "[".repeat(10_000), "]".repeat(10_000)),
        format!(r#"{{"jsonrpc":"2.0","id":6,"method":"ping","params":{{"a":{}}}}}"#, "[".repeat(MAX_MESSAGE_BYTES - 100)),
        format!(r#"{{"jsonrpc":"2.0","id":7,"method":"ping","params":{{"a":[{}]}}}}"#, vec!["{}"; 99_000].join(",")),
    ];
    run_attack("100k-element array, deep nesting", lines, |answers| {
        expect_error(&answers["4"], -32600, "more than 100000 JSON values");
        expect_error(&answers["5"], -32600, "nests arrays and objects more than 64 deep");
        // Never closed: not JSON, so JSON-RPC's parse error with id null.
        expect_error(&answers["null"], -32700, "parse error: expected a value at byte");
        assert_eq!(answers["7"]["result"], json!({}));
    });
}

#[test]
fn interpreter_options_as_file_names() {
    let lines = vec![
        tool_call(41, "execute_code", json!({"language": "python", "entrypoint_code": "print(1)", "entrypoint_filename": "-V"})),
        tool_call(42, "execute_code", json!({"language": "python", "entrypoint_code": "print(1)", "entrypoint_filename": "./--help"})),
    ];
    // python's image allowed, so that the call reaches the file name's
    // check (a language whose image is not allowed is refused first).
    let client = Client::start_with(&[("MCP_K8S_ALLOWED_IMAGES", "busybox:1.36,python:3.12-slim")]);
    run_attack_on(client, "interpreter options as entrypoint_filename", lines, |answers| {
        expect_tool_error(&answers["41"], "`entrypoint_filename` `-V` must not start with `-`");
        expect_tool_error(&answers["42"], "`entrypoint_filename` `--help` must not start with `-`");
    });
}

#[test]
fn duplicate_keys() {
    let lines = vec![
        r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"run_job","arguments":{"image":"evil:1","image":"busybox:1.36","command":["true"]}}}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":9,"method":"ping","id":10}"#.to_string(),
    ];
    run_attack("duplicate keys", lines, |answers| {
        expect_error(&answers["8"], -32600, "an object holds the key `image` twice");
        expect_error(&answers["10"], -32600, "an object holds the key `id` twice");
    });
}

#[test]
fn three_concurrent_max_size_tool_calls() {
    let content = base64::engine::general_purpose::STANDARD.encode(vec![7u8; 700 * 1024]);
    let arg = "a".repeat(100_000);
    let lines: Vec<String> = (11..14)
        .map(|id| {
            let command: Vec<&str> = std::iter::repeat_n(arg.as_str(), 30).collect();
            let line = tool_call(
                id,
                "run_job",
                json!({"image": "busybox:1.36", "command": command, "files": [{"path": "a", "content_b64": content}]}),
            );
            assert!(line.len() <= MAX_MESSAGE_BYTES, "{}", line.len());
            line
        })
        .collect();
    run_attack("3 concurrent max-size tools/call", lines, |answers| {
        for id in ["11", "12", "13"] {
            expect_tool_error(&answers[id], "`command` and `env` take 3000270 bytes together");
        }
    });
}

/// What held up before must keep holding: a flood of small requests is
/// served at full speed in little memory.
#[test]
fn ping_flood() {
    const N_PINGS: usize = 50_000;
    let mut client = Client::start();
    client.initialize();
    let batch: String = (0..N_PINGS).map(|n| format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ping\"}}\n", 100_000 + n)).collect();
    let started = Instant::now();
    client.send(batch.trim_end().to_string(), None);
    let answers = client.wait_all((0..N_PINGS).map(|n| (100_000 + n).to_string()).collect(), ANSWER_TIMEOUT);
    let per_second = N_PINGS as f64 / started.elapsed().as_secs_f64();
    let pings = client.ping_series(5);
    let peak = client.peak_rss_mib();
    report(&format!("ping flood ({N_PINGS} pings, {per_second:.0}/s)"), peak, &pings);
    assert_eq!(answers.len(), N_PINGS);
    assert!(answers.values().all(|answer| answer["result"] == json!({})));
    assert!(peak <= PEAK_RSS_LIMIT_MIB, "peak RSS: {peak:.1} MiB");
}

/// Calls that stay running keep their messages; past
/// `MCP_K8S_MAX_INFLIGHT_BYTES` (16 MiB) more are refused, not parked.
#[test]
fn many_long_calls_with_maximal_messages() {
    let pad = "x".repeat(MAX_MESSAGE_BYTES - 200);
    let lines: Vec<String> = (60..80)
        .map(|id| {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"test_sleep","arguments":{{"seconds":3}},"_meta":{{"pad":"{pad}"}}}}}}"#
            )
        })
        .collect();
    run_attack_on(Client::start_with(&[TEST_TOOLS]), "20 long calls of 4 MiB each", lines, |answers| {
        let served = (60..80).filter(|id| answers[&id.to_string()]["result"]["structuredContent"] == json!({"slept_ms": 3000})).count();
        let refused = (60..80).filter(|id| answers[&id.to_string()]["error"]["code"] == -32603).count();
        assert_eq!(served + refused, 20, "each call is served or refused");
        assert!(served >= 1 && refused >= 1, "served {served}, refused {refused}");
    });
}

#[test]
fn a_client_that_does_not_read_stdout() {
    let id = "i".repeat(1 << 20);
    let lines: Vec<String> = (0..200).map(|n| format!(r#"{{"jsonrpc":"2.0","id":"{n}{id}","method":"ping"}}"#)).collect();
    let mut client = Client::start();
    client.initialize();
    client.pause_reading();
    for line in &lines {
        client.send(line.clone(), None);
    }
    // Long enough for an unbounded queue to have taken everything in.
    thread::sleep(Duration::from_secs(3));
    let peak_while_blocked = client.peak_rss_mib();
    client.resume_reading();
    let answers = client.wait_all((0..200).map(|n| format!("\"{n}{id}\"")).collect(), ANSWER_TIMEOUT);
    let pings = client.ping_series(5);
    let peak = client.peak_rss_mib();
    report("stdout not read, 200 × 1 MB-id pings", peak, &pings);
    assert_eq!(answers.len(), 200, "every request answered once reading resumed");
    assert!(peak_while_blocked <= PEAK_RSS_LIMIT_MIB, "peak RSS while blocked: {peak_while_blocked:.1} MiB");
    assert!(peak <= PEAK_RSS_LIMIT_MIB, "peak RSS: {peak:.1} MiB");
}

/// Progress that a client leaves unread is dropped once the reply queue
/// is full; the responses all arrive.
#[test]
fn progress_for_a_client_that_does_not_read_is_dropped() {
    let mut client = Client::start_with(&[("MCP_K8S_MAX_REPLY_QUEUE_BYTES", "65536"), TEST_TOOLS]);
    client.initialize();
    client.pause_reading();
    let sleep = r#"{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":2,"progress_every_ms":10},"_meta":{"progressToken":"p"}}}"#;
    client.send(sleep.to_string(), None);
    let id = "i".repeat(100 << 10);
    for n in 0..8 {
        client.send(format!(r#"{{"jsonrpc":"2.0","id":"{n}{id}","method":"ping"}}"#), None);
    }
    thread::sleep(Duration::from_secs(3));
    client.resume_reading();
    let mut expected: Vec<String> = (0..8).map(|n| format!("\"{n}{id}\"")).collect();
    expected.push("50".to_string());
    let answers = client.wait_all(expected, ANSWER_TIMEOUT);
    let pings = client.ping_series(5);
    let peak = client.peak_rss_mib();
    report("stdout not read during 200 progress notifications", peak, &pings);
    assert_eq!(answers["50"]["result"]["structuredContent"], json!({"slept_ms": 2000}));
    let n_notifications = client.notifications.load(Ordering::SeqCst);
    eprintln!("progress notifications received: {n_notifications} of 200");
    assert!(n_notifications < 150, "{n_notifications} of 200 progress notifications arrived; most should have been dropped");
}

#[test]
fn oversized_env_and_args() {
    let many_env: serde_json::Map<String, Value> = (0..10_000).map(|index| (format!("V{index}"), json!("x"))).collect();
    let arg = "a".repeat(100 * 1024);
    let many_args: Vec<&str> = std::iter::repeat_n(arg.as_str(), 30).collect();
    let lines = vec![
        tool_call(21, "run_job", json!({"image": "busybox:1.36", "command": ["true"], "env": many_env})),
        tool_call(22, "run_job", json!({"image": "busybox:1.36", "command": ["true"], "env": {"BIG": "v".repeat(1 << 20)}})),
        tool_call(23, "run_job", json!({"image": "busybox:1.36", "command": many_args})),
        tool_call(24, "submit_job", json!({"image": "busybox:1.36", "command": ["true"], "env": {"A": "x\u{0}y"}})),
        tool_call(25, "run_job", json!({"image": "busybox:1.36", "command": ["x", "a".repeat(131_072)]})),
    ];
    run_attack("oversized env and args", lines, |answers| {
        expect_tool_error(&answers["21"], "`env` has 10000 variables; at most 1024");
        expect_tool_error(&answers["22"], "`env.BIG` is 1048580 bytes as `NAME=value`; Linux allows at most 131071");
        expect_tool_error(&answers["23"], "`command` and `env` take 3072270 bytes together");
        expect_tool_error(&answers["24"], "`env.A` contains a NUL byte");
        expect_tool_error(&answers["25"], "`command[1]` is 131072 bytes; Linux allows at most 131071");
    });
}

#[test]
fn allowlist_digest_bypass() {
    let images = [format!("busybox:1.36@{DIGEST}"), format!("busybox@{DIGEST}"), format!("docker.io/library/busybox:1.36@{DIGEST}")];
    let lines: Vec<String> = images
        .iter()
        .enumerate()
        .map(|(index, image)| tool_call(31 + index as i64, "run_job", json!({"image": image, "command": ["true"]})))
        .collect();
    run_attack("allowlist digest bypass", lines, |answers| {
        for (index, image) in images.iter().enumerate() {
            expect_tool_error(&answers[&(31 + index).to_string()], &format!("image `{image}` is not allowed; allowed: busybox:1.36"));
        }
    });
}

// ---------------------------------------------------------------------------

/// Starts a server, sends `lines` at once while pinging, checks every
/// answer arrived (by raw id) and hands them to `check`, then reports.
/// A server whose cluster is the fake API server, which refuses every Job
/// (422), as a cluster whose admission refuses the pods would: each run
/// ends at once, so a flood of them is as many finished runs as the client
/// can send. Returns the server and what keeps the fake alive.
fn client_against_a_refusing_cluster() -> (Client, FakeApi, TempDir) {
    let fake = FakeApi::start();
    fake.inject("POST /apis/batch/v1", Fault::Status { code: 422, retry_after: None }, usize::MAX);
    client_against(fake)
}

/// A server whose cluster is `fake`.
fn client_against(fake: FakeApi) -> (Client, FakeApi, TempDir) {
    client_against_with(fake, &[])
}

/// A server whose cluster is `fake`, with more settings.
pub(crate) fn client_against_with(fake: FakeApi, env: &[(&str, &str)]) -> (Client, FakeApi, TempDir) {
    let temp = TempDir::new("hostile-stdio-refusing");
    let ca_data = crate::support::base64(&fake.pki.ca_pem);
    let text = render_fixture("live/token.yaml", &[("SERVER", &fake.url), ("CA_DATA", &ca_data)]);
    let kubeconfig = temp.write("kubeconfig", &text);
    let mut settings = vec![("MCP_K8S_KUBECONFIG", kubeconfig.to_str().unwrap_or_default()), ("MCP_K8S_NAMESPACE", "live-ns")];
    settings.extend_from_slice(env);
    let client = Client::start_with(&settings);
    (client, fake, temp)
}

/// 2,000 task-augmented `run_job` calls, each refused by the cluster: every
/// one is answered (as the tool's own result), and what they leave behind
/// stays bounded.
#[test]
fn two_thousand_task_augmented_runs_the_cluster_refuses() {
    let (client, fake, _temp) = client_against_a_refusing_cluster();
    let lines: Vec<String> = (0..2_000)
        .map(|id| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "run_job", "task": {"ttl": 60_000},
                "arguments": {"image": "busybox:1.36", "command": ["echo", format!("run {id}")]},
            }})
            .to_string()
        })
        .collect();
    run_attack_on(client, "2,000 task-augmented run_job calls, each refused by the cluster", lines, |answers| {
        let answered = answers.values().filter(|answer| answer.get("result").is_some() || answer.get("error").is_some()).count();
        assert_eq!(answered, 2_000);
    });
    assert!(fake.count("POST /apis/batch/v1") >= 1, "the runs reached the cluster");
}

/// 1,000 `tasks/get` for tasks that do not exist, with ids of every shape.
#[test]
fn a_thousand_forged_task_gets() {
    let (client, _fake, _temp) = client_against(FakeApi::start());
    let lines: Vec<String> = (0..1_000)
        .map(|id| {
            let task_id = match id % 4 {
                0 => format!("mcpk8s-{id:032x}"),
                1 => "x".repeat(10_000),
                2 => format!("../../{id}"),
                _ => format!("job-{id}.{}", "A".repeat(200)),
            };
            json!({"jsonrpc": "2.0", "id": id, "method": "tasks/get", "params": {"taskId": task_id}}).to_string()
        })
        .collect();
    run_attack_on(client, "1,000 forged tasks/get", lines, |answers| {
        assert!(answers.values().all(|answer| answer["error"]["code"].is_i64()), "each is an error");
    });
}

fn run_attack(name: &str, lines: Vec<String>, check: impl FnOnce(&HashMap<String, Value>)) {
    run_attack_on(Client::start(), name, lines, check);
}

fn run_attack_on(mut client: Client, name: &str, lines: Vec<String>, check: impl FnOnce(&HashMap<String, Value>)) {
    client.initialize();
    let mut expected = Vec::new();
    for line in lines {
        // A duplicate `id` is answered with the last one, as the scan saw it.
        expected.push(raw_id_of(&line).unwrap_or_else(|| "null".to_string()));
        client.send(line, None);
    }
    // Pings go behind the attack in the same pipe: each is answered only
    // after the server has read (and refused) what came before it.
    let pings = client.ping_series(5);
    let answers = client.wait_all(expected.clone(), ANSWER_TIMEOUT);
    let peak = client.peak_rss_mib();
    report(name, peak, &pings);
    for id in &expected {
        assert!(answers.contains_key(id), "no answer for id {}", &id[..id.len().min(40)]);
    }
    check(&answers);
    assert!(client.is_alive(), "the server died");
    assert!(peak <= PEAK_RSS_LIMIT_MIB, "{name}: peak RSS {peak:.1} MiB over {PEAK_RSS_LIMIT_MIB} MiB");
}

fn report(name: &str, peak_mib: f64, pings: &[Duration]) {
    let mut millis: Vec<f64> = pings.iter().map(|ping| ping.as_secs_f64() * 1000.0).collect();
    millis.sort_by(f64::total_cmp);
    let max = millis.last().copied().unwrap_or(f64::NAN);
    let median = millis.get(millis.len() / 2).copied().unwrap_or(f64::NAN);
    eprintln!("| {name} | {peak_mib:.1} | {max:.1} | {median:.1} |");
}

fn tool_call(id: i64, name: &str, arguments: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}).to_string()
}

fn expect_error(answer: &Value, code: i64, message: &str) {
    assert_eq!(answer["error"]["code"], code, "{answer}");
    let text = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(text.contains(message), "`{text}` should contain `{message}`");
    assert!(text.len() < 500, "errors quote little of the input: {} bytes", text.len());
}

fn expect_tool_error(answer: &Value, message: &str) {
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains(message), "`{text}` should contain `{message}`");
    assert!(text.len() < 500, "errors quote little of the input: {} bytes", text.len());
}

/// One answer: its raw id, when it was read, and the message itself when
/// it is small enough to keep (answers to huge ids are only counted).
struct Answer {
    raw_id: String,
    at: Instant,
    value: Value,
}

/// The server and the threads that feed its stdin and read its stdout.
pub(crate) struct Client {
    child: Child,
    outbound: Option<Sender<(String, Option<String>)>>,
    /// When each ping (by raw id) was fully written to the pipe.
    written: Arc<Mutex<HashMap<String, Instant>>>,
    answers: Receiver<Answer>,
    reading: Arc<AtomicBool>,
    /// Notifications read (they are not kept).
    notifications: Arc<AtomicUsize>,
    /// Answers received but not yet asked for.
    seen: HashMap<String, Answer>,
    /// Lines the server's supervisor wrote for a thread's panic.
    pub(crate) panics_logged: Arc<AtomicUsize>,
    n_pings: u64,
}

impl Client {
    fn start() -> Client {
        Client::start_with(&[])
    }

    fn start_with(env: &[(&str, &str)]) -> Client {
        let mut command = Command::new(binary());
        command
            .env_clear()
            // Most attacks need no backend; a server without one refuses
            // to start unless it is told to wait for one.
            .env("MCP_K8S_LAZY_BACKEND", "1")
            .env("MCP_K8S_ALLOWED_IMAGES", "busybox:1.36,python:3.12-slim")
            .env("MCP_K8S_LOG_LEVEL", "warning");
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("the binary starts");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        // Logs are drained so a chatty server never blocks on them; the
        // supervisor's panic lines are counted.
        let panics_logged = Arc::new(AtomicUsize::new(0));
        {
            let panics_logged = Arc::clone(&panics_logged);
            thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains("thread stopped by a panic") {
                        panics_logged.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
        let written = Arc::new(Mutex::new(HashMap::new()));
        let (outbound, lines) = mpsc::channel();
        {
            let written = Arc::clone(&written);
            thread::spawn(move || write_lines(stdin, &lines, &written));
        }
        let reading = Arc::new(AtomicBool::new(true));
        let notifications = Arc::new(AtomicUsize::new(0));
        let (sender, answers) = mpsc::channel();
        {
            let (reading, notifications) = (Arc::clone(&reading), Arc::clone(&notifications));
            thread::spawn(move || read_answers(stdout, &sender, &reading, &notifications));
        }
        Client {
            child,
            outbound: Some(outbound),
            written,
            answers,
            reading,
            notifications,
            seen: HashMap::new(),
            panics_logged,
            n_pings: 0,
        }
    }

    pub(crate) fn initialize(&mut self) {
        let initialize = r#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"hostile","version":"1"}}}"#;
        self.send(initialize.to_string(), None);
        self.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_string(), None);
        let answers = self.wait_all(vec!["\"init\"".to_string()], ANSWER_TIMEOUT);
        assert_eq!(answers["init"]["result"]["protocolVersion"], "2025-11-25");
    }

    /// Queues a line for stdin; `ping_id` records when it was written.
    pub(crate) fn send(&self, line: String, ping_id: Option<String>) {
        let outbound = self.outbound.as_ref().expect("stdin open");
        outbound.send((line, ping_id)).expect("the writer thread runs");
    }

    /// `n` pings one after another; each must be answered within
    /// `PING_TIMEOUT` of reaching the pipe. Returns their latencies.
    fn ping_series(&mut self, n: usize) -> Vec<Duration> {
        let mut latencies = Vec::new();
        for _ in 0..n {
            self.n_pings += 1;
            let raw_id = format!("\"ping-{}\"", self.n_pings);
            self.send(format!(r#"{{"jsonrpc":"2.0","id":{raw_id},"method":"ping"}}"#), Some(raw_id.clone()));
            let answer = self.wait_one(&raw_id, ANSWER_TIMEOUT);
            assert_eq!(answer.value["result"], json!({}), "ping answered");
            let written = self.written.lock().unwrap().get(&raw_id).copied().expect("the ping was written");
            let latency = answer.at.saturating_duration_since(written);
            assert!(latency < PING_TIMEOUT, "ping took {latency:?}: the server hung");
            latencies.push(latency);
            thread::sleep(Duration::from_millis(20));
        }
        latencies
    }

    fn wait_one(&mut self, raw_id: &str, timeout: Duration) -> Answer {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(answer) = self.seen.remove(raw_id) {
                return answer;
            }
            let wait = deadline.saturating_duration_since(Instant::now());
            let answer = self.answers.recv_timeout(wait).unwrap_or_else(|_| panic!("no answer for {} within {timeout:?}", short(raw_id)));
            self.seen.insert(answer.raw_id.clone(), answer);
        }
    }

    /// The answers to `raw_ids`, keyed by id without quotes for strings
    /// (`"1"` for id 1 and for id "1" alike; tests use one or the other).
    pub(crate) fn wait_all(&mut self, raw_ids: Vec<String>, timeout: Duration) -> HashMap<String, Value> {
        raw_ids
            .into_iter()
            .map(|raw_id| {
                let answer = self.wait_one(&raw_id, timeout);
                (raw_id.trim_matches('"').to_string(), answer.value)
            })
            .collect()
    }

    fn pause_reading(&self) {
        self.reading.store(false, Ordering::SeqCst);
    }

    fn resume_reading(&self) {
        self.reading.store(true, Ordering::SeqCst);
    }

    fn is_alive(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }

    /// VmHWM, the peak resident set of the server so far.
    pub(crate) fn peak_rss_mib(&self) -> f64 {
        self.status_field("VmHWM") as f64 / 1024.0
    }

    /// A number of the server's `/proc/<pid>/status` (`VmRSS` in kB, `Threads`).
    pub(crate) fn status_field(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("/proc/<pid>/status");
        let line = status.lines().find(|line| line.split(':').next() == Some(field)).unwrap_or_else(|| panic!("a {field} line"));
        line.split_whitespace().nth(1).and_then(|number| number.parse().ok()).unwrap_or_else(|| panic!("{field}: a number"))
    }

    /// The server's CPU time so far (user and system), in seconds.
    pub(crate) fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).expect("/proc/<pid>/stat");
        // The fields after the command name, which is in parentheses.
        let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        let ticks: u64 = fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        // USER_HZ is 100 on Linux.
        ticks as f64 / 100.0
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.outbound = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_lines(mut stdin: ChildStdin, lines: &Receiver<(String, Option<String>)>, written: &Mutex<HashMap<String, Instant>>) {
    for (line, ping_id) in lines {
        // Recorded before the write: the answer may be read before the
        // write call returns. A ping is a few bytes, so this is when it
        // reaches the pipe, unless the pipe is full, when waiting for the
        // server to read on is part of what the ping measures.
        if let Some(ping_id) = ping_id {
            written.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(ping_id, Instant::now());
        }
        let sent = stdin.write_all(line.as_bytes()).and_then(|()| stdin.write_all(b"\n")).and_then(|()| stdin.flush());
        if sent.is_err() {
            return;
        }
    }
}

fn read_answers(stdout: impl std::io::Read, answers: &Sender<Answer>, reading: &AtomicBool, notifications: &AtomicUsize) {
    let mut reader = BufReader::new(stdout);
    loop {
        while !reading.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(10));
        }
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let at = Instant::now();
        let line = line.trim_end();
        // The library's own scan finds the raw id, also one serde_json
        // cannot hold (400 digits).
        let Some(raw_id) = raw_id_of(line) else {
            notifications.fetch_add(1, Ordering::SeqCst);
            continue;
        };
        let keep = raw_id.len() < 1024 && line.len() < (4 << 20);
        let value = if keep { serde_json::from_str(line).unwrap_or(Value::Null) } else { Value::Null };
        if answers.send(Answer { raw_id, at, value }).is_err() {
            return;
        }
    }
}

/// The raw `id` of a message as the library's scan finds it, also when
/// it refuses the message (an id serde_json cannot hold, a duplicate key).
fn raw_id_of(line: &str) -> Option<String> {
    let id = match scan::scan(line, &scan::LIMITS) {
        Ok(scanned) => scanned.id,
        Err(error) if !error.kind.is_syntax() => error.id,
        Err(_) => None,
    };
    id.map(|id| id.text.to_string())
}

fn short(text: &str) -> &str {
    &text[..text.len().min(40)]
}
