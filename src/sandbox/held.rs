//! Output held in the sandbox for the server to fetch: on Kubernetes the
//! runner writes what it sends whole for the output store (a stream past
//! the inline cap, a file past the artifact cap) to a file of its own
//! volume instead of the container log, whose rotation (10 MiB by default)
//! loses what a late or slow reader has not read yet. When the command
//! has ended it says so on the log (`frame::Held`), serves that file on
//! its port to the server through the API server's `pods/proxy`, and
//! writes its result only once the server has released it (or `WAIT`
//! passed). The held file holds the same frames the log would have.
//!
//! The key: the server derives it from the run id (`key`), so that every
//! replica that follows the run can fetch; the pod spec carries only its
//! digest (`digest`), which the runner compares with what a request
//! offers. The run id is the job token's capability already, and the
//! sandbox's port is reachable only from the API server's side (a
//! NetworkPolicy), so the key adds that a request names this run.
//!
//! Like `assignment`, the key travels in the body: the API server's proxy
//! strips `Authorization`. Knows nothing of HTTP or sockets.

use std::time::Duration;

/// The port the runner serves the held output on: the warm pool's
/// (`assignment::PORT`, checked in `sandbox`), so that one NetworkPolicy
/// port serves both.
pub const PORT: u16 = 7777;
/// `POST` with the key: the held file, whole.
pub const FETCH_PATH: &str = "/held";
/// `POST` with the key: the server has what it needs; the runner goes on.
pub const RELEASE_PATH: &str = "/release";
/// The volume the held file is on, mounted in the main container only.
pub const DIR: &str = "/mcp/held";
/// The held file.
pub const FILE: &str = "/mcp/held/frames";
/// How long the runner serves after saying it holds output, when nobody
/// releases it: a server that cannot fetch (no `pods/proxy`, a policy in
/// the way) costs the run this long, and its links say why they are
/// incomplete.
pub const WAIT: Duration = Duration::from_secs(60);

/// The runner's options for holding output (`--hold-port`,
/// `--hold-key-sha256`).
#[derive(Clone, Debug, PartialEq)]
pub struct HoldOptions {
    pub port: u16,
    /// Hex SHA-256 of the key the server will offer.
    pub key_sha256: String,
}

/// The run's key, as hex: the same for every replica that knows the run.
pub fn key(run_id: &str) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(b"mcp-k8s-ephemeral-job held output\n");
    context.update(run_id.as_bytes());
    super::to_hex(context.finish().as_ref())
}

/// What the pod spec carries of a key.
pub fn digest(key: &str) -> String {
    super::to_hex(ring::digest::digest(&ring::digest::SHA256, key.trim().as_bytes()).as_ref())
}

/// A fetch's body: the key, and where in the held file to start (a fetch
/// cut off is resumed where its last whole frame ended).
pub fn fetch_body(key: &str, offset: u64) -> String {
    format!("{key} {offset}")
}

/// The inverse of `fetch_body`: the key offered and the offset (0 when
/// the body is the key alone, as a release's is).
pub fn parse_body(body: &[u8]) -> Option<(&str, u64)> {
    let text = std::str::from_utf8(body).ok()?.trim();
    match text.split_once(' ') {
        Some((key, offset)) => Some((key, offset.parse().ok()?)),
        None => Some((text, 0)),
    }
}

/// Whether `offered` is the key whose digest is `key_sha256`; compares
/// the digests without an early exit.
pub fn matches(offered: &[u8], key_sha256: &str) -> bool {
    let Ok(offered) = std::str::from_utf8(offered) else { return false };
    super::constant_time_eq(digest(offered).as_bytes(), key_sha256.as_bytes())
}

/// The size limit of the held volume for a run that may send
/// `spill_bytes` whole: base64 in frames adds a third, and a frame's own
/// fields a little more per chunk.
pub fn volume_bytes(spill_bytes: u64) -> u64 {
    spill_bytes.saturating_mul(3) / 2 + (16 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_runs_and_only_its_digest_opens() {
        let key = key("0123456789abcdef0123456789abcdef");
        assert_eq!(key.len(), 64);
        assert_ne!(key, super::key("0123456789abcdef0123456789abcdee"));
        let digest = digest(&key);
        assert!(matches(key.as_bytes(), &digest));
        assert!(matches(format!("{key}\n").as_bytes(), &digest), "a trailing newline is not part of the key");
        assert!(!matches(digest.as_bytes(), &digest), "the digest is not the key");
        assert!(!matches(b"", &digest));
        assert!(!matches(&[0xff, 0xfe], &digest));
        assert_eq!(parse_body(fetch_body(&key, 1234).as_bytes()), Some((key.as_str(), 1234)));
        assert_eq!(parse_body(format!("{key}\n").as_bytes()), Some((key.as_str(), 0)));
        assert_eq!(parse_body(format!("{key} -1").as_bytes()), None);
    }
}
