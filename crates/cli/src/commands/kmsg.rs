//! `hangwatch kmsg`.

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    Err(crate::exit::usage(
        "`hangwatch kmsg` is not implemented yet",
    ))
}
