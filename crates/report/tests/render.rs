//! The page from real bundles (`tests/fixtures/node`: the culprit's node of a 3-node hang on a frozen ext4;
//! `tests/fixtures/coordinator`: the coordinator's merged verdict of the same kind of hang), with hostile text,
//! with broken optional files, and for a 10,000-rank job.

use std::path::{Path, PathBuf};
use std::time::Instant;

use hangwatch_model::{
    Culprit, Group, ProgressPoint, ProgressTimeline, RankPlace, RankReport, Verdict, VerdictKind,
};
use hangwatch_report::{render_html, Bundle, Problem, ReportError};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A writable copy of a fixture bundle.
fn copy_of(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_dir(&fixture(name), dir.path());
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("fixture dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            std::fs::create_dir(&target).expect("mkdir");
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// With `HANGWATCH_REPORT_SAMPLES=DIR`, the pages the tests render are kept there to look at.
fn keep(name: &str, page: &str) {
    if let Some(dir) = std::env::var_os("HANGWATCH_REPORT_SAMPLES") {
        std::fs::write(Path::new(&dir).join(name), page).expect("write sample");
    }
}

fn read_verdict(dir: &Path) -> Verdict {
    serde_json::from_str(&std::fs::read_to_string(dir.join("verdict.json")).expect("verdict"))
        .expect("verdict parses")
}

fn write_verdict(dir: &Path, v: &Verdict) {
    std::fs::write(
        dir.join("verdict.json"),
        serde_json::to_vec_pretty(v).expect("json"),
    )
    .expect("write verdict");
}

/// The `<i ...>` cell of `rank` in the grid.
fn cell(page: &str, rank: u32) -> &str {
    let needle = format!("data-rank=\"{rank}\"");
    let at = page
        .find(&needle)
        .unwrap_or_else(|| panic!("no cell for rank {rank}"));
    let start = page[..at].rfind("<i ").expect("cell start");
    let end = at + page[at..].find("</i>").expect("cell end");
    &page[start..end]
}

#[test]
fn a_real_node_bundle_shows_verdict_culprit_probe_output_and_thresholds() {
    let bundle = Bundle::read(&fixture("node")).expect("bundle reads");
    let started = Instant::now();
    let page = render_html(&bundle);
    eprintln!(
        "real node bundle: {} bytes, rendered in {:?}",
        page.len(),
        started.elapsed()
    );
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.contains("blocked in kernel"));
    assert!(page.contains("rank 0 (node n1, pid 26051) is in uninterruptible sleep (D) in write()"));
    let culprit = cell(&page, 0);
    assert!(culprit.contains("culprit"), "{culprit}");
    assert!(culprit.contains("data-node=\"n1\""), "{culprit}");
    assert!(culprit.contains("sD"), "{culprit}");
    assert!(culprit.contains("pid 26051"), "{culprit}");
    assert!(page.contains("◀ culprit: rank 0"));
    assert!(page.contains("write_log (/check/work/main/tests/python/rank.py:216)"));
    assert!(page.contains("percpu_rwsem_wait"));
    assert!(page.contains("NOT RESPONDING"));
    assert!(page.contains("write did not return within 2s"));
    assert!(
        page.contains("write timeout (2000 ms)"),
        "the probe's steps"
    );
    assert!(page.contains("step 2"), "the culprit's last output");
    assert!(page.contains("4.0 s"), "the hard threshold");
    assert!(page.contains("pid 26051 still in state D after SIGKILL"));
    assert!(page.contains("drain or reboot n1"));
    // The agent does not write progress.json yet: the page says so instead of failing.
    assert!(bundle
        .problems
        .iter()
        .any(|p| p.file == "progress.json" && p.problem == Problem::Missing));
    assert!(page.contains("<code>progress.json</code> is missing from this bundle"));
    assert!(!page.contains("<script"), "the page needs no script");
    assert!(only_svg_namespace(&page), "no external resource");
}

fn only_svg_namespace(page: &str) -> bool {
    page.matches("http").count() == page.matches("http://www.w3.org/2000/svg").count()
}

#[test]
fn a_coordinator_bundle_with_the_verdict_alone_renders_every_rank() {
    let bundle = Bundle::read(&fixture("coordinator")).expect("bundle reads");
    assert!(bundle.verdict_only());
    let page = render_html(&bundle);
    for rank in 0..3 {
        cell(&page, rank);
    }
    assert!(cell(&page, 0).contains("culprit"));
    assert!(!cell(&page, 1).contains("culprit"));
    keep("coordinator.html", &page);
    assert!(page.contains("merged verdict"));
    assert!(page.contains("3 ranks on 3 nodes"));
    assert!(
        !page.contains("is missing from this bundle"),
        "a merged verdict has no per-node files: not a problem to report"
    );
}

#[test]
fn everything_shown_is_escaped() {
    const EVIL: &str = "<script>alert(1)</script>\"'&";
    let dir = copy_of("node");
    let mut v = read_verdict(dir.path());
    let path = format!("/tmp/{EVIL}/rank0.log");
    v.summary = format!("rank 0 is stuck writing {path}");
    v.culprits[0].at.path = Some(path.clone());
    v.culprits[0].at.node = Some(format!("n1{EVIL}"));
    v.culprits[0].at.python_stack = Some(vec![format!("f ({path}:1)")]);
    v.culprits[0].reason = Some(EVIL.into());
    v.ranks[0].at.path = Some(path.clone());
    v.ranks[0].at.node = Some(format!("n1{EVIL}"));
    v.groups[0].where_ = EVIL.into();
    v.recommendations.push(EVIL.into());
    v.warnings.push(EVIL.into());
    v.nodes_not_seen.push(EVIL.into());
    v.filesystems[0].mount = EVIL.into();
    write_verdict(dir.path(), &v);
    std::fs::write(dir.path().join("output/rank-0.txt"), format!("{EVIL}\n")).expect("tail");
    std::fs::write(dir.path().join("kernel-log.txt"), format!("{EVIL}\n")).expect("kernel log");
    std::fs::write(dir.path().join("verdict.txt"), format!("{EVIL}\n")).expect("verdict.txt");

    let page = render_html(&Bundle::read(dir.path()).expect("bundle reads"));
    keep("escaped.html", &page);
    assert!(!page.contains("<script"), "unescaped markup in the page");
    assert!(!page.contains("alert(1)</"));
    assert!(!page.contains("\"'&"), "unescaped quotes or ampersand");
    let escaped = "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;";
    for (what, needle) in [
        ("summary", format!("stuck writing /tmp/{escaped}/rank0.log")),
        ("node attribute", format!("data-node=\"n1{escaped}\"")),
        ("recommendation", format!("<li>{escaped}</li>")),
        ("output tail", format!("<pre>{escaped}</pre>")),
    ] {
        assert!(page.contains(&needle), "{what} not shown escaped: {needle}");
    }
    assert!(page.matches(escaped).count() >= 10);
}

#[test]
fn broken_and_missing_optional_files_are_named_and_the_rest_still_renders() {
    let dir = copy_of("node");
    std::fs::write(dir.path().join("probes.json"), "{ not json").expect("write");
    std::fs::remove_file(dir.path().join("thresholds.json")).expect("rm");
    std::fs::write(dir.path().join("kernel-report.json"), "[]").expect("write");
    std::fs::remove_file(dir.path().join("run.json")).expect("rm");
    std::fs::create_dir(dir.path().join("run.json")).expect("a directory where a file belongs");
    std::fs::remove_dir_all(dir.path().join("output")).expect("rm");

    let bundle = Bundle::read(dir.path()).expect("only verdict.json is required");
    let problem = |file: &str| {
        bundle
            .problems
            .iter()
            .find(|p| p.file == file)
            .map(|p| p.problem.clone())
    };
    assert!(matches!(
        problem("probes.json"),
        Some(Problem::Unreadable(_))
    ));
    assert!(matches!(
        problem("kernel-report.json"),
        Some(Problem::Unreadable(_))
    ));
    assert!(matches!(problem("run.json"), Some(Problem::Unreadable(_))));
    assert_eq!(problem("thresholds.json"), Some(Problem::Missing));
    assert_eq!(problem("output/"), Some(Problem::Missing));
    assert!(!bundle.verdict_only());

    let page = render_html(&bundle);
    assert!(cell(&page, 0).contains("culprit"));
    assert!(page.contains("<code>probes.json</code> could not be read: not the expected JSON"));
    assert!(page.contains("<code>thresholds.json</code> is missing from this bundle"));
    assert!(page.contains("<code>kernel-report.json</code> could not be read"));
    assert!(page.contains("No <code>output/rank-0.txt</code> in this bundle"));
    assert!(
        page.contains("write did not return within 2s"),
        "the verdict's filesystems still show"
    );
}

#[test]
fn without_a_readable_verdict_the_error_names_the_file() {
    let nowhere = Path::new("/nonexistent/hangwatch-bundle");
    assert!(matches!(
        Bundle::read(nowhere),
        Err(ReportError::NoDirectory { .. })
    ));

    let dir = copy_of("node");
    std::fs::remove_file(dir.path().join("verdict.json")).expect("rm");
    let err = Bundle::read(dir.path()).expect_err("no verdict");
    assert!(matches!(err, ReportError::NoVerdict { .. }));
    assert!(err.to_string().contains("has no verdict.json"), "{err}");

    std::fs::write(dir.path().join("verdict.json"), "{\"kind\": 3}").expect("write");
    let err = Bundle::read(dir.path()).expect_err("bad verdict");
    assert!(matches!(err, ReportError::ParseVerdict { .. }));
    assert!(err.to_string().contains("verdict.json"), "{err}");

    let file = dir.path().join("verdict.txt");
    assert!(matches!(
        Bundle::read(&file),
        Err(ReportError::NotADirectory { .. })
    ));
}

#[test]
fn the_timeline_of_progress_json_is_drawn_with_the_stall_marked() {
    let dir = copy_of("node");
    let v = read_verdict(dir.path());
    let detected = v.observed_at_unix_s.expect("observed");
    let start = detected - 120.0;
    let points = (0..116u32)
        .map(|i| ProgressPoint {
            at_unix_s: start + f64::from(i),
            step: Some(u64::from(i / 2)),
            units: 3,
            ranks_progressing: 3,
        })
        .chain((116..120u32).map(|i| ProgressPoint {
            at_unix_s: start + f64::from(i),
            step: Some(57),
            units: 0,
            ranks_progressing: 0,
        }))
        .collect();
    let timeline = ProgressTimeline {
        started_at_unix_s: start,
        ranks: 3,
        points,
        threshold_s: Some(4.0),
        stall_detected_at_unix_s: Some(detected),
    };
    std::fs::write(
        dir.path().join("progress.json"),
        serde_json::to_vec(&timeline).expect("json"),
    )
    .expect("write");
    let page = render_html(&Bundle::read(dir.path()).expect("reads"));
    let svg = &page[page.find("<svg").expect("an svg")..page.find("</svg>").expect("svg end")];
    assert!(svg.contains("stall detected"));
    assert!(svg.contains("last progress"));
    assert!(svg.contains("no progress for 5.0 s"), "the stalled span");
    assert!(svg.contains("step 57"), "the step axis");
}

#[test]
fn kernel_log_findings_of_a_real_frozen_ext4_log_are_listed() {
    let log = include_str!("../../kmsg/tests/fixtures/frozen-ext4-linux-6.18-dmesg.txt");
    let dir = copy_of("node");
    std::fs::write(dir.path().join("kernel-log.txt"), log).expect("write");
    let report = hangwatch_kmsg::report_from_text(log);
    assert!(!report.hung_tasks.is_empty(), "the fixture has hung tasks");
    std::fs::write(
        dir.path().join("kernel-report.json"),
        serde_json::to_vec(&report).expect("json"),
    )
    .expect("write");
    let page = render_html(&Bundle::read(dir.path()).expect("reads"));
    assert!(page.contains("Hung tasks"));
    assert!(page.contains(&hangwatch_report::escape(&report.hung_tasks[0].summary)));
    assert!(page.contains("kernel-log line"));
}

/// A 10,000-rank job: 1,250 nodes of 8 ranks, rank 4242 in D, everyone else in a barrier.
fn big_verdict() -> Verdict {
    let mut v = Verdict::unknown(
        "rank 4242 (node node0530, pid 54242) is in uninterruptible sleep (D) in write() on /gpfs/run/log.txt",
    );
    v.kind = VerdictKind::BlockedInKernel;
    let node = |rank: u32| format!("node{:04}", rank / 8);
    let place = |rank: u32, state: &str, where_: &str| RankPlace {
        rank: Some(rank),
        node: Some(node(rank)),
        pid: 50000 + rank as i32,
        state: state.into(),
        where_: where_.into(),
        syscall: Some(if state == "D" { "write" } else { "futex" }.into()),
        ..RankPlace::default()
    };
    let barrier = "barrier (torch/distributed/distributed_c10d.py)";
    v.ranks = (0..10_000)
        .map(|r| RankReport {
            at: if r == 4242 {
                place(r, "D", "write_log (train.py)")
            } else {
                place(r, "S", barrier)
            },
            cpu_ms_during_sample: Some(0),
            threads: Vec::new(),
            threads_folded: 0,
            workers: Vec::new(),
        })
        .collect();
    v.culprits = vec![Culprit {
        at: place(4242, "D", "write_log (train.py)"),
        tid: None,
        killable: Some(false),
        kernel_stack: None,
        reason: None,
        worker: None,
        exit_code: None,
        death: None,
        thread_name: None,
        page_fault: None,
        lock_wait: None,
        threads: Vec::new(),
        deadlock: None,
        waits_on_peer: None,
    }];
    v.groups = vec![
        Group {
            where_: barrier.into(),
            state: "S".into(),
            ranks: (0..10_000).filter(|r| *r != 4242).collect(),
            pids: Vec::new(),
            nodes: (0..1250).map(|n| format!("node{n:04}")).collect(),
        },
        Group {
            where_: "write_log (train.py)".into(),
            state: "D".into(),
            ranks: vec![4242],
            pids: Vec::new(),
            nodes: vec![node(4242)],
        },
    ];
    v
}

#[test]
fn ten_thousand_ranks_render_compactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_verdict(dir.path(), &big_verdict());
    let bundle = Bundle::read(dir.path()).expect("reads");
    let started = Instant::now();
    let page = render_html(&bundle);
    let took = started.elapsed();
    keep("10k.html", &page);
    eprintln!(
        "10,000 ranks: {} bytes ({:.2} MB), rendered in {took:?}",
        page.len(),
        page.len() as f64 / 1e6
    );
    assert!(page.len() < 3_000_000, "{} bytes", page.len());
    assert_eq!(page.matches("data-rank=").count(), 10_000);
    assert_eq!(page.matches(" culprit\"").count(), 1);
    assert!(cell(&page, 4242).contains("data-node=\"node0530\""));
    assert!(page.contains("10000 ranks on 1250 nodes"));
    assert!(
        page.contains("grid flow"),
        "1250 node rows flow into columns"
    );
}

#[test]
fn a_recurring_cause_is_said_at_the_top_and_a_first_one_is_not() {
    let dir = copy_of("node");
    let mut v = read_verdict(dir.path());
    v.recurrence = Some(hangwatch_model::Recurrence {
        fingerprint: "0123456789abcdef".into(),
        seen_before: 2,
        last_nodes: vec!["n<b>3".into()],
        last_at_unix_s: Some(1_796_135_234.0),
        first_at_unix_s: Some(1_796_000_000.0),
        ..Default::default()
    });
    write_verdict(dir.path(), &v);
    let page = render_html(&Bundle::read(dir.path()).expect("bundle"));
    let top = &page[..page.find("</header>").expect("header")];
    assert!(top.contains("this cause was seen 2 times before"), "{top}");
    assert!(
        top.contains("last on node n&lt;b&gt;3 on 2026-12-01 14:27:14 UTC"),
        "{top}"
    );

    v.recurrence.as_mut().unwrap().seen_before = 0;
    write_verdict(dir.path(), &v);
    let page = render_html(&Bundle::read(dir.path()).expect("bundle"));
    assert!(!page.contains("class=\"recurrence\""));
}

#[test]
fn under_a_launcher_the_jobs_one_output_stream_stands_in_for_the_culprits() {
    let dir = copy_of("node");
    let output = dir.path().join("output");
    for entry in std::fs::read_dir(&output).expect("output dir") {
        std::fs::remove_file(entry.expect("entry").path()).expect("rm");
    }
    std::fs::write(
        output.join("job.txt"),
        "[default0]:step 41\n[default1]:step 41\n[default0]:<rank 0 wrote>\n",
    )
    .expect("job.txt");
    let page = render_html(&Bundle::read(dir.path()).expect("bundle"));
    assert!(page.contains("every rank together"), "no job output shown");
    assert!(
        page.contains("[default0]:&lt;rank 0 wrote&gt;"),
        "job output not escaped"
    );
    assert!(!page.contains("No <code>output/rank-"));
}

/// Issue 25: the last output of the culprit opens on its last line (the lines before it folded above), the
/// stuck thread is named, and a termination says which ranks ended.
#[test]
fn the_culprits_last_output_shows_its_last_line_last_and_its_stuck_thread_by_name() {
    let dir = copy_of("node");
    let lines: Vec<String> = (0..60).map(|i| format!("step {i} done")).collect();
    std::fs::write(
        dir.path().join("output/rank-0.txt"),
        lines.join("\n") + "\n",
    )
    .expect("rank 0 output");
    let mut v = read_verdict(dir.path());
    let pid = v.culprits[0].pid;
    v.culprits[0].tid = Some(pid + 7);
    v.culprits[0].thread_name = Some("ckpt-writer".into());
    v.actions.retain(|a| a.action != "terminate");
    v.actions.push(hangwatch_model::ActionRecord {
        action: "terminate".into(),
        ranks: vec![1, 2],
        ok: true,
        detail: Some("ranks 1-2 ended (2 by SIGTERM, 0 by SIGKILL) in 0.3s".into()),
        outcomes: Vec::new(),
    });
    write_verdict(dir.path(), &v);
    let page = render_html(&Bundle::read(dir.path()).expect("bundle reads"));
    keep("last-output.html", &page);
    let open = page
        .split("<pre class=\"tail\">")
        .nth(1)
        .and_then(|rest| rest.split("</pre>").next())
        .expect("the open tail");
    assert!(open.ends_with("step 59 done"), "{open}");
    assert!(open.starts_with("step 45 done"), "{open}");
    let folded = page
        .find("<summary>45 earlier lines</summary>")
        .expect("folded");
    assert!(
        folded < page.find("<pre class=\"tail\">").expect("tail"),
        "the earlier lines come first"
    );
    assert!(page.contains(&format!("<dd>ckpt-writer (tid {})</dd>", pid + 7)));
    assert!(
        page.contains(">ended</td>"),
        "ranks that ended did not fail"
    );
}
