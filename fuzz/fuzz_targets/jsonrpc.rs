//! Fuzz target: one line of text → `protocol::jsonrpc::parse`, the JSON-RPC
//! message reader both transports call. Checks that it never panics, that
//! whatever it returns can be written back as JSON, and that a request's id
//! survives the trip into an answer and back; a refusal writes back as one
//! line holding a JSON-RPC error object (its id is the caller's raw text,
//! so a 400-digit id is echoed as sent, which neither serde_json nor the
//! pre-scan reads back).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_k8s_ephemeral_job::protocol::jsonrpc::{self, Message, RequestId};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match jsonrpc::parse(text) {
        Ok(Message::Request(request)) => {
            assert_eq!(RequestId::from_json(&request.id.to_json()).as_ref(), Some(&request.id));
            let _ = jsonrpc::Response::ok(request.id, serde_json::Value::Null).to_json().to_string();
        }
        Ok(Message::Notification(notification)) => {
            let _ = notification.to_json().to_string();
        }
        Ok(Message::Response(response)) => {
            let _ = response.to_json().to_string();
        }
        Err(rejection) => {
            let text = rejection.to_text();
            assert!(text.starts_with("{\"error\":{") && text.ends_with('}') && !text.contains('\n'), "a refusal is one error line: {text}");
        }
    }
});
