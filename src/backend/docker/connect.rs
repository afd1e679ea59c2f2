//! Connecting the Docker backend from the checked `Config`: the daemon's
//! socket (`MCP_K8S_DOCKER_HOST`, else `DOCKER_HOST` as the Docker CLI
//! reads it), the runner binary it bind-mounts (checked static and of the
//! engine's architecture before anything runs), the backend's `Options`
//! and the warm pools; and what `main` asks of it besides runs
//! (`Connected`: the start-up checks and `doctor`, in `doctor.rs`).

use std::sync::Arc;

use serde_json::json;

use crate::backend::docker::{Docker, doctor, spec};
use crate::backend::{self, Check, ConnectError, Connected, WarmPools};
use crate::config::{BackendChoice, Config, DockerPull};
use crate::docker;
use crate::engine;
use crate::engine::port::spec::Policy;
use crate::log;

/// Finds and checks the runner binary, connects to the daemon, says which
/// at start, and starts the warm pools when `warm` says to. `why`: why this
/// backend was chosen, for the start-up line.
///
/// A wrong runner binary is `Misconfigured` (the start stops, lazy or
/// not); a daemon that does not answer is `Unavailable`. With
/// MCP_K8S_BACKEND=docker the binary is checked before the daemon is
/// asked, so that the setting is named even while the daemon is down;
/// with `auto` only once a daemon answered, since until then Docker is
/// not the backend and its runner binary is nobody's business (a
/// developer's dynamically linked build would otherwise hide the real
/// news: no backend at all).
pub fn connect(config: &Config, policy: Policy, warm: WarmPools, why: &str) -> Result<Arc<Docker>, ConnectError> {
    let docker_host = config.docker_host.clone().or_else(|| std::env::var("DOCKER_HOST").ok().filter(|value| !value.is_empty()));
    let chosen = config.backend == BackendChoice::Docker;
    let socket = docker::socket_path(docker_host.as_deref()).map_err(|error| match chosen {
        true => ConnectError::Misconfigured(error.to_string()),
        false => ConnectError::Unavailable(error.to_string()),
    })?;
    let runner = if chosen { Some(runner_binary(config).map_err(ConnectError::Misconfigured)?) } else { None };
    let client =
        docker::Client::connect(&socket, docker::Options::default()).map_err(|error| ConnectError::Unavailable(error.to_string()))?;
    let (runner_path, machine) = match runner {
        Some(runner) => runner,
        None => runner_binary(config).map_err(ConnectError::Misconfigured)?,
    };
    if let Some(why) = doctor::runner_arch_refusal(&runner_path, machine, &client.version().arch) {
        return Err(ConnectError::Misconfigured(why));
    }
    if config.pod_template.is_some() {
        // Its fields (node selection, tolerations, pull Secrets) are the
        // scheduler's and the kubelet's; a local engine has neither.
        log::warn("MCP_K8S_POD_TEMPLATE is ignored on the Docker backend: it shapes Kubernetes pods only", &[]);
    }
    let options = spec::Options {
        runner_binary: runner_path,
        restricted_network: config.docker_network.clone(),
        pull: match config.docker_pull {
            DockerPull::Never => spec::Pull::Never,
            DockerPull::Missing => spec::Pull::Missing,
        },
        owned_tmpfs: !client.version().is_podman(),
        stdin_across_attaches: !client.version().is_podman(),
    };
    log::info(
        "backend: docker",
        &[
            ("why", json!(why)),
            ("socket", json!(client.socket().display().to_string())),
            ("engine", json!(client.version().version)),
            ("api_version", json!(client.api_version())),
            ("runner_binary", json!(options.runner_binary)),
        ],
    );
    let docker = Docker::new(client, policy, options);
    let pools = backend::start_pools(config, docker.clone(), warm).map_err(ConnectError::Unavailable)?;
    Ok(Arc::new(docker.with_pools(pools)))
}

/// The runner binary's path and ELF machine, or why it cannot be mounted
/// as the runner: a missing path (Docker would create it on the host as
/// an empty directory, as root), or a binary that is not static
/// (`doctor::check_runner`: a dynamic one would end every run without its
/// result).
fn runner_binary(config: &Config) -> Result<(String, u16), String> {
    let runner_binary = match &config.runner_binary {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .map_err(|error| format!("MCP_K8S_RUNNER_BINARY is unset and this executable's path is unknown: {error}"))?,
    };
    if !runner_binary.is_file() {
        return Err(format!(
            "MCP_K8S_RUNNER_BINARY: `{}` is not a file; set it to the static runner binary (this server's musl build)",
            runner_binary.display()
        ));
    }
    let runner_path = runner_binary.to_string_lossy().into_owned();
    let machine = doctor::check_runner(&runner_path)?;
    Ok((runner_path, machine))
}

impl Connected for Docker {
    fn kind(&self) -> BackendChoice {
        BackendChoice::Docker
    }

    /// `Config` checks the network default for MCP_K8S_BACKEND=docker;
    /// with auto, only now is the backend known.
    fn check_at_start(&self, config: &Config) -> Result<(), String> {
        config.check_docker_network().map_err(|error| error.to_string())
    }

    fn doctor(&self, config: &Config, ctx: &engine::run::Ctx, report: &mut dyn FnMut(&Check)) -> bool {
        doctor::run(config, ctx, &self.client, &self.options, report)
    }
}
