//! The 2026-07-28 era adapter: each request stands alone. It checks the
//! `_meta` envelope (-32602 when it is missing or broken), the HTTP headers
//! against the body (-32020), the revision (-32022 with the supported
//! list), then serves `server/discover`, `tools/list`, the snippets as
//! `resources/*` (each with `ttlMs` and `cacheScope`), `tools/call` (a task when the client advertises the
//! `io.modelcontextprotocol/tasks` extension and the tool runs long) and
//! the extension's `tasks/get` and `tasks/cancel`. Results carry
//! `resultType`; log notifications go out only at the level the request's
//! `_meta` asks for. Methods the era removed (`initialize`, `ping`,
//! `logging/setLevel`, subscriptions) are -32601.
//!
//! The calls themselves run through the same dispatcher as the handshake
//! era (`Server::start_call`, `Server::spawn_call`); this file knows the
//! envelope and the wire shapes, not how a call runs or what HTTP status a
//! code becomes.

use std::borrow::Cow;
use std::fmt;

use serde_json::{Map, Value, json};

use super::era::{META_CLIENT_CAPABILITIES, META_PROTOCOL_VERSION};
#[cfg(feature = "testing")]
use super::fixtures;
use super::jsonrpc::{ErrorCode, Request, Response, ResponseError};
use super::{
    CallStart, CallTrace, EraCall, Outbox, Server, Session, Work, complete, invalid_params, list_tools, refuse_input_answers, resources,
    send_response, tasks_extension,
};
use crate::echo;
use crate::log::Level;
use crate::tools;

/// Revisions served in this era.
const MODERN_VERSIONS: [&str; 1] = ["2026-07-28"];

/// The extension that turns long tool calls into tasks.
pub use super::era::TASKS_EXTENSION;

const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";

/// How long a client may cache `server/discover` and `tools/list`: the
/// tool set is fixed for the life of the process (`MCP_K8S_TEST_TOOLS` is
/// read at startup), and an hour bounds the staleness after a redeploy.
const LIST_TTL_MS: u64 = 3_600_000;

/// How long a client may cache what `resources/*` answers. The snippets
/// folder is read at each request and nothing watches it (no
/// `listChanged`), so an operator may add or edit a snippet under a running
/// server; a minute keeps a caching client's view close to the folder
/// without making it re-read on every turn.
const RESOURCES_TTL_MS: u64 = 60_000;

/// The HTTP headers of a request that the 2026-07-28 transport requires to
/// match its body, as the transport read them (`None` when absent). stdio
/// has none of these and skips the check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestHeaders {
    pub protocol_version: Option<String>,
    pub method: Option<String>,
    pub name: Option<String>,
    /// Every `Mcp-Param-<name>` header: the name after the prefix, and the
    /// value as sent.
    pub params: Vec<(String, String)>,
}

/// What the envelope of one request says.
struct Envelope {
    tasks_extension: bool,
    log_level: Option<Level>,
}

impl Server {
    /// Answers one modern-era request.
    pub(super) fn on_modern_request(
        self: &std::sync::Arc<Self>,
        session: &std::sync::Arc<Session>,
        request: Request,
        outbox: Outbox,
        message_bytes: usize,
    ) {
        let Request { id, mut params, method } = request;
        // Held until the answer is sent, below.
        let _piece = resources::piece_turn(&method, &params);
        let envelope = match check_request(session.headers(), &method, &params) {
            Ok(envelope) => envelope,
            Err(error) => return send_response(&outbox, &Response { id: Some(id), result: Err(error) }),
        };
        let result = match method.as_str() {
            "server/discover" => Ok(discover(&self.ctx.config)),
            // A list per caller is not for a shared cache.
            "tools/list" => list_tools(&self.registry, self.fixture_tools(), session.caller(), &params)
                .map(|result| cacheable(result, LIST_TTL_MS))
                .map(|result| if session.caller().scoped { private_cache(result) } else { result }),
            // A conformance fixture (a test build's only): its own schema
            // is what the headers are checked against.
            #[cfg(feature = "testing")]
            "tools/call" if let Some(fixture) = self.fixture_called(&params) => {
                params.remove("task");
                let era = EraCall::Modern { log_level: envelope.log_level };
                let started = match session.headers() {
                    Some(headers) => check_param_headers(headers, &(fixture.input_schema)(), &params),
                    None => Ok(()),
                }
                .and_then(|()| self.start_fixture(session, &id, fixture, params, outbox.clone(), message_bytes, era));
                match started {
                    Ok(()) => return,
                    Err(error) => Err(error),
                }
            }
            "tools/call" => {
                // The 2025-11-25 `task` parameter does not exist here: the
                // server decides, from the advertised extension.
                params.remove("task");
                let name = params.get("name").and_then(Value::as_str).unwrap_or_default();
                if let (Some(headers), Some(tool)) = (session.headers(), self.registry.find(name))
                    && let Err(error) = check_param_headers(headers, &tool.input_schema, &params)
                {
                    return send_response(&outbox, &Response { id: Some(id), result: Err(error) });
                }
                let task_tool = self.registry.find(name).map(|tool| tool.name).filter(|name| tools::background::TASK_TOOLS.contains(name));
                let started = if let Some(tool_name) = task_tool.filter(|_| envelope.tasks_extension) {
                    if let Err(error) = self.check_tool_allowed(session.caller(), tool_name, true) {
                        return send_response(&outbox, &Response { id: Some(id), result: Err(error) });
                    }
                    let work = Work::Raw(tasks_extension::create);
                    let call = CallStart {
                        name: tool_name,
                        trace: CallTrace::of("tools/call", &params),
                        work,
                        arguments: params,
                        progress_token: None,
                        message_bytes,
                        era: EraCall::Modern { log_level: None },
                    };
                    refuse_input_answers(&call.arguments).and_then(|()| self.spawn_call(session, &id, call, outbox.clone()))
                } else {
                    self.start_call(session, &id, params, outbox.clone(), message_bytes, EraCall::Modern { log_level: envelope.log_level })
                };
                match started {
                    Ok(()) => return,
                    Err(error) => Err(error),
                }
            }
            method if let Some((name, handler)) = tasks_extension::handler(method) => {
                // A staged conformance fixture's task answers its own.
                #[cfg(feature = "testing")]
                let (name, handler) = match self.ctx.config.conformance_fixtures {
                    true => fixtures::task_handler(method, &params).unwrap_or((name, handler)),
                    false => (name, handler),
                };
                if !envelope.tasks_extension {
                    Err(missing_tasks_extension(name))
                } else {
                    let call = CallStart {
                        name,
                        trace: CallTrace::of(name, &params),
                        work: Work::Raw(handler),
                        arguments: params,
                        progress_token: None,
                        message_bytes,
                        era: EraCall::Modern { log_level: None },
                    };
                    match self.spawn_call(session, &id, call, outbox.clone()) {
                        Ok(()) => return,
                        Err(error) => Err(error),
                    }
                }
            }
            #[cfg(feature = "testing")]
            "prompts/list" if self.ctx.config.conformance_fixtures => Ok(cacheable(fixtures::content::prompts(), LIST_TTL_MS)),
            #[cfg(feature = "testing")]
            "prompts/get" if self.ctx.config.conformance_fixtures => fixtures::content::get_prompt(&params),
            #[cfg(feature = "testing")]
            "completion/complete" if self.ctx.config.conformance_fixtures => Ok(fixtures::content::complete(&params)),
            #[cfg(feature = "testing")]
            method if resources::METHODS.contains(&method) && self.ctx.config.conformance_fixtures => {
                fixture_resources(method, &self.ctx, session.caller(), &params)
            }
            // The snippets, as in the handshake era; declared in
            // `server/discover` only with a snippets folder.
            method if resources::METHODS.contains(&method) && resources::offered(&self.ctx.config) => {
                served_resources(method, &self.ctx, session.caller(), &params)
            }
            method => Err(method_not_found(method)),
        };
        send_response(&outbox, &Response { id: Some(id), result: result.map(complete) });
    }
}

/// `YYYY-MM-DD`, the shape of every MCP revision name.
fn is_revision_shaped(version: &str) -> bool {
    let bytes = version.as_bytes();
    bytes.len() == 10
        && bytes.iter().enumerate().all(|(index, byte)| if index == 4 || index == 7 { *byte == b'-' } else { byte.is_ascii_digit() })
}

fn unsupported_version(version: &str) -> ResponseError {
    ResponseError::new(
        ErrorCode::UnsupportedProtocolVersion,
        format!(
            "unsupported protocol version `{}`; supported: {} (or `initialize` for {})",
            echo::shorten(version),
            MODERN_VERSIONS.join(", "),
            super::SUPPORTED_VERSIONS.join(", ")
        ),
    )
    .with_data(json!({ "supported": MODERN_VERSIONS, "requested": version }))
}

/// The envelope, the HTTP headers and the revision, in the order the
/// conformance suite and the spec expect: a missing envelope is -32602
/// even when the headers name a version; a header that disagrees with the
/// body is -32020 before the version itself is judged.
fn check_request(headers: Option<&RequestHeaders>, method: &str, params: &Map<String, Value>) -> Result<Envelope, ResponseError> {
    let Some(meta) = params.get("_meta").and_then(Value::as_object) else {
        // A header that is not a revision at all (not `YYYY-MM-DD`) says
        // more than the missing envelope does: the client speaks something
        // this server does not. A revision-shaped one keeps the spec's
        // order (the envelope first).
        if let Some(version) = headers.and_then(|headers| headers.protocol_version.as_deref())
            && !is_revision_shaped(version)
        {
            return Err(unsupported_version(version));
        }
        return Err(invalid_params(format!(
            "missing `_meta`: revision 2026-07-28 requests carry `{META_PROTOCOL_VERSION}` and `{META_CLIENT_CAPABILITIES}` in `params._meta`"
        )));
    };
    let version = match meta.get(META_PROTOCOL_VERSION) {
        Some(Value::String(version)) => version.as_str(),
        Some(other) => {
            return Err(invalid_params(format!("`_meta.{META_PROTOCOL_VERSION}` must be a string, not {}", crate::json::json_kind(other))));
        }
        None => return Err(invalid_params(format!("missing `_meta.{META_PROTOCOL_VERSION}`"))),
    };
    let capabilities = match meta.get(META_CLIENT_CAPABILITIES) {
        Some(Value::Object(capabilities)) => capabilities,
        Some(other) => {
            return Err(invalid_params(format!(
                "`_meta.{META_CLIENT_CAPABILITIES}` must be an object, not {}",
                crate::json::json_kind(other)
            )));
        }
        None => return Err(invalid_params(format!("missing `_meta.{META_CLIENT_CAPABILITIES}`"))),
    };
    if let Some(headers) = headers {
        check_headers(headers, method, params, version)?;
    }
    if !MODERN_VERSIONS.contains(&version) {
        return Err(unsupported_version(version));
    }
    let log_level = match meta.get(META_LOG_LEVEL) {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(Level::parse(text).ok_or_else(|| {
            invalid_params(format!(
                "unknown log level `{}` in `_meta.{META_LOG_LEVEL}`; accepted: debug, info, notice, warning, error, critical, alert, emergency",
                echo::shorten(text)
            ))
        })?),
        Some(other) => return Err(invalid_params(format!("`_meta.{META_LOG_LEVEL}` must be a string, not {}", crate::json::json_kind(other)))),
    };
    Ok(Envelope { tasks_extension: super::era::declares_tasks_extension(capabilities), log_level })
}

/// Why an `Mcp-Name` value in the encoded form could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderValueError {
    NotBase64,
    NotUtf8,
}

impl fmt::Display for HeaderValueError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderValueError::NotBase64 => write!(formatter, "the text between `=?base64?` and `?=` is not base64"),
            HeaderValueError::NotUtf8 => write!(formatter, "its base64 does not decode to UTF-8"),
        }
    }
}

/// The markers of the encoded form of a header value.
const ENCODED_PREFIX: &str = "=?base64?";
const ENCODED_SUFFIX: &str = "?=";

/// A 2026-07-28 header value as the body carries it (Streamable HTTP,
/// "Value encoding", for `Mcp-Name` and `Mcp-Param-*`): a value that is
/// not plain visible ASCII, has surrounding whitespace or looks like the
/// markers arrives as `=?base64?<base64 of its UTF-8>?=`, standard
/// alphabet. Whatever wears the markers (lowercase, case-sensitive) is
/// decoded, since clients also encode a plain value that looks like them;
/// anything else is the value itself. Whitespace around the header value
/// belongs to HTTP, not to the value (RFC 9110 section 5.5), so it is
/// trimmed first; inside the encoded form it is the value's and kept.
/// Padding is optional: some encoders leave it out.
pub fn decode_header_value(raw: &str) -> Result<Cow<'_, str>, HeaderValueError> {
    decode_with(raw, &base64::engine::general_purpose::STANDARD_NO_PAD_INDIFFERENT)
}

/// An `Mcp-Param-*` value, decoded as `decode_header_value` does but with
/// the padding the spec writes required: SEP-2243 has servers refuse a
/// parameter header whose base64 is not exact, since a client and a proxy
/// must not read two values from one header. (`Mcp-Name` stays lenient:
/// clients have been seen to leave padding out, and its value is compared
/// with the body's either way.)
fn decode_param_value(raw: &str) -> Result<Cow<'_, str>, HeaderValueError> {
    decode_with(raw, &base64::engine::general_purpose::STANDARD)
}

fn decode_with<'a>(raw: &'a str, engine: &impl base64::Engine) -> Result<Cow<'a, str>, HeaderValueError> {
    let raw = raw.trim_matches([' ', '\t']);
    let Some(encoded) = raw.strip_prefix(ENCODED_PREFIX).and_then(|rest| rest.strip_suffix(ENCODED_SUFFIX)) else {
        return Ok(Cow::Borrowed(raw));
    };
    let bytes = engine.decode(encoded).map_err(|_| HeaderValueError::NotBase64)?;
    String::from_utf8(bytes).map(Cow::Owned).map_err(|_| HeaderValueError::NotUtf8)
}

/// Streamable HTTP (2026-07-28, "Custom headers", SEP-2243): an argument
/// whose schema names a header (`"x-mcp-header": "Region"`) is repeated
/// in `Mcp-Param-Region`. When the call sets the argument the header must
/// be there and equal to it (a number or boolean as its JSON text);
/// otherwise -32020, as for the standard headers.
fn check_param_headers(headers: &RequestHeaders, schema: &Value, params: &Map<String, Value>) -> Result<(), ResponseError> {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return Ok(()) };
    let arguments = params.get("arguments").and_then(Value::as_object);
    for (property, definition) in properties {
        let Some(suffix) = definition.get("x-mcp-header").and_then(Value::as_str) else { continue };
        let expected = match arguments.and_then(|arguments| arguments.get(property)) {
            Some(Value::String(text)) => text.clone(),
            Some(value @ (Value::Bool(_) | Value::Number(_))) => value.to_string(),
            _ => continue,
        };
        let header = format!("Mcp-Param-{suffix}");
        let mismatch = |message: String| Err(ResponseError::new(ErrorCode::HeaderMismatch, message));
        let sent: Vec<&String> =
            headers.params.iter().filter(|(name, _)| name.eq_ignore_ascii_case(suffix)).map(|(_, value)| value).collect();
        let raw = match sent[..] {
            [raw] => raw,
            [] => {
                return mismatch(format!(
                    "missing header {header}; the argument `{property}` is set, and the tool's schema has it repeated there"
                ));
            }
            // Two values would let a proxy route on one while the server
            // reads the other.
            _ => return mismatch(format!("{header} is sent {} times; send it once", sent.len())),
        };
        match decode_param_value(raw) {
            Ok(sent) if *sent == expected => {}
            Ok(sent) => {
                return mismatch(format!(
                    "header {header} `{}` does not match the argument `{property}` `{}`",
                    echo::shorten(&sent),
                    echo::shorten(&expected)
                ));
            }
            Err(error) => {
                return mismatch(format!(
                    "header {header} `{}` is not a valid encoded value: {error}; send `=?base64?<base64 of the UTF-8, padded>?=` or the plain value",
                    echo::shorten(raw.trim())
                ));
            }
        }
    }
    Ok(())
}

/// Streamable HTTP (2026-07-28, "Standard headers"): `MCP-Protocol-Version`
/// and `Mcp-Method` always, `Mcp-Name` for the methods that name a target,
/// each equal to the body's value (surrounding whitespace aside, RFC 9110
/// §5.5; values are case-sensitive). `Mcp-Name` is decoded first when it
/// is in the encoded form; the other two are never encoded (the spec
/// encodes only `Mcp-Name` and `Mcp-Param-*`), and method names and
/// revisions are plain ASCII.
fn check_headers(headers: &RequestHeaders, method: &str, params: &Map<String, Value>, version: &str) -> Result<(), ResponseError> {
    let name_key = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    };
    let body_name = name_key.and_then(|key| params.get(key)).and_then(Value::as_str);
    let checks = [
        ("MCP-Protocol-Version", headers.protocol_version.as_deref(), Some(version)),
        ("Mcp-Method", headers.method.as_deref(), Some(method)),
        ("Mcp-Name", headers.name.as_deref(), body_name),
    ];
    for (header, sent, expected) in checks {
        let Some(expected) = expected else { continue };
        let sent = match sent {
            Some(sent) if header == "Mcp-Name" => Some(decode_header_value(sent).map_err(|error| {
                ResponseError::new(
                    ErrorCode::HeaderMismatch,
                    format!(
                        "header {header} `{}` is not a valid encoded value: {error}; send `=?base64?<base64 of the UTF-8>?=` or the plain value",
                        echo::shorten(sent.trim())
                    ),
                )
            })?),
            Some(sent) => Some(Cow::Borrowed(sent.trim())),
            None => None,
        };
        match sent.as_deref() {
            Some(sent) if sent == expected => {}
            Some(sent) => {
                return Err(ResponseError::new(
                    ErrorCode::HeaderMismatch,
                    format!("header {header} `{}` does not match the body's `{}`", echo::shorten(sent), echo::shorten(expected)),
                ));
            }
            None => {
                return Err(ResponseError::new(
                    ErrorCode::HeaderMismatch,
                    format!("missing header {header}; the body says `{}`", echo::shorten(expected)),
                ));
            }
        }
    }
    Ok(())
}

/// The `server/discover` result; `resources` when snippets are served,
/// and what the conformance fixtures add.
fn discover(config: &crate::config::Config) -> Value {
    // Only what is implemented: clients gate features on these. No
    // `logging` (the level rides in each request's `_meta`), and tasks are
    // the extension, not the 2025-11-25 `tasks` slot.
    let mut capabilities = json!({ "tools": {}, "extensions": { TASKS_EXTENSION: {} } });
    if resources::offered(config) || config.conformance_fixtures {
        capabilities["resources"] = json!({});
    }
    if config.conformance_fixtures {
        capabilities["prompts"] = json!({});
        capabilities["completions"] = json!({});
    }
    let result = json!({
        "supportedVersions": MODERN_VERSIONS,
        "capabilities": capabilities,
        "instructions": super::instructions(config),
        "_meta": { "io.modelcontextprotocol/serverInfo": super::server_info() },
    });
    cacheable(result, LIST_TTL_MS)
}

/// `resources/*` of the snippets and stored outputs, in this era's
/// shapes: caching hints (private for a stored output) and -32602 with
/// `data.uri` for a resource that does not exist.
fn served_resources(
    method: &str,
    ctx: &tools::Ctx,
    caller: &crate::callers::Caller,
    params: &Map<String, Value>,
) -> Result<Value, ResponseError> {
    let private = resources::is_private(params);
    resources::handle(method, ctx, caller, params)
        .map(|result| cacheable(result, RESOURCES_TTL_MS))
        .map(|result| if private { private_cache(result) } else { result })
        .map_err(|error| modern_resource_error(error, params))
}

/// `resources/*` with the conformance fixtures: their `test://`
/// resources first, then the snippets and stored outputs as without them.
#[cfg(feature = "testing")]
fn fixture_resources(
    method: &str,
    ctx: &tools::Ctx,
    caller: &crate::callers::Caller,
    params: &Map<String, Value>,
) -> Result<Value, ResponseError> {
    let ours = |method| if resources::offered(&ctx.config) { resources::handle(method, ctx, caller, params) } else { Ok(json!({})) };
    let listed = |method, key: &str, fixtures: Vec<Value>| -> Result<Value, ResponseError> {
        let mut listed = ours(method)?;
        let mut all = fixtures;
        all.extend(listed.get(key).and_then(Value::as_array).cloned().unwrap_or_default());
        listed[key] = Value::Array(all);
        Ok(cacheable(listed, RESOURCES_TTL_MS))
    };
    match method {
        "resources/list" => listed(method, "resources", fixtures::content::resources()),
        "resources/templates/list" => listed(method, "resourceTemplates", fixtures::content::resource_templates()),
        _ => {
            let uri = params.get("uri").and_then(Value::as_str).unwrap_or_default();
            match fixtures::content::read_resource(uri) {
                Some(read) => Ok(cacheable(read, RESOURCES_TTL_MS)),
                None if resources::offered(&ctx.config) => served_resources(method, ctx, caller, params),
                None => Err(invalid_params(format!("resource not found: `{}`", echo::shorten(uri))).with_data(json!({ "uri": uri }))),
            }
        }
    }
}

/// Adds the caching hints that 2026-07-28 requires on the results of
/// `server/discover`, the lists and `resources/read` (SEP-2549): what this
/// server answers there is the same for every caller, so any cache may
/// share it.
fn cacheable(mut result: Value, ttl_ms: u64) -> Value {
    if let Value::Object(object) = &mut result {
        object.insert("ttlMs".into(), json!(ttl_ms));
        object.insert("cacheScope".into(), json!("public"));
    }
    result
}

/// 2026-07-28 has no -32002: a resource that does not exist is invalid
/// params, with the same message and the requested URI in `data.uri`
/// (SEP-2164), so a client can tell which of its reads failed.
/// A stored output's piece is the caller's alone (its URI is a
/// capability): no shared cache may keep it.
fn private_cache(mut result: Value) -> Value {
    if let Value::Object(object) = &mut result {
        object.insert("cacheScope".into(), json!("private"));
    }
    result
}

fn modern_resource_error(error: ResponseError, params: &Map<String, Value>) -> ResponseError {
    match error.code {
        ErrorCode::ResourceNotFound => {
            let uri = params.get("uri").cloned().unwrap_or(Value::Null);
            ResponseError::new(ErrorCode::InvalidParams, error.message).with_data(json!({ "uri": uri }))
        }
        _ => error,
    }
}

/// -32601. The three methods 2026-07-28 removed say what replaces them;
/// any other (`prompts/list`, `resources/*` without a snippets folder, a
/// typo) is simply absent, and a hint about the handshake era would
/// mislead.
fn method_not_found(method: &str) -> ResponseError {
    let hint = match method {
        "initialize" => {
            " (revision 2026-07-28 has no handshake: send each request with the `_meta` envelope, or `initialize` without it for the handshake era)"
        }
        "ping" => " (revision 2026-07-28 removed it; the handshake era keeps it)",
        "logging/setLevel" => {
            " (revision 2026-07-28 removed it: name the level in each request's `_meta.io.modelcontextprotocol/logLevel`)"
        }
        _ => "",
    };
    ResponseError::new(ErrorCode::MethodNotFound, format!("method not found: `{}`{hint}", echo::shorten(method)))
}

/// -32021 for a task method from a client that did not advertise tasks.
fn missing_tasks_extension(method: &str) -> ResponseError {
    ResponseError::new(
        ErrorCode::MissingRequiredClientCapability,
        format!("`{method}` needs the `{TASKS_EXTENSION}` extension; declare it in `_meta.{META_CLIENT_CAPABILITIES}.extensions`"),
    )
    .with_data(json!({ "requiredCapabilities": { "extensions": { TASKS_EXTENSION: {} } } }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_are_decoded() {
        let cases = [
            ("=?base64?c25pcHBldDovL2jDqWxsbw==?=", Ok("snippet://h\u{e9}llo")),
            ("=?base64?c25pcHBldDovL2jDqWxsbw?=", Ok("snippet://h\u{e9}llo")),
            ("  =?base64?c25pcHBldDovL2jDqWxsbw==?=\t", Ok("snippet://h\u{e9}llo")),
            ("=?base64?ICBwYWRkZWQg?=", Ok("  padded ")),
            ("=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?=", Ok("=?base64?literal?=")),
            ("=?base64??=", Ok("")),
            ("describe_environment", Ok("describe_environment")),
            ("  describe_environment  ", Ok("describe_environment")),
            ("snippet://h\u{e9}llo", Ok("snippet://h\u{e9}llo")),
            ("=?BASE64?c25pcHBldA==?=", Ok("=?BASE64?c25pcHBldA==?=")),
            ("=?base64?c25pcHBldA==", Ok("=?base64?c25pcHBldA==")),
            ("=?base64?c25p!!?=", Err(HeaderValueError::NotBase64)),
            ("=?base64?c25p cHBldA==?=", Err(HeaderValueError::NotBase64)),
            ("=?base64?c25pcHBldA-_?=", Err(HeaderValueError::NotBase64)),
            ("=?base64?/w==?=", Err(HeaderValueError::NotUtf8)),
            ("=?base64?wyg=?=", Err(HeaderValueError::NotUtf8)),
        ];
        for (raw, expected) in cases {
            assert_eq!(decode_header_value(raw).as_deref().map_err(|error| *error), expected, "{raw:?}");
        }
    }

    #[test]
    fn an_encoded_name_is_compared_decoded() {
        let params = json!({ "uri": "snippet://h\u{e9}llo" });
        let params = params.as_object().unwrap();
        let headers = |name: &str| RequestHeaders {
            protocol_version: Some("2026-07-28".into()),
            method: Some("resources/read".into()),
            name: Some(name.into()),
            params: Vec::new(),
        };
        let check = |name: &str| check_headers(&headers(name), "resources/read", params, "2026-07-28").map_err(|error| error.message);
        assert_eq!(check("=?base64?c25pcHBldDovL2jDqWxsbw==?="), Ok(()));
        let not_base64 = check("=?base64?%%?=").unwrap_err();
        assert!(not_base64.contains("header Mcp-Name `=?base64?%%?=` is not a valid encoded value"), "{not_base64}");
        assert!(check("=?base64?/w==?=").unwrap_err().contains("does not decode to UTF-8"));
        assert!(check("=?base64?c25pcHBldDovL2hlbGxv?=").unwrap_err().contains("does not match the body's"));
    }

    #[test]
    fn only_the_removed_methods_hint_at_their_replacement() {
        assert!(method_not_found("ping").message.contains("the handshake era keeps it"));
        assert!(method_not_found("initialize").message.contains("`_meta` envelope"));
        assert!(method_not_found("logging/setLevel").message.contains(META_LOG_LEVEL));
        for absent in ["prompts/list", "resources/list", "nope"] {
            assert_eq!(method_not_found(absent).message, format!("method not found: `{absent}`"));
        }
    }
}
