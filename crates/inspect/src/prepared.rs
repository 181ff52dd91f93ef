//! Stack readers kept ready between roll calls: serving children (`__inspect-child --serve`) that found each
//! rank's interpreter and parsed its symbols while the job was healthy, so that a roll call reads only the stacks.
//!
//! Preparing is most of a cold stack read (~7 ms a process, the interpreter binary parsed); a prepared read is a
//! few hundred microseconds. The children are the same throwaway kind as a cold read's: a child that stops
//! answering (stuck on a rank's memory-map lock) is abandoned, and what it did not read is read by fresh ones.
//!
//! One thread owns the children (`hw-stacks`); the agent's loop only sends it the current rank pids, and a roll
//! call worker asks it for a read and waits for the answer.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use crate::pystack::{
    read_python_processes, read_with, report_with_error, Reader, ServeRequest, StackReadOptions,
    StackReadOutcome,
};

/// Fewer ranks than this per serving child is a waste of a child (each holds its readers' memory).
const MIN_PIDS_PER_CHILD: usize = 4;

/// A rank whose reader could not be prepared (its interpreter not up yet) is tried again after this long...
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// ...this many times in all.
const MAX_PREPARES: u32 = 6;

/// A child that stopped answering is replaced no sooner than this (its ranks may be stuck in the kernel; a new
/// child would get stuck the same way).
const REPLACE_AFTER: Duration = Duration::from_secs(10);

/// Handle on the thread that keeps the readers; cheap to clone.
#[derive(Clone, Debug)]
pub struct PreparedStacks {
    commands: Sender<Command>,
}

enum Command {
    Prepare(Vec<i32>),
    Read {
        pids: Vec<i32>,
        options: StackReadOptions,
        reply: Sender<StackReadOutcome>,
    },
}

impl PreparedStacks {
    /// Starts the thread that keeps readers, in at most `max_children` children of `program`.
    pub fn start(program: PathBuf, max_children: usize) -> std::io::Result<Self> {
        let (commands, received) = mpsc::channel();
        let pool = Pool {
            program,
            max_children: max_children.max(1),
            children: Vec::new(),
            wanted: Vec::new(),
            lost_at: None,
        };
        std::thread::Builder::new()
            .name("hw-stacks".into())
            .spawn(move || pool.run(received))?;
        Ok(Self { commands })
    }

    /// Keeps readers of exactly `pids` ready (never blocks: the work is done by the readers' thread).
    pub fn prepare(&self, pids: &[i32]) {
        let _ = self.commands.send(Command::Prepare(pids.to_vec()));
    }

    /// Reads the stacks of `pids`, with the prepared readers where there are; throwaway children read the rest.
    pub fn read(&self, pids: &[i32], options: &StackReadOptions) -> StackReadOutcome {
        let (reply, answer) = mpsc::channel();
        let sent = self.commands.send(Command::Read {
            pids: pids.to_vec(),
            options: options.clone(),
            reply,
        });
        if sent.is_err() {
            return read_python_processes(pids, options);
        }
        // The readers' thread keeps the read's own deadlines; this one only guards against that thread being gone.
        match answer.recv_timeout(options.total_timeout + Duration::from_secs(1)) {
            Ok(outcome) => outcome,
            Err(_) => read_python_processes(pids, options),
        }
    }
}

/// The readers' thread's state.
struct Pool {
    program: PathBuf,
    max_children: usize,
    children: Vec<Reader>,
    /// The pids to keep readers of, sorted.
    wanted: Vec<i32>,
    /// When a child was last given up on.
    lost_at: Option<Instant>,
}

impl Pool {
    fn run(mut self, commands: mpsc::Receiver<Command>) {
        let mut last_tend = Instant::now();
        loop {
            // Tended once a second even while commands keep coming (a caller that reads every 500 ms).
            if last_tend.elapsed() >= Duration::from_secs(1) {
                last_tend = Instant::now();
                self.tend();
            }
            match commands.recv_timeout(Duration::from_secs(1)) {
                Ok(Command::Prepare(pids)) => {
                    let mut pids = pids;
                    pids.sort_unstable();
                    pids.dedup();
                    if pids != self.wanted {
                        self.wanted = pids;
                        self.assign();
                    }
                }
                Ok(Command::Read {
                    pids,
                    options,
                    reply,
                }) => {
                    let outcome = self.read(&pids, &options);
                    let _ = reply.send(outcome);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        // The agent is exiting: dropping the children closes their stdin, and they exit when they next read it.
    }

    /// Spreads the wanted pids over the children (starting or stopping children as needed) and asks each child
    /// whose share changed to prepare it.
    fn assign(&mut self) {
        let wanted = self.wanted.len();
        let count = if wanted == 0 {
            0
        } else {
            wanted.div_ceil(MIN_PIDS_PER_CHILD).min(self.max_children)
        };
        let share = wanted.div_ceil(count.max(1)).max(1);
        let shares: Vec<Vec<i32>> = self.wanted.chunks(share).map(<[i32]>::to_vec).collect();
        let mut children = std::mem::take(&mut self.children);
        // Children no longer needed are ended and handed to the orphan reaper (a dropped child would stay a zombie).
        for extra in children.drain(shares.len().min(children.len())..) {
            drop(extra.abandon());
        }
        for (i, pids) in shares.into_iter().enumerate() {
            let child = match children.get_mut(i) {
                Some(child) => child,
                None => match Reader::serve(&self.program) {
                    Ok(child) => {
                        children.push(child);
                        let Some(child) = children.last_mut() else {
                            break;
                        };
                        child
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start a stack reader; roll calls read cold");
                        break;
                    }
                },
            };
            if child.assigned != pids {
                if let Err(e) = child.send(&ServeRequest::Prepare { pids }) {
                    tracing::debug!(error = %e, "a stack reader did not take its pids");
                    child.eof = true;
                }
            }
        }
        self.children = self.keep_live(children);
    }

    /// Drops children that exited or were given up on (abandoned, so that they are reaped when they can be).
    fn keep_live(&mut self, children: Vec<Reader>) -> Vec<Reader> {
        let mut live = Vec::with_capacity(children.len());
        for child in children {
            if child.eof {
                self.lost_at = Some(Instant::now());
                drop(child.abandon());
            } else {
                live.push(child);
            }
        }
        live
    }

    /// Once a second: takes in what the children said, prepares again what could not be prepared yet
    /// (an interpreter still starting), and replaces children lost a while ago.
    fn tend(&mut self) {
        for child in &mut self.children {
            child.pump(Duration::ZERO);
            let failed = child.prepared.values().any(Option::is_some);
            let due = child
                .last_prepare
                .is_none_or(|at| at.elapsed() >= RETRY_AFTER);
            if failed && due && child.preparing.is_empty() && child.prepares < MAX_PREPARES {
                let pids = child.assigned.clone();
                if child.send(&ServeRequest::Prepare { pids }).is_err() {
                    child.eof = true;
                }
            }
        }
        let children = std::mem::take(&mut self.children);
        self.children = self.keep_live(children);
        let covered: usize = self.children.iter().map(|c| c.assigned.len()).sum();
        let replace_due = self.lost_at.is_none_or(|at| at.elapsed() >= REPLACE_AFTER);
        if covered < self.wanted.len() && replace_due {
            self.lost_at = None;
            // Re-spread from scratch: the surviving children keep what they prepared for pids they still get.
            for child in &mut self.children {
                child.assigned.clear();
            }
            self.assign();
        }
    }

    fn read(&mut self, pids: &[i32], options: &StackReadOptions) -> StackReadOutcome {
        let requested: HashSet<i32> = pids.iter().copied().collect();
        let mut outcome = StackReadOutcome::default();
        let mut asked = Vec::new();
        let mut idle = Vec::new();
        for mut child in std::mem::take(&mut self.children) {
            child.pump(Duration::ZERO);
            // Still preparing after a whole per-pid timeout: stuck on a rank; its pids are read cold.
            let stuck = !child.preparing.is_empty() && child.idle_for() >= options.per_pid_timeout;
            if child.eof || stuck {
                self.lost_at = Some(Instant::now());
                let (on, _, abandoned) = child.abandon();
                if let Some((pid, step)) = on.filter(|(pid, _)| requested.contains(pid)) {
                    let why = format!(
                        "{step} did not return (the process's memory map is probably locked by a thread stuck \
                         on a frozen filesystem)"
                    );
                    outcome.reports.insert(pid, report_with_error(pid, why));
                }
                outcome.abandoned.push(abandoned);
                continue;
            }
            let share: Vec<i32> = pids
                .iter()
                .copied()
                .filter(|p| child.assigned.contains(p) && !outcome.reports.contains_key(p))
                .collect();
            if share.is_empty() {
                idle.push(child);
                continue;
            }
            match child.send(&ServeRequest::Read { pids: share }) {
                Ok(()) => asked.push(child),
                Err(_) => {
                    self.lost_at = Some(Instant::now());
                    outcome.abandoned.push(child.abandon().2);
                }
            }
        }
        let rest: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|p| !outcome.reports.contains_key(p))
            .collect();
        let asked_count = asked.len();
        let (read, kept) = read_with(&rest, options, true, asked);
        outcome.reports.extend(read.reports);
        outcome.abandoned.extend(read.abandoned);
        outcome.by_prepared = read.by_prepared;
        if kept.len() < asked_count {
            self.lost_at = Some(Instant::now());
        }
        self.children = idle;
        self.children.extend(kept);
        self.children.sort_by_key(|c| c.assigned.first().copied());
        outcome
    }
}
