//! The Helm chart installed for real: `helm install` of
//! `deploy/helm/mcp-k8s-ephemeral-job` into the test cluster, with values
//! only (the locally built image, the test token as a chart-created Secret,
//! the test images, a NodePort, a pod template so the ConfigMap mount is
//! exercised), then the in-cluster test's checks (`cluster_in_cluster.rs`)
//! on it, then `helm uninstall`.
//!
//! Each run is a release of its own whose two namespaces are its own, so it
//! never touches `deploy/`'s objects (the shared `mcp-ephemeral` and
//! `mcp-system`) nor another run's. The release record lives in `default`:
//! the chart creates both namespaces itself, so neither can exist before
//! the install. It knows nothing of kustomize: the offline `helm_chart.rs`
//! checks that the chart renders the base's objects.

use std::path::PathBuf;
use std::process::Command;

use super::cluster_in_cluster::{Deployment, TOKEN, assert_serves_a_job_with_its_token, run_kubectl};
use crate::support::TempDir;
use crate::support::cluster::{self, BUSYBOX};
use mcp_k8s_ephemeral_job::kube;
use serde_json::json;

/// Where Helm keeps the release record (a Secret); see the header.
const RELEASE_NAMESPACE: &str = "default";

#[test]
fn the_chart_installs_a_server_that_runs_a_job_over_http_with_its_token() {
    let release = Release::install();
    let addr = release.deployment.wait_until_reachable("tests/build-project-image");
    assert_serves_a_job_with_its_token(&release.deployment, &addr);
    let status = helm(&["status", &release.name, "--namespace", RELEASE_NAMESPACE]).expect("helm status");
    assert!(status.contains("STATUS: deployed"), "{status}");
    // The API server's endpoint and the node's address, read at install.
    let policies = kube::Resource { api_path: "/apis/networking.k8s.io/v1", plural: "networkpolicies", namespaced: true };
    let open =
        cluster::admin_client().get(policies, &release.deployment.jobs_namespace, "mcp-ephemeral-jobs-open").expect("the open policy");
    let except = &open["spec"]["egress"][0]["to"][0]["ipBlock"]["except"];
    assert!(except.as_array().is_some_and(|entries| entries.iter().any(|entry| entry == "10.244.0.1/32")), "{except}");
}

/// One release; uninstalled on drop, whatever happened, and then its
/// namespaces deleted (by `Deployment`'s drop) in case the uninstall failed.
struct Release {
    name: String,
    deployment: Deployment,
    _values: TempDir,
}

impl Release {
    fn install() -> Release {
        let name = cluster::unique_name("mcp-helm");
        let deployment = Deployment { jobs_namespace: format!("{name}-jobs"), system_namespace: format!("{name}-sys") };
        let values = TempDir::new("helm-install");
        let image = cluster::project_image();
        let (repository, tag) = image.rsplit_once(':').expect("the image has a tag");
        // JSON is YAML: values as a file, so no --set quoting rules apply.
        let file = values.write(
            "values.yaml",
            &json!({
                "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
                "namespaces": {"server": deployment.system_namespace, "jobs": deployment.jobs_namespace},
                "allowedImages": [BUSYBOX],
                "auth": {"create": true, "token": TOKEN},
                "service": {"type": "NodePort"},
                "podTemplate": {"labels": {"example.com/installed-by": "helm"}},
                "extraEnv": [
                    {"name": "MCP_K8S_DEFAULT_CPU", "value": "50m"},
                    {"name": "MCP_K8S_DEFAULT_MEMORY", "value": "64Mi"},
                ],
            })
            .to_string(),
        );
        let release = Release { name, deployment, _values: values };
        let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/mcp-k8s-ephemeral-job");
        let chart = chart.display().to_string();
        let file = file.display().to_string();
        let installed = helm(&["install", &release.name, &chart, "--namespace", RELEASE_NAMESPACE, "--values", &file, "--timeout", "180s"]);
        if let Err(error) = installed {
            panic!(
                "helm install failed: {error}\n{}",
                run_kubectl(&["-n", &release.deployment.system_namespace, "describe", "pods"], None).unwrap_or_else(|error| error)
            );
        }
        release
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if let Err(error) = helm(&["uninstall", &self.name, "--namespace", RELEASE_NAMESPACE, "--wait", "--timeout", "120s"]) {
            eprintln!("helm uninstall {}: {error}", self.name);
        }
    }
}

/// helm as the cluster admin, with config and cache dirs of its own; its
/// stdout, or the failure with stderr. Fails naming the script that builds
/// it when it is missing.
fn helm(args: &[&str]) -> Result<String, String> {
    let binary = cluster::cache_dir().join("bin/helm");
    assert!(binary.exists(), "{} is missing: run `tests/cluster/build-helm`", binary.display());
    let home = std::env::temp_dir().join(format!("mcp-helm-home-{}", std::process::id()));
    let output = Command::new(&binary)
        .arg("--kubeconfig")
        .arg(cluster::admin_kubeconfig())
        .args(args)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .map_err(|error| format!("cannot start {}: {error}", binary.display()))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!("helm {}: {}\n{}", args.join(" "), output.status, String::from_utf8_lossy(&output.stderr)))
    }
}
