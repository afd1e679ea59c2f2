//! Typed views of the Docker Engine API's JSON (v1.41 field names): what a
//! backend reads (container inspect and list, image and network inspect,
//! version, info, events, wait) and writes (the container and network
//! create bodies).
//!
//! Only the fields a backend needs are here; unknown fields are ignored, and
//! Docker's habit of sending `null` for an empty list or map reads as empty.
//! These are wire types: they know nothing about runs.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// `GET /version`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Version {
    /// The newest API version the daemon speaks, e.g. `1.41`.
    pub api_version: String,
    #[serde(rename = "MinAPIVersion")]
    pub min_api_version: String,
    /// The engine's version, e.g. `20.10.24+dfsg1`.
    pub version: String,
    pub os: String,
    pub arch: String,
    pub kernel_version: String,
    #[serde(deserialize_with = "null_as_default")]
    pub components: Vec<Component>,
}

/// One part of the engine in `GET /version` (`Engine`, `Podman Engine`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Component {
    pub name: String,
}

impl Version {
    /// Podman's Docker-compatible service rather than dockerd: it refuses
    /// `uid=`/`gid=` on a tmpfs and drops the bridge's `enable_icc`.
    pub fn is_podman(&self) -> bool {
        self.components.iter().any(|component| component.name.starts_with("Podman"))
    }
}

/// `GET /info`, the parts a backend or `doctor` checks.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Info {
    /// The storage driver, e.g. `overlay2`.
    pub driver: String,
    #[serde(deserialize_with = "null_as_default")]
    pub driver_status: Vec<Vec<String>>,
    pub cgroup_driver: String,
    pub cgroup_version: String,
    #[serde(rename = "NCPU")]
    pub n_cpu: i64,
    pub mem_total: i64,
    /// e.g. `name=seccomp,profile=default`, `name=rootless`.
    #[serde(deserialize_with = "null_as_default")]
    pub security_options: Vec<String>,
    pub server_version: String,
}

/// The body of `POST /containers/create`. `Default` is a container with no
/// hardening at all: a backend sets every `HostConfig` field it means.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerSpec {
    pub image: String,
    /// `None` keeps the image's entrypoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Vec<String>,
    /// `K=V` strings.
    pub env: Vec<String>,
    /// Empty keeps the image's.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub working_dir: String,
    /// `uid:gid`; empty keeps the image's user.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user: String,
    pub labels: BTreeMap<String, String>,
    pub attach_stdout: bool,
    pub attach_stderr: bool,
    /// Always false: `LogStream` reads the multiplexed (non-TTY) format.
    pub tty: bool,
    /// With `stdin_once` and `attach_stdin`: a stdin that one attach writes
    /// and ends (a Docker warm sandbox's assignment); else none.
    pub open_stdin: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub stdin_once: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub attach_stdin: bool,
    /// The signal `docker stop` (and a daemon shutdown) sends first.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub stop_signal: String,
    /// Mount points that get an anonymous volume: writable under a read-only
    /// root, filled by `put_archive` before the start, and removed with the
    /// container (`container_remove` passes `v=1`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub volumes: BTreeMap<String, EmptyObject>,
    pub host_config: HostConfig,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// `{}`: the value of each `Volumes` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EmptyObject {}

/// `HostConfig` of a create body: limits, mounts, security, network.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct HostConfig {
    pub readonly_rootfs: bool,
    /// e.g. `["ALL"]`.
    pub cap_drop: Vec<String>,
    /// e.g. `["no-new-privileges"]`; the default seccomp profile applies
    /// unless one is named here.
    pub security_opt: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<i64>,
    /// Bytes; 0 is no limit.
    pub memory: i64,
    /// Memory plus swap, in bytes: equal to `memory` means no swap; 0 lets
    /// Docker choose (twice `memory`).
    pub memory_swap: i64,
    /// CPUs in units of 10^-9; 0 is no limit.
    pub nano_cpus: i64,
    /// Bytes of `/dev/shm`; 0 lets Docker choose (64 MiB).
    pub shm_size: i64,
    /// Mount point → mount options, e.g. `/tmp` → `rw,nosuid,nodev,size=64m`.
    pub tmpfs: BTreeMap<String, String>,
    /// `host:container:ro` strings.
    pub binds: Vec<String>,
    /// `none`, `bridge` or a network's name.
    pub network_mode: String,
    /// e.g. `size` → `1G`; only some storage drivers accept it (overlay2 on
    /// xfs with pquota), the others refuse the create.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub storage_opt: BTreeMap<String, String>,
    /// Never true here: the server removes its containers itself, after it
    /// has read the exit code and the logs.
    pub auto_remove: bool,
}

/// The answer of `POST /containers/create`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CreatedContainer {
    pub id: String,
    #[serde(deserialize_with = "null_as_default")]
    pub warnings: Vec<String>,
}

/// `GET /containers/{id}/json`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ContainerInspect {
    pub id: String,
    /// With Docker's leading slash, e.g. `/mcp-run-1`.
    pub name: String,
    pub image: String,
    pub state: ContainerState,
    pub config: ContainerConfig,
    pub restart_count: i64,
    #[serde(deserialize_with = "null_as_default")]
    pub mounts: Vec<MountPoint>,
    pub network_settings: NetworkSettings,
}

/// `NetworkSettings` of a container inspect: its address on each network.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NetworkSettings {
    /// Network name → the container's endpoint on it.
    #[serde(deserialize_with = "null_as_default")]
    pub networks: BTreeMap<String, Endpoint>,
}

/// One network of a container.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Endpoint {
    #[serde(rename = "IPAddress")]
    pub ip_address: String,
    pub gateway: String,
}

/// The body of `POST /networks/create`.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct NetworkSpec {
    pub name: String,
    /// e.g. `bridge`.
    pub driver: String,
    /// No route off the network (Docker's `--internal`).
    pub internal: bool,
    /// Refuse a second network of the same name: before API 1.44 Docker
    /// creates duplicates unless asked not to.
    pub check_duplicate: bool,
    /// Driver options, e.g. `com.docker.network.bridge.enable_icc` → `false`.
    pub options: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
}

/// The answer of `POST /networks/create`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CreatedNetwork {
    pub id: String,
    pub warning: String,
}

/// `GET /networks/{name}`, the parts a backend checks.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NetworkInspect {
    pub name: String,
    pub id: String,
    pub driver: String,
    pub internal: bool,
    #[serde(deserialize_with = "null_as_default")]
    pub options: BTreeMap<String, String>,
    #[serde(deserialize_with = "null_as_default")]
    pub labels: BTreeMap<String, String>,
    #[serde(rename = "IPAM")]
    pub ipam: Ipam,
}

/// `IPAM` of a network inspect.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Ipam {
    #[serde(deserialize_with = "null_as_default")]
    pub config: Vec<IpamConfig>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct IpamConfig {
    pub subnet: String,
    pub gateway: String,
}

/// One of `Mounts` of a container inspect.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct MountPoint {
    /// `volume`, `bind` or `tmpfs`.
    #[serde(rename = "Type")]
    pub kind: String,
    /// The volume's name (empty for binds).
    pub name: String,
    pub source: String,
    pub destination: String,
    #[serde(rename = "RW")]
    pub rw: bool,
}

/// `State` of a container inspect.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ContainerState {
    /// `created`, `running`, `paused`, `restarting`, `removing`, `exited` or
    /// `dead` (Podman's own words are read as these: `docker_status`).
    #[serde(deserialize_with = "docker_status")]
    pub status: String,
    pub running: bool,
    pub exit_code: i64,
    #[serde(rename = "OOMKilled")]
    pub oom_killed: bool,
    /// Why the start failed (e.g. the entrypoint does not exist), else empty.
    pub error: String,
    /// RFC 3339; `0001-01-01T00:00:00Z` when never started or not finished.
    pub started_at: String,
    pub finished_at: String,
    pub pid: i64,
}

/// `Config` of a container inspect.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ContainerConfig {
    pub image: String,
    #[serde(deserialize_with = "null_as_default")]
    pub labels: BTreeMap<String, String>,
    pub user: String,
}

/// One item of `GET /containers/json`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ContainerSummary {
    pub id: String,
    #[serde(deserialize_with = "null_as_default")]
    pub names: Vec<String>,
    pub image: String,
    /// Unix seconds.
    pub created: i64,
    /// `created`, `running`, `exited`, … (as `ContainerState::status`).
    #[serde(deserialize_with = "docker_status")]
    pub state: String,
    /// Human text, e.g. `Exited (0) 5 seconds ago`.
    pub status: String,
    #[serde(deserialize_with = "null_as_default")]
    pub labels: BTreeMap<String, String>,
}

/// `GET /images/{name}/json`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ImageInspect {
    /// `sha256:<digest of the config>`.
    pub id: String,
    #[serde(deserialize_with = "null_as_default")]
    pub repo_tags: Vec<String>,
    pub size: i64,
    pub config: ImageConfig,
}

/// `Config` of an image inspect.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ImageConfig {
    pub user: String,
    #[serde(deserialize_with = "null_as_default")]
    pub env: Vec<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub entrypoint: Vec<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub cmd: Vec<String>,
    pub working_dir: String,
}

/// The answer of `POST /containers/{id}/wait`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct WaitResponse {
    pub status_code: i64,
    pub error: Option<WaitError>,
}

/// `Error` of a wait answer (set when the wait itself failed).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct WaitError {
    pub message: String,
}

/// One line of `GET /events`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Event {
    /// `container`, `image`, `network`, ….
    #[serde(rename = "Type")]
    pub kind: String,
    /// `create`, `start`, `die`, `oom`, `kill`, `destroy`, ….
    #[serde(rename = "Action")]
    pub action: String,
    #[serde(rename = "Actor")]
    pub actor: EventActor,
    /// Unix seconds and nanoseconds.
    pub time: i64,
    #[serde(rename = "timeNano")]
    pub time_nano: i64,
}

/// `Actor` of an event: the object and its attributes (a container's
/// labels, `exitCode` on `die`, `signal` on `kill`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct EventActor {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Attributes", deserialize_with = "null_as_default")]
    pub attributes: BTreeMap<String, String>,
}

/// One line of the `POST /images/create` (pull) and `POST /images/load`
/// progress streams; a failure arrives as a line with `error` under a 200.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct ProgressLine {
    pub status: String,
    pub stream: String,
    pub error: String,
}

/// Reads `null` as the type's default (Docker sends `"Labels": null`).
fn null_as_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(deserializer: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Reads a container's status, with the states Podman's Docker-compatible
/// API (4.3) passes through from libpod as Docker's word for them:
/// `stopped` (exited, its cleanup not done yet; it can last seconds under
/// load) is `exited`, `stopping` (the process still runs) is `running`, and
/// `configured` (never created in the runtime) is `created`. dockerd never
/// sends these.
fn docker_status<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let status: String = null_as_default(deserializer)?;
    Ok(match status.as_str() {
        "stopped" => "exited".to_string(),
        "stopping" => "running".to_string(),
        "configured" => "created".to_string(),
        _ => status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podmans_own_states_read_as_dockers() {
        let state = |status: &str| -> String {
            let json = format!(r#"{{"State":{{"Status":"{status}"}}}}"#);
            serde_json::from_str::<ContainerInspect>(&json).unwrap().state.status
        };
        assert_eq!(
            ["stopped", "stopping", "configured", "exited", "running", "created", "removing", "dead"].map(state),
            ["exited", "running", "created", "exited", "running", "created", "removing", "dead"]
        );
        let summary: ContainerSummary = serde_json::from_str(r#"{"State":"stopped"}"#).unwrap();
        assert_eq!(summary.state, "exited");
        let null: ContainerSummary = serde_json::from_str(r#"{"State":null}"#).unwrap();
        assert_eq!(null.state, "");
    }

    #[test]
    fn inspect_reads_nulls_as_empty() {
        let inspect: ContainerInspect = serde_json::from_str(
            r#"{"Id":"abc","Name":"/x","State":{"Status":"exited","Running":false,"ExitCode":137,"OOMKilled":true,"Error":"",
               "StartedAt":"2026-12-01T10:00:00Z","FinishedAt":"2026-12-01T10:00:01Z"},"Config":{"Labels":null,"Image":"busybox"}}"#,
        )
        .unwrap();
        assert_eq!(inspect.name, "/x");
        assert!(inspect.state.oom_killed);
        assert_eq!(inspect.state.exit_code, 137);
        assert!(inspect.config.labels.is_empty());
    }

    #[test]
    fn networks_use_the_api_field_names() {
        let spec = NetworkSpec { name: "n".into(), driver: "bridge".into(), check_duplicate: true, ..NetworkSpec::default() };
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            (json["Name"].as_str(), json["Internal"].as_bool(), json["CheckDuplicate"].as_bool()),
            (Some("n"), Some(false), Some(true))
        );
        let inspect: NetworkInspect = serde_json::from_str(
            r#"{"Name":"n","Id":"1","Driver":"bridge","Internal":true,"Options":null,"Labels":{"a":"b"},
               "IPAM":{"Config":[{"Subnet":"172.18.0.0/16","Gateway":"172.18.0.1"}]}}"#,
        )
        .unwrap();
        assert!(inspect.internal && inspect.options.is_empty());
        assert_eq!(inspect.ipam.config[0].gateway, "172.18.0.1");
        let container: ContainerInspect =
            serde_json::from_str(r#"{"NetworkSettings":{"Networks":{"n":{"IPAddress":"172.18.0.2","Gateway":"172.18.0.1"}}}}"#).unwrap();
        assert_eq!(container.network_settings.networks["n"].ip_address, "172.18.0.2");
    }

    #[test]
    fn create_body_uses_the_api_field_names() {
        let spec = ContainerSpec {
            image: "busybox".into(),
            cmd: vec!["true".into()],
            host_config: HostConfig {
                readonly_rootfs: true,
                cap_drop: vec!["ALL".into()],
                pids_limit: Some(64),
                nano_cpus: 500_000_000,
                network_mode: "none".into(),
                ..HostConfig::default()
            },
            ..ContainerSpec::default()
        };
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["Image"], "busybox");
        assert!(json.get("Entrypoint").is_none() && json.get("User").is_none());
        let host_config = &json["HostConfig"];
        assert_eq!(host_config["ReadonlyRootfs"], true);
        assert_eq!(host_config["CapDrop"][0], "ALL");
        assert_eq!(host_config["PidsLimit"], 64);
        assert_eq!(host_config["NanoCpus"], 500_000_000);
        assert_eq!(host_config["NetworkMode"], "none");
        assert!(host_config.get("StorageOpt").is_none());
    }
}
