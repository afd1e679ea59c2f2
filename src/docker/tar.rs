//! A minimal ustar writer for `Client::container_put_archive`: regular files
//! and directories with a mode and a numeric owner, in memory. Enough to
//! write a run's input files into a created container; no links, no long
//! names beyond ustar's 255 bytes, no reading.
//!
//! It knows the tar format and nothing about what the files are for.

/// One member of an archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Relative, `/`-separated, without `..`; a directory's path may end in `/`.
    pub path: &'a str,
    pub kind: EntryKind<'a>,
    /// Permission bits, e.g. `0o644`.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind<'a> {
    File(&'a [u8]),
    Directory,
}

const BLOCK: usize = 512;
/// The path of the directory entry that stands for the destination itself.
pub const ROOT: &str = "/";

/// The archive's bytes, or why a path cannot be stored.
pub fn archive(entries: &[Entry<'_>]) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    for entry in entries {
        let data: &[u8] = match entry.kind {
            EntryKind::File(data) => data,
            EntryKind::Directory => &[],
        };
        bytes.extend_from_slice(&header(entry, data.len() as u64)?);
        bytes.extend_from_slice(data);
        bytes.resize(bytes.len().div_ceil(BLOCK) * BLOCK, 0);
    }
    // Two zero blocks end an archive.
    bytes.resize(bytes.len() + 2 * BLOCK, 0);
    Ok(bytes)
}

fn header(entry: &Entry<'_>, size: u64) -> Result<[u8; BLOCK], String> {
    // `/` as a directory is the destination itself: Docker applies its
    // owner and mode (it skips an entry named `.`), which is how a volume's
    // root becomes writable by a non-root user under a read-only root.
    let is_root = entry.path == ROOT && entry.kind == EntryKind::Directory;
    let path = if is_root { ROOT } else { entry.path.trim_end_matches('/') };
    if !is_root && (path.is_empty() || path.starts_with('/') || path.split('/').any(|part| part.is_empty() || part == "..")) {
        return Err(format!("tar path `{}` must be relative, without empty parts or `..`", crate::echo::shorten(entry.path)));
    }
    if size >= 1 << 33 {
        return Err(format!("tar member `{}` is 8 GiB or larger; ustar cannot store it", crate::echo::shorten(path)));
    }
    let (prefix, name) = split_name(path)?;
    let mut header = [0u8; BLOCK];
    header[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut header[100..108], u64::from(entry.mode & 0o7777));
    octal(&mut header[108..116], u64::from(entry.uid));
    octal(&mut header[116..124], u64::from(entry.gid));
    octal(&mut header[124..136], size);
    octal(&mut header[136..148], 0); // mtime: reproducible archives
    header[156] = match entry.kind {
        EntryKind::File(_) => b'0',
        EntryKind::Directory => b'5',
    };
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    // The checksum is computed with its own field as spaces.
    header[148..156].fill(b' ');
    let sum: u64 = header.iter().map(|&byte| u64::from(byte)).sum();
    octal(&mut header[148..155], sum);
    Ok(header)
}

/// ustar keeps up to 100 bytes of name and 155 of prefix, split at a `/`.
fn split_name(path: &str) -> Result<(&str, &str), String> {
    if path.len() <= 100 {
        return Ok(("", path));
    }
    let too_long = || format!("tar path `{}` is longer than ustar allows", crate::echo::shorten(path));
    let split = path
        .char_indices()
        .filter(|&(index, character)| character == '/' && index <= 155 && path.len() - index - 1 <= 100)
        .map(|(index, _)| index)
        .next()
        .ok_or_else(too_long)?;
    Ok((&path[..split], &path[split + 1..]))
}

/// Writes `value` as zero-padded octal digits and a NUL into `field`.
fn octal(field: &mut [u8], value: u64) {
    let width = field.len() - 1;
    // `header` refuses sizes that do not fit; the other fields always do.
    let digits = format!("{value:0width$o}");
    field[..width].copy_from_slice(&digits.as_bytes()[digits.len() - width..]);
    field[width] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_and_a_directory_read_back_with_system_tar() {
        let long_dir = "d".repeat(120);
        let long_path = format!("{long_dir}/file.txt");
        let bytes = archive(&[
            Entry { path: "work/", kind: EntryKind::Directory, mode: 0o755, uid: 65532, gid: 65532 },
            Entry { path: "work/hello.txt", kind: EntryKind::File(b"hello\n"), mode: 0o644, uid: 65532, gid: 65532 },
            Entry { path: &long_path, kind: EntryKind::File(b""), mode: 0o600, uid: 0, gid: 0 },
        ])
        .unwrap();
        assert_eq!(bytes.len() % BLOCK, 0);
        let dir = std::env::temp_dir().join(format!("docker-tar-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let archive_path = dir.join("a.tar");
        std::fs::write(&archive_path, &bytes).unwrap();
        let listing = std::process::Command::new("tar").arg("-tvf").arg(&archive_path).output().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(listing.status.success(), "{}", String::from_utf8_lossy(&listing.stderr));
        let listing = String::from_utf8(listing.stdout).unwrap();
        assert!(listing.contains("drwxr-xr-x 65532/65532"), "{listing}");
        assert!(listing.contains("-rw-r--r-- 65532/65532       6 1970-01-01 00:00 work/hello.txt"), "{listing}");
        assert!(listing.contains(&long_path), "{listing}");
    }

    #[test]
    fn unsafe_or_unstorable_paths_are_refused() {
        for bad in ["", "/etc/passwd", "a/../b", "a//b"] {
            let entry = Entry { path: bad, kind: EntryKind::File(b""), mode: 0o644, uid: 0, gid: 0 };
            assert!(archive(&[entry]).is_err(), "{bad}");
        }
        let huge = "x".repeat(300);
        assert!(archive(&[Entry { path: &huge, kind: EntryKind::Directory, mode: 0o755, uid: 0, gid: 0 }]).is_err());
    }
}
