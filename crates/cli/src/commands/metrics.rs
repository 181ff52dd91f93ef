//! The internal `__write-textfile` child that writes the node_exporter textfile where a directory that does not
//! answer can only block it, never hangwatch; the metrics themselves are `hangwatch_run::metrics`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// `hangwatch __write-textfile DIR NAME`: the metrics on stdin, written as DIR/NAME.prom.
#[derive(Debug, clap::Args)]
pub struct TextfileArgs {
    dir: PathBuf,
    name: String,
    /// First remove hangwatch's textfiles not written for this many seconds (ended or killed runs).
    #[arg(long, value_name = "SECS")]
    prune_older_than: Option<u64>,
}

pub fn run_textfile_writer(args: TextfileArgs) -> anyhow::Result<ExitCode> {
    hangwatch_agent::metrics_feed::textfile_child_main(
        &args.dir,
        &args.name,
        args.prune_older_than.map(Duration::from_secs),
        std::io::stdin().lock(),
    )
    .map_err(|message| anyhow::anyhow!(message))?;
    Ok(ExitCode::SUCCESS)
}
