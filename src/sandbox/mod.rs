//! The contract between the server and the in-sandbox runner, and nothing
//! else: the frame format the runner writes and the engine reads
//! (`frame`), the command lines the engine writes into the pod spec and the
//! runner parses (`args`), the inputs manifest (`inputs`), the probe line
//! `doctor` reads back (`probe`), a warm sandbox's assignment
//! (`assignment`), output held in the sandbox for the server to fetch
//! (`held`), and the defaults both sides agree on
//! (here), with the random bytes and hex of keys and tags. Each of these
//! is defined once, so the two halves cannot drift.
//!
//! Deliberately knows no Kubernetes, no MCP and no run logic: it imports
//! nothing from the crate, and both `engine` and `runner` import it.

pub mod args;
pub mod assignment;
pub mod frame;
pub mod held;
pub mod inputs;
pub mod probe;
pub mod session;

use std::time::Duration;

const _: () = assert!(held::PORT == assignment::PORT, "held output and assignments share the port the NetworkPolicies open");

/// The command's working directory when the caller names none.
pub const WORKDIR: &str = "/work";
/// Where the runner binary is copied to and run from in the sandbox.
pub const BIN_DIR: &str = "/mcp/bin";
/// Where the inputs (manifest and contents, see `inputs`) are mounted for
/// `runner init`.
pub const INPUTS_DIR: &str = "/mcp/inputs";
/// Where the clone Secret is mounted in the `clone` container.
pub const CREDS_DIR: &str = "/mcp/git-creds";
/// The writable scratch folder of the main container, and its `$HOME` when
/// nobody set one: with a read-only root it is the only writable place
/// besides the workdir.
pub const TMP_DIR: &str = "/tmp";
/// Where the kubelet picks up the termination message by default.
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// Time the runner gives the command between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// `N` bytes from the kernel's random source: a warm sandbox's key, a
/// run's frame tag.
pub fn random_bytes<const N: usize>() -> Result<[u8; N], String> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; N];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| "the system's random source failed".to_string())?;
    Ok(bytes)
}

/// Whether `left` and `right` are equal, compared without an early exit,
/// so the time taken says nothing about how much of a guess was right
/// (lengths may differ in time: they are not secret).
pub fn constant_time_eq(left: &[u8], right: &[u8]) -> bool {
    if left.len() != right.len() {
        return false;
    }
    let difference = left.iter().zip(right).fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(difference) == 0
}

/// Whether `text` is exactly `bytes` bytes as `to_hex` writes them
/// (lowercase only): how ids, run ids and tags look.
pub fn is_lower_hex(text: &str, bytes: usize) -> bool {
    text.len() == 2 * bytes && text.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

/// Bytes as lowercase hex, as keys and tags are written.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The inverse of `to_hex`, either case; `None` unless `text` is exactly
/// `2 * N` hex digits.
pub fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return None;
    }
    let mut bytes = [0u8; N];
    for (index, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * index..2 * index + 2], 16).ok()?;
    }
    Some(bytes)
}

/// Threads `probe-pids` starts at most unless told otherwise: well above
/// the podPidsLimit an operator would choose, well below what a node has.
pub const PROBE_CEILING: u64 = 4096;
