//! Every way of authenticating, end to end against the fake API server:
//! tokens, token files that rotate, basic auth, client certificates in each
//! key format (and bad keys), exec plugins v1/v1beta1 (caching, expiry, 401
//! refresh, failures), oidc id-token, impersonation, CA bundles,
//! insecure-skip-tls-verify, tls-server-name, proxy-url and in-cluster.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::fake_api::{Accept, FakeApi, FakeOptions};
use crate::support::pki::{Pki, key_fixture};
use crate::support::{TempDir, base64, fast_options, render_fixture};
use mcp_k8s_ephemeral_job::kube::{Client, ListParams, Options, Resource, Source};

/// Renders `live/<fixture>` into `<temp>/config/kubeconfig` so relative
/// paths in it point into `<temp>/config/`.
fn render_live(fake: &FakeApi, temp: &TempDir, fixture: &str, extra: &[(&str, &str)]) -> PathBuf {
    let ca_data = base64(&fake.pki.ca_pem);
    let mut replacements = vec![("SERVER", fake.url.as_str()), ("CA_DATA", ca_data.as_str())];
    replacements.extend_from_slice(extra);
    temp.write("config/kubeconfig", &render_fixture(&format!("live/{fixture}"), &replacements))
}

fn client(path: PathBuf) -> Result<Client, mcp_k8s_ephemeral_job::kube::Error> {
    Client::with_options(&Source::KubeconfigFile { path, context: None }, fast_options())
}

fn accept_authorization(fake: &FakeApi, values: &[&str]) {
    let authorizations = values.iter().map(|value| value.to_string()).collect();
    fake.accept(Accept::Only { authorizations, client_certs: Vec::new() });
}

fn accept_cert(fake: &FakeApi, der: &[u8]) {
    fake.accept(Accept::Only { authorizations: Vec::new(), client_certs: vec![der.to_vec()] });
}

fn version_ok(client: &Client) {
    let version = client.version().unwrap_or_else(|error| panic!("GET /version: {error}"));
    assert_eq!(version["gitVersion"], "v1.34.4-fake");
}

#[test]
fn static_token_and_context_namespace() {
    let fake = FakeApi::start();
    let temp = TempDir::new("token");
    accept_authorization(&fake, &["Bearer static-token"]);
    let client = client(render_live(&fake, &temp, "token.yaml", &[])).unwrap();
    assert_eq!(client.namespace(), "live-ns");
    assert!(client.description().contains("auth token"), "{}", client.description());
    assert!(!client.description().contains("static-token"));
    version_ok(&client);
    client.list(Resource::PODS, client.namespace(), &ListParams::default()).expect("list pods");
}

#[test]
fn wrong_token_is_unauthorized_without_retry_loops() {
    let fake = FakeApi::start();
    let temp = TempDir::new("token-wrong");
    accept_authorization(&fake, &["Bearer something-else"]);
    let path = render_live(&fake, &temp, "token.yaml", &[]);
    let client = client(path.clone()).unwrap();
    let error = client.version().unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "GET /version: 401 Unauthorized: Unauthorized; the API server refused the token of user `live` (context `live` of kubeconfig `{}`); check that it has not expired or been revoked and that this is the context meant for this server, or put in a new token",
            path.display()
        )
    );
    assert!(error.is_unauthorized());
    assert_eq!(fake.count("GET /version"), 1, "a static token cannot be refreshed, so no retry");
}

#[test]
fn token_file_is_reread_when_it_changes_and_after_a_401() {
    let fake = FakeApi::start();
    let temp = TempDir::new("token-file");
    let token_path = temp.write("config/secrets/token", "rotated-1\n");
    accept_authorization(&fake, &["Bearer rotated-1"]);
    let client = client(render_live(&fake, &temp, "token-file.yaml", &[])).unwrap();
    version_ok(&client);

    // A rotation the file's size or mtime shows is picked up at once.
    std::fs::write(&token_path, "rotated-two\n").unwrap();
    accept_authorization(&fake, &["Bearer rotated-two"]);
    version_ok(&client);
    assert_eq!(fake.requests().iter().filter(|request| request.header("authorization") == Some("Bearer rotated-1")).count(), 1);

    // A rotation that keeps size and mtime is caught by the 401: re-read, retry once.
    let modified = std::fs::metadata(&token_path).unwrap().modified().unwrap();
    std::fs::write(&token_path, "rotated-3xx\n").unwrap();
    std::fs::File::options().write(true).open(&token_path).unwrap().set_modified(modified).unwrap();
    accept_authorization(&fake, &["Bearer rotated-3xx"]);
    fake.clear_requests();
    version_ok(&client);
    let seen: Vec<_> = fake.requests().iter().map(|request| request.header("authorization").unwrap_or_default().to_string()).collect();
    assert_eq!(seen, ["Bearer rotated-two", "Bearer rotated-3xx"]);
}

#[test]
fn basic_auth() {
    let fake = FakeApi::start();
    let temp = TempDir::new("basic");
    let expected = format!("Basic {}", base64("admin:s3cret"));
    accept_authorization(&fake, &[&expected]);
    version_ok(&client(render_live(&fake, &temp, "basic-auth.yaml", &[])).unwrap());
}

#[test]
fn oidc_id_token() {
    let fake = FakeApi::start();
    let temp = TempDir::new("oidc");
    accept_authorization(&fake, &["Bearer oidc-id-token"]);
    version_ok(&client(render_live(&fake, &temp, "oidc.yaml", &[])).unwrap());
}

#[test]
fn anonymous_sends_no_authorization() {
    let fake = FakeApi::start();
    let temp = TempDir::new("anonymous");
    version_ok(&client(render_live(&fake, &temp, "anonymous.yaml", &[])).unwrap());
    assert!(fake.requests()[0].header("authorization").is_none());
}

#[test]
fn impersonation_headers() {
    let fake = FakeApi::start();
    let temp = TempDir::new("impersonate");
    version_ok(&client(render_live(&fake, &temp, "impersonate.yaml", &[])).unwrap());
    let request = &fake.requests()[0];
    assert_eq!(request.header("impersonate-user"), Some("alice"));
    assert_eq!(request.header("impersonate-uid"), Some("uid-1"));
    assert_eq!(request.header_values("impersonate-group"), ["devs", "ops"]);
    assert_eq!(request.header_values("impersonate-extra-scopes"), ["read", "write"]);
}

/// Client certificates in every key format, as files (relative paths) and as data.
#[test]
fn client_certificates_in_every_key_format() {
    let fake = FakeApi::start();
    let cases = [
        ("PKCS#1 RSA", key_fixture("rsa-pkcs1.key"), key_fixture("rsa-pkcs8.key")),
        ("PKCS#8 RSA", key_fixture("rsa-pkcs8.key"), key_fixture("rsa-pkcs8.key")),
        ("SEC1 EC", key_fixture("ec-sec1.key"), key_fixture("ec-pkcs8.key")),
        ("PKCS#8 EC", key_fixture("ec-pkcs8.key"), key_fixture("ec-pkcs8.key")),
    ];
    for (label, key_pem, pkcs8_pem) in cases {
        let cert = fake.pki.client_for_fixture("alice", &key_pem, &pkcs8_pem);
        accept_cert(&fake, &cert.cert_der);

        let temp = TempDir::new("client-cert-files");
        temp.write("config/pki/client.crt", &cert.cert_pem);
        temp.write("config/pki/client.key", &cert.key_pem);
        let by_file = client(render_live(&fake, &temp, "client-cert-files.yaml", &[])).unwrap_or_else(|error| panic!("{label}: {error}"));
        by_file.version().unwrap_or_else(|error| panic!("{label} (files): {error}"));

        let temp = TempDir::new("client-cert-data");
        let (cert_data, key_data) = (base64(&cert.cert_pem), base64(&cert.key_pem));
        let extra = [("CERT_DATA", cert_data.as_str()), ("KEY_DATA", key_data.as_str())];
        let by_data = client(render_live(&fake, &temp, "client-cert-data.yaml", &extra)).unwrap();
        by_data.version().unwrap_or_else(|error| panic!("{label} (data): {error}"));
    }
    assert!(fake.requests().iter().all(|request| request.client_cert.is_some()));
}

/// ureq panics on keys rustls cannot use; the client must refuse them first.
#[test]
fn bad_client_keys_are_clear_errors_not_panics() {
    let fake = FakeApi::start();
    let cert = fake.pki.client("alice");
    let other = fake.pki.client("bob");
    let cases = [
        ("P-521 (ring cannot sign)", key_fixture("ec-p521-pkcs8.key"), "client key of the kubeconfig user is not usable"),
        ("someone else's key", other.key_pem.clone(), "client key of the kubeconfig user does not match its client certificate"),
        (
            "not a key",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_string(),
            "client key of the kubeconfig user holds no PEM private key",
        ),
    ];
    for (label, key_pem, expected) in cases {
        let temp = TempDir::new("bad-key");
        let (cert_data, key_data) = (base64(&cert.cert_pem), base64(&key_pem));
        let extra = [("CERT_DATA", cert_data.as_str()), ("KEY_DATA", key_data.as_str())];
        let error = client(render_live(&fake, &temp, "client-cert-data.yaml", &extra)).unwrap_err().to_string();
        assert!(error.starts_with(&format!("invalid configuration: {expected}")), "{label}: {error}");
    }
    let temp = TempDir::new("missing-key-file");
    temp.write("config/pki/client.crt", &cert.cert_pem);
    let error = client(render_live(&fake, &temp, "client-cert-files.yaml", &[])).unwrap_err().to_string();
    assert!(error.starts_with("invalid configuration: unable to read client-key "), "{error}");
    assert!(error.contains("config/pki/client.key for live due to"), "{error}");
}

#[test]
fn ca_bundle_file_with_several_certificates() {
    let fake = FakeApi::start();
    let temp = TempDir::new("bundle");
    let unrelated = Pki::new("unrelated-ca");
    temp.write("config/pki/bundle.crt", &format!("{}{}", unrelated.ca_pem, fake.pki.ca_pem));
    version_ok(&client(render_live(&fake, &temp, "ca-file-bundle.yaml", &[])).unwrap());
}

#[test]
fn server_certificate_is_verified_unless_insecure() {
    let fake = FakeApi::start();
    let temp = TempDir::new("no-ca");
    let error = client(render_live(&fake, &temp, "no-ca.yaml", &[])).unwrap().version().unwrap_err().to_string();
    assert!(error.starts_with(&format!("GET /version: TLS with `{}` failed: ", fake.url)), "{error}");
    assert!(error.contains("UnknownIssuer"), "{error}");
    assert_eq!(fake.count("GET /version"), 0, "no request got through");

    let temp = TempDir::new("insecure");
    version_ok(&client(render_live(&fake, &temp, "insecure.yaml", &[])).unwrap());
}

#[test]
fn tls_server_name_overrides_the_name_checked() {
    let pki = Arc::new(Pki::new("sni-ca"));
    let options = FakeOptions { server_names: vec!["kubernetes.internal".into()], client_auth: false };
    let fake = FakeApi::start_with(pki, options);
    let temp = TempDir::new("sni");
    let without = client(render_live(&fake, &temp, "token.yaml", &[])).unwrap().version().unwrap_err().to_string();
    assert!(without.contains("certificate not valid for name \"127.0.0.1\""), "{without}");
    version_ok(&client(render_live(&fake, &temp, "tls-server-name.yaml", &[])).unwrap());
    let host = fake.requests().last().unwrap().host.clone();
    assert_eq!(host, format!("kubernetes.internal:{}", fake.port));
}

#[test]
fn proxy_url_tunnels_through_connect() {
    let fake = FakeApi::start();
    let (proxy_url, connects) = start_connect_proxy();
    let temp = TempDir::new("proxy");
    let path = render_live(&fake, &temp, "proxy-url.yaml", &[("PROXY", &proxy_url)]);
    version_ok(&client(path).unwrap());
    assert_eq!(connects.load(Ordering::SeqCst), 1);
}

// ---- exec plugins ----------------------------------------------------------

/// A plugin script: counts its runs in `runs`, saves its input, and prints
/// `exec-token-<run>` (with `expiry` when given) as `api_version`.
fn write_token_plugin(temp: &TempDir, api_version: &str, expiry: Option<&str>) -> PathBuf {
    let status = match expiry {
        Some(expiry) => format!(r#"{{"token":"exec-token-$run","expirationTimestamp":"{expiry}"}}"#),
        None => r#"{"token":"exec-token-$run"}"#.to_string(),
    };
    let script = format!(
        r#"#!/bin/sh
dir=$(dirname "$0")
run=$(( $(cat "$dir/runs" 2>/dev/null || echo 0) + 1 ))
echo "$run" > "$dir/runs"
printf '%s' "$KUBERNETES_EXEC_INFO" > "$dir/exec-info.json"
echo "$* $PLUGIN_ENV" > "$dir/args"
cat <<JSON
{{"apiVersion":"{api_version}","kind":"ExecCredential","status":{status}}}
JSON
"#
    );
    temp.write_script("config/bin/plugin.sh", &script);
    temp.path.join("config/bin/runs")
}

fn runs(path: &PathBuf) -> usize {
    std::fs::read_to_string(path).map(|text| text.trim().parse().unwrap()).unwrap_or(0)
}

#[test]
fn exec_v1_caches_its_credential_and_gets_cluster_info() {
    let fake = FakeApi::start();
    let temp = TempDir::new("exec-v1");
    let runs_path = write_token_plugin(&temp, "client.authentication.k8s.io/v1", None);
    accept_authorization(&fake, &["Bearer exec-token-1"]);
    let client = client(render_live(&fake, &temp, "exec-v1.yaml", &[])).unwrap();
    assert_eq!(runs(&runs_path), 0, "the plugin runs on the first request, not at start-up");
    for _ in 0..3 {
        version_ok(&client);
    }
    assert_eq!(runs(&runs_path), 1, "no expiry: cached");

    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(temp.path.join("config/bin/exec-info.json")).unwrap()).unwrap();
    assert_eq!(info["apiVersion"], "client.authentication.k8s.io/v1");
    assert_eq!(info["kind"], "ExecCredential");
    assert_eq!(info["spec"]["interactive"], false);
    assert_eq!(info["spec"]["cluster"]["server"], fake.url.as_str());
    assert_eq!(info["spec"]["cluster"]["certificate-authority-data"], base64(&fake.pki.ca_pem).as_str());
    assert_eq!(info["spec"]["cluster"]["config"]["audience"], "fake-audience");
    let args = std::fs::read_to_string(temp.path.join("config/bin/args")).unwrap();
    assert_eq!(args.trim(), "--flag value from-kubeconfig");
}

#[test]
fn exec_reruns_once_after_a_401() {
    let fake = FakeApi::start();
    let temp = TempDir::new("exec-401");
    let runs_path = write_token_plugin(&temp, "client.authentication.k8s.io/v1beta1", None);
    accept_authorization(&fake, &["Bearer exec-token-2"]);
    let client = client(render_live(&fake, &temp, "exec-v1beta1.yaml", &[])).unwrap();
    version_ok(&client);
    assert_eq!(runs(&runs_path), 2, "run, 401, run again");
    version_ok(&client);
    assert_eq!(runs(&runs_path), 2, "the refreshed credential is cached");

    // Still refused after the re-run: the 401 is returned, with no loop.
    accept_authorization(&fake, &["Bearer never"]);
    let error = client.version().unwrap_err();
    assert!(error.is_unauthorized(), "{error}");
    assert_eq!(runs(&runs_path), 3);
}

#[test]
fn exec_credential_is_rerun_after_expiry() {
    let fake = FakeApi::start();
    let temp = TempDir::new("exec-expired");
    let runs_path = write_token_plugin(&temp, "client.authentication.k8s.io/v1beta1", Some("2001-01-01T00:00:00Z"));
    let client = client(render_live(&fake, &temp, "exec-v1beta1.yaml", &[])).unwrap();
    version_ok(&client);
    version_ok(&client);
    assert_eq!(runs(&runs_path), 2, "an expired credential is never reused");

    let temp = TempDir::new("exec-future");
    let runs_path = write_token_plugin(&temp, "client.authentication.k8s.io/v1beta1", Some("2999-01-01T00:00:00+02:00"));
    let client = self::client(render_live(&fake, &temp, "exec-v1beta1.yaml", &[])).unwrap();
    version_ok(&client);
    version_ok(&client);
    assert_eq!(runs(&runs_path), 1);
}

#[test]
fn exec_plugin_may_return_a_client_certificate() {
    let fake = FakeApi::start();
    let temp = TempDir::new("exec-cert");
    let cert = fake.pki.client("exec-user");
    accept_cert(&fake, &cert.cert_der);
    let output = serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": { "clientCertificateData": cert.cert_pem, "clientKeyData": cert.key_pem },
    });
    temp.write("config/bin/output.json", &output.to_string());
    temp.write_script("config/bin/plugin.sh", "#!/bin/sh\ncat \"$(dirname \"$0\")/output.json\"\n");
    let client = client(render_live(&fake, &temp, "exec-v1beta1.yaml", &[])).unwrap();
    version_ok(&client);
    assert_eq!(fake.requests()[0].client_cert.as_deref(), Some(cert.cert_der.as_slice()));
}

#[test]
fn exec_plugin_failures_are_clear() {
    let fake = FakeApi::start();
    let api_version = "client.authentication.k8s.io/v1beta1";
    let cases: &[(&str, &str, &str)] = &[
        ("exec-v1beta1.yaml", "#!/bin/sh\necho 'token expired, run login' >&2\nexit 3\n", "getting credentials: exec: executable "),
        ("exec-v1beta1.yaml", "#!/bin/sh\necho not-json\n", "getting credentials: exec plugin `"),
        (
            "exec-v1beta1.yaml",
            "#!/bin/sh\necho '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"t\"}}'\n",
            "getting credentials: exec plugin is configured to use API version client.authentication.k8s.io/v1beta1, plugin returned version client.authentication.k8s.io/v1",
        ),
        (
            "exec-v1beta1.yaml",
            "#!/bin/sh\necho '{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\",\"status\":{}}'\n",
            "getting credentials: exec plugin didn't return a token or cert/key pair",
        ),
        (
            "exec-v1beta1.yaml",
            "#!/bin/sh\necho '{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\",\"status\":{\"clientKeyData\":\"k\"}}'\n",
            "getting credentials: exec plugin returned only certificate or key, not both",
        ),
        (
            "exec-always-interactive.yaml",
            "#!/bin/sh\nexit 0\n",
            "getting credentials: exec plugin cannot support interactive mode: standard input is not a terminal",
        ),
        (
            "exec-missing-command.yaml",
            "",
            "getting credentials: exec: executable kubectl-plugin-that-is-not-installed not found; install it with `brew install not-installed`",
        ),
    ];
    let _ = api_version;
    for (fixture, script, expected) in cases {
        let temp = TempDir::new("exec-fail");
        if !script.is_empty() {
            temp.write_script("config/bin/plugin.sh", script);
        }
        let error = client(render_live(&fake, &temp, fixture, &[])).unwrap().version().unwrap_err().to_string();
        assert!(error.starts_with(expected), "{fixture}: {error}");
    }
    let temp = TempDir::new("exec-exit");
    temp.write_script("config/bin/plugin.sh", cases[0].1);
    let error = client(render_live(&fake, &temp, "exec-v1beta1.yaml", &[])).unwrap().version().unwrap_err().to_string();
    assert!(error.ends_with("plugin.sh failed with exit code 3: token expired, run login"), "{error}");
}

/// A hanging plugin made each queued call wait its own
/// timeout (three calls, 180 s). Now one run at a time, and the calls that
/// waited for it, or come within the failure TTL, share its failure.
#[test]
fn hanging_exec_plugin_runs_once_and_its_failure_is_shared() {
    let fake = FakeApi::start();
    let temp = TempDir::new("exec-hang");
    temp.write_script("config/bin/plugin.sh", "#!/bin/sh\necho run >> \"$(dirname \"$0\")/runs\"\nexec sleep 30\n");
    let options = Options { exec_timeout: Duration::from_secs(1), exec_failure_ttl: Duration::from_secs(5), ..fast_options() };
    let path = render_live(&fake, &temp, "exec-v1.yaml", &[]);
    let client = Client::with_options(&Source::KubeconfigFile { path, context: None }, options).unwrap();
    let started = Instant::now();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            std::thread::spawn(move || (client.version().map(|_| ()), started.elapsed()))
        })
        .collect();
    for call in calls {
        let (result, elapsed) = call.join().unwrap();
        let error = result.unwrap_err();
        let text = error.to_string();
        assert!(error.is_credentials(), "{text}");
        assert!(elapsed < Duration::from_millis(2500), "each call ends within about one plugin timeout: {elapsed:?}");
        assert!(text.starts_with("getting credentials: exec: executable "), "{text}");
        assert!(text.contains("bin/plugin.sh did not finish within 1 s and was killed"), "{text}");
        assert!(!text.contains("--flag") && !text.contains("from-kubeconfig"), "args and env values may be secret: {text}");
    }
    // A call just after gets the same failure at once.
    let again = Instant::now();
    assert!(client.version().unwrap_err().is_credentials());
    assert!(again.elapsed() < Duration::from_millis(200), "{:?}", again.elapsed());
    let runs = std::fs::read_to_string(temp.path.join("config/bin/runs")).unwrap_or_default();
    assert_eq!(runs.lines().count(), 1, "the plugin ran once for five calls");
    assert_eq!(fake.count("GET /version"), 0, "nothing was sent without credentials");
}

/// The shared failure is brief: once it is over the plugin runs again, so a
/// plugin fixed by hand (a login) is picked up within seconds.
#[test]
fn a_failed_exec_plugin_runs_again_after_the_failure_ttl() {
    let fake = FakeApi::start();
    let temp = TempDir::new("exec-fail-ttl");
    temp.write_script("config/bin/plugin.sh", "#!/bin/sh\necho run >> \"$(dirname \"$0\")/runs\"\necho 'not logged in' >&2\nexit 1\n");
    let options = Options { exec_failure_ttl: Duration::from_millis(300), ..fast_options() };
    let path = render_live(&fake, &temp, "exec-v1beta1.yaml", &[]);
    let client = Client::with_options(&Source::KubeconfigFile { path, context: None }, options).unwrap();
    let count_runs = || std::fs::read_to_string(temp.path.join("config/bin/runs")).unwrap_or_default().lines().count();
    assert!(client.version().unwrap_err().is_credentials());
    let shared = client.version().unwrap_err().to_string();
    assert!(shared.contains("failed with exit code 1: not logged in (the answer of a run that ended "), "{shared}");
    assert_eq!(count_runs(), 1);
    std::thread::sleep(Duration::from_millis(400));
    assert!(client.version().unwrap_err().is_credentials());
    assert_eq!(count_runs(), 2, "run again once the failure is older than the TTL");
}

// ---- in-cluster ------------------------------------------------------------

#[test]
fn in_cluster_service_account_with_token_rotation() {
    let fake = FakeApi::start();
    let temp = TempDir::new("in-cluster");
    let token_path = temp.write("token", "sa-token-1\n");
    temp.write("ca.crt", &fake.pki.ca_pem);
    temp.write("namespace", "sa-ns");
    accept_authorization(&fake, &["Bearer sa-token-1"]);
    let source = Source::InCluster { host: "127.0.0.1".into(), port: fake.port.to_string(), service_account_dir: temp.path.clone() };
    let client = Client::with_options(&source, fast_options()).unwrap();
    assert_eq!(client.namespace(), "sa-ns");
    version_ok(&client);

    // The kubelet rotates the token; same size, same mtime: the 401 triggers the re-read.
    let modified = std::fs::metadata(&token_path).unwrap().modified().unwrap();
    std::fs::write(&token_path, "sa-token-2\n").unwrap();
    std::fs::File::options().write(true).open(&token_path).unwrap().set_modified(modified).unwrap();
    accept_authorization(&fake, &["Bearer sa-token-2"]);
    version_ok(&client);
}

/// A minimal HTTP CONNECT proxy that counts tunnels.
fn start_connect_proxy() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let connects = Arc::new(AtomicUsize::new(0));
    let counter = connects.clone();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let counter = counter.clone();
            std::thread::spawn(move || tunnel(client, &counter));
        }
    });
    (url, connects)
}

fn tunnel(client: TcpStream, counter: &AtomicUsize) {
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let mut request_line = String::new();
    reader.read_line(&mut request_line).unwrap();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line.trim().is_empty() {
            break;
        }
    }
    let target = request_line.split_whitespace().nth(1).unwrap().to_string();
    assert!(request_line.starts_with("CONNECT "), "{request_line}");
    counter.fetch_add(1, Ordering::SeqCst);
    let upstream = TcpStream::connect(target).unwrap();
    let mut client_writer = client.try_clone().unwrap();
    client_writer.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").unwrap();
    let mut upstream_reader = upstream.try_clone().unwrap();
    let mut upstream_writer = upstream;
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut upstream_reader, &mut client_writer);
    });
    let _ = std::io::copy(&mut reader, &mut upstream_writer);
}
