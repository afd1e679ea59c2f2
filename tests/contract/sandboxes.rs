//! Open sandboxes, the same table on every backend (included by the
//! Docker and the Kubernetes tiers as their `sandboxes` module): state kept
//! across calls (files it opened with, files, HOME, a package installed
//! from a wheel), a call's
//! timeout or OOM kill that leaves the sandbox usable, processes that end
//! with their call, one call at a time and a cancel that ends only the
//! call, a second server that runs calls in the first one's sandbox, a
//! server killed mid-call, background calls (cancelled from another
//! server; read after their server died), idle expiry, close during a call, and the limit
//! on open sandboxes. After each case nothing of its sandboxes is left.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::BACKEND;
use super::harness::{self, BUSYBOX, PYTHON, Server};

/// The limit on open sandboxes counts every sandbox of the namespace or
/// daemon: its case runs alone (the write side), the others together.
static OPENING: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Held by every case that opens a sandbox, in this table or out of it.
pub(crate) fn together() -> std::sync::RwLockReadGuard<'static, ()> {
    OPENING.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A server on this tier's backend, execute_code's python on the test
/// image.
fn server(extra: &[(&str, &str)]) -> Server {
    let dir = std::env::temp_dir().join(format!("mcp-sandboxes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let languages = dir.join("languages.json");
    // Written aside, then renamed: servers of tests running at once read
    // this file while another test writes it, and must never see it empty.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let aside = dir.join(format!("languages.json.{:?}-{nanos}", std::thread::current().id()));
    std::fs::write(&aside, json!({"python": {"image": PYTHON, "cpu": "250m", "memory": "128Mi"}}).to_string()).unwrap();
    std::fs::rename(&aside, &languages).unwrap();
    let languages = languages.display().to_string();
    let mut env = vec![("MCP_K8S_LANGUAGES", languages.as_str())];
    env.extend_from_slice(extra);
    Server::start(BACKEND, &env)
}

/// An open sandbox: its id and public name; removed (and checked gone)
/// when dropped, whatever the case did.
struct Opened {
    id: String,
    name: String,
}

impl Drop for Opened {
    fn drop(&mut self) {
        drop(harness::Cleanup { kind: BACKEND, run_ids: vec![self.name.clone()] });
    }
}

fn open(server: &mut Server, arguments: Value) -> Opened {
    let opened = server.ok("open_sandbox", arguments);
    let id = opened["sandbox"].as_str().expect("a sandbox id").to_string();
    assert!(id.starts_with("sbx-"), "{opened}");
    assert_eq!(opened["state"], "idle", "{opened}");
    let name = mcp_k8s_ephemeral_job::engine::sandboxes::rules::public_name(&id);
    Opened { id, name }
}

fn call(server: &mut Server, tool: &str, arguments: Value) -> Value {
    server.call(tool, arguments).result
}

fn sh(server: &mut Server, sandbox: &Opened, script: &str) -> Value {
    call(server, "run_job", json!({"sandbox": sandbox.id, "command": ["sh", "-c", script], "timeout_s": 20}))["structuredContent"].clone()
}

fn close(server: &mut Server, sandbox: &Opened) {
    let closed = server.ok("close_sandbox", json!({"sandbox": sandbox.id}));
    assert_eq!(closed["state"], "closed", "{closed}");
    harness::assert_nothing_left(BACKEND, &sandbox.name);
}

#[test]
fn a_sandbox_keeps_its_workdir_and_home_across_calls_and_close_removes_it_all() {
    let _together = together();
    let mut server = server(&[]);
    // "opened\n", the file the sandbox opens with.
    let sandbox = open(&mut server, json!({"image": BUSYBOX, "files": [{"path": "src/start.txt", "content_b64": "b3BlbmVkCg=="}]}));
    let first = sh(&mut server, &sandbox, "cat src/start.txt && echo kept > note.txt && echo home > $HOME/mark && echo one");
    assert_eq!(first["status"], "succeeded", "{first}");
    assert_eq!(first["stdout"], "opened\none\n");
    let second = sh(&mut server, &sandbox, "echo two");
    assert_eq!(second["stdout"], "two\n", "{second}");
    let third = sh(&mut server, &sandbox, "cat note.txt $HOME/mark");
    assert_eq!(third["stdout"], "kept\nhome\n", "call 3 reads what call 1 wrote: {third}");
    assert_ne!(first["run_id"], third["run_id"], "each call has its own run id");
    let other_image = call(&mut server, "run_job", json!({"sandbox": sandbox.id, "image": PYTHON, "command": ["true"]}));
    let other_image = &other_image["structuredContent"];
    assert_eq!(other_image["reason"], "SandboxNotFound", "{other_image}");
    assert!(other_image["message"].as_str().unwrap().contains("runs image"), "{other_image}");
    let fixed = call(&mut server, "run_job", json!({"sandbox": sandbox.id, "command": ["true"], "limits": {"memory": "1Gi"}}));
    assert_eq!(fixed["isError"], true, "limits are the sandbox's: {fixed}");
    assert!(third["artifacts"].as_array().unwrap().is_empty(), "a call returns the files it changed, not earlier ones: {third}");

    let listed = server.ok("list_sandboxes", json!({}));
    let mine: Vec<&Value> = listed["sandboxes"].as_array().unwrap().iter().filter(|s| s["sandbox"] == sandbox.id.as_str()).collect();
    assert_eq!(mine.len(), 1, "{listed}");
    assert_eq!(mine[0]["image"], BUSYBOX);
    assert_eq!(mine[0]["state"], "idle");

    close(&mut server, &sandbox);
    let gone = sh(&mut server, &sandbox, "true");
    assert_eq!(gone["status"], "error", "{gone}");
    assert_eq!(gone["reason"], "SandboxNotFound", "{gone}");
}

#[test]
fn a_package_installed_in_one_call_imports_in_the_next() {
    let _together = together();
    let mut server = server(&[]);
    let sandbox = open(&mut server, json!({"language": "python"}));
    // A wheel as an input file, installed with `pip install --user` (into
    // HOME, /tmp; the root stays read-only). Offline, and past Debian's
    // guard for its own Python (PEP 668), as a Debian-based image needs.
    let wheel = make_wheel();
    let install = [
        "python3",
        "-m",
        "pip",
        "install",
        "--user",
        "--no-index",
        "--break-system-packages",
        "--disable-pip-version-check",
        "greet-1.0-py3-none-any.whl",
    ];
    let result = call(
        &mut server,
        "run_job",
        json!({"sandbox": sandbox.id, "command": install, "timeout_s": 60, "files": [{"path": "greet-1.0-py3-none-any.whl", "content_b64": wheel}]}),
    );
    let installed = &result["structuredContent"];
    assert_eq!(installed["status"], "succeeded", "{result}");
    assert!(installed["stdout"].as_str().unwrap().contains("Successfully installed greet-1.0"), "{result}");
    let result = call(
        &mut server,
        "execute_code",
        json!({"sandbox": sandbox.id, "language": "python", "entrypoint_code": "import greet; print(greet.hello())"}),
    );
    assert_eq!(result["structuredContent"]["stdout"], "hello from a wheel\n", "{result}");
    close(&mut server, &sandbox);
}

/// A pure-Python wheel of one module, base64.
fn make_wheel() -> String {
    let script = r#"
import base64, io, zipfile
buffer = io.BytesIO()
with zipfile.ZipFile(buffer, "w") as wheel:
    wheel.writestr("greet.py", "def hello():\n    return 'hello from a wheel'\n")
    wheel.writestr("greet-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: greet\nVersion: 1.0\n")
    wheel.writestr("greet-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    wheel.writestr("greet-1.0.dist-info/RECORD", "")
print(base64.b64encode(buffer.getvalue()).decode())
"#;
    let output = std::process::Command::new("python3").args(["-c", script]).output().expect("python3 runs");
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

#[test]
fn a_timeout_or_an_oom_kill_ends_the_call_and_the_sandbox_goes_on() {
    let _together = together();
    let mut server = server(&[]);
    let sandbox = open(&mut server, json!({"image": PYTHON, "limits": {"memory": "64Mi"}}));
    sh(&mut server, &sandbox, "echo before > kept.txt");
    let timed_out = call(&mut server, "run_job", json!({"sandbox": sandbox.id, "command": ["sleep", "30"], "timeout_s": 1}));
    let timed_out = &timed_out["structuredContent"];
    assert_eq!(timed_out["status"], "timeout", "{timed_out}");
    assert_eq!(timed_out["reason"], "DeadlineExceeded", "{timed_out}");
    let hog = "x = bytearray(256 * 1024 * 1024); print(len(x))";
    let oom = call(&mut server, "run_job", json!({"sandbox": sandbox.id, "command": ["python3", "-c", hog], "timeout_s": 30}));
    let oom = &oom["structuredContent"];
    assert_eq!(oom["reason"], "OOMKilled", "{oom}");
    let after = sh(&mut server, &sandbox, "cat kept.txt");
    assert_eq!(after["status"], "succeeded", "the sandbox survives its commands' deaths: {after}");
    assert_eq!(after["stdout"], "before\n");
    close(&mut server, &sandbox);
}

/// Memory no process holds: a call that fills `/dev/shm` (a tmpfs,
/// charged to the sandbox, capped at half its memory) fails for want of
/// room, not the runner, and the next call runs; a call that leaves some shared memory
/// behind and exits 0 with a 9 MiB file is `succeeded`, its file whole
/// (the runner once died reading that file whole into the little memory
/// left).
#[test]
fn memory_a_call_that_fills_dev_shm_fails_and_the_sandbox_goes_on() {
    let _together = together();
    let mut server = server(&[]);
    let sandbox = open(&mut server, json!({"image": BUSYBOX, "limits": {"memory": "48Mi"}}));
    let left = sh(
        &mut server,
        &sandbox,
        "dd if=/dev/zero of=/dev/shm/left bs=1M count=6 2>/dev/null; head -c 9437184 /dev/urandom > big.bin; echo exiting 0",
    );
    let summary = json!({"status": left["status"], "reason": left["reason"], "message": left["message"], "notes": left["notes"]});
    assert_eq!(left["status"], "succeeded", "{summary}");
    assert_eq!(left["stdout"], "exiting 0\n");
    let artifact = left["artifacts"].as_array().and_then(|files| files.iter().find(|file| file["path"] == "big.bin")).cloned();
    assert_eq!(artifact.unwrap_or_default()["size"], 9437184, "{}", left["artifacts"]);
    let emptied = sh(&mut server, &sandbox, "ls /dev/shm | wc -l");
    assert_eq!(emptied["stdout"], "0\n", "shared memory went with the call that wrote it: {emptied}");

    // /dev/shm is half the sandbox's memory (24 MiB here): the writer is
    // told there is no room, and the runner keeps the other half.
    let fill = sh(&mut server, &sandbox, "echo filling; dd if=/dev/zero of=/dev/shm/fill bs=1M count=200");
    assert_eq!((fill["status"].as_str(), fill["stdout"].as_str()), (Some("failed"), Some("filling\n")), "{fill}");
    assert!(fill["stderr"].as_str().unwrap_or_default().contains("No space left"), "{fill}");
    let next = sh(&mut server, &sandbox, "echo alive; ls /dev/shm | wc -l");
    assert_eq!(
        (next["status"].as_str(), next["stdout"].as_str()),
        (Some("succeeded"), Some("alive\n0\n")),
        "{next}; the call that filled it: {fill}"
    );
    close(&mut server, &sandbox);
}

#[test]
fn a_process_a_call_started_ends_with_the_call() {
    let _together = together();
    let mut server = server(&[]);
    let sandbox = open(&mut server, json!({"image": BUSYBOX}));
    let started = sh(&mut server, &sandbox, "setsid sleep 300 & echo $! > pid; nohup sleep 301 >/dev/null 2>&1 & echo started");
    assert_eq!(started["stdout"], "started\n", "{started}");
    let after = sh(
        &mut server,
        &sandbox,
        "if kill -0 $(cat pid) 2>/dev/null; then echo alive; else echo gone; fi; ps -o comm | grep -c sleep || true",
    );
    assert_eq!(after["stdout"], "gone\n0\n", "background processes end with their call: {after}");
    close(&mut server, &sandbox);
}

/// What a call runs to forge a call of its own, sent as the call's command
/// (never run outside a sandbox): look for the sandbox's key wherever it
/// could be (a 64-hex-digit file under the runner's folders, the secrets
/// folders, /tmp, /dev/shm, the workdir; the runner's environment), then
/// post an assignment to the runner's port with it and exit at once, so
/// that the forged call would be taken as soon as this one ends. With no
/// key it posts a wrong one and prints the runner's answer.
const FORGE_PROBE: &str = r#"
import json, os, re, socket
found = None
for top in ['/mcp-key', '/mcp-key-secret', '/mcp', '/run/secrets', '/var/run/secrets', '/tmp', '/dev/shm', os.getcwd()]:
    for root, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            try:
                with open(path, 'rb') as f:
                    text = f.read(200)
            except OSError:
                continue
            if re.fullmatch(rb'[0-9a-fA-F]{64}\s*', text):
                found = (path, text.strip().decode())
try:
    with open('/proc/1/environ', 'rb') as f:
        print('environ: readable', len(f.read()))
except OSError as error:
    print('environ:', type(error).__name__)
print('key:', found[0] if found else 'none')
key = found[1] if found else '00' * 32
call = {'v': 1, 'key': key, 'run_id': 'forged', 'argv': ['sh', '-c', 'echo forged > forged.txt; sleep 30'],
        'env': {}, 'workdir': os.getcwd(), 'timeout_ms': 60000, 'kill_grace_ms': 2000, 'max_output_bytes': 4096,
        'max_artifact_bytes': 0, 'artifacts': [], 'disk_paths': [], 'disk_limit_bytes': 0, 'files': [], 'tag': 'ab' * 16}
body = json.dumps(call).encode()
head = 'POST /assign HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(body)
try:
    connection = socket.create_connection(('127.0.0.1', 7777), timeout=5)
    connection.sendall(head.encode() + body)
    print('sent')
    if not found:
        print('answer:', connection.recv(64).split(b'\r\n')[0].decode())
except OSError as error:
    print('port:', type(error).__name__)
"#;

/// A call's command cannot reach the sandbox's key, so it cannot hand the
/// runner a call of its own (which would run once its own call ended and
/// hold the sandbox against its owner): it finds no key, a forged call is
/// refused, and the owner's next call runs at once, with no trace of it.
#[test]
fn a_call_cannot_read_the_sandbox_key_or_deliver_a_call_of_its_own() {
    let _together = together();
    let mut server = server(&[]);
    let sandbox = open(&mut server, json!({"image": PYTHON}));
    let probe = call(&mut server, "run_job", json!({"sandbox": sandbox.id, "command": ["python3", "-c", FORGE_PROBE], "timeout_s": 20}));
    let probe = &probe["structuredContent"];
    assert_eq!(probe["status"], "succeeded", "{probe}");
    let next = sh(&mut server, &sandbox, "cat forged.txt 2>/dev/null || echo no-forged-call");
    assert_eq!(next["status"], "succeeded", "the owner's next call runs: {next}; the probe said: {}", probe["stdout"]);
    assert_eq!(next["stdout"], "no-forged-call\n", "no forged call ran: {next}");
    let said = probe["stdout"].as_str().unwrap_or_default();
    assert!(said.contains("key: none\n"), "the command found the sandbox's key: {said}");
    assert!(!said.contains("environ: readable"), "the runner's environment is the command's to read: {said}");
    if matches!(BACKEND, super::harness::Kind::Kubernetes) {
        assert!(said.contains("answer: HTTP/1.1 401"), "a call with a wrong key is refused: {said}");
    }
    close(&mut server, &sandbox);
}

/// Waits until the sandbox is busy with a call (as list_sandboxes says).
fn await_busy(server: &mut Server, sandbox: &Opened) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = server.ok("list_sandboxes", json!({}));
        let state =
            listed["sandboxes"].as_array().unwrap().iter().find(|s| s["sandbox"] == sandbox.id.as_str()).map(|s| s["state"].clone());
        if state == Some(json!("busy")) {
            return;
        }
        assert!(Instant::now() < deadline, "the call never took the sandbox: {listed}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_second_call_while_one_runs_is_refused_and_a_cancel_ends_only_the_call() {
    let _together = together();
    let mut server = server(&[]);
    let sandbox = open(&mut server, json!({"image": BUSYBOX}));
    let slow = server.send_call("run_job", json!({"sandbox": sandbox.id, "command": ["sh", "-c", "echo go; sleep 300"], "timeout_s": 600}));
    await_busy(&mut server, &sandbox);
    let busy = call(&mut server, "run_job", json!({"sandbox": sandbox.id, "command": ["true"]}));
    let busy_out = &busy["structuredContent"];
    assert_eq!(busy_out["reason"], "SandboxBusy", "{busy}");
    assert!(busy_out["message"].as_str().unwrap().contains("one call at a time"), "{busy}");
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": slow, "reason": "contract"}});
    server.stdio.send(&cancel.to_string());
    let cancelled_at = Instant::now();
    // The cancelled call gets no response (MCP); the sandbox is free again
    // as soon as its command is stopped, with nothing of it left running.
    let after = loop {
        let after = sh(&mut server, &sandbox, "ps -o comm | grep -c sleep || true");
        if after["reason"] != "SandboxBusy" {
            break after;
        }
        assert!(cancelled_at.elapsed() < Duration::from_secs(30), "the cancel did not free the sandbox: {after}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(after["stdout"], "0\n", "the cancelled command is gone and the sandbox works: {after}");
    close(&mut server, &sandbox);
}

/// A call whose command forks until the sandbox's process limit (threads
/// count too) is still stopped by `cancel_job`: its result says
/// `cancelled` once its command is gone, and the next call runs in the
/// sandbox with nothing of it left. The runner used to need a new thread
/// to read the cancel, so it never came: the call was said `cancelled`
/// 10 s later while its command ran on to its timeout, and the calls in
/// between failed with a bare `ApiError` 503.
#[test]
fn a_call_at_the_process_limit_is_cancelled_and_nothing_of_it_is_left() {
    let _together = together();
    let mut server = server(&[]);
    let sandbox = open(&mut server, json!({"image": PYTHON}));
    let threads = "import threading, time\n\
                   started = 0\n\
                   print('started', flush=True)\n\
                   while True:\n\
                   \x20   try:\n\
                   \x20       threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n\
                   \x20       started += 1\n\
                   \x20   except RuntimeError:\n\
                   \x20       print(f'at the limit after {started} threads', flush=True)\n\
                   \x20       time.sleep(0.5)\n";
    let token = server.submit(json!({"sandbox": sandbox.id, "command": ["python3", "-c", threads], "timeout_s": 120}));
    await_output(&mut server, &token, "at the limit");
    let cancelled = server.ok("cancel_job", json!({"job_token": token}));
    assert_eq!(cancelled["cancel_requested"], true, "{cancelled}");
    let result = server.fetch_done(&token)["result"].clone();
    assert_eq!((result["status"].as_str(), result["reason"].as_str()), (Some("cancelled"), Some("Cancelled")), "{result}");
    // Said cancelled only once the command is gone: the sandbox takes the
    // next call at once, and no process of the cancelled one is left.
    let others = "import os; print(len([p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid())]))";
    let after = call(&mut server, "run_job", json!({"sandbox": sandbox.id, "command": ["python3", "-c", others], "timeout_s": 20}));
    let after = &after["structuredContent"];
    assert_eq!((after["status"].as_str(), after["stdout"].as_str()), (Some("succeeded"), Some("0\n")), "{after}");
    close(&mut server, &sandbox);
}

/// A call stopped for going over the disk limit leaves its files; the
/// next call, which removes them, runs: each call is held to the limit,
/// or to what the folders held when its command started when that was
/// more. The next call used to be stopped `DiskLimitExceeded` at once,
/// whatever it did, for the earlier call's files.
#[test]
fn a_call_after_a_disk_overshoot_runs_and_frees_the_space() {
    let _together = together();
    let mut server = server(&[("MCP_K8S_WORKDIR_SIZE", "16Mi")]);
    let sandbox = open(&mut server, json!({"image": BUSYBOX}));
    // 10 MiB in each of /tmp and the workdir: under each folder's own bound,
    // over the limit together.
    let over = sh(&mut server, &sandbox, "head -c 10485760 /dev/zero > /tmp/f1; head -c 10485760 /dev/zero > f2; sleep 15");
    assert_eq!(over["reason"], "DiskLimitExceeded", "{over}");
    // It works a moment before it frees the space, as a real clean-up does.
    let freed = sh(&mut server, &sandbox, "sleep 1; rm -f /tmp/f1 f2; echo freed");
    assert_eq!((freed["status"].as_str(), freed["stdout"].as_str()), (Some("succeeded"), Some("freed\n")), "{freed}");
    let again = sh(&mut server, &sandbox, "head -c 10485760 /dev/zero > /tmp/f3; head -c 10485760 /dev/zero > f4; sleep 15");
    assert_eq!(again["reason"], "DiskLimitExceeded", "the limit holds for a call that starts under it: {again}");
    close(&mut server, &sandbox);
}

#[test]
fn a_second_server_runs_calls_in_a_sandbox_the_first_opened() {
    let _together = together();
    let mut first = server(&[]);
    let mut second = server(&[]);
    let sandbox = open(&mut first, json!({"image": BUSYBOX}));
    sh(&mut first, &sandbox, "echo from-first > shared.txt");
    let read = sh(&mut second, &sandbox, "cat shared.txt");
    assert_eq!(read["stdout"], "from-first\n", "{read}");
    let listed = second.ok("list_sandboxes", json!({}));
    assert!(listed["sandboxes"].as_array().unwrap().iter().any(|s| s["sandbox"] == sandbox.id.as_str()), "{listed}");
    close(&mut second, &sandbox);
}

#[test]
fn a_server_killed_mid_call_leaves_the_sandbox_usable_by_the_next() {
    let _together = together();
    let mut first = server(&[]);
    let sandbox = open(&mut first, json!({"image": BUSYBOX}));
    sh(&mut first, &sandbox, "echo kept > kept.txt");
    first.send_call("run_job", json!({"sandbox": sandbox.id, "command": ["sleep", "3"], "timeout_s": 2}));
    await_busy(&mut first, &sandbox);
    super::support::server::send_signal(&first.stdio.child, libc::SIGKILL);
    let _ = first.stdio.child.wait();
    let mut next = server(&[]);
    // The dead server's mark holds the sandbox until its call's deadline
    // (timeout, kill grace and slack) has passed.
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        let after = sh(&mut next, &sandbox, "cat kept.txt");
        if after["reason"] != "SandboxBusy" || Instant::now() > deadline {
            break after;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    assert_eq!(after["stdout"], "kept\n", "{after}");
    close(&mut next, &sandbox);
}

/// `fetch_job` until the running call's stdout holds `text`.
fn await_output(server: &mut Server, token: &str, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let fetched = server.ok("fetch_job", json!({"job_token": token, "wait_s": 1}));
        if fetched["stdout"].as_str().is_some_and(|stdout| stdout.contains(text)) {
            return;
        }
        assert_eq!(fetched["status"], "running", "{fetched}");
        assert!(Instant::now() < deadline, "no `{text}` from the call: {fetched}");
    }
}

/// `submit_job` in the sandbox: the token.
fn submit(server: &mut Server, sandbox: &Opened, script: &str, timeout_s: u64) -> String {
    server.submit(json!({"sandbox": sandbox.id, "command": ["sh", "-c", script], "timeout_s": timeout_s}))
}

/// A background call holds the sandbox like a waited-for one; a cancel
/// from another server (which holds only the token) ends the call, both
/// servers read the same `cancelled` result, and the sandbox goes on.
#[test]
fn a_background_call_runs_in_the_sandbox_and_any_server_cancels_it() {
    let _together = together();
    let mut first = server(&[]);
    let mut second = server(&[]);
    let sandbox = open(&mut first, json!({"image": BUSYBOX}));
    let token = submit(&mut first, &sandbox, "echo kept > kept.txt; echo started; sleep 300", 600);
    await_output(&mut first, &token, "started");
    let busy = sh(&mut second, &sandbox, "true");
    assert_eq!(busy["reason"], "SandboxBusy", "{busy}");
    let cancelled = second.ok("cancel_job", json!({"job_token": token}));
    assert_eq!(cancelled["cancel_requested"], true, "{cancelled}");
    for server in [&mut second, &mut first] {
        let result = server.fetch_done(&token)["result"].clone();
        assert_eq!(result["status"], "cancelled", "{result}");
        assert_eq!(result["reason"], "Cancelled", "{result}");
        assert_eq!(result["stdout"], "started\n", "{result}");
    }
    let after = sh(&mut first, &sandbox, "cat kept.txt; ps -o comm | grep -c sleep || true");
    assert_eq!(after["stdout"], "kept\n0\n", "the call is gone and the sandbox works: {after}");
    close(&mut first, &sandbox);
    // A server that never read the result finds it gone with the sandbox.
    let gone = server(&[]).call("fetch_job", json!({"job_token": token, "wait_s": 0}));
    let text = gone.result.to_string();
    assert_eq!(gone.result["isError"], true, "{text}");
    assert!(text.contains("is closed"), "a result that went with its sandbox says so: {text}");
}

/// The server that submitted a background call dies mid-call: the call
/// runs on in the sandbox, and the next server's `fetch_job` reads its
/// one true result from the sandbox, which is then free again.
#[test]
fn a_background_calls_result_outlives_the_server_that_submitted_it() {
    let _together = together();
    let mut first = server(&[]);
    let sandbox = open(&mut first, json!({"image": BUSYBOX}));
    let token = submit(&mut first, &sandbox, "echo started; sleep 3; echo done > done.txt; echo finished; exit 3", 30);
    // Killed once the call runs in the sandbox (its first output is back).
    await_output(&mut first, &token, "started");
    super::support::server::send_signal(&first.stdio.child, libc::SIGKILL);
    let _ = first.stdio.child.wait();
    let mut next = server(&[]);
    let result = next.fetch_done(&token)["result"].clone();
    assert_eq!(result["status"], "failed", "{result}");
    assert_eq!(result["exit_code"], 3, "{result}");
    assert_eq!(result["stdout"], "started\nfinished\n", "{result}");
    // Its mark went with the result: the sandbox takes the next call now.
    let after = sh(&mut next, &sandbox, "cat done.txt");
    assert_eq!(after["stdout"], "done\n", "{after}");
    close(&mut next, &sandbox);
}

/// `execute_code` as an MCP task in a sandbox: a background call, whose
/// result any server answers in execute_code's shape.
#[test]
fn a_task_in_a_sandbox_is_a_background_call_in_it() {
    let _together = together();
    let mut server = server(&[]);
    let sandbox = open(&mut server, json!({"language": "python"}));
    sh(&mut server, &sandbox, "echo 41 > n.txt");
    let code = "print(int(open('n.txt').read()) + 1)";
    let created = server.request(
        "tools/call",
        json!({"name": "execute_code", "arguments": {"sandbox": sandbox.id, "language": "python", "entrypoint_code": code}, "task": {"ttl": 60000}}),
    );
    let task_id = created["result"]["task"]["taskId"].as_str().unwrap_or_else(|| panic!("a task id: {created}")).to_string();
    assert!(task_id.starts_with("code-"), "{task_id}");
    for process in [&mut server, &mut self::server(&[])] {
        let result = process.request("tasks/result", json!({"taskId": task_id}));
        let text = result["result"]["content"][0]["text"].as_str().unwrap_or_default().to_string();
        assert_eq!(text, "--- stdout ---\n42\n\n--- stderr ---\n", "{result}");
    }
    close(&mut server, &sandbox);
}

#[test]
fn an_idle_sandbox_closes_itself_and_is_removed() {
    let _together = together();
    let mut server = server(&[]);
    let sandbox = open(&mut server, json!({"image": BUSYBOX, "idle_timeout_s": 2}));
    sh(&mut server, &sandbox, "true");
    harness::assert_nothing_left(BACKEND, &sandbox.name);
    let gone = sh(&mut server, &sandbox, "true");
    assert_eq!(gone["reason"], "SandboxNotFound", "{gone}");
}

/// Its lifetime ends a sandbox however busy it is kept: a call that would
/// outlast it is refused before it starts, and at the end everything goes.
#[test]
fn a_sandbox_ends_at_its_max_lifetime() {
    let _together = together();
    let mut server = server(&[]);
    let opened_at = Instant::now();
    let sandbox = open(&mut server, json!({"image": BUSYBOX, "max_lifetime_s": 60}));
    let too_long = call(&mut server, "run_job", json!({"sandbox": sandbox.id, "command": ["true"], "timeout_s": 300}));
    let too_long = &too_long["structuredContent"];
    assert_eq!(too_long["reason"], "SandboxExpiring", "{too_long}");
    assert!(too_long["message"].as_str().unwrap().contains("max_lifetime_s"), "{too_long}");
    // Kept busy with short calls, it takes them while they fit in its life.
    let short = json!({"sandbox": sandbox.id, "command": ["true"], "timeout_s": 1});
    let refused = loop {
        let kept = call(&mut server, "run_job", short.clone())["structuredContent"].clone();
        if kept["status"] != "succeeded" {
            break kept;
        }
        assert!(opened_at.elapsed() < Duration::from_secs(120), "the sandbox outlived its lifetime: {kept}");
        std::thread::sleep(Duration::from_secs(2));
    };
    assert_eq!(refused["reason"], "SandboxExpiring", "{refused}");
    assert!(opened_at.elapsed() >= Duration::from_secs(40), "refused early ({:?}): {refused}", opened_at.elapsed());
    // Then it goes at its end, everything of it.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !harness::nothing_left(BACKEND, &sandbox.name) {
        assert!(Instant::now() < deadline, "the sandbox outlived its lifetime by a minute");
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(opened_at.elapsed() >= Duration::from_secs(60), "removed before its lifetime: {:?}", opened_at.elapsed());
    let gone = sh(&mut server, &sandbox, "true");
    assert_eq!(gone["reason"], "SandboxNotFound", "{gone}");
}

#[test]
fn closing_a_sandbox_during_a_call_ends_the_call_with_the_reason() {
    let _together = together();
    let mut server = server(&[]);
    let sandbox = open(&mut server, json!({"image": BUSYBOX}));
    let slow = server.send_call("run_job", json!({"sandbox": sandbox.id, "command": ["sleep", "300"], "timeout_s": 600}));
    await_busy(&mut server, &sandbox);
    let closing = server.send_call("close_sandbox", json!({"sandbox": sandbox.id}));
    // Both answers come, in either order.
    let (mut ended, mut closed) = (None, None);
    while ended.is_none() || closed.is_none() {
        let message = server.stdio.recv_within(Duration::from_secs(60));
        if message["id"] == slow {
            ended = Some(message["result"]["structuredContent"].clone());
        } else if message["id"] == closing {
            closed = Some(message["result"]["structuredContent"].clone());
        }
    }
    let (ended, closed) = (ended.unwrap(), closed.unwrap());
    assert_eq!(closed["state"], "closed", "{closed}");
    assert_eq!(ended["status"], "error", "{ended}");
    assert_eq!(ended["reason"], "SandboxEnded", "{ended}");
    harness::assert_nothing_left(BACKEND, &sandbox.name);
}

#[test]
fn no_more_than_the_operators_number_of_sandboxes_are_open() {
    let _alone = OPENING.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut server = server(&[("MCP_K8S_MAX_SANDBOXES", "1")]);
    let sandbox = open(&mut server, json!({"image": BUSYBOX}));
    let refused = call(&mut server, "open_sandbox", json!({"image": BUSYBOX}));
    // Tried and refused by the limit: a result, as run_job answers its refusals.
    assert_eq!(refused["isError"], false, "{refused}");
    assert_eq!(refused["structuredContent"]["reason"], "SandboxLimit", "{refused}");
    close(&mut server, &sandbox);
}
