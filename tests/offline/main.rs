//! The offline tier: every integration test that needs no cluster (the
//! binary over stdio and HTTP, hostile clients, the kube client against the
//! fake API server, the engine's fault handling, the in-pod runner, manifests,
//! configuration, docs/configuration.md and deploy files, every command
//! block of the README and docs/, the architecture rules,
//! the public reason names,
//! panics in the server's threads), in
//! one test binary so the library is linked once. Run it with
//! `cargo test --lib --test offline` (the README's offline loop): it needs
//! nothing but the Rust toolchain (the checks that need helm or the arm64
//! build are the `with_tools` tier).
//!
//! The tests share one process: none may set environment variables, change
//! the current directory or bind a fixed port (servers under test are child
//! processes with their own environment; ports are ephemeral).

#[path = "../support/mod.rs"]
mod support;

mod admission;
mod architecture;
mod config_errors;
mod deploy_manifests;
mod deploy_namespaces;
mod deploy_role;
mod docs_commands;
mod engine_faults;
mod hostile_http;
mod hostile_stdio;
mod http;
mod idle_sites;
mod kube_auth;
mod kube_calls;
mod kube_errors;
mod kube_faults;
mod kube_kubeconfig;
mod manifest;
mod modern_era;
mod monitoring;
mod readiness;
mod readme_config;
mod reasons;
mod runner;
mod scaling;
mod stdio;
mod supervise;
mod yaml_reader;
