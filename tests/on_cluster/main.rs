//! The cluster tier: tests against the real test cluster that
//! `tests/cluster/up` builds (the server's runs, background jobs, bounds,
//! options, faults and an API-server outage of the server's own, the docs'
//! command blocks that need a cluster), in one test
//! binary. They fail, never skip, when the cluster is missing. Tests that
//! break the node for every pod are in `tests/on_cluster_alone`, a binary of
//! their own, because cargo runs test binaries one after another.

// The contract table is compiled twice on purpose: cold (`contract`) and
// with warm pools (`contract_warm`), each with its own `BACKEND`.
#![allow(clippy::duplicate_mod)]

#[path = "../support/mod.rs"]
mod support;

mod cluster_access;
mod cluster_background;
mod cluster_bounds;
mod cluster_faults;
mod cluster_fidelity;
mod cluster_in_cluster;
mod cluster_jobs;
mod cluster_logs;
mod cluster_options;
mod cluster_outage;
mod cluster_run_job;
mod cluster_sandboxes;
/// The contract table (tests/contract/), on the Kubernetes backend.
#[path = "../contract/kubernetes.rs"]
mod contract;
/// The same table with warm pools: runs that fit take a running pod.
#[path = "../contract/kubernetes_warm.rs"]
mod contract_warm;
mod dockerfile_image;
mod docs_blocks;
mod helm_install;
mod network;
mod pod_template;
mod sites;
mod slow_image_pull;
mod warm_pool;
