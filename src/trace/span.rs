//! A finished span and its OTLP/JSON form (the OTLP/HTTP JSON encoding:
//! hex ids, nanoseconds as decimal strings, typed attribute values). Pure:
//! the exporter sends what `request_body` makes.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::context::{SpanContext, hex};

/// What a span stands for, as OTLP numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Work inside the server (a run's phase).
    Internal = 1,
    /// The server's side of a request (an MCP request).
    Server = 2,
}

/// An attribute's value: only what the spans here carry.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Text(String),
    Int(i64),
    Bool(bool),
}

/// A finished span.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub context: SpanContext,
    pub parent: Option<[u8; 8]>,
    pub name: String,
    pub kind: Kind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<(&'static str, Attr)>,
    /// Set when the work failed: the status is then an error with this
    /// description (`error.type` goes in the attributes).
    pub error: Option<String>,
}

/// The body of one OTLP/HTTP `POST /v1/traces` (JSON) carrying `spans`.
pub fn request_body(spans: &[Span], service_version: &str) -> Value {
    json!({"resourceSpans": [{
        "resource": {"attributes": [
            attribute("service.name", &Attr::Text("mcp-k8s-ephemeral-job".into())),
            attribute("service.version", &Attr::Text(service_version.into())),
        ]},
        "scopeSpans": [{
            "scope": {"name": "mcp-k8s-ephemeral-job", "version": service_version},
            "spans": spans.iter().map(span_json).collect::<Vec<_>>(),
        }],
    }]})
}

fn span_json(span: &Span) -> Value {
    let mut value = json!({
        "traceId": hex(&span.context.trace_id),
        "spanId": hex(&span.context.span_id),
        "name": span.name,
        "kind": span.kind as i32,
        "startTimeUnixNano": nanos(span.start).to_string(),
        "endTimeUnixNano": nanos(span.end.max(span.start)).to_string(),
        "attributes": span.attributes.iter().map(|(key, attr)| attribute(key, attr)).collect::<Vec<_>>(),
        "status": match &span.error {
            Some(message) => json!({"code": 2, "message": message}),
            None => json!({"code": 0}),
        },
    });
    if let Some(parent) = span.parent {
        value["parentSpanId"] = json!(hex(&parent));
    }
    value
}

fn attribute(key: &str, attr: &Attr) -> Value {
    let value = match attr {
        Attr::Text(text) => json!({"stringValue": text}),
        Attr::Int(number) => json!({"intValue": number.to_string()}),
        Attr::Bool(flag) => json!({"boolValue": flag}),
    };
    json!({"key": key, "value": value})
}

fn nanos(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| since.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_span_is_written_as_otlp_json() {
        let context = super::super::context::parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let start = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        let span = Span {
            context,
            parent: Some([1, 2, 3, 4, 5, 6, 7, 8]),
            name: "tools/call run_job".into(),
            kind: Kind::Server,
            start,
            end: start + Duration::from_millis(5),
            attributes: vec![("mcp.method.name", Attr::Text("tools/call".into())), ("exit", Attr::Int(3)), ("warm", Attr::Bool(false))],
            error: Some("tool_error".into()),
        };
        let body = request_body(&[span], "0.1.0");
        let written = &body["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(
            *written,
            json!({
                "traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "00f067aa0ba902b7", "parentSpanId": "0102030405060708",
                "name": "tools/call run_job", "kind": 2,
                "startTimeUnixNano": "1700000000123456789", "endTimeUnixNano": "1700000000128456789",
                "attributes": [
                    {"key": "mcp.method.name", "value": {"stringValue": "tools/call"}},
                    {"key": "exit", "value": {"intValue": "3"}},
                    {"key": "warm", "value": {"boolValue": false}},
                ],
                "status": {"code": 2, "message": "tool_error"},
            })
        );
        assert_eq!(body["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"], "mcp-k8s-ephemeral-job");
    }
}
