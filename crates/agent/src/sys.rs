//! The agent's only `unsafe`: code that runs in a forked child between `fork` and `exec`.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// The started process gets SIGKILL when hangwatch dies (SIGKILL, the OOM killer), so no rank outlives the tool
/// that would have ended it. The kernel ties this to the thread that forks: `run` launches from its main thread,
/// which lives until hangwatch exits.
pub fn die_with_parent(command: &mut Command) {
    on_parent_death(command, nix::sys::signal::Signal::SIGKILL);
}

/// The started process gets `signal` when hangwatch dies (a node service's watchers get SIGTERM: they stop
/// watching and leave the job alone). The kernel ties this to the forking thread, as for [`die_with_parent`].
pub fn on_parent_death(command: &mut Command, signal: nix::sys::signal::Signal) {
    let parent = nix::unistd::getpid();
    #[expect(
        unsafe_code,
        reason = "pre_exec is the only way to run prctl in the child before exec"
    )]
    // SAFETY: the closure only makes two system calls (prctl, getppid), both async-signal-safe; it allocates
    // nothing and touches no lock, as code between fork and exec must.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(signal)?;
            // hangwatch died between fork and prctl: the signal will never come, so go now.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}
