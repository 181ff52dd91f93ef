//! `hangwatch __inspect-child`: reads Python stacks in a process that the parent can abandon.

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    Ok(ExitCode::SUCCESS)
}
