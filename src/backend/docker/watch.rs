//! Follows a run's container for the engine: one thread per run inspects
//! it every `POLL` and sends what changed as neutral `Watched` events. A
//! daemon that does not answer (restarting, overloaded) is retried here for
//! as long as the run lasts (the engine's deadlines bound it), and the
//! first answer after the trouble is a complete look (`Listed`), as after a
//! Kubernetes watch's reconnect.
//!
//! Polling rather than `/events`: one inspect over a local socket costs a
//! millisecond, it cannot miss a state (a stream can, across a daemon
//! restart), and it sees a `docker rm -f` the same way as an exit. The
//! poll interval (`POLL`, `SETTLED_POLL` once nothing changes) is the
//! latency it adds to an end the log does not report.
//!
//! Knows the client and `classify` (through `super::sighting`); decides
//! nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::docker;
use crate::engine::port::{Abort, Sighting, Watch, Watched};
use crate::{log, supervise};

/// How often the container is inspected while it is changing (its start,
/// a short command's end)...
pub const POLL: Duration = Duration::from_millis(50);
/// ...and once it has stayed the same for `SETTLED_AFTER` looks: a long
/// command's end comes with its result on the log, which needs no poll,
/// and ten runs at 20 inspects a second each would cost the daemon CPU.
const SETTLED_POLL: Duration = Duration::from_millis(250);
const SETTLED_AFTER: u32 = 40;
/// The longest wait between two tries while the daemon does not answer.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Starts the watch thread for the container `name`.
pub fn start(client: docker::Client, name: String) -> Watch {
    let aborted = Arc::new(AtomicBool::new(false));
    let (sender, events) = mpsc::channel();
    let wake = sender.clone();
    let thread_aborted = Arc::clone(&aborted);
    // However the thread ends (a panic, or it never started), the run is
    // told, and watches again.
    let ended = EndedOnDrop(sender);
    let spawned = supervise::spawn(supervise::Kind::ContainerWatch, move || feed(&client, &name, &ended.0, &thread_aborted));
    if let Err(error) = &spawned {
        log::error("could not start the container watch thread", &[("error", error.to_string().into())]);
    }
    Watch { events, abort: Abort::new(move || aborted.store(true, Ordering::Relaxed)), wake }
}

/// Sends `Watched::Ended` when the watch thread lets go of its sender.
struct EndedOnDrop(mpsc::Sender<Watched>);

impl Drop for EndedOnDrop {
    fn drop(&mut self) {
        let _ = self.0.send(Watched::Ended);
    }
}

/// What the poller does with one answer (pure, for tests).
#[derive(Debug, Default)]
struct Poller {
    /// The last sighting sent; `None` before the first or when absent.
    last: Option<Sighting>,
    /// A complete look is due (the first one, or the first after trouble).
    list_due: bool,
    /// The container was seen gone; nothing more is sent.
    gone: bool,
    failures: u32,
    /// Answers in a row that changed nothing.
    unchanged: u32,
}

impl Poller {
    fn new() -> Poller {
        Poller { list_due: true, ..Poller::default() }
    }

    /// The events for one inspect answer: the container, or `None` when
    /// it does not exist.
    fn on_answer(&mut self, seen: Option<Sighting>) -> Vec<Watched> {
        self.failures = 0;
        if self.gone {
            return Vec::new();
        }
        let events = match (self.list_due, seen, self.last.take()) {
            (true, seen, _) => {
                self.last = seen.clone();
                vec![Watched::Listed(seen)]
            }
            (false, Some(seen), last) => {
                let changed = last.as_ref() != Some(&seen);
                self.last = Some(seen.clone());
                if changed {
                    self.unchanged = 0;
                    vec![Watched::Seen(seen)]
                } else {
                    self.unchanged = self.unchanged.saturating_add(1);
                    Vec::new()
                }
            }
            (false, None, Some(last)) => {
                self.gone = true;
                vec![Watched::Gone(last)]
            }
            (false, None, None) => Vec::new(),
        };
        self.list_due = false;
        events
    }

    /// The wait before the next look after an answer.
    fn interval(&self) -> Duration {
        if self.unchanged < SETTLED_AFTER { POLL } else { SETTLED_POLL }
    }

    /// The event for a failed inspect, and how long to wait before the next.
    fn on_trouble(&mut self, message: String) -> (Watched, Duration) {
        self.list_due = true;
        self.failures = self.failures.saturating_add(1);
        let delay = Duration::from_millis(100).saturating_mul(1 << self.failures.min(5)).min(MAX_BACKOFF);
        (Watched::Trouble(message), delay)
    }
}

fn feed(client: &docker::Client, name: &str, sender: &mpsc::Sender<Watched>, aborted: &AtomicBool) {
    let mut poller = Poller::new();
    while !aborted.load(Ordering::Relaxed) {
        let (events, delay) = match client.container_inspect(name) {
            Ok(inspect) => {
                let events = poller.on_answer(Some(super::sighting(client, &inspect)));
                (events, poller.interval())
            }
            Err(error) if error.is_not_found() => (poller.on_answer(None), POLL),
            Err(error) => {
                let (event, delay) = poller.on_trouble(error.to_string());
                (vec![event], delay)
            }
        };
        for event in events {
            if sender.send(event).is_err() {
                return;
            }
        }
        std::thread::sleep(delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::port::Times;
    use crate::engine::port::facts::{Finished, SandboxState, View};

    fn sighting(state: SandboxState) -> Sighting {
        Sighting {
            sandbox: "c".into(),
            view: View { state, ended: None, if_gone: Finished { deleted: true, ..Finished::default() } },
            times: Times::default(),
        }
    }

    #[test]
    fn a_list_first_then_changes_only_then_gone_once() {
        let mut poller = Poller::new();
        let running = sighting(SandboxState::Running);
        assert_eq!(poller.on_answer(Some(running.clone())), [Watched::Listed(Some(running.clone()))]);
        assert!(poller.on_answer(Some(running.clone())).is_empty(), "no change, nothing sent");
        assert_eq!(poller.interval(), POLL);
        for _ in 0..SETTLED_AFTER {
            poller.on_answer(Some(running.clone()));
        }
        assert_eq!(poller.interval(), SETTLED_POLL, "a container that stays the same is looked at less often");
        let finished = sighting(SandboxState::Finished { ran: true });
        assert_eq!(poller.on_answer(Some(finished.clone())), [Watched::Seen(finished.clone())]);
        assert_eq!(poller.interval(), POLL, "a change brings the fast polls back");
        assert_eq!(poller.on_answer(None), [Watched::Gone(finished)]);
        assert!(poller.on_answer(None).is_empty());
    }

    #[test]
    fn trouble_backs_off_and_the_next_answer_is_a_complete_look() {
        let mut poller = Poller::new();
        assert_eq!(poller.on_answer(None), [Watched::Listed(None)]);
        let delays: Vec<Duration> = (0..8).map(|_| poller.on_trouble("down".into()).1).collect();
        assert!(delays.windows(2).all(|pair| pair[0] <= pair[1]));
        assert_eq!(*delays.last().unwrap(), MAX_BACKOFF);
        let running = sighting(SandboxState::Running);
        assert_eq!(poller.on_answer(Some(running.clone())), [Watched::Listed(Some(running))]);
    }
}
