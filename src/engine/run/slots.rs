//! `MCP_K8S_MAX_CONCURRENT` as a real limit: at most that many runs hold a
//! slot at once; up to `queue_len` more wait in arrival order; beyond that a
//! run is refused at once with a clear error instead of piling up. And
//! `Gate`, a plain limit on how many threads do one short thing at once.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::cancel::CancelToken;

/// A counting gate: at most `limit` threads inside at once, the others
/// wait (without a queue or a time limit: for steps that are short and
/// bounded by their own timeouts, such as creating a run's objects).
pub struct Gate {
    inside: Mutex<usize>,
    left: Condvar,
    limit: usize,
}

/// One thread inside a `Gate`; it leaves on drop.
pub struct Inside<'gate>(&'gate Gate);

impl Gate {
    pub const fn new(limit: usize) -> Gate {
        Gate { inside: Mutex::new(0), left: Condvar::new(), limit }
    }

    pub fn enter(&self) -> Inside<'_> {
        let mut inside = self.inside.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while *inside >= self.limit {
            inside = self.left.wait(inside).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *inside += 1;
        Inside(self)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        *self.0.inside.lock().unwrap_or_else(std::sync::PoisonError::into_inner) -= 1;
        self.0.left.notify_one();
    }
}

#[derive(Clone)]
pub struct Slots {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    max_running: usize,
    max_queued: usize,
    /// One sandbox opening at a time counts the open ones and creates its
    /// own: two that both counted before either created would pass the
    /// limit together (`engine::sandboxes::open`).
    sandbox_opening: Gate,
}

struct State {
    running: usize,
    /// Tickets of waiting runs, oldest first; only the front may take a slot.
    queue: VecDeque<u64>,
    next_ticket: u64,
}

/// Held while a run uses a slot; dropping it frees the slot.
pub struct Permit {
    shared: Arc<Shared>,
}

#[derive(Debug, PartialEq)]
pub enum SlotError {
    QueueFull { running: usize, queued: usize },
    Cancelled,
}

impl std::fmt::Display for SlotError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotError::QueueFull { running, queued } => write!(
                formatter,
                "the server is at its limit: {running} runs in progress and {queued} waiting (MCP_K8S_MAX_CONCURRENT, MCP_K8S_MAX_QUEUED); retry later or use submit_job"
            ),
            SlotError::Cancelled => write!(formatter, "cancelled while waiting for a free slot"),
        }
    }
}

/// Counts for metrics and `describe` output.
#[derive(Debug, PartialEq)]
pub struct SlotCounts {
    pub running: usize,
    pub queued: usize,
}

impl Slots {
    pub fn new(max_running: usize, max_queued: usize) -> Slots {
        Slots {
            shared: Arc::new(Shared {
                state: Mutex::new(State { running: 0, queue: VecDeque::new(), next_ticket: 0 }),
                changed: Condvar::new(),
                max_running: max_running.max(1),
                max_queued,
                sandbox_opening: Gate::new(1),
            }),
        }
    }

    /// Held while a sandbox opening counts the open sandboxes and creates
    /// its own (a few API calls), so openings in this process never pass
    /// the limit together; other replicas' are settled after the create.
    pub fn sandbox_opening(&self) -> Inside<'_> {
        self.shared.sandbox_opening.enter()
    }

    /// Waits for a slot in arrival order; gives up when `cancel` fires.
    pub fn acquire(&self, cancel: &CancelToken) -> Result<Permit, SlotError> {
        let shared = &self.shared;
        let mut state = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if state.running < shared.max_running && state.queue.is_empty() {
            state.running += 1;
            return Ok(Permit { shared: shared.clone() });
        }
        if state.queue.len() >= shared.max_queued {
            return Err(SlotError::QueueFull { running: state.running, queued: state.queue.len() });
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.queue.push_back(ticket);
        loop {
            if cancel.is_cancelled() {
                state.queue.retain(|waiting| *waiting != ticket);
                shared.changed.notify_all();
                return Err(SlotError::Cancelled);
            }
            if state.running < shared.max_running && state.queue.front() == Some(&ticket) {
                state.queue.pop_front();
                state.running += 1;
                shared.changed.notify_all();
                return Ok(Permit { shared: shared.clone() });
            }
            // Wake periodically to notice cancellation, which does not
            // signal this condition variable.
            let (next, _) = shared.changed.wait_timeout(state, Duration::from_millis(100)).unwrap_or_else(|poisoned| poisoned.into_inner());
            state = next;
        }
    }

    pub fn counts(&self) -> SlotCounts {
        let state = self.shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        SlotCounts { running: state.running, queued: state.queue.len() }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        state.running = state.running.saturating_sub(1);
        self.shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_lets_in_at_most_its_limit() {
        static GATE: Gate = Gate::new(2);
        let peak = Arc::new(Mutex::new((0usize, 0usize)));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let peak = Arc::clone(&peak);
                std::thread::spawn(move || {
                    let _inside = GATE.enter();
                    {
                        let mut counts = peak.lock().unwrap();
                        counts.0 += 1;
                        counts.1 = counts.1.max(counts.0);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    peak.lock().unwrap().0 -= 1;
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let (inside, most) = *peak.lock().unwrap();
        // All eight got in (the joins returned), never more than two at once.
        assert_eq!(inside, 0);
        assert!((1..=2).contains(&most), "{most} inside at once");
    }
    use std::sync::mpsc;

    #[test]
    fn limit_queue_and_refusal() {
        let slots = Slots::new(1, 1);
        let cancel = CancelToken::new();
        let first = slots.acquire(&cancel).unwrap();
        let (sender, receiver) = mpsc::channel();
        let waiter_slots = slots.clone();
        let waiter = std::thread::spawn(move || {
            let permit = waiter_slots.acquire(&CancelToken::new());
            sender.send(()).unwrap();
            permit.is_ok()
        });
        while slots.counts().queued == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(slots.acquire(&cancel).err(), Some(SlotError::QueueFull { running: 1, queued: 1 }));
        assert!(receiver.try_recv().is_err(), "the waiter must wait while the slot is held");
        drop(first);
        assert!(waiter.join().unwrap());
        assert_eq!(slots.counts(), SlotCounts { running: 0, queued: 0 });
    }

    #[test]
    fn a_cancelled_waiter_leaves_the_queue() {
        let slots = Slots::new(1, 4);
        let _held = slots.acquire(&CancelToken::new()).unwrap();
        let cancel = CancelToken::new();
        let waiter_slots = slots.clone();
        let waiter_cancel = cancel.clone();
        let waiter = std::thread::spawn(move || waiter_slots.acquire(&waiter_cancel).err());
        while slots.counts().queued == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        cancel.cancel();
        assert_eq!(waiter.join().unwrap(), Some(SlotError::Cancelled));
        assert_eq!(slots.counts().queued, 0);
    }
}
