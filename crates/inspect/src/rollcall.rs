//! A roll call of rank processes on this node: two /proc samples, Python stacks and rank identities read in
//! throwaway children between them, a second look at the threads whose state was one instant's
//! ([`crate::second_look`]), and probes of the mounts that stuck ranks use. It observes only: the result
//! is the node's [`NodeObservations`], and `hangwatch_diagnosis::decide` makes the verdict from those of every
//! node.
//!
//! Each rank's descendants (its workers: DataLoader, compile, `multiprocessing` children) are sampled too, by the
//! same safe /proc reads but without Python stacks, so that a worker stuck on a filesystem can be named.
//!
//! Nothing here ptrace-stops a rank or touches a watched filesystem from hangwatch's own threads: /proc entries
//! read directly are the safe ones (`docs/inspecting-a-stuck-process.md`); the rest goes through
//! [`crate::pystack`] and the probe children.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hangwatch_diagnosis::{mounts_to_probe_as_seen, superblock_waiter, wants_mappings};
use hangwatch_model::{
    LockHolder, LockWait, MappedFiles, NodeObservations, PipeReader, ProbeResult, ProcId,
    ProcessObservation, SyscallObservation, WorkerOf, NODE_OBSERVATIONS_VERSION,
};
use hangwatch_proc::{
    mapped_files, observe_process, parse_maps, resolve_file_ref, MountTable, ProcFs, ReadError,
    TaskStat,
};

use crate::earlier::EarlierSamples;
use crate::maps::read_maps;
use crate::namespaces::{same_filesystem, MountViews};
use crate::paths::{absolute, read_strings, StringAt};
use crate::prepared::PreparedStacks;
use crate::probe::ProbeTarget;
use crate::pystack::{read_python_processes, PythonProcessReport, StackReadOptions};

/// How to take a roll call.
#[derive(Debug, Clone)]
pub struct RollCallOptions {
    /// Time between the two /proc samples: a thread that did not run during it is "not running".
    pub window: Duration,
    /// Read Python stacks (and rank identities) in children; off: ranks are identified only by what the caller knows.
    pub read_stacks: bool,
    pub stacks: StackReadOptions,
    /// Readers prepared while the job was healthy (`run`); without, stacks are read by throwaway children.
    pub prepared: Option<PreparedStacks>,
    /// This node's name, for the observations.
    pub node: Option<String>,
    /// Mounts to probe besides those the stuck ranks use (the coordinator's probe round).
    pub extra_probes: Vec<String>,
    /// Counter samples read before (by `run`'s tick sampler while the job stalled): those old enough serve as
    /// the first sample, so that the roll call does not wait a window for them.
    pub earlier: EarlierSamples,
}

/// The roll call's result: what this node saw, ready to decide from or to send.
#[derive(Debug)]
pub struct RollCall {
    pub observations: NodeObservations,
    /// How long the roll call took, probes included.
    pub elapsed: Duration,
    /// How many Python stacks were read by readers prepared beforehand.
    pub stacks_prepared: usize,
}

/// What the caller already knows about a process: it launched it (its rank), or reaped it (how and when it
/// exited; /proc no longer has that).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KnownProcess {
    pub rank: Option<u32>,
    /// Where `rank` came from.
    pub rank_source: Option<hangwatch_model::RankSource>,
    pub exited: bool,
    pub exit_code: Option<i32>,
    pub exited_at_unix_s: Option<f64>,
}

/// At most this many workers of one rank are observed (a rank with hundreds of helper processes must not make
/// the roll call slow); the first found, nearest the rank, are kept.
pub const MAX_WORKERS_PER_RANK: usize = 64;

/// A descendant of a rank, to observe with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Worker {
    id: ProcId,
    rank_pid: i32,
    parent_pid: i32,
}

/// The workers of `ranks`: every process below one, owned by the nearest rank above it (a listed pid below
/// another listed pid is a rank of its own, not a worker).
fn workers_of(procfs: &ProcFs, ranks: &[i32]) -> Vec<Worker> {
    workers_with_stats(procfs, ranks)
        .into_iter()
        .map(|(w, _)| w)
        .collect()
}

/// The workers of `ranks` (as [`workers_of`]), each with the `stat` it was found by.
fn workers_with_stats(procfs: &ProcFs, ranks: &[i32]) -> Vec<(Worker, TaskStat)> {
    let listed: std::collections::HashSet<i32> = ranks.iter().copied().collect();
    let mut owner: HashMap<i32, i32> = HashMap::new();
    let mut per_rank: HashMap<i32, usize> = HashMap::new();
    let mut workers = Vec::new();
    for stat in procfs.subtree(ranks) {
        if listed.contains(&stat.pid) {
            owner.insert(stat.pid, stat.pid);
            continue;
        }
        let Some(&rank_pid) = owner.get(&stat.ppid) else {
            continue;
        };
        owner.insert(stat.pid, rank_pid);
        let count = per_rank.entry(rank_pid).or_default();
        if *count >= MAX_WORKERS_PER_RANK {
            continue;
        }
        *count += 1;
        workers.push((
            Worker {
                id: ProcId {
                    pid: stat.pid,
                    start_time: stat.starttime,
                },
                rank_pid,
                parent_pid: stat.ppid,
            },
            stat,
        ));
    }
    workers
}

/// The pids of the workers of `ranks` that a roll call observes with them (the tick sampler keeps their counters
/// too).
pub fn worker_pids(procfs: &ProcFs, ranks: &[i32]) -> Vec<i32> {
    workers_of(procfs, ranks).iter().map(|w| w.id.pid).collect()
}

/// The workers of `ranks`, each with its rank's pid and its `stat` (CPU time): what the tick sampler counts as
/// its rank's work.
pub fn worker_stats(procfs: &ProcFs, ranks: &[i32]) -> Vec<(i32, TaskStat)> {
    workers_with_stats(procfs, ranks)
        .into_iter()
        .map(|(w, stat)| (w.rank_pid, stat))
        .collect()
}

/// Processes above this many are sampled by several threads: /proc reads cost ~15 us a file, and a node's ranks
/// with their workers and threads make thousands.
const SAMPLES_PER_THREAD: usize = 16;

/// `f` of every pid, in order, spread over up to 4 threads.
fn in_parallel<T: Send>(pids: &[i32], f: impl Fn(i32) -> T + Sync) -> Vec<T> {
    let threads = pids
        .len()
        .div_ceil(SAMPLES_PER_THREAD)
        .clamp(1, crate::pystack::default_parallelism().min(4));
    if threads == 1 {
        return pids.iter().map(|&pid| f(pid)).collect();
    }
    let chunk = pids.len().div_ceil(threads);
    let f = &f;
    let run = move |part: &[i32]| part.iter().map(|&pid| f(pid)).collect::<Vec<T>>();
    std::thread::scope(|scope| {
        // A thread that cannot be started leaves its part to this one.
        let parts: Vec<Result<_, &[i32]>> = pids
            .chunks(chunk)
            .map(|part| {
                std::thread::Builder::new()
                    .name("hw-sample".into())
                    .spawn_scoped(scope, move || run(part))
                    .map_err(|_| part)
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|part| match part {
                Ok(handle) => match handle.join() {
                    Ok(done) => done,
                    Err(panic) => std::panic::resume_unwind(panic),
                },
                Err(part) => run(part),
            })
            .collect()
    })
}

/// Observes `pids`, with what the caller already `known`s about them; `probe` probes the named mounts, each as
/// the ranks see it (the caller owns the prober, so that a stuck probe is not restarted).
pub fn take_roll_call(
    procfs: &ProcFs,
    pids: &[i32],
    known: &HashMap<i32, KnownProcess>,
    options: &RollCallOptions,
    probe: impl FnOnce(&[ProbeTarget]) -> Vec<ProbeResult>,
) -> RollCall {
    let started = Instant::now();
    let clk_tck = hangwatch_proc::clk_tck();

    let stack_reader = options.read_stacks.then(|| {
        let pids = pids.to_vec();
        let stack_options = options.stacks.clone();
        let prepared = options.prepared.clone();
        std::thread::spawn(move || match prepared {
            Some(readers) => readers.read(&pids, &stack_options),
            None => read_python_processes(&pids, &stack_options),
        })
    });

    let workers = workers_of(procfs, pids);
    // The first sample only needs the counters that tell whether a thread ran; each process's window is the
    // time between its own two samples. A sample the tick sampler took while the job stalled serves as the first
    // when it is old enough; the others are read now, and the sleep makes their window about `window`.
    let all: Vec<i32> = pids
        .iter()
        .copied()
        .chain(workers.iter().map(|w| w.id.pid))
        .collect();
    let now = Instant::now();
    let earlier: Vec<_> = all
        .iter()
        .map(|&pid| options.earlier.usable(pid, options.window, now))
        .collect();
    let fresh: Vec<i32> = all
        .iter()
        .zip(&earlier)
        .filter(|(_, e)| e.is_none())
        .map(|(&pid, _)| pid)
        .collect();
    // `in_parallel` keeps the order: the fresh samples fill the processes without an earlier one, in turn.
    let mut fresh_first =
        in_parallel(&fresh, |pid| (procfs.sample_counters(pid), Instant::now())).into_iter();
    let first_span = now.elapsed();
    let first: Vec<(i32, Result<_, ReadError>, Instant)> = all
        .iter()
        .zip(earlier)
        .filter_map(|(&pid, earlier)| {
            let (sample, at) = match earlier {
                Some(e) => (Ok(e.sample.clone()), e.at),
                None => fresh_first.next()?,
            };
            Some((pid, sample, at))
        })
        .collect();
    if !fresh.is_empty() {
        std::thread::sleep(options.window.saturating_sub(first_span));
    }
    let mut window = Duration::ZERO;

    let seconds = in_parallel(&all, |pid| (procfs.sample_process(pid), Instant::now()));
    let second_at: Vec<Instant> = seconds.iter().map(|(_, at)| *at).collect();
    let mut observations = Vec::with_capacity(first.len());
    for (i, ((pid, first, first_at), (second, second_at))) in
        first.into_iter().zip(seconds).enumerate()
    {
        let worker = i.checked_sub(pids.len()).and_then(|w| workers.get(w));
        let elapsed = second_at.saturating_duration_since(first_at);
        window = window.max(elapsed);
        // A worker's pid reused by another process between the tree walk and a sample: that worker is gone.
        let reused = |sample: &Result<hangwatch_proc::ProcessSample, ReadError>| {
            worker.is_some_and(|w| {
                sample
                    .as_ref()
                    .is_ok_and(|s| s.stat.starttime != w.id.start_time)
            })
        };
        let (first, second) = if reused(&first) || reused(&second) {
            let gone = || Err(ReadError::ProcessExited { pid });
            (gone(), gone())
        } else {
            (first, second)
        };
        let mut observation = match (first, second) {
            (Ok(first), Ok(second)) => {
                let mut resolver = procfs.file_resolver(pid);
                let mut obs = observe_process(&first, &second, elapsed, clk_tck, |target| {
                    resolver.resolve(target)
                });
                obs.read_issues.extend(resolver.issues().iter().cloned());
                obs.start_time = Some(second.stat.starttime);
                obs
            }
            (_, Err(e)) | (Err(e), _) if e.is_exited() => ProcessObservation {
                pid,
                exited: true,
                ..Default::default()
            },
            (Err(e), _) | (_, Err(e)) => ProcessObservation {
                pid,
                read_issues: vec![format!("could not read /proc for this process: {e}")],
                ..Default::default()
            },
        };
        if let Some(w) = worker {
            observation.start_time = Some(w.id.start_time);
            observation.worker_of = Some(WorkerOf {
                rank_pid: w.rank_pid,
                rank: None,
                rank_source: None,
                parent_pid: w.parent_pid,
            });
            // A worker that exits mid-read is ordinary churn, not a problem with the roll call.
            observation.read_issues.clear();
        }
        observations.push(observation);
    }

    // While the stacks are being read: the path arguments of calls that take one, in a child of their own.
    fill_path_arguments(
        procfs,
        &mut observations,
        &options.stacks.program,
        options.stacks.per_pid_timeout,
    );
    fill_mapped_files(
        procfs,
        &mut observations,
        &options.stacks.program,
        options.stacks.per_pid_timeout,
    );
    fill_lock_waits(procfs, &mut observations);
    fill_pipe_readers(procfs, &mut observations, options.window, clk_tck);
    crate::sockets::fill_socket_waits(procfs, &mut observations, options.window, clk_tck);

    let mut unreadable = Vec::new();
    let mut stacks_prepared = 0;
    let reports: HashMap<i32, PythonProcessReport> = match stack_reader.map(|h| h.join()) {
        Some(Ok(outcome)) => {
            stacks_prepared = outcome.by_prepared;
            outcome.reports
        }
        Some(Err(_)) => {
            unreadable
                .push("the Python stack reader failed: no rank has a Python stack".to_string());
            HashMap::new()
        }
        None => HashMap::new(),
    };
    for obs in &mut observations {
        obs.node = options.node.clone();
        if let Some(k) = known.get(&obs.pid) {
            obs.rank = k.rank;
            obs.rank_source = k.rank_source;
            if k.exited {
                obs.exited = true;
                obs.exit_code = k.exit_code;
                obs.exited_at_unix_s = k.exited_at_unix_s;
                obs.threads.clear();
            }
        }
        if obs.worker_of.is_some() {
            continue;
        }
        if let Some(report) = reports.get(&obs.pid) {
            let env = report.rank_env.as_ref();
            if obs.rank.is_none() {
                let claim =
                    env.and_then(|e| hangwatch_diagnosis::ranks::rank_from_env(|k| e.var(k)));
                obs.rank = claim.map(|c| c.rank);
                obs.rank_source = claim.map(|c| c.source);
            }
            obs.local_rank = obs.local_rank.or_else(|| env.and_then(|e| e.local_rank));
            obs.python = report.threads.clone();
            if !obs.exited {
                obs.read_issues
                    .extend(report.errors.iter().filter(|e| !is_not_python(e)).cloned());
            }
        }
    }

    // A thread whose state was one instant's (in D, or on a CPU with no CPU time known) is looked at again.
    crate::second_look::look_again(procfs, &mut observations, &second_at, clk_tck);

    let rank_of: HashMap<i32, (Option<u32>, Option<hangwatch_model::RankSource>)> = observations
        .iter()
        .filter(|o| o.worker_of.is_none())
        .map(|o| (o.pid, (o.rank, o.rank_source)))
        .collect();
    for obs in &mut observations {
        if let Some(w) = obs.worker_of.as_mut() {
            (w.rank, w.rank_source) = rank_of.get(&w.rank_pid).copied().unwrap_or_default();
        }
    }

    // Paths and mounts as each rank sees them: a rank in a container has its own.
    let views = MountViews::read(procfs, &observations);
    views.identify(&mut observations);

    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
    let mut targets: Vec<ProbeTarget> = Vec::new();
    let mut add = |target: ProbeTarget| {
        if !targets.iter().any(|t| same_filesystem(t, &target)) {
            targets.push(target);
        }
    };
    for m in mounts_to_probe_as_seen(&observations, window_ms) {
        add(views.target(&m));
    }
    for m in &options.extra_probes {
        add(views.target_for_mount(m, pids));
    }
    // A writer waiting on a frozen superblock names no file: every writable mount it can see is probed (each in
    // its own child, under the probe deadline), and the decision names the one that does not answer.
    if let Some(pid) = superblock_waiter(&observations, window_ms) {
        for target in views.writable_targets(pid) {
            add(target);
        }
    }
    let probes = if targets.is_empty() {
        Vec::new()
    } else {
        probe(&targets)
    };
    let (ranks, workers) = observations
        .into_iter()
        .partition(|o| o.worker_of.is_none());
    let took = started.elapsed();
    RollCall {
        observations: NodeObservations {
            version: NODE_OBSERVATIONS_VERSION,
            node: options.node.clone(),
            observed_at_unix_s: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs_f64()),
            window_ms,
            took_ms: Some(u64::try_from(took.as_millis()).unwrap_or(u64::MAX)),
            first_sampled_before: Some(u32::try_from(all.len() - fresh.len()).unwrap_or(u32::MAX)),
            ranks,
            workers,
            probes,
            kernel_log: None,
            unreadable,
            pids: crate::namespaces::own_pid_view(procfs),
            // Asked for by the agent beside the roll call (crates/agent/src/collectives.rs).
            collectives_asked: Vec::new(),
            collectives: Vec::new(),
        },
        elapsed: took,
        stacks_prepared,
    }
}

/// Reads the path argument of every thread blocked in a call that takes one (in one abandonable child, within
/// `deadline`), and names the file: the path resolved against its directory, its mount found by prefix in the
/// process's mount table. A path that cannot be read stays unknown, with why: no file and no mount are named
/// for that call, rather than the working directory's.
fn fill_path_arguments(
    procfs: &ProcFs,
    observations: &mut [ProcessObservation],
    program: &std::path::Path,
    deadline: Duration,
) {
    let wanted: BTreeSet<StringAt> = observations
        .iter()
        .flat_map(|o| {
            o.threads.iter().filter_map(move |t| match &t.syscall {
                Some(SyscallObservation::InSyscall { path: Some(p), .. }) if p.text.is_none() => {
                    Some(StringAt {
                        pid: o.pid,
                        addr: p.addr,
                    })
                }
                _ => None,
            })
        })
        .collect();
    if wanted.is_empty() {
        return;
    }
    let wanted: Vec<StringAt> = wanted.into_iter().collect();
    let read = read_strings(program, &wanted, deadline);
    for o in observations.iter_mut() {
        let mut mounts: Option<Option<MountTable>> = None;
        for t in &mut o.threads {
            let Some(SyscallObservation::InSyscall {
                path: Some(p),
                file,
                name,
                ..
            }) = &mut t.syscall
            else {
                continue;
            };
            let call = name.clone().unwrap_or_else(|| "the call".into());
            match read.get(&StringAt {
                pid: o.pid,
                addr: p.addr,
            }) {
                Some(Ok(text)) => {
                    p.text = Some(text.clone());
                    match absolute(text, p.base.as_deref()) {
                        Some(abs) => {
                            let table = mounts.get_or_insert_with(|| procfs.mountinfo(o.pid).ok());
                            *file = Some(resolve_file_ref(&abs, None, table.as_ref()));
                        }
                        None => {
                            p.unreadable = Some(format!(
                                "{call}() names the relative path {text:?}, and the directory it is relative to is unknown"
                            ));
                        }
                    }
                }
                Some(Err(why)) => {
                    p.unreadable = Some(format!(
                        "the path argument of {call}() could not be read: {why}"
                    ));
                }
                None => {}
            }
            if let Some(why) = &p.unreadable {
                o.read_issues.push(format!("thread {}: {why}", t.tid));
            }
        }
    }
}

/// System calls that wait for a file lock.
const LOCK_CALLS: &[&str] = &["flock", "fcntl", "fcntl64"];

/// For every process with a thread in a lock call: the locks it waits for and who holds them (/proc/locks, read
/// once, only when some process waits in such a call; it lists the kernel's locks and touches no filesystem).
fn fill_lock_waits(procfs: &ProcFs, observations: &mut [ProcessObservation]) {
    let waiting = |o: &ProcessObservation| {
        o.threads.iter().any(|t| {
            matches!(&t.syscall, Some(SyscallObservation::InSyscall { name: Some(name), .. })
                if LOCK_CALLS.contains(&name.as_str()))
        })
    };
    if !observations.iter().any(waiting) {
        return;
    }
    let locks = match procfs.locks() {
        Ok(locks) => locks,
        Err(e) => {
            tracing::debug!(error = %e, "cannot read /proc/locks");
            return;
        }
    };
    let job: Vec<i32> = observations.iter().map(|o| o.pid).collect();
    for o in observations.iter_mut().filter(|o| waiting(o)) {
        o.lock_waits = hangwatch_proc::holders_of_waits(&locks, o.pid)
            .into_iter()
            .map(|(wait, holders)| LockWait {
                class: wait.class,
                file: wait.file,
                holders: holders
                    .into_iter()
                    .map(|h| LockHolder {
                        pid: h.pid,
                        comm: procfs.stat(h.pid).ok().map(|s| s.comm),
                        in_job: job.contains(&h.pid),
                    })
                    .collect(),
            })
            .collect();
    }
}

/// The most readers of one pipe observed (a pipe has one reader; a FIFO a few).
const MAX_PIPE_READERS: usize = 4;

/// The pipe or FIFO a thread of `o` is blocked writing, as the writer names it (`pipe:[5678]`, a FIFO's path).
fn pipe_written(o: &ProcessObservation) -> Option<String> {
    o.threads.iter().find_map(|t| {
        let in_pipe_write = t
            .wchan
            .as_deref()
            .is_some_and(hangwatch_kernel::frames::is_pipe_write_wait);
        match &t.syscall {
            Some(SyscallObservation::InSyscall {
                file: Some(file), ..
            }) if in_pipe_write => Some(file.path.clone()),
            _ => None,
        }
    })
}

/// For every process blocked writing a pipe or FIFO: the processes that hold its read end (a scan of every
/// process's descriptors, by `readlink` and fdinfo only, done only when some rank waits so), each observed as a
/// rank is. The one that stopped reading, and why (its own call, file and mount), is what the rank waits on.
fn fill_pipe_readers(
    procfs: &ProcFs,
    observations: &mut [ProcessObservation],
    window: Duration,
    clk_tck: u64,
) {
    let writers: Vec<(usize, String)> = observations
        .iter()
        .enumerate()
        .filter_map(|(i, o)| pipe_written(o).map(|pipe| (i, pipe)))
        .collect();
    if writers.is_empty() {
        return;
    }
    let job: Vec<i32> = observations.iter().map(|o| o.pid).collect();
    let everyone = procfs.all_stats();
    for (i, pipe) in writers {
        let writer = observations[i].pid;
        let readers: Vec<i32> = everyone
            .iter()
            .map(|s| s.pid)
            .filter(|&pid| pid != writer)
            .filter(|&pid| {
                procfs
                    .open_fds(pid)
                    .unwrap_or_default()
                    .into_iter()
                    .any(|fd| {
                        procfs.fd_link(pid, fd).is_ok_and(|link| link == pipe)
                        // O_WRONLY is 1: a descriptor open for reading (or both) is a reader's.
                        && procfs.fdinfo(pid, fd).is_ok_and(|info| info.flags & 3 != 1)
                    })
            })
            .take(MAX_PIPE_READERS)
            .collect();
        observations[i].pipe_readers = readers
            .into_iter()
            .filter_map(|pid| {
                let observation = procfs.observe_process(pid, window, clk_tck).ok()?;
                Some(PipeReader {
                    pipe: pipe.clone(),
                    in_job: job.contains(&pid),
                    observation: Box::new(observation),
                })
            })
            .collect();
    }
}

/// Reads the memory map of every process with a thread blocked in a page fault (in one abandonable child, within
/// `deadline`) and places each mapped file on its mount with the process's mount table: the file it faults on is
/// one of them, named by the decision once the probes answered.
fn fill_mapped_files(
    procfs: &ProcFs,
    observations: &mut [ProcessObservation],
    program: &std::path::Path,
    deadline: Duration,
) {
    let pids: Vec<i32> = observations
        .iter()
        .filter(|o| wants_mappings(o))
        .map(|o| o.pid)
        .collect();
    if pids.is_empty() {
        return;
    }
    let mut read = read_maps(program, procfs.root(), &pids, deadline);
    for o in observations.iter_mut() {
        let Some(result) = read.remove(&o.pid) else {
            continue;
        };
        o.mapped_files = Some(match result {
            Ok(text) => {
                let table = procfs.mountinfo(o.pid).ok();
                MappedFiles {
                    files: mapped_files(&parse_maps(&text), table.as_ref()),
                    unreadable: None,
                }
            }
            Err(why) => {
                o.read_issues
                    .push(format!("the files it maps are not known: {why}"));
                MappedFiles {
                    files: Vec::new(),
                    unreadable: Some(why),
                }
            }
        });
    }
}

/// py-spy's answer for a process that is not Python is expected in a mixed tree, not a problem worth a warning.
fn is_not_python(error: &str) -> bool {
    error.starts_with("not a readable Python process")
}

/// Whether a process looks like a Python interpreter, from its executable's name (a safe readlink).
pub fn is_python(procfs: &ProcFs, pid: i32) -> bool {
    let exe = procfs.exe(pid).unwrap_or_default();
    let name = exe.rsplit('/').next().unwrap_or("");
    name.starts_with("python") || procfs.stat(pid).is_ok_and(|s| s.comm.starts_with("python"))
}

/// This machine's host name, for verdicts.
pub fn hostname() -> Option<String> {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
}
