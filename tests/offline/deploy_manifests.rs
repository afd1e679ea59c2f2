//! The shipped manifests (`deploy/`) and registry metadata (`server.json`)
//! agree with the code (the Role's verbs are checked by `deploy_role.rs`):
//! every variable they set is a setting the
//! server reads, the NetworkPolicy selects the label the engine puts on job
//! pods, and the kustomization lists every manifest. No cluster needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use mcp_k8s_ephemeral_job::backend::kubernetes::manifest::{LABEL_MANAGED_BY, MANAGED_BY};
use mcp_k8s_ephemeral_job::config::SETTINGS;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// One manifest file (one object each) as JSON.
fn manifest(name: &str) -> Value {
    let path = deploy_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn strings(value: &Value) -> Vec<String> {
    value.as_array().map(|items| items.iter().filter_map(|item| item.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

fn is_setting(name: &str) -> bool {
    SETTINGS.iter().any(|setting| setting.env == name)
}

#[test]
fn the_server_account_is_bound_to_the_role_in_the_jobs_namespace() {
    let role = manifest("role.yaml");
    let binding = manifest("rolebinding.yaml");
    let account = manifest("serviceaccount.yaml");
    let deployment = manifest("server-deployment.yaml");
    let jobs_namespace = role["metadata"]["namespace"].as_str().expect("role namespace");
    assert_eq!(binding["metadata"]["namespace"], jobs_namespace);
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["name"], account["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["namespace"], account["metadata"]["namespace"]);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], account["metadata"]["name"]);
    assert_eq!(deployment["metadata"]["namespace"], account["metadata"]["namespace"]);
    let env = &pod["containers"][0]["env"];
    let namespace = env.as_array().expect("env").iter().find(|var| var["name"] == "MCP_K8S_NAMESPACE").expect("MCP_K8S_NAMESPACE");
    assert_eq!(namespace["value"], jobs_namespace, "the server must create Jobs where its Role is");
}

#[test]
fn the_deployment_sets_only_real_settings_and_runs_restricted() {
    let deployment = manifest("server-deployment.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    for var in container["env"].as_array().expect("env") {
        let name = var["name"].as_str().expect("env name");
        assert!(is_setting(name), "deploy/server-deployment.yaml sets `{name}`, which the server does not read");
    }
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532, "the Dockerfile's USER");
    assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(container["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(container["resources"]["limits"]["memory"].is_string());
}

#[test]
fn the_jobs_network_policy_selects_job_pods() {
    let policy = manifest("networkpolicy-jobs.yaml");
    assert_eq!(policy["spec"]["podSelector"]["matchLabels"][LABEL_MANAGED_BY], MANAGED_BY);
    assert_eq!(strings(&policy["spec"]["policyTypes"]), ["Ingress", "Egress"]);
    assert_eq!(policy["spec"]["ingress"], serde_json::json!([]), "no ingress at all");
}

/// `restricted` lets DNS out to the cluster's resolver only: a rule with
/// ports and no destination would let port 53 reach any address.
#[test]
fn restricted_dns_goes_to_the_clusters_resolver_only() {
    let policy = manifest("networkpolicy-jobs-restricted.yaml");
    let egress = policy["spec"]["egress"].as_array().cloned().unwrap_or_default();
    assert!(!egress.is_empty(), "{policy}");
    for rule in &egress {
        let peers = rule["to"].as_array().cloned().unwrap_or_default();
        assert!(!peers.is_empty(), "every egress rule names where it may go: {rule}");
    }
    let dns = &egress[0];
    assert_eq!(dns["ports"][0]["port"], 53, "{dns}");
    assert_eq!(dns["to"][0]["podSelector"]["matchLabels"]["k8s-app"], "kube-dns", "{dns}");
    assert_eq!(dns["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "kube-system", "{dns}");
}

#[test]
fn the_kustomization_lists_every_manifest() {
    let kustomization = manifest("kustomization.yaml");
    let listed: BTreeSet<String> = strings(&kustomization["resources"]).into_iter().collect();
    let mut present = BTreeSet::new();
    for entry in std::fs::read_dir(deploy_dir()).expect("deploy/ is readable") {
        let name = entry.expect("entry").file_name().to_string_lossy().to_string();
        // The Secret example and the opt-in parts (warm pools) are left
        // out on purpose: see their headers.
        if name.ends_with(".yaml") && name != "kustomization.yaml" && !name.ends_with(".example.yaml") && !name.ends_with(".optional.yaml")
        {
            present.insert(name);
        }
    }
    assert_eq!(listed, present, "deploy/kustomization.yaml `resources` and the files in deploy/");
}

#[test]
fn server_json_names_real_settings_and_the_image() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("server.json");
    let text = std::fs::read_to_string(&path).expect("server.json");
    let server: Value = serde_json::from_str(&text).expect("server.json is JSON");
    assert_eq!(server["version"], env!("CARGO_PKG_VERSION"));
    let packages = server["packages"].as_array().expect("packages");
    let transports: BTreeSet<&str> = packages.iter().filter_map(|package| package["transport"]["type"].as_str()).collect();
    assert_eq!(transports, BTreeSet::from(["stdio", "streamable-http"]));
    for package in packages {
        assert_eq!(package["registryType"], "oci");
        assert!(
            package["identifier"].as_str().is_some_and(|image| image.ends_with(&format!(":{}", env!("CARGO_PKG_VERSION")))),
            "{package}"
        );
        for var in package["environmentVariables"].as_array().expect("environmentVariables") {
            let name = var["name"].as_str().expect("name");
            assert!(is_setting(name) || name == "KUBECONFIG", "server.json names `{name}`, which the server does not read");
            assert!(var["description"].as_str().is_some_and(|text| !text.is_empty()), "{name} needs a description");
        }
    }
}
