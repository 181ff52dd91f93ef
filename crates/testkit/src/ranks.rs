//! A group of Python rank processes (`tests/python/rank.py`) that step in lockstep through a TCP barrier, with
//! one rank optionally misbehaving; every rank is killed by pid and reaped when the group drops.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::cmd::{send, ChildGuard};
use crate::error::{Result, TestkitError};
use crate::procinfo::process_state;
use crate::{free_tcp_port, wait_until};

/// What one rank does besides stepping normally.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Behaviour {
    /// Step and wait in `barrier` like everyone else.
    #[default]
    Barrier,
    /// Same as `Barrier`: the test stops this rank itself ([`RankGroup::sigstop`]).
    Sigstop,
    /// Compute forever (state R) after `after_steps` steps, while peers wait in `barrier`.
    Spin { after_steps: u64 },
    /// Deadlock on a threading lock (in `load_batch`) after `after_steps` steps.
    Lock { after_steps: u64 },
    /// Exit with code 3 after `after_steps` steps; peers keep waiting in `barrier`.
    Exit { after_steps: u64 },
    /// Map `file` (put it on the mount the test will freeze) `MAP_SHARED` and touch it; when triggered (SIGUSR1,
    /// or `trigger_file` appearing) write to the page from one thread and munmap it 0.5 s later from another.
    /// The rank prints `mmap ready` once mapped, then `mmap writing` and `mmap unmapping`.
    MmapStall {
        file: PathBuf,
        trigger_file: Option<PathBuf>,
    },
}

/// Per-rank options.
#[derive(Debug, Clone, Default)]
pub struct RankOptions {
    /// Appended to every step (the file is kept open, so a frozen mount blocks the rank in `write()`).
    pub log: Option<PathBuf>,
    pub behaviour: Behaviour,
}

/// How to start a [`RankGroup`]; from [`RankGroup::builder`].
#[derive(Debug, Clone)]
pub struct RankGroupBuilder {
    world_size: u32,
    steps: Option<u64>,
    step_time: Duration,
    ranks: BTreeMap<u32, RankOptions>,
    env: Vec<(String, String)>,
}

impl RankGroupBuilder {
    /// Stop after `steps` steps (default: step until killed).
    pub fn steps(mut self, steps: u64) -> Self {
        self.steps = Some(steps);
        self
    }

    /// Computation per step (default 10 ms).
    pub fn step_time(mut self, step_time: Duration) -> Self {
        self.step_time = step_time;
        self
    }

    /// Rank `rank` appends a line to `path` every step.
    pub fn log(mut self, rank: u32, path: impl Into<PathBuf>) -> Self {
        self.ranks.entry(rank).or_default().log = Some(path.into());
        self
    }

    /// Rank `rank` misbehaves as `behaviour` says.
    pub fn behaviour(mut self, rank: u32, behaviour: Behaviour) -> Self {
        self.ranks.entry(rank).or_default().behaviour = behaviour;
        self
    }

    /// An extra environment variable for every rank (e.g. `HANGWATCH_SOCKET`).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Starts the ranks. They are running (not necessarily stepping yet) when this returns; use
    /// [`RankGroup::wait_for_step`].
    pub fn spawn(self) -> Result<RankGroup> {
        if let Some(&rank) = self.ranks.keys().find(|&&r| r >= self.world_size) {
            return Err(TestkitError::Misuse(format!(
                "options for rank {rank} in a group of {}",
                self.world_size
            )));
        }
        let python = python()?;
        let script = rank_script();
        let port = free_tcp_port().map_err(TestkitError::io("could not find a free TCP port"))?;
        let mut group = RankGroup {
            ranks: Vec::with_capacity(self.world_size as usize),
            master_port: port,
        };
        for rank in 0..self.world_size {
            let options = self.ranks.get(&rank).cloned().unwrap_or_default();
            let mut cmd = Command::new(python);
            cmd.arg(&script)
                .arg("--step-time")
                .arg(format!("{:.3}", self.step_time.as_secs_f64()))
                .arg("--steps")
                .arg(self.steps.unwrap_or(0).to_string())
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", self.world_size.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("PYTHONUNBUFFERED", "1")
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(log) = &options.log {
                cmd.arg("--log").arg(log);
            }
            behaviour_args(&mut cmd, &options.behaviour);
            let mut guard = ChildGuard::spawn(&mut cmd, format!("rank {rank}"))?;
            let stdout = Arc::new(Mutex::new(Vec::new()));
            let stderr = Arc::new(Mutex::new(String::new()));
            collect_lines(guard.child_mut().stdout.take(), Arc::clone(&stdout));
            collect_text(guard.child_mut().stderr.take(), Arc::clone(&stderr));
            group.ranks.push(Rank {
                guard,
                stdout,
                stderr,
            });
        }
        Ok(group)
    }
}

fn behaviour_args(cmd: &mut Command, behaviour: &Behaviour) {
    let (name, after) = match behaviour {
        Behaviour::Barrier => ("barrier", None),
        Behaviour::Sigstop => ("sigstop", None),
        Behaviour::Spin { after_steps } => ("spin", Some(after_steps)),
        Behaviour::Lock { after_steps } => ("lock", Some(after_steps)),
        Behaviour::Exit { after_steps } => ("exit", Some(after_steps)),
        Behaviour::MmapStall { file, trigger_file } => {
            cmd.arg("--mmap-file").arg(file);
            if let Some(trigger) = trigger_file {
                cmd.arg("--trigger-file").arg(trigger);
            }
            ("mmap_stall", None)
        }
    };
    cmd.arg("--behaviour").arg(name);
    if let Some(after) = after {
        cmd.arg("--after").arg(after.to_string());
    }
}

#[derive(Debug)]
struct Rank {
    guard: ChildGuard,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
}

/// Running rank processes. Dropping the group sends SIGKILL to every rank by pid and reaps them, waiting at most
/// a few seconds in all (a rank in D state dies only after the thaw: drop the freeze guard first, see
/// [`crate::LoopExt4`]).
#[derive(Debug)]
pub struct RankGroup {
    ranks: Vec<Rank>,
    master_port: u16,
}

/// `RankGroup::builder(world_size).spawn()`: `world_size` well-behaved ranks stepping until killed.
pub fn spawn_ranks(world_size: u32) -> Result<RankGroup> {
    RankGroup::builder(world_size).spawn()
}

impl RankGroup {
    /// How long `Drop` waits, in all, for killed ranks to be reaped.
    pub const REAP_TIMEOUT: Duration = Duration::from_secs(5);

    /// Starts describing a group of `world_size` ranks.
    pub fn builder(world_size: u32) -> RankGroupBuilder {
        RankGroupBuilder {
            world_size,
            steps: None,
            step_time: Duration::from_millis(10),
            ranks: BTreeMap::new(),
            env: Vec::new(),
        }
    }

    pub fn world_size(&self) -> u32 {
        self.ranks.len() as u32
    }

    /// The port rank 0 serves the barrier on (`MASTER_PORT`).
    pub fn master_port(&self) -> u16 {
        self.master_port
    }

    /// Pid of `rank` (panics on a rank outside the group: a bug in the test).
    pub fn pid(&self, rank: u32) -> u32 {
        self.ranks[rank as usize].guard.pid()
    }

    /// Pids in rank order.
    pub fn pids(&self) -> Vec<u32> {
        self.ranks.iter().map(|r| r.guard.pid()).collect()
    }

    /// Lines `rank` printed on stdout so far.
    pub fn stdout(&self, rank: u32) -> Vec<String> {
        lock(&self.ranks[rank as usize].stdout).clone()
    }

    /// What `rank` printed on stderr so far (a Python traceback when it crashed).
    pub fn stderr(&self, rank: u32) -> String {
        lock(&self.ranks[rank as usize].stderr).clone()
    }

    /// Whether `rank` printed exactly `line`.
    pub fn printed(&self, rank: u32, line: &str) -> bool {
        lock(&self.ranks[rank as usize].stdout)
            .iter()
            .any(|l| l == line)
    }

    /// The last step `rank` completed (printed `step N` for), if any.
    pub fn last_step(&self, rank: u32) -> Option<u64> {
        lock(&self.ranks[rank as usize].stdout)
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("step ")?.parse().ok())
    }

    /// Waits until `rank` prints `line`; the error quotes its stderr.
    pub fn wait_for_line(&self, rank: u32, line: &str, timeout: Duration) -> Result<()> {
        if wait_until(timeout, Duration::from_millis(10), || {
            self.printed(rank, line)
        }) {
            Ok(())
        } else {
            Err(self.timeout_error(rank, format!("rank {rank} to print {line:?}"), timeout))
        }
    }

    /// Waits until `rank` has completed `step`.
    pub fn wait_for_step(&self, rank: u32, step: u64, timeout: Duration) -> Result<()> {
        if wait_until(timeout, Duration::from_millis(10), || {
            self.last_step(rank).is_some_and(|s| s >= step)
        }) {
            Ok(())
        } else {
            Err(self.timeout_error(rank, format!("rank {rank} to reach step {step}"), timeout))
        }
    }

    /// Waits until every rank has completed `step`.
    pub fn wait_all_for_step(&self, step: u64, timeout: Duration) -> Result<()> {
        let end = Instant::now() + timeout;
        for rank in 0..self.world_size() {
            self.wait_for_step(rank, step, end.saturating_duration_since(Instant::now()))?;
        }
        Ok(())
    }

    /// Exit status of `rank` if it has exited (reaps it).
    pub fn try_wait(&mut self, rank: u32) -> Option<ExitStatus> {
        self.ranks[rank as usize].guard.try_wait()
    }

    /// Sends `signal` to `rank` by pid.
    pub fn signal(&mut self, rank: u32, signal: Signal) -> Result<()> {
        self.ranks[rank as usize].guard.signal(signal)
    }

    /// Stops `rank` (SIGSTOP) and waits until it shows state T. SIGCONT it with [`RankGroup::signal`]; the
    /// group's drop kills it either way.
    pub fn sigstop(&mut self, rank: u32) -> Result<()> {
        self.signal(rank, Signal::SIGSTOP)?;
        let pid = self.pid(rank);
        if wait_until(Duration::from_secs(5), Duration::from_millis(5), || {
            process_state(pid) == Some('T')
        }) {
            Ok(())
        } else {
            Err(TestkitError::Timeout {
                what: format!("rank {rank} (pid {pid}) to stop"),
                after: Duration::from_secs(5),
            })
        }
    }

    /// Kills every rank now and reaps them within [`RankGroup::REAP_TIMEOUT`]; returns the pids still there.
    pub fn kill_all(&mut self) -> Vec<u32> {
        for rank in &self.ranks {
            let _ = send(rank.guard.pid(), Signal::SIGCONT);
            let _ = send(rank.guard.pid(), Signal::SIGKILL);
        }
        let end = Instant::now() + Self::REAP_TIMEOUT;
        let mut left = Vec::new();
        for rank in &mut self.ranks {
            if !rank
                .guard
                .kill_and_reap(end.saturating_duration_since(Instant::now()))
            {
                left.push(rank.guard.pid());
            }
        }
        left
    }

    fn timeout_error(&self, rank: u32, what: String, after: Duration) -> TestkitError {
        let stderr = self.stderr(rank);
        let what = if stderr.trim().is_empty() {
            what
        } else {
            format!("{what} (its stderr: {})", stderr.trim())
        };
        TestkitError::Timeout { what, after }
    }
}

impl Drop for RankGroup {
    fn drop(&mut self) {
        let left = self.kill_all();
        if !left.is_empty() {
            eprintln!(
                "testkit: ranks with pids {left:?} did not die within {:?} of SIGKILL (D state? thaw first); leaving them",
                Self::REAP_TIMEOUT
            );
        }
    }
}

/// `tests/python/rank.py` in this workspace.
pub fn rank_script() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/rank.py");
    path.canonicalize().unwrap_or(path)
}

/// The Python interpreter for ranks: `HANGWATCH_TEST_PYTHON`, else the real executable behind `python3` (resolved
/// once, so that a pyenv shim does not sit between the test and the rank's pid).
pub fn python() -> Result<&'static Path> {
    static PYTHON: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    let found = PYTHON.get_or_init(|| {
        if let Some(p) = std::env::var_os("HANGWATCH_TEST_PYTHON") {
            return Ok(PathBuf::from(p));
        }
        let output = crate::cmd::run_tool(
            "python3",
            &["-c", "import sys; print(sys.executable)"],
            Duration::from_secs(30),
        )
        .map_err(|e| e.to_string())?;
        let path = output.stdout.trim();
        if path.is_empty() {
            Err("python3 did not say where its executable is".into())
        } else {
            Ok(PathBuf::from(path))
        }
    });
    match found {
        Ok(p) => Ok(p),
        Err(e) => Err(TestkitError::Missing {
            tool: format!("python3 ({e})"),
            hint: "install Python 3 or set HANGWATCH_TEST_PYTHON",
        }),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn collect_lines<R: Read + Send + 'static>(pipe: Option<R>, into: Arc<Mutex<Vec<String>>>) {
    let Some(pipe) = pipe else { return };
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            match line {
                Ok(line) => lock(&into).push(line),
                Err(_) => break,
            }
        }
    });
}

fn collect_text<R: Read + Send + 'static>(pipe: Option<R>, into: Arc<Mutex<String>>) {
    let Some(mut pipe) = pipe else { return };
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => lock(&into).push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
    });
}

/// A group whose rank `rank` maps a file on a mount the test will freeze (`Behaviour::MmapStall`), ready: it
/// printed `mmap ready`. [`MmapStallGroup::lock`] then locks that rank's memory map behind the frozen mount.
pub struct MmapStallGroup {
    pub ranks: RankGroup,
    rank: u32,
    trigger_file: PathBuf,
    /// Holds the trigger file's directory (removed on drop).
    _trigger_dir: tempfile::TempDir,
}

impl MmapStallGroup {
    /// `world_size` ranks, `rank` mapping `mapped` (put it on the mount to freeze).
    pub fn spawn(world_size: u32, rank: u32, mapped: &Path) -> Result<Self> {
        let trigger_dir =
            tempfile::tempdir().map_err(TestkitError::io("a directory for the trigger file"))?;
        let trigger_file = trigger_dir.path().join("go");
        let ranks = RankGroup::builder(world_size)
            .behaviour(
                rank,
                Behaviour::MmapStall {
                    file: mapped.to_path_buf(),
                    trigger_file: Some(trigger_file.clone()),
                },
            )
            .spawn()?;
        ranks.wait_for_line(rank, "mmap ready", Duration::from_secs(60))?;
        Ok(Self {
            ranks,
            rank,
            trigger_file,
            _trigger_dir: trigger_dir,
        })
    }

    /// Starts the stall (freeze the mount first): one thread of the rank blocks writing to the mapped page, and
    /// the munmap of another waits behind it holding the memory-map lock. Returns once the munmap is under way.
    pub fn lock(&self) -> Result<()> {
        std::fs::write(&self.trigger_file, b"go")
            .map_err(TestkitError::io("writing the trigger file"))?;
        self.ranks
            .wait_for_line(self.rank, "mmap unmapping", Duration::from_secs(20))?;
        // The munmap takes the lock right after saying so.
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    }
}

/// Where `scripts/test` installs torch when it is missing: a virtual environment of its own (the wheel with its
/// libraries is several GB, so it is kept out of the system's Python).
pub const TORCH_VENV: &str = "/var/cache/hangwatch-torch";

/// A Python interpreter that can `import torch` (and numpy): `HANGWATCH_TORCH_PYTHON`, else the one in
/// [`TORCH_VENV`], else `python3` when it has torch. Missing torch is a skip (a failure in strict mode, as CI
/// runs).
pub fn torch_python() -> Result<&'static Path> {
    static TORCH: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    let found = TORCH.get_or_init(|| {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("HANGWATCH_TORCH_PYTHON") {
            candidates.push(PathBuf::from(p));
        }
        candidates.push(Path::new(TORCH_VENV).join("bin/python"));
        if let Ok(p) = python() {
            candidates.push(p.to_path_buf());
        }
        let mut tried = Vec::new();
        for candidate in candidates {
            let Some(program) = candidate.to_str() else {
                continue;
            };
            match crate::cmd::run_tool(
                program,
                &["-c", "import torch, torch.distributed"],
                Duration::from_secs(120),
            ) {
                Ok(_) => return Ok(candidate),
                Err(e) => tried.push(format!("{program}: {e}")),
            }
        }
        Err(tried.join("; "))
    });
    match found {
        Ok(p) => Ok(p),
        Err(e) => Err(TestkitError::Missing {
            tool: format!("a Python with torch ({e})"),
            hint: "run ./scripts/test (it installs torch into /var/cache/hangwatch-torch) or set HANGWATCH_TORCH_PYTHON",
        }),
    }
}
