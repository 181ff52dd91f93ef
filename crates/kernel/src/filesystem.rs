//! Filesystems as kernel stacks and mount tables show them: the modules and function-name prefixes of each
//! filesystem, the frames of any wait on storage, the waits of a writer on a frozen filesystem, and the
//! filesystem types that hold no stored data.
//!
//! A filesystem is named by its key, the name hangwatch's JSON gives it (`gpfs`, `nfs`, `9p`: the wire type is
//! `hangwatch_model::kernel_log::Filesystem`).

/// Kernel modules of each filesystem: `(module, filesystem key)`.
pub const MODULES: &[(&str, &str)] = &[
    ("mmfs26", "gpfs"),
    ("mmfslinux", "gpfs"),
    ("tracedev", "gpfs"),
    ("lustre", "lustre"),
    ("llite", "lustre"),
    ("ptlrpc", "lustre"),
    ("lov", "lustre"),
    ("osc", "lustre"),
    ("mdc", "lustre"),
    ("lmv", "lustre"),
    ("obdclass", "lustre"),
    ("lnet", "lustre"),
    ("ko2iblnd", "lustre"),
    ("ksocklnd", "lustre"),
    ("mgc", "lustre"),
    ("fid", "lustre"),
    ("fld", "lustre"),
    ("libcfs", "lustre"),
    ("nfs", "nfs"),
    ("nfsv3", "nfs"),
    ("nfsv4", "nfs"),
    ("sunrpc", "nfs"),
    ("lockd", "nfs"),
    ("nfsd", "nfs"),
    ("rpcsec_gss_krb5", "nfs"),
    ("fuse", "fuse"),
    ("ext4", "ext4"),
    ("jbd2", "ext4"),
    ("xfs", "xfs"),
    ("btrfs", "btrfs"),
    ("overlay", "overlay"),
    ("ceph", "ceph"),
    ("libceph", "ceph"),
    ("cifs", "cifs"),
    ("smb3", "cifs"),
    ("9p", "9p"),
    ("9pnet", "9p"),
    ("9pnet_virtio", "9p"),
    ("beegfs", "beegfs"),
    ("zfs", "zfs"),
    ("spl", "zfs"),
    ("wekafs", "weka"),
    ("autofs4", "autofs"),
    ("autofs", "autofs"),
];

/// Function-name prefixes of each filesystem's code: `(prefix, filesystem key)`.
pub const FUNCTION_PREFIXES: &[(&str, &str)] = &[
    ("gpfs_", "gpfs"),
    ("mmfs", "gpfs"),
    ("cxiWaitEvent", "gpfs"),
    ("ll_", "lustre"),
    ("ptlrpc_", "lustre"),
    ("ldlm_", "lustre"),
    ("cl_sync_io_wait", "lustre"),
    ("nfs_", "nfs"),
    ("nfs4_", "nfs"),
    ("nfs3_", "nfs"),
    ("rpc_", "nfs"),
    ("__rpc_", "nfs"),
    ("request_wait_answer", "fuse"),
    ("fuse_", "fuse"),
    ("ext4_", "ext4"),
    ("jbd2_", "ext4"),
    ("__jbd2_", "ext4"),
    ("xfs_", "xfs"),
    ("xlog_", "xfs"),
    ("btrfs_", "btrfs"),
    ("ovl_", "overlay"),
    ("ceph_", "ceph"),
    ("cifs_", "cifs"),
    ("smb2_", "cifs"),
    ("v9fs_", "9p"),
    ("p9_", "9p"),
    ("FhgfsOps", "beegfs"),
    ("zpl_", "zfs"),
    ("zfs_", "zfs"),
    ("autofs_", "autofs"),
];

/// Frames of a wait on storage whichever filesystem it is: the page cache, the block layer, the locks
/// filesystems take.
pub const STORAGE_WAITS: &[&str] = &[
    "io_schedule",
    "folio_wait",
    "wait_on_page",
    "__lock_page",
    "rwsem_down_",
    "blk_mq_",
    "wait_on_bit",
    "ll_rw_block",
];

/// Frames of a writer waiting for a frozen filesystem (`fsfreeze`, a snapshot): the superblock's per-CPU
/// rw-semaphore and the calls that take it. Such a wait names no file.
pub const FREEZE_WAITS: &[&str] = &[
    "percpu_rwsem_wait",
    "__percpu_down_read",
    "percpu_down_read",
    "__sb_start_write",
    "sb_start_write",
    "sb_start_pagefault",
    "sb_start_intwrite",
    "mnt_want_write",
];

/// The filesystem a kernel module belongs to.
pub fn of_module(module: &str) -> Option<&'static str> {
    MODULES
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, fs)| *fs)
}

/// The filesystem a kernel function (base name) belongs to. `ll_rw_block` is the block layer's, not Lustre's.
pub fn of_function(function: &str) -> Option<&'static str> {
    if function == "ll_rw_block" {
        return None;
    }
    FUNCTION_PREFIXES
        .iter()
        .find(|(prefix, _)| function.starts_with(prefix))
        .map(|(_, fs)| *fs)
}

/// Every name prefix that means "waiting for a filesystem or the block layer to answer".
pub fn wait_prefixes() -> impl Iterator<Item = &'static str> {
    STORAGE_WAITS
        .iter()
        .chain(FREEZE_WAITS)
        .copied()
        .chain(FUNCTION_PREFIXES.iter().map(|(prefix, _)| *prefix))
}

/// Whether a kernel function (a wchan, a frame's base name) is a filesystem or block-layer wait.
pub fn is_wait_function(function: &str) -> bool {
    wait_prefixes().any(|prefix| function.starts_with(prefix))
}

/// Whether a kernel function (a wchan, a stack frame with its module tag) is a filesystem wait: by name prefix,
/// or by a filesystem module tag (`[mmfs26]`, `[lustre]`, `[nfs]`, `[fuse]`).
pub fn is_wait_frame(frame: &str) -> bool {
    let module = frame
        .split_once(" [")
        .and_then(|(_, tag)| tag.split([']', ' ']).next());
    is_wait_function(frame) || module.and_then(of_module).is_some()
}

/// Whether a frame (base name) is one of a writer waiting for a frozen filesystem.
pub fn is_freeze_wait(function: &str) -> bool {
    FREEZE_WAITS.contains(&function)
}

/// Filesystem types that are views of the kernel itself and hold no stored data: /proc, /sys, cgroups, device
/// nodes, and the kernel's internal mounts behind sockets, pipes and anonymous inodes.
pub const VIRTUAL_FSTYPES: &[&str] = &[
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "devtmpfs",
    "mqueue",
    "debugfs",
    "tracefs",
    "securityfs",
    "pstore",
    "bpf",
    "configfs",
    "fusectl",
    "binfmt_misc",
    "efivarfs",
    "nsfs",
    "rpc_pipefs",
    "selinuxfs",
    "sockfs",
    "pipefs",
    "anon_inodefs",
];

/// Filesystem types kept in memory: their files are real, but no storage answers for them.
pub const MEMORY_FSTYPES: &[&str] = &["tmpfs", "ramfs", "hugetlbfs"];

/// Whether a filesystem type is a view of the kernel (see [`VIRTUAL_FSTYPES`]).
pub fn is_virtual_fstype(fstype: &str) -> bool {
    VIRTUAL_FSTYPES.contains(&fstype)
}

/// Whether a filesystem type holds no data a job could wait on storage for: kernel views, memory-backed ones,
/// and `autofs`, whose mount points only trigger the real mounts.
pub fn is_pseudo_fstype(fstype: &str) -> bool {
    is_virtual_fstype(fstype) || MEMORY_FSTYPES.contains(&fstype) || fstype == "autofs"
}

/// Filesystem types served over the network, whose mount source names the same filesystem on every node
/// (`server:/export`, a GPFS or Lustre filesystem's name).
pub const NETWORK_FSTYPES: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "lustre",
    "gpfs",
    "beegfs",
    "ceph",
    "glusterfs",
    "9p",
    "pvfs2",
    "orangefs",
    "wekafs",
    "afs",
    "davfs",
];

/// Whether a filesystem type is served by a user-space daemon (FUSE): its source is whatever the daemon chose.
pub fn is_fuse_fstype(fstype: &str) -> bool {
    fstype == "fuse" || fstype.starts_with("fuse.") || fstype == "fuseblk"
}

/// Whether a filesystem type is served over the network (see [`NETWORK_FSTYPES`]); FUSE is not.
pub fn is_network_fstype(fstype: &str) -> bool {
    NETWORK_FSTYPES.contains(&fstype)
}

/// Whether a filesystem can stop answering while the node is fine: network filesystems and FUSE. hangwatch keeps
/// its evidence, spill files and its own binary off them.
pub fn is_remote_fstype(fstype: &str) -> bool {
    is_network_fstype(fstype) || is_fuse_fstype(fstype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filesystem_waits_match_by_prefix_or_module_not_substring() {
        assert!(is_wait_frame("request_wait_answer"));
        assert!(is_wait_frame("percpu_rwsem_wait"));
        assert!(is_wait_frame("cxiWaitEventWait+0x1d0/0x2c0 [mmfslinux]"));
        assert!(
            !is_wait_frame("poll_schedule_timeout.constprop.0"),
            "`ll_` is Lustre only as a prefix"
        );
        assert!(!is_wait_frame("do_wait"));
        assert!(!is_wait_frame("futex_wait_queue"));
    }

    #[test]
    fn modules_and_functions_name_their_filesystem() {
        assert_eq!(of_module("mmfs26"), Some("gpfs"));
        assert_eq!(of_module("ptlrpc"), Some("lustre"));
        assert_eq!(of_module("nvidia"), None);
        assert_eq!(of_function("rpc_wait_bit_killable"), Some("nfs"));
        assert_eq!(of_function("request_wait_answer"), Some("fuse"));
        assert_eq!(of_function("ll_file_write_iter"), Some("lustre"));
        assert_eq!(of_function("ll_rw_block"), None);
        assert_eq!(of_function("vfs_write"), None);
    }

    #[test]
    fn waits_on_storage() {
        assert!(is_wait_function("request_wait_answer"));
        assert!(is_wait_function("percpu_rwsem_wait"));
        assert!(is_wait_function("folio_wait_bit_common"));
        assert!(is_wait_function("ll_rw_block"));
        assert!(!is_wait_function("poll_schedule_timeout.constprop.0"));
        assert!(!is_wait_function("futex_wait_queue"));
        assert!(is_freeze_wait("__sb_start_write") && !is_freeze_wait("sb_start"));
    }

    #[test]
    fn each_module_and_prefix_is_listed_once() {
        let mut modules: Vec<_> = MODULES.iter().map(|(m, _)| *m).collect();
        modules.sort_unstable();
        modules.dedup();
        assert_eq!(modules.len(), MODULES.len());
        let mut prefixes: Vec<_> = FUNCTION_PREFIXES.iter().map(|(p, _)| *p).collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        assert_eq!(prefixes.len(), FUNCTION_PREFIXES.len());
    }

    #[test]
    fn pseudo_filesystems_hold_no_storage() {
        for fstype in ["proc", "sysfs", "cgroup2", "tmpfs", "autofs", "sockfs"] {
            assert!(is_pseudo_fstype(fstype), "{fstype}");
        }
        assert!(!is_virtual_fstype("tmpfs") && !is_virtual_fstype("autofs"));
        for fstype in ["ext4", "nfs4", "fuse.sshfs", "lustre"] {
            assert!(!is_pseudo_fstype(fstype), "{fstype}");
        }
    }
}
