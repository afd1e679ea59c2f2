//! Credentials at request time: static tokens and basic auth, token files
//! that rotate (kubeconfig `tokenFile`, the in-cluster ServiceAccount token),
//! and exec credential plugins with their cache.
//!
//! `Auth::credential` gives what to send now; `Auth::refresh_after_unauthorized`
//! is called once after a 401 and says whether a retry can help. The request
//! loop in `mod.rs` owns the retry; this module only owns credentials and
//! never logs them.
//!
//! Semantics follow client-go: a token file is re-read at least every
//! minute (`NewCachedFileTokenSource`), here also as soon as its mtime or size
//! changes and after a 401; an exec plugin's answer is cached until its
//! `expirationTimestamp` and re-run once on a 401 unless another request has
//! already refreshed it (`maybeRefreshCreds`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use ureq::tls::ClientCert;

use crate::kube::Error;
use crate::kube::kubeconfig::{CredentialsConfig, ExecConfig, InteractiveMode};
use crate::log::Redacted;
use crate::supervise;

/// client-go re-reads token files this often even when nothing changed.
const TOKEN_FILE_REREAD: Duration = Duration::from_secs(60);

/// A credential plugin that takes longer is killed (client-go waits forever;
/// a server must not hang every request on a stuck plugin). The default of
/// `kube::Options::exec_timeout`.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a failed plugin run answers for it: a burst of
/// calls behind a hanging plugin all get the one failure instead of running
/// it once each, one timeout after another. Short, so that a plugin fixed
/// by hand (a login) is picked up within seconds. The default of
/// `kube::Options::exec_failure_ttl`.
pub const EXEC_FAILURE_TTL: Duration = Duration::from_secs(5);

/// How exec plugins are run: the kill timeout and how long a failure is shared.
#[derive(Clone, Copy, Debug)]
pub struct ExecLimits {
    pub timeout: Duration,
    pub failure_ttl: Duration,
}

/// What one request authenticates with.
#[derive(Clone, Debug, Default)]
pub struct Credential {
    /// The `Authorization` header value.
    pub authorization: Option<Redacted<String>>,
    /// A client certificate from an exec plugin (replaces the kubeconfig's).
    pub client_cert: Option<ClientCert>,
    /// Bumped on every exec plugin run, so a 401 can tell whether someone
    /// else already refreshed.
    pub generation: u64,
}

/// The credential source of one client.
#[derive(Debug)]
pub enum Auth {
    /// Nothing to send, or a fixed header (token, basic auth, oidc id-token).
    Fixed(Option<Redacted<String>>),
    TokenFile(TokenFile),
    // Boxed: it is much larger than the other variants.
    Exec(Box<ExecPlugin>),
}

impl Auth {
    pub fn new(config: &CredentialsConfig, exec_limits: ExecLimits) -> Auth {
        match config {
            CredentialsConfig::None => Auth::Fixed(None),
            CredentialsConfig::Token(token) | CredentialsConfig::OidcIdToken(token) => {
                Auth::Fixed(Some(Redacted(format!("Bearer {}", token.0))))
            }
            CredentialsConfig::Basic { username, password } => {
                let pair = format!("{username}:{}", password.0);
                let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
                Auth::Fixed(Some(Redacted(format!("Basic {encoded}"))))
            }
            CredentialsConfig::TokenFile { path, initial } => Auth::TokenFile(TokenFile {
                path: path.clone(),
                state: Mutex::new(TokenFileState { token: initial.as_ref().map(|token| token.0.clone()), read_at: None, stamp: None }),
            }),
            CredentialsConfig::Exec(exec) => {
                Auth::Exec(Box::new(ExecPlugin { config: exec.clone(), limits: exec_limits, state: Mutex::new(ExecState::default()) }))
            }
        }
    }

    /// The credential for the next request.
    pub fn credential(&self) -> Result<Credential, Error> {
        match self {
            Auth::Fixed(header) => Ok(Credential { authorization: header.clone(), ..Credential::default() }),
            Auth::TokenFile(token_file) => token_file.credential(false),
            Auth::Exec(plugin) => plugin.credential(),
        }
    }

    /// After a 401 answered to `used`: refreshes the credential and says
    /// whether retrying the request once can help.
    pub fn refresh_after_unauthorized(&self, used: &Credential) -> Result<bool, Error> {
        match self {
            Auth::Fixed(_) => Ok(false),
            Auth::TokenFile(token_file) => {
                let fresh = token_file.credential(true)?;
                Ok(fresh.authorization != used.authorization)
            }
            Auth::Exec(plugin) => plugin.refresh(used),
        }
    }
}

/// A token kept in a file that something else rotates.
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    state: Mutex<TokenFileState>,
}

#[derive(Debug)]
struct TokenFileState {
    token: Option<String>,
    read_at: Option<Instant>,
    /// mtime and length at the last read.
    stamp: Option<(SystemTime, u64)>,
}

impl TokenFile {
    fn credential(&self, force: bool) -> Result<Credential, Error> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let stamp = std::fs::metadata(&self.path).ok().map(|metadata| (metadata.modified().unwrap_or(UNIX_EPOCH), metadata.len()));
        let stale = state.read_at.is_none_or(|read_at| read_at.elapsed() >= TOKEN_FILE_REREAD);
        if force || stale || stamp != state.stamp || state.token.is_none() {
            match read_token(&self.path) {
                Ok(token) => {
                    state.token = Some(token);
                    state.stamp = stamp;
                    state.read_at = Some(Instant::now());
                }
                // client-go keeps using the last good token when a re-read
                // fails. The file is not read again (nor the warning
                // logged) until it changes or TOKEN_FILE_REREAD passes:
                // once per request flooded the log.
                Err(error) if state.token.is_some() => {
                    crate::log::warn(
                        "token file unreadable, keeping the previous token",
                        &[("path", self.path.display().to_string().into()), ("error", error.to_string().into())],
                    );
                    state.stamp = stamp;
                    state.read_at = Some(Instant::now());
                }
                Err(error) => return Err(error),
            }
        }
        let token = state.token.clone().unwrap_or_default();
        Ok(Credential { authorization: Some(Redacted(format!("Bearer {token}"))), ..Credential::default() })
    }
}

fn read_token(path: &Path) -> Result<String, Error> {
    let text = crate::kube::kubeconfig::read_text_bounded(path, crate::kube::kubeconfig::MAX_CREDENTIAL_FILE_BYTES)
        .map_err(|error| Error::Credentials(format!("failed to read token file `{}`: {error}", path.display())))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(Error::Credentials(format!("token file `{}` is empty", path.display())));
    }
    Ok(token.to_string())
}

/// A credential plugin and its cached answer.
///
/// Single flight: the plugin runs with `state` locked, so there is one run
/// at a time and the calls that queued behind it read its answer when they
/// get the lock. A success is read from `cached`; a failure from `failed`,
/// for `ExecLimits::failure_ttl`. Without the latter, each queued call ran
/// the hanging plugin again and waited its own timeout (three
/// calls, 180 s).
#[derive(Debug)]
pub struct ExecPlugin {
    config: ExecConfig,
    limits: ExecLimits,
    state: Mutex<ExecState>,
}

#[derive(Debug, Default)]
struct ExecState {
    cached: Option<Credential>,
    expires: Option<SystemTime>,
    generation: u64,
    /// The last run's failure and when it ended, while it is shared.
    failed: Option<(Instant, String)>,
}

impl ExecPlugin {
    fn credential(&self) -> Result<Credential, Error> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let expired = state.expires.is_some_and(|expires| SystemTime::now() >= expires);
        if let Some(cached) = &state.cached
            && !expired
        {
            return Ok(cached.clone());
        }
        self.shared_failure(&state)?;
        self.run_locked(&mut state)
    }

    fn refresh(&self, used: &Credential) -> Result<bool, Error> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if state.generation != used.generation && state.cached.is_some() {
            // Another request already re-ran the plugin after its own 401.
            return Ok(true);
        }
        self.shared_failure(&state)?;
        self.run_locked(&mut state)?;
        Ok(true)
    }

    /// The failure of a run that ended less than `failure_ttl` ago.
    fn shared_failure(&self, state: &ExecState) -> Result<(), Error> {
        let Some((failed_at, message)) = &state.failed else {
            return Ok(());
        };
        let age = failed_at.elapsed();
        if age >= self.limits.failure_ttl {
            return Ok(());
        }
        Err(Error::Credentials(format!(
            "{message} (the answer of a run that ended {} ago, shared for {} before the plugin runs again)",
            duration_text(age),
            duration_text(self.limits.failure_ttl)
        )))
    }

    /// Runs the plugin with the lock held, so concurrent requests wait for
    /// one run instead of starting several, and records a failure for them.
    fn run_locked(&self, state: &mut ExecState) -> Result<Credential, Error> {
        let decoded = run_plugin(&self.config, self.limits.timeout).and_then(|output| decode_exec_output(&self.config, &output));
        let decoded = match decoded {
            Ok(decoded) => decoded,
            Err(error) => {
                let message = match &error {
                    Error::Credentials(message) => message.clone(),
                    other => other.to_string(),
                };
                state.failed = Some((Instant::now(), message));
                return Err(error);
            }
        };
        state.failed = None;
        state.generation += 1;
        let credential = Credential {
            authorization: decoded.token.map(|token| Redacted(format!("Bearer {token}"))),
            client_cert: decoded.client_cert,
            generation: state.generation,
        };
        state.cached = Some(credential.clone());
        state.expires = decoded.expires;
        crate::log::debug(
            "exec credential plugin ran",
            &[("command", self.config.command.clone().into()), ("expires", decoded.expires.map(crate::log::rfc3339_utc).into())],
        );
        Ok(credential)
    }
}

/// The plugin's decoded answer.
struct ExecOutput {
    token: Option<String>,
    client_cert: Option<ClientCert>,
    expires: Option<SystemTime>,
}

/// The `KUBERNETES_EXEC_INFO` value. A server has no terminal, so
/// `interactive` is always false (client-go: "standard input is not a
/// terminal" for `Always`).
fn exec_info(config: &ExecConfig) -> serde_json::Value {
    let mut spec = serde_json::json!({ "interactive": false });
    if let Some(cluster) = &config.cluster_info {
        spec["cluster"] = cluster.clone();
    }
    serde_json::json!({ "apiVersion": config.api_version, "kind": "ExecCredential", "spec": spec })
}

fn run_plugin(config: &ExecConfig, timeout: Duration) -> Result<Vec<u8>, Error> {
    if config.interactive_mode == InteractiveMode::Always {
        return Err(Error::Credentials(
            "exec plugin cannot support interactive mode: standard input is not a terminal; this server runs plugins without a terminal, use interactiveMode IfAvailable or Never"
                .to_string(),
        ));
    }
    let mut command = Command::new(&config.command);
    command
        .args(&config.args)
        .env("KUBERNETES_EXEC_INFO", exec_info(config).to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // stderr is captured: ours carries JSON log lines only.
        .stderr(Stdio::piped());
    for (name, value) in &config.env {
        command.env(name, &value.0);
    }
    let mut child = command.spawn().map_err(|error| {
        if error.kind() == std::io::ErrorKind::NotFound {
            let hint = config
                .install_hint
                .clone()
                .unwrap_or_else(|| "it looks like you are trying to use a client-go credential plugin that is not installed".to_string());
            Error::Credentials(format!("exec: executable {} not found; {}", config.command, hint.trim()))
        } else {
            Error::Credentials(format!("exec: executable {} could not be started: {error}", config.command))
        }
    })?;
    // Both pipes are drained on their own threads so a chatty plugin cannot
    // block on a full pipe, and so a hung plugin can be killed: every API
    // call waits for it, with the credential lock held.
    let stdout_reader = spawn_reader(child.stdout.take());
    let stderr_reader = spawn_reader(child.stderr.take());
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                // The command only: its args and env may hold secrets.
                return Err(Error::Credentials(format!(
                    "exec: executable {} did not finish within {} and was killed; check that it does not wait for a login, a prompt or a network it cannot reach (run it by hand with the same environment)",
                    config.command,
                    duration_text(timeout)
                )));
            }
            Err(error) => return Err(Error::Credentials(format!("exec: executable {}: {error}", config.command))),
        }
    };
    let stdout = stdout_reader.join().unwrap_or_default();
    let stderr = stderr_reader.join().unwrap_or_default();
    if !status.success() {
        let stderr_text = String::from_utf8_lossy(&stderr);
        let tail: String = stderr_text.trim().chars().rev().take(400).collect::<Vec<_>>().into_iter().rev().collect();
        let code = status.code().map_or("a signal".to_string(), |code| format!("exit code {code}"));
        let mut message = format!("exec: executable {} failed with {code}", config.command);
        if !tail.is_empty() {
            message.push_str(&format!(": {tail}"));
        }
        return Err(Error::Credentials(message));
    }
    Ok(stdout)
}

/// Reads a child's pipe to the end on a thread of its own. A thread that
/// cannot start panics, as `std::thread::spawn` does.
fn spawn_reader(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    supervise::spawn(supervise::Kind::ExecPluginReader, move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
    .expect("failed to spawn thread")
}

fn decode_exec_output(config: &ExecConfig, stdout: &[u8]) -> Result<ExecOutput, Error> {
    let value: serde_json::Value = serde_json::from_slice(stdout)
        .map_err(|error| Error::Credentials(format!("exec plugin `{}` printed no ExecCredential JSON: {error}", config.command)))?;
    let returned_version = value.get("apiVersion").and_then(|version| version.as_str()).unwrap_or_default();
    if returned_version != config.api_version {
        return Err(Error::Credentials(format!(
            "exec plugin is configured to use API version {}, plugin returned version {returned_version}",
            config.api_version
        )));
    }
    let status = value.get("status").cloned().unwrap_or_default();
    let text = |key: &str| status.get(key).and_then(|field| field.as_str()).filter(|text| !text.is_empty());
    let token = text("token").map(str::to_string);
    let client_cert = match (text("clientCertificateData"), text("clientKeyData")) {
        (Some(certificate), Some(key)) => {
            Some(crate::kube::tls::client_cert(certificate.as_bytes(), key.as_bytes(), &format!("exec plugin `{}`", config.command))?)
        }
        (None, None) => None,
        _ => {
            return Err(Error::Credentials("exec plugin returned only certificate or key, not both".to_string()));
        }
    };
    if token.is_none() && client_cert.is_none() {
        return Err(Error::Credentials("exec plugin didn't return a token or cert/key pair".to_string()));
    }
    let expires = match text("expirationTimestamp") {
        Some(timestamp) => Some(
            crate::time::parse_rfc3339(timestamp)
                .ok_or_else(|| Error::Credentials(format!("exec plugin returned an unreadable expirationTimestamp `{timestamp}`")))?,
        ),
        None => None,
    };
    Ok(ExecOutput { token, client_cert, expires })
}

/// `60 s`, `1.5 s`, `250 ms`: durations in messages.
fn duration_text(duration: Duration) -> String {
    if duration < Duration::from_secs(1) {
        return format!("{} ms", duration.as_millis());
    }
    if duration.subsec_millis() == 0 {
        return format!("{} s", duration.as_secs());
    }
    format!("{:.1} s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An emptied token file: the previous token is kept, and the file is
    /// read again only once it changes (not at every request).
    #[test]
    fn an_emptied_token_file_keeps_the_token_and_is_not_reread_until_it_changes() {
        let dir = std::env::temp_dir().join(format!("mcp-k8s-token-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "first\n").unwrap();
        let state = TokenFileState { token: None, read_at: None, stamp: None };
        let file = TokenFile { path: path.clone(), state: Mutex::new(state) };
        let bearer = |file: &TokenFile| file.credential(false).unwrap().authorization.map(|header| header.0).unwrap_or_default();
        assert_eq!(bearer(&file), "Bearer first");
        std::fs::write(&path, "").unwrap();
        assert_eq!(bearer(&file), "Bearer first", "the previous token is kept");
        let read_at = file.state.lock().unwrap().read_at;
        assert_eq!(bearer(&file), "Bearer first");
        assert_eq!(file.state.lock().unwrap().read_at, read_at, "not read again while unchanged");
        std::fs::write(&path, "second").unwrap();
        assert_eq!(bearer(&file), "Bearer second", "a change is read");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
