//! The output store: the whole of a stream or a file too big to inline in a
//! result, kept in a folder the operator provides (MCP_K8S_OUTPUTS_DIR) until
//! the run's retention ends, and read back in pieces through resource links
//! (`job://<run id>/stdout`, `/stderr`, `/files/<path>`).
//!
//! A folder, not the pod's log or an object store: the finished pod's log
//! is cut by the kubelet's rotation (10 MiB by default) and goes with the
//! Job; a folder on a ReadWriteMany volume survives restarts, is seen by
//! every replica and needs neither credentials nor a client for another
//! API. On Docker it is a host folder.
//!
//! Layout: `<dir>/<run id>/` holds `stdout`, `stderr`, `files/<n>` and
//! `index.json` (what each entry is, how much of it arrived, when it
//! expires). A run's bytes are written into `<dir>/.partial-<run id>-<rand>/`
//! as the runner's frames arrive and renamed into place once the run is
//! judged: the first process to finish a run wins, a second one (another
//! replica that read the same log) finds it there and answers its links.
//!
//! The run id is the capability, as it is in a `job_token`: 128 random bits
//! (or the hash of an idempotency key), so a link can be read by whoever
//! could fetch the run's result, and by nobody else. The URI forms and the
//! range arithmetic are pure functions, tested as tables.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::sandbox::frame::Stream;

/// The largest piece one `resources/read` returns.
pub const MAX_PIECE: u64 = 1 << 20;
/// The piece a read without `length` gets: half the largest, so that a
/// binary piece, base64 in JSON, fits a client's 1 MiB event limit (the
/// Python SDK's for server-sent events, which legacy SSE uses for every
/// answer).
pub const DEFAULT_PIECE: u64 = 512 << 10;
/// How the URIs of stored outputs start.
pub const SCHEME: &str = "job://";
/// A partial folder no write has touched for this long belongs to a
/// process that died mid-run: the reaper removes it.
const PARTIAL_STALE: Duration = Duration::from_secs(3600);
/// The index is small (one entry per stream and stored file); anything
/// bigger was not written by this server.
const MAX_INDEX_BYTES: u64 = 1 << 20;
const INDEX: &str = "index.json";

/// The store's folder and bounds.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    max_run_bytes: u64,
    max_bytes: u64,
    retention: Duration,
}

/// What a stored entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    Stdout,
    Stderr,
    /// A file, by its path relative to the workdir.
    File(String),
}

/// A link to a stored entry, as a result lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    pub uri: String,
    /// `stdout`, `stderr` or the file's path.
    pub name: String,
    pub mime_type: &'static str,
    /// Bytes stored, which a read can reach.
    pub size: u64,
    /// Bytes the command wrote; more than `size` when the store could not
    /// keep all of it (`complete` is then false).
    pub total: u64,
    pub complete: bool,
    pub expires_at: SystemTime,
}

/// A `resources/read` of a stored entry, from its URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub run_id: String,
    pub entry: Entry,
    pub offset: u64,
    /// At most `MAX_PIECE`; `DEFAULT_PIECE` when the URI names none.
    pub length: u64,
}

/// One piece read back.
#[derive(Debug, PartialEq)]
pub struct Piece {
    pub bytes: Vec<u8>,
    pub offset: u64,
    /// Bytes stored in all: a client pages until `offset + len == size`.
    pub size: u64,
    pub total: u64,
    pub complete: bool,
    pub mime_type: &'static str,
}

/// Why a read got nothing.
#[derive(Debug, PartialEq)]
pub enum ReadError {
    /// The URI is not one of ours, or its range is malformed.
    BadUri(String),
    /// No such run or entry: retention ended (the reaper deleted it), the
    /// link is wrong, or the run's output fitted inline.
    NotFound(String),
    /// The run's retention ended; the reaper has not deleted it yet.
    Expired(String),
    /// The offset is past the end.
    BadRange(String),
    /// The folder could not be read.
    Io(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::BadUri(why) | ReadError::NotFound(why) | ReadError::Expired(why) | ReadError::BadRange(why) => {
                formatter.write_str(why)
            }
            ReadError::Io(why) => {
                write!(formatter, "the output store could not be read: {why}; the operator should check MCP_K8S_OUTPUTS_DIR")
            }
        }
    }
}

impl Entry {
    fn name(&self) -> &str {
        match self {
            Entry::Stdout => "stdout",
            Entry::Stderr => "stderr",
            Entry::File(path) => path,
        }
    }

    fn mime_type(&self) -> &'static str {
        match self {
            Entry::Stdout | Entry::Stderr => "text/plain",
            Entry::File(path) => mime_type_of(path),
        }
    }
}

/// The MIME type a file's extension suggests; `application/octet-stream`
/// for any other.
fn mime_type_of(path: &str) -> &'static str {
    let extension = path.rsplit_once('.').map(|(_, extension)| extension.to_ascii_lowercase()).unwrap_or_default();
    match extension.as_str() {
        "txt" | "log" | "out" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/x-ndjson",
        "html" | "htm" => "text/html",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "pdf" => "application/pdf",
        "gz" | "tgz" => "application/gzip",
        "tar" => "application/x-tar",
        "zip" => "application/zip",
        _ => "application/octet-stream",
    }
}

/// The URI of a run's entry. A file's path is percent-encoded, `/` kept.
pub fn uri(run_id: &str, entry: &Entry) -> String {
    match entry {
        Entry::Stdout => format!("{SCHEME}{run_id}/stdout"),
        Entry::Stderr => format!("{SCHEME}{run_id}/stderr"),
        Entry::File(path) => format!("{SCHEME}{run_id}/files/{}", percent_encode(path)),
    }
}

fn percent_encode(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = std::str::from_utf8(bytes.get(at + 1..at + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Whether `uri` is one of the store's, so the caller knows whose it is.
pub fn is_ours(uri: &str) -> bool {
    uri.starts_with(SCHEME)
}

/// Reads a URI: `job://<run id>/<entry>[?offset=N][&length=M]`. The length
/// defaults to `DEFAULT_PIECE` and is cut to `MAX_PIECE`: a client pages by the `size`
/// each answer carries.
pub fn parse_uri(uri: &str) -> Result<Request, ReadError> {
    let bad = |why: &str| {
        ReadError::BadUri(format!(
            "`{}` {why}; a stored output's URI is job://<run id>/stdout, /stderr or /files/<path>, with ?offset=<byte>&length=<bytes> for a piece (at most {MAX_PIECE})",
            crate::echo::shorten(uri)
        ))
    };
    let rest = uri.strip_prefix(SCHEME).ok_or_else(|| bad("is not a job:// URI"))?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (run_id, entry) = path.split_once('/').ok_or_else(|| bad("names no entry"))?;
    if !is_run_id(run_id) {
        return Err(bad("has no valid run id"));
    }
    let entry = match entry {
        "stdout" => Entry::Stdout,
        "stderr" => Entry::Stderr,
        other => {
            let encoded = other.strip_prefix("files/").ok_or_else(|| bad("names no known entry"))?;
            let path = percent_decode(encoded).ok_or_else(|| bad("has a malformed percent-encoding"))?;
            if path.is_empty() {
                return Err(bad("names no file"));
            }
            Entry::File(path)
        }
    };
    let (mut offset, mut length) = (None, None);
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match key {
            "offset" => &mut offset,
            "length" => &mut length,
            _ => return Err(bad(&format!("has an unknown parameter `{key}`"))),
        };
        // Which of two values was meant is a guess: refused, not taken.
        if slot.is_some() {
            return Err(bad(&format!("has `{key}` twice; give each parameter once")));
        }
        *slot = Some(parse_number(value).map_err(|why| bad(&format!("has `{key}` that {why}")))?);
    }
    // A length past u64 is over the piece limit like any other: cut.
    let length = length.map_or(DEFAULT_PIECE, |length| length.unwrap_or(u64::MAX).min(MAX_PIECE));
    let offset =
        offset.map_or(Ok(0), |offset| offset.ok_or_else(|| bad(&format!("has `offset` that is too large: at most {}", u64::MAX))))?;
    Ok(Request { run_id: run_id.to_string(), entry, offset, length })
}

/// A query's number: ASCII digits only. `Ok(None)` when it is a whole
/// number too large for u64 (what that means is the parameter's to say).
fn parse_number(value: &str) -> Result<Option<u64>, &'static str> {
    if value.is_empty() || !value.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err("is not a whole number");
    }
    Ok(value.parse::<u64>().ok())
}

/// What a run's folder may be named: what a run id is (and nothing that
/// climbs out of the store).
fn is_run_id(text: &str) -> bool {
    (1..=63).contains(&text.len()) && text.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
}

/// The part of `size` stored bytes a request reaches: the start and how
/// many bytes, or why none can be had.
fn piece_range(offset: u64, length: u64, size: u64) -> Result<(u64, u64), String> {
    if offset > size {
        return Err(format!("offset {offset} is past the end: the entry holds {size} bytes; read from 0 to {size}"));
    }
    Ok((offset, length.min(MAX_PIECE).min(size - offset)))
}

/// The index kept beside a run's bytes.
#[derive(Debug, Serialize, Deserialize)]
struct Index {
    run_id: String,
    /// The caller whose run this is, on a server with several: only it
    /// reads the entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    expires_at_s: u64,
    entries: Vec<IndexEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
struct IndexEntry {
    /// `stdout`, `stderr` or `file`.
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path: Option<String>,
    /// The file in the run's folder holding the bytes.
    file: String,
    stored: u64,
    total: u64,
    complete: bool,
}

impl IndexEntry {
    fn entry(&self) -> Option<Entry> {
        match (self.kind.as_str(), &self.path) {
            ("stdout", _) => Some(Entry::Stdout),
            ("stderr", _) => Some(Entry::Stderr),
            ("file", Some(path)) => Some(Entry::File(path.clone())),
            _ => None,
        }
    }
}

impl Store {
    /// The store in `dir`; nothing is touched until `prepare`.
    pub fn new(dir: &Path, max_run_bytes: u64, max_bytes: u64, retention: Duration) -> Store {
        Store { dir: dir.to_path_buf(), max_run_bytes, max_bytes, retention }
    }

    /// Makes the folder if missing (mode 0700) and checks it writable now,
    /// so that a folder the server cannot use stops it at start instead of
    /// failing each run.
    pub fn prepare(&self) -> Result<(), String> {
        let cannot = |error: std::io::Error| {
            format!("MCP_K8S_OUTPUTS_DIR `{}` cannot be used: {error}; give the server a folder it may write", self.dir.display())
        };
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.dir).map_err(cannot)?;
        let probe = self.dir.join(format!(".probe-{}", std::process::id()));
        fs::write(&probe, b"").map_err(cannot)?;
        let _ = fs::remove_file(&probe);
        Ok(())
    }

    /// Bytes one run may keep: what the runner is told it may send.
    pub fn max_run_bytes(&self) -> u64 {
        self.max_run_bytes
    }

    /// How long a run's entries stay readable after it ends.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Reads one piece, as `request` asks, at `now`. `reader`: the caller
    /// asking, on a server with several; another caller's run reads as
    /// not found.
    pub fn read(&self, request: &Request, now: SystemTime, reader: Option<&str>) -> Result<Piece, ReadError> {
        let run_dir = self.dir.join(&request.run_id);
        let not_found = || {
            ReadError::NotFound(format!(
                "no stored output at {}: the run's retention ({} s, MCP_K8S_RESULT_TTL_S) has ended and it was deleted, or the link is wrong; links come in run_job, execute_code and fetch_job results",
                uri(&request.run_id, &request.entry),
                self.retention.as_secs()
            ))
        };
        let index = match read_index(&run_dir) {
            Ok(Some(index)) if visible_to(index.owner.as_deref(), reader) => index,
            Ok(_) => return Err(not_found()),
            Err(error) => return Err(ReadError::Io(error)),
        };
        if seconds(now) >= index.expires_at_s {
            return Err(ReadError::Expired(format!(
                "the stored output of run {} expired at {} (its retention ended); it can no longer be read",
                request.run_id,
                crate::log::rfc3339_utc(UNIX_EPOCH + Duration::from_secs(index.expires_at_s))
            )));
        }
        let Some(found) = index.entries.iter().find(|entry| entry.entry().as_ref() == Some(&request.entry)) else {
            return Err(not_found());
        };
        let (offset, length) = piece_range(request.offset, request.length, found.stored).map_err(ReadError::BadRange)?;
        let file = fs::File::open(run_dir.join(&found.file)).map_err(|error| ReadError::Io(error.to_string()))?;
        let mut bytes = vec![0u8; length as usize];
        file.read_exact_at(&mut bytes, offset).map_err(|error| ReadError::Io(error.to_string()))?;
        Ok(Piece { bytes, offset, size: found.stored, total: found.total, complete: found.complete, mime_type: request.entry.mime_type() })
    }

    /// The links of a run another process finished, as that process
    /// answered them: for a replica asked for a run whose sandbox (and so
    /// its output) is gone by the time it asks. `None` when the store has
    /// no entries of the run for `reader`, or they have expired.
    pub fn links_of(&self, run_id: &str, now: SystemTime, reader: Option<&str>) -> Option<Vec<Link>> {
        if !is_run_id(run_id) {
            return None;
        }
        let index = read_index(&self.dir.join(run_id)).ok().flatten()?;
        (visible_to(index.owner.as_deref(), reader) && seconds(now) < index.expires_at_s).then(|| links(run_id, &index))
    }

    /// Deletes a run's entries (cancel_job), and any partial folder of it.
    pub fn remove(&self, run_id: &str) {
        if !is_run_id(run_id) {
            return;
        }
        let _ = fs::remove_dir_all(self.dir.join(run_id));
    }

    /// Deletes what expired at `now`, and partial folders no process has
    /// written for `PARTIAL_STALE`. Returns how many folders went.
    pub fn reap(&self, now: SystemTime) -> usize {
        let Ok(entries) = fs::read_dir(&self.dir) else { return 0 };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let expired = if name.starts_with(".partial-") {
                newest_write(&path).is_some_and(|written| now.duration_since(written).unwrap_or_default() > PARTIAL_STALE)
            } else if is_run_id(&name) {
                match read_index(&path) {
                    Ok(Some(index)) => seconds(now) >= index.expires_at_s,
                    // A run folder without an index, or with one that
                    // cannot be read (damaged, written by something else),
                    // has no expiry to go by: as stale as a partial one
                    // once nothing has written it for as long. Kept for
                    // good, it would fill the store's bound.
                    Ok(None) | Err(_) => {
                        newest_write(&path).is_some_and(|written| now.duration_since(written).unwrap_or_default() > PARTIAL_STALE)
                    }
                }
            } else {
                false
            };
            if expired && fs::remove_dir_all(&path).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// Bytes in the store now, partial folders included.
    fn used_bytes(&self) -> u64 {
        fn walk(path: &Path, depth: u32) -> u64 {
            let Ok(entries) = fs::read_dir(path) else { return 0 };
            entries
                .flatten()
                .map(|entry| match entry.metadata() {
                    Ok(metadata) if metadata.is_dir() && depth > 0 => walk(&entry.path(), depth - 1),
                    Ok(metadata) if metadata.is_file() => metadata.len(),
                    _ => 0,
                })
                .sum()
        }
        walk(&self.dir, 2)
    }
}

fn seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

fn read_index(run_dir: &Path) -> Result<Option<Index>, String> {
    let file = match fs::File::open(run_dir.join(INDEX)) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error.to_string()),
    };
    let mut text = Vec::new();
    file.take(MAX_INDEX_BYTES).read_to_end(&mut text).map_err(|error| error.to_string())?;
    // Named by the run and the setting, not the store's path: the message
    // reaches the caller, who has no business knowing the server's folders.
    serde_json::from_slice(&text).map(Some).map_err(|error| {
        let run = run_dir.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        format!(
            "the index of run {run} in the output store (MCP_K8S_OUTPUTS_DIR) is damaged: {error}; the run's stored output cannot be read"
        )
    })
}

/// When anything in a folder (one level of subfolders) was last written.
fn newest_write(dir: &Path) -> Option<SystemTime> {
    let mut newest = fs::metadata(dir).and_then(|metadata| metadata.modified()).ok()?;
    let mut pending = vec![(dir.to_path_buf(), 1u32)];
    while let Some((path, depth)) = pending.pop() {
        for entry in fs::read_dir(&path).into_iter().flatten().flatten() {
            let Ok(metadata) = entry.metadata() else { continue };
            if let Ok(modified) = metadata.modified() {
                newest = newest.max(modified);
            }
            if metadata.is_dir() && depth > 0 {
                pending.push((entry.path(), depth - 1));
            }
        }
    }
    Some(newest)
}

/// One run's bytes as they arrive from the runner's frames, in a partial
/// folder made at the first byte (a run whose output fits inline touches
/// no disk). Writes land at their offsets, so a log read twice writes the
/// same bytes twice in the same place. A write that fails stops the
/// spool; `finish` says why. Dropped unfinished, it removes its folder.
pub struct Spool {
    store: std::sync::Arc<Store>,
    run_id: String,
    /// The caller whose run it is (`RunSpec::owner`), kept in the index.
    owner: Option<String>,
    dir: Option<PathBuf>,
    /// Bytes this run may still add: the per-run limit, and what the store
    /// had left when the spool began.
    budget: u64,
    used: u64,
    streams: [Option<Part>; 2],
    files: Vec<(String, Part)>,
    /// The file whose chunks arrive now.
    current: Option<usize>,
    failed: Option<String>,
    /// The output the runner held in the sandbox is in (a log read again
    /// says so again; it is fetched once).
    pub held_fetched: bool,
}

/// One entry being written.
struct Part {
    file: fs::File,
    name: String,
    /// Contiguous bytes written from offset 0.
    received: u64,
    /// Set when a piece arrived past `received`: bytes are missing.
    gap: bool,
    /// Set when the budget stopped the writes.
    cut: bool,
    /// The size the runner announced (files).
    announced: u64,
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Spool").field("used", &self.used).field("failed", &self.failed).finish_non_exhaustive()
    }
}

impl Spool {
    pub fn new(store: std::sync::Arc<Store>, run_id: &str, owner: Option<&str>) -> Spool {
        Spool {
            store,
            run_id: run_id.to_string(),
            owner: owner.map(str::to_string),
            dir: None,
            budget: 0,
            used: 0,
            streams: [None, None],
            files: Vec::new(),
            current: None,
            failed: None,
            held_fetched: false,
        }
    }

    /// Bytes of a stream at `offset`.
    pub fn stream(&mut self, stream: Stream, offset: u64, bytes: &[u8]) {
        let index = stream.index();
        if self.streams[index].is_none() {
            let name = if index == 0 { "stdout" } else { "stderr" };
            self.streams[index] = self.part(name, 0);
        }
        let (budget, used) = (self.budget, self.used);
        let Some(part) = self.streams[index].as_mut() else { return };
        match write_part(part, offset, bytes, budget.saturating_sub(used)) {
            Ok(added) => self.used += added,
            Err(error) => self.fail(error),
        }
    }

    /// A stored file's header: its chunks follow. A second header for the
    /// same path (the log read again) writes it again from the start.
    pub fn file_start(&mut self, path: &str, size: u64) {
        if let Some(at) = self.files.iter().position(|(known, _)| known == path) {
            self.files[at].1.received = 0;
            self.current = Some(at);
            return;
        }
        let name = format!("files/{}", self.files.len());
        self.current = match self.part(&name, size) {
            Some(part) => {
                self.files.push((path.to_string(), part));
                Some(self.files.len() - 1)
            }
            None => None,
        };
    }

    /// The next chunk of the current stored file.
    pub fn file_chunk(&mut self, bytes: &[u8]) {
        let (budget, used) = (self.budget, self.used);
        let Some((_, part)) = self.current.and_then(|at| self.files.get_mut(at)) else { return };
        let offset = part.received;
        match write_part(part, offset, bytes, budget.saturating_sub(used)) {
            Ok(added) => self.used += added,
            Err(error) => self.fail(error),
        }
    }

    /// A chunk that belongs to no stored file ends the current one.
    pub fn file_end(&mut self) {
        self.current = None;
    }

    /// Opens a new entry's file, making the partial folder first.
    fn part(&mut self, name: &str, announced: u64) -> Option<Part> {
        if self.failed.is_some() {
            return None;
        }
        let dir = match self.dir.clone() {
            Some(dir) => dir,
            None => match self.begin() {
                Ok(dir) => dir,
                Err(error) => {
                    self.fail(error);
                    return None;
                }
            },
        };
        let path = dir.join(name);
        let opened = fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).mode(0o600).open(&path);
        match opened {
            Ok(file) => Some(Part { file, name: name.to_string(), received: 0, gap: false, cut: false, announced }),
            Err(error) => {
                self.fail(format!("{}: {error}", path.display()));
                None
            }
        }
    }

    fn begin(&mut self) -> Result<PathBuf, String> {
        let random: [u8; 8] = crate::sandbox::random_bytes()?;
        let dir = self.store.dir.join(format!(".partial-{}-{}", self.run_id, crate::sandbox::to_hex(&random)));
        fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|error| format!("{}: {error}", dir.display()))?;
        fs::DirBuilder::new().mode(0o700).create(dir.join("files")).map_err(|error| format!("{}: {error}", dir.display()))?;
        self.budget = self.store.max_run_bytes.min(self.store.max_bytes.saturating_sub(self.store.used_bytes()));
        self.dir = Some(dir.clone());
        Ok(dir)
    }

    fn fail(&mut self, error: String) {
        self.failed.get_or_insert(error);
    }

    /// The links of the run when another process finished it in the
    /// store already: then what the runner held need not be fetched
    /// again (the runner, released, may be gone).
    pub fn finished_elsewhere(&self, now: SystemTime) -> Option<Vec<Link>> {
        self.store.links_of(&self.run_id, now, self.owner.as_deref())
    }

    /// Makes the run's entries readable: writes the index and moves the
    /// folder into place. `totals` are the streams' sizes as the runner
    /// counted them, `None` when the runner never reported (its stored
    /// streams are then marked incomplete). Returns the links, and a note when something could
    /// not be kept. Another process that finished the same run first wins:
    /// its links are answered.
    pub fn finish(mut self, totals: Option<[u64; 2]>, now: SystemTime) -> (Vec<Link>, Option<String>) {
        let Some(partial) = self.dir.take() else {
            // Nothing arrived here: another process (a replica that read
            // the run first, and fetched what the runner held) may have
            // finished it; its links are the run's.
            let theirs = self.finished_elsewhere(now).unwrap_or_default();
            return (theirs, self.failed.take().map(failed_note));
        };
        let note = self.failed.take().map(failed_note);
        let mut entries = Vec::new();
        for (index, part) in self.streams.iter().enumerate() {
            if let Some(part) = part {
                let kind = if index == 0 { "stdout" } else { "stderr" };
                let total = totals.map_or(part.received, |totals| totals[index].max(part.received));
                let complete = totals.is_some() && !part.gap && !part.cut && part.received == total;
                entries.push(IndexEntry { kind: kind.into(), path: None, file: part.name.clone(), stored: part.received, total, complete });
            }
        }
        for (path, part) in &self.files {
            let complete = !part.gap && !part.cut && part.received == part.announced;
            entries.push(IndexEntry {
                kind: "file".into(),
                path: Some(path.clone()),
                file: part.name.clone(),
                stored: part.received,
                total: part.announced,
                complete,
            });
        }
        let expires_at_s = seconds(now + self.store.retention);
        let index = Index { run_id: self.run_id.clone(), owner: self.owner.clone(), expires_at_s, entries };
        let target = self.store.dir.join(&self.run_id);
        // Mode 0600 like every other file of the store: the index names
        // the run's files and its caller (`fs::write` would make it 0644).
        let written = serde_json::to_vec(&index).map_err(|error| error.to_string()).and_then(|json| {
            fs::OpenOptions::new()
                .create_new(true)
                .write(true)
                .mode(0o600)
                .open(partial.join(INDEX))
                .and_then(|mut file| std::io::Write::write_all(&mut file, &json))
                .map_err(|error| error.to_string())
        });
        if let Err(error) = written {
            let _ = fs::remove_dir_all(&partial);
            return (Vec::new(), Some(failed_note(error)));
        }
        let index = match fs::rename(&partial, &target) {
            Ok(()) => index,
            Err(_) => {
                // Another process finished this run first (the target is
                // there and not empty): its entries stand.
                let _ = fs::remove_dir_all(&partial);
                match read_index(&target) {
                    Ok(Some(theirs)) => theirs,
                    _ => return (Vec::new(), Some(failed_note("the run's folder is there but holds no index".into()))),
                }
            }
        };
        (links(&self.run_id, &index), note)
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// The links an index lists.
fn links(run_id: &str, index: &Index) -> Vec<Link> {
    let expires_at = UNIX_EPOCH + Duration::from_secs(index.expires_at_s);
    index
        .entries
        .iter()
        .filter_map(|stored| {
            let entry = stored.entry()?;
            Some(Link {
                uri: uri(run_id, &entry),
                name: entry.name().to_string(),
                mime_type: entry.mime_type(),
                size: stored.stored,
                total: stored.total,
                complete: stored.complete,
                expires_at,
            })
        })
        .collect()
}

fn failed_note(error: String) -> String {
    format!(
        "the output store could not keep this run's whole output ({error}); what is inline is all there is; the operator should check MCP_K8S_OUTPUTS_DIR"
    )
}

/// Writes `bytes` at `offset` of `part`, within `room` new bytes. Returns
/// how many bytes the part grew by.
fn write_part(part: &mut Part, offset: u64, bytes: &[u8], room: u64) -> Result<u64, String> {
    if offset > part.received {
        part.gap = true;
        return Ok(0);
    }
    let end = offset + bytes.len() as u64;
    let growth = end.saturating_sub(part.received);
    let allowed = growth.min(room);
    if allowed < growth {
        part.cut = true;
    }
    let writable = (end - growth + allowed - offset) as usize;
    part.file.write_all_at(&bytes[..writable], offset).map_err(|error| format!("{}: {error}", part.name))?;
    part.received = part.received.max(offset + writable as u64);
    Ok(allowed)
}

/// Whether a run recorded for `owner` (`RunSpec::owner`) is `reader`'s to
/// see: every run when `reader` is `None` (a server with one caller),
/// else only the reader's own. One rule for runs, tokens and links.
pub fn visible_to(owner: Option<&str>, reader: Option<&str>) -> bool {
    reader.is_none_or(|reader| owner == Some(reader))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_sees_only_its_own_runs_unless_it_is_the_whole_server() {
        // (owner recorded on the run, reader asking, visible)
        let cases = [
            (Some("a"), Some("a"), true),
            (Some("b"), Some("a"), false),
            (None, Some("a"), false),
            (Some("a"), None, true),
            (None, None, true),
        ];
        for (owner, reader, expected) in cases {
            assert_eq!(visible_to(owner, reader), expected, "{reader:?} sees {owner:?}");
        }
    }

    const RUN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_uri_names_a_run_an_entry_and_a_range() {
        let piece = |entry: Entry, offset, length| Ok(Request { run_id: RUN.into(), entry, offset, length });
        let cases: Vec<(&str, String, Result<Request, ()>)> = vec![
            ("stdout, the first piece", format!("job://{RUN}/stdout"), piece(Entry::Stdout, 0, DEFAULT_PIECE)),
            ("stderr with a range", format!("job://{RUN}/stderr?offset=10&length=5"), piece(Entry::Stderr, 10, 5)),
            ("a length over the piece limit is cut", format!("job://{RUN}/stdout?length=99999999"), piece(Entry::Stdout, 0, MAX_PIECE)),
            ("length 0", format!("job://{RUN}/stdout?offset=3&length=0"), piece(Entry::Stdout, 3, 0)),
            (
                "a file, percent-encoded",
                format!("job://{RUN}/files/out/a%20b.bin"),
                piece(Entry::File("out/a b.bin".into()), 0, DEFAULT_PIECE),
            ),
            ("another scheme", format!("file://{RUN}/stdout"), Err(())),
            ("no entry", format!("job://{RUN}"), Err(())),
            ("an unknown entry", format!("job://{RUN}/env"), Err(())),
            ("a run id that climbs", "job://../stdout".into(), Err(())),
            ("a run id with a slash trick", "job:///etc/stdout".into(), Err(())),
            ("a negative offset", format!("job://{RUN}/stdout?offset=-1"), Err(())),
            ("an unknown parameter", format!("job://{RUN}/stdout?from=1"), Err(())),
            ("a bad escape", format!("job://{RUN}/files/a%zz"), Err(())),
            ("no file", format!("job://{RUN}/files/"), Err(())),
        ];
        for (case, uri, expected) in cases {
            assert_eq!(parse_uri(&uri).map_err(|_| ()), expected, "{case}");
        }
    }

    /// Regression: `offset=5&offset=6` silently read from 6, and an offset
    /// past u64 was "not a whole number".
    #[test]
    fn a_repeated_or_oversized_number_in_a_uri_is_refused_saying_which() {
        let cases = [
            ("offset=5&offset=6", Err("has `offset` twice; give each parameter once")),
            ("length=1&offset=2&length=1", Err("has `length` twice; give each parameter once")),
            ("offset=18446744073709551616", Err("has `offset` that is too large: at most 18446744073709551615")),
            ("offset=1x", Err("has `offset` that is not a whole number")),
            ("offset=", Err("has `offset` that is not a whole number")),
            ("offset=+1", Err("has `offset` that is not a whole number")),
            ("offset=18446744073709551615", Ok((u64::MAX, DEFAULT_PIECE))),
            ("length=99999999999999999999999", Ok((0, MAX_PIECE))),
        ];
        for (query, expected) in cases {
            let parsed = parse_uri(&format!("job://{RUN}/stdout?{query}"));
            match expected {
                Ok((offset, length)) => {
                    assert_eq!(parsed, Ok(Request { run_id: RUN.into(), entry: Entry::Stdout, offset, length }), "{query}");
                }
                Err(why) => {
                    let message = parsed.map(|_| String::new()).unwrap_or_else(|error| error.to_string());
                    assert!(message.contains(&format!("/stdout?{query}` {why}; ")), "{query}: {message}");
                }
            }
        }
    }

    #[test]
    fn a_uri_written_is_a_uri_read() {
        for entry in [Entry::Stdout, Entry::Stderr, Entry::File("dir/ü x?&=.txt".into())] {
            let written = uri(RUN, &entry);
            assert!(written.is_ascii(), "{written}");
            assert_eq!(parse_uri(&written).unwrap().entry, entry);
        }
    }

    #[test]
    fn a_range_is_cut_to_what_is_stored_and_to_the_piece_limit() {
        let big = 3 * MAX_PIECE;
        // (case, offset, length, size, the piece's start and length)
        type Case<'a> = (&'a str, u64, u64, u64, Result<(u64, u64), ()>);
        let cases: &[Case] = &[
            ("the first piece", 0, MAX_PIECE, big, Ok((0, MAX_PIECE))),
            ("the last, short piece", big - 10, MAX_PIECE, big, Ok((big - 10, 10))),
            ("offset at the end: nothing, no error", big, MAX_PIECE, big, Ok((big, 0))),
            ("offset past the end", big + 1, MAX_PIECE, big, Err(())),
            ("length 0", 5, 0, big, Ok((5, 0))),
            ("over the piece limit", 0, 5 * MAX_PIECE, big, Ok((0, MAX_PIECE))),
            ("an empty entry", 0, MAX_PIECE, 0, Ok((0, 0))),
        ];
        for (case, offset, length, size, expected) in cases {
            assert_eq!(piece_range(*offset, *length, *size).map_err(|_| ()), *expected, "{case}");
        }
    }

    fn store(dir: &Path, max_run_bytes: u64) -> std::sync::Arc<Store> {
        let store = Store::new(dir, max_run_bytes, 1 << 30, Duration::from_secs(60));
        store.prepare().unwrap();
        std::sync::Arc::new(store)
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mcp-outputs-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn read(store: &Store, uri: &str, now: SystemTime) -> Result<Piece, ReadError> {
        store.read(&parse_uri(uri).unwrap(), now, None)
    }

    #[test]
    fn a_spooled_run_reads_back_byte_exact_in_pieces_until_it_expires() {
        let dir = temp_dir("spool");
        let store = store(&dir, 1 << 30);
        let now = SystemTime::now();
        let stdout: Vec<u8> = (0..(2 * MAX_PIECE + 7)).map(|at| (at % 251) as u8).collect();
        let mut spool = Spool::new(store.clone(), RUN, None);
        for (at, chunk) in stdout.chunks(48 * 1024).enumerate() {
            spool.stream(Stream::Stdout, (at * 48 * 1024) as u64, chunk);
        }
        // The log read a second time from the start: same bytes, same place.
        spool.stream(Stream::Stdout, 0, &stdout[..100]);
        spool.file_start("out/data.bin", 4);
        spool.file_chunk(b"\xff\xfe");
        spool.file_chunk(b"\x00\x01");
        spool.file_end();
        let (links, note) = spool.finish(Some([stdout.len() as u64, 0]), now);
        assert_eq!(note, None);
        // Regression: the index was written 0644 beside 0600 files.
        let modes =
            |path: &Path| fs::metadata(path).map(|metadata| std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o777);
        assert_eq!(modes(&dir.join(RUN).join(INDEX)).unwrap(), 0o600);
        assert_eq!(
            links.iter().map(|link| (link.name.as_str(), link.size, link.complete)).collect::<Vec<_>>(),
            vec![("stdout", stdout.len() as u64, true), ("out/data.bin", 4, true)]
        );
        let mut back = Vec::new();
        loop {
            let piece = read(&store, &format!("{}?offset={}", links[0].uri, back.len()), now).unwrap();
            assert!(piece.bytes.len() as u64 <= MAX_PIECE);
            if piece.bytes.is_empty() {
                break;
            }
            back.extend(piece.bytes);
        }
        assert_eq!(back, stdout);
        assert_eq!(read(&store, &links[1].uri, now).unwrap().bytes, b"\xff\xfe\x00\x01");
        assert!(matches!(read(&store, &format!("{}?offset=5", links[1].uri), now), Err(ReadError::BadRange(_))));
        assert!(matches!(read(&store, &format!("job://{RUN}/stderr"), now), Err(ReadError::NotFound(_))));
        assert!(matches!(read(&store, "job://ffffffffffffffffffffffffffffffff/stdout", now), Err(ReadError::NotFound(_))));
        let later = now + Duration::from_secs(61);
        assert!(matches!(read(&store, &links[0].uri, later), Err(ReadError::Expired(_))));
        assert_eq!(store.reap(now), 0);
        assert_eq!(store.reap(later), 1);
        assert!(matches!(read(&store, &links[0].uri, now), Err(ReadError::NotFound(_))));
        // A run folder whose index is damaged says so without the store's
        // path (regression: the caller was shown it), and goes once it is
        // stale.
        let damaged = dir.join("ffffffffffffffffffffffffffffffff");
        fs::create_dir(&damaged).unwrap();
        fs::write(damaged.join(INDEX), b"{not json").unwrap();
        match read(&store, "job://ffffffffffffffffffffffffffffffff/stdout", now) {
            Err(ReadError::Io(message)) => assert_eq!(
                message,
                "the index of run ffffffffffffffffffffffffffffffff in the output store (MCP_K8S_OUTPUTS_DIR) is damaged: key must be a string at line 1 column 2; the run's stored output cannot be read"
            ),
            other => panic!("{:?}", other.map(|piece| piece.size)),
        }
        assert_eq!(store.reap(now), 0, "not while it may still be written");
        assert_eq!(store.reap(now + PARTIAL_STALE + Duration::from_secs(1)), 1);
        assert!(!damaged.exists());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_run_of_a_caller_is_read_by_that_caller_alone() {
        let dir = temp_dir("owner");
        let store = store(&dir, 1 << 20);
        let now = SystemTime::now();
        let mut spool = Spool::new(store.clone(), RUN, Some("team-a"));
        spool.stream(Stream::Stdout, 0, b"hello");
        let (links, _) = spool.finish(Some([5, 0]), now);
        let request = parse_uri(&links[0].uri).unwrap();
        let cases = [(None, true), (Some("team-a"), true), (Some("team-b"), false)];
        for (reader, readable) in cases {
            let read = store.read(&request, now, reader);
            assert_eq!(read.is_ok(), readable, "{reader:?}");
            if !readable {
                assert!(matches!(read, Err(ReadError::NotFound(_))), "as a link that names nothing");
            }
        }
        let mut unowned = Spool::new(store.clone(), "fedcba9876543210fedcba9876543210", None);
        unowned.stream(Stream::Stdout, 0, b"x");
        let (links, _) = unowned.finish(Some([1, 0]), now);
        let read = store.read(&parse_uri(&links[0].uri).unwrap(), now, Some("team-a"));
        assert!(matches!(read, Err(ReadError::NotFound(_))), "a run of nobody is no caller's");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn what_did_not_arrive_or_did_not_fit_is_marked_incomplete() {
        let dir = temp_dir("incomplete");
        let store = store(&dir, 10);
        let now = SystemTime::now();
        let mut spool = Spool::new(store.clone(), RUN, None);
        spool.stream(Stream::Stdout, 0, b"abcd");
        spool.stream(Stream::Stdout, 8, b"ijkl");
        spool.stream(Stream::Stderr, 0, b"0123456789");
        let (links, _) = spool.finish(Some([12, 10]), now);
        let facts: Vec<_> = links.iter().map(|link| (link.name.as_str(), link.size, link.total, link.complete)).collect();
        assert_eq!(facts, vec![("stdout", 4, 12, false), ("stderr", 6, 10, false)]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_second_finisher_answers_the_first_ones_links_and_an_unfinished_spool_leaves_nothing() {
        let dir = temp_dir("twice");
        let store = store(&dir, 1 << 20);
        let now = SystemTime::now();
        let mut first = Spool::new(store.clone(), RUN, None);
        let mut second = Spool::new(store.clone(), RUN, None);
        first.stream(Stream::Stdout, 0, b"first");
        second.stream(Stream::Stdout, 0, b"second");
        let (first_links, _) = first.finish(Some([5, 0]), now);
        let (second_links, _) = second.finish(Some([6, 0]), now);
        assert_eq!(first_links, second_links);
        assert_eq!(read(&store, &first_links[0].uri, now).unwrap().bytes, b"first");
        // A process that did not follow the run answers the same links
        // from the store; another caller, and a time past the retention,
        // get none.
        assert_eq!(store.links_of(RUN, now, None), Some(first_links.clone()));
        assert_eq!(store.links_of("fedcba9876543210fedcba9876543210", now, None), None);
        assert_eq!(store.links_of(RUN, now + Duration::from_secs(7200), None), None);
        // A finisher that received nothing (what the runner held was
        // fetched by the first) answers the first one's links too.
        let empty = Spool::new(store.clone(), RUN, None);
        assert_eq!(empty.finished_elsewhere(now), Some(first_links.clone()));
        assert_eq!(empty.finish(Some([5, 0]), now).0, first_links);
        let mut dropped = Spool::new(store.clone(), "fedcba9876543210fedcba9876543210", None);
        dropped.stream(Stream::Stderr, 0, b"x");
        drop(dropped);
        let left: Vec<_> = fs::read_dir(&dir).unwrap().flatten().map(|entry| entry.file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from(RUN)]);
        let _ = fs::remove_dir_all(&dir);
    }
}
