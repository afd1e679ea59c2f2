//! Errors about the cluster connection say what to fix: a
//! TLS failure names the server and the CAs it was checked against; a 401
//! names the credentials refused and what to check; an RBAC 403 names the
//! verb and resource; a credential that cannot be produced is not an API
//! error; a refused connection names the URL and, before the server ever
//! answered, does not spend the whole retry budget. All against the fake API
//! server with certificates made at test time.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::fake_api::{Accept, FakeApi, Fault};
use crate::support::pki::Pki;
use crate::support::{TempDir, base64, fast_options, render_fixture};
use mcp_k8s_ephemeral_job::kube::{Client, Error, Options, Resource, Source};
use serde_json::json;

/// Renders `live/<fixture>` into `<temp>/config/kubeconfig` with the CA given.
fn render_with_ca(fake: &FakeApi, temp: &TempDir, fixture: &str, ca_pem: &str, extra: &[(&str, &str)]) -> PathBuf {
    let ca_data = base64(ca_pem);
    let mut replacements = vec![("SERVER", fake.url.as_str()), ("CA_DATA", ca_data.as_str())];
    replacements.extend_from_slice(extra);
    temp.write("config/kubeconfig", &render_fixture(&format!("live/{fixture}"), &replacements))
}

fn client_for(path: PathBuf) -> Client {
    Client::with_options(&Source::KubeconfigFile { path, context: None }, fast_options()).unwrap()
}

#[test]
fn unknown_ca_names_the_server_and_where_the_ca_came_from() {
    let fake = FakeApi::start();
    let other = Pki::new("some-other-ca");
    let in_cluster = TempDir::new("wrong-ca-in-cluster");
    in_cluster.write("token", "sa-token\n");
    let in_cluster_ca = in_cluster.write("ca.crt", &other.ca_pem);
    let by_file = TempDir::new("wrong-ca-file");
    let bundle = by_file.write("config/pki/bundle.crt", &other.ca_pem);
    let (by_data, no_ca) = (TempDir::new("wrong-ca-data"), TempDir::new("wrong-ca-none"));
    let clients = [
        (
            client_for(render_with_ca(&fake, &by_data, "token.yaml", &other.ca_pem, &[])),
            "certificate-authority-data of cluster `live` in `".to_string(),
        ),
        (
            client_for(render_with_ca(&fake, &by_file, "ca-file-bundle.yaml", &other.ca_pem, &[])),
            format!("certificate-authority `{}` of cluster `live` in `", bundle.display()),
        ),
        (
            client_for(render_with_ca(&fake, &no_ca, "no-ca.yaml", &other.ca_pem, &[])),
            "the built-in web PKI roots (cluster `live` sets no certificate-authority) in `".to_string(),
        ),
        (
            Client::with_options(
                &Source::InCluster { host: "127.0.0.1".into(), port: fake.port.to_string(), service_account_dir: in_cluster.path.clone() },
                fast_options(),
            )
            .unwrap(),
            format!("the in-cluster CA `{}`", in_cluster_ca.display()),
        ),
    ];
    for (client, ca_source) in clients {
        let error = client.version().unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, Error::Transport { .. }), "{text}");
        let expected = format!(
            "GET /version: TLS with `{}` failed: invalid peer certificate: UnknownIssuer; the certificate was checked against {ca_source}",
            fake.url
        );
        assert!(text.starts_with(&expected), "\n got: {text}\nwant: {expected}...");
        assert!(
            text.ends_with(
                "; check that this CA is the cluster's (`kubectl config view --raw` shows it) and that this is the right context"
            ),
            "{text}"
        );
    }
    assert_eq!(fake.count("GET /version"), 0, "no request got through");
}

#[test]
fn unauthorized_names_the_credentials_and_what_to_check() {
    let fake = FakeApi::start();
    fake.accept(Accept::Only { authorizations: vec!["Bearer nobody".into()], client_certs: Vec::new() });
    let cert = fake.pki.client("alice");
    let (cert_data, key_data) = (base64(&cert.cert_pem), base64(&cert.key_pem));
    // (fixture, its extra placeholders, what the message must say)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        ("token.yaml", &[], "the API server refused the token of user `live` (context `live` of kubeconfig `"),
        ("basic-auth.yaml", &[], "the API server refused basic auth as `admin`"),
        ("oidc.yaml", &[], "the API server refused the oidc id-token of user `live`"),
        (
            "client-cert-data.yaml",
            &[("CERT_DATA", &cert_data), ("KEY_DATA", &key_data)],
            "the API server refused the client certificate of user `live`",
        ),
        ("anonymous.yaml", &[], "the API server refused anonymous requests"),
        ("exec-v1beta1.yaml", &[], "the API server refused the credential of exec plugin `"),
        ("token-file.yaml", &[], "the API server refused the token from file `"),
    ];
    for (fixture, extra, expected) in cases {
        let temp = TempDir::new("401-kinds");
        temp.write("config/secrets/token", "file-token\n");
        temp.write_script(
            "config/bin/plugin.sh",
            "#!/bin/sh\necho '{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"t\"}}'\n",
        );
        let error = client_for(render_with_ca(&fake, &temp, fixture, &fake.pki.ca_pem, extra)).version().unwrap_err();
        let text = error.to_string();
        assert!(error.is_unauthorized(), "{fixture}: {text}");
        assert!(text.starts_with("GET /version: 401 Unauthorized: Unauthorized; "), "{fixture}: {text}");
        assert!(text.contains(expected), "{fixture}\n got: {text}\nwant: {expected}");
        assert!(
            text.contains("; check ") || text.contains("; give ") || text.contains(": log in again"),
            "{fixture}: says what to check: {text}"
        );
        for secret in ["file-token", "s3cret", "oidc-id-token", "static-token"] {
            assert!(!text.contains(secret), "{fixture}: a secret in the message: {text}");
        }
    }

    let temp = TempDir::new("401-in-cluster");
    temp.write("token", "sa-token\n");
    temp.write("ca.crt", &fake.pki.ca_pem);
    let source = Source::InCluster { host: "127.0.0.1".into(), port: fake.port.to_string(), service_account_dir: temp.path.clone() };
    let text = Client::with_options(&source, fast_options()).unwrap().version().unwrap_err().to_string();
    let expected = format!("the API server refused the ServiceAccount token `{}`", temp.path.join("token").display());
    assert!(text.contains(&expected), "\n got: {text}\nwant: {expected}");
    assert!(!text.contains("sa-token\n") && !text.contains("`sa-token`"), "{text}");
}

#[test]
fn forbidden_job_creation_names_the_verb_and_the_resource() {
    let fake = FakeApi::start();
    let temp = TempDir::new("rbac-403");
    let client = client_for(render_with_ca(&fake, &temp, "token.yaml", &fake.pki.ca_pem, &[]));
    let user = "system:serviceaccount:mcp-system:mcp-k8s-ephemeral-job";
    fake.inject("POST /apis/batch/v1/namespaces/live-ns/jobs", Fault::RbacForbidden { user: user.into() }, 1);
    let error = client.create(Resource::JOBS, "live-ns", &json!({ "metadata": { "name": "j" } })).unwrap_err();
    assert!(error.is_forbidden(), "{error}");
    assert!(!error.is_quota_exceeded(), "{error}");
    let denied = error.permission_denied().expect("an RBAC refusal");
    assert_eq!((denied.verb.as_str(), denied.qualified_resource().as_str()), ("create", "jobs.batch"));
    assert_eq!((denied.user.as_str(), denied.namespace.as_deref()), (user, Some("live-ns")));
    assert_eq!(
        error.to_string(),
        format!(
            "POST /apis/batch/v1/namespaces/live-ns/jobs: 403 Forbidden: jobs.batch is forbidden: User \"{user}\" cannot create resource \"jobs\" in API group \"batch\" in the namespace \"live-ns\"; forbidden: `{user}` may not `create` `jobs.batch` in namespace `live-ns`; grant that verb in the Role bound to it (deploy/role.yaml has every verb the server needs)"
        )
    );
    assert_eq!(fake.count("POST /apis/batch/v1"), 1, "a 403 is not retried");

    // A 403 from admission is not a missing permission.
    fake.inject("POST /apis/batch/v1/namespaces/live-ns/jobs", Fault::Status { code: 403, retry_after: None }, 1);
    let error = client.create(Resource::JOBS, "live-ns", &json!({ "metadata": { "name": "j" } })).unwrap_err();
    assert!(error.is_forbidden() && error.permission_denied().is_none(), "{error}");
    fake.assert_fired("POST /apis/batch/v1/namespaces/live-ns/jobs");
}

#[test]
fn credentials_that_cannot_be_produced_are_not_api_errors() {
    let fake = FakeApi::start();
    let temp = TempDir::new("credentials-fail");
    temp.write_script("config/bin/plugin.sh", "#!/bin/sh\necho 'please log in' >&2\nexit 1\n");
    let client = client_for(render_with_ca(&fake, &temp, "exec-v1beta1.yaml", &fake.pki.ca_pem, &[]));
    let error = client.version().unwrap_err();
    assert!(error.is_credentials(), "{error}");
    assert!(matches!(error, Error::Credentials(_)), "{error}");
    assert!(error.status().is_none() && !error.is_unauthorized(), "{error}");
    assert!(error.to_string().starts_with("getting credentials: exec: executable "), "{error}");
    assert_eq!(fake.count("GET /version"), 0);
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn plain_client(server: &str, options: Options) -> (Client, TempDir) {
    let temp = TempDir::new("refused");
    let text = render_fixture("live/insecure.yaml", &[("SERVER", server), ("CA_DATA", "")]);
    let path = temp.write("kubeconfig", &text);
    (Client::with_options(&Source::KubeconfigFile { path, context: None }, options).unwrap(), temp)
}

/// Backoff 100, 200, 400, 800 ms: 1.5 s of budget, 100 ms at first contact.
fn measurable_options() -> Options {
    Options {
        max_retries: 4,
        first_contact_retries: 1,
        backoff_base: Duration::from_millis(100),
        backoff_max: Duration::from_secs(1),
        ..fast_options()
    }
}

#[test]
fn connection_refused_at_first_contact_names_the_url_and_fails_fast() {
    let server = format!("https://127.0.0.1:{}", closed_port());
    // The production budget: 7.75 s of backoff before this change.
    let (client, _temp) = plain_client(&server, Options::default());
    let started = Instant::now();
    let error = client.version().unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_millis(1500), "a first contact does not spend the whole budget: {elapsed:?}");
    assert!(matches!(error, Error::Transport { .. }), "{error}");
    let text = error.to_string();
    let expected = format!(
        "GET /version: cannot connect to `{server}`: connection refused; check that the API server is up and that the server URL is right (context `live` of kubeconfig `"
    );
    assert!(text.starts_with(&expected), "\n got: {text}\nwant: {expected}...");
}

#[test]
fn connection_refused_after_the_server_answered_gets_the_whole_budget() {
    // A plain HTTP server that answers one request and then goes away.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = format!("http://{}", listener.local_addr().unwrap());
    let answered = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap() > 0 && line != "\r\n" {
            line.clear();
        }
        let body = r#"{"gitVersion":"v1.34.4-plain"}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        (&stream).write_all(answer.as_bytes()).unwrap();
        // The listener is dropped here: the port refuses from now on.
    });
    let (client, _temp) = plain_client(&server, measurable_options());
    assert_eq!(client.version().unwrap()["gitVersion"], "v1.34.4-plain");
    answered.join().unwrap();
    let started = Instant::now();
    let error = client.version().unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(1400), "an outage after contact is retried with the whole budget: {elapsed:?}");
    assert!(error.to_string().contains(&format!("cannot connect to `{server}`: connection refused")), "{error}");

    let (fresh, _temp) = plain_client(&server, measurable_options());
    let started = Instant::now();
    fresh.version().unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(800), "first contact: {:?}", started.elapsed());
}
