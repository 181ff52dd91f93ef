//! A process's memory cgroup and that cgroup's limit and OOM-kill counter, for cgroup v1 (`memory.oom_control`,
//! `memory.limit_in_bytes`) and v2 (`memory.events`, `memory.max`). Parsers take the files' text; [`CgroupFs`]
//! reads them under roots that tests point at a fake tree. cgroupfs is a kernel pseudo-filesystem: reading it
//! never waits on storage.

use std::path::{Path, PathBuf};

use crate::error::ReadError;
use crate::mountinfo::MountTable;

/// Which cgroup hierarchy holds a process's memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

impl CgroupVersion {
    pub fn number(self) -> u8 {
        match self {
            CgroupVersion::V1 => 1,
            CgroupVersion::V2 => 2,
        }
    }
}

/// A memory cgroup: its path inside its hierarchy (`/hw-test`) and which hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryCgroup {
    pub version: CgroupVersion,
    pub path: String,
}

/// What a memory cgroup says about its limit and its OOM kills.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryCgroupState {
    /// `None` when unlimited (`max`, or v1's page-counter maximum).
    pub limit_bytes: Option<u64>,
    /// `None` when the kernel does not count them (v1 before Linux 4.13) or the file could not be read.
    pub oom_kills: Option<u64>,
}

/// The memory cgroup in `/proc/PID/cgroup`: the v1 line naming the `memory` controller, else the v2 line
/// (`0::/path`). A v1 line wins: on a hybrid system the unified line exists but the memory controller is v1.
pub fn parse_proc_cgroup(text: &str) -> Option<MemoryCgroup> {
    let mut unified = None;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            return Some(MemoryCgroup {
                version: CgroupVersion::V1,
                path: path.to_string(),
            });
        }
        if controllers.is_empty() {
            unified = Some(MemoryCgroup {
                version: CgroupVersion::V2,
                path: path.to_string(),
            });
        }
    }
    unified
}

/// The `oom_kill N` counter of v1's `memory.oom_control` (Linux 4.13 and later).
pub fn parse_oom_control(text: &str) -> Option<u64> {
    counter(text, "oom_kill")
}

/// The `oom_kill N` counter of v2's `memory.events`.
pub fn parse_memory_events(text: &str) -> Option<u64> {
    counter(text, "oom_kill")
}

fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.trim().split_once(char::is_whitespace)?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// v1 reports "no limit" as the page counter's maximum rounded to pages (9223372036854771712 on x86-64).
const UNLIMITED_FROM: u64 = 1 << 62;

/// A memory limit (`memory.max` or `memory.limit_in_bytes`): `None` for unlimited or unreadable text.
pub fn parse_memory_limit(text: &str) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return None;
    }
    text.parse::<u64>().ok().filter(|v| *v < UNLIMITED_FROM)
}

/// Where the cgroup hierarchies are mounted: v1's memory hierarchy and the unified (v2) one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupFs {
    pub memory_v1: Option<PathBuf>,
    pub unified: Option<PathBuf>,
}

impl CgroupFs {
    /// The hierarchies as `mounts` (a process's mount table) has them.
    pub fn from_mounts(mounts: &MountTable) -> Self {
        let mut fs = CgroupFs::default();
        for m in &mounts.mounts {
            match m.fstype.as_str() {
                "cgroup" if m.super_options.split(',').any(|o| o == "memory") => {
                    fs.memory_v1
                        .get_or_insert_with(|| PathBuf::from(&m.mount_point));
                }
                "cgroup2" => {
                    fs.unified
                        .get_or_insert_with(|| PathBuf::from(&m.mount_point));
                }
                _ => {}
            }
        }
        fs
    }

    /// The version the memory controller is used in here: v1 when a v1 memory hierarchy is mounted.
    pub fn memory_version(&self) -> Option<CgroupVersion> {
        match (&self.memory_v1, &self.unified) {
            (Some(_), _) => Some(CgroupVersion::V1),
            (None, Some(_)) => Some(CgroupVersion::V2),
            (None, None) => None,
        }
    }

    /// The directory of `cgroup`, when its hierarchy is mounted.
    pub fn dir(&self, cgroup: &MemoryCgroup) -> Option<PathBuf> {
        let root = match cgroup.version {
            CgroupVersion::V1 => self.memory_v1.as_ref()?,
            CgroupVersion::V2 => self.unified.as_ref()?,
        };
        Some(root.join(cgroup.path.trim_start_matches('/')))
    }

    /// The limit and the OOM-kill counter of `cgroup`; what cannot be read is `None`. An error only when the
    /// cgroup's directory is not there (removed, or its hierarchy not mounted).
    pub fn memory_state(&self, cgroup: &MemoryCgroup) -> Result<MemoryCgroupState, ReadError> {
        let dir = self.dir(cgroup).ok_or_else(|| ReadError::Io {
            path: PathBuf::from(&cgroup.path),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "its cgroup hierarchy is not mounted",
            ),
        })?;
        std::fs::metadata(&dir).map_err(|source| ReadError::Io {
            path: dir.clone(),
            source,
        })?;
        let read = |name: &str| read_text(&dir.join(name));
        Ok(match cgroup.version {
            CgroupVersion::V1 => MemoryCgroupState {
                limit_bytes: read("memory.limit_in_bytes").and_then(|t| parse_memory_limit(&t)),
                oom_kills: read("memory.oom_control").and_then(|t| parse_oom_control(&t)),
            },
            CgroupVersion::V2 => MemoryCgroupState {
                limit_bytes: read("memory.max").and_then(|t| parse_memory_limit(&t)),
                oom_kills: read("memory.events").and_then(|t| parse_memory_events(&t)),
            },
        })
    }
}

fn read_text(path: &Path) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_line_of_v1_wins_over_the_unified_line() {
        let hybrid = "9:name=systemd:/\n4:memory:/slurm/uid_0/job_42\n1:cpu,cpuacct:/\n0::/\n";
        assert_eq!(
            parse_proc_cgroup(hybrid),
            Some(MemoryCgroup {
                version: CgroupVersion::V1,
                path: "/slurm/uid_0/job_42".into()
            })
        );
        assert_eq!(
            parse_proc_cgroup("0::/user.slice/hw-test\n"),
            Some(MemoryCgroup {
                version: CgroupVersion::V2,
                path: "/user.slice/hw-test".into()
            })
        );
        assert_eq!(parse_proc_cgroup("garbage\n\n"), None);
    }

    #[test]
    fn oom_counters_and_limits() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(parse_oom_control(v1), Some(3));
        assert_eq!(parse_oom_control("oom_kill_disable 0\nunder_oom 0\n"), None);
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(parse_memory_events(v2), Some(1));
        assert_eq!(parse_memory_limit("268435456\n"), Some(256 << 20));
        assert_eq!(parse_memory_limit("max\n"), None);
        assert_eq!(parse_memory_limit("9223372036854771712\n"), None);
        assert_eq!(parse_memory_limit(""), None);
    }

    #[test]
    fn a_fake_tree_is_read_for_each_version() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = dir.path().join("memory/hw-test");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "209715200\n").unwrap();
        std::fs::write(
            v1.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .unwrap();
        let v2 = dir.path().join("unified/job");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        std::fs::write(v2.join("memory.events"), "oom 0\noom_kill 0\n").unwrap();
        let fs = CgroupFs {
            memory_v1: Some(dir.path().join("memory")),
            unified: Some(dir.path().join("unified")),
        };
        let cg = |version, path: &str| MemoryCgroup {
            version,
            path: path.into(),
        };
        assert_eq!(
            fs.memory_state(&cg(CgroupVersion::V1, "/hw-test")).unwrap(),
            MemoryCgroupState {
                limit_bytes: Some(200 << 20),
                oom_kills: Some(1)
            }
        );
        assert_eq!(
            fs.memory_state(&cg(CgroupVersion::V2, "/job")).unwrap(),
            MemoryCgroupState {
                limit_bytes: None,
                oom_kills: Some(0)
            }
        );
        assert!(fs.memory_state(&cg(CgroupVersion::V1, "/gone")).is_err());
    }

    #[test]
    fn hierarchies_come_from_the_mount_table() {
        let text = "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n\
                    31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n";
        let fs = CgroupFs::from_mounts(&crate::parse_mountinfo(text).unwrap());
        assert_eq!(
            fs.memory_v1.as_deref(),
            Some(Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            fs.unified.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(fs.memory_version(), Some(CgroupVersion::V1));
    }
}
