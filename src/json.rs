//! JSON helpers every layer uses: what kind of value a caller sent (for
//! messages that say "must be a string, not an array"), JSON text
//! written at its exact length, and an operator's settings file parsed
//! with duplicate keys refused. A leaf: imports only `echo`.

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// `value.to_string()`, allocated once at its exact length instead of
/// growing by doubling (which briefly holds up to three times the text).
pub fn json_text(value: &Value) -> String {
    exact_text(&|out: &mut dyn std::io::Write| serde_json::to_writer(out, value).map_err(std::io::Error::other))
        .unwrap_or_else(|| value.to_string())
}

/// Runs `write` twice: once to count the bytes, once into a buffer of
/// exactly that size. `None` if it fails or writes something that is not
/// UTF-8 (neither happens with JSON; the callers fall back to `to_string`).
pub fn exact_text(write: &dyn Fn(&mut dyn std::io::Write) -> std::io::Result<()>) -> Option<String> {
    let mut counter = ByteCounter(0);
    write(&mut counter).ok()?;
    let mut text = Vec::with_capacity(counter.0);
    write(&mut text).ok()?;
    String::from_utf8(text).ok()
}

/// A writer that only counts, for `exact_text`.
struct ByteCounter(usize);

impl std::io::Write for ByteCounter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A JSON value's type for error messages ("must be a number, not a string").
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(number) if number.is_i64() || number.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Why a settings file's text is not the JSON it must be.
#[derive(Debug)]
pub enum ParseError {
    Syntax(serde_json::Error),
    /// An object holds `key` twice. serde_json would keep the last one
    /// silently, so an operator who added a second `token_sha256` or
    /// `kubeconfig` to an entry would get whichever came last; the MCP
    /// messages refuse the same (`protocol/scan.rs`).
    DuplicateKey {
        key: String,
        line: usize,
        column: usize,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Syntax(error) => write!(formatter, "not JSON: {error}"),
            ParseError::DuplicateKey { key, line, column } => write!(
                formatter,
                "key `{}` appears twice in one object (the second at line {line} column {column}); keep one",
                crate::echo::shorten(key)
            ),
        }
    }
}

impl std::error::Error for ParseError {}

/// `serde_json::from_str`, except that an object holding a key twice is an
/// error naming the key and where its second copy is.
pub fn parse_settings(text: &str) -> Result<Value, ParseError> {
    let duplicate = RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let parsed = UniqueKeys(&duplicate).deserialize(&mut deserializer).and_then(|value| deserializer.end().map(|()| value));
    parsed.map_err(|error| match duplicate.into_inner() {
        Some(key) => ParseError::DuplicateKey { key, line: error.line(), column: error.column() },
        None => ParseError::Syntax(error),
    })
}

/// Builds a `Value` as serde_json does, but stops at a key an object
/// already has, leaving the key in the cell (serde's error holds only
/// text, and the position is added by the deserializer around it).
#[derive(Clone, Copy)]
struct UniqueKeys<'a>(&'a RefCell<Option<String>>);

impl<'de> DeserializeSeed<'de> for UniqueKeys<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueKeys<'_> {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_string()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut fields = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if fields.contains_key(&key) {
                *self.0.borrow_mut() = Some(key);
                return Err(serde::de::Error::custom("duplicate key"));
            }
            let value = map.next_value_seed(self)?;
            fields.insert(key, value);
        }
        Ok(Value::Object(fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_json_refuses_a_key_twice_in_any_object() {
        // (text, the value's JSON text, or the error)
        let cases = [
            (r#"[{"name": "a", "size": 1}]"#, Ok(r#"[{"name":"a","size":1}]"#)),
            (r#"{"a": {"b": [1, 2.5, null, true]}, "c": "x"}"#, Ok(r#"{"a":{"b":[1,2.5,null,true]},"c":"x"}"#)),
            // The same key in two objects is no duplicate.
            (r#"[{"name": "a"}, {"name": "b"}]"#, Ok(r#"[{"name":"a"},{"name":"b"}]"#)),
            (
                "[{\"name\": \"a\",\n  \"token_sha256\": \"1\",\n  \"token_sha256\": \"2\"}]",
                Err("key `token_sha256` appears twice in one object (the second at line 3 column 16); keep one"),
            ),
            (r#"{"a": {"k": 1, "k": 2}}"#, Err("key `k` appears twice in one object (the second at line 1 column 18); keep one")),
            // An escape spelling the same key is the same key.
            (r#"{"a": 1, "\u0061": 2}"#, Err("key `a` appears twice in one object (the second at line 1 column 17); keep one")),
            ("[1,", Err("not JSON: EOF while parsing a value at line 1 column 3")),
            ("[] []", Err("not JSON: trailing characters at line 1 column 4")),
        ];
        for (text, want) in cases {
            let got = parse_settings(text).map(|value| value.to_string()).map_err(|error| error.to_string());
            assert_eq!(got.as_deref().map_err(String::as_str), want, "{text}");
        }
    }
}
