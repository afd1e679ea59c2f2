//! Follows the runs' pods for the engine: one pod watch for every run of
//! this backend (the pods of all runs share the managed-by label), read
//! by one thread that keeps the pods it has seen by run and passes each
//! change to the run it belongs to as a neutral `Sighting`. A run that
//! starts watching gets its pods as they are now (`Watched::Listed`),
//! once the watch has listed them. The watch resumes after drops and
//! re-lists on 410 (each run then gets its pods listed again). API trouble
//! is retried for as long as runs watch (the engine's deadlines bound
//! each), except refusals that outlive `DENIED_GRACE` and answers that
//! retrying cannot change: those end every watching run's stream, and
//! the next run to watch starts the watch again. A thread that dies
//! otherwise (a panic) tells every run `Watched::Ended`, and each watches
//! again.
//!
//! Why one: a watch per run held a thread and a TLS connection for each
//! run in flight (bench/scaling). The watch stays open for `LINGER` after
//! the last run leaves, so the next run (an agent's calls come one after
//! another) joins a listed watch instead of listing every managed pod
//! again; a server idle longer holds no connection.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};
use std::time::{Duration, Instant};

use crate::backend::kubernetes::{classify, manifest};
use crate::engine::port::{Abort, ErrorKind, Sighting, Times, Watch, Watched};
use crate::kube::objects::Pod;
use crate::kube::{self, ListParams, Resource};
use crate::{log, supervise};

/// How long 401/403 answers to the watch are taken for an API server
/// whose caches are still cold after a restart (it answered 403 for a few
/// seconds once) before they count as a real refusal.
const DENIED_GRACE: Duration = Duration::from_secs(30);

/// How long the watch stays open with no run watching.
pub const LINGER: Duration = Duration::from_secs(60);

/// The one pod watch of a backend, shared by its runs.
#[derive(Clone)]
pub struct PodHub {
    client: kube::Client,
    namespace: String,
    state: Arc<Mutex<HubState>>,
}

#[derive(Default)]
struct HubState {
    /// The watch thread runs.
    running: bool,
    /// Which start of the watch thread is the current one: a thread that
    /// was told to stop touches nothing after a newer one started.
    generation: u64,
    /// Its first list came in: `pods` is what the API holds.
    listed: bool,
    /// Pods seen, by run id, then by pod name.
    pods: HashMap<String, BTreeMap<String, Pod>>,
    /// The runs watching, by run id, each with its subscription number.
    watchers: HashMap<String, Vec<(u64, mpsc::Sender<Watched>)>>,
    next_number: u64,
    /// Closes the running watch's connection.
    abort: Option<kube::watch::Abort>,
    /// Since when no run watches, while the watch lingers.
    idle_since: Option<Instant>,
    /// A thread waits to close the idle watch (`linger`).
    lingering: bool,
}

impl PodHub {
    pub fn new(client: kube::Client, namespace: String) -> PodHub {
        PodHub { client, namespace, state: Arc::default() }
    }

    /// Whether the watch is open: a run watches, or one did within `LINGER`.
    pub fn is_open(&self) -> bool {
        lock(&self.state).running
    }

    /// The pods of `run_id`, from now until the returned watch is aborted.
    pub fn watch(&self, run_id: &str) -> Watch {
        let (sender, events) = mpsc::channel();
        let wake = sender.clone();
        let (number, starting) = {
            let mut state = lock(&self.state);
            if state.listed {
                let _ = sender.send(Watched::Listed(newest_sighting(state.pods.get(run_id))));
            }
            state.next_number += 1;
            let number = state.next_number;
            state.watchers.entry(run_id.to_string()).or_default().push((number, sender));
            (number, (!state.running).then(|| self.begin(&mut state)))
        };
        if let Some((watcher, stopped)) = starting {
            // Spawned without the lock: a thread that cannot start drops
            // `stopped`, which takes the lock to close every stream.
            if let Err(error) = supervise::spawn(supervise::Kind::PodWatch, move || feed(watcher, stopped)) {
                log::error("could not start the pod watch thread", &[("error", error.to_string().into())]);
            }
        }
        let (hub, run_id) = (Arc::clone(&self.state), run_id.to_string());
        Watch { events, abort: Abort::new(move || unsubscribe(&hub, &run_id, number)), wake }
    }

    /// Marks a new generation of the watch running; its thread is to read
    /// the returned watcher and hold the returned guard, which stops the
    /// hub however the thread ends (an injected panic before its body
    /// included), unless a newer generation took over.
    fn begin(&self, state: &mut HubState) -> (kube::watch::Watcher, Stopped) {
        let selector =
            ListParams { label_selector: Some(format!("{}={}", manifest::LABEL_MANAGED_BY, manifest::MANAGED_BY)), field_selector: None };
        let params = kube::watch::WatchParams { list: selector, ..kube::watch::WatchParams::default() };
        let watcher = self.client.watch(Resource::PODS, &self.namespace, params);
        state.abort = Some(watcher.abort_handle());
        state.running = true;
        state.generation += 1;
        (watcher, Stopped { hub: Arc::clone(&self.state), generation: state.generation })
    }
}

/// Ends one run's watch. The shared watch goes on while runs remain; the
/// last one leaving starts its `LINGER`, after which a thread closes it
/// unless a run came.
fn unsubscribe(hub: &Arc<Mutex<HubState>>, run_id: &str, number: u64) {
    let mut state = lock(hub);
    if let Some(watchers) = state.watchers.get_mut(run_id) {
        watchers.retain(|(watcher, _)| *watcher != number);
        if watchers.is_empty() {
            state.watchers.remove(run_id);
        }
    }
    if !state.watchers.is_empty() || !state.running {
        return;
    }
    state.idle_since = Some(Instant::now());
    if state.lingering {
        return;
    }
    state.lingering = true;
    drop(state);
    let thread_hub = Arc::clone(hub);
    if supervise::spawn(supervise::Kind::PodWatch, move || linger(&thread_hub)).is_err() {
        // No thread to close it later: close it now.
        let mut state = lock(hub);
        state.lingering = false;
        if state.watchers.is_empty() && state.running {
            state.stop();
        }
    }
}

/// Waits out the idle watch's `LINGER`, then closes it if no run came.
fn linger(hub: &Mutex<HubState>) {
    loop {
        let wait = {
            let mut state = lock(hub);
            match state.linger_step(Instant::now()) {
                Linger::Wait(wait) => wait,
                Linger::Close => {
                    state.stop();
                    state.lingering = false;
                    return;
                }
                Linger::Done => {
                    state.lingering = false;
                    return;
                }
            }
        };
        std::thread::sleep(wait);
    }
}

/// What the lingering thread does next.
#[derive(Debug, PartialEq)]
enum Linger {
    /// Idle, but not for `LINGER` yet: look again after this long.
    Wait(Duration),
    /// Idle for `LINGER`: close the watch.
    Close,
    /// Runs watch again, or the watch is closed already.
    Done,
}

fn lock(hub: &Mutex<HubState>) -> MutexGuard<'_, HubState> {
    hub.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The newest of a run's pods, as the engine sees it.
fn newest_sighting(pods: Option<&BTreeMap<String, Pod>>) -> Option<Sighting> {
    newest(pods.map(|pods| pods.values().cloned().collect()).unwrap_or_default()).map(|pod| sighting(&pod))
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
            scheduled: classify::scheduled_at(pod),
            started: classify::main_started_at(pod),
            finished: classify::main_finished_at(pod),
        },
    }
}

/// Reads the shared watch and passes each change to the runs it belongs
/// to, until no run watches (or retrying cannot help). Whatever ends it,
/// a panic included, `Stopped` marks the hub stopped and tells every
/// watcher `Watched::Ended`, so no run waits on a watch nobody reads.
fn feed(mut watcher: kube::watch::Watcher, stopped: Stopped) {
    let (hub, generation) = (&stopped.hub, stopped.generation);
    let abort = watcher.abort_handle();
    let mut health = WatchHealth::default();
    loop {
        match watcher.next() {
            Ok(event) => {
                health.on_success();
                let mut state = lock(hub);
                if state.generation != generation {
                    return;
                }
                match event {
                    kube::watch::WatchEvent::Listed(pods) => state.listed_again(pods.iter().map(Pod::from_value)),
                    kube::watch::WatchEvent::Added(pod) | kube::watch::WatchEvent::Modified(pod) => state.seen(Pod::from_value(&pod)),
                    kube::watch::WatchEvent::Deleted(pod) => state.gone(Pod::from_value(&pod)),
                }
            }
            Err(_) if abort.is_aborted() => return,
            Err(error) => {
                let delay = health.on_error(&error, Instant::now());
                let mut state = lock(hub);
                if state.generation != generation {
                    return;
                }
                match delay {
                    Some(delay) => {
                        state.tell_all(|| Watched::Trouble(error.to_string()));
                        drop(state);
                        sleep_unless_aborted(delay, &abort);
                    }
                    // Under the same lock: a run that starts watching after
                    // this starts a new watch instead of joining this one.
                    None => {
                        state.tell_all(|| Watched::Failed(error.to_string()));
                        state.stop();
                        state.watchers.clear();
                        return;
                    }
                }
            }
        }
    }
}

/// Marks the hub stopped when its thread ends, however it ends, unless
/// a newer thread took over, and tells the runs watching.
struct Stopped {
    hub: Arc<Mutex<HubState>>,
    generation: u64,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let mut state = lock(&self.hub);
        if state.generation == self.generation {
            state.stop();
            // Each run is told, and watches again (it holds a sender of its
            // own stream, so the stream does not close with ours).
            state.tell_all(|| Watched::Ended);
            state.watchers.clear();
        }
    }
}

impl HubState {
    fn linger_step(&self, now: Instant) -> Linger {
        match self.idle_since {
            Some(since) if self.running && self.watchers.is_empty() => match (since + LINGER).checked_duration_since(now) {
                Some(left) if !left.is_zero() => Linger::Wait(left),
                _ => Linger::Close,
            },
            _ => Linger::Done,
        }
    }

    /// Closes the watch; the next run to watch starts it again. The
    /// stopped thread's generation is over: an event it still reads is
    /// not kept.
    fn stop(&mut self) {
        if let Some(abort) = self.abort.take() {
            abort.abort();
        }
        self.generation += 1;
        self.running = false;
        self.listed = false;
        self.idle_since = None;
        self.pods.clear();
    }

    /// A complete look: the pods now, and each watching run its own.
    fn listed_again(&mut self, pods: impl Iterator<Item = Pod>) {
        self.pods.clear();
        for pod in pods {
            self.keep(pod);
        }
        self.listed = true;
        let runs: Vec<String> = self.watchers.keys().cloned().collect();
        for run_id in runs {
            let listed = newest_sighting(self.pods.get(&run_id));
            self.tell_run(&run_id, || Watched::Listed(listed.clone()));
        }
    }

    fn seen(&mut self, pod: Pod) {
        let (run_id, sighting) = (run_id_of(&pod), sighting(&pod));
        self.keep(pod);
        self.tell_run(&run_id, || Watched::Seen(sighting.clone()));
    }

    fn gone(&mut self, pod: Pod) {
        let run_id = run_id_of(&pod);
        if let Some(pods) = self.pods.get_mut(&run_id) {
            pods.remove(&pod.metadata.name);
            if pods.is_empty() {
                self.pods.remove(&run_id);
            }
        }
        let sighting = sighting(&pod);
        self.tell_run(&run_id, || Watched::Gone(sighting.clone()));
    }

    fn keep(&mut self, pod: Pod) {
        self.pods.entry(run_id_of(&pod)).or_default().insert(pod.metadata.name.clone(), pod);
    }

    /// Sends to the run's watchers; a watcher that stopped listening (its
    /// watch dropped without an abort) is dropped, and a run left with
    /// none with it, so the last run's leaving still closes the watch.
    fn tell_run(&mut self, run_id: &str, event: impl Fn() -> Watched) {
        if let Some(watchers) = self.watchers.get_mut(run_id) {
            watchers.retain(|(_, sender)| sender.send(event()).is_ok());
            if watchers.is_empty() {
                self.watchers.remove(run_id);
            }
        }
    }

    fn tell_all(&mut self, event: impl Fn() -> Watched) {
        self.watchers.retain(|_, watchers| {
            watchers.retain(|(_, sender)| sender.send(event()).is_ok());
            !watchers.is_empty()
        });
    }
}

fn run_id_of(pod: &Pod) -> String {
    pod.metadata.labels.get(manifest::LABEL_RUN_ID).cloned().unwrap_or_default()
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

    fn pod_of(run_id: &str, name: &str, phase: &str) -> Pod {
        Pod::from_value(&serde_json::json!({
            "metadata": {"name": name, "labels": {manifest::LABEL_RUN_ID: run_id}, "creationTimestamp": format!("2026-01-01T00:00:0{}Z", name.len() % 10)},
            "status": {"phase": phase},
        }))
    }

    fn watching(state: &mut HubState, run_id: &str) -> mpsc::Receiver<Watched> {
        let (sender, events) = mpsc::channel();
        state.next_number += 1;
        state.watchers.entry(run_id.to_string()).or_default().push((state.next_number, sender));
        events
    }

    fn names(events: &mpsc::Receiver<Watched>) -> Vec<String> {
        events
            .try_iter()
            .map(|event| match event {
                Watched::Listed(sighting) => format!("listed {}", sighting.map_or("-".to_string(), |sighting| sighting.sandbox)),
                Watched::Seen(sighting) => format!("seen {}", sighting.sandbox),
                Watched::Gone(sighting) => format!("gone {}", sighting.sandbox),
                Watched::Trouble(_) => "trouble".to_string(),
                Watched::Failed(_) => "failed".to_string(),
                Watched::Ended => "ended".to_string(),
                Watched::OutputEnded(number) => format!("output {number} ended"),
            })
            .collect()
    }

    /// Each run hears of its own pods only: its newest on a list, each
    /// change after, and trouble that concerns every run.
    #[test]
    fn the_shared_watch_tells_each_run_of_its_own_pods() {
        let mut state = HubState::default();
        let (a, b) = (watching(&mut state, "a"), watching(&mut state, "b"));
        state.listed_again([pod_of("a", "a-1", "Running"), pod_of("a", "a-22", "Pending"), pod_of("x", "x-1", "Running")].into_iter());
        assert_eq!(names(&a), ["listed a-22"], "the newest of its pods");
        assert_eq!(names(&b), ["listed -"]);
        state.seen(pod_of("b", "b-1", "Pending"));
        state.seen(pod_of("x", "x-2", "Pending"));
        assert_eq!((names(&a), names(&b)), (vec![], vec!["seen b-1".to_string()]));
        state.gone(pod_of("a", "a-22", "Running"));
        assert_eq!(names(&a), ["gone a-22"]);
        assert_eq!(newest_sighting(state.pods.get("a")).map(|sighting| sighting.sandbox), Some("a-1".into()), "a-22 is no longer kept");
        state.tell_all(|| Watched::Trouble("503".into()));
        assert_eq!((names(&a), names(&b)), (vec!["trouble".to_string()], vec!["trouble".to_string()]));
        drop(a);
        state.seen(pod_of("a", "a-1", "Succeeded"));
        assert!(!state.watchers.contains_key("a"), "a run that stopped listening is dropped");
        drop(b);
        state.tell_all(|| Watched::Trouble("503".into()));
        assert!(state.watchers.is_empty(), "so are runs that stopped listening to trouble");
    }

    /// A thread that was told to stop leaves a newer one's watchers alone;
    /// the current one's end closes every watcher's stream.
    #[test]
    fn only_the_current_watch_threads_end_closes_the_streams() {
        let hub = Arc::new(Mutex::new(HubState { running: true, generation: 2, ..HubState::default() }));
        let events = watching(&mut lock(&hub), "a");
        drop(Stopped { hub: Arc::clone(&hub), generation: 1 });
        assert!(lock(&hub).running && lock(&hub).watchers.contains_key("a"), "an older thread's end changes nothing");
        drop(Stopped { hub: Arc::clone(&hub), generation: 2 });
        assert!(!lock(&hub).running);
        assert_eq!(events.recv(), Ok(Watched::Ended), "the run is told to watch again");
        assert_eq!(events.recv(), Err(mpsc::RecvError), "and the stream is closed");
    }

    /// An idle watch stays open for `LINGER`, then closes; a run that
    /// comes meanwhile keeps it.
    #[test]
    fn an_idle_watch_lingers_then_closes_unless_a_run_comes() {
        let t0 = Instant::now();
        let idle = HubState { running: true, idle_since: Some(t0), ..HubState::default() };
        assert_eq!(idle.linger_step(t0), Linger::Wait(LINGER));
        assert_eq!(idle.linger_step(t0 + Duration::from_secs(45)), Linger::Wait(Duration::from_secs(15)));
        assert_eq!(idle.linger_step(t0 + LINGER), Linger::Close);
        let mut busy = HubState { running: true, idle_since: Some(t0), ..HubState::default() };
        let _events = watching(&mut busy, "a");
        assert_eq!(busy.linger_step(t0 + LINGER), Linger::Done, "a run watches again");
        let closed = HubState { running: false, idle_since: Some(t0), ..HubState::default() };
        assert_eq!(closed.linger_step(t0 + LINGER), Linger::Done, "closed already");
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
        assert!(matches!(facts.stopped, Some(crate::engine::port::facts::Stopped::Evicted { .. })) && !facts.deleted, "{facts:?}");
    }
}
