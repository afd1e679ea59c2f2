//! The HTTP/1.1 request head parser: bytes → method, target, version,
//! headers and body framing, under the byte and count limits (RFC 9112
//! sections 2 to 7). Pure and total: no I/O, no allocation beyond the
//! head it returns, never a panic, whatever the bytes (it is a fuzz
//! target).
//!
//! It deliberately refuses what proxies and servers disagree about
//! (request smuggling shapes): bare LF line ends, obsolete line folding,
//! whitespace before a colon, a `Content-Length` that is not plain digits,
//! two `Content-Length` or `Host` headers (or two of a header the access
//! and MCP header checks read), `Content-Length` together with
//! `Transfer-Encoding`, `Transfer-Encoding` in HTTP/1.0, and any transfer
//! coding but `chunked`. The lines and fields are `http1`'s, the one head
//! reader every HTTP speaker here shares; the request line, the framing
//! and the header rules are a server's, so they are here. An HTTP/1.1 head needs one valid `Host` (RFC 9112
//! section 3.2); a target is origin-form (`/mcp`) or absolute-form
//! (`http://host/mcp`, section 3.2.2). Reading the bytes off a socket,
//! timeouts and the body itself belong to `conn`.

use std::fmt;
use std::net::Ipv6Addr;

use crate::http1;

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
    /// Path and optional `?query`: an origin-form target as sent, or the
    /// path of an absolute-form one (`/` when it has none).
    pub target: String,
    /// The authority of an absolute-form target (`127.0.0.1:8080` in
    /// `POST http://127.0.0.1:8080/mcp`), which identifies the host in
    /// place of the Host header (RFC 9112 section 3.2.2).
    pub target_authority: Option<String>,
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
    /// HTTP/1.1 without a Host header.
    MissingHost,
    /// A Host value that is not `host[:port]`; shortened.
    BadHost {
        value: String,
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
    /// `Transfer-Encoding` in an HTTP/1.0 request, which has no transfer
    /// codings: faulty framing (RFC 9112 section 6.1).
    TransferEncodingOnHttp10,
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
            | HeadError::MissingHost
            | HeadError::BadHost { .. }
            | HeadError::Duplicate { .. }
            | HeadError::BadContentLength { .. }
            | HeadError::ConflictingFraming
            | HeadError::TransferEncodingOnHttp10 => 400,
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
            HeadError::MissingHost => write!(formatter, "an HTTP/1.1 request needs a Host header (RFC 9112 section 3.2)"),
            HeadError::BadHost { value } => {
                write!(formatter, "Host `{value}` is not a host name, IPv4 address or [IPv6] address with an optional port from 0 to 65535")
            }
            HeadError::Duplicate { name } => write!(formatter, "more than one `{name}` header"),
            HeadError::BadContentLength { value } => {
                write!(formatter, "Content-Length `{value}` is not a number of bytes (digits only)")
            }
            HeadError::ConflictingFraming => write!(formatter, "Content-Length and Transfer-Encoding together; send one of them"),
            HeadError::TransferEncodingOnHttp10 => {
                write!(formatter, "Transfer-Encoding is not part of HTTP/1.0; send a Content-Length, or use HTTP/1.1 for chunked")
            }
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

    /// The host the request is for: an absolute-form target's authority,
    /// else the Host header (RFC 9112 section 3.2.2: the target wins).
    pub fn authority(&self) -> Option<&str> {
        self.target_authority.as_deref().or_else(|| self.header("Host"))
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

pub use crate::http1::{has_bare_line_end, head_end};

/// The message for a bare CR or LF, here and in `conn`.
pub const BARE_LINE_END: HeadError = HeadError::Malformed { what: http1::Error::BareLineEnd.what() };

/// Headers that must appear at most once besides `Host` and
/// `Content-Length`: the ones the access checks and the 2026-07-28 header
/// checks read. Two values let a proxy check one while we use the other.
const SINGLE_HEADERS: [&str; 7] =
    ["Authorization", "X-MCP-AUTH", "Origin", "Mcp-Method", "Mcp-Name", "MCP-Protocol-Version", "Mcp-Session-Id"];

/// Parses one complete head: the request line, the header lines and the
/// empty line that ends them (`\r\n\r\n` included).
pub fn parse_head(bytes: &[u8], limits: &HeadLimits) -> Result<Head, HeadError> {
    if bytes.len() > limits.max_bytes {
        return Err(HeadError::TooLarge { limit: limits.max_bytes });
    }
    let (request_line, headers) = http1::split(bytes, limits.max_headers).map_err(|error| match error {
        http1::Error::TooManyFields { limit } => HeadError::TooManyHeaders { limit },
        other => HeadError::Malformed { what: other.what() },
    })?;
    let (method, (target, target_authority), version) = parse_request_line(request_line)?;
    let framing = framing(&headers, version)?;
    check_host(&headers, version)?;
    for name in SINGLE_HEADERS {
        if headers.iter().filter(|(key, _)| key.eq_ignore_ascii_case(name)).count() > 1 {
            return Err(HeadError::Duplicate { name });
        }
    }
    Ok(Head { method, target, target_authority, version, headers, framing })
}

/// Whether `value` is `uri-host [":" port]` (RFC 9112 section 3.2, RFC
/// 3986 section 3.2.2): a reg-name (which covers IPv4 addresses) or an
/// IPv6 address in brackets, then an optional port from 0 to 65535. The
/// empty value is allowed, as RFC 9112 asks clients to send it when the
/// target has no authority. IPvFuture literals are refused.
pub fn is_valid_authority(value: &str) -> bool {
    let (host_ok, port) = match value.strip_prefix('[') {
        Some(bracketed) => match bracketed.split_once(']') {
            Some((address, rest)) => (address.parse::<Ipv6Addr>().is_ok(), rest),
            None => return false,
        },
        None => {
            let end = value.find(':').unwrap_or(value.len());
            (is_reg_name(&value[..end]), &value[end..])
        }
    };
    let port_ok = match port.strip_prefix(':') {
        // `host:` is allowed: the port is `*DIGIT`.
        Some("") => true,
        Some(digits) => digits.bytes().all(|byte| byte.is_ascii_digit()) && digits.parse::<u16>().is_ok(),
        None => port.is_empty(),
    };
    host_ok && port_ok
}

/// RFC 3986 `reg-name`: unreserved, sub-delims and `%XX`.
fn is_reg_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let mut index = 0;
    while let Some(byte) = bytes.get(index) {
        let ok = match byte {
            b'%' => bytes.get(index + 1..index + 3).is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)),
            byte => byte.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(byte),
        };
        if !ok {
            return false;
        }
        index += if *byte == b'%' { 3 } else { 1 };
    }
    true
}

/// One Host for HTTP/1.1, at most one for HTTP/1.0, and a valid one
/// (RFC 9112 section 3.2: 400 otherwise).
fn check_host(headers: &[(String, String)], version: Version) -> Result<(), HeadError> {
    let mut hosts = headers.iter().filter(|(name, _)| name.eq_ignore_ascii_case("host")).map(|(_, value)| value);
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => Err(HeadError::Duplicate { name: "Host" }),
        (Some(host), None) if !is_valid_authority(host) => Err(HeadError::BadHost { value: host.chars().take(64).collect() }),
        (None, _) if version == Version::Http11 => Err(HeadError::MissingHost),
        _ => Ok(()),
    }
}

/// The request target as path and query, and an absolute-form target's authority.
type Target = (String, Option<String>);

fn parse_request_line(line: &[u8]) -> Result<(Method, Target, Version), HeadError> {
    let text = std::str::from_utf8(line).map_err(|_| HeadError::Malformed { what: "the request line is not text" })?;
    let mut parts = text.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(HeadError::Malformed { what: "the request line is not `METHOD /path HTTP/1.1`" });
    };
    if method.is_empty() || !method.bytes().all(http1::is_token_byte) {
        return Err(HeadError::Malformed { what: "the method is not a token" });
    }
    let target = parse_target(target)?;
    let version = match version {
        "HTTP/1.1" => Version::Http11,
        "HTTP/1.0" => Version::Http10,
        other if other.starts_with("HTTP/") && other.len() <= 16 => {
            return Err(HeadError::UnsupportedVersion { version: other.to_string() });
        }
        _ => return Err(HeadError::Malformed { what: "the request line does not end in an HTTP version" }),
    };
    Ok((Method::from_token(method), target, version))
}

/// Origin-form (`/mcp?x`) as sent, or absolute-form with an http or https
/// scheme (`http://host:port/mcp?x`, RFC 9112 section 3.2.2), split into
/// its path and authority. No userinfo (RFC 9110 section 4.2.4), and no
/// asterisk or authority form: those are for OPTIONS and CONNECT, which
/// we do not serve.
fn parse_target(target: &str) -> Result<Target, HeadError> {
    const NOT_A_TARGET: HeadError = HeadError::Malformed { what: "the request target is not a path such as /mcp or an http:// URL" };
    if !target.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(NOT_A_TARGET);
    }
    if target.starts_with('/') {
        return Ok((target.to_string(), None));
    }
    let Some((scheme, rest)) = target.split_once("://") else {
        return Err(NOT_A_TARGET);
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(NOT_A_TARGET);
    }
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path_and_query) = rest.split_at(authority_end);
    if authority.contains('@') {
        return Err(HeadError::Malformed { what: "userinfo (`user@`) in the request target" });
    }
    // An http URI has a host (RFC 9110 section 4.2.1).
    if authority.is_empty() || authority.starts_with(':') || !is_valid_authority(authority) {
        return Err(HeadError::Malformed { what: "the request target's authority is not host[:port]" });
    }
    let path = if path_and_query.starts_with('/') { path_and_query.to_string() } else { format!("/{path_and_query}") };
    Ok((path, Some(authority.to_string())))
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
    // Checked before the conflict with Content-Length: RFC 9112 section 6.1
    // makes it faulty framing even then.
    if encoding.is_some() && version == Version::Http10 {
        return Err(HeadError::TransferEncodingOnHttp10);
    }
    match (length, encoding) {
        (Some(_), Some(_)) => Err(HeadError::ConflictingFraming),
        (Some(length), None) => parse_content_length(length).map(Framing::Length),
        (None, Some(encoding)) => {
            // Two headers would be a list that might end in something
            // other than chunked.
            let chunked = encoding.eq_ignore_ascii_case("chunked") && second_encoding.is_none();
            if chunked {
                Ok(Framing::Chunked)
            } else {
                Err(HeadError::UnsupportedTransferEncoding { value: encoding.chars().take(64).collect() })
            }
        }
        (None, None) => Ok(Framing::None),
    }
}

/// Digits only (`http1::content_length`). A number too large for u64 is
/// "too large", not malformed.
fn parse_content_length(value: &str) -> Result<u64, HeadError> {
    http1::content_length(value).ok_or_else(|| HeadError::BadContentLength { value: value.chars().take(64).collect() })
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
            let head = parse(&format!("POST / HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n"));
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
            ("Authorization: Bearer a\r\nauthorization: Bearer b\r\n", 400, "more than one `Authorization` header"),
            ("X-MCP-AUTH: a\r\nX-MCP-AUTH: b\r\n", 400, "more than one `X-MCP-AUTH` header"),
            ("Origin: http://localhost\r\nOrigin: http://evil.example\r\n", 400, "more than one `Origin` header"),
            ("Mcp-Method: tools/list\r\nmcp-method: tools/call\r\n", 400, "more than one `Mcp-Method` header"),
            ("Mcp-Name: a\r\nMcp-Name: b\r\n", 400, "more than one `Mcp-Name` header"),
            ("MCP-Protocol-Version: a\r\nMCP-Protocol-Version: b\r\n", 400, "more than one `MCP-Protocol-Version` header"),
            ("Mcp-Session-Id: a\r\nMcp-Session-Id: b\r\n", 400, "more than one `Mcp-Session-Id` header"),
            ("Content-Length : 5\r\n", 400, "a header name that is not a token"),
            ("X: a\r\n folded\r\n", 400, "a folded header line"),
            ("X: a\nY: b\r\n", 400, "a bare CR or LF; lines must end in CRLF"),
            ("X: a\rY: b\r\n", 400, "a bare CR or LF"),
            ("X: a\0b\r\n", 400, "a control character in a header value"),
            ("no colon\r\n", 400, "a header line without `:`"),
        ];
        for (headers, status, message) in cases {
            let error = parse(&format!("POST /mcp HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n")).unwrap_err();
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
            ("GET http://x/mcp HTTP/1.1", Ok((Method::Get, Version::Http11))),
            ("GET * HTTP/1.1", Err(400)),
            ("OPTIONS * HTTP/1.1", Err(400)),
            ("G(T /mcp HTTP/1.1", Err(400)),
            ("GET /m\u{e9} HTTP/1.1", Err(400)),
            ("", Err(400)),
        ];
        for (line, expected) in cases {
            let got = parse(&format!("{line}\r\nHost: localhost\r\n\r\n"))
                .map(|head| (head.method, head.version))
                .map_err(|error| error.status());
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
        assert!(parse_head(b"GET / HTTP/1.0\r\nA: 1\r\nB: 2\r\n\r\n", &limits).is_ok());
        assert!(parse_head(b"GET / HTTP/1.1\r\n", &limits).is_err());
    }

    #[test]
    fn connection_options_and_head_end() {
        let head = parse("GET / HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive, Upgrade\r\n\r\n").unwrap();
        assert!(head.connection_has("upgrade") && !head.connection_has("close"));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
    }

    #[test]
    fn targets() {
        // Target → path and authority, or a piece of the error message.
        type Expected = Result<(&'static str, Option<&'static str>), &'static str>;
        let cases: [(&str, Expected); 13] = [
            ("/mcp?x=1", Ok(("/mcp?x=1", None))),
            ("http://127.0.0.1:8080/mcp", Ok(("/mcp", Some("127.0.0.1:8080")))),
            ("HTTPS://localhost/healthz?a", Ok(("/healthz?a", Some("localhost")))),
            ("http://[::1]:80", Ok(("/", Some("[::1]:80")))),
            ("http://localhost?q", Ok(("/?q", Some("localhost")))),
            ("http://user@localhost/mcp", Err("userinfo")),
            ("http:///mcp", Err("authority is not host[:port]")),
            ("http://:80/mcp", Err("authority is not host[:port]")),
            ("http://localhost:99999/mcp", Err("authority is not host[:port]")),
            ("ftp://localhost/mcp", Err("is not a path such as /mcp")),
            ("localhost:80", Err("is not a path such as /mcp")),
            ("*", Err("is not a path such as /mcp")),
            ("mcp", Err("is not a path such as /mcp")),
        ];
        for (target, expected) in cases {
            let got = parse(&format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n"));
            match (got, expected) {
                (Ok(head), Ok((path, authority))) => {
                    assert_eq!((head.target.as_str(), head.target_authority.as_deref()), (path, authority), "{target}");
                }
                (Err(error), Err(message)) => assert!(error.to_string().contains(message), "{target}: {error}"),
                (got, expected) => panic!("{target}: {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn the_authority_is_the_targets_then_the_hosts() {
        let absolute = parse("GET http://127.0.0.1:1/mcp HTTP/1.1\r\nHost: evil.example\r\n\r\n").unwrap();
        assert_eq!(absolute.authority(), Some("127.0.0.1:1"));
        let origin = parse("GET /mcp HTTP/1.1\r\nHost: localhost:2\r\n\r\n").unwrap();
        assert_eq!(origin.authority(), Some("localhost:2"));
        let old = parse("GET /mcp HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(old.authority(), None);
    }

    #[test]
    fn host_headers() {
        let cases = [
            ("HTTP/1.1", Some("localhost"), Ok(())),
            ("HTTP/1.1", Some("localhost:8080"), Ok(())),
            ("HTTP/1.1", Some("127.0.0.1:0"), Ok(())),
            ("HTTP/1.1", Some("127.0.0.1:65535"), Ok(())),
            ("HTTP/1.1", Some("[::1]"), Ok(())),
            ("HTTP/1.1", Some("[::1]:3000"), Ok(())),
            ("HTTP/1.1", Some("xn--bcher-kva.example:80"), Ok(())),
            ("HTTP/1.1", Some("a%2Db.example"), Ok(())),
            ("HTTP/1.1", Some("localhost:"), Ok(())),
            ("HTTP/1.1", Some(""), Ok(())),
            ("HTTP/1.0", None, Ok(())),
            ("HTTP/1.1", None, Err("an HTTP/1.1 request needs a Host header")),
            ("HTTP/1.1", Some("127.0.0.1:8080@evil.example"), Err("Host `127.0.0.1:8080@evil.example` is not")),
            ("HTTP/1.1", Some("[::1]evil.example"), Err("Host `[::1]evil.example` is not")),
            ("HTTP/1.1", Some("localhost:abc"), Err("Host `localhost:abc` is not")),
            ("HTTP/1.1", Some("localhost:99999"), Err("Host `localhost:99999` is not")),
            ("HTTP/1.1", Some("localhost:+80"), Err("Host `localhost:+80` is not")),
            ("HTTP/1.1", Some("localhost:80:80"), Err("Host `localhost:80:80` is not")),
            ("HTTP/1.1", Some("[::1"), Err("Host `[::1` is not")),
            ("HTTP/1.1", Some("[evil.example]"), Err("Host `[evil.example]` is not")),
            ("HTTP/1.1", Some("a%zz.example"), Err("Host `a%zz.example` is not")),
            ("HTTP/1.1", Some("a%2"), Err("Host `a%2` is not")),
            ("HTTP/1.1", Some("local host"), Err("Host `local host` is not")),
            ("HTTP/1.0", Some("local/host"), Err("Host `local/host` is not")),
            ("HTTP/1.1", Some("h\u{e9}.example"), Err("is not a host name")),
        ];
        for (version, host, expected) in cases {
            let host_line = host.map(|host| format!("Host: {host}\r\n")).unwrap_or_default();
            let got = parse(&format!("GET /healthz {version}\r\n{host_line}\r\n"));
            match (got, expected) {
                (Ok(_), Ok(())) => {}
                (Err(error), Err(message)) => {
                    assert_eq!(error.status(), 400, "{host:?}");
                    assert!(error.to_string().contains(message), "{host:?}: {error}");
                }
                (got, expected) => panic!("{version} {host:?}: {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn transfer_encoding_on_http_1_0_is_faulty_framing() {
        for headers in
            ["Transfer-Encoding: chunked\r\n", "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", "Transfer-Encoding: gzip\r\n"]
        {
            let error = parse(&format!("POST /mcp HTTP/1.0\r\n{headers}\r\n")).unwrap_err();
            assert_eq!(error, HeadError::TransferEncodingOnHttp10, "{headers:?}");
            assert_eq!(error.status(), 400);
        }
    }

    #[test]
    fn bare_line_ends_in_a_partial_head() {
        let cases: [(&[u8], bool); 10] = [
            (b"", false),
            (b"GET / HTTP/1.1\r\nHost: x\r\n", false),
            (b"GET / HTTP/1.1\r", false),
            (b"GET / HTTP/1.1\r\nHost: x\r\n\r", false),
            (b"\n", true),
            (b"GET / HTTP/1.1\n", true),
            (b"GET / HTTP/1.1\r\nHost: x\n\n", true),
            (b"GET / HTTP/1.1\r\nHost: x\r\n\n", true),
            (b"GET / HTTP/1.1\rHost", true),
            (b"GET / HTTP/1.1\r\r\n", true),
        ];
        for (partial, expected) in cases {
            assert_eq!(has_bare_line_end(partial), expected, "{:?}", String::from_utf8_lossy(partial));
        }
    }
}
