//! Entry point: wiring only. Parses the command line, then hands over to the
//! chosen mode (the MCP server, or the hidden in-pod runner).
//!
//! `mcp-k8s-ephemeral-job [serve] [--flag value]...`: the environment
//! (`MCP_K8S_*`) is read first and flags override it. Exit codes: 0 after a
//! clean shutdown, 1 when serving fails (e.g. the port is taken), 2 for bad
//! usage or configuration.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use mcp_k8s_ephemeral_job::config::{self, Config, RawConfig, Transport};
use mcp_k8s_ephemeral_job::engine::cancel::CancelToken;
use mcp_k8s_ephemeral_job::protocol::Server;
use mcp_k8s_ephemeral_job::{log, tools, transport};
use serde_json::json;

const NAME: &str = "mcp-k8s-ephemeral-job";

/// What the command line asked for.
enum Command {
    Serve(Box<RawConfig>),
    // `doctor` (checks the cluster setup) is added here by its issue. The
    // hidden `runner` (the in-pod entrypoint) is dispatched in `main` before
    // any of this.
    Help,
    Version,
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
    }
}

fn serve(raw: &RawConfig) -> ExitCode {
    let config = match Config::from_raw(raw) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{NAME}: {error}");
            return ExitCode::from(2);
        }
    };
    log::set_stderr_level(config.log_level);
    if config.allowed_images.is_empty() {
        log::warn("MCP_K8S_ALLOWED_IMAGES is empty: every job will be refused", &[]);
    }
    let stop = CancelToken::new();
    let server = Arc::new(Server::new(tools::Ctx { config: config.clone() }));
    if let Err(error) = watch_signals(&stop, &server) {
        log::error("could not install signal handlers", &[("error", json!(error.to_string()))]);
        return ExitCode::from(1);
    }
    let grace = Duration::from_secs(config.shutdown_grace_s);
    let served = match config.transport {
        Transport::Stdio => transport::stdio::serve(server, config.max_message_bytes, grace, stop),
        Transport::Http => transport::http::serve(server, &config, stop),
    };
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

fn parse_command_line(mut parser: lexopt::Parser) -> Result<Command, String> {
    use lexopt::Arg::{Long, Short, Value};
    let mut raw = RawConfig::from_env();
    let mut subcommand_seen = false;
    while let Some(arg) = parser.next().map_err(|error| error.to_string())? {
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help),
            Short('V') | Long("version") => return Ok(Command::Version),
            Value(value) if !subcommand_seen => {
                subcommand_seen = true;
                match value.to_str() {
                    Some("serve") => {}
                    // Other subcommands go here and hand the rest of the
                    // parser to their own parsing, e.g.
                    // `Some("runner") => return parse_runner(parser)`.
                    _ => return Err(format!("unknown command `{}`; commands: serve", value.to_string_lossy())),
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
    Ok(Command::Serve(Box::new(raw)))
}

fn help_text() -> String {
    let mut text = format!(
        "{NAME} {}: an MCP server that runs commands in throwaway Kubernetes pods\n\n\
         Usage: {NAME} [serve] [OPTIONS]\n\n\
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
