//! The server images operators deploy, other than `tests/build-project-image`'s,
//! run through the in-cluster test (`cluster_in_cluster`: the server deployed
//! with the image, and a job with it as the runner image):
//! - the image the repository's `Dockerfile` builds, which
//!   `tests/docker/build-dockerfile` builds with the test Docker engine and
//!   loads into the cluster;
//! - the multi-architecture image index (amd64 + arm64) that
//!   `tests/build-arm64 --load` imports, so the node's runtime has to pick
//!   its own platform's manifest out of the index.
//!
//! Knows nothing of how the images were built.

use crate::cluster_in_cluster::deployed_server_runs_a_job;

/// `tests/docker/build-dockerfile`'s tag (`MCP_K8S_DOCKERFILE_IMAGE` there and here).
const DOCKERFILE_IMAGE: &str = "mcp-k8s-test.local/mcp-k8s-ephemeral-job:dockerfile";
/// `tests/build-arm64 --load`'s tag (`MCP_K8S_MULTIARCH_IMAGE` there and here).
const MULTIARCH_IMAGE: &str = "mcp-k8s-test.local/mcp-k8s-ephemeral-job:multiarch";

fn image(variable: &str, default: &str) -> String {
    std::env::var(variable).ok().filter(|image| !image.is_empty()).unwrap_or_else(|| default.to_string())
}

#[test]
fn the_dockerfile_image_serves_and_runs_a_job_in_the_cluster() {
    deployed_server_runs_a_job(&image("MCP_K8S_DOCKERFILE_IMAGE", DOCKERFILE_IMAGE), "tests/docker/build-dockerfile");
}

#[test]
fn the_multiarch_image_index_serves_and_runs_a_job_in_the_cluster() {
    deployed_server_runs_a_job(&image("MCP_K8S_MULTIARCH_IMAGE", MULTIARCH_IMAGE), "tests/build-arm64 --load");
}
