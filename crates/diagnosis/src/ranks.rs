//! Who is a rank in a launcher's process tree, and where its number comes from. Its descendants (DataLoader,
//! compile and `multiprocessing` workers, which inherit the launcher's variables) belong to it and are never ranks.
//!
//! A rank's number comes from the first of these sources that knows it (docs/run.md, "Who is a rank"):
//!
//! | order | source | what | local rank, world size |
//! |---|---|---|---|
//! | 1 | `client` | the rank's Python client, once `torch.distributed` is initialized (or Lightning's `global_rank`) | as reported |
//! | 2 | `env:RANK` | torchrun, accelerate, `--nproc`, DeepSpeed | `LOCAL_RANK`, `WORLD_SIZE` |
//! | 3 | `env:OMPI_COMM_WORLD_RANK` | Open MPI's `mpirun` | `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_SIZE` |
//! | 4 | `env:PMIX_RANK` | PMIx launchers (`srun --mpi=pmix`) | `PMIX_LOCAL_RANK`, `PMIX_SIZE` |
//! | 5 | `env:PMI_RANK` | MPICH and Intel MPI (hydra) | `MPI_LOCALRANKID`, `PMI_SIZE` |
//! | 6 | `env:SLURM_PROCID` | an `srun` task | `SLURM_LOCALID`, `SLURM_NTASKS` |
//! | 7 | `structure` | the children `torch.multiprocessing.spawn` started, in start order; Lightning's launcher and the processes it started (`LOCAL_RANK`, `NODE_RANK`) | start order; `LOCAL_RANK` |
//!
//! `SLURM_PROCID` comes last of the variables: a task of `srun` that runs `torchrun` or `mpirun` carries the task's
//! number, which numbers nodes, while the processes below carry the ranks.
//!
//! Pure: a snapshot of the tree and what is known of each process in, the rank map out.

use std::collections::{BTreeSet, HashMap, HashSet};

use hangwatch_model::ProcId;
pub use hangwatch_model::RankSource;

/// One process of the tree below the launcher, as read from /proc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeNode {
    pub id: ProcId,
    pub ppid: i32,
}

/// A rank number and where it came from, with what the same source says of the local rank and world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankClaim {
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    pub source: RankSource,
}

impl RankClaim {
    /// A claim with the number only (tests, and sources that know nothing else).
    pub fn new(rank: u32, source: RankSource) -> RankClaim {
        RankClaim {
            rank,
            local_rank: None,
            world_size: None,
            source,
        }
    }
}

/// One environment source of a rank number: the variable that gives it and those that give the local rank and
/// the world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvSource {
    pub source: RankSource,
    pub rank: &'static str,
    pub local_rank: &'static str,
    pub world_size: &'static str,
}

/// The environment sources, in the order they are tried (the module's table).
pub const ENV_SOURCES: [EnvSource; 5] = [
    EnvSource {
        source: RankSource::EnvRank,
        rank: "RANK",
        local_rank: "LOCAL_RANK",
        world_size: "WORLD_SIZE",
    },
    EnvSource {
        source: RankSource::EnvOmpi,
        rank: "OMPI_COMM_WORLD_RANK",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        world_size: "OMPI_COMM_WORLD_SIZE",
    },
    EnvSource {
        source: RankSource::EnvPmix,
        rank: "PMIX_RANK",
        local_rank: "PMIX_LOCAL_RANK",
        world_size: "PMIX_SIZE",
    },
    EnvSource {
        source: RankSource::EnvPmi,
        rank: "PMI_RANK",
        local_rank: "MPI_LOCALRANKID",
        world_size: "PMI_SIZE",
    },
    EnvSource {
        source: RankSource::EnvSlurm,
        rank: "SLURM_PROCID",
        local_rank: "SLURM_LOCALID",
        world_size: "SLURM_NTASKS",
    },
];

/// The rank a process's starting environment gives it: the first source of [`ENV_SOURCES`] whose variable is
/// set. `get` looks a variable up as a number.
pub fn rank_from_env(get: impl Fn(&str) -> Option<u32>) -> Option<RankClaim> {
    ENV_SOURCES.iter().find_map(|s| {
        Some(RankClaim {
            rank: get(s.rank)?,
            local_rank: get(s.local_rank),
            world_size: get(s.world_size),
            source: s.source,
        })
    })
}

/// `LOCAL_RANK` with no rank variable: how Lightning's launcher starts the ranks after the first (it runs the
/// script again with `LOCAL_RANK`, `NODE_RANK` and `WORLD_SIZE` set; rank 0 is the original process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalOnly {
    pub local_rank: u32,
    pub node_rank: Option<u32>,
    pub world_size: Option<u32>,
}

/// [`LocalOnly`] from a starting environment, when it is one (no variable of [`ENV_SOURCES`] set).
pub fn local_rank_only(get: impl Fn(&str) -> Option<u32>) -> Option<LocalOnly> {
    if ENV_SOURCES.iter().any(|s| get(s.rank).is_some()) {
        return None;
    }
    Some(LocalOnly {
        local_rank: get("LOCAL_RANK")?,
        node_rank: get("NODE_RANK").or_else(|| get("GROUP_RANK")),
        world_size: get("WORLD_SIZE"),
    })
}

/// What a process's starting environment says about its rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvFact {
    Rank(RankClaim),
    /// No rank variable, or not a process that can be a rank (not Python).
    NoRank,
    /// Not read yet, or the read failed: nothing below it is decided until it is known.
    Unknown,
}

/// Everything the rule knows of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcFacts {
    pub env: EnvFact,
    /// Lightning's launcher started it (see [`LocalOnly`]).
    pub local_only: Option<LocalOnly>,
    /// Started by `multiprocessing`'s spawn (`spawn_main`, `--multiprocessing-fork` on its command line), as
    /// `torch.multiprocessing.spawn` starts ranks (and a spawn-context DataLoader its workers).
    pub spawned: bool,
    /// What its own client reported (source `client`).
    pub client: Option<RankClaim>,
}

impl From<EnvFact> for ProcFacts {
    fn from(env: EnvFact) -> ProcFacts {
        ProcFacts {
            env,
            local_only: None,
            spawned: false,
            client: None,
        }
    }
}

/// A process found to be a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankAssignment {
    pub id: ProcId,
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    pub source: RankSource,
}

/// A process found to belong to a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerAssignment {
    pub id: ProcId,
    pub parent_pid: i32,
    /// The rank process it belongs to.
    pub owner: ProcId,
    pub rank: u32,
}

/// The ranks of a tree and their workers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankMap {
    /// In rank order.
    pub ranks: Vec<RankAssignment>,
    pub workers: Vec<WorkerAssignment>,
    /// Processes below one whose environment is still unknown: decided on a later look.
    pub undecided: Vec<ProcId>,
}

impl RankMap {
    /// The rank of `id`, when it is one.
    pub fn rank_of(&self, id: ProcId) -> Option<u32> {
        self.ranks.iter().find(|r| r.id == id).map(|r| r.rank)
    }
}

#[derive(Clone, Copy)]
enum Below {
    /// No rank above: a process here is a rank if a source says so.
    Free,
    Owned {
        owner: ProcId,
        rank: u32,
        /// The owner is Lightning's first rank: its children with [`LocalOnly`] are ranks too.
        lightning: bool,
    },
    /// Above is a process whose environment is unknown.
    Undecided,
    /// Above is a known worker whose rank is gone (a reparented orphan): never a rank, no owner either.
    Orphaned,
}

/// Finds the ranks below `roots` (the processes hangwatch started; they may be ranks themselves).
///
/// A process is a rank when a source gives it a number and no process above it is a rank, with these
/// exceptions:
/// - a process whose environment gives a number, below which other processes claim a *different* number or one
///   from a stronger source, is a launcher (torchrun started from a script that exported `RANK`, `srun` running
///   torchrun), not a rank;
/// - a process whose client reported a number is a rank wherever it is, unless the rank above it has the same
///   number (a forked child of a rank that inherited its state);
/// - Lightning's launcher: a process without a rank variable whose children carry [`LocalOnly`] is rank
///   `NODE_RANK x n + 0` and those children are ranks `NODE_RANK x n + LOCAL_RANK` (n: its ranks on this node);
/// - the children of a process that is no rank and carries no number, started by `multiprocessing`'s spawn, are
///   ranks in start order (`torch.multiprocessing.spawn`), once every child of that process is known. A
///   number given so before (`structure_before`, by pid and start time) is kept, so that ranks are not renumbered
///   when one exits.
///
/// A process in `known_workers` (seen as a worker before, identified by pid and start time) is never a rank, even
/// when its rank is gone and it was reparented.
pub fn find_ranks(
    nodes: &[TreeNode],
    roots: &[i32],
    facts: impl Fn(ProcId) -> ProcFacts,
    known_workers: &HashSet<ProcId>,
    structure_before: &HashMap<ProcId, u32>,
) -> RankMap {
    find_ranks_on_node(nodes, roots, facts, known_workers, structure_before, None)
}

/// [`find_ranks`] on node `node_rank` of a multi-node job: the numbers the structure gives spawned children are
/// this node's (0..n), so they are made global as torchrun does (`node_rank x n + local`), their local rank kept;
/// `structure_before` holds local numbers. Two nodes of `torch.multiprocessing.spawn` ranks then never claim the
/// same rank before the coordinator.
pub fn find_ranks_on_node(
    nodes: &[TreeNode],
    roots: &[i32],
    facts: impl Fn(ProcId) -> ProcFacts,
    known_workers: &HashSet<ProcId>,
    structure_before: &HashMap<ProcId, u32>,
    node_rank: Option<u32>,
) -> RankMap {
    let mut children: HashMap<i32, Vec<usize>> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        if node.ppid != node.id.pid {
            children.entry(node.ppid).or_default().push(i);
        }
    }
    let index: HashMap<i32, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id.pid, i))
        .collect();
    let facts: Vec<ProcFacts> = nodes.iter().map(|n| facts(n.id)).collect();
    let below = claims_below(nodes, &children, &facts);
    let kids = |i: usize| {
        children
            .get(&nodes[i].id.pid)
            .into_iter()
            .flatten()
            .copied()
    };

    let mut map = RankMap::default();
    let mut visited = vec![false; nodes.len()];
    let mut stack: Vec<(usize, Below)> = roots
        .iter()
        .rev()
        .filter_map(|root| index.get(root).map(|&i| (i, Below::Free)))
        .collect();
    while let Some((i, above)) = stack.pop() {
        if std::mem::replace(&mut visited[i], true) {
            continue;
        }
        let node = nodes[i];
        let f = facts[i];
        let step = match above {
            Below::Owned {
                owner,
                rank: owner_rank,
                lightning,
            } => {
                let direct = lightning && node.ppid == owner.pid && !f.spawned;
                let siblings = || lightning_child_ranks(&facts, kids(index[&owner.pid]));
                match (f.client, f.local_only.filter(|_| direct)) {
                    (Some(c), _) if c.rank != owner_rank => Step::Rank(c, false),
                    (_, Some(local)) if local.local_rank > 0 => {
                        let n = siblings().unwrap_or(0);
                        Step::Rank(lightning_claim(local, n + 1), false)
                    }
                    _ if direct && f.env == EnvFact::Unknown => Step::Undecided,
                    _ => Step::Worker { owner, owner_rank },
                }
            }
            Below::Orphaned => Step::Keep(Below::Orphaned),
            Below::Undecided => match f.client {
                Some(c) => Step::Rank(c, false),
                None => Step::Undecided,
            },
            Below::Free if known_workers.contains(&node.id) => Step::Keep(Below::Orphaned),
            Below::Free => match (f.client, f.env) {
                (Some(c), EnvFact::Rank(e)) if c.rank == e.rank => Step::Rank(e, false),
                (Some(c), _) => Step::Rank(c, false),
                (None, EnvFact::Unknown) => Step::Undecided,
                (None, EnvFact::Rank(e)) if is_launcher(e, &below[i]) => Step::Keep(Below::Free),
                (None, EnvFact::Rank(e)) => Step::Rank(e, false),
                (None, EnvFact::NoRank) => match lightning_child_ranks(&facts, kids(i)) {
                    Some(n) => {
                        let first = LocalOnly {
                            local_rank: 0,
                            node_rank: kids(i).find_map(|c| facts[c].local_only?.node_rank),
                            world_size: kids(i).find_map(|c| facts[c].local_only?.world_size),
                        };
                        Step::Rank(lightning_claim(first, n + 1), true)
                    }
                    None => Step::Keep(Below::Free),
                },
            },
        };
        let here = match step {
            Step::Rank(claim, lightning) => {
                map.ranks.push(assignment(node.id, claim));
                Below::Owned {
                    owner: node.id,
                    rank: claim.rank,
                    lightning,
                }
            }
            Step::Worker { owner, owner_rank } => {
                map.workers.push(WorkerAssignment {
                    id: node.id,
                    parent_pid: node.ppid,
                    owner,
                    rank: owner_rank,
                });
                above
            }
            Step::Undecided => {
                map.undecided.push(node.id);
                Below::Undecided
            }
            Step::Keep(below) => below,
        };
        let order = match here {
            // A spawned process's own spawned children are its workers (a spawn-context DataLoader).
            Below::Free if !f.spawned => spawn_order(nodes, &facts, kids(i), structure_before),
            _ => SpawnOrder::default(),
        };
        for &child in kids(i).collect::<Vec<_>>().iter().rev() {
            let child_id = nodes[child].id;
            let candidate = facts[child].client.is_none() && !known_workers.contains(&child_id);
            match order.numbers.get(&child) {
                Some(&n) if candidate => {
                    visited[child] = true;
                    let local_world = u32::try_from(order.numbers.len()).unwrap_or(u32::MAX);
                    let base = node_rank.unwrap_or(0).saturating_mul(local_world);
                    let claim = RankClaim {
                        rank: base.saturating_add(n),
                        local_rank: Some(n),
                        // One node's count is the world only on one node.
                        world_size: node_rank.is_none().then_some(local_world),
                        source: RankSource::Structure,
                    };
                    map.ranks.push(assignment(child_id, claim));
                    let owned = Below::Owned {
                        owner: child_id,
                        rank: n,
                        lightning: false,
                    };
                    for &grandchild in kids(child).collect::<Vec<_>>().iter().rev() {
                        stack.push((grandchild, owned));
                    }
                }
                _ if candidate && order.waiting && is_spawn_candidate(&facts[child]) => {
                    stack.push((child, Below::Undecided));
                }
                _ => stack.push((child, here)),
            }
        }
    }
    map.ranks.sort_by_key(|r| (r.rank, r.id));
    map
}

/// What the walk decides for one process.
enum Step {
    Rank(RankClaim, bool),
    Worker { owner: ProcId, owner_rank: u32 },
    Undecided,
    Keep(Below),
}

fn assignment(id: ProcId, claim: RankClaim) -> RankAssignment {
    RankAssignment {
        id,
        rank: claim.rank,
        local_rank: claim.local_rank,
        world_size: claim.world_size,
        source: claim.source,
    }
}

/// A process that carries `claim` is a launcher when a process below it claims another number, or the same from
/// a stronger source (`srun` running torchrun: the task carries `SLURM_PROCID`, its ranks `RANK`).
fn is_launcher(claim: RankClaim, below: &BTreeSet<(u32, RankSource)>) -> bool {
    below
        .iter()
        .any(|&(rank, source)| rank != claim.rank || source < claim.source)
}

/// How many children of a process Lightning's launcher started (`None`: none, so it is no Lightning launcher).
fn lightning_child_ranks(facts: &[ProcFacts], kids: impl Iterator<Item = usize>) -> Option<u32> {
    let n = kids
        .filter(|&c| {
            let f = facts[c];
            !f.spawned && f.local_only.is_some_and(|l| l.local_rank > 0)
        })
        .count();
    (n > 0).then(|| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The claim of a rank Lightning's launcher started, `local_world` ranks on the node.
fn lightning_claim(local: LocalOnly, local_world: u32) -> RankClaim {
    let base = local.node_rank.unwrap_or(0).saturating_mul(local_world);
    RankClaim {
        rank: base.saturating_add(local.local_rank),
        local_rank: Some(local.local_rank),
        world_size: local.world_size,
        source: RankSource::Structure,
    }
}

/// The structure's numbers for the spawned children of one process.
#[derive(Default)]
struct SpawnOrder {
    /// Child index -> rank number.
    numbers: HashMap<usize, u32>,
    /// A child is still unknown: no numbers yet (a later start could come before), its spawned siblings wait.
    waiting: bool,
}

fn is_spawn_candidate(f: &ProcFacts) -> bool {
    f.spawned && f.env == EnvFact::NoRank && f.local_only.is_none()
}

/// The numbers of the children that `multiprocessing`'s spawn started, by start order. Numbers given before are
/// kept; new children take the next ones.
fn spawn_order(
    nodes: &[TreeNode],
    facts: &[ProcFacts],
    kids: impl Iterator<Item = usize>,
    before: &HashMap<ProcId, u32>,
) -> SpawnOrder {
    let kids: Vec<usize> = kids.collect();
    if kids.iter().any(|&c| facts[c].env == EnvFact::Unknown) {
        return SpawnOrder {
            numbers: HashMap::new(),
            waiting: true,
        };
    }
    let mut spawned: Vec<usize> = kids
        .into_iter()
        .filter(|&c| is_spawn_candidate(&facts[c]))
        .collect();
    spawned.sort_by_key(|&c| (nodes[c].id.start_time, nodes[c].id.pid));
    let mut next = spawned
        .iter()
        .filter_map(|&c| before.get(&nodes[c].id))
        .max()
        .map_or(0, |m| m + 1);
    let numbers = spawned
        .into_iter()
        .map(|c| {
            let n = match before.get(&nodes[c].id) {
                Some(&n) => n,
                None => {
                    next += 1;
                    next - 1
                }
            };
            (c, n)
        })
        .collect();
    SpawnOrder {
        numbers,
        waiting: false,
    }
}

/// For each node, the numbers claimed below it (by the environment or a client), with their sources.
fn claims_below(
    nodes: &[TreeNode],
    children: &HashMap<i32, Vec<usize>>,
    facts: &[ProcFacts],
) -> Vec<BTreeSet<(u32, RankSource)>> {
    fn claims(f: &ProcFacts) -> impl Iterator<Item = (u32, RankSource)> {
        let env = match f.env {
            EnvFact::Rank(c) => Some((c.rank, c.source)),
            _ => None,
        };
        env.into_iter()
            .chain(f.client.map(|c| (c.rank, RankSource::Client)))
    }
    fn fill(
        i: usize,
        nodes: &[TreeNode],
        children: &HashMap<i32, Vec<usize>>,
        facts: &[ProcFacts],
        out: &mut Vec<Option<BTreeSet<(u32, RankSource)>>>,
        depth: usize,
    ) {
        if out[i].is_some() {
            return;
        }
        out[i] = Some(BTreeSet::new());
        let mut values = BTreeSet::new();
        // A tree from /proc is shallow; the bound only guards against a malformed snapshot.
        if depth < 256 {
            for &c in children.get(&nodes[i].id.pid).into_iter().flatten() {
                fill(c, nodes, children, facts, out, depth + 1);
                values.extend(claims(&facts[c]));
                values.extend(out[c].iter().flatten().copied());
            }
        }
        out[i] = Some(values);
    }
    let mut out = vec![None; nodes.len()];
    for i in 0..nodes.len() {
        fill(i, nodes, children, facts, &mut out, 0);
    }
    out.into_iter().map(Option::unwrap_or_default).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use EnvFact::{NoRank, Unknown};

    fn id(pid: i32) -> ProcId {
        ProcId {
            pid,
            start_time: 1000 + pid as u64,
        }
    }

    fn rank(n: u32) -> EnvFact {
        EnvFact::Rank(RankClaim::new(n, RankSource::EnvRank))
    }

    struct Tree {
        nodes: Vec<TreeNode>,
        env: HashMap<ProcId, ProcFacts>,
    }

    impl Tree {
        fn new() -> Tree {
            Tree {
                nodes: Vec::new(),
                env: HashMap::new(),
            }
        }

        fn add(self, pid: i32, ppid: i32, fact: EnvFact) -> Tree {
            self.with(pid, ppid, fact.into())
        }

        fn with(mut self, pid: i32, ppid: i32, facts: ProcFacts) -> Tree {
            self.nodes.push(TreeNode { id: id(pid), ppid });
            self.env.insert(id(pid), facts);
            self
        }

        fn find(&self, roots: &[i32], known_workers: &HashSet<ProcId>) -> RankMap {
            find_ranks(
                &self.nodes,
                roots,
                |p| self.env.get(&p).copied().unwrap_or(EnvFact::Unknown.into()),
                known_workers,
                &HashMap::new(),
            )
        }
    }

    fn rank_pids(map: &RankMap) -> Vec<(i32, u32)> {
        map.ranks.iter().map(|r| (r.id.pid, r.rank)).collect()
    }

    fn worker_pids(map: &RankMap) -> Vec<(i32, i32)> {
        let mut w: Vec<(i32, i32)> = map
            .workers
            .iter()
            .map(|w| (w.id.pid, w.owner.pid))
            .collect();
        w.sort_unstable();
        w
    }

    /// torchrun (no RANK) -> 2 ranks -> each with forked workers that inherited RANK, one with a grandchild.
    fn torchrun() -> Tree {
        Tree::new()
            .add(10, 1, NoRank)
            .add(20, 10, rank(0))
            .add(30, 10, rank(1))
            .add(21, 20, rank(0))
            .add(22, 20, rank(0))
            .add(31, 30, rank(1))
            .add(32, 31, NoRank)
    }

    #[test]
    fn the_outermost_process_with_rank_is_the_rank_and_its_descendants_are_its_workers() {
        let map = torchrun().find(&[10], &HashSet::new());
        assert_eq!(rank_pids(&map), vec![(20, 0), (30, 1)]);
        assert_eq!(
            worker_pids(&map),
            vec![(21, 20), (22, 20), (31, 30), (32, 30)]
        );
        let grandchild = map.workers.iter().find(|w| w.id.pid == 32).unwrap();
        assert_eq!((grandchild.parent_pid, grandchild.rank), (31, 1));
        assert!(map.undecided.is_empty());
    }

    #[test]
    fn a_worker_is_a_worker_whether_or_not_its_environment_was_read() {
        // Workers started after their rank was found: one whose environment could not be read, one without RANK.
        let tree = torchrun()
            .add(23, 20, EnvFact::Unknown)
            .add(24, 20, EnvFact::NoRank);
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(rank_pids(&map), vec![(20, 0), (30, 1)]);
        assert!(worker_pids(&map).contains(&(23, 20)));
        assert!(worker_pids(&map).contains(&(24, 20)));
        assert!(map.undecided.is_empty());
    }

    #[test]
    fn a_root_that_carries_rank_is_the_rank() {
        let tree = Tree::new().add(10, 1, rank(3)).add(11, 10, rank(3));
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(rank_pids(&map), vec![(10, 3)]);
        assert_eq!(worker_pids(&map), vec![(11, 10)]);
    }

    #[test]
    fn a_launcher_with_a_stray_rank_is_not_a_rank_when_its_children_carry_other_ranks() {
        // `export RANK=0; torchrun --nproc-per-node 2 ...`: torchrun carries RANK=0, its ranks 0 and 1.
        let tree = Tree::new()
            .add(10, 1, rank(0))
            .add(20, 10, rank(0))
            .add(30, 10, rank(1))
            .add(21, 20, rank(0));
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(rank_pids(&map), vec![(20, 0), (30, 1)]);
        assert_eq!(worker_pids(&map), vec![(21, 20)]);
    }

    #[test]
    fn nothing_below_an_unread_environment_is_decided() {
        let tree = Tree::new()
            .add(10, 1, NoRank)
            .add(20, 10, Unknown)
            .add(21, 20, rank(0))
            .add(30, 10, rank(1));
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(rank_pids(&map), vec![(30, 1)]);
        assert_eq!(map.undecided, vec![id(20), id(21)]);
    }

    #[test]
    fn a_known_worker_is_never_a_rank_even_when_reparented_below_the_launcher() {
        // Rank 20 exited; its worker 21 (and 21's child 22) were reparented to the launcher, a subreaper.
        let tree = Tree::new()
            .add(10, 1, NoRank)
            .add(21, 10, rank(0))
            .add(22, 21, rank(0))
            .add(30, 10, rank(1));
        let known = HashSet::from([id(21)]);
        let map = tree.find(&[10], &known);
        assert_eq!(rank_pids(&map), vec![(30, 1)]);
        assert!(map.workers.is_empty(), "{map:?}");
    }

    #[test]
    fn a_reused_pid_is_not_taken_for_a_known_worker() {
        // pid 21 was a worker; now the same pid is a new process (another start time) that is a real rank.
        let tree = Tree::new().add(10, 1, NoRank).add(21, 10, rank(0));
        let old_worker = ProcId {
            pid: 21,
            start_time: 5,
        };
        let map = tree.find(&[10], &HashSet::from([old_worker]));
        assert_eq!(rank_pids(&map), vec![(21, 0)]);
    }

    #[test]
    fn processes_outside_the_roots_trees_are_ignored() {
        let tree = torchrun().add(99, 1, rank(5)).add(98, 99, rank(5));
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(rank_pids(&map), vec![(20, 0), (30, 1)]);
        assert!(!worker_pids(&map).iter().any(|(w, _)| *w >= 98));
    }

    #[test]
    fn a_cycle_in_a_malformed_snapshot_ends() {
        let tree = Tree::new().add(10, 11, NoRank).add(11, 10, rank(0));
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(rank_pids(&map), vec![(11, 0)]);
    }

    fn claim(n: u32, source: RankSource) -> EnvFact {
        EnvFact::Rank(RankClaim::new(n, source))
    }

    fn spawned() -> ProcFacts {
        ProcFacts {
            spawned: true,
            ..NoRank.into()
        }
    }

    fn lightning(local_rank: u32, node_rank: u32) -> ProcFacts {
        ProcFacts {
            local_only: Some(LocalOnly {
                local_rank,
                node_rank: Some(node_rank),
                world_size: Some(4),
            }),
            ..NoRank.into()
        }
    }

    fn reported(mut facts: ProcFacts, n: u32) -> ProcFacts {
        facts.client = Some(RankClaim::new(n, RankSource::Client));
        facts
    }

    fn sources(map: &RankMap) -> Vec<(i32, u32, RankSource)> {
        map.ranks
            .iter()
            .map(|r| (r.id.pid, r.rank, r.source))
            .collect()
    }

    /// `python job.py` calling `torch.multiprocessing.spawn(nprocs=4)`: four spawned children (started out of pid
    /// order), each with a forked DataLoader worker that has the same command line.
    fn mp_spawn() -> Tree {
        let mut tree = Tree::new().add(10, 1, NoRank);
        for (pid, start) in [(20, 1), (40, 3), (30, 2), (50, 4)] {
            tree.nodes.push(TreeNode {
                id: ProcId {
                    pid,
                    start_time: start,
                },
                ppid: 10,
            });
            tree.env.insert(
                ProcId {
                    pid,
                    start_time: start,
                },
                spawned(),
            );
            tree = tree.with(pid + 1, pid, spawned());
        }
        tree
    }

    fn mp_find(tree: &Tree, before: &HashMap<ProcId, u32>) -> RankMap {
        find_ranks(
            &tree.nodes,
            &[10],
            |p| tree.env.get(&p).copied().unwrap_or(Unknown.into()),
            &HashSet::new(),
            before,
        )
    }

    #[test]
    fn on_node_1_of_a_multi_node_job_the_spawned_ranks_are_made_global() {
        let tree = mp_spawn();
        let map = find_ranks_on_node(
            &tree.nodes,
            &[10],
            |p| tree.env.get(&p).copied().unwrap_or(Unknown.into()),
            &HashSet::new(),
            &HashMap::new(),
            Some(1),
        );
        assert_eq!(
            sources(&map),
            vec![
                (20, 4, RankSource::Structure),
                (30, 5, RankSource::Structure),
                (40, 6, RankSource::Structure),
                (50, 7, RankSource::Structure)
            ],
            "node 1's four spawned ranks are 4-7, as torchrun would number them"
        );
        assert_eq!(map.ranks[0].local_rank, Some(0));
        assert_eq!(
            map.ranks[0].world_size, None,
            "4 is this node's count, not the world"
        );
    }

    #[test]
    fn the_children_mp_spawn_started_are_ranks_in_start_order_and_their_workers_stay_workers() {
        let map = mp_find(&mp_spawn(), &HashMap::new());
        assert_eq!(
            sources(&map),
            vec![
                (20, 0, RankSource::Structure),
                (30, 1, RankSource::Structure),
                (40, 2, RankSource::Structure),
                (50, 3, RankSource::Structure)
            ]
        );
        assert_eq!(map.ranks[0].world_size, Some(4));
        assert_eq!(
            worker_pids(&map),
            vec![(21, 20), (31, 30), (41, 40), (51, 50)]
        );
    }

    #[test]
    fn spawned_children_wait_while_a_sibling_is_unknown_and_keep_their_numbers_when_one_exits() {
        let tree = mp_spawn().add(60, 10, Unknown);
        assert!(mp_find(&tree, &HashMap::new()).ranks.is_empty());

        let first = mp_find(&mp_spawn(), &HashMap::new());
        let before: HashMap<ProcId, u32> = first.ranks.iter().map(|r| (r.id, r.rank)).collect();
        let mut tree = mp_spawn();
        // Rank 1 (pid 30) exits: the others keep 0, 2 and 3.
        tree.nodes.retain(|n| n.id.pid != 30 && n.id.pid != 31);
        let map = mp_find(&tree, &before);
        let numbers: Vec<(i32, u32)> = map.ranks.iter().map(|r| (r.id.pid, r.rank)).collect();
        assert_eq!(numbers, vec![(20, 0), (40, 2), (50, 3)]);
    }

    #[test]
    fn the_client_corrects_a_guess_from_the_structure_and_a_forked_worker_that_reports_its_ranks_number_stays_a_worker(
    ) {
        let mut tree = mp_spawn();
        // Ranks 1 and 2 started in the other order than their numbers; rank 0's forked worker inherited its
        // initialized process group and said so.
        let id30 = tree.nodes.iter().find(|n| n.id.pid == 30).unwrap().id;
        let id40 = tree.nodes.iter().find(|n| n.id.pid == 40).unwrap().id;
        tree.env.insert(id30, reported(spawned(), 2));
        tree.env.insert(id40, reported(spawned(), 1));
        tree.env.insert(id(21), reported(spawned(), 0));
        let map = mp_find(&tree, &HashMap::new());
        assert_eq!(
            sources(&map),
            vec![
                (20, 0, RankSource::Structure),
                (40, 1, RankSource::Client),
                (30, 2, RankSource::Client),
                (50, 3, RankSource::Structure)
            ]
        );
        assert!(worker_pids(&map).contains(&(21, 20)));
    }

    #[test]
    fn lightning_the_first_process_is_rank_0_and_the_processes_its_launcher_started_are_the_others()
    {
        // `python job.py` with Trainer(devices=2): the original process (a forked DataLoader worker below it)
        // and the script started again with LOCAL_RANK=1 (with its own worker).
        let tree = Tree::new()
            .add(10, 1, NoRank)
            .add(11, 10, NoRank)
            .with(20, 10, lightning(1, 0))
            .add(21, 20, NoRank);
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(
            sources(&map),
            vec![
                (10, 0, RankSource::Structure),
                (20, 1, RankSource::Structure)
            ]
        );
        assert_eq!(worker_pids(&map), vec![(11, 10), (21, 20)]);

        // On the second node of two, with the callback's reports.
        let tree = Tree::new().with(10, 1, reported(NoRank.into(), 2)).with(
            20,
            10,
            reported(lightning(1, 1), 3),
        );
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(
            sources(&map),
            vec![(10, 2, RankSource::Client), (20, 3, RankSource::Client)]
        );
        let tree = Tree::new().add(10, 1, NoRank).with(20, 10, lightning(1, 1));
        let numbers: Vec<u32> = tree
            .find(&[10], &HashSet::new())
            .ranks
            .iter()
            .map(|r| r.rank)
            .collect();
        assert_eq!(numbers, vec![2, 3]);
    }

    #[test]
    fn srun_style_tasks_are_ranks_by_slurm_procid() {
        let tree = Tree::new()
            .add(10, 1, NoRank)
            .add(20, 10, claim(0, RankSource::EnvSlurm))
            .add(30, 10, claim(1, RankSource::EnvSlurm))
            .add(21, 20, claim(0, RankSource::EnvSlurm));
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(
            sources(&map),
            vec![(20, 0, RankSource::EnvSlurm), (30, 1, RankSource::EnvSlurm)]
        );
        assert_eq!(worker_pids(&map), vec![(21, 20)]);
    }

    #[test]
    fn an_srun_task_that_runs_a_launcher_is_no_rank_even_when_its_one_rank_has_the_same_number() {
        // `srun -N2 torchrun --nproc-per-node 1`: on node 1 the task carries SLURM_PROCID=1 and its one rank RANK=1.
        let tree = Tree::new().add(10, 1, claim(1, RankSource::EnvSlurm)).add(
            20,
            10,
            claim(1, RankSource::EnvRank),
        );
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(sources(&map), vec![(20, 1, RankSource::EnvRank)]);
    }

    #[test]
    fn the_environment_sources_are_tried_in_the_tables_order() {
        let env = |vars: &'static [(&'static str, u32)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| *v)
        };
        // mpirun under Slurm: the task's SLURM_PROCID numbers the node, OMPI_COMM_WORLD_RANK the rank.
        let c = rank_from_env(env(&[
            ("SLURM_PROCID", 0),
            ("SLURM_LOCALID", 0),
            ("OMPI_COMM_WORLD_RANK", 3),
            ("OMPI_COMM_WORLD_LOCAL_RANK", 3),
            ("OMPI_COMM_WORLD_SIZE", 4),
        ]))
        .unwrap();
        assert_eq!(
            (c.rank, c.local_rank, c.world_size, c.source),
            (3, Some(3), Some(4), RankSource::EnvOmpi)
        );
        let c = rank_from_env(env(&[("RANK", 5), ("SLURM_PROCID", 1), ("PMI_RANK", 2)])).unwrap();
        assert_eq!((c.rank, c.source), (5, RankSource::EnvRank));
        let c = rank_from_env(env(&[("PMIX_RANK", 2), ("PMI_RANK", 7)])).unwrap();
        assert_eq!((c.rank, c.source), (2, RankSource::EnvPmix));
        let c = rank_from_env(env(&[
            ("SLURM_PROCID", 2),
            ("SLURM_LOCALID", 0),
            ("SLURM_NTASKS", 4),
        ]))
        .unwrap();
        assert_eq!(
            (c.rank, c.local_rank, c.world_size, c.source),
            (2, Some(0), Some(4), RankSource::EnvSlurm)
        );
        assert_eq!(rank_from_env(env(&[("LOCAL_RANK", 1)])), None);
        assert_eq!(
            local_rank_only(env(&[
                ("LOCAL_RANK", 1),
                ("NODE_RANK", 0),
                ("WORLD_SIZE", 2)
            ])),
            Some(LocalOnly {
                local_rank: 1,
                node_rank: Some(0),
                world_size: Some(2)
            })
        );
        assert_eq!(
            local_rank_only(env(&[("LOCAL_RANK", 1), ("RANK", 1)])),
            None
        );
    }

    #[test]
    fn a_single_process_is_no_rank() {
        let tree = Tree::new().add(10, 1, NoRank).add(11, 10, NoRank);
        let map = tree.find(&[10], &HashSet::new());
        assert!(map.ranks.is_empty());
    }
}
