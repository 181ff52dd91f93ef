//! The reader never panics, whatever the input: arbitrary text, and lines built from the pieces it looks for.

use hangwatch_kmsg::{render_event, render_report, Event, Parser, ReportOptions};
use proptest::prelude::*;

const PREFIXES: &[&str] = &[
    "",
    " ",
    "[Sat Mar  4 04:10:52 2023] ",
    "[Sat Feb 30 99:99:99 2023] ",
    "[  967.723456] ",
    "[ 99999999999999999999999999999999.1] ",
    "Jun 26 12:23:15 node kernel: ",
    "Jun 26 12:23:15 node kernel: [ 1.5] ",
    "2023-03-04T04:10:52,123456+01:00 ",
    "2023-03-04T04:10:52+0100 node kernel: ",
    "6,1234,5678901,-;",
    "0,1,18446744073709551615,c;",
    "<4>",
    "kern  :info  : ",
];

const PIECES: &[&str] = &[
    "INFO: task python:280058 blocked for more than 120 seconds.",
    "INFO: task a:1 blocked for more than 18446744073709551615 seconds.",
    "INFO: task x:1 is blocked on a mutex likely owned by task y:",
    "task:python state:D stack:0 pid:280058 ppid:",
    "python D 0 280058 2 0x",
    "Call Trace:",
    "Call trace:",
    " <TASK>",
    " </TASK>",
    " ? gpfs_f_rdwr_iter+0x217/0x300 [mmfslinux]",
    " [<ffffffff8168b579>] schedule+0x",
    " percpu_rwsem_wait+0x1/0x2",
    "RIP: 0033:",
    "RSP: 002b:00007fff14b5a9d0 EFLAGS: 00000293 ORIG_RAX: ",
    "RDX: 0000000000000988 RSI: 000004b15348c010 RDI: ",
    "R13: 0 R14: 0 R15: ",
    "Code: ",
    "NVRM: Xid (PCI:",
    "NVRM: Xid (PCI:0000:3b:00): ",
    "nfs: server ",
    "LustreError: 11-0: ",
    "Lustre: a-MDT0000-mdc-ffff: Connection to ",
    "EXT4-fs (",
    "XFS (",
    "Out of memory: Killed process ",
    "Future hung task reports are suppressed",
    "\\x0a",
    "\\xzz",
    " SUBSYSTEM=",
];

fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        (
            prop::sample::select(PREFIXES),
            prop::sample::select(PIECES),
            "[ -~]{0,24}",
            any::<String>().prop_map(|s| s.chars().take(8).collect::<String>())
        )
            .prop_map(|(p, piece, ascii, tail)| format!("{p}{piece}{ascii}{tail}")),
    ]
}

fn run(lines: &[String]) {
    let mut parser = Parser::with_boot_time(Some(1_677_900_000.0));
    let mut events: Vec<Event> = Vec::new();
    for l in lines {
        parser.push_line(l, &mut events);
    }
    parser.flush(&mut events);
    for e in &events {
        let _ = render_event(e);
        let json = serde_json::to_string(e).expect("event serializes");
        let _: Event = serde_json::from_str(&json).expect("event deserializes");
    }
    let report = hangwatch_kmsg::report_from_lines(
        lines.iter().map(String::as_str),
        &ReportOptions::default(),
    );
    let hung = events
        .iter()
        .filter(|e| matches!(e, Event::HungTask(_)))
        .count();
    assert_eq!(report.hung_task_reports as usize, hung);
    assert_eq!(
        report
            .hung_tasks
            .iter()
            .map(|t| t.reports as usize)
            .sum::<usize>(),
        hung
    );
    let _ = render_report(&report);
    serde_json::to_string(&report).expect("report serializes");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_lines_never_panic(lines in prop::collection::vec(line(), 0..40)) {
        run(&lines);
    }

    /// The job's lines are some of the input's, in order, never a line made up; a scope of nothing keeps no
    /// hung-task report.
    #[test]
    fn a_jobs_lines_are_a_subsequence_of_the_log(lines in prop::collection::vec(line(), 0..40), pid in 0u32..300_000) {
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let scope = hangwatch_kmsg::JobScope {
            pids: [pid, 280_058].into_iter().collect(),
            uid: Some(1001),
            mounts: vec![("nfs4".into(), "fs01:/export".into()), ("ext4".into(), "/dev/sda1".into())],
        };
        let kept = hangwatch_kmsg::lines_of_job(&refs, &scope);
        let mut rest = refs.iter();
        for line in &kept {
            prop_assert!(rest.any(|l| std::ptr::eq(*l, *line)), "{line:?} is not next in the input");
        }
        let nobody = hangwatch_kmsg::lines_of_job(&refs, &hangwatch_kmsg::JobScope::default());
        prop_assert!(!nobody.iter().any(|l| l.contains("blocked for more than")), "{nobody:?}");
    }

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        let lines: Vec<String> = text.split('\n').map(str::to_string).collect();
        run(&lines);
    }
}
