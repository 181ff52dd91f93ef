//! System tests of the log sink with the real `hangwatch __log-writer` child: a healthy destination, a really
//! frozen loop-mounted ext4 (lines kept and delivered in order after the thaw; `finish` while still frozen saves
//! the rest), spill under a small memory limit, and a destination that fills up and recovers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hangwatch_logsink::{LogSink, LogSinkOptions, OpenError, SinkStats, WriterCommand};
use hangwatch_testkit::{is_dead, require, wait_until, LoopExt4};

fn options(scratch: &Path) -> LogSinkOptions {
    LogSinkOptions {
        writer: Some(WriterCommand::hangwatch(env!("CARGO_BIN_EXE_hangwatch"))),
        spill_dir: scratch.to_owned(),
        undelivered_path: scratch.join("log-undelivered.txt"),
        stall_after: Duration::from_millis(500),
        ..LogSinkOptions::default()
    }
}

/// Line `i` (1-based) as the tests push it.
fn line(i: u64) -> String {
    format!("{i:08} rank 0 step {i} loss 0.{:04}\n", i % 10_000)
}

fn lines_of(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("could not read {}: {e}", path.display()));
    text.split_inclusive('\n').map(str::to_owned).collect()
}

/// Asserts `got` is exactly lines `first..first + got.len()`, in order; returns how many.
fn assert_run(got: &[String], first: u64, what: &str) -> u64 {
    for (k, l) in got.iter().enumerate() {
        let want = line(first + k as u64);
        assert_eq!(l, &want, "{what}: line {} is wrong", first + k as u64);
    }
    got.len() as u64
}

fn wait_for(
    timeout: Duration,
    what: &str,
    sink: &LogSink,
    mut cond: impl FnMut(&SinkStats) -> bool,
) {
    let ok = wait_until(timeout, Duration::from_millis(20), || cond(&sink.stats()));
    assert!(
        ok,
        "timed out after {timeout:?} waiting for {what}: {:?}",
        sink.stats()
    );
}

/// Push latencies, sorted, printed as p50/p99/max.
struct Latencies(Vec<Duration>);

impl Latencies {
    fn report(&mut self, label: &str) -> Duration {
        self.0.sort();
        let at = |q: f64| self.0[((self.0.len() - 1) as f64 * q) as usize];
        let (p50, p99, max) = (at(0.5), at(0.99), self.0[self.0.len() - 1]);
        eprintln!(
            "{label}: {} pushes, p50 {:.2} µs, p99 {:.2} µs, max {:.2} µs",
            self.0.len(),
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6,
            max.as_secs_f64() * 1e6
        );
        p99
    }
}

fn timed_push(sink: &LogSink, i: u64, lat: &mut Latencies) {
    let l = line(i);
    let t = Instant::now();
    sink.push(l.as_bytes());
    lat.0.push(t.elapsed());
}

#[test]
fn healthy_destination_gets_every_line_in_order() {
    let scratch = tempfile::tempdir().unwrap();
    let dest = scratch.path().join("log.txt");
    let sink = LogSink::open(&dest, options(scratch.path())).unwrap();
    let mut lat = Latencies(Vec::new());
    for i in 1..=20_000 {
        timed_push(&sink, i, &mut lat);
    }
    lat.report("healthy destination");
    let report = sink.finish(Duration::from_secs(20));
    assert!(report.is_complete(), "{report:?}");
    assert_eq!(report.message(), None);
    assert_eq!(report.written_lines, 20_000);
    assert_eq!(assert_run(&lines_of(&dest), 1, "destination"), 20_000);
    assert!(!scratch.path().join("log-undelivered.txt").exists());
}

#[test]
fn lines_are_appended_to_an_existing_log() {
    let scratch = tempfile::tempdir().unwrap();
    let dest = scratch.path().join("log.txt");
    std::fs::write(&dest, line(1)).unwrap();
    let sink = LogSink::open(&dest, options(scratch.path())).unwrap();
    sink.pusher().push(line(2).as_bytes());
    sink.push_owned(line(3).into_bytes());
    assert!(sink.finish(Duration::from_secs(10)).is_complete());
    assert_eq!(assert_run(&lines_of(&dest), 1, "destination"), 3);
}

#[test]
fn destination_that_cannot_be_opened_fails_open_with_the_reason() {
    let scratch = tempfile::tempdir().unwrap();
    let dest = scratch.path().join("no-such-dir").join("log.txt");
    let err = LogSink::open(&dest, options(scratch.path())).unwrap_err();
    assert!(matches!(err, OpenError::Destination { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("no-such-dir/log.txt"), "{text}");
    assert!(text.contains("No such file or directory"), "{text}");
}

#[test]
fn writer_program_that_is_not_hangwatch_is_reported() {
    let scratch = tempfile::tempdir().unwrap();
    let mut opts = options(scratch.path());
    opts.writer = Some(WriterCommand {
        program: "/bin/true".into(),
        args: Vec::new(),
    });
    let err = LogSink::open(&scratch.path().join("log.txt"), opts).unwrap_err();
    assert!(matches!(err, OpenError::WriterExited { .. }), "{err:?}");
    assert!(err.to_string().contains("/bin/true"), "{err}");
}

/// The acceptance test: 100,000 lines pushed over the 10 s the destination is frozen all arrive in order
/// after the thaw, and pushing never waits for the destination.
#[test]
fn frozen_destination_keeps_every_line_and_delivers_in_order_after_the_thaw() {
    let fs = require!(LoopExt4::new(64));
    let scratch = tempfile::tempdir().unwrap();
    let dest = fs.path().join("log.txt");
    let sink = LogSink::open(&dest, options(scratch.path())).unwrap();
    sink.push(line(1).as_bytes());
    wait_for(Duration::from_secs(10), "line 1 written", &sink, |s| {
        s.written_lines == 1
    });

    let frozen = require!(fs.freeze());
    let frozen_at = Instant::now();
    let total: u64 = 100_001;
    let mut lat = Latencies(Vec::with_capacity(total as usize));
    let mut i = 2;
    for batch in 0..100u32 {
        let due = frozen_at + Duration::from_millis(100) * batch;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        for _ in 0..1_000 {
            timed_push(&sink, i, &mut lat);
            i += 1;
        }
    }
    let during = sink.stats();
    assert_eq!(during.pushed_lines, total);
    assert!(during.written_lines < total, "{during:?}");
    let stalled_since = during
        .stalled_since
        .expect("a frozen destination shows as stalled");
    assert!(
        stalled_since.elapsed() >= Duration::from_secs(5),
        "{during:?}"
    );
    let p99 = lat.report("destination frozen, 1,000 lines every 100 ms");
    assert!(
        p99 < Duration::from_millis(5),
        "push p99 {p99:?} while frozen"
    );

    let frozen_for = frozen_at.elapsed();
    frozen.thaw().unwrap();
    let thawed_at = Instant::now();
    wait_for(Duration::from_secs(30), "every line written", &sink, |s| {
        s.written_lines == total
    });
    eprintln!(
        "frozen for {:.1} s; all {total} lines written {:.0} ms after the thaw",
        frozen_for.as_secs_f64(),
        thawed_at.elapsed().as_secs_f64() * 1e3
    );
    assert!(sink.stats().stalled_since.is_none());
    let report = sink.finish(Duration::from_secs(10));
    assert!(report.is_complete(), "{report:?}");
    assert_eq!(assert_run(&lines_of(&dest), 1, "destination"), total);
}

/// `finish` while the destination is still frozen returns by its deadline; after the thaw, the destination holds
/// lines 1..=w and the undelivered file lines a+1..=N, where a (acknowledged) <= w: together, every line, with
/// only the writer's last batch possibly in both.
#[test]
fn finish_while_frozen_saves_unwritten_lines_and_abandons_the_writer() {
    let fs = require!(LoopExt4::new(64));
    let scratch = tempfile::tempdir().unwrap();
    let dest = fs.path().join("log.txt");
    let undelivered_path = scratch.path().join("log-undelivered.txt");
    let sink = LogSink::open(&dest, options(scratch.path())).unwrap();
    for i in 1..=1_000 {
        sink.push(line(i).as_bytes());
    }
    wait_for(Duration::from_secs(10), "first lines written", &sink, |s| {
        s.written_lines == 1_000
    });

    let frozen = require!(fs.freeze());
    let total = 30_000;
    for i in 1_001..=total {
        sink.push(line(i).as_bytes());
    }
    wait_for(Duration::from_secs(10), "the stall to show", &sink, |s| {
        s.stalled_since.is_some()
    });
    let writer_pid = sink.stats().writer_pid.expect("a writer runs");

    let deadline = Duration::from_secs(2);
    let started = Instant::now();
    let report = sink.finish(deadline);
    let took = started.elapsed();
    assert!(
        took < deadline + Duration::from_secs(1),
        "finish took {took:?}"
    );
    assert!(took >= deadline, "finish gave up early: {took:?}");
    let undelivered = report.undelivered.clone().expect("lines were left over");
    assert_eq!(undelivered.path, undelivered_path);
    assert_eq!(undelivered.save_error, None);
    assert_eq!(undelivered.lines, total - report.written_lines);
    assert_eq!(undelivered.saved_lines, undelivered.lines);
    assert_eq!(report.abandoned_writer_pid, Some(writer_pid));
    let message = report.message().unwrap();
    assert!(
        message.contains(&format!(
            "{} lines could not be written to {}",
            undelivered.lines,
            dest.display()
        )) && message.contains("does not respond")
            && message.contains(&undelivered_path.display().to_string()),
        "{message}"
    );
    eprintln!("{message}");

    frozen.thaw().unwrap();
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
            is_dead(writer_pid)
        }),
        "the abandoned writer {writer_pid} did not die after the thaw"
    );
    let acked = report.written_lines;
    let in_dest = assert_run(&lines_of(&dest), 1, "destination");
    let saved = assert_run(&lines_of(&undelivered_path), acked + 1, "undelivered file");
    assert!(
        in_dest >= acked,
        "acknowledged lines missing from the destination"
    );
    assert_eq!(acked + saved, total);
    eprintln!(
        "acknowledged {acked}, in destination {in_dest}, undelivered {saved} (overlap {})",
        in_dest - acked
    );
}

#[test]
fn small_memory_limit_spills_to_disk_and_replays_in_order() {
    let fs = require!(LoopExt4::new(64));
    let scratch = tempfile::tempdir().unwrap();
    let dest = fs.path().join("log.txt");
    let memory_limit = 64 << 10;
    let sink = LogSink::open(
        &dest,
        LogSinkOptions {
            memory_limit,
            ..options(scratch.path())
        },
    )
    .unwrap();
    sink.push(line(1).as_bytes());
    wait_for(Duration::from_secs(10), "line 1 written", &sink, |s| {
        s.written_lines == 1
    });

    let frozen = require!(fs.freeze());
    let total: u64 = 200_000;
    for i in 2..=total {
        sink.push(line(i).as_bytes());
    }
    wait_for(
        Duration::from_secs(20),
        "the hand-off to drain",
        &sink,
        |s| s.in_memory_lines + s.spilled_lines + s.written_lines == total,
    );
    // Memory holds the limit plus what is in flight: the stage buffer (256 KiB), the pipe (1 MiB) and the batch
    // the stuck writer read (1 MiB). The lines just handed off may stand above that for a moment while the spill
    // catches up (a loaded CI host once saw 2.9 MB right after the hand-off); it must come back under.
    let bound = memory_limit as u64 + (256 << 10) + (2 << 20) + (64 << 10);
    wait_for(
        Duration::from_secs(20),
        "memory back under its bound",
        &sink,
        |s| s.in_memory_bytes <= bound,
    );
    let during = sink.stats();
    eprintln!("while frozen: {during:?}");
    assert!(during.spilled_lines > 100_000, "{during:?}");
    assert_eq!(during.dropped_lines, 0);

    frozen.thaw().unwrap();
    wait_for(Duration::from_secs(60), "every line written", &sink, |s| {
        s.written_lines == total
    });
    let after = sink.stats();
    assert_eq!(after.spilled_lines, 0);
    assert!(after.spilled_total_lines >= during.spilled_lines);
    let report = sink.finish(Duration::from_secs(10));
    assert!(report.is_complete(), "{report:?}");
    assert_eq!(assert_run(&lines_of(&dest), 1, "destination"), total);
}

/// Fills `dir` with one file until the filesystem has no room left.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f =
        std::fs::File::create(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    let block = vec![0u8; 64 << 10];
    loop {
        match f.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", dir.display()),
        }
    }
    drop(f);
    path
}

/// A destination that fills up: the writer dies, is restarted, dies again; the error is reported and lines are
/// kept; once there is room again, a retried writer delivers them in order. A line being written when the disk
/// filled may appear twice (part of it, then all of it), as documented.
#[test]
fn full_destination_is_reported_and_recovers_when_space_returns() {
    let fs = require!(LoopExt4::new(16));
    let scratch = tempfile::tempdir().unwrap();
    let dest = fs.path().join("log.txt");
    let filler = fill(fs.path());
    let sink = LogSink::open(
        &dest,
        LogSinkOptions {
            retry_after: Duration::from_millis(300),
            ..options(scratch.path())
        },
    )
    .unwrap();
    let total: u64 = 20_000;
    for i in 1..=total {
        sink.push(line(i).as_bytes());
    }
    wait_for(Duration::from_secs(10), "the writer to fail", &sink, |s| {
        s.writer_restarts >= 1 && s.writer_error.is_some()
    });
    let failing = sink.stats();
    let error = failing.writer_error.clone().unwrap();
    assert!(error.contains("No space left on device"), "{error}");
    assert!(failing.written_lines < total);

    std::fs::remove_file(&filler).unwrap();
    wait_for(Duration::from_secs(20), "every line written", &sink, |s| {
        s.written_lines == total
    });
    assert_eq!(sink.stats().writer_error, None);
    let report = sink.finish(Duration::from_secs(10));
    assert!(report.is_complete(), "{report:?}");

    let mut next = 1u64;
    for l in lines_of(&dest) {
        let want = line(next);
        if l == want || (l.ends_with(&want) && l.len() > want.len()) {
            next += 1;
        } else {
            let seq: u64 = l[..8]
                .parse()
                .unwrap_or_else(|_| panic!("garbled line {l:?}"));
            assert!(seq < next, "line {seq} before {next}");
            assert_eq!(l, line(seq), "a repeated line must be whole");
        }
    }
    assert_eq!(next - 1, total, "lines missing");
}
