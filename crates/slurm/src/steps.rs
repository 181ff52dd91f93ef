//! The Slurm job steps running on this machine, found from outside the job: each `slurmstepd` and the tasks it
//! started, told apart by their environment (`SLURM_JOB_ID`, `SLURM_STEP_ID`, `SLURMD_NODENAME`), and the ranks
//! below those tasks by the rule `run` uses. What `hangwatch steps` prints and what a node service watches.
//!
//! The decision ([`steps_on_node`]) is pure over a process table and the tasks' Slurm identities; [`find_steps`]
//! reads them: process states from /proc (never blocking), environments in throwaway children under a deadline
//! (`environ` takes the process's memory-map lock, which a stuck task may hold).

use std::collections::{BTreeMap, HashMap};

use hangwatch_inspect::pystack::{read_environments, StackReadOptions};
use hangwatch_inspect::ranks::RankFinder;
use hangwatch_model::RankSource;
use hangwatch_proc::{ProcFs, SlurmTask};
use serde::Serialize;

/// The process name of Slurm's step daemon.
const STEP_DAEMON: &str = "slurmstepd";

/// What the table says of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRow {
    pub pid: i32,
    pub ppid: i32,
    pub comm: String,
    /// Its effective user: the job's owner for a task.
    pub uid: Option<u32>,
}

/// One job step on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepOnNode {
    pub job_id: String,
    /// Slurm's spelling: `batch` for the batch script, else the step's number.
    pub step: String,
    /// `SLURMD_NODENAME` of its tasks.
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
    /// The step's nodes in Slurm's order (`SLURM_STEP_NODELIST` expanded); empty where the tasks did not say (a
    /// batch script).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// This node's index among them (`SLURM_NODEID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_index: Option<u32>,
    /// The ranks below (or among) the tasks, in rank order; filled by [`find_steps`].
    pub ranks: Vec<StepRank>,
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

    /// For a step on several nodes: the first of them, which hosts its coordinator, and this node's index.
    pub fn spans_nodes(&self) -> Option<(&str, u32)> {
        if self.nodes.len() < 2 {
            return None;
        }
        Some((self.nodes[0].as_str(), self.node_index?))
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

/// The steps on this machine from its process table and the Slurm identities of `slurmstepd`'s children:
/// `node` keeps only one emulated node's (several slurmd on one machine), `None` keeps all. A child of
/// `slurmstepd` without `SLURM_JOB_ID` is not a task (the extern step's placeholder, a helper). Sorted by job
/// id, then step.
pub fn steps_on_node(
    rows: &[ProcessRow],
    identities: &HashMap<i32, SlurmTask>,
    node: Option<&str>,
) -> Vec<StepOnNode> {
    let daemons: Vec<i32> = rows
        .iter()
        .filter(|r| r.comm == STEP_DAEMON)
        .map(|r| r.pid)
        .collect();
    let mut steps: BTreeMap<(u64, String, String, i32), StepOnNode> = BTreeMap::new();
    for row in rows
        .iter()
        .filter(|r| daemons.contains(&r.ppid) && r.comm != STEP_DAEMON)
    {
        let Some(task) = identities.get(&row.pid) else {
            continue;
        };
        let Some(job_id) = task.job_id.clone() else {
            continue;
        };
        if node.is_some_and(|n| task.node_name.as_deref() != Some(n)) {
            continue;
        }
        let step = task.step_id.clone().unwrap_or_else(|| "batch".into());
        // Numeric job ids sort as numbers; an array's `123_4` after them, as text.
        let order = job_id.parse::<u64>().unwrap_or(u64::MAX);
        let key = (order, job_id.clone(), step.clone(), row.ppid);
        let entry = steps.entry(key).or_insert_with(|| StepOnNode {
            job_id,
            step,
            node: task.node_name.clone(),
            uid: row.uid,
            slurmstepd: row.ppid,
            tasks: Vec::new(),
            tasks_expected: None,
            nodes: task
                .step_nodes
                .as_deref()
                .map(crate::step::expand_hosts)
                .unwrap_or_default(),
            node_index: task.node_id,
            ranks: Vec::new(),
        });
        entry.tasks.push(row.pid);
        entry.tasks_expected = entry.tasks_expected.max(task.tasks_on_node);
    }
    steps
        .into_values()
        .map(|mut s| {
            s.tasks.sort_unstable();
            s
        })
        .collect()
}

/// Finds the steps on this machine (see [`steps_on_node`]) and the ranks of each, reading environments in
/// children of hangwatch under a few seconds' deadline. A step whose environments could not be read in time is
/// missing from the answer (its tasks are stuck in a way that holds their memory-map lock).
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

/// Finds steps again and again (a node service's scan), reading each task's environment once: a task is known
/// by its pid and start time.
#[derive(Debug, Default)]
pub struct StepFinder {
    known: HashMap<(i32, u64), TaskFacts>,
}

impl StepFinder {
    /// The steps now, without their ranks (a watcher finds those).
    pub fn scan(
        &mut self,
        procfs: &ProcFs,
        node: Option<&str>,
        options: &StackReadOptions,
    ) -> Vec<StepOnNode> {
        let stats = procfs.all_stats();
        let daemons: Vec<i32> = stats
            .iter()
            .filter(|s| s.comm == STEP_DAEMON)
            .map(|s| s.pid)
            .collect();
        let is_task =
            |s: &hangwatch_proc::TaskStat| daemons.contains(&s.ppid) && s.comm != STEP_DAEMON;
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
                // Unread (the reader gave up on it): asked again at the next scan.
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
        let identities: HashMap<i32, SlurmTask> = self
            .known
            .iter()
            .map(|((pid, _), facts)| (*pid, facts.slurm.clone()))
            .collect();
        steps_on_node(&rows, &identities, node)
    }

    /// What the job asked of a node service (`HANGWATCH_ACTION`), from the first of `tasks` that says.
    pub fn requested_action(&self, tasks: &[i32]) -> Option<String> {
        self.known
            .iter()
            .filter(|((pid, _), _)| tasks.contains(pid))
            .find_map(|(_, facts)| facts.action.clone())
    }
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

    /// What the test cluster showed: a batch step on n1, step 0 with a task on n1 and one on n2 (two slurmstepd
    /// on one machine), an extern step's placeholder without Slurm variables, and an unrelated process.
    fn table() -> (Vec<ProcessRow>, HashMap<i32, SlurmTask>) {
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
        let identities = HashMap::from([
            (101, task("7", None, "n1")),
            (201, task("7", Some("0"), "n1")),
            (301, task("7", Some("0"), "n2")),
            (401, SlurmTask::default()),
            (501, task("9", Some("0"), "n1")),
            (202, task("7", Some("0"), "n1")),
        ]);
        (rows, identities)
    }

    #[test]
    fn each_step_on_each_node_with_the_tasks_its_slurmstepd_started() {
        let (rows, identities) = table();
        let steps = steps_on_node(&rows, &identities, None);
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
        let (rows, identities) = table();
        let steps = steps_on_node(&rows, &identities, Some("n2"));
        assert_eq!(steps.len(), 1);
        assert_eq!(
            (steps[0].name(), steps[0].tasks.clone()),
            ("7.0".into(), vec![301])
        );
        assert!(steps_on_node(&rows, &identities, Some("n9")).is_empty());
    }

    #[test]
    fn job_ids_sort_as_numbers() {
        let rows = vec![
            row(1, 0, "slurmstepd"),
            row(2, 1, "bash"),
            row(3, 0, "slurmstepd"),
            row(4, 3, "bash"),
        ];
        let identities = HashMap::from([(2, task("10", None, "n1")), (4, task("9", None, "n1"))]);
        let names: Vec<String> = steps_on_node(&rows, &identities, None)
            .iter()
            .map(StepOnNode::name)
            .collect();
        assert_eq!(names, ["9.batch", "10.batch"]);
    }

    #[test]
    fn a_step_whose_tasks_are_still_starting_says_so() {
        let rows = [row(1, 0, "slurmstepd"), row(2, 1, "python3")];
        let of = |n| SlurmTask {
            tasks_on_node: n,
            ..task("5", Some("0"), "n1")
        };
        // Rank 1 has started, rank 0 not yet (slurmstepd 1 starts two tasks here).
        let starting = steps_on_node(&rows[..2], &HashMap::from([(2, of(Some(2)))]), None);
        assert_eq!(starting[0].tasks_expected, Some(2));
        assert!(!starting[0].all_tasks_started());
        let rows = [rows[0].clone(), rows[1].clone(), row(6, 1, "python3")];
        let started = steps_on_node(
            &rows,
            &HashMap::from([(2, of(Some(2))), (6, of(Some(2)))]),
            None,
        );
        assert_eq!(started[0].tasks, vec![2, 6]);
        assert!(started[0].all_tasks_started());
        // Without SLURM_GTIDS nothing is known to be missing.
        let unknown = steps_on_node(&rows, &HashMap::from([(2, of(None))]), None);
        assert!(unknown[0].all_tasks_started());
    }

    #[test]
    fn a_step_on_several_nodes_names_the_first_as_its_coordinators_host() {
        let rows = [row(1, 0, "slurmstepd"), row(2, 1, "python3")];
        let on = |list: &str, id| SlurmTask {
            step_nodes: Some(list.into()),
            node_id: Some(id),
            ..task("5", Some("0"), "n2")
        };
        let step = &steps_on_node(&rows, &HashMap::from([(2, on("n[1-2]", 1))]), None)[0];
        assert_eq!(step.nodes, ["n1", "n2"]);
        assert_eq!(step.spans_nodes(), Some(("n1", 1)));
        let alone = &steps_on_node(&rows, &HashMap::from([(2, on("n2", 0))]), None)[0];
        assert_eq!(alone.spans_nodes(), None, "one node: nothing to agree on");
    }
}
