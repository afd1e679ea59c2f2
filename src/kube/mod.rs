//! A small blocking Kubernetes REST client over ureq. It knows Jobs, Pods,
//! Secrets, ConfigMaps, Events, logs and access reviews, and nothing about
//! runs or MCP.
//!
//! - `Source` says where the cluster comes from (explicit kubeconfig,
//!   in-cluster, or `KUBECONFIG`/`~/.kube/config` like kubectl);
//! - `Client` is cheap to clone and share between threads (an `Arc` around
//!   one pooled ureq `Agent` per cluster); its calls take and return
//!   `serde_json::Value` objects and fail with `kube::Error`;
//! - `watch::Watcher` and `watch::LogStream` are long-lived reads, each on
//!   a connection of its own, so another thread can close them through an
//!   `Abort`.
//!
//! Retries: idempotent calls (GET, LIST, WATCH, DELETE) are retried with
//! exponential backoff, honouring `Retry-After`, on 429, 5xx and connection
//! errors. A POST is retried only when the API says it did not process it
//! (429, or a 5xx carrying `Retry-After`) or when nothing was sent (connect
//! failed). Any call is retried once after a 401 if the credentials could be
//! refreshed (token file re-read, exec plugin re-run).
//!
//! First contact: until this client has had one HTTP answer
//! from the server, a failure to connect (refused, unknown host, connect
//! timeout) is retried only `Options::first_contact_retries` times. Before
//! any answer, the likelier cause is a wrong server URL or port, and
//! spending the whole budget (7.75 s by default) only delays saying so. Once
//! the server has answered, the same failure is an outage and gets the full
//! budget; outages longer than that are the engine's to ride out, up to a
//! run's own deadlines.
//!
//! Requests are built and answers decoded by small pure functions; `execute`
//! is the only place that does IO.

pub mod auth;
pub mod error;
pub mod kubeconfig;
pub mod objects;
pub mod tls;
pub mod watch;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use error::Error;
use watch::{Abort, LogStream, WatchParams, Watcher};

/// Where the server finds its cluster and credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// One kubeconfig file named explicitly (`MCP_K8S_KUBECONFIG`); it must exist.
    KubeconfigFile { path: PathBuf, context: Option<String> },
    /// The files of `KUBECONFIG`, or `~/.kube/config`, merged like kubectl.
    KubeconfigSearch { paths: Vec<PathBuf>, context: Option<String> },
    /// The pod's ServiceAccount (`KUBERNETES_SERVICE_HOST`/`PORT`).
    InCluster { host: String, port: String, service_account_dir: PathBuf },
}

/// The ServiceAccount files every pod gets.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

impl Source {
    /// Chooses like the issue says: the explicit kubeconfig when given, else
    /// in-cluster when its environment is present and no context was asked
    /// for (only kubeconfigs have contexts), else `KUBECONFIG` or
    /// `~/.kube/config`.
    pub fn select(explicit_kubeconfig: Option<&Path>, context: Option<&str>) -> Source {
        Source::select_with(explicit_kubeconfig, context, |name| std::env::var(name).ok())
    }

    /// `select` with the environment passed in, for tests.
    pub fn select_with(explicit_kubeconfig: Option<&Path>, context: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Source {
        let context = context.filter(|name| !name.is_empty()).map(str::to_string);
        if let Some(path) = explicit_kubeconfig.filter(|path| !path.as_os_str().is_empty()) {
            return Source::KubeconfigFile { path: path.to_path_buf(), context };
        }
        let host = env("KUBERNETES_SERVICE_HOST").unwrap_or_default();
        let port = env("KUBERNETES_SERVICE_PORT").unwrap_or_default();
        if !host.is_empty() && !port.is_empty() && context.is_none() {
            return Source::InCluster { host, port, service_account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR) };
        }
        let paths: Vec<PathBuf> = match env("KUBECONFIG").filter(|value| !value.is_empty()) {
            Some(list) => list.split(':').filter(|part| !part.is_empty()).map(PathBuf::from).collect(),
            None => env("HOME")
                .filter(|home| !home.is_empty())
                .map(|home| vec![Path::new(&home).join(".kube").join("config")])
                .unwrap_or_default(),
        };
        Source::KubeconfigSearch { paths, context }
    }

    /// Reads the files the source names into a `ClusterConfig`.
    pub fn load(&self) -> Result<kubeconfig::ClusterConfig, Error> {
        match self {
            Source::KubeconfigFile { path, context } => {
                kubeconfig::Kubeconfig::load(std::slice::from_ref(path), true)?.select(context.as_deref())
            }
            Source::KubeconfigSearch { paths, context } => kubeconfig::Kubeconfig::load(paths, false)?.select(context.as_deref()),
            Source::InCluster { host, port, service_account_dir } => kubeconfig::in_cluster(host, port, service_account_dir),
        }
    }
}

/// Timeouts and retry limits. `Default` holds the production values; tests
/// shorten them.
#[derive(Clone, Debug)]
pub struct Options {
    pub connect_timeout: Duration,
    /// No byte for this long fails a request (and is retried when allowed).
    pub read_timeout: Duration,
    /// Retries after the first attempt, for the cases listed in the module doc.
    pub max_retries: u32,
    /// Retries of a failed connect before the server ever answered (see the
    /// module doc); at most `max_retries`.
    pub first_contact_retries: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// An exec credential plugin running longer is killed.
    pub exec_timeout: Duration,
    /// How long a failed exec plugin run is the answer for every call,
    /// instead of running the plugin again (see `auth::ExecPlugin`).
    pub exec_failure_ttl: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(60),
            max_retries: 5,
            first_contact_retries: 1,
            backoff_base: Duration::from_millis(250),
            backoff_max: Duration::from_secs(10),
            exec_timeout: auth::EXEC_TIMEOUT,
            exec_failure_ttl: auth::EXEC_FAILURE_TTL,
        }
    }
}

/// An API resource type: where it lives and whether it is namespaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource {
    /// `/api/v1` or `/apis/<group>/<version>`.
    pub api_path: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
}

impl Resource {
    pub const JOBS: Resource = Resource { api_path: "/apis/batch/v1", plural: "jobs", namespaced: true };
    pub const PODS: Resource = Resource { api_path: "/api/v1", plural: "pods", namespaced: true };
    pub const SECRETS: Resource = Resource { api_path: "/api/v1", plural: "secrets", namespaced: true };
    pub const CONFIG_MAPS: Resource = Resource { api_path: "/api/v1", plural: "configmaps", namespaced: true };
    pub const EVENTS: Resource = Resource { api_path: "/api/v1", plural: "events", namespaced: true };
    pub const PERSISTENT_VOLUME_CLAIMS: Resource = Resource { api_path: "/api/v1", plural: "persistentvolumeclaims", namespaced: true };
    pub const NAMESPACES: Resource = Resource { api_path: "/api/v1", plural: "namespaces", namespaced: false };
    pub const NODES: Resource = Resource { api_path: "/api/v1", plural: "nodes", namespaced: false };
    pub const ENDPOINT_SLICES: Resource = Resource { api_path: "/apis/discovery.k8s.io/v1", plural: "endpointslices", namespaced: true };
}

/// Selectors for list and watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListParams {
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
}

/// A list answer: the items and the collection's resourceVersion.
#[derive(Clone, Debug, Default)]
pub struct ObjectList {
    pub items: Vec<serde_json::Value>,
    pub resource_version: String,
}

/// Query parameters of a pod log read.
#[derive(Clone, Debug, Default)]
pub struct LogParams {
    pub container: Option<String>,
    /// The API "may return slightly more or slightly less".
    pub limit_bytes: Option<u64>,
    pub tail_lines: Option<u64>,
    /// Only lines from this many seconds ago on (`sinceSeconds`).
    pub since_seconds: Option<u64>,
    /// For follow streams: give up when no byte arrives for this long
    /// (`None`: wait until the container exits or the stream is aborted).
    pub idle_timeout: Option<Duration>,
}

/// Where a `pods/proxy` POST goes: a path on a pod's port, and how long
/// each wait for the pod's answer may take (instead of
/// `Options::read_timeout`).
pub struct ProxyTarget<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub port: u16,
    pub path: &'a str,
    pub read_timeout: Duration,
}

impl ProxyTarget<'_> {
    fn request(&self, body: Vec<u8>) -> Result<ApiRequest, Error> {
        let pod = object_path(Resource::PODS, self.namespace, self.pod)?;
        let path = format!("{pod}:{}/proxy/{}", self.port, self.path.trim_start_matches('/'));
        Ok(ApiRequest { body: Some(body), read_timeout: Some(Some(self.read_timeout)), ..ApiRequest::new("POST", path) })
    }
}

/// A SelfSubjectAccessReview question: may I `verb` this resource here?
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessCheck {
    pub namespace: String,
    pub verb: String,
    /// `""` for the core group, `batch` for Jobs.
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

/// The answer to an `AccessCheck`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessDecision {
    pub allowed: bool,
    pub denied: bool,
    pub reason: String,
    pub evaluation_error: String,
}

/// A connection to one cluster; clones share the agent and credentials.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: tls::ConnectionSettings,
    base_url: String,
    /// From the kubeconfig; an exec plugin's certificate replaces it.
    client_cert: Option<ureq::tls::ClientCert>,
    /// The shared agent and its pool of idle connections; replaced by
    /// `close_idle_connections`.
    agent: Mutex<ureq::Agent>,
    /// The agent for the exec plugin certificate of `generation`.
    exec_agent: Mutex<Option<(u64, ureq::Agent)>>,
    /// Streams' agents, the same two (see `tls::stream_agent`).
    stream_agent: ureq::Agent,
    exec_stream_agent: Mutex<Option<(u64, ureq::Agent)>>,
    auth: auth::Auth,
    impersonation: kubeconfig::Impersonation,
    namespace: String,
    description: String,
    /// For errors: where the server came from, which CAs verify it, and
    /// what a 401 to these credentials means (see `ClusterConfig`).
    origin: String,
    ca_source: String,
    unauthorized_hint: String,
    /// Whether the server has answered anything yet (see the module doc).
    contacted: AtomicBool,
    options: Options,
}

const JSON: &str = "application/json";
/// The `Accept` of a metadata-only list.
const METADATA_ONLY: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

/// One request, before any IO.
#[derive(Clone, Debug)]
pub(crate) struct ApiRequest {
    pub verb: &'static str,
    /// Path and query, e.g. `/api/v1/namespaces/ci/pods?labelSelector=a%3Db`.
    pub path: String,
    pub body: Option<Vec<u8>>,
    /// `Content-Type` of `body`: JSON, or a merge patch for PATCH.
    pub content_type: &'static str,
    /// Per-read timeout instead of `Options::read_timeout` (watches, logs).
    pub read_timeout: Option<Option<Duration>>,
    /// `Accept`: JSON, or metadata only (`list_metadata`).
    pub accept: &'static str,
}

impl Client {
    /// Loads `source` and connects with the default `Options`; nothing is
    /// sent until the first call.
    pub fn new(source: &Source) -> Result<Client, Error> {
        Client::with_options(source, Options::default())
    }

    pub fn with_options(source: &Source, options: Options) -> Result<Client, Error> {
        Client::from_config(source.load()?, options)
    }

    pub fn from_config(config: kubeconfig::ClusterConfig, options: Options) -> Result<Client, Error> {
        if !config.server.starts_with("https://") && !config.server.starts_with("http://") {
            return Err(Error::Config(format!("server `{}` is not an http(s) URL; expected e.g. https://10.0.0.1:6443", config.server)));
        }
        let roots = match &config.certificate_authority {
            Some(pem) => Some(tls::parse_roots(pem, "certificate-authority")?),
            None => None,
        };
        let client_cert = match (&config.client_certificate, &config.client_key) {
            (Some(certificate), Some(key)) => Some(tls::client_cert(certificate, &key.0, "the kubeconfig user")?),
            _ => None,
        };
        let settings = tls::ConnectionSettings {
            server: config.server.clone(),
            tls_server_name: config.tls_server_name.clone(),
            insecure_skip_tls_verify: config.insecure_skip_tls_verify,
            roots,
            proxy_url: config.proxy_url.clone(),
            connect_timeout: options.connect_timeout,
            read_timeout: options.read_timeout,
        };
        let agent = tls::agent(&settings, client_cert.clone())?;
        let stream_agent = tls::stream_agent(&settings, client_cert.clone())?;
        let base_url = settings.base_url()?;
        Ok(Client {
            inner: Arc::new(Inner {
                settings,
                base_url,
                client_cert,
                agent: Mutex::new(agent),
                exec_agent: Mutex::new(None),
                stream_agent,
                exec_stream_agent: Mutex::new(None),
                auth: auth::Auth::new(
                    &config.credentials,
                    auth::ExecLimits { timeout: options.exec_timeout, failure_ttl: options.exec_failure_ttl },
                ),
                impersonation: config.impersonation,
                namespace: config.namespace,
                description: config.description,
                origin: config.origin,
                ca_source: config.ca_source,
                unauthorized_hint: config.unauthorized_hint,
                contacted: AtomicBool::new(false),
                options,
            }),
        })
    }

    /// The namespace of the kubeconfig context, or of the ServiceAccount.
    /// The server's Jobs do not go there: they go to `MCP_K8S_NAMESPACE`
    /// (see `config`); tests and `doctor` use this one.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// What was chosen (file, context, server, kind of auth); never a secret.
    pub fn description(&self) -> &str {
        &self.inner.description
    }

    pub fn options(&self) -> &Options {
        &self.inner.options
    }

    /// `GET /version`.
    pub fn version(&self) -> Result<serde_json::Value, Error> {
        self.json(ApiRequest::new("GET", "/version".to_string()))
    }

    /// `POST` an object; the answer is the object as stored.
    pub fn create(&self, resource: Resource, namespace: &str, object: &serde_json::Value) -> Result<serde_json::Value, Error> {
        let path = collection_path(resource, namespace)?;
        let body =
            serde_json::to_vec(object).map_err(|error| Error::Decode { verb: "POST", path: path.clone(), message: error.to_string() })?;
        self.json(ApiRequest { body: Some(body), ..ApiRequest::new("POST", path) })
    }

    pub fn get(&self, resource: Resource, namespace: &str, name: &str) -> Result<serde_json::Value, Error> {
        self.json(ApiRequest::new("GET", object_path(resource, namespace, name)?))
    }

    /// `get`, with NotFound as `None`.
    pub fn get_if_exists(&self, resource: Resource, namespace: &str, name: &str) -> Result<Option<serde_json::Value>, Error> {
        match self.get(resource, namespace, name) {
            Ok(object) => Ok(Some(object)),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    pub fn list(&self, resource: Resource, namespace: &str, params: &ListParams) -> Result<ObjectList, Error> {
        self.list_accepting(resource, namespace, params, JSON)
    }

    /// `list`, but the API server sends each object's metadata only
    /// (`PartialObjectMetadataList`): for objects whose content this server
    /// must not receive, such as Secrets it does not own.
    pub fn list_metadata(&self, resource: Resource, namespace: &str, params: &ListParams) -> Result<ObjectList, Error> {
        self.list_accepting(resource, namespace, params, METADATA_ONLY)
    }

    fn list_accepting(&self, resource: Resource, namespace: &str, params: &ListParams, accept: &'static str) -> Result<ObjectList, Error> {
        let path = with_query(&collection_path(resource, namespace)?, &list_query(params));
        let request = ApiRequest { accept, ..ApiRequest::new("GET", path) };
        decode_list(&request, self.json(request.clone())?)
    }

    /// Deletes with `propagationPolicy=Background`; `Ok(false)` when the
    /// object was already gone.
    /// Deletes with `propagationPolicy=Background`: a Job deleted without
    /// it orphans its pods, so every delete names it.
    pub fn delete(&self, resource: Resource, namespace: &str, name: &str) -> Result<bool, Error> {
        let path = with_query(&object_path(resource, namespace, name)?, &[("propagationPolicy", "Background".to_string())]);
        match self.json(ApiRequest::new("DELETE", path)) {
            Ok(_) => Ok(true),
            Err(error) if error.is_not_found() => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// `PATCH` with a JSON merge patch (RFC 7386): only the fields in
    /// `patch` change, so concurrent writers of other fields do not clash.
    pub fn merge_patch(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<serde_json::Value, Error> {
        let path = object_path(resource, namespace, name)?;
        let body = patch.to_string().into_bytes();
        self.json(ApiRequest { body: Some(body), content_type: "application/merge-patch+json", ..ApiRequest::new("PATCH", path) })
    }

    /// A pod's log, read once (not followed).
    pub fn pod_logs(&self, namespace: &str, pod: &str, params: &LogParams) -> Result<Vec<u8>, Error> {
        let request = ApiRequest::new("GET", log_path(namespace, pod, params, false)?);
        let response = self.execute(&request, None)?;
        let response = check_status(&request, response)?;
        read_body(&request, response)
    }

    /// A followed pod log, readable line by line as it is written; ends when
    /// the container exits. Before the container starts the API answers 400
    /// ("is waiting to start"): the caller decides whether to wait and retry.
    pub fn follow_pod_logs(&self, namespace: &str, pod: &str, params: &LogParams) -> Result<LogStream, Error> {
        self.pod_log_stream(namespace, pod, params, true)
    }

    /// A pod's log as a stream: followed (`follow_pod_logs`), or what it
    /// holds now, to its end, without holding it all in memory.
    pub fn pod_log_stream(&self, namespace: &str, pod: &str, params: &LogParams, follow: bool) -> Result<LogStream, Error> {
        let mut request = ApiRequest::new("GET", log_path(namespace, pod, params, follow)?);
        request.read_timeout = Some(params.idle_timeout);
        let abort = Abort::new();
        let response = self.execute(&request, Some(&abort))?;
        let response = check_status(&request, response)?;
        Ok(LogStream::new(request.path, response, abort))
    }

    /// POSTs `body` (JSON) to `path` on a pod's `port` through the API
    /// server's `pods/proxy`, and returns the answer's body. The pod's
    /// answer keeps its status: a non-2xx is `Error::Api`. Like every POST,
    /// retried only when nothing was sent.
    /// `read_timeout` bounds each wait for the pod's answer (through the
    /// API server), instead of `Options::read_timeout`.
    pub fn proxy_post(&self, to: &ProxyTarget, body: Vec<u8>) -> Result<Vec<u8>, Error> {
        let request = to.request(body)?;
        let response = self.execute(&request, None)?;
        let response = check_status(&request, response)?;
        read_body(&request, response)
    }

    /// `proxy_post` with the answer's body streamed rather than read
    /// whole: for answers too large to hold (a sandbox's held output).
    pub fn proxy_post_stream(&self, to: &ProxyTarget, body: Vec<u8>) -> Result<LogStream, Error> {
        let request = to.request(body)?;
        let abort = Abort::new();
        let response = self.execute(&request, Some(&abort))?;
        let response = check_status(&request, response)?;
        Ok(LogStream::new(request.path, response, abort))
    }

    /// Watches `resource` objects matching `params`: a list first, then
    /// changes, surviving dropped connections and 410 Gone.
    pub fn watch(&self, resource: Resource, namespace: &str, params: WatchParams) -> Watcher {
        Watcher::new(self.clone(), resource, namespace.to_string(), params)
    }

    /// SelfSubjectAccessReview: may the current credentials do this?
    pub fn access_review(&self, check: &AccessCheck) -> Result<AccessDecision, Error> {
        let body = access_review_body(check);
        let request = ApiRequest {
            body: Some(body.to_string().into_bytes()),
            ..ApiRequest::new("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews".to_string())
        };
        Ok(decode_access_review(&self.json(request)?))
    }

    // ---- the IO layer ------------------------------------------------------

    /// Sends `request` and decodes a 2xx JSON answer; other codes become
    /// `Error::Api`.
    pub(crate) fn json(&self, request: ApiRequest) -> Result<serde_json::Value, Error> {
        let response = self.execute(&request, None)?;
        let response = check_status(&request, response)?;
        let bytes = read_body(&request, response)?;
        if bytes.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|error| Error::Decode {
            verb: request.verb,
            path: request.path.clone(),
            message: error.to_string(),
        })
    }

    /// Sends `request`, retrying as the module doc says. Returns any HTTP
    /// answer that is not retried; the caller checks its status. With
    /// `stream`, each attempt connects anew and hands its socket to it, so
    /// an abort from another thread closes the connection.
    pub(crate) fn execute(&self, request: &ApiRequest, stream: Option<&Abort>) -> Result<ureq::http::Response<ureq::Body>, Error> {
        let options = &self.inner.options;
        let mut attempt = 0;
        let mut refreshed_after_401 = false;
        loop {
            if stream.is_some_and(Abort::is_aborted) {
                return Err(Error::Aborted { verb: request.verb, path: request.path.clone() });
            }
            let credential = self.inner.auth.credential()?;
            let agent = self.agent_for(&credential, stream)?;
            let outcome = match stream {
                Some(abort) => abort.while_connecting(|| self.send_once(&agent, request, &credential, Sent::Stream)),
                None => self.send_once(&agent, request, &credential, Sent::Call),
            };
            if outcome.is_ok() {
                self.inner.contacted.store(true, Ordering::Relaxed);
            }
            let mut max_retries = options.max_retries;
            let delay = match &outcome {
                Ok(response) if response.status().as_u16() == 401 && !refreshed_after_401 => {
                    refreshed_after_401 = true;
                    if self.inner.auth.refresh_after_unauthorized(&credential)? {
                        crate::log::info("retrying after 401 with refreshed credentials", &[("path", request.path.clone().into())]);
                        continue;
                    }
                    None
                }
                Ok(response) => retry_delay_for_status(request.verb, response, attempt, options),
                Err(error) => {
                    if is_connect_failure(error) && !self.inner.contacted.load(Ordering::Relaxed) {
                        max_retries = options.first_contact_retries.min(options.max_retries);
                    }
                    retry_delay_for_transport(request.verb, error, attempt, options)
                }
            };
            let Some(delay) = delay.filter(|_| attempt < max_retries) else {
                return match outcome {
                    Ok(response) if response.status().as_u16() == 401 => Err(self.unauthorized(request, response)),
                    Ok(response) => Ok(response),
                    Err(error) => Err(self.transport_error(request, error, stream)),
                };
            };
            crate::log::debug(
                "retrying Kubernetes API request",
                &[
                    ("verb", request.verb.into()),
                    ("path", request.path.clone().into()),
                    ("attempt", (attempt + 1).into()),
                    ("delay_ms", (delay.as_millis() as u64).into()),
                ],
            );
            sleep_unless_aborted(delay, stream);
            attempt += 1;
        }
    }

    /// A 401 that a refresh did not cure, with what was sent and what to check.
    fn unauthorized(&self, request: &ApiRequest, response: ureq::http::Response<ureq::Body>) -> Error {
        let status = match check_status(request, response) {
            Err(Error::Api { status, .. }) => status,
            _ => Box::new(error::Status::from_response(401, b"")),
        };
        Error::Unauthorized { verb: request.verb, path: request.path.clone(), status, hint: self.inner.unauthorized_hint.clone() }
    }

    fn transport_error(&self, request: &ApiRequest, error: ureq::Error, stream: Option<&Abort>) -> Error {
        if stream.is_some_and(Abort::is_aborted) {
            return Error::Aborted { verb: request.verb, path: request.path.clone() };
        }
        let place = ServerPlace {
            server: &self.inner.settings.server,
            origin: &self.inner.origin,
            ca_source: &self.inner.ca_source,
            connect_timeout: self.inner.options.connect_timeout,
        };
        Error::Transport { verb: request.verb, path: request.path.clone(), message: transport_message(&error, &place) }
    }

    fn send_once(
        &self,
        agent: &ureq::Agent,
        request: &ApiRequest,
        credential: &auth::Credential,
        sent: Sent,
    ) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let url = format!("{}{}", self.inner.base_url, request.path);
        let mut builder = ureq::http::Request::builder().method(request.verb).uri(&url).header("Accept", request.accept);
        if let Some(authorization) = &credential.authorization {
            builder = builder.header("Authorization", authorization.0.as_str());
        }
        for (name, value) in impersonation_headers(&self.inner.impersonation) {
            builder = builder.header(name, value);
        }
        if request.body.is_some() {
            builder = builder.header("Content-Type", request.content_type);
        }
        let mut http_request = builder.body(request.body.clone().unwrap_or_default()).map_err(ureq::Error::from)?;
        let output_buffer = (sent == Sent::Stream).then(|| stream_output_buffer(&http_request));
        if request.read_timeout.is_some() || output_buffer.is_some() {
            let mut config = agent.configure_request(http_request);
            if let Some(read_timeout) = request.read_timeout {
                config = config.timeout_per_read(read_timeout);
            }
            if let Some(size) = output_buffer {
                config = config.output_buffer_size(size).input_buffer_size(STREAM_INPUT_BUFFER);
            }
            http_request = config.build();
        }
        agent.run(http_request)
    }

    /// Lets go of the connections kept open for the next calls: each holds
    /// its buffers (96 KiB) and its TLS state, which a site nobody uses
    /// should not (800 idle sites held 75 MiB in them). Calls under way
    /// keep theirs until they end, then close them; the next call connects
    /// anew.
    pub fn close_idle_connections(&self) -> Result<(), Error> {
        let fresh = tls::agent(&self.inner.settings, self.inner.client_cert.clone())?;
        // The old agents drop here or when the last call using them ends,
        // and with them their pools.
        *self.inner.agent.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = fresh;
        *self.inner.exec_agent.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
        Ok(())
    }

    /// The shared agent, or one for an exec plugin's certificate; for
    /// streams, the stream agent of either (see `kube::watch`).
    fn agent_for(&self, credential: &auth::Credential, stream: Option<&Abort>) -> Result<ureq::Agent, Error> {
        let Some(certificate) = &credential.client_cert else {
            return Ok(match stream {
                Some(_) => self.inner.stream_agent.clone(),
                None => self.inner.agent.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone(),
            });
        };
        let slot = if stream.is_some() { &self.inner.exec_stream_agent } else { &self.inner.exec_agent };
        let mut slot = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((generation, agent)) = slot.as_ref()
            && *generation == credential.generation
        {
            return Ok(agent.clone());
        }
        let agent = match stream {
            Some(_) => tls::stream_agent(&self.inner.settings, Some(certificate.clone()))?,
            None => tls::agent(&self.inner.settings, Some(certificate.clone()))?,
        };
        *slot = Some((credential.generation, agent.clone()));
        Ok(agent)
    }
}

/// What a request is: a call, or a stream (a watch, a followed log, a
/// held output's fetch) that keeps its connection for as long as it reads.
#[derive(Clone, Copy, PartialEq)]
enum Sent {
    Call,
    Stream,
}

/// The output buffer of a stream's connection (one in its TLS layer, one
/// under it): room for its request head, credentials included, and a body
/// goes out in pieces of it. A stream writes little more than its head,
/// and 256 followed logs held 16 MiB in the 32 KiB that calls get.
fn stream_output_buffer(request: &ureq::http::Request<Vec<u8>>) -> usize {
    let headers: usize = request.headers().iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    let head = request.uri().to_string().len() + headers + 1024;
    head.next_power_of_two().clamp(STREAM_OUTPUT_BUFFER, tls::OUTPUT_BUFFER)
}

/// The smallest output buffer a stream's connection gets.
const STREAM_OUTPUT_BUFFER: usize = 4 << 10;

/// The input buffer of a stream's connection (one in its TLS layer, one
/// under it), half of a call's: a stream is read as it comes, a TLS
/// record in two reads, and a longer response head grows it as for a
/// call. 256 followed logs held 8 MiB in the other half.
const STREAM_INPUT_BUFFER: usize = 8 << 10;

impl ApiRequest {
    pub(crate) fn new(verb: &'static str, path: String) -> ApiRequest {
        ApiRequest { verb, path, body: None, content_type: JSON, read_timeout: None, accept: JSON }
    }
}

// ---- pure request building -------------------------------------------------

/// `/api/v1/namespaces/{ns}/pods` (or `/api/v1/namespaces` when not namespaced).
pub fn collection_path(resource: Resource, namespace: &str) -> Result<String, Error> {
    if !resource.namespaced {
        return Ok(format!("{}/{}", resource.api_path, resource.plural));
    }
    check_name("namespace", namespace)?;
    Ok(format!("{}/namespaces/{namespace}/{}", resource.api_path, resource.plural))
}

fn object_path(resource: Resource, namespace: &str, name: &str) -> Result<String, Error> {
    check_name(resource.plural, name)?;
    Ok(format!("{}/{name}", collection_path(resource, namespace)?))
}

/// Appends a query string, percent-encoding the values.
pub fn with_query(path: &str, query: &[(&str, String)]) -> String {
    if query.is_empty() {
        return path.to_string();
    }
    let pairs: Vec<String> = query.iter().map(|(key, value)| format!("{key}={}", encode_query_value(value))).collect();
    format!("{path}?{}", pairs.join("&"))
}

pub(crate) fn list_query(params: &ListParams) -> Vec<(&'static str, String)> {
    let mut query = Vec::new();
    if let Some(selector) = params.label_selector.as_ref().filter(|selector| !selector.is_empty()) {
        query.push(("labelSelector", selector.clone()));
    }
    if let Some(selector) = params.field_selector.as_ref().filter(|selector| !selector.is_empty()) {
        query.push(("fieldSelector", selector.clone()));
    }
    query
}

fn log_path(namespace: &str, pod: &str, params: &LogParams, follow: bool) -> Result<String, Error> {
    let mut query = Vec::new();
    if let Some(container) = &params.container {
        query.push(("container", container.clone()));
    }
    if follow {
        query.push(("follow", "true".to_string()));
    }
    if let Some(limit_bytes) = params.limit_bytes {
        query.push(("limitBytes", limit_bytes.to_string()));
    }
    if let Some(tail_lines) = params.tail_lines {
        query.push(("tailLines", tail_lines.to_string()));
    }
    if let Some(since_seconds) = params.since_seconds {
        query.push(("sinceSeconds", since_seconds.to_string()));
    }
    Ok(with_query(&format!("{}/log", object_path(Resource::PODS, namespace, pod)?), &query))
}

/// Names go into URL paths unescaped, so they must look like Kubernetes
/// names; this also keeps `..` and `/` out.
fn check_name(what: &str, name: &str) -> Result<(), Error> {
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-' || byte == b'.')
        && !name.starts_with('.');
    if valid {
        return Ok(());
    }
    Err(Error::Config(format!("{what} name `{name}` is not a valid Kubernetes name; use lowercase letters, digits, `-` and `.`")))
}

/// RFC 3986 unreserved characters stay; everything else is %XX.
fn encode_query_value(value: &str) -> String {
    let mut encoded = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

fn impersonation_headers(impersonation: &kubeconfig::Impersonation) -> Vec<(String, String)> {
    let mut headers = Vec::new();
    if let Some(user) = &impersonation.user {
        headers.push(("Impersonate-User".to_string(), user.clone()));
    }
    if let Some(uid) = &impersonation.uid {
        headers.push(("Impersonate-Uid".to_string(), uid.clone()));
    }
    for group in &impersonation.groups {
        headers.push(("Impersonate-Group".to_string(), group.clone()));
    }
    for (key, values) in &impersonation.extra {
        for value in values {
            headers.push((format!("Impersonate-Extra-{}", encode_query_value(key)), value.clone()));
        }
    }
    headers
}

fn access_review_body(check: &AccessCheck) -> serde_json::Value {
    let mut attributes = serde_json::Map::new();
    for (key, value) in [
        ("namespace", &check.namespace),
        ("verb", &check.verb),
        ("group", &check.group),
        ("resource", &check.resource),
        ("subresource", &check.subresource),
        ("name", &check.name),
    ] {
        if !value.is_empty() {
            attributes.insert(key.to_string(), value.clone().into());
        }
    }
    serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": { "resourceAttributes": attributes },
    })
}

// ---- pure response decoding ------------------------------------------------

fn decode_access_review(review: &serde_json::Value) -> AccessDecision {
    let status = &review["status"];
    let text = |key: &str| status[key].as_str().unwrap_or_default().to_string();
    AccessDecision {
        allowed: status["allowed"].as_bool().unwrap_or(false),
        denied: status["denied"].as_bool().unwrap_or(false),
        reason: text("reason"),
        evaluation_error: text("evaluationError"),
    }
}

pub(crate) fn decode_list(request: &ApiRequest, mut list: serde_json::Value) -> Result<ObjectList, Error> {
    let resource_version = list["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string();
    let items = match list.get_mut("items").map(serde_json::Value::take) {
        Some(serde_json::Value::Array(items)) => items,
        Some(serde_json::Value::Null) | None => Vec::new(),
        Some(_) => {
            return Err(Error::Decode { verb: request.verb, path: request.path.clone(), message: "`items` is not a list".to_string() });
        }
    };
    Ok(ObjectList { items, resource_version })
}

/// Turns a non-2xx answer into `Error::Api`, reading its `Status` body.
pub(crate) fn check_status(
    request: &ApiRequest,
    response: ureq::http::Response<ureq::Body>,
) -> Result<ureq::http::Response<ureq::Body>, Error> {
    let code = response.status().as_u16();
    if (200..300).contains(&code) {
        return Ok(response);
    }
    let mut body = Vec::new();
    // An error body is small; a missing one still gives a useful error.
    let _ = response.into_body().into_reader().take(1 << 20).read_to_end(&mut body);
    Err(Error::Api { verb: request.verb, path: request.path.clone(), status: Box::new(error::Status::from_response(code, &body)) })
}

/// Reads a whole answer; lists of many objects can pass ureq's 10 MB default.
pub(crate) fn read_body(request: &ApiRequest, response: ureq::http::Response<ureq::Body>) -> Result<Vec<u8>, Error> {
    response.into_body().with_config().limit(256 << 20).read_to_vec().map_err(|error| Error::Transport {
        verb: request.verb,
        path: request.path.clone(),
        message: error.to_string(),
    })
}

/// What a transport error message names besides the error itself.
struct ServerPlace<'a> {
    server: &'a str,
    origin: &'a str,
    ca_source: &'a str,
    connect_timeout: Duration,
}

/// A transport failure in words that say what to fix: the
/// server URL always, and for TLS the CAs it was checked against.
fn transport_message(error: &ureq::Error, place: &ServerPlace) -> String {
    let ServerPlace { server, origin, ca_source, connect_timeout } = place;
    if let Some(tls_error) = rustls_error(error) {
        let hint = match tls_error {
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            | rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. }) => {
                "check the server URL, or set tls-server-name to a name the certificate holds"
            }
            rustls::Error::InvalidCertificate(
                rustls::CertificateError::Expired
                | rustls::CertificateError::ExpiredContext { .. }
                | rustls::CertificateError::NotValidYet
                | rustls::CertificateError::NotValidYetContext { .. },
            ) => "check this host's clock and the validity dates of the server certificate",
            rustls::Error::InvalidCertificate(_) => {
                "check that this CA is the cluster's (`kubectl config view --raw` shows it) and that this is the right context"
            }
            _ => "check that the server URL points at a Kubernetes API server and that the CA is the cluster's",
        };
        return format!("TLS with `{server}` failed: {tls_error}; the certificate was checked against {ca_source}; {hint}");
    }
    let cause = match error {
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
        ureq::Error::ConnectionFailed => "connection failed".to_string(),
        ureq::Error::HostNotFound => "host not found".to_string(),
        ureq::Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => {
            format!("no connection within {} s", connect_timeout.as_secs())
        }
        other => return format!("{other} (server `{server}`)"),
    };
    format!("cannot connect to `{server}`: {cause}; check that the API server is up and that the server URL is right ({origin})")
}

/// The rustls error inside a ureq error: ureq passes handshake failures up
/// either as its own `Rustls` variant or as an IO error wrapping one.
fn rustls_error(error: &ureq::Error) -> Option<&rustls::Error> {
    match error {
        ureq::Error::Rustls(tls_error) => Some(tls_error),
        ureq::Error::Io(io) => io.get_ref()?.downcast_ref::<rustls::Error>(),
        _ => None,
    }
}

/// The connection was never made: nothing was sent.
fn is_connect_failure(error: &ureq::Error) -> bool {
    match error {
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => true,
        ureq::Error::Io(io) => io.kind() == std::io::ErrorKind::ConnectionRefused,
        ureq::Error::Timeout(timeout) => matches!(timeout, ureq::Timeout::Connect | ureq::Timeout::Resolve),
        _ => false,
    }
}

fn is_idempotent(verb: &str) -> bool {
    matches!(verb, "GET" | "DELETE" | "HEAD" | "PUT")
}

/// How long to wait before retrying an HTTP answer, or `None` for no retry.
fn retry_delay_for_status(verb: &str, response: &ureq::http::Response<ureq::Body>, attempt: u32, options: &Options) -> Option<Duration> {
    let code = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("Retry-After")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let retryable = match code {
        // The API did not process a 429 (priority and fairness, max-in-flight).
        429 => true,
        500..=599 if is_idempotent(verb) => true,
        // A POST only when the server says it may be retried.
        500..=599 => retry_after.is_some(),
        _ => false,
    };
    if !retryable {
        return None;
    }
    Some(retry_after.map_or_else(|| backoff(attempt, options), |delay| delay.min(Duration::from_secs(60))))
}

fn retry_delay_for_transport(verb: &str, error: &ureq::Error, attempt: u32, options: &Options) -> Option<Duration> {
    let nothing_sent = is_connect_failure(error);
    let transient = nothing_sent || matches!(error, ureq::Error::Io(_) | ureq::Error::Timeout(_) | ureq::Error::Protocol(_));
    let retryable = if is_idempotent(verb) { transient } else { nothing_sent };
    retryable.then(|| backoff(attempt, options))
}

pub(crate) fn backoff(attempt: u32, options: &Options) -> Duration {
    let factor = 1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX);
    options.backoff_base.saturating_mul(factor).min(options.backoff_max)
}

pub(crate) fn sleep_unless_aborted(delay: Duration, stream: Option<&Abort>) {
    let Some(abort) = stream else {
        std::thread::sleep(delay);
        return;
    };
    let deadline = std::time::Instant::now() + delay;
    while !abort.is_aborted() {
        let now = std::time::Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(50)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streams_output_buffer_holds_its_head() {
        let request = |token_len: usize| {
            ureq::http::Request::builder()
                .uri("https://10.0.0.1:6443/api/v1/namespaces/ci/pods/p/log?follow=true")
                .header("Authorization", format!("Bearer {}", "t".repeat(token_len)))
                .body(Vec::new())
                .unwrap()
        };
        assert_eq!(stream_output_buffer(&request(1_000)), 4 << 10, "a usual token");
        assert_eq!(stream_output_buffer(&request(10_000)), 16 << 10, "a large token fits");
        assert_eq!(stream_output_buffer(&request(100_000)), tls::OUTPUT_BUFFER, "never more than a call gets");
    }

    #[test]
    fn paths_and_queries() {
        assert_eq!(collection_path(Resource::JOBS, "ci").unwrap(), "/apis/batch/v1/namespaces/ci/jobs");
        assert_eq!(object_path(Resource::NAMESPACES, "", "ci").unwrap(), "/api/v1/namespaces/ci");
        assert_eq!(
            with_query("/api/v1/namespaces/ci/events", &[("fieldSelector", "involvedObject.name=job-1".into())]),
            "/api/v1/namespaces/ci/events?fieldSelector=involvedObject.name%3Djob-1"
        );
        let params = LogParams {
            container: Some("main".into()),
            limit_bytes: Some(10),
            tail_lines: Some(5),
            since_seconds: None,
            idle_timeout: None,
        };
        assert_eq!(
            log_path("ci", "p", &params, true).unwrap(),
            "/api/v1/namespaces/ci/pods/p/log?container=main&follow=true&limitBytes=10&tailLines=5"
        );
    }

    #[test]
    fn names_that_could_escape_the_path_are_refused() {
        for name in ["", "../x", "a/b", "A", "a?b"] {
            assert!(object_path(Resource::PODS, "ci", name).is_err(), "{name}");
        }
        assert!(collection_path(Resource::PODS, "").is_err());
    }

    #[test]
    fn source_selection_follows_the_issue() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string())
        };
        const IN_CLUSTER: &[(&str, &str)] = &[("KUBERNETES_SERVICE_HOST", "10.0.0.1"), ("KUBERNETES_SERVICE_PORT", "443"), ("HOME", "/h")];
        assert_eq!(
            Source::select_with(Some(Path::new("/k")), None, env(IN_CLUSTER)),
            Source::KubeconfigFile { path: "/k".into(), context: None }
        );
        assert!(matches!(Source::select_with(None, None, env(IN_CLUSTER)), Source::InCluster { .. }));
        assert_eq!(
            Source::select_with(None, Some("dev"), env(IN_CLUSTER)),
            Source::KubeconfigSearch { paths: vec!["/h/.kube/config".into()], context: Some("dev".into()) }
        );
        assert_eq!(
            Source::select_with(None, None, env(&[("KUBECONFIG", "/a::/b"), ("HOME", "/h")])),
            Source::KubeconfigSearch { paths: vec!["/a".into(), "/b".into()], context: None }
        );
    }

    #[test]
    fn access_review_body_leaves_out_empty_attributes() {
        let check = AccessCheck {
            namespace: "ci".into(),
            verb: "create".into(),
            group: "batch".into(),
            resource: "jobs".into(),
            ..AccessCheck::default()
        };
        assert_eq!(
            access_review_body(&check).to_string(),
            r#"{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview","spec":{"resourceAttributes":{"group":"batch","namespace":"ci","resource":"jobs","verb":"create"}}}"#
        );
    }
}
