//! Revision 2026-07-28 beside the handshake era, end to end over stdio and
//! HTTP with no cluster: one table of request → error code (and HTTP
//! status) for both transports, the results' `resultType` and caching
//! hints, the HTTP header checks, per-request log levels, progress and
//! cancellation (stdio: `notifications/cancelled`; HTTP: closing the
//! connection). Jobs are refused (no images allowed), which is enough for
//! the envelope; tasks that run are the client suites' (tests/clients).

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::server::{HttpResponse, HttpServer, INITIALIZE, StdioServer};

const VERSION: &str = "2026-07-28";

/// The envelope every modern request carries, plus `extra` `_meta` keys.
fn meta(extra: Value) -> Value {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": { "name": "modern-era-test", "version": "1" },
    });
    if let (Some(meta), Some(extra)) = (meta.as_object_mut(), extra.as_object()) {
        meta.extend(extra.clone());
    }
    meta
}

fn request(id: i64, method: &str, mut params: Value) -> Value {
    if params.get("_meta").is_none() {
        params["_meta"] = meta(json!({}));
    }
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

/// Requests whose answer is an error, the same on both transports: the
/// JSON-RPC code and the HTTP status the spec gives it.
fn error_cases() -> Vec<(&'static str, Value, i64, u16)> {
    let no_tasks_extension = request(9, "tasks/get", json!({ "taskId": "abc" }));
    vec![
        ("missing _meta", json!({ "jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {} }), -32602, 400),
        (
            "no client capabilities",
            request(2, "tools/list", json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": VERSION } })),
            -32602,
            400,
        ),
        (
            "unknown version",
            request(
                3,
                "tools/list",
                json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": "2099-01-01", "io.modelcontextprotocol/clientCapabilities": {} } }),
            ),
            -32022,
            400,
        ),
        ("ping is removed", request(4, "ping", json!({})), -32601, 404),
        ("initialize with the envelope", request(5, "initialize", json!({})), -32601, 404),
        ("logging/setLevel is removed", request(6, "logging/setLevel", json!({ "level": "debug" })), -32601, 404),
        ("unknown tool", request(7, "tools/call", json!({ "name": "nope" })), -32602, 400),
        (
            "bad log level",
            request(8, "tools/list", json!({ "_meta": meta(json!({ "io.modelcontextprotocol/logLevel": "loud" })) })),
            -32602,
            400,
        ),
        ("tasks/get without the extension", no_tasks_extension, -32021, 400),
        ("a panicking tool", request(10, "tools/call", json!({ "name": "test_panic" })), -32603, 500),
        ("tasks/update without the extension", request(11, "tasks/update", json!({ "taskId": "abc", "inputResponses": {} })), -32021, 400),
    ]
}

/// Requests answered with a result, checked by `check`.
/// A case name, a request, and the check of its result.
type ResultCase = (&'static str, Value, fn(&Value));

/// A case name, a request, header overrides, the HTTP status and the code.
type HeaderCase<'a> = (&'a str, &'a Value, &'a [(&'a str, Option<&'a str>)], u16, Option<i64>);

fn result_cases() -> Vec<ResultCase> {
    vec![
        ("server/discover", request(20, "server/discover", json!({})), |result| {
            assert_eq!(result["supportedVersions"], json!([VERSION]));
            assert_eq!(result["resultType"], "complete");
            assert!(result["capabilities"]["tools"].is_object());
            assert!(result["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"].is_object());
            assert!(result["capabilities"].get("tasks").is_none(), "tasks are the extension in this era");
            assert_eq!(result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "mcp-k8s-ephemeral-job");
            assert!(result["ttlMs"].is_u64() && result["cacheScope"] == "public");
        }),
        ("tools/list", request(21, "tools/list", json!({})), |result| {
            assert_eq!(result["tools"][0]["name"], "describe_environment");
            assert_eq!((&result["resultType"], &result["cacheScope"]), (&json!("complete"), &json!("public")));
            assert!(result["ttlMs"].is_u64());
        }),
        ("a tool", request(22, "tools/call", json!({ "name": "describe_environment" })), |result| {
            assert_eq!((&result["resultType"], &result["isError"]), (&json!("complete"), &json!(false)));
        }),
        (
            "an isError result",
            request(23, "tools/call", json!({ "name": "run_job", "arguments": { "image": "x", "command": ["true"] } })),
            |result| {
                assert_eq!((&result["resultType"], &result["isError"]), (&json!("complete"), &json!(true)));
                let text = result["content"][0]["text"].as_str().unwrap_or_default();
                assert!(text.contains("is not allowed"), "{text}");
            },
        ),
    ]
}

fn stdio_server() -> StdioServer {
    StdioServer::start(&[("MCP_K8S_TEST_TOOLS", "1")])
}

fn stdio_exchange(server: &mut StdioServer, message: &Value) -> Value {
    server.send(&message.to_string());
    server.recv_until_response(&message["id"]).pop().unwrap_or_default()
}

/// POSTs a modern request with the headers a 2026-07-28 client derives
/// from its body, then `overrides` (a `None` value drops the header).
fn http_post(server: &HttpServer, message: &Value, overrides: &[(&str, Option<&str>)]) -> HttpResponse {
    let params = &message["params"];
    let version = params["_meta"]["io.modelcontextprotocol/protocolVersion"].as_str().unwrap_or(VERSION).to_string();
    let name = ["name", "uri", "taskId"].iter().find_map(|key| params[key].as_str()).map(str::to_string);
    let mut headers: Vec<(String, String)> = vec![
        ("Content-Type".into(), "application/json".into()),
        ("Accept".into(), "application/json, text/event-stream".into()),
        ("MCP-Protocol-Version".into(), version),
        ("Mcp-Method".into(), message["method"].as_str().unwrap_or_default().into()),
    ];
    if let Some(name) = name {
        headers.push(("Mcp-Name".into(), name));
    }
    for (header, value) in overrides {
        headers.retain(|(name, _)| !name.eq_ignore_ascii_case(header));
        if let Some(value) = value {
            headers.push((header.to_string(), value.to_string()));
        }
    }
    let borrowed: Vec<(&str, &str)> = headers.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    server.request("POST", "/mcp", &borrowed, &message.to_string())
}

#[test]
fn errors_have_the_same_codes_on_stdio_and_http_and_the_spec_statuses_over_http() {
    let mut stdio = stdio_server();
    let http = HttpServer::start(&[]);
    for (case, message, code, status) in error_cases() {
        let over_stdio = stdio_exchange(&mut stdio, &message);
        assert_eq!(over_stdio["error"]["code"], code, "stdio, {case}: {over_stdio}");
        assert_eq!(over_stdio["id"], message["id"], "stdio, {case}");
        let over_http = http_post(&http, &message, &[]);
        assert_eq!(
            (over_http.status, over_http.json()["error"]["code"].clone()),
            (status, json!(code)),
            "HTTP, {case}: {}",
            over_http.body
        );
        assert_eq!(over_http.json()["id"], message["id"], "HTTP, {case}");
        assert!(over_http.header("mcp-session-id").is_none(), "HTTP, {case}: no sessions in this era");
    }
    let unknown_version = stdio_exchange(&mut stdio, &error_cases()[2].1);
    assert_eq!(unknown_version["error"]["data"], json!({ "supported": [VERSION], "requested": "2099-01-01" }));
    let no_extension = stdio_exchange(&mut stdio, &error_cases()[8].1);
    assert_eq!(no_extension["error"]["data"]["requiredCapabilities"], json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } }));
}

#[test]
fn results_carry_result_type_and_list_results_caching_hints_on_both_transports() {
    let mut stdio = stdio_server();
    let http = HttpServer::start(&[]);
    for (case, message, check) in result_cases() {
        let over_stdio = stdio_exchange(&mut stdio, &message);
        assert!(over_stdio.get("error").is_none(), "stdio, {case}: {over_stdio}");
        check(&over_stdio["result"]);
        let over_http = http_post(&http, &message, &[]);
        assert_eq!(over_http.status, 200, "HTTP, {case}: {}", over_http.body);
        check(&over_http.json()["result"]);
    }
}

#[test]
fn http_headers_must_match_the_body() {
    let http = HttpServer::start(&[]);
    let tools_list = request(1, "tools/list", json!({}));
    let call = request(2, "tools/call", json!({ "name": "describe_environment" }));
    let cases: &[HeaderCase] = &[
        ("method mismatch", &tools_list, &[("Mcp-Method", Some("prompts/list"))], 400, Some(-32020)),
        ("method missing", &tools_list, &[("Mcp-Method", None)], 400, Some(-32020)),
        ("method case differs", &tools_list, &[("Mcp-Method", Some("TOOLS/LIST"))], 400, Some(-32020)),
        ("header name in lower case", &tools_list, &[("Mcp-Method", None), ("mcp-method", Some("tools/list"))], 200, None),
        ("version mismatch", &tools_list, &[("MCP-Protocol-Version", Some("2099-01-01"))], 400, Some(-32020)),
        ("name mismatch", &call, &[("Mcp-Name", Some("run_job"))], 400, Some(-32020)),
        ("name missing", &call, &[("Mcp-Name", None)], 400, Some(-32020)),
        ("name with spaces around", &call, &[("Mcp-Name", Some("  describe_environment  "))], 200, None),
    ];
    for (case, message, overrides, status, code) in cases {
        let response = http_post(&http, message, overrides);
        assert_eq!(response.status, *status, "{case}: {}", response.body);
        assert_eq!(response.json()["error"]["code"].as_i64(), *code, "{case}");
    }
}

/// `Mcp-Name` in the encoded form `=?base64?…?=` (a URI that is not plain
/// ASCII) is decoded before it is compared with the body; a malformed one
/// is 400 with -32020 and says what is wrong.
#[test]
fn http_decodes_an_encoded_mcp_name() {
    let dir = std::env::temp_dir().join(format!("mcp-encoded-name-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("snippets folder");
    std::fs::write(dir.join("h\u{e9}llo.py"), "print('hi')\n").expect("a snippet");
    let folder = dir.display().to_string();
    let http = HttpServer::start(&[("MCP_K8S_SNIPPETS_DIR", folder.as_str())]);
    let read = request(1, "resources/read", json!({ "uri": "snippet://h\u{e9}llo" }));
    let cases: &[(&str, &str, u16, Option<&str>)] = &[
        ("encoded", "=?base64?c25pcHBldDovL2jDqWxsbw==?=", 200, None),
        ("encoded, spaces around", "  =?base64?c25pcHBldDovL2jDqWxsbw==?=  ", 200, None),
        ("encoded, another name", "=?base64?c25pcHBldDovL2hlbGxv?=", 400, Some("does not match the body's")),
        ("invalid base64", "=?base64?c25p!!?=", 400, Some("is not base64")),
        ("not UTF-8", "=?base64?/w==?=", 400, Some("does not decode to UTF-8")),
    ];
    for (case, value, status, message) in cases {
        let response = http_post(&http, &read, &[("Mcp-Name", Some(value))]);
        assert_eq!(response.status, *status, "{case}: {}", response.body);
        match message {
            None => assert_eq!(response.json()["result"]["contents"][0]["text"], "print('hi')\n", "{case}"),
            Some(message) => {
                let error = &response.json()["error"];
                assert_eq!(error["code"], -32020, "{case}");
                assert!(error["message"].as_str().is_some_and(|text| text.contains(message)), "{case}: {error}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn http_has_no_sessions_and_no_get_stream_in_this_era_while_the_handshake_era_works_as_before() {
    let http = HttpServer::start(&[]);
    assert_eq!(http.request("GET", "/mcp", &[("Accept", "text/event-stream")], "").status, 405);
    let notification = json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 1 } });
    let accepted = http.request(
        "POST",
        "/mcp",
        &[("Content-Type", "application/json"), ("MCP-Protocol-Version", VERSION), ("Mcp-Method", "notifications/cancelled")],
        &notification.to_string(),
    );
    assert_eq!((accepted.status, accepted.body.as_str()), (202, ""));
    // The handshake era, unchanged: initialize opens a session.
    let initialized = http.post(None, INITIALIZE);
    assert_eq!(initialized.json()["result"]["protocolVersion"], "2025-11-25");
    let session = initialized.header("mcp-session-id").expect("a session").to_string();
    let tools = http.post(Some(&session), r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    assert!(tools.json()["result"].get("resultType").is_none(), "handshake results are as before");
    assert!(tools.json()["result"].get("ttlMs").is_none());
}

#[test]
fn stdio_serves_both_eras_and_logs_only_at_the_level_the_request_asks_for() {
    let mut stdio = stdio_server();
    let sleep = |id: i64, extra: Value| {
        request(
            id,
            "tools/call",
            json!({ "name": "test_sleep", "arguments": { "seconds": 0.05, "progress_every_ms": 10 }, "_meta": meta(extra) }),
        )
    };
    stdio.send(&sleep(1, json!({ "progressToken": "p1" })).to_string());
    let silent = stdio.recv_until_response(&json!(1));
    assert!(silent.iter().all(|message| message["method"] != "notifications/message"), "no level, no logs: {silent:?}");
    assert!(silent.iter().any(|message| message["method"] == "notifications/progress"), "progress still flows: {silent:?}");
    stdio.send(&sleep(2, json!({ "io.modelcontextprotocol/logLevel": "info" })).to_string());
    let logged = stdio.recv_until_response(&json!(2));
    assert!(logged.iter().any(|message| message["method"] == "notifications/message"), "{logged:?}");
    assert_eq!(logged.last().map(|last| last["result"]["resultType"].clone()), Some(json!("complete")));
    // The handshake era on the same connection: initialize still works.
    stdio.initialize();
    stdio.send(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#);
    assert_eq!(stdio.recv(), json!({ "jsonrpc": "2.0", "id": 3, "result": {} }));
}

#[test]
fn stdio_cancels_a_modern_call_on_notifications_cancelled() {
    let mut stdio = stdio_server();
    let call = request(7, "tools/call", json!({ "name": "test_sleep", "arguments": { "seconds": 30 } }));
    stdio.send(&call.to_string());
    std::thread::sleep(Duration::from_millis(200));
    stdio.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#);
    stdio.send(&request(8, "tools/list", json!({})).to_string());
    let answered = stdio.recv_until_response(&json!(8));
    assert!(answered.iter().all(|message| message["id"] != json!(7)), "a cancelled call gets no response");
    assert!(stdio.nothing_within(Duration::from_millis(500)).is_none());
    assert!(wait_for_log(&stdio.stderr, "call cancelled by client", Duration::from_secs(5)));
}

#[test]
fn http_cancels_a_modern_call_when_the_client_closes_the_connection() {
    let http = HttpServer::start(&[]);
    let call = request(7, "tools/call", json!({ "name": "test_sleep", "arguments": { "seconds": 30 } })).to_string();
    let mut stream = TcpStream::connect(&http.addr).expect("connects");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json\r\nMCP-Protocol-Version: {VERSION}\r\nMcp-Method: tools/call\r\nMcp-Name: test_sleep\r\nContent-Length: {}\r\n\r\n",
        http.addr,
        call.len()
    );
    stream.write_all(head.as_bytes()).expect("writes");
    stream.write_all(call.as_bytes()).expect("writes");
    std::thread::sleep(Duration::from_millis(300));
    drop(stream);
    assert!(wait_for_log(&http.stderr, "call cancelled: the client closed its stream", Duration::from_secs(5)));
}

/// Whether a stderr log line with `msg` arrives within `wait`.
fn wait_for_log(stderr: &std::sync::mpsc::Receiver<String>, msg: &str, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(line) = stderr.recv_timeout(left) else { return false };
        if serde_json::from_str::<Value>(&line).is_ok_and(|log| log["msg"] == msg) {
            return true;
        }
    }
    false
}

/// With a snippets folder, the snippets are resources in the 2026-07-28 era too,
/// declared by `server/discover`, listed and read with caching hints (a
/// minute, as the folder may change under the server, where `tools/list`
/// keeps an hour), and a missing one is invalid params with the URI in
/// `data` (the era has no -32002; SEP-2164).
#[test]
fn snippets_are_resources_in_this_era_when_a_folder_is_configured() {
    let dir = std::env::temp_dir().join(format!("mcp-modern-snippets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("snippets folder");
    std::fs::write(dir.join("hello.py"), "print('hi')\n").expect("a snippet");
    let folder = dir.display().to_string();
    let mut server = StdioServer::start(&[("MCP_K8S_SNIPPETS_DIR", folder.as_str())]);
    let discovered = stdio_exchange(&mut server, &request(1, "server/discover", json!({})));
    assert_eq!(discovered["result"]["capabilities"]["resources"], json!({}), "{discovered}");
    let listed = stdio_exchange(&mut server, &request(2, "resources/list", json!({})));
    let result = &listed["result"];
    assert_eq!(result["resources"][0]["uri"], "snippet://hello", "{listed}");
    assert_eq!((result["resultType"].as_str(), result["cacheScope"].as_str()), (Some("complete"), Some("public")), "{listed}");
    assert_eq!(result["ttlMs"], 60_000, "{listed}");
    let templates = stdio_exchange(&mut server, &request(3, "resources/templates/list", json!({})));
    assert_eq!((&templates["result"]["ttlMs"], &templates["result"]["cacheScope"]), (&json!(60_000), &json!("public")), "{templates}");
    let tools = stdio_exchange(&mut server, &request(4, "tools/list", json!({})));
    assert_eq!(tools["result"]["ttlMs"], 3_600_000, "{tools}");
    let read = stdio_exchange(&mut server, &request(5, "resources/read", json!({"uri": "snippet://hello"})));
    assert_eq!(read["result"]["contents"][0]["text"], "print('hi')\n", "{read}");
    assert_eq!((&read["result"]["ttlMs"], &read["result"]["cacheScope"]), (&json!(60_000), &json!("public")), "{read}");
    let missing = stdio_exchange(&mut server, &request(6, "resources/read", json!({"uri": "snippet://nope"})));
    assert_eq!(missing["error"]["code"], -32602, "{missing}");
    assert_eq!(missing["error"]["data"], json!({"uri": "snippet://nope"}), "{missing}");
    assert!(missing["error"]["message"].as_str().is_some_and(|message| message.contains("hello")), "{missing}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resources_are_method_not_found_in_this_era_without_a_snippets_folder() {
    let mut server = stdio_server();
    let discovered = stdio_exchange(&mut server, &request(1, "server/discover", json!({})));
    assert!(discovered["result"]["capabilities"].get("resources").is_none(), "{discovered}");
    let listed = stdio_exchange(&mut server, &request(2, "resources/list", json!({})));
    assert_eq!(listed["error"]["code"], -32601, "{listed}");
    // Simply absent: no hint about the handshake era, which only the
    // methods 2026-07-28 removed get.
    assert_eq!(listed["error"]["message"], "method not found: `resources/list`", "{listed}");
}

/// Outside a session, a garbage `MCP-Protocol-Version` (not a revision's
/// `YYYY-MM-DD`) on a request without the envelope is named as the
/// unsupported version it is (-32022), not reported as a missing `_meta`;
/// a revision-shaped one without the envelope stays -32602, the spec's
/// order.
#[test]
fn an_unknown_protocol_version_header_without_the_envelope_is_named_unsupported() {
    let http = HttpServer::start(&[]);
    let bare = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {} });
    let garbage = http_post(&http, &bare, &[("MCP-Protocol-Version", Some("banana"))]);
    assert_eq!((garbage.status, garbage.json()["error"]["code"].clone()), (400, json!(-32022)), "{}", garbage.body);
    assert!(
        garbage.json()["error"]["message"].as_str().unwrap_or_default().contains("unsupported protocol version `banana`"),
        "{}",
        garbage.body
    );
    assert_eq!(garbage.json()["error"]["data"]["requested"], "banana");
    for version in [VERSION, "2099-01-01"] {
        let shaped = http_post(&http, &bare, &[("MCP-Protocol-Version", Some(version))]);
        assert_eq!((shaped.status, shaped.json()["error"]["code"].clone()), (400, json!(-32602)), "{version}: {}", shaped.body);
    }
}

/// The conformance fixtures are served only with their setting: a server
/// with the test hooks alone lists, answers and declares exactly what it
/// did before them.
#[test]
fn without_the_fixture_setting_no_fixture_is_listed_or_answered() {
    let mut server = stdio_server();
    let listed = stdio_exchange(&mut server, &request(1, "tools/list", json!({})));
    let names: Vec<&str> = listed["result"]["tools"].as_array().unwrap().iter().filter_map(|tool| tool["name"].as_str()).collect();
    assert_eq!(names, crate::support::server::TOOLS_WITH_TEST_HOOKS);
    let discovered = stdio_exchange(&mut server, &request(2, "server/discover", json!({})));
    for absent in ["prompts", "completions", "resources"] {
        assert!(discovered["result"]["capabilities"].get(absent).is_none(), "{absent}: {discovered}");
    }
    for (id, method) in [(3, "prompts/list"), (4, "completion/complete")] {
        let answered = stdio_exchange(&mut server, &request(id, method, json!({})));
        assert_eq!(answered["error"]["code"], -32601, "{method}: {answered}");
    }
    let greeted = stdio_exchange(&mut server, &request(5, "tools/call", json!({ "name": "greet", "arguments": { "name": "x" } })));
    assert_eq!(greeted["error"]["code"], -32602, "{greeted}");
}

fn fixtures_server() -> StdioServer {
    StdioServer::start(&[("MCP_K8S_TEST_TOOLS", "1"), ("MCP_K8S_CONFORMANCE_FIXTURES", "1")])
}

/// An input-required call over two rounds: the question, then the answer;
/// a request state comes back only as it was signed.
#[test]
fn fixture_mode_asks_for_input_and_refuses_a_tampered_request_state() {
    let mut server = fixtures_server();
    let call = |id: i64, name: &str, extra: Value| {
        let mut params = json!({ "name": name, "arguments": {} });
        params.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        request(id, "tools/call", params)
    };
    let asked = stdio_exchange(&mut server, &call(1, "test_input_required_result_elicitation", json!({})));
    assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
    assert_eq!(asked["result"]["inputRequests"]["user_name"]["method"], "elicitation/create", "{asked}");
    let answer = json!({ "inputResponses": { "user_name": { "action": "accept", "content": { "name": "Alice" } }, "extra": {} } });
    let answered = stdio_exchange(&mut server, &call(2, "test_input_required_result_elicitation", answer));
    assert_eq!(answered["result"]["resultType"], "complete", "{answered}");
    assert_eq!(answered["result"]["content"][0]["text"], "Hello, Alice!", "{answered}");
    let not_an_answer =
        stdio_exchange(&mut server, &call(3, "test_input_required_result_elicitation", json!({ "inputResponses": { "user_name": 1 } })));
    assert_eq!(not_an_answer["error"]["code"], -32602, "{not_an_answer}");

    let first = stdio_exchange(&mut server, &call(4, "test_input_required_result_request_state", json!({})));
    let state = first["result"]["requestState"].as_str().expect("a request state").to_string();
    let confirm = json!({ "confirm": { "action": "accept", "content": { "ok": true } } });
    let intact = stdio_exchange(
        &mut server,
        &call(5, "test_input_required_result_request_state", json!({ "inputResponses": confirm, "requestState": state })),
    );
    assert!(intact["result"]["content"][0]["text"].as_str().unwrap_or_default().contains("state-ok"), "{intact}");
    let tampered = stdio_exchange(
        &mut server,
        &call(6, "test_input_required_result_request_state", json!({ "inputResponses": confirm, "requestState": format!("{state}x") })),
    );
    assert_eq!(tampered["error"]["code"], -32602, "{tampered}");
    assert!(tampered["error"]["message"].as_str().unwrap_or_default().contains("integrity check"), "{tampered}");
}

/// A tool argument its schema mirrors in a header (`x-mcp-header`) must
/// arrive in `Mcp-Param-*` too, equal, in either form; else 400, -32020.
#[test]
fn http_checks_a_parameter_header_against_its_argument() {
    let server = HttpServer::start(&[("MCP_K8S_TEST_TOOLS", "1"), ("MCP_K8S_CONFORMANCE_FIXTURES", "1")]);
    let call = request(1, "tools/call", json!({ "name": "test_custom_header", "arguments": { "region": "Hello" } }));
    let cases: [(Option<&str>, u16); 6] = [
        (Some("Hello"), 200),
        (Some("=?base64?SGVsbG8=?="), 200),
        (Some("=?base64?SGVsbG8?="), 400),
        (Some("=?base64?SGVs!!!bG8=?="), 400),
        (Some("Goodbye"), 400),
        (None, 400),
    ];
    for (header, status) in cases {
        let response = http_post(&server, &call, &[("Mcp-Param-Region", header)]);
        assert_eq!(response.status, status, "{header:?}: {}", response.body);
        if status == 400 {
            let body: Value = serde_json::from_str(&response.body).unwrap();
            assert_eq!(body["error"]["code"], -32020, "{header:?}: {body}");
        }
    }
    // Sent twice, even with the right value both times.
    let twice = {
        let mut message = call.clone();
        message["id"] = json!(2);
        let body = message.to_string();
        let headers = [
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("MCP-Protocol-Version", VERSION),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "test_custom_header"),
            ("Mcp-Param-Region", "Hello"),
            ("mcp-param-region", "Hello"),
        ];
        server.request("POST", "/mcp", &headers, &body)
    };
    assert_eq!(twice.status, 400, "{}", twice.body);
    assert!(twice.body.contains("sent 2 times"), "{}", twice.body);

    // Without the fixtures, a parameter header on a tool that marks none
    // changes nothing.
    let plain = HttpServer::start(&[("MCP_K8S_TEST_TOOLS", "1")]);
    let described = request(3, "tools/call", json!({ "name": "describe_environment", "arguments": {} }));
    let response = http_post(&plain, &described, &[("Mcp-Param-Region", Some("anything"))]);
    assert_eq!(response.status, 200, "{}", response.body);
}
