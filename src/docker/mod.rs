//! A small blocking client for the Docker Engine API (v1.41 and later) over
//! its Unix socket, with our own HTTP/1.1 (`http`): no SDK, no async. It
//! knows containers, images, networks, logs and events, and nothing about runs, MCP or
//! Kubernetes; the Docker backend turns these calls into a run.
//!
//! - `socket_path` reads `DOCKER_HOST` (only `unix://` is supported) and
//!   defaults to `/var/run/docker.sock`;
//! - `Client::connect` asks the daemon's version once and refuses one older
//!   than 1.41; later calls use the negotiated version's paths;
//! - every call has a timeout: a per-read timeout (`Options::read_timeout`)
//!   for short calls, an explicit one for `wait`, `image_load` and
//!   `image_pull`, and an idle timeout or an `stream::Abort` for the streams
//!   (`logs`, `events`), which another thread can close;
//! - failures are one `Error` enum whose messages say what to do.
//!
//! Requests are built and answers decoded by small pure functions; `execute`
//! is the only place that does IO. There are no retries: every call here is
//! cheap to repeat, and whether repeating is right (a create that may have
//! happened) is the backend's decision.

pub mod http;
pub mod objects;
pub mod outages;
pub mod stream;
pub mod tar;

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use stream::{Abort, Connection, EventStream, LogStream};

/// The socket when `DOCKER_HOST` is unset, as the Docker CLI has it.
const DEFAULT_SOCKET: &str = "/var/run/docker.sock";
/// The oldest API version we speak (Docker Engine 20.10, Podman 3).
pub const MIN_API_VERSION: (u32, u32) = (1, 41);
/// The newest API version we ask for. Newer daemons still serve it (and
/// Docker 29 no longer serves anything older than 1.44), and every field this
/// client reads or writes means the same from 1.41 to this one.
const MAX_API_VERSION: (u32, u32) = (1, 47);
/// Error bodies are read up to this size for their message.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Timeouts and bounds. `Default` holds the production values; tests shorten them.
#[derive(Clone, Debug)]
pub struct Options {
    /// No byte for this long fails a short call (inspect, create, start, ...).
    pub read_timeout: Duration,
    /// Writing a request (head and body) may block this long per write.
    pub write_timeout: Duration,
    /// The longest JSON answer read (a `list` of many containers included).
    pub max_body_bytes: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options { read_timeout: Duration::from_secs(30), write_timeout: Duration::from_secs(30), max_body_bytes: 16 * 1024 * 1024 }
    }
}

/// What a `wait` waits for (`condition=` of `POST /containers/{id}/wait`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitCondition {
    /// Returns at once for a container that is not running (created or exited).
    NotRunning,
    /// The next exit; ask before `start` so the exit cannot be missed.
    NextExit,
    /// Until the container is removed.
    Removed,
}

impl WaitCondition {
    fn as_query(self) -> &'static str {
        match self {
            WaitCondition::NotRunning => "not-running",
            WaitCondition::NextExit => "next-exit",
            WaitCondition::Removed => "removed",
        }
    }
}

/// Query parameters of a log read.
#[derive(Clone, Debug, Default)]
pub struct LogParams {
    /// Keep the stream open until the container exits.
    pub follow: bool,
    /// Give up when no byte arrives for this long (`None`: wait until the
    /// container exits or the stream is aborted).
    pub idle_timeout: Option<Duration>,
}

/// Filters for `list` and `events`: `label` entries are `key` or `key=value`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filters {
    pub labels: Vec<String>,
}

/// A failed call. Messages name the socket or the request, and say what to
/// do when that is known.
#[derive(Debug)]
pub enum Error {
    /// `DOCKER_HOST` names something other than a Unix socket.
    UnsupportedHost {
        value: String,
    },
    SocketMissing {
        socket: PathBuf,
    },
    /// The socket file exists and nothing accepts on it.
    DaemonNotRunning {
        socket: PathBuf,
    },
    PermissionDenied {
        socket: PathBuf,
    },
    Connect {
        socket: PathBuf,
        source: std::io::Error,
    },
    ApiTooOld {
        socket: PathBuf,
        api_version: String,
    },
    /// A name or id that cannot be sent (empty, or not a valid name).
    InvalidName {
        what: &'static str,
        value: String,
    },
    /// 404: no such image or container.
    NotFound {
        verb: &'static str,
        path: String,
        message: String,
    },
    /// 409: e.g. the name is in use, or the container is not running.
    Conflict {
        verb: &'static str,
        path: String,
        message: String,
    },
    Status {
        verb: &'static str,
        path: String,
        code: u16,
        message: String,
    },
    /// No byte within the call's timeout.
    Timeout {
        verb: &'static str,
        path: String,
    },
    Transport {
        verb: &'static str,
        path: String,
        source: std::io::Error,
    },
    /// The answer is not HTTP we understand.
    Protocol {
        verb: &'static str,
        path: String,
        message: String,
    },
    Decode {
        verb: &'static str,
        path: String,
        message: String,
    },
    TooLarge {
        verb: &'static str,
        path: String,
        limit: usize,
    },
    /// A pull or load answered 200 and then reported a failure in its stream.
    Progress {
        verb: &'static str,
        path: String,
        message: String,
    },
    Aborted {
        verb: &'static str,
        path: String,
    },
}

impl Error {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Conflict { .. })
    }

    /// True when the daemon could not be reached at all (as opposed to an
    /// answer refusing the call).
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            Error::SocketMissing { .. } | Error::DaemonNotRunning { .. } | Error::PermissionDenied { .. } | Error::Connect { .. }
        )
    }

    /// Maps a read or write failure of a call.
    pub(crate) fn from_io(verb: &'static str, path: &str, source: std::io::Error) -> Error {
        let path = path.to_string();
        match source.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => Error::Timeout { verb, path },
            std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof => {
                Error::Protocol { verb, path, message: source.to_string() }
            }
            _ => Error::Transport { verb, path, source },
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::UnsupportedHost { value } => write!(
                formatter,
                "DOCKER_HOST `{}` is not supported; only a Unix socket is, e.g. unix:///var/run/docker.sock (not tcp://, ssh:// or npipe://)",
                crate::echo::shorten(value)
            ),
            Error::SocketMissing { socket } => write!(
                formatter,
                "docker socket `{}` does not exist; start the Docker daemon (tests: tests/docker/up) or set DOCKER_HOST=unix:///path/to/its.sock",
                socket.display()
            ),
            Error::DaemonNotRunning { socket } => write!(
                formatter,
                "the Docker daemon is not running: nothing accepts on `{}` (connection refused); start dockerd, or set DOCKER_HOST to the socket of one that runs",
                socket.display()
            ),
            Error::PermissionDenied { socket } => write!(
                formatter,
                "permission denied on docker socket `{}`; run as root or as a member of the socket's group (usually `docker`), or set DOCKER_HOST to a socket this user may open",
                socket.display()
            ),
            Error::Connect { socket, source } => write!(formatter, "connecting to docker socket `{}`: {source}", socket.display()),
            Error::ApiTooOld { socket, api_version } => write!(
                formatter,
                "the Docker daemon at `{}` speaks API {api_version}, older than {}.{}; upgrade to Docker Engine 20.10 or later (or Podman 3 or later)",
                socket.display(),
                MIN_API_VERSION.0,
                MIN_API_VERSION.1
            ),
            Error::InvalidName { what, value } => write!(formatter, "{what} `{}` is not a valid name", crate::echo::shorten(value)),
            Error::NotFound { verb, path, message } => write!(formatter, "{verb} {path}: 404: {message}"),
            Error::Conflict { verb, path, message } => write!(formatter, "{verb} {path}: 409: {message}"),
            Error::Status { verb, path, code, message } => write!(formatter, "{verb} {path}: {code}: {message}"),
            Error::Timeout { verb, path } => write!(formatter, "{verb} {path}: no answer from the Docker daemon within the call's timeout"),
            Error::Transport { verb, path, source } => write!(formatter, "{verb} {path}: {source}"),
            Error::Protocol { verb, path, message } => write!(formatter, "{verb} {path}: bad HTTP answer: {message}"),
            Error::Decode { verb, path, message } => write!(formatter, "{verb} {path}: cannot decode the answer: {message}"),
            Error::TooLarge { verb, path, limit } => write!(formatter, "{verb} {path}: answer longer than {limit} bytes"),
            Error::Progress { verb, path, message } => write!(formatter, "{verb} {path}: {message}"),
            Error::Aborted { verb, path } => write!(formatter, "{verb} {path}: aborted"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Connect { source, .. } | Error::Transport { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The socket `DOCKER_HOST` names (`unix:///path`), or `DEFAULT_SOCKET`
/// when it is unset or empty (pure).
pub fn socket_path(docker_host: Option<&str>) -> Result<PathBuf, Error> {
    let Some(value) = docker_host.map(str::trim).filter(|value| !value.is_empty()) else {
        return Ok(PathBuf::from(DEFAULT_SOCKET));
    };
    match value.strip_prefix("unix://") {
        Some(path) if path.starts_with('/') => Ok(PathBuf::from(path)),
        _ => Err(Error::UnsupportedHost { value: value.to_string() }),
    }
}

/// Parses `1.41` into `(1, 41)` (pure).
pub fn parse_api_version(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The version to use with a daemon whose newest is `daemon`: refused when
/// older than `MIN_API_VERSION`, capped at `MAX_API_VERSION` (pure).
fn negotiate(daemon: &str) -> Option<(u32, u32)> {
    let version = parse_api_version(daemon)?;
    if version < MIN_API_VERSION {
        return None;
    }
    Some(version.min(MAX_API_VERSION))
}

/// Percent-encodes everything but RFC 3986's unreserved characters and the
/// bytes in `keep` (pure).
pub fn percent_encode(text: &str, keep: &[u8]) -> String {
    let mut encoded = String::with_capacity(text.len());
    for &byte in text.as_bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) || keep.contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The `filters=` value of list and events: JSON such as
/// `{"label":["a=b"],"type":["container"]}`, percent-encoded (pure).
/// `None` when there is nothing to filter on.
fn filters_query(filters: &Filters, kinds: &[&str]) -> Option<String> {
    let mut map: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    if !filters.labels.is_empty() {
        map.insert("label", filters.labels.iter().map(String::as_str).collect());
    }
    if !kinds.is_empty() {
        map.insert("type", kinds.to_vec());
    }
    if map.is_empty() {
        return None;
    }
    // A map of string lists always serializes.
    let json = serde_json::to_string(&map).unwrap_or_default();
    Some(percent_encode(&json, &[]))
}

/// A connection to one daemon; clones share it. Each call opens its own
/// connection to the socket (see `http`).
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    socket: PathBuf,
    /// `/v1.41` (the negotiated version).
    prefix: String,
    version: objects::Version,
    options: Options,
    outages: outages::Outages,
}

/// A request body: its type, the bytes and their length (Content-Length).
struct Payload<'a> {
    content_type: &'static str,
    reader: &'a mut dyn Read,
    len: u64,
}

/// One request, before any IO.
struct Request<'a> {
    verb: &'static str,
    /// Path and query, versioned.
    path: String,
    payload: Option<Payload<'a>>,
    /// Per-read timeout; `None` waits for ever (streams that `Abort` closes).
    read_timeout: Option<Duration>,
    /// Asks for the connection as a raw stream (`Upgrade: tcp`, attach).
    upgrade: bool,
}

/// An answer's head and its body, still on the connection.
struct Response {
    head: http::Head,
    body: http::Body<Connection>,
}

impl Client {
    /// `connect` to the socket `DOCKER_HOST` names, or the default one.
    pub fn from_env(options: Options) -> Result<Client, Error> {
        let docker_host = std::env::var("DOCKER_HOST").ok();
        Client::connect(&socket_path(docker_host.as_deref())?, options)
    }

    /// Asks the daemon at `socket` for its version and negotiates the API
    /// version the calls will use; refuses a daemon older than 1.41.
    pub fn connect(socket: &Path, options: Options) -> Result<Client, Error> {
        let probe = Client {
            inner: Arc::new(Inner {
                socket: socket.to_path_buf(),
                prefix: String::new(),
                version: objects::Version::default(),
                options: options.clone(),
                outages: outages::Outages::default(),
            }),
        };
        // `/version` without a version prefix answers on every daemon.
        let version: objects::Version = probe.json(probe.request("GET", "/version".to_string()))?;
        let Some((major, minor)) = negotiate(&version.api_version) else {
            return Err(Error::ApiTooOld { socket: socket.to_path_buf(), api_version: version.api_version });
        };
        let prefix = format!("/v{major}.{minor}");
        Ok(Client {
            inner: Arc::new(Inner { socket: socket.to_path_buf(), prefix, version, options, outages: outages::Outages::default() }),
        })
    }

    /// The ended outage (a stretch without answers) that `at` lies in.
    pub fn outage_around(&self, at: std::time::SystemTime) -> Option<outages::Outage> {
        self.inner.outages.around(at)
    }

    pub fn socket(&self) -> &Path {
        &self.inner.socket
    }

    /// The daemon's version as `connect` read it.
    pub fn version(&self) -> &objects::Version {
        &self.inner.version
    }

    /// The API version the calls use, e.g. `1.41`.
    pub fn api_version(&self) -> &str {
        self.inner.prefix.trim_start_matches("/v")
    }

    pub fn options(&self) -> &Options {
        &self.inner.options
    }

    /// `GET /_ping`: the daemon answers.
    pub fn ping(&self) -> Result<(), Error> {
        self.bytes(self.request("GET", "/_ping".to_string())).map(|_| ())
    }

    /// `GET /info`.
    pub fn info(&self) -> Result<objects::Info, Error> {
        self.json(self.request("GET", self.versioned("/info")))
    }

    /// `GET /images/{name}/json`; a missing image is `Error::NotFound`.
    pub fn image_inspect(&self, image: &str) -> Result<objects::ImageInspect, Error> {
        let path = format!("/images/{}/json", image_segment(image)?);
        self.json(self.request("GET", self.versioned(&path)))
    }

    /// `image_inspect`, with a missing image as `false`.
    pub fn image_exists(&self, image: &str) -> Result<bool, Error> {
        match self.image_inspect(image) {
            Ok(_) => Ok(true),
            Err(error) if error.is_not_found() => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// `POST /images/create?fromImage=` (a pull). The caller decides whether
    /// pulls are allowed; this only makes the call, and reads the progress
    /// stream to its end, since a failure arrives inside it.
    pub fn image_pull(&self, image: &str, timeout: Duration) -> Result<(), Error> {
        let (name, tag) = split_tag(image);
        let mut path = format!("/images/create?fromImage={}", percent_encode(name, b"/:"));
        if let Some(tag) = tag {
            path.push_str(&format!("&tag={}", percent_encode(tag, b"")));
        }
        let mut empty: &[u8] = &[];
        let request = Request {
            payload: Some(Payload { content_type: "text/plain", reader: &mut empty, len: 0 }),
            read_timeout: Some(timeout),
            ..self.request("POST", self.versioned(&path))
        };
        self.progress(request)
    }

    /// `POST /images/load` with a docker-archive tar (the `docker save` form;
    /// Docker 20.10 does not read OCI archives here).
    pub fn image_load(&self, archive: &Path, timeout: Duration) -> Result<(), Error> {
        let path = self.versioned("/images/load?quiet=1");
        let mut file = std::fs::File::open(archive).map_err(|source| Error::Transport { verb: "POST", path: path.clone(), source })?;
        let len = file.metadata().map_err(|source| Error::Transport { verb: "POST", path: path.clone(), source })?.len();
        let request = Request {
            payload: Some(Payload { content_type: "application/x-tar", reader: &mut file, len }),
            read_timeout: Some(timeout),
            ..self.request("POST", path.clone())
        };
        self.progress(request)
    }

    /// `DELETE /images/{name}`: untags it, and deletes it when no other tag
    /// or container uses it. A missing image is `Error::NotFound`, one a
    /// container uses `Error::Conflict`.
    pub fn image_remove(&self, image: &str) -> Result<(), Error> {
        let path = format!("/images/{}", image_segment(image)?);
        self.bytes(self.request("DELETE", self.versioned(&path))).map(|_| ())
    }

    /// `POST /containers/create?name=`; `name` empty lets Docker choose one.
    pub fn container_create(&self, name: &str, spec: &objects::ContainerSpec) -> Result<objects::CreatedContainer, Error> {
        let mut path = "/containers/create".to_string();
        if !name.is_empty() {
            path.push_str(&format!("?name={}", container_segment(name)?));
        }
        self.post_json(self.versioned(&path), spec)
    }

    /// `POST /containers/{id}/start`. Starting a running container is not an error.
    pub fn container_start(&self, id: &str) -> Result<(), Error> {
        let path = format!("/containers/{}/start", container_segment(id)?);
        self.post_empty(&path)
    }

    /// `POST /containers/{id}/wait?condition=`: blocks until the condition
    /// holds, at most `timeout`, or until `abort` closes it.
    pub fn container_wait(
        &self,
        id: &str,
        condition: WaitCondition,
        timeout: Duration,
        abort: Option<&Abort>,
    ) -> Result<objects::WaitResponse, Error> {
        let path = format!("/containers/{}/wait?condition={}", container_segment(id)?, condition.as_query());
        let mut empty: &[u8] = &[];
        let request = Request {
            payload: Some(Payload { content_type: "application/json", reader: &mut empty, len: 0 }),
            read_timeout: Some(timeout),
            ..self.request("POST", self.versioned(&path))
        };
        let verb = request.verb;
        let path = request.path.clone();
        let response = self.execute(request, abort)?;
        let response = check_status(verb, &path, response)?;
        let bytes = read_body(verb, &path, response, self.inner.options.max_body_bytes, abort)?;
        decode(verb, &path, &bytes)
    }

    /// `GET /containers/{id}/json`; a missing container is `Error::NotFound`.
    pub fn container_inspect(&self, id: &str) -> Result<objects::ContainerInspect, Error> {
        let path = format!("/containers/{}/json", container_segment(id)?);
        self.json(self.request("GET", self.versioned(&path)))
    }

    /// `GET /containers/{id}/logs?stdout=1&stderr=1&since=0`, followed or
    /// not: a `BufRead` of stdout, stderr kept aside (see `stream`).
    pub fn container_logs(&self, id: &str, params: &LogParams) -> Result<LogStream, Error> {
        self.container_logs_since(id, params, 0)
    }

    /// `container_logs` from Unix second `since` on.
    pub fn container_logs_since(&self, id: &str, params: &LogParams, since: u64) -> Result<LogStream, Error> {
        let follow = if params.follow { "1" } else { "0" };
        let path = format!("/containers/{}/logs?follow={follow}&stdout=1&stderr=1&since={since}", container_segment(id)?);
        let request = Request { read_timeout: params.idle_timeout, ..self.request("GET", self.versioned(&path)) };
        let path = request.path.clone();
        let abort = Abort::new();
        let response = self.execute(request, Some(&abort))?;
        let response = check_status("GET", &path, response)?;
        Ok(LogStream::new(path, response.body, abort))
    }

    /// `POST /containers/{id}/kill?signal=` (e.g. `KILL`, `TERM`). A
    /// container that is not running is `Error::Conflict`.
    pub fn container_kill(&self, id: &str, signal: &str) -> Result<(), Error> {
        let path = format!("/containers/{}/kill?signal={}", container_segment(id)?, percent_encode(signal, b""));
        self.post_empty(&path)
    }

    /// `DELETE /containers/{id}?force=1&v=1`: kills it if it runs, and
    /// removes its anonymous volumes. A missing container is `Error::NotFound`.
    pub fn container_remove(&self, id: &str) -> Result<(), Error> {
        let path = format!("/containers/{}?force=1&v=1", container_segment(id)?);
        self.bytes(self.request("DELETE", self.versioned(&path))).map(|_| ())
    }

    /// `GET /volumes/{name}`, with a missing volume as `false`.
    pub fn volume_exists(&self, name: &str) -> Result<bool, Error> {
        let path = format!("/volumes/{}", container_segment(name)?);
        match self.bytes(self.request("GET", self.versioned(&path))) {
            Ok(_) => Ok(true),
            Err(error) if error.is_not_found() => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// `GET /networks/{name}`; a missing network is `Error::NotFound`.
    pub fn network_inspect(&self, name: &str) -> Result<objects::NetworkInspect, Error> {
        let path = format!("/networks/{}", network_segment(name)?);
        self.json(self.request("GET", self.versioned(&path)))
    }

    /// `GET /networks`: every network, for a lookup by exact name. Docker
    /// does not make names unique (two creates at once both succeed, and a
    /// lookup by that name is then ambiguous), so callers choose by id.
    pub fn network_list(&self) -> Result<Vec<objects::NetworkInspect>, Error> {
        self.json(self.request("GET", self.versioned("/networks")))
    }

    /// `POST /networks/create`. A name in use is `Error::Conflict` (with
    /// `check_duplicate`; Docker 20.10 answers 409 for it).
    pub fn network_create(&self, spec: &objects::NetworkSpec) -> Result<objects::CreatedNetwork, Error> {
        network_segment(&spec.name)?;
        self.post_json(self.versioned("/networks/create"), spec)
    }

    /// `DELETE /networks/{name}`. A missing network is `Error::NotFound`,
    /// one with containers attached `Error::Conflict` (or a 403 `Status`).
    pub fn network_remove(&self, name: &str) -> Result<(), Error> {
        let path = format!("/networks/{}", network_segment(name)?);
        self.bytes(self.request("DELETE", self.versioned(&path))).map(|_| ())
    }

    /// `GET /containers/json?all=1&filters=`: every container (running or
    /// not) matching `filters`.
    pub fn container_list(&self, filters: &Filters) -> Result<Vec<objects::ContainerSummary>, Error> {
        let mut path = "/containers/json?all=1".to_string();
        if let Some(query) = filters_query(filters, &[]) {
            path.push_str(&format!("&filters={query}"));
        }
        self.json(self.request("GET", self.versioned(&path)))
    }

    /// `PUT /containers/{id}/archive?path=`: unpacks `tar` (see `tar`) into
    /// the container's filesystem at `directory`, which must exist. Works on
    /// a created container before its start.
    pub fn container_put_archive(&self, id: &str, directory: &str, tar: &[u8]) -> Result<(), Error> {
        let path = format!("/containers/{}/archive?path={}", container_segment(id)?, percent_encode(directory, b"/"));
        let mut reader = tar;
        self.bytes(Request {
            payload: Some(Payload { content_type: "application/x-tar", reader: &mut reader, len: tar.len() as u64 }),
            ..self.request("PUT", self.versioned(&path))
        })
        .map(|_| ())
    }

    /// `POST /containers/{id}/attach?stream=1&stdin=1&stdout=1&stderr=1`,
    /// upgraded to a raw stream (`101`, or `200` from old daemons): writes
    /// `bytes` to the running container's stdin and ends it (on a container
    /// created with `StdinOnce` the daemon then closes its stdin, so the
    /// process reads exactly `bytes` and an end-of-file), and returns the
    /// container's output from then on, as a followed log is read: the
    /// connection that delivered the input carries the output back, without
    /// the log file's round trip. The log keeps it all the same. The
    /// stream ends when the container stops.
    pub fn container_attach(&self, id: &str, bytes: &[u8]) -> Result<LogStream, Error> {
        self.attach(id, bytes, true)
    }

    /// `container_attach` that leaves the input open: on a container
    /// without `StdinOnce` the daemon ends the attach's output as soon as
    /// its input ends, so a session's call keeps it open while it reads.
    pub fn container_attach_open(&self, id: &str, bytes: &[u8]) -> Result<LogStream, Error> {
        self.attach(id, bytes, false)
    }

    fn attach(&self, id: &str, bytes: &[u8], end_input: bool) -> Result<LogStream, Error> {
        let path = format!("/containers/{}/attach?stream=1&stdin=1&stdout=1&stderr=1", container_segment(id)?);
        let request = Request { upgrade: true, ..self.request("POST", self.versioned(&path)) };
        let path = request.path.clone();
        let abort = Abort::new();
        let response = check_status("POST", &path, self.execute(request, Some(&abort))?)?;
        if !matches!(response.head.status, 101 | 200) {
            let message = format!("expected `101` (a raw stream) and got `{} {}`", response.head.status, response.head.reason);
            return Err(Error::Protocol { verb: "POST", path, message });
        }
        let mut stream = response.body.get_ref().get_ref();
        stream.write_all(bytes).and_then(|()| stream.flush()).map_err(|source| Error::from_io("POST", &path, source))?;
        if end_input {
            // The end of the input: the daemon closes the container's stdin.
            stream.shutdown(std::net::Shutdown::Write).map_err(|source| Error::from_io("POST", &path, source))?;
        }
        // From here it is read as a followed log is: a quiet command is no
        // failed read (the per-read timeout held only for the answer's head).
        stream.set_read_timeout(None).map_err(|source| Error::from_io("POST", &path, source))?;
        Ok(LogStream::new(path, response.body, abort))
    }

    /// `GET /events?filters=` of containers, from now (or Unix second
    /// `since`) on; `idle_timeout` as for logs.
    pub fn events(&self, filters: &Filters, since: Option<i64>, idle_timeout: Option<Duration>) -> Result<EventStream, Error> {
        let mut path = "/events?".to_string();
        if let Some(since) = since {
            path.push_str(&format!("since={since}&"));
        }
        if let Some(query) = filters_query(filters, &["container"]) {
            path.push_str(&format!("filters={query}"));
        }
        let request = Request { read_timeout: idle_timeout, ..self.request("GET", self.versioned(path.trim_end_matches(['&', '?']))) };
        let path = request.path.clone();
        let abort = Abort::new();
        let response = self.execute(request, Some(&abort))?;
        let response = check_status("GET", &path, response)?;
        Ok(EventStream::new(path, response.body, abort))
    }

    fn versioned(&self, path: &str) -> String {
        format!("{}{path}", self.inner.prefix)
    }

    fn request(&self, verb: &'static str, path: String) -> Request<'static> {
        Request { verb, path, payload: None, read_timeout: Some(self.inner.options.read_timeout), upgrade: false }
    }

    /// A POST without a body whose answer has none either (204).
    fn post_empty(&self, path: &str) -> Result<(), Error> {
        let mut empty: &[u8] = &[];
        self.bytes(Request {
            payload: Some(Payload { content_type: "application/json", reader: &mut empty, len: 0 }),
            ..self.request("POST", self.versioned(path))
        })
        .map(|_| ())
    }

    /// `POST path` with `body` as JSON; the answer decoded.
    fn post_json<T: serde::de::DeserializeOwned>(&self, path: String, body: &impl serde::Serialize) -> Result<T, Error> {
        let body =
            serde_json::to_vec(body).map_err(|error| Error::Decode { verb: "POST", path: path.clone(), message: error.to_string() })?;
        let mut reader: &[u8] = &body;
        let len = body.len() as u64;
        self.json(Request {
            payload: Some(Payload { content_type: "application/json", reader: &mut reader, len }),
            ..self.request("POST", path)
        })
    }

    fn json<T: serde::de::DeserializeOwned>(&self, request: Request<'_>) -> Result<T, Error> {
        let verb = request.verb;
        let path = request.path.clone();
        let bytes = self.bytes(request)?;
        decode(verb, &path, &bytes)
    }

    /// Makes the call and reads the whole answer, under `max_body_bytes`.
    fn bytes(&self, request: Request<'_>) -> Result<Vec<u8>, Error> {
        let verb = request.verb;
        let path = request.path.clone();
        let response = self.execute(request, None)?;
        let response = check_status(verb, &path, response)?;
        read_body(verb, &path, response, self.inner.options.max_body_bytes, None)
    }

    /// Reads a JSON-lines progress stream (pull, load) to its end; the first
    /// line carrying `error` fails the call.
    fn progress(&self, request: Request<'_>) -> Result<(), Error> {
        let verb = request.verb;
        let path = request.path.clone();
        let response = self.execute(request, None)?;
        let mut body = check_status(verb, &path, response)?.body;
        let mut line = Vec::new();
        loop {
            line.clear();
            let read = (&mut body)
                .take(stream::MAX_EVENT_LINE_BYTES as u64)
                .read_until(b'\n', &mut line)
                .map_err(|source| Error::from_io(verb, &path, source))?;
            if read == 0 {
                return Ok(());
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let progress: objects::ProgressLine = decode(verb, &path, &line)?;
            if !progress.error.is_empty() {
                return Err(Error::Progress { verb, path, message: progress.error });
            }
        }
    }

    /// The only IO: connects, writes the request, reads the answer's head.
    fn execute(&self, request: Request<'_>, abort: Option<&Abort>) -> Result<Response, Error> {
        let Request { verb, path, payload, read_timeout, upgrade } = request;
        let aborted = |error: Error| match abort {
            Some(abort) if abort.is_aborted() => Error::Aborted { verb, path: path.clone() },
            _ => error,
        };
        let socket = connect(&self.inner.socket).inspect_err(|error| {
            if error.is_unreachable() {
                self.inner.outages.unreachable(std::time::SystemTime::now());
            }
        })?;
        let io_error = |source: std::io::Error| Error::from_io(verb, &path, source);
        socket.set_read_timeout(read_timeout).map_err(io_error)?;
        socket.set_write_timeout(Some(self.inner.options.write_timeout)).map_err(io_error)?;
        if let Some(abort) = abort {
            let handle = socket.try_clone().map_err(io_error)?;
            abort.register(handle).map_err(|()| Error::Aborted { verb, path: path.clone() })?;
        }
        let (content_type, len) = match &payload {
            Some(payload) => (Some(payload.content_type), Some(payload.len)),
            None => (None, None),
        };
        let mut writer = std::io::BufWriter::new(&socket);
        let write = |writer: &mut std::io::BufWriter<&UnixStream>| -> std::io::Result<()> {
            let head = if upgrade { http::upgrade_request_head(verb, &path) } else { http::request_head(verb, &path, content_type, len) };
            writer.write_all(&head)?;
            if let Some(payload) = payload {
                let copied = std::io::copy(&mut payload.reader.take(payload.len), writer)?;
                if copied != payload.len {
                    return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "request body shorter than its length"));
                }
            }
            writer.flush()
        };
        write(&mut writer).map_err(|source| aborted(Error::from_io(verb, &path, source)))?;
        drop(writer);
        let mut reader = std::io::BufReader::new(socket);
        let head_bytes = http::read_head_bytes(&mut reader)
            .map_err(|source| aborted(Error::from_io(verb, &path, source)))?
            .map_err(|error| aborted(Error::Protocol { verb, path: path.clone(), message: error.to_string() }))?;
        self.inner.outages.answered(std::time::SystemTime::now());
        let head =
            http::parse_head(&head_bytes).map_err(|error| Error::Protocol { verb, path: path.clone(), message: error.to_string() })?;
        // An upgraded connection is the raw stream from here to its close.
        let framing = match (upgrade, head.status) {
            (true, 101) => http::Framing::UntilClose,
            _ => http::framing(&head).map_err(|error| Error::Protocol { verb, path: path.clone(), message: error.to_string() })?,
        };
        Ok(Response { head, body: http::Body::new(reader, framing) })
    }
}

/// Connects to the socket, naming the usual failures.
fn connect(socket: &Path) -> Result<UnixStream, Error> {
    // A Unix connect does not wait for the daemon: it fails at once unless
    // the listen backlog is full, so std's lack of a connect timeout here
    // costs nothing in practice.
    UnixStream::connect(socket).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => Error::SocketMissing { socket: socket.to_path_buf() },
        std::io::ErrorKind::ConnectionRefused => Error::DaemonNotRunning { socket: socket.to_path_buf() },
        std::io::ErrorKind::PermissionDenied => Error::PermissionDenied { socket: socket.to_path_buf() },
        _ => Error::Connect { socket: socket.to_path_buf(), source },
    })
}

/// Turns a 4xx/5xx answer into an `Error` carrying the daemon's message.
fn check_status(verb: &'static str, path: &str, response: Response) -> Result<Response, Error> {
    let code = response.head.status;
    if code < 400 {
        return Ok(response);
    }
    let mut body = response.body;
    // The message is a courtesy: a body we cannot read still leaves the code.
    let bytes = http::read_to_end_capped(&mut body, MAX_ERROR_BODY_BYTES).ok().and_then(Result::ok).unwrap_or_default();
    let message = error_message(&bytes, &response.head.reason);
    let path = path.to_string();
    Err(match dockers_code(code, &message) {
        404 => Error::NotFound { verb, path, message },
        409 => Error::Conflict { verb, path, message },
        _ => Error::Status { verb, path, code, message },
    })
}

/// The ends of messages that Podman's (4.3) Docker-compatible API sends
/// with 500 where dockerd answers 404 or 409, with dockerd's code: a create
/// whose name is taken (the backend's "first writer wins" depends on the
/// conflict), a network create whose name is taken, a call in the wrong
/// state such as a kill of an exited container (libpod's
/// `ErrCtrStateInvalid`), and an inspect that races the container's removal
/// (libpod's `ErrNoSuchCtr`, "does not exist in database"). libpod puts its
/// error's own text at the end of the message.
const PODMAN_500S: [(&str, u16); 4] =
    [("that name is already in use", 409), ("network already exists", 409), ("container state improper", 409), ("no such container", 404)];

/// The code dockerd would have answered (pure): `code`, or for one of
/// Podman's 500s above, dockerd's.
fn dockers_code(code: u16, message: &str) -> u16 {
    let podmans = PODMAN_500S.iter().find(|(end, _)| message.trim_end().ends_with(end));
    match podmans {
        Some((_, dockers)) if code == 500 => *dockers,
        _ => code,
    }
}

/// The `message` of a Docker error body `{"message":"..."}`, else the body's
/// text, else the status line's reason (pure).
fn error_message(body: &[u8], reason: &str) -> String {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        message: String,
    }
    if let Ok(decoded) = serde_json::from_slice::<ErrorBody>(body) {
        return decoded.message;
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() { reason.to_string() } else { crate::echo::shorten(text).into_owned() }
}

fn read_body(verb: &'static str, path: &str, response: Response, limit: usize, abort: Option<&Abort>) -> Result<Vec<u8>, Error> {
    let mut body = response.body;
    let read = http::read_to_end_capped(&mut body, limit).map_err(|source| match abort {
        Some(abort) if abort.is_aborted() => Error::Aborted { verb, path: path.to_string() },
        _ => Error::from_io(verb, path, source),
    })?;
    read.map_err(|limit| Error::TooLarge { verb, path: path.to_string(), limit })
}

fn decode<T: serde::de::DeserializeOwned>(verb: &'static str, path: &str, bytes: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(bytes).map_err(|error| Error::Decode { verb, path: path.to_string(), message: error.to_string() })
}

/// A container id or name as a path segment. Docker names are
/// `[a-zA-Z0-9][a-zA-Z0-9_.-]*` (ids are hex), so anything else is refused
/// here rather than sent.
fn container_segment(id: &str) -> Result<String, Error> {
    let valid = id.bytes().next().is_some_and(|first| first.is_ascii_alphanumeric())
        && id.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"_.-".contains(&byte));
    if !valid {
        return Err(Error::InvalidName { what: "container", value: id.to_string() });
    }
    Ok(id.to_string())
}

/// A network's name or id as a path segment: the same rule as a
/// container's, named as a network in the error.
fn network_segment(name: &str) -> Result<String, Error> {
    container_segment(name).map_err(|_| Error::InvalidName { what: "network", value: name.to_string() })
}

/// An image reference as a path: `/` and `:` stay (the daemon's route takes
/// the rest of the path as the name), everything unusual is encoded.
fn image_segment(image: &str) -> Result<String, Error> {
    if image.is_empty() || image.starts_with('/') || image.contains("..") {
        return Err(Error::InvalidName { what: "image", value: image.to_string() });
    }
    Ok(percent_encode(image, b"/:@"))
}

/// `name:tag` → (`name`, `Some(tag)`); a `:` before the last `/` is a
/// registry port, not a tag (pure).
fn split_tag(image: &str) -> (&str, Option<&str>) {
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name, Some(tag)),
        _ => (image, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_host_is_a_unix_socket_or_unset() {
        assert_eq!(socket_path(None).unwrap(), PathBuf::from("/var/run/docker.sock"));
        assert_eq!(socket_path(Some("")).unwrap(), PathBuf::from("/var/run/docker.sock"));
        assert_eq!(socket_path(Some("unix:///run/user/1000/docker.sock")).unwrap(), PathBuf::from("/run/user/1000/docker.sock"));
        for unsupported in ["tcp://127.0.0.1:2375", "ssh://me@host", "npipe:////./pipe/docker_engine", "unix://", "/var/run/docker.sock"] {
            let error = socket_path(Some(unsupported)).unwrap_err();
            assert!(matches!(error, Error::UnsupportedHost { .. }), "{unsupported}: {error}");
            assert!(error.to_string().contains("only a Unix socket"), "{error}");
        }
    }

    #[test]
    fn api_versions_are_negotiated() {
        assert_eq!(parse_api_version("1.41"), Some((1, 41)));
        assert_eq!(parse_api_version("1.x"), None);
        assert_eq!(negotiate("1.40"), None);
        assert_eq!(negotiate("1.41"), Some((1, 41)));
        assert_eq!(negotiate("1.43"), Some((1, 43)));
        assert_eq!(negotiate("1.51"), Some(MAX_API_VERSION));
        assert_eq!(negotiate("1.9"), None, "minor versions compare as numbers");
        assert_eq!(negotiate(""), None);
    }

    #[test]
    fn filters_are_json_then_url_encoded() {
        let filters = Filters { labels: vec!["mcp-k8s/run=r 1".into(), "owner".into()] };
        let query = filters_query(&filters, &["container"]).unwrap();
        assert_eq!(query, "%7B%22label%22%3A%5B%22mcp-k8s%2Frun%3Dr%201%22%2C%22owner%22%5D%2C%22type%22%3A%5B%22container%22%5D%7D");
        assert_eq!(filters_query(&Filters::default(), &[]), None);
        assert_eq!(percent_encode("a/b:c é", b"/"), "a/b%3Ac%20%C3%A9");
    }

    #[test]
    fn names_are_checked_before_they_are_sent() {
        assert!(container_segment("mcp-run_1.a").is_ok());
        for bad in ["", "-x", "a/b", "a?b", "../x"] {
            assert!(matches!(container_segment(bad), Err(Error::InvalidName { .. })), "{bad}");
        }
        assert_eq!(image_segment("mcp-k8s-test.local:5000/busybox:1.35").unwrap(), "mcp-k8s-test.local:5000/busybox:1.35");
        assert!(image_segment("").is_err() && image_segment("a/../b").is_err());
        assert!(matches!(network_segment("mcp-k8s-open"), Ok(name) if name == "mcp-k8s-open"));
        assert!(matches!(network_segment("a/b"), Err(Error::InvalidName { what: "network", .. })));
        assert_eq!(split_tag("registry:5000/busybox:1.35"), ("registry:5000/busybox", Some("1.35")));
        assert_eq!(split_tag("registry:5000/busybox"), ("registry:5000/busybox", None));
    }

    #[test]
    fn podmans_500s_read_as_dockers_codes() {
        let name_taken = "container create: creating container storage: the container name \"x\" is already in use by ddd. You have to remove that container to be able to reuse that name: that name is already in use";
        let not_running = "can only kill running containers. a72 is in state exited: container state improper";
        let being_removed = "container 5467 does not exist in database: no such container";
        let network_taken = "network name on-docker-network-1 already used: network already exists";
        assert_eq!([name_taken, not_running, being_removed, network_taken].map(|message| dockers_code(500, message)), [409, 409, 404, 409]);
        assert_eq!(dockers_code(500, "container state improper: but something else"), 500);
        assert_eq!(dockers_code(500, "the daemon broke"), 500);
        assert_eq!(dockers_code(404, "No such container: x"), 404);
        assert_eq!(dockers_code(400, being_removed), 400, "only a 500 is read again");
    }

    #[test]
    fn error_messages_come_from_the_body() {
        assert_eq!(error_message(br#"{"message":"No such image: x"}"#, "Not Found"), "No such image: x");
        assert_eq!(error_message(b"plain text\n", "Not Found"), "plain text");
        assert_eq!(error_message(b"", "Not Found"), "Not Found");
    }

    /// A daemon of one connection per answer: `/version`, then the attach,
    /// whose request head and stream it returns.
    fn fake_daemon(name: &str, attach_answer: &'static str) -> (PathBuf, std::thread::JoinHandle<(String, Vec<u8>)>) {
        use std::io::{BufRead, BufReader};
        let socket = std::env::temp_dir().join(format!("fake-dockerd-{}-{name}.sock", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let daemon = std::thread::spawn(move || {
            let read_head = |reader: &mut BufReader<UnixStream>| {
                let mut head = String::new();
                while !head.ends_with("\r\n\r\n") {
                    assert!(reader.read_line(&mut head).unwrap() > 0, "{head}");
                }
                head
            };
            let (version, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(version);
            read_head(&mut reader);
            let body = r#"{"ApiVersion":"1.41","MinAPIVersion":"1.12","Version":"20.10","Os":"linux","Arch":"amd64","KernelVersion":"6"}"#;
            write!(reader.get_mut(), "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
            let (attach, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(attach);
            let head = read_head(&mut reader);
            reader.get_mut().write_all(attach_answer.as_bytes()).unwrap();
            let mut stream = Vec::new();
            reader.read_to_end(&mut stream).unwrap();
            (head, stream)
        });
        (socket, daemon)
    }

    #[test]
    fn an_attach_writes_the_input_ends_it_and_reads_the_output_back() {
        // After the head: the container's stdout, framed as a log is.
        let answer = "HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n\
                      \x01\x00\x00\x00\x00\x00\x00\x06frame\n";
        let (socket, daemon) = fake_daemon("upgraded", answer);
        let client = Client::connect(&socket, Options::default()).unwrap();
        let mut output = client.container_attach("mcp-run-r1", b"the assignment").unwrap();
        let (head, stream) = daemon.join().unwrap();
        assert!(head.starts_with("POST /v1.41/containers/mcp-run-r1/attach?stream=1&stdin=1&stdout=1&stderr=1 HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("Upgrade: tcp\r\n"), "{head}");
        assert_eq!(stream, b"the assignment", "the bytes, then the end of the input");
        let mut read = String::new();
        std::io::Read::read_to_string(&mut output, &mut read).unwrap();
        assert_eq!(read, "frame\n", "the output, unframed, to the end of the stream");

        let (socket, daemon) =
            fake_daemon("missing", "HTTP/1.1 404 Not Found\r\nContent-Length: 37\r\n\r\n{\"message\":\"No such container: abc\"}");
        let client = Client::connect(&socket, Options::default()).unwrap();
        let error = client.container_attach("abc", b"x").unwrap_err();
        assert!(error.is_not_found(), "{error}");
        daemon.join().unwrap();
    }
}
