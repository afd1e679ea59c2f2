//! Every caller limit against every tool that starts something: a call
//! a limit refuses is refused on each path (run_job, submit_job,
//! execute_code, open_sandbox by image and by language, a call in a
//! sandbox, a task of run_job or execute_code, a call with an idempotency
//! key), names the limit, and creates or changes nothing on the cluster.
//!
//! The cluster is the fake API server, so each request the server makes
//! is seen; the two named sites are both that server.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::fake_api::FakeApi;
use crate::support::server::{HttpResponse, HttpServer, INITIALIZE, raw_request_within};
use crate::support::{TempDir, render_fixture};

/// The tool calls that start something, as `(label, tools/call params)`.
fn entry_points() -> Vec<(&'static str, Value)> {
    let python = json!({"image": "python:3.12-slim", "command": ["true"]});
    let code = json!({"language": "python", "entrypoint_code": "print(1)"});
    vec![
        ("run_job", json!({"name": "run_job", "arguments": python})),
        ("submit_job", json!({"name": "submit_job", "arguments": python})),
        ("execute_code", json!({"name": "execute_code", "arguments": code})),
        ("open_sandbox image", json!({"name": "open_sandbox", "arguments": {"image": "python:3.12-slim"}})),
        ("open_sandbox language", json!({"name": "open_sandbox", "arguments": {"language": "python"}})),
        (
            "run_job in a sandbox",
            json!({"name": "run_job", "arguments": {"command": ["true"], "sandbox": "0123456789abcdef0123456789abcdef"}}),
        ),
        ("run_job task", json!({"name": "run_job", "arguments": python, "task": {"ttl": 60_000}})),
        ("execute_code task", json!({"name": "execute_code", "arguments": code, "task": {"ttl": 60_000}})),
        (
            "run_job with a key",
            json!({"name": "run_job", "arguments": {"image": "python:3.12-slim", "command": ["true"], "idempotency_key": "k-1"}}),
        ),
    ]
}

/// A kubeconfig for `fake` in `dir` (namespace `live-ns`): its path.
fn kubeconfig_of(fake: &FakeApi, dir: &TempDir) -> String {
    let ca_data = crate::support::base64(&fake.pki.ca_pem);
    let text = render_fixture("live/token.yaml", &[("SERVER", &fake.url), ("CA_DATA", &ca_data)]);
    dir.write("kubeconfig", &text).display().to_string()
}

/// A server on `fake` that allows busybox alone, with `extra` settings.
/// The fake cluster never runs a pod: what was let through gives up after
/// the shortest start timeout and removes what it made.
fn busybox_server(fake: &FakeApi, dir: &TempDir, extra: &[(&str, &str)]) -> HttpServer {
    let kubeconfig = kubeconfig_of(fake, dir);
    let mut env = vec![
        ("MCP_K8S_KUBECONFIG", kubeconfig.as_str()),
        ("MCP_K8S_NAMESPACE", "live-ns"),
        ("MCP_K8S_ALLOWED_IMAGES", "busybox:1.36"),
        ("MCP_K8S_START_TIMEOUT_S", "5"),
    ];
    env.extend_from_slice(extra);
    HttpServer::start(&env)
}

fn sha256_hex(token: &str) -> String {
    let output = std::process::Command::new("sh").arg("-c").arg(format!("printf %s '{token}' | sha256sum")).output().unwrap();
    String::from_utf8(output.stdout).unwrap().split_whitespace().next().unwrap().to_string()
}

/// What the server asked the cluster to create, change or delete so far.
fn changes(fake: &FakeApi) -> Vec<String> {
    fake.requests()
        .into_iter()
        .filter(|request| request.method != "GET")
        .map(|request| format!("{} {}", request.method, request.target))
        .collect()
}

struct Caller<'a> {
    server: &'a HttpServer,
    token: String,
    session: String,
    next_id: std::cell::Cell<u64>,
}

impl<'a> Caller<'a> {
    fn open(server: &'a HttpServer, token: &str) -> Caller<'a> {
        let post = |session: Option<&str>, body: &str| {
            let mut headers = vec![("Content-Type", "application/json"), ("Accept", "application/json"), ("X-MCP-AUTH", token)];
            if let Some(session) = session {
                headers.push(("Mcp-Session-Id", session));
            }
            server.request("POST", "/mcp", &headers, body)
        };
        let opened = post(None, INITIALIZE);
        assert_eq!(opened.status, 200, "{}", opened.body);
        let session = opened.header("mcp-session-id").expect("a session").to_string();
        assert_eq!(post(Some(&session), r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).status, 202);
        Caller { server, token: token.to_string(), session, next_id: std::cell::Cell::new(1) }
    }

    fn call(&self, params: &Value) -> HttpResponse {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string();
        let headers = [
            ("Content-Type", "application/json"),
            ("Accept", "application/json"),
            ("X-MCP-AUTH", self.token.as_str()),
            ("Mcp-Session-Id", self.session.as_str()),
        ];
        self.server.request("POST", "/mcp", &headers, &body)
    }

    fn cpu_seconds_used(&self) -> f64 {
        let described = self.call(&json!({"name": "describe_environment", "arguments": {}})).json();
        described["result"]["structuredContent"]["caller"]["cpu_seconds_last_hour"].as_f64().unwrap_or_default()
    }
}

/// The refusal's words: a JSON-RPC error's message, or a tool error's text.
fn refusal_text(response: &Value) -> Option<String> {
    if let Some(message) = response["error"]["message"].as_str() {
        return Some(message.to_string());
    }
    let result = &response["result"];
    (result["isError"] == true).then(|| result["content"][0]["text"].as_str().unwrap_or_default().to_string())
}

#[test]
fn every_caller_limit_refuses_every_entry_point_before_the_cluster() {
    let (fake, dir) = (FakeApi::start(), TempDir::new("admission-table"));
    let kubeconfig = kubeconfig_of(&fake, &dir);
    let sites = json!([
        {"name": "eu", "default": true, "backend": "kubernetes", "kubeconfig": kubeconfig, "namespace": "live-ns"},
        {"name": "us", "backend": "kubernetes", "kubeconfig": kubeconfig, "namespace": "live-ns"},
    ]);
    let sites = dir.write("sites.json", &sites.to_string()).display().to_string();
    // (caller, its limit as the tokens file writes it, the limit's name)
    let limits = [
        ("images", json!({"images": ["busybox:1.36"]}), "images"),
        ("sites", json!({"sites": ["us"]}), "sites"),
        ("tools", json!({"tools": ["describe_environment"]}), "tools"),
        // Foreground runs only: a task is a background run, as submit_job's.
        ("foreground", json!({"tools": ["run_job", "execute_code", "open_sandbox", "describe_environment"]}), "tools"),
        ("one-at-a-time", json!({"concurrent_runs": 1}), "concurrent_runs"),
        ("one-cpu-second", json!({"cpu_seconds_per_hour": 1}), "cpu_seconds_per_hour"),
    ];
    let file: Vec<Value> = limits
        .iter()
        .map(|(name, limit, _)| {
            let mut entry = json!({"name": name, "token_sha256": sha256_hex(&format!("{name}-secret"))});
            entry.as_object_mut().unwrap().extend(limit.as_object().unwrap().clone());
            entry
        })
        .collect();
    let tokens = dir.write("tokens.json", &Value::from(file).to_string()).display().to_string();
    let server = HttpServer::start(&[
        ("MCP_K8S_SITES", &sites),
        ("MCP_K8S_AUTH_TOKENS_FILE", &tokens),
        ("MCP_K8S_ALLOWED_IMAGES", "busybox:1.36,python:3.12-slim"),
    ]);

    // The counted limits are used up first, by a background run each that
    // the fake cluster never starts (so it stays in flight).
    let holding = json!({"name": "submit_job", "arguments": {"image": "busybox:1.36", "command": ["true"], "limits": {"cpu": "4"}}});
    for name in ["one-at-a-time", "one-cpu-second"] {
        let held = Caller::open(&server, &format!("{name}-secret")).call(&holding).json();
        assert!(held["result"]["structuredContent"]["job_token"].is_string(), "{name}: {held}");
    }
    let spender = Caller::open(&server, "one-cpu-second-secret");
    let deadline = Instant::now() + Duration::from_secs(60);
    while spender.cpu_seconds_used() < 1.0 {
        assert!(Instant::now() < deadline, "the held run never used a CPU-second");
        std::thread::sleep(Duration::from_millis(100));
    }

    for (name, _, limit) in &limits {
        let caller = Caller::open(&server, &format!("{name}-secret"));
        for (entry, params) in entry_points() {
            if *limit == "images" && entry == "run_job in a sandbox" {
                // A call in a sandbox runs the sandbox's image, admitted
                // when this caller opened it (the rows above).
                continue;
            }
            if *name == "foreground" && !["submit_job", "run_job task", "execute_code task"].contains(&entry) {
                continue;
            }
            let before = changes(&fake);
            let response = caller.call(&params);
            let refused = refusal_text(&response.json())
                .unwrap_or_else(|| panic!("caller `{name}`, {entry}: not refused: {} {}", response.status, response.body));
            assert!(refused.contains(&format!("its limit `{limit}`")), "caller `{name}`, {entry}: {refused}");
            assert_eq!(changes(&fake), before, "caller `{name}`, {entry}: the refused call reached the cluster");
        }
    }
}

/// Openings at once in one process never pass the sandbox limit together:
/// each counts the open sandboxes and creates its own in turn, so eight at
/// once against a limit of two create two.
#[test]
fn concurrent_openings_create_no_more_sandboxes_than_the_limit() {
    let (fake, dir) = (FakeApi::start(), TempDir::new("admission-openings"));
    let server = busybox_server(&fake, &dir, &[("MCP_K8S_MAX_SANDBOXES", "2")]);
    let session = server.initialize();
    let answers: Vec<Value> = std::thread::scope(|scope| {
        let openings: Vec<_> = (0..8)
            .map(|id| {
                let (addr, session) = (&server.addr, &session);
                scope.spawn(move || {
                    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                        "params": {"name": "open_sandbox", "arguments": {"image": "busybox:1.36"}}});
                    let headers = [("Content-Type", "application/json"), ("Accept", "application/json"), ("Mcp-Session-Id", session)];
                    let wait = Duration::from_secs(60);
                    raw_request_within(addr, "POST", "/mcp", &headers, body.to_string().as_bytes(), wait).json()
                })
            })
            .collect();
        openings.into_iter().map(|opening| opening.join().unwrap()).collect()
    });
    let creates = fake.requests().iter().filter(|request| request.method == "POST" && request.target.contains("/jobs")).count();
    assert_eq!(creates, 2, "eight openings at once against MCP_K8S_MAX_SANDBOXES=2");
    let limited = answers.iter().filter(|answer| answer["result"]["structuredContent"]["reason"] == "SandboxLimit").count();
    assert_eq!(limited, 6, "{answers:?}");
}

/// One allowlist for every path that starts an image: with busybox alone
/// allowed, a python image or the python language is refused on each path
/// before the cluster is asked, and busybox goes through on each.
#[test]
fn the_image_allowlist_holds_on_every_path() {
    let (fake, dir) = (FakeApi::start(), TempDir::new("allowlist-paths"));
    let server = busybox_server(&fake, &dir, &[]);
    let session = server.initialize();
    let next_id = std::cell::Cell::new(1);
    let call = |params: Value| {
        let id = next_id.get();
        next_id.set(id + 1);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string();
        let headers = [("Content-Type", "application/json"), ("Accept", "application/json"), ("Mcp-Session-Id", session.as_str())];
        raw_request_within(&server.addr, "POST", "/mcp", &headers, body.as_bytes(), Duration::from_secs(60)).json()
    };
    let code = |language: &str| json!({"language": language, "entrypoint_code": "print(1)"});
    // (path, a call it refuses, what the refusal says, a call it lets through)
    let paths = [
        (
            "run_job",
            json!({"name": "run_job", "arguments": {"image": "python:3.12-slim", "command": ["true"]}}),
            "is not allowed",
            Some(json!({"name": "run_job", "arguments": {"image": "busybox:1.36", "command": ["true"]}})),
        ),
        (
            "submit_job",
            json!({"name": "submit_job", "arguments": {"image": "python:3.12-slim", "command": ["true"]}}),
            "is not allowed",
            Some(json!({"name": "submit_job", "arguments": {"image": "busybox:1.36", "command": ["true"]}})),
        ),
        ("execute_code", json!({"name": "execute_code", "arguments": code("python")}), "is not in MCP_K8S_ALLOWED_IMAGES", None),
        (
            "execute_code task",
            json!({"name": "execute_code", "arguments": code("python"), "task": {"ttl": 60_000}}),
            "is not in MCP_K8S_ALLOWED_IMAGES",
            None,
        ),
        (
            "open_sandbox image",
            json!({"name": "open_sandbox", "arguments": {"image": "python:3.12-slim"}}),
            "is not allowed",
            Some(json!({"name": "open_sandbox", "arguments": {"image": "busybox:1.36"}})),
        ),
        (
            "open_sandbox language",
            json!({"name": "open_sandbox", "arguments": {"language": "python"}}),
            "is not in MCP_K8S_ALLOWED_IMAGES",
            None,
        ),
    ];
    for (path, refused_call, says, allowed_call) in paths {
        let before = changes(&fake);
        let answer = call(refused_call);
        let refused = refusal_text(&answer).unwrap_or_else(|| panic!("{path}: not refused: {answer}"));
        assert!(refused.contains(says), "{path}: {refused}");
        assert_eq!(changes(&fake), before, "{path}: a refused image reached the cluster");
        if let Some(allowed_call) = allowed_call {
            call(allowed_call);
            let created = changes(&fake).len() - before.len();
            assert!(created > 0, "{path}: an allowed image was never created");
        }
    }
    // Nothing lists what cannot run.
    let listed = call(json!({"name": "describe_environment", "arguments": {}}));
    assert_eq!(listed["result"]["structuredContent"]["languages"], json!([]), "{listed}");
}
