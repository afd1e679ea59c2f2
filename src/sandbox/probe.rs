//! The lines `runner probe-pids` and `runner probe-connect` print and
//! `doctor` reads back: one line of `key=value` words each, describing the
//! process limit a pod really has, or whether it could open a connection the
//! jobs' NetworkPolicy refuses. Only the format lives here; the measuring is
//! the runner's (`runner::probe`).

/// What one probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PidsProbe {
    /// Threads started before the kernel refused one, or `ceiling`.
    pub threads_started: u64,
    /// True when a thread was refused (EAGAIN) below `ceiling`.
    pub limited: bool,
    /// The container cgroup's own `pids.max`, as written there (`max`, a
    /// number, or `unknown` when unreadable).
    pub own_pids_max: String,
}

/// The probe as the one line `runner probe-pids` prints.
pub fn probe_line(probe: &PidsProbe) -> String {
    format!("threads_started={} limited={} own_pids_max={}", probe.threads_started, probe.limited, probe.own_pids_max)
}

/// The inverse of `probe_line`; `None` for anything else.
pub fn parse_probe_line(line: &str) -> Option<PidsProbe> {
    let mut threads_started = None;
    let mut limited = None;
    let mut own_pids_max = None;
    for word in line.split_whitespace() {
        let (key, value) = word.split_once('=')?;
        match key {
            "threads_started" => threads_started = value.parse().ok(),
            "limited" => limited = value.parse().ok(),
            "own_pids_max" => own_pids_max = Some(value.to_string()),
            _ => {}
        }
    }
    Some(PidsProbe { threads_started: threads_started?, limited: limited?, own_pids_max: own_pids_max? })
}

/// What `runner probe-connect` found: whether a job pod could open a TCP
/// connection to `target` (the API server's Service, which no network mode
/// may reach).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectProbe {
    /// `host:port` tried, or `none` when the pod had no address to try.
    pub target: String,
    /// The first try, as soon as the command started: a CNI that applies
    /// policies only once it has seen the pod (kube-router) lets it through.
    pub connected_at_start: bool,
    /// The second try, `SETTLE` later: what the policy says.
    pub connected: bool,
    /// Why it did not connect, one word (`ConnectionRefused`, `TimedOut`,
    /// ...), or `none`.
    pub error: String,
}

/// How the runner's message starts when the pod's network policy was not
/// seen in force in time (`runner init --await-fence-ms`); the backend
/// reads it back as `NetworkPolicyNotEnforced`.
pub const FENCE_FAILURE: &str = "the pod's network policy was not in force";

/// The probe as the one line `runner probe-connect` prints.
pub fn connect_line(probe: &ConnectProbe) -> String {
    format!(
        "connect_target={} connected_at_start={} connected={} connect_error={}",
        probe.target, probe.connected_at_start, probe.connected, probe.error
    )
}

/// The inverse of `connect_line`; `None` for anything else.
pub fn parse_connect_line(line: &str) -> Option<ConnectProbe> {
    let mut target = None;
    let mut connected_at_start = None;
    let mut connected = None;
    let mut error = None;
    for word in line.split_whitespace() {
        let (key, value) = word.split_once('=')?;
        match key {
            "connect_target" => target = Some(value.to_string()),
            "connected_at_start" => connected_at_start = value.parse().ok(),
            "connected" => connected = value.parse().ok(),
            "connect_error" => error = Some(value.to_string()),
            _ => {}
        }
    }
    Some(ConnectProbe { target: target?, connected_at_start: connected_at_start?, connected: connected?, error: error? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connect_line_round_trips() {
        let probe =
            ConnectProbe { target: "10.96.0.1:443".into(), connected_at_start: true, connected: false, error: "ConnectionRefused".into() };
        assert_eq!(
            connect_line(&probe),
            "connect_target=10.96.0.1:443 connected_at_start=true connected=false connect_error=ConnectionRefused"
        );
        assert_eq!(parse_connect_line(&connect_line(&probe)), Some(probe));
        assert_eq!(parse_connect_line("threads_started=3 limited=true own_pids_max=max"), None);
    }

    #[test]
    fn the_probe_line_round_trips() {
        let probe = PidsProbe { threads_started: 1019, limited: true, own_pids_max: "max".into() };
        assert_eq!(probe_line(&probe), "threads_started=1019 limited=true own_pids_max=max");
        assert_eq!(parse_probe_line(&probe_line(&probe)), Some(probe));
        assert_eq!(parse_probe_line("mcp-k8s-ephemeral-job 0.1.0"), None);
        assert_eq!(parse_probe_line("threads_started=3"), None);
    }
}
