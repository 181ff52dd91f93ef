//! `--action requeue`'s wiring: `hangwatch_slurm::requeue` talks to Slurm, and what it has to tell a person is
//! said here, on hangwatch's own output.

use std::time::Duration;

use hangwatch_agent::human::say;
use hangwatch_diagnosis::requeue::AttemptRecord;
use hangwatch_model::{ActionRecord, Verdict};
use hangwatch_slurm::requeue::{self, SlurmJob, Tell};

pub use hangwatch_slurm::requeue::{note_storage_wait, restart_env};

/// The requeue's lines, said as they come.
struct Said;

impl Tell for Said {
    fn line(&mut self, line: String) {
        say(line);
    }

    fn before_ending_this_job(&mut self) {
        hangwatch_agent::human::flush(Duration::from_secs(2));
    }
}

/// At the start of an attempt: what the previous one left, said in one line (when `say_it`).
pub fn previous_attempt(job: &SlurmJob, say_it: bool) -> Option<AttemptRecord> {
    match requeue::previous_attempt(job) {
        Ok(record) => {
            if let Some(record) = record.as_ref().filter(|_| say_it) {
                say(format!(
                    "hangwatch: attempt {} (job {}): {}",
                    job.attempt(Some(record)),
                    job.id,
                    record.summary()
                ));
            }
            record
        }
        Err(e) => {
            say(format!(
                "hangwatch: job {}: could not read what a previous attempt left: {e}",
                job.id
            ));
            None
        }
    }
}

/// After hangwatch ended a hung attempt: [`requeue::after_hang`], its lines said.
pub fn after_hang(
    job: &SlurmJob,
    verdict: &Verdict,
    previous: Option<AttemptRecord>,
    last_step: Option<u64>,
    max_requeues: u32,
    drain: bool,
    dir: &std::path::Path,
) -> (i32, ActionRecord) {
    requeue::after_hang(
        job,
        verdict,
        previous,
        last_step,
        max_requeues,
        drain,
        dir,
        &mut Said,
    )
}
