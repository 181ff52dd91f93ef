//! System-call names: x86_64 numbers (from `ORIG_RAX` in register dumps) and the syscall entry frames of kernel
//! stacks (`ksys_write`, `__x64_sys_openat`, `__arm64_sys_read`) for traces that print no registers.

/// Name of an x86_64 system call number, for the calls a stuck training process is likely to sit in.
pub fn x86_64_name(nr: u64) -> Option<&'static str> {
    let name = match nr {
        0 => "read",
        1 => "write",
        2 => "open",
        3 => "close",
        4 => "stat",
        5 => "fstat",
        6 => "lstat",
        7 => "poll",
        8 => "lseek",
        9 => "mmap",
        10 => "mprotect",
        11 => "munmap",
        12 => "brk",
        16 => "ioctl",
        17 => "pread64",
        18 => "pwrite64",
        19 => "readv",
        20 => "writev",
        21 => "access",
        22 => "pipe",
        23 => "select",
        24 => "sched_yield",
        25 => "mremap",
        26 => "msync",
        28 => "madvise",
        32 => "dup",
        33 => "dup2",
        35 => "nanosleep",
        40 => "sendfile",
        41 => "socket",
        42 => "connect",
        43 => "accept",
        44 => "sendto",
        45 => "recvfrom",
        46 => "sendmsg",
        47 => "recvmsg",
        56 => "clone",
        57 => "fork",
        59 => "execve",
        60 => "exit",
        61 => "wait4",
        62 => "kill",
        72 => "fcntl",
        73 => "flock",
        74 => "fsync",
        75 => "fdatasync",
        76 => "truncate",
        77 => "ftruncate",
        78 => "getdents",
        79 => "getcwd",
        80 => "chdir",
        82 => "rename",
        83 => "mkdir",
        84 => "rmdir",
        85 => "creat",
        86 => "link",
        87 => "unlink",
        88 => "symlink",
        89 => "readlink",
        90 => "chmod",
        91 => "fchmod",
        92 => "chown",
        93 => "fchown",
        137 => "statfs",
        138 => "fstatfs",
        162 => "sync",
        165 => "mount",
        166 => "umount2",
        191 => "getxattr",
        192 => "lgetxattr",
        193 => "fgetxattr",
        202 => "futex",
        217 => "getdents64",
        230 => "clock_nanosleep",
        231 => "exit_group",
        232 => "epoll_wait",
        247 => "waitid",
        257 => "openat",
        258 => "mkdirat",
        262 => "newfstatat",
        263 => "unlinkat",
        264 => "renameat",
        265 => "linkat",
        267 => "readlinkat",
        269 => "faccessat",
        270 => "pselect6",
        271 => "ppoll",
        275 => "splice",
        277 => "sync_file_range",
        281 => "epoll_pwait",
        285 => "fallocate",
        295 => "preadv",
        296 => "pwritev",
        306 => "syncfs",
        316 => "renameat2",
        326 => "copy_file_range",
        327 => "preadv2",
        328 => "pwritev2",
        332 => "statx",
        426 => "io_uring_enter",
        437 => "openat2",
        439 => "faccessat2",
        _ => return None,
    };
    Some(name)
}

/// Which arguments of a call are a file descriptor (first) and a byte count (third), as the user would read
/// them: `write(fd 108, 2440 bytes)`.
pub fn arg_meaning(name: &str) -> (bool, bool) {
    match name {
        "read" | "write" | "pread64" | "pwrite64" => (true, true),
        "close" | "fstat" | "lseek" | "ioctl" | "readv" | "writev" | "fcntl" | "flock"
        | "fsync" | "fdatasync" | "ftruncate" | "getdents" | "getdents64" | "fstatfs"
        | "fgetxattr" | "syncfs" | "fallocate" | "sync_file_range" | "preadv" | "pwritev"
        | "preadv2" | "pwritev2" | "sendfile" | "copy_file_range" => (true, false),
        _ => (false, false),
    }
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
    fn common_x86_64_numbers() {
        assert_eq!(x86_64_name(1), Some("write"));
        assert_eq!(x86_64_name(4), Some("stat"));
        assert_eq!(x86_64_name(257), Some("openat"));
        assert_eq!(x86_64_name(74), Some("fsync"));
        assert_eq!(x86_64_name(332), Some("statx"));
        assert_eq!(x86_64_name(u64::MAX), None);
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
}
