//! Exit codes (SPEC.md) and how `main` turns a command's result into one.

use std::process::ExitCode;

use hangwatch_model::exit::{EXIT_FAILURE, EXIT_HUNG, EXIT_USAGE};

/// Usage or configuration error, as `ExitCode` takes it.
pub const USAGE: u8 = EXIT_USAGE as u8;
/// hangwatch's own failure.
pub const FAILURE: u8 = EXIT_FAILURE as u8;
/// hangwatch ended a hung job (the coordinator's exit as the agents').
pub const HUNG: u8 = EXIT_HUNG as u8;

pub use hangwatch_model::exit::UsageError;

/// Shorthand for returning a [`UsageError`].
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(message.into()))
}

/// How long the exit waits for hangwatch's own output to be written (a reader that stopped must not hold it).
const OUTPUT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(3);

/// Prints the error chain on stderr and maps it to the SPEC's exit code, after hangwatch's own output is written
/// (or its deadline passed).
pub fn finish(result: anyhow::Result<ExitCode>) -> ExitCode {
    let code = decide(result);
    hangwatch_agent::human::flush(OUTPUT_DEADLINE);
    code
}

fn decide(result: anyhow::Result<ExitCode>) -> ExitCode {
    use hangwatch_agent::human::say;
    match result {
        Ok(code) => code,
        Err(err) => {
            let code = if err.downcast_ref::<UsageError>().is_some() {
                USAGE
            } else {
                FAILURE
            };
            let mut text = format!("hangwatch: error: {err}");
            for cause in err.chain().skip(1) {
                text.push_str(&format!("\n  caused by: {cause}"));
            }
            say(text);
            ExitCode::from(code)
        }
    }
}
