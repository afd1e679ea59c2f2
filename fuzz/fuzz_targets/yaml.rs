//! Fuzz target: any text → `yaml::parse` and `yaml::from_str` into a
//! `serde_json::Value` (the pod template's path). Beyond "no panic": an
//! accepted document's nesting keeps to `MAX_DEPTH`, and the tree it reads
//! deserializes the same way twice.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_k8s_ephemeral_job::yaml::{self, MAX_DEPTH, Node, Value};

fn depth(node: &Node) -> usize {
    match &node.value {
        Value::Sequence(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Mapping(entries) => 1 + entries.iter().map(|(_, value)| depth(value)).max().unwrap_or(0),
        _ => 0,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(node) = yaml::parse(text) else { return };
    assert!(depth(&node) <= MAX_DEPTH + 1, "nested deeper than the bound");
    let first = yaml::from_str::<serde_json::Value>(text).ok();
    let second = yaml::from_str::<serde_json::Value>(text).ok();
    assert_eq!(first.is_some(), second.is_some());
});
