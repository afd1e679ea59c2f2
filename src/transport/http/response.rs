//! An answer with a complete body, its bytes on the wire (status line,
//! headers, `Content-Length`, `Connection: close`), and the transport's
//! error body: a refusal as an HTTP status plus a JSON-RPC error without an
//! id. A leaf of the HTTP server: `conn`, `routes`, `access` and `mcp` all
//! answer with it, and it uses none of them. When to keep a connection
//! alive, and writing the bytes, are `conn`'s.

use crate::protocol::jsonrpc::{self, ErrorCode};

/// An answer with a complete body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Response {
        Response { status, headers: vec![("Content-Type", content_type.to_string())], body: body.into() }
    }

    pub fn empty(status: u16) -> Response {
        Response { status, headers: Vec::new(), body: Vec::new() }
    }

    pub fn json(status: u16, text: String) -> Response {
        Response::new(status, "application/json", text)
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    pub fn with_headers(mut self, headers: &[(&'static str, String)]) -> Response {
        self.headers.extend_from_slice(headers);
        self
    }

    /// The bytes on the wire: status line, headers, `Content-Length`,
    /// `Connection: close` unless kept alive, and the body if wanted.
    pub fn encode(&self, keep_alive: bool, with_body: bool) -> Vec<u8> {
        let mut bytes = self.encode_head(keep_alive);
        if with_body {
            bytes.extend_from_slice(&self.body);
        }
        bytes
    }

    /// The status line and headers alone, for a body written after them
    /// as it is (a large answer is not copied behind its head).
    pub fn encode_head(&self, keep_alive: bool) -> Vec<u8> {
        let mut text = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (name, value) in &self.headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        if self.status != 204 {
            text.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        if !keep_alive {
            text.push_str("Connection: close\r\n");
        }
        text.push_str("\r\n");
        text.into_bytes()
    }
}

/// A transport-level refusal: HTTP status plus a JSON-RPC error body
/// without an id, which both SDKs can show to a user.
pub fn error_response(status: u16, message: &str) -> Response {
    let text = jsonrpc::Response::error(None, ErrorCode::InvalidRequest, message).to_json().to_string();
    Response::json(status, text)
}

/// Reason phrases of the statuses we send.
fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}
