//! The real kernel log of the m4 tr_141 hang must read as what happened: python:280058 blocked in a GPFS write.

use hangwatch_kmsg::{report_from_text, Filesystem, Report, SyscallSource};

fn fixture() -> Report {
    report_from_text(include_str!("fixtures/m4-tr141-iam06-dmesg.txt"))
}

#[test]
fn headline_names_the_python_writer_on_gpfs() {
    let report = fixture();
    assert_eq!(
        report.summary,
        "pid 280058 (python) blocked in write() on GPFS since about 04:08:52 — reported 9 times, 04:10:52 to 04:27:15"
    );
}

#[test]
fn python_task_details() {
    let report = fixture();
    let task = &report.hung_tasks[0];
    assert_eq!(
        (task.comm.as_str(), task.pid, task.ppid),
        ("python", 280058, Some(279966))
    );
    assert_eq!(task.reports, 9);
    assert_eq!(
        task.first_report.wall.map(|w| w.to_string()).as_deref(),
        Some("2023-03-04T04:10:52")
    );
    assert_eq!(
        task.last_report.wall.map(|w| w.to_string()).as_deref(),
        Some("2023-03-04T04:27:15")
    );
    assert_eq!(
        task.blocked_since
            .and_then(|t| t.wall)
            .map(|w| w.to_string())
            .as_deref(),
        Some("2023-03-04T04:08:52")
    );
    assert_eq!(task.state.as_deref(), Some("D"));
    let call = task.syscall.as_ref().expect("syscall");
    assert_eq!(call.name.as_deref(), Some("write"));
    assert_eq!(
        (call.nr, call.fd, call.count, call.source),
        (Some(1), Some(108), Some(2440), SyscallSource::Registers)
    );
    assert_eq!(task.filesystem, Some(Filesystem::Gpfs));
    assert_eq!(task.wchan.as_deref(), Some("cxiWaitEventWait [mmfslinux]"));
    assert_eq!(task.operation.as_deref(), Some("write"));
    assert!(!task.frozen);
    assert_eq!(task.distinct_stacks, 1);
    assert!(task
        .stack
        .contains(&"gpfs_f_rdwr_iter [mmfslinux]".to_string()));
    assert!(
        task.stack.iter().all(|f| !f.contains("+0x")),
        "frames without offsets"
    );
}

#[test]
fn earlier_epilog_report_is_a_gpfs_lookup() {
    let report = fixture();
    assert_eq!(report.hung_tasks.len(), 2);
    assert_eq!(report.hung_task_reports, 10);
    let epilog = &report.hung_tasks[1];
    assert_eq!(
        (
            epilog.comm.as_str(),
            epilog.pid,
            epilog.ppid,
            epilog.reports
        ),
        ("epilog.sh", 76609, Some(76603), 1)
    );
    assert_eq!(epilog.filesystem, Some(Filesystem::Gpfs));
    assert_eq!(epilog.operation.as_deref(), Some("lookup"));
    assert_eq!(
        epilog.syscall.as_ref().and_then(|c| c.name.as_deref()),
        Some("stat")
    );
    assert_eq!(
        epilog.summary,
        "pid 76609 (epilog.sh) blocked in stat() on GPFS (lookup) since about 2023-03-02 15:57:56 — reported once, at \
         2023-03-02 15:59:56"
    );
}

#[test]
fn nothing_else_is_invented() {
    let report = fixture();
    assert!(report.xids.is_empty(), "{:?}", report.xids);
    assert!(
        report.fs_complaints.is_empty(),
        "{:?}",
        report.fs_complaints
    );
    assert!(report.oom_kills.is_empty());
    assert!(!report.hung_task_reports_suppressed);
    assert_eq!(report.lines, 7227);
}

#[test]
fn recent_kernel_report_of_a_write_on_a_frozen_ext4() {
    let report = report_from_text(include_str!("fixtures/frozen-ext4-linux-6.18-dmesg.txt"));
    assert_eq!(
        report.summary,
        "pid 27420 (python3) blocked in write() on a frozen filesystem since about boot+1119.4s — reported once, at \
         boot+1123.4s"
    );
    let task = &report.hung_tasks[0];
    assert_eq!(
        (task.tgid, task.ppid, task.blocked_for_s),
        (Some(27420), Some(27409), 4)
    );
    assert!(task.frozen);
    assert_eq!(
        task.filesystem, None,
        "no frame names ext4: the wait is in vfs_write"
    );
    assert_eq!(task.wchan.as_deref(), Some("percpu_rwsem_wait"));
    let call = task.syscall.as_ref().expect("syscall");
    assert_eq!(
        (call.name.as_deref(), call.fd, call.count),
        (Some("write"), Some(3), Some(16))
    );
    assert_eq!(
        task.stack,
        [
            "__schedule",
            "schedule",
            "percpu_rwsem_wait",
            "__percpu_down_read",
            "vfs_write",
            "ksys_write",
            "do_syscall_64",
            "entry_SYSCALL_64_after_hwframe"
        ]
    );
}
