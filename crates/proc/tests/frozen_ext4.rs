//! The seed incident, for real: a Python writer appending to a log on a loop-mounted ext4 that is frozen with
//! `fsfreeze -f`. The reader must name D state, `percpu_rwsem_wait`, `write` on the log, and the ext4 mount, and
//! return promptly. Needs root, a loop device and `mkfs.ext4`/`fsfreeze`; skipped (with a message) otherwise.
//! Clean-up (thaw, kill, unmount) runs on drop, so a failing assertion leaves nothing frozen behind.

#![expect(clippy::unwrap_used, reason = "test fixtures fail loudly")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hangwatch_model::SyscallObservation;
use hangwatch_proc::{clk_tck, ProcFs};

fn run(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A mounted ext4 image, and the writer on it. Drop thaws first, so that the writer can die and the mount
/// can go.
struct FrozenMount {
    dir: tempfile::TempDir,
    mounted: bool,
    frozen: bool,
    writer: Option<Child>,
}

impl FrozenMount {
    fn mount_point(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    fn freeze(&mut self) {
        assert!(run(
            "fsfreeze",
            &["-f", self.mount_point().to_str().unwrap()]
        ));
        self.frozen = true;
    }
}

impl Drop for FrozenMount {
    fn drop(&mut self) {
        let mount_point = self.mount_point();
        let mount_point = mount_point.to_str().unwrap_or_default();
        if self.frozen {
            run("fsfreeze", &["-u", mount_point]);
        }
        if let Some(writer) = &mut self.writer {
            let _ = writer.kill();
            let _ = writer.wait();
        }
        if self.mounted {
            run("umount", &[mount_point]);
        }
    }
}

fn setup() -> Option<FrozenMount> {
    use std::os::unix::fs::MetadataExt;
    if !std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        eprintln!("skipped: needs root to mount and freeze");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    let mount_point = dir.path().join("mnt");
    std::fs::create_dir(&mount_point).unwrap();
    std::fs::File::create(&image)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let mut fixture = FrozenMount {
        dir,
        mounted: false,
        frozen: false,
        writer: None,
    };
    if !run("mkfs.ext4", &["-q", "-F", image.to_str().unwrap()]) {
        eprintln!("skipped: mkfs.ext4 is not available");
        return None;
    }
    if !run(
        "mount",
        &[
            "-o",
            "loop",
            image.to_str().unwrap(),
            mount_point.to_str().unwrap(),
        ],
    ) {
        eprintln!("skipped: cannot loop-mount (no loop device?)");
        return None;
    }
    fixture.mounted = true;
    Some(fixture)
}

fn python() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn writer_on_a_frozen_ext4_is_named_with_its_file_and_mount() {
    let Some(mut fixture) = setup() else {
        return;
    };
    let mount_point = fixture.mount_point();
    let log = mount_point.join("log.txt");
    let code = "import sys, time\nf = open(sys.argv[1], 'a', buffering=1)\nwhile True:\n    f.write('step\\n')\n    time.sleep(0.02)";
    let writer = Command::new(python())
        .args(["-c", code, log.to_str().unwrap()])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = i32::try_from(writer.id()).unwrap();
    fixture.writer = Some(writer);
    wait_for("the log to grow", || {
        std::fs::metadata(&log).is_ok_and(|m| m.len() > 0)
    });
    fixture.freeze();
    let procfs = ProcFs::default();
    wait_for("the writer to block in D", || {
        procfs.task_stat(pid, pid).is_ok_and(|s| s.state == 'D')
    });

    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let started = Instant::now();
        let observation =
            ProcFs::default().observe_process(pid, Duration::from_millis(300), clk_tck());
        let _ = tx.send((observation, started.elapsed()));
    });
    let (observation, took) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("reading /proc of a process stuck on a frozen mount blocked");
    let observation = observation.unwrap();
    assert!(took < Duration::from_secs(2), "took {took:?}");

    let main = observation.threads.iter().find(|t| t.tid == pid).unwrap();
    assert_eq!(main.state, 'D');
    assert_eq!(main.wchan.as_deref(), Some("percpu_rwsem_wait"));
    assert!(main.not_running_for_ms.is_some_and(|ms| ms >= 300));
    let Some(SyscallObservation::InSyscall {
        name,
        fd: Some(_),
        file: Some(file),
        ..
    }) = &main.syscall
    else {
        panic!("expected a write with its file, got {:?}", main.syscall);
    };
    assert_eq!(name.as_deref(), Some("write"));
    assert_eq!(Path::new(&file.path), log);
    assert_eq!(
        file.mount.as_deref().map(Path::new),
        Some(mount_point.as_path())
    );
    assert_eq!(file.fstype.as_deref(), Some("ext4"));
    assert!(file
        .source
        .as_deref()
        .is_some_and(|s| s.starts_with("/dev/loop")));
    let stack = main.kernel_stack.as_ref().unwrap();
    assert_eq!(
        stack.first().map(String::as_str),
        Some("percpu_rwsem_wait"),
        "{stack:?}"
    );
}
