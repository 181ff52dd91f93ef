//! `hangwatch run`: run the job, watch it, and on a hang say why, keep the evidence and end it (exit 75).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use hangwatch_agent::human::say;
use hangwatch_agent::launch::{check_program, LaunchSpec};
use hangwatch_agent::supervise::{OnHang, RunConfig};
use hangwatch_diagnosis::DetectorConfig;
use hangwatch_metrics::{textfile_name, AgentMetrics};

use crate::exit::usage;
use hangwatch_model::{parse_duration, parse_nonzero_duration};
use hangwatch_run::attempt;
use hangwatch_slurm::step::{self as slurm, Placement};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Action {
    /// Roll call, evidence and alert; never kill.
    Observe,
    /// ... then end the job: SIGTERM, grace, SIGKILL; exit 75.
    Abort,
    /// ... end it as abort does, then (inside a Slurm job, on node rank 0) keep the bad nodes out of the job and
    /// requeue it, within the restart budget (docs/requeue.md).
    Requeue,
}

/// `--kernel-log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelLogArg {
    /// The lines about the job.
    Job,
    /// Every line since the job started.
    All,
}

impl KernelLogArg {
    fn scope(self) -> hangwatch_agent::kernel_log::KernelLogScope {
        match self {
            KernelLogArg::Job => hangwatch_agent::kernel_log::KernelLogScope::Job,
            KernelLogArg::All => hangwatch_agent::kernel_log::KernelLogScope::All,
        }
    }
}

impl Action {
    pub fn on_hang(self) -> OnHang {
        match self {
            Action::Observe => OnHang::Observe,
            Action::Abort | Action::Requeue => OnHang::Abort,
        }
    }
}

/// Run CMD as the job and watch it.
#[derive(Debug, clap::Args)]
#[command(
    args_override_self = true,
    after_help = "\
Examples:
  hangwatch run --nproc 8 -- python train.py        8 local ranks with torchrun's RANK/LOCAL_RANK/WORLD_SIZE/...
  hangwatch run -- torchrun --nproc-per-node 8 train.py   the launcher's Python descendants with RANK are the ranks
  hangwatch run --stall-after 5m --action observe -- python train.py
  srun hangwatch run --host-coordinator --token-file F --action requeue --nproc 8 -- python train.py
                                  a hang: the next attempt runs without the bad node (docs/requeue.md)

Signals (Ctrl-C, scancel, a time limit): SIGINT/SIGTERM/SIGHUP go on to the job, after a bounded roll call when
the job is stuck (its evidence is kept first); the job has --grace to end, then SIGKILL; a second signal kills at
once. If hangwatch itself is killed, the job's processes are killed too. See docs/run.md.

Exit code: the job's own when it ends by itself (128+N when killed by signal N); 75 when hangwatch ended a hung
job (retryable); 2 for usage errors; 1 for hangwatch's own failures."
)]
pub struct Args {
    #[command(flatten)]
    fleet: crate::fleet::FleetArgs,
    /// Start N local ranks with torchrun-style environment. Without it, CMD is one process tree.
    #[arg(long)]
    nproc: Option<u32>,
    /// The job's coordinator (HOST:PORT), for a multi-node job: every node's agent joins it, and hangs are decided
    /// there from every node's view; when it is gone, each node decides alone. Needs --token-file.
    #[arg(long, value_name = "ADDR")]
    coordinator: Option<String>,
    /// Node rank 0's agent hosts the job's coordinator, the others join it: at --coordinator's port, or by default
    /// at MASTER_ADDR, port MASTER_PORT+1 (inside Slurm: the step's first node, a port from the job id).
    #[arg(long)]
    host_coordinator: bool,
    /// The job's shared secret for the coordinator, the same file on every node, readable by its owner only
    /// (chmod 600).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The job's id, which the coordinator checks [default: SLURM_JOB_ID, else "job"].
    #[arg(long)]
    job_id: Option<String>,
    /// This node's name in verdicts and for the coordinator [default: SLURMD_NODENAME, else the hostname].
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// A fixed stall threshold (e.g. 30s, 5m). Default: learned from the job's step intervals.
    #[arg(long, value_parser = parse_nonzero_duration)]
    stall_after: Option<Duration>,
    /// The fast path: a rank in a filesystem wait (D, or a FUSE/NFS request) or stopped, with its I/O counters
    /// still this long while the job makes no progress, gets a roll call at once, whatever the learned threshold
    /// or the warm-up say; the job is ended if the rank's mount does not answer a write probe (0: off).
    #[arg(long, default_value = "15s", value_name = "DUR", value_parser = parse_duration)]
    fs_stall: Duration,
    /// What to do about a hang (requeue: exit 75 after submitting the next attempt, 76 when the budget is spent).
    #[arg(long, value_enum, default_value = "abort")]
    action: Action,
    /// With --action requeue: hung attempts in a row without progress (no step beyond the last hang's) after
    /// which the job is not requeued again; `run` then exits 76.
    #[arg(long, default_value_t = 3, value_name = "N")]
    max_requeues: u32,
    /// With --action requeue: also drain the nodes the verdict blames (needs Slurm admin rights); never for a
    /// storage incident (docs/storage-incidents.md).
    #[arg(long)]
    drain_bad_nodes: bool,
    /// With --action requeue: how long an attempt waits for the storage that hung the one before (its mounts are
    /// probed until they answer, before the job starts); then `run` exits 77.
    #[arg(long, default_value = "2h", value_parser = parse_nonzero_duration, value_name = "DUR")]
    storage_wait: Duration,
    /// Also write every line of the job's output here (written so that a frozen filesystem never blocks the job).
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// Rotate the job's log (--log-file, else output.log in the report directory) before it grows past SIZE
    /// (e.g. 500M, 2G; 0: no cap). Rotated files are LOG.1 (newest) .. LOG.N.
    #[arg(long, default_value = "1G", value_name = "SIZE", value_parser = hangwatch_model::parse_size)]
    log_max_size: u64,
    /// Rotated log files to keep (at least 1 while there is a size cap).
    #[arg(long, default_value_t = 3, value_name = "N")]
    log_keep: u32,
    /// Evidence and the run's files go here; must be node-local; made private (0700) [default: a new
    /// run-<UTC time>-<pid> under /var/tmp/hangwatch-<uid>; see docs/run.md].
    #[arg(long)]
    report_dir: Option<PathBuf>,
    /// Keep the newest N run directories under the default report root, removing older ones (0: keep all).
    #[arg(long, default_value_t = hangwatch_run::dirs::DEFAULT_KEEP_RUNS, value_name = "N")]
    keep_runs: usize,
    #[command(flatten)]
    alerts: crate::alerts::AlertArgs,
    /// Serve Prometheus metrics at http://ADDR/metrics: HOST:PORT, or :PORT for every interface (docs/metrics.md).
    #[arg(long, value_name = "ADDR", value_parser = hangwatch_run::metrics::parse_metrics_addr)]
    metrics: Option<std::net::SocketAddr>,
    /// Also write the metrics for node_exporter's textfile collector into DIR (its
    /// --collector.textfile.directory): hangwatch_<job id>_<node>.prom, every 15 s and at the end (job_up 0).
    #[arg(long, value_name = "DIR")]
    metrics_textfile: Option<PathBuf>,
    /// Print the verdict (or a run summary) as one JSON document on stdout; the job's output goes to stderr.
    #[arg(long)]
    json: bool,
    /// Time between SIGTERM and SIGKILL when ending the job (0: SIGKILL right after SIGTERM).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    grace: Duration,
    /// Learned thresholds never go below this.
    #[arg(long, default_value = "2m", value_parser = parse_nonzero_duration)]
    min_stall: Duration,
    /// Learned thresholds never go above this (also the limit for a phase seen for the first time, and the
    /// latest a job whose ranks compute without progress is ended: docs/false-alarms.md).
    #[arg(long, default_value = "30m", value_parser = parse_nonzero_duration)]
    max_stall: Duration,
    /// Do not prefix output lines with `[rank N]`.
    #[arg(long)]
    no_prefix: bool,
    /// Leave the ranks' environment as it is: no hangwatch bootstrap on their PYTHONPATH, so no beats on optimizer
    /// steps and no checkpoint phases unless the job sends them itself (docs/inside-evidence.md).
    #[arg(long)]
    no_instrument: bool,
    /// Do not mirror the job's output on the console (it still goes to the log file).
    #[arg(long)]
    quiet: bool,
    /// Number of nodes (torchrun's --nnodes) [default: the nodes of the Slurm step hangwatch runs in (srun), else 1:
    /// a batch script runs on one node only, whatever the allocation].
    #[arg(long)]
    nnodes: Option<u32>,
    /// This node's rank [default: SLURM_NODEID inside an srun step, else 0].
    #[arg(long)]
    node_rank: Option<u32>,
    /// MASTER_ADDR for the ranks [default: in a multi-node Slurm step, its first node; else 127.0.0.1].
    #[arg(long)]
    master_addr: Option<String>,
    /// MASTER_PORT for the ranks [default: in a multi-node Slurm step, a port from the job id; else a free port].
    #[arg(long)]
    master_port: Option<u16>,
    /// Watch this process, already running, and its descendants as the job instead of starting CMD
    /// (repeatable; a Slurm step's tasks, a job started by another tool). Its ranks are found as under a
    /// launcher; progress comes from its output files' positions, beats and the kernel's view, since hangwatch
    /// owns none of its output. A signal to hangwatch stops the watch and leaves the job alone; a hang is acted
    /// on as --action says (docs/node-service.md).
    #[arg(long, value_name = "PID", conflicts_with_all = ["command", "nproc"])]
    attach: Vec<i32>,
    /// With --attach: bind the heartbeat socket here, where the job's ranks were told to send (a node service's
    /// TaskProlog exports it as HANGWATCH_SOCKET before they start; docs/inside-evidence.md). The socket is
    /// handed to the owner of the first attached process.
    #[arg(long, value_name = "PATH", requires = "attach")]
    beat_socket: Option<PathBuf>,
    /// Which kernel-log lines the evidence keeps: `job`, those about the job (its processes' hung-task reports,
    /// OOM kills and faults, its user's OOM kills, complaints about its filesystems, GPU Xid errors), or `all`
    /// [default: job when hangwatch runs as root and the attached processes are another user's (the node
    /// service's watchers), else all].
    #[arg(long, value_enum, value_name = "SCOPE")]
    kernel_log: Option<KernelLogArg>,
    /// Where only the job's kernel-log lines are kept: also keep every line in the report directory, in
    /// kernel-log.root.txt (mode 0600, hangwatch's user's: root's), which is never the job owner's.
    #[arg(long)]
    keep_kernel_log: bool,
    /// The job: a command and its arguments, after `--`.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required_unless_present = "attach",
        value_name = "CMD"
    )]
    command: Vec<OsString>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.nproc == Some(0) {
        return Err(usage("--nproc must be at least 1"));
    }
    let env = |key: &str| std::env::var(key).ok();
    let placement = Placement::from_env(env);
    let nnodes = args.nnodes.unwrap_or(placement.nnodes);
    let node_rank = args.node_rank.unwrap_or(placement.node_rank);
    if nnodes == 0 {
        return Err(usage("--nnodes must be at least 1"));
    }
    if node_rank >= nnodes {
        return Err(usage(format!(
            "--node-rank {node_rank} is not below --nnodes {nnodes}"
        )));
    }
    if args.min_stall > args.max_stall {
        return Err(usage("--min-stall is above --max-stall"));
    }
    let history_fleet = args.fleet.target()?;
    // Inside a multi-node Slurm step every node computes the same MASTER_ADDR and MASTER_PORT without talking.
    let in_slurm_step = nnodes > 1 && env("SLURM_STEP_ID").is_some();
    let job_id = slurm::job_id_or_default(args.job_id.as_deref(), env);
    let master_addr = args
        .master_addr
        .clone()
        .or_else(|| in_slurm_step.then(|| slurm::first_node(env)).flatten())
        .unwrap_or_else(|| "127.0.0.1".into());
    let master_port = args
        .master_port
        .or_else(|| in_slurm_step.then(|| slurm::job_port(&job_id)).flatten());
    let node_name = args.node_name.clone().or_else(|| slurm::node_name(env));
    // A requeued attempt learns what happened to the one before, from the job itself.
    let slurm_job = (args.action == Action::Requeue)
        .then(|| hangwatch_slurm::requeue::SlurmJob::from_env(env))
        .flatten();
    if args.action == Action::Requeue && slurm_job.is_none() {
        say("hangwatch: --action requeue outside a Slurm job: a hang is ended as with --action abort (exit 75)");
    }
    // Every node reads it: each waits for the storage that hung the last attempt before starting its ranks.
    let previous_attempt = slurm_job
        .as_ref()
        .and_then(|job| hangwatch_run::requeue::previous_attempt(job, node_rank == 0));
    let restart_env = slurm_job
        .as_ref()
        .map(|job| hangwatch_run::requeue::restart_env(job, env))
        .unwrap_or_default();
    let coordination = attempt::coordination(
        &attempt::CoordinationFlags {
            coordinator: args.coordinator.as_deref(),
            host_coordinator: args.host_coordinator,
            token_file: args.token_file.as_deref(),
            nproc: args.nproc,
        },
        &attempt::Placed {
            nnodes,
            node_rank,
            master_addr: &master_addr,
            master_port,
            job_id: &job_id,
            node_name: node_name.as_deref(),
        },
    )?;
    if args.attach.is_empty() {
        let program = args
            .command
            .first()
            .ok_or_else(|| usage("no command to run: put it after `--`"))?;
        check_program(program).map_err(|e| usage(format!("cannot run the job: {e}")))?;
    }
    for &pid in &args.attach {
        if pid <= 1 || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(usage(format!(
                "--attach {pid}: no such process here (give the pid of a running process of the job, as this \
                 node's /proc shows it)"
            )));
        }
    }
    // The socket is bound and removed by the loop itself: on a filesystem that can stop, so would hangwatch.
    if let Some(socket) = args
        .beat_socket
        .as_deref()
        .filter(|s| !hangwatch_run::dirs::node_local(s))
    {
        return Err(usage(format!(
            "--beat-socket {} is on a network or FUSE filesystem, which hangwatch must never wait on: give a \
             node-local path (the node service uses /run/hangwatch-node/steps)",
            socket.display()
        )));
    }
    if let Some(fleet) = &history_fleet {
        // Verdicts that waited while the fleet database did not answer: shipped now, in the background.
        match hangwatch_child::self_exe() {
            Ok(exe) => hangwatch_agent::history::ship_in_background(
                exe,
                hangwatch_run::dirs::history_db_path(),
                fleet.clone(),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "cannot ship waiting verdicts: where is this hangwatch?")
            }
        }
    }
    let alerter = std::sync::Arc::new(args.alerts.alerter()?);
    if let Some(dir) = &args.metrics_textfile {
        hangwatch_run::metrics::check_textfile_dir(dir)?;
    }
    let rotation = hangwatch_logsink::Rotation::new(args.log_max_size, args.log_keep)
        .map_err(|e| usage(format!("--log-keep 0: {e}")))?;
    // Held open until the run ends: its lock keeps a concurrent run's pruning away from it.
    let private_dir = attempt::open_report_dir(args.report_dir.as_deref(), args.keep_runs)?;
    let report_dir = private_dir.path().to_path_buf();
    // Blind or Silent settings (e.g. the report directory on a network filesystem: SPEC promise 4), said now.
    hangwatch_run::doctor::say_startup_warnings(&report_dir, args.log_file.as_deref());

    let sink = match &args.log_file {
        Some(path) => Some(hangwatch_run::log_sink::open(
            path,
            &report_dir,
            false,
            rotation,
        )?),
        None => Some(hangwatch_run::log_sink::open(
            &report_dir.join("output.log"),
            &report_dir,
            true,
            rotation,
        )?),
    };

    let metrics_node = node_name.clone().unwrap_or_else(|| "localhost".into());
    let agent_metrics = (args.metrics.is_some() || args.metrics_textfile.is_some())
        .then(|| Arc::new(AgentMetrics::new(&job_id, &metrics_node)));
    if let Some(metrics) = &agent_metrics {
        let (sent, failed, not_sent) = (
            Arc::clone(metrics),
            Arc::clone(metrics),
            Arc::clone(metrics),
        );
        hangwatch_run::alerts::count_deliveries(
            &alerter,
            move |t| sent.alert_sent(t),
            move |t| failed.alert_failed(t),
            move |r| not_sent.alert_not_sent(r),
        );
    }
    let launch = LaunchSpec {
        command: args.command.clone(),
        nproc: args.nproc,
        socket: None,
        beats: None,
        nnodes,
        node_rank,
        master_addr,
        master_port,
        env: restart_env,
        attach: args.attach.clone(),
        python_bootstrap: None,
        beat_socket: args.beat_socket.clone(),
    };
    let config = RunConfig {
        detector: DetectorConfig {
            fixed: args.stall_after,
            floor: args.min_stall,
            ceiling: args.max_stall,
            ..DetectorConfig::default()
        },
        on_hang: args.action.on_hang(),
        grace: args.grace,
        console: (!args.quiet).then_some(args.json),
        prefix: !args.no_prefix && args.nproc.is_some_and(|n| n > 1),
        sink: sink.as_ref().map(|s| s.line_sink()),
        node: node_name.clone(),
        job_id: Some(job_id.clone()),
        alerter: std::sync::Arc::clone(&alerter),
        history_db: Some(hangwatch_run::dirs::history_db_path()),
        history_fleet: history_fleet.clone(),
        failed_rank_grace: args
            .stall_after
            .map(|d| d / 2)
            .unwrap_or(Duration::from_secs(30))
            .min(Duration::from_secs(30)),
        coordinator: coordination.as_ref().map(|c| c.link.clone()),
        fs_stall: args.fs_stall,
        metrics: agent_metrics.clone(),
        instrument: !args.no_instrument,
        kernel_log: args.kernel_log.map(KernelLogArg::scope),
        keep_kernel_log: args.keep_kernel_log,
        ..RunConfig::new(launch, report_dir.clone())
    };
    let metrics = agent_metrics.map(|metrics| attempt::MetricsOutput {
        metrics,
        listen: args.metrics,
        textfile: args
            .metrics_textfile
            .clone()
            .map(|dir| (dir, textfile_name(&job_id, &metrics_node))),
    });
    let requeue = slurm_job.map(|job| attempt::Requeue {
        job,
        previous: previous_attempt,
        storage_wait: args.storage_wait,
        max_requeues: args.max_requeues,
        drain_bad_nodes: args.drain_bad_nodes,
    });
    let code = attempt::Attempt {
        config,
        on_hang: args.action.on_hang(),
        report_dir: private_dir,
        job_id,
        node_name,
        node_rank,
        coordination,
        alerter,
        metrics,
        requeue,
        sink,
        json: args.json,
        grace: args.grace,
    }
    .run()?;
    Ok(ExitCode::from(
        u8::try_from(code.clamp(0, 255)).unwrap_or(1),
    ))
}
