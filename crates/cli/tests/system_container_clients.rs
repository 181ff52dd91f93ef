//! System tests of a job started through a container client (docs/containers.md, "Docker, Podman, nerdctl"):
//! `hangwatch run -- podman run ...` with real podman and runc, and `docker -H <socket> run ...` with a dockerd the
//! test starts (Debian's docker.io), an image built by the test with no registry (a
//! root filesystem of directories and links, the node's `/usr` bound read-only into it), 4 plain Python ranks in the
//! container, rank 0 logging onto a really frozen loop-mounted ext4 bound at `/data`. The ranks are the
//! container's processes (children of podman's conmon, never of the client): hangwatch must find them through the
//! container the client started, name rank 0 with both pids, end the container through podman and say that rank 0
//! cannot be killed while the filesystem is frozen; after the thaw the container is gone (`--rm`).
//!
//! Everything the test makes is removed by guards, also when it fails: the thaw first, then the container (by the
//! name the test gave it), then the image (by its tag), then the test's dockerd (by the pid it started).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use hangwatch_testkit::{is_dead, python, require, wait_until, LoopExt4};

/// The stall, the roll call, the probes, the grace and the runtime's kill.
const ENDED_WITHIN: Duration = Duration::from_secs(60);

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A container runtime's client as the test calls it: `podman`, or `docker -H unix://<the test's daemon>`.
#[derive(Clone)]
struct Client {
    argv: Vec<String>,
}

impl Client {
    /// `CLIENT ARGS` under a deadline (`timeout`), its stdout when it succeeded.
    fn call(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("timeout")
            .arg("60")
            .args(&self.argv)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{:?} {args:?}: {e}", self.argv))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(format!(
                "{:?} {args:?}: {}: {}",
                self.argv,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

/// An image made by the test: directories and the links of a merged-`/usr` system, nothing else (the node's `/usr`
/// is bound in at run time), imported from a tar. Removed on drop.
struct TestImage {
    client: Client,
    tag: String,
}

impl TestImage {
    fn build(client: &Client) -> Result<TestImage, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let root = dir.path().join("root");
        for d in [
            "usr", "etc", "tmp", "proc", "dev", "sys", "data", "hw", "run", "var",
        ] {
            std::fs::create_dir_all(root.join(d)).map_err(|e| e.to_string())?;
        }
        for (link, to) in [
            ("bin", "usr/bin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
            ("sbin", "usr/sbin"),
        ] {
            std::os::unix::fs::symlink(to, root.join(link)).map_err(|e| e.to_string())?;
        }
        let tar = dir.path().join("root.tar");
        let made = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .map_err(|e| e.to_string())?;
        if !made.success() {
            return Err(format!("tar: {made}"));
        }
        let tag = format!("localhost/hangwatch-test-{}:1", std::process::id());
        client.call(&["import", &s(&tar), &tag])?;
        Ok(TestImage {
            client: client.clone(),
            tag,
        })
    }
}

impl Drop for TestImage {
    fn drop(&mut self) {
        let _ = self.client.call(&["rmi", "--force", &self.tag]);
    }
}

/// The container the test's job starts, known by the name the test gives it: removed on drop (after the thaw,
/// which a `FrozenGuard` declared later does first).
struct TestContainer {
    client: Client,
    name: String,
}

impl TestContainer {
    fn exists(&self) -> bool {
        self.client
            .call(&["container", "inspect", "--format", "{{.Id}}", &self.name])
            .is_ok()
    }
}

impl Drop for TestContainer {
    fn drop(&mut self) {
        let _ = self.client.call(&["rm", "--force", &self.name]);
    }
}

/// A Docker daemon of the test's own: its data, state and socket in a temporary directory, no iptables rules, no
/// bridge (the job uses the host's network). Stopped (SIGTERM to the pid the test started, then SIGKILL) on drop.
struct TestDockerd {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl TestDockerd {
    fn start(dockerd: &Path) -> Result<TestDockerd, String> {
        let dir = tempfile::Builder::new()
            .prefix("hw-dockerd-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let log =
            std::fs::File::create(dir.path().join("dockerd.log")).map_err(|e| e.to_string())?;
        let child = Command::new(dockerd)
            .arg("--data-root")
            .arg(dir.path().join("data"))
            .arg("--exec-root")
            .arg(dir.path().join("exec"))
            .arg("--pidfile")
            .arg(dir.path().join("dockerd.pid"))
            .arg("-H")
            .arg(format!("unix://{}", dir.path().join("d.sock").display()))
            .args(["--iptables=false", "--ip6tables=false", "--bridge=none"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("dockerd: {e}"))?;
        let daemon = TestDockerd { child, dir };
        let client = daemon.client();
        if !wait_until(Duration::from_secs(30), POLL, || {
            client
                .call(&["version", "--format", "{{.Server.Version}}"])
                .is_ok()
        }) {
            return Err(format!(
                "dockerd did not answer within 30 s: {}",
                std::fs::read_to_string(daemon.dir.path().join("dockerd.log")).unwrap_or_default()
            ));
        }
        Ok(daemon)
    }

    fn client(&self) -> Client {
        Client {
            argv: vec![
                "docker".into(),
                "-H".into(),
                format!("unix://{}", self.dir.path().join("d.sock").display()),
            ],
        }
    }
}

impl Drop for TestDockerd {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let stopped = wait_until(Duration::from_secs(20), POLL, || {
            self.child.try_wait().ok().flatten().is_some()
        });
        if !stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // dockerd leaves its default network namespace mounted under its exec root: unmounted, deepest first, so
        // that the directory can go.
        let dir = self.dir.path().to_string_lossy().into_owned();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
            .filter(|m| m.starts_with(&format!("{dir}/")))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
    }
}

/// The repository's `tests/python`, bound into the container at `/hw`.
fn python_dir() -> PathBuf {
    hangwatch_testkit::rank_script()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// A host pid's pid in its own namespace (the last of `NSpid`).
fn inner_pid(pid: u64) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

fn state_of(pid: u64) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// `hangwatch run -- CLIENT run --rm ... IMAGE sh -c '<4 ranks>'` (`run_options` first) with rank 0's log on a
/// frozen ext4 bound at `/data`: checks the verdict, the container's ending and that it is gone after the thaw.
fn frozen_rank_0_in_a_container(client: &Client, runtime: &str, run_options: &[&str]) {
    python().expect("python3");
    let fs = require!(LoopExt4::new(64));
    let job_dir = fs.path().join("job");
    std::fs::create_dir(&job_dir).expect("job dir");
    let image = TestImage::build(client).expect("a test image imported into the runtime");
    let container = TestContainer {
        client: client.clone(),
        name: format!("hangwatch-test-{}", std::process::id()),
    };
    let port = hangwatch_testkit::free_tcp_port().expect("a free port");
    let launcher = format!(
        "for r in 0 1 2 3; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT={port} \
         /usr/bin/python3 /hw/rank.py --step-time 0.1 --log /data/rank0.log --only-rank 0 & done; wait"
    );
    let mut job: Vec<String> = client.argv.clone();
    job.extend(["run".to_string()]);
    job.extend(run_options.iter().map(|a| a.to_string()));
    job.extend(
        [
            "--rm",
            "--name",
            &container.name,
            "--network",
            "host",
            "-e",
            "PYTHONUNBUFFERED=1",
            "-v",
            "/usr:/usr:ro",
            "-v",
            &format!("{}:/hw:ro", s(&python_dir())),
            "-v",
            &format!("{}:/data", s(&job_dir)),
            &image.tag,
            "sh",
            "-c",
            &launcher,
        ]
        .iter()
        .map(|a| a.to_string()),
    );
    let mut run = HangwatchRun::start(&["--stall-after", STALL_AFTER], &job);
    let printed = run.wait_for_ranks(4, Duration::from_secs(60));
    assert!(
        run.wait_for_stderr(Duration::from_secs(20), |l| l
            .contains("its processes are the ranks")),
        "hangwatch never found the container:\n{}",
        run.stderr_text()
    );
    let id = client
        .call(&[
            "container",
            "inspect",
            "--format",
            "{{.Id}}",
            &container.name,
        ])
        .expect("the container runs");
    wait_for_log(&mut run, &job_dir.join("rank0.log"), 20);
    let frozen = require!(fs.freeze());
    let done = run.finish(ENDED_WITHIN);
    done.assert_code(75);
    assert_eq!(
        done.json["kind"],
        "blocked_in_kernel",
        "{}",
        done.describe()
    );
    let c = done.culprit(0);
    assert_eq!(c["state"], "D", "{}", done.describe());
    assert_eq!(c["syscall"], "write", "{}", done.describe());
    assert_eq!(c["path"], "/data/rank0.log", "the path as the rank sees it");
    assert_eq!(c["mount"], "/data", "{}", done.describe());
    assert_eq!(c["fstype"], "ext4");
    assert_eq!(
        c["filesystem"]["host_mount"],
        s(fs.path()),
        "{}",
        done.describe()
    );
    assert_eq!(
        c["filesystem"]["host_path"],
        s(&job_dir),
        "{}",
        done.describe()
    );
    assert_eq!(
        done.json["filesystems"][0]["responsive"],
        false,
        "{}",
        done.describe()
    );
    // Both pids: the node's, and the container's (what rank.py printed of itself).
    let host_pid = c["pid"].as_u64().expect("the culprit's host pid");
    assert_eq!(
        c["ns_pid"].as_u64(),
        Some(u64::from(printed[&0])),
        "{}",
        done.describe()
    );
    assert_ne!(Some(host_pid), c["ns_pid"].as_u64());
    assert_eq!(inner_pid(host_pid), Some(u64::from(printed[&0])));
    // The container, as podman knows it, and how it was ended.
    let ctr = &done.json["container"];
    assert_eq!(ctr["runtime"], runtime, "{}", done.describe());
    assert_eq!(ctr["id"], id.as_str(), "{}", done.describe());
    let image_named = ctr["image"].as_str().unwrap_or_default();
    assert!(
        image
            .tag
            .ends_with(image_named.trim_start_matches("localhost/")),
        "{image_named} is {}: {}",
        image.tag,
        done.describe()
    );
    assert_eq!(ctr["name"], container.name.as_str());
    assert_eq!(ctr["auto_remove"], true);
    assert_eq!(ctr["ended"]["still_running"], true, "{}", done.describe());
    assert!(
        ctr["ended"]["client_exit_code"].is_i64(),
        "{}",
        done.describe()
    );
    let unkillable = done.action("unkillable").expect("rank 0 said unkillable");
    assert_eq!(
        unkillable["ranks"],
        serde_json::json!([0]),
        "{}",
        done.describe()
    );
    let ended = done.action("container").expect("the container's ending");
    let words = ended["detail"].as_str().unwrap_or_default();
    assert!(
        words.contains("it still runs") && words.contains(&format!("{runtime} removes it (--rm)")),
        "{words}"
    );
    assert!(
        done.stderr
            .contains(&format!("{runtime} container {}", &id[..12])),
        "{}",
        done.describe()
    );
    // While frozen: rank 0 is still there, in D, and so is its container.
    assert_eq!(state_of(host_pid), Some('D'));
    assert!(container.exists(), "the container holds an unkillable rank");
    frozen.thaw().expect("thaw");
    assert!(
        wait_until(Duration::from_secs(30), POLL, || is_dead(host_pid as u32)),
        "rank 0 ends once its write returns"
    );
    assert!(
        wait_until(Duration::from_secs(30), POLL, || !container.exists()),
        "the runtime removes the container (--rm) once its last process ended"
    );
}

#[test]
fn a_podman_run_job_is_watched_through_its_container_and_ended_through_podman() {
    require!(installed(
        "/usr/bin/podman",
        "apt-get install podman runc (scripts/test does)"
    ));
    require!(installed(
        "/usr/sbin/runc",
        "apt-get install podman runc (scripts/test does)"
    ));
    // runc, not crun: crun refuses a node whose cgroups are mounted in hybrid mode (v1 controllers and a v2
    // tree), as CI's are: `--runtime` is a global option, which hangwatch passes on to its own podman calls. The
    // limits are below the node's own: a container may not raise them without CAP_SYS_RESOURCE, which CI's root
    // lacks, and podman's defaults (1048576 files) would.
    let podman = Client {
        argv: vec!["podman".into(), "--runtime".into(), "runc".into()],
    };
    frozen_rank_0_in_a_container(
        &podman,
        "podman",
        &[
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ],
    );
}

#[test]
fn a_docker_run_job_is_watched_through_its_container_and_ended_through_docker() {
    let dockerd = require!(installed(
        "/usr/sbin/dockerd",
        "apt-get install docker.io (scripts/test does)"
    ));
    let daemon = TestDockerd::start(dockerd).expect("the test's own dockerd");
    frozen_rank_0_in_a_container(&daemon.client(), "docker", &[]);
}
