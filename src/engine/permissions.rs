//! The Kubernetes permissions the server needs in the jobs namespace, as
//! one list of `(group, resource, verb)` triples: what the engine's calls
//! through `kube::Client` amount to. `deploy/role.yaml` must grant exactly
//! these (a test compares them), and `doctor` checks them against a live
//! cluster. Nothing here talks to the API.

/// Every `(API group, resource, verb)` the engine uses, sorted. `""` is the
/// core group; subresources are written `pods/log`.
///
/// Where each comes from (`engine::run`):
/// - jobs create/delete: one Job per run, deleted when the run ends;
/// - pods list/watch: the run's pod is followed by a watch, which lists first;
/// - pods/log get: the main container's log carries the runner's frames;
/// - secrets create/delete: the inputs Secret of a run that has files;
/// - events list: `FailedCreate` events while no pod exists (quota, admission).
///
/// Adding an API call to the engine means adding its triple here and its
/// verb to `deploy/role.yaml`; `tests/deploy_manifests.rs` fails until both agree.
pub const REQUIRED: &[(&str, &str, &str)] = &[
    ("", "events", "list"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods/log", "get"),
    ("", "secrets", "create"),
    ("", "secrets", "delete"),
    ("batch", "jobs", "create"),
    ("batch", "jobs", "delete"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_without_duplicates() {
        assert!(REQUIRED.windows(2).all(|pair| pair[0] < pair[1]), "keep REQUIRED sorted and unique");
    }
}
