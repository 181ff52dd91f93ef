//! The roll call's extra cost for the socket next hop (`scripts/bench`, target < 10 ms at 64 ranks): 64 Python
//! ranks each blocked in recv() on a TCP connection to one server outside the job (a TCPStore-like rendezvous),
//! so every rank has a socket wait whose peer is looked for and observed. Measures `fill_socket_waits` alone
//! (one netlink dump for the namespace, the descriptor scan for the peer's owner, the peer observed) over the
//! observations the roll call would have made. Needs python3; prints `SOCKET_HOP_MEDIAN <ms> ms`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hangwatch_inspect::sockets::fill_socket_waits;
use hangwatch_proc::ProcFs;

const RANKS: usize = 64;
const REPEAT: usize = 15;

/// The server, then 64 ranks: each connects and waits in recv() for an answer that never comes.
const JOB: &str = r#"
import os, socket, sys, time
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(128)
port = server.getsockname()[1]
if os.fork() == 0:
    conns = []
    while True:
        conns.append(server.accept()[0])
ranks = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        s = socket.create_connection(("127.0.0.1", port))
        s.recv(1)
        os._exit(0)
    ranks.append(pid)
print(" ".join(map(str, ranks)), flush=True)
time.sleep(3600)
"#;

struct Job(Child);

impl Drop for Job {
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .args(["-KILL", "-g", &self.0.id().to_string()])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let mut child = {
        use std::os::unix::process::CommandExt;
        match Command::new("python3")
            .args(["-c", JOB, &RANKS.to_string()])
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                println!("SOCKET_HOP_SKIPPED python3: {e}");
                return;
            }
        }
    };
    let mut line = String::new();
    let stdout = child.stdout.take();
    let job = Job(child);
    if let Some(out) = stdout {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let pids: Vec<i32> = line
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert_eq!(pids.len(), RANKS, "the ranks started: {line:?}");
    std::thread::sleep(Duration::from_millis(500));
    let procfs = ProcFs::new("/proc");
    let clk = hangwatch_proc::clk_tck();
    let observed: Vec<_> = pids
        .iter()
        .filter_map(|&pid| procfs.observe_process(pid, Duration::ZERO, clk).ok())
        .collect();
    let mut times = Vec::with_capacity(REPEAT);
    let mut waits = 0;
    let mut peers = 0;
    for _ in 0..REPEAT {
        let mut obs = observed.clone();
        let started = Instant::now();
        fill_socket_waits(&procfs, &mut obs, Duration::from_millis(100), clk);
        times.push(started.elapsed());
        waits = obs.iter().map(|o| o.socket_waits.len()).sum();
        peers = obs
            .iter()
            .flat_map(|o| &o.socket_waits)
            .filter(|w| w.peer.as_ref().is_some_and(|p| p.pid != 0))
            .count();
    }
    times.sort();
    let median = times[REPEAT / 2];
    println!(
        "{RANKS} ranks, {waits} socket waits, {peers} peers found; fill_socket_waits over {REPEAT} runs: min {:.2} ms, \
         max {:.2} ms",
        times[0].as_secs_f64() * 1000.0,
        times[REPEAT - 1].as_secs_f64() * 1000.0
    );
    println!("SOCKET_HOP_MEDIAN {:.2} ms", median.as_secs_f64() * 1000.0);
    drop(job);
}
