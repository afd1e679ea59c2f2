//! A warm pool sandbox's runner end to end, on this machine (issue 17):
//! the built binary's `runner await-assignment` refuses a wrong key and
//! keeps waiting, takes the first valid assignment over a real socket,
//! writes its input files, runs its argv with its environment exactly as
//! `runner exec` does (the same frames on stdout), and accepts nothing
//! after it. The reader's every refusal is a unit test in `runner::assign`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::time::{Duration, Instant};

use mcp_k8s_ephemeral_job::sandbox::args::{AssignOptions, ExecOptions, assign_args};
use mcp_k8s_ephemeral_job::sandbox::assignment::{self, AssignedFile, Assignment, Key};
use mcp_k8s_ephemeral_job::sandbox::frame::{self, Frame, Stream};

fn assignment_for(workdir: &std::path::Path) -> Assignment {
    Assignment {
        run_id: "warm-1".into(),
        exec: ExecOptions {
            workdir: workdir.into(),
            timeout: Duration::from_secs(30),
            kill_grace: Duration::from_millis(500),
            max_output_bytes: 1 << 20,
            max_artifact_bytes: 1 << 20,
            artifact_patterns: Vec::new(),
            disk_paths: Vec::new(),
            disk_limit_bytes: 0,
            termination_log: mcp_k8s_ephemeral_job::sandbox::TERMINATION_LOG.into(),
            argv: ["sh", "-c", "cat data/in.txt; echo \"$GREETING\"; echo made > out.txt; exit 3"].map(String::from).to_vec(),
        },
        env: [("GREETING".to_string(), "hello from the assignment".to_string())].into(),
        files: vec![AssignedFile { path: "data/in.txt".into(), mode: 0o640, content: b"input\n".to_vec() }],
    }
}

/// POSTs `body` to the runner at `port` and returns the status code,
/// retrying the connection while the runner is still starting.
fn post(port: u16, body: &[u8]) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => break stream,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(error) => panic!("the runner never listened on {port}: {error}"),
        }
    };
    write!(stream, "POST {} HTTP/1.1\r\nHost: pod\r\nContent-Length: {}\r\n\r\n", assignment::PATH, body.len()).unwrap();
    stream.write_all(body).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer.get(9..12).and_then(|code| code.parse().ok()).unwrap_or(0)
}

#[test]
fn a_warm_runner_takes_one_assignment_and_runs_it_like_exec() {
    let root = std::env::temp_dir().join(format!("warm-runner-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let workdir = root.join("work");
    std::fs::create_dir_all(&workdir).unwrap();
    let key = Key::random().unwrap();
    let key_file = root.join("key");
    std::fs::write(&key_file, format!("{}\n", key.to_hex())).unwrap();
    // An ephemeral port, free a moment ago: the runner binds a fixed one.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let options = AssignOptions { port, key_file, workdir: workdir.clone(), max_wait: Duration::from_secs(60) };
    let path = std::env::var("PATH").unwrap_or_default();
    let mut runner = crate::support::server::command(&[("PATH", &path)])
        .args(assign_args(&options))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let stranger = Key::random().unwrap();
    assert_eq!(post(port, &assignment::encode(&stranger, &assignment_for(&workdir))), 401, "a wrong key is refused");
    assert_eq!(post(port, &assignment::encode(&key, &assignment_for(&workdir))), 202);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "nothing is accepted after the assignment");

    let mut stdout = String::new();
    runner.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let status = runner.wait().unwrap();
    let frames: Vec<Frame> =
        stdout.lines().map(|line| frame::decode(line).expect("a valid frame").expect("only frames on stdout")).collect();
    assert!(matches!(frames.first(), Some(Frame::Started(_))), "{stdout}");
    let captured: Vec<u8> = frames
        .iter()
        .filter_map(|frame| match frame {
            Frame::Captured(output) if output.stream == Stream::Stdout => Some(frame::from_base64(&output.data_b64).unwrap()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(String::from_utf8_lossy(&captured), "input\nhello from the assignment\n");
    assert!(frames.iter().any(|frame| matches!(frame, Frame::Artifact(header) if header.path == "out.txt")), "{stdout}");
    let Some(Frame::Result(result)) = frames.last() else { panic!("the last frame is not the result: {stdout}") };
    assert_eq!(result.exit_code, Some(3));
    assert_eq!(status.code(), Some(3), "the runner exits as the command did");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(workdir.join("data/in.txt")).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o640);
    let _ = std::fs::remove_dir_all(&root);
}
