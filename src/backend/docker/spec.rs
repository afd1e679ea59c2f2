//! The container a run gets, as a pure function of the run and the
//! operator's choices: the create body (`container`), its labels (`labels`)
//! and the archive of its input files (`inputs_archive`). Deterministic
//! (`BTreeMap` labels, sorted env), so its tests compare JSON text.
//!
//! The container runs the same contract as the Kubernetes pod's main
//! container: the runner's `exec` argv from `sandbox::args`, the caller's
//! image, the workdir and `/tmp` writable and the root read-only. What
//! differs is how the pieces arrive: the runner is bind-mounted read-only
//! from the host (no init container copies it), and the inputs are written
//! into the workdir's anonymous volume with `put-archive` before the start
//! (no Secret, no `prepare` step). A run without input files gets its
//! workdir as a tmpfs owned by the run's user instead, with nothing to
//! write (`has_inputs`): the put-archive and the volume cost 100–150 ms of a
//! short run.
//!
//! Knows the Docker API's create body and the engine's spec; does no IO.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::docker::objects::{ContainerSpec, EmptyObject, HostConfig, NetworkInspect, NetworkSpec};
use crate::docker::tar;
use crate::engine::port::spec::{Policy, RunSpec, command_env, exec_options, run_deadline, separate_tmp};
use crate::engine::port::{Keep, NewRun};
use crate::log;
use crate::network::NetworkMode;
use crate::sandbox::TMP_DIR;
use crate::sandbox::args::{self, AssignOptions, Endpoint};

/// `managed-by=mcp-k8s-ephemeral-job` on every container the server makes;
/// every label key starts with `mcp-k8s-ephemeral-job/`, so
/// `docker ps --filter label=...` and the reaper find the server's objects
/// and nothing else.
pub const LABEL_MANAGED_BY: &str = "mcp-k8s-ephemeral-job/managed-by";
pub const MANAGED_BY: &str = "mcp-k8s-ephemeral-job";
pub const LABEL_RUN_ID: &str = "mcp-k8s-ephemeral-job/run-id";
/// `run` (the sandbox), `verdict` or `cancel` (see `record`).
pub const LABEL_ROLE: &str = "mcp-k8s-ephemeral-job/role";
pub const ROLE_RUN: &str = "run";
/// `sync` or `background`.
pub const LABEL_MODE: &str = "mcp-k8s-ephemeral-job/mode";
const MODE_SYNC: &str = "sync";
pub const MODE_BACKGROUND: &str = "background";
/// RFC 3339 UTC: after it the reaper removes the container.
pub const LABEL_EXPIRES_AT: &str = "mcp-k8s-ephemeral-job/expires-at";
/// The sandbox's own deadline from creation, in seconds (`run_deadline`).
pub const LABEL_RUN_DEADLINE_S: &str = "mcp-k8s-ephemeral-job/run-deadline-s";
/// The memory limit as the caller or the default gave it (`512Mi`).
pub const LABEL_MEMORY_LIMIT: &str = "mcp-k8s-ephemeral-job/memory-limit";
pub const LABEL_TOKEN: &str = "mcp-k8s-ephemeral-job/job-token";
pub const LABEL_TIMEOUT_S: &str = "mcp-k8s-ephemeral-job/timeout-s";
/// `image program`, never the arguments.
pub const LABEL_COMMAND: &str = "mcp-k8s-ephemeral-job/command";
/// The hash of a keyed run's tool and arguments (`engine::background::idempotency`).
pub const LABEL_ARGUMENTS_SHA256: &str = "mcp-k8s-ephemeral-job/arguments-sha256";
/// The submitting call's span (`BackgroundRecord::traceparent`).
pub const LABEL_TRACEPARENT: &str = "mcp-k8s-ephemeral-job/traceparent";
/// The caller the run is recorded for (`BackgroundRecord::owner`).
pub const LABEL_CALLER: &str = "mcp-k8s-ephemeral-job/caller";
/// A warm pool's container: the pool's name, and the id of the server
/// process that keeps it (replicas on one daemon keep apart).
pub const LABEL_POOL: &str = "mcp-k8s-ephemeral-job/pool";
pub const LABEL_POOL_OWNER: &str = "mcp-k8s-ephemeral-job/pool-owner";

/// Where the runner binary is mounted inside the container: the path it
/// has in a pod (`sandbox::BIN_DIR`), so argv and messages read the same.
const RUNNER_PATH: &str = "/mcp/bin/mcp-k8s-ephemeral-job";
/// The container's process limit. Kubernetes leaves this to the kubelet's
/// `podPidsLimit`; here the server sets it: enough for builds and test
/// runners, not for a fork bomb to starve the host.
const PIDS_LIMIT: i64 = 1024;

/// What the operator chose for the Docker backend, apart from `Policy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// The static runner binary on the daemon's host, mounted read-only.
    pub runner_binary: String,
    /// MCP_K8S_DOCKER_NETWORK: the network `restricted` runs join; `None`
    /// refuses `restricted`.
    pub restricted_network: Option<String>,
    pub pull: Pull,
    /// The engine takes `uid=`/`gid=` on a tmpfs (dockerd; Podman 4.3
    /// refuses them): only then do runs without input files get a tmpfs
    /// workdir, else the volume as runs with files.
    pub owned_tmpfs: bool,
    /// The engine keeps a container's stdin open from one attach to the
    /// next (dockerd). A sandbox takes each call on its stdin, one attach
    /// per call; Podman 4.3 ends stdin with the first attach (it has no
    /// `StdinOnce`), so there a sandbox would answer one call and exit, and
    /// `open_sandbox` is refused instead.
    pub stdin_across_attaches: bool,
}

/// Whether a missing image may be pulled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pull {
    /// Air-gapped: a missing image is the run's error.
    Never,
    /// Pulled once when the daemon does not have it.
    Missing,
}

/// The bridge network of `open` runs, made by the server on first use
/// (`open_network`): egress anywhere the host routes, and no traffic
/// between its containers, so no other container can connect to a run.
pub const OPEN_NETWORK: &str = "mcp-k8s-open";
/// The bridge driver's option that makes dockerd drop traffic between the
/// network's containers (an iptables rule; dockerd with `--iptables=false`
/// installs none, see docs/security.md).
pub const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";

/// The `NetworkMode` of a run's container: `none` for `none`, the
/// operator's network for `restricted` (`None` when there is none: the
/// backend refuses the run), this server's bridge for `open`.
pub fn network_mode(mode: NetworkMode, options: &Options) -> Option<String> {
    match mode {
        NetworkMode::None => Some("none".to_string()),
        NetworkMode::Restricted => options.restricted_network.clone(),
        NetworkMode::Open => Some(OPEN_NETWORK.to_string()),
    }
}

/// The create body of the `open` network.
pub fn open_network() -> NetworkSpec {
    NetworkSpec {
        name: OPEN_NETWORK.to_string(),
        driver: "bridge".to_string(),
        internal: false,
        check_duplicate: true,
        options: BTreeMap::from([(ICC_OPTION.to_string(), "false".to_string())]),
        labels: BTreeMap::from([(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string())]),
    }
}

/// Whether an existing network named `OPEN_NETWORK` is the one
/// `open_network` makes: a bridge of this server's with inter-container
/// traffic off. Someone else's, or one letting containers talk, would give
/// `open` runs ingress, so it is refused with what to do.
fn check_open_network(inspect: &NetworkInspect) -> Result<(), String> {
    let ours = inspect.labels.get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY);
    let icc_off = inspect.options.get(ICC_OPTION).map(String::as_str) == Some("false");
    if inspect.driver == "bridge" && ours && icc_off && !inspect.internal {
        return Ok(());
    }
    Err(format!(
        "the Docker network `{OPEN_NETWORK}` exists but is not this server's open network (a bridge labelled {LABEL_MANAGED_BY}={MANAGED_BY} with {ICC_OPTION}=false); remove it (`docker network rm {OPEN_NETWORK}`) and the server makes its own"
    ))
}

/// The networks named `OPEN_NETWORK`, by id: the one runs use and the
/// duplicates to remove. Docker lets two creates of one name both succeed
/// (servers starting at once), and a container on a name two networks
/// share cannot start, so every process keeps the lowest id and removes
/// the rest. A network of that name that is not this server's is refused.
#[derive(Debug, PartialEq)]
pub struct OpenNetworks {
    pub keep: Option<String>,
    pub duplicates: Vec<String>,
}

pub fn open_networks(networks: &[NetworkInspect]) -> Result<OpenNetworks, String> {
    let mut ids = Vec::new();
    for network in networks.iter().filter(|network| network.name == OPEN_NETWORK) {
        check_open_network(network)?;
        ids.push(network.id.clone());
    }
    ids.sort();
    let keep = (!ids.is_empty()).then(|| ids.remove(0));
    Ok(OpenNetworks { keep, duplicates: ids })
}

/// The container's name for a run; the sandbox name `output` takes.
pub fn container_name(run_id: &str) -> String {
    format!("mcp-run-{run_id}")
}

/// The create body of a run's container.
pub fn container(run: &NewRun, policy: &Policy, options: &Options) -> ContainerSpec {
    let spec = run.spec;
    // The termination log is not writable here (/dev belongs to root);
    // the runner skips it, and nothing on Docker reads it: the result
    // frame is the result.
    let exec_options = exec_options(spec, policy);
    let mut cmd = args::exec_args(&exec_options);
    if let Some(start_by) = run.start_by {
        args::with_start_deadline(&mut cmd, crate::time::unix_ms(start_by));
    }
    let env = command_env(spec, policy);
    let mut tmpfs = BTreeMap::new();
    if separate_tmp(spec) {
        tmpfs.insert(TMP_DIR.to_string(), tmp_options(policy));
    }
    let mut volumes = BTreeMap::new();
    if workdir_is_volume(spec, options) {
        volumes.insert(spec.workdir.clone(), EmptyObject {});
    } else {
        tmpfs.insert(spec.workdir.clone(), workdir_tmpfs_options(policy));
    }
    let memory = memory_bytes(spec, policy);
    ContainerSpec {
        image: spec.image.clone(),
        entrypoint: Some(vec![RUNNER_PATH.to_string()]),
        cmd,
        env: env.iter().map(|(name, value)| format!("{name}={value}")).collect(),
        working_dir: spec.workdir.clone(),
        user: format!("{0}:{0}", policy.run_as_user),
        labels: labels(run, policy),
        attach_stdout: true,
        attach_stderr: true,
        tty: false,
        open_stdin: false,
        stdin_once: false,
        attach_stdin: false,
        // The runner forwards SIGTERM to the command and reports.
        stop_signal: "SIGTERM".to_string(),
        volumes,
        host_config: HostConfig {
            readonly_rootfs: true,
            cap_drop: vec!["ALL".to_string()],
            // No profile named: Docker's default seccomp profile applies.
            security_opt: vec!["no-new-privileges".to_string()],
            pids_limit: Some(PIDS_LIMIT),
            memory,
            // Equal to the memory limit: no swap, so an OOM is an OOM.
            memory_swap: memory,
            nano_cpus: cpu_nanos(spec, policy),
            shm_size: i64::try_from(crate::engine::port::spec::shm_bytes(spec, policy)).unwrap_or(0),
            tmpfs,
            binds: vec![format!("{}:{RUNNER_PATH}:ro", options.runner_binary)],
            // `create` refuses a run whose mode has no network here, so
            // the fallback only makes a mistake fail closed.
            network_mode: network_mode(spec.network, options).unwrap_or_else(|| "none".to_string()),
            // overlay2 on ext4 refuses `size` (only xfs with pquota has it),
            // so the workdir is bounded by the runner's disk watch alone.
            storage_opt: BTreeMap::new(),
            auto_remove: false,
        },
    }
}

/// What a warm pool's container is made with, beyond the pool's shape.
pub struct PoolSandbox<'a> {
    pub run_id: &'a str,
    pub pool: &'a str,
    pub owner: &'a str,
    /// The runner's `--max-wait-ms`.
    pub max_wait: Duration,
    /// Its expiry label, which cannot change at the claim: past the wait
    /// and the longest run, so the reaper never takes a claimed one that
    /// still runs, and bounded, so a dead server's are reaped.
    pub expires_at: SystemTime,
    /// The runner's `--preload`.
    pub preload: Option<&'a crate::sandbox::args::Preload>,
}

/// The create body of a warm pool's container: a cold run's container for
/// the pool's shape (`template`: no command, no files), whose runner waits
/// for one assignment on its stdin (`runner await-assignment --stdin`),
/// which one attach writes and ends (`OpenStdin`, `StdinOnce`). Its name is
/// a run's (`container_name`), so a run that takes it is found like a cold
/// one.
pub fn pool_container(template: &RunSpec, policy: &Policy, options: &Options, sandbox: &PoolSandbox) -> ContainerSpec {
    let run =
        NewRun { run_id: sandbox.run_id, spec: template, keep: Keep::UntilRemoved { expires_at: sandbox.expires_at }, start_by: None };
    let mut body = container(&run, policy, options);
    let assign = AssignOptions {
        listen: Endpoint::Stdin,
        key_file: None,
        workdir: template.workdir.clone().into(),
        max_wait: sandbox.max_wait,
        session_until_ms: None,
        preload: sandbox.preload.cloned(),
    };
    // `runner await-assignment --stdin ...` where a cold one has `runner exec ...`.
    body.cmd = args::assign_args(&assign);
    body.open_stdin = true;
    body.stdin_once = true;
    body.attach_stdin = true;
    body.labels.insert(LABEL_POOL.to_string(), sandbox.pool.to_string());
    body.labels.insert(LABEL_POOL_OWNER.to_string(), sandbox.owner.to_string());
    body
}

/// Every container of an open sandbox carries its public name: the
/// sandbox's own (role `run`), its call mark and its last-used marks.
pub const LABEL_SANDBOX: &str = "mcp-k8s-ephemeral-job/sandbox";
/// On the sandbox's own container: its record (`engine::sandboxes::rules`).
pub const LABEL_SANDBOX_RECORD: &str = "mcp-k8s-ephemeral-job/sandbox-record";
/// On a call mark: the call (`engine::sandboxes::rules::CallMark`).
pub const LABEL_SANDBOX_CALL: &str = "mcp-k8s-ephemeral-job/sandbox-call";
/// On a last-used mark: when a call ended, Unix milliseconds.
pub const LABEL_SANDBOX_USED_MS: &str = "mcp-k8s-ephemeral-job/sandbox-used-ms";
pub const ROLE_SANDBOX_CALL: &str = "sandbox-call";
pub const ROLE_SANDBOX_USED: &str = "sandbox-used";

/// The create body of an open sandbox's container: a cold run's container
/// for its shape, whose runner takes call after call on its stdin, which
/// stays open between attaches (`OpenStdin` without `StdinOnce`), until it
/// has been idle `idle` or `until_ms` passes; its record in a label.
pub fn session_container(
    template: &RunSpec,
    policy: &Policy,
    options: &Options,
    name: &str,
    record: &str,
    idle: Duration,
    until_ms: u64,
) -> ContainerSpec {
    let expires_at = std::time::UNIX_EPOCH + Duration::from_millis(until_ms) + crate::engine::run::EXPIRY_SLACK;
    let run = NewRun { run_id: name, spec: template, keep: Keep::UntilRemoved { expires_at }, start_by: None };
    let mut body = container(&run, policy, options);
    let assign = AssignOptions {
        listen: Endpoint::Stdin,
        key_file: None,
        workdir: template.workdir.clone().into(),
        max_wait: idle,
        session_until_ms: Some(until_ms),
        preload: None,
    };
    body.cmd = args::assign_args(&assign);
    body.open_stdin = true;
    body.stdin_once = false;
    body.attach_stdin = true;
    body.labels.insert(LABEL_SANDBOX.to_string(), name.to_string());
    body.labels.insert(LABEL_SANDBOX_RECORD.to_string(), record.to_string());
    body
}

/// The labels of a run's container: ownership, expiry and, for a
/// background run, its record (see `record`).
pub fn labels(run: &NewRun, policy: &Policy) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string());
    labels.insert(LABEL_RUN_ID.to_string(), run.run_id.to_string());
    labels.insert(LABEL_ROLE.to_string(), ROLE_RUN.to_string());
    labels.insert(LABEL_RUN_DEADLINE_S.to_string(), run_deadline(run.spec, policy).as_secs().to_string());
    labels.insert(LABEL_MEMORY_LIMIT.to_string(), memory_limit(run.spec, policy));
    let (mode, expires_at) = match &run.keep {
        Keep::UntilRemoved { expires_at } => (MODE_SYNC, *expires_at),
        Keep::Background { record, expires_at, .. } => {
            labels.insert(LABEL_TOKEN.to_string(), record.token.clone());
            labels.insert(LABEL_TIMEOUT_S.to_string(), record.timeout_s.to_string());
            labels.insert(LABEL_COMMAND.to_string(), record.command.clone());
            if let Some(fingerprint) = &record.fingerprint {
                labels.insert(LABEL_ARGUMENTS_SHA256.to_string(), fingerprint.clone());
            }
            if let Some(traceparent) = &record.traceparent {
                labels.insert(LABEL_TRACEPARENT.to_string(), traceparent.clone());
            }
            if let Some(owner) = &record.owner {
                labels.insert(LABEL_CALLER.to_string(), owner.clone());
            }
            (MODE_BACKGROUND, *expires_at)
        }
    };
    labels.insert(LABEL_MODE.to_string(), mode.to_string());
    labels.insert(LABEL_EXPIRES_AT.to_string(), log::rfc3339_utc(expires_at));
    labels
}

/// The workdir's contents as a tar for `put-archive` into the workdir: its
/// root (`/`) owned by the run's user, so the command may write there, each
/// input's parent folders, then the files.
pub fn inputs_archive(spec: &RunSpec, uid: u32) -> Result<Vec<u8>, String> {
    let mut folders: Vec<String> = Vec::new();
    for file in &spec.files {
        let mut parent = String::new();
        for part in file.path.split('/').rev().skip(1).collect::<Vec<_>>().into_iter().rev() {
            parent = if parent.is_empty() { format!("{part}/") } else { format!("{parent}{part}/") };
            if !folders.contains(&parent) {
                folders.push(parent.clone());
            }
        }
    }
    let mut entries = vec![tar::Entry { path: tar::ROOT, kind: tar::EntryKind::Directory, mode: 0o755, uid, gid: uid }];
    entries.extend(folders.iter().map(|folder| tar::Entry { path: folder, kind: tar::EntryKind::Directory, mode: 0o755, uid, gid: uid }));
    entries.extend(spec.files.iter().map(|file| tar::Entry {
        path: &file.path,
        kind: tar::EntryKind::File(&file.content),
        mode: file.mode,
        uid,
        gid: uid,
    }));
    tar::archive(&entries)
}

/// Whether the run has input files to write into its workdir (a volume
/// filled by `put-archive`); without, the workdir is a tmpfs made writable
/// for the run's user by its mount options, and nothing is written.
///
/// The trade: a tmpfs workdir's bytes count against the container's memory
/// limit, as `/tmp`'s already do on Docker, so a run that writes more than
/// its memory there ends `OOMKilled` where a volume would have let it fill
/// the disk up to the runner's disk watch. Runs with files (builds, test
/// suites) keep the volume.
/// The workdir is a volume filled by `put-archive` (which also makes it
/// the run's user's), else a tmpfs mounted as the run's user.
pub fn workdir_is_volume(spec: &RunSpec, options: &Options) -> bool {
    has_inputs(spec) || !options.owned_tmpfs
}

fn has_inputs(spec: &RunSpec) -> bool {
    !spec.files.is_empty()
}

/// The expiry of a run's objects, for the reaper.
pub fn expires_at(labels: &BTreeMap<String, String>) -> Option<SystemTime> {
    crate::time::parse_rfc3339(labels.get(LABEL_EXPIRES_AT)?)
}

/// The sandbox's deadline from its creation, as the labels say.
pub fn labelled_run_deadline(labels: &BTreeMap<String, String>) -> Duration {
    Duration::from_secs(labels.get(LABEL_RUN_DEADLINE_S).and_then(|text| text.parse().ok()).unwrap_or(0))
}

fn memory_limit(spec: &RunSpec, policy: &Policy) -> String {
    spec.memory_limit.as_ref().unwrap_or(&policy.default_memory).as_str().to_string()
}

fn memory_bytes(spec: &RunSpec, policy: &Policy) -> i64 {
    let quantity = spec.memory_limit.as_ref().unwrap_or(&policy.default_memory);
    i64::try_from(quantity.nanos() / 1_000_000_000).unwrap_or(0)
}

fn cpu_nanos(spec: &RunSpec, policy: &Policy) -> i64 {
    let quantity = spec.cpu_limit.as_ref().unwrap_or(&policy.default_cpu);
    i64::try_from(quantity.nanos()).unwrap_or(0)
}

/// `/tmp` as tmpfs, bounded like the workdir, writable by everyone with
/// the sticky bit as a normal `/tmp` is. `exec` as on Kubernetes (an
/// emptyDir): Docker's tmpfs default is `noexec`, and toolchains run what
/// they build there (`go run` in /tmp/go-build…); the workdir is executable
/// anyway, so `noexec` here would only break programs, not contain them.
fn tmp_options(policy: &Policy) -> String {
    let bytes = size_bytes(policy);
    if bytes == 0 { "rw,exec,nosuid,nodev,mode=1777".to_string() } else { format!("rw,exec,nosuid,nodev,mode=1777,size={bytes}") }
}

/// The workdir as tmpfs (a run without inputs): owned by the run's user
/// with mode 0755, as `inputs_archive` makes the volume's root; `exec`
/// because commands run what they build there.
fn workdir_tmpfs_options(policy: &Policy) -> String {
    let uid = policy.run_as_user;
    let owner = format!("rw,exec,nosuid,nodev,uid={uid},gid={uid},mode=0755");
    match size_bytes(policy) {
        0 => owner,
        bytes => format!("{owner},size={bytes}"),
    }
}

fn size_bytes(policy: &Policy) -> u64 {
    u64::try_from(policy.workdir_size_limit.nanos() / 1_000_000_000).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::port::BackgroundRecord;
    use crate::engine::port::spec::InputFile;
    use crate::quantity::Quantity;
    use std::time::UNIX_EPOCH;

    pub fn policy() -> Policy {
        Policy {
            run_as_user: 65532,
            default_cpu: Quantity::parse("1").unwrap(),
            default_memory: Quantity::parse("512Mi").unwrap(),
            max_output_bytes: 1 << 20,
            max_artifact_bytes: 10 << 20,
            start_timeout: Duration::from_secs(120),
            workdir_size_limit: Quantity::parse("1Gi").unwrap(),
            extra_env: BTreeMap::from([("A".to_string(), "operator".to_string())]),
            cache: None,
            clone: None,
            outputs: None,
            sandboxes: Default::default(),
        }
    }

    pub fn run_spec() -> RunSpec {
        RunSpec {
            owner: None,
            image: "busybox:1.35".into(),
            command: vec!["sh".into(), "-c".into(), "echo $A".into()],
            files: vec![InputFile { path: "src/main.py".into(), content: b"print(1)\n".to_vec(), mode: 0o644 }],
            env: BTreeMap::from([("A".to_string(), "caller".to_string())]),
            cpu_limit: Some(Quantity::parse("500m").unwrap()),
            memory_limit: None,
            timeout: Duration::from_secs(30),
            workdir: "/work".into(),
            artifacts: vec![],
            clone: None,
            network: NetworkMode::None,
        }
    }

    fn options() -> Options {
        Options {
            runner_binary: "/usr/local/bin/mcp-k8s-ephemeral-job".into(),
            restricted_network: None,
            pull: Pull::Never,
            owned_tmpfs: true,
            stdin_across_attaches: true,
        }
    }

    #[test]
    fn the_create_body_is_hardened_and_runs_the_runner() {
        let spec = run_spec();
        let expires_at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let run = NewRun { run_id: "r1", spec: &spec, keep: Keep::UntilRemoved { expires_at }, start_by: None };
        let body = serde_json::to_string_pretty(&container(&run, &policy(), &options())).unwrap();
        let expected = r#"{
  "Image": "busybox:1.35",
  "Entrypoint": [
    "/mcp/bin/mcp-k8s-ephemeral-job"
  ],
  "Cmd": [
    "runner",
    "exec",
    "--workdir",
    "/work",
    "--timeout-ms",
    "30000",
    "--kill-grace-ms",
    "2000",
    "--max-output-bytes",
    "1048576",
    "--max-artifact-bytes",
    "10485760",
    "--termination-log",
    "/dev/termination-log",
    "--disk-limit-bytes",
    "1073741824",
    "--disk-path",
    "/work",
    "--disk-path",
    "/tmp",
    "--",
    "sh",
    "-c",
    "echo $A"
  ],
  "Env": [
    "A=caller",
    "HOME=/tmp"
  ],
  "WorkingDir": "/work",
  "User": "65532:65532",
  "Labels": {
    "mcp-k8s-ephemeral-job/expires-at": "2027-01-15T08:00:00.000Z",
    "mcp-k8s-ephemeral-job/managed-by": "mcp-k8s-ephemeral-job",
    "mcp-k8s-ephemeral-job/memory-limit": "512Mi",
    "mcp-k8s-ephemeral-job/mode": "sync",
    "mcp-k8s-ephemeral-job/role": "run",
    "mcp-k8s-ephemeral-job/run-deadline-s": "182",
    "mcp-k8s-ephemeral-job/run-id": "r1"
  },
  "AttachStdout": true,
  "AttachStderr": true,
  "Tty": false,
  "OpenStdin": false,
  "StopSignal": "SIGTERM",
  "Volumes": {
    "/work": {}
  },
  "HostConfig": {
    "ReadonlyRootfs": true,
    "CapDrop": [
      "ALL"
    ],
    "SecurityOpt": [
      "no-new-privileges"
    ],
    "PidsLimit": 1024,
    "Memory": 536870912,
    "MemorySwap": 536870912,
    "NanoCpus": 500000000,
    "ShmSize": 67108864,
    "Tmpfs": {
      "/tmp": "rw,exec,nosuid,nodev,mode=1777,size=1073741824"
    },
    "Binds": [
      "/usr/local/bin/mcp-k8s-ephemeral-job:/mcp/bin/mcp-k8s-ephemeral-job:ro"
    ],
    "NetworkMode": "none",
    "AutoRemove": false
  }
}"#;
        assert_eq!(body, expected);
    }

    #[test]
    fn a_pool_container_waits_for_its_assignment_on_a_one_shot_stdin() {
        let template = RunSpec { command: vec![], files: vec![], env: BTreeMap::new(), ..run_spec() };
        let expiry = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let sandbox = PoolSandbox {
            run_id: "r9",
            pool: "busybox",
            owner: "owner1",
            max_wait: Duration::from_secs(780),
            expires_at: expiry,
            preload: None,
        };
        let body = pool_container(&template, &policy(), &options(), &sandbox);
        assert_eq!(body.cmd, ["runner", "await-assignment", "--stdin", "--workdir", "/work", "--max-wait-ms", "780000"]);
        assert!(body.open_stdin && body.stdin_once && body.attach_stdin, "one attach writes stdin and ends it");
        assert_eq!(body.labels[LABEL_POOL], "busybox");
        assert_eq!(body.labels[LABEL_POOL_OWNER], "owner1");
        assert_eq!(body.labels[LABEL_RUN_ID], "r9");
        assert_eq!(body.labels[LABEL_MODE], MODE_SYNC);
        assert_eq!(expires_at(&body.labels), Some(expiry), "the reaper's bound");
        assert_eq!(body.host_config.network_mode, "none");
        assert_eq!(body.host_config.tmpfs["/work"], "rw,exec,nosuid,nodev,uid=65532,gid=65532,mode=0755,size=1073741824");
        assert_eq!(body.env, ["A=operator", "HOME=/tmp"], "no caller env yet: it comes with the assignment");
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(
            (json["OpenStdin"].clone(), json["StdinOnce"].clone(), json["AttachStdin"].clone()),
            (true.into(), true.into(), true.into())
        );
    }

    #[test]
    fn an_open_sandboxs_container_keeps_its_stdin_open_and_carries_its_record() {
        let template = RunSpec { command: vec![], files: vec![], env: BTreeMap::new(), ..run_spec() };
        let until_ms = 1_800_000_000_000;
        let body = session_container(&template, &policy(), &options(), "s1", "{\"id\":\"x\"}", Duration::from_secs(630), until_ms);
        assert_eq!(
            body.cmd,
            [
                "runner",
                "await-assignment",
                "--stdin",
                "--workdir",
                "/work",
                "--max-wait-ms",
                "630000",
                "--session-until-ms",
                "1800000000000"
            ]
        );
        assert!(body.open_stdin && !body.stdin_once && body.attach_stdin, "stdin stays open between calls");
        assert_eq!(body.labels[LABEL_SANDBOX], "s1");
        assert_eq!(body.labels[LABEL_SANDBOX_RECORD], "{\"id\":\"x\"}");
        assert_eq!(body.labels[LABEL_RUN_ID], "s1", "found by its name as a run is");
        let expected = UNIX_EPOCH + Duration::from_millis(until_ms) + crate::engine::run::EXPIRY_SLACK;
        assert_eq!(expires_at(&body.labels), Some(expected), "the reaper's bound: its lifetime");
        assert_eq!(body.env, ["A=operator", "HOME=/tmp"], "no caller env: each call brings its own");
    }

    #[test]
    fn a_background_run_carries_its_record_and_a_named_network_is_used() {
        let spec = RunSpec { workdir: "/tmp".into(), network: NetworkMode::Restricted, ..run_spec() };
        let record = BackgroundRecord {
            owner: None,
            token: "t".into(),
            timeout_s: 30,
            command: "busybox:1.35 sh".into(),
            fingerprint: Some("f".into()),
            traceparent: None,
        };
        let keep = Keep::Background { record, result_ttl: Duration::from_secs(60), expires_at: UNIX_EPOCH };
        let run = NewRun { run_id: "r2", spec: &spec, keep, start_by: None };
        let options = Options { restricted_network: Some("runs".into()), ..options() };
        let body = container(&run, &policy(), &options);
        assert_eq!(body.labels[LABEL_MODE], MODE_BACKGROUND);
        assert_eq!(body.labels[LABEL_TOKEN], "t");
        assert_eq!(body.labels[LABEL_TIMEOUT_S], "30");
        assert_eq!(body.labels[LABEL_COMMAND], "busybox:1.35 sh");
        assert_eq!(body.labels[LABEL_ARGUMENTS_SHA256], "f");
        assert_eq!(body.host_config.network_mode, "runs");
        assert!(body.host_config.tmpfs.is_empty(), "a /tmp workdir is the volume");
        assert!(body.volumes.contains_key("/tmp"));
        assert_eq!(expires_at(&body.labels), Some(UNIX_EPOCH));
    }

    #[test]
    fn each_mode_has_its_network() {
        let with_restricted = Options { restricted_network: Some("egress-allowlist".into()), ..options() };
        let cases = [
            (NetworkMode::None, &options(), Some("none")),
            (NetworkMode::Restricted, &options(), None),
            (NetworkMode::Restricted, &with_restricted, Some("egress-allowlist")),
            (NetworkMode::Open, &options(), Some(OPEN_NETWORK)),
        ];
        for (mode, options, expected) in cases {
            assert_eq!(network_mode(mode, options).as_deref(), expected, "{mode:?}");
        }
        let spec = RunSpec { network: NetworkMode::Restricted, ..run_spec() };
        let run = NewRun { run_id: "r3", spec: &spec, keep: Keep::UntilRemoved { expires_at: UNIX_EPOCH }, start_by: None };
        assert_eq!(container(&run, &policy(), &options()).host_config.network_mode, "none", "fails closed");
    }

    #[test]
    fn only_this_servers_open_network_with_icc_off_is_used() {
        let body = serde_json::to_string(&open_network()).unwrap();
        assert_eq!(
            body,
            r#"{"Name":"mcp-k8s-open","Driver":"bridge","Internal":false,"CheckDuplicate":true,"Options":{"com.docker.network.bridge.enable_icc":"false"},"Labels":{"mcp-k8s-ephemeral-job/managed-by":"mcp-k8s-ephemeral-job"}}"#
        );
        let made = open_network();
        let ours = NetworkInspect {
            name: made.name.clone(),
            driver: made.driver.clone(),
            options: made.options.clone(),
            labels: made.labels.clone(),
            ..NetworkInspect::default()
        };
        assert_eq!(check_open_network(&ours), Ok(()));
        let icc_on = NetworkInspect { options: BTreeMap::new(), ..ours.clone() };
        let foreign = NetworkInspect { labels: BTreeMap::new(), ..ours.clone() };
        let internal = NetworkInspect { internal: true, ..ours.clone() };
        for bad in [icc_on.clone(), foreign, internal] {
            let error = check_open_network(&bad).unwrap_err();
            assert!(error.contains("docker network rm mcp-k8s-open"), "{error}");
        }
        // Two creates at once leave two of that name: every process takes
        // the lowest id; another name is not looked at.
        let with_id = |id: &str| NetworkInspect { id: id.into(), ..ours.clone() };
        let other = NetworkInspect { name: "bridge".into(), id: "0".into(), ..NetworkInspect::default() };
        let found = open_networks(&[with_id("c3"), with_id("b2"), other.clone(), with_id("a1")]);
        assert_eq!(found, Ok(OpenNetworks { keep: Some("a1".into()), duplicates: vec!["b2".into(), "c3".into()] }));
        assert_eq!(open_networks(&[other]), Ok(OpenNetworks { keep: None, duplicates: vec![] }));
        assert!(open_networks(&[with_id("a1"), icc_on]).is_err(), "one of the name not ours is refused");
    }

    #[test]
    fn a_run_without_files_gets_a_tmpfs_workdir_owned_by_its_user() {
        let spec = RunSpec { files: vec![], ..run_spec() };
        let run = NewRun { run_id: "r3", spec: &spec, keep: Keep::UntilRemoved { expires_at: UNIX_EPOCH }, start_by: None };
        let body = container(&run, &policy(), &options());
        assert!(!has_inputs(&spec));
        assert!(body.volumes.is_empty(), "no volume to fill");
        assert_eq!(body.host_config.tmpfs["/work"], "rw,exec,nosuid,nodev,uid=65532,gid=65532,mode=0755,size=1073741824");
        assert_eq!(body.host_config.tmpfs["/tmp"], "rw,exec,nosuid,nodev,mode=1777,size=1073741824");

        let in_tmp = RunSpec { workdir: "/tmp".into(), ..spec };
        let run = NewRun { run_id: "r4", spec: &in_tmp, keep: Keep::UntilRemoved { expires_at: UNIX_EPOCH }, start_by: None };
        let body = container(&run, &policy(), &options());
        assert_eq!(body.host_config.tmpfs.len(), 1, "a /tmp workdir is one mount");
        assert!(body.host_config.tmpfs["/tmp"].contains("uid=65532"));

        // Podman refuses `uid=` on a tmpfs: the volume, as with files.
        let podman = Options { owned_tmpfs: false, ..options() };
        let body = container(&run, &policy(), &podman);
        assert!(workdir_is_volume(&in_tmp, &podman));
        assert!(body.host_config.tmpfs.values().all(|options| !options.contains("uid=")), "{:?}", body.host_config.tmpfs);
        assert!(body.volumes.contains_key("/tmp"));
    }

    #[test]
    fn the_inputs_archive_owns_the_workdir_and_the_parents() {
        let bytes = inputs_archive(&run_spec(), 65532).unwrap();
        let names: Vec<String> = bytes
            .chunks(512)
            .filter(|block| block[257..262] == *b"ustar")
            .map(|block| String::from_utf8_lossy(&block[..100]).trim_end_matches('\0').to_string())
            .collect();
        assert_eq!(names, ["/", "src", "src/main.py"]);
    }
}
