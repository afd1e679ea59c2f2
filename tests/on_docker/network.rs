//! Network modes on the Docker backend (issue 16), through the built server
//! against the test daemon: from a run in each mode, what it reaches and
//! what it does not, and whether anything can connect to it.
//!
//! Only addresses the tests make are used: busybox `httpd` containers on
//! networks the tests create (an `--internal` one as the restricted
//! network, a plain bridge as "elsewhere"), a listener of this process on
//! the gateway of the server's `open` network (the host's side of that
//! bridge: what proves egress leaves the network), and a peer container on
//! the `open` network that knocks on a run's port. Refused paths fail
//! within seconds (`nc -w 2`). Every container and network the tests make
//! is removed; the server's own `mcp-k8s-open` stays, as it would in
//! production (other tests' runs use it at the same time).
//!
//! What the test daemon cannot enforce: `tests/docker/up` starts dockerd
//! with `--iptables=false` (so it never touches the test cluster's
//! firewall), and inter-container isolation on a bridge (`enable_icc`),
//! `--internal` and the isolation between bridge networks are iptables
//! rules dockerd installs. There, only `none` holds; `DOCKERD_IPTABLES`
//! says which behaviour these tests assert.

use std::io::Read;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::backend::{self, Removed, fetch_done, ok, run, run_id_of, wait_for_output};
use crate::{BUSYBOX, Cleanup, TEST_LABEL, client, hardened};
use mcp_k8s_ephemeral_job::backend::docker::spec::{ICC_OPTION, OPEN_NETWORK};
use mcp_k8s_ephemeral_job::docker;

/// FIXME(issue 16): false while `tests/docker/up` runs dockerd with
/// `--iptables=false`, and then only `none` is enforced: a restricted run
/// reaches other bridge networks through the host, and another container
/// on `mcp-k8s-open` can connect to an open run. With dockerd's default
/// (`--iptables=true`) set this to true: the same tests then assert that
/// both are refused.
const DOCKERD_IPTABLES: bool = false;

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

/// A busybox `httpd` on `network` answering `<name>-body`; its address.
fn http_server(client: &docker::Client, cleanup: &Cleanup, name: &str, network: &str) -> String {
    let script = format!("mkdir -p /tmp/www && echo {name}-body > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www");
    let mut spec = hardened(cleanup, &["sh", "-c", &script]);
    spec.host_config.network_mode = network.to_string();
    let container = format!("{}-{name}", cleanup.value);
    let created = client.container_create(&container, &spec).expect("create the http server");
    client.container_start(&created.id).expect("start the http server");
    address_on(client, &created.id, network)
}

fn address_on(client: &docker::Client, container: &str, network: &str) -> String {
    let inspect = client.container_inspect(container).expect("inspect");
    let endpoint = inspect.network_settings.networks.get(network).unwrap_or_else(|| panic!("{container} is not on {network}"));
    assert!(!endpoint.ip_address.is_empty(), "{endpoint:?}");
    endpoint.ip_address.clone()
}

/// A shell line printing `<name>=reached` when the http server at `ip`
/// answers with its body, else `<name>=refused` (within 2 s).
fn fetch_line(name: &str, ip: &str) -> String {
    format!(
        "if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {ip} 8080 2>/dev/null | grep -q {name}-body; then echo {name}=reached; else echo {name}=refused; fi"
    )
}

fn expected(name: &str, reached: bool) -> String {
    format!("{name}={}", if reached { "reached" } else { "refused" })
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
    let mut server = backend::server(&[("MCP_K8S_DOCKER_NETWORK", &internal)]);
    let script = format!(
        "{}; if nslookup example.com >/dev/null 2>&1; then echo dns=answered; else echo dns=refused; fi; ls /sys/class/net",
        fetch_line("inside", &inside)
    );
    let started = Instant::now();
    let out = run_in(&mut server, json!("none"), &script);
    assert_eq!(out["status"], "succeeded", "{out}");
    assert_eq!(lines(&out), ["inside=refused", "dns=refused", "lo"], "{out}");
    assert!(started.elapsed() < Duration::from_secs(15), "refused at once: {:?}", started.elapsed());
}

#[test]
fn restricted_reaches_its_network_and_not_another() {
    let client = client();
    let mut networks = Networks::new(&client);
    let cleanup = Cleanup::new(&client, "net-restricted");
    let internal = networks.create("net-restricted-internal", true);
    let elsewhere = networks.create("net-restricted-elsewhere", false);
    let inside = http_server(&client, &cleanup, "inside", &internal);
    let outside = http_server(&client, &cleanup, "outside", &elsewhere);
    let mut server = backend::server(&[("MCP_K8S_DOCKER_NETWORK", &internal)]);
    let script = format!("{}; {}", fetch_line("inside", &inside), fetch_line("outside", &outside));
    let started = Instant::now();
    let out = run_in(&mut server, json!("restricted"), &script);
    assert_eq!(out["status"], "succeeded", "{out}");
    assert_eq!(lines(&out), [expected("inside", true), expected("outside", !DOCKERD_IPTABLES)], "{out}");
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
/// reaches a listener on the host's side of that bridge. The ingress
/// half: a peer container on the same network knocks on an open run's
/// port.
#[test]
fn open_reaches_out_and_nothing_connects_in() {
    let client = client();
    let cleanup = Cleanup::new(&client, "net-open");
    let mut server = backend::server(&[]);
    // The first open run makes the network if no run has yet.
    let first = run_in(&mut server, Value::Null, "true");
    assert_eq!(first["status"], "succeeded", "{first}");
    let network = client.network_inspect(OPEN_NETWORK).expect("the server made its open network");
    assert_eq!(network.options.get(ICC_OPTION).map(String::as_str), Some("false"), "{network:?}");
    let gateway = network.ipam.config.first().map(|config| config.gateway.clone()).expect("a gateway");

    let listener = TcpListener::bind((gateway.as_str(), 0)).expect("listen on the open network's gateway");
    let port = listener.local_addr().expect("port").port();
    let accepted = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        text
    });
    let script = format!("if echo from-open-run | nc -w 2 {gateway} {port}; then echo host=reached; else echo host=refused; fi");
    let out = run_in(&mut server, Value::Null, &script);
    assert_eq!(lines(&out), ["host=reached"], "{out}");
    assert_eq!(accepted.join().expect("listener"), "from-open-run\n");

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
    let started = Instant::now();
    client.container_start(&peer_id).expect("start the peer");
    client.container_wait(&peer_id, docker::WaitCondition::NotRunning, Duration::from_secs(30), None).expect("wait");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let mut logs = client.container_logs(&peer_id, &docker::LogParams { follow: false, idle_timeout: None }).expect("logs");
    let mut peer_said = String::new();
    logs.read_to_string(&mut peer_said).expect("read the peer's log");
    let done = fetch_done(&mut server, &token);
    let job_said = done["result"]["stdout"].as_str().unwrap_or_default().to_string();
    if DOCKERD_IPTABLES {
        assert_eq!(peer_said, "peer=refused\n", "{job_said}");
        assert!(job_said.ends_with("got=\n"), "{job_said}");
    } else {
        // FIXME(issue 16): see DOCKERD_IPTABLES; this is the gap.
        assert_eq!(peer_said, "peer=connected\n", "{job_said}");
        assert!(job_said.ends_with("got=knock\n"), "{job_said}");
    }
}
