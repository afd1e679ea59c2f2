//! `execute_code`'s language profiles: for each language, the
//! image, the default entrypoint filename, the argv that runs the file, the
//! snippet extensions it claims, default timeout, CPU and memory, and the
//! environment that makes the toolchain work on a read-only root file
//! system (only the workdir and /tmp are writable). Built-in profiles are
//! merged with the operator's `MCP_K8S_LANGUAGES` file, checked once at
//! start with errors that name the file, the profile and the field.
//!
//! Knows nothing of MCP, RunSpec or backends: `tools::execute_code` turns a
//! profile into a run. The JSON is read by hand because only `tools` and
//! `kube` derive serde (style.md §2).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use crate::quantity::{Quantity, Resource};
use crate::settings_file::{self, Error, FileKind};

/// The built-in profiles' images, for tests whose server allows them.
#[cfg(test)]
pub const BUILT_IN_IMAGES: &str = "python:3.12-slim,node:22-slim,golang:1.23,bash:5.2";

/// Stands for the entrypoint file in a profile's `command`.
const FILE_PLACEHOLDER: &str = "{file}";

/// The languages file is configuration, not data: a megabyte is plenty.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// One language.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub name: String,
    pub image: String,
    /// Default `entrypoint_filename`.
    pub filename: String,
    /// argv; every `{file}` becomes the entrypoint filename.
    pub command: Vec<String>,
    /// Snippet file extensions (without the dot) that pick this profile.
    pub extensions: Vec<String>,
    pub timeout_s: u64,
    pub cpu: Quantity,
    pub memory: Quantity,
    pub env: BTreeMap<String, String>,
    /// Modules a warm pool's sandboxes of this profile import ahead, in an
    /// interpreter started before the call (`prestart`); Python only.
    pub preload: Vec<String>,
}

/// The pre-started Python (`Profile::prestart`): its modules come after it.
const PYTHON_PRELOAD: &str = include_str!("python_preload.py");

/// The most modules a profile may preload, and the longest name.
const MAX_PRELOAD: usize = 64;
const MAX_MODULE_CHARS: usize = 128;

impl Profile {
    /// The argv that runs `filename`.
    pub fn argv(&self, filename: &str) -> Vec<String> {
        self.command.iter().map(|arg| arg.replace(FILE_PLACEHOLDER, filename)).collect()
    }

    /// How a warm sandbox of this profile starts its interpreter ahead of
    /// the call: (the argv before the file, which a call's argv must start
    /// with; the argv to pre-start). `None` for a profile whose command is
    /// not Python's (`python…` then options, then the file).
    pub fn prestart(&self) -> Option<(Vec<String>, Vec<String>)> {
        let at = self.command.iter().position(|arg| arg == FILE_PLACEHOLDER)?;
        let prefix = self.command[..at].to_vec();
        let program = prefix.first()?.rsplit('/').next().unwrap_or_default();
        if !program.starts_with("python") || !interpreter_options_only(&prefix[1..]) {
            return None;
        }
        let mut argv = prefix.clone();
        argv.extend(["-c".to_string(), PYTHON_PRELOAD.to_string()]);
        argv.extend(self.preload.iter().cloned());
        Some((prefix, argv))
    }
}

/// Whether `args` are only the interpreter's own options, so that the
/// pre-started one is the same program as the command with its file:
/// `-u`, `-B`, `-X dev`, `-Wignore`, `-W ignore`... `-X` and `-W` take
/// the next word as their value; `-c`, `-m` and `-` name the program to
/// run, which the file must be, and anything else is no option.
fn interpreter_options_only(args: &[String]) -> bool {
    let mut words = args.iter();
    while let Some(arg) = words.next() {
        match arg.as_str() {
            "-c" | "-m" | "-" => return false,
            "-X" | "-W" => {
                if words.next().is_none() {
                    return false;
                }
            }
            option if option.starts_with('-') => {}
            _ => return false,
        }
    }
    true
}

/// Every profile, by name (sorted, so listings are stable).
#[derive(Clone, Debug, PartialEq)]
pub struct Languages {
    pub profiles: BTreeMap<String, Profile>,
    /// Images the operator's file names in a profile's `image`: the
    /// operator chose them, so they join the allowlist (`Config`).
    pub operator_images: Vec<String>,
    /// Profiles left out because their image is not allowed (name →
    /// image): a call naming one is told why, and nothing lists it.
    pub not_allowed: BTreeMap<String, String>,
}

impl Languages {
    /// The built-in profiles, with `path`'s overrides and additions when
    /// given. Timeouts are held to `max_timeout_s` (MCP_K8S_MAX_TIMEOUT_S):
    /// an operator's larger value is an error, a built-in one is lowered.
    pub fn load(path: Option<&Path>, max_timeout_s: u64) -> Result<Languages, Error> {
        let mut profiles = built_in(max_timeout_s);
        let mut operator_images = Vec::new();
        if let Some(path) = path {
            let text = read_bounded(path)?;
            operator_images = apply_file(&mut profiles, path, &text, max_timeout_s)?;
        }
        let languages = Languages { profiles, operator_images, not_allowed: BTreeMap::new() };
        languages.check_extensions(path)?;
        Ok(languages)
    }

    /// Leaves out every profile whose image `allowed` refuses, so that
    /// `execute_code`, sandboxes, pools and every listing see only the
    /// languages that can run: one allowlist for every path.
    pub fn keep_allowed(&mut self, allowed: &crate::images::Allowlist) {
        let refused: Vec<String> =
            self.profiles.values().filter(|profile| allowed.check(&profile.image).is_err()).map(|profile| profile.name.clone()).collect();
        for name in refused {
            if let Some(profile) = self.profiles.remove(&name) {
                self.not_allowed.insert(name, profile.image);
            }
        }
    }

    pub fn get(&self, name: &str) -> Option<&Profile> {
        self.profiles.get(name)
    }

    /// The profile a call names, or a message saying why there is none:
    /// unknown, or known but its image is not allowed here.
    pub fn profile(&self, name: &str) -> Result<&Profile, String> {
        if let Some(profile) = self.profiles.get(name) {
            return Ok(profile);
        }
        let available = match self.names() {
            names if names.is_empty() => "none (no language's image is in MCP_K8S_ALLOWED_IMAGES)".to_string(),
            names => names.join(", "),
        };
        match self.not_allowed.get(name) {
            Some(image) => Err(format!(
                "language `{name}` is not available on this server: its image `{image}` is not in MCP_K8S_ALLOWED_IMAGES \
                 (ask the operator to allow it); available: {available}"
            )),
            None => Err(format!("unknown `language` `{}`; available: {available}", crate::echo::shorten(name))),
        }
    }

    /// The profile a snippet file's extension picks.
    pub fn by_extension(&self, extension: &str) -> Option<&Profile> {
        self.profiles.values().find(|profile| profile.extensions.iter().any(|known| known == extension))
    }

    pub fn names(&self) -> Vec<&str> {
        self.profiles.keys().map(String::as_str).collect()
    }

    /// Two profiles claiming one extension would make a snippet's language
    /// depend on the order of a map.
    fn check_extensions(&self, path: Option<&Path>) -> Result<(), Error> {
        let mut owners: BTreeMap<&str, &str> = BTreeMap::new();
        for profile in self.profiles.values() {
            for extension in &profile.extensions {
                if let Some(other) = owners.insert(extension, &profile.name) {
                    return Err(profile_error(
                        path,
                        &profile.name,
                        "extensions",
                        format!("`{extension}` is also claimed by profile `{other}`; give each extension to one profile"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The languages file, as its errors name it (`settings_file::Error`, the one error
/// of every settings file).
pub const FILE: FileKind = FileKind { variable: "MCP_K8S_LANGUAGES", entry: "profile" };

/// One field of one profile is wrong; without a file, the built-in
/// profiles are.
fn profile_error(path: Option<&Path>, profile: &str, field: &str, message: String) -> Error {
    let path = path.map_or_else(|| "built-in profiles".to_string(), |path| path.display().to_string());
    Error::Field { kind: &FILE, path, entry: profile.to_string(), field: field.to_string(), message }
}

/// Fields a profile in the file may have.
const FIELDS: &[&str] = &["image", "filename", "command", "extensions", "timeout_s", "cpu", "memory", "env", "preload"];

fn built_in(max_timeout_s: u64) -> BTreeMap<String, Profile> {
    let home = [("HOME", "/tmp")];
    let profiles = [
        // Unbuffered, so a program killed at its timeout still shows what
        // it printed ("partial output").
        profile(
            "python",
            "python:3.12-slim",
            "main.py",
            &["python3", "{file}"],
            &["py"],
            30,
            "1",
            "512Mi",
            &[("PYTHONDONTWRITEBYTECODE", "1"), ("PYTHONUNBUFFERED", "1"), home[0]],
        ),
        profile("javascript", "node:22-slim", "index.js", &["node", "{file}"], &["js", "mjs", "cjs"], 30, "1", "512Mi", &home),
        // `go run` compiles first: more memory and time. GOCACHE and GOPATH
        // point into /tmp (the root is read-only); no C compiler in most
        // images, hence CGO_ENABLED=0; GOTOOLCHAIN=local because there is
        // no network to fetch another toolchain with.
        profile(
            "go",
            "golang:1.23",
            "main.go",
            &["go", "run", "{file}"],
            &["go"],
            60,
            "2",
            "1Gi",
            &[("CGO_ENABLED", "0"), ("GOCACHE", "/tmp/go-cache"), ("GOPATH", "/tmp/go"), ("GOTOOLCHAIN", "local"), home[0]],
        ),
        profile("bash", "bash:5.2", "main.sh", &["bash", "{file}"], &["sh", "bash"], 30, "1", "256Mi", &home),
    ];
    profiles
        .into_iter()
        .map(|mut profile| {
            profile.timeout_s = profile.timeout_s.min(max_timeout_s);
            (profile.name.clone(), profile)
        })
        .collect()
}

#[allow(clippy::too_many_arguments)] // a row of the built-in table reads best flat
fn profile(
    name: &str,
    image: &str,
    filename: &str,
    command: &[&str],
    extensions: &[&str],
    timeout_s: u64,
    cpu: &str,
    memory: &str,
    env: &[(&str, &str)],
) -> Profile {
    let strings = |items: &[&str]| items.iter().map(|item| item.to_string()).collect();
    Profile {
        name: name.to_string(),
        image: image.to_string(),
        filename: filename.to_string(),
        command: strings(command),
        extensions: strings(extensions),
        timeout_s,
        // The table above holds valid quantities; a typo shows in the
        // unit test that loads the built-ins.
        cpu: Quantity::parse(cpu).unwrap_or_else(|_| panic!("built-in cpu `{cpu}`")),
        memory: Quantity::parse(memory).unwrap_or_else(|_| panic!("built-in memory `{memory}`")),
        env: env.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect(),
        preload: Vec::new(),
    }
}

fn read_bounded(path: &Path) -> Result<String, Error> {
    settings_file::read_settings(&FILE, path, MAX_FILE_BYTES)
}

/// Merges the file's profiles into `profiles`: a known name changes the
/// fields it gives, a new name must give image, filename and command.
/// Returns the images the file's profiles name in their `image` field.
fn apply_file(profiles: &mut BTreeMap<String, Profile>, path: &Path, text: &str, max_timeout_s: u64) -> Result<Vec<String>, Error> {
    let syntax = |message: String| Error::Syntax { kind: &FILE, path: path.display().to_string(), message };
    let parsed = crate::json::parse_settings(text).map_err(|error| syntax(error.to_string()))?;
    let Value::Object(object) = parsed else {
        return Err(syntax("must be a JSON object of profiles, such as {\"ruby\": {\"image\": \"ruby:3.3\", ...}}".to_string()));
    };
    let mut images = Vec::new();
    for (name, fields) in &object {
        if !is_profile_name(name) {
            return Err(profile_error(
                Some(path),
                &crate::echo::shorten(name),
                "(name)",
                "must be 1 to 32 lowercase letters, digits, '-' or '_'".to_string(),
            ));
        }
        let Value::Object(fields) = fields else {
            return Err(profile_error(Some(path), name, "(profile)", "must be an object of fields".to_string()));
        };
        let profile = merge_profile(profiles.get(name), name, fields, path, max_timeout_s)?;
        if fields.contains_key("image") {
            images.push(profile.image.clone());
        }
        profiles.insert(name.clone(), profile);
    }
    Ok(images)
}

fn is_profile_name(name: &str) -> bool {
    (1..=32).contains(&name.len()) && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

fn merge_profile(
    base: Option<&Profile>,
    name: &str,
    fields: &Map<String, Value>,
    path: &Path,
    max_timeout_s: u64,
) -> Result<Profile, Error> {
    let error = |field: &str, message: String| profile_error(Some(path), name, field, message);
    if let Some(unknown) = fields.keys().find(|field| !FIELDS.contains(&field.as_str())) {
        return Err(error(&crate::echo::shorten(unknown), format!("unknown field; accepted: {}", FIELDS.join(", "))));
    }
    let required = |field: &str| match base {
        Some(_) => Ok(()),
        None if fields.contains_key(field) => Ok(()),
        None => Err(error(field, "is required for a profile that is not built in".to_string())),
    };
    required("image")?;
    required("filename")?;
    required("command")?;
    let defaults = built_in_defaults(name, max_timeout_s);
    let base = base.unwrap_or(&defaults);
    let profile = Profile {
        name: name.to_string(),
        image: optional(fields, "image", |value| image_field(value).map_err(|m| error("image", m)))?.unwrap_or_else(|| base.image.clone()),
        filename: optional(fields, "filename", |value| filename_field(value).map_err(|m| error("filename", m)))?
            .unwrap_or_else(|| base.filename.clone()),
        command: optional(fields, "command", |value| command_field(value).map_err(|m| error("command", m)))?
            .unwrap_or_else(|| base.command.clone()),
        extensions: optional(fields, "extensions", |value| extensions_field(value).map_err(|m| error("extensions", m)))?
            .unwrap_or_else(|| base.extensions.clone()),
        timeout_s: optional(fields, "timeout_s", |value| timeout_field(value, max_timeout_s).map_err(|m| error("timeout_s", m)))?
            .unwrap_or(base.timeout_s),
        cpu: optional(fields, "cpu", |value| quantity_field(value, Resource::Cpu).map_err(|m| error("cpu", m)))?
            .unwrap_or_else(|| base.cpu.clone()),
        memory: optional(fields, "memory", |value| quantity_field(value, Resource::Memory).map_err(|m| error("memory", m)))?
            .unwrap_or_else(|| base.memory.clone()),
        env: optional(fields, "env", |value| env_field(value).map_err(|m| error("env", m)))?.unwrap_or_else(|| base.env.clone()),
        preload: optional(fields, "preload", |value| preload_field(value).map_err(|m| error("preload", m)))?
            .unwrap_or_else(|| base.preload.clone()),
    };
    if !profile.preload.is_empty() && profile.prestart().is_none() {
        let message = "is for Python profiles: the command must be `python3` (options allowed) then `{file}`".to_string();
        return Err(error("preload", message));
    }
    Ok(profile)
}

/// What a new profile gets for the fields it leaves out.
fn built_in_defaults(name: &str, max_timeout_s: u64) -> Profile {
    let mut defaults = profile(name, "", "", &[], &[], 30, "1", "512Mi", &[("HOME", "/tmp")]);
    defaults.timeout_s = defaults.timeout_s.min(max_timeout_s);
    defaults
}

fn optional<T>(fields: &Map<String, Value>, field: &str, parse: impl Fn(&Value) -> Result<T, Error>) -> Result<Option<T>, Error> {
    fields.get(field).map(parse).transpose()
}

fn string_field(value: &Value) -> Result<&str, String> {
    match value {
        Value::String(text) if !text.is_empty() => Ok(text),
        Value::String(_) => Err("must not be empty".to_string()),
        other => Err(format!("must be a string, not {}", kind(other))),
    }
}

fn image_field(value: &Value) -> Result<String, String> {
    let image = string_field(value)?;
    if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("`{}` is not an image reference such as python:3.12-slim", crate::echo::shorten(image)));
    }
    Ok(image.to_string())
}

fn filename_field(value: &Value) -> Result<String, String> {
    let filename = string_field(value)?;
    if filename.contains('/') || filename.starts_with('.') || filename.chars().any(char::is_control) || filename.len() > 255 {
        return Err(format!("`{}` must be a plain file name such as main.py (no folders, not hidden)", crate::echo::shorten(filename)));
    }
    Ok(filename.to_string())
}

fn string_list(value: &Value) -> Result<Vec<String>, String> {
    let Value::Array(items) = value else {
        return Err(format!("must be an array of strings, not {}", kind(value)));
    };
    items.iter().map(|item| string_field(item).map(str::to_string)).collect()
}

fn command_field(value: &Value) -> Result<Vec<String>, String> {
    let command = string_list(value)?;
    if !command.iter().any(|arg| arg.contains(FILE_PLACEHOLDER)) {
        return Err(format!("must name the entrypoint as `{FILE_PLACEHOLDER}`, e.g. [\"ruby\", \"{FILE_PLACEHOLDER}\"]"));
    }
    Ok(command)
}

fn extensions_field(value: &Value) -> Result<Vec<String>, String> {
    let extensions = string_list(value)?;
    if let Some(bad) = extensions.iter().find(|extension| !extension.chars().all(|c| c.is_ascii_alphanumeric())) {
        return Err(format!("`{}` must be letters and digits without the dot, e.g. \"rb\"", crate::echo::shorten(bad)));
    }
    Ok(extensions)
}

fn preload_field(value: &Value) -> Result<Vec<String>, String> {
    let modules = string_list(value)?;
    if modules.len() > MAX_PRELOAD {
        return Err(format!("names {} modules; at most {MAX_PRELOAD}", modules.len()));
    }
    if let Some(bad) = modules.iter().find(|module| !is_module_name(module)) {
        return Err(format!("`{}` is not a module name such as json or http.client", crate::echo::shorten(bad)));
    }
    Ok(modules)
}

/// A dotted Python module name: identifiers of ASCII letters, digits and
/// '_', not starting with a digit (a variable name's rule, `is_env_name`).
fn is_module_name(name: &str) -> bool {
    name.len() <= MAX_MODULE_CHARS && name.split('.').all(is_env_name)
}

fn timeout_field(value: &Value, max_timeout_s: u64) -> Result<u64, String> {
    match value.as_u64() {
        Some(seconds) if (1..=max_timeout_s).contains(&seconds) => Ok(seconds),
        _ => Err(format!("must be a whole number of seconds from 1 to {max_timeout_s} (MCP_K8S_MAX_TIMEOUT_S)")),
    }
}

fn quantity_field(value: &Value, resource: Resource) -> Result<Quantity, String> {
    Quantity::parse_limit(string_field(value)?, resource)
}

fn env_field(value: &Value) -> Result<BTreeMap<String, String>, String> {
    let Value::Object(object) = value else {
        return Err(format!("must be an object of strings, not {}", kind(value)));
    };
    let mut env = BTreeMap::new();
    for (name, value) in object {
        if !is_env_name(name) {
            return Err(format!("`{}` is not a variable name (letters, digits and '_')", crate::echo::shorten(name)));
        }
        let Value::String(value) = value else {
            return Err(format!("`{name}` must be a string"));
        };
        env.insert(name.clone(), value.clone());
    }
    Ok(env)
}

/// `config::is_env_name`'s rule (Kubernetes' `C_IDENTIFIER`), repeated
/// because `config` imports this module and not the other way round
/// (tests/offline/architecture.rs).
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> Result<Languages, Error> {
        let dir = std::env::temp_dir().join(format!("mcp-languages-{}-{}", std::process::id(), text.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("languages.json");
        std::fs::write(&path, text).unwrap();
        let result = Languages::load(Some(&path), 600);
        std::fs::remove_dir_all(&dir).unwrap();
        result.map_err(|error| match error {
            // The temporary path differs per run; tests compare the rest.
            Error::Field { kind, entry, field, message, .. } => Error::Field { kind, path: "F".into(), entry, field, message },
            Error::Syntax { kind, message, .. } => Error::Syntax { kind, path: "F".into(), message },
            Error::Read { kind, message, .. } => Error::Read { kind, path: "F".into(), message },
        })
    }

    fn field_error(profile: &str, field: &str, message: &str) -> Error {
        Error::Field { kind: &FILE, path: "F".into(), entry: profile.into(), field: field.into(), message: message.into() }
    }

    #[test]
    fn the_built_in_profiles_load_and_run_their_file() {
        let languages = Languages::load(None, 600).unwrap();
        assert_eq!(languages.names(), ["bash", "go", "javascript", "python"]);
        assert_eq!(languages.get("python").unwrap().argv("main.py"), ["python3", "main.py"]);
        assert_eq!(languages.get("go").unwrap().argv("x.go"), ["go", "run", "x.go"]);
        assert_eq!(languages.get("go").unwrap().env["GOCACHE"], "/tmp/go-cache");
        assert_eq!(languages.by_extension("mjs").unwrap().name, "javascript");
        assert!(languages.by_extension("rb").is_none());
    }

    #[test]
    fn built_in_timeouts_are_lowered_to_the_maximum() {
        let languages = Languages::load(None, 10).unwrap();
        assert!(languages.profiles.values().all(|profile| profile.timeout_s == 10));
    }

    #[test]
    fn a_file_overrides_fields_and_adds_profiles() {
        let languages = load_text(
            r#"{"python": {"image": "mcp-k8s-test.local/python:3.11", "timeout_s": 5},
                "ruby": {"image": "ruby:3.3", "filename": "main.rb", "command": ["ruby", "{file}"], "extensions": ["rb"]}}"#,
        )
        .unwrap();
        let python = languages.get("python").unwrap();
        assert_eq!((python.image.as_str(), python.timeout_s, python.filename.as_str()), ("mcp-k8s-test.local/python:3.11", 5, "main.py"));
        assert_eq!(languages.by_extension("rb").unwrap().argv("main.rb"), ["ruby", "main.rb"]);
        assert_eq!(languages.operator_images, ["mcp-k8s-test.local/python:3.11", "ruby:3.3"], "the images the file names");
    }

    #[test]
    fn only_languages_whose_image_is_allowed_are_offered() {
        let mut languages = load_text(
            r#"{"python": {"timeout_s": 5}, "ruby": {"image": "ruby:3.3", "filename": "main.rb", "command": ["ruby", "{file}"]}}"#,
        )
        .unwrap();
        assert_eq!(languages.operator_images, ["ruby:3.3"], "python's image is the built-in one");
        let allowed = crate::images::Allowlist::parse("python:3.12-slim").unwrap().with_images(&languages.operator_images).unwrap();
        languages.keep_allowed(&allowed);
        assert_eq!(languages.names(), ["python", "ruby"], "a built-in image allowed by the list, a file's image by the file");
        let go = languages.profile("go").unwrap_err();
        assert!(go.starts_with("language `go` is not available on this server: its image `golang:"), "{go}");
        assert!(go.contains("MCP_K8S_ALLOWED_IMAGES") && go.ends_with("available: python, ruby"), "{go}");
        assert!(languages.profile("cobol").unwrap_err().starts_with("unknown `language` `cobol`"));
        let mut none = Languages::load(None, 600).unwrap();
        none.keep_allowed(&crate::images::Allowlist::parse("").unwrap());
        assert!(none.names().is_empty(), "an empty allowlist allows no language either");
        assert!(none.profile("python").unwrap_err().ends_with("available: none (no language's image is in MCP_K8S_ALLOWED_IMAGES)"));
    }

    #[test]
    fn file_errors_name_the_profile_and_the_field() {
        let cases: &[(&str, Error)] = &[
            (
                r#"{"ruby": {"image": "ruby:3.3", "command": ["ruby", "{file}"]}}"#,
                field_error("ruby", "filename", "is required for a profile that is not built in"),
            ),
            (r#"{"python": {"image": 3}}"#, field_error("python", "image", "must be a string, not a number")),
            (r#"{"python": {"image": "a b"}}"#, field_error("python", "image", "`a b` is not an image reference such as python:3.12-slim")),
            (
                r#"{"python": {"command": ["python3", "main.py"]}}"#,
                field_error("python", "command", "must name the entrypoint as `{file}`, e.g. [\"ruby\", \"{file}\"]"),
            ),
            (
                r#"{"python": {"filename": "../x.py"}}"#,
                field_error("python", "filename", "`../x.py` must be a plain file name such as main.py (no folders, not hidden)"),
            ),
            (
                r#"{"python": {"timeout_s": 601}}"#,
                field_error("python", "timeout_s", "must be a whole number of seconds from 1 to 600 (MCP_K8S_MAX_TIMEOUT_S)"),
            ),
            (
                r#"{"python": {"memory": "lots"}}"#,
                field_error("python", "memory", "`lots` is not a Kubernetes quantity such as 500m or 512Mi"),
            ),
            (r#"{"python": {"env": {"1X": "y"}}}"#, field_error("python", "env", "`1X` is not a variable name (letters, digits and '_')")),
            (
                r#"{"python": {"extensions": [".py"]}}"#,
                field_error("python", "extensions", "`.py` must be letters and digits without the dot, e.g. \"rb\""),
            ),
            (
                r#"{"python": {"imgae": "x"}}"#,
                field_error(
                    "python",
                    "imgae",
                    "unknown field; accepted: image, filename, command, extensions, timeout_s, cpu, memory, env, preload",
                ),
            ),
            (
                r#"{"python": {"preload": ["json", "http..client"]}}"#,
                field_error("python", "preload", "`http..client` is not a module name such as json or http.client"),
            ),
            (
                r#"{"javascript": {"preload": ["fs"]}}"#,
                field_error(
                    "javascript",
                    "preload",
                    "is for Python profiles: the command must be `python3` (options allowed) then `{file}`",
                ),
            ),
            (
                r#"{"python": {"command": ["python3", "-m", "{file}"], "preload": ["json"]}}"#,
                field_error("python", "preload", "is for Python profiles: the command must be `python3` (options allowed) then `{file}`"),
            ),
            (r#"{"Py thon": {}}"#, field_error("Py thon", "(name)", "must be 1 to 32 lowercase letters, digits, '-' or '_'")),
            (r#"{"python": []}"#, field_error("python", "(profile)", "must be an object of fields")),
            (
                r#"{"node": {"image": "node:22", "filename": "a.js", "command": ["node", "{file}"], "extensions": ["js"]}}"#,
                field_error("node", "extensions", "`js` is also claimed by profile `javascript`; give each extension to one profile"),
            ),
            (
                "[]",
                Error::Syntax {
                    kind: &FILE,
                    path: "F".into(),
                    message: "must be a JSON object of profiles, such as {\"ruby\": {\"image\": \"ruby:3.3\", ...}}".into(),
                },
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(&load_text(text).unwrap_err(), expected, "{text}");
        }
    }

    #[test]
    fn a_python_profile_prestarts_its_interpreter_with_its_modules() {
        let languages =
            load_text(r#"{"python": {"command": ["/usr/bin/python3", "-u", "{file}", "--flag"], "preload": ["json", "http.client"]}}"#)
                .expect("loads");
        let python = languages.get("python").expect("python");
        let (prefix, argv) = python.prestart().expect("python pre-starts");
        assert_eq!(prefix, ["/usr/bin/python3", "-u"]);
        assert_eq!(argv[..3], ["/usr/bin/python3", "-u", "-c"]);
        assert_eq!(argv[3], PYTHON_PRELOAD);
        assert_eq!(argv[4..], ["json", "http.client"]);
        assert!(languages.get("javascript").and_then(Profile::prestart).is_none(), "node is not pre-started");
        assert!(languages.get("go").and_then(Profile::prestart).is_none());
    }

    #[test]
    fn only_the_interpreters_own_options_may_come_before_the_file() {
        let words = |args: &[&str]| args.iter().map(|arg| arg.to_string()).collect::<Vec<_>>();
        for (args, expected) in [
            (&[][..], true),
            (&["-u"][..], true),
            (&["-X", "dev"][..], true),
            (&["-Xdev", "-B"][..], true),
            (&["-W", "ignore", "-u"][..], true),
            (&["-X"][..], false),
            (&["-c"][..], false),
            (&["-m", "pytest"][..], false),
            (&["-"][..], false),
            (&["script.py"][..], false),
        ] {
            assert_eq!(interpreter_options_only(&words(args)), expected, "{args:?}");
        }
    }

    /// Regression: serde_json kept the last of two copies silently, a
    /// second profile of one name included.
    #[test]
    fn a_key_twice_is_refused_naming_it_and_where() {
        let cases = [
            (
                r#"{"python": {"image": "python:3.11"}, "python": {"image": "python:3.12"}}"#,
                "key `python` appears twice in one object (the second at line 1 column 45); keep one",
            ),
            (
                r#"{"python": {"image": "a:1", "image": "b:1"}}"#,
                "key `image` appears twice in one object (the second at line 1 column 35); keep one",
            ),
        ];
        for (text, message) in cases {
            assert_eq!(load_text(text).unwrap_err(), Error::Syntax { kind: &FILE, path: "F".into(), message: message.into() }, "{text}");
        }
    }

    #[test]
    fn a_missing_file_is_named() {
        let error = Languages::load(Some(Path::new("/nonexistent/languages.json")), 600).unwrap_err();
        assert!(error.to_string().starts_with("MCP_K8S_LANGUAGES: cannot read `/nonexistent/languages.json`: "), "{error}");
    }
}
