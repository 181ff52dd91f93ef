//! `hangwatch __log-writer --dest PATH`: writes the job's log lines to their destination in a process the log
//! sink can abandon.
//!
//! Not for people: the log sink (`hangwatch-logsink`) starts it, feeds it records on stdin and reads its
//! acknowledgements on stdout. It may sit in D state when the destination's filesystem freezes; that is why it
//! is a separate process.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The log file to append to (created if missing).
    #[arg(long)]
    dest: PathBuf,
    /// DEST is in hangwatch's private report directory: create it 0600 and refuse a symlink there.
    #[arg(long)]
    private: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    Ok(ExitCode::from(hangwatch_logsink::writer::writer_main(
        &args.dest,
        args.private,
    )))
}
