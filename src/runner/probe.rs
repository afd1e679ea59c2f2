//! `runner probe-pids`: measures the process limit a pod really has, for
//! `doctor` (issue 12, finding 7). The pid limit of a Kubernetes pod is the
//! kubelet's `podPidsLimit`, set on the pod's cgroup; the container sees
//! only its own cgroup, whose `pids.max` is `max`, so reading files cannot
//! tell. Starting threads until the kernel refuses one can: threads count
//! against the pids controller like processes do.
//!
//! Prints one line of `key=value` words that `doctor` reads back
//! (`probe_line`, `parse_probe_line`); knows nothing of the API server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// What one probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PidsProbe {
    /// Threads started before the kernel refused one, or `ceiling`.
    pub threads_started: u64,
    /// True when a thread was refused (EAGAIN) below `ceiling`.
    pub limited: bool,
    /// The container cgroup's own `pids.max`, as written there (`max`, a
    /// number, or `unknown` when unreadable).
    pub own_pids_max: String,
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

/// The probe as the one line `runner probe-pids` prints.
pub fn probe_line(probe: &PidsProbe) -> String {
    format!("threads_started={} limited={} own_pids_max={}", probe.threads_started, probe.limited, probe.own_pids_max)
}

/// The inverse of `probe_line`; `None` for anything else.
pub fn parse_probe_line(line: &str) -> Option<PidsProbe> {
    let mut threads_started = None;
    let mut limited = None;
    let mut own_pids_max = None;
    for word in line.split_whitespace() {
        let (key, value) = word.split_once('=')?;
        match key {
            "threads_started" => threads_started = value.parse().ok(),
            "limited" => limited = value.parse().ok(),
            "own_pids_max" => own_pids_max = Some(value.to_string()),
            _ => {}
        }
    }
    Some(PidsProbe { threads_started: threads_started?, limited: limited?, own_pids_max: own_pids_max? })
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
    fn the_probe_line_round_trips() {
        let probe = PidsProbe { threads_started: 1019, limited: true, own_pids_max: "max".into() };
        assert_eq!(probe_line(&probe), "threads_started=1019 limited=true own_pids_max=max");
        assert_eq!(parse_probe_line(&probe_line(&probe)), Some(probe));
        assert_eq!(parse_probe_line("mcp-k8s-ephemeral-job 0.1.0"), None);
        assert_eq!(parse_probe_line("threads_started=3"), None);
    }

    #[test]
    fn a_small_ceiling_is_reached_without_a_limit() {
        let probe = probe_pids(8);
        assert_eq!((probe.threads_started, probe.limited), (8, false));
    }
}
