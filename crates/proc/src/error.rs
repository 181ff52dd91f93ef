//! Errors of the /proc parsers and of the reader.

use std::path::PathBuf;

/// A /proc file's text did not have the shape the kernel documents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("{file}: empty")]
    Empty { file: &'static str },
    #[error("{file}: field `{field}` is missing")]
    Missing {
        file: &'static str,
        field: &'static str,
    },
    #[error("{file}: field `{field}` has an invalid value {value:?}")]
    Invalid {
        file: &'static str,
        field: &'static str,
        value: String,
    },
}

impl ParseError {
    pub(crate) fn invalid(file: &'static str, field: &'static str, value: &str) -> Self {
        let mut value = value.to_owned();
        if value.len() > 80 {
            let mut end = 80;
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            value.truncate(end);
        }
        ParseError::Invalid { file, field, value }
    }
}

/// Reading a /proc entry failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The process is gone (its /proc directory vanished): not a failure of hangwatch, the caller reports the
    /// rank as exited.
    #[error("process {pid} exited")]
    ProcessExited { pid: i32 },
    /// The thread is gone while its process is still there.
    #[error("thread {tid} of process {pid} exited")]
    ThreadExited { pid: i32, tid: i32 },
    #[error("permission denied reading {}", path.display())]
    PermissionDenied {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: ParseError,
    },
}

impl ReadError {
    /// The process (or the thread) no longer exists: callers treat this as an observation, not a failure.
    pub fn is_exited(&self) -> bool {
        matches!(
            self,
            ReadError::ProcessExited { .. } | ReadError::ThreadExited { .. }
        )
    }
}
