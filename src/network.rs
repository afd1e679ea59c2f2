//! A run's network mode: `none`, `restricted` or `open`, the
//! words of the `network` argument, the settings and the pod label
//! `mcp-k8s-ephemeral-job/network`. A leaf: `config` parses the operator's
//! list into it, `tools` picks one per call, each backend enforces it its
//! own way (a pod label that NetworkPolicies select; a Docker network).
//!
//! Knows only the three names; nothing of what enforces them.

/// What a run's sandbox may reach. Every mode has no ingress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NetworkMode {
    /// No egress at all, DNS included.
    None,
    /// The operator's egress allowlist only.
    Restricted,
    /// Egress anywhere (what the original did).
    Open,
}

impl NetworkMode {
    /// Every mode, in the order lists of them are written.
    pub const ALL: [NetworkMode; 3] = [NetworkMode::None, NetworkMode::Restricted, NetworkMode::Open];

    /// The one name of a mode: in arguments, settings, labels and results.
    pub fn name(self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Restricted => "restricted",
            NetworkMode::Open => "open",
        }
    }

    pub fn from_name(text: &str) -> Option<NetworkMode> {
        NetworkMode::ALL.into_iter().find(|mode| mode.name() == text)
    }
}

/// Which network modes wait for the fence (MCP_K8S_AWAIT_NETWORK_POLICY).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceModes {
    /// `0`: no run waits.
    Never,
    /// `auto`, the default: `none` and `restricted`, whose policies never
    /// admit the API server's Service (the address the wait tries), so a
    /// wait can only fail where the mode's promise is false.
    Closed,
    /// `1`: every mode, `open` too (it needs the API server in `open`'s
    /// `except`, as deploy/ has it).
    All,
}

/// `none, restricted, open` (or a part of it), for messages.
pub fn names(modes: &[NetworkMode]) -> String {
    modes.iter().map(|mode| mode.name()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_nothing_else_parses() {
        for mode in NetworkMode::ALL {
            assert_eq!(NetworkMode::from_name(mode.name()), Some(mode));
        }
        for other in ["", "None", "bridge", "host", " open"] {
            assert_eq!(NetworkMode::from_name(other), None, "{other:?}");
        }
        assert_eq!(names(&NetworkMode::ALL), "none, restricted, open");
    }
}
