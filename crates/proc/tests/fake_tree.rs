//! End to end over a fake /proc tree: a rank with two threads, one blocked in `write(3, ...)` on
//! `/shared/log.txt` (ext4 mount `/shared`), one spinning; plus process-tree walks and the files that must never
//! be read.

#![expect(clippy::unwrap_used, reason = "test fixtures fail loudly")]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use hangwatch_model::{FileRef, SyscallObservation, ThreadObservation};
use hangwatch_proc::{observe_threads, FileTarget, ProcFs, ReadError, SyscallLine};

const PID: i32 = 4242;
/// `write` on the architecture the test runs on.
const WRITE_NR: i64 = if cfg!(target_arch = "aarch64") { 64 } else { 1 };
const SPINNER: i32 = 4250;

const MOUNTINFO: &str = "22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
40 27 7:0 / /shared rw,relatime - ext4 /dev/loop0 rw
";

fn stat_line(tid: i32, comm: &str, state: char, utime: u64, ppid: i32) -> String {
    format!(
        "{tid} ({comm}) {state} {ppid} {PID} 4037 0 -1 4194304 2912 6565 0 9 {utime} 2 3 3 20 0 2 0 36146 \
         16961536 3328 18446744073709551615 1 1 1 0 0 0 0 16781318 0 1 0 0 17 1 0 0 0 0 0 1 1 1 1 1 1 1 0\n"
    )
}

fn status_text(tid: i32, state: &str, voluntary: u64, nonvoluntary: u64) -> String {
    format!(
        "Name:\tpython3\nUmask:\t0022\nState:\t{state}\nTgid:\t{PID}\nNgid:\t0\nPid:\t{tid}\nPPid:\t1\n\
         TracerPid:\t0\nThreads:\t2\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n\
         SigBlk:\t0000000000000000\nVmRSS:\t   13444 kB\nvoluntary_ctxt_switches:\t{voluntary}\n\
         nonvoluntary_ctxt_switches:\t{nonvoluntary}\n"
    )
}

/// Fake `/proc` in a temporary directory.
struct FakeProc {
    dir: tempfile::TempDir,
}

impl FakeProc {
    fn new() -> Self {
        let fake = FakeProc {
            dir: tempfile::tempdir().unwrap(),
        };
        fake.process(PID, 1, &[PID, SPINNER]);
        let pid_dir = fake.pid_dir(PID);
        fs::write(pid_dir.join("mountinfo"), MOUNTINFO).unwrap();
        fs::write(
            pid_dir.join("io"),
            "rchar: 10\nwchar: 2490\nsyscr: 1\nsyscw: 3\nread_bytes: 0\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n",
        )
        .unwrap();
        fs::create_dir_all(pid_dir.join("fd")).unwrap();
        fs::create_dir_all(pid_dir.join("fdinfo")).unwrap();
        symlink("/shared/log.txt", pid_dir.join("fd/3")).unwrap();
        fs::write(
            pid_dir.join("fdinfo/3"),
            "pos:\t2490\nflags:\t0102001\nmnt_id:\t40\nino:\t12\n",
        )
        .unwrap();
        symlink("/shared/run", pid_dir.join("cwd")).unwrap();
        symlink("/usr/bin/python3.11", pid_dir.join("exe")).unwrap();

        let writer = fake.task_dir(PID, PID);
        fs::write(writer.join("stat"), stat_line(PID, "python3", 'D', 40, 1)).unwrap();
        fs::write(
            writer.join("status"),
            status_text(PID, "D (disk sleep)", 120, 7),
        )
        .unwrap();
        fs::write(writer.join("wchan"), "percpu_rwsem_wait").unwrap();
        fs::write(
            writer.join("syscall"),
            format!(
                "{WRITE_NR} 0x3 0x7f462c751fa0 0x1c 0x0 0x0 0x0 0x7ffd205f8a70 0x7f462c11638f\n"
            ),
        )
        .unwrap();
        fs::write(
            writer.join("stack"),
            "[<0>] percpu_rwsem_wait+0x13c/0x170\n[<0>] ext4_buffered_write_iter+0x2f/0x140\n\
             [<0>] vfs_write+0x398/0x450\n[<0>] ksys_write+0xba/0xe0\n[<0>] do_syscall_64+0x71/0x280\n",
        )
        .unwrap();

        fake.spinner(300, 40);
        fake
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn pid_dir(&self, pid: i32) -> PathBuf {
        self.root().join(pid.to_string())
    }

    fn task_dir(&self, pid: i32, tid: i32) -> PathBuf {
        self.pid_dir(pid).join("task").join(tid.to_string())
    }

    /// A process directory with threads and the files that must never be read, as FIFOs without a writer:
    /// opening one blocks, as `cmdline`/`environ`/`maps` of a stuck rank can.
    fn process(&self, pid: i32, ppid: i32, tids: &[i32]) {
        let dir = self.pid_dir(pid);
        for tid in tids {
            let task = self.task_dir(pid, *tid);
            fs::create_dir_all(&task).unwrap();
            fs::write(task.join("stat"), stat_line(*tid, "python3", 'S', 1, ppid)).unwrap();
            fs::write(task.join("status"), status_text(*tid, "S (sleeping)", 1, 1)).unwrap();
            fs::write(task.join("wchan"), "0").unwrap();
            fs::write(task.join("syscall"), "running\n").unwrap();
            fs::write(task.join("children"), "").unwrap();
        }
        fs::write(dir.join("stat"), stat_line(pid, "python3", 'S', 1, ppid)).unwrap();
        fs::write(dir.join("status"), status_text(pid, "S (sleeping)", 1, 1)).unwrap();
        for never in ["cmdline", "environ", "maps"] {
            nix::unistd::mkfifo(
                &dir.join(never),
                nix::sys::stat::Mode::from_bits_truncate(0o600),
            )
            .unwrap();
        }
    }

    fn spinner(&self, utime: u64, nonvoluntary: u64) {
        let task = self.task_dir(PID, SPINNER);
        fs::write(
            task.join("stat"),
            stat_line(SPINNER, "python3", 'R', utime, 1),
        )
        .unwrap();
        fs::write(
            task.join("status"),
            status_text(SPINNER, "R (running)", 3, nonvoluntary),
        )
        .unwrap();
        fs::write(task.join("wchan"), "0").unwrap();
        fs::write(task.join("syscall"), "running\n").unwrap();
        fs::write(task.join("stack"), "").unwrap();
    }

    fn children(&self, pid: i32, tid: i32, children: &str) {
        fs::write(self.task_dir(pid, tid).join("children"), children).unwrap();
    }
}

/// Runs `f` on another thread and fails the test if it does not return within 10 s: a read of a FIFO (a file
/// that must never be read) would block forever.
fn within_deadline<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the reader blocked: it opened a file it must never read")
}

#[test]
fn blocked_writer_and_spinner_end_to_end() {
    let fake = FakeProc::new();
    let procfs = ProcFs::new(fake.root());
    let first = procfs.sample_process(PID).unwrap();
    fake.spinner(350, 52);
    let second = procfs.sample_process(PID).unwrap();
    assert!(first.issues.is_empty(), "{:?}", first.issues);
    assert_eq!(second.tracer_pid(), Some(0));

    let mut resolver = procfs.file_resolver(PID);
    let observed = observe_threads(&first, &second, Duration::from_millis(500), 100, |t| {
        resolver.resolve(t)
    });
    assert!(resolver.issues().is_empty(), "{:?}", resolver.issues());
    assert_eq!(observed.len(), 2);

    let writer = &observed[0];
    let expected_syscall = SyscallObservation::InSyscall {
        nr: WRITE_NR,
        name: Some("write".into()),
        args: vec![3, 0x7f462c751fa0, 0x1c, 0, 0, 0],
        fd: Some(3),
        file: Some(FileRef {
            filesystem: None,
            path: "/shared/log.txt".into(),
            mount: Some("/shared".into()),
            fstype: Some("ext4".into()),
            source: Some("/dev/loop0".into()),
        }),
        path: None,
    };
    assert_eq!(
        writer,
        &ThreadObservation {
            tid: PID,
            name: Some("python3".into()),
            state: 'D',
            wchan: Some("percpu_rwsem_wait".into()),
            syscall: Some(expected_syscall),
            kernel_stack: Some(vec![
                "percpu_rwsem_wait".into(),
                "ext4_buffered_write_iter".into(),
                "vfs_write".into(),
                "ksys_write".into(),
                "do_syscall_64".into(),
            ]),
            voluntary_ctxt_switches: Some(120),
            nonvoluntary_ctxt_switches: Some(7),
            not_running_for_ms: Some(500),
            cpu_ms_during_sample: Some(0),
            cpu_ms_total: Some(420),
            sigkill_pending: false,
            second_look: None,
        }
    );

    let spinner = &observed[1];
    assert_eq!(spinner.tid, SPINNER);
    assert_eq!(spinner.state, 'R');
    assert_eq!(spinner.syscall, Some(SyscallObservation::Running));
    assert_eq!(spinner.wchan, None);
    assert_eq!(spinner.not_running_for_ms, None);
    assert_eq!(spinner.cpu_ms_during_sample, Some(500));
    assert_eq!(spinner.cpu_ms_total, Some(3520));
    assert_eq!(spinner.kernel_stack, Some(vec![]));
}

#[test]
fn single_reads() {
    let fake = FakeProc::new();
    let procfs = ProcFs::new(fake.root());
    assert_eq!(procfs.list_threads(PID).unwrap(), [PID, SPINNER]);
    assert_eq!(procfs.stat(PID).unwrap().comm, "python3");
    assert_eq!(procfs.cwd(PID).unwrap(), "/shared/run");
    assert_eq!(procfs.exe(PID).unwrap(), "/usr/bin/python3.11");
    assert_eq!(procfs.fd_link(PID, 3).unwrap(), "/shared/log.txt");
    assert_eq!(procfs.fdinfo(PID, 3).unwrap().mnt_id, Some(40));
    assert_eq!(procfs.io(PID).unwrap().wchar, Some(2490));
    assert_eq!(
        procfs.syscall(PID, PID).unwrap(),
        SyscallLine::InSyscall {
            nr: WRITE_NR,
            args: [3, 0x7f462c751fa0, 0x1c, 0, 0, 0],
            sp: 0x7ffd205f8a70,
            pc: 0x7f462c11638f
        }
    );
    let cwd = procfs.resolve(PID, FileTarget::Cwd, Some(&procfs.mountinfo(PID).unwrap()));
    assert_eq!(cwd.unwrap().mount.as_deref(), Some("/shared"));
    assert!(matches!(procfs.fd_link(PID, 9), Err(ReadError::Io { .. })));
}

#[test]
fn vanished_process_and_thread_say_exited() {
    let fake = FakeProc::new();
    let procfs = ProcFs::new(fake.root());
    let err = procfs.sample_process(31337).unwrap_err();
    assert!(
        matches!(err, ReadError::ProcessExited { pid: 31337 }),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "process 31337 exited");
    assert!(procfs.fd_link(31337, 3).unwrap_err().is_exited());
    let err = procfs.task_stat(PID, 5555).unwrap_err();
    assert!(
        matches!(
            err,
            ReadError::ThreadExited {
                pid: PID,
                tid: 5555
            }
        ),
        "{err:?}"
    );
}

#[test]
fn missing_stack_is_none_and_missing_status_is_an_issue() {
    let fake = FakeProc::new();
    fs::remove_file(fake.task_dir(PID, SPINNER).join("stack")).unwrap();
    fs::remove_file(fake.task_dir(PID, SPINNER).join("status")).unwrap();
    let sample = ProcFs::new(fake.root()).sample_process(PID).unwrap();
    let spinner = &sample.threads[1];
    assert_eq!(spinner.kernel_stack, None);
    assert_eq!(spinner.status, None);
    assert_eq!(sample.issues.len(), 1, "{:?}", sample.issues);
    assert!(sample.issues[0].contains("status"), "{:?}", sample.issues);
}

#[test]
fn garbage_in_a_file_is_a_parse_error_naming_it() {
    let fake = FakeProc::new();
    fs::write(fake.task_dir(PID, PID).join("syscall"), "1 0x3\n").unwrap();
    let procfs = ProcFs::new(fake.root());
    let err = procfs.syscall(PID, PID).unwrap_err();
    assert!(matches!(err, ReadError::Parse { .. }), "{err:?}");
    assert!(err.to_string().ends_with("/task/4242/syscall"), "{err}");
    let sample = procfs.sample_process(PID).unwrap();
    assert_eq!(sample.threads[0].syscall, None);
    assert_eq!(sample.issues.len(), 1);
}

#[test]
fn descendants_from_children_files() {
    let fake = FakeProc::new();
    fake.process(5000, PID, &[5000]);
    fake.process(5001, PID, &[5001]);
    fake.process(6000, 5000, &[6000, 6001]);
    fake.children(PID, PID, "5000 ");
    fake.children(PID, SPINNER, "5001 ");
    fake.children(5000, 5000, "6000 ");
    let procfs = ProcFs::new(fake.root());
    assert_eq!(procfs.children(PID).unwrap(), [5000, 5001]);
    assert_eq!(procfs.descendants(PID).unwrap(), [5000, 5001, 6000]);
    assert_eq!(procfs.descendants(6000).unwrap(), Vec::<i32>::new());
}

#[test]
fn descendants_by_scanning_stat_when_children_files_are_absent() {
    let fake = FakeProc::new();
    fake.process(5000, PID, &[5000]);
    fake.process(6000, 5000, &[6000]);
    fake.process(7000, 1, &[7000]);
    for (pid, tid) in [
        (PID, PID),
        (PID, SPINNER),
        (5000, 5000),
        (6000, 6000),
        (7000, 7000),
    ] {
        fs::remove_file(fake.task_dir(pid, tid).join("children")).unwrap();
    }
    let procfs = ProcFs::new(fake.root());
    assert_eq!(procfs.children(PID).unwrap(), [5000]);
    assert_eq!(procfs.descendants(PID).unwrap(), [5000, 6000]);
    let subtree: Vec<(i32, i32)> = procfs
        .subtree(&[PID])
        .iter()
        .map(|s| (s.pid, s.ppid))
        .collect();
    assert_eq!(subtree, [(PID, 1), (5000, PID), (6000, 5000)]);
}

#[test]
fn subtree_has_each_process_stat_and_skips_a_listed_child_whose_parent_is_another() {
    let fake = FakeProc::new();
    fake.process(5000, PID, &[5000]);
    fake.process(6000, 5000, &[6000, 6001]);
    // A stale entry: 7000 listed as a child of PID, but its stat says its parent is 1 (the pid was reused).
    fake.process(7000, 1, &[7000]);
    fake.children(PID, PID, "5000 7000");
    fake.children(5000, 5000, "6000 ");
    let procfs = ProcFs::new(fake.root());
    let subtree: Vec<(i32, i32)> = procfs
        .subtree(&[PID, 99999])
        .iter()
        .map(|s| (s.pid, s.ppid))
        .collect();
    assert_eq!(subtree, [(PID, 1), (5000, PID), (6000, 5000)]);
    assert_eq!(procfs.subtree(&[PID])[1].starttime, 36146);
}

#[test]
fn never_reads_cmdline_environ_maps_nor_opens_through_fd_links() {
    let fake = FakeProc::new();
    let fifo = fake.root().join("frozen-mount-file");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    symlink(&fifo, fake.pid_dir(PID).join("fd/4")).unwrap();
    fs::write(
        fake.pid_dir(PID).join("fdinfo/4"),
        "pos:\t0\nflags:\t01\nmnt_id:\t27\n",
    )
    .unwrap();
    fs::write(
        fake.task_dir(PID, SPINNER).join("syscall"),
        format!("{WRITE_NR} 0x4 0x0 0x1 0x0 0x0 0x0 0x0 0x0\n"),
    )
    .unwrap();
    let root = fake.root().to_owned();
    let observation = within_deadline(move || {
        let procfs = ProcFs::new(root);
        let observation = procfs
            .observe_process(PID, Duration::from_millis(10), 100)
            .unwrap();
        let _ = procfs.descendants(PID).unwrap();
        observation
    });
    let Some(SyscallObservation::InSyscall {
        file: Some(file), ..
    }) = &observation.threads[1].syscall
    else {
        panic!(
            "expected a resolved file, got {:?}",
            observation.threads[1].syscall
        );
    };
    assert_eq!(file.path, fifo.to_string_lossy());
    assert_eq!(file.mount.as_deref(), Some("/"));
    assert!(
        observation.read_issues.is_empty(),
        "{:?}",
        observation.read_issues
    );
}
