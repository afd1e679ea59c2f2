//! JSON helpers every layer uses: what kind of value a caller sent (for
//! messages that say "must be a string, not an array") and JSON text
//! written at its exact length. A leaf: imports nothing of the crate.

use serde_json::Value;

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
