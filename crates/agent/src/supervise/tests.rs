//! The loop's decisions on fake time: events and ticks fed to [`Supervisor`] with a clock moved by hand and
//! [`Workers`] that only record what they were asked. What the workers themselves do (roll calls, termination,
//! signals) is tested by the system tests, with real processes.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Mutex;

use hangwatch_model::RankSource;

use super::*;
use crate::sampler::JobProc;

/// What the loop asked of its workers.
#[derive(Debug, Default, Clone, PartialEq)]
struct Asked {
    roll_calls: Vec<Trigger>,
    /// The grace of each termination.
    terminations: Vec<Duration>,
    signals: Vec<(Vec<i32>, Signal)>,
    verdicts_saved: usize,
    /// Each `thresholds.json` written again: how its holds ended, and why the verdict came late.
    thresholds_saved: Vec<(Vec<Option<crate::stall_log::HoldEnd>>, Option<String>)>,
}

/// Records, never acts.
struct Recorder(Arc<Mutex<Asked>>);

impl Workers for Recorder {
    fn investigate(
        &mut self,
        trigger: Trigger,
        _: &str,
        _: crate::workers::RollCallWork,
    ) -> Option<Event> {
        self.0
            .lock()
            .expect("not poisoned")
            .roll_calls
            .push(trigger);
        None
    }

    fn terminate(
        &mut self,
        _: Vec<JobProc>,
        grace: Duration,
        _: Duration,
        _: Vec<i32>,
    ) -> std::io::Result<()> {
        self.0
            .lock()
            .expect("not poisoned")
            .terminations
            .push(grace);
        Ok(())
    }

    fn signal_groups(&mut self, pgids: &[i32], signal: Signal) {
        self.0
            .lock()
            .expect("not poisoned")
            .signals
            .push((pgids.to_vec(), signal));
    }

    fn save_verdict(&mut self, _: &Verdict) -> Result<(), String> {
        self.0.lock().expect("not poisoned").verdicts_saved += 1;
        Ok(())
    }

    fn save_thresholds(&mut self, thresholds: &ThresholdsRecord) -> Result<(), String> {
        self.0.lock().expect("not poisoned").thresholds_saved.push((
            thresholds.holds.iter().map(|h| h.ended).collect(),
            thresholds.late.as_ref().map(|l| l.words.clone()),
        ));
        Ok(())
    }
}

const GRACE: Duration = Duration::from_secs(7);
const STALL_AFTER: Duration = Duration::from_secs(10);

fn config() -> RunConfig {
    RunConfig {
        launch: LaunchSpec {
            command: vec!["train".into()],
            nproc: Some(1),
            socket: None,
            beats: None,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: None,
            env: Vec::new(),
            attach: Vec::new(),
            python_bootstrap: None,
            beat_socket: None,
        },
        detector: DetectorConfig {
            fixed: Some(STALL_AFTER),
            ..DetectorConfig::default()
        },
        on_hang: OnHang::Abort,
        grace: GRACE,
        kill_wait: Duration::from_secs(1),
        report_dir: PathBuf::from("/nonexistent/hangwatch-test"),
        console: None,
        prefix: false,
        sink: None,
        tick: Duration::from_secs(1),
        window: Duration::from_millis(100),
        stack_timeout: Duration::from_secs(1),
        probe_timeout: Duration::from_secs(1),
        node: None,
        job_id: None,
        alerter: Arc::new(Alerter::none()),
        history_db: None,
        history_fleet: None,
        failed_rank_grace: Duration::from_secs(30),
        fs_stall: Duration::ZERO,
        coordinator: None,
        metrics: None,
        instrument: false,
        kernel_log: None,
        keep_kernel_log: false,
    }
}

/// A rank of the job: this test process (alive, and never signalled: the workers only record), or one that
/// already exited with `exited`.
fn rank(exited: Option<ExitStatus>) -> JobProc {
    let pid = std::process::id() as i32;
    JobProc {
        waited: None,
        pid,
        pgid: pid,
        start: ProcFs::new("/proc").stat(pid).ok().map(|s| s.starttime),
        rank: Some(0),
        rank_source: Some(RankSource::EnvRank),
        exit: exited,
        exited_at: exited.map(|_| Instant::now()),
        discovered: false,
        identity: crate::death::RankIdentity::default(),
    }
}

/// A supervisor of `procs`, its clock at zero, and what it asks of its workers.
fn supervisor(procs: Vec<JobProc>) -> (Supervisor, Arc<Mutex<Asked>>, Receiver<Event>) {
    let config = config();
    let (tx, rx) = sync_channel::<Event>(EVENT_CAPACITY);
    let asked = Arc::new(Mutex::new(Asked::default()));
    let members = Arc::new(JobMembers::new());
    let tails = Arc::new(Tails::new(10));
    let kernel_log = KernelLog::default();
    let sampler = Sampler::new(SamplerParts {
        procs,
        tree_mode: false,
        attached: false,
        prober: None,
        members: Arc::clone(&members),
        events: tx.clone(),
        reaper: None,
        stack_readers: None,
        node_rank: None,
    });
    let start = Instant::now();
    let sup = Supervisor {
        detector: Detector::new(config.detector.clone(), Duration::ZERO),
        policy: policy_of(&config),
        config,
        workers: Box::new(Recorder(Arc::clone(&asked))),
        sampler,
        start,
        witnesses: crate::death::Witnesses::of_this_node(kernel_log.clone(), Arc::clone(&tails)),
        kernel_log,
        tails,
        console: None,
        events: tx,
        board: Arc::new(ProgressBoard::new()),
        members,
        last_verdict: None,
        bundle: None,
        termination: None,
        heartbeats: Arc::default(),
        program: PathBuf::from("hangwatch"),
        last_step: None,
        link: None,
        beat_slots: None,
        last_slot_look: None,
        own_events: VecDeque::new(),
        linked: false,
        ordered_observations: None,
        ordered_verdict: None,
        timeline: crate::timeline::TimelineRecorder::new(unix_time_of(start)),
        collectives: None,
        recorded: Default::default(),
        stall_log: Default::default(),
        kept_thresholds: None,
        late: None,
    };
    (sup, asked, rx)
}

/// Moves the supervisor's clock on by `by` (its `now` is the time since its start).
fn advance(sup: &mut Supervisor, by: Duration) {
    sup.start = sup
        .start
        .checked_sub(by)
        .expect("the machine has been up longer than the test's clock");
}

fn asked(of: &Arc<Mutex<Asked>>) -> Asked {
    of.lock().expect("not poisoned").clone()
}

/// A hang the roll call found: no rank computing.
fn hung_verdict() -> Verdict {
    Verdict::unknown("every rank waits")
}

#[test]
fn a_stall_past_the_threshold_takes_a_roll_call_then_ends_the_job_and_exits_75() {
    let (mut sup, workers, _rx) = supervisor(vec![rank(None)]);
    sup.detector
        .progress(Some(0), ProgressSource::Heartbeat, Duration::ZERO);
    advance(&mut sup, STALL_AFTER / 4);
    assert!(sup.tick().is_none());
    assert_eq!(
        asked(&workers),
        Asked::default(),
        "progress 2.5 s ago is no stall"
    );

    advance(&mut sup, STALL_AFTER);
    assert!(sup.tick().is_none());
    assert_eq!(asked(&workers).roll_calls, [Trigger::Hard]);
    assert!(
        asked(&workers).terminations.is_empty(),
        "nothing is ended before the roll call is in"
    );

    let found = Investigation {
        trigger: Trigger::Hard,
        verdict: hung_verdict(),
        evidence: None,
    };
    assert!(sup
        .handle_event(Event::Investigated(Box::new(found)))
        .is_none());
    assert_eq!(
        asked(&workers).terminations,
        [GRACE],
        "SIGTERM with the grace, then SIGKILL"
    );

    let outcome = sup
        .handle_event(Event::Terminated(TerminationReport::default()))
        .expect("the run ends once the job is ended");
    assert_eq!(outcome.exit_code, EXIT_HUNG);
    assert_eq!(outcome.verdict.map(|v| v.kind), Some(hung_verdict().kind));
    assert_eq!(
        asked(&workers).verdicts_saved,
        1,
        "the verdict is saved again with the actions taken"
    );
}

/// rank 0 copying while its peers wait: work, though no progress.
fn working_verdict() -> Verdict {
    let mut verdict = Verdict::unknown("working in silence");
    verdict.activity = Some(hangwatch_model::Activity {
        ranks: vec![0],
        pids: vec![std::process::id() as i32],
        where_: "copy (job.py)".into(),
        of_ranks: 1,
        waiting: 0,
        waiting_where: None,
        summary: "rank 0 moves data (131 KB/s read or written) in copy (job.py)".into(),
    });
    verdict
}

#[test]
fn a_hold_that_ends_when_the_work_stops_is_kept_with_why_the_verdict_came_late() {
    let (mut sup, workers, _rx) = supervisor(vec![rank(None)]);
    // Learned thresholds (a hold is allowed): 10 s hard, 5 s soft, looks every 30 s while held.
    sup.config.detector = DetectorConfig {
        fixed: None,
        floor: Duration::from_secs(10),
        warmup: Duration::from_secs(10),
        ceiling: Duration::from_secs(300),
        ..DetectorConfig::default()
    };
    sup.detector = Detector::new(sup.config.detector.clone(), Duration::ZERO);
    sup.policy = policy_of(&sup.config);
    sup.detector
        .progress(Some(0), ProgressSource::Heartbeat, Duration::ZERO);
    let look = |sup: &mut Supervisor, trigger: Trigger, verdict: Verdict| {
        let evidence =
            (trigger != Trigger::Recheck).then(|| Ok(PathBuf::from("/nonexistent/bundle")));
        sup.handle_event(Event::Investigated(Box::new(Investigation {
            trigger,
            verdict,
            evidence,
        })))
    };
    for (after, trigger, verdict) in [
        (6, Trigger::Soft, working_verdict()),
        (5, Trigger::Hard, working_verdict()),
        (31, Trigger::Recheck, hung_verdict()),
        (6, Trigger::ConfirmStop, hung_verdict()),
    ] {
        advance(&mut sup, Duration::from_secs(after));
        assert!(sup.tick().is_none());
        assert_eq!(asked(&workers).roll_calls.last(), Some(&trigger));
        assert!(look(&mut sup, trigger, verdict).is_none());
    }
    assert_eq!(
        asked(&workers).terminations,
        [GRACE],
        "the work stopped: ended"
    );
    let outcome = sup
        .handle_event(Event::Terminated(TerminationReport::default()))
        .expect("the run ends once the job is ended");
    assert_eq!(outcome.exit_code, EXIT_HUNG);
    let saved = asked(&workers).thresholds_saved;
    assert_eq!(
        saved.len(),
        1,
        "thresholds.json written again once: {saved:?}"
    );
    assert_eq!(
        saved[0].0,
        [Some(crate::stall_log::HoldEnd::WorkStopped)],
        "one hold, ended when the work stopped"
    );
    let words = saved[0].1.clone().unwrap_or_default();
    assert!(
        words.starts_with("the verdict came 38s after the 10s threshold: ")
            && words.contains(
                "held back while rank 0 moves data (131 KB/s read or written) in copy (job.py)"
            )
            && words.contains("for a second look confirming the work stopped"),
        "{words}"
    );
}

#[test]
fn a_job_whose_ranks_all_finish_ends_the_run_with_0() {
    let (mut sup, workers, _rx) = supervisor(vec![rank(Some(ExitStatus::from_raw(0)))]);
    let outcome = sup.tick().expect("nothing is left to watch");
    assert_eq!(outcome.exit_code, 0);
    assert!(outcome.termination.is_none());
    assert_eq!(asked(&workers), Asked::default());
}

#[test]
fn a_job_that_ended_after_a_rank_failed_gets_a_post_mortem_then_exits_with_that_ranks_code() {
    let (mut sup, workers, _rx) = supervisor(vec![rank(Some(ExitStatus::from_raw(3 << 8)))]);
    assert!(sup.tick().is_none(), "how the rank died is found out first");
    assert_eq!(asked(&workers).roll_calls, [Trigger::PostMortem]);
    let found = Investigation {
        trigger: Trigger::PostMortem,
        verdict: Verdict::unknown("rank 0 exited with 3"),
        evidence: None,
    };
    let outcome = sup
        .handle_event(Event::Investigated(Box::new(found)))
        .expect("the post mortem ends the run");
    assert_eq!(outcome.exit_code, 3);
    assert!(outcome.termination.is_none());
    assert!(asked(&workers).terminations.is_empty());
}

#[test]
fn a_signal_to_a_job_that_makes_progress_is_passed_on_and_the_run_exits_as_the_job_did() {
    let (mut sup, workers, _rx) = supervisor(vec![rank(None)]);
    sup.detector
        .progress(Some(0), ProgressSource::Heartbeat, Duration::ZERO);
    advance(&mut sup, Duration::from_millis(500));
    assert!(sup.handle_event(Event::Signal(15)).is_none());
    let pid = std::process::id() as i32;
    assert_eq!(asked(&workers).signals, [(vec![pid], Signal::SIGTERM)]);
    assert!(
        asked(&workers).roll_calls.is_empty(),
        "a job making progress is not inspected first"
    );

    sup.sampler = Sampler::new(SamplerParts {
        procs: vec![rank(Some(ExitStatus::from_raw(15)))],
        tree_mode: false,
        attached: false,
        prober: None,
        members: Arc::new(JobMembers::new()),
        events: sup.events.clone(),
        reaper: None,
        stack_readers: None,
        node_rank: None,
    });
    advance(&mut sup, Duration::from_secs(1));
    let outcome = sup.tick().expect("the job ended after the signal");
    assert_eq!(outcome.exit_code, 128 + 15);
    assert_eq!(outcome.interrupted_by, Some(15));
    assert!(
        asked(&workers).terminations.is_empty(),
        "a job that ends within the grace is not killed"
    );
}

#[test]
fn a_signal_while_the_job_is_stuck_keeps_the_evidence_before_passing_it_on() {
    let (mut sup, workers, _rx) = supervisor(vec![rank(None)]);
    sup.detector
        .progress(Some(0), ProgressSource::Heartbeat, Duration::ZERO);
    advance(&mut sup, STALL_AFTER * 6 / 10);
    assert!(sup.handle_event(Event::Signal(15)).is_none());
    assert_eq!(
        asked(&workers).roll_calls,
        [Trigger::Signal(15)],
        "6 s without progress is past the soft threshold: the job is stuck"
    );
    assert!(
        asked(&workers).signals.is_empty(),
        "the signal waits for the evidence"
    );
    let found = Investigation {
        trigger: Trigger::Signal(15),
        verdict: hung_verdict(),
        evidence: None,
    };
    assert!(sup
        .handle_event(Event::Investigated(Box::new(found)))
        .is_none());
    let pid = std::process::id() as i32;
    assert_eq!(asked(&workers).signals, [(vec![pid], Signal::SIGTERM)]);
}

#[test]
fn an_event_the_loop_gives_itself_never_waits_on_a_full_channel_and_comes_first() {
    let (tx, rx) = sync_channel::<Event>(2);
    tx.try_send(Event::Signal(1)).expect("room");
    tx.try_send(Event::Signal(2)).expect("room");
    assert!(
        matches!(
            tx.try_send(Event::Signal(3)),
            Err(std::sync::mpsc::TrySendError::Full(_))
        ),
        "the channel is full: a blocking send from the loop's own thread would never return"
    );
    let mut own = VecDeque::new();
    own.push_back(Event::Terminated(TerminationReport::default()));
    let order: Vec<String> = (0..3)
        .map(|_| match next_event(&mut own, &rx, Duration::ZERO) {
            Ok(Event::Terminated(_)) => "terminated".to_owned(),
            Ok(Event::Signal(n)) => format!("signal {n}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(order, ["terminated", "signal 1", "signal 2"]);
    assert!(matches!(
        next_event(&mut own, &rx, Duration::from_millis(1)),
        Err(RecvTimeoutError::Timeout)
    ));
}
