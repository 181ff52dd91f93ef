//! [`ProcFs`]: reads the /proc entries that stay safe on a stuck process, under a root that tests point at a
//! fake tree.
//!
//! Safe means measured to return promptly while the process is stuck on a frozen mount
//! (`docs/inspecting-a-stuck-process.md`): `stat`, `status`, `wchan`, `syscall`, `stack`, `readlink` of `fd/N`,
//! `cwd` and `exe`, `fdinfo`, `mountinfo`, `io`, the `task` directory and `children`. `cmdline`, `environ` and `maps` take the process's mmap lock and can
//! block, so there is no method for them; fd links are only `readlink`ed, never followed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hangwatch_model::{FileRef, ProcessObservation};
use nix::errno::Errno;

use crate::error::{ParseError, ReadError};
use crate::fdinfo::{parse_fdinfo, FdInfo};
use crate::io::{parse_io, IoCounters};
use crate::kernel::{parse_stack, parse_wchan};
use crate::mountinfo::{parse_mountinfo, MountTable};
use crate::observe::{observe_process, ProcessSample, ThreadSample};
use crate::resolve::{resolve_file_ref, FileTarget};
use crate::stat::{parse_stat, TaskStat};
use crate::status::{parse_status, Status};
use crate::syscall::{parse_syscall, SyscallLine};

/// Reader of a /proc tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcFs {
    root: PathBuf,
}

impl Default for ProcFs {
    fn default() -> Self {
        ProcFs::new("/proc")
    }
}

impl ProcFs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ProcFs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Thread ids of a process, ascending.
    pub fn list_threads(&self, pid: i32) -> Result<Vec<i32>, ReadError> {
        self.numbered_entries(pid, "task")
    }

    /// The numbered names in `/proc/PID/<dir>` (threads, descriptors), ascending.
    fn numbered_entries(&self, pid: i32, dir: &str) -> Result<Vec<i32>, ReadError> {
        let dir = self.pid_dir(pid).join(dir);
        let entries = std::fs::read_dir(&dir).map_err(|e| self.classify(pid, None, &dir, e))?;
        let mut numbers: Vec<i32> = entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        numbers.sort_unstable();
        Ok(numbers)
    }

    /// `/proc/PID/stat`: the process as a whole.
    pub fn stat(&self, pid: i32) -> Result<TaskStat, ReadError> {
        self.parse(pid, None, self.pid_dir(pid).join("stat"), parse_stat)
    }

    /// Every thread's `stat` (CPU time and name each); threads that exit meanwhile are left out.
    pub fn thread_stats(&self, pid: i32) -> Result<Vec<TaskStat>, ReadError> {
        Ok(self
            .list_threads(pid)?
            .into_iter()
            .filter_map(|tid| self.task_stat(pid, tid).ok())
            .collect())
    }

    /// `/proc/PID/status`: process-wide pending signals and tracer.
    pub fn status(&self, pid: i32) -> Result<Status, ReadError> {
        self.parse(pid, None, self.pid_dir(pid).join("status"), parse_status)
    }

    pub fn task_stat(&self, pid: i32, tid: i32) -> Result<TaskStat, ReadError> {
        self.parse(
            pid,
            Some(tid),
            self.task_dir(pid, tid).join("stat"),
            parse_stat,
        )
    }

    pub fn task_status(&self, pid: i32, tid: i32) -> Result<Status, ReadError> {
        self.parse(
            pid,
            Some(tid),
            self.task_dir(pid, tid).join("status"),
            parse_status,
        )
    }

    /// The kernel function the thread sleeps in; `None` when running.
    pub fn wchan(&self, pid: i32, tid: i32) -> Result<Option<String>, ReadError> {
        let path = self.task_dir(pid, tid).join("wchan");
        Ok(parse_wchan(&self.read(pid, Some(tid), &path)?))
    }

    pub fn syscall(&self, pid: i32, tid: i32) -> Result<SyscallLine, ReadError> {
        self.parse(
            pid,
            Some(tid),
            self.task_dir(pid, tid).join("syscall"),
            parse_syscall,
        )
    }

    /// Kernel stack, innermost first. `Ok(None)` when it may not be read (root only) or the kernel lacks it.
    pub fn kernel_stack(&self, pid: i32, tid: i32) -> Result<Option<Vec<String>>, ReadError> {
        let path = self.task_dir(pid, tid).join("stack");
        match self.read(pid, Some(tid), &path) {
            Ok(text) => Ok(Some(parse_stack(&text))),
            Err(ReadError::PermissionDenied { .. }) => Ok(None),
            Err(ReadError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The descriptors a process has open, ascending (the names in `/proc/PID/fd`; [`ProcFs::fd_link`] names
    /// each without touching its filesystem).
    pub fn open_fds(&self, pid: i32) -> Result<Vec<i32>, ReadError> {
        self.numbered_entries(pid, "fd")
    }

    /// Target of `/proc/PID/fd/N` (`/shared/log.txt`, `pipe:[10047]`), by `readlink` only.
    pub fn fd_link(&self, pid: i32, fd: i32) -> Result<String, ReadError> {
        self.link(pid, self.pid_dir(pid).join("fd").join(fd.to_string()))
    }

    pub fn cwd(&self, pid: i32) -> Result<String, ReadError> {
        self.link(pid, self.pid_dir(pid).join("cwd"))
    }

    pub fn exe(&self, pid: i32) -> Result<String, ReadError> {
        self.link(pid, self.pid_dir(pid).join("exe"))
    }

    pub fn fdinfo(&self, pid: i32, fd: i32) -> Result<FdInfo, ReadError> {
        let path = self.pid_dir(pid).join("fdinfo").join(fd.to_string());
        self.parse(pid, None, path, parse_fdinfo)
    }

    /// The process's mount namespace (`readlink /proc/PID/ns/mnt`, `mnt:[4026531841]`): two processes with the
    /// same one see the same mounts at the same paths.
    pub fn mount_namespace(&self, pid: i32) -> Result<String, ReadError> {
        self.link(pid, self.pid_dir(pid).join("ns").join("mnt"))
    }

    /// The process's UTS namespace (`readlink /proc/PID/ns/uts`, `uts:[4026531838]`): emulated Slurm nodes on one
    /// machine each run their `slurmd` (and its step daemons) in one of their own.
    pub fn uts_namespace(&self, pid: i32) -> Result<String, ReadError> {
        self.link(pid, self.pid_dir(pid).join("ns").join("uts"))
    }

    /// The process's network namespace (`readlink /proc/PID/ns/net`, `net:[4026531840]`): its sockets are
    /// described from there.
    pub fn net_namespace(&self, pid: i32) -> Result<String, ReadError> {
        self.link(pid, self.pid_dir(pid).join("ns").join("net"))
    }

    /// `/proc/PID/net/<name>` (`tcp`, `tcp6`, `udp`, `udp6`, `unix`): the sockets of the process's network
    /// namespace, printed by the kernel from memory (no filesystem touched).
    pub fn net_table(&self, pid: i32, name: &str) -> Result<String, ReadError> {
        self.read(pid, None, &self.pid_dir(pid).join("net").join(name))
    }

    /// The descriptors an epoll instance (`fd`, an `anon_inode:[eventpoll]`) watches, from its `fdinfo`.
    pub fn epoll_targets(&self, pid: i32, fd: i32) -> Result<Vec<i32>, ReadError> {
        let path = self.pid_dir(pid).join("fdinfo").join(fd.to_string());
        Ok(crate::net::parse_epoll_targets(
            &self.read(pid, None, &path)?,
        ))
    }

    /// The process's pid namespace (`readlink /proc/PID/ns/pid`, `pid:[4026531836]`).
    pub fn pid_namespace(&self, pid: i32) -> Result<String, ReadError> {
        self.link(pid, self.pid_dir(pid).join("ns").join("pid"))
    }

    /// The process's mount table (its own mount namespace).
    pub fn mountinfo(&self, pid: i32) -> Result<MountTable, ReadError> {
        self.parse(
            pid,
            None,
            self.pid_dir(pid).join("mountinfo"),
            parse_mountinfo,
        )
    }

    /// The process's memory cgroup (`/proc/PID/cgroup`: read from the kernel's task, never from a filesystem
    /// the process uses). `Ok(None)` when the file names none.
    pub fn memory_cgroup(&self, pid: i32) -> Result<Option<crate::MemoryCgroup>, ReadError> {
        let text = self.read(pid, None, &self.pid_dir(pid).join("cgroup"))?;
        Ok(crate::cgroup::parse_proc_cgroup(&text))
    }

    /// `/proc/locks`: every file lock on the node and who waits for which (the kernel's lists; no filesystem
    /// touched).
    pub fn locks(&self) -> Result<Vec<crate::FileLock>, ReadError> {
        let path = self.root.join("locks");
        let text = std::fs::read_to_string(&path).map_err(|source| ReadError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(crate::parse_locks(&text))
    }

    pub fn io(&self, pid: i32) -> Result<IoCounters, ReadError> {
        self.parse(pid, None, self.pid_dir(pid).join("io"), parse_io)
    }

    /// Direct children of a process, ascending: from `task/*/children` when the kernel has it
    /// (`CONFIG_PROC_CHILDREN`), else by scanning every `/proc/N/stat` for the parent pid.
    pub fn children(&self, pid: i32) -> Result<Vec<i32>, ReadError> {
        match self.children_from_files(pid)? {
            Some(children) => Ok(children),
            None => self.children_by_scan(pid),
        }
    }

    /// Children from `task/*/children`; `Ok(None)` when the kernel lacks those files.
    fn children_from_files(&self, pid: i32) -> Result<Option<Vec<i32>>, ReadError> {
        let mut children = Vec::new();
        for tid in self.list_threads(pid)? {
            let path = self.task_dir(pid, tid).join("children");
            match self.read(pid, Some(tid), &path) {
                Ok(text) => children.extend(
                    text.split_ascii_whitespace()
                        .filter_map(|c| c.parse::<i32>().ok()),
                ),
                Err(ReadError::ThreadExited { .. }) => {}
                Err(ReadError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
        children.sort_unstable();
        children.dedup();
        Ok(Some(children))
    }

    /// The processes of the trees below `roots` (the roots included), parents before children, each with its
    /// `stat`: the parent pid is checked there, so a pid reused during the walk is not taken for a child, and
    /// the start time identifies each process. Processes that exit during the walk are left out. Without
    /// `task/*/children`, /proc is scanned once in all, not once per process.
    pub fn subtree(&self, roots: &[i32]) -> Vec<TaskStat> {
        let mut by_parent: Option<HashMap<i32, Vec<TaskStat>>> = None;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut queue: VecDeque<TaskStat> =
            roots.iter().filter_map(|&r| self.stat(r).ok()).collect();
        while let Some(stat) = queue.pop_front() {
            if !seen.insert(stat.pid) {
                continue;
            }
            let pid = stat.pid;
            out.push(stat);
            if by_parent.is_none() {
                match self.children_from_files(pid) {
                    Ok(Some(children)) => {
                        queue.extend(
                            children
                                .into_iter()
                                .filter_map(|c| self.stat(c).ok())
                                .filter(|s| s.ppid == pid),
                        );
                        continue;
                    }
                    Ok(None) => by_parent = Some(self.stats_by_parent()),
                    Err(_) => continue,
                }
            }
            if let Some(children) = by_parent.as_ref().and_then(|m| m.get(&pid)) {
                queue.extend(children.iter().cloned());
            }
        }
        out
    }

    /// Every process's pid (the numbered names in the /proc root; nothing read in them).
    pub fn pids(&self) -> Vec<i32> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .collect()
    }

    /// Every process's `stat` (a scan of the /proc root; processes that exit meanwhile are skipped).
    pub fn all_stats(&self) -> Vec<TaskStat> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter_map(|pid| self.stat(pid).ok())
            .collect()
    }

    /// Every process's `stat`, by parent pid.
    fn stats_by_parent(&self) -> HashMap<i32, Vec<TaskStat>> {
        let mut map: HashMap<i32, Vec<TaskStat>> = HashMap::new();
        for stat in self.all_stats() {
            map.entry(stat.ppid).or_default().push(stat);
        }
        for children in map.values_mut() {
            children.sort_unstable_by_key(|s| s.pid);
        }
        map
    }

    fn children_by_scan(&self, pid: i32) -> Result<Vec<i32>, ReadError> {
        let entries = std::fs::read_dir(&self.root).map_err(|source| ReadError::Io {
            path: self.root.clone(),
            source,
        })?;
        let mut children: Vec<i32> = entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
            .filter(|candidate| self.stat(*candidate).is_ok_and(|stat| stat.ppid == pid))
            .collect();
        children.sort_unstable();
        Ok(children)
    }

    /// Every process below `pid`, parents before children. Processes that exit during the walk are skipped.
    pub fn descendants(&self, pid: i32) -> Result<Vec<i32>, ReadError> {
        let mut seen = HashSet::from([pid]);
        let mut queue = VecDeque::from([pid]);
        let mut out = Vec::new();
        while let Some(parent) = queue.pop_front() {
            let children = match self.children(parent) {
                Ok(children) => children,
                Err(e) if e.is_exited() && parent != pid => continue,
                Err(e) => return Err(e),
            };
            for child in children {
                if seen.insert(child) {
                    out.push(child);
                    queue.push_back(child);
                }
            }
        }
        Ok(out)
    }

    /// One raw sample of a process and its threads. Fails only when the process itself is gone or its `stat`
    /// is unreadable; a thread that exits meanwhile is left out, and other failed reads are listed in `issues`.
    pub fn sample_process(&self, pid: i32) -> Result<ProcessSample, ReadError> {
        self.sample(pid, true)
    }

    /// A sample with only what tells whether a thread ran since (stat and status: CPU time, context switches),
    /// without wait channels, system calls or kernel stacks: the first of a roll call's two samples, which only
    /// the counters of are compared.
    pub fn sample_counters(&self, pid: i32) -> Result<ProcessSample, ReadError> {
        self.sample(pid, false)
    }

    fn sample(&self, pid: i32, full: bool) -> Result<ProcessSample, ReadError> {
        let stat = self.stat(pid)?;
        let mut issues = Issues::default();
        let status = match self.status(pid) {
            Ok(status) => Some(status),
            Err(e @ ReadError::ProcessExited { .. }) => return Err(e),
            Err(e) => {
                issues.note("status", &e);
                None
            }
        };
        let mut threads = Vec::new();
        for tid in self.list_threads(pid)? {
            match self.sample_thread(pid, tid, full, &mut issues) {
                Ok(Some(thread)) => threads.push(thread),
                Ok(None) => {}
                Err(e) => return Err(e),
            }
        }
        let io = self.io(pid).ok();
        Ok(ProcessSample {
            pid,
            stat,
            status,
            threads,
            issues: issues.list,
            io,
        })
    }

    /// `Ok(None)`: the thread exited or its `stat` could not be read (noted).
    fn sample_thread(
        &self,
        pid: i32,
        tid: i32,
        full: bool,
        issues: &mut Issues,
    ) -> Result<Option<ThreadSample>, ReadError> {
        let stat = match self.task_stat(pid, tid) {
            Ok(stat) => stat,
            Err(e @ ReadError::ProcessExited { .. }) => return Err(e),
            Err(ReadError::ThreadExited { .. }) => return Ok(None),
            Err(e) => {
                issues.note("task stat", &e);
                return Ok(None);
            }
        };
        let mut thread = ThreadSample {
            tid,
            stat,
            status: None,
            wchan: None,
            syscall: None,
            kernel_stack: None,
        };
        macro_rules! optional {
            ($field:ident, $what:literal, $read:expr) => {
                match $read {
                    Ok(value) => thread.$field = value,
                    Err(e @ ReadError::ProcessExited { .. }) => return Err(e),
                    Err(ReadError::ThreadExited { .. }) => return Ok(None),
                    Err(e) => issues.note($what, &e),
                }
            };
        }
        optional!(status, "task status", self.task_status(pid, tid).map(Some));
        if !full {
            return Ok(Some(thread));
        }
        optional!(wchan, "wchan", self.wchan(pid, tid));
        optional!(syscall, "syscall", self.syscall(pid, tid).map(Some));
        optional!(kernel_stack, "stack", self.kernel_stack(pid, tid));
        Ok(Some(thread))
    }

    /// Resolves a syscall's file argument: `readlink` of the fd (or cwd), `mnt_id` from `fdinfo`, and the
    /// mount from `mounts` (the process's table; read it once per process with [`ProcFs::mountinfo`]).
    pub fn resolve(
        &self,
        pid: i32,
        target: FileTarget,
        mounts: Option<&MountTable>,
    ) -> Result<FileRef, ReadError> {
        let (link, mnt_id) = match target {
            FileTarget::Fd(fd) => (
                self.fd_link(pid, fd)?,
                self.fdinfo(pid, fd).ok().and_then(|info| info.mnt_id),
            ),
            FileTarget::Cwd => (self.cwd(pid)?, None),
        };
        Ok(resolve_file_ref(&link, mnt_id, mounts))
    }

    /// A resolver for [`crate::observe_threads`] that reads the mount table at most once and each fd once.
    pub fn file_resolver(&self, pid: i32) -> FileResolver<'_> {
        FileResolver {
            fs: self,
            pid,
            mounts: None,
            cache: HashMap::new(),
            issues: Issues::default(),
        }
    }

    /// Samples twice, `interval` apart, and merges: the whole /proc part of a roll call for one process.
    /// Blocks the calling thread for `interval`.
    pub fn observe_process(
        &self,
        pid: i32,
        interval: Duration,
        clk_tck: u64,
    ) -> Result<ProcessObservation, ReadError> {
        let first = self.sample_process(pid)?;
        let started = Instant::now();
        std::thread::sleep(interval);
        let second = self.sample_process(pid)?;
        let elapsed = started.elapsed();
        let mut resolver = self.file_resolver(pid);
        let mut observation = observe_process(&first, &second, elapsed, clk_tck, |target| {
            resolver.resolve(target)
        });
        observation.read_issues.extend(resolver.issues.list);
        Ok(observation)
    }

    fn pid_dir(&self, pid: i32) -> PathBuf {
        self.root.join(pid.to_string())
    }

    fn task_dir(&self, pid: i32, tid: i32) -> PathBuf {
        self.pid_dir(pid).join("task").join(tid.to_string())
    }

    fn read(&self, pid: i32, tid: Option<i32>, path: &Path) -> Result<String, ReadError> {
        std::fs::read(path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .map_err(|e| self.classify(pid, tid, path, e))
    }

    fn parse<T>(
        &self,
        pid: i32,
        tid: Option<i32>,
        path: PathBuf,
        parser: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Result<T, ReadError> {
        let text = self.read(pid, tid, &path)?;
        parser(&text).map_err(|source| ReadError::Parse { path, source })
    }

    fn link(&self, pid: i32, path: PathBuf) -> Result<String, ReadError> {
        std::fs::read_link(&path)
            .map(|target| target.to_string_lossy().into_owned())
            .map_err(|e| self.classify(pid, None, &path, e))
    }

    /// A missing file of a vanished process is "exited", not an I/O error: the caller reports the rank as gone.
    fn classify(&self, pid: i32, tid: Option<i32>, path: &Path, source: io::Error) -> ReadError {
        let gone = source.kind() == io::ErrorKind::NotFound
            || source.raw_os_error() == Some(Errno::ESRCH as i32);
        if gone {
            if !exists(&self.pid_dir(pid)) {
                return ReadError::ProcessExited { pid };
            }
            if let Some(tid) = tid {
                if !exists(&self.task_dir(pid, tid)) {
                    return ReadError::ThreadExited { pid, tid };
                }
            }
        }
        let path = path.to_owned();
        if source.kind() == io::ErrorKind::PermissionDenied {
            ReadError::PermissionDenied { path, source }
        } else {
            ReadError::Io { path, source }
        }
    }
}

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Resolves file targets of one process, caching what it read. Built by [`ProcFs::file_resolver`].
#[derive(Debug)]
pub struct FileResolver<'a> {
    fs: &'a ProcFs,
    pid: i32,
    mounts: Option<Option<MountTable>>,
    cache: HashMap<FileTarget, Option<FileRef>>,
    issues: Issues,
}

impl FileResolver<'_> {
    /// `None` when the fd is closed or its link could not be read (listed in [`FileResolver::issues`]).
    pub fn resolve(&mut self, target: FileTarget) -> Option<FileRef> {
        if let Some(known) = self.cache.get(&target) {
            return known.clone();
        }
        let (fs, pid) = (self.fs, self.pid);
        let issues = &mut self.issues;
        let mounts = self
            .mounts
            .get_or_insert_with(|| match fs.mountinfo(pid) {
                Ok(table) => Some(table),
                Err(e) => {
                    issues.note("mountinfo", &e);
                    None
                }
            })
            .as_ref();
        let resolved = match fs.resolve(pid, target, mounts) {
            Ok(file) => Some(file),
            Err(e) => {
                self.issues.note("fd link", &e);
                None
            }
        };
        self.cache.insert(target, resolved.clone());
        resolved
    }

    /// Reads that failed, in words.
    pub fn issues(&self) -> &[String] {
        &self.issues.list
    }
}

/// Failed reads, one line per kind of file so that a process with 500 threads does not give 500 lines.
#[derive(Debug, Default)]
struct Issues {
    seen: HashSet<&'static str>,
    list: Vec<String>,
}

impl Issues {
    fn note(&mut self, what: &'static str, error: &ReadError) {
        if self.seen.insert(what) {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            self.list.push(text);
        }
    }
}
