//! The in-pod runner: the job's entrypoint, started by the kubelet. Runs the
//! caller's argv, captures stdout and stderr apart, enforces the command
//! timeout and writes a framed result to its own stdout. Knows nothing of
//! MCP or of the API server.
//!
//! Subcommands, all hidden from `--help` (the engine writes their
//! arguments into the pod spec; people do not type them; the command lines
//! are `sandbox::args`, the frames `sandbox::frame`):
//! - `runner init --copy-to FILE [--inputs DIR --workdir DIR] [--ready-file
//!   FILE]` in the `prepare` container: copy this binary into the shared
//!   volume, write input files; `runner await-ready` is its postStart hook
//!   when it runs beside the main container (see `init`);
//! - `runner clone ...` in the `clone` init container, and `runner
//!   credential ...`, git's credential helper there (see `clone`);
//! - `runner exec [options] -- ARGV...` as the main container's command;
//! - `runner await-assignment (--port N --key-file FILE | --stdin)
//!   --workdir DIR --max-wait-ms N` as a warm pool sandbox's main command:
//!   wait for one assignment, write its files, then run it as `exec` does
//!   (see `assign`);
//! - `runner probe-pids [--ceiling N]`, run by `doctor` as a job's command,
//!   prints the pod's real process limit (see `probe`);
//! - `runner probe-connect`, run by `doctor` as a job's command, prints
//!   whether the pod could connect to the API server (see `probe`);
//! - `runner probe-reach IP:PORT...`, run by `doctor` as an `open` job's
//!   command, prints which of the addresses it could connect to.

pub mod artifacts;
pub mod assign;
pub mod capture;
pub mod clone;
pub mod disk;
pub mod hold;
pub mod init;
pub mod key;
pub mod prestart;
pub mod probe;
pub mod process;
pub mod session;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::runner::capture::{FrameSink, HeadTail};
use crate::sandbox::args::{self as argv, AssignOptions, Endpoint, ExecOptions, InitOptions};
use crate::sandbox::assignment::Assignment;
use crate::sandbox::frame::{self, Frame, RunResult, Started, Stream};
use crate::sandbox::{self, TERMINATION_LOG};

/// Runs the runner with the arguments after `runner`; returns the process
/// exit code.
pub fn main(args: Vec<OsString>) -> i32 {
    let mut args = args.into_iter();
    let subcommand = args.next().map(|arg| arg.to_string_lossy().into_owned());
    let rest: Vec<OsString> = args.collect();
    let outcome = match subcommand.as_deref() {
        Some("init") => argv::parse_init(rest).and_then(|options| run_init(&options)),
        Some("await-ready") => {
            argv::parse_await(rest).and_then(|options| init::await_ready(&options.ready_file, options.timeout).map(|()| 0))
        }
        Some("exec") => argv::parse_exec(rest).and_then(|options| {
            process::seal_runner()?;
            run_exec(&options)
        }),
        Some("await-assignment") => argv::parse_assign(rest).and_then(|options| {
            process::seal_runner()?;
            match options.session_until_ms {
                Some(until_ms) => session::run_session(&options, until_ms),
                None => run_await_assignment(&options),
            }
        }),
        Some("clone") => argv::parse_clone(rest).and_then(|options| clone::run_clone(&options)),
        Some("credential") => argv::parse_credential(rest).and_then(|options| clone::run_credential(&options)),
        Some("probe-pids") => argv::parse_probe(rest).map(|ceiling| {
            println!("{}", sandbox::probe::probe_line(&probe::probe_pids(ceiling)));
            0
        }),
        Some("probe-connect") if rest.is_empty() => {
            println!("{}", sandbox::probe::connect_line(&probe::probe_connect()));
            Ok(0)
        }
        Some("probe-connect") => Err("runner probe-connect takes no arguments".to_string()),
        Some("probe-reach") => argv::parse_reach(rest).map(|targets| {
            for probe in probe::probe_reach(&targets) {
                println!("{}", sandbox::probe::reach_line(&probe));
            }
            0
        }),
        other => Err(format!(
            "unknown runner subcommand `{}`; expected `init`, `await-ready`, `clone`, `credential`, `exec`, `await-assignment`, `probe-pids`, `probe-connect` or `probe-reach`",
            other.unwrap_or("")
        )),
    };
    match outcome {
        Ok(code) => code,
        Err(message) => {
            eprintln!("mcp-k8s-ephemeral-job runner: {message}");
            write_termination_message(&PathBuf::from(TERMINATION_LOG), &message);
            2
        }
    }
}

/// The inputs first and the runner last: with `--ready-file`, a main
/// container started after a failed hook finds no runner rather than a
/// runner without its inputs.
fn run_init(options: &InitOptions) -> Result<i32, String> {
    let prepared = prepare(options);
    match (&options.ready_file, &prepared) {
        (Some(ready_file), Ok(())) => {
            init::announce_ready(ready_file).map_err(|error| format!("cannot write `{}`: {error}", ready_file.display()))?
        }
        (Some(ready_file), Err(message)) => init::announce_failure(ready_file, message),
        (None, _) => {}
    }
    prepared.map(|()| 0)
}

fn prepare(options: &InitOptions) -> Result<(), String> {
    // First: nothing of the run is in place until the pod is fenced.
    if let Some(bound) = options.await_fence {
        probe::await_fence(probe::fence_bound(bound, options.await_fence_until_ms, now_ms()))?;
    }
    if let Some((inputs, workdir)) = &options.inputs {
        init::write_inputs(inputs, workdir)?;
    }
    if let Some((from, to)) = &options.key {
        key::copy(from, to)?;
    }
    init::copy_self(&options.copy_to).map_err(|error| format!("cannot copy the runner to `{}`: {error}", options.copy_to.display()))
}

/// A warm sandbox's life: the one assignment (on its port, with the key
/// from its Secret, or on stdin), its files written before it is taken,
/// then the command exactly as `runner exec` runs it, frames on stdout.
fn run_await_assignment(options: &AssignOptions) -> Result<i32, String> {
    // Taken (and its file removed) before anything else starts: the
    // process started ahead runs the image's code.
    let key = match &options.listen {
        Endpoint::Port(_) => Some(key::take(options.key_file.as_deref().ok_or("--port needs --key-file")?)?),
        Endpoint::Stdin => None,
    };
    // Started before the wait: what it does ahead is done when the call comes.
    let prestarted = options.preload.as_ref().and_then(|preload| prestart::Prestarted::start(preload, &options.workdir));
    let prepare = |assignment: &Assignment| {
        assignment.files.iter().try_for_each(|file| init::write_input(&options.workdir, &file.path, &file.content, file.mode))
    };
    let taken = match &options.listen {
        Endpoint::Port(port) => {
            let key = key.ok_or("--port needs --key-file")?;
            let listener = assign::listen(*port).map_err(|error| format!("cannot listen on port {port}: {error}"))?;
            assign::await_assignment(listener, &key, &options.workdir, options.max_wait, prepare)
        }
        Endpoint::Stdin => {
            // A descriptor of its own, read unbuffered: what `poll` sees
            // ready is what `read` gets. The command's stdin is /dev/null
            // (`process::spawn`), as in a cold run.
            let stdin = std::io::stdin().as_fd().try_clone_to_owned().map_err(|error| format!("cannot read stdin: {error}"))?;
            assign::await_stdin(std::fs::File::from(stdin), &options.workdir, options.max_wait, prepare)
        }
    };
    let assignment = taken.map_err(|error| error.to_string())?;
    let sink = FrameSink::stdout()?;
    let fitting = options.preload.as_ref().and_then(|preload| preload.fits(&assignment.exec.argv, &assignment.env));
    // One that does not fit is stopped here, before the command starts.
    let told = prestarted.zip(fitting);
    let start = || match told.and_then(|(prestarted, rest)| prestarted.go(rest)) {
        Some(child) => Ok(child),
        None => process::spawn(&assignment.exec.argv, &assignment.exec.workdir, &assignment.env),
    };
    Ok(run_stopped_on_signals(&assignment.exec, &sink, start))
}

/// Runs the command and writes every frame; returns the runner's exit code.
fn run_exec(options: &ExecOptions) -> Result<i32, String> {
    let sink = FrameSink::stdout()?;
    Ok(run_exec_to(options, &sink))
}

/// `run_exec` with the frames going to `sink`, so tests can read them.
pub fn run_exec_to(options: &ExecOptions, sink: &FrameSink) -> i32 {
    run_exec_with(options, &BTreeMap::new(), sink)
}

/// `run_exec_to` with `env` on top of the runner's own environment: a warm
/// sandbox's assignment carries the command's environment, which a cold
/// pod's spec sets on the container.
pub fn run_exec_with(options: &ExecOptions, env: &BTreeMap<String, String>, sink: &FrameSink) -> i32 {
    run_stopped_on_signals(options, sink, || process::spawn(&options.argv, &options.workdir, env))
}

/// `run_exec_from`, stopped by a SIGTERM or SIGINT.
fn run_stopped_on_signals(options: &ExecOptions, sink: &FrameSink, start: impl FnOnce() -> std::io::Result<std::process::Child>) -> i32 {
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop);
    run_exec_from(options, sink, &stop, start)
}

/// Sets `stop` at a SIGTERM or SIGINT.
fn stop_on_signals(stop: &Arc<AtomicBool>) {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // A failure to register leaves the default action (die at once),
        // which loses the result but nothing else: worth a note, not a stop.
        if signal_hook::flag::register(signal, stop.clone()).is_err() {
            eprintln!("mcp-k8s-ephemeral-job runner: cannot handle signal {signal}");
        }
    }
}

/// `run_exec_with` stopped (as by a SIGTERM) when `stop` is set: a
/// session's call, which a cancel stops without ending the session.
pub fn run_exec_until(options: &ExecOptions, env: &BTreeMap<String, String>, sink: &FrameSink, stop: &Arc<AtomicBool>) -> i32 {
    run_exec_from(options, sink, stop, || process::spawn(&options.argv, &options.workdir, env))
}

/// `run_exec_until` with the command's process from `start` (spawned, or
/// a pre-started one told to run).
fn run_exec_from(
    options: &ExecOptions,
    sink: &FrameSink,
    stop: &Arc<AtomicBool>,
    start: impl FnOnce() -> std::io::Result<std::process::Child>,
) -> i32 {
    let stop = stop.clone();
    // Before anything, the Started frame included: a command past its
    // start deadline is never started, and the result says why.
    if let Some(deadline_ms) = options.start_deadline_ms.filter(|deadline_ms| now_ms() > *deadline_ms) {
        let mut result = RunResult::started(now_ms());
        result.start_error = Some(LateStart { deadline_ms }.to_string());
        result.finished_at_ms = result.started_at_ms;
        capture::write_frame(sink, &Frame::Result(result));
        return 125;
    }
    let oom_kills_before = read_oom_kill_count();
    let pids_failures_before = read_pids_fork_failures();
    let before = artifacts::snapshot(&options.workdir);
    let started_at_ms = now_ms();
    capture::write_frame(sink, &Frame::Started(Started { started_at_ms }));

    let mut result = RunResult::started(started_at_ms);
    let held = (options.spill_bytes > 0).then(|| options.hold.as_ref().and_then(|_| open_held(&mut result.notes))).flatten();
    let holding = held.is_some();
    let spill_budget = (options.spill_bytes > 0).then(|| match held {
        Some(file) => capture::SpillBudget::held(options.spill_bytes, sink.same_run_to(Box::new(file))),
        None => capture::SpillBudget::new(options.spill_bytes),
    });
    if before.incomplete {
        result.notes.push(format!(
            "the workdir holds more than {} files; files past that were not considered as artifacts",
            artifacts::MAX_WALKED_FILES
        ));
    }

    // Measured before the command runs: in an open sandbox, an earlier
    // call may have left the folders over the limit (`disk::bound`).
    let watches_disk = options.disk_limit_bytes > 0 && !options.disk_paths.is_empty();
    let disk_at_start = if watches_disk { disk::held(&options.disk_paths) } else { 0 };
    let exit_code = match start() {
        Err(error) => {
            result.start_error = Some(format!("cannot start `{}`: {error}", options.argv[0]));
            // The codes a shell gives for "not found" and "not executable".
            let code = if error.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            result.exit_code = Some(code);
            code
        }
        Ok(mut child) => {
            let outputs = start_pumps(&mut child, options, &spill_budget, sink);
            let watcher = watches_disk
                .then(|| disk::Watcher::start(options.disk_paths.clone(), options.disk_limit_bytes, disk_at_start, stop.clone()));
            let ending = process::wait(&mut child, options.timeout, options.kill_grace, &stop);
            result.disk_limit_exceeded = watcher.and_then(disk::Watcher::finish).map(|exceeded| exceeded.message());
            process::kill_group_leftovers(&child);
            if process::kill_strays() {
                result.notes.push(
                    "processes that left the command's group were still running when it ended; they were stopped with the sandbox".into(),
                );
            }
            // Before anything the runner reads: what the command left in
            // shared memory is still charged to the sandbox's memory.
            let freed = process::empty_shared_memory();
            if freed > 0 {
                result.notes.push(format!(
                    "the command left {freed} bytes in {}; they were removed when it ended, as shared memory counts against the sandbox's memory",
                    process::SHARED_MEMORY_DIR
                ));
            }
            if let Ok(ending) = &ending {
                let (exit_code, signal) = process::code_and_signal(ending.status());
                capture::write_frame(sink, &Frame::Ended(frame::Ended { exit_code, signal }));
            }
            let (stdout, stderr) = finish_pumps(outputs, &mut result.notes);
            send_captured(&mut result, &stdout, &stderr, sink);
            match ending {
                Ok(ending) => {
                    result.timed_out = matches!(ending, process::Ending::TimedOut(_));
                    // The disk watcher stops the command through the same
                    // flag as a SIGTERM; only the latter is a request.
                    result.terminated_by_request =
                        matches!(ending, process::Ending::StopRequested(_)) && result.disk_limit_exceeded.is_none();
                    let (code, signal) = process::code_and_signal(ending.status());
                    result.exit_code = code;
                    result.signal = signal;
                    process::shell_style_code(ending.status())
                }
                Err(error) => {
                    result.notes.push(format!("waiting for the command failed: {error}"));
                    125
                }
            }
        }
    };
    result.finished_at_ms = now_ms();
    result.oom_killed = read_oom_kill_count() > oom_kills_before;
    result.pids_fork_failures = read_pids_fork_failures().saturating_sub(pids_failures_before);

    let after = artifacts::snapshot(&options.workdir);
    let chosen = artifacts::select(&before, &after, &options.artifact_patterns);
    result.notes.extend(artifacts::skipped_note(&before, &after, &options.artifact_patterns));
    let sent = artifacts::send(&options.workdir, &chosen, options.max_artifact_bytes, spill_budget.as_ref(), sink);
    result.artifact_count = sent.count;
    result.artifacts_truncated = sent.truncated;
    result.notes.extend(sent.notes);
    if let (Some(hold), true) = (&options.hold, holding) {
        serve_held(hold, &stop, sink, &mut result.notes);
    }

    let summary = serde_json::json!({
        "v": frame::VERSION, "exit_code": result.exit_code, "signal": result.signal,
        "timed_out": result.timed_out, "oom_killed": result.oom_killed,
        "pids_fork_failures": result.pids_fork_failures,
    });
    capture::write_frame(sink, &Frame::Result(result));
    write_termination_message(&options.termination_log, &summary.to_string());
    exit_code
}

/// The file what is sent whole is held in (`sandbox::held`), made empty;
/// when it cannot be made, what is sent whole goes to the log instead.
fn open_held(notes: &mut Vec<String>) -> Option<std::fs::File> {
    let opened = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(sandbox::held::FILE);
    opened.map_err(|error| notes.push(format!("cannot hold output in `{}` ({error}); it went to the log", sandbox::held::FILE))).ok()
}

/// Says on the log that output is held, and serves it until the server
/// releases the runner (or the wait passes): the result comes after it,
/// so the server has fetched before it judges the run.
fn serve_held(hold: &sandbox::held::HoldOptions, stop: &AtomicBool, sink: &FrameSink, notes: &mut Vec<String>) {
    let bytes = std::fs::metadata(sandbox::held::FILE).map_or(0, |metadata| metadata.len());
    if bytes == 0 {
        return;
    }
    // Stopped (a cancel deletes the pod; an eviction): nothing is served,
    // so nothing is announced. An earlier version said `Held` and then
    // stopped at once, and the server spent some 25 s trying to fetch from
    // a runner that was gone before it wrote down the cancelled run.
    if stop.load(Ordering::SeqCst) {
        return notes
            .push(format!("the runner was stopped, so the {bytes} bytes of output it held in the sandbox for the store were not served"));
    }
    let listener = match assign::listen(hold.port) {
        Ok(listener) => listener,
        Err(error) => return notes.push(format!("cannot serve the held output on port {}: {error}", hold.port)),
    };
    capture::write_frame(sink, &Frame::Held(frame::Held { port: hold.port, bytes }));
    let wait = sandbox::held::WAIT;
    match hold::serve(&listener, &hold.key_sha256, std::path::Path::new(sandbox::held::FILE), wait, stop) {
        Ok(hold::Ended::Released { .. }) | Ok(hold::Ended::Stopped) => {}
        Ok(hold::Ended::WaitedOut { fetches }) => {
            notes.push(format!("the server did not release the output held in the sandbox within {} s ({fetches} fetches)", wait.as_secs()))
        }
        Err(error) => notes.push(format!("serving the held output failed: {error}")),
    }
}

/// The run's start deadline had passed when the runner came to start the
/// command: the server has given up on the run, so the command is not
/// started at all.
struct LateStart {
    deadline_ms: u64,
}

impl std::fmt::Display for LateStart {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "the run's start deadline passed {} ms before the sandbox was ready; the server has given up on the run, so the command was not started",
            now_ms().saturating_sub(self.deadline_ms)
        )
    }
}

/// A stream reader and what it has read so far: shared, so that a stream a
/// stray process still holds open gives up what was read before it.
/// With the bytes it sent whole for the output store.
type Pump = (std::thread::JoinHandle<()>, Arc<Mutex<HeadTail>>, Arc<AtomicU64>);

fn start_pumps(
    child: &mut std::process::Child,
    options: &ExecOptions,
    budget: &Option<capture::SpillBudget>,
    sink: &FrameSink,
) -> (Option<Pump>, Option<Pump>) {
    let cap = options.max_output_bytes;
    let start = |pipe: Box<dyn std::io::Read + Send>, stream: Stream| -> Pump {
        let kept = Arc::new(Mutex::new(HeadTail::new(cap)));
        let spilled = Arc::new(AtomicU64::new(0));
        let spill = budget.clone().map(|budget| capture::StreamSpill { budget, sent: spilled.clone() });
        let (sink, shared) = (sink.clone(), kept.clone());
        (std::thread::spawn(move || capture::pump(pipe, stream, &shared, cap, spill.as_ref(), &sink)), kept, spilled)
    };
    let stdout = child.stdout.take().map(|pipe| start(Box::new(pipe), Stream::Stdout));
    let stderr = child.stderr.take().map(|pipe| start(Box::new(pipe), Stream::Stderr));
    (stdout, stderr)
}

/// How long a stream may stay open after the command and its group ended.
const STREAM_DRAIN: Duration = Duration::from_secs(5);

/// One stream's final capture, and whether it was cut: still held open
/// `STREAM_DRAIN` after the command ended, so what came later is missing.
struct Drained {
    kept: HeadTail,
    cut: bool,
    /// Bytes sent whole for the output store.
    spilled: u64,
}

/// Joins the stream readers. Their pipes close once every process that
/// holds them is gone: `kill_group_leftovers` ends the command's group and
/// `kill_strays` the processes that left it. Where neither reaches a holder
/// (a runner that is not its namespace's first process), the join is
/// bounded; such a stream keeps what was read and is reported as cut.
fn finish_pumps(pumps: (Option<Pump>, Option<Pump>), notes: &mut Vec<String>) -> (Drained, Drained) {
    let deadline = std::time::Instant::now() + STREAM_DRAIN;
    let mut join = |pump: Option<Pump>, name: &str| -> Drained {
        let Some((handle, kept, spilled)) = pump else { return Drained { kept: HeadTail::new(0), cut: false, spilled: 0 } };
        let mut backoff = process::Backoff::new(Duration::from_millis(10));
        while !handle.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(backoff.pause());
        }
        let cut = !handle.is_finished();
        if cut {
            notes.push(format!(
                "{name} was still held open {} s after the command ended, by a process that left its group; the output read until then is kept, anything later is missing",
                STREAM_DRAIN.as_secs()
            ));
        } else {
            let _ = handle.join();
        }
        let kept = std::mem::replace(&mut *kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner()), HeadTail::new(0));
        Drained { kept, cut, spilled: spilled.load(std::sync::atomic::Ordering::SeqCst) }
    };
    let stdout = join(pumps.0, "stdout");
    let stderr = join(pumps.1, "stderr");
    (stdout, stderr)
}

/// Writes the final capture of both streams as `Captured` chunks and
/// records their sizes and totals in the result.
fn send_captured(result: &mut RunResult, stdout: &Drained, stderr: &Drained, sink: &FrameSink) {
    for (stream, drained) in [(Stream::Stdout, stdout), (Stream::Stderr, stderr)] {
        let contents = drained.kept.contents();
        for chunk in contents.chunks(frame::CHUNK_BYTES) {
            capture::write_frame(sink, &Frame::Captured(frame::Output { stream, data_b64: frame::to_base64(chunk) }));
        }
        match stream {
            Stream::Stdout => result.stdout_captured_bytes = contents.len() as u64,
            Stream::Stderr => result.stderr_captured_bytes = contents.len() as u64,
        }
    }
    result.stdout_total_bytes = stdout.kept.total_bytes();
    result.stderr_total_bytes = stderr.kept.total_bytes();
    result.stdout_spilled_bytes = stdout.spilled;
    result.stderr_spilled_bytes = stderr.spilled;
    result.stdout_truncated = stdout.kept.truncated() || stdout.cut;
    result.stderr_truncated = stderr.kept.truncated() || stderr.cut;
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// How many times the OOM killer fired in this container's memory cgroup
/// (cgroup v2 `memory.events`, or v1 `memory.oom_control`); 0 when neither
/// file can be read, which only means OOM is not detected here.
fn read_oom_kill_count() -> u64 {
    for path in ["/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"] {
        if let Ok(text) = std::fs::read_to_string(path) {
            for line in text.lines() {
                if let Some(count) = line.strip_prefix("oom_kill ") {
                    return count.trim().parse().unwrap_or(0);
                }
            }
        }
    }
    0
}

/// Where the pids controller counts refused forks for this container: the
/// cgroup v2 file (and its `.local` twin, which on v2 is the one that counts
/// a limit hit higher up, at the pod), then cgroup v1's.
const PIDS_EVENTS_FILES: &[&str] = &["/sys/fs/cgroup/pids.events", "/sys/fs/cgroup/pids.events.local", "/sys/fs/cgroup/pids/pids.events"];

/// How many process creations the pids controller refused in this
/// container's cgroup so far; 0 when no file can be read, which only means
/// pid exhaustion is not detected here.
fn read_pids_fork_failures() -> u64 {
    PIDS_EVENTS_FILES.iter().filter_map(|path| std::fs::read_to_string(path).ok()).map(|text| pids_events_max(&text)).max().unwrap_or(0)
}

/// The counter of a `pids.events` file: `max N` (cgroup v1 and v2), or
/// `fork_fail N` where a kernel reports that apart; the larger wins.
fn pids_events_max(text: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.strip_prefix("max ").or_else(|| line.strip_prefix("fork_fail ")))
        .filter_map(|count| count.trim().parse().ok())
        .max()
        .unwrap_or(0)
}

/// The kubelet keeps up to 4096 bytes of this file in the container status,
/// so the exit code survives even if the log is lost.
fn write_termination_message(path: &PathBuf, message: &str) {
    let message = &message.as_bytes()[..message.len().min(4000)];
    if let Ok(mut file) = std::fs::OpenOptions::new().write(true).truncate(true).open(path) {
        let _ = file.write_all(message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_events_counts_refused_forks() {
        let cases = [("max 0\n", 0), ("max 17\n", 17), ("max 3\nfork_fail 9\n", 9), ("", 0), ("max x\n", 0)];
        for (text, expected) in cases {
            assert_eq!(pids_events_max(text), expected, "{text:?}");
        }
    }
}
