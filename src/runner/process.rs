//! Starting the caller's argv in its own process group and stopping it:
//! the timeout on the command itself, SIGTERM then SIGKILL to the whole
//! group, and the exit code or signal exactly as the kernel reported it.

#![allow(unsafe_code)] // process groups, signals and prctl: the runner's control of the caller's command has no std API.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How the wait for the command ended.
#[derive(Debug, PartialEq)]
pub enum Ending {
    /// The command exited (or was killed by a signal nobody here sent).
    Exited(ExitStatus),
    /// `timeout` passed; the group was stopped.
    TimedOut(ExitStatus),
    /// The runner was asked to stop (SIGTERM/SIGINT); the group was stopped.
    StopRequested(ExitStatus),
}

impl Ending {
    pub fn status(&self) -> ExitStatus {
        match self {
            Ending::Exited(status) | Ending::TimedOut(status) | Ending::StopRequested(status) => *status,
        }
    }
}

/// Starts `argv` in `workdir` as the leader of a new process group, with
/// stdin closed and stdout/stderr piped, and `env` on top of the runner's
/// own environment (empty for a cold run, whose pod spec sets it; a warm
/// sandbox's assignment carries it).
pub fn spawn(argv: &[String], workdir: &Path, env: &BTreeMap<String, String>) -> io::Result<Child> {
    command(argv, workdir, env)?.stdin(Stdio::null()).spawn()
}

/// `spawn` with stdin a pipe the runner writes: a pre-started process
/// (`runner::prestart`) reads what to run on it.
pub fn spawn_reading(argv: &[String], workdir: &Path, env: &BTreeMap<String, String>) -> io::Result<Child> {
    command(argv, workdir, env)?.stdin(Stdio::piped()).spawn()
}

fn command(argv: &[String], workdir: &Path, env: &BTreeMap<String, String>) -> io::Result<Command> {
    let (program, args) = argv.split_first().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    let mut command = Command::new(program);
    command.args(args).envs(env).current_dir(workdir).process_group(0).stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe calls are allowed: `first_to_go_for_memory`
    // makes only open(2), write(2) and close(2) on a constant path and
    // buffer, and allocates nothing.
    unsafe {
        command.pre_exec(|| {
            first_to_go_for_memory();
            Ok(())
        });
    }
    Ok(command)
}

/// `oom_score_adj`'s highest value, which the command's processes get.
const COMMAND_OOM_SCORE_ADJ: &[u8] = b"1000";

/// Makes the calling process (the command's, before exec; its children
/// inherit it) the kernel's first choice when the sandbox runs out of
/// memory, before the runner, which shares the sandbox's memory with it:
/// a runner killed for the command's memory would take the call's result
/// with it, and in an open sandbox the whole sandbox. Raising the value
/// needs no privilege. A failure (no /proc) leaves the value inherited,
/// as before.
fn first_to_go_for_memory() {
    // SAFETY: open(2), write(2) and close(2) on a NUL-terminated constant
    // path and a constant buffer; the descriptor is closed before return.
    unsafe {
        let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, COMMAND_OOM_SCORE_ADJ.as_ptr().cast(), COMMAND_OOM_SCORE_ADJ.len());
            libc::close(fd);
        }
    }
}

/// Waits for `child`, stopping its group when `timeout` passes or `stop`
/// becomes true. `kill_grace` is how long SIGTERM is given before SIGKILL.
pub fn wait(child: &mut Child, timeout: Duration, kill_grace: Duration, stop: &Arc<AtomicBool>) -> io::Result<Ending> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Backoff::new(Duration::from_millis(20));
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Ending::Exited(status));
        }
        if Instant::now() >= deadline {
            return Ok(Ending::TimedOut(stop_group(child, kill_grace)?));
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(Ending::StopRequested(stop_group(child, kill_grace)?));
        }
        std::thread::sleep(backoff.pause());
    }
}

/// Pauses between looks at something that is often over at once (a short
/// command's end, its output pipes closing): 1 ms, doubling up to `most`.
/// A fixed 20 ms pause made a `true` take 20 ms.
pub struct Backoff {
    next: Duration,
    most: Duration,
}

impl Backoff {
    pub fn new(most: Duration) -> Backoff {
        Backoff { next: Duration::from_millis(1).min(most), most }
    }

    pub fn pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (pause * 2).min(self.most);
        pause
    }
}

/// Sends SIGKILL to every process left in the group. Called after the
/// leader ended, so that a background process it started cannot keep
/// running (or keep the output pipes open) after the result is written.
pub fn kill_group_leftovers(child: &Child) {
    signal_group(child, libc::SIGKILL);
}

/// Sends SIGKILL to every other process in the runner's PID namespace when
/// the runner is its first process (as in a pod's main container or a
/// Docker container): a process that left the command's group (`setsid
/// daemon &`) would otherwise outlive the command and hold its output
/// pipes open. Returns whether any such process was found. Elsewhere (the
/// runner's own tests) it does nothing: `kill(-1)` would reach every
/// process of the user.
pub fn kill_strays() -> bool {
    if std::process::id() != 1 {
        return false;
    }
    // SAFETY: kill(2) with pid -1 signals every process the caller may
    // signal except itself and touches no memory; ESRCH means none is left.
    unsafe { libc::kill(-1, libc::SIGKILL) == 0 }
}

/// Where POSIX shared memory lives: a tmpfs, whose pages are charged to
/// the sandbox's memory for as long as the files stay, whoever wrote them.
pub const SHARED_MEMORY_DIR: &str = "/dev/shm";

/// Removes what the command's processes left in `/dev/shm` once they are
/// all gone (after `kill_strays`), when the runner is its namespace's
/// first process (in a sandbox; never in the runner's own tests, where
/// that folder is the machine's): shared memory is for processes to talk
/// through, and they end with the call. Left there, it would stay charged
/// to the sandbox's memory, so that the runner collecting the call's
/// files and every later call in an open sandbox would run out of memory
/// the command already used up. Returns the bytes it freed.
pub fn empty_shared_memory() -> u64 {
    if std::process::id() != 1 {
        return 0;
    }
    empty_folder(Path::new(SHARED_MEMORY_DIR))
}

/// Removes everything inside `folder` (not the folder): the bytes its
/// files held.
fn empty_folder(folder: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(entries) = std::fs::read_dir(folder) else { return 0 };
    let mut freed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(metadata) = path.symlink_metadata() else { continue };
        if metadata.is_dir() {
            freed += empty_folder(&path);
            let _ = std::fs::remove_dir(&path);
        } else if std::fs::remove_file(&path).is_ok() {
            freed += metadata.blocks() * 512;
        }
    }
    freed
}

/// Puts the runner out of the command's reach. The command runs as the
/// same user, so without this it could open `/proc/1/fd/1` (the runner's
/// stdout: the log the server reads its result from), read the runner's
/// memory or trace it. A process that is not dumpable has its `/proc`
/// entries owned by root and refuses ptrace to others of its user, and the
/// command, a new program, does not inherit the setting. Every descriptor
/// the runner was started with past stderr is also marked close-on-exec,
/// so the command inherits none of them (its stdin is /dev/null and its
/// stdout and stderr are pipes to the runner, `spawn`).
pub fn seal_runner() -> Result<(), String> {
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) changes a flag of this process and
    // touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(format!("cannot make the runner non-dumpable: {}", io::Error::last_os_error()));
    }
    let descriptors = std::fs::read_dir("/proc/self/fd").map_err(|error| format!("cannot list the runner's descriptors: {error}"))?;
    let numbers: Vec<libc::c_int> =
        descriptors.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok()).filter(|fd| *fd > 2).collect();
    for fd in numbers {
        // SAFETY: fcntl(2) on a descriptor number changes its flags only; a
        // number that is no longer open (the listing's own) fails with EBADF.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// The exit code and signal of a finished command.
pub fn code_and_signal(status: ExitStatus) -> (Option<i32>, Option<i32>) {
    (status.code(), status.signal())
}

/// The runner's own exit code: the command's, or 128 + signal as shells do.
pub fn shell_style_code(status: ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn stop_group(child: &mut Child, kill_grace: Duration) -> io::Result<ExitStatus> {
    signal_group(child, libc::SIGTERM);
    let grace_deadline = Instant::now() + kill_grace;
    while Instant::now() < grace_deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal_group(child, libc::SIGKILL);
    child.wait()
}

fn signal_group(child: &Child, signal: libc::c_int) {
    let Ok(group) = libc::pid_t::try_from(child.id()) else { return };
    // SAFETY: kill(2) with a negative pid signals the process group whose id
    // is the child's pid (it is the group leader, see `spawn`); it touches no
    // memory. ESRCH (group already gone) is the expected, harmless failure.
    unsafe {
        libc::kill(-group, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_between_looks_starts_at_a_millisecond_and_doubles_up_to_its_most() {
        let mut backoff = Backoff::new(Duration::from_millis(20));
        let pauses: Vec<u64> = (0..7).map(|_| backoff.pause().as_millis() as u64).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 20, 20]);
    }

    fn run(argv: &[&str], timeout_ms: u64) -> Ending {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let mut child = spawn(&argv, Path::new("/"), &BTreeMap::new()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        wait(&mut child, Duration::from_millis(timeout_ms), Duration::from_millis(200), &stop).unwrap()
    }

    #[test]
    fn exit_codes_and_signals_are_reported_exactly() {
        let cases: &[(&[&str], Option<i32>, Option<i32>)] = &[
            (&["true"], Some(0), None),
            (&["sh", "-c", "exit 3"], Some(3), None),
            (&["sh", "-c", "kill -USR1 $$"], None, Some(libc::SIGUSR1)),
        ];
        for (argv, code, signal) in cases {
            let ending = run(argv, 10_000);
            assert!(matches!(ending, Ending::Exited(_)), "{argv:?}: {ending:?}");
            assert_eq!(code_and_signal(ending.status()), (*code, *signal), "{argv:?}");
        }
    }

    #[test]
    fn timeout_stops_the_whole_group_even_when_sigterm_is_ignored() {
        let started = Instant::now();
        let ending = run(&["sh", "-c", "trap '' TERM; sleep 30 & wait"], 300);
        assert!(matches!(ending, Ending::TimedOut(_)), "{ending:?}");
        assert!(started.elapsed() < Duration::from_secs(20), "the group was not killed");
    }

    /// The command's processes, and what they start, are the first the
    /// kernel kills for memory; the runner keeps its own value.
    #[test]
    fn the_command_is_the_first_to_go_for_memory() {
        let argv = ["sh", "-c", "cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'"].map(String::from);
        let output = command(&argv, Path::new("/"), &BTreeMap::new()).unwrap().stdin(Stdio::null()).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&output.stdout), "1000\n1000\n");
        let own = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap();
        assert_ne!(own.trim(), "1000", "the runner's own value is left alone");
    }

    #[test]
    fn emptying_a_folder_removes_all_inside_and_counts_the_bytes() {
        let root = std::env::temp_dir().join(format!("runner-shm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("sem/inner")).unwrap();
        std::fs::write(root.join("segment"), vec![1u8; 64 << 10]).unwrap();
        std::fs::write(root.join("sem/inner/x"), [2u8; 10]).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("link")).unwrap();
        assert!(empty_folder(&root) >= 64 << 10);
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0, "everything inside is gone");
        assert!(Path::new("/etc/hostname").exists(), "a link is removed, not followed");
        std::fs::remove_dir(&root).unwrap();
        assert_eq!(empty_shared_memory(), 0, "outside a sandbox the machine's /dev/shm is left alone");
    }

    #[test]
    fn missing_program_is_a_spawn_error() {
        let error = spawn(&["/definitely/not/here".to_string()], Path::new("/"), &BTreeMap::new()).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
    }
}
