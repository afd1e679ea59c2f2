//! JSON-RPC 2.0 framing after lsp-server: the `Message` model, `RequestId`
//! (keeps `92` and `"92"` apart), `ErrorCode`, parsing one message from text
//! (after `scan` has bounded what it may cost) and writing one back; a
//! refused message is a `Rejection`, which keeps the id as the client wrote
//! it. Knows nothing of MCP methods or sessions.

use std::fmt;

use serde_json::{Map, Value};

use super::scan::{self, IdKind};
use crate::json::json_kind;

/// A request id: JSON-RPC allows strings and numbers; MCP forbids null, and
/// both SDKs reject fractions, so integers and strings are all we keep.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RequestId {
    Integer(i64),
    String(String),
}

impl RequestId {
    pub fn to_json(&self) -> Value {
        match self {
            RequestId::Integer(number) => Value::from(*number),
            RequestId::String(text) => Value::from(text.as_str()),
        }
    }

    /// Reads an id (or a progress token, which has the same shape).
    pub fn from_json(value: &Value) -> Option<RequestId> {
        match value {
            Value::String(text) => Some(RequestId::String(text.clone())),
            Value::Number(number) => number.as_i64().map(RequestId::Integer),
            _ => None,
        }
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Integer(number) => write!(formatter, "{number}"),
            RequestId::String(text) => write!(formatter, "{text:?}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub id: RequestId,
    pub method: String,
    /// Always an object; an absent `params` reads as `{}`.
    pub params: Map<String, Value>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Notification {
    pub method: String,
    pub params: Map<String, Value>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// `None` only when the request's id could not be read (parse errors);
    /// written as `"id":null`, as JSON-RPC 2.0 says.
    pub id: Option<RequestId>,
    pub result: Result<Value, ResponseError>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Request(Request),
    Notification(Notification),
    Response(Response),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    ParseError,
    InvalidRequest,
    MethodNotFound,
    InvalidParams,
    InternalError,
    /// MCP's "resource not found" (revisions up to 2025-11-25).
    ResourceNotFound,
    /// 2026-07-28: an HTTP header (`MCP-Protocol-Version`, `Mcp-Method`,
    /// `Mcp-Name`) disagrees with the body.
    HeaderMismatch,
    /// 2026-07-28: the request needs a client capability it did not declare.
    MissingRequiredClientCapability,
    /// 2026-07-28: the request names a revision this server does not serve.
    UnsupportedProtocolVersion,
}

impl ErrorCode {
    pub fn code(self) -> i64 {
        match self {
            ErrorCode::ParseError => -32700,
            ErrorCode::InvalidRequest => -32600,
            ErrorCode::MethodNotFound => -32601,
            ErrorCode::InvalidParams => -32602,
            ErrorCode::InternalError => -32603,
            ErrorCode::ResourceNotFound => -32002,
            ErrorCode::HeaderMismatch => -32020,
            ErrorCode::MissingRequiredClientCapability => -32021,
            ErrorCode::UnsupportedProtocolVersion => -32022,
        }
    }

    fn from_code(code: i64) -> Option<ErrorCode> {
        [
            ErrorCode::ParseError,
            ErrorCode::InvalidRequest,
            ErrorCode::MethodNotFound,
            ErrorCode::InvalidParams,
            ErrorCode::InternalError,
            ErrorCode::ResourceNotFound,
            ErrorCode::HeaderMismatch,
            ErrorCode::MissingRequiredClientCapability,
            ErrorCode::UnsupportedProtocolVersion,
        ]
        .into_iter()
        .find(|error_code| error_code.code() == code)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ResponseError {
    pub code: ErrorCode,
    pub message: String,
    /// The error's `data` member, when the code defines one (-32021, -32022,
    /// a missing resource's -32602 in 2026-07-28).
    pub data: Option<Value>,
}

impl ResponseError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ResponseError {
        ResponseError { code, message: message.into(), data: None }
    }

    pub fn with_data(mut self, data: Value) -> ResponseError {
        self.data = Some(data);
        self
    }
}

impl Response {
    pub fn ok(id: RequestId, result: Value) -> Response {
        Response { id: Some(id), result: Ok(result) }
    }

    pub fn error(id: Option<RequestId>, code: ErrorCode, message: impl Into<String>) -> Response {
        Response { id, result: Err(ResponseError::new(code, message)) }
    }

    /// The response as one line of JSON text, exactly `to_json().to_string()`
    /// but without copying the result, and allocated once: a tool result
    /// can carry tens of MiB of base64 artifacts, and the copy plus the
    /// text's doubling growth made a 9 MiB artifact cost the server 78 MB
    ///.
    pub fn to_text(&self) -> String {
        let Ok(result) = &self.result else { return self.to_json().to_string() };
        let id = self.id.as_ref().map_or(Value::Null, RequestId::to_json);
        // Keys in the order `Map` sorts them, so both ways write the same text.
        let write = |out: &mut dyn std::io::Write| -> std::io::Result<()> {
            out.write_all(b"{\"id\":")?;
            serde_json::to_writer(&mut *out, &id)?;
            out.write_all(b",\"jsonrpc\":\"2.0\",\"result\":")?;
            serde_json::to_writer(&mut *out, result)?;
            out.write_all(b"}")
        };
        crate::json::exact_text(&write).unwrap_or_else(|| self.to_json().to_string())
    }

    pub fn to_json(&self) -> Value {
        let mut object = Map::new();
        object.insert("jsonrpc".into(), "2.0".into());
        object.insert("id".into(), self.id.as_ref().map_or(Value::Null, RequestId::to_json));
        match &self.result {
            Ok(result) => {
                object.insert("result".into(), result.clone());
            }
            Err(error) => {
                let mut error_object = Map::new();
                error_object.insert("code".into(), error.code.code().into());
                error_object.insert("message".into(), error.message.clone().into());
                if let Some(data) = &error.data {
                    error_object.insert("data".into(), data.clone());
                }
                object.insert("error".into(), Value::Object(error_object));
            }
        }
        Value::Object(object)
    }
}

impl Notification {
    pub fn new(method: &str, params: Value) -> Notification {
        let params = match params {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        Notification { method: method.to_string(), params }
    }

    pub fn to_json(&self) -> Value {
        serde_json::json!({ "jsonrpc": "2.0", "method": self.method, "params": self.params })
    }
}

/// A message refused before it could be served: the error, and the id to
/// answer with, as the JSON text the client wrote it (`None` writes
/// `"id":null`, for text that is not JSON or whose id is unusable). Kept
/// as text so an integer id beyond i64, which `RequestId` cannot hold, is
/// still echoed exactly.
#[derive(Clone, Debug, PartialEq)]
pub struct Rejection {
    pub id: Option<String>,
    pub error: ResponseError,
}

impl Rejection {
    /// The error response, keys in the order `Response::to_json` writes them.
    pub fn to_text(&self) -> String {
        let error = serde_json::json!({ "code": self.error.code.code(), "message": self.error.message });
        format!(r#"{{"error":{error},"id":{},"jsonrpc":"2.0"}}"#, self.id.as_deref().unwrap_or("null"))
    }

    fn from_response(response: Response) -> Rejection {
        let error = response.result.err().unwrap_or_else(|| ResponseError::new(ErrorCode::InternalError, "internal error"));
        Rejection { id: response.id.map(|id| id.to_json().to_string()), error }
    }
}

/// Reads one JSON-RPC message: first the byte-level pre-scan (bounded
/// cost, duplicate keys, numbers serde_json cannot hold, the raw id), then
/// serde_json. On failure returns what to answer, with the request's id
/// whenever the text is JSON and the id is a string or an integer.
pub fn parse(text: &str) -> Result<Message, Rejection> {
    parse_counted(text).0
}

/// `parse`, with the number of values the scan counted (0 when it refused
/// the text), so the caller can bound what the message costs.
pub fn parse_counted(text: &str) -> (Result<Message, Rejection>, usize) {
    let scanned = scan::scan(text, &scan::LIMITS);
    let values = scanned.as_ref().map(|scanned| scanned.n_values).unwrap_or(0);
    (parse_scanned(text, scanned), values)
}

fn parse_scanned(text: &str, scanned: Result<scan::Scanned<'_>, scan::ScanError<'_>>) -> Result<Message, Rejection> {
    let raw_id = match &scanned {
        Ok(scanned) => scanned.id,
        Err(error) if error.kind.is_syntax() => {
            return Err(Rejection { id: None, error: ResponseError::new(ErrorCode::ParseError, error.kind.to_string()) });
        }
        Err(error) => error.id,
    };
    if let Some(raw) = raw_id
        && raw.kind == IdKind::Integer
        && raw.text.parse::<i64>().is_err()
    {
        let message = format!(
            "`id` `{}` is an integer outside the 64-bit range this server keeps ids in ({} to {}); use a string id or a smaller integer",
            crate::echo::shorten(raw.text),
            i64::MIN,
            i64::MAX
        );
        return Err(Rejection { id: Some(raw.text.to_string()), error: ResponseError::new(ErrorCode::InvalidRequest, message) });
    }
    let echo_id = raw_id.filter(|raw| matches!(raw.kind, IdKind::String | IdKind::Integer)).map(|raw| raw.text.to_string());
    if let Err(error) = scanned {
        return Err(Rejection { id: echo_id, error: ResponseError::new(ErrorCode::InvalidRequest, error.kind.to_string()) });
    }
    let mut value: Value = serde_json::from_str(text)
        .map_err(|error| Rejection { id: echo_id, error: ResponseError::new(ErrorCode::ParseError, format!("parse error: {error}")) })?;
    // `-0` is an integer by the JSON grammar, but serde_json reads it as a
    // float; it is the id 0 (every JSON reader compares them equal).
    if raw_id.is_some_and(|raw| raw.kind == IdKind::Integer && raw.text == "-0")
        && let Some(id) = value.get_mut("id")
    {
        *id = Value::from(0);
    }
    from_value(value).map_err(Rejection::from_response)
}

/// The id of a message known only by its first bytes (a stdio line over
/// the size cap), when they hold all of it and it is a string or an
/// integer, as JSON text; so even that refusal reaches the request that
/// waits for it.
pub fn id_in_prefix(prefix: &str) -> Option<String> {
    let raw = match scan::scan(prefix, &scan::LIMITS) {
        Ok(scanned) => scanned.id,
        Err(error) => error.id,
    }?;
    // An id that runs to the very end may have been cut short.
    let end = raw.text.as_ptr() as usize - prefix.as_ptr() as usize + raw.text.len();
    let whole = end < prefix.len();
    (whole && matches!(raw.kind, IdKind::String | IdKind::Integer)).then(|| raw.text.to_string())
}

/// Takes the message apart by moving its members: `params` can be most
/// of the message, and a copy would double what it costs.
fn from_value(value: Value) -> Result<Message, Response> {
    let mut object = match value {
        Value::Object(object) => object,
        // Batches existed only in revision 2025-03-26, and no client we
        // test against sends them.
        Value::Array(_) => return Err(invalid(None, "batches are not supported; send one message per request")),
        other => return Err(invalid(None, format!("a message must be a JSON object, not {}", json_kind(&other)))),
    };
    let id = read_id(&object)?;
    if object.get("jsonrpc") != Some(&Value::from("2.0")) {
        return Err(invalid(id, "`jsonrpc` must be \"2.0\""));
    }
    match object.remove("method") {
        Some(Value::String(method)) => {
            let params = read_params(object.remove("params"), id.clone())?;
            Ok(match id {
                Some(id) => Message::Request(Request { id, method, params }),
                None => Message::Notification(Notification { method, params }),
            })
        }
        Some(other) => Err(invalid(id, format!("`method` must be a string, not {}", json_kind(&other)))),
        None => read_response(&object, id),
    }
}

/// `Ok(None)` when there is no `id` member (a notification); an `id` that is
/// present but null, fractional or of another type is an invalid request.
fn read_id(object: &Map<String, Value>) -> Result<Option<RequestId>, Response> {
    let Some(value) = object.get("id") else {
        return Ok(None);
    };
    match RequestId::from_json(value) {
        Some(id) => Ok(Some(id)),
        None => Err(invalid(None, format!("`id` must be a string or an integer, not {}", json_kind(value)))),
    }
}

fn read_params(params: Option<Value>, id: Option<RequestId>) -> Result<Map<String, Value>, Response> {
    match params {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(params)) => Ok(params),
        Some(other) => Err(invalid(id, format!("`params` must be an object, not {}", json_kind(&other)))),
    }
}

/// A client's response to a server request. This server sends none yet, so
/// responses are only read far enough to be recognised and ignored.
fn read_response(object: &Map<String, Value>, id: Option<RequestId>) -> Result<Message, Response> {
    if !object.contains_key("result") && !object.contains_key("error") {
        return Err(invalid(id, "a message needs `method` (request or notification) or `result`/`error` (response)"));
    }
    let result = match object.get("error") {
        Some(error) => {
            let code = error.get("code").and_then(Value::as_i64).and_then(ErrorCode::from_code);
            let message = error.get("message").and_then(Value::as_str).unwrap_or_default();
            Err(ResponseError::new(code.unwrap_or(ErrorCode::InternalError), message))
        }
        None => Ok(object.get("result").cloned().unwrap_or(Value::Null)),
    };
    Ok(Message::Response(Response { id, result }))
}

fn invalid(id: Option<RequestId>, message: impl Into<String>) -> Response {
    Response::error(id, ErrorCode::InvalidRequest, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_text_is_the_json_written_out() {
        let responses = [
            Response::ok(RequestId::Integer(7), serde_json::json!({"b": [1, "x\n"], "a": null})),
            Response::ok(RequestId::String("7".into()), serde_json::json!("text")),
            Response::error(None, ErrorCode::ParseError, "bad \"json\""),
            Response::error(Some(RequestId::Integer(1)), ErrorCode::InvalidParams, "no"),
        ];
        for response in responses {
            assert_eq!(response.to_text(), response.to_json().to_string(), "{response:?}");
        }
    }

    fn error_text(input: &str) -> String {
        match parse(input) {
            Ok(message) => panic!("{input} parsed as {message:?}"),
            Err(rejection) => rejection.to_text(),
        }
    }

    #[test]
    fn requests_keep_the_id_type() {
        // serde_json sorts object keys, so answers read `id`, `jsonrpc`, `result`.
        let cases = [
            (r#"{"jsonrpc":"2.0","id":92,"method":"ping"}"#, r#"{"id":92,"jsonrpc":"2.0","result":{}}"#),
            (r#"{"jsonrpc":"2.0","id":"92","method":"ping"}"#, r#"{"id":"92","jsonrpc":"2.0","result":{}}"#),
            (r#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#, r#"{"id":0,"jsonrpc":"2.0","result":{}}"#),
            (r#"{"jsonrpc":"2.0","id":-3,"method":"ping"}"#, r#"{"id":-3,"jsonrpc":"2.0","result":{}}"#),
            // An integer by the JSON grammar, though serde_json reads a float.
            (r#"{"jsonrpc":"2.0","id":-0,"method":"ping"}"#, r#"{"id":0,"jsonrpc":"2.0","result":{}}"#),
        ];
        for (input, expected) in cases {
            let Ok(Message::Request(request)) = parse(input) else { panic!("{input}") };
            assert!(request.params.is_empty());
            let answer = Response::ok(request.id, serde_json::json!({})).to_json().to_string();
            assert_eq!(answer, expected, "{input}");
        }
        assert_ne!(RequestId::Integer(92), RequestId::String("92".into()));
    }

    #[test]
    fn a_message_without_an_id_member_is_a_notification() {
        let parsed = parse(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert!(matches!(parsed, Ok(Message::Notification(_))));
    }

    #[test]
    fn responses_from_the_client_are_recognised() {
        let parsed = parse(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
        assert!(matches!(parsed, Ok(Message::Response(_))));
        let parsed = parse(r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no"}}"#);
        assert!(matches!(parsed, Ok(Message::Response(Response { result: Err(_), .. }))));
    }

    #[test]
    fn malformed_messages() {
        let cases = [
            (
                "{",
                r#"{"error":{"code":-32700,"message":"parse error: the message ends early; expected an object key in double quotes"},"id":null,"jsonrpc":"2.0"}"#,
            ),
            (
                "",
                r#"{"error":{"code":-32700,"message":"parse error: the message ends early; expected a value"},"id":null,"jsonrpc":"2.0"}"#,
            ),
            (
                "[]",
                r#"{"error":{"code":-32600,"message":"batches are not supported; send one message per request"},"id":null,"jsonrpc":"2.0"}"#,
            ),
            ("7", r#"{"error":{"code":-32600,"message":"a message must be a JSON object, not an integer"},"id":null,"jsonrpc":"2.0"}"#),
            (
                r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
                r#"{"error":{"code":-32600,"message":"`id` must be a string or an integer, not null"},"id":null,"jsonrpc":"2.0"}"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
                r#"{"error":{"code":-32600,"message":"`id` must be a string or an integer, not a number"},"id":null,"jsonrpc":"2.0"}"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#,
                r#"{"error":{"code":-32600,"message":"`id` must be a string or an integer, not an array"},"id":null,"jsonrpc":"2.0"}"#,
            ),
            (r#"{"id":4,"method":"ping"}"#, r#"{"error":{"code":-32600,"message":"`jsonrpc` must be \"2.0\""},"id":4,"jsonrpc":"2.0"}"#),
            (
                r#"{"jsonrpc":"1.0","id":"a","method":"ping"}"#,
                r#"{"error":{"code":-32600,"message":"`jsonrpc` must be \"2.0\""},"id":"a","jsonrpc":"2.0"}"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":5,"method":7}"#,
                r#"{"error":{"code":-32600,"message":"`method` must be a string, not an integer"},"id":5,"jsonrpc":"2.0"}"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":6,"method":"ping","params":[1]}"#,
                r#"{"error":{"code":-32600,"message":"`params` must be an object, not an array"},"id":6,"jsonrpc":"2.0"}"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":8}"#,
                r#"{"error":{"code":-32600,"message":"a message needs `method` (request or notification) or `result`/`error` (response)"},"id":8,"jsonrpc":"2.0"}"#,
            ),
        ];
        for (input, expected) in cases {
            let actual: Value = serde_json::from_str(&error_text(input)).unwrap();
            let expected: Value = serde_json::from_str(expected).unwrap();
            assert_eq!(actual, expected, "input: {input}");
        }
    }

    /// Valid JSON the server cannot or
    /// will not read is answered with the id the client sent, exactly.
    #[test]
    fn refused_messages_keep_their_id() {
        let digits = "9".repeat(400);
        let big_id = format!(r#"{{"jsonrpc":"2.0","id":{digits},"method":"ping"}}"#);
        let cases: Vec<(String, String, i64, &str)> = vec![
            (
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"run_job","arguments":{"timeout_s":1e400}}}"#.into(),
                "7".into(),
                -32600,
                "the number `1e400` is outside the range of a 64-bit float",
            ),
            (big_id, digits.clone(), -32600, "is an integer outside the 64-bit range this server keeps ids in"),
            (
                r#"{"jsonrpc":"2.0","id":9223372036854775808,"method":"ping"}"#.into(),
                "9223372036854775808".into(),
                -32600,
                "`id` `9223372036854775808` is an integer outside the 64-bit range",
            ),
            (
                r#"{"jsonrpc":"2.0","id":"a\u0062","method":"x","params":{"image":"evil:1","image":"busybox:1.36"}}"#.into(),
                r#""a\u0062""#.into(),
                -32600,
                "an object holds the key `image` twice",
            ),
            (r#"{"jsonrpc":"2.0","id":3,"method":"ping","method":"tools/call"}"#.into(), "3".into(), -32600, "key `method` twice"),
            ("{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\"} x".into(), "null".into(), -32700, "parse error: expected the end"),
        ];
        for (input, id, code, message) in cases {
            // Not read back with serde_json: a 400-digit id is exactly
            // what it cannot hold.
            let text = error_text(&input);
            assert!(text.contains(&format!(r#""id":{id},"#)), "{text}");
            assert!(text.starts_with(&format!(r#"{{"error":{{"code":{code},"message":""#)), "{text}");
            assert!(text.contains(message), "{text}");
            assert!(text.len() < 1000, "the id is echoed, the message is short: {}", text.len());
        }
    }

    #[test]
    fn the_id_of_a_cut_message() {
        let cases = [
            (r#"{"jsonrpc":"2.0","id":12,"method":"ping","params":{"pad":"xxx"#, Some("12")),
            (r#"{"id":"abc","params":["#, Some(r#""abc""#)),
            (r#"{"params":{"id":1},"id":"#, None),
            (r#"{"id":12"#, None),
            (r#"{"id":1.5,"x":"#, None),
            (r#"{"method":"ping","pad":"xx"#, None),
        ];
        for (prefix, id) in cases {
            assert_eq!(id_in_prefix(prefix).as_deref(), id, "{prefix}");
        }
    }
}
