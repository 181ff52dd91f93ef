//! `hangwatch probe`: is the filesystem holding each PATH responsive? Also the hidden `__probe-child` that does
//! the touching, in a process the parent can abandon. The work itself lives in `hangwatch_inspect::probe`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use hangwatch_inspect::probe::{
    child_main, human_line, ChildRequest, ProbeError, ProbeOptions, Prober,
};
use hangwatch_model::ProbeResult;
use serde::Serialize;

use crate::exit::usage;
use hangwatch_model::parse_nonzero_duration;

/// Exit code when a filesystem does not respond (or its state cannot be determined).
const NOT_RESPONDING: u8 = 1;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Each PATH is probed in a throwaway child process: stat, statfs, then a write (create, fsync and remove a hidden \
.hangwatch-probe-* file in PATH's directory), because a frozen filesystem still answers stat and statfs. A probe \
that does not return is abandoned at the timeout, never waited for; paths on different mounts are probed in \
parallel.

Exit status: 0 every filesystem responded; 1 at least one did not respond or could not be judged; 2 usage error \
(bad duration, PATH does not exist).")]
pub struct Args {
    /// Files or directories whose filesystems to probe.
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Give up on a probe after this long (`500ms`, `2s`, `1m`).
    #[arg(long, default_value = "2s", value_parser = parse_nonzero_duration, value_name = "DUR")]
    timeout: Duration,
    /// Skip the write step (judge on stat and statfs only: a frozen filesystem may then look healthy).
    #[arg(long)]
    read_only: bool,
    /// Print one JSON document `{"version":1,"probes":[...]}` on stdout.
    #[arg(long)]
    json: bool,
}

/// Arguments of `hangwatch __probe-child`, as [`ChildRequest::to_args`] writes them.
#[derive(Debug, clap::Args)]
pub struct ChildArgs {
    /// The absolute path to probe.
    path: PathBuf,
    /// Skip the write step.
    #[arg(long)]
    read_only: bool,
    /// Name of the hidden file the write step creates.
    #[arg(long, value_name = "NAME")]
    probe_file: String,
    /// Probe files left behind by earlier stuck probes, removed once a write succeeds.
    #[arg(long, value_name = "FILE")]
    cleanup: Vec<PathBuf>,
    /// PATH is in the mount namespace of this process (a rank in a container).
    #[arg(long, value_name = "PID")]
    in_root_of: Option<i32>,
}

#[derive(Serialize)]
struct Report<'a> {
    version: u32,
    probes: &'a [ProbeResult],
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.timeout.is_zero() {
        return Err(usage("--timeout must be longer than 0 (e.g. --timeout 2s)"));
    }
    let options = ProbeOptions {
        timeout: args.timeout,
        write: !args.read_only,
    };
    let mut prober = Prober::new()?;
    let outcomes = prober.probe_all(&args.paths, &options);

    let mut results = Vec::with_capacity(outcomes.len());
    let mut missing = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(result) => results.push(result),
            Err(ProbeError::NotFound { path, .. }) => missing.push(path),
            Err(other) => return Err(other.into()),
        }
    }
    if !missing.is_empty() {
        let (subject, verb) = match missing.len() {
            1 => (missing[0].clone(), "does"),
            _ => (missing.join(", "), "do"),
        };
        return Err(usage(format!(
            "{subject} {verb} not exist: give the path of a file or directory on the filesystem you want to probe"
        )));
    }

    if args.json {
        crate::output::print_json(&Report {
            version: 1,
            probes: &results,
        })?;
    } else {
        for result in &results {
            println!("{}", human_line(result));
        }
    }
    Ok(exit_code(&results))
}

/// 0 when every filesystem responded, [`NOT_RESPONDING`] otherwise (unknown counts as not responding: a script
/// asking "is it safe to write there?" must not get yes for "could not tell").
fn exit_code(results: &[ProbeResult]) -> ExitCode {
    if results.iter().all(|r| r.responsive == Some(true)) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(NOT_RESPONDING)
    }
}

pub fn run_child(args: ChildArgs) -> anyhow::Result<ExitCode> {
    let request = ChildRequest {
        path: args.path,
        write: !args.read_only,
        probe_file_name: args.probe_file,
        cleanup: args.cleanup,
        in_root_of: args.in_root_of,
    };
    let code = child_main(&request);
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(responsive: Option<bool>) -> ProbeResult {
        ProbeResult {
            filesystem: None,
            path: "/x".into(),
            mount: None,
            fstype: None,
            source: None,
            responsive,
            elapsed_ms: 0,
            detail: String::new(),
            steps: Vec::new(),
        }
    }

    #[test]
    fn exit_code_is_zero_only_when_every_filesystem_responded() {
        assert_eq!(
            exit_code(&[result(Some(true)), result(Some(true))]),
            ExitCode::SUCCESS
        );
        assert_eq!(
            exit_code(&[result(Some(true)), result(Some(false))]),
            ExitCode::from(1)
        );
        assert_eq!(exit_code(&[result(None)]), ExitCode::from(1));
    }

    #[test]
    fn child_arguments_parse_back_into_the_request() {
        use clap::Parser;
        #[derive(Debug, clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: ChildArgs,
        }
        let request = ChildRequest {
            in_root_of: None,
            path: "/--odd path".into(),
            write: false,
            probe_file_name: ".hangwatch-probe-7-1".into(),
            cleanup: vec!["/a/.hangwatch-probe-7-0".into()],
        };
        let argv = std::iter::once("__probe-child".into()).chain(request.to_args());
        let parsed = Wrapper::try_parse_from(argv).unwrap().args;
        assert_eq!(parsed.path, request.path);
        assert!(parsed.read_only);
        assert_eq!(parsed.probe_file, request.probe_file_name);
        assert_eq!(parsed.cleanup, request.cleanup);
    }

    #[test]
    fn timeout_accepts_the_documented_forms() {
        for (text, ms) in [("500ms", 500), ("2s", 2000), ("1m", 60_000)] {
            assert_eq!(
                parse_nonzero_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
        assert!(parse_nonzero_duration("fast").is_err());
    }
}
