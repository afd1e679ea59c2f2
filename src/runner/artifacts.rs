//! Which files go back to the caller, and how: a snapshot of the workdir
//! before the command runs, glob matching, and streaming the chosen files
//! as frames under the artifact cap with their SHA-256.
//!
//! Default selection (no patterns): regular files the command created or
//! changed under the workdir, so the inputs and a cloned repository come back
//! only if the command touched them. `.git` directories are never walked.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::runner::capture::{FrameSink, SpillBudget, write_frame};
use crate::sandbox::frame::{self, ArtifactChunk, ArtifactHeader, Frame};

/// Upper bound on files considered, so a workdir with millions of files
/// cannot exhaust the runner's memory.
pub const MAX_WALKED_FILES: usize = 100_000;
/// Upper bound on artifacts reported (with or without content).
const MAX_ARTIFACT_FILES: usize = 1_000;

/// What identifies a file's version: if any of these differ after the
/// command ran, the command changed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    pub size: u64,
    pub modified_ns: i128,
    pub inode: u64,
}

/// Relative path (with `/`) → stamp of every regular file under a folder.
pub struct Snapshot {
    pub files: BTreeMap<String, FileStamp>,
    /// Entries that are neither regular files nor folders (links, FIFOs,
    /// sockets, devices), with what they are: never sent, but named in a
    /// note when they would have been chosen.
    pub others: BTreeMap<String, &'static str>,
    /// True when the walk stopped at `MAX_WALKED_FILES`.
    pub incomplete: bool,
}

/// What a non-regular entry is, in a note's words.
fn kind_of(file_type: fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "a device"
    }
}

pub fn snapshot(workdir: &Path) -> Snapshot {
    let mut files = BTreeMap::new();
    let mut others = BTreeMap::new();
    let mut incomplete = false;
    let mut pending = vec![(workdir.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // symlink_metadata: links are neither followed nor returned, so a
            // link cannot pull files from outside the workdir.
            let Ok(metadata) = entry.path().symlink_metadata() else { continue };
            let relative = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
            if metadata.is_dir() {
                if name != ".git" {
                    pending.push((entry.path(), relative));
                }
            } else if metadata.is_file() {
                if files.len() >= MAX_WALKED_FILES {
                    incomplete = true;
                    continue;
                }
                files.insert(relative, stamp(&metadata));
            } else if files.len() + others.len() < MAX_WALKED_FILES {
                others.insert(relative, kind_of(metadata.file_type()));
            } else {
                incomplete = true;
            }
        }
    }
    Snapshot { files, others, incomplete }
}

/// The note for entries that would have been chosen but are not regular
/// files (a link could point anywhere; a FIFO could block the runner), or
/// `None` when there are none: matching one of `patterns`, or with no
/// patterns, new since `before`.
pub fn skipped_note(before: &Snapshot, after: &Snapshot, patterns: &[String]) -> Option<String> {
    let skipped: Vec<String> = after
        .others
        .iter()
        .filter(|(path, kind)| chosen(path, patterns, || before.others.get(*path) != Some(kind)))
        .map(|(path, kind)| format!("`{path}` ({kind})"))
        .collect();
    if skipped.is_empty() {
        return None;
    }
    let shown = skipped.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    let more = if skipped.len() > 5 { format!(" and {} more", skipped.len() - 5) } else { String::new() };
    Some(format!(
        "{} entries chosen as artifacts are not regular files and were not sent (only regular files are): {shown}{more}",
        skipped.len()
    ))
}

/// Chooses the artifacts: files matching one of `patterns`, or with no
/// patterns, files new or changed since `before`.
pub fn select(before: &Snapshot, after: &Snapshot, patterns: &[String]) -> Vec<String> {
    after
        .files
        .iter()
        .filter(|(path, stamp)| chosen(path, patterns, || before.files.get(*path) != Some(stamp)))
        .map(|(path, _)| path.clone())
        .collect()
}

/// The one rule for what is chosen: matching one of `patterns`, or with
/// no patterns, `changed` (new or changed since the snapshot before).
fn chosen(path: &str, patterns: &[String], changed: impl FnOnce() -> bool) -> bool {
    if patterns.is_empty() { changed() } else { patterns.iter().any(|pattern| glob_matches(pattern, path)) }
}

/// Summary of what `send` wrote.
pub struct Sent {
    pub count: u32,
    pub truncated: bool,
    pub notes: Vec<String>,
}

/// Writes an `Artifact` frame (and its chunks) for each path, in order,
/// while the content fits under `cap` bytes in total. Files past the cap are
/// still listed, without content, and a note names them and the cap; past
/// `MAX_ARTIFACT_FILES`, they are not listed at all. With an output store's
/// `spill` budget, a file past the cap that fits whole in what is left of
/// it is sent anyway, marked `spilled`, for the store rather than inline.
pub fn send(workdir: &Path, paths: &[String], cap: u64, spill: Option<&SpillBudget>, sink: &FrameSink) -> Sent {
    let mut sent = Sent { count: 0, truncated: false, notes: Vec::new() };
    let mut remaining = cap;
    let mut without_content = Vec::new();
    for (index, relative) in paths.iter().enumerate() {
        if index >= MAX_ARTIFACT_FILES {
            sent.truncated = true;
            sent.notes.push(format!(
                "{} more matching files were not listed (limit {MAX_ARTIFACT_FILES}); narrow `artifacts`",
                paths.len() - index
            ));
            break;
        }
        let full_path = workdir.join(relative);
        match hash_artifact(&full_path) {
            Ok(header_info) => {
                let content_included = header_info.size <= remaining;
                let spilled = !content_included && spill.is_some_and(|budget| budget.take_whole(header_info.size));
                if !content_included && !spilled {
                    sent.truncated = true;
                    without_content.push((relative.clone(), header_info.size));
                }
                write_frame(
                    sink,
                    &Frame::Artifact(ArtifactHeader {
                        path: relative.clone(),
                        size: header_info.size,
                        mode: header_info.mode,
                        sha256: header_info.sha256.clone(),
                        content_included,
                        spilled,
                    }),
                );
                let mut streamed = None;
                if spilled {
                    // Held in the sandbox: the header again where the
                    // chunks go, so that the held frames stand alone.
                    let held = spill.and_then(SpillBudget::held_sink);
                    if let Some(held) = held {
                        write_frame(
                            held,
                            &Frame::Artifact(ArtifactHeader {
                                path: relative.clone(),
                                size: header_info.size,
                                mode: header_info.mode,
                                sha256: String::new(),
                                content_included: false,
                                spilled: true,
                            }),
                        );
                    }
                    streamed = Some(send_chunks(&full_path, header_info.size, held.unwrap_or(sink)));
                }
                if content_included {
                    let chunks = send_chunks(&full_path, header_info.size, sink);
                    remaining -= chunks.bytes.min(remaining);
                    streamed = Some(chunks);
                }
                if let Some(chunks) = streamed
                    && (chunks.bytes != header_info.size || chunks.sha256 != header_info.sha256)
                {
                    sent.notes.push(format!(
                        "artifact `{relative}` changed while it was sent ({} of {} bytes sent); its content may not match its sha256",
                        chunks.bytes, header_info.size
                    ));
                }
                sent.count += 1;
            }
            Err(error) => {
                sent.truncated = true;
                sent.notes.push(format!("artifact `{relative}` could not be read: {error}"));
            }
        }
    }
    if let Some(mut note) = over_cap_note(&without_content, cap, cap - remaining) {
        if spill.is_some() {
            note.push_str("; the output store had no room left for them under its limit per run (MCP_K8S_OUTPUTS_MAX_RUN_BYTES)");
        }
        sent.notes.push(note);
    }
    sent
}

/// What `send_chunks` sent.
struct Streamed {
    bytes: u64,
    sha256: String,
}

/// Streams a file's first `size` bytes as chunk frames, read again from
/// disk a chunk at a time, so that no file is ever held whole: the runner
/// shares the sandbox's memory with what the command left (a full
/// /dev/shm), and a 9 MiB artifact read whole once cost it the sandbox. A
/// file that shrank since it was hashed sends fewer bytes, which the
/// server sees against `size`; the bytes sent are hashed again, so the
/// caller can say when they are not what the header promised.
fn send_chunks(path: &Path, size: u64, sink: &FrameSink) -> Streamed {
    match fs::File::open(path) {
        Ok(file) => stream_chunks(file.take(size), sink),
        Err(_) => Streamed { bytes: 0, sha256: String::new() },
    }
}

fn stream_chunks(mut source: impl Read, sink: &FrameSink) -> Streamed {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut bytes = 0u64;
    let mut buffer = vec![0u8; frame::CHUNK_BYTES];
    loop {
        match source.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => {
                bytes += read as u64;
                context.update(&buffer[..read]);
                write_frame(sink, &Frame::ArtifactChunk(ArtifactChunk { data_b64: frame::to_base64(&buffer[..read]) }));
            }
        }
    }
    Streamed { bytes, sha256: hex(context.finish().as_ref()) }
}

/// Names the files that came back without content and the cap that
/// applied (they used to come back with empty notes).
/// At most five names, so a thousand skipped files make one short note.
fn over_cap_note(without_content: &[(String, u64)], cap: u64, sent_bytes: u64) -> Option<String> {
    const NAMED: usize = 5;
    if without_content.is_empty() {
        return None;
    }
    let (first, rest) = without_content.split_at(without_content.len().min(NAMED));
    let mut names: Vec<String> = first.iter().map(|(path, size)| format!("`{path}` ({size} bytes)")).collect();
    if !rest.is_empty() {
        names.push(format!("{} more", rest.len()));
    }
    let verb = if without_content.len() == 1 { "was" } else { "were" };
    Some(format!(
        "{} {verb} listed without content: the artifact cap is {cap} bytes for all files together (MCP_K8S_MAX_ARTIFACT_BYTES) and {sent_bytes} bytes were already sent; select fewer files with `artifacts`, write smaller ones, or ask the operator to raise the cap",
        names.join(", ")
    ))
}

/// Matches a relative path against a glob: `*` and `?` within one path
/// segment, `**` for any number of segments (never entering `.git`), and a
/// trailing `/` for everything under a folder.
fn glob_matches(pattern: &str, path: &str) -> bool {
    let pattern = pattern.trim_start_matches("./");
    let pattern_owned;
    let pattern = if let Some(folder) = pattern.strip_suffix('/') {
        pattern_owned = format!("{folder}/**");
        pattern_owned.as_str()
    } else {
        pattern
    };
    let pattern_segments: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
    let path_segments: Vec<&str> = path.split('/').collect();
    segments_match(&pattern_segments, &path_segments)
}

struct ArtifactInfo {
    size: u64,
    mode: u32,
    sha256: String,
}

fn stamp(metadata: &fs::Metadata) -> FileStamp {
    FileStamp {
        size: metadata.len(),
        modified_ns: i128::from(metadata.mtime()) * 1_000_000_000 + i128::from(metadata.mtime_nsec()),
        inode: metadata.ino(),
    }
}

/// A file's size, mode and SHA-256, read through a bounded buffer. The
/// size reported is what was read, which is the truth even if the file
/// changed after it was listed.
fn hash_artifact(path: &Path) -> std::io::Result<ArtifactInfo> {
    let metadata = path.symlink_metadata()?;
    let mode = metadata.permissions().mode() & 0o7777;
    let mut file = fs::File::open(path)?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut size = 0u64;
    let mut buffer = vec![0u8; frame::CHUNK_BYTES];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        size += read as u64;
        context.update(&buffer[..read]);
    }
    Ok(ArtifactInfo { size, mode, sha256: hex(context.finish().as_ref()) })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn segments_match(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|skip| !path[..skip].contains(&".git") && segments_match(rest, &path[skip..])),
        Some((first, rest)) => match path.split_first() {
            Some((segment, path_rest)) => segment_matches(first.as_bytes(), segment.as_bytes()) && segments_match(rest, path_rest),
            None => false,
        },
    }
}

fn segment_matches(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| segment_matches(rest, &text[skip..])),
        Some((b'?', rest)) => !text.is_empty() && segment_matches(rest, &text[1..]),
        Some((byte, rest)) => text.first() == Some(byte) && segment_matches(rest, &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_cases() {
        let cases = [
            ("out.txt", "out.txt", true),
            ("out.txt", "dir/out.txt", false),
            ("*.png", "plot.png", true),
            ("*.png", "dir/plot.png", false),
            ("**/*.png", "dir/sub/plot.png", true),
            ("**/*.png", "plot.png", true),
            ("dist/", "dist/a/b.js", true),
            ("dist/", "distx/a.js", false),
            ("dist/**", "dist/a.js", true),
            ("./report-?.txt", "report-1.txt", true),
            ("report-?.txt", "report-12.txt", false),
            ("**", ".git/config", false),
            ("**/*", "a/.git/HEAD", false),
            ("*", ".env", true),
        ];
        for (pattern, path, expected) in cases {
            assert_eq!(glob_matches(pattern, path), expected, "{pattern} vs {path}");
        }
    }

    #[test]
    fn the_over_cap_note_names_a_few_files_and_the_cap() {
        let files = |n: usize| (0..n).map(|i| (format!("f{i}"), 7)).collect::<Vec<_>>();
        assert_eq!(over_cap_note(&[], 10, 0), None);
        let one = over_cap_note(&files(1), 10, 4).unwrap();
        assert!(one.starts_with("`f0` (7 bytes) was listed without content: the artifact cap is 10 bytes"), "{one}");
        assert!(one.contains("4 bytes were already sent"), "{one}");
        let many = over_cap_note(&files(8), 10, 0).unwrap();
        assert!(
            many.starts_with("`f0` (7 bytes), `f1` (7 bytes), `f2` (7 bytes), `f3` (7 bytes), `f4` (7 bytes), 3 more were listed"),
            "{many}"
        );
    }

    /// A large artifact goes out a chunk at a time: the runner never holds
    /// more than one chunk of it that was not yet written as a frame.
    #[test]
    fn an_artifact_is_streamed_within_one_chunk_of_memory() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};

        /// Counts the frames written (one line each).
        struct Lines(Arc<AtomicU64>);
        impl std::io::Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.fetch_add(bytes.iter().filter(|byte| **byte == b'\n').count() as u64, Ordering::SeqCst);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        /// A file of `left` bytes that checks, at each read, that all it
        /// gave but the last chunk was framed already.
        struct Watched {
            left: u64,
            read: u64,
            framed: Arc<AtomicU64>,
        }
        impl Read for Watched {
            fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
                assert!(buffer.len() <= frame::CHUNK_BYTES, "a read of {} bytes", buffer.len());
                let framed = self.framed.load(Ordering::SeqCst);
                assert!(self.read <= (framed + 1) * frame::CHUNK_BYTES as u64, "{} bytes read, {framed} chunks framed", self.read);
                let n = (buffer.len() as u64).min(self.left) as usize;
                buffer[..n].fill(b'x');
                self.left -= n as u64;
                self.read += n as u64;
                Ok(n)
            }
        }
        let framed = Arc::new(AtomicU64::new(0));
        let sink = FrameSink::tagged(
            crate::sandbox::frame::Tag::from_bytes([1; crate::sandbox::frame::TAG_BYTES]),
            Box::new(Lines(framed.clone())),
        );
        let size = 9 << 20;
        let streamed = stream_chunks(Watched { left: size, read: 0, framed: framed.clone() }, &sink);
        assert_eq!(streamed.bytes, size);
        let expected = ring::digest::digest(&ring::digest::SHA256, &vec![b'x'; size as usize]);
        assert_eq!(streamed.sha256, hex(expected.as_ref()));
        assert_eq!(framed.load(Ordering::SeqCst), size.div_ceil(frame::CHUNK_BYTES as u64));
    }

    #[test]
    fn default_selection_is_new_or_changed_files() {
        let dir = std::env::temp_dir().join(format!("runner-artifacts-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join(".git")).unwrap();
        fs::write(dir.join("input.txt"), "in").unwrap();
        fs::write(dir.join("kept.txt"), "same").unwrap();
        let before = snapshot(&dir);
        fs::write(dir.join("input.txt"), "changed!").unwrap();
        fs::create_dir_all(dir.join("out")).unwrap();
        fs::write(dir.join("out/new.bin"), [0u8, 1]).unwrap();
        fs::write(dir.join(".git/index"), "x").unwrap();
        let after = snapshot(&dir);
        assert_eq!(select(&before, &after, &[]), vec!["input.txt".to_string(), "out/new.bin".to_string()]);
        assert_eq!(select(&before, &after, &["*.txt".to_string()]), vec!["input.txt".to_string(), "kept.txt".to_string()]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
