//! HTTP/1.1 message heads (RFC 9112), read the one way all three of this
//! program's HTTP speakers read them: the MCP server
//! (`transport/http/head.rs`), the Docker Engine client (`docker/http.rs`)
//! and a warm sandbox's assignment listener (`runner/assign.rs`).
//!
//! Strict where leniency is how request smuggling and response splitting
//! start: lines end in CRLF only (a bare CR or LF anywhere refuses the
//! head), no obsolete line folding, header names are tokens with no space
//! before the colon, values hold no control characters, a Content-Length
//! is digits only and a chunk size hex digits only. Each caller reads its
//! own start line (a request line or a status line) and decides its own
//! framing from the fields: a server and a client owe different answers
//! to the same head.
//!
//! A leaf: pure functions over bytes, no I/O, no other module. The fuzz
//! target `http_head` runs the server's head parser, and so this, on
//! arbitrary bytes.

use std::fmt;

/// One header field: the name as sent (a token, so ASCII) and the value
/// with the whitespace around it trimmed.
pub type Field = (String, String);

/// Why a head is refused. `what` is the text for the refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// A CR not followed by LF, or an LF not preceded by CR.
    BareLineEnd,
    /// The bytes do not end with the empty line that ends a head.
    Unterminated,
    FoldedLine,
    NoColon,
    NameNotToken,
    ControlInValue,
    ValueNotUtf8,
    /// More header fields than the caller allows.
    TooManyFields {
        limit: usize,
    },
}

impl Error {
    /// The refusal's words: what is wrong with the head.
    pub const fn what(self) -> &'static str {
        match self {
            Error::BareLineEnd => "a bare CR or LF; lines must end in CRLF",
            Error::Unterminated => "the head does not end with an empty line",
            Error::FoldedLine => "a folded header line (obsolete line folding)",
            Error::NoColon => "a header line without `:`",
            Error::NameNotToken => "a header name that is not a token",
            Error::ControlInValue => "a control character in a header value",
            Error::ValueNotUtf8 => "a header value that is not UTF-8",
            Error::TooManyFields { .. } => "too many header lines",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::TooManyFields { limit } => write!(formatter, "more than {limit} header lines"),
            other => formatter.write_str(other.what()),
        }
    }
}

impl std::error::Error for Error {}

/// Where the head ends in `buffer`: the index just past its `\r\n\r\n`.
pub fn head_end(buffer: &[u8]) -> Option<usize> {
    buffer.windows(4).position(|window| window == b"\r\n\r\n").map(|start| start + 4)
}

/// Whether the start of a head that is still arriving already holds a
/// bare LF, or a CR followed by something else: `split` refuses such a head
/// whatever follows, and one ended with bare LFs never shows the
/// `\r\n\r\n` that `head_end` looks for, so waiting for more would only end
/// in a timeout. A CR at the very end may still be followed by LF.
pub fn has_bare_line_end(partial: &[u8]) -> bool {
    let bare_lf = partial.first() == Some(&b'\n') || partial.windows(2).any(|pair| pair[1] == b'\n' && pair[0] != b'\r');
    let bare_cr = partial.windows(2).any(|pair| pair[0] == b'\r' && pair[1] != b'\n');
    bare_lf || bare_cr
}

/// Splits a complete head (its final `\r\n\r\n` included) into its start
/// line, unread, and its header fields, at most `max_fields` of them.
pub fn split(head: &[u8], max_fields: usize) -> Result<(&[u8], Vec<Field>), Error> {
    let ended = head.strip_suffix(b"\r\n\r\n");
    // Line ends are checked first, over the whole head when it is not
    // ended right, so a head ended with bare LFs is named for them.
    let mut lines = crlf_lines(ended.unwrap_or(head))?;
    if ended.is_none() {
        return Err(Error::Unterminated);
    }
    let start = lines.next().unwrap_or_default();
    let mut fields = Vec::new();
    for line in lines {
        if fields.len() >= max_fields {
            return Err(Error::TooManyFields { limit: max_fields });
        }
        fields.push(field(line)?);
    }
    Ok((start, fields))
}

/// Splits on CRLF, refusing a bare CR or LF anywhere (RFC 9112 section 2.2
/// lets a recipient reject them; accepting them is how smuggling starts).
fn crlf_lines(bytes: &[u8]) -> Result<impl Iterator<Item = &[u8]>, Error> {
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'\r' if bytes.get(index + 1) == Some(&b'\n') => index += 2,
            b'\r' | b'\n' => return Err(Error::BareLineEnd),
            _ => index += 1,
        }
    }
    Ok(bytes.split(|byte| *byte == b'\n').map(|line| line.strip_suffix(b"\r").unwrap_or(line)))
}

fn field(line: &[u8]) -> Result<Field, Error> {
    if line.first().is_some_and(|byte| *byte == b' ' || *byte == b'\t') {
        return Err(Error::FoldedLine);
    }
    let colon = line.iter().position(|byte| *byte == b':').ok_or(Error::NoColon)?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    // No whitespace between the name and the colon (RFC 9112 section 5.1).
    if name.is_empty() || !name.iter().copied().all(is_token_byte) {
        return Err(Error::NameNotToken);
    }
    if value.iter().any(|byte| (byte.is_ascii_control() && *byte != b'\t') || *byte == 0x7f) {
        return Err(Error::ControlInValue);
    }
    let value = std::str::from_utf8(value).map_err(|_| Error::ValueNotUtf8)?;
    // Names are tokens, so ASCII; the conversion cannot fail.
    let name = String::from_utf8_lossy(name).into_owned();
    Ok((name, value.trim_matches([' ', '\t']).to_string()))
}

/// RFC 9110 section 5.6.2 `tchar`.
pub fn is_token_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// A Content-Length value: digits only, no sign, no spaces inside, no list
/// (`5, 5`). `None` when it is not one; a number too large for u64 is
/// `u64::MAX` (too large for any limit, rather than malformed).
pub fn content_length(value: &str) -> Option<u64> {
    if value.is_empty() || !value.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    Some(value.parse().unwrap_or(u64::MAX))
}

/// A chunk-size line without its CRLF: hex digits (at most 15, so the size
/// fits any buffer arithmetic), then optional `;extensions`.
pub fn chunk_size(line: &str) -> Option<u64> {
    let size = line.split(';').next().unwrap_or_default().trim_end_matches([' ', '\t']);
    if size.is_empty() || size.len() > 15 || !size.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(size, 16).ok()
}

/// The values of every field named `name` (any case), in order.
pub fn values<'a>(fields: &'a [Field], name: &'a str) -> impl Iterator<Item = &'a str> {
    fields.iter().filter(move |(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_splits_into_its_start_line_and_fields() {
        let (start, fields) = split(b"GET / HTTP/1.1\r\nHost: a\r\nX-Y:  b c \t\r\n\r\n", 10).unwrap();
        assert_eq!(start, b"GET / HTTP/1.1");
        assert_eq!(fields, [("Host".to_string(), "a".to_string()), ("X-Y".to_string(), "b c".to_string())]);
        assert_eq!(values(&fields, "host").collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn what_is_refused() {
        let cases: &[(&[u8], Error)] = &[
            (b"GET / HTTP/1.1\r\nHost: a\r\n", Error::Unterminated),
            (b"GET / HTTP/1.1\nHost: a\r\n\r\n", Error::BareLineEnd),
            (b"HTTP/1.1 200 OK\nA: b\n\n", Error::BareLineEnd),
            (b"GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n", Error::BareLineEnd),
            (b"GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n", Error::FoldedLine),
            (b"GET / HTTP/1.1\r\nHost a\r\n\r\n", Error::NoColon),
            (b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", Error::NameNotToken),
            (b"GET / HTTP/1.1\r\n: a\r\n\r\n", Error::NameNotToken),
            (b"GET / HTTP/1.1\r\nHost: a\x00b\r\n\r\n", Error::ControlInValue),
            (b"GET / HTTP/1.1\r\nHost: a\x7f\r\n\r\n", Error::ControlInValue),
            (b"GET / HTTP/1.1\r\nHost: \xff\r\n\r\n", Error::ValueNotUtf8),
            (b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", Error::TooManyFields { limit: 2 }),
        ];
        for (head, error) in cases {
            assert_eq!(split(head, 2).map(|_| ()), Err(*error), "{}", String::from_utf8_lossy(head).escape_debug());
        }
    }

    #[test]
    fn bare_line_ends_are_seen_before_the_head_is_complete() {
        let cases: &[(&[u8], bool)] =
            &[(b"GET / HTTP/1.1\r", false), (b"GET / HTTP/1.1\r\nA", false), (b"\n", true), (b"GET /\nA", true), (b"GET /\rA", true)];
        for (partial, bare) in cases {
            assert_eq!(has_bare_line_end(partial), *bare, "{}", String::from_utf8_lossy(partial).escape_debug());
        }
        assert_eq!(head_end(b"A\r\n\r\nbody"), Some(5));
        assert_eq!(head_end(b"A\r\n\r"), None);
    }

    #[test]
    fn lengths_and_chunk_sizes() {
        let lengths = [("0", Some(0)), ("42", Some(42)), ("99999999999999999999999", Some(u64::MAX))];
        let refused = ["", "+5", "-1", " 5", "5 ", "5, 5", "0x10", "٣"];
        for (value, length) in lengths {
            assert_eq!(content_length(value), length, "{value}");
        }
        for value in refused {
            assert_eq!(content_length(value), None, "{value:?}");
        }
        let sizes = [("0", Some(0)), ("1a", Some(26)), ("FF;name=value", Some(255)), ("10 ;x", Some(16))];
        for (line, size) in sizes {
            assert_eq!(chunk_size(line), size, "{line}");
        }
        for line in ["", ";x", "-1", "0x10", "g", "1000000000000000", " 5"] {
            assert_eq!(chunk_size(line), None, "{line:?}");
        }
    }
}
