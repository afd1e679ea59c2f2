//! The MCP tools: names, schemas, argument checking and result shapes, and
//! the plug-in point every tool uses.
//!
//! A tool is a `Tool` value: metadata (name, title, description, schemas,
//! annotations) plus a plain `Handler` function. The handler gets the
//! server-wide `Ctx` and a `Call` (arguments, a `CancelToken`, and
//! `CallEvents` for progress and log messages) and returns a `ToolOutcome`.
//! The protocol layer runs each call on its own thread, turns the outcome
//! into a `tools/call` result and owns everything JSON-RPC; tools never see
//! request ids, sessions or transports. Long-running work in `engine` gets
//! the `CancelToken` and a progress callback from the handler, so the engine
//! stays ignorant of MCP too.

pub mod admission;
pub mod answer;
pub mod backend_words;
pub mod background;
pub mod call_args;
pub mod execute_code;
pub mod idempotency;
pub mod job_args;
pub mod job_result;
pub mod links;
pub mod readiness;
pub mod run_job;
pub mod sandboxes;
pub mod site_health;
pub mod snippets;
#[cfg(feature = "testing")]
mod test_hooks;

use std::fmt;

use serde_json::{Map, Value, json};

use crate::json::{json_kind, json_text};

use crate::audit;
use crate::cancel::CancelToken;
use crate::config::Config;
use crate::log::Level;

/// Everything a tool handler may use besides its call. The engine's context
/// (Kubernetes client, job store) joins `config` here when the job tools
/// arrive.
pub struct Ctx {
    pub config: Config,
    /// Every site's engine, the default first.
    pub sites: Vec<SiteEngine>,
    /// Whether the sites are named (MCP_K8S_SITES): their tokens carry them.
    pub named_sites: bool,
    /// Every caller's counted limits, in this process.
    pub ledger: std::sync::Arc<crate::callers::Ledger>,
    /// Each site's health asks, in the order of `sites`.
    pub site_health: Vec<std::sync::Arc<site_health::SiteHealth>>,
}

/// One site's job engine, or why there is none (no usable cluster
/// credentials, no daemon): its calls then answer with that reason.
pub struct SiteEngine {
    pub name: String,
    pub engine: Result<crate::engine::run::Ctx, String>,
}

impl Ctx {
    /// A server with one site, `default`.
    pub fn new(config: Config, engine: Result<crate::engine::run::Ctx, String>) -> Ctx {
        let site = SiteEngine { name: crate::config::DEFAULT_SITE.to_string(), engine };
        Ctx::with_sites(config, vec![site], false)
    }

    /// A server with `sites`, the default first.
    pub fn with_sites(config: Config, sites: Vec<SiteEngine>, named_sites: bool) -> Ctx {
        let site_health = sites.iter().map(|_| Default::default()).collect();
        Ctx { config, sites, named_sites, ledger: Default::default(), site_health }
    }

    /// The default site's engine.
    pub fn engine(&self) -> &Result<crate::engine::run::Ctx, String> {
        &self.sites[0].engine
    }

    /// The site a call names (`None`: the default), or an error naming the
    /// sites there are.
    pub fn site(&self, name: Option<&str>) -> Result<&SiteEngine, String> {
        let Some(name) = name else { return Ok(&self.sites[0]) };
        self.sites.iter().find(|site| site.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.sites.iter().map(|site| site.name.as_str()).collect();
            format!("unknown site `{}`; sites here: {}", crate::echo::shorten(name), names.join(", "))
        })
    }

    /// The engine of the site a call names (`None`: the default), or why
    /// there is none.
    pub fn engine_of(&self, site: Option<&str>) -> Result<&crate::engine::run::Ctx, String> {
        self.site(site)?.engine.as_ref().map_err(|why| no_backend(why))
    }

    /// Asks every site at once, each on a thread of its own, and waits
    /// at most `wait`: a site without an engine, or that has not answered
    /// by then, gets an error saying so. One site that is down never holds
    /// the others' answers for longer.
    pub fn ask_sites<T: Send + 'static>(
        &self,
        wait: std::time::Duration,
        ask: impl Fn(&crate::engine::run::Ctx) -> Result<T, String> + Send + Sync + 'static,
    ) -> Vec<Result<T, String>> {
        let ask = std::sync::Arc::new(ask);
        let (answers, answered) = std::sync::mpsc::channel();
        for (index, site) in self.sites.iter().enumerate() {
            let Ok(engine) = &site.engine else { continue };
            let (engine, sender, ask) = (engine.clone(), answers.clone(), std::sync::Arc::clone(&ask));
            let spawned = crate::supervise::spawn(crate::supervise::Kind::SiteHealth, move || {
                let _ = sender.send((index, ask(&engine)));
            });
            if let Err(error) = spawned {
                let _ = answers.send((index, Err(format!("could not ask it: {error}"))));
            }
        }
        drop(answers);
        let mut results: Vec<Option<Result<T, String>>> =
            self.sites.iter().map(|site| site.engine.as_ref().err().map(|why| Err(no_backend(why)))).collect();
        let deadline = std::time::Instant::now() + wait;
        while results.iter().any(Option::is_none) {
            match answered.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
                Ok((index, answer)) => results[index] = Some(answer),
                Err(_) => break,
            }
        }
        results.into_iter().map(|result| result.unwrap_or_else(|| Err(format!("no answer within {} s", wait.as_secs())))).collect()
    }

    /// Admits a run of `caller` on `site` (`admission::admit`).
    pub fn admit(
        &self,
        caller: &crate::callers::Caller,
        site: &str,
        spec: &mut crate::engine::port::spec::RunSpec,
    ) -> Result<admission::Admitted, String> {
        // Every run passes here, so a trail that takes no lines refuses
        // them all: a run the trail cannot record does not start.
        crate::audit::check().map_err(|stalled| stalled.to_string())?;
        admission::admit(&self.ledger, caller, site, spec, &self.config.default_cpu)
    }
}

/// The tokens file's `tools` limits name tools this server has: checked
/// at start, so a misspelt name is an error rather than a tool nobody
/// can call.
pub fn check_callers(config: &Config) -> Result<(), String> {
    let Some(callers) = &config.callers else { return Ok(()) };
    let names = Registry::new(config).names();
    for caller in callers.callers() {
        if let Some(unknown) = caller.limits.tools.iter().flatten().find(|tool| !names.contains(&tool.as_str())) {
            return Err(format!(
                "MCP_K8S_AUTH_TOKENS_FILE: caller `{}`, field `tools`: `{}` is not a tool of this server; its tools: {}",
                caller.name,
                crate::echo::shorten(unknown),
                names.join(", ")
            ));
        }
    }
    Ok(())
}

/// A sandbox id as its caller sees it: on a server with named sites, the
/// engine's id, `.` and the site, as a job token carries its site, so a
/// call in it needs no `site`.
pub fn public_sandbox_id(id: &str, site: Option<&str>) -> String {
    match site {
        Some(site) => format!("{id}.{site}"),
        None => id.to_string(),
    }
}

/// The `site` property of a run tool's input schema; none with one site,
/// which a call need not name.
pub fn site_schema(config: &Config) -> Option<Value> {
    if config.sites.is_empty() {
        return None;
    }
    let names = crate::config::site_names(&config.sites);
    Some(json!({
        "type": ["string", "null"],
        "enum": names.iter().map(|name| Value::from(*name)).chain([Value::Null]).collect::<Vec<_>>(),
        "description": format!("default {}; a job token carries its site", names[0]),
    }))
}

/// How an audited run ended: its outcome, and how long after the call
/// arrived.
#[derive(Clone, Copy)]
pub struct Ended<'a> {
    pub outcome: &'a crate::engine::port::spec::RunOutcome,
    pub elapsed: std::time::Duration,
}

/// The audit line of a call that ran, submitted or found `run_id`.
pub fn audit_call(
    caller: &crate::callers::Caller,
    site: &str,
    event: audit::Event,
    tool: &str,
    spec: &crate::engine::port::spec::RunSpec,
    run_id: &str,
    ended: Option<Ended<'_>>,
) {
    audit::record(&audit::Entry {
        caller: Some(&caller.name),
        site: Some(site),
        tool: Some(tool),
        image: Some(&spec.image),
        network: Some(spec.network),
        ended: ended.map(|ended| ended.outcome.audited()),
        elapsed: ended.map(|ended| ended.elapsed),
        ..audit::Entry::new(event, run_id)
    });
}

/// A submit's audit line: `submitted` for a run made or found, `run` for
/// one refused at once (a full queue); a call refused before any run
/// (bad arguments, a key reused) has no run to record.
pub fn audit_submit(
    caller: &crate::callers::Caller,
    site: &str,
    tool: &str,
    spec: &crate::engine::port::spec::RunSpec,
    submitted: &Result<crate::engine::background::Submitted, crate::engine::background::Error>,
    arrived: std::time::Instant,
) {
    match submitted {
        Ok(submitted) => audit_call(caller, site, audit::Event::Submitted, tool, spec, &submitted.run_id, None),
        Err(crate::engine::background::Error::Refused { outcome }) => {
            audit_call(caller, site, audit::Event::Run, tool, spec, &outcome.run_id, Some(Ended { outcome, elapsed: arrived.elapsed() }))
        }
        Err(_) => {}
    }
}

/// One tool call as a handler sees it.
pub struct Call<'a> {
    /// The `arguments` object of `tools/call` (`{}` when absent).
    pub arguments: &'a Map<String, Value>,
    /// Cancelled when the client sends `notifications/cancelled`, its
    /// session ends, or the server shuts down; stop promptly and return.
    pub cancel: &'a CancelToken,
    /// Progress and log messages back to the client while the call runs.
    pub events: &'a dyn CallEvents,
    /// The call's span, when traces are sent: a run's phases are its
    /// children.
    pub trace: Option<crate::trace::SpanContext>,
    /// Who calls: the limits a run is admitted under, and whose runs this
    /// call may see.
    pub caller: &'a crate::callers::Caller,
}

/// How a running tool talks to its client. The protocol layer implements it
/// and drops what the client did not ask for (progress without a
/// `progressToken`, logs below the level set by `logging/setLevel`).
pub trait CallEvents: Send + Sync {
    /// `progress` must increase from one report to the next (MCP requires
    /// it; reports that do not are dropped). `total` is optional.
    fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>);
    /// A `notifications/message` for this call's client.
    fn log(&self, level: Level, message: &str);
}

/// What a handler returns.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolOutcome {
    /// The structured result; it must match the tool's `output_schema`.
    Success(Value),
    /// A structured result plus content blocks after its text (pictures a
    /// job produced, as `image` blocks a model can look at).
    SuccessWithContent { structured: Value, extra_content: Vec<Value> },
    /// A tool error the model should read (bad arguments, could not run):
    /// becomes `isError: true` with this text and no `structuredContent`.
    Failure(String),
    /// A result whose text block is the tool's own rendering rather than
    /// the structured JSON (`execute_code` keeps isolator's text), with an
    /// `isError` the tool decides.
    Rendered { text: String, structured: Value, extra_content: Vec<Value>, is_error: bool },
}

pub type Handler = fn(&Ctx, &Call<'_>) -> ToolOutcome;

/// MCP tool annotations (hints to clients, all four always written so no
/// client has to guess the spec's defaults).
#[derive(Clone, Copy, Debug)]
pub struct Annotations {
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
}

pub struct Tool {
    pub name: &'static str,
    pub title: String,
    pub description: String,
    pub input_schema: Value,
    pub output_schema: Value,
    pub annotations: Annotations,
    pub handler: Handler,
}

/// The tools this server offers, in `tools/list` order.
pub struct Registry {
    tools: Vec<Tool>,
}

impl Registry {
    /// The production tools, plus the test hooks when
    /// `MCP_K8S_TEST_TOOLS=1` (a test build's only: see `test_hooks`).
    pub fn new(config: &Config) -> Registry {
        let mut tools = vec![describe_environment_tool(), run_job::run_job_tool(config), execute_code::execute_code_tool(config)];
        tools.extend(background::tools(config));
        tools.extend(sandboxes::tools(config));
        #[cfg(feature = "testing")]
        if config.test_tools {
            tools.extend(test_hooks::tools());
        }
        Registry { tools }
    }

    pub fn find(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|tool| tool.name == name)
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.tools.iter().map(|tool| tool.name).collect()
    }

    /// The `tools/list` result with the tools `shown` keeps. There is one
    /// page: the list is short.
    pub fn list_json(&self, shown: impl Fn(&str) -> bool) -> Value {
        let tools: Vec<Value> = self.tools.iter().filter(|tool| shown(tool.name)).map(Tool::to_json).collect();
        json!({ "tools": tools })
    }
}

impl Tool {
    pub fn to_json(&self) -> Value {
        let mut tool = json!({
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": self.input_schema,
            "outputSchema": self.output_schema,
            // No `title` here too: the tool's own says it (2025-06-18),
            // and each copy is paid in the agent's context.
            "annotations": {
                "readOnlyHint": self.annotations.read_only,
                "destructiveHint": self.annotations.destructive,
                "idempotentHint": self.annotations.idempotent,
                "openWorldHint": self.annotations.open_world,
            },
        });
        // MCP tasks (2025-11-25): a tool without `execution` forbids them.
        if background::TASK_TOOLS.contains(&self.name) {
            tool["execution"] = json!({ "taskSupport": "optional" });
        }
        tool
    }
}

/// The `tools/call` result for an outcome: structured content repeated as a
/// text block (revision 2025-06-18 says SHOULD, and clients that ignore
/// `structuredContent` still get the data), or an `isError` text. Takes the
/// outcome by value so the structured content moves instead of being
/// copied: with artifacts it is the largest thing the server holds.
pub fn result_json(outcome: ToolOutcome) -> Value {
    // Built with moves, not `json!`, which copies what it is given.
    let structured_result = |text: String, structured: Value, extra_content: Vec<Value>, is_error: bool| {
        let mut text_block = Map::new();
        text_block.insert("type".into(), Value::from("text"));
        text_block.insert("text".into(), Value::String(text));
        let mut content = vec![Value::Object(text_block)];
        content.extend(extra_content);
        let mut result = Map::new();
        result.insert("content".into(), Value::Array(content));
        result.insert("structuredContent".into(), structured);
        result.insert("isError".into(), Value::Bool(is_error));
        Value::Object(result)
    };
    match outcome {
        ToolOutcome::Success(structured) => structured_result(json_text(&structured), structured, Vec::new(), false),
        ToolOutcome::SuccessWithContent { structured, extra_content } => {
            structured_result(json_text(&structured), structured, extra_content, false)
        }
        ToolOutcome::Rendered { text, structured, extra_content, is_error } => structured_result(text, structured, extra_content, is_error),
        ToolOutcome::Failure(text) => json!({
            "content": [{ "type": "text", "text": text }],
            "isError": true,
        }),
    }
}

/// A bad argument, worded for the model that sent it.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgError {
    Unknown { name: String, accepted: &'static [&'static str] },
    Missing { name: &'static str },
    WrongType { name: &'static str, expected: &'static str, found: &'static str },
    OutOfRange { name: &'static str, value: f64, min: f64, max: f64 },
}

impl fmt::Display for ArgError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgError::Unknown { name, accepted: [] } => {
                write!(formatter, "unknown argument `{}`; this tool takes no arguments", crate::echo::shorten(name))
            }
            ArgError::Unknown { name, accepted } => {
                write!(formatter, "unknown argument `{}`; accepted: {}", crate::echo::shorten(name), accepted.join(", "))
            }
            ArgError::Missing { name } => write!(formatter, "missing required argument `{name}`"),
            ArgError::WrongType { name, expected, found } => {
                write!(formatter, "argument `{name}` must be {expected}, not {found}")
            }
            ArgError::OutOfRange { name, value, min, max } => {
                write!(formatter, "argument `{name}` is `{value}`; accepted: {min} to {max}")
            }
        }
    }
}

impl std::error::Error for ArgError {}

/// Refuses arguments outside `accepted` (the schemas say
/// `additionalProperties: false`; a misspelt optional argument would
/// otherwise be silently ignored).
pub fn check_known_arguments(arguments: &Map<String, Value>, accepted: &'static [&'static str]) -> Result<(), ArgError> {
    check_known_arguments_besides(arguments, accepted, &[])
}

/// `check_known_arguments` for a tool that also takes `besides`, read
/// elsewhere (the sandbox tools' `site`, read by `call_args::site`).
pub fn check_known_arguments_besides(
    arguments: &Map<String, Value>,
    accepted: &'static [&'static str],
    besides: &[&str],
) -> Result<(), ArgError> {
    match arguments.keys().find(|name| !accepted.contains(&name.as_str()) && !besides.contains(&name.as_str())) {
        Some(name) => Err(ArgError::Unknown { name: name.clone(), accepted }),
        None => Ok(()),
    }
}

/// A number argument within `min..=max`; `None` when absent or null.
pub fn optional_number(arguments: &Map<String, Value>, name: &'static str, min: f64, max: f64) -> Result<Option<f64>, ArgError> {
    let Some(value) = arguments.get(name).filter(|value| !value.is_null()) else {
        return Ok(None);
    };
    let Some(number) = value.as_f64() else {
        return Err(ArgError::WrongType { name, expected: "a number", found: json_kind(value) });
    };
    if !(min..=max).contains(&number) {
        return Err(ArgError::OutOfRange { name, value: number, min, max });
    }
    Ok(Some(number))
}

/// Like `optional_number`, for whole numbers.
pub fn optional_integer(arguments: &Map<String, Value>, name: &'static str, min: u64, max: u64) -> Result<Option<u64>, ArgError> {
    let Some(value) = arguments.get(name).filter(|value| !value.is_null()) else {
        return Ok(None);
    };
    let Some(number) = value.as_u64() else {
        let found = if value.is_number() { "a fraction or a negative number" } else { json_kind(value) };
        return Err(ArgError::WrongType { name, expected: "a whole number", found });
    };
    if !(min..=max).contains(&number) {
        return Err(ArgError::OutOfRange { name, value: number as f64, min: min as f64, max: max as f64 });
    }
    Ok(Some(number))
}

// ---------------------------------------------------------------------------
// describe_environment: what an agent may run here, from Config.

fn describe_environment_tool() -> Tool {
    // The output schema names the fields and their types; what each means
    // is in docs/mcp-interface.md: this schema is paid in every agent's
    // context, the answer only by the agent that calls.
    let object = json!({"type": "object"});
    let array = json!({"type": "array"});
    let integer = json!({"type": "integer"});
    let strings = json!({"type": "array", "items": {"type": "string"}});
    Tool {
        name: "describe_environment",
        title: "Describe the job environment".to_string(),
        description: "What runs may use here: images, languages, timeouts, caps, CPU, memory, disk, network modes, \
                      sites, warm pools, your limits. Call it before choosing an image or a timeout."
            .to_string(),
        input_schema: json!({ "type": "object", "properties": {}, "additionalProperties": false }),
        output_schema: json!({
            "type": "object",
            "properties": {
                "namespace": { "type": "string", "description": "Kubernetes only" },
                "allowed_images": strings,
                "timeout_s": { "type": "object", "properties": { "default": integer, "max": integer } },
                "max_output_bytes": integer,
                "max_artifact_bytes": integer,
                "default_cpu": { "type": "string" },
                "default_memory": { "type": "string" },
                "max_concurrent": integer,
                "sandboxes": object,
                "disk": object,
                "clone_available": { "type": "boolean" },
                "cache_mount_path": { "type": ["string", "null"] },
                "extra_env_names": strings,
                "languages": array,
                "snippets_available": { "type": "boolean" },
                "sites": array,
                "caller": object,
                "warm_pools": array,
                "network": object,
            },
        }),
        annotations: Annotations { read_only: true, destructive: false, idempotent: true, open_world: false },
        handler: describe_environment,
    }
}

fn describe_environment(ctx: &Ctx, call: &Call<'_>) -> ToolOutcome {
    if let Err(error) = check_known_arguments(call.arguments, &[]) {
        return ToolOutcome::Failure(error.to_string());
    }
    let config = &ctx.config;
    // Values of the extra env may be credentials, so only names are shown.
    let extra_env_names: Vec<&String> = config.job_extra_env.keys().collect();
    let runs = backend_words::runs(config);
    let mut described = json!({
        "allowed_images": config.allowed_images.as_written,
        "timeout_s": { "default": config.default_timeout_s, "max": config.max_timeout_s },
        "max_output_bytes": config.max_output_bytes,
        "max_artifact_bytes": config.max_artifact_bytes,
        "default_cpu": config.default_cpu.as_str(),
        "default_memory": config.default_memory.as_str(),
        "max_concurrent": config.max_concurrent,
        "sandboxes": {
            "max_open": config.max_sandboxes,
            "max_lifetime_s": config.sandbox_max_lifetime_s,
            "default_idle_timeout_s": crate::engine::sandboxes::rules::DEFAULT_IDLE_TIMEOUT.as_secs(),
        },
        "disk": {
            "size_limit": config.workdir_size.as_str(),
            "tmp": crate::sandbox::TMP_DIR,
            "home": crate::sandbox::TMP_DIR,
            "read_only_root": true,
        },
        "caller": admission::describe(&ctx.ledger, call.caller),
        "sites": sites_view(ctx),
        "clone_available": config.clone.is_some(),
        "cache_mount_path": config.cache.as_ref().map(|cache| cache.mount_path.as_str()),
        "extra_env_names": extra_env_names,
        "languages": config.languages.profiles.values().map(|profile| json!({
            "language": profile.name,
            "image": profile.image,
            "entrypoint_filename": profile.filename,
            "command": profile.command,
            "snippet_extensions": profile.extensions,
            "timeout_s": profile.timeout_s,
            "cpu": profile.cpu.as_str(),
            "memory": profile.memory.as_str(),
        })).collect::<Vec<_>>(),
        "snippets_available": config.snippets_dir.is_some(),
        "warm_pools": warm_pools_view(ctx),
        "network": {
            "modes": backend_words::network_modes(config).iter().map(|mode| mode.name()).collect::<Vec<_>>(),
            "run_job_default": config.network_default.name(),
            "execute_code_default": config.execute_code_network_default().name(),
            "enforcement": network_text(runs),
        },
    });
    // A namespace means nothing to a Docker run.
    if runs != backend_words::Runs::Docker {
        described["namespace"] = json!(config.namespace);
    }
    ToolOutcome::Success(described)
}

/// How long `describe_environment` waits for the sites to answer: a site
/// that is down must not hold the call.
const SITE_HEALTH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Every site, asked at once whether it answers (it lists its runs); one
/// that has not answered within `SITE_HEALTH_WAIT` is said to be so. Calls
/// share each site's ask and its answer (`site_health`): no thread per call.
fn sites_view(ctx: &Ctx) -> Vec<Value> {
    let ask = readiness::ask;
    // Every site's ask starts before any is waited for: one that hangs
    // holds no other's.
    for (site, health) in ctx.sites.iter().zip(&ctx.site_health) {
        if let Ok(engine) = &site.engine {
            health.start(ask(engine));
        }
    }
    let deadline = std::time::Instant::now() + SITE_HEALTH_WAIT;
    let health = ctx.sites.iter().zip(&ctx.site_health).map(|(site, health)| match &site.engine {
        Ok(engine) => health.answer_by(deadline, ask(engine)),
        Err(why) => Err(no_backend(why)),
    });
    let configs = match ctx.config.sites.as_slice() {
        [] => vec![&ctx.config],
        sites => sites.iter().map(|site| &site.config).collect(),
    };
    ctx.sites
        .iter()
        .zip(configs)
        .zip(health)
        .enumerate()
        .map(|(index, ((site, config), health))| {
            json!({
                "name": site.name,
                "default": index == 0,
                "backend": config.backend.name(),
                "health": health.map_or_else(|why| format!("unreachable: {why}"), |()| "ok".to_string()),
            })
        })
        .collect()
}

/// The configured pools, with their live figures from the backend that
/// keeps them (zeros while it has none, as on a server without a backend).
fn warm_pools_view(ctx: &Ctx) -> Vec<Value> {
    let figures: Vec<(&str, Vec<crate::engine::port::PoolFigures>)> = ctx
        .sites
        .iter()
        .map(|site| (site.name.as_str(), site.engine.as_ref().map(|engine| engine.backend.pool_figures()).unwrap_or_default()))
        .collect();
    ctx.config
        .warm_pools
        .iter()
        .map(|pool| {
            // A pool that names no site is the default site's.
            let site = pool.site.as_deref().unwrap_or(&ctx.sites[0].name);
            let live = figures
                .iter()
                .filter(|(name, _)| *name == site)
                .flat_map(|(_, figures)| figures)
                .find(|figures| figures.name == pool.name)
                .cloned()
                .unwrap_or_default();
            json!({
                "name": pool.name,
                "site": site,
                "image": pool.image,
                "cpu": pool.cpu.as_ref().map(|cpu| cpu.as_str()),
                "memory": pool.memory.as_ref().map(|memory| memory.as_str()),
                "network": pool.network.name(),
                "size": pool.size,
                "max_idle_s": pool.max_idle.as_secs(),
                "language": pool.language,
                "ready": live.ready,
                "hits": live.hits,
                "misses": live.misses,
            })
        })
        .collect()
}

/// What each mode enforces on the backend in use (both while it is not
/// known); docs/security.md says the same at length. The server sets no
/// firewall rule itself.
fn network_text(runs: backend_words::Runs) -> String {
    match runs {
        backend_words::Runs::Kubernetes => KUBERNETES_NETWORK_TEXT.to_string(),
        backend_words::Runs::Docker => DOCKER_NETWORK_TEXT.to_string(),
        backend_words::Runs::Either => format!("{KUBERNETES_NETWORK_TEXT} {DOCKER_NETWORK_TEXT}"),
    }
}

const KUBERNETES_NETWORK_TEXT: &str = "Kubernetes: the pod carries the label mcp-k8s-ephemeral-job/network=<mode>, and the \
                                       namespace's NetworkPolicies (deploy/networkpolicy-jobs*.yaml) enforce it: no ingress for \
                                       any mode; none: no egress, DNS included; restricted: DNS plus the operator's allowlist; \
                                       open: egress anywhere but private, link-local and loopback ranges (nodes, API server, \
                                       metadata) and the server's namespace. Only where the cluster's network plugin enforces NetworkPolicy.";

const DOCKER_NETWORK_TEXT: &str = "Docker: none is network mode none (loopback only); restricted is the network the \
                                   operator names in MCP_K8S_DOCKER_NETWORK (its rules are the operator's; unset: not offered); \
                                   open is this server's bridge network mcp-k8s-open with inter-container traffic disabled \
                                   (egress anywhere the host routes, no connections from other containers), which needs \
                                   dockerd's iptables rules (its default).";

/// What a tool answers when the server found no backend at start.
pub fn no_backend(why: &str) -> String {
    format!("this server has no backend to run sandboxes on: {why}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RawConfig;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder {
        progress: Mutex<Vec<(f64, Option<f64>)>>,
        logs: Mutex<Vec<String>>,
    }

    impl CallEvents for Recorder {
        fn progress(&self, progress: f64, total: Option<f64>, _message: Option<&str>) {
            self.progress.lock().unwrap().push((progress, total));
        }
        fn log(&self, _level: Level, message: &str) {
            self.logs.lock().unwrap().push(message.to_string());
        }
    }

    fn ctx() -> Ctx {
        let raw = RawConfig::from_lookup(|name| match name {
            "MCP_K8S_ALLOWED_IMAGES" => Some("python:3.12,busybox,golang:1.23".into()),
            "MCP_K8S_JOB_EXTRA_ENV" => Some(r#"{"TOKEN":"secret-value"}"#.into()),
            "MCP_K8S_TEST_TOOLS" => Some("1".into()),
            _ => None,
        });
        Ctx::new(Config::from_raw(&raw).unwrap(), Err("no cluster in tool tests".into()))
    }

    fn run(tool: &str, arguments: Value) -> (ToolOutcome, Recorder) {
        let ctx = ctx();
        let registry = Registry::new(&ctx.config);
        let Value::Object(arguments) = arguments else { panic!("arguments must be an object") };
        let recorder = Recorder::default();
        let cancel = CancelToken::new();
        let caller = crate::callers::Caller::whole_server("stdio");
        let call = Call { arguments: &arguments, cancel: &cancel, events: &recorder, trace: None, caller: &caller };
        let outcome = (registry.find(tool).unwrap().handler)(&ctx, &call);
        (outcome, recorder)
    }

    #[test]
    fn every_tool_has_the_metadata_clients_check() {
        let ctx = ctx();
        for tool in Registry::new(&ctx.config).list_json(|_| true)["tools"].as_array().unwrap() {
            let name = tool["name"].as_str().unwrap();
            assert!(name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{name}");
            assert!(!tool["description"].as_str().unwrap().is_empty(), "{name}");
            assert_eq!(tool["inputSchema"]["type"], "object", "{name}");
            assert_eq!(tool["outputSchema"]["type"], "object", "{name}");
            assert!(tool["annotations"]["readOnlyHint"].is_boolean(), "{name}");
        }
    }

    #[test]
    fn test_tools_are_registered_only_on_request() {
        let config = Config::from_raw(&RawConfig::default()).unwrap();
        let production = [
            "describe_environment",
            "run_job",
            "execute_code",
            "submit_job",
            "fetch_job",
            "cancel_job",
            "list_jobs",
            "open_sandbox",
            "close_sandbox",
            "list_sandboxes",
        ];
        assert_eq!(Registry::new(&config).names(), production);
        assert_eq!(Registry::new(&ctx().config).names(), [&production[..], &["test_sleep", "test_panic"]].concat());
    }

    #[test]
    fn a_sandbox_id_names_its_site_as_a_token_does() {
        let site_of = |value: Value, site: Option<&str>| {
            let given = value.as_object().cloned().unwrap();
            call_args::sandbox_id(&given, site.map(str::to_string)).map(|read| (read.id, read.site))
        };
        let id = "sbx-0123456789abcdef0123456789abcdef";
        let owned = |text: &str| Some(text.to_string());
        assert_eq!(public_sandbox_id(id, Some("eu")), format!("{id}.eu"));
        assert_eq!(public_sandbox_id(id, None), id);
        let on_eu = json!({"sandbox": format!("{id}.eu")});
        assert_eq!(site_of(on_eu.clone(), None), Ok((owned(id), owned("eu"))), "the id's site, taken off it");
        assert_eq!(site_of(on_eu.clone(), Some("eu")), Ok((owned(id), owned("eu"))), "the same site named twice");
        let refused = site_of(on_eu, Some("us")).unwrap_err();
        assert_eq!(refused, format!("sandbox `{id}` is on site `eu`, not `us`; leave `site` out"));
        assert_eq!(site_of(json!({"sandbox": id}), Some("us")), Ok((owned(id), owned("us"))), "no site in the id");
        assert_eq!(site_of(json!({"command": ["true"]}), None), Ok((None, None)));
    }

    #[test]
    fn describe_environment_reports_config_but_no_env_values() {
        let (outcome, _) = run("describe_environment", json!({}));
        let ToolOutcome::Success(result) = outcome else { panic!("{outcome:?}") };
        assert_eq!(result["allowed_images"], json!(["python:3.12", "busybox", "golang:1.23"]));
        assert_eq!(result["timeout_s"], json!({ "default": 60, "max": 600 }));
        assert_eq!(result["namespace"], "mcp-ephemeral");
        assert_eq!(result["cache_mount_path"], Value::Null);
        assert_eq!(result["extra_env_names"], json!(["TOKEN"]));
        assert!(!result.to_string().contains("secret-value"));
        let languages: Vec<&Value> = result["languages"].as_array().unwrap().iter().map(|language| &language["language"]).collect();
        assert_eq!(languages, ["go"], "only the languages whose image is allowed (python's is python:3.12-slim)");
        let go = result["languages"].as_array().unwrap().iter().find(|language| language["language"] == "go").unwrap();
        assert_eq!(go["image"], "golang:1.23");
        assert_eq!(go["command"], json!(["go", "run", "{file}"]));
        assert_eq!(result["snippets_available"], false);
        let network = &result["network"];
        assert_eq!(network["modes"], json!(["none", "restricted", "open"]));
        assert_eq!((network["run_job_default"].as_str(), network["execute_code_default"].as_str()), (Some("open"), Some("none")));
        assert!(network["enforcement"].as_str().unwrap().contains("mcp-k8s-ephemeral-job/network"), "{network}");
    }

    #[test]
    fn the_job_tools_take_a_network_of_the_three_modes_with_their_defaults() {
        let config = Config::from_raw(&RawConfig::default()).unwrap();
        let registry = Registry::new(&config);
        for (name, default) in [("run_job", "default open"), ("submit_job", "default open"), ("execute_code", "default none")] {
            let tool = registry.tools.iter().find(|tool| tool.name == name).unwrap_or_else(|| panic!("{name}"));
            let network = &tool.input_schema["properties"]["network"];
            assert_eq!(network["enum"], json!(["none", "restricted", "open"]), "{name}");
            assert!(network["description"].as_str().unwrap().contains(default), "{name}: {network}");
        }
    }

    #[test]
    fn bad_arguments_are_tool_errors_that_say_what_is_wrong() {
        let cases = [
            ("describe_environment", json!({ "x": 1 }), "unknown argument `x`; this tool takes no arguments"),
            ("test_sleep", json!({}), "missing required argument `seconds`"),
            ("test_sleep", json!({ "seconds": "1" }), "argument `seconds` must be a number, not a string"),
            ("test_sleep", json!({ "seconds": 601 }), "argument `seconds` is `601`; accepted: 0 to 600"),
            (
                "test_sleep",
                json!({ "seconds": 1, "progress_every_ms": 1.5 }),
                "argument `progress_every_ms` must be a whole number, not a fraction or a negative number",
            ),
            ("test_sleep", json!({ "seconds": 1, "progress_every_ms": 5 }), "argument `progress_every_ms` is `5`; accepted: 10 to 60000"),
            ("test_sleep", json!({ "secs": 1 }), "unknown argument `secs`; accepted: seconds, progress_every_ms"),
        ];
        for (tool, arguments, expected) in cases {
            let (outcome, _) = run(tool, arguments.clone());
            assert_eq!(outcome, ToolOutcome::Failure(expected.to_string()), "{tool} {arguments}");
        }
    }

    /// A long unknown argument is quoted short.
    #[test]
    fn a_long_unknown_argument_is_quoted_short() {
        let arguments: Map<String, Value> = [("x".repeat(10_000), json!(1))].into_iter().collect();
        let (outcome, _) = run("describe_environment", Value::Object(arguments));
        let ToolOutcome::Failure(text) = outcome else { panic!("{outcome:?}") };
        assert!(text.len() < 200 && text.contains("… (10000 bytes)"), "{text}");
    }

    #[test]
    fn test_sleep_reports_increasing_progress() {
        let (outcome, recorder) = run("test_sleep", json!({ "seconds": 0.05, "progress_every_ms": 20 }));
        assert_eq!(outcome, ToolOutcome::Success(json!({ "slept_ms": 50 })));
        assert_eq!(*recorder.progress.lock().unwrap(), [(20.0, Some(50.0)), (40.0, Some(50.0)), (50.0, Some(50.0))]);
        assert_eq!(*recorder.logs.lock().unwrap(), ["sleeping 50 ms"]);
    }

    #[test]
    fn results_repeat_structured_content_as_text_and_errors_carry_none() {
        let success = result_json(ToolOutcome::Success(json!({ "a": 1 })));
        assert_eq!(success["content"][0]["text"], r#"{"a":1}"#);
        assert_eq!(success["structuredContent"], json!({ "a": 1 }));
        assert_eq!(success["isError"], false);
        let failure = result_json(ToolOutcome::Failure("nope".into()));
        assert_eq!(failure, json!({ "content": [{ "type": "text", "text": "nope" }], "isError": true }));
    }
}

/// The whole `tools/list` is paid in every agent's context window before
/// its first call, so it has a budget, measured as served.
#[cfg(test)]
mod list_size {
    use super::*;
    use crate::config::RawConfig;

    /// The budget for the serialised `tools/list` result, every tool.
    const BUDGET_BYTES: usize = 16 * 1024;

    fn served_bytes(settings: &[(&str, &str)]) -> (usize, Vec<(&'static str, usize)>) {
        let raw = RawConfig::from_lookup(|name| settings.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string()));
        let config = Config::from_raw(&raw).unwrap();
        let registry = Registry::new(&config);
        let per_tool = registry.tools.iter().map(|tool| (tool.name, json_text(&tool.to_json()).len())).collect();
        (json_text(&registry.list_json(|_| true)).len(), per_tool)
    }

    #[test]
    fn tools_list_fits_its_budget_with_typical_settings() {
        let typical_images = "python:3.12-slim,node:22-slim,golang:1.23,bash:5.2,busybox:1.36,alpine:3.20,ubuntu:24.04";
        // The test hooks (MCP_K8S_TEST_TOOLS) are never served in production.
        let cases: [&[(&str, &str)]; 5] = [
            &[],
            &[("MCP_K8S_ALLOWED_IMAGES", typical_images)],
            &[("MCP_K8S_ALLOWED_IMAGES", typical_images), ("MCP_K8S_BACKEND", "docker")],
            &[("MCP_K8S_ALLOWED_IMAGES", typical_images), ("MCP_K8S_BACKEND", "kubernetes")],
            &[("MCP_K8S_ALLOWED_IMAGES", typical_images), ("MCP_K8S_SNIPPETS_DIR", env!("CARGO_MANIFEST_DIR"))],
        ];
        let over: Vec<String> = cases
            .iter()
            .map(|settings| (settings, served_bytes(settings)))
            .filter(|(_, (bytes, _))| *bytes > BUDGET_BYTES)
            .map(|(settings, (bytes, per_tool))| format!("{bytes} bytes with {settings:?}: {per_tool:?}"))
            .collect();
        assert!(over.is_empty(), "tools/list over its {BUDGET_BYTES} bytes:\n{}", over.join("\n"));
    }
}
