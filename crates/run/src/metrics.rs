//! Prometheus metrics for `run` and `coordinator` (`--metrics ADDR`, `--metrics-textfile DIR`; docs/metrics.md),
//! and the `__write-textfile` child that writes the node_exporter textfile where a directory that does not answer
//! can only block it, never hangwatch.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::usage;
use hangwatch_agent::human::say;
use hangwatch_agent::metrics_feed::{TextfileExport, TEXTFILE_EVERY};
use hangwatch_metrics::{parse_listen_addr, AgentMetrics, Exposition, MetricsServer};

/// `--metrics ADDR` parsed, as a clap value parser: a bad address is a usage error naming it.
pub fn parse_metrics_addr(given: &str) -> Result<std::net::SocketAddr, String> {
    parse_listen_addr(given).map_err(|e| e.to_string())
}

/// Starts the `/metrics` server on `addr` and says where it listens (`<who>: metrics on http://ADDR/metrics`); a
/// bind error is a usage error (exit 2) before anything starts.
pub fn serve(
    who: &str,
    addr: std::net::SocketAddr,
    source: Arc<dyn Exposition>,
) -> anyhow::Result<MetricsServer> {
    let server =
        MetricsServer::start(addr, source).map_err(|e| usage(hangwatch_model::error_chain(&e)))?;
    say(format!(
        "{who}: metrics on http://{}/metrics",
        server.local_addr()
    ));
    Ok(server)
}

/// The agent's metrics outlets of one `run`: the server and the textfile writer, either optional.
pub struct AgentOutlets {
    pub metrics: Arc<AgentMetrics>,
    server: Option<MetricsServer>,
    textfile: Option<TextfileExport>,
}

impl AgentOutlets {
    /// `extra`: more metrics on the same endpoint (the hosted coordinator's).
    pub fn start(
        metrics: Arc<AgentMetrics>,
        addr: Option<std::net::SocketAddr>,
        extra: Option<Arc<dyn Exposition>>,
        textfile: Option<(&Path, String)>,
    ) -> anyhow::Result<Self> {
        let server = match addr {
            Some(addr) => {
                let agent: Arc<dyn Exposition> = metrics.clone();
                let source: Arc<dyn Exposition> = match extra {
                    Some(extra) => Arc::new(vec![agent, extra]),
                    None => agent,
                };
                Some(serve("hangwatch", addr, source)?)
            }
            None => None,
        };
        let textfile = match textfile {
            Some((dir, name)) => {
                let program =
                    hangwatch_child::self_exe().unwrap_or_else(|_| PathBuf::from("hangwatch"));
                let export = TextfileExport::start(
                    Arc::clone(&metrics),
                    program,
                    dir.to_path_buf(),
                    name,
                    TEXTFILE_EVERY,
                )
                .map_err(|e| anyhow::anyhow!("cannot start the metrics textfile writer: {e}"))?;
                Some(export)
            }
            None => None,
        };
        Ok(Self {
            metrics,
            server,
            textfile,
        })
    }

    /// The job has ended: the textfile gets its last state (`hangwatch_job_up 0`), the server stops.
    pub fn finish(self) {
        self.metrics.set_ended();
        if let Some(textfile) = self.textfile {
            textfile.finish();
        }
        drop(self.server);
    }
}

/// Checks `--metrics-textfile DIR` before the job starts: an absolute path to an existing directory (node_exporter's
/// `--collector.textfile.directory`). Whether it is writable is found out by the first write, in a child.
pub fn check_textfile_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.is_absolute() {
        return Err(usage(format!(
            "--metrics-textfile {}: give an absolute path (node_exporter's --collector.textfile.directory)",
            dir.display()
        )));
    }
    Ok(())
}
