//! Connections waiting for their next request head (new, slow to send, or
//! idle between keep-alive requests), oldest first. When every connection
//! slot is taken, the accept loop ends the one that has waited longest and
//! hands its slot to the newcomer, so a flood of idle or slowloris
//! connections cannot lock out probes and real clients. The
//! evicted client is sent a farewell (the caller's bytes, a 503) so that
//! one that was about to send a request hears why and when to retry.
//! Connections inside a request (a body being read, a call, an event
//! stream) are not here and are never evicted. Knows nothing of HTTP.

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
}

impl Waiting {
    /// Lists a connection that starts waiting for a head, with its slot.
    pub fn enter(&self, socket: &Arc<TcpStream>, slot: CounterGuard) -> Ticket {
        let mut entries = self.lock();
        entries.next_ticket += 1;
        let ticket = entries.next_ticket;
        entries.by_ticket.insert(ticket, Entry { socket: Arc::clone(socket), slot, since: Instant::now() });
        Ticket(ticket)
    }

    /// Takes the connection off the list with its slot back; `None` when
    /// it was evicted meanwhile (its socket is shut down: stop serving it).
    pub fn leave(&self, ticket: Ticket) -> Option<CounterGuard> {
        self.lock().by_ticket.remove(&ticket.0).map(|entry| entry.slot)
    }

    /// Ends the connection that has waited longest and returns its slot.
    /// One whose socket holds bytes not yet read is passed over: its
    /// request has arrived and its thread is about to read it (evicting it
    /// would drop a request in flight, such as a probe's on a busy
    /// machine). So is one that has waited less than `min_wait`: a client
    /// that has just connected may not have written its request yet (a
    /// probe whose thread the machine's load held back for a few ms was
    /// evicted so). A flood cannot hide behind either: its threads read
    /// what it sends at once, and its connections grow old. `None` when
    /// every connection is passed over.
    /// `farewell` is sent first, as far as the socket takes it at once:
    /// the caller is the accept loop, which must never wait on a client.
    pub fn evict_oldest(&self, farewell: &[u8], min_wait: Duration) -> Option<CounterGuard> {
        let Entry { socket, slot, .. } = {
            let mut entries = self.lock();
            let ticket = entries
                .by_ticket
                .iter()
                .find(|(_, entry)| entry.since.elapsed() >= min_wait && !socket::has_unread_bytes(&*entry.socket))
                .map(|(ticket, _)| *ticket)?;
            entries.by_ticket.remove(&ticket)?
        };
        socket::send_now(&*socket, farewell);
        // Its thread's blocked read returns at once and the thread ends.
        // What was queued is still sent before the FIN.
        let _ = socket.shutdown(Shutdown::Both);
        Some(slot)
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::http::budget::Counter;
    use std::io::Read;
    use std::net::TcpListener;

    #[test]
    fn the_oldest_waiting_connection_is_evicted_and_its_slot_handed_over() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let counter = Arc::new(Counter::default());
        let waiting = Waiting::default();
        let _clients: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(address).unwrap()).collect();
        let first = Arc::new(listener.accept().unwrap().0);
        let second = Arc::new(listener.accept().unwrap().0);
        let first_ticket = waiting.enter(&first, counter.try_take(2).unwrap());
        let second_ticket = waiting.enter(&second, counter.try_take(2).unwrap());
        let slot = waiting.evict_oldest(b"bye", Duration::ZERO).unwrap();
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
        let first_ticket = waiting.enter(&first, counter.try_take(2).unwrap());
        let _second_ticket = waiting.enter(&second, counter.try_take(2).unwrap());
        std::io::Write::write_all(&mut clients[0], b"GET / HTTP/1.1\r\n").unwrap();
        assert!(super::socket::wait(&*first, super::socket::Readiness::Readable, std::time::Duration::from_secs(5)).unwrap());
        assert!(waiting.evict_oldest(b"", Duration::ZERO).is_some(), "the second, idle, is evicted");
        assert!(waiting.evict_oldest(b"", Duration::ZERO).is_none(), "the first has a request waiting to be read");
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
        let ticket = waiting.enter(&socket, counter.try_take(1).unwrap());
        assert!(waiting.evict_oldest(b"", Duration::from_secs(3600)).is_none(), "it has only just connected");
        assert!(waiting.evict_oldest(b"", Duration::ZERO).is_some(), "any wait is enough for no least wait");
        assert!(waiting.leave(ticket).is_none());
    }
}
