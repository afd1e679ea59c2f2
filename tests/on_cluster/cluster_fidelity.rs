//! Keeps the fake API server honest: the same requests against the fake and
//! the real test cluster must give the same `Status` bodies (code, reason,
//! message, details, causes) and the same watch event sequence.

use std::time::{Duration, Instant};

use crate::support::fake_api::FakeApi;
use crate::support::{cluster, connect};
use mcp_k8s_ephemeral_job::kube::error::Status;
use mcp_k8s_ephemeral_job::kube::watch::{WatchEvent, WatchParams};
use mcp_k8s_ephemeral_job::kube::{Client, ListParams, Resource};
use serde_json::json;

/// The error `call` gives on both servers, with the namespace made neutral.
fn both(call: impl Fn(&Client) -> Result<(), mcp_k8s_ephemeral_job::kube::Error>) -> (Status, Status) {
    let fake = FakeApi::start();
    let (fake_client, _temp) = connect(&fake);
    let real_client = cluster::admin_client_in_jobs_namespace();
    let status = |client: &Client| call(client).expect_err("an error").status().cloned().expect("a Status");
    (status(&fake_client), status(&real_client))
}

#[test]
fn not_found_matches() {
    let name = cluster::unique_name("kube-missing");
    let (fake, real) = both(|client| client.get(Resource::JOBS, client.namespace(), &name).map(|_| ()));
    assert_eq!(fake, real);
    assert_eq!(real.message, format!("jobs.batch \"{name}\" not found"));
}

#[test]
fn already_exists_matches() {
    let name = cluster::unique_name("kube-dup");
    let secret = json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": name } });
    let (fake, real) = both(|client| {
        client.create(Resource::SECRETS, client.namespace(), &secret)?;
        let second = client.create(Resource::SECRETS, client.namespace(), &secret).map(|_| ());
        client.delete(Resource::SECRETS, client.namespace(), &name)?;
        second
    });
    assert_eq!(real.reason, "AlreadyExists");
    assert_eq!(fake, real);
}

#[test]
fn invalid_without_a_name_matches() {
    let secret = json!({ "apiVersion": "v1", "kind": "Secret", "metadata": {} });
    let (fake, real) = both(|client| client.create(Resource::SECRETS, client.namespace(), &secret).map(|_| ()));
    assert_eq!(real.details.kind, "Secret", "the real API names the Kind here, not the resource");
    assert_eq!(fake, real);
}

/// Event kinds for: watch, create a suspended Job, delete it. MODIFIED
/// events (status updates by the controller) are dropped before comparing.
fn watch_sequence(client: &Client, name: &str) -> Vec<String> {
    let list = ListParams { field_selector: Some(format!("metadata.name={name}")), ..ListParams::default() };
    let mut watcher = client.watch(Resource::JOBS, client.namespace(), WatchParams { list, timeout_s: 30 });
    let mut kinds = Vec::new();
    let job = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": { "name": name },
        "spec": {
            "suspend": true,
            "template": { "spec": cluster::restricted_pod_spec(&cluster::busybox_image(), "true") },
        },
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "watch sequence incomplete: {kinds:?}");
        let kind = match watcher.next().unwrap() {
            WatchEvent::Listed(items) => format!("LISTED {}", items.len()),
            WatchEvent::Added(object) => format!("ADDED {}", object["kind"].as_str().unwrap_or("(no kind)")),
            WatchEvent::Modified(_) => continue,
            WatchEvent::Deleted(object) => format!("DELETED {}", object["kind"].as_str().unwrap_or("(no kind)")),
        };
        kinds.push(kind);
        match kinds.len() {
            1 => {
                client.create(Resource::JOBS, client.namespace(), &job).unwrap();
            }
            2 => {
                client.delete(Resource::JOBS, client.namespace(), name).unwrap();
            }
            _ => return kinds,
        }
    }
}

#[test]
fn watch_event_sequence_matches() {
    let name = cluster::unique_name("kube-watch");
    let fake = FakeApi::start();
    let (fake_client, _temp) = connect(&fake);
    let real_client = cluster::admin_client_in_jobs_namespace();
    let fake_kinds = watch_sequence(&fake_client, &name);
    let real_kinds = watch_sequence(&real_client, &name);
    assert_eq!(real_kinds, ["LISTED 0", "ADDED Job", "DELETED Job"]);
    assert_eq!(fake_kinds, real_kinds);
}
