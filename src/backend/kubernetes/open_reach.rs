//! `doctor`'s check that network mode `open` keeps off the cluster's own
//! parts: a job of the runner image, in mode `open`, tries every address of
//! the API server (its `kubernetes` EndpointSlice), every node address on
//! the API server's and the kubelet's ports (a control plane listens on all
//! of its node's addresses, and a node address outside the `open` policy's
//! `except` is a way in), and each warm pool pod's runner port. Any that
//! answers fails doctor, naming the `except` entry or policy that closes it.
//!
//! The targets come from objects the server's Role does not cover (nodes
//! are cluster-scoped, the EndpointSlice lives in `default`):
//! deploy/doctor.optional.yaml grants reading them; without it the check
//! says what it could not look up. Gathering the targets and the verdict
//! are pure functions; `check` is the shell that reads and runs.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use crate::backend::Check;
use crate::backend::kubernetes::manifest;
use crate::kube::objects::{EndpointSlice, Node, Pod};
use crate::kube::{self, ListParams, Resource};
use crate::sandbox::args::MAX_REACH_TARGETS;
use crate::sandbox::assignment::PORT as RUNNER_PORT;
use crate::sandbox::probe::ReachProbe;

/// The API server's port when its EndpointSlice cannot be read: kubeadm's
/// and most distributions' default.
const DEFAULT_API_PORT: u16 = 6443;
/// The kubelet's port when a node does not say.
const DEFAULT_KUBELET_PORT: u16 = 10250;

/// One address an `open` job must not reach, and what answers there.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    pub address: SocketAddr,
    pub what: Part,
}

/// What listens at a target, for the message.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    /// An address of the `kubernetes` EndpointSlice.
    ApiEndpoint,
    /// The API server's port on a node's address.
    ApiOnNode(String),
    Kubelet(String),
    /// A warm pool pod's runner port.
    PoolRunner(String),
}

impl Part {
    fn describe(&self) -> String {
        match self {
            Part::ApiEndpoint => "the API server's endpoint".to_string(),
            Part::ApiOnNode(node) => format!("the API server's port on node `{node}`"),
            Part::Kubelet(node) => format!("node `{node}`'s kubelet"),
            Part::PoolRunner(pod) => format!("pool pod `{pod}`'s runner port"),
        }
    }
}

/// What the cluster told, each part `None` when it could not be read.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub api_endpoints: Option<EndpointSlice>,
    pub nodes: Option<Vec<Node>>,
    pub pool_pods: Vec<Pod>,
}

/// The addresses to try, without repeats, at most `MAX_REACH_TARGETS`:
/// the API server's endpoints, then each node's IP addresses on the API
/// server's ports and its kubelet's, then the pool pods' runner ports.
pub fn targets(seen: &Seen) -> Vec<Target> {
    let mut api_ports: BTreeSet<u16> = BTreeSet::new();
    let mut targets = Vec::new();
    if let Some(slice) = &seen.api_endpoints {
        api_ports.extend(slice.ports.iter().filter_map(|port| port.port));
        for address in slice.endpoints.iter().flat_map(|endpoint| &endpoint.addresses) {
            let Ok(ip) = address.parse::<IpAddr>() else { continue };
            targets.extend(api_ports.iter().map(|port| Target { address: SocketAddr::new(ip, *port), what: Part::ApiEndpoint }));
        }
    }
    if api_ports.is_empty() {
        api_ports.insert(DEFAULT_API_PORT);
    }
    for node in seen.nodes.iter().flatten() {
        let name = node.metadata.name.clone();
        let kubelet_port = node.status.daemon_endpoints.kubelet_endpoint.port.filter(|port| *port != 0).unwrap_or(DEFAULT_KUBELET_PORT);
        let ips =
            node.status.addresses.iter().filter(|address| address.kind.ends_with("IP")).filter_map(|address| address.address.parse().ok());
        for ip in ips {
            targets
                .extend(api_ports.iter().map(|port| Target { address: SocketAddr::new(ip, *port), what: Part::ApiOnNode(name.clone()) }));
            targets.push(Target { address: SocketAddr::new(ip, kubelet_port), what: Part::Kubelet(name.clone()) });
        }
    }
    for pod in &seen.pool_pods {
        let Some(ip) = pod.status.pod_ip.as_deref().and_then(|ip| ip.parse().ok()) else { continue };
        targets.push(Target { address: SocketAddr::new(ip, RUNNER_PORT), what: Part::PoolRunner(pod.metadata.name.clone()) });
    }
    let mut seen_addresses = BTreeSet::new();
    targets.retain(|target| seen_addresses.insert(target.address));
    targets.truncate(MAX_REACH_TARGETS);
    targets
}

/// What could not be looked up, with the grant that lets doctor look.
pub fn not_looked_up(seen: &Seen) -> Vec<&'static str> {
    let mut missing = Vec::new();
    if seen.api_endpoints.is_none() {
        missing.push("the API server's endpoints (`get` on EndpointSlice `kubernetes` in `default`)");
    }
    if seen.nodes.is_none() {
        missing.push("the nodes' addresses (`list` on nodes)");
    }
    missing
}

/// The verdict on what the probe job reached. A target it did not report
/// on counts as unknown, never as refused.
pub fn verdict(targets: &[Target], probes: &[ReachProbe], missing: &[&str]) -> Check {
    let reached: Vec<&Target> =
        targets.iter().filter(|target| probes.iter().any(|probe| probe.reached && probe.target == target.address.to_string())).collect();
    let unreported: Vec<&Target> =
        targets.iter().filter(|target| !probes.iter().any(|probe| probe.target == target.address.to_string())).collect();
    if !reached.is_empty() {
        return Check::fail(reached_text(&reached));
    }
    if !unreported.is_empty() {
        let list: Vec<String> = unreported.iter().map(|target| target.address.to_string()).collect();
        return Check::warn(format!("network mode `open`: the probe job did not report on {}, so they are unknown", list.join(", ")));
    }
    let tried = if targets.is_empty() {
        "no address to try".to_string()
    } else {
        let list: Vec<String> = targets.iter().map(|target| target.address.to_string()).collect();
        format!("a job pod reached none of {} ({})", list.len(), list.join(", "))
    };
    if missing.is_empty() {
        Check::pass(format!("network mode `open` keeps off the API server, the kubelets and pool pods: {tried}"))
    } else {
        Check::warn(format!(
            "network mode `open`: {tried}; not looked up: {} (deploy/doctor.optional.yaml grants it), so an address of the API server or a node outside the `open` policy's `except` would go unseen",
            missing.join(", ")
        ))
    }
}

/// Names each address reached and what closes it: an `except` entry for
/// the API server and the kubelets, the pool policy for a runner port.
fn reached_text(reached: &[&Target]) -> String {
    let list: Vec<String> = reached.iter().map(|target| format!("{} ({})", target.address, target.what.describe())).collect();
    let mut fixes = Vec::new();
    let excepts: BTreeSet<String> = reached
        .iter()
        .filter(|target| !matches!(target.what, Part::PoolRunner(_)))
        .map(|target| match target.address.ip() {
            IpAddr::V4(ip) => format!("{ip}/32"),
            IpAddr::V6(ip) => format!("{ip}/128"),
        })
        .collect();
    if !excepts.is_empty() {
        fixes.push(format!(
            "add {} to the `open` policy's `except` (deploy/networkpolicy-jobs-open.yaml, or the chart's jobsOpenExcept)",
            excepts.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    if reached.iter().any(|target| matches!(target.what, Part::PoolRunner(_))) {
        fixes.push("apply the pool pods' ingress policy of deploy/warm-pools.optional.yaml".to_string());
    }
    format!(
        "network mode `open`: a job pod reached {}, which no network mode may reach; {}, or leave `open` out of MCP_K8S_NETWORK_MODES",
        list.join(", "),
        fixes.join("; ")
    )
}

/// Reads what the targets come from: each part the server may not read
/// stays `None`.
pub fn look(client: &kube::Client, namespace: &str) -> Seen {
    let api_endpoints = client
        .get_if_exists(Resource::ENDPOINT_SLICES, "default", "kubernetes")
        .ok()
        .map(|slice| slice.map(|slice| EndpointSlice::from_value(&slice)).unwrap_or_default());
    let nodes = client.list(Resource::NODES, "", &ListParams::default()).ok().map(|list| list.items.iter().map(Node::from_value).collect());
    let pools = ListParams { label_selector: Some(manifest::LABEL_POOL.to_string()), field_selector: None };
    let pool_pods =
        client.list(Resource::PODS, namespace, &pools).map(|list| list.items.iter().map(Pod::from_value).collect()).unwrap_or_default();
    Seen { api_endpoints, nodes, pool_pods }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn seen() -> Seen {
        Seen {
            api_endpoints: Some(EndpointSlice::from_value(&json!({
                "endpoints": [{"addresses": ["10.244.0.1"]}],
                "ports": [{"name": "https", "port": 6443}],
            }))),
            nodes: Some(vec![Node::from_value(&json!({
                "metadata": {"name": "n1"},
                "status": {
                    "addresses": [
                        {"type": "InternalIP", "address": "10.244.0.1"},
                        {"type": "ExternalIP", "address": "192.0.2.2"},
                        {"type": "Hostname", "address": "n1"},
                    ],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                },
            }))]),
            pool_pods: vec![
                Pod::from_value(&json!({"metadata": {"name": "pool-a"}, "status": {"podIP": "10.244.0.9"}})),
                Pod::from_value(&json!({"metadata": {"name": "pool-pending"}, "status": {}})),
            ],
        }
    }

    #[test]
    fn targets_are_the_api_endpoints_every_node_ip_on_both_ports_and_pool_runner_ports() {
        let addresses: Vec<(String, Part)> = targets(&seen()).into_iter().map(|target| (target.address.to_string(), target.what)).collect();
        assert_eq!(
            addresses,
            [
                ("10.244.0.1:6443".to_string(), Part::ApiEndpoint),
                ("10.244.0.1:10250".to_string(), Part::Kubelet("n1".into())),
                ("192.0.2.2:6443".to_string(), Part::ApiOnNode("n1".into())),
                ("192.0.2.2:10250".to_string(), Part::Kubelet("n1".into())),
                ("10.244.0.9:7777".to_string(), Part::PoolRunner("pool-a".into())),
            ]
        );
    }

    #[test]
    fn without_the_endpoint_slice_node_addresses_are_tried_on_the_usual_api_port() {
        let blind = Seen { api_endpoints: None, ..seen() };
        let addresses: Vec<String> = targets(&blind).into_iter().map(|target| target.address.to_string()).collect();
        assert_eq!(addresses[..2], ["10.244.0.1:6443".to_string(), "10.244.0.1:10250".to_string()]);
        assert_eq!(not_looked_up(&blind).len(), 1);
        assert!(not_looked_up(&Seen::default()).len() == 2);
    }

    fn probe(target: &str, reached: bool) -> ReachProbe {
        ReachProbe { target: target.into(), reached, error: if reached { "none" } else { "TimedOut" }.into() }
    }

    #[test]
    fn the_verdict_fails_on_any_address_reached_naming_the_fix() {
        let targets = targets(&seen());
        let all_refused: Vec<ReachProbe> = targets.iter().map(|target| probe(&target.address.to_string(), false)).collect();
        // (case, what the probe said, what was not looked up, (passed, warning), words the text holds)
        type Case<'a> = (&'a str, Vec<ReachProbe>, &'a [&'a str], (bool, bool), &'a [&'a str]);
        let cases: Vec<Case> = vec![
            ("all refused", all_refused.clone(), &[], (true, false), &["keeps off", "reached none of 5"]),
            (
                "all refused, nodes unknown",
                all_refused.clone(),
                &["the nodes' addresses (`list` on nodes)"],
                (true, true),
                &["not looked up", "doctor.optional.yaml"],
            ),
            (
                "a node address answers",
                all_refused.iter().map(|p| if p.target == "192.0.2.2:6443" { probe(&p.target, true) } else { p.clone() }).collect(),
                &[],
                (false, false),
                &["192.0.2.2:6443 (the API server's port on node `n1`)", "add 192.0.2.2/32 to the `open` policy's `except`"],
            ),
            (
                "a pool pod answers",
                all_refused.iter().map(|p| if p.target == "10.244.0.9:7777" { probe(&p.target, true) } else { p.clone() }).collect(),
                &[],
                (false, false),
                &["pool pod `pool-a`'s runner port", "deploy/warm-pools.optional.yaml"],
            ),
            ("the probe said nothing", Vec::new(), &[], (true, true), &["did not report on 10.244.0.1:6443"]),
        ];
        for (case, probes, missing, (passed, warning), says) in cases {
            let check = verdict(&targets, &probes, missing);
            assert_eq!((check.passed, check.warning), (passed, warning), "{case}: {check:?}");
            for words in says {
                assert!(check.text.contains(words), "{case}: `{words}` in {}", check.text);
            }
        }
    }
}
