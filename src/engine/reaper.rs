//! The reaper's clock: asks each site's backend to delete every expired
//! object this server created, at start and then every `REAP_EVERY`, so a
//! server that crashed (or lost its connection) leaves nothing behind for
//! long; and looks at its open sandboxes every `SANDBOXES_EVERY`. What
//! "expired" means and how it is deleted is the backend's.
//!
//! Every site shares a few threads (`WORKERS` at most), each taking the
//! site whose turn is due first: an idle site holds no thread of its own
//! (800 sites held 800 reaper threads before). A site whose API hangs holds
//! one worker until its call gives up; the others take the other sites.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crate::engine::port::Backend;
use crate::outputs::Store;
use crate::supervise;

/// How often the reaper looks.
pub const REAP_EVERY: Duration = Duration::from_secs(60);

/// Open sandboxes are looked at more often: one idle past its timeout, or
/// whose runner ended, is closed within this (while a worker is free).
const SANDBOXES_EVERY: Duration = Duration::from_secs(5);

/// The most threads that reap, over every site: enough that a few sites
/// whose API hangs hold no other's turn.
const WORKERS: usize = 4;

/// One site the reaper looks after.
pub struct Site {
    pub backend: Arc<dyn Backend>,
    /// The output store, reaped on this site's turns (the store is shared
    /// by every site, so one site carries it).
    pub outputs: Option<Arc<Store>>,
}

/// When a site's next turns are, and whether a worker has it now.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Clock {
    next_look: Instant,
    next_reap: Instant,
    busy: bool,
}

/// What a free worker does next.
#[derive(Debug, PartialEq)]
enum Pick {
    /// Take this site now; `reap` also deletes what expired.
    Take { site: usize, reap: bool },
    /// Nothing is due: wait until then (`None`: until a worker hands a site
    /// back).
    WaitUntil(Option<Instant>),
}

/// The free site whose look is due first, or how long to wait.
fn pick(clocks: &[Clock], now: Instant) -> Pick {
    let free = clocks.iter().enumerate().filter(|(_, clock)| !clock.busy);
    match free.min_by_key(|(_, clock)| clock.next_look) {
        Some((site, clock)) if clock.next_look <= now => Pick::Take { site, reap: clock.next_reap <= now },
        Some((_, clock)) => Pick::WaitUntil(Some(clock.next_look)),
        None => Pick::WaitUntil(None),
    }
}

/// The site's clock after a turn that ended at `now`.
fn after_turn(clock: Clock, reaped: bool, now: Instant, every: Duration) -> Clock {
    Clock { next_look: now + SANDBOXES_EVERY.min(every), next_reap: if reaped { now + every } else { clock.next_reap }, busy: false }
}

struct Shared {
    sites: Vec<Site>,
    clocks: Mutex<Vec<Clock>>,
    handed_back: Condvar,
    every: Duration,
}

/// Reaps every site once now, then on its clock, on at most `WORKERS`
/// threads for the life of the process (essential ones: a panic fails
/// `/readyz`).
pub fn start(sites: Vec<Site>, every: Duration) -> std::io::Result<()> {
    let now = Instant::now();
    let clocks = sites.iter().map(|_| Clock { next_look: now, next_reap: now, busy: false }).collect();
    let workers = sites.len().min(WORKERS);
    let shared = Arc::new(Shared { sites, clocks: Mutex::new(clocks), handed_back: Condvar::new(), every });
    for _ in 0..workers {
        let shared = Arc::clone(&shared);
        supervise::spawn(supervise::Kind::Reaper, move || work(&shared))?;
    }
    Ok(())
}

fn work(shared: &Shared) {
    let mut clocks = shared.lock();
    loop {
        match pick(&clocks, Instant::now()) {
            Pick::Take { site, reap } => {
                clocks[site].busy = true;
                drop(clocks);
                turn(&shared.sites[site], reap);
                clocks = shared.lock();
                clocks[site] = after_turn(clocks[site], reap, Instant::now(), shared.every);
                shared.handed_back.notify_all();
            }
            Pick::WaitUntil(Some(until)) => {
                let wait = until.saturating_duration_since(Instant::now());
                clocks = shared.handed_back.wait_timeout(clocks, wait).unwrap_or_else(PoisonError::into_inner).0;
            }
            Pick::WaitUntil(None) => clocks = shared.handed_back.wait(clocks).unwrap_or_else(PoisonError::into_inner),
        }
    }
}

fn turn(site: &Site, reap: bool) {
    if reap {
        site.backend.reap(SystemTime::now());
        if let Some(outputs) = &site.outputs {
            outputs.reap(SystemTime::now());
        }
    }
    crate::engine::sandboxes::reap(site.backend.as_ref());
    site.backend.rest();
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Vec<Clock>> {
        self.clocks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_site_a_free_worker_takes() {
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let clock = |look: u64, reap: u64, busy: bool| Clock { next_look: at(look), next_reap: at(reap), busy };
        let cases = [
            ("no site", vec![], Pick::WaitUntil(None)),
            ("one due: look and reap", vec![clock(0, 0, false)], Pick::Take { site: 0, reap: true }),
            ("one due to look only", vec![clock(0, 60, false)], Pick::Take { site: 0, reap: false }),
            ("the earliest due first", vec![clock(3, 60, false), clock(1, 60, false)], Pick::Take { site: 1, reap: false }),
            ("a busy site is not taken twice", vec![clock(0, 0, true), clock(4, 60, false)], Pick::Take { site: 1, reap: false }),
            ("none due: wait for the earliest", vec![clock(15, 60, false), clock(12, 60, false)], Pick::WaitUntil(Some(at(12)))),
            ("every site busy: wait for one back", vec![clock(0, 0, true), clock(0, 0, true)], Pick::WaitUntil(None)),
        ];
        for (case, clocks, expected) in cases {
            assert_eq!(pick(&clocks, at(10)), expected, "{case}");
        }
    }

    #[test]
    fn a_turn_sets_the_next_ones() {
        let start = Instant::now();
        let every = Duration::from_secs(60);
        let before = Clock { next_look: start, next_reap: start + Duration::from_secs(30), busy: true };
        let looked = after_turn(before, false, start, every);
        assert_eq!(looked, Clock { next_look: start + SANDBOXES_EVERY, next_reap: before.next_reap, busy: false });
        let reaped = after_turn(before, true, start, every);
        assert_eq!(reaped.next_reap, start + every);
        // A reap clock shorter than the sandbox look sets both.
        let short = after_turn(before, true, start, Duration::from_secs(1));
        assert_eq!((short.next_look, short.next_reap), (start + Duration::from_secs(1), start + Duration::from_secs(1)));
    }
}
