//! `hangwatch config [COMMAND] [--json]`: every option's effective value before the command line, and where it
//! comes from (a file's line, a variable, hangwatch's default), for the public commands or one of them.

use std::process::ExitCode;

use clap::Command;
use hangwatch_agent::human::{write, Stream};

use crate::exit::usage;
use hangwatch_config::{document, public_commands, Loaded};

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Files, in order (later wins): /etc/hangwatch/config.toml (or the file `hangwatch --config FILE` or HANGWATCH_CONFIG
names), then ~/.config/hangwatch/config.toml ($XDG_CONFIG_HOME); then HANGWATCH_<OPTION> variables; then the
command line. See docs/configuration.md.")]
pub struct Args {
    /// Only this command's options (run, coordinator, ...).
    command: Option<String>,
    /// Print one JSON document on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args, loaded: &Loaded) -> anyhow::Result<ExitCode> {
    let mut root = loaded.root.clone();
    root.build();
    let commands: Vec<&Command> = match &args.command {
        Some(name) => vec![public_commands(&root)
            .find(|c| c.get_name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = public_commands(&root).map(|c| c.get_name()).collect();
                usage(format!(
                    "no command `{name}`; the commands are {}",
                    names.join(", ")
                ))
            })?],
        None => public_commands(&root)
            .filter(|c| c.get_name() != "config")
            .collect(),
    };
    let env = |name: &str| std::env::var(name).ok();
    let document = document::document(loaded, &commands, &env);
    if args.json {
        crate::output::print_json(&document)?;
    } else {
        write(Stream::Stdout, document::render(&document).into_bytes());
    }
    Ok(ExitCode::SUCCESS)
}
