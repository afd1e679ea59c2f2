//! The places a sandbox runs, each behind the engine's port
//! (`engine::backend::Backend`): `kubernetes` (a Job and its pod per run)
//! and `docker` (a container per run on a local Docker Engine).
//! A backend turns the engine's neutral requests into its own API's calls
//! and its own objects back into neutral events; the engine knows none of
//! them, and no backend knows MCP.
//!
//! Beyond a run, a backend's whole life goes through here too: each one's
//! `connect` makes it from the checked `Config` (its own settings, its warm
//! pools), `Connected` is what `main` asks of it (the start-up checks,
//! `doctor`), and the port's `Backend::shutdown` ends it. `main` names a
//! backend in one `match` on the configured one, and nowhere else.

pub mod docker;
pub mod kubernetes;

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::engine;
use crate::engine::backend::Backend;
use crate::engine::pool::{PoolRules, PoolShape};
use crate::engine::pool_manager::{PoolSandboxes, Pools};

/// A backend connected from the settings: the engine's port, plus what
/// `main` asks of a backend before and besides runs.
pub trait Connected: Backend {
    /// The checks `serve` stops on (exit 2) before it answers anything: a
    /// set-up that would fail every run (a missing cache PVC, a network
    /// default this backend cannot run).
    fn check_at_start(&self, config: &Config) -> Result<(), String>;

    /// `doctor`: every check, handed to `report` as soon as it is done;
    /// true when all passed. `ctx` is the engine on this backend, for the
    /// checks that run a tiny job.
    fn doctor(&self, config: &Config, ctx: &engine::run::Ctx, report: &mut dyn FnMut(&Check)) -> bool;
}

/// Whether connecting starts the warm pools: serving does, `doctor` not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarmPools {
    On,
    Off,
}

/// The warm pools' threads on `sandboxes` (the backend without pools),
/// when `MCP_K8S_WARM_POOLS` names any and `warm` says to. Their
/// sandboxes carry this process's own id, so that replicas keep apart.
fn start_pools<S: PoolSandboxes>(config: &Config, sandboxes: S, warm: WarmPools) -> Result<Option<Arc<Pools<S>>>, String> {
    if warm == WarmPools::Off || config.warm_pools.is_empty() {
        return Ok(None);
    }
    let max_timeout = Duration::from_secs(config.max_timeout_s);
    let pools = Arc::new(Pools::new(sandboxes, &pool_shapes(config), max_timeout));
    let owner = engine::run::new_run_id()[..12].to_string();
    pools.start(&owner).map_err(|error| format!("could not start the warm pools: {error}"))?;
    Ok(Some(pools))
}

/// The operator's pools as the engine's pool manager sees them: each
/// one's shape (what a run must ask for to take one) and rules.
fn pool_shapes(config: &Config) -> Vec<(PoolShape, PoolRules)> {
    let start_timeout = Duration::from_secs(config.start_timeout_s);
    config
        .warm_pools
        .iter()
        .map(|pool| {
            let shape = PoolShape {
                name: pool.name.clone(),
                image: pool.image.clone(),
                cpu: pool.cpu.clone(),
                memory: pool.memory.clone(),
                network: pool.network,
                workdir: crate::sandbox::WORKDIR.to_string(),
                preload: pool.language.as_deref().and_then(|language| preload(config, language)),
            };
            (shape, PoolRules { size: pool.size as usize, max_idle: pool.max_idle, start_timeout })
        })
        .collect()
}

/// What a language pool's sandboxes start ahead: the profile's
/// interpreter, with the environment its `execute_code` calls get.
fn preload(config: &Config, language: &str) -> Option<crate::sandbox::args::Preload> {
    let profile = config.languages.get(language)?;
    let (prefix, argv) = profile.prestart()?;
    Some(crate::sandbox::args::Preload { argv, prefix, env: engine::spec::env_over(&config.job_extra_env, &profile.env) })
}

/// The result of one `doctor` check, on either backend: a line for the
/// operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub passed: bool,
    /// Passed, but the operator should act: jobs run, yet a promise of the
    /// security model does not hold (e.g. NetworkPolicy is not enforced).
    pub warning: bool,
    pub text: String,
}

impl Check {
    pub(crate) fn pass(text: impl Into<String>) -> Check {
        Check { passed: true, warning: false, text: text.into() }
    }

    pub(crate) fn fail(text: impl Into<String>) -> Check {
        Check { passed: false, warning: false, text: text.into() }
    }

    pub(crate) fn warn(text: impl Into<String>) -> Check {
        Check { passed: true, warning: true, text: text.into() }
    }

    /// `ok    ...`, `WARN  ...` or `FAIL  ...`, as doctor prints it.
    pub fn line(&self) -> String {
        let verdict = match (self.passed, self.warning) {
            (false, _) => "FAIL",
            (true, true) => "WARN",
            (true, false) => "ok  ",
        };
        format!("{verdict}  {}", self.text)
    }
}
