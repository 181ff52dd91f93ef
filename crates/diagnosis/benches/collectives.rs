//! The missing-rank analysis at a roll call: every rank's Flight Recorder record, read from the trimmed JSON a rank
//! sends (4 process groups, 16 collectives each), then analysed, for 64 ranks (one large node) and 10,000 ranks (a
//! whole job at the coordinator). Rank 3 never joins the last all_reduce of group 0. Prints the time to read and to
//! analyse. A rank's own dump and trim (2.6 ms for 256 entries) is measured in docs/inside-evidence.md.
//!
//! Run with `cargo bench -p hangwatch-diagnosis --bench collectives`.

use std::time::Instant;

use hangwatch_diagnosis::collectives::analyse;
use hangwatch_model::CollectiveRecord;

const GROUPS: u64 = 4;
const KEPT: u64 = 16;
const RUNS: u32 = 5;

/// What rank `rank` sends: the trimmed dump's JSON, as python/src/hangwatch/_flight.py writes it.
fn trimmed_dump(rank: u32) -> String {
    let last = 1000u64;
    let mut entries = Vec::new();
    let mut status = Vec::new();
    for group in 0..GROUPS {
        let issued = if group == 0 && rank == 3 {
            last - 1
        } else {
            last
        };
        status.push(format!(
            "\"{group}\":{{\"last_enqueued_collective\":\"{issued}\",\"last_started_collective\":\"-1\",\
             \"last_completed_collective\":\"{}\"}}",
            last - 1
        ));
        for seq in issued + 1 - KEPT..=issued {
            entries.push(format!(
                "{{\"collective_seq_id\":{seq},\"profiling_name\":\"nccl:all_reduce\",\"input_sizes\":[[20000]],\
                 \"input_dtypes\":[\"Float\"],\"state\":\"scheduled\",\"is_p2p\":false,\"process_group\":[\"{group}\"]}}"
            ));
        }
    }
    format!(
        "{{\"version\":\"2.10\",\"pg_status\":{{{}}},\"entries\":[{}]}}",
        status.join(","),
        entries.join(",")
    )
}

fn main() {
    for ranks in [64u32, 10_000] {
        let dumps: Vec<String> = (0..ranks).map(trimmed_dump).collect();
        let asked: Vec<u32> = (0..ranks).collect();
        let bytes: usize = dumps.iter().map(String::len).sum();
        let mut read_s = f64::MAX;
        let mut analyse_s = f64::MAX;
        for _ in 0..RUNS {
            let started = Instant::now();
            let records: Vec<CollectiveRecord> = dumps
                .iter()
                .enumerate()
                .map(|(rank, json)| {
                    CollectiveRecord::from_flight_recorder_json(rank as u32, json.as_bytes(), 16)
                        .expect("a dump")
                })
                .collect();
            read_s = read_s.min(started.elapsed().as_secs_f64());
            let started = Instant::now();
            let analysis = analyse(&records, &asked);
            analyse_s = analyse_s.min(started.elapsed().as_secs_f64());
            assert_eq!(
                analysis.findings.first().map(|f| f.culprits().to_vec()),
                Some(vec![3])
            );
        }
        println!(
            "COLLECTIVES ranks={ranks} dump_bytes={bytes} read_ms={:.2} analyse_ms={:.2} (best of {RUNS})",
            read_s * 1e3,
            analyse_s * 1e3
        );
    }
}
