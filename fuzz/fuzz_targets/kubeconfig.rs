//! Fuzz target: kubeconfig text (YAML or JSON) → `kube::kubeconfig::Kubeconfig::parse`,
//! then `select` of the current context and of each named context, which
//! checks the user and cluster stanzas and decodes the `*-data` fields.
//! `select` reads files the kubeconfig names (CA, client certificate and
//! key); relative names resolve under a directory that does not exist, and
//! inputs that could spell a device, proc file or socket (`/dev`, `/proc`,
//! `/sys`, `/run`, or any escape) are only parsed, so a run never reads
//! `/dev/zero` or blocks on a FIFO.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use mcp_k8s_ephemeral_job::kube::kubeconfig::Kubeconfig;

fuzz_target!(|data: &[u8]| {
    let Ok(kubeconfig) = Kubeconfig::parse(data, Path::new("/nonexistent/mcp-k8s-fuzz/config")) else { return };
    let text = String::from_utf8_lossy(data);
    let may_name_a_special_file = ["/dev", "/proc", "/sys", "/run", "\\"].iter().any(|needle| text.contains(needle));
    if may_name_a_special_file {
        return;
    }
    let _ = kubeconfig.select(None);
    for context_name in kubeconfig.context_names() {
        if let Ok(cluster_config) = kubeconfig.select(Some(context_name)) {
            assert!(!cluster_config.server.is_empty(), "a selected cluster has a server");
            assert!(!cluster_config.namespace.is_empty(), "a selected context has a namespace");
        }
    }
});
