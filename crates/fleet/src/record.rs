//! What the recording children do with the fleet database: `__record-history` records a verdict in the node's
//! history first, then ships it and looks its cause up across the fleet within the request's deadline; the
//! background `__ship-history` child that `run` starts ships what waited while the database did not answer.
//!
//! ```text
//! __record-history: local record --> line 1: local recurrence (the answer if the fleet never does)
//!                   [thread] connect -> ship it (+100 that waited) -> lookup --> line 2: fleet recurrence (+incident)
//!                            -> ship the backlog, mark it shipped       (within what is left of the deadline)
//! ```
//!
//! The parent reads the last complete line, so that a child killed at the parent's deadline still leaves the
//! node's own answer. Shipping is idempotent ([`crate::ship_key`]): a row whose commit was not marked locally
//! ships again and is stored once.

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hangwatch_history::{FleetTarget, HistoryDb, HistoryRequest, PendingVerdict};
use hangwatch_model::{error_chain, Recurrence};
use serde::Serialize;

use crate::credentials::ProcessEnv;
use crate::db::FleetDb;

/// Rows shipped per transaction.
const SHIP_BATCH: usize = 500;
/// Rows that waited, shipped with a new verdict before its lookup (the rest follow after the answer).
const SHIP_BEFORE_LOOKUP: usize = 100;

/// What a shipping pass did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ShipReport {
    /// Rows sent (new in the fleet database or already there).
    pub shipped: u64,
    /// Rows that still wait (the pass stopped, or new ones came).
    pub pending: u64,
}

enum Step {
    Looked(Result<Box<Recurrence>, String>),
    Shipped(Result<ShipReport, String>),
}

/// The `__record-history` child: a [`HistoryRequest`] as JSON on `input`, recorded locally; each answer is
/// handed to `emit` (one JSON line each on stdout), the best last. Errors are one line for the parent's report.
pub fn record_child_main(
    db: &Path,
    input: impl std::io::Read,
    mut emit: impl FnMut(&Recurrence) -> Result<(), String>,
) -> Result<(), String> {
    let request: HistoryRequest =
        serde_json::from_reader(input).map_err(|e| format!("bad history request on stdin: {e}"))?;
    let recorded = request.record_entry(db).map_err(|e| error_chain(&e))?;
    emit(&recorded.recurrence)?;
    let Some(target) = request.fleet.clone() else {
        return Ok(());
    };
    let budget = Duration::from_secs_f64(target.deadline_s.clamp(0.0, 3600.0));
    let started = Instant::now();
    let (tx, rx) = mpsc::channel();
    let db_path = db.to_path_buf();
    let own_id = recorded.id;
    let spawned = std::thread::Builder::new()
        .name("hw-fleet".into())
        .spawn(move || fleet_worker(&target, &db_path, own_id, budget, &tx));
    if let Err(e) = spawned {
        return Err(format!("cannot start the fleet database thread: {e}"));
    }
    let mut local = recorded.recurrence;
    let fleet = match rx.recv_timeout(budget) {
        Ok(Step::Looked(Ok(recurrence))) => *recurrence,
        Ok(Step::Looked(Err(why))) => {
            local.fleet_unavailable = Some(why);
            local
        }
        Ok(Step::Shipped(_)) | Err(_) => {
            local.fleet_unavailable = Some(format!(
                "the fleet database did not answer within {:.1}s; the verdict waits in this node's history",
                budget.as_secs_f64()
            ));
            emit(&local)?;
            return Ok(());
        }
    };
    let looked_up = fleet.fleet_unavailable.is_none();
    emit(&fleet)?;
    if looked_up {
        // The backlog, within what is left of the deadline: the parent is waiting for this process.
        let left = budget.saturating_sub(started.elapsed());
        if let Ok(Step::Shipped(Err(why))) = rx.recv_timeout(left) {
            tracing::warn!(error = %why, "verdicts wait in this node's history");
        }
    }
    Ok(())
}

fn fleet_worker(
    target: &FleetTarget,
    db: &Path,
    own_id: i64,
    budget: Duration,
    tx: &mpsc::Sender<Step>,
) {
    let looked = (|| -> Result<(FleetDb, HistoryDb, Recurrence), String> {
        let mut local = HistoryDb::open_existing(db).map_err(|e| error_chain(&e))?;
        let own = local
            .for_shipping_by_id(own_id)
            .map_err(|e| error_chain(&e))?
            .ok_or_else(|| format!("verdict {own_id} is gone from {}", db.display()))?;
        let mut fleet =
            FleetDb::connect(target, &ProcessEnv, budget).map_err(|e| error_chain(&e))?;
        // What waited ships with it, so that the lookup counts it (a bounded batch: the rest after the answer).
        let mut batch = local
            .pending(SHIP_BEFORE_LOOKUP)
            .map_err(|e| error_chain(&e))?;
        if !batch.iter().any(|v| v.id == own.id) {
            batch.push(own.clone());
        }
        fleet.ship(&batch).map_err(|e| error_chain(&e))?;
        let ids: Vec<i64> = batch.iter().map(|v| v.id).collect();
        local.mark_shipped(&ids).map_err(|e| error_chain(&e))?;
        let recurrence = fleet
            .lookup(&own, target.incident_window_s)
            .map_err(|e| error_chain(&e))?;
        Ok((fleet, local, recurrence))
    })();
    let (mut fleet, mut local) = match looked {
        Ok((fleet, local, recurrence)) => {
            let _ = tx.send(Step::Looked(Ok(Box::new(recurrence))));
            (fleet, local)
        }
        Err(why) => {
            let _ = tx.send(Step::Looked(Err(why)));
            return;
        }
    };
    let _ = tx.send(Step::Shipped(ship_backlog(&mut local, &mut fleet)));
}

/// Ships every row of `local` that waits, oldest first, in batches, marking each batch once it is committed.
pub fn ship_backlog(local: &mut HistoryDb, fleet: &mut FleetDb) -> Result<ShipReport, String> {
    let mut report = ShipReport::default();
    loop {
        let batch: Vec<PendingVerdict> = local.pending(SHIP_BATCH).map_err(|e| error_chain(&e))?;
        if batch.is_empty() {
            break;
        }
        fleet.ship(&batch).map_err(|e| error_chain(&e))?;
        let ids: Vec<i64> = batch.iter().map(|v| v.id).collect();
        local.mark_shipped(&ids).map_err(|e| error_chain(&e))?;
        report.shipped += ids.len() as u64;
        if batch.len() < SHIP_BATCH {
            break;
        }
    }
    report.pending = local.pending_count().map_err(|e| error_chain(&e))?;
    Ok(report)
}

/// The `__ship-history --db PATH` child: a [`FleetTarget`] as JSON on `input`; ships what waits in the node's
/// history. Its parent bounds it with a deadline. Nothing to do when the history does not exist yet.
pub fn ship_child_main(db: &Path, input: impl std::io::Read) -> Result<ShipReport, String> {
    let target: FleetTarget =
        serde_json::from_reader(input).map_err(|e| format!("bad fleet target on stdin: {e}"))?;
    if std::fs::symlink_metadata(db).is_err() {
        return Ok(ShipReport::default());
    }
    let mut local = HistoryDb::open_existing(db).map_err(|e| error_chain(&e))?;
    if local.pending_count().map_err(|e| error_chain(&e))? == 0 {
        return Ok(ShipReport::default());
    }
    let timeout = Duration::from_secs_f64(target.deadline_s.clamp(0.5, 3600.0));
    let mut fleet = FleetDb::connect(&target, &ProcessEnv, timeout).map_err(|e| error_chain(&e))?;
    ship_backlog(&mut local, &mut fleet)
}
