//! The library half of `main`'s wiring: each layer's settings built from the
//! checked `Config` (the engine's `Policy` and run context), and the one
//! `match` on the configured backend that connects it. Here rather than in
//! `tools` (which only serves tools) or in `main` (a binary): the fuzz
//! targets build the same `Policy` the server does.
//!
//! Decides nothing about runs; every backend-specific step of connecting is
//! the backend's own `connect`.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::kubernetes::template::{self, PodTemplate};
use crate::backend::{self, ConnectError, Connected, WarmPools};
use crate::config::{BackendChoice, Config};
use crate::engine;

/// Settings a backend reads from files, read and checked before any
/// backend call, so that a bad one stops the start (exit 2) even without
/// credentials or a daemon.
pub struct Prepared {
    /// The operator's pod template (`MCP_K8S_POD_TEMPLATE`).
    pod_template: Option<PodTemplate>,
}

pub fn prepare(config: &Config) -> Result<Prepared, String> {
    let pod_template = template::from_config(config).map_err(|error| error.to_string())?;
    Ok(Prepared { pod_template })
}

/// Connects the configured backend (`MCP_K8S_BACKEND`) and says at start
/// which one and why. With `auto`: Kubernetes when cluster credentials are
/// found, else Docker when a daemon answers.
pub fn connect(config: &Config, prepared: &Prepared, warm: WarmPools) -> Result<Arc<dyn Connected>, ConnectError> {
    let kubernetes = |why: &str| -> Result<Arc<dyn Connected>, ConnectError> {
        Ok(backend::kubernetes::connect::connect(config, policy(config), prepared.pod_template.clone(), warm, why)
            .map_err(ConnectError::Unavailable)?)
    };
    let docker = |why: &str| -> Result<Arc<dyn Connected>, ConnectError> {
        Ok(backend::docker::connect::connect(config, policy(config), warm, why)?)
    };
    match config.backend {
        BackendChoice::Kubernetes => kubernetes("MCP_K8S_BACKEND=kubernetes"),
        BackendChoice::Docker => docker("MCP_K8S_BACKEND=docker"),
        BackendChoice::Auto => match kubernetes("MCP_K8S_BACKEND=auto and cluster credentials were found") {
            Ok(connected) => Ok(connected),
            // A kubeconfig named explicitly is the operator's choice of
            // Kubernetes: its error is the one to report.
            Err(error) if config.kubeconfig.is_some() => Err(error),
            Err(kube_error) => match docker("MCP_K8S_BACKEND=auto, no cluster credentials, and a Docker daemon answers") {
                Ok(connected) => Ok(connected),
                // A daemon answered, so Docker is the backend: what is
                // wrong with it is the news, not the missing cluster.
                Err(ConnectError::Misconfigured(message)) => Err(ConnectError::Misconfigured(message)),
                Err(ConnectError::Unavailable(docker_message)) => Err(ConnectError::Unavailable(format!(
                    "no cluster credentials ({}) and no Docker daemon ({docker_message})",
                    kube_error.message()
                ))),
            },
        },
    }
}

/// The operator's choices as the engine sees them: what every backend
/// understands (a backend's own settings are its `connect`'s to read).
pub fn policy(config: &Config) -> engine::port::spec::Policy {
    engine::port::spec::Policy {
        run_as_user: config.run_as_user,
        default_cpu: config.default_cpu.clone(),
        default_memory: config.default_memory.clone(),
        max_output_bytes: config.max_output_bytes,
        max_artifact_bytes: config.max_artifact_bytes,
        start_timeout: Duration::from_secs(config.start_timeout_s),
        workdir_size_limit: config.workdir_size.clone(),
        extra_env: config.job_extra_env.clone(),
        cache: config
            .cache
            .as_ref()
            .map(|cache| engine::port::spec::CacheVolume { claim_name: cache.pvc.clone(), mount_path: cache.mount_path.clone() }),
        clone: config
            .clone
            .as_ref()
            .map(|clone| engine::port::spec::CloneStep { image: clone.image.clone(), secret_name: clone.secret.clone() }),
        outputs: outputs(config),
        sandboxes: engine::port::spec::SandboxLimits {
            max_open: config.max_sandboxes,
            max_lifetime: Duration::from_secs(config.sandbox_max_lifetime_s),
        },
    }
}

/// The output store, when MCP_K8S_OUTPUTS_DIR is set: its entries stay
/// as long as a background run's result (MCP_K8S_RESULT_TTL_S).
pub fn outputs(config: &Config) -> Option<Arc<crate::outputs::Store>> {
    config.outputs.as_ref().map(|outputs| {
        Arc::new(crate::outputs::Store::new(
            &outputs.dir,
            outputs.max_run_bytes,
            outputs.max_bytes,
            Duration::from_secs(config.result_ttl_s),
        ))
    })
}

/// The sites of `config`, the default first: its MCP_K8S_SITES, each with
/// its own settings, else itself as the one site `default`. `named` says
/// which (named sites' tokens carry their site).
pub fn sites(config: &Config) -> (Vec<(String, Config)>, bool) {
    match config.sites.as_slice() {
        [] => (vec![(crate::config::DEFAULT_SITE.to_string(), config.clone())], false),
        sites => (sites.iter().map(|site| (site.name.clone(), site.config.clone())).collect(), true),
    }
}

/// The engine on `backend`: the policy, the concurrency slots and the
/// background runs' cache. `site`: the site's name when sites are named.
pub fn engine_ctx(config: &Config, backend: Arc<dyn engine::port::Backend>, site: Option<String>) -> engine::run::Ctx {
    engine::run::Ctx {
        site,
        backend,
        policy: policy(config),
        slots: engine::run::slots::Slots::new(config.max_concurrent as usize, config.max_queued as usize),
        // Background runs in flight are capped like sync runs plus their
        // queue; see engine::background for why they take no slot.
        jobs: engine::port::jobs::Jobs::new(engine::port::jobs::Limits::new(
            Duration::from_secs(config.result_ttl_s),
            (config.max_concurrent + config.max_queued) as usize,
        )),
    }
}
