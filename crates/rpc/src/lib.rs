//! The agent<->coordinator protocol (docs/coordinator-protocol.md): the generated gRPC types, TLS with the job's
//! key on every connection, the per-job token checked on every call (and refused when it is too weak), the fair
//! budget of handshakes in flight, typed refusals, the size and deadline limits, and the coalescing of progress
//! reports.

mod accept;
mod auth;
mod budget;
mod client;
mod progress;
mod refusal;
mod strength;
pub mod tls;

pub use accept::{accept_link, LinkConnection, HANDSHAKE_DEADLINE};
pub use auth::{CheckToken, JobSecret, JobToken, SendToken, TokenError, TOKEN_HEADER};
pub use budget::{
    Admission, HandshakeBudget, MAX_HANDSHAKES, MAX_HANDSHAKES_PER_ADDRESS, MAX_KNOWN_ADDRESSES,
    MAX_RESERVED_FOR_KNOWN,
};
pub use client::{connect, with_deadline, Client, ConnectError};
pub use progress::ProgressCoalescer;
pub use refusal::{Refusal, RefusalKind, REFUSAL_HEADER};
pub use strength::{
    check_token_strength, new_token_text, token_strength, Alphabet, NoRandomness, TokenStrength,
    Weakness, MIN_DISTINCT_CHARACTERS, MIN_TOKEN_BITS, NEW_TOKEN_BYTES,
};
pub use tls::{LinkKey, LinkKeyError};

use std::time::Duration;

use hangwatch_model::{NodeObservations, StallTier, NODE_OBSERVATIONS_VERSION};

/// The generated messages, client and server of `proto/coordinator.proto`.
pub mod pb {
    tonic::include_proto!("hangwatch.coordinator.v1");
}

/// The protocol both ends speak; bumped on a change that an older peer cannot read. Register refuses a mismatch.
pub const PROTOCOL_VERSION: u32 = 2;

/// The largest message either end decodes. A node's observations at 8 ranks with a few dozen threads each and
/// Python stacks are a few hundred KiB; the job-wide verdict inside a terminate order grows with the job
/// (10,000 ranks: a few MiB). Anything larger is refused rather than buffered.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Deadline of a Register call (the coordinator answers from memory).
pub const REGISTER_DEADLINE: Duration = Duration::from_secs(5);

/// How often an agent sends a progress report unless the coordinator says otherwise.
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// A stall tier as the progress report carries it.
pub fn stall_tier_to_wire(tier: StallTier) -> pb::StallTier {
    match tier {
        StallTier::Healthy => pb::StallTier::StallHealthy,
        StallTier::Soft => pb::StallTier::StallSoft,
        StallTier::Hard => pb::StallTier::StallHard,
    }
}

/// A progress report's stall tier. A value this version does not know reads as healthy: an agent that says
/// nothing the coordinator understands must not end the job.
pub fn stall_tier_from_wire(value: i32) -> StallTier {
    match pb::StallTier::try_from(value).unwrap_or(pb::StallTier::StallHealthy) {
        pb::StallTier::StallHealthy => StallTier::Healthy,
        pb::StallTier::StallSoft => StallTier::Soft,
        pb::StallTier::StallHard => StallTier::Hard,
    }
}

/// Observations that could not be read from a roll-call report.
#[derive(Debug, thiserror::Error)]
pub enum ObservationsError {
    #[error("roll-call report is not valid node observations JSON ({bytes} bytes)")]
    Json {
        bytes: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("node observations version {got}, this coordinator reads version {want}: run the same hangwatch version on every node")]
    Version { got: u32, want: u32 },
}

/// A node's observations as they travel inside [`pb::RollCallReport::observations_json`].
pub fn encode_observations(observations: &NodeObservations) -> Vec<u8> {
    // Serializing plain structs of strings and numbers cannot fail; an empty payload is refused by the reader.
    serde_json::to_vec(observations).unwrap_or_default()
}

/// Reads what [`encode_observations`] wrote, refusing another version of the observations.
pub fn decode_observations(bytes: &[u8]) -> Result<NodeObservations, ObservationsError> {
    let observations: NodeObservations =
        serde_json::from_slice(bytes).map_err(|source| ObservationsError::Json {
            bytes: bytes.len(),
            source,
        })?;
    if observations.version != NODE_OBSERVATIONS_VERSION {
        return Err(ObservationsError::Version {
            got: observations.version,
            want: NODE_OBSERVATIONS_VERSION,
        });
    }
    Ok(observations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_survive_the_wire_and_another_version_is_refused() {
        let mut obs = NodeObservations::new(Some("n1".into()), 300);
        obs.unreadable.push("no kernel log".into());
        let bytes = encode_observations(&obs);
        assert_eq!(decode_observations(&bytes).ok(), Some(obs.clone()));

        obs.version = NODE_OBSERVATIONS_VERSION + 1;
        let err = decode_observations(&encode_observations(&obs)).err();
        assert!(
            matches!(err, Some(ObservationsError::Version { .. })),
            "{err:?}"
        );
        assert!(matches!(
            decode_observations(b"{not json"),
            Err(ObservationsError::Json { bytes: 9, .. })
        ));
    }
}
