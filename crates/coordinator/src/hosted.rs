//! A coordinator served for a program: [`Serving`] (the server, the job's events handed to a consumer, the stop)
//! on the caller's tokio runtime, and [`HostedCoordinator`], one an agent hosts on threads of its own
//! (`run --host-coordinator`). What the events mean to a person is the consumer's: nothing here prints.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::{
    Config, Coordinator, JobEnding, JobEvent, ServeError, SuperviseOptions, JOB_EVENT_QUEUE,
};

/// How long the server has to let the agents' streams go once asked to stop.
const SERVER_STOP: Duration = Duration::from_secs(3);
/// How long the consumer has to handle the events still queued at the stop (the binary's keeps the last verdict
/// under a 5 s deadline of its own).
const CONSUMER_STOP: Duration = Duration::from_secs(6);

/// A coordinator serving agents on its listener, every event of the job handed to a consumer, until
/// [`Serving::stop`]; the caller runs its policy ([`Coordinator::supervise`]) with [`Serving::events`].
pub struct Serving {
    coordinator: Coordinator,
    events: mpsc::Sender<JobEvent>,
    stop: oneshot::Sender<()>,
    server: JoinHandle<Result<(), ServeError>>,
    consumer: JoinHandle<()>,
}

impl Serving {
    /// Starts serving on the current tokio runtime. `consume` is given the job's events; its future ends when
    /// every sender is gone (after [`Serving::stop`]).
    pub fn start<C, F>(
        coordinator: Coordinator,
        listener: tokio::net::TcpListener,
        consume: C,
    ) -> Self
    where
        C: FnOnce(mpsc::Receiver<JobEvent>) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let (stop, stop_rx) = oneshot::channel::<()>();
        let server = tokio::spawn(coordinator.clone().serve(listener, async move {
            let _ = stop_rx.await;
        }));
        let (events, events_rx) = mpsc::channel(JOB_EVENT_QUEUE);
        let consumer = tokio::spawn(consume(events_rx));
        Self {
            coordinator,
            events,
            stop,
            server,
            consumer,
        }
    }

    pub fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    /// Where the job's policy sends its events (to the consumer).
    pub fn events(&self) -> mpsc::Sender<JobEvent> {
        self.events.clone()
    }

    /// Stops serving (the server has 3 s to let the agents' streams go) and lets the consumer handle what the
    /// events still had to say (at most 6 s). The server's error, when it ended on one.
    pub async fn stop(self) -> Result<(), ServeError> {
        let Self {
            events,
            stop,
            server,
            consumer,
            ..
        } = self;
        let _ = stop.send(());
        let served = match tokio::time::timeout(SERVER_STOP, server).await {
            Ok(Ok(served)) => served,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the gRPC server's task failed");
                Ok(())
            }
            Err(_) => {
                tracing::warn!("the gRPC server did not stop within 3s");
                Ok(())
            }
        };
        // The consumer ends once every sender is gone (the policy's too, once it has returned or been aborted).
        drop(events);
        let _ = tokio::time::timeout(CONSUMER_STOP, consumer).await;
        served
    }
}

/// The hosted coordinator could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Another process holds the port: the job can run without a coordinator.
    #[error("port {port} is taken by another program ({error})")]
    PortTaken { port: u16, error: std::io::Error },
    /// The address cannot be listened on (not this machine's, no permission): the caller's mistake.
    #[error("cannot host the coordinator on {addr}: {error}")]
    Listen {
        addr: SocketAddr,
        error: std::io::Error,
    },
    #[error("cannot start the hosted coordinator's runtime")]
    Runtime(#[source] std::io::Error),
    #[error("cannot set up the coordinator's socket")]
    Socket(#[source] std::io::Error),
}

/// A coordinator hosted by an agent (`run --host-coordinator` on node rank 0), on its own threads.
pub struct HostedCoordinator {
    serving: Serving,
    /// The job's policy, running until this node's agent is done.
    policy: JoinHandle<JobEnding>,
    runtime: tokio::runtime::Runtime,
}

impl HostedCoordinator {
    /// Binds `listen` now (so that a taken port is known before the job starts) and serves in the background,
    /// running the job's policy with `options`; `consume` is given the job's events (as [`Serving::start`]).
    pub fn start<C, F>(
        listen: SocketAddr,
        config: Config,
        options: SuperviseOptions,
        consume: C,
    ) -> Result<Self, HostError>
    where
        C: FnOnce(mpsc::Receiver<JobEvent>) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hw-coordinator")
            .enable_all()
            .build()
            .map_err(HostError::Runtime)?;
        let std_listener = std::net::TcpListener::bind(listen).map_err(|error| {
            if error.kind() == std::io::ErrorKind::AddrInUse {
                HostError::PortTaken {
                    port: listen.port(),
                    error,
                }
            } else {
                HostError::Listen {
                    addr: listen,
                    error,
                }
            }
        })?;
        std_listener
            .set_nonblocking(true)
            .map_err(HostError::Socket)?;
        let serving = {
            let _guard = runtime.enter();
            let listener =
                tokio::net::TcpListener::from_std(std_listener).map_err(HostError::Socket)?;
            Serving::start(Coordinator::new(config), listener, consume)
        };
        let (coordinator, events) = (serving.coordinator.clone(), serving.events());
        let policy = runtime.spawn(async move { coordinator.supervise(options, events).await });
        Ok(Self {
            serving,
            policy,
            runtime,
        })
    }

    pub fn coordinator(&self) -> &Coordinator {
        &self.serving.coordinator
    }

    /// This node's job is over: keep serving (at most `wait`) until every other node has left or gone silent, so
    /// that the last orders reach them, then stop. The server's error, when it ended on one.
    pub fn finish(self, wait: Duration) -> Result<(), ServeError> {
        let until = Instant::now() + wait;
        while Instant::now() < until {
            let view = self.serving.coordinator.view();
            let members = self.serving.coordinator.members();
            let settled = view.all_left
                || members
                    .iter()
                    .all(|m| m.left.is_some() || view.unreachable.contains(&m.node));
            if settled {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.policy.abort();
        let runtime = self.runtime;
        let stopped = runtime.block_on(self.serving.stop());
        runtime.shutdown_timeout(Duration::from_secs(1));
        stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_rpc::{JobSecret, JobToken};

    fn config() -> Config {
        let token = JobToken::new("9c41e07b2a5fd8136e0b4a97c52d1f8e").expect("token");
        Config::new(JobSecret::new(token, "job-42").expect("link key"))
    }

    #[test]
    fn a_taken_port_is_known_before_the_job_starts() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let addr = taken.local_addr().expect("its address");
        let started =
            HostedCoordinator::start(addr, config(), SuperviseOptions::default(), |_| async {});
        match started {
            Err(HostError::PortTaken { port, .. }) => assert_eq!(port, addr.port()),
            Err(e) => panic!("not a taken port: {e}"),
            Ok(_) => panic!("hosted on a taken port"),
        }
    }

    #[test]
    fn a_hosted_coordinator_stops_and_its_consumer_sees_the_events_end() {
        let (ended, ended_rx) = std::sync::mpsc::channel();
        let hosted = HostedCoordinator::start(
            "127.0.0.1:0".parse().expect("address"),
            config(),
            SuperviseOptions::default(),
            move |mut events| async move {
                while events.recv().await.is_some() {}
                let _ = ended.send(());
            },
        )
        .expect("hosted");
        assert!(hosted.coordinator().members().is_empty());
        hosted
            .finish(Duration::ZERO)
            .expect("the server stopped cleanly");
        ended_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the consumer ended with the last sender");
    }
}
