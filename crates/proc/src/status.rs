//! Parser of `/proc/PID/status` and `/proc/PID/task/TID/status`: tracer, pending signals, context switches.

use serde::{Deserialize, Serialize};

use crate::error::ParseError;

const FILE: &str = "status";

/// A set of signals, as the kernel prints it in `SigPnd`/`ShdPnd` (hex, bit `n - 1` for signal `n`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalMask(pub u64);

impl SignalMask {
    pub const SIGKILL: u32 = 9;
    pub const SIGSTOP: u32 = 19;
    pub const SIGTSTP: u32 = 20;
    pub const SIGTTIN: u32 = 21;
    pub const SIGTTOU: u32 = 22;

    pub fn contains(self, signal: u32) -> bool {
        (1..=64).contains(&signal) && self.0 & (1u64 << (signal - 1)) != 0
    }

    pub fn union(self, other: SignalMask) -> SignalMask {
        SignalMask(self.0 | other.0)
    }

    /// SIGKILL pending: an earlier kill has not taken effect yet (the task is in an uninterruptible call).
    pub fn sigkill(self) -> bool {
        self.contains(Self::SIGKILL)
    }

    /// SIGSTOP pending: typically left behind by a killed ptrace tool; the task stops once its call returns.
    pub fn sigstop(self) -> bool {
        self.contains(Self::SIGSTOP)
    }

    /// Any signal that stops the task when delivered (SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU).
    pub fn any_stop(self) -> bool {
        [Self::SIGSTOP, Self::SIGTSTP, Self::SIGTTIN, Self::SIGTTOU]
            .into_iter()
            .any(|signal| self.contains(signal))
    }
}

/// The fields of a `status` file that hangwatch uses; `None` when the kernel did not print the field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub name: Option<String>,
    pub state: Option<char>,
    pub tgid: Option<i32>,
    pub pid: Option<i32>,
    pub ppid: Option<i32>,
    /// Pid of the attached tracer (py-spy, strace, gdb); 0 when none.
    pub tracer_pid: Option<i32>,
    pub threads: Option<u64>,
    /// Signals pending on this thread.
    pub sig_pnd: Option<SignalMask>,
    /// Signals pending on the whole process.
    pub shd_pnd: Option<SignalMask>,
    pub voluntary_ctxt_switches: Option<u64>,
    pub nonvoluntary_ctxt_switches: Option<u64>,
    /// Resident memory, in kB; absent for kernel threads and zombies.
    pub vm_rss_kb: Option<u64>,
    /// Effective user id (the second field of `Uid:`): what permission checks use.
    #[serde(default)]
    pub euid: Option<u32>,
    /// Effective capabilities (`CapEff`, a bit per `CAP_*` number): what `hangwatch doctor` checks for ptrace,
    /// kernel stacks and the kernel log.
    #[serde(default)]
    pub cap_eff: Option<u64>,
    /// The pid in each pid namespace it is in, outermost first (`NSpid`): one entry outside containers, the
    /// last being what `ps` inside the container shows.
    #[serde(default)]
    pub ns_pids: Vec<i32>,
}

impl Status {
    /// The pid in its innermost pid namespace, when that is not the one this file was read from (a container).
    pub fn inner_pid(&self) -> Option<i32> {
        match self.ns_pids.as_slice() {
            [_, .., inner] => Some(*inner),
            _ => None,
        }
    }
}

impl Status {
    /// Signals pending on this thread or on its process.
    pub fn pending(&self) -> SignalMask {
        self.sig_pnd
            .unwrap_or_default()
            .union(self.shd_pnd.unwrap_or_default())
    }
}

/// Parses a `status` file. Unknown keys are ignored; a known key with a malformed value is an error.
pub fn parse_status(text: &str) -> Result<Status, ParseError> {
    if text.trim().is_empty() {
        return Err(ParseError::Empty { file: FILE });
    }
    let mut status = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "Name" => status.name = Some(value.to_owned()),
            "State" => status.state = Some(state(value)?),
            "Tgid" => status.tgid = Some(number(value, "Tgid")?),
            "Pid" => status.pid = Some(number(value, "Pid")?),
            "PPid" => status.ppid = Some(number(value, "PPid")?),
            "TracerPid" => status.tracer_pid = Some(number(value, "TracerPid")?),
            "Threads" => status.threads = Some(number(value, "Threads")?),
            "SigPnd" => status.sig_pnd = Some(mask(value, "SigPnd")?),
            "ShdPnd" => status.shd_pnd = Some(mask(value, "ShdPnd")?),
            "voluntary_ctxt_switches" => {
                status.voluntary_ctxt_switches = Some(number(value, "voluntary_ctxt_switches")?)
            }
            "nonvoluntary_ctxt_switches" => {
                status.nonvoluntary_ctxt_switches =
                    Some(number(value, "nonvoluntary_ctxt_switches")?)
            }
            "Uid" => {
                let euid = value.split_whitespace().nth(1).unwrap_or(value);
                status.euid = Some(number(euid, "Uid")?);
            }
            "NSpid" => {
                status.ns_pids = value
                    .split_whitespace()
                    .map(|p| number(p, "NSpid"))
                    .collect::<Result<_, _>>()?
            }
            "CapEff" => status.cap_eff = Some(mask(value, "CapEff")?.0),
            "VmRSS" => {
                let kb = value.strip_suffix("kB").unwrap_or(value).trim();
                status.vm_rss_kb = Some(number(kb, "VmRSS")?);
            }
            _ => {}
        }
    }
    Ok(status)
}

fn state(value: &str) -> Result<char, ParseError> {
    let mut chars = value.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None | Some(' ')) if c.is_ascii_alphabetic() => Ok(c),
        _ => Err(ParseError::invalid(FILE, "State", value)),
    }
}

fn mask(value: &str, field: &'static str) -> Result<SignalMask, ParseError> {
    if value.is_empty() || value.len() > 16 {
        return Err(ParseError::invalid(FILE, field, value));
    }
    u64::from_str_radix(value, 16)
        .map(SignalMask)
        .map_err(|_| ParseError::invalid(FILE, field, value))
}

fn number<T: std::str::FromStr>(value: &str, field: &'static str) -> Result<T, ParseError> {
    value
        .parse()
        .map_err(|_| ParseError::invalid(FILE, field, value))
}

#[cfg(test)]
mod tests {
    #[test]
    fn nspid_gives_the_pid_inside_a_container() {
        let outside = parse_status("Name:\tpython\nNSpid:\t5649\n").unwrap();
        assert_eq!(outside.ns_pids, vec![5649]);
        assert_eq!(outside.inner_pid(), None);
        let inside = parse_status("Name:\tpython\nNSpid:\t5649\t12\t3\n").unwrap();
        assert_eq!(inside.inner_pid(), Some(3));
        assert!(parse_status("Name:\tx\nNSpid:\t5649 x\n").is_err());
    }

    use super::*;
    use proptest::prelude::*;

    /// `/proc/PID/status` of a `python3 -c 'time.sleep(100)'` on this machine (kernel 6.18).
    const PYTHON_SLEEP: &str = "Name:\tpython3
Umask:\t0022
State:\tS (sleeping)
Tgid:\t5649
Ngid:\t0
Pid:\t5649
PPid:\t5645
TracerPid:\t0
Uid:\t0\t0\t0\t0
Gid:\t0\t0\t0\t0
FDSize:\t256
Groups:\t 
NStgid:\t5649
NSpid:\t5649
NSpgid:\t5645
NSsid:\t4037
Kthread:\t0
VmPeak:\t   16564 kB
VmSize:\t   16564 kB
VmLck:\t       0 kB
VmPin:\t       0 kB
VmHWM:\t   13444 kB
VmRSS:\t   13444 kB
RssAnon:\t    6864 kB
RssFile:\t    6580 kB
RssShmem:\t       0 kB
VmData:\t    7944 kB
VmStk:\t     132 kB
VmExe:\t       4 kB
VmLib:\t    4672 kB
VmPTE:\t      72 kB
VmSwap:\t       0 kB
HugetlbPages:\t       0 kB
CoreDumping:\t0
THP_enabled:\t1
untag_mask:\t0xffffffffffffffff
Threads:\t1
SigQ:\t0/96365
SigPnd:\t0000000000000000
ShdPnd:\t0000000000000000
SigBlk:\t0000000000000000
SigIgn:\t0000000001001006
SigCgt:\t0000000000000000
CapInh:\t0000000000000000
CapPrm:\t000001fffeffffff
CapEff:\t000001fffeffffff
CapBnd:\t000001fffeffffff
CapAmb:\t0000000000000000
NoNewPrivs:\t0
Seccomp:\t0
Seccomp_filters:\t0
Speculation_Store_Bypass:\tvulnerable
SpeculationIndirectBranch:\talways enabled
Cpus_allowed:\t3
Cpus_allowed_list:\t0-1
Mems_allowed:\t00000000,00000001
Mems_allowed_list:\t0
voluntary_ctxt_switches:\t20
nonvoluntary_ctxt_switches:\t11
";

    #[test]
    fn parses_a_sleeping_python() {
        let status = parse_status(PYTHON_SLEEP).unwrap();
        assert_eq!(status.name.as_deref(), Some("python3"));
        assert_eq!(status.state, Some('S'));
        assert_eq!(status.tgid, Some(5649));
        assert_eq!(status.pid, Some(5649));
        assert_eq!(status.ppid, Some(5645));
        assert_eq!(status.tracer_pid, Some(0));
        assert_eq!(status.threads, Some(1));
        assert_eq!(status.voluntary_ctxt_switches, Some(20));
        assert_eq!(status.nonvoluntary_ctxt_switches, Some(11));
        assert_eq!(status.vm_rss_kb, Some(13444));
        assert_eq!(status.euid, Some(0));
        assert_eq!(status.cap_eff, Some(0x1fffeffffff));
        assert_eq!(status.pending(), SignalMask(0));
        assert!(!status.pending().any_stop());
    }

    #[test]
    fn effective_uid_is_the_second_field_and_caps_may_be_empty() {
        let text = PYTHON_SLEEP
            .replace("Uid:\t0\t0\t0\t0", "Uid:\t1000\t65534\t1000\t65534")
            .replace("CapEff:\t000001fffeffffff", "CapEff:\t0000000000000000");
        let status = parse_status(&text).unwrap();
        assert_eq!(status.euid, Some(65534));
        assert_eq!(status.cap_eff, Some(0));
        assert!(parse_status(&PYTHON_SLEEP.replace("Uid:\t0\t0", "Uid:\t0\tx")).is_err());
    }

    #[test]
    fn traced_process_with_sigstop_left_behind() {
        let text = PYTHON_SLEEP
            .replace("TracerPid:\t0", "TracerPid:\t7001")
            .replace("ShdPnd:\t0000000000000000", "ShdPnd:\t0000000000040000");
        let status = parse_status(&text).unwrap();
        assert_eq!(status.tracer_pid, Some(7001));
        assert!(status.pending().sigstop());
        assert!(status.pending().any_stop());
        assert!(!status.pending().sigkill());
    }

    #[test]
    fn sigkill_pending_on_the_thread() {
        let text = PYTHON_SLEEP.replace("SigPnd:\t0000000000000000", "SigPnd:\t0000000000000100");
        let pending = parse_status(&text).unwrap().pending();
        assert!(pending.sigkill());
        assert!(!pending.sigstop());
    }

    #[test]
    fn terminal_stop_signals() {
        for (bits, signal) in [(0x8_0000u64, 20), (0x10_0000, 21), (0x20_0000, 22)] {
            let mask = SignalMask(bits);
            assert!(mask.contains(signal));
            assert!(mask.any_stop());
            assert!(!mask.sigstop());
        }
        assert!(!SignalMask(u64::MAX).contains(0));
        assert!(!SignalMask(u64::MAX).contains(65));
        assert!(SignalMask(u64::MAX).contains(64));
    }

    #[test]
    fn kernel_thread_has_no_rss() {
        let text =
            "Name:\tkworker/0:1\nState:\tI (idle)\nTgid:\t12\nPid:\t12\nPPid:\t2\nTracerPid:\t0\n\
                    SigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n";
        let status = parse_status(text).unwrap();
        assert_eq!(status.state, Some('I'));
        assert_eq!(status.vm_rss_kb, None);
        assert_eq!(status.voluntary_ctxt_switches, None);
    }

    #[test]
    fn malformed_known_fields_are_errors() {
        let bad = PYTHON_SLEEP.replace("SigPnd:\t0000000000000000", "SigPnd:\tzz");
        assert!(matches!(
            parse_status(&bad).unwrap_err(),
            ParseError::Invalid {
                field: "SigPnd",
                ..
            }
        ));
        let bad = PYTHON_SLEEP.replace(
            "voluntary_ctxt_switches:\t20",
            "voluntary_ctxt_switches:\t-",
        );
        assert!(parse_status(&bad).is_err());
        assert!(matches!(
            parse_status(" \n").unwrap_err(),
            ParseError::Empty { .. }
        ));
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = parse_status(&text);
        }

        #[test]
        fn never_panics_on_known_keys(
            key in prop::sample::select(vec!["State", "SigPnd", "ShdPnd", "VmRSS", "TracerPid", "Name"]),
            value in "\\PC{0,30}",
        ) {
            let _ = parse_status(&format!("{key}:\t{value}\n"));
        }

        #[test]
        fn masks_decode_every_signal(signal in 1u32..=64) {
            let text = format!("SigPnd:\t{:016x}\n", 1u64 << (signal - 1));
            let status = parse_status(&text).unwrap();
            prop_assert!(status.pending().contains(signal));
            prop_assert_eq!(status.pending().sigstop(), signal == 19);
        }
    }
}
