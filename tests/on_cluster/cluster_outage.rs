//! An API server stopped for 25 s mid-run and started again, on the real test cluster: a `run_job` and two background
//! jobs in flight all end `succeeded` with their output, and the restarted
//! API server's cold caches (403 for a while) are ridden out too.
//!
//! The server under test talks to an API server of its own: a second
//! `kube-apiserver` with exactly the flags `tests/cluster/up` gave the
//! cluster's (read from its `/proc/<pid>/cmdline`), on port 6444, against
//! the same etcd, with `--endpoint-reconciler-type=none` so it never
//! enters the `kubernetes` Service. Killing and restarting that one is a
//! real API-server outage for this server (connections refused, watches
//! and log streams cut, a cold RBAC cache after the restart) while the
//! kubelet, the controllers and every other test keep the cluster's own
//! API server. `PrivateApiServer` kills its process when dropped, also
//! when the test fails; nothing of the cluster is changed.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::cluster::{self, BUSYBOX};
use crate::support::faults;
use crate::support::faults::Cleanup;
use mcp_k8s_ephemeral_job::kube;
use serde_json::json;

const PRIVATE_PORT: &str = "6444";

/// A second API server for this test alone; see the module doc.
struct PrivateApiServer {
    argv: Vec<String>,
    log_file: PathBuf,
    child: Option<Child>,
    kubeconfig: PathBuf,
}

impl PrivateApiServer {
    fn start() -> PrivateApiServer {
        let dir = cluster::dir();
        let pid = std::fs::read_to_string(dir.join("run/kube-apiserver.pid")).expect("the API server's pid file");
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).expect("the cluster's API server runs");
        let mut argv: Vec<String> = cmdline
            .split(|byte| *byte == 0)
            .filter(|part| !part.is_empty())
            .map(|part| String::from_utf8_lossy(part).into_owned())
            .collect();
        assert!(argv.iter().any(|arg| arg == "kube-apiserver"), "not the API server: {argv:?}");
        let port = argv.iter().position(|arg| arg == "--secure-port").expect("--secure-port in the API server's flags") + 1;
        argv[port] = PRIVATE_PORT.to_string();
        argv.push("--endpoint-reconciler-type=none".to_string());
        let kubeconfig = std::env::temp_dir().join(format!("cluster-outage-{}.kubeconfig", std::process::id()));
        let text = std::fs::read_to_string(cluster::server_kubeconfig()).expect("server.kubeconfig");
        assert!(text.contains(":6443"), "server.kubeconfig names port 6443");
        std::fs::write(&kubeconfig, text.replace(":6443", &format!(":{PRIVATE_PORT}"))).expect("write the private kubeconfig");
        let log_file = std::env::temp_dir().join(format!("cluster-outage-{}-apiserver.log", std::process::id()));
        let mut server = PrivateApiServer { argv, log_file, child: None, kubeconfig };
        server.launch();
        server
    }

    /// Starts the process and waits until it serves the server's requests.
    fn launch(&mut self) {
        let mut log = std::fs::OpenOptions::new().append(true).create(true).open(&self.log_file).expect("the private API server log");
        let _ = writeln!(log, "=== cluster_outage: starting");
        // Another process on the port (one left by an aborted run) would
        // answer in this one's place, with other keys.
        let taken = std::net::TcpStream::connect(("127.0.0.1", PRIVATE_PORT.parse::<u16>().unwrap_or(6444))).is_ok();
        assert!(!taken, "port {PRIVATE_PORT} is taken (an API server left by an aborted run?): `ss -ltnp | grep {PRIVATE_PORT}` names it");
        let child = Command::new(&self.argv[0])
            .args(&self.argv[1..])
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("start the private API server");
        self.child = Some(child);
        let source = kube::Source::KubeconfigFile { path: self.kubeconfig.clone(), context: None };
        let client = kube::Client::new(&source).expect("a client for the private API server");
        let deadline = Instant::now() + Duration::from_secs(120);
        while client.version().is_err() {
            assert!(Instant::now() < deadline, "the private API server did not come up; see {}", self.log_file.display());
            std::thread::sleep(Duration::from_millis(200));
        }
        // It answers before its RBAC cache is filled, and until then it
        // refuses everything: a run started then would be refused.
        let may_create_jobs = kube::AccessCheck {
            namespace: cluster::namespace(),
            verb: "create".into(),
            group: "batch".into(),
            resource: "jobs".into(),
            subresource: String::new(),
            name: String::new(),
        };
        while !client.access_review(&may_create_jobs).is_ok_and(|decision| decision.allowed) {
            assert!(Instant::now() < deadline, "the private API server never let the server create Jobs; see {}", self.log_file.display());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGKILL, as a crash: connections are refused until `launch`.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateApiServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

#[test]
fn an_api_server_down_25_s_mid_run_fails_nothing_that_succeeds() {
    let mut api = PrivateApiServer::start();
    let kubeconfig = api.kubeconfig.display().to_string();
    let mut server = cluster::server(&[("MCP_K8S_KUBECONFIG", &kubeconfig), ("MCP_K8S_LOG_LEVEL", "debug")]);
    let marker = faults::marker("outage");
    let sync_script = format!("echo {marker}-sync; sleep 40; echo sync-done");
    let sync_id =
        faults::send_call(&mut server, "run_job", json!({"image": BUSYBOX, "command": ["sh", "-c", sync_script], "timeout_s": 120}));
    let tokens: Vec<String> = (0..2)
        .map(|index| {
            let script = format!("echo {marker}-bg{index}; sleep 40; echo bg-done-{index}");
            faults::submit(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", script], "timeout_s": 120}))
        })
        .collect();
    let _cleanup = Cleanup(tokens.iter().map(|token| faults::run_id_of(token)).collect());
    let sync_run_id = wait_running_or_answered(&server, &format!("{marker}-sync"), sync_id);
    for index in 0..2 {
        faults::wait_running_with_marker(&format!("{marker}-bg{index}"), Duration::from_secs(120));
    }
    // Let the server's watches and log streams settle on the private API server.
    std::thread::sleep(Duration::from_secs(2));

    api.kill();
    std::thread::sleep(Duration::from_secs(25));
    api.launch();

    let result = faults::response(&server, sync_id, Duration::from_secs(240));
    let out = &result["structuredContent"];
    assert_eq!(out["status"], "succeeded", "the run_job in flight: {out}");
    assert_eq!(out["stdout"], format!("{marker}-sync\nsync-done\n"), "{out}");
    for (index, token) in tokens.iter().enumerate() {
        let done = faults::fetch_done(&mut server, token, Duration::from_secs(240));
        assert_eq!(done["result"]["status"], "succeeded", "background job {index}: {done}");
        assert_eq!(done["result"]["stdout"], format!("{marker}-bg{index}\nbg-done-{index}\n"), "{done}");
    }
    cluster::assert_nothing_left(&sync_run_id);
    // The outage really happened to this server: it said so in its log.
    let (mut warned, mut forbidden) = (false, false);
    while let Ok(line) = server.stderr.try_recv() {
        warned |= line.contains("the sandbox watch is failing");
        forbidden |= line.contains("still failing") && line.contains("403");
    }
    assert!(warned, "the server never saw the outage");
    // Whether the restarted API server's cold caches answered 403 this
    // time (it does not always): for the record, not a condition.
    eprintln!("cluster_outage: 403 after the restart seen in the server log: {forbidden}");
}

/// Waits for the run_job `id`'s pod (its command mentions `marker`) to run;
/// its run id. A run that ended before (refused, say) fails the test with
/// its answer.
fn wait_running_or_answered(server: &crate::support::server::StdioServer, marker: &str, id: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some((run_id, _)) = faults::running_with_marker(marker) {
            return run_id;
        }
        if let Some(message) = server.try_recv_within(Duration::from_millis(300)) {
            assert_ne!(message["id"], id, "the run_job ended before its pod ran: {message}");
        }
        assert!(Instant::now() < deadline, "no running pod with `{marker}` within 120 s, and no answer to the run_job");
    }
}
