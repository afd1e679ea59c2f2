//! Idempotency keys: what makes a retried call with the same key the same
//! run. A key names its run (`Keyed::run_id`, a hash of the key), so every
//! process, a restarted one or another replica, finds the run a key made
//! in the cluster, and two creates of one key collide on the run's name
//! there: the backend's create is the compare-and-set, no lock in one
//! process decides. The call's arguments are kept with the run as a hash
//! (`fingerprint`), so a key given again with other arguments is told
//! apart from a retry (`judge`).
//!
//! Pure: hashes and decisions. Knows nothing of the backends or of MCP;
//! `background::submit` does the looking up and the creating.

use std::fmt;

/// Longest key accepted, in characters (as the schema's `maxLength`
/// counts, so a key the schema allows is never refused here): room for any
/// UUID, ULID or a client's own composite key, bounded because it is
/// echoed in errors.
pub const MAX_KEY_CHARS: usize = 256;

/// A call's key, with what is derived from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keyed {
    /// The caller's key, as given (for messages to that caller; never
    /// logged: it is the caller's data).
    pub key: String,
    /// The run the key names: 128 bits of SHA-256 over the key, in the
    /// shape of every run id (32 lowercase hex digits).
    pub run_id: String,
    /// SHA-256 of the tool's name and its arguments without the key, in
    /// hex: what the run was asked for.
    pub fingerprint: String,
}

/// Why a key cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyError {
    Empty,
    TooLong { chars: usize },
    ControlCharacter,
}

impl fmt::Display for KeyError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Empty => write!(formatter, "`idempotency_key` must not be empty; use a fresh UUID per logical call"),
            KeyError::TooLong { chars } => {
                write!(formatter, "`idempotency_key` is {chars} characters, more than the {MAX_KEY_CHARS} allowed; use a UUID")
            }
            KeyError::ControlCharacter => write!(formatter, "`idempotency_key` must not contain control characters; use a UUID"),
        }
    }
}

/// What a key already in use means for a call that gives it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judged {
    /// The same arguments: the call is a retry, and gets the run's token.
    Same { token: String },
    /// Other arguments (or a run that carries no fingerprint): a key
    /// used for two different calls, which the caller must fix.
    Different,
}

impl Keyed {
    /// `key` for a call of `tool` whose arguments, without the key, are
    /// `arguments` (serialized as `serde_json` does a map: keys sorted, so
    /// the order a client wrote them in does not matter).
    pub fn new(key: &str, tool: &str, arguments: &serde_json::Map<String, serde_json::Value>) -> Result<Keyed, KeyError> {
        Keyed::from_canonical(key, tool, &serde_json::Value::Object(arguments.clone()).to_string())
    }

    /// `new` for arguments already serialized as `serde_json` does a map.
    pub fn from_canonical(key: &str, tool: &str, canonical: &str) -> Result<Keyed, KeyError> {
        check_key(key)?;
        Ok(Keyed { key: key.to_string(), run_id: run_id_for(key), fingerprint: fingerprint(tool, canonical) })
    }
}

/// A key a caller may use: 1 to `MAX_KEY_CHARS` characters, no control
/// characters (it is echoed in messages).
fn check_key(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    let chars = key.chars().count();
    if chars > MAX_KEY_CHARS {
        return Err(KeyError::TooLong { chars });
    }
    if key.chars().any(char::is_control) {
        return Err(KeyError::ControlCharacter);
    }
    Ok(())
}

/// The run id a key names. The domain prefix keeps these hashes apart
/// from any other SHA-256 of the same text.
fn run_id_for(key: &str) -> String {
    let digest = sha256(&[b"mcp-k8s-ephemeral-job idempotency key\0", key.as_bytes()]);
    hex(&digest[..16])
}

impl Keyed {
    /// The key as `owner`'s, on a server with several callers: two
    /// callers' keys never name the same run, so one cannot find (or
    /// collide with) the other's.
    pub fn of_owner(self, owner: Option<&str>) -> Keyed {
        self.scoped(b"mcp-k8s-ephemeral-job idempotency key of a caller\0", owner)
    }

    /// The key as one of the named site `site`'s: the same key on two
    /// sites names two runs, which the shared output store keeps apart.
    pub fn of_site(self, site: Option<&str>) -> Keyed {
        self.scoped(b"mcp-k8s-ephemeral-job idempotency key on a site\0", site)
    }

    fn scoped(self, domain: &[u8], scope: Option<&str>) -> Keyed {
        let Some(scope) = scope else { return self };
        let digest = sha256(&[domain, scope.as_bytes(), b"\0", self.run_id.as_bytes()]);
        Keyed { run_id: hex(&digest[..16]), ..self }
    }
}

/// The fingerprint of a call of `tool` with `canonical` arguments.
pub fn fingerprint(tool: &str, canonical: &str) -> String {
    hex(&sha256(&[tool.as_bytes(), b"\0", canonical.as_bytes()]))
}

/// A call with fingerprint `ours` against the run its key already names,
/// which carries `token` and `stored` (its fingerprint, if any).
pub fn judge(ours: &str, token: &str, stored: Option<&str>) -> Judged {
    match stored {
        Some(stored) if stored == ours => Judged::Same { token: token.to_string() },
        _ => Judged::Different,
    }
}

fn sha256(parts: &[&[u8]]) -> Vec<u8> {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        context.update(part);
    }
    context.finish().as_ref().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn arguments(value: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn keys_are_checked() {
        let long = "k".repeat(MAX_KEY_CHARS + 1);
        // 256 two-byte characters: what the schema's maxLength allows.
        let accented = "é".repeat(MAX_KEY_CHARS);
        for (key, expected) in [
            ("7f0c2a4e-1b7d-4c55-9f0e-0d6b2a1f9c3e", Ok(())),
            ("build #12 / step 3", Ok(())),
            ("k".repeat(MAX_KEY_CHARS).as_str(), Ok(())),
            (accented.as_str(), Ok(())),
            ("", Err(KeyError::Empty)),
            (long.as_str(), Err(KeyError::TooLong { chars: MAX_KEY_CHARS + 1 })),
            ("a\nb", Err(KeyError::ControlCharacter)),
            ("a\u{0}", Err(KeyError::ControlCharacter)),
        ] {
            assert_eq!(check_key(key), expected, "{key:?}");
        }
    }

    #[test]
    fn a_key_names_one_run_id_of_the_usual_shape_for_ever() {
        // A stored contract: a key given before an upgrade must find its run after it.
        assert_eq!(run_id_for("7f0c2a4e-1b7d-4c55-9f0e-0d6b2a1f9c3e"), run_id_for("7f0c2a4e-1b7d-4c55-9f0e-0d6b2a1f9c3e"));
        // SHA-256 of "mcp-k8s-ephemeral-job idempotency key\0a", its first 16 bytes (Python's hashlib agrees).
        assert_eq!(run_id_for("a"), "baefc87ace104098f65ae8136914e0aa");
        assert_ne!(run_id_for("a"), run_id_for("b"));
        let keyed = Keyed::new("a", "run_job", &serde_json::Map::new()).unwrap();
        assert_eq!(keyed.clone().of_owner(None), keyed, "one caller: the key's run as before callers");
        let of_x = keyed.clone().of_owner(Some("x"));
        assert_ne!(of_x.run_id, keyed.run_id);
        assert_ne!(of_x.run_id, keyed.clone().of_owner(Some("y")).run_id, "two callers' keys name two runs");
        assert_eq!((of_x.key.as_str(), of_x.fingerprint.as_str()), (keyed.key.as_str(), keyed.fingerprint.as_str()));
        let on_eu = of_x.clone().of_site(Some("eu"));
        assert_ne!(on_eu.run_id, of_x.run_id, "the same key on two sites names two runs");
        assert_ne!(on_eu.run_id, keyed.clone().of_site(Some("eu")).run_id);
        assert_eq!(of_x.clone().of_site(None), of_x);
        let id = run_id_for("any key");
        assert!(id.len() == 32 && id.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f')), "{id}");
    }

    #[test]
    fn the_fingerprint_is_the_tool_and_the_arguments_in_any_order() {
        let one = Keyed::new("k", "run_job", &arguments(json!({"image": "busybox", "command": ["true"]}))).unwrap();
        let reordered = Keyed::new("k", "run_job", &arguments(json!({"command": ["true"], "image": "busybox"}))).unwrap();
        let other_command = Keyed::new("k", "run_job", &arguments(json!({"image": "busybox", "command": ["false"]}))).unwrap();
        let other_tool = Keyed::new("k", "submit_job", &arguments(json!({"image": "busybox", "command": ["true"]}))).unwrap();
        let other_key = Keyed::new("k2", "run_job", &arguments(json!({"image": "busybox", "command": ["true"]}))).unwrap();
        assert_eq!(one, reordered);
        assert_ne!(one.fingerprint, other_command.fingerprint);
        assert_ne!(one.fingerprint, other_tool.fingerprint);
        assert_eq!((one.fingerprint == other_key.fingerprint, one.run_id == other_key.run_id), (true, false));
        assert_eq!(one.run_id, other_tool.run_id, "a key names one run, whatever the tool");
    }

    #[test]
    fn a_key_given_again_is_a_retry_only_with_the_same_fingerprint() {
        for (stored, expected) in
            [(Some("f1"), Judged::Same { token: "job-t".to_string() }), (Some("f2"), Judged::Different), (None, Judged::Different)]
        {
            assert_eq!(judge("f1", "job-t", stored), expected, "{stored:?}");
        }
    }
}
