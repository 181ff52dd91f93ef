//! The loop's actions that start workers: what a roll call, the coordinator's orders, a post mortem and a
//! termination copy out of the loop's state, and the computing alert.

use super::*;

impl Supervisor {
    /// The warning alert that the job computes without progress and is not ended for it (once per stall).
    pub(super) fn alert_computing(&self) {
        let Some(verdict) = &self.last_verdict else {
            return;
        };
        let mut message = Alert::new(Stage::Computing, verdict, unix_now());
        message.job = self.config.job_id.clone();
        message.node = self.config.node.clone();
        message.evidence = self.bundle.as_ref().map(|dir| {
            format!(
                "{}:{}",
                self.config.node.as_deref().unwrap_or("this node"),
                dir.display()
            )
        });
        self.config.alerter.send(&message);
    }

    pub(super) fn thresholds_record(
        &self,
        threshold: &Threshold,
        stalled_for: Duration,
    ) -> ThresholdsRecord {
        let mut record = ThresholdsRecord::new(self.detector.config(), threshold, stalled_for);
        record.holds = self.stall_log.holds(self.now());
        record
    }

    pub(super) fn run_record(&self) -> RunRecord {
        RunRecord {
            hangwatch_version: env!("CARGO_PKG_VERSION").to_string(),
            node: self.config.node.clone(),
            command: self
                .config
                .launch
                .command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            nproc: self.config.launch.nproc,
            pids: self
                .sampler
                .procs()
                .iter()
                .map(|p| crate::evidence::PidRecord {
                    pid: p.pid,
                    rank: p.rank,
                })
                .collect(),
            running_for_s: self.now().as_secs_f64(),
            heartbeats: self.heartbeats.counts(),
            console_lines_dropped: self.console.as_ref().map(Console::dropped),
            messages_dropped: crate::human::dropped(crate::human::Stream::Stderr),
            rollcall: None,
        }
    }

    /// Starts the roll call worker: roll call, evidence (in an abandonable child), alert. Everything it needs is
    /// copied out of the loop's state now, so the loop goes on at once.
    pub(super) fn start_investigation(&mut self, trigger: Trigger) {
        let now = self.now();
        let stalled_for = self.detector.stalled_for(now);
        let threshold = self.detector.threshold();
        let (tier_threshold, basis) = match trigger {
            Trigger::Soft => (threshold.soft, threshold.basis.as_str()),
            Trigger::FsStall => (
                self.config.fs_stall,
                "--fs-stall, whatever the learned threshold",
            ),
            _ => (threshold.hard, threshold.basis.as_str()),
        };
        // A recheck of ranks seen computing is said only when it finds the work stopped.
        if trigger != Trigger::Recheck {
            // Said as seen: the fast path names the rank and how it is blocked (stopped, or a filesystem wait).
            let seen = match trigger {
                Trigger::FsStall => self
                    .sampler
                    .fs_stuck(now)
                    .map_or_else(|| trigger.describe(), |stuck| stuck.words()),
                _ => trigger.describe(),
            };
            say(format!(
                "hangwatch: {} for {:.1}s ({seen}; threshold {:.0}s, {basis}): taking a roll call",
                ProgressSource::missing_words(self.detector.source()),
                stalled_for.as_secs_f64(),
                tier_threshold.as_secs_f64(),
            ));
        }
        let job = self.investigation_job(trigger);
        self.spawn_investigation(trigger, "hw-rollcall", move || job.run());
    }

    /// A roll call the coordinator ordered: this node's observations go back to it as soon as they are taken
    /// (and are kept for this node's evidence); the coordinator decides.
    pub(super) fn start_ordered_roll_call(
        &mut self,
        roll_call_id: u64,
        deadline: Duration,
        probe_mounts: Vec<String>,
        answers: Answers,
    ) {
        let also = if probe_mounts.is_empty() {
            String::new()
        } else {
            format!(", probing {} too", probe_mounts.join(", "))
        };
        say(format!(
            "hangwatch: the coordinator asks for a roll call of this node (answer within {:.0}s{also})",
            deadline.as_secs_f64()
        ));
        let mut job = self.investigation_job(Trigger::Ordered);
        job.options.extra_probes = probe_mounts;
        investigation::spawn_ordered_roll_call(job, roll_call_id, answers, self.events.clone());
    }

    /// The coordinator ended the job: this node's evidence is the job-wide verdict with this node's own
    /// observations (from the roll call it answered), written while the ranks are being ended.
    pub(super) fn start_ordered_evidence(&mut self) {
        let job = self.investigation_job(Trigger::Ordered);
        let verdict = self
            .ordered_verdict
            .clone()
            .unwrap_or_else(|| Verdict::unknown("the coordinator ended the job"));
        let observations = self.ordered_observations.clone().unwrap_or_else(|| {
            let mut o = NodeObservations::new(self.config.node.clone(), 0);
            o.unreadable
                .push("this node's roll call did not finish before the coordinator's order".into());
            o
        });
        self.spawn_investigation(Trigger::Ordered, "hw-evidence", move || {
            // A large job's verdict lists few rows: this node's own come from its own roll call.
            let verdict = hangwatch_diagnosis::rollcall::with_own_rows(verdict, &observations);
            job.keep(verdict, &observations, false)
        });
    }

    /// Starts a roll call worker; one that cannot start reports its failure as the loop's own next event.
    pub(super) fn spawn_investigation(
        &mut self,
        trigger: Trigger,
        name: &str,
        work: impl FnOnce() -> Investigation + Send + 'static,
    ) {
        let stalled_for = self.detector.stalled_for(self.now());
        self.stall_log.look_started(trigger, stalled_for);
        if let Some(failed) = self.workers.investigate(trigger, name, Box::new(work)) {
            self.own_events.push_back(failed);
        }
    }

    /// Everything a roll call worker needs, copied out of the loop's state.
    pub(super) fn investigation_job(&mut self, trigger: Trigger) -> InvestigationJob {
        let now = self.now();
        let stalled_for = self.detector.stalled_for(now);
        let threshold = self.detector.threshold();
        let ranks = self.sampler.rank_pids();
        let pids: Vec<i32> = ranks.iter().map(|(p, _)| *p).collect();
        let timeline = self.timeline.snapshot(
            u32::try_from(pids.len()).unwrap_or(u32::MAX),
            Some(threshold.hard.as_secs_f64()),
            Some(unix_now()),
        );
        let known: HashMap<i32, KnownProcess> = self
            .sampler
            .procs()
            .iter()
            .filter(|p| pids.contains(&p.pid))
            .map(|p| {
                let known = KnownProcess {
                    rank: p.rank,
                    rank_source: p.rank_source,
                    exited: p.exit.is_some() || p.exited_at.is_some(),
                    exit_code: p.exit.as_ref().map(shell_code),
                    exited_at_unix_s: p.exited_at.map(unix_time_of),
                };
                (p.pid, known)
            })
            .collect();
        let stacks = StackReadOptions::for_self()
            .unwrap_or_else(|_| StackReadOptions {
                program: self.program.clone(),
                per_pid_timeout: self.config.stack_timeout,
                total_timeout: self.config.stack_timeout,
                parallelism: 2,
            })
            .with_timeouts(self.config.stack_timeout, pids.len());
        let options = RollCallOptions {
            extra_probes: Vec::new(),
            window: self.config.window,
            read_stacks: true,
            stacks,
            prepared: self.sampler.stack_readers().cloned(),
            node: self.config.node.clone(),
            earlier: self.sampler.earlier().clone(),
        };
        let thresholds = self.thresholds_record(&threshold, stalled_for);
        if trigger != Trigger::Recheck {
            // A hold's periodic look keeps no evidence.
            self.kept_thresholds = Some(thresholds.clone());
        }
        InvestigationJob {
            trigger,
            stalled_for_s: stalled_for.as_secs_f64(),
            pids,
            known,
            options,
            probe_timeout: self.config.probe_timeout,
            prober: Arc::clone(self.sampler.prober()),
            thresholds,
            timeline,
            run: self.run_record(),
            kernel_log: self.kernel_log.text(),
            kernel_log_unavailable: self.kernel_log.unavailable.clone(),
            kernel_log_keeping: self.kernel_log.keeping.clone(),
            tails: self.tails.snapshot(),
            report_dir: self.config.report_dir.clone(),
            program: self.program.clone(),
            alerter: Arc::clone(&self.config.alerter),
            history_db: self.config.history_db.clone(),
            history_fleet: self.config.history_fleet.clone(),
            job_id: self.config.job_id.clone(),
            node: self.config.node.clone(),
            dead: self.sampler.dead_ranks(),
            witnesses: self.witnesses.clone(),
            collectives: self.collectives.clone(),
            recorded: self.recorded.clone(),
            container: self.sampler.container().cloned(),
        }
    }

    /// The job ended by itself after a rank failed: a worker writes down who died first and how (waiting briefly
    /// for the kernel log and the last lines), keeps it as evidence and makes it the run's verdict.
    pub(super) fn start_post_mortem(&mut self) {
        say("hangwatch: the job ended after a rank failed: finding out how it died".to_string());
        let job = self.investigation_job(Trigger::PostMortem);
        self.spawn_investigation(Trigger::PostMortem, "hw-postmortem", move || {
            job.post_mortem()
        });
    }

    /// Starts the termination worker: TERM, grace, KILL (or KILL at once), then the unkillable are reported.
    pub(super) fn start_termination(&mut self, kill_now: bool) {
        let grace = if kill_now {
            Duration::ZERO
        } else {
            self.config.grace
        };
        // Ranks held in a collective behind a stuck one cannot act on SIGTERM either: the grace ends when only
        // such processes are left.
        let mut stuck = stuck_pids(self.last_verdict.as_ref(), self.config.node.as_deref());
        stuck.extend(held_pids(
            self.last_verdict.as_ref(),
            self.config.node.as_deref(),
        ));
        let spawned = self.workers.terminate(
            self.sampler.procs().to_vec(),
            grace,
            self.config.kill_wait,
            stuck,
        );
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the termination; killing the job from the loop");
            let all: Vec<i32> = self.sampler.procs().iter().map(|p| p.pgid).collect();
            self.workers.signal_groups(&all, Signal::SIGKILL);
            self.own_events
                .push_back(Event::Terminated(TerminationReport::default()));
        }
    }
}
