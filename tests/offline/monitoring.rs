//! `deploy/monitoring/` names only what the server exports: every metric in
//! an alert or a dashboard panel is one `src/metrics.rs` renders, so a
//! renamed metric cannot leave a panel empty or an alert silent. Parsing
//! the PromQL is the `with_tools` tier's (`monitoring::`, with promtool).

use crate::support::monitoring::{alert_exprs, dashboard_exprs, exported_families, exported_metric_names, metric_names_in};

#[test]
fn alerts_and_dashboard_name_only_exported_metrics() {
    let exported = exported_metric_names();
    assert!(exported.contains("mcp_k8s_tool_call_duration_seconds_bucket"), "{exported:?}");
    let exprs: Vec<(String, String)> = alert_exprs().into_iter().chain(dashboard_exprs()).collect();
    assert!(exprs.len() > 20, "{exprs:?}");
    for (name, expr) in exprs {
        let names = metric_names_in(&expr);
        assert!(!names.is_empty(), "`{name}` queries no metric of the server: {expr}");
        for metric in names {
            assert!(exported.contains(&metric), "`{name}` queries `{metric}`, which the server does not export: {expr}");
        }
    }
}

#[test]
fn every_exported_family_is_in_docs_metrics_md() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).expect("docs/metrics.md");
    for family in exported_families() {
        assert!(docs.contains(&format!("`{family}`")), "docs/metrics.md does not list `{family}`");
    }
}
