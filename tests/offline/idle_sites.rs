//! What a site nobody uses costs, through the binary against the fake API
//! server: no thread of its own (every site's reaper turns on a few shared
//! threads) and no API connection kept open once the reaper's turn on it
//! is over. The memory this saves is measured in `bench/memory.py`; here
//! the mechanism is counted (the server's threads in /proc, the fake's
//! open connections).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::fake_api::FakeApi;
use crate::support::server::HttpServer;
use crate::support::{TempDir, render_fixture};

/// More sites than the server has threads of its own when idle.
const SITES: usize = 24;

#[test]
fn an_idle_site_holds_no_thread_and_no_connection() {
    let (fake, temp) = (FakeApi::start(), TempDir::new("idle-sites"));
    let ca_data = crate::support::base64(&fake.pki.ca_pem);
    let kubeconfig = temp.write("kubeconfig", &render_fixture("live/token.yaml", &[("SERVER", &fake.url), ("CA_DATA", &ca_data)]));
    let sites: Vec<Value> = (0..SITES)
        .map(|index| json!({"name": format!("s{index}"), "backend": "kubernetes", "kubeconfig": kubeconfig, "namespace": "live-ns"}))
        .collect();
    let path = temp.write("sites.json", &Value::Array(sites).to_string()).display().to_string();
    // Not lazy: the start asks every site, so each has called the API.
    let server = HttpServer::start(&[("MCP_K8S_SITES", &path), ("MCP_K8S_LAZY_BACKEND", "0")]);
    let threads = || status_field(server.child.id(), "Threads");
    // The reaper's first turn on every site lists its Jobs.
    let reaped = || fake.count("GET /apis/batch/v1/namespaces/live-ns/jobs") >= 2 * SITES;
    let idle = || reaped() && threads() < SITES && fake.open_connections() == 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !idle() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(reaped(), "the reaper reached every site: {} Job lists", fake.count("GET /apis/batch/v1/namespaces/live-ns/jobs"));
    assert!(threads() < SITES, "{} threads for {SITES} idle sites", threads());
    assert_eq!(fake.open_connections(), 0, "connections kept open by {SITES} idle sites");
}

fn status_field(pid: u32, field: &str) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|line| line.starts_with(&format!("{field}:"))).unwrap_or_default();
    line.split_whitespace().nth(1).and_then(|value| value.parse().ok()).unwrap_or(0)
}
