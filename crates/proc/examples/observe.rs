//! Observes one live process the way a roll call does and prints the observation as JSON, with how long each
//! /proc sample took: `cargo run -p hangwatch-proc --example observe -- PID [INTERVAL_MS]`.

use std::time::{Duration, Instant};

use hangwatch_proc::{clk_tck, observe_process, ProcFs};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let pid: i32 = args
        .next()
        .ok_or("usage: observe PID [INTERVAL_MS]")?
        .parse()?;
    let interval = Duration::from_millis(args.next().map_or(Ok(200), |ms| ms.parse())?);
    let procfs = ProcFs::default();

    let started = Instant::now();
    let first = procfs.sample_process(pid)?;
    let first_took = started.elapsed();
    std::thread::sleep(interval);
    let second_started = Instant::now();
    let second = procfs.sample_process(pid)?;
    let second_took = second_started.elapsed();
    let elapsed = second_started.duration_since(started);
    let resolve_started = Instant::now();
    let mut resolver = procfs.file_resolver(pid);
    let observation = observe_process(&first, &second, elapsed, clk_tck(), |t| resolver.resolve(t));
    let resolve_took = resolve_started.elapsed();

    println!("{}", serde_json::to_string_pretty(&observation)?);
    eprintln!(
        "{} threads; sample 1: {:.2} ms, sample 2: {:.2} ms, merge + file resolution: {:.2} ms",
        second.threads.len(),
        first_took.as_secs_f64() * 1e3,
        second_took.as_secs_f64() * 1e3,
        resolve_took.as_secs_f64() * 1e3,
    );
    Ok(())
}
