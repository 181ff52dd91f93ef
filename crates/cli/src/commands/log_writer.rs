//! `hangwatch __log-writer --dest PATH [--max-size BYTES --keep N]`: writes the job's log lines to their
//! destination in a process the log sink can abandon, rotating it by size.
//!
//! Not for people: the log sink (`hangwatch-logsink`) starts it, feeds it records on stdin and reads its
//! acknowledgements on stdout. It may sit in D state when the destination's filesystem freezes; that is why it
//! is a separate process.

use std::path::PathBuf;
use std::process::ExitCode;

use hangwatch_logsink::Rotation;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The log file to append to (created if missing).
    #[arg(long)]
    dest: PathBuf,
    /// DEST is in hangwatch's private report directory: create it 0600 and refuse a symlink there.
    #[arg(long)]
    private: bool,
    /// Rotate the file before it grows past this many bytes (0: never).
    #[arg(long, default_value_t = 0)]
    max_size: u64,
    /// Rotated files to keep (DEST.1 .. DEST.N) when --max-size is set.
    #[arg(long, default_value_t = 1)]
    keep: u32,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rotation = Rotation::new(args.max_size, args.keep)?;
    Ok(ExitCode::from(hangwatch_logsink::writer::writer_main(
        &args.dest,
        args.private,
        rotation,
    )))
}
