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

use crate::backend::{self, ConnectError, Connected, Prepared, WarmPools};
use crate::config::{BackendChoice, Config};
use crate::engine;

/// Connects the configured backend (`MCP_K8S_BACKEND`) and says at start
/// which one and why. With `auto`: Kubernetes when cluster credentials are
/// found, else Docker when a daemon answers.
pub fn connect(config: &Config, prepared: &Prepared, warm: WarmPools) -> Result<Arc<dyn Connected>, ConnectError> {
    let kubernetes = |why: &str| -> Result<Arc<dyn Connected>, ConnectError> {
        Ok(backend::kubernetes::connect::connect(config, policy(config), prepared.pod_template(), warm, why)
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

/// The settings the tools describe runs with: each site's `auto`
/// (MCP_K8S_BACKEND) replaced by the backend its connection reached,
/// `reached` in the order of `sites` (`None`: not connected, so still
/// `auto`). The tools' titles, instructions, `describe_environment` and
/// the `network` modes offered are then the backend's in use, not the
/// neutral words of a backend not yet known.
pub fn resolved(config: &Config, reached: &[Option<BackendChoice>]) -> Config {
    let mut resolved = config.clone();
    let site_configs: Vec<&mut Config> = match resolved.sites.is_empty() {
        true => vec![&mut resolved],
        false => resolved.sites.iter_mut().map(|site| &mut site.config).collect(),
    };
    for (site, reached) in site_configs.into_iter().zip(reached) {
        if let (BackendChoice::Auto, Some(kind)) = (site.backend, reached) {
            site.backend = *kind;
        }
    }
    resolved
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RawConfig;

    fn config(settings: &[(&str, &str)]) -> Config {
        let raw = RawConfig::from_lookup(|name| settings.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string()));
        Config::from_raw(&raw).unwrap()
    }

    fn backends(config: &Config) -> Vec<BackendChoice> {
        sites(config).0.iter().map(|(_, site)| site.backend).collect()
    }

    #[test]
    fn auto_becomes_the_backend_each_site_reached_and_a_choice_stays() {
        use BackendChoice::{Auto, Docker, Kubernetes};
        let path = std::env::temp_dir().join(format!("mcp-wiring-sites-{}.json", std::process::id()));
        std::fs::write(&path, r#"[{"name": "a", "default": true}, {"name": "b", "backend": "kubernetes"}, {"name": "c"}]"#).unwrap();
        let sites_file = path.display().to_string();
        // The settings, the backend each site reached, and what the tools get.
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [Option<BackendChoice>], &'a [BackendChoice]);
        let cases: [Case; 6] = [
            (&[], &[Some(Docker)], &[Docker]),
            (&[], &[Some(Kubernetes)], &[Kubernetes]),
            // Not connected (a lazy start): nothing is known yet.
            (&[], &[None], &[Auto]),
            (&[("MCP_K8S_BACKEND", "docker")], &[Some(Docker)], &[Docker]),
            (&[("MCP_K8S_SITES", &sites_file)], &[Some(Docker), Some(Kubernetes), None], &[Docker, Kubernetes, Auto]),
            (&[("MCP_K8S_SITES", &sites_file)], &[Some(Kubernetes), None, Some(Docker)], &[Kubernetes, Kubernetes, Docker]),
        ];
        for (settings, reached, expected) in cases {
            assert_eq!(backends(&resolved(&config(settings), reached)), expected, "{settings:?} {reached:?}");
        }
        let _ = std::fs::remove_file(&path);
    }
}
