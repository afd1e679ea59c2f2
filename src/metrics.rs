//! Process-wide counters behind `/metrics`, rendered in the Prometheus text
//! exposition format (version 0.0.4).
//!
//! This module owns the numbers and their text form only. It knows nothing
//! of HTTP (the transport serves `render()`), nor of runs: callers pass the
//! label values, which are the contract's wire words (`succeeded`,
//! `OOMKilled`) chosen by `tools`, fixed operation names from `engine`,
//! and thread kinds from `supervise`.
//! Like `log`, it is a leaf every layer may use. Labels are only ever those
//! closed sets, never caller data, so the series stay few; a caller's name
//! comes from the operator's tokens file, a set as closed as the pools'.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// The content type Prometheus expects for `render()`'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds (seconds) of the duration histograms: from a quick command
/// to the longest `timeout_s` most operators allow.
pub const DURATION_BUCKETS_S: [f64; 12] = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0];

/// A value that goes up and down with the work in progress.
#[derive(Clone, Copy, Debug)]
pub enum Gauge {
    /// Runs holding a slot: their Job exists or is being created.
    RunsInFlight,
    /// Runs waiting for a slot (`MCP_K8S_MAX_CONCURRENT`).
    RunsQueued,
}

/// Counts one unit of a gauge while it lives.
#[must_use = "the gauge goes back down when this is dropped"]
pub struct GaugeGuard(Gauge);

/// Raises `gauge` by one until the returned guard is dropped.
pub fn track(gauge: Gauge) -> GaugeGuard {
    gauge_cell(gauge).fetch_add(1, Ordering::Relaxed);
    GaugeGuard(gauge)
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        gauge_cell(self.0).fetch_sub(1, Ordering::Relaxed);
    }
}

/// One finished run on `site` (`default` without named sites): its wire
/// `status` and `reason` (empty when none), how long the whole run took
/// (queue, start, command, collection) and how long the command itself ran.
pub fn record_run(site: &str, status: &'static str, reason: &'static str, run_time: Duration, command_time: Duration) {
    let mut state = lock();
    *state.runs.entry((site.to_string(), status, reason)).or_insert(0) += 1;
    state.run_seconds.observe(run_time.as_secs_f64());
    state.command_seconds.observe(command_time.as_secs_f64());
}

/// A run a caller asked for on `site`: `admission` is `admitted` or the
/// limit that refused it (`concurrent_runs`, `cpu_seconds_per_hour`,
/// `images`, `sites`). Site names, like callers', are the operator's.
pub fn caller_run(caller: &str, site: &str, admission: &'static str) {
    *lock().caller_runs.entry((caller.to_string(), site.to_string(), admission)).or_insert(0) += 1;
}

/// CPU-seconds charged to a caller when a run of its ended.
pub fn caller_cpu_seconds(caller: &str, seconds: f64) {
    *lock().caller_cpu_seconds.entry(caller.to_string()).or_insert(0.0) += seconds;
}

/// A Kubernetes API call the engine needed failed; `operation` is a fixed
/// name such as `create_job`.
pub fn api_error(operation: &'static str) {
    *lock().api_errors.entry(operation).or_insert(0) += 1;
}

/// A run asked a warm pool for a sandbox: a hit took one, a miss ran cold.
pub fn pool_claim(pool: &str, hit: bool) {
    let mut state = lock();
    let counts = state.pools.entry(pool.to_string()).or_default();
    if hit {
        counts.hits += 1;
    } else {
        counts.misses += 1;
    }
}

/// A pool is back to its size after falling short.
pub fn pool_refilled(took: Duration) {
    lock().pool_refill_seconds.observe(took.as_secs_f64());
}

/// A pool's size and ready sandboxes now.
pub fn pool_size(pool: &str, size: usize, ready: usize) {
    let mut state = lock();
    let counts = state.pools.entry(pool.to_string()).or_default();
    counts.size = size as u64;
    counts.ready = ready as u64;
}

/// A supervised thread of `kind` (`supervise::Kind`'s label) started:
/// its panic counter is shown from then on, at zero until one panics.
pub fn thread_started(kind: &'static str) {
    lock().thread_panics.entry(kind).or_insert(0);
}

/// A supervised thread of `kind` ended by a panic.
pub fn thread_panicked(kind: &'static str) {
    *lock().thread_panics.entry(kind).or_insert(0) += 1;
}

/// Spans by what became of them: `exported`, `dropped` (the queue was
/// full), `failed` (the endpoint refused or could not be reached).
pub fn spans(outcome: &'static str, count: u64) {
    *lock().spans.entry(outcome).or_insert(0) += count;
}

/// Threads ended by a panic, by kind, for every kind started so far.
pub fn thread_panics() -> BTreeMap<&'static str, u64> {
    lock().thread_panics.clone()
}

/// Everything, in the Prometheus text format.
pub fn render() -> String {
    let state = lock();
    let mut text = String::new();
    header(&mut text, "mcp_k8s_runs_total", "counter", "Finished runs by site, status and reason.");
    for ((site, status, reason), count) in &state.runs {
        let _ = writeln!(text, "mcp_k8s_runs_total{{site=\"{site}\",status=\"{status}\",reason=\"{reason}\"}} {count}");
    }
    state.run_seconds.render(&mut text, "mcp_k8s_run_duration_seconds", "Whole runs: queue, pod start, command and collection.");
    state.command_seconds.render(&mut text, "mcp_k8s_command_duration_seconds", "The command alone, as the runner measured it.");
    for (gauge, name, help) in [
        (Gauge::RunsInFlight, "mcp_k8s_runs_in_flight", "Runs holding a slot now."),
        (Gauge::RunsQueued, "mcp_k8s_runs_queued", "Runs waiting for a slot now."),
    ] {
        header(&mut text, name, "gauge", help);
        let _ = writeln!(text, "{name} {}", gauge_cell(gauge).load(Ordering::Relaxed));
    }
    header(&mut text, "mcp_k8s_api_errors_total", "counter", "Failed Kubernetes API calls a run needed, by operation.");
    for (operation, count) in &state.api_errors {
        let _ = writeln!(text, "mcp_k8s_api_errors_total{{operation=\"{operation}\"}} {count}");
    }
    header(&mut text, "mcp_k8s_thread_panics_total", "counter", "Server threads ended by a panic, by kind.");
    for (thread, count) in &state.thread_panics {
        let _ = writeln!(text, "mcp_k8s_thread_panics_total{{thread=\"{thread}\"}} {count}");
    }
    if !state.spans.is_empty() {
        header(&mut text, "mcp_k8s_spans_total", "counter", "Trace spans by outcome: exported, dropped (queue full), failed.");
        for (outcome, count) in &state.spans {
            let _ = writeln!(text, "mcp_k8s_spans_total{{outcome=\"{outcome}\"}} {count}");
        }
    }
    if !state.caller_runs.is_empty() {
        header(
            &mut text,
            "mcp_k8s_caller_runs_total",
            "counter",
            "Runs callers asked for, by caller, site and admission (admitted, or the limit that refused).",
        );
        for ((caller, site, admission), count) in &state.caller_runs {
            let _ = writeln!(text, "mcp_k8s_caller_runs_total{{caller=\"{caller}\",site=\"{site}\",admission=\"{admission}\"}} {count}");
        }
        header(
            &mut text,
            "mcp_k8s_caller_cpu_seconds_total",
            "counter",
            "CPU-seconds charged to callers: a run's CPU times its command's run time.",
        );
        for (caller, seconds) in &state.caller_cpu_seconds {
            let _ = writeln!(text, "mcp_k8s_caller_cpu_seconds_total{{caller=\"{caller}\"}} {seconds:.3}");
        }
    }
    if !state.pools.is_empty() {
        for (name, kind, help) in [
            ("mcp_k8s_pool_size", "gauge", "Sandboxes a warm pool keeps."),
            ("mcp_k8s_pool_ready", "gauge", "Warm sandboxes ready now."),
            ("mcp_k8s_pool_hits_total", "counter", "Runs that took a warm sandbox."),
            ("mcp_k8s_pool_misses_total", "counter", "Runs that fitted a pool with no sandbox ready, and ran cold."),
        ] {
            header(&mut text, name, kind, help);
            for (pool, counts) in &state.pools {
                let value = match name {
                    "mcp_k8s_pool_size" => counts.size,
                    "mcp_k8s_pool_ready" => counts.ready,
                    "mcp_k8s_pool_hits_total" => counts.hits,
                    _ => counts.misses,
                };
                let _ = writeln!(text, "{name}{{pool=\"{pool}\"}} {value}");
            }
        }
        state.pool_refill_seconds.render(
            &mut text,
            "mcp_k8s_pool_refill_seconds",
            "From a pool falling short of its size to its being full again.",
        );
    }
    text
}

/// A pool's counts, as `/metrics` renders them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct PoolCounts {
    pub size: u64,
    pub ready: u64,
    pub hits: u64,
    pub misses: u64,
}

struct State {
    caller_runs: BTreeMap<(String, String, &'static str), u64>,
    caller_cpu_seconds: BTreeMap<String, f64>,
    pools: BTreeMap<String, PoolCounts>,
    pool_refill_seconds: Histogram,
    runs: BTreeMap<(String, &'static str, &'static str), u64>,
    run_seconds: Histogram,
    command_seconds: Histogram,
    api_errors: BTreeMap<&'static str, u64>,
    thread_panics: BTreeMap<&'static str, u64>,
    spans: BTreeMap<&'static str, u64>,
}

struct Histogram {
    /// Observations at or below each bound of `DURATION_BUCKETS_S`
    /// (not cumulative here; `render` adds them up).
    buckets: [u64; DURATION_BUCKETS_S.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    const fn new() -> Histogram {
        Histogram { buckets: [0; DURATION_BUCKETS_S.len()], count: 0, sum: 0.0 }
    }

    fn observe(&mut self, seconds: f64) {
        if let Some(index) = DURATION_BUCKETS_S.iter().position(|bound| seconds <= *bound) {
            self.buckets[index] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, text: &mut String, name: &str, help: &str) {
        header(text, name, "histogram", help);
        let mut cumulative = 0;
        for (bound, count) in DURATION_BUCKETS_S.iter().zip(self.buckets) {
            cumulative += count;
            let _ = writeln!(text, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(text, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(text, "{name}_sum {}", self.sum);
        let _ = writeln!(text, "{name}_count {}", self.count);
    }
}

static STATE: Mutex<State> = Mutex::new(State {
    caller_runs: BTreeMap::new(),
    caller_cpu_seconds: BTreeMap::new(),
    pools: BTreeMap::new(),
    pool_refill_seconds: Histogram::new(),
    runs: BTreeMap::new(),
    run_seconds: Histogram::new(),
    command_seconds: Histogram::new(),
    api_errors: BTreeMap::new(),
    thread_panics: BTreeMap::new(),
    spans: BTreeMap::new(),
});
static RUNS_IN_FLIGHT: AtomicI64 = AtomicI64::new(0);
static RUNS_QUEUED: AtomicI64 = AtomicI64::new(0);

fn gauge_cell(gauge: Gauge) -> &'static AtomicI64 {
    match gauge {
        Gauge::RunsInFlight => &RUNS_IN_FLIGHT,
        Gauge::RunsQueued => &RUNS_QUEUED,
    }
}

/// Counters stay usable after a panic elsewhere: a poisoned lock only
/// means some thread died while holding it, and the numbers are still sane.
fn lock() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn header(text: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut histogram = Histogram::new();
        for seconds in [0.2, 0.7, 3.0, 5000.0] {
            histogram.observe(seconds);
        }
        let mut text = String::new();
        histogram.render(&mut text, "h", "help");
        for line in [
            "h_bucket{le=\"0.5\"} 1",
            "h_bucket{le=\"1\"} 2",
            "h_bucket{le=\"5\"} 3",
            "h_bucket{le=\"1800\"} 3",
            "h_bucket{le=\"+Inf\"} 4",
            "h_count 4",
            "h_sum 5003.9",
        ] {
            assert!(text.lines().any(|candidate| candidate == line), "missing `{line}` in:\n{text}");
        }
    }

    // The statics are shared by every test in this binary, so this one
    // test owns them and compares differences, not absolute values.
    #[test]
    fn runs_gauges_api_errors_and_thread_panics_appear_in_the_text() {
        record_run("default", "failed", "OOMKilled", Duration::from_secs(3), Duration::from_secs(2));
        api_error("create_job");
        thread_started("signals");
        let queued = track(Gauge::RunsQueued);
        let text = render();
        assert!(text.contains("mcp_k8s_runs_total{site=\"default\",status=\"failed\",reason=\"OOMKilled\"} "), "{text}");
        assert!(text.contains("mcp_k8s_api_errors_total{operation=\"create_job\"} "), "{text}");
        assert!(text.contains("# TYPE mcp_k8s_thread_panics_total counter"), "{text}");
        assert!(text.contains("mcp_k8s_thread_panics_total{thread=\"signals\"} "), "{text}");
        assert!(text.contains("# TYPE mcp_k8s_run_duration_seconds histogram"), "{text}");
        assert!(text.contains("mcp_k8s_runs_queued 1"), "{text}");
        drop(queued);
        assert!(render().contains("mcp_k8s_runs_queued 0"));
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap_or_default();
            assert!(value.parse::<f64>().is_ok(), "not a sample line: {line}");
        }
    }
}
