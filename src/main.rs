//! Entry point: wiring only. Parses the command line, then hands over to the
//! chosen mode (the MCP server, or the hidden in-pod runner).
//!
//! `mcp-k8s-ephemeral-job [serve|doctor] [--flag value]...`: the
//! environment (`MCP_K8S_*`) is read first and flags override it. Exit
//! codes: 0 after a clean shutdown, 1 when serving fails (e.g. the port is
//! taken) or a doctor check fails, 2 for bad usage or configuration
//! (including a cache PVC or clone Secret that does not exist, a
//! dynamically linked runner binary, and no site that can run a job
//! without MCP_K8S_LAZY_BACKEND=1).

// The one unsafe block: the glibc allocator's tuning (see its SAFETY note).
#![deny(clippy::undocumented_unsafe_blocks)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use mcp_k8s_ephemeral_job::backend::{self, WarmPools};
use mcp_k8s_ephemeral_job::cancel::CancelToken;
use mcp_k8s_ephemeral_job::config::{self, BackendChoice, Config, RawConfig, Transport};
use mcp_k8s_ephemeral_job::protocol::Server;
use mcp_k8s_ephemeral_job::{engine, log, supervise, tools, transport, wiring};
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

/// The checked configuration and the settings read from files, or exit
/// code 2 after saying which setting is wrong.
fn checked(raw: &RawConfig) -> Result<(Config, backend::Prepared), ExitCode> {
    let refuse = |message: String| {
        eprintln!("{NAME}: {message}");
        ExitCode::from(2)
    };
    let config = Config::from_raw(raw).map_err(|error| refuse(error.to_string()))?;
    tools::check_callers(&config).map_err(refuse)?;
    let prepared = backend::prepare(&config).map_err(refuse)?;
    Ok((config, prepared))
}

/// One line per check on stdout, failures that share a cause on one line
/// (`backend::group`), each site's when its checks are done; exit 1 when
/// any fails (a warning does not).
fn doctor(raw: &RawConfig) -> ExitCode {
    let (config, prepared) = match checked(raw) {
        Ok(checked) => checked,
        Err(code) => return code,
    };
    log::set_stderr_level(log::Level::Warning);
    let (sites, named) = wiring::sites(&config);
    let mut passed = true;
    for (name, site_config) in &sites {
        if named {
            println!("site `{name}`:");
        }
        let connected = match wiring::connect(site_config, &prepared, WarmPools::Off) {
            Ok(connected) => connected,
            Err(error) => {
                let message = error.message();
                println!("FAIL  backend: {message}");
                passed = false;
                continue;
            }
        };
        let ctx = wiring::engine_ctx(site_config, connected.clone(), named.then(|| name.clone()));
        let mut checks = Vec::new();
        passed &= connected.doctor(site_config, &ctx, &mut |check| checks.push(check.clone()));
        for check in backend::group(checks) {
            println!("{}", check.line());
        }
    }
    if passed {
        println!("all checks passed");
        ExitCode::SUCCESS
    } else {
        println!("some checks failed");
        ExitCode::from(1)
    }
}

fn serve(raw: &RawConfig) -> ExitCode {
    let (config, prepared) = match checked(raw) {
        Ok(checked) => checked,
        Err(code) => return code,
    };
    log::set_stderr_level(config.log_level);
    if let Err(message) = mcp_k8s_ephemeral_job::audit::init(config.audit_log.as_ref()) {
        eprintln!("{NAME}: {message}");
        return ExitCode::from(2);
    }
    if let Some(endpoint) = &config.otlp_endpoint
        && let Err(message) = mcp_k8s_ephemeral_job::trace::start(endpoint)
    {
        eprintln!("{NAME}: {message}");
        return ExitCode::from(2);
    }
    // A folder the server cannot write stops it now, not each run later.
    if let Some(Err(message)) = wiring::outputs(&config).map(|outputs| outputs.prepare()) {
        eprintln!("{NAME}: {message}");
        return ExitCode::from(2);
    }
    // A test hook: a build without the `testing` feature refused the
    // setting when it read its configuration.
    #[cfg(feature = "testing")]
    if let Some(kind) = config.test_panic_thread {
        log::warn("MCP_K8S_TEST_PANIC_THREAD is set: a test hook makes a thread panic", &[("thread", json!(kind.as_str()))]);
        supervise::panic_next(kind);
    }
    if config.allowed_images.is_empty() {
        log::warn("MCP_K8S_ALLOWED_IMAGES is empty: every job will be refused", &[]);
    }
    // One allowlist for every path: said at start, so an operator sees why
    // a language is missing and which images the languages file allowed.
    if !config.languages.operator_images.is_empty() {
        log::info("images allowed by the languages file (MCP_K8S_LANGUAGES)", &[("images", json!(config.languages.operator_images))]);
    }
    if !config.languages.not_allowed.is_empty() {
        let left_out: Vec<String> = config.languages.not_allowed.iter().map(|(name, image)| format!("{name} ({image})")).collect();
        log::info("execute_code languages left out: their image is not in MCP_K8S_ALLOWED_IMAGES", &[("languages", json!(left_out))]);
    }
    if raw.sidecar_image.is_some() {
        // Accepted so the original's deployments keep starting; the runner
        // inside the job pod replaced the sidecar.
        log::info("MCP_K8S_SIDECAR_IMAGE is set but unused: the in-pod runner replaced the sidecar", &[]);
    }
    let stop = CancelToken::new();
    let (sites, named) = wiring::sites(&config);
    let mut engines = Vec::new();
    let mut connections = Vec::new();
    // The backend each site reached, for what the tools say of its runs.
    let mut reached = Vec::new();
    let mut reaped = Vec::new();
    for (index, (name, site_config)) in sites.iter().enumerate() {
        let site = named.then(|| Named { file: raw.sites.as_deref().unwrap_or_default(), name: name.as_str() });
        let connected = match start_site(site_config, &prepared, site) {
            Ok(connected) => connected,
            Err(code) => {
                connections.iter().for_each(|connected: &Arc<dyn backend::Connected>| connected.shutdown());
                return code;
            }
        };
        let engine = connected.clone().map(|connected| wiring::engine_ctx(site_config, connected, named.then(|| name.clone())));
        // The output store, shared by every site, is reaped on the default
        // site's turns.
        if let Ok(engine) = &engine {
            let outputs = if index == 0 { engine.policy.outputs.clone() } else { None };
            reaped.push(engine::reaper::Site { backend: engine.backend.clone(), outputs });
        }
        reached.push(connected.as_ref().ok().map(|connected| connected.kind()));
        if let Ok(connected) = connected {
            connections.push(connected);
        }
        engines.push(tools::SiteEngine { name: name.clone(), engine });
    }
    // Every site's reaper turns on a few shared threads: an idle site holds none.
    if let Err(error) = engine::reaper::start(reaped, engine::reaper::REAP_EVERY) {
        log::error("could not start the reaper", &[("error", json!(error.to_string()))]);
        connections.iter().for_each(|connected| connected.shutdown());
        return ExitCode::from(1);
    }
    let ctx = tools::Ctx::with_sites(wiring::resolved(&config, &reached), engines, named);
    if let Err(code) = judge_sites(&ctx, config.lazy_backend) {
        connections.iter().for_each(|connected| connected.shutdown());
        return code;
    }
    let server = Arc::new(Server::new(ctx));
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
    // Clean-up under way ends and warm sandboxes nobody will take go with
    // the server.
    for connected in &connections {
        connected.shutdown();
    }
    mcp_k8s_ephemeral_job::trace::flush(Duration::from_secs(2));
    mcp_k8s_ephemeral_job::audit::flush(Duration::from_secs(2));
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

/// Connects one site and checks it at start. A kubeconfig named
/// explicitly that does not load, or a setting that no waiting fixes (a
/// dynamically linked runner binary), stops the server (exit 2), on any
/// site; so does, without named sites, a set-up that would fail every run.
/// A site that cannot be reached is `Ok(Err(why))`: `judge_sites` decides
/// once every site is known (one site down must not stop the others).
fn start_site(
    config: &Config,
    prepared: &backend::Prepared,
    named: Option<Named<'_>>,
) -> Result<Result<Arc<dyn backend::Connected>, String>, ExitCode> {
    let site = named.map(|named| named.name);
    let connected = match wiring::connect(config, prepared, WarmPools::On) {
        Ok(connected) => Ok(connected),
        // A kubeconfig named explicitly is a setting like any other: wrong,
        // it stops the server instead of failing every call. Said once: an
        // earlier version also logged it as a JSON line just before.
        Err(error) if config.kubeconfig.is_some() && config.backend != BackendChoice::Docker => {
            eprintln!("{NAME}: {}", kubeconfig_refusal(named, error.message()));
            return Err(ExitCode::from(2));
        }
        Err(backend::ConnectError::Misconfigured(message)) => {
            eprintln!("{NAME}: {}", site_refusal(named, &message));
            return Err(ExitCode::from(2));
        }
        // Said by `judge_sites`, once every site is known: the one line
        // that stops the start, or a warning naming the site.
        Err(backend::ConnectError::Unavailable(message)) => Err(message),
    };
    if let Ok(connected) = &connected
        && let Err(message) = connected.check_at_start(config)
    {
        if let Some(site) = site {
            log::error("a site failed its start-up checks; its runs may fail", &[("site", json!(site)), ("error", json!(message))]);
        } else {
            eprintln!("{NAME}: {message}");
            connected.shutdown();
            return Err(ExitCode::from(2));
        }
    }
    Ok(connected)
}

/// Whether the sites, now connected, can run a job: each is asked what
/// `/readyz` asks (shared with it), within `readiness::START_WAIT`. None
/// can: exit 2 with one line, unless `lazy` (MCP_K8S_LAZY_BACKEND), which
/// serves anyway; then the asks are started, not waited for, and only
/// sites that could not be connected are judged (a server that waits for
/// its backend must not wait at start). A site down beside healthy ones
/// is a warning naming it.
fn judge_sites(ctx: &tools::Ctx, lazy: bool) -> Result<(), ExitCode> {
    use tools::readiness::StartVerdict;
    let answers = if lazy {
        let _ = tools::readiness::site_answers(ctx, std::time::Instant::now());
        ctx.sites.iter().map(|site| (site.name.clone(), site.engine.as_ref().map(|_| ()).map_err(Clone::clone))).collect()
    } else {
        tools::readiness::site_answers(ctx, std::time::Instant::now() + tools::readiness::START_WAIT)
    };
    match tools::readiness::start_verdict(&answers, ctx.named_sites, lazy) {
        StartVerdict::Serve => Ok(()),
        StartVerdict::ServeWithout(down) => {
            for (site, why) in down {
                let why = why.err().unwrap_or_default();
                log::warn(
                    "a site cannot run jobs now; its calls are refused, the other sites serve",
                    &[("site", json!(site)), ("error", json!(why))],
                );
            }
            Ok(())
        }
        StartVerdict::ServeLazily(why) => {
            log::warn(
                "serving without a backend (MCP_K8S_LAZY_BACKEND=1): /readyz fails until a site can run jobs",
                &[("error", json!(why))],
            );
            Ok(())
        }
        StartVerdict::Refuse(line) => {
            eprintln!("{NAME}: {line}");
            Err(ExitCode::from(2))
        }
    }
}

/// A site of MCP_K8S_SITES: the file that names it, and its name.
#[derive(Clone, Copy)]
struct Named<'a> {
    file: &'a str,
    name: &'a str,
}

/// A setting of one site that stops the start: a named site's is said with
/// its file and name.
fn site_refusal(named: Option<Named<'_>>, message: &str) -> String {
    match named {
        None => message.to_string(),
        Some(Named { file, name }) => format!("MCP_K8S_SITES: `{file}`: site `{name}`: {message}"),
    }
}

/// Why a kubeconfig named explicitly stops the start, naming the setting
/// to fix: a site's comes from the sites file (its `kubeconfig`, else the
/// server's MCP_K8S_KUBECONFIG), so the file and the site are named too.
fn kubeconfig_refusal(named: Option<Named<'_>>, message: &str) -> String {
    match named {
        None => format!("MCP_K8S_KUBECONFIG: {message}"),
        Some(Named { file, name }) => {
            format!("MCP_K8S_SITES: `{file}`: site `{name}`: its kubeconfig (field `kubeconfig`, else MCP_K8S_KUBECONFIG): {message}")
        }
    }
}

/// First SIGTERM/SIGINT: stop accepting and let calls finish within the
/// grace period. Second: cancel every call now.
fn watch_signals(stop: &CancelToken, server: &Arc<Server>) -> std::io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])?;
    let stop = stop.clone();
    let server = Arc::clone(server);
    supervise::spawn(supervise::Kind::Signals, move || {
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

/// A misspelt `MCP_K8S_*` variable would otherwise do nothing, silently.
fn warn_unknown_settings() {
    let names: Vec<String> = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok()).collect();
    for (name, nearest) in config::unknown_settings(names.iter().map(String::as_str)) {
        log::warn("an MCP_K8S_ variable that is no setting is ignored", &[("variable", json!(name)), ("did_you_mean", json!(nearest))]);
    }
}

fn parse_command_line(mut parser: lexopt::Parser) -> Result<Command, String> {
    use lexopt::Arg::{Long, Short, Value};
    let mut raw = RawConfig::from_env();
    warn_unknown_settings();
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
        let message = supervise::panic_message(info.payload());
        let location = info.location().map(|location| format!("{}:{}", location.file(), location.line()));
        let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
        log::error("panic", &[("message", json!(message)), ("location", json!(location)), ("thread", json!(thread))]);
    }));
}
