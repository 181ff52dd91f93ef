//! Children that did not finish in time: abandoned, never waited for, and reaped once they exit.

use std::process::Child;
use std::time::{Duration, Instant};

/// A child that did not finish in time. It may be stuck in D state; poll [`AbandonedChild::try_reap`] later
/// instead of waiting for it.
#[derive(Debug)]
pub struct AbandonedChild {
    /// Taken by `Drop` for the orphan reaper.
    child: Option<Child>,
    /// When the child was started.
    pub started: Instant,
}

impl AbandonedChild {
    /// Wraps a child that was already sent SIGKILL and will not be waited for.
    pub fn new(child: Child, started: Instant) -> Self {
        Self {
            child: Some(child),
            started,
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Reaps the child if it has exited by now; `true` when it is gone.
    pub fn try_reap(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(Some(_)) | Err(_)),
            None => true,
        }
    }
}

/// Dropped, an abandoned child that has not exited yet goes to the orphan reaper: it is reaped when its call
/// returns (after a thaw), so a long job does not collect zombies, one per probe or stack read that timed out.
impl Drop for AbandonedChild {
    fn drop(&mut self) {
        if !self.try_reap() {
            if let Some(child) = self.child.take() {
                adopt_orphan(child);
            }
        }
    }
}

/// Children abandoned and not yet exited, polled by one reaper thread.
static ORPHANS: std::sync::Mutex<Vec<Child>> = std::sync::Mutex::new(Vec::new());

/// How often the orphan reaper looks: a child stuck in D exits only after a thaw, minutes later.
const ORPHAN_POLL: Duration = Duration::from_millis(500);

/// Hands `child` to the orphan reaper (started on first use). `waitpid` on its pid alone, so it never takes
/// another waiter's child.
fn adopt_orphan(child: Child) {
    static REAPER: std::sync::Once = std::sync::Once::new();
    ORPHANS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(child);
    REAPER.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("hw-orphans".into())
            .spawn(|| loop {
                std::thread::sleep(ORPHAN_POLL);
                ORPHANS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain_mut(|c| matches!(c.try_wait(), Ok(None)));
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the orphan reaper: abandoned children stay zombies until exit");
        }
    });
}

/// Abandoned children not reaped yet (they are still running, most likely stuck in D).
pub fn orphans_pending() -> usize {
    ORPHANS.lock().map_or(0, |o| o.len())
}
/// Reaps `child` if it exits within `bound` (one just signalled, or told to go), polling every few milliseconds;
/// `true` when it is gone. A child still there after `bound` (stuck in D) is left as it is, never waited for.
pub fn reap_within(child: &mut Child, bound: Duration, poll: Duration) -> bool {
    let until = Instant::now() + bound;
    loop {
        if !matches!(child.try_wait(), Ok(None)) {
            return true;
        }
        let now = Instant::now();
        if now >= until {
            return false;
        }
        std::thread::sleep(poll.min(until - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reap_within_reaps_a_child_that_exits_and_leaves_one_that_does_not() {
        let mut quick = std::process::Command::new("true").spawn().unwrap();
        assert!(reap_within(
            &mut quick,
            Duration::from_secs(5),
            Duration::from_millis(5)
        ));
        let mut slow = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let started = Instant::now();
        assert!(!reap_within(
            &mut slow,
            Duration::from_millis(50),
            Duration::from_millis(5)
        ));
        assert!(started.elapsed() < Duration::from_secs(3));
        let _ = slow.kill();
        assert!(reap_within(
            &mut slow,
            Duration::from_secs(5),
            Duration::from_millis(5)
        ));
    }
}
