//! `hangwatch config [COMMAND] [--json]`: every option's effective value before the command line, and where it
//! comes from (a file's line, a variable, hangwatch's default), for the public commands or one of them.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Command;
use hangwatch_agent::human::{write, Stream};
use serde::Serialize;

use crate::exit::usage;
use hangwatch_config::{effective, public_commands, Effective, Loaded, Origin};

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Files, in order (later wins): /etc/hangwatch/config.toml (or the file `hangwatch --config FILE` or HANGWATCH_CONFIG
names), then ~/.config/hangwatch/config.toml ($XDG_CONFIG_HOME); then HANGWATCH_<OPTION> variables; then the
command line. See docs/configuration.md.")]
pub struct Args {
    /// Only this command's options (run, coordinator, ...).
    command: Option<String>,
    /// Print one JSON document on stdout.
    #[arg(long)]
    json: bool,
}

/// One configuration file and what became of it.
#[derive(Debug, Serialize)]
pub struct FileState {
    pub path: PathBuf,
    /// read, missing or skipped.
    pub state: FileStateKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FileStateKind {
    Read,
    Missing,
    Skipped,
}

/// One command's options.
#[derive(Debug, Serialize)]
pub struct CommandOptions {
    pub command: String,
    pub options: Vec<Effective>,
}

/// What `hangwatch config --json` prints.
#[derive(Debug, Serialize)]
pub struct ConfigDocument {
    pub files: Vec<FileState>,
    pub commands: Vec<CommandOptions>,
}

pub fn run(args: Args, loaded: &Loaded) -> anyhow::Result<ExitCode> {
    let mut root = loaded.root.clone();
    root.build();
    let commands: Vec<&Command> = match &args.command {
        Some(name) => vec![public_commands(&root)
            .find(|c| c.get_name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = public_commands(&root).map(|c| c.get_name()).collect();
                usage(format!(
                    "no command `{name}`; the commands are {}",
                    names.join(", ")
                ))
            })?],
        None => public_commands(&root)
            .filter(|c| c.get_name() != "config")
            .collect(),
    };
    let env = |name: &str| std::env::var(name).ok();
    let document = ConfigDocument {
        files: file_states(loaded),
        commands: commands
            .into_iter()
            .map(|c| CommandOptions {
                command: c.get_name().to_string(),
                options: effective(c, &loaded.files, &env),
            })
            .filter(|c| !c.options.is_empty())
            .collect(),
    };
    if args.json {
        crate::output::print_json(&document)?;
    } else {
        write(Stream::Stdout, render(&document).into_bytes());
    }
    Ok(ExitCode::SUCCESS)
}

fn file_states(loaded: &Loaded) -> Vec<FileState> {
    loaded
        .considered
        .iter()
        .map(|path| {
            if let Some((_, why)) = loaded.skipped.iter().find(|(p, _)| p == path) {
                FileState {
                    path: path.clone(),
                    state: FileStateKind::Skipped,
                    reason: Some(why.clone()),
                }
            } else {
                let read = loaded.files.files.contains(path);
                FileState {
                    path: path.clone(),
                    state: if read {
                        FileStateKind::Read
                    } else {
                        FileStateKind::Missing
                    },
                    reason: None,
                }
            }
        })
        .collect()
}

/// The document as people read it: the files, then a TOML-like block per command with each value's origin.
fn render(document: &ConfigDocument) -> String {
    let mut out = String::from("# files (later wins; then HANGWATCH_* variables, then flags)\n");
    for file in &document.files {
        let state = match (file.state, &file.reason) {
            (FileStateKind::Read, _) => "read".to_string(),
            (FileStateKind::Missing, _) => "not found".to_string(),
            (FileStateKind::Skipped, Some(why)) => format!("skipped: {why}"),
            (FileStateKind::Skipped, None) => "skipped".to_string(),
        };
        out.push_str(&format!("#   {}: {state}\n", file.path.display()));
    }
    for command in &document.commands {
        out.push_str(&format!("\n[{}]\n", command.command));
        let lines: Vec<(String, String)> = command
            .options
            .iter()
            .map(|o| {
                let value = match (o.values.as_slice(), &o.origin) {
                    (_, Origin::Unset) => format!("# {}", o.key),
                    ([one], _) => format!("{} = {}", o.key, toml_text(one)),
                    (many, _) => format!(
                        "{} = [{}]",
                        o.key,
                        many.iter()
                            .map(|v| toml_text(v))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                (value, o.origin.to_string())
            })
            .collect();
        let width = lines
            .iter()
            .map(|(v, _)| v.chars().count())
            .max()
            .unwrap_or(0);
        for (value, origin) in lines {
            out.push_str(&format!("{value:<width$}  # {origin}\n"));
        }
    }
    out
}

/// A value as a file would write it: numbers and booleans bare, everything else quoted.
fn toml_text(value: &str) -> String {
    if value == "true" || value == "false" || value.parse::<i64>().is_ok() {
        value.to_string()
    } else {
        format!("{value:?}")
    }
}
