//! The operator's pod template (`MCP_K8S_POD_TEMPLATE`) on the
//! real test cluster: a nodeSelector the node has (label added by the test)
//! schedules the run and one no node has fails fast `Unschedulable` naming
//! the selector; a NoSchedule taint only the template tolerates; extra
//! labels, annotations and imagePullSecrets reach the pod; `doctor` names
//! a missing pull Secret; a forbidden field stops the start.
//!
//! The cluster has one node that every test of this binary shares, so the
//! taint is held for seconds only (until both pods were looked at by the
//! scheduler) and always removed by a guard; labels added to the node are
//! unique and removed the same way.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::cluster::{self, BUSYBOX, NAMESPACE};
use crate::support::faults::{self, Cleanup};
use crate::support::server::StdioServer;
use mcp_k8s_ephemeral_job::kube;
use serde_json::{Value, json};

const NODES: kube::Resource = kube::Resource { api_path: "/api/v1", plural: "nodes", namespaced: false };

#[test]
fn a_node_selector_the_node_has_schedules_and_one_no_node_has_fails_fast() {
    let label = cluster::unique_name("mcp-test-pool");
    let _label = NodeLabel::add(&label);
    let template = TemplateFile::write("selector", &format!("nodeSelector:\n  {label}: \"yes\"\n"));
    let mut server = server_with(&template);
    let out = faults::ok(&mut server, "run_job", json!({"image": BUSYBOX, "command": ["echo", "placed"]}));
    assert_eq!((out["status"].as_str(), out["stdout"].as_str()), (Some("succeeded"), Some("placed\n")), "{out}");
    cluster::assert_nothing_left(out["run_id"].as_str().unwrap());

    let missing = TemplateFile::write("no-node", &format!("nodeSelector:\n  {label}-missing: \"yes\"\n"));
    let mut server = server_with(&missing);
    let started = Instant::now();
    let out = faults::ok(&mut server, "run_job", json!({"image": BUSYBOX, "command": ["true"]}));
    assert_eq!((out["status"].as_str(), out["reason"].as_str()), (Some("error"), Some("Unschedulable")), "{out}");
    let message = out["message"].as_str().unwrap_or_default();
    assert!(message.contains("node affinity/selector"), "the scheduler's reason is said: {out}");
    assert!(started.elapsed() < Duration::from_secs(60), "well before the start timeout: {:?}", started.elapsed());
    cluster::assert_nothing_left(out["run_id"].as_str().unwrap());
}

/// The taint stays only until the scheduler has seen both pods: the one
/// whose template tolerates it is bound, the other is refused with the
/// taint named (what the server turns into `Unschedulable` after its
/// grace). Once bound, a NoSchedule taint no longer concerns the pod.
#[test]
fn a_taint_only_the_templates_toleration_allows() {
    let key = format!("mcp-test.local/{}", cluster::unique_name("sandbox"));
    let template = TemplateFile::write(
        "toleration",
        &format!("tolerations:\n  - key: {key}\n    operator: Equal\n    value: \"yes\"\n    effect: NoSchedule\n"),
    );
    let mut tolerating = server_with(&template);
    let mut plain = cluster::server(&[]);
    let command = json!({"image": BUSYBOX, "command": ["sh", "-c", "sleep 2; echo tolerated"]});

    let taint = NodeTaint::add(&key);
    let tolerated = faults::submit(&mut tolerating, command.clone());
    let refused = faults::submit(&mut plain, json!({"image": BUSYBOX, "command": ["true"]}));
    let (tolerated_id, refused_id) = (faults::run_id_of(&tolerated), faults::run_id_of(&refused));
    let _cleanup = Cleanup(vec![tolerated_id.clone(), refused_id.clone()]);
    let bound = wait_for_pod(&tolerated_id, |pod| pod["spec"]["nodeName"].is_string());
    let pending = wait_for_pod(&refused_id, |pod| scheduling_message(pod).is_some());
    drop(taint);
    assert!(pod_tolerates(&bound, &key), "{}", bound["spec"]["tolerations"]);
    let message = scheduling_message(&pending).unwrap_or_default();
    assert!(message.contains("untolerated taint"), "the plain pod is refused for the taint: {message}");
    assert!(pending["spec"]["nodeName"].is_null(), "{}", pending["spec"]);

    let done = faults::fetch_done(&mut tolerating, &tolerated, Duration::from_secs(120));
    assert_eq!((done["result"]["status"].as_str(), done["result"]["stdout"].as_str()), (Some("succeeded"), Some("tolerated\n")), "{done}");
}

#[test]
fn labels_annotations_and_pull_secrets_reach_the_pod() {
    let secret = PullSecret::create();
    let template = TemplateFile::write(
        "metadata",
        &format!(
            "labels:\n  team: platform\nannotations:\n  example.com/cost-center: \"42\"\nimagePullSecrets:\n  - name: {}\n",
            secret.name
        ),
    );
    let mut server = server_with(&template);
    let token = faults::submit(&mut server, json!({"image": BUSYBOX, "command": ["sleep", "1"]}));
    let run_id = faults::run_id_of(&token);
    let _cleanup = Cleanup(vec![run_id.clone()]);
    let pod = wait_for_pod(&run_id, |_| true);
    let metadata = &pod["metadata"];
    assert_eq!(metadata["labels"]["team"], "platform", "{metadata}");
    assert_eq!(metadata["labels"]["mcp-k8s-ephemeral-job/run-id"], run_id.as_str(), "the server's own label stays: {metadata}");
    assert_eq!(metadata["annotations"]["example.com/cost-center"], "42", "{metadata}");
    assert_eq!(pod["spec"]["imagePullSecrets"], json!([{"name": secret.name}]), "{}", pod["spec"]);
    let done = faults::fetch_done(&mut server, &token, Duration::from_secs(120));
    assert_eq!(done["result"]["status"], "succeeded", "{done}");
}

/// The pull Secret check looks for the Secret by name without `get` on it
/// (a metadata-only list: one present, one missing);
/// the RuntimeClass check is optional (cluster-scoped, the Role cannot
/// grant it) and says so.
#[test]
fn doctor_names_a_missing_pull_secret_and_an_unreadable_runtime_class() {
    let present = PullSecret::create();
    let missing = cluster::unique_name("no-such-registry-creds");
    let template = TemplateFile::write(
        "doctor",
        &format!("runtimeClassName: gvisor\nimagePullSecrets:\n  - name: {}\n  - name: {missing}\n", present.name),
    );
    let mut env = cluster::server_env();
    env.push(("MCP_K8S_POD_TEMPLATE".into(), template.path_text()));
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    // The check jobs would wait for a RuntimeClass the cluster lacks: only
    // the lines before them matter here, so a short start timeout.
    let output =
        crate::support::server::command(&[env.as_slice(), &[("MCP_K8S_START_TIMEOUT_S", "5")]].concat()).arg("doctor").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    let expected = format!("FAIL  imagePullSecrets: Secret `{missing}` does not exist in namespace `{NAMESPACE}`");
    assert!(stdout.contains(&expected), "missing `{expected}` in:\n{stdout}");
    // Found through the metadata-only list, whose items carry no data.
    let expected = format!("ok    imagePullSecrets: Secret `{}` exists in `{NAMESPACE}`", present.name);
    assert!(stdout.contains(&expected), "missing `{expected}` in:\n{stdout}");
    assert!(stdout.contains("ok    RuntimeClass `gvisor`: not checked (cluster-scoped"), "{stdout}");
}

#[test]
fn a_forbidden_template_field_stops_the_start_naming_it() {
    let template = TemplateFile::write("forbidden", "nodeSelector:\n  pool: a\nhostNetwork: true\n");
    let mut env = cluster::server_env();
    env.push(("MCP_K8S_POD_TEMPLATE".into(), template.path_text()));
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let output = crate::support::server::command(&env).arg("serve").stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let expected = format!("MCP_K8S_POD_TEMPLATE: `{}`: field `hostNetwork` is forbidden", template.path_text());
    assert!(stderr.contains(&expected), "got: {stderr}\nwant: {expected}");
    assert!(output.stdout.is_empty(), "stdout belongs to the protocol");
}

// ---------------------------------------------------------------------------
// helpers

fn server_with(template: &TemplateFile) -> StdioServer {
    cluster::server(&[("MCP_K8S_POD_TEMPLATE", &template.path_text())])
}

/// Polls the run's pods until one satisfies `ready`.
fn wait_for_pod(run_id: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(pod) = faults::pods_of(run_id).into_iter().find(|pod| ready(pod)) {
            return pod;
        }
        assert!(Instant::now() < deadline, "no pod of run {run_id} as expected within 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The scheduler's refusal on a pending pod (`PodScheduled` false).
fn scheduling_message(pod: &Value) -> Option<String> {
    let conditions = pod["status"]["conditions"].as_array()?;
    let condition = conditions.iter().find(|condition| condition["type"] == "PodScheduled" && condition["status"] == "False")?;
    Some(condition["message"].as_str().unwrap_or_default().to_string())
}

fn pod_tolerates(pod: &Value, key: &str) -> bool {
    pod["spec"]["tolerations"].as_array().is_some_and(|tolerations| tolerations.iter().any(|toleration| toleration["key"] == key))
}

fn the_node() -> String {
    let nodes = cluster::admin_client().list(NODES, "", &kube::ListParams::default()).expect("list nodes");
    assert_eq!(nodes.items.len(), 1, "the test cluster has one node");
    nodes.items[0]["metadata"]["name"].as_str().expect("a node name").to_string()
}

/// A label on the node, removed when dropped.
struct NodeLabel {
    node: String,
    key: String,
}

impl NodeLabel {
    fn add(key: &str) -> NodeLabel {
        let node = the_node();
        let patch = json!({"metadata": {"labels": {key: "yes"}}});
        cluster::admin_client().merge_patch(NODES, "", &node, &patch).expect("label the node");
        NodeLabel { node, key: key.to_string() }
    }
}

impl Drop for NodeLabel {
    fn drop(&mut self) {
        let patch = json!({"metadata": {"labels": {&self.key: null}}});
        if let Err(error) = cluster::admin_client().merge_patch(NODES, "", &self.node, &patch) {
            eprintln!("could not remove the node label `{}`: {error}", self.key);
        }
    }
}

/// A NoSchedule taint on the node, removed when dropped. A merge patch
/// replaces the whole `taints` list, so the guard writes back the list it
/// found (the test cluster's node has none of its own, usually).
struct NodeTaint {
    node: String,
    before: Value,
}

impl NodeTaint {
    fn add(key: &str) -> NodeTaint {
        let node = the_node();
        let client = cluster::admin_client();
        let current = client.get(NODES, "", &node).expect("read the node");
        let before = current["spec"]["taints"].clone();
        let mut taints = before.as_array().cloned().unwrap_or_default();
        taints.push(json!({"key": key, "value": "yes", "effect": "NoSchedule"}));
        client.merge_patch(NODES, "", &node, &json!({"spec": {"taints": taints}})).expect("taint the node");
        NodeTaint { node, before }
    }
}

impl Drop for NodeTaint {
    fn drop(&mut self) {
        let patch = json!({"spec": {"taints": self.before}});
        if let Err(error) = cluster::admin_client().merge_patch(NODES, "", &self.node, &patch) {
            eprintln!("could not remove the test taint from node `{}`: {error}; remove it by hand (kubectl taint)", self.node);
        }
    }
}

/// A template file in a directory of its own, removed when dropped.
struct TemplateFile {
    dir: PathBuf,
    path: PathBuf,
}

impl TemplateFile {
    fn write(name: &str, text: &str) -> TemplateFile {
        let dir = std::env::temp_dir().join(cluster::unique_name(&format!("mcp-pod-template-{name}")));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pod-template.yaml");
        std::fs::write(&path, text).unwrap();
        TemplateFile { dir, path }
    }

    fn path_text(&self) -> String {
        self.path.display().to_string()
    }
}

impl Drop for TemplateFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A docker-registry Secret with no credentials in it: enough for the pod
/// to name it; the busybox image is on the node already.
struct PullSecret {
    name: String,
}

impl PullSecret {
    fn create() -> PullSecret {
        let name = cluster::unique_name("registry-creds");
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": name},
            "data": {".dockerconfigjson": "eyJhdXRocyI6e319"},
        });
        cluster::admin_client().create(kube::Resource::SECRETS, NAMESPACE, &secret).expect("create the pull Secret");
        PullSecret { name }
    }
}

impl Drop for PullSecret {
    fn drop(&mut self) {
        let _ = cluster::admin_client().delete(kube::Resource::SECRETS, NAMESPACE, &self.name);
    }
}
