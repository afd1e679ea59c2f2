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
    if access.callers.is_none() && access.auth_token.is_none() {
        return Ok((cors, Arc::clone(&access.whole_server)));
    }
    let presented = presented_token(head).map_err(|TwoTokens| two_tokens())?;
    if let Some(callers) = &access.callers {
        return match presented.and_then(|token| callers.identify(token)) {
            Some(caller) => Ok((cors, caller)),
            None => Err(unauthenticated(presented.is_some())),
        };
    }
    if let Some(expected) = &access.auth_token {
        match presented {
            Some(token) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => {}
            presented => return Err(unauthenticated(presented.is_some())),
        }
    }
    Ok((cors, Arc::clone(&access.whole_server)))
}

/// The 401 for a request whose two token headers disagree.
fn two_tokens() -> Response {
    log::warn("request refused: two different tokens", &[]);
    error_response(401, "X-MCP-AUTH and Authorization: Bearer carry different tokens; send one of them")
        .with_header("WWW-Authenticate", r#"Bearer error="invalid_request""#)
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
fn is_loopback_authority(authority: &str) -> bool {
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
fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
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

/// A request carrying one token in `X-MCP-AUTH` and another in
/// `Authorization: Bearer`.
#[derive(Debug, PartialEq, Eq)]
struct TwoTokens;

/// `X-MCP-AUTH: <token>` (the original's header) or
/// `Authorization: Bearer <token>`. Never from the query string. An empty
/// value is no token (so it can never match anything), and two different
/// tokens are refused: picking one would let a proxy that adds its own
/// header be overridden by whatever the client sent in the other.
fn presented_token(head: &Head) -> Result<Option<&str>, TwoTokens> {
    let x_mcp_auth = head.header("X-MCP-AUTH").map(str::trim).filter(|token| !token.is_empty());
    let bearer = head
        .header("Authorization")
        .and_then(|authorization| authorization.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty());
    match (x_mcp_auth, bearer) {
        (Some(one), Some(other)) if one != other => Err(TwoTokens),
        (one, other) => Ok(one.or(other)),
    }
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

    /// A request's extra headers, as (name, value).
    type Headers<'a> = &'a [(&'a str, &'a str)];

    fn head_with(headers: Headers<'_>) -> Head {
        let mut text = "POST /mcp HTTP/1.1\r\nHost: localhost\r\n".to_string();
        for (name, value) in headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str("\r\n");
        super::super::head::parse_head(text.as_bytes(), &Default::default()).unwrap()
    }

    #[test]
    fn the_presented_token_is_one_non_empty_token() {
        let cases: &[(Headers<'_>, Result<Option<&str>, TwoTokens>)] = &[
            (&[], Ok(None)),
            (&[("X-MCP-AUTH", "a")], Ok(Some("a"))),
            (&[("Authorization", "Bearer a")], Ok(Some("a"))),
            (&[("Authorization", "bearer  a ")], Ok(Some("a"))),
            (&[("Authorization", "Basic a")], Ok(None)),
            // Regression: an empty header was a token, the empty one.
            (&[("X-MCP-AUTH", "")], Ok(None)),
            (&[("X-MCP-AUTH", "  ")], Ok(None)),
            (&[("Authorization", "Bearer ")], Ok(None)),
            (&[("X-MCP-AUTH", ""), ("Authorization", "Bearer a")], Ok(Some("a"))),
            (&[("X-MCP-AUTH", "a"), ("Authorization", "Bearer a")], Ok(Some("a"))),
            // Regression: X-MCP-AUTH silently won over the bearer token.
            (&[("X-MCP-AUTH", "b"), ("Authorization", "Bearer a")], Err(TwoTokens)),
            (&[("X-MCP-AUTH", "b"), ("Authorization", "Basic a")], Ok(Some("b"))),
        ];
        for (headers, want) in cases {
            assert_eq!(&presented_token(&head_with(headers)), want, "{headers:?}");
        }
    }

    #[test]
    fn an_empty_or_second_token_never_authenticates() {
        let whole_server = Access::whole_server_caller(Some("t"));
        let access = |auth_token: Option<&str>| Access {
            auth_token: auth_token.map(str::to_string),
            callers: None,
            whole_server: Arc::clone(&whole_server),
            allowed_origins: Vec::new(),
            check_host: false,
        };
        // (server token, headers, status or accepted)
        let cases: &[(Option<&str>, Headers<'_>, Option<u16>)] = &[
            (Some("t"), &[("X-MCP-AUTH", "t")], None),
            (Some("t"), &[("X-MCP-AUTH", "")], Some(401)),
            (Some("t"), &[("X-MCP-AUTH", "x"), ("Authorization", "Bearer t")], Some(401)),
            (Some("t"), &[("X-MCP-AUTH", "t"), ("Authorization", "Bearer x")], Some(401)),
            // Without a token to check, the headers mean nothing.
            (None, &[("X-MCP-AUTH", "x"), ("Authorization", "Bearer t")], None),
        ];
        for (token, headers, want) in cases {
            let got = check(&access(*token), &head_with(headers)).err().map(|response| response.status);
            assert_eq!(got, *want, "{token:?} {headers:?}");
        }
    }
}
