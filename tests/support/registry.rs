//! A container registry of the test's own (the CNCF Distribution registry
//! that `tests/cluster/build-registry` builds), at one address both sides
//! of the test setup reach: the test Docker engine runs in a network
//! namespace of its own that has only a loopback interface, and the test
//! cluster's containerd runs in the host's. So two registry processes serve
//! one storage directory, as registries behind a load balancer share
//! theirs: one in the engine's namespace, one in the host's, both on
//! 127.0.0.1 and the same port. An image pushed by the engine is then
//! pulled by the node under the same name, over plain HTTP (both treat a
//! loopback registry as one without TLS). Knows nothing of what is pushed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::{TempDir, cluster};

/// How long a registry process may take to listen.
const LISTEN_WITHIN: Duration = Duration::from_secs(30);
/// How often both are started again on another port when one of them found
/// its port taken.
const START_ATTEMPTS: usize = 5;

/// The two processes, killed when dropped; the storage goes with them.
pub struct Registry {
    /// `127.0.0.1:<port>`: the name images are pushed and pulled under.
    pub address: String,
    children: Vec<Child>,
    _dir: TempDir,
}

impl Registry {
    pub fn start() -> Registry {
        let binary = cluster::cache_dir().join("bin/registry");
        assert!(binary.exists(), "{} is missing: run `tests/cluster/build-registry`", binary.display());
        let engine_netns = engine_netns();
        assert!(engine_netns.exists(), "{} is missing: run `tests/docker/up`", engine_netns.display());
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            match Registry::try_start(&binary, &engine_netns) {
                Ok(registry) => return registry,
                Err(log) if log.contains("address already in use") => last = log,
                Err(log) => panic!("the test registry did not start: {log}"),
            }
        }
        panic!("the test registry's port was taken {START_ATTEMPTS} times: {last}");
    }

    fn try_start(binary: &Path, engine_netns: &Path) -> Result<Registry, String> {
        let dir = TempDir::new("registry");
        let address = format!("127.0.0.1:{}", super::free_port());
        let config = dir.path.join("config.yml");
        std::fs::write(&config, config_yaml(&dir.path.join("storage"), &address)).expect("write the registry's config");
        let mut registry = Registry { address, children: Vec::new(), _dir: dir };
        let mut host = Command::new(binary);
        host.arg("serve").arg(&config);
        registry.children.push(listening(host)?);
        let mut in_engine_netns = Command::new("nsenter");
        in_engine_netns.arg(format!("--net={}", engine_netns.display())).arg(binary).arg("serve").arg(&config);
        registry.children.push(listening(in_engine_netns)?);
        Ok(registry)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The network namespace `tests/docker/up` runs the test engine in: named
/// after its state directory (`NETNS` in tests/docker/lib.sh).
fn engine_netns() -> PathBuf {
    let state = std::env::var("MCP_K8S_TEST_DOCKER_DIR").ok().filter(|dir| !dir.is_empty());
    let state = PathBuf::from(state.unwrap_or_else(|| "/var/lib/mcp-k8s-test-docker".into()));
    let name = state.file_name().expect("a state directory with a name").to_owned();
    Path::new("/run/netns").join(name)
}

/// One storage directory, no cache (each process would keep its own), and
/// one upload secret, so either may serve an upload the other began.
fn config_yaml(storage: &Path, address: &str) -> String {
    format!(
        "version: 0.1\nlog:\n  level: info\n  formatter: text\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {address}\n  secret: mcp-k8s-test-registry\n",
        storage.display()
    )
}

/// Starts `command` and waits for the registry's "listening on" line; the
/// log so far when it exits or does not listen in time.
fn listening(mut command: Command) -> Result<Child, String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("{:?}: {error}", command.get_program()))?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let (lines, received) = mpsc::channel();
    // Drains the log for the process's whole life, so it never blocks on a
    // full pipe; sending fails once nobody waits, and reading goes on.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let deadline = Instant::now() + LISTEN_WITHIN;
    let mut log = Vec::new();
    loop {
        match received.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("listening on") => return Ok(child),
            Ok(line) => log.push(line),
            Err(RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{:?} did not listen within {LISTEN_WITHIN:?}: {}", command.get_program(), log.join("\n")));
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = child.wait().map(|status| status.to_string()).unwrap_or_default();
                return Err(format!("{:?} exited ({status}): {}", command.get_program(), log.join("\n")));
            }
        }
    }
}
