//! Parser of `/proc/PID/environ` and the launcher variables that say which rank a process is.
//!
//! Parser only: reading `environ` takes the target's mmap lock and can block on a stuck process, so
//! [`crate::ProcFs`] never reads it. The caller reads it in a throwaway child and hands the bytes here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The environment of a process, in the order the kernel gave it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environ {
    vars: Vec<(String, String)>,
}

impl Environ {
    /// The value of `key`; the first occurrence wins, as `getenv` does.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }
}

/// Parses NUL-separated `KEY=VALUE` entries. Entries without `=` are skipped; bytes that are not UTF-8 are
/// replaced.
pub fn parse_environ(bytes: &[u8]) -> Environ {
    let vars = bytes
        .split(|b| *b == 0)
        .filter(|entry| !entry.is_empty())
        .filter_map(|entry| {
            let entry = String::from_utf8_lossy(entry);
            let (key, value) = entry.split_once('=')?;
            (!key.is_empty()).then(|| (key.to_owned(), value.to_owned()))
        })
        .collect();
    Environ { vars }
}

/// Where a process sits in a distributed job, from the variables launchers set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankEnv {
    /// `RANK` (torchrun, accelerate, Lightning), else `OMPI_COMM_WORLD_RANK`, else `PMI_RANK`.
    pub rank: Option<u32>,
    /// `LOCAL_RANK`, else `OMPI_COMM_WORLD_LOCAL_RANK`, else `MPI_LOCALRANKID`.
    pub local_rank: Option<u32>,
    /// `WORLD_SIZE`, else `OMPI_COMM_WORLD_SIZE`, else `PMI_SIZE`.
    pub world_size: Option<u32>,
    /// `LOCAL_WORLD_SIZE`, else `OMPI_COMM_WORLD_LOCAL_SIZE`.
    pub local_world_size: Option<u32>,
    /// `GROUP_RANK` (torchrun's node rank).
    pub group_rank: Option<u32>,
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
    /// `SLURM_PROCID`, kept apart from `rank`: under `srun ... torchrun` it numbers nodes, not ranks.
    pub slurm_procid: Option<u32>,
    /// `TORCHELASTIC_RUN_ID`: set in processes that torchrun started.
    pub torchelastic_run_id: Option<String>,
    /// `HANGWATCH_SOCKET`: where the rank's client sends heartbeats.
    pub hangwatch_socket: Option<String>,
    /// `HANGWATCH_ACTION` in the job's environment: what a job asks a node service to do about its hang (it may
    /// only narrow the site's action, docs/node-service.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hangwatch_action: Option<String>,
    /// Which Slurm job, step and node the process belongs to (`SLURM_JOB_ID`, `SLURM_STEP_ID`, absent in a batch
    /// script, and `SLURMD_NODENAME`, which tells emulated nodes on one machine apart).
    #[serde(default, skip_serializing_if = "SlurmTask::is_empty")]
    pub slurm: SlurmTask,
    /// Every variable of [`LAUNCHER_VARIABLES`] that is set to a number: what `hangwatch_diagnosis::ranks` picks a
    /// rank from, in its own order.
    #[serde(default)]
    pub launcher: BTreeMap<String, u32>,
}

/// A Slurm task's identity from its environment (names and ids, never secrets).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmTask {
    pub job_id: Option<String>,
    pub step_id: Option<String>,
    pub node_name: Option<String>,
    /// How many of the step's tasks run on this node: the length of `SLURM_GTIDS`, the global task ids that
    /// `slurmstepd` starts here. A node service waits for that many before it watches the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_on_node: Option<usize>,
    /// The step's nodes as Slurm writes them (`SLURM_STEP_NODELIST`, `n[1-2]`): the services of a step that spans
    /// several agree on its coordinator through the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_nodes: Option<String>,
    /// This node's index among the step's nodes (`SLURM_NODEID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<u32>,
}

impl SlurmTask {
    pub fn is_empty(&self) -> bool {
        self.job_id.is_none()
            && self.step_id.is_none()
            && self.node_name.is_none()
            && self.tasks_on_node.is_none()
            && self.step_nodes.is_none()
            && self.node_id.is_none()
    }
}

/// The number of task ids in `SLURM_GTIDS` (`0,1`): `None` unless every entry is a number.
fn count_task_ids(gtids: &str) -> Option<usize> {
    let ids: Vec<&str> = gtids.split(',').map(str::trim).collect();
    ids.iter()
        .all(|id| id.parse::<u32>().is_ok())
        .then_some(ids.len())
}

/// The numeric variables launchers set to say which rank a process is (torchrun, Lightning, Open MPI, PMIx, PMI,
/// Slurm). Only these leave the child that reads an environment; the rest may hold secrets.
pub const LAUNCHER_VARIABLES: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "PMIX_LOCAL_RANK",
    "PMIX_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
];

impl RankEnv {
    /// A launcher variable, when set to a number.
    pub fn var(&self, key: &str) -> Option<u32> {
        self.launcher.get(key).copied()
    }

    pub fn from_environ(env: &Environ) -> RankEnv {
        let number = |keys: &[&str]| keys.iter().find_map(|k| env.get(k)?.trim().parse().ok());
        let text = |key: &str| env.get(key).filter(|v| !v.is_empty()).map(str::to_owned);
        RankEnv {
            rank: number(&["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]),
            local_rank: number(&[
                "LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "MPI_LOCALRANKID",
            ]),
            world_size: number(&["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]),
            local_world_size: number(&["LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"]),
            group_rank: number(&["GROUP_RANK"]),
            master_addr: text("MASTER_ADDR"),
            master_port: env.get("MASTER_PORT").and_then(|v| v.trim().parse().ok()),
            slurm_procid: number(&["SLURM_PROCID"]),
            torchelastic_run_id: text("TORCHELASTIC_RUN_ID"),
            hangwatch_socket: text("HANGWATCH_SOCKET"),
            hangwatch_action: text("HANGWATCH_ACTION"),
            slurm: SlurmTask {
                job_id: text("SLURM_JOB_ID"),
                step_id: text("SLURM_STEP_ID"),
                node_name: text("SLURMD_NODENAME"),
                tasks_on_node: env.get("SLURM_GTIDS").and_then(count_task_ids),
                step_nodes: text("SLURM_STEP_NODELIST"),
                node_id: env.get("SLURM_NODEID").and_then(|v| v.trim().parse().ok()),
            },
            launcher: LAUNCHER_VARIABLES
                .iter()
                .filter_map(|k| Some(((*k).to_owned(), number(&[k])?)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The environment torchrun gives local rank 1 of 4 on node 1 of 2 (abridged).
    const TORCHRUN_RANK5: &[u8] =
        b"PATH=/usr/bin\0HOME=/root\0SLURM_PROCID=1\0LOCAL_RANK=1\0RANK=5\0\
GROUP_RANK=1\0LOCAL_WORLD_SIZE=4\0WORLD_SIZE=8\0MASTER_ADDR=n1\0MASTER_PORT=29500\0\
TORCHELASTIC_RUN_ID=job42\0HANGWATCH_SOCKET=/run/hangwatch/agent.sock\0";

    #[test]
    fn torchrun_rank() {
        let env = parse_environ(TORCHRUN_RANK5);
        assert_eq!(env.get("HOME"), Some("/root"));
        let rank = RankEnv::from_environ(&env);
        assert_eq!(rank.rank, Some(5));
        assert_eq!(rank.local_rank, Some(1));
        assert_eq!(rank.world_size, Some(8));
        assert_eq!(rank.local_world_size, Some(4));
        assert_eq!(rank.group_rank, Some(1));
        assert_eq!(rank.master_addr.as_deref(), Some("n1"));
        assert_eq!(rank.master_port, Some(29500));
        assert_eq!(rank.slurm_procid, Some(1));
        assert_eq!(rank.torchelastic_run_id.as_deref(), Some("job42"));
        assert_eq!(
            rank.hangwatch_socket.as_deref(),
            Some("/run/hangwatch/agent.sock")
        );
    }

    #[test]
    fn torchrun_itself_under_srun_is_no_rank() {
        let env = parse_environ(b"SLURM_PROCID=3\0SLURM_LOCALID=0\0PATH=/bin\0SECRET=1\0");
        let rank = RankEnv::from_environ(&env);
        assert_eq!(rank.rank, None);
        assert_eq!(rank.slurm_procid, Some(3));
        // The launcher variables are kept for the rank rule, and nothing else.
        assert_eq!(rank.var("SLURM_PROCID"), Some(3));
        assert_eq!(rank.var("SLURM_LOCALID"), Some(0));
        assert_eq!(rank.launcher.len(), 2);
    }

    #[test]
    fn a_slurm_task_says_how_many_tasks_of_its_step_run_on_its_node() {
        // What slurmstepd gives rank 2 of `srun -N2 -n4 --ntasks-per-node=2` on n2 (recorded, abridged).
        let env = parse_environ(
            b"SLURM_JOB_ID=7\0SLURM_STEP_ID=0\0SLURMD_NODENAME=n2\0SLURM_GTIDS=2,3\0SLURM_PROCID=2\0SLURM_STEP_NODELIST=n[1-2]\0SLURM_NODEID=1\0",
        );
        let slurm = RankEnv::from_environ(&env).slurm;
        assert_eq!(slurm.job_id.as_deref(), Some("7"));
        assert_eq!(slurm.node_name.as_deref(), Some("n2"));
        assert_eq!(slurm.tasks_on_node, Some(2));
        assert_eq!(
            (slurm.step_nodes.as_deref(), slurm.node_id),
            (Some("n[1-2]"), Some(1))
        );
        let batch = RankEnv::from_environ(&parse_environ(b"SLURM_JOB_ID=7\0SLURM_GTIDS=0\0")).slurm;
        assert_eq!(batch.tasks_on_node, Some(1));
        // Not a list of numbers: not a count.
        let odd = RankEnv::from_environ(&parse_environ(b"SLURM_GTIDS=0,x\0")).slurm;
        assert_eq!(odd.tasks_on_node, None);
        assert!(RankEnv::from_environ(&parse_environ(b"SLURM_GTIDS=\0"))
            .slurm
            .is_empty());
    }

    #[test]
    fn open_mpi_fallback() {
        let env = parse_environ(
            b"OMPI_COMM_WORLD_RANK=7\0OMPI_COMM_WORLD_LOCAL_RANK=3\0OMPI_COMM_WORLD_SIZE=16\0",
        );
        let rank = RankEnv::from_environ(&env);
        assert_eq!(
            (rank.rank, rank.local_rank, rank.world_size),
            (Some(7), Some(3), Some(16))
        );
    }

    #[test]
    fn odd_entries() {
        let env = parse_environ(b"A=1=2\0NOEQUALS\0=x\0B=\0\xff\xfe=bad\0A=shadowed\0\0");
        assert_eq!(env.get("A"), Some("1=2"));
        assert_eq!(env.get("B"), Some(""));
        assert_eq!(env.get("NOEQUALS"), None);
        assert_eq!(env.vars().len(), 4);
        let rank = RankEnv::from_environ(&parse_environ(
            b"RANK=-1\0WORLD_SIZE= 4\0MASTER_PORT=99999\0",
        ));
        assert_eq!(rank.rank, None);
        assert_eq!(rank.world_size, Some(4));
        assert_eq!(rank.master_port, None);
        assert_eq!(parse_environ(b""), Environ::default());
    }

    proptest! {
        #[test]
        fn never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let env = parse_environ(&bytes);
            let _ = RankEnv::from_environ(&env);
        }

        #[test]
        fn finds_rank_among_noise(noise in prop::collection::vec("[A-Z_]{1,8}=[a-z0-9]{0,8}", 0..10), rank in 0u32..100_000) {
            let mut text = noise.iter().filter(|e| !e.starts_with("RANK=")).cloned().collect::<Vec<_>>();
            text.insert(text.len() / 2, format!("RANK={rank}"));
            let env = parse_environ(text.join("\0").as_bytes());
            prop_assert_eq!(RankEnv::from_environ(&env).rank, Some(rank));
        }
    }
}
