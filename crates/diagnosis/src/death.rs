//! Why a rank died: the facts gathered at its death (wait status, kernel log, memory cgroup, core pattern, last
//! lines) in, a [`RankDeath`] with its cause in words out. Nothing here reads anything; nothing is guessed: a fact
//! that is not there stays `None`.

use hangwatch_model::RankDeath;

/// How many of the rank's last lines the verdict keeps.
pub const TAIL_LINES: usize = 20;

/// What the supervisor knew or read when a rank died.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeathFacts {
    /// The code passed to `exit()`.
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
    pub core_dumped: Option<bool>,
    /// Where its core went, as [`core_location`] and a look for the file found it.
    pub core_dump: Option<String>,
    /// The kernel log could be read while it died: no OOM line for its pid then means no OOM kill of it.
    pub kernel_log_readable: bool,
    /// The kernel log's OOM kill of this pid, when there is one.
    pub kernel_oom: Option<KernelOom>,
    /// Its memory cgroup and what the cgroup said at its death.
    pub memory_cgroup: Option<CgroupFacts>,
    /// Its last lines, oldest first (any number; the verdict keeps [`TAIL_LINES`]).
    pub output: Vec<String>,
}

/// The kernel log's lines about the OOM kill of one pid.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KernelOom {
    /// `Memory cgroup out of memory: Killed process 4242 (python) ...`, as logged.
    pub line: String,
    /// The cgroup whose limit was hit (`oom_memcg=` of the `oom-kill:` line).
    pub memcg: Option<String>,
}

/// A memory cgroup as read at a rank's death.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CgroupFacts {
    pub path: String,
    /// 1 or 2.
    pub version: u8,
    pub limit_bytes: Option<u64>,
    pub oom_kills: Option<u64>,
}

/// The rank's death, explained.
pub fn explain(facts: &DeathFacts) -> RankDeath {
    let signal_name = facts.signal.map(signal_name);
    let oom_killed = oom_killed(facts);
    let mut oom_evidence = Vec::new();
    if let Some(k) = &facts.kernel_oom {
        oom_evidence.push(format!("kernel log: {}", k.line));
    }
    if let (Some(cg), Some(true)) = (&facts.memory_cgroup, oom_killed) {
        if let Some(n) = cg.oom_kills.filter(|n| *n > 0) {
            oom_evidence.push(format!(
                "memory cgroup {}: the kernel counted {n} OOM kill{} in it",
                cg.path,
                if n == 1 { "" } else { "s" }
            ));
        }
    }
    let tail: Vec<String> = facts
        .output
        .iter()
        .skip(facts.output.len().saturating_sub(TAIL_LINES))
        .cloned()
        .collect();
    let exception = exception_line(&facts.output);
    let cg = facts.memory_cgroup.as_ref();
    let mut death = RankDeath {
        exit_code: facts.exit_code,
        signal: facts.signal,
        signal_name,
        core_dumped: facts.core_dumped,
        core_dump: facts.core_dump.clone(),
        oom_killed,
        oom_evidence,
        memory_cgroup: cg.map(|c| c.path.clone()),
        cgroup_version: cg.map(|c| c.version),
        memory_limit_bytes: cg.and_then(|c| c.limit_bytes),
        memory_limit: cg.and_then(|c| c.limit_bytes).map(human_bytes),
        cgroup_oom_kills: cg.and_then(|c| c.oom_kills),
        output_tail: (!tail.is_empty()).then_some(tail),
        exception,
        cause: String::new(),
    };
    death.cause = cause(&death);
    death
}

/// OOM-killed: the kernel log names the pid; or SIGKILL ended it and its memory cgroup counted an OOM kill (the
/// counter is the cgroup's, so it says so only together with the SIGKILL). Not: another signal or an exit code,
/// or SIGKILL with a readable kernel log that names no OOM kill and a counter at zero. Unknown otherwise.
fn oom_killed(facts: &DeathFacts) -> Option<bool> {
    if facts.kernel_oom.is_some() {
        return Some(true);
    }
    if facts.signal != Some(SIGKILL) {
        return (facts.signal.is_some() || facts.exit_code.is_some()).then_some(false);
    }
    match facts.memory_cgroup.as_ref().and_then(|c| c.oom_kills) {
        Some(n) if n > 0 => Some(true),
        Some(_) if facts.kernel_log_readable => Some(false),
        _ if facts.kernel_log_readable && facts.memory_cgroup.is_none() => Some(false),
        _ => None,
    }
}

const SIGKILL: i32 = 9;

/// How the rank died, in words, without naming it.
fn cause(d: &RankDeath) -> String {
    if d.oom_killed == Some(true) {
        let cgroup = match (&d.memory_cgroup, &d.memory_limit) {
            (Some(path), Some(limit)) => format!(" (memory cgroup {path}, limit {limit})"),
            (Some(path), None) => format!(" (memory cgroup {path}, no limit of its own)"),
            _ => String::new(),
        };
        return format!("was killed by the kernel's OOM killer{cgroup}");
    }
    if let Some(name) = &d.signal_name {
        let core = match (&d.core_dump, d.core_dumped) {
            (Some(at), _) if at.starts_with("piped to ") => format!(" (core {at})"),
            (Some(at), _) => format!(" (core dumped to {at})"),
            (None, Some(true)) => " (core dumped)".to_string(),
            _ => String::new(),
        };
        let verb = if d.signal == Some(SIGKILL) {
            "was killed by"
        } else {
            "died of"
        };
        return format!("{verb} {name}{core}");
    }
    match d.exit_code {
        Some(code) => {
            let exception = d
                .exception
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            // A shell that ran the program as its child reports the child's signal as 128+N.
            let shell = match code - 128 {
                n @ 1..=31 => format!(
                    " (as a shell reports a child that died of {})",
                    signal_name(n)
                ),
                _ => String::new(),
            };
            format!("exited with code {code}{shell}{exception}")
        }
        None => "exited".to_string(),
    }
}

/// `SIGSEGV` for 11; `signal 40` for one without a usual name (real-time signals).
pub fn signal_name(signal: i32) -> String {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    usize::try_from(signal)
        .ok()
        .and_then(|i| NAMES.get(i))
        .filter(|n| !n.is_empty())
        .map_or_else(|| format!("signal {signal}"), |n| n.to_string())
}

/// Bytes for people, in binary units: `256 MiB`, `1.5 GiB`, `512 B`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The exception a Python traceback ended with: the last unindented `Name: message` (or bare `Name`) line after
/// the last `Traceback (most recent call last):`; without a traceback, the last line that reads like one whose
/// name ends in `Error` or `Exception`.
pub fn exception_line(lines: &[String]) -> Option<String> {
    let lines: Vec<&str> = lines.iter().map(|l| without_rank_prefix(l)).collect();
    let start = lines.iter().rposition(|l| {
        l.trim_start()
            .starts_with("Traceback (most recent call last):")
    });
    let candidates = match start {
        Some(i) => &lines[i + 1..],
        None => &lines[..],
    };
    candidates
        .iter()
        .rev()
        .map(|l| l.trim_end())
        .find(|l| match start {
            Some(_) => looks_like_exception(l, false),
            None => looks_like_exception(l, true),
        })
        .map(str::to_string)
}

/// A line without the `[rank0]: ` that torch.distributed puts before each line of an error it reports.
fn without_rank_prefix(line: &str) -> &str {
    line.strip_prefix("[rank")
        .and_then(|rest| rest.split_once("]: "))
        .filter(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        .map_or(line, |(_, text)| text)
}

/// `RuntimeError: boom`, `torch.OutOfMemoryError: CUDA out of memory`, `KeyboardInterrupt`.
fn looks_like_exception(line: &str, strict: bool) -> bool {
    if line.is_empty() || line.starts_with(char::is_whitespace) {
        return false;
    }
    let name = line.split_once(':').map_or(line, |(n, _)| n);
    let is_name = !name.is_empty()
        && name.split('.').all(|part| {
            part.chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_alphanumeric() || c == '_')
        });
    let last = name.rsplit('.').next().unwrap_or(name);
    let exceptional = ["Error", "Exception", "Interrupt", "Exit", "Warning"]
        .iter()
        .any(|s| last.ends_with(s));
    is_name && (exceptional || (!strict && line.contains(':')))
}

/// What a core pattern may name, as far as it is known at a rank's death.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CoreContext {
    pub pid: i32,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub signal: Option<i32>,
    pub hostname: Option<String>,
    /// `comm` (`%e`).
    pub comm: Option<String>,
    /// The executable's path (`%E`).
    pub exe: Option<String>,
    /// Its working directory: a relative pattern is relative to it.
    pub cwd: Option<String>,
    /// `kernel.core_uses_pid`: `.PID` is appended to a pattern without `%p`.
    pub uses_pid: bool,
}

/// Where `kernel.core_pattern` sends a core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoreLocation {
    /// `|/usr/lib/systemd/systemd-coredump ...`: to this program (its file name).
    Piped(String),
    /// A file at this absolute path.
    File(String),
    /// The pattern names something not known here (`%t`, the dump time; `%i`, the crashing thread): the file
    /// cannot be named.
    Unknown,
}

/// Expands `pattern` (kernel.core_pattern) for the rank described by `ctx`.
pub fn core_location(pattern: &str, ctx: &CoreContext) -> CoreLocation {
    let pattern = pattern.trim_end_matches('\n');
    if let Some(pipe) = pattern.strip_prefix('|') {
        let program = pipe.split_whitespace().next().unwrap_or("");
        let name = program.rsplit('/').next().unwrap_or(program);
        return if name.is_empty() {
            CoreLocation::Unknown
        } else {
            CoreLocation::Piped(name.to_string())
        };
    }
    let mut out = String::new();
    let mut has_pid = false;
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            break;
        };
        let value = match spec {
            '%' => Some("%".to_string()),
            'p' | 'P' => {
                has_pid = true;
                Some(ctx.pid.to_string())
            }
            'u' => ctx.uid.map(|u| u.to_string()),
            'g' => ctx.gid.map(|g| g.to_string()),
            's' => ctx.signal.map(|s| s.to_string()),
            'h' => ctx.hostname.clone(),
            'e' => ctx.comm.clone(),
            'E' => ctx.exe.as_ref().map(|e| e.replace('/', "!")),
            _ => None,
        };
        match value {
            Some(v) => out.push_str(&v),
            None => return CoreLocation::Unknown,
        }
    }
    if out.is_empty() {
        return CoreLocation::Unknown;
    }
    if ctx.uses_pid && !has_pid {
        out.push_str(&format!(".{}", ctx.pid));
    }
    if out.starts_with('/') {
        return CoreLocation::File(out);
    }
    match &ctx.cwd {
        Some(cwd) => CoreLocation::File(format!("{}/{out}", cwd.trim_end_matches('/'))),
        None => CoreLocation::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn an_oom_kill_in_a_cgroup_names_the_cgroup_and_its_limit() {
        let d = explain(&DeathFacts {
            signal: Some(9),
            kernel_log_readable: true,
            kernel_oom: Some(KernelOom {
                line: "Memory cgroup out of memory: Killed process 4242 (python)".into(),
                memcg: Some("/hw-test".into()),
            }),
            memory_cgroup: Some(CgroupFacts {
                path: "/hw-test".into(),
                version: 1,
                limit_bytes: Some(256 << 20),
                oom_kills: Some(1),
            }),
            ..Default::default()
        });
        assert_eq!(d.oom_killed, Some(true));
        assert_eq!(d.signal_name.as_deref(), Some("SIGKILL"));
        assert_eq!(d.memory_limit.as_deref(), Some("256 MiB"));
        assert_eq!(
            d.cause,
            "was killed by the kernel's OOM killer (memory cgroup /hw-test, limit 256 MiB)"
        );
        assert_eq!(d.oom_evidence.len(), 2, "{:?}", d.oom_evidence);
    }

    #[test]
    fn the_cgroup_counter_alone_counts_only_with_a_sigkill() {
        let cg = Some(CgroupFacts {
            path: "/job".into(),
            version: 2,
            limit_bytes: None,
            oom_kills: Some(2),
        });
        let killed = explain(&DeathFacts {
            signal: Some(9),
            memory_cgroup: cg.clone(),
            ..Default::default()
        });
        assert_eq!(killed.oom_killed, Some(true));
        assert_eq!(
            killed.cause,
            "was killed by the kernel's OOM killer (memory cgroup /job, no limit of its own)"
        );
        let segv = explain(&DeathFacts {
            signal: Some(11),
            memory_cgroup: cg,
            ..Default::default()
        });
        assert_eq!(segv.oom_killed, Some(false));
        assert_eq!(segv.cause, "died of SIGSEGV");
    }

    #[test]
    fn a_sigkill_with_nothing_to_tell_is_not_called_an_oom_kill() {
        let blind = explain(&DeathFacts {
            signal: Some(9),
            ..Default::default()
        });
        assert_eq!(blind.oom_killed, None, "no kernel log, no cgroup: unknown");
        assert_eq!(blind.cause, "was killed by SIGKILL");
        let seen = explain(&DeathFacts {
            signal: Some(9),
            kernel_log_readable: true,
            memory_cgroup: Some(CgroupFacts {
                path: "/".into(),
                version: 1,
                limit_bytes: None,
                oom_kills: Some(0),
            }),
            ..Default::default()
        });
        assert_eq!(seen.oom_killed, Some(false));
    }

    #[test]
    fn a_core_dump_is_said_where_it_went() {
        let d = explain(&DeathFacts {
            signal: Some(11),
            core_dumped: Some(true),
            core_dump: Some("/var/crash/core.4242".into()),
            ..Default::default()
        });
        assert_eq!(
            d.cause,
            "died of SIGSEGV (core dumped to /var/crash/core.4242)"
        );
        let piped = explain(&DeathFacts {
            signal: Some(6),
            core_dumped: Some(true),
            core_dump: Some("piped to systemd-coredump".into()),
            ..Default::default()
        });
        assert_eq!(
            piped.cause,
            "died of SIGABRT (core piped to systemd-coredump)"
        );
    }

    #[test]
    fn an_exit_code_comes_with_the_exception_and_the_last_lines() {
        let mut output: Vec<String> = (0..30).map(|i| format!("step {i}")).collect();
        output.extend(lines(
            "Traceback (most recent call last):\n  File \"job.py\", line 3, in <module>\n    raise RuntimeError(\"boom\")\nRuntimeError: boom",
        ));
        let d = explain(&DeathFacts {
            exit_code: Some(1),
            output,
            ..Default::default()
        });
        assert_eq!(d.cause, "exited with code 1: RuntimeError: boom");
        assert_eq!(d.exception.as_deref(), Some("RuntimeError: boom"));
        let tail = d.output_tail.unwrap();
        assert_eq!(tail.len(), TAIL_LINES);
        assert_eq!(tail.last().map(String::as_str), Some("RuntimeError: boom"));
        assert_eq!(d.oom_killed, Some(false));
    }

    #[test]
    fn a_shell_code_above_128_says_what_it_means() {
        let d = explain(&DeathFacts {
            exit_code: Some(137),
            ..Default::default()
        });
        assert_eq!(
            d.cause,
            "exited with code 137 (as a shell reports a child that died of SIGKILL)"
        );
    }

    #[test]
    fn exception_lines() {
        let chained = lines(
            "Traceback (most recent call last):\n  File \"a.py\", line 1\nValueError: first\n\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"a.py\", line 3\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n[rank1]: some trailing log",
        );
        assert_eq!(
            exception_line(&chained).as_deref(),
            Some("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
        );
        assert_eq!(
            exception_line(&lines(
                "Traceback (most recent call last):\n  File \"x\"\nKeyboardInterrupt"
            ))
            .as_deref(),
            Some("KeyboardInterrupt")
        );
        assert_eq!(exception_line(&lines("loss: 0.5\nstep: 3")), None);
        assert_eq!(
            exception_line(&lines("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x.py\", line 1\n[rank0]: RuntimeError: Connection closed by peer")).as_deref(),
            Some("RuntimeError: Connection closed by peer"),
            "torch's rank prefix"
        );
        assert_eq!(
            exception_line(&lines("ERROR:root:bad\nRuntimeError: no traceback printed")).as_deref(),
            Some("RuntimeError: no traceback printed")
        );
    }

    #[test]
    fn signal_names_and_sizes() {
        assert_eq!(signal_name(11), "SIGSEGV");
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(40), "signal 40");
        assert_eq!(signal_name(0), "signal 0");
        assert_eq!(human_bytes(200 << 20), "200 MiB");
        assert_eq!(human_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(human_bytes(512), "512 B");
    }

    #[test]
    fn core_patterns() {
        let ctx = CoreContext {
            pid: 4242,
            uid: Some(0),
            signal: Some(11),
            hostname: Some("vm".into()),
            comm: Some("python3".into()),
            exe: Some("/usr/bin/python3".into()),
            cwd: Some("/work/run".into()),
            ..Default::default()
        };
        assert_eq!(
            core_location(
                "|/usr/lib/systemd/systemd-coredump %P %u %g %s %t %c %h",
                &ctx
            ),
            CoreLocation::Piped("systemd-coredump".into())
        );
        assert_eq!(
            core_location("/var/crash/core.%e.%p.%h.%%\n", &ctx),
            CoreLocation::File("/var/crash/core.python3.4242.vm.%".into())
        );
        assert_eq!(
            core_location("core", &ctx),
            CoreLocation::File("/work/run/core".into())
        );
        let uses_pid = CoreContext {
            uses_pid: true,
            ..ctx.clone()
        };
        assert_eq!(
            core_location("core", &uses_pid),
            CoreLocation::File("/work/run/core.4242".into())
        );
        assert_eq!(core_location("/cores/core.%t", &ctx), CoreLocation::Unknown);
        assert_eq!(
            core_location("core", &CoreContext { cwd: None, ..ctx }),
            CoreLocation::Unknown
        );
    }
}
