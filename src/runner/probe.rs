//! `runner probe-pids`: measures the process limit a pod really has, for
//! `doctor` (issue 12, finding 7). The pid limit of a Kubernetes pod is the
//! kubelet's `podPidsLimit`, set on the pod's cgroup; the container sees
//! only its own cgroup, whose `pids.max` is `max`, so reading files cannot
//! tell. Starting threads until the kernel refuses one can: threads count
//! against the pids controller like processes do.
//!
//! Prints one line of `key=value` words that `doctor` reads back (its
//! format is `sandbox::probe`); knows nothing of the API server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::sandbox::probe::PidsProbe;

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
    fn a_small_ceiling_is_reached_without_a_limit() {
        let probe = probe_pids(8);
        assert_eq!((probe.threads_started, probe.limited), (8, false));
    }
}
