//! `examples/renamed-namespaces/` rendered by the cache's `kubectl
//! kustomize`: the same objects as `deploy/` (by kind and name), none left
//! in `mcp-system` or `mcp-ephemeral`, and no string anywhere equal to
//! either name. `tests/offline/deploy_namespaces.rs` checks the same by
//! reading the files; this checks kustomize agrees.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::helm_chart::cached_binary;

fn render(dir: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let output = Command::new(cached_binary("kubectl", "tests/cluster/build-kube"))
        .arg("kustomize")
        .arg(&path)
        .output()
        .unwrap_or_else(|error| panic!("kubectl kustomize {}: {error}", path.display()));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "kubectl kustomize {}: {}", path.display(), String::from_utf8_lossy(&output.stderr));
    let documents: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap_or_else(|error| panic!("{error}\n{text}"));
    documents.into_iter().filter(|document| !document.is_null()).collect()
}

fn kinds_and_names(objects: &[Value]) -> Vec<String> {
    let mut keys: Vec<String> = objects
        .iter()
        .map(|object| format!("{} {}", object["kind"].as_str().unwrap_or("?"), object["metadata"]["name"].as_str().unwrap_or("?")))
        .collect();
    keys.sort();
    keys
}

fn strings(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::String(text) => found.push(text.clone()),
        Value::Array(items) => items.iter().for_each(|item| strings(item, found)),
        Value::Object(fields) => fields.values().for_each(|field| strings(field, found)),
        _ => {}
    }
}

#[test]
fn the_renamed_overlay_renders_deploy_in_other_namespaces() {
    let base = render("deploy");
    let overlay = render("examples/renamed-namespaces");
    let mut base_keys = kinds_and_names(&base);
    // The two Namespace objects take the new names.
    base_keys.retain(|key| !key.starts_with("Namespace "));
    let mut overlay_keys = kinds_and_names(&overlay);
    overlay_keys.retain(|key| !key.starts_with("Namespace "));
    assert_eq!(overlay_keys, base_keys, "the overlay renders other objects than deploy/");
    for object in &overlay {
        let mut found = Vec::new();
        strings(object, &mut found);
        for text in found {
            assert!(text != "mcp-system" && text != "mcp-ephemeral", "`{text}` is left in the overlay: {object}");
        }
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
        assert!(["", "team-a-mcp", "team-a-sandboxes"].contains(&namespace), "{object}");
    }
    let server = overlay.iter().find(|object| object["kind"] == "Deployment").expect("the Deployment");
    let env = server["spec"]["template"]["spec"]["containers"][0]["env"].as_array().expect("env");
    let namespace = env.iter().find(|var| var["name"] == "MCP_K8S_NAMESPACE").expect("MCP_K8S_NAMESPACE");
    assert_eq!(namespace["value"], "team-a-sandboxes");
    assert_eq!(server["metadata"]["namespace"], "team-a-mcp");
}
