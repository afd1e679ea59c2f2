//! The server's stderr logs carry metadata only: a run whose command,
//! environment, input file and output all hold secret-looking values, at
//! the most verbose log level, leaves none of them in the logs (and the
//! values do reach the caller, so the test is not vacuous).

use std::time::Duration;

use crate::support::cluster::{self, BUSYBOX};
use crate::support::server::StdioServer;
use base64::Engine as _;
use serde_json::json;

const IN_COMMAND: &str = "sk-live-command-4b1d9e";
const IN_ENV: &str = "ghp_envValue8c2f71";
const IN_FILE: &str = "AKIA-file-content-55e0";
const FILE_NAME: &str = "credentials-3a9f.txt";

#[test]
fn secrets_in_command_env_and_files_never_reach_the_logs() {
    let mut env = cluster::server_env();
    env.push(("MCP_K8S_LOG_LEVEL".into(), "debug".into()));
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let mut server = StdioServer::start(&env_refs);
    server.initialize();
    let script = format!("echo {IN_COMMAND}; echo \"$API_TOKEN\"; cat {FILE_NAME} >&2");
    let arguments = json!({
        "image": BUSYBOX,
        "command": ["sh", "-c", script],
        "env": {"API_TOKEN": IN_ENV},
        "files": [{"path": FILE_NAME, "content_b64": base64::engine::general_purpose::STANDARD.encode(IN_FILE)}],
    });
    server.send(
        &json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "run_job", "arguments": arguments}}).to_string(),
    );
    let response = server.recv_within(Duration::from_secs(120));
    let structured = &response["result"]["structuredContent"];
    assert_eq!(structured["stdout"], format!("{IN_COMMAND}\n{IN_ENV}\n"), "{response}");
    assert_eq!(structured["stderr"], IN_FILE, "{response}");
    cluster::assert_nothing_left(structured["run_id"].as_str().expect("run_id"));

    server.close_stdin();
    assert!(
        crate::support::server::wait_exit(&mut server.child, Duration::from_secs(30)).is_some(),
        "the server exits at the end of stdin"
    );
    // The reader thread ends at the pipe's end, which closes the channel.
    let mut logs = Vec::new();
    while let Ok(line) = server.stderr.recv_timeout(Duration::from_secs(5)) {
        logs.push(line);
    }
    assert!(logs.iter().any(|line| line.contains("run finished")), "the run was logged: {logs:#?}");
    for line in &logs {
        assert!(serde_json::from_str::<serde_json::Value>(line).is_ok(), "not a JSON log line: {line}");
        for secret in [IN_COMMAND, IN_ENV, IN_FILE, FILE_NAME] {
            assert!(!line.contains(secret), "`{secret}` leaked into the logs: {line}");
        }
    }
}
