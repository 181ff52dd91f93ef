//! `hangwatch report`: reads an evidence bundle (a node's report directory, or a coordinator's merged verdict) and
//! renders it as one self-contained HTML page for the person on call.
//!
//! ```no_run
//! let bundle = hangwatch_report::Bundle::read(std::path::Path::new("/var/tmp/hangwatch-0/run-..."))?;
//! let page: String = hangwatch_report::render_html(&bundle);
//! # Ok::<(), hangwatch_report::ReportError>(())
//! ```

mod bundle;
mod escape;
pub mod grid;
mod html;
pub mod summary;
mod timeline;

pub use bundle::{Bundle, FileProblem, Problem, ReportError, RunInfo, Thresholds, TAIL_LINES};
pub use escape::escape;
pub use html::render_html;
