//! The tier of the checks that need a tool built from source first, so the
//! offline tier needs nothing but the Rust toolchain:
//! - `helm_chart`: the Helm chart rendered and linted by helm and kubectl,
//!   built once and cached by `tests/cluster/build-helm` and
//!   `tests/cluster/build-kube`;
//! - `arm64`: the arm64 binary under qemu user emulation and the
//!   multi-arch image index, both made by `tests/build-arm64`;
//! - `kustomize_namespaces`: `examples/renamed-namespaces/` rendered by
//!   the cache's kubectl (`tests/cluster/build-kube`);
//! - `docs_blocks`: the README's and docs' command blocks that need this
//!   tier (tests/support/docs.rs's `RULES`);
//! - `install`: `./install` as the README gives it, after
//!   `tests/build-project-image` built the same static binary;
//! - `monitoring`: `deploy/monitoring/` checked by promtool, built once and
//!   cached by `tests/cluster/build-promtool`;
//! - `release_build`: the static release binary's size budget, and its
//!   refusal of the test server's settings, after
//!   `tests/build-project-image` built it.
//!
//! `tests/run-all` builds all of them before it runs this tier. Without
//! them a test fails naming the script that builds what is missing, never
//! passes silently.

#[path = "../support/mod.rs"]
mod support;

mod arm64;
mod docs_blocks;
mod helm_chart;
mod install;
mod kustomize_namespaces;
mod monitoring;
mod release_build;
