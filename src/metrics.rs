//! Process-wide counters behind `/metrics`, rendered in the Prometheus text
//! exposition format (version 0.0.4).
//!
//! This module owns the numbers and their text form only. It knows nothing
//! of HTTP (the transport serves `render()`), nor of runs: callers pass the
//! label values, which are the contract's wire words (`succeeded`,
//! `OOMKilled`) chosen by `tools`, fixed operation names from `engine`,
//! thread kinds from `supervise`, tool names and call outcomes from
//! `protocol`, and route names and status codes from the HTTP transport.
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
const DURATION_BUCKETS_S: [f64; 12] = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0];

/// Upper bounds (seconds) of the tool calls' histogram: a call that only
/// reads (`list_jobs`, `fetch_job`) answers in milliseconds, a `run_job`
/// takes as long as its run.
const TOOL_CALL_BUCKETS_S: [f64; 14] = [0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0];

/// The server's version, as `mcp_k8s_build_info` shows it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

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

/// A `tools/call` (or task method) finished: `tool` is the tool's name
/// (or the task method's), `outcome` how it ended (`success`,
/// `tool_error`, `error`, `panic`, `cancelled`), `took` from the call's
/// start to its answer.
pub fn tool_call(tool: &'static str, outcome: &'static str, took: Duration) {
    let mut state = lock();
    *state.tool_calls.entry((tool, outcome)).or_insert(0) += 1;
    state.tool_call_seconds.entry(tool).or_insert_with(|| Histogram::new(&TOOL_CALL_BUCKETS_S)).observe(took.as_secs_f64());
}

/// An HTTP answer went out: `route` is one of `ROUTES` (never the raw
/// path, which a client chooses), `code` its status.
pub fn http_request(route: &'static str, code: u16) {
    *lock().http_requests.entry((route, code)).or_insert(0) += 1;
}

/// The `route` label values `http_request` takes: the paths the server
/// serves, and `other` for any other path or a request whose head could
/// not be read.
pub const ROUTES: [&str; 7] = ["/mcp", "/sse", "/messages", "/healthz", "/readyz", "/metrics", "other"];

/// This server opened a sandbox.
pub fn sandbox_opened() {
    lock().sandboxes_opened += 1;
}

/// This server closed a sandbox: `reason` is `closed` (its caller closed
/// it, or its opening failed), `idle`, `lifetime` or `ended` (the reaper).
pub fn sandbox_closed(reason: &'static str) {
    *lock().sandboxes_closed.entry(reason).or_insert(0) += 1;
}

/// The sandboxes open now, as the reaper last listed them: every
/// replica's, since they share one store.
pub fn sandboxes_open(open: usize) {
    lock().sandboxes_open = Some(open as u64);
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
    header(&mut text, "mcp_k8s_build_info", "gauge", "Always 1; the server's version is in the label.");
    let _ = writeln!(text, "mcp_k8s_build_info{{version=\"{VERSION}\"}} 1");
    header(&mut text, "mcp_k8s_tool_calls_total", "counter", "Finished tool calls by tool and outcome.");
    for ((tool, outcome), count) in &state.tool_calls {
        let _ = writeln!(text, "mcp_k8s_tool_calls_total{{tool=\"{tool}\",outcome=\"{outcome}\"}} {count}");
    }
    header(&mut text, "mcp_k8s_tool_call_duration_seconds", "histogram", "Tool calls from their start to their answer, by tool.");
    for (tool, histogram) in &state.tool_call_seconds {
        histogram.render_samples(&mut text, "mcp_k8s_tool_call_duration_seconds", &format!("tool=\"{tool}\""));
    }
    header(&mut text, "mcp_k8s_http_requests_total", "counter", "HTTP answers by route and status code.");
    for ((route, code), count) in &state.http_requests {
        let _ = writeln!(text, "mcp_k8s_http_requests_total{{route=\"{route}\",code=\"{code}\"}} {count}");
    }
    header(&mut text, "mcp_k8s_sandboxes_opened_total", "counter", "Sandboxes this server opened.");
    let _ = writeln!(text, "mcp_k8s_sandboxes_opened_total {}", state.sandboxes_opened);
    header(&mut text, "mcp_k8s_sandboxes_closed_total", "counter", "Sandboxes this server closed, by reason.");
    for (reason, count) in &state.sandboxes_closed {
        let _ = writeln!(text, "mcp_k8s_sandboxes_closed_total{{reason=\"{reason}\"}} {count}");
    }
    if let Some(open) = state.sandboxes_open {
        header(&mut text, "mcp_k8s_sandboxes_open", "gauge", "Open sandboxes of every replica, as the reaper last listed them.");
        let _ = writeln!(text, "mcp_k8s_sandboxes_open {open}");
    }
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
    tool_calls: BTreeMap<(&'static str, &'static str), u64>,
    tool_call_seconds: BTreeMap<&'static str, Histogram<{ TOOL_CALL_BUCKETS_S.len() }>>,
    http_requests: BTreeMap<(&'static str, u16), u64>,
    sandboxes_opened: u64,
    sandboxes_closed: BTreeMap<&'static str, u64>,
    /// `None` until the reaper first listed sandboxes (a backend without
    /// them never does).
    sandboxes_open: Option<u64>,
    caller_runs: BTreeMap<(String, String, &'static str), u64>,
    caller_cpu_seconds: BTreeMap<String, f64>,
    pools: BTreeMap<String, PoolCounts>,
    pool_refill_seconds: Histogram<{ DURATION_BUCKETS_S.len() }>,
    runs: BTreeMap<(String, &'static str, &'static str), u64>,
    run_seconds: Histogram<{ DURATION_BUCKETS_S.len() }>,
    command_seconds: Histogram<{ DURATION_BUCKETS_S.len() }>,
    api_errors: BTreeMap<&'static str, u64>,
    thread_panics: BTreeMap<&'static str, u64>,
    spans: BTreeMap<&'static str, u64>,
}

/// Observations by upper bound: `N` bounds, one bucket each.
struct Histogram<const N: usize> {
    bounds: &'static [f64; N],
    /// Observations at or below each bound (not cumulative here; `render`
    /// adds them up).
    buckets: [u64; N],
    count: u64,
    sum: f64,
}

impl<const N: usize> Histogram<N> {
    const fn new(bounds: &'static [f64; N]) -> Histogram<N> {
        Histogram { bounds, buckets: [0; N], count: 0, sum: 0.0 }
    }

    fn observe(&mut self, seconds: f64) {
        if let Some(index) = self.bounds.iter().position(|bound| seconds <= *bound) {
            self.buckets[index] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, text: &mut String, name: &str, help: &str) {
        header(text, name, "histogram", help);
        self.render_samples(text, name, "");
    }

    /// The sample lines only, each with `labels` (`key="value"`, or empty)
    /// before `le`: a labelled family has one header for all its series.
    fn render_samples(&self, text: &mut String, name: &str, labels: &str) {
        let (labels, braced) =
            if labels.is_empty() { (String::new(), String::new()) } else { (format!("{labels},"), format!("{{{labels}}}")) };
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(self.buckets) {
            cumulative += count;
            let _ = writeln!(text, "{name}_bucket{{{labels}le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(text, "{name}_bucket{{{labels}le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(text, "{name}_sum{braced} {}", self.sum);
        let _ = writeln!(text, "{name}_count{braced} {}", self.count);
    }
}

static STATE: Mutex<State> = Mutex::new(State {
    tool_calls: BTreeMap::new(),
    tool_call_seconds: BTreeMap::new(),
    http_requests: BTreeMap::new(),
    sandboxes_opened: 0,
    sandboxes_closed: BTreeMap::new(),
    sandboxes_open: None,
    caller_runs: BTreeMap::new(),
    caller_cpu_seconds: BTreeMap::new(),
    pools: BTreeMap::new(),
    pool_refill_seconds: Histogram::new(&DURATION_BUCKETS_S),
    runs: BTreeMap::new(),
    run_seconds: Histogram::new(&DURATION_BUCKETS_S),
    command_seconds: Histogram::new(&DURATION_BUCKETS_S),
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
        let mut histogram = Histogram::new(&DURATION_BUCKETS_S);
        for seconds in [0.2, 0.7, 3.0, 5000.0] {
            histogram.observe(seconds);
        }
        let mut text = String::new();
        histogram.render(&mut text, "h", "help");
        assert_lines(
            &text,
            &[
                "h_bucket{le=\"0.5\"} 1",
                "h_bucket{le=\"1\"} 2",
                "h_bucket{le=\"5\"} 3",
                "h_bucket{le=\"1800\"} 3",
                "h_bucket{le=\"+Inf\"} 4",
                "h_count 4",
                "h_sum 5003.9",
            ],
        );
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

    #[test]
    fn a_labelled_histogram_puts_its_labels_before_le_and_on_sum_and_count() {
        let mut histogram = Histogram::new(&TOOL_CALL_BUCKETS_S);
        histogram.observe(0.003);
        let mut text = String::new();
        histogram.render_samples(&mut text, "h", "tool=\"run_job\"");
        assert_lines(
            &text,
            &[
                "h_bucket{tool=\"run_job\",le=\"0.01\"} 1",
                "h_bucket{tool=\"run_job\",le=\"+Inf\"} 1",
                "h_sum{tool=\"run_job\"} 0.003",
                "h_count{tool=\"run_job\"} 1",
            ],
        );
        assert!(!text.contains("# TYPE"), "one header per family, written by the caller:\n{text}");
    }

    #[test]
    fn build_info_tool_calls_http_requests_and_sandboxes_appear_in_the_text() {
        tool_call("run_job", "tool_error", Duration::from_millis(40));
        http_request("/mcp", 200);
        http_request("other", 404);
        sandbox_opened();
        sandbox_closed("idle");
        sandboxes_open(3);
        let text = render();
        let build_info = format!("mcp_k8s_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
        assert_lines(
            &text,
            &[
                &build_info,
                "# TYPE mcp_k8s_tool_calls_total counter",
                "# TYPE mcp_k8s_tool_call_duration_seconds histogram",
                "mcp_k8s_tool_call_duration_seconds_bucket{tool=\"run_job\",le=\"0.05\"} ",
                "mcp_k8s_tool_calls_total{tool=\"run_job\",outcome=\"tool_error\"} ",
                "mcp_k8s_http_requests_total{route=\"/mcp\",code=\"200\"} ",
                "mcp_k8s_http_requests_total{route=\"other\",code=\"404\"} ",
                "mcp_k8s_sandboxes_opened_total ",
                "mcp_k8s_sandboxes_closed_total{reason=\"idle\"} ",
                "mcp_k8s_sandboxes_open 3",
            ],
        );
    }

    #[test]
    fn every_family_has_one_help_and_one_type_line() {
        tool_call("list_jobs", "success", Duration::from_millis(1));
        tool_call("fetch_job", "success", Duration::from_millis(1));
        let text = render();
        let mut seen = std::collections::BTreeSet::new();
        for line in text.lines().filter(|line| line.starts_with("# TYPE ")) {
            let name = line.split(' ').nth(2).unwrap_or_default();
            assert!(seen.insert(name), "`{name}` has two TYPE lines:\n{text}");
            assert!(text.contains(&format!("# HELP {name} ")), "`{name}` has no HELP line");
        }
    }

    /// Each of `lines` is a line of `text`; one that ends in a space is
    /// the start of a line, its value left open (other tests move it).
    fn assert_lines(text: &str, lines: &[&str]) {
        for line in lines {
            let found = text.lines().any(|candidate| candidate == *line || (line.ends_with(' ') && candidate.starts_with(line)));
            assert!(found, "missing `{line}` in:\n{text}");
        }
    }
}
