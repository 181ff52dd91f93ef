//! Every /proc parser of hangwatch-proc on arbitrary text; the first byte picks the parser. None may panic.
#![no_main]

use hangwatch_proc::{
    decode_syscall, parse_environ, parse_fdinfo, parse_io, parse_mountinfo, parse_stack, parse_stat,
    parse_status, parse_syscall, parse_wchan, resolve_file_ref, unescape, RankEnv,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    match which % 10 {
        0 => {
            let _ = parse_stat(&text);
        }
        1 => {
            if let Ok(status) = parse_status(&text) {
                let _ = format!("{status:?}");
            }
        }
        2 => {
            if let Ok(line) = parse_syscall(&text) {
                let _ = decode_syscall(line, &mut |_| None);
            }
        }
        3 => {
            let _ = parse_wchan(&text);
        }
        4 => {
            let _ = parse_stack(&text);
        }
        5 => {
            let _ = parse_fdinfo(&text);
        }
        6 => {
            // mountinfo, then the lookups a file reference makes in it.
            let (table, link) = text.split_once('\0').unwrap_or((&text, "/shared/log.txt"));
            if let Ok(mounts) = parse_mountinfo(table) {
                for id in [0, 1, 27, 40, u32::MAX] {
                    let _ = resolve_file_ref(link, Some(id), Some(&mounts));
                }
                let _ = resolve_file_ref(link, None, Some(&mounts));
            }
        }
        7 => {
            let _ = parse_io(&text);
        }
        8 => {
            let env = parse_environ(rest);
            let _ = RankEnv::from_environ(&env);
        }
        _ => {
            let _ = unescape(&text);
        }
    }
});
