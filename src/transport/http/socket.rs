//! The socket calls std has no API for: a listener with a listen backlog
//! of our choosing, waiting for a socket to become
//! readable or writable with a timeout (poll(2)), a non-blocking peek
//! that tells whether the peer has closed its side, and a non-blocking
//! send on a socket another thread blocks on (or that must not block
//! while its slot may be evicted). Knows nothing of HTTP.

#![allow(unsafe_code)] // the listening socket with its backlog and options, which std's TcpListener does not take.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// What to wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    Readable,
    Writable,
}

/// A listening socket on `addr` with room for `backlog` connections the
/// accept loop has not taken yet (the kernel caps it at
/// net.core.somaxconn). It is what `TcpListener::bind` does, with std's
/// fixed backlog of 128 replaced: close-on-exec, SO_REUSEADDR (so a
/// restart can bind while old connections sit in TIME_WAIT), IPV6_V6ONLY
/// left at the system's default, bind, listen.
pub fn listen(addr: SocketAddr, backlog: libc::c_int) -> io::Result<TcpListener> {
    let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain arguments; the result is checked before use.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket we just opened and own alone; owning it at
    // once closes it on every error below.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: a c_int on the stack and its size, as SO_REUSEADDR takes.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if set == -1 {
        return Err(io::Error::last_os_error());
    }
    bind(&socket, addr)?;
    // SAFETY: a socket we own and a number.
    if unsafe { libc::listen(socket.as_raw_fd(), backlog) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpListener::from(socket))
}

fn bind(socket: &OwnedFd, addr: SocketAddr) -> io::Result<()> {
    let bound = match addr {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_in is plain data; all zeroes is a valid value
            // (and the padding, and sin_len where it exists, must be zero).
            let mut raw: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            raw.sin_family = libc::AF_INET as libc::sa_family_t;
            raw.sin_port = v4.port().to_be();
            raw.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) };
            // SAFETY: the address and its size; bind(2) only reads it.
            unsafe {
                libc::bind(socket.as_raw_fd(), (&raw as *const libc::sockaddr_in).cast(), size_of::<libc::sockaddr_in>() as libc::socklen_t)
            }
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let mut raw: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            raw.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            raw.sin6_port = v6.port().to_be();
            raw.sin6_flowinfo = v6.flowinfo();
            raw.sin6_addr = libc::in6_addr { s6_addr: v6.ip().octets() };
            raw.sin6_scope_id = v6.scope_id();
            // SAFETY: the address and its size; bind(2) only reads it.
            unsafe {
                libc::bind(
                    socket.as_raw_fd(),
                    (&raw as *const libc::sockaddr_in6).cast(),
                    size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                )
            }
        }
    };
    if bound == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
    send_some(socket, bytes).unwrap_or(0)
}

/// `send_now` that tells errors apart: `Ok(0)` when the socket has no
/// room now, an error when the connection broke or was shut down.
pub fn send_some(socket: &impl AsRawFd, bytes: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: a buffer we borrow for the call and its length; send(2)
        // only reads it.
        let sent = unsafe { libc::send(socket.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if let Ok(sent) = usize::try_from(sent) {
            return Ok(sent);
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::WouldBlock => return Ok(0),
            io::ErrorKind::Interrupted => {}
            _ => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};

    /// More than std's backlog of 128 connections that nobody accepts yet
    /// all complete their handshake. Past the backlog the kernel drops the
    /// SYN and connect retries for minutes, so a connect that fails within
    /// its generous timeout means the backlog was too small.
    #[test]
    fn the_listen_backlog_is_the_one_asked_for() {
        const CLIENTS: usize = 300;
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn").unwrap_or_default();
        let somaxconn: usize = somaxconn.trim().parse().unwrap_or(0);
        assert!(somaxconn >= CLIENTS, "net.core.somaxconn is {somaxconn}: it caps the backlog below the {CLIENTS} this test needs");
        let listener = listen("127.0.0.1:0".parse().unwrap(), 1024).unwrap();
        let address = listener.local_addr().unwrap();
        let clients: Vec<TcpStream> = (0..CLIENTS)
            .map(|index| {
                TcpStream::connect_timeout(&address, Duration::from_secs(5))
                    .unwrap_or_else(|error| panic!("connection {index} of {CLIENTS}, none accepted yet: {error}"))
            })
            .collect();
        for _ in 0..CLIENTS {
            listener.accept().unwrap();
        }
        drop(clients);
    }

    #[test]
    fn listeners_on_ipv6_and_after_time_wait() {
        let listener = listen("[::1]:0".parse().unwrap(), 16).unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        client.write_all(b"v6").unwrap();
        let mut received = [0u8; 2];
        server.read_exact(&mut received).unwrap();
        assert_eq!(&received, b"v6");
        // The server closes first, so its side of the connection sits in
        // TIME_WAIT: binding the port again needs SO_REUSEADDR, as it does
        // for a restarted server.
        let address = listener.local_addr().unwrap();
        server.shutdown(Shutdown::Both).unwrap();
        let _ = client.read(&mut received);
        drop((server, client, listener));
        let again = listen(address, 16).unwrap_or_else(|error| panic!("rebinding {address}: {error}"));
        assert_eq!(again.local_addr().unwrap(), address);
    }

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
