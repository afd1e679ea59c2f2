//! A container's state as the engine's neutral view (`facts::View`,
//! `facts::Finished`): created is pending, running runs, exited is
//! finished. Pure, so each state is a table case.
//!
//! The facts are put in the fields the engine's judge reads: the kernel's
//! OOM kill as `oom_killed` (so `outcome::judge` says `OOMKilled`), any
//! other exit as its code (137 without the OOM flag is a
//! SIGKILL from someone, not an OOM), a runtime that could not start the
//! process as `start_failure`, and a container being removed (or gone) as
//! `deleted`. Times: `FinishedAt` can be earlier than `StartedAt` on a
//! short run, so no duration is taken from them.
//!
//! Knows the inspect answer; decides nothing about the run's end.

use std::time::SystemTime;

use crate::docker::objects::ContainerInspect;
use crate::docker::outages::Outage;
use crate::engine::port::facts::{Finished, SandboxState, Stopped, View};
use crate::engine::port::{Sighting, Times};
use crate::log;

/// Docker's time for "never": `0001-01-01T00:00:00Z`.
const ZERO_TIME_PREFIX: &str = "0001-";

/// A container as the engine sees it; `sandbox` is the container's name.
pub fn sighting(inspect: &ContainerInspect) -> Sighting {
    let started = time_of(&inspect.state.started_at);
    let finished = if is_finished(inspect) { time_of(&inspect.state.finished_at) } else { None };
    Sighting {
        sandbox: inspect.name.trim_start_matches('/').to_string(),
        view: view(inspect),
        times: Times { scheduled: started, started, finished },
    }
}

/// The sighting of a container that ended while the daemon could not be
/// reached (`outage`, from the client): its end is named as the daemon's
/// (`Stopped::RuntimeGone`), since a daemon that shuts down stops its
/// containers (SIGTERM, then SIGKILL) and one that comes back without
/// live-restore kills those still running.
pub fn with_outage(mut sighting: Sighting, outage: Option<Outage>) -> Sighting {
    let Some(outage) = outage else { return sighting };
    let message = format!(
        "the Docker daemon could not be reached from {} to {} (restarted or stopped), and the container ended in that time",
        log::rfc3339_utc(outage.from),
        log::rfc3339_utc(outage.to)
    );
    for finished in sighting.view.ended.iter_mut().chain(std::iter::once(&mut sighting.view.if_gone)) {
        finished.stopped = Some(Stopped::RuntimeGone { seen: message.clone() });
    }
    sighting
}

/// The decision's view of a container.
pub fn view(inspect: &ContainerInspect) -> View {
    let state = &inspect.state;
    let finished = finished(inspect);
    let sandbox_state = match state.status.as_str() {
        "running" | "paused" | "restarting" => SandboxState::Running,
        "exited" | "dead" | "removing" => SandboxState::Finished { ran: finished.start_failure.is_none() },
        // `created`: the start comes right after the inputs are written.
        _ if state.error.is_empty() => SandboxState::Pending,
        _ => SandboxState::Finished { ran: false },
    };
    let ended = match state.status.as_str() {
        "exited" | "dead" => Some(finished.clone()),
        "removing" => Some(Finished { deleted: true, ..finished.clone() }),
        _ if !state.error.is_empty() => Some(finished.clone()),
        _ => None,
    };
    View { state: sandbox_state, ended, if_gone: Finished { deleted: true, ..finished } }
}

/// Whether the container ended (or is being removed).
pub fn is_finished(inspect: &ContainerInspect) -> bool {
    matches!(inspect.state.status.as_str(), "exited" | "dead" | "removing")
}

/// A running container (the `active` of a background run).
pub fn is_running(inspect: &ContainerInspect) -> bool {
    inspect.state.running
}

/// When it ended, if it did.
pub fn finished_at(inspect: &ContainerInspect) -> Option<SystemTime> {
    if is_finished(inspect) { time_of(&inspect.state.finished_at).or_else(|| Some(SystemTime::now())) } else { None }
}

fn finished(inspect: &ContainerInspect) -> Finished {
    let state = &inspect.state;
    let ended = is_finished(inspect);
    let never_started = time_of(&state.started_at).is_none();
    let start_failure = (!state.error.is_empty() && never_started).then(|| format!("the container could not start: {}", state.error));
    Finished {
        exit_code: ended.then(|| i32::try_from(state.exit_code).unwrap_or(i32::MAX)),
        signal: None,
        oom_killed: state.oom_killed,
        stopped: None,
        disruption: None,
        deleted: false,
        start_failure,
    }
}

fn time_of(text: &str) -> Option<SystemTime> {
    if text.is_empty() || text.starts_with(ZERO_TIME_PREFIX) {
        return None;
    }
    crate::time::parse_rfc3339(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::docker::objects::ContainerState;

    fn container(status: &str, exit_code: i64, oom_killed: bool, error: &str, started: bool) -> ContainerInspect {
        let started_at = if started { "2026-12-01T10:00:00.5Z" } else { "0001-01-01T00:00:00Z" };
        ContainerInspect {
            name: "/mcp-run-r".into(),
            state: ContainerState {
                status: status.into(),
                running: status == "running",
                exit_code,
                oom_killed,
                error: error.into(),
                started_at: started_at.into(),
                // Earlier than the start, as Docker writes it for short runs.
                finished_at: "2026-12-01T10:00:00.1Z".into(),
                pid: 0,
            },
            ..ContainerInspect::default()
        }
    }

    /// (case, container, state, ended: exit code and reason, deleted)
    #[test]
    fn container_states() {
        let cases = [
            ("created", container("created", 0, false, "", false), "Pending", None),
            ("running", container("running", 0, false, "", true), "Running", None),
            ("exit 0", container("exited", 0, false, "", true), "Finished { ran: true }", Some((Some(0), false, false))),
            ("exit 3", container("exited", 3, false, "", true), "Finished { ran: true }", Some((Some(3), false, false))),
            ("OOM", container("exited", 137, true, "", true), "Finished { ran: true }", Some((Some(137), true, false))),
            ("SIGKILL, no OOM", container("exited", 137, false, "", true), "Finished { ran: true }", Some((Some(137), false, false))),
            ("removing", container("removing", 137, false, "", true), "Finished { ran: true }", Some((Some(137), false, true))),
            (
                "could not start",
                container("created", 127, false, "exec: no such file", false),
                "Finished { ran: false }",
                Some((None, false, false)),
            ),
        ];
        for (case, inspect, state, ended) in cases {
            let view = view(&inspect);
            assert_eq!(format!("{:?}", view.state), state, "{case}");
            // (exit code, OOM-killed, deleted)
            let got = view.ended.as_ref().map(|f| (f.exit_code, f.oom_killed, f.deleted));
            assert_eq!(got, ended, "{case}");
            assert!(view.if_gone.deleted, "{case}: gone means removed");
        }
    }

    #[test]
    fn a_failed_start_says_the_runtimes_words() {
        let failed = view(&container("created", 127, false, "exec: no such file", false));
        assert_eq!(failed.ended.unwrap().start_failure.as_deref(), Some("the container could not start: exec: no such file"));
    }

    #[test]
    fn times_come_from_the_state_and_never_times_are_none() {
        let created = sighting(&container("created", 0, false, "", false));
        assert_eq!(created.sandbox, "mcp-run-r");
        assert_eq!(created.times, Times::default());
        let exited = sighting(&container("exited", 0, false, "", true));
        assert!(exited.times.started.is_some() && exited.times.finished.is_some());
        assert!(finished_at(&container("running", 0, false, "", true)).is_none());
    }

    #[test]
    fn an_end_inside_an_outage_of_the_daemon_is_named_as_its() {
        let exited = sighting(&container("exited", 143, false, "", true));
        let outage = Outage { from: std::time::UNIX_EPOCH, to: std::time::UNIX_EPOCH + std::time::Duration::from_secs(1) };
        let named = with_outage(exited.clone(), Some(outage));
        let ended = named.view.ended.as_ref().unwrap();
        let Some(Stopped::RuntimeGone { seen }) = &ended.stopped else { panic!("{ended:?}") };
        assert!(seen.starts_with("the Docker daemon could not be reached from 1970-01-01T00:00:00.000Z"), "{seen}");
        assert!(matches!(named.view.if_gone.stopped, Some(Stopped::RuntimeGone { .. })));
        assert_eq!(with_outage(exited.clone(), None), exited, "no outage, no change");
    }
}
