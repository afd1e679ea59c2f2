//! JSON-RPC 2.0 and the MCP lifecycle, independent of any transport.
