//! The calls the engine makes, against the fake API server: create, get,
//! list with selectors, delete with propagation, pod logs (plain and
//! followed), events, access reviews, and the typed errors built from the
//! API's `Status` bodies.

use std::io::BufRead;
use std::time::{Duration, Instant};

use crate::support::connect;
use crate::support::fake_api::FakeApi;
use mcp_k8s_ephemeral_job::kube::watch::{WatchEvent, WatchParams};
use mcp_k8s_ephemeral_job::kube::{AccessCheck, ListParams, LogParams, Resource};
use serde_json::json;

const JOBS: &str = "/apis/batch/v1/namespaces/live-ns/jobs";
const PODS: &str = "/api/v1/namespaces/live-ns/pods";

fn job(name: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({ "apiVersion": "batch/v1", "kind": "Job", "metadata": { "name": name, "labels": labels }, "spec": {} })
}

#[test]
fn create_get_list_delete_jobs() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    let created = client.create(Resource::JOBS, "live-ns", &job("run-1", json!({ "app": "mcp", "run": "1" }))).unwrap();
    assert_eq!(created["metadata"]["namespace"], "live-ns");
    assert!(created["metadata"]["uid"].is_string());
    client.create(Resource::JOBS, "live-ns", &job("run-2", json!({ "app": "mcp", "run": "2" }))).unwrap();

    assert_eq!(client.get(Resource::JOBS, "live-ns", "run-1").unwrap()["metadata"]["name"], "run-1");
    let selected = client
        .list(Resource::JOBS, "live-ns", &ListParams { label_selector: Some("app=mcp,run=2".into()), ..ListParams::default() })
        .unwrap();
    assert_eq!(selected.items.len(), 1);
    assert_eq!(selected.items[0]["metadata"]["name"], "run-2");
    assert!(!selected.resource_version.is_empty());

    assert!(client.delete(Resource::JOBS, "live-ns", "run-1").unwrap());
    assert!(!client.delete(Resource::JOBS, "live-ns", "run-1").unwrap(), "already gone");
    assert!(client.get_if_exists(Resource::JOBS, "live-ns", "run-1").unwrap().is_none());
    assert_eq!(fake.count("DELETE /apis/batch/v1/namespaces/live-ns/jobs/run-1?propagationPolicy=Background"), 2);
}

#[test]
fn api_errors_keep_code_reason_message_and_causes() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);

    let not_found = client.get(Resource::JOBS, "live-ns", "missing").unwrap_err();
    assert!(not_found.is_not_found());
    assert_eq!(not_found.to_string(), "GET /apis/batch/v1/namespaces/live-ns/jobs/missing: 404 NotFound: jobs.batch \"missing\" not found");
    assert_eq!(not_found.status().unwrap().details.name, "missing");

    client.create(Resource::SECRETS, "live-ns", &json!({ "metadata": { "name": "input" }, "data": {} })).unwrap();
    let exists = client.create(Resource::SECRETS, "live-ns", &json!({ "metadata": { "name": "input" } })).unwrap_err();
    assert!(exists.is_already_exists());
    assert_eq!(exists.to_string(), "POST /api/v1/namespaces/live-ns/secrets: 409 AlreadyExists: secrets \"input\" already exists");

    let invalid = client.create(Resource::CONFIG_MAPS, "live-ns", &json!({ "metadata": {} })).unwrap_err();
    assert!(invalid.is_invalid());
    let causes = &invalid.status().unwrap().details.causes;
    assert_eq!(causes[0].field, "metadata.name");
    assert_eq!(causes[0].reason, "FieldValueRequired");

    let bad_name = client.get(Resource::PODS, "live-ns", "../secrets").unwrap_err().to_string();
    assert!(bad_name.contains("`../secrets` is not a valid Kubernetes name"), "{bad_name}");
}

#[test]
fn secrets_config_maps_namespaces_and_claims() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.insert("/api/v1/namespaces", json!({ "metadata": { "name": "live-ns" } }));
    fake.insert("/api/v1/namespaces/live-ns/persistentvolumeclaims", json!({ "metadata": { "name": "cache" } }));
    assert_eq!(client.get(Resource::NAMESPACES, "", "live-ns").unwrap()["metadata"]["name"], "live-ns");
    assert_eq!(client.get(Resource::PERSISTENT_VOLUME_CLAIMS, "live-ns", "cache").unwrap()["metadata"]["name"], "cache");
    client.create(Resource::CONFIG_MAPS, "live-ns", &json!({ "metadata": { "generateName": "input-" } })).unwrap();
    let maps = client.list(Resource::CONFIG_MAPS, "live-ns", &ListParams::default()).unwrap();
    assert!(maps.items[0]["metadata"]["name"].as_str().unwrap().starts_with("input-"));
    client.create(Resource::SECRETS, "live-ns", &json!({ "metadata": { "name": "s" } })).unwrap();
    assert_eq!(client.list(Resource::SECRETS, "live-ns", &ListParams::default()).unwrap().items.len(), 1);
    assert!(client.delete(Resource::SECRETS, "live-ns", "s").unwrap());
}

#[test]
fn events_by_field_selector() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    let events = "/api/v1/namespaces/live-ns/events";
    fake.insert(
        events,
        json!({ "metadata": { "name": "e1" }, "involvedObject": { "name": "run-1-abcde", "kind": "Pod" }, "reason": "FailedScheduling" }),
    );
    fake.insert(events, json!({ "metadata": { "name": "e2" }, "involvedObject": { "name": "other", "kind": "Pod" }, "reason": "Pulled" }));
    let params = ListParams { field_selector: Some("involvedObject.name=run-1-abcde".into()), ..ListParams::default() };
    let list = client.list(Resource::EVENTS, "live-ns", &params).unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0]["reason"], "FailedScheduling");
    assert_eq!(fake.count("fieldSelector=involvedObject.name%3Drun-1-abcde"), 1);
}

#[test]
fn pod_logs_with_tail_and_limit() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.set_log("live-ns", "p", "one\ntwo\nthree\n", false);
    assert_eq!(client.pod_logs("live-ns", "p", &LogParams::default()).unwrap(), b"one\ntwo\nthree\n");
    let tail = LogParams { tail_lines: Some(2), container: Some("main".into()), ..LogParams::default() };
    assert_eq!(client.pod_logs("live-ns", "p", &tail).unwrap(), b"two\nthree\n");
    let limited = LogParams { limit_bytes: Some(5), ..LogParams::default() };
    assert_eq!(client.pod_logs("live-ns", "p", &limited).unwrap(), b"one\nt");

    fake.set_log("live-ns", "waiting", "", true);
    let error = client.pod_logs("live-ns", "waiting", &LogParams::default()).unwrap_err();
    assert_eq!(error.code(), Some(400));
    assert!(error.to_string().ends_with("is waiting to start: ContainerCreating"), "{error}");
}

#[test]
fn followed_log_yields_lines_as_they_are_written() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.set_log("live-ns", "p", "first\n", false);
    let stream = client.follow_pod_logs("live-ns", "p", &LogParams::default()).unwrap();
    let mut lines = stream.lines();
    assert_eq!(lines.next().unwrap().unwrap(), "first");
    std::thread::sleep(Duration::from_millis(100));
    fake.append_log("live-ns", "p", "second\n");
    let started = Instant::now();
    assert_eq!(lines.next().unwrap().unwrap(), "second");
    assert!(started.elapsed() < Duration::from_secs(1), "the line arrived as written");
    fake.append_log("live-ns", "p", "third\n");
    fake.finish_log("live-ns", "p");
    assert_eq!(lines.next().unwrap().unwrap(), "third");
    assert!(lines.next().is_none(), "EOF when the container exits");
}

#[test]
fn followed_log_can_be_aborted_from_another_thread() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.set_log("live-ns", "p", "first\n", false);
    let stream = client.follow_pod_logs("live-ns", "p", &LogParams::default()).unwrap();
    let abort = stream.abort_handle();
    let reader = std::thread::spawn(move || {
        let mut lines = stream.lines();
        let first = lines.next().unwrap().unwrap();
        let after = lines.next();
        (first, after.map(|line| line.map_err(|error| error.kind())))
    });
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    abort.abort();
    let (first, after) = reader.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(1), "abort closes the stream promptly");
    assert_eq!(first, "first");
    assert_eq!(after, Some(Err(std::io::ErrorKind::ConnectionAborted)));
}

/// Followed logs share one agent per client (an agent each held 256
/// agents at 256 followed logs): aborting one closes its connection
/// alone.
#[test]
fn aborting_one_followed_log_leaves_the_others_open() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.set_log("live-ns", "a", "a1\n", false);
    fake.set_log("live-ns", "b", "b1\n", false);
    let first = client.follow_pod_logs("live-ns", "a", &LogParams::default()).unwrap();
    let second = client.follow_pod_logs("live-ns", "b", &LogParams::default()).unwrap();
    let first_abort = first.abort_handle();
    let mut first = first.lines();
    let mut second = second.lines();
    assert_eq!(first.next().unwrap().unwrap(), "a1");
    assert_eq!(second.next().unwrap().unwrap(), "b1");
    first_abort.abort();
    assert_eq!(first.next().map(|line| line.map_err(|error| error.kind())), Some(Err(std::io::ErrorKind::ConnectionAborted)));
    fake.append_log("live-ns", "b", "b2\n");
    fake.finish_log("live-ns", "b");
    assert_eq!(second.next().unwrap().unwrap(), "b2", "the other log is still read");
    assert!(second.next().is_none());
    fake.set_log("live-ns", "c", "c1\n", false);
    let third = client.follow_pod_logs("live-ns", "c", &LogParams::default()).unwrap();
    assert_eq!(third.lines().next().unwrap().unwrap(), "c1", "a new stream connects after an abort");
}

#[test]
fn access_review_allowed_and_denied() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.deny("get", "secrets");
    let check = |verb: &str, group: &str, resource: &str| AccessCheck {
        namespace: "live-ns".into(),
        verb: verb.into(),
        group: group.into(),
        resource: resource.into(),
        ..AccessCheck::default()
    };
    let allowed = client.access_review(&check("create", "batch", "jobs")).unwrap();
    assert!(allowed.allowed && !allowed.denied);
    let denied = client.access_review(&check("get", "", "secrets")).unwrap();
    assert!(!denied.allowed);
    let sent = fake.requests().into_iter().find(|request| request.target.contains("selfsubjectaccessreviews")).unwrap();
    assert_eq!(sent.method, "POST");
}

#[test]
fn watch_lists_then_streams_changes_with_bookmarks() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.insert(PODS, json!({ "metadata": { "name": "a", "labels": { "run": "1" } } }));
    fake.insert(PODS, json!({ "metadata": { "name": "other", "labels": { "run": "2" } } }));
    let params = WatchParams { list: ListParams { label_selector: Some("run=1".into()), ..ListParams::default() }, timeout_s: 5 };
    let mut watcher = client.watch(Resource::PODS, "live-ns", params);
    let WatchEvent::Listed(items) = watcher.next().unwrap() else { panic!("a list first") };
    assert_eq!(items.len(), 1);
    fake.update(PODS, "a", |pod| pod["status"] = json!({ "phase": "Running" }));
    fake.insert(PODS, json!({ "metadata": { "name": "b", "labels": { "run": "1" } } }));
    fake.update(PODS, "other", |pod| pod["status"] = json!({ "phase": "Running" }));
    fake.remove(PODS, "a");
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let (kind, object) = match watcher.next().unwrap() {
            WatchEvent::Added(object) => ("ADDED", object),
            WatchEvent::Modified(object) => ("MODIFIED", object),
            WatchEvent::Deleted(object) => ("DELETED", object),
            WatchEvent::Listed(_) => panic!("no re-list expected"),
        };
        seen.push(format!("{kind} {}", object["metadata"]["name"].as_str().unwrap()));
    }
    assert_eq!(seen, ["MODIFIED a", "ADDED b", "DELETED a"]);
    assert_eq!(watcher.resource_version(), Some(fake.resource_version().to_string().as_str()));
    assert!(fake.count("allowWatchBookmarks=true&timeoutSeconds=5") >= 1);
    let _ = JOBS;
}
