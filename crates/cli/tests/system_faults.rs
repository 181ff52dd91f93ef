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
