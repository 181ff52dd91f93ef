//! The missing-rank analysis over real Flight Recorder dumps (tests/fixtures/flight_recorder: torch 2.15, gloo,
//! three ranks; how they were recorded is in its README).

use std::path::PathBuf;

use hangwatch_diagnosis::collectives::analyse;
use hangwatch_model::{CollectiveFinding, CollectiveRecord};

fn records(case: &str) -> Vec<CollectiveRecord> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/flight_recorder")
        .join(case);
    (0..3)
        .map(|rank| {
            let json =
                std::fs::read(dir.join(format!("rank{rank}.json"))).expect("a recorded dump");
            CollectiveRecord::from_flight_recorder_json(rank, &json, 32)
                .expect("a dump torch wrote")
        })
        .collect()
}

#[test]
fn gloo_rank_that_never_entered_the_all_reduce_is_named() {
    let analysis = analyse(&records("missing"), &[0, 1, 2]);
    assert_eq!(analysis.findings.len(), 1, "{analysis:?}");
    assert_eq!(
        analysis.findings[0].sentence(),
        "rank 2 never joined all_reduce #6 of process group 0 ([20000] float32); ranks 0-1 wait in it"
    );
    assert_eq!(analysis.findings[0].culprits(), [2]);
}

#[test]
fn gloo_rank_in_an_all_gather_where_the_others_all_reduce_is_named_with_both() {
    let analysis = analyse(&records("mismatch"), &[0, 1, 2]);
    assert_eq!(analysis.findings.len(), 1, "{analysis:?}");
    assert_eq!(
        analysis.findings[0].sentence(),
        "rank 1 entered all_gather #6 of process group 0 ([4] float32) where ranks 0, 2 entered all_reduce #6 \
         ([20000] float32)"
    );
}

#[test]
fn a_subgroup_is_judged_among_its_own_members() {
    let analysis = analyse(&records("subgroup"), &[0, 1, 2]);
    // The default group: every rank passed barrier #6; the group of ranks 0 and 1: rank 1 never issued #3.
    let never_joined: Vec<&CollectiveFinding> = analysis
        .findings
        .iter()
        .filter(|f| matches!(f, CollectiveFinding::NeverJoined { .. }))
        .collect();
    assert_eq!(never_joined.len(), 1, "{analysis:?}");
    assert_eq!(
        never_joined[0].sentence(),
        "rank 1 never joined all_reduce #3 of process group 1 ([8] float32); rank 0 waits in it"
    );
}

#[test]
fn a_rank_that_gave_no_dump_is_not_accused() {
    let mut records = records("missing");
    records.remove(2);
    let analysis = analyse(&records, &[0, 1, 2]);
    assert_eq!(analysis.unanswered, [2]);
    assert!(
        analysis.findings.iter().all(|f| f.culprits().is_empty()),
        "{analysis:?}"
    );
}

/// The dumps a job writes itself (`<TORCH_FR_DUMP_TEMP_FILE><rank>`) are pickled: recorded in the same state as
/// the JSON ones beside them, they read the same and name the same rank.
#[test]
fn a_jobs_own_pickled_dumps_read_as_the_json_ones_and_name_the_same_rank() {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flight_recorder/pickled");
    let pickled: Vec<CollectiveRecord> = (0..3)
        .map(|rank| {
            let bytes = std::fs::read(dir.join(format!("rank{rank}.pickle"))).expect("a pickle");
            CollectiveRecord::from_flight_recorder_pickle(rank, &bytes, 32).expect("torch's pickle")
        })
        .collect();
    assert_eq!(pickled, records("pickled"));
    let analysis = analyse(&pickled, &[0, 1, 2]);
    assert_eq!(analysis.findings[0].culprits(), [2], "{analysis:?}");
    // Not a pickle, or a pickle that would call something: refused, not run.
    for bad in [&b"not a pickle"[..], b"cos\nsystem\n(S'true'\ntR."] {
        assert!(CollectiveRecord::from_flight_recorder_pickle(0, bad, 32).is_err());
    }
}
