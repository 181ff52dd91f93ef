//! The lines of a hung-task report (`INFO: task python:280058 blocked for more than 120 seconds.`, the task line
//! in its old and new forms, x86 registers) and the finished report with what its stack and registers say.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use hangwatch_kernel::syscall::{byte_count_arg, file_arg, syscall_name_for, Arch, FileArg};
use hangwatch_model::kernel_log::{Blocker, Filesystem, Syscall, SyscallSource, Timestamp};

use crate::stack::{self, Frame};

/// One `INFO: task ... blocked for more than N seconds.` report, with its task line, stack and registers read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HungTaskReport {
    /// Time of the `INFO: task` line.
    pub time: Timestamp,
    /// Command name (15 characters at most; for threads the thread's name).
    pub comm: String,
    /// Task id: the pid of a single-threaded process, else the thread's tid.
    pub pid: u32,
    /// `tgid:` on kernels that print it: the process a thread belongs to.
    pub tgid: Option<u32>,
    pub ppid: Option<u32>,
    /// Task state letter (`D`; hung-task reports are about uninterruptible sleep).
    pub state: Option<String>,
    /// The N of "blocked for more than N seconds".
    pub blocked_for_s: u64,
    pub syscall: Option<Syscall>,
    pub filesystem: Option<Filesystem>,
    /// The frame that named the filesystem.
    pub filesystem_frame: Option<String>,
    /// Waiting for a frozen filesystem (`fsfreeze`).
    pub frozen: bool,
    /// VFS operation under way (`write`, `lookup`, `fsync`, `page fault`...).
    pub operation: Option<String>,
    /// First frame outside the scheduler (what `/proc/PID/wchan` would show).
    pub wchan: Option<String>,
    /// Reliable frames, innermost first, without offsets, consecutive repeats removed.
    pub stack: Vec<String>,
    /// Recent kernels name the task that likely holds the lock this one waits for.
    pub blocked_on: Option<Blocker>,
}

/// `INFO: task python:280058 blocked for more than 120 seconds.` -> (comm, pid, seconds).
pub fn parse_header(text: &str) -> Option<(String, u32, u64)> {
    let rest = text.trim_start().strip_prefix("INFO: task ")?;
    let (task, after) = rest.rsplit_once(" blocked for more than ")?;
    let (comm, pid) = task.rsplit_once(':')?;
    let pid = pid.parse().ok()?;
    let secs_text = after.split(' ').next()?;
    let secs = secs_text.parse().ok()?;
    after
        .strip_prefix(secs_text)?
        .starts_with(" second")
        .then(|| (comm.to_string(), pid, secs))
}

/// `INFO: task A:1 is blocked on a mutex likely owned by task B:2.` -> (pid 1, blocker B:2).
pub fn parse_blocker(text: &str) -> Option<(u32, Blocker)> {
    let rest = text.trim_start().strip_prefix("INFO: task ")?;
    let (task, after) = rest.split_once(" is blocked on ")?;
    let (_, pid) = task.rsplit_once(':')?;
    let pid = pid.parse().ok()?;
    let (lock_words, owner) = after.split_once(" by task ")?;
    let lock = lock_words
        .trim_start_matches("a ")
        .trim_start_matches("an ")
        .split(' ')
        .next()?
        .to_string();
    let owner = owner.trim_end().trim_end_matches('.');
    let (comm, owner_pid) = owner.rsplit_once(':')?;
    Some((
        pid,
        Blocker {
            comm: comm.to_string(),
            pid: owner_pid.parse().ok()?,
            lock,
        },
    ))
}

/// The task line of a report, either form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskLine {
    pub comm: String,
    pub state: Option<String>,
    pub pid: Option<u32>,
    pub tgid: Option<u32>,
    pub ppid: Option<u32>,
}

/// `task:python          state:D stack:    0 pid:280058 ppid:279966 flags:0x00000080` (5.x+, maybe `tgid:`).
pub fn parse_task_line(text: &str) -> Option<TaskLine> {
    let rest = text.trim_start().strip_prefix("task:")?;
    let at = rest.find(" state:")?;
    let comm = rest[..at].trim().to_string();
    let fields = &rest[at..];
    let field = |key: &str| -> Option<&str> {
        let needle = format!(" {key}:");
        let at = fields.find(&needle)?;
        fields[at + needle.len()..].split_whitespace().next()
    };
    Some(TaskLine {
        comm,
        state: field("state").map(str::to_string),
        pid: field("pid").and_then(|v| v.parse().ok()),
        tgid: field("tgid").and_then(|v| v.parse().ok()),
        ppid: field("ppid").and_then(|v| v.parse().ok()),
    })
}

/// `python          D    0  7088      2 0x80000000` (4.x) or with the saved PC before the stack size
/// (`python D ffff88103fc53680 0 7088 2 0x00000080`, 3.x). Read from the right because comm may hold spaces;
/// accepted only for the pid the header named.
pub fn parse_old_task_line(text: &str, expected_pid: u32) -> Option<TaskLine> {
    let tokens: Vec<&str> = text.split_whitespace().collect();
    if tokens.len() < 6 {
        return None;
    }
    let n = tokens.len();
    let flags = tokens[n - 1];
    if !flags.starts_with("0x") {
        return None;
    }
    let ppid: u32 = tokens[n - 2].parse().ok()?;
    let pid: u32 = tokens[n - 3].parse().ok()?;
    let _free: u64 = tokens[n - 4].parse().ok()?;
    if pid != expected_pid {
        return None;
    }
    let mut state_at = n - 5;
    if tokens[state_at].len() >= 8 && tokens[state_at].bytes().all(|c| c.is_ascii_hexdigit()) {
        state_at = state_at.checked_sub(1)?;
    }
    let state = tokens[state_at];
    if state.len() != 1 || state_at == 0 {
        return None;
    }
    let comm_end = text.find(&format!(" {state} ")).unwrap_or(0);
    let comm = if comm_end > 0 {
        text[..comm_end].trim().to_string()
    } else {
        tokens[..state_at].join(" ")
    };
    Some(TaskLine {
        comm,
        state: Some(state.to_string()),
        pid: Some(pid),
        tgid: None,
        ppid: Some(ppid),
    })
}

/// `Tainted: P OE ...` / `Not tainted 6.5.0 #1` / the `echo 0 >` hint: header lines with nothing to keep.
pub fn is_header_noise(text: &str) -> bool {
    let t = text.trim_start();
    t.starts_with("Tainted:")
        || t.starts_with("Not tainted")
        || t.starts_with("\"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\"")
}

/// `Call Trace:` (x86) or `Call trace:` (arm64).
pub fn is_call_trace(text: &str) -> bool {
    matches!(text.trim(), "Call Trace:" | "Call trace:")
}

/// The registers of an x86 dump line: `RSP: 002b:00007fff14b5a9d0 EFLAGS: 00000293 ORIG_RAX: 0000000000000001`.
/// Values keep their segment (`0033:0x14f7d0d9da07`). `None` when the line is not a register line.
pub fn parse_register_line(text: &str) -> Option<Vec<(String, String)>> {
    let tokens: Vec<&str> = text.split_whitespace().collect();
    let first = tokens.first()?;
    let first_key = first.strip_suffix(':')?;
    if !is_register_name(first_key) {
        return None;
    }
    let mut pairs = Vec::new();
    let mut i = 0;
    while i + 1 < tokens.len() {
        match tokens[i].strip_suffix(':') {
            Some(key) if is_register_name(key) => {
                pairs.push((key.to_string(), tokens[i + 1].to_string()));
                i += 2;
            }
            _ => i += 1,
        }
    }
    (!pairs.is_empty()).then_some(pairs)
}

fn is_register_name(key: &str) -> bool {
    const NAMES: [&str; 27] = [
        "RIP", "RSP", "EFLAGS", "ORIG_RAX", "RAX", "RBX", "RCX", "RDX", "RSI", "RDI", "RBP", "R08",
        "R09", "R10", "R11", "R12", "R13", "R14", "R15", "FS", "GS", "CS", "DS", "ES", "CR0",
        "CR2", "CR3",
    ];
    NAMES.contains(&key)
}

/// Register values by name, as read so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Registers(pub BTreeMap<String, String>);

impl Registers {
    fn value(&self, name: &str) -> Option<u64> {
        let raw = self.0.get(name)?;
        let hex = raw.rsplit(':').next()?.trim_start_matches("0x");
        u64::from_str_radix(hex, 16).ok()
    }

    /// `0033` of `RIP: 0033:0x...`: the code segment says user (0033) or kernel (0010) mode.
    fn rip_segment(&self) -> Option<&str> {
        self.0.get("RIP")?.split_once(':').map(|(seg, _)| seg)
    }

    /// The system call the user registers describe; `None` for kernel-mode registers or no `ORIG_RAX`.
    pub fn syscall(&self) -> Option<Syscall> {
        let nr = self.value("ORIG_RAX")?;
        if nr >= 1024 {
            return None;
        }
        let name = match self.rip_segment() {
            Some("0033") | None => i64::try_from(nr)
                .ok()
                .and_then(|nr| syscall_name_for(Arch::X86_64, nr)),
            Some("0023") => None,
            Some(_) => return None,
        };
        const ARGS: [&str; 6] = ["RDI", "RSI", "RDX", "R10", "R08", "R09"];
        let args: Vec<u64> = ARGS.iter().map(|r| self.value(r).unwrap_or(0)).collect();
        let fd = name
            .filter(|n| file_arg(n) == FileArg::Fd { index: 0 })
            .and_then(|_| self.value("RDI"))
            .and_then(|v| i32::try_from(v).ok());
        let count = name
            .and_then(byte_count_arg)
            .and_then(|index| self.value(ARGS.get(index)?));
        Some(Syscall {
            name: name.map(str::to_string),
            nr: Some(nr),
            source: SyscallSource::Registers,
            args,
            fd,
            count,
        })
    }

    /// `R15` is printed last in an x86_64 register dump.
    pub fn complete(&self) -> bool {
        self.0.contains_key("R15")
    }
}

/// A hung-task report being read.
#[derive(Debug, Clone)]
pub struct ReportBuilder {
    pub time: Timestamp,
    pub comm: String,
    pub pid: u32,
    pub blocked_for_s: u64,
    pub task: Option<TaskLine>,
    pub in_trace: bool,
    pub frames: Vec<Frame>,
    pub registers: Registers,
    pub blocked_on: Option<Blocker>,
}

impl ReportBuilder {
    pub fn new(time: Timestamp, comm: String, pid: u32, blocked_for_s: u64) -> ReportBuilder {
        ReportBuilder {
            time,
            comm,
            pid,
            blocked_for_s,
            task: None,
            in_trace: false,
            frames: Vec::new(),
            registers: Registers::default(),
            blocked_on: None,
        }
    }

    pub fn finish(self) -> HungTaskReport {
        let facts = stack::analyze(&self.frames);
        let syscall = self.registers.syscall().or_else(|| {
            facts.syscall.clone().map(|name| {
                let nr = None;
                Syscall {
                    name: Some(name),
                    nr,
                    source: SyscallSource::Stack,
                    args: Vec::new(),
                    fd: None,
                    count: None,
                }
            })
        });
        let task = self.task.unwrap_or(TaskLine {
            comm: String::new(),
            state: None,
            pid: None,
            tgid: None,
            ppid: None,
        });
        HungTaskReport {
            time: self.time,
            comm: self.comm,
            pid: self.pid,
            tgid: task.tgid,
            ppid: task.ppid,
            state: task.state,
            blocked_for_s: self.blocked_for_s,
            syscall,
            filesystem: facts.filesystem,
            filesystem_frame: facts.filesystem_frame,
            frozen: facts.frozen,
            operation: facts.operation.map(str::to_string),
            wchan: facts.wchan,
            stack: stack::display_stack(&self.frames),
            blocked_on: self.blocked_on,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_with_any_seconds_and_colons_in_comm() {
        assert_eq!(
            parse_header("INFO: task python:280058 blocked for more than 120 seconds."),
            Some(("python".into(), 280058, 120))
        );
        assert_eq!(
            parse_header("INFO: task kworker/u16:2:1234 blocked for more than 245 seconds."),
            Some(("kworker/u16:2".into(), 1234, 245))
        );
        assert_eq!(
            parse_header("INFO: task python:abc blocked for more than 120 seconds."),
            None
        );
        assert_eq!(
            parse_header("INFO: task python:1 blocked for more than lots seconds."),
            None
        );
    }

    #[test]
    fn new_task_line_with_spaces_after_colons() {
        let t = parse_task_line(
            "task:epilog.sh       state:D stack:    0 pid:76609 ppid: 76603 flags:0x00000080",
        )
        .unwrap();
        assert_eq!(t.comm, "epilog.sh");
        assert_eq!(
            (t.state.as_deref(), t.pid, t.ppid, t.tgid),
            (Some("D"), Some(76609), Some(76603), None)
        );
    }

    #[test]
    fn new_task_line_with_tgid() {
        let t = parse_task_line("task:pt_autograd_0 state:D stack:0     pid:4242  tgid:4200  ppid:1 task_flags:0x400040 flags:0x00004006")
            .unwrap();
        assert_eq!(t.comm, "pt_autograd_0");
        assert_eq!((t.pid, t.tgid, t.ppid), (Some(4242), Some(4200), Some(1)));
    }

    #[test]
    fn old_task_line_forms() {
        let t =
            parse_old_task_line("python          D    0  7088      2 0x80000000", 7088).unwrap();
        assert_eq!(
            (t.comm.as_str(), t.state.as_deref(), t.ppid),
            ("python", Some("D"), Some(2))
        );
        let t = parse_old_task_line(
            "python          D ffff88103fc53680     0  7088      2 0x00000080",
            7088,
        )
        .unwrap();
        assert_eq!((t.comm.as_str(), t.state.as_deref()), ("python", Some("D")));
        let t = parse_old_task_line("my prog D 0 77 1 0x0", 77).unwrap();
        assert_eq!(t.comm, "my prog");
        assert_eq!(
            parse_old_task_line("python D 0 7088 2 0x80000000", 7089),
            None
        );
    }

    #[test]
    fn registers_name_the_call_and_its_arguments() {
        let mut regs = Registers::default();
        for line in [
            "RIP: 0033:0x14f7d0d9da07",
            "RSP: 002b:00007fff14b5a9d0 EFLAGS: 00000293 ORIG_RAX: 0000000000000001",
            "RAX: ffffffffffffffda RBX: 000000000000006c RCX: 000014f7d0d9da07",
            "RDX: 0000000000000988 RSI: 000004b15348c010 RDI: 000000000000006c",
            "R13: 000004b15348c010 R14: 000000000000006c R15: 000000000151b860",
        ] {
            regs.0.extend(parse_register_line(line).unwrap());
        }
        assert!(regs.complete());
        let call = regs.syscall().unwrap();
        assert_eq!(
            (call.name.as_deref(), call.nr, call.fd, call.count),
            (Some("write"), Some(1), Some(108), Some(2440))
        );
        assert_eq!(call.args[0], 108);
    }

    #[test]
    fn kernel_mode_registers_name_no_call() {
        let mut regs = Registers::default();
        regs.0
            .extend(parse_register_line("RIP: 0010:native_safe_halt+0xe/0x10").unwrap());
        regs.0.extend(
            parse_register_line("RSP: 0018:ffffb3c0 EFLAGS: 00000246 ORIG_RAX: ffffffffffffff13")
                .unwrap(),
        );
        assert_eq!(regs.syscall(), None);
    }

    #[test]
    fn register_lines_only() {
        assert_eq!(
            parse_register_line("Code: Unable to access opcode bytes at RIP 0x14f7d0d9d9dd."),
            None
        );
        assert_eq!(parse_register_line("RAX:"), None);
        assert_eq!(parse_register_line("nfs: server x OK"), None);
    }

    #[test]
    fn blocker_line() {
        let (pid, b) = parse_blocker(
            "INFO: task python:123 is blocked on a mutex likely owned by task python:456.",
        )
        .unwrap();
        assert_eq!(
            (pid, b.comm.as_str(), b.pid, b.lock.as_str()),
            (123, "python", 456, "mutex")
        );
    }
}
