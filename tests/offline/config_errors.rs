//! Every setting, given a bad value, stops the built binary at start with
//! exit code 2 and a message naming the variable ("a wrong setting
//! must stop the server at start with a clear message, not fail the
//! hundredth call"). The unit tests in `config` check the wording; this
//! checks the process really stops, for every variable of the table.

use std::process::Stdio;

use mcp_k8s_ephemeral_job::config::SETTINGS;

/// (variable, bad value, part of the message). Some variables need a
/// partner to reach their own check (both-or-neither pairs).
const CASES: &[(&str, &str, &str)] = &[
    ("MCP_K8S_TRANSPORT", "grpc", "MCP_K8S_TRANSPORT: `grpc` is not accepted"),
    ("MCP_K8S_ADDR", "8080", "MCP_K8S_ADDR: `8080` is not accepted"),
    ("MCP_K8S_AUTH_TOKENS_FILE", "/nonexistent/tokens.json", "MCP_K8S_AUTH_TOKENS_FILE cannot be used with MCP_K8S_TRANSPORT"),
    ("MCP_K8S_SITES", "/nonexistent/sites.json", "MCP_K8S_SITES: cannot read `/nonexistent/sites.json`"),
    ("MCP_K8S_NAMESPACE", "Prod", "MCP_K8S_NAMESPACE: `Prod` is not accepted"),
    ("MCP_K8S_KUBECONFIG", "/nonexistent/kubeconfig", "MCP_K8S_KUBECONFIG: "),
    ("MCP_K8S_DEFAULT_TIMEOUT_S", "700", "MCP_K8S_DEFAULT_TIMEOUT_S: `700` is above MCP_K8S_MAX_TIMEOUT_S (600)"),
    ("MCP_K8S_MAX_TIMEOUT_S", "30", "MCP_K8S_DEFAULT_TIMEOUT_S: `60` is above MCP_K8S_MAX_TIMEOUT_S (30)"),
    ("MCP_K8S_MAX_TIMEOUT_S", "ten", "MCP_K8S_MAX_TIMEOUT_S: `ten` is not accepted"),
    ("MCP_K8S_MAX_OUTPUT_BYTES", "12", "MCP_K8S_MAX_OUTPUT_BYTES: `12` is out of range"),
    ("MCP_K8S_MAX_ARTIFACT_BYTES", "-1", "MCP_K8S_MAX_ARTIFACT_BYTES: `-1` is not accepted"),
    ("MCP_K8S_DEFAULT_CPU", "one", "MCP_K8S_DEFAULT_CPU: `one` is not accepted; expected a Kubernetes quantity"),
    ("MCP_K8S_DEFAULT_MEMORY", "512MB", "MCP_K8S_DEFAULT_MEMORY: `512MB` is not accepted"),
    ("MCP_K8S_MAX_CONCURRENT", "0", "MCP_K8S_MAX_CONCURRENT: `0` is out of range"),
    ("MCP_K8S_MAX_SANDBOXES", "1001", "MCP_K8S_MAX_SANDBOXES: `1001` is out of range"),
    ("MCP_K8S_SANDBOX_MAX_LIFETIME_S", "59", "MCP_K8S_SANDBOX_MAX_LIFETIME_S: `59` is out of range"),
    ("MCP_K8S_ALLOWED_IMAGES", "python:3,bad image", "MCP_K8S_ALLOWED_IMAGES: `bad image` is not accepted"),
    ("MCP_K8S_SIDECAR_IMAGE", "busy box", "MCP_K8S_SIDECAR_IMAGE: `busy box` is not accepted"),
    ("MCP_K8S_CLONE_IMAGE", "alpine/git", "MCP_K8S_CLONE_IMAGE is set but MCP_K8S_CLONE_SECRET is not"),
    ("MCP_K8S_CLONE_SECRET", "git-tokens", "MCP_K8S_CLONE_SECRET is set but MCP_K8S_CLONE_IMAGE is not"),
    ("MCP_K8S_CACHE_PVC", "cache", "MCP_K8S_CACHE_PVC is set but MCP_K8S_CACHE_MOUNT_PATH is not"),
    ("MCP_K8S_CACHE_MOUNT_PATH", "/cache", "MCP_K8S_CACHE_MOUNT_PATH is set but MCP_K8S_CACHE_PVC is not"),
    ("MCP_K8S_JOB_EXTRA_ENV", "{not json", "MCP_K8S_JOB_EXTRA_ENV: `<JSON not shown>` is not accepted; expected a JSON object"),
    ("MCP_K8S_RUNNER_IMAGE", "a b", "MCP_K8S_RUNNER_IMAGE: `a b` is not accepted"),
    ("MCP_K8S_RUNNER_BINARY_PATH", "bin/x", "MCP_K8S_RUNNER_BINARY_PATH: `bin/x` is not accepted"),
    ("MCP_K8S_RUN_AS_USER", "0", "MCP_K8S_RUN_AS_USER: `0` is out of range"),
    ("MCP_K8S_START_TIMEOUT_S", "1", "MCP_K8S_START_TIMEOUT_S: `1` is out of range"),
    ("MCP_K8S_NETWORK_POLICY_WAIT_S", "0", "MCP_K8S_NETWORK_POLICY_WAIT_S: `0` is out of range"),
    ("MCP_K8S_MAX_QUEUED", "many", "MCP_K8S_MAX_QUEUED: `many` is not accepted"),
    ("MCP_K8S_RESULT_TTL_S", "5", "MCP_K8S_RESULT_TTL_S: `5` is out of range"),
    ("MCP_K8S_WORKDIR_SIZE", "0", "MCP_K8S_WORKDIR_SIZE: `0` is not accepted"),
    ("MCP_K8S_WORKDIR_SIZE", "1000", "MCP_K8S_WORKDIR_SIZE: `1000` is not accepted; expected a size from 1Mi to 1Ti"),
    ("MCP_K8S_RUNTIME_CLASS", "gVisor", "MCP_K8S_RUNTIME_CLASS: `gVisor` is not accepted"),
    ("MCP_K8S_POD_TEMPLATE", "/nonexistent/pod-template.yaml", "MCP_K8S_POD_TEMPLATE: cannot read `/nonexistent/pod-template.yaml`"),
    ("MCP_K8S_MAX_MESSAGE_BYTES", "100", "MCP_K8S_MAX_MESSAGE_BYTES: `100` is out of range"),
    ("MCP_K8S_MAX_INFLIGHT_BYTES", "0", "MCP_K8S_MAX_INFLIGHT_BYTES: `0` is out of range"),
    ("MCP_K8S_MAX_REPLY_QUEUE_BYTES", "1k", "MCP_K8S_MAX_REPLY_QUEUE_BYTES: `1k` is not accepted"),
    ("MCP_K8S_SESSION_TTL_S", "0", "MCP_K8S_SESSION_TTL_S: `0` is out of range"),
    ("MCP_K8S_MAX_SESSIONS", "0", "MCP_K8S_MAX_SESSIONS: `0` is out of range"),
    ("MCP_K8S_MAX_CONNECTIONS", "lots", "MCP_K8S_MAX_CONNECTIONS: `lots` is not accepted"),
    ("MCP_K8S_PROBE_ADDR", "8081", "MCP_K8S_PROBE_ADDR: `8081` is not accepted; expected host:port"),
    ("MCP_K8S_MAX_HEADER_BYTES", "100", "MCP_K8S_MAX_HEADER_BYTES: `100` is out of range"),
    ("MCP_K8S_MAX_HEADERS", "1", "MCP_K8S_MAX_HEADERS: `1` is out of range"),
    ("MCP_K8S_BODY_BUDGET_BYTES", "1", "MCP_K8S_BODY_BUDGET_BYTES: `1` is out of range"),
    ("MCP_K8S_MAX_REPLY_QUEUE_BYTES", "10", "MCP_K8S_MAX_REPLY_QUEUE_BYTES: `10` is out of range"),
    ("MCP_K8S_HEAD_TIMEOUT_S", "0", "MCP_K8S_HEAD_TIMEOUT_S: `0` is out of range"),
    ("MCP_K8S_BODY_TIMEOUT_S", "soon", "MCP_K8S_BODY_TIMEOUT_S: `soon` is not accepted"),
    ("MCP_K8S_IDLE_TIMEOUT_S", "4000", "MCP_K8S_IDLE_TIMEOUT_S: `4000` is out of range"),
    ("MCP_K8S_WRITE_TIMEOUT_S", "-1", "MCP_K8S_WRITE_TIMEOUT_S: `-1` is not accepted"),
    ("MCP_K8S_ALLOWED_ORIGINS", "example.com", "MCP_K8S_ALLOWED_ORIGINS: `example.com` is not accepted"),
    ("MCP_K8S_SHUTDOWN_GRACE_S", "soon", "MCP_K8S_SHUTDOWN_GRACE_S: `soon` is not accepted"),
    ("MCP_K8S_LANGUAGES", "/nonexistent/languages.json", "MCP_K8S_LANGUAGES: cannot read `/nonexistent/languages.json`"),
    ("MCP_K8S_WARM_POOLS", "/nonexistent/pools.json", "MCP_K8S_WARM_POOLS: cannot read `/nonexistent/pools.json`"),
    (
        "MCP_K8S_SNIPPETS_DIR",
        "/nonexistent/snippets",
        "MCP_K8S_SNIPPETS_DIR: `/nonexistent/snippets` is not accepted; expected an existing folder",
    ),
    ("MCP_K8S_OUTPUTS_DIR", "outputs", "MCP_K8S_OUTPUTS_DIR: `outputs` is not accepted; expected an absolute path"),
    ("MCP_K8S_OUTPUTS_DIR", "/proc/outputs", "MCP_K8S_OUTPUTS_DIR `/proc/outputs` cannot be used"),
    ("MCP_K8S_OUTPUTS_MAX_RUN_BYTES", "1000", "MCP_K8S_OUTPUTS_MAX_RUN_BYTES: `1000` is out of range"),
    ("MCP_K8S_OUTPUTS_MAX_BYTES", "ten", "MCP_K8S_OUTPUTS_MAX_BYTES: `ten` is not accepted"),
    (
        "MCP_K8S_OTLP_ENDPOINT",
        "collector:4318",
        "MCP_K8S_OTLP_ENDPOINT: `collector:4318` is not accepted; expected an OTLP/HTTP URL such as http://collector:4318 (it is not a URL",
    ),
    ("MCP_K8S_OTLP_ENDPOINT", "grpc://collector:4317", "has scheme `grpc`; OTLP/HTTP takes http or https"),
    ("MCP_K8S_OTLP_ENDPOINT", "http://127.0.0.1:99999", "has port `99999`; a port is a whole number from 1 to 65535"),
    ("MCP_K8S_AUDIT_LOG", "audit.log", "MCP_K8S_AUDIT_LOG: `audit.log` is not accepted; expected stderr, or the absolute path"),
    ("MCP_K8S_AUDIT_LOG", "/nonexistent/audit.log", "MCP_K8S_AUDIT_LOG: cannot open /nonexistent/audit.log for appending"),
    ("MCP_K8S_LOG_LEVEL", "verbose", "MCP_K8S_LOG_LEVEL: `verbose` is not accepted"),
    ("MCP_K8S_LAZY_BACKEND", "yes", "MCP_K8S_LAZY_BACKEND: `yes` is not accepted; expected 1 or 0"),
    ("MCP_K8S_TEST_TOOLS", "yes", "MCP_K8S_TEST_TOOLS: `yes` is not accepted"),
    ("MCP_K8S_TEST_TOOLS", "true", "MCP_K8S_TEST_TOOLS: `true` is not accepted; expected 1 or 0"),
    ("MCP_K8S_CONFORMANCE_FIXTURES", "1", "MCP_K8S_CONFORMANCE_FIXTURES cannot be used with MCP_K8S_TEST_TOOLS unset"),
    ("MCP_K8S_TEST_PANIC_THREAD", "main", "MCP_K8S_TEST_PANIC_THREAD: `main` is not accepted; expected one of reaper, pool, "),
    ("MCP_K8S_AWAIT_NETWORK_POLICY", "on", "MCP_K8S_AWAIT_NETWORK_POLICY: `on` is not accepted"),
    ("MCP_K8S_BACKEND", "podman", "MCP_K8S_BACKEND: `podman` is not accepted"),
    ("MCP_K8S_DOCKER_HOST", "tcp://127.0.0.1:2375", "MCP_K8S_DOCKER_HOST: `tcp://127.0.0.1:2375` is not accepted"),
    ("MCP_K8S_DOCKER_NETWORK", "my net", "MCP_K8S_DOCKER_NETWORK: `my net` is not accepted"),
    ("MCP_K8S_DOCKER_PULL", "always", "MCP_K8S_DOCKER_PULL: `always` is not accepted"),
    (
        "MCP_K8S_NETWORK_MODES",
        "bridge",
        "MCP_K8S_NETWORK_MODES: `bridge` is not accepted; expected a comma-separated list of none, restricted, open",
    ),
    ("MCP_K8S_NETWORK_DEFAULT", "host", "MCP_K8S_NETWORK_DEFAULT: `host` is not accepted; expected one of none, restricted, open"),
    ("MCP_K8S_RUNNER_BINARY", "bin/x", "MCP_K8S_RUNNER_BINARY: `bin/x` is not accepted"),
];

/// Settings that take any value: there is nothing wrong to give them.
/// (A wrong context is found when the kubeconfig is read, at start.)
const ANY_VALUE: &[&str] = &["MCP_K8S_AUTH_TOKEN", "MCP_K8S_KUBE_CONTEXT"];

#[test]
fn every_bad_setting_stops_the_server_naming_the_variable() {
    for (variable, value, expected) in CASES {
        let output = crate::support::server::command(&[(variable, value)]).arg("serve").stdin(Stdio::null()).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{variable}={value}: {stderr}");
        assert!(stderr.contains(expected), "{variable}={value}\n got: {stderr}\nwant: {expected}");
        assert!(output.stdout.is_empty(), "stdout belongs to the protocol");
    }
}

#[test]
fn the_table_covers_every_setting() {
    let missing: Vec<&str> = SETTINGS
        .iter()
        .map(|setting| setting.env)
        .filter(|env| !ANY_VALUE.contains(env) && !CASES.iter().any(|(variable, _, _)| variable == env))
        .collect();
    assert!(missing.is_empty(), "settings without a bad-value case: {missing:?}");
}

/// On Docker `restricted` is the network MCP_K8S_DOCKER_NETWORK
/// names, so a default of `restricted` without it stops the start (with
/// MCP_K8S_BACKEND=docker the backend is known before any connection).
#[test]
fn a_restricted_default_on_docker_needs_the_restricted_network() {
    let settings = [("MCP_K8S_BACKEND", "docker"), ("MCP_K8S_NETWORK_DEFAULT", "restricted")];
    let output = crate::support::server::command(&settings).arg("serve").stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("MCP_K8S_NETWORK_DEFAULT: `restricted`") && stderr.contains("MCP_K8S_DOCKER_NETWORK"), "{stderr}");
    let not_allowed = [("MCP_K8S_NETWORK_MODES", "none"), ("MCP_K8S_NETWORK_DEFAULT", "open")];
    let output = crate::support::server::command(&not_allowed).arg("serve").stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("MCP_K8S_NETWORK_DEFAULT: `open` is not accepted; expected one of MCP_K8S_NETWORK_MODES (none)"), "{stderr}");
}

#[test]
fn the_sidecar_image_is_accepted_and_said_to_be_unused() {
    let output =
        crate::support::server::command(&[("MCP_K8S_SIDECAR_IMAGE", "busybox:1.36")]).arg("serve").stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("MCP_K8S_SIDECAR_IMAGE is set but unused"), "{stderr}");
}

/// A kubeconfig with one wrong field is said once, without the
/// "set MCP_K8S_KUBECONFIG..." hint that only fits when nothing was found.
#[test]
fn a_wrong_kubeconfig_field_is_said_once_without_the_where_to_look_hint() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/kubeconfig/errors/no-server.yaml");
    let output = crate::support::server::command(&[("MCP_K8S_KUBECONFIG", path)]).arg("serve").stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("MCP_K8S_KUBECONFIG: invalid configuration: cluster has no server defined: cluster `test`"), "{stderr}");
    assert_eq!(stderr.matches("cluster has no server defined").count(), 1, "said once: {stderr}");
    assert!(!stderr.contains("set MCP_K8S_KUBECONFIG"), "a source was found: {stderr}");
}

#[test]
fn no_credentials_at_all_are_said_once_with_where_to_look() {
    let env = [("HOME", "/nonexistent-home"), ("MCP_K8S_LAZY_BACKEND", "0")];
    let output = crate::support::server::command(&env).arg("serve").stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "no backend: the server does not start: {stderr}");
    assert_eq!(stderr.matches("no configuration has been provided").count(), 1, "said once: {stderr}");
    assert!(
        stderr.contains("no kubeconfig found at `/nonexistent-home/.kube/config` (not found); set MCP_K8S_KUBECONFIG or KUBECONFIG, or run in a pod with a ServiceAccount"),
        "{stderr}"
    );
}

/// The rule in docs/credentials.md: Jobs go to MCP_K8S_NAMESPACE (default
/// `mcp-ephemeral`); the context's namespace is logged as ignored.
#[test]
fn the_context_namespace_is_logged_as_ignored() {
    let dir = std::env::temp_dir().join(format!("mcp-config-namespace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kubeconfig");
    let kubeconfig = "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n    namespace: team-a\nusers:\n- name: u\n  user:\n    token: t\n";
    std::fs::write(&path, kubeconfig).unwrap();
    let path_text = path.display().to_string();
    // (environment, namespace used, namespace said to be ignored)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, Option<&'a str>);
    let cases: &[Case] = &[
        (&[("MCP_K8S_KUBECONFIG", &path_text)], "mcp-ephemeral", Some("team-a")),
        (&[("MCP_K8S_KUBECONFIG", &path_text), ("MCP_K8S_NAMESPACE", "team-b")], "team-b", Some("team-a")),
        (&[("MCP_K8S_KUBECONFIG", &path_text), ("MCP_K8S_NAMESPACE", "team-a")], "team-a", None),
    ];
    for (env, namespace, ignored) in cases {
        let output = crate::support::server::command(env).arg("serve").stdin(Stdio::null()).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        let credentials = stderr.lines().find(|line| line.contains("\"kubernetes credentials\"")).unwrap_or_else(|| panic!("{stderr}"));
        assert!(credentials.contains(&format!("\"namespace\":\"{namespace}\"")), "{credentials}");
        assert!(credentials.contains("context namespace `team-a`"), "{credentials}");
        let ignored_line = stderr.lines().find(|line| line.contains("namespace is ignored"));
        match ignored {
            Some(ignored) => {
                let line = ignored_line.unwrap_or_else(|| panic!("{stderr}"));
                assert!(line.contains(&format!("\"ignored_namespace\":\"{ignored}\"")), "{line}");
                assert!(line.contains(&format!("\"namespace\":\"{namespace}\"")), "{line}");
            }
            None => assert!(ignored_line.is_none(), "{stderr}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A dynamically linked runner binary (the usual `cargo build`) cannot
/// start inside a sandbox image, where every run would end "without the
/// runner's result": the Docker backend stops the start (exit 2), before
/// any daemon is asked and even with MCP_K8S_LAZY_BACKEND=1 (no waiting
/// fixes a setting), naming the setting and the static build. Regression:
/// the refusal had become a log line, and the server served with no
/// backend. Debian's /bin/true is dynamically linked.
#[test]
fn a_dynamically_linked_runner_binary_stops_the_start_on_docker() {
    for lazy in ["0", "1"] {
        let settings = [
            ("MCP_K8S_BACKEND", "docker"),
            ("MCP_K8S_DOCKER_HOST", "unix:///nonexistent/docker.sock"),
            ("MCP_K8S_RUNNER_BINARY", "/bin/true"),
            ("MCP_K8S_ALLOWED_IMAGES", "busybox:1.36"),
            ("MCP_K8S_LAZY_BACKEND", lazy),
        ];
        let Some((code, stderr)) = stops_within(&settings, std::time::Duration::from_secs(30)) else {
            panic!("lazy {lazy}: the server served with a dynamically linked runner binary");
        };
        assert_eq!(code, Some(2), "lazy {lazy}: {stderr}");
        assert!(stderr.contains("mcp-k8s-ephemeral-job: MCP_K8S_RUNNER_BINARY: `/bin/true` is dynamically linked"), "{stderr}");
        assert!(stderr.contains("cargo build --release --target x86_64-unknown-linux-musl"), "{stderr}");
    }
}

/// The server's exit code and stderr when it stops within `bound`; `None`
/// (after killing it) when it is still going: a start that hangs.
fn stops_within(env: &[(&str, &str)], bound: std::time::Duration) -> Option<(Option<i32>, String)> {
    use std::io::Read as _;
    let mut child = crate::support::server::command(env)
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    // The pipe closes when the server exits: that is the signal waited on.
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        let _ = sender.send(text);
    });
    match receiver.recv_timeout(bound) {
        Ok(text) => Some((child.wait().unwrap().code(), text)),
        Err(_) => {
            crate::support::server::send_signal(&child, libc::SIGKILL);
            let _ = child.wait();
            None
        }
    }
}

fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-config-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Regression: a settings file naming a FIFO nobody writes to (or, for
/// the audit trail, reads from) held the start in `open` for good: no
/// listener and no message.
#[test]
fn a_fifo_as_a_settings_file_stops_the_start_naming_the_variable() {
    let dir = scratch_dir("fifo");
    let fifo = dir.join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let fifo = fifo.display().to_string();
    let not_a_file = "is a FIFO, not a regular file";
    let cases: &[(&[(&str, &str)], String)] = &[
        (
            &[("MCP_K8S_AUTH_TOKENS_FILE", &fifo), ("MCP_K8S_TRANSPORT", "http")],
            format!("MCP_K8S_AUTH_TOKENS_FILE: cannot read `{fifo}`: {not_a_file}; name a file"),
        ),
        (&[("MCP_K8S_SITES", &fifo)], format!("MCP_K8S_SITES: cannot read `{fifo}`: {not_a_file}; name a file")),
        (&[("MCP_K8S_LANGUAGES", &fifo)], format!("MCP_K8S_LANGUAGES: cannot read `{fifo}`: {not_a_file}; name a file")),
        (&[("MCP_K8S_WARM_POOLS", &fifo)], format!("MCP_K8S_WARM_POOLS: cannot read `{fifo}`: {not_a_file}; name a file")),
        (&[("MCP_K8S_POD_TEMPLATE", &fifo)], format!("MCP_K8S_POD_TEMPLATE: cannot read `{fifo}`: {not_a_file}; name a file")),
        (&[("MCP_K8S_KUBECONFIG", &fifo)], format!("cannot read kubeconfig `{fifo}`: {not_a_file}; name a file")),
        (&[("MCP_K8S_AUDIT_LOG", &fifo)], format!("MCP_K8S_AUDIT_LOG: `{fifo}` {not_a_file}; name a regular file")),
    ];
    for (env, want) in cases {
        let Some((code, stderr)) = stops_within(env, std::time::Duration::from_secs(30)) else {
            panic!("{env:?}: the start hung");
        };
        assert_eq!(code, Some(2), "{env:?}: {stderr}");
        assert!(stderr.contains(want.as_str()), "{env:?}\n got: {stderr}\nwant: {want}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The audit trail's lines hold run ids, which are capabilities: they go
/// to the file named, readable by its owner only. Regression: a symlink
/// was followed (a dangling one made its target), and an existing file
/// kept its mode.
#[test]
fn the_audit_log_is_the_file_named_and_only_its_owner_reads_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch_dir("audit");
    let target = dir.join("target.log");
    std::fs::write(&target, "kept\n").unwrap();
    let link = dir.join("link.log");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let dangling_target = dir.join("made-by-the-link.log");
    let dangling = dir.join("dangling.log");
    std::os::unix::fs::symlink(&dangling_target, &dangling).unwrap();
    for path in [&link, &dangling] {
        let path_text = path.display().to_string();
        let (code, stderr) = stops_within(&[("MCP_K8S_AUDIT_LOG", &path_text)], std::time::Duration::from_secs(30)).expect("stops");
        assert_eq!(code, Some(2), "{stderr}");
        let want = format!("MCP_K8S_AUDIT_LOG: `{path_text}` is a symlink, not a regular file; name a regular file");
        assert!(stderr.contains(&want), "\n got: {stderr}\nwant: {want}");
    }
    assert!(!dangling_target.exists(), "a dangling link made its target");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "kept\n");

    let existing = dir.join("audit.log");
    std::fs::write(&existing, "").unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o644)).unwrap();
    let existing_text = existing.display().to_string();
    let (code, stderr) = stops_within(&[("MCP_K8S_AUDIT_LOG", &existing_text)], std::time::Duration::from_secs(30)).expect("stops");
    assert_eq!(code, Some(0), "starts, and stops at the end of stdin: {stderr}");
    assert_eq!(std::fs::metadata(&existing).unwrap().permissions().mode() & 0o777, 0o600);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: a site's kubeconfig that does not load was said as
/// "site `eu`: MCP_K8S_KUBECONFIG: ...", naming neither MCP_K8S_SITES nor
/// its file, where the fix is.
#[test]
fn a_sites_kubeconfig_error_names_the_sites_file_and_the_site() {
    let dir = scratch_dir("site-kubeconfig");
    let sites = dir.join("sites.json");
    std::fs::write(&sites, r#"[{"name": "eu", "backend": "kubernetes", "kubeconfig": "/nonexistent/eu.yaml"}]"#).unwrap();
    let sites_text = sites.display().to_string();
    let (code, stderr) = stops_within(&[("MCP_K8S_SITES", &sites_text)], std::time::Duration::from_secs(30)).expect("stops");
    assert_eq!(code, Some(2), "{stderr}");
    let want = format!(
        "MCP_K8S_SITES: `{sites_text}`: site `eu`: its kubeconfig (field `kubeconfig`, else MCP_K8S_KUBECONFIG): invalid configuration: cannot read kubeconfig `/nonexistent/eu.yaml`"
    );
    assert!(stderr.contains(&want), "\n got: {stderr}\nwant: {want}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A misspelt setting is said at start, with the setting it may mean, so
/// a value that has no effect does not go unseen.
#[test]
fn a_misspelt_setting_is_warned_about_naming_the_nearest_one() {
    let output =
        crate::support::server::command(&[("MCP_K8S_ALLOWED_IMAGE", "busybox:1.36")]).arg("serve").stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let warning = stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line["variable"] == "MCP_K8S_ALLOWED_IMAGE")
        .unwrap_or_else(|| panic!("no warning naming the variable: {stderr}"));
    assert_eq!(warning["level"], "warning", "{warning}");
    assert_eq!(warning["did_you_mean"], "MCP_K8S_ALLOWED_IMAGES", "{warning}");
}
