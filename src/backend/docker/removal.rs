//! Removes a run's containers on a thread of its own, so that the answer
//! of a run does not wait for the daemon's removal (50–100 ms of a short
//! run), and lets the process wait for the removals still under way before
//! it exits (`finish`), so that a clean shutdown leaves nothing behind.
//! What a crash or a SIGKILL interrupts, the reaper removes at its expiry.
//! A removal the daemon refuses or does not answer (a busy daemon can take
//! longer than a call's timeout to kill and unmount a container that is
//! exiting) is tried again a few times (`RETRIES`) before it is left to
//! the reaper: a container left until its expiry holds its memory and its
//! slot on the host for minutes.
//!
//! Knows how many removals are under way and when to try again; not what
//! they remove.

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

/// The pauses before each new try of a removal that failed: about half a
/// minute in all, past a call's timeout, before the reaper's turn.
const RETRIES: [Duration; 4] = [Duration::from_secs(1), Duration::from_secs(3), Duration::from_secs(9), Duration::from_secs(20)];

/// Runs `remove` on a thread of its own, again after each pause of
/// `RETRIES` while it fails; on the caller's thread, once, when no thread
/// can be started (the removal must happen either way; hence `Clone`: a
/// failed spawn drops its copy).
pub fn spawn(run_id: &str, remove: impl Fn() -> Result<(), String> + Clone + Send + 'static) {
    let counted = Counted::new();
    let on_thread = remove.clone();
    let owned = run_id.to_string();
    let spawned = supervise::spawn(supervise::Kind::ContainerRemove, move || {
        with_retries(&owned, &RETRIES, on_thread);
        drop(counted);
    });
    if let Err(error) = spawned {
        log::warn(
            "could not start a thread to remove the run's containers; removing them now",
            &[("run_id", run_id.into()), ("error", error.to_string().into())],
        );
        if let Err(error) = remove() {
            log::warn("the run's containers were not removed; the reaper will", &[("run_id", run_id.into()), ("error", error.into())]);
        }
    }
}

/// Calls `remove` until it succeeds, pausing `pauses` in turn between
/// tries; whether it succeeded. Each failure is logged.
fn with_retries(run_id: &str, pauses: &[Duration], remove: impl Fn() -> Result<(), String>) -> bool {
    let mut pauses = pauses.iter();
    loop {
        let Err(error) = remove() else { return true };
        let Some(pause) = pauses.next() else {
            log::warn("the run's containers were not removed; the reaper will", &[("run_id", run_id.into()), ("error", error.into())]);
            return false;
        };
        log::warn(
            "the run's containers were not removed; trying again",
            &[("run_id", run_id.into()), ("error", error.into()), ("retry_in_ms", (pause.as_millis() as u64).into())],
        );
        std::thread::sleep(*pause);
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
            Ok(())
        });
        assert_eq!(finish(Duration::from_secs(10)), 0);
        assert!(done.load(Ordering::SeqCst), "finish returned before the removal ended");
    }

    #[test]
    fn a_failed_removal_is_tried_again_until_it_succeeds_or_the_pauses_run_out() {
        let pauses = [Duration::ZERO; 3];
        // How many tries fail first, the result, and how many tries were made.
        for (failures, removed, tries) in [(0, true, 1), (1, true, 2), (3, true, 4), (4, false, 4), (9, false, 4)] {
            let made = std::cell::Cell::new(0);
            let succeeded = with_retries("r", &pauses, || {
                made.set(made.get() + 1);
                if made.get() > failures { Ok(()) } else { Err("the daemon did not answer".to_string()) }
            });
            assert_eq!((succeeded, made.get()), (removed, tries), "{failures} failures first");
        }
    }
}
