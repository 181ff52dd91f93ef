//! Human text of reports and events: the headline sentence first, then the evidence. Times are shown as the log
//! printed them (local time of the node), with the date only when it differs from the log's last day.
//!
//! The report's types come from `hangwatch_model::kernel_log`; `report.rs` calls this module for its summaries
//! and this module never calls `report.rs`, so the two do not import each other.

use std::fmt::Write as _;

use hangwatch_model::kernel_log::{
    ComplaintKind, FsComplaintGroup, HungTask, LineFormat, Report, Syscall, SyscallSource,
    Timestamp, XidGroup,
};

use crate::hung::HungTaskReport;
use crate::notices::xid_meaning;
use crate::parser::Event;

/// `04:10:52`, `2023-03-02 15:59:56`, or `boot+967.7s` when the log has only monotonic times.
pub fn time_text(t: &Timestamp, reference: Option<&Timestamp>) -> Option<String> {
    if let Some(w) = &t.wall {
        return Some(w.human(reference.and_then(|r| r.wall.as_ref())));
    }
    t.monotonic_s.map(|m| format!("boot+{m:.1}s"))
}

/// `write()` / `write(fd 108, 2440 bytes)`.
fn call_text(call: &Syscall, with_args: bool) -> Option<String> {
    let name = call
        .name
        .as_deref()
        .map(str::to_string)
        .or_else(|| call.nr.map(|nr| format!("syscall {nr}")))?;
    let mut args = Vec::new();
    if with_args {
        if let Some(fd) = call.fd {
            args.push(format!("fd {fd}"));
        }
        if let Some(count) = call.count {
            args.push(format!("{count} bytes"));
        }
    }
    Some(format!("{name}({})", args.join(", ")))
}

/// `blocked in write() on GPFS (lookup)`: the call, the filesystem, the operation when the call does not say it.
fn blocked_in(
    call: Option<&Syscall>,
    fs: Option<&str>,
    frozen: bool,
    operation: Option<&str>,
) -> String {
    let mut text = String::from("blocked in ");
    let call_name = call.and_then(|c| call_text(c, false));
    match (&call_name, operation) {
        (Some(c), _) => text.push_str(c),
        (None, Some("page fault")) => text.push_str("a page fault"),
        (None, _) => text.push_str("the kernel"),
    }
    match (fs, frozen) {
        (Some(fs), true) => {
            let _ = write!(text, " on {fs} (frozen)");
        }
        (Some(fs), false) => {
            let _ = write!(text, " on {fs}");
        }
        (None, true) => text.push_str(" on a frozen filesystem"),
        (None, false) => {}
    }
    let name = call.and_then(|c| c.name.as_deref());
    if let Some(op) = operation {
        let said = name.is_some_and(|n| n.contains(op)) || (name.is_none() && op == "page fault");
        if !said {
            let _ = write!(text, " ({op})");
        }
    }
    text
}

/// The one-line account of a hung task: `pid 280058 (python) blocked in write() on GPFS since about 04:08:52 —
/// reported 9 times, 04:10:52 to 04:27:15`. `reference` is the log's last time (dates shown when different).
pub fn task_sentence(task: &HungTask, reference: Option<&Timestamp>) -> String {
    let mut text = format!(
        "pid {} ({}) {}",
        task.pid,
        task.comm,
        blocked_in(
            task.syscall.as_ref(),
            task.filesystem_name.as_deref(),
            task.frozen,
            task.operation.as_deref()
        )
    );
    match task
        .blocked_since
        .as_ref()
        .and_then(|s| time_text(s, reference))
    {
        Some(since) => {
            let _ = write!(text, " since about {since}");
        }
        None => {
            let _ = write!(text, " for more than {} s", task.max_blocked_for_s);
        }
    }
    let first = time_text(&task.first_report, reference);
    let last = time_text(&task.last_report, Some(&task.first_report));
    match (task.reports, first, last) {
        (1, Some(first), _) => {
            let _ = write!(text, " — reported once, at {first}");
        }
        (1, None, _) => text.push_str(" — reported once"),
        (n, Some(first), Some(last)) => {
            let _ = write!(text, " — reported {n} times, {first} to {last}");
        }
        (n, _, _) => {
            let _ = write!(text, " — reported {n} times");
        }
    }
    text
}

/// The report's first line: the hung task reported last, else the worst other finding.
pub fn headline(report: &Report) -> String {
    if let Some(task) = report.hung_tasks.first() {
        return task.summary.clone();
    }
    let reference = report.last_time.as_ref();
    if let Some(x) = report.xids.iter().max_by_key(|x| severe_xid(x.code)) {
        return xid_sentence(x, reference);
    }
    if let Some(c) = report
        .fs_complaints
        .iter()
        .find(|c| c.recovered_at.is_none())
        .or(report.fs_complaints.first())
    {
        return complaint_sentence(c, reference);
    }
    if let Some(o) = report.oom_kills.last() {
        let when = time_text(&o.time, reference)
            .map(|t| format!(" at {t}"))
            .unwrap_or_default();
        return format!(
            "pid {} ({}) was killed for lack of memory{when}",
            o.pid, o.comm
        );
    }
    if report.hung_task_reports_suppressed {
        return "Hung-task reports were suppressed: the kernel stopped reporting hung tasks before this log".to_string();
    }
    "No hung tasks, GPU Xid errors or filesystem complaints in this kernel log.".to_string()
}

/// Xids that mean broken hardware or driver outrank application faults.
fn severe_xid(code: u32) -> u8 {
    match code {
        79 | 95 | 119 | 120 | 64 | 48 | 74 | 62 => 2,
        13 | 31 | 43 | 45 => 0,
        _ => 1,
    }
}

fn xid_sentence(x: &XidGroup, reference: Option<&Timestamp>) -> String {
    let mut text = format!("GPU {} reported Xid {}", x.pci, x.code);
    if !x.message.is_empty() {
        let _ = write!(text, " ({})", x.message.trim_end_matches('.'));
    }
    let first = time_text(&x.first, reference);
    match (x.count, first) {
        (1, Some(t)) => {
            let _ = write!(text, " at {t}");
        }
        (n, Some(t)) => {
            let last = time_text(&x.last, Some(&x.first)).unwrap_or_default();
            let _ = write!(text, " {n} times, {t} to {last}");
        }
        (1, None) => {}
        (n, None) => {
            let _ = write!(text, " {n} times");
        }
    }
    if !x.pids.is_empty() {
        let pids: Vec<String> = x.pids.iter().map(u32::to_string).collect();
        let _ = write!(text, ", pid {}", pids.join(", "));
        if !x.processes.is_empty() {
            let _ = write!(text, " ({})", x.processes.join(", "));
        }
    }
    if let Some(meaning) = &x.meaning {
        let _ = write!(text, ": {meaning}");
    }
    text
}

fn complaint_sentence(c: &FsComplaintGroup, reference: Option<&Timestamp>) -> String {
    let who = match (&c.target, c.filesystem.is_some()) {
        (Some(t), true)
            if c.kind == ComplaintKind::NotResponding || c.kind == ComplaintKind::TimedOut =>
        {
            format!("{} server {t}", c.filesystem_name)
        }
        (Some(t), _) => format!("{} {t}", c.filesystem_name),
        (None, _) => c.filesystem_name.clone(),
    };
    let mut text = format!("{who}: {}", c.kind.display());
    let first = time_text(&c.first, reference);
    match (c.count, first) {
        (1, Some(t)) => {
            let _ = write!(text, " at {t}");
        }
        (n, Some(t)) => {
            let last = time_text(&c.last, Some(&c.first)).unwrap_or_default();
            let _ = write!(text, ", {n} times, {t} to {last}");
        }
        (1, None) => {}
        (n, None) => {
            let _ = write!(text, ", {n} times");
        }
    }
    match c.recovered_at.as_ref() {
        Some(r) => {
            let when = time_text(r, Some(&c.last))
                .map(|t| format!(" at {t}"))
                .unwrap_or_default();
            let _ = write!(text, "; back{when}");
        }
        None if matches!(
            c.kind,
            ComplaintKind::NotResponding | ComplaintKind::ConnectionLost
        ) =>
        {
            text.push_str("; not reported back in this log");
        }
        None => {}
    }
    if c.kind == ComplaintKind::Error || c.kind == ComplaintKind::IoError {
        let _ = write!(text, " — {}", c.message);
    }
    text
}

fn format_name(format: LineFormat) -> &'static str {
    match format {
        LineFormat::DmesgCtime => "dmesg -T",
        LineFormat::Monotonic => "dmesg",
        LineFormat::Syslog => "syslog",
        LineFormat::Iso => "ISO-timestamped",
        LineFormat::Kmsg => "/dev/kmsg",
        LineFormat::Bare => "untimestamped",
    }
}

/// Details under a hung task: call with arguments, state, wchan, blocker.
fn task_details(task: &HungTask) -> String {
    let mut parts = Vec::new();
    if let Some(call) = task
        .syscall
        .as_ref()
        .and_then(|c| call_text(c, true).map(|t| (c, t)))
    {
        let source = match call.0.source {
            SyscallSource::Registers => "from the registers",
            SyscallSource::Stack => "from the stack",
        };
        parts.push(format!("{} {source}", call.1));
    }
    if let Some(state) = &task.state {
        parts.push(format!("state {state}"));
    }
    if let Some(tgid) = task.tgid.filter(|t| *t != task.pid) {
        parts.push(format!("thread of pid {tgid}"));
    }
    if let Some(ppid) = task.ppid {
        parts.push(format!("ppid {ppid}"));
    }
    if let Some(wchan) = &task.wchan {
        parts.push(format!("waits in {wchan}"));
    }
    if let Some(b) = &task.blocked_on {
        parts.push(format!(
            "blocked on a {} likely held by pid {} ({})",
            b.lock, b.pid, b.comm
        ));
    }
    parts.join(", ")
}

/// The whole human report, headline first.
pub fn render_report(report: &Report) -> String {
    let mut out = String::new();
    let reference = report.last_time.as_ref();
    let _ = writeln!(out, "{}", report.summary);
    if let Some(task) = report.hung_tasks.first() {
        let details = task_details(task);
        if !details.is_empty() {
            let _ = writeln!(out, "  {details}");
        }
        if task.distinct_stacks > 1 {
            let _ = writeln!(
                out,
                "  the stack changed between reports ({} different); the last one:",
                task.distinct_stacks
            );
        }
        if !task.stack.is_empty() {
            let _ = writeln!(out, "  kernel stack, innermost first:");
            for frame in &task.stack {
                let _ = writeln!(out, "    {frame}");
            }
        }
    }
    if report.hung_tasks.len() > 1 {
        let _ = writeln!(out, "\nOther hung tasks:");
        for task in &report.hung_tasks[1..] {
            let _ = writeln!(out, "  {}", task.summary);
        }
    }
    if report.hung_task_reports_suppressed {
        let when = report
            .suppressed_at
            .as_ref()
            .and_then(|t| time_text(t, reference))
            .map(|t| format!(" at {t}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "\nThe kernel stopped reporting hung tasks{when} (kernel.hung_task_warnings ran out): later hangs are not in \
             this log. `sysctl -w kernel.hung_task_warnings=-1` keeps them coming; /proc/sys/kernel/hung_task_detect_count \
             still counts them on recent kernels."
        );
    }
    let headline_is_xid = report.hung_tasks.is_empty() && !report.xids.is_empty();
    let xid_in_headline_only = headline_is_xid && report.xids.len() == 1;
    if !report.xids.is_empty() && !xid_in_headline_only {
        let _ = writeln!(out, "\nGPU Xid errors:");
        for x in &report.xids {
            let _ = writeln!(out, "  {}", xid_sentence(x, reference));
        }
    }
    let headline_is_fs =
        report.hung_tasks.is_empty() && report.xids.is_empty() && report.fs_complaints.len() == 1;
    if !report.fs_complaints.is_empty() && !headline_is_fs {
        let _ = writeln!(out, "\nFilesystem complaints:");
        for c in &report.fs_complaints {
            let _ = writeln!(out, "  {}", complaint_sentence(c, reference));
        }
    }
    if !report.oom_kills.is_empty() {
        let _ = writeln!(out, "\nOut-of-memory kills:");
        for o in &report.oom_kills {
            let when = time_text(&o.time, reference)
                .map(|t| format!(" at {t}"))
                .unwrap_or_default();
            let scope = if o.cgroup {
                " (memory cgroup limit)"
            } else {
                ""
            };
            let _ = writeln!(out, "  pid {} ({}){when}{scope}", o.pid, o.comm);
        }
    }
    let mut none = Vec::new();
    if report.xids.is_empty() {
        none.push("GPU Xid errors");
    }
    if report.fs_complaints.is_empty() {
        none.push("filesystem complaints");
    }
    if report.oom_kills.is_empty() {
        none.push("OOM kills");
    }
    let _ = writeln!(out);
    if !report.hung_tasks.is_empty() && !none.is_empty() {
        let list = match none.len() {
            1 => none[0].to_string(),
            n => format!("{} or {}", none[..n - 1].join(", "), none[n - 1]),
        };
        let _ = writeln!(out, "No {list}.");
    }
    let _ = write!(out, "Read {} lines", report.lines);
    if let Some(format) = report.format {
        let _ = write!(out, " of {} output", format_name(format));
    }
    if let (Some(first), Some(last)) = (&report.first_time, &report.last_time) {
        if let (Some(a), Some(b)) = (time_text(first, None), time_text(last, Some(first))) {
            let _ = write!(out, ", {a} to {b}");
        }
    }
    out.push_str(".\n");
    out
}

/// One line for an event as the live follower prints it.
pub fn render_event(event: &Event) -> String {
    let when = time_text(event.time(), None)
        .map(|t| format!("{t} "))
        .unwrap_or_default();
    match event {
        Event::HungTask(r) => format!("{when}hung task: {}", report_line(r)),
        Event::HungTaskReportsSuppressed { .. } => format!(
            "{when}the kernel stops reporting hung tasks (kernel.hung_task_warnings ran out); \
             `sysctl -w kernel.hung_task_warnings=-1` keeps them coming"
        ),
        Event::Xid(x) => {
            let mut text = format!("{when}GPU {} Xid {}: {}", x.pci, x.code, x.message);
            if let Some(pid) = x.pid {
                let _ = write!(
                    text,
                    " (pid {pid}{})",
                    x.process
                        .as_deref()
                        .map(|p| format!(", {p}"))
                        .unwrap_or_default()
                );
            }
            if let Some(meaning) = xid_meaning(x.code) {
                let _ = write!(text, " — {meaning}");
            }
            text
        }
        Event::FsComplaint(c) => format!("{when}{}", c.message),
        Event::OomKill(o) => {
            let scope = if o.cgroup {
                " (memory cgroup limit)"
            } else {
                ""
            };
            format!(
                "{when}out of memory: pid {} ({}) killed{scope}",
                o.pid, o.comm
            )
        }
    }
}

/// `pid 280058 (python) blocked in write() on GPFS for more than 120 s; write(fd 108, 2440 bytes), waits in ...`
fn report_line(r: &HungTaskReport) -> String {
    let fs = r.filesystem.map(|f| f.display());
    let mut text = format!(
        "pid {} ({}) {} for more than {} s",
        r.pid,
        r.comm,
        blocked_in(r.syscall.as_ref(), fs, r.frozen, r.operation.as_deref()),
        r.blocked_for_s
    );
    let mut details = Vec::new();
    if let Some(call) = r
        .syscall
        .as_ref()
        .filter(|c| c.fd.is_some() || c.count.is_some())
        .and_then(|c| call_text(c, true))
    {
        details.push(call);
    }
    if let Some(w) = &r.wchan {
        details.push(format!("waits in {w}"));
    }
    if let Some(b) = &r.blocked_on {
        details.push(format!(
            "blocked on a {} likely held by pid {} ({})",
            b.lock, b.pid, b.comm
        ));
    }
    if !details.is_empty() {
        let _ = write!(text, "; {}", details.join(", "));
    }
    text
}
