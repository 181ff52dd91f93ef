//! The agent's supervision loop. Every source (rank output, heartbeats, signals, ticks, workers that finished)
//! becomes an [`Event`]; the loop feeds the pure detector and the pure [`Policy`], and carries out the policy's
//! actions in workers (roll call + evidence + alert, termination) that report back as events. The loop itself
//! never waits on anything but its event channel, and never prints except through [`crate::human`].
//!
//! Here: the run's config and outcome, the loop, its events and ticks. Its setup is in `start`, what its actions
//! start in `acts`, the progress it takes in `progress`, how the run ends in `ending`; the processes are read by
//! the `Sampler` (sampler.rs), the workers run through `Workers` (workers.rs).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hangwatch_diagnosis::{
    fast_path_due, ActivityRule, Detector, DetectorConfig, ProgressSource, Threshold,
};
use hangwatch_inspect::prepared::PreparedStacks;
use hangwatch_inspect::probe::Prober;
use hangwatch_inspect::pystack::StackReadOptions;
use hangwatch_inspect::rollcall::{KnownProcess, RollCallOptions};
use hangwatch_model::{unix_now, NodeObservations, RankSource, Verdict};
use hangwatch_proc::ProcFs;
use nix::sys::signal::Signal;

use crate::events::LinkEvent;
pub use crate::events::{Event, Investigation, EVENT_CAPACITY};
use crate::evidence::{RunRecord, ThresholdsRecord};
use crate::heartbeat::HeartbeatContext;
use crate::human::say;
use crate::investigation::{self, InvestigationJob};
use crate::kernel_log::KernelLog;
use crate::launch::{launch, LaunchSpec, Launched};
use crate::link::{Answers, Link, LinkConfig};
use crate::members::JobMembers;
use crate::output::{Console, DrainContext, Drains, LineSink, Stream, Tails};
use crate::policy::{Action, Ending, Input, Notice, Policy, PolicyConfig, Trigger};
use crate::progress::ProgressBoard;
use crate::reaper::Reaper;
pub use crate::sampler::shell_code;
use crate::sampler::{unix_time_of, wait_in_background, JobProc, Sampler, SamplerParts};
use crate::sources::{install_signals, runtime_dir};
use crate::terminate::{held_pids, report_termination, stuck_pids, TerminationReport};
use crate::workers::{Threads, Workers};
use hangwatch_alert::{Alert, Alerter, Stage};
pub use hangwatch_diagnosis::{is_conclusive, OnHang};
use hangwatch_model::StallTier;

/// Exit code when hangwatch ended a hung job (EX_TEMPFAIL: retryable).
pub use hangwatch_model::exit::EXIT_HUNG;

/// Everything the loop needs.
pub struct RunConfig {
    pub launch: LaunchSpec,
    pub detector: DetectorConfig,
    pub on_hang: OnHang,
    /// SIGTERM -> SIGKILL; also how long a job has to end after a forwarded signal.
    pub grace: Duration,
    /// After SIGKILL, how long before a survivor is called unkillable.
    pub kill_wait: Duration,
    /// Node-local and private; created by the caller (`run` and `demo` open it through safefs before the job
    /// starts), never touched here but through the abandonable evidence writer.
    pub report_dir: PathBuf,
    /// Mirror rank output to hangwatch's stdout/stderr (stdout to stderr with `--json`).
    pub console: Option<bool>,
    pub prefix: bool,
    pub sink: Option<Arc<dyn LineSink>>,
    pub tick: Duration,
    pub window: Duration,
    pub stack_timeout: Duration,
    pub probe_timeout: Duration,
    pub node: Option<String>,
    /// The job's id for alerts (Slurm's, `--job-id`).
    pub job_id: Option<String>,
    /// Where alerts about this node's own verdicts go (with a coordinator, it alerts for the job).
    pub alerter: Arc<Alerter>,
    /// The node's verdict history (SQLite): each verdict kept as evidence is recorded there, and says how often
    /// its cause was seen before. `None`: not recorded.
    pub history_db: Option<PathBuf>,
    /// The fleet database each recorded verdict is shipped to, and its cause looked up in across nodes and
    /// jobs (docs/history.md); `None`: this node's history only.
    pub history_fleet: Option<hangwatch_history::FleetTarget>,
    /// A rank that failed while its peers go on: how long before that is treated as a hang.
    pub failed_rank_grace: Duration,
    /// The fast path (`--fs-stall`): a rank in a filesystem wait (or stopped) with its I/O still this long, while
    /// the job makes no progress, gets a roll call whatever the thresholds say; zero turns it off.
    pub fs_stall: Duration,
    /// The job's coordinator (multi-node): while it is reachable it decides about hangs from every node's view;
    /// without it (or while it is gone) this node decides alone.
    pub coordinator: Option<LinkConfig>,
    /// Prometheus metrics (`--metrics`, `--metrics-textfile`), fed every tick.
    pub metrics: Option<Arc<hangwatch_metrics::AgentMetrics>>,
    /// Put hangwatch's bootstrap first on the ranks' `PYTHONPATH` (beats on optimizer steps, checkpoint phases:
    /// [`crate::instrument`]); off: the ranks' environment is left as it is.
    pub instrument: bool,
    /// Which kernel-log lines the evidence keeps (`--kernel-log`); `None`: the job's alone when hangwatch is root
    /// and the attached processes are another user's, else every line ([`crate::kernel_log::KernelLogKeeping`]).
    pub kernel_log: Option<crate::kernel_log::KernelLogScope>,
    /// Where only the job's lines are kept: also keep the whole log, root's alone, in
    /// [`crate::kernel_log::ROOT_KERNEL_LOG`] (`--keep-kernel-log`).
    pub keep_kernel_log: bool,
}

/// How the run ended.
#[derive(Debug)]
pub struct RunOutcome {
    pub exit_code: i32,
    /// The verdict of the hang hangwatch acted on (or observed last).
    pub verdict: Option<Verdict>,
    pub bundle: Option<PathBuf>,
    pub termination: Option<TerminationReport>,
    pub interrupted_by: Option<i32>,
    /// The furthest step any rank reported (`hangwatch.beat(step)`), for `--action requeue`'s restart budget.
    pub last_step: Option<u64>,
}

/// Errors that stop `run` before or outside the job.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),
    #[error("cannot open the heartbeat socket {path}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),
    #[error("cannot start the thread that drains the ranks' output")]
    Drains(#[source] std::io::Error),
    #[error(
        "cannot watch process {pid}: {reason} (is it running, and may this user read /proc/{pid}?)"
    )]
    Attach { pid: i32, reason: String },
}

struct Supervisor {
    config: RunConfig,
    /// Where the actions' workers run and signals go.
    workers: Box<dyn Workers>,
    /// The job's processes and what is read of them each tick.
    sampler: Sampler,
    detector: Detector,
    policy: Policy,
    start: Instant,
    kernel_log: KernelLog,
    tails: Arc<Tails>,
    console: Option<Console>,
    events: SyncSender<Event>,
    board: Arc<ProgressBoard>,
    members: Arc<JobMembers>,
    /// The verdict of the last roll call, and the one acted on.
    last_verdict: Option<Verdict>,
    bundle: Option<PathBuf>,
    termination: Option<TerminationReport>,
    heartbeats: Arc<crate::heartbeat::HeartbeatStats>,
    program: PathBuf,
    /// The furthest step any rank reported.
    last_step: Option<u64>,
    link: Option<Link>,
    beat_slots: Option<crate::beats::BeatSlots>,
    last_slot_look: Option<Instant>,
    /// Events the loop gives itself (a worker thread that could not start reports its failure): kept here, never
    /// sent into the channel that only this thread drains, where a full queue would block it on itself.
    own_events: VecDeque<Event>,
    /// Joined to the coordinator now: it decides about hangs, this node reports.
    linked: bool,
    /// This node's observations from the last roll call the coordinator ordered.
    ordered_observations: Option<NodeObservations>,
    /// The coordinator's order, when one came: the job-wide verdict is this node's final word.
    ordered_verdict: Option<Verdict>,
    /// Progress over time, for the evidence's `progress.json`.
    timeline: crate::timeline::TimelineRecorder,
    /// Where a dead rank's story is read from: the kernel log, its output, its memory cgroup, the core pattern.
    witnesses: crate::death::Witnesses,
    /// Where roll calls ask the ranks for their Flight Recorder.
    collectives: Option<Arc<crate::collectives::CollectivesDesk>>,
    /// The causes this run recorded in the history: one row per cause and run.
    recorded: crate::history::RecordedThisRun,
    /// The looks of the current stall and the holds of the run (`thresholds.json`, the words of a late verdict).
    stall_log: crate::stall_log::StallLog,
    /// The `thresholds.json` last handed to a roll call's evidence: written again at the end with the holds.
    kept_thresholds: Option<ThresholdsRecord>,
    /// Why the verdict that ended the job came late, when it did.
    late: Option<crate::stall_log::LateRecord>,
}

/// Runs the job to its end. Never returns while a rank it can still end is alive, and never waits on one it
/// cannot end.
pub fn run(config: RunConfig) -> Result<RunOutcome, RunError> {
    let (mut sup, rx, wiring) = Supervisor::start(config)?;
    let outcome = sup.run_loop(&rx);
    if let Some(link) = sup.link.take() {
        let exits = sup.sampler.rank_exits();
        link.leave(outcome.exit_code, exits);
    }
    sup.sampler.release();
    // The last lines of a job that ended are still in its pipes: let the drain threads finish, briefly (a
    // grandchild that keeps a pipe open must not hold hangwatch).
    let linger = if outcome.exit_code == EXIT_HUNG {
        // An unkillable rank keeps its pipe open forever: do not wait for it.
        Duration::from_millis(300)
    } else {
        Duration::from_secs(2)
    };
    let until = Instant::now() + linger;
    while wiring.streams_open() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    wiring.close();
    if let Some(console) = &sup.console {
        if console.dropped() > 0 {
            tracing::warn!(
                lines = console.dropped(),
                "the console could not keep up; lines were dropped there (the log file has them)"
            );
        }
    }
    Ok(outcome)
}

/// How long ranks seen computing without progress hold the hard tier back: until `--max-stall` (the detector's
/// ceiling), unless the user fixed the threshold (`--stall-after`: their word that no silence lasts longer).
pub fn activity_rule(detector: &DetectorConfig) -> ActivityRule {
    match detector.fixed {
        Some(_) => ActivityRule::never(),
        None => ActivityRule::until(detector.ceiling),
    }
}

/// The policy for `config`.
fn policy_of(config: &RunConfig) -> Policy {
    Policy::new(PolicyConfig {
        on_hang: config.on_hang,
        grace: config.grace,
        failed_rank_grace: config.failed_rank_grace,
        inspect_budget: inspect_budget(config),
        activity: activity_rule(&config.detector),
        attached: !config.launch.attach.is_empty(),
    })
}

/// How long a signal may be held back while a stuck job's evidence is taken: the roll call's own deadlines
/// (two /proc samples, stacks, a probe), bounded so that grace + this stays well inside Slurm's KillWait (30 s).
fn inspect_budget(config: &RunConfig) -> Duration {
    (config.window + config.stack_timeout + config.probe_timeout + Duration::from_secs(1))
        .min(Duration::from_secs(8))
}

/// The loop's next event: one it gave itself first (it is the consequence of what the loop just did), else one
/// from the channel within `wait`.
fn next_event(
    own: &mut VecDeque<Event>,
    rx: &Receiver<Event>,
    wait: Duration,
) -> Result<Event, RecvTimeoutError> {
    match own.pop_front() {
        Some(event) => Ok(event),
        None => rx.recv_timeout(wait),
    }
}

impl Supervisor {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn since_start(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.start)
    }

    fn run_loop(&mut self, rx: &Receiver<Event>) -> RunOutcome {
        let mut next_tick = Instant::now();
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match next_event(&mut self.own_events, rx, wait) {
                Ok(event) => {
                    if let Some(outcome) = self.handle_event(event) {
                        return outcome;
                    }
                    // Events that keep coming must not hold the tick back.
                    if Instant::now() < next_tick {
                        continue;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => std::thread::sleep(wait),
            }
            next_tick = Instant::now() + self.config.tick;
            if let Some(outcome) = self.tick() {
                return outcome;
            }
        }
    }

    fn handle_event(&mut self, event: Event) -> Option<RunOutcome> {
        let input = match event {
            Event::Phase(phase) => {
                // The rank's beats before this phase message come first.
                self.take_progress();
                let at = self.since_start(phase.at);
                if phase.begin {
                    self.detector.phase_begin(phase.rank, &phase.name, at);
                } else {
                    self.detector.phase_end(phase.rank, &phase.name, at);
                }
                return None;
            }
            Event::Signal(signal) => {
                let now = self.now();
                let stalled_for = self.detector.stalled_for(now);
                let stuck = match self.detector.usual_step() {
                    Some(usual) => stalled_for > usual.max(Duration::from_secs(1)),
                    None => stalled_for >= self.detector.threshold().soft,
                };
                tracing::info!(
                    signal,
                    stuck,
                    stalled_for_s = stalled_for.as_secs_f64(),
                    "signal received"
                );
                Input::Signal { signal, stuck }
            }
            Event::Investigated(investigation) => {
                let Investigation {
                    trigger,
                    verdict,
                    evidence,
                } = *investigation;
                match evidence {
                    Some(Ok(dir)) => {
                        say(format!("hangwatch: evidence in {}", dir.display()));
                        self.bundle = Some(dir);
                    }
                    Some(Err(why)) => {
                        tracing::warn!(reason = %why, "the evidence bundle is incomplete");
                        say(format!("hangwatch: warning: {why}"));
                    }
                    None => {}
                }
                let active = verdict.activity.is_some();
                let stalled_for = self.detector.stalled_for(self.now());
                self.stall_log.look_finished(trigger, stalled_for, active);
                // Before any threshold (the fast path): only a mount that does not answer (or a stopped rank) will do.
                let conclusive = hangwatch_diagnosis::acts_on(
                    &verdict,
                    trigger == Trigger::FsStall,
                    is_conclusive,
                );
                if let Some(m) = &self.config.metrics {
                    m.verdict(verdict.kind)
                }
                self.last_verdict = Some(verdict);
                Input::RollCallDone {
                    trigger,
                    conclusive,
                    active,
                }
            }
            Event::Discovered(found) => {
                self.sampler.ranks_found(found, &mut self.detector);
                return None;
            }
            Event::ClientRank(report) => {
                self.sampler.client_rank(report);
                return None;
            }
            Event::Observed(observations) => {
                self.ordered_observations = Some(*observations);
                return None;
            }
            Event::Container(event) => {
                self.container_event(event);
                return None;
            }
            // Most link events are only said; an order becomes the policy's input.
            Event::Link(event) => self.link_event(event)?,
            Event::Terminated(report) => {
                if self.termination.is_none() {
                    self.termination = Some(report);
                }
                Input::Terminated
            }
        };
        let now = self.now();
        let actions = self.policy.handle(input, now);
        self.carry_out(actions)
    }

    /// The finder's answer about a container client's container: its processes are watched as the ranks, or the
    /// client alone is, said so.
    fn container_event(&mut self, event: crate::container::ContainerEvent) {
        match event {
            crate::container::ContainerEvent::Found(container) => {
                say(format!(
                    "hangwatch: the job runs in {}: its processes are the ranks (its first process is pid {} on this node)",
                    container.words(),
                    container
                        .host_pid
                        .map_or_else(|| "unknown".to_string(), |p| p.to_string())
                ));
                self.sampler.watch_container(*container);
            }
            crate::container::ContainerEvent::NotFound(why) => {
                tracing::warn!(reason = %why, "the job's container was not found");
                say(format!(
                    "hangwatch: warning: the job's container was not found ({why}): only its client is watched"
                ));
            }
        }
    }

    /// What the coordinator link said; the policy's input when it is one.
    fn link_event(&mut self, event: LinkEvent) -> Option<Input> {
        let addr = self
            .config
            .coordinator
            .as_ref()
            .map(|c| c.addr.clone())
            .unwrap_or_default();
        match event {
            LinkEvent::Joined { rejoined, .. } => {
                self.linked = true;
                let (node, node_rank) = self
                    .config
                    .coordinator
                    .as_ref()
                    .map(|c| (c.node.clone(), c.node_rank))
                    .unwrap_or_default();
                say(format!(
                    "hangwatch: {} the coordinator at {addr} as node {node} (node rank {node_rank}): hangs are decided there, from every node's view",
                    if rejoined { "rejoined" } else { "joined" }
                ));
                None
            }
            LinkEvent::Lost { why } => {
                self.linked = false;
                say(format!(
                    "hangwatch: lost the coordinator at {addr} ({why}); this node decides alone until it is back"
                ));
                None
            }
            LinkEvent::Refused { why } => {
                self.linked = false;
                say(format!(
                    "hangwatch: error: the coordinator at {addr} refused this node: {why}; this node decides alone"
                ));
                None
            }
            LinkEvent::NotTheJobs { why } => {
                self.linked = false;
                say(format!(
                    "hangwatch: error: cannot join the coordinator: {why}; check that every node has the same token \
                     file and job id; this node decides alone"
                ));
                None
            }
            LinkEvent::RollCallOrdered {
                roll_call_id,
                deadline,
                probe_mounts,
            } => {
                if let Some(link) = &self.link {
                    let answers = link.answers();
                    self.start_ordered_roll_call(roll_call_id, deadline, probe_mounts, answers);
                }
                None
            }
            LinkEvent::TerminateOrdered { reason, verdict } => {
                let verdict = verdict.map_or_else(|| Verdict::unknown(&reason), |v| *v);
                say(format!(
                    "hangwatch: the coordinator ends the job: {}",
                    crate::render::verdict_text(&verdict)
                ));
                self.last_verdict = Some(verdict.clone());
                self.ordered_verdict = Some(verdict);
                Some(Input::TerminateOrdered)
            }
        }
    }

    fn tick(&mut self) -> Option<RunOutcome> {
        self.take_progress();
        let now = self.now();
        self.feed_metrics(now);
        let snapshot = self
            .sampler
            .tick(&mut self.detector, now, self.config.fs_stall);
        let job_alive = snapshot.job_alive;
        let mut stall = self.detector.check(now).tier();
        let mut failed_rank_for = snapshot.failed_rank_for;
        let mut fs_stuck = fast_path_due(
            snapshot.fs_stuck,
            self.detector.stalled_for(now),
            self.config.fs_stall,
        )
        .is_some();
        if let Some(link) = &self.link {
            let failed =
                job_alive && failed_rank_for.is_some_and(|f| f >= self.config.failed_rank_grace);
            let tier = if failed { StallTier::Hard } else { stall };
            link.stall(tier, self.detector.stalled_for(now), fs_stuck);
            if self.linked {
                // The coordinator decides about hangs from every node's view; this node only reports.
                stall = StallTier::Healthy;
                failed_rank_for = None;
                fs_stuck = false;
            }
        }
        if self.sampler.attached_without_ranks() {
            // A watched tree with no rank in it (a batch script waiting for its srun step, a non-Python job) is
            // not a training job to judge: its silence is not a hang, and nobody named could be the culprit.
            stall = StallTier::Healthy;
            failed_rank_for = None;
            fs_stuck = false;
        }
        let only_stuck_left = job_alive
            && self.policy.interrupted_by().is_some()
            && self.sampler.only_stuck_left(&stuck_pids(
                self.last_verdict.as_ref(),
                self.config.node.as_deref(),
            ));
        if let Some(m) = &self.config.metrics {
            m.set_computing_without_progress(self.policy.computing_without_progress());
        }
        let actions = self.policy.handle(
            Input::Tick {
                stall,
                failed_rank_for,
                job_alive,
                only_stuck_left,
                fs_stuck,
                stalled_for: self.detector.stalled_for(now),
            },
            now,
        );
        self.carry_out(actions)
    }

    /// Starts each action's worker (or does what takes no time); `Some` when the run is over.
    fn carry_out(&mut self, actions: Vec<Action>) -> Option<RunOutcome> {
        for action in actions {
            match action {
                Action::Say(notice) => {
                    self.record_notice(&notice);
                    say(self.notice_text(&notice));
                }
                Action::RollCall(Trigger::Ordered) => self.start_ordered_evidence(),
                Action::RollCall(Trigger::PostMortem) => self.start_post_mortem(),
                Action::RollCall(trigger) => self.start_investigation(trigger),
                Action::Forward(signal) => {
                    let forward = Signal::try_from(signal).unwrap_or(Signal::SIGTERM);
                    let live = self.sampler.live_groups();
                    self.workers.signal_groups(&live, forward);
                }
                Action::Terminate { kill_now } => self.start_termination(kill_now),
                Action::AlertComputing => self.alert_computing(),
                Action::Finish(ending) => return Some(self.finish(ending)),
            }
        }
        None
    }

    /// Keeps what a notice says about a hold; before the job is ended, says why the verdict came late when it did.
    fn record_notice(&mut self, notice: &Notice) {
        use crate::stall_log::HoldEnd;
        let now = self.now();
        match notice {
            Notice::Computing => {
                if let Some(activity) = self.last_verdict.as_ref().and_then(|v| v.activity.clone())
                {
                    let stalled_for = self.detector.stalled_for(now);
                    self.stall_log
                        .hold_said(now, unix_now(), stalled_for, activity);
                }
            }
            Notice::ProgressResumed => self.stall_log.progress(now),
            Notice::WorkStopped => self.stall_log.hold_ended(now, HoldEnd::WorkStopped),
            Notice::MaxStallPassed => self.stall_log.hold_ended(now, HoldEnd::MaxStall),
            Notice::EndingJob { .. } => {
                self.stall_log.ending(now);
                let threshold = self.detector.threshold();
                let due = match self.stall_log.looks().last().map(|l| l.trigger) {
                    Some(Trigger::Soft) => threshold.soft,
                    _ => threshold.hard,
                };
                self.late = crate::stall_log::late(
                    due,
                    self.stall_log.looks(),
                    self.stall_log.last_hold_words(),
                    activity_rule(&self.config.detector).recheck,
                );
                if let Some(late) = &self.late {
                    say(format!("hangwatch: {}", late.words));
                }
            }
            _ => {}
        }
    }

    fn notice_text(&self, notice: &Notice) -> String {
        match notice {
            Notice::ProgressResumed => "hangwatch: progress resumed".into(),
            Notice::InspectingBeforeSignal { signal } => format!(
                "hangwatch: signal {signal} while the job makes no progress: keeping the evidence first (at most {:.0}s), then passing it on",
                inspect_budget(&self.config).as_secs_f64()
            ),
            Notice::ForwardingSignal { signal } => format!(
                "hangwatch: passing signal {signal} on to the job; it has {:.0}s to end (signal again to kill it now)",
                self.config.grace.as_secs_f64()
            ),
            Notice::LeavingJob { signal } => format!(
                "hangwatch: signal {signal}: no longer watching; the job was not started by hangwatch and is left as it is"
            ),
            Notice::GraceOver { signal } => format!(
                "hangwatch: the job did not end within {:.0}s of signal {signal}: killing it",
                self.config.grace.as_secs_f64()
            ),
            Notice::OnlyStuckLeft { signal } => format!(
                "hangwatch: after signal {signal} only processes blocked in the kernel are left: killing them now (they cannot act on it)"
            ),
            Notice::SecondSignal => "hangwatch: second signal: killing the job now".into(),
            Notice::EndingJob { grace } => {
                let mut line = format!(
                    "hangwatch: ending the job: SIGTERM, {:.0}s grace, then SIGKILL",
                    grace.as_secs_f64()
                );
                let verdict = self.last_verdict.as_ref();
                let held = held_pids(verdict, self.config.node.as_deref());
                if !held.is_empty() && !grace.is_zero() {
                    let ranks: Vec<u32> = verdict
                        .map(|v| {
                            v.ranks
                                .iter()
                                .filter(|r| held.contains(&r.at.pid))
                                .filter_map(|r| r.at.rank)
                                .collect()
                        })
                        .unwrap_or_default();
                    let who = match ranks.len() {
                        0 => format!("{} processes", held.len()),
                        _ => hangwatch_model::ranks_words(&ranks),
                    };
                    line.push_str(&format!(
                        " (no grace is spent on {who}: waiting in a collective behind a rank stuck in the \
                         kernel, a SIGTERM handler of theirs cannot run)"
                    ));
                }
                line
            }
            Notice::Computing => format!(
                "hangwatch: {}",
                crate::render::computing_text(
                    self.detector.stalled_for(self.now()),
                    self.last_verdict.as_ref().and_then(|v| v.activity.as_ref()),
                    self.policy.max_stall(),
                )
            ),
            Notice::WorkStopped => format!("hangwatch: {}", crate::render::WORK_STOPPED_TEXT),
            Notice::MaxStallPassed => format!(
                "hangwatch: {}",
                crate::render::max_stall_text(self.detector.stalled_for(self.now()))
            ),
        }
    }
}

mod acts;
mod ending;
mod progress;
mod start;
#[cfg(test)]
mod tests;
