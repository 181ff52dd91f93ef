//! The test kit's guarantees, on real mounts and processes: frozen writers really hang, and the guards clean up
//! whatever happens to the test (including a panic while frozen, and guards dropped in the wrong order).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hangwatch_testkit::{
    is_dead, is_mount_point, process_state, require, run_tool, task_states, wait_until, wchan,
    Behaviour, ChildGuard, FuseMount, LoopExt4, RankGroup, TestkitError,
};

const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// A shell that appends to `file` every 50 ms through one open fd, so a hung filesystem catches it in write().
fn writer(file: &Path) -> ChildGuard {
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        r#"exec 3>>"$1"; while :; do echo x >&3; sleep 0.05; done"#,
        "writer",
    ])
    .arg(file);
    ChildGuard::spawn(&mut cmd, "writer").expect("sh starts")
}

fn wait_for_content(file: &Path) {
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(10), || {
            std::fs::metadata(file).is_ok_and(|m| m.len() > 0)
        }),
        "the writer never wrote to {}",
        file.display()
    );
}

fn main_thread(pid: u32) -> (char, String) {
    (
        process_state(pid).unwrap_or('?'),
        wchan(pid).unwrap_or_default(),
    )
}

#[test]
fn frozen_writer_sleeps_in_d_and_the_mount_is_gone_after_a_panic() {
    let mut seen: Option<(char, String)> = None;
    let mut left: Option<(PathBuf, PathBuf, u32)> = None;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let fs = require!(LoopExt4::new(16));
        let log = fs.path().join("log.txt");
        let writer = writer(&log);
        left = Some((
            fs.path().to_path_buf(),
            fs.image().to_path_buf(),
            writer.pid(),
        ));
        wait_for_content(&log);
        let _frozen = fs.freeze().unwrap();
        let pid = writer.pid();
        wait_until(Duration::from_secs(5), Duration::from_millis(10), || {
            main_thread(pid).0 == 'D'
        });
        seen = Some(main_thread(pid));
        panic!("the test body fails while the mount is frozen");
    }));
    let Some((mount, image, pid)) = left else {
        return; // skipped: the reason was printed
    };
    assert!(outcome.is_err(), "the body was meant to panic");
    let (state, wchan) = seen.expect("the body observed the writer before panicking");
    println!("writer on the frozen ext4: state {state}, wchan {wchan}");
    assert_eq!(
        state, 'D',
        "a writer on a frozen ext4 sleeps uninterruptibly (wchan {wchan})"
    );
    assert!(
        !is_mount_point(&mount),
        "{} is still mounted",
        mount.display()
    );
    assert!(!image.exists(), "{} was not removed", image.display());
    assert!(is_dead(pid), "writer {pid} survived its guard");
}

#[test]
fn guards_dropped_in_the_wrong_order_still_clean_up_in_bounded_time() {
    let fs = require!(LoopExt4::new(16));
    let mount = fs.path().to_path_buf();
    let frozen = fs.freeze().unwrap();
    let writer = writer(&fs.path().join("log.txt"));
    let pid = writer.pid();
    assert!(
        wait_until(
            Duration::from_secs(5),
            Duration::from_millis(10),
            || process_state(pid) == Some('D')
        ),
        "writer {pid} is {:?}, not in D, on a frozen mount",
        main_thread(pid)
    );

    let started = Instant::now();
    drop(writer); // killed while in D: cannot die before the thaw, so the guard gives up
    drop(frozen);
    drop(fs);
    let took = started.elapsed();
    println!("wrong-order clean-up took {took:?}");
    assert!(took < Duration::from_secs(20), "clean-up took {took:?}");
    assert!(
        !is_mount_point(&mount),
        "{} is still mounted",
        mount.display()
    );
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
            is_dead(pid)
        }),
        "writer {pid} still alive after the thaw"
    );
}

#[test]
fn freezing_twice_is_refused() {
    let fs = require!(LoopExt4::new(16));
    let _frozen = fs.freeze().unwrap();
    assert!(fs.is_frozen());
    assert!(matches!(fs.freeze(), Err(TestkitError::Misuse(_))));
}

#[test]
fn stopped_fuse_daemon_leaves_a_writer_waiting_for_an_answer() {
    let backing = tempfile::tempdir().unwrap();
    let fuse = require!(FuseMount::new(backing.path()));
    let mount = fuse.path().to_path_buf();
    let daemon = fuse.daemon_pid();
    let writer = writer(&fuse.path().join("log.txt"));
    wait_for_content(&backing.path().join("log.txt"));

    let stopped = fuse.stop_daemon().unwrap();
    let pid = writer.pid();
    let waiting = |(state, wchan): &(char, String)| state == &'D' || wchan == "request_wait_answer";
    wait_until(Duration::from_secs(5), Duration::from_millis(10), || {
        waiting(&main_thread(pid))
    });
    let seen = main_thread(pid);
    println!(
        "writer on the stopped FUSE mount: state {}, wchan {}",
        seen.0, seen.1
    );
    assert!(
        waiting(&seen),
        "writer is {seen:?}: expected S in request_wait_answer (or D)"
    );

    drop(stopped);
    drop(writer);
    drop(fuse);
    assert!(
        !is_mount_point(&mount),
        "{} is still mounted",
        mount.display()
    );
    assert!(is_dead(daemon), "bindfs {daemon} survived");
}

#[test]
fn ranks_step_together_through_the_barrier_and_die_with_the_group() {
    let ranks = require!(RankGroup::builder(4).spawn());
    ranks.wait_all_for_step(3, STEP_TIMEOUT).unwrap();
    for rank in 0..4 {
        assert!(ranks.printed(
            rank,
            &format!("rank {rank} of 4 ready (pid {})", ranks.pid(rank))
        ));
    }
    let pids = ranks.pids();
    drop(ranks);
    for pid in pids {
        assert!(is_dead(pid), "rank pid {pid} survived the group");
    }
}

#[test]
fn a_rank_that_exits_leaves_its_peers_waiting_in_the_barrier() {
    let mut ranks = require!(RankGroup::builder(3)
        .behaviour(2, Behaviour::Exit { after_steps: 2 })
        .spawn());
    ranks
        .wait_for_line(2, "exiting with code 3", STEP_TIMEOUT)
        .unwrap();
    let mut status = None;
    wait_until(Duration::from_secs(5), Duration::from_millis(10), || {
        status = ranks.try_wait(2);
        status.is_some()
    });
    assert_eq!(status.and_then(|s| s.code()), Some(3));
    ranks.wait_for_step(0, 1, STEP_TIMEOUT).unwrap();
    ranks.wait_for_step(1, 1, STEP_TIMEOUT).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        (ranks.last_step(0), ranks.last_step(1)),
        (Some(1), Some(1)),
        "peers advanced without rank 2"
    );
    let pid = ranks.pid(0);
    assert!(
        wait_until(Duration::from_secs(2), Duration::from_millis(10), || {
            process_state(pid) == Some('S')
        }),
        "rank 0 waits asleep in the barrier, not {:?}",
        process_state(pid)
    );
}

#[test]
fn spinning_and_deadlocked_ranks_stop_the_job_in_different_states() {
    let ranks = require!(RankGroup::builder(3)
        .behaviour(1, Behaviour::Spin { after_steps: 2 })
        .behaviour(2, Behaviour::Lock { after_steps: 2 })
        .spawn());
    ranks.wait_for_line(1, "spinning", STEP_TIMEOUT).unwrap();
    ranks.wait_for_line(2, "deadlocking", STEP_TIMEOUT).unwrap();
    let spinner = ranks.pid(1);
    let locked = ranks.pid(2);
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
            main_thread(locked).0 == 'S' && main_thread(locked).1.contains("futex")
        }),
        "deadlocked rank is {:?}, expected S in a futex wait",
        main_thread(locked)
    );
    let mut running = 0;
    for _ in 0..20 {
        if process_state(spinner) == Some('R') {
            running += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        running >= 10,
        "spinning rank was R in only {running} of 20 samples"
    );
    assert_eq!(ranks.last_step(0), Some(1));
}

#[test]
fn a_rank_logging_to_a_frozen_mount_blocks_in_write_while_peers_wait() {
    let fs = require!(LoopExt4::new(16));
    let ranks = require!(RankGroup::builder(3)
        .log(0, fs.path().join("rank0.log"))
        .spawn());
    ranks.wait_all_for_step(2, STEP_TIMEOUT).unwrap();
    let frozen = fs.freeze().unwrap();
    let pid = ranks.pid(0);
    assert!(
        wait_until(
            Duration::from_secs(5),
            Duration::from_millis(10),
            || main_thread(pid).0 == 'D'
        ),
        "rank 0 is {:?}, not D, with its log frozen",
        main_thread(pid)
    );
    let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap();
    assert!(
        syscall.starts_with("1 "),
        "rank 0 should be in write (nr 1 on x86_64): {syscall}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let stuck_at = ranks.last_step(1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        ranks.last_step(1),
        stuck_at,
        "peers advanced past a frozen rank 0"
    );
    drop(frozen);
    ranks
        .wait_for_step(1, stuck_at.unwrap_or(0) + 1, STEP_TIMEOUT)
        .unwrap();
}

#[test]
fn mmap_stall_makes_reads_of_the_rank_memory_map_block() {
    let fs = require!(LoopExt4::new(16));
    let outside = tempfile::tempdir().unwrap();
    let trigger = outside.path().join("stall-now");
    let ranks = require!(RankGroup::builder(2)
        .behaviour(
            1,
            Behaviour::MmapStall {
                file: fs.path().join("mapped.bin"),
                trigger_file: Some(trigger.clone()),
            },
        )
        .spawn());
    ranks.wait_for_line(1, "mmap ready", STEP_TIMEOUT).unwrap();
    ranks.wait_all_for_step(1, STEP_TIMEOUT).unwrap();
    let cmdline = format!("/proc/{}/cmdline", ranks.pid(1));
    run_tool("cat", &[&cmdline], Duration::from_secs(5))
        .expect("cmdline is readable before the stall");

    let frozen = fs.freeze().unwrap();
    std::fs::write(&trigger, b"").unwrap();
    ranks
        .wait_for_line(1, "mmap unmapping", STEP_TIMEOUT)
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let threads = task_states(ranks.pid(1));
    println!("rank 1 threads during the stall: {threads:?}");
    let read = run_tool("cat", &[&cmdline], Duration::from_secs(2));
    assert!(
        matches!(read, Err(TestkitError::CommandTimedOut { .. })),
        "reading {cmdline} should block during the mmap stall, got {read:?}"
    );
    drop(frozen);
    // After the thaw the stall clears one of two ways: the write completes and munmap follows ("mmap unmapped"),
    // or the kernel retries the write fault after munmap won the race for the area and the rank dies of SIGSEGV
    // (seen in about one run in ten). Either way nothing is left blocked, which is what this test is about.
    let pid = ranks.pid(1);
    let cleared = wait_until(STEP_TIMEOUT, Duration::from_millis(20), || {
        ranks.printed(1, "mmap unmapped") || is_dead(pid)
    });
    assert!(
        cleared,
        "the mmap stall did not clear after the thaw; rank 1's threads: {:?}",
        task_states(pid)
    );
    if !is_dead(pid) {
        run_tool("cat", &[&cmdline], Duration::from_secs(5))
            .expect("cmdline is readable again after the thaw");
    }
}

#[test]
fn watchdogs_thaw_resume_and_unmount_when_the_test_process_is_killed() {
    use std::io::BufRead;
    const NAME: &str = "watchdogs_thaw_resume_and_unmount_when_the_test_process_is_killed";
    if let Some(backing) = std::env::var_os("TESTKIT_VICTIM_BACKING") {
        let fs = require!(LoopExt4::new(16));
        let _frozen = fs.freeze().unwrap();
        let fuse = require!(FuseMount::new(Path::new(&backing)));
        let _stopped = fuse.stop_daemon().unwrap();
        println!(
            "VICTIM {} {} {}",
            fs.path().display(),
            fuse.path().display(),
            fuse.daemon_pid()
        );
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    if let Err(reason) = hangwatch_testkit::require_root() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let backing = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", NAME, "--nocapture"])
        .env("TESTKIT_VICTIM_BACKING", backing.path())
        .stdout(std::process::Stdio::piped());
    let mut victim = ChildGuard::spawn(&mut cmd, "victim test process").unwrap();
    let stdout = victim.child_mut().stdout.take().unwrap();
    let line = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.strip_prefix("VICTIM ").map(str::to_string))
        .expect("the victim reports its mounts");
    let fields: Vec<&str> = line.split(' ').collect();
    let (ext4, fuse, daemon) = (
        PathBuf::from(fields[0]),
        PathBuf::from(fields[1]),
        fields[2].parse::<u32>().unwrap(),
    );
    assert!(is_mount_point(&ext4) && is_mount_point(&fuse));
    assert_eq!(process_state(daemon), Some('T'));

    victim.signal(nix::sys::signal::Signal::SIGKILL).unwrap();
    let started = Instant::now();
    assert!(
        wait_until(Duration::from_secs(15), Duration::from_millis(20), || {
            !is_mount_point(&ext4) && !is_mount_point(&fuse) && is_dead(daemon)
        }),
        "after the test process was killed: ext4 mounted {}, FUSE mounted {}, bindfs {daemon} state {:?}",
        is_mount_point(&ext4),
        is_mount_point(&fuse),
        process_state(daemon)
    );
    println!("watchdogs cleaned up in {:?}", started.elapsed());
}
