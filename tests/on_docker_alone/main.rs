//! Docker faults that would break every other user of the shared test
//! daemon: here each test starts a private dockerd of its own with
//! `tests/docker/up` (its own state directory, data and exec roots, socket,
//! pidfile and containerd namespace; `--bridge=none`, `--iptables=false`),
//! loads busybox into it from the cluster's image cache as `up` does, and
//! stops and removes it with `tests/docker/down` at the end. The shared
//! test daemon (`on_docker`) is never touched. Run after on_docker (Cargo
//! runs the test binaries one after another).
//!
//! Needs root (dockerd), the image cache (`tests/cluster/build-images`) and
//! the static runner (`tests/build-project-image`); without them the tests
//! fail saying so, never pass silently.

#[path = "../support/mod.rs"]
mod support;

mod restart;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mcp_k8s_ephemeral_job::docker;

pub const BUSYBOX: &str = "mcp-k8s-test.local/busybox:1.35";

/// A dockerd of this test process only, removed with its state on drop.
pub struct PrivateDaemon {
    dir: PathBuf,
    namespace: String,
}

impl PrivateDaemon {
    /// Starts it (a short path: the socket path's length is bounded).
    pub fn start(name: &str) -> PrivateDaemon {
        let dir = PathBuf::from(format!("/tmp/mcp-dk-{name}-{}", std::process::id()));
        let daemon = PrivateDaemon { dir, namespace: format!("mcp-k8s-alone-{name}-{}", std::process::id()) };
        daemon.script("up");
        daemon
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("docker.sock")
    }

    pub fn docker_host(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    pub fn client(&self) -> docker::Client {
        let options = docker::Options { read_timeout: Duration::from_secs(30), ..docker::Options::default() };
        docker::Client::connect(&self.socket(), options).expect("the private dockerd answers")
    }

    /// Stops the daemon as `systemctl restart docker` would (SIGTERM: it
    /// stops its containers and exits), waits for its exit, and starts it
    /// again on the same state after `down_for`.
    pub fn restart(&self, down_for: Duration) {
        let pid = std::fs::read_to_string(self.dir.join("dockerd.pid")).expect("dockerd's pidfile");
        let pid: i32 = pid.trim().parse().expect("a pid");
        // SAFETY: kill(2) on the pid of the daemon this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "kill dockerd");
        let deadline = Instant::now() + Duration::from_secs(60);
        while Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid) {
            assert!(Instant::now() < deadline, "dockerd {pid} did not exit within 60 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(down_for);
        self.script("up");
    }

    fn script(&self, which: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/docker").join(which);
        let output = Command::new(&path)
            .env("MCP_K8S_TEST_DOCKER_DIR", &self.dir)
            .env("MCP_K8S_TEST_DOCKER_NAMESPACE", &self.namespace)
            .env("MCP_K8S_TEST_DOCKER_IMAGES", "busybox")
            .output()
            .unwrap_or_else(|error| panic!("{} could not run: {error}", path.display()));
        assert!(
            output.status.success(),
            "{} failed (needs root and the image cache of tests/cluster/build-images): {}{}",
            path.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        self.script("down");
    }
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).map(|status| status.contains("State:\tZ")).unwrap_or(true)
}
