//! `doctor` for the Docker backend: the daemon answers and speaks API 1.41
//! or later, the allowed images are present (they are never pulled unless
//! MCP_K8S_DOCKER_PULL=missing), the runner binary exists and is static
//! (it runs inside images with any or no libc), and a check run goes
//! through the engine exactly as a job would.
//!
//! Knows `Config`, the engine (to run a check job) and `docker`; nothing
//! of MCP.

use crate::backend::docker::spec;
use crate::backend::{self, Check};
use crate::config::Config;
use crate::docker;
use crate::engine;
use crate::engine::port::spec::RunStatus;
use crate::network::NetworkMode;

/// Runs every check, handing each to `report` when done; true when all passed.
pub fn run(
    config: &Config,
    ctx: &engine::run::Ctx,
    client: &docker::Client,
    options: &spec::Options,
    report: &mut dyn FnMut(&Check),
) -> bool {
    let mut all_passed = true;
    let mut emit = |check: Check| {
        all_passed &= check.passed;
        report(&check);
    };
    emit(check_daemon(client));
    emit(check_storage(client));
    let images: Vec<&String> = config.allowed_images.as_written.iter().filter(|image| !image.contains('*')).collect();
    if images.is_empty() {
        emit(Check::fail("MCP_K8S_ALLOWED_IMAGES names no image (patterns are not checked); every job would be refused"));
    }
    for image in &images {
        emit(check_image(client, image, options.pull));
    }
    // A language's image is allowed by the list or by the languages file;
    // the list's are checked just above.
    for (image, names) in backend::language_images(config) {
        if !images.iter().any(|allowed| **allowed == image) {
            let check = check_image(client, &image, options.pull);
            emit(Check { text: format!("execute_code ({}): {}", names.join(", "), check.text), ..check });
        }
    }
    if let Some(left_out) = backend::languages_left_out(config) {
        emit(left_out);
    }
    emit(check_runner_binary(&options.runner_binary));
    if let Some(network) = &config.docker_network {
        emit(check_restricted_network(client, network));
    }
    if let Some(image) = images.first() {
        emit(check_run(ctx, image, config.network_default));
    }
    all_passed
}

fn check_daemon(client: &docker::Client) -> Check {
    match client.ping() {
        Ok(()) => Check::pass(format!(
            "Docker daemon at {} answers: engine {}, API {} (using {})",
            client.socket().display(),
            client.version().version,
            client.version().api_version,
            client.api_version()
        )),
        Err(error) => Check::fail(format!("Docker daemon: {error}")),
    }
}

/// Informational: whether the storage driver could bound the workdir.
fn check_storage(client: &docker::Client) -> Check {
    match client.info() {
        Ok(info) => Check::pass(format!(
            "storage driver `{}`: the workdir's size is bounded by the runner's disk watch (MCP_K8S_WORKDIR_SIZE), not by the driver; /tmp is a tmpfs of that size",
            info.driver
        )),
        Err(error) => Check::fail(format!("Docker daemon info: {error}")),
    }
}

fn check_image(client: &docker::Client, image: &str, pull: spec::Pull) -> Check {
    match (client.image_exists(image), pull) {
        (Ok(true), _) => Check::pass(format!("image `{image}` is present")),
        (Ok(false), spec::Pull::Missing) => {
            Check::pass(format!("image `{image}` is not present; it is pulled at its first run (MCP_K8S_DOCKER_PULL=missing)"))
        }
        (Ok(false), spec::Pull::Never) => Check::fail(format!(
            "image `{image}` is not present and MCP_K8S_DOCKER_PULL=never; load it (`docker pull`, `docker load`) or set MCP_K8S_DOCKER_PULL=missing"
        )),
        (Err(error), _) => Check::fail(format!("image `{image}`: {error}")),
    }
}

fn check_runner_binary(path: &str) -> Check {
    match check_runner(path) {
        Ok(_) => Check::pass(format!("runner binary `{path}` is a static ELF executable")),
        Err(why) => Check::fail(why),
    }
}

/// How to make a runner binary that starts in any image.
const STATIC_BUILD: &str = "build a static one (`rustup target add x86_64-unknown-linux-musl && cargo build --release --target x86_64-unknown-linux-musl`) and set MCP_K8S_RUNNER_BINARY to target/x86_64-unknown-linux-musl/release/mcp-k8s-ephemeral-job";

/// Why `path` cannot be mounted as the runner into a sandbox, if it cannot:
/// the images have no dynamic loader or libc of the host's, so a
/// dynamically linked binary (the usual `cargo build`) never starts there,
/// and every run would end with its result lost. Checked at start and by
/// `doctor`. On success, the binary's ELF machine.
pub fn check_runner(path: &str) -> Result<u16, String> {
    let bytes = read_elf_head(path)
        .map_err(|error| format!("MCP_K8S_RUNNER_BINARY: cannot read `{path}`: {error}; set it to a static build of this server"))?;
    match (elf_is_static(&bytes), elf_machine(&bytes)) {
        (Some(true), Some(machine)) => Ok(machine),
        (Some(false), _) => Err(format!(
            "MCP_K8S_RUNNER_BINARY: `{path}` is dynamically linked (it names a program interpreter), so it cannot start inside a sandbox image; {STATIC_BUILD}"
        )),
        _ => Err(format!("MCP_K8S_RUNNER_BINARY: `{path}` is not a 64-bit ELF executable; {STATIC_BUILD}")),
    }
}

/// The first bytes of the file, where an ELF keeps its header and program
/// headers (right after the header in every linker's output): the binary
/// itself is megabytes (a debug build, ninety), and the server's memory
/// goal has no room for it.
fn read_elf_head(path: &str) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    const HEAD_BYTES: u64 = 64 * 1024;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(HEAD_BYTES).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Why the runner binary's machine does not fit the engine's `arch`
/// (Docker's `GET /version` words: `amd64`, `arm64`), if it does not.
/// An architecture this table does not know is not judged.
pub fn runner_arch_refusal(path: &str, machine: u16, engine_arch: &str) -> Option<String> {
    let wanted = match engine_arch {
        "amd64" | "x86_64" => 62,
        "arm64" | "aarch64" => 183,
        _ => return None,
    };
    (machine != wanted).then(|| {
        format!(
            "MCP_K8S_RUNNER_BINARY: `{path}` is built for another architecture (ELF machine {machine}) than the Docker engine's `{engine_arch}`; build this server for `{engine_arch}` statically (musl) and point MCP_K8S_RUNNER_BINARY at it"
        )
    })
}

/// The ELF header's `e_machine`, for a 64-bit little-endian ELF.
fn elf_machine(bytes: &[u8]) -> Option<u16> {
    if !is_elf64_le(bytes) {
        return None;
    }
    Some(u16::from_le_bytes(bytes.get(0x12..0x14)?.try_into().ok()?))
}

/// The ELF magic, 64-bit class and little-endian data: the only layout
/// these readers know.
fn is_elf64_le(bytes: &[u8]) -> bool {
    bytes.get(..4) == Some(b"\x7fELF".as_slice()) && bytes.get(4) == Some(&2) && bytes.get(5) == Some(&1)
}

/// `Some(true)` for a 64-bit little-endian ELF without a `PT_INTERP`
/// program header (no dynamic loader), `None` for something else.
fn elf_is_static(bytes: &[u8]) -> Option<bool> {
    if !is_elf64_le(bytes) {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    let program_headers = usize::try_from(u64::from_le_bytes(bytes.get(0x20..0x28)?.try_into().ok()?)).ok()?;
    let entry_size = usize::from(u16_at(0x36)?);
    let count = usize::from(u16_at(0x38)?);
    const PT_INTERP: u32 = 3;
    for index in 0..count {
        if u32_at(program_headers.checked_add(index.checked_mul(entry_size)?)?)? == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

/// The network `restricted` runs join exists (its rules are the operator's).
fn check_restricted_network(client: &docker::Client, network: &str) -> Check {
    match client.network_inspect(network) {
        Ok(inspect) => Check::pass(format!(
            "restricted network `{network}` exists (driver `{}`, internal: {}); what it lets runs reach is its own rules'",
            inspect.driver, inspect.internal
        )),
        Err(error) if error.is_not_found() => {
            Check::fail(format!("restricted network `{network}` does not exist; create it, or unset MCP_K8S_DOCKER_NETWORK"))
        }
        Err(error) => Check::fail(format!("restricted network `{network}`: {error}")),
    }
}

/// A tiny run through the engine in the default network mode: the image
/// starts, the runner runs under the hardening (the mode's network made
/// first when it is this server's), and the container goes again.
fn check_run(ctx: &engine::run::Ctx, image: &str, network: NetworkMode) -> Check {
    let outcome = engine::run::run_check(ctx, image, &["true"], network);
    if outcome.status == RunStatus::Succeeded {
        Check::pass(format!("a check container ran `true` in `{image}` with network `{}`", network.name()))
    } else {
        let reason = outcome.reason.map(|reason| format!("{}: ", reason.name())).unwrap_or_default();
        Check::fail(format!("a check container in `{image}` did not succeed: {reason}{}", outcome.message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_is_an_elf_and_garbage_is_not() {
        let own = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(elf_is_static(&own).is_some());
        assert_eq!(elf_is_static(b"#!/bin/sh\n"), None);
        assert_eq!(elf_is_static(b"\x7fELF"), None);
    }

    /// The usual `cargo build` is dynamically linked: refused, naming the
    /// setting and the static build; a shell script is not an ELF at all.
    #[test]
    fn a_dynamically_linked_runner_binary_is_refused_naming_the_setting_and_the_static_build() {
        let dynamic = "/bin/sh";
        let bytes = std::fs::read(dynamic).unwrap();
        assert_eq!(elf_is_static(&bytes), Some(false), "Debian's /bin/sh has a program interpreter");
        let why = check_runner(dynamic).unwrap_err();
        assert!(why.starts_with("MCP_K8S_RUNNER_BINARY: `/bin/sh` is dynamically linked"), "{why}");
        assert!(why.contains("--target x86_64-unknown-linux-musl"), "{why}");
        let missing = check_runner("/nonexistent/runner").unwrap_err();
        assert!(missing.starts_with("MCP_K8S_RUNNER_BINARY: cannot read `/nonexistent/runner`"), "{missing}");
    }

    #[test]
    fn the_runner_binary_must_be_built_for_the_engines_architecture() {
        let cases = [(62, "amd64", false), (62, "arm64", true), (183, "arm64", false), (183, "x86_64", true), (62, "s390x", false)];
        for (machine, arch, refused) in cases {
            assert_eq!(runner_arch_refusal("/r", machine, arch).is_some(), refused, "{machine} on {arch}");
        }
        let own = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let expected = if cfg!(target_arch = "x86_64") { 62 } else { 183 };
        assert_eq!(elf_machine(&own), Some(expected));
    }

    #[test]
    fn lines_start_with_the_verdict() {
        assert_eq!(Check::pass("a").line(), "ok    a");
        assert_eq!(Check::fail("b").line(), "FAIL  b");
    }
}
