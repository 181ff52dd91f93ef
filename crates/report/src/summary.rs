//! What `hangwatch report` says besides the page: the verdict in a few lines; and how the page is written (whole or
//! not at all, readable by its owner only).

use std::io::Write;
use std::path::Path;

use crate::{Bundle, Problem};

/// The verdict's first lines (kind, summary, how long progress had stopped) and what the page could not show.
pub fn summary(bundle: &Bundle) -> String {
    let mut text = match &bundle.verdict_text {
        Some(t) if !t.trim().is_empty() => t.lines().take(2).collect::<Vec<_>>().join("\n"),
        _ => format!(
            "{}: {}",
            bundle.verdict.kind.as_str().replace('_', " "),
            bundle.verdict.summary
        ),
    };
    text.push('\n');
    if !bundle.verdict_only() {
        let unreadable: Vec<&str> = bundle
            .problems
            .iter()
            .filter(|p| matches!(p.problem, Problem::Unreadable(_)))
            .map(|p| p.file.as_str())
            .collect();
        if !unreadable.is_empty() {
            text.push_str(&format!(
                "unreadable in the bundle (named on the page): {}\n",
                unreadable.join(", ")
            ));
        }
    }
    text
}

/// Writes the page to `out` through a temporary file beside it (0600, synced, then renamed): a reader sees the
/// whole page or none. The error is the OS's words, without the temporary file's name.
pub fn write_page(out: &Path, page: &[u8]) -> std::io::Result<()> {
    write_through_temporary(out, page).map_err(plain)
}

fn write_through_temporary(out: &Path, page: &[u8]) -> std::io::Result<()> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut file = tempfile::Builder::new()
        .prefix(".report-")
        .suffix(".html.tmp")
        .tempfile_in(parent)?;
    file.write_all(page)?;
    file.as_file().sync_all()?;
    file.persist(out).map_err(|e| e.error)?;
    Ok(())
}

/// The OS's words for an error, without the temporary file's name that `tempfile` adds.
fn plain(e: std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => e,
    }
}
