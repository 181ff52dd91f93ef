//! Starting the job: N local ranks with torchrun's environment, or one command whose Python descendants are the
//! ranks. Each process starts in its own process group so that hangwatch (not the terminal) decides who gets
//! which signal, and every output stream is a pipe that hangwatch always drains.

use std::ffi::OsString;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};

/// What to start.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The command and its arguments.
    pub command: Vec<OsString>,
    /// `Some(n)`: start n ranks; `None`: start the command once and find its ranks.
    pub nproc: Option<u32>,
    /// `HANGWATCH_SOCKET` for the ranks.
    pub socket: Option<std::path::PathBuf>,
    /// `HANGWATCH_BEATS` for the ranks: the shared-memory beat slots (crate::beats).
    pub beats: Option<std::path::PathBuf>,
    /// Multi-node placement (torchrun's names); single node: 1 node, rank 0.
    pub nnodes: u32,
    pub node_rank: u32,
    pub master_addr: String,
    pub master_port: Option<u16>,
    /// More environment for the job (a restarted attempt's `HANGWATCH_ATTEMPT` and friends).
    pub env: Vec<(String, String)>,
    /// Processes already running to watch instead of starting `command` (`run --attach`, a node service): the
    /// job is theirs and their descendants'; hangwatch owns none of their output, and leaves them alone when it
    /// is stopped or killed.
    pub attach: Vec<i32>,
    /// hangwatch's bootstrap directory, put first on the ranks' `PYTHONPATH` ([`crate::instrument`]); `None`:
    /// the ranks' environment is left as it is (`--no-instrument`).
    pub python_bootstrap: Option<std::path::PathBuf>,
    /// Where to bind the heartbeat socket for a job already running (`attach`) whose ranks were told where
    /// beforehand (a node service's TaskProlog exports it as `HANGWATCH_SOCKET`); the socket is handed to the
    /// owner of the first attached process. `None`: a private directory of hangwatch's own.
    pub beat_socket: Option<std::path::PathBuf>,
}

/// One started process.
#[derive(Debug)]
pub struct Launched {
    pub child: Child,
    pub pid: i32,
    /// Global rank (`--nproc` mode), `None` for a launcher command.
    pub rank: Option<u32>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
}

/// Why the job could not start.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("no command to run: put it after `--`, e.g. `hangwatch run -- python train.py`")]
    NoCommand,
    #[error("could not start `{program}`")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not find a free port for MASTER_PORT")]
    Port(#[source] std::io::Error),
}

fn free_port() -> Result<u16, LaunchError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(LaunchError::Port)?;
    Ok(listener.local_addr().map_err(LaunchError::Port)?.port())
}

/// The torchrun environment of one rank.
pub fn rank_env(
    spec: &LaunchSpec,
    local_rank: u32,
    nproc: u32,
    master_port: u16,
) -> Vec<(String, String)> {
    let world = spec.nnodes * nproc;
    let rank = spec.node_rank * nproc + local_rank;
    vec![
        ("RANK".into(), rank.to_string()),
        ("LOCAL_RANK".into(), local_rank.to_string()),
        ("WORLD_SIZE".into(), world.to_string()),
        ("LOCAL_WORLD_SIZE".into(), nproc.to_string()),
        ("GROUP_RANK".into(), spec.node_rank.to_string()),
        ("NODE_RANK".into(), spec.node_rank.to_string()),
        ("MASTER_ADDR".into(), spec.master_addr.clone()),
        ("MASTER_PORT".into(), master_port.to_string()),
    ]
}

/// The variable that sizes PyTorch's Flight Recorder, and the size `run` gives it where the job did not: the last
/// 256 collectives of each rank. The analysis reads the last few of each group; a rank dumps and trims 256 entries in
/// about 3 ms at a roll call, 2,000 in about 25 ms (docs/inside-evidence.md).
pub const FLIGHT_RECORDER_BUFFER: &str = "TORCH_FR_BUFFER_SIZE";
const FLIGHT_RECORDER_ENTRIES: &str = "256";

/// Whether the job sized the recorder itself (either name PyTorch reads), in `run`'s settings or its environment.
fn flight_recorder_set(env: &[(String, String)]) -> bool {
    [FLIGHT_RECORDER_BUFFER, "TORCH_NCCL_TRACE_BUFFER_SIZE"]
        .iter()
        .any(|name| env.iter().any(|(k, _)| k == name) || std::env::var_os(name).is_some())
}

fn base_command(spec: &LaunchSpec) -> Result<Command, LaunchError> {
    let program = spec.command.first().ok_or(LaunchError::NoCommand)?;
    let mut cmd = Command::new(program);
    cmd.args(&spec.command[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    crate::sys::die_with_parent(&mut cmd);
    if let Some(socket) = &spec.socket {
        cmd.env("HANGWATCH_SOCKET", socket);
    }
    if let Some(beats) = &spec.beats {
        cmd.env("HANGWATCH_BEATS", beats);
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    if let Some(dir) = &spec.python_bootstrap {
        let existing = spec
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "PYTHONPATH")
            .map(|(_, v)| std::ffi::OsString::from(v))
            .or_else(|| std::env::var_os("PYTHONPATH"));
        cmd.env(
            "PYTHONPATH",
            crate::instrument::python_path_with(dir, existing.as_deref()),
        );
    }
    // The Flight Recorder, which the roll call asks the ranks for (crate::collectives), records only with a buffer;
    // a job that set one (or turned it off with 0) keeps its own.
    if spec.python_bootstrap.is_some() && !flight_recorder_set(&spec.env) {
        cmd.env(FLIGHT_RECORDER_BUFFER, FLIGHT_RECORDER_ENTRIES);
    }
    // Python buffers a pipe's output in 8 KiB blocks: lines would arrive late and in bursts, which hides progress
    // and loses the last lines of a rank that is killed.
    if std::env::var_os("PYTHONUNBUFFERED").is_none() {
        cmd.env("PYTHONUNBUFFERED", "1");
    }
    Ok(cmd)
}

fn spawn(mut cmd: Command, rank: Option<u32>, program: &OsString) -> Result<Launched, LaunchError> {
    let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        program: program.to_string_lossy().into_owned(),
        source,
    })?;
    let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
    if let Some(out) = &child.stdout {
        enlarge_pipe(out);
    }
    if let Some(err) = &child.stderr {
        enlarge_pipe(err);
    }
    Ok(Launched {
        stdout: child.stdout.take(),
        stderr: child.stderr.take(),
        child,
        pid,
        rank,
    })
}

/// A rank's output pipe holds 1 MiB instead of 64 KiB, so that a burst of output (a traceback from every rank, a
/// logging storm) never makes a rank wait for hangwatch's drain thread to be scheduled.
fn enlarge_pipe(pipe: &impl std::os::fd::AsFd) {
    let _ = nix::fcntl::fcntl(
        pipe.as_fd().as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20),
    );
}

/// Starts the job. On a failure part-way, the processes already started are killed (by process group).
pub fn launch(spec: &LaunchSpec) -> Result<Vec<Launched>, LaunchError> {
    let program = spec.command.first().ok_or(LaunchError::NoCommand)?.clone();
    let Some(nproc) = spec.nproc else {
        return Ok(vec![spawn(base_command(spec)?, None, &program)?]);
    };
    let master_port = match spec.master_port {
        Some(p) => p,
        None => free_port()?,
    };
    let mut started: Vec<Launched> = Vec::new();
    for local_rank in 0..nproc {
        let mut cmd = base_command(spec)?;
        cmd.envs(rank_env(spec, local_rank, nproc, master_port));
        match spawn(cmd, Some(spec.node_rank * nproc + local_rank), &program) {
            Ok(l) => started.push(l),
            Err(e) => {
                let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
                for l in &mut started {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(l.pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    // Reap what dies at once; a rank stuck in D (its binary on a frozen mount) is not waited for.
                    hangwatch_child::reap_within(
                        &mut l.child,
                        until.saturating_duration_since(std::time::Instant::now()),
                        std::time::Duration::from_millis(10),
                    );
                }
                return Err(e);
            }
        }
    }
    Ok(started)
}

/// Whether `program` can be found and run by this user, for a clear error before anything starts.
pub fn check_program(program: &OsString) -> Result<(), String> {
    let p = Path::new(program);
    let runnable = |path: &Path| {
        nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).map_err(|e| match e {
            nix::errno::Errno::EACCES => format!(
                "`{}` is not executable by this user (chmod +x it, or check the permissions of the directories above it)",
                path.display()
            ),
            other => format!("`{}` cannot be run: {}", path.display(), other.desc()),
        })
    };
    if p.components().count() > 1 {
        return match std::fs::metadata(p) {
            Ok(m) if m.is_file() => runnable(p),
            Ok(_) => Err(format!("`{}` is not a file", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(format!(
                "`{}` cannot be reached by this user: a directory on the way to it, or to what its links point to, \
                 is not searchable (a virtual environment made from a Python under another user's home shows this)",
                p.display()
            )),
            Err(_) => Err(format!("`{}` does not exist", p.display())),
        };
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(p))
            .find(|candidate| candidate.is_file())
    });
    match found {
        Some(path) => runnable(&path),
        None => Err(format!("`{}` is not on PATH", p.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(nnodes: u32, node_rank: u32) -> LaunchSpec {
        LaunchSpec {
            command: vec!["python3".into()],
            nproc: Some(4),
            socket: None,
            beats: None,
            nnodes,
            node_rank,
            master_addr: "10.0.0.1".into(),
            master_port: None,
            env: Vec::new(),
            attach: Vec::new(),
            python_bootstrap: None,
            beat_socket: None,
        }
    }

    #[test]
    fn global_rank_is_node_rank_times_nproc_plus_local_rank() {
        let env = rank_env(&spec(2, 1), 3, 4, 29500);
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("RANK"), Some("7"));
        assert_eq!(get("LOCAL_RANK"), Some("3"));
        assert_eq!(get("WORLD_SIZE"), Some("8"));
        assert_eq!(get("LOCAL_WORLD_SIZE"), Some("4"));
        assert_eq!(get("MASTER_ADDR"), Some("10.0.0.1"));
        assert_eq!(get("MASTER_PORT"), Some("29500"));
    }

    #[test]
    fn missing_programs_are_named() {
        assert!(check_program(&"sh".into()).is_ok());
        assert!(check_program(&"no-such-program-hw".into())
            .unwrap_err()
            .contains("not on PATH"));
        assert!(check_program(&"/no/such/file".into())
            .unwrap_err()
            .contains("does not exist"));
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("train.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        assert!(
            check_program(&script.clone().into_os_string())
                .unwrap_err()
                .contains("not executable"),
            "a file without the x bit is named before anything starts"
        );
    }
}
