//! The pure half of `doctor`: facts in, a checklist out. Every check yields one [`Finding`], passed or not, with
//! what was seen, what it costs in a hang and the exact fix; [`startup_warnings`] picks what `run` says at start.

use hangwatch_model::coarse_duration_text;
use serde::{Deserialize, Serialize};

use crate::facts::{Access, HostFacts, PathRole, SysctlValue};
use crate::slurm_conf::{names_ours, PrologScript, UnreadFile, INSTALLED_TASK_PROLOG};

/// A collective or watchdog timeout above this (30 min) is "huge": GPUs idle that long before anything ends.
pub const HUGE_TIMEOUT_S: u64 = 30 * 60;
/// Below this `net.unix.max_dgram_qlen` is flagged: one message each from 8 ranks and 7 DataLoader workers per
/// rank (64 senders) sending at the same moment must fit while hangwatch's receiving thread waits for a CPU.
pub const MIN_DGRAM_QLEN: i64 = 64;
/// The value the fix sets: what systemd's `sysctl.d/50-default.conf` sets on most distributions.
pub const RECOMMENDED_DGRAM_QLEN: i64 = 512;

/// How bad a failed check is. Ordered worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// hangwatch cannot see or act: a verdict without the culprit's stack or kernel wait, or evidence lost.
    Blind,
    /// A hang would go unnoticed or unreported by the kernel or PyTorch.
    Silent,
    /// Worth changing; hangwatch copes without it.
    Advice,
}

impl Severity {
    pub fn heading(self) -> &'static str {
        match self {
            Severity::Blind => "Blind (hangwatch could not see or act)",
            Severity::Silent => "Silent (a hang would go unreported)",
            Severity::Advice => "Advice",
        }
    }
}

/// What was checked. The `snake_case` names are stable: scripts and tests match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// May hangwatch read the ranks' memory (Python stacks)?
    Ptrace,
    /// May hangwatch read `/proc/PID/stack` (the kernel function a rank waits in)?
    KernelStacks,
    /// May hangwatch follow the kernel log (hung tasks, GPU Xid errors, NFS complaints)?
    KernelLog,
    /// Does hangwatch run inside a container, and may it see the ranks' namespaces from there?
    Container,
    /// Is the evidence written to a node-local filesystem?
    ReportDir,
    /// Does the kernel have a hung-task detector, switched on?
    HungTaskDetector,
    /// Has the kernel reports left?
    HungTaskWarnings,
    /// Does PyTorch end a rank whose NCCL collective failed or timed out?
    NcclAsyncErrorHandling,
    /// Does PyTorch end a rank whose NCCL watchdog is itself stuck?
    NcclMonitoring,
    /// Are the collective and watchdog timeouts in the environment reasonable?
    CollectiveTimeout,
    /// Does a hung task panic the node?
    HungTaskPanic,
    /// Is the heartbeat socket's queue long enough for bursts?
    UnixDgramQueue,
    /// Blocking wait moves the collective timeout into the training thread.
    NcclBlockingWait,
    /// `NCCL_TIMEOUT` is set, which nothing reads.
    NcclTimeoutUnread,
    /// Is the job's log file on a node-local filesystem?
    LogDir,
    /// Is the verdict history on a node-local filesystem?
    StateDir,
    /// Is the hangwatch binary on a node-local filesystem?
    Binary,
    /// Is the current directory on a node-local filesystem?
    CurrentDir,
    /// On a node with the node service: does Slurm run hangwatch's TaskProlog before each task?
    TaskProlog,
}

/// One line of the checklist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub check: Check,
    /// For a failed check: how bad. For a passed one: the class it belongs to (for grouping the checklist).
    pub severity: Severity,
    pub ok: bool,
    /// What was seen, with the observed value.
    pub what: String,
    /// What it costs in a hang (for a passed check: why it matters).
    pub why: String,
    /// The exact command or setting that fixes it; `None` for a passed check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    fn pass(check: Check, severity: Severity, what: impl Into<String>, why: &str) -> Self {
        Finding {
            check,
            severity,
            ok: true,
            what: what.into(),
            why: why.into(),
            fix: None,
        }
    }

    fn fail(
        check: Check,
        severity: Severity,
        what: impl Into<String>,
        why: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Finding {
            check,
            severity,
            ok: false,
            what: what.into(),
            why: why.into(),
            fix: Some(fix.into()),
        }
    }

    /// A fact that could not be read: not a problem found, so never Blind or Silent (not said at `run`'s start).
    fn unknown(check: Check, what: impl Into<String>, why: &str, fix: impl Into<String>) -> Self {
        Finding::fail(check, Severity::Advice, what, why, fix)
    }

    /// A failed Blind or Silent check: what `run` says at start, and what makes `doctor` exit 1.
    pub fn is_problem(&self) -> bool {
        !self.ok && self.severity <= Severity::Silent
    }
}

/// The checklist for these facts: one finding per check that applies, in [`Check`] order.
pub fn diagnose(facts: &HostFacts) -> Vec<Finding> {
    let mut out = vec![ptrace(facts), kernel_stacks(facts), kernel_log(facts)];
    out.extend(container(facts));
    out.extend(path_check(facts, PathRole::ReportDir));
    out.push(hung_task_detector(facts));
    out.extend(hung_task_warnings(facts));
    out.push(nccl_async_error_handling(facts));
    out.push(nccl_monitoring(facts));
    out.push(collective_timeout(facts));
    out.extend(hung_task_panic(facts));
    out.push(unix_dgram_queue(facts));
    out.push(nccl_blocking_wait(facts));
    out.extend(nccl_timeout_unread(facts));
    for role in [
        PathRole::LogDir,
        PathRole::StateDir,
        PathRole::Binary,
        PathRole::CurrentDir,
    ] {
        out.extend(path_check(facts, role));
    }
    out.extend(task_prolog(facts));
    out
}

/// The findings `hangwatch run` says before the job starts: the failed Blind and Silent ones.
pub fn startup_warnings(findings: &[Finding]) -> Vec<&Finding> {
    findings.iter().filter(|f| f.is_problem()).collect()
}

fn is_root(facts: &HostFacts) -> bool {
    facts.euid == Some(0)
}

const PTRACE_WHY: &str =
    "the Python stack of each rank is read from its memory (process_vm_readv); without that \
     right a verdict names the rank and its kernel call but not the line of Python it is stuck on";

fn ptrace(facts: &HostFacts) -> Finding {
    const C: Check = Check::Ptrace;
    const S: Severity = Severity::Blind;
    let scope = &facts.sysctls.ptrace_scope;
    let capable = facts.capabilities.is_some_and(|c| c.sys_ptrace);
    if scope.value() == Some(3) {
        return Finding::fail(
            C,
            S,
            "kernel.yama.ptrace_scope=3: no process may read another's memory, root included",
            PTRACE_WHY,
            "scope 3 cannot be lowered until reboot: put kernel.yama.ptrace_scope=1 in /etc/sysctl.d/10-ptrace.conf and reboot",
        );
    }
    if is_root(facts) || capable {
        let who = if is_root(facts) {
            "root"
        } else {
            "CAP_SYS_PTRACE"
        };
        return Finding::pass(
            C,
            S,
            format!("{who}: the memory of every rank can be read"),
            PTRACE_WHY,
        );
    }
    let Some(uid) = facts.euid else {
        return Finding::unknown(
            C,
            "cannot tell who this process is (/proc/self/status unreadable)",
            PTRACE_WHY,
            "check that /proc is mounted",
        );
    };
    match scope {
        SysctlValue::Missing | SysctlValue::Value(0) => Finding::pass(
            C,
            S,
            format!("uid {uid}, {}: ranks of the same user can be read", scope_words(scope)),
            PTRACE_WHY,
        ),
        SysctlValue::Value(1) => Finding::pass(
            C,
            S,
            format!(
                "uid {uid}, kernel.yama.ptrace_scope=1: the ranks `hangwatch run` starts are its descendants and can \
                 be read; `hangwatch dump` of a job started otherwise cannot (run it as root)"
            ),
            PTRACE_WHY,
        ),
        SysctlValue::Value(v) => Finding::fail(
            C,
            S,
            format!("uid {uid} without CAP_SYS_PTRACE, kernel.yama.ptrace_scope={v}: no rank's memory can be read"),
            PTRACE_WHY,
            "setcap cap_sys_ptrace+ep $(which hangwatch)   (or: sysctl -w kernel.yama.ptrace_scope=1)",
        ),
        SysctlValue::Unreadable(e) => Finding::unknown(
            C,
            format!("uid {uid} without CAP_SYS_PTRACE, and kernel.yama.ptrace_scope cannot be read ({e})"),
            PTRACE_WHY,
            "setcap cap_sys_ptrace+ep $(which hangwatch)",
        ),
    }
}

/// hangwatch inside a container sees only that container's processes; a rank in another container (its own pid
/// and mount namespaces) is invisible, and reading its mounts (`/proc/PID/root`, `mountinfo`) needs ptrace
/// rights over it.
fn container(facts: &HostFacts) -> Option<Finding> {
    const WHY: &str = "ranks in containers have their own pids and mounts: hangwatch names their files, mounts and \
                       filesystems through /proc/PID/root and /proc/PID/mountinfo, which it can read only for \
                       processes it can see and may trace";
    if !facts.in_container? {
        return Some(Finding::pass(
            Check::Container,
            Severity::Advice,
            "hangwatch runs in the node's pid namespace: it sees every rank, in a container or not",
            WHY,
        ));
    }
    let ptrace = facts.capabilities.is_some_and(|c| c.sys_ptrace);
    let fix = "run `hangwatch run` inside the ranks' own container (it then watches the ranks it starts), or run \
               hangwatch on the node: outside the container, or in one that shares the node's pid namespace \
               (docker/podman --pid=host, Kubernetes hostPID: true) with CAP_SYS_PTRACE (--cap-add SYS_PTRACE, \
               securityContext.capabilities.add: [SYS_PTRACE]); see docs/containers.md";
    Some(if ptrace {
        Finding::pass(
            Check::Container,
            Severity::Advice,
            "hangwatch runs inside a container, with CAP_SYS_PTRACE: it sees the ranks of the pid namespace it \
             shares, and their mounts",
            WHY,
        )
    } else {
        Finding::fail(
            Check::Container,
            Severity::Advice,
            "hangwatch runs inside a container without CAP_SYS_PTRACE: it sees only ranks of its own container \
             and its own user, and cannot read the mounts of ranks in other containers",
            WHY,
            fix,
        )
    })
}

fn scope_words(scope: &SysctlValue) -> &'static str {
    match scope {
        SysctlValue::Missing => "no Yama ptrace restrictions",
        _ => "kernel.yama.ptrace_scope=0",
    }
}

const KSTACK_WHY: &str = "/proc/PID/stack is readable with CAP_SYS_ADMIN only; without it a verdict names the kernel \
     function a stuck rank waits in by wchan alone, not the whole kernel stack (the NFS, FUSE or block-layer calls \
     that say why)";

fn kernel_stacks(facts: &HostFacts) -> Finding {
    const C: Check = Check::KernelStacks;
    const S: Severity = Severity::Blind;
    match (facts.capabilities, facts.euid) {
        (Some(caps), _) if caps.sys_admin => Finding::pass(
            C,
            S,
            "CAP_SYS_ADMIN: kernel stacks of the ranks can be read",
            KSTACK_WHY,
        ),
        (None, Some(0)) => Finding::pass(C, S, "root: kernel stacks of the ranks can be read", KSTACK_WHY),
        (_, Some(uid)) => Finding::fail(
            C,
            S,
            format!(
                "uid {uid}{} without CAP_SYS_ADMIN: kernel stacks (/proc/PID/stack) cannot be read",
                if uid == 0 { " (a container without the capability)" } else { "" }
            ),
            KSTACK_WHY,
            "run hangwatch as root (sudo hangwatch run ...), or setcap cap_sys_admin,cap_sys_ptrace+ep $(which hangwatch) \
             (CAP_SYS_ADMIN is broad: only on nodes dedicated to the job)",
        ),
        (_, None) => Finding::unknown(
            C,
            "cannot tell who this process is (/proc/self/status unreadable)",
            KSTACK_WHY,
            "check that /proc is mounted",
        ),
    }
}

const KMSG_WHY: &str =
    "the kernel's hung-task reports, GPU Xid errors and \"nfs: server not responding\" lines \
     confirm and explain a hang; without the kernel log the verdict goes without them";

fn kernel_log(facts: &HostFacts) -> Finding {
    const C: Check = Check::KernelLog;
    const S: Severity = Severity::Blind;
    let restrict = match facts.sysctls.dmesg_restrict.value() {
        Some(v) => format!("kernel.dmesg_restrict={v}"),
        None => "kernel.dmesg_restrict unknown".into(),
    };
    match &facts.kmsg {
        Access::Readable => Finding::pass(C, S, format!("/dev/kmsg is readable ({restrict})"), KMSG_WHY),
        Access::Denied => {
            let why_denied = if facts.sysctls.dmesg_restrict.value() == Some(1) {
                "kernel.dmesg_restrict=1 and no CAP_SYSLOG"
            } else {
                "permission denied"
            };
            Finding::fail(
                C,
                S,
                format!("/dev/kmsg is not readable ({why_denied})"),
                KMSG_WHY,
                "sysctl -w kernel.dmesg_restrict=0 (and in /etc/sysctl.d/ to keep it), or setcap cap_syslog+ep $(which hangwatch)",
            )
        }
        Access::Missing => Finding::fail(
            C,
            S,
            "/dev/kmsg does not exist (a container without it?)",
            KMSG_WHY,
            "give the container the device: docker run --device /dev/kmsg (or mount it from the host)",
        ),
        Access::Failed(e) => Finding::unknown(
            C,
            format!("/dev/kmsg could not be opened: {e} ({restrict})"),
            KMSG_WHY,
            "check that hangwatch may open /dev/kmsg for reading",
        ),
    }
}

const HUNG_WHY: &str =
    "the kernel's hung-task detector reports a task stuck in D state in the kernel log, with \
     its stack: the record that outlives the job and that admins look for";

fn hung_task_detector(facts: &HostFacts) -> Finding {
    const C: Check = Check::HungTaskDetector;
    const S: Severity = Severity::Silent;
    match &facts.sysctls.hung_task_timeout_secs {
        SysctlValue::Missing => Finding::fail(
            C,
            S,
            "kernel.hung_task_timeout_secs does not exist: this kernel has no hung-task detector",
            format!("{HUNG_WHY}; here a rank stuck in D state is never reported by the kernel"),
            "use a kernel built with CONFIG_DETECT_HUNG_TASK=y (most distribution kernels are)",
        ),
        SysctlValue::Value(0) => Finding::fail(
            C,
            S,
            "kernel.hung_task_timeout_secs=0: the hung-task detector is off",
            format!("{HUNG_WHY}; here a rank stuck in D state is never reported by the kernel"),
            "sysctl -w kernel.hung_task_timeout_secs=120 (and in /etc/sysctl.d/ to keep it)",
        ),
        SysctlValue::Value(v) if u64::try_from(*v).is_ok_and(|v| v > HUGE_TIMEOUT_S) => Finding::fail(
            C,
            S,
            format!("kernel.hung_task_timeout_secs={v}: a stuck task is reported only after {}", coarse_duration_text(*v as u64)),
            format!("{HUNG_WHY}; the kernel's report comes long after the job is ended"),
            "sysctl -w kernel.hung_task_timeout_secs=120",
        ),
        SysctlValue::Value(v) => Finding::pass(
            C,
            S,
            format!("kernel.hung_task_timeout_secs={v}: a task stuck in D state is reported after {v} s"),
            HUNG_WHY,
        ),
        SysctlValue::Unreadable(e) => Finding::unknown(
            C,
            format!("kernel.hung_task_timeout_secs cannot be read: {e}"),
            HUNG_WHY,
            "cat /proc/sys/kernel/hung_task_timeout_secs",
        ),
    }
}

fn hung_task_warnings(facts: &HostFacts) -> Option<Finding> {
    const C: Check = Check::HungTaskWarnings;
    const S: Severity = Severity::Silent;
    const WHY: &str = "the kernel prints only kernel.hung_task_warnings hung-task reports (10 per boot by default), \
         then \"Future hung task reports are suppressed\"";
    Some(match &facts.sysctls.hung_task_warnings {
        SysctlValue::Missing => return None,
        SysctlValue::Value(0) => Finding::fail(
            C,
            S,
            "kernel.hung_task_warnings=0: the kernel's hung-task reports are used up; it reports no more until reboot",
            WHY,
            "sysctl -w kernel.hung_task_warnings=-1   (unlimited; or 10)",
        ),
        SysctlValue::Value(-1) => Finding::pass(C, S, "kernel.hung_task_warnings=-1: unlimited reports", WHY),
        SysctlValue::Value(v) => Finding::pass(C, S, format!("kernel.hung_task_warnings={v}: {v} reports left"), WHY),
        SysctlValue::Unreadable(e) => Finding::unknown(
            C,
            format!("kernel.hung_task_warnings cannot be read: {e}"),
            WHY,
            "cat /proc/sys/kernel/hung_task_warnings",
        ),
    })
}

fn hung_task_panic(facts: &HostFacts) -> Option<Finding> {
    const C: Check = Check::HungTaskPanic;
    const S: Severity = Severity::Advice;
    const WHY: &str = "with kernel.hung_task_panic=1 a rank stuck in D state (on a frozen filesystem) panics the \
         whole node after hung_task_timeout_secs: every job on it dies and the verdict may never be sent";
    match facts.sysctls.hung_task_panic.value()? {
        0 => Some(Finding::pass(C, S, "kernel.hung_task_panic=0", WHY)),
        v => Some(Finding::fail(
            C,
            S,
            format!("kernel.hung_task_panic={v}: a hung task panics the node"),
            WHY,
            "sysctl -w kernel.hung_task_panic=0 (unless this site wants stuck nodes to reboot)",
        )),
    }
}

fn unix_dgram_queue(facts: &HostFacts) -> Finding {
    const C: Check = Check::UnixDgramQueue;
    const S: Severity = Severity::Advice;
    const WHY: &str = "the heartbeat socket holds net.unix.max_dgram_qlen + 1 datagrams whatever its buffer size; \
         when many ranks and DataLoader workers send at once while hangwatch's receiving thread waits for a CPU, \
         beats are dropped and log records wait in the ranks";
    match &facts.sysctls.max_dgram_qlen {
        SysctlValue::Value(v) if *v < MIN_DGRAM_QLEN => Finding::fail(
            C,
            S,
            format!("net.unix.max_dgram_qlen={v} (the kernel's default is 10; at least {MIN_DGRAM_QLEN} wanted)"),
            WHY,
            format!("sysctl -w net.unix.max_dgram_qlen={RECOMMENDED_DGRAM_QLEN} (and in /etc/sysctl.d/ to keep it)"),
        ),
        SysctlValue::Value(v) => Finding::pass(C, S, format!("net.unix.max_dgram_qlen={v}"), WHY),
        other => Finding::unknown(
            C,
            format!("net.unix.max_dgram_qlen cannot be read: {}", sysctl_words(other)),
            WHY,
            "cat /proc/sys/net/unix/max_dgram_qlen",
        ),
    }
}

fn sysctl_words(value: &SysctlValue) -> String {
    match value {
        SysctlValue::Value(v) => v.to_string(),
        SysctlValue::Missing => "missing".into(),
        SysctlValue::Unreadable(e) => e.clone(),
    }
}

/// The value PyTorch reads for a variable that has a deprecated `NCCL_` alias: the `TORCH_` name first.
fn torch_var<'a>(facts: &'a HostFacts, name: &'a str) -> Option<(&'a str, &'a str)> {
    let alias = name.strip_prefix("TORCH_")?;
    [name, alias]
        .into_iter()
        .find_map(|n| facts.env.get(n).map(|v| (n, v.as_str())))
}

fn nccl_async_error_handling(facts: &HostFacts) -> Finding {
    const C: Check = Check::NcclAsyncErrorHandling;
    const S: Severity = Severity::Silent;
    const WHY: &str = "PyTorch's NCCL watchdog ends a rank whose collective failed or passed its timeout; with \
         handling off, the peers of a dead or stuck rank wait in NCCL forever and nothing is logged";
    const FIX: &str = "export TORCH_NCCL_ASYNC_ERROR_HANDLING=3   (PyTorch's default; or unset it)";
    match torch_var(facts, "TORCH_NCCL_ASYNC_ERROR_HANDLING") {
        None => Finding::pass(
            C,
            S,
            "TORCH_NCCL_ASYNC_ERROR_HANDLING unset: PyTorch's default (3: end the process on a collective error or timeout)",
            WHY,
        ),
        Some((name, value)) => match value.trim() {
            "0" => Finding::fail(
                C,
                S,
                format!("{name}=0: PyTorch does not act on a failed or timed-out NCCL collective"),
                WHY,
                FIX,
            ),
            "1" | "2" | "3" => Finding::pass(C, S, format!("{name}={value}"), WHY),
            _ => Finding::fail(
                C,
                Severity::Advice,
                format!("{name}={value:?}: not a mode PyTorch knows (0-3)"),
                WHY,
                FIX,
            ),
        },
    }
}

fn is_false(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "0" | "false" | "no" | "n" | "off"
    )
}

fn is_true(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "y" | "on"
    )
}

fn nccl_monitoring(facts: &HostFacts) -> Finding {
    const C: Check = Check::NcclMonitoring;
    const S: Severity = Severity::Silent;
    const WHY: &str = "PyTorch's monitoring thread ends the process when the NCCL watchdog itself is stuck in a CUDA \
         or NCCL call (a wedged GPU or driver); without it such a rank hangs forever";
    match facts.env.get("TORCH_NCCL_ENABLE_MONITORING") {
        Some(value) if is_false(value) => Finding::fail(
            C,
            S,
            format!("TORCH_NCCL_ENABLE_MONITORING={value}: nothing ends a rank whose NCCL watchdog is stuck"),
            WHY,
            "unset TORCH_NCCL_ENABLE_MONITORING   (or export TORCH_NCCL_ENABLE_MONITORING=1)",
        ),
        Some(value) => Finding::pass(C, S, format!("TORCH_NCCL_ENABLE_MONITORING={value}"), WHY),
        None => Finding::pass(C, S, "TORCH_NCCL_ENABLE_MONITORING unset: on (PyTorch's default)", WHY),
    }
}

fn collective_timeout(facts: &HostFacts) -> Finding {
    const C: Check = Check::CollectiveTimeout;
    const S: Severity = Severity::Silent;
    const WHY: &str = "a hung collective, or a stuck NCCL watchdog, is ended only when its timeout passes: until then \
         every GPU of the job idles and nothing is logged";
    // (variable, seconds per unit, the fix's value)
    let vars = [
        (
            "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
            1,
            "export TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=600",
        ),
        (
            "DEEPSPEED_TIMEOUT",
            60,
            "export DEEPSPEED_TIMEOUT=30   (minutes)",
        ),
    ];
    let mut huge = Vec::new();
    let mut fixes = Vec::new();
    let mut bad = Vec::new();
    for (name, unit, fix) in vars {
        let Some(value) = facts.env.get(name) else {
            continue;
        };
        match value.trim().parse::<u64>() {
            Ok(n) if n.saturating_mul(unit) > HUGE_TIMEOUT_S => {
                huge.push(format!(
                    "{name}={value} ({})",
                    coarse_duration_text(n.saturating_mul(unit))
                ));
                fixes.push(fix);
            }
            Ok(_) => {}
            Err(_) => {
                bad.push(format!("{name}={value:?} is not a whole number"));
                fixes.push(fix);
            }
        }
    }
    if !huge.is_empty() {
        return Finding::fail(
            C,
            S,
            format!(
                "huge timeouts (over {}): {}",
                coarse_duration_text(HUGE_TIMEOUT_S),
                huge.join(", ")
            ),
            WHY,
            fixes.join("; "),
        );
    }
    if !bad.is_empty() {
        return Finding::fail(C, Severity::Advice, bad.join(", "), WHY, fixes.join("; "));
    }
    Finding::pass(
        C,
        S,
        format!(
            "no timeout over {} in the environment (the collective timeout itself is init_process_group(timeout=...) \
             in the job's code: 10 min by default for NCCL)",
            coarse_duration_text(HUGE_TIMEOUT_S)
        ),
        WHY,
    )
}

fn nccl_blocking_wait(facts: &HostFacts) -> Finding {
    const C: Check = Check::NcclBlockingWait;
    const S: Severity = Severity::Advice;
    const WHY: &str = "with blocking wait the training thread itself waits for each collective and gets the timeout \
         as an exception, instead of the watchdog ending the process: a loop that catches exceptions broadly keeps a \
         hung job alive, and collectives stop overlapping with compute";
    match torch_var(facts, "TORCH_NCCL_BLOCKING_WAIT") {
        Some((name, value)) if is_true(value) => Finding::fail(
            C,
            S,
            format!("{name}={value}: collectives block the training thread"),
            WHY,
            format!("unset {name}"),
        ),
        Some((name, value)) => Finding::pass(C, S, format!("{name}={value}"), WHY),
        None => Finding::pass(C, S, "TORCH_NCCL_BLOCKING_WAIT unset", WHY),
    }
}

fn nccl_timeout_unread(facts: &HostFacts) -> Option<Finding> {
    let value = facts.env.get("NCCL_TIMEOUT")?;
    Some(Finding::fail(
        Check::NcclTimeoutUnread,
        Severity::Advice,
        format!("NCCL_TIMEOUT={value} is set, but neither PyTorch nor NCCL reads it"),
        "the job may believe it has a collective timeout it does not have (unless its own code reads the variable)",
        "set the timeout where it is read: init_process_group(timeout=timedelta(minutes=10)); HF Trainer \
         --ddp_timeout SECONDS; accelerate InitProcessGroupKwargs(timeout=...)",
    ))
}

fn path_check(facts: &HostFacts, role: PathRole) -> Option<Finding> {
    let fact = facts.paths.iter().find(|p| p.role == role)?;
    let (check, severity, why, fix) = match role {
        PathRole::ReportDir => (
            Check::ReportDir,
            Severity::Blind,
            "the evidence of a hang (verdict, stacks, the culprit's output) is written there; when that filesystem \
             is the one that froze, the writes are abandoned and the evidence is lost",
            "--report-dir on a node-local disk, e.g. --report-dir /var/tmp/hangwatch-$(id -u)/run",
        ),
        PathRole::StateDir => (
            Check::StateDir,
            Severity::Advice,
            "the verdict history is kept there; on a frozen filesystem a new verdict is not recorded, and the \
             history of this node mixes with other nodes'",
            "export XDG_STATE_HOME=/var/tmp/$(id -u)-state (any node-local directory)",
        ),
        PathRole::LogDir => (
            Check::LogDir,
            Severity::Advice,
            "hangwatch's log writer never blocks the job and keeps the lines while the filesystem is frozen, but \
             they reach the file only once it recovers (or stay in the evidence)",
            "--log-file on a node-local disk, copied to shared storage after the job",
        ),
        PathRole::Binary => (
            Check::Binary,
            Severity::Advice,
            "hangwatch copies itself into memory at start to run its helpers, but a later `hangwatch dump` or \
             `probe` started from there hangs with the filesystem",
            "install hangwatch on a local disk: cp $(which hangwatch) /usr/local/bin/",
        ),
        PathRole::CurrentDir => (
            Check::CurrentDir,
            Severity::Advice,
            "relative paths (a relative --log-file, the job's own files) are looked up there; when it freezes, \
             opening them freezes too",
            "cd to a node-local directory, or give absolute paths",
        ),
    };
    Some(match &fact.mount {
        None => Finding::unknown(
            check,
            format!(
                "{} {}: its mount is unknown (/proc/self/mountinfo unreadable)",
                role.describe(),
                fact.path
            ),
            why,
            fix,
        ),
        Some(m) if m.remote => Finding::fail(
            check,
            severity,
            format!(
                "{} {} is on {} ({} from {}), a network or FUSE filesystem",
                role.describe(),
                fact.path,
                m.mount_point,
                m.fstype,
                m.source
            ),
            why,
            fix,
        ),
        Some(m) => Finding::pass(
            check,
            severity,
            format!(
                "{} {} is on {} ({}), node-local",
                role.describe(),
                fact.path,
                m.mount_point,
                m.fstype
            ),
            why,
        ),
    })
}

const TASK_PROLOG_WHY: &str = "Slurm's TaskProlog runs before each task, and what it prints as `export` lines goes \
     into the task's environment, which nothing can change once the task runs. hangwatch's gives each rank the \
     step's heartbeat socket (HANGWATCH_SOCKET) and the bootstrap on PYTHONPATH, so that the service's watcher sees \
     optimizer steps and checkpoints as they happen and learns its thresholds from them; it turns PyTorch's Flight \
     Recorder on, so that a rank says at a roll call which collective it did not join, and gives each step a private \
     prefix for the recorder's dumps (TORCH_FR_DUMP_TEMP_FILE). Without it a watcher judges a step by its ranks' CPU \
     time and kernel state alone: its thresholds come from the gaps in the ranks' CPU work, not from training steps, \
     and a hang in a collective where no rank stands out in /proc goes without the rank that never joined, unless \
     the job turned the recorder on itself and torch dumped it";

/// On a node with the node service: whether slurm.conf's TaskProlog is hangwatch's, or a site script that runs it.
fn task_prolog(facts: &HostFacts) -> Option<Finding> {
    const C: Check = Check::TaskProlog;
    const S: Severity = Severity::Advice;
    let node = facts
        .node_service
        .as_ref()
        .filter(|n| !n.signs.is_empty())?;
    let service = format!("the node service runs here ({})", node.signs.join("; "));
    let line = format!("TaskProlog={INSTALLED_TASK_PROLOG}");
    let Some(conf) = &node.slurm_conf else {
        return Some(Finding::unknown(
            C,
            format!(
                "{service}, but no slurm.conf could be read ({}): cannot tell whether Slurm runs hangwatch's TaskProlog",
                unread_words(&node.slurm_conf_unread)
            ),
            TASK_PROLOG_WHY,
            format!(
                "make sure slurm.conf has the line `{line}` (or a TaskProlog of the site's that runs it); \
                 SLURM_CONF=/path/to/slurm.conf hangwatch doctor checks it"
            ),
        ));
    };
    let Some(tp) = &node.task_prolog else {
        if !node.includes_unread.is_empty() {
            return Some(Finding::unknown(
                C,
                format!(
                    "{service}; {conf} sets no TaskProlog, but files it includes were not read ({}): cannot tell \
                     whether Slurm runs hangwatch's TaskProlog",
                    unread_words(&node.includes_unread)
                ),
                TASK_PROLOG_WHY,
                format!("make sure slurm.conf or a file it includes has the line `{line}`"),
            ));
        }
        let commented = match node.commented.last() {
            Some(c) => format!(
                " (line {} has it commented out: #TaskProlog={})",
                c.line, c.value
            ),
            None => String::new(),
        };
        return Some(Finding::fail(
            C,
            S,
            format!(
                "{service}, but {conf} has no TaskProlog line{commented}: the service's watchers see each rank's CPU \
                 time and kernel state, not its training steps, beats or Flight Recorder"
            ),
            TASK_PROLOG_WHY,
            format!(
                "add this line to {conf} (on every node, and where slurmctld reads it), then run `scontrol \
                 reconfigure`:  {line}"
            ),
        ));
    };
    let at = format!("{} line {}", tp.file, tp.line);
    let value = &tp.value;
    let ours = names_ours(value);
    Some(match &node.script {
        Some(PrologScript::Hangwatch) => Finding::pass(
            C,
            S,
            format!(
                "TaskProlog={value} ({at}) is hangwatch's: each rank gets its step's heartbeat socket and the bootstrap"
            ),
            TASK_PROLOG_WHY,
        ),
        Some(PrologScript::CallsHangwatch { line: call }) => Finding::pass(
            C,
            S,
            format!(
                "TaskProlog={value} ({at}) is the site's and runs hangwatch's (its line {call}): each rank gets its \
                 step's heartbeat socket and the bootstrap"
            ),
            TASK_PROLOG_WHY,
        ),
        Some(PrologScript::Other) => Finding::fail(
            C,
            S,
            format!(
                "{service}, but TaskProlog={value} ({at}) is the site's own and does not run hangwatch's: the \
                 service's watchers see each rank's CPU time and kernel state, not its training steps, beats or \
                 Flight Recorder"
            ),
            TASK_PROLOG_WHY,
            format!(
                "add this line to {value} (what it prints is what Slurm reads):  {INSTALLED_TASK_PROLOG}"
            ),
        ),
        Some(PrologScript::Missing) if ours => Finding::fail(
            C,
            S,
            format!("TaskProlog={value} ({at}) names hangwatch's TaskProlog, which is not on this node"),
            TASK_PROLOG_WHY,
            format!(
                "install hangwatch's package on this node (it puts the script at {INSTALLED_TASK_PROLOG}), or copy \
                 contrib/hangwatch-taskprolog.sh to {value}"
            ),
        ),
        Some(PrologScript::Missing) => Finding::fail(
            C,
            S,
            format!("TaskProlog={value} ({at}) does not exist on this node"),
            TASK_PROLOG_WHY,
            format!("create {value} with the line {INSTALLED_TASK_PROLOG} in it, or set {line} in {conf}"),
        ),
        Some(PrologScript::Unreadable { why }) => Finding::unknown(
            C,
            format!(
                "TaskProlog={value} ({at}) could not be read ({why}): cannot tell whether it runs hangwatch's"
            ),
            TASK_PROLOG_WHY,
            format!("make sure {value} runs {INSTALLED_TASK_PROLOG}"),
        ),
        None => Finding::unknown(
            C,
            format!("TaskProlog={value} ({at}) was not read: cannot tell whether it runs hangwatch's"),
            TASK_PROLOG_WHY,
            format!("make sure {value} runs {INSTALLED_TASK_PROLOG}"),
        ),
    })
}

fn unread_words(files: &[UnreadFile]) -> String {
    files
        .iter()
        .map(|f| format!("{}: {}", f.path, f.why))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::facts::{Capabilities, MountFact, PathFact, Sysctls};

    const ROOT_CAPS: u64 = 0x1ff_ffef_ffff;

    fn mount(point: &str, fstype: &str) -> Option<MountFact> {
        Some(MountFact {
            mount_point: point.into(),
            fstype: fstype.into(),
            source: "src".into(),
            remote: hangwatch_proc::is_remote_fstype(fstype),
        })
    }

    fn path(role: PathRole, path: &str, on: Option<MountFact>) -> PathFact {
        PathFact {
            role,
            path: path.into(),
            mount: on,
        }
    }

    /// A well-set node, as root.
    fn healthy() -> HostFacts {
        HostFacts {
            euid: Some(0),
            capabilities: Some(Capabilities::from_effective(ROOT_CAPS)),
            in_container: Some(false),
            sysctls: Sysctls {
                ptrace_scope: SysctlValue::Value(1),
                dmesg_restrict: SysctlValue::Value(0),
                kptr_restrict: SysctlValue::Value(0),
                hung_task_timeout_secs: SysctlValue::Value(120),
                hung_task_panic: SysctlValue::Value(0),
                hung_task_warnings: SysctlValue::Value(10),
                max_dgram_qlen: SysctlValue::Value(512),
            },
            kmsg: Access::Readable,
            env: BTreeMap::new(),
            paths: vec![
                path(
                    PathRole::ReportDir,
                    "/var/tmp/hangwatch-0",
                    mount("/", "ext4"),
                ),
                path(
                    PathRole::StateDir,
                    "/var/tmp/hangwatch-0/state",
                    mount("/", "ext4"),
                ),
                path(
                    PathRole::Binary,
                    "/usr/local/bin/hangwatch",
                    mount("/", "ext4"),
                ),
                path(PathRole::CurrentDir, "/root", mount("/", "ext4")),
            ],
            issues: Vec::new(),
            node_service: None,
        }
    }

    fn get(findings: &[Finding], check: Check) -> &Finding {
        findings
            .iter()
            .find(|f| f.check == check)
            .unwrap_or_else(|| panic!("no {check:?} finding in {findings:#?}"))
    }

    fn failed(facts: &HostFacts) -> Vec<(Check, Severity)> {
        diagnose(facts)
            .into_iter()
            .filter(|f| !f.ok)
            .map(|f| (f.check, f.severity))
            .collect()
    }

    #[test]
    fn a_healthy_root_node_passes_everything_and_lists_every_check() {
        let findings = diagnose(&healthy());
        assert!(findings.iter().all(|f| f.ok), "{findings:#?}");
        assert!(findings.iter().all(|f| f.fix.is_none()));
        assert!(startup_warnings(&findings).is_empty());
        let checks: Vec<Check> = findings.iter().map(|f| f.check).collect();
        assert_eq!(
            checks,
            [
                Check::Ptrace,
                Check::KernelStacks,
                Check::KernelLog,
                Check::Container,
                Check::ReportDir,
                Check::HungTaskDetector,
                Check::HungTaskWarnings,
                Check::NcclAsyncErrorHandling,
                Check::NcclMonitoring,
                Check::CollectiveTimeout,
                Check::HungTaskPanic,
                Check::UnixDgramQueue,
                Check::NcclBlockingWait,
                Check::StateDir,
                Check::Binary,
                Check::CurrentDir,
            ]
        );
    }

    #[test]
    fn a_user_without_capabilities_is_blind_to_kernel_stacks_and_under_scope_2_to_python() {
        let mut facts = healthy();
        facts.euid = Some(1000);
        facts.capabilities = Some(Capabilities::from_effective(0));
        assert_eq!(failed(&facts), [(Check::KernelStacks, Severity::Blind)]);
        assert!(get(&diagnose(&facts), Check::Ptrace)
            .what
            .contains("descendants"));

        facts.sysctls.ptrace_scope = SysctlValue::Value(2);
        let findings = diagnose(&facts);
        let ptrace = get(&findings, Check::Ptrace);
        assert!(!ptrace.ok && ptrace.severity == Severity::Blind);
        assert!(ptrace.what.contains("ptrace_scope=2"), "{}", ptrace.what);
        assert!(ptrace
            .fix
            .as_deref()
            .unwrap()
            .contains("setcap cap_sys_ptrace+ep"));

        facts.capabilities = Some(Capabilities::from_effective(1 << 19));
        assert!(
            get(&diagnose(&facts), Check::Ptrace).ok,
            "CAP_SYS_PTRACE is enough"
        );
    }

    #[test]
    fn ptrace_scope_3_blinds_root_too() {
        let mut facts = healthy();
        facts.sysctls.ptrace_scope = SysctlValue::Value(3);
        assert_eq!(failed(&facts), [(Check::Ptrace, Severity::Blind)]);
    }

    #[test]
    fn inside_a_container_without_cap_sys_ptrace_says_what_to_grant() {
        let mut facts = healthy();
        facts.in_container = Some(true);
        facts.capabilities = Some(Capabilities::from_effective(ROOT_CAPS & !(1 << 19)));
        let findings = diagnose(&facts);
        let c = get(&findings, Check::Container);
        assert!(!c.ok && c.what.contains("inside a container"), "{}", c.what);
        let fix = c.fix.as_deref().unwrap_or_default();
        assert!(
            fix.contains("hostPID") && fix.contains("SYS_PTRACE"),
            "{fix}"
        );
        assert!(startup_warnings(&findings)
            .iter()
            .all(|f| f.check != Check::Container));
        facts.capabilities = Some(Capabilities::from_effective(ROOT_CAPS));
        assert!(get(&diagnose(&facts), Check::Container).ok);
    }

    #[test]
    fn root_in_a_container_without_cap_sys_admin() {
        let mut facts = healthy();
        facts.capabilities = Some(Capabilities::from_effective(ROOT_CAPS & !(1 << 21)));
        let findings = diagnose(&facts);
        let k = get(&findings, Check::KernelStacks);
        assert!(!k.ok && k.what.contains("container"), "{}", k.what);
    }

    #[test]
    fn dmesg_restrict_without_cap_syslog_hides_the_kernel_log() {
        let mut facts = healthy();
        facts.sysctls.dmesg_restrict = SysctlValue::Value(1);
        facts.kmsg = Access::Denied;
        let findings = diagnose(&facts);
        let k = get(&findings, Check::KernelLog);
        assert_eq!((k.ok, k.severity), (false, Severity::Blind));
        assert!(k.what.contains("dmesg_restrict=1"), "{}", k.what);
        assert!(k
            .fix
            .as_deref()
            .unwrap()
            .contains("sysctl -w kernel.dmesg_restrict=0"));
        assert_eq!(startup_warnings(&findings).len(), 1);
    }

    #[test]
    fn hung_task_detector_absent_off_or_exhausted_is_silent() {
        let mut facts = healthy();
        facts.sysctls.hung_task_timeout_secs = SysctlValue::Missing;
        facts.sysctls.hung_task_warnings = SysctlValue::Missing;
        let findings = diagnose(&facts);
        assert!(get(&findings, Check::HungTaskDetector)
            .what
            .contains("no hung-task detector"));
        assert!(findings.iter().all(|f| f.check != Check::HungTaskWarnings));
        assert_eq!(
            failed(&facts),
            [(Check::HungTaskDetector, Severity::Silent)]
        );

        let mut facts = healthy();
        facts.sysctls.hung_task_timeout_secs = SysctlValue::Value(0);
        facts.sysctls.hung_task_warnings = SysctlValue::Value(0);
        assert_eq!(
            failed(&facts),
            [
                (Check::HungTaskDetector, Severity::Silent),
                (Check::HungTaskWarnings, Severity::Silent)
            ]
        );
        let findings = diagnose(&facts);
        assert_eq!(
            get(&findings, Check::HungTaskWarnings).fix.as_deref(),
            Some("sysctl -w kernel.hung_task_warnings=-1   (unlimited; or 10)")
        );

        facts.sysctls.hung_task_timeout_secs = SysctlValue::Value(7200);
        assert!(get(&diagnose(&facts), Check::HungTaskDetector)
            .what
            .contains("after 2 h"));
        facts.sysctls.hung_task_warnings = SysctlValue::Value(-1);
        assert!(get(&diagnose(&facts), Check::HungTaskWarnings).ok);
    }

    #[test]
    fn hung_task_panic_and_a_short_dgram_queue_are_advice() {
        let mut facts = healthy();
        facts.sysctls.hung_task_panic = SysctlValue::Value(1);
        facts.sysctls.max_dgram_qlen = SysctlValue::Value(10);
        assert_eq!(
            failed(&facts),
            [
                (Check::HungTaskPanic, Severity::Advice),
                (Check::UnixDgramQueue, Severity::Advice)
            ]
        );
        let findings = diagnose(&facts);
        assert!(startup_warnings(&findings).is_empty());
        assert_eq!(
            get(&findings, Check::UnixDgramQueue).fix.as_deref(),
            Some("sysctl -w net.unix.max_dgram_qlen=512 (and in /etc/sysctl.d/ to keep it)")
        );
        facts.sysctls.max_dgram_qlen = SysctlValue::Value(MIN_DGRAM_QLEN);
        assert!(get(&diagnose(&facts), Check::UnixDgramQueue).ok);
    }

    fn with_env(vars: &[(&str, &str)]) -> HostFacts {
        let mut facts = healthy();
        facts.env = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        facts
    }

    #[test]
    fn async_error_handling_off_is_silent_by_either_name_torch_first() {
        let facts = with_env(&[("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")]);
        let findings = diagnose(&facts);
        let f = get(&findings, Check::NcclAsyncErrorHandling);
        assert_eq!((f.ok, f.severity), (false, Severity::Silent));
        assert_eq!(
            f.fix.as_deref(),
            Some("export TORCH_NCCL_ASYNC_ERROR_HANDLING=3   (PyTorch's default; or unset it)")
        );
        let facts = with_env(&[("NCCL_ASYNC_ERROR_HANDLING", "0")]);
        assert!(get(&diagnose(&facts), Check::NcclAsyncErrorHandling)
            .what
            .starts_with("NCCL_ASYNC"));
        let facts = with_env(&[
            ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"),
            ("NCCL_ASYNC_ERROR_HANDLING", "0"),
        ]);
        assert!(get(&diagnose(&facts), Check::NcclAsyncErrorHandling).ok);
        let facts = with_env(&[("TORCH_NCCL_ASYNC_ERROR_HANDLING", "yes")]);
        assert_eq!(
            failed(&facts),
            [(Check::NcclAsyncErrorHandling, Severity::Advice)]
        );
    }

    #[test]
    fn monitoring_off_and_huge_timeouts_are_silent() {
        let facts = with_env(&[
            ("TORCH_NCCL_ENABLE_MONITORING", "0"),
            ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "7200"),
            ("DEEPSPEED_TIMEOUT", "600"),
        ]);
        assert_eq!(
            failed(&facts),
            [
                (Check::NcclMonitoring, Severity::Silent),
                (Check::CollectiveTimeout, Severity::Silent)
            ]
        );
        let findings = diagnose(&facts);
        let t = get(&findings, Check::CollectiveTimeout);
        assert!(
            t.what
                .contains("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=7200 (2 h)"),
            "{}",
            t.what
        );
        assert!(
            t.what.contains("DEEPSPEED_TIMEOUT=600 (10 h)"),
            "{}",
            t.what
        );
        assert!(t
            .fix
            .as_deref()
            .unwrap()
            .contains("export DEEPSPEED_TIMEOUT=30"));
        assert_eq!(startup_warnings(&findings).len(), 2);

        let facts = with_env(&[
            ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "1800"),
            ("DEEPSPEED_TIMEOUT", "30"),
            ("TORCH_NCCL_ENABLE_MONITORING", "1"),
        ]);
        assert!(failed(&facts).is_empty(), "30 min is not huge");
        let facts = with_env(&[("DEEPSPEED_TIMEOUT", "1h")]);
        assert_eq!(
            failed(&facts),
            [(Check::CollectiveTimeout, Severity::Advice)]
        );
    }

    #[test]
    fn blocking_wait_and_nccl_timeout_are_advice() {
        let facts = with_env(&[("NCCL_BLOCKING_WAIT", "1"), ("NCCL_TIMEOUT", "1800")]);
        assert_eq!(
            failed(&facts),
            [
                (Check::NcclBlockingWait, Severity::Advice),
                (Check::NcclTimeoutUnread, Severity::Advice)
            ]
        );
        assert_eq!(
            get(&diagnose(&facts), Check::NcclBlockingWait)
                .fix
                .as_deref(),
            Some("unset NCCL_BLOCKING_WAIT")
        );
    }

    #[test]
    fn a_report_dir_on_a_network_filesystem_is_blind_other_paths_advice() {
        let mut facts = healthy();
        facts.paths = vec![
            path(
                PathRole::ReportDir,
                "/shared/reports",
                mount("/shared", "nfs4"),
            ),
            path(PathRole::LogDir, "/shared/logs", mount("/shared", "nfs4")),
            path(PathRole::StateDir, "/gpfs/state", mount("/gpfs", "gpfs")),
            path(
                PathRole::Binary,
                "/mnt/venv/bin/hangwatch",
                mount("/mnt/venv", "fuse.sshfs"),
            ),
            path(PathRole::CurrentDir, "/home/u", None),
        ];
        assert_eq!(
            failed(&facts),
            [
                (Check::ReportDir, Severity::Blind),
                (Check::LogDir, Severity::Advice),
                (Check::StateDir, Severity::Advice),
                (Check::Binary, Severity::Advice),
                (Check::CurrentDir, Severity::Advice),
            ]
        );
        let findings = diagnose(&facts);
        let r = get(&findings, Check::ReportDir);
        assert!(
            r.what.contains("/shared/reports is on /shared (nfs4"),
            "{}",
            r.what
        );
        assert!(r.fix.as_deref().unwrap().contains("--report-dir"));
        assert!(get(&findings, Check::CurrentDir).what.contains("unknown"));
        assert_eq!(startup_warnings(&findings).len(), 1);
    }

    /// The mount table of a real NFS client, recorded: the check decides by the table, not by touching the path.
    #[test]
    fn a_recorded_nfs_mountinfo_places_the_report_dir_on_nfs() {
        let table = hangwatch_proc::parse_mountinfo(
            "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
             88 27 0:52 / /shared rw,relatime shared:40 - nfs4 fs1:/export/shared rw,vers=4.2,hard,proto=tcp\n",
        )
        .unwrap();
        let m = table.containing("/shared/run/reports").unwrap();
        let mut facts = healthy();
        facts.paths[0] = path(
            PathRole::ReportDir,
            "/shared/run/reports",
            Some(MountFact {
                mount_point: m.mount_point.clone(),
                fstype: m.fstype.clone(),
                source: m.source.clone(),
                remote: m.is_remote(),
            }),
        );
        let findings = diagnose(&facts);
        let r = get(&findings, Check::ReportDir);
        assert!(
            !r.ok && r.what.contains("nfs4 from fs1:/export/shared"),
            "{}",
            r.what
        );
    }

    #[test]
    fn unknown_facts_are_advice_never_startup_warnings() {
        let facts = HostFacts {
            in_container: None,
            euid: None,
            capabilities: None,
            sysctls: Sysctls {
                ptrace_scope: SysctlValue::Unreadable("denied".into()),
                dmesg_restrict: SysctlValue::Unreadable("denied".into()),
                kptr_restrict: SysctlValue::Missing,
                hung_task_timeout_secs: SysctlValue::Unreadable("denied".into()),
                hung_task_panic: SysctlValue::Missing,
                hung_task_warnings: SysctlValue::Unreadable("denied".into()),
                max_dgram_qlen: SysctlValue::Missing,
            },
            kmsg: Access::Failed("EIO".into()),
            env: BTreeMap::new(),
            paths: Vec::new(),
            issues: Vec::new(),
            node_service: None,
        };
        let findings = diagnose(&facts);
        assert!(startup_warnings(&findings).is_empty(), "{findings:#?}");
        assert!(findings.iter().filter(|f| !f.ok).all(|f| f.fix.is_some()));
    }

    #[test]
    fn findings_serialize_with_stable_names() {
        let facts = with_env(&[("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")]);
        let json = serde_json::to_value(diagnose(&facts)).unwrap();
        let f = json
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == "nccl_async_error_handling")
            .unwrap();
        assert_eq!(f["severity"], "silent");
        assert_eq!(f["ok"], false);
        assert!(json[0].get("fix").is_none(), "a passed check has no fix");
    }

    /// A node with the node service whose files are `files` (path, text; any other path is missing), slurm.conf
    /// looked for at Slurm's default.
    fn service_node(files: &[(&str, &str)]) -> HostFacts {
        use crate::slurm_conf::{slurm_conf_candidates, FileText};
        use crate::NodeServiceFacts;
        let files: BTreeMap<std::path::PathBuf, String> = files
            .iter()
            .map(|(p, t)| (p.into(), t.to_string()))
            .collect();
        let mut read = |paths: &[std::path::PathBuf]| {
            paths
                .iter()
                .map(|p| {
                    let found = files
                        .get(p)
                        .map_or(FileText::Missing, |t| FileText::Text(t.clone()));
                    (p.clone(), found)
                })
                .collect()
        };
        let mut facts = healthy();
        facts.node_service = Some(NodeServiceFacts::gather(
            vec!["hangwatch-node.service enabled".into()],
            &slurm_conf_candidates(None, None),
            &mut read,
        ));
        facts
    }

    const TEST_CLUSTER: &str = include_str!("../tests/fixtures/slurm/test-cluster.conf");
    const SITE: &str = include_str!("../tests/fixtures/slurm/site.conf");
    const SITE_PROLOGS: &str = include_str!("../tests/fixtures/slurm/site-prologs.conf");
    const SITE_TASKPROLOG: &str = include_str!("../tests/fixtures/slurm/site-taskprolog.sh");
    const OURS: &str = include_str!("../../../contrib/hangwatch-taskprolog.sh");
    const THE_LINE: &str = "TaskProlog=/usr/share/hangwatch/hangwatch-taskprolog.sh";

    #[test]
    fn without_the_node_service_the_task_prolog_is_not_checked() {
        assert!(diagnose(&healthy())
            .iter()
            .all(|f| f.check != Check::TaskProlog));
        let mut facts = service_node(&[]);
        if let Some(n) = facts.node_service.as_mut() {
            n.signs.clear();
        }
        assert!(diagnose(&facts)
            .iter()
            .all(|f| f.check != Check::TaskProlog));
    }

    #[test]
    fn a_service_node_without_a_task_prolog_is_told_the_line_to_add() {
        let facts = service_node(&[("/etc/slurm/slurm.conf", TEST_CLUSTER)]);
        let findings = diagnose(&facts);
        let f = get(&findings, Check::TaskProlog);
        assert!(!f.ok && f.severity == Severity::Advice, "{f:#?}");
        assert!(
            !f.is_problem(),
            "advice: doctor still exits 0, run says nothing"
        );
        assert!(
            f.what.contains("hangwatch-node.service enabled")
                && f.what
                    .contains("/etc/slurm/slurm.conf has no TaskProlog line"),
            "{}",
            f.what
        );
        let fix = f.fix.as_deref().unwrap();
        assert!(
            fix.contains(THE_LINE) && fix.contains("/etc/slurm/slurm.conf"),
            "{fix}"
        );
        assert!(
            f.why.contains("HANGWATCH_SOCKET")
                && f.why.contains("PYTHONPATH")
                && f.why.contains("TORCH_FR_DUMP_TEMP_FILE")
                && f.why.contains("CPU"),
            "{}",
            f.why
        );
    }

    #[test]
    fn a_commented_out_task_prolog_is_said() {
        let conf = format!("{TEST_CLUSTER}#{THE_LINE}\n");
        let facts = service_node(&[("/etc/slurm/slurm.conf", &conf)]);
        let f = get(&diagnose(&facts), Check::TaskProlog).clone();
        assert!(!f.ok, "{f:#?}");
        let line = TEST_CLUSTER.lines().count() + 1;
        assert!(
            f.what
                .contains(&format!("line {line} has it commented out")),
            "{}",
            f.what
        );
        assert!(f.fix.unwrap().contains(THE_LINE));
    }

    #[test]
    fn hangwatchs_task_prolog_passes_and_one_that_is_not_installed_does_not() {
        let conf = format!("{TEST_CLUSTER}{THE_LINE}\n");
        let facts = service_node(&[
            ("/etc/slurm/slurm.conf", &conf),
            ("/usr/share/hangwatch/hangwatch-taskprolog.sh", OURS),
        ]);
        let f = get(&diagnose(&facts), Check::TaskProlog).clone();
        assert!(f.ok && f.fix.is_none(), "{f:#?}");
        assert!(f.what.contains("is hangwatch's"), "{}", f.what);

        let facts = service_node(&[("/etc/slurm/slurm.conf", &conf)]);
        let f = get(&diagnose(&facts), Check::TaskProlog).clone();
        assert!(!f.ok && f.what.contains("not on this node"), "{f:#?}");
    }

    #[test]
    fn a_site_task_prolog_in_an_included_file_passes_when_it_runs_hangwatchs() {
        let files = [
            ("/etc/slurm/slurm.conf", SITE),
            ("/etc/slurm/prologs.conf", SITE_PROLOGS),
            ("/etc/slurm/taskprolog.sh", SITE_TASKPROLOG),
        ];
        let facts = service_node(&files);
        let f = get(&diagnose(&facts), Check::TaskProlog).clone();
        assert!(f.ok, "{f:#?}");
        assert!(
            f.what.contains("/etc/slurm/prologs.conf line 4")
                && f.what.contains("runs hangwatch's (its line 6)"),
            "{}",
            f.what
        );

        let own_only = SITE_TASKPROLOG.replace("/usr/share/hangwatch/hangwatch-taskprolog.sh", "");
        let facts = service_node(&[files[0], files[1], ("/etc/slurm/taskprolog.sh", &own_only)]);
        let f = get(&diagnose(&facts), Check::TaskProlog).clone();
        assert!(
            !f.ok && f.what.contains("does not run hangwatch's"),
            "{f:#?}"
        );
        assert_eq!(
            f.fix.as_deref(),
            Some(
                "add this line to /etc/slurm/taskprolog.sh (what it prints is what Slurm reads):  \
                 /usr/share/hangwatch/hangwatch-taskprolog.sh"
            )
        );
    }

    #[test]
    fn an_unread_slurm_conf_or_include_is_cannot_tell_never_missing() {
        let facts = service_node(&[]);
        let f = get(&diagnose(&facts), Check::TaskProlog).clone();
        assert!(!f.ok && f.severity == Severity::Advice, "{f:#?}");
        assert!(
            f.what.contains("no slurm.conf could be read")
                && f.what
                    .contains("/etc/slurm/slurm.conf: Slurm's default: does not exist")
                && f.what.contains("/run/slurm/conf/slurm.conf"),
            "{}",
            f.what
        );

        let facts = service_node(&[("/etc/slurm/slurm.conf", SITE)]);
        let f = get(&diagnose(&facts), Check::TaskProlog).clone();
        assert!(
            f.what.contains("cannot tell")
                && f.what.contains("/etc/slurm/prologs.conf: does not exist"),
            "{}",
            f.what
        );
    }
}
