//! Removes the containers this server created whose expiry label has
//! passed (with their anonymous volumes): sync runs' containers a crashed
//! server left, and background runs (run, record, verdict and cancel
//! containers) after their `result_ttl`. Only containers labelled
//! `managed-by=mcp-k8s-ephemeral-job` are looked at, and one without a
//! readable expiry is left alone: nothing else on the daemon is touched.
//!
//! Knows the labels and the client; not what a run is.

use std::time::SystemTime;

use crate::backend::docker::spec;
use crate::docker::{self, Filters};
use crate::log;

/// One sweep; how many containers were removed.
pub fn reap_once(client: &docker::Client, now: SystemTime) -> usize {
    let filters = Filters { labels: vec![format!("{}={}", spec::LABEL_MANAGED_BY, spec::MANAGED_BY)] };
    let containers = match client.container_list(&filters) {
        Ok(containers) => containers,
        Err(error) => {
            log::warn("reaper could not list the server's containers", &[("error", error.to_string().into())]);
            return 0;
        }
    };
    let mut removed = 0;
    for container in containers.iter().filter(|container| is_expired(&container.labels, now)) {
        match client.container_remove(&container.id) {
            Ok(()) => removed += 1,
            Err(error) if error.is_not_found() => {}
            Err(error) => log::warn(
                "reaper could not remove an expired container",
                &[("container", container.id.as_str().into()), ("error", error.to_string().into())],
            ),
        }
    }
    removed
}

/// Expired: ours, with an expiry that has passed.
pub fn is_expired(labels: &std::collections::BTreeMap<String, String>, now: SystemTime) -> bool {
    labels.get(spec::LABEL_MANAGED_BY).map(String::as_str) == Some(spec::MANAGED_BY) && spec::expires_at(labels).is_some_and(|at| at <= now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn only_ours_and_only_when_expired() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let ours = |expires: &str| {
            BTreeMap::from([
                (spec::LABEL_MANAGED_BY.to_string(), spec::MANAGED_BY.to_string()),
                (spec::LABEL_EXPIRES_AT.to_string(), expires.to_string()),
            ])
        };
        assert!(is_expired(&ours("2026-01-01T00:00:00Z"), now));
        assert!(!is_expired(&ours("2030-01-01T00:00:00Z"), now));
        assert!(!is_expired(&ours("garbage"), now), "an unreadable expiry is left alone");
        let theirs = BTreeMap::from([(spec::LABEL_EXPIRES_AT.to_string(), "2026-01-01T00:00:00Z".to_string())]);
        assert!(!is_expired(&theirs, now));
    }
}
