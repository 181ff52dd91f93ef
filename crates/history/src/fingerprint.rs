//! The fingerprint of a verdict: what makes two hangs "the same cause", whichever node, rank, pid, run directory
//! or line number they happened at.
//!
//! Kept: the kind, and of the first culprit its system call, filesystem type, mount point, kernel wait and Python
//! frame. Left out on purpose: node, rank, pid, the file path under the mount (a log file per rank or per run),
//! line numbers (a code edit above the frame must not make a new cause), and the verdict's wording.
//!
//! Mount points are normalized ([`normalize_mount`]): a mount below a temporary directory (`/tmp`, `/var/tmp`,
//! `/dev/shm`, `/run/user/UID`) is per run by construction (a `mktemp -d` name, a Slurm job's private tmp), so the
//! first component below that directory becomes `*`; anywhere else, a run of 4 or more digits inside a component
//! (a job id, a pid, a date) becomes `*`. Site mounts (`/lustre`, `/gpfs/fs1`, `/mnt/nvme0n1`) are kept as they are.

use hangwatch_kernel::frames::{is_entry_frame, is_scheduler_frame};
use hangwatch_model::{Culprit, Verdict, VerdictKind};
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
}

impl Fingerprint {
    /// The fingerprint of `verdict`, from its first culprit (the one the summary names).
    pub fn of(verdict: &Verdict) -> Fingerprint {
        let culprit = verdict.culprits.first();
        Fingerprint {
            kind: verdict.kind,
            syscall: culprit.and_then(|c| non_empty(c.syscall.as_deref())),
            fstype: culprit.and_then(|c| non_empty(c.fstype.as_deref())),
            mount: culprit.and_then(|c| c.node_mount()).map(normalize_mount),
            kernel_wait: culprit.and_then(kernel_wait),
            python_frame: culprit.and_then(python_frame),
        }
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
        .join("\u{1f}")
    }

    /// A stable 16-hex-digit key (FNV-1a 64 of [`Fingerprint::canonical`]): the same on every machine and every
    /// version of hangwatch, unlike std's hasher.
    pub fn key(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.canonical().bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{hash:016x}")
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
        if text.is_empty() {
            "no culprit named".to_string()
        } else {
            text
        }
    }
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
