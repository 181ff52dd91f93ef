//! `hangwatch probe`.

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {}

#[derive(Debug, clap::Args)]
pub struct ChildArgs {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    Err(crate::exit::usage(
        "`hangwatch probe` is not implemented yet",
    ))
}

pub fn run_child(_args: ChildArgs) -> anyhow::Result<ExitCode> {
    Ok(ExitCode::SUCCESS)
}
