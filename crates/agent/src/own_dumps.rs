//! The Flight Recorder dumps a job wrote itself: `<TORCH_FR_DUMP_TEMP_FILE><rank>`, pickled, which torch writes
//! after its own collective timeout (or when the job asks). Read at a roll call for the ranks that did not answer
//! it, from files written since the job started, each in a child under a deadline: the prefix may name a shared
//! filesystem, and that one may be the one that stopped.

use std::time::Duration;

use hangwatch_model::MAX_FLIGHT_RECORDER_DUMP_BYTES as MAX_DUMP_BYTES;

/// How long looking for and reading every rank's dump may take.
const READ_DEADLINE: Duration = Duration::from_secs(2);
/// Where torch writes the dumps when the job did not say.
const TORCH_DEFAULT_PREFIX: &str = "/tmp/nccl_trace_rank_";

/// The prefix of the job's dump files: `TORCH_FR_DUMP_TEMP_FILE` (`TORCH_NCCL_DEBUG_INFO_TEMP_FILE` before torch
/// 2.5), else torch's default.
pub(crate) fn prefix(get: impl Fn(&str) -> Option<String>) -> String {
    ["TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
        .iter()
        .find_map(|k| get(k).filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| TORCH_DEFAULT_PREFIX.to_string())
}

/// What looking for the ranks' dumps came to.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct OwnDumps {
    /// Each rank's dump written since the job started.
    pub(crate) read: Vec<(u32, Vec<u8>)>,
    /// What could not be read, in words (a file too large, a read that did not finish in time).
    pub(crate) problems: Vec<String>,
}

/// One child looks at every rank's file: `[ -f ]` is a shell builtin, so ranks without a dump cost no process of
/// their own. For each regular file modified since `$1` it prints `file SIZE RANK` and the bytes, or `big SIZE
/// RANK` past `$2` bytes.
const READ_SCRIPT: &str = r#"since=$1; max=$2; prefix=$3; shift 3
for rank in "$@"; do
  path="$prefix$rank"
  [ -f "$path" ] || continue
  [ "$(stat -c %Y -- "$path")" -ge "$since" ] || continue
  size=$(stat -c %s -- "$path")
  if [ "$size" -gt "$max" ]; then printf 'big %s %s\n' "$size" "$rank"; continue; fi
  printf 'file %s %s\n' "$size" "$rank"
  head -c "$size" -- "$path"
done"#;

/// Reads the dumps under `prefix` of `ranks` written since `since_unix_s`, in one child under a deadline.
pub(crate) fn read(prefix: &str, ranks: &[u32], since_unix_s: u64) -> OwnDumps {
    let mut command = hangwatch_child::external_command("sh");
    command
        .args(["-c", READ_SCRIPT, "sh"])
        .arg(since_unix_s.to_string())
        .arg(MAX_DUMP_BYTES.to_string())
        .arg(prefix)
        .args(ranks.iter().map(u32::to_string));
    let mut found = OwnDumps::default();
    match hangwatch_child::run_with_deadline(command, READ_DEADLINE) {
        Ok(hangwatch_child::ChildOutcome::Finished { stdout, .. }) => {
            parse(&stdout, prefix, &mut found);
        }
        Ok(hangwatch_child::ChildOutcome::TimedOut { stdout, .. }) => {
            parse(&stdout, prefix, &mut found);
            found.problems.push(format!(
                "the dumps under {prefix} were not all read within {}: their filesystem may have stopped",
                hangwatch_model::format_duration(READ_DEADLINE)
            ));
        }
        Err(e) => found
            .problems
            .push(format!("cannot look for dumps under {prefix}: {e}")),
    }
    found
}

/// The child's output: headers and bytes; a dump cut short (a timeout, a file that shrank) is left out.
fn parse(mut out: &[u8], prefix: &str, found: &mut OwnDumps) {
    while let Some(end) = out.iter().position(|&b| b == b'\n') {
        let header = String::from_utf8_lossy(&out[..end]).into_owned();
        out = &out[end + 1..];
        let words: Vec<&str> = header.split(' ').collect();
        let (Some(size), Some(rank)) = (
            words.get(1).and_then(|w| w.parse::<usize>().ok()),
            words.get(2).and_then(|w| w.parse::<u32>().ok()),
        ) else {
            return;
        };
        match words[0] {
            "big" => found.problems.push(format!(
                "{prefix}{rank}: {size} bytes, more than the {MAX_DUMP_BYTES} read"
            )),
            "file" if out.len() >= size => {
                found.read.push((rank, out[..size].to_vec()));
                out = &out[size..];
            }
            _ => return,
        }
    }
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
    fn fresh_dumps_are_read_whole_old_or_absent_ones_are_not() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let prefix = format!("{}/fr_", tmp.path().display());
        // Binary, with newlines and what looks like a header inside.
        let three = b"\x80\x04\nfile 9 9\n\x00dump".to_vec();
        std::fs::write(format!("{prefix}3"), &three).expect("dump");
        std::fs::write(format!("{prefix}5"), b"five").expect("dump");
        let now = hangwatch_model::unix_now() as u64;
        let found = read(&prefix, &[3, 4, 5], now - 60);
        assert_eq!(found.read, vec![(3, three), (5, b"five".to_vec())]);
        assert!(found.problems.is_empty(), "{:?}", found.problems);
        assert_eq!(
            read(&prefix, &[3, 5], now + 60),
            OwnDumps::default(),
            "written before the job"
        );
    }
}
