//! The background jobs this process knows about: a bounded in-memory cache
//! in front of the cluster, which stays the source of truth.
//!
//! One entry per run id holds the phase, the tail of the live output (for
//! `fetch_job` while running, and for progress), the finished outcome, and
//! the `CancelToken` of the one thread that follows the run. Waiters (a
//! `fetch_job` long-poll, `tasks/result`) sleep on one `Condvar` that every
//! change wakes.
//!
//! Bounds: running entries are capped (`Limits::max_running`, checked by
//! `insert_new`); finished ones are evicted oldest-finished first when the
//! table holds more than `max_entries` or `max_bytes`. An evicted result is
//! not lost: its Job and pod log are still in the cluster, and the next
//! fetch re-reads them. A finished entry older than `result_ttl` is expired.
//! Knows nothing of Kubernetes or MCP.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crate::cancel::CancelToken;
use crate::engine::port::spec::RunOutcome;
use crate::sandbox::frame::Stream;

/// How much the store may hold.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Entries of any kind; beyond it the oldest finished ones go.
    pub max_entries: usize,
    /// Bytes of outcomes and live output; beyond it the oldest finished go.
    pub max_bytes: usize,
    /// Background runs in flight that `insert_new` accepts.
    pub max_running: usize,
    /// Live output kept per stream while running (the tail).
    pub live_output_bytes: usize,
    /// How long a finished result stays fetchable (`MCP_K8S_RESULT_TTL_S`).
    pub result_ttl: Duration,
}

impl Limits {
    /// The production bounds around the operator's two settings. 256 MiB
    /// holds about twenty results at the default caps (1 MiB per stream,
    /// 10 MiB of artifacts) and many more small ones; beyond it results are
    /// re-read from the cluster.
    pub fn new(result_ttl: Duration, max_running: usize) -> Limits {
        Limits { max_entries: 1000, max_bytes: 256 << 20, max_running, live_output_bytes: 64 << 10, result_ttl }
    }
}

/// Where a background run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The Job exists; its command has not started yet.
    Pending,
    /// The command runs.
    Running,
    /// The outcome is known.
    Finished,
}

/// A copy of one entry, taken under the lock.
#[derive(Clone, Debug)]
pub struct View {
    pub run_id: String,
    pub token: String,
    pub created: SystemTime,
    pub updated: SystemTime,
    pub phase: Phase,
    /// The tail of the live output, at most `Limits::live_output_bytes`.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Live bytes seen so far, kept or not.
    pub stdout_seen: u64,
    pub stderr_seen: u64,
    pub outcome: Option<Arc<RunOutcome>>,
    pub cancel_requested: bool,
    /// The caller the run is recorded for (`RunSpec::owner`).
    pub owner: Option<String>,
}

/// What is called with a run's outcome when this process records it: the
/// tools' hold on the caller's limits, which counts the run until then.
pub type OnEnd = Box<dyn FnOnce(&RunOutcome) + Send>;

/// The answer to a lookup.
#[derive(Clone, Debug)]
pub enum Lookup {
    Found(View),
    /// It finished more than `result_ttl` ago; the entry is gone now.
    Expired,
    /// Never known here, or evicted: ask the cluster.
    Missing,
}

/// `insert_new` refused: too many background runs in flight.
#[derive(Debug, PartialEq)]
pub struct Full {
    pub running: usize,
}

/// How much live output a waiter has already been given.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Seen {
    pub stdout: u64,
    pub stderr: u64,
}

/// The store; clones share it.
#[derive(Clone)]
pub struct Jobs {
    shared: Arc<Shared>,
}

impl Jobs {
    pub fn new(limits: Limits) -> Jobs {
        let table = Table { entries: HashMap::new(), next_finish_order: 0 };
        Jobs { shared: Arc::new(Shared { table: Mutex::new(table), changed: Condvar::new(), limits }) }
    }

    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// Adds a run this process is about to create, unless `max_running`
    /// runs are in flight already.
    pub fn insert_new(&self, run_id: &str, token: &str, cancel: CancelToken) -> Result<(), Full> {
        let mut table = self.lock();
        let running = table.entries.values().filter(|entry| entry.phase != Phase::Finished).count();
        if running >= self.shared.limits.max_running {
            return Err(Full { running });
        }
        table.entries.insert(run_id.to_string(), Entry::new(token, SystemTime::now(), cancel));
        Ok(())
    }

    /// Adds a run found in the cluster (re-attach), created at `created`.
    /// Returns false when it is known already: then another thread follows
    /// it and the caller must not start a second follower.
    pub fn insert_found(&self, run_id: &str, token: &str, created: SystemTime, cancel: CancelToken) -> bool {
        let mut table = self.lock();
        if table.entries.contains_key(run_id) {
            return false;
        }
        table.entries.insert(run_id.to_string(), Entry::new(token, created, cancel));
        true
    }

    /// Records whose run it is, and what to call when it ends here. A run
    /// is looked up by its token only after `submit` returns, which is
    /// after this.
    pub fn set_owner(&self, run_id: &str, owner: Option<String>, on_end: Option<OnEnd>) {
        let mut table = self.lock();
        if let Some(entry) = table.entries.get_mut(run_id) {
            entry.owner = owner;
            entry.on_end = on_end;
        }
    }

    /// Forgets a run whose creation failed.
    pub fn remove(&self, run_id: &str) {
        self.lock().entries.remove(run_id);
        self.shared.changed.notify_all();
    }

    pub fn set_phase(&self, run_id: &str, phase: Phase) {
        self.update(run_id, |entry| {
            if entry.phase != Phase::Finished {
                entry.phase = phase;
            }
        });
    }

    pub fn push_output(&self, run_id: &str, stream: Stream, bytes: &[u8]) {
        let keep = self.shared.limits.live_output_bytes;
        self.update(run_id, |entry| {
            let tail = match stream {
                Stream::Stdout => &mut entry.stdout,
                Stream::Stderr => &mut entry.stderr,
            };
            tail.push(bytes, keep);
        });
    }

    /// Records the outcome of a run that ended at `ended` (the retention
    /// counts from then, also for a result re-read long after), wakes
    /// every waiter, and applies the bounds.
    pub fn finish(&self, run_id: &str, outcome: RunOutcome, ended: SystemTime) {
        let mut table = self.lock();
        let order = table.next_finish_order;
        table.next_finish_order += 1;
        let mut on_end = None;
        let outcome = Arc::new(outcome);
        if let Some(entry) = table.entries.get_mut(run_id) {
            entry.phase = Phase::Finished;
            entry.finished = Some((ended, order));
            entry.updated = SystemTime::now();
            entry.outcome = Some(Arc::clone(&outcome));
            on_end = entry.on_end.take();
            // The outcome carries the output now; the live tail is spare.
            entry.stdout = LiveTail::default();
            entry.stderr = LiveTail::default();
        }
        table.evict(&self.shared.limits);
        drop(table);
        // Before the waiters wake: a caller told its run ended finds its
        // limits freed.
        if let Some(on_end) = on_end {
            on_end(&outcome);
        }
        self.shared.changed.notify_all();
    }

    /// Marks the run as being cancelled and returns its follower's token;
    /// `None` when unknown.
    pub fn request_cancel(&self, run_id: &str) -> Option<CancelToken> {
        let mut table = self.lock();
        let entry = table.entries.get_mut(run_id)?;
        entry.cancel_requested = true;
        Some(entry.cancel.clone())
    }

    /// Someone looks at the run: its output is read live from now on
    /// (`run::Followed::output_on_demand`). True the first time for a run
    /// still going, when nothing may have been read yet.
    pub fn want_output(&self, run_id: &str) -> bool {
        let mut table = self.lock();
        let Some(entry) = table.entries.get_mut(run_id) else { return false };
        let first = !entry.output_wanted && entry.phase != Phase::Finished;
        entry.output_wanted = true;
        first
    }

    /// Whether the run's output is to be read live: someone looked at it
    /// or cancelled it (the runner then reports what it has).
    pub fn output_wanted(&self, run_id: &str) -> bool {
        self.lock().entries.get(run_id).is_some_and(|entry| entry.output_wanted || entry.cancel_requested)
    }

    /// Waits until the run shows output beyond `seen` or finishes, or
    /// `deadline` passes; for a first look at a run whose output starts
    /// being read only now.
    pub fn wait_for_output(&self, run_id: &str, deadline: Instant, seen: &Seen) {
        while Instant::now() < deadline {
            match self.wait_for_change(run_id, deadline, seen) {
                Lookup::Found(view)
                    if view.phase != Phase::Finished && view.stdout_seen <= seen.stdout && view.stderr_seen <= seen.stderr => {}
                _ => return,
            }
        }
    }

    pub fn lookup(&self, run_id: &str) -> Lookup {
        let mut table = self.lock();
        table.lookup(run_id, self.shared.limits.result_ttl)
    }

    /// Waits until the run has finished, `deadline` passes or `stop` is
    /// cancelled, handing new live output to `on_output` (outside the lock)
    /// as it arrives. Returns the last lookup.
    pub fn wait(
        &self,
        run_id: &str,
        deadline: Instant,
        stop: &CancelToken,
        seen: &mut Seen,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Lookup {
        loop {
            let lookup = self.wait_for_change(run_id, deadline, seen);
            let Lookup::Found(view) = &lookup else { return lookup };
            for (stream, tail, total, already) in [
                (Stream::Stdout, &view.stdout, view.stdout_seen, &mut seen.stdout),
                (Stream::Stderr, &view.stderr, view.stderr_seen, &mut seen.stderr),
            ] {
                let new = total.saturating_sub(*already).min(tail.len() as u64) as usize;
                if new > 0 {
                    on_output(stream, &tail[tail.len() - new..]);
                }
                *already = total;
            }
            if view.phase == Phase::Finished || Instant::now() >= deadline || stop.is_cancelled() {
                return lookup;
            }
        }
    }

    /// Sleeps until the entry shows output beyond `seen`, finishes, or a
    /// short slice passes (so `stop` is checked often), then looks it up.
    fn wait_for_change(&self, run_id: &str, deadline: Instant, seen: &Seen) -> Lookup {
        let slice_end = deadline.min(Instant::now() + Duration::from_millis(250));
        let mut table = self.lock();
        loop {
            let lookup = table.lookup(run_id, self.shared.limits.result_ttl);
            let changed = match &lookup {
                Lookup::Found(view) => view.phase == Phase::Finished || view.stdout_seen > seen.stdout || view.stderr_seen > seen.stderr,
                Lookup::Expired | Lookup::Missing => true,
            };
            let now = Instant::now();
            if changed || now >= slice_end {
                return lookup;
            }
            table = self.shared.changed.wait_timeout(table, slice_end - now).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    fn update(&self, run_id: &str, change: impl FnOnce(&mut Entry)) {
        let mut table = self.lock();
        if let Some(entry) = table.entries.get_mut(run_id) {
            change(entry);
            entry.updated = SystemTime::now();
        }
        drop(table);
        self.shared.changed.notify_all();
    }

    /// A poisoned lock only means a thread panicked while holding it; every
    /// change above leaves the table consistent, so it is used as is.
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.shared.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct Shared {
    table: Mutex<Table>,
    changed: Condvar,
    limits: Limits,
}

struct Table {
    entries: HashMap<String, Entry>,
    /// Orders finished entries for eviction, oldest first.
    next_finish_order: u64,
}

impl Table {
    fn lookup(&mut self, run_id: &str, result_ttl: Duration) -> Lookup {
        let Some(entry) = self.entries.get(run_id) else { return Lookup::Missing };
        if entry.is_expired(result_ttl) {
            self.entries.remove(run_id);
            return Lookup::Expired;
        }
        Lookup::Found(entry.view(run_id))
    }

    fn expire(&mut self, result_ttl: Duration) {
        self.entries.retain(|_, entry| !entry.is_expired(result_ttl));
    }

    /// Drops the oldest finished entries until the bounds hold. Running
    /// entries stay: they are capped by `max_running` instead.
    fn evict(&mut self, limits: &Limits) {
        self.expire(limits.result_ttl);
        let mut finished: Vec<(u64, String)> =
            self.entries.iter().filter_map(|(run_id, entry)| Some((entry.finished?.1, run_id.clone()))).collect();
        finished.sort();
        let mut bytes: usize = self.entries.values().map(Entry::bytes).sum();
        for (_, run_id) in finished {
            if self.entries.len() <= limits.max_entries && bytes <= limits.max_bytes {
                break;
            }
            if let Some(entry) = self.entries.remove(&run_id) {
                bytes -= entry.bytes();
            }
        }
    }
}

struct Entry {
    token: String,
    owner: Option<String>,
    on_end: Option<OnEnd>,
    created: SystemTime,
    updated: SystemTime,
    phase: Phase,
    stdout: LiveTail,
    stderr: LiveTail,
    outcome: Option<Arc<RunOutcome>>,
    /// When it ended (for expiry) and its place in the eviction order.
    finished: Option<(SystemTime, u64)>,
    cancel: CancelToken,
    cancel_requested: bool,
    /// Someone asked for the run while it ran (`Jobs::want_output`): its
    /// follower reads the output live from then on.
    output_wanted: bool,
}

impl Entry {
    fn new(token: &str, created: SystemTime, cancel: CancelToken) -> Entry {
        Entry {
            token: token.to_string(),
            created,
            updated: SystemTime::now(),
            phase: Phase::Pending,
            stdout: LiveTail::default(),
            stderr: LiveTail::default(),
            outcome: None,
            finished: None,
            cancel,
            cancel_requested: false,
            output_wanted: false,
            owner: None,
            on_end: None,
        }
    }

    fn view(&self, run_id: &str) -> View {
        View {
            run_id: run_id.to_string(),
            token: self.token.clone(),
            created: self.created,
            updated: self.updated,
            phase: self.phase,
            stdout: self.stdout.kept.clone(),
            stderr: self.stderr.kept.clone(),
            stdout_seen: self.stdout.seen,
            stderr_seen: self.stderr.seen,
            outcome: self.outcome.clone(),
            cancel_requested: self.cancel_requested,
            owner: self.owner.clone(),
        }
    }

    fn is_expired(&self, result_ttl: Duration) -> bool {
        self.finished.is_some_and(|(ended, _)| ended + result_ttl <= SystemTime::now())
    }

    /// Roughly what the entry holds in memory.
    fn bytes(&self) -> usize {
        let outcome = self.outcome.as_ref().map_or(0, |outcome| {
            let artifacts: usize =
                outcome.artifacts.iter().map(|artifact| artifact.path.len() + artifact.content.as_ref().map_or(0, Vec::len)).sum();
            let notes: usize = outcome.notes.iter().map(String::len).sum();
            outcome.stdout.len() + outcome.stderr.len() + outcome.message.len() + artifacts + notes
        });
        // The fixed part: ids, times, the map slot.
        256 + self.stdout.kept.len() + self.stderr.kept.len() + outcome
    }
}

/// The last bytes of one live stream, and how many were seen in all.
#[derive(Default)]
struct LiveTail {
    kept: Vec<u8>,
    seen: u64,
}

impl LiveTail {
    fn push(&mut self, bytes: &[u8], keep: usize) {
        self.seen += bytes.len() as u64;
        self.kept.extend_from_slice(bytes);
        if self.kept.len() > keep {
            let excess = self.kept.len() - keep;
            self.kept.drain(..excess);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::port::spec::{RunReason, RunStatus};

    fn limits() -> Limits {
        Limits { max_entries: 3, max_bytes: 10_000, max_running: 2, live_output_bytes: 8, result_ttl: Duration::from_secs(60) }
    }

    fn outcome(run_id: &str, stdout_bytes: usize) -> RunOutcome {
        let mut outcome = RunOutcome::without_result(run_id, RunStatus::Succeeded, RunReason::NonZeroExit, String::new());
        outcome.stdout = vec![b'x'; stdout_bytes];
        outcome
    }

    fn found(lookup: Lookup) -> View {
        match lookup {
            Lookup::Found(view) => view,
            other => panic!("expected an entry, got {other:?}"),
        }
    }

    #[test]
    fn running_entries_are_capped_and_finished_ones_do_not_count() {
        let jobs = Jobs::new(limits());
        jobs.insert_new("a", "ta", CancelToken::new()).unwrap();
        jobs.insert_new("b", "tb", CancelToken::new()).unwrap();
        assert_eq!(jobs.insert_new("c", "tc", CancelToken::new()), Err(Full { running: 2 }));
        jobs.finish("a", outcome("a", 1), SystemTime::now());
        jobs.insert_new("c", "tc", CancelToken::new()).unwrap();
    }

    #[test]
    fn the_oldest_finished_entry_is_evicted_first_by_count() {
        let jobs = Jobs::new(limits());
        for run_id in ["a", "b", "c"] {
            jobs.insert_found(run_id, run_id, SystemTime::now(), CancelToken::new());
        }
        jobs.finish("b", outcome("b", 1), SystemTime::now());
        jobs.finish("a", outcome("a", 1), SystemTime::now());
        jobs.insert_found("d", "d", SystemTime::now(), CancelToken::new());
        jobs.finish("c", outcome("c", 1), SystemTime::now());
        assert!(matches!(jobs.lookup("b"), Lookup::Missing), "b finished first");
        for run_id in ["a", "c", "d"] {
            assert!(matches!(jobs.lookup(run_id), Lookup::Found(_)), "{run_id}");
        }
    }

    #[test]
    fn finished_entries_are_evicted_by_bytes_but_running_ones_stay() {
        let jobs = Jobs::new(Limits { max_entries: 100, ..limits() });
        for run_id in ["a", "b", "c"] {
            jobs.insert_found(run_id, run_id, SystemTime::now(), CancelToken::new());
        }
        jobs.finish("a", outcome("a", 6_000), SystemTime::now());
        jobs.finish("b", outcome("b", 6_000), SystemTime::now());
        assert!(matches!(jobs.lookup("a"), Lookup::Missing));
        assert_eq!(found(jobs.lookup("b")).phase, Phase::Finished);
        assert_eq!(found(jobs.lookup("c")).phase, Phase::Pending);
        // One result larger than the whole budget is dropped at once; the
        // cluster still has it.
        jobs.finish("c", outcome("c", 20_000), SystemTime::now());
        assert!(matches!(jobs.lookup("c"), Lookup::Missing));
    }

    #[test]
    fn a_result_older_than_the_ttl_is_expired() {
        let jobs = Jobs::new(Limits { result_ttl: Duration::from_millis(30), ..limits() });
        jobs.insert_found("a", "a", SystemTime::now(), CancelToken::new());
        jobs.finish("a", outcome("a", 1), SystemTime::now());
        assert!(matches!(jobs.lookup("a"), Lookup::Found(_)));
        std::thread::sleep(Duration::from_millis(40));
        assert!(matches!(jobs.lookup("a"), Lookup::Expired));
        assert!(matches!(jobs.lookup("a"), Lookup::Missing), "expired entries are removed");
    }

    #[test]
    fn the_retention_counts_from_when_the_run_ended() {
        let jobs = Jobs::new(limits());
        jobs.insert_found("a", "a", SystemTime::now(), CancelToken::new());
        jobs.finish("a", outcome("a", 1), SystemTime::now() - Duration::from_secs(61));
        // Dropped at once; the caller then finds the Job expired too.
        assert!(matches!(jobs.lookup("a"), Lookup::Missing), "re-read after its retention: not kept");
    }

    #[test]
    fn live_output_keeps_the_tail_and_counts_everything() {
        let jobs = Jobs::new(limits());
        jobs.insert_found("a", "a", SystemTime::now(), CancelToken::new());
        jobs.push_output("a", Stream::Stdout, b"0123456789");
        jobs.push_output("a", Stream::Stdout, b"ab");
        let view = found(jobs.lookup("a"));
        assert_eq!((view.stdout.as_slice(), view.stdout_seen), (&b"456789ab"[..], 12));
    }

    #[test]
    fn a_long_poll_wakes_when_the_run_finishes() {
        let jobs = Jobs::new(limits());
        jobs.insert_found("a", "a", SystemTime::now(), CancelToken::new());
        let finisher = {
            let jobs = jobs.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                jobs.finish("a", outcome("a", 1), SystemTime::now());
            })
        };
        let started = Instant::now();
        let lookup = jobs.wait("a", Instant::now() + Duration::from_secs(30), &CancelToken::new(), &mut Seen::default(), &mut |_, _| {});
        assert_eq!(found(lookup).phase, Phase::Finished);
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        finisher.join().unwrap();
    }

    #[test]
    fn a_long_poll_streams_new_output_once_and_stops_when_told() {
        let jobs = Jobs::new(limits());
        jobs.insert_found("a", "a", SystemTime::now(), CancelToken::new());
        jobs.push_output("a", Stream::Stdout, b"old");
        let mut seen = Seen { stdout: 3, stderr: 0 };
        let stop = CancelToken::new();
        let writer = {
            let (jobs, stop) = (jobs.clone(), stop.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                jobs.push_output("a", Stream::Stderr, b"new");
                std::thread::sleep(Duration::from_millis(300));
                stop.cancel();
            })
        };
        let mut chunks = Vec::new();
        let lookup = jobs.wait("a", Instant::now() + Duration::from_secs(30), &stop, &mut seen, &mut |stream, bytes| {
            chunks.push((stream, bytes.to_vec()));
        });
        writer.join().unwrap();
        assert_eq!(chunks, [(Stream::Stderr, b"new".to_vec())]);
        assert_eq!(seen, Seen { stdout: 3, stderr: 3 });
        assert_eq!(found(lookup).phase, Phase::Pending);
    }

    #[test]
    fn a_long_poll_ends_at_its_deadline() {
        let jobs = Jobs::new(limits());
        jobs.insert_found("a", "a", SystemTime::now(), CancelToken::new());
        let started = Instant::now();
        jobs.wait("a", Instant::now() + Duration::from_millis(100), &CancelToken::new(), &mut Seen::default(), &mut |_, _| {});
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn a_second_attach_is_refused_so_there_is_one_follower() {
        let jobs = Jobs::new(limits());
        assert!(jobs.insert_found("a", "a", SystemTime::now(), CancelToken::new()));
        assert!(!jobs.insert_found("a", "a", SystemTime::now(), CancelToken::new()));
        let cancel = jobs.request_cancel("a").unwrap();
        assert!(!cancel.is_cancelled(), "requesting a cancel does not stop the follower by itself");
        assert!(found(jobs.lookup("a")).cancel_requested);
    }
}
