//! `hangwatch report`: an evidence bundle as one self-contained HTML page, and its verdict in a few lines. The
//! reading and rendering live in `hangwatch_report`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use hangwatch_model::error_chain;
use hangwatch_report::{Bundle, Problem};

use crate::exit::usage;

/// The page's name when `--html` is not given or names a directory.
const PAGE_NAME: &str = "report.html";

#[derive(Debug, clap::Args)]
#[command(after_help = "\
DIR is an evidence bundle: the report directory `hangwatch run` prints with its verdict (a node's, e.g. \
/var/tmp/hangwatch-0/run-20261201T142708Z-26013), or a coordinator's merged verdict. Only verdict.json is \
required; files that are missing or unreadable are named on the page.

Without --html the page is written to DIR/report.html. The page needs no network and no script: open it in any \
browser, attach it to the incident, or copy it off the node. It is written readable by its owner only, like the \
bundle it shows.

Examples:
  hangwatch report /var/tmp/hangwatch-0/run-20261201T142708Z-26013
  hangwatch report DIR --html /tmp/incident.html
  hangwatch report DIR --html - | ssh laptop 'cat > incident.html'

Exit status: 0 the page was written; 2 DIR is not a bundle (missing, no verdict.json, unreadable verdict) or the \
page cannot be written there.")]
pub struct Args {
    /// The evidence bundle (report directory) to render.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Where to write the page: a file, a directory (the page is OUT/report.html), or `-` for stdout.
    /// Default: DIR/report.html.
    #[arg(long, value_name = "OUT")]
    html: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let bundle = Bundle::read(&args.dir).map_err(|e| usage(error_chain(&e)))?;
    let page = hangwatch_report::render_html(&bundle);
    let to_stdout = args.html.as_deref() == Some(Path::new("-"));
    let summary = summary(&bundle);
    if to_stdout {
        let mut stdout = std::io::stdout().lock();
        match stdout
            .write_all(page.as_bytes())
            .and_then(|()| stdout.flush())
        {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            Err(e) => return Err(anyhow::Error::new(e).context("writing the page to stdout")),
        }
        eprint!("{summary}");
        return Ok(ExitCode::SUCCESS);
    }
    let out = match args.html {
        Some(out) if out.is_dir() => out.join(PAGE_NAME),
        Some(out) => out,
        None => args.dir.join(PAGE_NAME),
    };
    write_page(&out, page.as_bytes())
        .map_err(plain)
        .map_err(|e| {
            usage(format!(
            "cannot write {}: {e}; choose another place with --html OUT, or --html - for stdout",
            out.display()
        ))
        })?;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{summary}report: {}", out.display());
    let _ = stdout.flush();
    Ok(ExitCode::SUCCESS)
}

/// The verdict's first lines (kind, summary, how long progress had stopped) and what the page could not show.
fn summary(bundle: &Bundle) -> String {
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

/// Writes the page whole or not at all: a temporary file beside `out`, renamed over it.
fn write_page(out: &Path, page: &[u8]) -> std::io::Result<()> {
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
