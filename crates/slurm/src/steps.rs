//! The Slurm job steps running on this machine, found from outside the job, from facts only root controls: a
//! step daemon is a process of uid 0 whose executable is Slurm's `slurmstepd`; its job and step come from the title
//! the daemon gives itself (`slurmstepd: [4242.0]`); its node is the one whose `slurmd` shares its UTS namespace
//! (`slurmd -N n1`, several emulated nodes on one machine), else this machine's node (the service's own name). The
//! tasks are the daemon's children, and their owner the kernel's euid of them. A task's environment is still read,
//! but only for what concerns its own job (how many tasks to wait for, whether its step may span nodes, the action
//! it asks for): a task that rewrites `SLURM_JOB_ID` with `exec env` names nobody else's job.
//!
//! The decision ([`steps_on_node`]) is pure over a process table and those facts; [`StepFinder`] reads them:
//! process states from /proc (never blocking), titles and environments in throwaway children under a deadline
//! (`cmdline` and `environ` take the process's memory-map lock, which a stuck process may hold).

use std::collections::{BTreeMap, HashMap};

use hangwatch_inspect::pystack::{read_environments, StackReadOptions};
use hangwatch_inspect::ranks::RankFinder;
use hangwatch_model::RankSource;
use hangwatch_proc::{ProcFs, SlurmTask};
use serde::Serialize;

use crate::ids::{parse_step_daemon_title, JobId, NodeName, StepId};

/// The process name of Slurm's step daemon.
const STEP_DAEMON: &str = "slurmstepd";
/// The process name of Slurm's node daemon.
const NODE_DAEMON: &str = "slurmd";

/// What the table says of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRow {
    pub pid: i32,
    pub ppid: i32,
    pub comm: String,
    /// Its effective user: the job's owner for a task.
    pub uid: Option<u32>,
}

/// What root-controlled facts say of one step daemon: its job, its step and its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonFacts {
    pub job: JobId,
    pub step: StepId,
    pub node: NodeName,
}

/// One job step on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepOnNode {
    /// From the step daemon's title (see the module documentation), in [`JobId`]'s grammar.
    pub job_id: String,
    /// Slurm's spelling: `batch` for the batch script, else the step's number ([`StepId`]'s grammar).
    pub step: String,
    /// The node the step daemon serves ([`NodeName`]'s grammar).
    pub node: Option<String>,
    /// The job owner's uid (its tasks' effective uid).
    pub uid: Option<u32>,
    /// The `slurmstepd` that started the tasks.
    pub slurmstepd: i32,
    /// The processes `slurmstepd` started for the step (srun's tasks, or the batch script's shell).
    pub tasks: Vec<i32>,
    /// How many tasks the step runs on this node, as its tasks' `SLURM_GTIDS` say: `slurmstepd` starts them one
    /// by one, so a scan may find fewer for a moment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tasks_expected: Option<usize>,
    /// Whether the tasks say their step spans several nodes (`SLURM_STEP_NODELIST`): only a hint of whether to
    /// ask Slurm for the step's nodes (a task can say anything, but only of its own job).
    #[serde(skip)]
    pub may_span_nodes: bool,
    /// The step's nodes in Slurm's order, as Slurm itself lists them (filled by the node service after it asked;
    /// never from a task's environment).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// This node's index among them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_index: Option<u32>,
    /// The ranks below (or among) the tasks, in rank order; filled by [`find_steps`].
    pub ranks: Vec<StepRank>,
    /// Tasks whose environment names another job, step or node than their daemon's facts: not believed, but
    /// said (a job rewriting its Slurm variables is worth an admin's look).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disbelieved: Vec<String>,
}

impl StepOnNode {
    /// `1234.0`, `1234.batch`: how Slurm names a step.
    pub fn name(&self) -> String {
        format!("{}.{}", self.job_id, self.step)
    }

    /// Whether every task the step runs on this node has been started (true where Slurm did not say how many).
    pub fn all_tasks_started(&self) -> bool {
        self.tasks_expected.is_none_or(|n| self.tasks.len() >= n)
    }

    /// For a step on several nodes (as Slurm listed them, see [`StepOnNode::nodes`]): the first of them, which
    /// hosts its coordinator, and this node's index.
    pub fn spans_nodes(&self) -> Option<(&str, u32)> {
        if self.nodes.len() < 2 {
            return None;
        }
        Some((self.nodes[0].as_str(), self.node_index?))
    }

    /// Takes Slurm's list of the step's nodes, and this node's place in it.
    pub fn with_nodes(mut self, nodes: Vec<String>) -> Self {
        self.node_index = self
            .node
            .as_deref()
            .and_then(|me| nodes.iter().position(|n| n == me))
            .and_then(|i| u32::try_from(i).ok());
        self.nodes = nodes;
        self
    }
}

/// A rank of a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepRank {
    pub pid: i32,
    pub rank: u32,
    pub local_rank: Option<u32>,
    /// Where its number came from (`env:RANK`, `env:SLURM_PROCID`, ...).
    pub source: RankSource,
}

/// The steps on this machine from its process table, the step daemons' facts (root's, see the module
/// documentation) and what each task's environment says of its own job: `node` keeps only one node's (several
/// emulated nodes on one machine), `None` keeps all. A child of a step daemon is a task of the daemon's step,
/// whatever its environment says; the extern step's placeholder is left out. Sorted by job id, then step.
pub fn steps_on_node(
    rows: &[ProcessRow],
    daemons: &HashMap<i32, DaemonFacts>,
    tasks: &HashMap<i32, SlurmTask>,
    node: Option<&NodeName>,
) -> Vec<StepOnNode> {
    let mut steps: BTreeMap<(u64, String, String, i32), StepOnNode> = BTreeMap::new();
    for row in rows.iter().filter(|r| !daemons.contains_key(&r.pid)) {
        let Some(daemon) = daemons.get(&row.ppid) else {
            continue;
        };
        if daemon.step.is_extern() || node.is_some_and(|n| *n != daemon.node) {
            continue;
        }
        let said = tasks.get(&row.pid);
        let key = (
            daemon.job.number(),
            daemon.job.to_string(),
            daemon.step.to_string(),
            row.ppid,
        );
        let entry = steps.entry(key).or_insert_with(|| StepOnNode {
            job_id: daemon.job.to_string(),
            step: daemon.step.to_string(),
            node: Some(daemon.node.to_string()),
            uid: row.uid,
            slurmstepd: row.ppid,
            tasks: Vec::new(),
            tasks_expected: None,
            may_span_nodes: false,
            nodes: Vec::new(),
            node_index: None,
            ranks: Vec::new(),
            disbelieved: Vec::new(),
        });
        if let Some(claim) = said.and_then(|t| disbelieved_claim(row.pid, t, daemon)) {
            entry.disbelieved.push(claim);
        }
        entry.tasks.push(row.pid);
        entry.tasks_expected = entry.tasks_expected.max(said.and_then(|t| t.tasks_on_node));
        entry.may_span_nodes |= said
            .and_then(|t| t.step_nodes.as_deref())
            .is_some_and(names_several_hosts);
    }
    steps
        .into_values()
        .map(|mut s| {
            s.tasks.sort_unstable();
            s
        })
        .collect()
}

/// What task `pid` says of itself that its daemon's facts contradict (`SLURM_JOB_ID`, `SLURM_STEP_ID`,
/// `SLURMD_NODENAME`), in words; `None` when it agrees or says nothing.
fn disbelieved_claim(pid: i32, said: &SlurmTask, daemon: &DaemonFacts) -> Option<String> {
    let step = said.step_id.as_deref().unwrap_or("batch");
    let mut claims = Vec::new();
    if let Some(job) = said.job_id.as_deref().filter(|j| *j != daemon.job.as_str()) {
        claims.push(format!("SLURM_JOB_ID={}", shorten(job)));
    }
    if said.job_id.is_some() && step != daemon.step.as_str() {
        claims.push(format!("SLURM_STEP_ID={}", shorten(step)));
    }
    if let Some(node) = said
        .node_name
        .as_deref()
        .filter(|n| *n != daemon.node.as_str())
    {
        claims.push(format!("SLURMD_NODENAME={}", shorten(node)));
    }
    (!claims.is_empty()).then(|| {
        format!(
            "task {pid} says {} but its slurmstepd serves {}.{} on {}",
            claims.join(" "),
            daemon.job,
            daemon.step,
            daemon.node
        )
    })
}

fn shorten(text: &str) -> String {
    let mut short: String = text.chars().filter(|c| !c.is_control()).take(40).collect();
    if text.chars().count() > 40 {
        short.push('…');
    }
    short
}

/// Whether a host list may name more than one host, without expanding it (`n1`, `gpu-1`: no; `n[1-2]`, `a,b`:
/// yes).
fn names_several_hosts(list: &str) -> bool {
    list.contains([',', '['])
}

/// Finds the steps on this machine (see [`steps_on_node`]) and the ranks of each, reading titles and
/// environments in children of hangwatch under a few seconds' deadline.
pub fn find_steps(
    procfs: &ProcFs,
    node: Option<&str>,
    options: &StackReadOptions,
) -> Vec<StepOnNode> {
    let mut steps = StepFinder::default().scan(procfs, node, options);
    for step in &mut steps {
        // Each step's ranks are numbered on their own (a step is one job of the launcher's).
        let found = RankFinder::new().refresh(procfs, &step.tasks, &HashMap::new());
        step.ranks = found
            .ranks
            .into_iter()
            .map(|r| StepRank {
                pid: r.id.pid,
                rank: r.rank,
                local_rank: r.local_rank,
                source: r.source,
            })
            .collect();
    }
    steps
}

/// What a task's environment said, kept for as long as the task lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFacts {
    pub slurm: SlurmTask,
    /// `HANGWATCH_ACTION` in the job's environment.
    pub action: Option<String>,
}

/// What a root daemon of Slurm's is, once read: a step daemon (with its title's job and step), a node daemon
/// (with the name it serves, `-N`), or neither (an unreadable title, a process that only shares the name).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Daemon {
    Step {
        job: JobId,
        step: StepId,
        uts: Option<String>,
    },
    Node {
        name: Option<NodeName>,
        uts: Option<String>,
    },
    Neither,
}

/// Finds steps again and again (a node service's scan), reading each daemon's title and each task's environment
/// once: a process is known by its pid and start time.
#[derive(Debug, Default)]
pub struct StepFinder {
    known: HashMap<(i32, u64), TaskFacts>,
    daemons: HashMap<(i32, u64), Daemon>,
}

impl StepFinder {
    /// The steps now, without their ranks (a watcher finds those). `node`: this machine's node name where no
    /// `slurmd -N` says (else its host name), and the only node whose steps are kept where one does.
    pub fn scan(
        &mut self,
        procfs: &ProcFs,
        node: Option<&str>,
        options: &StackReadOptions,
    ) -> Vec<StepOnNode> {
        let stats = procfs.all_stats();
        self.learn_daemons(procfs, &stats, options);
        let step_daemons = self.step_daemons(&stats, node);
        let is_task = |s: &hangwatch_proc::TaskStat| {
            step_daemons.contains_key(&s.ppid) && !step_daemons.contains_key(&s.pid)
        };
        let rows: Vec<ProcessRow> = stats
            .iter()
            .map(|s| ProcessRow {
                pid: s.pid,
                ppid: s.ppid,
                comm: s.comm.clone(),
                uid: is_task(s)
                    .then(|| procfs.status(s.pid).ok().and_then(|st| st.euid))
                    .flatten(),
            })
            .collect();
        let tasks: Vec<(i32, u64)> = stats
            .iter()
            .filter(|s| is_task(s))
            .map(|s| (s.pid, s.starttime))
            .collect();
        self.known.retain(|id, _| tasks.contains(id));
        let unknown: Vec<i32> = tasks
            .iter()
            .filter(|id| !self.known.contains_key(id))
            .map(|(pid, _)| *pid)
            .collect();
        if !unknown.is_empty() {
            let read = read_environments(&unknown, options).reports;
            for &(pid, start) in tasks.iter().filter(|(pid, _)| unknown.contains(pid)) {
                // Unread (the reader gave up on it): asked again at the next scan; the task still counts.
                if let Some(env) = read.get(&pid).and_then(|r| r.rank_env.clone()) {
                    self.known.insert(
                        (pid, start),
                        TaskFacts {
                            slurm: env.slurm,
                            action: env.hangwatch_action,
                        },
                    );
                }
            }
        }
        let said: HashMap<i32, SlurmTask> = self
            .known
            .iter()
            .map(|((pid, _), facts)| (*pid, facts.slurm.clone()))
            .collect();
        let only = node
            .and_then(|n| NodeName::parse(n).ok())
            .filter(|_| self.emulated_nodes());
        steps_on_node(&rows, &step_daemons, &said, only.as_ref())
    }

    /// Reads what each new root process named like one of Slurm's daemons is: its title (in a child, under the
    /// deadline) and its UTS namespace. A process that is not uid 0 running Slurm's executable is neither.
    fn learn_daemons(
        &mut self,
        procfs: &ProcFs,
        stats: &[hangwatch_proc::TaskStat],
        options: &StackReadOptions,
    ) {
        let candidates: Vec<(i32, u64, bool)> = stats
            .iter()
            .filter(|s| s.comm == STEP_DAEMON || s.comm == NODE_DAEMON)
            .map(|s| (s.pid, s.starttime, s.comm == STEP_DAEMON))
            .collect();
        self.daemons
            .retain(|id, _| candidates.iter().any(|(p, t, _)| (*p, *t) == *id));
        let mut new: Vec<(i32, u64, bool)> = Vec::new();
        for (pid, start, step) in candidates {
            if self.daemons.contains_key(&(pid, start)) {
                continue;
            }
            if slurms_own(procfs, pid, if step { STEP_DAEMON } else { NODE_DAEMON }) {
                new.push((pid, start, step));
            } else {
                self.daemons.insert((pid, start), Daemon::Neither);
            }
        }
        if new.is_empty() {
            return;
        }
        let pids: Vec<i32> = new.iter().map(|(p, _, _)| *p).collect();
        let read = read_environments(&pids, options).reports;
        for (pid, start, step) in new {
            // Unread (the reader gave up): asked again at the next scan.
            let Some(cmdline) = read.get(&pid).and_then(|r| r.cmdline.clone()) else {
                continue;
            };
            let uts = procfs.uts_namespace(pid).ok();
            let daemon = if step {
                match parse_step_daemon_title(&cmdline) {
                    Some((job, step)) => Daemon::Step { job, step, uts },
                    None => Daemon::Neither,
                }
            } else {
                Daemon::Node {
                    name: node_daemon_name(&cmdline),
                    uts,
                }
            };
            self.daemons.insert((pid, start), daemon);
        }
    }

    /// Whether this machine runs several emulated nodes (a `slurmd -N NAME`).
    fn emulated_nodes(&self) -> bool {
        self.daemons
            .values()
            .any(|d| matches!(d, Daemon::Node { name: Some(_), .. }))
    }

    /// The step daemons now, each with its node: the `slurmd -N` in its UTS namespace where this machine emulates
    /// several nodes, else this machine's (`node`, else the host name).
    fn step_daemons(
        &self,
        stats: &[hangwatch_proc::TaskStat],
        node: Option<&str>,
    ) -> HashMap<i32, DaemonFacts> {
        let by_uts: HashMap<&str, &NodeName> = self
            .daemons
            .values()
            .filter_map(|d| match d {
                Daemon::Node {
                    name: Some(name),
                    uts: Some(uts),
                } => Some((uts.as_str(), name)),
                _ => None,
            })
            .collect();
        let this_machine = node
            .map(str::to_string)
            .or_else(hangwatch_inspect::rollcall::hostname)
            .and_then(|n| NodeName::parse(&n).ok());
        stats
            .iter()
            .filter_map(|s| {
                let Some(Daemon::Step { job, step, uts }) = self.daemons.get(&(s.pid, s.starttime))
                else {
                    return None;
                };
                let node = if by_uts.is_empty() {
                    this_machine.clone()?
                } else {
                    (*by_uts.get(uts.as_deref()?)?).clone()
                };
                Some((
                    s.pid,
                    DaemonFacts {
                        job: job.clone(),
                        step: step.clone(),
                        node,
                    },
                ))
            })
            .collect()
    }

    /// What the job asked of a node service (`HANGWATCH_ACTION`), from the first of `tasks` that says.
    pub fn requested_action(&self, tasks: &[i32]) -> Option<String> {
        self.known
            .iter()
            .filter(|((pid, _), _)| tasks.contains(pid))
            .find_map(|(_, facts)| facts.action.clone())
    }
}

/// Whether `pid` is a root process running Slurm's `daemon` (`/usr/sbin/slurmstepd`, Debian's
/// `slurmstepd-wlm`): a job's process may call itself `slurmstepd`, but cannot be uid 0 running Slurm's file.
fn slurms_own(procfs: &ProcFs, pid: i32, daemon: &str) -> bool {
    let root = procfs
        .status(pid)
        .ok()
        .and_then(|s| s.euid)
        .is_some_and(|uid| uid == 0);
    let exe = procfs.exe(pid).unwrap_or_default();
    let file = exe.rsplit('/').next().unwrap_or_default();
    let slurms = file == daemon || file.starts_with(&format!("{daemon}-"));
    root && slurms && !exe.ends_with(" (deleted)")
}

/// The node a `slurmd` serves when told (`slurmd -N n1`, `-Nn1`, `--nodename=n1`); `None` when it serves the
/// machine's own name.
fn node_daemon_name(cmdline: &[String]) -> Option<NodeName> {
    let mut args = cmdline.iter().skip(1);
    while let Some(arg) = args.next() {
        let name = match arg.as_str() {
            "-N" | "--nodename" => args.next().map(String::as_str),
            a => a
                .strip_prefix("--nodename=")
                .or_else(|| a.strip_prefix("-N").filter(|n| !n.is_empty())),
        };
        if let Some(name) = name {
            return NodeName::parse(name).ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: i32, ppid: i32, comm: &str) -> ProcessRow {
        ProcessRow {
            pid,
            ppid,
            comm: comm.into(),
            uid: Some(1000),
        }
    }

    fn daemon(job: &str, step: &str, node: &str) -> DaemonFacts {
        DaemonFacts {
            job: JobId::parse(job).expect("job"),
            step: StepId::parse(step).expect("step"),
            node: NodeName::parse(node).expect("node"),
        }
    }

    fn task(job: &str, step: Option<&str>, node: &str) -> SlurmTask {
        SlurmTask {
            job_id: Some(job.into()),
            step_id: step.map(str::to_string),
            node_name: Some(node.into()),
            tasks_on_node: None,
            step_nodes: None,
            node_id: None,
        }
    }

    fn n(name: &str) -> NodeName {
        NodeName::parse(name).expect("node")
    }

    /// What the test cluster showed: a batch step on n1, step 0 with a task on n1 and one on n2 (two slurmstepd
    /// on one machine), an extern step's placeholder, and an unrelated process that claims a job.
    fn table() -> (
        Vec<ProcessRow>,
        HashMap<i32, DaemonFacts>,
        HashMap<i32, SlurmTask>,
    ) {
        let rows = vec![
            row(100, 1, "slurmstepd"),
            row(101, 100, "bash"),
            row(200, 1, "slurmstepd"),
            row(201, 200, "python3"),
            row(300, 1, "slurmstepd"),
            row(301, 300, "python3"),
            row(400, 1, "slurmstepd"),
            row(401, 400, "sleep"),
            row(500, 1, "sshd"),
            row(501, 500, "bash"),
            row(202, 201, "python3"),
        ];
        let daemons = HashMap::from([
            (100, daemon("7", "batch", "n1")),
            (200, daemon("7", "0", "n1")),
            (300, daemon("7", "0", "n2")),
            (400, daemon("7", "extern", "n1")),
        ]);
        let said = HashMap::from([
            (101, task("7", None, "n1")),
            (201, task("7", Some("0"), "n1")),
            (301, task("7", Some("0"), "n2")),
            (401, SlurmTask::default()),
            (501, task("9", Some("0"), "n1")),
            (202, task("7", Some("0"), "n1")),
        ]);
        (rows, daemons, said)
    }

    #[test]
    fn each_step_on_each_node_with_the_tasks_its_slurmstepd_started() {
        let (rows, daemons, said) = table();
        let steps = steps_on_node(&rows, &daemons, &said, None);
        let got: Vec<(String, Option<String>, i32, Vec<i32>)> = steps
            .iter()
            .map(|s| (s.name(), s.node.clone(), s.slurmstepd, s.tasks.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("7.0".into(), Some("n1".into()), 200, vec![201]),
                ("7.0".into(), Some("n2".into()), 300, vec![301]),
                ("7.batch".into(), Some("n1".into()), 100, vec![101]),
            ]
        );
        assert!(steps.iter().all(|s| s.uid == Some(1000)));
    }

    #[test]
    fn one_emulated_node_sees_only_its_own_steps() {
        let (rows, daemons, said) = table();
        let steps = steps_on_node(&rows, &daemons, &said, Some(&n("n2")));
        assert_eq!(steps.len(), 1);
        assert_eq!(
            (steps[0].name(), steps[0].tasks.clone()),
            ("7.0".into(), vec![301])
        );
        assert!(steps_on_node(&rows, &daemons, &said, Some(&n("n9"))).is_empty());
    }

    #[test]
    fn a_task_that_claims_another_job_node_or_step_is_still_its_daemons() {
        // The finding: a task of job 8 rewrites its environment to name job 7, node n2 and a path.
        let rows = vec![row(1, 0, "slurmstepd"), row(2, 1, "python3")];
        let daemons = HashMap::from([(1, daemon("8", "0", "n1"))]);
        let forged = SlurmTask {
            job_id: Some("7".into()),
            step_id: Some("../../etc".into()),
            node_name: Some("n2".into()),
            ..SlurmTask::default()
        };
        let steps = steps_on_node(&rows, &daemons, &HashMap::from([(2, forged)]), None);
        assert_eq!(steps.len(), 1);
        assert_eq!(
            (steps[0].name(), steps[0].node.as_deref()),
            ("8.0".into(), Some("n1"))
        );
        assert_eq!(
            steps[0].disbelieved,
            ["task 2 says SLURM_JOB_ID=7 SLURM_STEP_ID=../../etc SLURMD_NODENAME=n2 but its slurmstepd serves 8.0 on n1"]
        );
        // A process that only calls itself slurmstepd is no daemon: its children are nobody's tasks.
        let rows = vec![row(1, 0, "slurmstepd"), row(2, 1, "python3")];
        assert!(steps_on_node(&rows, &HashMap::new(), &HashMap::new(), None).is_empty());
    }

    #[test]
    fn job_ids_sort_as_numbers() {
        let rows = vec![
            row(1, 0, "slurmstepd"),
            row(2, 1, "bash"),
            row(3, 0, "slurmstepd"),
            row(4, 3, "bash"),
        ];
        let daemons = HashMap::from([
            (1, daemon("10", "batch", "n1")),
            (3, daemon("9", "batch", "n1")),
        ]);
        let names: Vec<String> = steps_on_node(&rows, &daemons, &HashMap::new(), None)
            .iter()
            .map(StepOnNode::name)
            .collect();
        assert_eq!(names, ["9.batch", "10.batch"]);
    }

    #[test]
    fn a_step_whose_tasks_are_still_starting_says_so() {
        let rows = [row(1, 0, "slurmstepd"), row(2, 1, "python3")];
        let daemons = HashMap::from([(1, daemon("5", "0", "n1"))]);
        let of = |n| SlurmTask {
            tasks_on_node: n,
            ..task("5", Some("0"), "n1")
        };
        // Rank 1 has started, rank 0 not yet (slurmstepd 1 starts two tasks here).
        let starting = steps_on_node(
            &rows[..2],
            &daemons,
            &HashMap::from([(2, of(Some(2)))]),
            None,
        );
        assert_eq!(starting[0].tasks_expected, Some(2));
        assert!(!starting[0].all_tasks_started());
        let rows = [rows[0].clone(), rows[1].clone(), row(6, 1, "python3")];
        let started = steps_on_node(
            &rows,
            &daemons,
            &HashMap::from([(2, of(Some(2))), (6, of(Some(2)))]),
            None,
        );
        assert_eq!(started[0].tasks, vec![2, 6]);
        assert!(started[0].all_tasks_started());
        // Without SLURM_GTIDS nothing is known to be missing.
        let unknown = steps_on_node(&rows, &daemons, &HashMap::from([(2, of(None))]), None);
        assert!(unknown[0].all_tasks_started());
    }

    #[test]
    fn a_step_on_several_nodes_takes_its_nodes_from_slurm_not_from_its_tasks() {
        let rows = [row(1, 0, "slurmstepd"), row(2, 1, "python3")];
        let daemons = HashMap::from([(1, daemon("5", "0", "n2"))]);
        let on = |list: &str| SlurmTask {
            step_nodes: Some(list.into()),
            node_id: Some(1),
            ..task("5", Some("0"), "n2")
        };
        let step =
            steps_on_node(&rows, &daemons, &HashMap::from([(2, on("n[1-2]"))]), None).remove(0);
        assert!(step.may_span_nodes);
        assert_eq!(step.spans_nodes(), None, "not before Slurm said");
        let step = step.with_nodes(vec!["n1".into(), "n2".into()]);
        assert_eq!(step.spans_nodes(), Some(("n1", 1)));
        let alone = steps_on_node(&rows, &daemons, &HashMap::from([(2, on("n2"))]), None);
        assert!(!alone[0].may_span_nodes, "one node: nothing to agree on");
    }

    #[test]
    fn a_node_daemon_says_which_node_it_serves() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            node_daemon_name(&args(&["slurmd", "-f", "/etc/slurm.conf", "-N", "n1"])),
            Some(n("n1"))
        );
        assert_eq!(node_daemon_name(&args(&["slurmd", "-Nn2"])), Some(n("n2")));
        assert_eq!(
            node_daemon_name(&args(&["slurmd", "--nodename=n3"])),
            Some(n("n3"))
        );
        assert_eq!(node_daemon_name(&args(&["slurmd", "-D"])), None);
        assert_eq!(node_daemon_name(&args(&["slurmd", "-N", "../x"])), None);
    }
}
