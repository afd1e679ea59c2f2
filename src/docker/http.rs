//! HTTP/1.1 for the Docker socket: writes one request head and reads one
//! response (head, then a body framed by Content-Length, chunked transfer
//! coding, or the connection's close), with every size bounded.
//!
//! It knows nothing about Docker's paths or JSON; `docker::Client` builds the
//! requests and decodes the bodies. Each request uses its own connection
//! (`Connection: close`): a Unix socket connect costs microseconds, and one
//! connection per call keeps a stuck stream from ever blocking another call.
//! The parsing functions are pure, for the unit tests below; the head's
//! lines and fields, a Content-Length and a chunk size are read by
//! `http1`, as the MCP server and the runner read theirs.

use std::io::{BufRead, Read};

use crate::http1;

/// The longest response head we read (status line and headers together).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The most headers we keep.
pub const MAX_HEADERS: usize = 100;
/// The longest chunk-size line (size, extensions, CRLF).
const MAX_CHUNK_LINE_BYTES: usize = 1024;

/// A parsed response head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub reason: String,
    /// Names lowercased, values trimmed, in the order received.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first header named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }
}

/// How the response body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    Length(u64),
    Chunked,
    /// No length and not chunked: the body runs until the server closes.
    UntilClose,
}

/// Why a response could not be parsed.
#[derive(Debug, PartialEq, Eq)]
pub enum ParseError {
    HeadTooLarge,
    TooManyHeaders,
    BadStatusLine(String),
    /// The head's lines or fields (`http1`'s words).
    BadHead(http1::Error),
    BadContentLength(String),
    BadChunkSize(String),
    ChunkLineTooLong,
    /// The connection ended inside the head or the body.
    Truncated(&'static str),
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::HeadTooLarge => write!(formatter, "response head longer than {MAX_HEAD_BYTES} bytes"),
            ParseError::TooManyHeaders => write!(formatter, "more than {MAX_HEADERS} response headers"),
            ParseError::BadStatusLine(line) => write!(formatter, "bad status line `{line}`"),
            ParseError::BadHead(error) => write!(formatter, "bad response head: {error}"),
            ParseError::BadContentLength(value) => write!(formatter, "bad Content-Length `{value}`"),
            ParseError::BadChunkSize(line) => write!(formatter, "bad chunk size line `{line}`"),
            ParseError::ChunkLineTooLong => write!(formatter, "chunk size line longer than {MAX_CHUNK_LINE_BYTES} bytes"),
            ParseError::Truncated(place) => write!(formatter, "connection closed in the middle of the {place}"),
        }
    }
}

impl std::error::Error for ParseError {}

/// The bytes of a request head. `body_len` is `None` for a request without
/// a body (GET, or a POST whose endpoint takes none: Docker still wants a
/// length, so such POSTs pass `Some(0)`).
pub fn request_head(verb: &str, path_and_query: &str, content_type: Option<&str>, body_len: Option<u64>) -> Vec<u8> {
    head_with(verb, path_and_query, "Connection: close\r\n", content_type, body_len)
}

/// The head of a request that asks to turn the connection into a raw
/// stream (Docker's attach: `Upgrade: tcp`, answered `101`). It has no
/// body: the stream starts after the answer's head.
pub fn upgrade_request_head(verb: &str, path_and_query: &str) -> Vec<u8> {
    head_with(verb, path_and_query, "Connection: Upgrade\r\nUpgrade: tcp\r\n", None, Some(0))
}

fn head_with(verb: &str, path_and_query: &str, connection: &str, content_type: Option<&str>, body_len: Option<u64>) -> Vec<u8> {
    // The Host value is required by HTTP/1.1 and ignored by dockerd; the
    // Docker CLI sends `api.moby.localhost`, we send the same.
    let mut head = format!("{verb} {path_and_query} HTTP/1.1\r\nHost: api.moby.localhost\r\nUser-Agent: mcp-k8s-ephemeral-job\r\n");
    head.push_str(connection);
    if let Some(content_type) = content_type {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    if let Some(body_len) = body_len {
        head.push_str(&format!("Content-Length: {body_len}\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// Reads bytes up to and including the blank line that ends a head, at most
/// `MAX_HEAD_BYTES`. Bytes after it stay in `reader`.
pub fn read_head_bytes(reader: &mut impl BufRead) -> std::io::Result<Result<Vec<u8>, ParseError>> {
    let mut head = Vec::new();
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(Err(ParseError::Truncated("response head")));
        }
        // Copy up to the end of the next line, so nothing past the head is consumed.
        let take = match available.iter().position(|&byte| byte == b'\n') {
            Some(index) => index + 1,
            None => available.len(),
        };
        head.extend_from_slice(&available[..take]);
        reader.consume(take);
        if head.len() > MAX_HEAD_BYTES {
            return Ok(Err(ParseError::HeadTooLarge));
        }
        if head.ends_with(b"\r\n\r\n") || head.ends_with(b"\n\n") {
            return Ok(Ok(head));
        }
    }
}

/// Parses a complete head (status line, headers, blank line), its lines
/// and fields read by `http1` like every head here.
pub fn parse_head(bytes: &[u8]) -> Result<Head, ParseError> {
    let (status_line, fields) = http1::split(bytes, MAX_HEADERS).map_err(|error| match error {
        http1::Error::TooManyFields { .. } => ParseError::TooManyHeaders,
        other => ParseError::BadHead(other),
    })?;
    let (status, reason) = parse_status_line(&String::from_utf8_lossy(status_line))?;
    let headers = fields.into_iter().map(|(name, value)| (name.to_ascii_lowercase(), value)).collect();
    Ok(Head { status, reason, headers })
}

fn parse_status_line(line: &str) -> Result<(u16, String), ParseError> {
    let bad = || ParseError::BadStatusLine(quote(line));
    let rest = line.strip_prefix("HTTP/1.1 ").or_else(|| line.strip_prefix("HTTP/1.0 ")).ok_or_else(bad)?;
    let (code, reason) = rest.split_once(' ').unwrap_or((rest, ""));
    if code.len() != 3 {
        return Err(bad());
    }
    let status: u16 = code.parse().map_err(|_| bad())?;
    if !(100..=599).contains(&status) {
        return Err(bad());
    }
    Ok((status, reason.to_string()))
}

/// How the body of `head` ends (RFC 9112 section 6.3, for a response to a
/// request that is not HEAD).
pub fn framing(head: &Head) -> Result<Framing, ParseError> {
    if head.status == 204 || head.status == 304 || (100..200).contains(&head.status) {
        return Ok(Framing::Length(0));
    }
    if let Some(encoding) = head.header("transfer-encoding") {
        if encoding.rsplit(',').next().is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked")) {
            return Ok(Framing::Chunked);
        }
        return Ok(Framing::UntilClose);
    }
    match head.header("content-length") {
        Some(value) => http1::content_length(value).map(Framing::Length).ok_or_else(|| ParseError::BadContentLength(quote(value))),
        None => Ok(Framing::UntilClose),
    }
}

/// Parses a chunk-size line without its CRLF: hex digits, then optional
/// `;extensions`.
pub fn parse_chunk_size(line: &str) -> Result<u64, ParseError> {
    http1::chunk_size(line).ok_or_else(|| ParseError::BadChunkSize(quote(line)))
}

/// A response body as a `BufRead`: decodes the framing and reports EOF at
/// the body's end. Parse errors surface as `io::ErrorKind::InvalidData`,
/// a connection closed early as `UnexpectedEof`.
#[derive(Debug)]
pub struct Body<R> {
    reader: R,
    framing: Framing,
    /// Bytes left in the body (Length) or in the current chunk (Chunked).
    remaining: u64,
    /// Chunked: whether the first size line was read (every later one is
    /// preceded by the CRLF that ends the previous chunk).
    started: bool,
    done: bool,
}

impl<R: BufRead> Body<R> {
    pub fn new(reader: R, framing: Framing) -> Body<R> {
        let remaining = match framing {
            Framing::Length(length) => length,
            Framing::Chunked | Framing::UntilClose => 0,
        };
        let done = framing == Framing::Length(0);
        Body { reader, framing, remaining, started: false, done }
    }

    /// The connection underneath.
    pub fn get_ref(&self) -> &R {
        &self.reader
    }

    /// Reads the next chunk-size line (after the CRLF that ends the previous
    /// chunk, unless this is the first) and sets `remaining`; at the last
    /// chunk, reads the trailers and marks the body done.
    fn next_chunk(&mut self, first: bool) -> std::io::Result<()> {
        if !first {
            let line = read_line_capped(&mut self.reader)?;
            if !line.is_empty() {
                return Err(invalid(ParseError::BadChunkSize(quote(&line))));
            }
        }
        let line = read_line_capped(&mut self.reader)?;
        let size = parse_chunk_size(&line).map_err(invalid)?;
        if size == 0 {
            // Trailers, up to the blank line; we keep none of them.
            let mut n_trailers = 0;
            while !read_line_capped(&mut self.reader)?.is_empty() {
                n_trailers += 1;
                if n_trailers > MAX_HEADERS {
                    return Err(invalid(ParseError::TooManyHeaders));
                }
            }
            self.done = true;
        }
        self.remaining = size;
        Ok(())
    }
}

impl<R: BufRead> BufRead for Body<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.done {
            return Ok(&[]);
        }
        if self.framing == Framing::Chunked && self.remaining == 0 {
            let first = !self.started;
            self.started = true;
            self.next_chunk(first)?;
            if self.done {
                return Ok(&[]);
            }
        }
        let framing = self.framing;
        let remaining = self.remaining;
        let available = self.reader.fill_buf()?;
        if available.is_empty() {
            return match framing {
                Framing::UntilClose => Ok(&[]),
                Framing::Length(_) => Err(eof(ParseError::Truncated("response body"))),
                Framing::Chunked => Err(eof(ParseError::Truncated("chunked response body"))),
            };
        }
        let limit = match framing {
            Framing::UntilClose => available.len(),
            Framing::Length(_) | Framing::Chunked => available.len().min(usize::try_from(remaining).unwrap_or(usize::MAX)),
        };
        Ok(&available[..limit])
    }

    fn consume(&mut self, amount: usize) {
        self.reader.consume(amount);
        match self.framing {
            Framing::UntilClose => {}
            Framing::Length(_) => {
                self.remaining -= amount as u64;
                if self.remaining == 0 {
                    self.done = true;
                }
            }
            // At 0, the chunk's CRLF is read with the next size line.
            Framing::Chunked => self.remaining -= amount as u64,
        }
    }
}

impl<R: BufRead> Read for Body<R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        read_through_buffer(self, buffer)
    }
}

/// `Read::read` for a type whose `BufRead` does the work: copies from
/// `fill_buf` and consumes what was copied.
pub fn read_through_buffer(reader: &mut impl BufRead, buffer: &mut [u8]) -> std::io::Result<usize> {
    let available = reader.fill_buf()?;
    let amount = available.len().min(buffer.len());
    buffer[..amount].copy_from_slice(&available[..amount]);
    reader.consume(amount);
    Ok(amount)
}

/// Reads a whole body, failing when it is longer than `limit` bytes.
pub fn read_to_end_capped(body: &mut impl Read, limit: usize) -> std::io::Result<Result<Vec<u8>, usize>> {
    let mut bytes = Vec::new();
    let read = body.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    if read > limit {
        return Ok(Err(limit));
    }
    Ok(Ok(bytes))
}

/// One line without its CRLF (or LF), at most `MAX_CHUNK_LINE_BYTES`.
fn read_line_capped(reader: &mut impl BufRead) -> std::io::Result<String> {
    let mut line = Vec::new();
    let read = reader.take(MAX_CHUNK_LINE_BYTES as u64).read_until(b'\n', &mut line)?;
    if read == 0 || !line.ends_with(b"\n") {
        if read == MAX_CHUNK_LINE_BYTES {
            return Err(invalid(ParseError::ChunkLineTooLong));
        }
        return Err(eof(ParseError::Truncated("chunked response body")));
    }
    line.pop();
    if line.ends_with(b"\r") {
        line.pop();
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Server text quoted in an error, shortened.
fn quote(text: &str) -> String {
    crate::echo::shorten(text).into_owned()
}

fn invalid(error: ParseError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, error)
}

fn eof(error: ParseError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(wire: &[u8], framing: Framing) -> std::io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        Body::new(wire, framing).read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    #[test]
    fn request_head_has_length_and_type_only_when_given() {
        let head = request_head("POST", "/v1.41/containers/create?name=a", Some("application/json"), Some(12));
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /v1.41/containers/create?name=a HTTP/1.1\r\nHost: api.moby.localhost\r\nUser-Agent: mcp-k8s-ephemeral-job\r\n\
             Connection: close\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n"
        );
        let head = String::from_utf8(request_head("GET", "/_ping", None, None)).unwrap();
        assert!(!head.contains("Content-"), "{head}");
    }

    #[test]
    fn an_upgrade_head_asks_for_a_raw_stream_and_has_no_body() {
        let head = upgrade_request_head("POST", "/v1.41/containers/c/attach?stream=1&stdin=1");
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /v1.41/containers/c/attach?stream=1&stdin=1 HTTP/1.1\r\nHost: api.moby.localhost\r\nUser-Agent: mcp-k8s-ephemeral-job\r\n\
             Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n"
        );
    }

    #[test]
    fn head_is_parsed_and_the_body_left_in_the_reader() {
        let mut wire: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nApi-Version:  1.41 \r\n\r\n{\"a\":1}";
        let bytes = read_head_bytes(&mut wire).unwrap().unwrap();
        let head = parse_head(&bytes).unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(head.reason, "OK");
        assert_eq!(head.header("api-version"), Some("1.41"));
        assert_eq!(head.header("content-type"), Some("application/json"));
        assert_eq!(wire, b"{\"a\":1}");
    }

    #[test]
    fn bad_heads_are_refused() {
        assert!(matches!(parse_head(b"HTTP/2 200 OK\r\n\r\n"), Err(ParseError::BadStatusLine(_))));
        assert!(matches!(parse_head(b"HTTP/1.1 20 OK\r\n\r\n"), Err(ParseError::BadStatusLine(_))));
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n"), Err(ParseError::BadHead(http1::Error::NoColon)));
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n"), Err(ParseError::BadHead(http1::Error::NameNotToken)));
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\nA: b\n\n"), Err(ParseError::BadHead(http1::Error::BareLineEnd)));
        let many = format!("HTTP/1.1 200 OK\r\n{}\r\n", "a: b\r\n".repeat(MAX_HEADERS + 1));
        assert_eq!(parse_head(many.as_bytes()), Err(ParseError::TooManyHeaders));
        let mut huge = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "y".repeat(MAX_HEAD_BYTES));
        assert_eq!(read_head_bytes(&mut huge.as_bytes()).unwrap(), Err(ParseError::HeadTooLarge));
        huge.truncate(100);
        assert_eq!(read_head_bytes(&mut huge.as_bytes()).unwrap(), Err(ParseError::Truncated("response head")));
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let head = |status, headers: &[(&str, &str)]| Head {
            status,
            reason: String::new(),
            headers: headers.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect(),
        };
        assert_eq!(framing(&head(204, &[("content-length", "5")])), Ok(Framing::Length(0)));
        assert_eq!(framing(&head(200, &[("content-length", "5")])), Ok(Framing::Length(5)));
        assert_eq!(framing(&head(200, &[("transfer-encoding", "chunked"), ("content-length", "5")])), Ok(Framing::Chunked));
        assert_eq!(framing(&head(200, &[("transfer-encoding", "gzip, chunked")])), Ok(Framing::Chunked));
        assert_eq!(framing(&head(200, &[])), Ok(Framing::UntilClose));
        assert!(matches!(framing(&head(200, &[("content-length", "-1")])), Err(ParseError::BadContentLength(_))));
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(parse_chunk_size("1a"), Ok(26));
        assert_eq!(parse_chunk_size("0"), Ok(0));
        assert_eq!(parse_chunk_size("A;name=value"), Ok(10));
        assert!(parse_chunk_size("").is_err());
        assert!(parse_chunk_size("xyz").is_err());
        assert!(parse_chunk_size("+1").is_err());
        assert!(parse_chunk_size("1000000000000000").is_err(), "16 hex digits could overflow");
    }

    #[test]
    fn chunked_bodies_are_decoded() {
        assert_eq!(body(b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nTrailer: a\r\n\r\nNEXT", Framing::Chunked).unwrap(), b"hello world");
        assert_eq!(body(b"0\r\n\r\n", Framing::Chunked).unwrap(), b"");
        let truncated = body(b"5\r\nhel", Framing::Chunked).unwrap_err();
        assert_eq!(truncated.kind(), std::io::ErrorKind::UnexpectedEof);
        let missing_crlf = body(b"5\r\nhelloX\r\n0\r\n\r\n", Framing::Chunked).unwrap_err();
        assert_eq!(missing_crlf.kind(), std::io::ErrorKind::InvalidData);
        let long_line = format!("{}\r\n", "0".repeat(MAX_CHUNK_LINE_BYTES + 10));
        assert_eq!(body(long_line.as_bytes(), Framing::Chunked).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn length_bodies_stop_at_the_length_and_fail_when_short() {
        assert_eq!(body(b"helloEXTRA", Framing::Length(5)).unwrap(), b"hello");
        assert_eq!(body(b"hel", Framing::Length(5)).unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
        assert_eq!(body(b"all of it", Framing::UntilClose).unwrap(), b"all of it");
    }

    #[test]
    fn capped_reads_refuse_longer_bodies() {
        assert_eq!(read_to_end_capped(&mut &b"12345"[..], 5).unwrap(), Ok(b"12345".to_vec()));
        assert_eq!(read_to_end_capped(&mut &b"123456"[..], 5).unwrap(), Err(5));
    }
}
