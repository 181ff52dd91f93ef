//! A block-I/O cgroup that throttles one device's reads, for tests that need reads that wait (a page fault that
//! sits in D for a while on a filesystem that still answers): cgroup v1's `blkio` or v2's `io` controller. The
//! limit is lifted, its processes moved back to the root group and the group removed on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Result, TestkitError};

/// Reads from one block device, by the processes added to it, limited to so many per second.
#[derive(Debug)]
pub struct ReadThrottle {
    dir: PathBuf,
    root: PathBuf,
    /// `MAJOR:MINOR` of the device.
    device: String,
    version: u8,
}

impl ReadThrottle {
    /// A new group whose processes read at most `iops` times a second from the device that holds `path` (a loop
    /// device's mount point: [`crate::LoopExt4::path`]).
    pub fn new(path: &Path, iops: u64) -> Result<Self> {
        crate::require_root().map_err(|_| TestkitError::NotRoot {
            what: "throttling a block device",
            uid: nix::unistd::geteuid().as_raw(),
        })?;
        let v1 = Path::new("/sys/fs/cgroup/blkio");
        let v2 = Path::new("/sys/fs/cgroup");
        let (root, version) = if v1.join("blkio.throttle.read_iops_device").exists() {
            (v1.to_path_buf(), 1)
        } else if std::fs::read_to_string(v2.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "io"))
        {
            // The root must hand the io controller down; harmless when it already does.
            let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+io");
            (v2.to_path_buf(), 2)
        } else {
            return Err(TestkitError::Missing {
                tool: "a block-I/O cgroup controller".into(),
                hint: "mount cgroup v1's blkio at /sys/fs/cgroup/blkio, or cgroup v2 with the io controller at /sys/fs/cgroup",
            });
        };
        let dev = std::os::unix::fs::MetadataExt::dev(
            &std::fs::metadata(path)
                .map_err(TestkitError::io(format!("stat {}", path.display())))?,
        );
        let device = format!(
            "{}:{}",
            nix::sys::stat::major(dev),
            nix::sys::stat::minor(dev)
        );
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = root.join(format!(
            "hw-throttle-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir(&dir)
            .map_err(TestkitError::io(format!("creating {}", dir.display())))?;
        let throttle = ReadThrottle {
            dir,
            root,
            device,
            version,
        };
        throttle.limit(Some(iops))?;
        Ok(throttle)
    }

    /// Moves process `pid` (all its threads) into the group.
    pub fn add(&self, pid: u32) -> Result<()> {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string()).map_err(TestkitError::io(format!(
            "adding pid {pid} to {}",
            procs.display()
        )))
    }

    fn limit(&self, iops: Option<u64>) -> Result<()> {
        let (file, line) = match (self.version, iops) {
            (1, iops) => (
                "blkio.throttle.read_iops_device",
                format!("{} {}", self.device, iops.unwrap_or(0)),
            ),
            (_, Some(iops)) => ("io.max", format!("{} riops={iops}", self.device)),
            (_, None) => ("io.max", format!("{} riops=max", self.device)),
        };
        let path = self.dir.join(file);
        std::fs::write(&path, line).map_err(TestkitError::io(format!("writing {}", path.display())))
    }
}

impl Drop for ReadThrottle {
    fn drop(&mut self) {
        let _ = self.limit(None);
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
