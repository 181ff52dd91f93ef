//! hangwatch's configuration, layered onto its command tree: the site's `/etc/hangwatch/config.toml` (or
//! `--config FILE`), then the user's `~/.config/hangwatch/config.toml`, then `HANGWATCH_<OPTION>` variables, then flags; later wins
//! (docs/configuration.md). Every option of every public command can come from any of them.

pub mod document;
mod file;
mod layers;
mod read;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::Command;

pub use file::ConfigFile;
pub use layers::{
    effective, public_commands, with_environment_names, Effective, FileSettings, Origin,
};
pub use read::child_main as read_child_main;
pub use read::{read_files, Found};

use hangwatch_model::exit::UsageError;

fn usage(message: String) -> anyhow::Error {
    anyhow::Error::new(UsageError(message))
}

/// The site's file, read by every user's hangwatch.
pub const SYSTEM_FILE: &str = "/etc/hangwatch/config.toml";
/// Names a file to read instead of [`SYSTEM_FILE`], as `--config` does.
pub const CONFIG_ENV: &str = "HANGWATCH_CONFIG";

/// The command tree with the configuration applied, and what the files said (for `hangwatch config`).
pub struct Loaded {
    pub root: Command,
    pub files: FileSettings,
    /// Every file looked for, in order.
    pub considered: Vec<PathBuf>,
    /// Files that exist but could not be read, and why: said once, then left out.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Which files to read: the one `--config` or `HANGWATCH_CONFIG` names (it must exist) or the system's, then the
/// user's. `explicit` is true when the first was named.
pub fn candidates(
    root: &Command,
    argv: &[OsString],
    env: &dyn Fn(&str) -> Option<String>,
) -> (PathBuf, bool, Option<PathBuf>) {
    let named = config_flag(root, argv)
        .or_else(|| env(CONFIG_ENV).filter(|v| !v.is_empty()).map(PathBuf::from));
    let user = env("XDG_CONFIG_HOME")
        .filter(|d| d.starts_with('/'))
        .map(PathBuf::from)
        .or_else(|| {
            env("HOME")
                .filter(|d| d.starts_with('/'))
                .map(|h| PathBuf::from(h).join(".config"))
        })
        .map(|dir| dir.join("hangwatch").join("config.toml"));
    match named {
        Some(path) => (path, true, user),
        None => (PathBuf::from(SYSTEM_FILE), false, user),
    }
}

/// The id of hangwatch's own `--config` option (a global option: before or after the command's name).
pub const CONFIG_ARG: &str = "config";

/// `--config FILE` or `--config=FILE` as `root` parses `argv`: before the command's name or after it, among the
/// command's options, never among the job's own arguments (`run -- python train.py --config x`), which `root`
/// takes as values. The files are read before the real parse (their values become the options' defaults), so
/// this parse is a lenient one: a required option that a file will give, or a bad value, does not hide
/// `--config`. A request for help or the version stops clap before the matches: it is parsed again without it.
fn config_flag(root: &Command, argv: &[OsString]) -> Option<PathBuf> {
    let lenient = |argv: &[OsString]| {
        let matches = root
            .clone()
            .ignore_errors(true)
            .try_get_matches_from(argv)
            .ok()?;
        let from_line = matches.value_source(CONFIG_ARG) == Some(ValueSource::CommandLine);
        from_line
            .then(|| matches.get_raw(CONFIG_ARG)?.next().map(PathBuf::from))
            .flatten()
    };
    if let Some(named) = lenient(argv) {
        return Some(named);
    }
    let end = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
    let without_help: Vec<OsString> = argv[..end]
        .iter()
        .filter(|a| !HELP_AND_VERSION.iter().any(|h| a.as_os_str() == *h))
        .chain(&argv[end..])
        .cloned()
        .collect();
    if without_help.len() < argv.len() {
        return lenient(&without_help);
    }
    None
}

/// clap's own flags that end a parse before it has matches.
const HELP_AND_VERSION: &[&str] = &["-h", "--help", "-V", "--version"];

/// Reads and checks the configuration for `root` (hangwatch's command tree) and applies it: every public
/// command's option gets its variable, and the files' values become its defaults. A usage error (exit 2) for a
/// bad file, naming its line and what is expected; a file that exists but cannot be read is skipped with a
/// reason, unless it was named with `--config`.
pub fn load(
    root: Command,
    argv: &[OsString],
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Loaded> {
    let root = with_environment_names(root);
    let (system, explicit, user) = candidates(&root, argv, env);
    let mut paths = vec![system.clone()];
    paths.extend(user.filter(|u| *u != system));
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    for (path, found) in read::read_files(&paths) {
        let named = explicit && path == system;
        match found {
            read::Found::Text(text) => {
                files.push(ConfigFile::parse(&path, &text).map_err(|e| usage(e.to_string()))?)
            }
            read::Found::Missing if named => {
                return Err(usage(format!(
                    "the configuration file {} (--config or {CONFIG_ENV}) does not exist",
                    path.display()
                )))
            }
            read::Found::Missing => {}
            read::Found::Unreadable(why) if named => {
                return Err(usage(format!(
                    "cannot read the configuration file {}: {why}",
                    path.display()
                )))
            }
            read::Found::Unreadable(why) => skipped.push((path, why)),
        }
    }
    let settings = FileSettings::resolve(&root, &files).map_err(|e| usage(e.to_string()))?;
    Ok(Loaded {
        root: settings.apply(root),
        files: settings,
        considered: paths,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    /// hangwatch's shape, as far as `--config` goes: a global option, a command whose trailing arguments are the
    /// job's, one with a required argument, one with a nested command.
    fn root() -> Command {
        use clap::{Arg, ArgAction};
        Command::new("hangwatch")
            .arg(
                Arg::new(CONFIG_ARG)
                    .long("config")
                    .env(CONFIG_ENV)
                    .global(true),
            )
            .arg(
                Arg::new("verbose")
                    .short('v')
                    .action(ArgAction::Count)
                    .global(true),
            )
            .subcommand(
                Command::new("run")
                    .arg(Arg::new("nproc").long("nproc"))
                    .arg(
                        Arg::new("command")
                            .num_args(1..)
                            .trailing_var_arg(true)
                            .allow_hyphen_values(true),
                    ),
            )
            .subcommand(Command::new("node"))
            .subcommand(Command::new("probe").arg(Arg::new("path").required(true)))
            .subcommand(Command::new("token").subcommand(Command::new("new").arg(Arg::new("file"))))
    }

    #[test]
    fn the_named_file_replaces_the_systems_and_the_jobs_own_config_flag_is_left_alone() {
        let env = |k: &str| match k {
            "HOME" => Some("/home/u".to_string()),
            _ => None,
        };
        let root = root();
        let (system, explicit, user) = candidates(
            &root,
            &argv(&["hangwatch", "run", "--", "python", "--config", "x"]),
            &env,
        );
        assert_eq!((system, explicit), (PathBuf::from(SYSTEM_FILE), false));
        assert_eq!(
            user,
            Some(PathBuf::from("/home/u/.config/hangwatch/config.toml"))
        );
        let (system, _, _) = candidates(
            &root,
            &argv(&["hangwatch", "run", "python", "train.py", "--config", "x"]),
            &env,
        );
        assert_eq!(system, PathBuf::from(SYSTEM_FILE));
        let (system, explicit, _) = candidates(
            &root,
            &argv(&["hangwatch", "-v", "--config", "/s/c.toml", "run"]),
            &env,
        );
        assert_eq!((system, explicit), (PathBuf::from("/s/c.toml"), true));
        let (system, _, _) = candidates(
            &root,
            &argv(&["hangwatch", "--config=/s/d.toml", "run"]),
            &env,
        );
        assert_eq!(system, PathBuf::from("/s/d.toml"));

        let env = |k: &str| match k {
            "XDG_CONFIG_HOME" => Some("/x".to_string()),
            "HANGWATCH_CONFIG" => Some("/e.toml".to_string()),
            _ => None,
        };
        let (system, explicit, user) = candidates(&root, &argv(&["hangwatch", "run"]), &env);
        assert_eq!((system, explicit), (PathBuf::from("/e.toml"), true));
        assert_eq!(user, Some(PathBuf::from("/x/hangwatch/config.toml")));
    }

    #[test]
    fn config_after_the_commands_name_is_hangwatchs_own() {
        let env = |_: &str| None;
        let root = root();
        for (line, named) in [
            (
                &["hangwatch", "node", "--config", "/s/n.toml"][..],
                "/s/n.toml",
            ),
            (&["hangwatch", "node", "--config=/s/n.toml"], "/s/n.toml"),
            (
                &[
                    "hangwatch",
                    "run",
                    "--nproc",
                    "2",
                    "--config",
                    "/s/r.toml",
                    "--",
                    "true",
                ],
                "/s/r.toml",
            ),
            // A required argument the line lacks, and a request for help, do not hide it.
            (
                &["hangwatch", "probe", "--config", "/s/p.toml"],
                "/s/p.toml",
            ),
            (
                &["hangwatch", "node", "--config", "/s/h.toml", "--help"],
                "/s/h.toml",
            ),
            (
                &["hangwatch", "token", "new", "--config", "/s/t.toml", "f"],
                "/s/t.toml",
            ),
            // After the command's name, it wins over one before it, as clap's global options do.
            (
                &[
                    "hangwatch",
                    "--config",
                    "/s/a.toml",
                    "node",
                    "--config",
                    "/s/b.toml",
                ],
                "/s/b.toml",
            ),
        ] {
            let (system, explicit, _) = candidates(&root, &argv(line), &env);
            assert_eq!((system, explicit), (PathBuf::from(named), true), "{line:?}");
        }
    }
}
