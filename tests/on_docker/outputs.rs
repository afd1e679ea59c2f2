//! The output store's life on the Docker backend (the contract table reads
//! links on every backend; this is what happens to them after): a stored
//! output read after its retention ended says so, and a cancelled run
//! keeps nothing in the folder. Engine behaviour, the same on every
//! backend, so one backend runs it.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::backend::{Removed, fetch, fetch_done, ok, run_id_of, server, server_env};
use crate::BUSYBOX;
use crate::support::TempDir;
use crate::support::server::{HttpServer, StdioServer, peak_rss_kib, raw_request_within, restart_peak_rss};

/// A `resources/read`'s whole response.
fn read(server: &mut StdioServer, uri: &str) -> Value {
    server.send(&json!({"jsonrpc": "2.0", "id": "read", "method": "resources/read", "params": {"uri": uri}}).to_string());
    loop {
        let message = server.recv();
        if message["id"] == "read" {
            return message;
        }
    }
}

/// What the folder holds, by name, hidden entries included.
fn entries(dir: &TempDir) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(&dir.path).unwrap().flatten().map(|entry| entry.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// The shortest retention there is (60 s): the link reads until then, and
/// after it the same read says the output expired and when, or, once the
/// reaper has deleted it, that its retention ended.
#[test]
fn a_link_read_after_its_retention_ended_says_it_expired() {
    let dir = TempDir::new("outputs-expiry");
    let mut server = server(&[("MCP_K8S_OUTPUTS_DIR", dir.path.to_str().unwrap()), ("MCP_K8S_RESULT_TTL_S", "60")]);
    let out = ok(&mut server, "run_job", json!({"image": BUSYBOX, "command": ["head", "-c", "1048600", "/dev/zero"], "network": "none"}));
    let link = &out["links"][0];
    let uri = link["uri"].as_str().unwrap_or_else(|| panic!("no link in {out}"));
    let first = read(&mut server, uri);
    // NUL bytes: a blob, as text they would take six bytes each.
    assert!(first["result"]["contents"][0]["blob"].is_string(), "readable at first: {first}");
    let expires_at = mcp_k8s_ephemeral_job::time::parse_rfc3339(link["expires_at"].as_str().unwrap()).unwrap();
    // Poll the read itself: it is the signal.
    let deadline = Instant::now() + Duration::from_secs(120);
    let answer = loop {
        let answer = read(&mut server, uri);
        if answer["error"].is_object() {
            break answer;
        }
        assert!(Instant::now() < deadline, "still readable two minutes on: {answer}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(std::time::SystemTime::now() >= expires_at, "not before its expiry: {answer}");
    assert_eq!(answer["error"]["code"], -32002, "{answer}");
    // Expired, or already deleted by the reaper (its minute's tick can come
    // right after the expiry): either way the read says why.
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("expired at") || message.contains("(60 s, MCP_K8S_RESULT_TTL_S) has ended"), "{answer}");
}

/// A run cancelled while its output was being stored leaves nothing in the
/// folder: neither the partial folder nor a finished one.
#[test]
fn a_cancelled_run_keeps_nothing_in_the_store() {
    let dir = TempDir::new("outputs-cancel");
    let mut server = server(&[("MCP_K8S_OUTPUTS_DIR", dir.path.to_str().unwrap())]);
    let script = "head -c 1100000 /dev/zero; echo; echo spilled; sleep 300";
    let submitted = ok(&mut server, "submit_job", json!({"image": BUSYBOX, "command": ["sh", "-c", script], "network": "none"}));
    let token = submitted["job_token"].as_str().unwrap().to_string();
    let _removed = Removed(vec![token.clone()]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !entries(&dir).iter().any(|name| name.starts_with(".partial-") && name.contains(run_id_of(&token))) {
        assert!(Instant::now() < deadline, "the run's output never reached the store: {:?}", entries(&dir));
        std::thread::sleep(Duration::from_millis(100));
        let _ = fetch(&mut server, &token, 0);
    }
    let cancelled = ok(&mut server, "cancel_job", json!({"job_token": token}));
    assert_eq!(cancelled["cancel_requested"], true, "{cancelled}");
    let done = fetch_done(&mut server, &token);
    assert_eq!(done["result"]["status"], "cancelled", "{}", done["result"]["message"]);
    assert!(done["result"]["links"].is_null(), "a cancelled run links nothing: {}", done["result"]["links"]);
    assert_eq!(entries(&dir), Vec::<String>::new(), "the store keeps nothing of a cancelled run");
}

/// 128 clients reading 1 MiB pieces of one stored output at once: each
/// gets its piece, and the server holds a few pieces at a time, never all
/// (a piece is held as bytes, as text and as the reply until it is sent).
#[test]
fn a_hundred_and_twenty_eight_readers_at_once_stay_within_64_mib() {
    let dir = TempDir::new("outputs-readers");
    let env = server_env(&[("MCP_K8S_OUTPUTS_DIR", dir.path.to_str().unwrap())]);
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let server = HttpServer::start(&env);
    let session = server.initialize();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_job", "arguments":
        {"image": BUSYBOX, "command": ["head", "-c", "8388608", "/dev/zero"], "network": "none"}}});
    let ran = server.post(Some(&session), &call.to_string()).json();
    let uri = ran["result"]["structuredContent"]["links"][0]["uri"].as_str().unwrap_or_else(|| panic!("no link: {ran}")).to_string();
    // The run's own peak (its answer) is not the readers'.
    let before_kib = restart_peak_rss(server.child.id());
    let pieces: Vec<Value> = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..128u64)
            .map(|reader| {
                let (addr, session, uri) = (&server.addr, &session, &uri);
                scope.spawn(move || {
                    let piece = format!("{uri}?offset={}&length=1048576", (reader % 8) << 20);
                    let body = json!({"jsonrpc": "2.0", "id": reader + 10, "method": "resources/read", "params": {"uri": piece}});
                    let headers =
                        [("Content-Type", "application/json"), ("Accept", "application/json"), ("Mcp-Session-Id", session.as_str())];
                    raw_request_within(addr, "POST", "/mcp", &headers, body.to_string().as_bytes(), Duration::from_secs(120)).json()
                })
            })
            .collect();
        readers.into_iter().map(|reader| reader.join().unwrap()).collect()
    });
    for piece in &pieces {
        assert_eq!(
            piece["result"]["contents"][0]["_meta"]["length"],
            1_048_576,
            "{}",
            &piece.to_string()[..piece.to_string().len().min(300)]
        );
    }
    let peak_kib = peak_rss_kib(server.child.id());
    println!("peak RSS with 128 readers at once: {peak_kib} KiB (RSS before them: {before_kib} KiB)");
    assert!(peak_kib <= 64 << 10, "peak RSS {peak_kib} KiB, over 64 MiB");
}
