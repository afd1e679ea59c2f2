//! Fuzz target: image references and the allowlist (`images::normalise`,
//! `images::Allowlist`). The input is an allowlist (`MCP_K8S_ALLOWED_IMAGES`
//! text) on its first line and an image reference after it; without a
//! newline it is a reference checked against a fixed list. Besides "no
//! panic": a normalised reference renders and re-parses to itself; an image
//! the list admits is admitted again in its normalised form (that form is
//! what the pod runs); and every plain entry admits its own spelling.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_k8s_ephemeral_job::images::{self, Allowlist};

const FIXED_LIST: &str = "busybox:1.36, python:3.12-slim, golang:*, ghcr.io/acme/*, localhost:5000/app:v1";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (csv, image) = text.split_once('\n').unwrap_or((FIXED_LIST, text));

    if let Ok(image_ref) = images::normalise(image) {
        let rendered = image_ref.to_string();
        assert_eq!(images::normalise(&rendered).as_ref(), Ok(&image_ref), "`{image}` rendered as `{rendered}`");
    }

    let Ok(allowlist) = Allowlist::parse(csv) else { return };
    if let Ok(admitted) = allowlist.check(image) {
        let rendered = admitted.to_string();
        assert_eq!(allowlist.check(&rendered).as_ref(), Ok(&admitted), "`{image}` admitted as `{rendered}`");
    }
    for entry in &allowlist.as_written {
        if !entry.ends_with("/*") && !entry.ends_with(":*") {
            assert!(allowlist.check(entry).is_ok(), "entry `{entry}` does not admit itself");
        }
    }
});
