//! A loop-mounted ext4 filesystem that a test can freeze (`fsfreeze -f`): the seed incident's stuck mount.
//!
//! While frozen, writers sleep in D state in `write()` (`percpu_rwsem_wait`) and `stat`/`statfs` still answer.
//! Clean-up order in `Drop`: thaw, unmount (lazily when busy), remove the image. A watchdog does the same if
//! the test process dies without unwinding.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cmd::run_tool;
use crate::error::{Result, TestkitError};
use crate::procinfo::is_mount_point;
use crate::require_root;
use crate::watchdog::Watchdog;

const TOOL_TIMEOUT: Duration = Duration::from_secs(30);
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A fresh ext4 filesystem on a loop device, mounted on a temporary directory; unmounted and deleted on drop.
///
/// Needs root; without it [`LoopExt4::new`] returns [`TestkitError::NotRoot`], which [`crate::require!`] turns
/// into a skip.
///
/// With processes writing to it, declare guards so that they drop in this order: the [`FrozenGuard`] (thaw),
/// then the processes ([`crate::RankGroup`], [`crate::ChildGuard`]), then the `LoopExt4`. Declaring them as
/// `fs`, `ranks`, `frozen` gives exactly that. Any other order still cleans up, only more slowly: a process
/// stuck in D cannot die before the thaw, so its guard gives up after a few seconds and the unmount falls back
/// to a lazy one.
#[derive(Debug)]
pub struct LoopExt4 {
    shared: Arc<Shared>,
    image: PathBuf,
    watchdog: Option<Watchdog>,
    dir: Option<tempfile::TempDir>,
}

#[derive(Debug)]
struct Shared {
    mount_point: PathBuf,
    frozen: Mutex<bool>,
}

impl Shared {
    fn thaw(&self) -> Result<()> {
        let mut frozen = self.frozen.lock().unwrap_or_else(|e| e.into_inner());
        if !*frozen {
            return Ok(());
        }
        run_tool(
            "fsfreeze",
            &["-u", &self.mount_point.to_string_lossy()],
            CLEANUP_TIMEOUT,
        )?;
        *frozen = false;
        Ok(())
    }
}

impl LoopExt4 {
    /// Creates a `size_mb` MiB image (at least 8), formats it (`mkfs.ext4 -q -F`) and loop-mounts it.
    pub fn new(size_mb: u64) -> Result<Self> {
        require_root().map_err(|_| TestkitError::NotRoot {
            what: "a loop-mounted ext4",
            uid: nix::unistd::geteuid().as_raw(),
        })?;
        if size_mb < 8 {
            return Err(TestkitError::Misuse(format!(
                "an ext4 image needs at least 8 MiB, not {size_mb}"
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix("hangwatch-ext4-")
            .tempdir()
            .map_err(TestkitError::io("could not create a temporary directory"))?;
        let image = dir.path().join("image.ext4");
        let mount_point = dir.path().join("mnt");
        std::fs::create_dir(&mount_point)
            .map_err(TestkitError::io("could not create the mount point"))?;
        let mount_point = mount_point
            .canonicalize()
            .map_err(TestkitError::io("could not resolve the mount point"))?;
        let file = std::fs::File::create(&image)
            .map_err(TestkitError::io("could not create the image file"))?;
        file.set_len(size_mb * 1024 * 1024)
            .map_err(TestkitError::io("could not size the image file"))?;
        drop(file);

        let image_s = image.to_string_lossy().into_owned();
        let mount_s = mount_point.to_string_lossy().into_owned();
        run_tool("mkfs.ext4", &["-q", "-F", &image_s], TOOL_TIMEOUT)?;
        run_tool("mount", &["-o", "loop", &image_s, &mount_s], TOOL_TIMEOUT)?;

        let dir_s = dir.path().to_string_lossy().into_owned();
        let mut fs = LoopExt4 {
            shared: Arc::new(Shared {
                mount_point,
                frozen: Mutex::new(false),
            }),
            image,
            watchdog: None,
            dir: Some(dir),
        };
        fs.watchdog = Some(Watchdog::arm(
            r#"fsfreeze -u "$1" 2>/dev/null; umount "$1" 2>/dev/null || umount -l "$1"; rm -f "$2"; rmdir "$1" "$3""#,
            &[&mount_s, &image_s, &dir_s],
        )?);
        Ok(fs)
    }

    /// The mount point: write here.
    pub fn path(&self) -> &Path {
        &self.shared.mount_point
    }

    /// The image file behind the loop device.
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// Whether the filesystem is frozen now.
    pub fn is_frozen(&self) -> bool {
        *self.shared.frozen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Freezes the filesystem (`fsfreeze -f`): from now on writers block in D state. Thawed when the returned
    /// guard drops (or by [`FrozenGuard::thaw`]), or at the latest when the `LoopExt4` drops.
    pub fn freeze(&self) -> Result<FrozenGuard> {
        let mut frozen = self.shared.frozen.lock().unwrap_or_else(|e| e.into_inner());
        if *frozen {
            return Err(TestkitError::Misuse(format!(
                "{} is already frozen",
                self.path().display()
            )));
        }
        run_tool(
            "fsfreeze",
            &["-f", &self.path().to_string_lossy()],
            TOOL_TIMEOUT,
        )?;
        *frozen = true;
        Ok(FrozenGuard {
            shared: Arc::clone(&self.shared),
        })
    }
}

impl Drop for LoopExt4 {
    fn drop(&mut self) {
        drop(self.watchdog.take());
        if let Err(e) = self.shared.thaw() {
            eprintln!("testkit: could not thaw {}: {e}", self.path().display());
        }
        let mount = self.path().to_string_lossy().into_owned();
        if is_mount_point(self.path()) {
            if let Err(busy) = run_tool("umount", &[&mount], CLEANUP_TIMEOUT) {
                if let Err(e) = run_tool("umount", &["-l", &mount], CLEANUP_TIMEOUT) {
                    eprintln!("testkit: could not unmount {mount}: {busy}; lazily either: {e}");
                    // The directory still holds a mount: removing it recursively would delete files on it.
                    if let Some(dir) = self.dir.take() {
                        let _ = dir.keep();
                    }
                }
            }
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

/// A frozen [`LoopExt4`]; thaws it on drop. May outlive the `LoopExt4` (which then thaws it first).
#[derive(Debug)]
#[must_use = "the filesystem is thawed as soon as the guard drops"]
pub struct FrozenGuard {
    shared: Arc<Shared>,
}

impl FrozenGuard {
    /// Thaws now and reports failure (drop thaws too, but can only print an error).
    pub fn thaw(self) -> Result<()> {
        self.shared.thaw()
    }

    /// The frozen mount point.
    pub fn path(&self) -> &Path {
        &self.shared.mount_point
    }
}

impl Drop for FrozenGuard {
    fn drop(&mut self) {
        if let Err(e) = self.shared.thaw() {
            eprintln!(
                "testkit: could not thaw {}: {e}",
                self.shared.mount_point.display()
            );
        }
    }
}
