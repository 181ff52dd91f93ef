//! The test kit's error type, and which errors mean "this machine cannot run the test" (a skip) rather than a bug.

use std::time::Duration;

/// Why a test fixture could not be set up or torn down.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    /// The fixture needs root (mount, loop devices, fsfreeze). A skip, not a failure.
    #[error("{what} needs root (running as uid {uid})")]
    NotRoot { what: &'static str, uid: u32 },
    /// A program or device the fixture relies on is not installed. A skip, not a failure.
    #[error("{tool} is not available: {hint}")]
    Missing { tool: String, hint: &'static str },
    /// A helper program ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        command: String,
        status: String,
        stderr: String,
    },
    /// A helper program did not finish in time; it was killed and left behind.
    #[error("`{command}` did not finish within {after:?}")]
    CommandTimedOut { command: String, after: Duration },
    /// A condition the fixture waits for did not come true in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    /// A fixture was used in a way it does not support (freezing twice, an unknown rank).
    #[error("{0}")]
    Misuse(String),
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl TestkitError {
    /// `Some(reason)` when the error means the test cannot run on this machine (not root, tool missing), so the
    /// test should be skipped with that reason instead of failing.
    pub fn skip_reason(&self) -> Option<String> {
        match self {
            TestkitError::NotRoot { .. } | TestkitError::Missing { .. } => Some(self.to_string()),
            _ => None,
        }
    }

    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestkitError {
        let context = context.into();
        move |source| TestkitError::Io { context, source }
    }
}

/// Result of a test-kit operation.
pub type Result<T, E = TestkitError> = std::result::Result<T, E>;

/// Unwraps a fixture or skips the test: on a skip error (not root, tool missing) prints `SKIPPED: <reason>` on
/// stderr and returns from the enclosing test function; any other error panics with the error chain.
///
/// Set `HANGWATCH_TESTKIT_STRICT=1` (CI does) to turn skips into failures, so a misconfigured CI machine cannot
/// silently skip every system test.
///
/// ```no_run
/// use hangwatch_testkit::{require, LoopExt4};
/// fn frozen_mount_test() {
///     let fs = require!(LoopExt4::new(32));
///     // ...
/// }
/// ```
#[macro_export]
macro_rules! require {
    ($fixture:expr) => {
        match $fixture {
            Ok(value) => value,
            Err(err) => match $crate::TestkitError::skip_reason(&err) {
                Some(reason) if !$crate::strict_mode() => {
                    eprintln!("SKIPPED: {reason}");
                    return;
                }
                _ => panic!("test fixture failed: {}", $crate::error_chain(&err)),
            },
        }
    };
}

/// Whether skips must fail (`HANGWATCH_TESTKIT_STRICT=1`).
pub fn strict_mode() -> bool {
    std::env::var_os("HANGWATCH_TESTKIT_STRICT").is_some_and(|v| v == "1")
}

/// The error and its causes on one line, for panic messages (hangwatch's own, so that tests print errors as it
/// does).
pub use hangwatch_model::error_chain;
