//! What the tools say about where runs go, from the configuration: a
//! Kubernetes pod, a Docker container, or, when that is not known, a
//! sandbox in neutral words; and the network modes a call may ask for
//! there. Pure functions of the `Config`, which the tools' titles,
//! descriptions, schemas and `describe_environment` share, so an agent on
//! Docker never reads of pods and is never offered a mode its site refuses.
//!
//! The backend is not known while the configuration says `auto` and no
//! connection resolved it (`main` writes the one each site reached into
//! the configuration the tools get: `wiring::resolved`; a site that could
//! not be reached at a lazy start stays `auto`) or when the sites run on
//! both kinds.

use crate::config::{BackendChoice, Config};
use crate::network::NetworkMode;

/// Where this server's runs go, as far as the tools can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runs {
    Kubernetes,
    Docker,
    /// `auto` not yet resolved, or sites of both kinds.
    Either,
}

impl Runs {
    /// What a run gets, in a tool's words.
    pub fn sandbox(self) -> &'static str {
        match self {
            Runs::Kubernetes => "Kubernetes pod",
            Runs::Docker => "Docker container",
            Runs::Either => "sandbox (a pod or a container)",
        }
    }
}

/// Where runs go: every site's backend, when they agree.
pub fn runs(config: &Config) -> Runs {
    let mut backends = site_configs(config).map(|site| site.backend);
    let first = backends.next().unwrap_or(BackendChoice::Auto);
    if backends.any(|backend| backend != first) {
        return Runs::Either;
    }
    match first {
        BackendChoice::Kubernetes => Runs::Kubernetes,
        BackendChoice::Docker => Runs::Docker,
        BackendChoice::Auto => Runs::Either,
    }
}

/// The network modes a call may ask for on every site: the operator's
/// (MCP_K8S_NETWORK_MODES) less those a site's backend refuses, so the
/// schema never offers a mode that would end `Rejected`.
pub fn network_modes(config: &Config) -> Vec<NetworkMode> {
    let configs: Vec<&Config> = site_configs(config).collect();
    config.network_modes.iter().copied().filter(|mode| configs.iter().all(|site| site_takes(site, *mode))).collect()
}

/// A Docker site runs `restricted` only on the operator's network
/// (MCP_K8S_DOCKER_NETWORK); every other mode, and every mode on
/// Kubernetes, runs where the operator allows it.
fn site_takes(site: &Config, mode: NetworkMode) -> bool {
    site.network_modes.contains(&mode)
        && !(mode == NetworkMode::Restricted && site.backend == BackendChoice::Docker && site.docker_network.is_none())
}

fn site_configs(config: &Config) -> impl Iterator<Item = &Config> {
    let own = config.sites.is_empty().then_some(config);
    own.into_iter().chain(config.sites.iter().map(|site| &site.config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RawConfig;

    fn config(settings: &[(&str, &str)]) -> Config {
        let raw = RawConfig::from_lookup(|name| settings.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string()));
        Config::from_raw(&raw).unwrap()
    }

    /// Environment settings, as `RawConfig::from_lookup` reads them.
    type Settings<'a> = &'a [(&'a str, &'a str)];

    #[test]
    fn the_tools_name_the_backend_in_use_and_only_the_modes_it_runs() {
        use NetworkMode::{None as Off, Open, Restricted};
        let all = vec![Off, Restricted, Open];
        let cases: [(Settings, Runs, Vec<NetworkMode>); 6] = [
            (&[], Runs::Either, all.clone()),
            (&[("MCP_K8S_BACKEND", "kubernetes")], Runs::Kubernetes, all.clone()),
            (&[("MCP_K8S_BACKEND", "docker")], Runs::Docker, vec![Off, Open]),
            (&[("MCP_K8S_BACKEND", "docker"), ("MCP_K8S_DOCKER_NETWORK", "egress")], Runs::Docker, all.clone()),
            (
                &[("MCP_K8S_BACKEND", "docker"), ("MCP_K8S_NETWORK_MODES", "none,restricted"), ("MCP_K8S_NETWORK_DEFAULT", "none")],
                Runs::Docker,
                vec![Off],
            ),
            (&[("MCP_K8S_BACKEND", "kubernetes"), ("MCP_K8S_NETWORK_MODES", "open")], Runs::Kubernetes, vec![Open]),
        ];
        for (settings, expected_runs, expected_modes) in cases {
            let config = config(settings);
            assert_eq!((runs(&config), network_modes(&config)), (expected_runs, expected_modes), "{settings:?}");
        }
    }
}
