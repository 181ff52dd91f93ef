//! Reading the configuration files in a child hangwatch can abandon: a home directory on a stopped network
//! filesystem must not hold `run` at its start (the first promise: hangwatch never waits on a filesystem).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long the files may take, all together.
const READ_DEADLINE: Duration = Duration::from_secs(5);

/// Larger files are refused (a configuration is a few hundred bytes; a wrong path could be a dataset).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// One file as the reader child found it: one JSON line each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRead {
    pub path: PathBuf,
    /// The text, when the file was read.
    pub text: Option<String>,
    /// The file does not exist.
    pub missing: bool,
    /// Why it could not be read (it exists).
    pub error: Option<String>,
}

/// What became of one file: read, absent, or not readable (and why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Text(String),
    Missing,
    Unreadable(String),
}

/// Reads `paths` in the `__read-config` child, each within the deadline; a file the child did not answer for
/// is `Unreadable` with the reason.
pub fn read_files(paths: &[PathBuf]) -> Vec<(PathBuf, Found)> {
    let exe = match hangwatch_child::self_exe() {
        Ok(exe) => exe,
        Err(e) => {
            let why = format!("cannot start hangwatch's reader: {e}");
            return paths
                .iter()
                .map(|p| (p.clone(), Found::Unreadable(why.clone())))
                .collect();
        }
    };
    let mut command = std::process::Command::new(exe);
    command.arg("__read-config");
    for path in paths {
        command.arg("--path").arg(path);
    }
    let (answers, why_missing): (Vec<FileRead>, String) =
        hangwatch_inspect::reexec::read_json_lines(
            command,
            READ_DEADLINE,
            "the configuration reader",
            ("reading it", "is its filesystem stopped?"),
        );
    paths
        .iter()
        .map(|path| {
            let found = match answers.iter().find(|a| &a.path == path) {
                Some(FileRead {
                    text: Some(text), ..
                }) => Found::Text(text.clone()),
                Some(FileRead { missing: true, .. }) => Found::Missing,
                Some(FileRead { error, .. }) => {
                    Found::Unreadable(error.clone().unwrap_or_else(|| "nothing read".into()))
                }
                None => Found::Unreadable(why_missing.clone()),
            };
            (path.clone(), found)
        })
        .collect()
}

/// The child's side: reads each file and prints one `FileRead` line as soon as it has it (so that a file that
/// blocks costs only itself and the ones after it).
pub fn child_main(paths: &[PathBuf], out: &mut impl std::io::Write) -> std::io::Result<()> {
    for path in paths {
        let answer = read_one(path);
        serde_json::to_writer(&mut *out, &answer)?;
        out.write_all(b"\n")?;
        out.flush()?;
    }
    Ok(())
}

fn read_one(path: &Path) -> FileRead {
    use std::io::Read;
    let mut answer = FileRead {
        path: path.to_path_buf(),
        text: None,
        missing: false,
        error: None,
    };
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            answer.missing = true;
            return answer;
        }
        Err(e) => {
            answer.error = Some(e.to_string());
            return answer;
        }
    };
    let mut text = String::new();
    match file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text) {
        Ok(n) if n as u64 > MAX_CONFIG_BYTES => {
            answer.error = Some(format!(
                "larger than {MAX_CONFIG_BYTES} bytes: not a configuration file"
            ))
        }
        Ok(_) => answer.text = Some(text),
        Err(e) => answer.error = Some(e.to_string()),
    }
    answer
}
