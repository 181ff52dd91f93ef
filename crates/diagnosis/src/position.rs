//! Where one rank process is: its most telling thread, the meaningful Python frame, and its condition.

use hangwatch_kernel::filesystem;
use hangwatch_model::{
    FileRef, ProcessObservation, PythonFrame, PythonThread, SyscallObservation, ThreadObservation,
};

/// What a rank is doing, most alarming first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Condition {
    /// Waiting inside a system call that does not come back (D, or an S wait on a filesystem).
    BlockedInKernel,
    /// Stopped by a signal or a tracer (T/t).
    Stopped,
    /// The process is gone.
    Exited,
    /// On a CPU, or used most of the sample window's CPU time.
    Running,
    /// Sleeping somewhere ordinary (a socket, a futex, a poll).
    Waiting,
}

/// The mount a superblock wait is on, found by probing (the wait itself names no file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrozenMount {
    pub mount: String,
    pub fstype: Option<String>,
    pub filesystem: Option<hangwatch_model::FilesystemId>,
}

/// The place and condition of one rank process.
#[derive(Debug, Clone, PartialEq)]
pub struct Position {
    pub condition: Condition,
    /// The thread that best explains the process (the stuck one, else the main thread).
    pub tid: Option<i32>,
    /// State letter of that thread.
    pub state: char,
    /// Where it is, for grouping: the meaningful Python frame, else the kernel wait.
    pub where_: String,
    /// What the telling thread's system call touches.
    pub syscall_name: Option<String>,
    pub file: Option<FileRef>,
    /// The call takes a path and it could not be read: why (no file and no mount are named then).
    pub path_unknown: Option<String>,
    /// In D on a frozen superblock with no file known (see [`waits_on_frozen_superblock`]).
    pub superblock_wait: bool,
    /// For such a wait: the one mount of its node that did not answer its probe (set by the decision).
    pub frozen_mount: Option<FrozenMount>,
    /// The thread waits on a filesystem (D, or a known filesystem wait in S) rather than a socket or a lock.
    pub filesystem_wait: bool,
    /// The innermost frame of the job's own code (outside the standard library and installed packages): what a
    /// person calls the place ("evaluate (eval.py)" rather than "Module._call_impl (torch/nn/modules/module.py)").
    pub own_code: Option<String>,
    /// The telling thread is blocked in a page fault: what its stack and the process's mappings say (the file is
    /// named by the decision, once the probes answered).
    pub fault: Option<crate::faults::Fault>,
    /// The name of the telling thread when it is not the main thread: its Python name, else its kernel name when
    /// that differs from the process's.
    pub thread_name: Option<String>,
}

/// Whether a thread is in D waiting for a frozen superblock with no file known (a page fault on a shared mapping,
/// a path that could not be read, `sync`): the mounts it could be waiting on must be probed to name one.
pub fn waits_on_frozen_superblock(thread: &ThreadObservation) -> bool {
    let frozen = |frame: &str| filesystem::FREEZE_WAITS.iter().any(|w| frame.contains(w));
    thread.state == 'D'
        && syscall_file(thread).is_none()
        && (thread.wchan.as_deref().is_some_and(frozen)
            || thread
                .kernel_stack
                .as_ref()
                .is_some_and(|stack| stack.iter().any(|f| frozen(f))))
}

/// Thread-state letters for a stopped thread.
fn is_stopped(state: char) -> bool {
    matches!(state, 'T' | 't')
}

/// A file path that lives on a filesystem (not a socket, pipe, anonymous inode or device).
pub fn is_filesystem_file(file: &FileRef) -> bool {
    const NOT_FILES: &[&str] = &[
        "socket:",
        "pipe:",
        "anon_inode:",
        "/dev/",
        "/proc/",
        "/sys/",
    ];
    let special_path = NOT_FILES.iter().any(|prefix| file.path.starts_with(prefix));
    let special_fs = file
        .fstype
        .as_deref()
        .is_some_and(filesystem::is_virtual_fstype);
    !special_path && !special_fs
}

/// Why the path argument of the thread's call is unknown, when it is.
fn path_unknown(thread: &ThreadObservation) -> Option<String> {
    match &thread.syscall {
        Some(SyscallObservation::InSyscall {
            path: Some(p),
            file: None,
            ..
        }) => Some(
            p.unreadable
                .clone()
                .unwrap_or_else(|| "the path it was given was not read".to_string()),
        ),
        _ => None,
    }
}

pub(crate) fn syscall_file(thread: &ThreadObservation) -> Option<&FileRef> {
    match &thread.syscall {
        Some(SyscallObservation::InSyscall {
            file: Some(file), ..
        }) => Some(file),
        _ => None,
    }
}

fn syscall_name(thread: &ThreadObservation) -> Option<String> {
    match &thread.syscall {
        Some(SyscallObservation::InSyscall { name, nr, .. }) => {
            Some(name.clone().unwrap_or_else(|| format!("syscall {nr}")))
        }
        _ => None,
    }
}

/// Whether the thread waits for a filesystem: D state that has not run, or an S wait whose wait channel or
/// system call file says "filesystem".
fn waits_on_filesystem(thread: &ThreadObservation) -> bool {
    match thread.state {
        'D' => true,
        // The kernel-stack scan is the costly part (thousands of threads at 10,000 ranks): only when it decides.
        'S' => {
            thread
                .wchan
                .as_deref()
                .is_some_and(filesystem::is_wait_frame)
                || (syscall_file(thread).is_some_and(is_filesystem_file)
                    && thread.kernel_stack.as_ref().is_some_and(|s| {
                        s.iter()
                            .any(|f| filesystem::wait_prefixes().any(|w| f.contains(w)))
                    }))
        }
        _ => false,
    }
}

/// The Python stack of the thread with this tid: by `os_tid` when the interpreter reports it, else the main thread
/// (for the process's own tid) as py-spy lists it first.
fn python_thread_for(threads: &[PythonThread], tid: i32, pid: i32) -> Option<&PythonThread> {
    threads
        .iter()
        .find(|t| t.os_tid == Some(tid))
        .or_else(|| (tid == pid).then(|| main_python_thread(threads)).flatten())
}

fn main_python_thread(threads: &[PythonThread]) -> Option<&PythonThread> {
    threads
        .iter()
        .find(|t| t.name.as_deref() == Some("MainThread"))
        .or_else(|| threads.last())
}

/// Is this frame from the Python standard library (not a package, not the user's code)?
pub(crate) fn is_stdlib(frame: &PythonFrame) -> bool {
    let f: &str = &frame.filename;
    if f.starts_with("<frozen") {
        return true;
    }
    if f.contains("site-packages/") || f.contains("dist-packages/") {
        return false;
    }
    f.contains("/lib/python3") || f.contains("/lib/python2") || f.contains("/lib64/python3")
}

/// A short, stable name for a file: the part after site-packages, else the file name.
pub fn short_filename(filename: &str) -> &str {
    for marker in ["site-packages/", "dist-packages/"] {
        if let Some(pos) = filename.rfind(marker) {
            return &filename[pos + marker.len()..];
        }
    }
    filename.rsplit('/').next().unwrap_or(filename)
}

/// The innermost frame of the job's own code: neither the standard library nor an installed package.
pub fn own_code_frame(frames: &[PythonFrame]) -> Option<String> {
    let frame = frames.iter().find(|f| {
        !is_stdlib(f)
            && !f.filename.contains("site-packages/")
            && !f.filename.contains("dist-packages/")
    })?;
    Some(format!(
        "{} ({})",
        frame.function,
        short_filename(&frame.filename)
    ))
}

/// The frame that says where a rank is: the innermost frame outside the standard library
/// (`barrier (torch/distributed/distributed_c10d.py)`), else the innermost frame.
pub fn meaningful_frame(frames: &[PythonFrame]) -> Option<String> {
    let frame = frames
        .iter()
        .find(|f| !is_stdlib(f))
        .or_else(|| frames.first())?;
    Some(format!(
        "{} ({})",
        frame.function,
        short_filename(&frame.filename)
    ))
}

/// The kernel-side description of a wait, for processes without a Python stack.
fn kernel_where(thread: &ThreadObservation) -> String {
    match (&thread.syscall, thread.wchan.as_deref()) {
        (Some(SyscallObservation::Running), _) => "running".to_string(),
        (Some(SyscallObservation::InSyscall { .. }), wchan) => {
            let name = syscall_name(thread).unwrap_or_default();
            match wchan {
                Some(w) => format!("{name}() in {w}"),
                None => format!("{name}()"),
            }
        }
        (Some(SyscallObservation::NotInSyscall { .. }), Some(w)) => {
            format!("outside a system call, in {w}")
        }
        (_, Some(w)) => w.to_string(),
        _ => format!("state {}", thread.state),
    }
}

/// The Python stack of thread `tid` of `process`, innermost first, as `function (file:line)`. Made only for the
/// processes a verdict shows (its culprits and listed rows), not for each of 10,000 ranks.
pub fn python_stack(process: &ProcessObservation, tid: Option<i32>) -> Option<Vec<String>> {
    let threads = process.python.as_deref()?;
    let thread = python_thread_for(threads, tid?, process.pid)?;
    Some(thread.frames.iter().map(PythonFrame::display).collect())
}

/// Picks the telling thread: a stuck one (filesystem wait, then stopped), else a running one when the process
/// burns CPU, else the main thread. The threads in `passing` (a wait that a second look found over) are never
/// the stuck one.
fn telling_thread<'a>(
    process: &'a ProcessObservation,
    busy: bool,
    passing: &[i32],
) -> Option<&'a ThreadObservation> {
    let threads = &process.threads;
    // hangwatch's own thread in a rank (the bootstrap's `hangwatch-rank`) caught in a page fault for an instant
    // must not make the rank a culprit on its own: the rank's state is its own threads'.
    let jobs = || {
        threads
            .iter()
            .filter(|t| !hangwatch_own(process, t) && !passing.contains(&t.tid))
    };
    jobs()
        .find(|t| t.state == 'D')
        .or_else(|| jobs().find(|t| waits_on_filesystem(t)))
        .or_else(|| threads.iter().find(|t| is_stopped(t.state)))
        .or_else(|| {
            // The thread that used the most CPU; none used any (busy by a running main thread): the main thread.
            busy.then(|| {
                threads
                    .iter()
                    .filter(|t| t.cpu_ms_during_sample.unwrap_or(0) > 0)
                    .max_by_key(|t| t.cpu_ms_during_sample.unwrap_or(0))
            })
            .flatten()
        })
        .or_else(|| threads.iter().find(|t| t.tid == process.pid))
        .or_else(|| threads.first())
}

/// Whether `thread` is one hangwatch put in the rank (the bootstrap's and the client's threads are named
/// `hangwatch-…`), by its Python thread's name or its own.
fn hangwatch_own(process: &ProcessObservation, thread: &ThreadObservation) -> bool {
    let named = |name: &str| name.starts_with("hangwatch");
    let python = process
        .python
        .as_deref()
        .and_then(|threads| threads.iter().find(|p| p.os_tid == Some(thread.tid)))
        .and_then(|p| p.name.as_deref());
    python.is_some_and(named) || thread.name.as_deref().is_some_and(named)
}

/// Whether the process used CPU for most of the sample window (in any thread of its own work) or its main thread
/// is on a CPU.
///
/// A main thread seen in R counts only when it was also charged CPU during the window: a thread that wakes from a
/// timed wait twice a second is runnable for a moment at each wake, longer on a loaded node, and one instant of R
/// would call a waiting rank busy. A thread that spins is charged CPU ticks even when it shares its core. Where
/// the window's CPU time is not known (no earlier sample of the thread), the roll call's second look stands in
/// for it: on a CPU again and charged CPU since; only without that is the instant all there is.
fn is_busy(process: &ProcessObservation, window_ms: u64) -> bool {
    // Libraries' background threads (NCCL's proxy polls a core while its rank waits) and hangwatch's own are not
    // the rank's work (crate::work).
    let cpu: u64 = process
        .threads
        .iter()
        .filter(|t| {
            !t.name
                .as_deref()
                .is_some_and(crate::work::housekeeping_thread)
                && !hangwatch_own(process, t)
        })
        .filter_map(|t| t.cpu_ms_during_sample)
        .sum();
    let charged = |t: &ThreadObservation| match (t.cpu_ms_during_sample, t.second_look) {
        (Some(ms), _) => ms > 0,
        (None, Some(look)) => look.state == 'R' && look.cpu_ms != Some(0),
        (None, None) => true,
    };
    let main_running = process.threads.iter().any(|t| {
        t.tid == process.pid
            && t.state == 'R'
            && !matches!(t.syscall, Some(SyscallObservation::InSyscall { .. }))
            && charged(t)
    });
    (window_ms > 0 && cpu * 2 >= window_ms) || main_running
}

/// A state letter in words, for people.
pub(crate) fn state_words(state: char) -> &'static str {
    match state {
        'D' => "uninterruptible sleep (D)",
        'S' => "sleep (S)",
        'R' => "running (R)",
        'T' => "stopped (T)",
        't' => "stopped by a tracer (t)",
        'Z' => "zombie (Z)",
        _ => "an unusual state",
    }
}

/// Classifies one process. `window_ms` is the time between the two /proc samples.
pub fn classify(process: &ProcessObservation, window_ms: u64) -> Position {
    classify_passing(process, window_ms, &[])
}

/// Whether the roll call should look at `thread` again a moment after its second sample: its state there is one
/// instant's and decides a lot. In D (a page fault on a healthy disk is D for a moment too), or on a CPU with no
/// CPU time known for the window (no earlier sample of it).
pub fn wants_second_look(thread: &ThreadObservation) -> bool {
    thread.state == 'D' || (thread.state == 'R' && thread.cpu_ms_during_sample.is_none())
}

/// The threads of `process` seen in D whose wait the second look found over (it left D, or was woken and ran, in
/// between), where `answered` says that nothing they may wait on failed to answer and no hung-task report names
/// them: a moment, not a state ([`crate::rollcall::decide`] passes them to [`classify_passing`]).
pub fn passing_waits(
    process: &ProcessObservation,
    answered: impl Fn(&ThreadObservation) -> bool,
) -> Vec<i32> {
    process
        .threads
        .iter()
        .filter(|t| {
            t.state == 'D' && t.second_look.is_some_and(|look| look.moved_on('D')) && answered(t)
        })
        .map(|t| t.tid)
        .collect()
}

/// [`classify`], with the threads in `passing` (see [`passing_waits`]) taken as neither stuck nor waiting on a
/// filesystem: the process is where its other threads are.
pub fn classify_passing(process: &ProcessObservation, window_ms: u64, passing: &[i32]) -> Position {
    if process.exited {
        return Position {
            condition: Condition::Exited,
            tid: None,
            state: 'X',
            where_: match process.exit_code {
                Some(code) => format!("exited (code {code})"),
                None => "exited".to_string(),
            },
            syscall_name: None,
            file: None,
            path_unknown: None,
            superblock_wait: false,
            frozen_mount: None,
            filesystem_wait: false,
            own_code: None,
            fault: None,
            thread_name: None,
        };
    }
    let busy = is_busy(process, window_ms);
    let Some(thread) = telling_thread(process, busy, passing) else {
        return Position {
            condition: Condition::Exited,
            tid: None,
            state: 'X',
            where_: "no threads left".to_string(),
            syscall_name: None,
            file: None,
            path_unknown: None,
            superblock_wait: false,
            frozen_mount: None,
            filesystem_wait: false,
            own_code: None,
            fault: None,
            thread_name: None,
        };
    };
    let passed = passing.contains(&thread.tid);
    let filesystem_wait = !passed && waits_on_filesystem(thread);
    let condition = if filesystem_wait {
        Condition::BlockedInKernel
    } else if is_stopped(thread.state) {
        Condition::Stopped
    } else if busy {
        Condition::Running
    } else {
        Condition::Waiting
    };
    let py_thread = process
        .python
        .as_deref()
        .and_then(|threads| python_thread_for(threads, thread.tid, process.pid));
    let own_code = py_thread.and_then(|t| own_code_frame(&t.frames));
    let where_ = py_thread
        .and_then(|t| meaningful_frame(&t.frames))
        .unwrap_or_else(|| kernel_where(thread));
    Position {
        condition,
        tid: Some(thread.tid),
        state: thread.state,
        where_,
        syscall_name: syscall_name(thread),
        file: syscall_file(thread).cloned(),
        path_unknown: path_unknown(thread),
        superblock_wait: !passed && waits_on_frozen_superblock(thread),
        frozen_mount: None,
        filesystem_wait,
        own_code,
        fault: filesystem_wait
            .then(|| crate::faults::fault_of(process, thread))
            .flatten(),
        thread_name: thread_name(process, thread, py_thread),
    }
}

/// See [`Position::thread_name`].
fn thread_name(
    process: &ProcessObservation,
    thread: &ThreadObservation,
    py_thread: Option<&PythonThread>,
) -> Option<String> {
    if thread.tid == process.pid {
        return None;
    }
    py_thread
        .and_then(|t| t.name.clone())
        .or_else(|| {
            thread
                .name
                .clone()
                .filter(|n| Some(n) != process.comm.as_ref())
        })
        .filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::SecondLook;

    fn frame(function: &str, filename: &str, line: i32) -> PythonFrame {
        PythonFrame {
            function: function.into(),
            filename: filename.into(),
            line,
        }
    }

    fn main_thread(state: char, cpu_ms: Option<u64>) -> ProcessObservation {
        ProcessObservation {
            pid: 42,
            threads: vec![ThreadObservation {
                tid: 42,
                state,
                syscall: Some(SyscallObservation::NotInSyscall { pc: None }),
                cpu_ms_during_sample: cpu_ms,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_waiting_thread_caught_runnable_at_one_instant_is_not_busy() {
        // A barrier that polls twice a second, seen in R at the sample but charged no CPU over a 1.2 s window.
        assert!(!is_busy(&main_thread('R', Some(0)), 1200));
        assert_eq!(
            classify(&main_thread('R', Some(0)), 1200).condition,
            Condition::Waiting
        );
        // A spinner that shares its core: on a CPU and charged some of the window, though less than half.
        assert!(is_busy(&main_thread('R', Some(200)), 1200));
        // Most of the window on a CPU is busy whatever the instant shows.
        assert!(is_busy(&main_thread('S', Some(700)), 1200));
        // No earlier sample of this thread: the instant is all there is, unless the roll call looked again.
        assert!(is_busy(&main_thread('R', None), 1200));
        assert!(!is_busy(&main_thread('S', Some(100)), 1200));
        let looked_again = |state, cpu_ms| {
            let mut p = main_thread('R', None);
            p.threads[0].second_look = Some(SecondLook {
                after_ms: 200,
                state,
                cpu_ms,
                switched: Some(true),
            });
            p
        };
        assert!(!is_busy(&looked_again('S', Some(0)), 1200));
        assert!(!is_busy(&looked_again('R', Some(0)), 1200));
        assert!(is_busy(&looked_again('R', Some(150)), 1200));
    }

    #[test]
    fn a_polling_library_thread_does_not_make_a_waiting_rank_busy() {
        let mut rank = main_thread('S', Some(0));
        rank.threads.push(ThreadObservation {
            tid: 43,
            name: Some("NCCL Progress 0".into()),
            state: 'R',
            cpu_ms_during_sample: Some(1_100),
            ..Default::default()
        });
        assert!(
            !is_busy(&rank, 1200),
            "NCCL's proxy polls while its rank waits"
        );
        rank.threads[1].name = Some("python".into());
        assert!(
            is_busy(&rank, 1200),
            "a thread of the job's own that computes"
        );
    }

    #[test]
    fn a_thread_whose_d_wait_was_over_at_the_second_look_is_not_what_the_rank_waits_on() {
        let mut rank = main_thread('D', None);
        rank.threads[0].wchan = Some("folio_wait_bit_common".into());
        assert!(wants_second_look(&rank.threads[0]));
        assert!(
            passing_waits(&rank, |_| true).is_empty(),
            "not looked at again"
        );
        rank.threads[0].second_look = Some(SecondLook {
            after_ms: 200,
            state: 'S',
            cpu_ms: Some(0),
            switched: Some(true),
        });
        assert_eq!(passing_waits(&rank, |_| true), [42]);
        assert!(passing_waits(&rank, |_| false).is_empty());
        assert_eq!(classify(&rank, 1000).condition, Condition::BlockedInKernel);
        let passed = classify_passing(&rank, 1000, &[42]);
        assert_eq!(passed.condition, Condition::Waiting);
        assert!(!passed.filesystem_wait && passed.fault.is_none());
        assert_eq!(passed.state, 'D', "the instant's letter is kept as seen");
        // A thread asleep with its CPU time known is not looked at again; one on a CPU without it is.
        assert!(!wants_second_look(&main_thread('S', None).threads[0]));
        assert!(!wants_second_look(&main_thread('R', Some(0)).threads[0]));
        assert!(wants_second_look(&main_thread('R', None).threads[0]));
    }

    #[test]
    fn hangwatchs_own_thread_caught_in_d_does_not_make_the_rank_blocked() {
        // The case of the issue: the bootstrap's thread in a page fault for an instant, the main thread waiting.
        let mut rank = main_thread('S', Some(0));
        rank.threads.push(ThreadObservation {
            tid: 43,
            state: 'D',
            wchan: Some("folio_wait_bit_common".into()),
            syscall: Some(SyscallObservation::NotInSyscall { pc: None }),
            cpu_ms_during_sample: Some(0),
            ..Default::default()
        });
        rank.python = Some(vec![PythonThread {
            os_tid: Some(43),
            thread_id: 2,
            name: Some("hangwatch-rank".into()),
            frames: vec![frame("_watch", "hangwatch/_rank.py", 80)],
        }]);
        let position = classify(&rank, 1000);
        assert_eq!(position.condition, Condition::Waiting);
        assert_eq!(position.tid, Some(42));
        // The same thread of the job's own is the rank's state.
        rank.python.as_mut().expect("python")[0].name = Some("loader".into());
        assert_eq!(classify(&rank, 1000).condition, Condition::BlockedInKernel);
    }

    #[test]
    fn own_code_is_the_innermost_frame_outside_the_library_and_packages() {
        let frames = vec![
            frame(
                "_call_impl",
                "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py",
                1779,
            ),
            frame("evaluate", "/home/u/eval.py", 40),
            frame("main", "/home/u/eval.py", 90),
        ];
        assert_eq!(
            own_code_frame(&frames).as_deref(),
            Some("evaluate (eval.py)")
        );
        assert_eq!(
            meaningful_frame(&frames).as_deref(),
            Some("_call_impl (torch/nn/modules/module.py)"),
            "grouping keeps the library's place"
        );
    }

    #[test]
    fn meaningful_frame_skips_the_standard_library() {
        let frames = vec![
            frame("recv_into", "/usr/lib/python3.11/socket.py", 705),
            frame(
                "barrier",
                "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
                3000,
            ),
            frame("main", "/home/u/train.py", 10),
        ];
        assert_eq!(
            meaningful_frame(&frames).as_deref(),
            Some("barrier (torch/distributed/distributed_c10d.py)")
        );
    }

    #[test]
    fn meaningful_frame_falls_back_to_innermost_when_all_stdlib() {
        let frames = vec![
            frame("wait", "/usr/lib/python3.11/threading.py", 320),
            frame("<module>", "<frozen runpy>", 1),
        ];
        assert_eq!(
            meaningful_frame(&frames).as_deref(),
            Some("wait (threading.py)")
        );
        assert_eq!(meaningful_frame(&[]), None);
    }

    #[test]
    fn user_script_frames_are_named_by_file_name() {
        let frames = vec![frame("write_log", "/work/job/rank.py", 42)];
        assert_eq!(
            meaningful_frame(&frames).as_deref(),
            Some("write_log (rank.py)")
        );
    }

    #[test]
    fn sockets_and_pipes_are_not_filesystem_files() {
        let file = |p: &str| FileRef {
            filesystem: None,
            path: p.into(),
            mount: None,
            fstype: None,
            source: None,
        };
        assert!(!is_filesystem_file(&file("socket:[123]")));
        assert!(!is_filesystem_file(&file("pipe:[9]")));
        assert!(!is_filesystem_file(&file("anon_inode:[eventpoll]")));
        assert!(is_filesystem_file(&file("/shared/log.txt")));
    }
}
