//! Kernel-log reading for hangwatch: hung-task reports (which task, which system call, which filesystem, since
//! when), NVIDIA Xid errors, filesystem complaints and OOM kills, from `dmesg -T`, `dmesg`, syslog/journalctl,
//! ISO-timestamped or raw `/dev/kmsg` text. Parsing is pure (`&str` in, events out); [`follow`] is the I/O edge.
//!
//! ```
//! let log = "[Sat Mar  4 04:10:52 2023] nfs: server fs1 not responding, still trying\n";
//! let report = hangwatch_kmsg::report_from_text(log);
//! assert_eq!(report.fs_complaints[0].target.as_deref(), Some("fs1"));
//! ```

pub mod follow;
pub mod hung;
pub mod notices;
pub mod parser;
pub mod prefix;
pub mod render;
pub mod report;
pub mod stack;
pub mod syscall;
pub mod time;

pub use follow::{follow, open_kmsg, FollowError, FollowSummary, DEV_KMSG};
pub use hung::{Blocker, HungTaskReport, Syscall, SyscallSource};
pub use notices::{
    parse_oom_constraint, ComplaintKind, FsComplaint, OomConstraint, OomKill, XidEvent,
};
pub use parser::{events_from_text, Event, Parser};
pub use prefix::LineFormat;
pub use render::{render_event, render_report};
pub use report::{
    report_from_lines, report_from_reader, report_from_text, FsComplaintGroup, HungTask, Report,
    ReportOptions, Since, XidGroup, REPORT_VERSION,
};
pub use stack::{page_fault, FaultAccess, Filesystem, Frame};
pub use time::{Timestamp, WallTime};
