//! `docker::Client` against the real engine: version negotiation, the
//! container lifecycle a backend drives (create, start, wait, logs, inspect,
//! kill, remove), demultiplexed output, OOM kills, typed errors, label
//! filters, events, put archive, aborting streams, and the read-only mount
//! of the runner binary.

use std::io::{BufRead, Read};
use std::time::{Duration, Instant};

use mcp_k8s_ephemeral_job::docker;
use mcp_k8s_ephemeral_job::docker::objects::ContainerSpec;
use mcp_k8s_ephemeral_job::docker::{WaitCondition, tar};

use crate::{BUSYBOX, Cleanup, client, hardened};

const WAIT: Duration = Duration::from_secs(60);

/// What one finished container left.
struct Finished {
    id: String,
    wait_status: i64,
    stdout: String,
    stderr: String,
    state: docker::objects::ContainerState,
}

/// Create, start, wait for the exit, read the logs and inspect: the calls a
/// backend makes for one run.
fn run_to_exit(client: &docker::Client, name: &str, spec: &ContainerSpec) -> Finished {
    let created = client.container_create(name, spec).expect("create");
    start_to_exit(client, &created.id)
}

/// `run_to_exit` of a container already created.
fn start_to_exit(client: &docker::Client, id: &str) -> Finished {
    client.container_start(id).expect("start");
    let waited = client.container_wait(id, WaitCondition::NotRunning, WAIT, None).expect("wait");
    let mut logs = client.container_logs(id, &docker::LogParams { follow: true, idle_timeout: Some(WAIT) }).expect("logs");
    let mut stdout = String::new();
    logs.read_to_string(&mut stdout).expect("read stdout");
    let stderr = String::from_utf8_lossy(logs.stderr_head()).into_owned();
    let state = client.container_inspect(id).expect("inspect").state;
    Finished { id: id.to_string(), wait_status: waited.status_code, stdout, stderr, state }
}

#[test]
fn the_daemon_speaks_api_1_41_or_later_and_we_use_a_version_it_serves() {
    let client = client();
    client.ping().expect("ping");
    let version = client.version();
    let ours = docker::parse_api_version(client.api_version()).expect("a version");
    assert!(ours >= docker::MIN_API_VERSION, "{version:?}");
    assert!(ours <= docker::parse_api_version(&version.api_version).expect("the daemon's version"), "{version:?}");
    assert!(!version.version.is_empty());
    let info = client.info().expect("info");
    assert!(!info.driver.is_empty(), "{info:?}");
}

#[test]
fn busybox_echo_exits_with_its_code_and_stdout_and_stderr_apart() {
    let client = client();
    let cleanup = Cleanup::new(&client, "echo");
    let spec = hardened(&cleanup, &["sh", "-c", "echo hello; echo oops >&2; echo world; id -u; exit 3"]);
    let finished = run_to_exit(&client, &cleanup.value, &spec);
    assert_eq!(finished.wait_status, 3);
    assert_eq!(finished.stdout, "hello\nworld\n65532\n");
    assert_eq!(finished.stderr, "oops\n");
    assert_eq!(finished.state.status, "exited");
    assert_eq!(finished.state.exit_code, 3);
    assert!(!finished.state.oom_killed && !finished.state.running);
    // Both are set, but for a short run FinishedAt can be earlier than
    // StartedAt (seen on 20.10: dockerd stamps StartedAt after runc's start
    // returns, FinishedAt from the exit event): a backend must not take a
    // duration from them.
    assert!(finished.state.started_at.starts_with("20") && finished.state.finished_at.starts_with("20"), "{:?}", finished.state);
    let inspect = client.container_inspect(&finished.id).expect("inspect");
    assert_eq!(inspect.name, format!("/{}", cleanup.value));
    assert_eq!(inspect.config.labels.get(crate::TEST_LABEL), Some(&cleanup.value));
}

#[test]
fn the_hardening_holds_inside_the_container() {
    let client = client();
    let cleanup = Cleanup::new(&client, "hardening");
    let script = "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; \
                  touch /rootfs-file 2>/dev/null && echo rootfs-writable || echo rootfs-readonly; \
                  touch /tmp/x && echo tmp-writable; \
                  ls /sys/class/net";
    let finished = run_to_exit(&client, &cleanup.value, &hardened(&cleanup, &["sh", "-c", script]));
    assert_eq!(finished.wait_status, 0, "{}", finished.stderr);
    assert_eq!(finished.stdout, "CapEff:\t0000000000000000\nNoNewPrivs:\t1\nrootfs-readonly\ntmp-writable\nlo\n");
}

/// dockerd sets `OOMKilled` from containerd's OOM event, which can come
/// after the exit is processed on a loaded machine (seen at load 10 on 2
/// cores): the exit is always 137, the flag is asked of up to three runs.
/// The backend does not rely on the flag alone (the runner counts its
/// cgroup's OOM kills: `backend::out_of_memory_is_named`).
#[test]
fn a_memory_hog_is_oom_killed_and_inspect_says_so() {
    let client = client();
    let mut states = Vec::new();
    for attempt in 0..3 {
        let cleanup = Cleanup::new(&client, &format!("oom-{attempt}"));
        let mut spec = hardened(&cleanup, &["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"]);
        spec.host_config.memory = 16 * 1024 * 1024;
        spec.host_config.memory_swap = 16 * 1024 * 1024;
        let finished = run_to_exit(&client, &cleanup.value, &spec);
        assert_eq!(finished.state.exit_code, 137, "{:?} stderr {:?}", finished.state, finished.stderr);
        assert_eq!(finished.wait_status, 137);
        if finished.state.oom_killed {
            return;
        }
        states.push(finished.state);
    }
    panic!("no run of three was flagged OOMKilled: {states:?}");
}

#[test]
fn a_missing_image_is_a_typed_not_found() {
    let client = client();
    let cleanup = Cleanup::new(&client, "missing-image");
    let missing = "mcp-k8s-test.local/no-such-image:0";
    assert!(!client.image_exists(missing).expect("inspect"));
    assert!(client.image_exists(BUSYBOX).expect("inspect"));
    let image = client.image_inspect(BUSYBOX).expect("inspect busybox");
    assert!(image.id.starts_with("sha256:") && image.repo_tags.iter().any(|tag| tag == BUSYBOX), "{image:?}");
    let mut spec = hardened(&cleanup, &["true"]);
    spec.image = missing.to_string();
    let error = client.container_create(&cleanup.value, &spec).unwrap_err();
    assert!(error.is_not_found(), "{error}");
    assert!(error.to_string().contains("No such image"), "{error}");
    assert!(client.container_list(&cleanup.filters()).expect("list").is_empty(), "no container is left by a failed create");
}

#[test]
fn a_container_name_in_use_is_a_typed_conflict() {
    let client = client();
    let cleanup = Cleanup::new(&client, "conflict");
    let spec = hardened(&cleanup, &["true"]);
    client.container_create(&cleanup.value, &spec).expect("first create");
    let error = client.container_create(&cleanup.value, &spec).unwrap_err();
    assert!(error.is_conflict(), "{error}");
}

#[test]
fn remove_leaves_nothing_and_a_second_remove_is_not_found() {
    let client = client();
    let cleanup = Cleanup::new(&client, "remove");
    let finished = run_to_exit(&client, &cleanup.value, &hardened(&cleanup, &["true"]));
    assert_eq!(client.container_list(&cleanup.filters()).expect("list").len(), 1);
    client.container_remove(&finished.id).expect("remove");
    assert!(client.container_list(&cleanup.filters()).expect("list").is_empty());
    assert!(client.container_inspect(&finished.id).unwrap_err().is_not_found());
    assert!(client.container_remove(&finished.id).unwrap_err().is_not_found());
}

#[test]
fn list_filters_on_labels() {
    let client = client();
    let cleanup = Cleanup::new(&client, "labels");
    let mut ids = Vec::new();
    for colour in ["red", "blue"] {
        let mut spec = hardened(&cleanup, &["true"]);
        spec.labels.insert("mcp-k8s-test/colour".to_string(), colour.to_string());
        ids.push(client.container_create(&format!("{}-{colour}", cleanup.value), &spec).expect("create").id);
    }
    let both = client.container_list(&cleanup.filters()).expect("list");
    assert_eq!(both.len(), 2);
    let mut red_filter = cleanup.filters();
    red_filter.labels.push("mcp-k8s-test/colour=red".to_string());
    let red = client.container_list(&red_filter).expect("list red");
    assert_eq!(red.iter().map(|container| container.id.as_str()).collect::<Vec<_>>(), [ids[0].as_str()]);
    assert_eq!(red[0].state, "created");
    assert_eq!(red[0].labels.get("mcp-k8s-test/colour").map(String::as_str), Some("red"));
    assert_eq!(red[0].names, [format!("/{}-red", cleanup.value)]);
}

#[test]
fn kill_stops_a_running_container_and_a_second_kill_is_a_conflict() {
    let client = client();
    let cleanup = Cleanup::new(&client, "kill");
    let id = client.container_create(&cleanup.value, &hardened(&cleanup, &["sleep", "60"])).expect("create").id;
    client.container_start(&id).expect("start");
    assert!(client.container_inspect(&id).expect("inspect").state.running);
    client.container_kill(&id, "KILL").expect("kill");
    let waited = client.container_wait(&id, WaitCondition::NotRunning, WAIT, None).expect("wait");
    assert_eq!(waited.status_code, 137);
    let state = client.container_inspect(&id).expect("inspect").state;
    assert!(!state.oom_killed && state.exit_code == 137, "{state:?}");
    let error = client.container_kill(&id, "KILL").unwrap_err();
    assert!(error.is_conflict(), "{error}");
}

#[test]
fn wait_gives_up_at_its_timeout() {
    let client = client();
    let cleanup = Cleanup::new(&client, "wait-timeout");
    let id = client.container_create(&cleanup.value, &hardened(&cleanup, &["sleep", "60"])).expect("create").id;
    client.container_start(&id).expect("start");
    let started = Instant::now();
    let error = client.container_wait(&id, WaitCondition::NextExit, Duration::from_millis(300), None).unwrap_err();
    assert!(matches!(error, docker::Error::Timeout { .. }), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn a_followed_log_is_live_and_closes_at_once_on_abort() {
    let client = client();
    let cleanup = Cleanup::new(&client, "abort");
    let spec = hardened(&cleanup, &["sh", "-c", "echo first; sleep 60; echo never"]);
    let id = client.container_create(&cleanup.value, &spec).expect("create").id;
    client.container_start(&id).expect("start");
    let mut logs = client.container_logs(&id, &docker::LogParams { follow: true, idle_timeout: None }).expect("logs");
    let mut line = String::new();
    logs.read_line(&mut line).expect("the first line, while the container runs");
    assert_eq!(line, "first\n");
    let abort = logs.abort_handle();
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        let result = logs.read_line(&mut rest);
        (result.map_err(|error| error.kind()), rest)
    });
    std::thread::sleep(Duration::from_millis(200));
    let aborted_at = Instant::now();
    abort.abort();
    let (result, rest) = reader.join().expect("reader thread");
    assert_eq!(result, Err(std::io::ErrorKind::ConnectionAborted));
    assert_eq!(rest, "");
    assert!(aborted_at.elapsed() < Duration::from_secs(2), "{:?}", aborted_at.elapsed());
}

#[test]
fn events_report_the_start_and_the_exit_code_of_labelled_containers() {
    let client = client();
    let cleanup = Cleanup::new(&client, "events");
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() as i64 - 1;
    let mut events = client.events(&cleanup.filters(), Some(since), Some(WAIT)).expect("events");
    let finished = run_to_exit(&client, &cleanup.value, &hardened(&cleanup, &["sh", "-c", "exit 7"]));
    let mut actions = Vec::new();
    loop {
        let event = events.next().expect("an event").expect("the stream stays open");
        assert_eq!(event.actor.id, finished.id);
        assert_eq!(event.actor.attributes.get(crate::TEST_LABEL), Some(&cleanup.value));
        actions.push(event.action.clone());
        if event.action == "die" {
            assert_eq!(event.actor.attributes.get("exitCode").map(String::as_str), Some("7"));
            break;
        }
    }
    assert_eq!(actions, ["create", "start", "die"]);
    let abort = events.abort_handle();
    abort.abort();
    assert!(matches!(events.next(), Err(docker::Error::Aborted { .. })));
}

#[test]
fn put_archive_writes_files_into_a_created_container() {
    let client = client();
    let cleanup = Cleanup::new(&client, "archive");
    let mut spec = hardened(&cleanup, &["sh", "-c", "cat /work/in/hello.txt; stat -c '%a %u:%g' /work/in/hello.txt"]);
    spec.host_config.readonly_rootfs = false;
    let id = client.container_create(&cleanup.value, &spec).expect("create").id;
    let archive = tar::archive(&[
        tar::Entry { path: "work/", kind: tar::EntryKind::Directory, mode: 0o755, uid: 65532, gid: 65532 },
        tar::Entry { path: "work/in/", kind: tar::EntryKind::Directory, mode: 0o755, uid: 65532, gid: 65532 },
        tar::Entry { path: "work/in/hello.txt", kind: tar::EntryKind::File(b"from the archive\n"), mode: 0o640, uid: 65532, gid: 65532 },
    ])
    .expect("archive");
    client.container_put_archive(&id, "/", &archive).expect("put archive");
    let finished = start_to_exit(&client, &id);
    assert_eq!(finished.wait_status, 0, "{}", finished.stderr);
    assert_eq!(finished.stdout, "from the archive\n640 65532:65532\n");
}

#[test]
fn put_archive_into_a_read_only_root_is_refused_with_the_daemons_reason() {
    // The backend's input files go to an anonymous volume instead (below).
    // Docker 20.10 answers 500 here; the message is what identifies it.
    let client = client();
    let cleanup = Cleanup::new(&client, "archive-readonly");
    let id = client.container_create(&cleanup.value, &hardened(&cleanup, &["true"])).expect("create").id;
    let archive =
        tar::archive(&[tar::Entry { path: "x", kind: tar::EntryKind::File(b"x"), mode: 0o644, uid: 0, gid: 0 }]).expect("archive");
    let error = client.container_put_archive(&id, "/tmp", &archive).unwrap_err();
    assert!(matches!(error, docker::Error::Status { .. }), "{error}");
    assert!(error.to_string().contains("read-only"), "{error}");
}

#[test]
fn an_anonymous_volume_is_writable_under_a_read_only_root_and_goes_with_the_container() {
    let client = client();
    let cleanup = Cleanup::new(&client, "volume");
    let script = "cat /work/in/hello.txt; echo out > /work/in/result.txt && echo wrote; touch /elsewhere 2>/dev/null || echo root-readonly";
    let mut spec = hardened(&cleanup, &["sh", "-c", script]);
    spec.volumes.insert("/work".to_string(), docker::objects::EmptyObject {});
    let id = client.container_create(&cleanup.value, &spec).expect("create").id;
    let archive = tar::archive(&[
        tar::Entry { path: "in/", kind: tar::EntryKind::Directory, mode: 0o755, uid: 65532, gid: 65532 },
        tar::Entry { path: "in/hello.txt", kind: tar::EntryKind::File(b"input\n"), mode: 0o644, uid: 65532, gid: 65532 },
    ])
    .expect("archive");
    client.container_put_archive(&id, "/work", &archive).expect("put archive into the volume");
    let finished = start_to_exit(&client, &id);
    assert_eq!(finished.wait_status, 0, "{}", finished.stderr);
    assert_eq!(finished.stdout, "input\nwrote\nroot-readonly\n");
    let mounts = client.container_inspect(&id).expect("inspect").mounts;
    let volume = mounts.iter().find(|mount| mount.destination == "/work").expect("the /work mount");
    assert_eq!(volume.kind, "volume");
    assert!(client.volume_exists(&volume.name).expect("volume inspect"));
    client.container_remove(&id).expect("remove");
    assert!(!client.volume_exists(&volume.name).expect("volume inspect"), "v=1 removes the anonymous volume");
}

#[test]
fn the_runner_binary_runs_from_a_read_only_bind_mount() {
    let runner = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/x86_64-unknown-linux-musl/release/mcp-k8s-ephemeral-job");
    assert!(runner.is_file(), "{} is missing; build it with tests/build-project-image", runner.display());
    let client = client();
    let cleanup = Cleanup::new(&client, "runner");
    let mut spec = hardened(&cleanup, &[]);
    spec.entrypoint = Some(vec!["/mcp/bin/mcp-k8s-ephemeral-job".to_string(), "--version".to_string()]);
    spec.host_config.binds = vec![format!("{}:/mcp/bin/mcp-k8s-ephemeral-job:ro", runner.display())];
    let finished = run_to_exit(&client, &cleanup.value, &spec);
    assert_eq!(finished.wait_status, 0, "{}", finished.stderr);
    assert!(finished.stdout.starts_with("mcp-k8s-ephemeral-job "), "{}", finished.stdout);
    let mut spec = hardened(&cleanup, &["sh", "-c", "echo x > /mcp/bin/mcp-k8s-ephemeral-job"]);
    spec.host_config.binds = vec![format!("{}:/mcp/bin/mcp-k8s-ephemeral-job:ro", runner.display())];
    let finished = run_to_exit(&client, &format!("{}-write", cleanup.value), &spec);
    assert_ne!(finished.wait_status, 0);
    assert!(finished.stderr.contains("Read-only file system"), "{}", finished.stderr);
}

#[test]
fn a_missing_socket_and_a_dead_one_are_named() {
    let dir = std::env::temp_dir().join(format!("on-docker-sockets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let missing = dir.join("missing.sock");
    let error = docker::Client::connect(&missing, docker::Options::default()).unwrap_err();
    assert!(matches!(error, docker::Error::SocketMissing { .. }), "{error}");
    assert!(error.to_string().contains("tests/docker/up"), "{error}");
    // A socket file with nobody accepting: the daemon died and left it.
    let dead = dir.join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).expect("bind"));
    let error = docker::Client::connect(&dead, docker::Options::default()).unwrap_err();
    assert!(matches!(error, docker::Error::DaemonNotRunning { .. }), "{error}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// One create/start/wait/remove cycle of `true`, timed: what the backend's
/// run costs in Docker calls. `bench/docker-client` sets
/// `MCP_K8S_DOCKER_BENCH_RUNS` to repeat it and report p50/p95.
#[test]
fn create_start_wait_remove_of_true_is_timed() {
    let client = client();
    let cleanup = Cleanup::new(&client, "bench");
    let n_runs: usize = std::env::var("MCP_K8S_DOCKER_BENCH_RUNS").ok().and_then(|runs| runs.parse().ok()).unwrap_or(1);
    // Per run: create, start, wait, remove, and the whole cycle.
    let mut phases: [Vec<Duration>; 5] = Default::default();
    for run_idx in 0..n_runs {
        let spec = hardened(&cleanup, &["true"]);
        let started = Instant::now();
        let id = client.container_create(&format!("{}-{run_idx}", cleanup.value), &spec).expect("create").id;
        let created = Instant::now();
        client.container_start(&id).expect("start");
        let running = Instant::now();
        let waited = client.container_wait(&id, WaitCondition::NotRunning, WAIT, None).expect("wait");
        let exited = Instant::now();
        client.container_remove(&id).expect("remove");
        let removed = Instant::now();
        assert_eq!(waited.status_code, 0);
        for (phase, duration) in
            phases.iter_mut().zip([created - started, running - created, exited - running, removed - exited, removed - started])
        {
            phase.push(duration);
        }
    }
    let percentile = |durations: &mut Vec<Duration>, percent: usize| {
        durations.sort();
        durations[(durations.len() * percent / 100).min(durations.len() - 1)].as_secs_f64()
    };
    let [create, start, wait, remove, cycle] = &mut phases;
    eprintln!(
        "docker client create+start+wait+remove, hardened {n_runs:3} runs  p50 {:.3} s  p95 {:.3} s  \
         (p50 create {:.3}, start {:.3}, wait {:.3}, remove {:.3})",
        percentile(cycle, 50),
        percentile(cycle, 95),
        percentile(create, 50),
        percentile(start, 50),
        percentile(wait, 50),
        percentile(remove, 50),
    );
    assert!(client.container_list(&cleanup.filters()).expect("list").is_empty());
}

#[test]
fn image_load_reads_a_docker_archive_and_the_image_can_be_removed_again() {
    let client = client();
    let name = format!("mcp-k8s-test.local/on-docker-load:{}", std::process::id());
    let _ = client.image_remove(&name);
    let layer =
        tar::archive(&[tar::Entry { path: "hello.txt", kind: tar::EntryKind::File(b"hi\n"), mode: 0o644, uid: 0, gid: 0 }]).expect("layer");
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {"Cmd": ["/hello"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", sha256_hex(&layer))]},
    })
    .to_string();
    let manifest = serde_json::json!([{"Config": "config.json", "RepoTags": [name], "Layers": ["layer.tar"]}]).to_string();
    let archive = tar::archive(&[
        tar::Entry { path: "manifest.json", kind: tar::EntryKind::File(manifest.as_bytes()), mode: 0o644, uid: 0, gid: 0 },
        tar::Entry { path: "config.json", kind: tar::EntryKind::File(config.as_bytes()), mode: 0o644, uid: 0, gid: 0 },
        tar::Entry { path: "layer.tar", kind: tar::EntryKind::File(&layer), mode: 0o644, uid: 0, gid: 0 },
    ])
    .expect("archive");
    let path = std::env::temp_dir().join(format!("on-docker-load-{}.tar", std::process::id()));
    std::fs::write(&path, &archive).expect("write the archive");
    let loaded = client.image_load(&path, WAIT);
    std::fs::remove_file(&path).expect("remove the archive");
    loaded.expect("load");
    let image = client.image_inspect(&name).expect("the loaded image");
    assert_eq!(image.id, format!("sha256:{}", sha256_hex(config.as_bytes())), "the image id is the config's digest");
    assert_eq!(image.config.cmd, ["/hello"]);
    client.image_remove(&name).expect("remove");
    assert!(!client.image_exists(&name).expect("inspect"));
    assert!(client.image_remove(&name).unwrap_err().is_not_found());
}

#[test]
fn image_load_of_something_that_is_not_an_image_fails_with_the_daemons_reason() {
    let client = client();
    let archive =
        tar::archive(&[tar::Entry { path: "junk", kind: tar::EntryKind::File(b"junk"), mode: 0o644, uid: 0, gid: 0 }]).expect("archive");
    let path = std::env::temp_dir().join(format!("on-docker-junk-{}.tar", std::process::id()));
    std::fs::write(&path, &archive).expect("write the archive");
    let loaded = client.image_load(&path, WAIT);
    std::fs::remove_file(&path).expect("remove the archive");
    let error = loaded.unwrap_err();
    assert!(matches!(error, docker::Error::Status { .. } | docker::Error::Progress { .. }), "{error}");
}

#[test]
fn a_pull_from_an_unreachable_registry_fails_at_once_with_the_daemons_reason() {
    // The test engine has no registry (air-gapped): the pull call itself is
    // what this checks, and that its failure is an error, not a 200.
    let client = client();
    let started = Instant::now();
    let error = client.image_pull("mcp-k8s-test.local/no-such-image:0", Duration::from_secs(20)).unwrap_err();
    assert!(matches!(error, docker::Error::Status { .. } | docker::Error::Progress { .. }), "{error}");
    assert!(error.to_string().contains("mcp-k8s-test.local"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().map(|byte| format!("{byte:02x}")).collect()
}

#[test]
fn a_size_bound_on_the_writable_layer_is_refused_unless_overlay2_sits_on_xfs() {
    // What the backend must say when it cannot bound the workdir's size
    //: overlay2 takes `size` only over xfs with pquota. The test
    // engine's data root is on this machine's ext4, so there it is refused.
    let client = client();
    let cleanup = Cleanup::new(&client, "storage-opt");
    let info = client.info().expect("info");
    let backing = info.driver_status.iter().find(|pair| pair.first().is_some_and(|key| key == "Backing Filesystem"));
    let on_xfs = backing.and_then(|pair| pair.get(1)).is_some_and(|value| value == "xfs");
    let mut spec = hardened(&cleanup, &["true"]);
    spec.host_config.storage_opt.insert("size".to_string(), "64M".to_string());
    let created = client.container_create(&cleanup.value, &spec);
    if info.driver == "overlay2" && !on_xfs {
        let error = created.unwrap_err();
        assert!(error.to_string().contains("--storage-opt is supported only for overlay over xfs"), "{error}");
    } else {
        eprintln!("storage driver {} on {backing:?}: size accepted or refused as {:?}", info.driver, created.as_ref().err());
    }
}

#[test]
fn a_wait_is_closed_at_once_by_its_abort() {
    let client = client();
    let cleanup = Cleanup::new(&client, "wait-abort");
    let id = client.container_create(&cleanup.value, &hardened(&cleanup, &["sleep", "60"])).expect("create").id;
    client.container_start(&id).expect("start");
    let abort = docker::stream::Abort::new();
    let waiter = {
        let (client, id, abort) = (client.clone(), id.clone(), abort.clone());
        std::thread::spawn(move || client.container_wait(&id, WaitCondition::NextExit, WAIT, Some(&abort)))
    };
    std::thread::sleep(Duration::from_millis(300));
    let aborted_at = Instant::now();
    abort.abort();
    let error = waiter.join().expect("waiter thread").unwrap_err();
    assert!(matches!(error, docker::Error::Aborted { .. }), "{error}");
    assert!(aborted_at.elapsed() < Duration::from_secs(2), "{:?}", aborted_at.elapsed());
    assert!(client.container_inspect(&id).expect("inspect").state.running, "aborting the wait leaves the container alone");
}

/// The network calls the Docker backend makes for `open` runs: create (a
/// second one of the name is a conflict), inspect (options, labels, the
/// gateway), a container's address on it, remove (then not found).
#[test]
fn networks_are_created_inspected_joined_and_removed() {
    let client = client();
    let cleanup = Cleanup::new(&client, "network");
    let name = cleanup.value.clone();
    let _ = client.network_remove(&name);
    let mut spec = docker::objects::NetworkSpec {
        name: name.clone(),
        driver: "bridge".into(),
        check_duplicate: true,
        ..docker::objects::NetworkSpec::default()
    };
    spec.options.insert("com.docker.network.bridge.enable_icc".into(), "false".into());
    spec.labels.insert(crate::TEST_LABEL.into(), cleanup.value.clone());
    let created = client.network_create(&spec).expect("create");
    assert!(!created.id.is_empty());
    let again = client.network_create(&spec).expect_err("a second network of the name");
    assert!(again.is_conflict(), "{again}");
    let inspect = client.network_inspect(&name).expect("inspect");
    assert_eq!((inspect.name.as_str(), inspect.driver.as_str(), inspect.internal), (name.as_str(), "bridge", false));
    assert_eq!(inspect.options.get("com.docker.network.bridge.enable_icc").map(String::as_str), Some("false"));
    assert_eq!(inspect.labels.get(crate::TEST_LABEL), Some(&cleanup.value));
    let gateway = inspect.ipam.config.first().map(|config| config.gateway.clone()).unwrap_or_default();
    assert!(!gateway.is_empty(), "{inspect:?}");
    let mut on_it = hardened(&cleanup, &["true"]);
    on_it.host_config.network_mode = name.clone();
    let joined = client.container_create(&format!("{name}-c"), &on_it).expect("create on the network");
    let endpoint = client.container_inspect(&joined.id).expect("inspect").network_settings.networks.get(&name).cloned();
    assert!(endpoint.is_some(), "the container is on the network");
    client.container_remove(&joined.id).expect("remove the container");
    client.network_remove(&name).expect("remove");
    assert!(client.network_inspect(&name).expect_err("gone").is_not_found());
    assert!(client.network_remove(&name).expect_err("gone").is_not_found());
}
