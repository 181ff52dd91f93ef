//! One module per subcommand.

pub mod coordinator;
pub mod demo;
pub mod dump;
pub mod inspect_child;
pub mod job_children;
pub mod kmsg;
pub mod log_sink;
pub mod log_writer;
pub mod metrics;
pub mod not_yet;
pub mod own_output;
pub mod probe;
pub mod read_strings;
pub mod run;
