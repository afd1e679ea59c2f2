//! The command blocks of README.md and docs/ that need the test cluster
//! (`Check::InTier { tier: Tier::OnCluster, .. }` in tests/support/docs.rs),
//! run as written but for their rule's edits: the README's HTTP server, the
//! traces page's stdio server, and docs/deploy.md's Helm way (install,
//! check, uninstall) into two namespaces of the test's own.
//!
//! The blocks run as the cluster's admin (`KUBECONFIG`), with the cache's
//! kubectl and helm first on `PATH`, and a `HOME` of their own.

use std::path::PathBuf;

use crate::support::TempDir;
use crate::support::cluster;
use crate::support::docs::{Tier, rule_and_block, rules_of, run_in_tier};

/// Every block this tier runs, by the test that runs it.
const RUN_HERE: &[(&str, &str)] = &[
    // the_readme_http_server_answers_with_its_token_only
    ("README.md", "export MCP_K8S_AUTH_TOKEN="),
    // the_helm_way_installs_checks_and_uninstalls
    ("docs/deploy.md", "# the two namespaces"),
    ("docs/deploy.md", "kubectl -n mcp-system rollout status"),
    ("docs/deploy.md", "kubectl delete -k deploy/"),
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
    let port = free_port();
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
    let port = free_port();
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
    for first_line_start in ["# the two namespaces", "kubectl -n mcp-system rollout status", "kubectl delete -k deploy/"] {
        run(&env, &vars, "docs/deploy.md", first_line_start).unwrap_or_else(|error| panic!("{error}"));
    }
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

/// A port nothing listens on right now (the server binds it a moment later).
fn free_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("its address").port().to_string()
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
