//! The run's decision, as a pure state machine: backend-neutral events in
//! (a fresh view of the sandbox, a start failure, the end of the log, API
//! trouble, a tick, a cancel), steps out (follow the output, probe the
//! sandbox, look for start failures, report the start, end with a verdict).
//!
//! It owns every rule about when a run ends and why: the start timeout
//! (only on a fresh view), the unschedulable grace, fail-fast start
//! failures, the result before the status, a log cut while the command
//! runs, when to read the output of a run read on demand (once someone
//! asks, or the sandbox ends or is being deleted), the hard deadline,
//! riding out an API outage, a SIGTERM nobody
//! here sent (wait for the sandbox to say who did), and a sandbox killed
//! without its result (wait a moment for it to be removed: `docker rm -f`
//! kills first and removes after).
//!
//! It deliberately knows no Kubernetes, no JSON, no threads and no clock:
//! time comes in with each event, and the shell (`run::follow`) does the
//! I/O each step asks for and turns the verdict into an outcome.

use std::time::{Duration, Instant};

use crate::engine::port::facts::{Finished, SandboxState, View};
use crate::engine::port::spec::RunReason;

/// How often start failures are looked for while no sandbox exists.
const START_FAILURE_POLL: Duration = Duration::from_secs(2);
/// How long the fresh look at a sandbox past its start deadline may take
/// before the run ends without it (the API does not answer).
const START_CONFIRM_WAIT: Duration = Duration::from_secs(5);
/// How often the sandbox is probed while the event stream is in trouble:
/// a stream that reconnected to an unchanged sandbox says nothing.
const OUTAGE_PROBE: Duration = Duration::from_secs(2);
/// How long a runner that reported a SIGTERM nobody here sent waits for
/// the sandbox's status to say who stopped it (eviction, deletion).
const EVIDENCE_WAIT: Duration = Duration::from_secs(30);
/// Least time between two restarts of a log that ended without a result.
const LOG_RESTART: Duration = Duration::from_secs(1);
/// How long a sandbox that ended killed (exit 128 + n, no OOM, nobody
/// deleting it) is watched for its removal before it is judged: a removal
/// from outside kills and then removes, and a look between the two would
/// otherwise report a plain kill (`ResultLost`) instead of the removal.
const REMOVAL_WAIT: Duration = Duration::from_secs(1);
/// The log of a finished sandbox is read again while it lacks the
/// runner's result: once at once, since a followed log can end early (the
/// kubelet ends it when it rotates the file); then again, a pause after
/// the last reading ended, while each reading gets further than the one
/// before, since an engine may still be writing the log when it says the
/// container exited (Podman 4.3, with megabytes of frames in conmon's
/// pipe: measured, a reading cut mid-line at 49 KB, the next at 57 KB, the
/// third whole). At most this many readings after the end.
const READS_AFTER_END: u8 = 8;
const READ_AFTER_END_PAUSE: Duration = Duration::from_millis(500);
/// How long the log may take to end after the sandbox has.
pub const LOG_DRAIN: Duration = Duration::from_secs(30);

/// The deadlines a run is held to.
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    /// When a sandbox that has not started is given up on.
    pub start: Instant,
    /// How long the sandbox may stay unschedulable; `None` waits for
    /// capacity up to `start` (a background run).
    pub unschedulable_grace: Option<Duration>,
    /// Only reached if the runner and the backend both failed to end it.
    pub hard: Instant,
}

/// How the output follower stopped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogEnd {
    /// The runner's result frame arrived.
    pub has_result: bool,
    /// The result says the command was stopped by a SIGTERM.
    pub terminated_by_request: bool,
    /// This server asked for the run to stop (a cancel).
    pub stop_asked_here: bool,
    /// Live output bytes already reported to the caller.
    pub reported: usize,
    /// How far into the log the reading got, in bytes.
    pub read_bytes: u64,
}

/// What happened.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A fresh view of the sandbox (an event, a list, a probe).
    Seen(View),
    /// The sandbox is gone; its last view.
    Gone(View),
    /// The backend refused to create the sandbox (quota, policy).
    StartFailed { reason: RunReason, message: String },
    /// The output follower stopped.
    LogEnded(LogEnd),
    /// The event stream fails and is being retried; why.
    ApiTrouble(String),
    /// The API answered again, with nothing new about the sandbox.
    ApiBack,
    /// The event stream failed in a way retrying cannot fix.
    ApiFailed(String),
    /// Time passed.
    Tick,
    /// The caller cancelled the run.
    Cancelled,
    /// Someone asks for the output while the command runs (a run whose
    /// output is read on demand: `RunState::reading_on_demand`).
    OutputWanted,
}

/// What the shell is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Follow the command's output from the start; the first `reported`
    /// live bytes were already reported.
    FollowOutput { reported: usize },
    /// List the sandbox and feed what was found (`ApiBack`, `Seen`, `Gone`).
    ProbeSandbox,
    /// Look for a refused creation and feed `StartFailed` if there is one.
    PollStartFailures,
    /// Tell the caller the command started.
    ReportStarted,
    /// The run is over.
    Done(Verdict),
}

/// How the run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Judge from the output (waiting for the follower to finish) and
    /// `finished`, the sandbox's facts if it ended. The runner decided if
    /// its result frame was read; else this server did.
    Judge { finished: Option<Finished> },
    /// This server ended the run without the runner's result: the sandbox
    /// must be stopped for good before the answer goes out.
    Server(ServerEnd),
}

/// An end this server decided.
#[derive(Clone, Debug, PartialEq)]
pub enum ServerEnd {
    /// A cancel: stop the output, return what was read.
    Cancelled,
    /// The sandbox did not start in time; the shell says what it was doing.
    StartTimeout,
    /// No node could take the sandbox; the scheduler's last message.
    Unschedulable { message: String },
    /// It could not start, for `reason`.
    Refused { reason: RunReason, message: String },
    /// The hard deadline passed without an end; `outage` when the API was
    /// away at the time.
    PastHardDeadline { outage: Option<Away> },
    /// The event stream failed for good.
    WatchFailed { message: String },
}

/// How long the API was away, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Away {
    pub duration: Duration,
    pub why: String,
}

/// Where the reading of the output stands.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Log {
    NotStarted,
    /// The command runs, and nobody asked for its output yet: it is read
    /// once someone does, or once the sandbox ends or is being deleted.
    Deferred,
    Following,
    Ended {
        has_result: bool,
        reported: usize,
    },
}

/// Since when the event stream has been failing, and why.
#[derive(Debug)]
struct Outage {
    since: Instant,
    why: String,
    next_probe: Instant,
}

/// One run's decision state.
#[derive(Debug)]
pub struct RunState {
    deadlines: Deadlines,
    view: Option<View>,
    gone: bool,
    unschedulable_since: Option<Instant>,
    /// The scheduler's last word, for a run that waited for capacity.
    last_unschedulable: Option<String>,
    /// When the start deadline passed with no start seen, and a fresh look
    /// at the sandbox was asked for (`Step::ProbeSandbox`): the watch's
    /// view may be seconds behind on a loaded node, and a command that
    /// started must not be judged as never started. With whether it came.
    start_probe: Option<(Instant, bool)>,
    /// The quota's last refusal, for a run that waits for capacity: a full
    /// ResourceQuota frees up as other runs end, and the Job controller
    /// creates the pod then.
    last_quota_refusal: Option<String>,
    next_start_poll: Instant,
    log: Log,
    started_reported: bool,
    outage: Option<Outage>,
    next_log_restart: Instant,
    evidence_deadline: Option<Instant>,
    /// Until when a killed sandbox is watched for its removal.
    removal_deadline: Option<Instant>,
    /// Read the output only when asked or at the end: a background run
    /// nobody watches holds no stream while its command runs.
    on_demand: bool,
    output_wanted: bool,
    /// How often the log was read again after the sandbox ended, because
    /// the reading before ended without the result (`READS_AFTER_END`).
    reads_after_end: u8,
    /// When the last reading of the log ended, how far it got, and how
    /// far the one before it got.
    log_ended_at: Instant,
    last_read_bytes: Option<u64>,
    previous_read_bytes: Option<u64>,
    /// Until when a reading that follows the log of a finished sandbox is
    /// waited for (`LOG_DRAIN`).
    log_drain_until: Option<Instant>,
}

impl RunState {
    pub fn new(deadlines: Deadlines, now: Instant) -> RunState {
        RunState {
            deadlines,
            view: None,
            gone: false,
            unschedulable_since: None,
            last_unschedulable: None,
            last_quota_refusal: None,
            start_probe: None,
            next_start_poll: now + START_FAILURE_POLL,
            log: Log::NotStarted,
            started_reported: false,
            outage: None,
            next_log_restart: now,
            reads_after_end: 0,
            log_ended_at: now,
            last_read_bytes: None,
            previous_read_bytes: None,
            log_drain_until: None,
            evidence_deadline: None,
            removal_deadline: None,
            on_demand: false,
            output_wanted: false,
        }
    }

    /// The output of a command that runs is read only once
    /// `Event::OutputWanted` comes, or the sandbox ends or is being
    /// deleted; the run's end is judged the same way (a background run).
    pub fn reading_on_demand(mut self) -> RunState {
        self.on_demand = true;
        self
    }

    /// Why the event stream is failing, while it is.
    pub fn outage(&self) -> Option<&str> {
        self.outage.as_ref().map(|outage| outage.why.as_str())
    }

    /// Takes `event` at `now`; the steps to take, in order. After a
    /// `Step::Done` the run is over.
    pub fn on(&mut self, event: Event, now: Instant) -> Vec<Step> {
        if event == Event::Cancelled {
            return vec![Step::Done(Verdict::Server(ServerEnd::Cancelled))];
        }
        // The fresh look asked for at the start deadline is acted on before
        // any deadline is judged.
        let answers_probe = matches!(self.start_probe, Some((_, false))) && matches!(event, Event::Seen(_) | Event::Gone(_));
        // Deadlines are judged on what was known before this event: a view
        // that ends an outage must first be acted on.
        if !answers_probe {
            if self.start_deadline_reached(now) && self.start_probe.is_none() {
                self.start_probe = Some((now, false));
                return vec![Step::ProbeSandbox];
            }
            if let Some(verdict) = self.past_deadline(now) {
                return vec![Step::Done(verdict)];
            }
        }
        let mut steps = Vec::new();
        if let Some(verdict) = self.apply(event, now) {
            return vec![Step::Done(verdict)];
        }
        if let Some(verdict) = self.judge_sandbox(now, &mut steps) {
            steps.push(Step::Done(verdict));
            return steps;
        }
        if answers_probe {
            self.start_probe = self.start_probe.map(|(asked, _)| (asked, true));
            if let Some(verdict) = self.past_deadline(now) {
                steps.push(Step::Done(verdict));
                return steps;
            }
        }
        self.polls(now, &mut steps);
        steps
    }

    /// The start deadline has passed with no start seen. While the API does
    /// not answer, the sandbox may well have started: only a fresh view may
    /// say it did not.
    fn start_deadline_reached(&self, now: Instant) -> bool {
        self.log == Log::NotStarted && now >= self.deadlines.start && self.outage.is_none()
    }

    fn past_deadline(&self, now: Instant) -> Option<Verdict> {
        // Judged once the fresh look came back, or did not in time.
        let looked = self.start_probe.is_some_and(|(asked, answered)| answered || now >= asked + START_CONFIRM_WAIT);
        if self.start_deadline_reached(now) && looked {
            // A run that waits for capacity reports that it never came; a
            // sync run whose start timeout comes before its grace timed out.
            let waited_for_capacity = self.deadlines.unschedulable_grace.is_none();
            if let Some(message) = self.last_quota_refusal.as_ref().filter(|_| waited_for_capacity && self.view.is_none()) {
                let message = format!("{message}; the namespace's quota stayed full until the start timeout, so no pod was made");
                return Some(Verdict::Server(ServerEnd::Refused { reason: RunReason::QuotaExceeded, message }));
            }
            return Some(Verdict::Server(match (self.unschedulable_since, &self.last_unschedulable) {
                (Some(_), Some(message)) if waited_for_capacity => ServerEnd::Unschedulable { message: message.clone() },
                _ => ServerEnd::StartTimeout,
            }));
        }
        if now >= self.deadlines.hard {
            let outage = self.outage.as_ref().map(|outage| Away { duration: now.duration_since(outage.since), why: outage.why.clone() });
            return Some(Verdict::Server(ServerEnd::PastHardDeadline { outage }));
        }
        None
    }

    fn apply(&mut self, event: Event, now: Instant) -> Option<Verdict> {
        match event {
            Event::Seen(view) => {
                self.outage = None;
                self.view = Some(view);
            }
            Event::Gone(view) => {
                self.outage = None;
                self.view = Some(view);
                self.gone = true;
            }
            Event::ApiBack => self.outage = None,
            Event::ApiTrouble(why) => {
                self.outage.get_or_insert(Outage { since: now, why: String::new(), next_probe: now + OUTAGE_PROBE }).why = why;
            }
            Event::ApiFailed(message) => return Some(Verdict::Server(ServerEnd::WatchFailed { message })),
            // A run that waits for capacity waits for quota too.
            Event::StartFailed { reason: RunReason::QuotaExceeded, message } if self.deadlines.unschedulable_grace.is_none() => {
                self.last_quota_refusal = Some(message);
            }
            Event::StartFailed { reason, message } => return Some(Verdict::Server(ServerEnd::Refused { reason, message })),
            Event::LogEnded(end) => return self.log_ended(end, now),
            Event::OutputWanted => self.output_wanted = true,
            Event::Tick | Event::Cancelled => {}
        }
        None
    }

    /// The runner's result is its last word: the run is over even if the
    /// sandbox's status has not caught up, unless it says "stopped by
    /// SIGTERM" and nobody here asked: then the sandbox's status must say
    /// who did.
    fn log_ended(&mut self, end: LogEnd, now: Instant) -> Option<Verdict> {
        self.log_ended_at = now;
        self.previous_read_bytes = self.last_read_bytes.replace(end.read_bytes);
        let explained = self.facts();
        let unexplained_stop = end.terminated_by_request && !end.stop_asked_here && explained.is_none();
        if end.has_result && !unexplained_stop {
            return Some(Verdict::Judge { finished: explained });
        }
        if unexplained_stop {
            self.evidence_deadline = Some(now + EVIDENCE_WAIT);
        }
        // Wait for the sandbox's final status to say why.
        self.log = Log::Ended { has_result: end.has_result, reported: end.reported };
        None
    }

    /// The sandbox's end, or the fact that it is gone or going; `None`
    /// while it has not ended and nobody deleted it.
    fn facts(&self) -> Option<Finished> {
        let view = self.view.as_ref()?;
        match &view.ended {
            Some(ended) => Some(Finished { deleted: ended.deleted || self.gone, ..ended.clone() }),
            None if self.gone => Some(view.if_gone.clone()),
            None => None,
        }
    }

    fn judge_sandbox(&mut self, now: Instant, steps: &mut Vec<Step>) -> Option<Verdict> {
        let state = self.view.as_ref()?.state.clone();
        let explained = self.facts();
        if self.gone || self.evidence_deadline.is_some_and(|deadline| now >= deadline || explained.is_some()) {
            return Some(Verdict::Judge { finished: explained });
        }
        if !matches!(state, SandboxState::Unschedulable { .. }) {
            self.unschedulable_since = None;
        }
        match state {
            SandboxState::Pending => None,
            SandboxState::Unschedulable { message } => {
                let since = *self.unschedulable_since.get_or_insert(now);
                self.last_unschedulable = Some(message.clone());
                let past_grace = self.deadlines.unschedulable_grace.is_some_and(|grace| now.duration_since(since) >= grace);
                past_grace.then_some(Verdict::Server(ServerEnd::Unschedulable { message }))
            }
            SandboxState::FailFast { reason, message } => Some(Verdict::Server(ServerEnd::Refused { reason, message })),
            SandboxState::Running => {
                self.running(now, steps);
                None
            }
            SandboxState::Finished { ran } => {
                // A command the runtime never started has no output to wait for.
                if matches!(self.log, Log::NotStarted | Log::Deferred) && ran {
                    self.log = Log::Following;
                    steps.push(Step::FollowOutput { reported: 0 });
                }
                // The reading ends on its own now that the sandbox has: its
                // word (`LogEnded`) says whether it got the result, and one
                // that did not is read again below. Judged without that
                // word only past `LOG_DRAIN` (the reading is then stopped).
                if self.log == Log::Following && !self.gone {
                    let until = *self.log_drain_until.get_or_insert(now + LOG_DRAIN);
                    if now < until {
                        return None;
                    }
                }
                let got_further = match (self.previous_read_bytes, self.last_read_bytes) {
                    (Some(before), Some(last)) => last > before,
                    _ => true,
                };
                if let Log::Ended { has_result: false, reported } = self.log
                    && ran
                    && !self.gone
                    && self.reads_after_end < READS_AFTER_END
                    && (self.reads_after_end == 0 || got_further)
                {
                    // The first at once; each later one a pause after the
                    // reading before it ended.
                    if self.reads_after_end > 0 && now < self.log_ended_at + READ_AFTER_END_PAUSE {
                        return None;
                    }
                    self.reads_after_end += 1;
                    self.log = Log::Following;
                    steps.push(Step::FollowOutput { reported });
                    return None;
                }
                if explained.as_ref().is_some_and(killed_unexplained) {
                    let deadline = *self.removal_deadline.get_or_insert(now + REMOVAL_WAIT);
                    if now < deadline {
                        return None;
                    }
                }
                Some(Verdict::Judge { finished: explained })
            }
        }
    }

    fn running(&mut self, now: Instant, steps: &mut Vec<Step>) {
        if !self.started_reported {
            self.started_reported = true;
            steps.push(Step::ReportStarted);
        }
        // Being deleted (a cancel, an eviction): the runner reports what
        // it has, which only a reader already following gets.
        let read_now = !self.on_demand || self.output_wanted || self.view.as_ref().is_some_and(|view| view.ended.is_some());
        match self.log {
            Log::NotStarted | Log::Deferred if read_now => {
                self.log = Log::Following;
                steps.push(Step::FollowOutput { reported: 0 });
            }
            Log::NotStarted => self.log = Log::Deferred,
            // The log ended without a result while the command still runs:
            // the stream was cut (an API server restart). Read it again
            // from the start; what was reported live is not reported twice.
            Log::Ended { has_result: false, reported } if now >= self.next_log_restart => {
                self.next_log_restart = now + LOG_RESTART;
                self.log = Log::Following;
                steps.push(Step::FollowOutput { reported });
            }
            _ => {}
        }
    }

    fn polls(&mut self, now: Instant, steps: &mut Vec<Step>) {
        if self.view.is_none() && now >= self.next_start_poll {
            self.next_start_poll = now + START_FAILURE_POLL;
            steps.push(Step::PollStartFailures);
        }
        if let Some(outage) = &mut self.outage
            && now >= outage.next_probe
        {
            outage.next_probe = now + OUTAGE_PROBE;
            steps.push(Step::ProbeSandbox);
        }
    }
}

/// A sandbox killed by a signal (exit 128 + n) that is neither an OOM
/// kill nor known to be deleted: a kill from outside, or the first half of
/// a removal.
fn killed_unexplained(facts: &Finished) -> bool {
    let by_signal = facts.exit_code.is_some_and(|code| code > 128);
    by_signal && !facts.oom_killed && !facts.deleted && facts.stopped.is_none() && facts.disruption.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::port::facts::Stopped;
    use crate::engine::run::collect::Collector;
    use crate::engine::run::outcome::{self, Judged};

    fn secs(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    /// A caller who waits: start timeout 60 s, grace 20 s, hard deadline 100 s.
    fn sync(t0: Instant) -> Deadlines {
        Deadlines { start: t0 + secs(60), unschedulable_grace: Some(secs(20)), hard: t0 + secs(100) }
    }

    /// A sync run whose start timeout (10 s) comes before its grace.
    fn quick_start(t0: Instant) -> Deadlines {
        Deadlines { start: t0 + secs(10), ..sync(t0) }
    }

    /// A background run: waits for capacity up to its start deadline.
    fn background(t0: Instant) -> Deadlines {
        Deadlines { unschedulable_grace: None, ..sync(t0) }
    }

    fn view(state: SandboxState) -> View {
        View { state, ended: None, if_gone: Finished { deleted: true, ..Finished::default() } }
    }

    fn seen(state: SandboxState) -> Event {
        Event::Seen(view(state))
    }

    fn running() -> Event {
        seen(SandboxState::Running)
    }

    fn unschedulable(message: &str) -> Event {
        seen(SandboxState::Unschedulable { message: message.into() })
    }

    fn finished(facts: &Finished) -> Event {
        Event::Seen(View {
            state: SandboxState::Finished { ran: true },
            ended: Some(facts.clone()),
            if_gone: Finished { deleted: true, ..facts.clone() },
        })
    }

    fn exited(code: i32) -> Finished {
        Finished { exit_code: Some(code), ..Finished::default() }
    }

    fn oom() -> Finished {
        Finished { exit_code: Some(137), oom_killed: true, ..Finished::default() }
    }

    fn evicted() -> Finished {
        Finished { stopped: Some(Stopped::Evicted { message: "ephemeral storage".into() }), ..Finished::default() }
    }

    fn deleted() -> Finished {
        Finished { deleted: true, ..Finished::default() }
    }

    /// A reading's end; it got `reported` bytes into the log (the tests
    /// use one number for both).
    fn log_end(has_result: bool, terminated_by_request: bool, stop_asked_here: bool, reported: usize) -> Event {
        Event::LogEnded(LogEnd { has_result, terminated_by_request, stop_asked_here, reported, read_bytes: reported as u64 })
    }

    fn result() -> Event {
        log_end(true, false, false, 0)
    }

    fn cut(reported: usize) -> Event {
        log_end(false, false, false, reported)
    }

    fn sigterm(asked_here: bool) -> Event {
        log_end(true, true, asked_here, 0)
    }

    /// A log cut twice, the pod finished, the reading after its end cut
    /// further on, and, half a second later, the second reading after the
    /// end begun.
    fn read_again_after_the_end() -> Vec<(Duration, Event)> {
        vec![
            (secs(0), running()),
            (secs(5), cut(42)),
            (ms(5500), cut(50)),
            (ms(5800), finished(&exited(0))),
            (secs(6), cut(60)),
            (ms(6500), Event::Tick),
        ]
    }

    /// From `start`: a finished sandbox's reading ends without the result,
    /// and the reading after it gets no further (it ends 0.1 s after
    /// `start`).
    fn read_out_without_result(start: Duration) -> Vec<(Duration, Event)> {
        vec![(start, cut(0)), (start + ms(100), cut(0))]
    }

    fn judge(finished: Option<Finished>) -> Vec<Step> {
        vec![Step::Done(Verdict::Judge { finished })]
    }

    fn server(end: ServerEnd) -> Vec<Step> {
        vec![Step::Done(Verdict::Server(end))]
    }

    /// Feeds `script` (time after t0, event) to a new machine; the steps
    /// of the last event, after checking that no earlier one ended the run.
    fn play(deadlines: fn(Instant) -> Deadlines, script: Vec<(Duration, Event)>) -> Vec<Step> {
        let t0 = Instant::now();
        let mut machine = RunState::new(deadlines(t0), t0);
        let count = script.len();
        let mut last = Vec::new();
        for (index, (at, event)) in script.into_iter().enumerate() {
            last = machine.on(event, t0 + at);
            let ended = last.iter().any(|step| matches!(step, Step::Done(_)));
            assert!(!ended || index + 1 == count, "ended early, at event {index}: {last:?}");
        }
        last
    }

    /// Every rule of a run's end, one row each: (rule, deadlines, events,
    /// the steps of the last event).
    #[test]
    fn every_rule_of_a_runs_end() {
        type Row = (&'static str, fn(Instant) -> Deadlines, Vec<(Duration, Event)>, Vec<Step>);
        let refused_pull = || ServerEnd::Refused { reason: RunReason::ImagePullFailed, message: "`nope:1` could not be pulled".into() };
        let rows: Vec<Row> = vec![
            (
                "at the start deadline with no start seen, the sandbox is looked at afresh first",
                sync,
                vec![(secs(0), seen(SandboxState::Pending)), (secs(60), Event::Tick)],
                vec![Step::ProbeSandbox],
            ),
            (
                "a pod the fresh look finds still not started is a start timeout, described by the shell",
                sync,
                vec![(secs(0), seen(SandboxState::Pending)), (secs(60), Event::Tick), (secs(60), seen(SandboxState::Pending))],
                server(ServerEnd::StartTimeout),
            ),
            (
                "a pod the fresh look finds running (the watch was behind) is followed, not timed out",
                sync,
                vec![(secs(0), seen(SandboxState::Pending)), (secs(60), Event::Tick), (secs(60), running())],
                vec![Step::ReportStarted, Step::FollowOutput { reported: 0 }],
            ),
            (
                "a fresh look that does not come back ends the run 5 s later",
                sync,
                vec![(secs(0), seen(SandboxState::Pending)), (secs(60), Event::Tick), (secs(64), Event::Tick), (secs(65), Event::Tick)],
                server(ServerEnd::StartTimeout),
            ),
            (
                "no start timeout is declared while the API is away: the pod is probed instead",
                sync,
                vec![(secs(0), seen(SandboxState::Pending)), (secs(50), Event::ApiTrouble("refused".into())), (secs(61), Event::Tick)],
                vec![Step::ProbeSandbox],
            ),
            (
                "a start timeout is declared on the first fresh view after the outage",
                sync,
                vec![
                    (secs(0), seen(SandboxState::Pending)),
                    (secs(50), Event::ApiTrouble("refused".into())),
                    (secs(61), Event::ApiBack),
                    (secs(62), Event::Tick),
                    (secs(62), seen(SandboxState::Pending)),
                ],
                server(ServerEnd::StartTimeout),
            ),
            (
                "a pod seen running after an outage over the start deadline is followed, not timed out",
                sync,
                vec![(secs(0), seen(SandboxState::Pending)), (secs(50), Event::ApiTrouble("refused".into())), (secs(61), running())],
                vec![Step::ReportStarted, Step::FollowOutput { reported: 0 }],
            ),
            (
                "a sync run unschedulable for its 20 s grace ends unschedulable",
                sync,
                vec![(secs(0), unschedulable("0/1 nodes")), (secs(19), Event::Tick), (secs(20), Event::Tick)],
                server(ServerEnd::Unschedulable { message: "0/1 nodes".into() }),
            ),
            (
                "a sync run whose start deadline comes before its grace is a start timeout",
                quick_start,
                vec![(secs(0), unschedulable("0/1 nodes")), (secs(10), Event::Tick), (secs(10), unschedulable("0/1 nodes"))],
                server(ServerEnd::StartTimeout),
            ),
            (
                "a background run waits for quota: a refused pod creation is made once others end",
                background,
                vec![
                    (secs(2), Event::StartFailed { reason: RunReason::QuotaExceeded, message: "exceeded quota".into() }),
                    (secs(12), running()),
                    (secs(13), Event::Tick),
                ],
                vec![],
            ),
            (
                "a background run whose quota stays full ends at its start deadline, saying so",
                background,
                vec![
                    (secs(2), Event::StartFailed { reason: RunReason::QuotaExceeded, message: "exceeded quota".into() }),
                    (secs(59), Event::Tick),
                    (secs(60), Event::Tick),
                    (secs(65), Event::Tick),
                ],
                server(ServerEnd::Refused {
                    reason: RunReason::QuotaExceeded,
                    message: "exceeded quota; the namespace's quota stayed full until the start timeout, so no pod was made".into(),
                }),
            ),
            (
                "a background run waits for capacity up to its start deadline and says the scheduler's last word",
                background,
                vec![
                    (secs(0), unschedulable("first")),
                    (secs(30), unschedulable("0/3 nodes")),
                    (secs(59), Event::Tick),
                    (secs(60), Event::Tick),
                    (secs(60), unschedulable("0/3 nodes")),
                ],
                server(ServerEnd::Unschedulable { message: "0/3 nodes".into() }),
            ),
            (
                "a pod that becomes schedulable again starts its grace anew",
                sync,
                vec![
                    (secs(0), unschedulable("0/1 nodes")),
                    (secs(15), seen(SandboxState::Pending)),
                    (secs(16), unschedulable("0/1 nodes")),
                    (secs(35), Event::Tick),
                    (secs(36), Event::Tick),
                ],
                server(ServerEnd::Unschedulable { message: "0/1 nodes".into() }),
            ),
            (
                "an image that cannot be pulled fails fast with its reason",
                sync,
                vec![(
                    secs(0),
                    seen(SandboxState::FailFast { reason: RunReason::ImagePullFailed, message: "`nope:1` could not be pulled".into() }),
                )],
                server(refused_pull()),
            ),
            (
                "while no pod exists, start failures are looked for every 2 s",
                sync,
                vec![(secs(1), Event::Tick), (secs(2), Event::Tick)],
                vec![Step::PollStartFailures],
            ),
            (
                "a creation the quota refused ends the run while no pod exists",
                sync,
                vec![
                    (secs(2), Event::Tick),
                    (secs(2), Event::StartFailed { reason: RunReason::QuotaExceeded, message: "exceeded quota".into() }),
                ],
                server(ServerEnd::Refused { reason: RunReason::QuotaExceeded, message: "exceeded quota".into() }),
            ),
            (
                "the runner's result ends the run even while the pod still says Running",
                sync,
                vec![(secs(0), running()), (secs(5), result())],
                judge(None),
            ),
            (
                "the result is judged with what the pod said last (being deleted)",
                sync,
                vec![
                    (secs(0), running()),
                    (secs(4), Event::Seen(View { ended: Some(deleted()), ..view(SandboxState::Running) })),
                    (secs(5), result()),
                ],
                judge(Some(deleted())),
            ),
            (
                "a log cut while the command runs is followed again, without reporting twice",
                sync,
                vec![(secs(0), running()), (secs(5), cut(42))],
                vec![Step::FollowOutput { reported: 42 }],
            ),
            (
                "a log cut again within the second is not followed again yet",
                sync,
                vec![(secs(0), running()), (secs(5), cut(42)), (ms(5500), cut(50))],
                vec![],
            ),
            (
                "a log cut again is followed again a second after the last restart",
                sync,
                vec![(secs(0), running()), (secs(5), cut(42)), (ms(5500), cut(50)), (secs(6), Event::Tick)],
                vec![Step::FollowOutput { reported: 50 }],
            ),
            (
                "a finished pod whose log is being read waits for the reading's end",
                sync,
                vec![(secs(0), running()), (secs(5), cut(42)), (secs(6), finished(&exited(3)))],
                vec![],
            ),
            (
                "a finished pod's reading that ended without the result is read again at once",
                sync,
                vec![(secs(0), running()), (secs(5), cut(42)), (secs(6), finished(&exited(3))), (ms(6100), cut(42))],
                vec![Step::FollowOutput { reported: 42 }],
            ),
            (
                "a reading after the end that got no further: judged from the pod's facts",
                sync,
                vec![(secs(0), running()), (secs(5), cut(42)), (secs(6), finished(&exited(3))), (ms(6100), cut(42)), (ms(6200), cut(42))],
                judge(Some(exited(3))),
            ),
            (
                "a finished pod's reading that does not end is judged past the log's drain time",
                sync,
                vec![(secs(0), running()), (secs(5), finished(&exited(3))), (secs(35), Event::Tick)],
                judge(Some(exited(3))),
            ),
            (
                "a log cut again just before the pod finished is read once more, not judged lost",
                sync,
                vec![(secs(0), running()), (secs(5), cut(42)), (ms(5500), cut(50)), (ms(5800), finished(&exited(0)))],
                vec![Step::FollowOutput { reported: 50 }],
            ),
            (
                "a finished pod's log that ended again without the result is read again after half a second",
                sync,
                vec![(secs(0), running()), (secs(5), cut(42)), (ms(5500), cut(50)), (ms(5800), finished(&exited(0))), (secs(6), cut(60))],
                vec![],
            ),
            (
                "the second reading after the end comes half a second after the first ended",
                sync,
                read_again_after_the_end(),
                vec![Step::FollowOutput { reported: 60 }],
            ),
            (
                "readings after the end go on while each gets further (the log is still being written)",
                sync,
                [read_again_after_the_end(), vec![(ms(6600), cut(70)), (ms(7100), Event::Tick)]].concat(),
                vec![Step::FollowOutput { reported: 70 }],
            ),
            (
                "a reading after the end that got no further ends the run, with its result or without",
                sync,
                [read_again_after_the_end(), vec![(ms(6600), cut(60))]].concat(),
                judge(Some(exited(0))),
            ),
            (
                "at most eight readings after the end, however far each gets",
                sync,
                [
                    vec![(secs(0), running()), (secs(5), finished(&exited(0))), (ms(5100), cut(10))],
                    (1..8u64).flat_map(|n| [(ms(5100 + n * 600), cut(10 + n as usize)), (ms(5100 + n * 600 + 550), Event::Tick)]).collect(),
                    vec![(ms(10_000), cut(100))],
                ]
                .concat(),
                judge(Some(exited(0))),
            ),
            (
                "a pod found finished is followed from the start",
                sync,
                vec![(secs(0), finished(&exited(0)))],
                vec![Step::FollowOutput { reported: 0 }],
            ),
            (
                "and judged once that reading brought the result",
                sync,
                vec![(secs(0), finished(&exited(0))), (ms(500), result())],
                judge(Some(exited(0))),
            ),
            (
                "a command the runtime never started has no output to wait for",
                sync,
                vec![(secs(0), Event::Seen(View { state: SandboxState::Finished { ran: false }, ..view(SandboxState::Pending) }))],
                judge(None),
            ),
            (
                "the hard deadline with partial output and a live API is this server's timeout",
                sync,
                vec![(secs(0), running()), (secs(100), Event::Tick)],
                server(ServerEnd::PastHardDeadline { outage: None }),
            ),
            (
                "the hard deadline during an outage says how long the API was away",
                sync,
                vec![(secs(0), running()), (secs(70), Event::ApiTrouble("connection refused".into())), (secs(100), Event::Tick)],
                server(ServerEnd::PastHardDeadline { outage: Some(Away { duration: secs(30), why: "connection refused".into() }) }),
            ),
            (
                "a cancel ends the run with what was read",
                sync,
                vec![(secs(0), running()), (secs(5), Event::Cancelled)],
                server(ServerEnd::Cancelled),
            ),
            ("a SIGTERM this server asked for is judged at once", sync, vec![(secs(0), running()), (secs(5), sigterm(true))], judge(None)),
            (
                "a SIGTERM nobody here sent waits for the pod to say who stopped it",
                sync,
                vec![(secs(0), running()), (secs(5), sigterm(false)), (secs(34), Event::Tick)],
                vec![],
            ),
            (
                "a SIGTERM nobody here sent is judged as it is after 30 s without evidence",
                sync,
                vec![(secs(0), running()), (secs(5), sigterm(false)), (secs(35), Event::Tick)],
                judge(None),
            ),
            (
                "a SIGTERM nobody here sent, then the kubelet's eviction, is judged with the eviction",
                sync,
                vec![(secs(0), running()), (secs(5), sigterm(false)), (secs(8), finished(&evicted()))],
                judge(Some(evicted())),
            ),
            (
                "a SIGTERM nobody here sent, then the pod gone, is judged as deleted",
                sync,
                vec![(secs(0), running()), (secs(5), sigterm(false)), (secs(8), Event::Gone(view(SandboxState::Running)))],
                judge(Some(deleted())),
            ),
            (
                "a SIGTERM with the pod already being deleted is judged at once",
                sync,
                vec![
                    (secs(0), running()),
                    (secs(4), Event::Seen(View { ended: Some(deleted()), ..view(SandboxState::Running) })),
                    (secs(5), sigterm(false)),
                ],
                judge(Some(deleted())),
            ),
            (
                "a pod deleted from outside is judged with its deleted facts",
                sync,
                vec![(secs(0), running()), (secs(5), Event::Gone(view(SandboxState::Running)))],
                judge(Some(deleted())),
            ),
            (
                "a finished pod that then disappears is judged with its status, marked deleted",
                sync,
                vec![(secs(0), running()), (secs(5), Event::Gone(View { ended: Some(exited(1)), ..view(SandboxState::Running) }))],
                judge(Some(Finished { deleted: true, ..exited(1) })),
            ),
            (
                "a sandbox killed without its result is watched a moment for its removal",
                sync,
                [
                    vec![(secs(0), running()), (secs(5), finished(&exited(137)))],
                    read_out_without_result(ms(5100)),
                    vec![(ms(5700), Event::Tick)],
                ]
                .concat(),
                vec![],
            ),
            (
                "a sandbox killed and then removed is judged as removed (`docker rm -f`: kill, then remove)",
                sync,
                [
                    vec![(secs(0), running()), (secs(5), finished(&exited(137)))],
                    read_out_without_result(ms(5100)),
                    vec![(ms(5500), Event::Gone(View { ended: Some(exited(137)), ..view(SandboxState::Running) }))],
                ]
                .concat(),
                judge(Some(Finished { deleted: true, ..exited(137) })),
            ),
            (
                "a sandbox killed and still there after the wait is judged as killed",
                sync,
                [
                    vec![(secs(0), running()), (secs(5), finished(&exited(137)))],
                    read_out_without_result(ms(5100)),
                    vec![(ms(6300), Event::Tick)],
                ]
                .concat(),
                judge(Some(exited(137))),
            ),
            (
                "a killed sandbox whose result arrives is judged at once",
                sync,
                vec![(secs(0), running()), (secs(5), finished(&exited(137))), (ms(5100), result())],
                judge(Some(exited(137))),
            ),
            (
                "an OOM kill and a plain exit are judged once the log is read out, without the removal wait",
                sync,
                [vec![(secs(0), running()), (secs(5), finished(&oom()))], read_out_without_result(ms(5100))].concat(),
                judge(Some(oom())),
            ),
            (
                "an outage is ridden out: the pod is probed every 2 s while the watch fails",
                sync,
                vec![(secs(0), running()), (secs(5), Event::ApiTrouble("refused".into())), (secs(6), Event::Tick), (secs(7), Event::Tick)],
                vec![Step::ProbeSandbox],
            ),
            (
                "an outage is over when the API answers: no more probes, and the run goes on",
                sync,
                vec![
                    (secs(0), running()),
                    (secs(5), Event::ApiTrouble("refused".into())),
                    (secs(7), Event::ApiBack),
                    (secs(9), Event::Tick),
                ],
                vec![],
            ),
            (
                "a watch that failed for good is this server's end, with the output so far",
                sync,
                vec![(secs(0), running()), (secs(5), Event::ApiFailed("403 forbidden".into()))],
                server(ServerEnd::WatchFailed { message: "403 forbidden".into() }),
            ),
            ("the start is reported once", sync, vec![(secs(0), running()), (secs(1), running())], vec![]),
        ];
        for (rule, deadlines, script, expected) in rows {
            assert_eq!(play(deadlines, script), expected, "{rule}");
        }
    }

    /// What a judgement over the pod's facts makes of them, with no result:
    /// every reading of the log ends without it.
    fn judged(facts: Finished) -> crate::engine::port::spec::RunOutcome {
        // A kill is watched a moment for its removal (REMOVAL_WAIT) first.
        let t0 = Instant::now();
        let mut machine = RunState::new(sync(t0), t0);
        machine.on(running(), t0);
        let mut at = secs(5);
        let mut steps = machine.on(finished(&facts), t0 + at);
        for _ in 0..20 {
            if steps.iter().any(|step| matches!(step, Step::Done(_))) {
                break;
            }
            at += ms(600);
            let reading = steps.iter().any(|step| matches!(step, Step::FollowOutput { .. })) || machine.log == Log::Following;
            steps = machine.on(if reading { cut(0) } else { Event::Tick }, t0 + at);
        }
        let steps: Vec<Step> = steps.into_iter().filter(|step| matches!(step, Step::Done(_))).collect();
        let [Step::Done(Verdict::Judge { finished })] = steps.as_slice() else { panic!("not judged: {steps:?}") };
        let facts = Judged {
            run_id: "r",
            timeout: secs(5),
            memory_limit: Some("64Mi"),
            finished: finished.as_ref(),
            cancel_requested: false,
            wording: &outcome::POD_WORDING,
        };
        outcome::judge(&facts, Collector::new(100, 100))
    }

    #[test]
    fn an_oom_kill_needs_the_sandboxs_evidence_and_a_plain_137_is_an_exit_code() {
        let killed = judged(oom());
        assert_eq!(killed.reason, Some(RunReason::OOMKilled), "{}", killed.message);
        let plain = judged(exited(137));
        assert_ne!(plain.reason, Some(RunReason::OOMKilled), "{}", plain.message);
        assert_eq!(plain.exit_code, Some(137));
    }

    #[test]
    fn an_eviction_and_an_outside_deletion_are_not_cancels() {
        assert_eq!(judged(evicted()).reason, Some(RunReason::Evicted));
        assert_eq!(judged(Finished { deleted: true, ..exited(143) }).reason, Some(RunReason::PodDeleted));
    }

    /// A background run's output is read on demand: (rule, events, the
    /// steps of the last event). Everything else about its end is the
    /// table above's.
    #[test]
    fn a_run_read_on_demand_opens_its_output_only_when_asked_or_at_its_end() {
        let being_deleted = Event::Seen(View { ended: Some(deleted()), ..view(SandboxState::Running) });
        let rows: Vec<(&str, Vec<Event>, Vec<Step>)> = vec![
            ("a running command nobody asked about is reported started, and not read", vec![running()], vec![Step::ReportStarted]),
            ("nor while it keeps running", vec![running(), running(), Event::Tick], vec![]),
            (
                "someone asks: the output is read from the start",
                vec![running(), Event::OutputWanted],
                vec![Step::FollowOutput { reported: 0 }],
            ),
            (
                "asked before it ran: read once it runs",
                vec![Event::OutputWanted, running()],
                vec![Step::ReportStarted, Step::FollowOutput { reported: 0 }],
            ),
            ("asked twice: read once", vec![running(), Event::OutputWanted, Event::OutputWanted], vec![]),
            (
                "being deleted (a cancel, an eviction): read, for what the runner reports",
                vec![running(), being_deleted],
                vec![Step::FollowOutput { reported: 0 }],
            ),
            ("it ended unread: read to the end", vec![running(), finished(&exited(3))], vec![Step::FollowOutput { reported: 0 }]),
            ("then judged", vec![running(), finished(&exited(3)), result()], judge(Some(exited(3)))),
            ("it ended before any look: read to the end", vec![finished(&exited(0))], vec![Step::FollowOutput { reported: 0 }]),
            ("then judged too", vec![finished(&exited(0)), result()], judge(Some(exited(0)))),
        ];
        for (rule, events, expected) in rows {
            let t0 = Instant::now();
            let mut machine = RunState::new(background(t0), t0).reading_on_demand();
            let mut last = Vec::new();
            for event in events {
                last = machine.on(event, t0 + secs(1));
            }
            assert_eq!(last, expected, "{rule}");
        }
    }

    #[test]
    fn a_command_seen_running_but_unread_is_not_timed_out_at_the_start_deadline() {
        let t0 = Instant::now();
        let mut machine = RunState::new(background(t0), t0).reading_on_demand();
        machine.on(running(), t0 + secs(1));
        assert_eq!(machine.on(Event::Tick, t0 + secs(61)), vec![]);
    }
}
