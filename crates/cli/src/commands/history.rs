//! `hangwatch history`: the verdicts kept on this node, how often each cause recurred and where; and the
//! internal `__record-history` child that `run` records a verdict through.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use hangwatch_agent::human::say;
use hangwatch_fleet::table::{FleetDocument, FleetRows};
use hangwatch_fleet::FleetQuery;
use hangwatch_history::table::HistoryDocument;
use hangwatch_history::Query;
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

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let now = hangwatch_model::unix_now();
    let since_unix_s = match &args.since {
        Some(text) => Some(hangwatch_model::parse_since(text, now).map_err(usage)?),
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
    let doc = HistoryDocument::read(&path, args.by_cause, &query)?;
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
        let why = if doc.exists {
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
        (_, Some(causes)) => hangwatch_history::table::cause_table(causes),
        (Some(verdicts), None) => hangwatch_history::table::verdict_table(verdicts),
        (None, None) => String::new(),
    };
    say(format!("{table}database: {}", path.display()));
    Ok(ExitCode::SUCCESS)
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
    let rows = if args.by_cause {
        FleetRows::Causes
    } else if args.by_mount {
        FleetRows::Mounts
    } else {
        FleetRows::Verdicts
    };
    let doc = FleetDocument::read(target, rows, fleet_query, FLEET_TIMEOUT)?;
    if args.json {
        crate::output::print_json(&doc)?;
        return Ok(ExitCode::SUCCESS);
    }
    let table = match (&doc.verdicts, &doc.causes, &doc.mounts) {
        (Some(v), _, _) if !v.is_empty() => hangwatch_fleet::table::verdict_table(v),
        (_, Some(c), _) if !c.is_empty() => hangwatch_fleet::table::cause_table(c),
        (_, _, Some(m)) if !m.is_empty() => hangwatch_fleet::table::mount_table(m),
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
