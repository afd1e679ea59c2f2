//! Counting limits shared by every connection: a semaphore of bytes for
//! request bodies being held (`MCP_K8S_BODY_BUDGET_BYTES`), so N
//! concurrent large messages cannot multiply memory, and a plain counter
//! of connections. Knows nothing of HTTP; `conn` and `mod` decide what a
//! refusal looks like.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Bytes that bodies may hold at once over all connections.
pub struct Budget {
    available: Mutex<usize>,
    freed: Condvar,
    total: usize,
}

/// Bytes taken from a `Budget`; given back on drop.
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Budget {
    pub fn new(total: usize) -> Arc<Budget> {
        Arc::new(Budget { available: Mutex::new(total), freed: Condvar::new(), total })
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// Takes `bytes`, waiting at most `wait` for others to give some back;
    /// `None` when they did not (or when `bytes` exceeds the whole budget).
    pub fn reserve(self: &Arc<Self>, bytes: usize, wait: Duration) -> Option<Reservation> {
        let mut reservation = Reservation { budget: Arc::clone(self), bytes: 0 };
        reservation.grow(bytes, wait).then_some(reservation)
    }

    fn take(&self, bytes: usize, wait: Duration) -> bool {
        if bytes > self.total {
            return false;
        }
        let deadline = Instant::now() + wait;
        let mut available = self.available.lock().unwrap_or_else(PoisonError::into_inner);
        while *available < bytes {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            available = self.freed.wait_timeout(available, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        *available -= bytes;
        true
    }

    fn give_back(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let mut available = self.available.lock().unwrap_or_else(PoisonError::into_inner);
        *available = (*available + bytes).min(self.total);
        self.freed.notify_all();
    }
}

impl Reservation {
    /// Takes `more` bytes on top of what is held (a chunked body growing).
    pub fn grow(&mut self, more: usize, wait: Duration) -> bool {
        if !self.budget.take(more, wait) {
            return false;
        }
        self.bytes += more;
        true
    }
}

impl Reservation {
    /// Grows what is held to `target` bytes (to the whole budget at most,
    /// so one message is always servable); nothing when it holds that much.
    pub fn grow_to(&mut self, target: usize, wait: Duration) -> bool {
        let target = target.min(self.budget.total);
        target <= self.bytes || self.grow(target - self.bytes, wait)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// How many of something are in use, with a guard that counts down.
#[derive(Default)]
pub struct Counter(AtomicUsize);

/// One unit of a `Counter`; released on drop.
pub struct CounterGuard(Arc<Counter>);

impl Counter {
    /// Counts one more if fewer than `limit` are in use.
    pub fn try_take(self: &Arc<Self>, limit: usize) -> Option<CounterGuard> {
        self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| (used < limit).then_some(used + 1)).ok()?;
        Some(CounterGuard(Arc::clone(self)))
    }

    pub fn in_use(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for CounterGuard {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_the_budget_and_give_it_back() {
        let budget = Budget::new(100);
        let first = budget.reserve(60, Duration::ZERO).unwrap();
        assert!(budget.reserve(60, Duration::from_millis(10)).is_none());
        let mut second = budget.reserve(40, Duration::ZERO).unwrap();
        assert!(!second.grow(1, Duration::ZERO));
        drop(first);
        assert!(second.grow(60, Duration::ZERO));
        assert!(budget.reserve(101, Duration::from_secs(60)).is_none(), "more than the whole budget never waits");
        drop(second);
        assert!(budget.reserve(100, Duration::ZERO).is_some());
    }

    #[test]
    fn a_waiting_reservation_gets_what_is_given_back() {
        let budget = Budget::new(10);
        let held = budget.reserve(10, Duration::ZERO).unwrap();
        let waiter = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || budget.reserve(10, Duration::from_secs(10)).is_some())
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        assert!(waiter.join().unwrap());
    }

    #[test]
    fn growing_to_a_target_stops_at_the_whole_budget() {
        let budget = Budget::new(100);
        let mut held = budget.reserve(30, Duration::ZERO).unwrap();
        assert!(held.grow_to(20, Duration::ZERO), "already holds more");
        assert!(held.grow_to(1_000, Duration::ZERO), "the whole budget at most");
        assert!(budget.reserve(1, Duration::ZERO).is_none());
        drop(held);
        assert!(budget.reserve(100, Duration::ZERO).is_some());
    }

    #[test]
    fn counter() {
        let counter = Arc::new(Counter::default());
        let one = counter.try_take(2).unwrap();
        let _two = counter.try_take(2).unwrap();
        assert!(counter.try_take(2).is_none());
        drop(one);
        assert_eq!(counter.in_use(), 1);
        assert!(counter.try_take(2).is_some());
    }
}
