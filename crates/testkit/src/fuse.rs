//! A FUSE mount (bindfs) whose daemon a test can stop: the network-filesystem-like hang, where callers sleep in
//! S state in `request_wait_answer` instead of D.
//!
//! bindfs runs in the foreground (`-f`) as our child, so its pid is known and SIGSTOP/SIGCONT go to exactly it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::cmd::{run_tool, send, wait_with_deadline, ChildGuard};
use crate::error::{Result, TestkitError};
use crate::procinfo::{is_mount_point, process_state};
use crate::wait_until;
use crate::watchdog::Watchdog;

const MOUNT_TIMEOUT: Duration = Duration::from_secs(10);
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(5);

/// `backing_dir` mirrored by bindfs on a temporary mount point; unmounted and the daemon ended on drop.
///
/// Drop order with writers: the [`StoppedDaemon`] guard (resume), then the writers, then the `FuseMount`. A FUSE
/// wait is killable, so the other order also works: killed writers leave `request_wait_answer` at once.
#[derive(Debug)]
pub struct FuseMount {
    shared: Arc<Shared>,
    daemon: Option<ChildGuard>,
    watchdog: Option<Watchdog>,
    backing: PathBuf,
    _dir: tempfile::TempDir,
}

#[derive(Debug)]
struct Shared {
    mount_point: PathBuf,
    daemon_pid: u32,
    stopped: Mutex<bool>,
}

impl Shared {
    fn resume(&self) -> Result<()> {
        let mut stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        if *stopped {
            send(self.daemon_pid, Signal::SIGCONT).map_err(TestkitError::io(format!(
                "could not resume bindfs (pid {})",
                self.daemon_pid
            )))?;
            *stopped = false;
        }
        Ok(())
    }
}

impl FuseMount {
    /// Mounts `backing_dir` with `bindfs -f` and waits until the mount shows in /proc/self/mountinfo.
    ///
    /// Without bindfs or /dev/fuse it returns [`TestkitError::Missing`] (a skip).
    pub fn new(backing_dir: &Path) -> Result<Self> {
        if !Path::new("/dev/fuse").exists() {
            return Err(TestkitError::Missing {
                tool: "/dev/fuse".into(),
                hint: "the kernel has no FUSE support here (modprobe fuse, or run the container with /dev/fuse)",
            });
        }
        let dir = tempfile::Builder::new()
            .prefix("hangwatch-fuse-")
            .tempdir()
            .map_err(TestkitError::io("could not create a temporary directory"))?;
        let mount_point = dir.path().join("mnt");
        std::fs::create_dir(&mount_point)
            .map_err(TestkitError::io("could not create the mount point"))?;
        let mount_point = mount_point
            .canonicalize()
            .map_err(TestkitError::io("could not resolve the mount point"))?;
        let log_path = dir.path().join("bindfs.log");
        let log = std::fs::File::create(&log_path)
            .map_err(TestkitError::io("could not create bindfs.log"))?;
        let mut cmd = Command::new("bindfs");
        cmd.arg("-f")
            .arg(backing_dir)
            .arg(&mount_point)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let mut daemon = match cmd.spawn() {
            Ok(child) => ChildGuard::new(child, "bindfs"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(TestkitError::Missing {
                    tool: "bindfs".into(),
                    hint: "install it (Debian: apt-get install bindfs fuse3)",
                })
            }
            Err(source) => {
                return Err(TestkitError::Io {
                    context: "could not start bindfs".into(),
                    source,
                })
            }
        };
        let mut exited = None;
        let mounted = wait_until(MOUNT_TIMEOUT, Duration::from_millis(10), || {
            exited = daemon.try_wait();
            exited.is_some() || is_mount_point(&mount_point)
        });
        if !mounted || exited.is_some() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(match exited {
                Some(status) => TestkitError::CommandFailed {
                    command: format!(
                        "bindfs -f {} {}",
                        backing_dir.display(),
                        mount_point.display()
                    ),
                    status: status.to_string(),
                    stderr: log.trim().to_string(),
                },
                None => TestkitError::Timeout {
                    what: format!("bindfs to mount {} ({})", mount_point.display(), log.trim()),
                    after: MOUNT_TIMEOUT,
                },
            });
        }
        let daemon_pid = daemon.pid();
        let mount_s = mount_point.to_string_lossy().into_owned();
        let dir_s = dir.path().to_string_lossy().into_owned();
        let mut fs = FuseMount {
            shared: Arc::new(Shared {
                mount_point,
                daemon_pid,
                stopped: Mutex::new(false),
            }),
            daemon: Some(daemon),
            watchdog: None,
            backing: backing_dir.to_path_buf(),
            _dir: dir,
        };
        fs.watchdog = Some(Watchdog::arm(
            r#"kill -CONT "$2"; umount "$1" 2>/dev/null || fusermount3 -uz "$1" 2>/dev/null || fusermount -uz "$1" 2>/dev/null || umount -l "$1"; kill -KILL "$2"; rm -f "$3/bindfs.log"; rmdir "$1" "$3""#,
            &[&mount_s, &daemon_pid.to_string(), &dir_s],
        )?);
        Ok(fs)
    }

    /// The FUSE mount point.
    pub fn path(&self) -> &Path {
        &self.shared.mount_point
    }

    /// The directory the mount mirrors (not through FUSE: never blocks).
    pub fn backing_dir(&self) -> &Path {
        &self.backing
    }

    /// Pid of the bindfs daemon.
    pub fn daemon_pid(&self) -> u32 {
        self.shared.daemon_pid
    }

    /// Stops the daemon (SIGSTOP) and waits until it is stopped: from now on every call on the mount waits for
    /// an answer that does not come. Resumed (SIGCONT) when the guard drops, or when the `FuseMount` drops.
    pub fn stop_daemon(&self) -> Result<StoppedDaemon> {
        let mut stopped = self
            .shared
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *stopped {
            return Err(TestkitError::Misuse(
                "the bindfs daemon is already stopped".into(),
            ));
        }
        let pid = self.shared.daemon_pid;
        send(pid, Signal::SIGSTOP).map_err(TestkitError::io(format!(
            "could not stop bindfs (pid {pid})"
        )))?;
        *stopped = true;
        drop(stopped);
        let guard = StoppedDaemon {
            shared: Arc::clone(&self.shared),
        };
        if !wait_until(Duration::from_secs(5), Duration::from_millis(5), || {
            matches!(process_state(pid), Some('T'))
        }) {
            return Err(TestkitError::Timeout {
                what: format!("bindfs (pid {pid}) to stop"),
                after: Duration::from_secs(5),
            });
        }
        Ok(guard)
    }

    /// A slow filesystem rather than a stopped one: the daemon is stopped for `stopped`, then runs for `running`,
    /// over and over, until the guard drops (then it runs freely). Every call on the mount still completes, at a
    /// fraction of the speed, and the caller waits in `request_wait_answer` meanwhile as on a loaded network
    /// filesystem.
    pub fn slow_down(&self, stopped: Duration, running: Duration) -> SlowDaemon {
        let shared = Arc::clone(&self.shared);
        let (quit, quitting) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || loop {
            let pid = shared.daemon_pid;
            {
                let mut flag = shared.stopped.lock().unwrap_or_else(|e| e.into_inner());
                if send(pid, Signal::SIGSTOP).is_ok() {
                    *flag = true;
                }
            }
            let end = quitting.recv_timeout(stopped);
            if let Err(e) = shared.resume() {
                eprintln!("testkit: {e}");
            }
            if !matches!(end, Err(std::sync::mpsc::RecvTimeoutError::Timeout)) {
                return;
            }
            if !matches!(
                quitting.recv_timeout(running),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            ) {
                return;
            }
        });
        SlowDaemon {
            quit: Some(quit),
            thread: Some(thread),
        }
    }
}

/// A FUSE daemon made slow by [`FuseMount::slow_down`]; runs freely again on drop.
#[derive(Debug)]
#[must_use = "the daemon runs freely again as soon as the guard drops"]
pub struct SlowDaemon {
    quit: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for SlowDaemon {
    fn drop(&mut self) {
        drop(self.quit.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        drop(self.watchdog.take());
        if let Err(e) = self.shared.resume() {
            eprintln!("testkit: {e}");
        }
        let mount = self.path().to_string_lossy().into_owned();
        let attempts: [(&str, &[&str]); 6] = [
            ("umount", &[]),
            ("fusermount3", &["-u"]),
            ("fusermount", &["-u"]),
            ("umount", &["-l"]),
            ("fusermount3", &["-uz"]),
            ("fusermount", &["-uz"]),
        ];
        for (program, flags) in attempts {
            if !is_mount_point(self.path()) {
                break;
            }
            let args: Vec<&str> = flags.iter().copied().chain([mount.as_str()]).collect();
            let _ = run_tool(program, &args, CLEANUP_TIMEOUT);
        }
        if is_mount_point(self.path()) {
            eprintln!("testkit: could not unmount the FUSE mount {mount}");
        }
        if let Some(mut daemon) = self.daemon.take() {
            // An unmounted bindfs exits by itself; give it a moment before SIGKILL.
            let _ = wait_with_deadline(daemon.child_mut(), Duration::from_secs(2));
        }
    }
}

/// A stopped FUSE daemon; resumed on drop.
#[derive(Debug)]
#[must_use = "the daemon is resumed as soon as the guard drops"]
pub struct StoppedDaemon {
    shared: Arc<Shared>,
}

impl StoppedDaemon {
    /// Resumes now and reports failure.
    pub fn resume(self) -> Result<()> {
        self.shared.resume()
    }
}

impl Drop for StoppedDaemon {
    fn drop(&mut self) {
        if let Err(e) = self.shared.resume() {
            eprintln!("testkit: {e}");
        }
    }
}
