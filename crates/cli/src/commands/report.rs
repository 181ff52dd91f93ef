//! `hangwatch report`: an evidence bundle as one self-contained HTML page, and its verdict in a few lines. The
//! reading and rendering live in `hangwatch_report`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use hangwatch_model::error_chain;
use hangwatch_report::Bundle;

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
    let summary = hangwatch_report::summary::summary(&bundle);
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
    hangwatch_report::summary::write_page(&out, page.as_bytes()).map_err(|e| {
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
