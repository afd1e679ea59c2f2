//! The socket calls std has no API for: waiting for a socket to become
//! readable or writable with a timeout (poll(2)), a non-blocking peek
//! that tells whether the peer has closed its side, and a non-blocking
//! send on a socket another thread blocks on. Knows nothing of HTTP.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// What to wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    Readable,
    Writable,
}

/// Waits up to `timeout` for `socket` to be ready; `Ok(false)` on timeout.
/// An error or hang-up on the socket counts as ready: the next read or
/// write reports it.
pub fn wait(socket: &impl AsRawFd, readiness: Readiness, timeout: Duration) -> io::Result<bool> {
    let events = match readiness {
        Readiness::Readable => libc::POLLIN,
        Readiness::Writable => libc::POLLOUT,
    };
    let mut poll_fd = libc::pollfd { fd: socket.as_raw_fd(), events, revents: 0 };
    let timeout_ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd on the stack, its count, a timeout; poll(2)
    // only writes `revents`.
    let ready = unsafe { libc::poll(&mut poll_fd, 1, timeout_ms) };
    match ready {
        -1 if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => Ok(false),
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(false),
        _ => Ok(true),
    }
}

/// True when the peer closed the connection (or it broke), without
/// blocking and without consuming bytes it may have sent. Bytes waiting to
/// be read mean it is still there.
pub fn peer_closed(socket: &impl AsRawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: a one-byte buffer we own; MSG_PEEK leaves the data queued and
    // MSG_DONTWAIT makes the call return at once whatever the socket mode.
    let received = unsafe { libc::recv(socket.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    match received {
        0 => true,
        1.. => false,
        _ => !matches!(io::Error::last_os_error().kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted),
    }
}

/// True when bytes have arrived that nobody has read yet, without blocking
/// and without consuming them.
pub fn has_unread_bytes(socket: &impl AsRawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: as in `peer_closed`.
    let received = unsafe { libc::recv(socket.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    received > 0
}

/// Sends what the socket takes at once and returns how many bytes went,
/// without blocking whatever the socket's mode (MSG_DONTWAIT: another
/// thread may be blocked reading it, so O_NONBLOCK must not be set) and
/// without SIGPIPE when the peer has gone (MSG_NOSIGNAL). Errors count as
/// nothing sent: the caller closes the socket next anyway.
pub fn send_now(socket: &impl AsRawFd, bytes: &[u8]) -> usize {
    // SAFETY: a buffer we borrow for the call and its length; send(2)
    // only reads it.
    let sent = unsafe { libc::send(socket.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    usize::try_from(sent).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn readiness_and_closed_peers() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        assert!(!wait(&server, Readiness::Readable, Duration::from_millis(10)).unwrap());
        assert!(wait(&server, Readiness::Writable, Duration::from_millis(10)).unwrap());
        assert!(!peer_closed(&server));
        client.write_all(b"x").unwrap();
        assert!(wait(&server, Readiness::Readable, Duration::from_secs(5)).unwrap());
        assert!(!peer_closed(&server), "unread bytes mean the peer is there");
        let mut byte = [0u8; 1];
        std::io::Read::read_exact(&mut &server, &mut byte).unwrap();
        drop(client);
        assert!(wait(&server, Readiness::Readable, Duration::from_secs(5)).unwrap());
        assert!(peer_closed(&server));
    }
}
