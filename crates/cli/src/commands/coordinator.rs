//! `hangwatch coordinator`'s options and its `--json` document; the program is `hangwatch_run::coordinator`.
//! Refuses a token file that others can read.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use hangwatch_model::{parse_nonzero_duration, NoHang};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where agents reach the coordinator (HOST:PORT; port 0 picks a free one and prints it).
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// The job's shared secret, readable by its owner only (chmod 600); the same file on every node.
    #[arg(long, value_name = "FILE")]
    token_file: PathBuf,
    /// The job's id, as the agents have it (their `--job-id`, else SLURM_JOB_ID, else `job`); with the token it
    /// makes the link's key, so an agent of another job cannot even connect [default: SLURM_JOB_ID, else `job`].
    #[arg(long)]
    job_id: Option<String>,
    /// The job's node count: once that many nodes have joined, a new one is refused as a late join.
    #[arg(long)]
    nnodes: Option<usize>,
    /// A node silent this long is `node_unreachable`.
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = parse_nonzero_duration)]
    silence: Duration,
    /// What to do about a hang: `abort` orders every node to end its ranks (they exit 75); `observe` only takes
    /// the roll call and says the verdict; `requeue` is `abort` here (node rank 0's `run --action requeue`
    /// submits the next attempt).
    #[arg(long, value_enum, default_value = "abort")]
    action: crate::commands::run::Action,
    /// The latest a job whose ranks compute without progress is ended (as `run --max-stall`; the agents' own
    /// thresholds decide when a stall begins): docs/false-alarms.md.
    #[arg(long, default_value = "30m", value_parser = parse_nonzero_duration)]
    max_stall: Duration,
    /// Print the last verdict (or that there was no hang) as one JSON document on stdout at the end.
    #[arg(long)]
    json: bool,
    /// Each verdict is kept here (verdict.json, verdict.txt); must be node-local; made private (0700) [default:
    /// a new coordinator-<UTC time>-<pid> under /var/tmp/hangwatch-<uid>].
    #[arg(long)]
    report_dir: Option<PathBuf>,
    #[command(flatten)]
    alerts: crate::alerts::AlertArgs,
    /// Serve Prometheus metrics at http://ADDR/metrics: HOST:PORT, or :PORT for every interface (docs/metrics.md).
    #[arg(long, value_name = "ADDR", value_parser = hangwatch_run::metrics::parse_metrics_addr)]
    metrics: Option<SocketAddr>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let alerter = args.alerts.alerter()?;
    let ending = hangwatch_run::coordinator::run(
        hangwatch_run::coordinator::Settings {
            listen: args.listen,
            token_file: args.token_file,
            job_id: args.job_id,
            nnodes: args.nnodes,
            silence: args.silence,
            on_hang: args.action.on_hang(),
            max_stall: args.max_stall,
            report_dir: args.report_dir,
            metrics: args.metrics,
        },
        alerter,
    )?;
    if args.json {
        match &ending.verdict {
            Some(verdict) => crate::output::print_json(verdict)?,
            None => crate::output::print_json(&NoHang::DOCUMENT)?,
        }
    }
    Ok(if ending.terminated {
        ExitCode::from(crate::exit::HUNG)
    } else {
        ExitCode::SUCCESS
    })
}
