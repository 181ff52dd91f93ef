//! `hangwatch coordinator`: serves one multi-node job's agents (docs/coordinator-protocol.md) until SIGINT or
//! SIGTERM. Refuses a token file that others can read.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use hangwatch_coordinator::{Config, Coordinator};
use hangwatch_rpc::JobToken;

use crate::duration::parse_nonzero_duration;
use crate::exit::usage;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where agents reach the coordinator (HOST:PORT; port 0 picks a free one and prints it).
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// The job's shared secret, readable by its owner only (chmod 600); the same file on every node.
    #[arg(long, value_name = "FILE")]
    token_file: PathBuf,
    /// The job's id; by default the first agent's.
    #[arg(long)]
    job_id: Option<String>,
    /// The job's node count: once that many nodes have joined, a new one is refused as a late join.
    #[arg(long)]
    nnodes: Option<usize>,
    /// A node silent this long is `node_unreachable`.
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = parse_nonzero_duration)]
    silence: Duration,
}

/// Reads the token, refusing a file that its group or others may read (or write).
pub fn read_token_file(path: &Path) -> anyhow::Result<JobToken> {
    let meta = std::fs::metadata(path).map_err(|e| {
        usage(format!(
            "cannot read the token file {}: {e}",
            path.display()
        ))
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(usage(format!(
            "the token file {} is accessible to its group or others (mode {mode:03o}): anyone who reads it can order the job's nodes; run `chmod 600 {}`",
            path.display(),
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        usage(format!(
            "cannot read the token file {}: {e}",
            path.display()
        ))
    })?;
    JobToken::new(&text).map_err(|e| usage(format!("token file {}: {e}", path.display())))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let token = read_token_file(&args.token_file)?;
    let mut config = Config::new(token);
    config.job_id = args.job_id;
    config.expected_nodes = args.nnodes;
    config.silence = args.silence;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the coordinator's runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .map_err(|e| usage(format!("cannot listen on {}: {e}", args.listen)))?;
        let addr = listener
            .local_addr()
            .context("cannot read the listening address")?;
        hangwatch_agent::human::say(format!(
            "hangwatch coordinator: listening on {addr} (token from {}); agents join with `hangwatch run --coordinator {addr} --token-file FILE ...`",
            args.token_file.display()
        ));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot watch SIGTERM")?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            tracing::info!("coordinator stopping on a signal");
        };
        Coordinator::new(config)
            .serve(listener, shutdown)
            .await
            .context("the coordinator failed")?;
        hangwatch_agent::human::say("hangwatch coordinator: stopped");
        Ok(ExitCode::SUCCESS)
    })
}
