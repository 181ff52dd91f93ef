//! System tests of ranks in containers (docs/containers.md): each rank has a mount namespace of its own where the
//! shared filesystem (a really frozen, loop-mounted ext4; a FUSE mount whose daemon stops) is bound at a path of
//! the container's choosing. The verdict must name the path as the rank sees it, say the mount does not answer
//! (probed in the rank's namespace, never in hangwatch's same-named directory), and name the filesystem as the
//! node knows it. The containers: `unshare --mount` (what every runtime does underneath) and bubblewrap, a real
//! unprivileged container runtime of the Apptainer kind (Apptainer itself is not packaged by Debian).

mod common;

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use common::*;
use hangwatch_testkit::{is_dead, python, require, wait_until, LoopExt4};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use serde_json::Value;

/// How long a frozen job may take to be named and ended: the stall, the roll call, the probes, the grace.
const ENDED_WITHIN: Duration = Duration::from_secs(60);

/// `unshare --mount --propagation private sh -c '<setup> && exec python3 rank.py ...'`: a rank in a private
/// mount namespace (the container), logging (rank 0 only) to `log` as the container sees it.
fn in_private_namespace(setup: &str, log: &str) -> Vec<String> {
    let py = python().expect("python3");
    let script = hangwatch_testkit::rank_script();
    let command = format!(
        "{setup} && exec {} {} --step-time 0.1 --log {log} --only-rank 0",
        py.display(),
        script.display()
    );
    [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &command,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A directory of hangwatch's own namespace, watched for any file created in it: the container's mount point
/// has the same name, and a probe that took the name for hangwatch's own path would write here.
struct Untouched {
    dir: tempfile::TempDir,
    watch: Inotify,
}

impl Untouched {
    fn new() -> Untouched {
        let dir = tempfile::Builder::new()
            .prefix("hangwatch-ctr-")
            .tempdir()
            .expect("tempdir");
        let watch = Inotify::init(InitFlags::IN_NONBLOCK).expect("inotify");
        watch
            .add_watch(dir.path(), AddWatchFlags::IN_CREATE)
            .expect("watch");
        Untouched { dir, watch }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The names created in it since it was made.
    fn created(&self) -> Vec<String> {
        self.watch
            .read_events()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| e.name)
            .map(|n| String::from_utf8_lossy(n.as_bytes()).into_owned())
            .collect()
    }
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn evidence(done: &Finished, file: &str) -> Value {
    let text = std::fs::read_to_string(done.report_dir.join(file))
        .unwrap_or_else(|e| panic!("{file} in the evidence: {e}\n{}", done.describe()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Checks that the verdict names `mount` (the container's path) on the frozen `fs`, with `host_path` its
/// directory on the node, and that no probe touched anything else.
fn names_the_frozen_filesystem(done: &Finished, mount: &str, fs: &LoopExt4, host_path: &Path) {
    done.assert_code(75);
    assert_eq!(
        done.json["kind"],
        "blocked_in_kernel",
        "{}",
        done.describe()
    );
    let c = done.culprit(0);
    assert_eq!(c["syscall"], "write", "{}", done.describe());
    assert_eq!(
        c["path"],
        format!("{mount}/rank0.log"),
        "the path as the rank sees it"
    );
    assert_eq!(c["mount"], mount, "{}", done.describe());
    assert_eq!(c["fstype"], "ext4");
    let id = &c["filesystem"];
    assert_eq!(id["other_namespace"], true, "{}", done.describe());
    assert_eq!(id["host_mount"], s(fs.path()), "{}", done.describe());
    assert_eq!(id["host_path"], s(host_path), "{}", done.describe());
    assert_eq!(id["key"], s(fs.path()));
    let filesystems = done.json["filesystems"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(filesystems.len(), 1, "{}", done.describe());
    assert_eq!(filesystems[0]["mount"], mount);
    assert_eq!(filesystems[0]["responsive"], false, "{}", done.describe());
    assert_eq!(filesystems[0]["filesystem"]["key"], s(fs.path()));
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains(&format!(
            "{mount} in the container = {} on the host (ext4) does not respond",
            host_path.display()
        )),
        "{summary}"
    );
    for probe in evidence(done, "probes.json")["probes"]
        .as_array()
        .into_iter()
        .flatten()
    {
        assert_eq!(
            probe["fstype"], "ext4",
            "only the frozen filesystem is probed: {probe}"
        );
        assert_eq!(probe["responsive"], false, "{probe}");
    }
}

#[test]
fn a_rank_in_its_own_mount_namespace_is_probed_there_and_named_as_the_node_knows_the_filesystem() {
    let fs = require!(LoopExt4::new(64));
    let job_dir = fs.path().join("job");
    std::fs::create_dir(&job_dir).expect("job dir");
    let ctr = Untouched::new();
    let mount = s(ctr.path());
    let job = in_private_namespace(
        &format!("mount --bind {} {mount}", job_dir.display()),
        &format!("{mount}/rank0.log"),
    );
    let mut run = HangwatchRun::start(&["--stall-after", STALL_AFTER, "--nproc", "4"], &job);
    wait_for_log(&mut run, &job_dir.join("rank0.log"), 20);
    let frozen = require!(fs.freeze());
    let done = run.finish(ENDED_WITHIN);
    names_the_frozen_filesystem(&done, &mount, &fs, &job_dir);
    let rank0 = done.culprit(0)["pid"].as_u64().unwrap_or_default() as u32;
    assert_eq!(
        ctr.created(),
        Vec::<String>::new(),
        "nothing may be written into hangwatch's own {mount}"
    );
    frozen.thaw().expect("thaw");
    assert!(wait_until(Duration::from_secs(10), POLL, || is_dead(rank0)));
}

#[test]
fn two_jobs_that_bind_one_frozen_filesystem_at_different_paths_name_one_filesystem_and_one_cause() {
    let fs = require!(LoopExt4::new(64));
    let state = tempfile::tempdir().expect("a shared history");
    let mut runs = Vec::new();
    let mut dirs = Vec::new();
    for name in ["a", "b"] {
        let job_dir = fs.path().join(format!("job-{name}"));
        std::fs::create_dir(&job_dir).expect("job dir");
        let ctr = Untouched::new();
        let mount = s(ctr.path());
        let job = in_private_namespace(
            &format!("mount --bind {} {mount}", job_dir.display()),
            &format!("{mount}/rank0.log"),
        );
        let mut cmd = hangwatch();
        cmd.env("HANGWATCH_STATE_DIR", state.path());
        let run =
            HangwatchRun::start_in(cmd, &["--stall-after", STALL_AFTER, "--nproc", "2"], &job);
        runs.push(run);
        dirs.push((ctr, job_dir));
    }
    for (run, (_, job_dir)) in runs.iter_mut().zip(&dirs) {
        wait_for_log(run, &job_dir.join("rank0.log"), 20);
    }
    let frozen = require!(fs.freeze());
    let done: Vec<Finished> = runs.iter_mut().map(|r| r.finish(ENDED_WITHIN)).collect();
    for (d, (ctr, job_dir)) in done.iter().zip(&dirs) {
        names_the_frozen_filesystem(d, &s(ctr.path()), &fs, job_dir);
        assert!(ctr.created().is_empty());
    }
    let keys: Vec<&Value> = done
        .iter()
        .map(|d| &d.culprit(0)["filesystem"]["key"])
        .collect();
    assert_eq!(keys[0], keys[1], "one filesystem for both containers");
    let fingerprints: Vec<&Value> = done
        .iter()
        .map(|d| &d.json["recurrence"]["fingerprint"])
        .collect();
    assert!(fingerprints[0].is_string(), "{}", done[0].describe());
    assert_eq!(fingerprints[0], fingerprints[1], "one cause for both jobs");
    let seen: Vec<u64> = done
        .iter()
        .map(|d| {
            d.json["recurrence"]["seen_before"]
                .as_u64()
                .unwrap_or_default()
        })
        .collect();
    assert!(
        seen.contains(&1),
        "the later job's history has seen the other's: {seen:?}"
    );
    frozen.thaw().expect("thaw");
}

/// The bindfs daemon serving `backing` (started inside a rank's namespace, so only /proc finds it).
fn bindfs_serving(backing: &Path) -> Option<u32> {
    let needle = backing.as_os_str().as_bytes();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let is_bindfs = cmdline.split(|b| *b == 0).next()?.ends_with(b"bindfs");
        (is_bindfs && cmdline.windows(needle.len()).any(|w| w == needle)).then_some(pid)
    })
}

/// Resumes and ends a FUSE daemon the test stopped, whatever happens to the test.
struct DaemonGuard(Option<u32>);

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[test]
fn a_fuse_mount_that_only_the_ranks_namespace_has_is_named_when_its_daemon_stops() {
    require!(installed(
        "/usr/bin/bindfs",
        "apt-get install bindfs (scripts/test does)"
    ));
    let backing = tempfile::tempdir().expect("backing dir");
    let ctr = Untouched::new();
    let mount = s(ctr.path());
    // Only rank 0 mounts it: the daemon lives in that namespace alone.
    let job = in_private_namespace(
        &format!(
            "if [ \"$RANK\" = 0 ]; then bindfs {} {mount}; fi; true",
            backing.path().display()
        ),
        &format!("{mount}/rank0.log"),
    );
    let mut run = HangwatchRun::start(&["--stall-after", STALL_AFTER, "--nproc", "2"], &job);
    let log = backing.path().join("rank0.log");
    wait_for_log(&mut run, &log, 20);
    let daemon = DaemonGuard(bindfs_serving(backing.path()));
    let pid = daemon.0.expect("the bindfs daemon");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .expect("stop the daemon");
    let done = run.finish(ENDED_WITHIN);
    done.assert_code(75);
    assert_eq!(
        done.json["kind"],
        "blocked_in_kernel",
        "{}",
        done.describe()
    );
    let c = done.culprit(0);
    assert_eq!(c["mount"], mount.as_str(), "{}", done.describe());
    assert_eq!(c["path"], format!("{mount}/rank0.log"));
    let fstype = c["fstype"].as_str().unwrap_or_default();
    assert!(fstype.starts_with("fuse"), "{fstype}");
    let id = &c["filesystem"];
    assert_eq!(id["other_namespace"], true, "{}", done.describe());
    assert!(
        id["host_mount"].is_null(),
        "the node does not mount it: {id}"
    );
    let key = id["key"].as_str().unwrap_or_default();
    assert!(key.starts_with(fstype) && key.contains(" dev "), "{key}");
    let filesystems = done.json["filesystems"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(filesystems.len(), 1, "{}", done.describe());
    assert_eq!(filesystems[0]["responsive"], false, "{}", done.describe());
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("(not mounted on the host)") && summary.contains("does not respond"),
        "{summary}"
    );
    assert!(ctr.created().is_empty());
}

#[test]
fn ranks_in_a_bubblewrap_container_with_their_own_pids_are_named_with_both_pids() {
    let bwrap = require!(installed(
        "/usr/bin/bwrap",
        "apt-get install bubblewrap (scripts/test does)"
    ));
    let fs = require!(LoopExt4::new(64));
    let job_dir = fs.path().join("job");
    std::fs::create_dir(&job_dir).expect("job dir");
    let py = python().expect("python3");
    let job: Vec<String> = [
        s(bwrap),
        "--bind".into(),
        "/".into(),
        "/".into(),
        "--dev".into(),
        "/dev".into(),
        "--proc".into(),
        "/proc".into(),
        "--bind".into(),
        s(&job_dir),
        "/data".into(),
        "--unshare-pid".into(),
        "--die-with-parent".into(),
        s(py),
        s(&hangwatch_testkit::rank_script()),
        "--step-time".into(),
        "0.1".into(),
        "--log".into(),
        "/data/rank0.log".into(),
        "--only-rank".into(),
        "0".into(),
    ]
    .into();
    let mut run = HangwatchRun::start(&["--stall-after", STALL_AFTER, "--nproc", "2"], &job);
    let printed = run.wait_for_ranks(2, Duration::from_secs(30));
    wait_for_log(&mut run, &job_dir.join("rank0.log"), 20);
    let frozen = require!(fs.freeze());
    let done = run.finish(ENDED_WITHIN);
    done.assert_code(75);
    assert_eq!(done.json["pids"], "host", "{}", done.describe());
    let c = done.culprit(0);
    assert_eq!(c["mount"], "/data", "{}", done.describe());
    assert_eq!(c["path"], "/data/rank0.log");
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
    // rank.py printed its pid as the container numbers it; the verdict keeps both.
    assert_eq!(
        c["ns_pid"].as_u64(),
        Some(u64::from(printed[&0])),
        "{}",
        done.describe()
    );
    assert_ne!(c["pid"], c["ns_pid"]);
    frozen.thaw().expect("thaw");
}
