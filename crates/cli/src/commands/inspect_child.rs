//! `hangwatch __inspect-child`: reads rank environments and Python stacks in a process the parent can abandon.
//!
//! Not for people: `dump` and the agent start it with the pids to read and parse its JSON lines (with `--serve`,
//! the agent keeps it between roll calls, readers prepared: `hangwatch_inspect::prepared`). It may block in
//! the kernel (that is why it exists); the parent kills and abandons it then.

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Process to read (repeatable).
    #[arg(long = "pid", required_unless_present = "serve")]
    pids: Vec<i32>,
    /// Stay up and take requests (prepare, read) as JSON lines on stdin, until it closes.
    #[arg(long, conflicts_with_all = ["pids", "env_only"])]
    serve: bool,
    /// Read only the rank environment, not the Python stack.
    #[arg(long)]
    env_only: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.serve {
        hangwatch_inspect::pystack::serve_main(std::io::stdin().lock(), &mut out)?;
        return Ok(ExitCode::SUCCESS);
    }
    hangwatch_inspect::pystack::child_main(&args.pids, !args.env_only, &mut out)?;
    Ok(ExitCode::SUCCESS)
}
