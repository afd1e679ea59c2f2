//! Whether this server can run a job at all: at start (`start_verdict`:
//! `serve` stops, exit 2, when no site can, unless MCP_K8S_LAZY_BACKEND=1)
//! and for `/readyz` (`check`: 503 while no site can, saying why).
//!
//! A site can run a job when its backend is connected and answers the same
//! cheap ask `describe_environment` makes (it lists its runs: this reaches
//! the API server or daemon with the server's own credentials and the
//! namespace's permission). The asks go through `site_health`, so `/readyz`
//! shares them with `describe_environment`: one ask per site at a time,
//! its answer kept a second, never a thread per probe. The verdicts are
//! pure functions over the sites' answers.
//!
//! Knows the sites' engines and their health asks; nothing of HTTP.

use std::time::{Duration, Instant};

use super::Ctx;
use super::site_health::Answer;
use crate::engine;
use crate::engine::port::ErrorKind;

/// How long `/readyz` waits for an ask under way before it answers with
/// the last answer known: well inside a kubelet probe's default timeout
/// (1 s).
const READYZ_WAIT: Duration = Duration::from_millis(500);

/// How long `serve` waits at start for the sites to answer before it
/// judges them: long enough for a slow API's first answer, short enough
/// that a start against one that never answers says so soon.
pub const START_WAIT: Duration = Duration::from_secs(15);

/// The ask that says whether a site can run a job: it lists the site's
/// runs. A failure says what the operator can do about it.
pub fn ask(engine: &engine::run::Ctx) -> impl FnOnce() -> Answer + Send + 'static {
    let engine = engine.clone();
    move || {
        engine.backend.list().map(|_| ()).map_err(|error| match operator_fix(error.kind) {
            Some(fix) => format!("{error}; {fix}"),
            None => error.to_string(),
        })
    }
}

/// What the operator can do about a site that fails the ask, by kind,
/// when the backend's own words do not say it: both clients name the
/// server or socket they could not reach and what to check, and the
/// Kubernetes client which credentials a 401 refused, but a 403 on
/// listing Jobs is the Role's.
fn operator_fix(kind: ErrorKind) -> Option<&'static str> {
    match kind {
        // Busy work ends on its own.
        ErrorKind::Transient | ErrorKind::Busy => None,
        ErrorKind::Denied => Some(
            "the server's credentials were refused or may not list Jobs there: renew them, or grant the Role (deploy/role.yaml); `doctor` names what is missing",
        ),
        ErrorKind::NotFound | ErrorKind::Refused => Some("`doctor` checks the set-up and names what is wrong"),
    }
}

/// One site as the verdicts see it: its name and whether it can run a
/// job (`Err`: why not).
pub type SiteAnswer = (String, Answer);

/// What `serve` does after asking every site at start.
#[derive(Debug, PartialEq, Eq)]
pub enum StartVerdict {
    /// Every site can run jobs.
    Serve,
    /// Some sites cannot (their names and why): logged as warnings, and
    /// only their calls are refused; the others serve.
    ServeWithout(Vec<SiteAnswer>),
    /// No site can, and MCP_K8S_LAZY_BACKEND=1: serve anyway (logged),
    /// `/readyz` failing until one can.
    ServeLazily(String),
    /// No site can: stop (exit 2) with this one line.
    Refuse(String),
}

/// The start's verdict on the sites' answers. `named`: the sites come from
/// MCP_K8S_SITES (their names are said); `lazy`: MCP_K8S_LAZY_BACKEND.
pub fn start_verdict(sites: &[SiteAnswer], named: bool, lazy: bool) -> StartVerdict {
    if sites.iter().all(|(_, answer)| answer.is_ok()) {
        return StartVerdict::Serve;
    }
    if sites.iter().any(|(_, answer)| answer.is_ok()) {
        return StartVerdict::ServeWithout(sites.iter().filter(|(_, answer)| answer.is_err()).cloned().collect());
    }
    let why = nothing_runs(sites, named);
    if lazy {
        StartVerdict::ServeLazily(why)
    } else {
        StartVerdict::Refuse(format!(
            "{why}; fix that, or set MCP_K8S_LAZY_BACKEND=1 to serve anyway (/readyz fails until a site can run jobs)"
        ))
    }
}

/// `/readyz`'s verdict: `Ok` while any site can run a job, else why none
/// can (every site's reason).
fn ready_verdict(sites: &[SiteAnswer], named: bool) -> Result<(), String> {
    match sites.iter().any(|(_, answer)| answer.is_ok()) {
        true => Ok(()),
        false => Err(nothing_runs(sites, named)),
    }
}

/// Whether any of `ctx`'s sites can run a job now, for `/readyz`: each
/// site's shared ask (started for every site before any is waited for, so
/// that one that stalls holds no other), within `READYZ_WAIT`.
pub fn check(ctx: &Ctx) -> Result<(), String> {
    let answers = site_answers(ctx, Instant::now() + READYZ_WAIT);
    ready_verdict(&answers, ctx.named_sites)
}

/// Every site's answer by `deadline` (the last known one for a site still
/// being asked then).
pub fn site_answers(ctx: &Ctx, deadline: Instant) -> Vec<SiteAnswer> {
    for (site, health) in ctx.sites.iter().zip(&ctx.site_health) {
        if let Ok(engine) = &site.engine {
            health.start(ask(engine));
        }
    }
    ctx.sites
        .iter()
        .zip(&ctx.site_health)
        .map(|(site, health)| {
            let answer = match &site.engine {
                Ok(engine) => health.latest_by(deadline, ask(engine)),
                Err(why) => Err(why.clone()),
            };
            (site.name.clone(), answer)
        })
        .collect()
}

/// One line: why no site can run a job.
fn nothing_runs(sites: &[SiteAnswer], named: bool) -> String {
    let reasons: Vec<String> = sites
        .iter()
        .filter_map(|(name, answer)| answer.as_ref().err().map(|why| (name, why)))
        .map(|(name, why)| if named { format!("site `{name}`: {}", one_line(why)) } else { one_line(why) })
        .collect();
    match named {
        true => format!("no site can run a job: {}", reasons.join("; ")),
        false => format!("no backend can run a job: {}", reasons.join("; ")),
    }
}

/// A reason on one line: messages of other layers may carry a newline
/// (a daemon's answer, an exec plugin's stderr).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(name: &str, answer: Result<(), &str>) -> SiteAnswer {
        (name.to_string(), answer.map_err(str::to_string))
    }

    #[test]
    fn what_the_start_does() {
        let up = |name| site(name, Ok(()));
        let down = |name, why| site(name, Err(why));
        let lazy_hint = "; fix that, or set MCP_K8S_LAZY_BACKEND=1 to serve anyway (/readyz fails until a site can run jobs)";
        let cases: Vec<(&str, Vec<SiteAnswer>, bool, bool, StartVerdict)> = vec![
            ("the one site answers", vec![up("default")], false, false, StartVerdict::Serve),
            ("every site answers", vec![up("eu"), up("us")], true, false, StartVerdict::Serve),
            (
                "one site down beside a healthy one is a warning naming it",
                vec![up("eu"), down("us", "refused")],
                true,
                false,
                StartVerdict::ServeWithout(vec![down("us", "refused")]),
            ),
            (
                "the default site down beside a healthy one",
                vec![down("eu", "gone"), up("us")],
                true,
                true,
                StartVerdict::ServeWithout(vec![down("eu", "gone")]),
            ),
            (
                "no backend at all stops the start",
                vec![down("default", "no cluster credentials (x) and no Docker daemon (y)")],
                false,
                false,
                StartVerdict::Refuse(format!("no backend can run a job: no cluster credentials (x) and no Docker daemon (y){lazy_hint}")),
            ),
            (
                "every named site down names each",
                vec![down("eu", "refused"), down("us", "401")],
                true,
                false,
                StartVerdict::Refuse(format!("no site can run a job: site `eu`: refused; site `us`: 401{lazy_hint}")),
            ),
            (
                "lazy serves anyway",
                vec![down("default", "no daemon")],
                false,
                true,
                StartVerdict::ServeLazily("no backend can run a job: no daemon".to_string()),
            ),
            (
                "a reason over several lines is said on one",
                vec![down("default", "plugin said:\n  expired\n")],
                false,
                true,
                StartVerdict::ServeLazily("no backend can run a job: plugin said: expired".to_string()),
            ),
        ];
        for (case, sites, named, lazy, expected) in cases {
            assert_eq!(start_verdict(&sites, named, lazy), expected, "{case}");
        }
    }

    #[test]
    fn when_the_server_is_ready() {
        /// (case, the sites' answers, named, the verdict)
        type Case<'a> = (&'a str, Vec<SiteAnswer>, bool, Result<(), &'a str>);
        let cases: Vec<Case> = vec![
            ("the one site answers", vec![site("default", Ok(()))], false, Ok(())),
            ("one of two answers", vec![site("eu", Err("refused")), site("us", Ok(()))], true, Ok(())),
            (
                "the one site's API refuses",
                vec![site("default", Err("could not list: connection refused"))],
                false,
                Err("no backend can run a job: could not list: connection refused"),
            ),
            (
                "no site answers",
                vec![site("eu", Err("refused")), site("us", Err("no answer in time"))],
                true,
                Err("no site can run a job: site `eu`: refused; site `us`: no answer in time"),
            ),
        ];
        for (case, sites, named, expected) in cases {
            assert_eq!(ready_verdict(&sites, named), expected.map_err(str::to_string), "{case}");
        }
    }

    #[test]
    fn a_fix_is_added_where_the_backend_does_not_say_one() {
        assert_eq!(operator_fix(ErrorKind::Transient), None, "the clients name the address and what to check");
        assert!(operator_fix(ErrorKind::Denied).is_some_and(|fix| fix.contains("deploy/role.yaml")));
        assert!(operator_fix(ErrorKind::Refused).is_some_and(|fix| fix.contains("doctor")));
    }
}
