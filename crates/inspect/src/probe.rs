//! Filesystem probes: does the filesystem holding a path still answer? Each probe runs in a sacrificial child
//! under a deadline, reports its steps as it goes, and at most one probe per mount is ever outstanding.
//!
//! ```text
//!  parent (Prober)                             child (`hangwatch __probe-child PATH`)
//!  mount from /proc/self/mountinfo  ──spawn──▶ stat    → {"event":"end","step":"stat",...}
//!  poll stdout until the deadline              statfs  → {"event":"end","step":"statfs",...}
//!  timeout: SIGKILL, keep the child            write   → create + fsync + unlink a hidden file
//!           as "stuck" for that mount
//! ```
//! A frozen ext4 or GPFS still answers `stat` and `statfs` from memory and blocks only writers, hence the write
//! step. A stopped FUSE daemon or a dead NFS server blocks `stat` already. The parent never touches the path
//! itself: it reads the mount table, which never blocks, and leaves everything else to the child.
//!
//! A rank in a container has mounts of its own: its `/data` is not hangwatch's `/data`. Such a mount is probed
//! in the rank's namespace ([`ProbeTarget::in_root_of`]): the child reaches it through `/proc/PID/root`, which
//! the kernel resolves in that process's root and mounts, so nothing is ever written into a directory of
//! hangwatch's own namespace that merely has the same name.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hangwatch_model::{format_limit, ProbeResult, ProbeStep};
use hangwatch_proc::{parse_mountinfo, MountTable};
use serde::{Deserialize, Serialize};

use hangwatch_child::{run_with_deadline, self_exe, AbandonedChild, ChildError, ChildOutcome};

/// Step names, in the order the child runs them.
pub const STAT: &str = "stat";
pub const STATFS: &str = "statfs";
pub const WRITE: &str = "write";

/// Prefix of the hidden file the write step creates and removes.
pub const PROBE_FILE_PREFIX: &str = ".hangwatch-probe-";

/// How long to wait for a probe and whether to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOptions {
    /// The probe never blocks longer than this (plus process start-up).
    pub timeout: Duration,
    /// Run the write step (create + fsync + unlink a hidden file). Without it a frozen filesystem that still
    /// answers reads looks healthy.
    pub write: bool,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions {
            timeout: Duration::from_secs(2),
            write: true,
        }
    }
}

/// Why a probe could not be made at all (as opposed to a filesystem that did not answer, which is a
/// [`ProbeResult`] with `responsive: Some(false)`).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The path does not exist: a mistake in what was asked, not a property of the filesystem.
    #[error("{path} does not exist ({reason})")]
    NotFound { path: String, reason: String },
    #[error("could not start the probe child for {path}")]
    Child {
        path: String,
        #[source]
        source: ChildError,
    },
    #[error("could not find the hangwatch executable to run probe children")]
    SelfExe(#[source] std::io::Error),
}

/// What the parent asks one probe child to do. [`ChildRequest::to_args`] is what `hangwatch __probe-child`
/// parses back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildRequest {
    /// Absolute path to probe.
    pub path: PathBuf,
    /// Run the write step.
    pub write: bool,
    /// Name of the hidden file the write step creates (`.hangwatch-probe-<pid>-<n>`), unique per probe.
    pub probe_file_name: String,
    /// Probe files that earlier, abandoned children may have left on this mount; removed after a successful
    /// write step (a child killed while stuck in `open` leaves its file behind once the filesystem recovers).
    pub cleanup: Vec<PathBuf>,
    /// `path` is in the mount namespace of this process (a rank in a container), not in the child's own.
    pub in_root_of: Option<i32>,
}

impl ChildRequest {
    /// Arguments after `hangwatch __probe-child`:
    /// `[--read-only] [--in-root-of PID] --probe-file NAME [--cleanup FILE]... -- PATH`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args = Vec::new();
        if !self.write {
            args.push("--read-only".into());
        }
        if let Some(pid) = self.in_root_of {
            args.push("--in-root-of".into());
            args.push(pid.to_string().into());
        }
        args.push("--probe-file".into());
        args.push(self.probe_file_name.clone().into());
        for file in &self.cleanup {
            args.push("--cleanup".into());
            args.push(file.clone().into_os_string());
        }
        args.push("--".into());
        args.push(self.path.clone().into_os_string());
        args
    }
}

/// One line the child prints on stdout (JSON), flushed as soon as it happens so that the parent knows how far
/// the child got when it has to give up on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ChildEvent {
    /// A step is about to run; `target` is the file it touches when that is not the path itself.
    Begin {
        step: String,
        target: Option<String>,
    },
    /// A step returned.
    End {
        step: String,
        outcome: StepOutcome,
        elapsed_ms: u64,
    },
    /// The mount holding the resolved path (after symlinks), from the child's mount table.
    Mount {
        mount: String,
        fstype: String,
        source: String,
    },
}

/// How a step that returned came out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StepOutcome {
    Ok,
    /// Not run, and why (`--read-only`, a read-only filesystem, no permission to write there).
    Skipped {
        reason: String,
    },
    Error {
        errno: Option<i32>,
        message: String,
    },
}

impl StepOutcome {
    /// The `outcome` text of a [`ProbeStep`]: `ok`, `skipped: ...`, `error: ...`.
    pub fn describe(&self) -> String {
        match self {
            StepOutcome::Ok => "ok".into(),
            StepOutcome::Skipped { reason } => format!("skipped: {reason}"),
            StepOutcome::Error { message, .. } => format!("error: {message}"),
        }
    }
}

/// How a probe child's run ended, as far as the interpretation needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildEnd {
    /// The child exited by itself.
    Exited { code: Option<i32>, stderr: String },
    /// The deadline passed and the child was abandoned.
    TimedOut,
}

/// The mount a path is on, as known before or after the probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRef {
    pub mount: String,
    pub fstype: String,
    pub source: String,
}

/// A mount to probe as a rank sees it: in the rank's own mount namespace when that is not hangwatch's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    /// The mount point (or any path) in the namespace it is seen from.
    pub path: String,
    /// A process whose mount namespace `path` is in, when not hangwatch's (a rank in a container); `None`: the
    /// path is hangwatch's own.
    pub in_root_of: Option<i32>,
    /// The mount as that namespace's table says, when known (the child's own lookup is used otherwise).
    pub mount: Option<MountRef>,
    /// Which filesystem it is: one probe per filesystem is ever outstanding, whichever path names it.
    pub filesystem: Option<hangwatch_model::FilesystemId>,
}

impl ProbeTarget {
    /// `path` in hangwatch's own namespace.
    pub fn own(path: impl Into<String>) -> Self {
        ProbeTarget {
            path: path.into(),
            in_root_of: None,
            mount: None,
            filesystem: None,
        }
    }
}

/// A probe interpreted: the result, or the finding that the path does not exist.
#[derive(Debug, Clone, PartialEq)]
pub enum Interpretation {
    Result(Box<ProbeResult>),
    NotFound { reason: String },
}

/// Turns what a probe child printed and how it ended into a [`ProbeResult`]. Pure.
///
/// `mount` is the parent's guess from the mount table (used when the child never got far enough to say);
/// `elapsed` is how long the parent waited.
pub fn interpret(
    path: &str,
    mount: Option<&MountRef>,
    events: &[ChildEvent],
    end: &ChildEnd,
    timeout: Duration,
    elapsed: Duration,
) -> Interpretation {
    let child_mount = events.iter().rev().find_map(|e| match e {
        ChildEvent::Mount {
            mount,
            fstype,
            source,
        } => Some(MountRef {
            mount: mount.clone(),
            fstype: fstype.clone(),
            source: source.clone(),
        }),
        _ => None,
    });
    let mount = child_mount.as_ref().or(mount);
    let mut steps = Vec::new();
    let mut ended: Vec<(&str, &StepOutcome)> = Vec::new();
    let mut begun: Option<&str> = None;
    let mut finished_ms = 0;
    for event in events {
        match event {
            ChildEvent::Begin { step, .. } => begun = Some(step),
            ChildEvent::End {
                step,
                outcome,
                elapsed_ms,
            } => {
                if begun == Some(step.as_str()) {
                    begun = None;
                }
                finished_ms += elapsed_ms;
                ended.push((step, outcome));
                steps.push(ProbeStep {
                    step: step.clone(),
                    outcome: outcome.describe(),
                    elapsed_ms: *elapsed_ms,
                });
            }
            ChildEvent::Mount { .. } => {}
        }
    }

    if let Some((
        _,
        StepOutcome::Error {
            errno: Some(errno),
            message,
        },
    )) = ended.iter().find(|(step, _)| *step == STAT)
    {
        if *errno == libc::ENOENT || *errno == libc::ENOTDIR {
            return Interpretation::NotFound {
                reason: message.clone(),
            };
        }
    }

    let (responsive, detail) = match end {
        ChildEnd::TimedOut => match begun {
            Some(step) => {
                steps.push(ProbeStep {
                    step: step.to_string(),
                    outcome: "timeout".into(),
                    elapsed_ms: (elapsed.as_millis() as u64).saturating_sub(finished_ms),
                });
                (Some(false), format!("{step} did not return within {}", format_limit(timeout)))
            }
            None if ended.is_empty() => (
                None,
                format!(
                    "the probe child did not start within {} (is the hangwatch executable on a stuck filesystem?)",
                    format_limit(timeout)
                ),
            ),
            None => (
                Some(true),
                format!("every step returned, but the probe child did not exit within {}", format_limit(timeout)),
            ),
        },
        ChildEnd::Exited { code, stderr } if ended.is_empty() => (
            None,
            format!(
                "the probe child failed (exit code {}){}",
                code.map_or_else(|| "none: killed by a signal".to_string(), |c| c.to_string()),
                if stderr.trim().is_empty() {
                    String::new()
                } else {
                    format!(": {}", stderr.trim())
                }
            ),
        ),
        ChildEnd::Exited { .. } => judge_returned_steps(&ended),
    };

    Interpretation::Result(Box::new(ProbeResult {
        filesystem: None,
        path: path.to_string(),
        mount: mount.map(|m| m.mount.clone()),
        fstype: mount.map(|m| m.fstype.clone()),
        source: mount.map(|m| m.source.clone()),
        responsive,
        elapsed_ms: elapsed.as_millis() as u64,
        detail,
        steps,
    }))
}

/// Every step came back; decide from the errors they came back with.
fn judge_returned_steps(ended: &[(&str, &StepOutcome)]) -> (Option<bool>, String) {
    for (step, outcome) in ended {
        if let StepOutcome::Error { errno, message } = outcome {
            let errno = errno.unwrap_or(0);
            if is_broken_errno(errno) {
                return (Some(false), format!("{step} failed: {message}"));
            }
            if (errno == libc::EACCES || errno == libc::EPERM) && *step != WRITE {
                return (None, format!("cannot tell: {step} was denied ({message})"));
            }
        }
    }
    let errors: Vec<String> = ended
        .iter()
        .filter_map(|(step, outcome)| match outcome {
            StepOutcome::Error { message, .. } => Some(format!("{step} failed: {message}")),
            _ => None,
        })
        .collect();
    if errors.is_empty() {
        (Some(true), "responding".into())
    } else {
        (Some(true), format!("responding, but {}", errors.join("; ")))
    }
}

/// Errors that mean the filesystem (or the server behind it) is broken rather than that the request was wrong.
fn is_broken_errno(errno: i32) -> bool {
    [
        libc::EIO,
        libc::ESTALE,
        libc::ENOTCONN,
        libc::ETIMEDOUT,
        libc::EHOSTDOWN,
        libc::EHOSTUNREACH,
        libc::ECONNREFUSED,
        libc::ECONNABORTED,
        libc::ECONNRESET,
        libc::ENOLINK,
        libc::EREMOTEIO,
        libc::EUCLEAN,
    ]
    .contains(&errno)
}

/// Parses the child's stdout; lines that are not events (a test harness's chatter) are ignored.
pub fn parse_events(stdout: &[u8]) -> Vec<ChildEvent> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line.trim()).ok())
        .collect()
}

/// One line for people: `/data: mount /data (ext4) NOT RESPONDING: write did not return within 2s (stat ok 0ms,
/// statfs ok 0ms)`.
pub fn human_line(result: &ProbeResult) -> String {
    let mount = match (&result.mount, &result.fstype) {
        (Some(m), Some(t)) => format!("mount {m} ({t})"),
        (Some(m), None) => format!("mount {m}"),
        _ => "mount unknown".into(),
    };
    let verdict = match result.responsive {
        Some(true) => "responding".to_string(),
        Some(false) => "NOT RESPONDING".to_string(),
        None => "UNKNOWN".to_string(),
    };
    let done: Vec<String> = result
        .steps
        .iter()
        .filter(|s| s.outcome != "timeout")
        .map(|s| format!("{} {} {}ms", s.step, s.outcome, s.elapsed_ms))
        .collect();
    let detail = if result.detail == "responding" {
        String::new()
    } else {
        format!(": {}", result.detail)
    };
    let steps = if done.is_empty() {
        String::new()
    } else {
        format!(" ({})", done.join(", "))
    };
    format!("{}: {mount} {verdict}{detail}{steps}", result.path)
}

/// Builds the command that runs one probe child.
pub type ChildCommand = Arc<dyn Fn(&ChildRequest) -> Command + Send + Sync>;

/// A probe child that did not return in time, kept so that its mount is not probed again until it does.
#[derive(Debug)]
struct StuckProbe {
    child: AbandonedChild,
    step: Option<String>,
    probe_file: Option<PathBuf>,
}

#[derive(Debug, Default)]
struct MountState {
    stuck: Option<StuckProbe>,
    leftovers: Vec<PathBuf>,
}

impl MountState {
    fn reap(&mut self) {
        if let Some(stuck) = self.stuck.as_mut() {
            if stuck.child.try_reap() {
                if let Some(file) = self.stuck.take().and_then(|s| s.probe_file) {
                    self.leftovers.push(file);
                }
            }
        }
    }
}

/// A probe still outstanding, for diagnostics and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutstandingProbe {
    /// The mount point (or the path, when its mount is unknown).
    pub mount: String,
    pub pid: u32,
    pub started: Instant,
    /// The step it hung in, when known.
    pub step: Option<String>,
}

/// Probes filesystems in sacrificial children, keeping track of the ones that got stuck: a mount whose previous
/// probe child is still alive is reported as still stuck, immediately and without starting another child, so a
/// dead filesystem never collects a pile of D-state probe processes.
pub struct Prober {
    child_command: ChildCommand,
    mounts: HashMap<String, MountState>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("mounts", &self.mounts)
            .finish_non_exhaustive()
    }
}

/// Grace for a killed probe child to be reaped before it counts as stuck: a FUSE wait dies at once on SIGKILL,
/// a D-state one does not.
const REAP_GRACE: Duration = Duration::from_millis(50);

static PROBE_SEQ: AtomicU64 = AtomicU64::new(0);

impl Prober {
    /// A prober whose children are this executable re-run as `hangwatch __probe-child`.
    pub fn new() -> Result<Self, ProbeError> {
        let exe = self_exe().map_err(ProbeError::SelfExe)?;
        Ok(Self::with_child_command(Arc::new(
            move |request: &ChildRequest| {
                let mut cmd = Command::new(&exe);
                cmd.arg("__probe-child").args(request.to_args());
                cmd
            },
        )))
    }

    /// A prober with another way of starting children (tests re-run their own binary).
    pub fn with_child_command(child_command: ChildCommand) -> Self {
        Prober {
            child_command,
            mounts: HashMap::new(),
        }
    }

    /// Probes one path. Returns within `options.timeout` (plus process start-up), or at once when the path's
    /// mount already has a stuck probe.
    pub fn probe(
        &mut self,
        path: &Path,
        options: &ProbeOptions,
    ) -> Result<ProbeResult, ProbeError> {
        let table = read_mount_table();
        let target = Target::new(&ProbeTarget::own(path.to_string_lossy()), table.as_ref());
        let mut state = self.take_state(&target.key);
        let result = probe_one(&self.child_command, &mut state, &target, options);
        self.keep_state(target.key, state);
        result
    }

    /// Probes several paths: different mounts in parallel, paths on the same mount one after the other (after
    /// a timeout the rest of that mount's paths are reported as still stuck). Results are in the order given.
    pub fn probe_all<P: AsRef<Path>>(
        &mut self,
        paths: &[P],
        options: &ProbeOptions,
    ) -> Vec<Result<ProbeResult, ProbeError>> {
        let targets: Vec<ProbeTarget> = paths
            .iter()
            .map(|p| ProbeTarget::own(p.as_ref().to_string_lossy()))
            .collect();
        self.probe_targets(&targets, options)
    }

    /// [`Prober::probe_all`] for mounts as ranks see them, each in its own mount namespace: the results name the
    /// path as the rank sees it, and carry the target's filesystem identity.
    pub fn probe_targets(
        &mut self,
        targets: &[ProbeTarget],
        options: &ProbeOptions,
    ) -> Vec<Result<ProbeResult, ProbeError>> {
        let table = read_mount_table();
        let mut groups: Vec<Vec<(usize, Target)>> = Vec::new();
        for (index, wanted) in targets.iter().enumerate() {
            let target = Target::new(wanted, table.as_ref());
            match groups.iter_mut().find(|g| g[0].1.key == target.key) {
                Some(group) => group.push((index, target)),
                None => groups.push(vec![(index, target)]),
            }
        }
        let mut states: Vec<MountState> = groups
            .iter()
            .map(|g| self.take_state(&g[0].1.key))
            .collect();
        let command = &self.child_command;
        let mut results: Vec<(usize, Result<ProbeResult, ProbeError>)> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = groups
                    .iter()
                    .zip(states.iter_mut())
                    .map(|(group, state)| {
                        scope.spawn(move || {
                            group
                                .iter()
                                .map(|(index, target)| {
                                    (*index, probe_one(command, state, target, options))
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap_or_default())
                    .collect()
            });
        for (mut group, state) in groups.into_iter().zip(states) {
            let (_, target) = group.swap_remove(0);
            self.keep_state(target.key, state);
        }
        results.sort_by_key(|(index, _)| *index);
        results.into_iter().map(|(_, r)| r).collect()
    }

    fn take_state(&mut self, key: &str) -> MountState {
        let mut state = self.mounts.remove(key).unwrap_or_default();
        state.reap();
        state
    }

    fn keep_state(&mut self, key: String, state: MountState) {
        if state.stuck.is_some() || !state.leftovers.is_empty() {
            self.mounts.insert(key, state);
        }
    }

    /// Probes still outstanding (after reaping the ones that finished).
    pub fn outstanding(&mut self) -> Vec<OutstandingProbe> {
        let mut out = Vec::new();
        for (mount, state) in &mut self.mounts {
            state.reap();
            if let Some(stuck) = &state.stuck {
                out.push(OutstandingProbe {
                    mount: mount.clone(),
                    pid: stuck.child.pid(),
                    started: stuck.child.started,
                    step: stuck.step.clone(),
                });
            }
        }
        out.sort_by(|a, b| a.mount.cmp(&b.mount));
        out
    }
}

/// A path to probe, with its mount as the mount table of its namespace says.
#[derive(Debug)]
struct Target {
    path: PathBuf,
    mount: Option<MountRef>,
    in_root_of: Option<i32>,
    filesystem: Option<hangwatch_model::FilesystemId>,
    /// The filesystem's identity, else the mount point (in its namespace), else the path itself when the mount
    /// is unknown: at most one probe per key is outstanding.
    key: String,
}

impl Target {
    /// `own`: hangwatch's mount table, for a target in its own namespace.
    fn new(wanted: &ProbeTarget, own: Option<&MountTable>) -> Self {
        let path = match wanted.in_root_of {
            // Another namespace's path is already absolute there (a mount point from its table).
            Some(_) => PathBuf::from(&wanted.path),
            None => absolute_lexically(Path::new(&wanted.path)),
        };
        let mount = wanted.mount.clone().or_else(|| match wanted.in_root_of {
            None => own.and_then(|t| mount_of(t, &path)),
            Some(_) => None,
        });
        let key = match (&wanted.filesystem, &mount, wanted.in_root_of) {
            (Some(id), _, _) => id.key.clone(),
            (None, Some(m), None) => m.mount.clone(),
            (None, Some(m), Some(pid)) => format!("{} in the namespace of pid {pid}", m.mount),
            (None, None, _) => path.to_string_lossy().into_owned(),
        };
        Target {
            path,
            mount,
            in_root_of: wanted.in_root_of,
            filesystem: wanted.filesystem.clone(),
            key,
        }
    }
}

fn probe_one(
    command: &ChildCommand,
    state: &mut MountState,
    target: &Target,
    options: &ProbeOptions,
) -> Result<ProbeResult, ProbeError> {
    let path = target.path.as_path();
    let mount = target.mount.as_ref();
    let path_text = path.to_string_lossy().into_owned();
    state.reap();
    if let Some(stuck) = &state.stuck {
        let mut result = still_stuck(&path_text, mount, stuck);
        result.filesystem = target.filesystem.clone();
        return Ok(result);
    }
    let request = ChildRequest {
        path: path.to_path_buf(),
        write: options.write,
        probe_file_name: format!(
            "{PROBE_FILE_PREFIX}{}-{}",
            std::process::id(),
            PROBE_SEQ.fetch_add(1, Ordering::Relaxed)
        ),
        cleanup: std::mem::take(&mut state.leftovers),
        in_root_of: target.in_root_of,
    };
    let mut cmd = command(&request);
    cmd.current_dir("/");
    let started = Instant::now();
    let outcome = run_with_deadline(cmd, options.timeout).map_err(|source| {
        state.leftovers = request.cleanup.clone();
        ProbeError::Child {
            path: path_text.clone(),
            source,
        }
    })?;
    let elapsed = started.elapsed();
    let (events, end, abandoned) = match outcome {
        ChildOutcome::Finished {
            status,
            stdout,
            stderr,
            ..
        } => (
            parse_events(&stdout),
            ChildEnd::Exited {
                code: status.code(),
                stderr: String::from_utf8_lossy(&stderr).into_owned(),
            },
            None,
        ),
        ChildOutcome::TimedOut { child, stdout, .. } => {
            (parse_events(&stdout), ChildEnd::TimedOut, Some(child))
        }
    };
    if let Some(mut child) = abandoned {
        let cleaned = events
            .iter()
            .any(|e| matches!(e, ChildEvent::End { step, outcome: StepOutcome::Ok, .. } if step == WRITE));
        if !cleaned {
            state.leftovers.extend(request.cleanup.iter().cloned());
        }
        let probe_file = events.iter().find_map(|e| match e {
            ChildEvent::Begin {
                step,
                target: Some(t),
            } if step == WRITE => Some(PathBuf::from(t)),
            _ => None,
        });
        let reaped = wait_briefly(&mut child);
        if reaped {
            state.leftovers.extend(probe_file);
        } else {
            let step = events.iter().rev().find_map(|e| match e {
                ChildEvent::Begin { step, .. } => Some(step.clone()),
                _ => None,
            });
            tracing::debug!(path = %path_text, pid = child.pid(), step = ?step, "probe child stuck; abandoned");
            state.stuck = Some(StuckProbe {
                child,
                step,
                probe_file,
            });
        }
    }
    match interpret(&path_text, mount, &events, &end, options.timeout, elapsed) {
        Interpretation::Result(mut result) => {
            result.filesystem = target.filesystem.clone();
            Ok(*result)
        }
        Interpretation::NotFound { reason } => Err(ProbeError::NotFound {
            path: path_text,
            reason,
        }),
    }
}

fn wait_briefly(child: &mut AbandonedChild) -> bool {
    let end = Instant::now() + REAP_GRACE;
    loop {
        if child.try_reap() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn still_stuck(path: &str, mount: Option<&MountRef>, stuck: &StuckProbe) -> ProbeResult {
    let age = stuck.child.started.elapsed();
    let step = stuck.step.as_deref();
    ProbeResult {
        filesystem: None,
        path: path.to_string(),
        mount: mount.map(|m| m.mount.clone()),
        fstype: mount.map(|m| m.fstype.clone()),
        source: mount.map(|m| m.source.clone()),
        responsive: Some(false),
        elapsed_ms: 0,
        detail: format!(
            "still stuck: a probe started {} ago has not returned{} (pid {})",
            format_limit(if age >= Duration::from_secs(1) {
                Duration::from_secs(age.as_secs())
            } else {
                Duration::from_millis(age.as_millis() as u64)
            }),
            step.map_or_else(String::new, |s| format!(" from {s}")),
            stuck.child.pid()
        ),
        steps: step
            .map(|s| ProbeStep {
                step: s.to_string(),
                outcome: "timeout".into(),
                elapsed_ms: age.as_millis() as u64,
            })
            .into_iter()
            .collect(),
    }
}

fn read_mount_table() -> Option<MountTable> {
    read_mount_table_at(Path::new("/proc/self/mountinfo"))
}

fn read_mount_table_at(file: &Path) -> Option<MountTable> {
    let text = std::fs::read_to_string(file).ok()?;
    parse_mountinfo(&text).ok()
}

fn mount_of(table: &MountTable, path: &Path) -> Option<MountRef> {
    table.containing(&path.to_string_lossy()).map(|m| MountRef {
        mount: m.mount_point.clone(),
        fstype: m.fstype.clone(),
        source: m.source.clone(),
    })
}

/// The absolute form of `path` without touching the filesystem (no symlink resolution: the child does that).
pub fn absolute_lexically(path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .unwrap_or_else(|_| PathBuf::from("/"))
            .join(path)
    };
    let mut out = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// The probe child's work: runs the steps on `request.path`, printing one [`ChildEvent`] per line as it goes.
/// Returns the process exit code (0: every step returned ok or skipped; 1: a step failed).
pub fn child_main(request: &ChildRequest) -> i32 {
    let mut stdout = std::io::stdout().lock();
    let mut emit = |event: &ChildEvent| {
        if let Ok(line) = serde_json::to_string(event) {
            let _ = writeln!(stdout, "{line}");
            let _ = stdout.flush();
        }
    };

    // In another namespace the path is reached through the process's root; canonicalizing it there would name
    // a path of hangwatch's own namespace, so it is only stat'ed (a mount point from mountinfo has no symlinks).
    let (fs_path, table_of) = match request.in_root_of {
        Some(pid) => (
            in_root_of(pid, &request.path),
            PathBuf::from(format!("/proc/{pid}/mountinfo")),
        ),
        None => (request.path.clone(), PathBuf::from("/proc/self/mountinfo")),
    };
    let mut resolved = None;
    let stat = run_step(&mut emit, STAT, None, || {
        match stat_path(&fs_path, request.in_root_of.is_none()) {
            Ok(found) => {
                resolved = Some(found);
                StepOutcome::Ok
            }
            Err(e) => io_outcome(&e),
        }
    });
    let (Some((real, is_dir)), true) = (resolved, stat) else {
        return 1;
    };
    let seen_as = match request.in_root_of {
        Some(_) => request.path.clone(),
        None => real.clone(),
    };
    if let Some(mount) = read_mount_table_at(&table_of).and_then(|t| mount_of(&t, &seen_as)) {
        emit(&ChildEvent::Mount {
            mount: mount.mount,
            fstype: mount.fstype,
            source: mount.source,
        });
    }
    let statfs = run_step(&mut emit, STATFS, None, || {
        match nix::sys::statfs::statfs(&real) {
            Ok(_) => StepOutcome::Ok,
            Err(errno) => io_outcome(&std::io::Error::from(errno)),
        }
    });

    let dir = if is_dir {
        real.clone()
    } else {
        real.parent()
            .map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
    };
    let probe_file = dir.join(&request.probe_file_name);
    let target = request
        .write
        .then(|| probe_file.to_string_lossy().into_owned());
    let mut wrote = false;
    let write = run_step(&mut emit, WRITE, target, || {
        if !request.write {
            return StepOutcome::Skipped {
                reason: "read-only probe (--read-only)".into(),
            };
        }
        match write_probe_file(&probe_file) {
            Ok(()) => {
                wrote = true;
                StepOutcome::Ok
            }
            Err(e) => match e.raw_os_error() {
                Some(libc::EROFS) => StepOutcome::Skipped {
                    reason: format!("read-only filesystem ({e})"),
                },
                Some(libc::EACCES) | Some(libc::EPERM) => StepOutcome::Skipped {
                    reason: format!("no permission to write in {} ({e})", dir.display()),
                },
                _ => io_outcome(&e),
            },
        }
    });
    if wrote {
        for file in &request.cleanup {
            let _ = std::fs::remove_file(file);
        }
    }
    i32::from(!(statfs && write))
}

/// Announces a step, runs it, reports how it came out; `false` when it failed.
fn run_step(
    emit: &mut impl FnMut(&ChildEvent),
    step: &str,
    target: Option<String>,
    run: impl FnOnce() -> StepOutcome,
) -> bool {
    emit(&ChildEvent::Begin {
        step: step.to_string(),
        target,
    });
    let started = Instant::now();
    let outcome = run();
    let ok = !matches!(outcome, StepOutcome::Error { .. });
    emit(&ChildEvent::End {
        step: step.to_string(),
        outcome,
        elapsed_ms: started.elapsed().as_millis() as u64,
    });
    ok
}

/// Resolves symlinks (this touches every component, so it is part of the timed step) and stats the result;
/// without `canonicalize`, only stats it.
fn stat_path(path: &Path, canonicalize: bool) -> std::io::Result<(PathBuf, bool)> {
    let real = if canonicalize {
        std::fs::canonicalize(path)?
    } else {
        path.to_path_buf()
    };
    let meta = std::fs::metadata(&real)?;
    Ok((real, meta.is_dir()))
}

/// `path` (absolute in the mount namespace of `pid`) as reached from any namespace: `/proc/PID/root/path`.
pub fn in_root_of(pid: i32, path: &Path) -> PathBuf {
    let mut out = PathBuf::from(format!("/proc/{pid}/root"));
    out.extend(
        path.components()
            .filter(|c| matches!(c, Component::Normal(_))),
    );
    out
}

/// Create, write, fsync and remove a hidden file: what a writer to this filesystem would have to get through.
fn write_probe_file(file: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)?;
    let written = f
        .write_all(b"hangwatch probe\n")
        .and_then(|()| f.sync_all());
    drop(f);
    let removed = std::fs::remove_file(file);
    written.and(removed)
}

fn io_outcome(e: &std::io::Error) -> StepOutcome {
    StepOutcome::Error {
        errno: e.raw_os_error(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext4() -> MountRef {
        MountRef {
            mount: "/data".into(),
            fstype: "ext4".into(),
            source: "/dev/loop0".into(),
        }
    }

    fn begin(step: &str) -> ChildEvent {
        ChildEvent::Begin {
            step: step.into(),
            target: None,
        }
    }

    fn ok(step: &str, ms: u64) -> ChildEvent {
        ChildEvent::End {
            step: step.into(),
            outcome: StepOutcome::Ok,
            elapsed_ms: ms,
        }
    }

    fn error(step: &str, errno: i32, message: &str) -> ChildEvent {
        ChildEvent::End {
            step: step.into(),
            outcome: StepOutcome::Error {
                errno: Some(errno),
                message: message.into(),
            },
            elapsed_ms: 1,
        }
    }

    fn exited() -> ChildEnd {
        ChildEnd::Exited {
            code: Some(0),
            stderr: String::new(),
        }
    }

    fn result(i: Interpretation) -> ProbeResult {
        match i {
            Interpretation::Result(r) => *r,
            other => panic!("expected a result, got {other:?}"),
        }
    }

    const TWO_S: Duration = Duration::from_secs(2);

    #[test]
    fn all_steps_returning_is_responsive() {
        let events = [
            begin(STAT),
            ok(STAT, 0),
            begin(STATFS),
            ok(STATFS, 0),
            begin(WRITE),
            ok(WRITE, 3),
        ];
        let r = result(interpret(
            "/data/x",
            Some(&ext4()),
            &events,
            &exited(),
            TWO_S,
            Duration::from_millis(9),
        ));
        assert_eq!(r.responsive, Some(true));
        assert_eq!(r.steps.len(), 3);
        assert_eq!(r.mount.as_deref(), Some("/data"));
        assert_eq!(
            human_line(&r),
            "/data/x: mount /data (ext4) responding (stat ok 0ms, statfs ok 0ms, write ok 3ms)"
        );
    }

    #[test]
    fn a_write_that_does_not_return_names_the_step_and_what_went_before() {
        let events = [
            begin(STAT),
            ok(STAT, 0),
            begin(STATFS),
            ok(STATFS, 0),
            begin(WRITE),
        ];
        let r = result(interpret(
            "/data/x",
            Some(&ext4()),
            &events,
            &ChildEnd::TimedOut,
            TWO_S,
            TWO_S,
        ));
        assert_eq!(r.responsive, Some(false));
        assert_eq!(r.detail, "write did not return within 2s");
        let last = r.steps.last().unwrap();
        assert_eq!(
            (last.step.as_str(), last.outcome.as_str(), last.elapsed_ms),
            (WRITE, "timeout", 2000)
        );
        assert_eq!(
            human_line(&r),
            "/data/x: mount /data (ext4) NOT RESPONDING: write did not return within 2s (stat ok 0ms, statfs ok 0ms)"
        );
    }

    #[test]
    fn a_stat_that_hangs_keeps_the_parents_mount() {
        let events = [begin(STAT)];
        let r = result(interpret(
            "/fuse",
            Some(&ext4()),
            &events,
            &ChildEnd::TimedOut,
            TWO_S,
            TWO_S,
        ));
        assert_eq!(r.responsive, Some(false));
        assert_eq!(r.detail, "stat did not return within 2s");
        assert_eq!(r.fstype.as_deref(), Some("ext4"));
    }

    #[test]
    fn the_childs_mount_wins_over_the_parents_guess() {
        let events = [
            ok(STAT, 0),
            ChildEvent::Mount {
                mount: "/real".into(),
                fstype: "nfs4".into(),
                source: "srv:/x".into(),
            },
            begin(STATFS),
        ];
        let r = result(interpret(
            "/link",
            Some(&ext4()),
            &events,
            &ChildEnd::TimedOut,
            TWO_S,
            TWO_S,
        ));
        assert_eq!(
            (r.mount.as_deref(), r.fstype.as_deref()),
            (Some("/real"), Some("nfs4"))
        );
    }

    #[test]
    fn a_child_that_never_started_is_unknown_not_unresponsive() {
        let r = result(interpret(
            "/x",
            None,
            &[],
            &ChildEnd::TimedOut,
            TWO_S,
            TWO_S,
        ));
        assert_eq!(r.responsive, None);
        assert!(r.detail.contains("did not start"), "{}", r.detail);
    }

    #[test]
    fn a_child_that_crashed_is_unknown_with_its_stderr() {
        let end = ChildEnd::Exited {
            code: Some(2),
            stderr: "error: unexpected argument\n".into(),
        };
        let r = result(interpret(
            "/x",
            None,
            &[],
            &end,
            TWO_S,
            Duration::from_millis(5),
        ));
        assert_eq!(r.responsive, None);
        assert!(
            r.detail.contains("exit code 2") && r.detail.contains("unexpected argument"),
            "{}",
            r.detail
        );
    }

    #[test]
    fn a_missing_path_is_not_found_not_a_filesystem_verdict() {
        let events = [
            begin(STAT),
            error(STAT, libc::ENOENT, "No such file or directory (os error 2)"),
        ];
        assert!(matches!(
            interpret("/nope", None, &events, &exited(), TWO_S, TWO_S),
            Interpretation::NotFound { .. }
        ));
    }

    #[test]
    fn io_errors_mean_broken_and_permission_errors_mean_unknown() {
        let eio = [error(STAT, libc::EIO, "Input/output error (os error 5)")];
        assert_eq!(
            result(interpret("/x", None, &eio, &exited(), TWO_S, TWO_S)).responsive,
            Some(false)
        );
        let enotconn = [
            ok(STAT, 0),
            error(
                STATFS,
                libc::ENOTCONN,
                "Transport endpoint is not connected",
            ),
        ];
        assert_eq!(
            result(interpret("/x", None, &enotconn, &exited(), TWO_S, TWO_S)).responsive,
            Some(false)
        );
        let eacces = [error(STAT, libc::EACCES, "Permission denied (os error 13)")];
        assert_eq!(
            result(interpret("/x", None, &eacces, &exited(), TWO_S, TWO_S)).responsive,
            None
        );
    }

    #[test]
    fn a_full_filesystem_still_answers() {
        let events = [
            ok(STAT, 0),
            ok(STATFS, 0),
            error(WRITE, libc::ENOSPC, "No space left on device"),
        ];
        let r = result(interpret("/x", None, &events, &exited(), TWO_S, TWO_S));
        assert_eq!(r.responsive, Some(true));
        assert!(r.detail.contains("No space left"), "{}", r.detail);
    }

    #[test]
    fn skipped_write_is_reported_and_does_not_spoil_the_verdict() {
        let skipped = ChildEvent::End {
            step: WRITE.into(),
            outcome: StepOutcome::Skipped {
                reason: "read-only filesystem".into(),
            },
            elapsed_ms: 0,
        };
        let events = [ok(STAT, 0), ok(STATFS, 0), skipped];
        let r = result(interpret("/x", None, &events, &exited(), TWO_S, TWO_S));
        assert_eq!(r.responsive, Some(true));
        assert_eq!(r.steps[2].outcome, "skipped: read-only filesystem");
    }

    #[test]
    fn events_round_trip_and_chatter_is_ignored() {
        let events = vec![begin(STAT), ok(STAT, 1)];
        let mut text = String::from("running 1 test\n");
        for e in &events {
            text.push_str(&serde_json::to_string(e).unwrap());
            text.push('\n');
        }
        text.push_str("{\"event\":\"half");
        assert_eq!(parse_events(text.as_bytes()), events);
    }

    #[test]
    fn request_arguments_end_with_the_path_after_a_separator() {
        let request = ChildRequest {
            in_root_of: None,
            path: "/-weird".into(),
            write: false,
            probe_file_name: ".hangwatch-probe-1-2".into(),
            cleanup: vec!["/a/.hangwatch-probe-1-1".into()],
        };
        let args: Vec<String> = request
            .to_args()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "--read-only",
                "--probe-file",
                ".hangwatch-probe-1-2",
                "--cleanup",
                "/a/.hangwatch-probe-1-1",
                "--",
                "/-weird"
            ]
        );
    }

    #[test]
    fn absolute_paths_are_normalised_without_touching_the_filesystem() {
        assert_eq!(
            absolute_lexically(Path::new("/a/./b/../c/")),
            PathBuf::from("/a/c")
        );
        assert_eq!(absolute_lexically(Path::new("/..")), PathBuf::from("/"));
        assert!(absolute_lexically(Path::new("rel")).is_absolute());
    }

    #[test]
    fn child_probes_a_healthy_directory_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(".hangwatch-probe-0-0");
        std::fs::write(&stale, b"left by a stuck child").unwrap();
        let request = ChildRequest {
            in_root_of: None,
            path: dir.path().to_path_buf(),
            write: true,
            probe_file_name: ".hangwatch-probe-test-1".into(),
            cleanup: vec![stale.clone()],
        };
        assert_eq!(child_main(&request), 0);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "probe and stale files are removed"
        );
    }
}
