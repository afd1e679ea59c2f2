//! The Kubernetes backend's warm pool sandboxes, plugged into the engine's
//! one pool manager (`engine::pools`, which keeps the threads, the
//! hand-out and the drain): a pool sandbox is a Job like a cold run's,
//! whose runner waits for one assignment, and a key Secret; its health is
//! its pod's; the run reaches it through the API server's `pods/proxy`;
//! `claim_patch` makes the Job the run's.
//!
//! Knows nothing of MCP; the decisions (when to make, replace, hand out)
//! are `engine::pools::pool`'s.

use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use crate::backend::kubernetes::Kubernetes;
use crate::backend::kubernetes::manifest::{self, PoolSandbox};
use crate::engine::pools::{self, Health, Listed, NewSandbox, PoolSandboxes};
use crate::engine::port::spec::Policy;
use crate::engine::port::{self, ErrorKind};
use crate::kube::objects::Pod;
use crate::kube::{self, ListParams, ProxyTarget, Resource};
use crate::log;
use crate::metrics;
use crate::sandbox::assignment::{self, Assignment, Key};

/// How long a delivery keeps trying while the runner's port is not open
/// yet (its container runs, its listener is a few milliseconds away).
const DELIVERY_RETRY_FOR: Duration = Duration::from_secs(3);
/// How long the hand-off may wait for the runner's answer: it writes the
/// input files and answers at once, so a longer wait is a hand-off gone
/// wrong, which ends the run with a message naming it, not its whole start
/// timeout later.
const DELIVERY_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The server's pools on a cluster.
pub type Pools = pools::Pools<Kubernetes>;

/// A sandbox handed to a run, until its assignment is delivered: its pod
/// is `name`.
pub type Reserved = pools::Reserved<Made>;

/// What a pool sandbox's delivery needs besides its pod.
pub struct Made {
    pub key: Key,
    /// When its Job was made: the Job's deadline counts from there.
    pub created: SystemTime,
}

impl PoolSandboxes for Kubernetes {
    type Made = Made;

    fn pool_policy(&self) -> &Policy {
        &self.policy
    }

    /// Its Job (the cold Job of the pool's shape, whose runner waits for
    /// the assignment), then its key Secret.
    fn create_sandbox(&self, sandbox: &NewSandbox) -> Result<Made, port::Error> {
        let key = Key::random().map_err(|why| port::Error { what: "make a pool sandbox's key", kind: ErrorKind::Refused, message: why })?;
        let labels = PoolSandbox { pool: sandbox.pool, owner: sandbox.owner, max_wait: sandbox.max_wait, preload: sandbox.preload };
        let mut job = manifest::pool_job(sandbox.template, &self.policy, &self.cluster, sandbox.run_id, &labels);
        if let Some(template) = &self.pod_template {
            manifest::apply_pod_template(&mut job, template);
        }
        // Unclaimed, it is useless once its runner stops waiting; a claim
        // writes the run's own expiry.
        let expires_at = SystemTime::now() + sandbox.max_wait + crate::engine::run::EXPIRY_SLACK;
        // A pool Job that ends unclaimed (its runner stopped waiting) holds
        // nothing anyone reads: it goes at once. A claim writes the run's TTL.
        let retention = manifest::Retention { expires_at: log::rfc3339_utc(expires_at), finished_ttl: Duration::ZERO, background: None };
        manifest::apply_retention(&mut job, &retention);
        let namespace = &self.cluster.namespace;
        let created = match self.client.create(Resource::JOBS, namespace, &job) {
            Ok(created) => kube::objects::Job::from_value(&created),
            Err(error) => {
                metrics::api_error("create_pool_job");
                return Err(super::api_error("create a pool sandbox's Job", &error));
            }
        };
        let mut secret = manifest::key_secret(&self.cluster, sandbox.run_id, &created.metadata.uid, &key.to_hex());
        manifest::apply_retention(&mut secret, &retention);
        if let Err(error) = self.client.create(Resource::SECRETS, namespace, &secret) {
            metrics::api_error("create_secret");
            self.delete_sandbox(sandbox.run_id);
            return Err(super::api_error("create a pool sandbox's key Secret", &error));
        }
        Ok(Made { key, created: SystemTime::now() })
    }

    /// The pool's pods: ready (the main container runs, nobody deletes the
    /// pod), ended (or being deleted), or starting.
    fn list_sandboxes(&self, pool: &str, owner: &str) -> Result<Vec<Listed>, port::Error> {
        let selector = format!("{}={pool},{}={owner}", manifest::LABEL_POOL, manifest::LABEL_POOL_OWNER);
        let params = ListParams { label_selector: Some(selector), field_selector: None };
        let list = self
            .client
            .list(Resource::PODS, &self.cluster.namespace, &params)
            .map_err(|error| super::api_error("list a pool's pods", &error))?;
        let pods = list.items.iter().map(Pod::from_value);
        Ok(pods
            .filter_map(|pod| {
                let run_id = pod.metadata.labels.get(manifest::LABEL_RUN_ID)?.clone();
                Some(Listed { run_id, name: pod.metadata.name.clone(), health: health(&pod) })
            })
            .collect())
    }

    fn sandbox_is_ready(&self, pod: &str) -> bool {
        match self.client.get_if_exists(Resource::PODS, &self.cluster.namespace, pod) {
            Ok(Some(value)) => health(&Pod::from_value(&value)) == Health::Ready,
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// The assignment, with the sandbox's key, through `pods/proxy`.
    fn deliver(&self, reserved: &Reserved, assignment: &Assignment) -> Result<(), port::Error> {
        let assignment = &manifest::with_hold(assignment.clone(), self.pool_policy());
        let body = assignment::encode(&reserved.made.key, assignment);
        let started = Instant::now();
        loop {
            let to = ProxyTarget {
                namespace: &self.cluster.namespace,
                pod: &reserved.name,
                port: assignment::PORT,
                path: assignment::PATH,
                read_timeout: DELIVERY_READ_TIMEOUT,
            };
            let sent = self.client.proxy_post(&to, body.clone());
            match sent {
                Ok(_) => return Ok(()),
                // The API server says 503 while the port is not open yet.
                Err(error) if error.code() == Some(503) && started.elapsed() < DELIVERY_RETRY_FOR => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(error) => return Err(super::api_error("hand the run to its warm pod", &error)),
            }
        }
    }

    /// The Job goes (its pod and key Secret with it, by the garbage
    /// collector); the Secret is deleted too, so the key never outlives it.
    fn delete_sandbox(&self, run_id: &str) {
        let name = manifest::job_name(run_id);
        if let Err(error) = self.client.delete(Resource::JOBS, &self.cluster.namespace, &name) {
            metrics::api_error("delete_job");
            log::warn(
                "pool sandbox not deleted; its expiry and the reaper remove it",
                &[("job", name.as_str().into()), ("error", error.to_string().into())],
            );
        }
        let _ = self.client.delete(Resource::SECRETS, &self.cluster.namespace, &name);
    }
}

/// Ready: the runner waits for its assignment (the main container runs and
/// nobody is deleting the pod). Ended: it is being deleted, or it or its
/// main container ended.
fn health(pod: &Pod) -> Health {
    let main_container = || pod.status.container_statuses.iter().find(|status| status.name == manifest::MAIN_CONTAINER);
    if pod.metadata.deletion_timestamp.is_some()
        || matches!(pod.status.phase.as_deref(), Some("Succeeded" | "Failed"))
        || main_container().is_some_and(|status| status.state.terminated.is_some())
    {
        Health::Ended
    } else if pod.status.phase.as_deref() == Some("Running") && main_container().is_some_and(|status| status.state.running.is_some()) {
        Health::Ready
    } else {
        Health::Starting
    }
}

/// The merge patch that makes a pool sandbox's Job the run's: its
/// retention (expiry, TTL, a background run's record and label), the hand
/// out time, and a Job deadline counted from the Job's creation.
pub fn claim_patch(retention: &manifest::Retention, job_age: Duration, run_deadline: Duration) -> serde_json::Value {
    let mut job = json!({"metadata": {"labels": {}}, "spec": {}});
    manifest::apply_retention(&mut job, retention);
    job["metadata"]["annotations"][manifest::ANNOTATION_ASSIGNED_AT] = json!(log::rfc3339_utc(SystemTime::now()));
    job["spec"]["activeDeadlineSeconds"] = json!((job_age + run_deadline + manifest::JOB_DEADLINE_SLACK).as_secs());
    // `apply_retention` writes the TTL only onto a Job it knows as one.
    job["spec"]["ttlSecondsAfterFinished"] = json!(retention.finished_ttl.as_secs());
    job
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claim makes the pool Job the run's: the run's expiry and TTL, a
    /// background run's record and label, the hand-out time, and a Job
    /// deadline that counts the Job's idle age (it runs from the Job's
    /// start) on top of the run's own.
    #[test]
    fn a_claim_patch_gives_the_job_the_runs_retention_and_deadline() {
        let mut record = serde_json::Map::new();
        record.insert("mcp-k8s-ephemeral-job/token".into(), json!("job-abc-1"));
        let retention = manifest::Retention {
            expires_at: "2026-12-01T00:00:00Z".into(),
            finished_ttl: Duration::from_secs(3600),
            background: Some(record),
        };
        let patch = claim_patch(&retention, Duration::from_secs(200), Duration::from_secs(300));
        assert_eq!(patch["spec"]["activeDeadlineSeconds"], 200 + 300 + manifest::JOB_DEADLINE_SLACK.as_secs());
        assert_eq!(patch["spec"]["ttlSecondsAfterFinished"], 3600);
        let annotations = &patch["metadata"]["annotations"];
        assert_eq!(annotations[manifest::ANNOTATION_EXPIRES_AT], "2026-12-01T00:00:00Z");
        assert_eq!(annotations["mcp-k8s-ephemeral-job/token"], "job-abc-1");
        assert!(annotations[manifest::ANNOTATION_ASSIGNED_AT].is_string(), "{patch}");
        assert_eq!(patch["metadata"]["labels"][manifest::LABEL_MODE], manifest::MODE_BACKGROUND);

        let sync = manifest::Retention { expires_at: "x".into(), finished_ttl: Duration::from_secs(300), background: None };
        let patch = claim_patch(&sync, Duration::ZERO, Duration::from_secs(100));
        assert!(patch["metadata"]["labels"].get(manifest::LABEL_MODE).is_none(), "a sync run is not listed: {patch}");
    }
}
