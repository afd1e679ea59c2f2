//! The run engine, backend-neutral: turns a checked `RunSpec` into a
//! sandbox through the port, follows it, lets a pure state machine say how
//! it ended, and returns a `RunOutcome`. Knows no Kubernetes, no Docker and
//! nothing of MCP.
//!
//! A folder per lifecycle, stacked one way (each imports only what is
//! below it; `tests/offline/architecture.rs` checks it):
//! - `port/`: what every lifecycle shares: the traits a backend
//!   implements, the facts it reports, the run's spec and outcome, the
//!   records of sandboxes and of the runs this process knows;
//! - `run/`: one run, start to finish (slots, the decision, the collected
//!   output, the verdict, spans);
//! - `pools/`: warm pools (a pure state machine and its one shell);
//! - `sandboxes/`: open sandboxes and the calls in them;
//! - `background/`: background runs (submit, attach, fetch, cancel, and
//!   idempotency keys);
//! - `reaper`: the clock that ends what outlived its time, over all of them.

pub mod background;
pub mod pools;
pub mod port;
pub mod reaper;
pub mod run;
pub mod sandboxes;
