//! Two servers that start open runs at once on a fresh daemon may both
//! create the open network: Docker lets two creates of one name succeed,
//! and a container on a name two networks share cannot start ("network
//! mcp-k8s-open is ambiguous"). Here the duplicate is made on purpose (on a
//! private daemon: on the shared one it would break other tests' runs in
//! the moment it exists); the next open run must remove it and succeed.

use serde_json::json;

use crate::PrivateDaemon;
use crate::restart::{call, server};
use mcp_k8s_ephemeral_job::backend::docker::spec::{OPEN_NETWORK, open_network};
use mcp_k8s_ephemeral_job::docker::objects::NetworkSpec;

#[test]
fn a_duplicate_open_network_is_removed_and_the_run_starts() {
    let daemon = PrivateDaemon::start("dup");
    let client = daemon.client();
    // What two creates at once leave: the daemon's duplicate check is
    // best effort, and a second create without it always succeeds.
    client.network_create(&open_network()).expect("docker network create");
    let unchecked = NetworkSpec { check_duplicate: false, ..open_network() };
    client.network_create(&unchecked).expect("docker network create, a second time");
    let named = |client: &mcp_k8s_ephemeral_job::docker::Client| {
        client.network_list().expect("docker network ls").into_iter().filter(|network| network.name == OPEN_NETWORK).count()
    };
    assert_eq!(named(&client), 2, "the daemon kept both creates of one name");
    let mut server = server(&daemon);
    let arguments = json!({"image": crate::BUSYBOX, "command": ["true"], "network": "open"});
    let outcome = call(&mut server, 1, "run_job", arguments);
    assert_eq!(outcome["status"], "succeeded", "{outcome}");
    assert_eq!(named(&client), 1, "the duplicate is gone");
}
