//! Long-lived reads: watches and followed pod logs, and the `Abort` handle
//! that lets another thread close them.
//!
//! Cancellation mechanism: streams go through the client's stream agent,
//! one per client, which keeps no idle connection, so every stream opens
//! a connection of its own; its connector (`StreamConnector`) hands that
//! connection's socket to the `Abort` of the stream being opened on this
//! thread (`Abort::while_connecting`). `abort()` shuts that socket down, so
//! a read blocked in another thread returns an error at once; the stream
//! then reports `Error::Aborted` (watch) or an `io::Error` of kind
//! `ConnectionAborted` (log stream; not `Interrupted`, which std's
//! `read_line` retries forever). Aborting before a connection exists is
//! remembered: the next attempt fails immediately, and a socket registered
//! after the abort is shut down at once. An earlier version built an agent
//! per stream so that `Agent::shutdown` closed only it: 256 followed logs
//! held 256 agents and their TLS configurations (bench/memory.py).
//!
//! Watch semantics (api-concepts "Efficient detection of changes"): list,
//! then watch from the list's resourceVersion with bookmarks; a dropped
//! connection or a server timeout resumes from the last resourceVersion seen;
//! 410 Gone (HTTP or `ERROR` event) re-lists and reports the new full set.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ureq::unversioned::transport::{ConnectionDetails, Connector, DefaultConnector, ShutdownHandle, Transport};

use crate::kube::{ApiRequest, Client, Error, ListParams, Resource};

/// Closes a stream from another thread. Clones control the same stream.
#[derive(Clone, Default)]
pub struct Abort {
    inner: Arc<AbortInner>,
}

#[derive(Default)]
struct AbortInner {
    aborted: AtomicBool,
    /// The socket of the stream's current connection.
    socket: Mutex<Option<Weak<dyn ShutdownHandle>>>,
}

impl std::fmt::Debug for Abort {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Abort").field("aborted", &self.is_aborted()).finish_non_exhaustive()
    }
}

impl Abort {
    pub fn new() -> Abort {
        Abort::default()
    }

    /// Closes the stream's connection; pending and later reads fail promptly.
    pub fn abort(&self) {
        self.inner.aborted.store(true, Ordering::SeqCst);
        let socket = self.lock_socket().take();
        if let Some(socket) = socket.and_then(|socket| socket.upgrade()) {
            socket.shutdown();
        }
    }

    pub fn is_aborted(&self) -> bool {
        self.inner.aborted.load(Ordering::SeqCst)
    }

    /// Runs `open` (which connects on this thread) with this stream's
    /// connection handed to `abort`, through `StreamConnector`.
    pub(crate) fn while_connecting<T>(&self, open: impl FnOnce() -> T) -> T {
        struct Cleared;
        impl Drop for Cleared {
            fn drop(&mut self) {
                CONNECTING.with(|slot| slot.borrow_mut().take());
            }
        }
        CONNECTING.with(|slot| *slot.borrow_mut() = Some(self.clone()));
        let _cleared = Cleared;
        open()
    }

    /// Makes `socket` the one `abort` shuts down; shut down at once when
    /// the stream is aborted already.
    fn register(&self, socket: Weak<dyn ShutdownHandle>) {
        let mut slot = self.lock_socket();
        if self.is_aborted() {
            drop(slot);
            if let Some(socket) = socket.upgrade() {
                socket.shutdown();
            }
            return;
        }
        *slot = Some(socket);
    }

    fn lock_socket(&self) -> std::sync::MutexGuard<'_, Option<Weak<dyn ShutdownHandle>>> {
        self.inner.socket.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

thread_local! {
    /// The stream this thread is opening (`Abort::while_connecting`).
    static CONNECTING: RefCell<Option<Abort>> = const { RefCell::new(None) };
}

/// ureq's connector, which also hands each new connection's socket to the
/// `Abort` of the stream being opened on this thread.
#[derive(Debug, Default)]
pub(crate) struct StreamConnector(DefaultConnector);

impl Connector for StreamConnector {
    type Out = Box<dyn Transport>;

    fn connect(&self, details: &ConnectionDetails, chained: Option<()>) -> Result<Option<Self::Out>, ureq::Error> {
        let Some(abort) = CONNECTING.with(|slot| slot.borrow().clone()) else {
            return self.0.connect(details, chained);
        };
        let agent_register = Arc::clone(&details.register_shutdown);
        let register_shutdown = Arc::new(move |socket: Weak<dyn ShutdownHandle>| {
            abort.register(socket.clone());
            agent_register(socket)
        });
        let details = ConnectionDetails {
            uri: details.uri,
            addrs: details.addrs.clone(),
            config: details.config,
            request_level: details.request_level,
            resolver: details.resolver,
            now: details.now,
            timeout: details.timeout,
            current_time: Arc::clone(&details.current_time),
            run_connector: Arc::clone(&details.run_connector),
            register_shutdown,
        };
        self.0.connect(&details, chained)
    }
}

/// A followed pod log. `BufRead::lines` yields lines as the container
/// writes them; EOF comes when the container exits.
pub struct LogStream {
    path: String,
    reader: BufReader<ureq::BodyReader<'static>>,
    abort: Abort,
}

impl std::fmt::Debug for LogStream {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("LogStream").field("path", &self.path).finish_non_exhaustive()
    }
}

impl LogStream {
    pub(crate) fn new(path: String, response: ureq::http::Response<ureq::Body>, abort: Abort) -> LogStream {
        LogStream { path, reader: BufReader::new(response.into_body().into_reader()), abort }
    }

    /// A handle another thread can use to close this stream.
    pub fn abort_handle(&self) -> Abort {
        self.abort.clone()
    }

    fn map_error(&self, error: std::io::Error) -> std::io::Error {
        if self.abort.is_aborted() {
            return std::io::Error::new(std::io::ErrorKind::ConnectionAborted, format!("GET {}: aborted", self.path));
        }
        error
    }
}

impl Read for LogStream {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        if self.abort.is_aborted() {
            return Err(self.map_error(std::io::Error::other("aborted")));
        }
        self.reader.read(buffer).map_err(|error| self.map_error(error))
    }
}

impl BufRead for LogStream {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.abort.is_aborted() {
            return Err(self.map_error(std::io::Error::other("aborted")));
        }
        // Borrowing rules: map the error without touching `self.reader` twice.
        let aborted = &self.abort;
        let path = &self.path;
        self.reader.fill_buf().map_err(|error| {
            if aborted.is_aborted() {
                std::io::Error::new(std::io::ErrorKind::ConnectionAborted, format!("GET {path}: aborted"))
            } else {
                error
            }
        })
    }

    fn consume(&mut self, amount: usize) {
        self.reader.consume(amount);
    }
}

/// What to watch.
#[derive(Clone, Debug)]
pub struct WatchParams {
    pub list: ListParams,
    /// `timeoutSeconds` of each watch request; the watcher reconnects after.
    pub timeout_s: u32,
}

impl Default for WatchParams {
    fn default() -> WatchParams {
        WatchParams { list: ListParams::default(), timeout_s: 290 }
    }
}

/// One change seen by a `Watcher`. Bookmarks are handled inside.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchEvent {
    /// The complete current set, at the start and after a 410 re-list;
    /// objects not in it are gone.
    Listed(Vec<serde_json::Value>),
    Added(serde_json::Value),
    Modified(serde_json::Value),
    Deleted(serde_json::Value),
}

/// A resumable watch; see the module doc. `next` blocks until an event.
pub struct Watcher {
    client: Client,
    resource: Resource,
    namespace: String,
    params: WatchParams,
    resource_version: Option<String>,
    stream: Option<BufReader<ureq::BodyReader<'static>>>,
    pending: VecDeque<WatchEvent>,
    abort: Abort,
    /// Connections in a row that ended without an event, for backoff.
    empty_streams: u32,
    events_on_stream: u32,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Watcher")
            .field("resource", &self.resource.plural)
            .field("namespace", &self.namespace)
            .field("resource_version", &self.resource_version)
            .finish_non_exhaustive()
    }
}

impl Watcher {
    pub(crate) fn new(client: Client, resource: Resource, namespace: String, params: WatchParams) -> Watcher {
        Watcher {
            client,
            resource,
            namespace,
            params,
            resource_version: None,
            stream: None,
            pending: VecDeque::new(),
            abort: Abort::new(),
            empty_streams: 0,
            events_on_stream: 0,
        }
    }

    /// A handle another thread can use to stop this watcher.
    pub fn abort_handle(&self) -> Abort {
        self.abort.clone()
    }

    /// The last resourceVersion seen (from a list, an event or a bookmark).
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// The next event. Errors are the ones retrying cannot fix (Forbidden,
    /// an outage longer than the retry budget) and `Error::Aborted`.
    #[allow(clippy::should_implement_trait)] // Blocking and fallible; an Iterator would hide both.
    pub fn next(&mut self) -> Result<WatchEvent, Error> {
        loop {
            if self.abort.is_aborted() {
                return Err(self.aborted());
            }
            if let Some(event) = self.pending.pop_front() {
                return Ok(event);
            }
            if self.resource_version.is_none() {
                return self.relist();
            }
            if self.stream.is_none() {
                self.open()?;
                continue;
            }
            self.read_event()?;
        }
    }

    fn relist(&mut self) -> Result<WatchEvent, Error> {
        self.stream = None;
        let path = crate::kube::with_query(
            &crate::kube::collection_path(self.resource, &self.namespace)?,
            &crate::kube::list_query(&self.params.list),
        );
        let request = ApiRequest::new("GET", path);
        let response = self.client.execute(&request, Some(&self.abort))?;
        let response = crate::kube::check_status(&request, response)?;
        let bytes = crate::kube::read_body(&request, response).map_err(|error| self.or_aborted(error))?;
        let list: serde_json::Value = serde_json::from_slice(&bytes).map_err(|error| Error::Decode {
            verb: "GET",
            path: request.path.clone(),
            message: error.to_string(),
        })?;
        let list = crate::kube::decode_list(&request, list)?;
        self.resource_version = Some(list.resource_version);
        Ok(WatchEvent::Listed(list.items))
    }

    fn open(&mut self) -> Result<(), Error> {
        if self.empty_streams > 0 {
            // A server that closes at once must not be hammered.
            let delay = crate::kube::backoff(self.empty_streams - 1, self.client.options());
            crate::kube::sleep_unless_aborted(delay, Some(&self.abort));
        }
        let mut query = crate::kube::list_query(&self.params.list);
        query.push(("watch", "1".to_string()));
        query.push(("resourceVersion", self.resource_version.clone().unwrap_or_default()));
        query.push(("allowWatchBookmarks", "true".to_string()));
        query.push(("timeoutSeconds", self.params.timeout_s.to_string()));
        let path = crate::kube::with_query(&crate::kube::collection_path(self.resource, &self.namespace)?, &query);
        let mut request = ApiRequest::new("GET", path);
        // The server may stay silent until timeoutSeconds; allow that plus the
        // usual read timeout before calling the connection dead.
        let silence = Duration::from_secs(u64::from(self.params.timeout_s)) + self.client.options().read_timeout;
        request.read_timeout = Some(Some(silence));
        let response = self.client.execute(&request, Some(&self.abort))?;
        match crate::kube::check_status(&request, response) {
            Ok(response) => {
                self.stream = Some(BufReader::new(response.into_body().into_reader()));
                self.events_on_stream = 0;
                Ok(())
            }
            Err(error) if error.is_gone() => {
                self.log_relist("410 on watch request");
                self.resource_version = None;
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Reads one line; queues an event or updates state.
    fn read_event(&mut self) -> Result<(), Error> {
        let Some(stream) = self.stream.as_mut() else { return Ok(()) };
        let mut line = String::new();
        let read = stream.read_line(&mut line);
        match read {
            Ok(0) => self.end_of_stream("server closed the watch"),
            Err(error) => {
                if self.abort.is_aborted() {
                    return Err(self.aborted());
                }
                self.end_of_stream(&format!("watch connection failed: {error}"));
            }
            Ok(_) if line.trim().is_empty() => {}
            Ok(_) => {
                self.events_on_stream += 1;
                self.empty_streams = 0;
                return self.handle_line(&line);
            }
        }
        Ok(())
    }

    fn handle_line(&mut self, line: &str) -> Result<(), Error> {
        let decoded = decode_watch_line(line).map_err(|message| Error::Decode {
            verb: "GET",
            path: format!("{} watch", crate::kube::collection_path(self.resource, &self.namespace).unwrap_or_default()),
            message,
        })?;
        match decoded {
            WatchLine::Event(event, resource_version) => {
                if !resource_version.is_empty() {
                    self.resource_version = Some(resource_version);
                }
                self.pending.push_back(event);
            }
            WatchLine::Bookmark(resource_version) => {
                if !resource_version.is_empty() {
                    self.resource_version = Some(resource_version);
                }
            }
            WatchLine::Error(status) if status.code == 410 => {
                self.log_relist("410 ERROR event");
                self.resource_version = None;
                self.stream = None;
            }
            WatchLine::Error(status) if status.code >= 500 || status.code == 429 => {
                self.end_of_stream(&format!("ERROR event {} {}", status.code, status.reason));
            }
            WatchLine::Error(status) => {
                self.stream = None;
                let path = crate::kube::collection_path(self.resource, &self.namespace).unwrap_or_default();
                return Err(Error::Api { verb: "GET", path: format!("{path}?watch=1"), status: Box::new(status) });
            }
        }
        Ok(())
    }

    fn end_of_stream(&mut self, why: &str) {
        if self.events_on_stream == 0 {
            self.empty_streams += 1;
        }
        crate::log::debug(
            "watch reconnecting",
            &[("resource", self.resource.plural.into()), ("why", why.into()), ("resource_version", self.resource_version.clone().into())],
        );
        self.stream = None;
    }

    fn log_relist(&self, why: &str) {
        crate::log::info("watch re-listing", &[("resource", self.resource.plural.into()), ("why", why.into())]);
    }

    fn aborted(&self) -> Error {
        Error::Aborted { verb: "GET", path: crate::kube::collection_path(self.resource, &self.namespace).unwrap_or_default() }
    }

    fn or_aborted(&self, error: Error) -> Error {
        if self.abort.is_aborted() { self.aborted() } else { error }
    }
}

/// One decoded line of a watch stream.
#[derive(Debug, PartialEq)]
pub enum WatchLine {
    /// An event and the object's resourceVersion.
    Event(WatchEvent, String),
    Bookmark(String),
    Error(crate::kube::error::Status),
}

/// Decodes `{"type":...,"object":{...}}` (pure, for tests).
fn decode_watch_line(line: &str) -> Result<WatchLine, String> {
    let mut value: serde_json::Value = serde_json::from_str(line).map_err(|error| error.to_string())?;
    let kind = value["type"].as_str().unwrap_or_default().to_string();
    let object = value.get_mut("object").map(serde_json::Value::take).unwrap_or_default();
    let resource_version = object["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string();
    match kind.as_str() {
        "ADDED" => Ok(WatchLine::Event(WatchEvent::Added(object), resource_version)),
        "MODIFIED" => Ok(WatchLine::Event(WatchEvent::Modified(object), resource_version)),
        "DELETED" => Ok(WatchLine::Event(WatchEvent::Deleted(object), resource_version)),
        "BOOKMARK" => Ok(WatchLine::Bookmark(resource_version)),
        "ERROR" => Ok(WatchLine::Error(crate::kube::error::Status::from_json(&object).unwrap_or_else(|| crate::kube::error::Status {
            code: 500,
            reason: "Unknown".into(),
            message: object.to_string(),
            ..Default::default()
        }))),
        other => Err(format!("unknown watch event type `{other}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_lines() {
        let added = decode_watch_line(r#"{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"a","resourceVersion":"7"}}}"#).unwrap();
        assert!(matches!(added, WatchLine::Event(WatchEvent::Added(_), ref rv) if rv == "7"));
        let bookmark = decode_watch_line(r#"{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"9"}}}"#).unwrap();
        assert_eq!(bookmark, WatchLine::Bookmark("9".into()));
        let gone = decode_watch_line(r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}}"#).unwrap();
        assert!(matches!(gone, WatchLine::Error(ref status) if status.code == 410 && status.reason == "Expired"));
        assert!(decode_watch_line("not json").is_err());
        assert!(decode_watch_line(r#"{"type":"WHAT","object":{}}"#).is_err());
    }
}
