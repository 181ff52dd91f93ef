//! `hangwatch coordinator`: serves one multi-node job's agents (docs/coordinator-protocol.md) and runs the job's
//! policy over them, until every node has left (or SIGINT/SIGTERM). Refuses a token file that others can read.
//! Serving is `hangwatch_coordinator::hosted`'s; what its events say to people is `hangwatch_run::job_events`'.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hangwatch_agent::human::say;
use hangwatch_coordinator::hosted::Serving;
use hangwatch_coordinator::{Config, Coordinator, JobEnding, SuperviseOptions};
use hangwatch_metrics::CoordinatorMetrics;

use crate::exit::usage;
use hangwatch_model::parse_nonzero_duration;
use hangwatch_run::job_events::{self, JobAlerts};

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
    // The agents' own rule (`run`): --job-id, else the Slurm job's id, else `job`.
    let job_id =
        hangwatch_slurm::step::job_id_or_default(args.job_id.as_deref(), |k| std::env::var(k).ok());
    let secret = hangwatch_run::secret::read_job_secret(&args.token_file, &job_id)?;
    let alerter = std::sync::Arc::new(args.alerts.alerter()?);
    // Held open (and locked) while the coordinator runs.
    let report = hangwatch_run::dirs::open_report_dir(args.report_dir.as_deref(), "coordinator")
        .map_err(usage)?;
    let report_dir = report.path().to_path_buf();
    let alerts = JobAlerts {
        alerter: std::sync::Arc::clone(&alerter),
        job: Some(job_id.clone()),
        evidence: format!("{}:{}", job_events::this_host(), report_dir.display()),
    };
    let metrics = Arc::new(CoordinatorMetrics::new(Some(&job_id)));
    let (sent, failed, not_sent) = (
        Arc::clone(&metrics),
        Arc::clone(&metrics),
        Arc::clone(&metrics),
    );
    hangwatch_run::alerts::count_deliveries(
        &alerter,
        move |t| sent.alert_sent(t),
        move |t| failed.alert_failed(t),
        move |r| not_sent.alert_not_sent(r),
    );
    let mut config = Config::new(secret.clone());
    config.expected_nodes = args.nnodes;
    config.silence = args.silence;
    let options = SuperviseOptions {
        on_hang: args.action.on_hang(),
        activity: hangwatch_diagnosis::ActivityRule::until(args.max_stall),
        ..SuperviseOptions::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the coordinator's runtime")?;
    let ending = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .map_err(|e| usage(format!("cannot listen on {}: {e}", args.listen)))?;
        let addr = listener
            .local_addr()
            .context("cannot read the listening address")?;
        // Watched before "listening" is said: whoever reads that line may signal at once.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot watch SIGTERM")?;
        let mut interrupt =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
                .context("cannot watch SIGINT")?;
        say(format!(
            "hangwatch coordinator: listening on {addr} for job {job_id} (token from {}, link key {}); agents join with `hangwatch run --coordinator {addr} --token-file FILE --job-id {job_id} ...`",
            args.token_file.display(),
            secret.key().id()
        ));
        let (keep, said) = (Some(report_dir.clone()), Arc::clone(&metrics));
        let serving = Serving::start(Coordinator::new(config), listener, move |events| {
            job_events::say_events(events, job_events::WHO, keep, alerts, said)
        });
        let _metrics_server = match args.metrics {
            Some(addr) => Some(hangwatch_run::metrics::serve(
                "hangwatch coordinator",
                addr,
                job_events::exposition(serving.coordinator(), &metrics, args.nnodes),
            )?),
            None => None,
        };
        let ending = tokio::select! {
            ending = serving.coordinator().supervise(options, serving.events()) => Some(ending),
            _ = interrupt.recv() => None,
            _ = term.recv() => None,
        };
        if ending.is_none() {
            tracing::info!("coordinator stopping on a signal");
        }
        job_events::say_server_error(serving.stop().await);
        say(match &ending {
            Some(_) => "hangwatch coordinator: every node has left; stopped",
            None => "hangwatch coordinator: stopped",
        });
        anyhow::Ok(ending.unwrap_or_default())
    })?;
    hangwatch_run::alerts::finish(&alerter, &report_dir);
    if args.json {
        print_ending(&ending)?;
    }
    drop(report);
    Ok(if ending.terminated {
        ExitCode::from(crate::exit::HUNG)
    } else {
        ExitCode::SUCCESS
    })
}

/// The one JSON document of `--json`: the last verdict, or that there was no hang.
fn print_ending(ending: &JobEnding) -> anyhow::Result<()> {
    #[derive(serde::Serialize)]
    struct NoHang {
        version: u32,
        hang: bool,
    }
    match &ending.verdict {
        Some(verdict) => crate::output::print_json(verdict),
        None => crate::output::print_json(&NoHang {
            version: 1,
            hang: false,
        }),
    }
}
