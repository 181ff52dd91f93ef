//! One-line kernel messages worth reporting next to hung tasks: NVIDIA Xid errors, filesystem complaints (NFS,
//! Lustre, GPFS, CIFS, Ceph, ext4, XFS, block I/O), OOM kills, and the end of hung-task reporting.

use serde::{Deserialize, Serialize};

use hangwatch_model::kernel_log::{ComplaintKind, Filesystem, OomKill, Timestamp};

/// `Future hung task reports are suppressed, see sysctl kernel.hung_task_warnings`
pub fn is_suppression(text: &str) -> bool {
    text.contains("Future hung task reports are suppressed")
}

/// `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XidEvent {
    pub time: Timestamp,
    /// PCI address of the GPU (`0000:3b:00`).
    pub pci: String,
    pub code: u32,
    /// The process the driver blames, when printed.
    pub pid: Option<u32>,
    pub process: Option<String>,
    /// The driver's text after the code and pid/name fields.
    pub message: String,
}

pub fn parse_xid(time: Timestamp, text: &str) -> Option<XidEvent> {
    let at = text.find("NVRM: Xid (")?;
    let rest = &text[at + "NVRM: Xid (".len()..];
    let (pci, rest) = rest.split_once(')')?;
    let pci = pci.trim().trim_start_matches("PCI:").to_string();
    let rest = rest.trim_start_matches([':', ',']).trim_start();
    let digits_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let code: u32 = rest[..digits_end].parse().ok()?;
    let mut rest = rest[digits_end..].trim_start_matches(',').trim_start();
    let mut pid = None;
    let mut process = None;
    loop {
        if let Some(after) = rest.strip_prefix("pid=") {
            let (value, tail) = after.split_once(',').unwrap_or((after, ""));
            pid = value.trim().parse().ok();
            rest = tail.trim_start();
        } else if let Some(after) = rest.strip_prefix("name=") {
            let (value, tail) = after.split_once(',').unwrap_or((after, ""));
            let value = value.trim();
            if !value.is_empty() && value != "<unknown>" {
                process = Some(value.to_string());
            }
            rest = tail.trim_start();
        } else {
            break;
        }
    }
    Some(XidEvent {
        time,
        pci,
        code,
        pid,
        process,
        message: rest.trim().to_string(),
    })
}

/// What a well-known Xid means and what to do, in a few words.
pub fn xid_meaning(code: u32) -> Option<&'static str> {
    let text = match code {
        13 => "graphics engine exception: usually the application (illegal memory access, bad kernel)",
        31 => "GPU memory page fault: usually the application (illegal address)",
        43 => "GPU stopped processing: the channel was reset after an application fault",
        45 => "preemptive cleanup after earlier errors: the process was killed",
        48 => "double-bit ECC error: the GPU needs a reset; drain the node if it repeats",
        61 => "internal micro-controller breakpoint/warning: reset the GPU",
        62 => "internal micro-controller halt: reset the GPU",
        63 => "ECC page retirement or row remapping recorded: reset the GPU when convenient",
        64 => "ECC page retirement or row remapping failed: drain the node, the GPU may need replacing",
        68 => "video processor exception",
        74 => "NVLink error: check the NVLink/NVSwitch fabric; reset the GPUs",
        79 => "GPU has fallen off the bus: drain the node; the GPU needs a reset or replacement",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error: only the affected application was stopped",
        95 => "uncontained ECC error: every process on the GPU is affected; reset the GPU",
        119 => "GSP RPC timeout: the GPU firmware stopped answering; reset the GPU",
        120 => "GSP error: the GPU firmware failed; reset the GPU",
        _ => return None,
    };
    Some(text)
}

/// A filesystem or storage complaint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FsComplaint {
    pub time: Timestamp,
    /// `None` for block-device I/O errors.
    pub filesystem: Option<Filesystem>,
    pub kind: ComplaintKind,
    /// Server, target or device the message names (`nfs01`, `scratch-OST0003`, `sda1`).
    pub target: Option<String>,
    pub message: String,
}

pub fn parse_fs_complaint(time: Timestamp, text: &str) -> Option<FsComplaint> {
    let text = text.trim();
    let make = |filesystem, kind, target: Option<&str>| FsComplaint {
        time,
        filesystem,
        kind,
        target: target.map(str::to_string),
        message: text.to_string(),
    };
    for prefix in ["nfs: server ", "lockd: server "] {
        if let Some(rest) = text.strip_prefix(prefix) {
            let (server, tail) = rest.split_once(' ')?;
            let kind = if tail.starts_with("not responding, timed out") {
                ComplaintKind::TimedOut
            } else if tail.starts_with("not responding") {
                ComplaintKind::NotResponding
            } else if tail.starts_with("OK") {
                ComplaintKind::Recovered
            } else {
                return None;
            };
            return Some(make(Some(Filesystem::Nfs), kind, Some(server)));
        }
    }
    if let Some(rest) = text.strip_prefix("LustreError: ") {
        return Some(make(
            Some(Filesystem::Lustre),
            ComplaintKind::Error,
            lustre_target(rest).as_deref(),
        ));
    }
    if let Some(rest) = text.strip_prefix("Lustre: ") {
        let kind = if rest.contains(": Connection to ") && rest.contains(" was lost") {
            ComplaintKind::ConnectionLost
        } else if rest.contains(": Connection restored to ") {
            ComplaintKind::Recovered
        } else {
            return None;
        };
        return Some(make(
            Some(Filesystem::Lustre),
            kind,
            lustre_target(rest).as_deref(),
        ));
    }
    for prefix in ["mmfs: ", "mmfs26: ", "mmfslinux: "] {
        if let Some(rest) = text.strip_prefix(prefix) {
            let bad = rest.contains("[E]")
                || rest.contains("[X]")
                || has_word(rest, "error")
                || rest.contains("expel");
            return bad.then(|| make(Some(Filesystem::Gpfs), ComplaintKind::Error, None));
        }
    }
    if let Some(rest) = text.strip_prefix("CIFS: VFS: ") {
        let (server, tail) = rest.split_once(' ')?;
        return tail.starts_with("has not responded").then(|| {
            make(
                Some(Filesystem::Cifs),
                ComplaintKind::NotResponding,
                Some(server),
            )
        });
    }
    if let Some(rest) = text.strip_prefix("libceph: ") {
        let (who, _) = rest.split_once(' ')?;
        let kind = if rest.contains("session lost") {
            ComplaintKind::ConnectionLost
        } else if rest.contains("session established") {
            ComplaintKind::Recovered
        } else {
            return None;
        };
        return Some(make(Some(Filesystem::Ceph), kind, Some(who)));
    }
    if let Some(rest) = text.strip_prefix("ceph: ") {
        let (who, tail) = rest.split_once(' ')?;
        return (tail == "hung").then(|| {
            make(
                Some(Filesystem::Ceph),
                ComplaintKind::NotResponding,
                Some(who),
            )
        });
    }
    if let Some(rest) = text.strip_prefix("EXT4-fs error (device ") {
        let device = rest.split(')').next();
        return Some(make(Some(Filesystem::Ext4), ComplaintKind::Error, device));
    }
    if let Some(rest) = text.strip_prefix("EXT4-fs (") {
        let (device, tail) = rest.split_once("): ")?;
        let bad = tail.contains("Remounting filesystem read-only")
            || has_word(tail, "error")
            || tail.contains("Aborting journal");
        return bad.then(|| make(Some(Filesystem::Ext4), ComplaintKind::Error, Some(device)));
    }
    if let Some(rest) = text.strip_prefix("XFS (") {
        let (device, tail) = rest.split_once("): ")?;
        let bad = tail.contains("Shutting down")
            || tail.contains("shut down")
            || has_word(tail, "error")
            || tail.contains("Corruption");
        return bad.then(|| make(Some(Filesystem::Xfs), ComplaintKind::Error, Some(device)));
    }
    if text.starts_with("Buffer I/O error on dev")
        || text.contains(": I/O error, dev ")
        || text.starts_with("I/O error, dev ")
    {
        let device = text
            .split_once(" dev ")
            .map(|(_, d)| d.trim_start().split([',', ' ']).next().unwrap_or(""))
            .filter(|d| !d.is_empty());
        return Some(make(None, ComplaintKind::IoError, device));
    }
    None
}

/// `scratch-OST0003-osc-ffff9a0c1b2d3000: ...` -> `scratch-OST0003`; `11-0: ` message codes skipped.
fn lustre_target(rest: &str) -> Option<String> {
    let mut rest = rest;
    if let Some((code, after)) = rest.split_once(": ") {
        if code.bytes().all(|c| c.is_ascii_digit() || c == b'-') {
            rest = after;
        }
    }
    let (name, _) = rest.split_once(": ")?;
    if name.is_empty() || name.contains(' ') || name.contains('(') || !name.contains('-') {
        return None;
    }
    let mut target = name;
    for client in ["-osc-", "-mdc-", "-lwp-", "-mgc-", "-clilov-", "-clilmv-"] {
        if let Some(at) = name.find(client) {
            target = &name[..at];
            break;
        }
    }
    Some(target.to_string())
}

/// `error` as a word (not `errors=remount-ro`).
fn has_word(text: &str, word: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '=' || c == '_'))
        .any(|w| w.eq_ignore_ascii_case(word))
}

pub fn parse_oom_kill(time: Timestamp, text: &str) -> Option<OomKill> {
    let at = text.find("Killed process ")?;
    let rest = &text[at + "Killed process ".len()..];
    let (pid, rest) = rest.split_once(' ')?;
    let pid = pid.parse().ok()?;
    let rest = rest.strip_prefix('(')?;
    let (comm, _) = rest.split_once(')')?;
    Some(OomKill {
        time,
        pid,
        comm: comm.to_string(),
        cgroup: text.starts_with("Memory cgroup out of memory"),
    })
}

/// The kernel's summary line of an OOM kill, printed just before `Killed process`:
/// `oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=/job,task_memcg=/job,task=python,pid=4242,uid=0`. It names
/// the memory cgroup whose limit was hit, which a zombie's `/proc/PID/cgroup` no longer does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomConstraint {
    pub pid: u32,
    /// `CONSTRAINT_MEMCG` (a cgroup's limit), `CONSTRAINT_NONE` (the node's memory), ...
    pub constraint: Option<String>,
    /// The cgroup whose limit was hit, and the one the killed task was in.
    pub oom_memcg: Option<String>,
    pub task_memcg: Option<String>,
}

/// Finds an `oom-kill:` summary anywhere in `text` (a raw `/dev/kmsg` record included).
pub fn parse_oom_constraint(text: &str) -> Option<OomConstraint> {
    let at = text.find("oom-kill:")?;
    let fields = &text[at + "oom-kill:".len()..];
    let field = |key: &str| {
        fields.split(',').find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == key && !v.is_empty() && v != "(null)").then(|| v.to_string())
        })
    };
    Some(OomConstraint {
        pid: field("pid")?.parse().ok()?,
        constraint: field("constraint"),
        oom_memcg: field("oom_memcg"),
        task_memcg: field("task_memcg"),
    })
}

/// The process a fault killed or signalled: `python[4242]: segfault at 0 ip ... error 4 in libc.so.6[...]`,
/// `traps: python[4242] general protection fault ip:...`, `python[4242] trap invalid opcode ip:...`: its pid.
pub fn parse_user_fault(text: &str) -> Option<u32> {
    let text = text.trim();
    let text = text.strip_prefix("traps: ").unwrap_or(text);
    let open = text.find('[')?;
    let (pid, rest) = text[open + 1..].split_once(']')?;
    let pid = pid.parse().ok()?;
    let fault = rest.starts_with(": segfault at ")
        || rest.starts_with(" general protection fault")
        || rest.starts_with(" trap ");
    (open > 0 && fault).then_some(pid)
}

/// `oom_reaper: reaped process 4242 (python), now anon-rss:0kB, ...`: the pid.
pub fn parse_oom_reaped(text: &str) -> Option<u32> {
    let at = text.find("oom_reaper: reaped process ")?;
    let rest = &text[at + "oom_reaper: reaped process ".len()..];
    rest.split(' ').next()?.parse().ok()
}

/// The user an OOM line names: `UID:1001` in a `Killed process` line of recent kernels, `uid=1001` in the
/// `oom-kill:` summary.
pub fn oom_uid(text: &str) -> Option<u32> {
    let digits = |rest: &str| -> Option<u32> {
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    if let Some(at) = text.find(" UID:") {
        return digits(&text[at + " UID:".len()..]);
    }
    let at = text.find("oom-kill:")?;
    text[at..]
        .split(',')
        .find_map(|kv| kv.trim().strip_prefix("uid=").and_then(digits))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> Timestamp {
        Timestamp::default()
    }

    #[test]
    fn xid_with_pid_and_name() {
        let x = parse_xid(
            t(),
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        )
        .unwrap();
        assert_eq!(
            (x.pci.as_str(), x.code, x.pid, x.process.as_deref()),
            ("0000:3b:00", 79, Some(1234), Some("python"))
        );
        assert_eq!(x.message, "GPU has fallen off the bus.");
        assert!(xid_meaning(79).unwrap().contains("fallen off the bus"));
    }

    #[test]
    fn xid_older_forms() {
        let x = parse_xid(t(), "NVRM: Xid (PCI:0000:07:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1): Out Of Range Address").unwrap();
        assert_eq!((x.code, x.pid), (13, None));
        assert_eq!(
            x.message,
            "Graphics SM Warp Exception on (GPC 0, TPC 1): Out Of Range Address"
        );
        let x = parse_xid(
            t(),
            "NVRM: Xid (0000:82:00): 62, pid='<unknown>', name=<unknown>, 0000(0000) 00000000",
        )
        .unwrap();
        assert_eq!(
            (x.pci.as_str(), x.code, x.pid, x.process),
            ("0000:82:00", 62, None, None)
        );
        assert_eq!(
            parse_xid(
                t(),
                "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  525.60.13"
            ),
            None
        );
    }

    #[test]
    fn nfs_not_responding_and_ok() {
        let c = parse_fs_complaint(t(), "nfs: server fs01.cluster not responding, still trying")
            .unwrap();
        assert_eq!(
            (c.filesystem, c.kind, c.target.as_deref()),
            (
                Some(Filesystem::Nfs),
                ComplaintKind::NotResponding,
                Some("fs01.cluster")
            )
        );
        let c = parse_fs_complaint(t(), "nfs: server fs01.cluster OK").unwrap();
        assert_eq!(c.kind, ComplaintKind::Recovered);
        let c = parse_fs_complaint(t(), "nfs: server fs01 not responding, timed out").unwrap();
        assert_eq!(c.kind, ComplaintKind::TimedOut);
    }

    #[test]
    fn lustre_messages() {
        let c = parse_fs_complaint(
            t(),
            "LustreError: 11-0: scratch-OST0003-osc-ffff9a0c1b2d3000: operation ost_write to node 10.0.0.3@o2ib failed: rc = -107",
        )
        .unwrap();
        assert_eq!(
            (c.kind, c.target.as_deref()),
            (ComplaintKind::Error, Some("scratch-OST0003"))
        );
        let c = parse_fs_complaint(
            t(),
            "Lustre: scratch-MDT0000-mdc-ffff8d2c3a2b9000: Connection to scratch-MDT0000 (at 10.0.0.2@o2ib) was lost; in progress operations using this service will wait for recovery to complete",
        )
        .unwrap();
        assert_eq!(
            (c.kind, c.target.as_deref()),
            (ComplaintKind::ConnectionLost, Some("scratch-MDT0000"))
        );
        let c = parse_fs_complaint(t(), "Lustre: scratch-MDT0000-mdc-ffff8d2c3a2b9000: Connection restored to 10.0.0.2@o2ib (at 10.0.0.2@o2ib)")
            .unwrap();
        assert_eq!(
            (c.kind, c.target.as_deref()),
            (ComplaintKind::Recovered, Some("scratch-MDT0000"))
        );
        let c = parse_fs_complaint(
            t(),
            "LustreError: 2345:0:(file.c:12:ll_foo()) something broke",
        )
        .unwrap();
        assert_eq!(c.target, None);
        assert_eq!(
            parse_fs_complaint(t(), "Lustre: Lustre: Build Version: 2.12.9"),
            None
        );
    }

    #[test]
    fn local_filesystem_and_block_errors() {
        let c = parse_fs_complaint(t(), "EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0").unwrap();
        assert_eq!(
            (c.kind, c.target.as_deref()),
            (ComplaintKind::Error, Some("sda1"))
        );
        assert_eq!(
            parse_fs_complaint(t(), "EXT4-fs (sda1): re-mounted. Opts: errors=remount-ro"),
            None
        );
        assert_eq!(
            parse_fs_complaint(
                t(),
                "EXT4-fs (sda1): mounted filesystem with ordered data mode."
            ),
            None
        );
        let c = parse_fs_complaint(t(), "XFS (dm-0): log I/O error -5").unwrap();
        assert_eq!(c.target.as_deref(), Some("dm-0"));
        let c = parse_fs_complaint(
            t(),
            "blk_update_request: I/O error, dev sdb, sector 1234 op 0x1:(WRITE)",
        )
        .unwrap();
        assert_eq!(
            (c.filesystem, c.kind, c.target.as_deref()),
            (None, ComplaintKind::IoError, Some("sdb"))
        );
        assert_eq!(parse_fs_complaint(t(), "CIFS PidTable: buckets 64"), None);
    }

    #[test]
    fn oom_constraint_names_the_memory_cgroup() {
        let line = "3,4112,247233929,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,\
                    oom_memcg=/hw-probe,task_memcg=/hw-probe,task=python3,pid=7927,uid=0";
        assert_eq!(
            parse_oom_constraint(line),
            Some(OomConstraint {
                pid: 7927,
                constraint: Some("CONSTRAINT_MEMCG".into()),
                oom_memcg: Some("/hw-probe".into()),
                task_memcg: Some("/hw-probe".into()),
            })
        );
        assert_eq!(
            parse_oom_constraint("oom-kill:constraint=CONSTRAINT_NONE"),
            None
        );
        assert_eq!(
            parse_oom_constraint("Out of memory: Killed process 1 (x)"),
            None
        );
    }

    #[test]
    fn oom_kills() {
        let o = parse_oom_kill(
            t(),
            "Out of memory: Killed process 1234 (python) total-vm:123kB, anon-rss:1kB",
        )
        .unwrap();
        assert_eq!((o.pid, o.comm.as_str(), o.cgroup), (1234, "python", false));
        let o = parse_oom_kill(
            t(),
            "Memory cgroup out of memory: Killed process 99 (pt_main_thread) total-vm:1kB",
        )
        .unwrap();
        assert!(o.cgroup);
        assert_eq!(
            parse_oom_kill(
                t(),
                "Out of memory: Kill process 1234 (python) score 900 or sacrifice child"
            ),
            None
        );
    }

    #[test]
    fn faults_name_their_process() {
        assert_eq!(
            parse_user_fault(
                "python3[4242]: segfault at 0 ip 00007f sp 00007ffe error 4 in libc.so.6[7f+1000]"
            ),
            Some(4242)
        );
        assert_eq!(
            parse_user_fault(
                "traps: pt_main_thread[77] general protection fault ip:7f sp:7ffe error:0"
            ),
            Some(77)
        );
        assert_eq!(
            parse_user_fault("a.out[9] trap invalid opcode ip:40 sp:7ffe error:0"),
            Some(9)
        );
        assert_eq!(parse_user_fault("[4242]: segfault at 0"), None);
        assert_eq!(parse_user_fault("usb 1-1[3]: new device"), None);
        assert_eq!(
            parse_oom_reaped(
                "oom_reaper: reaped process 4242 (python), now anon-rss:0kB, file-rss:0kB"
            ),
            Some(4242)
        );
        assert_eq!(
            oom_uid("Memory cgroup out of memory: Killed process 4242 (python) total-vm:1kB, UID:1001 pgtables:4kB"),
            Some(1001)
        );
        assert_eq!(
            oom_uid("oom-kill:constraint=CONSTRAINT_MEMCG,task=python3,pid=7927,uid=1001"),
            Some(1001)
        );
        assert_eq!(oom_uid("Out of memory: Killed process 1 (x)"), None);
    }

    #[test]
    fn suppression_line() {
        assert!(is_suppression(
            "Future hung task reports are suppressed, see sysctl kernel.hung_task_warnings"
        ));
        assert!(!is_suppression("kvm_arch_init: 54 callbacks suppressed"));
    }
}
