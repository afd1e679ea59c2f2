//! The places a sandbox runs, each behind the engine's port
//! (`engine::port::Backend`): `kubernetes` (a Job and its pod per run)
//! and `docker` (a container per run on a local Docker Engine).
//! A backend turns the engine's neutral requests into its own API's calls
//! and its own objects back into neutral events; the engine knows none of
//! them, and no backend knows MCP.
//!
//! Beyond a run, a backend's whole life goes through here too: each one's
//! `connect` makes it from the checked `Config` (its own settings, its warm
//! pools), `Connected` is what `main` asks of it (the start-up checks,
//! `doctor`), and the port's `Backend::shutdown` ends it. `main` names a
//! backend in one `match` on the configured one, and nowhere else.

pub mod docker;
pub mod kubernetes;

use std::sync::Arc;
use std::time::Duration;

use crate::config::{BackendChoice, Config};
use crate::engine;
use crate::engine::pools::pool::{PoolRules, PoolShape};
use crate::engine::pools::{PoolSandboxes, Pools};
use crate::engine::port::Backend;

/// Settings a backend reads from files, read and checked before any
/// backend call, so that a bad one stops the start (exit 2) even without
/// credentials or a daemon.
pub struct Prepared {
    /// The operator's pod template (`MCP_K8S_POD_TEMPLATE`), for the
    /// Kubernetes backend.
    pod_template: Option<kubernetes::template::PodTemplate>,
}

impl Prepared {
    pub fn pod_template(&self) -> Option<kubernetes::template::PodTemplate> {
        self.pod_template.clone()
    }
}

/// Reads and checks what every backend this configuration may connect
/// reads from files.
pub fn prepare(config: &Config) -> Result<Prepared, String> {
    let pod_template = kubernetes::template::from_config(config).map_err(|error| error.to_string())?;
    Ok(Prepared { pod_template })
}

/// A backend connected from the settings: the engine's port, plus what
/// `main` asks of a backend before and besides runs.
pub trait Connected: Backend {
    /// Which backend this is, as MCP_K8S_BACKEND names it (never `auto`):
    /// with `auto`, what the tools then tell an agent about its runs.
    fn kind(&self) -> BackendChoice;

    /// The checks `serve` stops on (exit 2) before it answers anything: a
    /// set-up that would fail every run (a missing cache PVC, a network
    /// default this backend cannot run).
    fn check_at_start(&self, config: &Config) -> Result<(), String>;

    /// `doctor`: every check, handed to `report` as soon as it is done;
    /// true when all passed. `ctx` is the engine on this backend, for the
    /// checks that run a tiny job.
    fn doctor(&self, config: &Config, ctx: &engine::run::Ctx, report: &mut dyn FnMut(&Check)) -> bool;
}

/// Why a backend could not be connected from the settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnectError {
    /// It cannot be reached now (no cluster credentials found, no Docker
    /// daemon answering): a site that may come back, which
    /// MCP_K8S_LAZY_BACKEND lets the server wait for.
    Unavailable(String),
    /// A setting is wrong (a dynamically linked runner binary, one of
    /// another architecture): no waiting fixes it, so the start stops
    /// whatever MCP_K8S_LAZY_BACKEND says.
    Misconfigured(String),
}

impl ConnectError {
    pub fn message(&self) -> &str {
        match self {
            ConnectError::Unavailable(message) | ConnectError::Misconfigured(message) => message,
        }
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.message())
    }
}

/// Whether connecting starts the warm pools: serving does, `doctor` not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarmPools {
    On,
    Off,
}

/// The warm pools' threads on `sandboxes` (the backend without pools),
/// when `MCP_K8S_WARM_POOLS` names any and `warm` says to. Their
/// sandboxes carry this process's own id, so that replicas keep apart.
fn start_pools<S: PoolSandboxes>(config: &Config, sandboxes: S, warm: WarmPools) -> Result<Option<Arc<Pools<S>>>, String> {
    if warm == WarmPools::Off || config.warm_pools.is_empty() {
        return Ok(None);
    }
    let max_timeout = Duration::from_secs(config.max_timeout_s);
    let pools = Arc::new(Pools::new(sandboxes, &pool_shapes(config), max_timeout));
    let owner = engine::run::new_run_id()[..12].to_string();
    pools.start(&owner).map_err(|error| format!("could not start the warm pools: {error}"))?;
    Ok(Some(pools))
}

/// The operator's pools as the engine's pool manager sees them: each
/// one's shape (what a run must ask for to take one) and rules.
fn pool_shapes(config: &Config) -> Vec<(PoolShape, PoolRules)> {
    let start_timeout = Duration::from_secs(config.start_timeout_s);
    config
        .warm_pools
        .iter()
        .map(|pool| {
            let shape = PoolShape {
                name: pool.name.clone(),
                image: pool.image.clone(),
                cpu: pool.cpu.clone(),
                memory: pool.memory.clone(),
                network: pool.network,
                workdir: crate::sandbox::WORKDIR.to_string(),
                preload: pool.language.as_deref().and_then(|language| preload(config, language)),
            };
            (shape, PoolRules { size: pool.size as usize, max_idle: pool.max_idle, start_timeout })
        })
        .collect()
}

/// What a language pool's sandboxes start ahead: the profile's
/// interpreter, with the environment its `execute_code` calls get.
fn preload(config: &Config, language: &str) -> Option<crate::sandbox::args::Preload> {
    let profile = config.languages.get(language)?;
    let (prefix, argv) = profile.prestart()?;
    Some(crate::sandbox::args::Preload { argv, prefix, env: engine::port::spec::env_over(&config.job_extra_env, &profile.env) })
}

/// The result of one `doctor` check, on either backend: a line for the
/// operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub passed: bool,
    /// Passed, but the operator should act: jobs run, yet a promise of the
    /// security model does not hold (e.g. NetworkPolicy is not enforced).
    pub warning: bool,
    /// What was checked and what was found; with a `cause`, only what was
    /// checked.
    pub text: String,
    /// A failure's cause when it is not the check's own but one many
    /// checks share (the API server refuses connections, the credentials
    /// are refused), with its fix: `group` says it once for all of them.
    pub cause: Option<String>,
}

impl Check {
    pub(crate) fn pass(text: impl Into<String>) -> Check {
        Check { passed: true, warning: false, text: text.into(), cause: None }
    }

    pub(crate) fn fail(text: impl Into<String>) -> Check {
        Check { passed: false, warning: false, text: text.into(), cause: None }
    }

    pub(crate) fn warn(text: impl Into<String>) -> Check {
        Check { passed: true, warning: true, text: text.into(), cause: None }
    }

    /// `text` failed because of `cause`, which other checks may share.
    pub(crate) fn fail_because(text: impl Into<String>, cause: impl Into<String>) -> Check {
        Check { passed: false, warning: false, text: text.into(), cause: Some(cause.into()) }
    }

    /// `ok    ...`, `WARN  ...` or `FAIL  ...`, as doctor prints it.
    pub fn line(&self) -> String {
        let verdict = match (self.passed, self.warning) {
            (false, _) => "FAIL",
            (true, true) => "WARN",
            (true, false) => "ok  ",
        };
        match &self.cause {
            Some(cause) => format!("{verdict}  {}: {cause}", self.text),
            None => format!("{verdict}  {}", self.text),
        }
    }
}

/// The images `execute_code`'s languages run in (those MCP_K8S_ALLOWED_IMAGES
/// or the languages file allow), each with the languages that use it, for
/// `doctor` to check that they can be pulled and started.
pub(crate) fn language_images(config: &Config) -> Vec<(String, Vec<String>)> {
    let mut images: Vec<(String, Vec<String>)> = Vec::new();
    for profile in config.languages.profiles.values() {
        match images.iter_mut().find(|(image, _)| *image == profile.image) {
            Some((_, names)) => names.push(profile.name.clone()),
            None => images.push((profile.image.clone(), vec![profile.name.clone()])),
        }
    }
    images
}

/// Says which `execute_code` languages are left out because their image is
/// not allowed: the operator's choice, so a note, never a failure.
pub(crate) fn languages_left_out(config: &Config) -> Option<Check> {
    if config.languages.not_allowed.is_empty() {
        return None;
    }
    let left_out: Vec<String> = config.languages.not_allowed.iter().map(|(name, image)| format!("{name} (`{image}`)")).collect();
    Some(Check::pass(format!(
        "execute_code languages left out, their image not in MCP_K8S_ALLOWED_IMAGES nor named by MCP_K8S_LANGUAGES: {}",
        left_out.join(", ")
    )))
}

/// `checks` as doctor prints them: failures that share a cause become one
/// line, where the first of them was, naming the cause and its fix once
/// and what failed on it. Against an API server that refuses connections,
/// an earlier doctor printed the same refusal on thirteen lines, and the
/// last one (a permission check) read as if RBAC were to blame.
pub fn group(checks: Vec<Check>) -> Vec<Check> {
    let mut grouped: Vec<(Check, Vec<String>)> = Vec::new();
    for check in checks {
        let shared = check.cause.as_ref().and_then(|cause| grouped.iter().position(|(first, _)| first.cause.as_ref() == Some(cause)));
        match shared {
            Some(index) => grouped[index].1.push(check.text),
            None => {
                let texts = vec![check.text.clone()];
                grouped.push((check, texts));
            }
        }
    }
    grouped
        .into_iter()
        .map(|(check, texts)| match (&check.cause, texts.len()) {
            (Some(cause), n) if n > 1 => Check::fail(format!("{cause} ({n} checks failed on it: {})", texts.join("; "))),
            _ => check,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_that_share_a_cause_are_one_line() {
        let refused = "Kubernetes API at https://k:6443 cannot be reached: connection refused; check its `server`";
        let denied = "the Kubernetes API refused the credentials (401); renew them";
        let lines = |checks: Vec<Check>| group(checks).iter().map(Check::line).collect::<Vec<_>>();
        let cases: Vec<(&str, Vec<Check>, Vec<String>)> = vec![
            ("nothing to group", vec![Check::pass("a"), Check::fail("b")], vec!["ok    a".into(), "FAIL  b".into()]),
            (
                "one failure with a cause names it",
                vec![Check::fail_because("Kubernetes API", refused)],
                vec![format!("FAIL  Kubernetes API: {refused}")],
            ),
            (
                "repeats fold into the first, passes and own failures stay in order",
                vec![
                    Check::fail_because("Kubernetes API", refused),
                    Check::pass("MCP_K8S_ALLOWED_IMAGES allows busybox"),
                    Check::fail_because("namespace `ci`", refused),
                    Check::fail("pids limit: none found"),
                    Check::fail_because("permission on `jobs.batch`", refused),
                ],
                vec![
                    format!("FAIL  {refused} (3 checks failed on it: Kubernetes API; namespace `ci`; permission on `jobs.batch`)"),
                    "ok    MCP_K8S_ALLOWED_IMAGES allows busybox".into(),
                    "FAIL  pids limit: none found".into(),
                ],
            ),
            (
                "two causes are two lines",
                vec![
                    Check::fail_because("a", refused),
                    Check::fail_because("b", denied),
                    Check::fail_because("c", refused),
                    Check::fail_because("d", denied),
                ],
                vec![format!("FAIL  {refused} (2 checks failed on it: a; c)"), format!("FAIL  {denied} (2 checks failed on it: b; d)")],
            ),
            (
                "the same words without a cause are not grouped",
                vec![Check::fail("x"), Check::fail("x")],
                vec!["FAIL  x".into(), "FAIL  x".into()],
            ),
        ];
        for (case, checks, expected) in cases {
            assert_eq!(lines(checks), expected, "{case}");
        }
    }
}
