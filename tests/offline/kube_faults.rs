//! Every fault the fake API server can inject, with the recovery the client
//! must make: dropped watches resume from the last resourceVersion, 410 Gone
//! (HTTP or ERROR event) re-lists, 429/5xx are retried with backoff and
//! `Retry-After` for idempotent calls but not for creates, a 401 re-runs the
//! exec plugin once, stalls hit the read timeout, and aborts end streams.

use std::time::{Duration, Instant};

use crate::support::fake_api::{FakeApi, Fault};
use crate::support::{TempDir, connect, fast_options, render_fixture};
use mcp_k8s_ephemeral_job::kube::watch::{WatchEvent, WatchParams, Watcher};
use mcp_k8s_ephemeral_job::kube::{Client, Error, ListParams, Resource, Source};
use serde_json::json;

const PODS: &str = "/api/v1/namespaces/live-ns/pods";

fn pod(name: &str) -> serde_json::Value {
    json!({ "metadata": { "name": name, "labels": { "app": "mcp" } } })
}

fn watcher(client: &Client, timeout_s: u32) -> Watcher {
    let list = ListParams { label_selector: Some("app=mcp".into()), ..ListParams::default() };
    client.watch(Resource::PODS, "live-ns", WatchParams { list, timeout_s })
}

/// The next event as `KIND name` (or `LISTED a,b`).
fn next(watcher: &mut Watcher) -> String {
    match watcher.next().unwrap() {
        WatchEvent::Listed(items) => {
            let names: Vec<&str> = items.iter().map(|item| item["metadata"]["name"].as_str().unwrap()).collect();
            format!("LISTED {}", names.join(","))
        }
        WatchEvent::Added(object) => format!("ADDED {}", object["metadata"]["name"].as_str().unwrap()),
        WatchEvent::Modified(object) => format!("MODIFIED {}", object["metadata"]["name"].as_str().unwrap()),
        WatchEvent::Deleted(object) => format!("DELETED {}", object["metadata"]["name"].as_str().unwrap()),
    }
}

fn watch_targets(fake: &FakeApi) -> Vec<String> {
    fake.requests().into_iter().filter(|request| request.target.contains("watch=1")).map(|request| request.target).collect()
}

#[test]
fn watch_closed_mid_stream_resumes_from_the_last_resource_version() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.insert(PODS, pod("a"));
    let mut watcher = watcher(&client, 30);
    assert_eq!(next(&mut watcher), "LISTED a");
    fake.inject("watch=1", Fault::CloseAfterEvents(1), 1);
    fake.insert(PODS, pod("b"));
    fake.insert(PODS, pod("c"));
    fake.insert(PODS, pod("d"));
    let events: Vec<String> = (0..3).map(|_| next(&mut watcher)).collect();
    assert_eq!(events, ["ADDED b", "ADDED c", "ADDED d"], "each event once, in order, no re-list");
    let targets = watch_targets(&fake);
    assert_eq!(targets.len(), 2);
    assert!(targets[0].contains("resourceVersion=1&"), "{}", targets[0]);
    assert!(targets[1].contains("resourceVersion=2&"), "resumed after b: {}", targets[1]);
    fake.assert_fired("watch=1");
}

#[test]
fn watch_server_timeout_reconnects_without_relisting() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.insert(PODS, pod("a"));
    let mut watcher = watcher(&client, 1);
    assert_eq!(next(&mut watcher), "LISTED a");
    let fake_ref = &fake;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(2500));
            fake_ref.insert(PODS, pod("late"));
        });
        assert_eq!(next(&mut watcher), "ADDED late");
    });
    assert!(watch_targets(&fake).len() >= 2, "the 1 s watch was re-opened");
    let lists = fake.requests().iter().filter(|request| !request.target.contains("watch=1")).count();
    assert_eq!(lists, 1, "one list only");
}

#[test]
fn watch_gone_error_event_relists() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.insert(PODS, pod("a"));
    let mut watcher = watcher(&client, 30);
    assert_eq!(next(&mut watcher), "LISTED a");
    fake.inject("watch=1", Fault::GoneEvent, 1);
    fake.insert(PODS, pod("b"));
    assert_eq!(next(&mut watcher), "LISTED a,b", "re-listed after the 410 ERROR event");
    fake.insert(PODS, pod("c"));
    assert_eq!(next(&mut watcher), "ADDED c");
    fake.assert_fired("watch=1");
}

#[test]
fn watch_from_a_compacted_resource_version_relists() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.insert(PODS, pod("a"));
    let mut watcher = watcher(&client, 30);
    assert_eq!(next(&mut watcher), "LISTED a");
    fake.remove(PODS, "a");
    fake.insert(PODS, pod("b"));
    fake.compact();
    assert_eq!(next(&mut watcher), "LISTED b", "history is gone: the new full set");
    assert!(fake.compacted_served() >= 1, "no watch was answered 410 for the compacted history");
}

#[test]
fn watch_gone_http_status_relists() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.insert(PODS, pod("a"));
    let mut watcher = watcher(&client, 30);
    assert_eq!(next(&mut watcher), "LISTED a");
    fake.inject("watch=1", Fault::Status { code: 410, retry_after: None }, 1);
    assert_eq!(next(&mut watcher), "LISTED a");
    fake.assert_fired("watch=1");
}

#[test]
fn watch_retries_server_errors_then_continues() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.insert(PODS, pod("a"));
    let mut watcher = watcher(&client, 30);
    assert_eq!(next(&mut watcher), "LISTED a");
    fake.inject("watch=1", Fault::Status { code: 500, retry_after: None }, 2);
    fake.insert(PODS, pod("b"));
    assert_eq!(next(&mut watcher), "ADDED b");
    assert_eq!(watch_targets(&fake).len(), 3);
    fake.assert_fired("watch=1");
}

#[test]
fn watch_stall_hits_the_read_timeout_and_reconnects() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.insert(PODS, pod("a"));
    let mut watcher = watcher(&client, 1);
    assert_eq!(next(&mut watcher), "LISTED a");
    fake.inject("watch=1", Fault::Stall(Duration::from_secs(30)), 1);
    fake.insert(PODS, pod("b"));
    let started = Instant::now();
    assert_eq!(next(&mut watcher), "ADDED b");
    let elapsed = started.elapsed();
    // timeoutSeconds (1 s) + read timeout (2 s) of silence, then a new watch.
    assert!(elapsed >= Duration::from_secs(3) && elapsed < Duration::from_secs(10), "{elapsed:?}");
    fake.assert_fired("watch=1");
}

#[test]
fn watch_forbidden_is_returned() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    let mut watcher = watcher(&client, 30);
    fake.inject("GET /api/v1/namespaces/live-ns/pods", Fault::Status { code: 403, retry_after: None }, 1);
    let error = watcher.next().unwrap_err();
    assert!(error.is_forbidden(), "{error}");
    fake.assert_fired("GET /api/v1/namespaces/live-ns/pods");
}

#[test]
fn watch_abort_from_another_thread() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    let mut watcher = watcher(&client, 30);
    assert_eq!(next(&mut watcher), "LISTED ");
    let abort = watcher.abort_handle();
    let handle = std::thread::spawn(move || watcher.next());
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    abort.abort();
    let result = handle.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(1), "abort is prompt");
    assert!(matches!(result, Err(Error::Aborted { .. })), "{result:?}");
}

#[test]
fn too_many_requests_honours_retry_after() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.inject("GET /version", Fault::Status { code: 429, retry_after: Some(1) }, 1);
    let started = Instant::now();
    client.version().unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1), "waited for Retry-After");
    assert_eq!(fake.count("GET /version"), 2);
    fake.assert_fired("GET /version");
}

/// Which verbs are retried on which answers: (method, fault, answers injected, expected outcome, requests seen).
#[test]
fn retry_policy_by_verb_and_status() {
    let cases: &[(&str, u16, Option<u64>, bool, usize)] = &[
        ("GET", 500, None, true, 2),
        ("GET", 503, None, true, 2),
        ("GET", 502, None, true, 2),
        ("DELETE", 500, None, true, 2),
        ("POST", 500, None, false, 1),
        ("POST", 503, None, false, 1),
        ("POST", 503, Some(0), true, 2),
        ("POST", 429, None, true, 2),
        ("GET", 404, None, false, 1),
        ("POST", 409, None, false, 1),
    ];
    let mut failures = Vec::new();
    for (index, (method, code, retry_after, succeeds, requests)) in cases.iter().enumerate() {
        let fake = FakeApi::start();
        let (client, _temp) = connect(&fake);
        let name = format!("pod-{index}");
        if *method != "POST" {
            fake.insert(PODS, pod(&name));
        }
        fake.inject(&format!("{method} {PODS}"), Fault::Status { code: *code, retry_after: *retry_after }, 1);
        let result = match *method {
            "GET" => client.get(Resource::PODS, "live-ns", &name).map(|_| ()),
            "DELETE" => client.delete(Resource::PODS, "live-ns", &name).map(|_| ()),
            _ => client.create(Resource::PODS, "live-ns", &pod(&name)).map(|_| ()),
        };
        let seen = fake.count(&format!("{method} {PODS}"));
        fake.assert_fired(&format!("{method} {PODS}"));
        if result.is_ok() != *succeeds || seen != *requests {
            failures.push(format!("{method} {code} retry_after={retry_after:?}: result {result:?}, {seen} requests"));
        }
        if let Err(error) = result {
            assert_eq!(error.code(), Some(*code));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn persistent_server_errors_give_up_after_the_retry_budget() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.inject("GET /version", Fault::Status { code: 500, retry_after: None }, 100);
    let error = client.version().unwrap_err();
    assert_eq!(error.to_string(), "GET /version: 500 InternalError: Internal error occurred: injected fault");
    assert_eq!(fake.count("GET /version"), 1 + fast_options().max_retries as usize);
    fake.assert_fired("GET /version");
}

#[test]
fn stalled_get_is_retried_after_the_read_timeout() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.inject("GET /version", Fault::Stall(Duration::from_secs(10)), 1);
    let started = Instant::now();
    client.version().unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(8), "{elapsed:?}");
    fake.assert_fired("GET /version");
}

#[test]
fn stalled_create_is_not_retried() {
    let fake = FakeApi::start();
    let (client, _temp) = connect(&fake);
    fake.inject("POST /apis/batch/v1", Fault::Stall(Duration::from_secs(10)), 1);
    let job = json!({ "metadata": { "name": "j" } });
    let error = client.create(Resource::JOBS, "live-ns", &job).unwrap_err();
    assert!(matches!(error, Error::Transport { .. }), "{error}");
    assert!(error.to_string().starts_with("POST /apis/batch/v1/namespaces/live-ns/jobs: "), "{error}");
    assert_eq!(fake.count("POST /apis/batch/v1"), 1, "the create may have happened: never repeated");
    fake.assert_fired("POST /apis/batch/v1");
}

#[test]
fn connection_refused_is_retried_then_reported() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let temp = TempDir::new("refused");
    let text = render_fixture("live/insecure.yaml", &[("SERVER", &format!("https://127.0.0.1:{port}")), ("CA_DATA", "")]);
    let path = temp.write("kubeconfig", &text);
    let client = Client::with_options(&Source::KubeconfigFile { path, context: None }, fast_options()).unwrap();
    let error = client.version().unwrap_err();
    assert!(matches!(error, Error::Transport { .. }), "{error}");
    assert!(error.to_string().starts_with("GET /version: "), "{error}");
}

#[test]
fn unauthorized_once_reruns_the_exec_plugin_and_recovers() {
    let fake = FakeApi::start();
    let temp = TempDir::new("401-once");
    temp.write_script(
        "config/bin/plugin.sh",
        "#!/bin/sh\nd=$(dirname \"$0\")\necho x >> \"$d/runs\"\necho '{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"t\"}}'\n",
    );
    let ca_data = crate::support::base64(&fake.pki.ca_pem);
    let text = render_fixture("live/exec-v1beta1.yaml", &[("SERVER", &fake.url), ("CA_DATA", &ca_data)]);
    let path = temp.write("config/kubeconfig", &text);
    let client = Client::with_options(&Source::KubeconfigFile { path, context: None }, fast_options()).unwrap();
    fake.inject("GET /version", Fault::Status { code: 401, retry_after: None }, 1);
    client.version().unwrap();
    let runs = std::fs::read_to_string(temp.path.join("config/bin/runs")).unwrap().lines().count();
    assert_eq!(runs, 2, "first run, then one re-run after the 401");
    assert_eq!(fake.count("GET /version"), 2);
    fake.assert_fired("GET /version");
}
