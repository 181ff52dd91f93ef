//! Finding the ranks below a launcher as the job runs: reads the process tree (safe /proc reads) and the
//! environments of new Python processes (in throwaway children: `environ` can block), remembers what it learned
//! by (pid, start time), and applies the pure rule of [`hangwatch_diagnosis::ranks`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use hangwatch_diagnosis::ranks::{
    find_ranks_on_node, local_rank_only, rank_from_env, EnvFact, ProcFacts, RankClaim, TreeNode,
};
use hangwatch_model::{ProcId, RankSource};
use hangwatch_proc::{is_multiprocessing_spawn, ProcFs, RankEnv, TaskStat};

use crate::pystack::{read_environments, StackReadOptions};
use crate::rollcall::is_python;

/// How often an environment that could not be read is tried again before the process is taken for no rank.
const ENV_ATTEMPTS: u8 = 3;

/// A rank found below the launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundRank {
    /// Pid and start time: a later process that reuses the pid is not this rank.
    pub id: ProcId,
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// Where the number came from.
    pub source: RankSource,
    /// Its process group (ranks are signalled by group).
    pub pgid: i32,
}

/// What one look at the tree found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovery {
    /// Every rank alive now, in rank order.
    pub ranks: Vec<FoundRank>,
    /// Ranks not reported by an earlier look.
    pub new: Vec<FoundRank>,
    /// Ranks reported earlier that are gone now (exited, or their pid belongs to another process).
    pub gone: Vec<FoundRank>,
    /// Ranks reported earlier that turned out to be launchers (processes below them carry other ranks): they
    /// are no longer ranks.
    pub demoted: Vec<FoundRank>,
    /// Ranks reported earlier whose number or source changed (a client corrected a guess from the structure).
    pub renumbered: Vec<FoundRank>,
    /// Worker processes alive now (descendants of ranks): they belong to their rank, are never ranks.
    pub workers: usize,
}

/// What the throwaway child read of one process: the launcher variables of its environment and whether
/// `multiprocessing`'s spawn started it (its command line).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub env: RankEnv,
    pub spawned: bool,
}

impl Identity {
    fn facts(&self) -> ProcFacts {
        let get = |k: &str| self.env.var(k);
        ProcFacts {
            env: rank_from_env(get).map_or(EnvFact::NoRank, EnvFact::Rank),
            local_only: local_rank_only(get),
            spawned: self.spawned,
            client: None,
        }
    }
}

/// Reads a batch of environments; `None` for a process whose environment could not be read.
pub type EnvReader<'a> = dyn FnMut(&[i32]) -> HashMap<i32, Option<Identity>> + 'a;

/// What ranks' own clients reported, by process: the strongest source (see `hangwatch_diagnosis::ranks`).
pub type ClientReports = HashMap<ProcId, RankClaim>;

/// Remembers, across looks, what each process of the tree is.
#[derive(Debug, Default)]
pub struct RankFinder {
    env: HashMap<ProcId, ProcFacts>,
    attempts: HashMap<ProcId, u8>,
    /// Read once without RANK: read again on the next look. A process caught between fork and exec (Popen, the
    /// launcher starting a rank) still has its parent's environment, and exec keeps pid and start time.
    recheck: HashSet<ProcId>,
    known_workers: HashSet<ProcId>,
    /// Numbers the structure gave: kept while the process lives, so that ranks are not renumbered when one exits.
    structure: HashMap<ProcId, u32>,
    ranks: BTreeMap<ProcId, FoundRank>,
    /// This node's rank in a multi-node job: the structure's numbers are made global with it.
    node_rank: Option<u32>,
}

impl RankFinder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The finder of node `node_rank` of a multi-node job (`None`: one node).
    pub fn on_node(node_rank: Option<u32>) -> Self {
        Self {
            node_rank,
            ..Self::default()
        }
    }

    /// Looks at the trees below `roots` (the processes hangwatch started), reading environments in throwaway
    /// children under a 2 s deadline in all.
    pub fn refresh(
        &mut self,
        procfs: &ProcFs,
        roots: &[i32],
        clients: &ClientReports,
    ) -> Discovery {
        let options = StackReadOptions::for_self().ok().map(|mut o| {
            o.total_timeout = Duration::from_secs(2);
            o
        });
        let mut read = |pids: &[i32]| -> HashMap<i32, Option<Identity>> {
            let Some(options) = &options else {
                return HashMap::new();
            };
            read_environments(pids, options)
                .reports
                .into_iter()
                .map(|(pid, report)| {
                    let spawned = report
                        .cmdline
                        .as_deref()
                        .is_some_and(is_multiprocessing_spawn);
                    let identity = report.rank_env.map(|env| Identity { env, spawned });
                    (pid, identity)
                })
                .collect()
        };
        self.refresh_with(procfs, roots, clients, &mut read)
    }

    /// [`RankFinder::refresh`] with the environment reader given (tests pass a map).
    pub fn refresh_with(
        &mut self,
        procfs: &ProcFs,
        roots: &[i32],
        clients: &ClientReports,
        read_env: &mut EnvReader<'_>,
    ) -> Discovery {
        let stats = procfs.subtree(roots);
        let nodes: Vec<TreeNode> = stats.iter().map(tree_node).collect();
        let present: HashSet<ProcId> = nodes.iter().map(|n| n.id).collect();
        self.env.retain(|id, _| present.contains(id));
        self.attempts.retain(|id, _| present.contains(id));
        self.structure.retain(|id, _| present.contains(id));
        self.recheck.retain(|id| present.contains(id));
        self.known_workers.retain(|id| present.contains(id));

        let owned = self.owned_by_known_ranks(&nodes);
        let mut to_read = Vec::new();
        // Not Python now; asked again on every look (cheap), since a fork may yet exec Python.
        let mut not_python = HashSet::new();
        for node in &nodes {
            if self.env.contains_key(&node.id) && !self.recheck.remove(&node.id) {
                continue;
            }
            if is_python(procfs, node.id.pid) {
                to_read.push(node.id);
            } else {
                not_python.insert(node.id);
            }
        }
        if !to_read.is_empty() {
            let pids: Vec<i32> = to_read.iter().map(|id| id.pid).collect();
            let found = read_env(&pids);
            for id in to_read {
                // The pid may have been reused while its environment was read: keep only what is still true.
                let same = procfs
                    .stat(id.pid)
                    .is_ok_and(|s| s.starttime == id.start_time);
                match found.get(&id.pid) {
                    Some(Some(identity)) if same => {
                        let facts = identity.facts();
                        if facts.env == EnvFact::NoRank && self.env.insert(id, facts).is_none() {
                            self.recheck.insert(id);
                        }
                        self.env.insert(id, facts);
                    }
                    // Below a known rank a process is a worker whatever it carries; only a launcher with a
                    // stray RANK is told by its children's values, so one try is enough.
                    _ if owned.contains(&id) => {
                        self.env.insert(id, EnvFact::NoRank.into());
                    }
                    _ => {
                        let tries = self.attempts.entry(id).or_insert(0);
                        *tries += 1;
                        if *tries >= ENV_ATTEMPTS {
                            tracing::warn!(
                                pid = id.pid,
                                "cannot read the environment of a process below the launcher; it is not taken for a rank"
                            );
                            self.env.insert(id, EnvFact::NoRank.into());
                        }
                    }
                }
            }
        }

        let facts = |id: ProcId| {
            let mut facts = match self.env.get(&id) {
                Some(facts) => *facts,
                None if not_python.contains(&id) => EnvFact::NoRank.into(),
                None => EnvFact::Unknown.into(),
            };
            facts.client = clients.get(&id).copied();
            facts
        };
        let map = find_ranks_on_node(
            &nodes,
            roots,
            facts,
            &self.known_workers,
            &self.structure,
            self.node_rank,
        );
        self.known_workers.extend(map.workers.iter().map(|w| w.id));
        // The structure's own (local) numbers: the next look numbers from them again.
        self.structure.extend(
            map.ranks
                .iter()
                .filter(|r| r.source == RankSource::Structure)
                .map(|r| (r.id, r.local_rank.unwrap_or(r.rank))),
        );

        let pgid_of: HashMap<i32, i32> = stats.iter().map(|s| (s.pid, s.pgrp)).collect();
        let now: BTreeMap<ProcId, FoundRank> = map
            .ranks
            .iter()
            .map(|r| {
                let found = FoundRank {
                    id: r.id,
                    rank: r.rank,
                    local_rank: r.local_rank,
                    world_size: r.world_size,
                    source: r.source,
                    pgid: pgid_of.get(&r.id.pid).copied().unwrap_or(r.id.pid),
                };
                (r.id, found)
            })
            .collect();
        let mut discovery = Discovery {
            workers: map.workers.len(),
            ..Discovery::default()
        };
        for (id, found) in &self.ranks {
            if let Some(current) = now.get(id) {
                if (current.rank, current.source) != (found.rank, found.source) {
                    discovery.renumbered.push(current.clone());
                }
                continue;
            }
            if present.contains(id) {
                discovery.demoted.push(found.clone());
            } else {
                discovery.gone.push(found.clone());
            }
        }
        discovery.new = now
            .iter()
            .filter(|(id, _)| !self.ranks.contains_key(id))
            .map(|(_, f)| f.clone())
            .collect();
        discovery.ranks = now.values().cloned().collect();
        discovery.ranks.sort_by_key(|r| (r.rank, r.id));
        self.ranks = now;
        discovery
    }

    /// Processes below a rank found earlier: workers whatever their environment.
    fn owned_by_known_ranks(&self, nodes: &[TreeNode]) -> HashSet<ProcId> {
        let by_pid: HashMap<i32, &TreeNode> = nodes.iter().map(|n| (n.id.pid, n)).collect();
        let mut owned = HashSet::new();
        for node in nodes {
            let mut at = node;
            // Bounded: a malformed snapshot must not loop.
            for _ in 0..256 {
                let Some(parent) = by_pid.get(&at.ppid) else {
                    break;
                };
                if self.ranks.contains_key(&parent.id) || owned.contains(&parent.id) {
                    owned.insert(node.id);
                    break;
                }
                at = parent;
            }
        }
        owned
    }
}

fn tree_node(stat: &TaskStat) -> TreeNode {
    TreeNode {
        id: ProcId {
            pid: stat.pid,
            start_time: stat.starttime,
        },
        ppid: stat.ppid,
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use super::*;

    /// A fake /proc: each process with `stat`, `exe` and one thread whose `children` lists its children.
    struct FakeProc {
        dir: tempfile::TempDir,
    }

    impl FakeProc {
        fn new() -> Self {
            FakeProc {
                dir: tempfile::tempdir().unwrap(),
            }
        }

        fn procfs(&self) -> ProcFs {
            ProcFs::new(self.dir.path())
        }

        fn add(&self, pid: i32, ppid: i32, start: u64, exe: &str) {
            let dir = self.dir.path().join(pid.to_string());
            let task = dir.join("task").join(pid.to_string());
            fs::create_dir_all(&task).unwrap();
            let stat = format!(
                "{pid} (x) S {ppid} {ppid} 0 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 {start} 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 \
                 0 0 0 0 0 0\n"
            );
            fs::write(dir.join("stat"), &stat).unwrap();
            fs::write(task.join("stat"), &stat).unwrap();
            fs::write(task.join("children"), "").unwrap();
            let _ = fs::remove_file(dir.join("exe"));
            std::os::unix::fs::symlink(exe, dir.join("exe")).unwrap();
            if let Ok(siblings) = fs::read_to_string(self.children_file(ppid)) {
                fs::write(self.children_file(ppid), format!("{siblings}{pid} ")).unwrap();
            }
        }

        fn remove(&self, pid: i32, ppid: i32) {
            fs::remove_dir_all(self.dir.path().join(pid.to_string())).unwrap();
            let file = self.children_file(ppid);
            if let Ok(text) = fs::read_to_string(&file) {
                let rest: Vec<&str> = text
                    .split_whitespace()
                    .filter(|c| *c != pid.to_string())
                    .collect();
                fs::write(
                    &file,
                    rest.iter().map(|c| format!("{c} ")).collect::<String>(),
                )
                .unwrap();
            }
        }

        fn children_file(&self, pid: i32) -> std::path::PathBuf {
            let p = pid.to_string();
            Path::new(self.dir.path())
                .join(&p)
                .join("task")
                .join(&p)
                .join("children")
        }
    }

    fn env(rank: Option<u32>) -> Option<Identity> {
        let mut env = RankEnv::default();
        if let Some(rank) = rank {
            env.launcher.insert("RANK".into(), rank);
            env.launcher.insert("LOCAL_RANK".into(), rank);
        }
        Some(Identity {
            env,
            spawned: false,
        })
    }

    fn spawned() -> Option<Identity> {
        Some(Identity {
            env: RankEnv::default(),
            spawned: true,
        })
    }

    fn pids(ranks: &[FoundRank]) -> Vec<(i32, u32)> {
        ranks.iter().map(|r| (r.id.pid, r.rank)).collect()
    }

    #[test]
    fn ranks_are_found_workers_are_not_and_a_rank_caught_before_exec_is_found_on_the_next_look() {
        let fake = FakeProc::new();
        fake.add(10, 1, 100, "/usr/bin/python3.12");
        // 20 is rank 0; 30 was just forked by the launcher and has not exec'd yet: it still has no RANK.
        fake.add(20, 10, 200, "/usr/bin/python3.12");
        fake.add(21, 20, 210, "/usr/bin/python3.12");
        fake.add(30, 10, 300, "/usr/bin/python3.12");
        let mut envs: HashMap<i32, Option<Identity>> = HashMap::from([
            (10, env(None)),
            (20, env(Some(0))),
            (21, env(Some(0))),
            (30, env(None)),
        ]);
        let mut finder = RankFinder::new();
        let mut reads: Vec<Vec<i32>> = Vec::new();
        let look = |finder: &mut RankFinder,
                    envs: &HashMap<i32, Option<Identity>>,
                    reads: &mut Vec<Vec<i32>>| {
            finder.refresh_with(
                &fake.procfs(),
                &[10],
                &HashMap::new(),
                &mut |p: &[i32]| {
                    reads.push(p.to_vec());
                    p.iter()
                        .map(|pid| (*pid, envs.get(pid).cloned().flatten()))
                        .collect()
                },
            )
        };
        let first = look(&mut finder, &envs, &mut reads);
        assert_eq!(pids(&first.ranks), [(20, 0)]);
        assert_eq!(pids(&first.new), [(20, 0)]);
        assert_eq!(first.workers, 1);
        assert_eq!(first.ranks[0].local_rank, Some(0));

        envs.insert(30, env(Some(1)));
        let second = look(&mut finder, &envs, &mut reads);
        assert_eq!(pids(&second.ranks), [(20, 0), (30, 1)]);
        assert_eq!(pids(&second.new), [(30, 1)]);
        // Read again: the launcher and 30 (both without RANK the first time); never the worker twice.
        assert_eq!(reads[1], [10, 30]);

        // The worker exits and a new one comes; rank 1 exits; a process reuses rank 1's pid (another start
        // time) below the launcher without RANK.
        fake.remove(21, 20);
        fake.add(22, 20, 220, "/usr/bin/python3.12");
        fake.remove(30, 10);
        fake.add(30, 10, 999, "/bin/sh");
        let third = look(&mut finder, &envs, &mut reads);
        assert_eq!(pids(&third.ranks), [(20, 0)]);
        assert_eq!(pids(&third.gone), [(30, 1)]);
        assert!(third.new.is_empty());
        assert_eq!(third.workers, 1);
    }

    #[test]
    fn a_rank_found_early_is_demoted_when_other_ranks_appear_below_it() {
        let fake = FakeProc::new();
        // torchrun started with a stray RANK=0 in its environment, before it started its ranks.
        fake.add(10, 1, 100, "/usr/bin/python3.12");
        let envs = HashMap::from([(10, env(Some(0))), (20, env(Some(0))), (30, env(Some(1)))]);
        let mut finder = RankFinder::new();
        let mut read = |p: &[i32]| {
            p.iter()
                .map(|pid| (*pid, envs.get(pid).cloned().flatten()))
                .collect()
        };
        let first = finder.refresh_with(&fake.procfs(), &[10], &HashMap::new(), &mut read);
        assert_eq!(pids(&first.ranks), [(10, 0)]);
        fake.add(20, 10, 200, "/usr/bin/python3.12");
        fake.add(30, 10, 300, "/usr/bin/python3.12");
        let second = finder.refresh_with(&fake.procfs(), &[10], &HashMap::new(), &mut read);
        assert_eq!(pids(&second.ranks), [(20, 0), (30, 1)]);
        assert_eq!(pids(&second.demoted), [(10, 0)]);
    }

    #[test]
    fn mp_spawn_children_are_ranks_by_start_order_until_their_clients_say_otherwise() {
        let fake = FakeProc::new();
        fake.add(10, 1, 100, "/usr/bin/python3.12");
        fake.add(20, 10, 200, "/usr/bin/python3.12");
        fake.add(30, 10, 300, "/usr/bin/python3.12");
        // Rank 0's forked DataLoader worker: same command line, below a rank.
        fake.add(21, 20, 210, "/usr/bin/python3.12");
        let envs = HashMap::from([
            (10, env(None)),
            (20, spawned()),
            (30, spawned()),
            (21, spawned()),
        ]);
        let mut finder = RankFinder::new();
        let mut read = |p: &[i32]| {
            p.iter()
                .map(|pid| (*pid, envs.get(pid).cloned().flatten()))
                .collect()
        };
        let first = finder.refresh_with(&fake.procfs(), &[10], &HashMap::new(), &mut read);
        assert_eq!(pids(&first.ranks), [(20, 0), (30, 1)]);
        assert!(first
            .ranks
            .iter()
            .all(|r| r.source == RankSource::Structure));
        assert_eq!(first.workers, 1);

        let clients = HashMap::from([
            (
                ProcId {
                    pid: 20,
                    start_time: 200,
                },
                RankClaim::new(1, RankSource::Client),
            ),
            (
                ProcId {
                    pid: 30,
                    start_time: 300,
                },
                RankClaim::new(0, RankSource::Client),
            ),
        ]);
        let second = finder.refresh_with(&fake.procfs(), &[10], &clients, &mut read);
        assert_eq!(pids(&second.ranks), [(30, 0), (20, 1)]);
        assert_eq!(pids(&second.renumbered), [(20, 1), (30, 0)]);
        assert!(second.ranks.iter().all(|r| r.source == RankSource::Client));
        assert!(second.new.is_empty() && second.gone.is_empty());
    }
}
