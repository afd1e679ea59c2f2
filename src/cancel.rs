//! `CancelToken`: a cheap, cloneable "stop now" flag that long-running work
//! can poll or sleep on. The protocol layer cancels it when a client sends
//! `notifications/cancelled`, a session ends or the server shuts down; the
//! engine only reads it. Knows nothing of MCP.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Shared cancellation flag; clones observe the same flag.
#[derive(Clone, Debug, Default)]
pub struct CancelToken {
    shared: Arc<(Mutex<bool>, Condvar)>,
}

impl CancelToken {
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Sets the flag and wakes every thread sleeping in `wait_timeout`.
    /// Cancelling twice is harmless.
    pub fn cancel(&self) {
        let (flag, condvar) = &*self.shared;
        *flag.lock().unwrap_or_else(PoisonError::into_inner) = true;
        condvar.notify_all();
    }

    pub fn is_cancelled(&self) -> bool {
        let (flag, _) = &*self.shared;
        *flag.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sleeps up to `timeout`, returning early when cancelled. Returns true
    /// when the token is cancelled, so `if token.wait_timeout(d) { stop }`
    /// reads naturally.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let (flag, condvar) = &*self.shared;
        // A poisoned lock only means another thread panicked while holding
        // it; the bool inside is still meaningful.
        let mut cancelled = flag.lock().unwrap_or_else(PoisonError::into_inner);
        let deadline = Instant::now() + timeout;
        while !*cancelled {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            cancelled = condvar.wait_timeout(cancelled, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_token_is_not_cancelled_and_waits_the_full_time() {
        let token = CancelToken::new();
        let started = Instant::now();
        assert!(!token.wait_timeout(Duration::from_millis(30)));
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert!(!token.is_cancelled());
    }

    #[test]
    fn cancel_wakes_a_waiting_thread_early() {
        let token = CancelToken::new();
        let waiter = {
            let token = token.clone();
            std::thread::spawn(move || token.wait_timeout(Duration::from_secs(30)))
        };
        std::thread::sleep(Duration::from_millis(20));
        let started = Instant::now();
        token.cancel();
        assert!(waiter.join().unwrap());
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(token.is_cancelled());
    }

    #[test]
    fn waiting_on_a_cancelled_token_returns_at_once() {
        let token = CancelToken::new();
        token.cancel();
        token.cancel();
        assert!(token.wait_timeout(Duration::from_secs(30)));
    }
}
