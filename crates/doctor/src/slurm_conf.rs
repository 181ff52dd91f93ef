//! slurm.conf as far as `doctor` reads it: the `TaskProlog` Slurm runs before each task (the last one set, `Include`
//! files read where they stand), lines that have it commented out, and whether the script it names is hangwatch's
//! TaskProlog or a site script that runs it. Pure: texts in; the reading is [`crate::NodeServiceFacts::gather`]'s
//! caller's (in a child under a deadline: slurm.conf and the site's scripts may be on a network filesystem).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file name of hangwatch's TaskProlog (`contrib/hangwatch-taskprolog.sh`).
pub const TASK_PROLOG_FILE: &str = "hangwatch-taskprolog.sh";
/// Where the Debian package installs it (crates/cli's `[package.metadata.deb]`).
pub const INSTALLED_TASK_PROLOG: &str = "/usr/share/hangwatch/hangwatch-taskprolog.sh";
/// Slurm's own default place for slurm.conf.
pub const DEFAULT_SLURM_CONF: &str = "/etc/slurm/slurm.conf";
/// Where slurmd keeps the copy it fetched from slurmctld on a configless cluster (Slurm 22.05 and later).
pub const CONFIGLESS_SLURM_CONF: &str = "/run/slurm/conf/slurm.conf";
/// `Include` files are followed this deep (an include of itself ends here).
pub const MAX_INCLUDE_DEPTH: usize = 4;

/// A file as the reader found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileText {
    Text(String),
    Missing,
    /// It exists (or the reader did not answer for it): why it was not read.
    Unreadable(String),
}

/// What a reader gives back for a batch of paths: each path with what became of it.
pub type FileBatch = Vec<(PathBuf, FileText)>;

/// A `TaskProlog=` line: the file, its line (1-based), the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfLine {
    pub file: String,
    pub line: usize,
    pub value: String,
}

/// A file that was looked for and not read, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnreadFile {
    pub path: String,
    pub why: String,
}

/// What a TaskProlog script is to hangwatch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum PrologScript {
    /// hangwatch's TaskProlog itself (by its file name, or a copy that exports `HANGWATCH_SOCKET`).
    Hangwatch,
    /// A site script with a line (1-based) that runs hangwatch's.
    CallsHangwatch {
        line: usize,
    },
    /// A site script that does not run it.
    Other,
    /// No file there on this node.
    Missing,
    Unreadable {
        why: String,
    },
}

/// One line of a slurm.conf that matters here.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    TaskProlog { line: usize, value: String },
    Commented { line: usize, value: String },
    Include { line: usize, pattern: String },
}

/// What slurm.conf and the files it includes say about the TaskProlog, from the texts read so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The TaskProlog in force: the last non-empty `TaskProlog=` in the order Slurm reads the lines (an empty one
    /// unsets it).
    pub task_prolog: Option<ConfLine>,
    /// `TaskProlog=` lines behind a `#`.
    pub commented: Vec<ConfLine>,
    /// Included files not in the texts yet: read them and resolve again.
    pub wanted: Vec<PathBuf>,
    /// Included files that could not be read or were not followed, and why.
    pub unread: Vec<UnreadFile>,
}

/// The TaskProlog `main` (whose text is in `texts`) sets, following its `Include` lines through `texts`.
pub fn resolve(main: &Path, texts: &BTreeMap<PathBuf, FileText>) -> Resolved {
    let mut out = Resolved::default();
    walk(main, texts, 0, &mut out);
    out
}

fn walk(file: &Path, texts: &BTreeMap<PathBuf, FileText>, depth: usize, out: &mut Resolved) {
    let Some(FileText::Text(text)) = texts.get(file) else {
        return;
    };
    let here = |line: usize, value: String| ConfLine {
        file: file.display().to_string(),
        line,
        value,
    };
    for item in scan(text) {
        match item {
            Item::TaskProlog { line, value } => {
                out.task_prolog = (!value.is_empty()).then(|| here(line, value));
            }
            Item::Commented { line, value } => out.commented.push(here(line, value)),
            Item::Include { line, pattern } => {
                let path = match Path::new(&pattern) {
                    p if p.is_absolute() => p.to_path_buf(),
                    p => file.parent().unwrap_or(Path::new("/")).join(p),
                };
                let unread = |why: String| UnreadFile {
                    path: path.display().to_string(),
                    why: format!("{why} (Include on {} line {line})", file.display()),
                };
                let not_read = if pattern.contains(['*', '?', '[', '%']) {
                    Some(unread("a pattern, which doctor does not expand".into()))
                } else if depth >= MAX_INCLUDE_DEPTH {
                    Some(unread(format!(
                        "included more than {MAX_INCLUDE_DEPTH} files deep"
                    )))
                } else {
                    match texts.get(&path) {
                        None => {
                            if !out.wanted.contains(&path) {
                                out.wanted.push(path);
                            }
                            None
                        }
                        Some(FileText::Text(_)) => {
                            walk(&path, texts, depth + 1, out);
                            None
                        }
                        Some(FileText::Missing) => Some(unread("does not exist".into())),
                        Some(FileText::Unreadable(why)) => Some(unread(why.clone())),
                    }
                };
                if let Some(u) = not_read.filter(|u| !out.unread.contains(u)) {
                    out.unread.push(u);
                }
            }
        }
    }
}

/// The lines of one slurm.conf text that name a TaskProlog or include another file. Keys are case-insensitive
/// and a line may hold several `Key=Value` pairs (`Key = Value` too, a value in double quotes); `#` starts a
/// comment unless written `\#`; `Include PATH` reads another file at that point.
fn scan(text: &str) -> Vec<Item> {
    let mut items = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim_start();
        if let Some(rest) = trimmed.strip_prefix('#') {
            let rest = strip_comment(rest.trim_start_matches('#'));
            if let Some(value) = pairs(rest)
                .into_iter()
                .filter(|(k, v)| is_task_prolog(k) && !v.is_empty())
                .map(|(_, v)| v)
                .next_back()
            {
                items.push(Item::Commented { line, value });
            }
            continue;
        }
        let content = strip_comment(trimmed);
        if let Some(pattern) = include_of(content) {
            items.push(Item::Include { line, pattern });
            continue;
        }
        for (key, value) in pairs(content) {
            if is_task_prolog(&key) {
                items.push(Item::TaskProlog { line, value });
            }
        }
    }
    items
}

fn is_task_prolog(key: &str) -> bool {
    key.eq_ignore_ascii_case("TaskProlog")
}

/// The line before its comment (`#` not preceded by `\`).
fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    let end = (0..bytes.len())
        .find(|&i| bytes[i] == b'#' && (i == 0 || bytes[i - 1] != b'\\'))
        .unwrap_or(bytes.len());
    &line[..end]
}

/// `Include PATH` (any case), the path unquoted.
fn include_of(content: &str) -> Option<String> {
    let content = content.trim();
    let (word, rest) = content.split_once(char::is_whitespace)?;
    if !word.eq_ignore_ascii_case("include") || rest.trim_start().starts_with('=') {
        return None;
    }
    let path = rest.trim().trim_matches('"');
    (!path.is_empty()).then(|| path.to_string())
}

/// The `Key=Value` pairs of a line (an operator before `=`, as in `Key+=Value`, is kept out of both).
fn pairs(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return out;
        }
        let key_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(rest.len());
        let key = &rest[..key_len];
        let after = rest[key_len..].trim_start();
        let after = after.strip_prefix(['+', '-', '*', '/']).unwrap_or(after);
        match after.strip_prefix('=') {
            Some(value) if key_len > 0 => {
                let value = value.trim_start();
                let (value, tail) = match value.strip_prefix('"') {
                    Some(quoted) => match quoted.find('"') {
                        Some(end) => (&quoted[..end], &quoted[end + 1..]),
                        None => (quoted, ""),
                    },
                    None => {
                        let end = value.find(char::is_whitespace).unwrap_or(value.len());
                        (&value[..end], &value[end..])
                    }
                };
                out.push((key.to_string(), value.replace("\\#", "#")));
                rest = tail;
            }
            _ => {
                let end = rest
                    .find(char::is_whitespace)
                    .unwrap_or(rest.len())
                    .max(rest.chars().next().map_or(1, char::len_utf8));
                rest = &rest[end..];
            }
        }
    }
}

/// What the script a `TaskProlog=` names is, from its text.
pub fn classify_script(path: &str, read: &FileText) -> PrologScript {
    let text = match read {
        FileText::Text(text) => text,
        FileText::Missing => return PrologScript::Missing,
        FileText::Unreadable(why) => return PrologScript::Unreadable { why: why.clone() },
    };
    if names_ours(path) {
        return PrologScript::Hangwatch;
    }
    let code = || {
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim_start().starts_with('#'))
    };
    let stem = TASK_PROLOG_FILE.trim_end_matches(".sh");
    if let Some((index, _)) = code().find(|(_, l)| l.contains(stem)) {
        return PrologScript::CallsHangwatch { line: index + 1 };
    }
    if code().any(|(_, l)| l.contains("HANGWATCH_SOCKET=")) {
        return PrologScript::Hangwatch;
    }
    PrologScript::Other
}

/// Whether a path's file name is hangwatch's TaskProlog's.
pub fn names_ours(path: &str) -> bool {
    Path::new(path)
        .file_name()
        .is_some_and(|n| n == TASK_PROLOG_FILE)
}

/// Where to look for slurm.conf, in order, each with how it was found: `$SLURM_CONF` alone where it is set (Slurm's
/// commands and daemons read that file then), else the path `scontrol show config` printed, Slurm's default and a
/// configless node's copy.
pub fn slurm_conf_candidates(env: Option<&str>, scontrol: Option<&str>) -> Vec<(PathBuf, String)> {
    if let Some(path) = env.map(str::trim).filter(|p| !p.is_empty()) {
        return vec![(PathBuf::from(path), "$SLURM_CONF".into())];
    }
    let mut out: Vec<(PathBuf, String)> = Vec::new();
    let named = scontrol.map(|p| (p, "scontrol show config"));
    for (path, how) in named.into_iter().chain([
        (DEFAULT_SLURM_CONF, "Slurm's default"),
        (CONFIGLESS_SLURM_CONF, "slurmd's configless copy"),
    ]) {
        let path = PathBuf::from(path.trim());
        if !path.as_os_str().is_empty() && !out.iter().any(|(p, _)| *p == path) {
            out.push((path, how.into()));
        }
    }
    out
}

/// The `SLURM_CONF = PATH` line of `scontrol show config`'s output.
pub fn slurm_conf_of_show_config(output: &str) -> Option<String> {
    output.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        let value = value.trim();
        (key.trim() == "SLURM_CONF" && value.starts_with('/')).then(|| value.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// slurm.conf as tests/slurm/start-slurm.sh writes it for 3 emulated nodes (recorded), without a TaskProlog.
    const TEST_CLUSTER: &str = include_str!("../tests/fixtures/slurm/test-cluster.conf");
    /// A site's slurm.conf: its prolog and epilog settings in an included file, a commented-out TaskProlog.
    const SITE: &str = include_str!("../tests/fixtures/slurm/site.conf");
    const SITE_PROLOGS: &str = include_str!("../tests/fixtures/slurm/site-prologs.conf");
    /// The site's TaskProlog, which runs hangwatch's after its own exports.
    const SITE_TASKPROLOG: &str = include_str!("../tests/fixtures/slurm/site-taskprolog.sh");
    const OURS: &str = include_str!("../../../contrib/hangwatch-taskprolog.sh");

    fn texts(files: &[(&str, &str)]) -> BTreeMap<PathBuf, FileText> {
        files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), FileText::Text(t.to_string())))
            .collect()
    }

    fn resolved(main: &str, files: &[(&str, &str)]) -> Resolved {
        resolve(Path::new(main), &texts(files))
    }

    #[test]
    fn the_test_clusters_conf_sets_no_task_prolog() {
        let r = resolved(
            "/etc/slurm/slurm.conf",
            &[("/etc/slurm/slurm.conf", TEST_CLUSTER)],
        );
        assert_eq!(r, Resolved::default());
    }

    #[test]
    fn the_last_task_prolog_wins_in_any_case_and_among_other_pairs() {
        let conf = "TaskProlog=/first.sh\n\
                    # a comment\n\
                    taskprolog = \"/opt/site/task prolog.sh\"  TaskEpilog=/e.sh # why\n";
        let r = resolved("/c", &[("/c", conf)]);
        assert_eq!(
            r.task_prolog,
            Some(ConfLine {
                file: "/c".into(),
                line: 3,
                value: "/opt/site/task prolog.sh".into()
            })
        );
        let r = resolved("/c", &[("/c", "TaskProlog=/first.sh\nTaskProlog=\n")]);
        assert_eq!(r.task_prolog, None, "an empty value unsets it");
        let r = resolved(
            "/c",
            &[(
                "/c",
                "Prolog=/usr/share/hangwatch/hangwatch-taskprolog.sh\n",
            )],
        );
        assert_eq!(r.task_prolog, None, "Prolog is not TaskProlog");
    }

    #[test]
    fn a_commented_out_task_prolog_is_noted_not_taken() {
        let conf =
            format!("{TEST_CLUSTER}#TaskProlog={INSTALLED_TASK_PROLOG}\n## TaskProlog = /old.sh\n");
        let r = resolved("/c", &[("/c", &conf)]);
        assert_eq!(r.task_prolog, None);
        let lines: Vec<_> = r.commented.iter().map(|c| c.value.as_str()).collect();
        assert_eq!(lines, [INSTALLED_TASK_PROLOG, "/old.sh"]);
        assert_eq!(r.commented[0].line, TEST_CLUSTER.lines().count() + 1);
        let r = resolved("/c", &[("/c", "SlurmUser=slurm # TaskProlog=/x.sh\n")]);
        assert_eq!(r, Resolved::default(), "a trailing comment is no setting");
    }

    #[test]
    fn included_files_are_asked_for_then_read_where_they_stand() {
        let r = resolved("/etc/slurm/slurm.conf", &[("/etc/slurm/slurm.conf", SITE)]);
        assert_eq!(r.task_prolog, None);
        assert_eq!(r.wanted, [PathBuf::from("/etc/slurm/prologs.conf")]);
        assert_eq!(r.commented.len(), 1);

        let r = resolved(
            "/etc/slurm/slurm.conf",
            &[
                ("/etc/slurm/slurm.conf", SITE),
                ("/etc/slurm/prologs.conf", SITE_PROLOGS),
            ],
        );
        assert!(r.wanted.is_empty() && r.unread.is_empty(), "{r:?}");
        let tp = r.task_prolog.unwrap();
        assert_eq!(tp.value, "/etc/slurm/taskprolog.sh");
        assert_eq!(tp.file, "/etc/slurm/prologs.conf");

        // A line after the Include wins over the included one; an included file that is missing is said.
        let conf = "Include prologs.conf\nTaskProlog=/later.sh\nInclude /nowhere.conf\n";
        let mut files = texts(&[
            ("/etc/slurm/slurm.conf", conf),
            ("/etc/slurm/prologs.conf", SITE_PROLOGS),
        ]);
        files.insert(PathBuf::from("/nowhere.conf"), FileText::Missing);
        let r = resolve(Path::new("/etc/slurm/slurm.conf"), &files);
        assert_eq!(r.task_prolog.unwrap().value, "/later.sh");
        assert_eq!(r.unread.len(), 1);
        assert!(r.unread[0].why.contains("does not exist"), "{:?}", r.unread);
    }

    #[test]
    fn patterns_and_loops_are_not_followed() {
        let r = resolved(
            "/c",
            &[("/c", "Include /etc/slurm/conf.d/*.conf\nInclude /c\n")],
        );
        assert!(r.wanted.is_empty());
        assert!(r.unread.iter().any(|u| u.why.contains("pattern")), "{r:?}");
        assert!(r.unread.iter().any(|u| u.why.contains("deep")), "{r:?}");
    }

    #[test]
    fn scripts_are_ours_call_ours_or_not() {
        let read = |t: &str| FileText::Text(t.to_string());
        assert_eq!(
            classify_script(INSTALLED_TASK_PROLOG, &read(OURS)),
            PrologScript::Hangwatch
        );
        assert_eq!(
            classify_script("/etc/slurm/hw.sh", &read(OURS)),
            PrologScript::Hangwatch,
            "a renamed copy exports the socket"
        );
        let calls = classify_script("/etc/slurm/taskprolog.sh", &read(SITE_TASKPROLOG));
        let line = SITE_TASKPROLOG
            .lines()
            .position(|l| l.starts_with(INSTALLED_TASK_PROLOG))
            .unwrap()
            + 1;
        assert_eq!(calls, PrologScript::CallsHangwatch { line });
        let commented = SITE_TASKPROLOG.replace(
            INSTALLED_TASK_PROLOG,
            "# /usr/share/hangwatch/hangwatch-taskprolog.sh",
        );
        assert_eq!(
            classify_script("/etc/slurm/taskprolog.sh", &read(&commented)),
            PrologScript::Other
        );
        assert_eq!(
            classify_script(INSTALLED_TASK_PROLOG, &FileText::Missing),
            PrologScript::Missing
        );
    }

    #[test]
    fn slurm_conf_is_looked_for_where_slurm_would() {
        let paths = |c: Vec<(PathBuf, String)>| c.into_iter().map(|(p, _)| p).collect::<Vec<_>>();
        assert_eq!(
            paths(slurm_conf_candidates(Some("/x/slurm.conf"), Some("/y"))),
            [PathBuf::from("/x/slurm.conf")]
        );
        assert_eq!(
            paths(slurm_conf_candidates(Some(" "), Some(DEFAULT_SLURM_CONF))),
            [
                PathBuf::from(DEFAULT_SLURM_CONF),
                PathBuf::from(CONFIGLESS_SLURM_CONF)
            ]
        );
        assert_eq!(
            paths(slurm_conf_candidates(
                None,
                Some("/opt/slurm/etc/slurm.conf")
            ))
            .len(),
            3
        );
        let shown = "Configuration data as of 2026-01-02T10:00:00\n\
                     AccountingStorageBackupHost = (null)\n\
                     SLURM_CONF              = /opt/slurm/etc/slurm.conf\n\
                     TaskProlog              = (null)\n";
        assert_eq!(
            slurm_conf_of_show_config(shown).as_deref(),
            Some("/opt/slurm/etc/slurm.conf")
        );
        assert_eq!(slurm_conf_of_show_config("scontrol: error: ..."), None);
    }
}
