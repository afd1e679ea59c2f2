//! When this process could not reach the daemon: each outage runs from the
//! last answer before the first failed connect to the first answer after
//! it (wide on purpose: a daemon that shuts down stops answering first and
//! stops its containers after, possibly between two of our calls). The
//! backend asks whether a container ended inside one (`around`), which is
//! how a daemon restart mid-run is told apart from a plain SIGTERM.
//!
//! Knows times and answers; not what the calls were.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

/// The outages remembered; older ones are forgotten (a run lasts hours at
/// most, and a daemon that goes away that often has other problems).
const KEPT: usize = 16;

/// One stretch of time in which the daemon did not answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outage {
    /// The last answer before it.
    pub from: SystemTime,
    /// The first answer after it.
    pub to: SystemTime,
}

/// The outages this process saw, shared by a client's clones.
#[derive(Debug, Default)]
pub struct Outages {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last_answer: Option<SystemTime>,
    /// An outage under way: since the last answer before it.
    open: Option<SystemTime>,
    closed: VecDeque<Outage>,
}

impl Outages {
    /// The daemon answered a call at `now`.
    pub fn answered(&self, now: SystemTime) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(from) = state.open.take() {
            state.closed.push_back(Outage { from, to: now });
            if state.closed.len() > KEPT {
                state.closed.pop_front();
            }
        }
        state.last_answer = Some(now);
    }

    /// A connect to the daemon failed at `now`.
    pub fn unreachable(&self, now: SystemTime) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.open.is_none() {
            state.open = Some(state.last_answer.unwrap_or(now));
        }
    }

    /// The ended outage that `at` lies in, if any.
    pub fn around(&self, at: SystemTime) -> Option<Outage> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.closed.iter().rev().find(|outage| outage.from <= at && at <= outage.to).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn an_outage_runs_from_the_last_answer_before_to_the_first_after() {
        let outages = Outages::default();
        outages.answered(at(10));
        outages.unreachable(at(11));
        outages.unreachable(at(12));
        assert_eq!(outages.around(at(11)), None, "not over yet");
        outages.answered(at(15));
        assert_eq!(outages.around(at(10)), Some(Outage { from: at(10), to: at(15) }));
        assert_eq!(outages.around(at(14)), Some(Outage { from: at(10), to: at(15) }));
        assert_eq!(outages.around(at(9)), None);
        assert_eq!(outages.around(at(16)), None);
        outages.answered(at(20));
        assert_eq!(outages.around(at(18)), None, "answers without a failure are no outage");
    }
}
