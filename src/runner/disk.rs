//! The runner's own disk bound: while the command
//! runs, a thread measures the folders it may write (the workdir and /tmp)
//! and stops the command once they hold more than the limit together.
//!
//! The kubelet enforces the same limits (emptyDir `sizeLimit`, the
//! container's ephemeral-storage limit), but by evicting the pod after its
//! next measurement, which comes about once a minute: a job writing 8 MiB/s
//! put 576 MiB into a 64Mi `/tmp` first, and a fast writer could fill the
//! node. This watcher measures four times a second (less often for large
//! trees), the way the kubelet does (`du`: allocated blocks, not crossing
//! into other mounts), so the bound holds to within a fraction of a second
//! of writing, and the result says how much
//! each folder held and which limit applied.
//!
//! In an open sandbox the folders outlive the call: what an earlier call
//! left over the limit (its command was stopped a moment too late) is no
//! fault of the next, so a call is held to the limit, or to what the
//! folders held when its command started if that was more (`bound`): a
//! call that frees space, or writes nothing, runs; one that writes more
//! is stopped.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Files and folders looked at per measurement at most, so a folder with
/// millions of entries cannot make the watcher itself the problem.
const MAX_ENTRIES: usize = 200_000;
/// Time between measurements at least; more when a walk is slow, so the
/// watcher spends at most about 5 % of a CPU. A first version waited 1 s,
/// and one `dd` at disk speed put 1 GB into a 64Mi /tmp in that second.
const MIN_INTERVAL: Duration = Duration::from_millis(250);

/// The watched folders went over the limit together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exceeded {
    /// Each folder and the bytes it held.
    pub usage: Vec<(PathBuf, u64)>,
    pub limit_bytes: u64,
    /// What they held together when the command started, when that was
    /// over the limit already (an open sandbox's earlier call).
    pub over_at_start: Option<u64>,
}

impl Exceeded {
    /// The sentence for the caller, naming the setting that sets the limit.
    pub fn message(&self) -> String {
        let total: u64 = self.usage.iter().map(|(_, bytes)| bytes).sum();
        let parts: Vec<String> = self.usage.iter().map(|(path, bytes)| format!("`{}` {bytes}", path.display())).collect();
        match self.over_at_start {
            None => format!(
                "the job's folders held {total} bytes ({}), over the disk limit of {} bytes (MCP_K8S_WORKDIR_SIZE), and the command was stopped",
                parts.join(", "),
                self.limit_bytes
            ),
            Some(at_start) => format!(
                "the job's folders held {total} bytes ({}), more than the {at_start} bytes they held when the command started, which were over the disk limit of {} bytes (MCP_K8S_WORKDIR_SIZE) already, and the command was stopped; remove files first",
                parts.join(", "),
                self.limit_bytes
            ),
        }
    }
}

/// The bytes a command may leave in the folders: the limit, or what they
/// held when it started when that was more.
pub fn bound(limit_bytes: u64, at_start: u64) -> u64 {
    limit_bytes.max(at_start)
}

/// What `paths` hold together now.
pub fn held(paths: &[PathBuf]) -> u64 {
    let mounts = mount_points();
    paths.iter().map(|path| usage(path, &mounts)).sum()
}

/// A running watcher; `finish` stops it and says whether a limit was hit.
pub struct Watcher {
    done: Arc<AtomicBool>,
    exceeded: Arc<Mutex<Option<Exceeded>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    /// Starts watching `paths`, limited to `limit_bytes` together (or to
    /// `at_start`, what they held when the command started, when that was
    /// more: `bound`); sets `stop` (the flag the command's wait checks)
    /// when they go over.
    pub fn start(paths: Vec<PathBuf>, limit_bytes: u64, at_start: u64, stop: Arc<AtomicBool>) -> Watcher {
        let done = Arc::new(AtomicBool::new(false));
        let exceeded = Arc::new(Mutex::new(None));
        let (thread_done, thread_exceeded) = (done.clone(), exceeded.clone());
        // A failed spawn leaves the kubelet's eviction as the only bound.
        let thread = std::thread::Builder::new()
            .name("disk-watch".into())
            .spawn(move || watch(&paths, (limit_bytes, at_start), &stop, &thread_done, &thread_exceeded))
            .ok();
        Watcher { done, exceeded, thread }
    }

    pub fn finish(mut self) -> Option<Exceeded> {
        self.done.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
        self.exceeded.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
    }
}

fn watch(paths: &[PathBuf], (limit_bytes, at_start): (u64, u64), stop: &AtomicBool, done: &AtomicBool, exceeded: &Mutex<Option<Exceeded>>) {
    let mounts = mount_points();
    while !done.load(Ordering::Relaxed) {
        let started = Instant::now();
        if let Some(mut over) = over_limit(paths, bound(limit_bytes, at_start), &mounts) {
            over.limit_bytes = limit_bytes;
            over.over_at_start = (at_start > limit_bytes).then_some(at_start);
            *exceeded.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(over);
            stop.store(true, Ordering::Relaxed);
            return;
        }
        let pause = MIN_INTERVAL.max(started.elapsed() * 20);
        let until = Instant::now() + pause;
        // `finish` unparks this thread: the command's end is not kept
        // waiting for the pause to run out.
        while !done.load(Ordering::Relaxed) {
            let Some(left) = until.checked_duration_since(Instant::now()).filter(|left| !left.is_zero()) else { break };
            std::thread::park_timeout(left);
        }
    }
}

/// The usage of `paths` when together they hold more than `limit_bytes`.
/// Together, not each: the kubelet's emptyDir limits apply per volume, but
/// its ephemeral-storage limit to the pod, and one number is simpler to
/// state and to plan for.
fn over_limit(paths: &[PathBuf], limit_bytes: u64, mounts: &HashSet<PathBuf>) -> Option<Exceeded> {
    let usage: Vec<(PathBuf, u64)> = paths.iter().map(|path| (path.clone(), self::usage(path, mounts))).collect();
    let total: u64 = usage.iter().map(|(_, bytes)| bytes).sum();
    (total > limit_bytes).then_some(Exceeded { usage, limit_bytes, over_at_start: None })
}

/// Bytes allocated under `root`, like `du`: the blocks of every file and
/// folder, without following links or entering other mounts below it (a
/// workdir under /tmp is its own volume, counted on its own).
pub fn usage(root: &Path, mounts: &HashSet<PathBuf>) -> u64 {
    let mut total = 0u64;
    let mut entries = 0usize;
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(listing) = fs::read_dir(&dir) else { continue };
        for entry in listing.flatten() {
            entries += 1;
            if entries > MAX_ENTRIES {
                return total;
            }
            let Ok(metadata) = entry.path().symlink_metadata() else { continue };
            total += metadata.blocks() * 512;
            let path = entry.path();
            if metadata.is_dir() && !mounts.contains(&path) {
                pending.push(path);
            }
        }
    }
    total
}

/// The mount points of this mount namespace (`/proc/self/mountinfo`, field
/// 5, with its octal escapes); empty when unreadable.
fn mount_points() -> HashSet<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines().filter_map(|line| line.split(' ').nth(4)).map(|field| PathBuf::from(unescape_mountinfo(field))).collect()
}

/// Undoes the kernel's `\ooo` escapes of space, tab, newline and backslash.
fn unescape_mountinfo(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(index) = rest.find('\\') {
        out.push_str(&rest[..index]);
        let code = rest.get(index + 1..index + 4).and_then(|digits| u8::from_str_radix(digits, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[index + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[index + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An earlier call's files over the limit hold a call only to what
    /// they were; under the limit, the limit holds.
    #[test]
    fn a_call_is_held_to_the_limit_or_to_what_the_folders_held_when_it_started() {
        // (limit, at start) → the bound
        let cases = [((100, 0), 100), ((100, 60), 100), ((100, 100), 100), ((100, 150), 150)];
        for ((limit, at_start), want) in cases {
            assert_eq!(bound(limit, at_start), want, "limit {limit}, at start {at_start}");
        }
        let over = Exceeded { usage: vec![(PathBuf::from("/tmp"), 170)], limit_bytes: 100, over_at_start: Some(150) };
        assert!(over.message().contains("more than the 150 bytes they held when the command started"), "{}", over.message());
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/odd\\x"), "/odd\\x");
    }

    #[test]
    fn usage_counts_files_below_and_skips_other_mounts() {
        let root = std::env::temp_dir().join(format!("runner-disk-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("sub")).unwrap();
        fs::create_dir_all(root.join("other-mount")).unwrap();
        fs::write(root.join("sub/a.bin"), vec![1u8; 64 * 1024]).unwrap();
        fs::write(root.join("other-mount/b.bin"), vec![1u8; 256 * 1024]).unwrap();
        let mounts = HashSet::from([root.join("other-mount")]);
        let used = usage(&root, &mounts);
        assert!((64 * 1024..256 * 1024).contains(&used), "{used}");
        let over = over_limit(std::slice::from_ref(&root), 32 * 1024, &mounts).expect("over 32 KiB");
        assert!(over.message().contains("over the disk limit of 32768 bytes (MCP_K8S_WORKDIR_SIZE)"), "{}", over.message());
        assert_eq!(over_limit(std::slice::from_ref(&root), 1 << 30, &mounts), None);
        // Two folders under the limit each are over it together.
        let both = [root.join("sub"), root.join("other-mount")];
        assert!(over_limit(&both, 200 * 1024, &HashSet::new()).is_some());
        fs::remove_dir_all(&root).unwrap();
    }
}
