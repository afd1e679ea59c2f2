//! A pre-scan of one incoming JSON text, before anything builds a
//! `serde_json::Value` from it.
//!
//! A `Value` costs up to ~35× the bytes it was read from (an 8 MB message
//! of tiny values peaked at 287 MB), so the message is first walked as
//! bytes by a small JSON tokenizer that allocates nothing per token. It
//! refuses a message with more than `Limits::max_values` values or nested
//! deeper than `Limits::max_depth`, with an object holding the same key
//! twice (serde_json keeps the last one silently, so `"image":"evil:1",
//! "image":"busybox:1.36"` would be judged by one copy and read by
//! whoever reads the other), or with a number no `f64` can hold (`1e400`:
//! serde_json fails the whole message, losing its id). On the way it
//! picks out the raw text of the top-level `id`, so even a refused message
//! is answered with the id its client waits for.
//!
//! Pure and transport-free: it knows JSON syntax and nothing of JSON-RPC
//! beyond where the `id` member sits.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

/// What a message may hold. These are fixed, not settings: together with
/// `MCP_K8S_MAX_MESSAGE_BYTES` they bound the memory one message costs,
/// and no valid tool call comes near them (the largest, `run_job` with
/// `files`, `env` and `command` at their caps, holds under 20,000 values
/// and nests 4 deep).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Values (each string, number, literal, array and object, and each
    /// object key) in one message.
    pub max_values: usize,
    /// Arrays and objects open at once.
    pub max_depth: usize,
}

/// The limits the server uses. serde_json's own recursion limit is 128;
/// this stays well under it so the scan, not serde, decides.
pub const LIMITS: Limits = Limits { max_values: 100_000, max_depth: 64 };

/// Bytes one parsed value may cost beyond its text: a `Value` is 32 bytes,
/// and a growing array or object may hold as much again in spare room.
const VALUE_BYTES: usize = 64;

/// An upper bound on the memory a message of `bytes` bytes holding
/// `values` values costs once parsed into `Value`s: its text again (the
/// strings' contents) plus `VALUE_BYTES` per value. The transports and the
/// calls in flight count this, not the text, against their budgets: 99,000
/// strings of 38 characters are 4.06 MB of text and about 10 MB of values.
pub fn parsed_cost(bytes: usize, values: usize) -> usize {
    bytes.saturating_add(values.saturating_mul(VALUE_BYTES))
}

/// `parsed_cost` of a message's text, scanning it (allocation-free). A
/// message the scan refuses is never parsed into values: its text alone.
pub fn parsed_cost_of(text: &str) -> usize {
    let values = scan(text, &LIMITS).map(|scanned| scanned.n_values).unwrap_or(0);
    parsed_cost(text.len(), values)
}

/// The raw top-level `id` member of a message: its JSON text exactly as
/// the client wrote it (quotes and escapes included), and its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawId<'a> {
    pub text: &'a str,
    pub kind: IdKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKind {
    String,
    /// A number without fraction or exponent (it may not fit any integer type).
    Integer,
    /// Any other number (`1.5`, `1e3`).
    Number,
    /// `null`, a boolean, an array or an object.
    Other,
}

/// What a successful scan learnt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scanned<'a> {
    /// `None` when the message is not an object or has no `id` member.
    pub id: Option<RawId<'a>>,
    pub n_values: usize,
}

/// Why a message was refused, and its id when the scan got that far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanError<'a> {
    pub kind: ScanErrorKind,
    pub id: Option<RawId<'a>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanErrorKind {
    /// Not JSON at all; `offset` is the byte where it went wrong.
    Syntax {
        offset: usize,
        expected: &'static str,
    },
    /// Not JSON: the text ends inside a value.
    EndedEarly {
        expected: &'static str,
    },
    TooManyValues {
        limit: usize,
    },
    TooDeep {
        limit: usize,
    },
    /// `key` is shortened for the message (`crate::echo`).
    DuplicateKey {
        key: String,
    },
    /// A number outside the range of an `f64`; `text` is shortened.
    NumberOutOfRange {
        text: String,
    },
}

impl ScanErrorKind {
    /// True when the text is not JSON (JSON-RPC's -32700); the others are
    /// valid JSON this server refuses to read (-32600).
    pub fn is_syntax(&self) -> bool {
        matches!(self, ScanErrorKind::Syntax { .. } | ScanErrorKind::EndedEarly { .. })
    }
}

impl fmt::Display for ScanErrorKind {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanErrorKind::Syntax { offset, expected } => {
                write!(formatter, "parse error: expected {expected} at byte {offset}")
            }
            ScanErrorKind::EndedEarly { expected } => write!(formatter, "parse error: the message ends early; expected {expected}"),
            ScanErrorKind::TooManyValues { limit } => {
                write!(formatter, "the message holds more than {limit} JSON values, the most one message may; send less per call")
            }
            ScanErrorKind::TooDeep { limit } => {
                write!(formatter, "the message nests arrays and objects more than {limit} deep, the most one message may")
            }
            ScanErrorKind::DuplicateKey { key } => {
                write!(formatter, "an object holds the key `{key}` twice; send each key once")
            }
            ScanErrorKind::NumberOutOfRange { text } => {
                write!(formatter, "the number `{text}` is outside the range of a 64-bit float (about ±1.8e308)")
            }
        }
    }
}

/// Walks `text` once. Syntax errors stop the walk; a limit, duplicate key
/// or number range violation is remembered and the walk goes on (checking
/// syntax only) so that the answer can still carry the message's id.
pub fn scan<'a>(text: &'a str, limits: &Limits) -> Result<Scanned<'a>, ScanError<'a>> {
    let mut scanner = Scanner { text, bytes: text.as_bytes(), position: 0, limits: *limits, n_values: 0, violation: None, id: None };
    match scanner.walk() {
        Err(kind) => Err(ScanError { kind, id: scanner.id }),
        Ok(()) => match scanner.violation {
            Some(kind) => Err(ScanError { kind, id: scanner.id }),
            None => Ok(Scanned { id: scanner.id, n_values: scanner.n_values }),
        },
    }
}

// ---------------------------------------------------------------------------

struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    position: usize,
    limits: Limits,
    n_values: usize,
    /// The first limit broken; once set, key sets are no longer kept.
    violation: Option<ScanErrorKind>,
    id: Option<RawId<'a>>,
}

/// The keys of one open object, borrowed unless escaped; `None` for an
/// array, or once a violation makes them pointless.
type KeySet<'a> = Option<HashSet<Cow<'a, str>>>;

/// What the walk expects next.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    Value,
    /// A key, or `}` right after `{`.
    FirstKey,
    Key,
    /// `,` or the container's close.
    Next,
}

impl<'a> Scanner<'a> {
    fn walk(&mut self) -> Result<(), ScanErrorKind> {
        // The open containers, one byte each (`{` or `[`): nesting past the
        // limit is still checked for syntax, and this stack is bounded by
        // the message size. Key sets exist only within the depth limit.
        let mut open: Vec<u8> = Vec::new();
        let mut key_sets: Vec<KeySet<'a>> = Vec::new();
        let mut expect = Expect::Value;
        // True while the next value is the top-level object's `id`.
        let mut value_is_id = false;
        loop {
            self.skip_white_space();
            match expect {
                Expect::Value => {
                    self.count_value();
                    let start = self.position;
                    let Some(&byte) = self.bytes.get(start) else {
                        return Err(self.syntax("a value"));
                    };
                    let kind = match byte {
                        b'{' | b'[' => {
                            self.position += 1;
                            if open.len() >= self.limits.max_depth {
                                self.violate(ScanErrorKind::TooDeep { limit: self.limits.max_depth });
                            }
                            open.push(byte);
                            if open.len() <= self.limits.max_depth {
                                key_sets.push((byte == b'{' && self.violation.is_none()).then(HashSet::new));
                            }
                            if byte == b'{' {
                                expect = Expect::FirstKey;
                            } else {
                                self.skip_white_space();
                                if self.bytes.get(self.position) == Some(&b']') {
                                    self.position += 1;
                                    self.close(&mut open, &mut key_sets);
                                    expect = Expect::Next;
                                }
                            }
                            if value_is_id {
                                self.id = Some(RawId { text: &self.text[start..start + 1], kind: IdKind::Other });
                                value_is_id = false;
                            }
                            continue;
                        }
                        b'"' => {
                            self.string()?;
                            IdKind::String
                        }
                        b'-' | b'0'..=b'9' => self.number()?,
                        b't' => self.literal("true")?,
                        b'f' => self.literal("false")?,
                        b'n' => self.literal("null")?,
                        _ => return Err(self.syntax("a value")),
                    };
                    if value_is_id {
                        self.id = Some(RawId { text: &self.text[start..self.position], kind });
                        value_is_id = false;
                    }
                    expect = Expect::Next;
                }
                Expect::FirstKey | Expect::Key => {
                    if expect == Expect::FirstKey && self.bytes.get(self.position) == Some(&b'}') {
                        self.position += 1;
                        self.close(&mut open, &mut key_sets);
                        expect = Expect::Next;
                        continue;
                    }
                    if self.bytes.get(self.position) != Some(&b'"') {
                        return Err(self.syntax("an object key in double quotes"));
                    }
                    self.count_value();
                    let start = self.position;
                    self.string()?;
                    let raw = &self.text[start..self.position];
                    let is_top_level = open.len() == 1;
                    let key = key_text(raw);
                    value_is_id = is_top_level && key == "id";
                    let keys = if open.len() <= self.limits.max_depth { key_sets.last_mut() } else { None };
                    if let Some(Some(keys)) = keys
                        && !keys.insert(key)
                    {
                        let key = crate::echo::shorten(&key_text(raw)).into_owned();
                        self.violate(ScanErrorKind::DuplicateKey { key });
                    }
                    self.skip_white_space();
                    if self.bytes.get(self.position) != Some(&b':') {
                        return Err(self.syntax("`:` after an object key"));
                    }
                    self.position += 1;
                    expect = Expect::Value;
                }
                Expect::Next => {
                    let Some(&container) = open.last() else {
                        if self.position == self.bytes.len() {
                            return Ok(());
                        }
                        return Err(self.syntax("the end of the message"));
                    };
                    let is_object = container == b'{';
                    match self.bytes.get(self.position) {
                        Some(b',') => {
                            self.position += 1;
                            expect = if is_object { Expect::Key } else { Expect::Value };
                        }
                        Some(b'}') if is_object => {
                            self.position += 1;
                            self.close(&mut open, &mut key_sets);
                        }
                        Some(b']') if !is_object => {
                            self.position += 1;
                            self.close(&mut open, &mut key_sets);
                        }
                        _ => return Err(self.syntax(if is_object { "`,` or `}`" } else { "`,` or `]`" })),
                    }
                }
            }
            if self.violation.is_some() {
                // Key sets are no use any more; free them early.
                key_sets.iter_mut().for_each(|keys| *keys = None);
            }
        }
    }

    fn close(&self, open: &mut Vec<u8>, key_sets: &mut Vec<KeySet<'a>>) {
        if open.len() <= self.limits.max_depth {
            key_sets.pop();
        }
        open.pop();
    }

    fn count_value(&mut self) {
        self.n_values += 1;
        if self.n_values > self.limits.max_values {
            self.violate(ScanErrorKind::TooManyValues { limit: self.limits.max_values });
        }
    }

    fn violate(&mut self, kind: ScanErrorKind) {
        if self.violation.is_none() {
            self.violation = Some(kind);
        }
    }

    fn syntax(&self, expected: &'static str) -> ScanErrorKind {
        if self.position >= self.bytes.len() {
            return ScanErrorKind::EndedEarly { expected };
        }
        ScanErrorKind::Syntax { offset: self.position, expected }
    }

    fn skip_white_space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.position) {
            self.position += 1;
        }
    }

    fn literal(&mut self, word: &'static str) -> Result<IdKind, ScanErrorKind> {
        if !self.bytes[self.position..].starts_with(word.as_bytes()) {
            return Err(self.syntax("a value"));
        }
        self.position += word.len();
        Ok(IdKind::Other)
    }

    /// A string from its opening quote to after its closing one. The text
    /// is valid UTF-8 already (it is a `&str`); what is left is JSON's own
    /// rules: no raw control characters, known escapes only.
    fn string(&mut self) -> Result<(), ScanErrorKind> {
        self.position += 1;
        loop {
            let Some(&byte) = self.bytes.get(self.position) else {
                return Err(self.syntax("the end of a string"));
            };
            match byte {
                b'"' => {
                    self.position += 1;
                    return Ok(());
                }
                b'\\' => match self.bytes.get(self.position + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.position += 2,
                    Some(b'u') => {
                        let hex = self.bytes.get(self.position + 2..self.position + 6);
                        if !hex.is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) {
                            return Err(self.syntax("four hex digits after `\\u`"));
                        }
                        self.position += 6;
                    }
                    _ => return Err(self.syntax("a valid escape after `\\`")),
                },
                0x00..=0x1f => return Err(self.syntax("no control character inside a string")),
                _ => self.position += 1,
            }
        }
    }

    /// A number per RFC 8259 §6; refuses (as a violation) one no `f64`
    /// holds, since serde_json would fail the whole message on it.
    fn number(&mut self) -> Result<IdKind, ScanErrorKind> {
        let start = self.position;
        if self.bytes.get(self.position) == Some(&b'-') {
            self.position += 1;
        }
        match self.bytes.get(self.position) {
            Some(b'0') => self.position += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.syntax("a digit")),
        }
        let mut kind = IdKind::Integer;
        if self.bytes.get(self.position) == Some(&b'.') {
            self.position += 1;
            if !self.bytes.get(self.position).is_some_and(u8::is_ascii_digit) {
                return Err(self.syntax("a digit after `.`"));
            }
            self.digits();
            kind = IdKind::Number;
        }
        if let Some(b'e' | b'E') = self.bytes.get(self.position) {
            self.position += 1;
            if let Some(b'+' | b'-') = self.bytes.get(self.position) {
                self.position += 1;
            }
            if !self.bytes.get(self.position).is_some_and(u8::is_ascii_digit) {
                return Err(self.syntax("a digit in the exponent"));
            }
            self.digits();
            kind = IdKind::Number;
        }
        let text = &self.text[start..self.position];
        // An integer that fits u64 or i64 is read exactly by serde_json;
        // anything else goes through f64, which must be finite.
        let exact_integer = kind == IdKind::Integer && (text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok());
        if !exact_integer && !text.parse::<f64>().is_ok_and(f64::is_finite) {
            self.violate(ScanErrorKind::NumberOutOfRange { text: crate::echo::shorten(text).into_owned() });
        }
        Ok(kind)
    }

    fn digits(&mut self) {
        while self.bytes.get(self.position).is_some_and(u8::is_ascii_digit) {
            self.position += 1;
        }
    }
}

/// A key's text: borrowed when it has no escapes (nearly always), decoded
/// otherwise, so `"\u0069mage"` and `"image"` are one key as they are to
/// serde_json. A key that does not decode (a lone surrogate) stays raw;
/// serde_json refuses the message later anyway.
fn key_text(raw: &str) -> Cow<'_, str> {
    let inner = &raw[1..raw.len() - 1];
    if !inner.contains('\\') {
        return Cow::Borrowed(inner);
    }
    match serde_json::from_str::<String>(raw) {
        Ok(decoded) => Cow::Owned(decoded),
        Err(_) => Cow::Borrowed(inner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parsed_cost_bounds_what_values_can_hold() {
        let strings = format!("[{}]", vec![format!("\"{}\"", "s".repeat(38)); 99_000].join(","));
        // (text, bound): the text again plus 64 bytes a value.
        let cases = [
            ("{}".to_string(), 2 + 64),
            ("[0,1,2]".to_string(), 7 + 4 * 64),
            (strings.clone(), strings.len() + 99_001 * 64),
            ("[0,".to_string(), 3),
            (format!("[{}0]", "0,".repeat(100_000)), 200_003),
        ];
        for (text, expected) in cases {
            assert_eq!(parsed_cost_of(&text), expected, "{}", &text[..text.len().min(20)]);
        }
        assert_eq!(parsed_cost(usize::MAX, 1), usize::MAX);
    }

    fn kind_of(text: &str) -> Option<ScanErrorKind> {
        scan(text, &LIMITS).err().map(|error| error.kind)
    }

    #[test]
    fn valid_json_passes_and_the_id_is_found() {
        let cases: &[(&str, Option<(&str, IdKind)>)] = &[
            (r#"{"jsonrpc":"2.0","id":92,"method":"ping"}"#, Some(("92", IdKind::Integer))),
            (r#"{"id":"a\"b","x":[1,2,{"id":3}]}"#, Some((r#""a\"b""#, IdKind::String))),
            (r#" { "method" : "x" , "id" : -1.5e3 } "#, Some(("-1.5e3", IdKind::Number))),
            (r#"{"id":null}"#, Some(("null", IdKind::Other))),
            (r#"{"id":[1]}"#, Some(("[", IdKind::Other))),
            (r#"{"\u0069d":7}"#, Some(("7", IdKind::Integer))),
            (r#"{"params":{"id":1}}"#, None),
            ("[]", None),
            ("7", None),
            (r#""text""#, None),
            (r#"{"a":{},"b":[],"c":[[]],"d":true,"e":false,"f":null,"g":"\u00e9\n"}"#, None),
            ("18446744073709551615", None),
            ("-9223372036854775808", None),
        ];
        for (text, id) in cases {
            let scanned = scan(text, &LIMITS).unwrap_or_else(|error| panic!("{text}: {error:?}"));
            assert_eq!(scanned.id.map(|id| (id.text, id.kind)), *id, "{text}");
            assert!(serde_json::from_str::<serde_json::Value>(text).is_ok(), "serde agrees: {text}");
        }
    }

    #[test]
    fn malformed_json_is_a_syntax_error_where_serde_also_fails() {
        let cases = [
            "",
            "{",
            "}",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{a:1}",
            "01",
            "1.",
            "-",
            "1e",
            "+1",
            "tru",
            "nul",
            "\"abc",
            "\"\\x\"",
            "\"\\u12\"",
            "\"a\u{1}b\"",
            "{} {}",
            "[1 2]",
            "{\"a\":1]",
            "[1}",
            ".5",
            "NaN",
        ];
        for text in cases {
            let kind = kind_of(text).unwrap_or_else(|| panic!("{text:?} passed"));
            assert!(kind.is_syntax(), "{text:?}: {kind:?}");
            assert!(serde_json::from_str::<serde_json::Value>(text).is_err(), "serde agrees: {text:?}");
        }
    }

    #[test]
    fn limits_and_duplicates_are_refused_with_the_id_kept() {
        let many = format!(r#"{{"id":5,"a":[{}0]}}"#, "0,".repeat(LIMITS.max_values));
        let deep = format!(r#"{{"id":"d","a":{}{}}}"#, "[".repeat(LIMITS.max_depth), "]".repeat(LIMITS.max_depth));
        let big_id = format!(r#"{{"jsonrpc":"2.0","id":{},"method":"ping"}}"#, "9".repeat(400));
        let cases: Vec<(String, ScanErrorKind, Option<&str>)> = vec![
            (many, ScanErrorKind::TooManyValues { limit: LIMITS.max_values }, Some("5")),
            (deep, ScanErrorKind::TooDeep { limit: LIMITS.max_depth }, Some("\"d\"")),
            (
                r#"{"id":1,"params":{"image":"evil:1","image":"busybox:1.36"}}"#.into(),
                ScanErrorKind::DuplicateKey { key: "image".into() },
                Some("1"),
            ),
            (r#"{"a":1,"\u0061":2,"id":2}"#.into(), ScanErrorKind::DuplicateKey { key: "a".into() }, Some("2")),
            (r#"{"id":1,"id":2}"#.into(), ScanErrorKind::DuplicateKey { key: "id".into() }, Some("2")),
            (r#"{"id":3,"t":1e400}"#.into(), ScanErrorKind::NumberOutOfRange { text: "1e400".into() }, Some("3")),
            (r#"{"t":-1E+309,"id":"x"}"#.into(), ScanErrorKind::NumberOutOfRange { text: "-1E+309".into() }, Some("\"x\"")),
            (big_id.clone(), ScanErrorKind::NumberOutOfRange { text: crate::echo::shorten(&"9".repeat(400)).into_owned() }, None),
        ];
        for (text, kind, id) in cases {
            let error = scan(&text, &LIMITS).expect_err(&text);
            assert_eq!(error.kind, kind, "{}", crate::echo::shorten(&text));
            if let Some(id) = id {
                assert_eq!(error.id.map(|id| id.text), Some(id), "{}", crate::echo::shorten(&text));
            }
        }
        // The 400-digit id is still found, raw, for the answer.
        let error = scan(&big_id, &LIMITS).unwrap_err();
        assert_eq!(error.id.map(|id| (id.text.len(), id.kind)), Some((400, IdKind::Integer)));
    }

    #[test]
    fn the_same_key_in_different_objects_is_fine() {
        assert!(scan(r#"{"a":{"a":1},"b":[{"a":1},{"a":2}]}"#, &LIMITS).is_ok());
    }

    #[test]
    fn nesting_far_past_the_limit_is_still_bounded_and_answered() {
        let text = format!(r#"{{"id":9,"x":{}}}"#, "[".repeat(1 << 20));
        let error = scan(&text, &LIMITS).unwrap_err();
        // Unclosed: a syntax error wins over the depth limit.
        assert!(error.kind.is_syntax());
        assert_eq!(error.id.map(|id| id.text), Some("9"));
    }

    /// A cheap stand-in for the fuzz target: on many small random texts
    /// from JSON's own alphabet, whatever the scan accepts serde_json
    /// reads too, and what serde_json refuses as syntax the scan refuses.
    #[test]
    fn the_scan_agrees_with_serde_json_on_random_texts() {
        const ALPHABET: &[u8] = b"{}[]:,\" 0123456789-+.eEtrufalsn\\u\t\nab";
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            // xorshift64*: deterministic, so a failure reproduces.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for _ in 0..200_000 {
            let length = (next() % 12) as usize;
            let text: String = (0..length).map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize] as char).collect();
            let scanned = scan(&text, &LIMITS);
            let serde = serde_json::from_str::<serde_json::Value>(&text);
            match (&scanned, &serde) {
                (Ok(_), Err(error)) => panic!("{text:?}: the scan accepted what serde_json refuses: {error}"),
                (Err(error), Ok(_)) if error.kind.is_syntax() => panic!("{text:?}: the scan refused valid JSON: {error:?}"),
                _ => {}
            }
        }
    }
}
