//! The operator's warm pools (`MCP_K8S_WARM_POOLS`): a JSON file
//! listing pools of sandboxes kept running ahead of the runs that will
//! take them, each with the image, CPU and memory limits and network mode
//! a run must have to take one of its sandboxes, how many to keep, and how
//! long one may stay idle before it is replaced. Checked once at start,
//! like `MCP_K8S_LANGUAGES` (`languages.rs` is the model): the image must
//! pass the allowlist (or be an `execute_code` profile's), the network
//! mode must be one the operator allows, and every error names the file,
//! the pool and the field.
//!
//! Knows nothing of RunSpec, backends or the pool's life: which run takes
//! a pool sandbox and when one is made or replaced is `engine::pools::pool`. The
//! JSON is read by hand because only `tools` and `kube` derive serde
//! (style.md §2).

use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::images::Allowlist;
use crate::json::json_kind;
use crate::languages::{Languages, Profile};
use crate::network::{self, NetworkMode};
use crate::quantity::{Quantity, Resource};
use crate::settings_file::{self, Error, FileKind};

/// The pools file is configuration, not data: 64 KiB hold hundreds of pools.
pub const MAX_FILE_BYTES: u64 = 64 << 10;
/// Sandboxes one pool may keep: each holds its requests on a node and in
/// the namespace's quota while it waits, so a pool is a handful, not a farm.
const MAX_SIZE: u64 = 20;
/// A pool's name goes into its sandboxes' names and labels
/// (`mcp-pool-<name>-<suffix>` must stay a 63-character label with the
/// pod's own suffix), hence shorter than a DNS label may be.
pub const MAX_NAME_CHARS: usize = 32;
/// `max_idle_s` when the file gives none.
const DEFAULT_MAX_IDLE_S: u64 = 600;
/// Below this a pool would replace its sandboxes about as fast as they
/// start; above it an idle sandbox outlives any reason to keep it.
const MAX_IDLE_S_RANGE: (u64, u64) = (30, 86_400);

/// One pool, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// A DNS label of at most `MAX_NAME_CHARS`.
    pub name: String,
    /// Normalised the way `Allowlist::check` writes a run's image, so the
    /// two compare as text.
    pub image: String,
    /// `None`: no CPU limit, as for a call that gives none (the default
    /// request applies); only such calls take this pool's sandboxes.
    pub cpu: Option<Quantity>,
    /// `None`: no memory limit, as for a call that gives none.
    pub memory: Option<Quantity>,
    pub network: NetworkMode,
    /// Sandboxes kept ready, 1 to `MAX_SIZE`.
    pub size: u32,
    /// How long a ready sandbox may wait for a run before it is replaced.
    pub max_idle: Duration,
    /// The site that keeps it (`MCP_K8S_SITES`); `None`: the default site.
    /// Checked against the sites by `config`.
    pub site: Option<String>,
    /// An `execute_code` profile whose interpreter its sandboxes start
    /// ahead, with the profile's `preload` modules (`Profile::prestart`).
    pub language: Option<String>,
}

/// What a pool is checked against: the operator's other settings.
#[derive(Clone, Copy, Debug)]
pub struct Bounds<'a> {
    /// MCP_K8S_ALLOWED_IMAGES.
    pub allowlist: &'a Allowlist,
    /// `execute_code`'s profiles: their images are allowed by being
    /// configured (as `tools::execute_code` allows them), and a pool may
    /// be of one (`language`).
    pub languages: &'a Languages,
    /// MCP_K8S_NETWORK_MODES.
    pub network_modes: &'a [NetworkMode],
}

/// Reads and checks the pools file at `path`.
pub fn load(path: &Path, bounds: &Bounds<'_>) -> Result<Vec<Pool>, Error> {
    let text = read_bounded(path)?;
    parse(path, &text, bounds)
}

/// The pools file, as its errors name it (`settings_file::Error`, the one error
/// of every settings file).
pub const FILE: FileKind = FileKind { variable: "MCP_K8S_WARM_POOLS", entry: "pool" };

/// Fields a pool may have.
const FIELDS: &[&str] = &["name", "image", "cpu", "memory", "network", "size", "max_idle_s", "site", "language"];

fn read_bounded(path: &Path) -> Result<String, Error> {
    settings_file::read_settings(&FILE, path, MAX_FILE_BYTES)
}

fn syntax(path: &Path, message: String) -> Error {
    Error::Syntax { kind: &FILE, path: path.display().to_string(), message }
}

fn parse(path: &Path, text: &str, bounds: &Bounds<'_>) -> Result<Vec<Pool>, Error> {
    let parsed = crate::json::parse_settings(text).map_err(|error| syntax(path, error.to_string()))?;
    let Value::Array(items) = parsed else {
        return Err(syntax(
            path,
            "must be a JSON list of pools, such as [{\"name\": \"busybox\", \"image\": \"busybox:1.36\", \"network\": \"none\", \"size\": 2}]"
                .to_string(),
        ));
    };
    let mut pools: Vec<Pool> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let pool = parse_pool(path, index, item, bounds)?;
        check_distinct(path, &pools, &pool)?;
        pools.push(pool);
    }
    Ok(pools)
}

fn parse_pool(path: &Path, index: usize, item: &Value, bounds: &Bounds<'_>) -> Result<Pool, Error> {
    let unnamed = format!("#{index}");
    let field_error = |pool: &str, field: &str, message: String| Error::Field {
        kind: &FILE,
        path: path.display().to_string(),
        entry: pool.to_string(),
        field: field.to_string(),
        message,
    };
    let Value::Object(fields) = item else {
        return Err(field_error(&unnamed, "(pool)", format!("must be an object of fields, not {}", json_kind(item))));
    };
    let name = match fields.get("name") {
        None => return Err(field_error(&unnamed, "name", "is required".to_string())),
        Some(value) => name_field(value).map_err(|message| field_error(&unnamed, "name", message))?,
    };
    let error = |field: &str, message: String| field_error(&name, field, message);
    if let Some(unknown) = fields.keys().find(|field| !FIELDS.contains(&field.as_str())) {
        return Err(error(&crate::echo::shorten(unknown), format!("unknown field; accepted: {}", FIELDS.join(", "))));
    }
    let required = |field: &str| fields.get(field).ok_or_else(|| error(field, "is required".to_string()));
    let profile =
        optional(fields, "language", |value| language_field(value, bounds.languages)).map_err(|message| error("language", message))?;
    // A language pool's shape is its profile's unless the file says
    // otherwise: what `execute_code` asks for.
    let image = match (fields.get("image"), profile) {
        (Some(value), _) => image_field(value, bounds).map_err(|message| error("image", message))?,
        (None, Some(profile)) => image_field(&Value::String(profile.image.clone()), bounds).map_err(|message| error("image", message))?,
        (None, None) => return Err(error("image", "is required".to_string())),
    };
    let limit = |field: &str, resource: Resource, default: Option<&Quantity>| {
        let given = optional(fields, field, |value| quantity_field(value, resource)).map_err(|message| error(field, message))?;
        Ok::<_, Error>(given.or_else(|| default.cloned()))
    };
    Ok(Pool {
        image,
        cpu: limit("cpu", Resource::Cpu, profile.map(|profile| &profile.cpu))?,
        memory: limit("memory", Resource::Memory, profile.map(|profile| &profile.memory))?,
        network: network_field(required("network")?, bounds.network_modes).map_err(|message| error("network", message))?,
        size: whole_number(required("size")?, 1, MAX_SIZE).map_err(|message| error("size", message))? as u32,
        max_idle: Duration::from_secs(
            optional(fields, "max_idle_s", |value| whole_number(value, MAX_IDLE_S_RANGE.0, MAX_IDLE_S_RANGE.1))
                .map_err(|message| error("max_idle_s", message))?
                .unwrap_or(DEFAULT_MAX_IDLE_S),
        ),
        site: optional(fields, "site", |value| text_field(value).map(str::to_string)).map_err(|message| error("site", message))?,
        language: profile.map(|profile| profile.name.clone()),
        name,
    })
}

/// A profile whose interpreter can be started ahead.
fn language_field<'a>(value: &Value, languages: &'a Languages) -> Result<&'a Profile, String> {
    let name = text_field(value)?;
    let profile = languages.profile(name)?;
    match profile.prestart() {
        Some(_) => Ok(profile),
        None => Err(format!("profile `{name}` cannot be started ahead: only Python profiles (`python3` then `{{file}}`) can")),
    }
}

/// Two pools of one name would share labels; two of one shape would make
/// the pool a run takes depend on the order of the file.
fn check_distinct(path: &Path, earlier: &[Pool], pool: &Pool) -> Result<(), Error> {
    let conflict = |field: &str, message: String| Error::Field {
        kind: &FILE,
        path: path.display().to_string(),
        entry: pool.name.clone(),
        field: field.to_string(),
        message,
    };
    if earlier.iter().any(|other| other.name == pool.name) {
        return Err(conflict("name", "is used by an earlier pool; give each pool its own name".to_string()));
    }
    let same_shape = |other: &&Pool| {
        other.image == pool.image
            && other.cpu == pool.cpu
            && other.memory == pool.memory
            && other.network == pool.network
            && other.site == pool.site
    };
    if let Some(other) = earlier.iter().find(same_shape) {
        return Err(conflict(
            "(pool)",
            format!("has the image, cpu, memory and network of pool `{}`; merge the two into one with their sizes added", other.name),
        ));
    }
    Ok(())
}

fn optional<T>(fields: &Map<String, Value>, field: &str, parse: impl Fn(&Value) -> Result<T, String>) -> Result<Option<T>, String> {
    fields.get(field).map(parse).transpose()
}

fn text_field(value: &Value) -> Result<&str, String> {
    match value {
        Value::String(text) if !text.is_empty() => Ok(text),
        Value::String(_) => Err("must not be empty".to_string()),
        other => Err(format!("must be a string, not {}", json_kind(other))),
    }
}

fn name_field(value: &Value) -> Result<String, String> {
    let name = text_field(value)?;
    let valid_chars = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let valid_ends = name.starts_with(|c: char| c.is_ascii_alphanumeric()) && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if name.len() > MAX_NAME_CHARS || !valid_chars || !valid_ends {
        return Err(format!(
            "`{}` must be 1 to {MAX_NAME_CHARS} lowercase letters, digits or '-', starting and ending with a letter or digit",
            crate::echo::shorten(name)
        ));
    }
    Ok(name.to_string())
}

/// The normalised image, if the allowlist admits it (a languages file's
/// images are in it: `Config`).
fn image_field(value: &Value, bounds: &Bounds<'_>) -> Result<String, String> {
    let image = text_field(value)?;
    crate::images::normalise(image)?;
    bounds.allowlist.check(image).map(|checked| checked.to_string()).map_err(|why| format!("{why} (MCP_K8S_ALLOWED_IMAGES)"))
}

fn quantity_field(value: &Value, resource: Resource) -> Result<Quantity, String> {
    Quantity::parse_limit(text_field(value)?, resource)
}

fn network_field(value: &Value, allowed: &[NetworkMode]) -> Result<NetworkMode, String> {
    let text = text_field(value)?;
    let mode = NetworkMode::from_name(text)
        .ok_or_else(|| format!("`{}` is not a network mode; expected one of none, restricted, open", crate::echo::shorten(text)))?;
    if !allowed.contains(&mode) {
        return Err(format!("`{text}` is not one of MCP_K8S_NETWORK_MODES ({}), so no run could take this pool", network::names(allowed)));
    }
    Ok(mode)
}

fn whole_number(value: &Value, min: u64, max: u64) -> Result<u64, String> {
    match value.as_u64() {
        Some(number) if (min..=max).contains(&number) => Ok(number),
        _ => Err(format!("must be a whole number from {min} to {max}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<Vec<Pool>, Error> {
        let allowlist = Allowlist::parse("busybox:1.36,mcp-k8s-test.local/*,python:3.12-slim,node:22-slim").unwrap();
        let mut languages = Languages::load(None, 600).unwrap();
        languages.keep_allowed(&allowlist);
        let bounds = Bounds { allowlist: &allowlist, languages: &languages, network_modes: &[NetworkMode::None, NetworkMode::Open] };
        parse(Path::new("F"), text, &bounds)
    }

    fn field_error(pool: &str, field: &str, message: &str) -> Error {
        Error::Field { kind: &FILE, path: "F".into(), entry: pool.into(), field: field.into(), message: message.into() }
    }

    #[test]
    fn a_file_of_pools_is_read_with_defaults() {
        let pools = check(
            r#"[{"name": "busybox", "image": "busybox:1.36", "network": "none", "size": 2},
                {"name": "py", "image": "docker.io/library/python:3.12-slim", "cpu": "1000m", "memory": "512Mi",
                 "network": "open", "size": 20, "max_idle_s": 30}]"#,
        )
        .unwrap();
        assert_eq!(pools.len(), 2);
        let busybox = &pools[0];
        assert_eq!(busybox.image, "docker.io/library/busybox:1.36");
        assert_eq!((busybox.cpu.as_ref(), busybox.memory.as_ref()), (None, None));
        assert_eq!((busybox.network, busybox.size, busybox.max_idle), (NetworkMode::None, 2, Duration::from_secs(600)));
        let python = &pools[1];
        assert_eq!(python.image, "docker.io/library/python:3.12-slim", "a profile's image needs no allowlist entry");
        assert_eq!(python.cpu, Some(Quantity::parse("1").unwrap()), "quantities compare by value");
        assert_eq!((python.size, python.max_idle), (20, Duration::from_secs(30)));
        assert_eq!(check("[]").unwrap(), []);
    }

    #[test]
    fn a_language_pool_takes_its_profiles_shape_unless_told_otherwise() {
        let pools = check(
            r#"[{"name": "py", "language": "python", "network": "none", "size": 1},
                              {"name": "py-big", "language": "python", "memory": "1Gi", "network": "none", "size": 1}]"#,
        )
        .unwrap();
        let python = &pools[0];
        assert_eq!(python.language.as_deref(), Some("python"));
        assert_eq!(python.image, "docker.io/library/python:3.12-slim");
        assert_eq!((python.cpu.clone(), python.memory.clone()), (Quantity::parse("1").ok(), Quantity::parse("512Mi").ok()));
        assert_eq!(pools[1].memory, Quantity::parse("1Gi").ok());
    }

    #[test]
    fn errors_name_the_pool_and_the_field() {
        let pool = |extra: &str| format!(r#"[{{"name": "p", "image": "busybox:1.36", "network": "none", "size": 1{extra}}}]"#);
        let cases: &[(String, Error)] = &[
            (r#"[{"image": "busybox:1.36"}]"#.to_string(), field_error("#0", "name", "is required")),
            (
                r#"[{"name": "Big_Pool"}]"#.to_string(),
                field_error(
                    "#0",
                    "name",
                    "`Big_Pool` must be 1 to 32 lowercase letters, digits or '-', starting and ending with a letter or digit",
                ),
            ),
            (r#"[{"name": 7}]"#.to_string(), field_error("#0", "name", "must be a string, not an integer")),
            ("[3]".to_string(), field_error("#0", "(pool)", "must be an object of fields, not an integer")),
            (r#"[{"name": "p", "network": "none", "size": 1}]"#.to_string(), field_error("p", "image", "is required")),
            (pool(r#", "language": "ruby""#), field_error("p", "language", "unknown `language` `ruby`; available: javascript, python")),
            (
                r#"[{"name": "p", "language": "go", "image": "busybox:1.36", "network": "none", "size": 1}]"#.to_string(),
                field_error(
                    "p",
                    "language",
                    "language `go` is not available on this server: its image `golang:1.23` is not in MCP_K8S_ALLOWED_IMAGES \
                     (ask the operator to allow it); available: javascript, python",
                ),
            ),
            (
                pool(r#", "language": "javascript""#),
                field_error(
                    "p",
                    "language",
                    "profile `javascript` cannot be started ahead: only Python profiles (`python3` then `{file}`) can",
                ),
            ),
            (
                r#"[{"name": "p", "image": "alpine:3", "network": "none", "size": 1}]"#.to_string(),
                field_error(
                    "p",
                    "image",
                    "image `alpine:3` is not allowed; allowed: busybox:1.36, mcp-k8s-test.local/*, python:3.12-slim, node:22-slim (MCP_K8S_ALLOWED_IMAGES)",
                ),
            ),
            (
                r#"[{"name": "p", "image": "a b", "network": "none", "size": 1}]"#.to_string(),
                field_error("p", "image", "image `a b` is not a valid image reference: it contains white space or control characters"),
            ),
            (pool(r#", "cpu": "lots""#), field_error("p", "cpu", "`lots` is not a Kubernetes quantity such as 500m or 512Mi")),
            (
                pool(r#", "memory": "64""#),
                field_error(
                    "p",
                    "memory",
                    "`64` is below the minimum of 16Mi (a bare number is bytes: `64` is 64 bytes; write `64Mi` for mebibytes, `1Gi` for gibibytes)",
                ),
            ),
            (
                r#"[{"name": "p", "image": "busybox:1.36", "network": "restricted", "size": 1}]"#.to_string(),
                field_error(
                    "p",
                    "network",
                    "`restricted` is not one of MCP_K8S_NETWORK_MODES (none, open), so no run could take this pool",
                ),
            ),
            (
                r#"[{"name": "p", "image": "busybox:1.36", "network": "host", "size": 1}]"#.to_string(),
                field_error("p", "network", "`host` is not a network mode; expected one of none, restricted, open"),
            ),
            (
                r#"[{"name": "p", "image": "busybox:1.36", "network": "none", "size": 21}]"#.to_string(),
                field_error("p", "size", "must be a whole number from 1 to 20"),
            ),
            (
                r#"[{"name": "p", "image": "busybox:1.36", "network": "none", "size": 0}]"#.to_string(),
                field_error("p", "size", "must be a whole number from 1 to 20"),
            ),
            (pool(r#", "max_idle_s": 5"#), field_error("p", "max_idle_s", "must be a whole number from 30 to 86400")),
            (
                pool(r#", "sise": 2"#),
                field_error("p", "sise", "unknown field; accepted: name, image, cpu, memory, network, size, max_idle_s, site, language"),
            ),
            (
                r#"[{"name": "p", "image": "busybox:1.36", "network": "none", "size": 1},
                    {"name": "p", "image": "busybox:1.36", "network": "open", "size": 1}]"#
                    .to_string(),
                field_error("p", "name", "is used by an earlier pool; give each pool its own name"),
            ),
            (
                r#"[{"name": "a", "image": "busybox:1.36", "network": "none", "size": 1},
                    {"name": "b", "image": "docker.io/library/busybox:1.36", "network": "none", "size": 3}]"#
                    .to_string(),
                field_error(
                    "b",
                    "(pool)",
                    "has the image, cpu, memory and network of pool `a`; merge the two into one with their sizes added",
                ),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(&check(text).unwrap_err(), expected, "{text}");
        }
        let syntax = check(r#"{"name": "p"}"#).unwrap_err().to_string();
        assert!(syntax.starts_with("MCP_K8S_WARM_POOLS: `F`: must be a JSON list of pools"), "{syntax}");
        // Regression: serde_json kept the last of two copies silently.
        let twice = check(&pool(r#", "size": 9"#)).unwrap_err().to_string();
        assert_eq!(twice, "MCP_K8S_WARM_POOLS: `F`: key `size` appears twice in one object (the second at line 1 column 76); keep one");
    }

    #[test]
    fn a_missing_file_is_named() {
        let allowlist = Allowlist::parse("").unwrap();
        let languages = Languages::load(None, 600).unwrap();
        let bounds = Bounds { allowlist: &allowlist, languages: &languages, network_modes: &NetworkMode::ALL };
        let error = load(Path::new("/nonexistent/pools.json"), &bounds).unwrap_err().to_string();
        assert!(error.starts_with("MCP_K8S_WARM_POOLS: cannot read `/nonexistent/pools.json`: "), "{error}");
    }
}
