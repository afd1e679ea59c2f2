//! Typed, read-only views of the Kubernetes objects the server reads back:
//! Pod, Job, Event and a list of them. Each view holds only the fields
//! something reads, and every field is lenient: a missing field, a `null`
//! or a value of the wrong type reads as its default (`None`, empty), so a
//! malformed object gives an empty view instead of an error or a panic,
//! and one odd field does not hide the others.
//!
//! Views only: this module knows the API's shapes, nothing of runs, their
//! container names or their annotations (those belong to the engine).
//! Objects we write are still built as JSON by their owners.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// `metadata` of any object.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default, deserialize_with = "lenient")]
    pub name: String,
    #[serde(default, deserialize_with = "lenient")]
    pub namespace: String,
    #[serde(default, deserialize_with = "lenient")]
    pub uid: String,
    #[serde(default, deserialize_with = "lenient")]
    pub resource_version: String,
    #[serde(default, deserialize_with = "lenient")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "lenient")]
    pub annotations: BTreeMap<String, String>,
    /// RFC 3339, as the API wrote it.
    #[serde(default, deserialize_with = "lenient")]
    pub creation_timestamp: Option<String>,
    /// Set once someone asked for the object to go.
    #[serde(default, deserialize_with = "lenient")]
    pub deletion_timestamp: Option<String>,
    #[serde(default, deserialize_with = "lenient_items")]
    pub owner_references: Vec<OwnerReference>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct OwnerReference {
    #[serde(default, deserialize_with = "lenient")]
    pub kind: String,
    #[serde(default, deserialize_with = "lenient")]
    pub name: String,
    #[serde(default, deserialize_with = "lenient")]
    pub uid: String,
}

/// A status condition of a pod or a Job.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type", default, deserialize_with = "lenient")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default, deserialize_with = "lenient")]
    pub status: String,
    #[serde(default, deserialize_with = "lenient")]
    pub reason: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub message: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub last_transition_time: Option<String>,
}

impl Condition {
    /// Whether this is a condition of `type_` whose status is `True`.
    pub fn is_true(&self, type_: &str) -> bool {
        self.type_ == type_ && self.status == "True"
    }
}

/// A pod.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Pod {
    #[serde(default, deserialize_with = "lenient")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "lenient")]
    pub spec: PodSpec,
    #[serde(default, deserialize_with = "lenient")]
    pub status: PodStatus,
}

impl Pod {
    /// The view of a pod as the API returned it; an empty view for
    /// anything else.
    pub fn from_value(value: &Value) -> Pod {
        view(value)
    }
}

/// A pod's spec (also a Job's pod template's).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, deserialize_with = "lenient")]
    pub node_name: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub active_deadline_seconds: Option<u64>,
    #[serde(default, deserialize_with = "lenient_items")]
    pub containers: Vec<Container>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Container {
    #[serde(default, deserialize_with = "lenient")]
    pub name: String,
    #[serde(default, deserialize_with = "lenient")]
    pub image: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub resources: Resources,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Resources {
    /// Quantities as the API writes them (`64Mi`, `500m`).
    #[serde(default, deserialize_with = "lenient")]
    pub limits: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "lenient")]
    pub requests: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default, deserialize_with = "lenient")]
    pub phase: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub reason: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub message: Option<String>,
    #[serde(default, deserialize_with = "lenient_items")]
    pub conditions: Vec<Condition>,
    #[serde(default, deserialize_with = "lenient_items")]
    pub container_statuses: Vec<ContainerStatus>,
    #[serde(default, deserialize_with = "lenient_items")]
    pub init_container_statuses: Vec<ContainerStatus>,
    #[serde(default, deserialize_with = "lenient")]
    pub start_time: Option<String>,
    #[serde(default, rename = "podIP", deserialize_with = "lenient")]
    pub pod_ip: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    #[serde(default, deserialize_with = "lenient")]
    pub name: String,
    #[serde(default, deserialize_with = "lenient")]
    pub image: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub state: ContainerState,
    #[serde(default, deserialize_with = "lenient")]
    pub last_state: ContainerState,
    #[serde(default, deserialize_with = "lenient")]
    pub restart_count: u32,
}

/// At most one of the three is set.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ContainerState {
    #[serde(default, deserialize_with = "lenient")]
    pub waiting: Option<StateWaiting>,
    #[serde(default, deserialize_with = "lenient")]
    pub running: Option<StateRunning>,
    #[serde(default, deserialize_with = "lenient")]
    pub terminated: Option<StateTerminated>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct StateWaiting {
    #[serde(default, deserialize_with = "lenient")]
    pub reason: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub message: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateRunning {
    #[serde(default, deserialize_with = "lenient")]
    pub started_at: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateTerminated {
    #[serde(default, deserialize_with = "lenient")]
    pub exit_code: Option<i64>,
    #[serde(default, deserialize_with = "lenient")]
    pub signal: Option<i64>,
    #[serde(default, deserialize_with = "lenient")]
    pub reason: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub message: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub started_at: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub finished_at: Option<String>,
}

/// A `batch/v1` Job.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Job {
    #[serde(default, deserialize_with = "lenient")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "lenient")]
    pub spec: JobSpec,
    #[serde(default, deserialize_with = "lenient")]
    pub status: JobStatus,
}

impl Job {
    /// The view of a Job as the API returned it; an empty view for
    /// anything else.
    pub fn from_value(value: &Value) -> Job {
        view(value)
    }

    /// Whether the Job reached `Complete` or `Failed`.
    pub fn finished_condition(&self) -> Option<&Condition> {
        self.status.conditions.iter().find(|condition| condition.is_true("Complete") || condition.is_true("Failed"))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    #[serde(default, deserialize_with = "lenient")]
    pub active_deadline_seconds: Option<u64>,
    #[serde(default, deserialize_with = "lenient")]
    pub ttl_seconds_after_finished: Option<u64>,
    #[serde(default, deserialize_with = "lenient")]
    pub template: PodTemplateSpec,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct PodTemplateSpec {
    #[serde(default, deserialize_with = "lenient")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "lenient")]
    pub spec: PodSpec,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    #[serde(default, deserialize_with = "lenient_items")]
    pub conditions: Vec<Condition>,
    #[serde(default, deserialize_with = "lenient")]
    pub active: u64,
    #[serde(default, deserialize_with = "lenient")]
    pub failed: u64,
    #[serde(default, deserialize_with = "lenient")]
    pub succeeded: u64,
    #[serde(default, deserialize_with = "lenient")]
    pub start_time: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub completion_time: Option<String>,
}

/// A `v1` Event.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    #[serde(default, deserialize_with = "lenient")]
    pub reason: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub message: Option<String>,
    /// `Normal` or `Warning`.
    #[serde(rename = "type", default, deserialize_with = "lenient")]
    pub type_: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub last_timestamp: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub event_time: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub involved_object: ObjectReference,
    #[serde(default, deserialize_with = "lenient")]
    pub count: Option<u64>,
}

impl Event {
    /// The view of an Event; an empty view for anything else.
    pub fn from_value(value: &Value) -> Event {
        view(value)
    }

    /// The views of a list answer's items.
    pub fn from_values(values: &[Value]) -> Vec<Event> {
        values.iter().map(Event::from_value).collect()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ObjectReference {
    #[serde(default, deserialize_with = "lenient")]
    pub kind: String,
    #[serde(default, deserialize_with = "lenient")]
    pub name: String,
    #[serde(default, deserialize_with = "lenient")]
    pub uid: String,
}

/// Any object, when only its metadata is read (the reaper's Jobs and
/// Secrets).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Object {
    #[serde(default, deserialize_with = "lenient")]
    pub metadata: ObjectMeta,
}

impl Object {
    /// The metadata view of any object; empty for anything else.
    pub fn from_value(value: &Value) -> Object {
        view(value)
    }
}

/// A Secret, for its keys: the values are kept as the API sent them
/// (base64 text), never decoded here, and an odd value does not hide its
/// key.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Secret {
    #[serde(default, deserialize_with = "lenient")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "lenient")]
    pub data: BTreeMap<String, Value>,
}

impl Secret {
    pub fn from_value(value: &Value) -> Secret {
        view(value)
    }
}

/// A PersistentVolumeClaim, for its phase.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct PersistentVolumeClaim {
    #[serde(default, deserialize_with = "lenient")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "lenient")]
    pub status: ClaimStatus,
}

impl PersistentVolumeClaim {
    pub fn from_value(value: &Value) -> PersistentVolumeClaim {
        view(value)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ClaimStatus {
    /// `Pending`, `Bound` or `Lost`.
    #[serde(default, deserialize_with = "lenient")]
    pub phase: Option<String>,
}

/// A node: the addresses it reports and its kubelet's port.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Node {
    #[serde(default, deserialize_with = "lenient")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "lenient")]
    pub status: NodeStatus,
}

impl Node {
    pub fn from_value(value: &Value) -> Node {
        view(value)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    #[serde(default, deserialize_with = "lenient_items")]
    pub addresses: Vec<NodeAddress>,
    #[serde(default, deserialize_with = "lenient")]
    pub daemon_endpoints: DaemonEndpoints,
}

/// `InternalIP`, `ExternalIP`, `Hostname`, ... and its value.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct NodeAddress {
    #[serde(default, rename = "type", deserialize_with = "lenient")]
    pub kind: String,
    #[serde(default, deserialize_with = "lenient")]
    pub address: String,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonEndpoints {
    #[serde(default, deserialize_with = "lenient")]
    pub kubelet_endpoint: DaemonEndpoint,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct DaemonEndpoint {
    #[serde(default, rename = "Port", deserialize_with = "lenient")]
    pub port: Option<u16>,
}

/// An EndpointSlice (discovery.k8s.io/v1): the addresses behind a Service
/// and its ports.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct EndpointSlice {
    #[serde(default, deserialize_with = "lenient_items")]
    pub endpoints: Vec<Endpoint>,
    #[serde(default, deserialize_with = "lenient_items")]
    pub ports: Vec<EndpointPort>,
}

impl EndpointSlice {
    pub fn from_value(value: &Value) -> EndpointSlice {
        view(value)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Endpoint {
    #[serde(default, deserialize_with = "lenient_items")]
    pub addresses: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct EndpointPort {
    #[serde(default, deserialize_with = "lenient")]
    pub port: Option<u16>,
}

/// The answer of `GET /version`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Version {
    #[serde(default, deserialize_with = "lenient")]
    pub git_version: Option<String>,
}

impl Version {
    pub fn from_value(value: &Value) -> Version {
        view(value)
    }
}

/// A list answer: its items and the collection's `resourceVersion`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(bound = "T: DeserializeOwned + Default")]
pub struct List<T> {
    #[serde(default, deserialize_with = "lenient_items")]
    pub items: Vec<T>,
    #[serde(default, deserialize_with = "lenient")]
    pub metadata: ListMeta,
}

impl<T: DeserializeOwned + Default> List<T> {
    /// The view of a list answer; an empty list for anything else.
    pub fn from_value(value: &Value) -> List<T> {
        List::deserialize(value).unwrap_or(List { items: Vec::new(), metadata: ListMeta::default() })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    #[serde(default, deserialize_with = "lenient")]
    pub resource_version: String,
}

fn view<T: DeserializeOwned + Default>(value: &Value) -> T {
    T::deserialize(value).unwrap_or_default()
}

/// Reads a field, or its default when it has another shape: the API's
/// objects are not ours, and a field we do not expect must not hide the
/// rest of the object.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned + Default>(deserializer: D) -> Result<T, D::Error> {
    let value = Value::deserialize(deserializer)?;
    Ok(view(&value))
}

/// A list's items, each read leniently: one odd item is an empty view,
/// not a missing list.
fn lenient_items<'de, D: Deserializer<'de>, T: DeserializeOwned + Default>(deserializer: D) -> Result<Vec<T>, D::Error> {
    let value = Value::deserialize(deserializer)?;
    Ok(value.as_array().map(|items| items.iter().map(view).collect()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_reads_its_status() {
        let pod = Pod::from_value(&json!({
            "metadata": {"name": "p", "namespace": "ci", "uid": "u1", "labels": {"app": "x"},
                "creationTimestamp": "2026-01-01T00:00:00Z", "deletionTimestamp": "2026-01-01T00:00:05Z",
                "ownerReferences": [{"kind": "Job", "name": "j", "uid": "u0", "controller": true}]},
            "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "python:3.12",
                "resources": {"limits": {"memory": "64Mi"}}}]},
            "status": {"phase": "Failed", "reason": "Evicted", "startTime": "2026-01-01T00:00:01Z",
                "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"}],
                "initContainerStatuses": [{"name": "prepare", "state": {"terminated": {"exitCode": 0}}}],
                "containerStatuses": [{"name": "main", "image": "python:3.12", "restartCount": 1,
                    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-01-01T00:00:04Z"}},
                    "lastState": {"running": {"startedAt": "2026-01-01T00:00:02Z"}}}]}
        }));
        assert_eq!(pod.metadata.name, "p");
        assert_eq!(pod.metadata.labels["app"], "x");
        assert_eq!(pod.metadata.deletion_timestamp.as_deref(), Some("2026-01-01T00:00:05Z"));
        assert_eq!(pod.metadata.owner_references[0].kind, "Job");
        assert_eq!(pod.spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(pod.spec.containers[0].resources.limits["memory"], "64Mi");
        assert_eq!(pod.status.phase.as_deref(), Some("Failed"));
        assert!(pod.status.conditions[0].is_true("PodScheduled"));
        let main = &pod.status.container_statuses[0];
        let terminated = main.state.terminated.as_ref().unwrap();
        assert_eq!((terminated.exit_code, terminated.reason.as_deref()), (Some(137), Some("OOMKilled")));
        assert_eq!(main.restart_count, 1);
        assert!(main.last_state.running.is_some());
        assert_eq!(pod.status.init_container_statuses[0].state.terminated.as_ref().unwrap().exit_code, Some(0));
    }

    #[test]
    fn malformed_objects_give_empty_views() {
        for value in [json!(null), json!("pod"), json!(7), json!([1, 2]), json!({"metadata": "x", "status": []})] {
            assert_eq!(Pod::from_value(&value), Pod::default(), "{value}");
            assert_eq!(Job::from_value(&value), Job::default(), "{value}");
            assert_eq!(Event::from_value(&value), Event::default(), "{value}");
        }
    }

    #[test]
    fn an_odd_field_loses_only_itself() {
        let pod = Pod::from_value(&json!({"metadata": {"name": 7, "namespace": "ci"}, "status": {"phase": "Running",
            "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": "137", "reason": "Error"}}}, "junk"]}}));
        assert_eq!((pod.metadata.name.as_str(), pod.metadata.namespace.as_str()), ("", "ci"));
        let terminated = pod.status.container_statuses[0].state.terminated.as_ref().unwrap();
        assert_eq!((terminated.exit_code, terminated.reason.as_deref()), (None, Some("Error")));
        assert_eq!(pod.status.container_statuses[1], ContainerStatus::default(), "a wrong item is an empty view");
    }

    #[test]
    fn an_empty_state_object_is_present() {
        let pod = Pod::from_value(&json!({"status": {"initContainerStatuses": [{"name": "clone", "state": {"running": {}}}]}}));
        assert_eq!(pod.status.init_container_statuses[0].state.running, Some(StateRunning::default()));
        let pod = Pod::from_value(&json!({"status": {"containerStatuses": [{"name": "main", "state": {"running": null}}]}}));
        assert_eq!(pod.status.container_statuses[0].state.running, None);
    }

    #[test]
    fn a_job_reads_its_spec_status_and_annotations() {
        let job = Job::from_value(&json!({
            "metadata": {"name": "j", "resourceVersion": "42", "annotations": {"a/b": "c"}},
            "spec": {"ttlSecondsAfterFinished": 300, "template": {"spec": {"activeDeadlineSeconds": 60,
                "containers": [{"name": "main", "resources": {"limits": {"memory": "1Gi"}}}]}}},
            "status": {"active": 1, "conditions": [{"type": "Failed", "status": "True", "lastTransitionTime": "2026-01-01T00:01:00Z"}]}
        }));
        assert_eq!(job.metadata.resource_version, "42");
        assert_eq!(job.metadata.annotations["a/b"], "c");
        assert_eq!(job.spec.ttl_seconds_after_finished, Some(300));
        assert_eq!(job.spec.template.spec.active_deadline_seconds, Some(60));
        assert_eq!(job.spec.template.spec.containers[0].resources.limits["memory"], "1Gi");
        assert_eq!(job.status.active, 1);
        assert_eq!(job.finished_condition().and_then(|c| c.last_transition_time.as_deref()), Some("2026-01-01T00:01:00Z"));
        let running = Job::from_value(&json!({"status": {"conditions": [{"type": "Failed", "status": "False"}]}}));
        assert_eq!(running.finished_condition(), None);
    }

    #[test]
    fn metadata_secrets_claims_and_the_version() {
        let secret = Secret::from_value(&json!({"metadata": {"name": "git", "annotations": {"a": "b"}}, "data": {"github.com": "dG9r"}}));
        assert_eq!(secret.data.keys().collect::<Vec<_>>(), ["github.com"]);
        assert_eq!(Object::from_value(&json!({"metadata": {"name": "git", "annotations": {"a": "b"}}})).metadata.annotations["a"], "b");
        let claim = PersistentVolumeClaim::from_value(&json!({"status": {"phase": "Bound"}}));
        assert_eq!(claim.status.phase.as_deref(), Some("Bound"));
        assert_eq!(Version::from_value(&json!({"gitVersion": "v1.31.0", "major": "1"})).git_version.as_deref(), Some("v1.31.0"));
        assert_eq!(Version::from_value(&json!([])), Version::default());
    }

    #[test]
    fn events_and_lists() {
        let list: List<Event> = List::from_value(&json!({
            "metadata": {"resourceVersion": "9"},
            "items": [
                {"reason": "FailedCreate", "message": "exceeded quota", "type": "Warning", "count": 3,
                    "lastTimestamp": "2026-01-01T00:00:00Z", "involvedObject": {"kind": "Job", "name": "j"}},
                "junk"
            ]
        }));
        assert_eq!(list.metadata.resource_version, "9");
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.items[0].reason.as_deref(), Some("FailedCreate"));
        assert_eq!(list.items[0].type_.as_deref(), Some("Warning"));
        assert_eq!(list.items[0].involved_object.kind, "Job");
        assert_eq!(list.items[0].count, Some(3));
        assert_eq!(list.items[1], Event::default());
        let empty: List<Pod> = List::from_value(&json!("nope"));
        assert!(empty.items.is_empty());
    }
}
