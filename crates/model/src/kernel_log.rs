//! What a kernel log said, as data: the report of `hangwatch kmsg --json` (`"version": 1`) and of a node's
//! observations, made of hung tasks, Xid groups, filesystem complaints and OOM kills, with the timestamps and
//! classes they carry. The parser that fills it is `hangwatch-kmsg`.

use serde::{Deserialize, Serialize};

use crate::clock::WallTime;

/// When a line was logged, as far as its prefix tells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timestamp {
    /// Wall-clock time printed by `dmesg -T`, syslog or ISO prefixes (local time of the node unless an offset is
    /// shown), or derived from the boot time when following `/dev/kmsg` (then in UTC).
    pub wall: Option<WallTime>,
    /// Seconds since boot (`[  967.723456]`, or the microseconds field of a `/dev/kmsg` record).
    pub monotonic_s: Option<f64>,
}

impl Timestamp {
    pub fn is_empty(&self) -> bool {
        self.wall.is_none() && self.monotonic_s.is_none()
    }

    /// The same instant `secs` seconds earlier; used for "blocked since about".
    pub fn minus_secs(&self, secs: u64) -> Timestamp {
        Timestamp {
            wall: self.wall.map(|w| w.minus_secs(secs)),
            monotonic_s: self.monotonic_s.map(|m| m - secs as f64),
        }
    }

    /// Seconds from `earlier` to `self`, by the clock both have (monotonic first).
    pub fn seconds_since(&self, earlier: &Timestamp) -> Option<f64> {
        if let (Some(a), Some(b)) = (self.monotonic_s, earlier.monotonic_s) {
            return Some(a - b);
        }
        let (a, b) = (self.wall?, earlier.wall?);
        Some((a.naive_seconds() - b.naive_seconds()) as f64)
    }

    /// A copy with the wall-clock time filled in from the monotonic time when the line had none.
    pub fn with_boot_time(mut self, boot_unix_s: Option<f64>) -> Timestamp {
        if let (None, Some(mono), Some(boot)) = (self.wall, self.monotonic_s, boot_unix_s) {
            self.wall = WallTime::from_unix_utc(boot + mono);
        }
        self
    }
}

/// How a line's timestamp was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineFormat {
    /// `[Sat Mar  4 04:10:52 2023] ` (`dmesg -T`).
    DmesgCtime,
    /// `[  967.723456] ` (plain `dmesg`, kernel console).
    Monotonic,
    /// `Jun 26 12:23:15 host kernel: ` (syslog, `journalctl -k`), maybe followed by `[ 123.4] `.
    Syslog,
    /// `2023-03-04T04:10:52,123456+01:00 ` (`dmesg --time-format iso`, `journalctl -o short-iso`).
    Iso,
    /// `6,1234,5678901,-;message` (records read from `/dev/kmsg`).
    Kmsg,
    /// No timestamp (`dmesg -t`) or one this reader does not know.
    Bare,
}

/// Filesystems a hung task can wait on, named by the modules and function prefixes of its stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Filesystem {
    Gpfs,
    Lustre,
    Nfs,
    Fuse,
    Ext4,
    Xfs,
    Btrfs,
    Overlay,
    Ceph,
    Cifs,
    #[serde(rename = "9p")]
    NineP,
    Beegfs,
    Zfs,
    Weka,
    Autofs,
}

impl Filesystem {
    /// The filesystem of a key as the JSON writes it (`gpfs`, `9p`): how kernel knowledge (`hangwatch-kernel`,
    /// which names filesystems by key) becomes this type.
    pub fn from_key(key: &str) -> Option<Filesystem> {
        use serde::de::IntoDeserializer;
        let key: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
            key.into_deserializer();
        Filesystem::deserialize(key).ok()
    }

    /// The name people use for it.
    pub fn display(self) -> &'static str {
        match self {
            Filesystem::Gpfs => "GPFS",
            Filesystem::Lustre => "Lustre",
            Filesystem::Nfs => "NFS",
            Filesystem::Fuse => "FUSE",
            Filesystem::Ext4 => "ext4",
            Filesystem::Xfs => "XFS",
            Filesystem::Btrfs => "Btrfs",
            Filesystem::Overlay => "overlayfs",
            Filesystem::Ceph => "CephFS",
            Filesystem::Cifs => "CIFS/SMB",
            Filesystem::NineP => "9p",
            Filesystem::Beegfs => "BeeGFS",
            Filesystem::Zfs => "ZFS",
            Filesystem::Weka => "WekaFS",
            Filesystem::Autofs => "autofs",
        }
    }

    /// Whether a mount's filesystem type (`fuse.bindfs`, `nfs4`, `lustre`) is this filesystem.
    pub fn matches_fstype(self, fstype: &str) -> bool {
        let base = fstype.split('.').next().unwrap_or(fstype);
        match self {
            Filesystem::Gpfs => base == "gpfs",
            Filesystem::Lustre => base == "lustre",
            Filesystem::Nfs => base.starts_with("nfs"),
            Filesystem::Fuse => base == "fuse" || base == "fuseblk",
            Filesystem::Ext4 => base == "ext4" || base == "ext3",
            Filesystem::Xfs => base == "xfs",
            Filesystem::Btrfs => base == "btrfs",
            Filesystem::Overlay => base == "overlay",
            Filesystem::Ceph => base == "ceph",
            Filesystem::Cifs => matches!(base, "cifs" | "smb3" | "smbfs"),
            Filesystem::NineP => base == "9p",
            Filesystem::Beegfs => base == "beegfs",
            Filesystem::Zfs => base == "zfs",
            Filesystem::Weka => base == "wekafs",
            Filesystem::Autofs => base == "autofs",
        }
    }
}

/// The lock owner named by "is blocked on a mutex likely owned by task X:N".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocker {
    pub comm: String,
    pub pid: u32,
    /// `mutex`, `semaphore`, `rw-semaphore`...
    pub lock: String,
}

/// The system call a hung task is in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Syscall {
    /// `write`; `None` for a number this reader does not know.
    pub name: Option<String>,
    /// Number from `ORIG_RAX` (x86_64).
    pub nr: Option<u64>,
    pub source: SyscallSource,
    /// The six argument registers (RDI, RSI, RDX, R10, R8, R9), when the registers were printed.
    pub args: Vec<u64>,
    /// File descriptor argument, for calls that take one first.
    pub fd: Option<i32>,
    /// Byte count argument of read/write/pread64/pwrite64.
    pub count: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyscallSource {
    /// `ORIG_RAX` of the user registers printed under the trace.
    Registers,
    /// The syscall entry frame of the stack (`ksys_write`, `__x64_sys_openat`).
    Stack,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComplaintKind {
    /// The server does not answer; the kernel keeps trying (hard mounts hang meanwhile).
    NotResponding,
    /// The kernel gave up on a request (soft mounts return an error).
    TimedOut,
    /// The connection to a server or target was lost.
    ConnectionLost,
    /// An error the filesystem reported.
    Error,
    /// I/O error of a block device.
    IoError,
    /// The server answers again / the connection is restored.
    Recovered,
}

impl ComplaintKind {
    pub fn display(self) -> &'static str {
        match self {
            ComplaintKind::NotResponding => "not responding",
            ComplaintKind::TimedOut => "timed out",
            ComplaintKind::ConnectionLost => "connection lost",
            ComplaintKind::Error => "error",
            ComplaintKind::IoError => "I/O error",
            ComplaintKind::Recovered => "recovered",
        }
    }
}

/// `Out of memory: Killed process 1234 (python) ...` / `Memory cgroup out of memory: Killed process ...`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomKill {
    pub time: Timestamp,
    pub pid: u32,
    pub comm: String,
    /// Killed for exceeding a memory cgroup's limit (a Slurm job's, typically) rather than the node's memory.
    pub cgroup: bool,
}

/// Schema version of [`Report`].
pub const REPORT_VERSION: u32 = 1;

/// Everything `hangwatch kmsg` found in a kernel log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub version: u32,
    /// The headline: the hung task that matters most (the one reported last), else the worst other finding.
    pub summary: String,
    /// Lines read, including those that carried nothing of interest.
    pub lines: u64,
    /// The timestamp format most lines had.
    pub format: Option<LineFormat>,
    /// Time of the first and last timestamped line.
    pub first_time: Option<Timestamp>,
    pub last_time: Option<Timestamp>,
    /// Hung tasks, the one reported last first.
    pub hung_tasks: Vec<HungTask>,
    /// Hung-task reports read (all tasks).
    pub hung_task_reports: u32,
    /// The kernel stopped reporting hung tasks (`kernel.hung_task_warnings` ran out): later hangs are not in
    /// the log.
    pub hung_task_reports_suppressed: bool,
    pub suppressed_at: Option<Timestamp>,
    pub xids: Vec<XidGroup>,
    pub fs_complaints: Vec<FsComplaintGroup>,
    pub oom_kills: Vec<OomKill>,
}

/// One task (comm, pid) and all the hung-task reports about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HungTask {
    /// One line for people: `pid 280058 (python) blocked in write() on GPFS since about 04:08:52 — ...`.
    pub summary: String,
    pub comm: String,
    pub pid: u32,
    pub tgid: Option<u32>,
    pub ppid: Option<u32>,
    pub state: Option<String>,
    pub reports: u32,
    pub first_report: Timestamp,
    pub last_report: Timestamp,
    /// The N of the first report's "blocked for more than N seconds".
    pub blocked_for_s: u64,
    /// The largest N of all reports (recent kernels print the actual time, which grows).
    pub max_blocked_for_s: u64,
    /// Estimate: the first report's time minus its N. The task was blocked at least since then.
    pub blocked_since: Option<Timestamp>,
    /// From the registers when any report printed them, else from the stack.
    pub syscall: Option<Syscall>,
    pub filesystem: Option<Filesystem>,
    /// `GPFS`, `NFS`, `ext4`...
    pub filesystem_name: Option<String>,
    pub filesystem_frame: Option<String>,
    pub frozen: bool,
    pub operation: Option<String>,
    pub wchan: Option<String>,
    /// Stack of the last report that printed one: reliable frames, innermost first, without offsets.
    pub stack: Vec<String>,
    /// How many different stacks the reports showed (1 when the task never moved).
    pub distinct_stacks: u32,
    pub blocked_on: Option<Blocker>,
}

/// Xid errors of one code on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XidGroup {
    pub pci: String,
    pub code: u32,
    /// What the code means and what to do, for well-known codes.
    pub meaning: Option<String>,
    pub count: u32,
    pub first: Timestamp,
    pub last: Timestamp,
    /// The driver's text of the first occurrence.
    pub message: String,
    /// Processes the driver named, in order of first appearance.
    pub pids: Vec<u32>,
    pub processes: Vec<String>,
}

/// Complaints of one kind about one server, target or device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FsComplaintGroup {
    pub filesystem: Option<Filesystem>,
    /// `NFS`, `Lustre`... or `block device`.
    pub filesystem_name: String,
    pub kind: ComplaintKind,
    pub target: Option<String>,
    pub count: u32,
    pub first: Timestamp,
    pub last: Timestamp,
    /// The first message, verbatim.
    pub message: String,
    /// When the same server or target was reported back (`nfs: server X OK`, Lustre `Connection restored`)
    /// after the last complaint; `null` while it has not recovered in this log.
    pub recovered_at: Option<Timestamp>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_filesystems_match_mount_types() {
        assert!(Filesystem::Fuse.matches_fstype("fuse.bindfs"));
        assert!(Filesystem::Fuse.matches_fstype("fuseblk"));
        assert!(Filesystem::Nfs.matches_fstype("nfs4"));
        assert!(Filesystem::Gpfs.matches_fstype("gpfs"));
        assert!(!Filesystem::Fuse.matches_fstype("ext4"));
    }

    #[test]
    fn filesystems_read_from_their_keys() {
        assert_eq!(Filesystem::from_key("gpfs"), Some(Filesystem::Gpfs));
        assert_eq!(Filesystem::from_key("9p"), Some(Filesystem::NineP));
        assert_eq!(Filesystem::from_key("nine_p"), None);
    }
}
