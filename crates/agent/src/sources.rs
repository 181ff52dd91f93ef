//! The sources that `run` sets up for the loop before the job starts: the thread that turns SIGINT, SIGTERM and
//! SIGHUP into [`Event::Signal`], and the private node-local directory of the heartbeat socket and the beat slots.

use std::path::PathBuf;
use std::sync::mpsc::SyncSender;

use hangwatch_proc::ProcFs;

use crate::events::Event;

/// A fresh private (0700) directory for the heartbeat socket and the beat slots: the first node-local one of
/// `$XDG_RUNTIME_DIR` (a per-user tmpfs), `$TMPDIR`, `/dev/shm` and `/tmp`. Node-local by the mount table, before
/// anything touches the path: with `TMPDIR` on Lustre scratch the loop, the exit and every rank's `beat()` would
/// otherwise wait on the shared filesystem. Removed when dropped.
pub(crate) fn runtime_dir() -> std::io::Result<tempfile::TempDir> {
    let table = ProcFs::new("/proc")
        .mountinfo(std::process::id() as i32)
        .ok();
    let candidates: Vec<PathBuf> = [
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        Some(std::env::temp_dir()),
        Some(PathBuf::from("/dev/shm")),
        Some(PathBuf::from("/tmp")),
    ]
    .into_iter()
    .flatten()
    .filter(|p| p.is_absolute())
    .collect();
    let mut last = None;
    for base in &candidates {
        if let Some(t) = &table {
            if !t.is_node_local(&base.to_string_lossy()) {
                tracing::info!(dir = %base.display(), "not a node-local filesystem: the heartbeat socket goes elsewhere");
                continue;
            }
        }
        match tempfile::Builder::new()
            .prefix("hangwatch-")
            .tempdir_in(base)
        {
            Ok(dir) => return Ok(dir),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::other("no node-local directory for the heartbeat socket ($XDG_RUNTIME_DIR, $TMPDIR, /dev/shm, /tmp)")
    }))
}

/// The signal thread; closing it stops it.
pub(crate) struct SignalThread {
    handle: signal_hook::iterator::Handle,
}

impl SignalThread {
    pub(crate) fn close(self) {
        self.handle.close();
    }
}

pub(crate) fn install_signals(tx: SyncSender<Event>) -> std::io::Result<SignalThread> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("hw-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if tx.send(Event::Signal(sig)).is_err() {
                    return;
                }
            }
        })?;
    Ok(SignalThread { handle })
}
