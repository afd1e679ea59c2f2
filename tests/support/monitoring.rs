//! The PromQL of `deploy/monitoring/` (the alert rules and the dashboard's
//! panels) and the metric names the server exports, read from
//! `src/metrics.rs`, where every name is a string literal: reading them
//! there covers the families a fresh server does not show yet (pools,
//! callers, spans), which a scrape would miss.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

pub fn dashboard() -> Value {
    let path = monitoring_dir().join("dashboard.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// Each alert's name and expression, from `alerts.yaml`.
pub fn alert_exprs() -> Vec<(String, String)> {
    let path = monitoring_dir().join("alerts.yaml");
    let rules: Value = serde_saphyr::from_str(&read(&path)).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let mut exprs = Vec::new();
    for group in rules["groups"].as_array().expect("alerts.yaml has groups") {
        for rule in group["rules"].as_array().expect("a group has rules") {
            let alert = rule["alert"].as_str().expect("every rule is an alert").to_string();
            exprs.push((alert, rule["expr"].as_str().expect("an alert has an expr").to_string()));
        }
    }
    exprs
}

/// Each panel's title and the expressions of its targets.
pub fn dashboard_exprs() -> Vec<(String, String)> {
    let mut exprs = Vec::new();
    for panel in dashboard()["panels"].as_array().expect("the dashboard has panels") {
        let title = panel["title"].as_str().unwrap_or("?");
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push((title.to_string(), target["expr"].as_str().unwrap_or_default().to_string()));
        }
    }
    exprs
}

/// Every sample name `/metrics` can show: the families of `src/metrics.rs`,
/// with a histogram's `_bucket`, `_sum` and `_count`.
pub fn exported_metric_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for family in exported_families() {
        for suffix in ["", "_bucket", "_sum", "_count"] {
            names.insert(format!("{family}{suffix}"));
        }
    }
    names
}

/// The metric families `src/metrics.rs` renders (its code, not its tests).
pub fn exported_families() -> BTreeSet<String> {
    let source = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics.rs"));
    let code = source.split("#[cfg(test)]").next().unwrap_or_default();
    metric_names_in(code).into_iter().collect()
}

/// The `mcp_k8s_` names in `text`, in order (a PromQL expression, or
/// source code).
pub fn metric_names_in(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("mcp_k8s_") {
        let after = &rest[start..];
        let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
        names.push(after[..end].to_string());
        rest = &after[end..];
    }
    names
}
