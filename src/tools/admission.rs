//! A caller's limits applied to a run before anything is created: its
//! site, its images, then the counted limits (`callers::Ledger`: runs in
//! flight, CPU-seconds in the last hour). An admitted run is recorded for
//! its caller (`RunSpec::owner`) and counted until it ends; a refused one
//! is a tool error that names the limit and when it frees up.
//!
//! Every run tool (run_job, execute_code, submit_job and their tasks)
//! comes through here once, after its arguments are checked.

use std::sync::Arc;
use std::time::Duration;

use crate::callers::{Caller, Ledger, Ticket};
use crate::engine::port::jobs::OnEnd;
use crate::engine::port::spec::RunSpec;
use crate::metrics;

/// A run admitted for its caller, counted until `end` (or drop).
#[derive(Debug)]
pub struct Admitted {
    ticket: Ticket,
    caller: String,
}

impl Admitted {
    /// The run ended after its command ran for `ran`: charged to the caller.
    pub fn end(self, ran: Duration) {
        let cost = self.ticket.end(ran);
        metrics::caller_cpu_seconds(&self.caller, cost);
    }

    /// For a background run: ended when this process records its outcome.
    pub fn on_end(self) -> OnEnd {
        Box::new(move |outcome| self.end(outcome.duration))
    }
}

/// Admits `spec` for `caller` or says why not; an admitted `spec` is
/// recorded as the caller's.
pub fn admit(
    ledger: &Arc<Ledger>,
    caller: &Caller,
    site: &str,
    spec: &mut RunSpec,
    default_cpu: &crate::quantity::Quantity,
) -> Result<Admitted, String> {
    check_site(caller, site)?;
    caller.check_image(&spec.image).map_err(|message| refused(caller, site, "images", message))?;
    let cores = cores(spec.cpu_limit.as_ref().unwrap_or(default_cpu));
    let ticket = ledger.admit(caller, cores).map_err(|refusal| refused(caller, site, refusal.limit(), refusal.message(&caller.name)))?;
    metrics::caller_run(&caller.name, site, "admitted");
    spec.owner = caller.owner().map(str::to_string);
    Ok(Admitted { ticket, caller: caller.name.clone() })
}

/// Admits a sandbox's opening for `caller`: its site and its image as a
/// run's, and refused while the counted limits would refuse a run (no call
/// could run in it). Nothing is counted here: each call in the sandbox is
/// admitted as a run (`admit`), counted while it runs.
pub fn admit_sandbox(ledger: &Ledger, caller: &Caller, site: &str, image: &str) -> Result<(), String> {
    precheck(ledger, caller, site)?;
    caller.check_image(image).map_err(|message| refused(caller, site, "images", message))
}

/// What can be checked of a run before its image is known: its site and
/// the counted limits. A call in a sandbox is checked so before it looks
/// the sandbox up, so a refused call asks the site nothing; `admit` then
/// admits it as any run once its image is known.
pub fn precheck(ledger: &Ledger, caller: &Caller, site: &str) -> Result<(), String> {
    check_site(caller, site)?;
    ledger.check(caller).map_err(|refusal| refused(caller, site, refusal.limit(), refusal.message(&caller.name)))
}

fn check_site(caller: &Caller, site: &str) -> Result<(), String> {
    caller.check_site(site).map_err(|message| refused(caller, site, "sites", message))
}

/// A refusal by `limit`, counted.
fn refused(caller: &Caller, site: &str, limit: &'static str, message: String) -> String {
    metrics::caller_run(&caller.name, site, limit);
    message
}

/// CPUs of a quantity (`500m` is 0.5).
fn cores(quantity: &crate::quantity::Quantity) -> f64 {
    quantity.nanos() as f64 / 1e9
}

/// What `describe_environment` says of the caller: its name, its limits
/// and what it uses of them now.
pub fn describe(ledger: &Ledger, caller: &Caller) -> serde_json::Value {
    let limits = &caller.limits;
    let (running, cpu_seconds) = ledger.usage(&caller.name);
    serde_json::json!({
        "name": caller.name,
        "limits": {
            "concurrent_runs": limits.concurrent_runs,
            "cpu_seconds_per_hour": limits.cpu_seconds_per_hour,
            "sites": limits.sites,
            "images": limits.images,
            "tools": limits.tools,
        },
        "runs_in_flight": running,
        "cpu_seconds_last_hour": (cpu_seconds * 10.0).round() / 10.0,
        "sees": if caller.scoped { "its own runs" } else { "every run" },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callers::Limits;
    use crate::quantity::{Quantity, Resource};

    fn spec(image: &str, cpu: Option<&str>) -> RunSpec {
        RunSpec {
            image: image.to_string(),
            command: vec!["true".into()],
            files: Vec::new(),
            env: Default::default(),
            cpu_limit: cpu.map(|cpu| Quantity::parse_limit(cpu, Resource::Cpu).unwrap()),
            memory_limit: None,
            timeout: Duration::from_secs(10),
            workdir: crate::sandbox::WORKDIR.to_string(),
            artifacts: Vec::new(),
            clone: None,
            network: crate::network::NetworkMode::None,
            owner: None,
        }
    }

    #[test]
    fn a_run_is_admitted_for_its_caller_or_refused_naming_the_limit() {
        let ledger = Arc::new(Ledger::default());
        let default_cpu = Quantity::parse("1").unwrap();
        let limits = Limits { concurrent_runs: Some(1), images: Some(vec!["busybox:*".into()]), ..Limits::default() };
        let caller = Caller { name: "team-a".into(), limits, scoped: true };
        let mut python = spec("docker.io/library/python:3.12", None);
        let refused = admit(&ledger, &caller, "default", &mut python, &default_cpu).unwrap_err();
        assert!(refused.contains("its limit `images`"), "{refused}");
        assert_eq!(python.owner, None, "a refused run is nobody's");
        let mut busybox = spec("docker.io/library/busybox:1.36", Some("500m"));
        let admitted = admit(&ledger, &caller, "default", &mut busybox, &default_cpu).unwrap();
        assert_eq!(busybox.owner.as_deref(), Some("team-a"));
        let refused = admit(&ledger, &caller, "default", &mut spec("docker.io/library/busybox:1.36", None), &default_cpu).unwrap_err();
        assert!(refused.contains("`concurrent_runs`"), "{refused}");
        admitted.end(Duration::from_secs(4));
        assert_eq!(ledger.usage("team-a"), (0, 2.0), "half a CPU for 4 s");
        let whole = Caller::whole_server("stdio");
        let mut any = spec("docker.io/library/python:3.12", None);
        admit(&ledger, &whole, "default", &mut any, &default_cpu).unwrap();
        assert_eq!(any.owner, None, "one caller: its runs are everyone's, as before callers");
    }
}
