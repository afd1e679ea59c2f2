//! Who may talk to the MCP endpoints: the Host check against DNS
//! rebinding, the browser Origin check and CORS headers, and the token
//! (`X-MCP-AUTH` or `Authorization: Bearer`, compared in constant time,
//! never logged) and who it makes the caller: one of the tokens file's
//! callers, or the server's one caller. Pure functions of the request head
//! and the settings; answering is `routes`' job.

use std::sync::Arc;

use serde_json::json;

use super::head::Head;
use super::response::{Response, error_response};
use crate::callers::{Caller, Callers, constant_time_eq};
use crate::log;

/// What the settings say about access.
pub struct Access {
    /// Plain text, compared in constant time, never logged.
    pub auth_token: Option<String>,
    /// MCP_K8S_AUTH_TOKENS_FILE: then every request needs one of its
    /// tokens, and the token says who calls.
    pub callers: Option<Callers>,
    /// The caller of a server without the file.
    pub whole_server: Arc<Caller>,
    pub allowed_origins: Vec<String>,
    /// Host header check against DNS rebinding; only meaningful when the
    /// listener is on loopback (otherwise the server's names are unknown).
    pub check_host: bool,
}

/// Headers to add to every answer for a browser origin we allow.
pub type Cors = Vec<(&'static str, String)>;

impl Access {
    /// The caller of a server without a tokens file: `token` with
    /// MCP_K8S_AUTH_TOKEN, else `unauthenticated`.
    pub fn whole_server_caller(auth_token: Option<&str>) -> Arc<Caller> {
        Arc::new(Caller::whole_server(if auth_token.is_some() { "token" } else { "unauthenticated" }))
    }
}

/// Host (DNS rebinding), Origin and token checks, in that order: a browser
/// on a foreign page is refused before its token is even looked at. The
/// answer names the caller the token is.
pub fn check(access: &Access, head: &Head) -> Result<(Cors, Arc<Caller>), Response> {
    // The authority of an absolute-form target stands for the Host header
    // (RFC 9112 section 3.2.2), so it is the one checked.
    if access.check_host
        && let Some(host) = head.authority()
        && !is_loopback_authority(host)
    {
        log::warn("request refused: foreign Host header", &[]);
        return Err(error_response(421, "Host header does not name this server; expected localhost"));
    }
    let mut cors = Vec::new();
    if let Some(origin) = head.header("Origin") {
        if !origin_allowed(origin, &access.allowed_origins) {
            log::warn("request refused: foreign Origin", &[]);
            return Err(error_response(403, "Origin is not allowed; set MCP_K8S_ALLOWED_ORIGINS to allow it"));
        }
        cors.push(("Access-Control-Allow-Origin", origin.to_string()));
        cors.push(("Access-Control-Expose-Headers", "Mcp-Session-Id".to_string()));
        cors.push(("Vary", "Origin".to_string()));
    }
    if let Some(callers) = &access.callers {
        let presented = presented_token(head);
        return match presented.and_then(|token| callers.identify(token)) {
            Some(caller) => Ok((cors, caller)),
            None => Err(unauthenticated(presented.is_some())),
        };
    }
    if let Some(expected) = &access.auth_token {
        match presented_token(head) {
            Some(token) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => {}
            presented => return Err(unauthenticated(presented.is_some())),
        }
    }
    Ok((cors, Arc::clone(&access.whole_server)))
}

/// The 401 for a missing or wrong token.
fn unauthenticated(presented: bool) -> Response {
    let challenge = if presented { r#"Bearer error="invalid_token""# } else { "Bearer" };
    let message = if presented { "wrong token" } else { "missing token; send X-MCP-AUTH or Authorization: Bearer" };
    log::warn("request refused: authentication", &[("token_present", json!(presented))]);
    error_response(401, message).with_header("WWW-Authenticate", challenge)
}

/// The answer to a CORS preflight (`OPTIONS` with an `Origin`).
pub fn preflight(access: &Access, head: &Head) -> Response {
    let Some(origin) = head.header("Origin") else {
        return error_response(405, "OPTIONS is only for browser preflight").with_header("Allow", "GET, POST, DELETE, OPTIONS");
    };
    if !origin_allowed(origin, &access.allowed_origins) {
        return error_response(403, "Origin is not allowed; set MCP_K8S_ALLOWED_ORIGINS to allow it");
    }
    Response::empty(204)
        .with_header("Access-Control-Allow-Origin", origin)
        .with_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
        // Revision 2026-07-28 clients also send Mcp-Method and Mcp-Name.
        .with_header(
            "Access-Control-Allow-Headers",
            "content-type, accept, authorization, x-mcp-auth, mcp-session-id, mcp-protocol-version, mcp-method, mcp-name, last-event-id",
        )
        .with_header("Access-Control-Expose-Headers", "Mcp-Session-Id")
        .with_header("Access-Control-Max-Age", "600")
        .with_header("Vary", "Origin")
}

/// `localhost`, `127.0.0.1` or `[::1]`, with any port.
pub fn is_loopback_authority(authority: &str) -> bool {
    let authority = authority.trim().to_ascii_lowercase();
    let host = if authority.starts_with('[') {
        authority.split(']').next().map(|inside| format!("{inside}]")).unwrap_or_default()
    } else {
        authority.split(':').next().unwrap_or_default().to_string()
    };
    matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]")
}

/// Loopback origins (any port; scheme and host compared without case, as
/// RFC 6454 does) plus the configured ones, exactly.
pub fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    if allowed.iter().any(|candidate| candidate.eq_ignore_ascii_case(origin)) {
        return true;
    }
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"))
        && !authority.contains('/')
        && is_loopback_authority(authority)
}

/// `X-MCP-AUTH: <token>` (the original's header) or
/// `Authorization: Bearer <token>`. Never from the query string.
fn presented_token(head: &Head) -> Option<&str> {
    if let Some(token) = head.header("X-MCP-AUTH") {
        return Some(token.trim());
    }
    let authorization = head.header("Authorization")?.trim();
    let (scheme, token) = authorization.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_authorities() {
        let cases = [
            ("localhost", true),
            ("localhost:8080", true),
            ("127.0.0.1:1", true),
            ("[::1]:3000", true),
            ("[::1]", true),
            ("LOCALHOST:80", true),
            ("evil.example.com", false),
            ("127.0.0.1.evil.com", false),
            ("localhost.evil.com:80", false),
            ("[::2]:80", false),
            ("", false),
        ];
        for (authority, expected) in cases {
            assert_eq!(is_loopback_authority(authority), expected, "{authority}");
        }
    }

    #[test]
    fn origins() {
        let allowed = vec!["https://app.example.com".to_string()];
        let cases = [
            ("http://localhost:6274", true),
            ("https://127.0.0.1", true),
            ("http://[::1]:80", true),
            // Regression: scheme and host are case-insensitive.
            ("HTTP://LOCALHOST", true),
            ("Https://LocalHost:3000", true),
            ("https://app.example.com", true),
            ("https://APP.example.com", true),
            ("https://app.example.com:444", false),
            ("http://evil.example.com", false),
            ("null", false),
            ("file://localhost", false),
            ("http://localhost/path", false),
        ];
        for (origin, expected) in cases {
            assert_eq!(origin_allowed(origin, &allowed), expected, "{origin}");
        }
    }
}
