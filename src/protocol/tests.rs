//! Dispatcher specifications: one JSON-RPC message in, the exact messages
//! out, with no transport in between.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use serde_json::{Value, json};

use super::{Calls, Dispatch, MAX_CALLS_IN_FLIGHT, Outgoing, Server, Session};
use crate::cancel::CancelToken;
use crate::config::{Config, RawConfig};
use crate::tools;

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

fn server() -> Arc<Server> {
    // The dispatcher logs every call; keep test output readable.
    crate::log::set_stderr_level(crate::log::Level::Emergency);
    let raw = RawConfig::from_lookup(|name| (name == "MCP_K8S_TEST_TOOLS").then(|| "1".to_string()));
    Arc::new(Server::new(tools::Ctx::new(Config::from_raw(&raw).unwrap(), Err("no cluster in protocol tests".into()))))
}

/// Sends `input` and returns what came back within a short wait, as JSON.
fn exchange(server: &Arc<Server>, session: &Arc<Session>, input: &str) -> (Dispatch, Vec<Value>) {
    let (outbox, replies) = mpsc::channel();
    let dispatch = server.handle(session, input, outbox);
    (dispatch, collect(&replies, Duration::from_secs(5)))
}

/// Everything sent until every sender is dropped (or the wait ends).
fn collect(replies: &Receiver<Outgoing>, wait: Duration) -> Vec<Value> {
    let mut messages = Vec::new();
    while let Ok(message) = replies.recv_timeout(wait) {
        let text = match message {
            Outgoing::Notification(text) | Outgoing::Response { text, .. } => text,
        };
        messages.push(serde_json::from_str(&text).unwrap());
    }
    messages
}

fn initialized_session(server: &Arc<Server>) -> Arc<Session> {
    let session = Arc::new(Session::whole_server("stdio"));
    exchange(server, &session, INITIALIZE);
    session
}

/// One request on an initialized session; exactly one message expected.
fn check(input: &str, expected: Value) {
    let server = server();
    let session = initialized_session(&server);
    let (dispatch, messages) = exchange(&server, &session, input);
    assert_eq!(dispatch, Dispatch::Reply, "{input}");
    assert_eq!(messages, [expected], "{input}");
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

#[test]
fn initialize_echoes_a_supported_version_and_answers_the_newest_otherwise() {
    let cases = [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2024-11-05"),
        ("2024-10-07", "2025-11-25"),
        ("2026-07-28", "2025-11-25"),
        ("banana", "2025-11-25"),
    ];
    for (requested, answered) in cases {
        let server = server();
        let session = Arc::new(Session::whole_server("stdio"));
        let input = INITIALIZE.replace("2025-11-25", requested);
        let (_, messages) = exchange(&server, &session, &input);
        assert_eq!(messages[0]["result"]["protocolVersion"], answered, "{requested}");
        assert_eq!(session.protocol_version(), Some(answered));
    }
}

#[test]
fn initialize_declares_only_implemented_capabilities() {
    let server = server();
    let (_, messages) = exchange(&server, &Arc::new(Session::whole_server("stdio")), INITIALIZE);
    let result = &messages[0]["result"];
    let tasks = json!({ "list": {}, "cancel": {}, "requests": { "tools": { "call": {} } } });
    assert_eq!(result["capabilities"], json!({ "tools": {}, "logging": {}, "tasks": tasks }));
    assert_eq!(result["serverInfo"]["name"], "mcp-k8s-ephemeral-job");
}

#[test]
fn before_initialize_only_ping_and_initialize_are_served() {
    let server = server();
    let session = Arc::new(Session::whole_server("stdio"));
    let cases = [
        (r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#, json!({ "jsonrpc": "2.0", "id": 1, "result": {} })),
        (
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
            error(json!(2), -32600, "`tools/list` before `initialize`; initialize the session first"),
        ),
        // server/discover is the 2026-07-28 era's (protocol::modern): one
        // without the envelope is refused for it, at once.
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"server/discover","params":{"_meta":{}}}"#,
            error(json!(3), -32602, "missing `_meta.io.modelcontextprotocol/protocolVersion`"),
        ),
    ];
    for (input, expected) in cases {
        assert_eq!(exchange(&server, &session, input).1, [expected], "{input}");
    }
}

#[test]
fn a_second_initialize_is_refused() {
    check(INITIALIZE, error(json!(0), -32600, "session is already initialized"));
}

#[test]
fn errors() {
    let cases = [
        (r#"{"jsonrpc":"2.0","id":7,"method":"nope"}"#, error(json!(7), -32601, "method not found: `nope`")),
        (r#"{"jsonrpc":"2.0","id":"7","method":"resources/list"}"#, error(json!("7"), -32601, "method not found: `resources/list`")),
        ("{not json", error(Value::Null, -32700, "parse error: expected an object key in double quotes at byte 1")),
        (r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, error(Value::Null, -32600, "`id` must be a string or an integer, not null")),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":5}}"#,
            error(json!(1), -32602, "`protocolVersion` must be a string, not an integer"),
        ),
        (
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"nope"}}"#,
            error(
                json!(8),
                -32602,
                "unknown tool: `nope`; available: describe_environment, run_job, execute_code, submit_job, fetch_job, cancel_job, list_jobs, open_sandbox, close_sandbox, list_sandboxes, test_sleep, test_panic",
            ),
        ),
        (r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{}}"#, error(json!(9), -32602, "missing `name`")),
        (
            r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":1}}"#,
            error(json!(10), -32602, "`name` must be a string, not an integer"),
        ),
        (
            r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"describe_environment","arguments":[]}}"#,
            error(json!(11), -32602, "`arguments` must be an object, not an array"),
        ),
        (
            r#"{"jsonrpc":"2.0","id":12,"method":"tools/list","params":{"cursor":"abc"}}"#,
            error(json!(12), -32602, r#"unknown cursor "abc"; tools/list has a single page"#),
        ),
        (
            r#"{"jsonrpc":"2.0","id":13,"method":"logging/setLevel","params":{"level":"loud"}}"#,
            error(json!(13), -32602, "unknown log level `loud`; accepted: debug, info, notice, warning, error, critical, alert, emergency"),
        ),
        (
            r#"{"jsonrpc":"2.0","id":14,"method":"logging/setLevel","params":{}}"#,
            error(json!(14), -32602, "missing `level`; accepted: debug, info, notice, warning, error, critical, alert, emergency"),
        ),
        (
            r#"{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"test_panic"}}"#,
            error(json!(15), -32603, "internal error: tool `test_panic` failed unexpectedly; see the server log"),
        ),
    ];
    for (input, expected) in cases {
        check(input, expected);
    }
}

#[test]
fn bad_tool_arguments_are_tool_results_with_is_error() {
    check(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":"x"}}}"#,
        json!({ "jsonrpc": "2.0", "id": 1, "result": {
            "content": [{ "type": "text", "text": "argument `seconds` must be a number, not a string" }],
            "isError": true,
        }}),
    );
}

#[test]
fn describe_environment_returns_structured_content_and_the_same_json_as_text() {
    let server = server();
    let session = initialized_session(&server);
    let (_, messages) =
        exchange(&server, &session, r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"describe_environment"}}"#);
    let result = &messages[0]["result"];
    assert_eq!(result["isError"], false);
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, result["structuredContent"]);
    assert_eq!(text["namespace"], "mcp-ephemeral");
}

#[test]
fn notifications_and_client_responses_are_accepted_silently() {
    let server = server();
    let session = initialized_session(&server);
    for input in [
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":999}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#,
        r#"{"jsonrpc":"2.0","id":5,"result":{}}"#,
    ] {
        assert_eq!(exchange(&server, &session, input), (Dispatch::Accepted, vec![]), "{input}");
    }
}

#[test]
fn progress_is_sent_only_with_a_progress_token() {
    let server = server();
    let session = initialized_session(&server);
    let with_token = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":0.05,"progress_every_ms":20},"_meta":{"progressToken":"tok"}}}"#;
    let (_, messages) = exchange(&server, &session, with_token);
    let methods: Vec<&str> = messages.iter().map(|message| message["method"].as_str().unwrap_or("response")).collect();
    assert_eq!(
        methods,
        ["notifications/message", "notifications/progress", "notifications/progress", "notifications/progress", "response"]
    );
    assert_eq!(messages[1]["params"], json!({ "progressToken": "tok", "progress": 20, "total": 50, "message": "slept 20 of 50 ms" }));

    let without_token = with_token.replace(r#","_meta":{"progressToken":"tok"}"#, "");
    let (_, messages) = exchange(&server, &session, &without_token);
    let methods: Vec<&str> = messages.iter().map(|message| message["method"].as_str().unwrap_or("response")).collect();
    assert_eq!(methods, ["notifications/message", "response"]);
}

#[test]
fn log_notifications_follow_the_level_set_by_the_client() {
    let server = server();
    let session = initialized_session(&server);
    let (_, messages) = exchange(&server, &session, r#"{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"warning"}}"#);
    assert_eq!(messages, [json!({ "jsonrpc": "2.0", "id": 1, "result": {} })]);
    let (_, messages) = exchange(
        &server,
        &session,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":0}}}"#,
    );
    assert_eq!(messages.len(), 1, "the info log is below warning: {messages:?}");
}

#[test]
fn a_cancelled_call_stops_and_sends_no_response() {
    let server = server();
    let session = initialized_session(&server);
    let (outbox, replies) = mpsc::channel();
    let call = r#"{"jsonrpc":"2.0","id":"long","method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":60}}}"#;
    assert_eq!(server.handle(&session, call, outbox), Dispatch::Reply);
    // Other requests are served while the call runs.
    let (_, pong) = exchange(&server, &session, r#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#);
    assert_eq!(pong, [json!({ "jsonrpc": "2.0", "id": "p", "result": {} })]);
    assert_eq!(session.calls_in_flight(), 1);
    let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"long","reason":"test"}}"#;
    let started = std::time::Instant::now();
    assert_eq!(exchange(&server, &session, cancel).0, Dispatch::Accepted);
    // The outbox closes without a response once the call has stopped.
    let messages = collect(&replies, Duration::from_secs(10));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(messages.iter().all(|message| message.get("id").is_none()), "{messages:?}");
    assert_eq!(session.calls_in_flight(), 0);
}

#[test]
fn a_request_id_in_flight_cannot_be_reused() {
    let server = server();
    let session = initialized_session(&server);
    let (outbox, _replies) = mpsc::channel();
    let call = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":60}}}"#;
    server.handle(&session, call, outbox);
    let (_, messages) = exchange(&server, &session, call);
    assert_eq!(messages, [error(json!(5), -32600, "request id 5 is already in use")]);
    session.cancel_all();
}

#[test]
fn shutdown_waits_for_calls_then_cancels_them_and_refuses_new_ones() {
    let server = server();
    let session = initialized_session(&server);
    let (outbox, replies) = mpsc::channel();
    server.handle(
        &session,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":60}}}"#,
        outbox,
    );
    let still_running = server.shut_down(Duration::from_millis(100), Duration::from_secs(5));
    assert_eq!(still_running, 0);
    // A call cancelled by shutdown (not by its client) still answers.
    let messages = collect(&replies, Duration::from_secs(5));
    assert_eq!(messages.last().unwrap()["result"]["isError"], true);
    let (_, messages) =
        exchange(&server, &session, r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"describe_environment"}}"#);
    assert_eq!(messages, [error(json!(2), -32603, "server is shutting down; no new calls are accepted")]);
}

/// A job token of the shape this server hands out, for no job at all.
const TOKEN: &str = "job-0123456789abcdef0123456789abcdef-1767225600";

#[test]
fn task_requests_are_checked_before_any_cluster_is_needed() {
    let no_cluster = "this server has no backend to run sandboxes on: no cluster in protocol tests";
    let cases = [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"describe_environment","arguments":{},"task":{"ttl":1000}}}"#,
            error(json!(1), -32601, "tool `describe_environment` does not support tasks; call it without `task`"),
        ),
        (
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_job","arguments":{"image":"x"},"task":{}}}"#,
            error(
                json!(2),
                -32602,
                "image `x` is not allowed: the server allows no images (MCP_K8S_ALLOWED_IMAGES is empty); ask the operator to set it",
            ),
        ),
        (r#"{"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{}}"#, error(json!(3), -32602, "missing `taskId`")),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"tasks/result","params":{"taskId":7}}"#,
            error(json!(4), -32602, "`taskId` must be a string, not an integer"),
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"tasks/cancel","params":{"taskId":"job-x"}}"#,
            error(
                json!(5),
                -32602,
                "no such job: `job-x` is not a job_token this server hands out; use the token submit_job returned (a task's taskId), or find it with list_jobs",
            ),
        ),
        // A well-formed id the cluster cannot be
        // asked about is the server's trouble, not invalid params.
        (
            &format!(r#"{{"jsonrpc":"2.0","id":8,"method":"tasks/get","params":{{"taskId":"{TOKEN}"}}}}"#),
            error(json!(8), -32603, no_cluster),
        ),
        (
            &format!(r#"{{"jsonrpc":"2.0","id":9,"method":"tasks/cancel","params":{{"taskId":"{TOKEN}"}}}}"#),
            error(json!(9), -32603, no_cluster),
        ),
        (
            &format!(r#"{{"jsonrpc":"2.0","id":10,"method":"tasks/result","params":{{"taskId":"{TOKEN}"}}}}"#),
            error(json!(10), -32603, no_cluster),
        ),
        (
            r#"{"jsonrpc":"2.0","id":6,"method":"tasks/list","params":{"cursor":"c"}}"#,
            error(json!(6), -32602, "unknown cursor \"c\"; tasks/list has a single page"),
        ),
        (r#"{"jsonrpc":"2.0","id":7,"method":"tasks/list"}"#, error(json!(7), -32603, no_cluster)),
    ];
    for (input, expected) in cases {
        check(input, expected);
    }
}

#[test]
fn run_job_and_execute_code_alone_declare_task_support() {
    let server = server();
    let session = initialized_session(&server);
    let (_, messages) = exchange(&server, &session, r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    for tool in messages[0]["result"]["tools"].as_array().unwrap() {
        let expected =
            if tool["name"] == "run_job" || tool["name"] == "execute_code" { json!({ "taskSupport": "optional" }) } else { Value::Null };
        assert_eq!(tool["execution"], expected, "{}", tool["name"]);
    }
}

/// Caller input quoted in an error is shortened.
#[test]
fn echoed_input_is_shortened() {
    let long = "m".repeat(1 << 20);
    let shown = format!("{}… (1048576 bytes)", "m".repeat(crate::echo::MAX_ECHO_CHARS));
    let cases = [
        (format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{long}"}}"#), error(json!(1), -32601, &format!("method not found: `{shown}`"))),
        (
            format!(r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"{long}"}}}}"#),
            error(
                json!(2),
                -32602,
                &format!(
                    "unknown tool: `{shown}`; available: describe_environment, run_job, execute_code, submit_job, fetch_job, cancel_job, list_jobs, open_sandbox, close_sandbox, list_sandboxes, test_sleep, test_panic"
                ),
            ),
        ),
    ];
    for (input, expected) in cases {
        check(&input, expected);
    }
}

/// A task-augmented call with good arguments that
/// cannot reach the cluster is -32603, not invalid params.
#[test]
fn a_task_the_cluster_cannot_take_is_an_internal_error() {
    let raw = RawConfig::from_lookup(|name| (name == "MCP_K8S_ALLOWED_IMAGES").then(|| "busybox:1.36".to_string()));
    let server = Arc::new(Server::new(tools::Ctx::new(Config::from_raw(&raw).unwrap(), Err("no cluster in protocol tests".into()))));
    let session = initialized_session(&server);
    let input = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"run_job","arguments":{"image":"busybox:1.36","command":["true"]},"task":{}}}"#;
    let (_, messages) = exchange(&server, &session, input);
    assert_eq!(messages, [error(json!(3), -32603, "this server has no backend to run sandboxes on: no cluster in protocol tests")]);
}

/// Running calls hold their messages; past
/// `MCP_K8S_MAX_INFLIGHT_BYTES` a new call waits for them (-32603), while
/// one call alone is always served.
#[test]
fn calls_in_flight_are_bounded_by_the_bytes_they_hold() {
    let raw = RawConfig::from_lookup(|name| match name {
        "MCP_K8S_TEST_TOOLS" => Some("1".to_string()),
        "MCP_K8S_MAX_INFLIGHT_BYTES" => Some("65536".to_string()),
        _ => None,
    });
    let server = Arc::new(Server::new(tools::Ctx::new(Config::from_raw(&raw).unwrap(), Err("no cluster in protocol tests".into()))));
    let session = initialized_session(&server);
    let pad = "x".repeat(40_000);
    let call = |id: u32, seconds: u32| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"test_sleep","arguments":{{"seconds":{seconds}}},"_meta":{{"pad":"{pad}"}}}}}}"#
        )
    };
    let (first, first_replies) = mpsc::channel();
    assert_eq!(server.handle(&session, &call(1, 30), first), Dispatch::Reply);
    let (_, messages) = exchange(&server, &session, &call(2, 0));
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["error"]["code"], -32603, "{}", messages[0]);
    let message = messages[0]["error"]["message"].as_str().unwrap();
    assert!(message.contains("more than this server holds at once (MCP_K8S_MAX_INFLIGHT_BYTES, 65536)"), "{message}");
    // Once the first call is over, the same call is served.
    exchange(&server, &session, r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#);
    drop(collect(&first_replies, Duration::from_secs(5)));
    let (_, messages) = exchange(&server, &session, &call(3, 0));
    let last = messages.last().unwrap();
    assert_eq!(last["result"]["structuredContent"], json!({ "slept_ms": 0 }), "{last}");
}

/// A call's slot is free once its answer is about to go out, so a client
/// that waits for an answer before it sends the next call is never refused
/// at the limit of calls in flight; shutdown still waits for that answer.
#[test]
fn a_slot_is_free_before_its_answer_goes_out_and_shutdown_waits_for_the_answer() {
    let calls = Calls::new(usize::MAX);
    let numbers: Vec<u64> = (0..MAX_CALLS_IN_FLIGHT).map(|_| calls.register(&CancelToken::new(), 1).unwrap()).collect();
    let refused = calls.register(&CancelToken::new(), 1).unwrap_err();
    assert!(refused.message.contains("too many calls in flight"), "{}", refused.message);

    calls.finishing(numbers[0]);
    let next = calls.register(&CancelToken::new(), 1).expect("the finishing call's slot is free");
    calls.unregister(next);
    for number in &numbers[1..] {
        calls.unregister(*number);
    }
    assert_eq!(calls.wait_idle(Duration::ZERO), 1, "the answer being queued is still waited for");
    calls.answered();
    assert_eq!(calls.wait_idle(Duration::ZERO), 0);
}

/// With a snippets folder, `resources` is declared and its files
/// are listed and read as `snippet://` resources; without one, the methods
/// are unknown (covered by `errors`).
#[test]
fn snippets_are_resources_when_a_folder_is_configured() {
    let dir = std::env::temp_dir().join(format!("mcp-protocol-snippets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hello.py"), "print('hi')\n").unwrap();
    std::fs::write(dir.join("notes.txt"), "n").unwrap();
    let dir_text = dir.to_string_lossy().into_owned();
    let raw = RawConfig::from_lookup(|name| match name {
        "MCP_K8S_SNIPPETS_DIR" => Some(dir_text.clone()),
        "MCP_K8S_ALLOWED_IMAGES" => Some("python:3.12-slim".to_string()),
        _ => None,
    });
    let server = Arc::new(Server::new(tools::Ctx::new(Config::from_raw(&raw).unwrap(), Err("no cluster in protocol tests".into()))));
    let session = Arc::new(Session::whole_server("stdio"));
    let (_, initialized) = exchange(&server, &session, INITIALIZE);
    assert_eq!(initialized[0]["result"]["capabilities"]["resources"], json!({}));
    let (_, listed) = exchange(&server, &session, r#"{"jsonrpc":"2.0","id":1,"method":"resources/list"}"#);
    assert_eq!(
        listed[0]["result"]["resources"],
        json!([
            {"uri": "snippet://hello", "name": "hello", "mimeType": "text/x-python", "size": 12,
             "description": "python snippet; run it with execute_code {\"snippet_name\": \"hello\"}"},
            {"uri": "snippet://notes", "name": "notes", "mimeType": "text/plain", "size": 1,
             "description": "no language profile claims `.txt`, so execute_code cannot run it"},
        ])
    );
    let (_, read) = exchange(&server, &session, r#"{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"snippet://hello"}}"#);
    assert_eq!(read[0]["result"], json!({"contents": [{"uri": "snippet://hello", "mimeType": "text/x-python", "text": "print('hi')\n"}]}));
    let (_, missing) =
        exchange(&server, &session, r#"{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"snippet://nope"}}"#);
    assert_eq!(missing, [error(json!(3), -32002, "resource not found: no snippet named `nope`; available: hello, notes")]);
    let (_, outside) =
        exchange(&server, &session, r#"{"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"file:///etc/passwd"}}"#);
    assert_eq!(outside, [error(json!(4), -32002, "resource not found: `file:///etc/passwd`; resources here are snippet://<name>")]);
    std::fs::write(dir.join("big.py"), "x".repeat(crate::tools::snippets::MAX_SNIPPET_BYTES as usize + 1)).unwrap();
    std::fs::write(dir.join("bin.py"), [0xff, 0xfe]).unwrap();
    let (_, big) = exchange(&server, &session, r#"{"jsonrpc":"2.0","id":5,"method":"resources/read","params":{"uri":"snippet://big"}}"#);
    assert_eq!(
        big,
        [error(
            json!(5),
            -32602,
            "snippet `big` is over 262144 bytes (262145 read), the most a snippet may be; the operator must shrink it"
        )]
    );
    let (_, binary) = exchange(&server, &session, r#"{"jsonrpc":"2.0","id":6,"method":"resources/read","params":{"uri":"snippet://bin"}}"#);
    assert_eq!(binary, [error(json!(6), -32602, "snippet `bin` is not UTF-8 text; the operator must save it as UTF-8")]);
    std::os::unix::fs::symlink("/proc/self/environ", dir.join("environ.txt")).unwrap();
    let (_, environ) =
        exchange(&server, &session, r#"{"jsonrpc":"2.0","id":7,"method":"resources/read","params":{"uri":"snippet://environ"}}"#);
    assert_eq!(environ[0]["error"]["code"], json!(-32002), "a link out of the folder is not served: {environ:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resources_are_not_declared_without_a_snippets_folder() {
    let server = server();
    let session = Arc::new(Session::whole_server("stdio"));
    let (_, initialized) = exchange(&server, &session, INITIALIZE);
    assert_eq!(initialized[0]["result"]["capabilities"].get("resources"), None);
}

/// Regression: a `resources/read` without a string `uri` was answered
/// "resource not found: ``" on a server whose only resources are stored
/// outputs; with or without snippets it is the caller's params at fault.
#[test]
fn a_resources_read_without_a_string_uri_is_invalid_params() {
    let dir = std::env::temp_dir().join(format!("mcp-protocol-uri-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_text = dir.to_string_lossy().into_owned();
    for setting in ["MCP_K8S_OUTPUTS_DIR", "MCP_K8S_SNIPPETS_DIR"] {
        let raw = RawConfig::from_lookup(|name| (name == setting).then(|| dir_text.clone()));
        let server = Arc::new(Server::new(tools::Ctx::new(Config::from_raw(&raw).unwrap(), Err("no cluster in protocol tests".into()))));
        let session = initialized_session(&server);
        let cases = [(r#"{}"#, "missing `uri`"), (r#"{"uri":5}"#, "`uri` must be a string"), (r#"{"uri":null}"#, "`uri` must be a string")];
        for (params, message) in cases {
            let input = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{params}}}"#);
            let (_, answered) = exchange(&server, &session, &input);
            assert_eq!(answered, [error(json!(1), -32602, message)], "{setting}: {params}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Regression: `inputResponses` and `requestState` on a call to a tool
/// were silently dropped; no tool of this server asks for input, so they
/// are refused, in both eras' calls and a task-augmented one.
#[test]
fn input_answers_to_a_tool_that_never_asks_are_refused() {
    let refused =
        "`inputResponses` and `requestState` answer an input request, and this server's tools never ask for input; call again without them";
    let cases = [
        (r#""inputResponses":{"user_name":{"action":"accept"}}"#, Some(refused)),
        (r#""requestState":"abc""#, Some(refused)),
        (r#""inputResponses":{},"requestState":"abc""#, Some(refused)),
        (r#""inputResponses":{},"task":{}"#, Some(refused)),
        (r#""requestState":null"#, None),
        (r#""arguments":{}"#, None),
    ];
    for (extra, expected) in cases {
        let server = server();
        let session = initialized_session(&server);
        let input = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"describe_environment",{extra}}}}}"#);
        let (_, answered) = exchange(&server, &session, &input);
        match expected {
            Some(message) => assert_eq!(answered, [error(json!(1), -32602, message)], "{extra}"),
            None => assert!(answered.last().is_some_and(|answer| answer.get("result").is_some()), "{extra}: {answered:?}"),
        }
    }
}
