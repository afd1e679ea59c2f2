//! Deciding a run's status, reason and message from what the runner
//! reported (its result frame) and what the kubelet reported (the container
//! and pod status). Pure, so every combination is a test case.

use std::time::Duration;

use crate::engine::port::facts::{Finished, Stopped, Wording};
use crate::engine::port::spec::{RunOutcome, RunReason, RunStatus, Truncation};
use crate::engine::run::collect::Collector;

/// The facts a finished run is judged on, besides the collected log.
pub struct Judged<'a> {
    pub run_id: &'a str,
    pub timeout: Duration,
    pub memory_limit: Option<&'a str>,
    pub finished: Option<&'a Finished>,
    /// This server stopped the run on purpose (`cancel_job`, an MCP
    /// cancel). Only then is a runner that got SIGTERM `cancelled`: the
    /// runner cannot tell who sent the signal.
    pub cancel_requested: bool,
    /// What the backend's users call its parts.
    pub wording: &'a Wording,
}

/// Builds the outcome of a run whose main container ran. `collector` holds
/// what was read from the log; `finished` the kubelet's view, if known.
pub fn judge(facts: &Judged, collector: Collector) -> RunOutcome {
    let mut outcome = RunOutcome::without_result(facts.run_id, RunStatus::Error, RunReason::ResultLost, String::new());
    outcome.notes.extend(collector.problems.iter().cloned());
    outcome.artifacts = collector.artifacts;
    let oom_by_kubelet = facts.finished.is_some_and(|f| f.oom_killed);
    let Some(result) = collector.result else {
        // No result frame: the runner itself was killed or the log was lost.
        // Keep what the live frames carried, and say so.
        outcome.stdout = collector.live_stdout;
        outcome.stderr = collector.live_stderr;
        // The totals only the result knows; what arrived is a floor, not 0.
        outcome.stdout_total_bytes = outcome.stdout.len() as u64;
        outcome.stderr_total_bytes = outcome.stderr.len() as u64;
        outcome.truncated = Truncation { stdout: true, stderr: true, artifacts: true };
        outcome.exit_code = facts.finished.and_then(|f| f.exit_code);
        if let Some(ended) = &collector.ended {
            return judge_ended_without_result(facts, ended, oom_by_kubelet, outcome);
        }
        return judge_without_result(facts, oom_by_kubelet, outcome);
    };
    outcome.exit_code = result.exit_code;
    outcome.signal = result.signal;
    let stdout_whole = collector.captured_stdout.len() as u64 == result.stdout_captured_bytes;
    let stderr_whole = collector.captured_stderr.len() as u64 == result.stderr_captured_bytes;
    if !stdout_whole || !stderr_whole {
        outcome.notes.push("part of the captured output did not arrive; the log was cut".to_string());
    }
    outcome.stdout = collector.captured_stdout;
    outcome.stderr = collector.captured_stderr;
    outcome.stdout_total_bytes = result.stdout_total_bytes;
    outcome.stderr_total_bytes = result.stderr_total_bytes;
    outcome.truncated = Truncation {
        stdout: result.stdout_truncated || !stdout_whole,
        stderr: result.stderr_truncated || !stderr_whole,
        artifacts: result.artifacts_truncated || outcome.artifacts.len() < result.artifact_count as usize,
    };
    outcome.duration = Duration::from_millis(result.finished_at_ms.saturating_sub(result.started_at_ms));
    // The runner's clock has milliseconds; the API's timestamps only seconds.
    outcome.times.started = Some(std::time::UNIX_EPOCH + Duration::from_millis(result.started_at_ms));
    outcome.times.finished = Some(std::time::UNIX_EPOCH + Duration::from_millis(result.finished_at_ms));
    outcome.notes.extend(result.notes.iter().cloned());
    if outcome.artifacts.len() < result.artifact_count as usize {
        outcome.notes.push(format!(
            "the runner sent {} artifacts but {} arrived; the log was cut",
            result.artifact_count,
            outcome.artifacts.len()
        ));
    }
    let (status, reason, message) = if let Some(start_error) = &result.start_error {
        (RunStatus::Error, Some(RunReason::StartFailed), format!("{start_error}; {}", runner_start_hint(start_error)))
    } else if let Some(disk) = &result.disk_limit_exceeded {
        (
            RunStatus::Failed,
            Some(RunReason::DiskLimitExceeded),
            format!("{disk}; write less to the workdir and /tmp, or ask the operator to raise MCP_K8S_WORKDIR_SIZE"),
        )
    } else if result.terminated_by_request {
        let (status, reason, message) = stopped_on_request(facts);
        (status, Some(reason), message)
    } else if result.timed_out {
        (
            RunStatus::TimedOut,
            Some(RunReason::DeadlineExceeded),
            format!(
                "the command ran longer than timeout_s={} and was stopped; the output so far and the artifacts are included; raise timeout_s or use submit_job for long work",
                facts.timeout.as_secs()
            ),
        )
    } else if result.pids_fork_failures > 0 && result.exit_code != Some(0) {
        // Before OOM: a fork storm under a memory limit fills memory too,
        // and "raise limits.memory" would be the wrong advice.
        (
            RunStatus::Failed,
            Some(RunReason::PidsExhausted),
            pids_message(facts.wording, result.pids_fork_failures, result.oom_killed || oom_by_kubelet),
        )
    } else if result.oom_killed || oom_by_kubelet {
        (RunStatus::Failed, Some(RunReason::OOMKilled), oom_message(facts))
    } else if result.exit_code == Some(0) {
        (RunStatus::Succeeded, None, "the command exited with code 0".to_string())
    } else if let Some(code) = result.exit_code {
        (RunStatus::Failed, Some(RunReason::NonZeroExit), format!("the command exited with code {code}; see stderr"))
    } else {
        let signal = result.signal.unwrap_or(0);
        (RunStatus::Failed, Some(RunReason::Signaled), format!("the command was killed by signal {signal}"))
    };
    if result.pids_fork_failures > 0 && reason != Some(RunReason::PidsExhausted) {
        outcome.notes.push(format!(
            "{} refused: the {} reached its process limit ({})",
            process_creations(result.pids_fork_failures),
            facts.wording.sandbox,
            facts.wording.pids_limit
        ));
    }
    outcome.status = status;
    outcome.reason = reason;
    outcome.message = message;
    outcome
}

/// A fork storm used to end as OOMKilled with the
/// advice to raise limits.memory.
fn pids_message(wording: &Wording, fork_failures: u64, also_oom: bool) -> String {
    let oom = if also_oom { "; it also ran out of memory, which so many processes cause" } else { "" };
    format!(
        "the command reached the {}'s process limit ({}): {} failed with EAGAIN{oom}; start fewer processes or threads",
        wording.sandbox,
        wording.pids_limit,
        process_creations(fork_failures)
    )
}

fn process_creations(count: u64) -> String {
    if count == 1 { "1 process creation".to_string() } else { format!("{count} process creations") }
}

/// The command had ended (`Frame::Ended`) but the runner stopped before
/// its result: what the kubelet or the daemon then saw (an OOM kill, exit
/// code 137) was the runner's end, not the command's. A command that
/// exited 0 used to be reported `OOMKilled` this way, with the runner's
/// 137 as its exit code. The command's own end is kept; the run is an
/// error (its output and files are incomplete), and the message says
/// what happened after the command. A cancel, a deletion or an eviction
/// is judged as without the frame.
fn judge_ended_without_result(
    facts: &Judged,
    ended: &crate::sandbox::frame::Ended,
    oom_by_kubelet: bool,
    mut outcome: RunOutcome,
) -> RunOutcome {
    if facts.cancel_requested || (!oom_by_kubelet && facts.finished.is_some_and(|f| f.stopped.is_some() || f.deleted)) {
        return judge_without_result(facts, oom_by_kubelet, outcome);
    }
    outcome.exit_code = ended.exit_code;
    outcome.signal = ended.signal;
    let how = match (ended.exit_code, ended.signal) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended".to_string(),
    };
    let after = if oom_by_kubelet {
        let limit = facts.memory_limit.map(|limit| format!(" (limits.memory={limit})")).unwrap_or_default();
        format!(
            "the runner was then killed for memory while it collected the output and files: the {}'s memory{limit} was full, and what the command left in memory counts too",
            facts.wording.sandbox
        )
    } else {
        format!("the {} then ended before the runner could report", facts.wording.sandbox)
    };
    outcome.status = RunStatus::Error;
    outcome.reason = Some(RunReason::ResultLost);
    outcome.message = format!("the command {how}; {after}; the output so far is included, files may be missing");
    outcome
}

fn judge_without_result(facts: &Judged, oom_by_kubelet: bool, mut outcome: RunOutcome) -> RunOutcome {
    let stopped = facts.finished.and_then(|f| f.stopped.as_ref());
    let start_failure = facts.finished.and_then(|finished| finished.start_failure.clone());
    let (status, reason, message) = if facts.cancel_requested {
        cancelled()
    } else if let Some(message) = start_failure {
        (RunStatus::Error, RunReason::StartFailed, message)
    } else if oom_by_kubelet {
        (RunStatus::Failed, RunReason::OOMKilled, oom_message(facts))
    } else if let Some(message) = runtime_stopped_message(facts) {
        (RunStatus::Error, RunReason::ResultLost, message)
    } else if let Some(message) = eviction_message(facts) {
        (RunStatus::Error, RunReason::Evicted, message)
    } else if stopped == Some(&Stopped::DeadlinePassed) {
        (
            RunStatus::TimedOut,
            RunReason::DeadlineExceeded,
            format!("the {}'s deadline passed before the runner could report; the output so far is included", facts.wording.sandbox),
        )
    } else if facts.finished.is_some_and(|f| f.deleted) {
        (RunStatus::Error, RunReason::PodDeleted, deleted_message(facts.wording))
    } else {
        (
            RunStatus::Error,
            RunReason::ResultLost,
            format!(
                "the {} ended without the runner's result (the command's process was killed or its output was lost); the live output so far is included",
                facts.wording.sandbox
            ),
        )
    };
    outcome.status = status;
    outcome.reason = Some(reason);
    outcome.message = message;
    outcome
}

fn deleted_message(wording: &Wording) -> String {
    format!(
        "the {} was deleted by something other than this server ({}), so the command was stopped; the output so far is included; run the job again",
        wording.sandbox, wording.outside_deleters
    )
}

/// A sandbox whose runtime went away itself (`Stopped::RuntimeGone`).
fn runtime_stopped_message(facts: &Judged) -> Option<String> {
    match facts.finished?.stopped.as_ref()? {
        Stopped::RuntimeGone { seen } => {
            Some(format!("{seen}; the command was stopped with it; the output so far is included; run the job again"))
        }
        _ => None,
    }
}

/// A runner that reports SIGTERM: a cancel when this server asked for one,
/// else whatever the pod's status says stopped it.
fn stopped_on_request(facts: &Judged) -> (RunStatus, RunReason, String) {
    if facts.cancel_requested {
        return cancelled();
    }
    if let Some(message) = runtime_stopped_message(facts) {
        return (RunStatus::Error, RunReason::Terminated, message);
    }
    if let Some(message) = eviction_message(facts) {
        return (RunStatus::Error, RunReason::Evicted, message);
    }
    if facts.finished.and_then(|f| f.stopped.as_ref()) == Some(&Stopped::DeadlinePassed) {
        return (
            RunStatus::TimedOut,
            RunReason::DeadlineExceeded,
            format!(
                "the {}'s deadline passed and {} stopped the command; the output so far is included",
                facts.wording.sandbox, facts.wording.stopper
            ),
        );
    }
    if facts.finished.is_some_and(|f| f.deleted) {
        return (RunStatus::Error, RunReason::PodDeleted, deleted_message(facts.wording));
    }
    (
        RunStatus::Error,
        RunReason::Terminated,
        "the command was stopped by a SIGTERM that this server did not send (no cancel, and no eviction or deletion was seen); the output so far is included; run the job again".to_string(),
    )
}

fn cancelled() -> (RunStatus, RunReason, String) {
    (RunStatus::Cancelled, RunReason::Cancelled, "the run was cancelled; the output so far is included".to_string())
}

/// The node's eviction text (`Stopped::Evicted`), or the
/// `DisruptionTarget` condition of an eviction through the API.
fn eviction_message(facts: &Judged) -> Option<String> {
    let finished = facts.finished?;
    let text = match &finished.stopped {
        Some(Stopped::Evicted { message }) => message.clone(),
        _ => finished.disruption.clone()?,
    };
    Some(format!(
        "the {} was evicted: {}; the workdir may have outgrown its size limit (MCP_K8S_WORKDIR_SIZE), or the node ran short of resources",
        facts.wording.sandbox,
        text.trim()
    ))
}

/// What to do about a command the runner could not start, by its error.
fn runner_start_hint(start_error: &str) -> &'static str {
    // io::Error's text ends in "(os error N)"; E2BIG is 7 on Linux.
    if start_error.contains("(os error 7)") {
        "an argument or the environment is over Linux's limits (131071 bytes per string, about 2 MiB in all); pass large data as files"
    } else {
        "check that the program exists in the image and is executable, or give its absolute path"
    }
}

fn oom_message(facts: &Judged) -> String {
    match facts.memory_limit {
        Some(limit) => format!("the command ran out of memory (limits.memory={limit}) and was killed; raise limits.memory"),
        None => "the command ran out of memory and was killed (the namespace's default memory limit applied); set limits.memory higher"
            .to_string(),
    }
}

/// The Kubernetes backend's words, for the engine's own tests (which may
/// not import a backend).
#[cfg(test)]
pub(crate) const POD_WORDING: Wording = Wording {
    sandbox: "pod",
    created: "Job",
    stopper: "the kubelet",
    pids_limit: "the kubelet's podPidsLimit",
    outside_deleters: "kubectl delete, a controller, a node drain",
    api: "the API server",
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::frame::{self, Frame, Output, RunResult, Stream};

    fn result() -> RunResult {
        RunResult {
            exit_code: Some(0),
            finished_at_ms: 1_250,
            stdout_captured_bytes: 3,
            stderr_captured_bytes: 3,
            stdout_total_bytes: 3,
            stderr_total_bytes: 3,
            ..RunResult::started(1_000)
        }
    }

    fn judged(result: Option<RunResult>, finished: Option<Finished>) -> RunOutcome {
        judged_with(result, finished, false)
    }

    fn judged_with(result: Option<RunResult>, finished: Option<Finished>, cancel_requested: bool) -> RunOutcome {
        let mut collector = Collector::new(100, 100);
        for (stream, bytes) in [(Stream::Stdout, b"out"), (Stream::Stderr, b"err")] {
            collector.push_line(&frame::encode(
                frame::Tag::from_bytes([0; frame::TAG_BYTES]),
                &Frame::Captured(Output { stream, data_b64: frame::to_base64(bytes) }),
            ));
        }
        if let Some(result) = result {
            collector.push_line(&frame::encode(frame::Tag::from_bytes([0; frame::TAG_BYTES]), &Frame::Result(result)));
        }
        let facts = Judged {
            run_id: "r",
            timeout: Duration::from_secs(5),
            memory_limit: Some("64Mi"),
            finished: finished.as_ref(),
            cancel_requested,
            wording: &POD_WORDING,
        };
        judge(&facts, collector)
    }

    #[test]
    fn a_runtime_that_stopped_the_sandbox_is_named_whether_the_runner_reported_or_not() {
        let stopped = || Finished {
            stopped: Some(Stopped::RuntimeGone { seen: "the Docker daemon could not be reached".into() }),
            ..Finished::default()
        };
        let mut terminated = result();
        terminated.terminated_by_request = true;
        let reported = judged(Some(terminated), Some(stopped()));
        assert_eq!((reported.status, reported.reason), (RunStatus::Error, Some(RunReason::Terminated)));
        assert!(reported.message.starts_with("the Docker daemon could not be reached; the command was stopped"), "{}", reported.message);
        let lost = judged(None, Some(stopped()));
        assert_eq!((lost.status, lost.reason), (RunStatus::Error, Some(RunReason::ResultLost)));
        assert!(lost.message.starts_with("the Docker daemon could not be reached"), "{}", lost.message);
        let cancelled = judged_with(None, Some(stopped()), true);
        assert_eq!(cancelled.status, RunStatus::Cancelled, "a cancel asked for stays a cancel");
    }

    /// A runner killed for memory after the command had exited 0 is not
    /// the command running out of memory: the command's end is kept, and
    /// the message says the runner died collecting.
    #[test]
    fn a_runner_killed_after_the_command_ended_is_not_the_command_killed() {
        let oom_container = Finished { oom_killed: true, exit_code: Some(137), ..Finished::default() };
        let ended = |exit_code: Option<i32>, signal: Option<i32>| {
            let mut collector = Collector::new(100, 100);
            let tag = frame::Tag::from_bytes([0; frame::TAG_BYTES]);
            collector.push_line(&frame::encode(
                tag,
                &Frame::Output(Output { stream: Stream::Stdout, data_b64: frame::to_base64(b"exiting 0\n") }),
            ));
            collector.push_line(&frame::encode(tag, &Frame::Ended(frame::Ended { exit_code, signal })));
            collector
        };
        let facts = |finished| Judged {
            run_id: "r",
            timeout: Duration::from_secs(5),
            memory_limit: Some("48Mi"),
            finished,
            cancel_requested: false,
            wording: &POD_WORDING,
        };
        let exited = judge(&facts(Some(&oom_container)), ended(Some(0), None));
        assert_eq!((exited.status, exited.reason, exited.exit_code), (RunStatus::Error, Some(RunReason::ResultLost), Some(0)));
        assert!(exited.message.starts_with("the command exited with code 0; the runner was then killed for memory"), "{}", exited.message);
        assert!(exited.message.contains("limits.memory=48Mi"), "{}", exited.message);
        assert_eq!(exited.stdout, b"exiting 0\n");

        let killed = judge(&facts(Some(&oom_container)), ended(None, Some(9)));
        assert_eq!((killed.exit_code, killed.signal), (None, Some(9)));
        assert!(killed.message.starts_with("the command was killed by signal 9; the runner was then killed"), "{}", killed.message);

        let plain = Finished { exit_code: Some(1), ..Finished::default() };
        let gone = judge(&facts(Some(&plain)), ended(Some(0), None));
        assert!(gone.message.starts_with("the command exited with code 0; the pod then ended"), "{}", gone.message);

        // Without the frame, the kubelet's OOM kill stays the command's.
        let old = judge(&facts(Some(&oom_container)), Collector::new(100, 100));
        assert_eq!(old.reason, Some(RunReason::OOMKilled));
    }

    #[test]
    fn statuses_and_reasons() {
        let with = |change: fn(&mut RunResult)| {
            let mut r = result();
            change(&mut r);
            Some(r)
        };
        let oom_container = Finished { oom_killed: true, exit_code: Some(137), ..Finished::default() };
        let evicted = Finished { stopped: Some(Stopped::Evicted { message: "disk".into() }), ..Finished::default() };
        // (name, runner result, kubelet view, expected status, expected reason)
        type Case = (&'static str, Option<RunResult>, Option<Finished>, RunStatus, Option<RunReason>);
        let cases: Vec<Case> = vec![
            ("exit 0", with(|_| {}), None, RunStatus::Succeeded, None),
            ("exit 3", with(|r| r.exit_code = Some(3)), None, RunStatus::Failed, Some(RunReason::NonZeroExit)),
            (
                "signal",
                with(|r| {
                    r.exit_code = None;
                    r.signal = Some(9)
                }),
                None,
                RunStatus::Failed,
                Some(RunReason::Signaled),
            ),
            (
                "timeout",
                with(|r| {
                    r.timed_out = true;
                    r.exit_code = None
                }),
                None,
                RunStatus::TimedOut,
                Some(RunReason::DeadlineExceeded),
            ),
            (
                "oom seen by runner",
                with(|r| {
                    r.oom_killed = true;
                    r.exit_code = None;
                    r.signal = Some(9)
                }),
                None,
                RunStatus::Failed,
                Some(RunReason::OOMKilled),
            ),
            (
                "start error",
                with(|r| {
                    r.start_error = Some("cannot start `x`".into());
                    r.exit_code = None
                }),
                None,
                RunStatus::Error,
                Some(RunReason::StartFailed),
            ),
            (
                "fork storm",
                with(|r| {
                    r.pids_fork_failures = 40;
                    r.exit_code = Some(1)
                }),
                None,
                RunStatus::Failed,
                Some(RunReason::PidsExhausted),
            ),
            (
                "fork storm that also filled memory",
                with(|r| {
                    r.pids_fork_failures = 40;
                    r.oom_killed = true;
                    r.exit_code = None;
                    r.signal = Some(9)
                }),
                Some(oom_container.clone()),
                RunStatus::Failed,
                Some(RunReason::PidsExhausted),
            ),
            ("refused forks, exit 0", with(|r| r.pids_fork_failures = 2), None, RunStatus::Succeeded, None),
            (
                "disk bound",
                with(|r| {
                    r.disk_limit_exceeded = Some("`/tmp` held 2 bytes, over its limit of 1 bytes".into());
                    r.exit_code = None;
                    r.signal = Some(15)
                }),
                None,
                RunStatus::Failed,
                Some(RunReason::DiskLimitExceeded),
            ),
            (
                "SIGTERM without a cancel or evidence",
                with(|r| r.terminated_by_request = true),
                None,
                RunStatus::Error,
                Some(RunReason::Terminated),
            ),
            ("runner oom-killed", None, Some(oom_container), RunStatus::Failed, Some(RunReason::OOMKilled)),
            ("evicted", None, Some(evicted), RunStatus::Error, Some(RunReason::Evicted)),
            ("lost", None, None, RunStatus::Error, Some(RunReason::ResultLost)),
        ];
        for (name, result, finished, status, reason) in cases {
            let outcome = judged(result, finished);
            assert_eq!((outcome.status, outcome.reason), (status, reason), "{name}: {}", outcome.message);
            assert!(!outcome.message.is_empty(), "{name}");
        }
    }

    /// One case per run-truth rule the judge decides.
    #[test]
    fn the_run_truth_rules() {
        let sigterm = || {
            let mut r = result();
            r.terminated_by_request = true;
            r.exit_code = None;
            r.signal = Some(15);
            Some(r)
        };
        let evicted = || Finished {
            stopped: Some(Stopped::Evicted { message: "Usage of EmptyDir volume \"work\" exceeds the limit \"1Gi\". ".into() }),
            ..Finished::default()
        };
        let deleted = || Finished { deleted: true, exit_code: Some(143), ..Finished::default() };
        let drained =
            || Finished { disruption: Some("EvictionByEvictionAPI: Eviction API: evicting".into()), deleted: true, ..Finished::default() };
        let start_error = || Finished {
            exit_code: Some(128),
            // What the backend reads from such a status (`classify`).
            start_failure: Some(
                "the container runtime could not start the command (StartError): unable to set memory limit to 64 (current usage: 2117632)"
                    .into(),
            ),
            ..Finished::default()
        };
        // (name, runner result, kubelet view, this server cancelled, status, reason, text the message must hold)
        type Case = (&'static str, Option<RunResult>, Option<Finished>, bool, RunStatus, RunReason, &'static str);
        let cases: Vec<Case> = vec![
            ("2: our cancel", sigterm(), None, true, RunStatus::Cancelled, RunReason::Cancelled, "cancelled"),
            ("2: our cancel, pod deleted by it", sigterm(), Some(deleted()), true, RunStatus::Cancelled, RunReason::Cancelled, "cancelled"),
            ("2: kubelet eviction", sigterm(), Some(evicted()), false, RunStatus::Error, RunReason::Evicted, "EmptyDir volume \"work\""),
            ("2: eviction API", sigterm(), Some(drained()), false, RunStatus::Error, RunReason::Evicted, "EvictionByEvictionAPI"),
            ("2: kubectl delete pod", sigterm(), Some(deleted()), false, RunStatus::Error, RunReason::PodDeleted, "other than this server"),
            (
                "2: evicted before the runner reported",
                None,
                Some(evicted()),
                false,
                RunStatus::Error,
                RunReason::Evicted,
                "exceeds the limit",
            ),
            ("2: deleted before the runner reported", None, Some(deleted()), false, RunStatus::Error, RunReason::PodDeleted, "deleted"),
            (
                "2: the pod's own deadline",
                sigterm(),
                Some(Finished { stopped: Some(Stopped::DeadlinePassed), ..Finished::default() }),
                false,
                RunStatus::TimedOut,
                RunReason::DeadlineExceeded,
                "deadline",
            ),
            (
                "5: runtime StartError",
                None,
                Some(start_error()),
                false,
                RunStatus::Error,
                RunReason::StartFailed,
                "unable to set memory limit",
            ),
            (
                "5: exec failed in the runner (E2BIG)",
                {
                    let mut r = result();
                    r.start_error = Some("cannot start `python3`: Argument list too long (os error 7)".into());
                    r.exit_code = Some(126);
                    Some(r)
                },
                None,
                false,
                RunStatus::Error,
                RunReason::StartFailed,
                "131071 bytes",
            ),
        ];
        for (name, result, finished, cancel_requested, status, reason, text) in cases {
            let outcome = judged_with(result, finished, cancel_requested);
            assert_eq!((outcome.status, outcome.reason), (status, Some(reason)), "{name}: {}", outcome.message);
            assert!(outcome.message.contains(text), "{name}: {}", outcome.message);
        }
    }

    #[test]
    fn refused_forks_are_noted_when_they_did_not_decide_the_run() {
        let mut r = result();
        r.pids_fork_failures = 2;
        let outcome = judged(Some(r), None);
        assert_eq!(outcome.notes, ["2 process creations refused: the pod reached its process limit (the kubelet's podPidsLimit)"]);
        let mut r = result();
        r.pids_fork_failures = 2;
        r.exit_code = Some(1);
        let outcome = judged(Some(r), None);
        assert!(outcome.notes.is_empty(), "{:?}", outcome.notes);
        assert!(outcome.message.contains("2 process creations failed with EAGAIN"), "{}", outcome.message);
    }

    #[test]
    fn outputs_and_duration_come_from_the_result() {
        let outcome = judged(Some(result()), None);
        assert_eq!((outcome.stdout.as_slice(), outcome.stderr.as_slice()), (&b"out"[..], &b"err"[..]));
        assert_eq!(outcome.duration, Duration::from_millis(250));
        assert_eq!(outcome.truncated, Truncation::default());
    }

    #[test]
    fn missing_artifacts_are_flagged_truncated() {
        let mut r = result();
        r.artifact_count = 2;
        let outcome = judged(Some(r), None);
        assert!(outcome.truncated.artifacts);
        assert!(outcome.notes.iter().any(|n| n.contains("2 artifacts")), "{:?}", outcome.notes);
    }
}
