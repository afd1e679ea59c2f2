//! Honest readiness, through the binary: a server that cannot run anything
//! does not start (exit 2, one line saying what is missing and how to fix
//! it) unless MCP_K8S_LAZY_BACKEND=1; one site down beside a healthy one is
//! a warning naming it; `/readyz` is 503 while no site can run a job and
//! says why; `doctor` says a cause many checks share once.
//!
//! The API server that refuses connections is a port nobody listens on;
//! the one that refuses credentials is the fake API server accepting
//! another token.

use std::net::TcpListener;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::fake_api::{Accept, FakeApi};
use crate::support::server::{HttpServer, command};
use crate::support::{TempDir, render_fixture};

/// A kubeconfig in `temp` for the API server at `url`, trusting `fake`'s CA.
fn kubeconfig(temp: &TempDir, name: &str, url: &str, fake: &FakeApi) -> String {
    let ca_data = crate::support::base64(&fake.pki.ca_pem);
    temp.write(name, &render_fixture("live/token.yaml", &[("SERVER", url), ("CA_DATA", &ca_data)])).display().to_string()
}

/// An address where nothing listens: connections to it are refused.
fn refusing_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("https://127.0.0.1:{port}")
}

/// Accepts only a token the kubeconfig does not have: every call is 401.
fn refuse_credentials(fake: &FakeApi) {
    fake.accept(Accept::Only { authorizations: vec!["Bearer another-token".to_string()], client_certs: Vec::new() });
}

/// `serve` (or `doctor`) with stdin closed, to its end: exit code, stdout,
/// stderr. A server that starts ends at once (stdio, end of input).
fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let output = command(env).args(args).stdin(Stdio::null()).output().unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

/// The stderr lines that are not JSON logs: what the start says to a person.
fn plain_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|line| serde_json::from_str::<Value>(line).is_err()).collect()
}

/// The one line a refused start prints, after checking it is the only one.
fn refusal(env: &[(&str, &str)]) -> String {
    let (code, _, stderr) = run(&["serve"], env);
    assert_eq!(code, Some(2), "{stderr}");
    let lines = plain_lines(&stderr);
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    lines[0].to_string()
}

const LAZY_HINT: &str = "fix that, or set MCP_K8S_LAZY_BACKEND=1 to serve anyway (/readyz fails until a site can run jobs)";

#[test]
fn a_server_with_no_backend_at_all_refuses_to_start_in_one_line() {
    let env = [("MCP_K8S_LAZY_BACKEND", "0"), ("HOME", "/nonexistent-home"), ("MCP_K8S_DOCKER_HOST", "unix:///nonexistent/docker.sock")];
    let line = refusal(&env);
    assert!(line.starts_with("mcp-k8s-ephemeral-job: no backend can run a job: no cluster credentials ("), "{line}");
    assert!(line.contains("set MCP_K8S_KUBECONFIG or KUBECONFIG, or run in a pod with a ServiceAccount"), "{line}");
    assert!(line.contains("and no Docker daemon ("), "{line}");
    assert!(line.ends_with(LAZY_HINT), "{line}");
    // The opt-in: the same server serves, and says it has no backend.
    let (code, _, stderr) = run(&["serve"], &[("MCP_K8S_LAZY_BACKEND", "1"), env[1], env[2]]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("serving without a backend (MCP_K8S_LAZY_BACKEND=1)"), "{stderr}");
}

#[test]
fn an_api_server_that_refuses_connections_or_credentials_stops_the_start() {
    let (fake, temp) = (FakeApi::start(), TempDir::new("readiness-start"));
    let refusing = kubeconfig(&temp, "refusing", &refusing_url(), &fake);
    let line = refusal(&[("MCP_K8S_LAZY_BACKEND", "0"), ("MCP_K8S_KUBECONFIG", &refusing), ("MCP_K8S_NAMESPACE", "live-ns")]);
    assert!(line.starts_with("mcp-k8s-ephemeral-job: no backend can run a job: could not list the background Jobs: "), "{line}");
    assert!(line.contains("connection refused; check that the API server is up and that the server URL is right"), "{line}");
    assert!(line.ends_with(LAZY_HINT), "{line}");

    refuse_credentials(&fake);
    let denied = kubeconfig(&temp, "denied", &fake.url, &fake);
    let line = refusal(&[("MCP_K8S_LAZY_BACKEND", "0"), ("MCP_K8S_KUBECONFIG", &denied), ("MCP_K8S_NAMESPACE", "live-ns")]);
    assert!(line.contains("401"), "{line}");
    assert!(line.contains("the server's credentials were refused or may not list Jobs there"), "{line}");
}

#[test]
fn one_site_down_beside_a_healthy_one_is_a_warning_naming_it_and_all_down_stops() {
    let (fake, temp) = (FakeApi::start(), TempDir::new("readiness-sites"));
    let healthy = kubeconfig(&temp, "healthy", &fake.url, &fake);
    let refusing = kubeconfig(&temp, "refusing", &refusing_url(), &fake);
    let sites = |eu: &str, us: &str| {
        json!([
            {"name": "eu", "default": true, "backend": "kubernetes", "kubeconfig": eu, "namespace": "live-ns"},
            {"name": "us", "backend": "kubernetes", "kubeconfig": us, "namespace": "live-ns"},
        ])
        .to_string()
    };
    let one_down = temp.write("one-down.json", &sites(&healthy, &refusing)).display().to_string();
    let server = HttpServer::start(&[("MCP_K8S_LAZY_BACKEND", "0"), ("MCP_K8S_SITES", &one_down)]);
    let warning = server
        .startup_log
        .iter()
        .find(|line| line.contains("a site cannot run jobs now"))
        .unwrap_or_else(|| panic!("a warning naming the site: {:#?}", server.startup_log));
    let warning: Value = serde_json::from_str(warning).unwrap();
    assert_eq!((&warning["level"], &warning["site"]), (&json!("warning"), &json!("us")), "{warning}");
    assert!(warning["error"].as_str().unwrap_or_default().contains("could not list the background Jobs"), "{warning}");
    let readyz = server.request("GET", "/readyz", &[], "");
    assert_eq!((readyz.status, readyz.body.as_str()), (200, "ready\n"), "one site can run jobs");

    let all_down = temp.write("all-down.json", &sites(&refusing, &refusing)).display().to_string();
    let line = refusal(&[("MCP_K8S_LAZY_BACKEND", "0"), ("MCP_K8S_SITES", &all_down)]);
    assert!(line.starts_with("mcp-k8s-ephemeral-job: no site can run a job: site `eu`: could not list"), "{line}");
    assert!(line.contains("; site `us`: could not list"), "{line}");
}

/// `/readyz` until its status is `status` (each answer is a site's shared
/// ask, renewed each second): the last answer. Fails after 30 s.
fn readyz_until(server: &HttpServer, status: u16) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let readyz = server.request("GET", "/readyz", &[], "");
        if readyz.status == status || Instant::now() > deadline {
            return (readyz.status, readyz.body);
        }
    }
}

#[test]
fn readyz_is_503_while_no_site_can_run_a_job_and_says_why() {
    let without = HttpServer::start(&[("HOME", "/nonexistent-home"), ("MCP_K8S_DOCKER_HOST", "unix:///nonexistent/docker.sock")]);
    let readyz = without.request("GET", "/readyz", &[], "");
    assert_eq!(readyz.status, 503, "{}", readyz.body);
    assert!(readyz.body.starts_with("not ready: no backend can run a job: no cluster credentials ("), "{}", readyz.body);
    assert!(readyz.body.ends_with(")\n") && readyz.body.lines().count() == 1, "{}", readyz.body);
    assert_eq!(without.request("GET", "/healthz", &[], "").status, 200, "alive all the same");

    let (fake, temp) = (FakeApi::start(), TempDir::new("readiness-readyz"));
    let path = kubeconfig(&temp, "kubeconfig", &fake.url, &fake);
    let server = HttpServer::start(&[("MCP_K8S_KUBECONFIG", &path), ("MCP_K8S_NAMESPACE", "live-ns")]);
    assert_eq!(readyz_until(&server, 200), (200, "ready\n".to_string()));
    refuse_credentials(&fake);
    let (status, body) = readyz_until(&server, 503);
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("not ready: no backend can run a job: could not list the background Jobs: "), "{body}");
    assert!(body.contains("401") && body.contains("renew them"), "{body}");
    fake.accept(Accept::Anything);
    assert_eq!(readyz_until(&server, 200), (200, "ready\n".to_string()), "ready again once the credentials are taken");
}

/// Against an API server that refuses connections, or the credentials,
/// doctor says the cause once with its fix (an earlier doctor said the
/// refusal on thirteen lines, the last one blaming RBAC) and fails.
#[test]
fn doctor_says_a_cause_every_check_shares_once() {
    let (fake, temp) = (FakeApi::start(), TempDir::new("readiness-doctor"));
    let refusing = kubeconfig(&temp, "refusing", &refusing_url(), &fake);
    refuse_credentials(&fake);
    let denied = kubeconfig(&temp, "denied", &fake.url, &fake);
    let cases = [
        (
            refusing,
            "the Kubernetes API cannot be reached: cannot connect to",
            "check that the API server is up and that the server URL is right",
        ),
        (denied, "the Kubernetes API refused the server's credentials: GET /version: 401", "check that it has not expired or been revoked"),
    ];
    for (kubeconfig, cause, fix) in cases {
        let env =
            [("MCP_K8S_KUBECONFIG", kubeconfig.as_str()), ("MCP_K8S_NAMESPACE", "live-ns"), ("MCP_K8S_ALLOWED_IMAGES", "busybox:1.36")];
        let (code, stdout, stderr) = run(&["doctor"], &env);
        assert_eq!(code, Some(1), "{stdout}{stderr}");
        let failures: Vec<&str> = stdout.lines().filter(|line| line.starts_with("FAIL")).collect();
        assert_eq!(failures.len(), 1, "one line for the one cause:\n{stdout}");
        let api = "FAIL  Kubernetes API (the namespace, permission, pod template and check job checks need it and were not run)";
        assert!(failures[0].starts_with(&format!("{api}: {cause}")), "{stdout}");
        assert!(failures[0].contains(fix), "{stdout}");
        assert!(!stdout.contains("Role"), "nothing blames RBAC:\n{stdout}");
        assert!(stdout.contains("ok    MCP_K8S_ALLOWED_IMAGES allows busybox:1.36"), "the checks that need no API still run:\n{stdout}");
        assert_eq!(stdout.lines().last(), Some("some checks failed"), "{stdout}");
    }
}
