//! A run as trace spans, children of the call's span (for a background
//! run, the span of the call that submitted it): one `run` span from
//! the engine taking it to its answer, and one per phase the run went
//! through (`run.queued`, `run.created` or `run.claimed` for a warm
//! sandbox, `run.scheduled`, `run.running`, `run.collected`), from its
//! phase stamps, to its answer (a background run: its end). Pure: the
//! call, or the process that records a background run's verdict, records
//! what `run_spans` makes.
//!
//! A span carries the run's facts (status, reason, exit code, image,
//! network mode, warm), never its id: a run id is the capability that
//! fetches its result and reads its stored output, and traces go to a
//! collector others read. Nor argv, environment, files or output.

use std::time::SystemTime;

use crate::engine::port::spec::{RunOutcome, RunStatus};
use crate::network::NetworkMode;
use crate::trace::{Attr, Kind, Span, SpanContext};

/// What a run's span says of it besides its outcome.
pub struct RunFacts<'a> {
    pub image: &'a str,
    /// `None` where it is not known (a background run read back).
    pub network: Option<NetworkMode>,
}

/// The spans of a finished run under `parent` (the call's span).
pub fn run_spans(parent: SpanContext, facts: &RunFacts, outcome: &RunOutcome) -> Vec<Span> {
    let times = outcome.times.ordered();
    let (Some(submitted), Some(end)) = (times.submitted, times.answered.or(times.finished)) else { return Vec::new() };
    let run = parent.child();
    let mut attributes = vec![
        ("mcp_k8s.run.status", Attr::Text(outcome.status.name().to_string())),
        ("container.image.name", Attr::Text(facts.image.to_string())),
        ("mcp_k8s.run.warm", Attr::Bool(times.warm)),
    ];
    if let Some(network) = facts.network {
        attributes.push(("mcp_k8s.run.network", Attr::Text(network.name().to_string())));
    }
    if let Some(reason) = outcome.reason {
        attributes.push(("mcp_k8s.run.reason", Attr::Text(reason.name().to_string())));
    }
    if let Some(code) = outcome.exit_code {
        attributes.push(("process.exit.code", Attr::Int(i64::from(code))));
    }
    let error =
        (outcome.status != RunStatus::Succeeded).then(|| outcome.reason.map_or(outcome.status.name(), |reason| reason.name()).to_string());
    let mut spans = vec![Span {
        context: run,
        parent: Some(parent.span_id),
        name: "run".to_string(),
        kind: Kind::Internal,
        start: submitted,
        end,
        attributes,
        error,
    }];
    let made = if times.warm { "run.claimed" } else { "run.created" };
    let phases: [(&str, Option<SystemTime>, Option<SystemTime>); 5] = [
        ("run.queued", times.submitted, times.created),
        (made, times.created, times.scheduled.or(times.started)),
        ("run.scheduled", times.scheduled, times.started),
        ("run.running", times.started, times.finished),
        ("run.collected", times.finished, times.answered),
    ];
    for (name, start, end) in phases {
        if let (Some(start), Some(end)) = (start, end) {
            spans.push(Span {
                context: run.child(),
                parent: Some(run.span_id),
                name: name.to_string(),
                kind: Kind::Internal,
                start,
                end,
                attributes: Vec::new(),
                error: None,
            });
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::port::spec::{PhaseTimes, RunReason};
    use std::time::{Duration, UNIX_EPOCH};

    fn at(ms: u64) -> Option<SystemTime> {
        Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + ms))
    }

    fn spec() -> crate::engine::port::spec::RunSpec {
        crate::engine::port::spec::RunSpec {
            owner: None,
            image: "busybox:1.36".into(),
            command: vec!["sh".into(), "-c".into(), "echo SECRET_ARG".into()],
            files: Vec::new(),
            env: [("TOKEN".to_string(), "SECRET_ENV".to_string())].into(),
            cpu_limit: None,
            memory_limit: None,
            timeout: Duration::from_secs(60),
            workdir: "/work".into(),
            artifacts: Vec::new(),
            clone: None,
            network: crate::network::NetworkMode::None,
        }
    }

    #[test]
    fn a_runs_phases_are_its_spans_children_and_its_id_is_never_in_them() {
        let parent = SpanContext::root();
        let mut outcome =
            RunOutcome::without_result("0123456789abcdef0123456789abcdef", RunStatus::Failed, RunReason::OOMKilled, "killed".into());
        outcome.exit_code = Some(137);
        // (case, stamps, the phase spans expected)
        let cold = PhaseTimes {
            submitted: at(0),
            created: at(10),
            scheduled: at(20),
            started: at(900),
            first_output: at(950),
            finished: at(1500),
            answered: at(1600),
            warm: false,
        };
        let warm = PhaseTimes { scheduled: None, warm: true, ..cold.clone() };
        let refused = PhaseTimes { submitted: at(0), answered: at(5), ..PhaseTimes::default() };
        let cases: [(&str, PhaseTimes, &[&str]); 3] = [
            ("cold", cold, &["run.queued", "run.created", "run.scheduled", "run.running", "run.collected"]),
            ("warm", warm, &["run.queued", "run.claimed", "run.running", "run.collected"]),
            ("refused before a sandbox", refused, &[]),
        ];
        for (case, times, phases) in cases {
            outcome.times = times;
            let spec = spec();
            let spans = run_spans(parent, &RunFacts { image: &spec.image, network: Some(spec.network) }, &outcome);
            assert_eq!(spans[0].name, "run", "{case}");
            assert_eq!(spans[0].parent, Some(parent.span_id), "{case}: the run is the call's child");
            assert_eq!(spans[0].error.as_deref(), Some("OOMKilled"), "{case}");
            let names: Vec<&str> = spans[1..].iter().map(|span| span.name.as_str()).collect();
            assert_eq!(names, phases, "{case}");
            assert!(spans[1..].iter().all(|span| span.parent == Some(spans[0].context.span_id) && span.start <= span.end), "{case}");
            assert!(spans.iter().all(|span| span.context.trace_id == parent.trace_id), "{case}");
            let text = format!("{spans:?}");
            assert!(!text.contains("0123456789abcdef0123456789abcdef"), "{case}: a run id is a capability, never in a span");
            assert!(!text.contains("SECRET"), "{case}: neither argv nor env");
        }
    }
}
