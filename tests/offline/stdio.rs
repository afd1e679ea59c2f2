//! The built binary over stdio: what an MCP host that spawns it sees.

use std::time::{Duration, Instant};

use crate::support::server::{StdioServer, command, send_signal, wait_exit};
use serde_json::{Value, json};

fn test_server() -> StdioServer {
    StdioServer::start(&[("MCP_K8S_TEST_TOOLS", "1")])
}

#[test]
fn a_session_from_initialize_to_a_tool_call() {
    let mut server = test_server();
    server.initialize();
    server.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    let tools = server.recv();
    let names: Vec<&str> = tools["result"]["tools"].as_array().unwrap().iter().map(|tool| tool["name"].as_str().unwrap()).collect();
    assert_eq!(names, crate::support::server::TOOLS_WITH_TEST_HOOKS);
    server.send(r#"{"jsonrpc":"2.0","id":"2","method":"tools/call","params":{"name":"describe_environment","arguments":{}}}"#);
    let result = server.recv();
    assert_eq!(result["id"], "2");
    assert_eq!(result["result"]["structuredContent"]["timeout_s"], json!({ "default": 60, "max": 600 }));
}

#[test]
fn a_long_call_does_not_block_ping_and_can_be_cancelled() {
    let mut server = test_server();
    server.initialize();
    // No log notifications, so the only message the call could send is
    // its response.
    server.send(r#"{"jsonrpc":"2.0","id":9,"method":"logging/setLevel","params":{"level":"error"}}"#);
    server.recv_until_response(&json!(9));
    server.send(r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":30}}}"#);
    let sent = Instant::now();
    server.send(r#"{"jsonrpc":"2.0","id":11,"method":"ping"}"#);
    let messages = server.recv_until_response(&json!(11));
    assert!(sent.elapsed() < Duration::from_secs(5));
    assert_eq!(messages.last().unwrap()["result"], json!({}));
    server.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":10}}"#);
    // No response for the cancelled call: the next message is the pong.
    server.send(r#"{"jsonrpc":"2.0","id":12,"method":"ping"}"#);
    let messages = server.recv_until_response(&json!(12));
    assert!(messages.iter().all(|message| message["id"] != json!(10)), "{messages:?}");
    assert!(server.nothing_within(Duration::from_millis(500)).is_none());
}

#[test]
fn progress_notifications_arrive_before_the_result() {
    let mut server = test_server();
    server.initialize();
    server.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":0.3,"progress_every_ms":100},"_meta":{"progressToken":42}}}"#);
    let messages = server.recv_until_response(&json!(3));
    let progress: Vec<&Value> = messages.iter().filter(|message| message["method"] == "notifications/progress").collect();
    assert_eq!(progress.len(), 3);
    assert_eq!(progress[0]["params"]["progressToken"], 42);
    assert_eq!(messages.last().unwrap()["result"]["structuredContent"], json!({ "slept_ms": 300 }));
}

#[test]
fn an_oversize_line_is_refused_and_the_next_one_served() {
    let mut server = StdioServer::start(&[("MCP_K8S_MAX_MESSAGE_BYTES", "4096")]);
    server.send(&format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#, "x".repeat(5000)));
    let refused = server.recv();
    // The id at the start of the line is kept.
    assert_eq!(refused["id"], 1);
    assert_eq!(refused["error"]["code"], -32600);
    assert_eq!(refused["error"]["message"], "message exceeds 4096 bytes and was dropped; raise MCP_K8S_MAX_MESSAGE_BYTES");
    server.send(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
    assert_eq!(server.recv()["id"], 2);
}

#[test]
fn bad_input_lines() {
    let mut server = test_server();
    let cases: [(&[u8], Value); 3] = [
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"\n", json!(-32700)),
        (b"\xff\xfe\n", json!(-32700)),
        (b"{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ping\"}\n", json!(-32600)),
    ];
    for (input, code) in cases {
        server.send_bytes(input);
        let response = server.recv();
        assert_eq!(response["error"]["code"], code, "{}", String::from_utf8_lossy(input));
        assert_eq!(response["id"], Value::Null);
    }
    // Blank lines are skipped silently.
    server.send("   ");
    server.send(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
    assert_eq!(server.recv()["id"], 2);
}

#[test]
fn stdout_carries_only_protocol_messages_and_stderr_only_json_logs() {
    let mut server = test_server();
    server.initialize();
    server.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_panic"}}"#);
    assert_eq!(server.recv()["error"]["code"], -32603);
    server.close_stdin();
    assert!(wait_exit(&mut server.child, Duration::from_secs(10)).unwrap().success());
    assert!(server.nothing_within(Duration::from_millis(100)).is_none());
    let mut saw_panic = false;
    while let Ok(line) = server.stderr.recv_timeout(Duration::from_millis(200)) {
        let log: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("stderr line is not JSON: {line}"));
        saw_panic |= log["msg"] == "panic";
    }
    assert!(saw_panic, "the panic is logged as JSON");
}

#[test]
fn stdin_eof_lets_the_running_call_finish_then_exits_cleanly() {
    let mut server = test_server();
    server.initialize();
    server.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":0.5}}}"#);
    server.close_stdin();
    assert_eq!(server.recv_until_response(&json!(1)).last().unwrap()["result"]["isError"], false);
    assert!(wait_exit(&mut server.child, Duration::from_secs(10)).unwrap().success());
}

#[test]
fn sigterm_lets_calls_finish_within_the_grace_period_and_cancels_the_rest() {
    let mut server = StdioServer::start(&[("MCP_K8S_TEST_TOOLS", "1"), ("MCP_K8S_SHUTDOWN_GRACE_S", "1")]);
    server.initialize();
    server.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":0.3}}}"#);
    server.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":60}}}"#);
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    send_signal(&server.child, libc::SIGTERM);
    let mut responses = Vec::new();
    while responses.len() < 2 {
        let message = server.recv();
        if message.get("id").is_some() {
            responses.push(message);
        }
    }
    assert_eq!(responses[0]["result"]["structuredContent"], json!({ "slept_ms": 300 }));
    assert_eq!(responses[1]["result"]["isError"], true, "the cancelled call reports it");
    assert!(wait_exit(&mut server.child, Duration::from_secs(10)).unwrap().success());
    assert!(started.elapsed() < Duration::from_secs(8));
}

#[test]
fn command_line() {
    // (arguments, environment, exit code, part of the output)
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], i32, &'a str);
    let cases: &[Case] = &[
        (&["--version"], &[], 0, concat!("mcp-k8s-ephemeral-job ", env!("CARGO_PKG_VERSION"))),
        (&["--help"], &[], 0, "Usage: mcp-k8s-ephemeral-job [serve] [OPTIONS]"),
        (&["--bogus"], &[], 2, "unknown option `--bogus`"),
        (&["frobnicate"], &[], 2, "unknown command `frobnicate`; commands: serve, doctor"),
        (&["serve", "--transport"], &[], 2, "missing argument for option '--transport'"),
        (&["serve"], &[("MCP_K8S_TRANSPORT", "grpc")], 2, "MCP_K8S_TRANSPORT: `grpc` is not accepted; expected one of stdio, http, sse"),
        (&["--transport", "carrier-pigeon"], &[], 2, "MCP_K8S_TRANSPORT: `carrier-pigeon` is not accepted"),
        (&["--default-timeout-s", "700"], &[], 2, "MCP_K8S_DEFAULT_TIMEOUT_S: `700` is above MCP_K8S_MAX_TIMEOUT_S (600)"),
        (&[], &[("MCP_K8S_CACHE_PVC", "cache")], 2, "MCP_K8S_CACHE_PVC is set but MCP_K8S_CACHE_MOUNT_PATH is not; set both or neither"),
    ];
    for (args, env, code, expected) in cases {
        let output = command(env).args(*args).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert_eq!(output.status.code(), Some(*code), "{args:?}: {text}");
        assert!(text.contains(expected), "{args:?}: {text}");
    }
}

#[test]
fn flags_override_the_environment() {
    // The environment names a bad transport; the flag wins, so the server
    // starts on stdio and exits on EOF.
    let output = command(&[("MCP_K8S_TRANSPORT", "grpc")])
        .args(["serve", "--transport", "stdio"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.stdout.is_empty());
}
