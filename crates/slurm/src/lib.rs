//! hangwatch's side of Slurm: what a job step's environment says about where it runs ([`step`]), a job's
//! options as Slurm's JSON describes them ([`job_json`]), the commands of `--action requeue` ([`requeue`]), and
//! the steps running on this machine, found from outside them ([`steps`]), and how the node services of one job
//! agree on its coordinator's secret through MUNGE ([`munge`]).
//! Nothing here prints: what a person should read is returned (or handed to a [`requeue::Tell`]).

pub mod ids;
pub mod job_json;
pub mod munge;
pub mod records;
pub mod requeue;
pub mod step;
pub mod steps;
