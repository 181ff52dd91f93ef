//! `hangwatch token new FILE`: a fresh job token in a private file, or on stdout with `-`. The writing (0600, no
//! symlink followed, no overwrite unless asked) is `hangwatch_run::secret::write_new_token`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use hangwatch_agent::human::say;
use hangwatch_run::secret::{new_token_text, write_new_token, NewTokenError};

use crate::exit::usage;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, clap::Subcommand)]
enum TokenCommand {
    /// Write a fresh job token (256 random bits, 64 hex digits) to FILE, created mode 0600.
    #[command(after_help = "\
One token per job: make it in the job's batch script before srun, in a directory every node can read (a shared \
home is fine), and give every node `--token-file FILE`. A token under 128 bits of entropy is refused by `run` \
and `coordinator`.

Exit status: 0 written; 2 FILE exists (without --force), is a symlink, or its directory cannot be opened; 1 \
the system's random source or the write failed.")]
    New(NewArgs),
}

#[derive(Debug, clap::Args)]
struct NewArgs {
    /// Where the token goes; `-` prints it on stdout. Never written through a symlink.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Replace FILE if it exists (nodes that still hold the old token can then no longer join).
    #[arg(long)]
    force: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        TokenCommand::New(args) => new(&args),
    }
}

fn new(args: &NewArgs) -> anyhow::Result<ExitCode> {
    if args.file.as_os_str() == "-" {
        let token = new_token_text()?;
        writeln!(std::io::stdout().lock(), "{token}").context("cannot print the token")?;
        say("hangwatch: printed a new job token on stdout; keep it in a file only you can read (chmod 600): \
             `--token-file` refuses any other");
        return Ok(ExitCode::SUCCESS);
    }
    write_new_token(&args.file, args.force).map_err(|e| match e {
        NewTokenError::Exists { .. } | NewTokenError::Open { .. } => {
            usage(hangwatch_model::error_chain(&e))
        }
        e => anyhow::Error::new(e),
    })?;
    say(format!(
        "hangwatch: wrote a new job token to {} (mode 0600); give every node of the job `--token-file {}`",
        args.file.display(),
        args.file.display()
    ));
    Ok(ExitCode::SUCCESS)
}
