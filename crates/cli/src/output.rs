//! Where output goes: human text and logs on stderr, exactly one JSON document on stdout with `--json`.

use tracing_subscriber::EnvFilter;

/// Logs go to stderr, filtered by `HANGWATCH_LOG` or the `-v` count.
pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter =
        EnvFilter::try_from_env("HANGWATCH_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(hangwatch_agent::human::LogWriter)
        // Colors only for a person at a terminal: a log file or a Slurm output file gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Prints one JSON document on stdout (`hangwatch_agent::human::print_json`).
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    Ok(hangwatch_agent::human::print_json(value)?)
}
