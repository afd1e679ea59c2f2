//! Fuzz target: bytes → `transport::http::head::parse_head`, under the default limits and small ones. Besides
//! "no panic": an accepted head ends at its first empty line, keeps to the header limit, and has at most one
//! Host and one Content-Length (the smuggling shapes of issue 11).
#![no_main]
use libfuzzer_sys::fuzz_target;
use mcp_k8s_ephemeral_job::transport::http::head::{self, Framing, HeadLimits};

const SMALL_LIMITS: HeadLimits = HeadLimits { max_bytes: 256, max_headers: 4 };

fuzz_target!(|data: &[u8]| {
    for limits in [HeadLimits::default(), SMALL_LIMITS] {
        let Ok(parsed) = head::parse_head(data, &limits) else { continue };
        assert!(data.len() <= limits.max_bytes);
        assert_eq!(head::head_end(data), Some(data.len()), "an accepted head ends at its first empty line");
        assert!(parsed.headers.len() <= limits.max_headers);
        let count = |name: &str| parsed.headers.iter().filter(|(key, _)| key.eq_ignore_ascii_case(name)).count();
        assert!(count("host") <= 1 && count("content-length") <= 1, "{:?}", parsed.headers);
        if let Framing::Length(length) = parsed.framing {
            assert_eq!(count("content-length"), 1, "Length({length}) without a Content-Length");
        }
    }
});
