//! Removes a run's containers on a thread of its own, so that the answer
//! of a run does not wait for the daemon's removal (50–100 ms of a short
//! run), and lets the process wait for the removals still under way before
//! it exits (`finish`), so that a clean shutdown leaves nothing behind.
//! What a crash or a SIGKILL interrupts, the reaper removes at its expiry.
//!
//! Knows how many removals are under way; not what they remove.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::{log, supervise};

/// The removals under way in this process.
static PENDING: Pending = Pending { count: Mutex::new(0), changed: Condvar::new() };

struct Pending {
    count: Mutex<usize>,
    changed: Condvar,
}

impl Pending {
    fn add(&self, delta: isize) {
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        *count = count.saturating_add_signed(delta);
        self.changed.notify_all();
    }
}

/// Counts one removal until it is dropped, even if the removal panics.
struct Counted;

impl Counted {
    fn new() -> Counted {
        PENDING.add(1);
        Counted
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        PENDING.add(-1);
    }
}

/// Runs `remove` on a thread of its own; on the caller's thread when no
/// thread can be started (the removal must happen either way; hence
/// `Clone`: a failed spawn drops its copy).
pub fn spawn(run_id: &str, remove: impl FnOnce() + Clone + Send + 'static) {
    let counted = Counted::new();
    let on_thread = remove.clone();
    let spawned = supervise::spawn(supervise::Kind::ContainerRemove, move || {
        on_thread();
        drop(counted);
    });
    if let Err(error) = spawned {
        log::warn(
            "could not start a thread to remove the run's containers; removing them now",
            &[("run_id", run_id.into()), ("error", error.to_string().into())],
        );
        remove();
    }
}

/// Waits up to `timeout` for the removals under way; how many are left
/// (the reaper's at their expiry).
pub fn finish(timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    let mut count = PENDING.count.lock().unwrap_or_else(PoisonError::into_inner);
    while *count > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            log::warn(
                "container removals did not finish before the exit; the reaper removes them at their expiry",
                &[("removals", (*count).into())],
            );
            break;
        }
        count = PENDING.changed.wait_timeout(count, left).unwrap_or_else(PoisonError::into_inner).0;
    }
    *count
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn finish_waits_for_the_removals_under_way() {
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        spawn("r", move || {
            std::thread::sleep(Duration::from_millis(100));
            flag.store(true, Ordering::SeqCst);
        });
        assert_eq!(finish(Duration::from_secs(10)), 0);
        assert!(done.load(Ordering::SeqCst), "finish returned before the removal ended");
    }
}
