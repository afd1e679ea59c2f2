//! The runner's init-container half: copies this static binary into the
//! shared volume the main container starts from, and writes the caller's
//! input files into the workdir from the per-run Secret.
//!
//! The layout of the inputs (a manifest and one key per file) is
//! `sandbox::inputs`: the engine writes it, this module reads it.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

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
        let target = join_inside(workdir, &file.path)?;
        let content =
            fs::read(inputs_dir.join(&file.key)).map_err(|error| format!("input `{}`: cannot read its content: {error}", file.path))?;
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(|error| format!("input `{}`: cannot create its folder: {error}", file.path))?;
        }
        fs::write(&target, content).map_err(|error| format!("input `{}`: cannot write it: {error}", file.path))?;
        fs::set_permissions(&target, fs::Permissions::from_mode(file.mode & 0o7777))
            .map_err(|error| format!("input `{}`: cannot set its mode: {error}", file.path))?;
    }
    Ok(files.len())
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
    fn no_manifest_means_no_inputs() {
        assert_eq!(write_inputs(Path::new("/nonexistent-inputs"), Path::new("/tmp")), Ok(0));
    }
}
