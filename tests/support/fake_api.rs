//! A fake Kubernetes API server for the client's tests: rustls 0.23 with
//! an rcgen CA (optionally asking for client certificates), one thread per
//! connection, hand-written HTTP/1.1 with keep-alive for plain answers and
//! chunked streaming for watches and followed logs.
//!
//! It serves the endpoints the engine uses from in-memory objects (create,
//! get, list with label and field selectors, delete, watch with history and
//! bookmarks, pod logs, SelfSubjectAccessReview, /version) and can inject
//! faults: any status (with `Retry-After`), a stall, a watch closed
//! mid-stream, a 410 `ERROR` event, a compacted history, cut streams. Every
//! fault counts the requests it answered, and a `FakeApi` dropped with an
//! injected fault that never fired fails the test: a fault test whose fault
//! was never served proves nothing. Status bodies and watch framing copy the
//! real apiserver's (checked by `tests/on_cluster/cluster_fidelity.rs`). It
//! knows nothing of the client under test.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use serde_json::{Value, json};

use super::pki::Pki;

/// A fault injected into the next requests that match.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer with this code and a `Status` body, optionally with `Retry-After`.
    Status { code: u16, retry_after: Option<u64> },
    /// Read the request, stay silent this long, then close the connection.
    Stall(Duration),
    /// Watch: send this many events, then drop the connection without the
    /// final chunk (a dropped connection, not a server timeout).
    CloseAfterEvents(usize),
    /// Watch: answer 200, then an `ERROR` event with a 410 `Expired` Status.
    GoneEvent,
    /// Answer 403 the way the RBAC authorizer does: `<resource> is
    /// forbidden: User "<user>" cannot <verb> resource ...`, with the verb
    /// and resource of the request.
    RbacForbidden { user: String },
    /// A followed pod log: send at most this many bytes of it, then end the
    /// stream as a finished one (what an engine that ends a followed log
    /// before its end sends: Podman 4.3, for an exited container).
    EndLogAfter(usize),
}

/// Which credentials the server accepts.
#[derive(Clone, Debug, Default)]
pub enum Accept {
    /// Every request, with or without credentials.
    #[default]
    Anything,
    /// Only these `Authorization` values or client certificates (DER).
    Only { authorizations: Vec<String>, client_certs: Vec<Vec<u8>> },
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    /// Path and query as sent.
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub client_cert: Option<Vec<u8>>,
    pub host: String,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    pub fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers.iter().filter(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str()).collect()
    }
}

/// How the server is set up.
pub struct FakeOptions {
    /// SANs of the server certificate.
    pub server_names: Vec<String>,
    /// Ask for (but do not require) client certificates from `pki`'s CA.
    pub client_auth: bool,
}

impl Default for FakeOptions {
    fn default() -> FakeOptions {
        FakeOptions { server_names: vec!["127.0.0.1".into(), "localhost".into()], client_auth: true }
    }
}

/// A running fake API server; it lives as long as the test process.
pub struct FakeApi {
    pub url: String,
    pub port: u16,
    pub pki: Arc<Pki>,
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Client connections open now.
    open_connections: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct State {
    /// collection path → name → object.
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    resource_version: u64,
    history: Vec<HistoryEntry>,
    /// Watches from a resourceVersion below this get a 410 `ERROR` event.
    compacted_below: u64,
    /// Watches answered that 410 because of `compact`.
    compacted_served: usize,
    /// `namespace/pod` → log.
    logs: BTreeMap<String, PodLog>,
    faults: Vec<FaultRule>,
    /// Bumped by `cut_streams`: open watches and followed logs of an older
    /// epoch drop their connection.
    stream_epoch: u64,
    /// Watches and followed logs dropped by `cut_streams`.
    streams_cut: usize,
    accept: Accept,
    /// (verb, resource) pairs SelfSubjectAccessReview denies.
    denied: Vec<(String, String)>,
    requests: Vec<Recorded>,
    /// collection path → the highest resourceVersion any watch of it has
    /// written to its client.
    delivered: BTreeMap<String, u64>,
}

struct HistoryEntry {
    resource_version: u64,
    collection: String,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct PodLog {
    text: String,
    finished: bool,
    /// Answer 400 "waiting to start" while set.
    waiting: bool,
    /// The most bytes of `text` written to one follower so far.
    followed_up_to: usize,
}

struct FaultRule {
    matcher: String,
    fault: Fault,
    remaining: usize,
    /// For `inject_for`: the rule applies until then, however often.
    until: Option<Instant>,
    fired: usize,
}

impl FakeApi {
    pub fn start() -> FakeApi {
        FakeApi::start_with(Arc::new(Pki::new("fake-ca")), FakeOptions::default())
    }

    pub fn start_with(pki: Arc<Pki>, options: FakeOptions) -> FakeApi {
        let names: Vec<&str> = options.server_names.iter().map(String::as_str).collect();
        let server = pki.server(&names);
        let config = Arc::new(server_config(&pki, &server.cert_pem, &server.key_pem, options.client_auth));
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        let shared =
            Arc::new(Shared { state: Mutex::new(State::default()), changed: Condvar::new(), open_connections: Default::default() });
        let accept_shared = shared.clone();
        std::thread::spawn(move || {
            for connection in listener.incoming().flatten() {
                let config = config.clone();
                let shared = accept_shared.clone();
                std::thread::spawn(move || {
                    shared.open_connections.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    serve_connection(connection, config, &shared);
                    shared.open_connections.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
        });
        FakeApi { url: format!("https://127.0.0.1:{port}"), port, pki, shared }
    }

    /// Client connections open now (a keep-alive connection counts until
    /// the client closes it).
    pub fn open_connections(&self) -> usize {
        self.shared.open_connections.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Matchers of injected faults that answered no request.
    fn unfired(&self) -> Vec<String> {
        self.state().faults.iter().filter(|rule| rule.fired == 0).map(|rule| rule.matcher.clone()).collect()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stores `object` in `collection` (e.g. `/api/v1/namespaces/ci/pods`)
    /// as a create would, and returns it.
    pub fn insert(&self, collection: &str, object: Value) -> Value {
        let stored = {
            let mut state = self.state();
            state.store(collection, object, "ADDED")
        };
        self.shared.changed.notify_all();
        stored
    }

    /// Changes a stored object (a MODIFIED event).
    pub fn update(&self, collection: &str, name: &str, change: impl FnOnce(&mut Value)) -> Value {
        let stored = {
            let mut state = self.state();
            let mut object = state.objects.get(collection).and_then(|objects| objects.get(name)).cloned().expect("object to update");
            change(&mut object);
            state.store(collection, object, "MODIFIED")
        };
        self.shared.changed.notify_all();
        stored
    }

    pub fn remove(&self, collection: &str, name: &str) {
        self.state().delete(collection, name);
        self.shared.changed.notify_all();
    }

    /// The names of the objects in `collection`.
    pub fn names(&self, collection: &str) -> Vec<String> {
        self.state().objects.get(collection).map(|objects| objects.keys().cloned().collect()).unwrap_or_default()
    }

    pub fn object(&self, collection: &str, name: &str) -> Option<Value> {
        self.state().objects.get(collection).and_then(|objects| objects.get(name)).cloned()
    }

    /// Forgets history: watches from older resourceVersions get 410.
    pub fn compact(&self) {
        let mut state = self.state();
        state.compacted_below = state.resource_version + 1;
        state.history.clear();
    }

    pub fn resource_version(&self) -> u64 {
        self.state().resource_version
    }

    /// The next `times` requests whose `METHOD /path?query` contains `matcher` get `fault`.
    pub fn inject(&self, matcher: &str, fault: Fault, times: usize) {
        self.state().faults.push(FaultRule { matcher: matcher.to_string(), fault, remaining: times, until: None, fired: 0 });
    }

    /// Every request whose `METHOD /path?query` contains `matcher` gets
    /// `fault` for the next `window` (an outage); `""` matches all.
    pub fn inject_for(&self, matcher: &str, fault: Fault, window: Duration) {
        let until = Some(Instant::now() + window);
        self.state().faults.push(FaultRule { matcher: matcher.to_string(), fault, remaining: usize::MAX, until, fired: 0 });
    }

    /// How many requests the faults matching `matcher` answered, so a test
    /// proves its fault fired (a fault that never matched proves nothing).
    pub fn fired(&self, matcher: &str) -> usize {
        self.state().faults.iter().filter(|rule| rule.matcher == matcher).map(|rule| rule.fired).sum()
    }

    /// Asserts that the fault injected for `matcher` answered at least one
    /// request; call it at the end of a fault test.
    pub fn assert_fired(&self, matcher: &str) {
        let fired = self.fired(matcher);
        assert!(fired >= 1, "the fault injected for `{matcher}` was never served, so the test proved nothing");
    }

    /// Watches answered 410 because their resourceVersion was below `compact`.
    pub fn compacted_served(&self) -> usize {
        self.state().compacted_served
    }

    /// Watches and followed logs that `cut_streams` dropped.
    pub fn streams_cut(&self) -> usize {
        self.state().streams_cut
    }

    /// Drops every open watch and followed log, as an API server that dies does.
    pub fn cut_streams(&self) {
        self.state().stream_epoch += 1;
        self.shared.changed.notify_all();
    }

    pub fn accept(&self, accept: Accept) {
        self.state().accept = accept;
    }

    pub fn deny(&self, verb: &str, resource: &str) {
        self.state().denied.push((verb.to_string(), resource.to_string()));
    }

    /// Whether a watch of `collection` has written every change made so
    /// far to its client.
    pub fn watch_delivered_all(&self, collection: &str) -> bool {
        let state = self.state();
        state.delivered.get(collection).is_some_and(|delivered| *delivered >= state.resource_version)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.state().requests.clear();
    }

    /// Requests whose `METHOD /path?query` contains `matcher`.
    pub fn count(&self, matcher: &str) -> usize {
        self.state().requests.iter().filter(|request| format!("{} {}", request.method, request.target).contains(matcher)).count()
    }

    pub fn set_log(&self, namespace: &str, pod: &str, text: &str, waiting: bool) {
        let mut state = self.state();
        let log = state.logs.entry(format!("{namespace}/{pod}")).or_default();
        log.text = text.to_string();
        log.waiting = waiting;
        // A new text: what followers had of the old one says nothing.
        log.followed_up_to = 0;
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Whether a follower of the pod's log has been sent all of it so far:
    /// what a test waits for instead of sleeping before the next event.
    pub fn log_followed(&self, namespace: &str, pod: &str) -> bool {
        self.state().logs.get(&format!("{namespace}/{pod}")).is_some_and(|log| log.followed_up_to >= log.text.len() && !log.text.is_empty())
    }

    pub fn append_log(&self, namespace: &str, pod: &str, text: &str) {
        let mut state = self.state();
        state.logs.entry(format!("{namespace}/{pod}")).or_default().text.push_str(text);
        drop(state);
        self.shared.changed.notify_all();
    }

    /// The container exited: followed streams end.
    pub fn finish_log(&self, namespace: &str, pod: &str) {
        let mut state = self.state();
        state.logs.entry(format!("{namespace}/{pod}")).or_default().finished = true;
        drop(state);
        self.shared.changed.notify_all();
    }
}

impl Drop for FakeApi {
    /// A test whose injected fault never fired fails here, unless it is
    /// already failing (a second panic would abort the test process).
    fn drop(&mut self) {
        let unfired = self.unfired();
        if !unfired.is_empty() && !std::thread::panicking() {
            panic!("faults injected for {unfired:?} were never served: the test did not exercise them");
        }
    }
}

impl State {
    fn store(&mut self, collection: &str, mut object: Value, kind: &'static str) -> Value {
        self.resource_version += 1;
        let resource_version = self.resource_version;
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let metadata = &mut object["metadata"];
        metadata["resourceVersion"] = resource_version.to_string().into();
        if metadata.get("uid").is_none() {
            metadata["uid"] = format!("00000000-0000-4000-8000-{resource_version:012}").into();
        }
        if metadata.get("creationTimestamp").is_none() {
            metadata["creationTimestamp"] = "2026-01-01T00:00:00Z".into();
        }
        if let Some(namespace) = namespace_of(collection) {
            metadata["namespace"] = namespace.into();
        }
        self.objects.entry(collection.to_string()).or_default().insert(name, object.clone());
        self.history.push(HistoryEntry { resource_version, collection: collection.to_string(), kind, object: object.clone() });
        object
    }

    fn delete(&mut self, collection: &str, name: &str) -> Option<Value> {
        let mut object = self.objects.get_mut(collection)?.remove(name)?;
        self.resource_version += 1;
        object["metadata"]["resourceVersion"] = self.resource_version.to_string().into();
        let resource_version = self.resource_version;
        self.history.push(HistoryEntry { resource_version, collection: collection.to_string(), kind: "DELETED", object: object.clone() });
        Some(object)
    }

    fn take_fault(&mut self, line: &str) -> Option<Fault> {
        let now = Instant::now();
        let rule = self
            .faults
            .iter_mut()
            .find(|rule| rule.remaining > 0 && rule.until.is_none_or(|until| now < until) && line.contains(&rule.matcher))?;
        rule.remaining -= 1;
        rule.fired += 1;
        Some(rule.fault.clone())
    }

    fn accepts(&self, request: &Request, client_cert: Option<&Vec<u8>>) -> bool {
        match &self.accept {
            Accept::Anything => true,
            Accept::Only { authorizations, client_certs } => {
                request.header("authorization").is_some_and(|value| authorizations.iter().any(|accepted| accepted == value))
                    || client_cert.is_some_and(|cert| client_certs.contains(cert))
            }
        }
    }
}

// ---- TLS and connections ---------------------------------------------------

fn server_config(pki: &Pki, cert_pem: &str, key_pem: &str, client_auth: bool) -> ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().expect("TLS versions");
    let builder = if client_auth {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pki.ca_pem.as_bytes()) {
            roots.add(cert.expect("CA PEM")).expect("CA root");
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .allow_unauthenticated()
            .build()
            .expect("client verifier");
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem.as_bytes()).map(|cert| cert.expect("server cert PEM")).collect();
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("server key PEM");
    builder.with_single_cert(chain, key).expect("server certificate")
}

type TlsStream = StreamOwned<ServerConnection, TcpStream>;

struct Request {
    method: String,
    target: String,
    path: String,
    query: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    fn query(&self, name: &str) -> Option<&str> {
        self.query.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }
}

fn serve_connection(tcp: TcpStream, config: Arc<ServerConfig>, shared: &Shared) {
    let Ok(connection) = ServerConnection::new(config) else { return };
    let mut reader = BufReader::new(StreamOwned::new(connection, tcp));
    loop {
        let Some(request) = read_request(&mut reader) else { return };
        let client_cert = reader.get_ref().conn.peer_certificates().and_then(|certs| certs.first()).map(|cert| cert.to_vec());
        let keep_alive = handle(shared, &request, client_cert, reader.get_mut());
        if !keep_alive {
            let _ = reader.get_mut().flush();
            let _ = reader.get_ref().sock.shutdown(Shutdown::Both);
            return;
        }
    }
}

fn read_request(reader: &mut BufReader<TlsStream>) -> Option<Request> {
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).ok()? == 0 {
        return None;
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    let length = headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let (path, query_text) = target.split_once('?').unwrap_or((target.as_str(), ""));
    let query = query_text
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key), percent_decode(value))
        })
        .collect();
    Some(Request { method, path: path.to_string(), target: target.clone(), query, headers, body })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%'
            && index + 2 < bytes.len()
            && let Ok(byte) = u8::from_str_radix(&text[index + 1..index + 3], 16)
        {
            decoded.push(byte);
            index += 3;
            continue;
        }
        decoded.push(if bytes[index] == b'+' { b' ' } else { bytes[index] });
        index += 1;
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

// ---- routing ---------------------------------------------------------------

/// Answers one request; returns whether the connection stays open.
fn handle(shared: &Shared, request: &Request, client_cert: Option<Vec<u8>>, stream: &mut TlsStream) -> bool {
    let line = format!("{} {}", request.method, request.target);
    let (fault, accepted) = {
        let mut state = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        state.requests.push(Recorded {
            method: request.method.clone(),
            target: request.target.clone(),
            headers: request.headers.clone(),
            client_cert: client_cert.clone(),
            host: request.header("host").unwrap_or_default().to_string(),
        });
        (state.take_fault(&line), state.accepts(request, client_cert.as_ref()))
    };
    match &fault {
        Some(Fault::Status { code, retry_after }) => {
            let status = status_json(*code, reason_for(*code), &fault_message(*code), Value::Null);
            return write_json(stream, *code, &status, *retry_after);
        }
        Some(Fault::Stall(duration)) => {
            std::thread::sleep(*duration);
            return false;
        }
        Some(Fault::RbacForbidden { user }) => {
            let segments: Vec<&str> = request.path.trim_matches('/').split('/').collect();
            let status = rbac_forbidden(request, resource_route(&segments).as_ref(), user);
            return write_json(stream, 403, &status, None);
        }
        _ => {}
    }
    if !accepted {
        return write_json(stream, 401, &status_json(401, "Unauthorized", "Unauthorized", Value::Null), None);
    }
    let segments: Vec<&str> = request.path.trim_matches('/').split('/').collect();
    match (request.method.as_str(), segments.as_slice()) {
        ("GET", ["version"]) => write_json(stream, 200, &version_json(), None),
        ("POST", ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]) => access_review(shared, request, stream),
        ("GET", [.., "namespaces", namespace, "pods", pod, "log"]) => pod_log(shared, request, (namespace, pod), fault, stream),
        _ => match resource_route(&segments) {
            Some(route) => resource(shared, request, &route, fault, stream),
            None => {
                let status = status_json(404, "NotFound", "the server could not find the requested resource", Value::Null);
                write_json(stream, 404, &status, None)
            }
        },
    }
}

/// A collection or object path, split into what the handlers need.
struct Route {
    collection: String,
    group: String,
    plural: String,
    name: Option<String>,
}

fn resource_route(segments: &[&str]) -> Option<Route> {
    let (prefix, group, rest) = match segments {
        ["api", "v1", rest @ ..] => ("/api/v1".to_string(), String::new(), rest),
        ["apis", group, version, rest @ ..] => (format!("/apis/{group}/{version}"), group.to_string(), rest),
        _ => return None,
    };
    let route = |collection: String, plural: &str, name: Option<&&str>| Route {
        collection,
        group: group.clone(),
        plural: plural.to_string(),
        name: name.map(|name| name.to_string()),
    };
    match rest {
        ["namespaces"] => Some(route(format!("{prefix}/namespaces"), "namespaces", None)),
        ["namespaces", name] => Some(route(format!("{prefix}/namespaces"), "namespaces", Some(name))),
        ["namespaces", namespace, plural] => Some(route(format!("{prefix}/namespaces/{namespace}/{plural}"), plural, None)),
        ["namespaces", namespace, plural, name] => Some(route(format!("{prefix}/namespaces/{namespace}/{plural}"), plural, Some(name))),
        _ => None,
    }
}

fn resource(shared: &Shared, request: &Request, route: &Route, fault: Option<Fault>, stream: &mut TlsStream) -> bool {
    let qualified = if route.group.is_empty() { route.plural.clone() } else { format!("{}.{}", route.plural, route.group) };
    let details = |name: &str| {
        let mut details = json!({ "name": name, "kind": route.plural });
        if !route.group.is_empty() {
            details["group"] = route.group.clone().into();
        }
        details
    };
    let mut state = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match (request.method.as_str(), &route.name) {
        ("GET", None) if request.query("watch").is_some_and(|value| value == "1" || value == "true") => {
            drop(state);
            watch(shared, request, route, fault, stream)
        }
        ("GET", None) => {
            let items: Vec<Value> = state
                .objects
                .get(&route.collection)
                .map(|objects| objects.values().filter(|object| matches_selectors(object, request)).cloned().collect())
                .unwrap_or_default();
            let list = json!({
                "kind": format!("{}List", kind_of(&route.plural)),
                "apiVersion": api_version_of(&route.group),
                "metadata": { "resourceVersion": state.resource_version.to_string() },
                "items": items,
            });
            drop(state);
            write_json(stream, 200, &list, None)
        }
        ("GET", Some(name)) => match state.objects.get(&route.collection).and_then(|objects| objects.get(name)).cloned() {
            Some(object) => {
                drop(state);
                write_json(stream, 200, &object, None)
            }
            None => {
                drop(state);
                let status = status_json(404, "NotFound", &format!("{qualified} \"{name}\" not found"), details(name));
                write_json(stream, 404, &status, None)
            }
        },
        ("POST", None) => {
            let Ok(mut object) = serde_json::from_slice::<Value>(&request.body) else {
                drop(state);
                let status = status_json(400, "BadRequest", "the body of the request was in an unknown format", Value::Null);
                return write_json(stream, 400, &status, None);
            };
            let mut name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if name.is_empty()
                && let Some(prefix) = object["metadata"]["generateName"].as_str()
            {
                name = format!("{prefix}{:05}", state.resource_version + 1);
                object["metadata"]["name"] = name.clone().into();
            }
            if name.is_empty() {
                drop(state);
                // The apiserver writes `Secret` for the core group and `Job.batch` otherwise.
                let kind = if route.group.is_empty() {
                    kind_of(&route.plural).to_string()
                } else {
                    format!("{}.{}", kind_of(&route.plural), route.group)
                };
                // Invalid names the Kind, not the resource, and no name.
                let mut details = json!({ "kind": kind_of(&route.plural) });
                if !route.group.is_empty() {
                    details["group"] = route.group.clone().into();
                }
                details["causes"] = json!([{
                    "reason": "FieldValueRequired",
                    "message": "Required value: name or generateName is required",
                    "field": "metadata.name",
                }]);
                let message = format!("{kind} \"\" is invalid: metadata.name: Required value: name or generateName is required");
                return write_json(stream, 422, &status_json(422, "Invalid", &message, details), None);
            }
            if state.objects.get(&route.collection).is_some_and(|objects| objects.contains_key(&name)) {
                drop(state);
                let status = status_json(409, "AlreadyExists", &format!("{qualified} \"{name}\" already exists"), details(&name));
                return write_json(stream, 409, &status, None);
            }
            let stored = state.store(&route.collection, object, "ADDED");
            drop(state);
            shared.changed.notify_all();
            write_json(stream, 201, &stored, None)
        }
        ("PATCH", Some(name)) => {
            let Some(current) = state.objects.get(&route.collection).and_then(|objects| objects.get(name)).cloned() else {
                drop(state);
                let status = status_json(404, "NotFound", &format!("{qualified} \"{name}\" not found"), details(name));
                return write_json(stream, 404, &status, None);
            };
            let Ok(patch) = serde_json::from_slice::<Value>(&request.body) else {
                drop(state);
                let status = status_json(400, "BadRequest", "the body of the request was in an unknown format", Value::Null);
                return write_json(stream, 400, &status, None);
            };
            // A resourceVersion in the patch is a precondition, as in the apiserver.
            let expected = patch["metadata"]["resourceVersion"].as_str();
            if expected.is_some_and(|expected| Some(expected) != current["metadata"]["resourceVersion"].as_str()) {
                drop(state);
                let message = format!(
                    "Operation cannot be fulfilled on {qualified} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                );
                return write_json(stream, 409, &status_json(409, "Conflict", &message, details(name)), None);
            }
            let mut patched = current;
            merge_patch(&mut patched, &patch);
            let stored = state.store(&route.collection, patched, "MODIFIED");
            drop(state);
            shared.changed.notify_all();
            write_json(stream, 200, &stored, None)
        }
        ("DELETE", Some(name)) => match state.delete(&route.collection, name) {
            Some(object) => {
                drop(state);
                shared.changed.notify_all();
                let mut details = details(name);
                details["uid"] = object["metadata"]["uid"].clone();
                let status = json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details });
                write_json(stream, 200, &status, None)
            }
            None => {
                drop(state);
                let status = status_json(404, "NotFound", &format!("{qualified} \"{name}\" not found"), details(name));
                write_json(stream, 404, &status, None)
            }
        },
        _ => {
            drop(state);
            let status =
                status_json(405, "MethodNotAllowed", "the server does not allow this method on the requested resource", Value::Null);
            write_json(stream, 405, &status, None)
        }
    }
}

/// A watch: history after `resourceVersion`, a bookmark, then live changes
/// until `timeoutSeconds`.
fn watch(shared: &Shared, request: &Request, route: &Route, fault: Option<Fault>, stream: &mut TlsStream) -> bool {
    let from: u64 = request.query("resourceVersion").and_then(|text| text.parse().ok()).unwrap_or(0);
    let timeout = Duration::from_secs(request.query("timeoutSeconds").and_then(|text| text.parse().ok()).unwrap_or(1800));
    let bookmarks = request.query("allowWatchBookmarks") == Some("true");
    let close_after = match fault {
        Some(Fault::CloseAfterEvents(count)) => Some(count),
        _ => None,
    };
    if stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").is_err() {
        return false;
    }
    let (compacted, epoch) = {
        let state = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        (state.compacted_below, state.stream_epoch)
    };
    if matches!(fault, Some(Fault::GoneEvent)) || (from != 0 && from < compacted) {
        if !matches!(fault, Some(Fault::GoneEvent)) {
            shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).compacted_served += 1;
        }
        let message = format!("too old resource version: {from} ({})", compacted.max(from + 1));
        let event = json!({ "type": "ERROR", "object": status_json(410, "Expired", &message, Value::Null) });
        let _ = write_chunk(stream, &format!("{event}\n"));
        return end_chunks(stream);
    }
    let deadline = Instant::now() + timeout;
    let mut sent_up_to = from;
    let mut events_sent = 0;
    let mut bookmark_sent = false;
    loop {
        let (events, current) = {
            let mut state = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if state.stream_epoch != epoch {
                // Cut: no final chunk, like a connection that died.
                state.streams_cut += 1;
                return false;
            }
            let events: Vec<Value> = state
                .history
                .iter()
                .filter(|entry| entry.resource_version > sent_up_to && entry.collection == route.collection)
                .filter(|entry| matches_selectors(&entry.object, request))
                .map(|entry| json!({ "type": entry.kind, "object": entry.object }))
                .collect();
            (events, state.resource_version)
        };
        for event in events {
            if close_after == Some(events_sent) {
                // A dropped connection: no final chunk.
                return false;
            }
            if write_chunk(stream, &format!("{event}\n")).is_err() {
                return false;
            }
            events_sent += 1;
        }
        sent_up_to = current;
        {
            let mut state = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let delivered = state.delivered.entry(route.collection.clone()).or_default();
            *delivered = (*delivered).max(current);
        }
        if close_after == Some(events_sent) {
            return false;
        }
        if bookmarks && !bookmark_sent {
            let bookmark = json!({
                "type": "BOOKMARK",
                "object": { "kind": kind_of(&route.plural), "apiVersion": api_version_of(&route.group), "metadata": { "resourceVersion": current.to_string() } },
            });
            if write_chunk(stream, &format!("{bookmark}\n")).is_err() {
                return false;
            }
            bookmark_sent = true;
        }
        let now = Instant::now();
        if now >= deadline {
            return end_chunks(stream);
        }
        let state = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if state.resource_version == sent_up_to {
            let wait = (deadline - now).min(Duration::from_millis(200));
            let _ = shared.changed.wait_timeout(state, wait);
        }
    }
}

fn pod_log(shared: &Shared, request: &Request, (namespace, pod): (&str, &str), fault: Option<Fault>, stream: &mut TlsStream) -> bool {
    let key = format!("{namespace}/{pod}");
    let end_after = match fault {
        Some(Fault::EndLogAfter(bytes)) => bytes,
        _ => usize::MAX,
    };
    let follow = request.query("follow") == Some("true");
    let container = request.query("container").unwrap_or("main").to_string();
    let (text, waiting, exists) = {
        let state = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match state.logs.get(&key) {
            Some(log) => (log.text.clone(), log.waiting, true),
            None => (String::new(), false, false),
        }
    };
    if !exists {
        let status = status_json(404, "NotFound", &format!("pods \"{pod}\" not found"), json!({ "name": pod, "kind": "pods" }));
        return write_json(stream, 404, &status, None);
    }
    if waiting {
        let message = format!("container \"{container}\" in pod \"{pod}\" is waiting to start: ContainerCreating");
        return write_json(stream, 400, &status_json(400, "BadRequest", &message, Value::Null), None);
    }
    if !follow {
        let mut text = text;
        if let Some(tail) = request.query("tailLines").and_then(|value| value.parse::<usize>().ok()) {
            let lines: Vec<&str> = text.lines().collect();
            text = lines[lines.len().saturating_sub(tail)..].iter().map(|line| format!("{line}\n")).collect();
        }
        if let Some(limit) = request.query("limitBytes").and_then(|value| value.parse::<usize>().ok()) {
            text.truncate(limit.min(text.len()));
        }
        let head = format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n", text.len());
        return stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(text.as_bytes())).and_then(|()| stream.flush()).is_ok();
    }
    if stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n").is_err() {
        return false;
    }
    let mut sent = 0;
    let epoch = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).stream_epoch;
    loop {
        let (text, finished) = {
            let mut state = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if state.stream_epoch != epoch {
                state.streams_cut += 1;
                return false;
            }
            let log = state.logs.get(&key);
            let mut text = log.map(|log| log.text.clone()).unwrap_or_default();
            let cut = text.len() >= end_after;
            text.truncate(end_after.min(text.len()));
            (text, cut || log.is_none_or(|log| log.finished))
        };
        if text.len() > sent {
            if write_chunk(stream, &text[sent..]).is_err() {
                return false;
            }
            sent = text.len();
            let mut state = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(log) = state.logs.get_mut(&key) {
                log.followed_up_to = log.followed_up_to.max(sent);
            }
        }
        if finished {
            return end_chunks(stream);
        }
        let state = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = shared.changed.wait_timeout(state, Duration::from_millis(100));
    }
}

fn access_review(shared: &Shared, request: &Request, stream: &mut TlsStream) -> bool {
    let review: Value = serde_json::from_slice(&request.body).unwrap_or_default();
    let attributes = &review["spec"]["resourceAttributes"];
    let verb = attributes["verb"].as_str().unwrap_or_default().to_string();
    let resource = attributes["resource"].as_str().unwrap_or_default().to_string();
    let denied = shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).denied.contains(&(verb, resource));
    let status = if denied { json!({ "allowed": false }) } else { json!({ "allowed": true, "reason": "fake: allowed by default" }) };
    let answer = json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": { "creationTimestamp": null },
        "spec": review["spec"],
        "status": status,
    });
    write_json(stream, 201, &answer, None)
}

// ---- wire helpers ----------------------------------------------------------

/// RFC 7386 JSON merge patch: objects merge, `null` removes, the rest replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (key, value) in patch {
        if value.is_null() {
            if let Some(object) = target.as_object_mut() {
                object.remove(key);
            }
        } else {
            merge_patch(&mut target[key.as_str()], value);
        }
    }
}

/// The apiserver's `Status` for a failure (k8s.io/apimachinery `metav1.Status`).
pub fn status_json(code: u16, reason: &str, message: &str, details: Value) -> Value {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if !details.is_null() {
        status["details"] = details;
    }
    status
}

/// The apiserver's RBAC refusal (`forbiddenMessage` in
/// k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go).
fn rbac_forbidden(request: &Request, route: Option<&Route>, user: &str) -> Value {
    let watching = request.query("watch").is_some_and(|value| value == "1" || value == "true");
    let named = route.is_some_and(|route| route.name.is_some());
    let verb = match request.method.as_str() {
        "POST" => "create",
        "GET" if watching => "watch",
        "GET" if named => "get",
        "GET" => "list",
        "DELETE" => "delete",
        "PATCH" => "patch",
        "PUT" => "update",
        _ => "unknown",
    };
    let (plural, group) = route.map_or(("unknown", ""), |route| (route.plural.as_str(), route.group.as_str()));
    let qualified = if group.is_empty() { plural.to_string() } else { format!("{plural}.{group}") };
    let namespace = namespace_of(route.map_or("", |route| route.collection.as_str()));
    let scope = namespace.map_or_else(|| "at the cluster scope".to_string(), |namespace| format!("in the namespace \"{namespace}\""));
    let object = match route.and_then(|route| route.name.as_ref()) {
        Some(name) => format!("{qualified} \"{name}\""),
        None => qualified,
    };
    let message = format!("{object} is forbidden: User \"{user}\" cannot {verb} resource \"{plural}\" in API group \"{group}\" {scope}");
    let mut details = json!({ "kind": plural });
    if !group.is_empty() {
        details["group"] = group.into();
    }
    status_json(403, "Forbidden", &message, details)
}

fn fault_message(code: u16) -> String {
    match code {
        401 => "Unauthorized".to_string(),
        410 => "too old resource version: 1 (2)".to_string(),
        429 => "Too many requests, please try again later.".to_string(),
        500 => "Internal error occurred: injected fault".to_string(),
        503 => "the server is currently unable to handle the request".to_string(),
        _ => format!("injected fault {code}"),
    }
}

fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        _ => "Unknown",
    }
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

fn write_json(stream: &mut TlsStream, code: u16, body: &Value, retry_after: Option<u64>) -> bool {
    let body = body.to_string();
    let mut head =
        format!("HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n", reason_phrase(code), body.len());
    if let Some(seconds) = retry_after {
        head.push_str(&format!("Retry-After: {seconds}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).and_then(|()| stream.flush()).is_ok()
}

fn write_chunk(stream: &mut TlsStream, data: &str) -> std::io::Result<()> {
    write!(stream, "{:x}\r\n{data}\r\n", data.len())?;
    stream.flush()
}

/// Ends a chunked body and the connection (streams are never reused).
fn end_chunks(stream: &mut TlsStream) -> bool {
    let _ = stream.write_all(b"0\r\n\r\n").and_then(|()| stream.flush());
    false
}

fn version_json() -> Value {
    json!({
        "major": "1",
        "minor": "34",
        "gitVersion": "v1.34.4-fake",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn kind_of(plural: &str) -> &'static str {
    match plural {
        "jobs" => "Job",
        "pods" => "Pod",
        "secrets" => "Secret",
        "configmaps" => "ConfigMap",
        "events" => "Event",
        "namespaces" => "Namespace",
        "persistentvolumeclaims" => "PersistentVolumeClaim",
        _ => "Unknown",
    }
}

fn api_version_of(group: &str) -> String {
    if group.is_empty() { "v1".to_string() } else { format!("{group}/v1") }
}

fn namespace_of(collection: &str) -> Option<String> {
    let mut segments = collection.split('/');
    segments.by_ref().find(|segment| *segment == "namespaces")?;
    segments.next().map(str::to_string)
}

/// `labelSelector` (`k=v`, `k!=v`, `k`) and `fieldSelector` (`a.b=v`, `a.b!=v`).
fn matches_selectors(object: &Value, request: &Request) -> bool {
    let labels = &object["metadata"]["labels"];
    let label_ok = request.query("labelSelector").unwrap_or_default().split(',').filter(|term| !term.is_empty()).all(|term| {
        if let Some((key, value)) = term.split_once("!=") {
            labels[key].as_str() != Some(value)
        } else if let Some((key, value)) = term.split_once('=') {
            labels[key.trim_end_matches('=')].as_str() == Some(value)
        } else {
            labels.get(term).is_some()
        }
    });
    let field = |path: &str| path.split('.').fold(object, |value, key| &value[key]).as_str().unwrap_or_default().to_string();
    let field_ok = request.query("fieldSelector").unwrap_or_default().split(',').filter(|term| !term.is_empty()).all(|term| {
        if let Some((path, value)) = term.split_once("!=") {
            field(path) != value
        } else if let Some((path, value)) = term.split_once('=') {
            field(path.trim_end_matches('=')) == value
        } else {
            false
        }
    });
    label_ok && field_ok
}
