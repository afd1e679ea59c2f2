//! `open_sandbox`, `close_sandbox` and `list_sandboxes`, and the
//! `sandbox` argument `run_job` and `execute_code` take: a sandbox that
//! keeps its workdir, `HOME` and what calls installed, for one caller's
//! calls one at a time, until it is closed, idle for `idle_timeout_s` or
//! `max_lifetime_s` old. The engine keeps the rules
//! (`engine::sandboxes::rules`) and runs the calls (`engine::sandboxes`); this
//! file checks arguments and shapes results.

use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::config::Config;
use crate::engine::port::sandbox_record::Seen;
use crate::engine::sandboxes::rules;
use crate::engine::sandboxes::{self, Opening, Refusal};
use crate::tools::job_args::{self, ArgBounds, arg_bounds};
use crate::tools::run_job::network_schema;
use crate::tools::{Annotations, Call, Ctx, Tool, ToolOutcome, call_args};

pub fn tools(config: &Config) -> Vec<Tool> {
    vec![open_sandbox_tool(config), close_sandbox_tool(config), list_sandboxes_tool(config)]
}

fn open_sandbox_tool(config: &Config) -> Tool {
    Tool {
        name: "open_sandbox",
        title: "Open a sandbox that keeps its state across calls".to_string(),
        description: format!(
            "Opens a {} that keeps its workdir, HOME (/tmp) and installs across calls: pass its id as `sandbox` to \
             run_job, submit_job or execute_code, one call at a time. Give `image` or `language`. Closes, deleting \
             everything, when idle_timeout_s or max_lifetime_s pass or at close_sandbox. The id is a secret. At most {} \
             open here. {}",
            super::backend_words::runs(config).sandbox(),
            config.max_sandboxes,
            super::answer::RULE
        ),
        input_schema: json!({
            "type": "object",
            "additionalProperties": false,
            "properties": with_site(config, json!({
                "image": {"type": "string", "description": format!("allowed: {}", super::run_job::allowed_images_text(config))},
                "language": {"type": "string", "enum": config.languages.names(), "description": "instead of image: an execute_code language"},
                "limits": {"type": "object", "additionalProperties": false, "properties": {
                    "cpu": {"type": "string", "description": "e.g. 500m"},
                    "memory": {"type": "string", "description": "e.g. 512Mi"},
                }},
                "network": network_schema(config, config.network_default),
                "files": files_schema(config),
                "idle_timeout_s": {"type": "integer", "minimum": 1, "description": format!("default {}", rules::DEFAULT_IDLE_TIMEOUT.as_secs())},
                "max_lifetime_s": {"type": "integer", "minimum": 60, "maximum": config.sandbox_max_lifetime_s, "description": format!("default {}", config.sandbox_max_lifetime_s.min(rules::DEFAULT_MAX_LIFETIME.as_secs()))},
            })),
        }),
        output_schema: sandbox_schema_out(),
        annotations: Annotations { read_only: false, destructive: false, idempotent: false, open_world: true },
        handler: open_sandbox,
    }
}

/// `run_job`'s `files`, written into the workdir as the sandbox opens.
fn files_schema(config: &Config) -> Value {
    let mut files = super::run_job::input_schema(config)["properties"]["files"].clone();
    files["description"] = json!("written into its workdir before it answers");
    files
}

/// One sandbox as the tools show it; with `status: error`, `reason` and
/// `message` when it could not be opened or closed.
fn sandbox_schema_out() -> Value {
    json!({
        "type": "object",
        "description": "sandbox (its id, a secret), image, language, network, limits, workdir, state (idle|busy|expired|closed), \
                        opened_at, age_s, idle_s, idle_timeout_s, expires_at; when refused: status, reason, message",
    })
}

/// The argument every sandbox tool takes besides its own, read by
/// `call_args::site`.
const SITE: &[&str] = &["site"];

/// `properties` and, with several sites, `site`.
fn with_site(config: &Config, mut properties: Value) -> Value {
    if let Some(site) = super::site_schema(config) {
        properties["site"] = site;
    }
    properties
}

fn open_sandbox(ctx: &Ctx, call: &Call<'_>) -> ToolOutcome {
    let site = match call_args::site(call.arguments) {
        Ok(site) => site,
        Err(why) => return ToolOutcome::Failure(why),
    };
    let mut opening = match parse_open(call.arguments, &ctx.config, call.caller.owner()) {
        Ok(opening) => opening,
        Err(why) => return ToolOutcome::Failure(why),
    };
    // The caller's limits before anything is asked of the site: a refused
    // opening creates nothing.
    let admitted = ctx
        .site(site.as_deref())
        .and_then(|named| super::admission::admit_sandbox(&ctx.ledger, call.caller, &named.name, &opening.spec.image).map(|()| named));
    let engine = match admitted.and_then(|named| named.engine.as_ref().map_err(|why| super::no_backend(why))) {
        Ok(engine) => engine,
        Err(why) => return ToolOutcome::Failure(why),
    };
    let files = std::mem::take(&mut opening.spec.files);
    let seen = match sandboxes::open(engine, &opening) {
        Ok(seen) => seen,
        Err(refused) => return refused_outcome(&refused),
    };
    if let Err(refused) = write_files(engine, &seen, &opening, files, call.cancel) {
        if let Err(not_closed) = sandboxes::close(engine, &seen.record.id, opening.spec.owner.as_deref()) {
            crate::log::warn("a sandbox whose files failed was not closed; the reaper removes it", &[("error", not_closed.message.into())]);
        }
        return refused_outcome(&refused);
    }
    ToolOutcome::Success(seen_json(&seen, true, shown_site(ctx, engine)))
}

/// The site a sandbox id shows: its engine's, on a server with named sites.
fn shown_site<'a>(ctx: &Ctx, engine: &'a crate::engine::run::Ctx) -> Option<&'a str> {
    engine.site.as_deref().filter(|_| ctx.named_sites)
}

/// How long writing the opening files may take.
const FILES_TIMEOUT: Duration = Duration::from_secs(60);

/// Writes the opening `files` into the new sandbox's workdir: a first call
/// that runs nothing, with the files a call takes.
fn write_files(
    engine: &crate::engine::run::Ctx,
    seen: &Seen,
    opening: &Opening,
    files: Vec<crate::engine::port::spec::InputFile>,
    cancel: &crate::cancel::CancelToken,
) -> Result<(), Refusal> {
    if files.is_empty() {
        return Ok(());
    }
    let spec =
        crate::engine::port::spec::RunSpec { command: vec!["true".to_string()], files, timeout: FILES_TIMEOUT, ..opening.spec.clone() };
    let run_id = crate::engine::run::new_run_id();
    // Looked at afresh: the opening's view has no version to take it by.
    let sandbox = sandboxes::Named { id: seen.record.id.clone(), seen: None };
    let outcome = sandboxes::call(engine, &sandbox, &spec, &run_id, cancel, &|_| {});
    match outcome.status {
        crate::engine::port::spec::RunStatus::Succeeded => Ok(()),
        _ => Err(Refusal {
            reason: outcome.reason.unwrap_or(crate::engine::port::spec::RunReason::StartFailed),
            message: format!("the files could not be written into the sandbox, which was closed again: {}", outcome.message),
        }),
    }
}

fn parse_open(arguments: &Map<String, Value>, config: &Config, owner: Option<&str>) -> Result<Opening, String> {
    let accepted = &["image", "language", "limits", "network", "files", "idle_timeout_s", "max_lifetime_s"];
    super::check_known_arguments_besides(arguments, accepted, SITE).map_err(|error| error.to_string())?;
    let seconds = |name: &str, default: u64, min: u64, max: u64| match arguments.get(name).filter(|value| !value.is_null()) {
        None => Ok(default),
        Some(value) => value
            .as_u64()
            .filter(|seconds| (min..=max).contains(seconds))
            .ok_or_else(|| format!("`{name}` must be a whole number from {min} to {max}")),
    };
    let max_cap = config.sandbox_max_lifetime_s;
    let max_lifetime = seconds("max_lifetime_s", max_cap.min(rules::DEFAULT_MAX_LIFETIME.as_secs()), 60, max_cap)?;
    let idle_timeout = seconds("idle_timeout_s", rules::DEFAULT_IDLE_TIMEOUT.as_secs().min(max_lifetime), 1, max_lifetime)?;
    let language = arguments.get("language").and_then(Value::as_str);
    let mut run_args = Map::new();
    let bounds = match (arguments.get("image"), language) {
        (Some(image), None) => {
            run_args.insert("image".into(), image.clone());
            arg_bounds(config)
        }
        (None, Some(language)) => {
            let profile = config.languages.profile(language)?;
            run_args.insert("image".into(), json!(profile.image));
            run_args.insert("limits".into(), json!({"cpu": profile.cpu.as_str(), "memory": profile.memory.as_str()}));
            ArgBounds { network_default: config.execute_code_network_default(), clone_enabled: false, ..arg_bounds(config) }
        }
        _ => return Err("give one of `image` and `language`".to_string()),
    };
    for carried in ["limits", "network", "files"] {
        if let Some(value) = arguments.get(carried) {
            run_args.insert(carried.into(), value.clone());
        }
    }
    run_args.insert("command".into(), json!(["sandbox"]));
    let mut spec = job_args::parse_run_args(&run_args, &bounds).map_err(|error| error.to_string())?;
    spec.owner = owner.map(str::to_string);
    Ok(Opening {
        spec,
        language: language.map(str::to_string),
        idle_timeout: Duration::from_secs(idle_timeout),
        max_lifetime: Duration::from_secs(max_lifetime),
    })
}

fn close_sandbox_tool(config: &Config) -> Tool {
    Tool {
        name: "close_sandbox",
        title: "Close an open sandbox".to_string(),
        description: "Closes an open sandbox, deleting everything in it; a call running in it ends with reason SandboxEnded.".to_string(),
        input_schema: json!({
            "type": "object",
            "required": ["sandbox"],
            "additionalProperties": false,
            "properties": with_site(config, json!({"sandbox": {"type": "string"}})),
        }),
        output_schema: sandbox_schema_out(),
        annotations: Annotations { read_only: false, destructive: true, idempotent: true, open_world: true },
        handler: close_sandbox,
    }
}

fn close_sandbox(ctx: &Ctx, call: &Call<'_>) -> ToolOutcome {
    let call_args::SandboxId { id, site } = match call_args::sandbox_to_close(call.arguments) {
        Ok(read) => read,
        Err(why) => return ToolOutcome::Failure(why),
    };
    if let Err(error) = super::check_known_arguments_besides(call.arguments, &["sandbox"], SITE) {
        return ToolOutcome::Failure(error.to_string());
    }
    let Some(id) = id.as_deref() else {
        return ToolOutcome::Failure("`sandbox` is required: the id open_sandbox gave".to_string());
    };
    let engine = match ctx.engine_of(site.as_deref()) {
        Ok(engine) => engine,
        Err(why) => return ToolOutcome::Failure(why),
    };
    match sandboxes::close(engine, id, call.caller.owner()) {
        Ok(seen) => {
            let mut closed = seen_json(&seen, false, shown_site(ctx, engine));
            closed["state"] = json!("closed");
            ToolOutcome::Success(closed)
        }
        Err(refused) => refused_outcome(&refused),
    }
}

fn list_sandboxes_tool(config: &Config) -> Tool {
    Tool {
        name: "list_sandboxes",
        title: "List open sandboxes".to_string(),
        description: "Your open sandboxes with their state (idle, busy, expired: closing soon).".to_string(),
        input_schema: json!({
            "type": "object",
            "additionalProperties": false,
            "properties": with_site(config, json!({})),
        }),
        output_schema: json!({
            "type": "object",
            "required": ["sandboxes"],
            "properties": {
                "sandboxes": {"type": "array", "items": sandbox_schema_out()},
                "unreachable_sites": {"type": "array"},
            },
        }),
        annotations: Annotations { read_only: true, destructive: false, idempotent: true, open_world: true },
        handler: list_sandboxes,
    }
}

fn list_sandboxes(ctx: &Ctx, call: &Call<'_>) -> ToolOutcome {
    let site = match call_args::site(call.arguments) {
        Ok(site) => site,
        Err(why) => return ToolOutcome::Failure(why),
    };
    if let Err(error) = super::check_known_arguments_besides(call.arguments, &[], SITE) {
        return ToolOutcome::Failure(error.to_string());
    }
    if site.is_none() && ctx.named_sites {
        return list_every_site(ctx, call);
    }
    let engine = match ctx.engine_of(site.as_deref()) {
        Ok(engine) => engine,
        Err(why) => return ToolOutcome::Failure(why),
    };
    match sandboxes::list(engine, call.caller.owner()) {
        Ok(listed) => {
            let shown = listed.iter().map(|seen| seen_json(seen, true, shown_site(ctx, engine))).collect::<Vec<_>>();
            ToolOutcome::Success(json!({"sandboxes": shown}))
        }
        Err(refused) => refused_outcome(&refused),
    }
}

/// How long `list_sandboxes` waits for a site that does not answer.
const LIST_WAIT: Duration = Duration::from_secs(10);

/// `list_sandboxes` without `site` on a server with named sites: every
/// site's, each id with its site; a site that cannot be asked is named in
/// `unreachable_sites` (as list_jobs does) rather than failing the others.
fn list_every_site(ctx: &Ctx, call: &Call<'_>) -> ToolOutcome {
    let owner = call.caller.owner().map(str::to_string);
    let answers = ctx.ask_sites(LIST_WAIT, move |engine| {
        let listed = sandboxes::list(engine, owner.as_deref()).map_err(|refused| refused.message)?;
        Ok(listed.iter().map(|seen| seen_json(seen, true, engine.site.as_deref())).collect::<Vec<_>>())
    });
    let (mut shown, mut unreachable) = (Vec::new(), Vec::new());
    for (site, answer) in ctx.sites.iter().zip(answers) {
        match answer {
            Ok(listed) => shown.extend(listed),
            Err(why) => unreachable.push(json!({"site": site.name, "message": why})),
        }
    }
    let mut listed = json!({"sandboxes": shown});
    if !unreachable.is_empty() {
        listed["unreachable_sites"] = json!(unreachable);
    }
    ToolOutcome::Success(listed)
}

/// A sandbox the site or the sandbox's state refused (its limit, the
/// API, a sandbox that is gone): tried, so a result with its reason, as
/// `run_job` answers the same refusals (`answer::is_error`). It was an
/// `isError` once, unlike run_job's, with no rule to tell the caller why.
fn refused_outcome(refused: &Refusal) -> ToolOutcome {
    let ran = crate::tools::answer::Answer::Ran { status: crate::engine::port::spec::RunStatus::Error, reason: Some(refused.reason) };
    ToolOutcome::Rendered {
        text: format!("{}: {}", refused.reason.name(), refused.message),
        structured: json!({"status": "error", "reason": refused.reason.name(), "message": refused.message}),
        extra_content: Vec::new(),
        is_error: crate::tools::answer::is_error(crate::tools::answer::Shape::RunResult, ran),
    }
}

/// One sandbox as the tools show it; `site`: the site its id names.
fn seen_json(seen: &Seen, with_state: bool, site: Option<&str>) -> Value {
    let record = &seen.record;
    let now = crate::time::unix_ms(std::time::SystemTime::now());
    let at = |ms: u64| crate::log::rfc3339_utc(std::time::UNIX_EPOCH + Duration::from_millis(ms));
    let mut shown = json!({
        "sandbox": super::public_sandbox_id(&record.id, site),
        "image": record.image,
        "language": record.language,
        "network": record.network,
        "limits": {"cpu": record.cpu, "memory": record.memory},
        "workdir": record.workdir,
        "opened_at": at(record.opened_at_ms),
        "age_s": now.saturating_sub(record.opened_at_ms) / 1000,
        "idle_s": seen.last_used_ms.map_or(0, |used| now.saturating_sub(used) / 1000),
        "idle_timeout_s": record.idle_timeout_s,
        "expires_at": at(record.expires_at_ms),
    });
    if with_state {
        shown["state"] = json!(rules::state_name(seen, now));
    }
    shown
}
