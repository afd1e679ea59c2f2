//! The run engine, backend-neutral: turns a checked `RunSpec` into a
//! sandbox through the port in `backend`, follows it, lets `decide` (a pure
//! state machine) say how it ended, and returns a `RunOutcome`. Warm pools
//! are `pool` (pure) and `pool_manager` (its one shell, through a second
//! port a backend implements for its pool sandboxes). Knows no
//! Kubernetes, no Docker and nothing of MCP.

pub mod backend;
pub mod background;
pub mod collect;
pub mod decide;
pub mod facts;
pub mod idempotency;
pub mod jobs;
pub mod outcome;
pub mod outputs;
pub mod pool;
pub mod pool_manager;
pub mod reaper;
pub mod run;
pub mod sandbox_call;
pub mod sandboxes;
pub mod slots;
pub mod spans;
pub mod spec;
pub mod verdict;
