//! Which filesystem a mount is, across mount namespaces: a rank in a container sees the shared filesystem at the
//! container's path, hangwatch (the node service, a `run` outside the container) at the node's. Both mount
//! tables are read from /proc and never block; nothing here touches a filesystem.

use hangwatch_model::FilesystemId;

use crate::mountinfo::{Mount, MountTable};

/// The identity of `mount` (a line of a rank's mount table), with where `own` (hangwatch's own mount table) has
/// the same filesystem. `other_namespace`: the rank's mount namespace is not hangwatch's.
pub fn filesystem_id(
    mount: &Mount,
    own: Option<&MountTable>,
    other_namespace: bool,
) -> FilesystemId {
    let device = format!("{}:{}", mount.major, mount.minor);
    let same_fs: Vec<&Mount> = own
        .map(|t| {
            t.mounts
                .iter()
                .filter(|m| m.major == mount.major && m.minor == mount.minor)
                .collect()
        })
        .unwrap_or_default();
    // The node's whole mount of the filesystem (the shortest root, `/` normally) names it; the mount whose root
    // holds the rank's directory most closely says where that directory is on the node.
    let whole = same_fs.iter().min_by_key(|m| m.root.len()).copied();
    let holding = same_fs
        .iter()
        .filter(|m| relative_to(&mount.root, &m.root).is_some())
        .max_by_key(|m| m.root.len())
        .copied();
    let host_path = holding
        .and_then(|m| relative_to(&mount.root, &m.root).map(|rest| join(&m.mount_point, rest)));
    let host_mount = whole.map(|m| m.mount_point.clone());
    let key = if hangwatch_kernel::filesystem::is_network_fstype(&mount.fstype)
        && !mount.source.is_empty()
        && mount.source != "none"
    {
        format!("{} {}", mount.fstype, mount.source)
    } else if let Some(host) = &host_mount {
        host.clone()
    } else {
        format!("{} dev {device}", mount.fstype)
    };
    FilesystemId {
        key,
        device,
        fstype: mount.fstype.clone(),
        source: mount.source.clone(),
        root: mount.root.clone(),
        host_mount,
        host_path,
        other_namespace,
    }
}

/// The kernel's inode number of the initial pid namespace (`PROC_PID_INIT_INO`, fixed since Linux 3.8): a process
/// whose `/proc/PID/ns/pid` names another runs in a container. (`NSpid` cannot tell from inside: a container's
/// own /proc shows only its namespace's pids.)
pub const INITIAL_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Whether `link` (`readlink /proc/PID/ns/pid`) is the node's own pid namespace.
pub fn is_initial_pid_namespace(link: &str) -> bool {
    link.trim() == INITIAL_PID_NAMESPACE
}

/// `path` below `base` (both absolute, whole components), as the rest after `base`: `Some("")` when equal.
fn relative_to<'a>(path: &'a str, base: &str) -> Option<&'a str> {
    if base == "/" {
        return Some(path.trim_start_matches('/'));
    }
    let rest = path.strip_prefix(base.trim_end_matches('/'))?;
    if rest.is_empty() || rest.starts_with('/') {
        Some(rest.trim_start_matches('/'))
    } else {
        None
    }
}

fn join(dir: &str, rest: &str) -> String {
    match (dir, rest) {
        (_, "") => dir.to_string(),
        ("/", _) => format!("/{rest}"),
        _ => format!("{}/{rest}", dir.trim_end_matches('/')),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_mountinfo;

    /// The node: the root disk, a loop-mounted ext4 at /srv/shared, GPFS at /gpfs.
    fn node() -> MountTable {
        parse_mountinfo(
            "1 0 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
             40 1 7:3 / /srv/shared rw,relatime shared:20 - ext4 /dev/loop3 rw\n\
             41 1 0:60 / /gpfs rw,relatime shared:21 - gpfs gpfs1 rw\n",
        )
        .unwrap()
    }

    fn container_mount(line: &str) -> Mount {
        parse_mountinfo(line).unwrap().mounts.remove(0)
    }

    #[test]
    fn a_container_bind_of_a_directory_is_named_by_the_nodes_path() {
        let data = container_mount("300 200 7:3 /run7 /data rw,relatime - ext4 /dev/loop3 rw\n");
        let id = filesystem_id(&data, Some(&node()), true);
        assert_eq!(id.device, "7:3");
        assert_eq!(id.root, "/run7");
        assert_eq!(id.host_mount.as_deref(), Some("/srv/shared"));
        assert_eq!(id.host_path.as_deref(), Some("/srv/shared/run7"));
        assert_eq!(id.key, "/srv/shared");
        assert_eq!(
            id.host_words().as_deref(),
            Some("/srv/shared/run7 on the host")
        );
    }

    #[test]
    fn two_containers_binding_one_filesystem_at_different_paths_share_its_key() {
        let a = container_mount("300 200 7:3 / /mnt rw - ext4 /dev/loop3 rw\n");
        let b = container_mount("310 210 7:3 /jobs/b /scratch rw - ext4 /dev/loop3 rw\n");
        let own = node();
        assert_eq!(
            filesystem_id(&a, Some(&own), true).key,
            filesystem_id(&b, Some(&own), true).key
        );
        // and the node's own view of it has that key too: a rank outside a container matches
        let host = &own.mounts[1];
        assert_eq!(filesystem_id(host, Some(&own), false).key, "/srv/shared");
        assert_eq!(filesystem_id(host, Some(&own), false).host_words(), None);
    }

    #[test]
    fn a_network_filesystem_is_named_by_its_source_on_every_node() {
        let m = container_mount("300 200 0:99 /proj /work rw - gpfs gpfs1 rw\n");
        // another node: different device numbers, no mount of it outside the container
        let id = filesystem_id(&m, None, true);
        assert_eq!(id.key, "gpfs gpfs1");
        assert_eq!(id.host_path, None);
        assert_eq!(
            id.host_words().as_deref(),
            Some("gpfs gpfs1 (not mounted on the host)")
        );
        let nfs = container_mount("300 200 0:51 / /d rw - nfs4 srv:/export rw\n");
        assert_eq!(
            filesystem_id(&nfs, Some(&node()), true).key,
            "nfs4 srv:/export"
        );
    }

    #[test]
    fn a_fuse_mount_only_the_container_has_is_named_by_its_device() {
        let m = container_mount("300 200 0:77 / /mnt rw - fuse.bindfs bindfs rw\n");
        let id = filesystem_id(&m, Some(&node()), true);
        assert_eq!(id.key, "fuse.bindfs dev 0:77");
        assert_eq!(id.host_mount, None);
    }

    #[test]
    fn paths_are_compared_by_whole_components() {
        assert_eq!(relative_to("/run7", "/run"), None);
        assert_eq!(relative_to("/run/7", "/run"), Some("7"));
        assert_eq!(relative_to("/run", "/run"), Some(""));
        assert_eq!(relative_to("/x", "/"), Some("x"));
        assert_eq!(join("/", "x"), "/x");
        assert_eq!(join("/a/", "x"), "/a/x");
    }
}
