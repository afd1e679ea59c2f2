//! The Docker tier: the `docker` client (`client`), the Docker backend
//! through the built server (`backend`) and its network modes (`network`)
//! against a real Docker engine, the one `tests/docker/up` starts (or any
//! daemon `DOCKER_HOST` names), and its warm pools (`warm_pool`,
//! `contract_warm`), and traces into a real collector (`traces`). With no
//! daemon these tests fail with a message naming `tests/docker/up`; they
//! never pass silently. The offline tiers do not need Docker.
//!
//! Every container a test creates carries the label `mcp-k8s-test/on-docker`
//! with the test's own value, and a `Cleanup` guard removes them all, so a
//! failing test leaves nothing behind either.

// The contract table is compiled twice on purpose: cold (`contract`) and
// with warm pools (`contract_warm`), each with its own `BACKEND`.
#![allow(clippy::duplicate_mod)]

#[path = "../support/mod.rs"]
mod support;

mod backend;
mod callers;
mod client;
mod network;
mod outputs;
mod traces;
mod warm_pool;

/// The contract table (tests/contract/), on the Docker backend.
#[path = "../contract/docker.rs"]
mod contract;
/// The contract table again, against warm pools on Docker.
#[path = "../contract/docker_warm.rs"]
mod contract_warm;

use std::path::PathBuf;
use std::time::Duration;

use mcp_k8s_ephemeral_job::docker;

/// The socket `tests/docker/up` makes, used when `DOCKER_HOST` is unset (the
/// system's own Docker is never used by accident).
const TEST_SOCKET: &str = "/var/lib/mcp-k8s-test-docker/docker.sock";
/// The label that marks this tier's containers.
pub const TEST_LABEL: &str = "mcp-k8s-test/on-docker";
pub const BUSYBOX: &str = "mcp-k8s-test.local/busybox:1.35";

/// The test engine's socket: `DOCKER_HOST`'s, else `TEST_SOCKET`.
pub fn socket() -> PathBuf {
    match std::env::var("DOCKER_HOST") {
        Ok(value) if !value.is_empty() => docker::socket_path(Some(&value)).expect("DOCKER_HOST names a unix socket"),
        _ => PathBuf::from(TEST_SOCKET),
    }
}

/// A client for the test engine, or a panic saying how to start it.
pub fn client() -> docker::Client {
    let socket = socket();
    let options = docker::Options { read_timeout: Duration::from_secs(30), ..docker::Options::default() };
    match docker::Client::connect(&socket, options) {
        Ok(client) => client,
        Err(error) => panic!("no Docker engine for the on_docker tests: {error}; run tests/docker/up first (as root), or set DOCKER_HOST"),
    }
}

/// A name and label value unique to one test in this process.
pub fn unique(test: &str) -> String {
    format!("on-docker-{test}-{}", std::process::id())
}

/// Removes every container labelled with `value` when dropped.
pub struct Cleanup {
    pub client: docker::Client,
    pub value: String,
}

impl Cleanup {
    pub fn new(client: &docker::Client, test: &str) -> Cleanup {
        let cleanup = Cleanup { client: client.clone(), value: unique(test) };
        // Leftovers of an earlier run of the same process id are unlikely,
        // but they would make the counts below lie.
        cleanup.remove_all();
        cleanup
    }

    pub fn filters(&self) -> docker::Filters {
        docker::Filters { labels: vec![format!("{TEST_LABEL}={}", self.value)] }
    }

    pub fn remove_all(&self) {
        if let Ok(containers) = self.client.container_list(&self.filters()) {
            for container in containers {
                let _ = self.client.container_remove(&container.id);
            }
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// The hardened spec a backend would use: non-root, read-only root, no
/// capabilities, no new privileges, pids and memory limits, no network.
pub fn hardened(cleanup: &Cleanup, cmd: &[&str]) -> docker::objects::ContainerSpec {
    let mut labels = std::collections::BTreeMap::new();
    labels.insert(TEST_LABEL.to_string(), cleanup.value.clone());
    let mut tmpfs = std::collections::BTreeMap::new();
    tmpfs.insert("/tmp".to_string(), "rw,nosuid,nodev,size=16m".to_string());
    docker::objects::ContainerSpec {
        image: BUSYBOX.to_string(),
        cmd: cmd.iter().map(|arg| arg.to_string()).collect(),
        user: "65532:65532".to_string(),
        labels,
        attach_stdout: true,
        attach_stderr: true,
        host_config: docker::objects::HostConfig {
            readonly_rootfs: true,
            cap_drop: vec!["ALL".to_string()],
            security_opt: vec!["no-new-privileges".to_string()],
            pids_limit: Some(64),
            memory: 64 * 1024 * 1024,
            memory_swap: 64 * 1024 * 1024,
            nano_cpus: 1_000_000_000,
            tmpfs,
            network_mode: "none".to_string(),
            ..docker::objects::HostConfig::default()
        },
        ..docker::objects::ContainerSpec::default()
    }
}
