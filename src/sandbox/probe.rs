//! The lines `runner probe-pids`, `runner probe-connect` and `runner
//! probe-reach` print and `doctor` reads back: one line of `key=value`
//! words each, describing the process limit a pod really has, or whether it
//! could open a connection the jobs' NetworkPolicy refuses. Only the format
//! lives here; the measuring is the runner's (`runner::probe`).

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
    let words = Words::of(line)?;
    Some(PidsProbe {
        threads_started: words.get("threads_started")?.parse().ok()?,
        limited: words.get("limited")?.parse().ok()?,
        own_pids_max: words.get("own_pids_max")?.to_string(),
    })
}

/// A probe line's `key=value` words; `None` when a word has no `=`.
struct Words<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Words<'a> {
    fn of(line: &'a str) -> Option<Words<'a>> {
        line.split_whitespace().map(|word| word.split_once('=')).collect::<Option<Vec<_>>>().map(Words)
    }

    /// The value of `key`'s last word.
    fn get(&self, key: &str) -> Option<&'a str> {
        self.0.iter().rev().find(|(word_key, _)| *word_key == key).map(|(_, value)| *value)
    }
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
    let words = Words::of(line)?;
    Some(ConnectProbe {
        target: words.get("connect_target")?.to_string(),
        connected_at_start: words.get("connected_at_start")?.parse().ok()?,
        connected: words.get("connected")?.parse().ok()?,
        error: words.get("connect_error")?.to_string(),
    })
}

/// What `runner probe-reach` found for one address: whether a pod in
/// network mode `open` could open a TCP connection to it (the API server's
/// endpoints, the nodes' kubelets, a warm pool pod's runner port: none of
/// which `open` may reach).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReachProbe {
    /// `ip:port` tried.
    pub target: String,
    pub reached: bool,
    /// Why it did not connect, one word (`ConnectionRefused`, `TimedOut`,
    /// ...), or `none`.
    pub error: String,
}

/// One address's line of `runner probe-reach`.
pub fn reach_line(probe: &ReachProbe) -> String {
    format!("reach_target={} reached={} reach_error={}", probe.target, probe.reached, probe.error)
}

/// The inverse of `reach_line`; `None` for anything else.
pub fn parse_reach_line(line: &str) -> Option<ReachProbe> {
    let words = Words::of(line)?;
    Some(ReachProbe {
        target: words.get("reach_target")?.to_string(),
        reached: words.get("reached")?.parse().ok()?,
        error: words.get("reach_error")?.to_string(),
    })
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
    fn the_reach_line_round_trips() {
        let probe = ReachProbe { target: "192.0.2.2:6443".into(), reached: true, error: "none".into() };
        assert_eq!(reach_line(&probe), "reach_target=192.0.2.2:6443 reached=true reach_error=none");
        assert_eq!(parse_reach_line(&reach_line(&probe)), Some(probe));
        assert_eq!(parse_reach_line("connect_target=10.96.0.1:443 connected_at_start=true connected=false connect_error=x"), None);
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
