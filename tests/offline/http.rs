//! The built binary over HTTP: Streamable HTTP at /mcp, legacy SSE, health
//! endpoints, and every refusal (auth, Origin, Host, sessions, sizes).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::server::{HttpResponse, HttpServer, INITIALIZE, LegacyStream, send_signal, wait_exit};
use serde_json::json;

const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

#[test]
fn session_lifecycle() {
    let server = HttpServer::start(&[]);
    let initialized = server.post(None, INITIALIZE);
    assert_eq!(initialized.status, 200);
    assert_eq!(initialized.header("content-type"), Some("application/json"));
    assert_eq!(initialized.json()["result"]["protocolVersion"], "2025-11-25");
    let session = initialized.header("mcp-session-id").unwrap().to_string();
    assert!(session.len() >= 32 && session.bytes().all(|byte| (0x21..=0x7e).contains(&byte)));

    let notification = server.post(Some(&session), r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    assert_eq!((notification.status, notification.body.as_str()), (202, ""));
    let client_response = server.post(Some(&session), r#"{"jsonrpc":"2.0","id":99,"result":{}}"#);
    assert_eq!((client_response.status, client_response.body.as_str()), (202, ""));

    let tools = server.post(Some(&session), r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    assert_eq!(tools.status, 200);
    assert_eq!(tools.json()["result"]["tools"][0]["name"], "describe_environment");

    let deleted = server.request("DELETE", "/mcp", &[("Mcp-Session-Id", &session)], "");
    assert_eq!(deleted.status, 204);
    let after = server.post(Some(&session), PING);
    assert_eq!(after.status, 404);
    assert_eq!(after.json()["error"]["message"], "unknown or expired session; initialize a new one");
    assert_eq!(server.request("DELETE", "/mcp", &[("Mcp-Session-Id", &session)], "").status, 404);
}

#[test]
fn refusals() {
    let server = HttpServer::start(&[("MCP_K8S_MAX_MESSAGE_BYTES", "4096")]);
    let session = server.initialize();
    let json = ("Content-Type", "application/json");
    let with_session = ("Mcp-Session-Id", session.as_str());
    let big = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#, "x".repeat(5000));
    // (method, path, headers, body, status, part of the error message)
    type Case<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, &'a str, u16, &'a str);
    let cases: Vec<Case> = vec![
        ("GET", "/mcp", vec![], "", 405, "GET is not supported on /mcp; POST messages instead"),
        // Regression: the 405 named GET whatever the method.
        ("PUT", "/mcp", vec![], "", 405, "PUT is not supported on /mcp; POST messages instead"),
        ("GET", "/messages", vec![], "", 405, "GET is not supported on /messages; POST messages instead"),
        ("POST", "/sse", vec![json], PING, 405, "POST is not supported on /sse; open the stream with GET"),
        ("POST", "/healthz", vec![], "", 405, "POST is not supported on /healthz; use GET or HEAD"),
        ("GET", "/nope", vec![], "", 404, "not found; the MCP endpoint is /mcp (or /sse for legacy clients)"),
        ("POST", "/mcp", vec![json, ("Mcp-Session-Id", "no-such-session")], PING, 404, "unknown or expired session; initialize a new one"),
        (
            "POST",
            "/mcp",
            vec![json],
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            400,
            "missing Mcp-Session-Id header; initialize a session first",
        ),
        (
            "POST",
            "/mcp",
            vec![json],
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            400,
            "`tools/list` before `initialize`; initialize the session first",
        ),
        (
            "POST",
            "/mcp",
            vec![json, with_session, ("MCP-Protocol-Version", "2099-01-01")],
            PING,
            400,
            "unsupported MCP-Protocol-Version `2099-01-01`; supported: 2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05",
        ),
        (
            "POST",
            "/mcp",
            vec![("Content-Type", "text/plain"), with_session],
            PING,
            415,
            "Content-Type must be application/json, not `text/plain`",
        ),
        ("POST", "/mcp", vec![json, with_session], &big, 413, "message exceeds 4096 bytes; raise MCP_K8S_MAX_MESSAGE_BYTES"),
        ("POST", "/mcp", vec![json, with_session], "{oops", 200, "parse error: expected an object key in double quotes at byte 1"),
        ("POST", "/mcp", vec![json], "{oops", 400, "parse error"),
        ("DELETE", "/mcp", vec![], "", 400, "missing Mcp-Session-Id header"),
        ("POST", "/messages?sessionId=nope", vec![json], PING, 404, "unknown session; open GET /sse first"),
        ("POST", "/messages", vec![json], PING, 400, "missing sessionId query parameter"),
    ];
    for (method, path, headers, body, status, message) in cases {
        let response = server.request(method, path, &headers, body);
        assert_eq!(response.status, status, "{method} {path} {headers:?}: {}", response.body);
        let error = response.json();
        let text = error["error"]["message"].as_str().unwrap_or_default();
        assert!(text.contains(message), "{method} {path}: {text}");
    }
    // Unsupported MCP-Protocol-Version is fine when the version is known
    // or absent (then 2025-03-26 is assumed).
    for headers in [vec![json, with_session], vec![json, with_session, ("MCP-Protocol-Version", "2025-03-26")]] {
        assert_eq!(server.request("POST", "/mcp", &headers, PING).status, 200);
    }
}

#[test]
fn server_discover_with_a_partial_envelope_gets_a_4xx_json_rpc_error_at_once() {
    // Revision 2026-07-28 is served now (tests/offline/modern_era.rs); an
    // envelope without client capabilities is refused with -32602.
    let server = HttpServer::start(&[]);
    let started = Instant::now();
    let response = server.post(None, r#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(response.status, 400);
    assert_eq!(response.json()["error"]["code"], -32602);
}

#[test]
fn origin_and_host_checks() {
    let server = HttpServer::start(&[("MCP_K8S_ALLOWED_ORIGINS", "https://app.example.com")]);
    let json = ("Content-Type", "application/json");
    let cases: &[(&[(&str, &str)], u16)] = &[
        (&[json], 200),
        (&[json, ("Origin", "http://localhost:6274")], 200),
        (&[json, ("Origin", "http://127.0.0.1")], 200),
        (&[json, ("Origin", "http://[::1]:3000")], 200),
        // Regression: scheme and host compare without case.
        (&[json, ("Origin", "HTTP://LOCALHOST")], 200),
        (&[json, ("Origin", "https://app.example.com")], 200),
        (&[json, ("Origin", "http://evil.example.com")], 403),
        (&[json, ("Origin", "null")], 403),
        (&[json, ("Host", "localhost:1234")], 200),
        (&[json, ("Host", "evil.example.com")], 421),
        (&[json, ("Host", "evil.example.com"), ("Origin", "http://evil.example.com")], 421),
    ];
    for (headers, status) in cases {
        let response = server.request("POST", "/mcp", headers, INITIALIZE);
        assert_eq!(response.status, *status, "{headers:?}: {}", response.body);
    }
    let allowed = server.request("POST", "/mcp", &[json, ("Origin", "http://localhost:6274")], INITIALIZE);
    assert_eq!(allowed.header("access-control-allow-origin"), Some("http://localhost:6274"));
    assert_eq!(allowed.header("access-control-expose-headers"), Some("Mcp-Session-Id"));
    let preflight = server.request("OPTIONS", "/mcp", &[("Origin", "http://localhost:6274")], "");
    assert_eq!(preflight.status, 204);
    assert!(preflight.header("access-control-allow-headers").unwrap().contains("mcp-session-id"));
}

#[test]
fn auth_token() {
    let token = "correct horse battery staple";
    let server = HttpServer::start(&[("MCP_K8S_AUTH_TOKEN", token)]);
    let json = ("Content-Type", "application/json");
    let bearer = format!("Bearer {token}");
    let lowercase_bearer = format!("bearer {token}");
    // (headers, status, WWW-Authenticate)
    type Case<'a> = (Vec<(&'a str, &'a str)>, u16, Option<&'a str>);
    let cases: Vec<Case> = vec![
        (vec![json], 401, Some("Bearer")),
        (vec![json, ("X-MCP-AUTH", "wrong")], 401, Some(r#"Bearer error="invalid_token""#)),
        (vec![json, ("Authorization", "Bearer wrong")], 401, Some(r#"Bearer error="invalid_token""#)),
        (vec![json, ("Authorization", "Basic Zm9vOmJhcg==")], 401, Some("Bearer")),
        (vec![json, ("X-MCP-AUTH", token)], 200, None),
        (vec![json, ("Authorization", &bearer)], 200, None),
        (vec![json, ("Authorization", &lowercase_bearer)], 200, None),
    ];
    for (headers, status, challenge) in cases {
        let response = server.request("POST", "/mcp", &headers, INITIALIZE);
        assert_eq!(response.status, status, "{headers:?}");
        assert_eq!(response.header("www-authenticate"), challenge, "{headers:?}");
    }
    // Every method and endpoint is guarded, except the health probes.
    assert_eq!(server.request("GET", "/mcp", &[], "").status, 401);
    assert_eq!(server.request("DELETE", "/mcp", &[("Mcp-Session-Id", "x")], "").status, 401);
    assert_eq!(server.request("GET", "/sse", &[], "").status, 401);
    assert_eq!(server.request("POST", "/messages?sessionId=x", &[json], PING).status, 401);
    assert_eq!(server.request("GET", "/healthz", &[], "").status, 200);
    // 503: this server has no backend (`readiness`), but not 401.
    assert_eq!(server.request("GET", "/readyz", &[], "").status, 503);
    // The token never reaches the logs.
    send_signal(&server.child, libc::SIGTERM);
    let mut logs = String::new();
    while let Ok(line) = server.stderr.recv_timeout(Duration::from_secs(5)) {
        logs.push_str(&line);
    }
    assert!(logs.contains("authentication"));
    assert!(!logs.contains("horse"), "token leaked into logs");
}

#[test]
fn progress_streams_as_server_sent_events_while_the_call_runs() {
    let server = HttpServer::start(&[]);
    let session = server.initialize();
    let call = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":1,"progress_every_ms":250},"_meta":{"progressToken":"p"}}}"#;
    let response = server.post(Some(&session), call);
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("text/event-stream"));
    let events = response.sse_data();
    let methods: Vec<&str> = events.iter().map(|event| event["method"].as_str().unwrap_or("response")).collect();
    assert_eq!(
        methods,
        [
            "notifications/message",
            "notifications/progress",
            "notifications/progress",
            "notifications/progress",
            "notifications/progress",
            "response"
        ]
    );
    assert_eq!(events[5]["id"], 5);
    // The first event arrived long before the last: nothing sat in a buffer.
    let first = response.chunk_times[0];
    let last = *response.chunk_times.last().unwrap();
    assert!(last - first >= Duration::from_millis(700), "events arrived in one burst: {:?}", response.chunk_times);
}

#[test]
fn a_result_without_notifications_is_plain_json_even_when_sse_is_accepted() {
    let server = HttpServer::start(&[]);
    let session = server.initialize();
    server.post(Some(&session), r#"{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"error"}}"#);
    let response = server.post(
        Some(&session),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":0.1}}}"#,
    );
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert_eq!(response.json()["result"]["structuredContent"], json!({ "slept_ms": 100 }));
}

/// The Python SDK given a plain `httpx2.AsyncClient`
/// reads with httpx's 5 s timeout and gave up on a call that sent nothing
/// for longer. The log level is raised so the call has no notifications:
/// the switch to an event stream comes from the delay alone.
#[test]
fn a_long_call_accepting_sse_gets_keepalive_comments_then_its_answer() {
    let server = HttpServer::start(&[]);
    let session = server.initialize();
    server.post(Some(&session), r#"{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"error"}}"#);
    let call = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":8}}}"#;
    let headers =
        [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream"), ("Mcp-Session-Id", session.as_str())];
    // A read timeout like httpx's: this request fails if 5 s pass in silence.
    let response =
        crate::support::server::raw_request_within(&server.addr, "POST", "/mcp", &headers, call.as_bytes(), Duration::from_secs(5));
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("text/event-stream"));
    let comments = response.body.matches(": keepalive\n\n").count();
    assert!(comments >= 3, "{comments} keepalive comments in 8 s: {}", response.body);
    let gaps: Vec<Duration> = response.chunk_times.windows(2).map(|pair| pair[1] - pair[0]).collect();
    assert!(gaps.iter().all(|gap| *gap < Duration::from_secs(3)), "silences between chunks: {gaps:?}");
    let events = response.sse_data();
    assert_eq!(events.len(), 1, "{}", response.body);
    assert_eq!(events[0]["id"], 2);
    assert_eq!(events[0]["result"]["structuredContent"], json!({ "slept_ms": 8000 }));
}

#[test]
fn a_long_call_accepting_only_json_gets_plain_json() {
    let server = HttpServer::start(&[]);
    let session = server.initialize();
    // The call's log notification is dropped: this client takes no stream.
    let call = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":3}}}"#;
    let headers = [("Content-Type", "application/json"), ("Accept", "application/json"), ("Mcp-Session-Id", session.as_str())];
    let response = server.request("POST", "/mcp", &headers, call);
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert_eq!(response.json()["result"]["structuredContent"], json!({ "slept_ms": 3000 }));
}

/// A call in flight on a session leaves the session free: a ping and
/// another tool call are answered while it is still running (it sleeps
/// 30 s and is then cancelled).
#[test]
fn a_long_call_does_not_block_other_requests_on_the_same_session() {
    let server = HttpServer::start(&[]);
    let session = server.initialize();
    let (long_call, started) = server.post_streaming(
        &session,
        r#"{"jsonrpc":"2.0","id":"long","method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":30}}}"#,
    );
    started.recv().expect("the long call's stream starts with its log message");
    assert_eq!(server.post(Some(&session), PING).json()["result"], json!({}));
    let environment =
        server.post(Some(&session), r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"describe_environment"}}"#);
    assert_eq!(environment.json()["result"]["isError"], false);
    assert!(!long_call.is_finished(), "both were answered while the long call ran");
    let cancel = server.post(Some(&session), r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"long"}}"#);
    assert_eq!(cancel.status, 202);
    long_call.join().unwrap();
}

/// A cancelled call's stream, which had started, ends without a response:
/// a call that was not cancelled would answer its result after 30 s.
#[test]
fn cancelling_a_call_ends_its_request_without_a_response() {
    let server = HttpServer::start(&[]);
    let session = server.initialize();
    let (long_call, started) = server.post_streaming(
        &session,
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":30}}}"#,
    );
    started.recv().expect("the call's stream starts with its log message");
    let cancel =
        server.post(Some(&session), r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"user"}}"#);
    assert_eq!(cancel.status, 202);
    let (response, _) = long_call.join().unwrap();
    assert_eq!(response.status, 200);
    let events = response.sse_data();
    assert!(!events.is_empty(), "the stream had started with the tool's log message");
    assert!(events.iter().all(|event| event.get("id").is_none()), "{events:?}");
}

#[test]
fn sessions_expire_after_the_idle_ttl() {
    let server = HttpServer::start(&[("MCP_K8S_SESSION_TTL_S", "1")]);
    let session = server.initialize();
    assert_eq!(server.post(Some(&session), PING).status, 200);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(server.post(Some(&session), PING).status, 404);
}

#[test]
fn legacy_sse_transport() {
    let server = HttpServer::start(&[]);
    let stream = LegacyStream::open(&server);
    assert!(stream.endpoint.starts_with("/messages?sessionId="), "{}", stream.endpoint);
    assert_eq!(stream.post(&server, INITIALIZE).status, 202);
    assert_eq!(stream.next_message()["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(stream.post(&server, r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).status, 202);
    stream.post(&server, r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":0.1},"_meta":{"progressToken":1}}}"#);
    let mut methods = Vec::new();
    loop {
        let message = stream.next_message();
        methods.push(message["method"].as_str().unwrap_or("response").to_string());
        if message["id"] == 2 {
            break;
        }
    }
    assert_eq!(methods, ["notifications/message", "notifications/progress", "response"]);
    // Parse errors travel on the stream as well.
    assert_eq!(stream.post(&server, "{bad").status, 202);
    assert_eq!(stream.next_message()["error"]["code"], -32700);
}

#[test]
fn sigterm_lets_a_legacy_sse_call_answer_on_its_stream() {
    let mut server = HttpServer::start(&[]);
    let stream = LegacyStream::open(&server);
    stream.post(&server, INITIALIZE);
    stream.next_message();
    stream.post(&server, r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":1}}}"#);
    assert_eq!(stream.next_message()["method"], "notifications/message");
    send_signal(&server.child, libc::SIGTERM);
    assert_eq!(stream.next_message()["result"]["structuredContent"], json!({ "slept_ms": 1000 }));
    assert!(wait_exit(&mut server.child, Duration::from_secs(10)).unwrap().success());
}

#[test]
fn health_endpoints() {
    let server = HttpServer::start(&[]);
    let healthz = server.request("GET", "/healthz", &[], "");
    assert_eq!((healthz.status, healthz.body.as_str()), (200, "ok\n"));
    // Without a backend the server is not ready (tests/offline/readiness.rs
    // has the rest).
    let readyz = server.request("GET", "/readyz", &[], "");
    assert_eq!(readyz.status, 503, "{}", readyz.body);
    assert!(readyz.body.starts_with("not ready: no backend can run a job: "), "{}", readyz.body);
}

#[test]
fn metrics_are_prometheus_text_and_need_no_token() {
    let server = HttpServer::start(&[("MCP_K8S_AUTH_TOKEN", "s3cret")]);
    let metrics = server.request("GET", "/metrics", &[], "");
    assert_eq!(metrics.status, 200);
    assert_eq!(metrics.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"));
    for name in [
        "mcp_k8s_runs_total counter",
        "mcp_k8s_run_duration_seconds histogram",
        "mcp_k8s_runs_in_flight gauge",
        "mcp_k8s_runs_queued gauge",
        "mcp_k8s_api_errors_total counter",
    ] {
        assert!(metrics.body.contains(&format!("# TYPE {name}")), "{name} missing:\n{}", metrics.body);
    }
}

#[test]
fn sigterm_stops_accepting_and_lets_the_running_call_answer() {
    let mut server = HttpServer::start(&[]);
    let session = server.initialize();
    let call = server.post_in_background(
        &session,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":1}}}"#,
    );
    std::thread::sleep(Duration::from_millis(300));
    send_signal(&server.child, libc::SIGTERM);
    let (response, _) = call.join().unwrap();
    assert_eq!(response.json()["result"]["structuredContent"], json!({ "slept_ms": 1000 }));
    assert!(wait_exit(&mut server.child, Duration::from_secs(10)).unwrap().success());
    assert!(TcpStream::connect(&server.addr).is_err(), "the listener is closed");
}

#[test]
fn a_port_in_use_fails_with_exit_code_1() {
    let server = HttpServer::start(&[]);
    let output = crate::support::server::command(&[("MCP_K8S_TRANSPORT", "http"), ("MCP_K8S_ADDR", &server.addr)]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("serving failed"));
}

/// Writes `bytes` on one connection and reads until the server closes it.
fn exchange(addr: &str, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    stream.write_all(bytes).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn head_requests_to_the_probes_answer_like_get_without_a_body() {
    // Regression: HEAD /healthz was 404.
    let server = HttpServer::start(&[]);
    // `/readyz` is 503 here: this server has no backend.
    let readyz_length = server.request("GET", "/readyz", &[], "").body.len();
    for (path, status, length) in [("/healthz", "200 OK", 3), ("/readyz", "503 Service Unavailable", readyz_length)] {
        let answer = exchange(&server.addr, format!("HEAD {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes());
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with(&format!("HTTP/1.1 {status}")), "{answer}");
        assert!(head.contains(&format!("Content-Length: {length}")), "{answer}");
        assert_eq!(body, "", "HEAD has no body");
    }
}

#[test]
fn keep_alive_pipelining_chunked_bodies_and_expect_continue() {
    let server = HttpServer::start(&[]);
    // Two requests in one write: both answered, in order, on one connection.
    let answer = exchange(
        &server.addr,
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\nGET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    // `/readyz` is 503 here: this server has no backend.
    assert_eq!(answer.matches("HTTP/1.1 200 OK").count(), 1, "{answer}");
    assert_eq!(answer.matches("HTTP/1.1 503 Service Unavailable").count(), 1, "{answer}");
    assert!(answer.find("ok\n").unwrap() < answer.find("not ready: ").unwrap(), "{answer}");
    // A chunked body, split anywhere, with an extension and a trailer.
    let (first, second) = INITIALIZE.split_at(40);
    let chunked = format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x};ext=1\r\n{first}\r\n{:x}\r\n{second}\r\n0\r\nX-Trailer: t\r\n\r\n",
        first.len(),
        second.len()
    );
    let answer = exchange(&server.addr, chunked.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 200 OK") && answer.contains("Mcp-Session-Id: "), "{answer}");
    // Expect: 100-continue: the interim answer comes before the body is sent.
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        INITIALIZE.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut interim = String::new();
    reader.read_line(&mut interim).unwrap();
    assert_eq!(interim, "HTTP/1.1 100 Continue\r\n");
    stream.write_all(INITIALIZE.as_bytes()).unwrap();
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("HTTP/1.1 200 OK"), "{rest}");
    // Other expectations are refused.
    let answer = exchange(&server.addr, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nExpect: magic\r\nConnection: close\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 417") && answer.contains("only 100-continue is"), "{answer}");
}

#[test]
fn oversized_heads_get_431_naming_the_setting() {
    let server = HttpServer::start(&[("MCP_K8S_MAX_HEADER_BYTES", "4096"), ("MCP_K8S_MAX_HEADERS", "20")]);
    let long = format!("GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Long: {}\r\n\r\n", "a".repeat(5000));
    let answer = exchange(&server.addr, long.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(answer.contains("request line and headers exceed 4096 bytes; raise MCP_K8S_MAX_HEADER_BYTES"), "{answer}");
    let many = format!("GET /healthz HTTP/1.1\r\nHost: localhost\r\n{}\r\n", "a: b\r\n".repeat(20));
    let answer = exchange(&server.addr, many.as_bytes());
    assert!(answer.contains("request has more than 20 headers; raise MCP_K8S_MAX_HEADERS"), "{answer}");
    let answer = exchange(&server.addr, b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("more than one `Host` header"), "{answer}");
}

#[test]
fn a_slow_head_gets_408_naming_the_setting() {
    let server = HttpServer::start(&[("MCP_K8S_HEAD_TIMEOUT_S", "1")]);
    let started = Instant::now();
    let answer = exchange(&server.addr, b"GET /healthz HTTP/1.1\r\nHost: local");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("the request head did not arrive within 1 s; raise MCP_K8S_HEAD_TIMEOUT_S"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_body_waits_for_the_shared_budget_then_gets_503() {
    let server = HttpServer::start(&[("MCP_K8S_MAX_MESSAGE_BYTES", "16384"), ("MCP_K8S_BODY_BUDGET_BYTES", "16384")]);
    let head = "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 16000\r\n\r\n{";
    // The first body takes the whole budget and never completes.
    let mut holder = TcpStream::connect(&server.addr).unwrap();
    holder.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let answer = exchange(&server.addr, head.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("request bodies being read already hold the 16384 bytes of MCP_K8S_BODY_BUDGET_BYTES"), "{answer}");
    assert!(started.elapsed() >= Duration::from_secs(4), "it waited for room first");
    // Small messages take no share of the budget: ping still answers.
    assert_eq!(server.post(None, PING).status, 200);
    drop(holder);
}

/// POSTs `body` until the status is `want` or 5 s pass; the last status.
/// With one connection slot, the previous request's thread may still be
/// closing its connection when the next one arrives.
fn post_until(server: &HttpServer, session: Option<&str>, body: &str, want: u16) -> HttpResponse {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let response = server.post(session, body);
        if response.status == want || Instant::now() > deadline {
            return response;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_closed_event_stream_frees_its_connection_within_a_second() {
    // Regression: a closed stream was only noticed at the next
    // 15 s keepalive, holding its slot until then.
    let server = HttpServer::start(&[("MCP_K8S_MAX_CONNECTIONS", "1")]);
    let initialized = post_until(&server, None, INITIALIZE, 200);
    let session = initialized.header("mcp-session-id").expect("a session").to_string();
    let call = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"test_sleep","arguments":{"seconds":30,"progress_every_ms":10000},"_meta":{"progressToken":"p"}}}"#;
    let post_stream = format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\nContent-Length: {}\r\n\r\n{call}",
        call.len()
    );
    let legacy_stream = "GET /sse HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n".to_string();
    for opening in [post_stream, legacy_stream] {
        // The previous request's thread may still hold the slot a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        let stream = loop {
            let mut stream = TcpStream::connect(&server.addr).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            stream.write_all(opening.as_bytes()).unwrap();
            let mut status_line = String::new();
            BufReader::new(stream.try_clone().unwrap()).read_line(&mut status_line).unwrap();
            if status_line.starts_with("HTTP/1.1 200") {
                break stream;
            }
            assert!(Instant::now() < deadline, "the stream never opened: {status_line}");
            std::thread::sleep(Duration::from_millis(50));
        };
        // The stream holds the only slot: MCP requests are refused, naming the setting.
        let refused = server.post(Some(&session), PING);
        assert_eq!(refused.status, 503);
        assert!(refused.body.contains("raise MCP_K8S_MAX_CONNECTIONS"), "{}", refused.body);
        drop(stream);
        std::thread::sleep(Duration::from_millis(1200));
        assert_eq!(server.post(Some(&session), PING).status, 200, "the closed stream still holds its slot");
    }
}

#[test]
fn a_full_session_table_evicts_the_least_recently_used_session() {
    // Regression: 1001 initialize without DELETE locked every
    // new client out for MCP_K8S_SESSION_TTL_S.
    let server = HttpServer::start(&[("MCP_K8S_MAX_SESSIONS", "2")]);
    let oldest = server.initialize();
    let recent = server.initialize();
    assert_eq!(server.post(Some(&oldest), PING).status, 200, "oldest is now the most recently used");
    let newest = server.initialize();
    assert_eq!(server.post(Some(&recent), PING).status, 404, "the least recently used session was evicted");
    assert_eq!(server.post(Some(&oldest), PING).status, 200);
    assert_eq!(server.post(Some(&newest), PING).status, 200);
}

/// A tokens file's callers, before any run: each token is one caller, a
/// session is its maker's alone, and each sees the tools its limit names.
#[test]
fn callers_of_a_tokens_file() {
    let dir = crate::support::TempDir::new("tokens");
    let tokens = dir.path.join("tokens.json");
    let digest = |token: &str| {
        let output = std::process::Command::new("sh").arg("-c").arg(format!("printf %s '{token}' | sha256sum")).output().unwrap();
        String::from_utf8(output.stdout).unwrap().split_whitespace().next().unwrap().to_string()
    };
    let file = json!([
        {"name": "alpha", "token_sha256": digest("alpha-secret"), "tools": ["describe_environment"]},
        {"name": "beta", "token_sha256": digest("beta-secret")},
    ]);
    std::fs::write(&tokens, file.to_string()).unwrap();
    let path = tokens.display().to_string();
    let server = HttpServer::start(&[("MCP_K8S_AUTH_TOKENS_FILE", &path)]);
    let post = |token: Option<&str>, session: Option<&str>, body: &str| {
        let mut headers = vec![("Content-Type", "application/json"), ("Accept", "application/json")];
        if let Some(token) = token {
            headers.push(("X-MCP-AUTH", token));
        }
        if let Some(session) = session {
            headers.push(("Mcp-Session-Id", session));
        }
        server.request("POST", "/mcp", &headers, body)
    };
    assert_eq!(post(None, None, INITIALIZE).status, 401);
    assert_eq!(post(Some("gamma-secret"), None, INITIALIZE).status, 401);
    let open = |token: &str| post(Some(token), None, INITIALIZE).header("mcp-session-id").expect("a session").to_string();
    let (alpha, beta) = (open("alpha-secret"), open("beta-secret"));

    let tools = |token: &str, session: &str| -> Vec<String> {
        let listed = post(Some(token), Some(session), r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#).json();
        listed["result"]["tools"].as_array().unwrap().iter().map(|tool| tool["name"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(tools("alpha-secret", &alpha), ["describe_environment"]);
    assert!(tools("beta-secret", &beta).len() > 1);
    let call = |token: &str, session: &str, name: &str| {
        let body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": name, "arguments": {}}}).to_string();
        post(Some(token), Some(session), &body).json()
    };
    let refused = call("alpha-secret", &alpha, "list_jobs");
    assert_eq!(refused["error"]["code"], -32602);
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("tool `list_jobs` is not allowed for caller `alpha` (its limit `tools`); allowed: describe_environment"),
        "{message}"
    );
    let described = call("beta-secret", &beta, "describe_environment");
    let caller = &described["result"]["structuredContent"]["caller"];
    assert_eq!((caller["name"].as_str(), caller["sees"].as_str()), (Some("beta"), Some("its own runs")), "{described}");

    // A session is its maker's: another caller's token finds nothing there.
    let ping = r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#;
    assert_eq!(post(Some("alpha-secret"), Some(&beta), ping).status, 404);
    let deleted = server.request("DELETE", "/mcp", &[("X-MCP-AUTH", "alpha-secret"), ("Mcp-Session-Id", &beta)], "");
    assert_eq!(deleted.status, 404);
    assert_eq!(post(Some("beta-secret"), Some(&beta), ping).status, 200, "beta's session outlived alpha's delete");

    // Regression: a legacy stream of another caller answered 401 where an
    // unknown session answers 404, which told that the id exists.
    let legacy = LegacyStream::open_with(&server, &[("X-MCP-AUTH", "beta-secret")]);
    let post_legacy = |token: &str, endpoint: &str| {
        server.request("POST", endpoint, &[("Content-Type", "application/json"), ("X-MCP-AUTH", token)], ping)
    };
    let unknown = post_legacy("alpha-secret", "/messages?sessionId=nope");
    let foreign = post_legacy("alpha-secret", &legacy.endpoint);
    assert_eq!((foreign.status, &foreign.body), (unknown.status, &unknown.body), "another caller's stream looks like none");
    assert_eq!(foreign.status, 404);
    assert_eq!(post_legacy("beta-secret", &legacy.endpoint).status, 202, "its maker's token still posts");
}

/// A tokens file naming a tool the server does not have stops it at start.
#[test]
fn a_tokens_file_naming_an_unknown_tool_stops_the_server() {
    let dir = crate::support::TempDir::new("tokens-unknown");
    let tokens = dir.path.join("tokens.json");
    let file = json!([{"name": "alpha", "token_sha256": "a".repeat(64), "tools": ["run_jobs"]}]);
    std::fs::write(&tokens, file.to_string()).unwrap();
    let path = tokens.display().to_string();
    let output = crate::support::server::command(&[("MCP_K8S_TRANSPORT", "http"), ("MCP_K8S_AUTH_TOKENS_FILE", &path)]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("caller `alpha`, field `tools`: `run_jobs` is not a tool of this server; its tools: describe_environment, run_job"),
        "{stderr}"
    );
}

/// Named sites, none of them reachable: the server still starts (the test
/// servers' MCP_K8S_LAZY_BACKEND=1), says which site is which and why none
/// can run, and refuses a site it has not.
#[test]
fn named_sites_that_cannot_be_reached_are_described_and_refused_by_name() {
    let dir = crate::support::TempDir::new("sites");
    let sites = dir.path.join("sites.json");
    // A Docker site's runner binary is checked before its daemon is asked,
    // and this test binary is dynamically linked.
    let runner = crate::support::static_elf_stub(&dir).display().to_string();
    let file = json!([
        {"name": "one", "backend": "docker", "docker_host": format!("unix://{}/one.sock", dir.path.display()), "runner_binary": runner},
        {"name": "two", "default": true, "backend": "docker", "docker_host": format!("unix://{}/two.sock", dir.path.display()), "runner_binary": runner},
    ]);
    std::fs::write(&sites, file.to_string()).unwrap();
    let path = sites.display().to_string();
    let server = HttpServer::start(&[("MCP_K8S_SITES", &path), ("MCP_K8S_ALLOWED_IMAGES", "busybox:1.36")]);
    let session = server.initialize();
    // Each request its own id: a session never uses one twice (the
    // server refuses an id still in flight, and the last call's may be).
    let next_id = std::sync::atomic::AtomicU64::new(5);
    let call = |name: &str, arguments: serde_json::Value| {
        let id = next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let body =
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}).to_string();
        let response = server.post(Some(&session), &body);
        let result = response.json()["result"].clone();
        assert!(!result.is_null(), "{name}: {} {}", response.status, response.body);
        result
    };
    let described = call("describe_environment", json!({}));
    let sites = described["structuredContent"]["sites"].as_array().unwrap().clone();
    let names: Vec<(&str, bool)> = sites.iter().map(|site| (site["name"].as_str().unwrap(), site["default"] == true)).collect();
    assert_eq!(names, [("two", true), ("one", false)], "the default first");
    assert!(sites.iter().all(|site| site["health"].as_str().unwrap().starts_with("unreachable: ")), "{sites:?}");
    let refused = call("run_job", json!({"image": "busybox:1.36", "command": ["true"], "site": "mars"}));
    assert_eq!(refused["content"][0]["text"], "unknown site `mars`; sites here: two, one");
    let schema = server.post(Some(&session), r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).json();
    let run_job = schema["result"]["tools"].as_array().unwrap().iter().find(|tool| tool["name"] == "run_job").unwrap().clone();
    assert_eq!(run_job["inputSchema"]["properties"]["site"]["enum"], json!(["two", "one", null]));
    let no_backend = call("run_job", json!({"image": "busybox:1.36", "command": ["true"], "site": "one"}));
    assert_eq!(no_backend["isError"], true);
    let why = no_backend["content"][0]["text"].as_str().unwrap();
    assert!(why.starts_with("this server has no backend to run sandboxes on: "), "{no_backend}");
    let listed = call("list_jobs", json!({}));
    let unreachable: Vec<&str> =
        listed["structuredContent"]["unreachable_sites"].as_array().unwrap().iter().map(|site| site["site"].as_str().unwrap()).collect();
    assert_eq!(unreachable, ["two", "one"], "{listed}");
}

/// MCP_K8S_PROBE_ADDR: the probes answer on a port of their own, which
/// answers nothing else, and still answer while every connection of the
/// MCP port, and its probe reserve, is taken by streams and idle sockets.
#[test]
fn the_probe_port_answers_the_probes_alone_while_the_mcp_port_is_full() {
    let server = HttpServer::start(&[("MCP_K8S_PROBE_ADDR", "127.0.0.1:0"), ("MCP_K8S_MAX_CONNECTIONS", "2")]);
    let probe_addr = server
        .startup_log
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|log| log["msg"] == "listening for probes")
        .and_then(|log| log["addr"].as_str().map(str::to_string))
        .expect("a `listening for probes` log line before `listening`");
    assert_ne!(probe_addr, server.addr);
    let get = |path: &str| exchange(&probe_addr, format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes());
    assert!(get("/healthz").starts_with("HTTP/1.1 200 OK"));
    // `/readyz` is 503 here: this server has no backend.
    assert!(get("/readyz").contains("not ready: "));
    assert!(get("/metrics").contains("mcp_k8s_"));
    let elsewhere = get("/mcp");
    assert!(elsewhere.starts_with("HTTP/1.1 404") && elsewhere.contains("MCP_K8S_ADDR"), "{elsewhere}");
    // Two legacy streams take both connections; 16 sockets that send
    // nothing take the probe reserve.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(&server.addr).unwrap();
        stream.write_all(b"GET /sse HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n").unwrap();
        let mut line = String::new();
        BufReader::new(stream.try_clone().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 200"), "{line}");
        held.push(stream);
    }
    for _ in 0..16 {
        held.push(TcpStream::connect(&server.addr).unwrap());
    }
    // Nothing is sent, so that the refusal's close cannot reset what it
    // wrote: a newcomer with no head yet is told the port is full.
    let refused = exchange(&server.addr, b"");
    assert!(refused.starts_with("HTTP/1.1 503") && refused.contains("MCP_K8S_MAX_CONNECTIONS"), "the MCP port is full: {refused}");
    assert!(get("/healthz").starts_with("HTTP/1.1 200 OK"));
    drop(held);
}
