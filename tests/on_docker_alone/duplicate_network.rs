//! Two servers that start open runs at once on a fresh daemon may both
//! create the open network: Docker lets two creates of one name succeed,
//! and a container on a name two networks share cannot start ("network
//! mcp-k8s-open is ambiguous"). Here the duplicate is made on purpose (on a
//! private daemon: on the shared one it would disturb other tests' runs);
//! the next open run must remove it and succeed, or, while another run
//! still uses it, start on the kept one and remove it later.

use serde_json::json;

use crate::PrivateDaemon;
use crate::restart::{answer, call, send_call, server};
use mcp_k8s_ephemeral_job::backend::docker::spec::{OPEN_NETWORK, open_network, open_networks};
use mcp_k8s_ephemeral_job::docker::objects::{ContainerSpec, HostConfig, NetworkSpec};

#[test]
fn a_duplicate_open_network_is_removed_and_the_run_starts() {
    let daemon = PrivateDaemon::start("dup");
    let client = daemon.client();
    client.network_create(&open_network()).expect("docker network create");
    make_duplicate(&client);
    assert_eq!(named(&client), 2, "the daemon kept both creates of one name");
    let mut server = server(&daemon);
    let arguments = json!({"image": crate::BUSYBOX, "command": ["true"], "network": "open"});
    let outcome = call(&mut server, 1, "run_job", arguments);
    assert_eq!(outcome["status"], "succeeded", "{outcome}");
    assert_eq!(named(&client), 1, "the duplicate is gone");
}

/// What `.ci/run` met on a fresh daemon: servers started at once, each
/// made the open network, one's run joined a duplicate, and the others
/// could neither remove it ("has active endpoints") nor start on the
/// shared name. Under the daemon-wide lock, six servers starting open runs
/// at once make one network, and every run starts.
#[test]
fn six_servers_starting_open_runs_at_once_make_one_network() {
    let daemon = PrivateDaemon::start("six");
    let client = daemon.client();
    assert_eq!(named(&client), 0, "a fresh daemon");
    // Started first, so that the six calls go out together.
    let mut servers: Vec<_> = (0..6).map(|_| server(&daemon)).collect();
    let together = std::sync::Barrier::new(servers.len());
    let outcomes: Vec<serde_json::Value> = std::thread::scope(|scope| {
        let runs: Vec<_> = servers
            .iter_mut()
            .map(|server| {
                let together = &together;
                scope.spawn(move || {
                    together.wait();
                    call(server, 1, "run_job", json!({"image": crate::BUSYBOX, "command": ["true"], "network": "open"}))
                })
            })
            .collect();
        runs.into_iter().map(|run| run.join().expect("a run thread")).collect()
    });
    for outcome in &outcomes {
        assert_eq!(outcome["status"], "succeeded", "{outcome}");
    }
    assert_eq!(named(&client), 1, "one open network");
    let lock = client.container_inspect("mcp-k8s-open-network-lock");
    assert!(lock.is_err_and(|error| error.is_not_found()), "the lock is gone");
}

/// A lock left by a server that crashed while making the network: the
/// next server waits for it (10 s), takes it to be stale, removes it, makes
/// the network and starts its run.
#[test]
fn a_stale_lock_is_removed_after_the_wait_and_the_run_starts() {
    let daemon = PrivateDaemon::start("stale");
    let client = daemon.client();
    let lock = ContainerSpec { image: crate::BUSYBOX.to_string(), ..ContainerSpec::default() };
    client.container_create("mcp-k8s-open-network-lock", &lock).expect("docker create");
    let mut server = server(&daemon);
    let outcome = call(&mut server, 1, "run_job", json!({"image": crate::BUSYBOX, "command": ["true"], "network": "open"}));
    assert_eq!(outcome["status"], "succeeded", "{outcome}");
    assert_eq!(named(&client), 1, "the network was made");
    let lock = client.container_inspect("mcp-k8s-open-network-lock");
    assert!(lock.is_err_and(|error| error.is_not_found()), "the stale lock is gone");
}

/// A duplicate that a run still uses cannot be removed, and no container
/// can start on the shared name meanwhile: the open run is refused saying
/// so and what to do, and starts once that run has ended.
#[test]
fn a_duplicate_still_in_use_is_named_and_removed_once_that_run_ends() {
    let daemon = PrivateDaemon::start("dupuse");
    let client = daemon.client();
    // A run on the network, then a duplicate made beside it whose id sorts
    // first, so that the network in use is the one to remove.
    client.network_create(&open_network()).expect("docker network create");
    let blocker = ContainerSpec {
        image: crate::BUSYBOX.to_string(),
        cmd: vec!["sleep".into(), "300".into()],
        user: "65532:65532".to_string(),
        host_config: HostConfig { network_mode: OPEN_NETWORK.to_string(), ..HostConfig::default() },
        ..ContainerSpec::default()
    };
    client.container_create("dup-blocker", &blocker).expect("docker create");
    client.container_start("dup-blocker").expect("docker start");
    let in_use = open_networks(&client.network_list().expect("docker network ls")).expect("an open network").keep.expect("one");
    loop {
        make_duplicate(&client);
        let found = open_networks(&client.network_list().expect("docker network ls")).expect("open networks");
        if found.duplicates == [in_use.clone()] {
            break;
        }
        for id in found.duplicates.iter().chain(&found.keep).filter(|id| **id != in_use) {
            client.network_remove(id).expect("docker network rm");
        }
    }

    let mut server = server(&daemon);
    let arguments = json!({"image": crate::BUSYBOX, "command": ["true"], "network": "open"});
    send_call(&mut server, 1, "run_job", arguments.clone());
    let refused = answer(&server, 1, std::time::Duration::from_secs(60), |_| false).expect("an answer");
    let out = &refused["structuredContent"];
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("error"), Some("ApiError")), "{refused}");
    assert!(out["message"].as_str().unwrap_or_default().contains("is still used by a run"), "{out}");

    client.container_remove("dup-blocker").expect("docker rm -f");
    let outcome = call(&mut server, 2, "run_job", arguments);
    assert_eq!(outcome["status"], "succeeded", "{outcome}");
    assert_eq!(named(&client), 1, "the duplicate is gone once empty");
}

/// A second network of the open network's name: the daemon's duplicate
/// check is best effort, and a create without it always succeeds.
fn make_duplicate(client: &mcp_k8s_ephemeral_job::docker::Client) {
    let unchecked = NetworkSpec { check_duplicate: false, ..open_network() };
    client.network_create(&unchecked).expect("docker network create, a second time");
}

fn named(client: &mcp_k8s_ephemeral_job::docker::Client) -> usize {
    client.network_list().expect("docker network ls").into_iter().filter(|network| network.name == OPEN_NETWORK).count()
}
