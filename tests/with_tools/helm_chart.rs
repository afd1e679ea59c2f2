//! The Helm chart (`deploy/helm/mcp-k8s-ephemeral-job`) against the
//! kustomize base (`deploy/`): with default values it renders the same
//! objects, object by object, apart from the differences named in
//! `HELM_ONLY_LABELS`; `helm lint` passes; and its values do what
//! values.yaml says (namespaces, image, auth Secret, pod template). No
//! cluster needed, but the `helm` and `kubectl` binaries are: a missing one
//! fails the test naming the script that builds it, never skips it.
//!
//! It does not know what the objects mean (`deploy_manifests.rs` and
//! `deploy_role.rs` check the base against the code); sameness with the
//! base carries those checks over to the chart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use mcp_k8s_ephemeral_job::backend::kubernetes::template;
use serde_json::{Value, json};

use crate::support::TempDir;
use crate::support::cluster;

/// Labels the chart adds to every object's `metadata.labels` and the base
/// does not have. They are Helm's recommended labels, which tools such as
/// `helm list`, dashboards and `kubectl get -l app.kubernetes.io/instance=...`
/// rely on. They are never on a selector or on the server's pod template, so
/// nothing selects differently; the job pods' `app.kubernetes.io/managed-by:
/// mcp-k8s-ephemeral-job` lives on Jobs the server creates, not on these objects.
const HELM_ONLY_LABELS: [&str; 4] =
    ["helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"];

const RELEASE: &str = "mcp-k8s-ephemeral-job";

/// The token Secret every render names unless a test says otherwise (the
/// chart requires it): the base's, which an operator creates first.
const GIVEN_SECRET: &str = "auth.secretName=mcp-k8s-ephemeral-job-auth";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart_dir() -> PathBuf {
    repo().join("deploy/helm/mcp-k8s-ephemeral-job")
}

/// A binary of the cluster's cache; panics naming the script that builds it.
pub fn cached_binary(name: &str, script: &str) -> PathBuf {
    let path = cluster::cache_dir().join("bin").join(name);
    assert!(path.exists(), "{} is missing: run `{script}` (it builds {name} from the Go module proxy into the cache)", path.display());
    path
}

fn helm() -> Command {
    let mut command = Command::new(cached_binary("helm", "tests/cluster/build-helm"));
    // Helm's own config and cache dirs: not the user's, and not shared between tests.
    let home = std::env::temp_dir().join(format!("mcp-helm-home-{}", std::process::id()));
    command
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"));
    command
}

/// Runs a command; its stdout, or the stderr when it fails.
fn output(mut command: Command) -> Result<String, String> {
    let output = command.output().map_err(|error| format!("cannot start {command:?}: {error}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{command:?}: {}\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn helm_template(values: &[&Path], set: &[&str]) -> Result<String, String> {
    let mut command = helm();
    command.arg("template").arg(RELEASE).arg(chart_dir()).arg("--set").arg(GIVEN_SECRET);
    for file in values {
        command.arg("--values").arg(file);
    }
    for assignment in set {
        command.arg("--set").arg(assignment);
    }
    output(command)
}

fn kustomize() -> String {
    let mut command = Command::new(cached_binary("kubectl", "tests/cluster/build-kube"));
    command.arg("kustomize").arg(repo().join("deploy"));
    output(command).unwrap_or_else(|error| panic!("{error}"))
}

/// The objects of a multi-document YAML stream, by `Kind namespace/name`.
fn objects(yaml: &str) -> BTreeMap<String, Value> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap_or_else(|error| panic!("{error}\n{yaml}"));
    let mut objects = BTreeMap::new();
    for object in documents.into_iter().filter(|document| !document.is_null()) {
        let key = format!(
            "{} {}/{}",
            object["kind"].as_str().unwrap_or("?"),
            object["metadata"]["namespace"].as_str().unwrap_or(""),
            object["metadata"]["name"].as_str().unwrap_or("?")
        );
        assert!(objects.insert(key.clone(), object).is_none(), "{key} twice");
    }
    objects
}

fn render(values: &[&Path], set: &[&str]) -> BTreeMap<String, Value> {
    objects(&helm_template(values, set).unwrap_or_else(|error| panic!("{error}")))
}

/// The object without the labels of `HELM_ONLY_LABELS`.
fn without_helm_labels(mut object: Value) -> Value {
    if let Some(labels) = object["metadata"]["labels"].as_object_mut() {
        for label in HELM_ONLY_LABELS {
            labels.remove(label);
        }
    }
    object
}

fn deployment(objects: &BTreeMap<String, Value>, namespace: &str) -> Value {
    let key = format!("Deployment {namespace}/mcp-k8s-ephemeral-job");
    objects.get(&key).unwrap_or_else(|| panic!("no {key} in {:?}", objects.keys())).clone()
}

/// The server container's env entry `name` (null when absent).
fn env_var(deployment: &Value, name: &str) -> Value {
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"].as_array().cloned().unwrap_or_default();
    env.into_iter().find(|var| var["name"] == name).unwrap_or(Value::Null)
}

fn env_value(deployment: &Value, name: &str) -> Value {
    env_var(deployment, name)["value"].clone()
}

#[test]
fn helm_lint_passes() {
    let mut command = helm();
    command.arg("lint").arg("--strict").arg(chart_dir()).arg("--set").arg(GIVEN_SECRET);
    output(command).unwrap_or_else(|error| panic!("{error}"));
}

#[test]
fn default_values_render_the_kustomize_base() {
    let mut chart = render(&[], &[]);
    // `helm test`'s pod is the chart's own; it never runs with the release.
    chart.retain(|_, object| object["metadata"]["annotations"]["helm.sh/hook"].is_null());
    let base = objects(&kustomize());
    let chart_keys: Vec<&String> = chart.keys().collect();
    let base_keys: Vec<&String> = base.keys().collect();
    assert_eq!(chart_keys, base_keys, "the chart and deploy/ render different objects");
    for (key, object) in chart {
        let labels = &object["metadata"]["labels"];
        for label in HELM_ONLY_LABELS {
            assert!(labels[label].is_string(), "{key} lacks Helm's label {label}");
        }
        let chart_object = without_helm_labels(object);
        assert_eq!(chart_object, base[&key], "{key} differs from deploy/ (left: chart, right: kustomize)");
    }
}

#[test]
fn values_move_the_namespaces_and_the_image_together() {
    let objects = render(
        &[],
        &[
            "namespaces.server=team-sys,namespaces.jobs=team-jobs",
            "image.repository=registry.example.com/mirror/mcp-k8s-ephemeral-job,image.tag=9.9.9,image.pullPolicy=Always",
            "allowedImages={busybox:1.36,golang:*}",
        ],
    );
    for (key, object) in &objects {
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
        assert!(["", "team-sys", "team-jobs"].contains(&namespace), "{key} is outside the two namespaces of the values");
    }
    assert!(objects.contains_key("Role team-jobs/mcp-k8s-ephemeral-job"));
    let binding = &objects["RoleBinding team-jobs/mcp-k8s-ephemeral-job"];
    assert_eq!(binding["subjects"][0]["namespace"], "team-sys");
    let server = deployment(&objects, "team-sys");
    let container = &server["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example.com/mirror/mcp-k8s-ephemeral-job:9.9.9");
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(env_value(&server, "MCP_K8S_RUNNER_IMAGE"), container["image"], "jobs use the server's image");
    assert_eq!(env_value(&server, "MCP_K8S_NAMESPACE"), "team-jobs");
    assert_eq!(env_value(&server, "MCP_K8S_ALLOWED_IMAGES"), "busybox:1.36,golang:*");
}

#[test]
fn the_auth_secret_is_created_only_when_asked_and_never_empty() {
    let created = render(&[], &["auth.create=true,auth.token=a-long-random-token"]);
    let secret = &created["Secret mcp-system/mcp-k8s-ephemeral-job-auth"];
    assert_eq!(secret["stringData"]["token"], "a-long-random-token");
    let server = deployment(&created, "mcp-system");
    let reference = &env_var(&server, "MCP_K8S_AUTH_TOKEN")["valueFrom"]["secretKeyRef"];
    assert_eq!(reference, &json!({"name": "mcp-k8s-ephemeral-job-auth", "key": "token"}));

    let existing = render(&[], &["auth.secretName=tokens,auth.secretKey=mcp"]);
    assert!(!existing.keys().any(|key| key.starts_with("Secret ")), "an existing Secret is not rendered: {:?}", existing.keys());
    let server = deployment(&existing, "mcp-system");
    let reference = &env_var(&server, "MCP_K8S_AUTH_TOKEN")["valueFrom"]["secretKeyRef"];
    assert_eq!(reference, &json!({"name": "tokens", "key": "mcp"}));

    let refused = helm_template(&[], &["auth.create=true"]).expect_err("an empty token must be refused");
    assert!(refused.contains("auth.token is empty"), "{refused}");
}

#[test]
fn one_namespace_for_server_and_jobs_is_refused() {
    let refused = helm_template(&[], &["namespaces.server=shared,namespaces.jobs=shared"]).expect_err("must be refused");
    assert!(refused.contains("must differ"), "{refused}");
}

#[test]
fn the_pod_template_is_mounted_and_the_server_accepts_it() {
    let fixture = repo().join("fixtures/pod-template/full.yaml");
    let text = std::fs::read_to_string(&fixture).unwrap_or_else(|error| panic!("{}: {error}", fixture.display()));
    let wanted: Value = serde_saphyr::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", fixture.display()));
    let temp = TempDir::new("helm-values");
    // JSON is YAML: the fixture as the value of podTemplate.
    let values = temp.write("values.yaml", &json!({"podTemplate": wanted}).to_string());
    let objects = render(&[&values], &[]);

    let config_map = &objects["ConfigMap mcp-system/mcp-k8s-ephemeral-job-pod-template"];
    let file = config_map["data"]["pod-template.yaml"].as_str().expect("the ConfigMap holds pod-template.yaml");
    let rendered: Value = serde_saphyr::from_str(file).unwrap_or_else(|error| panic!("{error}\n{file}"));
    assert_eq!(rendered, wanted, "the ConfigMap's file is the values' podTemplate");
    let path = Path::new("/etc/mcp-k8s-ephemeral-job/pod-template.yaml");
    template::parse(file.as_bytes(), path).unwrap_or_else(|error| panic!("the server would refuse the chart's file: {error}\n{file}"));

    let server = deployment(&objects, "mcp-system");
    assert_eq!(env_value(&server, "MCP_K8S_POD_TEMPLATE"), "/etc/mcp-k8s-ephemeral-job/pod-template.yaml");
    let pod = &server["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["volumeMounts"][0]["mountPath"], "/etc/mcp-k8s-ephemeral-job");
    assert_eq!(pod["volumes"][0]["configMap"]["name"], "mcp-k8s-ephemeral-job-pod-template");
    assert_eq!(pod["containers"][0]["volumeMounts"][0]["name"], pod["volumes"][0]["name"]);
    assert!(
        server["spec"]["template"]["metadata"]["annotations"]["checksum/pod-template"].is_string(),
        "a changed template restarts the server"
    );
}

#[test]
fn an_outputs_claim_is_mounted_where_the_server_keeps_large_outputs() {
    let objects = render(&[], &["outputs.existingClaim=shared-outputs", "outputs.maxRunBytes=1048576"]);
    let server = deployment(&objects, "mcp-system");
    assert_eq!(env_value(&server, "MCP_K8S_OUTPUTS_DIR"), "/var/lib/mcp-k8s-ephemeral-job/outputs");
    assert_eq!(env_value(&server, "MCP_K8S_OUTPUTS_MAX_RUN_BYTES"), "1048576");
    assert_eq!(env_value(&server, "MCP_K8S_OUTPUTS_MAX_BYTES"), "10737418240");
    let pod = &server["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"][0]["persistentVolumeClaim"]["claimName"], "shared-outputs");
    assert_eq!(pod["containers"][0]["volumeMounts"][0]["mountPath"], "/var/lib/mcp-k8s-ephemeral-job/outputs");
    assert_eq!(pod["securityContext"]["fsGroup"], 65532, "the server's group may write the volume");
    let role = &objects["Role mcp-ephemeral/mcp-k8s-ephemeral-job-outputs"];
    assert_eq!(role["rules"][0]["resources"][0], "pods/proxy", "the server may fetch what a runner holds");
    let policy = &objects["NetworkPolicy mcp-ephemeral/mcp-ephemeral-jobs-held-output"];
    assert_eq!(policy["spec"]["podSelector"]["matchLabels"]["mcp-k8s-ephemeral-job/outputs"], "held");
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], 7777);
    let plain_objects = render(&[], &[]);
    assert!(!plain_objects.contains_key("Role mcp-ephemeral/mcp-k8s-ephemeral-job-outputs"), "no store, no pods/proxy");
    let plain = deployment(&plain_objects, "mcp-system");
    assert!(plain["spec"]["template"]["spec"]["volumes"].is_null(), "no claim, no volume");
    assert!(env_var(&plain, "MCP_K8S_OUTPUTS_DIR").is_null());
}

#[test]
fn the_chart_version_and_app_version_are_the_crate_version() {
    let path = chart_dir().join("Chart.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let chart: Value = serde_saphyr::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    assert_eq!(chart["version"], env!("CARGO_PKG_VERSION"), "{}", path.display());
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"), "the default image tag; {}", path.display());
}

#[test]
fn network_service_and_env_values_land_where_values_yaml_says() {
    let temp = TempDir::new("helm-values");
    let values = temp.write(
        "values.yaml",
        &json!({
            "namespaces": {"create": false},
            "imagePullSecrets": [{"name": "regcred"}],
            "jobsEgress": [{"to": [{"ipBlock": {"cidr": "203.0.113.10/32"}}], "ports": [{"protocol": "TCP", "port": 443}]}],
            "serverIngressFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agents"}}}],
            "service": {"type": "NodePort"},
            "extraEnv": [{"name": "MCP_K8S_LOG_LEVEL", "value": "debug"}],
        })
        .to_string(),
    );
    let objects = render(&[&values], &[]);
    assert!(!objects.keys().any(|key| key.starts_with("Namespace ")), "namespaces.create=false: {:?}", objects.keys());
    let jobs = &objects["NetworkPolicy mcp-ephemeral/mcp-ephemeral-jobs-restricted"]["spec"]["egress"];
    assert_eq!(jobs.as_array().map(Vec::len), Some(2), "DNS, then jobsEgress: {jobs}");
    assert_eq!(jobs[1]["to"][0]["ipBlock"]["cidr"], "203.0.113.10/32");
    // DNS goes to the cluster's resolver only, never to any address on 53.
    assert_eq!(jobs[0]["to"][0]["podSelector"]["matchLabels"]["k8s-app"], "kube-dns", "{jobs}");
    assert_eq!(jobs[0]["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "kube-system", "{jobs}");
    let server = &objects["NetworkPolicy mcp-system/mcp-k8s-ephemeral-job"]["spec"]["ingress"][0];
    assert_eq!(server["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "agents");
    assert_eq!(server["ports"][0]["port"], 8080, "still the HTTP port only");
    assert_eq!(objects["Service mcp-system/mcp-k8s-ephemeral-job"]["spec"]["type"], "NodePort");
    let deployment = deployment(&objects, "mcp-system");
    assert_eq!(deployment["spec"]["template"]["spec"]["imagePullSecrets"][0]["name"], "regcred");
    assert_eq!(env_value(&deployment, "MCP_K8S_LOG_LEVEL"), "debug");
}

#[test]
fn an_install_without_its_token_secret_fails_naming_the_value_and_the_fix() {
    let refused = helm_template(&[], &["auth.secretName="]).expect_err("no token Secret must be refused");
    assert!(refused.contains("auth.secretName is required"), "{refused}");
    assert!(refused.contains("kubectl -n mcp-system create secret generic mcp-k8s-ephemeral-job-auth"), "names the fix: {refused}");
    assert!(refused.contains("auth.create=true"), "names the other way: {refused}");

    let created = render(&[], &["auth.secretName=,auth.create=true,auth.token=a-long-random-token"]);
    assert!(created.contains_key("Secret mcp-system/mcp-k8s-ephemeral-job-auth"), "a created Secret has the base's name by default");
}

#[test]
fn service_monitor_and_prometheus_rule_render_only_when_enabled() {
    let plain = render(&[], &[]);
    assert!(!plain.keys().any(|key| key.starts_with("ServiceMonitor ") || key.starts_with("PrometheusRule ")), "off by default");

    let objects = render(&[], &["serviceMonitor.enabled=true,serviceMonitor.labels.release=prom", "prometheusRule.enabled=true"]);
    let monitor = &objects["ServiceMonitor mcp-system/mcp-k8s-ephemeral-job"];
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "http");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    let service = &objects["Service mcp-system/mcp-k8s-ephemeral-job"];
    let selector = monitor["spec"]["selector"]["matchLabels"].as_object().expect("a label selector");
    for (label, value) in selector {
        assert_eq!(&service["metadata"]["labels"][label], value, "the ServiceMonitor selects the server's Service by {label}");
    }
    assert_eq!(service["spec"]["ports"][0]["name"], "http");

    let rule = &objects["PrometheusRule mcp-system/mcp-k8s-ephemeral-job"];
    let path = repo().join("deploy/monitoring/alerts.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let alerts: Value = serde_saphyr::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    assert_eq!(rule["spec"], alerts, "the PrometheusRule holds deploy/monitoring/alerts.yaml, {{ $labels }} untouched");
}

#[test]
fn helm_test_runs_doctor_with_the_servers_settings() {
    let objects = render(&[], &["outputs.existingClaim=shared-outputs", "extraEnv[0].name=MCP_K8S_LOG_LEVEL,extraEnv[0].value=debug"]);
    let pod = &objects["Pod mcp-system/mcp-k8s-ephemeral-job-doctor"];
    assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    let server = &deployment(&objects, "mcp-system")["spec"]["template"]["spec"];
    assert_eq!(pod["spec"]["serviceAccountName"], server["serviceAccountName"]);
    let doctor = &pod["spec"]["containers"][0];
    let served = &server["containers"][0];
    assert_eq!(doctor["args"], json!(["doctor"]));
    assert_eq!(doctor["image"], served["image"]);
    assert_eq!(doctor["env"], served["env"], "doctor checks what the server runs with");
    assert_eq!(doctor["volumeMounts"], served["volumeMounts"]);
    assert_eq!(pod["spec"]["volumes"], server["volumes"]);
    assert_eq!(doctor["securityContext"]["readOnlyRootFilesystem"], true, "as restricted as the server");
}

/// NOTES.txt as Helm renders it after an install. `helm template` leaves
/// NOTES out, so a copy of the chart renders it as the value of a ConfigMap.
fn notes(set: &[&str]) -> String {
    let temp = TempDir::new("helm-notes");
    let copy = temp.path.join("chart");
    let status = Command::new("cp").arg("-r").arg(chart_dir()).arg(&copy).status().expect("cp");
    assert!(status.success());
    let notes = std::fs::read_to_string(copy.join("templates/NOTES.txt")).expect("the chart has NOTES.txt");
    std::fs::write(copy.join("templates/_notes.tpl"), format!("{{{{- define \"notes\" -}}}}\n{notes}{{{{- end -}}}}\n")).unwrap();
    std::fs::write(
        copy.join("templates/notes.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: |\n    {{- include \"notes\" . | nindent 4 }}\n",
    )
    .unwrap();
    let mut command = helm();
    command.arg("template").arg(RELEASE).arg(&copy).arg("--show-only").arg("templates/notes.yaml").arg("--set").arg(GIVEN_SECRET);
    for assignment in set {
        command.arg("--set").arg(assignment);
    }
    let objects = objects(&output(command).unwrap_or_else(|error| panic!("{error}")));
    objects["ConfigMap /notes"]["data"]["notes"].as_str().expect("notes").to_string()
}

#[test]
fn notes_say_how_to_reach_the_server_run_doctor_and_read_the_token() {
    let text = notes(&["namespaces.server=team-sys,namespaces.jobs=team-jobs"]);
    for wanted in [
        "http://mcp-k8s-ephemeral-job.team-sys.svc:8080/mcp",
        "kubectl -n team-sys port-forward svc/mcp-k8s-ephemeral-job 8080:8080",
        "helm test mcp-k8s-ephemeral-job",
        "exec deploy/mcp-k8s-ephemeral-job -- /mcp-k8s-ephemeral-job doctor",
        "Secret\n   team-sys/mcp-k8s-ephemeral-job-auth, key token",
        "get secret mcp-k8s-ephemeral-job-auth -o jsonpath='{.data.token}' | base64 -d",
    ] {
        assert!(text.contains(wanted), "NOTES lack `{wanted}`:\n{text}");
    }
    assert!(!text.contains("created by this chart"), "{text}");
    let created = notes(&["auth.create=true,auth.token=t"]);
    assert!(created.contains("(created by this chart from auth.token)"), "{created}");
}
