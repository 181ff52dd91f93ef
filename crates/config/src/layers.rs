//! Which value each option of each command takes, and from where: its default, the configuration files in order
//! (a command's section over the keys above every section), the environment (`HANGWATCH_<OPTION>`); flags stay
//! clap's. Pure over the command tree, the parsed files and an environment lookup.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Arg, ArgAction, Command};
use serde::Serialize;

use super::file::{ConfigFile, Entry, FileError};

/// Every option `OPTION` of a public command can be set by the variable `HANGWATCH_OPTION` (dashes as
/// underscores, upper case).
pub const ENV_PREFIX: &str = "HANGWATCH_";

/// Options whose environment variable their command reads itself (the fleet database URL may carry a password
/// in the environment, never on the command line, so it must know where the value came from).
const OWN_ENVIRONMENT: &[&str] = &["history-url"];

/// Options a file may not hold, and why: what is in a configuration file is read by every user of the node.
const SECRETS: &[(&str, &str)] = &[(
    "webhook",
    "a webhook URL is a secret and configuration files are readable by every user: put the URL in a file of \
     mode 600 and name that file with webhook_file",
)];

/// The variable that sets option `long` (`stall-after` -> `HANGWATCH_STALL_AFTER`).
pub fn env_name(long: &str) -> String {
    format!("{ENV_PREFIX}{}", long.replace('-', "_").to_uppercase())
}

/// The public commands: the ones a person runs (the `__` helpers are hidden and take nothing from the site).
pub fn public_commands(root: &Command) -> impl Iterator<Item = &Command> {
    root.get_subcommands().filter(|c| !c.is_hide_set())
}

/// An option a file or the environment may set: a named, visible option that takes a value or is a flag.
fn configurable(arg: &Arg) -> Option<&str> {
    if arg.is_positional() || arg.is_hide_set() {
        return None;
    }
    match arg.get_action() {
        ArgAction::Set | ArgAction::Append | ArgAction::SetTrue => arg.get_long(),
        _ => None,
    }
}

/// `root` with an environment variable for every option of every public command that has none yet.
pub fn with_environment_names(root: Command) -> Command {
    let names: Vec<String> = public_commands(&root)
        .map(|c| c.get_name().to_string())
        .collect();
    names.into_iter().fold(root, |root, name| {
        root.mut_subcommand(name, |sub| {
            sub.mut_args(|arg| {
                let name = match configurable(&arg) {
                    Some(long) if arg.get_env().is_none() && !OWN_ENVIRONMENT.contains(&long) => {
                        env_name(long)
                    }
                    _ => return arg,
                };
                arg.env(name)
            })
        })
    })
}

/// Where an option's value comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Origin {
    /// hangwatch's own default.
    Default,
    /// A configuration file's line.
    File { path: PathBuf, line: usize },
    /// An environment variable.
    Environment { variable: String },
    /// Nothing sets it (the option is off, or its command works it out: see its --help).
    Unset,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Default => f.write_str("default"),
            Origin::File { path, line } => write!(f, "{}:{line}", path.display()),
            Origin::Environment { variable } => write!(f, "environment {variable}"),
            Origin::Unset => f.write_str("unset"),
        }
    }
}

/// A value the files give one option of one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub values: Vec<String>,
    pub path: PathBuf,
    pub line: usize,
    /// Which file (0: the system's) and whether from the command's own section: a higher one wins.
    rank: (usize, bool),
}

/// What the files say, checked against the commands: (command, option's long name) -> setting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileSettings {
    pub files: Vec<PathBuf>,
    settings: BTreeMap<(String, String), Setting>,
}

impl FileSettings {
    /// Checks every entry of `files` (in order: later wins) against the public commands of `root`.
    pub fn resolve(root: &Command, files: &[ConfigFile]) -> Result<FileSettings, FileError> {
        let mut out = FileSettings {
            files: files.iter().map(|f| f.path.clone()).collect(),
            ..FileSettings::default()
        };
        for (index, file) in files.iter().enumerate() {
            for entry in &file.entries {
                let error = |message: String| FileError {
                    path: file.path.clone(),
                    line: entry.line,
                    message,
                };
                for (command, arg) in targets(root, entry).map_err(error)? {
                    let long = configurable(arg).unwrap_or_default().to_string();
                    check_values(command, arg, &entry.values).map_err(|message| {
                        error(format!(
                            "{} = {}: {message}",
                            entry.key,
                            shown(&entry.values)
                        ))
                    })?;
                    let setting = Setting {
                        values: entry.values.clone(),
                        path: file.path.clone(),
                        line: entry.line,
                        rank: (index, entry.section.is_some()),
                    };
                    let key = (command.get_name().to_string(), long);
                    match out.settings.get(&key) {
                        Some(old) if old.rank > setting.rank => {}
                        _ => {
                            out.settings.insert(key, setting);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The setting the files give option `long` of `command`.
    pub fn get(&self, command: &str, long: &str) -> Option<&Setting> {
        self.settings.get(&(command.to_string(), long.to_string()))
    }

    /// A setting from `command`'s own section (`[node]` for `node`), if the files have one: that section is
    /// configured here.
    pub fn from_section(&self, command: &str) -> Option<&Setting> {
        self.settings
            .iter()
            .find(|((c, _), s)| c == command && s.rank.1)
            .map(|(_, s)| s)
    }

    /// `root` with the files' values as the defaults of the options they set, so that the environment and the
    /// command line still win (clap's order: flag, then environment, then default).
    pub fn apply(&self, root: Command) -> Command {
        self.settings
            .iter()
            .fold(root, |root, ((command, long), setting)| {
                root.mut_subcommand(command, |sub| {
                    let Some(id) = sub
                        .get_arguments()
                        .find(|a| a.get_long() == Some(long.as_str()))
                        .map(|a| a.get_id().clone())
                    else {
                        return sub;
                    };
                    sub.mut_arg(id, |arg| {
                        arg.default_values(setting.values.clone()).required(false)
                    })
                })
            })
    }
}

/// The (command, option) pairs an entry sets, or what is wrong with it.
fn targets<'c>(root: &'c Command, entry: &Entry) -> Result<Vec<(&'c Command, &'c Arg)>, String> {
    let long = entry.key.replace('_', "-");
    if let Some((_, why)) = SECRETS.iter().find(|(name, _)| *name == long) {
        return Err(format!("`{}` cannot be set in a file: {why}", entry.key));
    }
    let option_of = |command: &'c Command| {
        command
            .get_arguments()
            .find(|a| configurable(a) == Some(long.as_str()))
            .map(|arg| (command, arg))
    };
    match &entry.section {
        Some(section) => {
            let Some(command) = public_commands(root).find(|c| c.get_name() == section) else {
                let names: Vec<&str> = public_commands(root).map(|c| c.get_name()).collect();
                return Err(format!(
                    "[{section}] is not a hangwatch command; sections are {}{}",
                    names.join(", "),
                    suggestion(section, names.iter().copied())
                ));
            };
            option_of(command).map(|t| vec![t]).ok_or_else(|| {
                let keys = command.get_arguments().filter_map(configurable);
                format!(
                    "`{}` is not an option of `hangwatch {section}`{} (`hangwatch {section} --help` lists them)",
                    entry.key,
                    suggestion(&long, keys)
                )
            })
        }
        None => {
            let found: Vec<_> = public_commands(root).filter_map(option_of).collect();
            if found.is_empty() {
                let keys =
                    public_commands(root).flat_map(|c| c.get_arguments().filter_map(configurable));
                return Err(format!(
                    "`{}` is not an option of any hangwatch command{}",
                    entry.key,
                    suggestion(&long, keys)
                ));
            }
            Ok(found)
        }
    }
}

/// "; did you mean `x`?" when one name is close to `given`.
fn suggestion<'a>(given: &str, names: impl Iterator<Item = &'a str>) -> String {
    names
        .map(|name| (strsim::normalized_damerau_levenshtein(given, name), name))
        .filter(|(score, _)| *score >= 0.6)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, name)| format!("; did you mean `{}`?", name.replace('-', "_")))
        .unwrap_or_default()
}

fn shown(values: &[String]) -> String {
    match values {
        [one] => format!("{one:?}"),
        many => format!("{many:?}"),
    }
}

/// Checks `values` with the option's own parser, as if given on the command line: the message is clap's, which
/// names what the option takes.
fn check_values(command: &Command, arg: &Arg, values: &[String]) -> Result<(), String> {
    let long = arg.get_long().unwrap_or_default();
    let takes_many = matches!(arg.get_action(), ArgAction::Append);
    if values.len() != 1 && !takes_many {
        return Err(format!("expects one value, not {}", values.len()));
    }
    let mut argv: Vec<String> = Vec::new();
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        match values[0].as_str() {
            "true" => argv.push(format!("--{long}")),
            "false" => {}
            other => return Err(format!("expects true or false, not {other:?}")),
        }
    } else {
        for value in values {
            argv.push(format!("--{long}={value}"));
        }
    }
    // The option alone, in a command of the same name (its messages name the command).
    Command::new(command.get_name().to_string())
        .no_binary_name(true)
        .arg(arg.clone().required(false).env(None::<&str>))
        .try_get_matches_from(argv)
        .map(drop)
        .map_err(|e| clap_message(&e))
}

/// Clap's message up to its first blank line (the usage hint after it names a command line, not a file), on one
/// line, without its "error: ".
fn clap_message(error: &clap::Error) -> String {
    let text = error.render().to_string();
    let message: Vec<&str> = text
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect();
    let joined = message.join(" ");
    joined
        .strip_prefix("error: ")
        .unwrap_or(&joined)
        .to_string()
}

/// One option's effective value before the command line: what `hangwatch config` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Effective {
    /// As a file writes it (`stall_after`).
    pub key: String,
    /// The variable that would set it.
    pub variable: Option<String>,
    pub values: Vec<String>,
    pub origin: Origin,
}

/// Every option of `command` (a public command of `root`): its value and where it comes from, the command line
/// aside. Values of options that hide them (secrets) are shown as "(hidden)".
pub fn effective(
    command: &Command,
    files: &FileSettings,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<Effective> {
    command
        .get_arguments()
        .filter_map(|arg| configurable(arg).map(|long| (arg, long)))
        .map(|(arg, long)| {
            let variable = arg
                .get_env()
                .map(|v| v.to_string_lossy().into_owned())
                .or_else(|| OWN_ENVIRONMENT.contains(&long).then(|| env_name(long)));
            let from_env = variable
                .as_deref()
                .and_then(|name| env(name).filter(|v| !v.is_empty()).map(|v| (name, v)));
            let (values, origin) = if let Some((name, value)) = from_env {
                let value = if arg.is_hide_env_values_set() {
                    "(hidden)".to_string()
                } else {
                    value
                };
                (
                    vec![value],
                    Origin::Environment {
                        variable: name.to_string(),
                    },
                )
            } else if let Some(setting) = files.get(command.get_name(), long) {
                (
                    setting.values.clone(),
                    Origin::File {
                        path: setting.path.clone(),
                        line: setting.line,
                    },
                )
            } else if !arg.get_default_values().is_empty() {
                (
                    arg.get_default_values()
                        .iter()
                        .map(|v| v.to_string_lossy().into_owned())
                        .collect(),
                    Origin::Default,
                )
            } else {
                (Vec::new(), Origin::Unset)
            };
            Effective {
                key: long.replace('-', "_"),
                variable,
                values,
                origin,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A small command tree shaped like hangwatch's.
    fn root() -> Command {
        let duration = |s: &str| {
            s.strip_suffix('m')
                .and_then(|n| n.parse::<u64>().ok())
                .map(|n| n * 60)
                .ok_or_else(|| format!("{s:?} is not a duration like 5m"))
        };
        with_environment_names(
            Command::new("hangwatch")
                .subcommand(
                    Command::new("run")
                        .arg(
                            Arg::new("stall_after")
                                .long("stall-after")
                                .value_parser(duration),
                        )
                        .arg(
                            Arg::new("action")
                                .long("action")
                                .value_parser(["abort", "observe", "requeue"])
                                .default_value("abort"),
                        )
                        .arg(Arg::new("quiet").long("quiet").action(ArgAction::SetTrue))
                        .arg(Arg::new("webhook").long("webhook").env("HANGWATCH_WEBHOOK"))
                        .arg(Arg::new("command").required(true).num_args(1..)),
                )
                .subcommand(
                    Command::new("coordinator")
                        .arg(
                            Arg::new("stall_after")
                                .long("stall-after")
                                .value_parser(duration),
                        )
                        .arg(Arg::new("listen").long("listen").required(true)),
                )
                .subcommand(
                    Command::new("__probe-child")
                        .hide(true)
                        .arg(Arg::new("x").long("x")),
                ),
        )
    }

    fn file(path: &str, text: &str) -> ConfigFile {
        ConfigFile::parse(Path::new(path), text).unwrap()
    }

    fn resolve(files: &[ConfigFile]) -> Result<FileSettings, String> {
        FileSettings::resolve(&root(), files).map_err(|e| e.to_string())
    }

    #[test]
    fn later_files_win_and_a_section_wins_over_the_keys_above_it() {
        let system = file(
            "/etc/hangwatch/config.toml",
            "[run]\nstall_after = \"3m\"\n[coordinator]\nstall_after = \"9m\"\n",
        );
        let user = file(
            "/home/u/.config/hangwatch/config.toml",
            "[run]\naction = \"observe\"\n\nstall_after = \"5m\"\n",
        );
        // The later file wins; the other command keeps the earlier file's value.
        let settings = resolve(&[system, user]).unwrap();
        let run = settings.get("run", "stall-after").unwrap();
        assert_eq!(
            (run.values.as_slice(), run.line),
            (&["5m".to_string()][..], 4)
        );
        assert_eq!(
            settings.get("coordinator", "stall-after").unwrap().values,
            ["9m"]
        );
        assert_eq!(
            settings.get("run", "action").unwrap().path,
            PathBuf::from("/home/u/.config/hangwatch/config.toml")
        );

        let user = file("/u.toml", "stall_after = \"5m\"\n");
        let system = file("/s.toml", "[run]\nstall_after = \"3m\"\n");
        let settings = resolve(&[system, user]).unwrap();
        assert_eq!(settings.get("run", "stall-after").unwrap().values, ["5m"]);
        assert_eq!(
            settings.get("coordinator", "stall-after").unwrap().values,
            ["5m"]
        );

        // Within one file, a command's section wins over the keys above every section.
        let one = file(
            "/s.toml",
            "stall_after = \"5m\"\n[run]\nstall_after = \"3m\"\n",
        );
        let settings = resolve(&[one]).unwrap();
        assert_eq!(settings.get("run", "stall-after").unwrap().values, ["3m"]);
        assert_eq!(
            settings.get("coordinator", "stall-after").unwrap().values,
            ["5m"]
        );
    }

    #[test]
    fn the_files_values_become_defaults_so_the_environment_and_flags_still_win() {
        let settings = resolve(&[file(
            "/s.toml",
            "[run]\naction = \"requeue\"\nquiet = true\n",
        )])
        .unwrap();
        let cmd = settings.apply(root());
        let m = cmd
            .clone()
            .get_matches_from(["hangwatch", "run", "--", "python"]);
        let run = m.subcommand_matches("run").unwrap();
        assert_eq!(run.get_one::<String>("action").unwrap(), "requeue");
        assert!(run.get_flag("quiet"));
        let m = cmd.get_matches_from(["hangwatch", "run", "--action", "observe", "--", "python"]);
        let run = m.subcommand_matches("run").unwrap();
        assert_eq!(run.get_one::<String>("action").unwrap(), "observe");
    }

    #[test]
    fn a_required_option_a_file_gives_is_no_longer_required() {
        let settings = resolve(&[file("/s.toml", "[coordinator]\nlisten = \":29501\"\n")]).unwrap();
        let m = settings
            .apply(root())
            .try_get_matches_from(["hangwatch", "coordinator"])
            .unwrap();
        assert_eq!(
            m.subcommand_matches("coordinator")
                .unwrap()
                .get_one::<String>("listen")
                .unwrap(),
            ":29501"
        );
    }

    #[test]
    fn unknown_keys_sections_bad_values_and_secrets_name_the_line_and_what_is_expected() {
        let err = resolve(&[file("/s.toml", "[run]\n\nstal_after = \"5m\"\n")]).unwrap_err();
        assert_eq!(
            err,
            "/s.toml line 3: `stal_after` is not an option of `hangwatch run`; did you mean `stall_after`? \
             (`hangwatch run --help` lists them)"
        );
        let err = resolve(&[file("/s.toml", "[rnu]\nquiet = true\n")]).unwrap_err();
        assert!(err.contains("[rnu] is not a hangwatch command; sections are run, coordinator; did you mean `run`?"), "{err}");
        let err = resolve(&[file("/s.toml", "[run]\naction = \"kill\"\n")]).unwrap_err();
        assert!(
            err.starts_with(
                "/s.toml line 2: action = \"kill\": invalid value 'kill' for '--action"
            ),
            "{err}"
        );
        assert!(
            err.contains("[possible values: abort, observe, requeue]"),
            "{err}"
        );
        let err = resolve(&[file("/s.toml", "stall_after = \"5 parsecs\"\n")]).unwrap_err();
        assert!(
            err.contains("\"5 parsecs\" is not a duration like 5m"),
            "{err}"
        );
        let err = resolve(&[file("/s.toml", "[run]\nquiet = \"yes\"\n")]).unwrap_err();
        assert!(err.contains("expects true or false"), "{err}");
        let err =
            resolve(&[file("/s.toml", "[run]\nwebhook = \"https://hooks/x\"\n")]).unwrap_err();
        assert!(err.contains("webhook_file"), "{err}");
        // The hidden helpers take nothing from a file.
        let err = resolve(&[file("/s.toml", "x = 1\n")]).unwrap_err();
        assert!(
            err.contains("not an option of any hangwatch command"),
            "{err}"
        );
        let err = resolve(&[file("/s.toml", "[run]\ncommand = \"python\"\n")]).unwrap_err();
        assert!(err.contains("not an option of `hangwatch run`"), "{err}");
    }

    #[test]
    fn every_option_of_a_public_command_has_a_variable_and_the_sources_are_reported() {
        let settings = resolve(&[file("/s.toml", "[run]\naction = \"requeue\"\n")]).unwrap();
        let mut cmd = root();
        cmd.build();
        let run = cmd.find_subcommand("run").unwrap();
        let env = |name: &str| (name == "HANGWATCH_STALL_AFTER").then(|| "7m".to_string());
        let got: Vec<(String, Option<String>, Vec<String>, String)> =
            effective(run, &settings, &env)
                .into_iter()
                .map(|e| (e.key, e.variable, e.values, e.origin.to_string()))
                .collect();
        let s = |v: &str| v.to_string();
        assert_eq!(
            got,
            vec![
                (
                    s("stall_after"),
                    Some(s("HANGWATCH_STALL_AFTER")),
                    vec![s("7m")],
                    s("environment HANGWATCH_STALL_AFTER")
                ),
                (
                    s("action"),
                    Some(s("HANGWATCH_ACTION")),
                    vec![s("requeue")],
                    s("/s.toml:2")
                ),
                (
                    s("quiet"),
                    Some(s("HANGWATCH_QUIET")),
                    vec![s("false")],
                    s("default")
                ),
                (
                    s("webhook"),
                    Some(s("HANGWATCH_WEBHOOK")),
                    vec![],
                    s("unset")
                ),
            ]
        );
        let probe = cmd.find_subcommand("__probe-child").unwrap();
        assert!(probe.get_arguments().all(|a| a.get_env().is_none()));
    }
}
