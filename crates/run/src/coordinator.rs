//! The coordinator as its own program (`hangwatch coordinator`): serves one multi-node job's agents
//! (docs/coordinator-protocol.md) and runs the job's policy over them until every node has left (or SIGINT/SIGTERM).
//! Serving is `hangwatch_coordinator::hosted`'s; what its events say to people is [`crate::job_events`]'.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hangwatch_agent::human::say;
use hangwatch_agent::supervise::OnHang;
use hangwatch_alert::Alerter;
use hangwatch_coordinator::hosted::Serving;
use hangwatch_coordinator::{Config, Coordinator, JobEnding, SuperviseOptions};
use hangwatch_metrics::CoordinatorMetrics;

use crate::job_events::{self, JobAlerts};

/// `hangwatch coordinator`'s settings (its flags are documented in crates/cli).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `HOST:PORT` to listen on; port 0 picks a free one, said when listening.
    pub listen: String,
    /// The job's shared secret, readable by its owner only.
    pub token_file: PathBuf,
    /// The job's id as the agents have it; `None`: SLURM_JOB_ID, else `job`.
    pub job_id: Option<String>,
    /// Once this many nodes have joined, a new one is a late join.
    pub nnodes: Option<usize>,
    /// A node silent this long is `node_unreachable`.
    pub silence: Duration,
    pub on_hang: OnHang,
    /// The latest a job whose ranks compute without progress is ended.
    pub max_stall: Duration,
    /// Where each verdict is kept; `None`: a new directory under the per-user report root.
    pub report_dir: Option<PathBuf>,
    /// Serve Prometheus metrics here.
    pub metrics: Option<SocketAddr>,
}

/// Serves the job until every node has left or a signal says stop; how it ended (its last verdict, whether the
/// job was ended). `alerter` is built by the caller from its flags.
pub fn run(args: Settings, alerter: Alerter) -> anyhow::Result<JobEnding> {
    // The agents' own rule (`run`): --job-id, else the Slurm job's id, else `job`.
    let job_id =
        hangwatch_slurm::step::job_id_or_default(args.job_id.as_deref(), |k| std::env::var(k).ok());
    let secret = crate::secret::read_job_secret(&args.token_file, &job_id)?;
    let alerter = Arc::new(alerter);
    // Held open (and locked) while the coordinator runs.
    let report = crate::dirs::open_report_dir(args.report_dir.as_deref(), "coordinator")
        .map_err(crate::usage)?;
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
    crate::alerts::count_deliveries(
        &alerter,
        move |t| sent.alert_sent(t),
        move |t| failed.alert_failed(t),
        move |r| not_sent.alert_not_sent(r),
    );
    let mut config = Config::new(secret.clone());
    config.expected_nodes = args.nnodes;
    config.silence = args.silence;
    let options = SuperviseOptions {
        on_hang: args.on_hang,
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
            .map_err(|e| crate::usage(format!("cannot listen on {}: {e}", args.listen)))?;
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
            Some(addr) => Some(crate::metrics::serve(
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
    crate::alerts::finish(&alerter, &report_dir);
    drop(report);
    Ok(ending)
}
