//! The start of an attempt after a storage hang: before the job is started, the mounts that hung the last attempt
//! (the attempt record names them) are probed until they answer, so that no attempt is spent into a filesystem
//! that is still frozen. Every probe is an abandonable child under a deadline (hangwatch never blocks on the mount
//! it waits for); the wait is said every 30 s on stderr, in the job's Slurm comment and in a metric, and given up
//! after `--storage-wait` with [`EXIT_STORAGE_GAVE_UP`].

use std::time::{Duration, Instant};

use hangwatch_agent::human::say;
use hangwatch_inspect::probe::{ProbeOptions, Prober};
use hangwatch_model::format_duration;

/// Exit code of `run` when an attempt gave up waiting for the storage that hung the one before.
pub use hangwatch_model::exit::EXIT_STORAGE_GAVE_UP;

/// How often the mounts are probed while they do not answer.
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// How often the wait is said.
const SAY_EVERY: Duration = Duration::from_secs(30);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the wait came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageWait {
    /// Every mount answered (at once, or after `waited`).
    Answered { waited: Duration },
    /// `limit` passed with these mounts still silent.
    GaveUp { silent: Vec<String> },
}

/// The mounts among `results` (path, answered?) that did not answer. A path that is not there on this node is no
/// reason to wait: the job will say what it misses.
fn silent(results: &[(String, Option<bool>)]) -> Vec<String> {
    results
        .iter()
        .filter(|(_, answered)| *answered == Some(false))
        .map(|(m, _)| m.clone())
        .collect()
}

/// Probes `mounts` until they all answer or `limit` passes. `progress` is told what is still silent and for how
/// long, every 30 s (the Slurm comment, the metric).
pub fn wait_for_storage(
    mounts: &[String],
    limit: Duration,
    mut progress: impl FnMut(Option<&[String]>, Duration),
) -> StorageWait {
    let started = Instant::now();
    let mut prober = match Prober::new() {
        Ok(p) => p,
        Err(e) => {
            say(format!(
                "hangwatch: cannot probe {} before starting the job ({e}); starting it anyway",
                mounts.join(", ")
            ));
            return StorageWait::Answered {
                waited: Duration::ZERO,
            };
        }
    };
    let options = ProbeOptions {
        timeout: PROBE_TIMEOUT,
        write: true,
    };
    let mut last_said: Option<Instant> = None;
    loop {
        let results: Vec<(String, Option<bool>)> = mounts
            .iter()
            .zip(prober.probe_all(mounts, &options))
            .map(|(m, r)| (m.clone(), r.ok().and_then(|p| p.responsive)))
            .collect();
        let still = silent(&results);
        let waited = started.elapsed();
        if still.is_empty() {
            if last_said.is_some() {
                say(format!(
                    "hangwatch: {} answers again after {}: starting the job",
                    mounts.join(", "),
                    format_duration(waited)
                ));
                progress(None, waited);
            }
            return StorageWait::Answered { waited };
        }
        if waited >= limit {
            say(format!(
                "hangwatch: {} still does not answer after {} (--storage-wait): giving up (exit {EXIT_STORAGE_GAVE_UP})",
                still.join(", "),
                format_duration(waited)
            ));
            progress(None, waited);
            return StorageWait::GaveUp { silent: still };
        }
        if last_said.is_none_or(|t| t.elapsed() >= SAY_EVERY) {
            last_said = Some(Instant::now());
            say(format!(
                "hangwatch: waiting for the storage that hung the last attempt: {} does not answer (for {}; \
                 giving up after {}); the job starts once it does",
                still.join(", "),
                format_duration(waited),
                format_duration(limit)
            ));
            progress(Some(&still), waited);
        }
        std::thread::sleep(
            PROBE_EVERY
                .min(limit.saturating_sub(waited))
                .max(Duration::from_millis(100)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mounts_that_do_not_answer_are_waited_for() {
        let results = vec![
            ("/gpfs".to_string(), Some(false)),
            ("/home".to_string(), Some(true)),
            ("/not-here".to_string(), None),
        ];
        assert_eq!(silent(&results), vec!["/gpfs"]);
    }
}
