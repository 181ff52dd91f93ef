//! One configuration file's text turned into settings: which section, which key, which values, on which line.
//! Pure: the text comes in, the file's name only goes into messages.

use std::path::{Path, PathBuf};

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// One `key = value` of a file: `section` is `None` for a key above every `[section]` (it applies to every command
/// that has the option).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub section: Option<String>,
    /// The key as written (`stall_after` or `stall-after`).
    pub key: String,
    /// The value(s) as a command line would give them: an array gives one per element.
    pub values: Vec<String>,
    /// 1-based.
    pub line: usize,
}

/// A file's settings, in the order written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub entries: Vec<Entry>,
}

/// Something wrong in a file, where it is, and what is expected there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path} line {line}: {message}", path = .path.display())]
pub struct FileError {
    pub path: PathBuf,
    pub line: usize,
    pub message: String,
}

impl ConfigFile {
    /// Reads `text` (the contents of `path`) as the configuration's TOML.
    pub fn parse(path: &Path, text: &str) -> Result<ConfigFile, FileError> {
        let at = |offset: usize, message: String| FileError {
            path: path.to_path_buf(),
            line: line_of(text, offset),
            message,
        };
        let document = DeTable::parse(text).map_err(|e| {
            let offset = e.span().map(|s| s.start).unwrap_or(0);
            at(
                offset,
                format!("not valid TOML: {}", e.message().trim_end()),
            )
        })?;
        let mut entries = Vec::new();
        for (key, value) in document.get_ref() {
            match value.get_ref() {
                DeValue::Table(table) => {
                    for (inner_key, inner_value) in table {
                        if let DeValue::Table(_) = inner_value.get_ref() {
                            return Err(at(
                                inner_key.span().start,
                                format!(
                                    "[{}.{}]: sections do not nest; put `{}`'s keys in [{}]",
                                    key.get_ref(),
                                    inner_key.get_ref(),
                                    inner_key.get_ref(),
                                    key.get_ref()
                                ),
                            ));
                        }
                        entries.push(
                            entry(
                                Some(key.get_ref().to_string()),
                                inner_key,
                                inner_value,
                                text,
                            )
                            .map_err(|(offset, message)| at(offset, message))?,
                        );
                    }
                }
                _ => entries.push(
                    entry(None, key, value, text)
                        .map_err(|(offset, message)| at(offset, message))?,
                ),
            }
        }
        // The map is ordered by key; people read a file top to bottom.
        entries.sort_by_key(|e| e.line);
        Ok(ConfigFile {
            path: path.to_path_buf(),
            entries,
        })
    }
}

fn entry(
    section: Option<String>,
    key: &Spanned<std::borrow::Cow<'_, str>>,
    value: &Spanned<DeValue<'_>>,
    text: &str,
) -> Result<Entry, (usize, String)> {
    let values = match value.get_ref() {
        DeValue::Array(items) => items
            .iter()
            .map(|item| scalar(item.get_ref()).map_err(|m| (item.span().start, m)))
            .collect::<Result<Vec<_>, _>>()?,
        other => vec![scalar(other).map_err(|m| (value.span().start, m))?],
    };
    Ok(Entry {
        section,
        key: key.get_ref().to_string(),
        values,
        line: line_of(text, key.span().start),
    })
}

/// A value as its command-line text.
fn scalar(value: &DeValue<'_>) -> Result<String, String> {
    Ok(match value {
        DeValue::String(s) => s.to_string(),
        DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
            .map_err(|_| format!("{} does not fit in 64 bits", i.as_str()))?
            .to_string(),
        DeValue::Float(f) => f.as_str().to_string(),
        DeValue::Boolean(b) => b.to_string(),
        DeValue::Datetime(_) => {
            return Err(
                "a date is not a value any option takes; durations are strings (\"5m\")".into(),
            )
        }
        DeValue::Array(_) => return Err("arrays do not nest".into()),
        DeValue::Table(_) => return Err("an inline table is not a value any option takes".into()),
    })
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfigFile, FileError> {
        ConfigFile::parse(Path::new("/etc/hangwatch/config.toml"), text)
    }

    #[test]
    fn keys_above_every_section_apply_to_all_and_sections_to_their_command() {
        let file = parse(
            "# site defaults\nstall_after = \"5m\"\n\n[run]\naction = \"requeue\"\nmax-requeues = 5\nquiet = true\n\
             webhook_file = \"/etc/hangwatch/hook\"\n[coordinator]\nalert_deadline = \"20s\"\n",
        )
        .unwrap();
        let got: Vec<_> = file
            .entries
            .iter()
            .map(|e| {
                (
                    e.section.as_deref(),
                    e.key.as_str(),
                    e.values.join(","),
                    e.line,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (None, "stall_after", "5m".to_string(), 2),
                (Some("run"), "action", "requeue".to_string(), 5),
                (Some("run"), "max-requeues", "5".to_string(), 6),
                (Some("run"), "quiet", "true".to_string(), 7),
                (
                    Some("run"),
                    "webhook_file",
                    "/etc/hangwatch/hook".to_string(),
                    8
                ),
                (Some("coordinator"), "alert_deadline", "20s".to_string(), 10),
            ]
        );
    }

    #[test]
    fn an_array_gives_one_value_per_element_and_hex_integers_are_read_as_numbers() {
        let file = parse("[run]\nmetrics = [\"a\", \"b\"]\nkeep_runs = 0x10\n").unwrap();
        assert_eq!(file.entries[0].values, vec!["a", "b"]);
        assert_eq!(file.entries[1].values, vec!["16"]);
    }

    #[test]
    fn broken_toml_and_values_no_option_takes_say_the_line() {
        let err = parse("[run]\naction = \"abort\"\nstall_after = 5m\n").unwrap_err();
        assert_eq!(err.line, 3, "{err}");
        assert!(
            err.to_string()
                .starts_with("/etc/hangwatch/config.toml line 3: not valid TOML"),
            "{err}"
        );

        let err = parse("[run]\n\nwhen = 1979-05-27\n").unwrap_err();
        assert_eq!(err.line, 3);
        assert!(err.message.contains("durations are strings"), "{err}");

        let err = parse("[run]\n[run.alerts]\nx = 1\n").unwrap_err();
        assert!(err.message.contains("sections do not nest"), "{err}");
    }
}
