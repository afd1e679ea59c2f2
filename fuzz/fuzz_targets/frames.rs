//! Fuzz target: a container log → the runner's frame decoder
//! (`sandbox::frame::decode`, tags included) and the engine's reassembly
//! (`engine::run::collect::Collector::read_all`), with small caps. Checks that
//! nothing panics, that a decoded frame encodes back to one line that decodes
//! to the same frame, and that the collector keeps to its caps whatever the
//! log claims.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_k8s_ephemeral_job::engine::run::collect::Collector;
use mcp_k8s_ephemeral_job::sandbox::frame;

const MAX_OUTPUT_BYTES: u64 = 64;
const MAX_ARTIFACT_BYTES: u64 = 128;
/// `engine::run::collect` allows the runner's one-line marker on top of the cap.
const CAPTURE_MARKER_SLACK: u64 = 256;

fuzz_target!(|data: &[u8]| {
    for line in String::from_utf8_lossy(data).lines() {
        if let Ok(Some((tag, decoded))) = frame::decode(line) {
            let encoded = frame::encode(tag, &decoded);
            assert_eq!(encoded.matches('\n').count(), 1, "one frame is one line: {encoded:?}");
            assert_eq!(frame::decode(&encoded), Ok(Some((tag, decoded))), "re-encoded: {encoded:?}");
        }
    }

    let mut collector = Collector::new(MAX_OUTPUT_BYTES, MAX_ARTIFACT_BYTES);
    let mut live_bytes = 0;
    collector.read_all(&mut &data[..], &mut |chunk| live_bytes += chunk.bytes.len() as u64).expect("reading a slice cannot fail");
    assert!(collector.live_stdout.len() as u64 <= MAX_OUTPUT_BYTES);
    assert!(collector.live_stderr.len() as u64 <= MAX_OUTPUT_BYTES);
    assert!(live_bytes <= 2 * MAX_OUTPUT_BYTES);
    assert!(collector.captured_stdout.len() as u64 <= MAX_OUTPUT_BYTES + CAPTURE_MARKER_SLACK);
    assert!(collector.captured_stderr.len() as u64 <= MAX_OUTPUT_BYTES + CAPTURE_MARKER_SLACK);
    let artifact_bytes: u64 =
        collector.artifacts.iter().filter_map(|artifact| artifact.content.as_ref()).map(|content| content.len() as u64).sum();
    assert!(artifact_bytes <= MAX_ARTIFACT_BYTES, "{artifact_bytes}");
    assert!(collector.problems.len() <= 20);
});
