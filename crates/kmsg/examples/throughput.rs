//! Measures how fast a kernel log is read into a report: `cargo run --release -p hangwatch-kmsg --example
//! throughput -- FILE [REPEAT]` (REPEAT concatenates the file, default 100).

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: throughput FILE [REPEAT]")?;
    let repeat: usize = args.next().map(|r| r.parse()).transpose()?.unwrap_or(100);
    let text = std::fs::read_to_string(&path)?.repeat(repeat);
    let start = Instant::now();
    let report = hangwatch_kmsg::report_from_text(&text);
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "{} lines, {:.1} MB in {:.3} s: {:.0} lines/s; {} hung-task reports",
        report.lines,
        text.len() as f64 / 1e6,
        elapsed,
        report.lines as f64 / elapsed,
        report.hung_task_reports
    );
    Ok(())
}
