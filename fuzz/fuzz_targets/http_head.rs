//! Fuzz target: bytes → `transport::http::head::parse_head`, under the default limits and small ones. Besides
//! "no panic": an accepted head ends at its first empty line, keeps to the header limit, has at most one
//! Host and one Content-Length (the smuggling shapes of issue 11), exactly one valid Host on HTTP/1.1, and at
//! most one of each header the access and MCP checks read. The bytes as text, and any `Mcp-Name` of an
//! accepted head, also go through `protocol::modern::decode_header_value`, which gives a value or an error,
//! and leaves a value without the `=?base64?…?=` markers as it was, trimmed.
#![no_main]
use libfuzzer_sys::fuzz_target;
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

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        check_decoding(text);
    }
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
