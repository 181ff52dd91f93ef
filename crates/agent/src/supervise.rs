//! The agent's supervision loop: every source (rank output, heartbeats, child exits, signals, ticks) becomes an
//! [`Event`]; the loop feeds the pure detector, and on a stall takes a roll call, keeps the evidence, alerts and,
//! when the policy says so, ends the job.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hangwatch_diagnosis::{Detector, DetectorConfig, ProgressSource, StallState, Threshold};
use hangwatch_inspect::probe::{ProbeOptions, Prober};
use hangwatch_inspect::pystack::StackReadOptions;
use hangwatch_inspect::rollcall::{take_roll_call, KnownProcess, RollCall, RollCallOptions};
use hangwatch_model::{ActionRecord, Verdict, VerdictKind};
use hangwatch_proc::ProcFs;
use nix::sys::signal::Signal;

use crate::alert::AlertConfig;
use crate::evidence::{write_bundle, Evidence};
use crate::kernel_log::KernelLog;
use crate::launch::{launch, LaunchSpec, Launched};
use crate::output::{drain, Console, DrainContext, LineSink, Stream, Tails};
use crate::terminate::{terminate, JobProcess, TerminationReport};
use crate::wire::ClientMessage;

/// Exit code when hangwatch ended a hung job (EX_TEMPFAIL: retryable).
pub const EXIT_HUNG: i32 = 75;

/// What `run` does when the job hangs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnHang {
    /// Roll call, evidence, alert; nothing is killed.
    Observe,
    /// ... and end the job (TERM, grace, KILL), exit 75.
    Abort,
}

/// Everything the loop needs.
pub struct RunConfig {
    pub launch: LaunchSpec,
    pub detector: DetectorConfig,
    pub on_hang: OnHang,
    /// SIGTERM -> SIGKILL.
    pub grace: Duration,
    /// After SIGKILL, how long before a survivor is called unkillable.
    pub kill_wait: Duration,
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
    pub alert: AlertConfig,
    /// A rank that failed while its peers go on: how long before that is treated as a hang.
    pub failed_rank_grace: Duration,
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
}

/// One thing that happened.
#[derive(Debug)]
pub enum Event {
    Output { rank: Option<u32>, at: Instant },
    Client { message: ClientMessage, at: Instant },
    Signal(i32),
}

/// Errors that stop `run` before or outside the job.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),
    #[error("cannot create the report directory {path}")]
    ReportDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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
struct JobProc {
    /// Filled by the thread that waits for this child: the status and the moment it exited.
    waited: Option<ExitSlot>,
    pid: i32,
    pgid: i32,
    rank: Option<u32>,
    exit: Option<ExitStatus>,
    exited_at: Option<Instant>,
    /// Found below a launcher rather than started by hangwatch.
    discovered: bool,
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
                let gone = !std::path::Path::new(&format!("/proc/{}", self.pid)).exists()
                    || hangwatch_proc::ProcFs::new("/proc")
                        .stat(self.pid)
                        .is_ok_and(|s| s.state == 'Z');
                if gone {
                    self.exited_at.get_or_insert_with(Instant::now);
                }
                gone
            }
        }
    }
}

/// Where a waiter thread leaves a child's exit status and the moment it exited.
type ExitSlot = Arc<std::sync::Mutex<Option<(ExitStatus, Instant)>>>;

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
    start: Instant,
    procfs: ProcFs,
    prober: Option<Prober>,
    kernel_log: KernelLog,
    tails: Arc<Tails>,
    console: Option<Console>,
    soft_handled: bool,
    hard_handled: bool,
    last_verdict: Option<Verdict>,
    bundle: Option<PathBuf>,
    interrupted: Option<i32>,
    interrupts: u32,
    last_discovery: Option<Instant>,
    last_activity_sample: Option<Instant>,
    activity: HashMap<i32, u64>,
    ranks: hangwatch_inspect::ranks::RankFinder,
    heartbeats: Arc<crate::heartbeat::HeartbeatStats>,
}

/// Runs the job to its end. Never returns while a rank it can still end is alive, and never waits on one it
/// cannot end.
pub fn run(config: RunConfig) -> Result<RunOutcome, RunError> {
    std::fs::create_dir_all(&config.report_dir).map_err(|source| RunError::ReportDir {
        path: config.report_dir.clone(),
        source,
    })?;
    let (tx, rx) = channel::<Event>();
    let signals = install_signals(tx.clone()).map_err(RunError::Signals)?;
    let socket_path = config.report_dir.join("hb.sock");
    let socket = crate::heartbeat::start(&socket_path, tx.clone(), config.sink.clone()).map_err(
        |source| RunError::Socket {
            path: socket_path.clone(),
            source,
        },
    )?;
    let mut launch_spec = config.launch.clone();
    launch_spec.socket = Some(socket.path().to_path_buf());
    let kernel_log = KernelLog::follow();
    let console = config.console.map(Console::start);
    let tails = Arc::new(Tails::new(200));
    let open_streams = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = Instant::now();
    let launched = launch(&launch_spec)?;
    let tree_mode = launch_spec.nproc.is_none();
    let ctx = DrainContext {
        events: tx.clone(),
        sink: config.sink.clone(),
        console: console.clone(),
        tails: Arc::clone(&tails),
        prefix: config.prefix,
        open_streams: Arc::clone(&open_streams),
    };
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
            rank,
            exit: None,
            exited_at: None,
            discovered: false,
        });
    }
    drop(ctx);
    drop(tx);
    let prober = Prober::new()
        .map_err(|e| tracing::warn!(error = %e, "filesystem probes unavailable"))
        .ok();
    let detector = Detector::new(config.detector.clone(), Duration::ZERO);
    let mut sup = Supervisor {
        config,
        procs,
        tree_mode,
        detector,
        start,
        procfs: ProcFs::new("/proc"),
        prober,
        kernel_log,
        tails,
        console,
        soft_handled: false,
        hard_handled: false,
        last_verdict: None,
        bundle: None,
        interrupted: None,
        interrupts: 0,
        last_discovery: None,
        last_activity_sample: None,
        activity: HashMap::new(),
        ranks: hangwatch_inspect::ranks::RankFinder::new(),
        heartbeats: Arc::clone(&socket.stats),
    };
    let outcome = sup.run_loop(&rx);
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

struct SignalThread {
    handle: signal_hook::iterator::Handle,
}

impl SignalThread {
    fn close(self) {
        self.handle.close();
    }
}

fn install_signals(tx: Sender<Event>) -> std::io::Result<SignalThread> {
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
            match rx.recv_timeout(wait) {
                Ok(event) => {
                    if let Some(outcome) = self.handle_event(event) {
                        return outcome;
                    }
                    continue;
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
        match event {
            Event::Output { rank, at } => {
                let at = self.since_start(at);
                self.detector.progress(rank, ProgressSource::Output, at);
            }
            Event::Client { message, at } => {
                let at = self.since_start(at);
                let header = message.header();
                match message {
                    ClientMessage::Beat { .. } => {
                        self.detector
                            .progress(header.rank, ProgressSource::Heartbeat, at)
                    }
                    ClientMessage::Phase {
                        begin: true, name, ..
                    } => self.detector.phase_begin(header.rank, &name, at),
                    ClientMessage::Phase {
                        begin: false, name, ..
                    } => self.detector.phase_end(header.rank, &name, at),
                    ClientMessage::Hello { .. } | ClientMessage::Log { .. } => {}
                }
            }
            Event::Signal(sig) => return self.on_signal(sig),
        }
        None
    }

    fn on_signal(&mut self, sig: i32) -> Option<RunOutcome> {
        self.interrupts += 1;
        self.interrupted.get_or_insert(sig);
        let forward = if self.interrupts >= 2 {
            eprintln!("hangwatch: second interrupt: killing the job");
            Signal::SIGKILL
        } else {
            eprintln!("hangwatch: passing the signal on to the job (again to kill it)");
            Signal::try_from(sig).unwrap_or(Signal::SIGTERM)
        };
        for p in self.procs.iter_mut() {
            if p.has_exited() {
                continue;
            }
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(p.pgid), forward);
        }
        None
    }

    fn live(&mut self) -> usize {
        self.procs
            .iter_mut()
            .filter(|p| !p.discovered)
            .map(|p| !p.has_exited())
            .filter(|alive| *alive)
            .count()
    }

    fn tick(&mut self) -> Option<RunOutcome> {
        let now = self.now();
        for p in self.procs.iter_mut() {
            let was = p.exit.is_some() || p.exited_at.is_some();
            if !was && p.has_exited() {
                self.detector.rank_gone(p.rank);
                if let Some(status) = &p.exit {
                    tracing::info!(pid = p.pid, rank = ?p.rank, code = shell_code(status), "rank exited");
                }
            }
        }
        if self.live() == 0 {
            return Some(self.job_ended_by_itself());
        }
        if self.tree_mode {
            self.discover_ranks();
        }
        self.sample_activity();

        let failed_rank = self.failed_rank_waiting();
        let state = self.detector.check(now);
        match state {
            StallState::Healthy if failed_rank.is_none() => {
                if self.soft_handled || self.hard_handled {
                    eprintln!("hangwatch: progress resumed");
                }
                self.soft_handled = false;
                self.hard_handled = false;
                None
            }
            _ if self.interrupted.is_some() => None,
            StallState::Soft {
                stalled_for,
                threshold,
            } if !self.soft_handled => {
                self.soft_handled = true;
                let verdict = self.investigate(stalled_for, &threshold, "soft");
                if self.config.on_hang == OnHang::Abort && is_conclusive(&verdict) {
                    return Some(self.end_job(verdict));
                }
                None
            }
            StallState::Hard {
                stalled_for,
                threshold,
            } if !self.hard_handled => {
                self.hard_handled = true;
                self.soft_handled = true;
                let verdict = self.investigate(stalled_for, &threshold, "hard");
                if self.config.on_hang == OnHang::Abort {
                    return Some(self.end_job(verdict));
                }
                None
            }
            _ => {
                if let Some(since) = failed_rank.filter(|_| !self.hard_handled) {
                    if since >= self.config.failed_rank_grace {
                        self.hard_handled = true;
                        self.soft_handled = true;
                        let threshold = self.detector.threshold();
                        let stalled_for = self.detector.stalled_for(now);
                        let verdict = self.investigate(stalled_for, &threshold, "a rank failed");
                        if self.config.on_hang == OnHang::Abort {
                            return Some(self.end_job(verdict));
                        }
                    }
                }
                None
            }
        }
    }

    /// How long a rank has been gone with a failure while others are still running (`--nproc` mode).
    fn failed_rank_waiting(&mut self) -> Option<Duration> {
        if self.tree_mode {
            return None;
        }
        let failed_at = self
            .procs
            .iter()
            .filter(|p| p.exit.as_ref().is_some_and(|s| !s.success()))
            .filter_map(|p| p.exited_at)
            .min()?;
        (self.live() > 0).then(|| failed_at.elapsed())
    }

    fn rank_pids(&mut self) -> Vec<(i32, Option<u32>)> {
        let mut pids: Vec<(i32, Option<u32>)> = self
            .procs
            .iter()
            .filter(|p| !self.tree_mode || p.discovered)
            .map(|p| (p.pid, p.rank))
            .collect();
        if pids.is_empty() {
            pids = self.procs.iter().map(|p| (p.pid, p.rank)).collect();
        }
        pids
    }

    /// Finds ranks below the launcher: the outermost processes that carry RANK (their descendants are their
    /// workers, never ranks; see `hangwatch_diagnosis::ranks`).
    fn discover_ranks(&mut self) {
        if self
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
        let found = self.ranks.refresh(&self.procfs, &roots);
        for demoted in &found.demoted {
            tracing::info!(
                pid = demoted.id.pid,
                "a process taken for a rank is a launcher: other ranks run below it"
            );
            self.procs
                .retain(|p| !(p.discovered && p.pid == demoted.id.pid && p.exited_at.is_none()));
        }
        for gone in &found.gone {
            // Its pid may already belong to another process, which /proc alone cannot tell.
            if let Some(p) = self
                .procs
                .iter_mut()
                .find(|p| p.discovered && p.pid == gone.id.pid && p.exited_at.is_none())
            {
                p.exited_at = Some(Instant::now());
                self.detector.rank_gone(p.rank);
                tracing::info!(pid = gone.id.pid, rank = gone.rank, "rank exited");
            }
        }
        for new in found.new {
            if let Some(p) = self
                .procs
                .iter_mut()
                .find(|p| p.pid == new.id.pid && p.exited_at.is_none())
            {
                // The command hangwatch started is itself the rank (`hangwatch run -- python train.py` with RANK).
                p.rank.get_or_insert(new.rank);
                continue;
            }
            tracing::info!(
                pid = new.id.pid,
                rank = new.rank,
                "found a rank below the launcher"
            );
            self.procs.push(JobProc {
                waited: None,
                pid: new.id.pid,
                pgid: new.pgid,
                rank: Some(new.rank),
                exit: None,
                exited_at: None,
                discovered: true,
            });
        }
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

    fn thresholds_json(&self, threshold: &Threshold, stalled_for: Duration) -> serde_json::Value {
        let c = self.detector.config();
        serde_json::json!({
            "stalled_for_s": stalled_for.as_secs_f64(),
            "hard_s": threshold.hard.as_secs_f64(),
            "soft_s": threshold.soft.as_secs_f64(),
            "basis": threshold.basis,
            "phase": threshold.phase,
            "samples": threshold.samples,
            "progress_source": threshold.source.map(|s| format!("{s:?}").to_lowercase()),
            "config": {
                "fixed_s": c.fixed.map(|d| d.as_secs_f64()),
                "floor_s": c.floor.as_secs_f64(),
                "ceiling_s": c.ceiling.as_secs_f64(),
                "warmup_s": c.warmup.as_secs_f64(),
                "min_samples": c.min_samples,
                "p95_factor": c.p95_factor,
                "max_factor": c.max_factor,
                "soft_fraction": c.soft_fraction,
            }
        })
    }

    /// Roll call, evidence, alert. Returns the verdict.
    fn investigate(&mut self, stalled_for: Duration, threshold: &Threshold, tier: &str) -> Verdict {
        eprintln!(
            "hangwatch: no progress for {:.1}s ({} threshold {:.0}s, {}): taking a roll call",
            stalled_for.as_secs_f64(),
            tier,
            if tier == "soft" {
                threshold.soft
            } else {
                threshold.hard
            }
            .as_secs_f64(),
            threshold.basis
        );
        let ranks = self.rank_pids();
        let pids: Vec<i32> = ranks.iter().map(|(p, _)| *p).collect();
        let known: HashMap<i32, KnownProcess> = self
            .procs
            .iter()
            .filter(|p| pids.contains(&p.pid))
            .map(|p| {
                let known = KnownProcess {
                    rank: p.rank,
                    exited: p.exit.is_some() || p.exited_at.is_some(),
                    exit_code: p.exit.as_ref().map(shell_code),
                    exited_at_unix_s: p.exited_at.map(unix_time_of),
                };
                (p.pid, known)
            })
            .collect();
        let stacks = StackReadOptions::for_self()
            .unwrap_or_else(|_| StackReadOptions {
                program: PathBuf::from("hangwatch"),
                per_pid_timeout: self.config.stack_timeout,
                total_timeout: self.config.stack_timeout,
                parallelism: 2,
            })
            .with_timeouts(self.config.stack_timeout, pids.len());
        let options = RollCallOptions {
            window: self.config.window,
            read_stacks: true,
            stacks,
            node: self.config.node.clone(),
            stalled_for_s: Some(stalled_for.as_secs_f64()),
        };
        let probe_timeout = self.config.probe_timeout;
        let prober = &mut self.prober;
        let rollcall: RollCall = take_roll_call(&self.procfs, &pids, &known, &options, |mounts| {
            let Some(prober) = prober.as_mut() else {
                return Vec::new();
            };
            let options = ProbeOptions {
                timeout: probe_timeout,
                write: true,
            };
            prober
                .probe_all(mounts, &options)
                .into_iter()
                .filter_map(Result::ok)
                .collect()
        });
        let verdict = rollcall.verdict.clone();
        eprint!("{}", crate::render::verdict_text(&verdict));
        self.save_evidence(&verdict, &rollcall, threshold, stalled_for);
        crate::alert::send(&self.config.alert, &verdict);
        self.last_verdict = Some(verdict.clone());
        verdict
    }

    fn save_evidence(
        &mut self,
        verdict: &Verdict,
        rollcall: &RollCall,
        threshold: &Threshold,
        stalled_for: Duration,
    ) {
        let thresholds = self.thresholds_json(threshold, stalled_for);
        let run = serde_json::json!({
            "hangwatch_version": env!("CARGO_PKG_VERSION"),
            "node": self.config.node,
            "command": self.config.launch.command.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>(),
            "nproc": self.config.launch.nproc,
            "pids": self.procs.iter().map(|p| serde_json::json!({"pid": p.pid, "rank": p.rank})).collect::<Vec<_>>(),
            "running_for_s": self.now().as_secs_f64(),
            "heartbeats": {
                "received": self.heartbeats.received.load(std::sync::atomic::Ordering::Relaxed),
                "malformed": self.heartbeats.malformed.load(std::sync::atomic::Ordering::Relaxed),
                "dropped_by_clients": self.heartbeats.client_dropped.load(std::sync::atomic::Ordering::Relaxed),
            },
            "console_lines_dropped": self.console.as_ref().map(Console::dropped),
        });
        let kernel = self.kernel_log.text();
        let tails = self.tails.snapshot();
        let evidence = Evidence {
            verdict,
            observations: &rollcall.observations,
            probes: &rollcall.probes,
            thresholds: &thresholds,
            kernel_log: &kernel,
            kernel_log_unavailable: self.kernel_log.unavailable.as_deref(),
            tails: &tails,
            run: &run,
        };
        match write_bundle(&self.config.report_dir, &evidence) {
            Ok(_) => {
                eprintln!(
                    "hangwatch: evidence in {}",
                    self.config.report_dir.display()
                );
                self.bundle = Some(self.config.report_dir.clone());
            }
            Err(e) => tracing::error!(error = %e, "could not write the evidence bundle"),
        }
    }

    fn end_job(&mut self, mut verdict: Verdict) -> RunOutcome {
        eprintln!(
            "hangwatch: ending the job: SIGTERM, {:.0}s grace, then SIGKILL",
            self.config.grace.as_secs_f64()
        );
        let procfs = ProcFs::new("/proc");
        let report = terminate(
            &mut self.procs,
            self.config.grace,
            self.config.kill_wait,
            |pid| procfs.stat(pid).ok().map(|s| s.state),
        );
        let ranks_of = |pids: &[i32], procs: &[JobProc]| -> Vec<u32> {
            pids.iter()
                .filter_map(|pid| procs.iter().find(|p| p.pid == *pid).and_then(|p| p.rank))
                .collect()
        };
        let ended: Vec<i32> = report
            .ended_by_term
            .iter()
            .chain(&report.ended_by_kill)
            .copied()
            .collect();
        let unkillable: Vec<i32> = report.unkillable.iter().map(|(p, _)| *p).collect();
        verdict.actions.push(ActionRecord {
            action: "terminate".into(),
            ranks: ranks_of(&ended, &self.procs),
            ok: report.unkillable.is_empty(),
            detail: Some(format!(
                "{} ended by SIGTERM, {} by SIGKILL, {} unkillable, in {:.1}s",
                report.ended_by_term.len(),
                report.ended_by_kill.len(),
                report.unkillable.len(),
                report.elapsed.as_secs_f64()
            )),
        });
        if !report.unkillable.is_empty() {
            let node = self
                .config
                .node
                .clone()
                .unwrap_or_else(|| "this node".into());
            verdict.actions.push(ActionRecord {
                action: "unkillable".into(),
                ranks: ranks_of(&unkillable, &self.procs),
                ok: false,
                detail: Some(
                    report
                        .unkillable
                        .iter()
                        .map(|(pid, state)| {
                            format!("pid {pid} still in state {state} after SIGKILL")
                        })
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
            });
            verdict.recommendations.insert(
                0,
                format!(
                    "processes of this job are stuck in the kernel and cannot be killed: drain {node} (or reboot it) \
                     and restart the job elsewhere"
                ),
            );
            for (pid, state) in &report.unkillable {
                eprintln!("hangwatch: pid {pid} is still in state {state} after SIGKILL: not waiting for it; drain or reboot {node}");
            }
        }
        let _ = std::fs::write(
            self.config.report_dir.join("verdict.json"),
            serde_json::to_vec_pretty(&verdict).unwrap_or_default(),
        );
        let _ = std::fs::write(
            self.config.report_dir.join("verdict.txt"),
            crate::render::verdict_text(&verdict),
        );
        self.last_verdict = Some(verdict.clone());
        RunOutcome {
            exit_code: EXIT_HUNG,
            verdict: Some(verdict),
            bundle: self.bundle.clone(),
            termination: Some(report),
            interrupted_by: None,
        }
    }

    fn job_ended_by_itself(&mut self) -> RunOutcome {
        let mut exits: Vec<(&Instant, i32)> = self
            .procs
            .iter()
            .filter(|p| !p.discovered)
            .filter_map(|p| Some((p.exited_at.as_ref()?, shell_code(p.exit.as_ref()?))))
            .collect();
        exits.sort_by_key(|(at, _)| **at);
        let code = exits.iter().map(|(_, c)| *c).find(|c| *c != 0).unwrap_or(0);
        let code = match self.interrupted {
            Some(sig) if code == 0 || code > 128 => 128 + sig,
            _ => code,
        };
        RunOutcome {
            exit_code: code,
            verdict: self.last_verdict.clone(),
            bundle: self.bundle.clone(),
            termination: None,
            interrupted_by: self.interrupted,
        }
    }
}

/// Seconds since the epoch of a past `Instant`.
fn unix_time_of(at: Instant) -> f64 {
    let now_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    now_unix - at.elapsed().as_secs_f64()
}

/// Evidence strong enough to act on at the soft threshold: a rank blocked in the kernel on a filesystem that
/// does not answer, a stopped rank, or a rank that died. Anything less waits for the hard threshold.
pub fn is_conclusive(verdict: &Verdict) -> bool {
    match verdict.kind {
        VerdictKind::Stopped | VerdictKind::Exited => true,
        VerdictKind::BlockedInKernel => {
            verdict
                .filesystems
                .iter()
                .any(|f| f.responsive == Some(false))
                || verdict.culprits.iter().any(|c| c.state == "D")
        }
        _ => false,
    }
}
