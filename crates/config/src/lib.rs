//! hangwatch's configuration, layered onto its command tree: the site's `/etc/hangwatch/config.toml` (or
//! `--config FILE`), then the user's `~/.config/hangwatch/config.toml`, then `HANGWATCH_<OPTION>` variables, then flags; later wins
//! (docs/configuration.md). Every option of every public command can come from any of them.

pub mod document;
mod file;
mod layers;
mod read;

use std::ffi::OsString;
use std::path::PathBuf;

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
    argv: &[OsString],
    env: &dyn Fn(&str) -> Option<String>,
) -> (PathBuf, bool, Option<PathBuf>) {
    let named =
        config_flag(argv).or_else(|| env(CONFIG_ENV).filter(|v| !v.is_empty()).map(PathBuf::from));
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

/// `--config FILE` or `--config=FILE` among the options before the command's name (it is an option of
/// hangwatch itself, so nothing after the command's name is looked at: that may be the job's own `--config`).
fn config_flag(argv: &[OsString]) -> Option<PathBuf> {
    let mut args = argv.iter().skip(1);
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy();
        if text == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(value) = text.strip_prefix("--config=") {
            return Some(PathBuf::from(value));
        }
        if !text.starts_with('-') || text == "--" {
            return None;
        }
    }
    None
}

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
    let (system, explicit, user) = candidates(argv, env);
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

    #[test]
    fn the_named_file_replaces_the_systems_and_the_jobs_own_config_flag_is_left_alone() {
        let env = |k: &str| match k {
            "HOME" => Some("/home/u".to_string()),
            _ => None,
        };
        let (system, explicit, user) = candidates(
            &argv(&["hangwatch", "run", "--", "python", "--config", "x"]),
            &env,
        );
        assert_eq!((system, explicit), (PathBuf::from(SYSTEM_FILE), false));
        assert_eq!(
            user,
            Some(PathBuf::from("/home/u/.config/hangwatch/config.toml"))
        );
        let (system, explicit, _) = candidates(
            &argv(&["hangwatch", "-v", "--config", "/s/c.toml", "run"]),
            &env,
        );
        assert_eq!((system, explicit), (PathBuf::from("/s/c.toml"), true));
        let (system, _, _) = candidates(&argv(&["hangwatch", "--config=/s/d.toml", "run"]), &env);
        assert_eq!(system, PathBuf::from("/s/d.toml"));

        let env = |k: &str| match k {
            "XDG_CONFIG_HOME" => Some("/x".to_string()),
            "HANGWATCH_CONFIG" => Some("/e.toml".to_string()),
            _ => None,
        };
        let (system, explicit, user) = candidates(&argv(&["hangwatch", "run"]), &env);
        assert_eq!((system, explicit), (PathBuf::from("/e.toml"), true));
        assert_eq!(user, Some(PathBuf::from("/x/hangwatch/config.toml")));
    }
}
