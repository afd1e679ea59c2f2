//! The arm64 build, checked without an arm64 machine: the static
//! `aarch64-unknown-linux-musl` binary runs under qemu user emulation
//! (`--version`, and `runner exec -- echo hi` with its frames decoded by the
//! project's own frame format), and the multi-architecture image archive
//! holds an index of two manifests (amd64, arm64) whose digests match their
//! blobs. Both are made by `tests/build-arm64`; a missing one fails with that
//! command, never passes quietly. Knows nothing of how they were built.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use mcp_k8s_ephemeral_job::sandbox::frame::{self, Frame, Stream};
use serde_json::Value;

const BUILD: &str = "run tests/build-arm64 (it builds the arm64 binary and the image index archive)";
/// ELF `e_machine` of AArch64.
const EM_AARCH64: u16 = 183;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn arm64_binary() -> PathBuf {
    let path = repo().join("target/aarch64-unknown-linux-musl/release/mcp-k8s-ephemeral-job");
    assert!(path.is_file(), "no arm64 binary at {}: {BUILD}", path.display());
    path
}

fn qemu(args: &[&str]) -> std::process::Output {
    let binary = arm64_binary();
    match Command::new("qemu-aarch64-static").arg(&binary).args(args).output() {
        Ok(output) => output,
        Err(error) => panic!("cannot start qemu-aarch64-static ({error}): apt-get install qemu-user-static, then {BUILD}"),
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("arm64-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_binary_is_a_static_aarch64_elf() {
    let bytes = fs::read(arm64_binary()).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), EM_AARCH64, "not built for aarch64");
    // A static binary has no program interpreter (PT_INTERP names the
    // dynamic loader, which a FROM scratch image does not have).
    assert!(!bytes.windows(b"/lib/ld-".len()).any(|window| window == b"/lib/ld-"), "names a dynamic loader");
}

#[test]
fn version_runs_under_qemu() {
    let output = qemu(&["--version"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "--version failed: {output:?}");
    assert!(stdout.contains(env!("CARGO_PKG_VERSION")), "{stdout}");
}

#[test]
fn runner_exec_writes_its_frames_under_qemu() {
    let workdir = scratch("exec");
    let workdir_arg = workdir.to_string_lossy().into_owned();
    let log = workdir.join("termination-log").to_string_lossy().into_owned();
    // `echo` is the host's: qemu emulates only the runner, whose child is
    // started by the host kernel.
    let output = qemu(&["runner", "exec", "--workdir", &workdir_arg, "--termination-log", &log, "--", "echo", "hi"]);
    let text = String::from_utf8(output.stdout.clone()).expect("frames are UTF-8");
    let frames: Vec<Frame> = text.lines().map(|line| frame::decode(line).expect("valid frame").expect("only frames on stdout").1).collect();
    assert!(matches!(frames.first(), Some(Frame::Started(_))), "{text}");
    let Some(Frame::Result(result)) = frames.last() else { panic!("the last frame is not the result: {text}") };
    assert_eq!(result.exit_code, Some(0), "{text}");
    assert_eq!(result.start_error, None);
    let mut captured = Vec::new();
    for frame in &frames {
        if let Frame::Captured(chunk) = frame
            && chunk.stream == Stream::Stdout
        {
            captured.extend(frame::from_base64(&chunk.data_b64).unwrap());
        }
    }
    assert_eq!(captured, b"hi\n");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let _ = fs::remove_dir_all(&workdir);
}

/// The archive unpacked into a scratch folder.
fn unpacked_index() -> PathBuf {
    let archive = repo().join("target/oci/mcp-k8s-ephemeral-job-multiarch.tar");
    assert!(archive.is_file(), "no image index archive at {}: {BUILD}", archive.display());
    let dir = scratch("index");
    let status = Command::new("tar").arg("-xf").arg(&archive).arg("-C").arg(&dir).status().unwrap();
    assert!(status.success(), "tar -xf {} failed", archive.display());
    dir
}

/// Reads a blob named by a descriptor, checking its digest and size.
fn blob(layout: &Path, descriptor: &Value) -> Vec<u8> {
    let digest = descriptor["digest"].as_str().expect("descriptor digest");
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    let bytes = fs::read(layout.join("blobs/sha256").join(hex)).unwrap_or_else(|error| panic!("blob {digest}: {error}"));
    let actual: String = ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref().iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(actual, hex, "blob content does not match its digest");
    assert_eq!(descriptor["size"].as_u64(), Some(bytes.len() as u64), "size of {digest}");
    bytes
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("a JSON blob")
}

#[test]
fn the_image_index_has_an_amd64_and_an_arm64_manifest() {
    let layout = unpacked_index();
    let top = json(&fs::read(layout.join("index.json")).unwrap());
    let entries = top["manifests"].as_array().expect("index.json manifests");
    assert_eq!(entries.len(), 1, "one named image");
    assert_eq!(entries[0]["mediaType"], "application/vnd.oci.image.index.v1+json");
    let index = json(&blob(&layout, &entries[0]));
    let manifests = index["manifests"].as_array().expect("index manifests");
    let mut architectures = Vec::new();
    for descriptor in manifests {
        assert_eq!(descriptor["platform"]["os"], "linux");
        let architecture = descriptor["platform"]["architecture"].as_str().expect("platform architecture").to_string();
        let manifest = json(&blob(&layout, descriptor));
        let config = json(&blob(&layout, &manifest["config"]));
        assert_eq!(config["architecture"], architecture.as_str(), "the config agrees with the index");
        assert_eq!(config["config"]["Entrypoint"][0], "/mcp-k8s-ephemeral-job");
        assert_eq!(config["config"]["User"], "65532:65532");
        let layers = manifest["layers"].as_array().expect("layers");
        assert_eq!(layers.len(), 1);
        blob(&layout, &layers[0]);
        architectures.push(architecture);
    }
    architectures.sort();
    assert_eq!(architectures, ["amd64", "arm64"]);
    let _ = fs::remove_dir_all(&layout);
}
