//! `hangwatch node`'s options; the service itself is `hangwatch_node` (docs/node-service.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use hangwatch_node::{NodeAction, Settings};

use hangwatch_model::parse_nonzero_duration;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Run as root, one per node (contrib/hangwatch-node.service). Each step found gets a watcher, `hangwatch run --attach`
on its tasks, with the site's [run] settings; a job asks for less with HANGWATCH_ACTION=observe in its
environment; a step that runs its own `hangwatch run` is left to it. A hung job is ended through Slurm (scancel),
so its state says so. See docs/node-service.md.")]
pub struct Args {
    /// This node's name in Slurm, where it is not the host name; on a machine that runs several emulated nodes
    /// (`slurmd -N NAME`), the only one whose steps are watched [default: the host name; every emulated node].
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// What to do about a hung step: abort (end the job through Slurm) or observe (evidence and alerts only). A
    /// job may narrow it with HANGWATCH_ACTION=observe.
    #[arg(long, value_enum, default_value = "abort")]
    action: ActionArg,
    /// How often to look for steps that started or ended.
    #[arg(long, default_value = "2s", value_name = "DUR", value_parser = parse_nonzero_duration)]
    scan_every: Duration,
    /// Where each step's evidence goes: a directory per step under it [default: the job owner's
    /// /var/tmp/hangwatch-<uid>, made theirs and private].
    #[arg(long, value_name = "DIR")]
    report_root: Option<PathBuf>,
    /// Where other nodes' services ask this one for the key of a step it hosts: a step on several nodes has one
    /// coordinator, hosted by the watcher on its first node, and one verdict; `off`: each node decides alone.
    #[arg(long, default_value = "0.0.0.0:17830", value_name = "ADDR|off")]
    peer_listen: String,
    /// Where node NAME's service listens, where NAME and --peer-listen's port would not do: several emulated
    /// nodes on one machine, a management network (repeatable).
    #[arg(long = "peer", value_name = "NAME=HOST:PORT")]
    peers: Vec<String>,
    /// munged's socket, through which the services of a job agree on its coordinator's secret [default: munge's
    /// own, /run/munge/munge.socket.2].
    #[arg(long, value_name = "PATH")]
    munge_socket: Option<PathBuf>,
    /// Keep every kernel-log line of a hang in root's kernel-log.root.txt (0600) beside the evidence; the job's
    /// owner gets only the lines about their job either way (the node's log may name other users' processes).
    #[arg(long)]
    keep_kernel_log: bool,
}

/// `--action`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ActionArg {
    Observe,
    Abort,
}

pub fn run(args: Args, config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let settings = Settings {
        node_name: args.node_name,
        action: match args.action {
            ActionArg::Observe => NodeAction::Observe,
            ActionArg::Abort => NodeAction::Abort,
        },
        scan_every: args.scan_every,
        report_root: args.report_root,
        peer_listen: args.peer_listen,
        peers: args.peers,
        munge_socket: args.munge_socket,
        keep_kernel_log: args.keep_kernel_log,
    };
    hangwatch_node::run(settings, config)
}
