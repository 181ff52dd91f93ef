//! Parser of `/proc/PID/cmdline`, and what a command line says about how a process was started.
//!
//! Parser only: reading `cmdline` takes the target's mmap lock, so it is read where `environ` is (in a throwaway
//! child) and the bytes are handed here.

/// The arguments, split at NUL; empty arguments are dropped, bytes that are not UTF-8 replaced.
pub fn parse_cmdline(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// Whether `multiprocessing` started this process with its spawn method (as `torch.multiprocessing.spawn` and a
/// spawn-context DataLoader do): `python -c "from multiprocessing.spawn import spawn_main; spawn_main(...)"
/// --multiprocessing-fork`. A forked child of such a process keeps the same command line.
pub fn is_multiprocessing_spawn(args: &[String]) -> bool {
    args.iter().any(|a| {
        a == "--multiprocessing-fork" || a.contains("from multiprocessing.spawn import spawn_main")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawned_child_is_told_by_its_command_line() {
        let args = parse_cmdline(
            b"/venv/bin/python\0-c\0from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, \
pipe_handle=7)\0--multiprocessing-fork\0",
        );
        assert_eq!(args.len(), 4);
        assert!(is_multiprocessing_spawn(&args));
        assert!(!is_multiprocessing_spawn(&parse_cmdline(
            b"python\0-u\0train.py\0--lr\x000.1\0"
        )));
        assert!(parse_cmdline(b"").is_empty());
    }
}
