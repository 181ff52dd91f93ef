//! Prints what encoding the agent's metrics costs for 64 and 1024 ranks (time and size), and what one tick's
//! update of every rank costs. Numbers, not assertions: `cargo bench -p hangwatch-metrics`.

use std::time::{Duration, Instant};

use hangwatch_metrics::{AgentMetrics, RankState, StallState, ThresholdBasis};

fn tick(m: &AgentMetrics, ranks: u32, t: u64) {
    for rank in 0..ranks {
        m.set_rank(
            rank,
            Duration::from_millis(t + u64::from(rank)),
            RankState::Healthy,
        );
    }
    m.set_stall(StallState::Healthy, Duration::from_millis(t));
    m.set_thresholds(
        Duration::from_secs(60),
        Duration::from_secs(120),
        Some(ThresholdBasis::Learned),
    );
    m.set_job(ranks as usize, Duration::from_millis(t));
}

fn main() {
    for ranks in [64u32, 1024] {
        let m = AgentMetrics::new("1234567", "gpu-node-017");
        tick(&m, ranks, 0);
        let rounds = 200u32;
        let started = Instant::now();
        for t in 0..u64::from(rounds) {
            tick(&m, ranks, t);
        }
        let per_tick = started.elapsed() / rounds;
        let started = Instant::now();
        let mut size = 0;
        for _ in 0..20 {
            size = m.encode().len();
        }
        let per_encode = started.elapsed() / 20;
        println!(
            "{ranks:>5} ranks: update per tick {:>8.1} us, encode {:>8.2} ms, {:>7} bytes ({} KiB)",
            per_tick.as_secs_f64() * 1e6,
            per_encode.as_secs_f64() * 1e3,
            size,
            size / 1024
        );
    }
}
