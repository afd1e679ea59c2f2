//! Reading a pod's status (and the Job's events) into what the run loop
//! needs to decide: keep waiting, start reading the log, stop early with a
//! reason, or finish. Pure functions over the typed views of
//! `kube::objects`, so each case is a fixture-driven test. The functions
//! over `&Value` are thin wrappers for callers that still hold the API's
//! JSON; each reads the view once and calls its `_view` twin.

use std::time::SystemTime;

use crate::backend::kubernetes::manifest::{CLONE_CONTAINER, MAIN_CONTAINER, PREPARE_CONTAINER};
use crate::engine::port::facts::{Finished, SandboxState, Stopped, View};
use crate::engine::port::spec::RunReason;
use crate::kube::objects::{Condition, ContainerStatus, Event, Pod, PodStatus, StateTerminated};

/// What a pod's status says about the run.
#[derive(Clone, Debug, PartialEq)]
pub enum PodState {
    /// Not decisive yet (scheduling, pulling, creating, prepare running).
    Pending { waiting_reason: Option<String>, message: Option<String> },
    /// The scheduler cannot place the pod (yet); the run loop applies a
    /// grace period before giving up.
    Unschedulable { message: String },
    /// The main container is running: its log can be followed.
    Running,
    /// Something that will not fix itself within the run.
    FailFast { reason: RunReason, message: String },
    /// The main container (or the pod) has ended.
    Finished(Finished),
}

/// Waiting reasons that mean the image will not be pulled in this run.
const IMAGE_PULL_FAILURES: &[&str] = &["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "ImageInspectError"];
/// Waiting reasons that mean the container cannot be created as specified.
const CONTAINER_FAILURES: &[&str] = &["CreateContainerConfigError", "CreateContainerError", "RunContainerError"];
/// Of those, the ones where the runtime tried to create or start the
/// process and failed: for the main container that is a start failure
/// whose text the caller needs.
const START_FAILURES: &[&str] = &["CreateContainerError", "RunContainerError"];
/// Terminated reasons of a container whose process never ran.
const TERMINATED_WITHOUT_STARTING: &[&str] = &["StartError", "ContainerCannotRun"];

fn pod_state(pod: &Pod) -> PodState {
    let status = &pod.status;
    let phase = status.phase.as_deref().unwrap_or("");
    let init_steps = [
        (PREPARE_CONTAINER, "the runner image", RunReason::InputFailed),
        (CLONE_CONTAINER, "the clone image (MCP_K8S_CLONE_IMAGE)", RunReason::CloneFailed),
    ];
    for (name, image, reason) in init_steps {
        if let Some(state) = init_container_state(status, name, image, reason) {
            return state;
        }
    }
    let main = main_container(status);
    if let Some(main) = main {
        if let Some(terminated) = &main.state.terminated {
            return PodState::Finished(finished(status, Some(terminated)));
        }
        if main.state.running.is_some() {
            return PodState::Running;
        }
        if let Some(state) = main_start_failure(main) {
            return state;
        }
        if let Some(state) = fail_fast_from_waiting(main, "the image") {
            return state;
        }
    }
    if phase == "Failed" || phase == "Succeeded" {
        return PodState::Finished(finished(status, None));
    }
    if let Some(message) = unschedulable_message(status) {
        return PodState::Unschedulable { message };
    }
    let waiting = main.and_then(|main| main.state.waiting.as_ref());
    PodState::Pending {
        waiting_reason: waiting.and_then(|waiting| waiting.reason.clone()),
        message: waiting.and_then(|waiting| waiting.message.clone()),
    }
}

/// Whether someone asked for the pod to go (`metadata.deletionTimestamp`).
fn is_deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// The main container's process never ran: the runtime refused to start
/// it (its terminated reason). Its text goes to the caller as it is.
pub fn start_failure(terminated: &StateTerminated) -> Option<String> {
    let reason = terminated.reason.as_deref()?;
    if !TERMINATED_WITHOUT_STARTING.contains(&reason) {
        return None;
    }
    let message = terminated.message.as_deref().map(str::trim).filter(|message| !message.is_empty());
    Some(start_failure_message(reason, message.unwrap_or("no message")))
}

/// The kubelet's words for a stopped pod (`status.reason`, `.message`),
/// as the engine's `Stopped`.
fn stopped(status: &PodStatus) -> Option<Stopped> {
    let message = status.message.clone().unwrap_or_default();
    Some(match status.reason.as_deref()? {
        "Evicted" => Stopped::Evicted { message },
        "DeadlineExceeded" => Stopped::DeadlinePassed,
        other if message.is_empty() => Stopped::Other { why: other.to_string() },
        other => Stopped::Other { why: format!("{other}: {message}") },
    })
}

/// What a pod that has not started is doing, for the `StartTimeout`
/// message: waiting for a node, pulling an image (the kubelet's `Pulling`
/// event without its `Pulled`), running an init step, or the container's
/// waiting reason. `events` are the pod's, oldest first.
pub fn start_progress(pod: Option<&Pod>, events: &[Event]) -> String {
    let Some(pod) = pod else { return "the pod was not created yet".to_string() };
    let status = &pod.status;
    if let Some(message) = unschedulable_message(status) {
        return format!("no node could take the pod yet: {message}");
    }
    if let Some(image) = image_being_pulled(events) {
        return format!("the kubelet was still pulling the image `{image}`");
    }
    for (name, what) in [(PREPARE_CONTAINER, "preparing the workdir"), (CLONE_CONTAINER, "cloning the repository")] {
        if container_status(&status.init_container_statuses, name).is_some_and(|init| init.state.running.is_some()) {
            return format!("the init container `{name}` was still {what}");
        }
        if container_status(&status.container_statuses, name).is_some_and(|step| step.state.running.is_some()) {
            return format!("the container `{name}` was still {what}");
        }
    }
    let waiting = main_container(status).and_then(|main| main.state.waiting.as_ref());
    match waiting.and_then(|waiting| waiting.reason.as_deref()) {
        Some(reason) => match waiting.and_then(|waiting| waiting.message.as_deref()).filter(|message| !message.is_empty()) {
            Some(message) => format!("the container was waiting: {reason}: {message}"),
            None => format!("the container was waiting: {reason}"),
        },
        None => format!("the pod was {}", status.phase.as_deref().unwrap_or("Pending")),
    }
}

/// A Job's `FailedCreate` event means the pod was refused at creation:
/// quota, LimitRange, Pod Security or validation. Returns the reason and
/// the API's message.
pub fn failed_create(events: &[Event]) -> Option<(RunReason, String)> {
    let event = events.iter().rev().find(|event| event.reason.as_deref() == Some("FailedCreate"))?;
    let message = event.message.as_deref().unwrap_or("the pod could not be created").to_string();
    let reason = if message.contains("exceeded quota") { RunReason::QuotaExceeded } else { RunReason::Rejected };
    Some((reason, message))
}

/// Instants of the phases, read from the pod's status.
pub fn scheduled_at(pod: &Pod) -> Option<SystemTime> {
    let scheduled = pod.status.conditions.iter().find(|condition| condition.is_true("PodScheduled"))?;
    parse_time(scheduled.last_transition_time.as_deref()?)
}

pub fn main_started_at(pod: &Pod) -> Option<SystemTime> {
    let state = &main_container(&pod.status)?.state;
    let running = state.running.as_ref().and_then(|running| running.started_at.as_deref());
    let started = running.or_else(|| state.terminated.as_ref().and_then(|terminated| terminated.started_at.as_deref()))?;
    parse_time(started)
}

pub fn main_finished_at(pod: &Pod) -> Option<SystemTime> {
    let terminated = main_container(&pod.status)?.state.terminated.as_ref()?;
    parse_time(terminated.finished_at.as_deref()?)
}

/// Parses the API's RFC 3339 timestamps (`2026-11-29T20:14:53Z`, with or
/// without fractional seconds); one parser serves the client and the engine.
pub fn parse_time(text: &str) -> Option<SystemTime> {
    crate::time::parse_rfc3339(text)
}

fn container_status<'a>(statuses: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|container| container.name == name)
}

fn main_container(status: &PodStatus) -> Option<&ContainerStatus> {
    container_status(&status.container_statuses, MAIN_CONTAINER)
}

/// The image of a `Pulling` event that no `Pulled` (or failure) event for
/// the same image answers. Events of one second have no reliable order,
/// so this looks for the answer anywhere in the list.
fn image_being_pulled(events: &[Event]) -> Option<String> {
    let quoted = |event: &Event| -> Option<String> {
        let message = event.message.as_deref()?;
        let start = message.find('"')? + 1;
        let end = start + message[start..].find('"')?;
        Some(message[start..end].to_string())
    };
    let answered = |image: &str| {
        events.iter().any(|event| {
            matches!(event.reason.as_deref(), Some("Pulled" | "Failed" | "BackOff" | "ErrImageNeverPull"))
                && quoted(event).as_deref() == Some(image)
        })
    };
    events.iter().filter(|event| event.reason.as_deref() == Some("Pulling")).filter_map(quoted).find(|image| !answered(image))
}

fn start_failure_message(reason: &str, message: &str) -> String {
    format!(
        "the container runtime could not start the command ({reason}): {message}; check limits (e.g. limits.memory needs a unit: 64Mi), the command's length and the image"
    )
}

/// The main container waiting with `CreateContainerError` or
/// `RunContainerError`: the runtime failed to start it.
fn main_start_failure(main: &ContainerStatus) -> Option<PodState> {
    let waiting = main.state.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    if !START_FAILURES.contains(&reason) {
        return None;
    }
    let message = waiting.message.as_deref().map(str::trim).filter(|message| !message.is_empty()).unwrap_or("no message");
    Some(PodState::FailFast { reason: RunReason::StartFailed, message: start_failure_message(reason, message) })
}

fn fail_fast_from_waiting(container: &ContainerStatus, what: &str) -> Option<PodState> {
    let waiting = container.state.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    let message = waiting.message.as_deref().unwrap_or("").trim();
    let image = container.image.as_deref().unwrap_or("?");
    if IMAGE_PULL_FAILURES.contains(&reason) {
        return Some(PodState::FailFast {
            reason: RunReason::ImagePullFailed,
            message: format!(
                "{what} `{image}` could not be pulled ({reason}): {message}; check the name and tag, and that the cluster can reach its registry"
            ),
        });
    }
    if CONTAINER_FAILURES.contains(&reason) {
        return Some(PodState::FailFast {
            reason: RunReason::ContainerFailed,
            message: format!("the container could not be created ({reason}): {message}"),
        });
    }
    None
}

/// A failed init step ends the run at once: it could not be pulled
/// or created, or it exited non-zero. `prepare` is an init container or
/// a container beside `main` (see `manifest`); both are looked at. The runner writes its error (for the
/// clone: git's output tail, token masked) as the termination message; with
/// FallbackToLogsOnError the kubelet uses the log tail when the runner died
/// before writing it.
fn init_container_state(status: &PodStatus, name: &str, image: &str, reason: RunReason) -> Option<PodState> {
    let container =
        container_status(&status.init_container_statuses, name).or_else(|| container_status(&status.container_statuses, name))?;
    if let Some(state) = fail_fast_from_waiting(container, image) {
        return Some(state);
    }
    let terminated = container.state.terminated.as_ref()?;
    if terminated.exit_code == Some(0) {
        return None;
    }
    let detail = terminated.message.as_deref().unwrap_or("").trim();
    let detail = detail.strip_prefix("mcp-k8s-ephemeral-job runner: ").unwrap_or(detail);
    let detail = if detail.is_empty() { "no message" } else { detail };
    // `null` for a missing code, as the JSON it was once printed from said.
    let exit_code = terminated.exit_code.map_or_else(|| "null".to_string(), |code| code.to_string());
    if reason == RunReason::InputFailed && detail.starts_with(crate::sandbox::probe::FENCE_FAILURE) {
        return Some(PodState::FailFast {
            reason: RunReason::NetworkPolicyNotEnforced,
            message: format!("{detail}; the command was not started"),
        });
    }
    let message = match reason {
        RunReason::CloneFailed => format!("cloning the repository failed (exit code {exit_code}): {detail}"),
        _ => format!("preparing the pod failed (exit code {exit_code}): {detail}; check the input files and MCP_K8S_RUNNER_IMAGE"),
    };
    Some(PodState::FailFast { reason, message })
}

fn unschedulable_message(status: &PodStatus) -> Option<String> {
    let condition = status.conditions.iter().find(|condition| {
        condition.type_ == "PodScheduled" && condition.status == "False" && condition.reason.as_deref() == Some("Unschedulable")
    })?;
    Some(condition.message.as_deref().unwrap_or("no node can run the pod").to_string())
}

fn finished(status: &PodStatus, terminated: Option<&StateTerminated>) -> Finished {
    Finished {
        exit_code: terminated.and_then(|terminated| terminated.exit_code).map(|code| code as i32),
        signal: terminated.and_then(|terminated| terminated.signal).map(|signal| signal as i32),
        oom_killed: terminated.and_then(|terminated| terminated.reason.as_deref()) == Some("OOMKilled"),
        stopped: stopped(status),
        disruption: disruption(&status.conditions),
        deleted: false,
        start_failure: terminated.and_then(start_failure),
    }
}

/// Reads a finished pod, with its deletion mark (the `Finished` of
/// `pod_state` does not see metadata).
pub fn finished_pod(pod: &Pod) -> Option<Finished> {
    match pod_state(pod) {
        PodState::Finished(mut finished) => {
            finished.deleted = is_deleting(pod);
            Some(finished)
        }
        _ => None,
    }
}

/// The facts of a pod that is gone or going without a final status: what
/// its status said last, and that it was deleted.
fn deleted_pod(pod: &Pod) -> Finished {
    let terminated = main_container(&pod.status).and_then(|main| main.state.terminated.as_ref());
    Finished { deleted: true, ..finished(&pod.status, terminated) }
}

fn disruption(conditions: &[Condition]) -> Option<String> {
    let condition = conditions.iter().find(|condition| condition.is_true("DisruptionTarget"))?;
    let reason = condition.reason.as_deref().unwrap_or("DisruptionTarget");
    Some(match condition.message.as_deref().filter(|message| !message.is_empty()) {
        Some(message) => format!("{reason}: {message}"),
        None => reason.to_string(),
    })
}

/// The decision's neutral view of a pod: what it is doing, how it ended
/// (or that someone is deleting it), and what it would be judged on if it
/// disappeared now.
pub fn sandbox_view(pod: &Pod) -> View {
    let state = match pod_state(pod) {
        PodState::Pending { .. } => SandboxState::Pending,
        PodState::Unschedulable { message } => SandboxState::Unschedulable { message },
        PodState::Running => SandboxState::Running,
        PodState::FailFast { reason, message } => SandboxState::FailFast { reason, message },
        PodState::Finished(finished) => SandboxState::Finished { ran: finished.start_failure.is_none() },
    };
    let ended = finished_pod(pod).or_else(|| is_deleting(pod).then(|| deleted_pod(pod)));
    View { state, ended, if_gone: deleted_pod(pod) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    // The readers as the tests call them: on a pod or events as JSON.
    fn pod_state(pod: &Value) -> PodState {
        super::pod_state(&Pod::from_value(pod))
    }

    fn finished_pod(pod: &Value) -> Option<Finished> {
        super::finished_pod(&Pod::from_value(pod))
    }

    fn deleted_pod(pod: &Value) -> Finished {
        super::deleted_pod(&Pod::from_value(pod))
    }

    fn start_progress(pod: Option<&Value>, events: &[Value]) -> String {
        super::start_progress(pod.map(Pod::from_value).as_ref(), &Event::from_values(events))
    }

    fn failed_create(events: &[Value]) -> Option<(RunReason, String)> {
        super::failed_create(&Event::from_values(events))
    }
    use serde_json::json;

    fn pod(status: Value) -> Value {
        json!({"status": status})
    }

    #[test]
    fn pod_states() {
        let cases = vec![
            ("empty status", pod(json!({"phase": "Pending"})), "Pending"),
            (
                "unschedulable",
                pod(
                    json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient cpu."}]}),
                ),
                "Unschedulable",
            ),
            (
                "image pull back-off",
                pod(
                    json!({"phase": "Pending", "containerStatuses": [{"name": "main", "image": "nope:1", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}),
                ),
                "FailFast(ImagePullFailed)",
            ),
            (
                "bad runner image",
                pod(
                    json!({"phase": "Pending", "initContainerStatuses": [{"name": "prepare", "image": "r:1", "state": {"waiting": {"reason": "ErrImagePull"}}}]}),
                ),
                "FailFast(ImagePullFailed)",
            ),
            (
                "config error",
                pod(
                    json!({"phase": "Pending", "containerStatuses": [{"name": "main", "state": {"waiting": {"reason": "CreateContainerConfigError", "message": "secret not found"}}}]}),
                ),
                "FailFast(ContainerFailed)",
            ),
            (
                "prepare failed",
                pod(
                    json!({"phase": "Failed", "initContainerStatuses": [{"name": "prepare", "state": {"terminated": {"exitCode": 2, "message": "input path bad"}}}]}),
                ),
                "FailFast(InputFailed)",
            ),
            (
                "prepare never saw the pod's network policy in force",
                pod(json!({"phase": "Failed", "containerStatuses": [
                    {"name": "prepare", "state": {"terminated": {"exitCode": 2, "message": "mcp-k8s-ephemeral-job runner: the pod's network policy was not in force within 10 s: ..."}}},
                ]})),
                "FailFast(NetworkPolicyNotEnforced)",
            ),
            (
                "prepare beside main failed",
                pod(json!({"phase": "Failed", "containerStatuses": [
                    {"name": "prepare", "state": {"terminated": {"exitCode": 2, "message": "input path bad"}}},
                    {"name": "main", "state": {"terminated": {"exitCode": 128, "reason": "StartError"}}},
                ]})),
                "FailFast(InputFailed)",
            ),
            (
                "prepare beside main done, main running",
                pod(json!({"phase": "Running", "containerStatuses": [
                    {"name": "prepare", "state": {"terminated": {"exitCode": 0}}},
                    {"name": "main", "state": {"running": {}}},
                ]})),
                "Running",
            ),
            (
                "clone failed",
                pod(json!({"phase": "Failed", "initContainerStatuses": [
                    {"name": "prepare", "state": {"terminated": {"exitCode": 0}}},
                    {"name": "clone", "state": {"terminated": {"exitCode": 2, "message": "`git fetch` failed"}}},
                ]})),
                "FailFast(CloneFailed)",
            ),
            (
                "clone image missing",
                pod(
                    json!({"phase": "Pending", "initContainerStatuses": [{"name": "clone", "image": "git:x", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}),
                ),
                "FailFast(ImagePullFailed)",
            ),
            (
                "clone secret missing",
                pod(
                    json!({"phase": "Pending", "initContainerStatuses": [{"name": "clone", "state": {"waiting": {"reason": "CreateContainerConfigError", "message": "secret \"git\" not found"}}}]}),
                ),
                "FailFast(ContainerFailed)",
            ),
            (
                "cloning",
                pod(json!({"phase": "Pending", "initContainerStatuses": [{"name": "clone", "state": {"running": {}}}]})),
                "Pending",
            ),
            (
                "creating",
                pod(
                    json!({"phase": "Pending", "containerStatuses": [{"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
                ),
                "Pending",
            ),
            (
                "running",
                pod(
                    json!({"phase": "Running", "containerStatuses": [{"name": "main", "state": {"running": {"startedAt": "2026-11-29T20:00:00Z"}}}]}),
                ),
                "Running",
            ),
            (
                "oom",
                pod(
                    json!({"phase": "Failed", "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}),
                ),
                "Finished",
            ),
            ("evicted", pod(json!({"phase": "Failed", "reason": "Evicted", "message": "ephemeral storage"})), "Finished"),
            (
                "the runtime could not run the container",
                pod(
                    json!({"phase": "Pending", "containerStatuses": [{"name": "main", "state": {"waiting": {"reason": "RunContainerError", "message": "exec: argument list too long"}}}]}),
                ),
                "FailFast(StartFailed)",
            ),
            (
                "the runtime could not start the container",
                pod(
                    json!({"phase": "Failed", "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 128, "reason": "StartError", "message": "unable to set memory limit to 64"}}}]}),
                ),
                "Finished",
            ),
        ];
        for (name, pod, expected) in cases {
            let state = pod_state(&pod);
            let label = match &state {
                PodState::Pending { .. } => "Pending".to_string(),
                PodState::Unschedulable { .. } => "Unschedulable".to_string(),
                PodState::Running => "Running".to_string(),
                PodState::FailFast { reason, .. } => format!("FailFast({reason:?})"),
                PodState::Finished(_) => "Finished".to_string(),
            };
            assert_eq!(label, expected, "{name}: {state:?}");
        }
    }

    #[test]
    fn image_pull_message_names_the_image_and_the_fix() {
        let pod = pod(
            json!({"containerStatuses": [{"name": "main", "image": "nope:1", "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}]}),
        );
        let PodState::FailFast { message, .. } = pod_state(&pod) else { panic!() };
        assert!(message.contains("`nope:1`") && message.contains("not found") && message.contains("check the name"), "{message}");
    }

    #[test]
    fn the_kubelets_words_become_the_engines_facts() {
        let status = |reason: Option<&str>, message: Option<&str>| PodStatus {
            reason: reason.map(str::to_string),
            message: message.map(str::to_string),
            ..PodStatus::default()
        };
        let cases = [
            (None, None, None),
            (
                Some("Evicted"),
                Some("The node was low on resource: ephemeral-storage."),
                Some(Stopped::Evicted { message: "The node was low on resource: ephemeral-storage.".into() }),
            ),
            (
                Some("DeadlineExceeded"),
                Some("Pod was active on the node longer than the specified deadline"),
                Some(Stopped::DeadlinePassed),
            ),
            (Some("NodeLost"), None, Some(Stopped::Other { why: "NodeLost".into() })),
            (
                Some("Shutdown"),
                Some("Pod was terminated in response to imminent node shutdown."),
                Some(Stopped::Other { why: "Shutdown: Pod was terminated in response to imminent node shutdown.".into() }),
            ),
        ];
        for (reason, message, expected) in cases {
            assert_eq!(stopped(&status(reason, message)), expected, "{reason:?}");
        }
        let oom = StateTerminated { exit_code: Some(137), reason: Some("OOMKilled".into()), ..StateTerminated::default() };
        assert!(finished(&PodStatus::default(), Some(&oom)).oom_killed);
        let error = StateTerminated { exit_code: Some(137), reason: Some("Error".into()), ..StateTerminated::default() };
        assert!(!finished(&PodStatus::default(), Some(&error)).oom_killed, "137 alone is a SIGKILL, not an OOM kill");
    }

    #[test]
    fn a_start_error_carries_the_runtimes_text() {
        let pod = pod(json!({"phase": "Failed", "containerStatuses": [{"name": "main", "state": {"terminated": {
            "exitCode": 128, "reason": "StartError",
            "message": "failed to create containerd task: unable to set memory limit to 64 (current usage: 2117632, peak usage: 2117632)"}}}]}));
        let finished = finished_pod(&pod).unwrap();
        let message = finished.start_failure.unwrap();
        assert!(message.contains("StartError") && message.contains("unable to set memory limit to 64"), "{message}");
        let completed = StateTerminated { reason: Some("Completed".into()), ..StateTerminated::default() };
        assert_eq!(start_failure(&completed), None);
    }

    #[test]
    fn deletion_and_disruption_are_read() {
        let evicted = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:05Z"}, "status": {"phase": "Failed", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}]}});
        let finished = finished_pod(&evicted).unwrap();
        assert!(finished.deleted);
        assert_eq!(finished.disruption.as_deref(), Some("EvictionByEvictionAPI: Eviction API: evicting"));
        let gone = deleted_pod(&json!({"status": {"phase": "Running"}}));
        assert!(gone.deleted && gone.disruption.is_none());
    }

    #[test]
    fn start_progress_says_what_the_pod_was_doing() {
        let waiting_main =
            pod(json!({"phase": "Pending", "containerStatuses": [{"name": "main", "state": {"waiting": {"reason": "PodInitializing"}}}]}));
        let pulling = json!({"reason": "Pulling", "message": "Pulling image \"python:3.12\""});
        let pulled = json!({"reason": "Pulled", "message": "Successfully pulled image \"python:3.12\" in 20s"});
        let other_pulled = json!({"reason": "Pulled", "message": "Container image \"runner:1\" already present on machine"});
        let cases = [
            ("no pod", None, vec![], "not created yet"),
            ("pulling", Some(&waiting_main), vec![other_pulled.clone(), pulling.clone()], "still pulling the image `python:3.12`"),
            ("pulled", Some(&waiting_main), vec![pulling.clone(), pulled.clone()], "waiting: PodInitializing"),
            ("pulled, listed first", Some(&waiting_main), vec![pulled, pulling.clone()], "waiting: PodInitializing"),
        ];
        for (name, pod, events, expected) in cases {
            let text = start_progress(pod, &events);
            assert!(text.contains(expected), "{name}: {text}");
        }
        let preparing = pod(json!({"phase": "Pending", "initContainerStatuses": [{"name": "prepare", "state": {"running": {}}}]}));
        assert!(start_progress(Some(&preparing), &[]).contains("`prepare`"));
        let beside = pod(json!({"phase": "Pending", "containerStatuses": [{"name": "prepare", "state": {"running": {}}}]}));
        assert!(start_progress(Some(&beside), &[]).contains("the container `prepare` was still preparing the workdir"));
        let unschedulable = pod(
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}]}),
        );
        assert!(start_progress(Some(&unschedulable), &[]).contains("0/1 nodes"));
    }

    #[test]
    fn failed_create_events() {
        let quota =
            json!({"reason": "FailedCreate", "message": "Error creating: pods \"x\" is forbidden: exceeded quota: q, requested: cpu=64"});
        let security = json!({"reason": "FailedCreate", "message": "pods \"x\" is forbidden: violates PodSecurity"});
        let other = json!({"reason": "SuccessfulCreate", "message": "Created pod"});
        assert_eq!(failed_create(std::slice::from_ref(&other)), None);
        assert_eq!(failed_create(&[other.clone(), quota]).map(|r| r.0), Some(RunReason::QuotaExceeded));
        assert_eq!(failed_create(&[security]).map(|r| r.0), Some(RunReason::Rejected));
    }

    #[test]
    fn api_timestamps() {
        let cases = [
            ("1970-01-01T00:00:00Z", 0, 0),
            ("2026-11-29T20:14:53Z", 1_795_983_293, 0),
            ("2026-11-29T20:14:53.25Z", 1_795_983_293, 250_000_000),
        ];
        for (text, seconds, nanos) in cases {
            let time = parse_time(text).unwrap();
            assert_eq!(time, SystemTime::UNIX_EPOCH + std::time::Duration::new(seconds, nanos), "{text}");
        }
        assert_eq!(parse_time("yesterday"), None);
    }
}
