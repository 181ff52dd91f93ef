//! The `hangwatch` binary: parses the command line and hands each subcommand to its module.

// The doc comments of the command-line structs are the terminal's `--help` text (`<pid>`, `<uid>`), not HTML.
#![allow(rustdoc::invalid_html_tags)]

mod alerts;
mod commands;
mod exit;
mod fleet;
mod output;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Watches a training job from outside, names the rank that holds everyone up and why, and fails the job fast.
#[derive(Debug, Parser)]
#[command(name = "hangwatch", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// More log output on stderr (-v: debug, -vv: trace). `HANGWATCH_LOG` (tracing filter syntax) overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Read this configuration file instead of /etc/hangwatch/config.toml (docs/configuration.md); before or
    /// after the command's name.
    #[arg(long, value_name = "FILE", env = "HANGWATCH_CONFIG", global = true)]
    config: Option<std::path::PathBuf>,
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
    /// The service on each node: watches every Slurm job step on it, with no change to the jobs' scripts.
    Node(commands::node::Args),
    /// The Slurm job steps running on this machine and their ranks, found from outside the jobs.
    Steps(commands::steps::Args),
    /// Every option's effective value and where it comes from (the site's and your configuration files, the
    /// environment, defaults).
    Config(commands::config::Args),
    /// An evidence bundle as one HTML page for people: verdict, every rank, culprit, probes, kernel log, timeline.
    Report(commands::report::Args),
    /// Job tokens: `token new FILE` writes a fresh one (256 random bits) to a private file.
    Token(commands::token::Args),
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
    /// Internal: read the configuration files in a throwaway child (a home directory on a stopped filesystem).
    #[command(name = "__read-config", hide = true)]
    ReadConfig(commands::read_config::Args),
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
    hangwatch_child::start_external_programs_through_hangwatch();
    hangwatch_child::judge_binary_filesystem_with(hangwatch_inspect::reexec::binary_is_remote);
    let (cli, loaded) = match parse() {
        Ok(parsed) => parsed,
        Err(err) => return exit::finish(Err(err)),
    };
    output::init_tracing(cli.verbose);
    if let Some(loaded) = &loaded {
        for (path, why) in &loaded.skipped {
            tracing::warn!(file = %path.display(), reason = %why, "configuration file skipped");
        }
    }
    if !is_internal(&cli.command) {
        raise_open_file_limit();
    }
    if is_internal(&cli.command) {
        deaf_to_job_signals();
    }
    let config_file = cli.config.clone();
    let result = match cli.command {
        Command::Run(args) => commands::run::run(*args),
        Command::Dump(args) => commands::dump::run(args),
        Command::Kmsg(args) => commands::kmsg::run(args),
        Command::Demo(args) => commands::demo::run(args),
        Command::Probe(args) => commands::probe::run(args),
        Command::Coordinator(args) => commands::coordinator::run(*args),
        Command::Report(args) => commands::report::run(args),
        Command::Token(args) => commands::token::run(args),
        Command::Steps(args) => commands::steps::run(args),
        Command::Node(args) => commands::node::run(args, config_file.as_deref()),
        Command::Config(args) => match &loaded {
            Some(loaded) => commands::config::run(args, loaded),
            None => Err(anyhow::anyhow!("the configuration was not loaded")),
        },
        Command::Doctor(args) => commands::doctor::run(args, loaded.as_ref()),
        Command::History(args) => commands::history::run(args),
        Command::InspectChild(args) => commands::inspect_child::run(args),
        Command::ReadStrings(args) => commands::read_strings::run(args),
        Command::ReadMaps(args) => commands::read_maps::run(args),
        Command::Exec(args) => commands::exec::run(args),
        Command::ReadConfig(args) => commands::read_config::run(args),
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

/// The command line, with the configuration files and `HANGWATCH_*` variables under it for the public commands.
/// The `__` helpers `run` starts take only their command line (they read no file: a stopped home directory must
/// not hold them, and they must do exactly what their parent said).
fn parse() -> anyhow::Result<(Cli, Option<hangwatch_config::Loaded>)> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let helper = argv
        .get(1)
        .is_some_and(|a| a.to_string_lossy().starts_with("__"));
    if helper {
        return Ok((Cli::parse_from(&argv), None));
    }
    let env = |name: &str| std::env::var(name).ok();
    let loaded = hangwatch_config::load(Cli::command(), &argv, &env)?;
    let matches = loaded.root.clone().get_matches_from(&argv);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    Ok((cli, Some(loaded)))
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
        Command::Token(_) => "token",
        Command::Steps(_) => "steps",
        Command::Node(_) => "node",
        Command::Config(_) => "config",
        Command::InspectChild(_) => "__inspect-child",
        Command::ReadStrings(_) => "__read-strings",
        Command::ReadMaps(_) => "__read-maps",
        Command::Exec(_) => "__exec",
        Command::ReadConfig(_) => "__read-config",
        Command::ProbeChild(_) => "__probe-child",
        Command::LogWriter(_) => "__log-writer",
        Command::JobReaper(_) => "__job-reaper",
        Command::WriteEvidence(_) => "__write-evidence",
        Command::RecordHistory(_) => "__record-history",
        Command::ShipHistory(_) => "__ship-history",
        Command::WriteTextfile(_) => "__write-textfile",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Variables hangwatch sets for others (the ranks, a requeued attempt, an alert command) or reads for itself:
    /// none may also be an option's variable, or a nested hangwatch would take it as a setting.
    const SET_FOR_OTHERS: &[&str] = &[
        "HANGWATCH_SOCKET",
        "HANGWATCH_BEATS",
        "HANGWATCH_ATTEMPT",
        "HANGWATCH_PREVIOUS_VERDICT",
        "HANGWATCH_EXCLUDED_NODES",
        "HANGWATCH_KIND",
        "HANGWATCH_STAGE",
        "HANGWATCH_SUMMARY",
        "HANGWATCH_EVIDENCE",
        "HANGWATCH_LOG",
        "HANGWATCH_STATE_DIR",
        "HANGWATCH_CONFIG",
    ];

    #[test]
    fn every_option_of_the_public_commands_has_its_own_variable_and_no_helper_takes_any() {
        let root = hangwatch_config::with_environment_names(Cli::command());
        let mut seen = std::collections::BTreeSet::new();
        for command in root.get_subcommands() {
            for arg in command.get_arguments() {
                let variable = arg.get_env().map(|v| v.to_string_lossy().into_owned());
                if command.is_hide_set() {
                    assert_eq!(
                        variable,
                        None,
                        "{} --{:?}",
                        command.get_name(),
                        arg.get_long()
                    );
                    continue;
                }
                let Some(variable) = variable else { continue };
                assert!(
                    !SET_FOR_OTHERS.contains(&variable.as_str()),
                    "{} --{:?} would be set by {variable}, which hangwatch sets for others",
                    command.get_name(),
                    arg.get_long()
                );
                seen.insert(variable);
            }
        }
        for wanted in [
            "HANGWATCH_STALL_AFTER",
            "HANGWATCH_ACTION",
            "HANGWATCH_WEBHOOK_FILE",
            "HANGWATCH_LISTEN",
        ] {
            assert!(seen.contains(wanted), "{wanted} missing from {seen:?}");
        }
    }

    /// Every command's path from the root (`["token", "new"]`), helpers and nested commands included.
    fn command_paths(command: &clap::Command, above: &[String], out: &mut Vec<Vec<String>>) {
        for sub in command.get_subcommands() {
            let mut path = above.to_vec();
            path.push(sub.get_name().to_string());
            out.push(path.clone());
            command_paths(sub, &path, out);
        }
    }

    #[test]
    fn the_global_options_are_taken_before_or_after_every_commands_name() {
        let root = Cli::command();
        root.clone().debug_assert();
        let mut paths = Vec::new();
        command_paths(&root, &[], &mut paths);
        assert!(paths.len() > 20, "{paths:?}");
        let globals: Vec<&clap::Arg> = root.get_arguments().filter(|a| a.is_global_set()).collect();
        let longs: Vec<&str> = globals.iter().filter_map(|a| a.get_long()).collect();
        assert_eq!(longs, ["verbose", "config"]);
        let mut stack: Vec<&clap::Command> = root.get_subcommands().collect();
        while let Some(command) = stack.pop() {
            for arg in command.get_arguments() {
                assert!(
                    !arg.get_long().is_some_and(|l| longs.contains(&l))
                        && arg.get_short() != Some('v'),
                    "`hangwatch {}` has its own --{:?}: it would clash with hangwatch's global option",
                    command.get_name(),
                    arg.get_long()
                );
            }
            stack.extend(command.get_subcommands());
        }
        for path in &paths {
            let line = |tail: &[&str]| {
                let mut line = vec!["hangwatch".to_string()];
                line.extend(path.iter().cloned());
                line.extend(tail.iter().map(|t| t.to_string()));
                line
            };
            // Parsed as far as the line goes (a required argument may be missing): --config is hangwatch's.
            let matches = root
                .clone()
                .ignore_errors(true)
                .try_get_matches_from(line(&["--config", "/site/c.toml", "-v"]))
                .unwrap_or_else(|e| panic!("hangwatch {} --config FILE: {e}", path.join(" ")));
            assert_eq!(
                matches.get_one::<std::path::PathBuf>("config"),
                Some(&std::path::PathBuf::from("/site/c.toml")),
                "hangwatch {}",
                path.join(" ")
            );
            assert_eq!(
                matches.get_count("verbose"),
                1,
                "hangwatch {}",
                path.join(" ")
            );
            let help = root
                .clone()
                .try_get_matches_from(line(&["--config", "/site/c.toml", "--help"]))
                .expect_err("help");
            assert_eq!(
                help.kind(),
                clap::error::ErrorKind::DisplayHelp,
                "hangwatch {} --config FILE --help: {help}",
                path.join(" ")
            );
        }
        let cli = Cli::try_parse_from(["hangwatch", "node", "--config", "/site/n.toml"]).unwrap();
        assert_eq!(cli.config, Some(std::path::PathBuf::from("/site/n.toml")));
        let cli = Cli::try_parse_from([
            "hangwatch",
            "run",
            "--config=/site/r.toml",
            "--",
            "true",
            "--config",
            "job.toml",
        ])
        .unwrap();
        assert_eq!(cli.config, Some(std::path::PathBuf::from("/site/r.toml")));
    }

    #[test]
    fn the_shipped_example_configuration_is_valid_for_this_binary() {
        let path = std::path::Path::new("contrib/config.toml");
        let text = include_str!("../../../contrib/config.toml");
        let file = hangwatch_config::ConfigFile::parse(path, text).expect("parses");
        let root = hangwatch_config::with_environment_names(Cli::command());
        hangwatch_config::FileSettings::resolve(&root, &[file])
            .expect("every key is an option with a valid value");
    }
}
