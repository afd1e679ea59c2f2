//! The two namespaces of `deploy/` are named in one place
//! (`deploy/namespaces.yaml`), and the transformer of `deploy/namespaces/`
//! reaches every place a manifest names them: each file of `deploy/`
//! (the `*.optional.yaml` files included) is parsed, every string equal to
//! `mcp-system` or `mcp-ephemeral` is found, and each must be a target of the
//! replacement whose source is that namespace. Then the replacements are
//! applied here with the names of `examples/renamed-namespaces/` and no old
//! name may be left. `kubectl kustomize` renders the same overlay in
//! `tests/with_tools/kustomize_namespaces.rs`; this tier needs no tool, so
//! it evaluates the few fieldPath forms the replacements use itself.

use std::path::Path;

use serde_json::Value;

const SERVER: &str = "mcp-system";
const JOBS: &str = "mcp-ephemeral";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let documents: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    documents.into_iter().filter(|document| !document.is_null()).collect()
}

fn one_document(path: &Path) -> Value {
    let mut documents = documents(path);
    assert_eq!(documents.len(), 1, "{}", path.display());
    documents.remove(0)
}

/// Every object of every manifest of `deploy/` an operator may apply, with
/// its file: the Secret example is left out (it is never applied).
fn deploy_objects() -> Vec<(String, Value)> {
    let mut objects = Vec::new();
    let mut names: Vec<String> = std::fs::read_dir(repo().join("deploy"))
        .expect("deploy/ is readable")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().to_string())
        .filter(|name| name.ends_with(".yaml") && name != "kustomization.yaml" && !name.ends_with(".example.yaml"))
        .collect();
    names.sort();
    for name in names {
        for object in documents(&repo().join("deploy").join(&name)) {
            if !is_local_config(&object) {
                objects.push((name.clone(), object));
            }
        }
    }
    objects
}

fn is_local_config(object: &Value) -> bool {
    object["metadata"]["annotations"]["config.kubernetes.io/local-config"] == "true"
}

/// One replacement: the ConfigMap key it copies and its targets as
/// (select, fieldPaths).
struct Replacement {
    key: String,
    targets: Vec<(Value, Vec<String>)>,
}

fn replacements() -> Vec<Replacement> {
    let transformer = one_document(&repo().join("deploy/namespaces/replacements.yaml"));
    assert_eq!(transformer["kind"], "ReplacementTransformer");
    let mut replacements = Vec::new();
    for replacement in transformer["replacements"].as_array().expect("replacements") {
        let source = &replacement["source"];
        assert_eq!(source["kind"], "ConfigMap");
        assert_eq!(source["name"], "mcp-k8s-ephemeral-job-namespaces");
        let key = source["fieldPath"].as_str().and_then(|path| path.strip_prefix("data.")).expect("source data.<key>").to_string();
        let targets = replacement["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .map(|target| {
                let paths = target["fieldPaths"].as_array().expect("fieldPaths");
                (target["select"].clone(), paths.iter().map(|path| path.as_str().expect("fieldPath").to_string()).collect())
            })
            .collect();
        replacements.push(Replacement { key, targets });
    }
    replacements
}

/// Kustomize's select: every field given must match (kind, name, namespace).
fn selects(select: &Value, object: &Value) -> bool {
    let fields = select.as_object().expect("select is a map");
    fields.iter().all(|(field, wanted)| match field.as_str() {
        "kind" => &object["kind"] == wanted,
        "name" => &object["metadata"]["name"] == wanted,
        "namespace" => &object["metadata"]["namespace"] == wanted,
        other => panic!("select by `{other}`: teach this test kustomize's meaning of it"),
    })
}

/// The fieldPath split at dots outside `[...]`.
fn segments(field_path: &str) -> Vec<&str> {
    let mut segments = Vec::new();
    let (mut start, mut depth) = (0, 0);
    for (idx, character) in field_path.char_indices() {
        match character {
            '[' => depth += 1,
            ']' => depth -= 1,
            '.' if depth == 0 => {
                segments.push(&field_path[start..idx]);
                start = idx + 1;
            }
            _ => {}
        }
    }
    segments.push(&field_path[start..]);
    segments
}

/// The JSON pointers a fieldPath names in `value` (a key, `*`, an index or
/// `[key=value]`), as kustomize resolves them.
fn resolve(value: &Value, segments: &[&str], pointer: String, found: &mut Vec<String>) {
    let Some((segment, rest)) = segments.split_first() else {
        found.push(pointer);
        return;
    };
    if let Some(matcher) = segment.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')) {
        let (key, wanted) = matcher.split_once('=').expect("[key=value]");
        for (idx, item) in value.as_array().into_iter().flatten().enumerate() {
            if item[key] == wanted {
                resolve(item, rest, format!("{pointer}/{idx}"), found);
            }
        }
    } else if *segment == "*" {
        for (idx, item) in value.as_array().into_iter().flatten().enumerate() {
            resolve(item, rest, format!("{pointer}/{idx}"), found);
        }
    } else if let Ok(idx) = segment.parse::<usize>() {
        if let Some(item) = value.get(idx) {
            resolve(item, rest, format!("{pointer}/{idx}"), found);
        }
    } else if let Some(field) = value.get(*segment) {
        resolve(field, rest, format!("{pointer}/{}", segment.replace('~', "~0").replace('/', "~1")), found);
    }
}

/// The (pointer, ConfigMap key) pairs the replacements write in `object`.
fn written(object: &Value, replacements: &[Replacement]) -> Vec<(String, String)> {
    let mut written = Vec::new();
    for replacement in replacements {
        for (select, field_paths) in &replacement.targets {
            if selects(select, object) {
                for field_path in field_paths {
                    let mut found = Vec::new();
                    resolve(object, &segments(field_path), String::new(), &mut found);
                    written.extend(found.into_iter().map(|pointer| (pointer, replacement.key.clone())));
                }
            }
        }
    }
    written
}

/// The pointer of every string leaf, with the string.
fn strings(value: &Value, pointer: String, found: &mut Vec<(String, String)>) {
    match value {
        Value::String(text) => found.push((pointer, text.clone())),
        Value::Array(items) => {
            for (idx, item) in items.iter().enumerate() {
                strings(item, format!("{pointer}/{idx}"), found);
            }
        }
        Value::Object(fields) => {
            for (key, field) in fields {
                strings(field, format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1")), found);
            }
        }
        _ => {}
    }
}

fn key_of(namespace: &str) -> &'static str {
    if namespace == SERVER { "server" } else { "jobs" }
}

fn describe(file: &str, object: &Value) -> String {
    format!("deploy/{file}: {} {}", object["kind"].as_str().unwrap_or("?"), object["metadata"]["name"].as_str().unwrap_or("?"))
}

#[test]
fn the_namespaces_are_named_once_and_the_base_runs_the_transformer() {
    let names = one_document(&repo().join("deploy/namespaces.yaml"));
    assert!(is_local_config(&names), "deploy/namespaces.yaml must not be rendered: {names}");
    assert_eq!(names["data"], serde_json::json!({"server": SERVER, "jobs": JOBS}));
    let kustomization = one_document(&repo().join("deploy/kustomization.yaml"));
    assert_eq!(kustomization["transformers"], serde_json::json!(["namespaces"]));
    let kustomization = one_document(&repo().join("deploy/namespaces/kustomization.yaml"));
    assert_eq!(kustomization["resources"], serde_json::json!(["replacements.yaml"]));
}

#[test]
fn every_namespace_in_deploy_is_written_by_the_transformer() {
    let replacements = replacements();
    let mut missed = Vec::new();
    for (file, object) in deploy_objects() {
        let written = written(&object, &replacements);
        let mut found = Vec::new();
        strings(&object, String::new(), &mut found);
        for (pointer, text) in &found {
            if text == SERVER || text == JOBS {
                if !written.contains(&(pointer.clone(), key_of(text).to_string())) {
                    missed.push(format!("{} {pointer} = {text}", describe(&file, &object)));
                }
            } else if text.contains(SERVER) || text.contains(JOBS) {
                // Object names such as `mcp-ephemeral-quota` are fixed, as in
                // the chart; a namespace inside any other string (a Service's
                // DNS name, say) could not be renamed.
                assert_eq!(pointer, "/metadata/name", "{}: `{text}` names a namespace inside a string", describe(&file, &object));
            }
        }
        for (pointer, key) in &written {
            let wanted = if key == "server" { SERVER } else { JOBS };
            assert_eq!(
                object.pointer(pointer).and_then(Value::as_str),
                Some(wanted),
                "{}: the transformer writes `{key}` to {pointer}",
                describe(&file, &object)
            );
        }
    }
    assert!(missed.is_empty(), "namespaces deploy/namespaces/replacements.yaml does not reach: {missed:#?}");
}

#[test]
fn every_target_of_the_transformer_is_in_deploy() {
    let objects = deploy_objects();
    for replacement in replacements() {
        for (select, field_paths) in &replacement.targets {
            for field_path in field_paths {
                let reached = objects.iter().any(|(_, object)| {
                    let mut found = Vec::new();
                    resolve(object, &segments(field_path), String::new(), &mut found);
                    selects(select, object) && !found.is_empty()
                });
                assert!(reached, "the target {select} {field_path} matches nothing in deploy/");
            }
        }
    }
}

#[test]
fn the_example_overlay_leaves_no_old_name() {
    let overlay_dir = repo().join("examples/renamed-namespaces");
    let overlay = one_document(&overlay_dir.join("kustomization.yaml"));
    assert_eq!(overlay["resources"], serde_json::json!(["../../deploy"]));
    assert_eq!(overlay["transformers"], serde_json::json!(["../../deploy/namespaces"]), "the overlay must run the transformer again");
    let patch: Value = serde_saphyr::from_str(overlay["patches"][0]["patch"].as_str().expect("patch")).expect("the patch is YAML");
    assert_eq!(patch["metadata"]["name"], "mcp-k8s-ephemeral-job-namespaces");
    let (server, jobs) = (patch["data"]["server"].as_str().expect("server"), patch["data"]["jobs"].as_str().expect("jobs"));
    assert!(![SERVER, JOBS, jobs].contains(&server) && jobs != JOBS, "new, distinct names: {patch}");
    let replacements = replacements();
    for (file, mut object) in deploy_objects() {
        for (pointer, key) in written(&object.clone(), &replacements) {
            *object.pointer_mut(&pointer).expect("written pointer") = Value::from(if key == "server" { server } else { jobs });
        }
        let mut found = Vec::new();
        strings(&object, String::new(), &mut found);
        for (pointer, text) in found {
            assert!(text != SERVER && text != JOBS, "{} {pointer} is still `{text}` in the overlay", describe(&file, &object));
        }
    }
}
