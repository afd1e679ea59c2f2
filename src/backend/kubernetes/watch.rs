//! Follows a run's pods for the engine: one thread per run reads the
//! pod watch (which resumes after drops and re-lists on 410) and sends
//! each pod as a neutral `Sighting`. API trouble is retried here for as
//! long as the run lasts (the engine's deadlines bound it), except
//! refusals that outlive `DENIED_GRACE` and answers that retrying cannot
//! change.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::backend::kubernetes::classify;
use crate::engine::backend::{Abort, ErrorKind, Sighting, Times, Watch, Watched};
use crate::kube::objects::Pod;
use crate::kube::{self, ListParams, Resource};
use crate::{log, supervise};

/// How long 401/403 answers to the watch are taken for an API server
/// whose caches are still cold after a restart (it answered 403 for a few
/// seconds once) before they count as a real refusal.
pub const DENIED_GRACE: Duration = Duration::from_secs(30);

/// Starts the watch thread for the pods `selector` picks in `namespace`.
pub fn start(client: kube::Client, namespace: String, selector: ListParams) -> Watch {
    let params = kube::watch::WatchParams { list: selector, ..kube::watch::WatchParams::default() };
    let watcher = client.watch(Resource::PODS, &namespace, params);
    let handle = watcher.abort_handle();
    let (sender, events) = mpsc::channel();
    let spawned = supervise::spawn(supervise::Kind::PodWatch, move || feed(watcher, &sender));
    if let Err(error) = &spawned {
        // The receiver then reports a closed stream; the engine's deadlines
        // end the run with what it knows.
        log::error("could not start the pod watch thread", &[("error", error.to_string().into())]);
    }
    Watch { events, abort: Abort::new(move || handle.abort()) }
}

/// The most recently created of a run's pods: the one to judge.
pub fn newest(pods: Vec<Pod>) -> Option<Pod> {
    pods.into_iter().max_by_key(|pod| pod.metadata.creation_timestamp.clone().unwrap_or_default())
}

/// A pod as the engine sees it.
pub fn sighting(pod: &Pod) -> Sighting {
    Sighting {
        sandbox: pod.metadata.name.clone(),
        view: classify::sandbox_view(pod),
        times: Times {
            scheduled: classify::scheduled_at_view(pod),
            started: classify::main_started_at_view(pod),
            finished: classify::main_finished_at_view(pod),
        },
    }
}

/// Feeds pod events to the decision loop until it stops listening. API
/// trouble is retried here for as long as the run lasts (the decision
/// loop's deadlines bound it), except refusals that outlive `DENIED_GRACE`
/// and answers that retrying cannot change.
fn feed(mut watcher: kube::watch::Watcher, sender: &mpsc::Sender<Watched>) {
    let abort = watcher.abort_handle();
    let mut health = WatchHealth::default();
    loop {
        let sent = match watcher.next() {
            Ok(event) => {
                health.on_success();
                match event {
                    kube::watch::WatchEvent::Listed(pods) => {
                        let newest = newest(pods.iter().map(Pod::from_value).collect());
                        sender.send(Watched::Listed(newest.map(|pod| sighting(&pod)))).is_ok()
                    }
                    kube::watch::WatchEvent::Added(pod) | kube::watch::WatchEvent::Modified(pod) => {
                        sender.send(Watched::Seen(sighting(&Pod::from_value(&pod)))).is_ok()
                    }
                    kube::watch::WatchEvent::Deleted(pod) => sender.send(Watched::Gone(sighting(&Pod::from_value(&pod)))).is_ok(),
                }
            }
            Err(_) if abort.is_aborted() => return,
            Err(error) => match health.on_error(&error, Instant::now()) {
                Some(delay) => {
                    let sent = sender.send(Watched::Trouble(error.to_string())).is_ok();
                    sleep_unless_aborted(delay, &abort);
                    sent
                }
                None => {
                    let _ = sender.send(Watched::Failed(error.to_string()));
                    return;
                }
            },
        };
        if !sent {
            return;
        }
    }
}

/// Which watch errors are retried, and after how long (pure, for tests).
#[derive(Debug, Default)]
struct WatchHealth {
    failures: u32,
    /// Start of the current run of 401/403 answers.
    denied_since: Option<Instant>,
}

impl WatchHealth {
    fn on_success(&mut self) {
        self.failures = 0;
        self.denied_since = None;
    }

    /// The delay before the next try, or `None` to give up.
    fn on_error(&mut self, error: &kube::Error, now: Instant) -> Option<Duration> {
        let retry = if error.is_forbidden() || error.is_unauthorized() {
            let since = *self.denied_since.get_or_insert(now);
            now.duration_since(since) < DENIED_GRACE
        } else {
            // A refusal right after this counts as "right after reconnecting".
            self.denied_since = None;
            is_transient(error)
        };
        if !retry {
            return None;
        }
        self.failures = self.failures.saturating_add(1);
        Some(Duration::from_millis(250).saturating_mul(1 << self.failures.min(4)).min(Duration::from_secs(4)))
    }
}

/// Errors an API server that is restarting or overloaded gives: the
/// backend's one table of what is worth retrying.
fn is_transient(error: &kube::Error) -> bool {
    super::error_kind(error) == ErrorKind::Transient
}

fn sleep_unless_aborted(delay: Duration, abort: &kube::watch::Abort) {
    let deadline = Instant::now() + delay;
    while !abort.is_aborted() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        let status = kube::error::Status { code, reason: String::new(), message: String::new(), ..kube::error::Status::default() };
        kube::Error::Api { verb: "GET", path: "/api/v1/namespaces/ns/pods?watch=1".into(), status: Box::new(status) }
    }

    fn refused() -> kube::Error {
        kube::Error::Transport { verb: "GET", path: "/api/v1/namespaces/ns/pods".into(), message: "Connection refused".into() }
    }

    /// An outage is ridden out, a 403 right after it
    /// gets `DENIED_GRACE`, a refusal that lasts ends the run.
    #[test]
    fn watch_errors_are_retried_within_bounds() {
        let start = Instant::now();
        let mut health = WatchHealth::default();
        for second in 0..25 {
            assert!(health.on_error(&refused(), start + Duration::from_secs(second)).is_some(), "refused at {second} s");
        }
        assert!(health.on_error(&api_error(503), start + Duration::from_secs(26)).is_some());
        let back = start + Duration::from_secs(27);
        assert!(health.on_error(&api_error(403), back).is_some(), "403 right after the outage");
        assert!(health.on_error(&api_error(403), back + Duration::from_secs(29)).is_some());
        assert!(health.on_error(&api_error(403), back + DENIED_GRACE).is_none(), "403 for DENIED_GRACE is real");
        let mut health = WatchHealth::default();
        assert!(health.on_error(&api_error(401), start).is_some());
        health.on_success();
        assert!(health.on_error(&api_error(403), start + Duration::from_secs(40)).is_some(), "a success resets the grace");
        assert!(WatchHealth::default().on_error(&api_error(404), start).is_none(), "the namespace is gone");
        let decode = kube::Error::Decode { verb: "GET", path: "/x".into(), message: "bad".into() };
        assert!(WatchHealth::default().on_error(&decode, start).is_none());
    }

    #[test]
    fn retry_delays_grow_and_stay_bounded() {
        let mut health = WatchHealth::default();
        let delays: Vec<Duration> = (0..8).filter_map(|_| health.on_error(&refused(), Instant::now())).collect();
        assert_eq!(delays[0], Duration::from_millis(500));
        assert!(delays.windows(2).all(|pair| pair[0] <= pair[1]));
        assert_eq!(*delays.last().unwrap(), Duration::from_secs(4));
    }

    #[test]
    fn a_pods_view_sees_deletion_before_the_final_status() {
        let running = serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Running"}});
        let view = sighting(&Pod::from_value(&running)).view;
        assert_eq!(view.ended, None);
        assert!(view.if_gone.deleted, "a running pod that disappears was deleted");
        let deleting =
            serde_json::json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}});
        assert!(sighting(&Pod::from_value(&deleting)).view.ended.unwrap().deleted);
        let evicted = serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Failed", "reason": "Evicted", "message": "m"}});
        let facts = sighting(&Pod::from_value(&evicted)).view.ended.unwrap();
        assert!(matches!(facts.stopped, Some(crate::engine::facts::Stopped::Evicted { .. })) && !facts.deleted, "{facts:?}");
    }
}
