//! Kernel-log text (dmesg -T, dmesg, syslog, raw /dev/kmsg, any mix, not necessarily UTF-8) through the whole
//! reading path: parser, report, rendering. None of it may panic.
#![no_main]

use hangwatch_kmsg::report::{ReportOptions, Since};
use hangwatch_kmsg::{render_event, render_report, report_from_reader, Parser};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the options, so the boot-time and `--since` paths are reached too.
    let (options, log) = match data.split_first() {
        Some((&b, rest)) => {
            let options = ReportOptions {
                boot_unix_s: (b & 1 == 1).then_some(1_700_000_000.25),
                since: match b >> 1 & 3 {
                    1 => Some(Since::Monotonic(f64::from(b))),
                    2 => Some(Since::Monotonic(-1.0)),
                    _ => None,
                },
            };
            (options, rest)
        }
        None => (ReportOptions::default(), data),
    };
    if let Ok(report) = report_from_reader(log, &options) {
        let _ = render_report(&report);
    }

    // Line by line, as the live follower feeds it, with the events rendered one by one.
    let text = String::from_utf8_lossy(log);
    let mut parser = Parser::with_boot_time(options.boot_unix_s);
    let mut events = Vec::new();
    for line in text.split('\n') {
        parser.push_line(line, &mut events);
    }
    parser.flush(&mut events);
    for event in &events {
        let _ = render_event(event);
    }
});
