//! Open sandboxes where Kubernetes itself takes part (the table both
//! backends share is `contract::sandboxes`): a sandbox's pod deleted
//! from outside while a call runs.

use std::time::Duration;

use crate::support::cluster::{self, BUSYBOX, NAMESPACE};
use mcp_k8s_ephemeral_job::kube;
use serde_json::{Value, json};

/// A request's response, the progress messages before it passed to
/// `on_progress` (which may act on them).
fn request(server: &mut crate::support::server::StdioServer, id: u64, params: Value, on_progress: &mut dyn FnMut(&str)) -> Value {
    server.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string());
    loop {
        let message = server.recv_within(Duration::from_secs(180));
        if message["id"] == id {
            return message["result"].clone();
        }
        if message["method"] == "notifications/progress" {
            on_progress(message["params"]["message"].as_str().unwrap_or_default());
        }
    }
}

/// The sandbox's Job and Secret, deleted when dropped whatever the test did.
struct Removed(String);

impl Drop for Removed {
    fn drop(&mut self) {
        let client = cluster::admin_client();
        let name = format!("mcpk8s-{}", self.0);
        let _ = client.delete(kube::Resource::JOBS, NAMESPACE, &name);
        let _ = client.delete(kube::Resource::SECRETS, NAMESPACE, &name);
    }
}

/// The runner of a deleted pod reports only the SIGTERM it got; the call's
/// result says the pod was deleted (its `deletionTimestamp` is seen), not
/// that nobody was seen deleting it, as it used to every time.
#[test]
fn a_call_whose_sandbox_pod_is_deleted_says_the_pod_was_deleted() {
    let _together = crate::contract::sandboxes::together();
    let mut server = cluster::server(&[]);
    let opened = request(&mut server, 1, json!({"name": "open_sandbox", "arguments": {"image": BUSYBOX}}), &mut |_| {});
    let id = opened["structuredContent"]["sandbox"].as_str().unwrap_or_else(|| panic!("no sandbox: {opened}")).to_string();
    let name = mcp_k8s_ephemeral_job::engine::sandboxes::rules::public_name(&id);
    let _removed = Removed(name.clone());
    let arguments = json!({"sandbox": id, "command": ["sh", "-c", "echo started; sleep 300"], "timeout_s": 600});
    let params = json!({"name": "run_job", "arguments": arguments, "_meta": {"progressToken": "p"}});
    let mut deleted = false;
    let ended = request(&mut server, 2, params, &mut |progress| {
        // The command's own output, not the "the command started" notice that
        // comes before the echo: deleting then would rightly leave no stdout.
        if progress.contains("[stdout] started") && !deleted {
            let client = cluster::admin_client();
            let selector = kube::ListParams { label_selector: Some(format!("mcp-k8s-ephemeral-job/sandbox={name}")), field_selector: None };
            for pod in client.list(kube::Resource::PODS, NAMESPACE, &selector).unwrap().items {
                client.delete(kube::Resource::PODS, NAMESPACE, pod["metadata"]["name"].as_str().unwrap()).unwrap();
                deleted = true;
            }
        }
    });
    assert!(deleted, "the sandbox's pod was found and deleted: {ended}");
    let ended = &ended["structuredContent"];
    assert_eq!(ended["reason"], "SandboxEnded", "{ended}");
    let message = ended["message"].as_str().unwrap_or_default();
    assert!(message.contains("pod was deleted while the call ran"), "{ended}");
    assert!(!message.contains("no eviction or deletion was seen"), "{ended}");
    assert_eq!(ended["stdout"], "started\n", "{ended}");
}
