//! The places a sandbox runs, each behind the engine's port
//! (`engine::backend::Backend`): `kubernetes` (a Job and its pod per run)
//! and `docker` (a container per run on a local Docker Engine).
//! A backend turns the engine's neutral requests into its own API's calls
//! and its own objects back into neutral events; the engine knows none of
//! them, and no backend knows MCP.

pub mod docker;
pub mod kubernetes;

/// The result of one `doctor` check, on either backend: a line for the
/// operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub passed: bool,
    /// Passed, but the operator should act: jobs run, yet a promise of the
    /// security model does not hold (e.g. NetworkPolicy is not enforced).
    pub warning: bool,
    pub text: String,
}

impl Check {
    pub(crate) fn pass(text: impl Into<String>) -> Check {
        Check { passed: true, warning: false, text: text.into() }
    }

    pub(crate) fn fail(text: impl Into<String>) -> Check {
        Check { passed: false, warning: false, text: text.into() }
    }

    pub(crate) fn warn(text: impl Into<String>) -> Check {
        Check { passed: true, warning: true, text: text.into() }
    }

    /// `ok    ...`, `WARN  ...` or `FAIL  ...`, as doctor prints it.
    pub fn line(&self) -> String {
        let verdict = match (self.passed, self.warning) {
            (false, _) => "FAIL",
            (true, true) => "WARN",
            (true, false) => "ok  ",
        };
        format!("{verdict}  {}", self.text)
    }
}
