//! Which kernel-log lines concern one job: what a watcher run by root may hand to a job's owner, who could not
//! read the node's log (`kernel.dmesg_restrict`) and must not see other users' OOM kills, faults and hung tasks.
//! Pure: lines in, the kept lines out, in their order.
//!
//! A line is kept when it is
//! - part of a hung-task report (header, task line, stack, registers, the lock owner's dump after it) of a task of
//!   the job (`pid` or `tgid` among [`JobScope::pids`]);
//! - an OOM kill (`Killed process`, the `oom-kill:` summary, `oom_reaper: reaped process`) of a process of the job,
//!   or of the job's user (`UID:`/`uid=`: a DataLoader worker the roll call never saw);
//! - a fault of a process of the job (`python[PID]: segfault at`, `traps: ...`) and the `Code:` line after it;
//! - a filesystem or storage complaint about a filesystem the ranks use ([`JobScope::mounts`]: an NFS server, a
//!   Lustre file system, a device, the same kind of filesystem when the line names none);
//! - node-wide and nobody's: NVIDIA Xid errors (a GPU of the node failing is every job's business) and the end of
//!   hung-task reporting;
//! - a `/dev/kmsg` dictionary line (` SUBSYSTEM=...`) after a kept line.
//!
//! Everything else is dropped: other processes' reports, the OOM killer's table of every process on the node,
//! audit and driver lines, kernel addresses.

use std::collections::BTreeSet;

use crate::notices::{self, parse_oom_constraint, FsComplaint};
use crate::parser::{Event, LineUse, Parser};
use crate::prefix::split_prefix;
use hangwatch_model::kernel_log::Filesystem;

/// The job the lines are kept for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobScope {
    /// Its processes and their threads (the hung-task detector names a thread).
    pub pids: BTreeSet<u32>,
    /// Its user: OOM kills of that uid are kept.
    pub uid: Option<u32>,
    /// The filesystems its ranks use: `(fstype, source)` as mountinfo says (`nfs4`, `srv:/export`).
    pub mounts: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Role {
    Report(usize),
    Keep,
    Drop,
    /// A `/dev/kmsg` dictionary line: goes with the line before it.
    Dictionary,
    /// A `Code:` line: kept after a kept fault.
    Code,
}

/// The lines of `lines` that concern `scope` (see the module doc), in order.
pub fn lines_of_job<'a>(lines: &[&'a str], scope: &JobScope) -> Vec<&'a str> {
    let mut parser = Parser::new();
    let mut events = Vec::new();
    let mut roles = Vec::with_capacity(lines.len());
    for line in lines {
        let used = parser.push_line_use(line, &mut events);
        let role = match used {
            LineUse::HungReport(n) => Role::Report(n),
            LineUse::Notice => match events.last() {
                Some(event) if notice_concerns(event, line, scope) => Role::Keep,
                _ => Role::Drop,
            },
            LineUse::Unused if line.starts_with(' ') => Role::Dictionary,
            LineUse::Unused => other_line_role(line, scope),
        };
        roles.push(role);
    }
    parser.flush(&mut events);
    let reports: Vec<bool> = events
        .iter()
        .filter_map(|e| match e {
            Event::HungTask(report) => Some(
                scope.pids.contains(&report.pid)
                    || report.tgid.is_some_and(|tgid| scope.pids.contains(&tgid)),
            ),
            _ => None,
        })
        .collect();
    let mut kept = Vec::new();
    let mut previous_kept = false;
    for (line, role) in lines.iter().zip(roles) {
        let keep = match role {
            Role::Report(n) => reports.get(n).copied().unwrap_or(false),
            Role::Keep => true,
            Role::Drop => false,
            Role::Dictionary | Role::Code => previous_kept,
        };
        if keep {
            kept.push(*line);
        }
        if role != Role::Dictionary {
            previous_kept = keep;
        }
    }
    kept
}

fn notice_concerns(event: &Event, line: &str, scope: &JobScope) -> bool {
    match event {
        Event::HungTaskReportsSuppressed { .. } | Event::Xid(_) => true,
        Event::OomKill(oom) => {
            scope.pids.contains(&oom.pid)
                || (scope.uid.is_some() && notices::oom_uid(line) == scope.uid)
        }
        Event::FsComplaint(complaint) => scope
            .mounts
            .iter()
            .any(|(fstype, source)| complaint_concerns(complaint, fstype, source)),
        // Only one-line notices come back as a line's own event.
        Event::HungTask(_) => false,
    }
}

/// Lines the report does not read but that concern a process: the OOM summary and reaper, faults.
fn other_line_role(line: &str, scope: &JobScope) -> Role {
    let Some(entry) = split_prefix(line) else {
        return Role::Drop;
    };
    let text = entry.text.as_ref();
    if text.trim_start().starts_with("Code: ") {
        return Role::Code;
    }
    let ours = |pid: u32| scope.pids.contains(&pid);
    let keep = if let Some(summary) = parse_oom_constraint(text) {
        ours(summary.pid) || (scope.uid.is_some() && notices::oom_uid(text) == scope.uid)
    } else if let Some(pid) = notices::parse_oom_reaped(text) {
        ours(pid)
    } else if let Some(pid) = notices::parse_user_fault(text) {
        ours(pid)
    } else {
        false
    };
    if keep {
        Role::Keep
    } else {
        Role::Drop
    }
}

/// Whether `complaint` is about the filesystem mounted from `source` (type `fstype`).
pub fn complaint_concerns(complaint: &FsComplaint, fstype: &str, source: &str) -> bool {
    if let Some(filesystem) = complaint.filesystem {
        if !filesystem.matches_fstype(fstype) {
            return false;
        }
        // Ceph names its monitors and MDS ranks, GPFS and some Lustre lines nothing: the kind must do.
        if filesystem == Filesystem::Ceph || complaint.target.is_none() {
            return true;
        }
    }
    let Some(target) = complaint.target.as_deref() else {
        return false;
    };
    source_names(source, target)
}

/// Whether a complaint's `target` (an NFS or CIFS server, a Lustre target, a block device) names the mount
/// `source` (`srv:/export`, `//srv/share`, `10.0.0.2@o2ib:/scratch`, `/dev/sda1`).
fn source_names(source: &str, target: &str) -> bool {
    let target = target.trim_start_matches(['\\', '/']);
    if target.is_empty() {
        return false;
    }
    let short = |host: &str| host.split('.').next().unwrap_or(host).to_string();
    if let Some(share) = source.strip_prefix("//") {
        let host = share.split('/').next().unwrap_or(share);
        return short(host) == short(target);
    }
    if let Some((host, path)) = source.split_once(":/") {
        // Lustre: `MGS@NET:/fsname`, targets `fsname-OST0003`.
        if host.contains('@') {
            let fsname = path.trim_matches('/');
            return target
                .strip_prefix(fsname)
                .is_some_and(|rest| rest.starts_with('-'));
        }
        let host = host.split(',').next().unwrap_or(host);
        return short(host) == short(target);
    }
    let device = source.rsplit('/').next().unwrap_or(source);
    if device == target {
        return true;
    }
    // The disk of a partition: `sdb` for `/dev/sdb1`, `nvme0n1` for `/dev/nvme0n1p2`.
    device.strip_prefix(target).is_some_and(|rest| {
        let digits = rest.strip_prefix('p').unwrap_or(rest);
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> JobScope {
        JobScope {
            pids: [5390, 5391, 5402].into_iter().collect(),
            uid: Some(1001),
            mounts: vec![
                ("ext4".into(), "/dev/loop3".into()),
                ("nfs4".into(), "fs01.cluster:/export/home".into()),
                ("lustre".into(), "10.0.0.2@o2ib:/scratch".into()),
            ],
        }
    }

    fn kept(log: &str) -> Vec<&str> {
        let lines: Vec<&str> = log.lines().collect();
        lines_of_job(&lines, &scope())
    }

    const HUNG_OURS: &str = "\
3,100,900000000,-;INFO: task python:5402 blocked for more than 120 seconds.
3,101,900000001,-;      Not tainted 6.8.0 #1
3,102,900000002,-;\"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.
6,103,900000003,-;task:python          state:D stack:0     pid:5402  tgid:5390  ppid:5380   flags:0x00000002
6,104,900000004,-;Call Trace:
6,105,900000005,-; <TASK>
6,106,900000006,-; __schedule+0x2d1/0x8a0
6,107,900000007,-; percpu_rwsem_wait+0x10b/0x130
6,108,900000008,-; ext4_buffered_write_iter+0x3c/0x140
6,109,900000009,-; ksys_write+0x6f/0xf0
6,110,900000010,-; </TASK>";

    const HUNG_THEIRS: &str = "\
3,200,910000000,-;INFO: task rsync:7777 blocked for more than 120 seconds.
6,201,910000001,-;task:rsync           state:D stack:0     pid:7777  tgid:7777  ppid:1   flags:0x00000002
6,202,910000002,-;Call Trace:
6,203,910000003,-; <TASK>
6,204,910000004,-; __schedule+0x2d1/0x8a0
6,205,910000005,-; nfs_wait_bit_killable+0x1e/0x90 [nfs]
6,206,910000006,-; </TASK>";

    #[test]
    fn the_jobs_hung_task_report_is_kept_whole_anothers_is_dropped_whole() {
        let log = format!("{HUNG_THEIRS}\n{HUNG_OURS}\n{HUNG_THEIRS}");
        let kept = kept(&log);
        assert_eq!(kept, HUNG_OURS.lines().collect::<Vec<_>>());
    }

    #[test]
    fn a_report_is_the_jobs_by_its_thread_or_its_process() {
        // Thread 5402 is not in the scope, its process (tgid 5390) is.
        let mut only_the_process = scope();
        only_the_process.pids = [5390].into_iter().collect();
        let lines: Vec<&str> = HUNG_OURS.lines().collect();
        assert_eq!(lines_of_job(&lines, &only_the_process).len(), lines.len());
        only_the_process.pids = [1].into_iter().collect();
        assert!(lines_of_job(&lines, &only_the_process).is_empty());
    }

    #[test]
    fn oom_kills_of_the_job_or_its_user_are_kept_the_killers_table_and_others_are_not() {
        let log = "\
4,300,920000000,-;python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0
6,301,920000001,-;[  pid  ]   uid  tgid total_vm      rss name
6,302,920000002,-;[   7777]  1002  7777    10000     500 secret_tool
6,303,920000003,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=python,pid=5391,uid=1001
3,304,920000004,-;Memory cgroup out of memory: Killed process 5391 (python) total-vm:1kB, UID:1001 pgtables:4kB
6,305,920000005,-;oom_reaper: reaped process 5391 (python), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB
6,306,920000006,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=pt_data_worker,pid=6000,uid=1001
3,307,920000007,-;Memory cgroup out of memory: Killed process 6000 (pt_data_worker) total-vm:1kB, UID:1001 pgtables:4kB
6,308,920000008,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=secret_tool,pid=7777,uid=1002
3,309,920000009,-;Memory cgroup out of memory: Killed process 7777 (secret_tool) total-vm:1kB, UID:1002 pgtables:4kB
6,310,920000010,-;oom_reaper: reaped process 7777 (secret_tool), now anon-rss:0kB";
        let kept = kept(log);
        let numbers: Vec<&str> = kept.iter().map(|l| &l[2..5]).collect();
        assert_eq!(numbers, ["303", "304", "305", "306", "307"], "{kept:#?}");
    }

    #[test]
    fn faults_of_the_jobs_processes_are_kept_with_their_code_line() {
        let log = "\
6,400,930000000,-;python[5391]: segfault at 0 ip 00007f0 sp 00007ffe error 4 in libc.so.6[7f0+1000]
6,401,930000001,-;Code: 48 89 e5 41 57 41 56
6,402,930000002,-;other[7777]: segfault at 10 ip 00007f0 sp 00007ffe error 6 in libfoo.so[7f0+2000]
6,403,930000003,-;Code: 0f 0b 90 90
6,404,930000004,-;traps: python[5390] general protection fault ip:7f0 sp:7ffe error:0 in libtorch.so[7f0+9]";
        let kept = kept(log);
        let numbers: Vec<&str> = kept.iter().map(|l| &l[2..5]).collect();
        assert_eq!(numbers, ["400", "401", "404"]);
    }

    #[test]
    fn filesystem_complaints_about_the_jobs_mounts_are_kept() {
        let log = "\
3,500,940000000,-;EXT4-fs error (device loop3): ext4_find_entry:1455: inode #2: comm python: reading directory lblock 0
3,501,940000001,-;EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0
4,502,940000002,-;nfs: server fs01 not responding, still trying
4,503,940000003,-;nfs: server other-nas not responding, still trying
3,504,940000004,-;LustreError: 11-0: scratch-OST0003-osc-ffff9a0c1b2d3000: operation ost_write to node 10.0.0.3@o2ib failed: rc = -107
3,505,940000005,-;LustreError: 11-0: project-OST0001-osc-ffff9a0c1b2d3000: operation ost_write failed: rc = -107
3,506,940000006,-;blk_update_request: I/O error, dev loop3, sector 1234 op 0x1:(WRITE)
3,507,940000007,-;blk_update_request: I/O error, dev sdb, sector 1234 op 0x1:(WRITE)
3,508,940000008,-;mmfs: [E] Unable to mount gpfs1";
        let kept = kept(log);
        let numbers: Vec<&str> = kept.iter().map(|l| &l[2..5]).collect();
        assert_eq!(numbers, ["500", "502", "504", "506"], "{kept:#?}");
    }

    #[test]
    fn node_wide_hardware_lines_are_kept_other_lines_are_not() {
        let log = "\
4,600,950000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=7777, name=other, GPU has fallen off the bus.
 SUBSYSTEM=pci
 DEVICE=+pci:0000:3b:00.0
5,601,950000001,-;audit: type=1400 audit(1700000000.000:42): apparmor=\"DENIED\" operation=\"open\" profile=\"x\" name=\"/home/other/.ssh/id_rsa\" pid=7777 comm=\"cat\"
 SUBSYSTEM=audit
3,602,950000002,-;Future hung task reports are suppressed, see sysctl kernel.hung_task_warnings
6,603,950000003,-;usb 1-1: new high-speed USB device number 2 using xhci_hcd
4,604,950000004,-;hangwatch-test-marker-XYZ";
        let kept = kept(log);
        assert_eq!(kept.len(), 4, "{kept:#?}");
        assert!(kept[0].contains("Xid"));
        assert_eq!(kept[1], " SUBSYSTEM=pci");
        assert!(kept[3].contains("Future hung task reports are suppressed"));
        assert!(!kept
            .iter()
            .any(|l| l.contains("audit") || l.contains("marker")));
    }

    #[test]
    fn devices_and_servers_name_their_mounts() {
        assert!(source_names("/dev/sdb1", "sdb"));
        assert!(source_names("/dev/nvme0n1p2", "nvme0n1"));
        assert!(!source_names("/dev/sdb1", "sd"));
        assert!(!source_names("/dev/sdba", "sdb"));
        assert!(source_names("fs01.cluster:/export", "fs01"));
        assert!(source_names("//nas1/share", "nas1.example"));
        assert!(!source_names("10.0.0.2@o2ib:/scratch", "scratchy-OST0001"));
        assert!(source_names("10.0.0.2@o2ib:/scratch", "scratch-MDT0000"));
        assert!(!source_names("/dev/loop3", ""));
    }
}
