//! The server under test as a process: start the built binary over stdio or
//! HTTP and talk to it with nothing but std (a raw HTTP/1.1 client, so tests
//! control every header, including Host). It knows no cluster and no fake
//! API server; `cluster::server` combines this with the real cluster.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_mcp-k8s-ephemeral-job");

/// What `tools/list` names with `MCP_K8S_TEST_TOOLS=1`: the real tools in
/// their order, then the test hooks.
pub const TOOLS_WITH_TEST_HOOKS: [&str; 12] = [
    "describe_environment",
    "run_job",
    "execute_code",
    "submit_job",
    "fetch_job",
    "cancel_job",
    "list_jobs",
    "open_sandbox",
    "close_sandbox",
    "list_sandboxes",
    "test_sleep",
    "test_panic",
];

pub const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}"#;

/// The binary with a clean environment plus `env`: tests never depend on
/// the developer's `MCP_K8S_*` settings. `MCP_K8S_LAZY_BACKEND=1` unless
/// `env` says otherwise: most tests of the protocol and the transports
/// need no backend, and a server without one refuses to start by default.
pub fn command(env: &[(&str, &str)]) -> Command {
    command_of(BIN, env)
}

/// `command` for another build of the server (a benchmark's static one).
pub fn command_of(binary: &str, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(binary);
    command.env_clear();
    command.env("MCP_K8S_LAZY_BACKEND", "1");
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

/// `MCP_K8S_NETWORK_DEFAULT` for the Docker tiers' servers when the test
/// run sets `MCP_K8S_TEST_NETWORK_DEFAULT`: `tests/podman/run` asks for
/// `none`, as Podman's bridge cannot make the `open` network (no
/// `enable_icc`), and the server rightly refuses `open` there.
pub fn network_default_override() -> Option<(&'static str, String)> {
    std::env::var("MCP_K8S_TEST_NETWORK_DEFAULT").ok().filter(|mode| !mode.is_empty()).map(|mode| ("MCP_K8S_NETWORK_DEFAULT", mode))
}

/// Lines from a pipe, readable with a timeout.
pub fn line_channel(pipe: impl Read + Send + 'static) -> Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { return };
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        thread::sleep(Duration::from_millis(20));
    }
    None
}

pub fn send_signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on our own child's pid has no memory effects.
    let result = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    assert_eq!(result, 0, "kill failed");
}

// ---------------------------------------------------------------------------
// stdio

pub struct StdioServer {
    pub child: Child,
    /// On drop, close stdin and let it stop (up to a minute) before the
    /// kill: for servers that clean up when they stop (warm pools).
    pub stop_gently: bool,
    stdin: Option<ChildStdin>,
    stdout: Receiver<String>,
    pub stderr: Receiver<String>,
}

impl StdioServer {
    pub fn start(env: &[(&str, &str)]) -> StdioServer {
        let mut child =
            command(env).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("the binary starts");
        let stdout = line_channel(child.stdout.take().unwrap());
        let stderr = line_channel(child.stderr.take().unwrap());
        let stdin = child.stdin.take();
        StdioServer { child, stop_gently: false, stdin, stdout, stderr }
    }

    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    pub fn send_bytes(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// The next stdout line as JSON; every stdout line must be JSON.
    pub fn recv(&self) -> Value {
        self.recv_within(Duration::from_secs(10))
    }

    /// `recv` with a longer or shorter wait, for calls that run real pods.
    /// The next message if one comes within `wait`.
    pub fn try_recv_within(&self, wait: Duration) -> Option<Value> {
        let line = self.stdout.recv_timeout(wait).ok()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|_| panic!("stdout carried a non-JSON line: {line}")))
    }

    pub fn recv_within(&self, wait: Duration) -> Value {
        let line = self.stdout.recv_timeout(wait).unwrap_or_else(|_| panic!("no message within {wait:?}"));
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("stdout carried a non-JSON line: {line}"))
    }

    /// Messages until the response with `id`, inclusive.
    pub fn recv_until_response(&self, id: &Value) -> Vec<Value> {
        let mut messages = Vec::new();
        loop {
            let message = self.recv();
            let done = message.get("id") == Some(id);
            messages.push(message);
            if done {
                return messages;
            }
        }
    }

    pub fn nothing_within(&self, wait: Duration) -> Option<String> {
        self.stdout.recv_timeout(wait).ok()
    }

    /// Initializes the server and gathers what it tells an agent about
    /// where runs go: the instructions, `run_job`'s title and `network`
    /// enum in `tools/list`, and `describe_environment`'s network modes and
    /// namespace.
    pub fn backend_words(&mut self) -> Value {
        self.send(INITIALIZE);
        let instructions = self.recv()["result"]["instructions"].clone();
        self.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        self.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        let listed = self.recv_within(Duration::from_secs(30));
        let tools = listed["result"]["tools"].as_array().cloned().unwrap_or_default();
        let run_job = tools.into_iter().find(|tool| tool["name"] == "run_job").unwrap_or_else(|| panic!("no run_job in {listed}"));
        self.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"describe_environment","arguments":{}}}"#);
        let described = self.recv_within(Duration::from_secs(30))["result"]["structuredContent"].clone();
        serde_json::json!({
            "instructions": instructions,
            "run_job_title": run_job["title"],
            "network_enum": run_job["inputSchema"]["properties"]["network"]["enum"],
            "described_modes": described["network"]["modes"],
            "namespace": described["namespace"],
        })
    }

    pub fn initialize(&mut self) {
        self.send(INITIALIZE);
        let response = self.recv();
        assert_eq!(response["result"]["protocolVersion"], "2025-11-25");
        self.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }
}

impl Drop for StdioServer {
    fn drop(&mut self) {
        if self.stop_gently {
            self.stdin = None;
            let _ = wait_exit(&mut self.child, Duration::from_secs(60));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// HTTP

pub struct HttpServer {
    pub child: Child,
    pub addr: String,
    /// The log lines before `listening`, which `start` read to find it.
    pub startup_log: Vec<String>,
    pub stderr: Receiver<String>,
}

impl HttpServer {
    /// Starts on an ephemeral loopback port and learns it from the
    /// `listening` log line.
    pub fn start(env: &[(&str, &str)]) -> HttpServer {
        let mut all_env = vec![("MCP_K8S_TEST_TOOLS", "1")];
        all_env.extend_from_slice(env);
        HttpServer::start_binary(BIN, &all_env)
    }

    /// `start` for another build, without the test hooks (a release build
    /// refuses them).
    pub fn start_binary(binary: &str, env: &[(&str, &str)]) -> HttpServer {
        let mut all_env = vec![("MCP_K8S_TRANSPORT", "http"), ("MCP_K8S_ADDR", "127.0.0.1:0")];
        all_env.extend_from_slice(env);
        let mut child = command_of(binary, &all_env).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let stderr = line_channel(child.stderr.take().unwrap());
        // Built before the address is known so that Drop kills the child
        // even when the wait below fails.
        let mut server = HttpServer { child, addr: String::new(), startup_log: Vec::new(), stderr };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.addr.is_empty() {
            let wait = deadline.saturating_duration_since(Instant::now());
            let line = server.stderr.recv_timeout(wait).expect("a listening log line");
            let log: Value = serde_json::from_str(&line).expect("stderr lines are JSON");
            if log["msg"] == "listening" {
                server.addr = log["addr"].as_str().unwrap().to_string();
            } else {
                server.startup_log.push(line);
            }
        }
        server
    }

    /// POSTs `body` on `session` from another thread, for calls that run
    /// while the test does something else. Returns the response and how
    /// long it took.
    pub fn post_in_background(&self, session: &str, body: &'static str) -> thread::JoinHandle<(HttpResponse, Duration)> {
        self.post_streaming(session, body).0
    }

    /// `post_in_background`, and a signal sent when the answer's first
    /// chunk (on a stream, its first event) has arrived: the call is in
    /// the server's hands, without guessing how long that takes.
    pub fn post_streaming(&self, session: &str, body: &'static str) -> (thread::JoinHandle<(HttpResponse, Duration)>, Receiver<()>) {
        let addr = self.addr.clone();
        let session = session.to_string();
        let (first_chunk, arrived) = mpsc::channel();
        let handle = thread::spawn(move || {
            let headers = [("Content-Type", "application/json"), ("Mcp-Session-Id", session.as_str())];
            let started = Instant::now();
            let response =
                request_signalled(&addr, ("POST", "/mcp"), &headers, body.as_bytes(), Duration::from_secs(60), Some(first_chunk));
            (response, started.elapsed())
        });
        (handle, arrived)
    }

    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> HttpResponse {
        raw_request(&self.addr, method, path, headers, body.as_bytes())
    }

    /// POST /mcp with the headers SDK clients send.
    pub fn post(&self, session: Option<&str>, body: &str) -> HttpResponse {
        let mut headers = vec![("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
        if let Some(session) = session {
            headers.push(("Mcp-Session-Id", session));
            headers.push(("MCP-Protocol-Version", "2025-11-25"));
        }
        self.request("POST", "/mcp", &headers, body)
    }

    /// Initializes a session and returns its id.
    pub fn initialize(&self) -> String {
        let response = self.post(None, INITIALIZE);
        assert_eq!(response.status, 200, "{}", response.body);
        let session = response.header("mcp-session-id").expect("a session id").to_string();
        let accepted = self.post(Some(&session), r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert_eq!(accepted.status, 202);
        session
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A legacy `GET /sse` stream, read line by line on a thread.
pub struct LegacyStream {
    lines: Receiver<String>,
    pub endpoint: String,
}

impl LegacyStream {
    pub fn open(server: &HttpServer) -> LegacyStream {
        LegacyStream::open_with(server, &[])
    }

    /// Opens the stream with `headers` (a token) added to the request.
    pub fn open_with(server: &HttpServer, headers: &[(&str, &str)]) -> LegacyStream {
        let mut stream = TcpStream::connect(&server.addr).unwrap();
        let added: String = headers.iter().map(|(name, value)| format!("{name}: {value}\r\n")).collect();
        write!(stream, "GET /sse HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n{added}\r\n", server.addr).unwrap();
        let mut legacy = LegacyStream { lines: line_channel(stream), endpoint: String::new() };
        legacy.endpoint = legacy.next_data();
        legacy
    }

    /// The next `data:` payload (chunk-size lines and other fields skipped).
    pub fn next_data(&self) -> String {
        loop {
            let line = self.lines.recv_timeout(Duration::from_secs(10)).expect("an SSE line");
            if let Some(data) = line.strip_prefix("data: ") {
                return data.to_string();
            }
        }
    }

    pub fn next_message(&self) -> Value {
        serde_json::from_str(&self.next_data()).unwrap()
    }

    /// POSTs one message to the session's endpoint; answers come on the stream.
    pub fn post(&self, server: &HttpServer, body: &str) -> HttpResponse {
        server.request("POST", &self.endpoint, &[("Content-Type", "application/json")], body)
    }
}

#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// When each body chunk arrived, relative to the request (SSE timing).
    pub chunk_times: Vec<Duration>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    /// The JSON body, or for an event stream its last event (the
    /// response follows any notifications).
    pub fn json(&self) -> Value {
        if self.header("content-type") == Some("text/event-stream") {
            return self.sse_data().pop().unwrap_or_else(|| panic!("no events: {}", self.body));
        }
        serde_json::from_str(&self.body).unwrap_or_else(|_| panic!("not JSON: {}", self.body))
    }

    /// The `data:` payloads of an event-stream body.
    pub fn sse_data(&self) -> Vec<Value> {
        self.body.lines().filter_map(|line| line.strip_prefix("data: ")).filter_map(|data| serde_json::from_str(data).ok()).collect()
    }
}

/// One request on its own connection (`Connection: close`), read to the end.
pub fn raw_request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> HttpResponse {
    raw_request_within(addr, method, path, headers, body, Duration::from_secs(20))
}

/// `raw_request` allowing `read_timeout` of silence, for calls that run pods.
pub fn raw_request_within(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    read_timeout: Duration,
) -> HttpResponse {
    request_signalled(addr, (method, path), headers, body, read_timeout, None)
}

/// `raw_request_within`, sending on `first_chunk` once the first chunk of
/// a chunked answer has arrived.
fn request_signalled(
    addr: &str,
    (method, path): (&str, &str),
    headers: &[(&str, &str)],
    body: &[u8],
    read_timeout: Duration,
    mut first_chunk: Option<mpsc::Sender<()>>,
) -> HttpResponse {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(read_timeout)).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    // A server may answer (413) before reading a large body; a failed write
    // then is expected.
    let _ = stream.write_all(body);
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status: u16 = status_line.split_whitespace().nth(1).expect("a status line").parse().unwrap();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
    }
    let header = |name: &str| headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.clone());
    let mut body = Vec::new();
    let mut chunk_times = Vec::new();
    if header("transfer-encoding").is_some_and(|value| value.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size_line = String::new();
            reader.read_line(&mut size_line).unwrap();
            let size = usize::from_str_radix(size_line.trim(), 16).expect("a chunk size");
            chunk_times.push(started.elapsed());
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
            if let Some(signal) = first_chunk.take() {
                let _ = signal.send(());
            }
        }
    } else if let Some(length) = header("content-length") {
        let mut chunk = vec![0; length.parse().unwrap()];
        reader.read_exact(&mut chunk).unwrap();
        body = chunk;
    } else {
        reader.read_to_end(&mut body).unwrap();
    }
    HttpResponse { status, headers, body: String::from_utf8(body).unwrap(), chunk_times }
}

/// Starts `pid`'s peak RSS afresh from its RSS now (Linux's
/// `clear_refs` 5), so that a later `peak_rss_kib` measures what came
/// after; returns the RSS now, in KiB.
pub fn restart_peak_rss(pid: u32) -> u64 {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("/proc clear_refs");
    status_kib(pid, "VmRSS:")
}

/// VmHWM: the peak resident set of the process so far.
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// A size line of `/proc/<pid>/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|value| value.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("a {field} line"))
}
