//! `execute_code`: isolator-mcp's tool, with its argument names
//! and its result text, on this server's engine. The code comes inline
//! (`language` + `entrypoint_code`) or by name from the snippets folder
//! (`snippet_name`); the language profile gives the image, the argv, the
//! defaults and the environment. The call becomes `run_job` arguments and
//! goes through `job_args::parse_run_args`, so it gets the same `RunSpec`,
//! caps, cancel, progress and `truncated` as `run_job`, and the same
//! allowlist: a language whose image it refuses is not offered
//! (`Languages::keep_allowed`).
//!
//! Knows nothing of backends or JSON-RPC: the run is the engine's, the
//! result JSON `job_result`'s, snippet files `snippets`'.

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::config::Config;
use crate::engine::port::spec::{RunOutcome, RunSpec, RunStatus};
use crate::languages::Profile;
use crate::tools::call_args::{self, RunTool};
use crate::tools::job_args::{self, ArgBounds};
use crate::tools::{Annotations, Call, Ctx, Tool, ToolOutcome, answer, backend_words, idempotency, job_result, run_job, snippets};

/// The tool's name, also in `background::TASK_TOOLS`.
pub const NAME: &str = call_args::EXECUTE_CODE;

/// Arguments: isolator's five, plus `timeout_s` and `network` (this server's).
const FIELDS: &[&str] = &["language", "entrypoint_code", "entrypoint_filename", "additional_files", "snippet_name", "timeout_s", "network"];

pub fn execute_code_tool(config: &Config) -> Tool {
    Tool {
        name: NAME,
        title: "Run a code snippet in a throwaway sandbox".to_string(),
        description: description(config),
        input_schema: input_schema(config),
        // run_job's outputSchema, said once in the list: every copy is
        // paid in the agent's context.
        output_schema: json!({"type": "object", "description": "run_job's result"}),
        annotations: Annotations { read_only: false, destructive: false, idempotent: false, open_world: true },
        handler: execute_code,
    }
}

/// The call's arguments, checked, as the spec `run_job` would run.
/// `call_fields` are the call's own arguments (`call_args` reads them).
pub fn parse_execute_args(arguments: &Map<String, Value>, config: &Config, call_fields: &[&str]) -> Result<RunSpec, String> {
    if let Some(unknown) = arguments.keys().find(|name| !FIELDS.contains(&name.as_str()) && !call_fields.contains(&name.as_str())) {
        return Err(format!("unknown argument `{}`; accepted: {}", crate::echo::shorten(unknown), FIELDS.join(", ")));
    }
    let source = parse_source(arguments, config)?;
    let profile = config.languages.profile(&source.language)?;
    let filename = match optional_string(arguments, "entrypoint_filename")? {
        Some(filename) => check_entrypoint(filename)?,
        None => source.filename.unwrap_or_else(|| profile.filename.clone()),
    };
    let mut files = vec![(filename.clone(), source.code.into_bytes())];
    files.extend(parse_additional_files(arguments.get("additional_files"), &filename)?);
    let timeout_s = match arguments.get("timeout_s").filter(|value| !value.is_null()) {
        None => profile.timeout_s,
        Some(value) => value
            .as_u64()
            .filter(|seconds| (1..=config.max_timeout_s).contains(seconds))
            .ok_or_else(|| format!("`timeout_s` must be a whole number from 1 to {}", config.max_timeout_s))?,
    };
    let mut run_args = run_job_arguments(profile, &filename, &files, timeout_s);
    // Checked by `parse_run_args` with execute_code's own default.
    if let Some(network) = arguments.get("network") {
        run_args.insert("network".to_string(), network.clone());
    }
    let bounds = ArgBounds {
        allowlist: &config.allowed_images,
        default_timeout: std::time::Duration::from_secs(profile.timeout_s),
        max_timeout: std::time::Duration::from_secs(config.max_timeout_s),
        clone_enabled: false,
        network_default: config.execute_code_network_default(),
        network_modes: &config.network_modes,
    };
    // What is left to fail here is the size of the files together; run_job
    // calls them `files`, this tool's caller knows them by other names.
    job_args::parse_run_args(&run_args, &bounds).map_err(|error| error.0.replace("`files`", "`entrypoint_code` and `additional_files`"))
}

/// The result: isolator's text block, `isError` as isolator sets it, this
/// server's run result as `structuredContent`, and pictures the code wrote.
pub fn outcome(outcome: &RunOutcome) -> ToolOutcome {
    ToolOutcome::Rendered {
        text: result_text(outcome),
        structured: job_result::outcome_json(outcome),
        extra_content: job_result::content_blocks(outcome),
        is_error: answer::is_error(answer::Shape::Isolator, answer::Answer::Ran { status: outcome.status, reason: outcome.reason }),
    }
}

/// isolator's text: `--- stdout ---\n…\n--- stderr ---\n…`, after
/// `Execution Failed (<status>): <message>\n\n` when the code did not
/// succeed. The status is isolator's word (`error`, `timeout`), so prompts
/// written for isolator keep matching; ours is in `structuredContent`.
fn result_text(outcome: &RunOutcome) -> String {
    let output = format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&outcome.stdout),
        String::from_utf8_lossy(&outcome.stderr)
    );
    match isolator_status(outcome.status) {
        None => output,
        Some(status) => format!("Execution Failed ({status}): {}\n\n{output}", outcome.message),
    }
}

fn execute_code(ctx: &Ctx, call: &Call<'_>) -> ToolOutcome {
    let run_call = match call_args::parse(ctx, call.caller, RunTool::ExecuteCode(parse_execute_args), call.arguments) {
        Ok(run_call) => run_call,
        Err(error) => return run_job::not_run(error),
    };
    match run_job::run_reporting_progress(ctx, call, run_call) {
        Ok(run_outcome) => outcome(&run_outcome),
        Err(why) => ToolOutcome::Failure(why),
    }
}

/// isolator's statuses are `success`, `error` and `timeout`; a non-zero
/// exit is `error` there (its README: the prefix is added "when the exit
/// code is not 0, or on a timeout"), and so is anything that could not run.
fn isolator_status(status: RunStatus) -> Option<&'static str> {
    match status {
        RunStatus::Succeeded => None,
        RunStatus::TimedOut => Some("timeout"),
        RunStatus::Failed | RunStatus::Error => Some("error"),
        RunStatus::Cancelled => Some("cancelled"),
    }
}

/// Where the code comes from: a snippet, or `language` + `entrypoint_code`.
struct Source {
    language: String,
    code: String,
    /// The snippet's own file name (`hello.py`); `None` for inline code.
    filename: Option<String>,
}

fn parse_source(arguments: &Map<String, Value>, config: &Config) -> Result<Source, String> {
    let snippet_name = optional_string(arguments, "snippet_name")?;
    let language = optional_string(arguments, "language")?;
    let code = optional_string(arguments, "entrypoint_code")?;
    const EITHER: &str = "send either `snippet_name`, or `language` with `entrypoint_code`";
    match (snippet_name, language, code) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            Err(format!("`snippet_name` cannot be combined with `language` or `entrypoint_code`: {EITHER}"))
        }
        (Some(name), None, None) => {
            let snippet = snippets::load(config.snippets_dir.as_deref(), &config.languages, name).map_err(|error| error.to_string())?;
            Ok(Source { language: snippet.language, code: snippet.source, filename: Some(snippet.filename) })
        }
        (None, Some(language), Some(code)) => Ok(Source { language: language.to_string(), code: code.to_string(), filename: None }),
        (None, Some(_), None) => Err(format!("`language` needs `entrypoint_code`, the code to run: {EITHER}")),
        (None, None, Some(_)) => {
            Err(format!("`entrypoint_code` needs `language` (one of: {}): {EITHER}", config.languages.names().join(", ")))
        }
        (None, None, None) => Err(format!("no code given: {EITHER}")),
    }
}

/// A string argument; `None` when absent or null.
fn optional_string<'a>(arguments: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, String> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(other) => Err(format!("`{name}` must be a string, not {}", crate::json::json_kind(other))),
    }
}

/// The entrypoint is the interpreter's argument, so a name that starts
/// with `-` (`-V`, `--help`) would be read as an option and the code never run.
fn check_entrypoint(path: &str) -> Result<String, String> {
    let path = check_path("entrypoint_filename", path)?;
    if path.starts_with('-') {
        return Err(format!(
            "`entrypoint_filename` `{}` must not start with `-`: the interpreter would read it as an option; name the file e.g. main.py",
            crate::echo::shorten(&path)
        ));
    }
    Ok(path)
}

fn check_path(field: &str, path: &str) -> Result<String, String> {
    job_args::check_relative_path(path).map_err(|why| format!("`{field}` `{}` {why}", crate::echo::shorten(path)))
}

/// `additional_files`: `[{filename, content}]` as in isolator, or
/// `content_b64` for bytes that are not text.
fn parse_additional_files(value: Option<&Value>, entrypoint: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let items = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(format!("`additional_files` must be an array of {{filename, content}}, not {}", crate::json::json_kind(other)));
        }
    };
    // Checked here, in this tool's terms: the entrypoint is one of the
    // files a run may have.
    if items.len() >= job_args::MAX_INPUT_FILES {
        return Err(format!(
            "`additional_files` has {} entries; at most {} (a run has at most {} files, the entrypoint included)",
            items.len(),
            job_args::MAX_INPUT_FILES - 1,
            job_args::MAX_INPUT_FILES
        ));
    }
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let field = |name: &str| format!("additional_files[{index}].{name}");
        let Value::Object(object) = item else {
            return Err(format!("`additional_files[{index}]` must be an object {{filename, content}}"));
        };
        if let Some(unknown) = object.keys().find(|key| !["filename", "content", "content_b64"].contains(&key.as_str())) {
            return Err(format!(
                "unknown field `{}.{}`; accepted: filename, content, content_b64",
                field("").trim_end_matches('.'),
                crate::echo::shorten(unknown)
            ));
        }
        let filename = match object.get("filename") {
            Some(Value::String(filename)) => check_path(&field("filename"), filename)?,
            _ => return Err(format!("`{}` is required and must be a string", field("filename"))),
        };
        if filename == entrypoint {
            return Err(format!("`{}` `{filename}` is the entrypoint's file name; give it another name", field("filename")));
        }
        if files.iter().any(|(known, _)| *known == filename) {
            return Err(format!("`{}` `{filename}` is given twice", field("filename")));
        }
        let content = match (object.get("content"), object.get("content_b64")) {
            (Some(Value::String(text)), None) => text.clone().into_bytes(),
            (None, Some(Value::String(encoded))) => base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|error| format!("`{}` is not valid base64: {error}", field("content_b64")))?,
            (Some(_), Some(_)) => return Err(format!("`additional_files[{index}]` has both `content` and `content_b64`; send one")),
            (None, None) => return Err(format!("`additional_files[{index}]` needs `content` (text) or `content_b64` (bytes)")),
            _ => return Err(format!("`{}` and `{}` must be strings", field("content"), field("content_b64"))),
        };
        files.push((filename, content));
    }
    Ok(files)
}

/// The `run_job` arguments this call stands for.
fn run_job_arguments(profile: &Profile, filename: &str, files: &[(String, Vec<u8>)], timeout_s: u64) -> Map<String, Value> {
    let files: Vec<Value> = files
        .iter()
        .map(|(path, content)| json!({"path": path, "content_b64": base64::engine::general_purpose::STANDARD.encode(content)}))
        .collect();
    let Value::Object(arguments) = json!({
        "image": profile.image,
        "command": profile.argv(filename),
        "files": files,
        "env": profile.env,
        "limits": {"cpu": profile.cpu.as_str(), "memory": profile.memory.as_str()},
        "timeout_s": timeout_s,
    }) else {
        unreachable!("json! of an object literal is an object")
    };
    arguments
}

fn description(config: &Config) -> String {
    let languages: Vec<String> =
        config.languages.profiles.values().map(|profile| format!("{} ({})", profile.name, profile.image)).collect();
    let snippets = if config.snippets_dir.is_some() { " or `snippet_name` (resources/list lists them)" } else { "" };
    format!(
        "Runs code in a fresh {} and waits (isolator-mcp's execute_code). Give `language` with `entrypoint_code`{snippets}; \
         `additional_files` are written beside it. Returns `--- stdout ---\\n...\\n--- stderr ---\\n...`, prefixed \
         `Execution Failed (<status>): <message>` with isError true when the code did not succeed (isError is also true \
         for a refused call); run_job's result is the structuredContent. No stdin. Languages: {}.",
        backend_words::runs(config).sandbox(),
        languages.join(", ")
    )
}

fn input_schema(config: &Config) -> Value {
    let mut schema = json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "language": {"type": "string", "enum": config.languages.names()},
            "entrypoint_code": {"type": "string", "description": "the main file's content"},
            "entrypoint_filename": {"type": "string", "description": "default per language, e.g. main.py"},
            "additional_files": {"type": "array", "items": {
                "type": "object",
                "required": ["filename"],
                "additionalProperties": false,
                "properties": {
                    "filename": {"type": "string", "description": "relative path"},
                    "content": {"type": "string"},
                    "content_b64": {"type": "string", "description": "instead of content, for bytes"},
                },
            }},
            "timeout_s": {"type": "integer", "minimum": 1, "maximum": config.max_timeout_s, "description": "default per language"},
            "network": run_job::network_schema(config, config.execute_code_network_default()),
            "sandbox": run_job::sandbox_schema(config),
            idempotency::ARGUMENT: idempotency::schema("the first call's result", config.result_ttl_s),
        },
    });
    if config.snippets_dir.is_some() {
        schema["properties"]["snippet_name"] = json!({"type": "string", "description": "instead of language and entrypoint_code"});
    }
    if let Some(site) = super::site_schema(config) {
        schema["properties"]["site"] = site;
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RawConfig;
    use crate::engine::port::spec::RunReason;
    use crate::network::NetworkMode;

    fn config_with(snippets_dir: Option<&str>) -> Config {
        let raw = RawConfig::from_lookup(|name| match name {
            "MCP_K8S_SNIPPETS_DIR" => snippets_dir.map(str::to_string),
            "MCP_K8S_ALLOWED_IMAGES" => Some(crate::languages::BUILT_IN_IMAGES.to_string()),
            _ => None,
        });
        Config::from_raw(&raw).unwrap()
    }

    fn parse(arguments: Value) -> Result<RunSpec, String> {
        let Value::Object(arguments) = arguments else { panic!("an object") };
        parse_execute_args(&arguments, &config_with(None), &[])
    }

    #[test]
    fn inline_code_becomes_the_run_job_spec_of_its_profile() {
        let spec = parse(json!({"language": "python", "entrypoint_code": "print(1)", "additional_files": [
            {"filename": "lib/util.py", "content": "X = 1"}, {"filename": "data.bin", "content_b64": "AAE="}]}))
        .unwrap();
        assert_eq!(spec.image, "docker.io/library/python:3.12-slim");
        assert_eq!(spec.command, ["python3", "main.py"]);
        let files: Vec<(&str, &[u8])> = spec.files.iter().map(|file| (file.path.as_str(), file.content.as_slice())).collect();
        assert_eq!(files, [("main.py", b"print(1)".as_slice()), ("lib/util.py", b"X = 1"), ("data.bin", &[0, 1])]);
        assert_eq!(spec.timeout, std::time::Duration::from_secs(30));
        assert_eq!(spec.memory_limit.unwrap().as_str(), "512Mi");
        assert_eq!(spec.env["PYTHONUNBUFFERED"], "1");
        let go =
            parse(json!({"language": "go", "entrypoint_code": "package main", "entrypoint_filename": "hello.go", "timeout_s": 5})).unwrap();
        assert_eq!((go.command.join(" "), go.timeout.as_secs()), ("go run hello.go".to_string(), 5));
    }

    #[test]
    fn each_bad_combination_is_a_clear_error() {
        let either = "send either `snippet_name`, or `language` with `entrypoint_code`";
        let cases = [
            (json!({}), format!("no code given: {either}")),
            (json!({"language": "python"}), format!("`language` needs `entrypoint_code`, the code to run: {either}")),
            (json!({"entrypoint_code": "x"}), format!("`entrypoint_code` needs `language` (one of: bash, go, javascript, python): {either}")),
            (json!({"snippet_name": "a", "language": "python"}), format!("`snippet_name` cannot be combined with `language` or `entrypoint_code`: {either}")),
            (json!({"snippet_name": "a", "entrypoint_code": "x"}), format!("`snippet_name` cannot be combined with `language` or `entrypoint_code`: {either}")),
            (json!({"snippet_name": "a"}), "`snippet_name` needs a snippets folder, and this server has none (MCP_K8S_SNIPPETS_DIR); send `language` and `entrypoint_code` instead".to_string()),
            (json!({"language": "ruby", "entrypoint_code": "x"}), "unknown `language` `ruby`; available: bash, go, javascript, python".to_string()),
            (json!({"language": 3, "entrypoint_code": "x"}), "`language` must be a string, not an integer".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "image": "evil"}), "unknown argument `image`; accepted: language, entrypoint_code, entrypoint_filename, additional_files, snippet_name, timeout_s, network".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "entrypoint_filename": "../x.py"}), "`entrypoint_filename` `../x.py` must name a file inside the workdir (no `..`)".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "entrypoint_filename": "-V"}), "`entrypoint_filename` `-V` must not start with `-`: the interpreter would read it as an option; name the file e.g. main.py".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "entrypoint_filename": "./--help"}), "`entrypoint_filename` `--help` must not start with `-`: the interpreter would read it as an option; name the file e.g. main.py".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "additional_files": {}}), "`additional_files` must be an array of {filename, content}, not an object".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "additional_files": (0..501).map(|i| json!({"filename": format!("f{i}"), "content": ""})).collect::<Vec<_>>()}), "`additional_files` has 501 entries; at most 255 (a run has at most 256 files, the entrypoint included)".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "additional_files": [{"content": "y"}]}), "`additional_files[0].filename` is required and must be a string".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "additional_files": [{"filename": "main.py", "content": "y"}]}), "`additional_files[0].filename` `main.py` is the entrypoint's file name; give it another name".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "additional_files": [{"filename": "a", "content": "y"}, {"filename": "a", "content": "z"}]}), "`additional_files[1].filename` `a` is given twice".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "additional_files": [{"filename": "a"}]}), "`additional_files[0]` needs `content` (text) or `content_b64` (bytes)".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "additional_files": [{"filename": "a", "content": "y", "content_b64": "eQ=="}]}), "`additional_files[0]` has both `content` and `content_b64`; send one".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "additional_files": [{"filename": "a", "content_b64": "!"}]}), "`additional_files[0].content_b64` is not valid base64: Invalid symbol 33, offset 0.".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "additional_files": [{"filename": "a", "text": "y"}]}), "unknown field `additional_files[0].text`; accepted: filename, content, content_b64".to_string()),
            (json!({"language": "python", "entrypoint_code": "x", "timeout_s": 0}), "`timeout_s` must be a whole number from 1 to 600".to_string()),
            (json!({"language": "python", "entrypoint_code": "x".repeat(800 * 1024)}), "`entrypoint_code` and `additional_files` hold more than 786432 bytes with their paths, the most one run can carry (a Kubernetes Secret); put large inputs in the image, a `clone`, or the cache volume".to_string()),
        ];
        for (arguments, expected) in cases {
            assert_eq!(parse(arguments.clone()).unwrap_err(), expected, "{arguments}");
        }
    }

    #[test]
    fn code_runs_without_a_network_unless_it_asks_and_the_operator_allows() {
        assert_eq!(parse(json!({"language": "bash", "entrypoint_code": "true"})).unwrap().network, NetworkMode::None);
        let open = parse(json!({"language": "bash", "entrypoint_code": "true", "network": "open"})).unwrap();
        assert_eq!(open.network, NetworkMode::Open);
        let raw = RawConfig::from_lookup(|name| match name {
            "MCP_K8S_NETWORK_MODES" => Some("restricted,open".to_string()),
            "MCP_K8S_ALLOWED_IMAGES" => Some(crate::languages::BUILT_IN_IMAGES.to_string()),
            _ => None,
        });
        let no_none = Config::from_raw(&raw).unwrap();
        let Value::Object(plain) = json!({"language": "bash", "entrypoint_code": "true"}) else { unreachable!() };
        assert_eq!(parse_execute_args(&plain, &no_none, &[]).unwrap().network, NetworkMode::Open, "the operator's default");
        let Value::Object(none) = json!({"language": "bash", "entrypoint_code": "true", "network": "none"}) else { unreachable!() };
        assert_eq!(
            parse_execute_args(&none, &no_none, &[]).unwrap_err(),
            "`network` `none` is not allowed on this server; allowed: restricted, open (the operator's MCP_K8S_NETWORK_MODES)"
        );
    }

    #[test]
    fn a_snippet_runs_with_the_profile_of_its_extension() {
        let dir = std::env::temp_dir().join(format!("mcp-execute-snippets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("hello.js"), "console.log('hi')").unwrap();
        let config = config_with(dir.to_str());
        let Value::Object(arguments) = json!({"snippet_name": "hello"}) else { unreachable!() };
        let spec = parse_execute_args(&arguments, &config, &[]).unwrap();
        assert_eq!((spec.image.as_str(), spec.command.join(" ")), ("docker.io/library/node:22-slim", "node hello.js".to_string()));
        let Value::Object(unknown) = json!({"snippet_name": "nope"}) else { unreachable!() };
        assert_eq!(parse_execute_args(&unknown, &config, &[]).unwrap_err(), "no snippet named `nope`; available: hello");
        assert!(description(&config).contains("`snippet_name` (resources/list lists them)"), "{}", description(&config));
        assert!(input_schema(&config)["properties"]["snippet_name"].is_object(), "offered with a snippets folder");
        assert!(input_schema(&config_with(None))["properties"].get("snippet_name").is_none(), "not offered without");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn outcome_of(status: RunStatus, reason: Option<RunReason>, message: &str) -> RunOutcome {
        let mut outcome = RunOutcome::without_result("r1", status, reason.unwrap_or(RunReason::NonZeroExit), message.to_string());
        outcome.reason = reason;
        outcome.stdout = b"hi\n".to_vec();
        outcome.stderr = b"oops".to_vec();
        outcome
    }

    #[test]
    fn the_result_text_is_isolators() {
        let succeeded = outcome_of(RunStatus::Succeeded, None, "the command exited with code 0");
        assert_eq!(result_text(&succeeded), "--- stdout ---\nhi\n\n--- stderr ---\noops");
        let failed = outcome_of(RunStatus::Failed, Some(RunReason::NonZeroExit), "exited with code 1");
        assert_eq!(result_text(&failed), "Execution Failed (error): exited with code 1\n\n--- stdout ---\nhi\n\n--- stderr ---\noops");
        let timed_out = outcome_of(RunStatus::TimedOut, Some(RunReason::DeadlineExceeded), "ran past timeout_s (2 s)");
        assert!(result_text(&timed_out).starts_with("Execution Failed (timeout): ran past timeout_s (2 s)\n\n--- stdout ---\nhi\n"));
    }

    #[test]
    fn is_error_follows_isolator_and_the_structured_result_is_run_jobs() {
        for (status, is_error_expected) in
            [(RunStatus::Succeeded, false), (RunStatus::Failed, true), (RunStatus::TimedOut, true), (RunStatus::Error, true)]
        {
            let run_outcome = outcome_of(status, None, "m");
            let ToolOutcome::Rendered { is_error, structured, .. } = outcome(&run_outcome) else { panic!("rendered") };
            assert_eq!(is_error, is_error_expected, "{status:?}");
            assert_eq!(structured, job_result::outcome_json(&run_outcome));
        }
    }
}
