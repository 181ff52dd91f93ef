//! `hangwatch kmsg` as a user runs it: on the m4 tr_141 kernel log (file and stdin, text and JSON), bad input, and
//! the live kernel log read once.

use std::io::Write;
use std::process::{Command, Output, Stdio};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../kmsg/tests/fixtures/m4-tr141-iam06-dmesg.txt"
);

fn hangwatch(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hangwatch"))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hangwatch");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input).expect("write stdin");
    }
    child.wait_with_output().expect("wait for hangwatch")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}, stderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("utf-8 stdout")
}

const EXPECTED_TEXT: &str = "\
pid 280058 (python) blocked in write() on GPFS since about 04:08:52 — reported 9 times, 04:10:52 to 04:27:15
  write(fd 108, 2440 bytes) from the registers, state D, ppid 279966, waits in cxiWaitEventWait [mmfslinux]
  kernel stack, innermost first:
    __schedule
    schedule
    cxiWaitEventWait [mmfslinux]
    _ZN6ThCond12internalWaitEP16KernelSynchStatejPv [mmfs26]
    _ZN6ThCond5kWaitEiPKc [mmfs26]
    _ZN13KernelMailbox21sendToDaemonWithReplyEv [mmfs26]
    _Z19kSFSExpandLastBlockP15KernelOperationP9MMFSVInfoxP10ext_cred_t [mmfs26]
    _Z9kSFSWriteP15KernelOperationP13gpfsVfsData_tP10gpfsNode_tP9MMFSVInfoiP8cxiUio_ti7FileUIDP8OpenFileP10ext_cred_tP10WhatLockedj [mmfs26]
    _Z9gpfsWriteP13gpfsVfsData_tP15KernelOperationP9cxiNode_tiP8cxiUio_tP9MMFSVInfoP10cxiVattr_tSA_P10ext_cred_tP14cxiPageLists_tiP [mmfs26]
    rdwrInternal [mmfslinux]
    gpfs_f_aio_write_internal [mmfslinux]
    gpfs_f_rdwr_iter [mmfslinux]
    new_sync_write
    vfs_write
    ksys_write
    do_syscall_64
    entry_SYSCALL_64_after_hwframe

Other hung tasks:
  pid 76609 (epilog.sh) blocked in stat() on GPFS (lookup) since about 2023-03-02 15:57:56 — reported once, at 2023-03-02 15:59:56

No GPU Xid errors, filesystem complaints or OOM kills.
Read 7227 lines of dmesg -T output, 2023-03-01 17:38:27 to 2023-03-04 04:27:15.
";

#[test]
fn fixture_file_human_report() {
    let out = stdout(&hangwatch(&["kmsg", FIXTURE], None));
    assert_eq!(out, EXPECTED_TEXT);
}

#[test]
fn fixture_on_stdin_gives_the_same_report() {
    let text = std::fs::read(FIXTURE).expect("fixture");
    let out = stdout(&hangwatch(&["kmsg", "-"], Some(&text)));
    assert_eq!(out, EXPECTED_TEXT);
}

#[test]
fn fixture_json_report() {
    let out = stdout(&hangwatch(&["kmsg", "--json", FIXTURE], None));
    let json: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    assert_eq!(json["version"], 1);
    assert_eq!(
        json["summary"],
        "pid 280058 (python) blocked in write() on GPFS since about 04:08:52 — reported 9 times, 04:10:52 to 04:27:15"
    );
    assert_eq!(json["hung_task_reports"], 10);
    assert_eq!(json["hung_task_reports_suppressed"], false);
    let task = &json["hung_tasks"][0];
    assert_eq!(task["pid"], 280058);
    assert_eq!(task["comm"], "python");
    assert_eq!(task["reports"], 9);
    assert_eq!(task["first_report"]["wall"], "2023-03-04T04:10:52");
    assert_eq!(task["last_report"]["wall"], "2023-03-04T04:27:15");
    assert_eq!(task["blocked_since"]["wall"], "2023-03-04T04:08:52");
    assert_eq!(task["syscall"]["name"], "write");
    assert_eq!(task["syscall"]["fd"], 108);
    assert_eq!(task["syscall"]["count"], 2440);
    assert_eq!(task["filesystem"], "gpfs");
    assert_eq!(task["filesystem_name"], "GPFS");
    let epilog = &json["hung_tasks"][1];
    assert_eq!(epilog["pid"], 76609);
    assert_eq!(epilog["comm"], "epilog.sh");
    assert_eq!(epilog["operation"], "lookup");
    assert_eq!(json["xids"], serde_json::json!([]));
}

#[test]
fn since_keeps_later_reports_only() {
    let out = stdout(&hangwatch(
        &["kmsg", "--json", "--since", "2023-03-04 04:20", FIXTURE],
        None,
    ));
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(json["hung_tasks"].as_array().map(Vec::len), Some(1));
    assert_eq!(json["hung_tasks"][0]["reports"], 4);
}

#[test]
fn usage_errors_exit_2() {
    let bad_since = hangwatch(&["kmsg", "--since", "yesterday", FIXTURE], None);
    assert_eq!(bad_since.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_since.stderr).contains("boot+SECONDS"));
    let missing = hangwatch(&["kmsg", "/nonexistent/kernel.log"], None);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("cannot open /nonexistent/kernel.log")
    );
}

#[test]
fn live_kernel_log_read_once() {
    let output = hangwatch(&["kmsg", "--once", "--json"], None);
    if output.status.success() {
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
        assert_eq!(json["version"], 1);
        assert_eq!(json["format"], "kmsg");
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("permission denied") && stderr.contains("dmesg | hangwatch kmsg -"),
            "{stderr}"
        );
    }
}

#[test]
fn following_prints_one_line_per_report() {
    let out = stdout(&hangwatch(&["kmsg", "--kmsg-device", FIXTURE], None));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 10, "{out}");
    assert_eq!(
        lines[0],
        "2023-03-02 15:59:56 hung task: pid 76609 (epilog.sh) blocked in stat() on GPFS (lookup) for more than 120 s; \
         waits in cxiWaitEventWait [mmfslinux]"
    );
    assert_eq!(
        lines[1],
        "2023-03-04 04:10:52 hung task: pid 280058 (python) blocked in write() on GPFS for more than 120 s; \
         write(fd 108, 2440 bytes), waits in cxiWaitEventWait [mmfslinux]"
    );
}

#[test]
fn following_with_json_prints_json_lines() {
    let out = stdout(&hangwatch(
        &["kmsg", "--json", "--kmsg-device", FIXTURE],
        None,
    ));
    let events: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(events.len(), 10);
    let last = &events[9];
    assert_eq!(last["version"], 1);
    assert_eq!(last["event"], "hung_task");
    assert_eq!(last["pid"], 280058);
    assert_eq!(last["time"]["wall"], "2023-03-04T04:27:15");
    assert_eq!(last["syscall"]["fd"], 108);
    assert_eq!(last["filesystem"], "gpfs");
}
