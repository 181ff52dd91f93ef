//! Kernel stack frames that say nothing of where a task waits: the scheduler's (it is asleep) and the system call
//! entry's (it is in a system call); and the wait of a pipe's writer for room. Frames are compared by their base
//! name (no offset, module or `.isra` suffix).

/// Frames that only say "asleep": the kernel's own wchan skips them too.
pub const SCHEDULER_FRAMES: &[&str] = &[
    "__switch_to",
    "__switch_to_asm",
    "context_switch",
    "__schedule",
    "schedule",
    "schedule_timeout",
    "schedule_hrtimeout",
    "schedule_hrtimeout_range",
    "schedule_hrtimeout_range_clock",
    "io_schedule",
    "io_schedule_timeout",
    "schedule_preempt_disabled",
    "preempt_schedule",
    "preempt_schedule_common",
    "_cond_resched",
    "__cond_resched",
];

/// Frames of the way into the kernel (system call entry, a new task's first return), on x86_64 and arm64.
pub const ENTRY_FRAMES: &[&str] = &[
    "do_syscall_64",
    "entry_SYSCALL_64_after_hwframe",
    "el0_svc",
    "el0_svc_common",
    "el0t_64_sync",
    "el0t_64_sync_handler",
    "invoke_syscall",
    "ret_from_fork",
    "ret_from_fork_asm",
];

/// Whether a frame only says "asleep".
pub fn is_scheduler_frame(function: &str) -> bool {
    SCHEDULER_FRAMES.contains(&function)
}

/// Whether a frame only says "in a system call" (or "a new task").
pub fn is_entry_frame(function: &str) -> bool {
    ENTRY_FRAMES.contains(&function)
}

/// Whether a wait channel or frame is a pipe's (or FIFO's) writer waiting for its reader to make room:
/// `pipe_write`, `anon_pipe_write` (Linux 6.x), `pipe_wait_writable`.
pub fn is_pipe_write_wait(frame: &str) -> bool {
    frame.contains("pipe_write") || frame.contains("pipe_wait_writable")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_writer_waiting_for_room_is_told_from_other_waits() {
        for wait in ["pipe_write", "anon_pipe_write", "pipe_wait_writable"] {
            assert!(is_pipe_write_wait(wait), "{wait}");
        }
        for other in [
            "pipe_read",
            "wait_woken",
            "percpu_rwsem_wait",
            "futex_wait_queue",
        ] {
            assert!(!is_pipe_write_wait(other), "{other}");
        }
    }

    #[test]
    fn scheduler_and_entry_frames_are_told_apart() {
        assert!(is_scheduler_frame("__schedule") && is_scheduler_frame("io_schedule"));
        assert!(!is_scheduler_frame("percpu_rwsem_wait"));
        assert!(is_entry_frame("do_syscall_64") && is_entry_frame("el0_svc"));
        assert!(!is_entry_frame("ksys_write") && !is_entry_frame("schedule"));
    }
}
