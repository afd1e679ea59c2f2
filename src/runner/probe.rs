//! `runner probe-pids`: measures the process limit a pod really has, for
//! `doctor`; `runner probe-connect`: tries the one
//! connection every network mode refuses (see `probe_connect`); `runner
//! probe-reach`: tries the addresses `open` must not reach (`probe_reach`). The pid limit of a Kubernetes pod is the
//! kubelet's `podPidsLimit`, set on the pod's cgroup; the container sees
//! only its own cgroup, whose `pids.max` is `max`, so reading files cannot
//! tell. Starting threads until the kernel refuses one can: threads count
//! against the pids controller like processes do.
//!
//! Each prints one line of `key=value` words that `doctor` reads back (its
//! format is `sandbox::probe`); knows nothing of the API server beyond the
//! address the kubelet gives every pod.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::sandbox::probe::{ConnectProbe, FENCE_FAILURE, PidsProbe, ReachProbe};

/// How long a connection may take before the probe calls it refused: a
/// policy that drops (rather than rejects) shows as a timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long after the first try the second one comes: time enough for a
/// CNI that fences a pod only once it has seen it (kube-router: ~0.6 s
/// after the container started, measured on the test cluster).
const SETTLE: Duration = Duration::from_secs(2);

/// Opens (and closes) a TCP connection to the API server's Service, the
/// address the kubelet puts in every pod's environment
/// (`KUBERNETES_SERVICE_HOST`/`_PORT`): deploy/'s policies refuse it in
/// every network mode, so a connection means they are not enforced. Tries
/// at once and again `SETTLE` later, so doctor can tell "not enforced"
/// from "enforced only after the pod started".
pub fn probe_connect() -> ConnectProbe {
    let Some(address) = api_service_address() else {
        return ConnectProbe { target: "none".into(), connected_at_start: false, connected: false, error: "NoServiceAddress".into() };
    };
    let connected_at_start = TcpStream::connect_timeout(&address, CONNECT_TIMEOUT).is_ok();
    std::thread::sleep(SETTLE);
    let (connected, error) = match TcpStream::connect_timeout(&address, CONNECT_TIMEOUT) {
        Ok(_) => (true, "none".to_string()),
        Err(error) => (false, format!("{:?}", error.kind())),
    };
    ConnectProbe { target: address.to_string(), connected_at_start, connected, error }
}

/// Tries a TCP connection to each of `targets`, all at once, after
/// `SETTLE` (the pod is then fenced on plugins that fence late): what the
/// `open` policy lets through once in force.
pub fn probe_reach(targets: &[SocketAddr]) -> Vec<ReachProbe> {
    std::thread::sleep(SETTLE);
    let tries: Vec<_> = targets
        .iter()
        .map(|target| {
            let target = *target;
            std::thread::spawn(move || TcpStream::connect_timeout(&target, CONNECT_TIMEOUT).map(|_| ()))
        })
        .collect();
    targets
        .iter()
        .zip(tries)
        .map(|(target, tried)| {
            let outcome = tried.join().unwrap_or_else(|_| Err(std::io::Error::other("the try panicked")));
            ReachProbe {
                target: target.to_string(),
                reached: outcome.is_ok(),
                error: outcome.err().map_or_else(|| "none".to_string(), |error| format!("{:?}", error.kind())),
            }
        })
        .collect()
}

/// The API server's Service, from the environment the kubelet gives every
/// pod; `None` without it.
fn api_service_address() -> Option<SocketAddr> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?.parse::<IpAddr>().ok()?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").ok()?.parse::<u16>().ok()?;
    Some(SocketAddr::new(host, port))
}

/// How long one try of the fence may take: a policy that drops rather
/// than rejects shows as this time-out, and counts as in force.
const FENCE_TRY: Duration = Duration::from_millis(300);
/// The pause between two tries that connected.
const FENCE_PAUSE: Duration = Duration::from_millis(50);

/// Waits, up to `bound`, until a connection to the API server's Service is
/// refused: every network mode refuses it (deploy/), so from then on the
/// pod's policy holds. For network plugins that fence a pod only after its
/// containers started (kube-router, ~0.6 s on the test cluster); `runner
/// init` runs it before it says ready, so the command never starts
/// unfenced.
pub fn await_fence(bound: Duration) -> Result<(), String> {
    let Some(address) = api_service_address() else {
        return Err(format!(
            "{FENCE_FAILURE} (cannot tell: the pod has no KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT to try); set MCP_K8S_AWAIT_NETWORK_POLICY=0 on this cluster"
        ));
    };
    let deadline = std::time::Instant::now() + bound;
    loop {
        if TcpStream::connect_timeout(&address, FENCE_TRY).is_err() {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "{FENCE_FAILURE} within {} s: the pod could still connect to the API server's Service ({address}), which every network mode refuses; check that the cluster's network plugin enforces NetworkPolicy (`doctor` warns when it does not) and that deploy/'s policies are applied (the `open` policy's `except` must hold the API server's address), or set MCP_K8S_AWAIT_NETWORK_POLICY=0 (the mode is then not fenced in its first moments)",
                bound.as_secs()
            ));
        }
        std::thread::sleep(FENCE_PAUSE);
    }
}

/// How long the fence wait lasts: `bound`, or until `until_ms` (ms since
/// the Unix epoch) when that is later.
pub fn fence_bound(bound: Duration, until_ms: Option<u64>, now_ms: u64) -> Duration {
    let until = until_ms.map_or(Duration::ZERO, |until_ms| Duration::from_millis(until_ms.saturating_sub(now_ms)));
    bound.max(until)
}

/// Starts up to `ceiling` idle threads, counts them and lets them go.
pub fn probe_pids(ceiling: u64) -> PidsProbe {
    let release = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let mut limited = false;
    while (threads.len() as u64) < ceiling {
        let release = release.clone();
        // A small stack: the probe measures pids, not memory.
        let spawned = std::thread::Builder::new().stack_size(64 * 1024).spawn(move || {
            while !release.load(Ordering::Relaxed) {
                std::thread::park_timeout(Duration::from_millis(200));
            }
        });
        match spawned {
            Ok(handle) => threads.push(handle),
            Err(_) => {
                limited = true;
                break;
            }
        }
    }
    let threads_started = threads.len() as u64;
    release.store(true, Ordering::Relaxed);
    for handle in threads {
        handle.thread().unpark();
        let _ = handle.join();
    }
    PidsProbe { threads_started, limited, own_pids_max: own_pids_max() }
}

fn own_pids_max() -> String {
    ["/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .map(|text| text.trim().to_string())
        .unwrap_or_else(|| "unknown".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_wait_lasts_its_bound_or_until_its_deadline_whichever_is_later() {
        let ten = Duration::from_secs(10);
        for (until_ms, now_ms, expected) in
            [(None, 1_000, ten), (Some(5_000), 1_000, ten), (Some(31_000), 1_000, Duration::from_secs(30)), (Some(500), 1_000, ten)]
        {
            assert_eq!(fence_bound(ten, until_ms, now_ms), expected, "{until_ms:?} at {now_ms}");
        }
    }

    #[test]
    fn a_small_ceiling_is_reached_without_a_limit() {
        let probe = probe_pids(8);
        assert_eq!((probe.threads_started, probe.limited), (8, false));
    }
}
