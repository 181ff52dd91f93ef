//! System tests of `hangwatch dump` on real Python ranks with a really frozen filesystem: the incident (ext4 frozen
//! under rank 0's log), a FUSE mount whose daemon is stopped, and a rank whose memory map is locked.

use std::process::Command;
use std::time::{Duration, Instant};

use hangwatch_testkit::{
    process_state, require, wait_until, wchan, FuseMount, LoopExt4, MmapStallGroup, RankGroup,
};
use serde_json::Value;

fn hangwatch() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hangwatch"))
}

/// Runs `hangwatch dump --json` on `pids`; returns the verdict and how long it took.
fn dump(pids: &[u32]) -> (Value, Duration) {
    let mut cmd = hangwatch();
    cmd.arg("dump").arg("--json");
    for pid in pids {
        cmd.arg("--pid").arg(pid.to_string());
    }
    let started = Instant::now();
    let out = cmd.output().expect("run hangwatch dump");
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdict: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "dump printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (verdict, took)
}

/// TracerPid and pending SIGSTOP of a process: hangwatch must leave neither behind.
fn tracer_and_sigstop(pid: u32) -> (i32, bool) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let tracer = field("TracerPid:").parse().unwrap_or(0);
    let pending = |name: &str| u64::from_str_radix(&field(name), 16).unwrap_or(0);
    let sigstop = 1u64 << (19 - 1);
    (
        tracer,
        (pending("SigPnd:") | pending("ShdPnd:")) & sigstop != 0,
    )
}

#[test]
fn frozen_ext4_names_rank_0_in_write_and_groups_the_other_15() {
    let fs = require!(LoopExt4::new(64));
    let log = fs.path().join("rank0.log");
    let ranks = require!(RankGroup::builder(16).log(0, &log).spawn());
    ranks
        .wait_all_for_step(3, Duration::from_secs(60))
        .expect("ranks step");
    let _frozen = require!(fs.freeze());
    let rank0 = ranks.pid(0);
    assert!(
        wait_until(
            Duration::from_secs(20),
            Duration::from_millis(50),
            || process_state(rank0) == Some('D')
        ),
        "rank 0 never entered D state (state {:?})",
        process_state(rank0)
    );

    let (v, took) = dump(&ranks.pids());
    // Bounded by its deadlines (1 s stacks, 2 s probe), not a speed target: that is measured by
    // bench/rollcall_vs_pyspy.py. A dump that waited on the frozen rank would never return.
    assert!(took < Duration::from_secs(8), "dump took {took:?}");
    assert_eq!(v["kind"], "blocked_in_kernel", "{v:#}");
    let culprits = v["culprits"].as_array().unwrap();
    assert_eq!(culprits.len(), 1, "{v:#}");
    let c = &culprits[0];
    assert_eq!(c["rank"], 0);
    assert_eq!(c["pid"], rank0);
    assert_eq!(c["state"], "D");
    assert_eq!(c["syscall"], "write");
    assert_eq!(c["path"], log.to_str().unwrap());
    assert_eq!(c["mount"], fs.path().to_str().unwrap());
    assert_eq!(c["fstype"], "ext4");
    assert_eq!(c["killable"], false);
    assert!(
        c["python_stack"].as_array().is_some_and(|s| !s.is_empty()),
        "no Python stack: {c:#}"
    );
    let fs_status = v["filesystems"].as_array().unwrap();
    assert_eq!(fs_status[0]["responsive"], false, "{v:#}");

    let group = &v["groups"][0];
    let mut grouped: Vec<u64> = group["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_u64().unwrap())
        .collect();
    grouped.sort_unstable();
    assert_eq!(grouped, (1..16).collect::<Vec<u64>>(), "{v:#}");
    assert!(
        group["where"].as_str().unwrap().starts_with("barrier"),
        "{group:#}"
    );

    for pid in ranks.pids() {
        assert_eq!(
            tracer_and_sigstop(pid),
            (0, false),
            "pid {pid} was left traced or with a pending stop"
        );
    }
}

#[test]
fn human_output_leads_with_the_answer() {
    let fs = require!(LoopExt4::new(64));
    let log = fs.path().join("rank0.log");
    let ranks = require!(RankGroup::builder(4).log(0, &log).spawn());
    ranks
        .wait_all_for_step(2, Duration::from_secs(60))
        .expect("ranks step");
    let _frozen = require!(fs.freeze());
    let rank0 = ranks.pid(0);
    assert!(wait_until(
        Duration::from_secs(20),
        Duration::from_millis(50),
        || process_state(rank0) == Some('D')
    ));
    let mut cmd = hangwatch();
    cmd.arg("dump");
    for pid in ranks.pids() {
        cmd.arg("--pid").arg(pid.to_string());
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    assert!(first.starts_with("blocked in kernel: rank 0"), "{text}");
    assert!(
        first.contains(&format!("in write() on {}", log.display())),
        "{text}"
    );
    assert!(first.contains("(ext4) does not respond"), "{text}");
    assert!(first.contains("3 ranks wait in barrier"), "{text}");
}

#[test]
fn fuse_writer_with_stopped_daemon_is_blocked_on_an_unresponsive_mount() {
    let backing = tempfile::tempdir().unwrap();
    let fuse = require!(FuseMount::new(backing.path()));
    let log = fuse.path().join("rank0.log");
    let ranks = require!(RankGroup::builder(4).log(0, &log).spawn());
    ranks
        .wait_all_for_step(2, Duration::from_secs(60))
        .expect("ranks step");
    let _stopped = require!(fuse.stop_daemon());
    let rank0 = ranks.pid(0);
    assert!(
        wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
            wchan(rank0).is_some_and(|w| w.contains("request_wait_answer") || w.contains("fuse"))
                || process_state(rank0) == Some('D')
        }),
        "rank 0 never waited on FUSE: state {:?} wchan {:?}",
        process_state(rank0),
        wchan(rank0)
    );

    let (v, took) = dump(&ranks.pids());
    assert!(took < Duration::from_secs(3), "dump took {took:?}");
    assert_eq!(v["kind"], "blocked_in_kernel", "{v:#}");
    let c = &v["culprits"][0];
    assert_eq!(c["rank"], 0, "{v:#}");
    assert_eq!(c["path"], log.to_str().unwrap());
    assert_eq!(c["mount"], fuse.path().to_str().unwrap());
    assert!(
        c["fstype"].as_str().unwrap_or_default().starts_with("fuse"),
        "{c:#}"
    );
    assert_eq!(v["filesystems"][0]["responsive"], false, "{v:#}");
}

#[test]
fn dump_stays_responsive_when_a_rank_memory_map_is_locked() {
    let fs = require!(LoopExt4::new(64));
    let group = require!(MmapStallGroup::spawn(4, 1, &fs.path().join("mapped.bin")));
    let ranks = &group.ranks;
    let _frozen = require!(fs.freeze());
    group.lock().expect("rank 1 starts the stall");

    let (v, took) = dump(&ranks.pids());
    assert!(took < Duration::from_secs(8), "dump took {took:?}");
    let warnings = v["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap_or_default().contains("did not return")),
        "no read reported as timed out: {v:#}"
    );
    let rank1 = v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pid"] == ranks.pid(1))
        .cloned()
        .unwrap();
    assert_eq!(rank1["state"], "D", "{rank1:#}");
}
