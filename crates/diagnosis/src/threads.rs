//! The threads of one rank: which of them a verdict lists (every thread not idle in a known pool, each with its
//! name, state, kernel wait and innermost line of the job's own code), what each waits for when that is a lock, a
//! condition or another thread, and whether the rank is likely deadlocked within itself.
//!
//! From outside, a Python thread blocked in `with lock:` or `lock.acquire()` shows its own code's line as the
//! innermost Python frame (the acquire is C, and py-spy lists no frame for it) and a futex wait in the kernel; one
//! in `Condition.wait` (and `Event.wait`, `Queue.get`, ...) or `Thread.join` shows `threading.py`'s frame over a
//! futex wait. A rank all of whose threads wait, two or more of them so, has nothing left to release them.

use hangwatch_model::{
    CodeLine, InRankDeadlock, ProcessObservation, PythonFrame, PythonThread, SyscallObservation,
    ThreadObservation, ThreadPlace, ThreadRef, ThreadWait,
};

use crate::position::{is_stdlib, short_filename};
use crate::work::{housekeeping_thread, WORK_FLOOR_PERMILLE};

/// Loops of thread pools that wait for work in the standard library or a package (function, file suffix): a
/// thread in one of them whose innermost frame is not the job's own code is idle, not part of a hang.
const IDLE_POOLS: &[(&str, &str)] = &[
    // `ThreadPoolExecutor`'s worker, waiting on its work queue.
    ("_worker", "concurrent/futures/thread.py"),
    // A DataLoader's pin-memory thread.
    ("_pin_memory_loop", "torch/utils/data/_utils/pin_memory.py"),
    // `multiprocessing.pool.ThreadPool`'s workers and the pool's handlers.
    ("worker", "multiprocessing/pool.py"),
    ("_handle_workers", "multiprocessing/pool.py"),
    ("_handle_tasks", "multiprocessing/pool.py"),
    ("_handle_results", "multiprocessing/pool.py"),
    // A `multiprocessing.Queue`'s feeder thread.
    ("_feed", "multiprocessing/queues.py"),
];

/// The threads of `process` that a verdict lists (see [`ThreadPlace`]): its Python threads not idle in a known
/// pool and not hangwatch's own, in the interpreter's order (the main thread first), then its threads without a
/// Python stack that are not asleep. `window_ms` is the roll call's sample window.
pub fn thread_places(process: &ProcessObservation, window_ms: u64) -> Vec<ThreadPlace> {
    let python = process.python.as_deref().unwrap_or_default();
    let mut places: Vec<ThreadPlace> = Vec::new();
    let mut ordered: Vec<&PythonThread> = python.iter().collect();
    // py-spy lists the main thread last; a person reads it first.
    ordered.sort_by_key(|t| !is_main(t, process));
    for py in ordered {
        let os = os_thread(process, py);
        if idle_in_pool(py) || own_thread(py.name.as_deref()) {
            continue;
        }
        if os.is_some_and(|t| own_thread(t.name.as_deref())) {
            continue;
        }
        places.push(place(Some(py), os, process, window_ms));
    }
    for t in &process.threads {
        let has_python = python.iter().any(|py| os_thread(process, py) == Some(t));
        if has_python || own_thread(t.name.as_deref()) || asleep(t, window_ms) {
            continue;
        }
        places.push(place(None, Some(t), process, window_ms));
    }
    let listed: Vec<ThreadRef> = places
        .iter()
        .filter(|p| p.waits_for.is_some())
        .map(thread_ref)
        .collect();
    // By elimination: the lock a thread waits for is held by a thread of its process; when exactly one other thread
    // waits too (for a lock, a condition or a thread), that one holds it.
    for p in places.iter_mut() {
        if p.waits_for != Some(ThreadWait::Lock) {
            continue;
        }
        let me = thread_ref(p);
        let others: Vec<&ThreadRef> = listed.iter().filter(|r| **r != me).collect();
        if let [only] = others.as_slice() {
            p.held_by = Some((*only).clone());
        }
    }
    places
}

/// A deadlock inside the rank, when likely: every thread of `process` (but hangwatch's own) waits, none runs
/// or used CPU beyond the work floor in the sample window, and two or more of `places` (from [`thread_places`])
/// wait for a lock, a condition or another thread. `label` names the rank in the words ("rank 0").
pub fn in_rank_deadlock(
    process: &ProcessObservation,
    places: &[ThreadPlace],
    window_ms: u64,
    label: &str,
) -> Option<InRankDeadlock> {
    if process.exited || process.threads.is_empty() {
        return None;
    }
    let all_wait = process
        .threads
        .iter()
        .filter(|t| !own_thread(t.name.as_deref()))
        .all(|t| matches!(t.state, 'S' | 'D') && !ran(t, window_ms));
    let waiting: Vec<ThreadPlace> = places
        .iter()
        .filter(|p| p.waits_for.is_some())
        .cloned()
        .collect();
    if !all_wait || waiting.len() < 2 {
        return None;
    }
    let words = deadlock_words(&waiting, label);
    Some(InRankDeadlock {
        threads: waiting,
        words,
    })
}

/// "a deadlock inside rank 0 is likely: 2 threads of it each wait for a lock: MainThread at train.py:71,
/// metrics-flusher at train.py:54; each holds the lock the other waits for (by elimination)".
fn deadlock_words(waiting: &[ThreadPlace], label: &str) -> String {
    let name = |p: &ThreadPlace| thread_words(&thread_ref(p));
    let at = |p: &ThreadPlace| {
        p.code
            .as_ref()
            .map(|c| format!(" at {c}"))
            .unwrap_or_default()
    };
    let kinds: Vec<ThreadWait> = waiting.iter().filter_map(|p| p.waits_for).collect();
    let same = kinds.windows(2).all(|w| w[0] == w[1]);
    let body = match kinds.first() {
        Some(kind) if same => format!(
            "{} threads of it each {}: {}",
            waiting.len(),
            kind.words().replacen("waits", "wait", 1),
            waiting
                .iter()
                .map(|p| format!("{}{}", name(p), at(p)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => format!(
            "{} threads of it wait: {}",
            waiting.len(),
            waiting
                .iter()
                .map(|p| {
                    let what = p.waits_for.map_or("waits", ThreadWait::words);
                    format!("{} {what}{}", name(p), at(p))
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let held: Vec<(&ThreadPlace, &ThreadRef)> = waiting
        .iter()
        .filter_map(|p| Some((p, p.held_by.as_ref()?)))
        .collect();
    let crossed = matches!(held.as_slice(), [(a, b_ref), (b, a_ref)]
        if thread_ref(a) == **a_ref && thread_ref(b) == **b_ref);
    let holders = if crossed {
        "; each holds the lock the other waits for (by elimination)".to_string()
    } else {
        held.iter()
            .map(|(p, by)| {
                format!(
                    "; the lock {} waits for is held by {} (by elimination)",
                    name(p),
                    thread_words(by)
                )
            })
            .collect()
    };
    format!("a deadlock inside {label} is likely: {body}{holders}")
}

/// A thread's name, else `thread TID`.
pub fn thread_words(thread: &ThreadRef) -> String {
    match (&thread.name, thread.tid) {
        (Some(name), _) => name.clone(),
        (None, Some(tid)) => format!("thread {tid}"),
        (None, None) => "a thread".to_string(),
    }
}

fn thread_ref(place: &ThreadPlace) -> ThreadRef {
    ThreadRef {
        tid: place.tid,
        name: place.name.clone(),
    }
}

fn place(
    py: Option<&PythonThread>,
    os: Option<&ThreadObservation>,
    process: &ProcessObservation,
    window_ms: u64,
) -> ThreadPlace {
    let name = py
        .and_then(|p| p.name.clone())
        .or_else(|| os.and_then(|t| t.name.clone()))
        .or_else(|| process.comm.clone());
    ThreadPlace {
        tid: os.map(|t| t.tid),
        name,
        state: os.map_or_else(|| "?".to_string(), |t| t.state.to_string()),
        wchan: os.and_then(|t| t.wchan.clone()),
        syscall: os.and_then(syscall_name),
        code: py.and_then(|p| own_line(&p.frames)),
        waits_for: py.and_then(|p| waits_for(p, os, window_ms)),
        held_by: None,
    }
}

/// What a Python thread waits for, from its innermost frame and its kernel thread's wait (see the module doc). A
/// thread whose kernel thread was not seen (folded) is judged by `threading.py`'s frames alone.
fn waits_for(
    py: &PythonThread,
    os: Option<&ThreadObservation>,
    window_ms: u64,
) -> Option<ThreadWait> {
    let innermost = py.frames.first()?;
    let in_futex = os.map(|t| in_futex(t) && matches!(t.state, 'S' | 'D') && !ran(t, window_ms));
    if in_futex == Some(false) {
        return None;
    }
    if innermost.filename.ends_with("/threading.py") {
        return match bare_name(&innermost.function) {
            "wait" | "wait_for" => Some(ThreadWait::Condition),
            "_wait_for_tstate_lock" | "join" => Some(ThreadWait::Join),
            // The pure-Python `RLock` (`threading._PyRLock`) and `Semaphore`.
            "acquire" | "__enter__" => Some(ThreadWait::Lock),
            _ => None,
        };
    }
    (in_futex == Some(true) && is_own_code(innermost)).then_some(ThreadWait::Lock)
}

fn in_futex(thread: &ThreadObservation) -> bool {
    syscall_name(thread).as_deref() == Some("futex")
        || thread
            .wchan
            .as_deref()
            .is_some_and(|w| w.starts_with("futex"))
}

/// Whether the thread ran in the sample window: on a CPU (with CPU time to show for it, where that is known), or
/// charged CPU time above the work floor.
fn ran(thread: &ThreadObservation, window_ms: u64) -> bool {
    let cpu = thread.cpu_ms_during_sample;
    let housekeeping = thread.name.as_deref().is_some_and(housekeeping_thread);
    (thread.state == 'R' && cpu != Some(0))
        || (!housekeeping
            && cpu.is_some_and(|ms| ms.saturating_mul(1000) >= WORK_FLOOR_PERMILLE * window_ms))
}

/// A thread without a Python stack that is not worth a line: asleep (S) without running.
fn asleep(thread: &ThreadObservation, window_ms: u64) -> bool {
    thread.state == 'S' && !ran(thread, window_ms)
}

fn syscall_name(thread: &ThreadObservation) -> Option<String> {
    match &thread.syscall {
        Some(SyscallObservation::InSyscall { name, nr, .. }) => {
            Some(name.clone().unwrap_or_else(|| format!("syscall {nr}")))
        }
        _ => None,
    }
}

/// The job's own code: neither the standard library nor an installed package.
fn is_own_code(frame: &PythonFrame) -> bool {
    !is_stdlib(frame)
        && !frame.filename.contains("site-packages/")
        && !frame.filename.contains("dist-packages/")
}

fn own_line(frames: &[PythonFrame]) -> Option<CodeLine> {
    let frame = frames.iter().find(|f| is_own_code(f))?;
    Some(CodeLine {
        function: frame.function.to_string(),
        file: short_filename(&frame.filename).to_string(),
        line: frame.line,
    })
}

/// In a known pool's loop ([`IDLE_POOLS`]), with no frame of the job's own code inside it.
fn idle_in_pool(py: &PythonThread) -> bool {
    let Some(pool) = py.frames.iter().position(|f| {
        IDLE_POOLS.iter().any(|(function, file)| {
            bare_name(&f.function) == *function && f.filename.ends_with(file)
        })
    }) else {
        return false;
    };
    !py.frames[..pool].iter().any(is_own_code)
}

/// A function's name without its class or enclosing function: Python 3.11+ reports qualified names
/// (`Condition.wait`, `Pool._handle_workers`, `abba.<locals>.flush`).
fn bare_name(function: &str) -> &str {
    function.rsplit('.').next().unwrap_or(function)
}

/// hangwatch's own threads in a rank (the bootstrap's and the client's are named `hangwatch…`).
fn own_thread(name: Option<&str>) -> bool {
    name.is_some_and(|n| n.starts_with("hangwatch"))
}

fn is_main(py: &PythonThread, process: &ProcessObservation) -> bool {
    py.os_tid == Some(process.pid) || py.name.as_deref() == Some("MainThread")
}

/// The kernel thread of a Python thread: by `os_tid` where the interpreter says it, else the process's own for
/// its main thread.
fn os_thread<'a>(
    process: &'a ProcessObservation,
    py: &PythonThread,
) -> Option<&'a ThreadObservation> {
    let tid = py
        .os_tid
        .or_else(|| is_main(py, process).then_some(process.pid))?;
    process.threads.iter().find(|t| t.tid == tid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::intern;

    const WINDOW_MS: u64 = 1000;

    fn frame(function: &str, filename: &str, line: i32) -> PythonFrame {
        PythonFrame {
            function: intern(function),
            filename: intern(filename),
            line,
        }
    }

    fn futex_thread(tid: i32, name: &str) -> ThreadObservation {
        ThreadObservation {
            tid,
            name: Some(name.into()),
            state: 'S',
            wchan: Some("futex_wait_queue".into()),
            syscall: Some(SyscallObservation::InSyscall {
                nr: 202,
                name: Some("futex".into()),
                args: vec![],
                fd: None,
                file: None,
                path: None,
            }),
            cpu_ms_during_sample: Some(0),
            not_running_for_ms: Some(WINDOW_MS),
            ..ThreadObservation::default()
        }
    }

    fn python_thread(tid: i32, name: &str, frames: Vec<PythonFrame>) -> PythonThread {
        PythonThread {
            os_tid: Some(tid),
            thread_id: 1000 + u64::try_from(tid).unwrap_or(0),
            name: Some(name.into()),
            frames,
        }
    }

    const TRAIN: &str = "/home/u/job/train.py";
    const THREADING: &str = "/usr/lib/python3.11/threading.py";

    /// Rank 0 as recorded in an ABBA deadlock: its main thread at `with metrics_lock:` (train.py:71) holding the
    /// step lock, its `metrics-flusher` at `with step_lock:` (train.py:54) holding the metrics lock, an idle
    /// `ThreadPoolExecutor` worker and hangwatch's bootstrap thread.
    fn abba_rank() -> ProcessObservation {
        ProcessObservation {
            pid: 100,
            rank: Some(0),
            comm: Some("python3".into()),
            threads: vec![
                futex_thread(100, "python3"),
                futex_thread(101, "python3"),
                futex_thread(102, "python3"),
                futex_thread(103, "hangwatch-rank"),
            ],
            python: Some(vec![
                python_thread(
                    101,
                    "metrics-flusher",
                    vec![
                        frame("flush", TRAIN, 54),
                        frame("run", THREADING, 982),
                        frame("_bootstrap_inner", THREADING, 1045),
                    ],
                ),
                python_thread(
                    102,
                    "ThreadPoolExecutor-0_0",
                    vec![
                        frame(
                            "_worker",
                            "/usr/lib/python3.11/concurrent/futures/thread.py",
                            81,
                        ),
                        frame("run", THREADING, 982),
                    ],
                ),
                python_thread(
                    103,
                    "hangwatch-rank",
                    vec![
                        frame("Condition.wait", THREADING, 324),
                        frame("_loop", "/run/hw/boot.py", 9),
                    ],
                ),
                python_thread(
                    100,
                    "MainThread",
                    vec![frame("log_step", TRAIN, 71), frame("<module>", TRAIN, 90)],
                ),
            ]),
            ..ProcessObservation::default()
        }
    }

    #[test]
    fn an_abba_deadlock_names_both_threads_their_lines_and_says_deadlock() {
        let rank = abba_rank();
        let places = thread_places(&rank, WINDOW_MS);
        let names: Vec<_> = places.iter().map(|p| p.name.as_deref()).collect();
        assert_eq!(
            names,
            [Some("MainThread"), Some("metrics-flusher")],
            "the idle pool worker and hangwatch's own thread are not listed"
        );
        assert_eq!(
            places[0].code.as_ref().map(ToString::to_string).as_deref(),
            Some("train.py:71")
        );
        assert_eq!(places[1].syscall.as_deref(), Some("futex"));
        assert!(places.iter().all(|p| p.waits_for == Some(ThreadWait::Lock)));
        assert_eq!(
            places[0].held_by.as_ref().and_then(|h| h.name.as_deref()),
            Some("metrics-flusher")
        );
        let deadlock = in_rank_deadlock(&rank, &places, WINDOW_MS, "rank 0").expect("a deadlock");
        assert_eq!(
            deadlock.words,
            "a deadlock inside rank 0 is likely: 2 threads of it each wait for a lock: MainThread at \
             train.py:71, metrics-flusher at train.py:54; each holds the lock the other waits for (by \
             elimination)"
        );
    }

    #[test]
    fn an_rlock_owner_waiting_on_a_condition_is_named_as_the_holder() {
        let mut rank = abba_rank();
        if let Some(py) = rank.python.as_mut() {
            py[0].name = Some("ckpt-saver".into());
            py[0]
                .frames
                .insert(0, frame("Condition.wait", THREADING, 327));
        }
        let places = thread_places(&rank, WINDOW_MS);
        assert_eq!(places[1].waits_for, Some(ThreadWait::Condition));
        assert_eq!(places[1].held_by, None);
        let deadlock = in_rank_deadlock(&rank, &places, WINDOW_MS, "rank 0").expect("a deadlock");
        assert_eq!(
            deadlock.words,
            "a deadlock inside rank 0 is likely: 2 threads of it wait: MainThread waits for a lock at \
             train.py:71, ckpt-saver waits on a condition at train.py:54; the lock MainThread waits for is held by \
             ckpt-saver (by elimination)"
        );
    }

    #[test]
    fn a_thread_that_runs_rules_out_a_deadlock() {
        let mut rank = abba_rank();
        rank.threads[1].state = 'R';
        rank.threads[1].cpu_ms_during_sample = Some(800);
        let places = thread_places(&rank, WINDOW_MS);
        assert_eq!(places.iter().filter(|p| p.waits_for.is_some()).count(), 1);
        assert!(in_rank_deadlock(&rank, &places, WINDOW_MS, "rank 0").is_none());
        // A gloo thread's housekeeping is no sign of life, a native thread computing is.
        let mut rank = abba_rank();
        let mut gloo = futex_thread(104, "gloo_tcp_loop");
        gloo.cpu_ms_during_sample = Some(200);
        rank.threads.push(gloo);
        let places = thread_places(&rank, WINDOW_MS);
        assert!(in_rank_deadlock(&rank, &places, WINDOW_MS, "rank 0").is_some());
        let mut native = futex_thread(105, "omp_worker");
        native.state = 'R';
        native.cpu_ms_during_sample = Some(900);
        rank.threads.push(native);
        let places = thread_places(&rank, WINDOW_MS);
        assert_eq!(
            places.last().and_then(|p| p.tid),
            Some(105),
            "a native thread on a CPU is listed"
        );
        assert!(in_rank_deadlock(&rank, &places, WINDOW_MS, "rank 0").is_none());
    }

    #[test]
    fn a_rank_waiting_in_a_collective_is_no_lock_wait() {
        let mut rank = abba_rank();
        if let Some(py) = rank.python.as_mut() {
            py[0].frames = vec![frame("flush", TRAIN, 54)];
            py[3].frames = vec![
                frame(
                    "barrier",
                    "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
                    4000,
                ),
                frame("<module>", TRAIN, 90),
            ];
        }
        // The flusher sleeps in time.sleep, not a futex.
        rank.threads[1].wchan = Some("hrtimer_nanosleep".into());
        rank.threads[1].syscall = None;
        let places = thread_places(&rank, WINDOW_MS);
        assert!(places.iter().all(|p| p.waits_for.is_none()), "{places:?}");
        assert_eq!(
            places[0].code.as_ref().map(|c| c.line),
            Some(90),
            "innermost own-code line"
        );
        assert!(in_rank_deadlock(&rank, &places, WINDOW_MS, "rank 0").is_none());
    }

    #[test]
    fn a_pool_worker_running_the_jobs_code_is_listed() {
        let mut rank = abba_rank();
        if let Some(py) = rank.python.as_mut() {
            py[1].frames.insert(0, frame("load", TRAIN, 20));
        }
        let places = thread_places(&rank, WINDOW_MS);
        assert!(places
            .iter()
            .any(|p| p.name.as_deref() == Some("ThreadPoolExecutor-0_0")));
        // Three lock waiters: no holder by elimination.
        assert!(places.iter().all(|p| p.held_by.is_none()));
    }
}
