//! Configuration: `RawConfig` holds what the environment (`MCP_K8S_*`) and
//! the command line said; `Config::from_raw` applies defaults, cross-checks
//! fields and names the variable in every error. Nothing else reads the
//! environment for settings.
//!
//! CPU and memory quantities stay validated strings here; turning them into
//! numbers belongs to whoever builds the pod spec.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use crate::images::Allowlist;
use crate::languages::Languages;
use crate::log::{Level, Redacted};
use crate::network::{self, NetworkMode};
use crate::pools::{self, Pool};
use crate::quantity::{Quantity, Resource};
use crate::settings_file;
use crate::supervise;

mod settings;
mod site;

// Re-exported so that the rest of the crate keeps naming them
// `config::SETTINGS`, `config::Site` and so on, whichever file they live in.
pub use settings::{DEFAULT_RUNNER_IMAGE, RawConfig, SETTINGS, Setting, unknown_settings};
pub use site::{DEFAULT_SITE, MAX_SITE_NAME_CHARS, Site, site_names};
use site::{check_pool_sites, parse_sites};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    /// Streamable HTTP at `/mcp` and legacy HTTP+SSE at `/sse` on one
    /// listener. `MCP_K8S_TRANSPORT=sse` selects the same server: one
    /// deployment then serves old and new clients alike.
    Http,
}

/// Both-or-neither pair: the clone init container needs its image and the
/// Secret with credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloneConfig {
    pub image: String,
    pub secret: String,
}

/// Both-or-neither pair: a PVC is useless without a mount path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    pub pvc: String,
    pub mount_path: String,
}

/// Checked configuration with defaults applied. Passed as `&Config`.
#[derive(Clone, Debug)]
pub struct Config {
    pub transport: Transport,
    pub addr: SocketAddr,
    /// MCP_K8S_PROBE_ADDR: a second listener that answers the probes and
    /// `/metrics` only, so that a flood of MCP clients on `addr` cannot
    /// delay the kubelet's probes. HTTP only; `None` when unset.
    pub probe_addr: Option<SocketAddr>,
    pub auth_token: Option<Redacted<String>>,
    /// MCP_K8S_AUTH_TOKENS_FILE, checked; `None` when unset (one caller).
    pub callers: Option<crate::callers::Callers>,
    pub namespace: String,
    pub kubeconfig: Option<PathBuf>,
    /// MCP_K8S_KUBE_CONTEXT: `None` uses the kubeconfig's current-context.
    pub kube_context: Option<String>,
    /// MCP_K8S_SITES, checked, the default first; empty when unset (the
    /// settings above are then the one site, `default`).
    pub sites: Vec<Site>,
    pub default_timeout_s: u64,
    pub max_timeout_s: u64,
    pub max_output_bytes: u64,
    pub max_artifact_bytes: u64,
    pub default_cpu: Quantity,
    pub default_memory: Quantity,
    pub max_concurrent: u32,
    /// Open sandboxes at once (MCP_K8S_MAX_SANDBOXES).
    pub max_sandboxes: usize,
    /// The longest `max_lifetime_s` (MCP_K8S_SANDBOX_MAX_LIFETIME_S).
    pub sandbox_max_lifetime_s: u64,
    /// Empty means every image is refused, as in the original.
    pub allowed_images: Allowlist,
    pub clone: Option<CloneConfig>,
    pub cache: Option<CacheConfig>,
    /// Sorted so manifests built from it are deterministic.
    pub job_extra_env: BTreeMap<String, String>,
    pub runner_image: String,
    pub runner_binary_path: String,
    pub run_as_user: u32,
    pub start_timeout_s: u64,
    pub max_queued: u32,
    pub result_ttl_s: u64,
    pub workdir_size: Quantity,
    pub runtime_class: Option<String>,
    /// MCP_K8S_AWAIT_NETWORK_POLICY.
    pub await_network_policy: crate::network::FenceModes,
    pub network_policy_wait_s: u64,
    /// The operator's pod template file. Only its path is checked here:
    /// `backend::kubernetes::template` reads and checks its content, since
    /// its fields are Kubernetes' own.
    pub pod_template: Option<PathBuf>,
    pub max_message_bytes: usize,
    /// Messages held by running calls, in bytes, past which new calls are
    /// refused (one call alone is always served).
    pub max_inflight_bytes: usize,
    /// Replies waiting for one client that does not read: past it the
    /// stdio reader stops reading stdin and drops notifications, and an SSE
    /// client is disconnected.
    pub max_reply_queue_bytes: usize,
    pub session_ttl_s: u64,
    /// The HTTP transport's bounds against hostile or broken clients.
    pub http_limits: HttpLimits,
    /// Exact origins (`scheme://host[:port]`) allowed besides loopback ones.
    pub allowed_origins: Vec<String>,
    pub shutdown_grace_s: u64,
    /// execute_code's language profiles: built in, plus MCP_K8S_LANGUAGES.
    pub languages: Languages,
    /// MCP_K8S_WARM_POOLS, checked; empty when unset.
    pub warm_pools: Vec<Pool>,
    /// MCP_K8S_SNIPPETS_DIR, checked to be a folder at start; its files are
    /// read at call time.
    pub snippets_dir: Option<PathBuf>,
    /// MCP_K8S_AUDIT_LOG; `None` keeps no audit trail.
    /// The output store's settings, when MCP_K8S_OUTPUTS_DIR is set.
    pub outputs: Option<OutputsSettings>,
    pub audit_log: Option<crate::audit::Sink>,
    /// MCP_K8S_OTLP_ENDPOINT, as given (checked); `None` sends no spans.
    pub otlp_endpoint: Option<String>,
    pub log_level: Level,
    /// MCP_K8S_LAZY_BACKEND: serve even when no site can run a job at
    /// start, instead of stopping with exit 2.
    pub lazy_backend: bool,
    pub test_tools: bool,
    /// MCP_K8S_CONFORMANCE_FIXTURES: the conformance suite's fixtures are
    /// served (a test server only: see `parse_conformance_fixtures`).
    pub conformance_fixtures: bool,
    /// MCP_K8S_TEST_PANIC_THREAD, a test hook: the kind of thread whose
    /// first one panics as it starts.
    pub test_panic_thread: Option<supervise::Kind>,
    pub backend: BackendChoice,
    /// `unix://` socket of the Docker daemon; `None`: `DOCKER_HOST`, else
    /// the default socket.
    pub docker_host: Option<String>,
    /// The Docker network of `restricted` runs; `None`: `restricted` is
    /// refused on the Docker backend.
    pub docker_network: Option<String>,
    /// The modes a call may ask for, in `NetworkMode::ALL` order, never empty.
    pub network_modes: Vec<NetworkMode>,
    /// run_job's and submit_job's mode when a call names none; one of
    /// `network_modes`.
    pub network_default: NetworkMode,
    pub docker_pull: DockerPull,
    /// `None`: this server's own executable.
    pub runner_binary: Option<PathBuf>,
}

/// `MCP_K8S_BACKEND`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// Cluster credentials found: Kubernetes; else a Docker daemon that
    /// answers: Docker.
    Auto,
    Kubernetes,
    Docker,
}

impl BackendChoice {
    /// As the setting spells it.
    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Kubernetes => "kubernetes",
            BackendChoice::Docker => "docker",
        }
    }
}

/// `MCP_K8S_DOCKER_PULL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DockerPull {
    Never,
    Missing,
}

/// Bounds of the HTTP transport: what one client may make the
/// server hold, and for how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    pub max_sessions: usize,
    pub max_connections: usize,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// At least `max_message_bytes`, so one message of the largest size fits.
    pub body_budget_bytes: usize,
    pub head_timeout_s: u64,
    pub body_timeout_s: u64,
    pub idle_timeout_s: u64,
    pub write_timeout_s: u64,
}

/// A setting that could not be accepted. Every variant names the variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The value does not parse; `expected` lists what would.
    Invalid { variable: &'static str, value: String, expected: String },
    /// The value parses but is outside `min..=max`.
    OutOfRange { variable: &'static str, value: u64, min: u64, max: u64 },
    /// A setting above the one that bounds it: the default timeout above the
    /// maximum, the message cap above the HTTP body budget.
    DefaultAboveMax { default_variable: &'static str, default: u64, max_variable: &'static str, max: u64 },
    /// One of a both-or-neither pair is set without the other.
    Unpaired { set: &'static str, missing: &'static str },
    /// The MCP_K8S_LANGUAGES file is unreadable or wrong; the error names
    /// the file, the profile and the field.
    Languages(settings_file::Error),
    /// The MCP_K8S_WARM_POOLS file is unreadable or wrong; the error names
    /// the file, the pool and the field.
    WarmPools(settings_file::Error),
    /// The MCP_K8S_SITES file is unreadable or wrong; the error names
    /// the file, the site and the field or setting.
    Sites(settings_file::Error),
    /// The MCP_K8S_AUTH_TOKENS_FILE file is unreadable or wrong; the error
    /// names the file, the caller and the field.
    Callers(settings_file::Error),
    /// Two settings that cannot be used together; `why` says what to do.
    Conflict { variable: &'static str, other: &'static str, why: &'static str },
    /// A test server's setting in a build without the test server's code
    /// (built without the `testing` feature, as releases are).
    NotInThisBuild { variable: &'static str },
}

impl fmt::Display for Error {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid { variable, value, expected } => {
                write!(formatter, "{variable}: `{value}` is not accepted; expected {expected}")
            }
            Error::OutOfRange { variable, value, min, max } => {
                write!(formatter, "{variable}: `{value}` is out of range; accepted: {min} to {max}")
            }
            Error::DefaultAboveMax { default_variable, default, max_variable, max } => {
                write!(formatter, "{default_variable}: `{default}` is above {max_variable} ({max}); lower it or raise {max_variable}")
            }
            Error::Unpaired { set, missing } => {
                write!(formatter, "{set} is set but {missing} is not; set both or neither")
            }
            Error::Languages(error) => write!(formatter, "{error}"),
            Error::Callers(error) => write!(formatter, "{error}"),
            Error::Sites(error) => write!(formatter, "{error}"),
            Error::WarmPools(error) => write!(formatter, "{error}"),
            Error::Conflict { variable, other, why } => write!(formatter, "{variable} cannot be used with {other}: {why}"),
            Error::NotInThisBuild { variable } => write!(
                formatter,
                "{variable} is not in this build: the test hooks and the conformance fixtures are built for tests only; \
                 unset it, or build with `cargo build --features testing` (cargo test does)"
            ),
        }
    }
}

impl std::error::Error for Error {}

impl Config {
    pub fn from_raw(raw: &RawConfig) -> Result<Config, Error> {
        // First: a release binary asked for test hooks says so before
        // anything else about its settings.
        check_test_settings_built(raw, cfg!(feature = "testing"))?;
        let default_timeout_s = number(&raw.default_timeout_s, "MCP_K8S_DEFAULT_TIMEOUT_S", 1, 86_400)?;
        let max_timeout_s = number(&raw.max_timeout_s, "MCP_K8S_MAX_TIMEOUT_S", 1, 86_400)?;
        if default_timeout_s > max_timeout_s {
            return Err(Error::DefaultAboveMax {
                default_variable: "MCP_K8S_DEFAULT_TIMEOUT_S",
                default: default_timeout_s,
                max_variable: "MCP_K8S_MAX_TIMEOUT_S",
                max: max_timeout_s,
            });
        }
        let transport = parse_transport(raw.transport.as_deref())?;
        // 4 MiB: the largest useful call carries 768 KiB of files as base64
        // (~1 MiB) plus at most 1 MiB of argv and env; more only costs
        // memory. 64 MiB is the ceiling an operator
        // may raise it to.
        let max_message_bytes = number(&raw.max_message_bytes, "MCP_K8S_MAX_MESSAGE_BYTES", 4096, 64 << 20)?;
        let http_limits = parse_http_limits(raw)?;
        // stdio has no body budget; only the HTTP server needs one message
        // of the largest size to fit in it.
        if transport == Transport::Http && max_message_bytes > http_limits.body_budget_bytes as u64 {
            return Err(Error::DefaultAboveMax {
                default_variable: "MCP_K8S_MAX_MESSAGE_BYTES",
                default: max_message_bytes,
                max_variable: "MCP_K8S_BODY_BUDGET_BYTES",
                max: http_limits.body_budget_bytes as u64,
            });
        }
        let network_modes = parse_network_modes(raw.network_modes.as_deref())?;
        let network_default = parse_network_default(raw.network_default.as_deref(), &network_modes)?;
        let backend = parse_backend(raw.backend.as_deref())?;
        let docker_network = raw.docker_network.as_deref().map(parse_docker_network).transpose()?;
        // With MCP_K8S_BACKEND=auto the backend is known only once it is
        // reached; `main` makes the same check then.
        if backend == BackendChoice::Docker {
            check_docker_network_default(network_default, docker_network.as_deref())?;
        }
        let mut languages = Languages::load(raw.languages.as_deref().map(std::path::Path::new), max_timeout_s).map_err(Error::Languages)?;
        let allowed_images = allowlist(raw.allowed_images.as_deref(), &languages.operator_images)?;
        // Unused (the runner replaced the sidecar), but a value no image
        // could have is still a mistake to stop on.
        image(text(&raw.sidecar_image, "MCP_K8S_SIDECAR_IMAGE"), "MCP_K8S_SIDECAR_IMAGE")?;
        languages.keep_allowed(&allowed_images);
        let cache = parse_cache(raw)?;
        let warm_pools = parse_warm_pools(raw.warm_pools.as_deref(), &allowed_images, &languages, &network_modes, cache.as_ref())?;
        // Before the files are read: a test-only setting beside a
        // deployment's is the error to report.
        let conformance_fixtures = parse_conformance_fixtures(raw, transport)?;
        let sites = parse_sites(raw, &warm_pools)?;
        check_pool_sites(&warm_pools, &sites, raw.warm_pools.as_deref())?;
        Ok(Config {
            transport,
            addr: parse_addr(text(&raw.addr, "MCP_K8S_ADDR"))?,
            probe_addr: parse_probe_addr(raw, transport)?,
            auth_token: raw.auth_token.clone().map(Redacted),
            callers: parse_callers(raw, transport, &sites)?,
            namespace: parse_namespace(text(&raw.namespace, "MCP_K8S_NAMESPACE"))?,
            kubeconfig: raw.kubeconfig.as_ref().map(PathBuf::from),
            kube_context: raw.kube_context.clone(),
            sites,
            default_timeout_s,
            max_timeout_s,
            max_output_bytes: number(&raw.max_output_bytes, "MCP_K8S_MAX_OUTPUT_BYTES", 1024, 1 << 30)?,
            max_artifact_bytes: number(&raw.max_artifact_bytes, "MCP_K8S_MAX_ARTIFACT_BYTES", 0, 1 << 30)?,
            default_cpu: request(&raw.default_cpu, "MCP_K8S_DEFAULT_CPU", Resource::Cpu)?,
            default_memory: request(&raw.default_memory, "MCP_K8S_DEFAULT_MEMORY", Resource::Memory)?,
            max_concurrent: number(&raw.max_concurrent, "MCP_K8S_MAX_CONCURRENT", 1, 1000)? as u32,
            max_sandboxes: number(&raw.max_sandboxes, "MCP_K8S_MAX_SANDBOXES", 0, 1000)? as usize,
            sandbox_max_lifetime_s: number(&raw.sandbox_max_lifetime_s, "MCP_K8S_SANDBOX_MAX_LIFETIME_S", 60, 7 * 24 * 3600)?,
            allowed_images,
            clone: parse_clone(raw)?,
            cache,
            job_extra_env: parse_extra_env(raw.job_extra_env.as_deref())?,
            runner_image: image(text(&raw.runner_image, "MCP_K8S_RUNNER_IMAGE"), "MCP_K8S_RUNNER_IMAGE")?,
            runner_binary_path: absolute_path(text(&raw.runner_binary_path, "MCP_K8S_RUNNER_BINARY_PATH"), "MCP_K8S_RUNNER_BINARY_PATH")?,
            run_as_user: number(&raw.run_as_user, "MCP_K8S_RUN_AS_USER", 1, u64::from(u32::MAX))? as u32,
            start_timeout_s: number(&raw.start_timeout_s, "MCP_K8S_START_TIMEOUT_S", 5, 3600)?,
            max_queued: number(&raw.max_queued, "MCP_K8S_MAX_QUEUED", 0, 100_000)? as u32,
            result_ttl_s: number(&raw.result_ttl_s, "MCP_K8S_RESULT_TTL_S", 60, 7 * 86_400)?,
            workdir_size: workdir_size(&raw.workdir_size)?,
            runtime_class: raw.runtime_class.as_deref().map(|name| object_name(name, "MCP_K8S_RUNTIME_CLASS")).transpose()?,
            await_network_policy: parse_fence_modes(raw.await_network_policy.as_deref())?,
            network_policy_wait_s: number(&raw.network_policy_wait_s, "MCP_K8S_NETWORK_POLICY_WAIT_S", 1, 3600)?,
            pod_template: raw.pod_template.as_ref().map(PathBuf::from),
            max_message_bytes: max_message_bytes as usize,
            max_inflight_bytes: number(&raw.max_inflight_bytes, "MCP_K8S_MAX_INFLIGHT_BYTES", 64 << 10, 1 << 32)? as usize,
            max_reply_queue_bytes: number(&raw.max_reply_queue_bytes, "MCP_K8S_MAX_REPLY_QUEUE_BYTES", 64 << 10, 1 << 30)? as usize,
            session_ttl_s: number(&raw.session_ttl_s, "MCP_K8S_SESSION_TTL_S", 1, 7 * 86_400)?,
            http_limits,
            allowed_origins: parse_origins(raw.allowed_origins.as_deref())?,
            shutdown_grace_s: number(&raw.shutdown_grace_s, "MCP_K8S_SHUTDOWN_GRACE_S", 0, 3600)?,
            languages,
            warm_pools,
            snippets_dir: raw.snippets_dir.as_deref().map(parse_snippets_dir).transpose()?,
            outputs: parse_outputs(raw)?,
            audit_log: raw.audit_log.as_deref().map(parse_audit_log).transpose()?,
            otlp_endpoint: raw.otlp_endpoint.as_deref().map(parse_otlp_endpoint).transpose()?,
            log_level: parse_log_level(raw.log_level.as_deref())?,
            lazy_backend: parse_flag(raw.lazy_backend.as_deref(), "MCP_K8S_LAZY_BACKEND")?,
            test_tools: parse_flag(raw.test_tools.as_deref(), "MCP_K8S_TEST_TOOLS")?,
            conformance_fixtures,
            test_panic_thread: raw.test_panic_thread.as_deref().map(parse_thread_kind).transpose()?,
            backend,
            docker_host: raw.docker_host.as_deref().map(parse_docker_host).transpose()?,
            docker_network,
            network_modes,
            network_default,
            docker_pull: parse_docker_pull(raw.docker_pull.as_deref())?,
            runner_binary: raw
                .runner_binary
                .as_deref()
                .map(|path| absolute_path(path, "MCP_K8S_RUNNER_BINARY").map(PathBuf::from))
                .transpose()?,
        })
    }

    /// The start-up check of the network default on the Docker backend:
    /// `restricted` there is the network MCP_K8S_DOCKER_NETWORK names, so a
    /// default of `restricted` without it would refuse every plain call.
    pub fn check_docker_network(&self) -> Result<(), Error> {
        check_docker_network_default(self.network_default, self.docker_network.as_deref())
    }

    /// execute_code's mode when a call names none: `none` when the operator
    /// allows it (code snippets rarely need a network), else the default.
    pub fn execute_code_network_default(&self) -> NetworkMode {
        if self.network_modes.contains(&NetworkMode::None) { NetworkMode::None } else { self.network_default }
    }

    /// True when the HTTP listener is reachable only from this machine.
    pub fn binds_loopback(&self) -> bool {
        self.addr.ip().is_loopback()
    }
}

/// Kubernetes env var names (`C_IDENTIFIER` in the API), also used for
/// caller-supplied env later.
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The setting's text: what was given, else the table's default.
fn text<'a>(value: &'a Option<String>, variable: &'static str) -> &'a str {
    value.as_deref().unwrap_or_else(|| settings::default_of(variable))
}

fn invalid(variable: &'static str, value: &str, expected: &str) -> Error {
    Error::Invalid { variable, value: value.to_string(), expected: expected.to_string() }
}

/// A whole number from `min` to `max`; unset, the table's default.
fn number(value: &Option<String>, variable: &'static str, min: u64, max: u64) -> Result<u64, Error> {
    let Some(text) = value else {
        return Ok(settings::default_number(variable));
    };
    let parsed: u64 = text.trim().parse().map_err(|_| invalid(variable, text, &format!("a whole number from {min} to {max}")))?;
    if parsed < min || parsed > max {
        return Err(Error::OutOfRange { variable, value: parsed, min, max });
    }
    Ok(parsed)
}

fn parse_http_limits(raw: &RawConfig) -> Result<HttpLimits, Error> {
    let size = |value: &Option<String>, variable, min, max| number(value, variable, min, max).map(|n| n as usize);
    let seconds = |value: &Option<String>, variable| number(value, variable, 1, 3600);
    Ok(HttpLimits {
        max_sessions: size(&raw.max_sessions, "MCP_K8S_MAX_SESSIONS", 1, 1_000_000)?,
        max_connections: size(&raw.max_connections, "MCP_K8S_MAX_CONNECTIONS", 1, 10_000)?,
        max_header_bytes: size(&raw.max_header_bytes, "MCP_K8S_MAX_HEADER_BYTES", 1024, 1 << 20)?,
        max_headers: size(&raw.max_headers, "MCP_K8S_MAX_HEADERS", 8, 10_000)?,
        body_budget_bytes: size(&raw.body_budget_bytes, "MCP_K8S_BODY_BUDGET_BYTES", 4096, 1 << 32)?,
        head_timeout_s: seconds(&raw.head_timeout_s, "MCP_K8S_HEAD_TIMEOUT_S")?,
        body_timeout_s: seconds(&raw.body_timeout_s, "MCP_K8S_BODY_TIMEOUT_S")?,
        idle_timeout_s: seconds(&raw.idle_timeout_s, "MCP_K8S_IDLE_TIMEOUT_S")?,
        write_timeout_s: seconds(&raw.write_timeout_s, "MCP_K8S_WRITE_TIMEOUT_S")?,
    })
}

fn parse_backend(value: Option<&str>) -> Result<BackendChoice, Error> {
    match value.unwrap_or(settings::default_of("MCP_K8S_BACKEND")) {
        "auto" => Ok(BackendChoice::Auto),
        "kubernetes" => Ok(BackendChoice::Kubernetes),
        "docker" => Ok(BackendChoice::Docker),
        other => Err(invalid("MCP_K8S_BACKEND", other, "one of auto, kubernetes, docker")),
    }
}

fn parse_thread_kind(value: &str) -> Result<supervise::Kind, Error> {
    supervise::Kind::parse(value).ok_or_else(|| {
        let kinds: Vec<&str> = supervise::Kind::ALL.iter().map(|kind| kind.as_str()).collect();
        invalid("MCP_K8S_TEST_PANIC_THREAD", value, &format!("one of {}", kinds.join(", ")))
    })
}

fn parse_docker_pull(value: Option<&str>) -> Result<DockerPull, Error> {
    match value.unwrap_or(settings::default_of("MCP_K8S_DOCKER_PULL")) {
        "never" => Ok(DockerPull::Never),
        "missing" => Ok(DockerPull::Missing),
        other => Err(invalid("MCP_K8S_DOCKER_PULL", other, "one of never, missing")),
    }
}

/// MCP_K8S_AUTH_TOKENS_FILE: read and checked. Callers are told apart by
/// their HTTP tokens, so the file has no meaning over stdio, and beside
/// the single MCP_K8S_AUTH_TOKEN it would leave one caller unnamed.
fn parse_callers(raw: &RawConfig, transport: Transport, sites: &[Site]) -> Result<Option<crate::callers::Callers>, Error> {
    let Some(path) = raw.auth_tokens_file.as_deref() else { return Ok(None) };
    if raw.auth_token.is_some() {
        return Err(Error::Conflict {
            variable: "MCP_K8S_AUTH_TOKENS_FILE",
            other: "MCP_K8S_AUTH_TOKEN",
            why: "the file names every caller; add that token to it as a caller of its own and unset MCP_K8S_AUTH_TOKEN",
        });
    }
    if transport == Transport::Stdio {
        return Err(Error::Conflict {
            variable: "MCP_K8S_AUTH_TOKENS_FILE",
            other: "MCP_K8S_TRANSPORT",
            why: "over stdio there is one caller and no token; use MCP_K8S_TRANSPORT=http or unset the file",
        });
    }
    let names = site_names(sites);
    let text = settings_file::read_settings(&crate::callers::FILE, std::path::Path::new(path), crate::callers::MAX_FILE_BYTES)
        .map_err(Error::Callers)?;
    crate::callers::Callers::parse(std::path::Path::new(path), &text, &names).map(Some).map_err(Error::Callers)
}

/// MCP_K8S_WARM_POOLS: read and checked against the allowlist, the
/// profiles' images and the allowed network modes. With a cache volume
/// every run mounts it and no pool sandbox does (cache runs
/// stay cold), so the pools would never be used: refused rather than ignored.
fn parse_warm_pools(
    value: Option<&str>,
    allowlist: &Allowlist,
    languages: &Languages,
    network_modes: &[NetworkMode],
    cache: Option<&CacheConfig>,
) -> Result<Vec<Pool>, Error> {
    let Some(path) = value else { return Ok(Vec::new()) };
    if cache.is_some() {
        return Err(Error::Conflict {
            variable: "MCP_K8S_WARM_POOLS",
            other: "MCP_K8S_CACHE_PVC",
            why: "every run mounts the cache and a pool sandbox does not, so no run could take one; unset one of them",
        });
    }
    let bounds = pools::Bounds { allowlist, languages, network_modes };
    pools::load(std::path::Path::new(path), &bounds).map_err(Error::WarmPools)
}

/// MCP_K8S_NETWORK_MODES: known names, each once, at least one; kept in
/// `NetworkMode::ALL` order so lists read the same whatever the setting's.
fn parse_network_modes(value: Option<&str>) -> Result<Vec<NetworkMode>, Error> {
    const EXPECTED: &str = "a comma-separated list of none, restricted, open";
    let text = value.unwrap_or(settings::default_of("MCP_K8S_NETWORK_MODES"));
    let mut modes = Vec::new();
    for item in csv(Some(text)) {
        let mode = NetworkMode::from_name(&item).ok_or_else(|| invalid("MCP_K8S_NETWORK_MODES", &item, EXPECTED))?;
        modes.push(mode);
    }
    if modes.is_empty() {
        return Err(invalid("MCP_K8S_NETWORK_MODES", text, EXPECTED));
    }
    modes.sort();
    modes.dedup();
    Ok(modes)
}

fn parse_network_default(value: Option<&str>, allowed: &[NetworkMode]) -> Result<NetworkMode, Error> {
    let text = value.unwrap_or(settings::default_of("MCP_K8S_NETWORK_DEFAULT"));
    let mode = NetworkMode::from_name(text).ok_or_else(|| invalid("MCP_K8S_NETWORK_DEFAULT", text, "one of none, restricted, open"))?;
    if !allowed.contains(&mode) {
        return Err(invalid(
            "MCP_K8S_NETWORK_DEFAULT",
            text,
            &format!("one of MCP_K8S_NETWORK_MODES ({}); add it there or choose one of those", network::names(allowed)),
        ));
    }
    Ok(mode)
}

fn check_docker_network_default(default: NetworkMode, docker_network: Option<&str>) -> Result<(), Error> {
    if default == NetworkMode::Restricted && docker_network.is_none() {
        return Err(invalid(
            "MCP_K8S_NETWORK_DEFAULT",
            default.name(),
            "a mode the Docker backend can run: `restricted` there is the network MCP_K8S_DOCKER_NETWORK names, and it is unset; set it, or choose another default",
        ));
    }
    Ok(())
}

/// A Docker network's name as Docker accepts it (`[a-zA-Z0-9][a-zA-Z0-9_.-]*`).
/// `host` is refused: it would give every job the host's network stack.
fn parse_docker_network(value: &str) -> Result<String, Error> {
    let mut chars = value.chars();
    let valid = chars.next().is_some_and(|first| first.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && value != "host";
    if !valid {
        return Err(invalid("MCP_K8S_DOCKER_NETWORK", value, "a Docker network's name (letters, digits, `_`, `.`, `-`), not `host`"));
    }
    Ok(value.to_string())
}

/// Only Unix sockets: the Docker client speaks nothing else.
fn parse_docker_host(value: &str) -> Result<String, Error> {
    match value.strip_prefix("unix://") {
        Some(path) if path.starts_with('/') => Ok(value.to_string()),
        _ => Err(invalid("MCP_K8S_DOCKER_HOST", value, "unix:///path/to/docker.sock")),
    }
}

fn parse_transport(value: Option<&str>) -> Result<Transport, Error> {
    match value.unwrap_or(settings::default_of("MCP_K8S_TRANSPORT")) {
        "stdio" => Ok(Transport::Stdio),
        "http" | "sse" => Ok(Transport::Http),
        other => Err(invalid("MCP_K8S_TRANSPORT", other, "one of stdio, http, sse")),
    }
}

/// `host:port` where an empty host means all interfaces (`:8080`, as in the
/// original), `localhost` means 127.0.0.1 and IPv6 hosts are bracketed.
/// Names other than localhost are refused rather than resolved, so the
/// address is known before anything listens.
fn parse_addr(text: &str) -> Result<SocketAddr, Error> {
    parse_addr_of("MCP_K8S_ADDR", text)
}

fn parse_addr_of(variable: &'static str, text: &str) -> Result<SocketAddr, Error> {
    let expected = "host:port such as :8080, 127.0.0.1:8080 or [::1]:8080";
    let (host, port) = text.rsplit_once(':').ok_or_else(|| invalid(variable, text, expected))?;
    let port: u16 = port.parse().map_err(|_| invalid(variable, text, expected))?;
    let ip = match host {
        "" => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
        bracketed if bracketed.starts_with('[') && bracketed.ends_with(']') => {
            bracketed[1..bracketed.len() - 1].parse().map_err(|_| invalid(variable, text, expected))?
        }
        plain => plain.parse().map_err(|_| invalid(variable, text, expected))?,
    };
    Ok(SocketAddr::new(ip, port))
}

/// MCP_K8S_PROBE_ADDR: the probes' own listener. Over stdio there is no
/// HTTP at all, and on MCP_K8S_ADDR's own port (unless that is 0, any
/// free port) it could never bind: both refused at start.
fn parse_probe_addr(raw: &RawConfig, transport: Transport) -> Result<Option<SocketAddr>, Error> {
    let Some(given) = raw.probe_addr.as_deref() else { return Ok(None) };
    let probe_addr = parse_addr_of("MCP_K8S_PROBE_ADDR", given)?;
    if transport == Transport::Stdio {
        return Err(Error::Conflict {
            variable: "MCP_K8S_PROBE_ADDR",
            other: "MCP_K8S_TRANSPORT",
            why: "over stdio nothing listens for HTTP; use MCP_K8S_TRANSPORT=http or unset MCP_K8S_PROBE_ADDR",
        });
    }
    let addr = parse_addr(text(&raw.addr, "MCP_K8S_ADDR"))?;
    if probe_addr.port() != 0 && probe_addr.port() == addr.port() {
        return Err(Error::Conflict {
            variable: "MCP_K8S_PROBE_ADDR",
            other: "the same port as MCP_K8S_ADDR",
            why: "the probes' listener needs a port of its own, such as :8081",
        });
    }
    Ok(Some(probe_addr))
}

/// RFC 1123 label, what Kubernetes accepts as a namespace name.
fn parse_namespace(text: &str) -> Result<String, Error> {
    let valid_chars = text.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let valid_ends = !text.starts_with('-') && !text.ends_with('-');
    if text.is_empty() || text.len() > 63 || !valid_chars || !valid_ends {
        return Err(invalid(
            "MCP_K8S_NAMESPACE",
            text,
            "a namespace name: 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit",
        ));
    }
    Ok(text.to_string())
}

/// Syntax check of a Kubernetes quantity: a decimal number with an optional
/// binary (Ki..Ei), decimal (n, u, m, k, M..E) or exponent suffix.
fn quantity(value: &Option<String>, variable: &'static str) -> Result<Quantity, Error> {
    let text = text(value, variable);
    match Quantity::parse(text) {
        Ok(quantity) if !quantity.is_zero() => Ok(quantity),
        _ => Err(invalid(variable, text, "a Kubernetes quantity above zero such as 500m, 1, 2.5, 512Mi or 1G")),
    }
}

/// The smallest workdir: a run's input files, its runner's frames and a
/// small program's output fit; below it every run fails at its first write.
const MIN_WORKDIR_BYTES: i128 = 1 << 20;
/// The largest: the workdir is a Kubernetes emptyDir on the node's disk or
/// a Docker tmpfs in its memory, and no node has more; a larger value is
/// a typo (`1E`, a byte count meant as mebibytes the other way round).
const MAX_WORKDIR_BYTES: i128 = 1 << 40;

/// MCP_K8S_WORKDIR_SIZE: a quantity from 1Mi to 1Ti.
fn workdir_size(value: &Option<String>) -> Result<Quantity, Error> {
    const VARIABLE: &str = "MCP_K8S_WORKDIR_SIZE";
    let quantity = quantity(value, VARIABLE)?;
    let bytes = quantity.nanos() / 1_000_000_000;
    if (MIN_WORKDIR_BYTES..=MAX_WORKDIR_BYTES).contains(&bytes) {
        return Ok(quantity);
    }
    Err(invalid(VARIABLE, quantity.as_str(), "a size from 1Mi to 1Ti (a bare number is bytes: write 512Mi or 2Gi)"))
}

/// A default request, held to the range a caller's `limits` are held to:
/// a default of `64` (bytes) would make every run fail at container start.
fn request(value: &Option<String>, variable: &'static str, resource: Resource) -> Result<Quantity, Error> {
    let quantity = quantity(value, variable)?;
    match quantity.check_limit(resource) {
        Ok(()) => Ok(quantity),
        Err(why) => Err(invalid(variable, quantity.as_str(), &format!("a {} quantity a run can use: this one {why}", resource.name()))),
    }
}

/// The folder must exist at start (a typo should stop the server, not make
/// every snippet unknown); what is in it is read at each call.
fn parse_snippets_dir(text: &str) -> Result<PathBuf, Error> {
    match std::fs::metadata(text) {
        Ok(metadata) if metadata.is_dir() => Ok(PathBuf::from(text)),
        Ok(_) => Err(invalid("MCP_K8S_SNIPPETS_DIR", text, "a folder, not a file")),
        Err(error) => Err(invalid("MCP_K8S_SNIPPETS_DIR", text, &format!("an existing folder ({error})"))),
    }
}

/// `stderr`, or an absolute path; whether the file can be written is
/// checked when it is opened at start (`audit::init`).
/// Where and how much the output store keeps (`outputs`).
#[derive(Clone, Debug, PartialEq)]
pub struct OutputsSettings {
    pub dir: PathBuf,
    pub max_run_bytes: u64,
    pub max_bytes: u64,
}

fn parse_outputs(raw: &RawConfig) -> Result<Option<OutputsSettings>, Error> {
    let max_run_bytes = number(&raw.outputs_max_run_bytes, "MCP_K8S_OUTPUTS_MAX_RUN_BYTES", 1 << 20, 64 << 30)?;
    let max_bytes = number(&raw.outputs_max_bytes, "MCP_K8S_OUTPUTS_MAX_BYTES", 1 << 20, 1 << 50)?;
    let Some(dir) = raw.outputs_dir.as_deref() else { return Ok(None) };
    let dir = absolute_path(dir, "MCP_K8S_OUTPUTS_DIR")?;
    if max_run_bytes > max_bytes {
        return Err(invalid(
            "MCP_K8S_OUTPUTS_MAX_RUN_BYTES",
            &max_run_bytes.to_string(),
            "at most MCP_K8S_OUTPUTS_MAX_BYTES: one run cannot keep more than all runs together",
        ));
    }
    Ok(Some(OutputsSettings { dir: PathBuf::from(dir), max_run_bytes, max_bytes }))
}

fn parse_otlp_endpoint(text: &str) -> Result<String, Error> {
    match crate::trace::traces_url(text) {
        Ok(_) => Ok(text.trim().to_string()),
        Err(why) => Err(invalid("MCP_K8S_OTLP_ENDPOINT", text, &format!("an OTLP/HTTP URL such as http://collector:4318 (it {why})"))),
    }
}

fn parse_audit_log(text: &str) -> Result<crate::audit::Sink, Error> {
    match text {
        "stderr" => Ok(crate::audit::Sink::Stderr),
        path if path.starts_with('/') && !path.ends_with('/') => Ok(crate::audit::Sink::File(PathBuf::from(path))),
        _ => Err(invalid("MCP_K8S_AUDIT_LOG", text, "stderr, or the absolute path of a file to append to")),
    }
}

fn absolute_path(text: &str, variable: &'static str) -> Result<String, Error> {
    if !text.starts_with('/') || text.contains(char::is_whitespace) {
        return Err(invalid(variable, text, "an absolute path without spaces"));
    }
    Ok(text.to_string())
}

fn image(text: &str, variable: &'static str) -> Result<String, Error> {
    if text.is_empty() || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(variable, text, "an image reference such as busybox:1.36, without spaces"));
    }
    Ok(text.to_string())
}

/// The one allowlist every path checks: MCP_K8S_ALLOWED_IMAGES, and the
/// images the operator's languages file names (the operator chose them).
/// A built-in language's image runs only when the list allows it.
fn allowlist(value: Option<&str>, operator_images: &[String]) -> Result<Allowlist, Error> {
    let written = Allowlist::parse(value.unwrap_or("")).map_err(|(entry, why)| {
        invalid(
            "MCP_K8S_ALLOWED_IMAGES",
            &entry,
            &format!("comma-separated image references, each like python:3.12-slim, ghcr.io/org/* or golang:* ({why})"),
        )
    })?;
    written.with_images(operator_images).map_err(|(entry, why)| invalid("MCP_K8S_LANGUAGES", &entry, &why))
}

fn csv(value: Option<&str>) -> Vec<String> {
    value.unwrap_or("").split(',').map(str::trim).filter(|item| !item.is_empty()).map(str::to_string).collect()
}

fn parse_clone(raw: &RawConfig) -> Result<Option<CloneConfig>, Error> {
    match (&raw.clone_image, &raw.clone_secret) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(Error::Unpaired { set: "MCP_K8S_CLONE_IMAGE", missing: "MCP_K8S_CLONE_SECRET" }),
        (None, Some(_)) => Err(Error::Unpaired { set: "MCP_K8S_CLONE_SECRET", missing: "MCP_K8S_CLONE_IMAGE" }),
        (Some(image_text), Some(secret)) => {
            Ok(Some(CloneConfig { image: image(image_text, "MCP_K8S_CLONE_IMAGE")?, secret: object_name(secret, "MCP_K8S_CLONE_SECRET")? }))
        }
    }
}

fn parse_cache(raw: &RawConfig) -> Result<Option<CacheConfig>, Error> {
    match (&raw.cache_pvc, &raw.cache_mount_path) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(Error::Unpaired { set: "MCP_K8S_CACHE_PVC", missing: "MCP_K8S_CACHE_MOUNT_PATH" }),
        (None, Some(_)) => Err(Error::Unpaired { set: "MCP_K8S_CACHE_MOUNT_PATH", missing: "MCP_K8S_CACHE_PVC" }),
        (Some(pvc), Some(mount_path)) => {
            if !mount_path.starts_with('/') || mount_path.split('/').any(|part| part == "..") {
                return Err(invalid("MCP_K8S_CACHE_MOUNT_PATH", mount_path, "an absolute path without `..`"));
            }
            Ok(Some(CacheConfig { pvc: object_name(pvc, "MCP_K8S_CACHE_PVC")?, mount_path: mount_path.clone() }))
        }
    }
}

/// RFC 1123 subdomain, the rule for Secret and PVC names.
fn object_name(text: &str, variable: &'static str) -> Result<String, Error> {
    let valid_chars = text.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    let valid_ends = text.starts_with(|c: char| c.is_ascii_alphanumeric()) && text.ends_with(|c: char| c.is_ascii_alphanumeric());
    if text.len() > 253 || !valid_chars || !valid_ends {
        return Err(invalid(variable, text, "a Kubernetes object name: lowercase letters, digits, '-' or '.'"));
    }
    Ok(text.to_string())
}

fn parse_extra_env(value: Option<&str>) -> Result<BTreeMap<String, String>, Error> {
    const EXPECTED: &str = "a JSON object of string values, such as {\"HTTP_PROXY\":\"http://proxy:3128\"}";
    let Some(text) = value else {
        return Ok(BTreeMap::new());
    };
    // The value may hold credentials, so errors never echo it.
    let hidden = "<JSON not shown>";
    let parsed: serde_json::Value = serde_json::from_str(text).map_err(|_| invalid("MCP_K8S_JOB_EXTRA_ENV", hidden, EXPECTED))?;
    let serde_json::Value::Object(object) = parsed else {
        return Err(invalid("MCP_K8S_JOB_EXTRA_ENV", hidden, EXPECTED));
    };
    let mut env = BTreeMap::new();
    for (name, value) in object {
        if !is_env_name(&name) {
            return Err(invalid("MCP_K8S_JOB_EXTRA_ENV", &name, "variable names of letters, digits and '_', not starting with a digit"));
        }
        let serde_json::Value::String(value) = value else {
            return Err(invalid("MCP_K8S_JOB_EXTRA_ENV", &name, "a string value for every variable"));
        };
        env.insert(name, value);
    }
    Ok(env)
}

/// Browser origins: `scheme://host[:port]`, compared exactly later.
fn parse_origins(value: Option<&str>) -> Result<Vec<String>, Error> {
    csv(value)
        .into_iter()
        .map(|origin| {
            let well_formed = (origin.starts_with("http://") || origin.starts_with("https://"))
                && !origin.ends_with('/')
                && origin.split("://").nth(1).is_some_and(|rest| !rest.is_empty() && !rest.contains('/'));
            if well_formed {
                Ok(origin)
            } else {
                Err(invalid("MCP_K8S_ALLOWED_ORIGINS", &origin, "origins such as https://app.example.com, comma-separated"))
            }
        })
        .collect()
}

fn parse_log_level(value: Option<&str>) -> Result<Level, Error> {
    let text = value.unwrap_or(settings::default_of("MCP_K8S_LOG_LEVEL"));
    Level::parse(text)
        .ok_or_else(|| invalid("MCP_K8S_LOG_LEVEL", text, "one of debug, info, notice, warning, error, critical, alert, emergency"))
}

fn parse_fence_modes(value: Option<&str>) -> Result<crate::network::FenceModes, Error> {
    use crate::network::FenceModes;
    match value.unwrap_or(settings::default_of("MCP_K8S_AWAIT_NETWORK_POLICY")) {
        "auto" => Ok(FenceModes::Closed),
        "0" | "false" => Ok(FenceModes::Never),
        "1" | "true" => Ok(FenceModes::All),
        other => Err(invalid("MCP_K8S_AWAIT_NETWORK_POLICY", other, "auto, 1 or 0")),
    }
}

/// The fixtures answer to names a deployment's callers could call by
/// mistake (`greet`, `test://static-text`), so they are a test server's
/// only: refused unless the test hooks are on too, and refused beside any
/// setting that only a deployment has (a token, callers, sites).
fn parse_conformance_fixtures(raw: &RawConfig, transport: Transport) -> Result<bool, Error> {
    const VARIABLE: &str = "MCP_K8S_CONFORMANCE_FIXTURES";
    if !parse_flag(raw.conformance_fixtures.as_deref(), VARIABLE)? {
        return Ok(false);
    }
    let deployment = [
        ("MCP_K8S_AUTH_TOKEN", raw.auth_token.is_some()),
        ("MCP_K8S_AUTH_TOKENS_FILE", raw.auth_tokens_file.is_some()),
        ("MCP_K8S_SITES", raw.sites.is_some()),
    ];
    if let Some((other, _)) = deployment.into_iter().find(|(_, set)| *set) {
        return Err(Error::Conflict { variable: VARIABLE, other, why: "the fixtures are for a test server only; unset one of them" });
    }
    // Over HTTP, only this machine may reach them (a bad address is
    // MCP_K8S_ADDR's own error, reported where it is parsed).
    let addr = parse_addr(text(&raw.addr, "MCP_K8S_ADDR"));
    if transport == Transport::Http && addr.is_ok_and(|addr| !addr.ip().is_loopback()) {
        return Err(Error::Conflict {
            variable: VARIABLE,
            other: "MCP_K8S_ADDR off loopback",
            why: "the fixtures are for a test server only; listen on 127.0.0.1 or [::1]",
        });
    }
    if !parse_flag(raw.test_tools.as_deref(), "MCP_K8S_TEST_TOOLS")? {
        return Err(Error::Conflict {
            variable: VARIABLE,
            other: "MCP_K8S_TEST_TOOLS unset",
            why: "the fixtures are for a test server only; set MCP_K8S_TEST_TOOLS=1 as well",
        });
    }
    Ok(true)
}

/// The test server's settings are refused by a build without its code
/// (`built` false: no `testing` feature), not ignored: a server started
/// for a test that quietly lacked its hooks would fail far from the cause,
/// and one started in production with them set is told they do nothing.
/// `0` asks for nothing and is taken.
fn check_test_settings_built(raw: &RawConfig, built: bool) -> Result<(), Error> {
    if built {
        return Ok(());
    }
    let asked = [
        ("MCP_K8S_TEST_TOOLS", parse_flag(raw.test_tools.as_deref(), "MCP_K8S_TEST_TOOLS")?),
        ("MCP_K8S_CONFORMANCE_FIXTURES", parse_flag(raw.conformance_fixtures.as_deref(), "MCP_K8S_CONFORMANCE_FIXTURES")?),
        ("MCP_K8S_TEST_PANIC_THREAD", raw.test_panic_thread.is_some()),
    ];
    match asked.into_iter().find(|(_, on)| *on) {
        Some((variable, _)) => Err(Error::NotInThisBuild { variable }),
        None => Ok(()),
    }
}

/// A test hook's switch: `1` or `0` only, as its error says (an earlier
/// version also took `true` and `false` while asking for 1 or 0).
fn parse_flag(value: Option<&str>, variable: &'static str) -> Result<bool, Error> {
    // An empty default (the test hooks') is unset, as an empty value is.
    match value.unwrap_or(settings::default_of(variable)) {
        "" | "0" => Ok(false),
        "1" => Ok(true),
        other => Err(invalid(variable, other, "1 or 0")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(pairs: &[(&str, &str)]) -> RawConfig {
        let table: BTreeMap<String, String> = pairs.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect();
        RawConfig::from_lookup(|name| table.get(name).cloned())
    }

    fn error_of(pairs: &[(&str, &str)]) -> String {
        match Config::from_raw(&raw(pairs)) {
            Ok(_) => panic!("{pairs:?} was accepted"),
            Err(error) => error.to_string(),
        }
    }

    /// Each setting given its documented default (`SETTINGS`, which
    /// `--help` prints and the README's table is held to) makes the same
    /// configuration as leaving it unset: the default a user reads is the
    /// one the parse uses.
    #[test]
    fn every_documented_default_is_the_one_the_parse_uses() {
        let unset = format!("{:?}", Config::from_raw(&RawConfig::default()).unwrap());
        for setting in SETTINGS.iter().filter(|setting| !setting.default.is_empty()) {
            let mut given = RawConfig::default();
            *setting.slot(&mut given) = Some(setting.default.to_string());
            let config = Config::from_raw(&given).unwrap_or_else(|error| panic!("{}={}: {error}", setting.env, setting.default));
            assert_eq!(format!("{config:?}"), unset, "{} given its default `{}`", setting.env, setting.default);
        }
    }

    #[test]
    fn defaults_match_the_original() {
        let config = Config::from_raw(&RawConfig::default()).unwrap();
        assert_eq!(config.transport, Transport::Stdio);
        assert_eq!(config.addr, "0.0.0.0:8080".parse().unwrap());
        assert!(config.auth_token.is_none());
        assert_eq!(config.namespace, "mcp-ephemeral");
        assert_eq!(config.kubeconfig, None);
        assert_eq!((config.default_timeout_s, config.max_timeout_s), (60, 600));
        assert_eq!((config.max_output_bytes, config.max_artifact_bytes), (1_048_576, 10_485_760));
        assert_eq!((config.default_cpu.as_str(), config.default_memory.as_str()), ("1", "512Mi"));
        assert_eq!(config.max_concurrent, 10);
        assert!(config.allowed_images.is_empty());
        assert_eq!((config.clone, config.cache), (None, None));
        assert!(config.job_extra_env.is_empty());
        assert_eq!(config.log_level, Level::Info);
        assert!(!config.test_tools);
    }

    #[test]
    fn the_fence_wait_is_on_for_the_closed_modes_unless_told_otherwise() {
        use crate::network::FenceModes;
        type Case<'a> = (&'a [(&'a str, &'a str)], FenceModes, u64);
        let cases: &[Case] = &[
            (&[], FenceModes::Closed, 10),
            (&[("MCP_K8S_AWAIT_NETWORK_POLICY", "auto")], FenceModes::Closed, 10),
            (&[("MCP_K8S_AWAIT_NETWORK_POLICY", "1")], FenceModes::All, 10),
            (&[("MCP_K8S_AWAIT_NETWORK_POLICY", "true")], FenceModes::All, 10),
            (&[("MCP_K8S_AWAIT_NETWORK_POLICY", "0")], FenceModes::Never, 10),
            (&[("MCP_K8S_AWAIT_NETWORK_POLICY", "false"), ("MCP_K8S_NETWORK_POLICY_WAIT_S", "30")], FenceModes::Never, 30),
        ];
        for (pairs, modes, wait_s) in cases {
            let config = Config::from_raw(&raw(pairs)).unwrap();
            assert_eq!((config.await_network_policy, config.network_policy_wait_s), (*modes, *wait_s), "{pairs:?}");
        }
        assert!(error_of(&[("MCP_K8S_AWAIT_NETWORK_POLICY", "yes")]).contains("auto, 1 or 0"));
        assert!(error_of(&[("MCP_K8S_NETWORK_POLICY_WAIT_S", "0")]).contains("MCP_K8S_NETWORK_POLICY_WAIT_S"));
    }

    #[test]
    fn every_setting_default_in_the_table_is_accepted_and_matches() {
        let pairs: Vec<(&str, &str)> =
            SETTINGS.iter().filter(|setting| !setting.default.is_empty()).map(|setting| (setting.env, setting.default)).collect();
        let from_table = Config::from_raw(&raw(&pairs)).unwrap();
        let from_nothing = Config::from_raw(&RawConfig::default()).unwrap();
        assert_eq!(format!("{from_table:?}"), format!("{from_nothing:?}"));
    }

    #[test]
    fn good_settings() {
        let config = Config::from_raw(&raw(&[
            ("MCP_K8S_TRANSPORT", "sse"),
            ("MCP_K8S_ADDR", "[::1]:0"),
            ("MCP_K8S_AUTH_TOKEN", "s3cret"),
            ("MCP_K8S_ALLOWED_IMAGES", " python:3.12 , golang ,,"),
            ("MCP_K8S_DEFAULT_TIMEOUT_S", "600"),
            ("MCP_K8S_DEFAULT_CPU", "250m"),
            ("MCP_K8S_DEFAULT_MEMORY", "1.5Gi"),
            ("MCP_K8S_CLONE_IMAGE", "alpine/git:2.45"),
            ("MCP_K8S_CLONE_SECRET", "git-creds"),
            ("MCP_K8S_CACHE_PVC", "build-cache"),
            ("MCP_K8S_CACHE_MOUNT_PATH", "/cache"),
            ("MCP_K8S_JOB_EXTRA_ENV", r#"{"B":"2","A_1":"1"}"#),
            ("MCP_K8S_ALLOWED_ORIGINS", "https://app.example.com,http://10.0.0.1:3000"),
            ("MCP_K8S_LOG_LEVEL", "debug"),
            ("MCP_K8S_TEST_TOOLS", "1"),
            ("MCP_K8S_TEST_PANIC_THREAD", "http-connection"),
        ]))
        .unwrap();
        assert_eq!(config.transport, Transport::Http);
        assert_eq!(config.addr, "[::1]:0".parse().unwrap());
        assert!(config.binds_loopback());
        assert_eq!(config.auth_token.as_ref().map(|token| token.0.as_str()), Some("s3cret"));
        assert_eq!(config.allowed_images.as_written, ["python:3.12", "golang"]);
        assert_eq!(config.clone.unwrap().secret, "git-creds");
        assert_eq!(config.cache.unwrap().mount_path, "/cache");
        assert_eq!(config.job_extra_env.keys().collect::<Vec<_>>(), ["A_1", "B"]);
        assert_eq!(config.allowed_origins.len(), 2);
        assert!(config.test_tools);
        assert_eq!(config.test_panic_thread, Some(supervise::Kind::HttpConnection));
    }

    #[test]
    fn addresses() {
        let cases =
            [(":8080", "0.0.0.0:8080"), ("localhost:9000", "127.0.0.1:9000"), ("127.0.0.1:0", "127.0.0.1:0"), ("[::]:80", "[::]:80")];
        for (text, expected) in cases {
            assert_eq!(parse_addr(text), Ok(expected.parse().unwrap()), "{text}");
        }
    }

    #[test]
    fn bad_settings_name_the_variable_and_the_accepted_values() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("MCP_K8S_TRANSPORT", "grpc")], "MCP_K8S_TRANSPORT: `grpc` is not accepted; expected one of stdio, http, sse"),
            (&[("MCP_K8S_ADDR", "8080")], "MCP_K8S_ADDR: `8080` is not accepted; expected host:port"),
            (
                &[("MCP_K8S_TRANSPORT", "http"), ("MCP_K8S_PROBE_ADDR", "8081")],
                "MCP_K8S_PROBE_ADDR: `8081` is not accepted; expected host:port",
            ),
            (
                &[("MCP_K8S_PROBE_ADDR", ":8081")],
                "MCP_K8S_PROBE_ADDR cannot be used with MCP_K8S_TRANSPORT: over stdio nothing listens for HTTP",
            ),
            (
                &[("MCP_K8S_TRANSPORT", "http"), ("MCP_K8S_ADDR", "127.0.0.1:8080"), ("MCP_K8S_PROBE_ADDR", ":8080")],
                "MCP_K8S_PROBE_ADDR cannot be used with the same port as MCP_K8S_ADDR: the probes' listener needs a port of its own",
            ),
            (&[("MCP_K8S_ADDR", "example.com:80")], "MCP_K8S_ADDR: `example.com:80` is not accepted"),
            (&[("MCP_K8S_ADDR", ":99999")], "MCP_K8S_ADDR: `:99999` is not accepted"),
            (&[("MCP_K8S_NAMESPACE", "Prod")], "MCP_K8S_NAMESPACE: `Prod` is not accepted; expected a namespace name"),
            (&[("MCP_K8S_NAMESPACE", "-x")], "MCP_K8S_NAMESPACE: `-x`"),
            (
                &[("MCP_K8S_DEFAULT_TIMEOUT_S", "ten")],
                "MCP_K8S_DEFAULT_TIMEOUT_S: `ten` is not accepted; expected a whole number from 1 to 86400",
            ),
            (&[("MCP_K8S_DEFAULT_TIMEOUT_S", "-1")], "MCP_K8S_DEFAULT_TIMEOUT_S: `-1` is not accepted"),
            (&[("MCP_K8S_DEFAULT_TIMEOUT_S", "0")], "MCP_K8S_DEFAULT_TIMEOUT_S: `0` is out of range; accepted: 1 to 86400"),
            (&[("MCP_K8S_MAX_TIMEOUT_S", "100000")], "MCP_K8S_MAX_TIMEOUT_S: `100000` is out of range"),
            (
                &[("MCP_K8S_DEFAULT_TIMEOUT_S", "700")],
                "MCP_K8S_DEFAULT_TIMEOUT_S: `700` is above MCP_K8S_MAX_TIMEOUT_S (600); lower it or raise MCP_K8S_MAX_TIMEOUT_S",
            ),
            (&[("MCP_K8S_MAX_OUTPUT_BYTES", "12")], "MCP_K8S_MAX_OUTPUT_BYTES: `12` is out of range; accepted: 1024 to"),
            (&[("MCP_K8S_MAX_ARTIFACT_BYTES", "1e6")], "MCP_K8S_MAX_ARTIFACT_BYTES: `1e6` is not accepted"),
            (&[("MCP_K8S_DEFAULT_CPU", "one")], "MCP_K8S_DEFAULT_CPU: `one` is not accepted; expected a Kubernetes quantity"),
            (&[("MCP_K8S_DEFAULT_CPU", "1..5")], "MCP_K8S_DEFAULT_CPU: `1..5`"),
            (&[("MCP_K8S_DEFAULT_MEMORY", "512MB")], "MCP_K8S_DEFAULT_MEMORY: `512MB` is not accepted"),
            (
                &[("MCP_K8S_DEFAULT_MEMORY", "64")],
                "MCP_K8S_DEFAULT_MEMORY: `64` is not accepted; expected a memory quantity a run can use: this one is below the minimum of 16Mi",
            ),
            (
                &[("MCP_K8S_DEFAULT_MEMORY", "2Ti")],
                "MCP_K8S_DEFAULT_MEMORY: `2Ti` is not accepted; expected a memory quantity a run can use: this one is over the maximum of 1Ti",
            ),
            (
                &[("MCP_K8S_DEFAULT_CPU", "100u")],
                "MCP_K8S_DEFAULT_CPU: `100u` is not accepted; expected a cpu quantity a run can use: this one is below the minimum of 1m",
            ),
            (
                &[("MCP_K8S_DEFAULT_CPU", "2000")],
                "MCP_K8S_DEFAULT_CPU: `2000` is not accepted; expected a cpu quantity a run can use: this one is over the maximum of 1024 cores",
            ),
            (&[("MCP_K8S_MAX_CONCURRENT", "0")], "MCP_K8S_MAX_CONCURRENT: `0` is out of range; accepted: 1 to 1000"),
            (&[("MCP_K8S_ALLOWED_IMAGES", "python:3, bad image")], "MCP_K8S_ALLOWED_IMAGES: `bad image` is not accepted"),
            (&[("MCP_K8S_SIDECAR_IMAGE", "busy box")], "MCP_K8S_SIDECAR_IMAGE: `busy box`"),
            (&[("MCP_K8S_CLONE_IMAGE", "alpine/git")], "MCP_K8S_CLONE_IMAGE is set but MCP_K8S_CLONE_SECRET is not; set both or neither"),
            (&[("MCP_K8S_CLONE_SECRET", "creds")], "MCP_K8S_CLONE_SECRET is set but MCP_K8S_CLONE_IMAGE is not"),
            (&[("MCP_K8S_CLONE_IMAGE", "git"), ("MCP_K8S_CLONE_SECRET", "Creds!")], "MCP_K8S_CLONE_SECRET: `Creds!` is not accepted"),
            (&[("MCP_K8S_CACHE_PVC", "cache")], "MCP_K8S_CACHE_PVC is set but MCP_K8S_CACHE_MOUNT_PATH is not"),
            (&[("MCP_K8S_CACHE_MOUNT_PATH", "/cache")], "MCP_K8S_CACHE_MOUNT_PATH is set but MCP_K8S_CACHE_PVC is not"),
            (
                &[("MCP_K8S_CACHE_PVC", "c"), ("MCP_K8S_CACHE_MOUNT_PATH", "cache")],
                "MCP_K8S_CACHE_MOUNT_PATH: `cache` is not accepted; expected an absolute path",
            ),
            (&[("MCP_K8S_CACHE_PVC", "c"), ("MCP_K8S_CACHE_MOUNT_PATH", "/a/../b")], "MCP_K8S_CACHE_MOUNT_PATH: `/a/../b`"),
            (
                &[("MCP_K8S_JOB_EXTRA_ENV", "{not json")],
                "MCP_K8S_JOB_EXTRA_ENV: `<JSON not shown>` is not accepted; expected a JSON object",
            ),
            (&[("MCP_K8S_JOB_EXTRA_ENV", "[1]")], "MCP_K8S_JOB_EXTRA_ENV: `<JSON not shown>`"),
            (&[("MCP_K8S_JOB_EXTRA_ENV", r#"{"1X":"a"}"#)], "MCP_K8S_JOB_EXTRA_ENV: `1X` is not accepted; expected variable names"),
            (&[("MCP_K8S_JOB_EXTRA_ENV", r#"{"X":1}"#)], "MCP_K8S_JOB_EXTRA_ENV: `X` is not accepted; expected a string value"),
            (&[("MCP_K8S_MAX_MESSAGE_BYTES", "100")], "MCP_K8S_MAX_MESSAGE_BYTES: `100` is out of range"),
            (&[("MCP_K8S_SESSION_TTL_S", "0")], "MCP_K8S_SESSION_TTL_S: `0` is out of range"),
            (&[("MCP_K8S_MAX_SESSIONS", "0")], "MCP_K8S_MAX_SESSIONS: `0` is out of range; accepted: 1 to 1000000"),
            (&[("MCP_K8S_MAX_CONNECTIONS", "many")], "MCP_K8S_MAX_CONNECTIONS: `many` is not accepted; expected a whole number"),
            (&[("MCP_K8S_MAX_HEADER_BYTES", "100")], "MCP_K8S_MAX_HEADER_BYTES: `100` is out of range; accepted: 1024 to"),
            (&[("MCP_K8S_MAX_HEADERS", "1")], "MCP_K8S_MAX_HEADERS: `1` is out of range"),
            (&[("MCP_K8S_BODY_BUDGET_BYTES", "1")], "MCP_K8S_BODY_BUDGET_BYTES: `1` is out of range"),
            (
                &[("MCP_K8S_TRANSPORT", "http"), ("MCP_K8S_MAX_MESSAGE_BYTES", "40000000")],
                "MCP_K8S_MAX_MESSAGE_BYTES: `40000000` is above MCP_K8S_BODY_BUDGET_BYTES (33554432); lower it or raise MCP_K8S_BODY_BUDGET_BYTES",
            ),
            (&[("MCP_K8S_HEAD_TIMEOUT_S", "0")], "MCP_K8S_HEAD_TIMEOUT_S: `0` is out of range; accepted: 1 to 3600"),
            (&[("MCP_K8S_BODY_TIMEOUT_S", "x")], "MCP_K8S_BODY_TIMEOUT_S: `x`"),
            (&[("MCP_K8S_IDLE_TIMEOUT_S", "4000")], "MCP_K8S_IDLE_TIMEOUT_S: `4000` is out of range"),
            (&[("MCP_K8S_WRITE_TIMEOUT_S", "-1")], "MCP_K8S_WRITE_TIMEOUT_S: `-1`"),
            (&[("MCP_K8S_MAX_REPLY_QUEUE_BYTES", "1000")], "MCP_K8S_MAX_REPLY_QUEUE_BYTES: `1000` is out of range; accepted: 65536 to"),
            (
                &[("MCP_K8S_MAX_MESSAGE_BYTES", "100000000")],
                "MCP_K8S_MAX_MESSAGE_BYTES: `100000000` is out of range; accepted: 4096 to 67108864",
            ),
            (&[("MCP_K8S_ALLOWED_ORIGINS", "example.com")], "MCP_K8S_ALLOWED_ORIGINS: `example.com` is not accepted; expected origins"),
            (&[("MCP_K8S_ALLOWED_ORIGINS", "https://a.example/")], "MCP_K8S_ALLOWED_ORIGINS: `https://a.example/`"),
            (&[("MCP_K8S_SHUTDOWN_GRACE_S", "soon")], "MCP_K8S_SHUTDOWN_GRACE_S: `soon`"),
            (&[("MCP_K8S_WARM_POOLS", "/nonexistent/pools.json")], "MCP_K8S_WARM_POOLS: cannot read `/nonexistent/pools.json`: "),
            (
                &[("MCP_K8S_WARM_POOLS", "/nonexistent/pools.json"), ("MCP_K8S_CACHE_PVC", "c"), ("MCP_K8S_CACHE_MOUNT_PATH", "/cache")],
                "MCP_K8S_WARM_POOLS cannot be used with MCP_K8S_CACHE_PVC: every run mounts the cache",
            ),
            (&[("MCP_K8S_LOG_LEVEL", "verbose")], "MCP_K8S_LOG_LEVEL: `verbose` is not accepted; expected one of debug, info"),
            (&[("MCP_K8S_TEST_TOOLS", "yes")], "MCP_K8S_TEST_TOOLS: `yes` is not accepted; expected 1 or 0"),
            (&[("MCP_K8S_TEST_PANIC_THREAD", "main")], "MCP_K8S_TEST_PANIC_THREAD: `main` is not accepted; expected one of reaper, pool, "),
            (&[("MCP_K8S_RUNTIME_CLASS", "gVisor")], "MCP_K8S_RUNTIME_CLASS: `gVisor` is not accepted; expected a Kubernetes object name"),
            (&[("MCP_K8S_RUN_AS_USER", "0")], "MCP_K8S_RUN_AS_USER: `0` is out of range"),
            (&[("MCP_K8S_RUNNER_IMAGE", "a b")], "MCP_K8S_RUNNER_IMAGE: `a b`"),
            (&[("MCP_K8S_RUNNER_BINARY_PATH", "bin/x")], "MCP_K8S_RUNNER_BINARY_PATH: `bin/x` is not accepted; expected an absolute path"),
            (&[("MCP_K8S_START_TIMEOUT_S", "1")], "MCP_K8S_START_TIMEOUT_S: `1` is out of range"),
            (&[("MCP_K8S_MAX_QUEUED", "x")], "MCP_K8S_MAX_QUEUED: `x`"),
            (&[("MCP_K8S_RESULT_TTL_S", "5")], "MCP_K8S_RESULT_TTL_S: `5` is out of range"),
            (&[("MCP_K8S_WORKDIR_SIZE", "lots")], "MCP_K8S_WORKDIR_SIZE: `lots`"),
            (
                &[("MCP_K8S_NETWORK_MODES", "none,bridge")],
                "MCP_K8S_NETWORK_MODES: `bridge` is not accepted; expected a comma-separated list of none, restricted, open",
            ),
            (&[("MCP_K8S_NETWORK_MODES", ",,")], "MCP_K8S_NETWORK_MODES: `,,` is not accepted; expected a comma-separated list"),
            (
                &[("MCP_K8S_NETWORK_DEFAULT", "host")],
                "MCP_K8S_NETWORK_DEFAULT: `host` is not accepted; expected one of none, restricted, open",
            ),
            (
                &[("MCP_K8S_NETWORK_MODES", "none, restricted")],
                "MCP_K8S_NETWORK_DEFAULT: `open` is not accepted; expected one of MCP_K8S_NETWORK_MODES (none, restricted); add it there or choose one of those",
            ),
            (
                &[("MCP_K8S_TRANSPORT", "http"), ("MCP_K8S_AUTH_TOKEN", "t"), ("MCP_K8S_AUTH_TOKENS_FILE", "/x.json")],
                "MCP_K8S_AUTH_TOKENS_FILE cannot be used with MCP_K8S_AUTH_TOKEN: the file names every caller",
            ),
            (&[("MCP_K8S_AUTH_TOKENS_FILE", "/x.json")], "MCP_K8S_AUTH_TOKENS_FILE cannot be used with MCP_K8S_TRANSPORT: over stdio"),
            (
                &[("MCP_K8S_CONFORMANCE_FIXTURES", "1")],
                "MCP_K8S_CONFORMANCE_FIXTURES cannot be used with MCP_K8S_TEST_TOOLS unset: the fixtures are for a test server only",
            ),
            (
                &[
                    ("MCP_K8S_CONFORMANCE_FIXTURES", "1"),
                    ("MCP_K8S_TEST_TOOLS", "1"),
                    ("MCP_K8S_TRANSPORT", "http"),
                    ("MCP_K8S_AUTH_TOKEN", "t"),
                ],
                "MCP_K8S_CONFORMANCE_FIXTURES cannot be used with MCP_K8S_AUTH_TOKEN: the fixtures are for a test server only",
            ),
            (
                &[("MCP_K8S_CONFORMANCE_FIXTURES", "1"), ("MCP_K8S_TEST_TOOLS", "1"), ("MCP_K8S_SITES", "/sites.json")],
                "MCP_K8S_CONFORMANCE_FIXTURES cannot be used with MCP_K8S_SITES: the fixtures are for a test server only",
            ),
            (&[("MCP_K8S_CONFORMANCE_FIXTURES", "yes")], "MCP_K8S_CONFORMANCE_FIXTURES: `yes` is not accepted; expected 1 or 0"),
            // Regression: `true` was taken while the error asked for 1 or 0.
            (&[("MCP_K8S_CONFORMANCE_FIXTURES", "true")], "MCP_K8S_CONFORMANCE_FIXTURES: `true` is not accepted; expected 1 or 0"),
            (&[("MCP_K8S_TEST_TOOLS", "true")], "MCP_K8S_TEST_TOOLS: `true` is not accepted; expected 1 or 0"),
            (&[("MCP_K8S_TEST_TOOLS", "false")], "MCP_K8S_TEST_TOOLS: `false` is not accepted; expected 1 or 0"),
            (
                &[("MCP_K8S_CONFORMANCE_FIXTURES", "1"), ("MCP_K8S_TEST_TOOLS", "1"), ("MCP_K8S_TRANSPORT", "http")],
                "MCP_K8S_CONFORMANCE_FIXTURES cannot be used with MCP_K8S_ADDR off loopback: the fixtures are for a test server only",
            ),
            (
                &[("MCP_K8S_TRANSPORT", "http"), ("MCP_K8S_AUTH_TOKENS_FILE", "/nonexistent/tokens.json")],
                "MCP_K8S_AUTH_TOKENS_FILE: cannot read `/nonexistent/tokens.json`: ",
            ),
            (
                &[("MCP_K8S_BACKEND", "docker"), ("MCP_K8S_NETWORK_DEFAULT", "restricted")],
                "MCP_K8S_NETWORK_DEFAULT: `restricted` is not accepted; expected a mode the Docker backend can run: `restricted` there is the network MCP_K8S_DOCKER_NETWORK names, and it is unset",
            ),
        ];
        for (pairs, expected) in cases {
            let message = error_of(pairs);
            assert!(message.starts_with(expected), "{pairs:?}\n got: {message}\nwant: {expected}");
        }
    }

    /// A sites file written for one test, and the settings naming it.
    fn sites_file(name: &str, text: &str) -> String {
        let path = std::env::temp_dir().join(format!("mcp-sites-{name}-{}.json", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    #[test]
    fn sites_are_read_with_the_default_first_and_their_own_settings() {
        let path = sites_file(
            "ok",
            r#"[{"name": "local", "backend": "docker", "docker_host": "unix:///run/d.sock"},
                {"name": "eu", "default": true, "backend": "kubernetes", "kubeconfig": "/k/eu", "context": "eu-1", "namespace": "jobs-eu"}]"#,
        );
        let config = Config::from_raw(&raw(&[("MCP_K8S_SITES", &path), ("MCP_K8S_NAMESPACE", "jobs")])).unwrap();
        let names: Vec<&str> = config.sites.iter().map(|site| site.name.as_str()).collect();
        assert_eq!(names, ["eu", "local"], "the default first");
        let eu = &config.sites[0].config;
        assert_eq!((eu.backend, eu.namespace.as_str(), eu.kube_context.as_deref()), (BackendChoice::Kubernetes, "jobs-eu", Some("eu-1")));
        let local = &config.sites[1].config;
        assert_eq!(
            (local.backend, local.docker_host.as_deref(), local.namespace.as_str()),
            (BackendChoice::Docker, Some("unix:///run/d.sock"), "jobs")
        );
        assert!(eu.sites.is_empty() && local.sites.is_empty());
        // Each site keeps the pools that name it; one naming none is the default's.
        let pools = sites_file(
            "pools",
            r#"[{"name": "a", "image": "busybox:1.36", "network": "none", "size": 1},
                {"name": "b", "image": "busybox:1.36", "network": "none", "size": 1, "site": "local"}]"#,
        );
        let config =
            Config::from_raw(&raw(&[("MCP_K8S_SITES", &path), ("MCP_K8S_WARM_POOLS", &pools), ("MCP_K8S_ALLOWED_IMAGES", "busybox:1.36")]))
                .unwrap();
        let kept = |site: &Site| site.config.warm_pools.iter().map(|pool| pool.name.clone()).collect::<Vec<_>>();
        assert_eq!((kept(&config.sites[0]), kept(&config.sites[1])), (vec!["a".to_string()], vec!["b".to_string()]));
        assert_eq!(config.warm_pools.len(), 2, "the server's list names them all");
        let elsewhere =
            sites_file("pools-mars", r#"[{"name": "a", "image": "busybox:1.36", "network": "none", "size": 1, "site": "mars"}]"#);
        let message = error_of(&[("MCP_K8S_SITES", &path), ("MCP_K8S_WARM_POOLS", &elsewhere), ("MCP_K8S_ALLOWED_IMAGES", "busybox:1.36")]);
        assert!(message.ends_with("pool `a`, field `site`: `mars` is not a site here; sites: eu, local"), "{message}");
        let no_sites = error_of(&[("MCP_K8S_WARM_POOLS", &pools), ("MCP_K8S_ALLOWED_IMAGES", "busybox:1.36")]);
        assert!(no_sites.ends_with("pool `b`, field `site`: `local` is not a site here; sites: default"), "{no_sites}");
        for file in [path, pools, elsewhere] {
            let _ = std::fs::remove_file(file);
        }
    }

    #[test]
    fn each_wrong_sites_file_names_the_site_and_what_is_wrong() {
        let cases: &[(&str, &str)] = &[
            ("{}", "must be a JSON list of sites"),
            ("[]", "must be a JSON list of sites"),
            (r#"[{"backend": "docker"}]"#, "site #0: `name` is required, a string"),
            (r#"[{"name": "EU"}]"#, "site #0: name `EU` must be 1 to 32 lowercase letters"),
            (
                r#"[{"name": "eu", "token": "x"}]"#,
                "site `eu`: unknown field `token`; accepted: name, default, backend, kubeconfig, context",
            ),
            (r#"[{"name": "eu", "namespace": 3}]"#, "site `eu`: `namespace` must be a string"),
            (r#"[{"name": "eu", "namespace": "Prod"}]"#, "site `eu`: MCP_K8S_NAMESPACE: `Prod` is not accepted"),
            (r#"[{"name": "eu"}, {"name": "eu"}]"#, "site `eu`: the name is used by an earlier site"),
            (r#"[{"name": "a", "default": true}, {"name": "b", "default": true}]"#, "site `b`: another site is already the default"),
            // Regression: serde_json kept the last of two copies silently.
            (
                r#"[{"name": "eu", "kubeconfig": "/k/a", "kubeconfig": "/k/b"}]"#,
                "key `kubeconfig` appears twice in one object (the second at line 1 column 50); keep one",
            ),
        ];
        for (index, (text, expected)) in cases.iter().enumerate() {
            let path = sites_file(&format!("bad{index}"), text);
            let message = error_of(&[("MCP_K8S_SITES", &path)]);
            assert!(message.starts_with(&format!("MCP_K8S_SITES: `{path}`: ")), "{message}");
            assert!(message.contains(expected), "{text}\n got: {message}\nwant: {expected}");
            let _ = std::fs::remove_file(path);
        }
        assert!(
            error_of(&[("MCP_K8S_SITES", "/nonexistent/sites.json")]).starts_with("MCP_K8S_SITES: cannot read `/nonexistent/sites.json`: ")
        );
    }

    #[test]
    fn network_modes_and_their_defaults() {
        let all = Config::from_raw(&RawConfig::default()).unwrap();
        assert_eq!((all.network_modes.as_slice(), all.network_default), (NetworkMode::ALL.as_slice(), NetworkMode::Open));
        assert_eq!(all.execute_code_network_default(), NetworkMode::None);
        let no_none = Config::from_raw(&raw(&[("MCP_K8S_NETWORK_MODES", "open,restricted,open")])).unwrap();
        assert_eq!(no_none.network_modes, [NetworkMode::Restricted, NetworkMode::Open], "sorted, each once");
        assert_eq!(no_none.execute_code_network_default(), NetworkMode::Open);
        let docker_restricted = Config::from_raw(&raw(&[
            ("MCP_K8S_BACKEND", "docker"),
            ("MCP_K8S_NETWORK_DEFAULT", "restricted"),
            ("MCP_K8S_DOCKER_NETWORK", "egress-allowlist"),
        ]))
        .unwrap();
        assert_eq!(docker_restricted.network_default, NetworkMode::Restricted);
        assert!(docker_restricted.check_docker_network().is_ok());
        let auto_restricted = Config::from_raw(&raw(&[("MCP_K8S_NETWORK_DEFAULT", "restricted")])).unwrap();
        let error = auto_restricted.check_docker_network().unwrap_err().to_string();
        assert!(error.contains("MCP_K8S_NETWORK_DEFAULT") && error.contains("MCP_K8S_DOCKER_NETWORK"), "{error}");
    }

    #[test]
    fn empty_values_count_as_unset() {
        let config = Config::from_raw(&raw(&[("MCP_K8S_TRANSPORT", ""), ("MCP_K8S_AUTH_TOKEN", "")])).unwrap();
        assert_eq!(config.transport, Transport::Stdio);
        assert!(config.auth_token.is_none());
    }

    #[test]
    fn quantities() {
        for good in ["1Mi", "512Mi", "1Gi", "2G", "1e9", "1.5E+9", "100000k", "1Ti", "1048576"] {
            let config = Config::from_raw(&raw(&[("MCP_K8S_WORKDIR_SIZE", good)])).unwrap();
            assert_eq!(config.workdir_size.as_str(), good);
        }
        for bad in ["m", "1..2", "1MB", "1 Gi", "-1", "1e", "Gi1", ".", "0"] {
            let error = Config::from_raw(&raw(&[("MCP_K8S_WORKDIR_SIZE", bad)])).unwrap_err();
            assert!(error.to_string().starts_with("MCP_K8S_WORKDIR_SIZE: "), "{bad}: {error}");
        }
    }

    /// Regression: 2^64-1 bytes and 1000 bytes were taken.
    #[test]
    fn the_workdir_size_is_one_a_node_can_have() {
        for bad in ["18446744073709551615", "1000", "1", "250m", "1048575", "1.5Ti", "1E"] {
            assert_eq!(
                error_of(&[("MCP_K8S_WORKDIR_SIZE", bad)]),
                format!(
                    "MCP_K8S_WORKDIR_SIZE: `{bad}` is not accepted; expected a size from 1Mi to 1Ti (a bare number is bytes: write 512Mi or 2Gi)"
                )
            );
        }
    }

    /// A build without the `testing` feature (`built` false, as releases
    /// are) refuses each test server's setting that asks for something, and
    /// takes `0`; a test build takes them all.
    #[test]
    fn test_settings_are_refused_by_a_build_without_them() {
        type Settings = &'static [(&'static str, &'static str)];
        // The start of the error, or "" for accepted.
        let cases: [(Settings, bool, &str); 9] = [
            (&[], false, ""),
            (&[("MCP_K8S_TEST_TOOLS", "0"), ("MCP_K8S_CONFORMANCE_FIXTURES", "0")], false, ""),
            (&[("MCP_K8S_TEST_TOOLS", "1")], false, "MCP_K8S_TEST_TOOLS is not in this build: "),
            (&[("MCP_K8S_CONFORMANCE_FIXTURES", "1")], false, "MCP_K8S_CONFORMANCE_FIXTURES is not in this build: "),
            (&[("MCP_K8S_TEST_TOOLS", "1"), ("MCP_K8S_CONFORMANCE_FIXTURES", "1")], false, "MCP_K8S_TEST_TOOLS is not in this build: "),
            (&[("MCP_K8S_TEST_PANIC_THREAD", "reaper")], false, "MCP_K8S_TEST_PANIC_THREAD is not in this build: "),
            (&[("MCP_K8S_TEST_TOOLS", "yes")], false, "MCP_K8S_TEST_TOOLS: `yes` is not accepted; expected 1 or 0"),
            (&[("MCP_K8S_TEST_TOOLS", "1"), ("MCP_K8S_TEST_PANIC_THREAD", "reaper")], true, ""),
            (&[("MCP_K8S_CONFORMANCE_FIXTURES", "1")], true, ""),
        ];
        for (pairs, built, expected) in cases {
            let got = check_test_settings_built(&raw(pairs), built).err().map(|error| error.to_string()).unwrap_or_default();
            assert!(got.starts_with(expected) && got.is_empty() == expected.is_empty(), "{pairs:?}, built: {built}: {got}");
        }
        let refused = check_test_settings_built(&raw(&[("MCP_K8S_TEST_TOOLS", "1")]), false).err().map(|error| error.to_string());
        assert_eq!(
            refused.as_deref(),
            Some(
                "MCP_K8S_TEST_TOOLS is not in this build: the test hooks and the conformance fixtures are built for tests only; \
                 unset it, or build with `cargo build --features testing` (cargo test does)"
            )
        );
    }

    #[test]
    fn the_auth_token_never_shows_in_debug_output() {
        let config = Config::from_raw(&raw(&[("MCP_K8S_AUTH_TOKEN", "hunter2")])).unwrap();
        assert!(!format!("{config:?}").contains("hunter2"));
    }
}
