//! mcp-k8s-ephemeral-job: an MCP server that runs a command in a throwaway
//! Kubernetes pod and returns its exit code, stdout, stderr, files and, when
//! something goes wrong, the reason.
//!
//! Data flows one way, and imports point the same way:
//! `transport` (bytes in, bytes out) → `protocol` (JSON-RPC and the MCP
//! lifecycle) → `tools` (schemas, arguments → `RunSpec`, outcomes → results)
//! → `engine` (runs, background jobs, manifests) → `kube` (the REST client).
//! `runner` is the in-pod half: the same binary, started as the job's
//! entrypoint, knows nothing of MCP or of the API server. `sandbox` is the
//! contract between the two (frames, the runner's command lines, the inputs
//! manifest, shared defaults): the engine and the runner import it, never
//! each other. `cancel` is the stop flag the protocol sets and the engine
//! reads.
//! `languages` holds `execute_code`'s language profiles; `pools` the
//! operator's warm pools; `callers` who may call and each caller's limits.
//! `config` turns the environment and flags into a checked `Config`; `echo`
//! shortens caller input quoted in errors; `log`
//! writes metadata-only JSON lines to stderr; `audit` keeps the trail of
//! who ran what and how it ended; `metrics` keeps the counters
//! `/metrics` serves; `supervise` starts the server's threads and sees
//! their panics (logged, counted, and for an essential thread, a failing
//! `/readyz`); `doctor` checks the cluster set-up against the
//! configuration.

// Unsafe code only where a system call std lacks needs it: each module
// that holds some says why with its `allow`, and every block says why it
// is sound (`SAFETY:`).
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod audit;
pub mod backend;
pub mod callers;
pub mod cancel;
pub mod config;
pub mod docker;
pub mod echo;
pub mod engine;
pub mod http1;
pub mod images;
pub mod json;
pub mod kube;
pub mod languages;
pub mod log;
pub mod metrics;
pub mod network;
pub mod outputs;
pub mod pools;
pub mod protocol;
pub mod quantity;
pub mod runner;
pub mod sandbox;
pub mod settings_file;
pub mod supervise;
pub mod time;
pub mod tools;
pub mod trace;
pub mod transport;
pub mod wiring;
pub mod yaml;
