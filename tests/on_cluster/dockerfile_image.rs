//! The image the repository's `Dockerfile` builds, used as operators would:
//! `tests/docker/build-dockerfile` builds it with the test Docker engine and
//! loads it into the cluster; this deploys the server with it and runs a job
//! with it as the runner image (the in-cluster test, `cluster_in_cluster`,
//! with that image instead of `tests/build-project-image`'s). Knows nothing
//! of how the image was built.

use crate::cluster_in_cluster::deployed_server_runs_a_job;

/// `tests/docker/build-dockerfile`'s tag (`MCP_K8S_DOCKERFILE_IMAGE` there and here).
const DOCKERFILE_IMAGE: &str = "mcp-k8s-test.local/mcp-k8s-ephemeral-job:dockerfile";

#[test]
fn the_dockerfile_image_serves_and_runs_a_job_in_the_cluster() {
    let image =
        std::env::var("MCP_K8S_DOCKERFILE_IMAGE").ok().filter(|image| !image.is_empty()).unwrap_or_else(|| DOCKERFILE_IMAGE.to_string());
    deployed_server_runs_a_job(&image, "tests/docker/build-dockerfile");
}
