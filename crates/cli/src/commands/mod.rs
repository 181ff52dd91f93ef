//! One module per subcommand.

pub mod config;
pub mod coordinator;
pub mod demo;
pub mod doctor;
pub mod dump;
pub mod exec;
pub mod history;
pub mod inspect_child;
pub mod job_children;
pub mod kmsg;
pub mod log_writer;
pub mod metrics;
pub mod node;
pub mod probe;
pub mod read_config;
pub mod read_maps;
pub mod read_strings;
pub mod report;
pub mod run;
pub mod steps;
pub mod token;
