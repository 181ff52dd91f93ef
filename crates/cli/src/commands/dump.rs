//! `hangwatch dump`: a roll call now of every rank process on this node, the outlier named.

use std::process::ExitCode;
use std::time::Duration;

use hangwatch_agent::human::{say, write, Stream};
use hangwatch_model::{format_duration, parse_nonzero_duration};

/// Roll call of the rank processes: `--pid` names them, `--tree` finds them below a launcher.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  hangwatch dump --tree $(pgrep -f torchrun | head -1)\n  hangwatch dump --pid 4242 \
                        --pid 4243 --json\n\nRanks are never ptrace-stopped; reads that could block on a frozen \
                        filesystem run in throwaway children under deadlines."
)]
pub struct Args {
    /// A rank process (repeatable, or comma-separated).
    #[arg(long = "pid", value_delimiter = ',')]
    pids: Vec<i32>,
    /// A launcher (torchrun, accelerate, deepspeed, srun step): the outermost processes below it that carry RANK
    /// are the ranks, their descendants (DataLoader workers...) their workers (all Python processes when none
    /// carries RANK).
    #[arg(long)]
    tree: Option<i32>,
    /// Print the verdict as one JSON document on stdout.
    #[arg(long)]
    json: bool,
    /// Time between the two samples of /proc; a thread with no context switch in it "is not running".
    #[arg(long, default_value = "300ms", value_parser = parse_nonzero_duration)]
    window: Duration,
    /// Give up on a rank's Python stack after this long (its memory may be locked by a stuck thread).
    #[arg(long, default_value = "1s", value_parser = parse_nonzero_duration)]
    stack_timeout: Duration,
    /// Give up on a filesystem probe after this long.
    #[arg(long, default_value = "1s", value_parser = parse_nonzero_duration)]
    probe_timeout: Duration,
    /// Do not read Python stacks.
    #[arg(long)]
    no_stacks: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let dump = hangwatch_run::dump::roll_call(&hangwatch_run::dump::Settings {
        pids: args.pids,
        tree: args.tree,
        window: args.window,
        stack_timeout: args.stack_timeout,
        probe_timeout: args.probe_timeout,
        read_stacks: !args.no_stacks,
    })?;
    if args.json {
        crate::output::print_json(&dump.verdict)?;
    } else {
        write(
            Stream::Stdout,
            hangwatch_agent::render::verdict_text(&dump.verdict).into_bytes(),
        );
        say(format!(
            "(roll call of {} processes in {})",
            dump.processes,
            format_duration(dump.elapsed)
        ));
    }
    Ok(ExitCode::SUCCESS)
}
