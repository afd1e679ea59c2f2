//! Entry point: wiring only. Parses the command line, then hands over to the
//! chosen mode (the MCP server, or the hidden in-pod runner).
//!
//! `mcp-k8s-ephemeral-job [serve|doctor] [--flag value]...`: the
//! environment (`MCP_K8S_*`) is read first and flags override it. Exit
//! codes: 0 after a clean shutdown, 1 when serving fails (e.g. the port is
//! taken) or a doctor check fails, 2 for bad usage or configuration
//! (including a cache PVC or clone Secret that does not exist).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use mcp_k8s_ephemeral_job::backend::kubernetes::template::PodTemplate;
use mcp_k8s_ephemeral_job::cancel::CancelToken;
use mcp_k8s_ephemeral_job::config::{self, BackendChoice, Config, DockerPull, RawConfig, Transport};
use mcp_k8s_ephemeral_job::protocol::Server;
use mcp_k8s_ephemeral_job::{backend, docker, engine, kube, log, tools, transport};
use serde_json::json;

const NAME: &str = "mcp-k8s-ephemeral-job";

/// What the command line asked for.
enum Command {
    Serve(Box<RawConfig>),
    /// Checks the cluster set-up against the configuration. The hidden
    /// `runner` (the in-pod entrypoint) is dispatched in `main` before any
    /// of this.
    Doctor(Box<RawConfig>),
    Help,
    Version,
}

/// glibc's allocator gives each busy thread an arena of its own (up to 8
/// per core) and keeps what is freed there, and its mmap threshold rises
/// to the largest block freed: after a burst of large messages on many
/// connection threads, memory the server no longer uses stays resident in
/// every arena (a burst of 128 clients left 200 MB). Two arenas, large
/// blocks always mapped (and so returned on free) and trimming past
/// 128 KiB keep the resident set near what is in use. The static musl
/// build (the release images) has no such arenas.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt(3) sets allocator parameters; it is called once, on
    // the main thread, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 10);
    }
}

fn main() -> ExitCode {
    // The in-pod runner is dispatched before anything else: it must not read
    // the server's configuration from an environment that belongs to the
    // caller's command, and its arguments are the engine's, not a person's.
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|first| first == "runner") {
        let code = mcp_k8s_ephemeral_job::runner::main(args.collect());
        return ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1));
    }
    install_panic_hook();
    tune_allocator();
    let command = match parse_command_line(lexopt::Parser::from_env()) {
        Ok(command) => command,
        Err(message) => {
            eprintln!("{NAME}: {message}\nTry `{NAME} --help`.");
            return ExitCode::from(2);
        }
    };
    match command {
        Command::Help => {
            print!("{}", help_text());
            ExitCode::SUCCESS
        }
        Command::Version => {
            println!("{NAME} {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Serve(raw) => serve(&raw),
        Command::Doctor(raw) => doctor(&raw),
    }
}

/// The checked configuration, or exit code 2 after saying which setting is
/// wrong.
fn checked_config(raw: &RawConfig) -> Result<Config, ExitCode> {
    Config::from_raw(raw).map_err(|error| {
        eprintln!("{NAME}: {error}");
        ExitCode::from(2)
    })
}

/// The operator's pod template, read and checked before any cluster call,
/// so that a bad one stops the start (exit 2) even without credentials.
fn checked_pod_template(config: &Config) -> Result<Option<PodTemplate>, ExitCode> {
    backend::kubernetes::template::from_config(config).map_err(|error| {
        eprintln!("{NAME}: {error}");
        ExitCode::from(2)
    })
}

/// One line per check on stdout; exit 1 when any fails.
fn doctor(raw: &RawConfig) -> ExitCode {
    let config = match checked_config(raw) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let pod_template = match checked_pod_template(&config) {
        Ok(pod_template) => pod_template,
        Err(code) => return code,
    };
    log::set_stderr_level(log::Level::Warning);
    let passed = match connect_engine(&config, pod_template.clone(), WarmPools::Off) {
        Ok(Connected::Kubernetes { ctx, client, .. }) => {
            backend::kubernetes::doctor::run(&config, pod_template.as_ref(), &ctx, &client, &mut |check| println!("{}", check.line()))
        }
        Ok(Connected::Docker { ctx, client, options, .. }) => {
            backend::docker::doctor::run(&config, &ctx, &client, &options, &mut |check| println!("{}", check.line()))
        }
        Err(message) => {
            println!("FAIL  backend: {message}");
            return ExitCode::from(1);
        }
    };
    if passed {
        println!("all checks passed");
        ExitCode::SUCCESS
    } else {
        println!("some checks failed");
        ExitCode::from(1)
    }
}

fn serve(raw: &RawConfig) -> ExitCode {
    let config = match checked_config(raw) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let pod_template = match checked_pod_template(&config) {
        Ok(pod_template) => pod_template,
        Err(code) => return code,
    };
    log::set_stderr_level(config.log_level);
    if config.allowed_images.is_empty() {
        log::warn("MCP_K8S_ALLOWED_IMAGES is empty: every job will be refused", &[]);
    }
    if raw.sidecar_image.is_some() {
        // Accepted so the original's deployments keep starting; the runner
        // inside the job pod replaced the sidecar.
        log::info("MCP_K8S_SIDECAR_IMAGE is set but unused: the in-pod runner replaced the sidecar", &[]);
    }
    let stop = CancelToken::new();
    let connected = connect_engine(&config, pod_template, WarmPools::On);
    match (&connected, &config.kubeconfig) {
        // A kubeconfig named explicitly is a setting like any other: wrong,
        // it stops the server instead of failing every call. Said once: an
        // earlier version also logged it as a JSON line just before.
        (Err(message), Some(_)) if config.backend != BackendChoice::Docker => {
            eprintln!("{NAME}: MCP_K8S_KUBECONFIG: {message}");
            return ExitCode::from(2);
        }
        (Err(message), _) => {
            log::error("no usable backend; job tools will refuse calls", &[("error", json!(message))]);
        }
        (Ok(_), _) => {}
    }
    if let Ok(Connected::Kubernetes { client, .. }) = &connected
        && let Err(message) = backend::kubernetes::doctor::check_at_start(&config, client)
    {
        eprintln!("{NAME}: {message}");
        return ExitCode::from(2);
    }
    // `Config` checks this for MCP_K8S_BACKEND=docker; with auto, only now
    // is the backend known.
    let pools = connected.as_ref().ok().and_then(Connected::pools);
    if let Ok(Connected::Docker { .. }) = &connected
        && let Err(error) = config.check_docker_network()
    {
        eprintln!("{NAME}: {error}");
        if let Some(pools) = &pools {
            pools.drain();
        }
        return ExitCode::from(2);
    }
    let engine = connected.map(Connected::into_ctx);
    if let Ok(engine) = &engine
        && let Err(error) = engine::reaper::start(engine.backend.clone(), engine::reaper::REAP_EVERY)
    {
        log::error("could not start the reaper", &[("error", json!(error.to_string()))]);
        return ExitCode::from(1);
    }
    let server = Arc::new(Server::new(tools::Ctx { config: config.clone(), engine }));
    if let Err(error) = watch_signals(&stop, &server) {
        log::error("could not install signal handlers", &[("error", json!(error.to_string()))]);
        return ExitCode::from(1);
    }
    let grace = Duration::from_secs(config.shutdown_grace_s);
    let served = match config.transport {
        Transport::Stdio => {
            let limits = transport::stdio::Limits {
                max_message_bytes: config.max_message_bytes,
                max_reply_queue_bytes: config.max_reply_queue_bytes,
            };
            transport::stdio::serve(server, limits, grace, stop)
        }
        Transport::Http => transport::http::serve(server, &config, stop),
    };
    // The Docker backend removes a run's containers after its answer, on
    // threads of their own: they end before the process does.
    backend::docker::removal::finish(Duration::from_secs(10));
    // Warm sandboxes nobody will take go with the server.
    if let Some(pools) = &pools {
        pools.drain();
    }
    match served {
        Ok(()) => {
            log::info("stopped", &[]);
            ExitCode::SUCCESS
        }
        Err(error) => {
            log::error("serving failed", &[("error", json!(error.to_string())), ("addr", json!(config.addr.to_string()))]);
            ExitCode::from(1)
        }
    }
}

/// First SIGTERM/SIGINT: stop accepting and let calls finish within the
/// grace period. Second: cancel every call now.
fn watch_signals(stop: &CancelToken, server: &Arc<Server>) -> std::io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])?;
    let stop = stop.clone();
    let server = Arc::clone(server);
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        for signal in signals.forever() {
            if stop.is_cancelled() {
                log::warn("second signal: cancelling every call", &[("signal", json!(signal))]);
                server.cancel_all();
            } else {
                log::info("signal received: shutting down", &[("signal", json!(signal))]);
                stop.cancel();
            }
        }
    })?;
    Ok(())
}

/// The engine on the backend it runs on, with that backend's client (for
/// `doctor` and the start-up checks).
enum Connected {
    Kubernetes {
        ctx: engine::run::Ctx,
        client: kube::Client,
        pools: Option<Arc<backend::kubernetes::pool::Pools>>,
    },
    Docker {
        ctx: engine::run::Ctx,
        client: docker::Client,
        options: backend::docker::spec::Options,
        pools: Option<Arc<backend::docker::pool::Pools>>,
    },
}

/// The warm pools a server keeps, on whichever backend.
#[derive(Clone)]
enum KeptPools {
    Kubernetes(Arc<backend::kubernetes::pool::Pools>),
    Docker(Arc<backend::docker::pool::Pools>),
}

impl KeptPools {
    /// Removes the sandboxes nobody took (the server stops).
    fn drain(&self) {
        match self {
            KeptPools::Kubernetes(pools) => pools.drain(),
            KeptPools::Docker(pools) => pools.drain(),
        }
    }
}

impl Connected {
    fn pools(&self) -> Option<KeptPools> {
        match self {
            Connected::Kubernetes { pools, .. } => pools.clone().map(KeptPools::Kubernetes),
            Connected::Docker { pools, .. } => pools.clone().map(KeptPools::Docker),
        }
    }

    fn into_ctx(self) -> engine::run::Ctx {
        match self {
            Connected::Kubernetes { ctx, .. } | Connected::Docker { ctx, .. } => ctx,
        }
    }
}

/// Picks the backend (`MCP_K8S_BACKEND`), connects to it and builds the
/// engine; says at start which one and why. A server without a usable
/// backend still starts (clients can connect and are told why jobs cannot
/// run); the caller says so, once.
fn connect_engine(config: &Config, pod_template: Option<PodTemplate>, warm: WarmPools) -> Result<Connected, String> {
    match config.backend {
        BackendChoice::Kubernetes => connect_kubernetes(config, pod_template, warm, "MCP_K8S_BACKEND=kubernetes"),
        BackendChoice::Docker => connect_docker(config, warm, "MCP_K8S_BACKEND=docker"),
        BackendChoice::Auto => {
            match connect_kubernetes(config, pod_template, warm, "MCP_K8S_BACKEND=auto and cluster credentials were found") {
                Ok(connected) => Ok(connected),
                // A kubeconfig named explicitly is the operator's choice of
                // Kubernetes: its error is the one to report.
                Err(message) if config.kubeconfig.is_some() => Err(message),
                Err(kube_message) => {
                    connect_docker(config, warm, "MCP_K8S_BACKEND=auto, no cluster credentials, and a Docker daemon answers").map_err(
                        |docker_message| format!("no cluster credentials ({kube_message}) and no Docker daemon ({docker_message})"),
                    )
                }
            }
        }
    }
}

fn connect_kubernetes(config: &Config, pod_template: Option<PodTemplate>, warm: WarmPools, why: &str) -> Result<Connected, String> {
    let source = kube::Source::select(config.kubeconfig.as_deref(), None);
    let client = kube::Client::new(&source).map_err(|error| credentials_message(&error))?;
    log::info("backend: kubernetes", &[("why", json!(why))]);
    log_credentials(config, &client);
    let policy = tools::engine_policy(config);
    let backend = backend::kubernetes::Kubernetes::new(client.clone(), policy.clone()).with_pod_template(pod_template);
    let pools = match warm {
        WarmPools::On => start_pools(config, &client, &policy, &backend)?,
        WarmPools::Off => None,
    };
    let backend = Arc::new(backend.with_pools(pools.clone()));
    Ok(Connected::Kubernetes { ctx: engine_ctx(config, policy, backend), client, pools })
}

/// Whether connecting starts the warm pools: serving does, `doctor` not.
#[derive(Clone, Copy)]
enum WarmPools {
    On,
    Off,
}

/// The warm pools' threads, when `MCP_K8S_WARM_POOLS` names any. Their
/// sandboxes carry this process's own id, so that replicas keep apart.
fn start_pools(
    config: &Config,
    client: &kube::Client,
    policy: &engine::spec::Policy,
    backend: &backend::kubernetes::Kubernetes,
) -> Result<Option<Arc<backend::kubernetes::pool::Pools>>, String> {
    if config.warm_pools.is_empty() {
        return Ok(None);
    }
    let max_timeout = Duration::from_secs(config.max_timeout_s);
    let pools = Arc::new(backend::kubernetes::pool::Pools::new(client.clone(), policy.clone(), &tools::warm_pools(config), max_timeout));
    pools.start(&pool_owner(), backend.pod_template.clone()).map_err(|error| format!("could not start the warm pools: {error}"))?;
    Ok(Some(pools))
}

fn connect_docker(config: &Config, warm: WarmPools, why: &str) -> Result<Connected, String> {
    // MCP_K8S_DOCKER_HOST, else DOCKER_HOST as the Docker CLI reads it.
    let docker_host = config.docker_host.clone().or_else(|| std::env::var("DOCKER_HOST").ok().filter(|value| !value.is_empty()));
    let socket = docker::socket_path(docker_host.as_deref()).map_err(|error| error.to_string())?;
    let runner_binary = match &config.runner_binary {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .map_err(|error| format!("MCP_K8S_RUNNER_BINARY is unset and this executable's path is unknown: {error}"))?,
    };
    // Docker creates a missing bind source as an empty directory on the
    // host (as root): the path is checked here so that never happens.
    if !runner_binary.is_file() {
        return Err(format!(
            "MCP_K8S_RUNNER_BINARY: `{}` is not a file; set it to the static runner binary (this server's musl build)",
            runner_binary.display()
        ));
    }
    // Before the engine is asked anything: a dynamic runner would make
    // every run end without its result.
    let runner_path = runner_binary.to_string_lossy().into_owned();
    let machine = backend::docker::doctor::check_runner(&runner_path)?;
    let client = docker::Client::connect(&socket, docker::Options::default()).map_err(|error| error.to_string())?;
    if let Some(why) = backend::docker::doctor::runner_arch_refusal(&runner_path, machine, &client.version().arch) {
        return Err(why);
    }
    if config.pod_template.is_some() {
        // Its fields (node selection, tolerations, pull Secrets) are the
        // scheduler's and the kubelet's; a local engine has neither.
        log::warn("MCP_K8S_POD_TEMPLATE is ignored on the Docker backend: it shapes Kubernetes pods only", &[]);
    }
    let options = backend::docker::spec::Options {
        runner_binary: runner_binary.to_string_lossy().into_owned(),
        restricted_network: config.docker_network.clone(),
        pull: match config.docker_pull {
            DockerPull::Never => backend::docker::spec::Pull::Never,
            DockerPull::Missing => backend::docker::spec::Pull::Missing,
        },
        owned_tmpfs: !client.version().is_podman(),
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
    let policy = tools::engine_policy(config);
    let backend = backend::docker::Docker::new(client.clone(), policy.clone(), options.clone());
    let pools = match warm {
        WarmPools::On => start_docker_pools(config, &backend)?,
        WarmPools::Off => None,
    };
    let backend = Arc::new(backend.with_pools(pools.clone()));
    Ok(Connected::Docker { ctx: engine_ctx(config, policy, backend), client, options, pools })
}

/// The Docker twin of `start_pools`.
fn start_docker_pools(config: &Config, backend: &backend::docker::Docker) -> Result<Option<Arc<backend::docker::pool::Pools>>, String> {
    if config.warm_pools.is_empty() {
        return Ok(None);
    }
    let max_timeout = Duration::from_secs(config.max_timeout_s);
    let pools = Arc::new(backend::docker::pool::Pools::new(backend.clone(), &tools::warm_pools(config), max_timeout));
    pools.start(&pool_owner()).map_err(|error| format!("could not start the warm pools: {error}"))?;
    Ok(Some(pools))
}

/// The id this process's pool sandboxes carry, so that replicas keep apart.
fn pool_owner() -> String {
    engine::run::new_run_id()[..12].to_string()
}

fn engine_ctx(config: &Config, policy: engine::spec::Policy, backend: Arc<dyn engine::backend::Backend>) -> engine::run::Ctx {
    engine::run::Ctx {
        backend,
        policy,
        slots: engine::slots::Slots::new(config.max_concurrent as usize, config.max_queued as usize),
        // Background runs in flight are capped like sync runs plus their
        // queue; see engine::background for why they take no slot.
        jobs: engine::jobs::Jobs::new(engine::jobs::Limits::new(
            Duration::from_secs(config.result_ttl_s),
            (config.max_concurrent + config.max_queued) as usize,
        )),
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

fn parse_command_line(mut parser: lexopt::Parser) -> Result<Command, String> {
    use lexopt::Arg::{Long, Short, Value};
    let mut raw = RawConfig::from_env();
    let mut subcommand_seen = false;
    let mut doctor = false;
    while let Some(arg) = parser.next().map_err(|error| error.to_string())? {
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help),
            Short('V') | Long("version") => return Ok(Command::Version),
            Value(value) if !subcommand_seen => {
                subcommand_seen = true;
                match value.to_str() {
                    Some("serve") => {}
                    // Same settings and flags as serve: it checks what
                    // serve would use.
                    Some("doctor") => doctor = true,
                    _ => return Err(format!("unknown command `{}`; commands: serve, doctor", value.to_string_lossy())),
                }
            }
            Long(flag) => {
                let flag = flag.to_string();
                let Some(setting) = config::SETTINGS.iter().find(|setting| setting.flag == Some(flag.as_str())) else {
                    return Err(format!("unknown option `--{flag}`"));
                };
                let value = parser.value().map_err(|error| error.to_string())?;
                let value = value.into_string().map_err(|_| format!("`--{flag}` needs a UTF-8 value"))?;
                *setting.slot(&mut raw) = Some(value);
            }
            other => return Err(other.unexpected().to_string()),
        }
    }
    if doctor {
        return Ok(Command::Doctor(Box::new(raw)));
    }
    Ok(Command::Serve(Box::new(raw)))
}

fn help_text() -> String {
    let mut text = format!(
        "{NAME} {}: an MCP server that runs commands in throwaway Kubernetes pods\n\n\
         Usage: {NAME} [serve] [OPTIONS]\n\
         \x20      {NAME} doctor [OPTIONS]   check the cluster set-up, one line per check\n\n\
         Every option can also be set through its environment variable; options win.\n\n\
         Options:\n",
        env!("CARGO_PKG_VERSION")
    );
    for setting in config::SETTINGS {
        let flag = setting.flag.map_or_else(|| "(environment only)".to_string(), |flag| format!("--{flag} <value>"));
        let default = if setting.default.is_empty() { String::new() } else { format!(" [default: {}]", setting.default) };
        text.push_str(&format!("  {flag:<32} {}\n  {:<32} {}{default}\n", setting.env, "", setting.help));
    }
    text.push_str("  -h, --help                       this text\n  -V, --version                    the version\n");
    text
}

/// Panics become one JSON log line on stderr (stdout belongs to stdio).
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|text| text.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let location = info.location().map(|location| format!("{}:{}", location.file(), location.line()));
        let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
        log::error("panic", &[("message", json!(message)), ("location", json!(location)), ("thread", json!(thread))]);
    }));
}
