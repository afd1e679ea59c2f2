//! The contract table on the Kubernetes backend: the `on_cluster` tier
//! includes this file as its `contract` module (`cargo test --test
//! on_cluster contract::`). The cases and the harness are the same files
//! the Docker tier includes; only `BACKEND` differs.

#[path = "cases.rs"]
mod cases;
#[path = "execute_code.rs"]
mod execute_code;
#[path = "harness.rs"]
mod harness;
#[path = "preload.rs"]
mod preload;
#[path = "sandboxes.rs"]
pub(crate) mod sandboxes;
// The tier's helper tree, where the harness finds it (`super::support`).
use crate::support;

const BACKEND: harness::Kind = harness::Kind::Kubernetes;
