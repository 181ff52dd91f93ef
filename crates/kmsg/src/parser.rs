//! The streaming reader: kernel-log lines in, finished events out. A hung-task report spans many lines; it is
//! finished by the line after it, by [`Parser::flush`] (end of input, or the live follower's idle timer).

use serde::{Deserialize, Serialize};

use hangwatch_model::kernel_log::{LineFormat, OomKill, Timestamp};

use crate::hung::{self, HungTaskReport, ReportBuilder};
use crate::notices::{self, FsComplaint, XidEvent};
use crate::prefix::split_prefix;
use crate::stack;

/// Something the kernel log said that the report cares about.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    HungTask(Box<HungTaskReport>),
    /// `Future hung task reports are suppressed`: `kernel.hung_task_warnings` ran out; later hangs are silent.
    HungTaskReportsSuppressed {
        time: Timestamp,
    },
    Xid(XidEvent),
    FsComplaint(FsComplaint),
    OomKill(OomKill),
}

impl Event {
    pub fn time(&self) -> &Timestamp {
        match self {
            Event::HungTask(r) => &r.time,
            Event::HungTaskReportsSuppressed { time } => time,
            Event::Xid(x) => &x.time,
            Event::FsComplaint(c) => &c.time,
            Event::OomKill(o) => &o.time,
        }
    }
}

/// Lines further apart than this do not belong to the same hung-task report.
const MAX_REPORT_SPAN_S: f64 = 10.0;

/// What was read, for the report's header.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogStats {
    pub lines: u64,
    /// Lines per timestamp format, in [`LineFormat`] order of first appearance.
    pub formats: Vec<(LineFormat, u64)>,
    pub first_time: Option<Timestamp>,
    pub last_time: Option<Timestamp>,
}

impl LogStats {
    /// The timestamp format most lines had.
    pub fn main_format(&self) -> Option<LineFormat> {
        self.formats.iter().max_by_key(|(_, n)| *n).map(|(f, _)| *f)
    }
}

/// What one line was to the parser ([`Parser::push_line_use`]): which lines make which event, for a reader that
/// keeps or drops lines by what they say (`crate::scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineUse {
    /// A line of the `n`th hung-task report of this parser's input (from 0; its header or a line after it). The
    /// reports come out as [`Event::HungTask`] in the order they started.
    HungReport(usize),
    /// A one-line notice: the last event this call pushed.
    Notice,
    /// Not part of any event.
    Unused,
}

/// Turns kernel-log lines into [`Event`]s. Never panics on any input; unknown lines are skipped.
#[derive(Debug, Default)]
pub struct Parser {
    pending: Option<Pending>,
    stats: LogStats,
    boot_unix_s: Option<f64>,
    /// Hung-task reports started so far.
    reports_started: usize,
}

#[derive(Debug)]
struct Pending {
    report: ReportBuilder,
    /// The registers or `</TASK>` were read: only the blocker line of recent kernels may still follow.
    closed: bool,
    /// Reading the lock owner's dump that follows a blocker line: consumed, not reported.
    in_owner_dump: bool,
}

enum Step {
    Consumed,
    NotPart,
}

impl Parser {
    pub fn new() -> Parser {
        Parser::default()
    }

    /// Wall-clock times of monotonic-only lines (raw `/dev/kmsg`) are derived from this boot time, in UTC.
    pub fn with_boot_time(boot_unix_s: Option<f64>) -> Parser {
        Parser {
            boot_unix_s,
            ..Parser::default()
        }
    }

    pub fn stats(&self) -> &LogStats {
        &self.stats
    }

    /// A hung-task report is waiting for more lines.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Reads one line (with or without trailing newline); finished events are appended to `out`.
    pub fn push_line(&mut self, line: &str, out: &mut Vec<Event>) {
        self.push_line_use(line, out);
    }

    /// [`Parser::push_line`], saying what the line was.
    pub fn push_line_use(&mut self, line: &str, out: &mut Vec<Event>) -> LineUse {
        self.stats.lines += 1;
        let Some(entry) = split_prefix(line) else {
            return LineUse::Unused;
        };
        let time = entry.time.with_boot_time(self.boot_unix_s);
        match self
            .stats
            .formats
            .iter_mut()
            .find(|(f, _)| *f == entry.format)
        {
            Some((_, n)) => *n += 1,
            None => self.stats.formats.push((entry.format, 1)),
        }
        if !time.is_empty() {
            self.stats.first_time.get_or_insert(time);
            self.stats.last_time = Some(time);
        }
        let mut used = LineUse::Unused;
        for text in entry.text.split('\n') {
            let this = self.handle(time, text, out);
            if used == LineUse::Unused {
                used = this;
            }
        }
        used
    }

    /// Finishes a report still waiting for lines.
    pub fn flush(&mut self, out: &mut Vec<Event>) {
        if let Some(pending) = self.pending.take() {
            out.push(Event::HungTask(Box::new(pending.report.finish())));
        }
    }

    fn handle(&mut self, time: Timestamp, text: &str, out: &mut Vec<Event>) -> LineUse {
        if let Some((comm, pid, secs)) = hung::parse_header(text) {
            self.flush(out);
            self.pending = Some(Pending {
                report: ReportBuilder::new(time, comm, pid, secs),
                closed: false,
                in_owner_dump: false,
            });
            self.reports_started += 1;
            return LineUse::HungReport(self.reports_started - 1);
        }
        if let Some(pending) = self.pending.as_mut() {
            let too_far = time
                .seconds_since(&pending.report.time)
                .is_some_and(|d| d.abs() > MAX_REPORT_SPAN_S);
            if !too_far {
                if let Step::Consumed = pending.take(text) {
                    return LineUse::HungReport(self.reports_started - 1);
                }
            }
            self.flush(out);
        }
        if notices::is_suppression(text) {
            out.push(Event::HungTaskReportsSuppressed { time });
        } else if let Some(xid) = notices::parse_xid(time, text) {
            out.push(Event::Xid(xid));
        } else if let Some(complaint) = notices::parse_fs_complaint(time, text) {
            out.push(Event::FsComplaint(complaint));
        } else if let Some(oom) = notices::parse_oom_kill(time, text) {
            out.push(Event::OomKill(oom));
        } else {
            return LineUse::Unused;
        }
        LineUse::Notice
    }
}

impl Pending {
    fn take(&mut self, text: &str) -> Step {
        if self.closed {
            return self.take_after_close(text);
        }
        let report = &mut self.report;
        if hung::is_header_noise(text) {
            return Step::Consumed;
        }
        if let Some(task) = hung::parse_task_line(text) {
            if report.task.is_none()
                && report.frames.is_empty()
                && task.pid.is_none_or(|p| p == report.pid)
            {
                report.task = Some(task);
                return Step::Consumed;
            }
            return Step::NotPart;
        }
        if report.task.is_none() && !report.in_trace {
            if let Some(task) = hung::parse_old_task_line(text, report.pid) {
                report.task = Some(task);
                return Step::Consumed;
            }
        }
        if hung::is_call_trace(text) {
            if report.in_trace && !report.frames.is_empty() {
                return Step::NotPart;
            }
            report.in_trace = true;
            return Step::Consumed;
        }
        if let Some(frame) = stack::parse_frame(text) {
            report.frames.push(frame);
            return Step::Consumed;
        }
        if stack::is_trace_marker(text) {
            if text.contains("</") && !report.frames.is_empty() {
                self.closed = true;
            }
            return Step::Consumed;
        }
        if let Some(pairs) = hung::parse_register_line(text) {
            report.registers.0.extend(pairs);
            if report.registers.complete() {
                self.closed = true;
            }
            return Step::Consumed;
        }
        if is_dump_noise(text) {
            return Step::Consumed;
        }
        self.take_blocker(text)
    }

    fn take_after_close(&mut self, text: &str) -> Step {
        if self.in_owner_dump {
            let dump_line = hung::parse_task_line(text).is_some()
                || hung::is_call_trace(text)
                || stack::parse_frame(text).is_some()
                || stack::is_trace_marker(text)
                || hung::parse_register_line(text).is_some()
                || is_dump_noise(text);
            return if dump_line {
                Step::Consumed
            } else {
                Step::NotPart
            };
        }
        if stack::is_trace_marker(text) && text.contains("</") {
            return Step::Consumed;
        }
        self.take_blocker(text)
    }

    fn take_blocker(&mut self, text: &str) -> Step {
        match hung::parse_blocker(text) {
            Some((pid, blocker)) if pid == self.report.pid && self.report.blocked_on.is_none() => {
                self.report.blocked_on = Some(blocker);
                self.closed = true;
                self.in_owner_dump = true;
                Step::Consumed
            }
            _ => Step::NotPart,
        }
    }
}

/// `Code: 48 89 ...`, and the raw stack words old kernels print before the trace.
fn is_dump_noise(text: &str) -> bool {
    let t = text.trim();
    if t.starts_with("Code: ") {
        return true;
    }
    let mut words = t.split_ascii_whitespace().peekable();
    words.peek().is_some()
        && words
            .all(|w| (w.len() == 16 || w.len() == 8) && w.bytes().all(|c| c.is_ascii_hexdigit()))
}

/// All events of a complete text (the whole log at once).
pub fn events_from_text(text: &str) -> Vec<Event> {
    let mut parser = Parser::new();
    let mut out = Vec::new();
    for line in text.lines() {
        parser.push_line(line, &mut out);
    }
    parser.flush(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::kernel_log::{Filesystem, SyscallSource};

    fn hung(events: &[Event]) -> Vec<&HungTaskReport> {
        events
            .iter()
            .filter_map(|e| {
                if let Event::HungTask(r) = e {
                    Some(r.as_ref())
                } else {
                    None
                }
            })
            .collect()
    }

    const NEW_X86: &str = "\
[  967.723456] INFO: task python3:1234 blocked for more than 122 seconds.
[  967.723500]       Not tainted 6.5.0-generic #1
[  967.723510] \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.
[  967.723520] task:python3         state:D stack:0     pid:1234  tgid:1230  ppid:1200   flags:0x00004002
[  967.723530] Call Trace:
[  967.723535]  <TASK>
[  967.723540]  __schedule+0x2cb/0x750
[  967.723550]  schedule+0x63/0x110
[  967.723560]  percpu_rwsem_wait+0x10f/0x140
[  967.723570]  ? __pfx_percpu_rwsem_wake_function+0x10/0x10
[  967.723580]  __percpu_down_read+0x7c/0x90
[  967.723590]  ext4_buffered_write_iter+0x1a4/0x1b0
[  967.723600]  vfs_write+0x239/0x400
[  967.723610]  ksys_write+0x6f/0xf0
[  967.723620]  do_syscall_64+0x5b/0x90
[  967.723630]  entry_SYSCALL_64_after_hwframe+0x6e/0xd8
[  967.723640] RIP: 0033:0x7f0a1b2c3d4e
[  967.723645] Code: Unable to access opcode bytes at 0x7f0a1b2c3d24.
[  967.723650] RSP: 002b:00007ffd00000000 EFLAGS: 00000202 ORIG_RAX: 0000000000000001
[  967.723660] RAX: ffffffffffffffda RBX: 0000000000000001 RCX: 00007f0a1b2c3d4e
[  967.723670] RDX: 000000000000000c RSI: 0000000000000000 RDI: 0000000000000003
[  967.723680] RBP: 0000000000000000 R08: 0000000000000000 R09: 0000000000000000
[  967.723690] R10: 0000000000000000 R11: 0000000000000202 R12: 0000000000000000
[  967.723700] R13: 0000000000000000 R14: 0000000000000000 R15: 0000000000000000
[  967.723710]  </TASK>
[  970.000000] nfs: server fs1 not responding, still trying
";

    #[test]
    fn recent_x86_report_with_tgid_frozen_ext4() {
        let events = events_from_text(NEW_X86);
        let reports = hung(&events);
        assert_eq!(reports.len(), 1);
        let r = reports[0];
        assert_eq!(
            (r.comm.as_str(), r.pid, r.tgid, r.ppid, r.blocked_for_s),
            ("python3", 1234, Some(1230), Some(1200), 122)
        );
        assert_eq!(r.state.as_deref(), Some("D"));
        assert_eq!(r.time.monotonic_s, Some(967.723456));
        let call = r.syscall.as_ref().unwrap();
        assert_eq!(
            (call.name.as_deref(), call.fd, call.count),
            (Some("write"), Some(3), Some(12))
        );
        assert_eq!(r.filesystem, Some(Filesystem::Ext4));
        assert!(r.frozen);
        assert_eq!(r.wchan.as_deref(), Some("percpu_rwsem_wait"));
        assert_eq!(r.stack.first().map(String::as_str), Some("__schedule"));
        assert!(!r.stack.iter().any(|f| f.contains("__pfx")));
        assert!(
            matches!(events.last(), Some(Event::FsComplaint(_))),
            "the line after the report is still read"
        );
    }

    #[test]
    fn old_x86_report_with_addresses_and_stack_words() {
        let text = "\
INFO: task python:7088 blocked for more than 120 seconds.
\"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.
python          D ffff88103fc53680     0  7088      2 0x00000080
 ffff880ff4b27d48 0000000000000082 ffff8810214e0fb0 ffff880ff4b27fd8
Call Trace:
 [<ffffffff8168b579>] schedule+0x29/0x70
 [<ffffffffa0556c3d>] rpc_wait_bit_killable+0x3d/0x60 [sunrpc]
 [<ffffffff81688fd0>] __wait_on_bit+0x60/0x90
 [<ffffffffa05a1b2c>] nfs_file_fsync+0x8c/0x1a0 [nfs]
 [<ffffffff8122fdd5>] do_fsync+0x65/0xa0
 [<ffffffff812300a0>] SyS_fsync+0x10/0x20
 [<ffffffff81695a89>] system_call_fastpath+0x16/0x1b
";
        let events = events_from_text(text);
        let r = hung(&events)[0];
        assert_eq!(
            (r.comm.as_str(), r.pid, r.ppid, r.state.as_deref()),
            ("python", 7088, Some(2), Some("D"))
        );
        assert_eq!(r.filesystem, Some(Filesystem::Nfs));
        assert_eq!(r.operation.as_deref(), Some("fsync"));
        let call = r.syscall.as_ref().unwrap();
        assert_eq!(
            (call.name.as_deref(), call.source),
            (Some("fsync"), SyscallSource::Stack)
        );
        assert_eq!(r.time, Timestamp::default());
    }

    #[test]
    fn old_task_line_without_address() {
        let text = "INFO: task python:7088 blocked for more than 120 seconds.\n      Not tainted 4.15.0-1 #1\npython          D    0  7088      2 0x80000000\nCall Trace:\n __schedule+0x1/0x2\n schedule+0x1/0x2\n request_wait_answer+0x1/0x2\n fuse_simple_request+0x1/0x2\n";
        let r = hung(&events_from_text(text))[0].clone();
        assert_eq!(
            (r.state.as_deref(), r.ppid, r.filesystem),
            (Some("D"), Some(2), Some(Filesystem::Fuse))
        );
        assert_eq!(r.wchan.as_deref(), Some("request_wait_answer"));
    }

    #[test]
    fn arm64_trace_ends_at_the_next_line() {
        let text = "\
[ 1000.1] INFO: task python3:555 blocked for more than 120 seconds.
[ 1000.1]       Tainted: G           OE     5.15.0-1 #1
[ 1000.1] \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.
[ 1000.1] task:python3         state:D stack:    0 pid:  555 ppid:     1 flags:0x00000008
[ 1000.1] Call trace:
[ 1000.1]  __switch_to+0x104/0x170
[ 1000.1]  __schedule+0x2c0/0x7e0
[ 1000.1]  schedule+0x70/0x110
[ 1000.1]  rpc_wait_bit_killable+0x24/0xb0 [sunrpc]
[ 1000.1]  __wait_on_bit+0x5c/0x1c0
[ 1000.1]  nfs_wait_on_request+0x60/0x80 [nfs]
[ 1000.1]  nfs_file_write+0x100/0x2e0 [nfs]
[ 1000.1]  vfs_write+0x1e4/0x2d0
[ 1000.1]  ksys_write+0x78/0x110
[ 1000.1]  __arm64_sys_write+0x24/0x30
[ 1000.1]  invoke_syscall+0x50/0x120
[ 1000.1]  el0_svc+0x34/0x100
[ 1000.2] INFO: task python3:556 blocked for more than 120 seconds.
";
        let events = events_from_text(text);
        let reports = hung(&events);
        assert_eq!(reports.len(), 2);
        let r = reports[0];
        assert_eq!((r.pid, r.ppid), (555, Some(1)));
        assert_eq!(
            r.syscall.as_ref().and_then(|s| s.name.as_deref()),
            Some("write")
        );
        assert_eq!(r.filesystem, Some(Filesystem::Nfs));
        assert_eq!(r.wchan.as_deref(), Some("rpc_wait_bit_killable [sunrpc]"));
        assert_eq!(reports[1].pid, 556);
        assert!(reports[1].stack.is_empty());
    }

    #[test]
    fn blocker_line_and_owner_dump_attach_to_the_report() {
        let text = "\
INFO: task python:10 blocked for more than 122 seconds.
task:python state:D stack:0 pid:10 tgid:10 ppid:1 flags:0x0
Call Trace:
 <TASK>
 __schedule+0x1/0x2
 __mutex_lock.constprop.0+0x1/0x2
 </TASK>
INFO: task python:10 is blocked on a mutex likely owned by task writer:11.
task:writer state:D stack:0 pid:11 tgid:11 ppid:1 flags:0x0
Call Trace:
 <TASK>
 __schedule+0x1/0x2
 </TASK>
nfs: server a OK
";
        let events = events_from_text(text);
        let reports = hung(&events);
        assert_eq!(reports.len(), 1);
        let b = reports[0].blocked_on.as_ref().unwrap();
        assert_eq!(
            (b.comm.as_str(), b.pid, b.lock.as_str()),
            ("writer", 11, "mutex")
        );
        assert_eq!(
            reports[0].wchan.as_deref(),
            Some("__mutex_lock.constprop.0")
        );
        assert!(matches!(events.last(), Some(Event::FsComplaint(_))));
    }

    #[test]
    fn lines_far_apart_do_not_join_a_report() {
        let text = "[  100.0] INFO: task a:1 blocked for more than 120 seconds.\n[  200.0]  schedule+0x1/0x2\n";
        let r = hung(&events_from_text(text))[0].clone();
        assert!(r.stack.is_empty());
    }

    #[test]
    fn suppression_xid_and_nfs_events() {
        let text = "\
[Sat Mar  4 04:27:15 2023] Future hung task reports are suppressed, see sysctl kernel.hung_task_warnings
[Sat Mar  4 04:28:00 2023] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
[Sat Mar  4 04:29:00 2023] nfs: server fs1 not responding, still trying
[Sat Mar  4 04:30:00 2023] Out of memory: Killed process 77 (python) total-vm:1kB
";
        let events = events_from_text(text);
        assert_eq!(events.len(), 4);
        assert!(
            matches!(&events[0], Event::HungTaskReportsSuppressed { time } if time.wall.is_some())
        );
        assert!(matches!(&events[1], Event::Xid(x) if x.code == 79));
        assert!(matches!(&events[2], Event::FsComplaint(c) if c.target.as_deref() == Some("fs1")));
        assert!(matches!(&events[3], Event::OomKill(o) if o.pid == 77));
    }

    #[test]
    fn raw_kmsg_records_make_the_same_report() {
        let text = "\
3,700,967723456,-;INFO: task python:42 blocked for more than 120 seconds.
 SUBSYSTEM=foo
3,701,967723460,-;task:python state:D stack:0 pid:42 ppid:1 flags:0x00000000
4,702,967723461,-;Call Trace:
4,703,967723462,c; <TASK>
4,704,967723463,c; schedule+0x1/0x2
4,705,967723464,c; gpfs_f_rdwr_iter+0x1/0x2 [mmfslinux]
4,706,967723465,c; ksys_read+0x1/0x2
4,707,967723466,c; </TASK>
";
        let mut parser = Parser::with_boot_time(Some(1_677_900_000.0));
        let mut out = Vec::new();
        for line in text.lines() {
            parser.push_line(line, &mut out);
        }
        assert!(
            parser.has_pending(),
            "a closed report waits for a possible blocker line"
        );
        parser.flush(&mut out);
        let r = hung(&out)[0];
        assert_eq!(r.filesystem, Some(Filesystem::Gpfs));
        assert_eq!(
            r.syscall.as_ref().and_then(|s| s.name.as_deref()),
            Some("read")
        );
        assert_eq!(r.time.monotonic_s, Some(967.723456));
        assert_eq!(r.time.wall.map(|w| w.clock()).as_deref(), Some("03:36:07"));
        assert_eq!(parser.stats().main_format(), Some(LineFormat::Kmsg));
    }

    #[test]
    fn events_serialize_with_a_tag() {
        let events = events_from_text("nfs: server fs1 OK\n");
        let json = serde_json::to_value(&events[0]).unwrap();
        assert_eq!(json["event"], "fs_complaint");
        assert_eq!(json["kind"], "recovered");
        let back: Event = serde_json::from_value(json).unwrap();
        assert_eq!(back, events[0]);
    }
}
