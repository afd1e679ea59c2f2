//! The one helper tree of every test tier (`tests/offline`, `tests/on_cluster`,
//! `tests/on_cluster_alone`; each `main.rs` includes it with
//! `#[path = "../support/mod.rs"] mod support;`):
//! - `server`: the built binary over stdio or HTTP, and a raw HTTP client;
//! - `fake_api` and `pki`: the fake Kubernetes API server and its certificates;
//! - `cluster`: the real test cluster of `tests/cluster/up`;
//! - `docs`: the fenced blocks of README.md and docs/, and the rule of each;
//! - `faults`: MCP calls and cleanup for the real-cluster fault suites;
//! - `monitoring`: the queries of `deploy/monitoring/` and the metric names
//!   the server exports;
//! - `registry`: a container registry both the test Docker engine and the
//!   test cluster's node reach;
//! - here: a free loopback port, temporary directories, kubeconfig
//!   fixtures with placeholders, and fast client options for the kube
//!   client tests.
//!
//! It holds no tests; the tiers decide what runs where.

// Each tier uses a different part of this tree.
#![allow(dead_code)]

pub mod cluster;
pub mod docs;
pub mod fake_api;
pub mod faults;
pub mod monitoring;
pub mod pki;
pub mod registry;
pub mod server;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use base64::Engine;

/// A directory removed when dropped.
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let unique = COUNTER.fetch_add(1, Ordering::SeqCst);
        // The time as well: a tier that compiles this tree twice (a module
        // of its own and main.rs's) has two counters, and two tests with
        // one label got one folder, each wiping the other's.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let path = std::env::temp_dir().join(format!("mcp-kube-{label}-{}-{unique}-{nanos}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    /// Writes `text` to `name` (directories created) and returns the path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create parent dir");
        }
        std::fs::write(&path, text).expect("write temp file");
        path
    }

    /// Writes an executable script.
    pub fn write_script(&self, name: &str, text: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.write(name, text);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod script");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A loopback port free a moment ago, below the kernel's ephemeral range
/// (32768 and up by default), where every `bind(:0)` of the other tests
/// running at once takes its ports: one picked there could be taken
/// between this check and the bind of the process it was picked for.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 20_000 + (std::process::id() % 5_000) as u16;
    loop {
        let port = start + NEXT.fetch_add(1, Ordering::Relaxed) % 10_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kubeconfig").join(name)
}

/// A fixture's text with `__KEY__` placeholders replaced.
pub fn render_fixture(name: &str, replacements: &[(&str, &str)]) -> String {
    let path = fixture_path(name);
    let mut text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    for (key, value) in replacements {
        text = text.replace(&format!("__{key}__"), value);
    }
    assert!(!text.contains("__") || text.contains("__keep__"), "unreplaced placeholder in {name}: {text}");
    text
}

/// A file the server takes for a static runner binary of this machine's
/// architecture (an x86-64 or aarch64 ELF header without program headers,
/// so no program interpreter), for Docker sites whose daemon is never
/// reached: a Docker site's runner is checked before its daemon is asked,
/// and the test build is dynamically linked. It runs nothing.
pub fn static_elf_stub(dir: &TempDir) -> PathBuf {
    let mut header = vec![0u8; 64];
    header[..4].copy_from_slice(b"\x7fELF");
    (header[4], header[5], header[6]) = (2, 1, 1);
    let machine: u16 = if cfg!(target_arch = "aarch64") { 183 } else { 62 };
    header[0x12..0x14].copy_from_slice(&machine.to_le_bytes());
    header[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
    header[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
    let path = dir.path.join("static-runner");
    std::fs::write(&path, header).unwrap();
    path
}

pub fn base64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// Short timeouts and backoff so fault tests run in a few seconds.
pub fn fast_options() -> mcp_k8s_ephemeral_job::kube::Options {
    mcp_k8s_ephemeral_job::kube::Options {
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_secs(2),
        max_retries: 4,
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        ..mcp_k8s_ephemeral_job::kube::Options::default()
    }
}

/// A client for `fake` through the plain token fixture (namespace `live-ns`).
pub fn connect(fake: &fake_api::FakeApi) -> (mcp_k8s_ephemeral_job::kube::Client, TempDir) {
    let temp = TempDir::new("client");
    let ca_data = base64(&fake.pki.ca_pem);
    let text = render_fixture("live/token.yaml", &[("SERVER", &fake.url), ("CA_DATA", &ca_data)]);
    let path = temp.write("kubeconfig", &text);
    let source = mcp_k8s_ephemeral_job::kube::Source::KubeconfigFile { path, context: None };
    let client = mcp_k8s_ephemeral_job::kube::Client::with_options(&source, fast_options()).expect("client for the fake API");
    (client, temp)
}
