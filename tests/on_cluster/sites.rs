//! Two sites behind one server (`MCP_K8S_SITES`): the test cluster, the
//! default, and the test Docker engine, reached through a socket this test
//! holds between the server and the daemon so that it can take the site
//! down without touching the engine. Runs go to the site they name; a job
//! token carries its site, so fetch_job finds it unasked; with the Docker
//! site down (its socket accepts and never answers), the cluster site still
//! runs, lists and describes itself, and the down site is named as such.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::TempDir;
use crate::support::cluster::{self, busybox_image};
use crate::support::faults::{Cleanup, fetch_done, job_name, ok, response, run_id_of, send_call, submit};
use mcp_k8s_ephemeral_job::{docker, kube};

const RUN_ID_LABEL: &str = "mcp-k8s-ephemeral-job/run-id";
const DOCKER_BUSYBOX: &str = "mcp-k8s-test.local/busybox:1.35";

/// The test Docker engine's socket (`tests/run-all` exports DOCKER_HOST).
fn engine_socket() -> PathBuf {
    let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/lib/mcp-k8s-test-docker/docker.sock".into());
    docker::socket_path(Some(&host)).expect("DOCKER_HOST names a unix socket")
}

/// A socket that forwards to the engine while up; while down it accepts
/// connections and never answers (a daemon that hangs, the worst kind of
/// outage), and the connections it forwarded are cut.
struct Gate {
    path: PathBuf,
    up: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<UnixStream>>>,
}

impl Gate {
    fn start(dir: &TempDir) -> Gate {
        let path = dir.path.join("docker-site.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (up, open) = (Arc::new(AtomicBool::new(true)), Arc::new(Mutex::new(Vec::<UnixStream>::new())));
        let (thread_up, thread_open) = (Arc::clone(&up), Arc::clone(&open));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let mut open = thread_open.lock().unwrap();
                if !thread_up.load(Ordering::SeqCst) {
                    open.push(client);
                    continue;
                }
                let Ok(daemon) = UnixStream::connect(engine_socket()) else { continue };
                open.push(client.try_clone().unwrap());
                open.push(daemon.try_clone().unwrap());
                pump(client.try_clone().unwrap(), daemon.try_clone().unwrap());
                pump(daemon, client);
            }
        });
        Gate { path, up, open }
    }

    fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn pump(mut from: UnixStream, mut to: UnixStream) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        while let Ok(read @ 1..) = from.read(&mut buffer) {
            if to.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

/// Removes the Docker site's containers of these runs when dropped.
struct DockerRuns(Vec<String>);

impl Drop for DockerRuns {
    fn drop(&mut self) {
        let client = docker::Client::connect(&engine_socket(), docker::Options::default()).unwrap();
        for run_id in &self.0 {
            let filters = docker::Filters { labels: vec![format!("{RUN_ID_LABEL}={run_id}")] };
            for container in client.container_list(&filters).unwrap_or_default() {
                let _ = client.container_remove(&container.id);
            }
        }
    }
}

fn docker_containers_of(run_id: &str) -> usize {
    let client = docker::Client::connect(&engine_socket(), docker::Options::default()).unwrap();
    client.container_list(&docker::Filters { labels: vec![format!("{RUN_ID_LABEL}={run_id}")] }).unwrap().len()
}

fn run(image: &str, command: &str, site: Option<&str>) -> Value {
    let mut arguments = json!({"image": image, "command": ["sh", "-c", command], "network": "none"});
    if let Some(site) = site {
        arguments["site"] = json!(site);
    }
    arguments
}

#[test]
fn runs_go_to_their_site_and_one_site_down_leaves_the_other_running() {
    let dir = TempDir::new("sites");
    let gate = Gate::start(&dir);
    let runner = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/x86_64-unknown-linux-musl/release/mcp-k8s-ephemeral-job");
    assert!(runner.is_file(), "{} is missing; tests/build-project-image builds it", runner.display());
    let sites = json!([
        {"name": "docker", "backend": "docker", "docker_host": format!("unix://{}", gate.path.display()), "runner_binary": runner.display().to_string()},
        {"name": "cluster", "default": true, "backend": "kubernetes"},
    ]);
    let sites_path = dir.path.join("sites.json");
    std::fs::write(&sites_path, sites.to_string()).unwrap();
    // A warm pool of the Docker site's: runs there start in its sandboxes.
    let pools_path = dir.path.join("pools.json");
    let pools = json!([{"name": "dock", "image": DOCKER_BUSYBOX, "network": "none", "size": 1, "site": "docker"}]);
    std::fs::write(&pools_path, pools.to_string()).unwrap();
    let images = format!("{},{DOCKER_BUSYBOX}", busybox_image());
    let (sites_text, pools_text) = (sites_path.display().to_string(), pools_path.display().to_string());
    let mut server =
        cluster::server(&[("MCP_K8S_SITES", &sites_text), ("MCP_K8S_ALLOWED_IMAGES", &images), ("MCP_K8S_WARM_POOLS", &pools_text)]);
    // Stopped with SIGTERM at the end, so the Docker site's pool goes too.
    server.stop_gently = true;

    let described = ok(&mut server, "describe_environment", json!({}));
    let health = |described: &Value| -> Vec<(String, bool, String)> {
        described["sites"]
            .as_array()
            .unwrap()
            .iter()
            .map(|site| (site["name"].as_str().unwrap().into(), site["default"] == true, site["health"].as_str().unwrap().into()))
            .collect()
    };
    assert_eq!(health(&described), [("cluster".into(), true, "ok".into()), ("docker".into(), false, "ok".into())]);

    // Each run goes to its site; tokens carry theirs.
    let on_cluster = ok(&mut server, "run_job", run(&busybox_image(), "echo on-cluster", None));
    assert_eq!((on_cluster["exit_code"].as_i64(), on_cluster["stdout"].as_str()), (Some(0), Some("on-cluster\n")), "{on_cluster}");
    let on_docker = ok(&mut server, "run_job", run(DOCKER_BUSYBOX, "echo on-docker", Some("docker")));
    assert_eq!((on_docker["exit_code"].as_i64(), on_docker["stdout"].as_str()), (Some(0), Some("on-docker\n")), "{on_docker}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pool = ok(&mut server, "describe_environment", json!({}))["warm_pools"][0].clone();
        assert_eq!(pool["site"], "docker", "{pool}");
        if pool["ready"].as_u64() >= Some(1) {
            break;
        }
        assert!(Instant::now() < deadline, "the Docker site's pool never had a sandbox ready: {pool}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let warm = ok(&mut server, "run_job", run(DOCKER_BUSYBOX, "echo warm", Some("docker")));
    assert_eq!((warm["stdout"].as_str(), warm["timings"]["warm"].as_bool()), (Some("warm\n"), Some(true)), "{warm}");
    let cluster_token = submit(&mut server, run(&busybox_image(), "sleep 3; echo later", None));
    let _cluster_jobs = Cleanup(vec![run_id_of(&cluster_token)]);
    let docker_token = submit(&mut server, run(DOCKER_BUSYBOX, "sleep 3; echo later", Some("docker")));
    let mut docker_runs = DockerRuns(vec![run_id_of(&docker_token)]);
    assert!(cluster_token.ends_with(".cluster") && docker_token.ends_with(".docker"), "{cluster_token} {docker_token}");
    let admin = cluster::admin_client();
    let job = admin.get(kube::Resource::JOBS, &cluster::namespace(), &job_name(&run_id_of(&cluster_token)));
    assert!(job.is_ok(), "the cluster run is a Job: {job:?}");
    assert!(docker_containers_of(&run_id_of(&docker_token)) > 0, "the Docker run is a container");
    for token in [&cluster_token, &docker_token] {
        let done = fetch_done(&mut server, token, Duration::from_secs(120));
        assert_eq!((done["result"]["exit_code"].as_i64(), done["result"]["stdout"].as_str()), (Some(0), Some("later\n")), "{done}");
    }
    let unknown_site = send_call(&mut server, "run_job", run(&busybox_image(), "true", Some("mars")));
    let refused = response(&server, unknown_site, Duration::from_secs(30));
    assert!(refused["content"][0]["text"].as_str().unwrap().contains("unknown site `mars`; sites here: cluster, docker"), "{refused}");

    // A sandbox's id carries its site, as a token does: calls in it, the
    // listing and the close need no `site`.
    let opened = ok(&mut server, "open_sandbox", json!({"image": DOCKER_BUSYBOX, "network": "none", "site": "docker"}));
    let sandbox = opened["sandbox"].as_str().unwrap().to_string();
    assert!(sandbox.ends_with(".docker"), "{opened}");
    let in_it = ok(&mut server, "run_job", json!({"command": ["sh", "-c", "echo in-sandbox"], "sandbox": sandbox}));
    assert_eq!(in_it["stdout"], "in-sandbox\n", "{in_it}");
    let listed = ok(&mut server, "list_sandboxes", json!({}));
    assert!(listed["sandboxes"].as_array().unwrap().iter().any(|shown| shown["sandbox"] == sandbox.as_str()), "{listed}");
    let wrong_site = send_call(&mut server, "run_job", json!({"command": ["true"], "sandbox": sandbox, "site": "cluster"}));
    let refused = response(&server, wrong_site, Duration::from_secs(30));
    assert!(refused["content"][0]["text"].as_str().unwrap().contains("is on site `docker`, not `cluster`"), "{refused}");
    let closed = ok(&mut server, "close_sandbox", json!({"sandbox": sandbox}));
    assert_eq!(closed["state"], "closed", "{closed}");

    // The Docker site goes down (its daemon hangs): a run sent there waits,
    // while the cluster site still runs, lists and describes itself.
    gate.down();
    let stuck = send_call(&mut server, "run_job", run(DOCKER_BUSYBOX, "echo never", Some("docker")));
    let started = Instant::now();
    let during = ok(&mut server, "run_job", run(&busybox_image(), "echo still-here", None));
    assert_eq!(during["stdout"], "still-here\n", "{during}");
    println!("a cluster run with the Docker site down answered in {:?}", started.elapsed());
    let described = ok(&mut server, "describe_environment", json!({}));
    let sites = health(&described);
    assert_eq!(sites[0], ("cluster".into(), true, "ok".into()));
    assert!(sites[1].2.starts_with("no answer within") || sites[1].2.starts_with("unreachable"), "{sites:?}");
    let listed = ok(&mut server, "list_jobs", json!({}));
    assert!(
        listed["jobs"].as_array().unwrap().iter().any(|job| job["job_token"] == cluster_token.as_str() && job["site"] == "cluster"),
        "{listed}"
    );
    assert_eq!(listed["unreachable_sites"][0]["site"], "docker", "{listed}");

    // Back up: the stuck call ends (its connection was cut), and the site
    // takes runs again.
    gate.up();
    let ended = response(&server, stuck, Duration::from_secs(180));
    if let Some(run_id) = ended["structuredContent"]["run_id"].as_str() {
        docker_runs.0.push(run_id.to_string());
    }
    let again = ok(&mut server, "run_job", run(DOCKER_BUSYBOX, "echo back", Some("docker")));
    assert_eq!(again["stdout"], "back\n", "{again}");
}
