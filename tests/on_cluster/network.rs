//! NetworkPolicy on the test cluster: deploy/'s policies, as
//! kube-router enforces them (tests/cluster/up), seen from pods labelled like
//! job pods in each network mode, and the cluster's "never forward off the
//! bridge" guard still holding with kube-router's rules in place.
//!
//! The client pods are bare pods carrying the job labels (managed-by plus
//! `mcp-k8s-ephemeral-job/network`), not runs of the server, so these tests
//! do not depend on the server setting the label. One pod per mode stays up
//! and each case is one `nc -w 2` through `kubectl exec`. Only addresses of
//! the test cluster are used: pods, Services and the node's bridge (the
//! guard test routes a documentation range into an empty bridge, so even
//! a broken guard sends nothing off this machine).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::cluster_in_cluster::{kubectl, run_kubectl};
use crate::support::cluster::{self, BUSYBOX};
use serde_json::{Value, json};

const MODE_LABEL: &str = "mcp-k8s-ephemeral-job/network";
/// The node's address on the pod bridge: the API server's endpoint and the kubelet.
const NODE_IP: &str = "10.244.0.1";
const SERVER_NAMESPACE: &str = "mcp-system";
/// A connection that is refused must be refused within this (nc waits 2 s).
const FAILS_WITHIN: Duration = Duration::from_secs(6);

/// The modes a client pod can be in; `Unlabelled` is a job pod of a server
/// that does not set the label yet, which must behave as `open`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    None,
    Restricted,
    Open,
    Unlabelled,
}

const MODES: [Mode; 4] = [Mode::None, Mode::Restricted, Mode::Open, Mode::Unlabelled];

impl Mode {
    fn label(self) -> Option<&'static str> {
        match self {
            Mode::None => Some("none"),
            Mode::Restricted => Some("restricted"),
            Mode::Open => Some("open"),
            Mode::Unlabelled => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Target {
    /// The HTTP server pod in another namespace, by pod IP.
    WebPod,
    /// Its Service's ClusterIP (port 80 -> 8080).
    WebService,
    /// A listener on port 53 (what DNS would use) in the same pod: not the
    /// cluster's resolver, so DNS rules must not reach it.
    Dns,
    /// A stand-in for the cluster's resolver: a pod labelled as CoreDNS is
    /// (`k8s-app: kube-dns` in kube-system), listening on 53.
    Resolver,
    /// The `kubernetes` Service, 10.96.0.1:443.
    ApiService,
    /// The API server's endpoint on the node, 10.244.0.1:6443.
    ApiEndpoint,
    /// The kubelet on the node, 10.244.0.1:10250.
    Kubelet,
    /// The API server's port at the machine's address off the bridge
    /// (eth0's): it listens on every address, and that one is outside
    /// deploy/'s private ranges (tests/cluster/up excepts it).
    ApiAtHostAddress,
    /// The kubelet at that address.
    KubeletAtHostAddress,
    /// A pod labelled as the server, in the server's namespace.
    ServerPod,
}

/// What each mode may reach: none, restricted, open, unlabelled.
const CASES: &[(Target, [bool; 4])] = &[
    (Target::WebPod, [false, false, true, true]),
    (Target::WebService, [false, false, true, true]),
    (Target::Dns, [false, false, true, true]),
    (Target::Resolver, [false, true, true, true]),
    (Target::ApiService, [false, false, false, false]),
    (Target::ApiEndpoint, [false, false, false, false]),
    (Target::Kubelet, [false, false, false, false]),
    (Target::ApiAtHostAddress, [false, false, false, false]),
    (Target::KubeletAtHostAddress, [false, false, false, false]),
    (Target::ServerPod, [false, false, false, false]),
];

#[test]
fn each_network_mode_reaches_what_it_may_and_nothing_else() {
    let targets = Targets::start();
    let clients: BTreeMap<Mode, TestPod> = MODES.iter().map(|&mode| (mode, TestPod::client(mode, &[]))).collect();
    for client in clients.values() {
        client.wait_running();
    }
    let mut wrong = Vec::new();
    for (target, expected) in CASES {
        let (ip, port) = targets.address(*target);
        for (index, mode) in MODES.iter().enumerate() {
            let attempt = clients[mode].connect(&ip, port);
            if attempt.connected() != expected[index] || (!attempt.connected() && attempt.took > FAILS_WITHIN) {
                wrong.push(format!("{mode:?} -> {target:?} ({ip}:{port}): expected {}, got {attempt:?}", expected[index]));
            }
        }
    }
    assert!(wrong.is_empty(), "{} of {} cases wrong:\n{}", wrong.len(), CASES.len() * MODES.len(), wrong.join("\n"));
}

#[test]
fn nothing_connects_to_a_job_pod() {
    let targets = Targets::start();
    let job = TestPod::in_jobs_namespace("listener", &[(MODE_LABEL, "open")], true, "httpd -f -p 8080 -h /tmp");
    let neighbour = TestPod::in_jobs_namespace("neighbour", &[], false, "sleep 600");
    job.wait_running();
    neighbour.wait_running();
    let job_ip = job.ip();
    // The control: the same clients reach a pod that is not a job's.
    let control = neighbour.connect(&targets.web_ip, 8080);
    assert!(control.connected(), "a plain pod reaches the web pod: {control:?}");
    for (from, client) in [("another namespace", &targets.web), ("the jobs namespace", &neighbour)] {
        let attempt = client.connect(&job_ip, 8080);
        assert!(!attempt.connected() && attempt.took < FAILS_WITHIN, "from {from} to the job pod's port: {attempt:?}");
    }
}

#[test]
fn a_job_pod_never_reaches_the_server_whatever_its_own_policy_allows() {
    let targets = Targets::start();
    let client = TestPod::client(Mode::Open, &[("mcp-test/allow-all", "true")]);
    // A policy that lets this one pod open anything: only the server's own
    // policy stands between it and the server.
    let policy = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": client.name, "namespace": cluster::namespace()},
        "spec": {
            "podSelector": {"matchLabels": {"mcp-test/allow-all": "true", "mcp-test/pod": client.name}},
            "policyTypes": ["Egress"], "egress": [{}],
        },
    });
    kubectl(&["apply", "-f", "-"], Some(&policy.to_string()));
    let _policy = Deleted(vec!["-n".into(), cluster::namespace(), "networkpolicy".into(), client.name.clone()]);
    client.wait_running();
    let web = client.connect(&targets.web_ip, 8080);
    assert!(web.connected(), "the allow-all policy lets it reach the web pod: {web:?}");
    let server = client.connect(&targets.server_ip, 8080);
    assert!(!server.connected() && server.took < FAILS_WITHIN, "job pod -> server pod: {server:?}");
    let from_web = targets.web.connect(&targets.server_ip, 8080);
    assert!(from_web.connected(), "a pod in another namespace reaches the server (its port is open): {from_web:?}");
    let api = targets.server.connect("10.96.0.1", 443);
    assert!(api.connected(), "the server reaches the API server's Service: {api:?}");
}

/// kube-router puts its jumps first in filter FORWARD and accepts allowed
/// pod packets there; the guard lives in mangle FORWARD, which runs
/// before, so an `open` pod's packet for an address off the bridge is
/// still dropped by it. The address is a documentation range routed into
/// an empty bridge for the test.
#[test]
fn the_off_bridge_guard_drops_what_kube_router_allows() {
    let first_mangle = host("iptables", &["-w", "-t", "mangle", "-S", "FORWARD"]);
    assert!(
        first_mangle.lines().nth(1).is_some_and(|rule| rule == "-A FORWARD -j MCP-K8S-TEST-FWD"),
        "the guard is the first rule of mangle FORWARD:\n{first_mangle}"
    );
    let filter = host("iptables", &["-w", "-S", "FORWARD"]);
    assert!(filter.contains("KUBE-ROUTER-FORWARD"), "kube-router's firewall is in filter FORWARD:\n{filter}");

    let trap = TrapRoute::add();
    let client = TestPod::client(Mode::Open, &[]);
    client.wait_running();
    let before = guard_drops();
    let attempt = client.connect(&trap.address, 80);
    let after = guard_drops();
    assert!(!attempt.connected(), "an open pod's connection off the bridge: {attempt:?}");
    assert!(after > before, "the mangle guard dropped it (drops {before} -> {after})");
}

/// The clone flake's cause: a Linux bridge whose MAC is not set takes the
/// lowest MAC of its ports, so a pod that learned the gateway's MAC while
/// it was another pod's veth reached nothing on the node once that pod was
/// gone (SYNs timing out for up to ~50 s, until its ARP entry expired).
/// tests/cluster/up sets the bridge's MAC. Two network namespaces play the
/// pods (addresses from the range lib.sh keeps out of pod IPAM): `gone`
/// has the lowest MAC possible, `stays` learns the gateway's, `gone`
/// leaves, and `stays` must still connect to the node.
#[test]
fn a_pod_reaches_the_node_after_the_pod_with_the_lowest_mac_is_gone() {
    let bridge = "/sys/class/net/mcp-k8s0";
    let assigned = std::fs::read_to_string(format!("{bridge}/addr_assign_type")).expect("the bridge exists");
    assert_eq!(assigned.trim(), "3", "the bridge's MAC was set (NET_ADDR_SET), so it does not follow its ports");
    let listener = std::net::TcpListener::bind((NODE_IP, 0)).expect("a listener on the node's bridge address");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    let mac_before = std::fs::read_to_string(format!("{bridge}/address")).unwrap();
    let gone = BridgeNamespace::add("gone", "00:00:00:00:00:01", "10.244.0.250");
    let stays = BridgeNamespace::add("stays", "fe:00:00:00:00:02", "10.244.0.251");
    assert_eq!(stays.connect(port), "connected", "with both namespaces on the bridge");
    drop(gone);
    assert_eq!(std::fs::read_to_string(format!("{bridge}/address")).unwrap(), mac_before, "the bridge kept its MAC");
    assert_eq!(stays.connect(port), "connected", "after the namespace with the lowest MAC left");
}

/// doctor's policy probe, passing: its job (the runner image, so it needs
/// `tests/build-project-image` from this source) is refused the API server
/// (at once, or once kube-router has seen the pod).
/// The warning case is a unit test of `doctor` (no cluster can be made to
/// stop enforcing for one test).
#[test]
fn doctor_sees_the_policies_enforced() {
    let env = cluster::server_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let output = crate::support::server::command(&env).arg("doctor").output().expect("the binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().find(|line| line.contains("NetworkPolicy")).unwrap_or_else(|| panic!("no NetworkPolicy line:\n{stdout}"));
    // kube-router fences a pod ~0.6 s after its container started; the
    // runner's init container usually covers that, else doctor says so.
    // The servers under test set MCP_K8S_AWAIT_NETWORK_POLICY=1, which
    // covers the late fence.
    let enforced = line.starts_with("ok    NetworkPolicy: a job pod cannot connect to the API server's Service (10.96.0.1:443: ")
        || (line.starts_with("ok    NetworkPolicy: enforced only after a pod has started")
            && line.contains("every command waits for its fence"));
    assert!(enforced, "{stdout}");
}

/// The fence wait's default (`auto`) holds `none` and `restricted`
/// commands until their pod is fenced, so on kube-router, which fences a
/// pod ~0.6 s after it started, their first act, a connection to the API
/// server's Service, is refused. Each mode three times: an unfenced start
/// connects in its first ~0.6 s, so one run in three would show it.
#[test]
fn by_default_none_and_restricted_commands_start_fenced() {
    let mut server = cluster::server(&[("MCP_K8S_AWAIT_NETWORK_POLICY", "auto")]);
    let script = "nc -w 2 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT </dev/null && echo reached || echo refused";
    for network in ["none", "restricted", "none", "restricted", "none", "restricted"] {
        let out = crate::support::faults::ok(
            &mut server,
            "run_job",
            json!({"image": BUSYBOX, "command": ["sh", "-c", script], "network": network}),
        );
        assert_eq!(out["status"], "succeeded", "{network}: {out}");
        assert_eq!(out["stdout"], "refused\n", "{network}: {out}");
    }
}

// ---------------------------------------------------------------------------
// Helpers

/// The outcome of one `nc -w 2` from a pod.
#[derive(Debug)]
struct Attempt {
    took: Duration,
    /// What the pod printed (`CONNECTED`, or `FAILED` and nc's error).
    output: String,
}

/// A pod of the test, deleted on drop.
struct TestPod {
    namespace: String,
    name: String,
}

impl Attempt {
    fn connected(&self) -> bool {
        self.output.ends_with("CONNECTED")
    }
}

impl TestPod {
    /// A pod labelled like a job pod in `mode`, waiting to be told what to connect to.
    fn client(mode: Mode, extra: &[(&str, &str)]) -> TestPod {
        let mut labels: Vec<(&str, &str)> = mode.label().map(|label| (MODE_LABEL, label)).into_iter().collect();
        labels.extend_from_slice(extra);
        TestPod::in_jobs_namespace(&format!("client-{mode:?}").to_lowercase(), &labels, true, "sleep 600")
    }

    /// A restricted-PSS pod in the jobs namespace; `job`: with the managed-by label.
    fn in_jobs_namespace(prefix: &str, labels: &[(&str, &str)], job: bool, script: &str) -> TestPod {
        let mut all: Vec<(&str, &str)> = labels.to_vec();
        if job {
            all.push(("app.kubernetes.io/managed-by", "mcp-k8s-ephemeral-job"));
        }
        TestPod::create(&cluster::namespace(), prefix, &all, cluster::restricted_pod_spec(BUSYBOX, script))
    }

    fn create(namespace: &str, prefix: &str, labels: &[(&str, &str)], spec: Value) -> TestPod {
        let name = cluster::unique_name(&format!("net-{prefix}"));
        let mut label_map: serde_json::Map<String, Value> = labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        label_map.insert("mcp-test/pod".into(), json!(name));
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": label_map},
            "spec": spec,
        });
        kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
        TestPod { namespace: namespace.to_string(), name }
    }

    fn wait_running(&self) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let phase = run_kubectl(&["-n", &self.namespace, "get", "pod", &self.name, "-o", "jsonpath={.status.phase}"], None);
            if phase.as_deref() == Ok("Running") {
                return;
            }
            assert!(Instant::now() < deadline, "pod {}/{} not running: {phase:?}", self.namespace, self.name);
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn ip(&self) -> String {
        kubectl(&["-n", &self.namespace, "get", "pod", &self.name, "-o", "jsonpath={.status.podIP}"], None)
    }

    /// `nc -w 2` from this pod: connected or not, and how long it took.
    fn connect(&self, ip: &str, port: u16) -> Attempt {
        // Nothing written to files: the root file system is read-only.
        let script =
            format!("if err=$(nc -w 2 {ip} {port} </dev/null 2>&1 >/dev/null); then echo CONNECTED; else echo \"FAILED: $err\"; fi");
        let started = Instant::now();
        let output = run_kubectl(&["-n", &self.namespace, "exec", &self.name, "--", "sh", "-c", &script], None)
            .unwrap_or_else(|error| format!("FAILED (kubectl exec: {error})"));
        let output = output.trim().to_string();
        Attempt { took: started.elapsed(), output }
    }
}

impl Drop for TestPod {
    fn drop(&mut self) {
        let _ = run_kubectl(&["-n", &self.namespace, "delete", "pod", &self.name, "--wait=false", "--grace-period=0"], None);
    }
}

/// `kubectl delete <args>` on drop.
struct Deleted(Vec<String>);

impl Drop for Deleted {
    fn drop(&mut self) {
        let mut args: Vec<&str> = vec!["delete", "--wait=false"];
        args.extend(self.0.iter().map(String::as_str));
        let _ = run_kubectl(&args, None);
    }
}

/// What the clients connect to: an HTTP server pod (8080, and 53 as any
/// address's DNS port) with a Service in a namespace of its own, a pod
/// labelled as the cluster's resolver in kube-system (53), and a pod
/// labelled as the server in the server's namespace (HTTP on 8080).
struct Targets {
    web: TestPod,
    web_ip: String,
    resolver_ip: String,
    _resolver: TestPod,
    web_service_ip: String,
    server: TestPod,
    server_ip: String,
    _namespace: Deleted,
}

impl Targets {
    fn start() -> Targets {
        let namespace = cluster::unique_name("net-targets");
        kubectl(&["create", "namespace", &namespace], None);
        let namespace_guard = Deleted(vec!["namespace".into(), namespace.clone()]);
        // Root in its own (unrestricted) namespace: port 53 is privileged.
        let web_spec = json!({
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "httpd -p 8080 -h /tmp && httpd -p 53 -h /tmp && exec sleep 600"],
                "resources": {"limits": {"cpu": "100m", "memory": "32Mi"}},
            }],
        });
        let web = TestPod::create(&namespace, "web", &[("app", "net-web")], web_spec.clone());
        let mut resolver_spec = web_spec;
        resolver_spec["containers"][0]["command"] = json!(["sh", "-c", "httpd -p 53 -h /tmp && exec sleep 600"]);
        let resolver = TestPod::create("kube-system", "resolver", &[("k8s-app", "kube-dns")], resolver_spec);
        let service = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {"selector": {"mcp-test/pod": web.name}, "ports": [{"port": 80, "targetPort": 8080}]},
        });
        kubectl(&["apply", "-f", "-"], Some(&service.to_string()));
        let server_labels = [("app.kubernetes.io/name", "mcp-k8s-ephemeral-job"), ("app.kubernetes.io/component", "server")];
        let server =
            TestPod::create(SERVER_NAMESPACE, "server", &server_labels, cluster::restricted_pod_spec(BUSYBOX, "httpd -f -p 8080 -h /tmp"));
        web.wait_running();
        resolver.wait_running();
        server.wait_running();
        let resolver_ip = resolver.ip();
        let web_service_ip = kubectl(&["-n", &namespace, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"], None);
        let (web_ip, server_ip) = (web.ip(), server.ip());
        Targets { web, web_ip, resolver_ip, _resolver: resolver, web_service_ip, server, server_ip, _namespace: namespace_guard }
    }

    fn address(&self, target: Target) -> (String, u16) {
        match target {
            Target::WebPod => (self.web_ip.clone(), 8080),
            Target::WebService => (self.web_service_ip.clone(), 80),
            Target::Dns => (self.web_ip.clone(), 53),
            Target::Resolver => (self.resolver_ip.clone(), 53),
            Target::ApiService => (cluster::env_value("KUBERNETES_SERVICE_IP").unwrap_or_else(|| "10.96.0.1".into()), 443),
            Target::ApiEndpoint => (NODE_IP.into(), 6443),
            Target::Kubelet => (NODE_IP.into(), 10250),
            Target::ApiAtHostAddress => (host_address(), 6443),
            Target::KubeletAtHostAddress => (host_address(), 10250),
            Target::ServerPod => (self.server_ip.clone(), 8080),
        }
    }
}

/// This machine's first IPv4 address off the pod bridge (eth0's).
fn host_address() -> String {
    let listing = host("ip", &["-4", "-o", "addr", "show", "scope", "global"]);
    listing
        .lines()
        .filter(|line| line.split_whitespace().nth(1).is_some_and(|link| link != "mcp-k8s0" && !link.starts_with("mcp")))
        .find_map(|line| line.split_whitespace().nth(3)?.split('/').next().map(str::to_string))
        .unwrap_or_else(|| panic!("this machine has no IPv4 address off the pod bridge to try:\n{listing}"))
}

/// A command on the host (the tests run as root, like the cluster).
fn host(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(output.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Packets the guard's `-i <bridge> -j DROP` rule has dropped.
fn guard_drops() -> u64 {
    let listing = host("iptables", &["-w", "-t", "mangle", "-L", "MCP-K8S-TEST-FWD", "-v", "-x", "-n"]);
    listing
        .lines()
        .filter(|line| line.split_whitespace().nth(2) == Some("DROP") && line.contains("mcp-k8s0"))
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// A documentation range (198.51.100.0/24) routed into an empty bridge of
/// its own while the test runs (this kernel has no dummy links), so what
/// passes the guard is dropped there; removed on drop.
struct TrapRoute {
    link: String,
    address: String,
}

impl TrapRoute {
    fn add() -> TrapRoute {
        let link = format!("mcpguard{}", std::process::id() % 100_000);
        host("ip", &["link", "add", &link, "type", "bridge"]);
        let route = TrapRoute { link, address: "198.51.100.7".into() };
        host("ip", &["link", "set", &route.link, "up"]);
        host("ip", &["route", "add", "198.51.100.0/24", "dev", &route.link]);
        route
    }
}

/// A network namespace on the pod bridge with one veth (host end `mac`),
/// address `ip`/24 and the node as its gateway; removed on drop.
struct BridgeNamespace {
    name: String,
    link: String,
}

impl BridgeNamespace {
    fn add(role: &str, mac: &str, ip: &str) -> BridgeNamespace {
        let id = std::process::id() % 100_000;
        let namespace = BridgeNamespace { name: format!("mcp-test-{role}-{id}"), link: format!("mcp{}{id}", &role[..1]) };
        host("ip", &["netns", "add", &namespace.name]);
        host("ip", &["link", "add", &namespace.link, "type", "veth", "peer", "name", "eth0", "netns", &namespace.name]);
        host("ip", &["link", "set", &namespace.link, "address", mac]);
        host("ip", &["link", "set", &namespace.link, "master", "mcp-k8s0", "up"]);
        let inside = |args: &[&str]| host("ip", &[&["-n", namespace.name.as_str()], args].concat());
        inside(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        inside(&["link", "set", "eth0", "up"]);
        inside(&["route", "add", "default", "via", NODE_IP]);
        namespace
    }

    /// `connected`, or why not, for one TCP connection to the node (3 s).
    fn connect(&self, port: u16) -> String {
        let script = format!(
            "import socket\ntry:\n socket.create_connection(('{NODE_IP}', {port}), 3).close(); print('connected')\nexcept OSError as e:\n print(e)"
        );
        host("ip", &["netns", "exec", &self.name, "python3", "-c", &script]).trim().to_string()
    }
}

impl Drop for BridgeNamespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.link]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

impl Drop for TrapRoute {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.link]).output();
    }
}
