//! Against real processes this test starts: a sleeping Python, a busy-looping Python, a Python blocked writing to
//! a full pipe, and a small process tree. Each is killed by pid (or by its own process group) on drop.

#![expect(clippy::unwrap_used, reason = "test fixtures fail loudly")]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hangwatch_model::SyscallObservation;
use hangwatch_proc::{clk_tck, observe_threads, ProcFs, SyscallLine};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// Kills the child's process group (it was started as its own group leader) and every descendant by pid, then
/// reaps it.
struct Guard {
    child: Child,
    reaped: bool,
}

impl Guard {
    fn spawn(program: &str, args: &[&str]) -> Guard {
        use std::os::unix::process::CommandExt;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        Guard {
            child,
            reaped: false,
        }
    }

    /// Reaps the leader; the guard then leaves its (possibly reused) pid alone.
    fn wait(&mut self) {
        self.child.wait().unwrap();
        self.reaped = true;
    }

    /// Starts the real interpreter, not a version-manager shim that would fork before exec'ing Python.
    fn python(code: &str) -> Guard {
        let interpreter = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 is needed for the live tests");
        let interpreter = String::from_utf8(interpreter.stdout).unwrap();
        Guard::spawn(interpreter.trim(), &["-c", code])
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.reaped {
            let below = ProcFs::default()
                .descendants(self.pid())
                .unwrap_or_default();
            let _ = killpg(Pid::from_raw(self.pid()), Signal::SIGKILL);
            for pid in below {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = self.child.wait();
        }
    }
}

/// Polls until `ready` holds, for at most 10 s.
fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[test]
fn sleeping_python_is_not_running() {
    let child = Guard::python("import time; time.sleep(100)");
    let procfs = ProcFs::default();
    let pid = child.pid();
    let sleep_nr = if cfg!(target_arch = "aarch64") {
        101
    } else {
        35
    };
    let clock_sleep_nr = if cfg!(target_arch = "aarch64") {
        115
    } else {
        230
    };
    wait_for(
        "python to sleep",
        || matches!(procfs.syscall(pid, pid), Ok(SyscallLine::InSyscall { nr, .. }) if nr == sleep_nr || nr == clock_sleep_nr),
    );

    let first = procfs.sample_process(pid).unwrap();
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    let second = procfs.sample_process(pid).unwrap();
    let elapsed = started.elapsed();
    let mut resolver = procfs.file_resolver(pid);
    let observed = observe_threads(&first, &second, elapsed, clk_tck(), |t| resolver.resolve(t));

    let main = observed.iter().find(|t| t.tid == pid).unwrap();
    assert_eq!(main.state, 'S');
    assert!(
        main.wchan.as_deref().is_some_and(|w| !w.is_empty()),
        "wchan {:?}",
        main.wchan
    );
    let Some(SyscallObservation::InSyscall { name, fd, file, .. }) = &main.syscall else {
        panic!("expected a syscall, got {:?}", main.syscall);
    };
    assert!(
        matches!(name.as_deref(), Some("clock_nanosleep" | "nanosleep")),
        "{name:?}"
    );
    assert_eq!((fd, file), (&None, &None));
    let not_running = main
        .not_running_for_ms
        .expect("a sleeping thread did not run");
    assert!(not_running >= 200, "not_running_for_ms = {not_running}");
    assert_eq!(main.cpu_ms_during_sample, Some(0));
    assert!(main.cpu_ms_total.is_some());
    assert!(main.voluntary_ctxt_switches.is_some());
    if is_root() {
        let stack = main
            .kernel_stack
            .as_ref()
            .expect("root reads kernel stacks");
        assert!(stack.iter().any(|f| f.contains("sleep")), "{stack:?}");
        assert!(stack.iter().all(|f| !f.contains("+0x")), "{stack:?}");
    } else {
        assert_eq!(main.kernel_stack, None);
    }
    assert_eq!(second.tracer_pid(), Some(0));
    assert!(!second.pending().any_stop());
}

#[test]
fn busy_python_is_running() {
    let child = Guard::python("while True: pass");
    let procfs = ProcFs::default();
    let pid = child.pid();
    wait_for("python to burn CPU", || {
        procfs.task_stat(pid, pid).is_ok_and(|s| s.cpu_ticks() > 5)
    });

    let first = procfs.sample_process(pid).unwrap();
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    let second = procfs.sample_process(pid).unwrap();
    let observed = observe_threads(&first, &second, started.elapsed(), clk_tck(), |_| None);

    let main = observed.iter().find(|t| t.tid == pid).unwrap();
    assert_eq!(main.not_running_for_ms, None);
    let cpu = main.cpu_ms_during_sample.unwrap();
    assert!(cpu > 0, "cpu_ms_during_sample = {cpu}");
    assert!(main.cpu_ms_total.unwrap() >= cpu);
}

#[test]
fn a_process_that_moves_bytes_says_how_fast_and_a_sleeping_one_moves_none() {
    // About 200 KB/s through write(2), with almost no CPU: a download's shape.
    let mover = Guard::python(
        "import os, time\nf = os.open('/dev/null', os.O_WRONLY)\nwhile True:\n    os.write(f, b'x' * 20000)\n    time.sleep(0.1)",
    );
    let sleeper = Guard::python("import time\ntime.sleep(60)");
    let procfs = ProcFs::default();
    std::thread::sleep(Duration::from_millis(300));
    let rate = |pid| {
        procfs
            .observe_process(pid, Duration::from_millis(500), clk_tck())
            .unwrap()
            .bytes_per_s_during_sample
    };
    let moving = rate(mover.pid()).expect("a rate");
    assert!(
        (100_000..400_000).contains(&moving),
        "about 200 KB/s: {moving} B/s"
    );
    assert_eq!(rate(sleeper.pid()), Some(0));
}

#[test]
fn writer_blocked_on_a_full_pipe_names_the_pipe() {
    let child =
        Guard::python("import os\nr, w = os.pipe()\nos.write(w, b'x' * 65536)\nos.write(w, b'y')");
    let procfs = ProcFs::default();
    let pid = child.pid();
    let write_nr = if cfg!(target_arch = "aarch64") { 64 } else { 1 };
    wait_for(
        "the write to block",
        || matches!(procfs.syscall(pid, pid), Ok(SyscallLine::InSyscall { nr, args, .. }) if nr == write_nr && args[2] == 1),
    );

    let observation = procfs
        .observe_process(pid, Duration::from_millis(100), clk_tck())
        .unwrap();
    assert_eq!(observation.comm.as_deref(), Some("python3"));
    assert_eq!(observation.tracer_pid, Some(0));
    assert!(!observation.exited);
    let main = observation.threads.iter().find(|t| t.tid == pid).unwrap();
    let Some(SyscallObservation::InSyscall {
        name,
        fd: Some(fd),
        file: Some(file),
        ..
    }) = &main.syscall
    else {
        panic!("expected a write with a file, got {:?}", main.syscall);
    };
    assert_eq!(name.as_deref(), Some("write"));
    assert_eq!(procfs.fd_link(pid, *fd).unwrap(), file.path);
    assert!(file.path.starts_with("pipe:["), "{}", file.path);
    assert_eq!(file.mount, None, "pipes live on an internal mount");
    assert!(main.not_running_for_ms.is_some());
    assert!(
        observation.read_issues.is_empty(),
        "{:?}",
        observation.read_issues
    );
}

#[test]
fn process_tree_of_a_launcher() {
    let launcher = Guard::spawn("sh", &["-c", "sleep 100 & sleep 100 & wait"]);
    let procfs = ProcFs::default();
    let pid = launcher.pid();
    wait_for("two children", || {
        procfs.children(pid).is_ok_and(|c| c.len() == 2)
    });
    let children = procfs.children(pid).unwrap();
    for child in &children {
        assert_eq!(procfs.stat(*child).unwrap().ppid, pid);
    }
    let own = i32::try_from(std::process::id()).unwrap();
    let below_us = procfs.descendants(own).unwrap();
    assert!(below_us.contains(&pid), "{below_us:?}");
    for child in &children {
        assert!(below_us.contains(child), "{below_us:?}");
    }
    let cwd = procfs.cwd(pid).unwrap();
    assert_eq!(cwd, std::env::current_dir().unwrap().to_string_lossy());
    assert!(procfs.exe(pid).unwrap().starts_with('/'));
}

#[test]
fn reaped_process_reads_as_exited() {
    let mut child = Guard::spawn("true", &[]);
    let pid = child.pid();
    child.wait();
    let err = ProcFs::default().sample_process(pid).unwrap_err();
    assert!(err.is_exited(), "{err:?}");
}
