//! Network modes on the Docker backend, through the built server
//! against the test daemon: from a run in each mode, what it reaches and
//! what it does not, and whether anything can connect to it.
//!
//! Only addresses the tests make are used: busybox `httpd` containers on
//! networks the tests create (an `--internal` one as the restricted
//! network, a plain bridge as "elsewhere"), one in the daemon's own network
//! namespace (network mode `host`: the host's side of every bridge, what
//! proves egress leaves a run's network), and a peer container on the
//! `open` network that knocks on a run's port. Refused paths fail within
//! seconds (`nc -w 2`). Every container and network the tests make is
//! removed; the server's own `mcp-k8s-open` stays, as it would in
//! production (other tests' runs use it at the same time).
//!
//! The refusals are dockerd's iptables rules: `enable_icc=false` on
//! `mcp-k8s-open`, `--internal`, and the isolation between bridge networks.
//! `tests/docker/up` runs the test daemon with `--iptables=true` in a
//! network namespace of its own, so they hold there as on a real host;
//! against a daemon started with `--iptables=false` these tests fail.
//! The daemon's namespace has no route out, so "egress anywhere" is proven
//! by reaching its host side, not the internet.

use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::backend::{self, Removed, fetch_done, ok, run, run_id_of, wait_for_output};
use crate::{BUSYBOX, Cleanup, TEST_LABEL, client, hardened};
use mcp_k8s_ephemeral_job::backend::docker::spec::{ICC_OPTION, OPEN_NETWORK};
use mcp_k8s_ephemeral_job::docker;

/// The port of the `httpd` containers on the tests' networks.
const PORT: u16 = 8080;

/// Networks a test made, removed when dropped (after the containers on
/// them: declare this before the test's `Cleanup`).
struct Networks {
    client: docker::Client,
    names: Vec<String>,
}

impl Networks {
    fn new(client: &docker::Client) -> Networks {
        Networks { client: client.clone(), names: Vec::new() }
    }

    /// A bridge network named after the test, `--internal` or not.
    fn create(&mut self, test: &str, internal: bool) -> String {
        let name = crate::unique(test);
        let _ = self.client.network_remove(&name);
        let mut spec = docker::objects::NetworkSpec {
            name: name.clone(),
            driver: "bridge".into(),
            internal,
            check_duplicate: true,
            ..Default::default()
        };
        spec.labels.insert(TEST_LABEL.into(), name.clone());
        self.client.network_create(&spec).expect("create a test network");
        self.names.push(name.clone());
        name
    }
}

impl Drop for Networks {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = self.client.network_remove(name);
        }
    }
}

/// A busybox `httpd` on `network` answering `<name>-body` on `port`; the
/// container's id.
fn httpd(client: &docker::Client, cleanup: &Cleanup, name: &str, network: &str, port: u16) -> String {
    let script = format!("mkdir -p /tmp/www && echo {name}-body > /tmp/www/index.html && exec httpd -f -p {port} -h /tmp/www");
    let mut spec = hardened(cleanup, &["sh", "-c", &script]);
    spec.host_config.network_mode = network.to_string();
    let container = format!("{}-{name}", cleanup.value);
    let created = client.container_create(&container, &spec).expect("create the http server");
    client.container_start(&created.id).expect("start the http server");
    created.id
}

/// An `httpd` on `network` (see `httpd`) on `PORT`; its address.
fn http_server(client: &docker::Client, cleanup: &Cleanup, name: &str, network: &str) -> String {
    let id = httpd(client, cleanup, name, network, PORT);
    address_on(client, &id, network)
}

/// An `httpd` in the daemon's own network namespace (network mode `host`)
/// answering `host-body` on a port of this test's; the port. Every
/// bridge's gateway address is one of that namespace's, so a run reaches
/// it there when its traffic may leave its network for the host.
fn host_server(client: &docker::Client, cleanup: &Cleanup, offset: u16) -> u16 {
    // Several test processes may share the daemon (and so its namespace's
    // ports), and each test of this file has its own offset.
    let port = 20_000 + (std::process::id() % 10_000) as u16 * 3 + offset;
    httpd(client, cleanup, "host", "host", port);
    port
}

/// The gateway address of `network`: the daemon host's side of its bridge.
fn gateway_of(client: &docker::Client, network: &str) -> String {
    let inspect = client.network_inspect(network).expect("inspect the network");
    let gateway = inspect.ipam.config.first().map(|config| config.gateway.clone()).unwrap_or_default();
    assert!(!gateway.is_empty(), "{inspect:?}");
    gateway
}

fn address_on(client: &docker::Client, container: &str, network: &str) -> String {
    let inspect = client.container_inspect(container).expect("inspect");
    let endpoint = inspect.network_settings.networks.get(network).unwrap_or_else(|| panic!("{container} is not on {network}"));
    assert!(!endpoint.ip_address.is_empty(), "{endpoint:?}");
    endpoint.ip_address.clone()
}

/// A shell line printing `<name>=reached` when the http server at `ip`
/// answers on `port` with its body, else `<name>=refused` (within 2 s).
fn fetch_line(name: &str, ip: &str, port: u16) -> String {
    format!(
        "if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {ip} {port} 2>/dev/null | grep -q {name}-body; then echo {name}=reached; else echo {name}=refused; fi"
    )
}

/// A `run_job` of `script` in `network` (`Value::Null`: the default).
fn run_in(server: &mut crate::support::server::StdioServer, network: Value, script: &str) -> Value {
    let mut arguments = json!({"image": BUSYBOX, "command": ["sh", "-c", script]});
    if !network.is_null() {
        arguments["network"] = network;
    }
    run(server, arguments)
}

fn lines(out: &Value) -> Vec<String> {
    out["stdout"].as_str().unwrap_or_default().lines().map(str::to_string).collect()
}

#[test]
fn none_reaches_nothing_not_even_dns() {
    let client = client();
    let mut networks = Networks::new(&client);
    let cleanup = Cleanup::new(&client, "net-none");
    let internal = networks.create("net-none-internal", true);
    let inside = http_server(&client, &cleanup, "inside", &internal);
    let host_port = host_server(&client, &cleanup, 0);
    let mut server = backend::server(&[("MCP_K8S_DOCKER_NETWORK", &internal)]);
    let script = format!(
        "{}; {}; if nslookup example.com >/dev/null 2>&1; then echo dns=answered; else echo dns=refused; fi; ls /sys/class/net",
        fetch_line("inside", &inside, PORT),
        fetch_line("host", &gateway_of(&client, &internal), host_port),
    );
    let started = Instant::now();
    let out = run_in(&mut server, json!("none"), &script);
    assert_eq!(out["status"], "succeeded", "{out}");
    assert_eq!(lines(&out), ["inside=refused", "host=refused", "dns=refused", "lo"], "{out}");
    assert!(started.elapsed() < Duration::from_secs(15), "refused at once: {:?}", started.elapsed());
}

/// `restricted` is the operator's network: here an `--internal` one,
/// whose own containers a run reaches and nothing past it. The daemon's
/// host is not past it: Docker filters what is forwarded between
/// networks, not what a container sends to its host's addresses, so a
/// run reaches a service of the host's on the gateway (docs/security.md,
/// the security model: the operator's to close with host firewall rules).
#[test]
fn restricted_reaches_its_network_and_not_another() {
    let client = client();
    let mut networks = Networks::new(&client);
    let cleanup = Cleanup::new(&client, "net-restricted");
    let internal = networks.create("net-restricted-internal", true);
    let elsewhere = networks.create("net-restricted-elsewhere", false);
    let inside = http_server(&client, &cleanup, "inside", &internal);
    let outside = http_server(&client, &cleanup, "outside", &elsewhere);
    let host_port = host_server(&client, &cleanup, 1);
    let mut server = backend::server(&[("MCP_K8S_DOCKER_NETWORK", &internal)]);
    let script = format!(
        "{}; {}; {}",
        fetch_line("inside", &inside, PORT),
        fetch_line("outside", &outside, PORT),
        fetch_line("host", &gateway_of(&client, &internal), host_port),
    );
    let started = Instant::now();
    let out = run_in(&mut server, json!("restricted"), &script);
    assert_eq!(out["status"], "succeeded", "{out}");
    assert_eq!(lines(&out), ["inside=reached", "outside=refused", "host=reached"], "{out}");
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
}

#[test]
fn restricted_without_its_network_is_refused_naming_the_setting() {
    let mut server = backend::server(&[]);
    let out = run_in(&mut server, json!("restricted"), "true");
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("error"), Some("Rejected")), "{out}");
    assert!(out["message"].as_str().unwrap_or_default().contains("MCP_K8S_DOCKER_NETWORK"), "{out}");
    let mut narrow = backend::server(&[("MCP_K8S_NETWORK_MODES", "none"), ("MCP_K8S_NETWORK_DEFAULT", "none")]);
    let (result, _) = backend::call(&mut narrow, "run_job", json!({"image": BUSYBOX, "command": ["true"], "network": "open"}));
    assert_eq!(result["isError"], true, "{result}");
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    assert_eq!(text, "`network` `open` is not allowed on this server; allowed: none (the operator's MCP_K8S_NETWORK_MODES)");
}

/// The egress half of `open`: a run on `mcp-k8s-open` (the default mode)
/// reaches a server on the host's side of that bridge, so its traffic
/// leaves the network (the test daemon's namespace routes nowhere
/// further); a container on another bridge network it does not (Docker
/// isolates networks from each other). The ingress half: a peer container
/// on the same network knocks on an open run's port and is refused.
#[test]
fn open_reaches_out_and_nothing_connects_in() {
    let client = client();
    let mut networks = Networks::new(&client);
    let cleanup = Cleanup::new(&client, "net-open");
    let elsewhere = networks.create("net-open-elsewhere", false);
    let outside = http_server(&client, &cleanup, "outside", &elsewhere);
    let host_port = host_server(&client, &cleanup, 2);
    let mut server = backend::server(&[]);
    // The first open run makes the network if no run has yet.
    let first = run_in(&mut server, Value::Null, "true");
    assert_eq!(first["status"], "succeeded", "{first}");
    let network = client.network_inspect(OPEN_NETWORK).expect("the server made its open network");
    assert_eq!(network.options.get(ICC_OPTION).map(String::as_str), Some("false"), "{network:?}");
    let script =
        format!("{}; {}", fetch_line("host", &gateway_of(&client, OPEN_NETWORK), host_port), fetch_line("outside", &outside, PORT));
    let out = run_in(&mut server, Value::Null, &script);
    assert_eq!(lines(&out), ["host=reached", "outside=refused"], "{out}");

    let listen = "echo ip=$(hostname -i); nc -l -p 8080 > got.txt 2>&1 & pid=$!; sleep 6; kill $pid 2>/dev/null; echo got=$(cat got.txt)";
    let submitted = ok(&mut server, "submit_job", json!({"image": BUSYBOX, "command": ["sh", "-c", listen]}));
    let token = submitted["job_token"].as_str().expect("job_token").to_string();
    let _removed = Removed(vec![token.clone()]);
    wait_for_output(&mut server, &token, "ip=");
    let job_ip = address_on(&client, &format!("mcp-run-{}", run_id_of(&token)), OPEN_NETWORK);
    let knock = format!("if echo knock | nc -w 2 {job_ip} 8080; then echo peer=connected; else echo peer=refused; fi");
    let mut peer = hardened(&cleanup, &["sh", "-c", &knock]);
    peer.host_config.network_mode = OPEN_NETWORK.to_string();
    let peer_id = client.container_create(&format!("{}-peer", cleanup.value), &peer).expect("create the peer").id;
    client.container_start(&peer_id).expect("start the peer");
    client.container_wait(&peer_id, docker::WaitCondition::NotRunning, Duration::from_secs(30), None).expect("wait");
    let mut logs = client.container_logs(&peer_id, &docker::LogParams { follow: false, idle_timeout: None }).expect("logs");
    let mut peer_said = String::new();
    logs.read_to_string(&mut peer_said).expect("read the peer's log");
    let done = fetch_done(&mut server, &token);
    let job_said = done["result"]["stdout"].as_str().unwrap_or_default().to_string();
    assert_eq!(peer_said, "peer=refused\n", "{job_said}");
    assert!(job_said.ends_with("got=\n"), "{job_said}");
}
