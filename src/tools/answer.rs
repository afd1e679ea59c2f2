//! When a tool's answer is an error (`isError`), decided in one place for
//! every tool that runs something. The rule, the original server's:
//!
//! - a run that ran, or was tried, is a result whatever became of it
//!   (failed, timed out, ended in `error`, refused by the cluster or a
//!   sandbox): `isError: false`, with `status`, `reason` and `message` in
//!   `structuredContent`;
//! - a call the server refuses before trying anything (bad arguments, an
//!   image or mode not allowed, the caller's limits, a token or sandbox id
//!   that names nothing of the caller's, no backend) is a tool error:
//!   `isError: true` and a text that says what to change;
//! - `execute_code` keeps isolator's shape: `isError: true` whenever the
//!   code did not succeed, its `Execution Failed` text first.

use crate::engine::port::spec::{RunReason, RunStatus};

/// The rule in one sentence, for the run tools' descriptions.
pub const RULE: &str = "isError only when the call is refused; a run that failed or could not start is a result (status, reason, message).";

/// How a tool presents a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `run_job`'s result, alone or inside another answer (`submit_job`
    /// refused, `fetch_job` and `cancel_job` once done, a task's result,
    /// the sandbox tools' refusals).
    RunResult,
    /// `execute_code`'s isolator text.
    Isolator,
}

/// What a call came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Refused before anything was tried.
    Refused,
    /// A run, or a sandbox operation, that was tried: its end.
    Ran { status: RunStatus, reason: Option<RunReason> },
}

/// Whether the answer is an MCP tool error (`isError`).
pub fn is_error(shape: Shape, answer: Answer) -> bool {
    match (shape, answer) {
        (_, Answer::Refused) => true,
        (Shape::RunResult, Answer::Ran { .. }) => false,
        (Shape::Isolator, Answer::Ran { status, .. }) => status != RunStatus::Succeeded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason a run can end with, under every shape: only
    /// execute_code's unsucceeded runs and refusals are errors.
    #[test]
    fn is_error_for_every_reason_and_shape() {
        let statuses = [RunStatus::Succeeded, RunStatus::Failed, RunStatus::TimedOut, RunStatus::Error, RunStatus::Cancelled];
        let reasons = std::iter::once(None).chain(RunReason::ALL.iter().copied().map(Some));
        for reason in reasons {
            for status in statuses {
                let ran = Answer::Ran { status, reason };
                assert!(!is_error(Shape::RunResult, ran), "run_job's result is never an error: {status:?} {reason:?}");
                assert_eq!(is_error(Shape::Isolator, ran), status != RunStatus::Succeeded, "isolator's: {status:?} {reason:?}");
            }
        }
        for shape in [Shape::RunResult, Shape::Isolator] {
            assert!(is_error(shape, Answer::Refused), "{shape:?}: a refused call is an error");
        }
    }
}
