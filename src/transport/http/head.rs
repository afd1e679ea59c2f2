//! The HTTP/1.1 request head parser: bytes → method, target, version,
//! headers and body framing, under the byte and count limits (RFC 9112
//! sections 2 to 7). Pure and total: no I/O, no allocation beyond the
//! head it returns, never a panic, whatever the bytes (it is a fuzz
//! target).
//!
//! It deliberately refuses what proxies and servers disagree about
//! (request smuggling shapes): bare LF line ends, obsolete line folding,
//! whitespace before a colon, a `Content-Length` that is not plain digits,
//! two `Content-Length` or `Host` headers, `Content-Length` together with
//! `Transfer-Encoding`, and any transfer coding but `chunked`. Reading the
//! bytes off a socket, timeouts and the body itself belong to `conn`.

use std::fmt;

/// Bounds on one request head; the defaults are the settings' defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadLimits {
    /// Request line and headers together, including line ends
    /// (`MCP_K8S_MAX_HEADER_BYTES`).
    pub max_bytes: usize,
    /// Header lines (`MCP_K8S_MAX_HEADERS`).
    pub max_headers: usize,
}

impl Default for HeadLimits {
    fn default() -> HeadLimits {
        HeadLimits { max_bytes: 16 << 10, max_headers: 100 }
    }
}

/// A parsed request head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub method: Method,
    /// The origin-form target as sent: path and optional `?query`.
    pub target: String,
    pub version: Version,
    /// In order of arrival, names as sent, values without surrounding
    /// whitespace.
    pub headers: Vec<(String, String)>,
    pub framing: Framing,
}

/// Request methods; the ones we route are named, the rest kept as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Options,
    /// Any other token (`PATCH`, `CONNECT`, `get`: methods are
    /// case-sensitive, RFC 9110 section 9.1).
    Other(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

/// How the body is delimited (RFC 9112 section 6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// `Content-Length`; `u64::MAX` stands for any length too large to
    /// count, which is refused as too large all the same.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Why a head was refused. `status` is the HTTP answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// No `\r\n\r\n` within the byte limit.
    TooLarge {
        limit: usize,
    },
    TooManyHeaders {
        limit: usize,
    },
    /// Not HTTP/1.x syntax; `what` names the part.
    Malformed {
        what: &'static str,
    },
    UnsupportedVersion {
        version: String,
    },
    /// A header that must appear at most once appeared again.
    Duplicate {
        name: &'static str,
    },
    BadContentLength {
        value: String,
    },
    /// Both `Content-Length` and `Transfer-Encoding`.
    ConflictingFraming,
    UnsupportedTransferEncoding {
        value: String,
    },
}

impl HeadError {
    pub fn status(&self) -> u16 {
        match self {
            HeadError::TooLarge { .. } | HeadError::TooManyHeaders { .. } => 431,
            HeadError::UnsupportedVersion { .. } => 505,
            HeadError::UnsupportedTransferEncoding { .. } => 501,
            HeadError::Malformed { .. }
            | HeadError::Duplicate { .. }
            | HeadError::BadContentLength { .. }
            | HeadError::ConflictingFraming => 400,
        }
    }
}

impl fmt::Display for HeadError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeadError::TooLarge { limit } => {
                write!(formatter, "request line and headers exceed {limit} bytes; raise MCP_K8S_MAX_HEADER_BYTES")
            }
            HeadError::TooManyHeaders { limit } => {
                write!(formatter, "request has more than {limit} headers; raise MCP_K8S_MAX_HEADERS")
            }
            HeadError::Malformed { what } => write!(formatter, "malformed request: {what}"),
            HeadError::UnsupportedVersion { version } => {
                write!(formatter, "HTTP version `{version}` is not supported; use HTTP/1.1")
            }
            HeadError::Duplicate { name } => write!(formatter, "more than one `{name}` header"),
            HeadError::BadContentLength { value } => {
                write!(formatter, "Content-Length `{value}` is not a number of bytes (digits only)")
            }
            HeadError::ConflictingFraming => write!(formatter, "Content-Length and Transfer-Encoding together; send one of them"),
            HeadError::UnsupportedTransferEncoding { value } => {
                write!(formatter, "Transfer-Encoding `{value}` is not supported; send chunked or a Content-Length")
            }
        }
    }
}

impl std::error::Error for HeadError {}

impl Method {
    pub fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
            Method::Other(token) => token,
        }
    }

    fn from_token(token: &str) -> Method {
        match token {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "OPTIONS" => Method::Options,
            other => Method::Other(other.to_string()),
        }
    }
}

impl Head {
    /// The first value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    /// The target without its query.
    pub fn path(&self) -> &str {
        self.target.split_once('?').map_or(self.target.as_str(), |(path, _)| path)
    }

    pub fn query(&self) -> Option<&str> {
        self.target.split_once('?').map(|(_, query)| query)
    }

    /// Whether a `Connection` header lists `option` (`close`, `upgrade`,
    /// `keep-alive`), case-insensitively.
    pub fn connection_has(&self, option: &str) -> bool {
        self.headers
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case("connection"))
            .flat_map(|(_, value)| value.split(','))
            .any(|item| item.trim().eq_ignore_ascii_case(option))
    }
}

/// Where the head ends in `buffer`: the index just past the `\r\n\r\n`.
pub fn head_end(buffer: &[u8]) -> Option<usize> {
    buffer.windows(4).position(|window| window == b"\r\n\r\n").map(|start| start + 4)
}

/// Parses one complete head: the request line, the header lines and the
/// empty line that ends them (`\r\n\r\n` included).
pub fn parse_head(bytes: &[u8], limits: &HeadLimits) -> Result<Head, HeadError> {
    if bytes.len() > limits.max_bytes {
        return Err(HeadError::TooLarge { limit: limits.max_bytes });
    }
    let Some(lines) = bytes.strip_suffix(b"\r\n\r\n") else {
        return Err(HeadError::Malformed { what: "the head does not end with an empty line" });
    };
    let mut lines = split_lines(lines)?;
    let request_line = lines.next().unwrap_or_default();
    let (method, target, version) = parse_request_line(request_line)?;
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() >= limits.max_headers {
            return Err(HeadError::TooManyHeaders { limit: limits.max_headers });
        }
        headers.push(parse_header_line(line)?);
    }
    let framing = framing(&headers, version)?;
    if headers.iter().filter(|(name, _)| name.eq_ignore_ascii_case("host")).count() > 1 {
        return Err(HeadError::Duplicate { name: "Host" });
    }
    Ok(Head { method, target, version, headers, framing })
}

/// Splits on CRLF, refusing a bare CR or LF anywhere (RFC 9112 section 2.2
/// lets a server reject them; accepting them is how smuggling starts).
fn split_lines(bytes: &[u8]) -> Result<impl Iterator<Item = &[u8]>, HeadError> {
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'\r' if bytes.get(index + 1) == Some(&b'\n') => index += 2,
            b'\r' | b'\n' => return Err(HeadError::Malformed { what: "a bare CR or LF; lines end with CRLF" }),
            _ => index += 1,
        }
    }
    Ok(bytes.split(|byte| *byte == b'\n').map(|line| line.strip_suffix(b"\r").unwrap_or(line)))
}

fn parse_request_line(line: &[u8]) -> Result<(Method, String, Version), HeadError> {
    let text = std::str::from_utf8(line).map_err(|_| HeadError::Malformed { what: "the request line is not text" })?;
    let mut parts = text.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(HeadError::Malformed { what: "the request line is not `METHOD /path HTTP/1.1`" });
    };
    if method.is_empty() || !method.bytes().all(is_token_byte) {
        return Err(HeadError::Malformed { what: "the method is not a token" });
    }
    if !target.starts_with('/') || !target.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(HeadError::Malformed { what: "the request target is not a path such as /mcp" });
    }
    let version = match version {
        "HTTP/1.1" => Version::Http11,
        "HTTP/1.0" => Version::Http10,
        other if other.starts_with("HTTP/") && other.len() <= 16 => {
            return Err(HeadError::UnsupportedVersion { version: other.to_string() });
        }
        _ => return Err(HeadError::Malformed { what: "the request line does not end in an HTTP version" }),
    };
    Ok((Method::from_token(method), target.to_string(), version))
}

fn parse_header_line(line: &[u8]) -> Result<(String, String), HeadError> {
    if line.first().is_some_and(|byte| *byte == b' ' || *byte == b'\t') {
        return Err(HeadError::Malformed { what: "a folded header line (obsolete line folding)" });
    }
    let Some(colon) = line.iter().position(|byte| *byte == b':') else {
        return Err(HeadError::Malformed { what: "a header line without `:`" });
    };
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    // No whitespace between the name and the colon (RFC 9112 section 5.1).
    if name.is_empty() || !name.iter().copied().all(is_token_byte) {
        return Err(HeadError::Malformed { what: "a header name that is not a token" });
    }
    if value.iter().any(|byte| (byte.is_ascii_control() && *byte != b'\t') || *byte == 0x7f) {
        return Err(HeadError::Malformed { what: "a control character in a header value" });
    }
    let value = std::str::from_utf8(value).map_err(|_| HeadError::Malformed { what: "a header value that is not UTF-8" })?;
    // Names are tokens, so ASCII; the conversion cannot fail.
    let name = String::from_utf8_lossy(name).into_owned();
    Ok((name, value.trim_matches([' ', '\t']).to_string()))
}

/// RFC 9110 section 5.6.2 `tchar`.
fn is_token_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// Decides the body framing, refusing every ambiguous combination.
fn framing(headers: &[(String, String)], version: Version) -> Result<Framing, HeadError> {
    let mut lengths = headers.iter().filter(|(name, _)| name.eq_ignore_ascii_case("content-length")).map(|(_, value)| value);
    let mut encodings = headers.iter().filter(|(name, _)| name.eq_ignore_ascii_case("transfer-encoding")).map(|(_, value)| value);
    let (length, second_length) = (lengths.next(), lengths.next());
    let (encoding, second_encoding) = (encodings.next(), encodings.next());
    if second_length.is_some() {
        return Err(HeadError::Duplicate { name: "Content-Length" });
    }
    match (length, encoding) {
        (Some(_), Some(_)) => Err(HeadError::ConflictingFraming),
        (Some(length), None) => parse_content_length(length).map(Framing::Length),
        (None, Some(encoding)) => {
            // HTTP/1.0 has no chunked coding; two headers would be a list
            // that might end in something other than chunked.
            let chunked = encoding.eq_ignore_ascii_case("chunked") && second_encoding.is_none() && version == Version::Http11;
            if chunked {
                Ok(Framing::Chunked)
            } else {
                Err(HeadError::UnsupportedTransferEncoding { value: encoding.chars().take(64).collect() })
            }
        }
        (None, None) => Ok(Framing::None),
    }
}

/// Digits only: no sign, no spaces inside, no list (`5, 5`). A number too
/// large for u64 is "too large", not malformed.
fn parse_content_length(value: &str) -> Result<u64, HeadError> {
    if value.is_empty() || !value.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(HeadError::BadContentLength { value: value.chars().take(64).collect() });
    }
    Ok(value.parse().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Head, HeadError> {
        parse_head(text.as_bytes(), &HeadLimits::default())
    }

    #[test]
    fn a_plain_request() {
        let head = parse("POST /messages?sessionId=ab HTTP/1.1\r\nHost: localhost\r\nX-Empty:\r\nContent-Length:  12 \r\n\r\n").unwrap();
        assert_eq!(head.method, Method::Post);
        assert_eq!((head.path(), head.query()), ("/messages", Some("sessionId=ab")));
        assert_eq!(head.version, Version::Http11);
        assert_eq!(head.header("HOST"), Some("localhost"));
        assert_eq!(head.header("x-empty"), Some(""));
        assert_eq!(head.framing, Framing::Length(12));
    }

    #[test]
    fn framing_cases() {
        let cases = [
            ("Transfer-Encoding: chunked\r\n", Ok(Framing::Chunked)),
            ("Transfer-Encoding: Chunked\r\n", Ok(Framing::Chunked)),
            ("", Ok(Framing::None)),
            ("Content-Length: 0\r\n", Ok(Framing::Length(0))),
            ("Content-Length: 1125899906842624\r\n", Ok(Framing::Length(1_125_899_906_842_624))),
            ("Content-Length: 99999999999999999999999999\r\n", Ok(Framing::Length(u64::MAX))),
        ];
        for (headers, expected) in cases {
            let head = parse(&format!("POST / HTTP/1.1\r\n{headers}\r\n"));
            assert_eq!(head.map(|head| head.framing), expected, "{headers}");
        }
    }

    #[test]
    fn smuggling_shapes_are_refused() {
        let cases = [
            ("Content-Length: -1\r\n", 400, "Content-Length `-1` is not a number of bytes"),
            ("Content-Length: +5\r\n", 400, "Content-Length `+5`"),
            ("Content-Length: 5 5\r\n", 400, "Content-Length `5 5`"),
            ("Content-Length: 5,5\r\n", 400, "Content-Length `5,5`"),
            ("Content-Length: 0x10\r\n", 400, "Content-Length `0x10`"),
            ("Content-Length:\r\n", 400, "Content-Length ``"),
            ("Content-Length: 5\r\nContent-Length: 5\r\n", 400, "more than one `Content-Length` header"),
            ("Host: a\r\nhost: b\r\n", 400, "more than one `Host` header"),
            ("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", 400, "Content-Length and Transfer-Encoding together"),
            ("Transfer-Encoding: gzip, chunked\r\n", 501, "Transfer-Encoding `gzip, chunked` is not supported"),
            ("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", 501, "Transfer-Encoding `chunked`"),
            ("Content-Length : 5\r\n", 400, "a header name that is not a token"),
            ("X: a\r\n folded\r\n", 400, "a folded header line"),
            ("X: a\nY: b\r\n", 400, "a bare CR or LF"),
            ("X: a\rY: b\r\n", 400, "a bare CR or LF"),
            ("X: a\0b\r\n", 400, "a control character in a header value"),
            ("no colon\r\n", 400, "a header line without `:`"),
        ];
        for (headers, status, message) in cases {
            let error = parse(&format!("POST /mcp HTTP/1.1\r\n{headers}\r\n")).unwrap_err();
            assert_eq!(error.status(), status, "{headers:?}");
            assert!(error.to_string().contains(message), "{headers:?}: {error}");
        }
    }

    #[test]
    fn request_lines() {
        let cases = [
            ("GET /healthz HTTP/1.0", Ok((Method::Get, Version::Http10))),
            ("PATCH /mcp HTTP/1.1", Ok((Method::Other("PATCH".into()), Version::Http11))),
            ("get /mcp HTTP/1.1", Ok((Method::Other("get".into()), Version::Http11))),
            ("GET /mcp HTTP/2.0", Err(505)),
            ("GET /mcp", Err(400)),
            ("GET  /mcp HTTP/1.1", Err(400)),
            ("GET http://x/mcp HTTP/1.1", Err(400)),
            ("GET * HTTP/1.1", Err(400)),
            ("G(T /mcp HTTP/1.1", Err(400)),
            ("GET /m\u{e9} HTTP/1.1", Err(400)),
            ("", Err(400)),
        ];
        for (line, expected) in cases {
            let got = parse(&format!("{line}\r\n\r\n")).map(|head| (head.method, head.version)).map_err(|error| error.status());
            assert_eq!(got, expected, "{line:?}");
        }
    }

    #[test]
    fn limits() {
        let limits = HeadLimits { max_bytes: 64, max_headers: 2 };
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(64));
        assert_eq!(parse_head(long.as_bytes(), &limits), Err(HeadError::TooLarge { limit: 64 }));
        let many = "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
        let error = parse_head(many.as_bytes(), &limits).unwrap_err();
        assert_eq!((error.status(), error.to_string().as_str()), (431, "request has more than 2 headers; raise MCP_K8S_MAX_HEADERS"));
        assert!(parse_head(b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\n\r\n", &limits).is_ok());
        assert!(parse_head(b"GET / HTTP/1.1\r\n", &limits).is_err());
    }

    #[test]
    fn connection_options_and_head_end() {
        let head = parse("GET / HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\n\r\n").unwrap();
        assert!(head.connection_has("upgrade") && !head.connection_has("close"));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
    }
}
