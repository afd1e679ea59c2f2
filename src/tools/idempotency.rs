//! The `idempotency_key` argument of `run_job`, `submit_job` and
//! `execute_code` (and their task-augmented calls): taken off the
//! arguments before they are checked, so each tool's own checks never see
//! it, and turned into the engine's `Keyed` over what is left. What a key
//! does is `engine::background::idempotency`'s and `engine::background::submit`'s.

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use crate::engine::background::idempotency::{Keyed, MAX_KEY_CHARS};

/// The argument's name.
pub const ARGUMENT: &str = "idempotency_key";

/// A call's arguments without the key, and the key if one was given.
pub type Split<'a> = (Cow<'a, Map<String, Value>>, Option<Keyed>);

/// The call's arguments without the key, and the key with what it
/// derives, if one was given (`null` is none). `tool` is part of what the
/// key stands for, and so is the caller, on a server with several.
pub fn split<'a>(tool: &str, arguments: &'a Map<String, Value>, caller: &crate::callers::Caller) -> Result<Split<'a>, String> {
    let Some(value) = arguments.get(ARGUMENT) else { return Ok((Cow::Borrowed(arguments), None)) };
    let mut rest = arguments.clone();
    rest.remove(ARGUMENT);
    let key = match value {
        Value::Null => return Ok((Cow::Owned(rest), None)),
        Value::String(key) => key,
        _ => return Err(format!("`{ARGUMENT}` must be a string, such as a fresh UUID")),
    };
    let keyed = Keyed::new(key, tool, &rest).map_err(|error| error.to_string())?.of_owner(caller.owner());
    Ok((Cow::Owned(rest), Some(keyed)))
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
    fn the_key_is_taken_off_the_arguments_it_stands_for() {
        let plain = object(json!({"image": "busybox", "command": ["true"]}));
        let (rest, keyed) = split("run_job", &plain, &crate::callers::Caller::whole_server("stdio")).unwrap();
        assert!(matches!(rest, Cow::Borrowed(_)) && keyed.is_none());

        let with_key = object(json!({"image": "busybox", "command": ["true"], "idempotency_key": "k1"}));
        let (rest, keyed) = split("run_job", &with_key, &crate::callers::Caller::whole_server("stdio")).unwrap();
        assert_eq!(*rest, plain);
        assert_eq!(keyed, Some(Keyed::new("k1", "run_job", &plain).unwrap()));

        let null_key = object(json!({"image": "busybox", "command": ["true"], "idempotency_key": null}));
        let (rest, keyed) = split("run_job", &null_key, &crate::callers::Caller::whole_server("stdio")).unwrap();
        assert_eq!((*rest == plain, keyed), (true, None));

        for (bad, says) in [
            (json!(7), "must be a string"),
            (json!(""), "must not be empty"),
            (json!("a\tb"), "control characters"),
            (json!("k".repeat(MAX_KEY_CHARS + 1)), "more than the 256 allowed"),
        ] {
            let arguments = object(json!({"image": "busybox", "idempotency_key": bad}));
            let error = split("run_job", &arguments, &crate::callers::Caller::whole_server("stdio")).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
