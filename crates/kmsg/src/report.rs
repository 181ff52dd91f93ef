//! The report over a whole log: hung tasks grouped by task with first/last report and "blocked since", Xid
//! errors grouped by GPU and code, filesystem complaints grouped by target, OOM kills, and whether hung-task
//! reporting was suppressed. This is the JSON of `hangwatch kmsg --json` (`"version": 1`).

use std::io::BufRead;

use hangwatch_model::kernel_log::{
    ComplaintKind, FsComplaintGroup, HungTask, OomKill, Report, Syscall, SyscallSource, Timestamp,
    XidGroup, REPORT_VERSION,
};
use hangwatch_model::WallTime;

use crate::hung::HungTaskReport;
use crate::notices::{xid_meaning, FsComplaint, XidEvent};
use crate::parser::{Event, LogStats, Parser};
use crate::render;

/// Restricts a report to events at or after a time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Since {
    /// Compared with the lines' wall-clock time (as printed: the node's local time for `dmesg -T` and syslog).
    Wall(WallTime),
    /// Seconds since boot, compared with the lines' monotonic time.
    Monotonic(f64),
}

impl Since {
    /// Events without the clock this filter uses are kept: dropping them would hide what cannot be placed.
    pub fn admits(&self, t: &Timestamp) -> bool {
        match self {
            Since::Wall(since) => t.wall.is_none_or(|w| w.cmp_fields(since).is_ge()),
            Since::Monotonic(since) => t.monotonic_s.is_none_or(|m| m >= *since),
        }
    }
}

/// Why a `--since` value was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot read {text:?} as a time: use 2023-03-04T04:00:00, \"2023-03-04 04:00\" or boot+SECONDS"
)]
pub struct SinceParseError {
    pub text: String,
}

impl std::str::FromStr for Since {
    type Err = SinceParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || SinceParseError {
            text: s.to_string(),
        };
        if let Some(secs) = s.trim().strip_prefix("boot+") {
            let secs: f64 = secs.trim_end_matches('s').parse().map_err(|_| err())?;
            return secs
                .is_finite()
                .then_some(Since::Monotonic(secs))
                .ok_or_else(err);
        }
        s.parse::<WallTime>().map(Since::Wall).map_err(|_| err())
    }
}

/// Options of a report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReportOptions {
    pub since: Option<Since>,
    /// Boot time (Unix seconds) to give monotonic-only lines a wall-clock time (UTC).
    pub boot_unix_s: Option<f64>,
}

/// Collects events into a [`Report`]; feed it from a [`Parser`] or use [`report_from_text`].
#[derive(Debug, Default)]
pub struct ReportBuilder {
    since: Option<Since>,
    seq: u64,
    /// Each task with the sequence number of its latest report (the latest reported comes first).
    tasks: Vec<(HungTask, u64)>,
    reports: u32,
    suppressed_at: Option<Timestamp>,
    suppressed: bool,
    xids: Vec<XidGroup>,
    complaints: Vec<FsComplaintGroup>,
    ooms: Vec<OomKill>,
}

impl ReportBuilder {
    pub fn new(since: Option<Since>) -> ReportBuilder {
        ReportBuilder {
            since,
            ..ReportBuilder::default()
        }
    }

    pub fn add(&mut self, event: Event) {
        if let Some(since) = &self.since {
            if !since.admits(event.time()) {
                return;
            }
        }
        self.seq += 1;
        match event {
            Event::HungTask(report) => self.add_hung(*report),
            Event::HungTaskReportsSuppressed { time } => {
                self.suppressed = true;
                self.suppressed_at.get_or_insert(time);
            }
            Event::Xid(xid) => self.add_xid(xid),
            Event::FsComplaint(c) => self.add_complaint(c),
            Event::OomKill(o) => {
                if !self.ooms.iter().any(|k| k.pid == o.pid && k.comm == o.comm) {
                    self.ooms.push(o);
                }
            }
        }
    }

    fn add_hung(&mut self, r: HungTaskReport) {
        self.reports += 1;
        let seq = self.seq;
        let Some((task, last_seq)) = self
            .tasks
            .iter_mut()
            .find(|(t, _)| t.pid == r.pid && t.comm == r.comm)
        else {
            self.tasks.push((
                HungTask {
                    summary: String::new(),
                    blocked_since: (!r.time.is_empty()).then(|| r.time.minus_secs(r.blocked_for_s)),
                    comm: r.comm,
                    pid: r.pid,
                    tgid: r.tgid,
                    ppid: r.ppid,
                    state: r.state,
                    reports: 1,
                    first_report: r.time,
                    last_report: r.time,
                    blocked_for_s: r.blocked_for_s,
                    max_blocked_for_s: r.blocked_for_s,
                    syscall: r.syscall,
                    filesystem_name: r.filesystem.map(|f| f.display().to_string()),
                    filesystem: r.filesystem,
                    filesystem_frame: r.filesystem_frame,
                    frozen: r.frozen,
                    operation: r.operation,
                    wchan: r.wchan,
                    distinct_stacks: u32::from(!r.stack.is_empty()),
                    stack: r.stack,
                    blocked_on: r.blocked_on,
                },
                seq,
            ));
            return;
        };
        task.reports += 1;
        task.last_report = r.time;
        *last_seq = seq;
        task.max_blocked_for_s = task.max_blocked_for_s.max(r.blocked_for_s);
        task.tgid = r.tgid.or(task.tgid);
        task.ppid = r.ppid.or(task.ppid);
        task.state = r.state.or(task.state.take());
        let keep_registers = matches!(
            (&task.syscall, &r.syscall),
            (
                Some(Syscall {
                    source: SyscallSource::Registers,
                    ..
                }),
                None | Some(Syscall {
                    source: SyscallSource::Stack,
                    ..
                })
            )
        );
        if !keep_registers && r.syscall.is_some() {
            task.syscall = r.syscall;
        }
        if r.filesystem.is_some() {
            task.filesystem = r.filesystem;
            task.filesystem_name = r.filesystem.map(|f| f.display().to_string());
            task.filesystem_frame = r.filesystem_frame;
        }
        task.frozen |= r.frozen;
        task.operation = r.operation.or(task.operation.take());
        task.wchan = r.wchan.or(task.wchan.take());
        if !r.stack.is_empty() {
            if r.stack != task.stack {
                task.distinct_stacks += 1;
            }
            task.stack = r.stack;
        }
        task.blocked_on = r.blocked_on.or(task.blocked_on.take());
    }

    fn add_xid(&mut self, x: XidEvent) {
        let group = match self
            .xids
            .iter_mut()
            .find(|g| g.pci == x.pci && g.code == x.code)
        {
            Some(g) => {
                g.count += 1;
                g.last = x.time;
                g
            }
            None => {
                self.xids.push(XidGroup {
                    pci: x.pci.clone(),
                    code: x.code,
                    meaning: xid_meaning(x.code).map(str::to_string),
                    count: 1,
                    first: x.time,
                    last: x.time,
                    message: x.message.clone(),
                    pids: Vec::new(),
                    processes: Vec::new(),
                });
                let last = self.xids.len() - 1;
                &mut self.xids[last]
            }
        };
        if let Some(pid) = x.pid {
            if !group.pids.contains(&pid) {
                group.pids.push(pid);
            }
        }
        if let Some(p) = x.process {
            if !group.processes.contains(&p) {
                group.processes.push(p);
            }
        }
    }

    fn add_complaint(&mut self, c: FsComplaint) {
        if c.kind == ComplaintKind::Recovered {
            for g in self
                .complaints
                .iter_mut()
                .filter(|g| g.filesystem == c.filesystem && g.target == c.target)
            {
                g.recovered_at = Some(c.time);
            }
            return;
        }
        match self
            .complaints
            .iter_mut()
            .find(|g| g.filesystem == c.filesystem && g.target == c.target && g.kind == c.kind)
        {
            Some(g) => {
                g.count += 1;
                g.last = c.time;
                g.recovered_at = None;
            }
            None => self.complaints.push(FsComplaintGroup {
                filesystem: c.filesystem,
                filesystem_name: c
                    .filesystem
                    .map_or("block device", |f| f.display())
                    .to_string(),
                kind: c.kind,
                target: c.target,
                count: 1,
                first: c.time,
                last: c.time,
                message: c.message,
                recovered_at: None,
            }),
        }
    }

    pub fn finish(mut self, stats: &LogStats) -> Report {
        self.tasks
            .sort_by_key(|(_, last_seq)| std::cmp::Reverse(*last_seq));
        let reference = stats.last_time;
        let mut tasks: Vec<HungTask> = self.tasks.into_iter().map(|(task, _)| task).collect();
        for task in &mut tasks {
            task.summary = render::task_sentence(task, reference.as_ref());
        }
        let mut report = Report {
            version: REPORT_VERSION,
            summary: String::new(),
            lines: stats.lines,
            format: stats.main_format(),
            first_time: stats.first_time,
            last_time: stats.last_time,
            hung_tasks: tasks,
            hung_task_reports: self.reports,
            hung_task_reports_suppressed: self.suppressed,
            suppressed_at: self.suppressed_at,
            xids: self.xids,
            fs_complaints: self.complaints,
            oom_kills: self.ooms,
        };
        report.summary = render::headline(&report);
        report
    }
}

/// The report of a whole kernel log held in memory. This is what other parts of hangwatch call (the agent on
/// the kernel-log lines since its job started).
pub fn report_from_text(text: &str) -> Report {
    report_from_lines(text.lines(), &ReportOptions::default())
}

/// The report of a sequence of lines.
pub fn report_from_lines<'a>(
    lines: impl IntoIterator<Item = &'a str>,
    options: &ReportOptions,
) -> Report {
    let mut parser = Parser::with_boot_time(options.boot_unix_s);
    let mut builder = ReportBuilder::new(options.since);
    let mut events = Vec::new();
    for line in lines {
        parser.push_line(line, &mut events);
        events.drain(..).for_each(|e| builder.add(e));
    }
    parser.flush(&mut events);
    events.drain(..).for_each(|e| builder.add(e));
    builder.finish(parser.stats())
}

/// The report of a reader (file, stdin, `/dev/kmsg` opened non-blocking): lines need not be UTF-8; a
/// non-blocking reader ends at `WouldBlock`; `/dev/kmsg`'s "records were overwritten" (`EPIPE`) is skipped.
pub fn report_from_reader(
    reader: impl BufRead,
    options: &ReportOptions,
) -> std::io::Result<Report> {
    let mut parser = Parser::with_boot_time(options.boot_unix_s);
    let mut builder = ReportBuilder::new(options.since);
    let mut events = Vec::new();
    let mut lines = crate::follow::LineReader::new(reader);
    while let Some(line) = lines.next_line()? {
        parser.push_line(&line, &mut events);
        events.drain(..).for_each(|e| builder.add(e));
    }
    parser.flush(&mut events);
    events.drain(..).for_each(|e| builder.add(e));
    Ok(builder.finish(parser.stats()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report_lines(count: usize, start_s: u32, pid: u32) -> String {
        let mut text = String::new();
        for i in 0..count {
            let t = start_s + 120 * i as u32;
            text.push_str(&format!(
                "[{t:>5}.000000] INFO: task python:{pid} blocked for more than 120 seconds.\n"
            ));
            text.push_str(&format!(
                "[{t:>5}.000001] task:python state:D stack:0 pid:{pid} ppid:1 flags:0x0\n"
            ));
            text.push_str(&format!(
                "[{t:>5}.000002] Call Trace:\n[{t:>5}.000003]  schedule+0x1/0x2\n"
            ));
            text.push_str(&format!(
                "[{t:>5}.000004]  fuse_simple_request+0x1/0x2 [fuse]\n"
            ));
        }
        text
    }

    #[test]
    fn reports_group_by_task_and_the_latest_comes_first() {
        let mut text = report_lines(1, 100, 7);
        text.push_str(&report_lines(3, 1000, 8));
        let report = report_from_text(&text);
        assert_eq!(report.hung_task_reports, 4);
        assert_eq!(report.hung_tasks.len(), 2);
        let t = &report.hung_tasks[0];
        assert_eq!((t.pid, t.reports, t.distinct_stacks), (8, 3, 1));
        assert_eq!(t.first_report.monotonic_s, Some(1000.0));
        assert_eq!(t.last_report.monotonic_s, Some(1240.0));
        assert_eq!(t.blocked_since.and_then(|b| b.monotonic_s), Some(880.0));
        assert_eq!(t.filesystem_name.as_deref(), Some("FUSE"));
        assert_eq!(report.hung_tasks[1].pid, 7);
    }

    #[test]
    fn since_filters_events_by_the_clock_they_have() {
        let text = report_lines(3, 1000, 8);
        let options = ReportOptions {
            since: Some("boot+1100".parse().unwrap()),
            boot_unix_s: None,
        };
        let report = report_from_lines(text.lines(), &options);
        assert_eq!(report.hung_tasks[0].reports, 2);
        assert!("yesterday".parse::<Since>().is_err());
        assert_eq!(
            "2023-03-04 04:00".parse::<Since>().unwrap(),
            Since::Wall("2023-03-04T04:00:00".parse().unwrap())
        );
    }

    #[test]
    fn complaints_group_and_recover() {
        let text = "\
[ 1.0] nfs: server a not responding, still trying
[ 2.0] nfs: server a not responding, still trying
[ 3.0] nfs: server b not responding, still trying
[ 4.0] nfs: server a OK
[ 5.0] Lustre: x-MDT0000-mdc-ffff: Connection restored to 10.0.0.1@o2ib (at 10.0.0.1@o2ib)
";
        let report = report_from_text(text);
        assert_eq!(report.fs_complaints.len(), 2);
        let a = &report.fs_complaints[0];
        assert_eq!((a.target.as_deref(), a.count), (Some("a"), 2));
        assert_eq!(a.recovered_at.and_then(|t| t.monotonic_s), Some(4.0));
        assert_eq!(report.fs_complaints[1].recovered_at, None);
    }

    #[test]
    fn xids_group_by_gpu_and_code() {
        let text = "\
NVRM: Xid (PCI:0000:3b:00): 13, pid=10, name=python, Graphics Exception
NVRM: Xid (PCI:0000:3b:00): 13, pid=11, name=python, Graphics Exception
NVRM: Xid (PCI:0000:3b:00): 13, pid=10, name=python, Graphics Exception
NVRM: Xid (PCI:0000:86:00): 79, pid=12, name=python, GPU has fallen off the bus.
";
        let report = report_from_text(text);
        assert_eq!(report.xids.len(), 2);
        assert_eq!(
            (report.xids[0].count, report.xids[0].pids.clone()),
            (3, vec![10, 11])
        );
        assert_eq!(report.xids[0].processes, ["python"]);
        assert!(report.xids[1].meaning.as_deref().unwrap().contains("drain"));
    }

    #[test]
    fn empty_log() {
        let report = report_from_text("");
        assert_eq!(report.version, 1);
        assert!(report.hung_tasks.is_empty());
        assert_eq!(
            report.summary,
            "No hung tasks, GPU Xid errors or filesystem complaints in this kernel log."
        );
    }

    #[test]
    fn report_json_round_trips() {
        let report = report_from_text(&report_lines(2, 1000, 8));
        let json = serde_json::to_string(&report).unwrap();
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(back.hung_tasks[0].summary, report.hung_tasks[0].summary);
        assert_eq!(back.summary, report.summary);
    }
}
