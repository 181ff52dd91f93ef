//! The node service (`hangwatch node`): watches every Slurm job step on it, with no change to the
//! jobs' scripts. It finds the steps (`hangwatch_slurm::steps`), starts one watcher per step (`hangwatch run
//! --attach` on the step's tasks, a process of its own so that one step's trouble is not another's), stands
//! back where a job runs its own `hangwatch run`, and ends a hung job through Slurm. The loop only looks and
//! starts: every watcher reports back by exiting.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hangwatch_agent::human::say;
use hangwatch_inspect::pystack::StackReadOptions;
use hangwatch_model::exit::EXIT_HUNG;
use hangwatch_model::Verdict;
use hangwatch_proc::ProcFs;
use hangwatch_slurm::ids::{JobId, NodeName};
use hangwatch_slurm::munge::Munge;
use hangwatch_slurm::records;
use hangwatch_slurm::steps::{StepFinder, StepOnNode};

use hangwatch_model::exit::UsageError;

use keys::{HostedKeys, Joining, PeerSettings};

pub mod keys;

fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(message.into()))
}

/// How the service runs: `hangwatch node`'s options (crates/cli), documented there.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This node's name in Slurm; `None`: the host name, or every emulated node's (`slurmd -N`) on this machine.
    pub node_name: Option<String>,
    /// What to do about a hung step; a job may narrow it with HANGWATCH_ACTION=observe.
    pub action: NodeAction,
    /// How often to look for steps that started or ended.
    pub scan_every: Duration,
    /// Where each step's evidence goes; `None`: the job owner's `/var/tmp/hangwatch-<uid>`.
    pub report_root: Option<PathBuf>,
    /// Where other nodes' services ask this one for a step's key (`ADDR:PORT`), or `off`.
    pub peer_listen: String,
    /// `NAME=HOST:PORT` for nodes whose service is not at their name and `peer_listen`'s port.
    pub peers: Vec<String>,
    /// munged's socket; `None`: munge's own.
    pub munge_socket: Option<PathBuf>,
    /// Every kernel-log line of a hang kept root's beside the evidence (`run --keep-kernel-log`).
    pub keep_kernel_log: bool,
}

/// The service's node-local directory (tmpfs, root's): `tokens/` (root only) holds the watchers' token files,
/// `steps/` each step's heartbeat socket, `python/` the bootstrap that a TaskProlog puts on the ranks' path
/// (docs/inside-evidence.md); every user can read the last two, only root can write any of it.
pub const RUNTIME_DIR: &str = "/run/hangwatch-node";

/// Makes `steps/` and writes `python/` under [`RUNTIME_DIR`]; where the steps' sockets go.
fn prepare_runtime(root: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let steps = root.join("steps");
    std::fs::create_dir_all(&steps)?;
    for dir in [root, steps.as_path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    hangwatch_agent::instrument::write_bootstrap(&root.join("python"))?;
    Ok(steps)
}

/// The services' meeting settings from the options; `None` with `--peer-listen off`.
fn peer_settings(args: &Settings) -> anyhow::Result<Option<(PeerSettings, SocketAddr)>> {
    if args.peer_listen.trim() == "off" {
        return Ok(None);
    }
    let listen: SocketAddr = args.peer_listen.trim().parse().map_err(|_| {
        usage(format!(
            "--peer-listen {:?} is not ADDR:PORT (e.g. 0.0.0.0:17830) or off",
            args.peer_listen
        ))
    })?;
    let mut peers = BTreeMap::new();
    for peer in &args.peers {
        let Some((name, addr)) = peer
            .split_once('=')
            .filter(|(n, a)| !n.is_empty() && a.contains(':'))
        else {
            return Err(usage(format!(
                "--peer {peer:?} is not NAME=HOST:PORT (e.g. n1=10.0.0.1:17830)"
            )));
        };
        peers.insert(name.trim().to_string(), addr.trim().to_string());
    }
    Ok(Some((
        PeerSettings {
            port: listen.port(),
            peers,
            munge: Munge::at(args.munge_socket.as_deref()),
            token_dir: Path::new(RUNTIME_DIR).join("tokens"),
        },
        listen,
    )))
}

/// What the service may do about a hang (requeue needs the job's own `run`: docs/requeue.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAction {
    Observe,
    Abort,
}

/// The action for one job: the site's, unless the job asks for observe (a job may narrow, never widen).
pub fn action_for_job(site: NodeAction, requested: Option<&str>) -> NodeAction {
    match requested.map(str::trim) {
        Some("observe") => NodeAction::Observe,
        _ => site,
    }
}

/// A step as the service keys it: the same job step on two emulated nodes, or started again, is another.
type StepKey = (String, String, Option<String>, i32);

fn key_of(step: &StepOnNode) -> StepKey {
    (
        step.job_id.clone(),
        step.step.clone(),
        step.node.clone(),
        step.slurmstepd,
    )
}

/// How long a step's tasks may take to all start (`slurmstepd` starts them one by one) before the service watches
/// the ones there are: a watcher is given its tasks once, and a rank left out of it would never be seen stuck.
const TASKS_START_GRACE: Duration = Duration::from_secs(20);

/// Whether to start watching a step now, first seen at `first_seen`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WhenToWatch {
    /// Every task it runs here has started (or Slurm did not say how many).
    Now,
    /// Some are still missing: looked at again at the next scan.
    Later,
    /// Some are still missing after [`TASKS_START_GRACE`]: watch the ones there are.
    NowWithoutSome,
}

fn when_to_watch(step: &StepOnNode, first_seen: Instant, now: Instant) -> WhenToWatch {
    if step.all_tasks_started() {
        WhenToWatch::Now
    } else if now.saturating_duration_since(first_seen) < TASKS_START_GRACE {
        WhenToWatch::Later
    } else {
        WhenToWatch::NowWithoutSome
    }
}

/// One step's watcher.
struct Watcher {
    child: Child,
    step: StepOnNode,
    /// Where the watcher writes its evidence: `dir_name` in root's `staging` directory, until the step ends.
    report_dir: PathBuf,
    staging: Arc<hangwatch_safefs::PrivateDir>,
    dir_name: String,
    /// The watcher's stdout once it closed: its verdict, one JSON document.
    stdout: Receiver<Vec<u8>>,
    action: NodeAction,
    /// Its token file, for a step on several nodes: removed when it ends.
    token_file: Option<PathBuf>,
}

pub fn run(args: Settings, config: Option<&Path>) -> anyhow::Result<ExitCode> {
    if !nix::unistd::geteuid().is_root() {
        return Err(usage(
            "hangwatch node watches every user's jobs and must run as root (the systemd unit does); to watch \
             your own job, put `hangwatch run` in its script",
        ));
    }
    // The loop creates each step's directory itself: under a root on a network or FUSE filesystem that stops, it
    // would stop too (and with it every watch on the node).
    if let Some(root) = args
        .report_root
        .as_deref()
        .filter(|r| !hangwatch_run::dirs::node_local(r))
    {
        return Err(usage(format!(
            "--report-root {} is on a network or FUSE filesystem, which the service must never wait on: give a \
             node-local directory (the default is each job owner's /var/tmp/hangwatch-<uid>)",
            root.display()
        )));
    }
    let peer = peer_settings(&args)?;
    let keys = Arc::new(HostedKeys::default());
    if let Some((settings, listen)) = &peer {
        match std::net::TcpListener::bind(listen) {
            Ok(listener) => {
                keys::serve(listener, Arc::clone(&keys), settings.munge.clone())?;
            }
            Err(e) => {
                say(format!(
                    "hangwatch node: warning: cannot listen on {listen} for other nodes' services ({e}): a step \
                     on several nodes whose first node is this one is decided by each node alone"
                ));
            }
        }
    }
    let beat_sockets = prepare_runtime(Path::new(RUNTIME_DIR))
        .map_err(|e| {
            say(format!(
                "hangwatch node: warning: cannot prepare {RUNTIME_DIR} ({e}): steps are watched without their \
                 ranks' beats, whatever a TaskProlog exports"
            ))
        })
        .ok();
    let staging = Arc::new(staging_root().map_err(|e| {
        usage(format!(
            "cannot keep the steps' evidence ({e:#}): the service needs a directory of root's for it \
             (/var/lib/hangwatch-node/evidence, or node-evidence in $HANGWATCH_STATE_DIR)"
        ))
    })?);
    let program = hangwatch_child::self_exe()?;
    let options = StackReadOptions::for_self()?;
    let procfs = ProcFs::new("/proc");
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(signal, Arc::clone(&stop))?;
    }
    let node = args.node_name.as_deref();
    say(format!(
        "hangwatch node: watching the Slurm steps {} (action {}, a look every {})",
        node.map(|n| format!("of node {n}"))
            .unwrap_or_else(|| "on this machine".into()),
        action_name(args.action),
        hangwatch_model::format_duration(args.scan_every)
    ));
    notify(&[sd_notify::NotifyState::Ready]);
    let mut finder = StepFinder::default();
    let mut watchers: BTreeMap<StepKey, Watcher> = BTreeMap::new();
    // Steps already dealt with (watched to the end, or left to their own hangwatch): not started again.
    let mut seen: BTreeSet<StepKey> = BTreeSet::new();
    // Steps whose tasks are still starting, and when each was first found.
    let mut starting: BTreeMap<StepKey, Instant> = BTreeMap::new();
    // Steps on several nodes waiting for their first node's key (asked in a worker), and what the workers said.
    let mut asking: BTreeMap<StepKey, (StepOnNode, NodeAction)> = BTreeMap::new();
    let (answers_to, answers) =
        std::sync::mpsc::channel::<(StepKey, Result<Option<Joining>, String>)>();
    let watch = |watchers: &mut BTreeMap<StepKey, Watcher>,
                 key: StepKey,
                 step: &StepOnNode,
                 action: NodeAction,
                 joining: Option<Joining>| {
        let launch = Launch {
            program: &program,
            config,
            beat_sockets: beat_sockets.as_deref(),
            keep_kernel_log: args.keep_kernel_log,
            staging: &staging,
        };
        match start_watcher(&launch, step, action, joining.as_ref()) {
            Ok(watcher) => {
                say(format!(
                    "hangwatch node: watching step {} on {} (uid {}, tasks {:?}, action {}{}); evidence in {} \
                     (root's until the step ends, then its owner's)",
                    step.name(),
                    step.node.as_deref().unwrap_or("this node"),
                    step.uid.map_or("?".into(), |u| u.to_string()),
                    step.tasks,
                    action_name(action),
                    joining.as_ref().map_or(String::new(), |j| format!(
                        ", {} its coordinator at {} for {} nodes",
                        if j.host { "hosting" } else { "joining" },
                        j.coordinator,
                        j.nnodes
                    )),
                    watcher.report_dir.display()
                ));
                watchers.insert(key, watcher);
            }
            Err(e) => {
                say(format!(
                    "hangwatch node: error: cannot watch step {}: {e:#}",
                    step.name()
                ));
            }
        }
    };
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        notify(&[sd_notify::NotifyState::Watchdog]);
        let steps = finder.scan(&procfs, node, &options);
        let present: BTreeSet<StepKey> = steps.iter().map(key_of).collect();
        seen.retain(|k| present.contains(k));
        starting.retain(|k, _| present.contains(k));
        asking.retain(|k, _| present.contains(k));
        while let Ok((key, answer)) = answers.try_recv() {
            let Some((step, action)) = asking.remove(&key) else {
                continue;
            };
            let joining = answer
                .map_err(|e| {
                    say(format!(
                        "hangwatch node: warning: step {} cannot join its coordinator ({e}): this node decides \
                         alone",
                        step.name()
                    ))
                })
                .ok()
                .flatten();
            watch(&mut watchers, key, &step, action, joining);
        }
        for step in steps {
            let key = key_of(&step);
            if watchers.contains_key(&key) || seen.contains(&key) {
                continue;
            }
            let first_seen = *starting.entry(key.clone()).or_insert(started);
            match when_to_watch(&step, first_seen, started) {
                WhenToWatch::Later => continue,
                WhenToWatch::Now => {}
                WhenToWatch::NowWithoutSome => {
                    say(format!(
                        "hangwatch node: warning: step {} started {} of its {} tasks here within {}: \
                         watching those",
                    step.name(),
                    step.tasks.len(),
                    step.tasks_expected.unwrap_or_default(),
                    hangwatch_model::format_duration(TASKS_START_GRACE)
                    ));
                }
            }
            starting.remove(&key);
            seen.insert(key.clone());
            for claim in &step.disbelieved {
                say(format!(
                    "hangwatch node: warning: step {}: {claim}: not believed (a step's job, step and node are \
                     its slurmstepd's)",
                    step.name()
                ));
            }
            if let Some(pid) = own_hangwatch(&procfs, &step.tasks) {
                say(format!(
                    "hangwatch node: step {} runs its own hangwatch (pid {pid}): left to it",
                    step.name()
                ));
                continue;
            }
            let action =
                action_for_job(args.action, finder.requested_action(&step.tasks).as_deref());
            // A step whose tasks say it may span nodes: Slurm is asked which, in a worker (see keys::agree).
            let joining = match &peer {
                Some((settings, _)) if step.may_span_nodes => {
                    keys::agree_in_background(
                        key.clone(),
                        &step,
                        &keys,
                        settings,
                        answers_to.clone(),
                    );
                    asking.insert(key, (step, action));
                    continue;
                }
                _ => None,
            };
            watch(&mut watchers, key, &step, action, joining);
        }
        reap(&mut watchers, &keys, args.report_root.as_deref());
        let spent = started.elapsed();
        if let Some(rest) = args.scan_every.checked_sub(spent) {
            sleep_unless(&stop, rest);
        }
    }
    say(format!(
        "hangwatch node: stopping; {} watcher(s) told to leave their jobs alone",
        watchers.len()
    ));
    notify(&[sd_notify::NotifyState::Stopping]);
    for watcher in watchers.values() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(watcher.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !watchers.is_empty() && Instant::now() < deadline {
        reap(&mut watchers, &keys, args.report_root.as_deref());
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(ExitCode::SUCCESS)
}

fn action_name(action: NodeAction) -> &'static str {
    match action {
        NodeAction::Observe => "observe",
        NodeAction::Abort => "abort",
    }
}

/// Tells systemd (when it started the service with `Type=notify`); nothing otherwise.
fn notify(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::debug!(error = %e, "cannot notify systemd");
    }
}

fn sleep_unless(stop: &AtomicBool, total: Duration) {
    let end = Instant::now() + total;
    while !stop.load(Ordering::SeqCst) && Instant::now() < end {
        std::thread::sleep(
            Duration::from_millis(50).min(end.saturating_duration_since(Instant::now())),
        );
    }
}

/// A `hangwatch` process among the step's tasks and their descendants: the job watches itself.
fn own_hangwatch(procfs: &ProcFs, tasks: &[i32]) -> Option<i32> {
    procfs
        .subtree(tasks)
        .into_iter()
        .find(|s| s.comm == "hangwatch")
        .map(|s| s.pid)
}

/// Where the service keeps each step's evidence while the step runs: `node-evidence` in
/// `$HANGWATCH_STATE_DIR` where set (a site's or a test's choice), else `/var/lib/hangwatch-node/evidence`, whose
/// every parent is root's (not `/var/tmp`, where any user could take a name before the service first starts).
/// Opened once and held; the watcher writes there, and when the step ends the directory is handed to the job's
/// owner ([`hand_over`]).
fn staging_root() -> anyhow::Result<hangwatch_safefs::PrivateDir> {
    let dir = match std::env::var_os(hangwatch_run::dirs::STATE_DIR_ENV)
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
    {
        Some(state) => state.join("node-evidence"),
        None => PathBuf::from("/var/lib/hangwatch-node/evidence"),
    };
    Ok(hangwatch_safefs::PrivateDir::open_or_create(&dir)?)
}

/// The name of a step's evidence directory: every part is in the grammar of Slurm's names (the step's facts are
/// root's, see `hangwatch_slurm::steps`), so it is one plain file name.
fn step_dir_name(step: &StepOnNode) -> String {
    format!(
        "step-{}-{}-{}",
        step.name(),
        step.node.as_deref().unwrap_or("node"),
        hangwatch_model::utc_stamp(hangwatch_model::unix_now() as u64)
    )
}

/// Files of a step's evidence that stay root's when the rest is handed over: the whole kernel log, kept only
/// where the site asks (`[node] keep_kernel_log`); the job's owner gets the lines that concern the job.
const ROOT_ONLY: &[&str] = &[hangwatch_agent::kernel_log::ROOT_KERNEL_LOG];

/// Hands a step's evidence to its owner: given by descriptor in root's staging directory, then moved into the
/// owner's `/var/tmp/hangwatch-<uid>` (or the site's `--report-root`), never by a path the owner controls. Where
/// it cannot be moved, it stays in root's staging directory and the line says where.
fn hand_over(
    staging: &hangwatch_safefs::PrivateDir,
    name: &str,
    uid: u32,
    report_root: Option<&Path>,
) -> Result<PathBuf, String> {
    let to = match report_root {
        Some(root) => hangwatch_safefs::UsersDir::open_site_root(root),
        None => {
            let users = hangwatch_run::dirs::default_root(uid);
            let (Some(parent), Some(name)) = (users.parent(), users.file_name()) else {
                return Err(format!("{} has no parent directory", users.display()));
            };
            hangwatch_safefs::UsersDir::open_or_create(parent, &name.to_string_lossy(), uid)
        }
    }
    .map_err(|e| e.to_string())?;
    staging
        .hand_over(name, uid, ROOT_ONLY, &to)
        .map_err(|e| format!("{e:#}"))
}

/// What every watcher of this service is started with.
struct Launch<'a> {
    program: &'a Path,
    config: Option<&'a Path>,
    beat_sockets: Option<&'a Path>,
    keep_kernel_log: bool,
    staging: &'a Arc<hangwatch_safefs::PrivateDir>,
}

fn start_watcher(
    launch: &Launch<'_>,
    step: &StepOnNode,
    action: NodeAction,
    joining: Option<&Joining>,
) -> anyhow::Result<Watcher> {
    let Launch {
        program,
        config,
        beat_sockets,
        keep_kernel_log,
        staging,
    } = *launch;
    let dir_name = step_dir_name(step);
    let report_dir = staging.subdir(&dir_name)?.path().to_path_buf();
    let mut command = Command::new(program);
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    command
        .arg("run")
        .args(
            step.tasks
                .iter()
                .flat_map(|t| ["--attach".to_string(), t.to_string()]),
        )
        .arg("--job-id")
        .arg(&step.job_id)
        .arg("--report-dir")
        .arg(&report_dir)
        .arg("--action")
        .arg(action_name(action))
        .arg("--json");
    if let Some(node) = &step.node {
        command.arg("--node-name").arg(node);
    }
    if let Some(joining) = joining {
        command.args(joining.run_args());
    }
    if let Some(dir) = beat_sockets {
        command.arg("--beat-socket").arg(beat_socket(dir, step));
    }
    if keep_kernel_log {
        command.arg("--keep-kernel-log");
    }
    // The service's own systemd channel is not the watchers'.
    command
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A watcher outlives no service: told to stop, it leaves its job alone (a restarted service watches anew).
    hangwatch_agent::sys::on_parent_death(&mut command, nix::sys::signal::Signal::SIGTERM);
    let mut child = command.spawn()?;
    let label = format!(
        "[{}@{}]",
        step.name(),
        step.node.as_deref().unwrap_or("node")
    );
    if let Some(stderr) = child.stderr.take() {
        std::thread::Builder::new()
            .name("hw-node-err".into())
            .spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    say(format!("{label} {line}"));
                }
            })?;
    }
    let (into, stdout) = std::sync::mpsc::channel();
    if let Some(mut pipe) = child.stdout.take() {
        std::thread::Builder::new()
            .name("hw-node-out".into())
            .spawn(move || {
                let mut buf = Vec::new();
                let _ = std::io::Read::read_to_end(&mut pipe, &mut buf);
                let _ = into.send(buf);
            })?;
    }
    Ok(Watcher {
        child,
        step: step.clone(),
        report_dir,
        staging: Arc::clone(staging),
        dir_name,
        stdout,
        action,
        token_file: joining.map(|j| j.token_file.clone()),
    })
}

/// Where step `step`'s watcher takes its ranks' beats: what the TaskProlog exports as `HANGWATCH_SOCKET`
/// (contrib/hangwatch-taskprolog.sh spells the same name).
fn beat_socket(dir: &Path, step: &StepOnNode) -> PathBuf {
    dir.join(format!(
        "{}.{}@{}.sock",
        step.job_id,
        step.step,
        step.node.as_deref().unwrap_or("node")
    ))
}

/// Watchers that ended: what they decided, and for a hung job under abort, the job ended through Slurm.
fn reap(watchers: &mut BTreeMap<StepKey, Watcher>, keys: &HostedKeys, report_root: Option<&Path>) {
    let ended: Vec<StepKey> = watchers
        .iter_mut()
        .filter_map(|(key, w)| match w.child.try_wait() {
            Ok(Some(_)) | Err(_) => Some(key.clone()),
            Ok(None) => None,
        })
        .collect();
    for key in ended {
        let Some(mut watcher) = watchers.remove(&key) else {
            continue;
        };
        let code = watcher.child.wait().ok().and_then(|s| s.code());
        let name = watcher.step.name();
        if let Some(token) = watcher.token_file.take() {
            let _ = std::fs::remove_file(token);
            keys.forget(&watcher.step.job_id, &watcher.step.step);
        }
        match watcher.step.uid {
            Some(uid) => match hand_over(&watcher.staging, &watcher.dir_name, uid, report_root) {
                Ok(dir) => say(format!(
                    "hangwatch node: step {name}'s evidence is uid {uid}'s: {}",
                    dir.display()
                )),
                Err(e) => say(format!(
                    "hangwatch node: warning: cannot hand step {name}'s evidence to uid {uid} ({e}): it stays \
                     in {} (root's)",
                    watcher.report_dir.display()
                )),
            },
            None => say(format!(
                "hangwatch node: warning: step {name}'s owner is unknown: its evidence stays in {} (root's)",
                watcher.report_dir.display()
            )),
        };
        if code == Some(EXIT_HUNG) {
            let job_id = watcher.step.job_id.clone();
            // Its verdict, then Slurm's commands, each under a deadline: in a worker, never in the loop.
            let acted = std::thread::Builder::new()
                .name("hw-node-act".into())
                .spawn(move || after_hang(&name, watcher));
            if let Err(e) = acted {
                say(format!(
                    "hangwatch node: error: cannot act on the hang of job {job_id}: {e}"
                ));
            }
        } else {
            // A line per step in the service's journal: a watcher that ended early says so here.
            say(format!(
                "hangwatch node: stopped watching step {name} (its watcher exited with {})",
                code.map_or("a signal".into(), |c| format!("code {c}"))
            ));
        }
    }
}

/// How long the watcher's verdict may take to arrive once it exited: its stdout closes with it, unless a child it
/// left behind (stuck in D) still holds the pipe; then the hang is acted on without the verdict's words.
const VERDICT_WAIT: Duration = Duration::from_secs(2);

/// A watcher that ended a hung step: says its verdict, and under abort ends the job through Slurm and drains the
/// node when a rank could not be killed.
fn after_hang(name: &str, watcher: Watcher) {
    let verdict: Option<Verdict> = watcher
        .stdout
        .recv_timeout(VERDICT_WAIT)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let summary = verdict.as_ref().map(|v| v.summary.as_str());
    say(format!(
        "hangwatch node: step {name} hung: {}",
        summary.unwrap_or("(no verdict)")
    ));
    if watcher.action != NodeAction::Abort {
        return;
    }
    let (job, node) = match slurm_runs_it_here(&watcher.step) {
        Ok(checked) => checked,
        Err(why) => {
            let refused = REFUSED.fetch_add(1, Ordering::SeqCst) + 1;
            say(format!(
                "hangwatch node: refused to end job {} or drain this node: {why} ({refused} refusal(s) since the \
                 service started)",
                watcher.step.job_id
            ));
            return;
        }
    };
    end_job_through_slurm(&job, summary);
    let unkillable = verdict.as_ref().map(unkillable_ranks).unwrap_or_default();
    if !unkillable.is_empty() {
        drain_node(&node, &unkillable, summary);
    }
}

/// How many times the service refused to act on a job Slurm does not run here as its processes' owner.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// The job and this node, once Slurm said the job runs here as the user whose processes were found: nothing a job
/// can write (its environment, its name) decides whose job root cancels or which node it drains.
fn slurm_runs_it_here(step: &StepOnNode) -> Result<(JobId, NodeName), String> {
    let job = JobId::parse(&step.job_id).map_err(|e| e.to_string())?;
    let node =
        NodeName::parse(step.node.as_deref().unwrap_or_default()).map_err(|e| e.to_string())?;
    let uid = step.uid.ok_or("the owner of its processes is unknown")?;
    let record = records::ask_job(&job).map_err(|e| e.to_string())?;
    records::runs_here(&record, uid, &node).map_err(|e| e.to_string())?;
    Ok((job, node))
}

/// The ranks the watcher could not kill (still in D after SIGKILL), from its verdict's actions.
fn unkillable_ranks(verdict: &Verdict) -> Vec<u32> {
    verdict
        .actions
        .iter()
        .filter(|a| a.action == "unkillable")
        .flat_map(|a| a.ranks.iter().copied())
        .collect()
}

/// The reason a drained node carries: who could not be killed and why, short enough for `sinfo -R`.
fn drain_reason(ranks: &[u32], summary: Option<&str>) -> String {
    let reason = format!(
        "hangwatch: {} unkillable after the job was ended; {}",
        hangwatch_model::ranks_words(ranks),
        summary.unwrap_or("see the job's AdminComment")
    );
    reason
        .chars()
        .filter(|c| !c.is_control())
        .take(250)
        .collect()
}

/// A rank that no signal ends holds its node (its memory, its GPUs, the mount): the node is drained, with why,
/// so that no new job lands on it until an admin has looked (`scontrol update State=RESUME` after a reboot).
fn drain_node(node: &NodeName, ranks: &[u32], summary: Option<&str>) {
    let mut drain = hangwatch_child::external_command("scontrol");
    drain
        .arg("update")
        .arg(format!("NodeName={node}"))
        .arg("State=DRAIN")
        .arg(format!("Reason={}", drain_reason(ranks, summary)));
    if run_slurm(drain, "scontrol update State=DRAIN") {
        say(format!(
            "hangwatch node: node {node} drained: {} could not be killed",
            hangwatch_model::ranks_words(ranks)
        ));
    }
}

/// `scontrol update AdminComment=...` (the verdict, for `sacct` and the admins) then `scancel`: the job's state
/// says it was cancelled, not that it failed by itself. Each under a deadline, started so that a blocked exec
/// cannot hold the service.
fn end_job_through_slurm(job_id: &JobId, summary: Option<&str>) {
    let comment = format!(
        "hangwatch: {}",
        summary.unwrap_or("hung; ended by the node service")
    );
    let comment: String = comment
        .chars()
        .filter(|c| !c.is_control())
        .take(900)
        .collect();
    let mut update = hangwatch_child::external_command("scontrol");
    update
        .arg("update")
        .arg(format!("JobId={job_id}"))
        .arg(format!("AdminComment={comment}"));
    run_slurm(update, "scontrol update");
    let mut cancel = hangwatch_child::external_command("scancel");
    cancel.arg("--").arg(job_id.as_str());
    if run_slurm(cancel, "scancel") {
        say(format!(
            "hangwatch node: job {job_id} cancelled through Slurm"
        ));
    }
}

fn run_slurm(command: Command, what: &str) -> bool {
    match hangwatch_child::run_with_deadline(command, Duration::from_secs(15)) {
        Ok(hangwatch_child::ChildOutcome::Finished { status, .. }) if status.success() => true,
        Ok(hangwatch_child::ChildOutcome::Finished { status, stderr, .. }) => {
            say(format!(
                "hangwatch node: warning: {what} failed ({status}): {}",
                String::from_utf8_lossy(&stderr).trim()
            ));
            false
        }
        Ok(hangwatch_child::ChildOutcome::TimedOut { .. }) => {
            say(format!(
                "hangwatch node: warning: {what} did not answer within 15 s"
            ));
            false
        }
        Err(e) => {
            say(format!("hangwatch node: warning: cannot run {what}: {e}"));
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(tasks: Vec<i32>, expected: Option<usize>) -> StepOnNode {
        StepOnNode {
            job_id: "7".into(),
            step: "0".into(),
            node: Some("n1".into()),
            uid: Some(1000),
            slurmstepd: 100,
            tasks,
            tasks_expected: expected,
            may_span_nodes: false,
            nodes: Vec::new(),
            node_index: None,
            ranks: Vec::new(),
            disbelieved: Vec::new(),
        }
    }

    #[test]
    fn a_step_is_watched_once_all_its_tasks_here_have_started_or_the_grace_is_over() {
        let t0 = Instant::now();
        let soon = t0 + Duration::from_secs(2);
        let late = t0 + TASKS_START_GRACE;
        assert_eq!(
            when_to_watch(&step(vec![11], Some(2)), t0, soon),
            WhenToWatch::Later
        );
        assert_eq!(
            when_to_watch(&step(vec![11, 12], Some(2)), t0, soon),
            WhenToWatch::Now
        );
        assert_eq!(
            when_to_watch(&step(vec![11], Some(2)), t0, late),
            WhenToWatch::NowWithoutSome
        );
        // Slurm did not say how many: no reason to wait.
        assert_eq!(
            when_to_watch(&step(vec![11], None), t0, t0),
            WhenToWatch::Now
        );
    }

    #[test]
    fn the_ranks_that_stayed_unkillable_drain_the_node_with_why() {
        let mut verdict = Verdict::unknown("rank 0 is in D in write() on /gpfs/x");
        verdict.actions = vec![
            hangwatch_model::ActionRecord {
                action: "terminate".into(),
                ranks: vec![0, 1],
                ok: true,
                detail: None,
                outcomes: Vec::new(),
            },
            hangwatch_model::ActionRecord {
                action: "unkillable".into(),
                ranks: vec![0],
                ok: false,
                detail: None,
                outcomes: Vec::new(),
            },
        ];
        assert_eq!(unkillable_ranks(&verdict), [0]);
        assert_eq!(
            drain_reason(&[0], Some("rank 0 is in D\nin write()")),
            "hangwatch: rank 0 unkillable after the job was ended; rank 0 is in Din write()"
        );
        assert!(drain_reason(&[0], Some(&"x".repeat(1000))).chars().count() <= 250);
    }

    #[test]
    fn a_job_may_ask_for_less_than_the_site_never_more() {
        assert_eq!(
            action_for_job(NodeAction::Abort, Some("observe")),
            NodeAction::Observe
        );
        assert_eq!(
            action_for_job(NodeAction::Observe, Some("abort")),
            NodeAction::Observe
        );
        assert_eq!(action_for_job(NodeAction::Abort, None), NodeAction::Abort);
        assert_eq!(
            action_for_job(NodeAction::Abort, Some("requeue")),
            NodeAction::Abort
        );
    }
}
