//! The right file for calls that take a path (issue: "the right file, every time"): a rank blocked in mkdir,
//! openat (relative to a directory fd), rename or stat names the path it was given, read from its memory without
//! stopping it, the mount that holds that path and its filesystem type — not its working directory's. On a
//! really frozen loop-mounted ext4 and on a FUSE mount whose daemon is stopped; each test thaws or resumes, kills
//! by pid and unmounts what it made, also when it fails.

mod common;

use std::path::Path;

use common::*;
use hangwatch_testkit::{python, require, FuseMount, LoopExt4};

fn assert_names(done: &Finished, call: &str, dir: &Path, mount: &Path, fstype: &str) {
    done.assert_code(75);
    let c = done.culprit(0);
    assert_eq!(c["syscall"], call, "{}", done.describe());
    let path = c["path"].as_str().unwrap_or_default();
    assert!(
        path.starts_with(&format!("{}/", dir.display())),
        "the path {call}() was given, not the working directory: {}",
        done.describe()
    );
    assert_eq!(c["mount"], &*mount.to_string_lossy(), "{}", done.describe());
    assert!(
        c["fstype"].as_str().unwrap_or_default().starts_with(fstype),
        "{}",
        done.describe()
    );
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains(&format!("in {call}() on {path}")),
        "{summary}"
    );
    assert!(
        !summary.contains("responds"),
        "a verdict never calls the filesystem it blames responsive: {summary}"
    );
}

fn on_frozen_ext4(op: &str, call: &str) {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let dir = fs.path().join("ckpt");
    std::fs::create_dir_all(&dir).expect("checkpoint directory");
    let done = rank_0_blocked_in(py, op, &dir, || fs.freeze().expect("freeze"));
    assert_names(&done, call, &dir, fs.path(), "ext4");
    assert_eq!(done.culprit(0)["state"], "D");
}

#[test]
fn a_rank_blocked_in_mkdir_on_a_frozen_ext4_names_the_new_directory_its_mount_and_ext4() {
    on_frozen_ext4("mkdir", "mkdir");
}

#[test]
fn a_rank_blocked_in_openat_relative_to_a_directory_fd_names_the_file_under_that_directory() {
    on_frozen_ext4("openat", "openat");
}

#[test]
fn a_rank_blocked_in_rename_on_a_frozen_ext4_names_the_file_and_its_mount() {
    on_frozen_ext4("rename", "rename");
}

fn on_stopped_fuse(op: &str, call: &str) {
    let py = require!(python());
    let backing = tempfile::tempdir().expect("backing directory");
    let fuse = require!(FuseMount::new(backing.path()));
    let dir = fuse.path().join("ckpt");
    std::fs::create_dir_all(&dir).expect("checkpoint directory");
    let done = rank_0_blocked_in(py, op, &dir, || {
        fuse.stop_daemon().expect("stop the FUSE daemon")
    });
    assert_names(&done, call, &dir, fuse.path(), "fuse");
    assert_eq!(
        done.json["filesystems"][0]["responsive"],
        false,
        "{}",
        done.describe()
    );
}

#[test]
fn a_rank_blocked_in_mkdir_on_a_fuse_mount_whose_daemon_is_stopped_names_it() {
    on_stopped_fuse("mkdir", "mkdir");
}

#[test]
fn a_rank_blocked_in_stat_on_a_fuse_mount_whose_daemon_is_stopped_names_it() {
    on_stopped_fuse("stat", "newfstatat");
}

#[test]
fn a_rank_blocked_in_a_page_fault_on_a_frozen_mapping_names_the_mapped_file_and_its_mount() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let dir = fs.path().join("data");
    std::fs::create_dir_all(&dir).expect("data directory");
    // A store into a shared mapping of a file there: the page fault waits on the frozen superblock, in no system
    // call; the file is the one the rank maps on the mount that does not answer its probe (issue 25).
    let done = rank_0_blocked_in(py, "mmapwrite", &dir, || fs.freeze().expect("freeze"));
    done.assert_code(75);
    let c = done.culprit(0);
    assert_eq!(c["state"], "D", "{}", done.describe());
    let file = dir.join("mapped-r0.bin").to_string_lossy().into_owned();
    assert_eq!(c["path"], file.as_str(), "{}", done.describe());
    assert_eq!(c["page_fault"]["access"], "write", "{}", done.describe());
    let mount = fs.path().to_string_lossy().into_owned();
    assert_eq!(c["mount"], mount.as_str(), "{}", done.describe());
    assert_eq!(c["fstype"], "ext4");
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains(&format!(
            "is blocked writing to a memory-mapped file {file} (a page fault, in uninterruptible sleep (D)); \
             {mount} (ext4) does not respond"
        )),
        "{summary}"
    );
}

/// An async checkpoint writer: rank 0 saves in a thread named `ckpt-writer` that its main thread joins. On a frozen
/// ext4 the writer sleeps in D while the main thread only waits: the culprit is rank 0, named with the writer's
/// thread, its call, file and mount.
#[test]
fn an_async_checkpoint_thread_in_d_is_named_with_its_thread_name_while_its_main_thread_waits_for_it(
) {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let dir = fs.path().join("ckpt");
    std::fs::create_dir_all(&dir).expect("checkpoint directory");
    let dir_s = dir.to_string_lossy().into_owned();
    let done = rank_0_stopped_by(
        py,
        &[
            "--behaviour",
            "async_checkpoint",
            "--after",
            "2",
            "--fs-dir",
            &dir_s,
        ],
        || fs.freeze().expect("freeze"),
    );
    done.assert_code(75);
    assert_eq!(
        done.json["kind"],
        "blocked_in_kernel",
        "{}",
        done.describe()
    );
    let c = done.culprit(0);
    assert_eq!(c["thread_name"], "ckpt-writer", "{}", done.describe());
    assert_eq!(c["state"], "D", "{}", done.describe());
    assert!(
        c["path"]
            .as_str()
            .is_some_and(|p| p.starts_with(&*dir.to_string_lossy())),
        "{}",
        done.describe()
    );
    assert_eq!(
        c["mount"],
        fs.path().to_string_lossy().as_ref(),
        "{}",
        done.describe()
    );
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(summary.contains("thread ckpt-writer"), "{summary}");
}
