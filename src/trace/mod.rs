//! OpenTelemetry traces, opt-in (`MCP_K8S_OTLP_ENDPOINT`): a server span
//! per MCP call, its parent the client's span when the request's
//! `params._meta` carries a W3C `traceparent` (as the MCP semantic
//! conventions say), and a child span per phase of a run. Spans carry the
//! conventions' attributes and the run's facts, never arguments, argv,
//! environment or output. They leave in batches over OTLP/HTTP (JSON).
//!
//! A leaf like `log` and `metrics`: the protocol records the call's span,
//! the tools a run's phases; this module knows neither. Without an
//! endpoint, `enabled` is false and `record` does nothing.

pub mod context;
pub mod export;
pub mod span;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use context::{SpanContext, parse_traceparent};
pub use span::{Attr, Kind, Span};

static EXPORTER: OnceLock<Arc<export::Exporter>> = OnceLock::new();

/// The URL spans are POSTed to: the endpoint's `/v1/traces`, unless the
/// endpoint already names it (the OTLP exporters' convention for a base
/// URL). Only `http` and `https`.
pub fn traces_url(endpoint: &str) -> Result<String, String> {
    let endpoint = endpoint.trim();
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        return Err("is not a URL; give http://host:port (an OTLP/HTTP receiver, port 4318 by default)".into());
    };
    if scheme != "http" && scheme != "https" {
        return Err(format!("has scheme `{scheme}`; OTLP/HTTP takes http or https"));
    }
    if rest.is_empty() || rest.starts_with('/') || rest.contains(['?', '#', ' ']) {
        return Err("needs a host, and no query or fragment".into());
    }
    check_authority(rest.split('/').next().unwrap_or_default())?;
    let base = endpoint.trim_end_matches('/');
    Ok(if base.ends_with("/v1/traces") { base.to_string() } else { format!("{base}/v1/traces") })
}

/// The endpoint's `host[:port]`: checked here because the exporter's
/// first request is seconds after start, and a URL it cannot use would
/// only be logged then, each batch.
fn check_authority(authority: &str) -> Result<(), String> {
    if authority.contains('@') {
        return Err("has user information before its host; give http://host:port".into());
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let Some((address, after)) = bracketed.split_once(']') else {
                return Err(format!("has an unclosed `[` in `{authority}`; write an IPv6 address as [::1]:4318"));
            };
            if address.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("has `{address}` in brackets, which is not an IPv6 address"));
            }
            match after {
                "" => (address, None),
                port => match port.strip_prefix(':') {
                    Some(port) => (address, Some(port)),
                    None => return Err(format!("has `{after}` after its IPv6 address; only `:port` may follow")),
                },
            }
        }
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let host_chars = |host: &str| host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'));
    if host.is_empty() || !host_chars(host) {
        return Err(format!("needs a host name or address before the port (IPv6 in brackets: [::1]:4318); got `{authority}`"));
    }
    match port.map(|port| (port, port.parse::<u16>())) {
        None | Some((_, Ok(1..))) => Ok(()),
        Some((port, _)) => Err(format!("has port `{port}`; a port is a whole number from 1 to 65535")),
    }
}

/// Starts exporting to `endpoint`; once per process.
pub fn start(endpoint: &str) -> Result<(), String> {
    let url = traces_url(endpoint).map_err(|why| format!("MCP_K8S_OTLP_ENDPOINT {why}"))?;
    let exporter = export::Exporter::start(url)?;
    let _ = EXPORTER.set(exporter);
    Ok(())
}

/// Whether spans are recorded at all.
pub fn enabled() -> bool {
    EXPORTER.get().is_some()
}

/// Queues a finished span for export.
pub fn record(span: Span) {
    if let Some(exporter) = EXPORTER.get() {
        exporter.record(span);
    }
}

/// Sends what is queued, waiting up to `timeout` (at shutdown).
pub fn flush(timeout: Duration) {
    if let Some(exporter) = EXPORTER.get() {
        exporter.flush(timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_a_base_url_or_the_traces_url_itself() {
        // (endpoint, url or the start of the error)
        let cases = [
            ("http://127.0.0.1:4318", Ok("http://127.0.0.1:4318/v1/traces")),
            ("http://collector:4318/", Ok("http://collector:4318/v1/traces")),
            ("https://otel.example/v1/traces", Ok("https://otel.example/v1/traces")),
            ("http://gateway/otlp", Ok("http://gateway/otlp/v1/traces")),
            ("127.0.0.1:4318", Err("is not a URL")),
            ("grpc://collector:4317", Err("has scheme `grpc`")),
            ("http://", Err("needs a host")),
            ("http://collector:4318/?x=1", Err("needs a host")),
            ("http://[::1]:4318", Ok("http://[::1]:4318/v1/traces")),
            ("http://[::1]", Ok("http://[::1]/v1/traces")),
            ("https://otel.example:443/otlp/", Ok("https://otel.example:443/otlp/v1/traces")),
            // Regression: each of these started the server, against the
            // promise that a wrong endpoint stops it at start.
            ("http://[::1", Err("has an unclosed `[` in `[::1`; write an IPv6 address as [::1]:4318")),
            ("http://127.0.0.1:abc", Err("has port `abc`; a port is a whole number from 1 to 65535")),
            ("http://:4318", Err("needs a host name or address before the port (IPv6 in brackets: [::1]:4318); got `:4318`")),
            ("http://collector:99999", Err("has port `99999`; a port is a whole number from 1 to 65535")),
            ("http://collector:0", Err("has port `0`")),
            ("http://collector:", Err("has port ``")),
            ("http://::1:4318", Err("needs a host name or address before the port (IPv6 in brackets")),
            ("http://[zz]:4318", Err("has `zz` in brackets, which is not an IPv6 address")),
            ("http://[::1]x", Err("has `x` after its IPv6 address")),
            ("http://user@collector:4318", Err("has user information before its host")),
            ("http://coll%ector:4318", Err("needs a host name or address before the port")),
        ];
        for (endpoint, expected) in cases {
            match (traces_url(endpoint), expected) {
                (Ok(url), Ok(want)) => assert_eq!(url, want, "{endpoint}"),
                (Err(why), Err(start)) => assert!(why.starts_with(start), "{endpoint}: {why}"),
                (got, want) => panic!("{endpoint}: got {got:?}, want {want:?}"),
            }
        }
    }
}
