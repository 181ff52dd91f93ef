//! What the supervision loop does to the world: it starts its workers (roll call, termination), signals the job's
//! process groups and saves the final verdict, all through [`Workers`], so that the loop's decisions can be driven
//! in tests without processes. [`Threads`] is the real one: workers in threads that report back as events.

use std::path::PathBuf;
use std::sync::mpsc::SyncSender;
use std::time::Duration;

use hangwatch_model::Verdict;
use nix::sys::signal::Signal;

use crate::events::{Event, Investigation};
use crate::evidence::{verdict_files, write_abandonable, EvidenceFile, ThresholdsRecord};
use crate::investigation::EVIDENCE_DEADLINE;
use crate::policy::Trigger;
use crate::sampler::JobProc;
use crate::terminate::spawn_termination;

/// A roll call to run in a worker.
pub(crate) type RollCallWork = Box<dyn FnOnce() -> Investigation + Send>;

/// The loop's hands. A worker reports back as an [`Event`]; one that cannot start says so by its result, and the
/// loop gives itself the event instead.
pub(crate) trait Workers {
    /// Runs `work` in a worker named `name`; `Some`: it could not start, this is its report.
    fn investigate(&mut self, trigger: Trigger, name: &str, work: RollCallWork) -> Option<Event>;
    /// TERM, `grace`, KILL, `kill_wait` on `procs` in a worker ([`crate::terminate::terminate`]); `stuck`: the
    /// pids the verdict found blocked in the kernel.
    fn terminate(
        &mut self,
        procs: Vec<JobProc>,
        grace: Duration,
        kill_wait: Duration,
        stuck: Vec<i32>,
    ) -> std::io::Result<()>;
    /// Sends `signal` to each process group.
    fn signal_groups(&mut self, pgids: &[i32], signal: Signal);
    /// Writes the verdict files again, now with the actions taken (abandonable: the report directory may be
    /// frozen).
    fn save_verdict(&mut self, verdict: &Verdict) -> Result<(), String>;
    /// Writes `thresholds.json` again, now with the run's holds and why the verdict came late (abandonable).
    fn save_thresholds(&mut self, thresholds: &ThresholdsRecord) -> Result<(), String>;
}

/// Workers in threads (and abandonable children for the report directory).
pub(crate) struct Threads {
    pub(crate) events: SyncSender<Event>,
    /// hangwatch itself, for the abandonable evidence writer.
    pub(crate) program: PathBuf,
    pub(crate) report_dir: PathBuf,
    /// The job's container once found (a container client's job): ended through its runtime.
    pub(crate) container: crate::container::Shared,
}

impl Workers for Threads {
    fn investigate(&mut self, trigger: Trigger, name: &str, work: RollCallWork) -> Option<Event> {
        crate::investigation::spawn(&self.events, trigger, name, work)
    }

    fn terminate(
        &mut self,
        procs: Vec<JobProc>,
        grace: Duration,
        kill_wait: Duration,
        stuck: Vec<i32>,
    ) -> std::io::Result<()> {
        let events = self.events.clone();
        let client_exit = |procs: &[JobProc]| {
            procs
                .iter()
                .find(|p| !p.discovered)
                .and_then(|p| p.exit.as_ref())
                .map(crate::sampler::shell_code)
        };
        spawn_termination(
            procs,
            grace,
            kill_wait,
            stuck,
            self.container.get(),
            client_exit,
            move |report| {
                let _ = events.send(Event::Terminated(report));
            },
        )
    }

    fn signal_groups(&mut self, pgids: &[i32], signal: Signal) {
        for &pgid in pgids {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), signal);
        }
    }

    fn save_verdict(&mut self, verdict: &Verdict) -> Result<(), String> {
        write_abandonable(
            &self.program,
            &self.report_dir,
            &verdict_files(verdict),
            EVIDENCE_DEADLINE,
        )
        .map_err(|e| e.to_string())
    }

    fn save_thresholds(&mut self, thresholds: &ThresholdsRecord) -> Result<(), String> {
        write_abandonable(
            &self.program,
            &self.report_dir,
            &[EvidenceFile::json("thresholds.json", thresholds)],
            EVIDENCE_DEADLINE,
        )
        .map_err(|e| e.to_string())
    }
}
