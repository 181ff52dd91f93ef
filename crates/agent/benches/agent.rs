//! Two costs inside the agent, printed: how many heartbeat datagrams a second the receiver takes from a member
//! (credentials, membership, parsing, the progress board), and the CPU cost of one tick's metrics feed at 8, 64
//! and 1,024 ranks. Run with `cargo bench -p hangwatch-agent --bench agent`.

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hangwatch_agent::heartbeat::{self, HeartbeatContext, HeartbeatStats};
use hangwatch_agent::members::JobMembers;
use hangwatch_agent::metrics_feed::{feed, FeedInput};
use hangwatch_agent::progress::ProgressBoard;
use hangwatch_diagnosis::{Detector, DetectorConfig, ProgressSource};
use hangwatch_metrics::AgentMetrics;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    receiver_throughput();
    feed_cost();
}

/// 200,000 beats from this process, a member of the job, as fast as the socket takes them.
fn receiver_throughput() {
    let members = JobMembers::new();
    assert!(members.register_live(std::process::id() as i32, Some(0)));
    let dir = tempfile::tempdir().expect("a temporary directory");
    // Phases only go to the loop; beats go to the board.
    let (events, _rx) = std::sync::mpsc::sync_channel(1);
    let board = Arc::new(ProgressBoard::new());
    let socket = heartbeat::start(
        &dir.path().join("hb.sock"),
        HeartbeatContext {
            events,
            board: Arc::clone(&board),
            members: Arc::new(members),
            sink: None,
        },
    )
    .expect("the heartbeat socket");
    let client = UnixDatagram::unbound().expect("a client socket");
    client.set_nonblocking(true).expect("non-blocking");
    let n = 200_000u64;
    let started = Instant::now();
    let mut sent = 0;
    while sent < n {
        let msg = format!("hw1 beat 0 1 {} {}", sent + 1, sent);
        match client.send_to(msg.as_bytes(), socket.path()) {
            Ok(_) => sent += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => panic!("sending a beat: {e}"),
        }
    }
    let end = Instant::now() + Duration::from_secs(20);
    while socket.stats.received.load(Ordering::SeqCst) < n {
        assert!(Instant::now() < end, "the receiver never got {n} datagrams");
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = started.elapsed();
    println!(
        "heartbeat receiver: {n} beats in {:.2} s: {:.0} datagrams/s; the loop would take {} update(s)",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        board.take_updates().len()
    );
}

/// One metrics update per tick (every 200 ms), 500 ticks.
fn feed_cost() {
    let s = Duration::from_secs_f64;
    for ranks in [8u32, 64, 1024] {
        let mut detector = Detector::new(DetectorConfig::default(), s(0.0));
        for r in 0..ranks {
            detector.progress(Some(r), ProgressSource::Heartbeat, s(1.0));
        }
        let metrics = AgentMetrics::new("j", "n");
        let prober = Mutex::new(None);
        let counts = HeartbeatStats::default().counts();
        let rounds = 500u32;
        let started = Instant::now();
        for t in 0..rounds {
            feed(
                &metrics,
                FeedInput {
                    detector: &detector,
                    now: s(2.0 + f64::from(t) * 0.2),
                    ranks: (0..ranks).map(|r| (r, false)).collect(),
                    heartbeats: counts,
                    progress_dropped: 0,
                    console_dropped: Some(0),
                    prober: &prober,
                },
            );
        }
        let per_tick = started.elapsed() / rounds;
        println!(
            "metrics feed at {ranks:>5} ranks: {:.1} us per tick",
            per_tick.as_secs_f64() * 1e6
        );
    }
}
