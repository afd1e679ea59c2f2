//! The Job and Secret the engine builds, compared as JSON text with files
//! under `fixtures/manifests/`. Set `UPDATE_FIXTURES=1` to rewrite them after
//! an intended change, then review the diff.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use mcp_k8s_ephemeral_job::backend::kubernetes::manifest;
use mcp_k8s_ephemeral_job::backend::kubernetes::settings::{AwaitFence, Settings};
use mcp_k8s_ephemeral_job::backend::kubernetes::template::{self, PodTemplate};
use mcp_k8s_ephemeral_job::engine::port::spec::{CacheVolume, CloneSpec, CloneStep, InputFile, Policy, RunSpec};
use mcp_k8s_ephemeral_job::network::{FenceModes, NetworkMode};
use mcp_k8s_ephemeral_job::quantity::Quantity;

fn policy() -> Policy {
    Policy {
        run_as_user: 65532,
        default_cpu: Quantity::parse("1").unwrap(),
        default_memory: Quantity::parse("512Mi").unwrap(),
        max_output_bytes: 1 << 20,
        max_artifact_bytes: 10 << 20,
        start_timeout: Duration::from_secs(120),
        workdir_size_limit: Quantity::parse("1Gi").unwrap(),
        extra_env: BTreeMap::from([("CI".into(), "true".into()), ("SHARED".into(), "operator".into())]),
        cache: None,
        clone: None,
        outputs: None,
        sandboxes: Default::default(),
    }
}

fn cluster() -> Settings {
    Settings {
        namespace: "mcp-ephemeral".into(),
        runner_image: "mcp-k8s-test.local/mcp-k8s-ephemeral-job:dev".into(),
        runner_binary_path: "/mcp-k8s-ephemeral-job".into(),
        finished_ttl: Duration::from_secs(300),
        runtime_class: None,
        await_network_policy: AwaitFence::NEVER,
    }
}

fn spec() -> RunSpec {
    RunSpec {
        owner: None,
        image: "docker.io/library/python:3.12-slim".into(),
        command: vec!["python3".into(), "-c".into(), "print('$(HOME)')".into()],
        files: Vec::new(),
        env: BTreeMap::from([("SHARED".into(), "caller".into()), ("A".into(), "$(B)".into())]),
        cpu_limit: None,
        memory_limit: None,
        timeout: Duration::from_secs(60),
        workdir: "/work".into(),
        artifacts: Vec::new(),
        clone: None,
        network: NetworkMode::Open,
    }
}

fn check(name: &str, actual: &serde_json::Value) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/manifests").join(name);
    let actual_text = serde_json::to_string_pretty(actual).unwrap() + "\n";
    if std::env::var_os("UPDATE_FIXTURES").is_some() {
        std::fs::write(&path, &actual_text).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}; run with UPDATE_FIXTURES=1 to create it", path.display()));
    assert_eq!(actual_text, expected, "{name} differs; rerun with UPDATE_FIXTURES=1 and review the diff");
}

#[test]
fn plain_run() {
    check("plain-run.json", &manifest::job(&spec(), &policy(), &cluster(), "0123abcd"));
}

#[test]
fn run_with_files_limits_and_cache() {
    let mut spec = spec();
    spec.files = vec![
        InputFile { path: "main.py".into(), content: b"print(1)".to_vec(), mode: 0o644 },
        InputFile { path: "bin/run".into(), content: vec![0, 1, 2], mode: 0o755 },
    ];
    spec.cpu_limit = Some(Quantity::parse("250m").unwrap());
    spec.memory_limit = Some(Quantity::parse("1Gi").unwrap());
    spec.artifacts = vec!["out/**".into()];
    spec.network = NetworkMode::None;
    let mut policy = policy();
    policy.cache = Some(CacheVolume { claim_name: "deps".into(), mount_path: "/cache".into() });
    let cluster = Settings { runtime_class: Some("gvisor".into()), ..cluster() };
    check("files-limits-cache.json", &manifest::job(&spec, &policy, &cluster, "0123abcd"));
    let secret = manifest::inputs_secret(&spec, &cluster, "0123abcd", "uid-1").expect("a secret for files");
    check("files-secret.json", &secret);
}

/// The mode is a label of the pod alone (the policies select
/// pods), with exactly the three values `deploy/networkpolicy-jobs.yaml`
/// selects on.
#[test]
fn the_network_mode_is_a_pod_label_and_nothing_else_changes() {
    let mut names = Vec::new();
    for mode in NetworkMode::ALL {
        let job = manifest::job(&RunSpec { network: mode, ..spec() }, &policy(), &cluster(), "0123abcd");
        let pod_labels = &job["spec"]["template"]["metadata"]["labels"];
        assert_eq!(pod_labels["app.kubernetes.io/managed-by"], "mcp-k8s-ephemeral-job");
        names.push(pod_labels[manifest::LABEL_NETWORK].as_str().unwrap().to_string());
        assert!(job["metadata"]["labels"].get(manifest::LABEL_NETWORK).is_none(), "not on the Job");
        let mut without = job.clone();
        without["spec"]["template"]["metadata"]["labels"].as_object_mut().unwrap().remove(manifest::LABEL_NETWORK);
        let mut open = manifest::job(&spec(), &policy(), &cluster(), "0123abcd");
        open["spec"]["template"]["metadata"]["labels"].as_object_mut().unwrap().remove(manifest::LABEL_NETWORK);
        assert_eq!(without, open, "{mode:?} changes only the label");
    }
    assert_eq!(manifest::LABEL_NETWORK, "mcp-k8s-ephemeral-job/network");
    assert_eq!(names, ["none", "restricted", "open"]);
}

#[test]
fn run_with_clone() {
    let mut spec = spec();
    spec.clone = Some(CloneSpec {
        repo_url: "https://git.example.com:8443/org/$(repo).git".into(),
        git_ref: "v1.2.0".into(),
        subdir: "src/repo".into(),
    });
    let mut policy = policy();
    policy.clone = Some(CloneStep { image: "mcp-k8s-test.local/git:2.39".into(), secret_name: "git-tokens".into() });
    let job = manifest::job(&spec, &policy, &cluster(), "0123abcd");
    check("clone.json", &job);
    // Only the clone init container sees the Secret.
    let pod = &job["spec"]["template"]["spec"];
    let mounts_creds = |container: &serde_json::Value| container["volumeMounts"].to_string().contains("git-creds");
    assert!(mounts_creds(&pod["initContainers"][1]));
    assert!(!mounts_creds(&pod["initContainers"][0]) && !mounts_creds(&pod["containers"][0]));
}

#[test]
fn clone_arguments_without_a_clone_step_add_nothing() {
    let mut spec = spec();
    spec.clone = Some(CloneSpec { repo_url: "https://h/r".into(), git_ref: "main".into(), subdir: String::new() });
    assert_eq!(manifest::job(&spec, &policy(), &cluster(), "0123abcd"), manifest::job(&self::spec(), &policy(), &cluster(), "0123abcd"));
}

/// The main container's root was writable with no
/// ephemeral-storage limit, and a job wrote 1.5 GB to /tmp.
#[test]
fn every_container_has_a_read_only_root_and_bounded_storage() {
    let mut spec = spec();
    spec.clone = Some(CloneSpec { repo_url: "https://h/r".into(), git_ref: "main".into(), subdir: String::new() });
    let mut policy = policy();
    policy.clone = Some(CloneStep { image: "git".into(), secret_name: "tokens".into() });
    let job = manifest::job(&spec, &policy, &cluster(), "0123abcd");
    let pod = &job["spec"]["template"]["spec"];
    let containers: Vec<&serde_json::Value> =
        pod["initContainers"].as_array().unwrap().iter().chain(pod["containers"].as_array().unwrap()).collect();
    assert_eq!(containers.len(), 3);
    for container in containers {
        let name = &container["name"];
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true, "{name}");
        assert!(container["resources"]["limits"]["ephemeral-storage"].is_string(), "{name}");
        assert!(container["resources"]["requests"]["ephemeral-storage"].is_string(), "{name}");
    }
    for volume in pod["volumes"].as_array().unwrap() {
        if volume.get("emptyDir").is_some() {
            assert!(volume["emptyDir"]["sizeLimit"].is_string(), "{volume}");
        }
    }
    // The workdir (1Gi) plus 256Mi for the log and the runner copy.
    let main = &pod["containers"][0];
    assert_eq!(main["resources"]["limits"]["ephemeral-storage"], ((1i64 << 30) + (256 << 20)).to_string());
}

#[test]
fn home_is_the_writable_tmp_unless_someone_set_it() {
    let home = |spec: &RunSpec, policy: &Policy| {
        let job = manifest::job(spec, policy, &cluster(), "0123abcd");
        let env = main_container(&job["spec"]["template"]["spec"])["env"].as_array().unwrap().clone();
        env.iter().find(|var| var["name"] == "HOME").map(|var| var["value"].as_str().unwrap().to_string())
    };
    assert_eq!(home(&spec(), &policy()).as_deref(), Some("/tmp"));
    let mut caller = spec();
    caller.env.insert("HOME".into(), "/work/home".into());
    assert_eq!(home(&caller, &policy()).as_deref(), Some("/work/home"));
    let mut operator = policy();
    operator.extra_env.insert("HOME".into(), "/cache/home".into());
    assert_eq!(home(&spec(), &operator).as_deref(), Some("/cache/home"));
}

#[test]
fn a_workdir_of_tmp_is_the_scratch_volume_itself() {
    let mounts = |workdir: &str| {
        let mut spec = spec();
        spec.workdir = workdir.into();
        let job = manifest::job(&spec, &policy(), &cluster(), "0123abcd");
        let pod = &job["spec"]["template"]["spec"];
        let paths: Vec<String> =
            main_container(pod)["volumeMounts"].as_array().unwrap().iter().map(|m| m["mountPath"].as_str().unwrap().to_string()).collect();
        let has_tmp_volume = pod["volumes"].as_array().unwrap().iter().any(|v| v["name"] == "tmp");
        (paths, has_tmp_volume)
    };
    assert_eq!(mounts("/tmp"), (vec!["/mcp/bin".to_string(), "/dev/shm".to_string(), "/tmp".to_string()], false));
    // A workdir under /tmp is mounted after /tmp, so it stays visible.
    assert_eq!(
        mounts("/tmp/src"),
        (vec!["/mcp/bin".to_string(), "/dev/shm".to_string(), "/tmp".to_string(), "/tmp/src".to_string()], true)
    );
}

/// The `main` container of a pod spec (`prepare` may be listed before it).
fn main_container(pod: &serde_json::Value) -> &serde_json::Value {
    pod["containers"].as_array().unwrap().iter().find(|container| container["name"] == "main").unwrap()
}

#[test]
fn no_files_no_secret() {
    assert!(manifest::inputs_secret(&spec(), &cluster(), "x", "uid").is_none());
}

#[test]
fn dollar_signs_reach_the_process_literally() {
    let cases = [("$(HOME)", "$$(HOME)"), ("$$", "$$$$"), ("a$b", "a$$b"), ("plain", "plain")];
    for (raw, escaped) in cases {
        assert_eq!(manifest::escape_dollars(raw), escaped);
    }
}

fn full_template() -> PodTemplate {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/pod-template/full.yaml");
    template::load(&path).unwrap_or_else(|error| panic!("{error}"))
}

/// The operator's template adds its fields, labels and
/// annotations to the pod, and nothing else of the Job changes.
#[test]
fn run_with_a_full_pod_template() {
    let template = full_template();
    let mut job = manifest::job(&spec(), &policy(), &cluster(), "0123abcd");
    manifest::apply_pod_template(&mut job, &template);
    check("pod-template.json", &job);
    let mut pod = job["spec"]["template"].clone();
    assert_eq!(pod["metadata"]["labels"]["team"], "platform");
    assert_eq!(pod["metadata"]["annotations"]["example.com/cost-center"], "42");
    assert_eq!(pod["spec"]["imagePullSecrets"][0]["name"], "registry-creds");
    // Without the template's own fields, the pod is the plain one: the
    // restricted Pod Security fields, containers and volumes are untouched.
    let plain = manifest::job(&spec(), &policy(), &cluster(), "0123abcd");
    for field in template.pod_spec.keys() {
        pod["spec"].as_object_mut().unwrap().remove(field);
    }
    pod["metadata"]["labels"].as_object_mut().unwrap().remove("team");
    pod["metadata"].as_object_mut().unwrap().remove("annotations");
    assert_eq!(pod, plain["spec"]["template"]);
    let mut without_pod = job.clone();
    without_pod["spec"]["template"] = serde_json::Value::Null;
    let mut plain_without_pod = plain.clone();
    plain_without_pod["spec"]["template"] = serde_json::Value::Null;
    assert_eq!(without_pod, plain_without_pod, "only the pod changes");
}

/// The server's own labels and `MCP_K8S_RUNTIME_CLASS` are never replaced
/// by the template's.
#[test]
fn the_template_never_replaces_what_the_server_set() {
    let mut template = full_template();
    template.labels.insert(manifest::LABEL_RUN_ID.into(), "someone-else".into());
    let cluster = Settings { runtime_class: Some("kata".into()), ..cluster() };
    let mut job = manifest::job(&spec(), &policy(), &cluster, "0123abcd");
    manifest::apply_pod_template(&mut job, &template);
    assert_eq!(job["spec"]["template"]["metadata"]["labels"][manifest::LABEL_RUN_ID], "0123abcd");
    assert_eq!(job["spec"]["template"]["spec"]["runtimeClassName"], "kata");
}

/// MCP_K8S_AWAIT_NETWORK_POLICY: `prepare` waits for the fence in the
/// modes the setting names, and does so as an init container (beside
/// `main`, its hook would hold the kubelet's pass that reports the pod's
/// IP, which kube-router fences by, and the wait would never end).
#[test]
fn awaiting_the_network_policy_makes_prepare_an_init_container_that_waits() {
    use NetworkMode::{None as Closed, Open, Restricted};
    let cases = [
        (FenceModes::Never, Closed, false),
        (FenceModes::Never, Open, false),
        (FenceModes::Closed, Closed, true),
        (FenceModes::Closed, Restricted, true),
        (FenceModes::Closed, Open, false),
        (FenceModes::All, Open, true),
    ];
    for (modes, network, waits) in cases {
        let cluster = Settings { await_network_policy: AwaitFence { modes, bound: Duration::from_secs(10) }, ..cluster() };
        let job = manifest::job(&RunSpec { network, ..spec() }, &policy(), &cluster, "0123abcd");
        let pod = &job["spec"]["template"]["spec"];
        let case = format!("{modes:?} {network:?}");
        if !waits {
            assert!(pod["initContainers"].as_array().is_none_or(|init| init.is_empty()), "{case}: {pod}");
            assert!(!pod.to_string().contains("--await-fence-ms"), "{case}");
            continue;
        }
        let init = pod["initContainers"].as_array().expect("init containers");
        assert_eq!(init.len(), 1, "{case}: {pod}");
        assert_eq!(init[0]["name"], "prepare");
        let command: Vec<&str> = init[0]["command"].as_array().unwrap().iter().filter_map(|arg| arg.as_str()).collect();
        let at = command.iter().position(|arg| *arg == "--await-fence-ms").expect("the fence wait");
        assert_eq!(command[at + 1], "10000", "{case}");
        assert!(init[0].get("lifecycle").is_none(), "no hook: nothing waits beside main");
        let names: Vec<&str> = pod["containers"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["main"], "{case}");
    }
}

/// A warm pool's Job: the cold Job of the pool's shape, whose main container
/// waits for its assignment, labelled with its pool and owner; and the key
/// Secret it owns. The Secret is mounted into `prepare` alone, which copies
/// the key into a folder in memory that the main container's runner takes
/// it from (and removes it): never into the main container, where the
/// command could read it.
#[test]
fn a_pool_job_waits_for_its_assignment_with_the_key_secret_in_prepare_only() {
    let sandbox = manifest::PoolSandbox { pool: "py", owner: "0123456789ab", max_wait: Duration::from_secs(780), preload: None };
    let mut pool_spec = spec();
    pool_spec.command = Vec::new();
    pool_spec.env = BTreeMap::new();
    let job = manifest::pool_job(&pool_spec, &policy(), &cluster(), "0123456789abcdef0123456789abcdef", &sandbox);
    check("pool_job.json", &job);
    let pod_spec = &job["spec"]["template"]["spec"];
    let mounting = |volume: &str| -> Vec<&str> {
        pod_spec["containers"]
            .as_array()
            .into_iter()
            .chain(pod_spec["initContainers"].as_array())
            .flatten()
            .filter(|container| {
                container["volumeMounts"].as_array().is_some_and(|mounts| mounts.iter().any(|mount| mount["name"] == volume))
            })
            .map(|container| container["name"].as_str().unwrap_or_default())
            .collect()
    };
    assert_eq!(mounting("mcp-key-secret"), ["prepare"], "only prepare sees the key Secret");
    assert_eq!(mounting("mcp-key"), ["prepare", "main"], "prepare hands the key to the runner");
    let prepare = pod_spec["containers"].as_array().unwrap().iter().find(|container| container["name"] == "prepare").unwrap();
    let command = prepare["command"].to_string();
    assert!(command.contains(r#""--key-from","/mcp/key-secret/key","--key-to","/mcp-key/key""#), "{command}");
    for labels in [&job["metadata"]["labels"], &job["spec"]["template"]["metadata"]["labels"]] {
        assert_eq!(
            (labels[manifest::LABEL_POOL].as_str(), labels[manifest::LABEL_POOL_OWNER].as_str()),
            (Some("py"), Some("0123456789ab"))
        );
    }
    let secret = manifest::key_secret(&cluster(), "0123456789abcdef0123456789abcdef", "uid-1", "00ff");
    check("pool_key_secret.json", &secret);
}

/// An open sandbox's Job: a pool Job's shape whose runner takes call after
/// call until its lifetime's end, the Job's and the pod's deadlines its
/// lifetime's, labelled with the sandbox's name (never its id).
#[test]
fn an_open_sandboxs_job_takes_calls_for_its_lifetime() {
    let mut shape = spec();
    shape.command = Vec::new();
    shape.env = BTreeMap::new();
    let lifetime = Duration::from_secs(3600);
    let job = manifest::session_job(&shape, &policy(), &cluster(), "0123456789abcdef0123456789abcdef", Duration::from_secs(630), lifetime);
    let pod_spec = &job["spec"]["template"]["spec"];
    assert_eq!(pod_spec["activeDeadlineSeconds"], 3600);
    assert_eq!(job["spec"]["activeDeadlineSeconds"], 3600 + manifest::JOB_DEADLINE_SLACK.as_secs());
    for labels in [&job["metadata"]["labels"], &job["spec"]["template"]["metadata"]["labels"]] {
        assert_eq!(labels[manifest::LABEL_SANDBOX], "0123456789abcdef0123456789abcdef");
        assert!(labels.get(manifest::LABEL_POOL).is_none(), "no pool lists it");
    }
    let main = pod_spec["containers"].as_array().unwrap().iter().find(|c| c["name"] == "main").unwrap();
    let command: Vec<&str> = main["command"].as_array().unwrap().iter().filter_map(|arg| arg.as_str()).collect();
    let at = command.iter().position(|arg| *arg == "--session-until-ms").expect("a session's runner");
    assert!(command[at + 1].parse::<u64>().is_ok(), "{command:?}");
    let wait = command.iter().position(|arg| *arg == "--max-wait-ms").unwrap();
    assert_eq!(command[wait + 1], "630000");
    assert_eq!(main["ports"][0]["containerPort"], 7777);
}

/// The start deadline goes onto the main container's runner, before the
/// command's `--`, and nowhere else.
#[test]
fn the_start_deadline_reaches_the_main_runner_only() {
    let mut job = manifest::job(&spec(), &policy(), &cluster(), "0123abcd");
    let before = job.clone();
    manifest::apply_start_deadline(&mut job, 1_800_000_000_000);
    let containers = job["spec"]["template"]["spec"]["containers"].as_array().unwrap().clone();
    for (index, container) in containers.iter().enumerate() {
        let command: Vec<&str> = container["command"].as_array().unwrap().iter().filter_map(|arg| arg.as_str()).collect();
        if container["name"] == "main" {
            let at = command.iter().position(|arg| *arg == "--start-deadline-ms").expect("the deadline is given");
            assert_eq!(command[at + 1], "1800000000000");
            assert!(at < command.iter().position(|arg| *arg == "--").unwrap(), "before the command: {command:?}");
        } else {
            assert_eq!(container, &before["spec"]["template"]["spec"]["containers"][index], "only main changes");
        }
    }
}

/// A background run's fence wait lasts until the deadline given, on the
/// `prepare` step that waits; a job whose `prepare` does not wait is left
/// as it is.
#[test]
fn a_fence_deadline_reaches_only_a_prepare_step_that_waits() {
    let waiting = Settings { await_network_policy: AwaitFence { modes: FenceModes::Closed, bound: Duration::from_secs(10) }, ..cluster() };
    let mut job = manifest::job(&RunSpec { network: NetworkMode::None, ..spec() }, &policy(), &waiting, "0123abcd");
    manifest::apply_fence_deadline(&mut job, 1_800_000_000_000);
    let init = &job["spec"]["template"]["spec"]["initContainers"][0];
    let command: Vec<&str> = init["command"].as_array().unwrap().iter().filter_map(|arg| arg.as_str()).collect();
    let at = command.iter().position(|arg| *arg == "--await-fence-until-ms").expect("the deadline is given");
    assert_eq!(command[at + 1], "1800000000000");
    for network in [NetworkMode::Open, NetworkMode::None] {
        let cluster = if network == NetworkMode::Open { waiting.clone() } else { cluster() };
        let mut job = manifest::job(&RunSpec { network, ..spec() }, &policy(), &cluster, "0123abcd");
        let before = job.clone();
        manifest::apply_fence_deadline(&mut job, 1_800_000_000_000);
        assert_eq!(job, before, "{network:?}: nothing waits, nothing changes");
    }
}

#[test]
fn with_an_output_store_the_runner_holds_output_in_a_volume_of_its_own_for_the_server_to_fetch() {
    let store = mcp_k8s_ephemeral_job::outputs::Store::new(
        std::path::Path::new("/var/lib/outputs"),
        256 << 20,
        10 << 30,
        Duration::from_secs(3600),
    );
    let with_store = Policy { outputs: Some(std::sync::Arc::new(store)), ..policy() };
    let run_id = "0123456789abcdef0123456789abcdef";
    let job = manifest::job(&spec(), &with_store, &cluster(), run_id);
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(job["spec"]["template"]["metadata"]["labels"]["mcp-k8s-ephemeral-job/outputs"], "held", "what the ingress policy selects");
    let held = pod["volumes"].as_array().unwrap().iter().find(|volume| volume["name"] == "held").expect("a held volume");
    assert_eq!(held["emptyDir"]["sizeLimit"], ((256u64 << 20) * 3 / 2 + (16 << 20)).to_string(), "base64 frames of the run's share");
    let main = main_container(pod);
    let command: Vec<&str> = main["command"].as_array().unwrap().iter().map(|arg| arg.as_str().unwrap()).collect();
    let digest = mcp_k8s_ephemeral_job::sandbox::held::digest(&mcp_k8s_ephemeral_job::sandbox::held::key(run_id));
    let at = command.iter().position(|arg| *arg == "--hold-key-sha256").expect("the key's digest");
    assert_eq!(command[at + 1], digest, "the digest of the run's key, never the key");
    assert!(command.windows(2).any(|pair| pair == ["--hold-port", "7777"]));
    assert!(main["volumeMounts"].as_array().unwrap().iter().any(|mount| mount["mountPath"] == "/mcp/held"));
    let storage = main["resources"]["limits"]["ephemeral-storage"].as_str().unwrap().parse::<u64>().unwrap();
    assert!(storage >= (1 << 30) + (256 << 20) * 3 / 2, "the held volume counts in the main container's storage limit: {storage}");
    let plain = manifest::job(&spec(), &policy(), &cluster(), run_id);
    assert!(!plain.to_string().contains("hold"), "no store, nothing held");
}
