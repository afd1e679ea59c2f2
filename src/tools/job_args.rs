//! `run_job` / `submit_job` arguments → a checked `RunSpec`, in one place:
//! every field is validated here, once, with a message that names the field
//! and says what would be accepted. The engine never checks them again.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::config::Config;
use crate::echo;
use crate::engine::port::spec::{CloneSpec, InputFile, RunSpec};
use crate::images::Allowlist;
use crate::network::{self, NetworkMode};
use crate::quantity::{Quantity, Resource};

/// Default working directory, as in the original.
pub use crate::sandbox::WORKDIR as DEFAULT_WORKDIR;
/// Input files travel in one Secret, whose data the API server caps at
/// 1 MiB (base64 in the request); this leaves room for the file list and
/// metadata. Contents and paths count against it together.
pub const MAX_INPUT_BYTES: usize = 768 * 1024;
pub const MAX_INPUT_FILES: usize = 256;
/// Linux refuses an argv or environment string longer than MAX_ARG_STRLEN
/// (131072 bytes) *including* its terminating NUL, so 131071 bytes of text
/// (a 131,072-byte argument failed at exec). An env
/// string is `NAME=value`.
const MAX_ARG_BYTES: usize = 131_072 - 1;
/// What argv and environment may take together. The kernel's ARG_MAX is a
/// quarter of the stack limit (2 MiB with the usual 8 MiB) and counts each
/// string, its NUL and its 8-byte pointer; the runner's own arguments,
/// the operator's extra env and what Kubernetes adds take the rest.
const MAX_ARGV_ENV_BYTES: usize = 1024 * 1024;
/// What `command` and `env` may take in the Job object, where every `$` is
/// doubled (`$$`, so Kubernetes does not expand `$(VAR)`): etcd refuses an
/// object over 1.5 MiB, and the rest of the Job needs well under 512 KiB.
const MAX_JOB_ARGV_ENV_BYTES: usize = 1024 * 1024;
/// Environment variables a call may set. Kubernetes sets no limit, but
/// every one is a line of the pod spec, and no real program needs more.
const MAX_ENV_VARS: usize = 1024;
/// Longest name of one file or folder on Linux file systems (NAME_MAX).
const MAX_PATH_COMPONENT_BYTES: usize = 255;
const MAX_ARTIFACT_PATTERNS: usize = 32;
/// Folders a workdir may not be in or cover: the
/// volume would hide the image's programs, libraries, loader or
/// configuration, or the kernel's and the runner's folders. `/var` itself
/// is reserved, its subfolders (`/var/tmp/x`) are not.
const RESERVED_WORKDIR_TREES: &[&str] =
    &["/bin", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/mcp", "/proc", "/sbin", "/sys", "/usr"];
const RESERVED_WORKDIRS: &[&str] = &["/var"];

/// The server-side bounds the arguments are checked against.
pub struct ArgBounds<'a> {
    pub allowlist: &'a Allowlist,
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    /// True when MCP_K8S_CLONE_IMAGE and MCP_K8S_CLONE_SECRET are set.
    pub clone_enabled: bool,
    /// The mode of a call that names none: the operator's default for
    /// run_job and submit_job, `none` first for execute_code.
    pub network_default: NetworkMode,
    /// MCP_K8S_NETWORK_MODES.
    pub network_modes: &'a [NetworkMode],
}

/// The bounds `job_args` checks a call against, from the configuration.
pub fn arg_bounds(config: &Config) -> ArgBounds<'_> {
    ArgBounds {
        allowlist: &config.allowed_images,
        default_timeout: std::time::Duration::from_secs(config.default_timeout_s),
        max_timeout: std::time::Duration::from_secs(config.max_timeout_s),
        clone_enabled: config.clone.is_some(),
        network_default: config.network_default,
        network_modes: &config.network_modes,
    }
}

/// An argument the caller must fix; the text says which and how.
#[derive(Debug, PartialEq)]
pub struct ArgError(pub String);

impl std::fmt::Display for ArgError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.0)
    }
}

const FIELDS: &[&str] = &["image", "command", "files", "env", "limits", "timeout_s", "workdir", "clone", "artifacts", "network"];

pub fn parse_run_args(object: &Map<String, Value>, bounds: &ArgBounds) -> Result<RunSpec, ArgError> {
    parse_call_run_args(object, bounds, &[], None)
}

/// `parse_run_args` over a run call's arguments: `call_fields` are the
/// call's own (`call_args` reads them) and are not this module's to check;
/// `sandbox_image` is the image of the sandbox a call without `image` runs in.
pub fn parse_call_run_args(
    object: &Map<String, Value>,
    bounds: &ArgBounds,
    call_fields: &[&str],
    sandbox_image: Option<&str>,
) -> Result<RunSpec, ArgError> {
    if let Some(unknown) = object.keys().find(|key| !FIELDS.contains(&key.as_str()) && !call_fields.contains(&key.as_str())) {
        return Err(unknown_field(unknown, FIELDS, ""));
    }
    let image = match object.get("image") {
        None => sandbox_image,
        Some(image) => image.as_str(),
    };
    let image = image.ok_or_else(|| fail("`image` is required and must be a string"))?;
    if image.trim().is_empty() {
        return Err(fail("`image` must not be empty"));
    }
    let image = bounds.allowlist.check(image).map_err(ArgError)?.to_string();
    let workdir = parse_workdir(object.get("workdir"))?;
    let command = parse_command(object.get("command"))?;
    let env = parse_env(object.get("env"))?;
    check_argv_env_total(&command, &env)?;
    Ok(RunSpec {
        image,
        command,
        files: parse_files(object.get("files"))?,
        env,
        cpu_limit: parse_limit(object.get("limits"), Resource::Cpu)?,
        memory_limit: parse_limit(object.get("limits"), Resource::Memory)?,
        timeout: parse_timeout(object.get("timeout_s"), bounds)?,
        artifacts: parse_artifacts(object.get("artifacts"))?,
        clone: parse_clone(object.get("clone"), bounds.clone_enabled)?,
        network: choose_network(object.get("network"), bounds.network_default, bounds.network_modes)?,
        workdir,
        // The tool that admits the run names its caller.
        owner: None,
    })
}

/// The run's network mode: the one asked for when the operator allows it,
/// else `default` when none is asked for (absent or null). `default` is
/// allowed already: `Config` checks the operator's, and execute_code's is
/// `none` only when allowed.
fn choose_network(asked: Option<&Value>, default: NetworkMode, allowed: &[NetworkMode]) -> Result<NetworkMode, ArgError> {
    let text = match asked {
        None | Some(Value::Null) => return Ok(default),
        Some(Value::String(text)) => text,
        Some(other) => {
            return Err(fail(format!("`network` must be a string, one of none, restricted, open; not {}", crate::json::json_kind(other))));
        }
    };
    let mode = NetworkMode::from_name(text)
        .ok_or_else(|| fail(format!("`network` `{}` is not a network mode; use one of none, restricted, open", echo::shorten(text))))?;
    if !allowed.contains(&mode) {
        return Err(fail(format!(
            "`network` `{}` is not allowed on this server; allowed: {} (the operator's MCP_K8S_NETWORK_MODES)",
            mode.name(),
            network::names(allowed)
        )));
    }
    Ok(mode)
}

/// argv and env together, as the kernel counts them at exec and as the
/// Job object carries them (100 arguments of 100 KiB
/// each passed one by one and made a 10 MB Job).
fn check_argv_env_total(command: &[String], env: &BTreeMap<String, String>) -> Result<(), ArgError> {
    let strings = command.iter().map(|arg| (arg.len(), dollars(arg))).chain(env.iter().map(|(name, value)| {
        // `NAME=value`; only the value is escaped in the Job.
        (name.len() + 1 + value.len(), dollars(value))
    }));
    let (mut exec_bytes, mut job_bytes) = (0usize, 0usize);
    for (length, n_dollars) in strings {
        exec_bytes += length + 1 + std::mem::size_of::<usize>();
        job_bytes += length + n_dollars;
    }
    if exec_bytes > MAX_ARGV_ENV_BYTES {
        return Err(fail(format!(
            "`command` and `env` take {exec_bytes} bytes together (each string with its NUL and pointer, as Linux counts them at exec); at most {MAX_ARGV_ENV_BYTES}: pass long inputs as `files`"
        )));
    }
    if job_bytes > MAX_JOB_ARGV_ENV_BYTES {
        return Err(fail(format!(
            "`command` and `env` take {job_bytes} bytes in the Job object (each `$` is written twice); at most {MAX_JOB_ARGV_ENV_BYTES}, since etcd refuses objects over 1.5 MiB: pass long inputs as `files`"
        )));
    }
    Ok(())
}

fn dollars(text: &str) -> usize {
    text.bytes().filter(|byte| *byte == b'$').count()
}

fn fail(message: impl Into<String>) -> ArgError {
    ArgError(message.into())
}

fn reject_unknown(object: &Map<String, Value>, known: &[&str], context: &str) -> Result<(), ArgError> {
    if let Some(unknown) = object.keys().find(|key| !known.contains(&key.as_str())) {
        return Err(unknown_field(unknown, known, context));
    }
    Ok(())
}

fn unknown_field(unknown: &str, known: &[&str], context: &str) -> ArgError {
    fail(format!("unknown field `{context}{}`; accepted: {}", echo::shorten(unknown), known.join(", ")))
}

fn parse_command(value: Option<&Value>) -> Result<Vec<String>, ArgError> {
    let items = value
        .and_then(Value::as_array)
        .ok_or_else(|| fail("`command` is required: an array of strings (argv), e.g. [\"python3\", \"-c\", \"print(1)\"]"))?;
    if items.is_empty() {
        return Err(fail("`command` must not be empty"));
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let text = item.as_str().ok_or_else(|| fail(format!("`command[{index}]` must be a string")))?;
            if index == 0 && text.is_empty() {
                return Err(fail("`command[0]` (the program) must not be empty"));
            }
            if text.contains('\0') {
                return Err(fail(format!("`command[{index}]` contains a NUL byte")));
            }
            if text.len() > MAX_ARG_BYTES {
                return Err(fail(format!(
                    "`command[{index}]` is {} bytes; Linux allows at most {MAX_ARG_BYTES} per argument (MAX_ARG_STRLEN, with its NUL): pass long scripts as `files`",
                    text.len()
                )));
            }
            Ok(text.to_string())
        })
        .collect()
}

fn parse_files(value: Option<&Value>) -> Result<Vec<InputFile>, ArgError> {
    let Some(value) = value.filter(|v| !v.is_null()) else { return Ok(Vec::new()) };
    let items = value.as_array().ok_or_else(|| fail("`files` must be an array of {path, content_b64, mode?}"))?;
    if items.len() > MAX_INPUT_FILES {
        return Err(fail(format!("`files` has {} entries; at most {MAX_INPUT_FILES}", items.len())));
    }
    let mut files: Vec<InputFile> = Vec::new();
    let mut total = 0usize;
    for (index, item) in items.iter().enumerate() {
        let object = item.as_object().ok_or_else(|| fail(format!("`files[{index}]` must be an object")))?;
        reject_unknown(object, &["path", "content_b64", "mode"], &format!("files[{index}]."))?;
        let path = object
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| fail(format!("`files[{index}].path` is required and must be a string")))?;
        let path = check_relative_path(path).map_err(|why| fail(format!("`files[{index}].path` `{}` {why}", echo::shorten(path))))?;
        if let Some(clash) = files.iter().position(|file| file.path == path) {
            return Err(fail(format!("`files[{index}].path` `{}` is given twice (also `files[{clash}]`)", echo::shorten(&path))));
        }
        if let Some((clash, folder)) = folder_clash(&files, &path) {
            return Err(fail(format!(
                "`files[{index}].path` `{}` and `files[{clash}].path` cannot both exist: `{}` would be a file and a folder",
                echo::shorten(&path),
                echo::shorten(folder)
            )));
        }
        let encoded = object
            .get("content_b64")
            .and_then(Value::as_str)
            .ok_or_else(|| fail(format!("`files[{index}].content_b64` is required and must be a base64 string")))?;
        let content = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|error| fail(format!("`files[{index}].content_b64` is not valid base64: {error}")))?;
        // The file list in the Secret holds each path (JSON-quoted, so up
        // to twice as long) and its key and mode.
        total += content.len() + 2 * path.len() + 32;
        if total > MAX_INPUT_BYTES {
            return Err(fail(format!(
                "`files` hold more than {MAX_INPUT_BYTES} bytes with their paths, the most one run can carry (a Kubernetes Secret); put large inputs in the image, a `clone`, or the cache volume"
            )));
        }
        let mode = parse_mode(object.get("mode")).map_err(|why| fail(format!("`files[{index}].mode` {why}")))?;
        files.push(InputFile { path, content, mode });
    }
    Ok(files)
}

/// One path being a folder of another (`a` and `a/b`): the runner could
/// write only one of them. Returns the clashing file's index and the path
/// that would have to be both.
fn folder_clash<'a>(files: &'a [InputFile], path: &'a str) -> Option<(usize, &'a str)> {
    files.iter().enumerate().find_map(|(index, file)| {
        let is_folder_of =
            |outer: &str, inner: &str| inner.len() > outer.len() && inner.starts_with(outer) && inner.as_bytes()[outer.len()] == b'/';
        if is_folder_of(&file.path, path) {
            Some((index, file.path.as_str()))
        } else if is_folder_of(path, &file.path) {
            Some((index, path))
        } else {
            None
        }
    })
}

/// Accepts `"0755"`, `"755"`, `"0o755"` (octal strings, as in the
/// original) or 493. `str::from_str_radix` alone would also take `+777`,
/// and stripping `0o` repeatedly `0o0o777`.
fn parse_mode(value: Option<&Value>) -> Result<u32, String> {
    let mode = match value {
        None | Some(Value::Null) => return Ok(0o644),
        Some(Value::String(text)) => {
            let digits = text.strip_prefix("0o").unwrap_or(text);
            let octal = (1..=4).contains(&digits.len()) && digits.bytes().all(|byte| (b'0'..=b'7').contains(&byte));
            if !octal {
                return Err(format!("`{}` is not an octal mode like \"0644\"", echo::shorten(text)));
            }
            u32::from_str_radix(digits, 8).map_err(|_| format!("`{}` is not an octal mode like \"0644\"", echo::shorten(text)))?
        }
        Some(Value::Number(number)) => {
            number.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| format!("`{number}` is not a file mode"))?
        }
        Some(other) => return Err(format!("must be an octal string like \"0755\", not {other}")),
    };
    if mode > 0o777 {
        return Err(format!("`{mode:o}` is out of range; use 0000 to 0777 (no setuid, setgid or sticky bits)"));
    }
    Ok(mode)
}

/// A path relative to the workdir: no `..`, not absolute, no empty parts.
/// Returns it normalised (without `./`).
pub fn check_relative_path(path: &str) -> Result<String, String> {
    if path.is_empty() || path.len() > 4096 {
        return Err("must be 1 to 4096 characters".into());
    }
    if path.starts_with('/') {
        return Err("must be relative to the workdir".into());
    }
    if path.chars().any(char::is_control) || path.contains('\\') {
        return Err("must not contain NUL, other control characters or backslash".into());
    }
    let parts: Vec<&str> = path.split('/').filter(|part| *part != "." && !part.is_empty()).collect();
    if parts.is_empty() || parts.contains(&"..") {
        return Err("must name a file inside the workdir (no `..`)".into());
    }
    if parts.iter().any(|part| part.len() > MAX_PATH_COMPONENT_BYTES) {
        return Err(format!("has a file or folder name over {MAX_PATH_COMPONENT_BYTES} bytes, the most Linux allows (NAME_MAX)"));
    }
    if parts.first() == Some(&".git") {
        return Err("must not write into `.git`".into());
    }
    Ok(parts.join("/"))
}

fn parse_env(value: Option<&Value>) -> Result<BTreeMap<String, String>, ArgError> {
    let Some(value) = value.filter(|v| !v.is_null()) else { return Ok(BTreeMap::new()) };
    let object = value.as_object().ok_or_else(|| fail("`env` must be an object of string values"))?;
    if object.len() > MAX_ENV_VARS {
        return Err(fail(format!("`env` has {} variables; at most {MAX_ENV_VARS}", object.len())));
    }
    let mut env = BTreeMap::new();
    for (name, value) in object {
        let shown = echo::shorten(name);
        if !crate::config::is_env_name(name) {
            return Err(fail(format!("`env` name `{shown}` must match ^[A-Za-z_][A-Za-z0-9_]*$")));
        }
        let text = value.as_str().ok_or_else(|| fail(format!("`env.{shown}` must be a string")))?;
        // exec takes C strings: a NUL would cut the value short.
        if text.contains('\0') {
            return Err(fail(format!("`env.{shown}` contains a NUL byte")));
        }
        if name.len() + 1 + text.len() > MAX_ARG_BYTES {
            return Err(fail(format!(
                "`env.{shown}` is {} bytes as `NAME=value`; Linux allows at most {MAX_ARG_BYTES} per variable (MAX_ARG_STRLEN, with its NUL): pass long values as `files`",
                name.len() + 1 + text.len()
            )));
        }
        env.insert(name.clone(), text.to_string());
    }
    Ok(env)
}

fn parse_limit(limits: Option<&Value>, resource: Resource) -> Result<Option<Quantity>, ArgError> {
    let name = resource.name();
    let Some(limits) = limits.filter(|v| !v.is_null()) else { return Ok(None) };
    let object = limits.as_object().ok_or_else(|| fail("`limits` must be an object {cpu?, memory?}"))?;
    reject_unknown(object, &["cpu", "memory"], "limits.")?;
    let Some(value) = object.get(name).filter(|v| !v.is_null()) else { return Ok(None) };
    let text = match value {
        Value::String(text) => text.clone(),
        Value::Number(number) => number.to_string(),
        _ => return Err(fail(format!("`limits.{name}` must be a string like \"500m\" or \"512Mi\""))),
    };
    let quantity = Quantity::parse(&text).map_err(|error| fail(format!("`limits.{name}`: {error}")))?;
    if quantity.is_zero() {
        return Err(fail(format!("`limits.{name}` must be more than zero")));
    }
    quantity.check_limit(resource).map_err(|why| fail(format!("`limits.{name}` `{}` {why}", echo::shorten(quantity.as_str()))))?;
    Ok(Some(quantity))
}

fn parse_timeout(value: Option<&Value>, bounds: &ArgBounds) -> Result<Duration, ArgError> {
    let max = bounds.max_timeout.as_secs();
    let seconds = match value {
        None | Some(Value::Null) => return Ok(bounds.default_timeout),
        Some(Value::Number(number)) => whole_seconds(number, max)?,
        Some(_) => return Err(fail("`timeout_s` must be a number")),
    };
    if seconds < 0 {
        return Err(fail(format!("`timeout_s` must not be negative; use 1 to {max}, or 0 for the default")));
    }
    if seconds == 0 {
        return Ok(bounds.default_timeout);
    }
    if seconds as u64 > max {
        let shown = value.map(Value::to_string).unwrap_or_default();
        return Err(fail(format!(
            "`timeout_s` {} is over the server's maximum of {max} (MCP_K8S_MAX_TIMEOUT_S); use submit_job for long work only within that bound",
            echo::shorten(&shown)
        )));
    }
    Ok(Duration::from_secs(seconds as u64))
}

/// `timeout_s` as a whole number: `30`, and also `30.0` (some clients
/// write every number as a float); `1e9` is a whole number too, and out
/// of range rather than "not whole".
fn whole_seconds(number: &serde_json::Number, max: u64) -> Result<i64, ArgError> {
    if let Some(seconds) = number.as_i64() {
        return Ok(seconds);
    }
    let value = number.as_f64().unwrap_or(f64::NAN);
    if !value.is_finite() || value.fract() != 0.0 {
        return Err(fail(format!("`timeout_s` must be a whole number of seconds from 1 to {max}, not `{number}`")));
    }
    if value < 0.0 {
        return Ok(-1);
    }
    // Above i64 (or u64 beyond it): certainly over the maximum.
    Ok(if value >= i64::MAX as f64 { i64::MAX } else { value as i64 })
}

/// The workdir is mounted as a volume, so it must be an absolute, plain
/// path that does not cover system folders or the runner's own.
fn parse_workdir(value: Option<&Value>) -> Result<String, ArgError> {
    let Some(value) = value.filter(|v| !v.is_null()) else { return Ok(DEFAULT_WORKDIR.to_string()) };
    let text = value.as_str().ok_or_else(|| fail("`workdir` must be a string"))?;
    let valid_chars = text.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b));
    let parts: Vec<&str> = text.split('/').filter(|part| !part.is_empty()).collect();
    if !text.starts_with('/') || !valid_chars || parts.is_empty() || parts.iter().any(|p| *p == "." || *p == "..") || text.len() > 256 {
        return Err(fail(format!(
            "`workdir` `{}` must be an absolute path of letters, digits, `.`, `_`, `-` and `/`, without `..`, at most 256 characters, e.g. \"/work\"",
            echo::shorten(text)
        )));
    }
    let workdir = format!("/{}", parts.join("/"));
    if let Some(reserved) = reserved_folder(&workdir) {
        return Err(fail(format!(
            "`workdir` `{text}` is in `{reserved}`, which is reserved: a workdir there would hide the image's programs, libraries or configuration (or the runner's); use a path such as \"/work\" or \"/home/runner/src\""
        )));
    }
    Ok(workdir)
}

/// The reserved folder `workdir` (normalised) is in or is, if any.
fn reserved_folder(workdir: &str) -> Option<&'static str> {
    let in_tree = |tree: &str| workdir == tree || workdir.strip_prefix(tree).is_some_and(|rest| rest.starts_with('/'));
    RESERVED_WORKDIR_TREES
        .iter()
        .copied()
        .find(|tree| in_tree(tree))
        .or_else(|| RESERVED_WORKDIRS.iter().copied().find(|folder| workdir == *folder))
}

fn parse_artifacts(value: Option<&Value>) -> Result<Vec<String>, ArgError> {
    let Some(value) = value.filter(|v| !v.is_null()) else { return Ok(Vec::new()) };
    let items = value.as_array().ok_or_else(|| fail("`artifacts` must be an array of glob patterns, e.g. [\"out/**\", \"*.png\"]"))?;
    if items.len() > MAX_ARTIFACT_PATTERNS {
        return Err(fail(format!("`artifacts` has {} patterns; at most {MAX_ARTIFACT_PATTERNS}", items.len())));
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let pattern = item.as_str().ok_or_else(|| fail(format!("`artifacts[{index}]` must be a string")))?;
            if pattern.is_empty() || pattern.starts_with('/') || pattern.split('/').any(|part| part == "..") || pattern.contains('\0') {
                return Err(fail(format!(
                    "`artifacts[{index}]` `{}` must be a glob relative to the workdir, without `..` or NUL",
                    echo::shorten(pattern)
                )));
            }
            Ok(pattern.to_string())
        })
        .collect()
}

fn parse_clone(value: Option<&Value>, enabled: bool) -> Result<Option<CloneSpec>, ArgError> {
    let Some(value) = value.filter(|v| !v.is_null()) else { return Ok(None) };
    if !enabled {
        return Err(fail(
            "`clone` is not available on this server: the operator must set MCP_K8S_CLONE_IMAGE and MCP_K8S_CLONE_SECRET; pass sources as `files` instead",
        ));
    }
    let object = value.as_object().ok_or_else(|| fail("`clone` must be an object {repo_url, ref, subdir?}"))?;
    reject_unknown(object, &["repo_url", "ref", "subdir"], "clone.")?;
    let text = |name: &str| -> Result<Option<&str>, ArgError> {
        match object.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(fail(format!("`clone.{name}` must be a string"))),
        }
    };
    let repo_url = text("repo_url")?.ok_or_else(|| fail("`clone.repo_url` is required, e.g. \"https://github.com/org/repo.git\""))?;
    let git_ref = text("ref")?.ok_or_else(|| fail("`clone.ref` is required: a branch, tag or full commit SHA"))?;
    let subdir = match text("subdir")? {
        None => DEFAULT_CLONE_SUBDIR.to_string(),
        Some(subdir) => check_clone_subdir(subdir).map_err(|why| fail(format!("`clone.subdir` `{}` {why}", echo::shorten(subdir))))?,
    };
    check_repo_url(repo_url).map_err(|why| fail(format!("`clone.repo_url` `{}` {why}", echo::shorten(repo_url))))?;
    check_git_ref(git_ref).map_err(|why| fail(format!("`clone.ref` `{}` {why}", echo::shorten(git_ref))))?;
    Ok(Some(CloneSpec { repo_url: repo_url.to_string(), git_ref: git_ref.to_string(), subdir }))
}

/// Where a clone goes when the caller names no folder, as in the original.
const DEFAULT_CLONE_SUBDIR: &str = "repo";

/// `https://host[:port]/path`: https only (tokens must not cross the network
/// in clear), no user or password (the token comes from the clone Secret,
/// never from a caller), a host that maps to a Secret key (no IPv6
/// literals: `[` and `:` cannot be in a key), and nothing git could read as
/// an option or a local path.
fn check_repo_url(url: &str) -> Result<(), String> {
    if url.len() > 2048 || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must be at most 2048 characters without spaces or control characters".into());
    }
    let Some(rest) = url.strip_prefix("https://") else {
        return Err("must start with https://; other protocols are not supported".into());
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err("must not carry a user or token; the server supplies credentials from its clone Secret".into());
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    };
    let valid_host = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if !valid_host {
        return Err("must name a host: letters, digits, `-` and `.` (IPv6 addresses are not supported)".into());
    }
    if port.is_some_and(|port| port.parse::<u16>().is_err()) {
        return Err("has a port that is not a number from 0 to 65535".into());
    }
    let path = &rest[authority.len()..];
    if path.trim_matches('/').is_empty() {
        return Err("must name a repository path, e.g. https://github.com/org/repo.git".into());
    }
    if path.starts_with(['?', '#']) || path.contains('#') {
        return Err("must not have a fragment or start its path with a query".into());
    }
    Ok(())
}

/// A branch or tag name as `git check-ref-format` accepts it, or a full
/// 40 (SHA-1) or 64 (SHA-256) hex commit id. Abbreviated ids cannot be
/// fetched from a server, so they only work if they happen to be a branch.
fn check_git_ref(git_ref: &str) -> Result<(), String> {
    let is_full_sha = (git_ref.len() == 40 || git_ref.len() == 64) && git_ref.bytes().all(|b| b.is_ascii_hexdigit());
    if is_full_sha {
        return Ok(());
    }
    const HINT: &str = "is not a branch, tag or full commit SHA";
    const FORBIDDEN: &[char] = &[' ', '~', '^', ':', '?', '*', '[', '\\'];
    let bad = git_ref.is_empty()
        || git_ref.len() > 255
        || git_ref.starts_with(['-', '/', '.'])
        || git_ref.ends_with(['/', '.'])
        || git_ref.ends_with(".lock")
        || git_ref == "@"
        || git_ref.contains("..")
        || git_ref.contains("//")
        || git_ref.contains("@{")
        || git_ref.contains("/.")
        || git_ref.chars().any(|c| c.is_control() || FORBIDDEN.contains(&c));
    if bad {
        return Err(format!(
            "{HINT} (git's ref rules: no spaces, `..`, `~^:?*[\\`, leading `-` or `.`); use e.g. \"main\", \"v1.2.0\" or a 40-hex SHA"
        ));
    }
    Ok(())
}

/// The clone's folder under the workdir: relative, without `..`; `.` (or an
/// empty string) means the workdir itself. Returns it normalised.
fn check_clone_subdir(subdir: &str) -> Result<String, String> {
    if subdir.is_empty() || subdir.split('/').all(|part| part.is_empty() || part == ".") {
        if subdir.starts_with('/') {
            return Err("must be relative to the workdir".into());
        }
        return Ok(String::new());
    }
    check_relative_path(subdir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bounds_with(allowlist: &Allowlist) -> ArgBounds<'_> {
        ArgBounds {
            allowlist,
            default_timeout: Duration::from_secs(60),
            max_timeout: Duration::from_secs(600),
            clone_enabled: false,
            network_default: NetworkMode::Open,
            network_modes: &NetworkMode::ALL,
        }
    }

    #[test]
    fn the_network_mode_is_the_one_asked_for_when_allowed_else_the_default() {
        use NetworkMode::{None as Off, Open, Restricted};
        let all: &[NetworkMode] = &NetworkMode::ALL;
        let no_open: &[NetworkMode] = &[Off, Restricted];
        // (asked, the default, allowed, chosen or the error)
        type Case<'a> = (Option<Value>, NetworkMode, &'a [NetworkMode], Result<NetworkMode, &'a str>);
        let cases: &[Case] = &[
            (None, Open, all, Ok(Open)),
            (None, Off, all, Ok(Off)),
            (Some(Value::Null), Restricted, no_open, Ok(Restricted)),
            (Some(json!("none")), Open, all, Ok(Off)),
            (Some(json!("restricted")), Off, all, Ok(Restricted)),
            (Some(json!("open")), Off, all, Ok(Open)),
            (
                Some(json!("open")),
                Off,
                no_open,
                Err("`network` `open` is not allowed on this server; allowed: none, restricted (the operator's MCP_K8S_NETWORK_MODES)"),
            ),
            (Some(json!("host")), Open, all, Err("`network` `host` is not a network mode; use one of none, restricted, open")),
            (Some(json!("Open")), Open, all, Err("`network` `Open` is not a network mode; use one of none, restricted, open")),
            (Some(json!(1)), Open, all, Err("`network` must be a string, one of none, restricted, open; not an integer")),
        ];
        for (asked, default, allowed, expected) in cases {
            let chosen = choose_network(asked.as_ref(), *default, allowed).map_err(|error| error.0);
            assert_eq!(chosen, expected.map_err(str::to_string), "{asked:?} {default:?} {allowed:?}");
        }
        assert_eq!(parse(json!({"image": "busybox:1.36", "command": ["true"], "network": "none"})).unwrap().network, Off);
    }

    fn parse(args: Value) -> Result<RunSpec, ArgError> {
        let allowlist = Allowlist::parse("busybox:1.36,python:3.12-slim").unwrap();
        let Value::Object(object) = args else { panic!("arguments must be an object") };
        parse_run_args(&object, &bounds_with(&allowlist))
    }

    #[test]
    fn a_full_valid_call() {
        let spec = parse(json!({
            "image": "busybox:1.36",
            "command": ["sh", "-c", "echo $(HOME)"],
            "files": [{"path": "./dir/a.txt", "content_b64": "aGk=", "mode": "0755"}],
            "env": {"A_1": "x"},
            "limits": {"cpu": "500m", "memory": "64Mi"},
            "timeout_s": 30,
            "workdir": "/home/runner/src/",
            "artifacts": ["out/**"],
        }))
        .unwrap();
        assert_eq!(spec.image, "docker.io/library/busybox:1.36");
        assert_eq!(spec.files[0].path, "dir/a.txt");
        assert_eq!(spec.files[0].content, b"hi");
        assert_eq!(spec.files[0].mode, 0o755);
        assert_eq!(spec.timeout, Duration::from_secs(30));
        assert_eq!(spec.workdir, "/home/runner/src");
        assert_eq!(spec.memory_limit.unwrap().as_str(), "64Mi");
    }

    #[test]
    fn defaults() {
        let spec = parse(json!({"image": "busybox:1.36", "command": ["true"], "timeout_s": 0})).unwrap();
        assert_eq!(spec.timeout, Duration::from_secs(60));
        assert_eq!(spec.workdir, "/work");
        assert!(spec.files.is_empty() && spec.env.is_empty() && spec.artifacts.is_empty());
    }

    /// A minimal valid call with `key` set to `value`.
    fn with(key: &str, value: Value) -> Value {
        let mut args = json!({"image": "busybox:1.36", "command": ["true"]});
        args[key] = value;
        args
    }

    #[test]
    fn every_bad_argument_names_its_field() {
        let cases = vec![
            (json!({"command": ["true"]}), "`image` is required"),
            (with("image", json!("")), "`image` must not be empty"),
            (with("image", json!("evil:1")), "image `evil:1` is not allowed; allowed: busybox:1.36"),
            (with("command", json!([])), "`command` must not be empty"),
            (with("command", json!("echo hi")), "`command` is required: an array"),
            (with("command", json!(["echo", 1])), "`command[1]` must be a string"),
            (with("files", json!([{"path": "../x", "content_b64": ""}])), "`files[0].path` `../x`"),
            (with("files", json!([{"path": "/etc/passwd", "content_b64": ""}])), "must be relative"),
            (with("files", json!([{"path": "a", "content_b64": "!!"}])), "`files[0].content_b64` is not valid base64"),
            (with("files", json!([{"path": "a", "content_b64": "", "mode": "999"}])), "`files[0].mode`"),
            (with("files", json!([{"path": "a", "content_b64": "", "mode": "4755"}])), "no setuid"),
            (with("files", json!([{"path": "a", "content_b64": ""}, {"path": "./a", "content_b64": ""}])), "given twice"),
            (with("files", json!([{"path": "a", "content_b64": "", "owner": "root"}])), "unknown field `files[0].owner`"),
            (with("env", json!({"1BAD": "x"})), "`env` name `1BAD`"),
            (with("env", json!({"A": 1})), "`env.A` must be a string"),
            (with("limits", json!({"memory": "lots"})), "`limits.memory`: `lots` is not a Kubernetes quantity"),
            (with("limits", json!({"cpu": "0"})), "`limits.cpu` must be more than zero"),
            (with("limits", json!({"gpu": "1"})), "unknown field `limits.gpu`"),
            (with("timeout_s", json!(-1)), "`timeout_s` must not be negative"),
            (with("timeout_s", json!(601)), "over the server's maximum of 600"),
            (with("timeout_s", json!(1.5)), "whole number"),
            (with("workdir", json!("relative")), "`workdir` `relative` must be an absolute path"),
            (with("workdir", json!("/work/$(id)")), "must be an absolute path"),
            (with("workdir", json!("/etc")), "`workdir` `/etc` is in `/etc`, which is reserved"),
            (with("workdir", json!("/proc/self")), "is in `/proc`, which is reserved"),
            (with("artifacts", json!(["/abs"])), "`artifacts[0]` `/abs`"),
            (with("clone", json!({"repo_url": "https://x/r", "ref": "main"})), "`clone` is not available on this server"),
            (with("surprise", json!(true)), "unknown field `surprise`"),
        ];
        for (args, expected) in cases {
            let error = parse(args.clone()).expect_err(&args.to_string());
            assert!(error.0.contains(expected), "for {args}: got `{}`, expected it to contain `{expected}`", error.0);
        }
    }

    fn parse_with_clone(clone: Value) -> Result<RunSpec, ArgError> {
        let allowlist = Allowlist::parse("busybox:1.36").unwrap();
        let bounds = ArgBounds { clone_enabled: true, ..bounds_with(&allowlist) };
        let Value::Object(object) = json!({"image": "busybox:1.36", "command": ["true"], "clone": clone}) else { unreachable!() };
        parse_run_args(&object, &bounds)
    }

    #[test]
    fn good_clones() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let cases = [
            (json!({"repo_url": "https://github.com/org/repo.git", "ref": "main"}), "main", "repo"),
            (json!({"repo_url": "https://git.example.com:8443/a/b", "ref": "v1.2.0", "subdir": "./src/x/"}), "v1.2.0", "src/x"),
            (json!({"repo_url": "https://10.0.0.1/r", "ref": sha, "subdir": "."}), sha, ""),
            (json!({"repo_url": "https://h/r", "ref": "feature/a-b_c", "subdir": null}), "feature/a-b_c", "repo"),
            (json!({"repo_url": "https://h/r", "ref": "refs/tags/v1"}), "refs/tags/v1", "repo"),
        ];
        for (clone, git_ref, subdir) in cases {
            let spec = parse_with_clone(clone.clone()).unwrap_or_else(|error| panic!("{clone}: {error}"));
            let clone_spec = spec.clone.unwrap();
            assert_eq!((clone_spec.git_ref.as_str(), clone_spec.subdir.as_str()), (git_ref, subdir), "{clone}");
        }
    }

    #[test]
    fn bad_clones_name_the_field_and_the_rule() {
        let url = |repo_url: &str| json!({"repo_url": repo_url, "ref": "main"});
        let git_ref = |git_ref: &str| json!({"repo_url": "https://h/r", "ref": git_ref});
        let subdir = |subdir: &str| json!({"repo_url": "https://h/r", "ref": "main", "subdir": subdir});
        let cases = vec![
            (json!("https://h/r"), "`clone` must be an object"),
            (json!({"ref": "main"}), "`clone.repo_url` is required"),
            (json!({"repo_url": "https://h/r"}), "`clone.ref` is required"),
            (json!({"repo_url": "https://h/r", "ref": 1}), "`clone.ref` must be a string"),
            (json!({"repo_url": "https://h/r", "ref": "main", "depth": 1}), "unknown field `clone.depth`"),
            (url("http://h/r"), "`clone.repo_url` `http://h/r` must start with https://"),
            (url("git@github.com:org/r.git"), "must start with https://"),
            (url("ssh://h/r"), "must start with https://"),
            (url("file:///etc"), "must start with https://"),
            (url("https://user:tok@h/r"), "must not carry a user or token"),
            (url("https://tok@h/r"), "must not carry a user or token"),
            (url("https://h"), "must name a repository path"),
            (url("https://h/"), "must name a repository path"),
            (url("https://[::1]/r"), "IPv6"),
            (url("https://-h/r"), "must name a host"),
            (url("https://h:99999/r"), "port"),
            (url("https://h/r x"), "without spaces"),
            (url("https://h/r#frag"), "fragment"),
            (git_ref(""), "`clone.ref` `` is not a branch, tag or full commit SHA"),
            (git_ref("-b"), "is not a branch"),
            (git_ref("--upload-pack=evil"), "is not a branch"),
            (git_ref("a..b"), "is not a branch"),
            (git_ref("a b"), "is not a branch"),
            (git_ref("main^"), "is not a branch"),
            (git_ref("x.lock"), "is not a branch"),
            (git_ref("@{-1}"), "is not a branch"),
            (git_ref("a//b"), "is not a branch"),
            (subdir("../up"), "`clone.subdir` `../up`"),
            (subdir("/abs"), "must be relative"),
            (subdir(".git"), "must not write into `.git`"),
            (subdir("a/../../b"), "no `..`"),
        ];
        for (clone, expected) in cases {
            let error = parse_with_clone(clone.clone()).expect_err(&clone.to_string());
            assert!(error.0.contains(expected), "for {clone}: got `{}`, expected it to contain `{expected}`", error.0);
        }
    }

    /// What the kernel, the API server, etcd or the kubelet would refuse
    /// later is refused here, with the limit named.
    #[test]
    fn what_cannot_run_is_refused_up_front() {
        let file = |path: &str| json!({"path": path, "content_b64": ""});
        let arg_100k = "a".repeat(100 * 1024);
        let many_args: Vec<&str> = std::iter::repeat_n(arg_100k.as_str(), 100).collect();
        let many_env: Map<String, Value> = (0..10_000).map(|index| (format!("V{index}"), json!("x"))).collect();
        let dollar_args: Vec<String> = (0..8).map(|_| "$".repeat(100_000)).collect();
        let long_name = "n".repeat(256);
        let cases = vec![
            (with("command", json!(["x", "a".repeat(MAX_ARG_BYTES + 1)])), "`command[1]` is 131072 bytes; Linux allows at most 131071"),
            (with("command", json!(many_args)), "`command` and `env` take 10240900 bytes together"),
            (with("command", json!(dollar_args)), "in the Job object (each `$` is written twice); at most 1048576"),
            (with("env", json!({"BIG": "v".repeat(1 << 20)})), "`env.BIG` is 1048580 bytes as `NAME=value`; Linux allows at most 131071"),
            (with("env", json!({"A": "x".repeat(MAX_ARG_BYTES - 1)})), "`env.A` is 131072 bytes"),
            (with("env", Value::Object(many_env)), "`env` has 10000 variables; at most 1024"),
            (with("env", json!({"A": "x\0y"})), "`env.A` contains a NUL byte"),
            (with("command", json!(["x\0"])), "`command[0]` contains a NUL byte"),
            (with("files", json!([file("a\0b")])), "must not contain NUL"),
            (with("files", json!([file("a\nb")])), "control characters"),
            (with("artifacts", json!(["a\0"])), "without `..` or NUL"),
            (
                with("files", json!([file("a"), file("a/b")])),
                "`files[1].path` `a/b` and `files[0].path` cannot both exist: `a` would be a file and a folder",
            ),
            (with("files", json!([file("a/b/c"), file("a/b")])), "`a/b` would be a file and a folder"),
            (with("files", json!([file(&format!("d/{long_name}"))])), "has a file or folder name over 255 bytes"),
            (with("files", json!([{"path": "a", "content_b64": "", "mode": "+777"}])), "`files[0].mode` `+777` is not an octal mode"),
            (with("files", json!([{"path": "a", "content_b64": "", "mode": "0o0o777"}])), "`0o0o777` is not an octal mode"),
            (with("files", json!([{"path": "a", "content_b64": "", "mode": ""}])), "`` is not an octal mode"),
            (with("limits", json!({"memory": "1m"})), "`limits.memory` `1m` is below the minimum of 16Mi"),
            (with("limits", json!({"memory": "0.5"})), "`limits.memory` `0.5` is below the minimum of 16Mi"),
            (with("limits", json!({"memory": "64"})), "`limits.memory` `64` is below the minimum of 16Mi (a bare number is bytes"),
            (with("limits", json!({"memory": 64})), "`limits.memory` `64` is below the minimum"),
            (with("limits", json!({"memory": "1Pi"})), "`limits.memory` `1Pi` is over the maximum of 1Ti"),
            (with("limits", json!({"cpu": "1E"})), "`limits.cpu` `1E` is over the maximum of 1024 cores"),
            (with("limits", json!({"cpu": "1e-30"})), "`limits.cpu` `1e-30` is below the minimum of 1m"),
            (with("limits", json!({"cpu": "0.0001"})), "is below the minimum of 1m"),
            (with("timeout_s", json!(1e9)), "`timeout_s` 1000000000.0 is over the server's maximum of 600"),
            (with("timeout_s", json!(18446744073709551615u64)), "is over the server's maximum of 600"),
            (with("timeout_s", json!(-2.0)), "`timeout_s` must not be negative"),
            (with("timeout_s", json!(2.5)), "`timeout_s` must be a whole number of seconds from 1 to 600, not `2.5`"),
        ];
        for (args, expected) in cases {
            let shown = echo::shorten(&args.to_string()).into_owned();
            let error = parse(args).expect_err(&shown);
            assert!(error.0.contains(expected), "for {shown}: got `{}`, expected it to contain `{expected}`", error.0);
            assert!(error.0.len() < 400, "errors quote little of the input: {}", error.0);
        }
    }

    #[test]
    fn reserved_workdirs_and_their_subtrees() {
        let reserved = [
            ("/usr", "/usr"),
            ("/usr/local", "/usr"),
            ("/usr/local/bin", "/usr"),
            ("/etc/ssl", "/etc"),
            ("/lib", "/lib"),
            ("/lib64", "/lib64"),
            ("/bin", "/bin"),
            ("/sbin/x", "/sbin"),
            ("/etc", "/etc"),
            ("/proc", "/proc"),
            ("/sys/fs", "/sys"),
            ("/dev", "/dev"),
            ("/mcp/bin", "/mcp"),
            ("/var", "/var"),
            ("//usr//local/", "/usr"),
        ];
        for (workdir, tree) in reserved {
            let error = parse(json!({"image": "busybox:1.36", "command": ["true"], "workdir": workdir})).expect_err(workdir);
            assert!(error.0.contains(&format!("is in `{tree}`, which is reserved")), "{workdir}: {}", error.0);
        }
        for workdir in ["/work", "/home/runner/src", "/var/tmp/x", "/usrx", "/library", "/tmp/etc", "/opt/app"] {
            let spec = parse(json!({"image": "busybox:1.36", "command": ["true"], "workdir": workdir}));
            assert!(spec.is_ok(), "{workdir}: {spec:?}");
        }
    }

    #[test]
    fn limits_at_their_bounds_and_whole_float_timeouts_are_accepted() {
        let spec = parse(json!({
            "image": "busybox:1.36",
            "command": ["x", "a".repeat(MAX_ARG_BYTES)],
            "env": {"A": "x".repeat(MAX_ARG_BYTES - 2)},
            "limits": {"memory": "16Mi", "cpu": "1m"},
            "timeout_s": 30.0,
            "files": [{"path": "a/b", "content_b64": "", "mode": "0o755"}, {"path": "a/c", "content_b64": "", "mode": "7"}],
        }))
        .unwrap();
        assert_eq!(spec.timeout, Duration::from_secs(30));
        assert_eq!((spec.files[0].mode, spec.files[1].mode), (0o755, 0o7));
        let spec = parse(json!({"image": "busybox:1.36", "command": ["true"], "limits": {"memory": "1Ti", "cpu": "1024"}})).unwrap();
        assert_eq!(spec.cpu_limit.unwrap().as_str(), "1024");
    }

    #[test]
    fn input_size_is_bounded() {
        let big = base64::engine::general_purpose::STANDARD.encode(vec![0u8; MAX_INPUT_BYTES + 1]);
        let error = parse(json!({"image": "busybox:1.36", "command": ["true"], "files": [{"path": "a", "content_b64": big}]})).unwrap_err();
        assert!(error.0.contains("Kubernetes Secret"), "{}", error.0);
    }
}
