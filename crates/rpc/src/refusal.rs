//! Why the coordinator refused a registration or a call: a typed kind that travels in a metadata header next to
//! the gRPC status, so an agent can act on it (stop, or register again) and print the message as it is.

use std::fmt;

use tonic::{Code, Status};

/// The metadata header of a refused call that names its [`RefusalKind`].
pub const REFUSAL_HEADER: &str = "hangwatch-refusal";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// The two ends speak different protocol versions.
    VersionMismatch,
    /// The agent belongs to another job than the coordinator's.
    OtherJob,
    /// A node with that name (or node rank) is already registered and still heard from.
    DuplicateNode,
    /// Every expected node has registered; a new one is a late join.
    JobComplete,
    /// The session is not (or no longer) known: register again.
    UnknownSession,
    /// The request itself is malformed (empty node name, unreadable observations).
    BadRequest,
}

impl RefusalKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::VersionMismatch => "version_mismatch",
            Self::OtherJob => "other_job",
            Self::DuplicateNode => "duplicate_node",
            Self::JobComplete => "job_complete",
            Self::UnknownSession => "unknown_session",
            Self::BadRequest => "bad_request",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Self::VersionMismatch,
            Self::OtherJob,
            Self::DuplicateNode,
            Self::JobComplete,
            Self::UnknownSession,
            Self::BadRequest,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }

    fn code(self) -> Code {
        match self {
            Self::VersionMismatch | Self::OtherJob | Self::JobComplete => Code::FailedPrecondition,
            Self::DuplicateNode => Code::AlreadyExists,
            Self::UnknownSession => Code::NotFound,
            Self::BadRequest => Code::InvalidArgument,
        }
    }
}

/// A refusal: its kind and a message that says what was wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Refusal {
    pub kind: RefusalKind,
    pub message: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Refusal {
    pub fn new(kind: RefusalKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The status the coordinator answers with.
    pub fn to_status(&self) -> Status {
        let mut status = Status::new(self.kind.code(), self.message.clone());
        status.metadata_mut().insert(
            REFUSAL_HEADER,
            tonic::metadata::MetadataValue::from_static(self.kind.as_str()),
        );
        status
    }

    /// The refusal a status carries, when it is one (not a transport failure or a missing token).
    pub fn from_status(status: &Status) -> Option<Self> {
        let kind = status
            .metadata()
            .get(REFUSAL_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(RefusalKind::parse)?;
        Some(Self::new(kind, status.message()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_crosses_a_status_intact() {
        let r = Refusal::new(RefusalKind::DuplicateNode, "node n1 is already registered");
        let status = r.to_status();
        assert_eq!(status.code(), Code::AlreadyExists);
        assert_eq!(Refusal::from_status(&status), Some(r));
        assert_eq!(
            Refusal::from_status(&Status::unavailable("connection refused")),
            None
        );
    }
}
