//! The in-pod runner as a specification: each case runs a real command
//! through `runner::run_exec_to` on this machine and checks the frames it
//! writes, the same frames the engine later reads from the container log;
//! the last cases run a warm pool sandbox's `runner await-assignment`.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use mcp_k8s_ephemeral_job::runner;
use mcp_k8s_ephemeral_job::sandbox::args::{AssignOptions, Endpoint, ExecOptions, Preload, assign_args, exec_args, parse_exec};
use mcp_k8s_ephemeral_job::sandbox::assignment::{self, AssignedFile, Assignment, Key};
use mcp_k8s_ephemeral_job::sandbox::frame::{self, ArtifactHeader, Frame, RunResult, Stream};

struct Run {
    exit_code: i32,
    frames: Vec<Frame>,
    workdir: PathBuf,
}

impl Run {
    fn result(&self) -> &RunResult {
        match self.frames.last() {
            Some(Frame::Result(result)) => result,
            other => panic!("the last frame is not the result: {other:?}"),
        }
    }
    fn stdout(&self) -> Vec<u8> {
        self.captured(Stream::Stdout)
    }
    fn stderr(&self) -> Vec<u8> {
        self.captured(Stream::Stderr)
    }
    /// The final capture of a stream, reassembled from `Captured` chunks.
    fn captured(&self, stream: Stream) -> Vec<u8> {
        let mut bytes = Vec::new();
        for frame in &self.frames {
            if let Frame::Captured(output) = frame
                && output.stream == stream
            {
                bytes.extend(frame::from_base64(&output.data_b64).unwrap());
            }
        }
        let expected = match stream {
            Stream::Stdout => self.result().stdout_captured_bytes,
            Stream::Stderr => self.result().stderr_captured_bytes,
        };
        assert_eq!(bytes.len() as u64, expected, "the result counts the captured bytes");
        bytes
    }
    fn live(&self, stream: Stream) -> Vec<u8> {
        let mut bytes = Vec::new();
        for frame in &self.frames {
            if let Frame::Output(output) = frame
                && output.stream == stream
            {
                bytes.extend(frame::from_base64(&output.data_b64).unwrap());
            }
        }
        bytes
    }
    fn artifacts(&self) -> Vec<(ArtifactHeader, Vec<u8>)> {
        let mut artifacts: Vec<(ArtifactHeader, Vec<u8>)> = Vec::new();
        for frame in &self.frames {
            match frame {
                Frame::Artifact(header) => artifacts.push((header.clone(), Vec::new())),
                Frame::ArtifactChunk(chunk) => artifacts.last_mut().unwrap().1.extend(frame::from_base64(&chunk.data_b64).unwrap()),
                _ => {}
            }
        }
        artifacts
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.workdir);
    }
}

fn options(name: &str, argv: &[&str]) -> ExecOptions {
    let workdir = std::env::temp_dir().join(format!("runner-spec-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&workdir);
    fs::create_dir_all(&workdir).unwrap();
    ExecOptions {
        workdir: workdir.clone(),
        timeout: Duration::from_secs(30),
        kill_grace: Duration::from_millis(500),
        max_output_bytes: 1 << 20,
        max_artifact_bytes: 1 << 20,
        spill_bytes: 0,
        hold: None,
        artifact_patterns: Vec::new(),
        disk_paths: Vec::new(),
        disk_limit_bytes: 0,
        termination_log: workdir.join(".termination-log-unused"),
        start_deadline_ms: None,
        argv: argv.iter().map(|s| s.to_string()).collect(),
    }
}

/// The frames of one run's stdout: nothing but frames, all with one tag.
fn frames_of(text: &str) -> Vec<Frame> {
    let decoded: Vec<_> = text.lines().map(|line| frame::decode(line).expect("a valid frame").expect("only frames on stdout")).collect();
    assert!(decoded.windows(2).all(|pair| pair[0].0 == pair[1].0), "one tag for the whole run");
    decoded.into_iter().map(|(_, frame)| frame).collect()
}

fn run(options: &ExecOptions) -> Run {
    let (sink, buffer) = mcp_k8s_ephemeral_job::runner::capture::memory_sink();
    let exit_code = runner::run_exec_to(options, &sink);
    let text = String::from_utf8(buffer.lock().unwrap().clone()).expect("frames are UTF-8");
    let frames = frames_of(&text);
    // The termination log is not an artifact candidate of interest here.
    let _ = fs::remove_file(options.workdir.join(".termination-log-unused"));
    Run { exit_code, frames, workdir: options.workdir.clone() }
}

#[test]
fn stdout_and_stderr_come_back_apart_with_the_exit_code() {
    let run = run(&options("streams", &["sh", "-c", "echo out; echo err >&2; exit 7"]));
    assert!(matches!(run.frames.first(), Some(Frame::Started(_))));
    assert_eq!(run.stdout(), b"out\n");
    assert_eq!(run.stderr(), b"err\n");
    assert_eq!(run.live(Stream::Stdout), b"out\n");
    assert_eq!(run.live(Stream::Stderr), b"err\n");
    assert_eq!(run.result().exit_code, Some(7));
    assert_eq!(run.exit_code, 7);
    assert!(!run.result().timed_out);
}

#[test]
fn binary_output_is_kept_byte_for_byte() {
    let run = run(&options("binary", &["sh", "-c", "printf '\\000\\377\\001'"]));
    assert_eq!(run.stdout(), [0u8, 255, 1]);
}

#[test]
fn output_over_the_cap_keeps_head_and_tail_and_says_so() {
    let mut opts = options("cap", &["sh", "-c", "i=0; while [ $i -lt 2000 ]; do echo line$i; i=$((i+1)); done"]);
    opts.max_output_bytes = 100;
    let run = run(&opts);
    let stdout = String::from_utf8(run.stdout()).unwrap();
    assert!(run.result().stdout_truncated);
    assert!(stdout.starts_with("line0\nline1\n"), "{stdout}");
    assert!(stdout.ends_with("line1999\n"), "{stdout}");
    assert!(stdout.contains("bytes omitted]"), "{stdout}");
    assert!(run.result().stdout_total_bytes > 10_000);
    assert_eq!(run.live(Stream::Stdout).len(), 100, "live output stops at the cap");
}

#[test]
fn timeout_stops_the_command_and_keeps_partial_output() {
    let mut opts = options("timeout", &["sh", "-c", "echo before; sleep 30; echo after"]);
    opts.timeout = Duration::from_millis(500);
    let run = run(&opts);
    assert!(run.result().timed_out);
    assert_eq!(run.stdout(), b"before\n");
    assert_eq!(run.result().exit_code, None);
    assert_eq!(run.result().signal, Some(libc::SIGTERM));
}

#[test]
fn a_command_that_cannot_start_says_why() {
    let run = run(&options("missing", &["/no/such/program", "arg"]));
    let message = run.result().start_error.clone().expect("start error");
    assert!(message.contains("/no/such/program"), "{message}");
    assert_eq!(run.exit_code, 127);
}

#[test]
fn a_background_process_does_not_outlive_the_command() {
    let run = run(&options("leftover", &["sh", "-c", "sleep 60 & echo started"]));
    assert_eq!(run.stdout(), b"started\n");
    assert!(run.result().notes.is_empty(), "{:?}", run.result().notes);
}

#[test]
fn new_and_changed_files_come_back_as_artifacts_inputs_do_not() {
    let opts = options("artifacts", &["sh", "-c", "mkdir -p out && printf abc > out/result.txt && echo more >> changed.txt"]);
    fs::write(opts.workdir.join("input.txt"), "untouched").unwrap();
    fs::write(opts.workdir.join("changed.txt"), "first\n").unwrap();
    let run = run(&opts);
    let artifacts = run.artifacts();
    let paths: Vec<&str> = artifacts.iter().map(|(header, _)| header.path.as_str()).collect();
    assert_eq!(paths, ["changed.txt", "out/result.txt"]);
    let (header, content) = &artifacts[1];
    assert_eq!(content, b"abc");
    assert_eq!(header.size, 3);
    assert_eq!(header.sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_eq!(run.result().artifact_count, 2);
    assert!(!run.result().artifacts_truncated);
}

#[test]
fn artifact_patterns_select_files_and_the_cap_leaves_content_out() {
    let mut opts = options("patterns", &["sh", "-c", "printf 1234567890 > big.log; printf xy > small.log; printf z > other.txt"]);
    opts.artifact_patterns = vec!["*.log".into()];
    opts.max_artifact_bytes = 5;
    let run = run(&opts);
    let artifacts = run.artifacts();
    let summary: Vec<(&str, bool, usize)> = artifacts.iter().map(|(h, c)| (h.path.as_str(), h.content_included, c.len())).collect();
    assert_eq!(summary, [("big.log", false, 0), ("small.log", true, 2)]);
    assert_eq!(artifacts[0].0.size, 10);
    assert!(run.result().artifacts_truncated);
}

/// With an output store, a stream past the cap and a file past the artifact
/// cap are also sent whole, byte-exact, and the result says how much of
/// each stream was; a file that does not fit in what is left of the
/// store's share is listed without content, as without a store.
#[test]
fn with_an_output_store_streams_and_files_past_the_caps_are_sent_whole() {
    let script = "head -c 300000 /dev/urandom > noise.bin; cat noise.bin; printf err >&2; head -c 5000 /dev/zero > big.bin; head -c 200 /dev/zero > huge.log";
    let mut opts = options("spill", &["sh", "-c", script]);
    opts.max_output_bytes = 1000;
    opts.max_artifact_bytes = 100;
    opts.artifact_patterns = vec!["*.bin".into(), "*.log".into()];
    opts.spill_bytes = 300_000 + 5000 + 5;
    let run = run(&opts);
    let noise = fs::read(run.workdir.join("noise.bin")).unwrap();
    let mut spilled = Vec::new();
    for frame in &run.frames {
        if let Frame::Spill(chunk) = frame {
            assert_eq!(chunk.stream, Stream::Stdout, "stderr stayed under the cap");
            assert_eq!(chunk.offset, spilled.len() as u64);
            spilled.extend(frame::from_base64(&chunk.data_b64).unwrap());
        }
    }
    assert!(spilled == noise, "the stream came back whole and byte-exact ({} of {} bytes)", spilled.len(), noise.len());
    assert_eq!(run.result().stdout_spilled_bytes, noise.len() as u64);
    assert_eq!(run.result().stderr_spilled_bytes, 0);
    let files: Vec<(String, bool, bool, usize)> = run
        .artifacts()
        .into_iter()
        .map(|(header, content)| (header.path, header.content_included, header.spilled, content.len()))
        .collect();
    assert_eq!(
        files,
        [("big.bin".to_string(), false, true, 5000), ("huge.log".to_string(), false, false, 0), ("noise.bin".to_string(), false, false, 0),]
    );
    let notes = &run.result().notes;
    assert!(notes.iter().any(|note| note.contains("MCP_K8S_OUTPUTS_MAX_RUN_BYTES")), "{notes:?}");
}

/// An artifact over the cap came back without
/// content and with empty `notes`.
#[test]
fn an_artifact_over_the_cap_is_named_in_a_note_with_the_cap() {
    let mut opts = options("over-cap-note", &["sh", "-c", "printf 1234567890 > big.log; printf xy > small.log"]);
    opts.max_artifact_bytes = 5;
    let run = run(&opts);
    let notes = &run.result().notes;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].starts_with("`big.log` (10 bytes) was listed without content"), "{notes:?}");
    assert!(notes[0].contains("the artifact cap is 5 bytes") && notes[0].contains("MCP_K8S_MAX_ARTIFACT_BYTES"), "{notes:?}");
}

/// The kubelet's eviction comes about a minute after
/// a folder outgrows its limit; the runner's own watcher stops the command
/// within a fraction of a second and says how much each folder held.
#[test]
fn writing_past_the_disk_limit_stops_the_command_and_says_where() {
    let script = "i=0; while [ $i -lt 200 ]; do head -c 65536 /dev/zero > fill-$i; i=$((i+1)); sleep 0.02; done; echo all-written";
    let mut opts = options("disk-limit", &["sh", "-c", script]);
    opts.disk_paths = vec![opts.workdir.clone()];
    opts.disk_limit_bytes = 1 << 20;
    opts.artifact_patterns = vec!["none".into()];
    let run = run(&opts);
    let result = run.result();
    let message = result.disk_limit_exceeded.as_deref().expect("the disk limit was noticed");
    assert!(message.contains("over the disk limit of 1048576 bytes (MCP_K8S_WORKDIR_SIZE)"), "{message}");
    assert!(!result.terminated_by_request, "nobody asked for the stop");
    assert!(!String::from_utf8_lossy(&run.stdout()).contains("all-written"), "the command was not stopped");
    let written = fs::read_dir(&run.workdir).unwrap().count();
    assert!(written < 100, "{written} files of 64 KiB written past a 1 MiB limit");
}

#[test]
fn a_run_without_refused_forks_reports_none() {
    let run = run(&options("no-pids-failures", &["true"]));
    assert_eq!(run.result().pids_fork_failures, 0);
}

#[test]
fn exec_args_round_trip_through_the_runner_parser() {
    let mut opts = options("args", &["python3", "-c", "print('$(HOME)')", "--", "-x"]);
    opts.artifact_patterns = vec!["out/".into()];
    opts.disk_paths = vec!["/work".into(), "/tmp".into()];
    opts.disk_limit_bytes = 1 << 30;
    let args = exec_args(&opts);
    assert_eq!(&args[..2], ["runner", "exec"]);
    let parsed = parse_exec(args[2..].iter().map(std::ffi::OsString::from).collect()).unwrap();
    assert_eq!(parsed, opts);
    fs::remove_dir_all(&opts.workdir).unwrap();
}

#[test]
fn sigterm_to_the_runner_stops_the_command_and_still_reports() {
    let workdir = std::env::temp_dir().join(format!("runner-spec-{}-sigterm", std::process::id()));
    fs::create_dir_all(&workdir).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-k8s-ephemeral-job"))
        .args(["runner", "exec", "--workdir"])
        .arg(&workdir)
        .args(["--termination-log", "/dev/null", "--", "sh", "-c", "echo started; sleep 30"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    // Wait until the command has printed, so the signal lands mid-run.
    loop {
        let mut line = String::new();
        assert!(std::io::BufRead::read_line(&mut stdout, &mut line).unwrap() > 0, "runner ended early");
        let is_output = matches!(frame::decode(&line), Ok(Some((_, Frame::Output(_)))));
        lines.push(line);
        if is_output {
            break;
        }
    }
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    child.wait().unwrap();
    let frames: Vec<Frame> = rest.lines().filter_map(|line| Some(frame::decode(line).ok()??.1)).collect();
    let result = frames
        .iter()
        .find_map(|frame| match frame {
            Frame::Result(result) => Some(result),
            _ => None,
        })
        .expect("a result frame after SIGTERM");
    assert!(result.terminated_by_request);
    let captured: Vec<u8> = frames
        .iter()
        .filter_map(|frame| match frame {
            Frame::Captured(output) if output.stream == Stream::Stdout => Some(frame::from_base64(&output.data_b64).unwrap()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(captured, b"started\n");
    fs::remove_dir_all(&workdir).unwrap();
}

// ---------------------------------------------------------------------------
// A warm pool sandbox's runner, the built binary end to end:
// `runner await-assignment` refuses a wrong key and keeps waiting, takes the
// first valid assignment over a real socket, writes its input files, runs
// its argv with its environment exactly as `runner exec` does (the same
// frames on stdout), and accepts nothing after it. The reader's every
// refusal is a unit test in `runner::assign`.

/// A run for a warm runner whose workdir is `options`' (the one it serves).
fn assignment_for(options: &ExecOptions) -> Assignment {
    Assignment {
        run_id: "warm-1".into(),
        exec: options.clone(),
        env: [("GREETING".to_string(), "hello from the assignment".to_string())].into(),
        files: vec![AssignedFile { path: "data/in.txt".into(), mode: 0o640, content: b"input\n".to_vec() }],
        tag: None,
    }
}

/// POSTs `body` to the runner at `port` and returns the status code,
/// retrying the connection while the runner is still starting.
fn post(port: u16, body: &[u8]) -> u16 {
    post_to(port, assignment::PATH, body).0
}

/// `runner await-assignment` on `port` with the key in `key_file` (with
/// `session_until_ms`: an open sandbox's runner), waiting up to a minute.
fn port_runner(port: u16, key_file: &std::path::Path, workdir: &std::path::Path, session_until_ms: Option<u64>) -> std::process::Child {
    let assign = AssignOptions {
        listen: Endpoint::Port(port),
        key_file: Some(key_file.to_path_buf()),
        workdir: workdir.to_path_buf(),
        max_wait: Duration::from_secs(60),
        session_until_ms,
        preload: None,
    };
    let path = std::env::var("PATH").unwrap_or_default();
    crate::support::server::command(&[("PATH", &path)])
        .args(assign_args(&assign))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_warm_runner_takes_one_assignment_and_runs_it_like_exec() {
    let exec = options("warm", &["sh", "-c", "cat data/in.txt; echo \"$GREETING\"; echo made > out.txt; exit 3"]);
    let workdir = exec.workdir.clone();
    let key = Key::random().unwrap();
    let key_file = std::env::temp_dir().join(format!("runner-spec-{}-warm-key", std::process::id()));
    fs::write(&key_file, format!("{}\n", key.to_hex())).unwrap();
    // An ephemeral port, free a moment ago: the runner binds a fixed one.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut runner = port_runner(port, &key_file, &workdir, None);

    let stranger = Key::random().unwrap();
    assert_eq!(post(port, &assignment::encode(&stranger, &assignment_for(&exec))), 401, "a wrong key is refused");
    assert_eq!(post(port, &assignment::encode(&key, &assignment_for(&exec))), 202);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "nothing is accepted after the assignment");

    let mut stdout = String::new();
    runner.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let status = runner.wait().unwrap();
    let frames = frames_of(&stdout);
    let mode = fs::metadata(workdir.join("data/in.txt")).unwrap().permissions().mode();
    let run = Run { exit_code: status.code().unwrap_or(-1), frames, workdir };
    assert!(matches!(run.frames.first(), Some(Frame::Started(_))), "{stdout}");
    assert_eq!(String::from_utf8_lossy(&run.stdout()), "input\nhello from the assignment\n");
    assert_eq!(
        run.artifacts().iter().map(|(header, content)| (header.path.as_str(), content.as_slice())).collect::<Vec<_>>(),
        [("out.txt", &b"made\n"[..])]
    );
    assert_eq!(run.result().exit_code, Some(3));
    assert_eq!(run.exit_code, 3, "the runner exits as the command did");
    assert_eq!(mode & 0o777, 0o640);
    assert!(!key_file.exists(), "the runner took its key and removed it: no command could read it");
}

/// POSTs `body` to `path` on the runner at `port` (retrying the
/// connection while the runner is still starting); the status code and
/// the rest of the answer (a session call's: its frames, to the close).
fn post_to(port: u16, path: &str, body: &[u8]) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => break stream,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(error) => panic!("the runner never listened on {port}: {error}"),
        }
    };
    write!(stream, "POST {path} HTTP/1.1\r\nHost: pod\r\nContent-Length: {}\r\n\r\n", body.len()).unwrap();
    stream.write_all(body).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let code = answer.get(9..12).and_then(|code| code.parse().ok()).unwrap_or(0);
    (code, answer)
}

/// An open sandbox's runner on its port: call after call in one workdir,
/// each answered with its own frames (the server's tag on every one), a
/// wrong key refused, a second call while one runs refused, a cancel that
/// stops only the running call, and the runner going on after it.
#[test]
fn a_session_runner_takes_call_after_call_and_answers_each_with_its_frames() {
    use mcp_k8s_ephemeral_job::sandbox::frame::{TAG_BYTES, Tag};
    use mcp_k8s_ephemeral_job::sandbox::session;
    let exec = options("session", &["true"]);
    let workdir = exec.workdir.clone();
    let key = Key::random().unwrap();
    let key_file = std::env::temp_dir().join(format!("runner-spec-{}-session-key", std::process::id()));
    fs::write(&key_file, key.to_hex()).unwrap();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let until_ms =
        (std::time::SystemTime::now() + Duration::from_secs(120)).duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let mut runner = port_runner(port, &key_file, &workdir, Some(until_ms));
    let call = |tag: u8, script: &str| {
        let mut call = assignment_for(&ExecOptions { argv: vec!["sh".into(), "-c".into(), script.into()], ..exec.clone() });
        call.files.clear();
        call.tag = Some(Tag::from_bytes([tag; TAG_BYTES]));
        call
    };
    let tagged = |answer: &str, tag: u8| -> Vec<Frame> {
        let prefix = format!("MCPK8S/{} {} ", frame::VERSION, Tag::from_bytes([tag; TAG_BYTES]).to_hex());
        let lines: Vec<&str> = answer.lines().filter(|line| line.starts_with(&prefix)).collect();
        frames_of(&lines.join("\n"))
    };

    assert_eq!(post_to(port, assignment::PATH, &session::encode_call(&Key::random().unwrap(), &call(1, "true"))).0, 401, "a wrong key");
    let (code, answer) = post_to(port, assignment::PATH, &session::encode_call(&key, &call(1, "echo kept > note.txt; echo one")));
    assert_eq!(code, 200, "{answer}");
    let first = Run { exit_code: 0, frames: tagged(&answer, 1), workdir: workdir.clone() };
    assert_eq!(String::from_utf8_lossy(&first.stdout()), "one\n");
    let (_, answer) = post_to(port, assignment::PATH, &session::encode_call(&key, &call(2, "cat note.txt")));
    let second = Run { exit_code: 0, frames: tagged(&answer, 2), workdir: workdir.clone() };
    assert_eq!(String::from_utf8_lossy(&second.stdout()), "kept\n", "the second call sees the first one's file");
    assert!(tagged(&answer, 1).is_empty(), "no frame of another call in a call's answer");

    // A long call; a second one while it runs is refused; a cancel of a
    // call that does not run reaches nothing, the running one's stops it.
    let slow = std::thread::spawn({
        let body = session::encode_call(&key, &call(3, "echo go; sleep 300"));
        move || post_to(port, assignment::PATH, &body)
    });
    // Until the slow call runs, a new call may still slip in before it.
    let deadline = Instant::now() + Duration::from_secs(20);
    for tag in 10u8.. {
        let (code, answer) = post_to(port, assignment::PATH, &session::encode_call(&key, &call(tag, "true")));
        if code == 409 {
            assert!(answer.contains(session::BUSY), "{answer}");
            break;
        }
        assert!(Instant::now() < deadline, "a call while one runs was never refused: {answer}");
    }
    assert_eq!(post_to(port, session::CANCEL_PATH, &session::encode_cancel(&key, Tag::from_bytes([9; TAG_BYTES]))).0, 409);
    let cancelled_at = Instant::now();
    assert_eq!(post_to(port, session::CANCEL_PATH, &session::encode_cancel(&key, Tag::from_bytes([3; TAG_BYTES]))).0, 202);
    let (_, answer) = slow.join().unwrap();
    assert!(cancelled_at.elapsed() < Duration::from_secs(30), "the cancel stopped the call");
    let stopped = Run { exit_code: 0, frames: tagged(&answer, 3), workdir: workdir.clone() };
    assert!(stopped.result().terminated_by_request, "{answer}");
    let (_, answer) = post_to(port, assignment::PATH, &session::encode_call(&key, &call(5, "echo after")));
    let after = Run { exit_code: 0, frames: tagged(&answer, 5), workdir: workdir.clone() };
    assert_eq!(String::from_utf8_lossy(&after.stdout()), "after\n", "the runner goes on after a cancel");

    let _ = runner.kill();
    let _ = runner.wait();
    assert!(!key_file.exists(), "the session runner took its key and removed it");
}

/// `runner await-assignment --stdin` for `exec`'s workdir, as a Docker
/// pool sandbox runs it, waiting up to a minute.
fn stdin_runner(exec: &ExecOptions, preload: Option<Preload>) -> std::process::Child {
    let assign = AssignOptions {
        listen: Endpoint::Stdin,
        key_file: None,
        workdir: exec.workdir.clone(),
        max_wait: Duration::from_secs(60),
        session_until_ms: None,
        preload,
    };
    let path = std::env::var("PATH").unwrap_or_default();
    crate::support::server::command(&[("PATH", &path)])
        .args(assign_args(&assign))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The Docker backend's warm sandbox (which may have no network): the
/// runner takes the body on its stdin, up to its end, and the command
/// still reads an empty stdin, as in a cold run.
#[test]
fn a_warm_runner_on_stdin_takes_its_assignment_and_the_command_reads_nothing() {
    let exec = options("warm-stdin", &["sh", "-c", "cat data/in.txt; cat; echo \"$GREETING\"; exit 4"]);
    let spawn = || stdin_runner(&exec, None);
    let mut runner = spawn();
    // Any key: stdin has none to check (only a Docker API client writes there).
    let body = assignment::encode(&Key::random().unwrap(), &assignment_for(&exec));
    runner.stdin.take().unwrap().write_all(&body).unwrap();
    let mut stdout = String::new();
    runner.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let status = runner.wait().unwrap();
    let frames = frames_of(&stdout);
    let run = Run { exit_code: status.code().unwrap_or(-1), frames, workdir: exec.workdir.clone() };
    assert_eq!(String::from_utf8_lossy(&run.stdout()), "input\nhello from the assignment\n");
    assert_eq!((run.result().exit_code, run.exit_code), (Some(4), 4));

    // Stdin that ends without a body: nothing runs, the runner says why.
    let runner = spawn();
    let ended = runner.wait_with_output().unwrap();
    assert!(ended.stdout.is_empty(), "no frames: {:?}", String::from_utf8_lossy(&ended.stdout));
    assert_ne!(ended.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&ended.stderr);
    assert!(stderr.contains("stdin ended before an assignment arrived"), "{stderr}");
}

/// The runner is out of its command's reach: the command (the same user,
/// here `nobody` when the tests run as root, as in a pod) cannot open the
/// runner's stdout or stderr through `/proc`, list its descriptors or read
/// its environment, and inherits no descriptor past stderr. Each open route
/// would print `open:` on the command's stderr.
#[test]
fn the_command_cannot_reach_the_runners_descriptors_or_memory() {
    let workdir = std::env::temp_dir().join(format!("runner-spec-{}-sealed", std::process::id()));
    let _ = fs::remove_dir_all(&workdir);
    fs::create_dir_all(&workdir).unwrap();
    fs::set_permissions(&workdir, fs::Permissions::from_mode(0o777)).unwrap();
    let script = r#"
        for route in /proc/$PPID/fd/1 /proc/$PPID/fd/2; do
            { echo forged > "$route"; } 2>/dev/null && echo "open: $route" >&2
        done
        ls /proc/$PPID/fd >/dev/null 2>&1 && echo "open: /proc/$PPID/fd" >&2
        head -c 1 /proc/$PPID/environ >/dev/null 2>&1 && echo "open: /proc/$PPID/environ" >&2
        for fd in 3 4 5 6 7 8 9; do
            { true >&$fd; } 2>/dev/null && echo "inherited: $fd" >&2
        done
        echo done"#;
    // SAFETY: geteuid(2) reads a number.
    let as_root = unsafe { libc::geteuid() } == 0;
    let mut command = if as_root {
        let mut setpriv = std::process::Command::new("setpriv");
        setpriv.args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_mcp-k8s-ephemeral-job")]);
        setpriv
    } else {
        std::process::Command::new(env!("CARGO_BIN_EXE_mcp-k8s-ephemeral-job"))
    };
    let output = command
        .args(["runner", "exec", "--workdir"])
        .arg(&workdir)
        .args(["--termination-log", "/dev/null", "--", "sh", "-c", script])
        .output()
        .unwrap();
    let run = Run { exit_code: output.status.code().unwrap_or(-1), frames: frames_of(&String::from_utf8_lossy(&output.stdout)), workdir };
    assert_eq!(String::from_utf8_lossy(&run.stderr()), "", "every route is closed");
    assert_eq!(String::from_utf8_lossy(&run.stdout()), "done\n");
    assert_eq!(run.exit_code, 0, "{}", String::from_utf8_lossy(&output.stderr));
}

/// Where the runner cannot end a process that left the command's group (it
/// is not its namespace's first process, as here), a stream that process
/// holds open is waited for a bounded time: what was read comes back, and
/// the stream is reported as cut.
#[test]
fn a_stream_held_open_by_a_stray_keeps_what_was_read_and_says_it_was_cut() {
    // The command ends only once the stray has left its group (it writes
    // its pid after setsid), so the group kill cannot reach it first.
    let script = "echo before; setsid sh -c 'echo $$ > stray.pid; exec sleep 60' & \
                  while [ ! -s stray.pid ]; do sleep 0.05; done; echo started";
    let options = options("stray", &["sh", "-c", script]);
    let stray_pid = options.workdir.join("stray.pid");
    let run = run(&options);
    if let Ok(pid) = fs::read_to_string(&stray_pid) {
        // SAFETY: plain kill(2) on the stray this test started.
        unsafe { libc::kill(pid.trim().parse().unwrap_or(0), libc::SIGKILL) };
    }
    assert_eq!(String::from_utf8_lossy(&run.stdout()), "before\nstarted\n");
    let result = run.result();
    assert!(result.stdout_truncated, "the stream was cut");
    assert!(result.notes.iter().any(|note| note.contains("stdout was still held open")), "{:?}", result.notes);
    assert_eq!(result.exit_code, Some(0));
}

/// Entries chosen as artifacts that are not regular files (a link could
/// point anywhere, a FIFO would block the reader) are not sent, and a note
/// names each, so nothing is left out silently.
#[test]
fn links_and_fifos_chosen_as_artifacts_are_named_in_a_note() {
    let mut options = options("not-regular", &["sh", "-c", "echo x > real.txt; ln -s /etc/passwd link.txt; mkfifo pipe.txt"]);
    options.artifact_patterns = vec!["*.txt".into()];
    let run = run(&options);
    let sent: Vec<String> = run.artifacts().into_iter().map(|(header, _)| header.path).collect();
    assert_eq!(sent, ["real.txt"]);
    let notes = &run.result().notes;
    let note = notes.iter().find(|note| note.contains("not regular files")).unwrap_or_else(|| panic!("{notes:?}"));
    assert!(
        note.starts_with("2 entries") && note.contains("`link.txt` (a symbolic link)") && note.contains("`pipe.txt` (a FIFO)"),
        "{note}"
    );
}

/// A runner that comes up after the run's start deadline (the server has
/// given up on it: an image pull that ended after the pod was deleted)
/// does not start the command, and its one frame says why.
#[test]
fn a_command_past_its_start_deadline_is_never_started() {
    let mut options = options("late", &["sh", "-c", "echo ran > ran.txt"]);
    options.start_deadline_ms = Some(1);
    let ran = options.workdir.join("ran.txt");
    let run = run(&options);
    assert!(!ran.exists(), "the command did not run");
    assert_eq!(run.frames.len(), 1, "only the result: {:?}", run.frames);
    let result = run.result();
    assert_eq!(result.exit_code, None);
    assert!(result.start_error.as_deref().unwrap_or_default().contains("start deadline passed"), "{:?}", result.start_error);
    assert_eq!(run.exit_code, 125);
    // A deadline still ahead changes nothing.
    let mut options = self::options("in-time", &["sh", "-c", "echo ran"]);
    options.start_deadline_ms = Some(u64::MAX);
    assert_eq!(String::from_utf8_lossy(&self::run(&options).stdout()), "ran\n");
}

/// A warm sandbox with a pre-started process (a language pool's
/// interpreter): an assignment with its env and its argv prefix becomes
/// that process, told the rest of the argv on one line; any other runs as
/// usual.
#[test]
fn a_warm_runner_hands_a_fitting_assignment_to_its_prestarted_process() {
    let script = "read line; echo \"pre:$line\"; cat data/in.txt; echo \"$GREETING\"; cat; exit 5";
    let plain = options("prestart-plain", &["sh", "-c", "echo plain; exit 6"]);
    let fitting = options("prestart-fit", &["interp", "main.py", "a"]);
    let env = assignment_for(&fitting).env;
    let preload = Preload { argv: vec!["sh".into(), "-c".into(), script.into()], prefix: vec!["interp".into()], env };
    let run = |exec: &ExecOptions| {
        let mut runner = stdin_runner(exec, Some(preload.clone()));
        let body = assignment::encode(&Key::random().unwrap(), &assignment_for(exec));
        runner.stdin.take().unwrap().write_all(&body).unwrap();
        let output = runner.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        Run { exit_code: output.status.code().unwrap_or(-1), frames: frames_of(&stdout), workdir: exec.workdir.clone() }
    };
    let told = run(&fitting);
    let line = mcp_k8s_ephemeral_job::sandbox::to_hex(b"main.py\0a");
    assert_eq!(String::from_utf8_lossy(&told.stdout()), format!("pre:{line}\ninput\nhello from the assignment\n"));
    assert_eq!((told.result().exit_code, told.exit_code), (Some(5), 5));
    let usual = run(&plain);
    assert_eq!(String::from_utf8_lossy(&usual.stdout()), "plain\n", "an assignment that does not fit runs as usual");
    assert_eq!(usual.result().exit_code, Some(6));
}
