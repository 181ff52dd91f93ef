//! A rank blocked in a page fault names the memory-mapped file (issue 25): a dataset mapped from a FUSE mount whose
//! daemon stops (one file, then a store of several shards: the candidates), and a package directory on such a
//! mount that a rank imports from mid-run. Each test resumes the daemon, kills by pid and unmounts what it made,
//! also when it fails (the guards drop in that order).

mod common;

use std::path::Path;

use common::*;
use hangwatch_testkit::{python, require, FuseMount};
use serde_json::Value;

/// Runs 2 ranks; rank 0 does `op` in `dir` (on `fuse`) every step; after 3 steps the daemon stops.
fn stuck_on(py: &Path, fuse: &FuseMount, op: &str, dir: &Path) -> Finished {
    rank_0_blocked_in(py, op, dir, || {
        fuse.stop_daemon().expect("stop the FUSE daemon")
    })
}

/// Sparse shards in the backing directory (never read through FUSE, so no page of them is cached).
fn shards(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir).expect("dataset directory");
    for i in 0..n {
        let f = std::fs::File::create(dir.join(format!("shard-{i}.bin"))).expect("shard");
        f.set_len(256 << 20).expect("256 MiB");
    }
}

/// The culprit is rank 0 on `mount`, a FUSE mount that did not answer its probe, said so in the summary.
fn assert_on_stopped_fuse(done: &Finished, mount: &Path) -> Value {
    done.assert_code(75);
    let c = done.culprit(0).clone();
    let mount = mount.to_string_lossy().into_owned();
    assert_eq!(c["mount"], mount.as_str(), "{}", done.describe());
    assert!(
        c["fstype"].as_str().is_some_and(|t| t.starts_with("fuse")),
        "{}",
        done.describe()
    );
    let fs = done.json["filesystems"]
        .as_array()
        .and_then(|all| all.iter().find(|f| f["mount"] == mount.as_str()))
        .unwrap_or_else(|| panic!("{mount} was not probed: {}", done.describe()));
    assert_eq!(fs["responsive"], false, "{}", done.describe());
    let summary = done.json["summary"].as_str().unwrap_or_default();
    eprintln!("summary: {summary}");
    assert!(
        summary.contains(&format!("{mount} (fuse")) && summary.contains("does not respond"),
        "{summary}"
    );
    c
}

#[test]
fn a_rank_reading_a_memory_mapped_file_on_a_stopped_fuse_mount_names_the_file_its_mount_and_fuse() {
    let py = require!(python());
    let backing = tempfile::tempdir().expect("backing directory");
    shards(&backing.path().join("data"), 1);
    let fuse = require!(FuseMount::new(backing.path()));
    let dir = fuse.path().join("data");
    let done = stuck_on(py, &fuse, "mmapread", &dir);
    let c = assert_on_stopped_fuse(&done, fuse.path());
    let file = dir.join("shard-0.bin").to_string_lossy().into_owned();
    assert_eq!(c["path"], file.as_str(), "{}", done.describe());
    assert!(
        c["syscall"].is_null(),
        "a page fault is in no system call: {}",
        done.describe()
    );
    let fault = &c["page_fault"];
    assert_eq!(fault["access"], "read", "{}", done.describe());
    assert!(
        matches!(
            fault["found_by"].as_str(),
            Some("only_mapping" | "instruction_pointer")
        ),
        "{}",
        done.describe()
    );
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains(&format!("is blocked reading a memory-mapped file {file}")),
        "{summary}"
    );
}

#[test]
fn a_rank_reading_one_of_several_mapped_shards_of_a_stopped_dataset_store_names_the_candidates() {
    let py = require!(python());
    let backing = tempfile::tempdir().expect("backing directory");
    shards(&backing.path().join("dataset"), 3);
    let fuse = require!(FuseMount::new(backing.path()));
    let dir = fuse.path().join("dataset");
    let done = stuck_on(py, &fuse, "mmapread", &dir);
    let c = assert_on_stopped_fuse(&done, fuse.path());
    let fault = &c["page_fault"];
    assert_eq!(fault["found_by"], "candidates", "{}", done.describe());
    let candidates: Vec<&str> = fault["candidates"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f["path"].as_str()).collect())
        .unwrap_or_default();
    let expected: Vec<String> = (0..3)
        .map(|i| {
            dir.join(format!("shard-{i}.bin"))
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(candidates, expected, "{}", done.describe());
    assert!(
        c["path"].is_null(),
        "no one file is guessed: {}",
        done.describe()
    );
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("is blocked reading a memory-mapped file on ")
            && summary.contains("one of 3 candidates it maps there: dataset/shard-0.bin"),
        "{summary}"
    );
}

#[test]
fn a_rank_importing_a_module_from_a_package_directory_on_a_stopped_fuse_mount_names_it() {
    let py = require!(python());
    let backing = tempfile::tempdir().expect("backing directory");
    let pkg = backing.path().join("site");
    std::fs::create_dir_all(&pkg).expect("package directory");
    for i in 0..400 {
        std::fs::write(pkg.join(format!("hw_mod_{i}.py")), format!("VALUE = {i}\n"))
            .expect("module");
    }
    let fuse = require!(FuseMount::new(backing.path()));
    let dir = fuse.path().join("site");
    let done = stuck_on(py, &fuse, "import", &dir);
    let c = assert_on_stopped_fuse(&done, fuse.path());
    let path = c["path"].as_str().unwrap_or_default();
    assert!(
        path.starts_with(&*dir.to_string_lossy()),
        "the package directory or the module in it: {}",
        done.describe()
    );
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(summary.contains(path), "{summary}");
}

#[test]
fn a_rank_waiting_for_a_lock_held_outside_the_job_names_the_holder() {
    let py = python().expect("python3");
    let dir = tempfile::tempdir().expect("lock directory");
    let lock = dir.path().join("shared.lock");
    let mut holder_pid = 0;
    let done = rank_0_blocked_in(py, "flock", dir.path(), || {
        // A process outside the job (a cache cleaner, a download helper) takes the lock and keeps it.
        let mut holder = std::process::Command::new(py)
            .arg("-c")
            .arg(format!(
                "import fcntl, os, sys, time\nfd = os.open({:?}, os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n\
                 print('held', flush=True)\ntime.sleep(120)\n",
                lock.display().to_string()
            ))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("the lock holder starts");
        let mut line = String::new();
        let stdout = holder.stdout.take().expect("its stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("the holder says it holds the lock");
        holder_pid = holder.id() as i32;
        hangwatch_testkit::ChildGuard::new(holder, "lock holder")
    });
    done.assert_code(75);
    let culprit = done.culprit(0);
    assert_eq!(culprit["syscall"], "flock", "{}", done.describe());
    let holder = &culprit["lock_wait"]["holders"][0];
    assert_eq!(
        holder["pid"].as_i64(),
        Some(i64::from(holder_pid)),
        "{}",
        done.describe()
    );
    assert_eq!(holder["in_job"], false);
    let reason = culprit["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!(
            "is held by pid {holder_pid} (python3), not a process of the job"
        )),
        "the verdict names the holder: {reason}\n{}",
        done.describe()
    );
}

#[test]
fn a_rank_logging_into_a_fifo_whose_shipper_is_stuck_on_a_frozen_mount_names_the_shipper_and_the_mount(
) {
    let py = python().expect("python3");
    let fs = require!(hangwatch_testkit::LoopExt4::new(64));
    let dir = tempfile::tempdir().expect("fifo directory");
    let fifo = dir.path().join("rank0.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let shipped = fs.path().join("all.log");
    // A log shipper outside the job: reads the FIFO (its buffer made one page, so that it fills in seconds) and
    // appends what it reads to a file on the filesystem that will freeze.
    let shipper = std::process::Command::new(py)
        .arg("-c")
        .arg(format!(
            "import fcntl, os, time\n\
             fd = os.open({fifo:?}, os.O_RDONLY | os.O_NONBLOCK)\n\
             fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)\n\
             fcntl.fcntl(fd, 1031, 4096)\n\
             out = open({shipped:?}, 'ab')\n\
             while True:\n\
             \x20   data = os.read(fd, 4096)\n\
             \x20   if not data:\n\
             \x20       time.sleep(0.05)\n\
             \x20       continue\n\
             \x20   out.write(data)\n\
             \x20   out.flush()\n",
            fifo = fifo.display().to_string(),
            shipped = shipped.display().to_string(),
        ))
        .spawn()
        .expect("the shipper starts");
    let shipper_pid = shipper.id() as i32;
    let _shipper = hangwatch_testkit::ChildGuard::new(shipper, "log shipper");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let fifo_s = fifo.to_string_lossy().into_owned();
    let mut run = HangwatchRun::start(
        &["--nproc", "2", "--stall-after", STALL_AFTER, "--quiet"],
        &rank_job(
            py,
            &["--step-time", "0.02", "--log", &fifo_s, "--only-rank", "0"],
        ),
    );
    assert!(
        hangwatch_testkit::wait_until(std::time::Duration::from_secs(30), POLL, || lines_in(
            &shipped
        ) >= 3),
        "the shipper never wrote rank 0's lines:\n{}",
        run.stderr_text()
    );
    run.track_descendants();
    let frozen = require!(fs.freeze());
    let done = run.finish(STALL + std::time::Duration::from_secs(60));
    drop(frozen);
    done.assert_code(75);
    let culprit = done.culprit(0);
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains(&format!("its pipe's reader, pid {shipper_pid} (python3), not a process of the job, is in uninterruptible sleep (D) in write() on {}", shipped.display())),
        "the verdict names the shipper and its file: {summary}\n{}",
        done.describe()
    );
    assert!(
        summary.contains(&format!("{} (ext4) does not respond", fs.path().display())),
        "and its mount, probed: {summary}"
    );
    assert_eq!(culprit["syscall"], "write", "{}", done.describe());
}
