//! The runner's clone half, run by the `clone` init container (an image with
//! git, MCP_K8S_CLONE_IMAGE) after `prepare` copied this binary into the pod:
//!
//! - `runner clone --repo-url URL --ref REF --dest DIR --creds-dir DIR`
//!   checks out one branch, tag or full commit SHA, shallow, with
//!   `git init` + `git fetch --depth 1 origin REF` + `git checkout FETCH_HEAD`
//!   (the original's `git clone --branch` cannot check out a SHA);
//! - `runner credential --creds-dir DIR get` is git's credential helper:
//!   it answers git's `host=` question from the mounted clone Secret.
//!
//! Caller values (URL, ref, folder) only ever travel as argv elements of
//! `git`; no shell sees them. The token only ever travels from the mounted
//! file to git's stdin through the helper: never argv, never environment,
//! never `.git/config` (the helper is given with `-c`, which git does not
//! store), and the finished checkout is searched for it before success.
//!
//! Secret layout: one key per git host, holding its token. The key is the
//! host in lowercase; a host with a port uses `_` between them
//! (`git.example.com_8443`), because Secret keys may not contain `:` and
//! host names never contain `_`. The optional key `_ca.crt` holds PEM
//! certificates git trusts in addition to the image's own, for git servers
//! with a private CA.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::sandbox::args::{self, CloneOptions, CredentialOptions};

/// Secret key with extra CA certificates; never a host key, since host keys
/// never start with `_`.
const CA_BUNDLE_KEY: &str = "_ca.crt";
/// User name sent with the token; GitHub and GitLab accept it for tokens.
const TOKEN_USERNAME: &str = "oauth2";
/// How much of git's output a failure message keeps (the end holds the error).
const OUTPUT_TAIL_BYTES: usize = 2048;

/// The Secret key holding the token for `authority` (`host` or
/// `host:port`, as git reports it): lowercase, `:` replaced by `_`, and the
/// default https port dropped so `host:443` and `host` share one key.
pub fn secret_key(authority: &str) -> String {
    let authority = authority.to_ascii_lowercase();
    let authority = authority.strip_suffix(":443").unwrap_or(&authority);
    authority.replace(':', "_")
}

/// The `host[:port]` of an `https://` URL, or `None` when it has none.
fn authority_of(repo_url: &str) -> Option<&str> {
    let rest = repo_url.strip_prefix("https://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    (!authority.is_empty()).then_some(authority)
}

/// Checks the repository out; `Err` carries git's masked output tail.
pub fn run_clone(options: &CloneOptions) -> Result<i32, String> {
    // The server checked these; they are repeated because this code hands
    // them to git.
    if authority_of(&options.repo_url).is_none_or(|authority| authority.contains('@')) {
        return Err(format!("repo_url `{}` must be https:// without credentials", options.repo_url));
    }
    if options.git_ref.starts_with('-') {
        return Err(format!("ref `{}` must not start with `-`", options.git_ref));
    }
    let secrets = Secrets::read(&options.creds_dir);
    std::fs::create_dir_all(&options.dest).map_err(|error| format!("cannot create `{}`: {error}", options.dest.display()))?;
    let config = git_config(options)?;
    let git = |args: &[&str]| run_git(&options.dest, &config, args, &secrets);
    git(&["init", "--quiet"])?;
    git(&["remote", "add", "origin", &options.repo_url])?;
    if let Some(authority) = authority_of(&options.repo_url)
        && !proxied()
    {
        await_reachable(authority, REACH_BUDGET)?;
    }
    git(&["fetch", "--depth", "1", "--no-tags", "origin", &options.git_ref]).map_err(|error| with_hint(error, options))?;
    git(&["checkout", "--quiet", "--detach", "FETCH_HEAD"])?;
    if let Some(file) = secrets.find_in_tree(&options.dest.join(".git")) {
        // Should never happen; if it does, nothing of the checkout is kept.
        let _ = std::fs::remove_dir_all(&options.dest);
        return Err(format!("a git token was found in `{}` after the clone; the checkout was deleted", file.display()));
    }
    println!("cloned {} at {} into {}", options.repo_url, options.git_ref, options.dest.display());
    Ok(0)
}

/// How long the clone waits for the repository's host to accept a TCP
/// connection. git has no connect timeout of its own (curl's SYN retries
/// take two minutes), and a pod's network can come up a few seconds after
/// its containers do (a policy plugin programming a new pod), so a stalled
/// connect is retried for this long and then named, well inside the start
/// timeout.
const REACH_BUDGET: Duration = Duration::from_secs(30);
const REACH_ATTEMPT: Duration = Duration::from_secs(3);

/// git goes through a proxy when one is set: the repository's host is then
/// the proxy's to reach.
fn proxied() -> bool {
    ["https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()))
}

/// Waits until `authority` (`host[:port]`, port 443 by default) accepts a
/// TCP connection, retrying for `budget`; `Err` says what to check.
fn await_reachable(authority: &str, budget: Duration) -> Result<(), String> {
    let target = if authority.rsplit_once(':').is_some_and(|(_, port)| port.parse::<u16>().is_ok()) && !authority.ends_with(']') {
        authority.to_string()
    } else {
        format!("{authority}:443")
    };
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < budget {
        match target.to_socket_addrs() {
            Ok(addresses) => {
                for address in addresses {
                    match TcpStream::connect_timeout(&address, REACH_ATTEMPT) {
                        Ok(_) => return Ok(()),
                        Err(error) => last = format!("{address}: {error}"),
                    }
                }
            }
            Err(error) => last = format!("cannot resolve `{target}`: {error}"),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(format!(
        "could not connect to {target} within {} s ({last}); check that the run's network mode reaches it (`open`, or the `restricted` allowlist) and that the host is up",
        budget.as_secs()
    ))
}

/// `runner credential --creds-dir DIR ACTION`: git's credential helper
/// protocol (`git help credential`). Only `get` answers; `store` and
/// `erase` do nothing, since nothing is ever stored.
pub fn run_credential(options: &CredentialOptions) -> Result<i32, String> {
    let CredentialOptions { creds_dir, action } = options;
    if action.as_deref() != Some("get") {
        return Ok(0);
    }
    let request = read_credential_request(std::io::stdin().lock());
    if let Some(answer) = credential_answer(&request, creds_dir) {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(answer.as_bytes()).map_err(|error| format!("cannot answer git: {error}"))?;
    }
    Ok(0)
}

/// Git's `key=value` lines up to an empty line or the end.
fn read_credential_request(input: impl BufRead) -> BTreeMap<String, String> {
    input
        .lines()
        .map_while(Result::ok)
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.split_once('=').map(|(key, value)| (key.to_string(), value.to_string())))
        .collect()
}

/// The helper's answer for an https request whose host has a token;
/// `None` lets git go on without one (public repositories).
fn credential_answer(request: &BTreeMap<String, String>, creds_dir: &Path) -> Option<String> {
    if request.get("protocol").map(String::as_str) != Some("https") {
        return None;
    }
    let key = secret_key(request.get("host")?);
    if key.starts_with('_') || key.contains('/') || key.starts_with('.') {
        return None;
    }
    let token = read_token(&creds_dir.join(key))?;
    Some(format!("username={TOKEN_USERNAME}\npassword={token}\n"))
}

fn read_token(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let token = text.trim();
    (!token.is_empty()).then(|| token.to_string())
}

/// The `-c` settings every git call gets. None holds a caller value or a
/// secret; the helper's path is this binary.
fn git_config(options: &CloneOptions) -> Result<Vec<String>, String> {
    let exe = std::env::current_exe().map_err(|error| format!("cannot find the runner's own path: {error}"))?;
    let mut config = vec![
        // An empty value clears helpers from the image's system config.
        "credential.helper=".to_string(),
        format!("credential.helper={}", args::credential_helper(&exe, &options.creds_dir)),
        // The workdir volume belongs to root (group: the pod's fsGroup).
        "safe.directory=*".to_string(),
        "init.defaultBranch=main".to_string(),
        "advice.detachedHead=false".to_string(),
    ];
    if let Some(bundle) = extra_ca_bundle(&options.creds_dir)? {
        config.push(format!("http.sslCAInfo={}", bundle.display()));
    }
    Ok(config)
}

/// Writes the image's CA bundle plus the Secret's `_ca.crt` to a temporary
/// file, because `http.sslCAInfo` replaces the bundle rather than adding to
/// it. `None` without `_ca.crt`.
fn extra_ca_bundle(creds_dir: &Path) -> Result<Option<PathBuf>, String> {
    let Ok(extra) = std::fs::read(creds_dir.join(CA_BUNDLE_KEY)) else { return Ok(None) };
    const SYSTEM_BUNDLES: &[&str] = &["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"];
    let mut bundle = SYSTEM_BUNDLES.iter().find_map(|path| std::fs::read(path).ok()).unwrap_or_default();
    bundle.push(b'\n');
    bundle.extend_from_slice(&extra);
    let path = std::env::temp_dir().join("mcp-git-ca.pem");
    std::fs::write(&path, bundle).map_err(|error| format!("cannot write `{}`: {error}", path.display()))?;
    Ok(Some(path))
}

fn run_git(dest: &Path, config: &[String], args: &[&str], secrets: &Secrets) -> Result<(), String> {
    let mut command = Command::new("git");
    command.arg("-C").arg(dest);
    for setting in config {
        command.arg("-c").arg(setting);
    }
    command.args(args);
    // Never wait for a person, and never hand the token to another program.
    command.env("GIT_TERMINAL_PROMPT", "0").env_remove("GIT_ASKPASS").env_remove("SSH_ASKPASS");
    println!("running: git {}", args.join(" "));
    let output = command.output().map_err(|error| format!("cannot run `git`: {error}; is git in MCP_K8S_CLONE_IMAGE?"))?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    let code = output.status.code().map_or_else(|| "a signal".to_string(), |code| format!("code {code}"));
    Err(format!("`git {}` failed ({code}): {}", args.join(" "), tail(&secrets.mask(&text))))
}

/// Says which Secret key was looked for when a fetch fails, the usual cause.
fn with_hint(error: String, options: &CloneOptions) -> String {
    let Some(authority) = authority_of(&options.repo_url) else { return error };
    let key = secret_key(authority);
    if read_token(&options.creds_dir.join(&key)).is_some() {
        format!("{error}; check that `ref` exists and that the token in the clone Secret's key `{key}` may read the repository")
    } else {
        format!("{error}; the clone Secret has no key `{key}`, so git tried without a token")
    }
}

fn tail(text: &str) -> String {
    let text = text.trim();
    if text.len() <= OUTPUT_TAIL_BYTES {
        return text.to_string();
    }
    let mut start = text.len() - OUTPUT_TAIL_BYTES;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &text[start..])
}

/// The tokens of the mounted Secret, for masking output and searching the
/// checkout. Also their `user:token` base64 form, as in an HTTP header.
struct Secrets {
    needles: Vec<String>,
}

impl Secrets {
    fn read(creds_dir: &Path) -> Secrets {
        let mut needles = Vec::new();
        let entries = std::fs::read_dir(creds_dir).into_iter().flatten().flatten();
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            // `..data` and friends are the Secret volume's own bookkeeping.
            if name.starts_with('.') || name == CA_BUNDLE_KEY {
                continue;
            }
            if let Some(token) = read_token(&entry.path()) {
                let header = base64::engine::general_purpose::STANDARD.encode(format!("{TOKEN_USERNAME}:{token}"));
                needles.push(token);
                needles.push(header);
            }
        }
        Secrets { needles }
    }

    fn mask(&self, text: &str) -> String {
        self.needles.iter().fold(text.to_string(), |text, needle| text.replace(needle.as_str(), "***"))
    }

    /// The first file under `dir` holding a token, if any.
    fn find_in_tree(&self, dir: &Path) -> Option<PathBuf> {
        if self.needles.is_empty() {
            return None;
        }
        let mut pending = vec![dir.to_path_buf()];
        while let Some(folder) = pending.pop() {
            for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                let path = entry.path();
                let Ok(kind) = entry.file_type() else { continue };
                if kind.is_dir() {
                    pending.push(path);
                } else if kind.is_file() && self.file_holds_a_token(&path) {
                    return Some(path);
                }
            }
        }
        None
    }

    fn file_holds_a_token(&self, path: &Path) -> bool {
        let Ok(bytes) = std::fs::read(path) else { return false };
        self.needles.iter().any(|needle| bytes.windows(needle.len()).any(|window| window == needle.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_keys_for_hosts() {
        let cases = [
            ("github.com", "github.com"),
            ("GitHub.com", "github.com"),
            ("git.example.com:8443", "git.example.com_8443"),
            ("git.example.com:443", "git.example.com"),
            ("10.0.0.1:3000", "10.0.0.1_3000"),
        ];
        for (authority, key) in cases {
            assert_eq!(secret_key(authority), key, "{authority}");
        }
    }

    #[test]
    fn authorities() {
        assert_eq!(authority_of("https://github.com/org/repo.git"), Some("github.com"));
        assert_eq!(authority_of("https://h:8443"), Some("h:8443"));
        assert_eq!(authority_of("http://h/x"), None);
        assert_eq!(authority_of("https:///x"), None);
    }

    #[test]
    fn the_helper_answers_only_https_hosts_with_a_token() {
        let dir = std::env::temp_dir().join(format!("runner-creds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("git.example.com_8443"), "tok-1\n").unwrap();
        std::fs::write(dir.join("empty.example.com"), "\n").unwrap();
        let request = |text: &str| read_credential_request(text.as_bytes());
        let answer = credential_answer(&request("protocol=https\nhost=git.example.com:8443\npath=x\n\n"), &dir);
        assert_eq!(answer.as_deref(), Some("username=oauth2\npassword=tok-1\n"));
        for text in [
            "protocol=http\nhost=git.example.com:8443\n",
            "protocol=https\nhost=other.example.com\n",
            "protocol=https\nhost=empty.example.com\n",
            "protocol=https\nhost=_ca.crt\n",
            "protocol=https\n",
        ] {
            assert_eq!(credential_answer(&request(text), &dir), None, "{text}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tokens_are_masked_and_found() {
        let dir = std::env::temp_dir().join(format!("runner-mask-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("tree/sub")).unwrap();
        std::fs::write(dir.join("host"), "s3cr3t-token").unwrap();
        let secrets = Secrets::read(&dir);
        assert_eq!(secrets.mask("fatal: s3cr3t-token rejected"), "fatal: *** rejected");
        let header = base64::engine::general_purpose::STANDARD.encode("oauth2:s3cr3t-token");
        assert_eq!(secrets.mask(&format!("Authorization: Basic {header}")), "Authorization: Basic ***");
        std::fs::write(dir.join("tree/sub/config"), "[remote]\nurl = https://h/r\n").unwrap();
        assert_eq!(secrets.find_in_tree(&dir.join("tree")), None);
        std::fs::write(dir.join("tree/sub/leak"), "x s3cr3t-token y").unwrap();
        assert_eq!(secrets.find_in_tree(&dir.join("tree")), Some(dir.join("tree/sub/leak")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn long_output_keeps_its_end() {
        let text = format!("{}the error", "x".repeat(5000));
        let kept = tail(&text);
        assert!(kept.starts_with("...") && kept.ends_with("the error") && kept.len() <= OUTPUT_TAIL_BYTES + 3);
    }

    #[test]
    fn a_host_that_accepts_is_reached_and_one_that_refuses_is_named() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(await_reachable(&format!("127.0.0.1:{port}"), Duration::from_secs(2)), Ok(()));
        drop(listener);
        let error = await_reachable(&format!("127.0.0.1:{port}"), Duration::from_secs(1)).unwrap_err();
        assert!(error.starts_with(&format!("could not connect to 127.0.0.1:{port} within 1 s (127.0.0.1:{port}: ")), "{error}");
        assert!(error.contains("check that the run's network mode reaches it"), "{error}");
    }
}
