//! System test of the job's log through `hangwatch run`: the log file's filesystem freezes for 10 s while a rank
//! prints 100,000 lines; the rank never blocks and every line arrives, in order, after the thaw.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hangwatch_testkit::{require, wait_until, LoopExt4};

#[test]
fn hundred_thousand_lines_survive_a_ten_second_freeze_in_order() {
    const LINES: usize = 100_000;
    let fs = require!(LoopExt4::new(128));
    let log = fs.path().join("job.log");
    let work = tempfile::tempdir().unwrap();
    let stats = work.path().join("stats.json");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/python/flood.py");
    let hw = Command::new(env!("CARGO_BIN_EXE_hangwatch"))
        .args(["run", "--quiet", "--stall-after", "5m", "--log-file"])
        .arg(&log)
        .arg("--report-dir")
        .arg(work.path().join("report"))
        .args(["--", "python3", script, &LINES.to_string(), "6000"])
        .arg(&stats)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut hw = Interrupt(hw);

    assert!(
        wait_until(Duration::from_secs(30), Duration::from_millis(20), || {
            std::fs::metadata(&log)
                .map(|m| m.len() > 10_000)
                .unwrap_or(false)
        }),
        "the log never started to fill"
    );
    let frozen = require!(fs.freeze());
    let froze_at = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    drop(frozen);
    let thawed_after = froze_at.elapsed();

    let status = loop {
        if let Some(status) = hw.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            froze_at.elapsed() < Duration::from_secs(90),
            "hangwatch run did not finish"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::io::read_to_string(hw.0.stderr.take().unwrap()).unwrap_or_default();
    assert!(status.success(), "run failed: {status:?}\n{stderr}");

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), LINES, "lines in the log after the thaw");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(
            *line,
            format!("line {i}"),
            "line {i} out of order or damaged"
        );
    }
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    eprintln!("frozen for {thawed_after:?}; rank's print+flush latency: {stats}");
    let p99 = stats["p99_us"].as_f64().unwrap();
    assert!(
        p99 < 5_000.0,
        "a rank blocked on its own output: p99 {p99} us"
    );
    let seconds = stats["seconds"].as_f64().unwrap();
    assert!(
        seconds < 40.0,
        "printing 100,000 lines took {seconds} s: the rank was held up by the freeze"
    );
}

/// Interrupts hangwatch (it ends its job) and reaps it if the test fails before hangwatch exits.
struct Interrupt(std::process::Child);

impl Drop for Interrupt {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        );
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
