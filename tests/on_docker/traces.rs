//! OpenTelemetry traces into a real collector: Jaeger v2 (built by
//! `tests/build-jaeger`), listening on loopback ports of its own, receives
//! the server's OTLP/HTTP spans and answers its query API. A `run_job`
//! whose request carries a W3C `traceparent` in `params._meta` shows up as
//! the client's trace: the call's server span under the client's span, the
//! run under the call, the run's phases under the run, with the MCP
//! conventions' attributes, and nothing of the call's arguments, its
//! environment, its output or its run id (a capability) anywhere in it.

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::backend::server;
use crate::BUSYBOX;
use crate::support::TempDir;

/// A Jaeger all-in-one on free loopback ports, with in-memory storage;
/// killed when dropped.
struct Jaeger {
    child: Child,
    otlp: u16,
    query: u16,
    _dir: TempDir,
}

/// How often Jaeger is started again on new ports when one of its ports
/// was taken before it bound it.
const START_ATTEMPTS: usize = 5;

impl Jaeger {
    fn start() -> Jaeger {
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            match Jaeger::try_start() {
                Ok(jaeger) => return jaeger,
                Err(log) if log.contains("address already in use") => last = log,
                Err(log) => panic!("jaeger did not answer within 60 s: {log}"),
            }
        }
        panic!("jaeger's ports were taken {START_ATTEMPTS} times: {last}");
    }

    fn try_start() -> Result<Jaeger, String> {
        let binary = crate::support::cluster::cache_dir().join("bin/jaeger");
        assert!(binary.exists(), "{} is missing: run `tests/build-jaeger`", binary.display());
        let (otlp, query, query_grpc) = (crate::support::free_port(), crate::support::free_port(), crate::support::free_port());
        let dir = TempDir::new("jaeger");
        let config = dir.path.join("config.yaml");
        let mut file = std::fs::File::create(&config).unwrap();
        write!(
            file,
            "service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memory
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memory:
        memory:
          max_traces: 1000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memory
"
        )
        .unwrap();
        let log = std::fs::File::create(dir.path.join("jaeger.log")).unwrap();
        let child = Command::new(&binary)
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", binary.display()));
        let mut jaeger = Jaeger { child, otlp, query, _dir: dir };
        // Ready once its query API answers (a trace it does not have: 404).
        let deadline = Instant::now() + Duration::from_secs(60);
        while jaeger.get("/api/services").is_none() {
            let exited = matches!(jaeger.child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() >= deadline {
                return Err(jaeger.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(jaeger)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path.join("jaeger.log")).unwrap_or_default()
    }

    /// A 200's JSON from the query API, `None` for anything else.
    fn get(&self, path: &str) -> Option<Value> {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut response = agent.get(format!("http://127.0.0.1:{}{path}", self.query)).call().ok()?;
        if response.status() != 200 {
            return None;
        }
        let text = response.body_mut().read_to_string().ok()?;
        serde_json::from_str(&text).ok()
    }
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `tools/call` whose `_meta` carries `traceparent`; its response.
fn call_traced(server: &mut crate::support::server::StdioServer, tool: &str, arguments: Value, traceparent: &str) -> Value {
    let params = json!({"name": tool, "arguments": arguments, "_meta": {"traceparent": traceparent}});
    server.send(&json!({"jsonrpc": "2.0", "id": "traced", "method": "tools/call", "params": params}).to_string());
    loop {
        let message = server.recv_within(Duration::from_secs(120));
        if message["id"] == "traced" {
            return message;
        }
    }
}

/// A span's tag value by key.
fn tag<'a>(span: &'a Value, key: &str) -> &'a Value {
    span["tags"].as_array().and_then(|tags| tags.iter().find(|tag| tag["key"] == key)).map_or(&Value::Null, |tag| &tag["value"])
}

fn parent_of(span: &Value) -> Option<&str> {
    span["references"].as_array()?.iter().find(|reference| reference["refType"] == "CHILD_OF")?["spanID"].as_str()
}

#[test]
fn a_calls_trace_reaches_the_collector_under_the_clients_span_with_the_runs_phases() {
    let jaeger = Jaeger::start();
    let endpoint = format!("http://127.0.0.1:{}", jaeger.otlp);
    let mut server = server(&[("MCP_K8S_OTLP_ENDPOINT", &endpoint)]);
    let trace_id = mcp_k8s_ephemeral_job::engine::run::new_run_id();
    let client_span = "00f067aa0ba902b7";
    let arguments = json!({"image": BUSYBOX, "command": ["sh", "-c", "echo marker-in-output; exit 3"],
                           "env": {"SECRET_TOKEN": "s3cret-env-value"}, "network": "none"});
    let answer = call_traced(&mut server, "run_job", arguments, &format!("00-{trace_id}-{client_span}-01"));
    let run_id = answer["result"]["structuredContent"]["run_id"].as_str().unwrap_or_else(|| panic!("{answer}")).to_string();
    assert_eq!(answer["result"]["structuredContent"]["exit_code"], 3, "{answer}");
    // The spans leave in batches of a second or so.
    let wanted = ["tools/call run_job", "run", "run.queued", "run.created", "run.running", "run.collected"];
    let trace = trace_with(&jaeger, &trace_id, &wanted);
    let spans = trace["spans"].as_array().unwrap();
    let named = |name: &str| spans.iter().find(|span| span["operationName"] == name).unwrap();
    let call = named("tools/call run_job");
    assert_eq!(parent_of(call), Some(client_span), "the call is the client's span's child: {call}");
    assert_eq!(tag(call, "mcp.method.name"), "tools/call");
    assert_eq!(tag(call, "gen_ai.tool.name"), "run_job");
    assert_eq!(tag(call, "jsonrpc.request.id"), "traced");
    assert_eq!(tag(call, "span.kind"), "server");
    let run = named("run");
    assert_eq!(parent_of(run), call["spanID"].as_str(), "the run is the call's child");
    assert_eq!(tag(run, "mcp_k8s.run.status"), "failed");
    assert_eq!(tag(run, "process.exit.code"), 3);
    assert_eq!(tag(run, "error"), true, "a failed run is an error span");
    for phase in &wanted[2..] {
        assert_eq!(parent_of(named(phase)), run["spanID"].as_str(), "{phase} is the run's child");
    }
    let process = &trace["processes"][call["processID"].as_str().unwrap()];
    assert_eq!(process["serviceName"], "mcp-k8s-ephemeral-job");
    let text = trace.to_string();
    for secret in ["s3cret-env-value", "SECRET_TOKEN", "marker-in-output", run_id.as_str()] {
        assert!(!text.contains(secret), "`{secret}` is in the trace: {text}");
    }
}

/// The trace with `trace_id` once it holds every span named in `wanted`.
fn trace_with(jaeger: &Jaeger, trace_id: &str, wanted: &[&str]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = jaeger.get(&format!("/api/traces/{trace_id}")).map(|body| body["data"][0].clone());
        let complete = found.as_ref().is_some_and(|trace| {
            let names: Vec<&str> =
                trace["spans"].as_array().into_iter().flatten().filter_map(|span| span["operationName"].as_str()).collect();
            wanted.iter().all(|name| names.contains(name))
        });
        if let (true, Some(trace)) = (complete, &found) {
            return trace.clone();
        }
        assert!(Instant::now() < deadline, "the trace {trace_id} never held {wanted:?}: {found:?}\n{}", jaeger.log());
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A background run's spans are sent by the process that records its
/// verdict, under the span of the call that submitted it (its record
/// keeps that call's `traceparent`), long after that call answered.
#[test]
fn a_background_runs_spans_go_under_the_call_that_submitted_it() {
    let jaeger = Jaeger::start();
    let endpoint = format!("http://127.0.0.1:{}", jaeger.otlp);
    let mut server = server(&[("MCP_K8S_OTLP_ENDPOINT", &endpoint)]);
    let trace_id = mcp_k8s_ephemeral_job::engine::run::new_run_id();
    let arguments = json!({"image": BUSYBOX, "command": ["sh", "-c", "sleep 1; echo done"], "network": "none"});
    let submitted = call_traced(&mut server, "submit_job", arguments, &format!("00-{trace_id}-00f067aa0ba902b7-01"));
    let token = submitted["result"]["structuredContent"]["job_token"].as_str().unwrap_or_else(|| panic!("{submitted}")).to_string();
    let out = super::backend::fetch_done(&mut server, &token);
    assert_eq!(out["result"]["status"], "succeeded", "{out}");
    let trace = trace_with(&jaeger, &trace_id, &["tools/call submit_job", "run", "run.queued", "run.running"]);
    let spans = trace["spans"].as_array().unwrap();
    let named = |name: &str| spans.iter().find(|span| span["operationName"] == name).unwrap();
    let call = named("tools/call submit_job");
    let run = named("run");
    assert_eq!(parent_of(run), call["spanID"].as_str(), "the run is the submitting call's child");
    assert_eq!(parent_of(named("run.running")), run["spanID"].as_str());
    assert_eq!(tag(run, "mcp_k8s.run.status"), "succeeded");
    let run_id = out["result"]["run_id"].as_str().unwrap();
    assert!(!trace.to_string().contains(run_id), "the run id (in the job token) is a capability: never in a span");
}
