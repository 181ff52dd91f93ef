//! Kernel-log lines since the job started, kept for the evidence bundle: a thread reads /dev/kmsg from its end
//! (reading /dev/kmsg never touches a watched filesystem) and keeps the newest lines in memory.

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
