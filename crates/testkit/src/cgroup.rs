//! A memory cgroup with a small limit, for tests that make a rank run out of memory: created under the memory
//! hierarchy this machine uses (v1's `memory` or the unified v2 one), removed on drop (its processes killed
//! first, by pid).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Result, TestkitError};

/// A memory cgroup created for a test; removed when dropped.
#[derive(Debug)]
pub struct MemoryCgroup {
    dir: PathBuf,
    /// Its path inside its hierarchy (`/hw-test-4242-0`), as the kernel names it.
    name: String,
    version: u8,
}

impl MemoryCgroup {
    /// A new cgroup limited to `limit_bytes` of memory (and no swap where the kernel counts it).
    pub fn new(limit_bytes: u64) -> Result<Self> {
        crate::require_root().map_err(|_| TestkitError::NotRoot {
            what: "creating a memory cgroup",
            uid: nix::unistd::geteuid().as_raw(),
        })?;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "/hw-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (root, version) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.to_path_buf(), 1)
        } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            (PathBuf::from("/sys/fs/cgroup"), 2)
        } else {
            return Err(TestkitError::Missing {
                tool: "a memory cgroup hierarchy".into(),
                hint: "mount cgroup v1's memory controller at /sys/fs/cgroup/memory or cgroup v2 at /sys/fs/cgroup",
            });
        };
        if version == 2 {
            // The root must hand the memory controller down; harmless when it already does.
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
        }
        let dir = root.join(name.trim_start_matches('/'));
        std::fs::create_dir(&dir)
            .map_err(TestkitError::io(format!("creating {}", dir.display())))?;
        let cgroup = MemoryCgroup { dir, name, version };
        let limit = limit_bytes.to_string();
        match version {
            1 => {
                cgroup.write("memory.limit_in_bytes", &limit)?;
                // Only where swap accounting exists; without it there is no swap to escape to anyway.
                let _ = cgroup.write("memory.memsw.limit_in_bytes", &limit);
            }
            _ => {
                cgroup.write("memory.max", &limit)?;
                let _ = cgroup.write("memory.swap.max", "0");
            }
        }
        Ok(cgroup)
    }

    /// Its directory in cgroupfs (write a pid to `cgroup.procs` in it to move that process in).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its path as the kernel and `/proc/PID/cgroup` name it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// 1 or 2.
    pub fn version(&self) -> u8 {
        self.version
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        std::fs::write(self.dir.join(file), value).map_err(TestkitError::io(format!(
            "writing {value} to {file} of {}",
            self.name
        )))
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            for pid in self.pids() {
                let _ = crate::send(pid as u32, nix::sys::signal::Signal::SIGKILL);
            }
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            if Instant::now() >= end {
                eprintln!("test: could not remove the cgroup {}", self.dir.display());
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
