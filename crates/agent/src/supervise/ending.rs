//! How the run ends: the outcome of a hung job (exit 75, the termination added to the verdict, saved again), of a
//! job interrupted by a signal, and of one that ended by itself (the first rank's failure gives the exit code).

use super::*;

impl Supervisor {
    pub(super) fn finish(&mut self, ending: Ending) -> RunOutcome {
        let outcome = self.outcome(ending);
        self.save_final_thresholds();
        outcome
    }

    fn outcome(&mut self, ending: Ending) -> RunOutcome {
        match ending {
            Ending::Hung => self.finish_hung(),
            Ending::Interrupted(signal) => {
                let mut outcome = self.job_ended_by_itself(Some(signal));
                if let Some(report) = self.termination.take() {
                    self.report_termination(&report);
                    outcome.exit_code = 128 + signal;
                    outcome.termination = Some(report);
                }
                if let Some(verdict) = self.last_verdict.clone() {
                    self.save_final_verdict(&verdict);
                }
                outcome
            }
            Ending::ByItself => self.job_ended_by_itself(None),
            Ending::Left(signal) => RunOutcome {
                exit_code: 128 + signal,
                verdict: self.last_verdict.clone(),
                bundle: self.bundle.clone(),
                termination: None,
                interrupted_by: Some(signal),
                last_step: self.last_step,
            },
        }
    }

    /// Adds what the termination did to the last verdict and says who could not be killed.
    pub(super) fn report_termination(&mut self, report: &TerminationReport) {
        let node = self.config.node.as_deref().unwrap_or("this node");
        let procs = self.sampler.procs();
        report_termination(self.last_verdict.as_mut(), report, node, |pid| {
            procs.iter().find(|p| p.pid == pid).and_then(|p| p.rank)
        });
    }

    /// `thresholds.json` again, when the run held a stall back or its verdict came late: the holds, each ended, and
    /// why the verdict came late (the file a roll call wrote knew neither yet).
    fn save_final_thresholds(&mut self) {
        let now = self.now();
        self.stall_log
            .hold_ended(now, crate::stall_log::HoldEnd::JobEnded);
        let holds = self.stall_log.holds(now);
        if self.bundle.is_none() || (holds.is_empty() && self.late.is_none()) {
            return;
        }
        let Some(mut record) = self.kept_thresholds.clone() else {
            return;
        };
        record.holds = holds;
        record.late = self.late.clone();
        if let Err(e) = self.workers.save_thresholds(&record) {
            tracing::warn!(error = %e, "thresholds.json could not be written again");
            say(format!(
                "hangwatch: warning: thresholds.json could not be written again with the holds: {e}"
            ));
        }
    }

    /// The verdict files again, now with the actions taken (abandonable: the report directory may be frozen).
    pub(super) fn save_final_verdict(&mut self, verdict: &Verdict) {
        if let Err(e) = self.workers.save_verdict(verdict) {
            tracing::warn!(error = %e, "the final verdict could not be saved");
            say(format!(
                "hangwatch: warning: the final verdict could not be saved: {e}"
            ));
        }
    }

    pub(super) fn finish_hung(&mut self) -> RunOutcome {
        let report = self.termination.take().unwrap_or_default();
        self.report_termination(&report);
        let verdict = self.last_verdict.clone();
        if let Some(verdict) = &verdict {
            self.save_final_verdict(verdict);
        }
        RunOutcome {
            exit_code: EXIT_HUNG,
            verdict,
            bundle: self.bundle.clone(),
            termination: Some(report),
            interrupted_by: None,
            last_step: self.last_step,
        }
    }

    pub(super) fn job_ended_by_itself(&mut self, interrupted: Option<i32>) -> RunOutcome {
        let mut exits: Vec<(&Instant, i32)> = self
            .sampler
            .procs()
            .iter()
            .filter(|p| !p.discovered)
            .filter_map(|p| Some((p.exited_at.as_ref()?, shell_code(p.exit.as_ref()?))))
            .collect();
        exits.sort_by_key(|(at, _)| **at);
        let code = exits.iter().map(|(_, c)| *c).find(|c| *c != 0).unwrap_or(0);
        let code = match interrupted {
            Some(sig) if code == 0 || code > 128 => 128 + sig,
            _ => code,
        };
        RunOutcome {
            exit_code: code,
            verdict: self.last_verdict.clone(),
            bundle: self.bundle.clone(),
            termination: None,
            interrupted_by: interrupted,
            last_step: self.last_step,
        }
    }
}
