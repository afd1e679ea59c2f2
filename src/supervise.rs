//! Threads the server starts outside a scope, started one way: `spawn`
//! names the thread and watches its body. A panic there is logged (one
//! `error` line: the thread's name and kind, whether it is essential, the
//! panic's message), counted for `/metrics`
//! (`mcp_k8s_thread_panics_total{thread="<kind>"}`) and, when the thread is
//! essential, kept: `/readyz` fails from then on, naming it. The panic then
//! goes on unwinding as before, so whoever joins the thread still sees it;
//! nothing else changes.
//!
//! `Kind` lists every such thread and decides, in one place, which are
//! essential: those whose loss leaves the server unable to do its job (the
//! reaper, a warm pool's manager, the signal handler, the stdio threads).
//! The others serve one request, run or call and go with it.
//!
//! Like `log` and `metrics`, a leaf every layer may use: it knows the
//! threads' names, not what they do. Out of its reach on purpose: scoped
//! threads (a panic there reaches the scope's owner when the scope ends,
//! and from a tool call the protocol's `catch_unwind` answers it) and the
//! in-sandbox runner's threads (the runner has no `/metrics` and no log
//! the server reads). The HTTP accept loop is the main thread: a panic
//! there ends the process.

use std::any::Any;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;

use serde_json::json;

use crate::{echo, log, metrics};

/// What a supervised thread is: the `thread` label of its counter, and
/// whether its loss fails `/readyz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Deletes what expired, every minute for the life of the process.
    Reaper,
    /// A warm pool's manager (`pool-<name>`): keeps the pool filled.
    PoolManager,
    /// Turns SIGTERM and SIGINT into a shutdown; without it they are
    /// queued and never acted on.
    Signals,
    /// stdio: reads stdin into the protocol.
    StdioReader,
    /// stdio: moves replies from the protocol into the bounded queue.
    StdioQueue,
    /// stdio: owns stdout.
    StdioWriter,
    /// One tool call or task operation (`call-<tool>`).
    Call,
    /// One HTTP connection.
    HttpConnection,
    /// Accepts the probes' own connections (MCP_K8S_PROBE_ADDR).
    ProbeListener,
    /// Follows one background run to its end (`job-<run id>`).
    BackgroundFollower,
    /// Waits for one cancelled background run to end (`cancel-<run id>`).
    CancelFinisher,
    /// Watches one run's pods (Kubernetes).
    PodWatch,
    /// Polls one run's container (Docker).
    ContainerWatch,
    /// Kills one stopped container after its grace (Docker).
    ContainerKill,
    /// Removes one run's containers after its answer (Docker).
    ContainerRemove,
    /// Reads one kubeconfig exec plugin's output pipe.
    ExecPluginReader,
    /// Sends finished spans to the OTLP endpoint in batches.
    TraceExporter,
    /// Asks one site whether it answers, for `describe_environment`.
    SiteHealth,
    /// Writes the audit trail's lines, so a sink that stops taking them
    /// holds this thread and no run.
    AuditWriter,
}

impl Kind {
    pub const ALL: [Kind; 19] = [
        Kind::Reaper,
        Kind::PoolManager,
        Kind::Signals,
        Kind::StdioReader,
        Kind::StdioQueue,
        Kind::StdioWriter,
        Kind::Call,
        Kind::HttpConnection,
        Kind::ProbeListener,
        Kind::BackgroundFollower,
        Kind::CancelFinisher,
        Kind::PodWatch,
        Kind::ContainerWatch,
        Kind::ContainerKill,
        Kind::ContainerRemove,
        Kind::ExecPluginReader,
        Kind::TraceExporter,
        Kind::SiteHealth,
        Kind::AuditWriter,
    ];

    /// The counter's label, and the thread's name unless `spawn_named`
    /// gives one.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Reaper => "reaper",
            Kind::PoolManager => "pool",
            Kind::Signals => "signals",
            Kind::StdioReader => "stdio-reader",
            Kind::StdioQueue => "stdio-queue",
            Kind::StdioWriter => "stdio-writer",
            Kind::Call => "call",
            Kind::HttpConnection => "http-connection",
            Kind::ProbeListener => "probe-listener",
            Kind::BackgroundFollower => "background-follower",
            Kind::CancelFinisher => "cancel-finisher",
            Kind::PodWatch => "pod-watch",
            Kind::ContainerWatch => "container-watch",
            Kind::ContainerKill => "container-kill",
            Kind::ContainerRemove => "container-remove",
            Kind::ExecPluginReader => "exec-plugin-reader",
            Kind::TraceExporter => "trace-exporter",
            Kind::SiteHealth => "site-health",
            Kind::AuditWriter => "audit-writer",
        }
    }

    pub fn parse(text: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.as_str() == text)
    }

    /// Whether losing a thread of this kind leaves the server unable to do
    /// its job, so that `/readyz` must fail.
    fn is_essential(self) -> bool {
        match self {
            Kind::Reaper
            | Kind::PoolManager
            | Kind::Signals
            | Kind::StdioReader
            | Kind::StdioQueue
            | Kind::StdioWriter
            | Kind::ProbeListener
            | Kind::AuditWriter => true,
            Kind::Call
            | Kind::HttpConnection
            | Kind::BackgroundFollower
            | Kind::CancelFinisher
            | Kind::PodWatch
            | Kind::ContainerWatch
            | Kind::ContainerKill
            | Kind::ContainerRemove
            | Kind::ExecPluginReader
            | Kind::TraceExporter
            | Kind::SiteHealth => false,
        }
    }
}

/// Starts `body` on a thread named after `kind`, under watch.
pub fn spawn<T, F>(kind: Kind, body: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    spawn_named(kind, kind.as_str().to_string(), body)
}

/// `spawn` with a thread name of its own (`pool-python`, `job-1a2b3c4d`):
/// the log line and `/readyz` name the thread by it; the counter by `kind`.
pub fn spawn_named<T, F>(kind: Kind, name: String, body: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    SUPERVISOR.spawn(kind, name, body)
}

/// The essential threads a panic ended, by name, oldest first: `/readyz`
/// fails while there is one.
pub fn lost_essential_threads() -> Vec<String> {
    SUPERVISOR.lost_essential_threads()
}

/// Test hook (`MCP_K8S_TEST_PANIC_THREAD`): the next thread of `kind`
/// started panics before its body runs, so tests can see what a panic in
/// it does. Only `main` calls this, from the operator's environment, and
/// only in a test build (the `testing` feature).
#[cfg(feature = "testing")]
pub fn panic_next(kind: Kind) {
    SUPERVISOR.panic_next(kind);
}

/// A panic's message: the `&str` or `String` it was given, else empty.
pub fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str)).unwrap_or_default()
}

/// The message an injected panic carries.
const INJECTED_PANIC: &str = "panic injected by MCP_K8S_TEST_PANIC_THREAD";

static SUPERVISOR: Supervisor = Supervisor::new();

/// What the process's supervised threads left behind; one per process
/// (unit tests make their own, so that their panics leave the process's
/// readiness alone).
struct Supervisor {
    /// Essential threads a panic ended, by name.
    lost: Mutex<Vec<String>>,
    /// `Kind::ALL`'s index plus one of the kind whose next thread panics;
    /// zero for none.
    injected: AtomicU8,
}

impl Supervisor {
    const fn new() -> Supervisor {
        Supervisor { lost: Mutex::new(Vec::new()), injected: AtomicU8::new(0) }
    }

    fn spawn<T, F>(&'static self, kind: Kind, name: String, body: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        // Only a test build injects panics (`panic_next`); in a release
        // this is a constant `false` and the branch below is compiled out.
        let inject = cfg!(feature = "testing") && self.injected.compare_exchange(code(kind), 0, Ordering::SeqCst, Ordering::SeqCst).is_ok();
        metrics::thread_started(kind.as_str());
        std::thread::Builder::new().name(name.clone()).spawn(move || {
            // The body is not touched after a panic (it is unwound and
            // dropped), so no broken invariant of it can be observed.
            let ran = catch_unwind(AssertUnwindSafe(|| {
                if inject {
                    panic!("{INJECTED_PANIC}");
                }
                body()
            }));
            match ran {
                Ok(value) => value,
                Err(payload) => {
                    self.record_panic(kind, &name, panic_message(&*payload));
                    resume_unwind(payload)
                }
            }
        })
    }

    fn record_panic(&self, kind: Kind, name: &str, message: &str) {
        // Counted before the line is written: whoever reads the line finds
        // it counted (a test saw the count still 0 right after the line).
        metrics::thread_panicked(kind.as_str());
        if kind.is_essential() {
            self.lost.lock().unwrap_or_else(PoisonError::into_inner).push(name.to_string());
        }
        // The message is the program's own text (an assertion, an
        // `expect`), shortened like any text a line quotes; the process's
        // panic hook has already logged where it was raised.
        log::error(
            "thread stopped by a panic",
            &[
                ("thread", json!(name)),
                ("kind", json!(kind.as_str())),
                ("essential", json!(kind.is_essential())),
                ("message", json!(echo::shorten(message))),
            ],
        );
    }

    fn lost_essential_threads(&self) -> Vec<String> {
        self.lost.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    #[cfg(feature = "testing")]
    fn panic_next(&self, kind: Kind) {
        self.injected.store(code(kind), Ordering::SeqCst);
    }
}

fn code(kind: Kind) -> u8 {
    Kind::ALL.iter().position(|candidate| *candidate == kind).map_or(0, |index| index as u8 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panics(kind: Kind) -> u64 {
        metrics::thread_panics().get(kind.as_str()).copied().unwrap_or(0)
    }

    #[test]
    fn kinds_have_distinct_names_that_parse_back() {
        for kind in Kind::ALL {
            assert_eq!(Kind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(Kind::parse("nope"), None);
    }

    // A panic in a thread of each kind is counted under its kind, ends the
    // thread as a panic for whoever joins it, and is kept for `/readyz`
    // exactly when the kind is essential. Through a supervisor of the
    // test's own: the process's readiness stays untouched.
    /// The panic counters are the process's: the tests that read them take
    /// turns, or one's panic shows in the other's count.
    fn counters_turn() -> std::sync::MutexGuard<'static, ()> {
        static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
        TURN.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[test]
    fn a_panic_in_each_kind_is_counted_and_an_essential_one_is_kept() {
        let _turn = counters_turn();
        static TESTED: Supervisor = Supervisor::new();
        for kind in Kind::ALL {
            let before = panics(kind);
            let name = format!("test-{}", kind.as_str());
            let joined = TESTED.spawn(kind, name.clone(), || -> u32 { panic!("test panic") }).unwrap().join();
            let payload = joined.expect_err("the panic reaches the joiner");
            assert_eq!(panic_message(&*payload), "test panic");
            assert_eq!(panics(kind), before + 1, "{kind:?} counted");
            assert_eq!(TESTED.lost_essential_threads().contains(&name), kind.is_essential(), "{kind:?} kept for /readyz");
        }
        assert!(SUPERVISOR.lost_essential_threads().iter().all(|name| !name.starts_with("test-")));
    }

    #[test]
    fn a_body_that_returns_is_neither_counted_nor_kept() {
        let _turn = counters_turn();
        static TESTED: Supervisor = Supervisor::new();
        let before = panics(Kind::Reaper);
        assert_eq!(TESTED.spawn(Kind::Reaper, "quiet".into(), || 7).unwrap().join().unwrap(), 7);
        assert_eq!(panics(Kind::Reaper), before);
        assert!(TESTED.lost_essential_threads().is_empty());
    }

    #[test]
    fn the_hook_panics_only_the_next_thread_of_its_kind() {
        let _turn = counters_turn();
        static TESTED: Supervisor = Supervisor::new();
        TESTED.panic_next(Kind::PoolManager);
        let other = TESTED.spawn(Kind::ContainerKill, "other".into(), || 1).unwrap().join();
        assert_eq!(other.ok(), Some(1), "another kind runs its body");
        let first = TESTED.spawn(Kind::PoolManager, "pool-first".into(), || 2).unwrap().join();
        assert_eq!(first.map_err(|payload| panic_message(&*payload).to_string()), Err(INJECTED_PANIC.to_string()));
        let second = TESTED.spawn(Kind::PoolManager, "pool-second".into(), || 3).unwrap().join();
        assert_eq!(second.ok(), Some(3), "only the next one panics");
        assert_eq!(TESTED.lost_essential_threads(), ["pool-first"]);
    }
}
