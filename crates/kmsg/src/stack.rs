//! Kernel stack frames as hung-task reports print them, and what a stack says: the filesystem it waits on, the
//! VFS operation, the first frame outside the scheduler (the `wchan`), and whether it waits for a frozen filesystem.

use hangwatch_kernel::filesystem;
use hangwatch_kernel::frames::is_scheduler_frame;
use hangwatch_model::kernel_log::Filesystem;
use serde::{Deserialize, Serialize};

/// One line of a `Call Trace:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// Symbol as printed, without offset (`path_lookupat.isra.47`, `_Z9gpfsWrite...`).
    pub function: String,
    /// Module in brackets after the symbol (`mmfs26`), when not built into the kernel.
    pub module: Option<String>,
    /// `false` for frames printed with `?`: return addresses found on the stack that the unwinder could not
    /// confirm; often left over from earlier calls.
    pub reliable: bool,
}

impl Frame {
    /// `gpfs_f_rdwr_iter [mmfslinux]`
    pub fn display(&self) -> String {
        match &self.module {
            Some(m) => format!("{} [{m}]", self.function),
            None => self.function.clone(),
        }
    }

    /// A frame as [`Frame::display`] wrote it (`function`, `function [module]`), as /proc/PID/task/TID/stack is
    /// kept in observations.
    pub fn from_display(text: &str) -> Frame {
        let text = text.trim();
        let (function, module) = match text.split_once(" [") {
            Some((f, m)) => (f, m.strip_suffix(']').map(str::to_string)),
            None => (text, None),
        };
        Frame {
            function: function.to_string(),
            module,
            reliable: true,
        }
    }

    /// The symbol without compiler suffixes (`.isra.47`, `.part.61`, `.cold`, `.constprop.0`).
    pub fn base(&self) -> &str {
        self.function.split('.').next().unwrap_or(&self.function)
    }
}

/// Parses ` ? gpfs_f_rdwr_iter+0x217/0x300 [mmfslinux]`, ` [<ffffffff8168b579>] schedule+0x29/0x70` and
/// arm64's ` __switch_to+0x104/0x170`. `None` for anything else.
pub fn parse_frame(text: &str) -> Option<Frame> {
    let mut rest = text.trim_start();
    if let Some(after) = rest.strip_prefix("[<") {
        let (addr, after) = after.split_once(">]")?;
        if addr.is_empty() || !addr.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        rest = after.trim_start();
    }
    let mut reliable = true;
    if let Some(after) = rest.strip_prefix("? ") {
        reliable = false;
        rest = after.trim_start();
    }
    let (symbol, after) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let (function, offset) = symbol.split_once('+')?;
    let (off, size) = offset.split_once('/')?;
    if !is_hex_number(off) || !is_hex_number(size) {
        return None;
    }
    if function.is_empty()
        || !function
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'$'))
    {
        return None;
    }
    let after = after.trim();
    let module = after
        .strip_prefix('[')
        .and_then(|m| m.split([' ', ']']).next())
        .filter(|m| {
            !m.is_empty()
                && m.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-'))
        })
        .map(str::to_string);
    Some(Frame {
        function: function.to_string(),
        module,
        reliable,
    })
}

fn is_hex_number(s: &str) -> bool {
    s.strip_prefix("0x")
        .is_some_and(|h| !h.is_empty() && h.bytes().all(|c| c.is_ascii_hexdigit()))
}

/// `<TASK>`, `</TASK>`, `<IRQ>`, `<EOI>`, `<NMI>`: section markers inside traces.
pub fn is_trace_marker(text: &str) -> bool {
    let t = text.trim();
    let inner = t
        .strip_prefix("</")
        .or_else(|| t.strip_prefix('<'))
        .and_then(|r| r.strip_suffix('>'));
    inner
        .is_some_and(|i| !i.is_empty() && i.len() <= 8 && i.bytes().all(|c| c.is_ascii_uppercase()))
}

/// The filesystem a single frame belongs to.
pub fn filesystem_of_frame(frame: &Frame) -> Option<Filesystem> {
    if let Some(module) = frame.module.as_deref() {
        if let Some(fs) = filesystem::of_module(module).and_then(Filesystem::from_key) {
            return Some(fs);
        }
    }
    filesystem::of_function(frame.base()).and_then(Filesystem::from_key)
}

/// What a stack says about where and why a task waits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StackFacts {
    pub filesystem: Option<Filesystem>,
    /// The frame that named the filesystem (innermost match).
    pub filesystem_frame: Option<String>,
    /// Waiting for a frozen filesystem (`fsfreeze`): a per-CPU rw-semaphore wait on the write path.
    pub frozen: bool,
    /// VFS operation under way (`write`, `lookup`, `fsync`, `page fault`...), from generic kernel frames.
    pub operation: Option<&'static str>,
    /// First reliable frame outside the scheduler: what `/proc/PID/wchan` would have shown.
    pub wchan: Option<String>,
    /// The system call named by the outermost syscall entry frame.
    pub syscall: Option<String>,
}

fn operation_of(f: &str) -> Option<&'static str> {
    let op = match f {
        "__lookup_slow" | "lookup_slow" | "walk_component" | "link_path_walk" | "path_lookupat"
        | "d_alloc_parallel" | "filename_lookup" => "lookup",
        "path_openat" | "do_filp_open" | "lookup_open" | "do_last" | "vfs_open"
        | "do_dentry_open" | "open_last_lookups" => "open",
        "new_sync_write"
        | "vfs_write"
        | "__vfs_write"
        | "generic_perform_write"
        | "vfs_writev"
        | "do_iter_write"
        | "__generic_file_write_iter"
        | "generic_file_write_iter"
        | "do_iter_readv_writev" => "write",
        "new_sync_read"
        | "vfs_read"
        | "__vfs_read"
        | "filemap_read"
        | "generic_file_read_iter"
        | "vfs_readv"
        | "do_iter_read"
        | "generic_file_buffered_read" => "read",
        "filemap_fault"
        | "__do_fault"
        | "do_read_fault"
        | "do_shared_fault"
        | "do_cow_fault"
        | "do_page_mkwrite"
        | "do_wp_page"
        | "wp_page_shared"
        | "asm_exc_page_fault"
        | "do_fault"
        | "handle_mm_fault"
        | "__handle_mm_fault"
        | "do_page_fault"
        | "exc_page_fault"
        | "__do_page_fault"
        | "do_user_addr_fault"
        | "do_mem_abort"
        | "do_translation_fault" => "page fault",
        "vfs_fsync_range" | "do_fsync" | "vfs_fsync" | "file_write_and_wait_range" => "fsync",
        "iterate_dir" => "readdir",
        "vfs_getattr" | "vfs_getattr_nosec" | "vfs_statx" => "getattr",
        "vfs_statfs" | "user_statfs" | "fd_statfs" => "statfs",
        "filp_close" | "__fput" | "____fput" => "close",
        "vfs_unlink" | "do_unlinkat" => "unlink",
        "vfs_rmdir" | "do_rmdir" => "rmdir",
        "vfs_rename" | "do_renameat2" => "rename",
        "vfs_mkdir" | "do_mkdirat" => "mkdir",
        "vfs_create" => "create",
        "do_truncate" | "vfs_truncate" => "truncate",
        "notify_change" => "setattr",
        "vfs_fallocate" => "fallocate",
        "sync_filesystem" | "ksys_sync" => "sync",
        "wb_writeback" | "writeback_sb_inodes" | "wb_workfn" => "writeback",
        "jbd2_journal_commit_transaction" => "journal commit",
        "do_mount" | "path_mount" => "mount",
        "submit_bio_wait" | "blk_mq_get_tag" | "blkdev_issue_flush" => "block I/O",
        _ => return None,
    };
    Some(op)
}

fn is_modifying(f: &str) -> bool {
    f.contains("sb_start")
        || f.contains("write")
        || f.contains("mnt_want_write")
        || f.contains("page_mkwrite")
        || f.contains("fallocate")
        || f.contains("truncate")
        || f.contains("unlink")
        || f.contains("rename")
        || f.contains("mkdir")
        || f.contains("setattr")
        || f.contains("create")
}

/// Reads a stack, innermost frame first as the kernel prints it.
pub fn analyze(frames: &[Frame]) -> StackFacts {
    let reliable: Vec<&Frame> = frames.iter().filter(|f| f.reliable).collect();
    let chosen: Vec<&Frame> = if reliable.is_empty() {
        frames.iter().collect()
    } else {
        reliable
    };
    let mut facts = StackFacts::default();
    if let Some((frame, fs)) = chosen
        .iter()
        .find_map(|f| filesystem_of_frame(f).map(|fs| (f, fs)))
    {
        facts.filesystem = Some(fs);
        facts.filesystem_frame = Some(frame.display());
    }
    facts.operation = chosen.iter().find_map(|f| operation_of(f.base()));
    facts.wchan = chosen
        .iter()
        .find(|f| !is_scheduler_frame(f.base()))
        .map(|f| f.display());
    facts.syscall = chosen
        .iter()
        .rev()
        .find_map(|f| hangwatch_kernel::syscall::from_entry_frame(f.base()));
    let freeze_wait = chosen.iter().any(|f| filesystem::is_freeze_wait(f.base()));
    let cgroup = chosen.iter().any(|f| f.base().contains("cgroup"));
    facts.frozen = freeze_wait && !cgroup && chosen.iter().any(|f| is_modifying(f.base()));
    facts
}

/// How a stack in a page fault touches the mapped file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultAccess {
    Read,
    /// A store into a shared file mapping (`page_mkwrite`): it waits for the filesystem to take a write.
    Write,
}

/// Whether a stack (innermost first) is a page fault, and which way: the first VFS operation it shows is a fault
/// (a fault inside a system call, copying from a mapped file, counts).
pub fn page_fault(frames: &[Frame]) -> Option<FaultAccess> {
    if analyze(frames).operation != Some("page fault") {
        return None;
    }
    let writes = frames.iter().any(|f| {
        let b = f.base();
        b.contains("page_mkwrite")
            || matches!(
                b,
                "do_wp_page" | "wp_page_shared" | "do_shared_fault" | "sb_start_pagefault"
            )
    });
    Some(if writes {
        FaultAccess::Write
    } else {
        FaultAccess::Read
    })
}

/// The frames people read: reliable ones, `function [module]`, consecutive repeats removed.
pub fn display_stack(frames: &[Frame]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for frame in frames.iter().filter(|f| f.reliable) {
        let text = frame.display();
        if out.last() != Some(&text) {
            out.push(text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(lines: &[&str]) -> Vec<Frame> {
        lines
            .iter()
            .map(|l| parse_frame(l).unwrap_or_else(|| panic!("not a frame: {l}")))
            .collect()
    }

    #[test]
    fn frame_forms() {
        let f = parse_frame(" ? gpfs_f_rdwr_iter+0x217/0x300 [mmfslinux]").unwrap();
        assert_eq!(
            (f.function.as_str(), f.module.as_deref(), f.reliable),
            ("gpfs_f_rdwr_iter", Some("mmfslinux"), false)
        );
        let f = parse_frame(" [<ffffffff8168b579>] schedule+0x29/0x70").unwrap();
        assert_eq!(
            (f.function.as_str(), f.module, f.reliable),
            ("schedule", None, true)
        );
        let f =
            parse_frame(" [<ffffffffa0556c3d>] ? nfs_wait_bit_killable+0x3d/0x60 [nfs]").unwrap();
        assert_eq!(
            (f.function.as_str(), f.module.as_deref(), f.reliable),
            ("nfs_wait_bit_killable", Some("nfs"), false)
        );
        let f = parse_frame(" nfs_wait+0x10/0x20 [nfs 3f2a9c1b]").unwrap();
        assert_eq!(f.module.as_deref(), Some("nfs"));
        assert_eq!(
            parse_frame(" path_lookupat.isra.47+0x97/0x210")
                .unwrap()
                .base(),
            "path_lookupat"
        );
        assert_eq!(parse_frame("RIP: 0033:0x14f7d0d9da07"), None);
        assert_eq!(parse_frame("Call Trace:"), None);
        assert_eq!(parse_frame("foo+bar/baz"), None);
        assert!(
            is_trace_marker(" <TASK>") && is_trace_marker(" </TASK>") && !is_trace_marker("<ffff>")
        );
    }

    #[test]
    fn gpfs_write_stack() {
        let facts = analyze(&frames(&[
            " __schedule+0x2d1/0x860",
            " ? try_to_wake_up+0x1b4/0x4e0",
            " schedule+0x35/0xa0",
            " cxiWaitEventWait+0x208/0x330 [mmfslinux]",
            " _ZN6ThCond5kWaitEiPKc+0x1d3/0x410 [mmfs26]",
            " gpfs_f_rdwr_iter+0x217/0x300 [mmfslinux]",
            " new_sync_write+0x112/0x160",
            " vfs_write+0xa5/0x1b0",
            " ksys_write+0x4f/0xb0",
            " do_syscall_64+0x5b/0x1b0",
        ]));
        assert_eq!(facts.filesystem, Some(Filesystem::Gpfs));
        assert_eq!(
            facts.filesystem_frame.as_deref(),
            Some("cxiWaitEventWait [mmfslinux]")
        );
        assert_eq!(facts.wchan.as_deref(), Some("cxiWaitEventWait [mmfslinux]"));
        assert_eq!(facts.operation, Some("write"));
        assert_eq!(facts.syscall.as_deref(), Some("write"));
        assert!(!facts.frozen);
    }

    #[test]
    fn frozen_ext4_write_on_a_recent_kernel() {
        let facts = analyze(&frames(&[
            " __schedule+0x2cb/0x750",
            " schedule+0x63/0x110",
            " percpu_rwsem_wait+0x10f/0x140",
            " ? __pfx_percpu_rwsem_wake_function+0x10/0x10",
            " __percpu_down_read+0x7c/0x90",
            " ext4_buffered_write_iter+0x1a4/0x1b0",
            " vfs_write+0x239/0x400",
            " ksys_write+0x6f/0xf0",
        ]));
        assert!(facts.frozen);
        assert_eq!(facts.filesystem, Some(Filesystem::Ext4));
        assert_eq!(facts.wchan.as_deref(), Some("percpu_rwsem_wait"));
    }

    #[test]
    fn frozen_on_an_older_kernel_via_sb_start_write() {
        let facts = analyze(&frames(&[
            " __schedule+0x2d1/0x860",
            " schedule+0x35/0xa0",
            " percpu_rwsem_wait+0xb1/0xe0",
            " __percpu_down_read+0x4e/0x60",
            " __sb_start_write+0x6a/0x70",
            " mnt_want_write+0x20/0x50",
            " do_unlinkat+0x80/0x300",
        ]));
        assert!(facts.frozen);
        assert_eq!(facts.filesystem, None);
        assert_eq!(facts.syscall.as_deref(), Some("unlinkat"));
    }

    #[test]
    fn cgroup_rwsem_is_not_a_freeze() {
        let facts = analyze(&frames(&[
            " percpu_rwsem_wait+0xb1/0xe0",
            " percpu_down_write+0x20/0x50",
            " cgroup_procs_write_start+0x30/0x100",
            " cgroup_procs_write+0x10/0x40",
        ]));
        assert!(!facts.frozen);
    }

    #[test]
    fn other_filesystems() {
        let fs = |lines: &[&str]| analyze(&frames(lines)).filesystem;
        assert_eq!(
            fs(&[
                " rpc_wait_bit_killable+0x1e/0x90",
                " __rpc_execute+0x10/0x20"
            ]),
            Some(Filesystem::Nfs)
        );
        assert_eq!(
            fs(&[" ptlrpc_set_wait+0x4d8/0x7b0 [ptlrpc]"]),
            Some(Filesystem::Lustre)
        );
        assert_eq!(
            fs(&[" ll_file_write_iter+0x10/0x20"]),
            Some(Filesystem::Lustre)
        );
        assert_eq!(
            fs(&[
                " request_wait_answer+0x12d/0x230",
                " fuse_simple_request+0x1/0x2"
            ]),
            Some(Filesystem::Fuse)
        );
        assert_eq!(
            fs(&[" xfs_log_force_seq+0x1/0x2 [xfs]"]),
            Some(Filesystem::Xfs)
        );
        assert_eq!(
            fs(&[" jbd2_log_wait_commit+0x1/0x2"]),
            Some(Filesystem::Ext4)
        );
        assert_eq!(
            fs(&[" ceph_mdsc_do_request+0x1/0x2 [ceph]"]),
            Some(Filesystem::Ceph)
        );
        assert_eq!(
            fs(&[" ovl_write_iter+0x1/0x2 [overlay]"]),
            Some(Filesystem::Overlay)
        );
        assert_eq!(fs(&[" ll_rw_block+0x1/0x2"]), None);
    }

    #[test]
    fn unreliable_frames_are_used_only_when_nothing_else_is_known() {
        assert_eq!(
            analyze(&frames(&[" ? nfs_wait_bit_killable+0x1/0x2 [nfs]"])).filesystem,
            Some(Filesystem::Nfs)
        );
        let mixed = frames(&[
            " ? cxiUiomove+0x1/0x2 [mmfslinux]",
            " schedule+0x1/0x2",
            " ext4_file_write_iter+0x1/0x2",
        ]);
        assert_eq!(analyze(&mixed).filesystem, Some(Filesystem::Ext4));
    }

    #[test]
    fn display_stack_keeps_reliable_frames_once() {
        let shown = display_stack(&frames(&[
            " schedule+0x1/0x2",
            " ? foo+0x1/0x2",
            " bar+0x1/0x2 [m]",
            " bar+0x3/0x4 [m]",
        ]));
        assert_eq!(shown, ["schedule", "bar [m]"]);
    }

    fn stored(lines: &[&str]) -> Vec<Frame> {
        lines.iter().map(|l| Frame::from_display(l)).collect()
    }

    #[test]
    fn a_read_fault_on_fuse_and_a_write_fault_on_a_frozen_ext4() {
        let fuse = stored(&[
            "request_wait_answer [fuse]",
            "fuse_simple_request [fuse]",
            "fuse_read_folio [fuse]",
            "filemap_read_folio",
            "filemap_fault",
            "__do_fault",
            "do_read_fault",
            "handle_mm_fault",
            "do_user_addr_fault",
            "exc_page_fault",
            "asm_exc_page_fault",
        ]);
        assert_eq!(page_fault(&fuse), Some(FaultAccess::Read));
        assert_eq!(analyze(&fuse).filesystem, Some(Filesystem::Fuse));
        let locked = stored(&[
            "folio_wait_bit_common",
            "filemap_fault",
            "__do_fault",
            "exc_page_fault",
        ]);
        assert_eq!(page_fault(&locked), Some(FaultAccess::Read));
        assert_eq!(analyze(&locked).filesystem, None, "no filesystem named");
        let frozen = stored(&[
            "percpu_rwsem_wait",
            "__percpu_down_read",
            "ext4_page_mkwrite",
            "do_page_mkwrite",
            "do_shared_fault",
            "handle_mm_fault",
            "exc_page_fault",
        ]);
        assert_eq!(page_fault(&frozen), Some(FaultAccess::Write));
        let write_call = stored(&[
            "request_wait_answer [fuse]",
            "fuse_perform_write [fuse]",
            "vfs_write",
            "ksys_write",
            "do_syscall_64",
        ]);
        assert_eq!(page_fault(&write_call), None, "a write() is no fault");
    }

    #[test]
    fn every_filesystem_key_of_the_kernel_tables_is_a_filesystem() {
        let keys = filesystem::MODULES
            .iter()
            .chain(filesystem::FUNCTION_PREFIXES)
            .map(|(_, key)| *key);
        for key in keys {
            assert!(Filesystem::from_key(key).is_some(), "{key}");
        }
    }

    #[test]
    fn frames_read_back_from_their_display() {
        let f = Frame::from_display("gpfs_f_rdwr_iter [mmfslinux]");
        assert_eq!(
            (f.function.as_str(), f.module.as_deref()),
            ("gpfs_f_rdwr_iter", Some("mmfslinux"))
        );
    }
}
