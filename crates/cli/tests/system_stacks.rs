//! System tests of the stack readers `run` prepares while the job is healthy (`hangwatch_inspect::prepared`):
//! on real Python ranks, they read what a cold read reads, keep no reader for a process that is gone, and a
//! reader stuck on a rank whose memory map is locked (a really frozen ext4) is abandoned without holding the
//! read up, and replaced.

use std::time::{Duration, Instant};

use hangwatch_inspect::prepared::PreparedStacks;
use hangwatch_inspect::pystack::{read_python_processes, StackReadOptions, StackReadOutcome};
use hangwatch_testkit::{require, wait_until, LoopExt4, MmapStallGroup, RankGroup};

fn options() -> StackReadOptions {
    StackReadOptions {
        program: env!("CARGO_BIN_EXE_hangwatch").into(),
        per_pid_timeout: Duration::from_secs(1),
        total_timeout: Duration::from_secs(6),
        parallelism: 2,
    }
}

fn readers() -> PreparedStacks {
    PreparedStacks::start(env!("CARGO_BIN_EXE_hangwatch").into(), 2).expect("start the readers")
}

fn pids_of(ranks: &RankGroup) -> Vec<i32> {
    ranks.pids().into_iter().map(|p| p as i32).collect()
}

/// The innermost function of each Python thread of `pid`, as read.
fn functions(outcome: &StackReadOutcome, pid: i32) -> Vec<String> {
    let report = &outcome.reports[&pid];
    let threads = report
        .threads
        .as_ref()
        .unwrap_or_else(|| panic!("no stack for {pid}: {:?}", report.errors));
    let mut names: Vec<String> = threads
        .iter()
        .flat_map(|t| t.frames.iter().map(|f| f.function.to_string()))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn prepared_readers_read_what_a_cold_read_reads() {
    let ranks = require!(RankGroup::builder(4).spawn());
    ranks
        .wait_all_for_step(2, Duration::from_secs(60))
        .expect("ranks step");
    let pids = pids_of(&ranks);
    let readers = readers();
    readers.prepare(&pids);

    let warm = readers.read(&pids, &options());
    let cold = read_python_processes(&pids, &options());
    assert_eq!(
        warm.by_prepared,
        pids.len(),
        "not every stack came from a prepared reader"
    );
    assert_eq!(cold.by_prepared, 0);
    for (rank, &pid) in pids.iter().enumerate() {
        let report = &warm.reports[&pid];
        assert_eq!(
            report.rank_env.as_ref().and_then(|e| e.rank),
            Some(rank as u32),
            "rank identity of pid {pid}: {report:?}"
        );
        let names = functions(&warm, pid);
        assert!(
            names.iter().any(|n| n == "main"),
            "pid {pid}: no `main` frame in {names:?}"
        );
        // Ranks step between the two reads; the functions they can be in are the same few.
        let cold_names = functions(&cold, pid);
        assert!(
            names.iter().any(|n| cold_names.contains(n)),
            "pid {pid}: prepared {names:?} and cold {cold_names:?} share nothing"
        );
    }
    // A second read is served by the same readers.
    let again = readers.read(&pids, &options());
    assert_eq!(again.by_prepared, pids.len());
}

#[test]
fn a_rank_that_is_gone_is_reported_gone_and_the_others_are_read() {
    let ranks = require!(RankGroup::builder(4).spawn());
    ranks
        .wait_all_for_step(2, Duration::from_secs(60))
        .expect("ranks step");
    let pids = pids_of(&ranks);
    let readers = readers();
    readers.prepare(&pids);
    assert_eq!(readers.read(&pids, &options()).by_prepared, 4);

    // Ours (the group started it), by pid; the group reaps it when dropped.
    let killed = std::process::Command::new("kill")
        .args(["-9", &pids[2].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    std::thread::sleep(Duration::from_millis(200));
    let outcome = readers.read(&pids, &options());
    let gone = &outcome.reports[&pids[2]];
    assert!(gone.threads.is_none(), "a stack for a dead rank: {gone:?}");
    assert!(!gone.errors.is_empty(), "no reason given for the dead rank");
    for &pid in pids.iter().filter(|p| **p != pids[2]) {
        assert!(
            outcome.reports[&pid].threads.is_some(),
            "pid {pid} not read after a peer died: {:?}",
            outcome.reports[&pid].errors
        );
    }
}

#[test]
fn a_reader_stuck_on_a_locked_memory_map_is_abandoned_and_replaced() {
    let fs = require!(LoopExt4::new(64));
    let group = require!(MmapStallGroup::spawn(4, 1, &fs.path().join("mapped.bin")));
    let ranks = &group.ranks;
    let pids = pids_of(ranks);
    let readers = readers();
    readers.prepare(&pids);
    assert_eq!(readers.read(&pids, &options()).by_prepared, 4);

    let frozen = require!(fs.freeze());
    group.lock().expect("rank 1 starts the stall");

    let started = Instant::now();
    let outcome = readers.read(&pids, &options());
    let took = started.elapsed();
    // Bounded by the read's own deadlines (1 s a pid, 6 s in all), with room for a loaded machine.
    assert!(
        took < Duration::from_secs(10),
        "the read waited on the stuck rank: {took:?}"
    );
    let stuck = &outcome.reports[&pids[1]];
    assert!(
        stuck.errors.iter().any(|e| e.contains("did not return")),
        "rank 1's read not reported stuck: {stuck:?}"
    );
    for &pid in pids.iter().filter(|p| **p != pids[1]) {
        assert!(
            outcome.reports[&pid].threads.is_some(),
            "pid {pid} not read while rank 1 is stuck: {:?}",
            outcome.reports[&pid].errors
        );
    }
    assert!(!outcome.abandoned.is_empty(), "no reader was given up on");
    drop(outcome);

    // After the thaw, the readers are whole again: every live rank is read, rank 1 included while it lives. (The
    // fixture's rank 1 may die of the thaw: its write fault can be retried after the munmap that waited behind it
    // went through, a SIGSEGV on the unmapped page; that is the fixture's race, not the readers'.)
    drop(frozen);
    let alive = |pid: i32| {
        !matches!(
            hangwatch_testkit::process_state(pid as u32),
            None | Some('Z') | Some('X')
        )
    };
    let mut unread = Vec::new();
    assert!(
        wait_until(Duration::from_secs(30), Duration::from_millis(500), || {
            let outcome = readers.read(&pids, &options());
            unread = pids
                .iter()
                .filter(|p| alive(**p) && outcome.reports[p].threads.is_none())
                .map(|p| (*p, outcome.reports[p].errors.clone()))
                .collect();
            unread.is_empty()
        }),
        "the readers did not recover after the thaw; live ranks still unread: {unread:?}"
    );
    for &pid in pids.iter().filter(|p| **p != pids[1]) {
        assert!(
            alive(pid),
            "rank with pid {pid} died, only rank 1 was stalled"
        );
    }
}
