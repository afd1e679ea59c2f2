//! Connecting the Kubernetes backend from the checked `Config`: the
//! credentials (kubeconfig, in-cluster, exec plugins; `kube::Source`), the
//! cluster's own `Settings`, the operator's pod template and the warm
//! pools; and what `main` asks of it besides runs (`Connected`: the
//! start-up checks and `doctor`, which live in `doctor.rs`).

use std::sync::Arc;

use serde_json::json;

use crate::backend::kubernetes::settings::Settings;
use crate::backend::kubernetes::template::PodTemplate;
use crate::backend::kubernetes::{Kubernetes, doctor};
use crate::backend::{self, Check, Connected, WarmPools};
use crate::config::{BackendChoice, Config};
use crate::engine;
use crate::engine::port::spec::Policy;
use crate::kube;
use crate::log;

/// Loads the credentials, says which cluster and namespace at start, and
/// starts the warm pools when `warm` says to. `why`: why this backend was
/// chosen, for the start-up line.
pub fn connect(
    config: &Config,
    policy: Policy,
    pod_template: Option<PodTemplate>,
    warm: WarmPools,
    why: &str,
) -> Result<Arc<Kubernetes>, String> {
    let source = kube::Source::select(config.kubeconfig.as_deref(), config.kube_context.as_deref());
    let client = kube::Client::new(&source).map_err(|error| credentials_message(&error))?;
    log::info("backend: kubernetes", &[("why", json!(why))]);
    log_credentials(config, &client);
    let kubernetes = Kubernetes::new(client, policy, Settings::from_config(config)).with_pod_template(pod_template);
    let pools = backend::start_pools(config, kubernetes.clone(), warm)?;
    Ok(Arc::new(kubernetes.with_pools(pools)))
}

impl Connected for Kubernetes {
    fn kind(&self) -> BackendChoice {
        BackendChoice::Kubernetes
    }

    fn check_at_start(&self, config: &Config) -> Result<(), String> {
        doctor::check_at_start(config, &self.client)
    }

    fn doctor(&self, config: &Config, ctx: &engine::run::Ctx, report: &mut dyn FnMut(&Check)) -> bool {
        doctor::run(config, self, ctx, report)
    }
}

/// The start-up error for credentials that did not load. Where to set a
/// source is said only when none was found: with a kubeconfig that has one
/// wrong field, "set MCP_K8S_KUBECONFIG" sent people to the wrong fix.
fn credentials_message(error: &kube::Error) -> String {
    if error.is_no_configuration() {
        return format!("{error}; set MCP_K8S_KUBECONFIG or KUBECONFIG, or run in a pod with a ServiceAccount");
    }
    error.to_string()
}

/// Says which cluster and credentials are used, and in which namespace the
/// Jobs go. The rule (docs/credentials.md, "How the server finds its cluster
/// credentials"): Jobs go to `MCP_K8S_NAMESPACE`, `mcp-ephemeral` by
/// default, never to the kubeconfig context's or the ServiceAccount's
/// namespace, because the restricted namespace of `deploy/` is where the
/// server's Role and the Pod Security labels are. A context namespace that
/// differs is logged as ignored, so nobody wonders why it is not used.
fn log_credentials(config: &Config, client: &kube::Client) {
    log::info("kubernetes credentials", &[("source", json!(client.description())), ("namespace", json!(config.namespace))]);
    if client.namespace() != config.namespace {
        log::info(
            "the credentials' own namespace is ignored: jobs run in MCP_K8S_NAMESPACE",
            &[("namespace", json!(config.namespace)), ("ignored_namespace", json!(client.namespace()))],
        );
    }
}
