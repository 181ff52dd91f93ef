//! `hangwatch __read-config --path FILE...`: reads the configuration files in a process the parent can abandon
//! (a home directory on a stopped filesystem), one JSON line per file.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A file to read (repeatable).
    #[arg(long = "path", required = true)]
    path: Vec<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    hangwatch_config::read_child_main(&args.path, &mut out)?;
    Ok(ExitCode::SUCCESS)
}
