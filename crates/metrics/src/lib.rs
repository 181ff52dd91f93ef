//! Prometheus metrics of hangwatch (docs/metrics.md): what the agent and the coordinator expose, the `/metrics`
//! server that serves them and the node_exporter textfile that carries them for sites that scrape nodes.
//!
//! The values live in atomics behind `prometheus-client` families, so that the supervision loop updates them
//! with a few stores per tick and never waits for a scrape; a scrape encodes them on the server's own thread.

mod agent;
mod coordinator;
mod labels;
mod outcomes;
mod server;
mod text;
mod textfile;

pub use agent::{AgentMetrics, Dropped, RankState, StallState, ThresholdBasis};
pub use coordinator::{CoordinatorMetrics, NodeSeen, NodeState};
pub use server::{parse_listen_addr, MetricsError, MetricsServer};
pub use text::CONTENT_TYPE;
pub use textfile::{prune_textfiles, textfile_name, write_textfile, TextfileError};

/// Something whose metrics can be served: the agent's, the coordinator's, or both in one process.
pub trait Exposition: Send + Sync {
    /// The metrics now, in the Prometheus text exposition format (version 0.0.4).
    fn exposition(&self) -> String;
}

impl Exposition for AgentMetrics {
    fn exposition(&self) -> String {
        self.encode()
    }
}

impl Exposition for CoordinatorMetrics {
    fn exposition(&self) -> String {
        self.encode()
    }
}

/// Several expositions served as one (`run --host-coordinator`: the agent's and its coordinator's metrics); their
/// metric names are distinct.
impl<T: Exposition + ?Sized> Exposition for Vec<std::sync::Arc<T>> {
    fn exposition(&self) -> String {
        self.iter().map(|e| e.exposition()).collect()
    }
}

/// A closure that brings the values up to date before encoding (the coordinator reads its membership at scrape
/// time).
impl<F: Fn() -> String + Send + Sync> Exposition for F {
    fn exposition(&self) -> String {
        self()
    }
}
