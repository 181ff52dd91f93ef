//! Parser of `/proc/PID/task/TID/syscall`: the system call a blocked thread is in, with its raw arguments.

use serde::{Deserialize, Serialize};

use crate::error::ParseError;

const FILE: &str = "syscall";

/// The three shapes the kernel prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyscallLine {
    /// `running`: the thread was on a CPU, so the kernel could not look.
    Running,
    /// `-1 sp pc`: blocked outside any system call, e.g. in a page fault on a frozen mount.
    NotInSyscall { sp: u64, pc: u64 },
    /// `nr a1 a2 a3 a4 a5 a6 sp pc`.
    InSyscall {
        nr: i64,
        args: [u64; 6],
        sp: u64,
        pc: u64,
    },
}

/// Parses the file. The 3-field form is what the procfs crate (0.18) rejects; it is the one a page-faulting
/// thread on a frozen filesystem shows.
pub fn parse_syscall(text: &str) -> Result<SyscallLine, ParseError> {
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    match fields.as_slice() {
        [] => Err(ParseError::Empty { file: FILE }),
        ["running"] => Ok(SyscallLine::Running),
        [nr, sp, pc] => {
            let nr: i64 = decimal(nr)?;
            if nr >= 0 {
                return Err(ParseError::invalid(FILE, "nr", &nr.to_string()));
            }
            Ok(SyscallLine::NotInSyscall {
                sp: hex(sp, "sp")?,
                pc: hex(pc, "pc")?,
            })
        }
        [nr, a1, a2, a3, a4, a5, a6, sp, pc] => Ok(SyscallLine::InSyscall {
            nr: decimal(nr)?,
            args: [
                hex(a1, "arg1")?,
                hex(a2, "arg2")?,
                hex(a3, "arg3")?,
                hex(a4, "arg4")?,
                hex(a5, "arg5")?,
                hex(a6, "arg6")?,
            ],
            sp: hex(sp, "sp")?,
            pc: hex(pc, "pc")?,
        }),
        other => Err(ParseError::invalid(FILE, "fields", &other.join(" "))),
    }
}

fn decimal(value: &str) -> Result<i64, ParseError> {
    value
        .parse()
        .map_err(|_| ParseError::invalid(FILE, "nr", value))
}

fn hex(value: &str, field: &'static str) -> Result<u64, ParseError> {
    let digits = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
        .unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ParseError::invalid(FILE, field, value));
    }
    u64::from_str_radix(digits, 16).map_err(|_| ParseError::invalid(FILE, field, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A python thread blocked writing to a full pipe (fd 4) on this machine.
    const WRITE_FD4: &str =
        "1 0x4 0x7f462c751fa0 0x1 0xc 0x0 0x7f462c74e6e8 0x7ffd205f8a70 0x7f462c11638f\n";
    /// `time.sleep(100)`: clock_nanosleep.
    const SLEEP: &str = "230 0x1 0x1 0x7fff103c4000 0x0 0x0 0x0 0x7fff103c3fe8 0x7f20ceeed503\n";

    #[test]
    fn blocked_write_on_fd_4() {
        let line = parse_syscall(WRITE_FD4).unwrap();
        let SyscallLine::InSyscall { nr, args, sp, pc } = line else {
            panic!("expected InSyscall, got {line:?}");
        };
        assert_eq!(nr, 1);
        assert_eq!(args, [4, 0x7f462c751fa0, 1, 0xc, 0, 0x7f462c74e6e8]);
        assert_eq!(sp, 0x7ffd205f8a70);
        assert_eq!(pc, 0x7f462c11638f);
    }

    #[test]
    fn sleeping_python() {
        assert!(matches!(
            parse_syscall(SLEEP).unwrap(),
            SyscallLine::InSyscall { nr: 230, .. }
        ));
    }

    #[test]
    fn running() {
        assert_eq!(parse_syscall("running\n").unwrap(), SyscallLine::Running);
    }

    #[test]
    fn blocked_outside_a_syscall_has_three_fields() {
        assert_eq!(
            parse_syscall("-1 0x7ffd1c4e0b58 0x7f3a9b2c1d4e\n").unwrap(),
            SyscallLine::NotInSyscall {
                sp: 0x7ffd1c4e0b58,
                pc: 0x7f3a9b2c1d4e
            }
        );
    }

    #[test]
    fn at_fdcwd_as_printed_by_the_kernel() {
        let line = parse_syscall(
            "257 0xffffffffffffff9c 0x7f0000001000 0x80000 0x0 0x0 0x0 0x7ffc00000000 0x7f0000002000",
        )
        .unwrap();
        let SyscallLine::InSyscall { args, .. } = line else {
            panic!("expected InSyscall, got {line:?}");
        };
        assert_eq!(args[0] as i32, -100);
    }

    #[test]
    fn malformed_lines_are_errors() {
        for bad in [
            "",
            "runnin",
            "1 0x4",
            "5 0x1 0x2",
            "1 0x4 0x1 0x1 0x0 0x0 0x0 0x1",
            "x 0x4 0x1 0x1 0x0 0x0 0x0 0x1 0x2",
            "1 0xq 0x1 0x1 0x0 0x0 0x0 0x1 0x2",
            "1 0x 0x1 0x1 0x0 0x0 0x0 0x1 0x2",
            "1 0x11112222333344445 0x1 0x1 0x0 0x0 0x0 0x1 0x2",
        ] {
            assert!(parse_syscall(bad).is_err(), "{bad:?} should not parse");
        }
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = parse_syscall(&text);
        }

        #[test]
        fn never_panics_on_near_misses(fields in prop::collection::vec("-?(0x)?[0-9a-fx]{0,18}", 0..12)) {
            let _ = parse_syscall(&fields.join(" "));
        }

        #[test]
        fn round_trips(nr in 0i64..1000, args in prop::array::uniform6(any::<u64>()), sp in any::<u64>(), pc in any::<u64>()) {
            let text = format!(
                "{nr} {:#x} {:#x} {:#x} {:#x} {:#x} {:#x} {sp:#x} {pc:#x}\n",
                args[0], args[1], args[2], args[3], args[4], args[5]
            );
            prop_assert_eq!(parse_syscall(&text).unwrap(), SyscallLine::InSyscall { nr, args, sp, pc });
        }
    }
}
