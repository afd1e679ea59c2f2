//! Serving the output held in the sandbox (`sandbox::held`): once the
//! command has ended, the runner answers the server, through the API
//! server's `pods/proxy`, on its port: `POST /held` with the run's key
//! gets the held file whole, `POST /release` with the key ends the wait.
//! One connection at a time, each request read under the assignment
//! reader's bounds (`assign::read_request_to`); the only peer the
//! sandbox's NetworkPolicy lets in is the API server.
//!
//! Knows nothing of what the frames hold: `runner::run_exec_with` writes
//! them, this sends the file's bytes.

use std::fs;
use std::io::{self, Read};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::runner::assign::{self, Connection, Refusal, Served};
use crate::sandbox::held;

/// The largest request body: a key, with room for a newline.
const MAX_KEY_BODY: usize = 256;
/// How long one write of the file to a peer may block.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// How the wait ended.
#[derive(Debug, PartialEq)]
pub enum Ended {
    /// The server released the runner.
    Released { fetches: u32 },
    /// Nobody released it within the wait.
    WaitedOut { fetches: u32 },
    /// A SIGTERM asked the runner to stop.
    Stopped,
}

/// Serves `file` on `listener` until a request with the key whose digest
/// is `key_sha256` releases the runner, `wait` passes without one, or
/// `stop` is set. Every fetch or release with the key starts the wait
/// again.
pub fn serve(listener: &TcpListener, key_sha256: &str, file: &Path, wait: Duration, stop: &AtomicBool) -> io::Result<Ended> {
    let served = Served { paths: &[held::FETCH_PATH, held::RELEASE_PATH], max_body: MAX_KEY_BODY };
    let mut deadline = Instant::now() + wait;
    let mut fetches = 0;
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(Ended::Stopped);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Ended::WaitedOut { fetches });
        }
        if !assign::readable(listener, (deadline - now).min(Duration::from_millis(200)))? {
            continue;
        }
        let mut stream = match listener.accept() {
            Ok((stream, _peer)) => stream,
            Err(error) if assign::is_transient(&error) => continue,
            Err(error) => return Err(error),
        };
        let request = assign::read_request_to(&mut stream, &served);
        let offered = request.as_ref().ok().and_then(|(_, body)| held::parse_body(body)).map(|(key, offset)| (key.to_string(), offset));
        match (request, offered) {
            (Ok(_), offered) if !offered.as_ref().is_some_and(|(key, _)| held::matches(key.as_bytes(), key_sha256)) => {
                let _ = assign::respond(&mut stream, 401, "the key does not match this run's");
                assign::close_gently(stream);
            }
            (Ok((path, _)), _) if path == held::RELEASE_PATH => {
                let _ = assign::respond(&mut stream, 200, "released");
                return Ok(Ended::Released { fetches });
            }
            (Ok(_), offered) => {
                fetches += 1;
                // A fetch cut short is the server's to see (fewer bytes than
                // Content-Length): it fetches again from where it got to.
                let _ = send_file(&mut stream, file, offered.map_or(0, |(_, offset)| offset));
                deadline = Instant::now() + wait;
            }
            (Err(Refusal::Silent), _) => {}
            (Err(Refusal::Status(code, text)), _) => {
                let _ = assign::respond(&mut stream, code, &text);
                assign::close_gently(stream);
            }
        }
    }
}

/// The held file from `offset` on (nothing past its end).
fn send_file(stream: &mut impl Connection, path: &Path, offset: u64) -> io::Result<()> {
    use std::io::Seek as _;
    let mut file = fs::File::open(path)?;
    let size = file.metadata()?.len().saturating_sub(offset);
    file.seek(io::SeekFrom::Start(offset))?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes())?;
    let mut buffer = vec![0u8; 256 << 10];
    let mut left = size;
    while left > 0 {
        let read = file.read(&mut buffer[..usize::try_from(left).unwrap_or(usize::MAX).min(256 << 10)])?;
        if read == 0 {
            break;
        }
        stream.write_all(&buffer[..read])?;
        left -= read as u64;
    }
    stream.flush()?;
    stream.shutdown_write()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{SocketAddr, TcpStream};

    fn post(address: SocketAddr, path: &str, body: &str) -> (u16, Vec<u8>) {
        let mut stream = TcpStream::connect(address).unwrap();
        let request = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let end = answer.windows(4).position(|window| window == b"\r\n\r\n").unwrap() + 4;
        let code = std::str::from_utf8(&answer[9..12]).unwrap().parse().unwrap();
        (code, answer[end..].to_vec())
    }

    #[test]
    fn the_held_file_goes_only_to_the_key_and_a_release_ends_the_wait() {
        let dir = std::env::temp_dir().join(format!("mcp-hold-{}-{:?}", std::process::id(), std::thread::current().id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("frames");
        let content: Vec<u8> = (0..700_000u32).map(|n| (n % 251) as u8).collect();
        fs::write(&file, &content).unwrap();
        let key = held::key("0123456789abcdef0123456789abcdef");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let digest = held::digest(&key);
        let server = std::thread::spawn(move || serve(&listener, &digest, &file, Duration::from_secs(20), &AtomicBool::new(false)));
        assert_eq!(post(address, held::FETCH_PATH, "0".repeat(64).as_str()).0, 401);
        assert_eq!(post(address, "/assign", &key).0, 404);
        let (code, body) = post(address, held::FETCH_PATH, &key);
        assert_eq!(code, 200);
        assert!(body == content, "the held file comes back whole ({} of {} bytes)", body.len(), content.len());
        assert_eq!(post(address, held::FETCH_PATH, &key).1.len(), content.len(), "a second fetch gets it again");
        let resumed = post(address, held::FETCH_PATH, &held::fetch_body(&key, 600_000)).1;
        assert!(resumed == content[600_000..], "a fetch resumes at its offset");
        assert_eq!(post(address, held::RELEASE_PATH, &format!("{key}\n")).0, 200);
        assert_eq!(server.join().unwrap().unwrap(), Ended::Released { fetches: 3 });
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn nobody_releasing_ends_the_wait_and_a_stop_ends_it_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ended = serve(&listener, &held::digest("k"), Path::new("/nonexistent"), Duration::from_millis(300), &AtomicBool::new(false));
        assert_eq!(ended.unwrap(), Ended::WaitedOut { fetches: 0 });
        let ended = serve(&listener, &held::digest("k"), Path::new("/nonexistent"), Duration::from_secs(60), &AtomicBool::new(true));
        assert_eq!(ended.unwrap(), Ended::Stopped);
    }
}
