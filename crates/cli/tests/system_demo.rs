//! `hangwatch demo` end to end: the README's main command must work and leave nothing behind.

use std::process::Command;

#[test]
fn demo_names_rank_0_in_write_on_the_frozen_mount_and_cleans_up() {
    if let Err(why) = hangwatch_testkit::require_root() {
        assert!(!hangwatch_testkit::strict_mode(), "{why}");
        eprintln!("SKIPPED: {why}");
        return;
    }
    let report = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hangwatch"))
        .args(["demo", "--json", "--report-dir"])
        .arg(report.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "blocked_in_kernel", "{v:#}");
    assert_eq!(v["culprits"][0]["rank"], 0);
    assert_eq!(v["culprits"][0]["syscall"], "write");
    assert_eq!(v["culprits"][0]["fstype"], "ext4");
    assert!(report.path().join("verdict.json").exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains("hangwatch-demo-"),
        "the demo left its mount behind"
    );
    assert!(stderr.contains("[demo 4/4]"), "{stderr}");
}
