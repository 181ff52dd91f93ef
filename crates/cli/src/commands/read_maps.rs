//! `hangwatch __read-maps`: reads `/proc/PID/maps` (the memory-mapped files) of rank processes blocked in a page
//! fault, in a process the parent can abandon.
//!
//! Not for people: the roll call starts it and parses its JSON lines. The read takes the rank's mmap lock, which
//! the fault may hold (that is why it runs here); the parent kills and abandons it then.

use std::path::PathBuf;
use std::process::ExitCode;

use hangwatch_inspect::maps::child_main;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Process whose map to read (repeatable).
    #[arg(long = "pid", required = true)]
    pid: Vec<i32>,
    /// Where /proc is.
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    child_main(&args.proc_root, &args.pid, &mut out)?;
    Ok(ExitCode::SUCCESS)
}
