//! Whether each site answers, as `describe_environment` shows it: one ask
//! per site at a time, on one thread of its own, its answer kept for
//! `FRESH`; callers that come meanwhile wait for the ask under way, each
//! within its own bound, instead of asking again. An earlier version asked
//! on a new thread per call: with an API server that never answered, 128
//! clients calling `describe_environment` left 1,539 threads waiting on it
//! (224 MB). What an ask does is the caller's (a closure); this file owns
//! when one is made.
//!
//! The asks of every site share `MAX_ASKS_AT_ONCE` threads (`Askers`): the
//! others wait their turn in order. An earlier version gave each ask a
//! thread of its own: 800 sites asked at start held 800 threads and their
//! connections at once (88 MiB peak, bench/memory.py `idle-sites`).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long an answer is given again without asking: close enough to now
/// for a health line, and it caps the asks per site at one a second.
const FRESH: Duration = Duration::from_secs(1);

/// What a site that has not answered by the caller's deadline is said to be.
const NO_ANSWER_IN_TIME: &str = "no answer in time; the site's API is slow or does not answer";

/// How many asks run at once, over all sites. An ask holds a thread and
/// an API connection until its answer (or its API's timeout); 32 of them
/// hold a few MiB, and 800 healthy sites are all asked well within
/// `readiness::START_WAIT`.
const MAX_ASKS_AT_ONCE: usize = 32;

/// The threads every site's asks share.
static ASKERS: Askers = Askers::new(MAX_ASKS_AT_ONCE);

/// One site's health asks.
#[derive(Default)]
pub struct SiteHealth {
    state: Mutex<State>,
    answered: Condvar,
}

/// The site's answer: `Err` says why it is not healthy.
pub type Answer = Result<(), String>;

#[derive(Default)]
struct State {
    /// The last answer and when it came.
    last: Option<(Instant, Answer)>,
    /// An ask is under way.
    asking: bool,
}

/// What a caller does next, given the state at `now`.
#[derive(Debug, PartialEq)]
enum Step {
    /// The last answer is fresh: give it.
    Give(Answer),
    /// No ask is under way and no answer is fresh: start one.
    Ask,
    /// An ask is under way: wait for its answer.
    Wait,
}

impl SiteHealth {
    /// Starts an ask unless one is under way or the last answer is fresh;
    /// returns at once. `ask` runs on a thread of its own.
    pub fn start(self: &Arc<Self>, ask: impl FnOnce() -> Answer + Send + 'static) {
        let mut state = self.lock();
        if step(&state, Instant::now()) == Step::Ask {
            self.spawn_ask(&mut state, ask);
        }
    }

    /// The site's answer by `deadline`: the fresh one, the answer of the
    /// ask under way, or one of a new ask (`ask`, as in `start`). An error
    /// saying so when none came in time.
    pub fn answer_by(self: &Arc<Self>, deadline: Instant, ask: impl FnOnce() -> Answer + Send + 'static) -> Answer {
        self.wait_by(deadline, ask).0.unwrap_or_else(|| Err(NO_ANSWER_IN_TIME.to_string()))
    }

    /// As `answer_by`, but when no answer comes in time, the last one,
    /// however old: `/readyz` must answer within its probe's timeout, and
    /// an ask against an API that stalls takes far longer; the answer
    /// under way then comes for the next probe. `NO_ANSWER_IN_TIME` only
    /// when the site has never answered.
    pub fn latest_by(self: &Arc<Self>, deadline: Instant, ask: impl FnOnce() -> Answer + Send + 'static) -> Answer {
        match self.wait_by(deadline, ask) {
            (Some(answer), _) => answer,
            (None, Some(last)) => last,
            (None, None) => Err(NO_ANSWER_IN_TIME.to_string()),
        }
    }

    /// The answer by `deadline` if one came, and the last answer there
    /// was (stale or not) when none did.
    fn wait_by(self: &Arc<Self>, deadline: Instant, ask: impl FnOnce() -> Answer + Send + 'static) -> (Option<Answer>, Option<Answer>) {
        let mut ask = Some(ask);
        let mut state = self.lock();
        loop {
            let now = Instant::now();
            match step(&state, now) {
                Step::Give(answer) => return (Some(answer), None),
                Step::Ask if let Some(ask) = ask.take() => self.spawn_ask(&mut state, ask),
                // Asked once already for this caller: wait for that one.
                Step::Ask | Step::Wait => {
                    if now >= deadline {
                        return (None, state.last.as_ref().map(|(_, answer)| answer.clone()));
                    }
                    state = self.answered.wait_timeout(state, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
                }
            }
        }
    }

    fn spawn_ask(self: &Arc<Self>, state: &mut State, ask: impl FnOnce() -> Answer + Send + 'static) {
        state.asking = true;
        let recorder = Recorder { health: Arc::clone(self), answer: None, started: false };
        let queued = ASKERS.submit(Box::new(move || {
            // The whole recorder moves here (not only the fields written),
            // so that it drops when this ask ends, a panic included.
            let mut recorder = recorder;
            recorder.started = true;
            recorder.answer = Some(ask());
        }));
        if let Err(error) = queued {
            state.asking = false;
            state.last = Some((Instant::now(), Err(format!("could not ask it: {error}"))));
        }
    }

    fn record(&self, answer: Answer) {
        let mut state = self.lock();
        state.asking = false;
        state.last = Some((Instant::now(), answer));
        self.answered.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Records the ask's answer when its thread ends, a panic included: an
/// ask left marked under way would make every later caller wait it out.
/// One that never started (no thread) records nothing: the caller holds
/// the lock then, and says so itself.
struct Recorder {
    health: Arc<SiteHealth>,
    answer: Option<Answer>,
    started: bool,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if !self.started {
            return;
        }
        let answer = self.answer.take().unwrap_or_else(|| Err("asking it failed (a panic, logged)".to_string()));
        self.health.record(answer);
    }
}

/// An ask waiting for its turn.
type Job = Box<dyn FnOnce() + Send>;

/// A queue of asks and at most `limit` threads running them. A thread
/// starts when an ask comes and fewer run, and ends when the queue is
/// empty: no ask, no thread.
struct Askers {
    state: Mutex<AskersState>,
    limit: usize,
}

struct AskersState {
    queue: VecDeque<Job>,
    /// Threads started and not ended.
    running: usize,
}

impl Askers {
    const fn new(limit: usize) -> Askers {
        Askers { state: Mutex::new(AskersState { queue: VecDeque::new(), running: 0 }), limit }
    }

    /// Queues `job`, starting a thread for it if fewer than `limit` run.
    /// `Err` when no thread could be started and none runs: the job stays
    /// queued for the next thread (its answer, when it comes, is a later
    /// one), and the caller says now that it could not ask.
    fn submit(&'static self, job: Job) -> std::io::Result<()> {
        let mut state = self.lock();
        state.queue.push_back(job);
        if state.running >= self.limit {
            return Ok(());
        }
        state.running += 1;
        drop(state);
        let Err(error) = crate::supervise::spawn(crate::supervise::Kind::SiteHealth, move || self.work()) else { return Ok(()) };
        let mut state = self.lock();
        state.running -= 1;
        if state.running > 0 { Ok(()) } else { Err(error) }
    }

    /// Runs queued jobs until none is left. Ending is decided under the
    /// lock that `submit` queues under, so a job is never left queued with
    /// no thread to run it.
    fn work(&'static self) {
        let _leaving = Leaving(self);
        loop {
            let job = {
                let mut state = self.lock();
                match state.queue.pop_front() {
                    Some(job) => job,
                    None => {
                        state.running -= 1;
                        return;
                    }
                }
            };
            job();
        }
    }

    #[cfg(test)]
    fn queued(&self) -> usize {
        self.lock().queue.len()
    }

    fn lock(&self) -> MutexGuard<'_, AskersState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A thread of `Askers` that a panic ends (supervise logged it) leaves
/// its place, and another takes up the queue.
struct Leaving(&'static Askers);

impl Drop for Leaving {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let mut state = self.0.lock();
        state.running -= 1;
        if let Some(job) = state.queue.pop_front() {
            drop(state);
            let _ = self.0.submit(job);
        }
    }
}

fn step(state: &State, now: Instant) -> Step {
    match &state.last {
        Some((at, answer)) if now.saturating_duration_since(*at) < FRESH => Step::Give(answer.clone()),
        _ if state.asking => Step::Wait,
        _ => Step::Ask,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    #[test]
    fn when_to_ask() {
        let start = Instant::now();
        let later = |seconds: f64| start + Duration::from_secs_f64(seconds);
        let ok = Some((start, Ok(())));
        let down = Some((start, Err("down".to_string())));
        let cases = [
            ("never asked", None, false, 0.0, Step::Ask),
            ("asking for the first time", None, true, 0.0, Step::Wait),
            ("a fresh answer", ok.clone(), false, 0.5, Step::Give(Ok(()))),
            ("a fresh failure is given too", down.clone(), false, 0.5, Step::Give(Err("down".into()))),
            ("a fresh answer while asking again", ok.clone(), true, 0.5, Step::Give(Ok(()))),
            ("a stale answer", ok.clone(), false, 1.0, Step::Ask),
            ("a stale answer, asking again", down, true, 5.0, Step::Wait),
        ];
        for (case, last, asking, at, expected) in cases {
            assert_eq!(step(&State { last, asking }, later(at)), expected, "{case}");
        }
    }

    /// A site that does not answer is asked once however many callers
    /// come; each gives up at its own deadline; the answer, when it comes,
    /// is the next caller's.
    #[test]
    fn callers_share_one_ask() {
        let health = Arc::new(SiteHealth::default());
        let asks = Arc::new(AtomicUsize::new(0));
        let (started, ask_started) = mpsc::channel::<()>();
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let ask = || {
            let (asks, started, released) = (Arc::clone(&asks), started.clone(), Arc::clone(&released));
            move || {
                asks.fetch_add(1, Ordering::SeqCst);
                let _ = started.send(());
                let _ = released.lock().unwrap().recv();
                Ok(())
            }
        };
        health.start(ask());
        ask_started.recv_timeout(Duration::from_secs(30)).expect("the ask started");
        let waiting: Vec<_> = (0..10)
            .map(|_| {
                let (health, ask) = (Arc::clone(&health), ask());
                std::thread::spawn(move || health.answer_by(Instant::now() + Duration::from_millis(20), ask))
            })
            .collect();
        for caller in waiting {
            assert!(caller.join().unwrap().unwrap_err().starts_with("no answer in time"));
        }
        release.send(()).unwrap();
        assert_eq!(health.answer_by(Instant::now() + Duration::from_secs(30), ask()), Ok(()));
        assert_eq!(asks.load(Ordering::SeqCst), 1, "one ask for every caller");
    }

    /// 800 sites asked at once at start held 800 threads: the asks of
    /// more sites than `MAX_ASKS_AT_ONCE` run that many at a time, the
    /// others queued, and every one is answered.
    #[test]
    fn many_sites_asked_at_once_share_a_bounded_number_of_threads() {
        let n_sites = MAX_ASKS_AT_ONCE + 24;
        let healths: Vec<Arc<SiteHealth>> = (0..n_sites).map(|_| Arc::new(SiteHealth::default())).collect();
        let asking = Arc::new(AtomicUsize::new(0));
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        for health in &healths {
            let (asking, released) = (Arc::clone(&asking), Arc::clone(&released));
            health.start(move || {
                asking.fetch_add(1, Ordering::SeqCst);
                let _ = released.lock().unwrap().recv();
                asking.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            });
        }
        // Until every ask runs (no bound) or the bound is reached with the
        // rest queued; other tests' asks may hold a thread for a moment.
        let give_up = Instant::now() + Duration::from_secs(60);
        while asking.load(Ordering::SeqCst) < n_sites
            && !(asking.load(Ordering::SeqCst) == MAX_ASKS_AT_ONCE && ASKERS.queued() >= n_sites - MAX_ASKS_AT_ONCE)
            && Instant::now() < give_up
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(asking.load(Ordering::SeqCst), MAX_ASKS_AT_ONCE, "asks running at once");
        for _ in 0..n_sites {
            release.send(()).unwrap();
        }
        for health in &healths {
            assert_eq!(health.answer_by(Instant::now() + Duration::from_secs(30), || Err("asked again".into())), Ok(()));
        }
    }
}
