//! The roll call's decision: from the observations of every node of a job, group ranks by position (across
//! nodes), name the outliers and their node, and write the one verdict. One node is a slice of length one.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use hangwatch_model::{
    CollectiveAnalysis, CollectiveFinding, CollectiveRecord, Culprit, FilesystemStatus, Group,
    NodeObservations, PageFault, ProbeResult, ProcessObservation, RankPlace, RankReport, Verdict,
    VerdictKind, WorkerRef, WorkerReport, NODE_OBSERVATIONS_VERSION, VERDICT_VERSION,
};

use crate::faults::{fault_place, fault_words, shared_file};
use crate::position::{
    classify, classify_passing, is_filesystem_file, passing_waits, state_words, syscall_file,
    Condition, FrozenMount, Position,
};

/// One node's roll call in the shape older callers and tests build it; [`roll_call`] turns it into a slice of
/// one [`NodeObservations`] for [`decide`].
#[derive(Debug, Clone, Default)]
pub struct RollCallInput {
    /// The ranks and their workers (those with `worker_of` set): a worker is never grouped or counted as a rank;
    /// it is named (with its rank) only when it is stuck on a filesystem.
    pub processes: Vec<ProcessObservation>,
    /// Probes of the mounts that [`mounts_to_probe`] named.
    pub probes: Vec<ProbeResult>,
    /// Milliseconds between the two /proc samples.
    pub window_ms: u64,
    /// The node these processes run on.
    pub node: Option<String>,
    /// How long progress has stopped, when a detector knows.
    pub stalled_for_s: Option<f64>,
    /// Wall-clock time of the observation (seconds since the epoch).
    pub now_unix_s: Option<f64>,
}

/// Up to this many ranks a verdict's roll-call table (`ranks`) has a row for each; beyond, the culprits' rows and
/// one row per group (`Verdict::ranks_not_listed` counts the others). 128 nodes of 8 ranks keep the whole table.
pub const FULL_TABLE_RANKS: usize = 1024;

/// What the decision needs besides the observations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecideOptions {
    /// How long progress has stopped, when a detector knows.
    pub stalled_for_s: Option<f64>,
    /// Every node of the job, when known: one whose observations are missing is named as not seen.
    pub expected_nodes: Vec<String>,
    /// Expected nodes whose observations are missing but that were still heard from (their agents report
    /// progress): they answered late, a loaded node rather than a lost one. Named in `nodes_late`, never as not
    /// seen, so never `node_unreachable`.
    pub answered_late: Vec<String>,
}

impl RollCallInput {
    /// The same observations as one node's [`NodeObservations`].
    pub fn to_node_observations(&self) -> NodeObservations {
        let (ranks, workers) = self
            .processes
            .iter()
            .cloned()
            .partition(|p| p.worker_of.is_none());
        NodeObservations {
            pids: None,
            version: NODE_OBSERVATIONS_VERSION,
            node: self.node.clone(),
            observed_at_unix_s: self.now_unix_s,
            window_ms: self.window_ms,
            took_ms: None,
            first_sampled_before: None,
            ranks,
            workers,
            probes: self.probes.clone(),
            kernel_log: None,
            unreadable: Vec::new(),
            collectives_asked: Vec::new(),
            collectives: Vec::new(),
        }
    }
}

/// Mount points worth probing: those that a stuck thread of a rank or of a worker is using.
/// A process that waits on a frozen superblock with no file known, if any: its mount can only be found by probing
/// every writable mount it sees.
pub fn superblock_waiter(processes: &[ProcessObservation], window_ms: u64) -> Option<i32> {
    processes
        .iter()
        .find(|p| classify(p, window_ms).superblock_wait)
        .map(|p| p.pid)
}

pub fn mounts_to_probe(processes: &[ProcessObservation], window_ms: u64) -> Vec<String> {
    let mounts: BTreeSet<String> = mounts_to_probe_as_seen(processes, window_ms)
        .into_iter()
        .map(|m| m.mount)
        .collect();
    mounts.into_iter().collect()
}

/// A mount to probe as the process that uses it sees it: a rank in a container has its own mounts, so the probe
/// runs in that process's mount namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountToProbe {
    /// The mount point, in the namespace of `pid`.
    pub mount: String,
    /// A stuck process that uses it.
    pub pid: i32,
    /// That process lives in a mount namespace other than hangwatch's.
    pub other_namespace: bool,
    pub fstype: Option<String>,
    pub source: Option<String>,
    pub filesystem: Option<hangwatch_model::FilesystemId>,
}

/// [`mounts_to_probe`], each with a process that uses it; one per filesystem (two containers that bind one
/// filesystem at different paths are one probe).
pub fn mounts_to_probe_as_seen(
    processes: &[ProcessObservation],
    window_ms: u64,
) -> Vec<MountToProbe> {
    let mut out: Vec<MountToProbe> = Vec::new();
    let mut add = |process: &ProcessObservation, file: &hangwatch_model::FileRef| {
        let (Some(mount), Some(key)) = (file.mount.clone(), file.filesystem_key()) else {
            return;
        };
        if out.iter().any(|m| {
            hangwatch_model::filesystem_key(m.filesystem.as_ref(), Some(&m.mount)) == Some(key)
        }) {
            return;
        }
        out.push(MountToProbe {
            mount,
            pid: process.pid,
            other_namespace: process.other_mount_namespace,
            fstype: file.fstype.clone(),
            source: file.source.clone(),
            filesystem: file.filesystem.as_deref().cloned(),
        });
    };
    for process in processes {
        let position = classify(process, window_ms);
        if let Some(file) = position.file.as_ref().filter(|f| is_filesystem_file(f)) {
            if position.filesystem_wait || position.state == 'D' {
                add(process, file);
            }
        }
        // A page fault names no file: the mounts of the files it maps that could be the one.
        if let Some(fault) = &position.fault {
            for file in fault.candidate_files() {
                add(process, file);
            }
        }
        // The reader of a pipe the rank is blocked writing, or the process at the other end of a socket it waits
        // on, stuck on a filesystem of its own (the next hop).
        let peers = process
            .socket_waits
            .iter()
            .filter_map(|w| w.peer.as_ref()?.observation.as_deref());
        for reader in process
            .pipe_readers
            .iter()
            .map(|r| &*r.observation)
            .chain(peers)
        {
            let position = classify(reader, window_ms);
            if let Some(file) = position.file.as_ref().filter(|f| is_filesystem_file(f)) {
                if position.filesystem_wait || position.state == 'D' {
                    add(reader, file);
                }
            }
        }
    }
    out
}

struct Entry<'a> {
    process: &'a ProcessObservation,
    position: Position,
    /// Index of the entry's node in the decision's slice.
    node: usize,
    /// The page fault of its telling thread, with the file named once the node's probes answered.
    page_fault: Option<PageFault>,
    /// The reader of a pipe it is blocked writing, when that reader is stuck itself (the next hop).
    stuck_reader: Option<StuckReader>,
    /// The socket it waits on and whom for (the next hop), when one of its threads waits in a socket call.
    peer_wait: Option<hangwatch_model::PeerWait>,
    /// The thread that would have made it blocked in the kernel had the second look not found its D wait over.
    moment: Option<i32>,
}

/// A process holding the read end of a pipe a rank is blocked writing, stuck itself (in D, in a filesystem
/// wait, or stopped).
struct StuckReader {
    pid: i32,
    comm: Option<String>,
    in_job: bool,
    position: Position,
}

impl StuckReader {
    fn of(process: &ProcessObservation, window_ms: u64) -> Option<StuckReader> {
        process.pipe_readers.iter().find_map(|r| {
            let position = classify(&r.observation, window_ms);
            let stuck = position.state == 'D'
                || position.filesystem_wait
                || position.condition == Condition::Stopped;
            stuck.then(|| StuckReader {
                pid: r.observation.pid,
                comm: r.observation.comm.clone(),
                in_job: r.in_job,
                position,
            })
        })
    }

    /// "its pipe's reader, pid 77 (shipper), not a process of the job, is in uninterruptible sleep (D) in
    /// write() on /logs/all.log"
    fn words(&self) -> String {
        let comm = self
            .comm
            .as_deref()
            .map(|c| format!(" ({c})"))
            .unwrap_or_default();
        let whose = if self.in_job {
            "a process of the job"
        } else {
            "not a process of the job"
        };
        let call = self
            .position
            .syscall_name
            .as_deref()
            .map(|s| format!(" in {s}()"))
            .unwrap_or_default();
        let on = self
            .position
            .file
            .as_ref()
            .map(|f| format!(" on {}", f.path))
            .unwrap_or_default();
        format!(
            "its pipe's reader, pid {}{comm}, {whose}, is in {}{call}{on}",
            self.pid,
            state_words(self.position.state)
        )
    }
}

/// The observations a decision is made from, and whether they span more than one node.
struct Ctx<'a> {
    nodes: &'a [NodeObservations],
    multi: bool,
}

impl Ctx<'_> {
    fn node_name(&self, entry: &Entry) -> Option<&str> {
        self.nodes[entry.node].node.as_deref()
    }

    fn probes(&self, entry: &Entry) -> &[ProbeResult] {
        &self.nodes[entry.node].probes
    }
}

impl Entry<'_> {
    fn label(&self) -> String {
        match &self.process.worker_of {
            Some(w) => format!(
                "{}'s worker pid {}",
                rank_label(w.rank, w.rank_pid),
                self.process.pid
            ),
            None => rank_label(self.process.rank, self.process.pid),
        }
    }

    /// The pid of the rank this entry stands for (its own, or its rank's for a worker).
    fn rank_pid(&self) -> i32 {
        self.process
            .worker_of
            .as_ref()
            .map_or(self.process.pid, |w| w.rank_pid)
    }
}

fn rank_label(rank: Option<u32>, pid: i32) -> String {
    match rank {
        Some(rank) => format!("rank {rank}"),
        None => format!("pid {pid}"),
    }
}

/// A worker's place in its rank's tree, in words.
fn worker_role(process: &ProcessObservation) -> Option<String> {
    let w = process.worker_of.as_ref()?;
    let rank = rank_label(w.rank, w.rank_pid);
    let kin = if w.parent_pid == w.rank_pid {
        format!("child of {rank}")
    } else {
        format!("descendant of {rank} (parent pid {})", w.parent_pid)
    };
    // PyTorch names its DataLoader worker processes so.
    Some(match process.comm.as_deref() {
        Some("pt_data_worker") => format!("DataLoader worker, {kin}"),
        _ => kin,
    })
}

/// Whether a filesystem wait is on a mount that a probe (on the same node) found responsive: ordinary I/O, not a
/// hang.
fn on_responsive_mount(entry: &Entry, ctx: &Ctx) -> bool {
    let Some(key) = entry
        .position
        .file
        .as_ref()
        .and_then(|f| f.filesystem_key())
    else {
        return false;
    };
    ctx.probes(entry)
        .iter()
        .find(|p| p.filesystem_key() == Some(key))
        .and_then(|p| p.responsive)
        == Some(true)
}

/// A worker that holds its rank up: in a filesystem wait (D, or S on a filesystem), not run during the whole
/// sample window, and not on a mount that answered its probe. Workers churn through I/O all the time, so a worker
/// caught in a short D read of a healthy disk is not one; an exited worker never is.
fn is_stuck_worker(entry: &Entry, ctx: &Ctx) -> bool {
    !entry.process.exited
        && entry.position.condition == Condition::BlockedInKernel
        && thread_of(entry).is_some_and(|t| t.not_running_for_ms.is_some())
        && !on_responsive_mount(entry, ctx)
}

/// Decides the verdict from one node's roll call.
pub fn roll_call(input: &RollCallInput) -> Verdict {
    decide(
        &[input.to_node_observations()],
        &DecideOptions {
            stalled_for_s: input.stalled_for_s,
            expected_nodes: Vec::new(),
            answered_late: Vec::new(),
        },
    )
}

/// Decides the one verdict of a job from the observations of all its nodes: groups across nodes, the outlier
/// and its node, and the nodes that were not seen.
pub fn decide(nodes: &[NodeObservations], options: &DecideOptions) -> Verdict {
    let seen: BTreeSet<&str> = nodes.iter().filter_map(|n| n.node.as_deref()).collect();
    let missing: BTreeSet<&String> = options
        .expected_nodes
        .iter()
        .filter(|n| !seen.contains(n.as_str()))
        .collect();
    let (nodes_late, nodes_not_seen): (Vec<String>, Vec<String>) = missing
        .into_iter()
        .cloned()
        .partition(|n| options.answered_late.contains(n));
    let ctx = Ctx {
        nodes,
        multi: nodes.len() + nodes_not_seen.len() + nodes_late.len() > 1,
    };
    let entry = |node: usize, process| {
        let window_ms = nodes[node].window_ms;
        let mut position = classify(process, window_ms);
        // A thread seen in D once, whose wait was over a moment later, with nothing it may wait on failing to
        // answer and no hung-task report: not what makes the process blocked.
        let passing = passing_waits(process, |t| nothing_unanswered(t, &nodes[node]));
        let mut moment = None;
        if !passing.is_empty() {
            if position.condition == Condition::BlockedInKernel {
                moment = position.tid.filter(|tid| passing.contains(tid));
            }
            position = classify_passing(process, window_ms, &passing);
        }
        let page_fault = position.fault.as_ref().map(|fault| {
            let (page_fault, file) = fault.resolve(&nodes[node].probes);
            if position.file.is_none() {
                position.file = file;
            }
            if position.file.is_none() {
                position.frozen_mount = shared_file(&page_fault).and_then(|f| {
                    Some(FrozenMount {
                        mount: f.mount.clone()?,
                        fstype: f.fstype.clone(),
                        filesystem: f.filesystem.as_deref().cloned(),
                    })
                });
            }
            page_fault
        });
        let position_tid = position.tid;
        Entry {
            process,
            position,
            node,
            page_fault,
            stuck_reader: StuckReader::of(process, window_ms),
            peer_wait: crate::sockets::peer_wait(process, position_tid, window_ms, |pid| {
                nodes[node].processes().find(|p| p.pid == pid)
            }),
            moment,
        }
    };
    let mut entries: Vec<Entry> = Vec::new();
    let mut workers: Vec<Entry> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        // A process lands where its `worker_of` says, whichever list it came in.
        for process in n.processes() {
            match process.worker_of {
                None => entries.push(entry(i, process)),
                Some(_) => workers.push(entry(i, process)),
            }
        }
    }
    // By rank, then node name (not arrival order), then pid: the same verdict whatever order nodes report in.
    let node_key = |e: &Entry| nodes[e.node].node.as_deref();
    entries.sort_by(|a, b| {
        let key = |e: &Entry| {
            (
                e.process.rank.unwrap_or(u32::MAX),
                node_key(e),
                e.process.pid,
            )
        };
        key(a).cmp(&key(b))
    });
    workers.sort_by(|a, b| {
        let key = |e: &Entry| {
            let rank = e.process.worker_of.as_ref().and_then(|w| w.rank);
            (rank.unwrap_or(u32::MAX), node_key(e), e.process.pid)
        };
        key(a).cmp(&key(b))
    });

    // Filesystem waits on a mount that a probe found responsive are ordinary I/O, not a hang.
    for entry in entries.iter_mut().chain(workers.iter_mut()) {
        if entry.position.condition == Condition::BlockedInKernel
            && entry.position.state != 'D'
            && on_responsive_mount(entry, &ctx)
        {
            entry.position.condition = Condition::Waiting;
        }
    }

    let groups = group_entries(&entries);
    let majority = groups
        .iter()
        .max_by_key(|(_, members)| members.len())
        .map(|(key, members)| (key.clone(), members.len()));
    let majority_unique = majority
        .as_ref()
        .is_some_and(|(_, n)| groups.values().filter(|m| m.len() == *n).count() == 1);
    let majority_waits = majority.as_ref().is_some_and(|(key, _)| {
        groups[key].iter().all(|&i| {
            matches!(
                entries[i].position.condition,
                Condition::Waiting | Condition::BlockedInKernel
            )
        })
    });

    let mut culprit_idx: Vec<usize> = (0..entries.len())
        .filter(|&i| {
            matches!(
                entries[i].position.condition,
                Condition::BlockedInKernel | Condition::Stopped | Condition::Exited
            )
        })
        .collect();
    let mut kind = culprit_idx
        .iter()
        .map(|&i| entries[i].position.condition)
        .min()
        .map(|c| match c {
            Condition::BlockedInKernel => VerdictKind::BlockedInKernel,
            Condition::Stopped => VerdictKind::Stopped,
            _ => VerdictKind::Exited,
        });
    if let Some(k) = kind {
        let keep = match k {
            VerdictKind::BlockedInKernel => Condition::BlockedInKernel,
            VerdictKind::Stopped => Condition::Stopped,
            _ => Condition::Exited,
        };
        culprit_idx.retain(|&i| entries[i].position.condition == keep);
        if keep == Condition::Exited {
            // The first to fail is the cause; the others followed it. A rank that finished (code 0) failed at
            // nothing, whenever it left.
            culprit_idx.sort_by(|&a, &b| {
                let t = |i: usize| entries[i].process.exited_at_unix_s.unwrap_or(f64::INFINITY);
                let finished = |i: usize| entries[i].process.exit_code == Some(0);
                finished(a).cmp(&finished(b)).then(t(a).total_cmp(&t(b)))
            });
        }
    }

    if kind.is_none() && entries.len() > 1 {
        let running: Vec<usize> = (0..entries.len())
            .filter(|&i| entries[i].position.condition == Condition::Running)
            .collect();
        let waiting = entries.len() - running.len();
        if !running.is_empty() && running.len() < waiting {
            kind = Some(VerdictKind::Busy);
            culprit_idx = running;
        } else if let (Some((key, _)), true, true) = (&majority, majority_unique, majority_waits) {
            let outliers: Vec<usize> = (0..entries.len())
                .filter(|i| !groups[key].contains(i))
                .collect();
            if outliers.is_empty() {
                kind = Some(VerdictKind::CollectiveHang);
            } else {
                kind = Some(VerdictKind::Diverged);
                culprit_idx = outliers;
            }
        }
    }
    // A rank waiting for a file lock that someone holds, writing a pipe whose reader is stuck, or deadlocked within
    // itself (every thread waits, two or more for a lock), is what its peers wait on, however many wait with it; the
    // holder or the reader is named with it (the next hop).
    if matches!(kind, None | Some(VerdictKind::CollectiveHang)) {
        let lock_waiters: Vec<usize> = (0..entries.len())
            .filter(|&i| {
                entries[i]
                    .process
                    .lock_waits
                    .iter()
                    .any(|w| !w.holders.is_empty())
                    || entries[i].stuck_reader.is_some()
                    || entries[i]
                        .peer_wait
                        .as_ref()
                        .is_some_and(crate::sockets::blames_waiter)
                    || in_rank(&entries[i], &ctx).1.is_some()
            })
            .collect();
        if !lock_waiters.is_empty() && lock_waiters.len() < entries.len() {
            kind = Some(VerdictKind::Diverged);
            culprit_idx = lock_waiters;
        }
    }
    // Where no rank stands out in /proc (all wait, often at one line), the ranks' Flight Recorders say who did not
    // join which collective, or entered another one.
    let collectives = collective_analysis(nodes);
    let recorder_culprits: Vec<usize> = collectives.as_ref().map_or_else(Vec::new, |a| {
        let named: BTreeSet<u32> = a
            .findings
            .iter()
            .flat_map(|f| f.culprits().iter().copied())
            .collect();
        (0..entries.len())
            .filter(|&i| entries[i].process.rank.is_some_and(|r| named.contains(&r)))
            .collect()
    });
    let mut kind_from_recorder = matches!(kind, None | Some(VerdictKind::CollectiveHang))
        && !recorder_culprits.is_empty()
        && recorder_culprits.len() < entries.len();
    if kind_from_recorder {
        kind = Some(VerdictKind::Diverged);
        culprit_idx = recorder_culprits.clone();
    }
    // A worker stuck on a filesystem holds its rank, and so everyone, up: it outranks every other finding but a
    // rank that is itself blocked in the kernel, next to which it is listed.
    let stuck_workers: Vec<usize> = (0..workers.len())
        .filter(|&i| is_stuck_worker(&workers[i], &ctx))
        .collect();
    if !stuck_workers.is_empty() && kind != Some(VerdictKind::BlockedInKernel) {
        kind = Some(VerdictKind::BlockedInKernel);
        culprit_idx.clear();
        kind_from_recorder = false;
    }
    // No rank that was seen stands out, and some node was not seen: that node is the finding.
    if matches!(kind, None | Some(VerdictKind::CollectiveHang)) && !nodes_not_seen.is_empty() {
        kind = Some(VerdictKind::NodeUnreachable);
        culprit_idx.clear();
    }
    let kind = kind.unwrap_or(VerdictKind::Unknown);
    culprit_idx.extend(stuck_workers.iter().map(|&i| entries.len() + i));
    let n_ranks = entries.len();
    let mut all = entries;
    all.extend(workers);
    // A writer waiting on a frozen superblock names no file: the one mount of its node that did not answer its
    // probe is the one it waits on (with two or more, none is guessed).
    for e in all.iter_mut().filter(|e| {
        e.position.superblock_wait && e.position.file.is_none() && e.position.frozen_mount.is_none()
    }) {
        let stuck: Vec<&ProbeResult> = nodes[e.node]
            .probes
            .iter()
            .filter(|p| p.responsive == Some(false) && p.mount.is_some())
            .collect();
        if let [only] = stuck.as_slice() {
            e.position.frozen_mount = only.mount.clone().map(|mount| FrozenMount {
                mount,
                fstype: only.fstype.clone(),
                filesystem: only.filesystem.clone(),
            });
        }
    }
    let entries = &all[..n_ranks];

    let mut filesystems: Vec<FilesystemStatus> = Vec::new();
    for (node, probe) in nodes
        .iter()
        .flat_map(|n| n.probes.iter().map(move |p| (&n.node, p)))
    {
        let Some(mount) = probe.mount.clone() else {
            continue;
        };
        let key = probe.filesystem_key().unwrap_or(&mount);
        if filesystems
            .iter()
            .any(|f| f.filesystem_key() == key && &f.node == node)
        {
            continue;
        }
        filesystems.push(FilesystemStatus {
            mount,
            node: node.clone(),
            fstype: probe.fstype.clone(),
            responsive: probe.responsive,
            detail: Some(probe.detail.clone()),
            filesystem: probe.filesystem.clone(),
        });
    }

    let mut culprits: Vec<Culprit> = culprit_idx
        .iter()
        .map(|&i| culprit(&all[i], &ctx, kind))
        .collect();
    if kind_from_recorder {
        // Named by the recorder, not by where it is: its place is its peers'.
        for (c, &i) in culprits.iter_mut().zip(&culprit_idx) {
            let said = collectives.as_ref().and_then(|a| {
                a.findings
                    .iter()
                    .find(|f| c.at.rank.is_some_and(|r| f.culprits().contains(&r)))
            });
            if let Some(finding) = said {
                c.reason = Some(format!(
                    "in {} ({}), where its peers are too; the Flight Recorder: {}",
                    c.at.where_,
                    state_words(all[i].position.state),
                    finding.sentence()
                ));
            }
        }
    }
    let mut group_list: Vec<(Group, &Vec<usize>)> = groups
        .iter()
        .map(|((where_, state), members)| {
            let group = Group {
                where_: where_.clone(),
                state: state.to_string(),
                ranks: members
                    .iter()
                    .filter_map(|&i| entries[i].process.rank)
                    .collect(),
                // Past the full table, a group of numbered ranks lists no pids: thousands of them, repeating from
                // node to node, name nothing without their node (each node's bundle has its rows).
                pids: if entries.len() > FULL_TABLE_RANKS
                    && members.iter().all(|&i| entries[i].process.rank.is_some())
                {
                    Vec::new()
                } else {
                    members.iter().map(|&i| entries[i].process.pid).collect()
                },
                nodes: members
                    .iter()
                    .filter_map(|&i| node_of(&entries[i], &ctx))
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
            };
            (group, members)
        })
        .collect();
    group_list.sort_by(|(a, a_members), (b, b_members)| {
        b_members
            .len()
            .cmp(&a_members.len())
            .then_with(|| a.where_.cmp(&b.where_))
    });

    let activity = crate::activity::activity(
        &all.iter()
            .map(|e| crate::activity::Seen {
                rank: e
                    .process
                    .worker_of
                    .as_ref()
                    .map_or(e.process.rank, |w| w.rank),
                rank_pid: e.rank_pid(),
                worker: e.process.worker_of.is_some(),
                condition: e.position.condition,
                where_: &e.position.where_,
                own_code: e.position.own_code.as_deref(),
                bytes_per_s: e.process.bytes_per_s_during_sample,
                slow_filesystem: e.position.condition == Condition::BlockedInKernel
                    && on_responsive_mount(e, &ctx),
            })
            .collect::<Vec<_>>(),
        !nodes_not_seen.is_empty()
            || !nodes_late.is_empty()
            || kind == VerdictKind::NodeUnreachable,
    )
    // A worker stuck on a filesystem makes the verdict conclusive, whatever computes elsewhere.
    .filter(|_| kind != VerdictKind::BlockedInKernel);
    let mut summary = summarize(
        kind,
        &all,
        n_ranks,
        &culprit_idx,
        &group_list,
        &filesystems,
        &nodes_not_seen,
        &ctx,
    );
    if let (Some(a), VerdictKind::Unknown) = (&activity, kind) {
        summary = format!("working in silence: {}", a.summary);
    }
    if !nodes_late.is_empty() {
        let (noun, its) = if nodes_late.len() == 1 {
            ("node", "its")
        } else {
            ("nodes", "their")
        };
        summary = format!(
            "{summary}; {noun} {} answered late ({its} ranks are not in this verdict)",
            nodes_late.join(", ")
        );
    }
    let recorder_says: Vec<String> = collectives
        .iter()
        .flat_map(|a| a.findings.iter().take(2).map(CollectiveFinding::sentence))
        .collect();
    if !recorder_says.is_empty() {
        // Who (the recorder) and why (the kernel view) in one sentence; the recorder's first where it decided.
        summary = if kind_from_recorder {
            format!("{}; {summary}", recorder_says.join("; "))
        } else {
            format!(
                "{summary}; the Flight Recorder: {}",
                recorder_says.join("; ")
            )
        };
    }
    let recommendations = recommend(
        kind,
        &all,
        n_ranks,
        &culprit_idx,
        &filesystems,
        &nodes_not_seen,
        &ctx,
    );
    let mut warnings = Vec::new();
    if let Some(unknown) = ranks_unknown(entries.iter().map(|e| e.process)) {
        warnings.push(unknown);
    }
    if let Some(analysis) = &collectives {
        warnings.extend(recorder_warnings(
            analysis,
            &culprit_idx,
            &recorder_culprits,
            kind_from_recorder,
        ));
    }
    for node in &nodes_not_seen {
        warnings.push(format!(
            "node {node} was not seen: its observations did not arrive, so its ranks are not in this verdict"
        ));
    }
    for node in &nodes_late {
        warnings.push(format!(
            "node {node} answered late: its agent still reports progress but its observations missed the roll call's \
             deadline (a loaded node, not an unreachable one), so its ranks are not in this verdict"
        ));
    }
    warnings.extend(moment_warnings(&all, &ctx));
    for n in nodes {
        for what in &n.unreadable {
            match &n.node {
                Some(name) if ctx.multi => warnings.push(format!("node {name}: {what}")),
                _ => warnings.push(what.clone()),
            }
        }
    }
    for entry in entries {
        for issue in &entry.process.read_issues {
            let node = match ctx.node_name(entry) {
                Some(name) if ctx.multi => format!("node {name}, "),
                _ => String::new(),
            };
            warnings.push(format!(
                "{} ({node}pid {}): {issue}",
                entry.label(),
                entry.process.pid
            ));
        }
    }

    // Beyond FULL_TABLE_RANKS the table lists the culprits and the first rank of each group: a 10,000-rank job's
    // every row and thread would be over 100 MiB in one verdict, which every node's bundle already holds in part.
    let listed: Option<BTreeSet<usize>> = (entries.len() > FULL_TABLE_RANKS).then(|| {
        culprit_idx
            .iter()
            // A culprit is a rank, or a worker listed as its rank's row.
            .filter_map(|&i| {
                if i < n_ranks {
                    Some(i)
                } else {
                    rank_entry_of(&all[i], entries)
                }
            })
            .chain(
                groups
                    .values()
                    .filter_map(|members| members.first().copied()),
            )
            .collect()
    });
    if let Some(l) = &listed {
        warnings.push(format!(
            "the roll-call table lists {} of {} ranks (each culprit and the first rank of each group; every rank \
             is in its group): each node's evidence bundle keeps its own ranks' rows",
            l.len(),
            entries.len()
        ));
    }

    // Pids are the node's unless every agent watched from inside a container.
    let views: BTreeSet<_> = nodes.iter().filter_map(|n| n.pids).collect();
    let mut verdict = Verdict {
        pids: match views.into_iter().collect::<Vec<_>>().as_slice() {
            [one] => Some(*one),
            _ => None,
        },
        version: VERDICT_VERSION,
        kind,
        summary,
        stalled_for_s: options.stalled_for_s,
        culprits,
        groups: group_list.into_iter().map(|(g, _)| g).collect(),
        filesystems,
        actions: Vec::new(),
        observed_at_unix_s: nodes
            .iter()
            .filter_map(|n| n.observed_at_unix_s)
            .max_by(f64::total_cmp),
        node: match nodes {
            [one] => one.node.clone(),
            _ => None,
        },
        recommendations,
        warnings,
        ranks: {
            // Each rank's workers, found by (node, rank pid) once rather than by a scan per rank.
            let mut workers_of: HashMap<(usize, i32), Vec<&Entry>> = HashMap::new();
            for w in &all[n_ranks..] {
                workers_of
                    .entry((w.node, w.rank_pid()))
                    .or_default()
                    .push(w);
            }
            entries
                .iter()
                .enumerate()
                .filter(|(i, _)| listed.as_ref().is_none_or(|l| l.contains(i)))
                .map(|(_, e)| {
                    let workers = workers_of.get(&(e.node, e.process.pid));
                    rank_report(e, workers.map_or(&[][..], Vec::as_slice), &ctx)
                })
                .collect()
        },
        ranks_not_listed: listed.as_ref().map_or(0, |l| {
            u32::try_from(entries.len() - l.len()).unwrap_or(u32::MAX)
        }),
        nodes_not_seen,
        nodes_late,
        recurrence: None,
        activity,
        scope: None,
        scope_evidence: Vec::new(),
        collectives,
        container: None,
    };
    crate::scope::apply_scope(&mut verdict, &[]);
    verdict
}

/// A job-wide verdict as one node keeps it in its evidence: when the table left ranks out (`ranks_not_listed`),
/// this node's own rows are made from its own observations, as the coordinator would have listed them.
pub fn with_own_rows(mut verdict: Verdict, own: &NodeObservations) -> Verdict {
    if verdict.ranks_not_listed == 0 {
        return verdict;
    }
    let mine = decide(std::slice::from_ref(own), &DecideOptions::default()).ranks;
    let before = verdict.ranks.len();
    for row in mine {
        if !verdict
            .ranks
            .iter()
            .any(|r| r.at.node == row.at.node && r.at.pid == row.at.pid)
        {
            verdict.ranks.push(row);
        }
    }
    let added = u32::try_from(verdict.ranks.len() - before).unwrap_or(u32::MAX);
    verdict.ranks_not_listed = verdict.ranks_not_listed.saturating_sub(added);
    verdict.ranks.sort_by(|a, b| {
        let key = |r: &RankReport| (r.at.rank.unwrap_or(u32::MAX), r.at.node.clone(), r.at.pid);
        key(a).cmp(&key(b))
    });
    verdict
}

/// Groups entries by (where, state). Keys sort deterministically.
fn group_entries(entries: &[Entry]) -> BTreeMap<(String, char), Vec<usize>> {
    let mut groups: BTreeMap<(String, char), Vec<usize>> = BTreeMap::new();
    for (i, entry) in entries.iter().enumerate() {
        groups
            .entry((entry.position.where_.clone(), group_state(&entry.position)))
            .or_default()
            .push(i);
    }
    groups
}

/// The state a rank is grouped by: its telling thread's, but a rank that waits and was caught at one instant on a
/// CPU (charged no CPU for it) or in a D wait the second look found over waits where its peers do: it is no odd
/// one out for a letter it showed for a moment.
fn group_state(position: &Position) -> char {
    match (position.condition, position.state) {
        (Condition::Waiting, 'R' | 'D') => 'S',
        (_, state) => state,
    }
}

/// Whether nothing that `thread` may wait on failed to answer on its node and no hung-task report of the node's
/// kernel log names it: the filesystem of the file it is in a call on answered its probe, or, with no such file
/// (a page fault names none), every mount probed on its node answered.
fn nothing_unanswered(
    thread: &hangwatch_model::ThreadObservation,
    node: &NodeObservations,
) -> bool {
    let reported = node.kernel_log.as_ref().is_some_and(|log| {
        log.hung_tasks
            .iter()
            .any(|h| i32::try_from(h.pid).is_ok_and(|pid| pid == thread.tid))
    });
    let answered = |p: &ProbeResult| p.responsive == Some(true);
    let file = syscall_file(thread).filter(|f| is_filesystem_file(f));
    let probes_answered = match file.map(|f| f.filesystem_key()) {
        Some(Some(key)) => {
            let mut its = node
                .probes
                .iter()
                .filter(|p| p.filesystem_key() == Some(key))
                .peekable();
            its.peek().is_some() && its.all(answered)
        }
        Some(None) => false,
        None => node.probes.iter().all(answered),
    };
    !reported && probes_answered
}

/// What the second look set aside: each process whose D wait at the roll call was over a moment later, and so
/// is not taken as blocked in the kernel (at most a few named, the rest counted).
fn moment_warnings(all: &[Entry], ctx: &Ctx) -> Vec<String> {
    const NAMED: usize = 4;
    let moments: Vec<&Entry> = all.iter().filter(|e| e.moment.is_some()).collect();
    let mut out: Vec<String> = moments
        .iter()
        .take(NAMED)
        .filter_map(|e| {
            let tid = e.moment?;
            let thread = e.process.threads.iter().find(|t| t.tid == tid)?;
            let look = thread.second_look?;
            let name = thread
                .name
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            let wchan = thread
                .wchan
                .as_deref()
                .map(|w| format!(" in {w}"))
                .unwrap_or_default();
            let node = match ctx.node_name(e) {
                Some(name) if ctx.multi => format!(" on node {name}"),
                _ => String::new(),
            };
            let then = match look.state {
                'D' => "had run in between".to_string(),
                'X' => "had exited".to_string(),
                other => format!("was in {}", state_words(other)),
            };
            Some(format!(
                "{}{node}: thread {tid}{name} was in uninterruptible sleep (D){wchan} at the roll call and {} ms \
                 later {then}, with no filesystem it may wait on failing to answer and no hung-task report: a \
                 moment, not taken as blocked in the kernel",
                e.label(),
                look.after_ms
            ))
        })
        .collect();
    if moments.len() > NAMED {
        out.push(format!(
            "{} more processes had a thread in D for a moment at the roll call, not taken as blocked in the kernel",
            moments.len() - NAMED
        ));
    }
    out
}

fn node_of(entry: &Entry, ctx: &Ctx) -> Option<String> {
    entry
        .process
        .node
        .clone()
        .or_else(|| ctx.node_name(entry).map(str::to_string))
}

/// The rank entry (an index into the ranks) that `entry` stands for: itself, or its rank for a worker.
fn rank_entry_of(entry: &Entry, ranks: &[Entry]) -> Option<usize> {
    let pid = entry.rank_pid();
    ranks
        .iter()
        .position(|r| r.node == entry.node && r.process.pid == pid)
}

fn thread_of<'a>(entry: &'a Entry) -> Option<&'a hangwatch_model::ThreadObservation> {
    entry
        .position
        .tid
        .and_then(|tid| entry.process.threads.iter().find(|t| t.tid == tid))
}

fn killable(entry: &Entry) -> Option<bool> {
    if entry.position.condition == Condition::Exited {
        return None;
    }
    let wchan = thread_of(entry)
        .and_then(|t| t.wchan.as_deref())
        .unwrap_or("");
    Some(entry.position.state != 'D' || wchan.contains("killable"))
}

/// Where `entry` is, as the verdict says it.
fn place(entry: &Entry, ctx: &Ctx) -> RankPlace {
    let thread = thread_of(entry);
    let file = entry.position.file.as_ref();
    let frozen = entry.position.frozen_mount.as_ref();
    RankPlace {
        filesystem: file
            .and_then(|f| f.filesystem.as_deref().cloned())
            .or_else(|| frozen.and_then(|m| m.filesystem.clone())),
        ns_pid: entry.process.ns_pid,
        rank: entry
            .process
            .worker_of
            .as_ref()
            .map_or(entry.process.rank, |w| w.rank),
        rank_source: entry
            .process
            .worker_of
            .as_ref()
            .map_or(entry.process.rank_source, |w| w.rank_source),
        node: node_of(entry, ctx),
        pid: entry.process.pid,
        comm: entry.process.comm.clone(),
        state: entry.position.state.to_string(),
        where_: entry.position.where_.clone(),
        wchan: thread.and_then(|t| t.wchan.clone()),
        syscall: entry.position.syscall_name.clone(),
        path: file.map(|f| f.path.clone()),
        mount: file
            .and_then(|f| f.mount.clone())
            .or_else(|| frozen.map(|m| m.mount.clone())),
        fstype: file
            .and_then(|f| f.fstype.clone())
            .or_else(|| frozen.and_then(|m| m.fstype.clone())),
        not_running_for_ms: thread.and_then(|t| t.not_running_for_ms),
        tracer_pid: entry.process.tracer_pid.filter(|p| *p != 0),
        sigstop_pending: Some(entry.process.sigstop_pending),
        python_stack: crate::position::python_stack(entry.process, entry.position.tid),
    }
}

fn culprit(entry: &Entry, ctx: &Ctx, kind: VerdictKind) -> Culprit {
    let thread = thread_of(entry);
    let worker = entry.process.worker_of.as_ref().map(|w| WorkerRef {
        pid: entry.process.pid,
        parent_pid: w.parent_pid,
        rank_pid: w.rank_pid,
        role: worker_role(entry.process).unwrap_or_default(),
        comm: entry.process.comm.clone(),
    });
    let reason = match &worker {
        Some(w) => format!(
            "its worker pid {} ({}) is {}",
            w.pid,
            w.role,
            reason(entry, kind)
        ),
        None => reason(entry, kind),
    };
    let (threads, deadlock) = in_rank(entry, ctx);
    let reason = match &deadlock {
        Some(d) => format!("{reason}; {}", d.words),
        None => reason,
    };
    Culprit {
        at: place(entry, ctx),
        tid: entry.position.tid,
        killable: killable(entry),
        kernel_stack: thread.and_then(|t| t.kernel_stack.clone()),
        reason: Some(reason),
        worker,
        exit_code: (entry.position.condition == Condition::Exited)
            .then_some(entry.process.exit_code)
            .flatten(),
        death: (entry.position.condition == Condition::Exited)
            .then(|| entry.process.death.clone())
            .flatten(),
        thread_name: entry.position.thread_name.clone(),
        page_fault: entry.page_fault.clone(),
        lock_wait: entry.process.lock_waits.first().cloned(),
        waits_on_peer: entry.peer_wait.clone(),
        threads,
        deadlock,
    }
}

/// A live rank's threads as a culprit lists them, and a deadlock inside it when one is likely
/// ([`crate::threads`]).
fn in_rank(
    entry: &Entry,
    ctx: &Ctx,
) -> (
    Vec<hangwatch_model::ThreadPlace>,
    Option<hangwatch_model::InRankDeadlock>,
) {
    if entry.position.condition == Condition::Exited {
        return (Vec::new(), None);
    }
    let window_ms = ctx.nodes[entry.node].window_ms;
    let places = crate::threads::thread_places(entry.process, window_ms);
    let deadlock =
        crate::threads::in_rank_deadlock(entry.process, &places, window_ms, &entry.label());
    (places, deadlock)
}

fn reason(entry: &Entry, kind: VerdictKind) -> String {
    let p = &entry.position;
    match p.condition {
        Condition::BlockedInKernel if entry.page_fault.is_some() => {
            let fault = entry.page_fault.as_ref().map_or_else(String::new, |f| {
                format!("{}{}", fault_words(f), fault_place(f))
            });
            format!(
                "in {} in a page fault, blocked {fault}, waiting for the filesystem",
                state_words(p.state)
            )
        }
        Condition::BlockedInKernel => {
            let call = p
                .syscall_name
                .as_deref()
                .map(|s| format!(" in {s}()"))
                .unwrap_or_default();
            let on = p
                .file
                .as_ref()
                .map(|f| format!(" on {}", f.path))
                .unwrap_or_default();
            format!(
                "in {}{call}{on}, waiting for the filesystem",
                state_words(p.state)
            )
        }
        Condition::Stopped => format!(
            "{}: it will not run until it gets SIGCONT",
            state_words(p.state)
        ),
        Condition::Exited => match &entry.process.death {
            Some(death) => death.cause.clone(),
            None => format!("{} while its peers wait", p.where_),
        },
        Condition::Running if kind == VerdictKind::Busy => {
            format!("computing in {} while its peers wait", p.where_)
        }
        _ => format!(
            "in {} ({}), unlike its peers{}",
            p.where_,
            state_words(p.state),
            entry
                .process
                .lock_waits
                .first()
                .map(lock_words)
                .or_else(|| entry
                    .stuck_reader
                    .as_ref()
                    .map(|r| format!("; {}", r.words())))
                .or_else(|| entry
                    .peer_wait
                    .as_ref()
                    .map(|w| format!("; it {}", w.words)))
                .unwrap_or_default()
        ),
    }
}

/// "; the lock (FLOCK on 08:01:131090) is held by pid 4242 (sh), not a process of the job".
fn lock_words(wait: &hangwatch_model::LockWait) -> String {
    let holders: Vec<String> = wait
        .holders
        .iter()
        .map(|h| {
            let whose = if h.in_job {
                "a process of the job"
            } else {
                "not a process of the job"
            };
            match &h.comm {
                Some(comm) => format!("pid {} ({comm}), {whose}", h.pid),
                None => format!("pid {}, {whose}", h.pid),
            }
        })
        .collect();
    if holders.is_empty() {
        return format!(
            "; it waits for a lock ({} on {}) whose holder is not known",
            wait.class, wait.file
        );
    }
    format!(
        "; the lock ({} on {}) is held by {}",
        wait.class,
        wait.file,
        holders.join(" and ")
    )
}

/// Whether the filesystem a rank uses (`mount` as the rank sees it, `key` its identity) answered its probe on
/// `node`, in words.
fn fs_words(
    mount: &str,
    key: &str,
    node: Option<&str>,
    filesystems: &[FilesystemStatus],
) -> String {
    match filesystems
        .iter()
        .find(|f| f.filesystem_key() == key && f.node.as_deref() == node)
    {
        Some(fs) => {
            // The rank's own path leads: a container's probe result may carry another container's path.
            let words = FilesystemStatus {
                mount: mount.to_string(),
                ..fs.clone()
            }
            .words();
            match fs.responsive {
                Some(false) => format!("{words} does not respond"),
                Some(true) => format!("{words} responds"),
                None => format!("{words} could not be probed"),
            }
        }
        None => format!("{mount} was not probed"),
    }
}

fn who(entry: &Entry, ctx: &Ctx) -> String {
    let mut parts = Vec::new();
    parts.extend(worker_role(entry.process));
    if let Some(node) = node_of(entry, ctx) {
        parts.push(format!("node {node}"));
    }
    if entry.process.worker_of.is_none() {
        parts.push(format!("pid {}", entry.process.pid));
        if let Some(inner) = entry.process.ns_pid {
            parts.push(format!("pid {inner} in its container"));
        }
    }
    if let Some(name) = &entry.position.thread_name {
        parts.push(format!("thread {name}"));
    }
    format!("{} ({})", entry.label(), parts.join(", "))
}

/// " on node n2" / " on 3 nodes" for a group of a verdict that spans nodes; nothing for one node.
fn on_nodes(group: &Group, ctx: &Ctx) -> String {
    match group.nodes.as_slice() {
        _ if !ctx.multi => String::new(),
        [] => String::new(),
        [one] => format!(" on node {one}"),
        many => format!(" on {} nodes", many.len()),
    }
}

/// Once per verdict, in words, when some rank processes have no number: the reader should not have to guess why
/// `rank` is `null`.
pub fn ranks_unknown<'a>(
    processes: impl Iterator<Item = &'a ProcessObservation>,
) -> Option<String> {
    let unnumbered = processes
        .filter(|p| p.worker_of.is_none() && p.rank.is_none())
        .count();
    (unnumbered > 0).then(|| {
        format!(
            "the rank of {unnumbered} process{} is not known: no RANK, OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or \
             SLURM_PROCID in its environment, not started by torch.multiprocessing.spawn or Lightning, and no \
             report from the hangwatch client (import hangwatch in the training script); it is named by pid",
            if unnumbered == 1 { "" } else { "es" }
        )
    })
}

/// The missing-rank analysis over every node's Flight Recorder records, when any rank was asked for one.
fn collective_analysis(nodes: &[NodeObservations]) -> Option<CollectiveAnalysis> {
    let asked: Vec<u32> = nodes
        .iter()
        .flat_map(|n| n.collectives_asked.iter().copied())
        .collect();
    if asked.is_empty() {
        return None;
    }
    let records: Vec<CollectiveRecord> = nodes
        .iter()
        .flat_map(|n| n.collectives.iter().cloned())
        .collect();
    Some(crate::collectives::analyse(&records, &asked))
}

/// What the verdict's reader should know of the recorder's view: ranks that did not answer, and a recorder that
/// names other ranks than the kernel view does.
fn recorder_warnings(
    analysis: &CollectiveAnalysis,
    culprits: &[usize],
    recorder_culprits: &[usize],
    kind_from_recorder: bool,
) -> Vec<String> {
    let mut warnings = Vec::new();
    if !analysis.unanswered.is_empty() {
        warnings.push(format!(
            "{} did not return {} Flight Recorder in time (a rank that holds the GIL in a C call cannot): what {} last \
             issued is unknown",
            hangwatch_model::ranks_words(&analysis.unanswered),
            if analysis.unanswered.len() == 1 { "its" } else { "their" },
            if analysis.unanswered.len() == 1 { "it" } else { "they" },
        ));
    }
    if !kind_from_recorder
        && !recorder_culprits.is_empty()
        && !culprits.is_empty()
        && culprits.iter().all(|i| !recorder_culprits.contains(i))
    {
        warnings.push(
            "the Flight Recorder and the processes disagree: the recorder's finding names other ranks than the culprits \
             seen in /proc (both are in this verdict)"
                .to_string(),
        );
    }
    warnings
}

/// `entries`: the ranks (the first `n_ranks`), then the workers; `culprits` index it. `groups` carry the indices
/// of their ranks.
#[allow(clippy::too_many_arguments)]
fn summarize(
    kind: VerdictKind,
    entries: &[Entry],
    n_ranks: usize,
    culprits: &[usize],
    groups: &[(Group, &Vec<usize>)],
    filesystems: &[FilesystemStatus],
    nodes_not_seen: &[String],
    ctx: &Ctx,
) -> String {
    if n_ranks == 0 && nodes_not_seen.is_empty() {
        return "no rank processes found".to_string();
    }
    let rest = {
        let culprit_ranks: BTreeSet<usize> = culprits
            .iter()
            .filter_map(|&i| rank_entry_of(&entries[i], &entries[..n_ranks]))
            .collect();
        let waiting: Vec<&Group> = groups
            .iter()
            .filter(|(_, members)| members.iter().all(|i| !culprit_ranks.contains(i)))
            .map(|(g, _)| g)
            .collect();
        waiting
            .iter()
            .take(3)
            .map(|g| {
                let n = g.size();
                let on = on_nodes(g, ctx);
                let noun = if n == 1 { "rank" } else { "ranks" };
                if g.where_.starts_with("exited") {
                    let verb = if n == 1 { "has" } else { "have" };
                    return format!("{n} {noun}{on} {verb} {}", g.where_);
                }
                let verb = if n == 1 { "waits" } else { "wait" };
                format!("{n} {noun}{on} {verb} in {}", g.where_)
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let groups: Vec<&Group> = groups.iter().map(|(g, _)| g).collect();
    let with_rest = |head: String| {
        if rest.is_empty() {
            head
        } else {
            format!("{head}; {rest}")
        }
    };
    let first = culprits.first().map(|&i| &entries[i]);
    let more = match culprits.len() {
        0 | 1 => String::new(),
        n if kind == VerdictKind::Exited => format!(" first ({} more exited after it)", n - 1),
        n => format!(" (and {} more like it)", n - 1),
    };
    match (kind, first) {
        (VerdictKind::BlockedInKernel, Some(e)) if e.page_fault.is_some() => {
            let p = &e.position;
            let fault = e.page_fault.as_ref().map_or_else(String::new, |f| format!("{}{}", fault_words(f), fault_place(f)));
            let mount = match (&p.file, &p.frozen_mount) {
                (Some(f), _) => f.mount.as_deref().map(|m| (m, f.filesystem_key().unwrap_or(m))),
                (None, Some(m)) => Some((m.mount.as_str(), hangwatch_model::filesystem_key(m.filesystem.as_ref(), Some(&m.mount)).unwrap_or(&m.mount))),
                (None, None) => None,
            };
            let fs = mount.map(|(m, key)| format!("; {}", fs_words(m, key, ctx.node_name(e), filesystems))).unwrap_or_default();
            with_rest(format!("{} is blocked {fault} (a page fault, in {}){fs}{more}", who(e, ctx), state_words(p.state)))
        }
        (VerdictKind::BlockedInKernel, Some(e)) => {
            let p = &e.position;
            let call = p.syscall_name.as_deref().map(|s| format!(" in {s}()")).unwrap_or_default();
            let (on, fs) = match &p.file {
                Some(f) => (
                    format!(" on {}", f.path),
                    f.mount.as_deref().map(|m| format!("; {}", fs_words(m, f.filesystem_key().unwrap_or(m), ctx.node_name(e), filesystems))).unwrap_or_default(),
                ),
                None if p.frozen_mount.is_some() => {
                    let frozen = p.frozen_mount.as_ref();
                    let m = frozen.map(|m| m.mount.as_str()).unwrap_or_default();
                    let key = hangwatch_model::filesystem_key(frozen.and_then(|m| m.filesystem.as_ref()), Some(m)).unwrap_or(m);
                    (" waiting on a frozen superblock".to_string(), format!("; {}", fs_words(m, key, ctx.node_name(e), filesystems)))
                }
                // Named as unknown rather than guessed: the working directory is not the path the call was given.
                None if p.path_unknown.is_some() => (" (the path it was given could not be read)".to_string(), String::new()),
                None => (String::new(), String::new()),
            };
            with_rest(format!("{} is in {}{call}{on}{fs}{more}", who(e, ctx), state_words(p.state)))
        }
        (VerdictKind::Stopped, Some(e)) => with_rest(format!("{} is {}{more}", who(e, ctx), state_words(e.position.state))),
        (VerdictKind::Exited, Some(e)) => match &e.process.death {
            // How it died says more than its exit code; the ranks that left after it followed it.
            Some(death) => {
                let after = match culprits.len() {
                    0 | 1 => String::new(),
                    2 => "; 1 more rank exited after it".to_string(),
                    n => format!("; {} more ranks exited after it", n - 1),
                };
                with_rest(format!("{} {}{after}", who(e, ctx), death.cause))
            }
            None => with_rest(format!("{} {}{more}", who(e, ctx), e.position.where_)),
        },
        (VerdictKind::Busy, Some(e)) => with_rest(format!("{} is computing in {}{more}", who(e, ctx), e.position.where_)),
        (VerdictKind::Diverged, Some(e)) => {
            let hop = match (&e.stuck_reader, e.process.lock_waits.first()) {
                (Some(reader), _) => {
                    let fs = reader
                        .position
                        .file
                        .as_ref()
                        .and_then(|f| Some((f.mount.as_deref()?, f)))
                        .map(|(m, f)| format!(": {}", fs_words(m, f.filesystem_key().unwrap_or(m), ctx.node_name(e), filesystems)))
                        .unwrap_or_default();
                    format!("; {}{fs}", reader.words())
                }
                (None, Some(wait)) => lock_words(wait),
                (None, None) => in_rank(e, ctx).1.map(|d| format!("; {}", d.words)).unwrap_or_default(),
            };
            let peer = match (&e.stuck_reader, e.process.lock_waits.first(), &e.peer_wait) {
                (None, None, Some(w)) => format!("; it {}", w.words),
                _ => String::new(),
            };
            with_rest(format!(
                "{} is the odd one out: {} in {}{hop}{peer}{more}",
                who(e, ctx),
                state_words(e.position.state),
                e.position.where_
            ))
        }
        (VerdictKind::CollectiveHang, _) => format!(
            "all {} ranks{} wait in {}: no rank stands out (a collective that never completes, or a peer on another node)",
            n_ranks,
            groups.first().map(|g| on_nodes(g, ctx)).unwrap_or_default(),
            groups.first().map(|g| g.where_.as_str()).unwrap_or("the same place")
        ),
        (VerdictKind::NodeUnreachable, _) => {
            let (noun, verb, its) =
                if nodes_not_seen.len() == 1 { ("node", "was", "its") } else { ("nodes", "were", "their") };
            with_rest(format!(
                "{noun} {} {verb} not seen: {its} observations did not arrive, and no rank that was seen stands out",
                nodes_not_seen.join(", ")
            ))
        }
        _ => {
            let list = groups
                .iter()
                .take(3)
                .map(|g| format!("{} in {} ({})", g.size(), g.where_, g.state))
                .collect::<Vec<_>>()
                .join("; ");
            format!("no rank stands out: {list}")
        }
    }
}

fn recommend(
    kind: VerdictKind,
    entries: &[Entry],
    n_ranks: usize,
    culprits: &[usize],
    filesystems: &[FilesystemStatus],
    nodes_not_seen: &[String],
    ctx: &Ctx,
) -> Vec<String> {
    let mut out = Vec::new();
    for fs in filesystems.iter().filter(|f| f.responsive == Some(false)) {
        let node = fs.node.as_deref().unwrap_or("this node");
        out.push(format!(
            "the filesystem at {} on {node} does not respond: check the storage; ranks blocked on it cannot \
             finish until it answers",
            fs.words()
        ));
    }
    for &i in culprits {
        let e = &entries[i];
        if kind == VerdictKind::BlockedInKernel && killable(e) == Some(false) {
            out.push(format!(
                "{} cannot be killed while in D state: end its peers, restart the job on other nodes, and drain or \
                 reboot {} if it stays in D",
                e.label(),
                node_of(e, ctx).unwrap_or_else(|| "this node".to_string())
            ));
        }
        if kind == VerdictKind::Stopped {
            out.push(format!(
                "{} is stopped: `kill -CONT {}` resumes it, if nobody stopped it on purpose",
                e.label(),
                e.process.pid
            ));
        }
    }
    for node in nodes_not_seen {
        out.push(format!(
            "check node {node}: its hangwatch agent did not report, and its ranks may be the ones holding the job up"
        ));
    }
    for e in &entries[..n_ranks] {
        if let Some(tracer) = e.process.tracer_pid.filter(|p| *p != 0) {
            out.push(format!(
                "{} is traced by pid {tracer} (py-spy, strace or gdb): other tools will fail with EPERM until it \
                 detaches",
                e.label()
            ));
        }
        if e.process.sigstop_pending {
            out.push(format!(
                "{} has a SIGSTOP pending (a killed debugger left it): it will stop when its call returns; send \
                 SIGCONT after the filesystem recovers",
                e.label()
            ));
        }
    }
    out
}

fn worker_report(entry: &Entry) -> WorkerReport {
    let thread = thread_of(entry);
    let file = entry.position.file.as_ref();
    WorkerReport {
        pid: entry.process.pid,
        parent_pid: entry.process.worker_of.as_ref().map_or(0, |w| w.parent_pid),
        comm: entry.process.comm.clone(),
        state: entry.position.state.to_string(),
        where_: entry.position.where_.clone(),
        wchan: thread.and_then(|t| t.wchan.clone()),
        syscall: entry.position.syscall_name.clone(),
        path: file.map(|f| f.path.clone()),
        mount: file.and_then(|f| f.mount.clone()),
        fstype: file.and_then(|f| f.fstype.clone()),
    }
}

/// `workers`: the workers of this rank.
fn rank_report(entry: &Entry, workers: &[&Entry], ctx: &Ctx) -> RankReport {
    RankReport {
        at: place(entry, ctx),
        cpu_ms_during_sample: Some(
            entry
                .process
                .threads
                .iter()
                .filter_map(|t| t.cpu_ms_during_sample)
                .sum(),
        ),
        threads: entry.process.threads.clone(),
        threads_folded: entry.process.threads_folded,
        workers: workers.iter().map(|w| worker_report(w)).collect(),
    }
}
