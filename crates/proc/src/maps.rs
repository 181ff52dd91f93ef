//! Parser of `/proc/PID/maps`, and the memory-mapped files of a process placed on their mounts. Reading the file
//! takes the process's mmap lock and can block behind a page fault (docs/inspecting-a-stuck-process.md): the
//! read belongs in an abandonable child; this module only parses and resolves text already read.

use hangwatch_kernel::filesystem::is_pseudo_fstype;
use hangwatch_model::{FileRef, MappedFile};

use crate::mountinfo::MountTable;

/// One line of `maps`: `7f2c3a400000-7f2c3a600000 r--s 00000000 00:2f 1234   /data/shard-0.arrow`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// `rwxp` / `r--s`.
    pub perms: String,
    /// Device of the file, `major:minor` (0:0 for anonymous memory).
    pub major: u32,
    pub minor: u32,
    pub inode: u64,
    /// The file, `[heap]`-like pseudo names, or empty for anonymous memory.
    pub path: String,
}

impl Mapping {
    pub fn executable(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }

    /// Backed by a file (inode non-zero and an absolute path).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }
}

/// Parses the whole file; lines that do not parse are skipped (the file is read as the kernel changes it).
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut rest = line;
    let mut field = || {
        let trimmed = rest.trim_start_matches(' ');
        let end = trimmed.find(' ').unwrap_or(trimmed.len());
        let (f, r) = trimmed.split_at(end);
        rest = r;
        Some(f).filter(|f| !f.is_empty())
    };
    let (start, end) = field()?.split_once('-')?;
    let perms = field()?.to_string();
    let _offset = field()?;
    let (major, minor) = field()?.split_once(':')?;
    let inode = field()?.parse().ok()?;
    let path = rest.trim_start_matches(' ').to_string();
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms,
        major: u32::from_str_radix(major, 16).ok()?,
        minor: u32::from_str_radix(minor, 16).ok()?,
        inode,
        path,
    })
}

/// At most this many files of one process are kept: a PyTorch rank maps hundreds of libraries, and a dataset
/// may map thousands of shards.
pub const MAX_MAPPED_FILES: usize = 512;

/// The files a process maps that live on a filesystem (not memory-backed ones, not devices), each once with its
/// address ranges, placed on its mount by the mapping's device and the longest mount-point prefix of its path
/// (the device alone is ambiguous with bind mounts; the path alone with a mount covered later).
pub fn mapped_files(mappings: &[Mapping], mounts: Option<&MountTable>) -> Vec<MappedFile> {
    let mut out: Vec<MappedFile> = Vec::new();
    for m in mappings.iter().filter(|m| m.is_file()) {
        if let Some(known) = out.iter_mut().find(|f| f.file.path == m.path) {
            known.ranges.push((m.start, m.end));
            known.code |= m.executable();
            continue;
        }
        if out.len() >= MAX_MAPPED_FILES {
            continue;
        }
        let path = m.path.strip_suffix(" (deleted)").unwrap_or(&m.path);
        let mount = mounts.and_then(|t| {
            // A device no mount lists (overlayfs shows its lower file's) falls back to the path.
            t.mounts
                .iter()
                .filter(|x| x.major == m.major && x.minor == m.minor)
                .filter(|x| is_under(path, &x.mount_point))
                .max_by_key(|x| x.mount_point.len())
                .or_else(|| t.containing(path))
        });
        // memfd and SysV shared memory live on internal mounts that no mount table lists.
        let internal = ["/dev/", "/memfd:", "/SYSV"]
            .iter()
            .any(|p| path.starts_with(p));
        if internal || mount.is_some_and(|x| is_pseudo_fstype(&x.fstype)) {
            continue;
        }
        out.push(MappedFile {
            file: FileRef {
                filesystem: None,
                path: m.path.clone(),
                mount: mount.map(|x| x.mount_point.clone()),
                fstype: mount.map(|x| x.fstype.clone()),
                source: mount.map(|x| x.source.clone()),
            },
            ranges: vec![(m.start, m.end)],
            code: m.executable(),
        });
    }
    out
}

fn is_under(path: &str, mount_point: &str) -> bool {
    let point = mount_point.trim_end_matches('/');
    point.is_empty()
        || path
            .strip_prefix(point)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mountinfo::parse_mountinfo;

    const MAPS: &str = "\
55d0c8a00000-55d0c8a2e000 r--p 00000000 fd:01 131090                     /usr/bin/python3.11
55d0c8a2e000-55d0c8d2f000 r-xp 0002e000 fd:01 131090                     /usr/bin/python3.11
55d0ca1f1000-55d0ca4b3000 rw-p 00000000 00:00 0                          [heap]
7f2c3a400000-7f2c3e400000 r--s 00000000 00:2f 1234                       /mnt/data/shard 0.arrow
7f2c3e400000-7f2c3e600000 r-xp 00000000 00:2f 1240                       /mnt/data/lib/libfast.so
7f2c3f000000-7f2c3f100000 rw-s 00000000 00:05 77                         /dev/shm/torch_1 (deleted)
7f2c3f100000-7f2c3f200000 rw-s 00000000 00:01 78                         /memfd:cuda (deleted)
7ffd1c5e0000-7ffd1c601000 rw-p 00000000 00:00 0                          [stack]
7ffd1c7f2000-7ffd1c7f4000 r-xp 00000000 00:00 0                          [vdso]
";

    const MOUNTINFO: &str = "\
27 1 253:1 / / rw,relatime - ext4 /dev/vda1 rw
30 27 0:5 / /dev rw - devtmpfs udev rw
31 30 0:26 / /dev/shm rw - tmpfs tmpfs rw
50 27 0:47 / /mnt rw - fuse.bindfs bindfs rw
51 50 0:47 /data /mnt/data rw - fuse.bindfs bindfs rw
";

    #[test]
    fn lines_parse_with_spaces_in_paths_and_hex_devices() {
        let maps = parse_maps(MAPS);
        assert_eq!(maps.len(), 9);
        assert_eq!(maps[3].path, "/mnt/data/shard 0.arrow");
        assert_eq!((maps[3].major, maps[3].minor), (0, 0x2f));
        assert_eq!(maps[3].start, 0x7f2c3a400000);
        assert!(maps[1].executable() && !maps[0].executable());
        assert!(!maps[2].is_file() && !maps[8].is_file());
        assert!(parse_maps("garbage\n\n").is_empty());
    }

    #[test]
    fn files_are_merged_placed_on_their_mount_and_memory_backed_ones_dropped() {
        let table = parse_mountinfo(MOUNTINFO).expect("mountinfo");
        let files = mapped_files(&parse_maps(MAPS), Some(&table));
        let paths: Vec<&str> = files.iter().map(|f| f.file.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/usr/bin/python3.11",
                "/mnt/data/shard 0.arrow",
                "/mnt/data/lib/libfast.so"
            ],
            "/dev/shm (tmpfs), memfd and pseudo mappings are no files on a filesystem"
        );
        assert_eq!(files[0].ranges.len(), 2);
        assert!(files[0].code, "one executable mapping makes it code");
        assert!(files[0].holds(0x55d0c8a2e100) && !files[0].holds(0x55d0c8d2f000));
        assert_eq!(files[0].file.fstype.as_deref(), Some("ext4"));
        assert_eq!(
            files[1].file.mount.as_deref(),
            Some("/mnt/data"),
            "the deepest mount of the mapping's device holding the path"
        );
        assert_eq!(files[1].file.fstype.as_deref(), Some("fuse.bindfs"));
        assert!(!files[1].code && files[2].code);
    }
}
