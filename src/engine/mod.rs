//! The job engine: turns a checked `RunSpec` into a Job, follows it and
//! returns a `RunOutcome`. Knows Kubernetes through `kube`, nothing of MCP.

pub mod background;
pub mod collect;
pub mod decide;
pub mod jobs;
pub mod outcome;
pub mod run;
pub mod slots;
pub mod spec;
pub mod verdict;
