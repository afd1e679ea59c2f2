//! Which protocol era a request belongs to: the one place that decides.
//!
//! The handshake era (revisions 2024-11-05 to 2025-11-25) opens with
//! `initialize` and keeps per-session state; revision 2026-07-28 is
//! stateless and judges each request by its `_meta` envelope. As the Python
//! SDK's dual-era server does (`serve_dual_era_loop`), a request that
//! carries the modern envelope, or goes to `server/discover`, or comes over
//! HTTP outside any session with a non-handshake `MCP-Protocol-Version`, is
//! modern; so is an `initialize` that carries the envelope (conformance
//! `server-stateless` wants -32601 for it: `initialize` does not exist in
//! 2026-07-28). Everything else, and every request of a session that
//! already ran `initialize`, is the handshake era, exactly as before.
//! Knows nothing of what either era then does.

use serde_json::{Map, Value};

/// The `_meta` keys of the 2026-07-28 envelope.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// The extension that turns long tool calls into tasks: what a client
/// declares in its capabilities' `extensions` to be answered with tasks.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// The client capabilities a request's `_meta` declares, when it does.
pub fn client_capabilities(params: &serde_json::Map<String, serde_json::Value>) -> Option<&serde_json::Map<String, serde_json::Value>> {
    params.get("_meta").and_then(|meta| meta.get(META_CLIENT_CAPABILITIES)).and_then(serde_json::Value::as_object)
}

/// Whether client capabilities declare the tasks extension.
pub fn declares_tasks_extension(capabilities: &serde_json::Map<String, serde_json::Value>) -> bool {
    capabilities.get("extensions").and_then(serde_json::Value::as_object).is_some_and(|extensions| extensions.contains_key(TASKS_EXTENSION))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Era {
    /// `initialize`, then requests within the session.
    Handshake,
    /// Revision 2026-07-28: every request stands alone.
    Modern,
}

/// What the transport knows about a request besides its body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hint {
    /// The session already ran `initialize` (stdio after the handshake, an
    /// HTTP request with a known `Mcp-Session-Id`).
    pub initialized: bool,
    /// HTTP outside a session with an `MCP-Protocol-Version` header that
    /// names no handshake revision: the client speaks the modern era even
    /// if its envelope is broken (it then gets -32602, not a session error).
    pub modern_header: bool,
}

/// The era of one request.
pub fn of_request(method: &str, params: &Map<String, Value>, hint: Hint) -> Era {
    if hint.initialized {
        return Era::Handshake;
    }
    if method == "server/discover" || hint.modern_header || has_modern_envelope(params) { Era::Modern } else { Era::Handshake }
}

/// Whether `params._meta` holds any key of the modern envelope; a request
/// with a partial envelope is modern and is refused for what it lacks.
fn has_modern_envelope(params: &Map<String, Value>) -> bool {
    params
        .get("_meta")
        .and_then(Value::as_object)
        .is_some_and(|meta| meta.contains_key(META_PROTOCOL_VERSION) || meta.contains_key(META_CLIENT_CAPABILITIES))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn the_era_of_each_request() {
        let envelope = params(json!({ "_meta": { META_PROTOCOL_VERSION: "2026-07-28", META_CLIENT_CAPABILITIES: {} } }));
        let plain = params(json!({ "_meta": { "progressToken": 1 } }));
        let fresh = Hint::default();
        let cases = [
            ("tools/list", &envelope, fresh, Era::Modern),
            ("initialize", &envelope, fresh, Era::Modern),
            ("server/discover", &plain, fresh, Era::Modern),
            ("tools/list", &plain, Hint { initialized: false, modern_header: true }, Era::Modern),
            ("tools/list", &plain, fresh, Era::Handshake),
            ("initialize", &plain, fresh, Era::Handshake),
            ("ping", &plain, fresh, Era::Handshake),
            ("tools/list", &envelope, Hint { initialized: true, modern_header: false }, Era::Handshake),
        ];
        for (method, params, hint, era) in cases {
            assert_eq!(of_request(method, params, hint), era, "{method} {params:?} {hint:?}");
        }
    }
}
