//! Who calls, and what each caller may do: the operator's tokens file
//! (`MCP_K8S_AUTH_TOKENS_FILE`), a JSON list of callers, each a name, the
//! SHA-256 of its token and its limits (concurrent runs, CPU-seconds per
//! hour, sites, images, tools), checked once at start like the pools file;
//! which caller a presented token is (`Callers::identify`, in constant
//! time over every entry); and the ledger that enforces the counted limits
//! before a run is created (`Ledger::admit`).
//!
//! A server without the file has one caller (`Caller::whole_server`): over
//! stdio, or HTTP with `MCP_K8S_AUTH_TOKEN` or none, with the server's own
//! limits only.
//!
//! Knows no layer: the transport asks who a token is, the tools ask the
//! ledger, the engine only records the caller's name on a run. The counts
//! are this process's: with several replicas, a caller's runs on each are
//! counted there (the README says so).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::images::Allowlist;
use crate::json::json_kind;
use crate::settings_file::{Error, FileKind};

/// The tokens file is configuration: 1 MiB holds thousands of callers.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// A caller's name is recorded on its runs as a label value.
pub const MAX_NAME_CHARS: usize = 63;
/// The window `cpu_seconds_per_hour` counts over.
const HOUR: Duration = Duration::from_secs(3600);

/// One caller: its name (in the audit trail, on its runs, in metrics) and
/// its limits.
#[derive(Clone, Debug, PartialEq)]
pub struct Caller {
    pub name: String,
    pub limits: Limits,
    /// Whether the server has several callers, so a caller sees only its
    /// own runs; a whole-server caller sees every run, as before callers.
    pub scoped: bool,
}

/// What a caller may do beyond the server's own limits; `None` is "as the
/// server allows".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Limits {
    /// Runs of this caller in flight at once (background runs until they end).
    pub concurrent_runs: Option<u32>,
    /// CPU-seconds over the last hour: a run costs its CPU (its limit, else
    /// the default request) times how long its command ran.
    pub cpu_seconds_per_hour: Option<u64>,
    pub sites: Option<Vec<String>>,
    /// Images, in the allowlist's syntax, on top of the server's allowlist.
    pub images: Option<Vec<String>>,
    pub tools: Option<Vec<String>>,
}

impl Caller {
    /// The one caller of a server without a tokens file, named by how it
    /// is reached (`stdio`, `token`, `unauthenticated`).
    pub fn whole_server(name: &str) -> Caller {
        Caller { name: name.to_string(), limits: Limits::default(), scoped: false }
    }

    /// The name to record on a run for later visibility checks; `None` for
    /// a whole-server caller, whose runs everyone sees.
    pub fn owner(&self) -> Option<&str> {
        self.scoped.then_some(self.name.as_str())
    }

    pub fn may_use_tool(&self, tool: &str) -> bool {
        self.limits.tools.as_ref().is_none_or(|tools| tools.iter().any(|allowed| allowed == tool))
    }

    /// Checks a run's image (already normalised and allowed by the server)
    /// against the caller's own list.
    pub fn check_image(&self, image: &str) -> Result<(), String> {
        let Some(images) = &self.limits.images else { return Ok(()) };
        let allowlist = Allowlist::parse(&images.join(",")).map_err(|(entry, why)| format!("{entry}: {why}"))?;
        allowlist.check(image).map(|_| ()).map_err(|_| {
            format!("image `{image}` is not allowed for caller `{}` (its limit `images`); allowed: {}", self.name, images.join(", "))
        })
    }

    pub fn check_site(&self, site: &str) -> Result<(), String> {
        match &self.limits.sites {
            Some(sites) if !sites.iter().any(|allowed| allowed == site) => {
                Err(format!("site `{site}` is not allowed for caller `{}` (its limit `sites`); allowed: {}", self.name, sites.join(", ")))
            }
            _ => Ok(()),
        }
    }
}

/// The callers of the tokens file.
#[derive(Clone)]
pub struct Callers {
    entries: Vec<([u8; 32], Arc<Caller>)>,
}

impl Callers {
    /// Checks the tokens file `text`, read from `path` (by `config`, which
    /// reads every settings file the same way); `sites` are the names a
    /// caller's `sites` may list.
    pub fn parse(path: &Path, text: &str, sites: &[&str]) -> Result<Callers, Error> {
        parse(path, text, sites)
    }

    /// The caller whose token this is. Every entry is compared, in
    /// constant time, so the answer's timing says nothing about which.
    pub fn identify(&self, token: &str) -> Option<Arc<Caller>> {
        let presented = sha256(token.as_bytes());
        let mut found = None;
        for (digest, caller) in &self.entries {
            if constant_time_eq(digest, &presented) {
                found = Some(caller);
            }
        }
        found.cloned()
    }

    pub fn callers(&self) -> impl Iterator<Item = &Caller> {
        self.entries.iter().map(|(_, caller)| caller.as_ref())
    }
}

/// Names only: the digests stay out of logs and debug output.
impl fmt::Debug for Callers {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_list().entries(self.callers().map(|caller| &caller.name)).finish()
    }
}

/// Compares without an early exit, so timing does not reveal how much of a
/// guess was right (the transport's single token uses it too). Lengths may
/// differ in time; they are not secret enough to matter.
pub fn constant_time_eq(left: &[u8], right: &[u8]) -> bool {
    left.len() == right.len() && std::hint::black_box(left.iter().zip(right).fold(0u8, |acc, (a, b)| acc | (a ^ b))) == 0
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// The tokens file, as its errors name it (`settings_file::Error`, the one error
/// of every settings file).
pub const FILE: FileKind = FileKind { variable: "MCP_K8S_AUTH_TOKENS_FILE", entry: "caller" };

/// Fields a caller may have.
const FIELDS: &[&str] = &["name", "token_sha256", "concurrent_runs", "cpu_seconds_per_hour", "sites", "images", "tools"];

fn parse(path: &Path, text: &str, sites: &[&str]) -> Result<Callers, Error> {
    let syntax = |message: String| Error::Syntax { kind: &FILE, path: path.display().to_string(), message };
    let parsed = crate::json::parse_settings(text).map_err(|error| syntax(error.to_string()))?;
    let Value::Array(items) = parsed else {
        return Err(syntax(
            "must be a JSON list of callers, such as [{\"name\": \"team-a\", \"token_sha256\": \"<64 hex digits>\"}]".to_string(),
        ));
    };
    if items.is_empty() {
        return Err(syntax("lists no caller, so nobody could call; add one".to_string()));
    }
    let mut entries: Vec<([u8; 32], Arc<Caller>)> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let (digest, caller) = parse_caller(path, index, item, sites)?;
        let conflict = |field: &str, message: &str| Error::Field {
            kind: &FILE,
            path: path.display().to_string(),
            entry: caller.name.clone(),
            field: field.to_string(),
            message: message.to_string(),
        };
        if entries.iter().any(|(_, other)| other.name == caller.name) {
            return Err(conflict("name", "is used by an earlier caller; give each caller its own name"));
        }
        if entries.iter().any(|(other, _)| *other == digest) {
            return Err(conflict("token_sha256", "is an earlier caller's token; give each caller its own token"));
        }
        entries.push((digest, Arc::new(caller)));
    }
    Ok(Callers { entries })
}

fn parse_caller(path: &Path, index: usize, item: &Value, sites: &[&str]) -> Result<([u8; 32], Caller), Error> {
    let field_error = |caller: &str, field: &str, message: String| Error::Field {
        kind: &FILE,
        path: path.display().to_string(),
        entry: caller.to_string(),
        field: field.to_string(),
        message,
    };
    let unnamed = format!("#{index}");
    let Value::Object(fields) = item else {
        return Err(field_error(&unnamed, "(caller)", format!("must be an object of fields, not {}", json_kind(item))));
    };
    let name = match fields.get("name") {
        None => return Err(field_error(&unnamed, "name", "is required".to_string())),
        Some(value) => name_field(value).map_err(|message| field_error(&unnamed, "name", message))?,
    };
    let error = |field: &str, message: String| field_error(&name, field, message);
    if let Some(unknown) = fields.keys().find(|field| !FIELDS.contains(&field.as_str())) {
        return Err(error(&crate::echo::shorten(unknown), format!("unknown field; accepted: {}", FIELDS.join(", "))));
    }
    let digest = match fields.get("token_sha256") {
        None => return Err(error("token_sha256", "is required: the SHA-256 of the caller's token, in hex".to_string())),
        Some(value) => digest_field(value).map_err(|message| error("token_sha256", message))?,
    };
    let limits = Limits {
        concurrent_runs: optional(fields, "concurrent_runs", |value| whole_number(value, 1, 10_000).map(|n| n as u32))
            .map_err(|message| error("concurrent_runs", message))?,
        cpu_seconds_per_hour: optional(fields, "cpu_seconds_per_hour", |value| whole_number(value, 1, 100_000_000))
            .map_err(|message| error("cpu_seconds_per_hour", message))?,
        sites: optional(fields, "sites", |value| names_list(value, Some(sites))).map_err(|message| error("sites", message))?,
        images: optional(fields, "images", images_list).map_err(|message| error("images", message))?,
        tools: optional(fields, "tools", |value| names_list(value, None)).map_err(|message| error("tools", message))?,
    };
    Ok((digest, Caller { name, limits, scoped: true }))
}

fn optional<T>(fields: &Map<String, Value>, field: &str, parse: impl Fn(&Value) -> Result<T, String>) -> Result<Option<T>, String> {
    fields.get(field).map(parse).transpose()
}

/// A label value: the name is recorded on the caller's runs.
fn name_field(value: &Value) -> Result<String, String> {
    let Value::String(name) = value else { return Err(format!("must be a string, not {}", json_kind(value))) };
    let valid_chars = name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let valid_ends = name.starts_with(|c: char| c.is_ascii_alphanumeric()) && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if name.is_empty() || name.len() > MAX_NAME_CHARS || !valid_chars || !valid_ends {
        return Err(format!(
            "`{}` must be 1 to {MAX_NAME_CHARS} letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            crate::echo::shorten(name)
        ));
    }
    Ok(name.clone())
}

/// The command that gives a token's digest as this file wants it: 64
/// hex digits alone (`sha256sum` alone adds `  -`).
const DIGEST_COMMAND: &str = "printf %s \"$TOKEN\" | sha256sum | cut -d' ' -f1";

/// The SHA-256 of no bytes: what `DIGEST_COMMAND` gives when `TOKEN` is
/// unset. Taken, it would let in whoever sends an empty token.
const EMPTY_DIGEST: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn digest_field(value: &Value) -> Result<[u8; 32], String> {
    let how = || format!("must be 64 hex digits: the SHA-256 of the token (`{DIGEST_COMMAND}`)");
    let Value::String(text) = value else { return Err(how()) };
    let text = text.trim();
    if text.len() != 64 || !text.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return Err(how());
    }
    if text.eq_ignore_ascii_case(EMPTY_DIGEST) {
        return Err(format!(
            "is the SHA-256 of an empty token (TOKEN was unset when it was made?); set TOKEN and run `{DIGEST_COMMAND}` again"
        ));
    }
    let mut digest = [0u8; 32];
    for (index, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[index * 2..index * 2 + 2], 16).map_err(|_| how())?;
    }
    Ok(digest)
}

fn whole_number(value: &Value, min: u64, max: u64) -> Result<u64, String> {
    match value.as_u64() {
        Some(number) if (min..=max).contains(&number) => Ok(number),
        _ => Err(format!("must be a whole number from {min} to {max}")),
    }
}

fn strings(value: &Value) -> Result<Vec<String>, String> {
    let Value::Array(items) = value else { return Err(format!("must be a list of strings, not {}", json_kind(value))) };
    items
        .iter()
        .map(|item| match item {
            Value::String(text) if !text.trim().is_empty() => Ok(text.trim().to_string()),
            other => Err(format!("must be a list of non-empty strings; found {}", json_kind(other))),
        })
        .collect()
}

/// Names, each one of `known` when given.
fn names_list(value: &Value, known: Option<&[&str]>) -> Result<Vec<String>, String> {
    let names = strings(value)?;
    if let Some(known) = known
        && let Some(unknown) = names.iter().find(|name| !known.contains(&name.as_str()))
    {
        return Err(format!("`{}` is not known here; known: {}", crate::echo::shorten(unknown), known.join(", ")));
    }
    Ok(names)
}

/// Images in the allowlist's syntax (`repo:tag`, `repo:*`, `registry/*`).
fn images_list(value: &Value) -> Result<Vec<String>, String> {
    let images = strings(value)?;
    Allowlist::parse(&images.join(",")).map_err(|(entry, why)| format!("`{}`: {why}", crate::echo::shorten(&entry)))?;
    Ok(images)
}

// ---------------------------------------------------------------------------
// The ledger: the counted limits.

/// Why a run is refused by its caller's limits.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    ConcurrentRuns { limit: u32 },
    CpuSeconds { limit: u64, used: f64, frees_in: Option<Duration> },
}

impl Refusal {
    /// The limit's name, as the tokens file writes it.
    pub fn limit(&self) -> &'static str {
        match self {
            Refusal::ConcurrentRuns { .. } => "concurrent_runs",
            Refusal::CpuSeconds { .. } => "cpu_seconds_per_hour",
        }
    }

    /// The message for the caller, naming the limit and when it frees up.
    pub fn message(&self, caller: &str) -> String {
        match self {
            Refusal::ConcurrentRuns { limit } => format!(
                "caller `{caller}` has {limit} runs in flight, its limit `concurrent_runs`; this frees up when one of them \
                 ends: wait for one (fetch_job, list_jobs) or cancel one, then call again"
            ),
            Refusal::CpuSeconds { limit, used, frees_in } => {
                let when = match frees_in {
                    Some(wait) => format!("it frees up in {} s, as older runs leave the hour", wait.as_secs().max(1)),
                    None => "it frees up as the runs in flight end and leave the hour".to_string(),
                };
                format!(
                    "caller `{caller}` used {used:.0} of its {limit} CPU-seconds in the last hour (its limit \
                     `cpu_seconds_per_hour`); {when}; call again then, or ask for less CPU"
                )
            }
        }
    }
}

/// One caller's use, as the ledger keeps it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    /// Runs admitted and not yet ended, with their CPU and start.
    pub running: Vec<(u64, f64, Instant)>,
    /// CPU-seconds charged when runs ended, oldest first.
    pub charged: VecDeque<(Instant, f64)>,
}

impl Usage {
    /// CPU-seconds of the hour before `now`: what ended in it, and what
    /// the runs in flight have used so far.
    pub fn used(&self, now: Instant) -> f64 {
        let ended: f64 = self.charged.iter().filter(|(at, _)| now.duration_since(*at) < HOUR).map(|(_, cost)| cost).sum();
        let running: f64 = self.running.iter().map(|(_, cores, started)| cores * now.duration_since(*started).as_secs_f64()).sum();
        ended + running
    }

    fn forget_old(&mut self, now: Instant) {
        while self.charged.front().is_some_and(|(at, _)| now.duration_since(*at) >= HOUR) {
            self.charged.pop_front();
        }
    }
}

/// Whether a caller with `limits` and `usage` may start a run at `now`.
pub fn judge(limits: &Limits, usage: &Usage, now: Instant) -> Result<(), Refusal> {
    if let Some(limit) = limits.concurrent_runs
        && usage.running.len() >= limit as usize
    {
        return Err(Refusal::ConcurrentRuns { limit });
    }
    if let Some(limit) = limits.cpu_seconds_per_hour {
        let used = usage.used(now);
        if used >= limit as f64 {
            return Err(Refusal::CpuSeconds { limit, used, frees_in: frees_in(usage, limit as f64, now) });
        }
    }
    Ok(())
}

/// How long until the charges that leave the hour bring use under `limit`;
/// `None` when the runs in flight alone use it up.
fn frees_in(usage: &Usage, limit: f64, now: Instant) -> Option<Duration> {
    let mut used = usage.used(now);
    for (at, cost) in usage.charged.iter().filter(|(at, _)| now.duration_since(*at) < HOUR) {
        used -= cost;
        if used < limit {
            return Some((*at + HOUR).saturating_duration_since(now));
        }
    }
    None
}

/// The counted limits of every caller, in this process.
#[derive(Debug, Default)]
pub struct Ledger {
    state: Mutex<(u64, HashMap<String, Usage>)>,
}

impl Ledger {
    /// Admits a run of `caller` costing `cores` CPUs while it runs, or
    /// says which limit refuses it. The ticket counts the run until it is
    /// ended (`Ticket::end`) or dropped.
    pub fn admit(self: &Arc<Self>, caller: &Caller, cores: f64) -> Result<Ticket, Refusal> {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (next, usage) = &mut *state;
        let usage_of = usage.entry(caller.name.clone()).or_default();
        usage_of.forget_old(now);
        judge(&caller.limits, usage_of, now)?;
        *next += 1;
        usage_of.running.push((*next, cores, now));
        Ok(Ticket { ledger: Arc::clone(self), caller: caller.name.clone(), number: *next, cores, ended: false })
    }

    /// Whether a run of `caller` would be refused now, without admitting
    /// one: a call that must look something up first is refused before.
    pub fn check(&self, caller: &Caller) -> Result<(), Refusal> {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(usage) = state.1.get_mut(&caller.name) else { return Ok(()) };
        usage.forget_old(now);
        judge(&caller.limits, usage, now)
    }

    /// A caller's use now, for `describe_environment`: runs in flight and
    /// CPU-seconds of the last hour.
    pub fn usage(&self, caller: &str) -> (usize, f64) {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.1.get(caller).map_or((0, 0.0), |usage| (usage.running.len(), usage.used(Instant::now())))
    }

    fn close(&self, caller: &str, number: u64, cost: Option<f64>) {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(usage) = state.1.get_mut(caller) else { return };
        let Some(position) = usage.running.iter().position(|(held, _, _)| *held == number) else { return };
        let (_, cores, started) = usage.running.remove(position);
        // A run that ended without saying how long it ran is charged its
        // time since admission.
        let cost = cost.unwrap_or_else(|| cores * now.duration_since(started).as_secs_f64());
        if cost > 0.0 {
            usage.charged.push_back((now, cost));
        }
    }
}

/// An admitted run, counted until it ends.
#[derive(Debug)]
pub struct Ticket {
    ledger: Arc<Ledger>,
    caller: String,
    number: u64,
    cores: f64,
    ended: bool,
}

impl Ticket {
    /// The run ended after its command ran for `ran`: it is charged that
    /// times its CPU; returns the charge.
    pub fn end(mut self, ran: Duration) -> f64 {
        self.ended = true;
        let cost = self.cores * ran.as_secs_f64();
        self.ledger.close(&self.caller, self.number, Some(cost));
        cost
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.ended {
            self.ledger.close(&self.caller, self.number, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<Callers, Error> {
        parse(Path::new("F"), text, &["default"])
    }

    fn field_error(caller: &str, field: &str, message: &str) -> Error {
        Error::Field { kind: &FILE, path: "F".into(), entry: caller.into(), field: field.into(), message: message.into() }
    }

    fn hex_of(token: &str) -> String {
        sha256(token.as_bytes()).iter().map(|byte| format!("{byte:02x}")).collect()
    }

    #[test]
    fn a_file_of_callers_is_read_and_tokens_identify_them() {
        let text = format!(
            r#"[{{"name": "team-a", "token_sha256": "{}", "concurrent_runs": 2, "cpu_seconds_per_hour": 600,
                  "sites": ["default"], "images": ["busybox:*"], "tools": ["run_job"]}},
                {{"name": "team.b", "token_sha256": "{}"}}]"#,
            hex_of("alpha"),
            hex_of("beta").to_uppercase()
        );
        let callers = check(&text).unwrap();
        let a = callers.identify("alpha").unwrap();
        assert_eq!(a.name, "team-a");
        assert_eq!(a.limits.concurrent_runs, Some(2));
        assert_eq!(a.limits.cpu_seconds_per_hour, Some(600));
        assert_eq!(a.limits.tools.as_deref(), Some(&["run_job".to_string()][..]));
        assert!(a.scoped);
        let b = callers.identify("beta").unwrap();
        assert_eq!((b.name.as_str(), &b.limits), ("team.b", &Limits::default()), "hex digits in either case");
        assert!(callers.identify("gamma").is_none());
        assert!(callers.identify("").is_none());
    }

    #[test]
    fn each_wrong_file_names_the_caller_and_the_field() {
        let digest = hex_of("t");
        let cases: Vec<(String, Error)> = vec![
            (
                "{}".into(),
                Error::Syntax {
                    kind: &FILE,
                    path: "F".into(),
                    message: "must be a JSON list of callers, such as [{\"name\": \"team-a\", \"token_sha256\": \"<64 hex digits>\"}]"
                        .into(),
                },
            ),
            (
                "[]".into(),
                Error::Syntax { kind: &FILE, path: "F".into(), message: "lists no caller, so nobody could call; add one".into() },
            ),
            ("[1]".into(), field_error("#0", "(caller)", "must be an object of fields, not an integer")),
            (format!(r#"[{{"token_sha256": "{digest}"}}]"#), field_error("#0", "name", "is required")),
            (
                format!(r#"[{{"name": "-a", "token_sha256": "{digest}"}}]"#),
                field_error(
                    "#0",
                    "name",
                    "`-a` must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
                ),
            ),
            (r#"[{"name": "a"}]"#.into(), field_error("a", "token_sha256", "is required: the SHA-256 of the caller's token, in hex")),
            (
                r#"[{"name": "a", "token_sha256": "abc"}]"#.into(),
                field_error(
                    "a",
                    "token_sha256",
                    "must be 64 hex digits: the SHA-256 of the token (`printf %s \"$TOKEN\" | sha256sum | cut -d' ' -f1`)",
                ),
            ),
            // What `sha256sum` alone prints: the hint's `cut` takes the digest.
            (
                format!(r#"[{{"name": "a", "token_sha256": "{digest}  -"}}]"#),
                field_error(
                    "a",
                    "token_sha256",
                    "must be 64 hex digits: the SHA-256 of the token (`printf %s \"$TOKEN\" | sha256sum | cut -d' ' -f1`)",
                ),
            ),
            // Regression: the digest of an unset TOKEN was taken, and let
            // in an empty `X-MCP-AUTH:`.
            (
                r#"[{"name": "a", "token_sha256": "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855"}]"#.into(),
                field_error(
                    "a",
                    "token_sha256",
                    "is the SHA-256 of an empty token (TOKEN was unset when it was made?); set TOKEN and run `printf %s \"$TOKEN\" | sha256sum | cut -d' ' -f1` again",
                ),
            ),
            // Regression: serde_json kept the last of two copies silently.
            (
                format!("[{{\"name\": \"a\", \"token_sha256\": \"{digest}\", \"token_sha256\": \"{}\"}}]", hex_of("u")),
                Error::Syntax {
                    kind: &FILE,
                    path: "F".into(),
                    message: "key `token_sha256` appears twice in one object (the second at line 1 column 113); keep one".into(),
                },
            ),
            (
                format!(r#"[{{"name": "a", "token_sha256": "{digest}", "token": "x"}}]"#),
                field_error(
                    "a",
                    "token",
                    "unknown field; accepted: name, token_sha256, concurrent_runs, cpu_seconds_per_hour, sites, images, tools",
                ),
            ),
            (
                format!(r#"[{{"name": "a", "token_sha256": "{digest}", "concurrent_runs": 0}}]"#),
                field_error("a", "concurrent_runs", "must be a whole number from 1 to 10000"),
            ),
            (
                format!(r#"[{{"name": "a", "token_sha256": "{digest}", "sites": ["eu"]}}]"#),
                field_error("a", "sites", "`eu` is not known here; known: default"),
            ),
            (
                format!(r#"[{{"name": "a", "token_sha256": "{digest}", "images": ["UPPER:1"]}}]"#),
                field_error("a", "images", &format!("`UPPER:1`: {}", Allowlist::parse("UPPER:1").unwrap_err().1)),
            ),
            (
                format!(r#"[{{"name": "a", "token_sha256": "{digest}"}}, {{"name": "a", "token_sha256": "{}"}}]"#, hex_of("u")),
                field_error("a", "name", "is used by an earlier caller; give each caller its own name"),
            ),
            (
                format!(r#"[{{"name": "a", "token_sha256": "{digest}"}}, {{"name": "b", "token_sha256": "{digest}"}}]"#),
                field_error("b", "token_sha256", "is an earlier caller's token; give each caller its own token"),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(check(&text).map(|_| ()).unwrap_err(), expected, "{text}");
        }
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3creT"));
        assert!(!constant_time_eq(b"s3cret", b"s3cre"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn a_caller_records_its_runs_as_its_own_unless_it_is_the_whole_server() {
        // Who sees a run is the engine's `outputs::visible_to`, given `owner()`.
        let scoped = Caller { name: "a".into(), limits: Limits::default(), scoped: true };
        let whole = Caller::whole_server("token");
        assert_eq!((scoped.owner(), whole.owner()), (Some("a"), None));
    }

    #[test]
    fn images_tools_and_sites_narrow_what_the_server_allows() {
        let limits = Limits {
            images: Some(vec!["busybox:*".into()]),
            tools: Some(vec!["run_job".into()]),
            sites: Some(vec!["default".into()]),
            ..Limits::default()
        };
        let caller = Caller { name: "a".into(), limits, scoped: true };
        assert!(caller.check_image("docker.io/library/busybox:1.36").is_ok());
        let refused = caller.check_image("docker.io/library/python:3.12").unwrap_err();
        assert!(refused.contains("its limit `images`") && refused.contains("busybox:*"), "{refused}");
        assert!(caller.may_use_tool("run_job") && !caller.may_use_tool("submit_job"));
        assert!(caller.check_site("default").is_ok());
        assert!(caller.check_site("eu").unwrap_err().contains("its limit `sites`"));
        let open = Caller::whole_server("stdio");
        assert!(open.check_image("docker.io/library/python:3.12").is_ok() && open.may_use_tool("anything"));
    }

    #[test]
    fn the_ledger_refuses_at_each_limit_and_says_when_it_frees_up() {
        let base = Instant::now();
        let at = |seconds: u64| base + Duration::from_secs(seconds);
        let limits = Limits { concurrent_runs: Some(2), cpu_seconds_per_hour: Some(100), ..Limits::default() };
        let usage = |running: Vec<(u64, f64, Instant)>, charged: Vec<(Instant, f64)>| Usage { running, charged: charged.into() };
        let cases: Vec<(&str, Usage, Instant, Result<(), Refusal>)> = vec![
            ("nothing used", Usage::default(), at(0), Ok(())),
            ("one running", usage(vec![(1, 1.0, at(0))], vec![]), at(10), Ok(())),
            (
                "two running: the concurrent limit",
                usage(vec![(1, 0.1, at(0)), (2, 0.1, at(0))], vec![]),
                at(10),
                Err(Refusal::ConcurrentRuns { limit: 2 }),
            ),
            ("99 CPU-seconds charged", usage(vec![], vec![(at(0), 99.0)]), at(10), Ok(())),
            (
                "100 charged: frees when the first charge leaves the hour",
                usage(vec![], vec![(at(0), 60.0), (at(100), 40.0)]),
                at(200),
                Err(Refusal::CpuSeconds { limit: 100, used: 100.0, frees_in: Some(Duration::from_secs(3400)) }),
            ),
            ("charges older than the hour do not count", usage(vec![], vec![(at(0), 500.0)]), at(3600), Ok(())),
            (
                "a run in flight counts what it used so far",
                usage(vec![(1, 2.0, at(0))], vec![]),
                at(50),
                Err(Refusal::CpuSeconds { limit: 100, used: 100.0, frees_in: None }),
            ),
        ];
        for (name, usage, now, expected) in cases {
            assert_eq!(judge(&limits, &usage, now), expected, "{name}");
        }
    }

    #[test]
    fn a_ticket_counts_the_run_until_it_ends_and_charges_its_cpu() {
        let ledger = Arc::new(Ledger::default());
        let limits = Limits { concurrent_runs: Some(1), cpu_seconds_per_hour: Some(10), ..Limits::default() };
        let caller = Caller { name: "a".into(), limits, scoped: true };
        let other = Caller { name: "b".into(), ..caller.clone() };
        let first = ledger.admit(&caller, 2.0).unwrap();
        assert_eq!(ledger.admit(&caller, 2.0).unwrap_err(), Refusal::ConcurrentRuns { limit: 1 });
        let _others = ledger.admit(&other, 2.0).expect("another caller has its own count");
        first.end(Duration::from_secs(6));
        let (running, used) = ledger.usage("a");
        assert_eq!((running, used), (0, 12.0));
        match ledger.admit(&caller, 1.0) {
            Err(Refusal::CpuSeconds { limit: 10, frees_in: Some(wait), .. }) => assert!(wait > Duration::from_secs(3590)),
            other => panic!("expected the CPU limit, got {other:?}"),
        }
        let dropped = ledger.admit(&other, 1.0);
        assert!(dropped.is_err(), "b still has its run in flight");
        drop(_others);
        assert_eq!(ledger.usage("b").0, 0, "a dropped ticket ends the count");
    }

    #[test]
    fn refusals_name_the_limit_and_when_it_frees_up() {
        let concurrent = Refusal::ConcurrentRuns { limit: 2 }.message("a");
        assert!(concurrent.contains("`concurrent_runs`") && concurrent.contains("when one of them ends"), "{concurrent}");
        let cpu = Refusal::CpuSeconds { limit: 100, used: 120.4, frees_in: Some(Duration::from_secs(61)) }.message("a");
        assert!(cpu.contains("used 120 of its 100") && cpu.contains("`cpu_seconds_per_hour`") && cpu.contains("in 61 s"), "{cpu}");
    }
}
