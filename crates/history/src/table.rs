//! The history's rows as `hangwatch history` shows them: its JSON document, and terminal tables (left-aligned
//! columns, the last unpadded).

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::{utc_time, CauseSummary, HistoryDb, HistoryEntry, HistoryError, Query};

/// Left-aligned columns two spaces apart; the last column is not padded.
pub fn render_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$}  "));
            }
        }
        text.push('\n');
        text
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// The verdicts, newest first as given.
pub fn verdict_table(entries: &[HistoryEntry]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let nodes = if e.culprit_nodes.is_empty() {
                e.node.clone()
            } else {
                e.culprit_nodes.join(",")
            };
            vec![
                e.at.clone(),
                nodes,
                e.kind.as_str().to_string(),
                e.cause.clone(),
                format!("x{}", e.count),
                e.bundle
                    .as_deref()
                    .map_or("-".to_string(), |b| b.display().to_string()),
            ]
        })
        .collect();
    render_table(&["WHEN", "NODE", "KIND", "CAUSE", "SEEN", "BUNDLE"], &rows)
}

/// Each cause with how often it was seen, where, first and last.
pub fn cause_table(causes: &[CauseSummary]) -> String {
    let rows: Vec<Vec<String>> = causes
        .iter()
        .map(|c| {
            vec![
                format!("x{}", c.count),
                c.fields.kind.as_str().to_string(),
                c.cause.clone(),
                c.nodes.join(","),
                utc_time(c.first_at_unix_s),
                utc_time(c.last_at_unix_s),
            ]
        })
        .collect();
    render_table(&["SEEN", "KIND", "CAUSE", "NODES", "FIRST", "LAST"], &rows)
}

/// `history --json`: the database and its rows.
#[derive(Debug, Serialize)]
pub struct HistoryDocument {
    pub database: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdicts: Option<Vec<HistoryEntry>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub causes: Option<Vec<CauseSummary>>,
    /// The database file existed (an empty document from one that does not exist yet says so to people).
    #[serde(skip)]
    pub exists: bool,
}

impl HistoryDocument {
    /// The rows of the database at `path` (none when it does not exist yet): one per cause with `by_cause`, else
    /// one per verdict.
    pub fn read(path: &Path, by_cause: bool, query: &Query) -> Result<Self, HistoryError> {
        let exists = std::fs::symlink_metadata(path).is_ok();
        let db = if exists {
            Some(HistoryDb::open_existing(path)?)
        } else {
            None
        };
        let mut doc = HistoryDocument {
            database: path.to_path_buf(),
            verdicts: None,
            causes: None,
            exists,
        };
        if by_cause {
            doc.causes = Some(match &db {
                Some(db) => db.by_fingerprint(query)?,
                None => Vec::new(),
            });
        } else {
            doc.verdicts = Some(match &db {
                Some(db) => db.list(query)?,
                None => Vec::new(),
            });
        }
        Ok(doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_aligns_columns() {
        let table = render_table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(table, "A    BB\nxyz  1\n");
    }
}
