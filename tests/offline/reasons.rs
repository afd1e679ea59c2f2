//! The reasons a result can carry. Clients match on their names, so the
//! names are fixed here, and the user docs list every one. (That each name
//! reads back is `engine::port::spec`'s own unit test.)

use mcp_k8s_ephemeral_job::engine::port::spec::RunReason;

const PUBLIC_NAMES: [&str; 28] = [
    "NonZeroExit",
    "Signaled",
    "OOMKilled",
    "PidsExhausted",
    "DiskLimitExceeded",
    "ImagePullFailed",
    "Unschedulable",
    "QuotaExceeded",
    "Rejected",
    "DeadlineExceeded",
    "StartTimeout",
    "Evicted",
    "PodDeleted",
    "Terminated",
    "StartFailed",
    "ContainerFailed",
    "InputFailed",
    "NetworkPolicyNotEnforced",
    "CloneFailed",
    "ResultLost",
    "Cancelled",
    "ApiError",
    "QueueFull",
    "SandboxNotFound",
    "SandboxBusy",
    "SandboxLimit",
    "SandboxEnded",
    "SandboxExpiring",
];

#[test]
fn every_reason_keeps_its_public_name() {
    let names: Vec<&str> = RunReason::ALL.iter().map(|reason| reason.name()).collect();
    assert_eq!(names, PUBLIC_NAMES);
    assert_eq!(RunReason::from_name("OomKilled"), None, "names are exact");
}

#[test]
fn the_run_result_docs_name_every_reason() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/run-result.md")).unwrap();
    let missing: Vec<&str> = PUBLIC_NAMES.into_iter().filter(|name| !docs.contains(&format!("`{name}`"))).collect();
    assert!(missing.is_empty(), "docs/run-result.md does not name {missing:?}");
}
