//! Open sandboxes on Kubernetes (`engine::port::SandboxStore`): the
//! sandbox is a Job like a warm pool's (`manifest::session_job`), whose
//! runner takes call after call on its port, with its key Secret. Its
//! record is the Job's annotations: the sandbox itself (fixed), the call
//! that runs and when the last one ended. A call takes the sandbox by a
//! merge patch conditioned on the Job's `resourceVersion`, so two servers
//! (or replicas) never both take it.
//!
//! A call goes through the API server's `pods/proxy` as `POST /assign`,
//! whose answer streams the call's frames until its result (the log keeps
//! them too); a cancel is a `POST /cancel` with the key, the same way.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::backend::kubernetes::{Kubernetes, manifest, watch};
use crate::engine::port::sandbox_record::{self, CallMark, Record, Seen};
use crate::engine::port::spec::RunSpec;
use crate::engine::port::{self, Abort, Delivered, ErrorKind, Output, Refused, SandboxStore};
use crate::engine::sandboxes::rules;
use crate::kube::objects::Job;
use crate::kube::{self, ListParams, ProxyTarget, Resource};
use crate::log;
use crate::metrics;
use crate::sandbox::assignment::{self, Assignment, Key};
use crate::sandbox::frame::Tag;
use crate::sandbox::session;

/// How long a delivery keeps trying while the runner's port is not open
/// yet, or the pod's address not yet known to the API server.
const DELIVERY_RETRY_FOR: Duration = Duration::from_secs(5);
/// How far before a call's start its log is read, in seconds.
const LOG_SLACK_S: u64 = 60;
/// How often a patch of the record is tried again after a conflict.
const PATCH_ATTEMPTS: usize = 4;

fn seen_of(job: &Job) -> Option<Seen> {
    let annotations = &job.metadata.annotations;
    let record = sandbox_record::decode_record(annotations.get(manifest::ANNOTATION_SANDBOX_RECORD)?)?;
    let last_used_ms = annotations.get(manifest::ANNOTATION_SANDBOX_USED_MS).and_then(|text| text.parse().ok());
    Some(Seen {
        call: annotations.get(manifest::ANNOTATION_SANDBOX_CALL).and_then(|text| sandbox_record::decode_call(text)),
        version: job.metadata.resource_version.clone(),
        alive: job.metadata.deletion_timestamp.is_none() && job.finished_condition().is_none(),
        last_used_ms,
        record,
    })
}

fn api_error(what: &'static str, error: &kube::Error) -> port::Error {
    super::api_error(what, error)
}

impl Kubernetes {
    /// The sandbox's key, from its Secret.
    fn sandbox_key(&self, name: &str) -> Result<Key, port::Error> {
        const WHAT: &str = "read the sandbox's key";
        let secret =
            self.client.get(Resource::SECRETS, self.namespace(), &manifest::job_name(name)).map_err(|error| api_error(WHAT, &error))?;
        let damaged = |message: String| port::Error { what: WHAT, kind: ErrorKind::Refused, message };
        let encoded = secret["data"][manifest::KEY_ENTRY].as_str().ok_or_else(|| damaged("its Secret has no key".into()))?;
        let hex = crate::sandbox::frame::from_base64(encoded).map_err(|error| damaged(format!("it is not base64: {error}")))?;
        Key::from_hex(&String::from_utf8_lossy(&hex)).map_err(damaged)
    }

    /// The sandbox's running pod.
    fn sandbox_pod(&self, name: &str) -> Result<String, port::Error> {
        const WHAT: &str = "find the sandbox's pod";
        let pods = self.pods(name).map_err(|error| api_error(WHAT, &error))?;
        let pod =
            watch::newest(pods).ok_or_else(|| port::Error { what: WHAT, kind: ErrorKind::NotFound, message: "it has none".into() })?;
        Ok(pod.metadata.name)
    }

    /// Patches the Job's annotations, `only_if` the record still says so.
    fn patch_record(&self, name: &str, annotations: serde_json::Value, only_if: impl Fn(&Seen) -> bool) -> Result<bool, port::Error> {
        for _ in 0..PATCH_ATTEMPTS {
            let Some(job) = self.job(name).map_err(|error| api_error("read the sandbox's Job", &error))? else { return Ok(false) };
            let Some(seen) = seen_of(&job) else { return Ok(false) };
            if !only_if(&seen) {
                return Ok(false);
            }
            let patch = json!({"metadata": {"resourceVersion": seen.version, "annotations": annotations.clone()}});
            match self.client.merge_patch(Resource::JOBS, self.namespace(), &manifest::job_name(name), &patch) {
                Ok(_) => return Ok(true),
                Err(error) if error.is_conflict() => continue,
                Err(error) if error.is_not_found() => return Ok(false),
                Err(error) => return Err(api_error("patch the sandbox's record", &error)),
            }
        }
        Ok(false)
    }
}

impl SandboxStore for Kubernetes {
    /// Its Job (with the record), then its key Secret, owned by the Job.
    fn open_sandbox(&self, name: &str, spec: &RunSpec, record: &Record) -> Result<(), Refused> {
        let key = Key::random().map_err(|why| Refused { reason: crate::engine::port::spec::RunReason::ApiError, message: why })?;
        let idle = rules::runner_idle_bound(record);
        let lifetime = Duration::from_millis(record.expires_at_ms.saturating_sub(record.opened_at_ms));
        let mut job = manifest::session_job(spec, &self.policy, &self.cluster, name, idle, lifetime);
        if let Some(template) = &self.pod_template {
            manifest::apply_pod_template(&mut job, template);
        }
        let expires_at = std::time::UNIX_EPOCH + Duration::from_millis(record.expires_at_ms) + crate::engine::run::EXPIRY_SLACK;
        // A sandbox whose runner ended (idle, its lifetime) holds nothing
        // anyone reads: its Job goes at once.
        let retention = manifest::Retention { expires_at: log::rfc3339_utc(expires_at), finished_ttl: Duration::ZERO, background: None };
        manifest::apply_retention(&mut job, &retention);
        job["metadata"]["annotations"][manifest::ANNOTATION_SANDBOX_RECORD] = json!(sandbox_record::encode_record(record));
        let namespace = self.namespace();
        let created = self.client.create(Resource::JOBS, namespace, &job).map_err(|error| {
            metrics::api_error("create_sandbox_job");
            super::refusal("create the sandbox's Job", &error)
        })?;
        let created = Job::from_value(&created);
        let mut secret = manifest::key_secret(&self.cluster, name, &created.metadata.uid, &key.to_hex());
        manifest::apply_retention(&mut secret, &retention);
        if let Err(error) = self.client.create(Resource::SECRETS, namespace, &secret) {
            metrics::api_error("create_secret");
            self.close_sandbox(name);
            return Err(super::refusal("create the sandbox's key Secret", &error));
        }
        Ok(())
    }

    fn look(&self, name: &str) -> Result<Option<Seen>, port::Error> {
        let job = self.job(name).map_err(|error| api_error("read the sandbox's Job", &error))?;
        Ok(job.as_ref().and_then(seen_of))
    }

    fn list_sandboxes(&self) -> Result<Vec<Seen>, port::Error> {
        let params = ListParams { label_selector: Some(manifest::LABEL_SANDBOX.to_string()), field_selector: None };
        let list = self.client.list(Resource::JOBS, self.namespace(), &params).map_err(|error| api_error("list the sandboxes", &error))?;
        Ok(list.items.iter().map(Job::from_value).filter_map(|job| seen_of(&job)).collect())
    }

    /// The patch is conditioned on the `resourceVersion` `seen` was read at.
    fn begin_call(&self, seen: &Seen, call: &CallMark) -> Result<bool, port::Error> {
        let name = rules::public_name(&seen.record.id);
        let patch = json!({"metadata": {
            "resourceVersion": seen.version,
            "annotations": {manifest::ANNOTATION_SANDBOX_CALL: sandbox_record::encode_call(call)},
        }});
        match self.client.merge_patch(Resource::JOBS, self.namespace(), &manifest::job_name(&name), &patch) {
            Ok(_) => Ok(true),
            Err(error) if error.is_conflict() => Ok(false),
            Err(error) => Err(api_error("take the sandbox", &error)),
        }
    }

    fn mark_used(&self, name: &str, at_ms: u64) -> Result<(), port::Error> {
        let patch = json!({"metadata": {"annotations": {manifest::ANNOTATION_SANDBOX_USED_MS: at_ms.to_string()}}});
        match self.client.merge_patch(Resource::JOBS, self.namespace(), &manifest::job_name(name), &patch) {
            Ok(_) => Ok(()),
            Err(error) => Err(api_error("mark the sandbox used", &error)),
        }
    }

    fn end_call(&self, seen: &Seen, call: &CallMark, at_ms: u64) -> Result<(), port::Error> {
        let name = &rules::public_name(&seen.record.id);
        let annotations = json!({
            manifest::ANNOTATION_SANDBOX_CALL: null,
            manifest::ANNOTATION_SANDBOX_USED_MS: at_ms.to_string(),
        });
        self.patch_record(name, annotations, |seen| seen.call.as_ref().is_some_and(|mark| mark.call_id == call.call_id)).map(drop)
    }

    /// `POST /assign` through `pods/proxy`; the answer is the call's frames.
    fn deliver_call(&self, name: &str, call: &Assignment, read_for: Duration) -> Result<Delivered, port::Error> {
        let key = self.sandbox_key(name)?;
        let pod = self.sandbox_pod(name)?;
        let body = session::encode_call(&key, call);
        let namespace = self.namespace().to_string();
        let started = Instant::now();
        let stream = loop {
            let to =
                ProxyTarget { namespace: &namespace, pod: &pod, port: assignment::PORT, path: assignment::PATH, read_timeout: read_for };
            match self.client.proxy_post_stream(&to, body.clone()) {
                Ok(stream) => break stream,
                // The API server says 503 while the port is not open yet.
                Err(error) if error.code() == Some(503) && started.elapsed() < DELIVERY_RETRY_FOR => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                // The runner still runs a call (one whose server gave up).
                Err(error) if error.code() == Some(409) => {
                    return Err(port::Error { what: DELIVER, kind: ErrorKind::Busy, message: session::BUSY.to_string() });
                }
                Err(error) => return Err(api_error(DELIVER, &error)),
            }
        };
        let handle = stream.abort_handle();
        let client = self.client.clone();
        let cancel_body = call.tag.map(|tag| session::encode_cancel(&key, tag)).unwrap_or_default();
        let cancel = move || post_cancel(&client, &namespace, &pod, cancel_body.clone());
        Ok(Delivered { output: Output { reader: Box::new(stream), abort: Abort::new(move || handle.abort()) }, cancel: Box::new(cancel) })
    }

    /// `POST /cancel` with the key, as the call's own cancel does.
    fn cancel_call(&self, name: &str, tag: Tag) -> Result<(), port::Error> {
        let key = self.sandbox_key(name)?;
        let pod = self.sandbox_pod(name)?;
        post_cancel(&self.client, self.namespace(), &pod, session::encode_cancel(&key, tag))
    }

    fn call_log(&self, name: &str, since_ms: u64, follow: bool) -> Result<Output, port::Error> {
        let pod = self.sandbox_pod(name)?;
        let now_ms = crate::time::unix_ms(std::time::SystemTime::now());
        let params = kube::LogParams {
            container: Some(manifest::MAIN_CONTAINER.to_string()),
            // `since_ms` may come from another replica's clock, and the API
            // counts whole seconds: a minute more (the call's tag picks its
            // frames out of the rest).
            since_seconds: Some(now_ms.saturating_sub(since_ms) / 1000 + LOG_SLACK_S),
            ..kube::LogParams::default()
        };
        let stream = self
            .client
            .pod_log_stream(self.namespace(), &pod, &params, follow)
            .map_err(|error| api_error("read the sandbox's log", &error))?;
        let handle = stream.abort_handle();
        Ok(Output { reader: Box::new(stream), abort: Abort::new(move || handle.abort()) })
    }

    /// The Job (its pod with it) and its key Secret.
    fn close_sandbox(&self, name: &str) {
        let job = manifest::job_name(name);
        if let Err(error) = self.client.delete(Resource::JOBS, self.namespace(), &job) {
            metrics::api_error("delete_job");
            log::warn(
                "a sandbox's Job was not deleted; its expiry and the reaper remove it",
                &[("sandbox", name.into()), ("error", error.to_string().into())],
            );
        }
        let _ = self.client.delete(Resource::SECRETS, self.namespace(), &job);
    }
}

/// What a delivery that failed tried.
const DELIVER: &str = "hand the call to the sandbox";

fn post_cancel(client: &kube::Client, namespace: &str, pod: &str, body: Vec<u8>) -> Result<(), port::Error> {
    let to = ProxyTarget { namespace, pod, port: assignment::PORT, path: session::CANCEL_PATH, read_timeout: Duration::from_secs(5) };
    client.proxy_post(&to, body).map(drop).map_err(|error| api_error("stop the call in the sandbox", &error))
}
