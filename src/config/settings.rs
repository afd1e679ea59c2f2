//! The settings table: every `MCP_K8S_*` variable the server reads, with its
//! flag, its default (written here once) and its help line, and `RawConfig`,
//! the unchecked text the environment and the command line gave. The table
//! drives reading the environment, the flags and `--help`; `Config::from_raw`
//! (in `mod.rs`) checks the text. Nothing here parses a value.

/// The runner image when MCP_K8S_RUNNER_IMAGE is unset: this release's
/// image under its plain name, which operators mirror and usually override.
pub const DEFAULT_RUNNER_IMAGE: &str = concat!("mcp-k8s-ephemeral-job:", env!("CARGO_PKG_VERSION"));

/// One setting: its environment variable, its flag (if it may be given on
/// the command line), its default as text and a line of help. The table
/// drives environment reading, flag parsing and `--help`.
pub struct Setting {
    pub env: &'static str,
    /// Flag name without the leading `--`; `None` for secrets, which must not
    /// appear in a process listing.
    pub flag: Option<&'static str>,
    pub default: &'static str,
    pub help: &'static str,
    field: fn(&mut RawConfig) -> &mut Option<String>,
}

impl Setting {
    /// Where this setting's raw value lives.
    pub fn slot<'a>(&self, raw: &'a mut RawConfig) -> &'a mut Option<String> {
        (self.field)(raw)
    }
}

/// Every setting the server reads, in `--help` order.
// One setting per line reads as a table; rustfmt would spread each over six.
#[rustfmt::skip]
pub const SETTINGS: &[Setting] = &[
    setting("MCP_K8S_TRANSPORT", Some("transport"), "stdio", "stdio, http or sse (sse is the same server as http)", |r| &mut r.transport),
    setting("MCP_K8S_ADDR", Some("addr"), ":8080", "HTTP listen address, host:port; an empty host means all interfaces", |r| &mut r.addr),
    setting("MCP_K8S_PROBE_ADDR", Some("probe-addr"), "", "HTTP only: a second listen address, host:port, that answers /healthz, /readyz and /metrics alone, so that no flood on MCP_K8S_ADDR delays them; empty serves them on MCP_K8S_ADDR only", |r| &mut r.probe_addr),
    setting("MCP_K8S_AUTH_TOKEN", None, "", "token HTTP clients must send as X-MCP-AUTH or Authorization: Bearer (environment only)", |r| &mut r.auth_token),
    setting("MCP_K8S_AUTH_TOKENS_FILE", Some("auth-tokens-file"), "", "JSON file of HTTP callers: each a name, the SHA-256 of its token and its limits (concurrent runs, CPU-seconds per hour, sites, images, tools); a caller sees only its own runs (see the README)", |r| &mut r.auth_tokens_file),
    setting("MCP_K8S_NAMESPACE", Some("namespace"), "mcp-ephemeral", "namespace the Jobs run in", |r| &mut r.namespace),
    setting("MCP_K8S_KUBECONFIG", Some("kubeconfig"), "", "kubeconfig path; empty means in-cluster", |r| &mut r.kubeconfig),
    setting("MCP_K8S_KUBE_CONTEXT", Some("kube-context"), "", "context of the kubeconfig to use; empty uses its current-context", |r| &mut r.kube_context),
    setting("MCP_K8S_SITES", Some("sites"), "", "JSON file of named sites, each a Kubernetes context or a Docker engine, one of them the default; runs take an optional `site` (see the README)", |r| &mut r.sites),
    setting("MCP_K8S_DEFAULT_TIMEOUT_S", Some("default-timeout-s"), "60", "timeout_s when a call gives none", |r| &mut r.default_timeout_s),
    setting("MCP_K8S_MAX_TIMEOUT_S", Some("max-timeout-s"), "600", "largest timeout_s a call may ask for", |r| &mut r.max_timeout_s),
    setting("MCP_K8S_MAX_OUTPUT_BYTES", Some("max-output-bytes"), "1048576", "cap on captured stdout and stderr", |r| &mut r.max_output_bytes),
    setting("MCP_K8S_MAX_ARTIFACT_BYTES", Some("max-artifact-bytes"), "10485760", "cap on returned files", |r| &mut r.max_artifact_bytes),
    setting("MCP_K8S_DEFAULT_CPU", Some("default-cpu"), "1", "CPU request when a call gives none (Kubernetes quantity)", |r| &mut r.default_cpu),
    setting("MCP_K8S_DEFAULT_MEMORY", Some("default-memory"), "512Mi", "memory request when a call gives none (Kubernetes quantity)", |r| &mut r.default_memory),
    setting("MCP_K8S_MAX_CONCURRENT", Some("max-concurrent"), "10", "jobs running at once", |r| &mut r.max_concurrent),
    setting("MCP_K8S_MAX_SANDBOXES", Some("max-sandboxes"), "4", "open sandboxes (open_sandbox) at once, over every caller; each holds its CPU and memory requests for its life; 0 turns them off", |r| &mut r.max_sandboxes),
    setting("MCP_K8S_SANDBOX_MAX_LIFETIME_S", Some("sandbox-max-lifetime-s"), "3600", "longest max_lifetime_s an open sandbox may ask for", |r| &mut r.sandbox_max_lifetime_s),
    setting("MCP_K8S_ALLOWED_IMAGES", Some("allowed-images"), "", "comma-separated images calls may use; empty allows none", |r| &mut r.allowed_images),
    setting("MCP_K8S_SIDECAR_IMAGE", Some("sidecar-image"), "busybox:1.36", "accepted for compatibility with the original and unused: the in-pod runner replaced the sidecar", |r| &mut r.sidecar_image),
    setting("MCP_K8S_CLONE_IMAGE", Some("clone-image"), "", "image that clones repositories (with MCP_K8S_CLONE_SECRET)", |r| &mut r.clone_image),
    setting("MCP_K8S_CLONE_SECRET", Some("clone-secret"), "", "Secret with one git token per host, key `host` or `host_port` (with MCP_K8S_CLONE_IMAGE)", |r| &mut r.clone_secret),
    setting("MCP_K8S_CACHE_PVC", Some("cache-pvc"), "", "PersistentVolumeClaim mounted as a cache (with MCP_K8S_CACHE_MOUNT_PATH)", |r| &mut r.cache_pvc),
    setting("MCP_K8S_CACHE_MOUNT_PATH", Some("cache-mount-path"), "", "where the cache is mounted (with MCP_K8S_CACHE_PVC)", |r| &mut r.cache_mount_path),
    setting("MCP_K8S_JOB_EXTRA_ENV", None, "", "JSON object of environment variables every job gets (environment only)", |r| &mut r.job_extra_env),
    setting("MCP_K8S_RUNNER_IMAGE", Some("runner-image"), DEFAULT_RUNNER_IMAGE, "image holding this binary; its `prepare` container copies the in-pod runner (set it to your mirror)", |r| &mut r.runner_image),
    setting("MCP_K8S_RUNNER_BINARY_PATH", Some("runner-binary-path"), "/mcp-k8s-ephemeral-job", "path of this binary inside MCP_K8S_RUNNER_IMAGE", |r| &mut r.runner_binary_path),
    setting("MCP_K8S_RUN_AS_USER", Some("run-as-user"), "65532", "numeric UID (and GID) job containers run as; never 0", |r| &mut r.run_as_user),
    setting("MCP_K8S_START_TIMEOUT_S", Some("start-timeout-s"), "120", "time a pod may take to be scheduled, pull its image and start, apart from timeout_s", |r| &mut r.start_timeout_s),
    setting("MCP_K8S_MAX_QUEUED", Some("max-queued"), "100", "jobs that may wait for a free slot when MCP_K8S_MAX_CONCURRENT are running; more are refused", |r| &mut r.max_queued),
    setting("MCP_K8S_RESULT_TTL_S", Some("result-ttl-s"), "3600", "how long background job results are kept for fetch_job", |r| &mut r.result_ttl_s),
    setting("MCP_K8S_WORKDIR_SIZE", Some("workdir-size"), "1Gi", "what a job may write to its workdir and /tmp together (Kubernetes quantity, 1Mi to 1Ti)", |r| &mut r.workdir_size),
    setting("MCP_K8S_RUNTIME_CLASS", Some("runtime-class"), "", "RuntimeClass for job pods (e.g. gvisor); empty uses the cluster default", |r| &mut r.runtime_class),
    setting("MCP_K8S_AWAIT_NETWORK_POLICY", Some("await-network-policy"), "auto", "which runs hold their command until their pod's network policy is in force (a connection to the API server's Service is refused), for network plugins that fence a pod only after it starts (kube-router): auto (none and restricted), 1 (every mode; needs open to refuse the API server, as deploy/ does) or 0 (none)", |r| &mut r.await_network_policy),
    setting("MCP_K8S_NETWORK_POLICY_WAIT_S", Some("network-policy-wait-s"), "10", "how long a run waits for its fence (MCP_K8S_AWAIT_NETWORK_POLICY) before it ends NetworkPolicyNotEnforced without starting the command", |r| &mut r.network_policy_wait_s),
    setting("MCP_K8S_POD_TEMPLATE", Some("pod-template"), "", "YAML or JSON file with the operator's parts of every job pod: nodeSelector, tolerations, affinity, imagePullSecrets, labels... (see the README)", |r| &mut r.pod_template),
    setting("MCP_K8S_MAX_MESSAGE_BYTES", Some("max-message-bytes"), "4194304", "cap on one incoming MCP message (stdio line or HTTP body)", |r| &mut r.max_message_bytes),
    setting("MCP_K8S_MAX_INFLIGHT_BYTES", Some("max-inflight-bytes"), "16777216", "bytes of tools/call messages (as parsed values) whose calls are still running; more calls are refused until some finish", |r| &mut r.max_inflight_bytes),
    setting("MCP_K8S_MAX_REPLY_QUEUE_BYTES", Some("max-reply-queue-bytes"), "8388608", "bytes of replies waiting for one client that does not read: on stdio, stdin is then not read and notifications are dropped; an SSE client is disconnected and its calls cancelled", |r| &mut r.max_reply_queue_bytes),
    setting("MCP_K8S_SESSION_TTL_S", Some("session-ttl-s"), "3600", "idle time after which an HTTP session ends", |r| &mut r.session_ttl_s),
    setting("MCP_K8S_MAX_SESSIONS", Some("max-sessions"), "1000", "HTTP sessions kept at once; when full, the least recently used one without a running call ends", |r| &mut r.max_sessions),
    setting("MCP_K8S_MAX_CONNECTIONS", Some("max-connections"), "512", "HTTP connections served at once (a thread each); when full, the one waiting longest for a request is closed, else a small reserve serves /healthz, /readyz and /metrics and the rest get 503", |r| &mut r.max_connections),
    setting("MCP_K8S_MAX_HEADER_BYTES", Some("max-header-bytes"), "16384", "cap on an HTTP request line and its headers together; more is refused with 431", |r| &mut r.max_header_bytes),
    setting("MCP_K8S_MAX_HEADERS", Some("max-headers"), "100", "headers one HTTP request may carry; more is refused with 431", |r| &mut r.max_headers),
    setting("MCP_K8S_BODY_BUDGET_BYTES", Some("body-budget-bytes"), "33554432", "bytes of HTTP request bodies (and their parsed values) held at once over all connections; at least MCP_K8S_MAX_MESSAGE_BYTES", |r| &mut r.body_budget_bytes),
    setting("MCP_K8S_HEAD_TIMEOUT_S", Some("head-timeout-s"), "10", "time an HTTP client has to send a request line and headers", |r| &mut r.head_timeout_s),
    setting("MCP_K8S_BODY_TIMEOUT_S", Some("body-timeout-s"), "30", "time an HTTP client has to send a request body", |r| &mut r.body_timeout_s),
    setting("MCP_K8S_IDLE_TIMEOUT_S", Some("idle-timeout-s"), "30", "how long a kept-alive HTTP connection may wait for its next request", |r| &mut r.idle_timeout_s),
    setting("MCP_K8S_WRITE_TIMEOUT_S", Some("write-timeout-s"), "30", "how long an HTTP client may leave an answer or event stream unread before it is dropped", |r| &mut r.write_timeout_s),
    setting("MCP_K8S_ALLOWED_ORIGINS", Some("allowed-origins"), "", "comma-separated browser origins allowed besides localhost", |r| &mut r.allowed_origins),
    setting("MCP_K8S_SHUTDOWN_GRACE_S", Some("shutdown-grace-s"), "30", "how long in-flight calls may finish after SIGTERM before they are cancelled", |r| &mut r.shutdown_grace_s),
    setting("MCP_K8S_LANGUAGES", Some("languages"), "", "JSON file of execute_code language profiles that override or add to the built-in ones (python, javascript, go, bash)", |r| &mut r.languages),
    setting("MCP_K8S_WARM_POOLS", Some("warm-pools"), "", "JSON file of warm pools: sandboxes kept running ahead for runs of one image, limits and network mode (see the README)", |r| &mut r.warm_pools),
    setting("MCP_K8S_SNIPPETS_DIR", Some("snippets-dir"), "", "folder of named snippets for execute_code's snippet_name, also served as MCP resources; empty means none", |r| &mut r.snippets_dir),
    setting("MCP_K8S_OUTPUTS_DIR", Some("outputs-dir"), "", "folder where a run's whole stdout, stderr and files past the inline caps are kept until MCP_K8S_RESULT_TTL_S ends, read back in ranges through resource links (job://...); every replica must see the same folder (a ReadWriteMany volume); empty keeps none", |r| &mut r.outputs_dir),
    setting("MCP_K8S_OUTPUTS_MAX_RUN_BYTES", Some("outputs-max-run-bytes"), "268435456", "bytes one run may keep in MCP_K8S_OUTPUTS_DIR, streams and files together; past it a link says its content is incomplete", |r| &mut r.outputs_max_run_bytes),
    setting("MCP_K8S_OUTPUTS_MAX_BYTES", Some("outputs-max-bytes"), "10737418240", "bytes all runs may keep in MCP_K8S_OUTPUTS_DIR together; a run that finds it full keeps less (its links say so)", |r| &mut r.outputs_max_bytes),
    setting("MCP_K8S_OTLP_ENDPOINT", Some("otlp-endpoint"), "", "OpenTelemetry traces: the OTLP/HTTP receiver spans are sent to, in JSON (http://host:4318; /v1/traces is added); empty sends none", |r| &mut r.otlp_endpoint),
    setting("MCP_K8S_AUDIT_LOG", Some("audit-log"), "", "where the audit trail goes, one JSON line per run (who, which tool, image, network, outcome; never arguments): stderr, or an absolute file path appended to; empty keeps none", |r| &mut r.audit_log),
    setting("MCP_K8S_LOG_LEVEL", Some("log-level"), "info", "lowest level written to stderr: debug, info, notice, warning, error", |r| &mut r.log_level),
    setting("MCP_K8S_BACKEND", Some("backend"), "auto", "where jobs run: kubernetes, docker, or auto (cluster credentials found: kubernetes; else a Docker daemon that answers: docker)", |r| &mut r.backend),
    setting("MCP_K8S_DOCKER_HOST", Some("docker-host"), "", "the Docker daemon's socket, unix:///path; empty uses DOCKER_HOST, else unix:///var/run/docker.sock", |r| &mut r.docker_host),
    setting("MCP_K8S_NETWORK_MODES", Some("network-modes"), "none,restricted,open", "comma-separated network modes a call may ask for with `network`: none (no network), restricted (the operator's egress allowlist), open (egress anywhere); every mode has no ingress", |r| &mut r.network_modes),
    setting("MCP_K8S_NETWORK_DEFAULT", Some("network-default"), "open", "network mode of run_job and submit_job when a call names none (execute_code: none when allowed, else this); one of MCP_K8S_NETWORK_MODES", |r| &mut r.network_default),
    setting("MCP_K8S_DOCKER_NETWORK", Some("docker-network"), "", "the restricted network on the Docker backend: the operator's Docker network whose egress rules `restricted` runs get; empty means `restricted` is not available there", |r| &mut r.docker_network),
    setting("MCP_K8S_DOCKER_PULL", Some("docker-pull"), "never", "whether the Docker backend pulls a missing image: never or missing", |r| &mut r.docker_pull),
    setting("MCP_K8S_RUNNER_BINARY", Some("runner-binary"), "", "host path of the static runner binary the Docker backend mounts into jobs; empty means this server's own executable", |r| &mut r.runner_binary),
    setting("MCP_K8S_LAZY_BACKEND", Some("lazy-backend"), "0", "1 serves even when no site can run a job at start (no credentials, no daemon, the API refusing), /readyz failing until one can; 0 stops the start (exit 2) naming what is missing", |r| &mut r.lazy_backend),
    setting("MCP_K8S_TEST_TOOLS", None, "", "1 registers diagnostic tools for tests; test builds only (environment only)", |r| &mut r.test_tools),
    setting("MCP_K8S_CONFORMANCE_FIXTURES", None, "", "1 serves the MCP conformance suite's fixture tools, prompts, resources and completions beside the real tools; only with MCP_K8S_TEST_TOOLS=1, never with a token, a tokens file or sites; test builds only (environment only)", |r| &mut r.conformance_fixtures),
    setting("MCP_K8S_TEST_PANIC_THREAD", None, "", "test hook: the first thread of this kind (reaper, pool, http-connection...) panics as it starts, to test what a panic does; test builds only (environment only)", |r| &mut r.test_panic_thread),
];

/// The default of the setting `env` as the table writes it; `""` means
/// unset. `Config::from_raw` reads every default from here, so `--help`,
/// the README's table (which a test holds to `SETTINGS`) and the parse
/// cannot disagree.
///
/// # Panics
///
/// When `env` is no setting: a misspelt name in `config`'s own code, which
/// any test that checks a configuration reaches.
pub fn default_of(env: &str) -> &'static str {
    match SETTINGS.iter().find(|setting| setting.env == env) {
        Some(setting) => setting.default,
        None => panic!("{env} is not in SETTINGS"),
    }
}

/// `default_of` for a numeric setting.
///
/// # Panics
///
/// When the table's default is not a whole number: a mistake in the table,
/// which any test that checks a configuration reaches.
pub fn default_number(env: &str) -> u64 {
    let text = default_of(env);
    text.parse().unwrap_or_else(|_| panic!("the default of {env}, `{text}`, is not a whole number"))
}

/// What the environment and the command line said, unchecked. An empty
/// environment value counts as unset, as in the original server.
#[derive(Clone, Debug, Default)]
pub struct RawConfig {
    pub transport: Option<String>,
    pub addr: Option<String>,
    pub probe_addr: Option<String>,
    pub auth_token: Option<String>,
    pub auth_tokens_file: Option<String>,
    pub namespace: Option<String>,
    pub kubeconfig: Option<String>,
    pub kube_context: Option<String>,
    pub sites: Option<String>,
    pub default_timeout_s: Option<String>,
    pub max_timeout_s: Option<String>,
    pub max_output_bytes: Option<String>,
    pub max_artifact_bytes: Option<String>,
    pub default_cpu: Option<String>,
    pub default_memory: Option<String>,
    pub max_concurrent: Option<String>,
    pub max_sandboxes: Option<String>,
    pub sandbox_max_lifetime_s: Option<String>,
    pub allowed_images: Option<String>,
    pub sidecar_image: Option<String>,
    pub clone_image: Option<String>,
    pub clone_secret: Option<String>,
    pub cache_pvc: Option<String>,
    pub cache_mount_path: Option<String>,
    pub job_extra_env: Option<String>,
    pub runner_image: Option<String>,
    pub runner_binary_path: Option<String>,
    pub run_as_user: Option<String>,
    pub start_timeout_s: Option<String>,
    pub max_queued: Option<String>,
    pub result_ttl_s: Option<String>,
    pub workdir_size: Option<String>,
    pub runtime_class: Option<String>,
    pub await_network_policy: Option<String>,
    pub network_policy_wait_s: Option<String>,
    pub pod_template: Option<String>,
    pub max_message_bytes: Option<String>,
    pub max_inflight_bytes: Option<String>,
    pub max_reply_queue_bytes: Option<String>,
    pub session_ttl_s: Option<String>,
    pub max_sessions: Option<String>,
    pub max_connections: Option<String>,
    pub max_header_bytes: Option<String>,
    pub max_headers: Option<String>,
    pub body_budget_bytes: Option<String>,
    pub head_timeout_s: Option<String>,
    pub body_timeout_s: Option<String>,
    pub idle_timeout_s: Option<String>,
    pub write_timeout_s: Option<String>,
    pub allowed_origins: Option<String>,
    pub shutdown_grace_s: Option<String>,
    pub languages: Option<String>,
    pub warm_pools: Option<String>,
    pub snippets_dir: Option<String>,
    pub outputs_dir: Option<String>,
    pub outputs_max_run_bytes: Option<String>,
    pub outputs_max_bytes: Option<String>,
    pub audit_log: Option<String>,
    pub otlp_endpoint: Option<String>,
    pub log_level: Option<String>,
    pub lazy_backend: Option<String>,
    pub test_tools: Option<String>,
    pub conformance_fixtures: Option<String>,
    pub test_panic_thread: Option<String>,
    pub backend: Option<String>,
    pub docker_host: Option<String>,
    pub docker_network: Option<String>,
    pub network_modes: Option<String>,
    pub network_default: Option<String>,
    pub docker_pull: Option<String>,
    pub runner_binary: Option<String>,
}

impl RawConfig {
    /// Reads every `MCP_K8S_*` setting from `lookup` (the process
    /// environment in `main`, a table in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> RawConfig {
        let mut raw = RawConfig::default();
        for setting in SETTINGS {
            *setting.slot(&mut raw) = lookup(setting.env).filter(|value| !value.is_empty());
        }
        raw
    }

    pub fn from_env() -> RawConfig {
        RawConfig::from_lookup(|name| std::env::var(name).ok())
    }
}

/// The `MCP_K8S_*` names among `names` that are no setting, each with the
/// nearest setting's name when one is close enough to be a typo: such a
/// variable is silently without effect otherwise.
pub fn unknown_settings<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<(String, Option<&'static str>)> {
    names
        .into_iter()
        .filter(|name| name.starts_with("MCP_K8S_") && !SETTINGS.iter().any(|setting| setting.env == *name))
        .map(|name| {
            let nearest = SETTINGS
                .iter()
                .map(|setting| (edit_distance(name, setting.env), setting.env))
                .min()
                .filter(|(distance, _)| *distance <= 3.max(name.len() / 8))
                .map(|(_, env)| env);
            (name.to_string(), nearest)
        })
        .collect()
}

/// Levenshtein distance over bytes (the names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, byte_a) in a.iter().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, byte_b) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(byte_a != byte_b);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

const fn setting(
    env: &'static str,
    flag: Option<&'static str>,
    default: &'static str,
    help: &'static str,
    field: fn(&mut RawConfig) -> &mut Option<String>,
) -> Setting {
    Setting { env, flag, default, help, field }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_variable_is_named_with_the_setting_it_may_mean() {
        let names = [
            "MCP_K8S_ALLOWED_IMAGE",
            "MCP_K8S_NAMSPACE",
            "MCP_K8S_MAX_TIMEOUT_S",
            "MCP_K8S_SOMETHING_ELSE_ENTIRELY",
            "PATH",
            "MCP_K8S_ALOWED_IMGES",
        ];
        assert_eq!(
            unknown_settings(names),
            [
                ("MCP_K8S_ALLOWED_IMAGE".to_string(), Some("MCP_K8S_ALLOWED_IMAGES")),
                ("MCP_K8S_NAMSPACE".to_string(), Some("MCP_K8S_NAMESPACE")),
                ("MCP_K8S_SOMETHING_ELSE_ENTIRELY".to_string(), None),
                ("MCP_K8S_ALOWED_IMGES".to_string(), Some("MCP_K8S_ALLOWED_IMAGES")),
            ]
        );
        assert_eq!((edit_distance("", "ab"), edit_distance("kitten", "sitting"), edit_distance("same", "same")), (2, 3, 0));
    }
}
