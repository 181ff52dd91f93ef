//! What the loop reads of the job's processes each tick: which ranks exited, where the ranks are (discovery below a
//! launcher, the ranks' own reports), their CPU time as progress, their blocked threads for the fast path, and the
//! stack readers and probes kept ready. [`Sampler`] owns that state; [`Sampler::tick`] feeds the detector and
//! gives the loop one [`Snapshot`] for the policy.

use std::collections::HashMap;
use std::process::{Child, ExitStatus};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hangwatch_diagnosis::ranks::RankClaim;
use hangwatch_diagnosis::{
    thread_blocked, Blocked, CpuWork, Detector, FsStallTracker, ProgressSource, RankSample, Stuck,
    ThreadCpu, Work,
};
use hangwatch_inspect::earlier::EarlierSamples;
use hangwatch_inspect::prepared::PreparedStacks;
use hangwatch_inspect::probe::Prober;
use hangwatch_inspect::ranks::{ClientReports, Discovery, RankFinder};
use hangwatch_inspect::rollcall::{worker_pids, worker_stats};
use hangwatch_model::{unix_now, ProcId, RankSource};
use hangwatch_proc::ProcFs;

use crate::events::{ClientRank, Event};
use crate::members::JobMembers;
use crate::reaper::{JobGroup, Reaper};
use crate::terminate::{cannot_act_on_term, JobProcess};

/// A new set of ranks is given to the stack readers once it has been the same for this long: the interpreters
/// are up by then.
const PREPARE_STACKS_AFTER: Duration = Duration::from_secs(3);

/// How often the identities of the ranks hangwatch started are read again (a wrapper `exec`s the program, a rank
/// moves itself into another cgroup): a dead rank's /proc entry is gone, so its death is explained from these.
const IDENTITY_EVERY: Duration = Duration::from_secs(2);

/// At most this many processes' own reports of their rank are kept (tree mode); only a member inventing
/// processes could get there.
const MAX_CLIENT_RANKS: usize = 65_536;

/// A process of the job: one hangwatch started, or a rank found below the launcher.
#[derive(Clone)]
pub(crate) struct JobProc {
    /// Filled by the thread that waits for this child: the status and the moment it exited.
    pub(crate) waited: Option<ExitSlot>,
    pub(crate) pid: i32,
    pub(crate) pgid: i32,
    /// Start time (clock ticks since boot): with the pid, who this process is — a reused pid is someone else.
    pub(crate) start: Option<u64>,
    pub(crate) rank: Option<u32>,
    /// Where `rank` came from.
    pub(crate) rank_source: Option<RankSource>,
    pub(crate) exit: Option<ExitStatus>,
    pub(crate) exited_at: Option<Instant>,
    /// Found below a launcher rather than started by hangwatch.
    pub(crate) discovered: bool,
    /// Its memory cgroup, name, executable and directory, read while it lives: what explains its death.
    pub(crate) identity: crate::death::RankIdentity,
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

/// `pgid` when one of `job`'s processes leads it, else 0 (no group: the process alone is signalled). A job
/// hangwatch did not start may share its group with processes that are not the job's (the shell it was started
/// from, hangwatch itself).
pub(crate) fn group_led_by_job(pgid: i32, mut job: impl Iterator<Item = i32>) -> i32 {
    if pgid > 1 && job.any(|pid| pid == pgid) {
        pgid
    } else {
        0
    }
}

/// Where a waiter thread leaves a child's exit status and the moment it exited.
pub(crate) type ExitSlot = Arc<Mutex<Option<(ExitStatus, Instant)>>>;

/// Waits for `child` in a thread of its own, so that the order in which ranks exit is known exactly (the first
/// to fail gives the exit code and leads the verdict), not rounded to the supervision tick.
pub(crate) fn wait_in_background(mut child: Child) -> ExitSlot {
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

/// What one tick read of the job, for the policy.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    /// A process hangwatch started is still alive.
    pub(crate) job_alive: bool,
    /// How long ago the first rank failed (`--nproc` mode), whether or not others still run.
    pub(crate) failed_rank_for: Option<Duration>,
    /// The rank blocked longest in a filesystem wait (or stopped) with its I/O still, for the fast path.
    pub(crate) fs_stuck: Option<Stuck>,
}

/// The job's processes and everything read of them between ticks.
pub(crate) struct Sampler {
    procs: Vec<JobProc>,
    /// Ranks are found below the launcher (no `--nproc`).
    tree_mode: bool,
    /// The job was already running (`run --attach`): a process group is signalled only when one of the job's
    /// processes leads it, never a group the job merely shares with others (a login shell's).
    attached: bool,
    procfs: ProcFs,
    prober: Arc<Mutex<Option<Prober>>>,
    members: Arc<JobMembers>,
    /// Where a look for ranks reports ([`Event::Discovered`]).
    events: SyncSender<Event>,
    last_discovery: Option<Instant>,
    last_activity_sample: Option<Instant>,
    last_blocked_sample: Option<Instant>,
    fs_stall: FsStallTracker,
    /// Counters read while the job stalled, for the roll call ([`Sampler::earlier`]).
    earlier: EarlierSamples,
    last_probe_reap: Option<Instant>,
    /// The CPU time of the ranks and their workers at the last look (progress for jobs with no other sign).
    work: CpuWork,
    ranks: Arc<Mutex<RankFinder>>,
    /// What the processes' clients said of their rank (tree mode), by pid and start time.
    client_ranks: ClientReports,
    /// A look for ranks is under way in a worker.
    discovering: bool,
    reaper: Option<Reaper>,
    groups: Vec<JobGroup>,
    /// Stack readers kept ready, the rank pids they were last given, and a new set of pids not yet settled.
    stack_readers: Option<PreparedStacks>,
    stack_pids: Vec<i32>,
    stack_candidate: Option<(Vec<i32>, Instant)>,
    /// When the identities of the live ranks were last read (see [`IDENTITY_EVERY`]).
    last_identity_look: Option<Instant>,
    /// The container the job's client started (`crate::container`): its first process is a root of the look for
    /// ranks, as the processes hangwatch started are.
    container: Option<hangwatch_model::ContainerRef>,
}

/// What a [`Sampler`] starts with.
pub(crate) struct SamplerParts {
    pub(crate) procs: Vec<JobProc>,
    pub(crate) tree_mode: bool,
    pub(crate) attached: bool,
    pub(crate) prober: Option<Prober>,
    pub(crate) members: Arc<JobMembers>,
    pub(crate) events: SyncSender<Event>,
    pub(crate) reaper: Option<Reaper>,
    pub(crate) stack_readers: Option<PreparedStacks>,
    /// With a coordinator, ranks numbered by the structure alone are made global with this node's rank.
    pub(crate) node_rank: Option<u32>,
}

impl Sampler {
    pub(crate) fn new(parts: SamplerParts) -> Self {
        let mut sampler = Sampler {
            procs: parts.procs,
            tree_mode: parts.tree_mode,
            attached: parts.attached,
            procfs: ProcFs::new("/proc"),
            prober: Arc::new(Mutex::new(parts.prober)),
            members: parts.members,
            events: parts.events,
            last_discovery: None,
            last_activity_sample: None,
            last_blocked_sample: None,
            fs_stall: FsStallTracker::new(),
            earlier: EarlierSamples::new(),
            last_probe_reap: None,
            work: CpuWork::new(),
            ranks: Arc::new(Mutex::new(RankFinder::on_node(parts.node_rank))),
            client_ranks: ClientReports::new(),
            discovering: false,
            reaper: parts.reaper,
            groups: Vec::new(),
            stack_readers: parts.stack_readers,
            stack_pids: Vec::new(),
            stack_candidate: None,
            last_identity_look: None,
            container: None,
        };
        sampler.track_groups();
        sampler
    }

    /// One tick's reading: ranks that exited (gone from the detector), and, while the job lives, a look for ranks,
    /// their identities, their CPU time (progress for the detector) and blocked threads. `fs_stall`: the fast
    /// path's threshold (zero: off).
    pub(crate) fn tick(
        &mut self,
        detector: &mut Detector,
        now: Duration,
        fs_stall: Duration,
    ) -> Snapshot {
        for p in self.procs.iter_mut() {
            let was = p.exit.is_some() || p.exited_at.is_some();
            if !was && p.has_exited() {
                self.members.forget(p.pid);
                detector.rank_gone(p.rank);
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
            self.sample_activity(detector, now);
            self.sample_blocked(detector, now, fs_stall);
            self.prepare_stack_readers();
        }
        Snapshot {
            job_alive,
            failed_rank_for: self.failed_rank_since(),
            fs_stuck: self.fs_stall.longest(now),
        }
    }

    /// The job's processes: those hangwatch started, then the ranks found below them.
    pub(crate) fn procs(&self) -> &[JobProc] {
        &self.procs
    }

    /// The rank blocked longest in a filesystem wait (or stopped), as of the last look.
    pub(crate) fn fs_stuck(&self, now: Duration) -> Option<Stuck> {
        self.fs_stall.longest(now)
    }

    pub(crate) fn prober(&self) -> &Arc<Mutex<Option<Prober>>> {
        &self.prober
    }

    pub(crate) fn stack_readers(&self) -> Option<&PreparedStacks> {
        self.stack_readers.as_ref()
    }

    /// The job is over: its processes that outlived their rank (a worker that ignored SIGTERM, a daemon) are ended,
    /// and the reaper is let go.
    pub(crate) fn release(&mut self) {
        // A job hangwatch only watched is not its to clean up after.
        let swept = if self.attached {
            Vec::new()
        } else {
            crate::reaper::sweep(&self.procfs, &self.groups)
        };
        if !swept.is_empty() {
            tracing::info!(count = swept.len(), pids = ?swept, "ended processes of the job that outlived their rank");
        }
        if let Some(reaper) = self.reaper.take() {
            reaper.release();
        }
    }

    /// How each rank ended, for the coordinator's goodbye.
    pub(crate) fn rank_exits(&mut self) -> Vec<hangwatch_rpc::pb::RankExit> {
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

    /// The process groups of the processes still alive, in order (a signal forwarded to the job goes to these).
    pub(crate) fn live_groups(&mut self) -> Vec<i32> {
        self.procs
            .iter_mut()
            .filter_map(|p| (!p.has_exited()).then_some(p.pgid))
            .collect()
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
    pub(crate) fn only_stuck_left(&mut self, stuck: &[i32]) -> bool {
        if stuck.is_empty() {
            return false;
        }
        let live: Vec<i32> = self
            .procs
            .iter_mut()
            .filter_map(|p| (!p.has_exited()).then_some(p.pid))
            .collect();
        live.iter()
            .all(|&pid| cannot_act_on_term(&self.procfs, stuck, pid))
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
    pub(crate) fn track_groups(&mut self) {
        if self.attached {
            // No reaper and no sweep for a job hangwatch did not start: its groups are not hangwatch's.
            return;
        }
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
    pub(crate) fn dead_ranks(&self) -> Vec<crate::death::DeadRank> {
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

    /// Watching a job hangwatch did not start, and no process of it is a rank (yet).
    pub(crate) fn attached_without_ranks(&self) -> bool {
        self.attached && !self.procs.iter().any(|p| p.rank.is_some())
    }

    pub(crate) fn rank_pids(&mut self) -> Vec<(i32, Option<u32>)> {
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
            .chain(self.container.as_ref().and_then(|c| c.host_pid))
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

    /// The job's ranks run in `container` (its client is what hangwatch started): its first process's descendants
    /// are looked at for ranks from now on, at once.
    pub(crate) fn watch_container(&mut self, container: hangwatch_model::ContainerRef) {
        self.container = Some(container);
        self.last_discovery = None;
        self.discover_ranks();
    }

    /// The container the job runs in, once found.
    pub(crate) fn container(&self) -> Option<&hangwatch_model::ContainerRef> {
        self.container.as_ref()
    }

    /// Keeps what a process's client said of its rank, for the next look for ranks (taken at once). With
    /// `--nproc` hangwatch gave every rank its number, and a report changes nothing.
    pub(crate) fn client_rank(&mut self, report: ClientRank) {
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
    pub(crate) fn ranks_found(&mut self, found: Discovery, detector: &mut Detector) {
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
                detector.rank_gone(p.rank);
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
            let pgid = if self.attached {
                group_led_by_job(
                    new.pgid,
                    self.procs.iter().map(|p| p.pid).chain([new.id.pid]),
                )
            } else {
                new.pgid
            };
            self.procs.push(JobProc {
                waited: None,
                pid: new.id.pid,
                pgid,
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

    /// CPU time as progress, only for jobs that never printed nor sent a heartbeat: a rank makes progress when its
    /// own threads, or its workers (a DataLoader's, a child it runs), use at least the floor of
    /// [`hangwatch_diagnosis::work`]; a rank that waits in a collective while its library's background threads
    /// keep a connection does not.
    fn sample_activity(&mut self, detector: &mut Detector, now: Duration) {
        if detector
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
        let ranks = self.rank_pids();
        let rank_pids: Vec<i32> = ranks.iter().map(|(pid, _)| *pid).collect();
        let rank_of: HashMap<i32, Option<u32>> = ranks.iter().copied().collect();
        // Ranks first, then their workers, each with its rank's pid.
        let mut looked: Vec<(i32, i32, u64)> = rank_pids
            .iter()
            .filter_map(|&pid| Some((pid, pid, self.procfs.stat(pid).ok()?.cpu_ticks())))
            .collect();
        looked.extend(
            worker_stats(&self.procfs, &rank_pids)
                .into_iter()
                .map(|(rank_pid, stat)| (stat.pid, rank_pid, stat.cpu_ticks())),
        );
        let mut working: std::collections::BTreeSet<i32> = Default::default();
        for &(pid, rank_pid, ticks) in &looked {
            let procfs = &self.procfs;
            let stats = std::cell::OnceCell::new();
            let threads = || {
                let stats = stats.get_or_init(|| procfs.thread_stats(pid).unwrap_or_default());
                stats
                    .iter()
                    .map(|t: &hangwatch_proc::TaskStat| ThreadCpu {
                        tid: t.pid,
                        name: &t.comm,
                        cpu_ms: ticks_ms(t.cpu_ticks()),
                    })
                    .collect()
            };
            if self.work.look(pid, ticks_ms(ticks), now, threads) == Work::Working {
                working.insert(rank_pid);
            }
        }
        let kept = looked.iter().map(|&(pid, _, _)| pid).collect();
        self.work.retain(&kept);
        for rank_pid in working {
            detector.progress(
                rank_of.get(&rank_pid).copied().flatten(),
                ProgressSource::Activity,
                now,
            );
        }
    }

    /// Counter samples of the ranks and their workers read while the job stalled: a roll call uses them as its
    /// first sample.
    pub(crate) fn earlier(&self) -> &EarlierSamples {
        &self.earlier
    }

    /// The stalled job's cheap look, once a second and only while the job makes no progress (nothing is read
    /// from a healthy job): each rank's and worker's thread counters (kept for the roll call), and for the fast
    /// path each rank's thread states (wait channels of sleeping threads) and its I/O counters. All of it is safe
    /// on a rank in D (/proc stat, status, wchan and io take no lock the rank can hold).
    fn sample_blocked(&mut self, detector: &Detector, now: Duration, fs_stall: Duration) {
        if detector.stalled_for(now) < Duration::from_secs(1) {
            self.fs_stall.observe(&[], now);
            self.earlier.clear();
            return;
        }
        if self
            .last_blocked_sample
            .is_some_and(|t| t.elapsed() < Duration::from_millis(900))
        {
            return;
        }
        self.last_blocked_sample = Some(Instant::now());
        let ranks = self.rank_pids();
        let rank_pids: Vec<i32> = ranks.iter().map(|(pid, _)| *pid).collect();
        let workers = worker_pids(&self.procfs, &rank_pids);
        let mut samples = Vec::with_capacity(ranks.len());
        for (pid, rank) in ranks {
            let sample = self
                .procfs
                .sample_counters(pid)
                .ok()
                .map(|s| (s, Instant::now()));
            if !fs_stall.is_zero() {
                samples.push(self.rank_sample(pid, rank, sample.as_ref().map(|(s, _)| s)));
            }
            if let Some((sample, at)) = sample {
                self.earlier.record(pid, sample, at);
            }
        }
        for &pid in &workers {
            if let Ok(sample) = self.procfs.sample_counters(pid) {
                self.earlier.record(pid, sample, Instant::now());
            }
        }
        let kept: std::collections::HashSet<i32> =
            rank_pids.iter().chain(&workers).copied().collect();
        self.earlier.retain(&kept);
        if fs_stall.is_zero() {
            return;
        }
        self.fs_stall.observe(&samples, now);
    }

    /// The fast path's view of one rank from its counter sample: how any of its threads is blocked (wait
    /// channels read for sleeping threads only), and its I/O counters.
    fn rank_sample(
        &self,
        pid: i32,
        rank: Option<u32>,
        sample: Option<&hangwatch_proc::ProcessSample>,
    ) -> RankSample {
        let mut blocked = None;
        for thread in sample.map(|s| s.threads.as_slice()).unwrap_or_default() {
            let wchan = if thread.stat.state == 'S' {
                self.procfs.wchan(pid, thread.tid).ok().flatten()
            } else {
                None
            };
            match thread_blocked(thread.stat.state, wchan.as_deref()) {
                Some(Blocked::Stopped) => {
                    blocked = Some(Blocked::Stopped);
                    break;
                }
                Some(b) => blocked = Some(b),
                None => {}
            }
        }
        // The sample read /proc/PID/io already.
        let io = sample.and_then(|s| s.io).map(|c| {
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
    }
}

/// Seconds since the epoch of a past `Instant`.
/// Clock ticks of CPU time in milliseconds.
fn ticks_ms(ticks: u64) -> u64 {
    ticks.saturating_mul(1000) / hangwatch_proc::clk_tck().max(1)
}

pub(crate) fn unix_time_of(at: Instant) -> f64 {
    unix_now() - at.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::sync::mpsc::sync_channel;

    use hangwatch_diagnosis::DetectorConfig;
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    /// Children this test started, killed and reaped however it ends (by pid: only ours).
    struct Children(Vec<i32>);
    impl Drop for Children {
        fn drop(&mut self) {
            for &pid in &self.0 {
                // Their children first (a rank's computing child), found below them while they live.
                let below = ProcFs::new("/proc").descendants(pid).unwrap_or_default();
                for p in below.into_iter().chain([pid]) {
                    let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                }
            }
        }
    }

    /// `sh -c script` as rank `rank`, waited for in the background as `run` does for the ranks it starts.
    fn start(script: &str, rank: u32, children: &mut Children) -> JobProc {
        let child = Command::new("sh").args(["-c", script]).spawn().expect("sh");
        let pid = child.id() as i32;
        children.0.push(pid);
        JobProc {
            pid,
            pgid: pid,
            start: ProcFs::new("/proc").stat(pid).ok().map(|s| s.starttime),
            waited: Some(wait_in_background(child)),
            rank: Some(rank),
            rank_source: Some(RankSource::EnvRank),
            exit: None,
            exited_at: None,
            discovered: false,
            identity: crate::death::RankIdentity::default(),
        }
    }

    fn sampler(procs: Vec<JobProc>) -> Sampler {
        let (events, _) = sync_channel(16);
        Sampler::new(SamplerParts {
            procs,
            tree_mode: false,
            attached: false,
            prober: None,
            members: Arc::new(JobMembers::new()),
            events,
            reaper: None,
            stack_readers: None,
            node_rank: None,
        })
    }

    /// Ticks until `done` holds of the snapshot (each tick a real second later on the detector's clock), at most
    /// 20 times.
    fn tick_until(
        sampler: &mut Sampler,
        detector: &mut Detector,
        fs_stall: Duration,
        mut done: impl FnMut(&Snapshot, &Detector) -> bool,
    ) -> Snapshot {
        let begun = Instant::now();
        for _ in 0..20 {
            let snapshot = sampler.tick(detector, begun.elapsed(), fs_stall);
            if done(&snapshot, detector) {
                return snapshot;
            }
            std::thread::sleep(Duration::from_millis(1_050));
        }
        panic!("the condition never held in 20 ticks");
    }

    fn progressed(detector: &Detector, rank: u32) -> bool {
        detector
            .rank_progress()
            .any(|(r, at)| r == Some(rank) && at > Duration::ZERO)
    }

    #[test]
    fn a_rank_that_uses_cpu_makes_progress_and_a_sleeping_one_does_not() {
        let mut children = Children(Vec::new());
        let busy = start("while :; do :; done", 0, &mut children);
        let idle = start("exec sleep 60", 1, &mut children);
        let mut sampler = sampler(vec![busy, idle]);
        let mut detector = Detector::new(DetectorConfig::default(), Duration::ZERO);
        let snapshot = tick_until(&mut sampler, &mut detector, Duration::ZERO, |_, d| {
            progressed(d, 0)
        });
        assert!(snapshot.job_alive);
        assert!(!progressed(&detector, 1), "a sleeping rank shows no CPU");
        assert_eq!(detector.source(), Some(ProgressSource::Activity));
    }

    #[test]
    fn a_rank_that_only_trickles_makes_no_progress_and_one_whose_child_computes_does() {
        let mut children = Children(Vec::new());
        // A waiting rank's housekeeping: a little CPU every moment (a shell starting `sleep` five times a second
        // uses well under the floor), no thread of it computing.
        let trickle = start("while :; do sleep 0.2; done", 0, &mut children);
        // A rank that waits for its child, which computes (a DataLoader worker, `aws s3 cp`).
        let parent = start("sh -c 'while :; do :; done' & wait", 1, &mut children);
        let mut sampler = sampler(vec![trickle, parent]);
        let mut detector = Detector::new(DetectorConfig::default(), Duration::ZERO);
        let begun = Instant::now();
        tick_until(&mut sampler, &mut detector, Duration::ZERO, |_, d| {
            progressed(d, 1)
        });
        let mut last_tick = Duration::ZERO;
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(1_050));
            last_tick = begun.elapsed();
            sampler.tick(&mut detector, last_tick, Duration::ZERO);
        }
        assert!(
            !progressed(&detector, 0),
            "a rank whose CPU time only trickles is waiting"
        );
        // The computing child was found below its rank and kept it progressing.
        let last = detector
            .rank_progress()
            .filter(|(r, _)| *r == Some(1))
            .map(|(_, at)| at)
            .max();
        assert_eq!(last, Some(last_tick));
    }

    #[test]
    fn a_stopped_rank_is_the_fast_paths_stuck_rank_once_the_job_stalls() {
        let mut children = Children(Vec::new());
        let stopped = start("exec sleep 60", 3, &mut children);
        let pid = stopped.pid;
        kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("SIGSTOP");
        let mut sampler = sampler(vec![stopped]);
        let mut detector = Detector::new(DetectorConfig::default(), Duration::ZERO);
        let snapshot = tick_until(
            &mut sampler,
            &mut detector,
            Duration::from_secs(15),
            |s, _| s.fs_stuck.is_some(),
        );
        let stuck = snapshot.fs_stuck.expect("stuck");
        assert_eq!(
            (stuck.pid, stuck.rank, stuck.blocked),
            (pid, Some(3), Blocked::Stopped)
        );
        assert!(
            !sampler.earlier().is_empty(),
            "the counters read while the job stalled are kept for the roll call"
        );
    }

    #[test]
    fn a_failed_rank_is_timed_from_its_exit_and_the_job_lives_until_its_last_rank_ends() {
        let mut children = Children(Vec::new());
        let short = start("exit 3", 0, &mut children);
        let long = start("exec sleep 60", 1, &mut children);
        let long_pid = long.pid;
        let mut sampler = sampler(vec![short, long]);
        let mut detector = Detector::new(DetectorConfig::default(), Duration::ZERO);
        let snapshot = tick_until(&mut sampler, &mut detector, Duration::ZERO, |s, _| {
            s.failed_rank_for.is_some()
        });
        assert!(snapshot.job_alive, "rank 1 still runs");
        let exited: Vec<_> = sampler
            .procs()
            .iter()
            .filter(|p| p.exit.is_some())
            .map(|p| (p.rank, p.exit.and_then(|s| s.code())))
            .collect();
        assert_eq!(exited, vec![(Some(0), Some(3))]);
        kill(Pid::from_raw(long_pid), Signal::SIGKILL).expect("kill");
        let snapshot = tick_until(&mut sampler, &mut detector, Duration::ZERO, |s, _| {
            !s.job_alive
        });
        assert!(snapshot.failed_rank_for.is_some());
    }

    #[test]
    fn a_watched_job_signals_only_groups_its_own_processes_lead() {
        assert_eq!(group_led_by_job(40, [40, 41].into_iter()), 40);
        assert_eq!(
            group_led_by_job(7, [40, 41].into_iter()),
            0,
            "the shell's group"
        );
        assert_eq!(group_led_by_job(1, [1].into_iter()), 0);
    }
}
