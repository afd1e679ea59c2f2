//! `deploy/role.yaml` grants exactly what `backend::kubernetes::permissions::REQUIRED`
//! says the server needs: nothing missing (runs would fail with 403) and
//! nothing extra (least privilege). `doctor` checks the same list against a
//! live cluster.

use std::collections::BTreeSet;

use mcp_k8s_ephemeral_job::backend::kubernetes::permissions::{OUTPUTS, Permission, REQUIRED, SANDBOXES, WARM_POOLS};

/// (API group, resource or resource/subresource, verb).
type Grant = (String, String, String);

fn granted_by_the_role() -> BTreeSet<Grant> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/role.yaml");
    let text = std::fs::read_to_string(path).expect("deploy/role.yaml is readable");
    grants_of(&serde_saphyr::from_str(&text).expect("deploy/role.yaml is YAML"))
}

/// The Role among the documents of an optional file of `deploy/`.
fn granted_by_optional(file: &str) -> BTreeSet<Grant> {
    let path = format!("{}/deploy/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("deploy/{file} is readable: {error}"));
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|error| panic!("deploy/{file} is YAML: {error}"));
    let roles: Vec<&serde_json::Value> = documents.iter().filter(|document| document["kind"] == "Role").collect();
    assert_eq!(roles.len(), 1, "one Role in deploy/{file}");
    grants_of(roles[0])
}

fn grants_of(role: &serde_json::Value) -> BTreeSet<Grant> {
    assert_eq!(role["kind"], "Role", "a namespaced Role, not a ClusterRole");
    let mut grants = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        let strings = |key: &str| -> Vec<String> {
            rule[key].as_array().unwrap_or(&Vec::new()).iter().map(|v| v.as_str().unwrap_or("?").to_string()).collect()
        };
        for group in strings("apiGroups") {
            for resource in strings("resources") {
                for verb in strings("verbs") {
                    grants.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    grants
}

fn required() -> BTreeSet<Grant> {
    needed(REQUIRED)
}

fn needed(permissions: &[Permission]) -> BTreeSet<Grant> {
    let mut grants = BTreeSet::new();
    for permission in permissions {
        let resource = permission.role_resource();
        for verb in permission.verbs {
            grants.insert((permission.group.to_string(), resource.clone(), verb.to_string()));
        }
    }
    grants
}

#[test]
fn the_shipped_role_grants_exactly_what_the_server_needs() {
    let granted = granted_by_the_role();
    let required = required();
    let missing: Vec<_> = required.difference(&granted).collect();
    let extra: Vec<_> = granted.difference(&required).collect();
    assert!(missing.is_empty(), "deploy/role.yaml lacks (group, resource, verb): {missing:?}");
    assert!(
        extra.is_empty(),
        "deploy/role.yaml grants more than backend::kubernetes::permissions::REQUIRED: {extra:?}; add them there with a reason, or drop them"
    );
}

#[test]
fn the_warm_pools_role_grants_exactly_what_pools_need() {
    assert_eq!(
        granted_by_optional("warm-pools.optional.yaml"),
        needed(WARM_POOLS),
        "deploy/warm-pools.optional.yaml and permissions::WARM_POOLS"
    );
}

#[test]
fn the_outputs_role_grants_exactly_what_fetching_held_output_needs() {
    assert_eq!(granted_by_optional("outputs.optional.yaml"), needed(OUTPUTS), "deploy/outputs.optional.yaml and permissions::OUTPUTS");
    assert_eq!(granted_by_optional("sandboxes.yaml"), needed(SANDBOXES), "deploy/sandboxes.yaml and permissions::SANDBOXES");
}
