//! The places a sandbox runs, each behind the engine's port
//! (`engine::backend::Backend`): `kubernetes` (a Job and its pod per run)
//! and `docker` (a container per run on a local Docker Engine).
//! A backend turns the engine's neutral requests into its own API's calls
//! and its own objects back into neutral events; the engine knows none of
//! them, and no backend knows MCP.

pub mod docker;
pub mod kubernetes;
