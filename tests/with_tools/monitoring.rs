//! `deploy/monitoring/` loaded into the real tool: promtool (built from the
//! Go module proxy by `tests/cluster/build-promtool`) checks the alert
//! rules, parses every query of the dashboard (as recording rules of a
//! temporary rules file), and lints a real `/metrics` scrape of the built
//! server. The dashboard's JSON is checked for what Grafana needs to import
//! it. That the queries name only exported metrics is the offline tier's
//! (`monitoring::`).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::helm_chart::cached_binary;
use crate::support::TempDir;
use crate::support::monitoring::{dashboard, dashboard_exprs, monitoring_dir};
use crate::support::server::HttpServer;

fn promtool() -> PathBuf {
    cached_binary("promtool", "tests/cluster/build-promtool")
}

/// Runs promtool with `args`, `stdin` fed to it; panics with its output
/// when it fails.
fn check(args: &[&str], stdin: &str) -> String {
    let mut child = Command::new(promtool())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("feed promtool");
    let output = child.wait_with_output().expect("promtool ran");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "promtool {args:?}: {}\n{text}", output.status);
    text
}

#[test]
fn promtool_accepts_the_alert_rules() {
    let path = monitoring_dir().join("alerts.yaml");
    let text = check(&["check", "rules", path.to_str().expect("a UTF-8 path")], "");
    assert!(text.contains("SUCCESS"), "{text}");
}

#[test]
fn every_dashboard_query_parses_as_promql() {
    let exprs = dashboard_exprs();
    // Grafana's variables are not PromQL; the dashboard uses `$job` only
    // inside a label matcher's string, where any text parses.
    let rules: Vec<Value> =
        exprs.iter().enumerate().map(|(index, (_, expr))| json!({"record": format!("dashboard:query_{index}"), "expr": expr})).collect();
    let temp = TempDir::new("promtool-dashboard");
    // JSON is YAML.
    let file = temp.write("dashboard-queries.yaml", &json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string());
    let text = check(&["check", "rules", file.to_str().expect("a UTF-8 path")], "");
    assert!(text.contains(&format!("{} rules found", exprs.len())), "{text}");
}

#[test]
fn promtool_finds_nothing_to_lint_in_a_real_scrape() {
    let server = HttpServer::start(&[]);
    // A few answers first, so the labelled families have samples.
    assert_eq!(server.request("GET", "/healthz", &[], "").status, 200);
    assert_eq!(server.request("GET", "/no-such-path", &[], "").status, 404);
    let scrape = server.request("GET", "/metrics", &[], "");
    assert_eq!(scrape.status, 200);
    for family in ["mcp_k8s_build_info", "mcp_k8s_tool_calls_total", "mcp_k8s_http_requests_total", "mcp_k8s_runs_total"] {
        assert!(scrape.body.contains(&format!("# TYPE {family} ")), "{family} missing:\n{}", scrape.body);
    }
    assert!(scrape.body.contains("mcp_k8s_http_requests_total{route=\"other\",code=\"404\"} 1"), "{}", scrape.body);
    check(&["check", "metrics"], &scrape.body);
}

#[test]
fn the_dashboard_has_what_grafana_needs_to_import_it() {
    let dashboard = dashboard();
    for field in ["title", "uid"] {
        assert!(dashboard[field].as_str().is_some_and(|text| !text.is_empty()), "no {field}");
    }
    assert!(dashboard["uid"].as_str().is_some_and(|uid| uid.len() <= 40), "Grafana's uids are at most 40 characters");
    let variables = dashboard["templating"]["list"].as_array().expect("templating.list");
    let datasource = variables.iter().find(|variable| variable["type"] == "datasource").expect("a data source variable");
    assert_eq!(datasource["query"], "prometheus");
    let name = datasource["name"].as_str().expect("the variable's name");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut ids = std::collections::BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().expect("every panel has a title");
        assert!(ids.insert(panel["id"].as_u64().expect("a numeric id")), "`{title}`: ids are unique");
        assert!(["timeseries", "stat"].contains(&panel["type"].as_str().unwrap_or_default()), "`{title}`: {}", panel["type"]);
        assert_eq!(panel["datasource"]["uid"], format!("${{{name}}}"), "`{title}` queries the chosen data source");
        let position = &panel["gridPos"];
        for field in ["x", "y", "w", "h"] {
            assert!(position[field].is_u64(), "`{title}`: gridPos.{field}");
        }
        assert!(position["x"].as_u64().unwrap_or(0) + position["w"].as_u64().unwrap_or(0) <= 24, "`{title}` fits the 24 columns");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "`{title}` has a query");
        for target in targets {
            assert!(target["expr"].as_str().is_some_and(|expr| !expr.is_empty()), "`{title}`: a target without expr");
            assert!(target["refId"].is_string(), "`{title}`: a target without refId");
        }
    }
}
