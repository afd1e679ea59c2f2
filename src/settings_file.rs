//! How the server reads a file an operator names in a setting (the tokens,
//! sites, languages and pools files, a kubeconfig and what it points at,
//! the pod template): opened without blocking, checked to be a regular
//! file, and read up to a bound.
//!
//! Opening a FIFO for reading waits until something opens it for
//! writing, so a setting naming one (a typo, or a FIFO someone left in
//! place) would hang the start with no listener and no message. Opened
//! with `O_NONBLOCK`, the open returns at once, and `fstat` on the open
//! file (not the path, which could change in between) says what it is: a
//! FIFO, a device (`/dev/zero`, `/dev/tty`), a socket or a folder is
//! refused, naming what it is. Symlinks are followed on purpose: a
//! Kubernetes ConfigMap or Secret mounts each file as a symlink into
//! `..data/`, and these files promise no mode of their own.
//!
//! The JSON settings files (tokens, sites, languages, pools) share one
//! error, `Error`: the file could not be read, the file as a whole is
//! wrong, or one field of one entry is; each names the variable and the
//! file. What a file means is its owner's business.
//!
//! A leaf: it knows no setting; the owner of each file gives its `FileKind`.

use std::fmt;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Which settings file, as its errors name it: the variable that names
/// it and what one entry in it is (`caller`, `profile`, `pool`, `site`).
/// Errors hold it by reference, which keeps them small enough to return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileKind {
    pub variable: &'static str,
    pub entry: &'static str,
}

/// A settings file that cannot be used. Every variant names the variable
/// and the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The file could not be read: missing, not a regular file, too large,
    /// not UTF-8.
    Read { kind: &'static FileKind, path: String, message: String },
    /// The file as a whole is wrong: not JSON, not the shape its variable
    /// wants, or its entries wrong together (two of one name).
    Syntax { kind: &'static FileKind, path: String, message: String },
    /// One field of one entry is wrong. `entry` is its name, or `#<index>`
    /// when the name itself is missing or wrong.
    Field { kind: &'static FileKind, path: String, entry: String, field: String, message: String },
}

impl fmt::Display for Error {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Read { kind, path, message } => write!(formatter, "{}: cannot read `{path}`: {message}", kind.variable),
            Error::Syntax { kind, path, message } => write!(formatter, "{}: `{path}`: {message}", kind.variable),
            Error::Field { kind, path, entry, field, message } => {
                write!(formatter, "{}: `{path}`: {} `{entry}`, field `{field}`: {message}", kind.variable, kind.entry)
            }
        }
    }
}

impl std::error::Error for Error {}

/// The settings file `kind` at `path`, as text of at most `max` bytes;
/// what stops the read is a `Read` error naming the variable and the file.
pub fn read_settings(kind: &'static FileKind, path: &Path, max: u64) -> Result<String, Error> {
    read_text(path, max).map_err(|error| Error::Read { kind, path: path.display().to_string(), message: error.to_string() })
}

/// Opens `path` for reading without waiting on a FIFO's writer, and
/// refuses anything that is not a regular file.
pub fn open(path: &Path) -> std::io::Result<File> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let file_type = file.metadata()?.file_type();
    match not_regular(&file_type) {
        None => Ok(file),
        Some(what) => Err(std::io::Error::new(ErrorKind::InvalidInput, format!("is {what}, not a regular file; name a file"))),
    }
}

/// What a file is when it is not a regular one ("a FIFO"), for messages.
pub fn not_regular(file_type: &std::fs::FileType) -> Option<&'static str> {
    if file_type.is_file() {
        None
    } else if file_type.is_fifo() {
        Some("a FIFO")
    } else if file_type.is_char_device() || file_type.is_block_device() {
        Some("a device")
    } else if file_type.is_socket() {
        Some("a socket")
    } else if file_type.is_dir() {
        Some("a folder")
    } else {
        Some("a symlink")
    }
}

/// At most `max` bytes of the regular file at `path`; a longer file is an
/// error that says so, never a silently cut one.
pub fn read_bytes(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open(path)?.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(ErrorKind::InvalidData, format!("the file is larger than {max} bytes")));
    }
    Ok(bytes)
}

/// `read_bytes` for UTF-8 text.
pub fn read_text(path: &Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_bytes(path, max)?).map_err(|_| std::io::Error::new(ErrorKind::InvalidData, "the file is not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("mcp-settings-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
        assert!(status.success(), "mkfifo {}", path.display());
    }

    /// Regression: a FIFO nobody writes to hung the start in `open`. The
    /// open returns at once now (a hang would hold this test, not pass it).
    #[test]
    fn only_a_regular_file_is_read_and_nothing_waits() {
        let dir = scratch("kinds");
        let fifo = dir.join("fifo");
        mkfifo(&fifo);
        let file = dir.join("file.json");
        std::fs::write(&file, "[]").unwrap();
        let link = dir.join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let missing = dir.join("missing");
        // (path, the text, or the error's message)
        let cases: Vec<(&Path, Result<&str, &str>)> = vec![
            (&file, Ok("[]")),
            // A ConfigMap's files are symlinks: followed.
            (&link, Ok("[]")),
            (&fifo, Err("is a FIFO, not a regular file; name a file")),
            (Path::new("/dev/zero"), Err("is a device, not a regular file; name a file")),
            (&dir, Err("is a folder, not a regular file; name a file")),
            (&missing, Err("No such file or directory (os error 2)")),
        ];
        for (path, want) in cases {
            let got = read_text(path, 16).map_err(|error| error.to_string());
            assert_eq!(got.as_deref().map_err(String::as_str), want, "{}", path.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_over_the_bound_is_an_error_not_cut() {
        let dir = scratch("bound");
        let path = dir.join("f");
        std::fs::write(&path, "abcd").unwrap();
        assert_eq!(read_text(&path, 4).unwrap(), "abcd");
        assert_eq!(read_text(&path, 3).unwrap_err().to_string(), "the file is larger than 3 bytes");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert_eq!(read_text(&path, 4).unwrap_err().to_string(), "the file is not UTF-8 text");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
