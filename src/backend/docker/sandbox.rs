//! Open sandboxes on Docker (`engine::sandboxes::rules::SandboxStore`): the
//! sandbox is a run's container whose runner takes call after call on its
//! stdin (`spec::session_container`), its record in its labels. Labels
//! never change, so what changes is containers of their own, created and
//! never started, as a background run's marks are (`record`):
//!
//! - `mcp-sandbox-call-<name>` (role `sandbox-call`): the call that runs.
//!   Docker refuses a second container of one name, so whoever creates it
//!   has the sandbox: the compare-and-set. A stale one (its server died
//!   mid-call) is removed by its id, then created again, by one winner.
//! - `mcp-sandbox-used-<name>-<ms>` (role `sandbox-used`): when a call
//!   ended; the newest counts (the next is made before the older go, so a
//!   look never finds none between the two).
//!
//! A call is one attach: the line written to stdin, the output read back
//! on the same connection. Every container carries the sandbox's name
//! (`LABEL_SANDBOX`), so one listing shows a sandbox whole and closing it
//! removes them all.

use std::time::Duration;

use crate::backend::docker::{Docker, spec};
use crate::docker::Filters;
use crate::docker::objects::ContainerSummary;
use crate::engine::port::sandbox_record::{self, CallMark, Record, Seen};
use crate::engine::port::spec::{RunReason, RunSpec};
use crate::engine::port::{self, Abort, Delivered, Output, Refused, SandboxStore};
use crate::engine::sandboxes::rules;
use crate::log;
use crate::metrics;
use crate::sandbox::assignment::{Assignment, KEY_BYTES, Key};
use crate::sandbox::frame::Tag;
use crate::sandbox::session;

/// Stdin carries no key (see `pool::STDIN_KEY`): only a Docker API client
/// can write to it, and such a client could `exec` in the sandbox anyway.
const STDIN_KEY: Key = Key::from_bytes([0; KEY_BYTES]);

fn call_mark_name(name: &str) -> String {
    format!("mcp-sandbox-call-{name}")
}

fn used_mark_name(name: &str, at_ms: u64) -> String {
    format!("mcp-sandbox-used-{name}-{at_ms}")
}

/// One sandbox's containers, sorted from a listing.
#[derive(Default)]
struct Containers {
    sandbox: Option<ContainerSummary>,
    call: Option<ContainerSummary>,
    used: Vec<ContainerSummary>,
}

impl Containers {
    fn seen(&self) -> Option<Seen> {
        let sandbox = self.sandbox.as_ref()?;
        let record = sandbox_record::decode_record(sandbox.labels.get(spec::LABEL_SANDBOX_RECORD)?)?;
        let call_mark = self.call.as_ref();
        let last_used_ms = self.used.iter().filter_map(|used| used.labels.get(spec::LABEL_SANDBOX_USED_MS)?.parse::<u64>().ok()).max();
        Some(Seen {
            call: call_mark.and_then(|mark| sandbox_record::decode_call(mark.labels.get(spec::LABEL_SANDBOX_CALL)?)),
            version: call_mark.map(|mark| mark.id.clone()).unwrap_or_default(),
            alive: matches!(sandbox.state.as_str(), "running" | "created" | "restarting"),
            last_used_ms,
            record,
        })
    }
}

/// Every sandbox container by sandbox name (all of them with `name: None`).
fn grouped(docker: &Docker, name: Option<&str>) -> Result<std::collections::BTreeMap<String, Containers>, crate::docker::Error> {
    let label = match name {
        Some(name) => format!("{}={name}", spec::LABEL_SANDBOX),
        None => spec::LABEL_SANDBOX.to_string(),
    };
    let filters = Filters { labels: vec![format!("{}={}", spec::LABEL_MANAGED_BY, spec::MANAGED_BY), label] };
    let mut groups: std::collections::BTreeMap<String, Containers> = Default::default();
    for container in docker.client.container_list(&filters)? {
        let Some(name) = container.labels.get(spec::LABEL_SANDBOX).cloned() else { continue };
        let group = groups.entry(name).or_default();
        match container.labels.get(spec::LABEL_ROLE).map(String::as_str) {
            Some(spec::ROLE_RUN) => group.sandbox = Some(container),
            Some(spec::ROLE_SANDBOX_CALL) => group.call = Some(container),
            Some(spec::ROLE_SANDBOX_USED) => group.used.push(container),
            _ => {}
        }
    }
    Ok(groups)
}

fn api_error(action: &'static str, error: &crate::docker::Error) -> port::Error {
    super::api_error(action, error)
}

/// The input of a call's attach failing: the connection to the daemon
/// broke, which another try may not meet.
fn attach_error(action: &'static str, error: &dyn std::fmt::Display) -> port::Error {
    port::Error { what: action, kind: port::ErrorKind::Transient, message: error.to_string() }
}

impl Docker {
    /// A never-started mark of the sandbox: its image (the daemon has it),
    /// its name and expiry (the sandbox's), and `extra`.
    fn mark(&self, record: &Record, role: &str, extra: (&str, String)) -> crate::docker::objects::ContainerSpec {
        let name = rules::public_name(&record.id);
        let expires_at = std::time::UNIX_EPOCH + Duration::from_millis(record.expires_at_ms) + crate::engine::run::EXPIRY_SLACK;
        let labels = std::collections::BTreeMap::from([
            (spec::LABEL_MANAGED_BY.to_string(), spec::MANAGED_BY.to_string()),
            (spec::LABEL_RUN_ID.to_string(), name.clone()),
            (spec::LABEL_SANDBOX.to_string(), name),
            (spec::LABEL_EXPIRES_AT.to_string(), log::rfc3339_utc(expires_at)),
            (spec::LABEL_ROLE.to_string(), role.to_string()),
            (extra.0.to_string(), extra.1),
        ]);
        super::record::never_started(&record.image, labels)
    }
}

/// Why `open_sandbox` is refused on an engine that ends a container's stdin
/// with its first attach (`spec::Options::stdin_across_attaches`).
pub const NO_SANDBOXES_ON_THIS_ENGINE: &str = "open sandboxes are not available on this server's engine (Podman): it ends a container's \
     stdin with the first attach, and a sandbox takes each call on its stdin, so it would answer one call and end. \
     Use run_job, submit_job or execute_code here (each call is a fresh container), or ask the operator for a site on \
     dockerd or Kubernetes";

impl SandboxStore for Docker {
    fn open_sandbox(&self, name: &str, spec: &RunSpec, record: &Record) -> Result<(), Refused> {
        if !self.options.stdin_across_attaches {
            return Err(Refused { reason: RunReason::Rejected, message: NO_SANDBOXES_ON_THIS_ENGINE.to_string() });
        }
        let container = spec::container_name(name);
        self.ensure_image(&spec.image)?;
        self.ensure_network(spec.network, &spec.image)?;
        let idle = rules::runner_idle_bound(record);
        let body = spec::session_container(
            spec,
            &self.policy,
            &self.options,
            name,
            &sandbox_record::encode_record(record),
            idle,
            record.expires_at_ms,
        );
        let refused = |what: &str, error: crate::docker::Error| {
            metrics::api_error("create_sandbox");
            Refused { reason: RunReason::ApiError, message: format!("the sandbox's container could not be {what}: {error}") }
        };
        self.client.container_create(&container, &body).map_err(|error| refused("created", error))?;
        let started = (|| {
            if spec::workdir_is_volume(spec, &self.options) {
                let root = spec::inputs_archive(spec, self.policy.run_as_user)
                    .map_err(|why| Refused { reason: RunReason::InputFailed, message: why })?;
                self.client.container_put_archive(&container, &spec.workdir, &root).map_err(|error| refused("prepared", error))?;
            }
            self.client.container_start(&container).map_err(|error| refused("started", error))
        })();
        if started.is_err() {
            self.close_sandbox(name);
        }
        started
    }

    fn look(&self, name: &str) -> Result<Option<Seen>, port::Error> {
        let mut groups = grouped(self, Some(name)).map_err(|error| api_error("list the sandbox's containers", &error))?;
        Ok(groups.remove(name).and_then(|group| group.seen()))
    }

    /// Marks left of a sandbox whose container is gone (a call that ended
    /// while it was closed made one after the close) are removed on the
    /// way: the reaper lists every few seconds.
    fn list_sandboxes(&self) -> Result<Vec<Seen>, port::Error> {
        let groups = grouped(self, None).map_err(|error| api_error("list the sandboxes", &error))?;
        for orphan in groups.values().filter(|group| group.sandbox.is_none()) {
            for mark in orphan.call.iter().chain(orphan.used.iter()) {
                let _ = self.client.container_remove(&mark.id);
            }
        }
        Ok(groups.values().filter_map(Containers::seen).collect())
    }

    /// Creating the call mark is the compare-and-set; a stale mark (the
    /// one `seen` holds) is removed by its id first.
    fn begin_call(&self, seen: &Seen, call: &CallMark) -> Result<bool, port::Error> {
        let name = rules::public_name(&seen.record.id);
        if seen.call.is_some() && !seen.version.is_empty() {
            super::try_remove_container(&self.client, &seen.version).map_err(|error| api_error("remove a stale call mark", &error))?;
        }
        let body = self.mark(&seen.record, spec::ROLE_SANDBOX_CALL, (spec::LABEL_SANDBOX_CALL, sandbox_record::encode_call(call)));
        match self.client.container_create(&call_mark_name(&name), &body) {
            Ok(_) => Ok(true),
            Err(error) if error.is_conflict() => Ok(false),
            Err(error) => Err(api_error("create the call mark", &error)),
        }
    }

    fn mark_used(&self, name: &str, at_ms: u64) -> Result<(), port::Error> {
        let Some(seen) = self.look(name)? else { return Ok(()) };
        let body = self.mark(&seen.record, spec::ROLE_SANDBOX_USED, (spec::LABEL_SANDBOX_USED_MS, at_ms.to_string()));
        match self.client.container_create(&used_mark_name(name, at_ms), &body) {
            Ok(_) => Ok(()),
            Err(error) if error.is_conflict() => Ok(()),
            Err(error) => Err(api_error("create the last-used mark", &error)),
        }
    }

    /// The new last-used mark first (a look never finds none), the
    /// last-used mark before on a thread of its own (nothing waits for
    /// it), then the call's mark, looked at by its name and removed by its
    /// id if it is this call's.
    fn end_call(&self, seen: &Seen, call: &CallMark, at_ms: u64) -> Result<(), port::Error> {
        let name = rules::public_name(&seen.record.id);
        let body = self.mark(&seen.record, spec::ROLE_SANDBOX_USED, (spec::LABEL_SANDBOX_USED_MS, at_ms.to_string()));
        match self.client.container_create(&used_mark_name(&name, at_ms), &body) {
            Ok(_) => {}
            Err(error) if error.is_conflict() => {}
            Err(error) => return Err(api_error("create the last-used mark", &error)),
        }
        if let Some(before) = seen.last_used_ms.filter(|before| *before != at_ms) {
            let (client, older) = (self.client.clone(), used_mark_name(&name, before));
            super::removal::spawn(&name, move || super::try_remove_container(&client, &older).map_err(|error| error.to_string()));
        }
        // The mark of this name may be another call's already (a second
        // server ended this call first, and the next call took the
        // sandbox): removed by its id, and only if its label says ours.
        let mark = match self.client.container_inspect(&call_mark_name(&name)) {
            Ok(mark) => mark,
            Err(error) if error.is_not_found() => return Ok(()),
            Err(error) => return Err(api_error("look at the call mark", &error)),
        };
        let ours = mark.config.labels.get(spec::LABEL_SANDBOX_CALL).and_then(|text| sandbox_record::decode_call(text));
        if ours.is_some_and(|ours| ours.call_id == call.call_id) {
            super::try_remove_container(&self.client, &mark.id).map_err(|error| api_error("remove the call mark", &error))?;
        }
        Ok(())
    }

    /// The call, one line on stdin; the attach brings its output back.
    /// The caller saw the sandbox running a moment ago (`look`); one that
    /// ended since ends the attach at once, and the call as `SandboxEnded`.
    fn deliver_call(&self, name: &str, call: &Assignment, _read_for: Duration) -> Result<Delivered, port::Error> {
        let container = spec::container_name(name);
        let line = session::stdin_line(&session::encode_call(&STDIN_KEY, call));
        let mut stream =
            self.client.container_attach_open(&container, &line).map_err(|error| api_error("hand the call to the sandbox", &error))?;
        resend_until_heard(&mut stream, &line);
        let handle = stream.abort_handle();
        // The cancel goes into the call's own attach, whose input reached
        // the runner already (a new attach's first line may be lost).
        let input = std::sync::Mutex::new(stream.input_handle().map_err(|error| attach_error("hand the call to the sandbox", &error))?);
        let cancel_line = call.tag.map(|tag| session::stdin_line(&session::encode_cancel(&STDIN_KEY, tag))).unwrap_or_default();
        let cancel = move || {
            use std::io::Write;
            let mut input = input.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            input.write_all(&cancel_line).map_err(|error| attach_error("stop the call in the sandbox", &error))
        };
        Ok(Delivered {
            output: Output { reader: Box::new(CallStream(stream)), abort: Abort::new(move || handle.abort()) },
            cancel: Box::new(cancel),
        })
    }

    /// The cancel on stdin through an attach of its own, written a few
    /// times: dockerd may lose a new attach's first input (a cancel for a
    /// call that ended already is ignored).
    fn cancel_call(&self, name: &str, tag: Tag) -> Result<(), port::Error> {
        let line = session::stdin_line(&session::encode_cancel(&STDIN_KEY, tag));
        let mut stream = self
            .client
            .container_attach_open(&spec::container_name(name), &line)
            .map_err(|error| api_error("stop the call in the sandbox", &error))?;
        for _ in 0..CANCEL_WRITES {
            std::thread::sleep(RESEND_AFTER);
            if stream.write_input(&line).is_err() {
                break;
            }
        }
        stream.end_input(END_INPUT_WAIT);
        Ok(())
    }

    fn call_log(&self, name: &str, since_ms: u64, follow: bool) -> Result<Output, port::Error> {
        let params = crate::docker::LogParams { follow, idle_timeout: None };
        // One daemon, one clock: the whole second the call started in.
        let stream = self
            .client
            .container_logs_since(&spec::container_name(name), &params, since_ms / 1000)
            .map_err(|error| api_error("read the sandbox's log", &error))?;
        let handle = stream.abort_handle();
        Ok(Output { reader: Box::new(stream), abort: Abort::new(move || handle.abort()) })
    }

    fn close_sandbox(&self, name: &str) {
        for _ in 0..3 {
            let Ok(mut groups) = grouped(self, Some(name)) else { break };
            let Some(group) = groups.remove(name) else { return };
            let all = group.sandbox.iter().chain(group.call.iter()).chain(group.used.iter());
            for container in all {
                if let Err(error) = self.client.container_remove(&container.id)
                    && !error.is_not_found()
                {
                    log::warn(
                        "a sandbox container was not removed; its expiry and the reaper remove it",
                        &[("sandbox", name.into()), ("error", error.to_string().into())],
                    );
                }
            }
        }
    }
}

/// A call's attach: its input is ended before it is closed
/// (`LogStream::end_input`), so the next call's line is not lost.
struct CallStream(crate::docker::stream::LogStream);

/// How long the end of an attach may take: the daemon closes it at once.
const END_INPUT_WAIT: Duration = Duration::from_secs(2);

impl std::io::Read for CallStream {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buffer)
    }
}

impl std::io::BufRead for CallStream {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.0.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.0.consume(amount)
    }
}

impl Drop for CallStream {
    fn drop(&mut self) {
        self.0.end_input(END_INPUT_WAIT);
    }
}

/// How long a call's line may go unanswered before it is written again.
const RESEND_AFTER: Duration = Duration::from_millis(250);
/// How often it is written at most.
const RESENDS: u32 = 20;
/// How often a cancel from another attach is written again.
const CANCEL_WRITES: u32 = 3;

/// Writes the call's line again until the sandbox answers. dockerd loses
/// the input an attach sends early when the attach before it ended a moment
/// ago (every other quick attach, on Docker 20.10); the runner ignores a
/// tag it has taken already, so a line that was only late runs once.
fn resend_until_heard(stream: &mut crate::docker::stream::LogStream, line: &[u8]) {
    for _ in 0..RESENDS {
        match stream.output_within(RESEND_AFTER) {
            Ok(false) => {
                if stream.write_input(line).is_err() {
                    return;
                }
            }
            Ok(true) | Err(_) => return,
        }
    }
}
