//! The roll call worker: what it copies out of the loop ([`InvestigationJob`]), the roll call itself, this
//! node's verdict, the evidence (written by an abandonable child), the history and the alert. It reports back to
//! the loop as [`Event::Investigated`] (or [`Event::Observed`] for a roll call the coordinator ordered).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hangwatch_alert::{Alert, Alerter, Stage};
use hangwatch_diagnosis::{decide, DecideOptions};
use hangwatch_inspect::probe::{ProbeOptions, Prober};
use hangwatch_inspect::rollcall::{take_roll_call, KnownProcess, RollCallOptions};
use hangwatch_model::{unix_now, CollectiveRecord, NodeObservations, ProcessObservation, Verdict};
use hangwatch_proc::ProcFs;

use crate::events::{Event, Investigation};
use crate::evidence::{write_abandonable, Evidence, RunRecord, ThresholdsRecord};
use crate::human::say;
use crate::link::Answers;
use crate::policy::Trigger;

/// How long the evidence writer may take before it is abandoned (a report directory on a frozen filesystem).
pub(crate) const EVIDENCE_DEADLINE: Duration = Duration::from_secs(5);

/// How long a roll call waits for the ranks' Flight Recorders, from the moment it asked (it reads /proc meanwhile):
/// a rank's thread answers in milliseconds unless the rank holds the GIL, and then it never would.
const COLLECTIVES_DEADLINE: Duration = Duration::from_secs(1);

/// Collectives kept per process group and rank in the observations: the analysis needs the last few, and at the
/// coordinator of a 10,000-rank job each one kept costs about 0.7 MB (crates/diagnosis/benches/collectives.rs).
const COLLECTIVES_KEPT: usize = 8;

/// How long recording a verdict in the node's history may take (typically 20-50 ms): it comes before the
/// evidence and the alert, which say how often the cause was seen, so a locked database costs at most this. With a
/// fleet database the child gives that at most its own deadline (2 s) of these, then answers with the node's own.
const HISTORY_DEADLINE: Duration = Duration::from_secs(3);

/// A roll call to take in a worker, with everything copied out of the loop.
pub(crate) struct InvestigationJob {
    pub(crate) trigger: Trigger,
    pub(crate) stalled_for_s: f64,
    pub(crate) pids: Vec<i32>,
    pub(crate) known: HashMap<i32, KnownProcess>,
    pub(crate) options: RollCallOptions,
    pub(crate) probe_timeout: Duration,
    pub(crate) prober: Arc<Mutex<Option<Prober>>>,
    pub(crate) thresholds: ThresholdsRecord,
    pub(crate) timeline: hangwatch_model::ProgressTimeline,
    pub(crate) run: RunRecord,
    pub(crate) kernel_log: String,
    pub(crate) kernel_log_unavailable: Option<String>,
    /// Which kernel-log lines the evidence keeps.
    pub(crate) kernel_log_keeping: crate::kernel_log::KernelLogKeeping,
    pub(crate) tails: Vec<(String, Vec<String>)>,
    pub(crate) report_dir: PathBuf,
    pub(crate) program: PathBuf,
    pub(crate) alerter: Arc<Alerter>,
    pub(crate) history_db: Option<PathBuf>,
    pub(crate) history_fleet: Option<hangwatch_history::FleetTarget>,
    pub(crate) job_id: Option<String>,
    pub(crate) node: Option<String>,
    /// The ranks hangwatch started that have exited, with how.
    pub(crate) dead: Vec<crate::death::DeadRank>,
    pub(crate) witnesses: crate::death::Witnesses,
    /// Where the ranks are asked for their Flight Recorder (none in the loop's unit tests).
    pub(crate) collectives: Option<Arc<crate::collectives::CollectivesDesk>>,
    /// The causes this run recorded in the history already.
    pub(crate) recorded: crate::history::RecordedThisRun,
    /// The container the ranks run in (a container client's job), named in the verdict.
    pub(crate) container: Option<hangwatch_model::ContainerRef>,
}

impl InvestigationJob {
    /// Roll call, a verdict of this node alone, evidence, alert.
    pub(crate) fn run(self) -> Investigation {
        let mut observations = self.observe();
        self.explain_deaths(&mut observations);
        let verdict = decide(
            std::slice::from_ref(&observations),
            &DecideOptions {
                stalled_for_s: Some(self.stalled_for_s),
                expected_nodes: Vec::new(),
                answered_late: Vec::new(),
            },
        );
        if self.trigger == Trigger::Recheck {
            // A hold's periodic look: the evidence of the first look stands; a look that sees the work stopped
            // is confirmed by another (ConfirmStop), whose evidence is kept.
            return Investigation {
                trigger: self.trigger,
                verdict,
                evidence: None,
            };
        }
        say(crate::render::verdict_text(&verdict));
        // Ranks that compute are no hang: no "looks hung" alert (the policy says once that it holds back). Nor is
        // a fast-path look whose filesystem answers (a long write to a slow mount): the thresholds decide then, and
        // alert when they are passed.
        let alert = verdict.activity.is_none()
            && (self.trigger != Trigger::FsStall
                || hangwatch_diagnosis::is_confirmed_stuck(&verdict));
        self.keep(verdict, &observations, alert)
    }

    /// The job is over: every rank exited (nothing is left to read in /proc). The verdict names the first to fail
    /// and how it died; the kernel log and the output kept are those after its death settled.
    pub(crate) fn post_mortem(mut self) -> Investigation {
        let mut observations = NodeObservations::new(self.node.clone(), 0);
        observations.observed_at_unix_s = Some(unix_now());
        observations.ranks = self
            .pids
            .iter()
            .map(|&pid| {
                let known = self.known.get(&pid).cloned().unwrap_or_default();
                ProcessObservation {
                    pid,
                    rank: known.rank,
                    node: self.node.clone(),
                    exited: true,
                    exit_code: known.exit_code,
                    exited_at_unix_s: known.exited_at_unix_s,
                    ..Default::default()
                }
            })
            .collect();
        self.explain_deaths(&mut observations);
        self.kernel_log = self.witnesses.kernel_log.text();
        self.tails = self.witnesses.tails.snapshot();
        if self.kernel_log_unavailable.is_none() {
            observations.kernel_log = Some(hangwatch_kmsg::report_from_text(&self.kernel_log));
        }
        let verdict = decide(
            std::slice::from_ref(&observations),
            &DecideOptions {
                stalled_for_s: None,
                expected_nodes: Vec::new(),
                answered_late: Vec::new(),
            },
        );
        say(crate::render::verdict_text(&verdict));
        self.keep(verdict, &observations, false)
    }

    /// Says how each rank that hangwatch started and reaped died, on its observation.
    fn explain_deaths(&self, observations: &mut NodeObservations) {
        for dead in &self.dead {
            if let Some(o) = observations.ranks.iter_mut().find(|o| o.pid == dead.pid) {
                o.death = Some(self.witnesses.explain(dead));
            }
        }
    }

    /// This node's observations now: the rank processes, their threads, stacks and files, the filesystems they
    /// wait on (probed), the kernel log.
    pub(crate) fn observe(&self) -> NodeObservations {
        let procfs = ProcFs::new("/proc");
        // Asked first, answered while /proc is read.
        let asked = self
            .collectives
            .as_ref()
            .map(|desk| (desk.ask(&self.pids), Instant::now()));
        let probe_timeout = self.probe_timeout;
        let prober = Arc::clone(&self.prober);
        let rollcall = take_roll_call(&procfs, &self.pids, &self.known, &self.options, |mounts| {
            let mut guard = prober.lock().unwrap_or_else(|e| e.into_inner());
            let Some(prober) = guard.as_mut() else {
                return Vec::new();
            };
            let options = ProbeOptions {
                timeout: probe_timeout,
                write: true,
            };
            prober
                .probe_targets(mounts, &options)
                .into_iter()
                .filter_map(Result::ok)
                .collect()
        });
        tracing::debug!(
            took_ms = rollcall.elapsed.as_millis() as u64,
            stacks_prepared = rollcall.stacks_prepared,
            "roll call done"
        );
        let mut observations = rollcall.observations;
        if self.kernel_log_unavailable.is_none() {
            observations.kernel_log = Some(hangwatch_kmsg::report_from_text(&self.kernel_log));
        }
        if let (Some(desk), Some((asked, at))) = (&self.collectives, asked) {
            let answers = desk.collect(&asked, at + COLLECTIVES_DEADLINE);
            self.file_collectives(&mut observations, &asked.pids, &answers);
        }
        observations
    }

    /// The Flight Recorder records that came back, by rank; a rank whose number is not known cannot be placed in
    /// its groups and is left out.
    fn file_collectives(
        &self,
        observations: &mut NodeObservations,
        asked: &[i32],
        answers: &HashMap<i32, Vec<u8>>,
    ) {
        let rank_of = |pid: &i32| self.known.get(pid).and_then(|k| k.rank);
        observations.collectives_asked = asked.iter().filter_map(rank_of).collect();
        for (pid, json) in answers {
            let Some(rank) = rank_of(pid) else { continue };
            match CollectiveRecord::from_flight_recorder_json(rank, json, COLLECTIVES_KEPT) {
                Ok(record) => observations.collectives.push(record),
                Err(e) => observations
                    .unreadable
                    .push(format!("rank {rank}'s Flight Recorder: {e}")),
            }
        }
        self.file_own_dumps(observations);
        observations.collectives.sort_by_key(|r| r.rank);
    }

    /// For the ranks that gave no record: the dump the job wrote itself, when it wrote one since it started
    /// (`own_dumps`: one child under a deadline looks for them all).
    fn file_own_dumps(&self, observations: &mut NodeObservations) {
        let mut ranks: Vec<u32> = self.known.values().filter_map(|k| k.rank).collect();
        ranks.sort_unstable();
        ranks.dedup();
        ranks.retain(|rank| !observations.collectives.iter().any(|r| r.rank == *rank));
        if ranks.is_empty() {
            return;
        }
        let prefix = crate::own_dumps::prefix(|k| std::env::var(k).ok());
        let owner = match crate::own_dumps::job_uid(&ProcFs::new("/proc"), &self.pids) {
            Ok(uid) => uid,
            Err(why) => {
                observations
                    .unreadable
                    .push(format!("the job's own Flight Recorder dumps: {why}"));
                return;
            }
        };
        // A little before the job started: the clocks of /proc and of the filesystem differ by a second or so.
        let since = (unix_now() - self.run.running_for_s - 5.0).max(0.0) as u64;
        // The prefix is read from a rank's environment, which a rank stuck in the kernel may keep locked: those
        // last.
        let stuck = |pid: &i32| {
            observations
                .ranks
                .iter()
                .find(|o| o.pid == *pid)
                .is_some_and(|o| o.threads.iter().any(|t| t.state == 'D'))
        };
        let mut prefix_from: Vec<i32> = self.pids.clone();
        prefix_from.sort_by_key(stuck);
        let found = crate::own_dumps::read(
            &self.program,
            &prefix_from,
            &prefix,
            &ranks,
            since,
            owner,
            COLLECTIVES_KEPT,
        );
        for record in found.records {
            // Its record is in: it counts among the ranks the analysis heard from.
            if !observations.collectives_asked.contains(&record.rank) {
                observations.collectives_asked.push(record.rank);
            }
            observations.collectives.push(record);
        }
        observations.unreadable.extend(
            found
                .problems
                .into_iter()
                .map(|p| format!("the job's own Flight Recorder dumps: {p}")),
        );
    }

    /// Writes the evidence of `verdict` with this node's `observations` (abandonable), and alerts when asked.
    pub(crate) fn keep(
        mut self,
        mut verdict: Verdict,
        observations: &NodeObservations,
        alert: bool,
    ) -> Investigation {
        if verdict.container.is_none() {
            verdict.container = self.container.clone();
        }
        // The history counts hangs: ranks seen computing are not one.
        if verdict.activity.is_none() {
            verdict.recurrence = self.record_history(&verdict);
        }
        // Other jobs or nodes blocked on the same mount in the last minutes: a storage incident, which one node
        // alone could not tell.
        if let Some(incident) = verdict
            .recurrence
            .as_ref()
            .and_then(|r| r.incident.as_ref())
        {
            let sightings = incident.sightings(Some(unix_now()));
            hangwatch_diagnosis::apply_scope(&mut verdict, &sightings);
        }
        self.run.rollcall = crate::evidence::RollCallRecord::of(observations);
        let processes: Vec<ProcessObservation> = observations.processes().cloned().collect();
        let (kernel_log_scope, keep_whole_kernel_log) = match &self.kernel_log_keeping {
            crate::kernel_log::KernelLogKeeping::All => (None, false),
            crate::kernel_log::KernelLogKeeping::Job { uid, keep_whole } => (
                Some(crate::evidence::job_scope(
                    &self.pids,
                    &processes,
                    &observations.probes,
                    *uid,
                )),
                *keep_whole,
            ),
        };
        let evidence = Evidence {
            verdict: &verdict,
            observations: &processes,
            probes: &observations.probes,
            thresholds: &self.thresholds,
            timeline: &self.timeline,
            kernel_log: &self.kernel_log,
            kernel_log_unavailable: self.kernel_log_unavailable.as_deref(),
            kernel_log_scope: kernel_log_scope.as_ref(),
            keep_whole_kernel_log,
            tails: &self.tails,
            run: &self.run,
        };
        let written = write_abandonable(
            &self.program,
            &self.report_dir,
            &evidence.files(),
            EVIDENCE_DEADLINE,
        )
        .map(|()| self.report_dir.clone())
        .map_err(|e| e.to_string());
        if alert {
            // Sent once the evidence is kept (or given up on), so that the alert can say where it is.
            let mut message = Alert::new(Stage::Suspected, &verdict, unix_now());
            message.job = self.job_id.clone();
            message.node = self.node.clone();
            message.evidence = written.as_ref().ok().map(|dir| {
                format!(
                    "{}:{}",
                    self.node.as_deref().unwrap_or("this node"),
                    dir.display()
                )
            });
            self.alerter.send(&message);
        }
        Investigation {
            trigger: self.trigger,
            verdict,
            evidence: Some(written),
        }
    }
}

impl InvestigationJob {
    /// Records `verdict` in the node's history (an abandonable child, [`HISTORY_DEADLINE`]) and says when its
    /// cause was seen before. `None` when there is no history or it could not be written (a warning).
    fn record_history(&self, verdict: &Verdict) -> Option<hangwatch_model::Recurrence> {
        let db = self.history_db.as_ref()?;
        let fingerprint = hangwatch_history::Fingerprint::of(verdict).key();
        if let Some(earlier) = self.recorded.get(&fingerprint) {
            return Some(earlier);
        }
        let request = hangwatch_history::HistoryRequest::new(
            verdict,
            self.node.clone().unwrap_or_else(|| "this node".into()),
            self.job_id.clone(),
            Some(self.report_dir.clone()),
            unix_now(),
        )
        .with_fleet(self.history_fleet.clone());
        match crate::history::record_abandonable(&self.program, db, &request, HISTORY_DEADLINE) {
            Ok(recurrence) => {
                if let Some(news) = recurrence.news() {
                    say(format!("hangwatch: {news} (hangwatch history)"));
                }
                if let Some(why) = &recurrence.fleet_unavailable {
                    say(format!(
                        "hangwatch: warning: the fleet database did not answer, the recurrence is this node's: {why}"
                    ));
                }
                self.recorded.insert(fingerprint, recurrence.clone());
                Some(recurrence)
            }
            Err(e) => {
                say(format!(
                    "hangwatch: warning: the verdict was not recorded in the history: {e}"
                ));
                None
            }
        }
    }
}

/// Runs `work` in a worker thread named `name` that reports its [`Investigation`] as an event. When the thread
/// cannot start, the failure is returned as the event the loop gives itself (never sent into the channel only
/// the loop drains).
pub(crate) fn spawn(
    events: &SyncSender<Event>,
    trigger: Trigger,
    name: &str,
    work: impl FnOnce() -> Investigation + Send + 'static,
) -> Option<Event> {
    let events = events.clone();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let investigation = work();
            let _ = events.send(Event::Investigated(Box::new(investigation)));
        });
    match spawned {
        Ok(_) => None,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the roll call");
            Some(Event::Investigated(Box::new(Investigation {
                trigger,
                verdict: Verdict::unknown("the roll call could not be started"),
                evidence: Some(Err(format!("cannot start the roll call: {e}"))),
            })))
        }
    }
}

/// A roll call the coordinator ordered, in a worker: this node's observations go back to the coordinator as soon
/// as they are taken, and to the loop as [`Event::Observed`] (kept for this node's evidence).
pub(crate) fn spawn_ordered_roll_call(
    job: InvestigationJob,
    roll_call_id: u64,
    answers: Answers,
    events: SyncSender<Event>,
) {
    let spawned = std::thread::Builder::new()
        .name("hw-ordered".into())
        .spawn(move || {
            let observations = job.observe();
            answers.answer(roll_call_id, observations.clone());
            let _ = events.send(Event::Observed(Box::new(observations)));
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the ordered roll call");
    }
}
