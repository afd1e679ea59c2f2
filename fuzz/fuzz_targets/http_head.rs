//! Fuzz target: bytes → `transport::http::head::parse_head`, under the default limits and small ones. Besides
//! "no panic": an accepted head ends at its first empty line, keeps to the header limit, has at most one
//! Host and one Content-Length (the smuggling shapes of issue 11), exactly one valid Host on HTTP/1.1, and at
//! most one of each header the access and MCP checks read. The bytes as text, and any `Mcp-Name` of an
//! accepted head, also go through `protocol::modern::decode_header_value`, which gives a value or an error,
//! and leaves a value without the `=?base64?…?=` markers as it was, trimmed.
//!
//! The same bytes go through `http1`, the head reader the server, the Docker client and the runner share:
//! an accepted head has no bare CR or LF, token names and values without control characters; every line
//! through its Content-Length and chunk-size readers, which accept digits (hex digits) only; and through the
//! Docker client's response head parser, which must not panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mcp_k8s_ephemeral_job::http1;
use mcp_k8s_ephemeral_job::protocol::modern;
use mcp_k8s_ephemeral_job::transport::http::head::{self, Framing, HeadLimits, Version};

const SMALL_LIMITS: HeadLimits = HeadLimits { max_bytes: 256, max_headers: 4 };

const SINGLE_HEADERS: [&str; 7] = ["Authorization", "X-MCP-AUTH", "Origin", "Mcp-Method", "Mcp-Name", "MCP-Protocol-Version", "Mcp-Session-Id"];

fn check_decoding(raw: &str) {
    let decoded = modern::decode_header_value(raw);
    let trimmed = raw.trim_matches([' ', '\t']);
    if !(trimmed.starts_with("=?base64?") && trimmed.ends_with("?=")) {
        assert_eq!(decoded.as_deref(), Ok(trimmed), "{raw:?}");
    }
}

fn check_http1(data: &[u8]) {
    if let Ok((_, fields)) = http1::split(data, 8) {
        assert!(!http1::has_bare_line_end(data), "{data:?}");
        assert!(fields.len() <= 8);
        for (name, value) in &fields {
            assert!(!name.is_empty() && name.bytes().all(http1::is_token_byte), "{name:?}");
            assert!(!value.bytes().any(|byte| byte == b'\r' || byte == b'\n' || byte == 0), "{value:?}");
        }
    }
    let _ = mcp_k8s_ephemeral_job::docker::http::parse_head(data);
    for line in String::from_utf8_lossy(data).split("\r\n") {
        if let Some(length) = http1::content_length(line) {
            assert!(!line.is_empty() && line.bytes().all(|byte| byte.is_ascii_digit()), "{line:?}");
            assert!(length == u64::MAX || line.parse::<u64>() == Ok(length), "{line:?}");
        }
        if let Some(size) = http1::chunk_size(line) {
            assert!(size < 1 << 60, "{line:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        check_decoding(text);
    }
    check_http1(data);
    for limits in [HeadLimits::default(), SMALL_LIMITS] {
        let Ok(parsed) = head::parse_head(data, &limits) else { continue };
        assert!(data.len() <= limits.max_bytes);
        assert_eq!(head::head_end(data), Some(data.len()), "an accepted head ends at its first empty line");
        assert!(parsed.headers.len() <= limits.max_headers);
        let count = |name: &str| parsed.headers.iter().filter(|(key, _)| key.eq_ignore_ascii_case(name)).count();
        assert!(count("host") <= 1 && count("content-length") <= 1, "{:?}", parsed.headers);
        if parsed.version == Version::Http11 {
            assert_eq!(count("host"), 1, "HTTP/1.1 without a Host: {:?}", parsed.headers);
        }
        if let Some(host) = parsed.header("Host") {
            assert!(head::is_valid_authority(host), "{host:?}");
        }
        for name in SINGLE_HEADERS {
            assert!(count(name) <= 1, "two {name}: {:?}", parsed.headers);
        }
        if let Some(name) = parsed.header("Mcp-Name") {
            check_decoding(name);
        }
        if let Framing::Length(length) = parsed.framing {
            assert_eq!(count("content-length"), 1, "Length({length}) without a Content-Length");
        }
    }
});
