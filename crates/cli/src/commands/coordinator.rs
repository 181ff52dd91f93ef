//! `hangwatch coordinator`: serves one multi-node job's agents (docs/coordinator-protocol.md) and runs the job's
//! policy over them, until every node has left (or SIGINT/SIGTERM). Also the coordinator an agent hosts
//! (`run --host-coordinator`). Refuses a token file that others can read.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hangwatch_agent::human::say;
use hangwatch_agent::render::{rank_ranges, verdict_text};
use hangwatch_coordinator::{Config, Coordinator, JobEnding, JobEvent, SuperviseOptions};
use hangwatch_diagnosis::OnHang;
use hangwatch_metrics::{CoordinatorMetrics, Exposition, NodeSeen, NodeState};
use hangwatch_rpc::{JobSecret, JobToken};
use tokio::sync::mpsc;

use crate::duration::parse_nonzero_duration;
use crate::exit::usage;

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
    #[arg(long, value_name = "ADDR", value_parser = crate::commands::metrics::parse_metrics_addr)]
    metrics: Option<SocketAddr>,
}

/// Reads the token, refusing a file that its group or others may read (or write), and derives the job's link key
/// from it and `job_id`.
pub fn read_job_secret(path: &Path, job_id: &str) -> anyhow::Result<JobSecret> {
    let text = crate::secret::read_private_file(path, "token file")?;
    let token =
        JobToken::new(&text).map_err(|e| usage(format!("token file {}: {e}", path.display())))?;
    JobSecret::new(token, job_id).context("cannot set up the link's key")
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // The agents' own rule (`run`): --job-id, else the Slurm job's id, else `job`.
    let job_id =
        hangwatch_slurm::step::job_id_or_default(args.job_id.as_deref(), |k| std::env::var(k).ok());
    let secret = read_job_secret(&args.token_file, &job_id)?;
    let alerter = std::sync::Arc::new(args.alerts.alerter()?);
    // Held open (and locked) while the coordinator runs.
    let report =
        crate::dirs::open_report_dir(args.report_dir.as_deref(), "coordinator").map_err(usage)?;
    let report_dir = report.path().to_path_buf();
    let alerts = JobAlerts {
        alerter: std::sync::Arc::clone(&alerter),
        job: Some(job_id.clone()),
        evidence: format!("{}:{}", this_host(), report_dir.display()),
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
        let serving = Serving::start(
            Coordinator::new(config),
            listener,
            Some(report_dir.clone()),
            alerts,
            Arc::clone(&metrics),
        );
        let _metrics_server = match args.metrics {
            Some(addr) => Some(crate::commands::metrics::serve(
                "hangwatch coordinator",
                addr,
                serving.exposition(args.nnodes),
            )?),
            None => None,
        };
        let ending = tokio::select! {
            ending = serving.coordinator.supervise(options, serving.events.clone()) => Some(ending),
            _ = interrupt.recv() => None,
            _ = term.recv() => None,
        };
        if ending.is_none() {
            tracing::info!("coordinator stopping on a signal");
        }
        serving.stop().await;
        say(match &ending {
            Some(_) => "hangwatch coordinator: every node has left; stopped",
            None => "hangwatch coordinator: stopped",
        });
        anyhow::Ok(ending.unwrap_or_default())
    })?;
    crate::alerts::finish(&alerter, &report_dir);
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

/// Says every event of the coordinator, each line starting with `who`, and keeps each verdict in `keep` (when
/// given) through the abandonable writer: the coordinator never blocks on a directory.
async fn print_events(
    mut events: mpsc::Receiver<JobEvent>,
    who: &'static str,
    keep: Option<PathBuf>,
    alerts: JobAlerts,
    metrics: Arc<CoordinatorMetrics>,
) {
    let program = hangwatch_child::self_exe().unwrap_or_else(|_| PathBuf::from("hangwatch"));
    let mut last_verdict = None;
    while let Some(event) = events.recv().await {
        say(format!("{who}: {}", describe(&event)));
        alerts.on_event(&event, &mut last_verdict);
        match &event {
            JobEvent::RollCallOrdered { .. } => metrics.roll_call(),
            JobEvent::Verdict { verdict, .. } => metrics.verdict(verdict.kind),
            _ => {}
        }
        if let (JobEvent::Verdict { verdict, .. }, Some(dir)) = (&event, &keep) {
            let files = hangwatch_agent::evidence::verdict_files(verdict);
            let (program, dir) = (program.clone(), dir.clone());
            let written = tokio::task::spawn_blocking(move || {
                hangwatch_agent::evidence::write_abandonable(
                    &program,
                    &dir,
                    &files,
                    Duration::from_secs(5),
                )
                .map(|()| dir)
            })
            .await;
            match written {
                Ok(Ok(dir)) => {
                    say(format!("{who}: verdict kept in {}", dir.display()));
                }
                Ok(Err(e)) => {
                    say(format!(
                        "{who}: warning: the verdict could not be kept: {e}"
                    ));
                }
                Err(e) => tracing::warn!(error = %e, "the verdict writer failed"),
            }
        }
    }
}

/// The job's alerts, sent by the coordinator (one per job, not one per node): suspected with each verdict, acted
/// when it orders the job ended.
pub struct JobAlerts {
    pub alerter: std::sync::Arc<hangwatch_alert::Alerter>,
    pub job: Option<String>,
    /// Where the verdict is kept: `HOST:DIR`.
    pub evidence: String,
}

impl JobAlerts {
    fn on_event(&self, event: &JobEvent, last_verdict: &mut Option<hangwatch_model::Verdict>) {
        use hangwatch_alert::{Alert, Stage};
        let alert = match event {
            JobEvent::Verdict { verdict, .. } => {
                *last_verdict = Some(verdict.without_ranks());
                // Ranks that compute are no hang: the policy says once that it holds back (Computing).
                if verdict.activity.is_some() {
                    return;
                }
                Alert::new(Stage::Suspected, verdict, hangwatch_model::unix_now())
            }
            JobEvent::Computing { verdict, .. } => {
                Alert::new(Stage::Computing, verdict, hangwatch_model::unix_now())
            }
            JobEvent::Terminating { nodes } => {
                let Some(mut verdict) = last_verdict.clone() else {
                    return;
                };
                verdict.actions.push(hangwatch_model::ActionRecord {
                    action: "terminate".into(),
                    ranks: Vec::new(),
                    ok: true,
                    detail: Some(format!(
                        "ordered every node to end its ranks ({})",
                        nodes.join(", ")
                    )),
                    outcomes: Vec::new(),
                });
                Alert::new(Stage::Acted, &verdict, hangwatch_model::unix_now())
            }
            _ => return,
        };
        let mut alert = alert;
        alert.job = self.job.clone();
        alert.node = Some(this_host());
        alert.evidence = Some(self.evidence.clone());
        self.alerter.send(&alert);
    }
}

/// This machine's name, for alerts.
fn this_host() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "coordinator".into())
}

/// One event in words.
pub fn describe(event: &JobEvent) -> String {
    match event {
        JobEvent::Joined {
            node,
            node_rank,
            ranks,
        } => format!(
            "node {node} joined (node rank {node_rank}{})",
            if ranks.is_empty() {
                String::new()
            } else {
                format!(", ranks {}", rank_ranges(ranks))
            }
        ),
        JobEvent::Left { node, exit_code } => match exit_code {
            Some(code) => format!("node {node} left (its agent exits {code})"),
            None => format!("node {node} left"),
        },
        JobEvent::Unreachable { nodes, silence } => format!(
            "node_unreachable: {} sent nothing for {:.0}s (agent killed, node down, or link cut); its ranks are not a hang by themselves",
            nodes.join(", "),
            silence.as_secs_f64()
        ),
        JobEvent::Reachable { nodes } => format!("{} heard from again", nodes.join(", ")),
        JobEvent::ProgressResumed => "progress resumed".into(),
        JobEvent::RollCallOrdered {
            trigger,
            stalled_for,
            nodes,
        } => format!(
            "no progress for {:.1}s ({}): roll call of {nodes} node(s)",
            stalled_for.as_secs_f64(),
            trigger.describe()
        ),
        JobEvent::Verdict {
            verdict,
            not_answered,
            took,
            ..
        } => {
            let mut text = format!(
                "verdict in {:.2}s{}:\n{}",
                took.as_secs_f64(),
                if not_answered.is_empty() {
                    String::new()
                } else {
                    format!(" (no answer from {})", not_answered.join(", "))
                },
                verdict_text(verdict)
            );
            while text.ends_with('\n') {
                text.pop();
            }
            text
        }
        JobEvent::Terminating { nodes } => format!(
            "ending the job: ordered every node to end its ranks ({})",
            nodes.join(", ")
        ),
        JobEvent::Computing {
            stalled_for,
            verdict,
            max_stall,
        } => hangwatch_agent::render::computing_text(
            *stalled_for,
            verdict.activity.as_ref(),
            *max_stall,
        ),
        JobEvent::WorkStopped => hangwatch_agent::render::WORK_STOPPED_TEXT.into(),
        JobEvent::MaxStallPassed { stalled_for } => {
            hangwatch_agent::render::max_stall_text(*stalled_for)
        }
    }
}

/// A coordinator hosted by an agent (`run --host-coordinator` on node rank 0), on its own threads.
pub struct HostedCoordinator {
    serving: Serving,
    /// The job's policy, running until this node's agent is done.
    policy: tokio::task::JoinHandle<JobEnding>,
    runtime: tokio::runtime::Runtime,
    expected_nodes: Option<usize>,
}

/// The hosted coordinator could not start.
#[derive(Debug)]
pub enum HostError {
    /// Another process holds the port: the job runs without a coordinator.
    PortTaken(String),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for HostError {
    fn from(e: anyhow::Error) -> Self {
        Self::Other(e)
    }
}

impl HostedCoordinator {
    /// Binds `listen` now (so that a taken port is known before the job starts) and serves in the background.
    pub fn start(
        listen: SocketAddr,
        config: Config,
        on_hang: OnHang,
        activity: hangwatch_diagnosis::ActivityRule,
        alerts: JobAlerts,
    ) -> Result<Self, HostError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hw-coordinator")
            .enable_all()
            .build()
            .context("cannot start the hosted coordinator's runtime")?;
        let std_listener = std::net::TcpListener::bind(listen).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                HostError::PortTaken(format!(
                    "port {} is taken by another program ({e})",
                    listen.port()
                ))
            } else {
                HostError::Other(usage(format!(
                    "cannot host the coordinator on {listen}: {e}"
                )))
            }
        })?;
        std_listener
            .set_nonblocking(true)
            .context("cannot set up the coordinator's socket")?;
        let expected_nodes = config.expected_nodes;
        let serving = {
            let _guard = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(std_listener)
                .context("cannot set up the coordinator's socket")?;
            // The hosting agent's evidence holds the job's verdict already: none is kept apart.
            let metrics = Arc::new(CoordinatorMetrics::new(Some(config.secret.job_id())));
            Serving::start(Coordinator::new(config), listener, None, alerts, metrics)
        };
        let (coordinator, events) = (serving.coordinator.clone(), serving.events.clone());
        let policy = runtime.spawn(async move {
            coordinator
                .supervise(
                    SuperviseOptions {
                        on_hang,
                        activity,
                        ..SuperviseOptions::default()
                    },
                    events,
                )
                .await
        });
        say(format!(
            "hangwatch coordinator: hosted by this agent, listening on {listen}"
        ));
        Ok(Self {
            serving,
            policy,
            runtime,
            expected_nodes,
        })
    }

    /// The coordinator's metrics, brought up to date at each scrape (served with the agent's by `run --metrics`).
    pub fn metrics(&self) -> Arc<dyn Exposition> {
        self.serving.exposition(self.expected_nodes)
    }

    /// This node's job is over: keep serving (at most `wait`) until every other node has left or gone silent, so
    /// that the last orders reach them, then stop.
    pub fn finish(self, wait: Duration) {
        let until = Instant::now() + wait;
        while Instant::now() < until {
            let view = self.serving.coordinator.view();
            let members = self.serving.coordinator.members();
            let settled = view.all_left
                || members
                    .iter()
                    .all(|m| m.left.is_some() || view.unreachable.contains(&m.node));
            if settled {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.policy.abort();
        let runtime = self.runtime;
        runtime.block_on(self.serving.stop());
        runtime.shutdown_timeout(Duration::from_secs(1));
    }
}

/// A coordinator serving agents on its listener, its events said (and each verdict kept in `keep`, when given),
/// until [`Serving::stop`]; the caller runs its policy (`supervise`) with `events`.
struct Serving {
    coordinator: Coordinator,
    events: mpsc::Sender<JobEvent>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), hangwatch_coordinator::ServeError>>,
    printer: tokio::task::JoinHandle<()>,
    metrics: Arc<CoordinatorMetrics>,
}

impl Serving {
    /// Starts serving on the current tokio runtime.
    fn start(
        coordinator: Coordinator,
        listener: tokio::net::TcpListener,
        keep: Option<PathBuf>,
        alerts: JobAlerts,
        metrics: Arc<CoordinatorMetrics>,
    ) -> Self {
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(coordinator.clone().serve(listener, async move {
            let _ = stop_rx.await;
        }));
        let (events, events_rx) = mpsc::channel(hangwatch_coordinator::JOB_EVENT_QUEUE);
        let printer = tokio::spawn(print_events(
            events_rx,
            "hangwatch coordinator",
            keep,
            alerts,
            Arc::clone(&metrics),
        ));
        Self {
            coordinator,
            events,
            stop,
            server,
            printer,
            metrics,
        }
    }

    /// The metrics, with the membership read at each scrape (the counters are fed from the events).
    fn exposition(&self, expected_nodes: Option<usize>) -> Arc<dyn Exposition> {
        let coordinator = self.coordinator.clone();
        let metrics = Arc::clone(&self.metrics);
        Arc::new(move || {
            let unreachable = coordinator.unreachable_nodes();
            let members = coordinator.members();
            metrics.set_nodes(
                expected_nodes,
                members.iter().map(|m| NodeSeen {
                    node: &m.node,
                    state: if m.left.is_some() {
                        NodeState::Left
                    } else if unreachable.contains(&m.node) {
                        NodeState::Unreachable
                    } else {
                        NodeState::Joined
                    },
                    silent_for: m.last_heard.elapsed(),
                }),
            );
            metrics.encode()
        })
    }

    /// Stops serving (the server has 3 s to let the agents' streams go) and says what the events still had to say.
    async fn stop(self) {
        let Self {
            events,
            stop,
            server,
            printer,
            ..
        } = self;
        let _ = stop.send(());
        match tokio::time::timeout(Duration::from_secs(3), server).await {
            Ok(Ok(Err(e))) => {
                say(format!(
                    "hangwatch coordinator: error: {}",
                    hangwatch_model::error_chain(&e)
                ));
            }
            Ok(_) => {}
            Err(_) => tracing::warn!("the gRPC server did not stop within 3s"),
        }
        // The printer ends once every sender is gone (the policy's too, once it has returned or been aborted),
        // after keeping the last verdict (the writer's own deadline is 5 s).
        drop(events);
        let _ = tokio::time::timeout(Duration::from_secs(6), printer).await;
    }
}
