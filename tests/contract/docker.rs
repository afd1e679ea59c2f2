//! The contract table on the Docker backend: the `on_docker` tier includes
//! this file as its `contract` module (`cargo test --test on_docker
//! contract::`), against the test dockerd (`tests/docker/up`, or the daemon
//! `DOCKER_HOST` names) with the static runner binary that
//! `tests/build-project-image` builds. A daemon or a runner that is not
//! there fails every case; nothing is skipped.

#[path = "cases.rs"]
mod cases;
#[path = "execute_code.rs"]
mod execute_code;
#[path = "harness.rs"]
mod harness;
#[path = "preload.rs"]
mod preload;
#[path = "sandboxes.rs"]
mod sandboxes;
// The helper tree of every tier. This tier's main.rs had no `mod support`
// when this was written, so the module brings its own. Where main.rs has
// one too, the tree is compiled twice (harmless, hence the allow), and
// `use crate::support;` as in kubernetes.rs is the better line.
#[allow(clippy::duplicate_mod)]
#[path = "../support/mod.rs"]
mod support;

const BACKEND: harness::Kind = harness::Kind::Docker;
