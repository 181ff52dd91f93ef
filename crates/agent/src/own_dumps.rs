//! Where the job's own Flight Recorder dumps are (`<TORCH_FR_DUMP_TEMP_FILE><rank>`, pickled, written by torch
//! after its own collective timeout or when the job asks) and whose they must be: the ranks' user. Read at a roll
//! call for the ranks that did not answer it, by the reader child (`hangwatch_inspect::own_dumps`;
//! `hangwatch_inspect::dump_files` says which files are trusted and why), never in this process: the prefix may be on the filesystem that stopped, and
//! a dump is whatever its writer made it.

use std::path::Path;
use std::time::Duration;

use hangwatch_inspect::own_dumps::{read_own_dumps, OwnDumps, OwnDumpsRequest};
use hangwatch_proc::ProcFs;

/// How long looking for, reading and decoding every rank's dump may take.
const READ_DEADLINE: Duration = Duration::from_secs(2);
use hangwatch_inspect::own_dumps::TORCH_DEFAULT_PREFIX;

/// The prefix of the job's dump files when no rank's environment can be read: hangwatch's own
/// `TORCH_FR_DUMP_TEMP_FILE` (`TORCH_NCCL_DEBUG_INFO_TEMP_FILE` before torch 2.5), which the ranks it starts
/// inherit, else torch's default.
pub(crate) fn prefix(get: impl Fn(&str) -> Option<String>) -> String {
    ["TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
        .iter()
        .find_map(|k| get(k).filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| TORCH_DEFAULT_PREFIX.to_string())
}

/// The job's user: the effective uid the kernel gives the ranks (`/proc/PID/status`, which never takes a rank's
/// memory-map lock). `Err` when the ranks run as different users (whose dumps would be whose?); hangwatch's own
/// euid when no rank can be read.
pub(crate) fn job_uid(procfs: &ProcFs, pids: &[i32]) -> Result<u32, String> {
    let mut uids: Vec<u32> = pids
        .iter()
        .filter_map(|&pid| procfs.status(pid).ok()?.euid)
        .collect();
    uids.sort_unstable();
    uids.dedup();
    match uids.as_slice() {
        [] => Ok(own_euid()),
        [uid] => Ok(*uid),
        more => Err(format!(
            "the ranks run as different users ({more:?}): whose dumps they would be is unclear"
        )),
    }
}

fn own_euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Reads the dumps of `ranks` under the prefix the environment of the first readable of `prefix_from` says
/// (else `prefix`), written since `since_unix_s` by `owner_uid`, in a reader child (`program __inspect-child
/// --serve`) under a deadline.
pub(crate) fn read(
    program: &Path,
    prefix_from: &[i32],
    prefix: &str,
    ranks: &[u32],
    since_unix_s: u64,
    owner_uid: u32,
    keep: usize,
) -> OwnDumps {
    let request = OwnDumpsRequest {
        prefix_from: prefix_from.to_vec(),
        prefix: prefix.to_string(),
        ranks: ranks.to_vec(),
        since_unix_s,
        owner_uid,
        keep,
    };
    read_own_dumps(program, &request, READ_DEADLINE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jobs_prefix_wins_else_torchs_default() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            prefix(env(&[("TORCH_FR_DUMP_TEMP_FILE", "/scratch/fr_")])),
            "/scratch/fr_"
        );
        assert_eq!(
            prefix(env(&[("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/old/nccl_")])),
            "/old/nccl_"
        );
        assert_eq!(prefix(env(&[])), TORCH_DEFAULT_PREFIX);
    }

    #[test]
    fn the_job_is_the_ranks_user() {
        let procfs = ProcFs::new("/proc");
        let me = std::process::id() as i32;
        assert_eq!(job_uid(&procfs, &[me]), Ok(own_euid()));
        assert_eq!(
            job_uid(&procfs, &[]),
            Ok(own_euid()),
            "no rank: hangwatch's own"
        );
    }
}
