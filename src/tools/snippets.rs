//! Named snippets for `execute_code` (isolator's `promptsDir`):
//! each file of MCP_K8S_SNIPPETS_DIR is a snippet, its base name is the
//! `snippet_name` and its extension picks the language profile. The folder
//! is read at call time, with bounds on the number of files and on a
//! snippet's size, so a snippet edited on disk is used as it is now. The
//! same listing feeds the MCP resources (`snippet://<name>`).
//!
//! A symlink is served only when its target, resolved, is a file inside
//! the folder: Kubernetes mounts a ConfigMap as links into `..data/`
//! inside it, while a link to `/proc/self/environ` or `../x.py` would hand
//! any token holder a file of the server's.
//!
//! Knows files and names only: what a snippet is run with is
//! `execute_code`'s, and the JSON-RPC shape of resources is `protocol`'s.

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use crate::languages::Languages;

/// Directory entries looked at; a folder with more is refused rather than
/// read half.
pub const MAX_SNIPPET_FILES: usize = 1000;
/// Largest snippet: it travels as an input file, and input files share
/// `job_args::MAX_INPUT_BYTES` (768 KiB) with `additional_files`.
pub const MAX_SNIPPET_BYTES: u64 = 256 * 1024;
/// The URI scheme of snippet resources.
pub const URI_PREFIX: &str = "snippet://";

/// One file of the folder, as listed.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub name: String,
    /// Without the dot; empty when the file has none.
    pub extension: String,
    /// The profile its extension picks, if any.
    pub language: Option<String>,
    pub size: u64,
    path: PathBuf,
}

impl Entry {
    pub fn uri(&self) -> String {
        format!("{URI_PREFIX}{}", self.name)
    }

    /// A MIME type for the resource, from the extension.
    pub fn mime_type(&self) -> &'static str {
        match self.extension.as_str() {
            "py" => "text/x-python",
            "js" | "mjs" | "cjs" => "text/javascript",
            "ts" => "text/x-typescript",
            "go" => "text/x-go",
            "sh" | "bash" => "text/x-shellscript",
            _ => "text/plain",
        }
    }
}

/// A snippet ready to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Snippet {
    pub name: String,
    /// The file name in the folder (`hello.py`), also the entrypoint's.
    pub filename: String,
    pub language: String,
    pub source: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// No MCP_K8S_SNIPPETS_DIR.
    NotConfigured,
    BadName {
        name: String,
        why: &'static str,
    },
    Unknown {
        name: String,
        available: Vec<String>,
    },
    /// Two files share the base name (`a.py` and `a.js`).
    Ambiguous {
        name: String,
        files: Vec<String>,
    },
    NoProfile {
        name: String,
        extension: String,
        extensions: Vec<String>,
    },
    TooLarge {
        name: String,
        size: u64,
    },
    TooManyFiles,
    NotText {
        name: String,
    },
    Read {
        what: String,
        message: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotConfigured => {
                write!(
                    formatter,
                    "`snippet_name` needs a snippets folder, and this server has none (MCP_K8S_SNIPPETS_DIR); send `language` and `entrypoint_code` instead"
                )
            }
            Error::BadName { name, why } => write!(formatter, "`snippet_name` `{}` {why}", crate::echo::shorten(name)),
            Error::Unknown { name, available } if available.is_empty() => {
                write!(formatter, "no snippet named `{}`; the snippets folder is empty", crate::echo::shorten(name))
            }
            Error::Unknown { name, available } => {
                write!(formatter, "no snippet named `{}`; available: {}", crate::echo::shorten(name), available.join(", "))
            }
            Error::Ambiguous { name, files } => {
                write!(formatter, "snippet `{name}` is ambiguous: the folder has {}; the operator must rename one", files.join(" and "))
            }
            Error::NoProfile { name, extension, extensions } => {
                let known = extensions.iter().map(|extension| format!(".{extension}")).collect::<Vec<_>>().join(", ");
                if extension.is_empty() {
                    write!(formatter, "snippet `{name}` has no extension, so no language profile claims it; known extensions: {known}")
                } else {
                    write!(
                        formatter,
                        "snippet `{name}` has extension `.{extension}`, which no language profile claims; known extensions: {known}"
                    )
                }
            }
            Error::TooLarge { name, size } => {
                write!(
                    formatter,
                    "snippet `{name}` is over {MAX_SNIPPET_BYTES} bytes ({size} read), the most a snippet may be; the operator must shrink it"
                )
            }
            Error::TooManyFiles => {
                write!(formatter, "the snippets folder has more than {MAX_SNIPPET_FILES} entries; the operator must thin it out")
            }
            Error::NotText { name } => write!(formatter, "snippet `{name}` is not UTF-8 text; the operator must save it as UTF-8"),
            Error::Read { what, message } => write!(formatter, "cannot read {what}: {message}"),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// True when the file is there but unusable as it is (too large, not
    /// text, no profile, ambiguous): the operator's to fix, not the
    /// server's fault and not the caller's.
    pub fn is_the_files(&self) -> bool {
        matches!(self, Error::TooLarge { .. } | Error::NotText { .. } | Error::NoProfile { .. } | Error::Ambiguous { .. })
    }
}

/// The folder's snippets, sorted by name. Hidden files, folders, names
/// that `check_name` refuses and links that leave the folder (or dangle,
/// or loop) are left out.
pub fn list(dir: &Path, languages: &Languages) -> Result<Vec<Entry>, Error> {
    let read_error = |error: std::io::Error| Error::Read { what: "the snippets folder".to_string(), message: error.to_string() };
    let root = std::fs::canonicalize(dir).map_err(read_error)?;
    let mut entries = Vec::new();
    for (index, dir_entry) in std::fs::read_dir(&root).map_err(read_error)?.enumerate() {
        if index >= MAX_SNIPPET_FILES {
            return Err(Error::TooManyFiles);
        }
        let dir_entry = dir_entry.map_err(read_error)?;
        let Ok(file_name) = dir_entry.file_name().into_string() else { continue };
        let (name, extension) = split_name(&file_name);
        if check_name(name).is_err() {
            continue;
        }
        let Some(path) = resolve_inside(&root, &dir_entry.path()) else { continue };
        let Ok(metadata) = std::fs::metadata(&path) else { continue };
        if !metadata.is_file() {
            continue;
        }
        entries.push(Entry {
            name: name.to_string(),
            extension: extension.to_string(),
            language: languages.by_extension(extension).map(|profile| profile.name.clone()),
            size: metadata.len(),
            path,
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name).then(a.extension.cmp(&b.extension)));
    Ok(entries)
}

/// The entry's real path when it lies inside `root` (itself canonical);
/// `None` for a link that leads out, dangles or loops.
fn resolve_inside(root: &Path, entry: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(entry).ok()?;
    (real.starts_with(root) && real != root).then_some(real)
}

/// The snippet `name`, read now.
pub fn load(dir: Option<&Path>, languages: &Languages, name: &str) -> Result<Snippet, Error> {
    let dir = dir.ok_or(Error::NotConfigured)?;
    let entry = find(dir, languages, name)?;
    let Some(language) = entry.language.clone() else {
        let mut extensions: Vec<String> = languages.profiles.values().flat_map(|profile| profile.extensions.clone()).collect();
        extensions.sort();
        return Err(Error::NoProfile { name: entry.name, extension: entry.extension, extensions });
    };
    let source = read_source(&entry)?;
    // The listed name, not the link target's (`hello.py`, not `..data/hello.py`).
    let filename = if entry.extension.is_empty() { entry.name.clone() } else { format!("{}.{}", entry.name, entry.extension) };
    Ok(Snippet { name: entry.name, filename, language, source })
}

/// The entry named `name` and its source, for `resources/read`.
pub fn read(dir: &Path, languages: &Languages, name: &str) -> Result<(Entry, String), Error> {
    let entry = find(dir, languages, name)?;
    let source = read_source(&entry)?;
    Ok((entry, source))
}

/// A snippet name is a plain base name: no folders, not hidden, no
/// control characters (isolator's names are file names without extension).
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 255 {
        return Err("must be 1 to 255 characters");
    }
    if name.contains('/') || name.contains('\\') {
        return Err("must be a plain name without folders");
    }
    if name.starts_with('.') {
        return Err("must not start with `.` (hidden files are not snippets)");
    }
    // The file name becomes the interpreter's argument: `-V.py` would be an option.
    if name.starts_with('-') {
        return Err("must not start with `-` (the interpreter would read it as an option)");
    }
    if name.chars().any(char::is_control) {
        return Err("must not contain control characters");
    }
    Ok(())
}

fn find(dir: &Path, languages: &Languages, name: &str) -> Result<Entry, Error> {
    check_name(name).map_err(|why| Error::BadName { name: name.to_string(), why })?;
    let entries = list(dir, languages)?;
    let mut matching: Vec<Entry> = entries.iter().filter(|entry| entry.name == name).cloned().collect();
    match matching.len() {
        1 => Ok(matching.remove(0)),
        0 => {
            let mut available: Vec<String> = entries.into_iter().map(|entry| entry.name).collect();
            available.dedup();
            Err(Error::Unknown { name: name.to_string(), available })
        }
        _ => Err(Error::Ambiguous {
            name: name.to_string(),
            files: matching.iter().map(|entry| format!("`{}.{}`", entry.name, entry.extension)).collect(),
        }),
    }
}

/// Reads at most `MAX_SNIPPET_BYTES` + 1 bytes, so a file that grew since
/// it was listed is still bounded. The path is the resolved one and is
/// opened without following a link, so a file swapped for a link since the
/// listing is not read through it.
fn read_source(entry: &Entry) -> Result<String, Error> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let read_error = |error: std::io::Error| Error::Read { what: format!("snippet `{}`", entry.name), message: error.to_string() };
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&entry.path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_SNIPPET_BYTES + 1).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() as u64 > MAX_SNIPPET_BYTES {
        return Err(Error::TooLarge { name: entry.name.clone(), size: bytes.len() as u64 });
    }
    String::from_utf8(bytes).map_err(|_| Error::NotText { name: entry.name.clone() })
}

/// `hello.py` → (`hello`, `py`); `Makefile` → (`Makefile`, ``). Only the
/// last dot counts, as in isolator (`path.parse(file).name`).
fn split_name(file_name: &str) -> (&str, &str) {
    match file_name.rsplit_once('.') {
        Some((name, extension)) if !name.is_empty() => (name, extension),
        _ => (file_name, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Folder(PathBuf);

    impl Folder {
        fn new(tag: &str, files: &[(&str, &str)]) -> Folder {
            let dir = std::env::temp_dir().join(format!("mcp-snippets-{}-{tag}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("sub")).unwrap();
            for (name, content) in files {
                std::fs::write(dir.join(name), content).unwrap();
            }
            Folder(dir)
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn languages() -> Languages {
        Languages::load(None, 600).unwrap()
    }

    #[test]
    fn names_are_checked() {
        for (name, why) in [
            ("", "must be 1 to 255 characters"),
            ("../etc/passwd", "must be a plain name without folders"),
            ("a/b", "must be a plain name without folders"),
            (".hidden", "must not start with `.` (hidden files are not snippets)"),
            ("a\nb", "must not contain control characters"),
        ] {
            assert_eq!(check_name(name), Err(why), "{name:?}");
        }
        assert_eq!(check_name("hello_world"), Ok(()));
    }

    #[test]
    fn a_snippet_is_found_by_its_base_name_and_its_extension_picks_the_language() {
        let folder = Folder::new("found", &[("hello.py", "print('hi')\n"), (".secret.py", "x"), ("notes.txt", "n")]);
        let snippet = load(Some(&folder.0), &languages(), "hello").unwrap();
        assert_eq!(
            snippet,
            Snippet { name: "hello".into(), filename: "hello.py".into(), language: "python".into(), source: "print('hi')\n".into() }
        );
        let names: Vec<String> = list(&folder.0, &languages()).unwrap().into_iter().map(|entry| entry.name).collect();
        assert_eq!(names, ["hello", "notes"], "hidden files and folders are not listed");
    }

    #[test]
    fn unknown_names_list_what_exists() {
        let folder = Folder::new("unknown", &[("hello.py", ""), ("sum.go", "")]);
        let error = load(Some(&folder.0), &languages(), "nope").unwrap_err();
        assert_eq!(error.to_string(), "no snippet named `nope`; available: hello, sum");
        assert_eq!(
            load(Some(&folder.0), &languages(), ".secret").unwrap_err().to_string(),
            "`snippet_name` `.secret` must not start with `.` (hidden files are not snippets)"
        );
        assert_eq!(load(None, &languages(), "hello").unwrap_err(), Error::NotConfigured);
    }

    #[test]
    fn an_extension_without_a_profile_says_which_exist() {
        let folder = Folder::new("noprofile", &[("notes.txt", "hello")]);
        let error = load(Some(&folder.0), &languages(), "notes").unwrap_err();
        assert_eq!(
            error.to_string(),
            "snippet `notes` has extension `.txt`, which no language profile claims; known extensions: .bash, .cjs, .go, .js, .mjs, .py, .sh"
        );
    }

    #[test]
    fn two_files_with_one_base_name_are_refused() {
        let folder = Folder::new("ambiguous", &[("a.py", ""), ("a.js", "")]);
        assert_eq!(
            load(Some(&folder.0), &languages(), "a").unwrap_err().to_string(),
            "snippet `a` is ambiguous: the folder has `a.js` and `a.py`; the operator must rename one"
        );
    }

    #[test]
    fn large_and_binary_snippets_are_refused() {
        let big = "x".repeat(MAX_SNIPPET_BYTES as usize + 1);
        let folder = Folder::new("bounds", &[("big.py", &big)]);
        std::fs::write(folder.0.join("bin.py"), [0xff, 0xfe]).unwrap();
        assert_eq!(
            load(Some(&folder.0), &languages(), "big").unwrap_err(),
            Error::TooLarge { name: "big".into(), size: MAX_SNIPPET_BYTES + 1 }
        );
        assert_eq!(load(Some(&folder.0), &languages(), "bin").unwrap_err(), Error::NotText { name: "bin".into() });
    }

    /// The bound counts entries, not snippets: the folder `sub` and hidden
    /// files are read too, so they count.
    #[test]
    fn a_folder_of_more_than_max_snippet_files_entries_is_refused() {
        let folder = Folder::new("many", &[(".hidden.py", "")]);
        // With `sub` and `.hidden.py`: exactly MAX_SNIPPET_FILES entries.
        for index in 0..MAX_SNIPPET_FILES - 2 {
            std::fs::write(folder.0.join(format!("s{index}.py")), "").unwrap();
        }
        assert_eq!(list(&folder.0, &languages()).unwrap().len(), MAX_SNIPPET_FILES - 2, "at the bound, all are read");
        std::fs::write(folder.0.join("one_more.py"), "").unwrap();
        assert_eq!(list(&folder.0, &languages()).unwrap_err(), Error::TooManyFiles);
        assert_eq!(
            load(Some(&folder.0), &languages(), "s0").unwrap_err().to_string(),
            "the snippets folder has more than 1000 entries; the operator must thin it out"
        );
    }

    #[test]
    fn a_snippet_edited_on_disk_is_loaded_as_it_is_now() {
        let folder = Folder::new("edited", &[("hello.py", "print('before')\n")]);
        assert_eq!(load(Some(&folder.0), &languages(), "hello").unwrap().source, "print('before')\n");
        std::fs::write(folder.0.join("hello.py"), "print('after')\n").unwrap();
        assert_eq!(load(Some(&folder.0), &languages(), "hello").unwrap().source, "print('after')\n");
        std::fs::rename(folder.0.join("hello.py"), folder.0.join("hello.js")).unwrap();
        assert_eq!(load(Some(&folder.0), &languages(), "hello").unwrap().language, "javascript", "a new extension picks its profile");
    }

    /// Only a file whose resolved path stays inside the folder is a
    /// snippet. Each row: the link's name, its target, and whether it is
    /// served (by `list`, `load` and `read` alike).
    #[test]
    fn symlinks_are_served_only_when_they_resolve_inside_the_folder() {
        let folder = Folder::new("links", &[("real.py", "print('real')\n")]);
        let outside = folder.0.with_extension("outside.py");
        std::fs::write(&outside, "print('outside')\n").unwrap();
        // A ConfigMap volume: the files are links through `..data` into a
        // timestamped folder inside the mount.
        std::fs::create_dir(folder.0.join("..2026_12_02_09_00_00.1")).unwrap();
        std::fs::write(folder.0.join("..2026_12_02_09_00_00.1/cm.py"), "print('cm')\n").unwrap();
        std::os::unix::fs::symlink("..2026_12_02_09_00_00.1", folder.0.join("..data")).unwrap();
        let outside_name = outside.file_name().unwrap().to_string_lossy().into_owned();
        let cases: &[(&str, String, Option<&str>)] = &[
            ("inside.py", "real.py".into(), Some("print('real')\n")),
            ("cm.py", "..data/cm.py".into(), Some("print('cm')\n")),
            ("environ.txt", "/proc/self/environ".into(), None),
            ("passwd.txt", "/etc/passwd".into(), None),
            ("dotdot.py", format!("../{outside_name}"), None),
            ("absolute.py", outside.to_string_lossy().into_owned(), None),
            ("parent", "..".into(), None),
            ("dangling.py", "nothing-here.py".into(), None),
            ("loop.py", "loop.py".into(), None),
        ];
        for (link, target, _) in cases {
            std::os::unix::fs::symlink(target, folder.0.join(link)).unwrap();
        }
        let listed: Vec<String> = list(&folder.0, &languages()).unwrap().into_iter().map(|entry| entry.name).collect();
        for (link, target, served) in cases {
            let (name, _) = split_name(link);
            assert_eq!(listed.contains(&name.to_string()), served.is_some(), "{link} -> {target}: listed {listed:?}");
            match served {
                Some(source) => {
                    assert_eq!(read(&folder.0, &languages(), name).unwrap().1, *source, "{link} -> {target}");
                    let snippet = load(Some(&folder.0), &languages(), name).unwrap();
                    assert_eq!((snippet.filename.as_str(), snippet.source.as_str()), (*link, *source), "{link} -> {target}");
                }
                None => {
                    assert!(matches!(read(&folder.0, &languages(), name), Err(Error::Unknown { .. })), "{link} -> {target}");
                    assert!(matches!(load(Some(&folder.0), &languages(), name), Err(Error::Unknown { .. })), "{link} -> {target}");
                }
            }
        }
        let _ = std::fs::remove_file(outside);
    }

    #[test]
    fn a_file_without_extension_is_reported_as_having_none() {
        let folder = Folder::new("noextension", &[("Makefile", "all:\n")]);
        let error = load(Some(&folder.0), &languages(), "Makefile").unwrap_err();
        assert!(error.is_the_files());
        assert_eq!(
            error.to_string(),
            "snippet `Makefile` has no extension, so no language profile claims it; known extensions: .bash, .cjs, .go, .js, .mjs, .py, .sh"
        );
    }

    #[test]
    fn a_name_that_reads_as_an_option_is_not_a_snippet() {
        let folder = Folder::new("option", &[("-V.py", "print('never')\n")]);
        assert!(list(&folder.0, &languages()).unwrap().is_empty());
        assert_eq!(
            load(Some(&folder.0), &languages(), "-V").unwrap_err().to_string(),
            "`snippet_name` `-V` must not start with `-` (the interpreter would read it as an option)"
        );
    }
}
