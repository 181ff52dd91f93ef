//! Parsers of the /proc files hangwatch reads (and of the memory cgroup files a rank's death is explained from), and [`ProcFs`], a reader that only touches the entries that stay
//! safe on a process stuck on a frozen filesystem (see `docs/proc.md`).
//!
//! Parsing is apart from reading: every parser takes the file's text, so tests feed captured samples, and the
//! reader's root is a parameter, so tests point it at a fake tree. Merging two samples into observations
//! ([`observe_threads`]) and resolving a file to its mount ([`resolve_file_ref`]) are pure functions.

mod cgroup;
mod clock;
mod cmdline;
mod environ;
mod error;
mod fdinfo;
mod identity;
mod io;
mod kernel;
mod locks;
mod maps;
mod mountinfo;
mod net;
mod observe;
mod reader;
mod resolve;
mod stat;
mod status;
mod syscall;

pub use cgroup::{
    parse_memory_events, parse_memory_limit, parse_oom_control, parse_proc_cgroup, CgroupFs,
    CgroupVersion, MemoryCgroup, MemoryCgroupState,
};
pub use clock::{clk_tck, DEFAULT_CLK_TCK};
pub use cmdline::{is_multiprocessing_spawn, parse_cmdline};
pub use environ::{parse_environ, Environ, RankEnv, SlurmTask, LAUNCHER_VARIABLES};
pub use error::{ParseError, ReadError};
pub use fdinfo::{parse_fdinfo, FdInfo};
pub use hangwatch_kernel::filesystem::is_pseudo_fstype;
/// Which filesystem types can stop answering while the node is fine: the kernel crate's knowledge, here for the
/// readers of mount tables.
pub use hangwatch_kernel::filesystem::is_remote_fstype;
/// The system call tables are kernel knowledge (`hangwatch-kernel`); named here for the callers of the reader.
pub use hangwatch_kernel::syscall::{
    file_arg, syscall_name, syscall_name_for, Arch, FileArg, AT_FDCWD,
};
pub use identity::{filesystem_id, is_initial_pid_namespace, INITIAL_PID_NAMESPACE};
pub use io::{parse_io, IoCounters};
pub use kernel::{parse_stack, parse_wchan};
pub use locks::{holders_of_waits, parse_locks, FileLock};
pub use maps::{mapped_files, parse_maps, Mapping, MAX_MAPPED_FILES};
pub use mountinfo::{parse_mountinfo, unescape, Mount, MountTable};
pub use net::{
    addr_words, parse_epoll_targets, parse_proc_net_inet, parse_proc_net_unix, parse_tcp_info,
    socket_inode, unix_protocol, NetSocket, TcpInfo,
};
pub use observe::{
    decode_syscall, observe_process, observe_threads, second_look, ProcessSample, ThreadSample,
};
pub use reader::{FileResolver, ProcFs};
pub use resolve::{resolve_file_ref, FileTarget};
pub use stat::{parse_stat, TaskStat};
pub use status::{parse_status, SignalMask, Status};
pub use syscall::{parse_syscall, SyscallLine};
