//! A real Slurm cluster for a test (tests/slurm/start-slurm.sh: slurmctld and one slurmd per emulated node on this
//! machine), with its own directory and ports, stopped on drop, also when the test fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use hangwatch_testkit::require_root;

/// A Slurm cluster of its own: its directory, config and ports; stopped on drop.
pub struct SlurmCluster {
    pub dir: PathBuf,
    pub conf: PathBuf,
}

impl SlurmCluster {
    /// A cluster whose nodes have `gpus` GPUs each (GRES backed by plain files: jobs can ask for `--gpus*`).
    pub fn start_with_gpus(nodes: u32, gpus: u32) -> Result<SlurmCluster, String> {
        require_root()?;
        stop_abandoned_clusters();
        let dir = std::env::temp_dir().join(format!("hangwatch-slurm-test-{}", std::process::id()));
        let cluster = SlurmCluster {
            conf: dir.join("etc/slurm.conf"),
            dir,
        };
        let out = Command::new("bash")
            .arg(scripts().join("start-slurm.sh"))
            .env("SLURM_NODES", nodes.to_string())
            .env("SLURM_GPUS", gpus.to_string())
            .env("SLURM_DIR", &cluster.dir)
            // Away from the default ports, where a developer's own cluster may run.
            .env("SLURM_PORT_BASE", "17817")
            .output()
            .map_err(|e| format!("cannot run start-slurm.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "start-slurm.sh failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(cluster)
    }

    /// A cluster of `nodes`, or `None` (the test is skipped, said on stderr) where Slurm cannot run and the
    /// test kit is not strict.
    pub fn start_or_skip(nodes: u32) -> Option<SlurmCluster> {
        SlurmCluster::start_or_skip_with_gpus(nodes, 0)
    }

    pub fn start_or_skip_with_gpus(nodes: u32, gpus: u32) -> Option<SlurmCluster> {
        match SlurmCluster::start_with_gpus(nodes, gpus) {
            Ok(c) => Some(c),
            Err(why) if !hangwatch_testkit::strict_mode() => {
                eprintln!("SKIPPED: no Slurm here: {why}");
                None
            }
            Err(why) => panic!("{why}"),
        }
    }

    /// Submits `script` (written to `out/job.sh`) with `options`, its output to `out/batch.out`; the job id.
    pub fn submit(&self, out: &Path, script: &str, options: &[&str]) -> String {
        self.sbatch(self.command("sbatch"), "root", out, script, options)
    }

    /// Submits `script` as user `user` (a real unprivileged user: `runuser`, as that user would from a login
    /// node); `out` must be theirs to write.
    pub fn submit_as(&self, user: &str, out: &Path, script: &str, options: &[&str]) -> String {
        let mut sbatch = Command::new("runuser");
        sbatch
            .args(["-u", user, "--", "env"])
            .arg(format!("SLURM_CONF={}", self.conf.display()))
            .arg("sbatch");
        self.sbatch(sbatch, user, out, script, options)
    }

    fn sbatch(
        &self,
        mut sbatch: Command,
        user: &str,
        out: &Path,
        script: &str,
        options: &[&str],
    ) -> String {
        let path = out.join("job.sh");
        std::fs::write(&path, script).expect("job script");
        let submitted = sbatch
            .arg("--parsable")
            .args(options)
            .arg("-o")
            .arg(out.join("batch.out"))
            .arg(&path)
            .output()
            .expect("sbatch runs");
        assert!(
            submitted.status.success(),
            "sbatch as {user}: {}",
            String::from_utf8_lossy(&submitted.stderr)
        );
        String::from_utf8_lossy(&submitted.stdout)
            .trim()
            .to_string()
    }

    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", &self.conf);
        cmd
    }

    /// `scontrol show job ID -o`, one line of KEY=VALUE.
    pub fn job(&self, id: &str) -> String {
        self.command("scontrol")
            .args(["show", "job", id, "-o"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    pub fn field(line: &str, key: &str) -> Option<String> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(scripts().join("stop-slurm.sh"))
            .env("SLURM_DIR", &self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/slurm")
}

/// The name of the user with `uid`, made (no home, no login) when the machine has none: the tests that act as
/// other users need real ones, and CI's machine may have only root.
pub fn user_with_uid(uid: u32) -> String {
    let known = Command::new("getent")
        .args(["passwd", &uid.to_string()])
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split(':')
                .next()
                .map(str::to_string)
        })
        .filter(|n| !n.trim().is_empty());
    if let Some(name) = known {
        return name.trim().to_string();
    }
    let name = format!("hwtest{uid}");
    let made = Command::new("useradd")
        .args(["--no-create-home", "--shell", "/bin/bash", "--uid"])
        .arg(uid.to_string())
        .arg(&name)
        .output()
        .expect("useradd runs");
    // Another test may have made it meanwhile.
    assert!(
        made.status.success() || String::from_utf8_lossy(&made.stderr).contains("already"),
        "useradd {name}: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    name
}

/// Stops the clusters of test processes that are gone: a test killed at its timeout never runs its `Drop`, and
/// its daemons would hold the ports every later cluster uses.
fn stop_abandoned_clusters() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("hangwatch-slurm-test-")
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = Command::new("bash")
            .arg(scripts().join("stop-slurm.sh"))
            .env("SLURM_DIR", entry.path())
            .output();
        let _ = std::fs::remove_dir_all(entry.path());
    }
}
