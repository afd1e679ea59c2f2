//! HTTP sessions by id: Streamable HTTP sessions (`Mcp-Session-Id`, ended
//! by DELETE, by `MCP_K8S_SESSION_TTL_S` of idleness, or evicted) and
//! legacy SSE sessions (alive while their `GET /sse` stream is open).
//!
//! At most `MCP_K8S_MAX_SESSIONS` are kept. When full, a new session ends
//! the least recently used Streamable one that has no call running: its
//! client gets 404 and initializes again, as the spec has it, instead of
//! every new client being locked out until the TTL. What a
//! session holds (revision, calls) belongs to `protocol::Session`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::callers::Caller;
use crate::log;
use crate::protocol::{Outbox, Session};

pub enum SessionKind {
    /// Lives until DELETE, `MCP_K8S_SESSION_TTL_S` of idleness or eviction.
    Streamable,
    /// Lives while its GET /sse stream is open; the outbox feeds it.
    Legacy(Outbox),
}

pub struct Sessions {
    entries: Mutex<HashMap<String, SessionEntry>>,
    ttl: Duration,
    max_sessions: usize,
}

/// Why a session could not be added.
#[derive(Debug, PartialEq, Eq)]
pub enum InsertError {
    /// Every session is busy (a call running, or a legacy stream open).
    Full {
        max_sessions: usize,
    },
    NoRandomness,
}

struct SessionEntry {
    session: Arc<Session>,
    kind: SessionKind,
    last_used: Instant,
}

impl std::fmt::Display for InsertError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InsertError::Full { max_sessions } => write!(
                formatter,
                "all {max_sessions} sessions have a call running or a stream open; retry later or raise MCP_K8S_MAX_SESSIONS"
            ),
            InsertError::NoRandomness => write!(formatter, "no randomness for a session id; retry"),
        }
    }
}

impl Sessions {
    pub fn new(ttl: Duration, max_sessions: usize) -> Sessions {
        Sessions { entries: Mutex::new(HashMap::new()), ttl, max_sessions }
    }

    /// Adds a session under a new unguessable id, evicting the least
    /// recently used idle one when full.
    pub fn insert(&self, session: Arc<Session>, kind: SessionKind) -> Result<String, InsertError> {
        let mut entries = self.lock();
        self.sweep(&mut entries);
        if entries.len() >= self.max_sessions && !evict_least_recently_used(&mut entries) {
            log::warn("session limit reached", &[("sessions", json!(entries.len()))]);
            return Err(InsertError::Full { max_sessions: self.max_sessions });
        }
        let id = new_session_id().ok_or(InsertError::NoRandomness)?;
        entries.insert(id.clone(), SessionEntry { session, kind, last_used: Instant::now() });
        Ok(id)
    }

    /// The streamable session `id`, if it is `caller`'s: a session is bound
    /// to the caller that made it, so another caller's token with a
    /// leaked id finds nothing.
    pub fn streamable(&self, id: &str, caller: &Caller) -> Option<Arc<Session>> {
        let mut entries = self.lock();
        self.sweep(&mut entries);
        let entry = entries
            .get_mut(id)
            .filter(|entry| matches!(entry.kind, SessionKind::Streamable) && entry.session.caller().name == caller.name)?;
        entry.last_used = Instant::now();
        Some(Arc::clone(&entry.session))
    }

    /// The legacy session `id` and its stream, if it is `caller`'s.
    pub fn legacy(&self, id: &str, caller: &Caller) -> Option<(Arc<Session>, Outbox)> {
        let entries = self.lock();
        let entry = entries.get(id).filter(|entry| entry.session.caller().name == caller.name)?;
        match &entry.kind {
            SessionKind::Legacy(outbox) => Some((Arc::clone(&entry.session), outbox.clone())),
            SessionKind::Streamable => None,
        }
    }

    pub fn remove_streamable(&self, id: &str, caller: &Caller) -> bool {
        let mut entries = self.lock();
        if !entries.get(id).is_some_and(|entry| matches!(entry.kind, SessionKind::Streamable) && entry.session.caller().name == caller.name)
        {
            return false;
        }
        if let Some(entry) = entries.remove(id) {
            entry.session.cancel_all();
        }
        true
    }

    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Ends every session at shutdown: cancels leftovers and closes the
    /// legacy streams (dropping their outboxes).
    pub fn end_all(&self) {
        for (_, entry) in self.lock().drain() {
            entry.session.cancel_all();
        }
    }

    /// Drops idle Streamable sessions, but never one with a call running.
    fn sweep(&self, entries: &mut HashMap<String, SessionEntry>) {
        let now = Instant::now();
        entries.retain(|_, entry| {
            let expired = matches!(entry.kind, SessionKind::Streamable)
                && now.duration_since(entry.last_used) > self.ttl
                && entry.session.calls_in_flight() == 0;
            if expired {
                log::info("session expired", &[]);
            }
            !expired
        });
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, SessionEntry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Ends the Streamable session used longest ago that has no call running;
/// false when there is none.
fn evict_least_recently_used(entries: &mut HashMap<String, SessionEntry>) -> bool {
    let oldest = entries
        .iter()
        .filter(|(_, entry)| matches!(entry.kind, SessionKind::Streamable) && entry.session.calls_in_flight() == 0)
        .min_by_key(|(_, entry)| entry.last_used)
        .map(|(id, _)| id.clone());
    let Some(entry) = oldest.and_then(|id| entries.remove(&id)) else {
        return false;
    };
    entry.session.cancel_all();
    log::info("session evicted: session limit reached", &[("idle_s", json!(entry.last_used.elapsed().as_secs()))]);
    true
}

/// 128 random bits as hex: visible ASCII, as the spec requires.
fn new_session_id() -> Option<String> {
    let mut bytes = [0u8; 16];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
        log::error("no randomness for a session id", &[]);
        return None;
    }
    Some(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_evicts_the_least_recently_used_idle_session() {
        let sessions = Sessions::new(Duration::from_secs(3600), 2);
        let first = sessions.insert(Arc::new(Session::whole_server("stdio")), SessionKind::Streamable).unwrap();
        let second = sessions.insert(Arc::new(Session::whole_server("stdio")), SessionKind::Streamable).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert!(sessions.streamable(&first, &Caller::whole_server("stdio")).is_some(), "first is now the most recently used");
        let third = sessions.insert(Arc::new(Session::whole_server("stdio")), SessionKind::Streamable).unwrap();
        assert!(sessions.streamable(&second, &Caller::whole_server("stdio")).is_none(), "second was evicted");
        assert!(
            sessions.streamable(&first, &Caller::whole_server("stdio")).is_some()
                && sessions.streamable(&third, &Caller::whole_server("stdio")).is_some()
        );
    }

    #[test]
    fn legacy_streams_are_never_evicted() {
        let sessions = Sessions::new(Duration::from_secs(3600), 1);
        let (outbox, _outgoing) = std::sync::mpsc::channel();
        sessions.insert(Arc::new(Session::whole_server("stdio")), SessionKind::Legacy(outbox)).unwrap();
        let error = sessions.insert(Arc::new(Session::whole_server("stdio")), SessionKind::Streamable).unwrap_err();
        assert_eq!(error, InsertError::Full { max_sessions: 1 });
        assert!(error.to_string().ends_with("raise MCP_K8S_MAX_SESSIONS"));
    }
}
