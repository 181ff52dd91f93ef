//! `hangwatch demo`'s options; the demo itself is `hangwatch_run::demo`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use hangwatch_model::{parse_duration, parse_nonzero_duration};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Ranks to start.
    #[arg(long, default_value = "4")]
    nproc: u32,
    /// Stall threshold for the demo (a real job learns its own).
    #[arg(long, default_value = "6s", value_parser = parse_nonzero_duration)]
    stall_after: Duration,
    /// Freeze the filesystem this long after the ranks start.
    #[arg(long, default_value = "4s", value_parser = parse_duration)]
    freeze_after: Duration,
    /// Where the evidence goes [default: a new demo-<UTC time>-<pid> under the per-user report root].
    #[arg(long)]
    report_dir: Option<PathBuf>,
    /// Print the verdict as one JSON document on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let named = hangwatch_run::demo::run(hangwatch_run::demo::Settings {
        nproc: args.nproc,
        stall_after: args.stall_after,
        freeze_after: args.freeze_after,
        report_dir: args.report_dir,
        json: args.json,
    })?;
    Ok(if named {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
