//! The runner's command lines: what the engine writes into the pod spec
//! (`*_args`: options → argv) and what the runner reads back (`parse_*`:
//! argv → options), side by side so that each pair stays the inverse of the
//! other. Covers `runner init`, `runner await-ready`, `runner exec`, `runner clone`, `runner
//! credential` (written by the runner itself into git's config),
//! `runner await-assignment` (a warm pool's sandbox) and `runner probe-pids`. The argv given to `parse_*` starts after the
//! subcommand. Knows nothing of what the runner does with the options.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::sandbox::held::HoldOptions;
use crate::sandbox::{KILL_GRACE, PROBE_CEILING, TERMINATION_LOG, WORKDIR};

/// Options of `runner exec`, as the engine writes them into the pod spec.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecOptions {
    pub workdir: PathBuf,
    pub timeout: Duration,
    pub kill_grace: Duration,
    pub max_output_bytes: usize,
    pub max_artifact_bytes: u64,
    /// Bytes the runner may send on top, whole, for the server's output
    /// store: streams past `max_output_bytes` and files past the artifact
    /// cap, all together. Zero without a store (nothing extra is sent).
    pub spill_bytes: u64,
    /// Where what is sent whole goes: the log when `None`, else a file
    /// in the sandbox the server fetches from this port (`held`).
    pub hold: Option<HoldOptions>,
    pub artifact_patterns: Vec<String>,
    /// Folders the command may write and the limit of each (`disk`); no
    /// watching with a limit of 0.
    pub disk_paths: Vec<PathBuf>,
    pub disk_limit_bytes: u64,
    pub termination_log: PathBuf,
    /// Milliseconds since the Unix epoch after which the command must not
    /// start: the server gives up on a run that has not started by its
    /// start timeout, and a runner that comes up later (an image pull that
    /// ended after the pod was deleted) must not run it anyway.
    pub start_deadline_ms: Option<u64>,
    pub argv: Vec<String>,
}

/// Adds `--start-deadline-ms` to a `runner exec` argument list (before
/// its `--`): set by the backend when it creates the run, since the
/// deadline is a moment, not a property of the run.
pub fn with_start_deadline(exec_args: &mut Vec<String>, deadline_ms: u64) {
    let at = exec_args.iter().position(|arg| arg == "--").unwrap_or(exec_args.len());
    exec_args.splice(at..at, ["--start-deadline-ms".to_string(), deadline_ms.to_string()]);
}

/// Options of `runner clone`, as the engine writes them into the pod spec.
#[derive(Clone, Debug, PartialEq)]
pub struct CloneOptions {
    pub repo_url: String,
    pub git_ref: String,
    pub dest: PathBuf,
    pub creds_dir: PathBuf,
}

/// Options of `runner init`: where to copy the runner and, for a run with
/// input files, where the inputs are mounted and the workdir they go to.
/// With `ready_file`, `runner init` runs beside the main container instead
/// of before it: it says it is done in that file and waits for the
/// `runner await-ready` hook to have seen it (see `runner::init`).
#[derive(Clone, Debug, PartialEq)]
pub struct InitOptions {
    pub copy_to: PathBuf,
    pub inputs: Option<(PathBuf, PathBuf)>,
    pub ready_file: Option<PathBuf>,
    /// Wait up to this long for the pod's network policy to be in force
    /// before anything else (`runner::fence`; MCP_K8S_AWAIT_NETWORK_POLICY).
    pub await_fence: Option<Duration>,
    /// ... and at least until this moment (ms since the Unix epoch): a
    /// background run waits out a late fence up to its start deadline.
    pub await_fence_until_ms: Option<u64>,
    /// `--key-from FILE --key-to FILE`: a warm or open sandbox's key, copied
    /// from its Secret (mounted into `prepare` alone) to where the runner in
    /// the main container takes it and removes it before any command runs
    /// (`sandbox::assignment::KEY_FILE`).
    pub key: Option<(PathBuf, PathBuf)>,
}

/// Options of `runner await-ready`, the postStart hook that holds the main
/// container back until `runner init` has written `ready_file`.
#[derive(Clone, Debug, PartialEq)]
pub struct AwaitOptions {
    pub ready_file: PathBuf,
    pub timeout: Duration,
}

/// Options of `runner await-assignment`, a warm pool sandbox's main
/// command: take one assignment from `listen` (a TCP port in a pod, whose
/// assignment carries the key in `key_file`; stdin in a Docker sandbox,
/// which may have no network and which only a Docker API client can write
/// to, so it has no key), then run it as `runner exec` would. `workdir` is
/// where the sandbox mounted its workdir (an assignment for another is
/// refused); past `max_wait` without one, the runner gives up and exits,
/// so that a sandbox whose server is gone ends on its own.
#[derive(Clone, Debug, PartialEq)]
pub struct AssignOptions {
    pub listen: Endpoint,
    /// With `Endpoint::Port` only (and needed there).
    pub key_file: Option<PathBuf>,
    pub workdir: PathBuf,
    /// How long to wait for the assignment; in a session, for each next call.
    pub max_wait: Duration,
    /// `--session-until-ms`: a session's runner, which takes call after
    /// call (`sandbox::session`) until this Unix time in milliseconds, its
    /// lifetime's end.
    pub session_until_ms: Option<u64>,
    /// `--preload`: a process started before the assignment, which a
    /// fitting assignment's command becomes (`Preload`).
    pub preload: Option<Preload>,
}

/// A warm sandbox's pre-started process: `argv`, started in the workdir
/// with `env` (on top of the runner's own) as soon as the runner waits,
/// reading one line on its stdin. An assignment whose `env` is `env` and
/// whose argv starts with `prefix` and goes on (a file, its arguments)
/// becomes that process: the rest of its argv goes to it as the line, NUL
/// separated and hex-encoded; any other assignment runs as usual and the
/// process is stopped. What `argv` does with the line is its own (an
/// interpreter that has loaded modules ahead, then runs the file).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Preload {
    pub argv: Vec<String>,
    pub prefix: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
}

impl Preload {
    /// The line that starts `rest` (an assignment's argv after `prefix`).
    pub fn line(rest: &[String]) -> String {
        let mut line = crate::sandbox::to_hex(rest.join("\0").as_bytes());
        line.push('\n');
        line
    }

    /// The argv after `prefix`, when an assignment with this `argv` and
    /// `env` fits the pre-started process; `None` when it runs as usual.
    pub fn fits<'a>(&self, argv: &'a [String], env: &std::collections::BTreeMap<String, String>) -> Option<&'a [String]> {
        let rest = argv.strip_prefix(self.prefix.as_slice())?;
        let no_nul = rest.iter().all(|arg| !arg.contains('\0'));
        (*env == self.env && !rest.is_empty() && no_nul).then_some(rest)
    }
}

/// Where `runner await-assignment` takes its assignment: `--port` or `--stdin`.
#[derive(Clone, Debug, PartialEq)]
pub enum Endpoint {
    Port(u16),
    Stdin,
}

/// Options of `runner credential`: the mounted clone Secret and git's
/// action (`get`, `store`, `erase`).
#[derive(Clone, Debug, PartialEq)]
pub struct CredentialOptions {
    pub creds_dir: PathBuf,
    pub action: Option<String>,
}

/// Builds the argument list of `runner exec` for a pod spec; the inverse of
/// `parse_exec`.
pub fn exec_args(options: &ExecOptions) -> Vec<String> {
    let mut args = vec![
        "runner".to_string(),
        "exec".to_string(),
        "--workdir".to_string(),
        options.workdir.to_string_lossy().into_owned(),
        "--timeout-ms".to_string(),
        options.timeout.as_millis().to_string(),
        "--kill-grace-ms".to_string(),
        options.kill_grace.as_millis().to_string(),
        "--max-output-bytes".to_string(),
        options.max_output_bytes.to_string(),
        "--max-artifact-bytes".to_string(),
        options.max_artifact_bytes.to_string(),
        "--termination-log".to_string(),
        options.termination_log.to_string_lossy().into_owned(),
    ];
    for pattern in &options.artifact_patterns {
        args.push("--artifact".to_string());
        args.push(pattern.clone());
    }
    if let Some(deadline_ms) = options.start_deadline_ms {
        args.push("--start-deadline-ms".to_string());
        args.push(deadline_ms.to_string());
    }
    if options.spill_bytes > 0 {
        args.push("--spill-bytes".to_string());
        args.push(options.spill_bytes.to_string());
    }
    if let Some(hold) = &options.hold {
        args.extend(["--hold-port".to_string(), hold.port.to_string(), "--hold-key-sha256".to_string(), hold.key_sha256.clone()]);
    }
    if options.disk_limit_bytes > 0 {
        args.push("--disk-limit-bytes".to_string());
        args.push(options.disk_limit_bytes.to_string());
        for path in &options.disk_paths {
            args.push("--disk-path".to_string());
            args.push(path.to_string_lossy().into_owned());
        }
    }
    args.push("--".to_string());
    args.extend(options.argv.iter().cloned());
    args
}

pub fn parse_exec(args: Vec<OsString>) -> Result<ExecOptions, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let mut options = ExecOptions {
        workdir: PathBuf::from(WORKDIR),
        timeout: Duration::from_secs(60),
        kill_grace: KILL_GRACE,
        max_output_bytes: 1 << 20,
        max_artifact_bytes: 10 << 20,
        spill_bytes: 0,
        hold: None,
        artifact_patterns: Vec::new(),
        disk_paths: Vec::new(),
        disk_limit_bytes: 0,
        termination_log: PathBuf::from(TERMINATION_LOG),
        start_deadline_ms: None,
        argv: Vec::new(),
    };
    let (mut hold_port, mut hold_key) = (None, None);
    while let Some(arg) = parser.next().map_err(|error| error.to_string())? {
        match arg {
            Long("workdir") => options.workdir = PathBuf::from(value(&mut parser)?),
            Long("timeout-ms") => options.timeout = Duration::from_millis(number(&mut parser, "--timeout-ms")?),
            Long("kill-grace-ms") => options.kill_grace = Duration::from_millis(number(&mut parser, "--kill-grace-ms")?),
            Long("max-output-bytes") => options.max_output_bytes = number(&mut parser, "--max-output-bytes")? as usize,
            Long("max-artifact-bytes") => options.max_artifact_bytes = number(&mut parser, "--max-artifact-bytes")?,
            Long("spill-bytes") => options.spill_bytes = number(&mut parser, "--spill-bytes")?,
            Long("hold-port") => {
                hold_port = Some(u16::try_from(number(&mut parser, "--hold-port")?).map_err(|_| "--hold-port is a port number")?)
            }
            Long("hold-key-sha256") => hold_key = Some(value(&mut parser)?),
            Long("artifact") => options.artifact_patterns.push(value(&mut parser)?),
            Long("disk-path") => options.disk_paths.push(PathBuf::from(value(&mut parser)?)),
            Long("disk-limit-bytes") => options.disk_limit_bytes = number(&mut parser, "--disk-limit-bytes")?,
            Long("termination-log") => options.termination_log = PathBuf::from(value(&mut parser)?),
            Long("start-deadline-ms") => options.start_deadline_ms = Some(number(&mut parser, "--start-deadline-ms")?),
            Value(first) => {
                options.argv.push(first.to_string_lossy().into_owned());
                for raw in parser.raw_args().map_err(|error| error.to_string())? {
                    options.argv.push(raw.to_string_lossy().into_owned());
                }
            }
            other => return Err(other.unexpected().to_string()),
        }
    }
    if options.argv.is_empty() {
        return Err("runner exec needs a command after `--`".into());
    }
    options.hold = match (hold_port, hold_key) {
        (Some(port), Some(key_sha256)) => Some(HoldOptions { port, key_sha256 }),
        (None, None) => None,
        _ => return Err("--hold-port and --hold-key-sha256 go together".into()),
    };
    Ok(options)
}

/// Builds the argument list of `runner clone` for a pod spec; the inverse
/// of `parse_clone`.
pub fn clone_args(options: &CloneOptions) -> Vec<String> {
    vec![
        "runner".to_string(),
        "clone".to_string(),
        "--repo-url".to_string(),
        options.repo_url.clone(),
        "--ref".to_string(),
        options.git_ref.clone(),
        "--dest".to_string(),
        options.dest.to_string_lossy().into_owned(),
        "--creds-dir".to_string(),
        options.creds_dir.to_string_lossy().into_owned(),
    ]
}

pub fn parse_clone(args: Vec<OsString>) -> Result<CloneOptions, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let (mut repo_url, mut git_ref, mut dest, mut creds_dir) = (None, None, None, None);
    while let Some(arg) = parser.next().map_err(|error| error.to_string())? {
        match arg {
            Long("repo-url") => repo_url = Some(value(&mut parser)?),
            Long("ref") => git_ref = Some(value(&mut parser)?),
            Long("dest") => dest = Some(PathBuf::from(value(&mut parser)?)),
            Long("creds-dir") => creds_dir = Some(PathBuf::from(value(&mut parser)?)),
            other => return Err(other.unexpected().to_string()),
        }
    }
    Ok(CloneOptions {
        repo_url: repo_url.ok_or("runner clone needs --repo-url")?,
        git_ref: git_ref.ok_or("runner clone needs --ref")?,
        dest: dest.ok_or("runner clone needs --dest")?,
        creds_dir: creds_dir.ok_or("runner clone needs --creds-dir")?,
    })
}

/// Builds the argument list of `runner init` for a pod spec; the inverse
/// of `parse_init`.
pub fn init_args(options: &InitOptions) -> Vec<String> {
    let mut args = vec!["runner".to_string(), "init".to_string(), "--copy-to".to_string(), options.copy_to.to_string_lossy().into_owned()];
    if let Some((inputs, workdir)) = &options.inputs {
        args.extend([
            "--inputs".to_string(),
            inputs.to_string_lossy().into_owned(),
            "--workdir".to_string(),
            workdir.to_string_lossy().into_owned(),
        ]);
    }
    if let Some(ready_file) = &options.ready_file {
        args.extend(["--ready-file".to_string(), ready_file.to_string_lossy().into_owned()]);
    }
    if let Some(bound) = options.await_fence {
        args.extend(["--await-fence-ms".to_string(), bound.as_millis().to_string()]);
    }
    if let Some(until_ms) = options.await_fence_until_ms {
        args.extend(["--await-fence-until-ms".to_string(), until_ms.to_string()]);
    }
    if let Some((from, to)) = &options.key {
        args.extend([
            "--key-from".to_string(),
            from.to_string_lossy().into_owned(),
            "--key-to".to_string(),
            to.to_string_lossy().into_owned(),
        ]);
    }
    args
}

/// Makes the fence wait of `runner init` arguments last at least until
/// `until_ms` (ms since the Unix epoch); arguments without a fence wait
/// are left as they are.
pub fn with_fence_until(init_args: &mut Vec<String>, until_ms: u64) {
    if init_args.iter().any(|arg| arg == "--await-fence-ms") {
        init_args.extend(["--await-fence-until-ms".to_string(), until_ms.to_string()]);
    }
}

pub fn parse_init(args: Vec<OsString>) -> Result<InitOptions, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let (mut copy_to, mut inputs, mut workdir, mut ready_file, mut await_fence, mut await_fence_until_ms) =
        (None, None, None, None, None, None);
    let (mut key_from, mut key_to) = (None, None);
    while let Some(arg) = parser.next().map_err(|error| error.to_string())? {
        match arg {
            Long("copy-to") => copy_to = Some(PathBuf::from(value(&mut parser)?)),
            Long("inputs") => inputs = Some(PathBuf::from(value(&mut parser)?)),
            Long("workdir") => workdir = Some(PathBuf::from(value(&mut parser)?)),
            Long("ready-file") => ready_file = Some(PathBuf::from(value(&mut parser)?)),
            Long("await-fence-ms") => await_fence = Some(Duration::from_millis(number(&mut parser, "--await-fence-ms")?)),
            Long("await-fence-until-ms") => await_fence_until_ms = Some(number(&mut parser, "--await-fence-until-ms")?),
            Long("key-from") => key_from = Some(PathBuf::from(value(&mut parser)?)),
            Long("key-to") => key_to = Some(PathBuf::from(value(&mut parser)?)),
            other => return Err(other.unexpected().to_string()),
        }
    }
    let copy_to = copy_to.ok_or("runner init needs --copy-to")?;
    let inputs = match (inputs, workdir) {
        (Some(inputs), Some(workdir)) => Some((inputs, workdir)),
        (None, None) => None,
        _ => return Err("runner init needs --inputs and --workdir together".into()),
    };
    if await_fence_until_ms.is_some() && await_fence.is_none() {
        return Err("runner init needs --await-fence-ms with --await-fence-until-ms".into());
    }
    let key = match (key_from, key_to) {
        (Some(from), Some(to)) => Some((from, to)),
        (None, None) => None,
        _ => return Err("runner init needs --key-from and --key-to together".into()),
    };
    Ok(InitOptions { copy_to, inputs, ready_file, await_fence, await_fence_until_ms, key })
}

/// Builds the argument list of `runner await-ready` for a pod spec; the
/// inverse of `parse_await`.
pub fn await_args(options: &AwaitOptions) -> Vec<String> {
    vec![
        "runner".to_string(),
        "await-ready".to_string(),
        "--ready-file".to_string(),
        options.ready_file.to_string_lossy().into_owned(),
        "--timeout-ms".to_string(),
        options.timeout.as_millis().to_string(),
    ]
}

pub fn parse_await(args: Vec<OsString>) -> Result<AwaitOptions, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let (mut ready_file, mut timeout) = (None, None);
    while let Some(arg) = parser.next().map_err(|error| error.to_string())? {
        match arg {
            Long("ready-file") => ready_file = Some(PathBuf::from(value(&mut parser)?)),
            Long("timeout-ms") => timeout = Some(Duration::from_millis(number(&mut parser, "--timeout-ms")?)),
            other => return Err(other.unexpected().to_string()),
        }
    }
    Ok(AwaitOptions {
        ready_file: ready_file.ok_or("runner await-ready needs --ready-file")?,
        timeout: timeout.ok_or("runner await-ready needs --timeout-ms")?,
    })
}

/// Builds the argument list of `runner await-assignment` for a pod spec;
/// the inverse of `parse_assign`.
pub fn assign_args(options: &AssignOptions) -> Vec<String> {
    let mut args = vec!["runner".to_string(), "await-assignment".to_string()];
    match &options.listen {
        Endpoint::Port(port) => args.extend(["--port".to_string(), port.to_string()]),
        Endpoint::Stdin => args.push("--stdin".to_string()),
    }
    if let Some(key_file) = &options.key_file {
        args.extend(["--key-file".to_string(), key_file.to_string_lossy().into_owned()]);
    }
    args.extend([
        "--workdir".to_string(),
        options.workdir.to_string_lossy().into_owned(),
        "--max-wait-ms".to_string(),
        options.max_wait.as_millis().to_string(),
    ]);
    if let Some(until_ms) = options.session_until_ms {
        args.extend(["--session-until-ms".to_string(), until_ms.to_string()]);
    }
    if let Some(preload) = &options.preload {
        args.extend(["--preload".to_string(), serde_json::to_string(preload).unwrap_or_default()]);
    }
    args
}

pub fn parse_assign(args: Vec<OsString>) -> Result<AssignOptions, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let (mut listen, mut key_file, mut max_wait, mut session_until_ms, mut preload) = (None, None, None, None, None);
    let mut workdir = PathBuf::from(WORKDIR);
    while let Some(arg) = parser.next().map_err(|error| error.to_string())? {
        match arg {
            Long("port") => {
                let number = number(&mut parser, "--port")?;
                let port = u16::try_from(number).map_err(|_| format!("--port takes a port number, not `{number}`"))?;
                listen = one_endpoint(listen, Endpoint::Port(port))?;
            }
            Long("stdin") => listen = one_endpoint(listen, Endpoint::Stdin)?,
            Long("key-file") => key_file = Some(PathBuf::from(value(&mut parser)?)),
            Long("workdir") => workdir = PathBuf::from(value(&mut parser)?),
            Long("max-wait-ms") => max_wait = Some(Duration::from_millis(number(&mut parser, "--max-wait-ms")?)),
            Long("session-until-ms") => session_until_ms = Some(number(&mut parser, "--session-until-ms")?),
            Long("preload") => {
                let text = value(&mut parser)?;
                let parsed: Preload =
                    serde_json::from_str(&text).map_err(|error| format!("--preload is not a pre-started process: {error}"))?;
                if parsed.argv.is_empty() || parsed.prefix.is_empty() {
                    return Err("--preload needs an argv and a prefix".to_string());
                }
                preload = Some(parsed);
            }
            other => return Err(other.unexpected().to_string()),
        }
    }
    let listen = listen.ok_or("runner await-assignment needs --port or --stdin")?;
    match (&listen, &key_file) {
        (Endpoint::Port(_), None) => return Err("runner await-assignment --port needs --key-file".to_string()),
        (Endpoint::Stdin, Some(_)) => {
            return Err("runner await-assignment --stdin takes no --key-file: only a Docker API client can write to stdin".to_string());
        }
        _ => {}
    }
    let max_wait = max_wait.ok_or("runner await-assignment needs --max-wait-ms")?;
    if preload.is_some() && session_until_ms.is_some() {
        return Err("runner await-assignment takes --preload for one assignment, not a session's calls".to_string());
    }
    Ok(AssignOptions { listen, key_file, workdir, max_wait, session_until_ms, preload })
}

fn one_endpoint(earlier: Option<Endpoint>, endpoint: Endpoint) -> Result<Option<Endpoint>, String> {
    match earlier {
        Some(_) => Err("runner await-assignment takes one of --port and --stdin, once".to_string()),
        None => Ok(Some(endpoint)),
    }
}

/// The value of `runner credential`'s helper setting in git's config: git
/// appends the action (`get`, ...) when it calls it.
pub fn credential_helper(runner: &std::path::Path, creds_dir: &std::path::Path) -> String {
    format!("{} runner credential --creds-dir {}", runner.display(), creds_dir.display())
}

pub fn parse_credential(args: Vec<OsString>) -> Result<CredentialOptions, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let (mut creds_dir, mut action) = (None, None);
    while let Some(arg) = parser.next().map_err(|error| error.to_string())? {
        match arg {
            Long("creds-dir") => creds_dir = Some(PathBuf::from(value(&mut parser)?)),
            Value(value) => action = Some(value.to_string_lossy().into_owned()),
            other => return Err(other.unexpected().to_string()),
        }
    }
    Ok(CredentialOptions { creds_dir: creds_dir.ok_or("runner credential needs --creds-dir")?, action })
}

/// `runner probe-pids [--ceiling N]`: the ceiling, `PROBE_CEILING` unless
/// given.
pub fn parse_probe(args: Vec<OsString>) -> Result<u64, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let mut ceiling = PROBE_CEILING;
    while let Some(arg) = parser.next().map_err(|error| error.to_string())? {
        match arg {
            Long("ceiling") => ceiling = number(&mut parser, "--ceiling")?,
            other => return Err(other.unexpected().to_string()),
        }
    }
    Ok(ceiling)
}

/// The most addresses one `runner probe-reach` tries (one thread each).
pub const MAX_REACH_TARGETS: usize = 64;

/// `runner probe-reach IP:PORT...`: the addresses to try, at least one.
pub fn parse_reach(args: Vec<OsString>) -> Result<Vec<std::net::SocketAddr>, String> {
    if args.is_empty() || args.len() > MAX_REACH_TARGETS {
        return Err(format!("runner probe-reach takes 1 to {MAX_REACH_TARGETS} IP:PORT addresses"));
    }
    args.iter()
        .map(|arg| {
            let text = arg.to_string_lossy();
            text.parse().map_err(|_| format!("runner probe-reach: `{text}` is not an IP:PORT address"))
        })
        .collect()
}

fn value(parser: &mut lexopt::Parser) -> Result<String, String> {
    parser.value().map_err(|error| error.to_string()).map(|value| value.to_string_lossy().into_owned())
}

fn number(parser: &mut lexopt::Parser, name: &str) -> Result<u64, String> {
    let text = value(parser)?;
    text.parse().map_err(|_| format!("{name} takes a whole number, not `{text}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `parse_*` gets: the argv after `runner <subcommand>`.
    fn after_subcommand(args: Vec<String>) -> Vec<OsString> {
        args.into_iter().skip(2).map(Into::into).collect()
    }

    #[test]
    fn exec_args_round_trip() {
        let options = ExecOptions {
            workdir: "/src".into(),
            timeout: Duration::from_millis(1500),
            kill_grace: Duration::from_millis(300),
            max_output_bytes: 4096,
            max_artifact_bytes: 8192,
            spill_bytes: 1 << 28,
            hold: Some(HoldOptions { port: 7777, key_sha256: "ab".repeat(32) }),
            artifact_patterns: vec!["out/*.txt".into(), "report.json".into()],
            disk_paths: vec!["/src".into(), "/tmp".into()],
            disk_limit_bytes: 1 << 30,
            termination_log: "/tmp/term".into(),
            start_deadline_ms: Some(1_800_000_000_000),
            argv: vec!["sh".into(), "-c".into(), "echo --not-an-option".into()],
        };
        assert_eq!(parse_exec(after_subcommand(exec_args(&options))), Ok(options.clone()));
        let mut added = exec_args(&ExecOptions { start_deadline_ms: None, ..options.clone() });
        with_start_deadline(&mut added, 1_800_000_000_000);
        assert_eq!(parse_exec(after_subcommand(added)), Ok(options), "the deadline added later reads the same");
    }

    #[test]
    fn exec_defaults_are_the_shared_ones() {
        let options = parse_exec(vec!["--".into(), "true".into()]).unwrap();
        assert_eq!(options.workdir, PathBuf::from(WORKDIR));
        assert_eq!(options.kill_grace, KILL_GRACE);
        assert_eq!(options.termination_log, PathBuf::from(TERMINATION_LOG));
        assert!(parse_exec(vec![]).is_err());
        assert!(parse_exec(vec!["--timeout-ms".into(), "soon".into(), "--".into(), "true".into()]).is_err());
    }

    #[test]
    fn clone_args_round_trip() {
        let options = CloneOptions {
            repo_url: "https://h/r.git".into(),
            git_ref: "v1.0".into(),
            dest: "/work/repo".into(),
            creds_dir: crate::sandbox::CREDS_DIR.into(),
        };
        assert_eq!(parse_clone(after_subcommand(clone_args(&options))), Ok(options));
    }

    #[test]
    fn init_args_round_trip() {
        for (inputs, key) in
            [(None, None), (Some(("/mcp/inputs".into(), "/work".into())), Some(("/mcp/key-secret/key".into(), "/mcp-key/key".into())))]
        {
            for ready_file in [None, Some("/mcp/bin/.ready".into())] {
                for (await_fence, await_fence_until_ms) in
                    [(None, None), (Some(Duration::from_secs(10)), None), (Some(Duration::from_secs(10)), Some(1_800_000_000_000))]
                {
                    let options = InitOptions {
                        copy_to: "/mcp/bin/runner".into(),
                        inputs: inputs.clone(),
                        ready_file: ready_file.clone(),
                        await_fence,
                        await_fence_until_ms,
                        key: key.clone(),
                    };
                    assert_eq!(parse_init(after_subcommand(init_args(&options))), Ok(options.clone()));
                    // The deadline added later reads the same, and only where there is a wait.
                    let mut added = init_args(&InitOptions { await_fence_until_ms: None, ..options.clone() });
                    with_fence_until(&mut added, 1_800_000_000_000);
                    let expected = await_fence.map(|_| 1_800_000_000_000);
                    assert_eq!(parse_init(after_subcommand(added)).map(|parsed| parsed.await_fence_until_ms), Ok(expected));
                }
            }
        }
        let half = vec!["--copy-to".into(), "/x".into(), "--inputs".into(), "/i".into()];
        assert!(parse_init(half).is_err());
        let until_alone = vec!["--copy-to".into(), "/x".into(), "--await-fence-until-ms".into(), "1".into()];
        assert!(parse_init(until_alone).is_err());
        let key_alone = vec!["--copy-to".into(), "/x".into(), "--key-from".into(), "/k".into()];
        assert!(parse_init(key_alone).is_err());
    }

    #[test]
    fn reach_takes_one_to_sixty_four_addresses() {
        let parsed = parse_reach(vec!["192.0.2.2:6443".into(), "[2001:db8::1]:10250".into()]).unwrap();
        assert_eq!(parsed.iter().map(|address| address.to_string()).collect::<Vec<_>>(), ["192.0.2.2:6443", "[2001:db8::1]:10250"]);
        assert!(parse_reach(vec![]).is_err());
        assert!(parse_reach(vec!["node-1:10250".into()]).is_err(), "names are not resolved");
        assert!(parse_reach(vec!["192.0.2.2:1".into(); MAX_REACH_TARGETS + 1]).is_err());
    }

    #[test]
    fn await_args_round_trip() {
        let options = AwaitOptions { ready_file: "/mcp/bin/.ready".into(), timeout: Duration::from_secs(60) };
        assert_eq!(parse_await(after_subcommand(await_args(&options))), Ok(options));
        assert!(parse_await(vec!["--ready-file".into(), "/x".into()]).is_err());
    }

    #[test]
    fn assign_args_round_trip() {
        let mut options = AssignOptions {
            listen: Endpoint::Port(crate::sandbox::assignment::PORT),
            key_file: Some(crate::sandbox::assignment::KEY_FILE.into()),
            workdir: WORKDIR.into(),
            max_wait: Duration::from_secs(660),
            session_until_ms: None,
            preload: None,
        };
        assert_eq!(parse_assign(after_subcommand(assign_args(&options))), Ok(options.clone()));
        let preloaded = AssignOptions { preload: Some(python_preload()), ..options.clone() };
        assert_eq!(parse_assign(after_subcommand(assign_args(&preloaded))), Ok(preloaded.clone()));
        let both = AssignOptions { session_until_ms: Some(1), ..preloaded };
        assert!(parse_assign(after_subcommand(assign_args(&both))).is_err(), "a session takes no preload");
        assert!(parse_assign(["--stdin", "--max-wait-ms", "1", "--preload", "{}"].iter().map(Into::into).collect()).is_err());
        let session = AssignOptions { session_until_ms: Some(1_800_000_000_000), ..options.clone() };
        assert_eq!(parse_assign(after_subcommand(assign_args(&session))), Ok(session));
        options.listen = Endpoint::Stdin;
        options.key_file = None;
        assert_eq!(parse_assign(after_subcommand(assign_args(&options))), Ok(options));
        assert!(parse_assign(vec!["--port".into(), "70000".into()]).is_err());
        let both = ["--port", "7777", "--stdin", "--key-file", "/k", "--max-wait-ms", "1"];
        assert!(parse_assign(both.iter().map(Into::into).collect()).is_err(), "one endpoint only");
        let keyed_stdin = ["--stdin", "--key-file", "/k", "--max-wait-ms", "1"];
        assert!(parse_assign(keyed_stdin.iter().map(Into::into).collect()).is_err(), "stdin has no key");
        let keyless_port = ["--port", "7777", "--max-wait-ms", "1"];
        assert!(parse_assign(keyless_port.iter().map(Into::into).collect()).is_err(), "a port needs its key");
        assert!(parse_assign(vec!["--port".into(), "7777".into(), "--key-file".into(), "/k".into()]).is_err(), "--max-wait-ms is needed");
    }

    fn python_preload() -> Preload {
        let env = [("HOME".to_string(), "/tmp".to_string())].into();
        Preload { argv: vec!["python3".into(), "-c".into(), "import sys; $X".into()], prefix: vec!["python3".into()], env }
    }

    #[test]
    fn an_assignment_fits_a_preload_only_with_its_env_and_prefix_and_a_file() {
        let preload = python_preload();
        let env = preload.env.clone();
        let other_env = [("HOME".to_string(), "/work".to_string())].into();
        let argv = |args: &[&str]| args.iter().map(|arg| arg.to_string()).collect::<Vec<_>>();
        let cases = [
            (argv(&["python3", "main.py"]), &env, Some(argv(&["main.py"]))),
            (argv(&["python3", "main.py", "a b", ""]), &env, Some(argv(&["main.py", "a b", ""]))),
            (argv(&["python3", "main.py"]), &other_env, None),
            (argv(&["python3"]), &env, None),
            (argv(&["python3.11", "main.py"]), &env, None),
            (argv(&["python3", "a\0b"]), &env, None),
        ];
        for (argv, env, want) in cases {
            assert_eq!(preload.fits(&argv, env).map(<[String]>::to_vec), want, "{argv:?}");
        }
        assert_eq!(Preload::line(&argv(&["main.py", "x"])), format!("{}\n", crate::sandbox::to_hex(b"main.py\0x")));
    }

    #[test]
    fn credential_and_probe_args() {
        let helper = credential_helper("/mcp/bin/runner".as_ref(), "/creds".as_ref());
        let args = helper.split(' ').skip(3).chain(["get"]).map(Into::into).collect();
        assert_eq!(parse_credential(args), Ok(CredentialOptions { creds_dir: "/creds".into(), action: Some("get".into()) }));
        assert_eq!(parse_probe(vec![]), Ok(PROBE_CEILING));
        assert_eq!(parse_probe(vec!["--ceiling".into(), "8".into()]), Ok(8));
    }
}
