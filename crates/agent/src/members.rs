//! Who belongs to the job: the processes the supervision loop registered (ranks, a launcher) and their
//! descendants. The heartbeat socket asks it about each sender (the pid the kernel vouches for with
//! `SCM_CREDENTIALS`), so that only the job's own processes speak for it.
//!
//! A process is known by (pid, start time), so a reused pid is never taken for a member. Ancestry is walked
//! through `/proc/PID/stat` only (safe to read on a process stuck in the kernel: no mmap lock), at most
//! [`MAX_DEPTH`] parents up.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hangwatch_proc::ProcFs;

/// How many parents up a sender is looked for (a rank's DataLoader worker is 1, a compile worker's child 2;
/// 32 is far beyond any real job).
pub const MAX_DEPTH: usize = 32;

/// The most processes registered at once. The loop registers ranks and launchers and forgets them when they
/// exit; beyond this a registration is refused (and logged): its descendants are then members only through an
/// ancestor registered before.
pub const MAX_REGISTERED: usize = 65_536;

/// The most senders whose answer is remembered. When full the cache is emptied (every answer is recomputed on the
/// next datagram), so that a flood of short-lived senders costs walks, never memory.
pub const MAX_CACHED: usize = 4096;

/// A process as the ancestry walk sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcLink {
    pub ppid: i32,
    /// Field 22 of `/proc/PID/stat`: with the pid, the process's identity.
    pub start_time: u64,
}

/// Reading one process's parent and start time: `/proc` in the agent, a fake tree in tests.
pub trait ProcessTable: Send + Sync {
    /// `None` when the process is gone.
    fn link(&self, pid: i32) -> Option<ProcLink>;
}

/// The live process table, through `/proc/PID/stat`.
#[derive(Debug)]
pub struct LiveTable(ProcFs);

impl Default for LiveTable {
    fn default() -> Self {
        Self(ProcFs::new("/proc"))
    }
}

impl ProcessTable for LiveTable {
    fn link(&self, pid: i32) -> Option<ProcLink> {
        let stat = self.0.stat(pid).ok()?;
        Some(ProcLink {
            ppid: stat.ppid,
            start_time: stat.starttime,
        })
    }
}

/// What the job knows about a sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// The registered process the sender is or descends from (the nearest one).
    pub registered_pid: i32,
    /// That process's rank, when known (a launcher's is not).
    pub rank: Option<u32>,
    /// 0: the sender is the registered process; 1: its child; ...
    pub depth: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Registered {
    start_time: u64,
    rank: Option<u32>,
}

#[derive(Debug, Default)]
struct Inner {
    registered: HashMap<i32, Registered>,
    /// (pid, start time) -> answer, valid for `generation`.
    cache: HashMap<(i32, u64), Option<Member>>,
}

/// The job's members. Shared (`Arc`) between the supervision loop, which registers and forgets, and the
/// heartbeat receiver, which asks [`JobMembers::who`].
pub struct JobMembers {
    inner: Mutex<Inner>,
    /// Bumped by every registration change: an answer computed across a change is not cached.
    generation: AtomicU64,
    table: Box<dyn ProcessTable>,
}

impl std::fmt::Debug for JobMembers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("JobMembers")
            .field("registered", &inner.registered.len())
            .field("cached", &inner.cache.len())
            .finish()
    }
}

impl Default for JobMembers {
    fn default() -> Self {
        Self::with_table(Box::new(LiveTable::default()))
    }
}

impl JobMembers {
    /// Members of the live process table.
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_table(table: Box<dyn ProcessTable>) -> Self {
        Self {
            inner: Mutex::default(),
            generation: AtomicU64::new(0),
            table,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changed(&self, inner: &mut Inner) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        inner.cache.clear();
    }

    /// A process of the job (a rank with its rank, a launcher with `None`). Returns false when refused because
    /// [`MAX_REGISTERED`] processes are registered.
    pub fn register(&self, pid: i32, start_time: u64, rank: Option<u32>) -> bool {
        let mut inner = self.lock();
        if inner.registered.len() >= MAX_REGISTERED && !inner.registered.contains_key(&pid) {
            tracing::warn!(
                pid,
                ?rank,
                limit = MAX_REGISTERED,
                "too many job processes registered; this one is not"
            );
            return false;
        }
        inner
            .registered
            .insert(pid, Registered { start_time, rank });
        self.changed(&mut inner);
        true
    }

    /// Registers a live process, reading its start time. False when it is already gone (or refused).
    pub fn register_live(&self, pid: i32, rank: Option<u32>) -> bool {
        match self.table.link(pid) {
            Some(link) => self.register(pid, link.start_time, rank),
            None => false,
        }
    }

    /// A registered process exited.
    pub fn forget(&self, pid: i32) {
        let mut inner = self.lock();
        if inner.registered.remove(&pid).is_some() {
            self.changed(&mut inner);
        }
    }

    /// How many processes are registered.
    pub fn registered(&self) -> usize {
        self.lock().registered.len()
    }

    /// Whether `pid` (a live process) is a registered process of the job or descends from one, and which.
    pub fn who(&self, pid: i32) -> Option<Member> {
        let link = self.table.link(pid)?;
        let key = (pid, link.start_time);
        let generation = self.generation.load(Ordering::SeqCst);
        if let Some(answer) = self.lock().cache.get(&key) {
            return *answer;
        }
        let answer = find_member(
            pid,
            link,
            self.table.as_ref(),
            |pid, start_time| {
                self.lock()
                    .registered
                    .get(&pid)
                    .filter(|r| r.start_time == start_time)
                    .map(|r| r.rank)
            },
            MAX_DEPTH,
        );
        let mut inner = self.lock();
        if self.generation.load(Ordering::SeqCst) == generation {
            if inner.cache.len() >= MAX_CACHED {
                inner.cache.clear();
            }
            inner.cache.insert(key, answer);
        }
        answer
    }
}

/// Walks from `pid` (whose link is `link`) up the parent chain, at most `max_depth` parents, and returns the
/// nearest process for which `registered(pid, start_time)` answers (with its rank). A parent that started after
/// its child is not its parent any more (the real one exited and its pid was reused): the walk stops there.
pub fn find_member(
    pid: i32,
    link: ProcLink,
    table: &dyn ProcessTable,
    registered: impl Fn(i32, u64) -> Option<Option<u32>>,
    max_depth: usize,
) -> Option<Member> {
    let (mut pid, mut link) = (pid, link);
    for depth in 0..=max_depth {
        if let Some(rank) = registered(pid, link.start_time) {
            return Some(Member {
                registered_pid: pid,
                rank,
                depth,
            });
        }
        if link.ppid <= 1 || depth == max_depth {
            return None;
        }
        let parent = table.link(link.ppid)?;
        if parent.start_time > link.start_time {
            return None;
        }
        (pid, link) = (link.ppid, parent);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A fake process table: pid -> (ppid, start time); counts reads.
    #[derive(Default)]
    struct FakeTree {
        procs: Mutex<HashMap<i32, ProcLink>>,
        reads: AtomicU64,
    }

    impl FakeTree {
        fn with(procs: &[(i32, i32, u64)]) -> Arc<Self> {
            let tree = Self::default();
            for &(pid, ppid, start_time) in procs {
                tree.set(pid, ppid, start_time);
            }
            Arc::new(tree)
        }

        fn set(&self, pid: i32, ppid: i32, start_time: u64) {
            self.procs
                .lock()
                .unwrap()
                .insert(pid, ProcLink { ppid, start_time });
        }

        fn reads(&self) -> u64 {
            self.reads.load(Ordering::SeqCst)
        }
    }

    impl ProcessTable for Arc<FakeTree> {
        fn link(&self, pid: i32) -> Option<ProcLink> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.procs.lock().unwrap().get(&pid).copied()
        }
    }

    /// init(1) -> shell(10) -> hangwatch(20) -> rank 0 (30) -> worker (31) -> its child (32); rank 1 (40);
    /// an outsider (50) under the shell.
    fn job_tree() -> Arc<FakeTree> {
        FakeTree::with(&[
            (10, 1, 100),
            (20, 10, 200),
            (30, 20, 300),
            (31, 30, 310),
            (32, 31, 320),
            (40, 20, 400),
            (50, 10, 500),
        ])
    }

    fn members(tree: &Arc<FakeTree>) -> JobMembers {
        let m = JobMembers::with_table(Box::new(Arc::clone(tree)));
        m.register(30, 300, Some(0));
        m.register(40, 400, Some(1));
        m
    }

    #[test]
    fn ranks_and_their_descendants_are_members_with_the_ranks_rank() {
        let tree = job_tree();
        let m = members(&tree);
        let rank0 = |depth| {
            Some(Member {
                registered_pid: 30,
                rank: Some(0),
                depth,
            })
        };
        assert_eq!(m.who(30), rank0(0));
        assert_eq!(m.who(31), rank0(1));
        assert_eq!(m.who(32), rank0(2));
        assert_eq!(m.who(40).map(|w| w.rank), Some(Some(1)));
    }

    #[test]
    fn outsiders_ancestors_and_gone_processes_are_not_members() {
        let tree = job_tree();
        let m = members(&tree);
        assert_eq!(m.who(50), None, "a process beside the job");
        assert_eq!(m.who(20), None, "hangwatch itself is not a rank");
        assert_eq!(m.who(10), None);
        assert_eq!(m.who(999), None, "gone");
    }

    #[test]
    fn a_reused_pid_is_not_a_member() {
        let tree = job_tree();
        let m = members(&tree);
        assert!(m.who(31).is_some());
        // Rank 0 exits; its pid is reused by an unrelated process started later.
        tree.set(30, 10, 900);
        assert_eq!(m.who(30), None, "same pid, other start time");
        // The orphaned worker still names 30 as parent in this fake, but 30 started after it: not its parent.
        tree.set(31, 30, 310);
        let m2 = JobMembers::with_table(Box::new(Arc::clone(&tree)));
        m2.register(30, 300, Some(0));
        assert_eq!(m2.who(31), None);
    }

    #[test]
    fn the_walk_is_bounded() {
        // A chain 1000 -> 1001 -> ... 40 deep below the registered 1000.
        let mut procs = vec![(1000, 1, 1)];
        for i in 1..=40 {
            procs.push((1000 + i, 1000 + i - 1, 1 + i as u64));
        }
        let tree = FakeTree::with(&procs);
        let m = JobMembers::with_table(Box::new(Arc::clone(&tree)));
        m.register(1000, 1, Some(7));
        assert_eq!(
            m.who(1000 + MAX_DEPTH as i32).map(|w| w.depth),
            Some(MAX_DEPTH)
        );
        let before = tree.reads();
        assert_eq!(m.who(1000 + MAX_DEPTH as i32 + 1), None, "too deep");
        assert!(tree.reads() - before <= MAX_DEPTH as u64 + 1);
    }

    #[test]
    fn a_launcher_without_a_rank_vouches_for_its_descendants_until_their_rank_is_known() {
        let tree = job_tree();
        let m = JobMembers::with_table(Box::new(Arc::clone(&tree)));
        m.register(20, 200, None);
        assert_eq!(
            m.who(31).map(|w| (w.registered_pid, w.rank)),
            Some((20, None))
        );
        m.register(30, 300, Some(0));
        assert_eq!(
            m.who(31).map(|w| (w.registered_pid, w.rank)),
            Some((30, Some(0))),
            "a registration is seen at once, not hidden by the cache"
        );
        m.forget(30);
        assert_eq!(m.who(31).map(|w| w.registered_pid), Some(20));
    }

    #[test]
    fn answers_are_cached_per_pid_and_start_time() {
        let tree = job_tree();
        let m = members(&tree);
        assert!(m.who(32).is_some());
        let before = tree.reads();
        for _ in 0..100 {
            assert!(m.who(32).is_some());
            assert!(m.who(50).is_none());
        }
        // One read per question (the sender's own start time), no walks: 200 reads; the first outsider
        // question walks once.
        assert!(
            tree.reads() - before <= 200 + 3,
            "{}",
            tree.reads() - before
        );
    }

    #[test]
    fn the_cache_is_bounded() {
        let mut procs = vec![(30, 1, 1)];
        for i in 0..(MAX_CACHED as i32 + 100) {
            procs.push((10_000 + i, 1, 2));
        }
        let tree = FakeTree::with(&procs);
        let m = JobMembers::with_table(Box::new(Arc::clone(&tree)));
        m.register(30, 1, Some(0));
        for i in 0..(MAX_CACHED as i32 + 100) {
            assert_eq!(m.who(10_000 + i), None);
        }
        assert!(m.lock().cache.len() <= MAX_CACHED);
        assert_eq!(m.who(30).map(|w| w.rank), Some(Some(0)));
    }

    #[test]
    fn registrations_are_bounded() {
        let tree = FakeTree::with(&[]);
        let m = JobMembers::with_table(Box::new(Arc::clone(&tree)));
        for pid in 0..MAX_REGISTERED as i32 {
            assert!(m.register(pid + 2, 1, None));
        }
        assert!(!m.register(1_000_000, 1, None), "refused when full");
        assert!(m.register(2, 5, Some(1)), "a registered pid may be updated");
        m.forget(3);
        assert!(m.register(1_000_000, 1, None), "room after a forget");
        assert_eq!(m.registered(), MAX_REGISTERED);
    }
}
