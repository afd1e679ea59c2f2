//! The contract table: one case per promise every backend makes,
//! run unchanged on each backend its tier names (`super::BACKEND`), with the
//! same expected results. A case says what the caller sees through MCP and
//! that nothing of the run is left afterwards; how a backend keeps those
//! promises is not its business (`harness.rs` hides the differences).
//!
//! Where the backends truly differ, the difference is an entry of
//! `EXCEPTIONS` below, named where the case uses it, and nowhere else.

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use super::BACKEND;
use super::harness::{BUSYBOX, Cleanup, Kind, MISSING_IMAGE, PYTHON, Server, assert_nothing_left, run_id_of_token};

/// A difference between backends that the table allows, and why.
pub struct Exception {
    pub name: &'static str,
    pub backend: Kind,
    pub why: &'static str,
}

/// Every allowed difference. Adding one needs a reason a reader can check.
pub const EXCEPTIONS: &[Exception] = &[Exception {
    name: "missing-image-reason",
    backend: Kind::Docker,
    why: "images are never pulled unless the operator allows it (MCP_K8S_DOCKER_PULL), so a missing image is \
          `ImageNotPresent` at once; Podman also allows `ImagePullFailed` when a pull was allowed and failed. \
          Kubernetes always tries the pull (the kubelet's policy), so it is `ImagePullFailed` there.",
}];

/// The reason for exception `name` when it applies on this tier's backend.
fn excepted(name: &str) -> Option<&'static str> {
    let exception = EXCEPTIONS.iter().find(|exception| exception.name == name);
    let exception = exception.unwrap_or_else(|| panic!("no exception named {name} in EXCEPTIONS"));
    (exception.backend == BACKEND.backend()).then_some(exception.why)
}

fn server(extra: &[(&str, &str)]) -> Server {
    Server::start(BACKEND, extra)
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn sh(script: &str) -> Value {
    json!(["sh", "-c", script])
}

#[test]
fn exit_zero_is_succeeded() {
    let mut server = server(&[]);
    let out = server.run(json!({"image": BUSYBOX, "command": sh("echo hello")}));
    assert_eq!((out["status"].as_str(), out["exit_code"].as_i64()), (Some("succeeded"), Some(0)), "{out}");
    assert_eq!(out["stdout"], "hello\n", "{out}");
    assert_eq!(out["stderr"], "", "{out}");
    assert!(out["timings"]["started_at"].is_string(), "{out}");
    // One order on every backend: the stamps (RFC 3339, UTC, one format)
    // that are there never go back in time.
    let phases = ["submitted_at", "created_at", "scheduled_at", "started_at", "first_output_at", "finished_at", "answered_at"];
    let stamps: Vec<&str> = phases.iter().filter_map(|key| out["timings"][key].as_str()).collect();
    assert!(stamps.len() >= 5, "{out}");
    assert!(stamps.windows(2).all(|pair| pair[0] <= pair[1]), "timings out of order: {}", out["timings"]);
    // The server's own stamps of a run answered in the call, and the warm
    // flag (this table runs cold and warm alike).
    for key in ["submitted_at", "first_output_at", "answered_at"] {
        assert!(out["timings"][key].is_string(), "{key}: {}", out["timings"]);
    }
    assert!(out["timings"]["warm"].is_boolean(), "{}", out["timings"]);
    assert!(out["timings"]["first_output_ms"].as_u64() <= out["timings"]["answer_ms"].as_u64(), "{}", out["timings"]);
}

#[test]
fn a_non_zero_exit_keeps_its_code_and_the_streams_apart() {
    let mut server = server(&[]);
    let id = server.send_call("run_job", json!({"image": BUSYBOX, "command": sh("echo to-stdout; echo to-stderr >&2; exit 3")}));
    let called = server.answer(id);
    let out = &called.result["structuredContent"];
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("failed"), Some("NonZeroExit")), "{out}");
    assert_eq!(out["exit_code"], 3, "{out}");
    assert_eq!(out["stdout"], "to-stdout\n", "{out}");
    assert_eq!(out["stderr"], "to-stderr\n", "{out}");
    assert!(called.progress.iter().any(|line| line.contains("to-stdout")), "live output reaches progress: {:?}", called.progress);
    assert_nothing_left(BACKEND, out["run_id"].as_str().unwrap_or_default());
}

#[test]
fn output_over_the_cap_keeps_head_and_tail_and_says_truncated() {
    let mut server = server(&[("MCP_K8S_MAX_OUTPUT_BYTES", "2048")]);
    let script = "i=0; while [ $i -lt 5000 ]; do echo line-$i; i=$((i+1)); done";
    let out = server.run(json!({"image": BUSYBOX, "command": sh(script)}));
    let stdout = out["stdout"].as_str().unwrap_or_default();
    assert_eq!(out["truncated"]["stdout"], true, "{out}");
    assert!(stdout.starts_with("line-0\n") && stdout.ends_with("line-4999\n"), "head and tail: {stdout}");
    assert!(stdout.contains("bytes omitted]"), "{stdout}");
    assert!(out["stdout_total_bytes"].as_u64().unwrap_or_default() > 40_000, "{out}");
}

#[test]
fn an_artifact_comes_back_with_its_sha256() {
    let mut server = server(&[]);
    let out = server.run(json!({"image": BUSYBOX, "command": sh("printf hello > out.txt")}));
    assert_eq!(out["status"], "succeeded", "{out}");
    let artifact = &out["artifacts"][0];
    assert_eq!(artifact["path"], "out.txt", "{out}");
    // sha256("hello")
    assert_eq!(artifact["sha256"], "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824", "{out}");
    assert_eq!(artifact["content_b64"], b64(b"hello"), "{out}");
}

#[test]
fn a_timeout_keeps_the_partial_output_and_files() {
    let mut server = server(&[]);
    let started = Instant::now();
    let out = server.run(json!({"image": BUSYBOX, "command": sh("echo partial; echo x > made.txt; sleep 60"), "timeout_s": 3}));
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("timeout"), Some("DeadlineExceeded")), "{out}");
    assert_eq!(out["stdout"], "partial\n", "{out}");
    assert_eq!(out["artifacts"][0]["path"], "made.txt", "{out}");
    assert!(started.elapsed() < Duration::from_secs(50), "the timeout stopped the command: {:?}", started.elapsed());
}

#[test]
fn running_out_of_memory_is_oomkilled() {
    let mut server = server(&[]);
    let program = "b = bytearray(400 * 1024 * 1024); print(len(b))";
    let out = server.run(json!({"image": PYTHON, "command": ["python3", "-c", program], "limits": {"memory": "64Mi"}}));
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("failed"), Some("OOMKilled")), "{out}");
    assert!(out["message"].as_str().unwrap_or_default().contains("limits.memory=64Mi"), "{out}");
}

#[test]
fn a_missing_image_is_a_clear_error_naming_it() {
    let mut server = server(&[]);
    let started = Instant::now();
    let out = server.run(json!({"image": MISSING_IMAGE, "command": ["true"]}));
    assert_eq!(out["status"], "error", "{out}");
    let reason = out["reason"].as_str().unwrap_or_default();
    if let Some(why) = excepted("missing-image-reason") {
        assert!(["ImageNotPresent", "ImagePullFailed"].contains(&reason), "{why}\n{out}");
    } else {
        assert_eq!(reason, "ImagePullFailed", "{out}");
    }
    assert!(out["message"].as_str().unwrap_or_default().contains(MISSING_IMAGE), "the message names the image: {out}");
    assert!(started.elapsed() < Duration::from_secs(60), "fails fast, not after the start timeout: {:?}", started.elapsed());
}

#[test]
fn an_mcp_cancel_stops_the_run_and_leaves_nothing() {
    let mut server = server(&[]);
    let id = server.send_call("run_job", json!({"image": BUSYBOX, "command": sh("echo begun; sleep 300")}));
    let run_id = server.wait_progress(id, "begun");
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id, "reason": "contract"}});
    server.stdio.send(&cancel.to_string());
    let cancelled_at = Instant::now();
    assert_nothing_left(BACKEND, &run_id);
    assert!(cancelled_at.elapsed() < Duration::from_secs(30), "the sandbox went at once: {:?}", cancelled_at.elapsed());
    // MCP: a cancelled request gets no response; the partial output of a
    // cancel is the next case's (cancel_job, whose caller asks for it).
    let late = server.stdio.nothing_within(Duration::from_millis(500));
    assert!(late.is_none(), "a cancelled request gets no response: {late:?}");
}

#[test]
fn cancel_job_is_cancelled_with_the_partial_output() {
    let mut server = server(&[]);
    let token = server.submit(json!({"image": BUSYBOX, "command": sh("echo before-cancel; sleep 300; echo never")}));
    let _cleanup = Cleanup::tokens(BACKEND, &[&token]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !server.ok("fetch_job", json!({"job_token": token, "wait_s": 2}))["stdout"].as_str().unwrap_or_default().contains("before-cancel")
    {
        assert!(Instant::now() < deadline, "no output from {token}");
    }
    let answered = server.ok("cancel_job", json!({"job_token": token}));
    assert_eq!(answered["cancel_requested"], true, "{answered}");
    let done = server.fetch_done(&token);
    let out = &done["result"];
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("cancelled"), Some("Cancelled")), "{out}");
    let stdout = out["stdout"].as_str().unwrap_or_default();
    assert!(stdout.contains("before-cancel") && !stdout.contains("never"), "{out}");
}

#[test]
fn submit_then_fetch_is_the_run_job_result() {
    let mut server = server(&[]);
    let token = server.submit(json!({"image": BUSYBOX, "command": sh("echo in-the-background; exit 4")}));
    let _cleanup = Cleanup::tokens(BACKEND, &[&token]);
    let done = server.fetch_done(&token);
    let out = &done["result"];
    assert_eq!((out["status"].as_str(), out["exit_code"].as_i64()), (Some("failed"), Some(4)), "{out}");
    assert_eq!(out["stdout"], "in-the-background\n", "{out}");
    assert_eq!(out["run_id"], run_id_of_token(&token), "{out}");
    let again = server.ok("fetch_job", json!({"job_token": token, "wait_s": 0}));
    assert_eq!(again["result"], *out, "a second fetch answers the same");
}

#[test]
fn the_same_token_is_fetched_after_a_server_restart() {
    let mut first = server(&[]);
    let token = first.submit(json!({"image": BUSYBOX, "command": sh("echo before-restart; sleep 4; echo after-restart")}));
    let _cleanup = Cleanup::tokens(BACKEND, &[&token]);
    // Dropping the server SIGKILLs it: nothing of the run may depend on it.
    drop(first);
    let mut second = server(&[]);
    let done = second.fetch_done(&token);
    let out = &done["result"];
    assert_eq!(out["status"], "succeeded", "{out}");
    assert_eq!(out["stdout"], "before-restart\nafter-restart\n", "{out}");
}

/// The audit trail: one `run` line for a synchronous run, a `submitted`
/// and an `ended` line for a background one, field by field; never the
/// command, an `env` value or the output.
#[test]
fn the_audit_trail_says_who_ran_what_and_how_it_ended_and_nothing_of_the_call() {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let path = std::env::temp_dir().join(format!("mcp-audit-{BACKEND:?}-{}-{nanos}.jsonl", std::process::id()));
    let secret = format!("audit-secret-{nanos}");
    let marker = format!("audit-marker-{nanos}");
    let mut server = server(&[("MCP_K8S_AUDIT_LOG", path.to_str().unwrap())]);
    // The pools' network: on a warm server the run is a warm hit, whose
    // line must name the run the answer names.
    let network = super::harness::pools_network();
    let call = |exit: u8| {
        json!({"image": BUSYBOX, "command": sh(&format!("echo {marker} $AUDIT_SECRET; exit {exit}")),
               "env": {"AUDIT_SECRET": secret}, "network": network})
    };
    let ran = server.run(call(3));
    let token = server.submit(call(0));
    let _cleanup = Cleanup::tokens(BACKEND, &[&token]);
    let done = server.fetch_done(&token);
    assert_eq!(done["result"]["status"], "succeeded", "{done}");

    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    assert!(!text.contains(&secret) && !text.contains(&marker) && !text.contains("AUDIT_SECRET"), "the trail holds caller data:\n{text}");
    let lines: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).expect("a JSON line")).collect();
    let run_id = run_id_of_token(&token);
    let mut want = vec![
        json!({"event": "run", "run_id": ran["run_id"], "site": "default", "caller": "stdio", "tool": "run_job",
               "image": BUSYBOX, "network": network, "status": "failed", "reason": "NonZeroExit", "exit_code": 3}),
        json!({"event": "submitted", "run_id": run_id, "site": "default", "caller": "stdio", "tool": "submit_job",
               "image": BUSYBOX, "network": network}),
        json!({"event": "ended", "run_id": run_id, "site": "default", "status": "succeeded", "reason": null, "exit_code": 0}),
    ];
    assert_eq!(lines.len(), want.len(), "one line per event:\n{text}");
    for (line, want) in lines.iter().zip(&mut want) {
        let mut line = line.clone();
        let fields = line.as_object_mut().unwrap();
        // Times vary: present and of the right kind is the promise.
        assert!(fields.remove("time").is_some_and(|time| time.as_str().is_some_and(|time| time.ends_with('Z'))), "{text}");
        assert!(fields.remove("duration_ms").is_none_or(|ms| ms.is_u64()), "{text}");
        let elapsed = fields.remove("elapsed_ms");
        assert_eq!(elapsed.is_some(), want["event"] == "run", "elapsed_ms on a synchronous run only: {text}");
        assert_eq!(&line, want, "{text}");
    }
}

/// One `resources/read` of a stored output: the bytes (text or blob) and
/// the answer's `_meta`; or the JSON-RPC error.
fn read_piece(server: &mut Server, uri: &str) -> Result<(Vec<u8>, Value), Value> {
    let answer = server.request("resources/read", json!({"uri": uri}));
    let Some(content) = answer["result"]["contents"].get(0) else { return Err(answer["error"].clone()) };
    let bytes = match (content["text"].as_str(), content["blob"].as_str()) {
        (Some(text), None) => text.as_bytes().to_vec(),
        (None, Some(blob)) => base64::engine::general_purpose::STANDARD.decode(blob).unwrap(),
        _ => panic!("a content is text or blob: {answer}"),
    };
    Ok((bytes, content["_meta"].clone()))
}

/// Reads a stored output whole, following each piece's `next`, and
/// returns its SHA-256 in hex and the number of pieces.
fn read_whole(server: &mut Server, uri: &str) -> (String, usize) {
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    let (mut next, mut pieces) = (Some(uri.to_string()), 0);
    while let Some(uri) = next {
        let (bytes, meta) = read_piece(server, &uri).unwrap_or_else(|error| panic!("{uri}: {error}"));
        assert!(bytes.len() <= 512 << 10, "a piece without length is at most 512 KiB: {meta}");
        digest.update(&bytes);
        pieces += 1;
        next = meta["next"].as_str().map(str::to_string);
    }
    (digest.finish().as_ref().iter().map(|byte| format!("{byte:02x}")).collect(), pieces)
}

/// Streams and files past the inline caps are kept whole in the output
/// store and linked from the result: read back in pieces, byte-exact (the
/// hashes the command printed), by this server and by a second one (a
/// replica, or this one restarted); a range past the end, a length of 0
/// or over the piece limit, and a run nobody made answer as documented.
#[test]
fn outputs_past_the_caps_are_linked_and_read_back_whole_in_pieces() {
    let dir = super::support::TempDir::new("outputs");
    let settings = [("MCP_K8S_OUTPUTS_DIR", dir.path.to_str().unwrap()), ("MCP_K8S_MAX_ARTIFACT_BYTES", "1048576")];
    let mut server = server(&settings);
    let script = "head -c 3145733 /dev/urandom > /tmp/out; sha256sum /tmp/out >&2; cat /tmp/out; \
                  head -c 2621440 /dev/urandom > big.bin; sha256sum big.bin >&2; echo small > small.txt";
    let out = server.run(json!({"image": BUSYBOX, "command": sh(script), "network": "none"}));
    // The result without its megabytes, for the messages below.
    let brief = json!({"status": out["status"], "message": out["message"], "links": out["links"], "notes": out["notes"]});
    assert_eq!(out["status"], "succeeded", "{brief}");
    assert_eq!((out["truncated"]["stdout"].as_bool(), out["stdout_total_bytes"].as_u64()), (Some(true), Some(3_145_733)), "{brief}");
    let hashes: Vec<&str> = out["stderr"].as_str().unwrap().lines().filter_map(|line| line.split_whitespace().next()).collect();
    let links = out["links"].as_array().unwrap_or_else(|| panic!("no links in {brief}"));
    let facts: Vec<(&str, u64, bool)> =
        links.iter().map(|link| (link["name"].as_str().unwrap(), link["size"].as_u64().unwrap(), link["complete"] == true)).collect();
    assert_eq!(facts, [("stdout", 3_145_733, true), ("big.bin", 2_621_440, true)], "{brief}");
    let small = out["artifacts"].as_array().unwrap().iter().find(|artifact| artifact["path"] == "small.txt").unwrap();
    assert!(small["content_b64"].is_string(), "what fits stays inline: {brief}");
    let (stdout_uri, file_uri) = (links[0]["uri"].as_str().unwrap().to_string(), links[1]["uri"].as_str().unwrap().to_string());

    let (stdout_hash, pieces) = read_whole(&mut server, &stdout_uri);
    assert_eq!((stdout_hash.as_str(), pieces), (hashes[0], 7), "3 MiB and 5 bytes are seven pieces of 512 KiB");
    // A second server on the same folder: a replica, or this one after a
    // restart.
    let mut replica = super::harness::Server::start(BACKEND, &settings);
    assert_eq!(read_whole(&mut replica, &file_uri).0, hashes[1]);

    let size = 3_145_733;
    let (at_end, meta) = read_piece(&mut server, &format!("{stdout_uri}?offset={size}")).unwrap();
    assert!(at_end.is_empty() && meta["next"].is_null(), "{meta}");
    let (empty, _) = read_piece(&mut server, &format!("{stdout_uri}?offset=7&length=0")).unwrap();
    assert!(empty.is_empty());
    let (capped, meta) = read_piece(&mut server, &format!("{stdout_uri}?offset=1&length=99999999")).unwrap();
    assert_eq!(
        (capped.len(), meta["size"].as_u64(), meta["next"].as_str()),
        (1 << 20, Some(size), Some(format!("{stdout_uri}?offset={}&length={}", (1 << 20) + 1, 1 << 20).as_str()))
    );
    let past = read_piece(&mut server, &format!("{stdout_uri}?offset={}", size + 1)).unwrap_err();
    assert_eq!(past["code"], -32602, "{past}");
    assert!(past["message"].as_str().unwrap().contains("past the end"), "{past}");
    let unknown = stdout_uri.replace(out["run_id"].as_str().unwrap(), "0123456789abcdef0123456789abcdef");
    let missing = read_piece(&mut replica, &unknown).unwrap_err();
    assert_eq!(missing["code"], -32002, "another run's link, or a guess, reads nothing: {missing}");

    // A background run's result links the same way, fetched on the
    // replica after the first server has read it to its end: a warm
    // sandbox is gone by then, and the replica answers from the store.
    let token = server.submit(json!({"image": BUSYBOX, "command": sh("head -c 1048580 /dev/zero"), "network": "none"}));
    let _cleanup = Cleanup::tokens(BACKEND, &[&token]);
    let first = server.fetch_done(&token);
    assert_eq!(first["result"]["links"][0]["size"].as_u64(), Some(1_048_580), "{}", first["result"]["links"]);
    let done = replica.fetch_done(&token);
    let link = &done["result"]["links"][0];
    // The whole result but its output, so that a run that ended otherwise
    // says how (status, reason, message, notes).
    let mut shown = done.clone();
    for stream in ["stdout", "stderr"] {
        if let Some(text) = shown["result"][stream].as_str() {
            shown["result"][stream] = json!(format!("{} bytes", text.len()));
        }
    }
    assert_eq!(
        (link["name"].as_str(), link["size"].as_u64(), link["complete"].as_bool()),
        (Some("stdout"), Some(1_048_580), Some(true)),
        "{shown}"
    );
    let (bytes, _) = read_piece(&mut server, &format!("{}?offset=1048570", link["uri"].as_str().unwrap())).unwrap();
    assert_eq!(bytes, [0; 10]);

    // Nobody asks for a background run's output until it has ended: its
    // stored output is whole all the same (on Kubernetes the runner holds
    // it in the pod until this server has fetched it, and the server does
    // not wait to be asked before it reads). `list_jobs` reads no output.
    let unasked = server.submit(json!({"image": BUSYBOX, "command": sh("head -c 1048590 /dev/zero"), "network": "none"}));
    let _cleanup = Cleanup::tokens(BACKEND, &[&unasked]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        let listed = server.ok("list_jobs", json!({}));
        let entry = listed["jobs"].as_array().and_then(|jobs| jobs.iter().find(|job| job["job_token"] == unasked.as_str()).cloned());
        if entry.as_ref().is_some_and(|entry| entry["status"] == "done") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not done in three minutes: {entry:?}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let done = server.fetch_done(&unasked);
    let link = &done["result"]["links"][0];
    assert_eq!(
        (link["size"].as_u64(), link["complete"].as_bool(), &done["result"]["notes"]),
        (Some(1_048_590), Some(true), &json!([])),
        "{}",
        json!({"links": done["result"]["links"], "notes": done["result"]["notes"]})
    );
}

/// A key of its own for each call of the suite: results are kept for an
/// hour, and the tiers share the cluster and the daemon.
fn fresh_key(label: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("contract-{label}-{}-{nanos}", std::process::id())
}

/// A tool error's text.
fn tool_error(server: &mut Server, tool: &str, arguments: Value) -> String {
    let called = server.call(tool, arguments);
    assert_eq!(called.result["isError"], true, "{tool}: {}", called.result);
    called.result["content"][0]["text"].as_str().unwrap_or_default().to_string()
}

/// A submit that is retried, at once from two replicas, after a restart,
/// and once more, is one run; the same key with other arguments, or for
/// another tool, is a tool error that names the key.
#[test]
fn an_idempotency_key_makes_every_retry_the_same_run() {
    let key = fresh_key("submit");
    // Output no second run could repeat.
    let arguments = json!({"image": BUSYBOX, "command": sh("cat /proc/sys/kernel/random/uuid; sleep 2"), "idempotency_key": key});
    let mut first = server(&[]);
    let mut second = server(&[]);
    // Both replicas at once: the create decides, never a lock here.
    let (one, two) = (first.send_call("submit_job", arguments.clone()), second.send_call("submit_job", arguments.clone()));
    let token_of = |server: &Server, id: u64| {
        let called = server.answer(id);
        assert_eq!(called.result["isError"], false, "{}", called.result);
        called.result["structuredContent"]["job_token"].as_str().unwrap_or_default().to_string()
    };
    let token = token_of(&first, one);
    let _cleanup = Cleanup::tokens(BACKEND, &[&token]);
    assert_eq!(token_of(&second, two), token, "two replicas given one key made two runs");
    assert_eq!(first.submit(arguments.clone()), token, "a retry on the same server");
    // Dropping a server SIGKILLs it: the key lives in the cluster.
    drop(first);
    let mut restarted = server(&[]);
    assert_eq!(restarted.submit(arguments.clone()), token, "a retry after a restart");

    let mut other = arguments.clone();
    other["command"] = sh("echo something else");
    let said = tool_error(&mut restarted, "submit_job", other);
    assert!(said.contains(&format!("idempotency_key `{key}` was already used")), "{said}");
    let said = tool_error(&mut restarted, "run_job", arguments.clone());
    assert!(said.contains("was already used for a call with other arguments (or another tool)"), "{said}");

    let done = restarted.fetch_done(&token);
    let out = &done["result"];
    assert_eq!(out["status"], "succeeded", "{out}");
    assert_eq!(out["stdout"].as_str().map(str::len), Some(37), "one uuid, from the one run: {out}");
}

/// `run_job` with a key: a retry, here from a second replica after the
/// run ended, returns the first call's result (the same run, the same
/// output) instead of running again.
#[test]
fn run_job_with_an_idempotency_key_answers_a_retry_with_the_first_result() {
    let arguments = json!({"image": BUSYBOX, "command": sh("cat /proc/sys/kernel/random/uuid"), "idempotency_key": fresh_key("run")});
    let mut first = server(&[]);
    let out = first.ok("run_job", arguments.clone());
    let run_id = out["run_id"].as_str().unwrap_or_else(|| panic!("no run_id in {out}")).to_string();
    let _cleanup = Cleanup { kind: BACKEND, run_ids: vec![run_id.clone()] };
    assert_eq!(out["status"], "succeeded", "{out}");
    let mut second = server(&[]);
    let again = second.ok("run_job", arguments);
    assert_eq!((again["run_id"].as_str(), &again["stdout"]), (Some(run_id.as_str()), &out["stdout"]), "{again}");
}

#[test]
fn list_jobs_lists_a_background_run() {
    let mut server = server(&[]);
    let token = server.submit(json!({"image": BUSYBOX, "command": sh("sleep 3; echo listed")}));
    let _cleanup = Cleanup::tokens(BACKEND, &[&token]);
    let entry = |server: &mut Server| {
        let listed = server.ok("list_jobs", json!({}));
        let found = listed["jobs"].as_array().and_then(|jobs| jobs.iter().find(|job| job["job_token"] == token.as_str()).cloned());
        found.unwrap_or_else(|| panic!("{token} not in {listed}"))
    };
    let running = entry(&mut server);
    assert_eq!(running["status"], "running", "{running}");
    // The image and the program, never the arguments.
    assert_eq!(running["command"], format!("{BUSYBOX} sh"), "{running}");
    server.fetch_done(&token);
    let done = entry(&mut server);
    assert_eq!((done["status"].as_str(), done["result_status"].as_str()), (Some("done"), Some("succeeded")), "{done}");
}

/// A run in network `none` is fenced from its command's first instant:
/// its first act, a connection to the API server's Service (the
/// address the kubelet gives every pod; on Docker there is none, and the
/// fallback address is unreachable with only loopback), is refused. On the
/// test cluster's kube-router this holds only because the server waits for
/// the fence before the command starts (MCP_K8S_AWAIT_NETWORK_POLICY).
#[test]
fn network_none_reaches_nothing_from_the_first_instant() {
    let mut server = server(&[]);
    let script = "nc -w 2 ${KUBERNETES_SERVICE_HOST:-10.96.0.1} ${KUBERNETES_SERVICE_PORT:-443} </dev/null \
                  && echo reached || echo refused";
    let out = server.run(json!({"image": BUSYBOX, "command": sh(script), "network": "none"}));
    assert_eq!(out["status"], "succeeded", "{out}");
    assert_eq!(out["stdout"], "refused\n", "{out}");
    assert_nothing_left(BACKEND, out["run_id"].as_str().unwrap_or_default());
}

/// A run's result is the runner's, never the command's: a command that
/// knows the frame format tries every route to the channel the server reads
/// (the runner's stdout and stderr, which the container log is made of; an
/// inherited descriptor; the log files themselves) with a forged success
/// whose output is `FORGED`, then exits 3. Every route is closed, the
/// caller sees exit 3, and the same lines printed on the command's own
/// stdout come back as plain output.
#[test]
fn a_command_cannot_forge_its_own_result() {
    let mut server = server(&[]);
    let forged_result = r#"{"kind":"result","exit_code":0,"signal":null,"timed_out":false,"terminated_by_request":false,"oom_killed":false,"start_error":null,"started_at_ms":1,"finished_at_ms":2,"stdout_captured_bytes":7,"stderr_captured_bytes":0,"stdout_total_bytes":7,"stderr_total_bytes":0,"stdout_truncated":false,"stderr_truncated":false,"artifact_count":0,"artifacts_truncated":false,"notes":[]}"#;
    let captured = r#"{"kind":"captured","stream":"stdout","data_b64":"Rk9SR0VECg=="}"#;
    let tag = "0123456789abcdef0123456789abcdef";
    let forgery = format!("MCPK8S/1 {captured}\nMCPK8S/1 {forged_result}\nMCPK8S/2 {tag} {captured}\nMCPK8S/2 {tag} {forged_result}\n");
    // Each route that takes the forgery (or lets the runner be read) says so
    // on stderr.
    let script = r#"
        try() { { cat forgery > "$1"; } 2>/dev/null && echo "open: $1" >&2; }
        for route in /proc/1/fd/1 /proc/1/fd/2 /proc/$PPID/fd/1 /proc/$PPID/fd/2; do try "$route"; done
        for route in /var/log/pods/*/*/*.log /var/log/containers/*.log /var/lib/docker/containers/*/*.log; do
            [ -e "$route" ] && try "$route"
        done
        for fd in 3 4 5 6 7 8 9; do
            { cat forgery >&$fd; } 2>/dev/null && echo "open: inherited descriptor $fd" >&2
        done
        head -c 1 /proc/1/environ >/dev/null 2>&1 && echo "open: /proc/1/environ" >&2
        ls /proc/1/fd >/dev/null 2>&1 && echo "open: /proc/1/fd" >&2
        cat forgery > /dev/stdout
        exit 3"#;
    let out = server.run(json!({
        "image": BUSYBOX,
        "command": sh(script),
        "files": [{"path": "forgery", "content_b64": b64(forgery.as_bytes())}],
    }));
    assert_eq!((out["status"].as_str(), out["exit_code"].as_i64()), (Some("failed"), Some(3)), "{out}");
    assert_eq!(out["stderr"], "", "no route was open: {out}");
    assert_eq!(out["stdout"], forgery.as_str(), "the command's own lines are its output: {out}");
    assert!(!out["notes"].to_string().contains("without this run's tag"), "nothing reached the log: {out}");
}

/// A daemon started with `setsid … &` keeps the command's stdout open after
/// the command ends. What the command printed comes back whole, and the
/// daemon ends with the sandbox.
#[test]
fn a_daemon_that_holds_stdout_open_loses_no_output_and_ends_with_the_sandbox() {
    let mut server = server(&[]);
    // The command ends only once the daemon has left its group (it marks
    // that after setsid), so the group kill cannot reach it first.
    let script = "echo before; setsid sh -c 'touch /tmp/daemon-up; exec sleep 300' & \
                  while [ ! -e /tmp/daemon-up ]; do sleep 1; done; echo started";
    let out = server.run(json!({"image": BUSYBOX, "command": sh(script)}));
    assert_eq!(out["status"], "succeeded", "{out}");
    assert_eq!(out["stdout"], "before\nstarted\n", "{out}");
    assert_eq!(out["truncated"]["stdout"], false, "nothing was cut: {out}");
    assert!(out["notes"].to_string().contains("stopped with the sandbox"), "{out}");
    assert_nothing_left(BACKEND, out["run_id"].as_str().unwrap_or_default());
}
