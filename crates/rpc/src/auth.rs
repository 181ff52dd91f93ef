//! The per-job token: kept out of logs, attached to every call by agents, checked in constant time on every call
//! by the coordinator before any handler runs.

use std::fmt;
use std::sync::Arc;

use subtle::ConstantTimeEq;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

use crate::strength::{check_token_strength, Weakness};
use crate::tls::{LinkKey, LinkKeyError};

/// The metadata header that carries the token, as `Bearer <token>`.
pub const TOKEN_HEADER: &str = "authorization";

const BEARER: &str = "Bearer ";

/// A token that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the job token is empty: make one with `hangwatch token new FILE`")]
    Empty,
    #[error(
        "the job token may only hold printable ASCII without spaces (it travels in a gRPC header)"
    )]
    NotPrintable,
    /// Too guessable to derive the link's key from (crate::strength says why the bar is where it is).
    #[error(
        "the job token is too weak: {0}; anyone who can reach the coordinator could guess it offline: make a \
         fresh one with `hangwatch token new FILE` (256 random bits)"
    )]
    Weak(Weakness),
}

/// The shared secret of one job. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct JobToken(Arc<str>);

impl JobToken {
    /// A token from the contents of a token file; surrounding whitespace (a trailing newline) is not part of it.
    /// A token weaker than [`crate::MIN_TOKEN_BITS`] (by [`crate::check_token_strength`]) is refused: no link key is
    /// ever derived from one.
    pub fn new(text: &str) -> Result<Self, TokenError> {
        let token = text.trim();
        if token.is_empty() {
            return Err(TokenError::Empty);
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::NotPrintable);
        }
        check_token_strength(token).map_err(TokenError::Weak)?;
        Ok(Self(token.into()))
    }

    /// The secret itself, for deriving the job's link key (crate::tls).
    pub(crate) fn secret(&self) -> &str {
        &self.0
    }

    fn matches(&self, presented: &str) -> bool {
        // Constant time for equal lengths; the length of the token is not the secret.
        bool::from(self.0.as_bytes().ct_eq(presented.as_bytes()))
    }
}

impl fmt::Debug for JobToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobToken(<redacted>)")
    }
}

/// What both ends of one job's link hold: the token (sent on every call) and the link key derived from it and the
/// job id (crate::tls). Cheap to clone; `Debug` shows the key's public id only.
#[derive(Clone, Debug)]
pub struct JobSecret {
    token: JobToken,
    job_id: Arc<str>,
    key: LinkKey,
}

impl JobSecret {
    pub fn new(token: JobToken, job_id: &str) -> Result<Self, LinkKeyError> {
        let key = LinkKey::derive(&token, job_id)?;
        Ok(Self {
            token,
            job_id: job_id.into(),
            key,
        })
    }

    pub fn token(&self) -> &JobToken {
        &self.token
    }

    /// The job the key is for.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    pub fn key(&self) -> &LinkKey {
        &self.key
    }
}

/// Server side: refuses a call whose token is missing or wrong before it reaches a handler, and logs the peer.
#[derive(Clone, Debug)]
pub struct CheckToken {
    token: JobToken,
}

impl CheckToken {
    pub fn new(token: JobToken) -> Self {
        Self { token }
    }
}

impl tonic::service::Interceptor for CheckToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let presented = request
            .metadata()
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix(BEARER));
        let problem = match presented {
            Some(t) if self.token.matches(t) => return Ok(request),
            Some(_) => "wrong job token",
            None => "no job token",
        };
        let peer = request
            .remote_addr()
            .map_or_else(|| "unknown".to_string(), |a| a.to_string());
        tracing::warn!(%peer, problem, "refused a call to the coordinator");
        Err(Status::unauthenticated(format!(
            "{problem}: every node of the job must use the job's token file (header `{TOKEN_HEADER}: Bearer <token>`)"
        )))
    }
}

/// Client side: attaches the token to every call.
#[derive(Clone, Debug)]
pub struct SendToken {
    header: MetadataValue<tonic::metadata::Ascii>,
}

impl SendToken {
    pub fn new(token: &JobToken) -> Self {
        let mut header: MetadataValue<tonic::metadata::Ascii> = format!("{BEARER}{}", token.0)
            .parse()
            // JobToken::new admits printable ASCII only, which is always a valid header value.
            .unwrap_or_else(|_| MetadataValue::from_static(""));
        header.set_sensitive(true);
        Self { header }
    }

    /// A client that sends no token at all (tests of the refusal).
    pub fn none() -> Self {
        Self {
            header: MetadataValue::from_static(""),
        }
    }
}

impl tonic::service::Interceptor for SendToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if !self.header.is_empty() {
            request
                .metadata_mut()
                .insert(TOKEN_HEADER, self.header.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    const TOKEN: &str = "3f9a0c7e5b21d84c6e0f1a9b7d3c2e58";

    fn call(check: &mut CheckToken, header: Option<&str>) -> Result<(), Status> {
        let mut request = Request::new(());
        if let Some(h) = header {
            request
                .metadata_mut()
                .insert(TOKEN_HEADER, h.parse().expect("ascii header"));
        }
        check.call(request).map(|_| ())
    }

    #[test]
    fn only_the_right_token_passes() {
        let token = JobToken::new(&format!("{TOKEN}\n")).expect("token");
        let mut check = CheckToken::new(token.clone());
        assert!(call(&mut check, Some(&format!("Bearer {TOKEN}"))).is_ok());
        for bad in [
            None,
            Some(format!("Bearer {}", &TOKEN[1..])),
            Some(format!("Bearer {TOKEN}2")),
            Some(TOKEN.to_string()),
            Some("Bearer ".to_string()),
        ] {
            let err = call(&mut check, bad.as_deref()).expect_err("refused");
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{bad:?}");
            assert!(err.message().contains("job token"), "{}", err.message());
        }
        let mut send = SendToken::new(&token);
        let sent = send.call(Request::new(())).expect("sent");
        assert!(check.call(sent).is_ok());
    }

    #[test]
    fn tokens_are_checked_for_shape_and_never_printed() {
        assert!(matches!(JobToken::new(" \n"), Err(TokenError::Empty)));
        assert!(matches!(
            JobToken::new("a b"),
            Err(TokenError::NotPrintable)
        ));
        let t = JobToken::new(TOKEN).expect("token");
        assert_eq!(format!("{t:?}"), "JobToken(<redacted>)");
    }

    #[test]
    fn a_weak_token_is_refused_with_the_command_that_makes_a_good_one() {
        let err = JobToken::new("abc\n").expect_err("weak");
        assert!(matches!(err, TokenError::Weak(_)), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains("about 12 bits") && message.contains("hangwatch token new FILE"),
            "{message}"
        );
        let fresh = crate::new_token_text().expect("random");
        assert!(JobToken::new(&fresh).is_ok());
    }
}
