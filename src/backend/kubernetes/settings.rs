//! The Kubernetes backend's own settings: what only a run on a cluster
//! reads (the jobs' namespace, the runner image and the binary's path in
//! it, the finished Job's backstop TTL, the RuntimeClass, the fence wait).
//! The engine's `Policy` keeps what every backend understands; these are
//! read from the checked `Config` here, so no other layer carries them.

use std::time::Duration;

use crate::config::Config;
use crate::network::{FenceModes, NetworkMode};

/// Backstop TTL of a finished run's Job, for when the server could not
/// delete it itself (crash, lost connection).
const FINISHED_JOB_TTL: Duration = Duration::from_secs(300);

/// What the operator configured for the cluster, the same for every run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    /// Image holding this binary; its `prepare` container copies the runner.
    pub runner_image: String,
    /// Path of this binary inside `runner_image`.
    pub runner_binary_path: String,
    /// How long a finished Job may stay before the TTL controller deletes
    /// it, should the server not delete it itself (crash, lost connection).
    pub finished_ttl: Duration,
    /// Optional RuntimeClass (gVisor, Kata) for stronger isolation.
    pub runtime_class: Option<String>,
    /// Which runs hold their command until their pod's network policy is
    /// seen in force, and for how long at most.
    pub await_network_policy: AwaitFence,
}

impl Settings {
    pub fn from_config(config: &Config) -> Settings {
        Settings {
            namespace: config.namespace.clone(),
            runner_image: config.runner_image.clone(),
            runner_binary_path: config.runner_binary_path.clone(),
            finished_ttl: FINISHED_JOB_TTL,
            runtime_class: config.runtime_class.clone(),
            await_network_policy: AwaitFence {
                modes: config.await_network_policy,
                bound: Duration::from_secs(config.network_policy_wait_s),
            },
        }
    }
}

/// The fence wait: for which modes (MCP_K8S_AWAIT_NETWORK_POLICY), up to
/// how long (MCP_K8S_NETWORK_POLICY_WAIT_S).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AwaitFence {
    pub modes: FenceModes,
    pub bound: Duration,
}

impl AwaitFence {
    pub const NEVER: AwaitFence = AwaitFence { modes: FenceModes::Never, bound: Duration::ZERO };

    /// How long a run in `mode` waits for its fence; `None`: it does not.
    pub fn bound_for(self, mode: NetworkMode) -> Option<Duration> {
        let waits = match self.modes {
            FenceModes::Never => false,
            FenceModes::Closed => mode != NetworkMode::Open,
            FenceModes::All => true,
        };
        waits.then_some(self.bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_modes_wait_for_their_fence() {
        let bound = Duration::from_secs(10);
        let cases =
            [(FenceModes::Never, [false, false, false]), (FenceModes::Closed, [true, true, false]), (FenceModes::All, [true, true, true])];
        for (modes, waits) in cases {
            let fence = AwaitFence { modes, bound };
            for (mode, waits) in NetworkMode::ALL.into_iter().zip(waits) {
                assert_eq!(fence.bound_for(mode), waits.then_some(bound), "{modes:?} {mode:?}");
            }
        }
    }
}
