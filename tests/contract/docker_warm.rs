//! The contract table on the Docker backend with warm pools: the `on_docker` tier
//! includes this file as its `contract_warm` module (`cargo test --test
//! on_docker contract_warm::`). The cases and the harness are the same files
//! the other tiers include; only `BACKEND` differs.

#[path = "cases.rs"]
mod cases;
#[path = "execute_code.rs"]
mod execute_code;
#[path = "harness.rs"]
mod harness;
// The tier's helper tree, where the harness finds it (`super::support`).
use crate::support;

const BACKEND: harness::Kind = harness::Kind::DockerWarm;
