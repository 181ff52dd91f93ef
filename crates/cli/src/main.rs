//! The `hangwatch` binary: parses the command line and hands each subcommand to its module.

mod commands;
mod duration;
mod exit;
mod output;
mod size;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Watches a training job from outside, names the rank that holds everyone up and why, and fails the job fast.
#[derive(Debug, Parser)]
#[command(name = "hangwatch", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// More log output on stderr (-v: debug, -vv: trace). `HANGWATCH_LOG` (tracing filter syntax) overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a job and watch it: detect a stall, name the rank and why, keep the evidence, end the job.
    Run(commands::run::Args),
    /// Roll call now: every rank's state, kernel call, file, mount and Python stack; the outlier named.
    Dump(commands::dump::Args),
    /// Read a kernel log and report hung tasks, GPU Xid errors and filesystem complaints.
    Kmsg(commands::kmsg::Args),
    /// Is the filesystem holding PATH responsive? Never blocks longer than the timeout.
    Probe(commands::probe::Args),
    /// The multi-node coordinator.
    Coordinator(commands::not_yet::Args),
    /// Past verdicts kept on this machine.
    History(commands::not_yet::Args),
    /// What on this machine would make a hang silent or hangwatch blind.
    Doctor(commands::not_yet::Args),
    /// The seed incident on this machine: a rank logging to a filesystem that freezes.
    Demo(commands::demo::Args),
    /// Render an evidence bundle for people.
    Report(commands::not_yet::Args),
    /// Internal: read Python stacks and environment of rank processes in a throwaway child (used by dump).
    #[command(name = "__inspect-child", hide = true)]
    InspectChild(commands::inspect_child::Args),
    /// Internal: probe one path in a throwaway child (used by probe).
    #[command(name = "__probe-child", hide = true)]
    ProbeChild(commands::probe::ChildArgs),
    /// Internal: write log lines to their destination in a process the log sink can abandon.
    #[command(name = "__log-writer", hide = true)]
    LogWriter(commands::log_writer::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    output::init_tracing(cli.verbose);
    let name = command_name(&cli.command);
    let result = match cli.command {
        Command::Run(args) => commands::run::run(args),
        Command::Dump(args) => commands::dump::run(args),
        Command::Kmsg(args) => commands::kmsg::run(args),
        Command::Demo(args) => commands::demo::run(args),
        Command::Probe(args) => commands::probe::run(args),
        Command::Coordinator(args)
        | Command::History(args)
        | Command::Doctor(args)
        | Command::Report(args) => commands::not_yet::run(name, args),
        Command::InspectChild(args) => commands::inspect_child::run(args),
        Command::ProbeChild(args) => commands::probe::run_child(args),
        Command::LogWriter(args) => commands::log_writer::run(args),
    };
    exit::finish(result)
}

fn command_name(command: &Command) -> &'static str {
    match command {
        Command::Run(_) => "run",
        Command::Dump(_) => "dump",
        Command::Kmsg(_) => "kmsg",
        Command::Probe(_) => "probe",
        Command::Coordinator(_) => "coordinator",
        Command::History(_) => "history",
        Command::Doctor(_) => "doctor",
        Command::Demo(_) => "demo",
        Command::Report(_) => "report",
        Command::InspectChild(_) => "__inspect-child",
        Command::ProbeChild(_) => "__probe-child",
        Command::LogWriter(_) => "__log-writer",
    }
}
