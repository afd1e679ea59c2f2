//! A command never starts after the server gave up on it, with a slow
//! image pull. The image comes from a registry of the test's own
//! (tests/support/slow_registry.py on 127.0.0.1) that serves a fresh layer
//! slowly, so the kubelet is still pulling when the server's start timeout
//! ends the run and deletes its pod. The kubelet finishes the pull later
//! and still creates and starts the deleted pod's `main` container
//! (measured on the test cluster: its runner's frames are in the pod's log
//! about 0.6 s after the layer's last byte); the runner in it finds the
//! run's start deadline (`--start-deadline-ms`) behind it and must run
//! nothing. The command would tell a listener of the test's on the node a
//! marker; the test waits for the pull to end and then for the container
//! (its frames in the pod log files on this machine, which is the node) or
//! for a bounded time with none, and checks that the marker never arrived.

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::cluster::{self, NAMESPACE};
use crate::support::faults;
use mcp_k8s_ephemeral_job::sandbox::frame::{self, Frame, RunResult};
use serde_json::json;

/// The node's address on the pod bridge; `open` job pods may reach its
/// ephemeral ports (tests/cluster/networkpolicy-test-node.yaml).
const NODE_IP: &str = "10.244.0.1";
/// The fresh layer and the registry's rate: a pull of about 21 s, well
/// past the start timeout, and short enough for the test to take about
/// 26 s.
const FRESH_LAYER_BYTES: u64 = 2 << 20;
const RATE_BYTES_PER_S: u64 = 100_000;
/// The pull must have begun when the start timeout ends the run. It
/// begins 2.1 to 2.9 s after the call here (the `prepare` init container,
/// with its fence wait, runs first), so the review's 5 s would leave
/// about 2 s to spare on a loaded machine; 10 s costs the test nothing,
/// as the pull's length sets its time.
const START_TIMEOUT_S: &str = "10";
/// How long after the pull the kubelet is given to start the container
/// before the test counts it as never started. It starts it within about
/// a second when it does.
const CONTAINER_AFTER_PULL: Duration = Duration::from_secs(15);

#[test]
fn a_command_never_starts_after_a_start_timeout_during_a_slow_pull() {
    let mut timeline = Timeline::new();
    let tag = faults::marker("fresh");
    let registry = SlowRegistry::start(&tag);
    // No hosts.toml for the registry: the test cluster's containerd
    // (1.6.20, `config_path` set) pulls from 127.0.0.1:<port> over plain
    // HTTP without one (measured: its first request is a plain `HEAD` of
    // the manifest, with no TLS attempt before it).
    let image = registry.image();
    let listener = Listener::start();
    let marker = faults::marker("late-start");

    let allowed = cluster::server_env().into_iter().find(|(name, _)| name == "MCP_K8S_ALLOWED_IMAGES").map(|(_, value)| value);
    let allowed = format!("{},{image}", allowed.unwrap_or_default());
    let mut server = cluster::server(&[("MCP_K8S_START_TIMEOUT_S", START_TIMEOUT_S), ("MCP_K8S_ALLOWED_IMAGES", &allowed)]);
    // Connecting is the command's first act, so a command that starts at
    // all reaches the listener before anything can stop it.
    let script = format!("echo {marker} | nc -w 3 {NODE_IP} {}", listener.port);
    timeline.mark("run_job called");
    let id = faults::send_call(
        &mut server,
        "run_job",
        json!({"image": image, "command": ["sh", "-c", script], "network": "open", "timeout_s": 30}),
    );
    let result = faults::response(&server, id, Duration::from_secs(60));
    let answered = timeline.mark("answered");
    let out = &result["structuredContent"];
    let what = |timeline: &Timeline| format!("{out}\n{timeline}\n{}", registry.log_from(timeline.began));
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("error"), Some("StartTimeout")), "{}", what(&timeline));
    let run_id = out["run_id"].as_str().expect("run_id").to_string();
    // The message says what the pod was doing, and that the command will
    // not run: the runner's start deadline makes that true even for a
    // container the kubelet starts after this answer.
    let message = out["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("the kubelet was still pulling the image `{image}`")), "{}", what(&timeline));
    assert!(message.contains("the command will not run"), "{}", what(&timeline));
    let pods_left = faults::pods_of(&run_id);
    assert!(
        pods_left.iter().all(|pod| pod["metadata"]["deletionTimestamp"].is_string()),
        "the server answered with its pod deleted: {pods_left:?}"
    );

    // The pull must end after the answer, or the test shows nothing.
    let pull_bound = Duration::from_secs(FRESH_LAYER_BYTES / RATE_BYTES_PER_S + 30);
    let pulled = registry.wait_for_fresh_layer(pull_bound);
    if let Some(began) = registry.fresh_layer_began() {
        timeline.mark_at("the fresh layer's download began", began);
    }
    timeline.mark_at("the fresh layer sent whole", pulled);
    assert!(pulled > answered, "the pull ended before the answer; slow the registry down\n{}", what(&timeline));

    // Then either the runner's frames show up in the pod's log (the
    // kubelet started the container), or nothing does for a while.
    let logs = pod_logs_dir();
    let seen_until = pulled + CONTAINER_AFTER_PULL;
    let mut late = None;
    while Instant::now() < seen_until && late.is_none() {
        if let Some(connection) = listener.with_marker(&marker) {
            timeline.mark("the listener got the marker");
            panic!("the command ran after the server gave up: the listener got `{connection}`\n{timeline}");
        }
        late = runner_result(&logs, &run_id);
        std::thread::sleep(Duration::from_millis(200));
    }
    match &late {
        Some(_) => timeline.mark("the runner's result in the pod's log"),
        None => timeline.mark(&format!("no container started within {CONTAINER_AFTER_PULL:?} after the pull")),
    };
    // The command, had it run, connected before its runner wrote the
    // result; a moment more covers the listener reading it.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        listener.with_marker(&marker).is_none(),
        "the command ran after the server gave up: the listener got {:?}\n{timeline}",
        listener.received()
    );
    if let Some(result) = &late {
        let start_error = result.start_error.as_deref().unwrap_or_default();
        assert!(start_error.contains("the command was not started"), "the runner's result: {result:?}\n{timeline}");
        assert_eq!(result.exit_code, None, "{result:?}");
    }
    cluster::assert_nothing_left(&run_id);
    timeline.mark("nothing of the run left");
    eprintln!("{timeline}\nthe answer's message: {message}");
}

// ---------------------------------------------------------------------------
// Helpers

/// What happened when, from the test's start, for its messages.
struct Timeline {
    began: Instant,
    entries: Vec<(Instant, String)>,
}

impl Timeline {
    fn new() -> Timeline {
        Timeline { began: Instant::now(), entries: Vec::new() }
    }

    fn mark(&mut self, what: &str) -> Instant {
        self.mark_at(what, Instant::now())
    }

    fn mark_at(&mut self, what: &str, when: Instant) -> Instant {
        self.entries.push((when, what.to_string()));
        when
    }
}

impl std::fmt::Display for Timeline {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "slow pull timeline:")?;
        let mut entries: Vec<&(Instant, String)> = self.entries.iter().collect();
        entries.sort_by_key(|(when, _)| *when);
        for (when, what) in entries {
            write!(formatter, "\n  {:5.1} s  {what}", when.duration_since(self.began).as_secs_f64())?;
        }
        Ok(())
    }
}

/// tests/support/slow_registry.py serving the busybox image plus a fresh
/// layer; its events (one line each) are kept as they arrive.
struct SlowRegistry {
    child: Child,
    port: u16,
    tag: String,
    manifest: String,
    config: String,
    fresh_layer: String,
    events: Receiver<String>,
    log: Arc<Mutex<Vec<(Instant, String)>>>,
}

const REPOSITORY: &str = "mcp-k8s-test/slow-busybox";

impl SlowRegistry {
    fn start(tag: &str) -> SlowRegistry {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/slow_registry.py");
        let base = busybox_archive();
        let mut child = Command::new("python3")
            .arg(script)
            .arg("--base-archive")
            .arg(&base)
            .args(["--name", REPOSITORY, "--tag", tag])
            .args(["--fresh-layer-bytes", &FRESH_LAYER_BYTES.to_string(), "--rate", &RATE_BYTES_PER_S.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 starts the registry");
        let stdout = child.stdout.take().expect("the registry's stdout");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (sender, events) = std::sync::mpsc::channel();
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                kept.lock().unwrap().push((Instant::now(), line.clone()));
                let _ = sender.send(line);
            }
        });
        // Made before the first lines are read, so that drop stops the
        // registry even when they do not come.
        let mut registry = SlowRegistry {
            child,
            port: 0,
            tag: tag.to_string(),
            manifest: String::new(),
            config: String::new(),
            fresh_layer: String::new(),
            events,
            log,
        };
        let image = registry.next_event();
        let fresh = registry.next_event();
        let listening = registry.next_event();
        let word = |line: &str, index: usize| line.split(' ').nth(index).unwrap_or_else(|| panic!("registry said `{line}`")).to_string();
        (registry.manifest, registry.config) = (word(&image, 1), word(&image, 2));
        registry.fresh_layer = word(&fresh, 1);
        let port = listening.strip_prefix("listening ").unwrap_or_else(|| panic!("registry said `{listening}`"));
        registry.port = port.parse().expect("a port");
        registry
    }

    fn next_event(&self) -> String {
        self.events
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the registry said nothing:\n{}", self.log_from(Instant::now())))
    }

    fn image(&self) -> String {
        format!("127.0.0.1:{}/{REPOSITORY}:{}", self.port, self.tag)
    }

    /// Waits until the fresh layer was sent whole; returns when.
    fn wait_for_fresh_layer(&self, within: Duration) -> Instant {
        let deadline = Instant::now() + within;
        loop {
            let line = match self.events.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("the fresh layer was not sent whole within {within:?}:\n{}", self.log_from(deadline - within))
                }
                Err(RecvTimeoutError::Disconnected) => panic!("the registry ended:\n{}", self.log_from(deadline - within)),
            };
            if line.starts_with(&format!("blob-done {}", self.fresh_layer)) {
                return Instant::now();
            }
        }
    }

    /// When the fresh layer's body began to go out (the first time).
    fn fresh_layer_began(&self) -> Option<Instant> {
        let started = format!("blob-start {} ", self.fresh_layer);
        self.log.lock().unwrap().iter().find(|(_, line)| line.starts_with(&started)).map(|(when, _)| *when)
    }

    /// The registry's events, each with its time from `began` (negative
    /// before it).
    fn log_from(&self, began: Instant) -> String {
        let seconds = |when: Instant| match when.checked_duration_since(began) {
            Some(after) => after.as_secs_f64(),
            None => -began.duration_since(when).as_secs_f64(),
        };
        let lines: Vec<String> =
            self.log.lock().unwrap().iter().map(|(when, line)| format!("  {:5.1} s  registry: {line}", seconds(*when))).collect();
        lines.join("\n")
    }

    /// Removes the image from containerd again, under each name the CRI
    /// gave it (the tag, the repository digest and the image id), so runs
    /// do not pile images up in the cluster's cache (image GC is off on
    /// the test node).
    fn remove_image(&self) {
        let image = self.image();
        let by_digest = format!("127.0.0.1:{}/{REPOSITORY}@{}", self.port, self.manifest);
        let address =
            cluster::env_value("CONTAINERD_ADDRESS").unwrap_or_else(|| cluster::dir().join("run/containerd.sock").display().to_string());
        let mut command = Command::new("ctr");
        command.args(["--address", &address, "-n", "k8s.io", "images", "rm", &image, &by_digest, &self.config]);
        let removed = command.output();
        if !removed.as_ref().is_ok_and(|output| output.status.success()) {
            eprintln!("slow pull: could not remove `{image}` from containerd: {removed:?}");
        }
    }
}

impl Drop for SlowRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.remove_image();
    }
}

/// The busybox image's OCI archive as tests/cluster/build-images left it
/// in the cache (it keeps one per image): the base of the slow image,
/// whose layer containerd already has, so only the fresh one is pulled.
fn busybox_archive() -> PathBuf {
    let dir = cluster::cache_dir().join("images");
    let found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}; run `tests/cluster/up`", dir.display()))
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| {
            path.file_name().and_then(|name| name.to_str()).is_some_and(|name| name.starts_with("busybox-") && name.ends_with(".tar"))
        })
        .collect();
    match <[PathBuf; 1]>::try_from(found) {
        Ok([archive]) => archive,
        Err(found) => panic!("expected one busybox-*.tar in {}, found {found:?}; run `tests/cluster/build-images`", dir.display()),
    }
}

/// A listener on the node's bridge address that keeps what each
/// connection sent.
struct Listener {
    port: u16,
    received: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl Listener {
    fn start() -> Listener {
        let listener = TcpListener::bind((NODE_IP, 0)).expect("a listener on the node's bridge address");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (kept, stopped) = (received.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, peer)) => {
                        let kept = kept.clone();
                        std::thread::spawn(move || {
                            let text = read_some(stream);
                            kept.lock().unwrap().push(format!("{peer}: {text}"));
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        Listener { port, received, stop }
    }

    fn received(&self) -> Vec<String> {
        self.received.lock().unwrap().clone()
    }

    fn with_marker(&self, marker: &str) -> Option<String> {
        self.received().into_iter().find(|text| text.contains(marker))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Up to 4 KiB of what a connection sends, within 3 s.
fn read_some(stream: TcpStream) -> String {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(3)));
    let mut bytes = Vec::new();
    let _ = stream.take(4096).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Where the kubelet writes container logs (`podLogsDir`, default
/// /var/log/pods; tests/cluster/up leaves the default).
fn pod_logs_dir() -> PathBuf {
    let config = std::fs::read_to_string(cluster::dir().join("kubelet-config.yaml")).unwrap_or_default();
    let set =
        config.lines().find_map(|line| line.trim().strip_prefix("podLogsDir:")).map(|value| value.trim().trim_matches('"').to_string());
    PathBuf::from(set.unwrap_or_else(|| "/var/log/pods".into()))
}

/// The runner's result frame in the `main` container's log of the run's
/// pod (`<namespace>_<pod>_<uid>/main/<restart>.log`, CRI lines
/// `<time> <stream> <P|F> <text>`), once it is there.
fn runner_result(logs: &Path, run_id: &str) -> Option<RunResult> {
    let prefix = format!("{NAMESPACE}_{}-", faults::job_name(run_id));
    for pod_dir in std::fs::read_dir(logs).ok()?.filter_map(Result::ok) {
        if !pod_dir.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        for log in std::fs::read_dir(pod_dir.path().join("main")).into_iter().flatten().filter_map(Result::ok) {
            let text = std::fs::read_to_string(log.path()).unwrap_or_default();
            for line in text.lines() {
                let content = line.splitn(4, ' ').nth(3).unwrap_or_default();
                if let Ok(Some((_, Frame::Result(result)))) = frame::decode(content) {
                    return Some(result);
                }
            }
        }
    }
    None
}
