//! The kit every hangwatch system test stands on: filesystems that really hang (a frozen loop-mounted ext4, a
//! FUSE mount whose daemon is stopped), a PostgreSQL server of the test's own ([`PostgresServer`]), Python rank
//! processes that step through a TCP barrier, cluster nodes emulated as network namespaces ([`TestNetwork`]), and
//! guards that clean all of it up when the test ends, panics, or is killed.
//!
//! Every guard cleans up in `Drop` without ever blocking forever (helpers run under deadlines; processes stuck
//! in D state are left rather than waited for). Fixtures that need root or missing tools return errors for which
//! [`TestkitError::skip_reason`] is `Some`; [`require!`] turns those into a skip.
//!
//! Recommended declaration order in a test (drops run in reverse: thaw, kill, unmount):
//! ```no_run
//! use hangwatch_testkit::{require, LoopExt4, RankGroup};
//! # fn t() {
//! let fs = require!(LoopExt4::new(32));
//! let ranks = require!(RankGroup::builder(4).log(0, fs.path().join("rank0.log")).spawn());
//! ranks.wait_all_for_step(2, std::time::Duration::from_secs(30)).unwrap();
//! let frozen = require!(fs.freeze());
//! // ... assert on the stuck job ...
//! # }
//! ```

mod cgroup;
mod cmd;
mod error;
mod fuse;
mod loop_ext4;
mod munge;
mod netns;
mod postgres;
mod procinfo;
mod ranks;
mod receiver;
mod throttle;
mod watchdog;

use std::time::{Duration, Instant};

pub use cgroup::MemoryCgroup;
pub use cmd::{run_tool, run_tool_unchecked, send, wait_with_deadline, ChildGuard, ToolOutput};
pub use error::{error_chain, strict_mode, Result, TestkitError};
pub use fuse::{FuseMount, SlowDaemon, StoppedDaemon};
pub use loop_ext4::{FrozenGuard, LoopExt4};
pub use munge::MungeDaemon;
pub use netns::TestNetwork;
pub use postgres::{PostgresServer, POSTGRES_USER};
pub use procinfo::{
    is_dead, is_mount_point, process_state, state_from_stat, task_states, wchan, TaskState,
};
pub use ranks::{
    python, rank_script, spawn_ranks, torch_python, Behaviour, MmapStallGroup, RankGroup,
    RankGroupBuilder, RankOptions, TORCH_VENV,
};
pub use receiver::AlertReceiver;
pub use throttle::ReadThrottle;

/// Polls `condition` every `poll` until it is true (returns `true`) or `timeout` passes (returns `false`).
pub fn wait_until(timeout: Duration, poll: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        let now = Instant::now();
        if now >= end {
            return false;
        }
        std::thread::sleep(poll.min(end - now));
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released).
pub fn free_tcp_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// `Ok(())` when running as root; otherwise the reason, ready to print as a skip message.
pub fn require_root() -> std::result::Result<(), String> {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        Ok(())
    } else {
        Err(format!(
            "needs root (running as uid {uid}): mounting, loop devices and fsfreeze are root-only"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_until_returns_as_soon_as_the_condition_holds() {
        let started = Instant::now();
        let mut calls = 0;
        assert!(wait_until(
            Duration::from_secs(5),
            Duration::from_millis(1),
            || {
                calls += 1;
                calls == 3
            }
        ));
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn wait_until_gives_up_at_the_timeout() {
        let started = Instant::now();
        assert!(!wait_until(
            Duration::from_millis(50),
            Duration::from_millis(10),
            || false
        ));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(50) && waited < Duration::from_secs(1),
            "{waited:?}"
        );
    }

    #[test]
    fn free_port_can_be_bound() {
        let port = free_tcp_port().unwrap();
        assert_ne!(port, 0);
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    }
}
