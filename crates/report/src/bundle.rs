//! Reading an evidence bundle directory (written by `crates/agent/src/evidence.rs`, or a coordinator's merged
//! verdict): the verdict is required, every other file is optional and may be missing or malformed.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use hangwatch_model::{ProbeResult, ProgressTimeline, Verdict};
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// Files larger than this are not read whole: a bundle's files are small (the agent caps them), so a larger one
/// is not what the agent wrote.
const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// How many trailing lines of a rank's output are kept for the page.
pub const TAIL_LINES: usize = 60;

/// Why a bundle could not be read at all (only the verdict is required).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{} does not exist: give the report directory that `hangwatch run` printed with its verdict", dir.display())]
    NoDirectory { dir: PathBuf },
    #[error("{} is not a directory", dir.display())]
    NotADirectory { dir: PathBuf },
    #[error(
        "{} is not an evidence bundle: it has no verdict.json (a bundle is the report directory of `hangwatch run`, \
         printed with the verdict, e.g. /var/tmp/hangwatch-$UID/run-...)",
        dir.display()
    )]
    NoVerdict { dir: PathBuf },
    #[error("cannot read {}", path.display())]
    ReadVerdict {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a hangwatch verdict", path.display())]
    ParseVerdict {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// An optional file of the bundle that is not shown, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProblem {
    /// The file's name relative to the bundle directory.
    pub file: String,
    pub problem: Problem,
}

/// What was wrong with an optional file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    Missing,
    /// It exists but could not be read or parsed; the text says why.
    Unreadable(String),
}

/// `thresholds.json`, the fields the page shows. Writer: `ThresholdsRecord` in `crates/agent/src/evidence.rs`
/// (Serialize-only there); every field defaults so that an older or newer writer still reads.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Thresholds {
    pub stalled_for_s: Option<f64>,
    pub hard_s: Option<f64>,
    pub soft_s: Option<f64>,
    pub basis: Option<String>,
    pub phase: Option<String>,
    pub samples: Option<u64>,
    /// `heartbeat`, `output` or `activity`.
    pub progress_source: Option<String>,
}

/// `run.json`, the fields the page shows. Writer: `RunRecord` in `crates/agent/src/evidence.rs` (Serialize-only
/// there).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RunInfo {
    pub hangwatch_version: Option<String>,
    pub node: Option<String>,
    pub command: Vec<String>,
    pub nproc: Option<u32>,
    pub running_for_s: Option<f64>,
}

/// Everything of a bundle that the page shows.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub dir: PathBuf,
    pub verdict: Verdict,
    pub verdict_text: Option<String>,
    pub probes: Option<Vec<ProbeResult>>,
    pub thresholds: Option<Thresholds>,
    pub run: Option<RunInfo>,
    pub kernel_report: Option<hangwatch_model::kernel_log::Report>,
    /// The last lines of `kernel-log.txt`.
    pub kernel_log_tail: Option<Vec<String>>,
    /// `output/rank-N.txt`, the last [`TAIL_LINES`] lines of each, by rank.
    pub output_tails: BTreeMap<u32, Vec<String>>,
    /// `output/job.txt`: the job's output as one stream, when `run` watched a launcher (torchrun) and could not
    /// tell the lines apart by rank; its last [`TAIL_LINES`] lines.
    pub job_output_tail: Option<Vec<String>>,
    pub progress: Option<ProgressTimeline>,
    /// Optional files that are missing or unreadable, in the order they were looked for.
    pub problems: Vec<FileProblem>,
}

impl Bundle {
    /// Reads the bundle in `dir`. Fails only when the directory or its `verdict.json` cannot be read; any other
    /// file that is missing or malformed is recorded in [`Bundle::problems`] and left out.
    pub fn read(dir: &Path) -> Result<Bundle, ReportError> {
        match std::fs::metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ReportError::NoDirectory {
                    dir: dir.to_path_buf(),
                })
            }
            Ok(m) if !m.is_dir() => {
                return Err(ReportError::NotADirectory {
                    dir: dir.to_path_buf(),
                })
            }
            _ => {}
        }
        let verdict_path = dir.join("verdict.json");
        let verdict_bytes = match read_regular(&verdict_path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ReportError::NoVerdict {
                    dir: dir.to_path_buf(),
                })
            }
            Err(source) => {
                return Err(ReportError::ReadVerdict {
                    path: verdict_path,
                    source,
                })
            }
        };
        let verdict: Verdict =
            serde_json::from_slice(&verdict_bytes).map_err(|source| ReportError::ParseVerdict {
                path: verdict_path.clone(),
                source,
            })?;

        let mut reader = Reader {
            dir,
            problems: Vec::new(),
        };
        let verdict_text = reader.text("verdict.txt");
        let probes = reader.json::<Vec<ProbeResult>>("probes.json");
        let thresholds = reader.json::<Thresholds>("thresholds.json");
        let run = reader.json::<RunInfo>("run.json");
        let kernel_report =
            reader.json::<hangwatch_model::kernel_log::Report>("kernel-report.json");
        let kernel_log_tail = reader.text("kernel-log.txt").map(|t| last_lines(&t, 200));
        let progress = reader.json::<ProgressTimeline>("progress.json");
        let output_tails = reader.output_tails();
        let job_output_tail = reader
            .dir
            .join("output/job.txt")
            .is_file()
            .then(|| reader.text("output/job.txt"))
            .flatten()
            .map(|t| last_lines(&t, TAIL_LINES));
        Ok(Bundle {
            dir: dir.to_path_buf(),
            verdict,
            verdict_text,
            probes,
            thresholds,
            run,
            kernel_report,
            kernel_log_tail,
            output_tails,
            job_output_tail,
            progress,
            problems: reader.problems,
        })
    }

    /// Whether this is a coordinator's bundle (the merged verdict alone): then the per-node evidence is in each
    /// node's own report directory, and its absence here is expected.
    pub fn verdict_only(&self) -> bool {
        const OPTIONAL: [&str; 6] = [
            "probes.json",
            "thresholds.json",
            "run.json",
            "kernel-report.json",
            "kernel-log.txt",
            "output/",
        ];
        OPTIONAL.iter().all(|f| {
            self.problems
                .iter()
                .any(|p| p.file == *f && p.problem == Problem::Missing)
        })
    }
}

struct Reader<'a> {
    dir: &'a Path,
    problems: Vec<FileProblem>,
}

impl Reader<'_> {
    fn bytes(&mut self, name: &str) -> Option<Vec<u8>> {
        match read_regular(&self.dir.join(name)) {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                let problem = if e.kind() == std::io::ErrorKind::NotFound {
                    Problem::Missing
                } else {
                    Problem::Unreadable(e.to_string())
                };
                self.problems.push(FileProblem {
                    file: name.to_string(),
                    problem,
                });
                None
            }
        }
    }

    fn text(&mut self, name: &str) -> Option<String> {
        self.bytes(name)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    fn json<T: DeserializeOwned>(&mut self, name: &str) -> Option<T> {
        let bytes = self.bytes(name)?;
        match serde_json::from_slice(&bytes) {
            Ok(value) => Some(value),
            Err(e) => {
                self.problems.push(FileProblem {
                    file: name.to_string(),
                    problem: Problem::Unreadable(format!("not the expected JSON: {e}")),
                });
                None
            }
        }
    }

    /// `output/rank-N.txt` for every N present; other names in `output/` are ignored.
    fn output_tails(&mut self) -> BTreeMap<u32, Vec<String>> {
        let mut tails = BTreeMap::new();
        let entries = match std::fs::read_dir(self.dir.join("output")) {
            Ok(entries) => entries,
            Err(e) => {
                let problem = if e.kind() == std::io::ErrorKind::NotFound {
                    Problem::Missing
                } else {
                    Problem::Unreadable(e.to_string())
                };
                self.problems.push(FileProblem {
                    file: "output/".to_string(),
                    problem,
                });
                return tails;
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rank) = name
                .to_str()
                .and_then(|n| n.strip_prefix("rank-")?.strip_suffix(".txt")?.parse().ok())
            else {
                continue;
            };
            if let Some(text) = self.text(&format!("output/rank-{rank}.txt")) {
                tails.insert(rank, last_lines(&text, TAIL_LINES));
            }
        }
        tails
    }
}

/// Reads a regular file, refusing anything else (a FIFO would block, a link could point anywhere).
fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} bytes, more than a bundle file has", meta.len()),
        ));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn last_lines(text: &str, n: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}
