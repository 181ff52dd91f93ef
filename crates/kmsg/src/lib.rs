//! Kernel-log reading for hangwatch: hung-task reports (which task, which system call, which filesystem, since
//! when), NVIDIA Xid errors, filesystem complaints and OOM kills, from `dmesg -T`, `dmesg`, syslog/journalctl,
//! ISO-timestamped or raw `/dev/kmsg` text. Parsing is pure (`&str` in, events out); [`follow`](mod@follow) is the I/O edge.
//!
//! ```
//! let log = "[Sat Mar  4 04:10:52 2023] nfs: server fs1 not responding, still trying\n";
//! let report = hangwatch_kmsg::report_from_text(log);
//! assert_eq!(report.fs_complaints[0].target.as_deref(), Some("fs1"));
//! ```

pub mod follow;
pub mod hung;
pub mod live;
pub mod notices;
pub mod parser;
pub mod prefix;
pub mod render;
pub mod report;
pub mod scope;
pub mod stack;

pub use follow::{follow, open_kmsg, FollowError, FollowSummary, DEV_KMSG};
/// The report's data types live in `hangwatch-model` (a node's observations carry a report); named here too so
/// that callers of the parser find them beside it.
pub use hangwatch_model::kernel_log::{
    Blocker, ComplaintKind, Filesystem, FsComplaintGroup, HungTask, LineFormat, OomKill, Report,
    Syscall, SyscallSource, Timestamp, XidGroup, REPORT_VERSION,
};
pub use hangwatch_model::WallTime;
pub use hung::HungTaskReport;
pub use notices::{parse_oom_constraint, FsComplaint, OomConstraint, XidEvent};
pub use parser::{events_from_text, Event, LineUse, Parser};
pub use render::{render_event, render_report};
pub use report::{report_from_lines, report_from_reader, report_from_text, ReportOptions, Since};
pub use scope::{lines_of_job, JobScope};
pub use stack::{page_fault, FaultAccess, Frame};
