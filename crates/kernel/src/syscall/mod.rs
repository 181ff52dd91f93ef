//! System calls: numbers to names (x86_64 and aarch64), which argument of a call names a file (the fd a blocked
//! `write` waits on is what leads from a stuck thread to a file, a mount and a filesystem) or counts bytes, and the
//! syscall entry frames of kernel stacks (`ksys_write`, `__x64_sys_openat`) for traces that print no registers.

mod aarch64;
mod x86_64;

/// `AT_FDCWD`: the dirfd value meaning "relative to the current directory".
pub const AT_FDCWD: i32 = -100;

/// Instruction set whose numbering `/proc/PID/task/TID/syscall` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// The architecture hangwatch was built for; `None` on others, where calls are reported by number only.
    pub const fn host() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }

    fn table(self) -> &'static [(i64, &'static str)] {
        match self {
            Arch::X86_64 => x86_64::X86_64,
            Arch::Aarch64 => aarch64::AARCH64,
        }
    }
}

/// Name of system call `nr` on `arch` (`write`), if known.
pub fn syscall_name_for(arch: Arch, nr: i64) -> Option<&'static str> {
    let table = arch.table();
    table
        .binary_search_by_key(&nr, |(n, _)| *n)
        .ok()
        .map(|index| table[index].1)
}

/// Name of system call `nr` on the machine hangwatch runs on.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    Arch::host().and_then(|arch| syscall_name_for(arch, nr))
}

/// Which argument of a system call names a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileArg {
    /// No file argument (futex, nanosleep, wait4, ...).
    None,
    /// Argument `index` (0-based) is a file descriptor: `write(fd, ...)`, `epoll_wait(epfd, ...)`, or the fd of
    /// `mmap` (index 4; negative for anonymous maps).
    Fd { index: usize },
    /// Argument `index` is a directory fd (or `AT_FDCWD`) that the path at argument `path` (a pointer into the
    /// process's memory) is relative to.
    DirFd { index: usize, path: usize },
    /// Argument `path` is a path relative to the current directory, with no fd (`open`, `stat`, `mkdir` on
    /// x86_64).
    CwdPath { path: usize },
}

/// Calls whose first argument is a file descriptor.
const FD_FIRST: &[&str] = &[
    "read",
    "write",
    "pread64",
    "pwrite64",
    "readv",
    "writev",
    "preadv",
    "pwritev",
    "preadv2",
    "pwritev2",
    "fsync",
    "fdatasync",
    "syncfs",
    "sync_file_range",
    "fstat",
    "fstatfs",
    "ioctl",
    "fcntl",
    "getdents",
    "getdents64",
    "lseek",
    "ftruncate",
    "fallocate",
    "flock",
    "fadvise64",
    "readahead",
    "fchmod",
    "fchown",
    "fchdir",
    "fgetxattr",
    "fsetxattr",
    "flistxattr",
    "fremovexattr",
    "close",
    "sendfile",
    "copy_file_range",
    "splice",
    "tee",
    "vmsplice",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "sendmmsg",
    "recvmmsg",
    "accept",
    "accept4",
    "connect",
    "bind",
    "listen",
    "shutdown",
    "getsockopt",
    "setsockopt",
    "getsockname",
    "getpeername",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_ctl",
    "io_uring_enter",
    "io_uring_register",
    "inotify_add_watch",
    "fanotify_mark",
    "timerfd_settime",
    "timerfd_gettime",
    "pidfd_send_signal",
    "pidfd_getfd",
];

/// Calls whose first argument is a directory fd for a path argument.
const DIRFD_FIRST: &[&str] = &[
    "openat",
    "openat2",
    "newfstatat",
    "statx",
    "unlinkat",
    "mkdirat",
    "mknodat",
    "fchownat",
    "futimesat",
    "utimensat",
    "faccessat",
    "faccessat2",
    "fchmodat",
    "fchmodat2",
    "readlinkat",
    "linkat",
    "renameat",
    "renameat2",
    "name_to_handle_at",
    "execveat",
    "open_tree",
    "fspick",
    "move_mount",
    "mount_setattr",
    "getxattrat",
    "setxattrat",
    "listxattrat",
    "removexattrat",
    "open_tree_attr",
];

/// Calls with a path relative to the current directory and no fd.
const CWD_PATH: &[&str] = &[
    "open",
    "creat",
    "stat",
    "lstat",
    "access",
    "mkdir",
    "rmdir",
    "unlink",
    "rename",
    "link",
    "symlink",
    "readlink",
    "chmod",
    "chown",
    "lchown",
    "truncate",
    "statfs",
    "chdir",
    "chroot",
    "execve",
    "utime",
    "utimes",
    "mknod",
    "getxattr",
    "lgetxattr",
    "setxattr",
    "lsetxattr",
    "listxattr",
    "llistxattr",
    "removexattr",
    "lremovexattr",
    "uselib",
    "acct",
    "swapon",
    "swapoff",
    "mount",
    "umount2",
    "pivot_root",
];

/// How system call `name` refers to a file. By name, so it holds on every architecture.
pub fn file_arg(name: &str) -> FileArg {
    if FD_FIRST.contains(&name) {
        FileArg::Fd { index: 0 }
    } else if name == "mmap" {
        FileArg::Fd { index: 4 }
    } else if DIRFD_FIRST.contains(&name) {
        FileArg::DirFd { index: 0, path: 1 }
    } else if name == "symlinkat" {
        // symlinkat(target, newdirfd, linkpath): the link is what is created.
        FileArg::DirFd { index: 1, path: 2 }
    } else if name == "symlink" {
        FileArg::CwdPath { path: 1 }
    } else if CWD_PATH.contains(&name) {
        FileArg::CwdPath { path: 0 }
    } else {
        FileArg::None
    }
}

/// Which argument of a call (0-based) is a byte count, as the user would read it: `write(fd 108, 2440 bytes)`.
pub fn byte_count_arg(name: &str) -> Option<usize> {
    matches!(name, "read" | "write" | "pread64" | "pwrite64").then_some(2)
}

/// The system call named by a syscall entry frame (function name without offset or module), if it is one.
/// Covers the generic wrappers of all architectures and the `ksys_`/`do_sys_` helpers that survive inlining.
pub fn from_entry_frame(function: &str) -> Option<String> {
    const PREFIXES: [&str; 9] = [
        "__x64_sys_",
        "__arm64_sys_",
        "__ia32_sys_",
        "__riscv_sys_",
        "__se_sys_",
        "__do_sys_",
        "ksys_",
        "SyS_",
        "sys_",
    ];
    for prefix in PREFIXES {
        if let Some(name) = function.strip_prefix(prefix) {
            if name.is_empty() || !name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
                return None;
            }
            return Some(normalize(name).to_string());
        }
    }
    let name = match function {
        "do_sys_open" | "do_sys_openat2" => "openat",
        "do_unlinkat" => "unlinkat",
        "do_rmdir" => "rmdir",
        "do_mkdirat" => "mkdirat",
        "do_renameat2" => "renameat2",
        "do_fsync" => "fsync",
        "do_sys_ftruncate" => "ftruncate",
        "iterate_dir" => "getdents64",
        "do_statx" => "statx",
        _ => return None,
    };
    Some(name.to_string())
}

/// The kernel's internal names of the stat family (`newstat`) are the user's `stat`.
fn normalize(name: &str) -> &str {
    match name {
        "newstat" => "stat",
        "newlstat" => "lstat",
        "newfstat" => "fstat",
        "newuname" => "uname",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_sorted_and_unique() {
        for arch in [Arch::X86_64, Arch::Aarch64] {
            let table = arch.table();
            assert!(table.len() > 300, "{arch:?} table has {}", table.len());
            assert!(table.windows(2).all(|w| w[0].0 < w[1].0), "{arch:?}");
            let mut names: Vec<_> = table.iter().map(|(_, n)| *n).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), table.len(), "{arch:?} has a duplicate name");
        }
    }

    #[test]
    fn x86_64_common_calls() {
        let name = |nr| syscall_name_for(Arch::X86_64, nr);
        for (nr, expected) in [
            (0, "read"),
            (1, "write"),
            (3, "close"),
            (4, "stat"),
            (7, "poll"),
            (9, "mmap"),
            (11, "munmap"),
            (17, "pread64"),
            (18, "pwrite64"),
            (20, "writev"),
            (23, "select"),
            (35, "nanosleep"),
            (42, "connect"),
            (43, "accept"),
            (44, "sendto"),
            (45, "recvfrom"),
            (46, "sendmsg"),
            (47, "recvmsg"),
            (56, "clone"),
            (61, "wait4"),
            (72, "fcntl"),
            (73, "flock"),
            (74, "fsync"),
            (75, "fdatasync"),
            (202, "futex"),
            (217, "getdents64"),
            (230, "clock_nanosleep"),
            (232, "epoll_wait"),
            (247, "waitid"),
            (257, "openat"),
            (262, "newfstatat"),
            (270, "pselect6"),
            (271, "ppoll"),
            (281, "epoll_pwait"),
            (285, "fallocate"),
            (288, "accept4"),
            (332, "statx"),
            (426, "io_uring_enter"),
            (435, "clone3"),
            (441, "epoll_pwait2"),
            (449, "futex_waitv"),
        ] {
            assert_eq!(name(nr), Some(expected), "x86_64 {nr}");
        }
        assert_eq!(name(-1), None);
        assert_eq!(name(100_000), None);
    }

    #[test]
    fn aarch64_common_calls() {
        let name = |nr| syscall_name_for(Arch::Aarch64, nr);
        for (nr, expected) in [
            (17, "getcwd"),
            (22, "epoll_pwait"),
            (25, "fcntl"),
            (29, "ioctl"),
            (32, "flock"),
            (56, "openat"),
            (57, "close"),
            (61, "getdents64"),
            (62, "lseek"),
            (63, "read"),
            (64, "write"),
            (66, "writev"),
            (67, "pread64"),
            (68, "pwrite64"),
            (72, "pselect6"),
            (73, "ppoll"),
            (79, "newfstatat"),
            (80, "fstat"),
            (82, "fsync"),
            (83, "fdatasync"),
            (84, "sync_file_range"),
            (98, "futex"),
            (101, "nanosleep"),
            (115, "clock_nanosleep"),
            (203, "connect"),
            (206, "sendto"),
            (207, "recvfrom"),
            (211, "sendmsg"),
            (212, "recvmsg"),
            (215, "munmap"),
            (220, "clone"),
            (222, "mmap"),
            (242, "accept4"),
            (260, "wait4"),
            (291, "statx"),
            (435, "clone3"),
        ] {
            assert_eq!(name(nr), Some(expected), "aarch64 {nr}");
        }
        assert_eq!(name(1024), None);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn host_is_x86_64() {
        assert_eq!(Arch::host(), Some(Arch::X86_64));
        assert_eq!(syscall_name(1), Some("write"));
    }

    #[test]
    fn file_arguments() {
        for call in [
            "read",
            "write",
            "pwrite64",
            "writev",
            "fsync",
            "fdatasync",
            "fstat",
            "ioctl",
            "fcntl",
            "getdents64",
            "sendto",
            "recvfrom",
            "sendmsg",
            "recvmsg",
            "accept",
            "accept4",
            "connect",
            "flock",
            "ftruncate",
            "fallocate",
            "sync_file_range",
            "lseek",
            "epoll_wait",
            "epoll_pwait",
        ] {
            assert_eq!(file_arg(call), FileArg::Fd { index: 0 }, "{call}");
        }
        assert_eq!(file_arg("mmap"), FileArg::Fd { index: 4 });
        for call in [
            "openat",
            "newfstatat",
            "statx",
            "unlinkat",
            "mkdirat",
            "renameat2",
        ] {
            assert_eq!(
                file_arg(call),
                FileArg::DirFd { index: 0, path: 1 },
                "{call}"
            );
        }
        assert_eq!(file_arg("symlinkat"), FileArg::DirFd { index: 1, path: 2 });
        assert_eq!(file_arg("symlink"), FileArg::CwdPath { path: 1 });
        assert_eq!(file_arg("open"), FileArg::CwdPath { path: 0 });
        for call in [
            "futex",
            "clock_nanosleep",
            "wait4",
            "poll",
            "clone",
            "munmap",
        ] {
            assert_eq!(file_arg(call), FileArg::None, "{call}");
        }
    }

    #[test]
    fn every_listed_file_call_is_a_real_call() {
        let known = |name: &str| {
            [Arch::X86_64, Arch::Aarch64]
                .iter()
                .any(|arch| arch.table().iter().any(|(_, n)| *n == name))
        };
        for name in FD_FIRST.iter().chain(DIRFD_FIRST).chain(CWD_PATH) {
            assert!(
                known(name),
                "{name} is not a system call on x86_64 or aarch64"
            );
        }
    }

    #[test]
    fn entry_frames_name_the_call() {
        assert_eq!(from_entry_frame("ksys_write").as_deref(), Some("write"));
        assert_eq!(
            from_entry_frame("__x64_sys_openat").as_deref(),
            Some("openat")
        );
        assert_eq!(
            from_entry_frame("__arm64_sys_read").as_deref(),
            Some("read")
        );
        assert_eq!(
            from_entry_frame("__do_sys_newstat").as_deref(),
            Some("stat")
        );
        assert_eq!(from_entry_frame("SyS_fsync").as_deref(), Some("fsync"));
        assert_eq!(from_entry_frame("vfs_write"), None);
        assert_eq!(from_entry_frame("sys_"), None);
    }

    #[test]
    fn byte_counts_are_the_third_argument_of_reads_and_writes() {
        assert_eq!(byte_count_arg("pwrite64"), Some(2));
        assert_eq!(byte_count_arg("fsync"), None);
    }
}
