//! The live kernel log printed as it comes (`hangwatch kmsg` without a file): one line per finished event, as
//! text or as one JSON object per line (JSON Lines).

use std::fs::File;
use std::io::Write;
use std::ops::ControlFlow;

use serde::Serialize;

use crate::follow::{boot_time_unix_s, follow, FollowError, FollowSummary, DEFAULT_IDLE};
use crate::report::Since;
use crate::{render_event, Event, REPORT_VERSION};

/// One JSON Lines record: `{"version": 1, "event": "hung_task", ...the event's own fields}`.
#[derive(Serialize)]
struct EventLine<'a> {
    version: u32,
    #[serde(flatten)]
    event: &'a Event,
}

/// Why printing the live log stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error(transparent)]
    Follow(#[from] FollowError),
    #[error("writing the events out")]
    Write(#[source] std::io::Error),
}

/// Follows `kmsg` (the device, opened with [`crate::open_kmsg`]) and writes each finished event at or after `since`
/// to `out`, flushed per line. A closed `out` (`| head`: a broken pipe) ends the follow quietly.
pub fn print_live(
    kmsg: File,
    since: Option<Since>,
    json: bool,
    out: &mut dyn Write,
) -> Result<FollowSummary, LiveError> {
    let mut write_error = None;
    let summary = follow(kmsg, DEFAULT_IDLE, boot_time_unix_s(), |event: Event| {
        if since.is_some_and(|s| !s.admits(event.time())) {
            return ControlFlow::Continue(());
        }
        match write_event(&mut *out, &event, json) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                write_error = Some(e);
                ControlFlow::Break(())
            }
        }
    })?;
    match write_error {
        Some(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(LiveError::Write(e)),
        _ => Ok(summary),
    }
}

fn write_event(out: &mut dyn Write, event: &Event, json: bool) -> std::io::Result<()> {
    if json {
        let line = EventLine {
            version: REPORT_VERSION,
            event,
        };
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    } else {
        writeln!(out, "{}", render_event(event))?;
    }
    out.flush()
}
