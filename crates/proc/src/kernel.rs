//! Parsers of `wchan` and `stack`: where in the kernel a thread waits.

/// Parses `/proc/PID/task/TID/wchan`: the kernel function a sleeping thread waits in. `0` (or nothing) means
/// the thread is running or the kernel does not say.
pub fn parse_wchan(text: &str) -> Option<String> {
    let symbol = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    if symbol.is_empty() || symbol == "0" {
        None
    } else {
        Some(symbol.to_owned())
    }
}

/// Parses `/proc/PID/task/TID/stack` into function names, innermost first: `[<0>] percpu_rwsem_wait+0x13c/0x170`
/// becomes `percpu_rwsem_wait`; a module suffix is kept (`request_wait_answer [fuse]`). Addresses and offsets
/// change from boot to boot and would make verdicts differ for the same hang.
pub fn parse_stack(text: &str) -> Vec<String> {
    text.lines().filter_map(frame).collect()
}

fn frame(line: &str) -> Option<String> {
    let mut rest = line.trim();
    if let Some(after) = rest.strip_prefix("[<") {
        rest = after.split_once(">]").map_or("", |(_, tail)| tail).trim();
    }
    if rest.is_empty() {
        return None;
    }
    let (symbol, tail) = match rest.find(char::is_whitespace) {
        Some(space) => (&rest[..space], rest[space..].trim()),
        None => (rest, ""),
    };
    let name = symbol.split_once('+').map_or(symbol, |(name, _)| name);
    if name.is_empty() {
        return None;
    }
    let module = tail
        .split_ascii_whitespace()
        .next()
        .filter(|token| token.starts_with('['))
        .map(|token| token.trim_start_matches('[').trim_end_matches(']'))
        .filter(|module| !module.is_empty());
    match module {
        Some(module) => Some(format!("{name} [{module}]")),
        None => Some(name.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `/proc/PID/task/TID/stack` of a python writer blocked on a full pipe, on this machine.
    const PIPE_WRITE: &str = "[<0>] anon_pipe_write+0x332/0x6c0
[<0>] vfs_write+0x398/0x450
[<0>] ksys_write+0xba/0xe0
[<0>] do_syscall_64+0x71/0x280
[<0>] entry_SYSCALL_64_after_hwframe+0x76/0x7e
";

    #[test]
    fn wchan_symbol_and_none() {
        assert_eq!(
            parse_wchan("percpu_rwsem_wait").as_deref(),
            Some("percpu_rwsem_wait")
        );
        assert_eq!(
            parse_wchan("hrtimer_nanosleep").as_deref(),
            Some("hrtimer_nanosleep")
        );
        assert_eq!(parse_wchan("0"), None);
        assert_eq!(parse_wchan(""), None);
        assert_eq!(parse_wchan("0\n"), None);
    }

    #[test]
    fn stack_frames_without_addresses() {
        assert_eq!(
            parse_stack(PIPE_WRITE),
            [
                "anon_pipe_write",
                "vfs_write",
                "ksys_write",
                "do_syscall_64",
                "entry_SYSCALL_64_after_hwframe"
            ]
        );
    }

    #[test]
    fn frozen_ext4_and_fuse_frames() {
        let text = "[<0>] percpu_rwsem_wait+0x13c/0x170\n\
                    [<0>] ext4_buffered_write_iter+0x2f/0x140\n\
                    [<0>] request_wait_answer+0x12a/0x220 [fuse]\n\
                    [<0>] fuse_simple_request+0x19c/0x2f0 [fuse 3f2a9c0d]\n\
                    [<ffffffffc0a1b2c3>] 0xffffffffc0a1b2c3\n\
                    \n";
        assert_eq!(
            parse_stack(text),
            [
                "percpu_rwsem_wait",
                "ext4_buffered_write_iter",
                "request_wait_answer [fuse]",
                "fuse_simple_request [fuse]",
                "0xffffffffc0a1b2c3"
            ]
        );
    }

    #[test]
    fn running_thread_has_empty_stack() {
        assert!(parse_stack("").is_empty());
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = parse_stack(&text);
            let _ = parse_wchan(&text);
        }

        #[test]
        fn never_panics_on_near_misses(lines in prop::collection::vec("(\\[<[0-9a-f]{0,4}>?\\]?)? ?[a-z_+0-9x/]{0,12} ?(\\[[a-z ]{0,6}\\]?)?", 0..6)) {
            let frames = parse_stack(&lines.join("\n"));
            prop_assert!(frames.iter().all(|f| !f.is_empty() && !f.contains('+')));
        }
    }
}
