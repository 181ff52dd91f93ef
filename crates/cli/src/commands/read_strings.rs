//! `hangwatch __read-strings`: reads NUL-terminated strings (the path arguments of blocked calls) from rank
//! processes' memory in a process the parent can abandon.
//!
//! Not for people: the roll call starts it and parses its JSON lines. `process_vm_readv` may block on a rank's
//! memory-map lock (that is why it runs here); the parent kills and abandons it then.

use std::process::ExitCode;

use hangwatch_inspect::paths::{child_main, parse_string_at, StringAt};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// PID:ADDR of a string to read (repeatable).
    #[arg(long = "at", required = true, value_parser = parse_at)]
    at: Vec<StringAt>,
}

fn parse_at(s: &str) -> Result<StringAt, String> {
    parse_string_at(s)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    child_main(&args.at, &mut out)?;
    Ok(ExitCode::SUCCESS)
}
