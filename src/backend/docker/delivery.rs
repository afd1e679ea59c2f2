//! Hands one assignment to a warm Docker sandbox (issue 17): one
//! `POST /assign` with the `sandbox::assignment` body over the UNIX socket
//! the container's `runner await-assignment --socket` listens on, in the
//! sandbox's bind-mounted host directory. No network is needed, so a
//! sandbox with network mode `none` can be warm too.
//!
//! Knows nothing of pools or of which container the socket belongs to: the
//! caller picks the socket, and removes the container when delivery fails
//! (a sandbox that refused or half-took an assignment is never offered
//! again).

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::docker::http;
use crate::sandbox::assignment::{self, Assignment, Key};

/// The most of the runner's answer text we read: it is one line.
const MAX_ANSWER_BYTES: usize = 4096;

/// Why an assignment was not taken.
#[derive(Debug)]
pub enum Error {
    /// The socket could not be reached: the runner is gone or not yet listening.
    Connect(std::io::Error),
    /// The connection broke or timed out mid-request.
    Io(std::io::Error),
    /// The answer was not HTTP.
    Malformed(String),
    /// The runner answered and refused (401 a wrong key, 400, 500 ...).
    Refused { status: u16, text: String },
}

impl std::fmt::Display for Error {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Connect(error) => write!(formatter, "cannot reach the warm sandbox's socket: {error}"),
            Error::Io(error) => write!(formatter, "the assignment did not get through: {error}"),
            Error::Malformed(why) => write!(formatter, "the warm sandbox's answer is not HTTP: {why}"),
            Error::Refused { status, text } => write!(formatter, "the warm sandbox refused the assignment ({status}): {text}"),
        }
    }
}

impl std::error::Error for Error {}

/// Posts `assignment` with `key` to the runner on `socket`; `Ok` once it
/// answered `202`. `timeout` bounds every read and write.
pub fn deliver(socket: &Path, key: &Key, assignment: &Assignment, timeout: Duration) -> Result<(), Error> {
    let mut stream = UnixStream::connect(socket).map_err(Error::Connect)?;
    stream.set_read_timeout(Some(timeout)).map_err(Error::Io)?;
    stream.set_write_timeout(Some(timeout)).map_err(Error::Io)?;
    let body = assignment::encode(key, assignment);
    let head = http::request_head("POST", assignment::PATH, Some("application/json"), Some(body.len() as u64));
    stream.write_all(&head).and_then(|()| stream.write_all(&body)).and_then(|()| stream.flush()).map_err(Error::Io)?;
    let mut reader = BufReader::new(stream);
    let head_bytes = http::read_head_bytes(&mut reader).map_err(Error::Io)?.map_err(|error| Error::Malformed(error.to_string()))?;
    let head = http::parse_head(&head_bytes).map_err(|error| Error::Malformed(error.to_string()))?;
    if head.status == 202 {
        return Ok(());
    }
    // The runner closes after its one-line answer; a longer one is cut.
    let text = match http::read_to_end_capped(&mut reader, MAX_ANSWER_BYTES) {
        Ok(Ok(bytes)) => String::from_utf8_lossy(&bytes).trim_end().to_string(),
        _ => head.reason.clone(),
    };
    Err(Error::Refused { status: head.status, text })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::args::ExecOptions;
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    fn an_assignment() -> Assignment {
        Assignment {
            run_id: "r1".into(),
            exec: ExecOptions {
                workdir: "/work".into(),
                timeout: Duration::from_secs(5),
                kill_grace: Duration::from_secs(2),
                max_output_bytes: 1024,
                max_artifact_bytes: 1024,
                artifact_patterns: Vec::new(),
                disk_paths: Vec::new(),
                disk_limit_bytes: 0,
                termination_log: crate::sandbox::TERMINATION_LOG.into(),
                argv: vec!["true".into()],
            },
            env: Default::default(),
            files: Vec::new(),
        }
    }

    /// A fake runner that reads one request and answers `answer`; returns
    /// the request it read.
    fn fake_runner(socket: &Path, answer: &'static str) -> std::thread::JoinHandle<Vec<u8>> {
        let listener = UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            let mut request = Vec::new();
            let mut chunk = [0u8; 4096];
            while let Ok(read) = stream.read(&mut chunk) {
                if read == 0 {
                    break;
                }
                request.extend_from_slice(&chunk[..read]);
            }
            stream.write_all(answer.as_bytes()).unwrap();
            request
        })
    }

    fn socket_in_temp(name: &str) -> std::path::PathBuf {
        let directory = std::env::temp_dir().join(format!("delivery-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).unwrap();
        directory.join("assign.sock")
    }

    #[test]
    fn a_202_is_taken_and_the_body_is_the_assignment_with_its_key() {
        let socket = socket_in_temp("taken");
        let runner = fake_runner(&socket, "HTTP/1.1 202 Accepted\r\nContent-Length: 5\r\n\r\ntaken");
        let key = Key::from_bytes([7; assignment::KEY_BYTES]);
        deliver(&socket, &key, &an_assignment(), Duration::from_secs(5)).unwrap();
        let request = runner.join().unwrap();
        let body_at = request.windows(4).position(|window| window == b"\r\n\r\n").unwrap() + 4;
        assert!(request.starts_with(b"POST /assign HTTP/1.1\r\n"));
        let (offered, taken) = assignment::decode(&request[body_at..]).unwrap();
        assert!(offered.matches(&key));
        assert_eq!(taken, an_assignment());
    }

    #[test]
    fn a_refusal_carries_the_runners_words_and_a_missing_socket_is_a_connect_error() {
        let socket = socket_in_temp("refused");
        let answer = "HTTP/1.1 401 Unauthorized\r\nContent-Length: 40\r\n\r\nthe key does not match this sandbox's\n";
        let runner = fake_runner(&socket, answer);
        let error = deliver(&socket, &Key::from_bytes([1; assignment::KEY_BYTES]), &an_assignment(), Duration::from_secs(5));
        runner.join().unwrap();
        match error {
            Err(Error::Refused { status, text }) => assert_eq!((status, text.as_str()), (401, "the key does not match this sandbox's")),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let gone = socket.with_file_name("gone.sock");
        assert!(matches!(deliver(&gone, &Key::from_bytes([1; 32]), &an_assignment(), Duration::from_secs(1)), Err(Error::Connect(_))));
    }
}
