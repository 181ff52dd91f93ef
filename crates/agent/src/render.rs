//! Human rendering of a verdict: the answer first, then the groups, the table, what to do and what was not seen.

use std::fmt::Write;

use std::time::Duration;

use hangwatch_model::{format_duration, Activity, Verdict, VerdictKind};

/// The words for a hold: no progress, but the ranks compute, so the job is not ended (agent and coordinator).
pub fn computing_text(
    stalled_for: Duration,
    activity: Option<&Activity>,
    max_stall: Option<Duration>,
) -> String {
    let work = activity.map_or("the ranks compute", |a| a.summary.as_str());
    let limit = match max_stall {
        Some(max) => format!(
            "; it is ended if the work stops, or at --max-stall {}",
            format_duration(max)
        ),
        None => String::new(),
    };
    format!(
        "no progress signal for {}; {work}: not ending it{limit} (docs/false-alarms.md)",
        format_duration(stalled_for)
    )
}

/// The words when the ranks that computed without progress stopped computing.
pub const WORK_STOPPED_TEXT: &str = "the ranks stopped computing and there is still no progress";

/// The words when `--max-stall` passed while the ranks computed.
pub fn max_stall_text(stalled_for: Duration) -> String {
    format!(
        "no progress for {} (--max-stall) although the ranks compute: ending the job",
        format_duration(stalled_for)
    )
}

pub use hangwatch_model::rank_ranges;

fn or_dash(v: Option<&str>) -> &str {
    v.unwrap_or("-")
}

/// The whole human report.
pub fn verdict_text(v: &Verdict) -> String {
    let mut s = String::new();
    let headline = match v.kind {
        VerdictKind::Unknown | VerdictKind::CollectiveHang => v.summary.clone(),
        _ => format!("{}: {}", v.kind.words(), v.summary),
    };
    let _ = writeln!(s, "{headline}");
    if let Some(stalled) = v.stalled_for_s {
        let _ = writeln!(s, "  progress stopped {stalled:.1}s ago");
    }
    if let Some(news) = v.recurrence.as_ref().and_then(|r| r.news()) {
        let _ = writeln!(s, "  {news} (hangwatch history)");
    }
    for c in &v.culprits {
        let who = match c.rank {
            Some(r) => format!("rank {r}"),
            None => format!("pid {}", c.pid),
        };
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{who}: pid {}{}, state {}{}",
            c.pid,
            thread_words(c),
            c.state,
            c.reason
                .as_deref()
                .map(|r| format!(" — {r}"))
                .unwrap_or_default()
        );
        if c.syscall.is_some() || c.wchan.is_some() {
            let _ = writeln!(
                s,
                "  kernel call: {}  wait channel: {}{}",
                c.syscall
                    .as_deref()
                    .map(|n| format!("{n}()"))
                    .unwrap_or_else(|| "-".into()),
                or_dash(c.wchan.as_deref()),
                c.not_running_for_ms
                    .map(|ms| format!("  (not running for {ms} ms)"))
                    .unwrap_or_default()
            );
        }
        if let Some(path) = &c.path {
            let what = if c.page_fault.is_some() {
                "memory-mapped file"
            } else {
                "file"
            };
            let fs = v.filesystems.iter().find(|f| {
                Some(&f.mount) == c.mount.as_ref() && (f.node.is_none() || f.node == c.node)
            });
            let answer = match fs.and_then(|f| f.responsive) {
                Some(false) => ", NOT RESPONDING",
                Some(true) => ", responds",
                None => "",
            };
            let _ = writeln!(
                s,
                "  {what}: {path}  on {} ({}{answer})",
                or_dash(c.mount.as_deref()),
                or_dash(c.fstype.as_deref())
            );
        }
        if let Some(fault) = c.page_fault.as_ref().filter(|f| f.candidates.len() > 1) {
            let _ = writeln!(
                s,
                "  memory-mapped files it may be faulting on ({} candidates):",
                fault.candidates.len()
            );
            for f in fault.candidates.iter().take(CANDIDATES_SHOWN) {
                let _ = writeln!(
                    s,
                    "    {}  on {} ({})",
                    f.path,
                    or_dash(f.mount.as_deref()),
                    or_dash(f.fstype.as_deref())
                );
            }
            if fault.candidates.len() > CANDIDATES_SHOWN {
                let _ = writeln!(
                    s,
                    "    ... {} more in verdict.json",
                    fault.candidates.len() - CANDIDATES_SHOWN
                );
            }
        }
        if let Some(k) = c.killable {
            let _ = writeln!(
                s,
                "  killable: {}",
                if k { "yes" } else { "no (uninterruptible)" }
            );
        }
        if c.threads.len() > 1 || c.deadlock.is_some() {
            let _ = writeln!(s, "  threads (those idle in a known pool left out):");
            for t in &c.threads {
                let _ = writeln!(s, "    {}", thread_place_words(t));
            }
        }
        if let Some(stack) = c.python_stack.as_ref().filter(|s| !s.is_empty()) {
            let _ = writeln!(s, "  python stack (innermost first):");
            for frame in stack.iter().take(12) {
                let _ = writeln!(s, "    {frame}");
            }
        }
        if let Some(stack) = c.kernel_stack.as_ref().filter(|s| !s.is_empty()) {
            let _ = writeln!(
                s,
                "  kernel stack: {}",
                stack
                    .iter()
                    .take(10)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" <- ")
            );
        }
        if let Some(tracer) = c.tracer_pid {
            let _ = writeln!(s, "  traced by pid {tracer}");
        }
        if let Some(death) = &c.death {
            death_text(&mut s, death);
        }
    }
    if !v.groups.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(s, "where the ranks are:");
        for g in &v.groups {
            let who = if g.ranks.is_empty() {
                format!(
                    "pids {}",
                    g.pids
                        .iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                format!("ranks {}", rank_ranges(&g.ranks))
            };
            let _ = writeln!(s, "  {:>4} x {} [{}]: {who}", g.size(), g.where_, g.state);
        }
    }
    if !v.filesystems.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(s, "filesystems:");
        for f in &v.filesystems {
            let answer = match f.responsive {
                Some(true) => "responds",
                Some(false) => "NOT RESPONDING",
                None => "unknown",
            };
            let _ = writeln!(
                s,
                "  {} ({}): {answer}{}",
                f.mount,
                or_dash(f.fstype.as_deref()),
                f.detail
                    .as_deref()
                    .map(|d| format!(" — {d}"))
                    .unwrap_or_default()
            );
        }
    }
    if !v.ranks.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<6} {:<8} {:<5} {:<40} {:<10} {:<24} FILE",
            "RANK", "PID", "STATE", "WHERE", "SYSCALL", "WCHAN"
        );
        for r in &v.ranks {
            let _ = writeln!(
                s,
                "{:<6} {:<8} {:<5} {:<40} {:<10} {:<24} {}",
                r.rank.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
                r.pid,
                r.state,
                truncate(&r.where_, 40),
                or_dash(r.syscall.as_deref()),
                truncate(or_dash(r.wchan.as_deref()), 24),
                or_dash(r.path.as_deref())
            );
        }
    }
    if !v.actions.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(s, "actions:");
        for a in &v.actions {
            let _ = writeln!(s, "  {}", action_line(a));
        }
    }
    if !v.recommendations.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(s, "what to do:");
        for r in &v.recommendations {
            let _ = writeln!(s, "  - {r}");
        }
    }
    if !v.warnings.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(s, "not seen (reads that failed or timed out):");
        for w in &v.warnings {
            let _ = writeln!(s, "  - {w}");
        }
    }
    s
}

/// How many candidate files of a page fault the text lists (the verdict JSON has them all).
const CANDIDATES_SHOWN: usize = 5;

/// " (thread ckpt-writer, tid 57)" for a culprit whose stuck thread is not its main thread.
fn thread_words(c: &hangwatch_model::Culprit) -> String {
    match (c.tid.filter(|t| *t != c.pid), &c.thread_name) {
        (Some(tid), Some(name)) => format!(" (thread {name}, tid {tid})"),
        (Some(tid), None) => format!(" (thread {tid})"),
        (None, _) => String::new(),
    }
}

/// "metrics-flusher (tid 101): S in futex() (futex_wait_queue) at flush (train.py:54); waits for a lock, held by
/// MainThread (by elimination)".
fn thread_place_words(t: &hangwatch_model::ThreadPlace) -> String {
    let name = t.name.as_deref().unwrap_or("a thread");
    let tid = t.tid.map(|tid| format!(" (tid {tid})")).unwrap_or_default();
    let call = t
        .syscall
        .as_deref()
        .map(|c| format!(" in {c}()"))
        .unwrap_or_default();
    let wchan = t
        .wchan
        .as_deref()
        .map(|w| format!(" ({w})"))
        .unwrap_or_default();
    let code = t
        .code
        .as_ref()
        .map(|c| format!(" at {} ({c})", c.function))
        .unwrap_or_default();
    let waits = t
        .waits_for
        .map(|w| format!("; {}", w.words()))
        .unwrap_or_default();
    let held = t
        .held_by
        .as_ref()
        .map(|h| {
            format!(
                ", held by {} (by elimination)",
                h.name.as_deref().unwrap_or("another thread")
            )
        })
        .unwrap_or_default();
    format!("{name}{tid}: {}{call}{wchan}{code}{waits}{held}", t.state)
}

/// One action in words: what became of the ranks it names ("terminate ranks 1-3: ended — ...", "unkillable
/// rank 0: could not be killed — ...").
pub fn action_line(a: &hangwatch_model::ActionRecord) -> String {
    let ranks = match a.ranks.as_slice() {
        [] => String::new(),
        many => format!(" {}", hangwatch_model::ranks_words(many)),
    };
    let result = match (a.action.as_str(), a.ok) {
        ("terminate", true) => "ended",
        ("unkillable", _) => "could not be killed",
        (_, true) => "ok",
        (_, false) => "FAILED",
    };
    format!(
        "{}{ranks}: {result}{}",
        a.action,
        a.detail
            .as_deref()
            .map(|d| format!(" — {d}"))
            .unwrap_or_default()
    )
}

/// How many of a dead rank's last lines the human text shows (the verdict JSON keeps more).
const DEATH_LINES: usize = 10;

/// A dead culprit's memory cgroup, OOM evidence, core and last lines (its cause is its reason, said above).
fn death_text(s: &mut String, d: &hangwatch_model::RankDeath) {
    // A cgroup without a limit, of a rank that was not OOM-killed, is no part of the story.
    let tells = d.oom_killed == Some(true) || d.memory_limit.is_some();
    if let Some(cgroup) = d.memory_cgroup.as_ref().filter(|_| tells) {
        let _ = writeln!(
            s,
            "  memory cgroup: {cgroup}{}, limit {}{}",
            d.cgroup_version
                .map(|v| format!(" (v{v})"))
                .unwrap_or_default(),
            d.memory_limit.as_deref().unwrap_or("none of its own"),
            d.cgroup_oom_kills
                .map(|n| format!(", {n} OOM kill(s) counted"))
                .unwrap_or_default()
        );
    }
    for evidence in &d.oom_evidence {
        let _ = writeln!(s, "  OOM: {evidence}");
    }
    if let Some(core) = &d.core_dump {
        let _ = writeln!(s, "  core: {core}");
    }
    if let Some(tail) = d.output_tail.as_ref().filter(|t| !t.is_empty()) {
        let _ = writeln!(s, "  last lines:");
        for line in tail.iter().skip(tail.len().saturating_sub(DEATH_LINES)) {
            let _ = writeln!(s, "    | {line}");
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use hangwatch_model::{
        ActionRecord, Culprit, FaultAccess, FaultFound, FileRef, FilesystemStatus, PageFault,
        RankPlace,
    };

    fn culprit_in_a_fault() -> Verdict {
        let mut v = Verdict::unknown("rank 0 is blocked");
        v.kind = VerdictKind::BlockedInKernel;
        let file = |p: &str| FileRef {
            filesystem: None,
            path: p.into(),
            mount: Some("/data".into()),
            fstype: Some("fuse.bindfs".into()),
            source: None,
        };
        v.culprits.push(Culprit {
            tid: Some(57),
            thread_name: Some("ckpt-writer".into()),
            page_fault: Some(PageFault {
                access: FaultAccess::Read,
                found_by: FaultFound::Candidates,
                candidates: vec![file("/data/a.arrow"), file("/data/b.arrow")],
                code: false,
                unreadable: None,
            }),
            ..Culprit::at(RankPlace {
                rank: Some(0),
                pid: 42,
                state: "D".into(),
                mount: Some("/data".into()),
                fstype: Some("fuse.bindfs".into()),
                ..Default::default()
            })
        });
        v.filesystems.push(FilesystemStatus {
            filesystem: None,
            mount: "/data".into(),
            node: None,
            fstype: Some("fuse.bindfs".into()),
            responsive: Some(false),
            detail: None,
        });
        v
    }

    #[test]
    fn the_stuck_thread_is_named_and_a_faults_candidates_listed() {
        let text = verdict_text(&culprit_in_a_fault());
        assert!(
            text.contains("\nrank 0: pid 42 (thread ckpt-writer, tid 57), state D\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "  memory-mapped files it may be faulting on (2 candidates):\n    /data/a.arrow  on /data \
                 (fuse.bindfs)\n    /data/b.arrow  on /data (fuse.bindfs)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_deadlock_inside_the_rank_is_said_and_its_threads_listed() {
        use hangwatch_model::{CodeLine, InRankDeadlock, ThreadPlace, ThreadRef, ThreadWait};
        let thread = |tid, name: &str, line, by: &str| ThreadPlace {
            tid: Some(tid),
            name: Some(name.into()),
            state: "S".into(),
            wchan: Some("futex_wait_queue".into()),
            syscall: Some("futex".into()),
            code: Some(CodeLine {
                function: "step".into(),
                file: "train.py".into(),
                line,
            }),
            waits_for: Some(ThreadWait::Lock),
            held_by: Some(ThreadRef {
                tid: None,
                name: Some(by.into()),
            }),
        };
        let threads = vec![
            thread(42, "MainThread", 71, "metrics-flusher"),
            thread(43, "metrics-flusher", 54, "MainThread"),
        ];
        let mut v = Verdict::unknown("rank 0 is the odd one out");
        v.kind = VerdictKind::Diverged;
        v.culprits.push(Culprit {
            deadlock: Some(InRankDeadlock {
                threads: threads.clone(),
                words: "a deadlock inside rank 0 is likely".into(),
            }),
            threads,
            ..Culprit::at(RankPlace {
                rank: Some(0),
                pid: 42,
                state: "S".into(),
                ..Default::default()
            })
        });
        let text = verdict_text(&v);
        assert!(
            text.contains(
                "  threads (those idle in a known pool left out):\n    \
                 MainThread (tid 42): S in futex() (futex_wait_queue) at step (train.py:71); waits for a lock, held \
                 by metrics-flusher (by elimination)\n    metrics-flusher (tid 43): S"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_termination_says_which_ranks_ended_and_which_could_not_be_killed() {
        let terminate = ActionRecord {
            action: "terminate".into(),
            ranks: vec![1, 2, 3],
            ok: true,
            detail: Some(
                "ranks 1-3 ended (3 by SIGTERM, 0 by SIGKILL) in 0.4s; rank 0 could not be killed"
                    .into(),
            ),
            outcomes: Vec::new(),
        };
        assert_eq!(
            action_line(&terminate),
            "terminate ranks 1-3: ended — ranks 1-3 ended (3 by SIGTERM, 0 by SIGKILL) in 0.4s; rank 0 could not \
             be killed"
        );
        let unkillable = ActionRecord {
            action: "unkillable".into(),
            ranks: vec![0],
            ok: false,
            detail: Some(
                "pid 42's main thread exited (Z), but its thread 57 (ckpt-writer) is still in uninterruptible \
                 sleep (D) after SIGKILL"
                    .into(),
            ),
            outcomes: Vec::new(),
        };
        assert_eq!(
            action_line(&unkillable),
            "unkillable rank 0: could not be killed — pid 42's main thread exited (Z), but its thread 57 \
             (ckpt-writer) is still in uninterruptible sleep (D) after SIGKILL"
        );
    }
}
