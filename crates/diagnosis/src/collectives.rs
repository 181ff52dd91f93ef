//! Who did not join which collective: the missing-rank analysis over every rank's Flight Recorder record.
//!
//! The most common multi-GPU hang leaves no outlier in /proc: every rank waits in a collective, often at the
//! same line. The recorder says, per process group, how far each rank got. Per group:
//! - **never joined**: the ranks whose last issued collective is behind the others'; they never issued the next
//!   one, in which the others wait;
//! - **mismatch**: at one sequence number, some ranks issued another collective (or, where every rank must pass
//!   the same tensors, other sizes or types) than the rest;
//! - **all in**: every rank issued the same last collective and it has not completed on some of them: the
//!   collective itself is stuck (a network, a rank stuck inside it), which the kernel view has to explain.
//!
//! A snapshot of a running job would show ranks a collective apart all the time; the analysis is read at a roll
//! call, when progress has stopped, so the frontier it sees is where the job stands.

use std::collections::{BTreeMap, BTreeSet};

use hangwatch_model::{
    CollectiveAnalysis, CollectiveCall, CollectiveEntry, CollectiveFinding, CollectiveRecord,
    GroupRecord,
};

/// The ops whose inputs are the same on every rank of a correct program; elsewhere (all_to_all with uneven splits,
/// scatter's root) sizes may differ and only the op is compared.
fn inputs_must_match(op: &str) -> bool {
    let op = op.trim_start_matches('_');
    [
        "all_reduce",
        "allreduce",
        "broadcast",
        "all_gather",
        "allgather",
        "reduce_scatter",
    ]
    .iter()
    .any(|p| op.starts_with(p))
        || op == "barrier"
}

/// What must agree across ranks at one sequence number.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Signature {
    op: String,
    /// Compared only where [`inputs_must_match`].
    inputs: Option<(Vec<Vec<u64>>, Vec<String>)>,
}

fn signature(entry: &CollectiveEntry) -> Signature {
    Signature {
        op: entry.op.clone(),
        inputs: inputs_must_match(&entry.op)
            .then(|| (entry.input_sizes.clone(), entry.input_dtypes.clone())),
    }
}

fn call_of(group: &str, seq: u64, entry: Option<&CollectiveEntry>) -> CollectiveCall {
    CollectiveCall {
        group: group.to_string(),
        seq,
        op: entry.map(|e| e.op.clone()),
        shape: entry.map(CollectiveEntry::shape_text),
    }
}

/// Analyses the records of one roll call; `asked` are the ranks whose record was asked for.
pub fn analyse(records: &[CollectiveRecord], asked: &[u32]) -> CollectiveAnalysis {
    let answered: BTreeSet<u32> = records.iter().map(|r| r.rank).collect();
    let unanswered: Vec<u32> = asked
        .iter()
        .copied()
        .filter(|r| !answered.contains(r))
        .collect::<BTreeSet<u32>>()
        .into_iter()
        .collect();
    // Each group with the ranks that report it (its members, as far as the records tell).
    let mut groups: BTreeMap<(u64, String), Vec<(u32, &GroupRecord)>> = BTreeMap::new();
    for record in records {
        for group in &record.groups {
            // Groups are named by number; numeric order puts the default group first.
            let order = group.name.parse::<u64>().unwrap_or(u64::MAX);
            groups
                .entry((order, group.name.clone()))
                .or_default()
                .push((record.rank, group));
        }
    }
    let findings = groups
        .into_iter()
        .filter_map(|((_, name), members)| analyse_group(&name, &members))
        .collect();
    CollectiveAnalysis {
        findings,
        unanswered,
    }
}

/// The one finding for a group, the earliest cause first: a mismatch at or before the point where ranks fall
/// behind, else the ranks behind, else a collective every rank is in.
fn analyse_group(name: &str, members: &[(u32, &GroupRecord)]) -> Option<CollectiveFinding> {
    let enqueued: Vec<(u32, u64)> = members
        .iter()
        .filter_map(|(rank, g)| Some((*rank, g.last_enqueued?)))
        .collect();
    let lowest = enqueued.iter().map(|(_, n)| *n).min()?;
    let highest = enqueued.iter().map(|(_, n)| *n).max()?;
    let next = lowest + 1;

    if let Some(mismatch) =
        first_mismatch(name, members, if lowest < highest { next } else { lowest })
    {
        return Some(mismatch);
    }
    let entry_at = |seq: u64| {
        members
            .iter()
            .find_map(|(_, g)| g.entries.iter().find(|e| e.seq == seq))
    };
    if lowest < highest {
        let missing: Vec<u32> = enqueued
            .iter()
            .filter(|(_, n)| *n == lowest)
            .map(|(r, _)| *r)
            .collect();
        let waiting: Vec<u32> = enqueued
            .iter()
            .filter(|(_, n)| *n >= next)
            .map(|(r, _)| *r)
            .collect();
        return Some(CollectiveFinding::NeverJoined {
            call: call_of(name, next, entry_at(next)),
            missing,
            waiting,
        });
    }
    // Everyone issued the same last collective: has it completed everywhere?
    let not_completed: Vec<u32> = members
        .iter()
        .filter(|(_, g)| g.last_completed.is_none_or(|c| c < lowest))
        .map(|(r, _)| *r)
        .collect();
    if lowest == 0 || members.len() < 2 || not_completed.is_empty() {
        return None;
    }
    Some(CollectiveFinding::AllIn {
        call: call_of(name, lowest, entry_at(lowest)),
        ranks: enqueued.iter().map(|(r, _)| *r).collect(),
        not_completed,
    })
}

/// The lowest sequence number up to `until` at which the ranks that kept it issued different collectives: the
/// most common signature is the usual one (the lower rank's on a tie), the others are odd.
fn first_mismatch(
    name: &str,
    members: &[(u32, &GroupRecord)],
    until: u64,
) -> Option<CollectiveFinding> {
    let mut by_seq: BTreeMap<u64, Vec<(u32, &CollectiveEntry)>> = BTreeMap::new();
    for (rank, group) in members {
        for entry in group.entries.iter().filter(|e| e.seq <= until) {
            by_seq.entry(entry.seq).or_default().push((*rank, entry));
        }
    }
    by_seq.into_iter().find_map(|(seq, entries)| {
        let mut kinds: BTreeMap<Signature, Vec<u32>> = BTreeMap::new();
        for (rank, entry) in &entries {
            kinds.entry(signature(entry)).or_default().push(*rank);
        }
        if kinds.len() < 2 {
            return None;
        }
        let usual = kinds
            .iter()
            .max_by_key(|(_, ranks)| (ranks.len(), std::cmp::Reverse(ranks.iter().min().copied())))
            .map(|(s, _)| s.clone())?;
        let usual_ranks = kinds.remove(&usual)?;
        let odd: Vec<u32> = kinds.values().flatten().copied().collect();
        let entry_of = |rank: u32| entries.iter().find(|(r, _)| *r == rank).map(|(_, e)| *e);
        Some(CollectiveFinding::Mismatch {
            usual: call_of(name, seq, entry_of(usual_ranks[0])),
            odd_call: call_of(name, seq, entry_of(odd[0])),
            usual_ranks,
            odd,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::CollectiveState;

    fn entry(seq: u64, op: &str, size: u64) -> CollectiveEntry {
        CollectiveEntry {
            seq,
            op: op.into(),
            backend: Some("nccl".into()),
            input_sizes: if op == "barrier" {
                vec![]
            } else {
                vec![vec![size]]
            },
            input_dtypes: if op == "barrier" {
                vec![]
            } else {
                vec!["Float".into()]
            },
            state: CollectiveState::Scheduled,
        }
    }

    /// Rank `rank` of group `name`, having issued `ops` (numbered from 1) and completed up to `completed`.
    fn record(rank: u32, ops: &[(&str, u64)], completed: u64) -> CollectiveRecord {
        CollectiveRecord {
            rank,
            groups: vec![GroupRecord {
                name: "0".into(),
                last_enqueued: Some(ops.len() as u64),
                last_started: None,
                last_completed: Some(completed),
                entries: ops
                    .iter()
                    .enumerate()
                    .map(|(i, (op, size))| entry(i as u64 + 1, op, *size))
                    .collect(),
            }],
        }
    }

    const STEP: [(&str, u64); 3] = [("all_reduce", 20000), ("all_reduce", 20000), ("barrier", 0)];

    #[test]
    fn the_rank_that_never_issued_the_collective_the_others_wait_in_is_named() {
        let mut records: Vec<CollectiveRecord> = (0..8)
            .map(|r| record(r, &[&STEP[..], &[("all_reduce", 20000)]].concat(), 3))
            .collect();
        records[3] = record(3, &STEP, 3);
        let analysis = analyse(&records, &(0..8).collect::<Vec<_>>());
        assert_eq!(analysis.findings.len(), 1);
        let finding = &analysis.findings[0];
        assert_eq!(finding.culprits(), [3]);
        assert_eq!(
            finding.sentence(),
            "rank 3 never joined all_reduce #4 of process group 0 ([20000] float32); ranks 0-2, 4-7 wait in it"
        );
        assert!(analysis.unanswered.is_empty());
    }

    #[test]
    fn a_rank_in_another_collective_at_the_same_number_is_named_with_both() {
        let mut records: Vec<CollectiveRecord> = (0..4)
            .map(|r| record(r, &[&STEP[..], &[("all_reduce", 20000)]].concat(), 3))
            .collect();
        records[2] = record(2, &[&STEP[..], &[("all_gather", 4)]].concat(), 3);
        let finding = &analyse(&records, &[0, 1, 2, 3]).findings[0];
        assert_eq!(finding.culprits(), [2]);
        assert_eq!(
            finding.sentence(),
            "rank 2 entered all_gather #4 of process group 0 ([4] float32) where ranks 0-1, 3 entered \
             all_reduce #4 ([20000] float32)"
        );
        // Other sizes in an all_reduce are a mismatch too.
        records[2] = record(2, &[&STEP[..], &[("all_reduce", 4)]].concat(), 3);
        let finding = &analyse(&records, &[0, 1, 2, 3]).findings[0];
        assert!(
            matches!(finding, CollectiveFinding::Mismatch { .. }),
            "{finding:?}"
        );
        assert_eq!(finding.culprits(), [2]);
        // In an all_to_all they may differ.
        let records: Vec<CollectiveRecord> = (0..4)
            .map(|r| record(r, &[("all_to_all", 10 + u64::from(r))], 0))
            .collect();
        let analysis = analyse(&records, &[0, 1, 2, 3]);
        assert!(
            matches!(analysis.findings[..], [CollectiveFinding::AllIn { .. }]),
            "{analysis:?}"
        );
    }

    #[test]
    fn every_rank_in_the_same_unfinished_collective_names_no_culprit() {
        let records: Vec<CollectiveRecord> = (0..4)
            .map(|r| record(r, &[&STEP[..], &[("all_reduce", 20000)]].concat(), 3))
            .collect();
        let finding = &analyse(&records, &[0, 1, 2, 3]).findings[0];
        assert!(finding.culprits().is_empty());
        assert_eq!(
            finding.sentence(),
            "ranks 0-3 issued all_reduce #4 of process group 0 ([20000] float32); it has not completed on ranks 0-3"
        );
        // All completed: nothing to say.
        let done: Vec<CollectiveRecord> = (0..4).map(|r| record(r, &STEP, 3)).collect();
        assert!(analyse(&done, &[0, 1, 2, 3]).findings.is_empty());
    }

    #[test]
    fn ranks_that_gave_no_record_are_neither_accused_nor_cleared() {
        let records: Vec<CollectiveRecord> = (0..3)
            .map(|r| record(r, &[&STEP[..], &[("all_reduce", 20000)]].concat(), 3))
            .collect();
        let analysis = analyse(&records, &[0, 1, 2, 3, 3]);
        assert_eq!(analysis.unanswered, [3]);
        assert!(analysis.findings.iter().all(|f| f.culprits().is_empty()));
        assert!(analyse(&[], &[]).findings.is_empty());
    }
}
