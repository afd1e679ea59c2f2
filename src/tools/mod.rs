//! The MCP tools: names, schemas, argument checking and result shapes.

pub mod images;
pub mod job_args;
pub mod job_result;
