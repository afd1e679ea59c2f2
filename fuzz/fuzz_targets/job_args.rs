//! Fuzz target: JSON text → `tools::job_args::parse_run_args` → `RunSpec`,
//! then the Job and Secret manifests built from it. The configuration is
//! built from a `RawConfig` the way the config tests do, with clone and a
//! cache on so that every argument is reachable. Besides "no panic", an
//! accepted spec must hold what the checks promise: its image passes the
//! allowlist again as itself, its timeout is within bounds, its file paths
//! are already normalised and its files fit in one Secret.
#![no_main]

use std::sync::LazyLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use mcp_k8s_ephemeral_job::config::{Config, RawConfig};
use mcp_k8s_ephemeral_job::backend::kubernetes::manifest;
use mcp_k8s_ephemeral_job::backend::kubernetes::settings::Settings;
use mcp_k8s_ephemeral_job::engine::port::spec::Policy;
use mcp_k8s_ephemeral_job::tools::job_args::{self, MAX_INPUT_BYTES, arg_bounds};

static CONFIG: LazyLock<Config> = LazyLock::new(|| {
    let raw = RawConfig {
        allowed_images: Some(format!(
            "busybox:1.36, python:3.12-slim, golang:*, ghcr.io/acme/*, alpine@sha256:{}",
            "0123456789abcdef".repeat(4)
        )),
        clone_image: Some("alpine/git:2.45".into()),
        clone_secret: Some("git-tokens".into()),
        cache_pvc: Some("deps".into()),
        cache_mount_path: Some("/cache".into()),
        ..RawConfig::default()
    };
    Config::from_raw(&raw).expect("the fuzz configuration is valid")
});

/// What `main` hands the engine and the Kubernetes backend, from the same
/// configuration (cache and clone step on).
static POLICY: LazyLock<Policy> = LazyLock::new(|| mcp_k8s_ephemeral_job::wiring::policy(&CONFIG));
static CLUSTER: LazyLock<Settings> = LazyLock::new(|| Settings::from_config(&CONFIG));

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(serde_json::Value::Object(arguments)) = serde_json::from_str::<serde_json::Value>(text) else { return };
    let config = &*CONFIG;
    let bounds = arg_bounds(config);
    let Ok(run_spec) = job_args::parse_run_args(&arguments, &bounds) else { return };

    let rechecked = config.allowed_images.check(&run_spec.image).expect("an accepted image passes the allowlist again");
    assert_eq!(rechecked.to_string(), run_spec.image, "the normalised image is stable");
    assert!(run_spec.timeout >= Duration::from_secs(1) && run_spec.timeout <= bounds.max_timeout, "{:?}", run_spec.timeout);
    assert!(run_spec.workdir.starts_with('/'), "{}", run_spec.workdir);
    let mut total_bytes = 0;
    for file in &run_spec.files {
        assert_eq!(job_args::check_relative_path(&file.path).as_deref(), Ok(file.path.as_str()));
        assert!(file.mode <= 0o777, "{:o}", file.mode);
        total_bytes += file.content.len();
    }
    assert!(total_bytes <= MAX_INPUT_BYTES, "{total_bytes}");

    let job = manifest::job(&run_spec, &POLICY, &CLUSTER, "fuzz0123");
    let _ = job.to_string();
    if let Some(secret) = manifest::inputs_secret(&run_spec, &CLUSTER, "fuzz0123", "uid-fuzz") {
        let _ = secret.to_string();
    }
    let _ = mcp_k8s_ephemeral_job::engine::port::spec::run_deadline(&run_spec, &POLICY);
});
