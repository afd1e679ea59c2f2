//! JSON-RPC 2.0 framing after lsp-server: the `Message` model, `RequestId`
//! (keeps `92` and `"92"` apart), `ErrorCode`, parsing one message from text
//! and writing one back. Knows nothing of MCP methods or sessions.

use std::fmt;

use serde_json::{Map, Value};

use crate::tools::json_kind;

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
}

impl ErrorCode {
    pub fn code(self) -> i64 {
        match self {
            ErrorCode::ParseError => -32700,
            ErrorCode::InvalidRequest => -32600,
            ErrorCode::MethodNotFound => -32601,
            ErrorCode::InvalidParams => -32602,
            ErrorCode::InternalError => -32603,
        }
    }

    fn from_code(code: i64) -> Option<ErrorCode> {
        [ErrorCode::ParseError, ErrorCode::InvalidRequest, ErrorCode::MethodNotFound, ErrorCode::InvalidParams, ErrorCode::InternalError]
            .into_iter()
            .find(|error_code| error_code.code() == code)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ResponseError {
    pub code: ErrorCode,
    pub message: String,
}

impl ResponseError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ResponseError {
        ResponseError { code, message: message.into() }
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
    /// (issue 12, finding 15).
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
        crate::tools::exact_text(&write).unwrap_or_else(|| self.to_json().to_string())
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

/// Reads one JSON-RPC message. On failure returns the error response to
/// send, carrying the request's id when one could be read.
pub fn parse(text: &str) -> Result<Message, Response> {
    let value: Value =
        serde_json::from_str(text).map_err(|error| Response::error(None, ErrorCode::ParseError, format!("parse error: {error}")))?;
    from_value(value)
}

fn from_value(value: Value) -> Result<Message, Response> {
    let object = match value {
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
    match object.get("method") {
        Some(Value::String(method)) => {
            let params = read_params(&object, id.clone())?;
            let method = method.clone();
            Ok(match id {
                Some(id) => Message::Request(Request { id, method, params }),
                None => Message::Notification(Notification { method, params }),
            })
        }
        Some(other) => Err(invalid(id, format!("`method` must be a string, not {}", json_kind(other)))),
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

fn read_params(object: &Map<String, Value>, id: Option<RequestId>) -> Result<Map<String, Value>, Response> {
    match object.get("params") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(params)) => Ok(params.clone()),
        Some(other) => Err(invalid(id, format!("`params` must be an object, not {}", json_kind(other)))),
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
            Err(response) => response.to_json().to_string(),
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
                r#"{"error":{"code":-32700,"message":"parse error: EOF while parsing an object at line 1 column 1"},"id":null,"jsonrpc":"2.0"}"#,
            ),
            (
                "",
                r#"{"error":{"code":-32700,"message":"parse error: EOF while parsing a value at line 1 column 0"},"id":null,"jsonrpc":"2.0"}"#,
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
}
