//! Wire types of hangwatch: the verdict (SPEC.md, `"version": 1`) and the observations of rank processes that the
//! pure decisions in `hangwatch-diagnosis` are made from.
//!
//! Every field that does not apply is `None` and serializes as `null`: hangwatch never invents a value.

mod alerting;
mod clock;
mod collectives;
mod container;
mod death;
mod errors;
pub mod exit;
mod interned;
pub mod kernel_log;
mod node;
mod observation;
mod rank_ranges;
mod recurrence;
mod sockets;
mod stall;
mod timeline;
mod units;
mod verdict;

pub use alerting::{NotSentReason, TargetKind};
pub use clock::{
    coarse_duration_text, duration_text, format_duration, format_limit, parse_iso, rfc3339,
    unix_now, utc_stamp, utc_time, WallTime, WallTimeParseError,
};
pub use collectives::{
    CollectiveAnalysis, CollectiveCall, CollectiveEntry, CollectiveFinding, CollectiveRecord,
    CollectiveState, FlightRecorderError, GroupRecord, MAX_FLIGHT_RECORDER_DUMP_BYTES,
};
pub use container::{ContainerEnded, ContainerRef};
pub use death::RankDeath;
pub use errors::error_chain;
pub use interned::intern;
pub use node::*;
pub use observation::*;
pub use rank_ranges::{rank_ranges, ranks_words};
pub use recurrence::{FleetIncident, IncidentMember, Recurrence, RecurrenceSource, Sighting};
pub use sockets::*;
pub use stall::StallTier;
pub use timeline::*;
pub use units::{parse_duration, parse_nonzero_duration, parse_since, parse_size};
pub use verdict::*;

/// For `skip_serializing_if`: a count that is zero is left out of the JSON.
pub(crate) fn is_zero(n: &u32) -> bool {
    *n == 0
}
