//! The `idempotency_key` argument of `run_job`, `submit_job` and
//! `execute_code` (and their task-augmented calls): read by `call_args`
//! in its one parse of a run call, and turned into the engine's `Keyed`
//! over the call's other arguments. What a key does is
//! `engine::background::idempotency`'s and `engine::background::submit`'s.

use serde::Serialize;
use serde::ser::Serializer;
use serde_json::{Map, Value, json};

use crate::engine::background::idempotency::{Keyed, MAX_KEY_CHARS};

/// The argument's name.
pub const ARGUMENT: &str = "idempotency_key";

/// The key with what it derives, if the call gave one (`null` is none).
/// `tool` is part of what the key stands for, and so are the call's other
/// arguments and the caller, on a server with several.
pub fn key(tool: &str, arguments: &Map<String, Value>, caller: &crate::callers::Caller) -> Result<Option<Keyed>, String> {
    let key = match arguments.get(ARGUMENT) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(key)) => key,
        Some(_) => return Err(format!("`{ARGUMENT}` must be a string, such as a fresh UUID")),
    };
    // The text the arguments without the key serialize to, written from
    // the call's own map: the call's arguments are read, never rewritten.
    let canonical = serde_json::to_string(&WithoutKey(arguments)).map_err(|error| error.to_string())?;
    let keyed = Keyed::from_canonical(key, tool, &canonical).map_err(|error| error.to_string())?;
    Ok(Some(keyed.of_owner(caller.owner())))
}

/// A call's arguments serialized without the key, as `serde_json` writes
/// a map (keys sorted): the same text the map without it would give.
struct WithoutKey<'a>(&'a Map<String, Value>);

impl Serialize for WithoutKey<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().filter(|(name, _)| name.as_str() != ARGUMENT))
    }
}

/// The argument in a tool's input schema; `answer` says what a retry gets.
pub fn schema(answer: &str, result_ttl_s: u64) -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_KEY_CHARS,
        "description": format!(
            "optional: an unguessable key of yours (a fresh UUID), to retry safely: the same key and arguments return \
             {answer} instead of a second run, until {result_ttl_s} s after it ends"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn the_key_stands_for_the_other_arguments() {
        let caller = crate::callers::Caller::whole_server("stdio");
        let plain = object(json!({"image": "busybox", "command": ["true"], "site": "eu"}));
        assert_eq!(key("run_job", &plain, &caller), Ok(None));

        let with_key = object(json!({"image": "busybox", "command": ["true"], "site": "eu", "idempotency_key": "k1"}));
        assert_eq!(key("run_job", &with_key, &caller), Ok(Some(Keyed::new("k1", "run_job", &plain).unwrap())));
        assert_ne!(key("submit_job", &with_key, &caller), key("run_job", &with_key, &caller), "the tool is part of it");

        let null_key = object(json!({"image": "busybox", "command": ["true"], "idempotency_key": null}));
        assert_eq!(key("run_job", &null_key, &caller), Ok(None));

        for (bad, says) in [
            (json!(7), "must be a string"),
            (json!(""), "must not be empty"),
            (json!("a\tb"), "control characters"),
            (json!("k".repeat(MAX_KEY_CHARS + 1)), "more than the 256 allowed"),
        ] {
            let arguments = object(json!({"image": "busybox", "idempotency_key": bad}));
            let error = key("run_job", &arguments, &caller).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
