//! The hostile-input suite for the HTTP transport, without a
//! cluster: each test starts the built binary on loopback, runs one class
//! of attack while a second client keeps calling `GET /healthz` and an MCP
//! `ping` on an established session, and asserts that the server is still
//! alive, that every probe was answered (5 s per probe: a hang, not a slow
//! machine), and that the server's peak RSS (VmHWM) stayed within 64 MiB.
//!
//! Each test prints one markdown table row (attack, peak RSS, probes, max
//! and median probe latency); `bench/hostile` collects them. The tests
//! take turns (one lock), so the figures are not skewed by each other.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::server::peak_rss_kib;
use crate::support::server::{HttpServer, INITIALIZE};

const TOKEN: &str = "hostile-suite-token";

/// `MCP_K8S_MAX_MESSAGE_BYTES` for the suite; the body budget is twice it.
const MAX_MESSAGE_BYTES: usize = 2 << 20;

const PEAK_RSS_LIMIT_KIB: u64 = 64 << 10;

/// A probe that takes longer than this counts as a hang (a failure).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take: longer than the server's own wait for
/// its shared body budget (5 s, then 503), so a request the server answers
/// late is read as its answer, not as a client time-out (status 0), on a
/// loaded machine. Probes check their own latency against `PROBE_TIMEOUT`.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// How long floods of connections are held open: longer than a probe may
/// take, so that a server frozen by them fails its probes.
const HOLD: Duration = Duration::from_secs(7);

/// One attack at a time: figures from parallel attacks would mean nothing.
static SERIAL: Mutex<()> = Mutex::new(());

// ---------------------------------------------------------------------------
// The attacks.

#[test]
fn huge_content_length_on_every_path_and_method() {
    run_attack("huge Content-Length, every path and method", &[], Probes::MustSucceed, |target| {
        let paths = ["/healthz", "/readyz", "/metrics", "/mcp", "/sse", "/messages?sessionId=x", "/nope"];
        let methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"];
        for path in paths {
            for method in methods {
                for token in [None, Some(TOKEN)] {
                    let auth = token.map(|token| format!("X-MCP-AUTH: {token}\r\n")).unwrap_or_default();
                    let head = format!(
                        "{method} {path} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Type: application/json\r\nContent-Length: 1125899906842624\r\n\r\n",
                        target.addr
                    );
                    let status = status_of(&target.addr, head.as_bytes());
                    assert!(status.is_some(), "{method} {path}: no answer");
                    if (method, path, token.is_some()) == ("POST", "/mcp", true) {
                        assert_eq!(status, Some(413), "{method} {path}");
                    }
                }
            }
        }
    });
}

#[test]
fn six_hundred_idle_connections_declaring_a_body() {
    run_attack("600 idle connections declaring a body", &[], Probes::MustSucceed, |target| {
        let head = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\nContent-Length: 100000\r\n\r\n", target.addr);
        let connections = open_many(&target.addr, 600, head.as_bytes());
        thread::sleep(HOLD);
        drop(connections);
    });
}

#[test]
fn six_hundred_connections_that_send_nothing() {
    run_attack("600 connections sending nothing", &[], Probes::MustSucceed, |target| {
        let connections = open_many(&target.addr, 600, b"");
        thread::sleep(HOLD);
        drop(connections);
    });
}

#[test]
fn unterminated_200_mb_header() {
    run_attack("unterminated 200 MB header (x4)", &[], Probes::MustSucceed, |target| {
        let senders: Vec<_> = (0..4)
            .map(|_| {
                let addr = target.addr.clone();
                thread::spawn(move || {
                    let head = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nX-Big: ");
                    let line = vec![b'a'; 1 << 20];
                    stream_until_refused(&addr, head.as_bytes(), &line, 200)
                })
            })
            .collect();
        for sender in senders {
            let sent = sender.join().unwrap();
            assert!(sent < 200 << 20, "the server read the whole 200 MB header");
        }
    });
}

#[test]
fn two_million_tiny_headers() {
    run_attack("2,000,000 tiny headers", &[], Probes::MustSucceed, |target| {
        let head = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n", target.addr);
        let headers = b"a: b\r\n".repeat(100_000);
        let sent = stream_until_refused(&target.addr, head.as_bytes(), &headers, 20);
        assert!(sent < 12_000_000, "the server read every header");
    });
}

#[test]
fn slowloris_heads() {
    run_attack("slowloris: 200 heads, a byte every 500 ms", &[], Probes::MustSucceed, |target| {
        let mut connections = open_many(&target.addr, 200, b"G");
        let started = Instant::now();
        let mut closed = vec![false; connections.len()];
        // The head timeout is 2 s here: every connection is answered 408
        // and closed long before the loop ends.
        while started.elapsed() < Duration::from_secs(8) && closed.iter().any(|closed| !closed) {
            for (connection, closed) in connections.iter_mut().zip(closed.iter_mut()) {
                if !*closed && connection.write_all(b"E").is_err() {
                    *closed = true;
                }
            }
            thread::sleep(Duration::from_millis(500));
        }
        for connection in &connections {
            let status = read_status(connection);
            assert!(status.is_none() || status == Some(408), "{status:?}");
        }
    });
}

#[test]
fn bodies_that_never_complete() {
    run_attack("20 bodies that never complete (token)", &[], Probes::MustSucceed, |target| {
        // 408 after the body timeout (3 s), or 503 when the budget stayed full.
        for status in stalled_posts(target, "Content-Length: 500000", "{\"jsonrpc\":") {
            assert!(matches!(status, Some(408 | 503)), "{status:?}");
        }
    });
}

#[test]
fn unterminated_chunked_bodies() {
    run_attack("20 unterminated chunked bodies (token)", &[], Probes::MustSucceed, |target| {
        for status in stalled_posts(target, "Transfer-Encoding: chunked", "11\r\n{\"jsonrpc\":\"2.0\",\r\n") {
            assert_eq!(status, Some(408));
        }
    });
}

/// 20 authenticated POSTs whose body starts with `body_start` and stops
/// there; the status each got.
fn stalled_posts(target: &Target, framing: &str, body_start: &str) -> Vec<Option<u16>> {
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nX-MCP-AUTH: {TOKEN}\r\nContent-Type: application/json\r\n{framing}\r\n\r\n{body_start}",
        target.addr
    );
    open_many(&target.addr, 20, head.as_bytes()).iter().map(read_status).collect()
}

#[test]
fn connection_upgrade_is_answered_and_closed() {
    run_attack("50 Connection: upgrade requests", &[], Probes::MustSucceed, |target| {
        for index in 0..50 {
            let path = if index % 2 == 0 { "/mcp" } else { "/healthz" };
            let head = format!(
                "GET {path} HTTP/1.1\r\nHost: {}\r\nX-MCP-AUTH: {TOKEN}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\r\n",
                target.addr
            );
            let mut stream = connect(&target.addr);
            stream.write_all(head.as_bytes()).unwrap();
            let mut answer = Vec::new();
            // The server closes after its answer: read_to_end ends.
            stream.read_to_end(&mut answer).unwrap();
            let text = String::from_utf8_lossy(&answer);
            let expected = if path == "/mcp" { "HTTP/1.1 405" } else { "HTTP/1.1 200" };
            assert!(text.starts_with(expected) && text.contains("Connection: close"), "{text}");
        }
    });
}

#[test]
fn six_hundred_sse_streams_opened_then_closed() {
    // While 512 streams hold every regular slot, new MCP requests are
    // refused with 503; the probes are served from the reserve.
    run_attack("600 /sse streams opened, then closed", &[], Probes::PingMayBeRefused, |target| {
        let head = format!("GET /sse HTTP/1.1\r\nHost: {}\r\nX-MCP-AUTH: {TOKEN}\r\nAccept: text/event-stream\r\n\r\n", target.addr);
        let streams = open_many(&target.addr, 600, head.as_bytes());
        thread::sleep(Duration::from_secs(2));
        drop(streams);
        // Closed streams are noticed within a tick, not at the next 15 s
        // keepalive: a second later every slot is free again.
        thread::sleep(Duration::from_millis(1500));
        assert_eq!(ping(&target.addr, &target.session).map(|(status, _)| status), Ok(200));
        let more = open_many(&target.addr, 400, head.as_bytes());
        let statuses: Vec<Option<u16>> = more.iter().map(read_status).collect();
        assert!(statuses.iter().all(|status| *status == Some(200)), "slots were not freed: {statuses:?}");
    });
}

#[test]
fn eleven_hundred_initialize_without_delete() {
    run_attack("1100 initialize without DELETE", &[], Probes::MustSucceed, |target| {
        let first = initialize(&target.addr);
        for _ in 0..1100 {
            initialize(&target.addr);
        }
        // The least recently used sessions were evicted: a new client gets
        // in, and the evicted one hears 404 (and would initialize again).
        assert!(!initialize(&target.addr).is_empty());
        assert_eq!(ping(&target.addr, &first).map(|(status, _)| status), Ok(404));
    });
}

#[test]
fn sse_client_that_never_reads_its_replies() {
    run_attack("/sse client never reads 200 x 1 MB replies", &[], Probes::MustSucceed, |target| {
        let mut stream = connect(&target.addr);
        let head = format!("GET /sse HTTP/1.1\r\nHost: {}\r\nX-MCP-AUTH: {TOKEN}\r\nAccept: text/event-stream\r\n\r\n", target.addr);
        stream.write_all(head.as_bytes()).unwrap();
        let endpoint = read_endpoint(&stream);
        let id = "i".repeat(1_000_000);
        let message = format!(r#"{{"jsonrpc":"2.0","id":"{id}","method":"ping"}}"#);
        let mut statuses = Vec::new();
        for _ in 0..200 {
            let headers = [("X-MCP-AUTH", TOKEN), ("Content-Type", "application/json")];
            let status = request(&target.addr, "POST", &endpoint, &headers, message.as_bytes()).map(|(status, _)| status);
            statuses.push(status.unwrap_or(0));
        }
        // The queue filled, the stream was dropped and its session ended.
        assert_eq!(statuses.last(), Some(&404), "{statuses:?}");
        assert!(statuses.iter().all(|status| *status == 202 || *status == 404), "{statuses:?}");
        drop(stream);
    });
}

#[test]
fn concurrent_max_size_posts_with_the_token() {
    run_attack("16 concurrent max-size POSTs + 4 of twice the size", &[], Probes::MustSucceed, |target| {
        let pad = "p".repeat(MAX_MESSAGE_BYTES - 100);
        let fits = Arc::new(format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{pad}"}}}}"#));
        let too_large = Arc::new(format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{pad}{pad}"}}}}"#));
        let posters: Vec<_> = (0..20)
            .map(|index| {
                let (addr, session) = (target.addr.clone(), target.session.clone());
                let message = if index < 16 { Arc::clone(&fits) } else { Arc::clone(&too_large) };
                thread::spawn(move || {
                    let headers = [("X-MCP-AUTH", TOKEN), ("Content-Type", "application/json"), ("Mcp-Session-Id", session.as_str())];
                    (0..3)
                        .map(|_| request(&addr, "POST", "/mcp", &headers, message.as_bytes()).map(|(status, _)| status))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for (index, poster) in posters.into_iter().enumerate() {
            for status in poster.join().unwrap() {
                let status = status.unwrap_or(0);
                // 503: the shared body budget stayed full for its wait.
                let expected: &[u16] = if index < 16 { &[200, 503] } else { &[413, 0] };
                assert!(expected.contains(&status), "poster {index}: {status}");
            }
        }
    });
}

/// The server's default message cap and body budget, for the attacks that
/// measure what the defaults allow.
const DEFAULT_LIMITS: &[(&str, &str)] = &[("MCP_K8S_MAX_MESSAGE_BYTES", "4194304"), ("MCP_K8S_BODY_BUDGET_BYTES", "33554432")];

/// A message under every per-message cap that costs the most once parsed:
/// a `tools/call` whose arguments hold 99,000 strings of 38 characters
/// (4.06 MB of text, about twice that as parsed values).
fn costly_call() -> String {
    let strings = vec![format!("\"{}\"", "s".repeat(38)); 99_000].join(",");
    format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"describe_environment","arguments":{{"x":[{strings}]}}}}}}"#
    )
}

/// `clients` clients post the costly message at once, twice each, with
/// the server's defaults: the memory a message costs after it is read
/// (the parse, the call) is held within the budget too.
fn costly_messages_at_once(clients: usize) {
    let name = format!("{clients} clients posting 4 MB messages of 99,000 strings at once (defaults)");
    run_attack(&name, DEFAULT_LIMITS, Probes::MustSucceed, |target| {
        let message = Arc::new(costly_call());
        let posters: Vec<_> = (0..clients)
            .map(|_| {
                let (addr, session, message) = (target.addr.clone(), target.session.clone(), Arc::clone(&message));
                thread::spawn(move || {
                    let headers = [("X-MCP-AUTH", TOKEN), ("Content-Type", "application/json"), ("Mcp-Session-Id", session.as_str())];
                    (0..2)
                        .map(|_| request(&addr, "POST", "/mcp", &headers, message.as_bytes()).map(|(status, _)| status))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let statuses: Vec<u16> = posters.into_iter().flat_map(|poster| poster.join().unwrap()).map(|status| status.unwrap_or(0)).collect();
        // 503: the budget stayed full for its wait; the client may retry.
        assert!(statuses.iter().all(|status| [200, 503].contains(status)), "{statuses:?}");
        assert!(statuses.contains(&200), "some were served: {statuses:?}");
    });
}

#[test]
fn costly_messages_from_8_clients_at_once() {
    costly_messages_at_once(8);
}

#[test]
fn costly_messages_from_32_clients_at_once() {
    costly_messages_at_once(32);
}

#[test]
fn costly_messages_from_128_clients_at_once() {
    costly_messages_at_once(128);
}

#[test]
fn request_smuggling_shapes() {
    run_attack("request smuggling shapes", &[], Probes::MustSucceed, |target| {
        let cases: &[(&str, u16)] = &[
            ("Content-Length: -1\r\n", 400),
            ("Content-Length: +5\r\n", 400),
            ("Content-Length: 5 5\r\n", 400),
            ("Content-Length: 5, 5\r\n", 400),
            ("Content-Length: 0x5\r\n", 400),
            ("Content-Length: 5\r\nContent-Length: 40\r\n", 400),
            ("Content-Length: 5\r\nContent-Length: 5\r\n", 400),
            ("Host: evil.example.com\r\n", 400),
            ("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", 400),
            ("Transfer-Encoding: gzip, chunked\r\n", 501),
            ("Transfer-Encoding: identity\r\n", 501),
            ("Transfer-Encoding : chunked\r\n", 400),
            ("X-Folded: a\r\n Transfer-Encoding: chunked\r\n", 400),
            ("X-Bare: a\nContent-Length: 40\r\n", 400),
            // A well-formed body nobody reads: the connection closes rather
            // than take what follows as the next request.
            ("Content-Length: 5\r\n", 405),
        ];
        for (headers, expected) in cases {
            // A second request hides in the body; it must never be answered.
            let smuggled = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
            let text = format!("POST /healthz HTTP/1.1\r\nHost: {}\r\n{headers}\r\nhello{smuggled}", target.addr);
            let mut stream = connect(&target.addr);
            stream.write_all(text.as_bytes()).unwrap();
            let mut answer = Vec::new();
            let _ = stream.read_to_end(&mut answer);
            let answer = String::from_utf8_lossy(&answer);
            assert!(answer.starts_with(&format!("HTTP/1.1 {expected} ")), "{headers:?}: {answer}");
            assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{headers:?}: answered twice: {answer}");
        }
    });
}

/// RFC 9112 section 3.2: an HTTP/1.1 request carries exactly one Host, a
/// host name, IPv4 address or bracketed IPv6 address with an optional port
/// of 0 to 65535; HTTP/1.0 may leave it out. The DNS-rebinding check on
/// the MCP endpoints still applies to a valid but foreign name (421).
#[test]
fn host_header_rules() {
    run_attack("Host header rules", &[], Probes::MustSucceed, |target| {
        let port = target.addr.rsplit(':').next().unwrap_or_default();
        let cases: Vec<(String, u16)> = vec![
            ("GET /healthz HTTP/1.1\r\n\r\n".into(), 400),
            ("GET /healthz HTTP/1.0\r\n\r\n".into(), 200),
            (format!("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}@evil.example\r\n\r\n"), 400),
            ("GET /healthz HTTP/1.1\r\nHost: [::1]evil.example\r\n\r\n".into(), 400),
            ("GET /healthz HTTP/1.1\r\nHost: localhost:abc\r\n\r\n".into(), 400),
            ("GET /healthz HTTP/1.1\r\nHost: localhost:99999\r\n\r\n".into(), 400),
            ("GET /healthz HTTP/1.1\r\nHost: local host\r\n\r\n".into(), 400),
            ("GET /healthz HTTP/1.1\r\nHost: localhost:65535\r\nConnection: close\r\n\r\n".into(), 200),
            ("GET /healthz HTTP/1.1\r\nHost: [::1]:0\r\nConnection: close\r\n\r\n".into(), 200),
            (format!("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"), 200),
            ("GET /healthz HTTP/1.1\r\nHost: probe.example\r\nConnection: close\r\n\r\n".into(), 200),
            (format!("GET /mcp HTTP/1.1\r\nHost: evil.example:{port}\r\nX-MCP-AUTH: {TOKEN}\r\n\r\n"), 421),
        ];
        for (head, expected) in cases {
            let answer = answer_to(&target.addr, head.as_bytes());
            assert!(answer.starts_with(&format!("HTTP/1.1 {expected} ")), "{head:?}: {answer}");
        }
    });
}

/// RFC 9112 section 3.2.2: a server must accept an absolute-form target
/// (`POST http://host/mcp`); its authority stands for the Host header,
/// so the DNS-rebinding check looks at it.
#[test]
fn absolute_form_targets_are_served() {
    run_attack("absolute-form targets", &[], Probes::MustSucceed, |target| {
        let addr = &target.addr;
        let ping = r#"{"jsonrpc":"2.0","id":"absolute","method":"ping"}"#;
        let post = |url: &str| {
            format!(
                "POST {url} HTTP/1.1\r\nHost: {addr}\r\nX-MCP-AUTH: {TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\nMCP-Protocol-Version: 2025-11-25\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{ping}",
                target.session,
                ping.len()
            )
        };
        let get = |url: &str| format!("GET {url} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let cases: Vec<(String, u16)> = vec![
            (post(&format!("http://{addr}/mcp")), 200),
            (get(&format!("http://{addr}/healthz")), 200),
            (get(&format!("HTTP://{addr}/healthz?x=1")), 200),
            (get(&format!("https://{addr}/healthz")), 200),
            (get(&format!("http://{addr}")), 404),
            (get(&format!("ftp://{addr}/healthz")), 400),
            (get(&format!("http://user@{addr}/healthz")), 400),
            (get("http:///healthz"), 400),
            (post("http://evil.example/mcp"), 421),
        ];
        for (head, expected) in cases {
            let answer = answer_to(addr, head.as_bytes());
            assert!(answer.starts_with(&format!("HTTP/1.1 {expected} ")), "{head:?}: {answer}");
            if expected == 200 && head.starts_with("POST") {
                assert!(answer.contains(r#""result":{}"#), "{answer}");
            }
        }
    });
}

/// Two values of a header the access checks or the 2026-07-28 header
/// checks read would let a proxy and this server see different requests
/// (each taking a different one): 400, as for two Host headers.
#[test]
fn duplicate_access_and_mcp_headers_are_refused() {
    run_attack("duplicate access and MCP headers", &[], Probes::MustSucceed, |target| {
        let cases = [
            ("Mcp-Method", "tools/list", "tools/call"),
            ("Origin", "http://localhost", "http://evil.example"),
            ("Authorization", &format!("Bearer {TOKEN}") as &str, "Bearer wrong"),
            ("X-MCP-AUTH", TOKEN, "wrong"),
            ("Mcp-Name", "describe_environment", "run_job"),
            ("MCP-Protocol-Version", "2026-07-28", "2025-11-25"),
            ("Mcp-Session-Id", target.session.as_str(), "other"),
        ];
        for (name, first, second) in cases {
            let head = format!(
                "POST /mcp HTTP/1.1\r\nHost: {}\r\n{name}: {first}\r\n{}: {second}\r\nContent-Length: 0\r\n\r\n",
                target.addr,
                name.to_ascii_lowercase()
            );
            let answer = answer_to(&target.addr, head.as_bytes());
            assert!(answer.starts_with("HTTP/1.1 400 "), "{name}: {answer}");
            assert!(answer.contains(&format!("more than one `{name}` header")), "{name}: {answer}");
        }
    });
}

/// The README promises 400 for bare LF line ends: a head with one is
/// refused as soon as it arrives, not after the head timeout (408).
#[test]
fn bare_lf_heads_are_refused_at_once() {
    run_attack("bare LF heads", &[], Probes::MustSucceed, |target| {
        let cases = [
            format!("GET /healthz HTTP/1.1\nHost: {}\n\n", target.addr),
            format!("GET /healthz HTTP/1.1\r\nHost: {}\n\n", target.addr),
            format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\n", target.addr),
            "\nGET /healthz HTTP/1.1\r\n".to_string(),
            "GET /healthz HTTP/1.1\rHost: x".to_string(),
        ];
        for head in cases {
            let answer = answer_to(&target.addr, head.as_bytes());
            assert!(answer.starts_with("HTTP/1.1 400 "), "{head:?}: {answer}");
            assert!(answer.contains("CRLF"), "{head:?}: {answer}");
        }
    });
}

/// RFC 9112 section 6.1: Transfer-Encoding in an HTTP/1.0 message is
/// faulty framing: 400, and the connection closes.
#[test]
fn transfer_encoding_on_http_1_0_is_refused() {
    run_attack("Transfer-Encoding on HTTP/1.0", &[], Probes::MustSucceed, |target| {
        let smuggled = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
        for framing in
            ["Transfer-Encoding: chunked\r\n", "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", "Transfer-Encoding: gzip\r\n"]
        {
            let head = format!("POST /mcp HTTP/1.0\r\nX-MCP-AUTH: {TOKEN}\r\n{framing}\r\n5\r\nhello\r\n0\r\n\r\n{smuggled}");
            let answer = answer_to(&target.addr, head.as_bytes());
            assert!(answer.starts_with("HTTP/1.1 400 "), "{framing:?}: {answer}");
            assert!(answer.contains("HTTP/1.0") && answer.contains("Connection: close"), "{framing:?}: {answer}");
            // The smuggled GET would be a 200 (the message names HTTP/1.1
            // too, so status lines are not simply counted).
            assert!(!answer.contains("HTTP/1.1 200"), "{framing:?}: answered twice: {answer}");
        }
    });
}

/// The 1,024-byte cap on a chunk-size line (size and extensions) holds
/// when the whole line arrived with the head, in one read.
#[test]
fn long_chunk_extensions_are_refused_when_already_buffered() {
    run_attack("2,000-byte chunk extension in one write", &[], Probes::MustSucceed, |target| {
        let ping = r#"{"jsonrpc":"2.0","id":"chunked","method":"ping"}"#;
        for (extension_bytes, expected) in [(2000, 400), (1000, 200)] {
            let extension = "x".repeat(extension_bytes);
            let text = format!(
                "POST /mcp HTTP/1.1\r\nHost: {}\r\nX-MCP-AUTH: {TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\nMCP-Protocol-Version: 2025-11-25\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n{:x};e={extension}\r\n{ping}\r\n0\r\n\r\n",
                target.addr,
                target.session,
                ping.len()
            );
            let answer = answer_to(&target.addr, text.as_bytes());
            assert!(answer.starts_with(&format!("HTTP/1.1 {expected} ")), "{extension_bytes}: {answer}");
            if expected == 400 {
                assert!(answer.contains("chunk-size or trailer line too long"), "{answer}");
            }
        }
    });
}

/// More clients than `MCP_K8S_MAX_CONNECTIONS` connect, wait, then each
/// sends a ping: every one gets an HTTP answer. Those whose slot went to a
/// newcomer hear 503 with Retry-After, never a silent close.
#[test]
fn every_client_beyond_the_connection_cap_gets_an_answer() {
    run_attack("48 clients on 8 connections, then each pings", &[("MCP_K8S_MAX_CONNECTIONS", "8")], Probes::PingMayBeRefused, |target| {
        let mut clients: Vec<TcpStream> = (0..48).map(|_| connect(&target.addr)).collect();
        thread::sleep(Duration::from_millis(500));
        let ping = r#"{"jsonrpc":"2.0","id":"capped","method":"ping"}"#;
        let request = format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nX-MCP-AUTH: {TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\nMCP-Protocol-Version: 2025-11-25\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{ping}",
            target.addr,
            target.session,
            ping.len()
        );
        for client in &mut clients {
            // A client already answered and closed may see its write fail.
            let _ = client.write_all(request.as_bytes());
        }
        let mut statuses = Vec::new();
        for (index, client) in clients.iter_mut().enumerate() {
            let mut answer = Vec::new();
            // A reset after the answer still leaves the answer read.
            let _ = client.read_to_end(&mut answer);
            let answer = String::from_utf8_lossy(&answer);
            let status = answer.split(' ').nth(1).unwrap_or("none").to_string();
            match status.as_str() {
                "200" => assert!(answer.contains(r#""result":{}"#), "client {index}: {answer}"),
                "503" => {
                    assert!(answer.contains("Retry-After: 1") && answer.contains("MCP_K8S_MAX_CONNECTIONS"), "client {index}: {answer}")
                }
                _ => panic!("client {index} got no HTTP answer: {answer:?}"),
            }
            statuses.push(status);
        }
        assert!(statuses.iter().any(|status| status == "200"), "{statuses:?}");
    });
}

/// Regression: unauthenticated clients pipelining `GET /metrics` without
/// ever reading the answers held every connection slot (each thread sat
/// blocked writing until the write timeout, counted as inside a request,
/// never evicted), and every authenticated ping got 503. A connection
/// whose client takes none of its answers now gives up its slot to a
/// newcomer, as an idle one does.
#[test]
fn pipelined_metrics_never_read_take_no_slot_from_an_authenticated_client() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    // A long write timeout: the slots must come free by eviction, not by
    // the hostile connections timing out. No prober runs meanwhile, so
    // that the hostile connections take every slot.
    let mut server = start_server(&[("MCP_K8S_MAX_CONNECTIONS", "8"), ("MCP_K8S_WRITE_TIMEOUT_S", "120")]);
    let session = initialize(&server.addr);
    let pipelined = format!("GET /metrics HTTP/1.1\r\nHost: {}\r\n\r\n", server.addr).repeat(200);
    // Connections are opened until 8 are stalled: one that lands in the
    // probe reserve (a slot of the initialize may not be free yet) is
    // answered once and closed. Each sends its first requests at once,
    // within the head timeout.
    let mut hostile = Vec::new();
    for _ in 0..40 {
        if hostile.len() == 8 {
            break;
        }
        let mut stream = connect(&server.addr);
        if write_until_the_server_stops_reading(&mut stream, pipelined.as_bytes()) {
            hostile.push(stream);
        }
    }
    assert_eq!(hostile.len(), 8, "the hostile connections were refused");
    // Every slot now has a thread blocked writing answers nobody reads.
    // A client that retries on 503 (as Retry-After tells it) gets in.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut refusals = 0;
    let answer = loop {
        match ping(&server.addr, &session) {
            Ok((503, body)) if body.contains("MCP_K8S_MAX_CONNECTIONS") && Instant::now() < deadline => refusals += 1,
            other => break other,
        }
        // The client's retry pace, not a wait for the server.
        thread::sleep(Duration::from_millis(100));
    };
    assert!(matches!(&answer, Ok((200, body)) if body.contains(r#""result":{}"#)), "after {refusals} refusals: {answer:?}");
    assert!(server.child.try_wait().unwrap().is_none(), "the server died");
    let peak_kib = peak_rss_kib(server.child.id());
    eprintln!("\n| 8 of 8 connections pipelining GET /metrics, never reading | {:.1} | 1 | {refusals} | | | |", peak_kib as f64 / 1024.0);
    drop(hostile);
}

/// Writes `bytes` over and over until a write makes no progress for a
/// second: true when the server has stopped reading (its thread is
/// blocked writing answers), false when it closed the connection.
fn write_until_the_server_stops_reading(stream: &mut TcpStream, bytes: &[u8]) -> bool {
    stream.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match stream.write(bytes) {
            Ok(written) if written > 0 => {}
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => return true,
            _ => return false,
        }
    }
    panic!("the server read pipelined requests for 30 s without its answers being read");
}

/// Malformed `Mcp-Name` values in the 2026-07-28 encoded form get 400
/// with -32020, and the server stays up; a valid one is decoded.
#[test]
fn malformed_encoded_mcp_names() {
    run_attack("malformed encoded Mcp-Name values", &[], Probes::MustSucceed, |target| {
        let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"describe_environment","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
        let long = format!("=?base64?{}?=", "QUFB".repeat(3000));
        let cases: Vec<(String, u16)> = vec![
            ("=?base64?ZGVzY3JpYmVfZW52aXJvbm1lbnQ=?=".into(), 200),
            ("=?base64?!!!?=".into(), 400),
            ("=?base64?/w==?=".into(), 400),
            ("=?base64?=?=".into(), 400),
            ("=?base64?".into(), 400),
            ("=?base64??=".into(), 400),
            ("=?base64?7aCA?=".into(), 400),
            (long, 400),
        ];
        for (value, expected) in cases {
            let headers = [
                ("X-MCP-AUTH", TOKEN),
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("MCP-Protocol-Version", "2026-07-28"),
                ("Mcp-Method", "tools/call"),
                ("Mcp-Name", value.as_str()),
            ];
            let answer = request(&target.addr, "POST", "/mcp", &headers, call.as_bytes());
            let shown: String = value.chars().take(40).collect();
            assert!(matches!(&answer, Ok((status, _)) if *status == expected), "{shown}: {answer:?}");
            if expected == 400 {
                assert!(answer.is_ok_and(|(_, body)| body.contains("-32020")), "{shown}");
            }
        }
    });
}

// ---------------------------------------------------------------------------
// The harness.

/// What an attack needs to know about the server.
struct Target {
    addr: String,
    /// The prober's session; attacks may ping on it too.
    session: String,
}

/// Whether the ping probe may get 503 (every connection slot is inside a
/// request, which the probe reserve does not serve).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Probes {
    MustSucceed,
    PingMayBeRefused,
}

#[derive(Default)]
struct ProbeStats {
    latencies: Vec<Duration>,
    refused_pings: usize,
    failures: Vec<String>,
}

fn run_attack(name: &str, env: &[(&str, &str)], probes: Probes, attack: impl FnOnce(&Target)) {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut server = start_server(env);
    let target = Target { addr: server.addr.clone(), session: initialize(&server.addr) };
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (addr, session, stop) = (target.addr.clone(), target.session.clone(), Arc::clone(&stop));
        thread::spawn(move || probe_until_stopped(&addr, &session, probes, &stop))
    };
    let started = Instant::now();
    attack(&target);
    let attack_time = started.elapsed();
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let mut stats = prober.join().expect("the prober ran");
    assert!(server.child.try_wait().unwrap().is_none(), "{name}: the server died");
    for answer in [request(&target.addr, "GET", "/healthz", &[], b""), ping(&target.addr, &target.session)] {
        assert!(matches!(answer, Ok((200, _))), "{name}: after the attack: {answer:?}");
    }
    let peak_kib = peak_rss_kib(server.child.id());
    stats.latencies.sort();
    let max = stats.latencies.last().copied().unwrap_or_default();
    let median = stats.latencies.get(stats.latencies.len() / 2).copied().unwrap_or_default();
    // A line of its own: the test harness prints `test … ... ` before it.
    eprintln!(
        "\n| {name} | {:.1} | {} | {} | {:.1} | {:.1} | {:.1} |",
        peak_kib as f64 / 1024.0,
        stats.latencies.len(),
        stats.refused_pings,
        max.as_secs_f64() * 1000.0,
        median.as_secs_f64() * 1000.0,
        attack_time.as_secs_f64()
    );
    assert!(stats.failures.is_empty(), "{name}: probes failed: {:#?}", stats.failures);
    assert!(stats.latencies.len() >= 2, "{name}: too few probes ran");
    assert!(peak_kib <= PEAK_RSS_LIMIT_KIB, "{name}: peak RSS {peak_kib} KiB is over {PEAK_RSS_LIMIT_KIB} KiB");
}

/// The suite's server: a token, a 2 MiB message cap with room for two in
/// the body budget, and short timeouts so that attacks end quickly.
fn start_server(env: &[(&str, &str)]) -> HttpServer {
    let max_message = MAX_MESSAGE_BYTES.to_string();
    let budget = (2 * MAX_MESSAGE_BYTES).to_string();
    let mut all_env = vec![
        ("MCP_K8S_AUTH_TOKEN", TOKEN),
        ("MCP_K8S_MAX_MESSAGE_BYTES", max_message.as_str()),
        ("MCP_K8S_BODY_BUDGET_BYTES", budget.as_str()),
        ("MCP_K8S_HEAD_TIMEOUT_S", "2"),
        ("MCP_K8S_BODY_TIMEOUT_S", "3"),
        ("MCP_K8S_IDLE_TIMEOUT_S", "5"),
        ("MCP_K8S_WRITE_TIMEOUT_S", "3"),
    ];
    all_env.extend_from_slice(env);
    match std::env::var("MCP_K8S_BIN") {
        // Another build (bench/hostile's static one): no test hooks, which
        // no attack here calls and a release build refuses.
        Ok(binary) => HttpServer::start_binary(&binary, &all_env),
        Err(_) => HttpServer::start(&all_env),
    }
}

/// `GET /healthz` and a `ping` on `session`, over and over, each on a new
/// connection and timed.
fn probe_until_stopped(addr: &str, session: &str, probes: Probes, stop: &AtomicBool) -> ProbeStats {
    let mut stats = ProbeStats::default();
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        match request(addr, "GET", "/healthz", &[], b"") {
            Ok((200, body)) if body == "ok\n" && started.elapsed() <= PROBE_TIMEOUT => stats.latencies.push(started.elapsed()),
            other => stats.failures.push(format!("healthz after {:?}: {other:?}", started.elapsed())),
        }
        let started = Instant::now();
        match ping(addr, session) {
            Ok((200, body)) if body.contains(r#""result":{}"#) && started.elapsed() <= PROBE_TIMEOUT => {
                stats.latencies.push(started.elapsed());
            }
            Ok((503, body)) if probes == Probes::PingMayBeRefused && body.contains("MCP_K8S_MAX_CONNECTIONS") => {
                stats.refused_pings += 1;
            }
            other => stats.failures.push(format!("ping after {:?}: {other:?}", started.elapsed())),
        }
        thread::sleep(Duration::from_millis(100));
    }
    stats
}

fn initialize(addr: &str) -> String {
    let headers = [("X-MCP-AUTH", TOKEN), ("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    let (status, head, _) = request_with_head(addr, "POST", "/mcp", &headers, INITIALIZE.as_bytes()).expect("initialize answers");
    assert_eq!(status, 200, "initialize");
    head.lines()
        .find_map(|line| line.strip_prefix("Mcp-Session-Id: "))
        .map(|id| id.trim().to_string())
        .expect("initialize returns a session id")
}

fn ping(addr: &str, session: &str) -> Result<(u16, String), String> {
    let headers = [
        ("X-MCP-AUTH", TOKEN),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Mcp-Session-Id", session),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    request(addr, "POST", "/mcp", &headers, br#"{"jsonrpc":"2.0","id":"probe","method":"ping"}"#)
}

/// One request on its own connection, within `PROBE_TIMEOUT` per read;
/// status and body. Errors are values: a probe must not panic its thread.
fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<(u16, String), String> {
    request_with_head(addr, method, path, headers, body).map(|(status, _, body)| (status, body))
}

fn request_with_head(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<(u16, String, String), String> {
    let socket_addr = addr.parse().map_err(|error| format!("{addr}: {error}"))?;
    let mut stream = TcpStream::connect_timeout(&socket_addr, REQUEST_TIMEOUT).map_err(|error| format!("connect: {error}"))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT)).map_err(|error| error.to_string())?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT)).map_err(|error| error.to_string())?;
    let mut text = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    stream.write_all(text.as_bytes()).map_err(|error| format!("write: {error}"))?;
    // A refusal may come before the body is read; the answer still counts.
    let _ = stream.write_all(body);
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(|error| format!("read: {error} after {} bytes", answer.len()))?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").ok_or_else(|| format!("no complete head: {answer:?}"))?;
    let status = head.split(' ').nth(1).and_then(|status| status.parse().ok()).ok_or_else(|| format!("no status: {head:?}"))?;
    Ok((status, head.to_string(), body.to_string()))
}

fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(15))).unwrap();
    stream
}

/// Writes `bytes` on a new connection and reads the answer to the end
/// (the server closes after it, or the request said `Connection: close`).
fn answer_to(addr: &str, bytes: &[u8]) -> String {
    let mut stream = connect(addr);
    // A refusal may come before everything was written.
    let _ = stream.write_all(bytes);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// `count` connections that each sent `first_bytes` and are kept open.
fn open_many(addr: &str, count: usize, first_bytes: &[u8]) -> Vec<TcpStream> {
    (0..count)
        .map(|_| {
            let mut stream = connect(addr);
            // The server may already have refused and closed it.
            let _ = stream.write_all(first_bytes);
            stream
        })
        .collect()
}

/// The status of the answer on `stream`, or `None` when it closed first.
fn read_status(stream: &TcpStream) -> Option<u16> {
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    line.split(' ').nth(1)?.parse().ok()
}

/// Sends `head` alone and returns the status of the answer.
fn status_of(addr: &str, head: &[u8]) -> Option<u16> {
    let mut stream = connect(addr);
    stream.write_all(head).ok()?;
    let status = read_status(&stream);
    let _ = stream.shutdown(Shutdown::Both);
    status
}

/// Writes `head`, then `piece` up to `times` times, until the server stops
/// taking bytes; returns how many bytes went out.
fn stream_until_refused(addr: &str, head: &[u8], piece: &[u8], times: usize) -> usize {
    let mut stream = connect(addr);
    let mut sent = 0;
    if stream.write_all(head).is_err() {
        return 0;
    }
    for _ in 0..times {
        match stream.write(piece) {
            Ok(written) if written > 0 => sent += written,
            _ => break,
        }
    }
    sent
}

/// Reads the legacy stream up to its `endpoint` event, and no further.
fn read_endpoint(stream: &TcpStream) -> String {
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("an SSE line");
        if let Some(endpoint) = line.trim_end().strip_prefix("data: ") {
            return endpoint.to_string();
        }
    }
}
