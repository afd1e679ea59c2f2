//! kubeconfig loading with kubectl's semantics, from the fixture files under
//! `fixtures/kubeconfig/`: multi-file merges (first wins, whole), relative
//! paths against the defining file, JSON and `null` lists, context and
//! namespace selection, in-cluster files, and kubectl's error texts.

use std::path::PathBuf;

use crate::support::{TempDir, fixture_path};
use mcp_k8s_ephemeral_job::kube::kubeconfig::{CredentialsConfig, Kubeconfig, in_cluster, join_host_port};
use mcp_k8s_ephemeral_job::kube::{Client, Source};

fn merged() -> Vec<PathBuf> {
    vec![fixture_path("merge/first.yaml"), fixture_path("merge/other/second.yaml")]
}

fn load(paths: &[PathBuf], context: Option<&str>) -> mcp_k8s_ephemeral_job::kube::kubeconfig::ClusterConfig {
    Kubeconfig::load(paths, false).expect("load").select(context).expect("select")
}

#[test]
fn merge_first_file_wins_current_context_and_whole_entries() {
    let config = load(&merged(), None);
    assert_eq!(config.server, "https://first.example:6443");
    assert_eq!(config.namespace, "ns-a");
    // The first file's `shared` cluster is used whole: no insecure flag from the second.
    assert!(!config.insecure_skip_tls_verify);
    let expected_ca = std::fs::read(fixture_path("merge/ca.crt")).unwrap();
    assert_eq!(config.certificate_authority.as_deref(), Some(expected_ca.as_slice()));
    assert!(matches!(&config.credentials, CredentialsConfig::Token(token) if token.0 == "first-token"));
}

#[test]
fn merge_same_named_context_comes_from_the_first_file() {
    let config = load(&merged(), Some("b"));
    assert_eq!(config.server, "https://first.example:6443");
    assert_eq!(config.namespace, "default", "context b of the first file has no namespace");
}

#[test]
fn merge_relative_paths_resolve_against_the_defining_file() {
    let config = load(&merged(), Some("c"));
    assert_eq!(config.server, "https://second.example:443", "trailing slash dropped");
    assert_eq!(config.namespace, "ns-c");
    let expected_ca = std::fs::read(fixture_path("merge/other/certs/ca.crt")).unwrap();
    assert_eq!(config.certificate_authority.as_deref(), Some(expected_ca.as_slice()));
    match &config.credentials {
        CredentialsConfig::TokenFile { path, initial } => {
            assert_eq!(path, &fixture_path("merge/other/token"));
            assert!(initial.is_none());
        }
        other => panic!("expected a tokenFile, got {other:?}"),
    }
    assert!(config.description.contains("context `c`"), "{}", config.description);
    assert!(!config.description.contains("second-file-token"));
}

#[test]
fn merge_order_matters() {
    let reversed: Vec<PathBuf> = merged().into_iter().rev().collect();
    let config = load(&reversed, None);
    // Now the second file's current-context `b` and its cluster `second` win.
    assert_eq!(config.server, "https://second.example:443");
    assert_eq!(config.namespace, "ignored");
}

#[test]
fn kubeconfig_env_skips_missing_files_and_nulls() {
    let paths = vec![fixture_path("does-not-exist.yaml"), fixture_path("nulls.yaml"), fixture_path("merge/first.yaml")];
    let config = load(&paths, None);
    assert_eq!(config.server, "https://first.example:6443");
}

#[test]
fn json_kubeconfig_with_tabs_and_basic_auth() {
    let config = load(&[fixture_path("json.json")], None);
    assert_eq!(config.server, "https://json.example:6443");
    assert_eq!(config.namespace, "from-json");
    assert!(config.insecure_skip_tls_verify);
    assert!(matches!(&config.credentials, CredentialsConfig::Basic { username, .. } if username == "admin"));
    assert!(!format!("{config:?}").contains("secret"), "Debug must not print the password");
}

#[test]
fn source_selection_reads_the_environment_like_kubectl() {
    let kubeconfig = format!("{}:{}", merged()[0].display(), merged()[1].display());
    let env = |name: &str| match name {
        "KUBECONFIG" => Some(kubeconfig.clone()),
        _ => None,
    };
    let source = Source::select_with(None, Some("c"), env);
    let client = Client::new(&source).expect("client");
    assert_eq!(client.namespace(), "ns-c");
    assert!(client.description().contains("second.yaml"), "{}", client.description());
}

#[test]
fn explicit_kubeconfig_must_exist() {
    let source = Source::select_with(Some(&fixture_path("missing.yaml")), None, |_| None);
    let error = Client::new(&source).unwrap_err().to_string();
    assert!(error.starts_with("invalid configuration: cannot read kubeconfig `"), "{error}");
    assert!(error.contains("missing.yaml") && error.contains("No such file"), "{error}");
}

#[test]
fn no_kubeconfig_at_all() {
    let temp = TempDir::new("nohome");
    let home = temp.path.display().to_string();
    let source = Source::select_with(None, None, |name| (name == "HOME").then(|| home.clone()));
    let error = Client::new(&source).unwrap_err().to_string();
    assert!(error.starts_with("invalid configuration: no configuration has been provided"), "{error}");
    assert!(error.contains(".kube/config"), "{error}");
}

/// Each broken fixture and the start of kubectl's (or our) message.
#[test]
fn kubectl_error_cases() {
    let cases: &[(&str, Option<&str>, &str)] = &[
        ("errors/no-server.yaml", None, "invalid configuration: cluster has no server defined: cluster `test`"),
        ("merge/first.yaml", Some("nope"), "invalid configuration: context was not found for specified context: nope; contexts in"),
        ("errors/context-without-cluster.yaml", None, "invalid configuration: context `test` refers to cluster `nowhere`, which is not in"),
        ("errors/no-current-context.yaml", None, "invalid configuration: no context chosen; set current-context in"),
        ("nulls.yaml", None, "invalid configuration: no configuration has been provided"),
        (
            "errors/token-and-basic.yaml",
            None,
            "invalid configuration: more than one authentication method found for test; found [token basicAuth], only one is allowed",
        ),
        (
            "errors/cert-without-key.yaml",
            None,
            "invalid configuration: client-key-data or client-key must be specified for test to use the clientCert authentication method",
        ),
        (
            "errors/key-without-cert.yaml",
            None,
            "invalid configuration: client-cert-data or client-cert must be specified for test to use the clientCert authentication method",
        ),
        (
            "errors/exec-and-auth-provider.yaml",
            None,
            "invalid configuration: authProvider cannot be provided in combination with an exec plugin for test",
        ),
        ("errors/gcp-auth-provider.yaml", None, "invalid configuration: The gcp auth plugin has been removed"),
        ("errors/azure-auth-provider.yaml", None, "invalid configuration: The azure auth plugin has been removed"),
        ("errors/unknown-auth-provider.yaml", None, "invalid configuration: no Auth Provider found for name \"keystone\""),
        ("errors/oidc-without-id-token.yaml", None, "invalid configuration: the oidc auth-provider of user `test` has no id-token"),
        (
            "errors/exec-v1-without-interactive-mode.yaml",
            None,
            "invalid configuration: interactiveMode must be specified for test to use exec authentication plugin",
        ),
        (
            "errors/exec-bad-api-version.yaml",
            None,
            "invalid configuration: exec plugin: invalid apiVersion \"client.authentication.k8s.io/v1alpha1\"",
        ),
        (
            "errors/exec-without-command.yaml",
            None,
            "invalid configuration: command must be specified for test to use exec authentication plugin",
        ),
        ("errors/missing-ca-file.yaml", None, "invalid configuration: unable to read certificate-authority "),
        (
            "errors/insecure-with-ca.yaml",
            None,
            "invalid configuration: specifying a root certificates file with the insecure flag is not allowed",
        ),
        ("errors/ca-data-not-base64.yaml", None, "invalid configuration: certificate-authority-data for test is not valid base64"),
        ("errors/ca-data-not-pem.yaml", None, "invalid configuration: certificate-authority holds no PEM certificate"),
        ("errors/not-yaml.yaml", None, "invalid configuration: cannot parse kubeconfig `"),
    ];
    let mut failures = Vec::new();
    for (fixture, context, expected) in cases {
        let source = Source::KubeconfigFile { path: fixture_path(fixture), context: context.map(str::to_string) };
        match Client::new(&source) {
            Ok(_) => failures.push(format!("{fixture}: loaded, expected `{expected}`")),
            Err(error) if error.to_string().starts_with(expected) => {}
            Err(error) => failures.push(format!("{fixture}: got `{error}`, expected `{expected}`")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn in_cluster_files_and_ipv6_host() {
    let temp = TempDir::new("incluster");
    temp.write("token", "sa-token\n");
    temp.write("namespace", "runner-ns\n");
    temp.write("ca.crt", &std::fs::read_to_string(fixture_path("merge/ca.crt")).unwrap());
    let config = in_cluster("fd00::1", "443", &temp.path).expect("in-cluster");
    assert_eq!(config.server, "https://[fd00::1]:443");
    assert_eq!(config.namespace, "runner-ns");
    assert!(matches!(&config.credentials, CredentialsConfig::TokenFile { initial: Some(token), .. } if token.0 == "sa-token"));
    assert!(config.description.starts_with("in-cluster ServiceAccount"), "{}", config.description);
    assert_eq!(join_host_port("10.0.0.1", "6443"), "10.0.0.1:6443");
}

#[test]
fn in_cluster_without_token_is_a_clear_error() {
    let temp = TempDir::new("incluster-empty");
    let source = Source::InCluster { host: "10.0.0.1".into(), port: "443".into(), service_account_dir: temp.path.clone() };
    let error = Client::new(&source).unwrap_err().to_string();
    assert!(error.starts_with("invalid configuration: cannot read the ServiceAccount token `"), "{error}");
}
