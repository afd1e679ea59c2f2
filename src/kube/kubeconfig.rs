//! Where the cluster and credentials come from: kubeconfig files with
//! kubectl's loading and merge rules, and the in-cluster ServiceAccount.
//!
//! Both end in a `ClusterConfig`: plain data (server, TLS material, which
//! credentials to use, namespace, a log-safe description). Reading files
//! happens here, once, at start-up; everything that changes while the server
//! runs (token files, exec plugins) is handled by `auth`. Nothing here makes a
//! network call or keeps secrets in `Debug` output (`Redacted`).
//!
//! kubectl semantics followed (client-go `tools/clientcmd`): the first file
//! to define a cluster, user or context name wins, whole; relative paths are
//! resolved against the file that defined them; `null` lists are empty; the
//! namespace defaults to `default`; error texts are kubectl's where it has one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

use crate::kube::Error;
use crate::log::Redacted;

/// One cluster and one set of credentials, ready to build a client from.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// `https://host:port`, without a trailing slash.
    pub server: String,
    pub tls_server_name: Option<String>,
    pub insecure_skip_tls_verify: bool,
    /// PEM, possibly several certificates; `None` means the built-in web PKI roots.
    pub certificate_authority: Option<Vec<u8>>,
    pub proxy_url: Option<String>,
    /// PEM certificate chain and key from the kubeconfig.
    pub client_certificate: Option<Vec<u8>>,
    pub client_key: Option<Redacted<Vec<u8>>>,
    pub credentials: CredentialsConfig,
    pub impersonation: Impersonation,
    pub namespace: String,
    /// What was chosen, safe to log: files, context, cluster, user, server, auth kind.
    pub description: String,
    /// Where the server URL came from, for errors that say what to fix:
    /// "context `c` of kubeconfig `f`", "in-cluster ServiceAccount ...".
    pub origin: String,
    /// Which CAs the server certificate is checked against, for TLS errors.
    pub ca_source: String,
    /// Which credentials requests carry and what to check when the API
    /// answers 401 to them ("401 Unauthorized: Unauthorized"
    /// alone does not say whether a token expired or the context is wrong).
    pub unauthorized_hint: String,
}

/// How the bearer credential (if any) is obtained.
#[derive(Clone, Debug)]
pub enum CredentialsConfig {
    None,
    Token(Redacted<String>),
    /// Re-read periodically; `initial` is the kubeconfig's `token`, used
    /// until the file has been read (client-go `NewCachedFileTokenSource`).
    TokenFile {
        path: PathBuf,
        initial: Option<Redacted<String>>,
    },
    Basic {
        username: String,
        password: Redacted<String>,
    },
    Exec(ExecConfig),
    /// The legacy `oidc` auth-provider: its `id-token` is the bearer.
    OidcIdToken(Redacted<String>),
}

/// A `client.authentication.k8s.io` credential plugin.
#[derive(Clone, Debug)]
pub struct ExecConfig {
    pub user: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, Redacted<String>)>,
    pub api_version: String,
    pub install_hint: Option<String>,
    pub interactive_mode: InteractiveMode,
    /// `spec.cluster` of `KUBERNETES_EXEC_INFO` when `provideClusterInfo` is set.
    pub cluster_info: Option<serde_json::Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InteractiveMode {
    Never,
    IfAvailable,
    Always,
}

/// `as`, `as-uid`, `as-groups`, `as-user-extra`, sent as `Impersonate-*` headers.
#[derive(Clone, Debug, Default)]
pub struct Impersonation {
    pub user: Option<String>,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The kubeconfig files of a `Source`, parsed and merged.
#[derive(Debug, Default)]
pub struct Kubeconfig {
    /// The files that were read, in order, for the description.
    pub files: Vec<PathBuf>,
    /// Every path looked at, found or not, for errors.
    pub searched: Vec<PathBuf>,
    pub current_context: Option<String>,
    clusters: Vec<Named<RawCluster>>,
    contexts: Vec<Named<RawContext>>,
    users: Vec<Named<RawUser>>,
}

impl Kubeconfig {
    /// Loads `paths` like kubectl. `explicit` (a `--kubeconfig`-style path)
    /// must exist; files from `KUBECONFIG` that are missing are skipped.
    pub fn load(paths: &[PathBuf], explicit: bool) -> Result<Kubeconfig, Error> {
        let mut merged = Kubeconfig { searched: paths.to_vec(), ..Kubeconfig::default() };
        let mut seen: Vec<&PathBuf> = Vec::new();
        for path in paths {
            // KUBECONFIG is de-duplicated, keeping the first occurrence.
            if seen.contains(&path) {
                continue;
            }
            seen.push(path);
            let text = match read_bounded(path, MAX_KUBECONFIG_BYTES) {
                Ok(text) => text,
                Err(error) if !explicit && error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => {
                    return Err(Error::Config(format!("cannot read kubeconfig `{}`: {error}", path.display())));
                }
            };
            let file = parse(&text, path)?;
            merged.merge(file, path);
        }
        Ok(merged)
    }

    /// Parses one file's text (YAML or JSON); relative paths are resolved
    /// against `path`'s directory.
    pub fn parse(text: &[u8], path: &Path) -> Result<Kubeconfig, Error> {
        let mut merged = Kubeconfig::default();
        merged.merge(parse(text, path)?, path);
        Ok(merged)
    }

    /// The names of the contexts, for error hints.
    pub fn context_names(&self) -> Vec<&str> {
        self.contexts.iter().map(|named| named.name.as_str()).collect()
    }

    /// Picks the context (`context` or `current-context`) and reads what it
    /// points to into a `ClusterConfig`.
    pub fn select(&self, context: Option<&str>) -> Result<ClusterConfig, Error> {
        let files = self.files_text();
        let context_name = match context.filter(|name| !name.is_empty()).or(self.current_context.as_deref()) {
            Some(name) => name,
            None if self.clusters.is_empty() && self.contexts.is_empty() && self.users.is_empty() => {
                return Err(Error::NoConfiguration { searched: files });
            }
            None => {
                return Err(Error::Config(format!("no context chosen; set current-context in {files} or name a context")));
            }
        };
        let Some(raw_context) = find(&self.contexts, context_name) else {
            return Err(Error::Config(format!(
                "context was not found for specified context: {context_name}; contexts in {files}: {}",
                self.context_names().join(", ")
            )));
        };
        let cluster_name = raw_context.cluster.clone().unwrap_or_default();
        let Some(cluster) = find(&self.clusters, &cluster_name) else {
            return Err(Error::Config(format!("context `{context_name}` refers to cluster `{cluster_name}`, which is not in {files}")));
        };
        let user_name = raw_context.user.clone().unwrap_or_default();
        let default_user = RawUser::default();
        let user = match find(&self.users, &user_name) {
            Some(user) => user,
            // kubectl allows a context without a user (anonymous requests).
            None if user_name.is_empty() => &default_user,
            None => {
                return Err(Error::Config(format!("context `{context_name}` refers to user `{user_name}`, which is not in {files}")));
            }
        };
        let namespace = raw_context.namespace.clone().filter(|namespace| !namespace.is_empty());
        let mut config = cluster_config(&cluster_name, cluster, &user_name, user)?;
        config.namespace = namespace.unwrap_or_else(|| "default".to_string());
        config.description = format!(
            "kubeconfig {files} context `{context_name}` (cluster `{cluster_name}`, user `{user_name}`, server {}, context namespace `{}`, auth {})",
            config.server,
            config.namespace,
            describe_auth(&config)
        );
        config.origin = format!("context `{context_name}` of kubeconfig {files}");
        config.ca_source = format!("{} in {files}", config.ca_source);
        config.unauthorized_hint = unauthorized_hint(&config, &user_name);
        Ok(config)
    }

    fn merge(&mut self, file: RawKubeconfig, path: &Path) {
        self.files.push(path.to_path_buf());
        if self.current_context.as_deref().unwrap_or_default().is_empty() {
            self.current_context = file.current_context.filter(|name| !name.is_empty());
        }
        let clusters = file.clusters.unwrap_or_default().into_iter();
        merge_named(&mut self.clusters, clusters.map(|named| Named { name: named.name, value: named.cluster.unwrap_or_default() }));
        let contexts = file.contexts.unwrap_or_default().into_iter();
        merge_named(&mut self.contexts, contexts.map(|named| Named { name: named.name, value: named.context.unwrap_or_default() }));
        let users = file.users.unwrap_or_default().into_iter();
        merge_named(&mut self.users, users.map(|named| Named { name: named.name, value: named.user.unwrap_or_default() }));
    }

    fn files_text(&self) -> String {
        if self.files.is_empty() {
            if self.searched.is_empty() {
                return "(no path: neither KUBECONFIG nor HOME is set)".to_string();
            }
            let names: Vec<String> = self.searched.iter().map(|path| format!("`{}`", path.display())).collect();
            return format!("{} (not found)", names.join(", "));
        }
        let names: Vec<String> = self.files.iter().map(|path| format!("`{}`", path.display())).collect();
        names.join(", ")
    }
}

/// The ServiceAccount files a pod gets, under `dir`
/// (normally `/var/run/secrets/kubernetes.io/serviceaccount`).
pub fn in_cluster(host: &str, port: &str, dir: &Path) -> Result<ClusterConfig, Error> {
    if host.is_empty() || port.is_empty() {
        return Err(Error::Config(
            "unable to load in-cluster configuration, KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be defined".to_string(),
        ));
    }
    let server = format!("https://{}", join_host_port(host, port));
    let token_path = dir.join("token");
    let token = read_text_bounded(&token_path, MAX_CREDENTIAL_FILE_BYTES)
        .map_err(|error| Error::Config(format!("cannot read the ServiceAccount token `{}`: {error}", token_path.display())))?;
    let ca_path = dir.join("ca.crt");
    let (certificate_authority, ca_source) = match read_bounded(&ca_path, MAX_CREDENTIAL_FILE_BYTES) {
        Ok(pem) => (Some(pem), format!("the in-cluster CA `{}`", ca_path.display())),
        Err(error) => {
            // client-go logs this and carries on with the system roots.
            crate::log::warn(
                "in-cluster CA file unreadable, using built-in roots",
                &[("path", ca_path.display().to_string().into()), ("error", error.to_string().into())],
            );
            (None, format!("the built-in web PKI roots (the in-cluster CA `{}` is unreadable: {error})", ca_path.display()))
        }
    };
    let namespace = read_text_bounded(&dir.join("namespace"), MAX_CREDENTIAL_FILE_BYTES)
        .map(|text| text.trim().to_string())
        .ok()
        .filter(|namespace| !namespace.is_empty())
        .unwrap_or_else(|| "default".to_string());
    let description = format!("in-cluster ServiceAccount `{}` (server {server}, ServiceAccount namespace `{namespace}`)", dir.display());
    let unauthorized_hint = format!(
        "the API server refused the ServiceAccount token `{}` (re-read after the 401); check that the pod's ServiceAccount still exists and its token is mounted (automountServiceAccountToken), then restart the pod",
        token_path.display()
    );
    Ok(ClusterConfig {
        server,
        tls_server_name: None,
        insecure_skip_tls_verify: false,
        certificate_authority,
        proxy_url: None,
        client_certificate: None,
        client_key: None,
        credentials: CredentialsConfig::TokenFile { path: token_path, initial: Some(Redacted(token.trim().to_string())) },
        impersonation: Impersonation::default(),
        namespace,
        description,
        origin: format!("in-cluster ServiceAccount `{}` (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT)", dir.display()),
        ca_source,
        unauthorized_hint,
    })
}

/// `host:port`, with IPv6 literals in brackets (Go's `net.JoinHostPort`).
pub fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') && !host.starts_with('[') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

// ---- raw file shapes -------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawKubeconfig {
    #[serde(rename = "current-context")]
    current_context: Option<String>,
    // kubectl writes `null` for empty lists, hence `Option<Vec<_>>`.
    clusters: Option<Vec<NamedCluster>>,
    contexts: Option<Vec<NamedContext>>,
    users: Option<Vec<NamedUser>>,
}

#[derive(Debug, Deserialize)]
struct NamedCluster {
    name: String,
    #[serde(default)]
    cluster: Option<RawCluster>,
}

#[derive(Debug, Deserialize)]
struct NamedContext {
    name: String,
    #[serde(default)]
    context: Option<RawContext>,
}

#[derive(Debug, Deserialize)]
struct NamedUser {
    name: String,
    #[serde(default)]
    user: Option<RawUser>,
}

#[derive(Debug)]
struct Named<T> {
    name: String,
    value: T,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
struct RawCluster {
    server: Option<String>,
    tls_server_name: Option<String>,
    insecure_skip_tls_verify: Option<bool>,
    certificate_authority: Option<String>,
    certificate_authority_data: Option<String>,
    proxy_url: Option<String>,
    disable_compression: Option<bool>,
    extensions: Option<Vec<RawExtension>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct RawExtension {
    name: String,
    extension: serde_json::Value,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct RawContext {
    cluster: Option<String>,
    user: Option<String>,
    namespace: Option<String>,
}

#[derive(Clone, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
struct RawUser {
    client_certificate: Option<String>,
    client_certificate_data: Option<String>,
    client_key: Option<String>,
    client_key_data: Option<String>,
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    #[serde(rename = "as")]
    impersonate: Option<String>,
    as_uid: Option<String>,
    as_groups: Option<Vec<String>>,
    as_user_extra: Option<BTreeMap<String, Vec<String>>>,
    username: Option<String>,
    password: Option<String>,
    auth_provider: Option<RawAuthProvider>,
    exec: Option<RawExec>,
}

impl std::fmt::Debug for RawUser {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Holds tokens, passwords and keys: never printed.
        formatter.write_str("RawUser { *** }")
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct RawAuthProvider {
    name: String,
    config: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawExec {
    command: String,
    args: Option<Vec<String>>,
    env: Option<Vec<RawExecEnv>>,
    api_version: String,
    install_hint: Option<String>,
    provide_cluster_info: bool,
    interactive_mode: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct RawExecEnv {
    name: String,
    value: String,
}

// ---- parsing and merging ---------------------------------------------------

fn parse(text: &[u8], path: &Path) -> Result<RawKubeconfig, Error> {
    let text = std::str::from_utf8(text).map_err(|_| Error::Config(format!("kubeconfig `{}` is not UTF-8", path.display())))?;
    if text.trim().is_empty() {
        return Ok(RawKubeconfig::default());
    }
    // JSON is read as JSON: it is valid YAML only mostly (tabs), and client-go
    // does the same by converting YAML to JSON first.
    // A parser's message may quote the text that did not fit, and in a
    // kubeconfig that is often a token, a password or a key. So the message is the
    // parser's words without any quoted value, and the position.
    let parsed = if text.trim_start().starts_with('{') {
        serde_json::from_str::<RawKubeconfig>(text)
            .map_err(|error| parse_failure(&error.to_string(), Some((error.line() as u64, error.column() as u64))))
    } else {
        crate::yaml::from_str::<RawKubeconfig>(text).map_err(|error| {
            let position = error.position.filter(|(line, _)| *line > 0);
            let message = parse_failure(&error.message, position);
            match position.and_then(|(line, _)| key_on_line(text, line)) {
                Some(key) => format!("field `{key}`: {message}"),
                None => message,
            }
        })
    };
    let mut file = parsed.map_err(|message| Error::Config(format!("cannot parse kubeconfig `{}`: {message}", path.display())))?;
    let base = path.parent().unwrap_or(Path::new("."));
    resolve_local_paths(&mut file, base);
    Ok(file)
}

/// A parse error as the operator may see it in a log: the parser's words
/// with every double-quoted value hidden (serde quotes the string it could
/// not use; field names, which say what to fix, are in backticks and kept),
/// its own trailing position dropped, and the position given once.
fn parse_failure(message: &str, position: Option<(u64, u64)>) -> String {
    let mut shown = String::with_capacity(message.len());
    let mut in_quote = false;
    let mut escaped = false;
    for character in message.chars() {
        match (in_quote, escaped, character) {
            (true, false, '\\') => escaped = true,
            (true, true, _) => escaped = false,
            (true, false, '"') => {
                in_quote = false;
                shown.push_str("…\"");
            }
            (true, false, _) => {}
            (false, _, '"') => {
                in_quote = true;
                shown.push('"');
            }
            (false, _, other) => shown.push(other),
        }
    }
    if in_quote {
        shown.push_str("…\"");
    }
    let words = match shown.find(" at line ") {
        Some(index) => shown[..index].trim_end().to_string(),
        None => shown.lines().next().unwrap_or_default().trim_end().to_string(),
    };
    match position {
        Some((line, column)) => format!("{words} (line {line}, column {column}; values are not shown)"),
        None => format!("{words} (values are not shown)"),
    }
}

/// The YAML key that starts line `line` (1-based), if it is a plain one:
/// `    as: [1]` and `- name: u` give `as` and `name`. Only the key, never
/// what follows it.
fn key_on_line(text: &str, line: u64) -> Option<&str> {
    let text = text.lines().nth(usize::try_from(line.checked_sub(1)?).ok()?)?;
    let text = text.trim_start().trim_start_matches("- ").trim_start();
    let key = &text[..text.find(':')?];
    let plain = !key.is_empty() && key.len() <= 64 && key.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(&byte));
    plain.then_some(key)
}

/// client-go `ResolveLocalPaths`: file references are relative to the
/// directory of the file that defined them; an exec command only when it
/// contains a `/` (a bare name is looked up on PATH).
fn resolve_local_paths(file: &mut RawKubeconfig, base: &Path) {
    let resolve = |value: &mut Option<String>| {
        if let Some(text) = value.as_mut().filter(|text| !text.is_empty())
            && Path::new(text.as_str()).is_relative()
        {
            *text = base.join(text.as_str()).display().to_string();
        }
    };
    for named in file.clusters.iter_mut().flatten() {
        if let Some(cluster) = named.cluster.as_mut() {
            resolve(&mut cluster.certificate_authority);
        }
    }
    for named in file.users.iter_mut().flatten() {
        let Some(user) = named.user.as_mut() else { continue };
        resolve(&mut user.client_certificate);
        resolve(&mut user.client_key);
        resolve(&mut user.token_file);
        if let Some(exec) = user.exec.as_mut()
            && exec.command.contains('/')
            && Path::new(&exec.command).is_relative()
        {
            exec.command = base.join(&exec.command).display().to_string();
        }
    }
}

/// First definition of a name wins, whole (no field-level merge).
fn merge_named<T>(into: &mut Vec<Named<T>>, entries: impl Iterator<Item = Named<T>>) {
    for named in entries {
        if !into.iter().any(|existing| existing.name == named.name) {
            into.push(named);
        }
    }
}

fn find<'a, T>(entries: &'a [Named<T>], name: &str) -> Option<&'a T> {
    entries.iter().find(|named| named.name == name).map(|named| &named.value)
}

// ---- from raw stanzas to a ClusterConfig -----------------------------------

fn cluster_config(cluster_name: &str, cluster: &RawCluster, user_name: &str, user: &RawUser) -> Result<ClusterConfig, Error> {
    let server = cluster.server.clone().unwrap_or_default();
    if server.is_empty() {
        return Err(Error::Config(format!("cluster has no server defined: cluster `{cluster_name}`")));
    }
    let certificate_authority = read_data_or_file(
        cluster.certificate_authority_data.as_deref(),
        cluster.certificate_authority.as_deref(),
        "certificate-authority",
        cluster_name,
    )?;
    let insecure_skip_tls_verify = cluster.insecure_skip_tls_verify.unwrap_or(false);
    let ca_source = describe_ca(cluster_name, cluster);
    if insecure_skip_tls_verify && certificate_authority.is_some() {
        // client-go transport.TLSConfigFor refuses this combination.
        return Err(Error::Config(format!(
            "specifying a root certificates file with the insecure flag is not allowed: cluster `{cluster_name}`"
        )));
    }
    validate_user(user_name, user)?;
    let client_certificate =
        read_data_or_file(user.client_certificate_data.as_deref(), user.client_certificate.as_deref(), "client-cert", user_name)?;
    let client_key = read_data_or_file(user.client_key_data.as_deref(), user.client_key.as_deref(), "client-key", user_name)?;
    let cluster_info = cluster_info_for_exec(cluster, certificate_authority.as_deref());
    let credentials = credentials_config(user_name, user, cluster_info)?;
    Ok(ClusterConfig {
        server: server.trim_end_matches('/').to_string(),
        tls_server_name: cluster.tls_server_name.clone().filter(|name| !name.is_empty()),
        insecure_skip_tls_verify,
        certificate_authority,
        proxy_url: cluster.proxy_url.clone().filter(|url| !url.is_empty()),
        client_certificate,
        client_key: client_key.map(Redacted),
        credentials,
        impersonation: Impersonation {
            user: user.impersonate.clone().filter(|name| !name.is_empty()),
            uid: user.as_uid.clone().filter(|uid| !uid.is_empty()),
            groups: user.as_groups.clone().unwrap_or_default(),
            extra: user.as_user_extra.clone().unwrap_or_default(),
        },
        namespace: String::new(),
        description: String::new(),
        origin: String::new(),
        ca_source,
        unauthorized_hint: String::new(),
    })
}

/// Which CAs verify the server of `cluster` (`select` adds the files).
fn describe_ca(cluster_name: &str, cluster: &RawCluster) -> String {
    let set = |value: &Option<String>| value.as_deref().is_some_and(|text| !text.is_empty());
    if set(&cluster.certificate_authority_data) {
        return format!("certificate-authority-data of cluster `{cluster_name}`");
    }
    if let Some(path) = cluster.certificate_authority.as_deref().filter(|path| !path.is_empty()) {
        return format!("certificate-authority `{path}` of cluster `{cluster_name}`");
    }
    format!("the built-in web PKI roots (cluster `{cluster_name}` sets no certificate-authority)")
}

/// What the 401 hint says for each kind of credential: which one was
/// refused, where it came from, and what usually fixes it.
fn unauthorized_hint(config: &ClusterConfig, user_name: &str) -> String {
    let (what, check) = match &config.credentials {
        CredentialsConfig::Token(_) => (
            format!("the token of user `{user_name}`"),
            "check that it has not expired or been revoked and that this is the context meant for this server, or put in a new token"
                .to_string(),
        ),
        CredentialsConfig::TokenFile { path, .. } => (
            format!("the token from file `{}` of user `{user_name}`, re-read after the 401", path.display()),
            "check that whatever writes the file keeps it current and that it is a token for this cluster".to_string(),
        ),
        CredentialsConfig::Basic { username, .. } => (
            format!("basic auth as `{username}` (user `{user_name}`)"),
            "check the username and password; many clusters turn basic auth off".to_string(),
        ),
        CredentialsConfig::Exec(exec) => (
            format!("the credential of exec plugin `{}` (user `{user_name}`), also after running it again", exec.command),
            "check that the plugin logs in to the identity this cluster trusts and that this is the right context".to_string(),
        ),
        CredentialsConfig::OidcIdToken(_) => (
            format!("the oidc id-token of user `{user_name}`"),
            "id-tokens expire within hours and are not refreshed here: log in again, or use an exec plugin such as kubelogin".to_string(),
        ),
        CredentialsConfig::None if config.client_certificate.is_some() => (
            format!("the client certificate of user `{user_name}`"),
            "check that it has not expired (`openssl x509 -noout -enddate`), that this cluster's client CA issued it and that it was not revoked, or rotate it".to_string(),
        ),
        CredentialsConfig::None => (
            format!("anonymous requests (user `{user_name}` has no credentials)"),
            "give the user a token, a client certificate or an exec plugin".to_string(),
        ),
    };
    format!("the API server refused {what} ({}); {check}", config.origin)
}

/// client-go `validateAuthInfo`, with its wording.
fn validate_user(user_name: &str, user: &RawUser) -> Result<(), Error> {
    let set = |value: &Option<String>| value.as_deref().is_some_and(|text| !text.is_empty());
    let has_certificate = set(&user.client_certificate) || set(&user.client_certificate_data);
    let has_key = set(&user.client_key) || set(&user.client_key_data);
    if has_certificate && !has_key {
        return Err(Error::Config(format!(
            "client-key-data or client-key must be specified for {user_name} to use the clientCert authentication method"
        )));
    }
    if has_key && !has_certificate {
        return Err(Error::Config(format!(
            "client-cert-data or client-cert must be specified for {user_name} to use the clientCert authentication method"
        )));
    }
    let mut methods = Vec::new();
    if set(&user.token) || set(&user.token_file) {
        methods.push("token");
    }
    if set(&user.username) || set(&user.password) {
        methods.push("basicAuth");
    }
    if methods.len() > 1 {
        return Err(Error::Config(format!(
            "more than one authentication method found for {user_name}; found [{}], only one is allowed",
            methods.join(" ")
        )));
    }
    if user.exec.is_some() && user.auth_provider.is_some() {
        return Err(Error::Config(format!("authProvider cannot be provided in combination with an exec plugin for {user_name}")));
    }
    Ok(())
}

fn credentials_config(user_name: &str, user: &RawUser, cluster_info: serde_json::Value) -> Result<CredentialsConfig, Error> {
    let non_empty = |value: &Option<String>| value.clone().filter(|text| !text.is_empty());
    if let Some(exec) = &user.exec {
        return exec_config(user_name, exec, cluster_info).map(CredentialsConfig::Exec);
    }
    if let Some(provider) = &user.auth_provider {
        return auth_provider_config(user_name, provider);
    }
    if let Some(path) = non_empty(&user.token_file) {
        return Ok(CredentialsConfig::TokenFile { path: PathBuf::from(path), initial: non_empty(&user.token).map(Redacted) });
    }
    if let Some(token) = non_empty(&user.token) {
        return Ok(CredentialsConfig::Token(Redacted(token)));
    }
    if non_empty(&user.username).is_some() || non_empty(&user.password).is_some() {
        return Ok(CredentialsConfig::Basic {
            username: user.username.clone().unwrap_or_default(),
            password: Redacted(user.password.clone().unwrap_or_default()),
        });
    }
    Ok(CredentialsConfig::None)
}

fn exec_config(user_name: &str, exec: &RawExec, cluster_info: serde_json::Value) -> Result<ExecConfig, Error> {
    if exec.command.is_empty() {
        return Err(Error::Config(format!("command must be specified for {user_name} to use exec authentication plugin")));
    }
    let api_version = exec.api_version.as_str();
    if api_version.is_empty() {
        return Err(Error::Config(format!("apiVersion must be specified for {user_name} to use exec authentication plugin")));
    }
    if !matches!(api_version, "client.authentication.k8s.io/v1" | "client.authentication.k8s.io/v1beta1") {
        return Err(Error::Config(format!(
            "exec plugin: invalid apiVersion {api_version:?}; supported: client.authentication.k8s.io/v1, client.authentication.k8s.io/v1beta1"
        )));
    }
    let interactive_mode = match exec.interactive_mode.as_deref().unwrap_or_default() {
        "" if api_version.ends_with("/v1") => {
            return Err(Error::Config(format!("interactiveMode must be specified for {user_name} to use exec authentication plugin")));
        }
        // v1beta1 defaults to IfAvailable.
        "" | "IfAvailable" => InteractiveMode::IfAvailable,
        "Never" => InteractiveMode::Never,
        "Always" => InteractiveMode::Always,
        other => {
            return Err(Error::Config(format!("invalid interactiveMode for {user_name}: {other:?}; one of Never, IfAvailable, Always")));
        }
    };
    Ok(ExecConfig {
        user: user_name.to_string(),
        command: exec.command.clone(),
        args: exec.args.clone().unwrap_or_default(),
        env: exec.env.iter().flatten().map(|pair| (pair.name.clone(), Redacted(pair.value.clone()))).collect(),
        api_version: api_version.to_string(),
        install_hint: exec.install_hint.clone().filter(|hint| !hint.is_empty()),
        interactive_mode,
        cluster_info: exec.provide_cluster_info.then_some(cluster_info),
    })
}

/// Only `oidc` still works in client-go; `gcp` and `azure` are stubs there
/// that point to exec plugins, and so are they here.
fn auth_provider_config(user_name: &str, provider: &RawAuthProvider) -> Result<CredentialsConfig, Error> {
    match provider.name.as_str() {
        "oidc" => {
            let config = provider.config.clone().unwrap_or_default();
            match config.get("id-token").filter(|token| !token.is_empty()) {
                Some(token) => Ok(CredentialsConfig::OidcIdToken(Redacted(token.clone()))),
                None => Err(Error::Config(format!(
                    "the oidc auth-provider of user `{user_name}` has no id-token; refreshing with a refresh-token is not supported, use an exec plugin such as kubelogin (`kubectl oidc-login`)"
                ))),
            }
        }
        "gcp" => Err(Error::Config(
            "The gcp auth plugin has been removed; please use the \"gke-gcloud-auth-plugin\" kubectl/client-go credential plugin instead"
                .to_string(),
        )),
        "azure" => Err(Error::Config(
            "The azure auth plugin has been removed; please use the \"kubelogin\" kubectl/client-go credential plugin instead".to_string(),
        )),
        other => Err(Error::Config(format!("no Auth Provider found for name {other:?}"))),
    }
}

/// `ExecCredential.spec.cluster` (client.authentication.k8s.io `Cluster`).
fn cluster_info_for_exec(cluster: &RawCluster, certificate_authority: Option<&[u8]>) -> serde_json::Value {
    let mut info = serde_json::Map::new();
    info.insert("server".into(), cluster.server.clone().unwrap_or_default().into());
    if let Some(name) = &cluster.tls_server_name {
        info.insert("tls-server-name".into(), name.clone().into());
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        info.insert("insecure-skip-tls-verify".into(), true.into());
    }
    if let Some(pem) = certificate_authority {
        info.insert("certificate-authority-data".into(), base64::engine::general_purpose::STANDARD.encode(pem).into());
    }
    if let Some(url) = &cluster.proxy_url {
        info.insert("proxy-url".into(), url.clone().into());
    }
    if cluster.disable_compression == Some(true) {
        info.insert("disable-compression".into(), true.into());
    }
    let exec_extension = cluster.extensions.iter().flatten().find(|extension| extension.name == "client.authentication.k8s.io/exec");
    if let Some(extension) = exec_extension {
        info.insert("config".into(), extension.extension.clone());
    }
    serde_json::Value::Object(info)
}

/// `*-data` (base64 PEM) wins over the file path, as in client-go.
fn read_data_or_file(data: Option<&str>, file: Option<&str>, field: &str, owner: &str) -> Result<Option<Vec<u8>>, Error> {
    if let Some(data) = data.filter(|data| !data.is_empty()) {
        let compact: String = data.chars().filter(|char| !char.is_whitespace()).collect();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map_err(|error| Error::Config(format!("{field}-data for {owner} is not valid base64: {error}")))?;
        return Ok(Some(decoded));
    }
    let Some(file) = file.filter(|file| !file.is_empty()) else {
        return Ok(None);
    };
    read_bounded(Path::new(file), MAX_CREDENTIAL_FILE_BYTES)
        .map(Some)
        .map_err(|error| Error::Config(format!("unable to read {field} {file} for {owner} due to {error}")))
}

/// Largest kubeconfig file read: far above real ones (a few KiB to a few
/// hundred), low enough that a path pointing at a huge or endless file
/// (`/dev/zero`) is an error at start instead of all the memory.
const MAX_KUBECONFIG_BYTES: u64 = 16 << 20;
/// Largest certificate, key, CA bundle or token file read.
pub const MAX_CREDENTIAL_FILE_BYTES: u64 = 4 << 20;

/// Reads at most `max` bytes of the regular file `path`
/// (`settings_file::read_bytes`): a longer file is an error that says so,
/// a FIFO or device is refused instead of waited on.
pub(crate) fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    crate::settings_file::read_bytes(path, max)
}

/// `read_bounded` for UTF-8 text.
pub(crate) fn read_text_bounded(path: &Path, max: u64) -> std::io::Result<String> {
    crate::settings_file::read_text(path, max)
}

fn describe_auth(config: &ClusterConfig) -> String {
    let mut parts = Vec::new();
    if config.client_certificate.is_some() {
        parts.push("client certificate".to_string());
    }
    match &config.credentials {
        CredentialsConfig::None => {}
        CredentialsConfig::Token(_) => parts.push("token".to_string()),
        CredentialsConfig::TokenFile { path, .. } => parts.push(format!("tokenFile `{}`", path.display())),
        CredentialsConfig::Basic { username, .. } => parts.push(format!("basic auth as `{username}`")),
        CredentialsConfig::Exec(exec) => parts.push(format!("exec plugin `{}`", exec.command)),
        CredentialsConfig::OidcIdToken(_) => parts.push("oidc id-token".to_string()),
    }
    if let Some(user) = &config.impersonation.user {
        parts.push(format!("impersonating `{user}`"));
    }
    if parts.is_empty() {
        return "none (anonymous)".to_string();
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_kubeconfig_is_an_error_not_all_the_memory() {
        let error = Kubeconfig::load(&[PathBuf::from("/dev/zero")], true).err().map(|error| error.to_string()).unwrap_or_default();
        assert!(error.contains("cannot read kubeconfig `/dev/zero`: is a device, not a regular file"), "{error}");
    }

    #[test]
    fn bounded_reads_take_files_up_to_the_cap() {
        let dir = std::env::temp_dir().join(format!("mcp-k8s-bounded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "abcd").unwrap();
        assert_eq!(read_text_bounded(&path, 4).unwrap(), "abcd");
        assert!(read_bounded(&path, 3).unwrap_err().to_string().contains("larger than 3 bytes"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A parse error names the file and the place, never a credential's
    /// value: the kubeconfig's secrets next to the faulty line, and a secret
    /// given where a list belongs, in YAML and in JSON.
    #[test]
    fn a_parse_error_shows_no_credential() {
        let secret = "eyJhbGciOiJSUzI1NiIsImtpZCI6IlNFQ1JFVCJ9.c2VjcmV0LXNlY3JldA";
        let cases = [
            format!("users:\n- name: u\n  user:\n    password: hunter2-{secret}\n    token: {secret}\n    as: [1]\n"),
            format!("users:\n- name: u\n  user:\n    token: {secret}\n    client-key-data: {secret}\n    as-groups: {secret}\n"),
            format!("users:\n- name: u\n  user:\n    exec:\n      env: {secret}\n"),
            format!(r#"{{"users": [{{"name": "u", "user": {{"token": "{secret}", "as-groups": "{secret}"}}}}]}}"#),
            format!(r#"{{"users": [{{"name": "u", "user": {{"token": "{secret}", "as": ["#),
        ];
        for text in cases {
            let error = parse(text.as_bytes(), Path::new("/etc/kube/config")).err().map(|error| error.to_string()).unwrap_or_default();
            assert!(error.contains("cannot parse kubeconfig `/etc/kube/config`"), "{error}");
            assert!(error.contains("line "), "the place is named: {error}");
            if !text.starts_with('{') {
                assert!(error.contains("field `"), "the field is named: {error}");
            }
            assert!(!error.contains("hunter2") && !error.contains("c2VjcmV0"), "a credential in `{error}`");
        }
    }

    #[test]
    fn the_key_of_a_line_is_named_without_its_value() {
        let text = "users:\n- name: u\n    as: [1]\n  token: abc:def\n  \"quoted key\": x\nnot a key\n";
        let cases =
            [(1, Some("users")), (2, Some("name")), (3, Some("as")), (4, Some("token")), (5, None), (6, None), (7, None), (0, None)];
        for (line, expected) in cases {
            assert_eq!(key_on_line(text, line), expected, "line {line}");
        }
    }

    #[test]
    fn parse_failures_hide_quoted_values_and_keep_field_names() {
        let cases = [
            (
                "invalid type: string \"tok\\\"en\", expected a sequence at line 3 column 5",
                Some((3, 5)),
                "invalid type: string \"…\", expected a sequence (line 3, column 5; values are not shown)",
            ),
            ("unknown field `tokn`, expected one of `token`", None, "unknown field `tokn`, expected one of `token` (values are not shown)"),
            ("unterminated \"abc", Some((1, 1)), "unterminated \"…\" (line 1, column 1; values are not shown)"),
        ];
        for (message, position, expected) in cases {
            assert_eq!(parse_failure(message, position), expected);
        }
    }
}
