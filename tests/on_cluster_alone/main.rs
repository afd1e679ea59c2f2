//! The cluster tests that must run with nothing else on the cluster:
//! killing containerd stops image and container operations for every pod on
//! the node. A test binary of its own, because cargo runs test binaries one
//! after another, so nothing of `tests/on_cluster` runs meanwhile; inside,
//! its tests take turns (`cluster_node_faults::take_turn`).

#[path = "../support/mod.rs"]
mod support;

mod cluster_node_faults;
