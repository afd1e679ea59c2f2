//! One parse of a run call: the arguments of `run_job`, `submit_job` and
//! `execute_code` (and their task-augmented calls) become one `RunCall`
//! (the checked run spec, the site and its engine, the open sandbox the
//! call runs in, the idempotency key) or one `CallArgsError`.
//!
//! The call's arguments are read here and never rewritten: the call-level
//! arguments (`CALL_FIELDS`) are read by this module alone, and each tool's
//! own checks (`job_args`, `execute_code`) skip them. The sandbox tools
//! read `site` and a sandbox id's site through `site` and `sandbox_id`.
//! What a run does is the engine's; this module only looks a sandbox up.

use serde_json::{Map, Value};

use crate::callers::Caller;
use crate::config::Config;
use crate::engine;
use crate::engine::background::TokenKind;
use crate::engine::background::idempotency::Keyed;
use crate::engine::port::spec::RunSpec;
use crate::engine::sandboxes::{Named, Refusal};
use crate::json::json_kind;
use crate::tools::{Ctx, SiteEngine, admission, idempotency, job_args};

/// The arguments every run tool takes besides its own, read here only.
const CALL_FIELDS: &[&str] = &["site", "sandbox", idempotency::ARGUMENT];

/// The run tools, as a call names them.
#[derive(Clone, Copy, Debug)]
pub enum RunTool {
    RunJob,
    SubmitJob,
    /// With how its own arguments become its run
    /// (`execute_code::parse_execute_args`): handed in, as that module
    /// calls this one.
    ExecuteCode(CodeSpec),
}

/// `execute_code`'s arguments, less `call_fields`, as the run they describe.
pub type CodeSpec = fn(arguments: &Map<String, Value>, config: &Config, call_fields: &[&str]) -> Result<RunSpec, String>;

/// `execute_code`'s name, also in `background::TASK_TOOLS`.
pub const EXECUTE_CODE: &str = "execute_code";

impl RunTool {
    /// The tool's name: part of what an idempotency key stands for.
    pub fn name(self) -> &'static str {
        match self {
            RunTool::RunJob => "run_job",
            RunTool::SubmitJob => "submit_job",
            RunTool::ExecuteCode(_) => EXECUTE_CODE,
        }
    }

    /// The kind of job token the call's run gets.
    pub fn token_kind(self) -> TokenKind {
        match self {
            RunTool::RunJob | RunTool::SubmitJob => TokenKind::Job,
            RunTool::ExecuteCode(_) => TokenKind::Code,
        }
    }
}

/// A run call, parsed once: everything the tools need to run it.
pub struct RunCall<'c> {
    pub tool: RunTool,
    /// The run, checked in full (in a sandbox without `image`: the
    /// sandbox's image).
    pub spec: RunSpec,
    /// The site the call runs on (the default when it names none) and
    /// that site's engine.
    pub site: &'c str,
    pub engine: &'c engine::run::Ctx,
    /// The open sandbox the call runs in, if it names one.
    pub sandbox: Option<Named>,
    /// The idempotency key, of the caller and the site, if one was given.
    pub keyed: Option<Keyed>,
}

/// Why a run call's arguments do not make a run.
#[derive(Debug)]
pub enum CallArgsError {
    /// The caller must change the arguments (or name a site there is).
    Invalid(String),
    /// The site named has no engine now: retrying later may work.
    Unavailable(String),
    /// The sandbox named cannot take the call: a result with its status
    /// and reason, not a tool error.
    Refused(Refusal),
}

/// A key names a kept run, which a call in a sandbox is not.
const NO_KEY_WITH_SANDBOX: &str = "`idempotency_key` cannot be given with `sandbox`: a call in a sandbox is not kept to be found again";

/// Parses a call of `tool` by `caller` once, in the order a caller is
/// told what is wrong: the key, the site, the sandbox (looked up when the
/// call needs its image), the tool's own arguments, then the site's engine.
pub fn parse<'c>(ctx: &'c Ctx, caller: &Caller, tool: RunTool, arguments: &Map<String, Value>) -> Result<RunCall<'c>, CallArgsError> {
    let keyed = idempotency::key(tool.name(), arguments, caller).map_err(CallArgsError::Invalid)?;
    let site = site(arguments).map_err(CallArgsError::Invalid)?;
    let SandboxId { id, site } = sandbox_id(arguments, site).map_err(CallArgsError::Invalid)?;
    if keyed.is_some() && id.is_some() {
        return Err(CallArgsError::Invalid(NO_KEY_WITH_SANDBOX.to_string()));
    }
    let mut named_site = None;
    let mut sandbox = None;
    if let Some(id) = id {
        let in_site = ctx.site(site.as_deref()).map_err(CallArgsError::Invalid)?;
        admission::precheck(&ctx.ledger, caller, &in_site.name).map_err(CallArgsError::Invalid)?;
        check_fixed(tool, arguments)?;
        sandbox = Some(Named { id, seen: None });
        named_site = Some(in_site);
    }
    let spec = parse_spec(ctx, caller, tool, arguments, named_site, &mut sandbox)?;
    let named_site = match named_site {
        Some(named_site) => named_site,
        None => ctx.site(site.as_deref()).map_err(CallArgsError::Invalid)?,
    };
    let engine = engine_of(named_site)?;
    let keyed = keyed.map(|keyed| keyed.of_site(engine.site.as_deref()));
    Ok(RunCall { tool, spec, site: &named_site.name, engine, sandbox, keyed })
}

/// The `site` argument (`null` is none: the default site).
pub fn site(arguments: &Map<String, Value>) -> Result<Option<String>, String> {
    match arguments.get("site") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(site)) => Ok(Some(site.clone())),
        Some(other) => Err(format!("argument `site` must be a string, not {}; describe_environment lists the sites", json_kind(other))),
    }
}

/// The `sandbox` argument: the engine's id, and the call's site (the one
/// the id names after its `.`, on a server with named sites).
#[derive(Debug, PartialEq)]
pub struct SandboxId {
    pub id: Option<String>,
    pub site: Option<String>,
}

/// Reads `sandbox` (`null` is none) with the `site` given: an id that
/// names a site makes it the call's, and a `site` naming another is an
/// error.
pub fn sandbox_id(arguments: &Map<String, Value>, site: Option<String>) -> Result<SandboxId, String> {
    let id = match arguments.get("sandbox") {
        None | Some(Value::Null) => return Ok(SandboxId { id: None, site }),
        Some(Value::String(id)) => id,
        Some(other) => {
            return Err(format!("argument `sandbox` must be a string (an id from open_sandbox), not {}", json_kind(other)));
        }
    };
    let Some((id, named)) = id.split_once('.') else { return Ok(SandboxId { id: Some(id.clone()), site }) };
    if let Some(given) = site.as_deref().filter(|given| *given != named) {
        return Err(format!(
            "sandbox `{}` is on site `{}`, not `{}`; leave `site` out",
            crate::echo::shorten(id),
            crate::echo::shorten(named),
            crate::echo::shorten(given)
        ));
    }
    Ok(SandboxId { id: Some(id.to_string()), site: Some(named.to_string()) })
}

/// `close_sandbox`'s `sandbox` and `site`: an id that is not a string is
/// none, which the tool says is required.
pub fn sandbox_to_close(arguments: &Map<String, Value>) -> Result<SandboxId, String> {
    let site = site(arguments)?;
    match arguments.get("sandbox") {
        Some(Value::String(_)) => sandbox_id(arguments, site),
        _ => Ok(SandboxId { id: None, site }),
    }
}

/// What a sandbox fixed at its opening, which a call in it cannot change.
fn check_fixed(tool: RunTool, arguments: &Map<String, Value>) -> Result<(), CallArgsError> {
    let given = |name: &str| arguments.get(name).is_some_and(|value| !value.is_null());
    if let RunTool::ExecuteCode(_) = tool {
        // execute_code's language names the image.
        if given("network") {
            return Err(CallArgsError::Invalid(
                "`network` cannot be given with `sandbox`: a sandbox's network is fixed when it is opened".to_string(),
            ));
        }
        return Ok(());
    }
    match ["limits", "network", "clone", "workdir"].into_iter().find(|fixed| given(fixed)) {
        Some(fixed) => Err(CallArgsError::Invalid(format!(
            "`{fixed}` cannot be given with `sandbox`: a sandbox's image, limits, network and workdir are fixed when it is opened"
        ))),
        None => Ok(()),
    }
}

/// The tool's own arguments as the run they describe. A `run_job` or
/// `submit_job` call in a sandbox that names no image runs the sandbox's,
/// looked up here (and kept on `sandbox`, which spares the run a look).
fn parse_spec(
    ctx: &Ctx,
    caller: &Caller,
    tool: RunTool,
    arguments: &Map<String, Value>,
    named_site: Option<&SiteEngine>,
    sandbox: &mut Option<Named>,
) -> Result<RunSpec, CallArgsError> {
    if let RunTool::ExecuteCode(code_spec) = tool {
        return code_spec(arguments, &ctx.config, CALL_FIELDS).map_err(CallArgsError::Invalid);
    }
    let mut sandbox_image = None;
    if let (Some(named), Some(named_site)) = (sandbox.as_mut(), named_site)
        && !arguments.contains_key("image")
    {
        let engine = engine_of(named_site)?;
        let seen = engine::sandboxes::find_yours(engine, &named.id, caller.owner()).map_err(CallArgsError::Refused)?;
        sandbox_image = Some(seen.record.image.clone());
        named.seen = Some(seen);
    }
    let bounds = job_args::arg_bounds(&ctx.config);
    job_args::parse_call_run_args(arguments, &bounds, CALL_FIELDS, sandbox_image.as_deref())
        .map_err(|error| CallArgsError::Invalid(error.to_string()))
}

fn engine_of(site: &SiteEngine) -> Result<&engine::run::Ctx, CallArgsError> {
    site.engine.as_ref().map_err(|why| CallArgsError::Unavailable(super::no_backend(why)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::RawConfig;

    /// A server with one site and no engine there: a call whose arguments
    /// are all right parses as far as the engine, which is then missing.
    fn ctx() -> Ctx {
        let raw = RawConfig::from_lookup(|name| match name {
            "MCP_K8S_ALLOWED_IMAGES" => Some("python:3.12,busybox,golang:1.23".into()),
            _ => None,
        });
        Ctx::new(Config::from_raw(&raw).unwrap(), Err("no cluster in tool tests".into()))
    }

    fn code() -> RunTool {
        RunTool::ExecuteCode(crate::tools::execute_code::parse_execute_args)
    }

    /// What a parse says, in words a table can hold.
    fn said(ctx: &Ctx, tool: RunTool, arguments: serde_json::Value) -> String {
        let arguments = arguments.as_object().cloned().unwrap();
        let caller = Caller::whole_server("stdio");
        match parse(ctx, &caller, tool, &arguments) {
            Ok(run_call) => format!("parsed: {}", run_call.spec.image),
            Err(CallArgsError::Invalid(why)) => format!("invalid: {why}"),
            Err(CallArgsError::Unavailable(why)) => format!("unavailable: {why}"),
            Err(CallArgsError::Refused(refused)) => format!("refused: {}", refused.message),
        }
    }

    #[test]
    fn a_run_call_is_parsed_once_into_one_struct_or_one_error() {
        let ctx = ctx();
        let no_engine = "unavailable: this server has no backend to run sandboxes on: no cluster in tool tests";
        let job = json!({"image": "busybox", "command": ["true"]});
        let with = |extra: serde_json::Value| {
            let mut arguments = job.clone();
            arguments.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap());
            arguments
        };
        let go = json!({"language": "go", "entrypoint_code": "package main\nfunc main() {}"});
        let id = "sbx-0123456789abcdef0123456789abcdef";
        let cases = [
            // Every argument checked, the call-level ones included: only
            // the engine is missing.
            (RunTool::RunJob, job.clone(), no_engine.to_string()),
            (RunTool::SubmitJob, with(json!({"idempotency_key": "k1", "site": null})), no_engine.to_string()),
            (code(), go.clone(), no_engine.to_string()),
            (RunTool::RunJob, with(json!({"sandbox": id})), no_engine.to_string()),
            (RunTool::RunJob, json!({"sandbox": id, "command": ["true"]}), no_engine.to_string()),
            (RunTool::RunJob, with(json!({"site": "default", "sandbox": null, "idempotency_key": null})), no_engine.to_string()),
            // The call-level arguments, checked before the tool's own.
            (RunTool::RunJob, with(json!({"idempotency_key": 7, "site": 7})), "invalid: `idempotency_key` must be a string, such as a fresh UUID".to_string()),
            (
                RunTool::RunJob,
                with(json!({"site": 7})),
                "invalid: argument `site` must be a string, not an integer; describe_environment lists the sites".to_string(),
            ),
            (
                code(),
                json!({"sandbox": 7, "bogus": 1}),
                "invalid: argument `sandbox` must be a string (an id from open_sandbox), not an integer".to_string(),
            ),
            (
                RunTool::RunJob,
                with(json!({"sandbox": format!("{id}.eu"), "site": "us"})),
                format!("invalid: sandbox `{id}` is on site `eu`, not `us`; leave `site` out"),
            ),
            (RunTool::SubmitJob, with(json!({"sandbox": id, "idempotency_key": "k1"})), format!("invalid: {NO_KEY_WITH_SANDBOX}")),
            (
                RunTool::RunJob,
                with(json!({"sandbox": format!("{id}.mars")})),
                "invalid: unknown site `mars`; sites here: default".to_string(),
            ),
            (
                RunTool::RunJob,
                with(json!({"sandbox": id, "workdir": "/work"})),
                "invalid: `workdir` cannot be given with `sandbox`: a sandbox's image, limits, network and workdir are fixed when it is opened"
                    .to_string(),
            ),
            (
                code(),
                json!({"sandbox": id, "network": "none", "language": "go", "entrypoint_code": "x"}),
                "invalid: `network` cannot be given with `sandbox`: a sandbox's network is fixed when it is opened".to_string(),
            ),
            // The tool's own arguments: the call-level ones are not
            // unknown to them, anything else is.
            (
                RunTool::RunJob,
                with(json!({"site": null, "sandbox": null, "idempotency_key": null, "bogus": 1})),
                "invalid: unknown field `bogus`; accepted: image, command, files, env, limits, timeout_s, workdir, clone, artifacts, network"
                    .to_string(),
            ),
            (
                code(),
                json!({"site": null, "idempotency_key": "k1", "bogus": 1}),
                "invalid: unknown argument `bogus`; accepted: language, entrypoint_code, entrypoint_filename, additional_files, snippet_name, timeout_s, network"
                    .to_string(),
            ),
            (RunTool::RunJob, json!({"command": ["true"]}), "invalid: `image` is required and must be a string".to_string()),
            // The site last: a call's own mistakes are said first.
            (RunTool::RunJob, with(json!({"site": "mars"})), "invalid: unknown site `mars`; sites here: default".to_string()),
            (RunTool::RunJob, json!({"site": "mars", "command": ["true"]}), "invalid: `image` is required and must be a string".to_string()),
        ];
        for (tool, arguments, expected) in cases {
            assert_eq!(said(&ctx, tool, arguments.clone()), expected, "{} {arguments}", tool.name());
        }
    }

    #[test]
    fn a_task_augmented_call_is_parsed_as_the_call_without_a_task() {
        let ctx = ctx();
        let caller = Caller::whole_server("stdio");
        let bogus = json!({"image": "busybox", "command": ["true"], "site": 7});
        let arguments = bogus.as_object().unwrap();
        let task = crate::tools::background::task_submit(&ctx, &caller, "run_job", arguments, None).err().map(|error| error.to_string());
        assert_eq!(task.as_deref(), Some(said(&ctx, RunTool::RunJob, bogus.clone()).trim_start_matches("invalid: ")));
    }
}
