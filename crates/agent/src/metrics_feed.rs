//! Feeds the agent's Prometheus metrics ([`hangwatch_metrics::AgentMetrics`]) from what the supervision loop
//! knows, once per tick, and keeps the node_exporter textfile up to date from a worker whose writes are made by a
//! short-lived child (`hangwatch __write-textfile`), so that a textfile directory that does not answer can hold
//! neither the loop nor hangwatch's exit.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hangwatch_child::{AbandonedChild, ChildOutcome};
use hangwatch_diagnosis::Detector;
use hangwatch_inspect::probe::Prober;
use hangwatch_metrics::{AgentMetrics, Dropped, RankState, StallState, ThresholdBasis};

use crate::heartbeat::HeartbeatCounts;

/// What one update of the metrics reads, borrowed from the loop.
pub struct FeedInput<'a> {
    pub detector: &'a Detector,
    /// Since the job started, in the detector's time.
    pub now: Duration,
    /// Every rank of this node the loop knows of, and whether it has exited.
    pub ranks: Vec<(u32, bool)>,
    pub heartbeats: HeartbeatCounts,
    /// Progress the progress board had no room for.
    pub progress_dropped: u64,
    pub console_dropped: Option<u64>,
    /// Only looked at when free: a roll call may hold it.
    pub prober: &'a Mutex<Option<Prober>>,
}

/// One update: a few atomic stores per rank (no allocation beyond two small maps, no I/O, no waiting).
pub fn feed(metrics: &AgentMetrics, input: FeedInput<'_>) {
    let FeedInput {
        detector,
        now,
        ranks,
        heartbeats,
        progress_dropped,
        console_dropped,
        prober,
    } = input;
    let threshold = detector.threshold();
    let stalled_for = detector.stalled_for(now);
    metrics.set_stall(
        StallState::from(threshold.tier_of(stalled_for)),
        stalled_for,
    );
    metrics.set_thresholds(
        threshold.soft,
        threshold.hard,
        ThresholdBasis::from_detector(&threshold.basis),
    );

    let last: HashMap<u32, Duration> = detector
        .rank_progress()
        .filter_map(|(rank, at)| Some((rank?, at)))
        .collect();
    let mut known: HashMap<u32, bool> = last.keys().map(|r| (*r, false)).collect();
    for (rank, exited) in ranks {
        // A rank number can belong to an exited process and a live one (a launcher's rank found again).
        let entry = known.entry(rank).or_insert(exited);
        *entry &= exited;
    }
    let mut live = 0;
    for (&rank, &exited) in &known {
        let quiet = now.saturating_sub(last.get(&rank).copied().unwrap_or(detector.started()));
        let state = if exited {
            RankState::Exited
        } else {
            live += 1;
            RankState::from(threshold.tier_of(quiet))
        };
        metrics.set_rank(rank, quiet, state);
    }
    let keep: HashSet<u32> = known.keys().copied().collect();
    metrics.retain_ranks(|rank| keep.contains(&rank));
    metrics.set_job(live, now);

    metrics.set_dropped_total(Dropped::Beats, heartbeats.dropped_by_clients);
    metrics.set_dropped_total(Dropped::Phases, heartbeats.phases_dropped);
    metrics.set_dropped_total(Dropped::Progress, progress_dropped);
    metrics.set_dropped_total(Dropped::ConsoleLines, console_dropped.unwrap_or(0));
    let messages = crate::human::dropped(crate::human::Stream::Stdout)
        + crate::human::dropped(crate::human::Stream::Stderr);
    metrics.set_dropped_total(Dropped::Messages, messages);
    if let Ok(mut guard) = prober.try_lock() {
        if let Some(prober) = guard.as_mut() {
            metrics.set_probes_stuck(prober.outstanding().len());
        }
    }
}

/// How often the textfile is rewritten (node_exporter is scraped every 15-60 s).
pub const TEXTFILE_EVERY: Duration = Duration::from_secs(15);

/// How long one write may take before its child is abandoned.
const TEXTFILE_DEADLINE: Duration = Duration::from_secs(5);

/// An ended job's file is kept this long (its last state, `hangwatch_job_up 0`, stays visible), then the next
/// run that writes into the same directory removes it; as it does the file of an agent that was killed.
pub const TEXTFILE_KEEP_ENDED: Duration = Duration::from_secs(3600);

/// The worker that keeps `DIR/NAME.prom` up to date. Dropping it without [`TextfileExport::finish`] stops it
/// without a last write.
pub struct TextfileExport {
    stop: Option<Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TextfileExport {
    /// Writes now (removing hangwatch's files older than [`TEXTFILE_KEEP_ENDED`] first), then every `every`.
    /// `program` is hangwatch itself, run as `__write-textfile`.
    pub fn start(
        metrics: Arc<AgentMetrics>,
        program: PathBuf,
        dir: PathBuf,
        name: String,
        every: Duration,
    ) -> std::io::Result<Self> {
        let (stop, stopped) = channel::<()>();
        let thread = std::thread::Builder::new()
            .name("hw-textfile".into())
            .spawn(move || {
                let mut writer = TextfileWriter {
                    program,
                    dir,
                    name,
                    stuck: None,
                    warned: false,
                };
                writer.write(&metrics.encode(), Some(TEXTFILE_KEEP_ENDED));
                loop {
                    let last = match stopped.recv_timeout(every) {
                        Err(RecvTimeoutError::Timeout) => false,
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
                    };
                    writer.write(&metrics.encode(), None);
                    if last {
                        return;
                    }
                }
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Writes the last state (the caller has marked the job ended) and stops. Bounded by one write's deadline.
    pub fn finish(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TextfileExport {
    fn drop(&mut self) {
        // Stopping without the last write: the worker sees its channel gone, writes once more and returns; it is
        // not waited for.
        self.stop.take();
    }
}

struct TextfileWriter {
    program: PathBuf,
    dir: PathBuf,
    name: String,
    /// The child of a write that did not finish in time; while it lives no other is started (a directory that
    /// does not answer collects one stuck child, not one per write).
    stuck: Option<AbandonedChild>,
    warned: bool,
}

impl TextfileWriter {
    fn write(&mut self, text: &str, prune: Option<Duration>) {
        if let Some(child) = self.stuck.as_mut() {
            if !child.try_reap() {
                return;
            }
            self.stuck = None;
        }
        match write_in_child(&self.program, &self.dir, &self.name, text, prune) {
            Ok(()) => self.warned = false,
            Err(WriteFailure::TimedOut(child)) => {
                self.stuck = Some(child);
                self.warn(&format!(
                    "the metrics textfile directory {} did not answer within {:.0}s",
                    self.dir.display(),
                    TEXTFILE_DEADLINE.as_secs_f64()
                ));
            }
            Err(WriteFailure::Failed(why)) => self.warn(&why),
        }
    }

    /// Said once per run of failures, not every 15 s.
    fn warn(&mut self, why: &str) {
        tracing::warn!(dir = %self.dir.display(), reason = why, "metrics textfile not written");
        if !self.warned {
            self.warned = true;
            crate::human::say(format!(
                "hangwatch: warning: cannot write the metrics textfile into {}: {why}",
                self.dir.display()
            ));
        }
    }
}

enum WriteFailure {
    TimedOut(AbandonedChild),
    Failed(String),
}

/// `hangwatch __write-textfile DIR NAME [--prune-older-than SECS]` with `text` on its stdin (a memfd, never a
/// pipe the parent would have to feed).
fn write_in_child(
    program: &Path,
    dir: &Path,
    name: &str,
    text: &str,
    prune: Option<Duration>,
) -> Result<(), WriteFailure> {
    use std::io::{Seek, Write};
    let failed = |e: &dyn std::fmt::Display| WriteFailure::Failed(e.to_string());
    let fd = nix::sys::memfd::memfd_create(
        c"hangwatch-textfile",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    )
    .map_err(|e| failed(&e))?;
    let mut memfd = std::fs::File::from(fd);
    memfd.write_all(text.as_bytes()).map_err(|e| failed(&e))?;
    memfd.rewind().map_err(|e| failed(&e))?;
    let mut command = std::process::Command::new(program);
    command.arg("__write-textfile").arg(dir).arg(name);
    if let Some(age) = prune {
        command
            .arg("--prune-older-than")
            .arg(age.as_secs().to_string());
    }
    match hangwatch_child::run_with_deadline_and_input(
        command,
        std::process::Stdio::from(memfd),
        TEXTFILE_DEADLINE,
    ) {
        Ok(ChildOutcome::Finished { status, .. }) if status.success() => Ok(()),
        Ok(ChildOutcome::Finished { stderr, .. }) => Err(WriteFailure::Failed(
            String::from_utf8_lossy(&stderr).trim().to_string(),
        )),
        Ok(ChildOutcome::TimedOut { child, .. }) => Err(WriteFailure::TimedOut(child)),
        Err(e) => Err(failed(&e)),
    }
}

/// The `__write-textfile` child: the text on `input`, written as `dir/name.prom`; hangwatch's files older than
/// `prune` removed first.
pub fn textfile_child_main(
    dir: &Path,
    name: &str,
    prune: Option<Duration>,
    mut input: impl std::io::Read,
) -> Result<PathBuf, String> {
    let mut text = String::new();
    input
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read the metrics on stdin: {e}"))?;
    if let Some(age) = prune {
        match hangwatch_metrics::prune_textfiles(dir, age, std::time::SystemTime::now()) {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!(count = removed.len(), "removed old metrics textfiles")
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "cannot prune old metrics textfiles"),
        }
    }
    hangwatch_metrics::write_textfile(dir, name, &text)
        .map_err(|e| hangwatch_model::error_chain(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_diagnosis::{DetectorConfig, ProgressSource};

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    #[test]
    fn ranks_states_thresholds_and_drops_come_from_the_loop_s_state() {
        let mut detector = Detector::new(
            DetectorConfig {
                fixed: Some(s(4.0)),
                ..DetectorConfig::default()
            },
            s(0.0),
        );
        detector.progress(Some(1), ProgressSource::Heartbeat, s(6.5));
        detector.progress(Some(0), ProgressSource::Heartbeat, s(9.0));
        let metrics = AgentMetrics::new("j", "n");
        let prober = Mutex::new(None);
        let counts = HeartbeatCounts {
            received: 10,
            malformed: 0,
            dropped_by_clients: 3,
            rejected: crate::heartbeat::RejectedCounts {
                not_in_job: 0,
                wrong_rank: 0,
                no_credentials: 0,
            },
            phases_dropped: 0,
        };
        feed(
            &metrics,
            FeedInput {
                detector: &detector,
                now: s(10.0),
                ranks: vec![(0, false), (1, false), (2, true)],
                heartbeats: counts,
                progress_dropped: 0,
                console_dropped: Some(2),
                prober: &prober,
            },
        );
        let t = metrics.encode();
        for line in [
            "hangwatch_rank_seconds_since_progress{job_id=\"j\",node=\"n\",rank=\"0\"} 1.0",
            "hangwatch_rank_seconds_since_progress{job_id=\"j\",node=\"n\",rank=\"1\"} 3.5",
            "hangwatch_rank_state{job_id=\"j\",node=\"n\",rank=\"0\",state=\"healthy\"} 1",
            "hangwatch_rank_state{job_id=\"j\",node=\"n\",rank=\"1\",state=\"suspected\"} 1",
            "hangwatch_rank_state{job_id=\"j\",node=\"n\",rank=\"2\",state=\"exited\"} 1",
            "hangwatch_stall_state{job_id=\"j\",node=\"n\",state=\"healthy\"} 1",
            "hangwatch_threshold_seconds{job_id=\"j\",node=\"n\",tier=\"soft\"} 2.0",
            "hangwatch_threshold_basis{job_id=\"j\",node=\"n\",basis=\"fixed\"} 1",
            "hangwatch_job_ranks{job_id=\"j\",node=\"n\"} 2",
            "hangwatch_dropped_total{job_id=\"j\",node=\"n\",what=\"beats\"} 3",
            "hangwatch_dropped_total{job_id=\"j\",node=\"n\",what=\"console_lines\"} 2",
        ] {
            assert!(t.lines().any(|l| l == line), "no {line:?} in\n{t}");
        }
    }

    #[test]
    fn the_child_writes_the_file_from_its_input() {
        let dir = tempfile::tempdir().unwrap();
        let path = textfile_child_main(
            dir.path(),
            "hangwatch_1_n",
            Some(TEXTFILE_KEEP_ENDED),
            "a 1\n".as_bytes(),
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(path).unwrap(), "a 1\n");
    }
}
