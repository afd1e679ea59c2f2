//! The Kubernetes client's first checks through this client, against the real test
//! cluster: a restricted-compliant busybox Job runs to completion (watched),
//! its log is read, and the TTL controller deletes Job and pod; Pod Security
//! refuses a non-compliant pod with a clear error and admits a compliant one;
//! a followed log delivers lines as they are printed.

use std::io::BufRead;
use std::time::{Duration, Instant};

use crate::support::cluster;
use mcp_k8s_ephemeral_job::kube::watch::{WatchEvent, WatchParams, Watcher};
use mcp_k8s_ephemeral_job::kube::{Client, ListParams, LogParams, Resource};
use serde_json::{Value, json};

fn job(name: &str, script: &str, ttl_s: u32) -> Value {
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": { "name": name, "labels": { "app.kubernetes.io/name": "kube-client-test" } },
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": ttl_s,
            "activeDeadlineSeconds": 120,
            "template": { "spec": cluster::restricted_pod_spec(&cluster::busybox_image(), script) },
        },
    })
}

fn job_watcher(client: &Client, name: &str) -> Watcher {
    let list = ListParams { field_selector: Some(format!("metadata.name={name}")), ..ListParams::default() };
    client.watch(Resource::JOBS, client.namespace(), WatchParams { list, timeout_s: 60 })
}

/// Waits (through the watch) until `done` holds for the object; gives up
/// after `limit` by aborting the watch from a timer thread.
fn wait_for(watcher: &mut Watcher, limit: Duration, done: impl Fn(&Value) -> bool) -> Value {
    let abort = watcher.abort_handle();
    let timer = std::thread::spawn(move || {
        std::thread::sleep(limit);
        abort.abort();
    });
    loop {
        let objects = match watcher.next() {
            Ok(WatchEvent::Listed(items)) => items,
            Ok(WatchEvent::Added(object) | WatchEvent::Modified(object)) => vec![object],
            Ok(WatchEvent::Deleted(_)) => Vec::new(),
            Err(error) => panic!("watch ended before the condition held: {error}"),
        };
        if let Some(object) = objects.into_iter().find(|object| done(object)) {
            drop(timer);
            return object;
        }
    }
}

fn has_condition(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| conditions.iter().any(|condition| condition["type"] == kind && condition["status"] == "True"))
}

fn job_pods(client: &Client, job_name: &str) -> Vec<Value> {
    let params = ListParams { label_selector: Some(format!("batch.kubernetes.io/job-name={job_name}")), ..ListParams::default() };
    client.list(Resource::PODS, client.namespace(), &params).unwrap().items
}

#[test]
fn compliant_job_completes_logs_and_is_deleted_by_ttl() {
    // Admin: watching Jobs is more than the server's Role grants.
    let client = cluster::admin_client_in_jobs_namespace();
    let name = cluster::unique_name("kube-ttl");
    let created = client.create(Resource::JOBS, client.namespace(), &job(&name, "echo hello from $(id -u)", 3)).unwrap();
    assert_eq!(created["metadata"]["name"], name.as_str());

    let mut watcher = job_watcher(&client, &name);
    let finished = wait_for(&mut watcher, Duration::from_secs(90), |job| has_condition(job, "Complete") || has_condition(job, "Failed"));
    assert!(has_condition(&finished, "Complete"), "job failed: {}", finished["status"]);

    let pods = job_pods(&client, &name);
    assert_eq!(pods.len(), 1, "one pod");
    let pod_name = pods[0]["metadata"]["name"].as_str().unwrap().to_string();
    let log =
        client.pod_logs(client.namespace(), &pod_name, &LogParams { container: Some("main".into()), ..LogParams::default() }).unwrap();
    assert_eq!(String::from_utf8_lossy(&log), "hello from 65532\n");

    // The TTL controller deletes the Job (seen as DELETED), then GC its pod.
    wait_for_deleted(&mut watcher, &name, Duration::from_secs(90));
    wait_for_no_pods(&client, &name, Duration::from_secs(60));
}

fn wait_for_deleted(watcher: &mut Watcher, name: &str, limit: Duration) {
    let abort = watcher.abort_handle();
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        abort.abort();
    });
    loop {
        match watcher.next() {
            Ok(WatchEvent::Deleted(object)) => {
                assert_eq!(object["metadata"]["name"], name);
                return;
            }
            Ok(_) => {}
            Err(error) => panic!("Job `{name}` not deleted by the TTL controller in {limit:?}: {error}"),
        }
    }
}

fn wait_for_no_pods(client: &Client, job_name: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !job_pods(client, job_name).is_empty() {
        assert!(Instant::now() < deadline, "pods of the deleted Job `{job_name}` still exist");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn pod_security_refuses_a_non_compliant_pod_and_admits_a_compliant_one() {
    // The server's Role cannot create pods directly; the admin can, and Pod
    // Security admission applies to both.
    let admin = cluster::client("admin.kubeconfig");
    let namespace = cluster::namespace();
    let name = cluster::unique_name("kube-psa");
    let mut spec = cluster::restricted_pod_spec(&cluster::busybox_image(), "true");
    spec["containers"][0]["securityContext"] = json!({ "privileged": true });
    let pod = json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name }, "spec": spec });
    let error = admin.create(Resource::PODS, &namespace, &pod).unwrap_err();
    assert!(error.is_forbidden(), "{error}");
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "POST /api/v1/namespaces/{namespace}/pods: 403 Forbidden: pods \"{name}\" is forbidden: violates PodSecurity \"restricted:"
        )),
        "{text}"
    );
    assert!(text.contains("privileged"), "{text}");

    let compliant = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name },
        "spec": cluster::restricted_pod_spec(&cluster::busybox_image(), "true"),
    });
    admin.create(Resource::PODS, &namespace, &compliant).expect("a compliant pod is admitted");
    assert!(admin.delete(Resource::PODS, &namespace, &name).unwrap());
}

#[test]
fn a_non_compliant_job_reports_failed_create_events() {
    let client = cluster::client("server.kubeconfig");
    let name = cluster::unique_name("kube-badjob");
    let mut job = job(&name, "true", 30);
    job["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] = json!(false);
    job["spec"]["template"]["spec"]["securityContext"]["runAsUser"] = json!(0);
    // The Job itself is admitted (Pod Security checks pods); its pods are not.
    client.create(Resource::JOBS, client.namespace(), &job).unwrap();
    let params = ListParams { field_selector: Some(format!("involvedObject.name={name}")), ..ListParams::default() };
    let deadline = Instant::now() + Duration::from_secs(60);
    let message = loop {
        let events = client.list(Resource::EVENTS, client.namespace(), &params).unwrap().items;
        if let Some(event) = events.iter().find(|event| event["reason"] == "FailedCreate") {
            break event["message"].as_str().unwrap_or_default().to_string();
        }
        assert!(Instant::now() < deadline, "no FailedCreate event for {name}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(message.contains("violates PodSecurity \"restricted:"), "{message}");
    assert!(message.contains("runAsNonRoot") || message.contains("runAsUser"), "{message}");
    client.delete(Resource::JOBS, client.namespace(), &name).unwrap();
}

#[test]
fn followed_log_reads_lines_as_they_are_printed() {
    let client = cluster::client("server.kubeconfig");
    let name = cluster::unique_name("kube-follow");
    let script = "for i in 1 2 3; do echo line-$i; sleep 1; done";
    client.create(Resource::JOBS, client.namespace(), &job(&name, script, 30)).unwrap();

    let deadline = Instant::now() + Duration::from_secs(90);
    let stream = loop {
        assert!(Instant::now() < deadline, "pod never started");
        let Some(pod) = job_pods(&client, &name).into_iter().next() else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        let pod_name = pod["metadata"]["name"].as_str().unwrap().to_string();
        match client.follow_pod_logs(client.namespace(), &pod_name, &LogParams::default()) {
            Ok(stream) => break stream,
            // 400 "is waiting to start" until the container runs.
            Err(error) if error.code() == Some(400) => std::thread::sleep(Duration::from_millis(200)),
            Err(error) => panic!("follow: {error}"),
        }
    };
    let mut arrivals = Vec::new();
    for line in stream.lines() {
        arrivals.push((line.unwrap(), Instant::now()));
    }
    let lines: Vec<&str> = arrivals.iter().map(|(line, _)| line.as_str()).collect();
    assert_eq!(lines, ["line-1", "line-2", "line-3"]);
    // The stream may open after line-1 was printed, but line-3 is printed a
    // second after line-2 and must arrive that much later, not at the end.
    let gap = arrivals[2].1 - arrivals[1].1;
    assert!(gap >= Duration::from_millis(700), "lines arrived as printed, not at the end: {gap:?}");
    client.delete(Resource::JOBS, client.namespace(), &name).unwrap();
}
