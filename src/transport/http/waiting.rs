//! Connections waiting on their client, oldest first: for their next
//! request head (new, slow to send, or idle between keep-alive requests),
//! or for room to write an answer the client does not take (it pipelines
//! requests and never reads). When every connection slot is taken, the
//! accept loop ends the one that has waited longest and hands its slot to
//! the newcomer, so a flood of idle, slowloris or never-reading
//! connections cannot lock out probes and real clients. An evicted client
//! that waited for a head is sent a farewell (the caller's bytes, a 503)
//! so that one that was about to send a request hears why and when to
//! retry; one blocked mid-answer is not (the bytes would land inside an
//! answer). Connections working on a request (a body being read, a call,
//! an event stream) are not here and are never evicted. Knows nothing of
//! HTTP.

use std::collections::BTreeMap;
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::budget::CounterGuard;
use super::socket;

#[derive(Default)]
pub struct Waiting {
    /// By ticket; tickets grow, so the first entry has waited longest.
    entries: Mutex<Entries>,
}

/// Proof of being in the list; given back to `leave`.
pub struct Ticket(u64);

#[derive(Default)]
struct Entries {
    next_ticket: u64,
    by_ticket: BTreeMap<u64, Entry>,
}

struct Entry {
    socket: Arc<TcpStream>,
    slot: CounterGuard,
    since: Instant,
    wait: Wait,
}

/// What a listed connection waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Its next request head.
    ForHead,
    /// Room to write an answer: its client has taken none of the bytes
    /// sent for as long as it has been listed.
    ForPeerToRead,
}

/// How long a connection must have waited before it may be evicted.
#[derive(Clone, Copy, Debug)]
pub struct EvictAfter {
    pub for_head: Duration,
    pub for_peer_to_read: Duration,
}

/// A regular connection's slot, listed in `Waiting` while the connection
/// waits on its client; the slot is gone once it was evicted.
pub struct Seat {
    waiting: Arc<Waiting>,
    slot: Option<CounterGuard>,
}

/// The slot went to a newcomer and the socket was shut down: stop serving.
#[derive(Debug)]
pub struct Evicted;

impl Seat {
    pub fn new(waiting: &Arc<Waiting>, slot: CounterGuard) -> Seat {
        Seat { waiting: Arc::clone(waiting), slot: Some(slot) }
    }

    /// Lists the connection as waiting on its client, its slot up for
    /// eviction until `unlist`.
    pub fn list(&mut self, socket: &Arc<TcpStream>, wait: Wait) -> Result<Ticket, Evicted> {
        let slot = self.slot.take().ok_or(Evicted)?;
        Ok(self.waiting.enter(socket, slot, wait))
    }

    /// Takes the connection off the list with its slot back.
    pub fn unlist(&mut self, ticket: Ticket) -> Result<(), Evicted> {
        self.slot = self.waiting.leave(ticket);
        self.slot.as_ref().map(|_| ()).ok_or(Evicted)
    }
}

impl Waiting {
    /// Lists a connection that starts waiting on its client, with its slot.
    pub fn enter(&self, socket: &Arc<TcpStream>, slot: CounterGuard, wait: Wait) -> Ticket {
        let mut entries = self.lock();
        entries.next_ticket += 1;
        let ticket = entries.next_ticket;
        entries.by_ticket.insert(ticket, Entry { socket: Arc::clone(socket), slot, since: Instant::now(), wait });
        Ticket(ticket)
    }

    /// Takes the connection off the list with its slot back; `None` when
    /// it was evicted meanwhile (its socket is shut down: stop serving it).
    pub fn leave(&self, ticket: Ticket) -> Option<CounterGuard> {
        self.lock().by_ticket.remove(&ticket.0).map(|entry| entry.slot)
    }

    /// Ends the connection that has waited longest and returns its slot.
    /// One waiting for a head whose socket holds bytes not yet read is
    /// passed over: its request has arrived and its thread is about to
    /// read it (evicting it would drop a request in flight, such as a
    /// probe's on a busy machine). So is one that has waited less than
    /// `min_wait` says: a client that has just connected may not have
    /// written its request yet (a probe whose thread the machine's load
    /// held back for a few ms was evicted so), and one reading a large
    /// answer may pause. A flood cannot hide behind either: its threads
    /// read what it sends at once, and its connections grow old. A
    /// connection blocked writing is not passed over for unread bytes: a
    /// client that pipelines requests and reads no answer always has some.
    /// `None` when every connection is passed over.
    /// `farewell` is sent first to one that waited for a head, as far as
    /// the socket takes it at once: the caller is the accept loop, which
    /// must never wait on a client.
    pub fn evict_oldest(&self, farewell: &[u8], min_wait: EvictAfter) -> Option<CounterGuard> {
        let Entry { socket, slot, wait, .. } = {
            let mut entries = self.lock();
            let ticket = entries.by_ticket.iter().find(|(_, entry)| evictable(entry, min_wait)).map(|(ticket, _)| *ticket)?;
            entries.by_ticket.remove(&ticket)?
        };
        if wait == Wait::ForHead {
            socket::send_now(&*socket, farewell);
        }
        // Its thread's blocked read returns at once and the thread ends.
        // What was queued is still sent before the FIN.
        let _ = socket.shutdown(Shutdown::Both);
        Some(slot)
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn evictable(entry: &Entry, min_wait: EvictAfter) -> bool {
    match entry.wait {
        Wait::ForHead => entry.since.elapsed() >= min_wait.for_head && !socket::has_unread_bytes(&*entry.socket),
        Wait::ForPeerToRead => entry.since.elapsed() >= min_wait.for_peer_to_read,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::http::budget::Counter;
    use std::io::Read;
    use std::net::TcpListener;

    const NO_WAIT: EvictAfter = EvictAfter { for_head: Duration::ZERO, for_peer_to_read: Duration::ZERO };

    #[test]
    fn the_oldest_waiting_connection_is_evicted_and_its_slot_handed_over() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let counter = Arc::new(Counter::default());
        let waiting = Waiting::default();
        let _clients: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(address).unwrap()).collect();
        let first = Arc::new(listener.accept().unwrap().0);
        let second = Arc::new(listener.accept().unwrap().0);
        let first_ticket = waiting.enter(&first, counter.try_take(2).unwrap(), Wait::ForHead);
        let second_ticket = waiting.enter(&second, counter.try_take(2).unwrap(), Wait::ForHead);
        let slot = waiting.evict_oldest(b"bye", NO_WAIT).unwrap();
        assert_eq!(counter.in_use(), 2, "the slot changed hands; it was not freed");
        assert_eq!((&*first).read(&mut [0u8; 1]).unwrap(), 0, "the evicted socket reads as closed");
        let mut farewell = Vec::new();
        (&_clients[0]).read_to_end(&mut farewell).unwrap();
        assert_eq!(farewell, b"bye", "the evicted client is told before the close");
        assert!(waiting.leave(first_ticket).is_none());
        let second_slot = waiting.leave(second_ticket);
        assert!(second_slot.is_some());
        drop(slot);
        assert_eq!(counter.in_use(), 1);
    }

    #[test]
    fn a_connection_whose_request_has_arrived_is_passed_over() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let counter = Arc::new(Counter::default());
        let waiting = Waiting::default();
        let mut clients: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(address).unwrap()).collect();
        let first = Arc::new(listener.accept().unwrap().0);
        let second = Arc::new(listener.accept().unwrap().0);
        let first_ticket = waiting.enter(&first, counter.try_take(2).unwrap(), Wait::ForHead);
        let _second_ticket = waiting.enter(&second, counter.try_take(2).unwrap(), Wait::ForHead);
        std::io::Write::write_all(&mut clients[0], b"GET / HTTP/1.1\r\n").unwrap();
        assert!(super::socket::wait(&*first, super::socket::Readiness::Readable, std::time::Duration::from_secs(5)).unwrap());
        assert!(waiting.evict_oldest(b"", NO_WAIT).is_some(), "the second, idle, is evicted");
        assert!(waiting.evict_oldest(b"", NO_WAIT).is_none(), "the first has a request waiting to be read");
        assert!(waiting.leave(first_ticket).is_some());
    }

    #[test]
    fn a_connection_younger_than_the_least_wait_is_passed_over() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let counter = Arc::new(Counter::default());
        let waiting = Waiting::default();
        let _client = TcpStream::connect(address).unwrap();
        let socket = Arc::new(listener.accept().unwrap().0);
        let ticket = waiting.enter(&socket, counter.try_take(1).unwrap(), Wait::ForHead);
        assert!(
            waiting.evict_oldest(b"", EvictAfter { for_head: Duration::from_secs(3600), for_peer_to_read: Duration::ZERO }).is_none(),
            "it has only just connected"
        );
        assert!(waiting.evict_oldest(b"", NO_WAIT).is_some(), "any wait is enough for no least wait");
        assert!(waiting.leave(ticket).is_none());
    }

    #[test]
    fn a_connection_blocked_writing_is_evicted_with_unread_bytes_and_no_farewell() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let counter = Arc::new(Counter::default());
        let waiting = Arc::new(Waiting::default());
        let mut client = TcpStream::connect(address).unwrap();
        let socket = Arc::new(listener.accept().unwrap().0);
        // The client pipelines another request and reads nothing.
        std::io::Write::write_all(&mut client, b"GET / HTTP/1.1\r\n\r\n").unwrap();
        assert!(super::socket::wait(&*socket, super::socket::Readiness::Readable, Duration::from_secs(5)).unwrap());
        let mut seat = Seat::new(&waiting, counter.try_take(1).unwrap());
        let ticket = seat.list(&socket, Wait::ForPeerToRead).unwrap();
        let young = EvictAfter { for_head: Duration::ZERO, for_peer_to_read: Duration::from_secs(3600) };
        assert!(waiting.evict_oldest(b"bye", young).is_none(), "it has only just blocked");
        let slot = waiting.evict_oldest(b"bye", NO_WAIT);
        assert!(slot.is_some(), "unread bytes do not shield a connection blocked writing");
        assert!(seat.unlist(ticket).is_err(), "its thread learns it was evicted");
        assert!(seat.list(&socket, Wait::ForHead).is_err(), "and stays so");
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut received = Vec::new();
        let _ = client.read_to_end(&mut received);
        assert!(received.is_empty(), "no farewell inside an answer: {received:?}");
    }
}
