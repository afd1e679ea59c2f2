//! A warm or open sandbox's key on its way to the runner, out of the
//! command's reach. The command runs as the runner's user, so any file
//! the runner can read while a command runs, the command can read too;
//! and a command holding the key could hand the runner calls of its own
//! (`POST /assign` on its port, from inside the pod).
//!
//! So the key Secret is mounted into `prepare` alone, which copies it
//! (`copy`) into a small memory-backed folder it shares with the main
//! container; the runner there reads it and removes it (`take`) before it
//! listens and before any command exists. From then on the key lives only
//! in the runner's memory, which `process::seal_runner` closes to the
//! command. A runner that cannot remove the file refuses to start: a key
//! left behind would be every command's.
//!
//! Knows nothing of pods or of what the key admits.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::sandbox::assignment::Key;

/// `prepare`'s half: the key in `from` (checked to be one), written to
/// `to`, readable by its owner only.
pub fn copy(from: &Path, to: &Path) -> Result<(), String> {
    let key = read(from)?;
    let _ = fs::remove_file(to);
    let write = || -> io::Result<()> {
        let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(to)?;
        file.write_all(key.to_hex().as_bytes())
    };
    write().map_err(|error| format!("cannot write the key to `{}`: {error}", to.display()))
}

/// The runner's half: the key in `file`, which is removed before this
/// returns.
pub fn take(file: &Path) -> Result<Key, String> {
    let key = read(file)?;
    fs::remove_file(file).map_err(|error| {
        format!(
            "cannot remove the key `{}` after reading it: {error}; a key left there would be readable by every command, so the runner does not start (the key must come through `prepare`, not a Secret mounted into this container)",
            file.display()
        )
    })?;
    Ok(key)
}

fn read(file: &Path) -> Result<Key, String> {
    let shown = file.display();
    let text = fs::read_to_string(file).map_err(|error| format!("cannot read the key `{shown}`: {error}"))?;
    Key::from_hex(&text).map_err(|why| format!("the key `{shown}` is not valid: {why}"))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_key_is_copied_for_the_runner_alone_and_gone_once_taken() {
        let root = std::env::temp_dir().join(format!("runner-key-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("secret")).unwrap();
        fs::create_dir_all(root.join("drop")).unwrap();
        let (secret, dropped) = (root.join("secret/key"), root.join("drop/key"));
        fs::write(&secret, format!("{}\n", "ab".repeat(32))).unwrap();

        copy(&secret, &dropped).unwrap();
        assert_eq!(fs::metadata(&dropped).unwrap().permissions().mode() & 0o777, 0o600);
        let key = take(&dropped).unwrap();
        assert!(key.matches(&Key::from_hex(&"ab".repeat(32)).unwrap()));
        assert!(!dropped.exists(), "the runner leaves no key behind for a command to read");
        assert!(take(&dropped).unwrap_err().contains("cannot read the key"), "taken once");

        fs::write(&secret, "not a key").unwrap();
        assert!(copy(&secret, &dropped).unwrap_err().contains("is not valid"));
        assert!(!dropped.exists(), "nothing is copied that is not a key");
        fs::remove_dir_all(&root).unwrap();
    }
}
