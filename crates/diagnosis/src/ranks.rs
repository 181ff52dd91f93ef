//! Who is a rank in a launcher's process tree: the outermost process that carries `RANK`. Its descendants
//! (DataLoader, compile and `multiprocessing` workers, which inherit `RANK`) belong to it and are never ranks.
//!
//! Pure: a snapshot of the tree and what is known of each process's environment in, the rank map out.

use std::collections::{BTreeSet, HashMap, HashSet};

use hangwatch_model::ProcId;

/// One process of the tree below the launcher, as read from /proc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeNode {
    pub id: ProcId,
    pub ppid: i32,
}

/// What a process's environment says about `RANK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvFact {
    Rank(u32),
    /// No `RANK`, or not a process that can be a rank (not Python).
    NoRank,
    /// Not read yet, or the read failed: nothing below it is decided until it is known.
    Unknown,
}

/// A process found to be a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankAssignment {
    pub id: ProcId,
    pub rank: u32,
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
    /// Parents before children.
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
    /// No rank above: a process here is a rank if it carries `RANK`.
    Free,
    Owned {
        owner: ProcId,
        rank: u32,
    },
    /// Above is a process whose environment is unknown.
    Undecided,
    /// Above is a known worker whose rank is gone (a reparented orphan): never a rank, no owner either.
    Orphaned,
}

/// Finds the ranks below `roots` (the processes hangwatch started; they may be ranks themselves).
///
/// A process is a rank when it carries `RANK` and no process above it is a rank, with one exception: a process
/// below which other processes carry a *different* `RANK` is a launcher that inherited a stray `RANK` (torchrun
/// started from a script that exported one), not a rank. A process in `known_workers` (seen as a worker
/// before, identified by pid and start time) is never a rank, even when its rank is gone and it was reparented.
pub fn find_ranks(
    nodes: &[TreeNode],
    roots: &[i32],
    env: impl Fn(ProcId) -> EnvFact,
    known_workers: &HashSet<ProcId>,
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
    let facts: Vec<EnvFact> = nodes.iter().map(|n| env(n.id)).collect();
    let below_values = rank_values_below(nodes, &children, &facts);

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
        let here = match above {
            Below::Owned { owner, rank } => {
                map.workers.push(WorkerAssignment {
                    id: node.id,
                    parent_pid: node.ppid,
                    owner,
                    rank,
                });
                above
            }
            Below::Orphaned => Below::Orphaned,
            Below::Undecided => {
                map.undecided.push(node.id);
                Below::Undecided
            }
            Below::Free if known_workers.contains(&node.id) => Below::Orphaned,
            Below::Free => match facts[i] {
                EnvFact::Unknown => {
                    map.undecided.push(node.id);
                    Below::Undecided
                }
                EnvFact::NoRank => Below::Free,
                EnvFact::Rank(rank) if below_values[i].iter().any(|&v| v != rank) => Below::Free,
                EnvFact::Rank(rank) => {
                    map.ranks.push(RankAssignment { id: node.id, rank });
                    Below::Owned {
                        owner: node.id,
                        rank,
                    }
                }
            },
        };
        for &child in children.get(&node.id.pid).into_iter().flatten().rev() {
            stack.push((child, here));
        }
    }
    map
}

/// For each node, the `RANK` values carried by the processes below it.
fn rank_values_below(
    nodes: &[TreeNode],
    children: &HashMap<i32, Vec<usize>>,
    facts: &[EnvFact],
) -> Vec<BTreeSet<u32>> {
    fn fill(
        i: usize,
        nodes: &[TreeNode],
        children: &HashMap<i32, Vec<usize>>,
        facts: &[EnvFact],
        out: &mut Vec<Option<BTreeSet<u32>>>,
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
                if let EnvFact::Rank(r) = facts[c] {
                    values.insert(r);
                }
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

    fn id(pid: i32) -> ProcId {
        ProcId {
            pid,
            start_time: 1000 + pid as u64,
        }
    }

    struct Tree {
        nodes: Vec<TreeNode>,
        env: HashMap<ProcId, EnvFact>,
    }

    impl Tree {
        fn new() -> Tree {
            Tree {
                nodes: Vec::new(),
                env: HashMap::new(),
            }
        }

        fn add(mut self, pid: i32, ppid: i32, fact: EnvFact) -> Tree {
            self.nodes.push(TreeNode { id: id(pid), ppid });
            self.env.insert(id(pid), fact);
            self
        }

        fn find(&self, roots: &[i32], known_workers: &HashSet<ProcId>) -> RankMap {
            find_ranks(
                &self.nodes,
                roots,
                |p| self.env.get(&p).copied().unwrap_or(EnvFact::Unknown),
                known_workers,
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
        use EnvFact::*;
        Tree::new()
            .add(10, 1, NoRank)
            .add(20, 10, Rank(0))
            .add(30, 10, Rank(1))
            .add(21, 20, Rank(0))
            .add(22, 20, Rank(0))
            .add(31, 30, Rank(1))
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
        use EnvFact::*;
        let tree = Tree::new().add(10, 1, Rank(3)).add(11, 10, Rank(3));
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(rank_pids(&map), vec![(10, 3)]);
        assert_eq!(worker_pids(&map), vec![(11, 10)]);
    }

    #[test]
    fn a_launcher_with_a_stray_rank_is_not_a_rank_when_its_children_carry_other_ranks() {
        use EnvFact::*;
        // `export RANK=0; torchrun --nproc-per-node 2 ...`: torchrun carries RANK=0, its ranks 0 and 1.
        let tree = Tree::new()
            .add(10, 1, Rank(0))
            .add(20, 10, Rank(0))
            .add(30, 10, Rank(1))
            .add(21, 20, Rank(0));
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(rank_pids(&map), vec![(20, 0), (30, 1)]);
        assert_eq!(worker_pids(&map), vec![(21, 20)]);
    }

    #[test]
    fn nothing_below_an_unread_environment_is_decided() {
        use EnvFact::*;
        let tree = Tree::new()
            .add(10, 1, NoRank)
            .add(20, 10, Unknown)
            .add(21, 20, Rank(0))
            .add(30, 10, Rank(1));
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(rank_pids(&map), vec![(30, 1)]);
        assert_eq!(map.undecided, vec![id(20), id(21)]);
    }

    #[test]
    fn a_known_worker_is_never_a_rank_even_when_reparented_below_the_launcher() {
        use EnvFact::*;
        // Rank 20 exited; its worker 21 (and 21's child 22) were reparented to the launcher, a subreaper.
        let tree = Tree::new()
            .add(10, 1, NoRank)
            .add(21, 10, Rank(0))
            .add(22, 21, Rank(0))
            .add(30, 10, Rank(1));
        let known = HashSet::from([id(21)]);
        let map = tree.find(&[10], &known);
        assert_eq!(rank_pids(&map), vec![(30, 1)]);
        assert!(map.workers.is_empty(), "{map:?}");
    }

    #[test]
    fn a_reused_pid_is_not_taken_for_a_known_worker() {
        use EnvFact::*;
        // pid 21 was a worker; now the same pid is a new process (another start time) that is a real rank.
        let tree = Tree::new().add(10, 1, NoRank).add(21, 10, Rank(0));
        let old_worker = ProcId {
            pid: 21,
            start_time: 5,
        };
        let map = tree.find(&[10], &HashSet::from([old_worker]));
        assert_eq!(rank_pids(&map), vec![(21, 0)]);
    }

    #[test]
    fn processes_outside_the_roots_trees_are_ignored() {
        use EnvFact::*;
        let tree = torchrun().add(99, 1, Rank(5)).add(98, 99, Rank(5));
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(rank_pids(&map), vec![(20, 0), (30, 1)]);
        assert!(!worker_pids(&map).iter().any(|(w, _)| *w >= 98));
    }

    #[test]
    fn a_cycle_in_a_malformed_snapshot_ends() {
        use EnvFact::*;
        let tree = Tree::new().add(10, 11, NoRank).add(11, 10, Rank(0));
        let map = tree.find(&[10], &HashSet::new());
        assert_eq!(rank_pids(&map), vec![(11, 0)]);
    }
}
