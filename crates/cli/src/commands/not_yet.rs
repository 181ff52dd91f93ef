//! Subcommands that a later piece of work fills in: they say so clearly instead of doing nothing.

use std::process::ExitCode;

/// Arguments are accepted and ignored so that `--help` works.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

pub fn run(name: &str, _args: Args) -> anyhow::Result<ExitCode> {
    Err(crate::exit::usage(format!(
        "`hangwatch {name}` is not implemented yet in this version; see README.md for what works today"
    )))
}
