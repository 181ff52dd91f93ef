//! The history file after 1,000 verdicts: its size, the time to record one, the time to list them all (numbers for
//! docs/history.md). Run with `cargo bench -p hangwatch-history --bench history`.

use std::path::PathBuf;
use std::time::Instant;

use hangwatch_history::{Fingerprint, HistoryDb, NewEntry, Query};
use hangwatch_model::Verdict;

const VERDICTS: u32 = 1000;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("h.sqlite");
    let mut db = HistoryDb::open(&path).expect("a new history");
    let verdict: Verdict =
        serde_json::from_str(include_str!("../tests/fixtures/blocked-write-n1.json"))
            .expect("the fixture");
    let started = Instant::now();
    for i in 0..VERDICTS {
        let mut v = verdict.clone();
        // A third of the verdicts have another cause, so that fingerprints repeat as in a real fleet.
        if i % 3 == 0 {
            v.culprits[0].at.syscall = Some(format!("call{}", i % 7));
        }
        db.record(&NewEntry {
            verdict: &v,
            fingerprint: Fingerprint::of(&v),
            node: format!("node{:03}", i % 50),
            job_id: Some(format!("{}", 100_000 + i)),
            bundle: Some(PathBuf::from(format!(
                "/var/tmp/hangwatch-1000/run-20261201T142708Z-{i}"
            ))),
            at_unix_s: 1_796_000_000.0 + f64::from(i) * 60.0,
        })
        .expect("record");
    }
    let record_ms = started.elapsed().as_secs_f64() * 1000.0 / f64::from(VERDICTS);
    let size = std::fs::metadata(&path).map_or(0, |m| m.len());
    let list_started = Instant::now();
    let all = db.list(&Query::default()).expect("list");
    assert_eq!(all.len(), VERDICTS as usize);
    println!(
        "{VERDICTS} verdicts: {size} bytes ({} bytes each), record {record_ms:.3} ms each in-process, list all {:.1} ms",
        size / u64::from(VERDICTS),
        list_started.elapsed().as_secs_f64() * 1000.0
    );
}
