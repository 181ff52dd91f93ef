//! The `hangwatch` binary: parses the command line and hands each subcommand to its module.

mod alerts;
mod commands;
mod dirs;
mod duration;
mod exit;
mod fleet;
mod job_events;
mod output;
mod requeue;
mod secret;
mod size;
mod storage_wait;

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
    Run(Box<commands::run::Args>),
    /// Roll call now: every rank's state, kernel call, file, mount and Python stack; the outlier named.
    Dump(commands::dump::Args),
    /// Read a kernel log and report hung tasks, GPU Xid errors and filesystem complaints.
    Kmsg(commands::kmsg::Args),
    /// Is the filesystem holding PATH responsive? Never blocks longer than the timeout.
    Probe(commands::probe::Args),
    /// The multi-node coordinator: agents of one job join it, it names the hung rank across nodes.
    Coordinator(Box<commands::coordinator::Args>),
    /// Past verdicts kept on this machine, and how often each cause recurred, where and when.
    History(commands::history::Args),
    /// What on this machine would make a hang silent or hangwatch blind.
    Doctor(commands::doctor::Args),
    /// The seed incident on this machine: a rank logging to a filesystem that freezes.
    Demo(commands::demo::Args),
    /// An evidence bundle as one HTML page for people: verdict, every rank, culprit, probes, kernel log, timeline.
    Report(commands::report::Args),
    /// Internal: read Python stacks and environment of rank processes in a throwaway child (used by dump).
    #[command(name = "__inspect-child", hide = true)]
    InspectChild(commands::inspect_child::Args),
    /// Internal: read path arguments from rank processes' memory in a throwaway child (used by the roll call).
    #[command(name = "__read-strings", hide = true)]
    ReadStrings(commands::read_strings::Args),
    /// Internal: read the memory maps of rank processes blocked in a page fault in a throwaway child (used by the
    /// roll call).
    #[command(name = "__read-maps", hide = true)]
    ReadMaps(commands::read_maps::Args),
    /// Internal: exec an external program (scontrol, sbatch, an alert's shell) from a child hangwatch can abandon
    /// if the exec itself blocks on a stopped filesystem.
    #[command(name = "__exec", hide = true)]
    Exec(commands::exec::Args),
    /// Internal: probe one path in a throwaway child (used by probe).
    #[command(name = "__probe-child", hide = true)]
    ProbeChild(commands::probe::ChildArgs),
    /// Internal: write log lines to their destination in a process the log sink can abandon.
    #[command(name = "__log-writer", hide = true)]
    LogWriter(commands::log_writer::Args),
    /// Internal: end the job's processes if `run` dies.
    #[command(name = "__job-reaper", hide = true)]
    JobReaper(commands::job_children::ReaperArgs),
    /// Internal: write evidence files in a process `run` can abandon.
    #[command(name = "__write-evidence", hide = true)]
    WriteEvidence(commands::job_children::EvidenceArgs),
    /// Internal: record a verdict in the node's history in a process `run` can abandon.
    #[command(name = "__record-history", hide = true)]
    RecordHistory(commands::history::RecordArgs),
    /// Internal: ship the verdicts that wait in the node's history to the fleet database (at `run` start).
    #[command(name = "__ship-history", hide = true)]
    ShipHistory(commands::history::ShipArgs),
    /// Internal: write the node_exporter metrics textfile in a process `run` can abandon.
    #[command(name = "__write-textfile", hide = true)]
    WriteTextfile(commands::metrics::TextfileArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    output::init_tracing(cli.verbose);
    hangwatch_child::start_external_programs_through_hangwatch();
    hangwatch_child::judge_binary_filesystem_with(hangwatch_inspect::reexec::binary_is_remote);
    if !is_internal(&cli.command) {
        raise_open_file_limit();
    }
    if is_internal(&cli.command) {
        deaf_to_job_signals();
    }
    let result = match cli.command {
        Command::Run(args) => commands::run::run(*args),
        Command::Dump(args) => commands::dump::run(args),
        Command::Kmsg(args) => commands::kmsg::run(args),
        Command::Demo(args) => commands::demo::run(args),
        Command::Probe(args) => commands::probe::run(args),
        Command::Coordinator(args) => commands::coordinator::run(*args),
        Command::Report(args) => commands::report::run(args),
        Command::Doctor(args) => commands::doctor::run(args),
        Command::History(args) => commands::history::run(args),
        Command::InspectChild(args) => commands::inspect_child::run(args),
        Command::ReadStrings(args) => commands::read_strings::run(args),
        Command::ReadMaps(args) => commands::read_maps::run(args),
        Command::Exec(args) => commands::exec::run(args),
        Command::ProbeChild(args) => commands::probe::run_child(args),
        Command::LogWriter(args) => commands::log_writer::run(args),
        Command::JobReaper(args) => commands::job_children::run_reaper(args),
        Command::WriteEvidence(args) => commands::job_children::run_evidence_writer(args),
        Command::RecordHistory(args) => commands::history::run_record(args),
        Command::ShipHistory(args) => commands::history::run_ship(args),
        Command::WriteTextfile(args) => commands::metrics::run_textfile_writer(args),
    };
    exit::finish(result)
}

/// Most open files the soft limit is raised to.
const OPEN_FILES_WANTED: u64 = 65_536;

/// Raises the soft limit on open files towards the hard one (at most [`OPEN_FILES_WANTED`]): the roll call's
/// /proc reads and children, probes, log pipes and connections all take descriptors, and the usual soft limit
/// (1,024) is the first to run out on a node with many ranks. The job's ranks inherit the raised soft limit, as
/// under a shell whose `ulimit -n` was raised (the hard limit is untouched).
fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let wanted = hard.min(OPEN_FILES_WANTED);
    if soft < wanted {
        if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, wanted, hard) {
            tracing::debug!(error = %e, soft, hard, "cannot raise the open-file limit");
        }
    }
}

/// The children `run` starts for itself (never the job's).
fn is_internal(command: &Command) -> bool {
    command_name(command).starts_with("__")
}

/// A scheduler signals every process of a job step (`scancel`, a time limit: SIGTERM to all, SIGKILL after
/// KillWait), hangwatch's own helpers included. The helpers must outlive that SIGTERM: the log writer still has
/// the job's last lines, the evidence writer the verdict. `run` ends them itself (SIGKILL at a deadline, or the
/// end of their input), so they are deaf to the polite signals.
fn deaf_to_job_signals() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    for sig in [SIGHUP, SIGINT, SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, std::sync::Arc::default()) {
            tracing::debug!(signal = sig, error = %e, "cannot ignore a signal in a helper child");
        }
    }
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
        Command::ReadStrings(_) => "__read-strings",
        Command::ReadMaps(_) => "__read-maps",
        Command::Exec(_) => "__exec",
        Command::ProbeChild(_) => "__probe-child",
        Command::LogWriter(_) => "__log-writer",
        Command::JobReaper(_) => "__job-reaper",
        Command::WriteEvidence(_) => "__write-evidence",
        Command::RecordHistory(_) => "__record-history",
        Command::ShipHistory(_) => "__ship-history",
        Command::WriteTextfile(_) => "__write-textfile",
    }
}
