//! The command blocks of README.md and docs/ that need the tools this tier
//! has (`Check::InTier { tier: Tier::WithTools, .. }` in
//! tests/support/docs.rs), run as written but for their rule's edits: the
//! README's `./install` lines, under a temporary prefix and `HOME`, with the
//! Rust toolchain of the user running the tests; the README's `claude mcp
//! add` by Claude Code's CLI (`tests/clients/install-claude-code`), which
//! then reaches the server it wrote on the test Docker engine; docs/deploy.md's
//! overlay copied and rendered by the cache's kubectl, in a scratch directory.

use std::path::PathBuf;

use crate::helm_chart::cached_binary;

use crate::support::TempDir;
use crate::support::docs::{Tier, rule_and_block, rules_of, run_in_tier};

#[test]
fn every_block_of_this_tier_is_run_here() {
    let run_here = [("README.md", "./install "), ("README.md", "claude mcp add "), ("docs/deploy.md", "cp -r examples/renamed-namespaces")];
    assert_eq!(rules_of(Tier::WithTools), run_here, "RULES (tests/support/docs.rs) against this file's tests");
}

#[test]
fn the_readme_install_lines_install_a_binary_that_runs() {
    let dir = TempDir::new("docs-install");
    let home = std::env::var("HOME").expect("HOME, where the Rust toolchain is");
    // The toolchain stays the user's when HOME is the block's own.
    let cargo_home = std::env::var("CARGO_HOME").unwrap_or_else(|_| format!("{home}/.cargo"));
    let rustup_home = std::env::var("RUSTUP_HOME").unwrap_or_else(|_| format!("{home}/.rustup"));
    let cargo_bin = PathBuf::from(&cargo_home).join("bin");
    let dir_path = dir.path.to_str().expect("a UTF-8 temp dir");
    let env = [("HOME", dir_path), ("DOCS_TMP", dir_path), ("CARGO_HOME", cargo_home.as_str()), ("RUSTUP_HOME", rustup_home.as_str())];
    let (rule, block) = rule_and_block("README.md", "./install ");
    run_in_tier(Tier::WithTools, rule, &block, &env, &[&cargo_bin]).unwrap_or_else(|error| panic!("{error}"));
}

#[test]
fn the_renamed_namespaces_overlay_renders_without_the_default_names() {
    let kubectl = cached_binary("kubectl", "tests/cluster/build-kube");
    let tools = kubectl.parent().expect("the cache's bin directory");
    let home = TempDir::new("docs-home");
    let env = [("HOME", home.path.to_str().expect("a UTF-8 temp dir"))];
    let (rule, block) = rule_and_block("docs/deploy.md", "cp -r examples/renamed-namespaces");
    run_in_tier(Tier::WithTools, rule, &block, &env, &[tools]).unwrap_or_else(|error| panic!("{error}"));
}

#[test]
fn claude_code_adds_the_readme_entry_and_reaches_the_server() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let claude = repo.join("tests/clients/claude-code/node_modules/.bin");
    assert!(claude.join("claude").exists(), "Claude Code's CLI is missing: run tests/clients/install-claude-code");
    let binary = repo.join("target/x86_64-unknown-linux-musl/release/mcp-k8s-ephemeral-job");
    assert!(binary.exists(), "the static build is missing: run tests/build-project-image");
    let docker_host =
        std::env::var("DOCKER_HOST").expect("DOCKER_HOST of the test Docker engine: run tests/docker/up and export its last line");
    let home = TempDir::new("docs-claude");
    let env = [
        ("HOME", home.path.to_str().expect("a UTF-8 temp dir")),
        ("DOCS_BIN", binary.to_str().expect("a UTF-8 path")),
        ("DOCKER_HOST", docker_host.as_str()),
    ];
    let (rule, block) = rule_and_block("README.md", "claude mcp add ");
    run_in_tier(Tier::WithTools, rule, &block, &env, &[&claude]).unwrap_or_else(|error| panic!("{error}"));
}
