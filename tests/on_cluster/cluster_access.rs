//! Against the real test cluster (`tests/cluster/up`): the admin kubeconfig
//! (client certificates) and the server kubeconfig (ServiceAccount token)
//! both work, and what the Role does not allow fails with a clear Forbidden
//! error naming verb and resource.

use crate::support::cluster;
use mcp_k8s_ephemeral_job::kube::{AccessCheck, ListParams, Resource};

#[test]
fn admin_kubeconfig_with_client_certificates_works() {
    let client = cluster::client("admin.kubeconfig");
    assert!(client.description().contains("client certificate"), "{}", client.description());
    let version = client.version().expect("GET /version");
    assert!(version["gitVersion"].as_str().unwrap_or_default().starts_with("v1."), "{version}");
    client.list(Resource::PODS, &cluster::namespace(), &ListParams::default()).expect("list pods");
    client.get(Resource::NAMESPACES, "", &cluster::namespace()).expect("get namespace");
}

#[test]
fn server_kubeconfig_with_a_service_account_token_works() {
    let client = cluster::client("server.kubeconfig");
    assert_eq!(client.namespace(), cluster::namespace());
    assert!(client.description().contains("auth token"), "{}", client.description());
    client.version().expect("GET /version");
    client.list(Resource::PODS, client.namespace(), &ListParams::default()).expect("list pods");
    client.list(Resource::EVENTS, client.namespace(), &ListParams::default()).expect("list events");
}

#[test]
fn what_the_role_does_not_allow_is_a_clear_forbidden_error() {
    let client = cluster::client("server.kubeconfig");
    let error = client.list(Resource::SECRETS, "kube-system", &ListParams::default()).unwrap_err();
    assert!(error.is_forbidden(), "{error}");
    let text = error.to_string();
    // The ServiceAccount lives in mcp-system (deploy/serviceaccount.yaml);
    // clusters set up before that had it in the jobs namespace.
    let (head, tail) = text.split_once(":mcp-k8s-ephemeral-job\"").unwrap_or_else(|| panic!("{text}"));
    assert!(
        head.starts_with("GET /api/v1/namespaces/kube-system/secrets: 403 Forbidden: secrets is forbidden: User \"system:serviceaccount:"),
        "{text}"
    );
    assert!(tail.starts_with(" cannot list resource \"secrets\" in API group \"\" in the namespace \"kube-system\""), "{text}");
    let status = error.status().unwrap();
    assert_eq!(status.details.kind, "secrets");

    let error = client.get(Resource::SECRETS, "kube-system", "anything").unwrap_err();
    assert!(error.to_string().contains("cannot get resource \"secrets\""), "{error}");
}

#[test]
fn access_review_reports_what_the_role_allows() {
    let client = cluster::client("server.kubeconfig");
    let check = |verb: &str, group: &str, resource: &str, subresource: &str| AccessCheck {
        namespace: cluster::namespace(),
        verb: verb.into(),
        group: group.into(),
        resource: resource.into(),
        subresource: subresource.into(),
        ..AccessCheck::default()
    };
    let create_jobs = client.access_review(&check("create", "batch", "jobs", "")).unwrap();
    assert!(create_jobs.allowed, "{create_jobs:?}");
    let pod_logs = client.access_review(&check("get", "", "pods", "log")).unwrap();
    assert!(pod_logs.allowed, "{pod_logs:?}");
    let create_pods = client.access_review(&check("create", "", "pods", "")).unwrap();
    assert!(!create_pods.allowed, "{create_pods:?}");
    let mut other_namespace = check("list", "", "secrets", "");
    other_namespace.namespace = "kube-system".into();
    assert!(!client.access_review(&other_namespace).unwrap().allowed);
}
