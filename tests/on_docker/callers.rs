//! Two callers of one server over HTTP, on the Docker backend: each with
//! its own token (the tokens file keeps only their SHA-256) and its own
//! limits. Each limit refuses a run at the moment it should, naming
//! itself and when it frees up, before anything is created; one caller
//! never sees the other's runs, tokens, links or sessions; the audit
//! trail and `/metrics` name the caller.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::backend::{PYTHON, Removed, run_id_of, server_env};
use crate::BUSYBOX;
use crate::support::TempDir;
use crate::support::server::{HttpResponse, HttpServer, INITIALIZE};

const ALPHA: &str = "alpha-token-0123456789";
const BETA: &str = "beta-token-9876543210";

fn sha256_hex(text: &str) -> String {
    let output = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(text.as_bytes())?;
            child.wait_with_output()
        })
        .expect("sha256sum runs");
    String::from_utf8(output.stdout).unwrap().split_whitespace().next().unwrap().to_string()
}

/// One caller's session on the server.
struct As<'a> {
    server: &'a HttpServer,
    token: &'static str,
    session: String,
    next_id: u64,
}

impl<'a> As<'a> {
    fn open(server: &'a HttpServer, token: &'static str) -> As<'a> {
        let response = post(server, token, None, INITIALIZE);
        assert_eq!(response.status, 200, "{}", response.body);
        let session = response.header("mcp-session-id").expect("a session id").to_string();
        As { server, token, session, next_id: 10 }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}).to_string();
        let response = post(self.server, self.token, Some(&self.session), &body);
        assert_eq!(response.status, 200, "{}", response.body);
        response.json()
    }

    /// A tools/call's result (a tool error is a result too).
    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let answer = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        assert!(answer.get("error").is_none(), "{tool}: {answer}");
        answer["result"].clone()
    }

    fn ok(&mut self, tool: &str, arguments: Value) -> Value {
        let result = self.call(tool, arguments);
        assert_eq!(result["isError"], false, "{tool}: {result}");
        result["structuredContent"].clone()
    }

    fn refused(&mut self, tool: &str, arguments: Value) -> String {
        let result = self.call(tool, arguments);
        assert_eq!(result["isError"], true, "{tool} should be refused: {result}");
        result["content"][0]["text"].as_str().unwrap().to_string()
    }
}

fn post(server: &HttpServer, token: &str, session: Option<&str>, body: &str) -> HttpResponse {
    let bearer = format!("Bearer {token}");
    let mut headers = vec![("Content-Type", "application/json"), ("Accept", "application/json"), ("Authorization", bearer.as_str())];
    if let Some(session) = session {
        headers.push(("Mcp-Session-Id", session));
        headers.push(("MCP-Protocol-Version", "2025-11-25"));
    }
    server.request("POST", "/mcp", &headers, body)
}

fn run(command: &str) -> Value {
    json!({"image": BUSYBOX, "command": ["sh", "-c", command], "network": "none"})
}

#[test]
fn two_callers_each_with_its_limits_and_only_its_own_runs() {
    let dir = TempDir::new("callers");
    let tokens = dir.path.join("tokens.json");
    let file = json!([
        {"name": "alpha", "token_sha256": sha256_hex(ALPHA), "concurrent_runs": 1, "images": ["mcp-k8s-test.local/busybox:*"],
         "tools": ["describe_environment", "run_job", "submit_job", "fetch_job", "cancel_job", "list_jobs"]},
        {"name": "beta", "token_sha256": sha256_hex(BETA), "cpu_seconds_per_hour": 1},
    ]);
    std::fs::write(&tokens, file.to_string()).unwrap();
    let audit = dir.path.join("audit.jsonl");
    let outputs = dir.path.join("outputs");
    std::fs::create_dir(&outputs).unwrap();
    let (tokens_text, audit_text, outputs_text) =
        (tokens.display().to_string(), audit.display().to_string(), outputs.display().to_string());
    let env = server_env(&[
        ("MCP_K8S_AUTH_TOKENS_FILE", &tokens_text),
        ("MCP_K8S_AUDIT_LOG", &audit_text),
        ("MCP_K8S_OUTPUTS_DIR", &outputs_text),
        ("MCP_K8S_MAX_OUTPUT_BYTES", "1024"),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let server = HttpServer::start(&env);

    // Only the file's tokens get in, and a session is its maker's.
    assert_eq!(post(&server, "guess", None, INITIALIZE).status, 401);
    let mut alpha = As::open(&server, ALPHA);
    let mut beta = As::open(&server, BETA);
    let stolen = post(&server, BETA, Some(&alpha.session), r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
    assert_eq!(stolen.status, 404, "beta's token on alpha's session: {}", stolen.body);

    // Tools: alpha sees and may call only its own.
    let names = |listed: &Value| -> Vec<String> {
        listed["result"]["tools"].as_array().unwrap().iter().map(|tool| tool["name"].as_str().unwrap().to_string()).collect()
    };
    let alpha_tools = names(&alpha.request("tools/list", json!({})));
    assert!(!alpha_tools.contains(&"execute_code".to_string()) && alpha_tools.contains(&"run_job".to_string()), "{alpha_tools:?}");
    assert!(names(&beta.request("tools/list", json!({}))).contains(&"execute_code".to_string()));
    let refused = alpha.request("tools/call", json!({"name": "execute_code", "arguments": {"language": "python", "code": "print(1)"}}));
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("not allowed for caller `alpha` (its limit `tools`)"), "{refused}");

    // describe_environment says who the caller is and what it may do.
    let described = alpha.ok("describe_environment", json!({}));
    assert_eq!(described["caller"]["name"], "alpha");
    assert_eq!(described["caller"]["limits"]["concurrent_runs"], 1);
    assert_eq!(described["caller"]["sees"], "its own runs");

    // Images: the server allows python, alpha's own limit does not.
    let message = alpha.refused("run_job", json!({"image": PYTHON, "command": ["true"]}));
    assert!(message.contains("not allowed for caller `alpha` (its limit `images`)"), "{message}");

    // Concurrent runs: with one in flight, alpha's next is refused; beta's
    // count is its own.
    let submitted = alpha.ok("submit_job", run("sleep 60"));
    let token = submitted["job_token"].as_str().unwrap().to_string();
    let _removed = Removed(vec![token.clone()]);
    let message = alpha.refused("run_job", run("true"));
    assert!(message.contains("`concurrent_runs`") && message.contains("frees up when one of them ends"), "{message}");
    assert_eq!(beta.ok("run_job", run("echo beta"))["exit_code"], 0);

    // Beta sees nothing of alpha's run: not in its list, its token reads
    // as one that names no run, and it cannot cancel it.
    let listed = beta.ok("list_jobs", json!({}));
    assert!(!listed.to_string().contains(&token), "{listed}");
    let unknown_token = format!("{}{}{}", &token[..4], "0".repeat(32), &token[36..]);
    let as_beta = beta.refused("fetch_job", json!({"job_token": token}));
    let made_up = beta.refused("fetch_job", json!({"job_token": unknown_token}));
    assert_eq!(as_beta.replace(&token, "T"), made_up.replace(&unknown_token, "T"), "another caller's token reads as unknown");
    let cancel = beta.refused("cancel_job", json!({"job_token": token}));
    assert!(cancel.contains("unknown") || cancel.contains("no job"), "{cancel}");
    assert!(alpha.ok("list_jobs", json!({})).to_string().contains(&token));

    // Alpha cancels its run; once it has ended, alpha may run again.
    alpha.ok("cancel_job", json!({"job_token": token}));
    let deadline = Instant::now() + Duration::from_secs(60);
    while alpha.ok("fetch_job", json!({"job_token": token, "wait_s": 10}))["status"] != "done" {
        assert!(Instant::now() < deadline, "the cancelled run did not end");
    }
    assert_eq!(alpha.ok("run_job", run("true"))["exit_code"], 0, "the limit freed up when the run ended");

    // Links: a run's stored output is its caller's alone.
    let big = alpha.ok("run_job", run("head -c 5000 /dev/zero | tr '\\0' a"));
    let uri = big["links"][0]["uri"].as_str().unwrap_or_else(|| panic!("a link: {big}")).to_string();
    let read = alpha.request("resources/read", json!({"uri": uri}));
    assert!(read["result"]["contents"][0]["text"].as_str().is_some_and(|text| text.starts_with("aaa")), "{read}");
    let read = beta.request("resources/read", json!({"uri": uri}));
    assert_eq!(read["error"]["code"], -32002, "{read}");

    // CPU-seconds: beta's hour holds one; half a CPU for 2.5 s uses it up.
    assert_eq!(beta.ok("run_job", run("sleep 2.5"))["exit_code"], 0);
    let message = beta.refused("run_job", run("true"));
    assert!(message.contains("`cpu_seconds_per_hour`") && message.contains("it frees up in"), "{message}");
    let described = beta.ok("describe_environment", json!({}));
    assert!(described["caller"]["cpu_seconds_last_hour"].as_f64().unwrap() >= 1.0, "{described}");

    // The audit trail names each run's caller.
    let lines: Vec<Value> = std::fs::read_to_string(&audit).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let submitted_line = lines.iter().find(|line| line["event"] == "submitted").expect("the submitted line");
    assert_eq!((submitted_line["caller"].as_str(), submitted_line["run_id"].as_str()), (Some("alpha"), Some(run_id_of(&token))));
    assert!(lines.iter().any(|line| line["event"] == "run" && line["caller"] == "beta" && line["status"] == "succeeded"));
    assert!(lines.iter().all(|line| line["caller"] == "alpha" || line["caller"] == "beta"), "{lines:?}");
    // Refused runs were never made: alpha's lines are its submit, its
    // run after the cancel and the one with a link (and the cancelled
    // run's end), nothing for the two refusals.
    let alpha_runs = lines.iter().filter(|line| line["caller"] == "alpha" && line["event"] != "ended").count();
    assert_eq!(alpha_runs, 3, "{lines:?}");

    // /metrics counts runs by caller and how they were admitted.
    let metrics = server.request("GET", "/metrics", &[], "").body;
    for series in [
        r#"mcp_k8s_caller_runs_total{caller="alpha",site="default",admission="concurrent_runs"} 1"#,
        r#"mcp_k8s_caller_runs_total{caller="alpha",site="default",admission="images"} 1"#,
        r#"mcp_k8s_caller_runs_total{caller="beta",site="default",admission="cpu_seconds_per_hour"} 1"#,
    ] {
        assert!(metrics.contains(series), "{series} in:\n{metrics}");
    }
    assert!(metrics.contains(r#"mcp_k8s_caller_cpu_seconds_total{caller="beta"}"#));
}
