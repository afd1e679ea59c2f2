//! The static release binary users deploy (x86_64 musl, the one
//! `tests/build-project-image` builds through `./install --build-only`):
//! it stays within its 5 MiB goal, and it is built without the test
//! server's code (no `testing` feature), so it refuses the test server's
//! settings with a message instead of quietly ignoring them. A missing
//! binary fails naming the script that builds it.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};

const BUILD: &str = "run tests/build-project-image (it builds the static release binary)";

/// The goal for the binary users deploy: 5 MiB. Where the bytes go and
/// what was measured: docs/benchmarks.md, "Binary size".
const GOAL_BYTES: u64 = 5 * 1024 * 1024;

fn static_binary() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/x86_64-unknown-linux-musl/release/mcp-k8s-ephemeral-job");
    assert!(path.is_file(), "no static binary at {}: {BUILD}", path.display());
    path
}

#[test]
fn the_static_binary_stays_within_5_mib() {
    let bytes = fs::metadata(static_binary()).map(|metadata| metadata.len()).unwrap_or_else(|error| panic!("{error}: {BUILD}"));
    assert!(
        bytes <= GOAL_BYTES,
        "the static binary is {bytes} bytes, over its goal of {GOAL_BYTES} (5 MiB); \
         docs/benchmarks.md (Binary size) says where the bytes go"
    );
}

/// Each test server's setting stops the release binary at start (exit 2)
/// with a message naming it; `0` asks for nothing and is no error.
#[test]
fn the_static_binary_refuses_the_test_servers_settings() {
    let cases = [("MCP_K8S_TEST_TOOLS", "1"), ("MCP_K8S_CONFORMANCE_FIXTURES", "1"), ("MCP_K8S_TEST_PANIC_THREAD", "reaper")];
    for (variable, value) in cases {
        let output = Command::new(static_binary())
            .env_clear()
            .env(variable, value)
            .env("MCP_K8S_LAZY_BACKEND", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|error| panic!("the static binary does not start: {error}"));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{variable}={value}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "{variable} is not in this build: the test hooks and the conformance fixtures are built for tests only"
            )),
            "{variable}={value}: {stderr}"
        );
    }
    // `0` is taken: the server starts, serves stdio and ends with it.
    let output = Command::new(static_binary())
        .env_clear()
        .env("MCP_K8S_TEST_TOOLS", "0")
        .env("MCP_K8S_LAZY_BACKEND", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("the static binary does not start: {error}"));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}
