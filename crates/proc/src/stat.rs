//! Parser of `/proc/PID/stat` and `/proc/PID/task/TID/stat`: state, parentage and CPU time of a task.

use serde::{Deserialize, Serialize};

use crate::error::ParseError;

const FILE: &str = "stat";

/// The fields of a `stat` line that hangwatch uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStat {
    pub pid: i32,
    /// Task name; may contain spaces and parentheses, at most 15 bytes.
    pub comm: String,
    /// State letter (R, S, D, T, t, Z, X, I, P, W, K).
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    /// User CPU time, in clock ticks (`clk_tck` per second).
    pub utime: u64,
    /// System CPU time, in clock ticks.
    pub stime: u64,
    pub num_threads: i64,
    /// Start time after boot, in clock ticks: together with the tid it tells a reused tid from the same thread.
    pub starttime: u64,
    /// CPU the task last ran on.
    pub processor: Option<i32>,
}

impl TaskStat {
    /// User plus system CPU time, in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        self.utime.saturating_add(self.stime)
    }
}

/// Parses one `stat` line. The name is taken up to the LAST `)`, since it may itself contain `)`.
pub fn parse_stat(text: &str) -> Result<TaskStat, ParseError> {
    let text = text.trim_end_matches(['\n', '\0']);
    if text.trim().is_empty() {
        return Err(ParseError::Empty { file: FILE });
    }
    let open = text.find('(').ok_or(ParseError::Missing {
        file: FILE,
        field: "comm",
    })?;
    let close = text.rfind(')').ok_or(ParseError::Missing {
        file: FILE,
        field: "comm",
    })?;
    if close < open {
        return Err(ParseError::invalid(FILE, "comm", text));
    }
    let pid = number(text[..open].trim(), "pid")?;
    let comm = text[open + 1..close].to_owned();
    let rest: Vec<&str> = text[close + 1..].split_ascii_whitespace().collect();
    let field = |index: usize, name: &'static str| -> Result<&str, ParseError> {
        rest.get(index).copied().ok_or(ParseError::Missing {
            file: FILE,
            field: name,
        })
    };
    let state_field = field(0, "state")?;
    let mut chars = state_field.chars();
    let state = match (chars.next(), chars.next()) {
        (Some(c), None) => c,
        _ => return Err(ParseError::invalid(FILE, "state", state_field)),
    };
    Ok(TaskStat {
        pid,
        comm,
        state,
        ppid: number(field(1, "ppid")?, "ppid")?,
        pgrp: number(field(2, "pgrp")?, "pgrp")?,
        session: number(field(3, "session")?, "session")?,
        utime: number(field(11, "utime")?, "utime")?,
        stime: number(field(12, "stime")?, "stime")?,
        num_threads: number(field(17, "num_threads")?, "num_threads")?,
        starttime: number(field(19, "starttime")?, "starttime")?,
        processor: rest.get(36).and_then(|v| v.parse().ok()),
    })
}

fn number<T: std::str::FromStr>(value: &str, field: &'static str) -> Result<T, ParseError> {
    value
        .parse()
        .map_err(|_| ParseError::invalid(FILE, field, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A `python3 -c 'time.sleep(100)'` on this machine (kernel 6.18, x86_64).
    const PYTHON_SLEEP: &str = "5649 (python3) S 5645 5645 4037 0 -1 4194304 2912 6565 0 9 4 2 3 3 20 0 1 0 36146 \
16961536 3328 18446744073709551615 94444203057152 94444203057493 140733465773424 0 0 0 0 16781318 0 1 0 0 17 1 0 0 \
0 0 0 94444203068848 94444203069464 94444883738624 140733465778399 140733465778472 140733465778472 140733465780175 0\n";

    /// A busy-looping thread of a two-thread python process.
    const PYTHON_SPIN_THREAD: &str = "5732 (python3) R 5645 5645 4037 0 -1 4194368 3 6593 0 9 86 0 3 3 20 0 2 0 \
36162 92491776 3332 18446744073709551615 94590843932672 94590843933013 140725146587296 0 0 0 0 16781318 0 0 0 0 -1 \
1 0 0 0 0 0 94590843944368 94590843944984 94591611023360 140725146589248 140725146589480 140725146589480 \
140725146591183 0\n";

    #[test]
    fn parses_a_sleeping_python() {
        let stat = parse_stat(PYTHON_SLEEP).unwrap();
        assert_eq!(stat.pid, 5649);
        assert_eq!(stat.comm, "python3");
        assert_eq!(stat.state, 'S');
        assert_eq!((stat.ppid, stat.pgrp, stat.session), (5645, 5645, 4037));
        assert_eq!((stat.utime, stat.stime), (4, 2));
        assert_eq!(stat.cpu_ticks(), 6);
        assert_eq!(stat.num_threads, 1);
        assert_eq!(stat.starttime, 36146);
        assert_eq!(stat.processor, Some(1));
    }

    #[test]
    fn parses_a_running_thread() {
        let stat = parse_stat(PYTHON_SPIN_THREAD).unwrap();
        assert_eq!(stat.pid, 5732);
        assert_eq!(stat.state, 'R');
        assert_eq!(stat.utime, 86);
        assert_eq!(stat.num_threads, 2);
    }

    #[test]
    fn comm_with_spaces_and_parentheses_ends_at_the_last_paren() {
        let line = PYTHON_SLEEP.replace("(python3)", "(a) b (c) R)");
        let stat = parse_stat(&line).unwrap();
        assert_eq!(stat.comm, "a) b (c) R");
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.ppid, 5645);
    }

    #[test]
    fn empty_comm_is_fine() {
        let stat = parse_stat(&PYTHON_SLEEP.replace("(python3)", "()")).unwrap();
        assert_eq!(stat.comm, "");
    }

    #[test]
    fn old_kernel_without_processor_field() {
        let short: Vec<&str> = PYTHON_SLEEP.split(' ').take(38).collect();
        let stat = parse_stat(&short.join(" ")).unwrap();
        assert_eq!(stat.processor, None);
        assert_eq!(stat.starttime, 36146);
    }

    #[test]
    fn truncated_line_names_the_missing_field() {
        let err = parse_stat("12 (x) S 1 1 1 0").unwrap_err();
        assert_eq!(
            err,
            ParseError::Missing {
                file: "stat",
                field: "utime"
            }
        );
        assert!(matches!(
            parse_stat("").unwrap_err(),
            ParseError::Empty { .. }
        ));
        assert!(matches!(
            parse_stat("12 x S").unwrap_err(),
            ParseError::Missing { field: "comm", .. }
        ));
        assert!(matches!(
            parse_stat(") 12 (x").unwrap_err(),
            ParseError::Invalid { field: "comm", .. }
        ));
        assert!(matches!(
            parse_stat(&PYTHON_SLEEP.replace(" S ", " SS ")).unwrap_err(),
            ParseError::Invalid { field: "state", .. }
        ));
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = parse_stat(&text);
        }

        #[test]
        fn never_panics_on_mangled_real_lines(cut in 0usize..400, junk in "[ ()0-9a-zA-Z-]{0,20}") {
            let mut line: String = PYTHON_SLEEP.chars().take(cut).collect();
            line.push_str(&junk);
            let _ = parse_stat(&line);
        }

        #[test]
        fn any_comm_round_trips(comm in "[^\\n]{0,15}") {
            let line = PYTHON_SLEEP.replacen("python3", &comm, 1);
            let stat = parse_stat(&line).unwrap();
            prop_assert_eq!(stat.comm, comm);
            prop_assert_eq!(stat.state, 'S');
        }
    }
}
