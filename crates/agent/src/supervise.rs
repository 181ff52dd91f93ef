//! The agent's supervision loop. Every source (rank output, heartbeats, signals, ticks, workers that finished)
//! becomes an [`Event`]; the loop feeds the pure detector and the pure [`Policy`], and carries out the policy's
//! actions in workers (roll call + evidence + alert, termination) that report back as events. The loop itself
//! never waits on anything but its event channel, and never prints except through [`crate::human`].

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hangwatch_diagnosis::ranks::RankClaim;
use hangwatch_diagnosis::{
    fast_path_due, thread_blocked, ActivityRule, Blocked, Detector, DetectorConfig, FsStallTracker,
    ProgressSource, RankSample, Threshold,
};
use hangwatch_inspect::prepared::PreparedStacks;
use hangwatch_inspect::probe::Prober;
use hangwatch_inspect::pystack::StackReadOptions;
use hangwatch_inspect::ranks::{ClientReports, Discovery, RankFinder};
use hangwatch_inspect::rollcall::{KnownProcess, RollCallOptions};
use hangwatch_model::{unix_now, NodeObservations, ProcId, RankSource, Verdict};
use hangwatch_proc::ProcFs;
use nix::sys::signal::Signal;

use crate::events::{ClientRank, LinkEvent};
pub use crate::events::{Event, Investigation, EVENT_CAPACITY};
use crate::evidence::{verdict_files, write_abandonable, RunRecord, ThresholdsRecord};
use crate::heartbeat::HeartbeatContext;
use crate::human::say;
use crate::investigation::{self, InvestigationJob, EVIDENCE_DEADLINE};
use crate::kernel_log::KernelLog;
use crate::launch::{launch, LaunchSpec, Launched};
use crate::link::{Answers, Link, LinkConfig};
use crate::members::JobMembers;
use crate::output::{drain, Console, DrainContext, LineSink, Stream, Tails};
use crate::policy::{Action, Ending, Input, Notice, Policy, PolicyConfig, Trigger};
use crate::progress::ProgressBoard;
use crate::reaper::{JobGroup, Reaper};
use crate::terminate::{
    cannot_act_on_term, spawn_termination, stuck_pids, termination_actions, JobProcess,
    TerminationReport,
};
use hangwatch_alert::{Alert, Alerter, Stage};
pub use hangwatch_diagnosis::{is_conclusive, OnHang};
use hangwatch_model::StallTier;

/// Exit code when hangwatch ended a hung job (EX_TEMPFAIL: retryable).
pub use hangwatch_model::exit::EXIT_HUNG;

/// A new set of ranks is given to the stack readers once it has been the same for this long: the interpreters
/// are up by then.
const PREPARE_STACKS_AFTER: Duration = Duration::from_secs(3);

/// How often the identities of the ranks hangwatch started are read again (a wrapper `exec`s the program, a rank
/// moves itself into another cgroup): a dead rank's /proc entry is gone, so its death is explained from these.
const IDENTITY_EVERY: Duration = Duration::from_secs(2);

/// At most this many processes' own reports of their rank are kept (tree mode); only a member inventing
/// processes could get there.
const MAX_CLIENT_RANKS: usize = 65_536;

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
}

/// A process of the job: one hangwatch started, or a rank found below the launcher.
#[derive(Clone)]
struct JobProc {
    /// Filled by the thread that waits for this child: the status and the moment it exited.
    waited: Option<ExitSlot>,
    pid: i32,
    pgid: i32,
    /// Start time (clock ticks since boot): with the pid, who this process is — a reused pid is someone else.
    start: Option<u64>,
    rank: Option<u32>,
    /// Where `rank` came from.
    rank_source: Option<RankSource>,
    exit: Option<ExitStatus>,
    exited_at: Option<Instant>,
    /// Found below a launcher rather than started by hangwatch.
    discovered: bool,
    /// Its memory cgroup, name, executable and directory, read while it lives: what explains its death.
    identity: crate::death::RankIdentity,
}

impl JobProcess for JobProc {
    fn pid(&self) -> i32 {
        self.pid
    }

    fn pgid(&self) -> i32 {
        self.pgid
    }

    fn has_exited(&mut self) -> bool {
        if self.exit.is_some() {
            return true;
        }
        match &self.waited {
            Some(slot) => match *slot.lock().unwrap_or_else(|e| e.into_inner()) {
                Some((status, at)) => {
                    self.exit = Some(status);
                    self.exited_at = Some(at);
                    true
                }
                None => false,
            },
            None => {
                // Not our child: gone, a zombie, or its pid now belongs to a younger process.
                let gone = match ProcFs::new("/proc").stat(self.pid) {
                    Ok(stat) => {
                        stat.state == 'Z' || self.start.is_some_and(|s| s != stat.starttime)
                    }
                    Err(_) => true,
                };
                if gone {
                    self.exited_at.get_or_insert_with(Instant::now);
                }
                gone
            }
        }
    }
}

/// Where a waiter thread leaves a child's exit status and the moment it exited.
type ExitSlot = Arc<Mutex<Option<(ExitStatus, Instant)>>>;

/// Waits for `child` in a thread of its own, so that the order in which ranks exit is known exactly (the first
/// to fail gives the exit code and leads the verdict), not rounded to the supervision tick.
fn wait_in_background(mut child: Child) -> ExitSlot {
    let slot: ExitSlot = Arc::default();
    let theirs = Arc::clone(&slot);
    let spawned = std::thread::Builder::new()
        .name("hw-wait".into())
        .spawn(move || {
            if let Ok(status) = child.wait() {
                *theirs.lock().unwrap_or_else(|e| e.into_inner()) = Some((status, Instant::now()));
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start a thread to wait for a rank");
    }
    slot
}

/// Exit code as shells report it: the code, or 128 + signal.
pub fn shell_code(status: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    }
}

struct Supervisor {
    config: RunConfig,
    procs: Vec<JobProc>,
    tree_mode: bool,
    detector: Detector,
    policy: Policy,
    start: Instant,
    procfs: ProcFs,
    prober: Arc<Mutex<Option<Prober>>>,
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
    last_discovery: Option<Instant>,
    last_activity_sample: Option<Instant>,
    last_blocked_sample: Option<Instant>,
    fs_stall: FsStallTracker,
    last_probe_reap: Option<Instant>,
    activity: HashMap<i32, u64>,
    ranks: Arc<Mutex<RankFinder>>,
    /// What the processes' clients said of their rank (tree mode), by pid and start time.
    client_ranks: ClientReports,
    /// A look for ranks is under way in a worker.
    discovering: bool,
    heartbeats: Arc<crate::heartbeat::HeartbeatStats>,
    reaper: Option<Reaper>,
    groups: Vec<JobGroup>,
    program: PathBuf,
    /// Stack readers kept ready, the rank pids they were last given, and a new set of pids not yet settled.
    stack_readers: Option<PreparedStacks>,
    stack_pids: Vec<i32>,
    stack_candidate: Option<(Vec<i32>, Instant)>,
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
    /// When the identities of the live ranks were last read (see [`IDENTITY_EVERY`]).
    last_identity_look: Option<Instant>,
    /// Where a dead rank's story is read from: the kernel log, its output, its memory cgroup, the core pattern.
    witnesses: crate::death::Witnesses,
}

/// Runs the job to its end. Never returns while a rank it can still end is alive, and never waits on one it
/// cannot end.
pub fn run(config: RunConfig) -> Result<RunOutcome, RunError> {
    let (tx, rx) = sync_channel::<Event>(EVENT_CAPACITY);
    let signals = install_signals(tx.clone()).map_err(RunError::Signals)?;
    // The socket lives in a private node-local directory, never in the report directory: a report directory on a
    // filesystem that froze would block its bind, and its unlink at exit (in D, hangwatch could not exit).
    let runtime = runtime_dir().map_err(|source| RunError::Socket {
        path: std::env::temp_dir(),
        source,
    })?;
    let socket_path = runtime.path().join("hb.sock");
    let board = Arc::new(ProgressBoard::new());
    let members = Arc::new(JobMembers::new());
    let heartbeat = HeartbeatContext {
        events: tx.clone(),
        board: Arc::clone(&board),
        members: Arc::clone(&members),
        sink: config.sink.clone(),
    };
    let socket =
        crate::heartbeat::start(&socket_path, heartbeat).map_err(|source| RunError::Socket {
            path: socket_path.clone(),
            source,
        })?;
    let mut launch_spec = config.launch.clone();
    launch_spec.socket = Some(socket.path().to_path_buf());
    // Beats without a system call: a slot per local rank in the same private directory.
    let beat_slots = crate::beats::BeatSlots::create(&runtime.path().join("beats"))
        .map_err(
            |e| tracing::warn!(error = %e, "no shared-memory beat slots: ranks beat by datagram"),
        )
        .ok();
    launch_spec.beats = beat_slots.as_ref().map(|b| b.path().to_path_buf());
    let kernel_log = KernelLog::follow();
    let console = config.console.map(Console::start);
    let tails = Arc::new(Tails::new(200));
    let open_streams = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let program =
        hangwatch_inspect::child::self_exe().unwrap_or_else(|_| PathBuf::from("hangwatch"));
    let reaper = Reaper::start(&program)
        .map_err(|e| {
            tracing::warn!(error = %e, "cannot start the job reaper: if hangwatch is killed, processes of the job below its ranks may outlive it")
        })
        .ok();
    // Stack readers prepared while the job is healthy, so that a roll call reads only the stacks.
    let stack_readers = PreparedStacks::start(
        program.clone(),
        hangwatch_inspect::pystack::default_parallelism(),
    )
    .map_err(
        |e| tracing::warn!(error = %e, "no prepared stack readers: roll calls read stacks cold"),
    )
    .ok();
    let start = Instant::now();
    let launched = launch(&launch_spec)?;
    for l in &launched {
        members.register_live(l.pid, l.rank);
    }
    let tree_mode = launch_spec.nproc.is_none();
    let ctx = DrainContext {
        board: Arc::clone(&board),
        sink: config.sink.clone(),
        console: console.clone(),
        tails: Arc::clone(&tails),
        prefix: config.prefix,
        open_streams: Arc::clone(&open_streams),
    };
    let procfs = ProcFs::new("/proc");
    let mut procs = Vec::new();
    for Launched {
        child,
        pid,
        rank,
        stdout,
        stderr,
    } in launched
    {
        if let Some(out) = stdout {
            drain(out, rank, Stream::Stdout, ctx.clone());
        }
        if let Some(err) = stderr {
            drain(err, rank, Stream::Stderr, ctx.clone());
        }
        procs.push(JobProc {
            waited: Some(wait_in_background(child)),
            pid,
            pgid: pid,
            start: procfs.stat(pid).ok().map(|s| s.starttime),
            rank,
            // `--nproc` gives each rank its RANK.
            rank_source: rank.map(|_| RankSource::EnvRank),
            exit: None,
            exited_at: None,
            discovered: false,
            identity: crate::death::RankIdentity::read(&procfs, pid),
        });
    }
    drop(ctx);
    let prober = Prober::new()
        .map_err(|e| tracing::warn!(error = %e, "filesystem probes unavailable"))
        .ok();
    let link = match config.coordinator.clone() {
        Some(link_config) => {
            let addr = link_config.addr.clone();
            match Link::start(link_config, tx.clone()) {
                Ok(link) => Some(link),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the coordinator link");
                    say(format!("hangwatch: error: cannot start the link to the coordinator at {addr} ({e}); this node decides alone"));
                    None
                }
            }
        }
        None => None,
    };
    let witnesses = crate::death::Witnesses::of_this_node(kernel_log.clone(), Arc::clone(&tails));
    let detector = Detector::new(config.detector.clone(), Duration::ZERO);
    let policy = Policy::new(PolicyConfig {
        on_hang: config.on_hang,
        grace: config.grace,
        failed_rank_grace: config.failed_rank_grace,
        inspect_budget: inspect_budget(&config),
        activity: activity_rule(&config.detector),
    });
    let structure_node_rank = config.coordinator.as_ref().map(|c| c.node_rank);
    let mut sup = Supervisor {
        config,
        procs,
        tree_mode,
        detector,
        policy,
        start,
        procfs,
        prober: Arc::new(Mutex::new(prober)),
        kernel_log,
        tails,
        console,
        events: tx,
        board,
        members,
        last_verdict: None,
        bundle: None,
        termination: None,
        last_discovery: None,
        last_activity_sample: None,
        last_blocked_sample: None,
        fs_stall: FsStallTracker::new(),
        last_probe_reap: None,
        activity: HashMap::new(),
        // With a coordinator, ranks numbered by the structure alone are made global with this node's rank.
        ranks: Arc::new(Mutex::new(RankFinder::on_node(structure_node_rank))),
        client_ranks: ClientReports::new(),
        discovering: false,
        heartbeats: Arc::clone(&socket.stats),
        reaper,
        groups: Vec::new(),
        program,
        stack_readers,
        stack_pids: Vec::new(),
        last_step: None,
        stack_candidate: None,
        link,
        beat_slots,
        last_slot_look: None,
        own_events: VecDeque::new(),
        linked: false,
        ordered_observations: None,
        ordered_verdict: None,
        timeline: crate::timeline::TimelineRecorder::new(unix_time_of(start)),
        last_identity_look: None,
        witnesses,
    };
    sup.track_groups();
    let outcome = sup.run_loop(&rx);
    if let Some(link) = sup.link.take() {
        let exits = sup.rank_exits();
        link.leave(outcome.exit_code, exits);
    }
    // Processes that outlived their rank (a worker that ignored SIGTERM, a daemon) end with the job.
    let swept = crate::reaper::sweep(&sup.procfs, &sup.groups);
    if !swept.is_empty() {
        tracing::info!(count = swept.len(), pids = ?swept, "ended processes of the job that outlived their rank");
    }
    if let Some(reaper) = sup.reaper.take() {
        reaper.release();
    }
    // The last lines of a job that ended are still in its pipes: let the drain threads finish, briefly (a
    // grandchild that keeps a pipe open must not hold hangwatch).
    let linger = if outcome.exit_code == EXIT_HUNG {
        // An unkillable rank keeps its pipe open forever: do not wait for it.
        Duration::from_millis(300)
    } else {
        Duration::from_secs(2)
    };
    let until = Instant::now() + linger;
    while open_streams.load(std::sync::atomic::Ordering::SeqCst) > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    signals.close();
    drop(socket);
    drop(runtime);
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

/// A fresh private (0700) directory for the heartbeat socket and the beat slots: the first node-local one of
/// `$XDG_RUNTIME_DIR` (a per-user tmpfs), `$TMPDIR`, `/dev/shm` and `/tmp`. Node-local by the mount table, before
/// anything touches the path: with `TMPDIR` on Lustre scratch the loop, the exit and every rank's `beat()` would
/// otherwise wait on the shared filesystem. Removed when dropped.
fn runtime_dir() -> std::io::Result<tempfile::TempDir> {
    let table = ProcFs::new("/proc")
        .mountinfo(std::process::id() as i32)
        .ok();
    let candidates: Vec<PathBuf> = [
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        Some(std::env::temp_dir()),
        Some(PathBuf::from("/dev/shm")),
        Some(PathBuf::from("/tmp")),
    ]
    .into_iter()
    .flatten()
    .filter(|p| p.is_absolute())
    .collect();
    let mut last = None;
    for base in &candidates {
        if let Some(t) = &table {
            if !t.is_node_local(&base.to_string_lossy()) {
                tracing::info!(dir = %base.display(), "not a node-local filesystem: the heartbeat socket goes elsewhere");
                continue;
            }
        }
        match tempfile::Builder::new()
            .prefix("hangwatch-")
            .tempdir_in(base)
        {
            Ok(dir) => return Ok(dir),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::other("no node-local directory for the heartbeat socket ($XDG_RUNTIME_DIR, $TMPDIR, /dev/shm, /tmp)")
    }))
}

/// How long ranks seen computing without progress hold the hard tier back: until `--max-stall` (the detector's
/// ceiling), unless the user fixed the threshold (`--stall-after`: their word that no silence lasts longer).
pub fn activity_rule(detector: &DetectorConfig) -> ActivityRule {
    match detector.fixed {
        Some(_) => ActivityRule::never(),
        None => ActivityRule::until(detector.ceiling),
    }
}

/// How long a signal may be held back while a stuck job's evidence is taken: the roll call's own deadlines
/// (two /proc samples, stacks, a probe), bounded so that grace + this stays well inside Slurm's KillWait (30 s).
fn inspect_budget(config: &RunConfig) -> Duration {
    (config.window + config.stack_timeout + config.probe_timeout + Duration::from_secs(1))
        .min(Duration::from_secs(8))
}

struct SignalThread {
    handle: signal_hook::iterator::Handle,
}

impl SignalThread {
    fn close(self) {
        self.handle.close();
    }
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

fn install_signals(tx: SyncSender<Event>) -> std::io::Result<SignalThread> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("hw-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if tx.send(Event::Signal(sig)).is_err() {
                    return;
                }
            }
        })?;
    Ok(SignalThread { handle })
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
                self.ranks_found(found);
                return None;
            }
            Event::ClientRank(report) => {
                self.client_rank(report);
                return None;
            }
            Event::Observed(observations) => {
                self.ordered_observations = Some(*observations);
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

    /// Feeds the progress recorded on the board since the last take to the detector (and to the coordinator).
    fn take_progress(&mut self) {
        self.take_slot_beats();
        for u in self.board.take_updates() {
            self.last_step = self.last_step.max(u.step);
            self.timeline
                .record(unix_time_of(u.at), u.rank, u.count, u.step);
            if let (Some(link), Some(rank)) = (&self.link, u.rank) {
                link.progress(rank, u.step, u.at);
            }
            self.detector
                .progress_batch(u.rank, u.source, u.batch(self.start));
        }
    }

    /// How each rank ended, for the coordinator's goodbye.
    fn rank_exits(&mut self) -> Vec<hangwatch_rpc::pb::RankExit> {
        self.procs
            .iter_mut()
            .filter_map(|p| {
                let rank = p.rank?;
                // Collects an exit not seen yet, so that its status is in the goodbye.
                p.has_exited();
                Some(hangwatch_rpc::pb::RankExit {
                    rank,
                    pid: p.pid,
                    exit_code: p.exit.as_ref().map(shell_code),
                    exited_at_unix_s: p.exited_at.map(unix_time_of).unwrap_or(0.0),
                })
            })
            .collect()
    }

    /// Beats in the shared-memory slots since the last look, from processes of the job only (a slot names its
    /// writer's pid). The beats of one slot between two looks are spread evenly over the time between them, so
    /// that the detector learns the same step intervals as from datagram beats.
    fn take_slot_beats(&mut self) {
        let Some(slots) = self.beat_slots.as_mut() else {
            return;
        };
        let now = Instant::now();
        let since = self.last_slot_look.replace(now).unwrap_or(self.start);
        for moved in slots.take() {
            let slot = moved.slot;
            let Some(member) = self.members.who(slot.pid) else {
                tracing::debug!(
                    pid = slot.pid,
                    "beat slot written by a process outside the job: ignored"
                );
                continue;
            };
            let rank = slot.rank.or(member.rank);
            let beats = u32::try_from(moved.beats).unwrap_or(u32::MAX);
            let each = now.saturating_duration_since(since) / beats.max(1);
            let first = (since + each).min(now);
            self.detector.progress_batch(
                rank,
                ProgressSource::Heartbeat,
                hangwatch_diagnosis::ProgressBatch {
                    first: self.since_start(first),
                    last: self.since_start(now),
                    count: moved.beats,
                    longest_gap: each,
                },
            );
            self.last_step = self.last_step.max(slot.step);
            self.timeline
                .record(unix_time_of(now), rank, moved.beats, slot.step);
            if let (Some(link), Some(rank)) = (&self.link, rank) {
                link.progress(rank, slot.step, now);
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
        for p in self.procs.iter_mut() {
            let was = p.exit.is_some() || p.exited_at.is_some();
            if !was && p.has_exited() {
                self.members.forget(p.pid);
                self.detector.rank_gone(p.rank);
                if let Some(status) = &p.exit {
                    tracing::info!(pid = p.pid, rank = ?p.rank, code = shell_code(status), "rank exited");
                }
            }
        }
        let job_alive = self.live() > 0;
        if job_alive {
            if self.tree_mode {
                self.discover_ranks();
            }
            self.read_identities();
            self.reap_probes();
            self.sample_activity();
            self.sample_blocked();
            self.prepare_stack_readers();
        }
        let mut stall = self.detector.check(now).tier();
        let mut failed_rank_for = self.failed_rank_since();
        let mut fs_stuck = fast_path_due(
            self.fs_stall.longest(now),
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
        let only_stuck_left =
            job_alive && self.policy.interrupted_by().is_some() && self.only_stuck_left();
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
                    say(self.notice_text(&notice));
                }
                Action::RollCall(Trigger::Ordered) => self.start_ordered_evidence(),
                Action::RollCall(Trigger::PostMortem) => self.start_post_mortem(),
                Action::RollCall(trigger) => self.start_investigation(trigger),
                Action::Forward(signal) => self.forward(signal),
                Action::Terminate { kill_now } => self.start_termination(kill_now),
                Action::AlertComputing => self.alert_computing(),
                Action::Finish(ending) => return Some(self.finish(ending)),
            }
        }
        None
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
            Notice::GraceOver { signal } => format!(
                "hangwatch: the job did not end within {:.0}s of signal {signal}: killing it",
                self.config.grace.as_secs_f64()
            ),
            Notice::OnlyStuckLeft { signal } => format!(
                "hangwatch: after signal {signal} only processes blocked in the kernel are left: killing them now (they cannot act on it)"
            ),
            Notice::SecondSignal => "hangwatch: second signal: killing the job now".into(),
            Notice::EndingJob { grace } => format!(
                "hangwatch: ending the job: SIGTERM, {:.0}s grace, then SIGKILL",
                grace.as_secs_f64()
            ),
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

    /// The warning alert that the job computes without progress and is not ended for it (once per stall).
    fn alert_computing(&self) {
        let Some(verdict) = &self.last_verdict else {
            return;
        };
        let mut message = Alert::new(Stage::Computing, verdict, unix_now());
        message.job = self.config.job_id.clone();
        message.node = self.config.node.clone();
        message.evidence = self.bundle.as_ref().map(|dir| {
            format!(
                "{}:{}",
                self.config.node.as_deref().unwrap_or("this node"),
                dir.display()
            )
        });
        self.config.alerter.send(&message);
    }

    fn forward(&mut self, signal: i32) {
        let forward = Signal::try_from(signal).unwrap_or(Signal::SIGTERM);
        for p in self.procs.iter_mut() {
            if p.has_exited() {
                continue;
            }
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(p.pgid), forward);
        }
    }

    fn live(&mut self) -> usize {
        self.procs
            .iter_mut()
            .filter(|p| !p.discovered)
            .map(|p| !p.has_exited())
            .filter(|alive| *alive)
            .count()
    }

    /// Whether every live process of the job cannot act on a signal (see [`cannot_act_on_term`]).
    fn only_stuck_left(&mut self) -> bool {
        let stuck = stuck_pids(self.last_verdict.as_ref(), self.config.node.as_deref());
        if stuck.is_empty() {
            return false;
        }
        let live: Vec<i32> = self
            .procs
            .iter_mut()
            .filter_map(|p| (!p.has_exited()).then_some(p.pid))
            .collect();
        live.iter()
            .all(|&pid| cannot_act_on_term(&self.procfs, &stuck, pid))
    }

    /// Reaps probe children that were stuck on a frozen filesystem and have returned since (after a thaw), so a
    /// long job does not collect zombies. Skipped while a roll call holds the prober: the loop never waits.
    fn reap_probes(&mut self) {
        if self
            .last_probe_reap
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.last_probe_reap = Some(Instant::now());
        if let Ok(mut prober) = self.prober.try_lock() {
            if let Some(prober) = prober.as_mut() {
                prober.outstanding();
            }
        }
    }

    /// Tells the reaper about process groups of the job it does not know yet.
    fn track_groups(&mut self) {
        for p in &self.procs {
            if self.groups.iter().any(|g| g.pgid == p.pgid) {
                continue;
            }
            let Some(group) = JobGroup::of_leader(&self.procfs, p.pid) else {
                continue;
            };
            if group.pgid <= 1 || group.pgid == nix::unistd::getpgrp().as_raw() {
                continue;
            }
            if let Some(reaper) = &mut self.reaper {
                reaper.watch(group);
            }
            self.groups.push(group);
        }
    }

    /// How long ago the first rank failed (`--nproc` mode), whether or not others still run.
    fn failed_rank_since(&self) -> Option<Duration> {
        if self.tree_mode {
            return None;
        }
        let failed_at = self
            .procs
            .iter()
            .filter(|p| p.exit.as_ref().is_some_and(|s| !s.success()))
            .filter_map(|p| p.exited_at)
            .min()?;
        Some(failed_at.elapsed())
    }

    /// Reads again, every [`IDENTITY_EVERY`], who each live rank hangwatch started is (cgroup, name,
    /// executable, directory): cheap /proc reads that never touch a filesystem the rank uses.
    fn read_identities(&mut self) {
        if self
            .last_identity_look
            .is_some_and(|t| t.elapsed() < IDENTITY_EVERY)
        {
            return;
        }
        self.last_identity_look = Some(Instant::now());
        for p in self.procs.iter_mut().filter(|p| !p.discovered) {
            if p.exit.is_some() || p.exited_at.is_some() {
                continue;
            }
            let identity = crate::death::RankIdentity::read(&self.procfs, p.pid);
            // Read as the rank exits: keep what was known.
            if identity.comm.is_some() {
                p.identity = identity;
            }
        }
    }

    /// The ranks hangwatch started and reaped, for explaining their deaths.
    fn dead_ranks(&self) -> Vec<crate::death::DeadRank> {
        self.procs
            .iter()
            .filter(|p| !p.discovered)
            .filter_map(|p| {
                Some(crate::death::DeadRank {
                    pid: p.pid,
                    rank: p.rank,
                    status: p.exit?,
                    exited_at: p.exited_at?,
                    identity: p.identity.clone(),
                })
            })
            .collect()
    }

    fn rank_pids(&mut self) -> Vec<(i32, Option<u32>)> {
        let mut pids: Vec<(i32, Option<u32>)> = self
            .procs
            .iter()
            // In tree mode the command itself is a rank only when the rule said so (it carries RANK, or it is
            // Lightning's first rank).
            .filter(|p| !self.tree_mode || p.discovered || p.rank.is_some())
            .map(|p| (p.pid, p.rank))
            .collect();
        if pids.is_empty() {
            pids = self.procs.iter().map(|p| (p.pid, p.rank)).collect();
        }
        pids
    }

    /// Gives the stack readers the live ranks once the set has been the same for [`PREPARE_STACKS_AFTER`] (an
    /// interpreter just started has no stack to find yet).
    fn prepare_stack_readers(&mut self) {
        if self.stack_readers.is_none() {
            return;
        }
        let mut pids: Vec<i32> = self
            .rank_pids()
            .into_iter()
            .map(|(pid, _)| pid)
            .filter(|pid| {
                self.procs
                    .iter()
                    .any(|p| p.pid == *pid && p.exit.is_none() && p.exited_at.is_none())
            })
            .collect();
        pids.sort_unstable();
        if pids == self.stack_pids {
            self.stack_candidate = None;
            return;
        }
        match &self.stack_candidate {
            Some((candidate, since)) if *candidate == pids => {
                if since.elapsed() >= PREPARE_STACKS_AFTER {
                    if let Some(readers) = &self.stack_readers {
                        readers.prepare(&pids);
                    }
                    self.stack_pids = pids;
                    self.stack_candidate = None;
                }
            }
            _ => self.stack_candidate = Some((pids, Instant::now())),
        }
    }

    /// Starts a look for ranks below the launcher, about once a second, in a worker: reading environments runs
    /// children under a deadline (up to 2 s), which the loop must not wait for. The answer comes back as
    /// [`Event::Discovered`].
    fn discover_ranks(&mut self) {
        if self.discovering
            || self
                .last_discovery
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.last_discovery = Some(Instant::now());
        let roots: Vec<i32> = self
            .procs
            .iter()
            .filter(|p| !p.discovered)
            .map(|p| p.pid)
            .collect();
        let finder = Arc::clone(&self.ranks);
        let clients = self.client_ranks.clone();
        let events = self.events.clone();
        let spawned = std::thread::Builder::new()
            .name("hw-discover".into())
            .spawn(move || {
                let found = finder.lock().unwrap_or_else(|e| e.into_inner()).refresh(
                    &ProcFs::new("/proc"),
                    &roots,
                    &clients,
                );
                let _ = events.send(Event::Discovered(found));
            });
        match spawned {
            Ok(_) => self.discovering = true,
            Err(e) => tracing::warn!(error = %e, "cannot look for ranks below the launcher"),
        }
    }

    /// Keeps what a process's client said of its rank, for the next look for ranks (taken at once). With
    /// `--nproc` hangwatch gave every rank its number, and a report changes nothing.
    fn client_rank(&mut self, report: ClientRank) {
        if !self.tree_mode {
            return;
        }
        let Ok(stat) = self.procfs.stat(report.pid) else {
            return;
        };
        let id = ProcId {
            pid: report.pid,
            start_time: stat.starttime,
        };
        let claim = RankClaim {
            rank: report.rank,
            local_rank: report.local_rank,
            world_size: report.world_size,
            source: RankSource::Client,
        };
        if self.client_ranks.get(&id) == Some(&claim) {
            return;
        }
        // Bounded like every table keyed by what senders say: the processes that are gone make room.
        if self.client_ranks.len() >= MAX_CLIENT_RANKS {
            let procfs = &self.procfs;
            self.client_ranks.retain(|id, _| {
                procfs
                    .stat(id.pid)
                    .is_ok_and(|s| s.starttime == id.start_time)
            });
            if self.client_ranks.len() >= MAX_CLIENT_RANKS {
                return;
            }
        }
        tracing::info!(
            pid = report.pid,
            rank = report.rank,
            "a rank's client said which rank it is"
        );
        self.client_ranks.insert(id, claim);
        self.last_discovery = None;
        self.discover_ranks();
    }

    /// Takes in what a look for ranks found: the outermost processes that carry RANK (their descendants are their
    /// workers, never ranks; see `hangwatch_diagnosis::ranks`).
    fn ranks_found(&mut self, found: Discovery) {
        self.discovering = false;
        for demoted in &found.demoted {
            tracing::info!(
                pid = demoted.id.pid,
                "a process taken for a rank is a launcher: other ranks run below it"
            );
            self.members.forget(demoted.id.pid);
            self.procs
                .retain(|p| !(p.discovered && p.pid == demoted.id.pid && p.exited_at.is_none()));
        }
        for gone in &found.gone {
            if let Some(p) = self.procs.iter_mut().find(|p| {
                p.discovered
                    && p.pid == gone.id.pid
                    && p.start.is_none_or(|s| s == gone.id.start_time)
                    && p.exited_at.is_none()
            }) {
                p.exited_at = Some(Instant::now());
                self.members.forget(p.pid);
                self.detector.rank_gone(p.rank);
                tracing::info!(pid = gone.id.pid, rank = gone.rank, "rank exited");
            }
        }
        for changed in &found.renumbered {
            if let Some(p) = self.procs.iter_mut().find(|p| {
                p.pid == changed.id.pid
                    && p.start.is_none_or(|s| s == changed.id.start_time)
                    && p.exited_at.is_none()
            }) {
                tracing::info!(
                    pid = p.pid,
                    was = ?p.rank,
                    rank = changed.rank,
                    source = changed.source.as_str(),
                    "a rank's number changed"
                );
                p.rank = Some(changed.rank);
                p.rank_source = Some(changed.source);
                self.members.register_live(p.pid, p.rank);
            }
        }
        for new in found.new {
            if let Some(p) = self
                .procs
                .iter_mut()
                .find(|p| p.pid == new.id.pid && p.exited_at.is_none())
            {
                // The command hangwatch started is itself the rank (`hangwatch run -- python train.py` with RANK,
                // Lightning's first rank).
                if p.rank.is_none() {
                    p.rank = Some(new.rank);
                    p.rank_source = Some(new.source);
                }
                self.members.register_live(p.pid, p.rank);
                continue;
            }
            tracing::info!(
                pid = new.id.pid,
                rank = new.rank,
                source = new.source.as_str(),
                "found a rank below the launcher"
            );
            self.members.register_live(new.id.pid, Some(new.rank));
            self.procs.push(JobProc {
                waited: None,
                pid: new.id.pid,
                pgid: new.pgid,
                start: Some(new.id.start_time),
                rank: Some(new.rank),
                rank_source: Some(new.source),
                exit: None,
                exited_at: None,
                discovered: true,
                identity: crate::death::RankIdentity::default(),
            });
        }
        self.track_groups();
    }

    /// CPU time as progress, only for jobs that never printed nor sent a heartbeat.
    fn sample_activity(&mut self) {
        if self
            .detector
            .source()
            .is_some_and(|s| s < ProgressSource::Activity)
        {
            return;
        }
        if self
            .last_activity_sample
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.last_activity_sample = Some(Instant::now());
        let now = self.now();
        for (pid, rank) in self.rank_pids() {
            if let Ok(stat) = self.procfs.stat(pid) {
                let ticks = stat.cpu_ticks();
                let before = self.activity.insert(pid, ticks);
                if before.is_some_and(|b| ticks > b) {
                    self.detector.progress(rank, ProgressSource::Activity, now);
                }
            }
        }
    }

    /// The fast path's cheap look, once a second and only while the job makes no progress (nothing is read from
    /// a healthy job): each rank's thread states (wait channels of sleeping threads) and its I/O counters. All of
    /// it is safe on a rank in D (/proc stat, wchan and io take no lock the rank can hold).
    fn sample_blocked(&mut self) {
        let now = self.now();
        if self.config.fs_stall.is_zero() || self.detector.stalled_for(now) < Duration::from_secs(1)
        {
            self.fs_stall.observe(&[], now);
            return;
        }
        if self
            .last_blocked_sample
            .is_some_and(|t| t.elapsed() < Duration::from_millis(900))
        {
            return;
        }
        self.last_blocked_sample = Some(Instant::now());
        let samples: Vec<RankSample> = self
            .rank_pids()
            .into_iter()
            .map(|(pid, rank)| {
                let mut blocked = None;
                for tid in self.procfs.list_threads(pid).unwrap_or_default() {
                    let Ok(st) = self.procfs.task_stat(pid, tid) else {
                        continue;
                    };
                    let wchan = if st.state == 'S' {
                        self.procfs.wchan(pid, tid).ok().flatten()
                    } else {
                        None
                    };
                    match thread_blocked(st.state, wchan.as_deref()) {
                        Some(Blocked::Stopped) => {
                            blocked = Some(Blocked::Stopped);
                            break;
                        }
                        Some(b) => blocked = Some(b),
                        None => {}
                    }
                }
                let io = self.procfs.io(pid).ok().map(|c| {
                    [
                        c.rchar,
                        c.wchar,
                        c.syscr,
                        c.syscw,
                        c.read_bytes,
                        c.write_bytes,
                    ]
                    .into_iter()
                    .flatten()
                    .fold(0u64, u64::wrapping_add)
                });
                RankSample {
                    pid,
                    rank,
                    blocked,
                    io,
                }
            })
            .collect();
        self.fs_stall.observe(&samples, now);
    }

    /// The metrics' update of this tick (see [`crate::metrics_feed`]).
    fn feed_metrics(&self, now: Duration) {
        let Some(metrics) = &self.config.metrics else {
            return;
        };
        let ranks = self.procs.iter();
        let ranks =
            ranks.filter_map(|p| Some((p.rank?, p.exit.is_some() || p.exited_at.is_some())));
        crate::metrics_feed::feed(
            metrics,
            crate::metrics_feed::FeedInput {
                detector: &self.detector,
                now,
                ranks: ranks.collect(),
                heartbeats: self.heartbeats.counts(),
                progress_dropped: self.board.dropped(),
                console_dropped: self.console.as_ref().map(Console::dropped),
                prober: &self.prober,
            },
        );
    }

    fn thresholds_record(&self, threshold: &Threshold, stalled_for: Duration) -> ThresholdsRecord {
        ThresholdsRecord::new(self.detector.config(), threshold, stalled_for)
    }

    fn run_record(&self) -> RunRecord {
        RunRecord {
            hangwatch_version: env!("CARGO_PKG_VERSION").to_string(),
            node: self.config.node.clone(),
            command: self
                .config
                .launch
                .command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            nproc: self.config.launch.nproc,
            pids: self
                .procs
                .iter()
                .map(|p| crate::evidence::PidRecord {
                    pid: p.pid,
                    rank: p.rank,
                })
                .collect(),
            running_for_s: self.now().as_secs_f64(),
            heartbeats: self.heartbeats.counts(),
            console_lines_dropped: self.console.as_ref().map(Console::dropped),
            messages_dropped: crate::human::dropped(crate::human::Stream::Stderr),
            rollcall: None,
        }
    }

    /// Starts the roll call worker: roll call, evidence (in an abandonable child), alert. Everything it needs is
    /// copied out of the loop's state now, so the loop goes on at once.
    fn start_investigation(&mut self, trigger: Trigger) {
        let now = self.now();
        let stalled_for = self.detector.stalled_for(now);
        let threshold = self.detector.threshold();
        let (tier_threshold, basis) = match trigger {
            Trigger::Soft => (threshold.soft, threshold.basis.as_str()),
            Trigger::FsStall => (
                self.config.fs_stall,
                "--fs-stall, whatever the learned threshold",
            ),
            _ => (threshold.hard, threshold.basis.as_str()),
        };
        // A recheck of ranks seen computing is said only when it finds the work stopped.
        if trigger != Trigger::Recheck {
            // Said as seen: the fast path names the rank and how it is blocked (stopped, or a filesystem wait).
            let seen = match trigger {
                Trigger::FsStall => self
                    .fs_stall
                    .longest(now)
                    .map_or_else(|| trigger.describe(), |stuck| stuck.words()),
                _ => trigger.describe(),
            };
            say(format!(
                "hangwatch: {} for {:.1}s ({seen}; threshold {:.0}s, {basis}): taking a roll call",
                ProgressSource::missing_words(self.detector.source()),
                stalled_for.as_secs_f64(),
                tier_threshold.as_secs_f64(),
            ));
        }
        let job = self.investigation_job(trigger);
        self.spawn_investigation(trigger, "hw-rollcall", move || job.run());
    }

    /// A roll call the coordinator ordered: this node's observations go back to it as soon as they are taken
    /// (and are kept for this node's evidence); the coordinator decides.
    fn start_ordered_roll_call(
        &mut self,
        roll_call_id: u64,
        deadline: Duration,
        probe_mounts: Vec<String>,
        answers: Answers,
    ) {
        let also = if probe_mounts.is_empty() {
            String::new()
        } else {
            format!(", probing {} too", probe_mounts.join(", "))
        };
        say(format!(
            "hangwatch: the coordinator asks for a roll call of this node (answer within {:.0}s{also})",
            deadline.as_secs_f64()
        ));
        let mut job = self.investigation_job(Trigger::Ordered);
        job.options.extra_probes = probe_mounts;
        investigation::spawn_ordered_roll_call(job, roll_call_id, answers, self.events.clone());
    }

    /// The coordinator ended the job: this node's evidence is the job-wide verdict with this node's own
    /// observations (from the roll call it answered), written while the ranks are being ended.
    fn start_ordered_evidence(&mut self) {
        let job = self.investigation_job(Trigger::Ordered);
        let verdict = self
            .ordered_verdict
            .clone()
            .unwrap_or_else(|| Verdict::unknown("the coordinator ended the job"));
        let observations = self.ordered_observations.clone().unwrap_or_else(|| {
            let mut o = NodeObservations::new(self.config.node.clone(), 0);
            o.unreadable
                .push("this node's roll call did not finish before the coordinator's order".into());
            o
        });
        self.spawn_investigation(Trigger::Ordered, "hw-evidence", move || {
            job.keep(verdict, &observations, false)
        });
    }
    /// Starts a roll call worker; one that cannot start reports its failure as the loop's own next event.
    fn spawn_investigation(
        &mut self,
        trigger: Trigger,
        name: &str,
        work: impl FnOnce() -> Investigation + Send + 'static,
    ) {
        if let Some(failed) = investigation::spawn(&self.events, trigger, name, work) {
            self.own_events.push_back(failed);
        }
    }

    /// Everything a roll call worker needs, copied out of the loop's state.
    fn investigation_job(&mut self, trigger: Trigger) -> InvestigationJob {
        let now = self.now();
        let stalled_for = self.detector.stalled_for(now);
        let threshold = self.detector.threshold();
        let ranks = self.rank_pids();
        let pids: Vec<i32> = ranks.iter().map(|(p, _)| *p).collect();
        let timeline = self.timeline.snapshot(
            u32::try_from(pids.len()).unwrap_or(u32::MAX),
            Some(threshold.hard.as_secs_f64()),
            Some(unix_now()),
        );
        let known: HashMap<i32, KnownProcess> = self
            .procs
            .iter()
            .filter(|p| pids.contains(&p.pid))
            .map(|p| {
                let known = KnownProcess {
                    rank: p.rank,
                    rank_source: p.rank_source,
                    exited: p.exit.is_some() || p.exited_at.is_some(),
                    exit_code: p.exit.as_ref().map(shell_code),
                    exited_at_unix_s: p.exited_at.map(unix_time_of),
                };
                (p.pid, known)
            })
            .collect();
        let stacks = StackReadOptions::for_self()
            .unwrap_or_else(|_| StackReadOptions {
                program: self.program.clone(),
                per_pid_timeout: self.config.stack_timeout,
                total_timeout: self.config.stack_timeout,
                parallelism: 2,
            })
            .with_timeouts(self.config.stack_timeout, pids.len());
        let options = RollCallOptions {
            extra_probes: Vec::new(),
            window: self.config.window,
            read_stacks: true,
            stacks,
            prepared: self.stack_readers.clone(),
            node: self.config.node.clone(),
        };
        InvestigationJob {
            trigger,
            stalled_for_s: stalled_for.as_secs_f64(),
            pids,
            known,
            options,
            probe_timeout: self.config.probe_timeout,
            prober: Arc::clone(&self.prober),
            thresholds: self.thresholds_record(&threshold, stalled_for),
            timeline,
            run: self.run_record(),
            kernel_log: self.kernel_log.text(),
            kernel_log_unavailable: self.kernel_log.unavailable.clone(),
            tails: self.tails.snapshot(),
            report_dir: self.config.report_dir.clone(),
            program: self.program.clone(),
            alerter: Arc::clone(&self.config.alerter),
            history_db: self.config.history_db.clone(),
            history_fleet: self.config.history_fleet.clone(),
            job_id: self.config.job_id.clone(),
            node: self.config.node.clone(),
            dead: self.dead_ranks(),
            witnesses: self.witnesses.clone(),
        }
    }

    /// The job ended by itself after a rank failed: a worker writes down who died first and how (waiting briefly
    /// for the kernel log and the last lines), keeps it as evidence and makes it the run's verdict.
    fn start_post_mortem(&mut self) {
        say("hangwatch: the job ended after a rank failed: finding out how it died".to_string());
        let job = self.investigation_job(Trigger::PostMortem);
        self.spawn_investigation(Trigger::PostMortem, "hw-postmortem", move || {
            job.post_mortem()
        });
    }

    /// Starts the termination worker: TERM, grace, KILL (or KILL at once), then the unkillable are reported.
    fn start_termination(&mut self, kill_now: bool) {
        let grace = if kill_now {
            Duration::ZERO
        } else {
            self.config.grace
        };
        let stuck = stuck_pids(self.last_verdict.as_ref(), self.config.node.as_deref());
        let events = self.events.clone();
        let spawned = spawn_termination(
            self.procs.clone(),
            grace,
            self.config.kill_wait,
            stuck,
            move |report| {
                let _ = events.send(Event::Terminated(report));
            },
        );
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the termination; killing the job from the loop");
            for p in &self.procs {
                let _ =
                    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(p.pgid), Signal::SIGKILL);
            }
            self.own_events
                .push_back(Event::Terminated(TerminationReport::default()));
        }
    }

    fn finish(&mut self, ending: Ending) -> RunOutcome {
        match ending {
            Ending::Hung => self.finish_hung(),
            Ending::Interrupted(signal) => {
                let mut outcome = self.job_ended_by_itself(Some(signal));
                if let Some(report) = self.termination.take() {
                    self.report_termination(&report);
                    outcome.exit_code = 128 + signal;
                    outcome.termination = Some(report);
                }
                if let Some(verdict) = self.last_verdict.clone() {
                    self.save_final_verdict(&verdict);
                }
                outcome
            }
            Ending::ByItself => self.job_ended_by_itself(None),
        }
    }

    /// Adds what the termination did to the last verdict and says who could not be killed.
    fn report_termination(&mut self, report: &TerminationReport) {
        let node = self
            .config
            .node
            .clone()
            .unwrap_or_else(|| "this node".into());
        for u in &report.unkillable {
            say(format!(
                "hangwatch: {}: not waiting for it; drain or reboot {node}",
                u.words()
            ));
        }
        let Some(verdict) = self.last_verdict.as_mut() else {
            return;
        };
        let procs = &self.procs;
        verdict.actions.extend(termination_actions(report, |pid| {
            procs.iter().find(|p| p.pid == pid).and_then(|p| p.rank)
        }));
        if !report.unkillable.is_empty() {
            verdict.recommendations.insert(
                0,
                format!(
                    "processes of this job are stuck in the kernel and cannot be killed: drain {node} (or reboot it) \
                     and restart the job elsewhere"
                ),
            );
        }
    }

    /// The verdict files again, now with the actions taken (abandonable: the report directory may be frozen).
    fn save_final_verdict(&mut self, verdict: &Verdict) {
        if let Err(e) = write_abandonable(
            &self.program,
            &self.config.report_dir,
            &verdict_files(verdict),
            EVIDENCE_DEADLINE,
        ) {
            tracing::warn!(error = %e, "the final verdict could not be saved");
            say(format!(
                "hangwatch: warning: the final verdict could not be saved: {e}"
            ));
        }
    }

    fn finish_hung(&mut self) -> RunOutcome {
        let report = self.termination.take().unwrap_or_default();
        self.report_termination(&report);
        let verdict = self.last_verdict.clone();
        if let Some(verdict) = &verdict {
            self.save_final_verdict(verdict);
        }
        RunOutcome {
            exit_code: EXIT_HUNG,
            verdict,
            bundle: self.bundle.clone(),
            termination: Some(report),
            interrupted_by: None,
            last_step: self.last_step,
        }
    }

    fn job_ended_by_itself(&mut self, interrupted: Option<i32>) -> RunOutcome {
        let mut exits: Vec<(&Instant, i32)> = self
            .procs
            .iter()
            .filter(|p| !p.discovered)
            .filter_map(|p| Some((p.exited_at.as_ref()?, shell_code(p.exit.as_ref()?))))
            .collect();
        exits.sort_by_key(|(at, _)| **at);
        let code = exits.iter().map(|(_, c)| *c).find(|c| *c != 0).unwrap_or(0);
        let code = match interrupted {
            Some(sig) if code == 0 || code > 128 => 128 + sig,
            _ => code,
        };
        RunOutcome {
            exit_code: code,
            verdict: self.last_verdict.clone(),
            bundle: self.bundle.clone(),
            termination: None,
            interrupted_by: interrupted,
            last_step: self.last_step,
        }
    }
}

/// Seconds since the epoch of a past `Instant`.
fn unix_time_of(at: Instant) -> f64 {
    unix_now() - at.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_the_loop_gives_itself_never_waits_on_a_full_channel_and_comes_first() {
        let (tx, rx) = sync_channel::<Event>(2);
        tx.try_send(Event::Signal(1)).expect("room");
        tx.try_send(Event::Signal(2)).expect("room");
        assert!(
            matches!(
                tx.try_send(Event::Signal(3)),
                Err(std::sync::mpsc::TrySendError::Full(_))
            ),
            "the channel is full: a blocking send from the loop's own thread would never return"
        );
        let mut own = VecDeque::new();
        own.push_back(Event::Terminated(TerminationReport::default()));
        let order: Vec<String> = (0..3)
            .map(|_| match next_event(&mut own, &rx, Duration::ZERO) {
                Ok(Event::Terminated(_)) => "terminated".to_owned(),
                Ok(Event::Signal(n)) => format!("signal {n}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(order, ["terminated", "signal 1", "signal 2"]);
        assert!(matches!(
            next_event(&mut own, &rx, Duration::from_millis(1)),
            Err(RecvTimeoutError::Timeout)
        ));
    }
}
