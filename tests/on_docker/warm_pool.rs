//! Warm pools on the Docker backend, through the built server
//! against the test daemon: a run that fits a pool takes one of its
//! running containers (proven by `describe_environment`'s hit count, not
//! by timing) and keeps the run contract (exit code, separate streams,
//! input files, env, artifacts, a timeout with its partial output, an
//! empty stdin, network mode `none`); a background run stays cold; and
//! nothing of the pool is left once the server stops.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::BUSYBOX;
use crate::backend::{b64, ok, run, server};
use crate::support::server::StdioServer;
use mcp_k8s_ephemeral_job::backend::docker::{Docker, pool, spec};
use mcp_k8s_ephemeral_job::docker;
use mcp_k8s_ephemeral_job::engine::pools::pool::{PoolRules, PoolShape};
use mcp_k8s_ephemeral_job::engine::port::spec::{Policy, RunSpec};
use mcp_k8s_ephemeral_job::engine::port::{Backend, Keep, NewRun, RunKind};
use mcp_k8s_ephemeral_job::network::NetworkMode;

const POOL_LABEL: &str = "mcp-k8s-ephemeral-job/pool";

/// A server with one busybox pool of `size` (network `none`, no limits),
/// stopped through its stdin when dropped, so it drains its pool.
fn pool_server(name: &str, size: u32) -> (StdioServer, crate::support::TempDir) {
    let dir = crate::support::TempDir::new("docker-pools");
    let pools = json!([{"name": name, "image": BUSYBOX, "network": "none", "size": size, "max_idle_s": 300}]);
    let file = dir.path.join("pools.json");
    std::fs::write(&file, pools.to_string()).expect("the pools file is written");
    let file = file.display().to_string();
    let mut server = server(&[("MCP_K8S_WARM_POOLS", &file), ("MCP_K8S_NETWORK_DEFAULT", "none")]);
    server.stop_gently = true;
    (server, dir)
}

/// The pool's line of `describe_environment`.
fn pool_view(server: &mut StdioServer) -> Value {
    let described = ok(server, "describe_environment", json!({}));
    described["warm_pools"][0].clone()
}

/// Until the pool has `ready` running containers; its view then.
fn await_ready(server: &mut StdioServer, ready: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = pool_view(server);
        if view["ready"].as_u64() >= Some(ready) {
            return view;
        }
        assert!(Instant::now() < deadline, "the pool never had {ready} ready: {view}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A sync run on a ready sandbox: the pool counts it as a hit.
fn warm_run(server: &mut StdioServer, arguments: Value) -> Value {
    let hits = await_ready(server, 1)["hits"].as_u64().unwrap_or(0);
    let out = run(server, arguments);
    assert_eq!(pool_view(server)["hits"].as_u64(), Some(hits + 1), "the run took a pool container: {out}");
    assert_eq!(out["timings"]["warm"], true, "the result says so: {out}");
    out
}

fn pool_containers(name: &str) -> Vec<docker::objects::ContainerSummary> {
    let filters = docker::Filters { labels: vec![format!("{POOL_LABEL}={name}")] };
    crate::client().container_list(&filters).expect("list")
}

#[test]
fn warm_runs_keep_the_run_contract_and_the_stopped_server_leaves_no_pool_container() {
    let name = format!("w{}", std::process::id());
    let (mut server, _dir) = pool_server(&name, 2);
    await_ready(&mut server, 2);
    assert_eq!(pool_containers(&name).len(), 2);

    let out = warm_run(
        &mut server,
        json!({
            "image": BUSYBOX,
            "command": ["sh", "-c", "cat data/in.txt; echo \"$GREETING\"; echo to-stderr >&2; echo made > out.txt; cat; exit 3"],
            "env": {"GREETING": "hello warm"},
            "files": [{"path": "data/in.txt", "content_b64": b64(b"input\n")}],
            "artifacts": ["out.txt"],
        }),
    );
    assert_eq!(out["exit_code"], 3, "{out}");
    assert_eq!(out["stdout"], "input\nhello warm\n", "the command's stdin is empty (`cat` ended at once): {out}");
    assert_eq!(out["stderr"], "to-stderr\n", "{out}");
    let artifacts = out["artifacts"].as_array().expect("artifacts");
    assert_eq!(artifacts.len(), 1, "{out}");
    assert_eq!(artifacts[0]["path"], "out.txt", "{out}");
    assert_eq!(artifacts[0]["content_b64"], b64(b"made\n"), "{out}");

    let out = warm_run(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", "ls /sys/class/net; id -u; pwd"]}));
    assert_eq!(out["exit_code"], 0, "{out}");
    assert_eq!(out["stdout"], "lo\n65532\n/work\n", "network `none` (loopback only), the run's user and workdir: {out}");

    let out = warm_run(&mut server, json!({"image": BUSYBOX, "command": ["sh", "-c", "echo partial; sleep 30"], "timeout_s": 2}));
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("timeout"), Some("DeadlineExceeded")), "{out}");
    assert_eq!(out["stdout"], "partial\n", "{out}");

    // A background run cannot carry its record on a container made ahead:
    // it runs cold, and takes no pool container (no hit is counted).
    let hits = await_ready(&mut server, 1)["hits"].as_u64().unwrap_or(0);
    let submitted = ok(&mut server, "submit_job", json!({"image": BUSYBOX, "command": ["echo", "background"]}));
    let token = submitted["job_token"].as_str().expect("token").to_string();
    let _removed = crate::backend::Removed(vec![token.clone()]);
    let done = crate::backend::fetch_done(&mut server, &token);
    assert_eq!(done["result"]["stdout"], "background\n", "{done}");
    assert_eq!(pool_view(&mut server)["hits"].as_u64(), Some(hits), "the background run ran cold");
    assert_eq!(done["result"]["timings"]["warm"], false, "and says so: {done}");

    // Stopped right after a claim, while the pool makes the claimed one's
    // successor: that one goes too.
    warm_run(&mut server, json!({"image": BUSYBOX, "command": ["true"]}));
    drop(server);
    assert!(pool_containers(&name).is_empty(), "the stopped server drained its pool: {:?}", pool_containers(&name));
}

/// A SIGKILLed server cannot drain: its idle containers carry their own
/// bound (the runner's `--max-wait-ms`, `spec::pool_container`'s unit
/// test) and an expiry any server's reaper honours, fixed at creation past
/// the wait and the longest run. The test removes them itself.
#[test]
fn a_killed_servers_pool_containers_carry_a_bounded_expiry() {
    let name = format!("k{}", std::process::id());
    let (mut server, _dir) = pool_server(&name, 1);
    await_ready(&mut server, 1);
    server.stop_gently = false;
    let killed_at = std::time::SystemTime::now();
    drop(server);
    let client = crate::client();
    let left = pool_containers(&name);
    for container in &left {
        let _ = client.container_remove(&container.id);
    }
    assert_eq!(left.len(), 1, "the killed server's idle container stays until its bound");
    let container = &left[0];
    assert_eq!(container.state, "running", "its runner still waits for an assignment");
    let expires_at = container.labels.get("mcp-k8s-ephemeral-job/expires-at").expect("an expiry label");
    let expires_at = mcp_k8s_ephemeral_job::time::parse_rfc3339(expires_at).expect("RFC 3339");
    // The wait (start 120 s + max_idle 300 s + 60 s), the longest run (600 s),
    // the start timeout, the kill grace, the collect and expiry slacks.
    let bound = expires_at.duration_since(killed_at).expect("in the future").as_secs();
    assert!((1200..=1300).contains(&bound), "expires {bound} s after the kill");
}

/// The backend and one busybox pool of one (network `none`), through the
/// library, so a test can step between the claim and the delivery.
fn pools_and_backend(name: &str) -> (std::sync::Arc<pool::Pools>, Docker, RunSpec) {
    use mcp_k8s_ephemeral_job::quantity::Quantity;
    let policy = Policy {
        run_as_user: 65532,
        default_cpu: Quantity::parse("500m").unwrap(),
        default_memory: Quantity::parse("64Mi").unwrap(),
        max_output_bytes: 1 << 20,
        max_artifact_bytes: 1 << 20,
        start_timeout: Duration::from_secs(120),
        workdir_size_limit: Quantity::parse("64Mi").unwrap(),
        extra_env: Default::default(),
        cache: None,
        clone: None,
        outputs: None,
        sandboxes: Default::default(),
    };
    let options = spec::Options {
        runner_binary: crate::backend::runner_binary(),
        restricted_network: None,
        pull: spec::Pull::Never,
        // As the server sets them from the engine's /version (Podman: neither).
        owned_tmpfs: !crate::client().version().is_podman(),
        stdin_across_attaches: !crate::client().version().is_podman(),
    };
    let workdir = mcp_k8s_ephemeral_job::sandbox::WORKDIR.to_string();
    let shape =
        PoolShape { name: name.into(), image: BUSYBOX.into(), cpu: None, memory: None, network: NetworkMode::None, workdir, preload: None };
    let rules = PoolRules { size: 1, max_idle: Duration::from_secs(300), start_timeout: Duration::from_secs(120) };
    let backend = Docker::new(crate::client(), policy, options);
    let pools = std::sync::Arc::new(pool::Pools::new(backend.clone(), &[(shape, rules)], Duration::from_secs(600)));
    pools.start("test-owner").unwrap();
    let spec = RunSpec {
        owner: None,
        image: BUSYBOX.into(),
        command: vec!["true".into()],
        files: vec![],
        env: Default::default(),
        cpu_limit: None,
        memory_limit: None,
        timeout: Duration::from_secs(30),
        workdir: mcp_k8s_ephemeral_job::sandbox::WORKDIR.into(),
        artifacts: vec![],
        clone: None,
        network: NetworkMode::None,
    };
    (pools.clone(), backend.with_pools(Some(pools)), spec)
}

/// Drains the pools and removes what is left of the pool `.1` when
/// dropped, so a failing test leaves nothing behind either.
struct Drained(std::sync::Arc<pool::Pools>, String);

impl Drop for Drained {
    fn drop(&mut self) {
        self.0.drain();
        for container in pool_containers(&self.1) {
            let _ = crate::client().container_remove(&container.id);
        }
    }
}

/// A sandbox that dies between its claim and its delivery: the run is
/// refused with what to do, and the container is removed.
#[test]
fn a_failed_delivery_removes_the_container_and_says_try_again() {
    let name = format!("d{}", std::process::id());
    let (pools, backend, spec) = pools_and_backend(&name);
    let drained = Drained(pools, name.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    let run_id = loop {
        if let Some(run_id) = backend.claim(&spec, RunKind::Sync) {
            break run_id;
        }
        assert!(Instant::now() < deadline, "the pool never had a ready container");
        std::thread::sleep(Duration::from_millis(100));
    };
    let container = spec::container_name(&run_id);
    crate::client().container_kill(&container, "KILL").expect("kill");
    let keep = Keep::UntilRemoved { expires_at: std::time::SystemTime::now() + Duration::from_secs(600) };
    let Err(refused) = backend.create(&NewRun { run_id: &run_id, spec: &spec, keep, start_by: None }) else {
        panic!("a dead sandbox took a run")
    };
    assert!(refused.message.contains("try again (the pool replaces the container)"), "{}", refused.message);
    assert!(refused.message.contains(&container), "{}", refused.message);
    assert!(matches!(crate::client().container_inspect(&container), Err(error) if error.is_not_found()), "removed");
    drained.0.drain();
    assert!(pool_containers(&name).is_empty(), "{:?}", pool_containers(&name));
}
