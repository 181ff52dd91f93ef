//! The fingerprint of a verdict: what makes two hangs "the same cause", whichever node, rank, pid, run directory
//! or line number they happened at.
//!
//! Kept: the kind, and of the first culprit its system call, filesystem type, mount point, kernel wait and Python
//! frame. Left out on purpose: node, rank, pid, the file path under the mount (a log file per rank or per run),
//! line numbers (a code edit above the frame must not make a new cause), and the verdict's wording.
//!
//! A recurrence is a cause, not a system call: only a culprit with a place has a fingerprint that can match
//! another verdict's ([`Fingerprint::for_recurrence`]). A place is a file or a mount, a meaningful kernel wait
//! (`percpu_rwsem_wait`, `request_wait_answer`: not a bare `futex`, `poll`, `epoll_wait` or `nanosleep`), a Python
//! frame outside the standard library, or, where no culprit has any of these, the collective the Flight Recorder
//! names. A verdict without one (a container client in `futex()`, rank unknown, no file) is recorded under a key
//! of its own ([`record_key`]) that nothing matches: "seen before" is never said of it. Keys of verdicts with a
//! place are those of every earlier version, so old rows of the same cause still match; a verdict without a place
//! matches no old row.
//!
//! Mount points are normalized ([`normalize_mount`]): a mount below a temporary directory (`/tmp`, `/var/tmp`,
//! `/dev/shm`, `/run/user/UID`) is per run by construction (a `mktemp -d` name, a Slurm job's private tmp), so the
//! first component below that directory becomes `*`; anywhere else, a run of 4 or more digits inside a component
//! (a job id, a pid, a date) becomes `*`. Site mounts (`/lustre`, `/gpfs/fs1`, `/mnt/nvme0n1`) are kept as they are.

use std::path::Path;

use hangwatch_kernel::frames::{is_entry_frame, is_scheduler_frame};
use hangwatch_model::{CollectiveFinding, Culprit, Verdict, VerdictKind};
use serde::{Deserialize, Serialize};

/// The cause of a hang, as far as recurrence goes. Every field but `kind` is `None` when the verdict does not
/// name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint {
    pub kind: VerdictKind,
    pub syscall: Option<String>,
    pub fstype: Option<String>,
    /// The culprit's mount point, normalized ([`normalize_mount`]).
    pub mount: Option<String>,
    /// The kernel function the culprit waits in: its wchan, else the first meaningful kernel-stack frame.
    pub kernel_wait: Option<String>,
    /// The culprit's meaningful Python frame: `function (file.py)`, no directory, no line number.
    pub python_frame: Option<String>,
    /// The collective the Flight Recorder names (`all_reduce (group 0)`), only where no culprit has a place of
    /// its own (then it is the place). Not stored in the history's columns: rows read back have `None` (the key
    /// holds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<String>,
}

/// What starts the key of a verdict without a place ([`record_key`]): never a fingerprint's key (16 hex digits).
pub const PLACELESS_KEY_PREFIX: &str = "noplace-";

impl Fingerprint {
    /// The fingerprint of `verdict`, from its first culprit (the one the summary names).
    /// Also for a verdict without a place: its cause in words, what `run` and alerts tell one hang's looks
    /// apart by. Whether it may match another verdict is [`Fingerprint::for_recurrence`]'s.
    pub fn of(verdict: &Verdict) -> Fingerprint {
        let culprit = verdict.culprits.first();
        let mut fingerprint = Fingerprint {
            kind: verdict.kind,
            syscall: culprit.and_then(|c| non_empty(c.syscall.as_deref())),
            fstype: culprit.and_then(|c| non_empty(c.fstype.as_deref())),
            mount: culprit.and_then(|c| c.node_mount()).map(normalize_mount),
            kernel_wait: culprit.and_then(kernel_wait),
            python_frame: culprit.and_then(python_frame),
            collective: None,
        };
        if !culprit.is_some_and(has_place) {
            fingerprint.collective = collective(verdict);
        }
        fingerprint
    }

    /// The fingerprint a recurrence is matched by, `None` when the verdict names no place of its culprit (see the
    /// module documentation): two hangs whose only common trait is a `futex()` wait are not one cause.
    pub fn for_recurrence(verdict: &Verdict) -> Option<Fingerprint> {
        let fingerprint = Fingerprint::of(verdict);
        (verdict.culprits.first().is_some_and(has_place) || fingerprint.collective.is_some())
            .then_some(fingerprint)
    }

    /// The fields in a fixed order, `-` for a missing one: the text [`Fingerprint::key`] hashes.
    pub fn canonical(&self) -> String {
        let field = |f: &Option<String>| f.clone().unwrap_or_else(|| "-".to_string());
        [
            self.kind.as_str().to_string(),
            field(&self.syscall),
            field(&self.fstype),
            field(&self.mount),
            field(&self.kernel_wait),
            field(&self.python_frame),
        ]
        .into_iter()
        .chain(self.collective.clone())
        .collect::<Vec<_>>()
        .join("\u{1f}")
    }

    /// A stable 16-hex-digit key (FNV-1a 64 of [`Fingerprint::canonical`]): the same on every machine and every
    /// version of hangwatch, unlike std's hasher.
    pub fn key(&self) -> String {
        format!("{:016x}", fnv1a(&self.canonical()))
    }

    /// The cause in words: `write() on /shared (ext4), waiting in percpu_rwsem_wait, at write_log (rank.py)`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match (&self.syscall, &self.mount) {
            (Some(call), Some(mount)) => parts.push(format!("{call}() on {mount}")),
            (Some(call), None) => parts.push(format!("{call}()")),
            (None, Some(mount)) => parts.push(format!("on {mount}")),
            (None, None) => {}
        }
        if let Some(fstype) = &self.fstype {
            parts.push(format!("({fstype})"));
        }
        let mut text = parts.join(" ");
        if let Some(wait) = &self.kernel_wait {
            push_clause(&mut text, &format!("waiting in {wait}"));
        }
        if let Some(frame) = &self.python_frame {
            push_clause(&mut text, &format!("at {frame}"));
        }
        if let Some(collective) = &self.collective {
            push_clause(&mut text, &format!("in collective {collective}"));
        }
        if text.is_empty() {
            "no culprit named".to_string()
        } else {
            text
        }
    }
}

/// The key `verdict` is recorded under: its fingerprint's when it has one for recurrence, else
/// [`PLACELESS_KEY_PREFIX`] and a hash of this recording (node, time, job, bundle, cause), which no other verdict
/// has, here or in the fleet database: every lookup by key then finds nothing earlier, with no change to a query
/// or a schema, and a placeless row is listed as a cause of its own.
pub fn record_key(
    verdict: &Verdict,
    node: &str,
    job_id: Option<&str>,
    bundle: Option<&Path>,
    at_unix_s: f64,
) -> String {
    if let Some(fingerprint) = Fingerprint::for_recurrence(verdict) {
        return fingerprint.key();
    }
    let recording = [
        Fingerprint::of(verdict).canonical(),
        node.to_string(),
        job_id.unwrap_or("-").to_string(),
        bundle.map_or_else(|| "-".to_string(), |b| b.to_string_lossy().into_owned()),
        format!("{:016x}", at_unix_s.to_bits()),
    ]
    .join("\u{1f}");
    format!("{PLACELESS_KEY_PREFIX}{:016x}", fnv1a(&recording))
}

/// Whether `key` is one [`record_key`] gave a verdict without a place: it is never a recurrence of anything.
pub fn is_placeless_key(key: &str) -> bool {
    key.starts_with(PLACELESS_KEY_PREFIX)
}

fn fnv1a(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Whether the culprit names a place: a file, a mount, a kernel wait that is not a bare one, or a Python frame
/// outside the standard library. Its system call alone never is.
fn has_place(culprit: &Culprit) -> bool {
    let file = culprit
        .path
        .as_deref()
        .is_some_and(|p| p.trim_start().starts_with('/'));
    file || culprit.node_mount().is_some()
        || kernel_wait(culprit).is_some_and(|w| !is_bare_wait(&w))
        || (python_frame(culprit).is_some() && has_own_python_frame(culprit))
}

/// Kernel waits that say only "asleep on something of the process's own" (a lock, a condition variable, a poll
/// set, a timer, a signal, a child, a pipe, a socket): the same in every unrelated hang.
const BARE_WAITS: &[&str] = &[
    "do_futex",
    "ep_poll",
    "do_epoll_wait",
    "do_sys_poll",
    "do_poll",
    "poll_schedule_timeout",
    "do_select",
    "core_sys_select",
    "do_nanosleep",
    "hrtimer_nanosleep",
    "common_nsleep",
    "do_sigtimedwait",
    "sigsuspend",
    "sys_pause",
    "do_signal_stop",
    "ptrace_stop",
    "get_signal",
    "do_wait",
    "kernel_wait4",
    "pipe_read",
    "pipe_write",
    "anon_pipe_read",
    "anon_pipe_write",
    "pipe_wait_readable",
    "pipe_wait_writable",
    "wait_woken",
    "sk_wait_data",
    "inet_csk_accept",
    "inet_wait_for_connect",
    "unix_stream_read_generic",
    "unix_stream_data_wait",
    "sk_stream_wait_memory",
    "__skb_wait_for_more_packets",
];

/// Families of bare waits, by prefix: every futex function, and a system call's own entry point.
const BARE_WAIT_PREFIXES: &[&str] = &["futex_", "__futex", "__x64_sys_", "__arm64_sys_"];

/// Whether a kernel wait is a bare one (`BARE_WAITS`).
pub fn is_bare_wait(wait: &str) -> bool {
    let wait = wait.trim();
    BARE_WAITS.contains(&wait) || BARE_WAIT_PREFIXES.iter().any(|p| wait.starts_with(p))
}

/// Whether some frame of the culprit's Python stack is outside the standard library (the job's code, a
/// package): a thread parked in `threading.py` alone is a bare wait too.
fn has_own_python_frame(culprit: &Culprit) -> bool {
    culprit.python_stack.as_deref().is_some_and(|stack| {
        stack.iter().any(|frame| {
            let file = frame
                .rsplit_once(" (")
                .map_or(frame.as_str(), |(_, f)| f.trim_end_matches(')'));
            let stdlib = file.starts_with("<frozen")
                || ((file.contains("/lib/python") || file.contains("/lib64/python"))
                    && !file.contains("site-packages/")
                    && !file.contains("dist-packages/"));
            !stdlib
        })
    })
}

/// The first Flight Recorder finding's collective: `all_reduce (group 0)`, no sequence number (one per run).
fn collective(verdict: &Verdict) -> Option<String> {
    let finding = verdict.collectives.as_ref()?.findings.first()?;
    let call = match finding {
        CollectiveFinding::NeverJoined { call, .. } | CollectiveFinding::AllIn { call, .. } => call,
        CollectiveFinding::Mismatch { usual, .. } => usual,
    };
    Some(format!(
        "{} (group {})",
        call.op.as_deref().unwrap_or("collective"),
        call.group
    ))
}

fn push_clause(text: &mut String, clause: &str) {
    if !text.is_empty() {
        text.push_str(", ");
    }
    text.push_str(clause);
}

fn non_empty(s: Option<&str>) -> Option<String> {
    s.map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// The culprit's wchan, else the first kernel-stack frame that is not a generic scheduling or entry frame
/// (`/proc/PID/stack` prints `[<0>] vfs_write+0x1a2/0x3c0`: only the function name is kept).
fn kernel_wait(culprit: &Culprit) -> Option<String> {
    let wchan = non_empty(culprit.wchan.as_deref()).filter(|w| w != "0");
    wchan.or_else(|| {
        culprit
            .kernel_stack
            .as_deref()?
            .iter()
            .map(|frame| frame_function(frame))
            .find(|f| !f.is_empty() && !is_scheduler_frame(f) && !is_entry_frame(f))
            .map(str::to_string)
    })
}

/// `vfs_write` from `[<0>] vfs_write+0x1a2/0x3c0` (or from `vfs_write` itself).
fn frame_function(frame: &str) -> &str {
    let frame = frame.trim();
    let frame = match frame.strip_prefix("[<") {
        Some(rest) => rest.split_once("]").map_or(rest, |(_, f)| f).trim(),
        None => frame,
    };
    frame.split(['+', ' ']).next().unwrap_or(frame)
}

/// `write_log (rank.py)` from the culprit's `where` (`write_log (/check/tests/python/rank.py:216)` as well). Only
/// when the culprit has a Python stack: otherwise `where` is its kernel wait, already in the fingerprint.
fn python_frame(culprit: &Culprit) -> Option<String> {
    if culprit.python_stack.as_ref().is_none_or(Vec::is_empty) {
        return None;
    }
    let place = culprit.where_.trim();
    if place.is_empty() {
        return None;
    }
    let Some((function, rest)) = place.split_once(" (") else {
        return Some(place.to_string());
    };
    let file = rest.strip_suffix(')').unwrap_or(rest);
    let file = file.rsplit('/').next().unwrap_or(file);
    let file = match file.rsplit_once(':') {
        Some((name, line)) if line.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => file,
    };
    Some(format!("{} ({file})", function.trim()))
}

/// Directories whose subdirectories are made per run (see the module documentation).
const TEMP_ROOTS: &[&str] = &["/tmp", "/var/tmp", "/dev/shm"];

/// The mount point with its run-specific parts replaced by `*` (see the module documentation).
pub fn normalize_mount(mount: &str) -> String {
    let trimmed = mount.trim().trim_end_matches('/');
    if trimmed.is_empty() {
        return "/".to_string();
    }
    let parts: Vec<&str> = trimmed.split('/').collect();
    let per_run = per_run_component(&parts);
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            if Some(i) == per_run {
                "*".to_string()
            } else {
                mask_digit_runs(part)
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The index of the component made per run: the one right below a temporary directory.
fn per_run_component(parts: &[&str]) -> Option<usize> {
    for root in TEMP_ROOTS {
        let root: Vec<&str> = root.split('/').collect();
        if parts.len() > root.len() && parts[..root.len()] == root[..] {
            return Some(root.len());
        }
    }
    (parts.len() > 4 && parts[..3] == ["", "run", "user"]).then_some(4)
}

/// `job_*` from `job_123456`: runs of 4 or more digits become `*`; shorter ones (`nvme0n1`, `fs1`) stay.
fn mask_digit_runs(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        if digits.len() >= 4 {
            out.push('*');
        } else {
            out.push_str(digits);
        }
        digits.clear();
    };
    for c in part.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Verdict {
        let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("fixture");
        serde_json::from_str(&text).expect("a verdict")
    }

    #[test]
    fn a_frozen_write_is_fingerprinted_without_run_specific_parts() {
        let fp = Fingerprint::of(&fixture("blocked-write-n1.json"));
        assert_eq!(
            fp,
            Fingerprint {
                kind: VerdictKind::BlockedInKernel,
                syscall: Some("write".into()),
                fstype: Some("ext4".into()),
                mount: Some("/tmp/*/mnt".into()),
                kernel_wait: Some("percpu_rwsem_wait".into()),
                python_frame: Some("write_log (rank.py)".into()),
                collective: None,
            }
        );
        assert_eq!(
            fp.describe(),
            "write() on /tmp/*/mnt (ext4), waiting in percpu_rwsem_wait, at write_log (rank.py)"
        );
    }

    #[test]
    fn the_same_frozen_mount_on_another_node_rank_and_run_is_the_same_cause() {
        // n1/rank 0 under /tmp/hangwatch-ext4-Zcpfyc, n2/rank 1 under /tmp/hangwatch-ext4-MxQt0E.
        let a = fixture("blocked-write-n1.json");
        let b = fixture("blocked-write-n2.json");
        assert_ne!(a.culprits[0].node, b.culprits[0].node);
        assert_ne!(a.culprits[0].rank, b.culprits[0].rank);
        assert_ne!(a.culprits[0].mount, b.culprits[0].mount);
        assert_eq!(Fingerprint::of(&a), Fingerprint::of(&b));
        assert_eq!(Fingerprint::of(&a).key(), Fingerprint::of(&b).key());
    }

    #[test]
    fn a_different_kind_or_place_is_a_different_cause() {
        let blocked = Fingerprint::of(&fixture("blocked-write-n1.json"));
        let diverged = Fingerprint::of(&fixture("diverged-load-batch.json"));
        assert_eq!(diverged.kind, VerdictKind::Diverged);
        assert_eq!(diverged.syscall.as_deref(), Some("futex"));
        assert_eq!(diverged.mount, None);
        assert_eq!(
            diverged.python_frame.as_deref(),
            Some("load_batch (rank.py)")
        );
        assert_ne!(blocked.key(), diverged.key());

        let mut other_fs = blocked.clone();
        other_fs.mount = Some("/lustre".into());
        assert_ne!(blocked.key(), other_fs.key());
    }

    #[test]
    fn the_key_is_stable_across_versions() {
        // Changing this value orphans every recorded history: only ever on purpose, with a schema migration.
        assert_eq!(
            Fingerprint::of(&fixture("blocked-write-n1.json")).key(),
            KEY_OF_FROZEN_WRITE
        );
        let unknown = Fingerprint::of(&Verdict::unknown("nothing"));
        assert_eq!(
            unknown.canonical(),
            "unknown\u{1f}-\u{1f}-\u{1f}-\u{1f}-\u{1f}-"
        );
        assert_eq!(unknown.key(), KEY_OF_UNKNOWN);
        assert_eq!(unknown.describe(), "no culprit named");
    }

    const KEY_OF_UNKNOWN: &str = "eeeefbd43278b41d";
    const KEY_OF_FROZEN_WRITE: &str = "c6eaf0efe35bee1b";

    #[test]
    fn python_frames_lose_directories_and_line_numbers() {
        let mut verdict = fixture("diverged-load-batch.json");
        let c = &mut verdict.culprits[0].at;
        c.where_ = "barrier (torch/distributed/distributed_c10d.py:4159)".into();
        assert_eq!(
            Fingerprint::of(&verdict).python_frame.as_deref(),
            Some("barrier (distributed_c10d.py)")
        );
        let c = &mut verdict.culprits[0].at;
        c.python_stack = None;
        c.where_ = "futex_do_wait".into();
        assert_eq!(Fingerprint::of(&verdict).python_frame, None);
    }

    #[test]
    fn the_kernel_wait_falls_back_to_the_first_meaningful_frame() {
        let mut verdict = fixture("blocked-write-n1.json");
        verdict.culprits[0].at.wchan = None;
        verdict.culprits[0].kernel_stack = Some(vec![
            "[<0>] __schedule+0x2f0/0x800".into(),
            "[<0>] schedule+0x27/0x80".into(),
            "[<0>] request_wait_answer+0x13f/0x220 [fuse]".into(),
            "[<0>] entry_SYSCALL_64_after_hwframe+0x76/0x7e".into(),
        ]);
        assert_eq!(
            Fingerprint::of(&verdict).kernel_wait.as_deref(),
            Some("request_wait_answer")
        );
        verdict.culprits[0].kernel_stack = None;
        assert_eq!(Fingerprint::of(&verdict).kernel_wait, None);
    }

    /// A verdict recorded by `hangwatch` (n1, 2026-11-30), at `at` on `node`, for [`record_key`].
    fn key_of(name: &str, node: &str, at: f64) -> String {
        record_key(&fixture(name), node, Some("4242"), None, at)
    }

    #[test]
    fn a_futex_wait_with_no_place_has_no_fingerprint_and_is_no_recurrence() {
        // Issue 36: a podman client in futex(), rank unknown, no file, no mount, matched as a recurrence of an
        // unrelated hang that also waited in a futex.
        let podman = fixture("podman-client-futex.json");
        let trainer = fixture("native-trainer-futex.json");
        for verdict in [&podman, &trainer] {
            assert_eq!(
                Fingerprint::for_recurrence(verdict),
                None,
                "{}",
                verdict.summary
            );
            assert_eq!(Fingerprint::of(verdict).syscall.as_deref(), Some("futex"));
        }
        let (a, b) = (
            key_of("podman-client-futex.json", "n1", 1.0),
            key_of("native-trainer-futex.json", "n7", 2.0),
        );
        assert!(is_placeless_key(&a) && is_placeless_key(&b), "{a} {b}");
        assert_ne!(a, b);
        // Not even the same verdict recorded again (another run, another time) matches it.
        assert_ne!(a, key_of("podman-client-futex.json", "n1", 3.0));
        assert_ne!(a, key_of("podman-client-futex.json", "n2", 1.0));
        // The cause still reads in words.
        assert_eq!(
            Fingerprint::of(&podman).describe(),
            "futex(), waiting in futex_do_wait"
        );
    }

    #[test]
    fn a_culprit_with_a_place_keeps_the_key_of_every_earlier_version() {
        let frozen = fixture("blocked-write-n1.json");
        assert_eq!(
            Fingerprint::for_recurrence(&frozen).map(|f| f.key()),
            Some(KEY_OF_FROZEN_WRITE.to_string())
        );
        assert_eq!(
            key_of("blocked-write-n1.json", "n1", 1.0),
            KEY_OF_FROZEN_WRITE
        );
        assert_eq!(
            key_of("blocked-write-n2.json", "n2", 9.0),
            KEY_OF_FROZEN_WRITE
        );
        // A futex wait in the job's own code is a place: load_batch (rank.py).
        let diverged = fixture("diverged-load-batch.json");
        assert_eq!(
            Fingerprint::for_recurrence(&diverged),
            Some(Fingerprint::of(&diverged))
        );
    }

    #[test]
    fn a_mount_or_a_file_is_a_place_without_any_frame() {
        let mut a = fixture("podman-client-futex.json");
        a.kind = VerdictKind::BlockedInKernel;
        let c = &mut a.culprits[0].at;
        c.syscall = Some("write".into());
        c.wchan = None;
        c.state = "D".into();
        c.mount = Some("/tmp/hangwatch-ext4-Zcpfyc/mnt".into());
        c.fstype = Some("ext4".into());
        a.culprits[0].kernel_stack = None;
        let mut b = a.clone();
        b.culprits[0].at.mount = Some("/tmp/hangwatch-ext4-MxQt0E/mnt".into());
        b.culprits[0].at.pid = 77;
        let (fa, fb) = (
            Fingerprint::for_recurrence(&a),
            Fingerprint::for_recurrence(&b),
        );
        assert!(fa.is_some());
        assert_eq!(fa, fb, "the same frozen mount, another run");
        let mut other = a.clone();
        other.culprits[0].at.mount = Some("/lustre".into());
        assert_ne!(
            Fingerprint::for_recurrence(&other).map(|f| f.key()),
            fa.map(|f| f.key())
        );
        let mut file = fixture("podman-client-futex.json");
        file.culprits[0].at.path = Some("/data/main_log.txt".into());
        assert!(Fingerprint::for_recurrence(&file).is_some());
        let mut socket = fixture("podman-client-futex.json");
        socket.culprits[0].at.path = Some("socket:[1644988]".into());
        assert_eq!(Fingerprint::for_recurrence(&socket), None);
    }

    #[test]
    fn bare_waits_are_not_places_and_filesystem_waits_are() {
        for bare in [
            "futex_do_wait",
            "futex_wait_queue",
            "futex_wait_queue_me",
            "do_futex",
            "ep_poll",
            "do_epoll_wait",
            "do_sys_poll",
            "poll_schedule_timeout",
            "do_select",
            "hrtimer_nanosleep",
            "do_nanosleep",
            "do_wait",
            "pipe_read",
            "wait_woken",
            "sk_wait_data",
            "do_signal_stop",
        ] {
            assert!(is_bare_wait(bare), "{bare}");
            let mut v = fixture("podman-client-futex.json");
            v.culprits[0].at.wchan = Some(bare.into());
            assert_eq!(Fingerprint::for_recurrence(&v), None, "{bare}");
        }
        for place in [
            "percpu_rwsem_wait",
            "request_wait_answer",
            "nfs_wait_bit_killable",
            "rpc_wait_bit_killable",
            "folio_wait_bit_common",
            "jbd2_log_wait_commit",
        ] {
            assert!(!is_bare_wait(place), "{place}");
            let mut v = fixture("podman-client-futex.json");
            v.culprits[0].at.wchan = Some(place.into());
            assert!(Fingerprint::for_recurrence(&v).is_some(), "{place}");
        }
    }

    #[test]
    fn a_python_stack_only_in_the_standard_library_is_no_place() {
        let mut v = fixture("podman-client-futex.json");
        let c = &mut v.culprits[0].at;
        c.where_ = "wait (threading.py)".into();
        c.python_stack = Some(vec![
            "wait (/usr/lib/python3.11/threading.py:327)".into(),
            "join (/usr/lib/python3.11/threading.py:1119)".into(),
            "_bootstrap (<frozen importlib._bootstrap>:1)".into(),
        ]);
        assert_eq!(Fingerprint::for_recurrence(&v), None);
        v.culprits[0]
            .at
            .python_stack
            .as_mut()
            .unwrap()
            .push("train (/opt/venv/lib/python3.11/site-packages/trainer/loop.py:88)".into());
        assert!(Fingerprint::for_recurrence(&v).is_some());
    }

    #[test]
    fn a_collective_is_the_place_of_a_verdict_without_one_on_its_culprit() {
        use hangwatch_model::{CollectiveAnalysis, CollectiveCall};
        let finding = |op: &str| CollectiveFinding::AllIn {
            call: CollectiveCall {
                group: "0".into(),
                seq: 1234,
                op: Some(op.into()),
                shape: None,
            },
            ranks: vec![0, 1],
            not_completed: vec![1],
        };
        let mut hang = Verdict::unknown("all 2 ranks wait in all_reduce");
        hang.kind = VerdictKind::CollectiveHang;
        assert_eq!(Fingerprint::for_recurrence(&hang), None);
        hang.collectives = Some(CollectiveAnalysis {
            findings: vec![finding("all_reduce")],
            unanswered: Vec::new(),
        });
        let all_reduce = Fingerprint::for_recurrence(&hang).expect("a collective is a place");
        assert_eq!(
            all_reduce.collective.as_deref(),
            Some("all_reduce (group 0)")
        );
        assert!(all_reduce
            .describe()
            .contains("in collective all_reduce (group 0)"));
        let mut barrier = hang.clone();
        barrier.collectives = Some(CollectiveAnalysis {
            findings: vec![finding("barrier")],
            unanswered: Vec::new(),
        });
        let barrier = Fingerprint::for_recurrence(&barrier).expect("a place");
        assert_ne!(all_reduce.key(), barrier.key());
        // A culprit with a place of its own keeps its key: the collective is not added to it.
        let mut frozen = fixture("blocked-write-n1.json");
        frozen.collectives = hang.collectives.clone();
        assert_eq!(
            Fingerprint::for_recurrence(&frozen).map(|f| f.key()),
            Some(KEY_OF_FROZEN_WRITE.to_string())
        );
    }

    #[test]
    fn mounts_keep_site_names_and_lose_run_names() {
        for (mount, normalized) in [
            ("/tmp/hangwatch-ext4-Zcpfyc/mnt", "/tmp/*/mnt"),
            ("/var/tmp/slurm-4242/data/", "/var/tmp/*/data"),
            ("/dev/shm/x", "/dev/shm/*"),
            ("/run/user/1000/gvfs", "/run/user/*/*"),
            ("/tmp", "/tmp"),
            ("/lustre", "/lustre"),
            ("/gpfs/fs1", "/gpfs/fs1"),
            ("/mnt/nvme0n1", "/mnt/nvme0n1"),
            ("/scratch/job_123456/ckpt", "/scratch/job_*/ckpt"),
            ("/", "/"),
        ] {
            assert_eq!(normalize_mount(mount), normalized, "{mount}");
        }
    }
}
