//! `hangwatch history`: the verdicts kept on this node, how often each cause recurred and where; and the
//! internal `__record-history` child that `run` records a verdict through.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use hangwatch_agent::human::say;
use hangwatch_fleet::{FleetCause, FleetDb, FleetEntry, FleetMount, FleetQuery, ProcessEnv};
use hangwatch_history::{utc_time, CauseSummary, HistoryDb, HistoryEntry, Query};
use serde::Serialize;
use std::io::Write;

use crate::exit::usage;

/// `hangwatch history`
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The database is history.sqlite in the state directory: $HANGWATCH_STATE_DIR, else $XDG_STATE_HOME/hangwatch when \
node-local, else /var/tmp/hangwatch-<uid>/state. See docs/history.md.")]
pub struct Args {
    /// Print one JSON document on stdout.
    #[arg(long)]
    json: bool,
    /// Only verdicts since: a time back from now (7d, 24h, 30m, 2w) or a date (2026-11-30, 2026-11-30T08:00:00Z;
    /// UTC unless an offset is given).
    #[arg(long, value_name = "DUR|DATE")]
    since: Option<String>,
    /// At most N rows, newest first (0: all).
    #[arg(long, value_name = "N", default_value_t = 50)]
    limit: usize,
    /// One row per cause (fingerprint): how often, on which nodes, first and last time.
    #[arg(long)]
    by_cause: bool,
    /// The database file instead of the one in the state directory.
    #[arg(long, value_name = "PATH")]
    db: Option<PathBuf>,
    /// Read the fleet database (every node's verdicts) instead of this node's history.
    #[arg(long, conflicts_with = "db")]
    fleet: bool,
    /// With --fleet: one row per mount that blocked verdicts: how many, which jobs and nodes, first and last.
    #[arg(long, requires = "fleet", conflicts_with = "by_cause")]
    by_mount: bool,
    #[command(flatten)]
    fleet_db: crate::fleet::FleetArgs,
}

/// How long `history --fleet` waits for the fleet database.
const FLEET_TIMEOUT: Duration = Duration::from_secs(15);

/// `history --json`: the database and its rows.
#[derive(Debug, Serialize)]
struct HistoryDocument {
    database: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    verdicts: Option<Vec<HistoryEntry>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    causes: Option<Vec<CauseSummary>>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let now = now_unix_s();
    let since_unix_s = match &args.since {
        Some(text) => Some(parse_since(text, now).map_err(usage)?),
        None => None,
    };
    let query = Query {
        since_unix_s,
        limit: (args.limit > 0).then_some(args.limit),
    };
    if args.fleet {
        return run_fleet(&args, query);
    }
    let path = args
        .db
        .clone()
        .unwrap_or_else(hangwatch_run::dirs::history_db_path);
    let exists = std::fs::symlink_metadata(&path).is_ok();
    let db = if exists {
        Some(HistoryDb::open_existing(&path)?)
    } else {
        None
    };
    let mut doc = HistoryDocument {
        database: path.clone(),
        verdicts: None,
        causes: None,
    };
    if args.by_cause {
        doc.causes = Some(match &db {
            Some(db) => db.by_fingerprint(&query)?,
            None => Vec::new(),
        });
    } else {
        doc.verdicts = Some(match &db {
            Some(db) => db.list(&query)?,
            None => Vec::new(),
        });
    }
    if args.json {
        crate::output::print_json(&doc)?;
        return Ok(ExitCode::SUCCESS);
    }
    let empty = doc.causes.as_ref().is_none_or(Vec::is_empty)
        && doc.verdicts.as_ref().is_none_or(Vec::is_empty);
    if empty {
        let window = args
            .since
            .as_ref()
            .map(|s| format!(" since {s}"))
            .unwrap_or_default();
        let why = if exists {
            ""
        } else {
            " (the database does not exist yet)"
        };
        say(format!(
            "no verdicts recorded on this node{window}; database: {}{why}",
            path.display()
        ));
        return Ok(ExitCode::SUCCESS);
    }
    let table = match (&doc.verdicts, &doc.causes) {
        (_, Some(causes)) => cause_table(causes),
        (Some(verdicts), None) => verdict_table(verdicts),
        (None, None) => String::new(),
    };
    say(format!("{table}database: {}", path.display()));
    Ok(ExitCode::SUCCESS)
}

fn verdict_table(entries: &[HistoryEntry]) -> String {
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

fn cause_table(causes: &[CauseSummary]) -> String {
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

/// Left-aligned columns two spaces apart; the last column is not padded.
fn render_table(header: &[&str], rows: &[Vec<String>]) -> String {
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

/// The start of the `--since` window, in seconds since the epoch: `now` minus a duration (`7d`, `2w`, and what
/// `--stall-after` takes: `24h`, `30m`), or a date (`2026-11-30`, `2026-11-30T08:00:00Z`).
fn parse_since(text: &str, now_unix_s: f64) -> Result<f64, String> {
    let t = text.trim();
    if let Some(back) = days_or_weeks(t) {
        return Ok(now_unix_s - back.as_secs_f64());
    }
    if t.starts_with(|c: char| c.is_ascii_digit()) && !t.contains('-') {
        return crate::duration::parse_duration(t)
            .map(|back| now_unix_s - back.as_secs_f64())
            .map_err(|e| {
                format!("--since: {e}; days and weeks work too (7d, 2w), or a date (2026-11-30)")
            });
    }
    let full = if t.len() == 10 {
        format!("{t}T00:00:00Z")
    } else {
        t.to_string()
    };
    full.parse::<hangwatch_model::WallTime>()
        .ok()
        .and_then(|w| w.to_unix_s())
        .ok_or_else(|| {
            format!("--since {text:?} is neither a time back from now (7d, 24h, 30m) nor a date (2026-11-30 or 2026-11-30T08:00:00Z)")
        })
}

/// `7d`, `2w`, `1.5d`: the units `parse_duration` leaves out (a stall is never days long; a history window is).
fn days_or_weeks(t: &str) -> Option<Duration> {
    let (number, unit) = t.split_at(t.find(|c: char| !(c.is_ascii_digit() || c == '.'))?);
    let per = match unit {
        "d" | "day" | "days" => 86_400.0,
        "w" | "week" | "weeks" => 7.0 * 86_400.0,
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    let secs = value * per;
    (secs.is_finite() && (0.0..1.0e10).contains(&secs)).then(|| Duration::from_secs_f64(secs))
}

fn now_unix_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `history --fleet --json`: the fleet database (without its password) and its rows.
#[derive(Debug, Serialize)]
struct FleetDocument {
    database: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    verdicts: Option<Vec<FleetEntry>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    causes: Option<Vec<FleetCause>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mounts: Option<Vec<FleetMount>>,
}

/// `history --fleet`: the fleet database's verdicts, causes or mounts. Connecting and reading run under
/// [`FLEET_TIMEOUT`]: a database that accepts and never answers is named, not waited for.
fn run_fleet(args: &Args, query: Query) -> anyhow::Result<ExitCode> {
    let target = args.fleet_db.target()?.ok_or_else(|| {
        usage("--fleet needs the fleet database: --history-url URL or HANGWATCH_HISTORY_URL")
    })?;
    let fleet_query = FleetQuery {
        since_unix_s: query.since_unix_s,
        limit: query.limit,
    };
    let (by_cause, by_mount) = (args.by_cause, args.by_mount);
    let url = target.url.clone();
    let read = move || -> anyhow::Result<FleetDocument> {
        let mut db = FleetDb::connect(&target, &ProcessEnv, FLEET_TIMEOUT)?;
        let mut doc = FleetDocument {
            database: db.database().to_string(),
            verdicts: None,
            causes: None,
            mounts: None,
        };
        if by_cause {
            doc.causes = Some(db.by_cause(&fleet_query)?);
        } else if by_mount {
            doc.mounts = Some(db.by_mount(&fleet_query)?);
        } else {
            doc.verdicts = Some(db.list(&fleet_query)?);
        }
        Ok(doc)
    };
    let doc = hangwatch_fleet::within(FLEET_TIMEOUT, read).ok_or_else(|| {
        anyhow::anyhow!(
            "the fleet database ({}) did not answer within {}s",
            redacted(&url),
            FLEET_TIMEOUT.as_secs()
        )
    })??;
    if args.json {
        crate::output::print_json(&doc)?;
        return Ok(ExitCode::SUCCESS);
    }
    let table = match (&doc.verdicts, &doc.causes, &doc.mounts) {
        (Some(v), _, _) if !v.is_empty() => fleet_verdict_table(v),
        (_, Some(c), _) if !c.is_empty() => fleet_cause_table(c),
        (_, _, Some(m)) if !m.is_empty() => fleet_mount_table(m),
        _ => {
            let window = args
                .since
                .as_ref()
                .map(|s| format!(" since {s}"))
                .unwrap_or_default();
            say(format!(
                "no verdicts in the fleet database{window}; database: {}",
                doc.database
            ));
            return Ok(ExitCode::SUCCESS);
        }
    };
    say(format!("{table}database: {}", doc.database));
    Ok(ExitCode::SUCCESS)
}

/// The URL for a message: only what comes before its user part's password is never printed.
fn redacted(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((user, host)) => {
                let user = user.split(':').next().unwrap_or_default();
                format!("{scheme}://{user}@{host}")
            }
            None => url.to_string(),
        },
        None => "the URL given".to_string(),
    }
}

fn fleet_verdict_table(entries: &[FleetEntry]) -> String {
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
                e.job_id.clone().unwrap_or_else(|| "-".into()),
                e.kind.as_str().to_string(),
                e.cause.clone(),
                format!("x{}", e.count),
            ]
        })
        .collect();
    render_table(&["WHEN", "NODE", "JOB", "KIND", "CAUSE", "SEEN"], &rows)
}

fn fleet_cause_table(causes: &[FleetCause]) -> String {
    let rows: Vec<Vec<String>> = causes
        .iter()
        .map(|c| {
            vec![
                format!("x{}", c.count),
                c.jobs.to_string(),
                c.fields.kind.as_str().to_string(),
                c.cause.clone(),
                c.nodes.join(","),
                utc_time(c.first_at_unix_s),
                utc_time(c.last_at_unix_s),
            ]
        })
        .collect();
    render_table(
        &["SEEN", "JOBS", "KIND", "CAUSE", "NODES", "FIRST", "LAST"],
        &rows,
    )
}

fn fleet_mount_table(mounts: &[FleetMount]) -> String {
    let rows: Vec<Vec<String>> = mounts
        .iter()
        .map(|m| {
            vec![
                m.mount_point.clone(),
                m.fstype.clone().unwrap_or_else(|| "-".into()),
                format!("x{}", m.count),
                m.jobs.to_string(),
                m.nodes.join(","),
                utc_time(m.first_at_unix_s),
                utc_time(m.last_at_unix_s),
            ]
        })
        .collect();
    render_table(
        &[
            "MOUNT", "FSTYPE", "BLOCKED", "JOBS", "NODES", "FIRST", "LAST",
        ],
        &rows,
    )
}

/// `hangwatch __record-history --db PATH`: a history request (JSON) on stdin; one recurrence (JSON) a line on
/// stdout, the node's own first, the fleet database's after it when one is set (the parent takes the last).
#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    #[arg(long)]
    db: PathBuf,
}

pub fn run_record(args: RecordArgs) -> anyhow::Result<ExitCode> {
    hangwatch_fleet::record_child_main(&args.db, std::io::stdin().lock(), |recurrence| {
        print_line(recurrence).map_err(|e| e.to_string())
    })
    .map_err(anyhow::Error::msg)?;
    Ok(ExitCode::SUCCESS)
}

/// `hangwatch __ship-history --db PATH`: the fleet database (JSON) on stdin; what was shipped (JSON) on stdout.
#[derive(Debug, clap::Args)]
pub struct ShipArgs {
    #[arg(long)]
    db: PathBuf,
}

pub fn run_ship(args: ShipArgs) -> anyhow::Result<ExitCode> {
    let report = hangwatch_fleet::ship_child_main(&args.db, std::io::stdin().lock())
        .map_err(anyhow::Error::msg)?;
    print_line(&report)?;
    Ok(ExitCode::SUCCESS)
}

/// One compact JSON document and a line end on stdout, at once: a parent that abandons this process reads
/// every line written before.
fn print_line<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut line = serde_json::to_vec(value)?;
    line.push(b'\n');
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&line)?;
    stdout.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: f64 = 1_796_135_234.0;

    #[test]
    fn since_takes_days_hours_and_dates() {
        assert_eq!(parse_since("7d", NOW), Ok(NOW - 7.0 * 86_400.0));
        assert_eq!(parse_since("2w", NOW), Ok(NOW - 14.0 * 86_400.0));
        assert_eq!(parse_since("24h", NOW), Ok(NOW - 86_400.0));
        assert_eq!(parse_since("30m", NOW), Ok(NOW - 1800.0));
        assert_eq!(parse_since("2026-11-30", NOW), Ok(1_795_996_800.0));
        assert_eq!(
            parse_since("2026-11-30T08:10:00Z", NOW),
            Ok(1_796_026_200.0)
        );
        assert_eq!(
            parse_since("2026-11-30T09:10:00+01:00", NOW),
            parse_since("2026-11-30T08:10:00Z", NOW)
        );
    }

    #[test]
    fn since_refuses_garbage_with_examples() {
        for bad in ["soon", "3y", "2026-13-01", "yesterday"] {
            let err = parse_since(bad, NOW).unwrap_err();
            assert!(
                err.contains("7d") && err.contains("2026-11-30"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn the_table_aligns_columns() {
        let table = render_table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(table, "A    BB\nxyz  1\n");
    }
}
