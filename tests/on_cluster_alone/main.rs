//! The cluster tests that must run with nothing else on the cluster:
//! killing containerd stops image and container operations for every pod on
//! the node, and a burst of 60 background jobs loads the 2-core node so
//! much that the timing of any other test would change (and it fills the
//! namespace's pod quota). A test binary of its own, because cargo runs
//! test binaries one after another, so nothing of `tests/on_cluster` runs
//! meanwhile; inside, its tests take turns (`take_turn`).

#[path = "../support/mod.rs"]
mod support;

mod cluster_burst;
mod cluster_node_faults;

/// Held for the whole of each test of this binary: cargo runs the tests of
/// one binary on threads, and each of them wants the node to itself.
fn take_turn() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
