//! A job started through a container client (`docker run`, `podman run`, `nerdctl run`): its ranks are the
//! container's processes, children of the runtime's shim (`conmon`, `containerd-shim`), never of the client.
//!
//! hangwatch adds `--cidfile` to the client's `run` and finds the container by the id the client itself writes
//! there: no guessing by name, image or start time, and the same for the three runtimes (each has `--cidfile`). It
//! then asks the runtime (`inspect`) for the container's first process, whose descendants are the ranks, and ends
//! the container through the runtime (`kill`, then `rm` where `--rm` was asked). Every call goes through the
//! runtime's own CLI with the client's global options (`--root`, `-H`, `--namespace`), so it reaches the runtime the
//! client used, and runs in a child under a deadline: a daemon that does not answer never holds hangwatch.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hangwatch_child::{external_command, run_with_deadline, ChildOutcome};
use hangwatch_model::{ContainerEnded, ContainerRef};
use hangwatch_proc::ProcFs;

/// How long one runtime call (`inspect`, `kill`, `rm`) may take: a daemon that answers does so in well under a
/// second (podman 4.3 `inspect`: 60 ms, `kill`: 450 ms here).
pub const RUNTIME_DEADLINE: Duration = Duration::from_secs(10);

/// How often the finder looks for the id file and the container's first process while the client starts it (an
/// image pull may take minutes: the finder looks for as long as the client runs).
const FIND_EVERY: Duration = Duration::from_millis(200);

/// The container runtimes whose client `run` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Docker,
    Podman,
    Nerdctl,
}

impl Runtime {
    /// By the program's file name (`/usr/bin/podman`, `docker`).
    pub fn of_program(program: &OsStr) -> Option<Runtime> {
        match Path::new(program).file_name()?.to_str()? {
            "docker" => Some(Runtime::Docker),
            "podman" => Some(Runtime::Podman),
            "nerdctl" => Some(Runtime::Nerdctl),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Docker => "docker",
            Runtime::Podman => "podman",
            Runtime::Nerdctl => "nerdctl",
        }
    }
}

/// Global options of docker, podman and nerdctl that take a value as the next argument: what is skipped to find
/// the subcommand, and what later calls repeat.
const GLOBAL_WITH_VALUE: &[&str] = &[
    "-H",
    "--host",
    "-c",
    "--context",
    "--connection",
    "--config",
    "-l",
    "--log-level",
    "--tlscacert",
    "--tlscert",
    "--tlskey",
    "--cgroup-manager",
    "--conmon",
    "--events-backend",
    "--hooks-dir",
    "--identity",
    "--imagestore",
    "--module",
    "--network-cmd-path",
    "--network-config-dir",
    "--root",
    "--runroot",
    "--runtime",
    "--runtime-flag",
    "--storage-driver",
    "--storage-opt",
    "--ssh",
    "--tmpdir",
    "--url",
    "--volumepath",
    "-n",
    "--namespace",
    "-a",
    "--address",
    "--snapshotter",
    "--cni-path",
    "--cni-netconfpath",
    "--data-root",
    "--hosts-dir",
];

/// Options of `run` that take a value as the next argument: skipped while looking for the user's own `--cidfile`
/// among the options (the first other word is the image; what follows it is the container's command).
const RUN_WITH_VALUE: &[&str] = &[
    "-a",
    "--attach",
    "--add-host",
    "--annotation",
    "--arch",
    "--blkio-weight",
    "--cap-add",
    "--cap-drop",
    "--cgroup-conf",
    "--cgroup-parent",
    "--cgroupns",
    "--cgroups",
    "--cidfile",
    "--conmon-pidfile",
    "-c",
    "--cpu-shares",
    "--cpu-period",
    "--cpu-quota",
    "--cpus",
    "--cpuset-cpus",
    "--cpuset-mems",
    "--detach-keys",
    "--device",
    "--dns",
    "--dns-option",
    "--dns-search",
    "--entrypoint",
    "-e",
    "--env",
    "--env-file",
    "--expose",
    "--gpus",
    "--group-add",
    "--health-cmd",
    "-h",
    "--hostname",
    "--init-path",
    "--ip",
    "--ipc",
    "-l",
    "--label",
    "--label-file",
    "--log-driver",
    "--log-opt",
    "-m",
    "--memory",
    "--memory-swap",
    "--mount",
    "--name",
    "--net",
    "--network",
    "--pid",
    "--pidfile",
    "--pids-limit",
    "--platform",
    "--pod",
    "-p",
    "--publish",
    "--pull",
    "--restart",
    "--runtime",
    "--secret",
    "--security-opt",
    "--shm-size",
    "--stop-signal",
    "--stop-timeout",
    "--sysctl",
    "--tmpfs",
    "-u",
    "--user",
    "--ulimit",
    "--userns",
    "--uts",
    "-v",
    "--volume",
    "--volumes-from",
    "-w",
    "--workdir",
];

/// A container client's command as hangwatch runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCommand {
    pub runtime: Runtime,
    /// The client's program as given (later calls use the same one).
    pub program: OsString,
    /// The options given before `run` (`--root DIR`, `-H unix:///...`): every later call carries them.
    pub global: Vec<OsString>,
    /// Where the client writes the container's id.
    pub cidfile: PathBuf,
    /// `false`: the user gave `--cidfile` and hangwatch reads theirs (in a child: it may be on any filesystem).
    pub added: bool,
    /// The command to start: the user's, with `--cidfile` added after `run` where it had none.
    pub command: Vec<OsString>,
}

/// Whether `command` is a container client's `run` (`podman [opts] run ...`, `docker container run ...`); if so,
/// the command to start instead (with `--cidfile=<ours>` where the user gave none) and how to reach the runtime.
pub fn client_command(command: &[OsString], ours: &Path) -> Option<ClientCommand> {
    let program = command.first()?;
    let runtime = Runtime::of_program(program)?;
    let mut i = 1;
    let mut global = Vec::new();
    let mut words = Vec::new();
    while i < command.len() && words.len() < 2 {
        let arg = command[i].to_str()?;
        if arg.starts_with('-') && words.is_empty() {
            global.push(command[i].clone());
            if !arg.contains('=') && GLOBAL_WITH_VALUE.contains(&arg) {
                global.extend(command.get(i + 1).cloned());
                i += 1;
            }
        } else if arg.starts_with('-') {
            return None;
        } else {
            words.push(arg);
            if arg == "run" {
                break;
            }
        }
        i += 1;
    }
    match words.as_slice() {
        ["run"] | ["container", "run"] => {}
        _ => return None,
    }
    let run_at = i;
    let mut users = None;
    let mut j = run_at + 1;
    while j < command.len() {
        let Some(arg) = command[j].to_str() else {
            break;
        };
        if arg == "--" || !arg.starts_with('-') {
            break;
        }
        if let Some(path) = arg.strip_prefix("--cidfile=") {
            users = Some(PathBuf::from(path));
        } else if arg == "--cidfile" {
            users = command.get(j + 1).map(PathBuf::from);
        }
        if !arg.contains('=') && RUN_WITH_VALUE.contains(&arg) {
            j += 1;
        }
        j += 1;
    }
    let (cidfile, added, command) = match users {
        Some(path) => (path, false, command.to_vec()),
        None => {
            let mut with = command[..=run_at].to_vec();
            let mut flag = OsString::from("--cidfile=");
            flag.push(ours);
            with.push(flag);
            with.extend_from_slice(&command[run_at + 1..]);
            (ours.to_path_buf(), true, with)
        }
    };
    Some(ClientCommand {
        runtime,
        program: program.clone(),
        global,
        cidfile,
        added,
        command,
    })
}

/// What `inspect` says of a container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inspected {
    pub id: String,
    pub name: Option<String>,
    pub image: Option<String>,
    /// Its first process on the node; `None` (0 in the runtime's answer) while it is not running.
    pub pid: Option<i32>,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub auto_remove: bool,
}

/// Parses `inspect`'s JSON (an array of one object, the same shape for docker, podman and nerdctl); `None` for an
/// empty array.
pub fn parse_inspect(json: &str) -> Result<Option<Inspected>, serde_json::Error> {
    let all: Vec<serde_json::Value> = serde_json::from_str(json)?;
    let Some(c) = all.into_iter().next() else {
        return Ok(None);
    };
    let text = |v: &serde_json::Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
    let state = &c["State"];
    let running = state["Running"].as_bool().unwrap_or(false);
    Ok(Some(Inspected {
        id: text(&c["Id"]).unwrap_or_default(),
        name: text(&c["Name"]).map(|n| n.trim_start_matches('/').to_string()),
        image: text(&c["ImageName"])
            .or_else(|| text(&c["Config"]["Image"]))
            .or_else(|| text(&c["Image"])),
        pid: state["Pid"]
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .filter(|p| *p > 0),
        running,
        exit_code: (!running)
            .then(|| state["ExitCode"].as_i64())
            .flatten()
            .and_then(|c| i32::try_from(c).ok()),
        auto_remove: c["HostConfig"]["AutoRemove"].as_bool().unwrap_or(false),
    }))
}

/// A runtime call that did not work.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("could not run `{program} {what}`")]
    Start {
        program: String,
        what: &'static str,
        #[source]
        source: hangwatch_child::ChildError,
    },
    #[error("`{program} {what}` did not answer within {}s", .after.as_secs())]
    TimedOut {
        program: String,
        what: &'static str,
        after: Duration,
    },
    #[error("`{program} {what}` failed ({status}): {stderr}")]
    Failed {
        program: String,
        what: &'static str,
        status: String,
        stderr: String,
    },
    #[error("`{program} inspect` printed what is not a container")]
    Parse {
        program: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The runtime the client used, reached with the client's program and global options.
#[derive(Debug, Clone)]
pub struct RuntimeCli {
    pub runtime: Runtime,
    pub program: OsString,
    pub global: Vec<OsString>,
}

/// Whether a runtime's error says that the container does not exist (any more).
fn no_such_container(stderr: &str) -> bool {
    let lower = stderr.to_ascii_lowercase();
    lower.contains("no such container") || lower.contains("no such object")
}

impl RuntimeCli {
    pub fn of(client: &ClientCommand) -> Self {
        RuntimeCli {
            runtime: client.runtime,
            program: client.program.clone(),
            global: client.global.clone(),
        }
    }

    fn name(&self) -> String {
        self.program.to_string_lossy().into_owned()
    }

    /// Runs `<program> <global> args...` in a child under `deadline`; its stdout when it exits 0. `Ok(None)`: the
    /// runtime said the container does not exist.
    fn call(
        &self,
        what: &'static str,
        args: &[&str],
        deadline: Duration,
    ) -> Result<Option<String>, RuntimeError> {
        let mut command = external_command(&self.program);
        command.args(&self.global).args(args);
        let outcome =
            run_with_deadline(command, deadline).map_err(|source| RuntimeError::Start {
                program: self.name(),
                what,
                source,
            })?;
        match outcome {
            ChildOutcome::Finished {
                status,
                stdout,
                stderr,
                ..
            } => {
                let stderr = String::from_utf8_lossy(&stderr).trim().to_string();
                if status.success() {
                    Ok(Some(String::from_utf8_lossy(&stdout).into_owned()))
                } else if no_such_container(&stderr) {
                    Ok(None)
                } else {
                    Err(RuntimeError::Failed {
                        program: self.name(),
                        what,
                        status: status.to_string(),
                        stderr,
                    })
                }
            }
            ChildOutcome::TimedOut { .. } => Err(RuntimeError::TimedOut {
                program: self.name(),
                what,
                after: deadline,
            }),
        }
    }

    /// `inspect ID`; `None` when the container does not exist.
    pub fn inspect(&self, id: &str, deadline: Duration) -> Result<Option<Inspected>, RuntimeError> {
        let Some(json) = self.call("inspect", &["inspect", "--type", "container", id], deadline)?
        else {
            return Ok(None);
        };
        parse_inspect(&json).map_err(|source| RuntimeError::Parse {
            program: self.name(),
            source,
        })
    }

    /// `kill --signal SIGNAL ID`; `false` when the container does not exist.
    pub fn kill(&self, id: &str, signal: &str, deadline: Duration) -> Result<bool, RuntimeError> {
        Ok(self
            .call("kill", &["kill", "--signal", signal, id], deadline)?
            .is_some())
    }

    /// `rm ID`; `false` when it was gone already.
    pub fn remove(&self, id: &str, deadline: Duration) -> Result<bool, RuntimeError> {
        Ok(self.call("rm", &["rm", id], deadline)?.is_some())
    }
}

/// The container once found: shared between the finder (which sets it) and the termination worker (which ends
/// it through the runtime).
#[derive(Debug, Clone, Default)]
pub struct Shared(Arc<Mutex<Option<(RuntimeCli, ContainerRef)>>>);

impl Shared {
    fn set(&self, cli: RuntimeCli, container: ContainerRef) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((cli, container));
    }

    /// The runtime and the container, once found.
    pub fn get(&self) -> Option<(RuntimeCli, ContainerRef)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What the finder tells the loop.
#[derive(Debug, Clone)]
pub enum ContainerEvent {
    /// The container runs: its first process's descendants are the ranks.
    Found(Box<ContainerRef>),
    /// It could not be found; the job is watched through its client alone.
    NotFound(String),
}

/// The id in the client's id file, once it is there: ours (in hangwatch's private node-local directory) is read
/// directly, the user's in a child under a deadline (it may be on any filesystem).
fn read_cidfile(client: &ClientCommand) -> Option<String> {
    let text = if client.added {
        std::fs::read_to_string(&client.cidfile).ok()?
    } else {
        let mut cat = external_command("cat");
        cat.arg("--").arg(&client.cidfile);
        match run_with_deadline(cat, Duration::from_secs(2)).ok()? {
            ChildOutcome::Finished { status, stdout, .. } if status.success() => {
                String::from_utf8_lossy(&stdout).into_owned()
            }
            _ => return None,
        }
    };
    let id = text.trim();
    (!id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric())).then(|| id.to_string())
}

/// Whether the client process (pid, start time) still runs.
fn client_alive(procfs: &ProcFs, pid: i32, start: Option<u64>) -> bool {
    procfs
        .stat(pid)
        .is_ok_and(|s| s.state != 'Z' && start.is_none_or(|t| t == s.starttime))
}

/// Starts the worker that finds the client's container: it waits for the id file, then for the container's first
/// process (`inspect`, under [`RUNTIME_DEADLINE`]), for as long as the client runs; the answer goes to `report`
/// (the loop's `Event::Container`) and to `shared` for the termination.
pub(crate) fn spawn_finder(
    client: ClientCommand,
    client_pid: i32,
    shared: Shared,
    report: impl FnOnce(ContainerEvent) + Send + 'static,
) -> std::io::Result<()> {
    let procfs = ProcFs::new("/proc");
    let start = procfs.stat(client_pid).ok().map(|s| s.starttime);
    std::thread::Builder::new()
        .name("hw-container".into())
        .spawn(move || {
            let event = find(&client, &procfs, client_pid, start, &shared);
            report(event);
        })
        .map(|_| ())
}

fn find(
    client: &ClientCommand,
    procfs: &ProcFs,
    client_pid: i32,
    start: Option<u64>,
    shared: &Shared,
) -> ContainerEvent {
    let cli = RuntimeCli::of(client);
    let mut id = None;
    let mut last_error: Option<String> = None;
    let mut since_error = Instant::now();
    loop {
        let alive = client_alive(procfs, client_pid, start);
        if id.is_none() {
            id = read_cidfile(client);
        }
        if let Some(id) = &id {
            match cli.inspect(id, RUNTIME_DEADLINE) {
                Ok(Some(found)) if found.running && found.pid.is_some() => {
                    let container = ContainerRef {
                        runtime: client.runtime.as_str().to_string(),
                        id: if found.id.is_empty() {
                            id.clone()
                        } else {
                            found.id
                        },
                        name: found.name,
                        image: found.image,
                        host_pid: found.pid,
                        auto_remove: found.auto_remove,
                        ended: None,
                    };
                    shared.set(cli, container.clone());
                    return ContainerEvent::Found(Box::new(container));
                }
                Ok(Some(found)) if !found.running && found.exit_code.is_some() => {
                    return ContainerEvent::NotFound(format!(
                        "container {} exited (code {}) before its processes could be watched",
                        id.get(..12).unwrap_or(id),
                        found.exit_code.unwrap_or_default()
                    ));
                }
                Ok(_) => {}
                Err(e) => {
                    if last_error.is_none() {
                        tracing::warn!(error = %hangwatch_model::error_chain(&e), "cannot inspect the job's container yet");
                    }
                    last_error = Some(hangwatch_model::error_chain(&e));
                    since_error = Instant::now();
                }
            }
        }
        if !alive {
            let why = match (&id, last_error) {
                (None, _) => format!(
                    "the {} client ended before it wrote the container's id to {}",
                    client.runtime.as_str(),
                    client.cidfile.display()
                ),
                (Some(_), Some(error)) => error,
                (Some(id), None) => format!(
                    "container {} never ran while its client did",
                    id.get(..12).unwrap_or(id)
                ),
            };
            return ContainerEvent::NotFound(why);
        }
        // After a failed call, look again less often: a runtime that fails fast must not be asked 5 times a second.
        let pause = if since_error.elapsed() < Duration::from_secs(5) && id.is_some() {
            Duration::from_secs(1)
        } else {
            FIND_EVERY
        };
        std::thread::sleep(pause);
    }
}

/// Ends the container through its runtime after hangwatch's own signals: `kill` with `signal`. Errors are kept as
/// problems, in words.
pub(crate) fn signal_container(
    cli: &RuntimeCli,
    container: &ContainerRef,
    signal: &str,
) -> Option<String> {
    match cli.kill(&container.id, signal, RUNTIME_DEADLINE) {
        Ok(_) => None,
        Err(e) => {
            let words = hangwatch_model::error_chain(&e);
            tracing::warn!(error = %words, id = container.short_id(), signal, "cannot signal the job's container");
            Some(words)
        }
    }
}

/// After the termination: whether the container still runs (its processes unkillable), its exit code, and, where
/// `--rm` was asked and it stopped, removed (`rm`; the client or the runtime may have done so already).
/// `unkillable_left`: processes of the job survived SIGKILL. The container then still runs, whatever the runtime
/// says (podman 4.3 gives up waiting for its exit after `kill` and reports it exited with code -1), and is not
/// removed: `rm` waits for those processes (podman 4.3's did not answer within 10 s of a frozen filesystem); the
/// runtime removes it once they end, where `--rm` was asked.
pub(crate) fn settle(
    cli: &RuntimeCli,
    container: &ContainerRef,
    client_exit_code: Option<i32>,
    mut problems: Vec<String>,
    unkillable_left: bool,
) -> ContainerEnded {
    let mut ended = ContainerEnded {
        client_exit_code,
        ..ContainerEnded::default()
    };
    if unkillable_left {
        ended.still_running = true;
        ended.problems = problems;
        return ended;
    }
    match cli.inspect(&container.id, RUNTIME_DEADLINE) {
        Ok(None) => ended.removed = container.auto_remove,
        Ok(Some(now)) => {
            ended.still_running = now.running;
            ended.exit_code = now.exit_code;
            if !now.running && container.auto_remove {
                match cli.remove(&container.id, RUNTIME_DEADLINE) {
                    Ok(_) => ended.removed = true,
                    Err(e) => problems.push(hangwatch_model::error_chain(&e)),
                }
            }
        }
        Err(e) => problems.push(hangwatch_model::error_chain(&e)),
    }
    ended.problems = problems;
    ended
}

/// The container's ending in words, for the verdict's action and the user.
pub fn ended_words(container: &ContainerRef, ended: &ContainerEnded) -> String {
    let runtime = &container.runtime;
    let mut words = format!("{} ended through {runtime} kill", container.words());
    if ended.still_running {
        words.push_str(
            ": it still runs, its processes stuck in the kernel cannot be killed (they are named above)",
        );
        if container.auto_remove {
            words.push_str(&format!("; {runtime} removes it (--rm) once they end"));
        } else {
            words.push_str(&format!(
                "; remove it with `{runtime} rm {}` once they end",
                container.short_id()
            ));
        }
    } else if ended.removed {
        words.push_str(", removed (--rm)");
    }
    let code = |c: Option<i32>| c.map_or_else(|| "unknown".to_string(), |c| c.to_string());
    words.push_str(&format!(
        "; exit codes: client {}, container {}",
        code(ended.client_exit_code),
        if ended.still_running {
            "none yet".to_string()
        } else {
            code(ended.exit_code)
        }
    ));
    if !ended.problems.is_empty() {
        words.push_str(&format!("; {}", ended.problems.join("; ")));
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &str) -> Vec<OsString> {
        words.split_whitespace().map(OsString::from).collect()
    }

    fn rewritten(words: &str) -> Option<ClientCommand> {
        client_command(&args(words), Path::new("/run/hw/cid"))
    }

    fn text(command: &[OsString]) -> String {
        command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn a_run_gets_our_id_file_right_after_run_and_keeps_the_global_options() {
        let c = rewritten("podman --runtime runc run --rm -v /a:/data img python train.py --rm")
            .unwrap();
        assert_eq!(c.runtime, Runtime::Podman);
        assert_eq!(text(&c.global), "--runtime runc");
        assert!(c.added);
        assert_eq!(
            text(&c.command),
            "podman --runtime runc run --cidfile=/run/hw/cid --rm -v /a:/data img python train.py --rm"
        );
        let d =
            rewritten("/usr/local/bin/docker -H unix:///run/d.sock container run -it img").unwrap();
        assert_eq!(d.runtime, Runtime::Docker);
        assert_eq!(text(&d.global), "-H unix:///run/d.sock");
        assert_eq!(
            text(&d.command),
            "/usr/local/bin/docker -H unix:///run/d.sock container run --cidfile=/run/hw/cid -it img"
        );
        let n = rewritten("nerdctl --namespace=k8s.io run img").unwrap();
        assert_eq!(n.runtime, Runtime::Nerdctl);
        assert_eq!(text(&n.global), "--namespace=k8s.io");
    }

    #[test]
    fn the_users_own_id_file_is_read_and_nothing_is_added() {
        let c = rewritten("docker run --name x --cidfile /tmp/c.id img sh").unwrap();
        assert!(!c.added);
        assert_eq!(c.cidfile, PathBuf::from("/tmp/c.id"));
        assert_eq!(
            text(&c.command),
            "docker run --name x --cidfile /tmp/c.id img sh"
        );
        let eq = rewritten("docker run --cidfile=/tmp/d.id img").unwrap();
        assert_eq!(eq.cidfile, PathBuf::from("/tmp/d.id"));
        // The container's own command may say --cidfile: it is not the client's.
        let inner = rewritten("docker run -e X=1 img prog --cidfile /x").unwrap();
        assert!(inner.added);
    }

    #[test]
    fn other_commands_are_not_container_clients() {
        for words in [
            "python train.py",
            "podman exec ctr python",
            "podman ps",
            "docker build .",
            "podman --runtime",
            "torchrun --nproc-per-node 4 run",
            "apptainer run img.sif",
        ] {
            assert_eq!(rewritten(words), None, "{words}");
        }
    }

    #[test]
    fn inspect_is_read_for_docker_and_podman_alike() {
        let podman = r#"[{"Id":"38ade5ba25ba0000","Name":"flamboyant_mclaren","ImageName":"localhost/hw-test:1",
            "Image":"acd98","Config":{"Image":"localhost/hw-test:1"},"State":{"Status":"running","Running":true,
            "Pid":14329,"ExitCode":0},"HostConfig":{"AutoRemove":true}}]"#;
        let p = parse_inspect(podman).unwrap().unwrap();
        assert_eq!(p.pid, Some(14329));
        assert!(p.running && p.auto_remove);
        assert_eq!(p.exit_code, None, "a running container has no exit code");
        assert_eq!(p.image.as_deref(), Some("localhost/hw-test:1"));
        let docker = r#"[{"Id":"abc","Name":"/trainer","Image":"sha256:1","Config":{"Image":"train:3"},
            "State":{"Running":false,"Pid":0,"ExitCode":137},"HostConfig":{"AutoRemove":false}}]"#;
        let d = parse_inspect(docker).unwrap().unwrap();
        assert_eq!(d.name.as_deref(), Some("trainer"));
        assert_eq!(d.image.as_deref(), Some("train:3"));
        assert_eq!((d.pid, d.running, d.exit_code), (None, false, Some(137)));
        assert_eq!(parse_inspect("[]").unwrap(), None);
        assert!(parse_inspect("Error").is_err());
    }

    #[test]
    fn the_ending_says_what_is_left_and_both_exit_codes() {
        let c = ContainerRef {
            runtime: "podman".into(),
            id: "38ade5ba25bacd3c".into(),
            image: Some("localhost/hw-test:1".into()),
            auto_remove: true,
            ..ContainerRef::default()
        };
        let stuck = ended_words(
            &c,
            &ContainerEnded {
                still_running: true,
                client_exit_code: Some(137),
                ..ContainerEnded::default()
            },
        );
        assert!(stuck.contains("it still runs"), "{stuck}");
        assert!(
            stuck.contains("podman removes it (--rm) once they end"),
            "{stuck}"
        );
        assert!(stuck.contains("client 137, container none yet"), "{stuck}");
        let done = ended_words(
            &c,
            &ContainerEnded {
                exit_code: Some(137),
                client_exit_code: Some(137),
                removed: true,
                ..ContainerEnded::default()
            },
        );
        assert!(
            done.contains("removed (--rm)") && done.contains("container 137"),
            "{done}"
        );
    }

    #[test]
    fn a_missing_container_is_told_from_a_failure() {
        assert!(no_such_container("Error: no such container abc"));
        assert!(no_such_container("Error: No such object: abc"));
        assert!(!no_such_container("Cannot connect to the Docker daemon"));
    }
}
