//! Parser of `/proc/PID/mountinfo` and lookups in it: which mount (point, filesystem type, source) holds a file,
//! answered from the kernel's mount table without touching the filesystem itself.

use hangwatch_kernel::filesystem::is_pseudo_fstype;
use serde::{Deserialize, Serialize};

use crate::error::ParseError;

const FILE: &str = "mountinfo";

/// One line of `mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub mount_id: u32,
    pub parent_id: u32,
    pub major: u32,
    pub minor: u32,
    /// Directory of the filesystem that forms the root of this mount (not `/` for bind mounts).
    pub root: String,
    /// Where it is mounted, relative to the process's root, with `\040`-style escapes decoded.
    pub mount_point: String,
    pub options: String,
    /// Propagation fields (`shared:1`, `master:2`), between the options and the `-` separator.
    pub optional_fields: Vec<String>,
    /// `ext4`, `nfs4`, `fuse.bindfs`, ...
    pub fstype: String,
    /// Device or server (`/dev/vda`, `server:/export`), `none` when the filesystem has none.
    pub source: String,
    pub super_options: String,
}

/// The mount table of one process (mount namespaces differ, so it is per process).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountTable {
    pub mounts: Vec<Mount>,
}

impl MountTable {
    /// The mount with this id (from `fdinfo`'s `mnt_id`). Internal mounts (pipes, sockets, anonymous inodes)
    /// are not listed, so `None` is normal for them.
    pub fn by_id(&self, mount_id: u32) -> Option<&Mount> {
        self.mounts.iter().find(|m| m.mount_id == mount_id)
    }

    /// The mount whose mount point is the longest whole-component prefix of an absolute `path`. When several
    /// mounts share that point, the last one listed is the visible one.
    pub fn containing(&self, path: &str) -> Option<&Mount> {
        if !path.starts_with('/') {
            return None;
        }
        self.mounts
            .iter()
            .filter(|m| is_under(path, &m.mount_point))
            .fold(None, |best: Option<&Mount>, m| match best {
                Some(b) if b.mount_point.len() > m.mount_point.len() => Some(b),
                _ => Some(m),
            })
    }
}

impl MountTable {
    /// Whether `path` is on a node-local filesystem by this table alone (lexically: the path itself is never
    /// touched, so a frozen mount cannot block the answer). A path no mount holds counts as local.
    pub fn is_node_local(&self, path: &str) -> bool {
        self.containing(path).is_none_or(|m| !m.is_remote())
    }

    /// The mounts a writer could be waiting on when its wait names no file (a frozen superblock): writable
    /// (`rw` for the mount and the superblock), holding data (no kernel pseudo-filesystems), each mount point
    /// once (the visible one).
    pub fn writable_data_mounts(&self) -> Vec<&Mount> {
        let mut seen = std::collections::HashSet::new();
        let mut out: Vec<&Mount> = self
            .mounts
            .iter()
            .rev()
            .filter(|m| seen.insert(m.mount_point.as_str()))
            .filter(|m| m.is_writable() && !is_pseudo_fstype(&m.fstype))
            .collect();
        out.reverse();
        out
    }
}

impl Mount {
    /// Mounted read-write, on a read-write superblock.
    pub fn is_writable(&self) -> bool {
        let rw = |opts: &str| opts.split(',').any(|o| o == "rw");
        rw(&self.options) && rw(&self.super_options)
    }

    /// Whether the filesystem is shared over the network or served by a user-space daemon (FUSE): it can stop
    /// answering while the node is fine, so hangwatch keeps its evidence, spill files and its own binary off it.
    pub fn is_remote(&self) -> bool {
        hangwatch_kernel::filesystem::is_remote_fstype(&self.fstype)
    }
}

fn is_under(path: &str, mount_point: &str) -> bool {
    if mount_point == "/" {
        return true;
    }
    let mount_point = mount_point.trim_end_matches('/');
    match path.strip_prefix(mount_point) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Parses the whole file.
pub fn parse_mountinfo(text: &str) -> Result<MountTable, ParseError> {
    let mounts = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(parse_line)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(MountTable { mounts })
}

/// Parses one line: `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`.
pub fn parse_line(line: &str) -> Result<Mount, ParseError> {
    let fields: Vec<&str> = line.split(' ').collect();
    let separator = fields
        .iter()
        .skip(6)
        .position(|f| *f == "-")
        .map(|p| p + 6)
        .ok_or(ParseError::Missing {
            file: FILE,
            field: "separator",
        })?;
    let get = |index: usize, name: &'static str| -> Result<&str, ParseError> {
        fields.get(index).copied().ok_or(ParseError::Missing {
            file: FILE,
            field: name,
        })
    };
    let device = get(2, "major:minor")?;
    let (major, minor) = device
        .split_once(':')
        .ok_or_else(|| ParseError::invalid(FILE, "major:minor", device))?;
    Ok(Mount {
        mount_id: number(get(0, "mount_id")?, "mount_id")?,
        parent_id: number(get(1, "parent_id")?, "parent_id")?,
        major: number(major, "major")?,
        minor: number(minor, "minor")?,
        root: unescape(get(3, "root")?),
        mount_point: unescape(get(4, "mount_point")?),
        options: get(5, "options")?.to_owned(),
        optional_fields: fields[6..separator]
            .iter()
            .filter(|f| !f.is_empty())
            .map(|f| (*f).to_owned())
            .collect(),
        fstype: unescape(get(separator + 1, "fstype")?),
        source: unescape(get(separator + 2, "source")?),
        super_options: fields
            .get(separator + 3..)
            .map(|rest| rest.join(" "))
            .unwrap_or_default(),
    })
}

/// Decodes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash).
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            if let Some(byte) = bytes.get(i + 1..i + 4).and_then(octal_byte) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn octal_byte(digits: &[u8]) -> Option<u8> {
    if !digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
        return None;
    }
    let value = digits
        .iter()
        .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
    u8::try_from(value).ok()
}

fn number(value: &str, field: &'static str) -> Result<u32, ParseError> {
    value
        .parse()
        .map_err(|_| ParseError::invalid(FILE, field, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// This machine's mountinfo (kernel 6.18), abridged.
    const MACHINE: &str = "22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12334492k,nr_inodes=3083623,mode=755
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684092k
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534
28 27 0:25 / /mnt/sandboxing/model_tools_env/v1/python ro,nosuid,nodev,relatime - tmpfs model_tools_unavailable ro,size=4k,mode=755
30 25 0:27 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684092k
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn parses_the_machine_table() {
        let table = parse_mountinfo(MACHINE).unwrap();
        assert_eq!(table.mounts.len(), 8);
        let root = table.by_id(27).unwrap();
        assert_eq!(root.parent_id, 1);
        assert_eq!((root.major, root.minor), (254, 0));
        assert_eq!(root.mount_point, "/");
        assert_eq!(root.fstype, "ext4");
        assert_eq!(root.source, "/dev/vda");
        assert_eq!(root.options, "rw,relatime");
        assert_eq!(
            root.super_options,
            "rw,discard,resv_strict,resuid=65534,resgid=65534"
        );
        assert!(root.optional_fields.is_empty());
        assert_eq!(table.by_id(99), None);
    }

    #[test]
    fn optional_fields_escapes_and_fuse_subtype() {
        let line = r"101 27 0:50 /export/run\040one /shared\040dir rw,relatime shared:7 master:2 - fuse.bindfs /srv/x\134y rw,user_id=0";
        let mount = parse_line(line).unwrap();
        assert_eq!(mount.root, "/export/run one");
        assert_eq!(mount.mount_point, "/shared dir");
        assert_eq!(mount.optional_fields, ["shared:7", "master:2"]);
        assert_eq!(mount.fstype, "fuse.bindfs");
        assert_eq!(mount.source, r"/srv/x\y");
    }

    #[test]
    fn nfs_source_and_empty_source() {
        let nfs = parse_line("60 27 0:55 / /shared rw,relatime - nfs4 server:/export rw,vers=4.2")
            .unwrap();
        assert_eq!(nfs.source, "server:/export");
        let empty = parse_line("61 27 0:56 / /x rw - tmpfs  rw").unwrap();
        assert_eq!(empty.source, "");
        assert_eq!(empty.super_options, "rw");
    }

    #[test]
    fn longest_prefix_on_component_boundaries() {
        let table = parse_mountinfo(
            "1 0 8:1 / / rw - ext4 /dev/sda1 rw
2 1 8:2 / /shared rw - ext4 /dev/loop0 rw
3 2 0:40 / /shared/fast rw - tmpfs tmpfs rw
",
        )
        .unwrap();
        let at = |path: &str| table.containing(path).map(|m| m.mount_point.as_str());
        assert_eq!(at("/shared/log.txt"), Some("/shared"));
        assert_eq!(at("/shared"), Some("/shared"));
        assert_eq!(at("/sharedfoo/x"), Some("/"));
        assert_eq!(at("/shared/fast/ckpt.pt"), Some("/shared/fast"));
        assert_eq!(at("/home/u"), Some("/"));
        assert_eq!(at("socket:[1234]"), None);
    }

    #[test]
    fn the_last_mount_on_a_point_wins() {
        let table = parse_mountinfo(MACHINE).unwrap();
        assert_eq!(table.containing("/dev/shm/x").unwrap().mount_id, 30);
    }

    #[test]
    fn malformed_lines() {
        assert!(matches!(
            parse_line("27 1 254:0 / / rw,relatime ext4 /dev/vda rw").unwrap_err(),
            ParseError::Missing {
                field: "separator",
                ..
            }
        ));
        assert!(parse_line("x 1 254:0 / / rw - ext4 /dev/vda rw").is_err());
        assert!(parse_line("27 1 2540 / / rw - ext4 /dev/vda rw").is_err());
        assert!(matches!(
            parse_line("27 1 254:0 / / rw -").unwrap_err(),
            ParseError::Missing {
                field: "fstype",
                ..
            }
        ));
    }

    #[test]
    fn unescape_leaves_odd_backslashes() {
        assert_eq!(unescape(r"a\040b"), "a b");
        assert_eq!(unescape(r"a\011b\012c"), "a\tb\nc");
        assert_eq!(unescape(r"tail\04"), r"tail\04");
        assert_eq!(unescape(r"\999"), r"\999");
        assert_eq!(unescape(r"\777"), r"\777");
        assert_eq!(unescape(r"\"), r"\");
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = parse_mountinfo(&text);
            let _ = unescape(&text);
        }

        #[test]
        fn never_panics_on_near_misses(fields in prop::collection::vec("[0-9:/a-z\\\\-]{0,8}", 0..14)) {
            if let Ok(table) = parse_mountinfo(&fields.join(" ")) {
                let _ = table.containing("/a/b");
            }
        }

        #[test]
        fn containing_is_a_prefix(path in "/[a-z/]{0,20}") {
            let table = parse_mountinfo(MACHINE).unwrap();
            let mount = table.containing(&path).unwrap();
            prop_assert!(path.starts_with(&mount.mount_point));
        }
    }
}
