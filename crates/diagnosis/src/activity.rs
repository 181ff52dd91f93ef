//! The activity rule: whether a job that reports no progress still works. A roll call that finds ranks computing
//! is evidence that the job is in a silent phase (an evaluation without logging, rank 0 building an index while its
//! peers wait in a barrier), not hung; the policies hold the hard tier back for it (see [`ActivityHold`]) until the
//! activity stops or `--max-stall` passes. docs/false-alarms.md says the same for users.
//!
//! The rule, in one place:
//! - a rank **computes** when its CPU time advanced over most of the roll call's sample window or its main thread
//!   was on a CPU (`Condition::Running`), and where it is (its meaningful Python frame) is not inside
//!   `torch.distributed`: NCCL and other backends spin while they wait, and a spinning wait is a wait;
//! - a rank **moves data** when it read or wrote at least [`MOVING_BYTES_PER_S`] (`rchar + wchar`: files, pipes,
//!   sockets) over the sample window while it waits outside `torch.distributed`: rank 0 downloading a dataset
//!   shard, a tokenizer or a model from a slow mirror barely uses a CPU, yet it works as much as one that computes;
//! - a DataLoader (or other) worker, or a child (`aws s3 cp`, `git lfs`, `cp` from a network filesystem), that
//!   computes or moves data counts for its rank: the rank waits for its data. A worker caught in a filesystem wait
//!   on a mount that answered its probe (a slow filesystem, not a stuck one) moves data too when its bytes moved:
//!   a copy from a loaded mount spends most of its time in those waits. The work is named by where its rank waits
//!   for it (the rank's own code), since a worker has no Python stack;
//! - there is **activity** when at least one rank computes and nothing seen is conclusive: no rank blocked in the
//!   kernel, stopped or dead, and no node missing (those verdicts name a culprit; work elsewhere does not excuse it).

use std::collections::BTreeMap;
use std::time::Duration;

use hangwatch_model::Activity;

use crate::position::Condition;

/// One process as the rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen<'a> {
    /// The rank's number (a worker's rank for a worker), when known.
    pub rank: Option<u32>,
    /// The rank process's pid (a worker's rank's pid for a worker).
    pub rank_pid: i32,
    pub worker: bool,
    pub condition: Condition,
    /// Its place for grouping (the innermost frame outside the standard library).
    pub where_: &'a str,
    /// The innermost frame of the job's own code, which names the work for people; `where_` when unknown.
    pub own_code: Option<&'a str>,
    /// How fast it read or wrote over the sample window (bytes per second), when known.
    pub bytes_per_s: Option<u64>,
    /// It waits on a filesystem that answered its probe: slow, not stuck.
    pub slow_filesystem: bool,
}

/// The least a waiting rank must read or write per second to count as moving data. A rank that waits in a
/// collective or a barrier moves nothing through its own system calls; a download from a slow mirror moves tens of
/// KB/s. A trickle under this (a heartbeat, a log line now and then) is not work.
pub const MOVING_BYTES_PER_S: u64 = 4 * 1024;

/// The rate at which `seen` moves data, when it does (see the module documentation).
fn moves_data(seen: &Seen) -> Option<u64> {
    let waits = match seen.condition {
        Condition::Waiting => true,
        // A rank in the kernel is a finding of its own ([`activity`] says none then); a worker on a slow mount
        // whose bytes move is a copy at the pace of its filesystem.
        Condition::BlockedInKernel => seen.worker && seen.slow_filesystem,
        _ => false,
    };
    seen.bytes_per_s
        .filter(|rate| *rate >= MOVING_BYTES_PER_S && waits && !in_distributed(seen.where_))
}

/// Whether `where_` is a place inside torch.distributed (a collective, a barrier, a store wait).
pub fn in_distributed(where_: &str) -> bool {
    where_.contains("torch/distributed/") || where_.contains("torch\\distributed\\")
}

fn computes(seen: &Seen) -> bool {
    seen.condition == Condition::Running && !in_distributed(seen.where_)
}

/// The activity among `seen` (ranks and their workers), or `None` when nothing computes or something conclusive
/// was seen (a rank blocked in the kernel, stopped or dead; `nodes_missing`).
pub fn activity(seen: &[Seen], nodes_missing: bool) -> Option<Activity> {
    if nodes_missing {
        return None;
    }
    let ranks: Vec<&Seen> = seen.iter().filter(|s| !s.worker).collect();
    if ranks.iter().any(|s| {
        matches!(
            s.condition,
            Condition::BlockedInKernel | Condition::Stopped | Condition::Exited
        )
    }) {
        return None;
    }
    // Rank pids that compute or move data themselves or through a worker, with where the work is.
    let mut working: BTreeMap<i32, (Option<u32>, &str)> = BTreeMap::new();
    let (mut computing, mut moved) = (false, 0u64);
    for s in seen.iter() {
        let rate = moves_data(s);
        if !computes(s) && rate.is_none() {
            continue;
        }
        computing |= computes(s);
        moved = moved.saturating_add(rate.unwrap_or(0));
        // A worker has no Python stack: its work is named where its rank waits for it (the rank's own code).
        let place = match ranks.iter().find(|r| s.worker && r.rank_pid == s.rank_pid) {
            Some(rank) => rank.own_code.unwrap_or(rank.where_),
            None => s.own_code.unwrap_or(s.where_),
        };
        working.entry(s.rank_pid).or_insert((s.rank, place));
    }
    if working.is_empty() {
        return None;
    }
    // Work that only workers do is said so: the rank itself waits.
    let through_workers = working.keys().all(|pid| {
        !seen
            .iter()
            .any(|s| !s.worker && s.rank_pid == *pid && (computes(s) || moves_data(s).is_some()))
    });
    let most = |places: &mut dyn Iterator<Item = &str>| -> Option<String> {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for p in places {
            *counts.entry(p).or_default() += 1;
        }
        counts
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(p, _)| p.to_string())
    };
    let where_ = most(&mut working.values().map(|(_, w)| *w)).unwrap_or_default();
    let waiting: Vec<&&Seen> = ranks
        .iter()
        .filter(|s| !working.contains_key(&s.rank_pid))
        .collect();
    // Waits are named by the library's place ("all_reduce (torch/distributed/...)"): that is what they wait in.
    let waiting_where = most(&mut waiting.iter().map(|s| s.where_));
    let mut numbers: Vec<u32> = working.values().filter_map(|(r, _)| *r).collect();
    numbers.sort_unstable();
    let n = working.len();
    let of_ranks = ranks.len();
    // Computation is said as before; ranks that only move data say so, and how fast.
    let (one, many) = if computing {
        ("computes", "compute")
    } else {
        ("moves data", "move data")
    };
    let who = if n == of_ranks && n > 1 {
        format!("all {n} ranks {many}")
    } else if n == 1 {
        match numbers.first() {
            Some(r) => format!("rank {r} {one}"),
            None => format!("1 rank {one}"),
        }
    } else {
        format!("{n} of {of_ranks} ranks {many}")
    };
    let rate = if computing {
        String::new()
    } else {
        format!(" ({} read or written)", rate_words(moved))
    };
    let through = match (through_workers, n) {
        (false, _) => "",
        (true, 1) => " through a child process",
        (true, _) => " through child processes",
    };
    let mut summary = format!("{who}{rate}{through} in {where_}");
    if let (false, Some(place)) = (waiting.is_empty(), &waiting_where) {
        let noun = if waiting.len() == 1 {
            "rank waits"
        } else {
            "ranks wait"
        };
        summary.push_str(&format!(" while {} {noun} in {place}", waiting.len()));
    }
    Some(Activity {
        ranks: numbers,
        pids: working.keys().copied().collect(),
        where_,
        of_ranks,
        waiting: waiting.len(),
        waiting_where,
        summary,
    })
}

/// `31 KB/s`, `2.5 MB/s`: a rate for people (decimal units, as download tools print them).
fn rate_words(bytes_per_s: u64) -> String {
    match bytes_per_s {
        r if r >= 1_000_000 => format!("{:.1} MB/s", r as f64 / 1e6),
        r if r >= 1_000 => format!("{} KB/s", r / 1_000),
        r => format!("{r} B/s"),
    }
}

/// How long activity may hold the hard tier back, and how often it is looked at again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivityRule {
    /// While holding, a roll call this often: the hold lasts only while the work goes on.
    pub recheck: Duration,
    /// The latest a job without progress is ended, activity or not (`--max-stall`): a busy loop that never ends
    /// is still caught. `None`: activity never holds (the user fixed the threshold with `--stall-after`, their
    /// word that no legitimate silence lasts longer).
    pub max_stall: Option<Duration>,
}

impl ActivityRule {
    /// Rechecks every 30 s until `max_stall`.
    pub fn until(max_stall: Duration) -> Self {
        Self {
            recheck: Duration::from_secs(30),
            max_stall: Some(max_stall),
        }
    }

    /// Activity never holds.
    pub fn never() -> Self {
        Self {
            recheck: Duration::from_secs(30),
            max_stall: None,
        }
    }
}

/// What a policy does with a roll call's finding at the hard tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldDecision {
    /// Act as the tier says.
    Act,
    /// Do not act: the job works. `announce`: first time in this stall, say so (once).
    Hold { announce: bool },
}

/// What a finished roll call was taken for, as the acting rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Past the hard threshold.
    Hard,
    /// A hold's recheck.
    Recheck,
    /// The look that confirms a recheck's "no work" ([`HoldCheck::Confirm`]).
    Confirm,
    /// `--max-stall` passed during a hold.
    MaxStall,
    /// Below the hard tier (the soft threshold, the fast path): acted on when conclusive, or when the hard tier
    /// came while it ran (`hard_pending`).
    BelowHard {
        conclusive: bool,
        hard_pending: bool,
    },
    /// A rank failed while its peers wait: acted on whatever computes.
    RankFailed,
    /// Never acted on here (a signal's look, a coordinator's order, a silent node).
    Never,
}

/// What to tell people after a look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldNotice {
    /// No progress, but the ranks compute: not ending the job (once per stall).
    Computing,
    /// The ranks that computed stopped; the hold is over.
    WorkStopped,
    /// `--max-stall` passed while the ranks computed.
    MaxStallPassed,
}

/// The outcome of a look: act or not, and what to say first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AfterLook {
    pub act: bool,
    pub say: Option<HoldNotice>,
}

/// What a holding policy does at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldCheck {
    /// Look again: act if the work stopped (after confirming it).
    Recheck,
    /// The last recheck saw no work: look once more before acting (this look's evidence is the one kept).
    Confirm,
    /// `--max-stall` passed: look one last time for the evidence, then act whatever it shows.
    MaxStall,
}

/// The hold of one stall episode, shared by the agent's and the coordinator's policies: pure, `now` and the
/// time without progress passed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityHold {
    rule: ActivityRule,
    /// Holding since, and the next look.
    next_check: Option<Duration>,
    /// The activity was announced in this stall.
    announced: bool,
    max_stall_taken: bool,
    /// During a hold, the last look saw no work: one more look after `CONFIRM` before acting.
    stopped_once: bool,
}

/// How long after a hold's look that saw no work the stop is confirmed: work that ends leads into progress within
/// moments (rank 0 done preparing enters the all_reduce its peers wait in, then they all step), and a look that
/// falls in between must not end the job.
const CONFIRM: Duration = Duration::from_secs(5);

impl ActivityHold {
    pub fn new(rule: ActivityRule) -> Self {
        Self {
            rule,
            next_check: None,
            announced: false,
            max_stall_taken: false,
            stopped_once: false,
        }
    }

    pub fn rule(&self) -> ActivityRule {
        self.rule
    }

    /// Whether the activity was announced in this stall.
    pub fn announced(&self) -> bool {
        self.announced
    }

    /// Whether the hard tier is held back now.
    pub fn holding(&self) -> bool {
        self.next_check.is_some()
    }

    /// Progress came back: a new stall starts from nothing.
    pub fn reset(&mut self) {
        self.next_check = None;
        self.announced = false;
        self.max_stall_taken = false;
        self.stopped_once = false;
    }

    /// A roll call finished that would act at the hard tier (or any roll call, for the announcement): `active` is
    /// whether it saw activity. Holds when the rule allows it and the stall is short of `max_stall`.
    pub fn decide(&mut self, active: bool, stalled_for: Duration, now: Duration) -> HoldDecision {
        let allowed = self
            .rule
            .max_stall
            .is_some_and(|max| stalled_for < max && !self.max_stall_taken);
        if !active && allowed && self.holding() && !self.stopped_once {
            self.stopped_once = true;
            self.next_check = Some(now + CONFIRM);
            return HoldDecision::Hold { announce: false };
        }
        if !(active && allowed) {
            self.next_check = None;
            return HoldDecision::Act;
        }
        self.stopped_once = false;
        self.next_check = Some(now + self.rule.recheck);
        HoldDecision::Hold {
            announce: self.announce(),
        }
    }

    /// The one ladder both policies climb after a roll call: conclusive evidence and a failed rank are acted on
    /// whatever computes elsewhere; the hard tier (and its rechecks) only when nothing computes, or at
    /// `--max-stall`.
    pub fn after_look(
        &mut self,
        look: Look,
        active: bool,
        stalled_for: Duration,
        now: Duration,
    ) -> AfterLook {
        let by_tier = match look {
            Look::RankFailed
            | Look::BelowHard {
                conclusive: true, ..
            } => {
                return AfterLook {
                    act: true,
                    say: None,
                }
            }
            Look::Never => false,
            Look::BelowHard { hard_pending, .. } => hard_pending,
            Look::Hard | Look::Recheck | Look::Confirm | Look::MaxStall => true,
        };
        if !by_tier {
            let say = (active && self.rule.max_stall.is_some() && self.seen())
                .then_some(HoldNotice::Computing);
            return AfterLook { act: false, say };
        }
        match self.decide(active, stalled_for, now) {
            HoldDecision::Hold { announce } => AfterLook {
                act: false,
                say: announce.then_some(HoldNotice::Computing),
            },
            HoldDecision::Act => AfterLook {
                act: true,
                say: match look {
                    Look::Recheck | Look::Confirm => Some(HoldNotice::WorkStopped),
                    Look::MaxStall => Some(HoldNotice::MaxStallPassed),
                    _ => None,
                },
            },
        }
    }

    /// A roll call below the hard tier saw activity: nothing to hold yet, but it is said once.
    pub fn seen(&mut self) -> bool {
        self.announce()
    }

    fn announce(&mut self) -> bool {
        !std::mem::replace(&mut self.announced, true)
    }

    /// While holding: whether to look again now (no roll call may be in flight: the caller checks).
    pub fn tick(&mut self, stalled_for: Duration, now: Duration) -> Option<HoldCheck> {
        let next = self.next_check?;
        if self
            .rule
            .max_stall
            .is_some_and(|max| stalled_for >= max && !self.max_stall_taken)
        {
            self.max_stall_taken = true;
            return Some(HoldCheck::MaxStall);
        }
        if now >= next {
            // The next look is planned when its result comes back (`decide`).
            self.next_check = Some(Duration::MAX);
            return Some(if self.stopped_once {
                HoldCheck::Confirm
            } else {
                HoldCheck::Recheck
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: u32, condition: Condition, where_: &'static str) -> Seen<'static> {
        Seen {
            rank: Some(rank),
            rank_pid: 100 + rank as i32,
            worker: false,
            condition,
            where_,
            own_code: None,
            bytes_per_s: None,
            slow_filesystem: false,
        }
    }

    const EVAL: &str = "evaluate (eval.py)";
    const ALL_REDUCE: &str = "all_reduce (torch/distributed/distributed_c10d.py)";

    #[test]
    fn every_rank_computing_is_activity() {
        let seen: Vec<Seen> = (0..4).map(|r| rank(r, Condition::Running, EVAL)).collect();
        let a = activity(&seen, false).expect("activity");
        assert_eq!(a.ranks, vec![0, 1, 2, 3]);
        assert_eq!(a.summary, "all 4 ranks compute in evaluate (eval.py)");
        assert_eq!(a.waiting, 0);
    }

    #[test]
    fn one_rank_computing_while_its_peers_wait_is_activity() {
        let mut seen = vec![rank(0, Condition::Running, "prepare (job.py)")];
        seen.extend((1..4).map(|r| rank(r, Condition::Waiting, ALL_REDUCE)));
        let a = activity(&seen, false).expect("activity");
        assert_eq!(a.ranks, vec![0]);
        assert_eq!(
            a.summary,
            "rank 0 computes in prepare (job.py) while 3 ranks wait in all_reduce (torch/distributed/distributed_c10d.py)"
        );
    }

    #[test]
    fn the_work_is_named_by_the_jobs_own_code() {
        let seen: Vec<Seen> = (0..2)
            .map(|r| Seen {
                own_code: Some("evaluate (eval.py)"),
                ..rank(
                    r,
                    Condition::Running,
                    "Module._call_impl (torch/nn/modules/module.py)",
                )
            })
            .collect();
        let a = activity(&seen, false).expect("activity");
        assert_eq!(a.summary, "all 2 ranks compute in evaluate (eval.py)");
    }

    #[test]
    fn a_rank_that_downloads_while_its_peers_wait_moves_data() {
        // The case of the issue: rank 0 fetches a shard at 32 KB/s, almost no CPU, while 3 ranks wait.
        let mut seen = vec![Seen {
            bytes_per_s: Some(32_768),
            ..rank(0, Condition::Waiting, "fetch_shard (train.py)")
        }];
        seen.extend((1..4).map(|r| rank(r, Condition::Waiting, ALL_REDUCE)));
        let a = activity(&seen, false).expect("activity");
        assert_eq!(a.ranks, vec![0]);
        assert_eq!(
            a.summary,
            "rank 0 moves data (32 KB/s read or written) in fetch_shard (train.py) while 3 ranks wait in all_reduce (torch/distributed/distributed_c10d.py)"
        );
    }

    #[test]
    fn bytes_that_stop_or_trickle_or_move_inside_torch_distributed_are_no_work() {
        for (rate, where_) in [
            (Some(0), "fetch_shard (train.py)"),
            (None, "fetch_shard (train.py)"),
            (Some(MOVING_BYTES_PER_S - 1), "fetch_shard (train.py)"),
            (Some(10_000_000), ALL_REDUCE),
        ] {
            let mut seen = vec![Seen {
                bytes_per_s: rate,
                ..rank(0, Condition::Waiting, where_)
            }];
            seen.extend((1..4).map(|r| rank(r, Condition::Waiting, ALL_REDUCE)));
            assert_eq!(activity(&seen, false), None, "{rate:?} in {where_}");
        }
        // A rank in D moves nothing that excuses it, whatever its counters say.
        let seen = vec![
            Seen {
                bytes_per_s: Some(1_000_000),
                ..rank(0, Condition::BlockedInKernel, "write")
            },
            rank(1, Condition::Waiting, ALL_REDUCE),
        ];
        assert_eq!(activity(&seen, false), None);
    }

    #[test]
    fn a_child_that_copies_counts_for_its_rank_and_computation_is_said_first() {
        let mut seen = vec![rank(0, Condition::Waiting, "wait (subprocess.py)")];
        seen.push(Seen {
            rank: Some(0),
            rank_pid: 100,
            worker: true,
            bytes_per_s: Some(65_536),
            ..rank(0, Condition::Waiting, "copy (cp)")
        });
        seen.extend((1..4).map(|r| rank(r, Condition::Waiting, ALL_REDUCE)));
        let a = activity(&seen, false).expect("activity");
        assert_eq!(a.pids, vec![100]);
        assert!(
            a.summary.starts_with("rank 0 moves data (65 KB/s"),
            "{}",
            a.summary
        );
        let mut both = seen.clone();
        both[2] = rank(1, Condition::Running, EVAL);
        let a = activity(&both, false).expect("activity");
        assert!(
            a.summary.starts_with("2 of 4 ranks compute in"),
            "{}",
            a.summary
        );
    }

    #[test]
    fn spinning_inside_torch_distributed_is_a_wait() {
        let seen: Vec<Seen> = (0..4)
            .map(|r| rank(r, Condition::Running, ALL_REDUCE))
            .collect();
        assert_eq!(activity(&seen, false), None);
    }

    #[test]
    fn nobody_computing_is_no_activity() {
        let seen: Vec<Seen> = (0..4)
            .map(|r| rank(r, Condition::Waiting, ALL_REDUCE))
            .collect();
        assert_eq!(activity(&seen, false), None);
    }

    #[test]
    fn a_conclusive_finding_is_never_excused_by_work_elsewhere() {
        for bad in [
            Condition::BlockedInKernel,
            Condition::Stopped,
            Condition::Exited,
        ] {
            let mut seen = vec![rank(0, bad, "write")];
            seen.extend((1..4).map(|r| rank(r, Condition::Running, EVAL)));
            assert_eq!(activity(&seen, false), None, "{bad:?}");
        }
        let seen: Vec<Seen> = (0..2).map(|r| rank(r, Condition::Running, EVAL)).collect();
        assert_eq!(activity(&seen, true), None, "a node was not seen");
    }

    #[test]
    fn a_computing_worker_counts_for_its_rank() {
        let mut seen: Vec<Seen> = (0..2)
            .map(|r| rank(r, Condition::Waiting, "__next__ (dataloader.py)"))
            .collect();
        seen.push(Seen {
            rank: Some(1),
            rank_pid: 101,
            worker: true,
            condition: Condition::Running,
            where_: "__getitem__ (data.py)",
            own_code: None,
            bytes_per_s: None,
            slow_filesystem: false,
        });
        let a = activity(&seen, false).expect("activity");
        assert_eq!(a.ranks, vec![1]);
        assert_eq!(a.pids, vec![101]);
        assert_eq!(
            a.summary,
            "rank 1 computes through a child process in __next__ (dataloader.py) while 1 rank waits in \
             __next__ (dataloader.py)",
            "named where the rank waits for it"
        );
    }

    /// A child of rank 0 copying from a slow FUSE mount (`cp`, `aws s3 cp` into a cache): caught in the mount's
    /// request wait at most looks, its bytes still move.
    fn copying_child(condition: Condition, rate: u64, slow_filesystem: bool) -> Vec<Seen<'static>> {
        let mut seen = vec![Seen {
            own_code: Some("copy_from_mount (job.py)"),
            ..rank(0, Condition::Waiting, "Popen._wait (subprocess.py)")
        }];
        seen.push(Seen {
            worker: true,
            bytes_per_s: Some(rate),
            slow_filesystem,
            ..rank(0, condition, "read() in folio_wait_bit_common")
        });
        seen.extend((1..4).map(|r| rank(r, Condition::Waiting, ALL_REDUCE)));
        seen
    }

    #[test]
    fn a_child_copying_from_a_slow_mount_moves_data_for_its_rank() {
        for condition in [Condition::Waiting, Condition::BlockedInKernel] {
            let a = activity(&copying_child(condition, 131_072, true), false)
                .unwrap_or_else(|| panic!("{condition:?}: the copy is work"));
            assert_eq!(a.ranks, vec![0]);
            assert_eq!(
                a.summary,
                "rank 0 moves data (131 KB/s read or written) through a child process in copy_from_mount \
                 (job.py) while 3 ranks wait in all_reduce (torch/distributed/distributed_c10d.py)"
            );
        }
    }

    #[test]
    fn a_child_on_a_mount_that_did_not_answer_or_whose_bytes_stopped_is_no_work() {
        // The probe found no answer (or none was taken): a worker stuck there is a finding, not work.
        assert_eq!(
            activity(
                &copying_child(Condition::BlockedInKernel, 131_072, false),
                false
            ),
            None
        );
        // Slow mount, nothing moved: the copy stopped.
        assert_eq!(
            activity(&copying_child(Condition::BlockedInKernel, 0, true), false),
            None
        );
        // A rank in the kernel is never excused by its mount's answer.
        let mut seen = copying_child(Condition::Waiting, 131_072, true);
        seen[0].condition = Condition::BlockedInKernel;
        seen[0].slow_filesystem = true;
        seen[0].bytes_per_s = Some(131_072);
        assert_eq!(activity(&seen, false), None);
    }

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    #[test]
    fn the_hold_lasts_while_the_work_goes_on_and_ends_at_max_stall() {
        let mut hold = ActivityHold::new(ActivityRule::until(s(600)));
        assert_eq!(
            hold.decide(true, s(120), s(200)),
            HoldDecision::Hold { announce: true }
        );
        assert!(hold.holding());
        assert_eq!(hold.tick(s(140), s(220)), None, "not yet time to look");
        assert_eq!(hold.tick(s(150), s(230)), Some(HoldCheck::Recheck));
        assert_eq!(hold.tick(s(151), s(231)), None, "one look at a time");
        assert_eq!(
            hold.decide(true, s(151), s(231)),
            HoldDecision::Hold { announce: false },
            "said once per stall"
        );
        assert_eq!(hold.tick(s(600), s(700)), Some(HoldCheck::MaxStall));
        assert_eq!(hold.decide(true, s(601), s(701)), HoldDecision::Act);
        assert!(!hold.holding());
    }

    #[test]
    fn work_that_stops_is_acted_on() {
        let mut hold = ActivityHold::new(ActivityRule::until(s(600)));
        assert!(matches!(
            hold.decide(true, s(120), s(120)),
            HoldDecision::Hold { .. }
        ));
        assert_eq!(
            hold.decide(false, s(150), s(150)),
            HoldDecision::Hold { announce: false },
            "a look between the end of the work and the next step must not end the job"
        );
        assert_eq!(hold.tick(s(152), s(152)), None);
        assert_eq!(
            hold.tick(s(155), s(155)),
            Some(HoldCheck::Confirm),
            "confirmed 5 s later"
        );
        assert_eq!(hold.decide(false, s(155), s(155)), HoldDecision::Act);
    }

    #[test]
    fn work_seen_again_after_a_quiet_look_holds_on() {
        let mut hold = ActivityHold::new(ActivityRule::until(s(600)));
        hold.decide(true, s(120), s(120));
        hold.decide(false, s(150), s(150));
        assert_eq!(
            hold.decide(true, s(155), s(155)),
            HoldDecision::Hold { announce: false }
        );
        assert_eq!(
            hold.decide(false, s(185), s(185)),
            HoldDecision::Hold { announce: false },
            "a new quiet look is confirmed again"
        );
    }

    #[test]
    fn the_ladder_after_a_look() {
        let mut hold = ActivityHold::new(ActivityRule::until(s(600)));
        let below = |conclusive, hard_pending| Look::BelowHard {
            conclusive,
            hard_pending,
        };
        assert_eq!(
            hold.after_look(below(false, false), true, s(60), s(60)),
            AfterLook {
                act: false,
                say: Some(HoldNotice::Computing)
            },
            "a soft look that sees work says so, once"
        );
        assert_eq!(
            hold.after_look(Look::Hard, true, s(120), s(120)),
            AfterLook {
                act: false,
                say: None
            },
            "held at the hard tier, not said twice"
        );
        assert_eq!(
            hold.after_look(Look::Recheck, false, s(150), s(150)),
            AfterLook {
                act: false,
                say: None
            },
            "confirmed first"
        );
        assert_eq!(
            hold.after_look(Look::Confirm, false, s(155), s(155)),
            AfterLook {
                act: true,
                say: Some(HoldNotice::WorkStopped)
            }
        );
        let mut hold = ActivityHold::new(ActivityRule::until(s(600)));
        assert!(
            hold.after_look(below(true, false), true, s(10), s(10)).act,
            "conclusive evidence is acted on"
        );
        assert!(hold.after_look(Look::RankFailed, true, s(10), s(10)).act);
        assert!(!hold.after_look(Look::Never, false, s(10), s(10)).act);
        assert!(
            hold.after_look(below(false, true), false, s(130), s(130))
                .act,
            "the hard tier came during the soft look, nothing computes"
        );
        assert_eq!(
            hold.after_look(Look::Hard, false, s(130), s(130)),
            AfterLook {
                act: true,
                say: None
            }
        );
        let mut fixed = ActivityHold::new(ActivityRule::never());
        assert_eq!(
            fixed.after_look(below(false, false), true, s(3), s(3)),
            AfterLook {
                act: false,
                say: None
            },
            "with --stall-after nothing is held, so nothing is said"
        );
        assert!(fixed.after_look(Look::Hard, true, s(5), s(5)).act);
    }

    #[test]
    fn a_fixed_threshold_is_never_held() {
        let mut hold = ActivityHold::new(ActivityRule::never());
        assert_eq!(hold.decide(true, s(5), s(5)), HoldDecision::Act);
        assert_eq!(hold.tick(s(6), s(6)), None);
    }

    #[test]
    fn after_progress_a_new_stall_is_announced_again() {
        let mut hold = ActivityHold::new(ActivityRule::until(s(600)));
        assert!(hold.seen());
        assert!(!hold.seen());
        hold.reset();
        assert_eq!(
            hold.decide(true, s(120), s(900)),
            HoldDecision::Hold { announce: true }
        );
    }
}
