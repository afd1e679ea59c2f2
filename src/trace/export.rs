//! Sends finished spans to the OTLP/HTTP endpoint in batches, from a
//! bounded queue, on one thread of its own: recording a span never waits
//! on the network, and a span that finds the queue full is dropped and
//! counted (`mcp_k8s_spans_total{outcome="dropped"}`) rather than slowing a
//! run. A batch the endpoint refuses or cannot take is counted as failed
//! and not retried: traces are for looking at, not a record to keep.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::span::{Span, request_body};
use crate::{log, metrics, supervise};

/// Spans waiting at most; past it, new ones are dropped.
pub const MAX_QUEUED: usize = 2048;
/// Spans in one request at most.
const MAX_BATCH: usize = 256;
/// How long a span may wait for companions before its batch goes.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// How long one export request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Exporter {
    url: String,
    state: Mutex<Queue>,
    wake: Condvar,
}

struct Queue {
    spans: VecDeque<Span>,
    /// Batches being sent now (for `flush`).
    sending: usize,
    /// `flush` waits: send what is there without waiting for more.
    flushing: bool,
}

impl Exporter {
    /// Starts the exporter's thread for `url` (the endpoint's
    /// `/v1/traces`).
    pub fn start(url: String) -> Result<Arc<Exporter>, String> {
        let exporter = Arc::new(Exporter {
            url,
            state: Mutex::new(Queue { spans: VecDeque::new(), sending: 0, flushing: false }),
            wake: Condvar::new(),
        });
        let sender = Arc::clone(&exporter);
        supervise::spawn(supervise::Kind::TraceExporter, move || sender.run())
            .map_err(|error| format!("cannot start the trace exporter: {error}"))?;
        Ok(exporter)
    }

    /// Queues a finished span; drops it when the queue is full.
    pub fn record(&self, span: Span) {
        let mut queue = self.lock();
        if queue.spans.len() >= MAX_QUEUED {
            drop(queue);
            metrics::spans("dropped", 1);
            return;
        }
        queue.spans.push_back(span);
        // The first span starts the batch's wait; a full batch ends it.
        if queue.spans.len() == 1 || queue.spans.len() >= MAX_BATCH {
            self.wake.notify_all();
        }
    }

    /// Waits up to `timeout` for what is queued to be sent (at shutdown).
    pub fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut queue = self.lock();
        self.wake.notify_all();
        while (!queue.spans.is_empty() || queue.sending > 0) && Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            queue = self
                .wake
                .wait_timeout(queue, left.min(Duration::from_millis(50)))
                .map_or_else(|poisoned| poisoned.into_inner().0, |(queue, _)| queue);
            self.wake.notify_all();
        }
    }

    fn run(&self) {
        let agent: ureq::Agent =
            ureq::Agent::config_builder().timeout_global(Some(REQUEST_TIMEOUT)).http_status_as_error(false).build().into();
        loop {
            let batch = self.next_batch();
            let count = batch.len() as u64;
            let body = request_body(&batch, env!("CARGO_PKG_VERSION")).to_string();
            let sent = agent.post(&self.url).header("Content-Type", "application/json").send(body.as_bytes());
            match sent {
                Ok(response) if response.status().is_success() => metrics::spans("exported", count),
                Ok(response) => {
                    metrics::spans("failed", count);
                    log::warn(
                        "the trace endpoint refused spans",
                        &[("status", response.status().as_u16().into()), ("spans", count.into())],
                    );
                }
                Err(error) => {
                    metrics::spans("failed", count);
                    log::warn("the trace endpoint could not be reached", &[("error", error.to_string().into()), ("spans", count.into())]);
                }
            }
            let mut queue = self.lock();
            queue.sending -= 1;
            self.wake.notify_all();
        }
    }

    /// The next batch: waits for a span, then up to `FLUSH_EVERY` for a
    /// full batch (or a flush).
    fn next_batch(&self) -> Vec<Span> {
        let mut queue = self.lock();
        while queue.spans.is_empty() {
            queue = self.wake.wait(queue).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        let deadline = Instant::now() + FLUSH_EVERY;
        while queue.spans.len() < MAX_BATCH && !queue.flushing {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            queue = self.wake.wait_timeout(queue, deadline - now).map_or_else(|poisoned| poisoned.into_inner().0, |(queue, _)| queue);
        }
        let take = queue.spans.len().min(MAX_BATCH);
        queue.sending += 1;
        queue.spans.drain(..take).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Kind, SpanContext};
    use std::time::SystemTime;

    fn dropped_so_far() -> u64 {
        let text = metrics::render();
        let line = text.lines().find(|line| line.starts_with("mcp_k8s_spans_total{outcome=\"dropped\"}"));
        line.and_then(|line| line.rsplit(' ').next()).and_then(|count| count.parse().ok()).unwrap_or(0)
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        // No thread: nothing drains the queue, as when the endpoint hangs.
        let exporter = Exporter {
            url: String::new(),
            state: Mutex::new(Queue { spans: VecDeque::new(), sending: 0, flushing: false }),
            wake: Condvar::new(),
        };
        let span = Span {
            context: SpanContext::root(),
            parent: None,
            name: "x".into(),
            kind: Kind::Internal,
            start: SystemTime::now(),
            end: SystemTime::now(),
            attributes: Vec::new(),
            error: None,
        };
        let before = dropped_so_far();
        let started = Instant::now();
        for _ in 0..MAX_QUEUED + 7 {
            exporter.record(span.clone());
        }
        assert_eq!(exporter.lock().spans.len(), MAX_QUEUED);
        assert!(dropped_so_far() >= before + 7, "the spans past the bound are counted as dropped");
        // What is left to send when nobody sends is given up on at the
        // flush's bound, not waited for.
        exporter.flush(Duration::from_millis(100));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
