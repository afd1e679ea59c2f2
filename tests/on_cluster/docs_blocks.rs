//! The command blocks of README.md and docs/ that need the test cluster
//! (`Check::InTier { tier: Tier::OnCluster, .. }` in tests/support/docs.rs),
//! run as written but for their rule's edits: the README's HTTP server, the
//! traces page's stdio server, and docs/deploy.md's two ways, Helm and
//! kustomize (install, check, uninstall), each into two namespaces of the
//! test's own.
//!
//! The blocks run as the cluster's admin (`KUBECONFIG`), with the cache's
//! kubectl and helm first on `PATH`, and a `HOME` of their own.

use std::path::PathBuf;

use crate::support::TempDir;
use crate::support::cluster;
use crate::support::docs::{Tier, rule_and_block, rules_of, run_in_tier};
use crate::support::registry::Registry;

/// Every block this tier runs, by the test that runs it.
const RUN_HERE: &[(&str, &str)] = &[
    // the_readme_http_server_answers_with_its_token_only
    ("README.md", "export MCP_K8S_AUTH_TOKEN="),
    // the_kustomize_way_builds_pushes_installs_checks_and_uninstalls
    ("docs/deploy.md", "docker build "),
    // the_helm_way_installs_checks_and_uninstalls
    ("docs/deploy.md", "# the two namespaces"),
    // both ways
    ("docs/deploy.md", "kubectl -n mcp-system rollout status"),
    // the_helm_way_installs_checks_and_uninstalls
    ("docs/deploy.md", "helm test "),
    // the_kustomize_way_builds_pushes_installs_checks_and_uninstalls
    ("docs/deploy.md", "kubectl delete -k deploy/"),
    // the_helm_way_installs_checks_and_uninstalls
    ("docs/deploy.md", "helm uninstall "),
    // the_traces_stdio_server_answers_initialize
    ("docs/traces.md", "MCP_K8S_OTLP_ENDPOINT="),
];

#[test]
fn every_block_of_this_tier_is_run_here() {
    assert_eq!(rules_of(Tier::OnCluster), RUN_HERE, "RULES (tests/support/docs.rs) against RUN_HERE");
}

#[test]
fn the_readme_http_server_answers_with_its_token_only() {
    let env = BlockEnv::new();
    let port = crate::support::free_port().to_string();
    run(&env, &[("DOCS_PORT", &port)], "README.md", "export MCP_K8S_AUTH_TOKEN=").unwrap_or_else(|error| panic!("{error}"));
}

#[test]
fn the_traces_stdio_server_answers_initialize() {
    let env = BlockEnv::new();
    run(&env, &[], "docs/traces.md", "MCP_K8S_OTLP_ENDPOINT=").unwrap_or_else(|error| panic!("{error}"));
}

/// The runner fails a broken block: the README's server line with a
/// misspelt flag exits at once, and the block fails (rather than waiting
/// for a server that never listens).
#[test]
fn a_misspelt_server_line_fails_the_block() {
    let env = BlockEnv::new();
    let port = crate::support::free_port().to_string();
    let (rule, block) = rule_and_block("README.md", "export MCP_K8S_AUTH_TOKEN=");
    let last_line = "MCP_K8S_ALLOWED_IMAGES=python:3.12-slim mcp-k8s-ephemeral-job\n";
    assert!(block.text.ends_with(last_line), "{}", block.text);
    let broken = crate::support::docs::Block {
        text: block.text.replace(last_line, "MCP_K8S_ALLOWED_IMAGES=python:3.12-slim mcp-k8s-ephemeral-job --trasport http\n"),
        ..block
    };
    let error =
        run_in_tier(Tier::OnCluster, rule, &broken, &env.with(&[("DOCS_PORT", &port)]), &[&env.tools]).expect_err("the block fails");
    assert!(error.contains("--trasport"), "{error}");
}

/// docs/deploy.md's Helm way, block after block: the namespaces, Secret
/// and `helm install`; `rollout status`, `helm test` and `doctor`; then
/// `helm uninstall` and the namespaces deleted. Whatever fails, the release
/// and namespaces are removed when the test ends.
#[test]
fn the_helm_way_installs_checks_and_uninstalls() {
    let env = BlockEnv::new();
    let name = cluster::unique_name("mcp-docs");
    let installed = Installed { env: &env, server_namespace: format!("{name}-sys"), jobs_namespace: format!("{name}-jobs") };
    let image = cluster::project_image();
    let (repository, tag) = image.rsplit_once(':').expect("the image has a tag");
    let allowed_images = format!("{},{}", cluster::BUSYBOX, cluster::PYTHON);
    let vars = [
        ("DOCS_SERVER_NAMESPACE", installed.server_namespace.as_str()),
        ("DOCS_JOBS_NAMESPACE", installed.jobs_namespace.as_str()),
        ("DOCS_IMAGE_REPOSITORY", repository),
        ("DOCS_IMAGE_TAG", tag),
        ("DOCS_ALLOWED_IMAGES", allowed_images.as_str()),
    ];
    for first_line_start in ["# the two namespaces", "kubectl -n mcp-system rollout status", "helm test ", "helm uninstall "] {
        run(&env, &vars, "docs/deploy.md", first_line_start).unwrap_or_else(|error| panic!("{error}"));
    }
}

/// docs/deploy.md's kustomize way, block after block: `docker build` (by
/// the test Docker engine) and `docker push` to a registry of the test's
/// own, the namespace and the token Secret, and `kubectl apply -k` of a
/// copy of deploy/ edited as the block's comment tells an operator to;
/// `rollout status` and doctor; then `kubectl delete -k`. The node pulls
/// the server's image from that registry. Whatever fails, the namespaces
/// and the pushed tag are removed when the test ends.
#[test]
fn the_kustomize_way_builds_pushes_installs_checks_and_uninstalls() {
    let env = BlockEnv::new();
    let registry = Registry::start();
    let name = cluster::unique_name("mcp-kust");
    let docker_host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/lib/mcp-k8s-test-docker/docker.sock".into());
    let applied = Applied {
        env: &env,
        docker_host: docker_host.clone(),
        server_namespace: format!("{name}-sys"),
        jobs_namespace: format!("{name}-jobs"),
        image: format!("{}/mcp-k8s-ephemeral-job:0.1.0", registry.address),
    };
    let deploy = TempDir::new("docs-deploy");
    let deploy_dir = edited_deploy(&deploy, &registry.address, &applied);
    let builder = rust_builder(&env, &docker_host);
    let vars = [
        ("DOCS_REGISTRY", registry.address.as_str()),
        ("DOCS_BUILDER", builder.as_str()),
        ("DOCS_SERVER_NAMESPACE", applied.server_namespace.as_str()),
        ("DOCS_DEPLOY", deploy_dir.as_str()),
        ("DOCKER_HOST", docker_host.as_str()),
        // The classic builder, as tests/docker/build-dockerfile's: BuildKit
        // would look the builder image up in a registry.
        ("DOCKER_BUILDKIT", "0"),
    ];
    run(&env, &vars, "docs/deploy.md", "docker build ").unwrap_or_else(|error| panic!("{error}"));
    run(&env, &vars, "docs/deploy.md", "kubectl -n mcp-system rollout status").unwrap_or_else(|error| panic!("{error}"));
    let pulled = server_image_ids(&applied.server_namespace);
    let from_registry = format!("{}/mcp-k8s-ephemeral-job@sha256:", registry.address);
    assert!(
        !pulled.is_empty() && pulled.iter().all(|id| id.starts_with(&from_registry)),
        "the server's pods run the image pulled from the test's registry ({from_registry}...): {pulled:?}"
    );
    run(&env, &vars, "docs/deploy.md", "kubectl delete -k deploy/").unwrap_or_else(|error| panic!("{error}"));
}

/// A copy of deploy/ in `dir`, edited as the kustomize block's comment
/// says (the image's `newName`; `MCP_K8S_ALLOWED_IMAGES`: the images the
/// test cluster has loaded) and with the test's two namespaces in
/// deploy/namespaces.yaml; its path.
fn edited_deploy(dir: &TempDir, registry: &str, applied: &Applied) -> String {
    let copy = dir.path.join("deploy");
    let status = std::process::Command::new("cp")
        .arg("-r")
        .arg(crate::support::docs::root().join("deploy"))
        .arg(&copy)
        .status()
        .expect("cp deploy/");
    assert!(status.success(), "cp -r deploy/: {status}");
    let allowed_images = format!("{},{}", cluster::BUSYBOX, cluster::PYTHON);
    let edits: [(&str, String, String); 3] = [
        (
            "kustomization.yaml",
            "  - name: mcp-k8s-ephemeral-job\n    newTag: 0.1.0\n".to_string(),
            format!("  - name: mcp-k8s-ephemeral-job\n    newName: {registry}/mcp-k8s-ephemeral-job\n    newTag: 0.1.0\n"),
        ),
        (
            "server-deployment.yaml",
            "value: \"python:3.12-slim,node:22-slim,golang:1.23,bash:5.2,busybox:1.36\"".to_string(),
            format!("value: \"{allowed_images}\""),
        ),
        (
            "namespaces.yaml",
            "  server: mcp-system\n  jobs: mcp-ephemeral\n".to_string(),
            format!("  server: {}\n  jobs: {}\n", applied.server_namespace, applied.jobs_namespace),
        ),
    ];
    for (file, from, to) in edits {
        let path = copy.join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        assert!(text.contains(&from), "deploy/{file} no longer holds {from:?}: change this test's edit with it");
        std::fs::write(&path, text.replace(&from, &to)).expect("write the edited copy");
    }
    copy.display().to_string()
}

/// The builder image tests/docker/build-dockerfile assembled in the test
/// Docker engine (it keeps one: the current recipe's).
fn rust_builder(env: &BlockEnv, docker_host: &str) -> String {
    let listed = crate::support::docs::run_shell(
        "docker images --format '{{.Repository}}:{{.Tag}}' mcp-k8s-test.local/rust-builder\n",
        &env.with(&[("DOCKER_HOST", docker_host)]),
        &[],
        None,
        crate::support::docs::root(),
    )
    .unwrap_or_else(|error| panic!("the test Docker engine's images: {error}"));
    let builders: Vec<&str> = listed.lines().filter(|line| !line.is_empty()).collect();
    match builders.as_slice() {
        [builder] => builder.to_string(),
        _ => panic!("expected one builder image in the test Docker engine, got {builders:?}: run `tests/docker/build-dockerfile`"),
    }
}

/// The image IDs the server's pods in `namespace` run (a pulled image's ID
/// names the registry it came from).
fn server_image_ids(namespace: &str) -> Vec<String> {
    let client = cluster::admin_client();
    let selector = mcp_k8s_ephemeral_job::kube::ListParams { label_selector: None, field_selector: None };
    let pods = client.list(mcp_k8s_ephemeral_job::kube::Resource::PODS, namespace, &selector).expect("list the server's pods");
    pods.items
        .iter()
        .flat_map(|pod| pod["status"]["containerStatuses"].as_array().cloned().unwrap_or_default())
        .filter_map(|status| status["imageID"].as_str().map(str::to_string))
        .collect()
}

/// The variables and tools every block here gets.
struct BlockEnv {
    home: TempDir,
    tools: PathBuf,
    kubeconfig: String,
}

impl BlockEnv {
    fn new() -> BlockEnv {
        let kubeconfig = cluster::admin_kubeconfig();
        assert!(kubeconfig.exists(), "{} is missing: run `tests/cluster/up`", kubeconfig.display());
        let tools = cluster::cache_dir().join("bin");
        for (tool, script) in [("kubectl", "tests/cluster/build-kube"), ("helm", "tests/cluster/build-helm")] {
            assert!(tools.join(tool).exists(), "{} is missing: run `{script}`", tools.join(tool).display());
        }
        BlockEnv { home: TempDir::new("docs-home"), tools, kubeconfig: kubeconfig.display().to_string() }
    }

    fn with<'a>(&'a self, vars: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let home = self.home.path.to_str().expect("a UTF-8 temp dir");
        let mut env = vec![("HOME", home), ("KUBECONFIG", self.kubeconfig.as_str())];
        env.extend_from_slice(vars);
        env
    }
}

fn run(env: &BlockEnv, vars: &[(&str, &str)], file: &str, first_line_start: &str) -> Result<String, String> {
    let (rule, block) = rule_and_block(file, first_line_start);
    run_in_tier(Tier::OnCluster, rule, &block, &env.with(vars), &[&env.tools])
}

/// The kustomize way's namespaces and pushed tag, removed on drop in case a
/// block failed before its uninstall.
struct Applied<'a> {
    env: &'a BlockEnv,
    docker_host: String,
    server_namespace: String,
    jobs_namespace: String,
    image: String,
}

impl Drop for Applied<'_> {
    fn drop(&mut self) {
        let cleanup = format!(
            "kubectl delete namespace {} {} --ignore-not-found --wait=false\ndocker rmi {} >/dev/null 2>&1 || true\n",
            self.server_namespace, self.jobs_namespace, self.image
        );
        let env = self.env.with(&[("DOCKER_HOST", &self.docker_host)]);
        if let Err(error) = crate::support::docs::run_shell(&cleanup, &env, &[&self.env.tools], None, crate::support::docs::root()) {
            eprintln!("cleanup of the kustomize way: {error}");
        }
    }
}

/// The Helm way's release and namespaces, removed on drop in case a block
/// failed before its uninstall (all of it is gone already when it did not).
struct Installed<'a> {
    env: &'a BlockEnv,
    server_namespace: String,
    jobs_namespace: String,
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        let cleanup = format!(
            "helm uninstall mcp-k8s-ephemeral-job -n {0} --ignore-not-found\nkubectl delete namespace {0} {1} --ignore-not-found --wait=false\n",
            self.server_namespace, self.jobs_namespace
        );
        if let Err(error) =
            crate::support::docs::run_shell(&cleanup, &self.env.with(&[]), &[&self.env.tools], None, crate::support::docs::root())
        {
            eprintln!("cleanup of the Helm way: {error}");
        }
    }
}
