//! From a syscall's fd to a [`FileRef`] (path, mount point, filesystem type, source), over data already read:
//! the fd link, the fd's `mnt_id` and the mount table. Nothing here touches the file's filesystem.

use hangwatch_model::FileRef;

use crate::mountinfo::{Mount, MountTable};

/// What a system call's file argument points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileTarget {
    /// An open file descriptor.
    Fd(i32),
    /// The current directory (`AT_FDCWD`, or a call that takes a relative path and no fd).
    Cwd,
}

/// Builds the [`FileRef`] of a link target (`readlink` of `fd/N` or `cwd`).
///
/// The mount comes from `mnt_id` when the kernel gave one: exact, even for a file whose mount point was later
/// covered by another mount. When `mnt_id` is absent (the current directory, old kernels, an fdinfo that could
/// not be read), an absolute path falls back to the longest mount-point prefix, which is what `df` does.
/// A `mnt_id` missing from the table (pipes, sockets, anonymous inodes live on internal mounts) gives no mount.
pub fn resolve_file_ref(link: &str, mnt_id: Option<u32>, mounts: Option<&MountTable>) -> FileRef {
    let mount: Option<&Mount> = mounts.and_then(|table| match mnt_id {
        Some(id) => table.by_id(id),
        None => table.containing(link.strip_suffix(" (deleted)").unwrap_or(link)),
    });
    FileRef {
        path: link.to_owned(),
        mount: mount.map(|m| m.mount_point.clone()),
        fstype: mount.map(|m| m.fstype.clone()),
        source: mount.map(|m| m.source.clone()),
        // Needs hangwatch's own mount table too: see `filesystem_id`.
        filesystem: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mountinfo::parse_mountinfo;

    fn table() -> MountTable {
        parse_mountinfo(
            "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 7:0 / /shared rw,relatime - ext4 /dev/loop0 rw
41 27 0:60 / /shared rw,relatime - nfs4 server:/export rw
",
        )
        .unwrap()
    }

    #[test]
    fn mnt_id_names_the_mount_even_when_covered() {
        let file = resolve_file_ref("/shared/log.txt", Some(40), Some(&table()));
        assert_eq!(
            file,
            FileRef {
                filesystem: None,
                path: "/shared/log.txt".into(),
                mount: Some("/shared".into()),
                fstype: Some("ext4".into()),
                source: Some("/dev/loop0".into()),
            }
        );
    }

    #[test]
    fn without_mnt_id_the_visible_mount_is_used() {
        let file = resolve_file_ref("/shared/run", None, Some(&table()));
        assert_eq!(file.fstype.as_deref(), Some("nfs4"));
        assert_eq!(file.source.as_deref(), Some("server:/export"));
    }

    #[test]
    fn deleted_file_keeps_its_link_text() {
        let file = resolve_file_ref("/shared/old.log (deleted)", None, Some(&table()));
        assert_eq!(file.path, "/shared/old.log (deleted)");
        assert_eq!(file.mount.as_deref(), Some("/shared"));
    }

    #[test]
    fn pipes_and_sockets_have_no_mount() {
        let file = resolve_file_ref("pipe:[10047]", Some(16), Some(&table()));
        assert_eq!(file.path, "pipe:[10047]");
        assert_eq!((file.mount, file.fstype, file.source), (None, None, None));
        let file = resolve_file_ref("socket:[1234]", None, Some(&table()));
        assert_eq!(file.mount, None);
    }

    #[test]
    fn no_mount_table() {
        let file = resolve_file_ref("/shared/log.txt", Some(40), None);
        assert_eq!(file.path, "/shared/log.txt");
        assert_eq!(file.mount, None);
    }
}
