//! Kernel-log lines since the job started, kept for the evidence bundle: a thread reads /dev/kmsg from its end
//! (reading /dev/kmsg never touches a watched filesystem) and keeps the newest lines in memory; and which of them
//! the evidence may hold ([`KernelLogKeeping`]): a root watcher of another user's job hands that user only the lines
//! about their job (`hangwatch_kmsg::scope`).

use std::collections::VecDeque;
use std::io::Read;
use std::sync::{Arc, Mutex};

const KEEP_LINES: usize = 20_000;

/// The collected lines, shared with the reader thread.
#[derive(Debug, Default, Clone)]
pub struct KernelLog {
    lines: Arc<Mutex<VecDeque<String>>>,
    /// Why the kernel log could not be read, if it could not.
    pub unavailable: Option<String>,
    /// Which lines the evidence keeps.
    pub keeping: KernelLogKeeping,
}

/// Which kernel-log lines the evidence keeps (`run --kernel-log job|all`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelLogScope {
    /// The lines that concern the job (`hangwatch_kmsg::lines_of_job`).
    Job,
    /// Every line since the job started.
    All,
}

/// What the evidence does with the kernel log, decided when the run starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KernelLogKeeping {
    /// Every line in `kernel-log.txt`.
    #[default]
    All,
    /// Only the lines about the job in `kernel-log.txt` (its user: `uid`, when known); with `keep_whole`, every
    /// line in [`ROOT_KERNEL_LOG`] beside it, readable by hangwatch's user alone.
    Job { uid: Option<u32>, keep_whole: bool },
}

/// The whole kernel log of a run that kept only the job's lines, when the site asks (`--keep-kernel-log`): mode
/// 0600, hangwatch's (root's), never to be handed to the job's owner.
pub const ROOT_KERNEL_LOG: &str = "kernel-log.root.txt";

impl KernelLogKeeping {
    /// Decides it. `scope` as asked (`None`: by default); `own_euid` hangwatch's; `attached_uids` the effective
    /// uid of each process `run --attach` was given (`None`: unreadable), empty when hangwatch started the job
    /// (its ranks are its own user's). By default a watcher run as root for processes that are not all root's (the
    /// node service's) keeps the job's lines; anything else keeps every line: a user who is not root reads
    /// `/dev/kmsg` only where every user may (`kernel.dmesg_restrict=0`).
    pub fn decide(
        scope: Option<KernelLogScope>,
        keep_whole: bool,
        own_euid: u32,
        attached_uids: &[Option<u32>],
    ) -> KernelLogKeeping {
        let mut uids: Vec<u32> = attached_uids.iter().flatten().copied().collect();
        uids.sort_unstable();
        uids.dedup();
        let uid = match (uids.as_slice(), attached_uids.is_empty()) {
            ([only], _) => Some(*only),
            (_, true) => Some(own_euid),
            _ => None,
        };
        let someone_elses = attached_uids.iter().any(|u| *u != Some(own_euid));
        let scope = scope.unwrap_or(if own_euid == 0 && someone_elses {
            KernelLogScope::Job
        } else {
            KernelLogScope::All
        });
        match scope {
            KernelLogScope::All => KernelLogKeeping::All,
            KernelLogScope::Job => KernelLogKeeping::Job { uid, keep_whole },
        }
    }
}

impl KernelLog {
    /// Starts following `/dev/kmsg` from now on.
    pub fn follow() -> Self {
        let mut log = KernelLog::default();
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .open(hangwatch_kmsg::DEV_KMSG)
        {
            Ok(f) => f,
            Err(e) => {
                log.unavailable = Some(format!(
                    "cannot read {}: {e} (run as root, or set kernel.dmesg_restrict=0)",
                    hangwatch_kmsg::DEV_KMSG
                ));
                return log;
            }
        };
        // SEEK_END on /dev/kmsg moves to the next record to come: only lines from the job's lifetime.
        let _ = std::io::Seek::seek(&mut &file, std::io::SeekFrom::End(0));
        let lines = Arc::clone(&log.lines);
        let spawned = std::thread::Builder::new()
            .name("hw-kmsg".into())
            .spawn(move || {
                let mut file = file;
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    match file.read(&mut buf) {
                        Ok(0) => return,
                        Ok(n) => {
                            let record = String::from_utf8_lossy(&buf[..n]).into_owned();
                            if let Ok(mut l) = lines.lock() {
                                for line in record.lines() {
                                    if l.len() >= KEEP_LINES {
                                        l.pop_front();
                                    }
                                    l.push_back(line.to_string());
                                }
                            }
                        }
                        // EPIPE: records were overwritten before we read them; go on with the next ones.
                        Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => return,
                    }
                }
            });
        if let Err(e) = spawned {
            log.unavailable = Some(format!("cannot start the kernel-log reader: {e}"));
        }
        log
    }

    /// The kernel's OOM kill of `pid`, if the log has it: its `Killed process` line (without the record's
    /// prefix) and the memory cgroup whose limit was hit (from the `oom-kill:` summary before it).
    pub fn oom_kill_of(&self, pid: u32) -> Option<(String, Option<String>)> {
        let lines: Vec<String> = self
            .lines
            .lock()
            .ok()?
            .iter()
            .filter(|l| l.contains("Killed process ") || l.contains("oom-kill:"))
            .cloned()
            .collect();
        let report = hangwatch_kmsg::report_from_lines(
            lines.iter().map(String::as_str),
            &hangwatch_kmsg::ReportOptions::default(),
        );
        let kill = report.oom_kills.iter().find(|o| o.pid == pid)?;
        let memcg = lines
            .iter()
            .filter_map(|l| hangwatch_kmsg::parse_oom_constraint(l))
            .find(|c| c.pid == pid)
            .and_then(|c| c.oom_memcg.or(c.task_memcg));
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("Killed process {pid} ")))
            .map(|l| {
                // `6,1234,5678,-;Memory cgroup out of memory: Killed process 4242 (python) total-vm:...`: the
                // text up to the command's name.
                let text = l.split_once(';').map_or(l.as_str(), |(_, text)| text);
                let end = text
                    .find(&format!("Killed process {pid} ("))
                    .and_then(|at| text[at..].find(')').map(|close| at + close + 1))
                    .unwrap_or(text.len());
                text[..end].to_string()
            })
            .unwrap_or_else(|| format!("Killed process {pid} ({})", kill.comm));
        Some((line, memcg))
    }

    /// The lines so far, raw /dev/kmsg records.
    pub fn text(&self) -> String {
        self.lines
            .lock()
            .map(|l| l.iter().map(|s| format!("{s}\n")).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_watching_another_users_job_keeps_the_jobs_lines_by_default() {
        let decide = KernelLogKeeping::decide;
        // The node service's watcher: root, attached to uid 1001's tasks.
        assert_eq!(
            decide(None, false, 0, &[Some(1001), Some(1001)]),
            KernelLogKeeping::Job {
                uid: Some(1001),
                keep_whole: false
            }
        );
        // A task whose owner could not be read is not assumed to be root's.
        assert_eq!(
            decide(None, true, 0, &[None]),
            KernelLogKeeping::Job {
                uid: None,
                keep_whole: true
            }
        );
        // Root watching root's job, root running its own job, a user's run: every line.
        assert_eq!(decide(None, true, 0, &[Some(0)]), KernelLogKeeping::All);
        assert_eq!(decide(None, true, 0, &[]), KernelLogKeeping::All);
        assert_eq!(
            decide(None, false, 1001, &[Some(1001)]),
            KernelLogKeeping::All
        );
        // Asked for.
        assert_eq!(
            decide(Some(KernelLogScope::All), true, 0, &[Some(1001)]),
            KernelLogKeeping::All
        );
        assert_eq!(
            decide(Some(KernelLogScope::Job), false, 1001, &[]),
            KernelLogKeeping::Job {
                uid: Some(1001),
                keep_whole: false
            }
        );
    }
}
