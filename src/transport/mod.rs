//! Transports: bytes in, bytes out. stdio, Streamable HTTP and legacy SSE all
//! hand messages to `protocol` and never interpret them beyond framing.

pub mod http;
pub mod stdio;
