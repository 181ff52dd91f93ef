//! `hangwatch kmsg`: report hung tasks, GPU Xid errors and filesystem complaints of a kernel log file, of stdin,
//! or of the live kernel log (`/dev/kmsg`, followed).

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use hangwatch_agent::human::say;
use hangwatch_kmsg::{self as kmsg, ReportOptions, Since};

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Without FILE, follows the live kernel log (/dev/kmsg): everything still buffered first, then new messages, \
one line per event as it completes (with --json: one JSON object per line, JSON Lines). Stop with Ctrl-C.")]
pub struct Args {
    /// Kernel log to read (`dmesg -T`, `dmesg`, syslog/journalctl or raw /dev/kmsg text); `-` reads stdin.
    pub file: Option<PathBuf>,
    /// Print the report as one JSON document on stdout (live: one JSON object per event and line).
    #[arg(long)]
    pub json: bool,
    /// Only events at or after this time: `2023-03-04T04:00:00` or "2023-03-04 04:00" (the log's own clock),
    /// or `boot+SECONDS` (seconds since boot).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Without FILE: report what the kernel log holds now instead of following it.
    #[arg(long)]
    pub once: bool,
    /// The live kernel log device (tests point it at a file, which ends the follow at its end).
    #[arg(long, hide = true, default_value = kmsg::DEV_KMSG)]
    pub kmsg_device: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let since = match args.since.as_deref() {
        Some(text) => Some(
            text.parse::<Since>()
                .map_err(|e| crate::exit::usage(e.to_string()))?,
        ),
        None => None,
    };
    match args.file.as_deref() {
        Some(path) if path == Path::new("-") => {
            let options = ReportOptions {
                since,
                boot_unix_s: None,
            };
            let report = kmsg::report_from_reader(std::io::stdin().lock(), &options)
                .context("reading stdin")?;
            print_report(&report, args.json)
        }
        Some(path) => {
            let file = std::fs::File::open(path)
                .map_err(|e| crate::exit::usage(format!("cannot open {}: {e}", path.display())))?;
            let options = ReportOptions {
                since,
                boot_unix_s: None,
            };
            let report = kmsg::report_from_reader(BufReader::new(file), &options)
                .with_context(|| format!("reading {}", path.display()))?;
            print_report(&report, args.json)
        }
        None if args.once => {
            let file = kmsg::open_kmsg(&args.kmsg_device, true)?;
            let options = ReportOptions {
                since,
                boot_unix_s: kmsg::follow::boot_time_unix_s(),
            };
            let report = kmsg::report_from_reader(BufReader::new(file), &options)
                .with_context(|| format!("reading {}", args.kmsg_device.display()))?;
            print_report(&report, args.json)
        }
        None => follow_live(&args.kmsg_device, since, args.json),
    }
}

fn print_report(report: &kmsg::Report, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        crate::output::print_json(report)?;
    } else {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(kmsg::render_report(report).as_bytes())?;
        stdout.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per finished event on stdout, said to be followed first; a closed stdout (`| head`) ends it quietly.
fn follow_live(device: &Path, since: Option<Since>, json: bool) -> anyhow::Result<ExitCode> {
    let file = kmsg::open_kmsg(device, false)?;
    say(format!(
        "hangwatch: following {} (buffered messages first); Ctrl-C to stop",
        device.display()
    ));
    let summary = kmsg::live::print_live(file, since, json, &mut std::io::stdout().lock())?;
    if summary.overruns > 0 {
        tracing::warn!(
            overruns = summary.overruns,
            "kernel log records were overwritten before they could be read"
        );
    }
    Ok(ExitCode::SUCCESS)
}
