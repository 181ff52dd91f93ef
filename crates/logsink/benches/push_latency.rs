//! Push latency of the log sink (p50/p99/p99.9/max) with the destination healthy and frozen (a loop-mounted ext4
//! under `fsfreeze`, root only), in bursts and at a steady pace.
//!
//! The writer child is hangwatch's `__log-writer`: build it first (`cargo build --release -p hangwatch`), or point
//! `HANGWATCH_BIN` at a hangwatch binary. Run with `cargo bench -p hangwatch-logsink --bench push_latency`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hangwatch_logsink::{LogSink, LogSinkOptions, WriterCommand};
use hangwatch_testkit::LoopExt4;

const LINES: u64 = 200_000;

fn hangwatch_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("HANGWATCH_BIN") {
        return p.into();
    }
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    for profile in ["release", "debug"] {
        let p = target.join(profile).join("hangwatch");
        if p.exists() {
            return p;
        }
    }
    eprintln!("no hangwatch binary: run `cargo build --release -p hangwatch` or set HANGWATCH_BIN");
    std::process::exit(2);
}

fn line(i: u64) -> Vec<u8> {
    format!(
        "[rank 3] {i:09} step {i} loss 0.{:04} lr 3e-4 tokens/s 51234\n",
        i % 10_000
    )
    .into_bytes()
}

#[derive(Clone, Copy)]
enum Pace {
    /// As fast as the loop goes.
    Burst,
    /// 1,000 lines every 10 ms (100,000 lines/s).
    Steady,
}

fn measure(sink: &LogSink, pace: Pace) -> Vec<Duration> {
    let lines: Vec<Vec<u8>> = (1..=LINES).map(line).collect();
    let mut lat = Vec::with_capacity(lines.len());
    let start = Instant::now();
    for (k, l) in lines.into_iter().enumerate() {
        if let Pace::Steady = pace {
            if k % 1_000 == 0 {
                let due = start + Duration::from_millis(10) * (k as u32 / 1_000);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
        }
        let t = Instant::now();
        sink.push_owned(l);
        lat.push(t.elapsed());
    }
    lat
}

fn print(label: &str, mut lat: Vec<Duration>) {
    lat.sort();
    let at = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    println!(
        "{label:<44} n={:<7} p50 {:>6.2} µs  p99 {:>7.2} µs  p99.9 {:>8.2} µs  max {:>9.2} µs",
        lat.len(),
        at(0.5),
        at(0.99),
        at(0.999),
        at(1.0)
    );
}

fn options(scratch: &Path, memory_limit: usize) -> LogSinkOptions {
    LogSinkOptions {
        writer: Some(WriterCommand::hangwatch(hangwatch_bin())),
        spill_dir: scratch.to_owned(),
        undelivered_path: scratch.join("undelivered.txt"),
        memory_limit,
        ..LogSinkOptions::default()
    }
}

fn healthy(scratch: &Path, pace: Pace, label: &str) {
    let dest = scratch.join(format!(
        "healthy-{}.log",
        label.replace(|c: char| !c.is_alphanumeric(), "-")
    ));
    let sink = LogSink::open(&dest, options(scratch, 64 << 20)).expect("open sink");
    let lat = measure(&sink, pace);
    let report = sink.finish(Duration::from_secs(60));
    assert!(report.is_complete(), "{report:?}");
    print(&format!("healthy destination, {label}"), lat);
}

fn frozen(scratch: &Path, pace: Pace, memory_limit: usize, label: &str) {
    let fs = match LoopExt4::new(64) {
        Ok(fs) => fs,
        Err(e) => {
            println!("frozen destination, {label}: skipped ({e})");
            return;
        }
    };
    let dest = fs.path().join("log.txt");
    let sink = LogSink::open(&dest, options(scratch, memory_limit)).expect("open sink");
    let frozen = fs.freeze().expect("freeze");
    let lat = measure(&sink, pace);
    let stats = sink.stats();
    frozen.thaw().expect("thaw");
    let report = sink.finish(Duration::from_secs(60));
    assert!(report.is_complete(), "{report:?}");
    print(&format!("frozen destination, {label}"), lat);
    println!(
        "{:<44} (written while frozen: {}, spilled: {})",
        "", stats.written_lines, stats.spilled_total_lines
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let scratch = tempfile::tempdir().expect("scratch dir");
    healthy(scratch.path(), Pace::Burst, "burst");
    healthy(scratch.path(), Pace::Steady, "100k lines/s");
    frozen(scratch.path(), Pace::Burst, 64 << 20, "burst");
    frozen(scratch.path(), Pace::Steady, 64 << 20, "100k lines/s");
    frozen(
        scratch.path(),
        Pace::Burst,
        1 << 20,
        "burst, 1 MiB memory (spills)",
    );
}
