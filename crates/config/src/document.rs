//! `hangwatch config`'s document: every option's effective value and where it comes from, with what became of
//! each file; as JSON and as the TOML-like text people read.

use std::path::PathBuf;

use clap::Command;
use serde::Serialize;

use crate::{effective, Effective, Loaded, Origin};

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

/// The document for `commands` (already built), each with the options that have a value or could have one.
pub fn document(
    loaded: &Loaded,
    commands: &[&Command],
    env: &dyn Fn(&str) -> Option<String>,
) -> ConfigDocument {
    ConfigDocument {
        files: file_states(loaded),
        commands: commands
            .iter()
            .map(|c| CommandOptions {
                command: c.get_name().to_string(),
                options: effective(c, &loaded.files, env),
            })
            .filter(|c| !c.options.is_empty())
            .collect(),
    }
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
pub fn render(document: &ConfigDocument) -> String {
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
