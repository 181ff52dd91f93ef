//! `hangwatch doctor`'s knowledge: what on this host would make a hang silent (the kernel or PyTorch would never
//! report it) or hangwatch blind (it could not see or act), each with its fix.
//!
//! Two halves: [`HostFacts::gather`] reads plain facts (the process's rights, sysctls, the environment, which mount
//! holds each directory hangwatch uses) from a movable /proc root, without ever touching a path that may sit on a
//! frozen mount; [`diagnose`] turns them into a checklist of [`Finding`]s, passed ones included, as a pure function.
//! [`startup_warnings`] picks the lines `hangwatch run` says before the job starts. On a node with the node service,
//! `doctor` alone also gathers [`NodeServiceFacts`] (slurm.conf's TaskProlog, read by [`slurm_conf`]). See
//! `docs/doctor.md`.

mod checklist;
mod diagnose;
mod facts;
pub mod slurm_conf;

pub use checklist::{checklist, Glyphs};
pub use diagnose::{
    diagnose, startup_warnings, Check, Finding, Severity, HUGE_TIMEOUT_S, MIN_DGRAM_QLEN,
    RECOMMENDED_DGRAM_QLEN,
};
pub use facts::{
    Access, Capabilities, GatherOptions, HostFacts, MountFact, NodeServiceFacts, PathFact,
    PathRole, SysctlValue, Sysctls, RELEVANT_ENV,
};
