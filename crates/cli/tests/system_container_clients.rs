//! System tests of a job started through a container client (docs/containers.md, "Docker, Podman, nerdctl"):
//! `hangwatch run -- podman run ...` with real podman and runc, an image built by the test with no registry (a
//! root filesystem of directories and links, the node's `/usr` bound read-only into it), 4 plain Python ranks in the
//! container, rank 0 logging onto a really frozen loop-mounted ext4 bound at `/data`. The ranks are the
//! container's processes (children of podman's conmon, never of the client): hangwatch must find them through the
//! container the client started, name rank 0 with both pids, end the container through podman and say that rank 0
//! cannot be killed while the filesystem is frozen; after the thaw the container is gone (`--rm`).
//!
//! Everything the test makes is removed by guards, also when it fails: the thaw first, then the container (by the
//! name the test gave it), then the image (by its tag).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use hangwatch_testkit::{is_dead, python, require, wait_until, LoopExt4};
use serde_json::Value;

/// The stall, the roll call, the probes, the grace and the runtime's kill.
const ENDED_WITHIN: Duration = Duration::from_secs(60);

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `podman ARGS` under a deadline (`timeout`), its stdout when it succeeded.
fn podman(args: &[&str]) -> Result<String, String> {
    let out = Command::new("timeout")
        .arg("60")
        .arg("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("podman {args:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "podman {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// An image made by the test: directories and the links of a merged-`/usr` system, nothing else (the node's `/usr`
/// is bound in at run time), imported from a tar. Removed on drop.
struct TestImage {
    tag: String,
}

impl TestImage {
    fn build() -> Result<TestImage, String> {
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
        podman(&["import", &s(&tar), &tag])?;
        Ok(TestImage { tag })
    }
}

impl Drop for TestImage {
    fn drop(&mut self) {
        let _ = podman(&["rmi", "--force", &self.tag]);
    }
}

/// The container the test's job starts, known by the name the test gives it: removed on drop (after the thaw,
/// which a `FrozenGuard` declared later does first).
struct TestContainer {
    name: String,
}

impl TestContainer {
    fn exists(&self) -> bool {
        Command::new("timeout")
            .args(["30", "podman", "container", "exists", &self.name])
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for TestContainer {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "0", &self.name]);
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
    python().expect("python3");
    let fs = require!(LoopExt4::new(64));
    let job_dir = fs.path().join("job");
    std::fs::create_dir(&job_dir).expect("job dir");
    let image = TestImage::build().expect("a test image imported into podman");
    let container = TestContainer {
        name: format!("hangwatch-test-{}", std::process::id()),
    };
    let port = hangwatch_testkit::free_tcp_port().expect("a free port");
    let launcher = format!(
        "for r in 0 1 2 3; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT={port} \
         /usr/bin/python3 /hw/rank.py --step-time 0.1 --log /data/rank0.log --only-rank 0 & done; wait"
    );
    // runc, not crun: crun refuses a node whose cgroups are mounted in hybrid mode (v1 controllers and a v2
    // tree), as CI's are. The limits are the node's own: a container may not raise them without
    // CAP_SYS_RESOURCE, which CI's root lacks, and podman's default (1048576 files) would.
    let job: Vec<String> = [
        "podman",
        "--runtime",
        "runc",
        "run",
        "--rm",
        "--name",
        &container.name,
        "--network",
        "host",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
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
    .map(|a| a.to_string())
    .collect();
    let mut run = HangwatchRun::start(&["--stall-after", STALL_AFTER], &job);
    let printed = run.wait_for_ranks(4, Duration::from_secs(60));
    assert!(
        run.wait_for_stderr(Duration::from_secs(20), |l| l
            .contains("its processes are the ranks")),
        "hangwatch never found the container:\n{}",
        run.stderr_text()
    );
    let id =
        podman(&["inspect", "--format", "{{.Id}}", &container.name]).expect("the container runs");
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
    assert_eq!(ctr["runtime"], "podman", "{}", done.describe());
    assert_eq!(ctr["id"], id.as_str(), "{}", done.describe());
    assert_eq!(ctr["image"], image.tag.as_str(), "{}", done.describe());
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
        words.contains("it still runs") && words.contains("podman removes it (--rm)"),
        "{words}"
    );
    assert!(
        done.stderr
            .contains(&format!("podman container {}", &id[..12])),
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
        "podman removes the container (--rm) once its last process ended"
    );
    let _: &Value = &done.json;
}
