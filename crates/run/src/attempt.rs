//! One attempt of `hangwatch run` from the moment its settings are checked to its exit code: the hosted
//! coordinator, the metrics' outlets, hangwatch's own output protected, the wait for storage that hung the attempt
//! before, the agent's loop, and after it the closing report, the requeue, the alerts and the shutdown of what was
//! started, in that order. `cli` turns flags into an [`Attempt`]; everything after is here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hangwatch_agent::human::say;
use hangwatch_agent::supervise::{run as supervise, OnHang, RunConfig, RunOutcome, EXIT_HUNG};
use hangwatch_alert::Alerter;
use hangwatch_coordinator::hosted::HostError;
use hangwatch_diagnosis::requeue::AttemptRecord;
use hangwatch_metrics::AgentMetrics;
use hangwatch_model::exit::EXIT_STORAGE_GAVE_UP;
use hangwatch_model::{error_chain, Scope};
use hangwatch_safefs::{PrivateDir, SafeFsError};
use hangwatch_slurm::requeue::SlurmJob;

use crate::alerts::{self, AlertContext};
use crate::job_events::{Hosted, JobAlerts};
use crate::log_sink::LogHandle;
use crate::metrics::AgentOutlets;
use crate::storage_wait::{wait_for_storage, StorageWait};
use crate::usage;

/// Files `run` writes into the report directory besides the evidence bundle.
const RUN_FILES: &[&str] = &[
    "output.log",
    "log-undelivered.txt",
    "hangwatch-stdout-undelivered.txt",
    "hangwatch-stderr-undelivered.txt",
    "hb.sock",
    "alerts.json",
];

/// The report directory: `given` (`--report-dir`) made private, or a new run directory under the per-user root
/// (older ones pruned to `keep_runs`). Refused (exit 2) when it is not ours, is a symlink, or holds a symlink where
/// one of our files will go. Held open until the run ends: its lock keeps a concurrent run's pruning away.
pub fn open_report_dir(given: Option<&Path>, keep_runs: usize) -> anyhow::Result<PrivateDir> {
    let refused = |e: SafeFsError| {
        usage(format!(
            "cannot use the report directory: {}",
            error_chain(&e)
        ))
    };
    let report = match given {
        Some(dir) => PrivateDir::open_or_create(dir).map_err(refused)?,
        None => {
            let (root, run) = crate::dirs::create_run_dir("run").map_err(usage)?;
            let current = run
                .path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            run.lock_in_use().map_err(refused)?;
            crate::dirs::prune_runs(&root, &current, keep_runs);
            run
        }
    };
    report.lock_in_use().map_err(refused)?;
    let names: Vec<&str> = hangwatch_agent::evidence::BUNDLE_FILES
        .iter()
        .chain(RUN_FILES)
        .copied()
        .collect();
    crate::dirs::refuse_planted(&report, &names).map_err(refused)?;
    Ok(report)
}

/// The coordinator a node's agent joins, and the one it hosts.
pub struct Coordination {
    pub link: hangwatch_agent::link::LinkConfig,
    pub host: Option<(SocketAddr, hangwatch_coordinator::Config)>,
}

/// The multi-node flags of `run`, as given.
pub struct CoordinationFlags<'a> {
    /// `--coordinator HOST:PORT`.
    pub coordinator: Option<&'a str>,
    /// `--host-coordinator`.
    pub host_coordinator: bool,
    /// `--token-file`.
    pub token_file: Option<&'a Path>,
    /// `--nproc`: the ranks this node starts, when it starts them.
    pub nproc: Option<u32>,
}

/// Where this node's job is placed.
pub struct Placed<'a> {
    pub nnodes: u32,
    pub node_rank: u32,
    pub master_addr: &'a str,
    pub master_port: Option<u16>,
    pub job_id: &'a str,
    pub node_name: Option<&'a str>,
}

/// Checks the multi-node flags and says where the coordinator is; `None` for a node that decides alone.
pub fn coordination(
    flags: &CoordinationFlags<'_>,
    placed: &Placed<'_>,
) -> anyhow::Result<Option<Coordination>> {
    let (nnodes, node_rank) = (placed.nnodes, placed.node_rank);
    let addr = match (flags.coordinator, flags.host_coordinator) {
        (Some(addr), _) => addr.to_string(),
        (None, true) => match placed.master_port {
            Some(port) if port < u16::MAX => format!("{}:{}", placed.master_addr, port + 1),
            _ => {
                return Err(usage(
                    "--host-coordinator needs to know where: give --coordinator HOST:PORT, or --master-port (the coordinator takes the next port)",
                ))
            }
        },
        (None, false) => {
            if flags.token_file.is_some() {
                return Err(usage(
                    "--token-file is for the coordinator: give --coordinator HOST:PORT or --host-coordinator too",
                ));
            }
            if nnodes > 1 {
                say(format!(
                    "hangwatch: warning: this is node {node_rank} of {nnodes}, without a coordinator: it sees only its own ranks; \
                     add --host-coordinator --token-file FILE (or --coordinator) so that one verdict names the rank that holds everyone up"
                ));
            }
            return Ok(None);
        }
    };
    let Some(token_file) = flags.token_file else {
        return Err(usage(
            "the coordinator needs the job's token: give --token-file FILE (the same secret on every node, chmod 600; e.g. `openssl rand -hex 32 > FILE`)",
        ));
    };
    let secret = crate::secret::read_job_secret(token_file, placed.job_id)?;
    let node = placed
        .node_name
        .map(str::to_string)
        .ok_or_else(|| usage("cannot tell this node's name (no hostname): give --node-name"))?;
    let host = if flags.host_coordinator && node_rank == 0 {
        let port = addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .ok_or_else(|| usage(format!("--coordinator {addr:?} is not HOST:PORT")))?;
        let mut config = hangwatch_coordinator::Config::new(secret.clone());
        config.expected_nodes = Some(nnodes as usize);
        Some((SocketAddr::from(([0, 0, 0, 0], port)), config))
    } else {
        None
    };
    let ranks: Vec<u32> = match flags.nproc {
        Some(n) => (0..n).map(|local| node_rank * n + local).collect(),
        None => Vec::new(),
    };
    Ok(Some(Coordination {
        link: hangwatch_agent::link::LinkConfig {
            addr,
            secret,
            node,
            node_rank,
            ranks,
        },
        host,
    }))
}

/// Where the metrics go: an HTTP listener, a node_exporter textfile, or both.
pub struct MetricsOutput {
    pub metrics: Arc<AgentMetrics>,
    pub listen: Option<SocketAddr>,
    /// The textfile's directory and file name.
    pub textfile: Option<(PathBuf, String)>,
}

/// After a requeue's hang: what the next attempt needs from Slurm.
pub struct Requeue {
    pub job: SlurmJob,
    /// What the attempt before this one left, when it hung.
    pub previous: Option<AttemptRecord>,
    /// `--storage-wait`.
    pub storage_wait: Duration,
    /// `--max-requeues`.
    pub max_requeues: u32,
    /// `--drain-bad-nodes`.
    pub drain_bad_nodes: bool,
}

/// Everything one attempt needs, checked and opened.
pub struct Attempt {
    pub config: RunConfig,
    pub on_hang: OnHang,
    /// Its report directory, held (locked) until the attempt ends.
    pub report_dir: PrivateDir,
    pub job_id: String,
    pub node_name: Option<String>,
    pub node_rank: u32,
    /// The coordinator this node joins (`None`: it decides alone), and the one it hosts.
    pub coordination: Option<Coordination>,
    pub alerter: Arc<Alerter>,
    pub metrics: Option<MetricsOutput>,
    pub requeue: Option<Requeue>,
    /// The job's log, when it has one.
    pub sink: Option<LogHandle>,
    /// `--json`: one JSON document on stdout at the end.
    pub json: bool,
    /// `--grace`.
    pub grace: Duration,
}

impl Attempt {
    /// Runs the attempt to its exit code (the job's own, 75 for a hang hangwatch ended, 76 and 77 from the
    /// requeue). An `Err` is something around the loop that could not start: the hosted coordinator's address
    /// (a usage error) or the metrics' outlets.
    pub fn run(self) -> anyhow::Result<i32> {
        let Attempt {
            mut config,
            on_hang,
            report_dir: private_dir,
            job_id,
            node_name,
            node_rank,
            coordination,
            alerter,
            metrics,
            requeue,
            sink,
            json,
            grace,
        } = self;
        let report_dir = private_dir.path().to_path_buf();
        let activity = hangwatch_agent::supervise::activity_rule(&config.detector);
        let hosted = match coordination.as_ref().and_then(|c| c.host.as_ref()) {
            Some((listen, hosted_config)) => match Hosted::start(
                *listen,
                hosted_config.clone(),
                hangwatch_coordinator::SuperviseOptions {
                    on_hang,
                    activity,
                    ..hangwatch_coordinator::SuperviseOptions::default()
                },
                JobAlerts {
                    alerter: Arc::clone(&alerter),
                    job: Some(job_id.clone()),
                    evidence: format!(
                        "{}:{} (and each node's own report directory)",
                        node_name.as_deref().unwrap_or("node rank 0"),
                        report_dir.display()
                    ),
                },
            ) {
                Ok(hosted) => Some(hosted),
                Err(why @ HostError::PortTaken { .. }) => {
                    // Someone else holds the port (it is derived from the job id): the job still runs, each node
                    // deciding alone; the other nodes refuse whatever listens there, as it cannot prove the job's
                    // key.
                    say(format!(
                        "hangwatch: warning: cannot host the coordinator: {why}; this job runs with each node deciding \
                         alone (the other nodes refuse whatever holds that port: it cannot prove the job's key)"
                    ));
                    config.coordinator = None;
                    None
                }
                Err(e @ HostError::Listen { .. }) => return Err(usage(e.to_string())),
                Err(e) => return Err(e.into()),
            },
            None => None,
        };
        let outlets = match metrics {
            Some(m) => Some(AgentOutlets::start(
                m.metrics,
                m.listen,
                hosted.as_ref().map(|h| h.metrics()),
                m.textfile
                    .as_ref()
                    .map(|(dir, name)| (dir.as_path(), name.clone())),
            )?),
            None => None,
        };
        // From here on, hangwatch's own output must not block on a frozen file (usage errors above were printed
        // directly, while nothing had started).
        let own_output = crate::own_output::protect(&report_dir);
        if let Some(what) = hangwatch_child::detach_from_binary_filesystem() {
            tracing::info!("{what}");
        }
        // An attempt after a storage hang waits for that storage before it starts the job.
        let storage_gave_up = match &requeue {
            Some(Requeue {
                job,
                previous: Some(record),
                storage_wait,
                ..
            }) if !record.mounts.is_empty() => matches!(
                wait_for_storage(&record.mounts, *storage_wait, |still, waited| {
                    if let Some(m) = &outlets {
                        m.metrics.set_waiting_for_storage(still.is_some());
                    }
                    if node_rank == 0 {
                        crate::requeue::note_storage_wait(job, record, still, waited);
                    }
                }),
                StorageWait::GaveUp { .. }
            ),
            _ => false,
        };
        // Given up on the storage: no job was started, and what was set up (metrics, a hosted coordinator, the
        // output's protection) ends as after any run.
        let coordinated = coordination.is_some();
        let code = if storage_gave_up {
            EXIT_STORAGE_GAVE_UP
        } else {
            match supervise(config) {
                Ok(outcome) => {
                    if let Some(sink) = sink {
                        sink.finish(Duration::from_secs(5));
                    }
                    let code = report(json, &outcome, &report_dir);
                    let ending = Ending {
                        job_id: &job_id,
                        node_name: node_name.as_deref(),
                        node_rank,
                        coordinated,
                        report_dir: &report_dir,
                    };
                    after_run(&ending, &outcome, code, requeue.as_ref(), &alerter)
                }
                Err(e) => {
                    say(format!("hangwatch: error: {:#}", anyhow::Error::new(e)));
                    1
                }
            }
        };
        if let Some(hosted) = hosted {
            // The other nodes may still be ending their ranks on its order: let them leave first (bounded).
            hosted.finish(grace + Duration::from_secs(10));
        }
        alerts::finish(&alerter, &report_dir);
        // Last: the final metrics count the alerts that finished above.
        if let Some(outlets) = outlets {
            outlets.finish();
        }
        if let Some(own) = own_output {
            // What hangwatch said last must reach the redirected stream before it is closed.
            hangwatch_agent::human::flush(Duration::from_secs(3));
            own.finish(Duration::from_secs(3));
        }
        drop(private_dir);
        Ok(code)
    }
}

/// Who ended, for what comes after the loop.
struct Ending<'a> {
    job_id: &'a str,
    node_name: Option<&'a str>,
    node_rank: u32,
    coordinated: bool,
    report_dir: &'a Path,
}

/// After the loop: the requeue (node rank 0, a hang ended inside a Slurm job) and the acted alert; returns the
/// exit code.
fn after_run(
    ending: &Ending<'_>,
    outcome: &RunOutcome,
    code: i32,
    requeue: Option<&Requeue>,
    alerter: &Alerter,
) -> i32 {
    let mut acted = outcome.verdict.clone().filter(|_| code == EXIT_HUNG);
    let code = match (requeue, acted.as_mut()) {
        (Some(requeue), Some(verdict)) if ending.node_rank == 0 => {
            let (code, action) = crate::requeue::after_hang(
                &requeue.job,
                verdict,
                requeue.previous.clone(),
                outcome.last_step,
                requeue.max_requeues,
                requeue.drain_bad_nodes && verdict.scope != Some(Scope::Filesystem),
                ending.report_dir,
            );
            verdict.actions.push(action);
            code
        }
        _ => code,
    };
    // With a coordinator, the job's alerts are its own (one per job, not one per node); what only node rank 0 did
    // after it (the requeue) is told here.
    let requeued = acted
        .as_ref()
        .is_some_and(|v| v.actions.iter().any(|a| a.action == "requeue"));
    if let Some(verdict) = acted.as_ref().filter(|_| !ending.coordinated || requeued) {
        let context = AlertContext {
            job: Some(ending.job_id),
            node: ending.node_name,
            report_dir: ending.report_dir,
        };
        alerts::send_acted(alerter, verdict, &context);
    }
    code
}

/// `run --json`'s document: the verdict with the exit code and the report directory, or "no hang".
#[derive(serde::Serialize)]
struct RunDocument<'a> {
    #[serde(flatten)]
    verdict: Option<&'a hangwatch_model::Verdict>,
    #[serde(flatten)]
    no_hang: Option<hangwatch_model::NoHang>,
    exit_code: i32,
    report_dir: String,
}

/// Prints the JSON document (with `--json`) and the closing line; returns the exit code.
fn report(json: bool, outcome: &RunOutcome, report_dir: &Path) -> i32 {
    if json {
        let doc = RunDocument {
            verdict: outcome.verdict.as_ref(),
            no_hang: outcome
                .verdict
                .is_none()
                .then_some(hangwatch_model::NoHang::DOCUMENT),
            exit_code: outcome.exit_code,
            report_dir: report_dir.display().to_string(),
        };
        if let Err(e) = hangwatch_agent::human::print_json(&doc) {
            say(format!(
                "hangwatch: error: cannot print the JSON document: {e:#}"
            ));
            return 1;
        }
    }
    if outcome.exit_code == EXIT_HUNG {
        say(format!(
            "hangwatch: the job hung and was ended (exit 75: retryable); evidence in {}",
            report_dir.display()
        ));
    }
    outcome.exit_code
}
