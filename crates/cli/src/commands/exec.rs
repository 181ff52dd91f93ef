//! `hangwatch __exec -- PROGRAM [ARGS...]`: becomes PROGRAM. The child that `external_command` starts instead of the
//! program itself, so that finding or reading the program (a `PATH` through a stopped filesystem) blocks this
//! process, which the parent abandons at its deadline, never the parent's `spawn`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The program (searched in `PATH` unless it has a `/`), then its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

/// Exit code when the program cannot be started, as a shell reports "command not found".
const CANNOT_EXEC: u8 = 127;

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Some((program, rest)) = args.command.split_first() else {
        return Ok(ExitCode::from(CANNOT_EXEC));
    };
    // Only returns on failure; the environment and standard streams are this process's, set by the parent.
    let error = std::process::Command::new(program).args(rest).exec();
    // The parent reads stderr: this is the message it reports.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "cannot run {}: {error}",
        program.to_string_lossy()
    );
    Ok(ExitCode::from(CANNOT_EXEC))
}
