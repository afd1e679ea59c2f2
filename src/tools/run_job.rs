//! `run_job`: run one command in a throwaway pod and wait for its result.
//! Arguments are parsed once by `call_args` (the tool's own checked by
//! `job_args`), the run is the engine's, and the
//! result shape is `job_result`'s; this file ties them to the MCP tool and
//! turns engine progress into MCP progress notifications.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::audit;
use crate::config::Config;
use crate::engine;
use crate::engine::run::Progress;
use crate::engine::sandboxes::Named;
use crate::network::NetworkMode;
use crate::sandbox::frame::Stream;
use crate::tools::call_args::{self, CallArgsError, RunCall, RunTool};
use crate::tools::job_result;
use crate::tools::{Annotations, Call, Ctx, Tool, ToolOutcome};
use crate::tools::{answer, backend_words, idempotency};

/// Longest piece of live output carried by one progress message.
const PROGRESS_TEXT_BYTES: usize = 4096;
/// How often a run that reports nothing else says it is still running:
/// clients whose request timeout is reset only by progress (the TypeScript
/// SDK's `resetTimeoutOnProgress`, the Inspector; 60 s by default) keep
/// waiting for a silent command.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// One wait of a keyed call for its run; it waits again until the end.
const KEYED_WAIT: Duration = Duration::from_secs(120);

pub fn run_job_tool(config: &Config) -> Tool {
    let sandbox = backend_words::runs(config).sandbox();
    Tool {
        name: "run_job",
        title: format!("Run a command in a throwaway {sandbox}"),
        description: format!(
            "Runs `command` (argv; no shell unless you call one) in a fresh {sandbox} from `image` and waits; returns \
             status, exit_code, stdout, stderr and files created or changed in `workdir`, with `reason` and `message` \
             when not succeeded. Clients stop waiting after about 60 s: use submit_job for longer work. {} Limits: \
             describe_environment.",
            answer::RULE
        ),
        input_schema: run_job_schema(config),
        output_schema: job_result::output_schema(),
        annotations: Annotations { read_only: false, destructive: false, idempotent: false, open_world: true },
        handler: run_job,
    }
}

/// The input schema shared by `run_job` and `submit_job`. Terse: every
/// word is paid in the agent's context; the constraints stay in the
/// schema, the details are in describe_environment and the docs. An
/// argument the server would refuse whatever its value (`clone` when not
/// enabled, `site` with one site) is left out.
pub fn input_schema(config: &Config) -> Value {
    let mut schema = json!({
        "type": "object",
        "required": ["image", "command"],
        "additionalProperties": false,
        "properties": {
            "image": {"type": "string", "description": format!("allowed: {}", allowed_images_text(config))},
            "command": {"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "argv, e.g. [\"python3\", \"main.py\"]; no $(VAR) expansion"},
            "files": {"type": "array", "description": "written into workdir first", "items": {
                "type": "object",
                "required": ["path", "content_b64"],
                "additionalProperties": false,
                "properties": {
                    "path": {"type": "string", "description": "relative to workdir"},
                    "content_b64": {"type": "string"},
                    "mode": {"type": "string", "description": "octal, default 0644"},
                },
            }},
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
            "limits": {"type": "object", "additionalProperties": false, "properties": {
                "cpu": {"type": "string", "description": "e.g. 500m"},
                "memory": {"type": "string", "description": "e.g. 512Mi"},
            }},
            "timeout_s": {"type": "integer", "minimum": 0, "maximum": config.max_timeout_s, "description": format!("command's run time; 0: {}", config.default_timeout_s)},
            "workdir": {"type": "string", "description": "absolute; default /work"},
            "artifacts": {"type": "array", "items": {"type": "string"}, "description": "globs under workdir to return; default: files created or changed"},
            "network": network_schema(config, config.network_default),
            idempotency::ARGUMENT: idempotency::schema("the first call's run", config.result_ttl_s),
        },
    });
    if config.clone.is_some() {
        schema["properties"]["clone"] = json!({"type": "object", "description": "a git checkout into workdir/subdir first", "properties": {
            "repo_url": {"type": "string", "description": "https, no credentials"},
            "ref": {"type": "string", "description": "branch, tag or 40-hex SHA"},
            "subdir": {"type": "string", "description": "default repo; . is workdir"},
        }});
    }
    if let Some(site) = super::site_schema(config) {
        schema["properties"]["site"] = site;
    }
    schema
}

/// `run_job`'s and `submit_job`'s schema: the run's, and `sandbox`, with which `image`
/// may be left out (the sandbox's own).
pub fn run_job_schema(config: &Config) -> Value {
    let mut schema = input_schema(config);
    schema["required"] = json!(["command"]);
    schema["properties"]["sandbox"] = sandbox_schema(config);
    schema["properties"]["image"]["description"] =
        json!(format!("allowed: {}; required unless `sandbox` (then the sandbox's)", allowed_images_text(config)));
    schema
}

pub fn allowed_images_text(config: &Config) -> String {
    if config.allowed_images.is_empty() {
        "none (the operator has not set MCP_K8S_ALLOWED_IMAGES)".to_string()
    } else {
        config.allowed_images.as_written.join(", ")
    }
}

/// The `network` argument's schema, shared by run_job, submit_job,
/// execute_code and open_sandbox: only the modes every site runs
/// (`backend_words::network_modes`); `default` is a call's that names none.
pub fn network_schema(config: &Config, default: NetworkMode) -> Value {
    let modes = backend_words::network_modes(config);
    let open = match backend_words::runs(config) {
        backend_words::Runs::Kubernetes => "egress, not to the cluster",
        backend_words::Runs::Docker => "egress, not to other containers",
        backend_words::Runs::Either => "egress",
    };
    let meaning: Vec<String> = modes
        .iter()
        .map(|mode| match mode {
            NetworkMode::None => "none: no network".to_string(),
            NetworkMode::Restricted => "restricted: the operator's allowlist".to_string(),
            NetworkMode::Open => format!("open: {open}"),
        })
        .collect();
    json!({
        "type": "string",
        "enum": modes.iter().map(|mode| mode.name()).collect::<Vec<_>>(),
        "description": format!("{}; never inbound; default {}", meaning.join("; "), default.name()),
    })
}

fn run_job(ctx: &Ctx, call: &Call<'_>) -> ToolOutcome {
    let run_call = match call_args::parse(ctx, call.caller, RunTool::RunJob, call.arguments) {
        Ok(run_call) => run_call,
        Err(error) => return not_run(error),
    };
    match run_reporting_progress(ctx, call, run_call) {
        Ok(outcome) => ToolOutcome::SuccessWithContent {
            structured: job_result::outcome_json(&outcome),
            extra_content: job_result::content_blocks(&outcome),
        },
        Err(why) => ToolOutcome::Failure(why),
    }
}

/// The answer of `run_job` and `execute_code` to a call whose arguments
/// make no run: a tool error, or the result of a sandbox that refused it.
pub fn not_run(error: CallArgsError) -> ToolOutcome {
    match error {
        CallArgsError::Invalid(why) | CallArgsError::Unavailable(why) => ToolOutcome::Failure(why),
        CallArgsError::Refused(refused) => {
            let outcome = refused.outcome(&crate::engine::run::new_run_id());
            ToolOutcome::SuccessWithContent { structured: job_result::outcome_json(&outcome), extra_content: Vec::new() }
        }
    }
}

/// Runs the call to its end, turning engine progress into MCP progress;
/// shared with `execute_code`. `Err` when the caller's limits refuse the
/// run (`admission`).
/// A call with an idempotency key is the key's background run, waited for
/// (`background::run_keyed`): only a kept run can be found again.
pub fn run_reporting_progress(ctx: &Ctx, call: &Call<'_>, run_call: RunCall<'_>) -> Result<engine::port::spec::RunOutcome, String> {
    let RunCall { tool, mut spec, site, engine, sandbox, keyed } = run_call;
    let admitted = ctx.admit(call.caller, site, &mut spec)?;
    let spec = &spec;
    let on = On { tool, engine, site, sandbox: sandbox.as_ref() };
    match keyed {
        Some(keyed) => run_keyed(call, spec, &keyed, on, admitted),
        None => {
            let outcome = run_now(call, spec, on);
            match &outcome {
                Ok(outcome) => admitted.end(outcome.duration),
                Err(_) => drop(admitted),
            }
            if let (Some(parent), Ok(outcome)) = (call.trace, &outcome) {
                let facts = engine::run::spans::RunFacts { image: &spec.image, network: Some(spec.network) };
                engine::run::spans::run_spans(parent, &facts, outcome).into_iter().for_each(crate::trace::record);
            }
            outcome
        }
    }
}

/// Where a run goes: the tool that asked, a site's engine, and the
/// site's name.
#[derive(Clone, Copy)]
struct On<'a> {
    tool: RunTool,
    engine: &'a engine::run::Ctx,
    site: &'a str,
    /// The open sandbox the call runs in, if it names one.
    sandbox: Option<&'a Named>,
}

/// A run without a key: made and followed here, answered in the call.
fn run_now(call: &Call<'_>, spec: &engine::port::spec::RunSpec, on: On<'_>) -> Result<engine::port::spec::RunOutcome, String> {
    let arrived = std::time::Instant::now();
    let engine = on.engine;
    let run_id = engine::run::new_run_id();
    let steps = AtomicU64::new(0);
    let report = |message: &str| {
        let step = steps.fetch_add(1, Ordering::Relaxed) + 1;
        call.events.progress(step as f64, None, Some(message));
    };
    let on_progress = |progress: Progress| report(&progress_message(&progress));
    let (finished, heartbeat_stop) = mpsc::channel::<()>();
    Ok(std::thread::scope(|scope| {
        let report = &report;
        scope.spawn(move || heartbeat(&heartbeat_stop, report));
        let outcome = match on.sandbox {
            Some(sandbox) => engine::sandboxes::call(engine, sandbox, spec, &run_id, call.cancel, &on_progress),
            None => engine::run::run(engine, spec, &run_id, call.cancel, &on_progress),
        };
        drop(finished);
        // The outcome's id, which the answer names: a warm hit runs under
        // its pool sandbox's id, not the one made for the call.
        super::audit_call(
            call.caller,
            on.site,
            audit::Event::Run,
            on.tool.name(),
            spec,
            &outcome.run_id,
            Some(super::Ended { outcome: &outcome, elapsed: arrived.elapsed() }),
        );
        outcome
    }))
}

/// A call with an idempotency key: the key's background run (found, or
/// made now), waited for to its end, its new output sent as progress. A
/// cancelled call cancels the run, as a cancelled `run_job` stops its
/// own; a retry with the key then reads the `cancelled` result.
fn run_keyed(
    call: &Call<'_>,
    spec: &engine::port::spec::RunSpec,
    keyed: &engine::background::idempotency::Keyed,
    on: On<'_>,
    admitted: super::admission::Admitted,
) -> Result<engine::port::spec::RunOutcome, String> {
    use engine::background;
    let engine = on.engine;
    let arrived = std::time::Instant::now();
    // The run's spans go under this call when the run's verdict is
    // recorded; the call adds none of its own for it (`run_reporting_progress`).
    let submitted = background::submit(engine, spec, on.tool.token_kind(), Some(keyed), call.trace, Some(admitted.on_end()));
    super::audit_submit(call.caller, on.site, on.tool.name(), spec, &submitted, arrived);
    let token = match submitted {
        Ok(submitted) => submitted.token,
        Err(background::Error::Refused { outcome }) => return Ok(*outcome),
        Err(error) => return Err(error.to_string()),
    };
    let steps = AtomicU64::new(0);
    let mut on_output = |stream, bytes: &[u8]| {
        let step = steps.fetch_add(1, Ordering::Relaxed) + 1;
        let message = progress_message(&Progress::Output(engine::run::collect::LiveChunk { stream, bytes: bytes.to_vec() }));
        call.events.progress(step as f64, None, Some(&message));
    };
    loop {
        let view = background::fetch(engine, &token, call.caller.owner(), KEYED_WAIT, call.cancel, &mut on_output)
            .map_err(|error| error.to_string())?;
        if let Some(outcome) = view.outcome {
            return Ok(std::sync::Arc::unwrap_or_clone(outcome));
        }
        if call.cancel.is_cancelled() {
            // Already ended or gone: the retry reads whatever it became.
            let _ = background::cancel(engine, &token, call.caller.owner());
            return Err("the call was cancelled; its run was cancelled too".to_string());
        }
    }
}

/// Reports "still running" every `HEARTBEAT` until `stop` closes.
fn heartbeat(stop: &mpsc::Receiver<()>, report: &(dyn Fn(&str) + Sync)) {
    let started = Instant::now();
    while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(HEARTBEAT) {
        report(&format!("still running after {} s", started.elapsed().as_secs()));
    }
}

/// Progress text: phases in words, live output prefixed with its stream.
pub fn progress_message(progress: &Progress) -> String {
    match progress {
        Progress::Queued => "waiting for a free slot (MCP_K8S_MAX_CONCURRENT)".to_string(),
        Progress::Created { what } => format!("created {what}"),
        Progress::Started => "the command started".to_string(),
        Progress::Output(chunk) => {
            let stream = match chunk.stream {
                Stream::Stdout => "stdout",
                Stream::Stderr => "stderr",
            };
            let text = String::from_utf8_lossy(&chunk.bytes[..chunk.bytes.len().min(PROGRESS_TEXT_BYTES)]);
            format!("[{stream}] {text}")
        }
    }
}

/// The `sandbox` property of `run_job`'s and `execute_code`'s schemas.
pub fn sandbox_schema(config: &Config) -> Value {
    json!({
        "type": ["string", "null"],
        "description": format!("an open_sandbox id: run in that {} and its files; one call at a time", backend_words::runs(config).sandbox()),
    })
}
