//! The runner's init-container half: copies this static binary into the
//! shared volume the main container starts from, and writes the caller's
//! input files into the workdir from the per-run Secret.
//!
//! The layout of the inputs (a manifest and one key per file) is
//! `sandbox::inputs`: the engine writes it, this module reads it.
//!
//! Beside the main container instead of before it (an init
//! container costs the kubelet one more status cycle, about a second,
//! before the main container starts), `runner init` is a regular container
//! listed first, and its postStart hook `runner await-ready` holds the
//! kubelet back from starting the main container until the copy is done.
//! The two halves meet through three files next to `ready_file`: the
//! ready file itself (written last, after the runner and the inputs), a
//! `.failed` file (the error, so the hook fails at once instead of at its
//! timeout) and a `.seen` file (the hook saw ready; `runner init` lingers
//! until then, because a hook whose container has exited fails).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// How often both halves of the handshake look at the files.
const POLL: Duration = Duration::from_millis(5);
/// How long `runner init` waits for the hook to see the ready file before
/// it exits anyway (the main container starts either way once the hook
/// has returned).
const LINGER: Duration = Duration::from_secs(30);

use crate::sandbox::inputs::{self, MANIFEST_KEY};

/// Copies the running binary to `destination` with mode 0555, so that a
/// non-root main container can execute it but not change it.
pub fn copy_self(destination: &Path) -> io::Result<()> {
    let source = std::env::current_exe()?;
    if let Some(parent) = destination.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::copy(&source, destination)?;
    fs::set_permissions(destination, fs::Permissions::from_mode(0o555))
}

/// Writes every file named in `inputs_dir/manifest.json` under `workdir`.
/// A missing manifest means the run has no input files.
pub fn write_inputs(inputs_dir: &Path, workdir: &Path) -> Result<usize, String> {
    let manifest_path = inputs_dir.join(MANIFEST_KEY);
    let manifest = match fs::read(&manifest_path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(format!("cannot read `{}`: {error}", manifest_path.display())),
    };
    let files = inputs::decode_manifest(&manifest)?;
    for file in &files {
        let content =
            fs::read(inputs_dir.join(&file.key)).map_err(|error| format!("input `{}`: cannot read its content: {error}", file.path))?;
        write_input(workdir, &file.path, &content, file.mode)?;
    }
    Ok(files.len())
}

/// Writes one input file at `path` under `workdir` with `mode`, making its
/// folders: from the inputs Secret (`write_inputs`) or from a warm
/// sandbox's assignment (`runner::assign`).
pub fn write_input(workdir: &Path, path: &str, content: &[u8], mode: u32) -> Result<(), String> {
    let target = join_inside(workdir, path)?;
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(|error| format!("input `{path}`: cannot create its folder: {error}"))?;
    }
    fs::write(&target, content).map_err(|error| format!("input `{path}`: cannot write it: {error}"))?;
    fs::set_permissions(&target, fs::Permissions::from_mode(mode & 0o7777))
        .map_err(|error| format!("input `{path}`: cannot set its mode: {error}"))
}

/// The file that says `runner init` failed, next to `ready_file`.
fn failed_file(ready_file: &Path) -> PathBuf {
    sibling(ready_file, "failed")
}

/// The file that says the hook saw the ready file, next to it.
fn seen_file(ready_file: &Path) -> PathBuf {
    sibling(ready_file, "seen")
}

fn sibling(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

/// Says that `runner init` is done, then waits (up to `LINGER`) for the
/// hook to have seen it, so that the hook never runs in an exited container.
pub fn announce_ready(ready_file: &Path) -> io::Result<()> {
    fs::write(ready_file, b"")?;
    let until = Instant::now() + LINGER;
    while !seen_file(ready_file).exists() && Instant::now() < until {
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// Records why `runner init` failed, for the hook to fail with at once.
/// A failure to write it only makes the hook wait for its timeout.
pub fn announce_failure(ready_file: &Path, message: &str) {
    let _ = fs::write(failed_file(ready_file), message);
}

/// The hook's half: waits until the ready file exists (then marks it seen)
/// or the failed one does, or `timeout` passes.
pub fn await_ready(ready_file: &Path, timeout: Duration) -> Result<(), String> {
    let until = Instant::now() + timeout;
    loop {
        if ready_file.exists() {
            return fs::write(seen_file(ready_file), b"")
                .map_err(|error| format!("cannot write `{}`: {error}", seen_file(ready_file).display()));
        }
        if let Ok(message) = fs::read_to_string(failed_file(ready_file)) {
            return Err(format!("preparing the pod failed: {message}"));
        }
        if Instant::now() >= until {
            return Err(format!("the runner was not copied within {} ms", timeout.as_millis()));
        }
        std::thread::sleep(POLL);
    }
}

/// Joins a caller-given relative path to `base`, refusing anything that
/// could land outside it. The server checked this already; the check is
/// repeated here because this code writes to disk.
fn join_inside(base: &Path, relative: &str) -> Result<PathBuf, String> {
    let path = Path::new(relative);
    let is_plain = !relative.is_empty() && path.components().all(|component| matches!(component, Component::Normal(_) | Component::CurDir));
    if !is_plain {
        return Err(format!("input path `{relative}` must be relative and stay inside the workdir"));
    }
    Ok(base.join(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::inputs::{InputFile, content_key, encode_manifest};

    #[test]
    fn inputs_are_written_with_their_modes_and_paths_are_confined() {
        let root = std::env::temp_dir().join(format!("runner-init-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let (inputs, workdir) = (root.join("inputs"), root.join("work"));
        fs::create_dir_all(&inputs).unwrap();
        fs::create_dir_all(&workdir).unwrap();
        let manifest = vec![
            InputFile { key: content_key(0), path: "main.py".into(), mode: 0o644 },
            InputFile { key: content_key(1), path: "bin/run.sh".into(), mode: 0o755 },
        ];
        fs::write(inputs.join(MANIFEST_KEY), encode_manifest(&manifest)).unwrap();
        fs::write(inputs.join("f0"), "print(1)").unwrap();
        fs::write(inputs.join("f1"), "#!/bin/sh").unwrap();
        assert_eq!(write_inputs(&inputs, &workdir), Ok(2));
        assert_eq!(fs::read_to_string(workdir.join("main.py")).unwrap(), "print(1)");
        let mode = fs::metadata(workdir.join("bin/run.sh")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755);

        for bad in ["../escape", "/etc/passwd", "a/../../b", ""] {
            assert!(join_inside(&workdir, bad).is_err(), "{bad}");
        }
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_hook_sees_ready_or_failed() {
        let root = std::env::temp_dir().join(format!("runner-ready-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        let ready = root.join(".ready");
        assert!(await_ready(&ready, Duration::from_millis(20)).unwrap_err().contains("not copied within 20 ms"));
        let waiter = {
            let ready = ready.clone();
            std::thread::spawn(move || await_ready(&ready, Duration::from_secs(10)))
        };
        announce_ready(&ready).unwrap();
        assert_eq!(waiter.join().unwrap(), Ok(()));
        assert!(seen_file(&ready).exists());

        let other = root.join(".other");
        announce_failure(&other, "input `a`: cannot write it");
        assert_eq!(await_ready(&other, Duration::from_secs(10)), Err("preparing the pod failed: input `a`: cannot write it".into()));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn no_manifest_means_no_inputs() {
        assert_eq!(write_inputs(Path::new("/nonexistent-inputs"), Path::new("/tmp")), Ok(0));
    }
}
