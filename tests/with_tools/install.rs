//! `./install`, as the README tells a newcomer to run it: the static binary
//! under the prefix, runnable, with no program interpreter (a dynamically
//! linked one could not be the runner in an image without its libc).
//! `tests/run-all` built the same binary already (`tests/build-project-image`
//! calls `./install --build-only`), so this copies it.

use std::path::Path;
use std::process::Command;

#[test]
fn install_puts_a_static_binary_under_the_prefix() {
    let prefix = crate::support::TempDir::new("install-prefix");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new(root.join("install")).arg("--prefix").arg(&prefix.path).output().expect("./install runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "./install failed: {stderr}");
    let installed = prefix.path.join("bin/mcp-k8s-ephemeral-job");
    let last_line = String::from_utf8_lossy(&output.stdout).lines().last().unwrap_or_default().to_string();
    assert_eq!(Path::new(&last_line), installed, "it prints where it put the binary");
    let version = Command::new(&installed).arg("--version").output().expect("the installed binary runs");
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("mcp-k8s-ephemeral-job "), "{version:?}");
    let bytes = std::fs::read(&installed).unwrap();
    assert!(!has_interpreter(&bytes), "the installed binary is dynamically linked (it has a PT_INTERP header)");
}

/// Whether a 64-bit little-endian ELF file names a program interpreter
/// (`PT_INTERP`), which is what makes it dynamically linked.
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..4], b"\x7fELF", "an ELF file");
    let read = |at: usize, len: usize| elf[at..at + len].iter().rev().fold(0u64, |value, byte| value << 8 | u64::from(*byte));
    let (table, entry_size, entries) = (read(0x20, 8) as usize, read(0x36, 2) as usize, read(0x38, 2) as usize);
    (0..entries).any(|index| read(table + index * entry_size, 4) == 3)
}
