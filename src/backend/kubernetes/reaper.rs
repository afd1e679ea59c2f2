//! The reaper: deletes Jobs and Secrets labelled as ours whose expiry
//! annotation has passed (the engine calls it at start and then
//! periodically), so a server that
//! crashed (or lost its connection) leaves nothing behind for long.
//!
//! Every object we create carries `manifest::ANNOTATION_EXPIRES_AT`: for a
//! sync run its pod deadline plus slack (the server normally deletes it
//! long before), for a background run that plus the result retention. The
//! annotation is written by whichever replica created the object and read
//! by any, so replicas never reap each other's live runs. Objects without
//! the annotation are left to `ttlSecondsAfterFinished` and the garbage
//! collector. Knows Kubernetes; nothing of MCP.

use std::time::SystemTime;

use crate::backend::kubernetes::classify;
use crate::backend::kubernetes::manifest;
use crate::kube;
use crate::kube::objects::{Object, ObjectMeta};
use crate::log;

/// Deletes every expired Job and Secret; returns how many went. Failures
/// are logged and retried next round.
pub fn reap_once(client: &kube::Client, namespace: &str, now: SystemTime) -> usize {
    let mut reaped = 0;
    for resource in [kube::Resource::JOBS, kube::Resource::SECRETS] {
        let params = kube::ListParams {
            label_selector: Some(format!("{}={}", manifest::LABEL_MANAGED_BY, manifest::MANAGED_BY)),
            field_selector: None,
        };
        let objects = match client.list(resource, namespace, &params) {
            Ok(list) => list.items,
            Err(error) => {
                log::warn("reaper could not list", &[("resource", resource.plural.into()), ("error", error.to_string().into())]);
                continue;
            }
        };
        let expired = objects.iter().map(|object| Object::from_value(object).metadata).filter(|metadata| is_expired(metadata, now));
        for metadata in expired {
            let name = metadata.name.as_str();
            // Background propagation: a Job's pods go with it.
            match client.delete(resource, namespace, name) {
                Ok(_) => {
                    reaped += 1;
                    log::info("reaped an expired object", &[("resource", resource.plural.into()), ("name", name.into())]);
                }
                Err(error) => log::warn("reaper could not delete", &[("name", name.into()), ("error", error.to_string().into())]),
            }
        }
    }
    reaped
}

/// Whether the object's expiry annotation is set and has passed.
pub fn is_expired(metadata: &ObjectMeta, now: SystemTime) -> bool {
    metadata
        .annotations
        .get(manifest::ANNOTATION_EXPIRES_AT)
        .and_then(|text| classify::parse_time(text))
        .is_some_and(|expires_at| expires_at <= now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::time::Duration;

    fn expired(object: &Value, now: SystemTime) -> bool {
        is_expired(&Object::from_value(object).metadata, now)
    }

    #[test]
    fn only_a_passed_expiry_counts() {
        let now = classify::parse_time("2026-01-01T12:00:00Z").unwrap();
        let object = |expires_at: Value| json!({"metadata": {"annotations": {manifest::ANNOTATION_EXPIRES_AT: expires_at}}});
        assert!(expired(&object(json!("2026-01-01T11:59:59Z")), now));
        assert!(expired(&object(json!("2026-01-01T12:00:00Z")), now));
        assert!(!expired(&object(json!("2026-01-01T12:00:01Z")), now));
        assert!(!expired(&object(json!("not a time")), now));
        assert!(!expired(&json!({"metadata": {}}), now), "objects without the annotation are left alone");
    }

    #[test]
    fn the_reaper_reads_the_expiry_every_job_and_secret_is_given() {
        let retention =
            manifest::Retention { expires_at: "2026-01-01T12:00:00Z".into(), finished_ttl: Duration::from_secs(300), background: None };
        let mut job = json!({"kind": "Job", "metadata": {"labels": {}}, "spec": {}});
        let mut secret = json!({"kind": "Secret", "metadata": {"labels": {}}});
        manifest::apply_retention(&mut job, &retention);
        manifest::apply_retention(&mut secret, &retention);
        let after = classify::parse_time("2026-01-01T12:00:01Z").unwrap();
        assert!(expired(&job, after) && expired(&secret, after));
        assert_eq!(job["spec"]["ttlSecondsAfterFinished"], 300);
        assert!(secret.get("spec").is_none(), "only Jobs have a TTL");
        assert!(job["metadata"]["labels"].get(manifest::LABEL_MODE).is_none(), "sync runs are not listed");
    }
}
