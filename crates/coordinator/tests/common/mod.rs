//! An in-process coordinator on 127.0.0.1:0 and fake agents written with the generated client.
#![allow(dead_code)]

pub mod fixtures;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hangwatch_coordinator::{Config, Coordinator};
use hangwatch_model::NodeObservations;
use hangwatch_rpc::pb::{self, order};
use hangwatch_rpc::{
    connect, encode_observations, with_deadline, Client, ConnectError, JobSecret, JobToken,
    PROTOCOL_VERSION, REGISTER_DEADLINE,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

pub const TOKEN: &str = "9c41e07b2a5fd8136e0b4a97c52d1f8e";
pub const JOB: &str = "job-42";

pub fn token() -> JobToken {
    JobToken::new(TOKEN).expect("token")
}

/// The test job's token and link key.
pub fn secret() -> JobSecret {
    JobSecret::new(token(), JOB).expect("link key")
}

/// A coordinator served on a free loopback port; dropping it shuts the server down.
pub struct Server {
    pub coordinator: Coordinator,
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Server {
    pub async fn start(config: Config) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let coordinator = Coordinator::new(config);
        let (stop, stopped) = oneshot::channel::<()>();
        let c = coordinator.clone();
        let task = tokio::spawn(async move {
            c.serve(listener, async {
                let _ = stopped.await;
            })
            .await
            .expect("serve");
        });
        Self {
            coordinator,
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub async fn client(&self, secret: &JobSecret) -> Client {
        self.try_client(secret).await.expect("connect")
    }

    pub async fn try_client(&self, secret: &JobSecret) -> Result<Client, ConnectError> {
        connect(&self.addr.to_string(), secret, Duration::from_secs(10)).await
    }

    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .expect("the coordinator shuts down while agents are still attached")
                .expect("server task");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub fn config() -> Config {
    Config::new(secret())
}

pub fn register_request(node: &str, node_rank: u32, per_node: u32) -> pb::RegisterRequest {
    pb::RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        job_id: JOB.into(),
        node: node.into(),
        node_rank,
        ranks: (node_rank * per_node..(node_rank + 1) * per_node).collect(),
    }
}

/// How a fake agent answers roll calls.
#[derive(Clone)]
pub enum Answer {
    Now(NodeObservations),
    After(Duration, NodeObservations),
    Never,
}

/// A fake agent: registered, attached, reporting progress every `interval` until told to stop, answering roll
/// calls as its [`Answer`] says.
pub struct FakeAgent {
    pub node: String,
    pub session_id: String,
    progress: Option<JoinHandle<()>>,
    orders: JoinHandle<()>,
    /// Orders received, in order.
    pub received: Arc<Mutex<Vec<pb::Order>>>,
    /// The acks of roll-call answers sent.
    pub acks: Arc<Mutex<Vec<Result<bool, tonic::Status>>>>,
    // Kept so the progress stream stays open after the progress task is stopped: silence, not a closed stream.
    _reports: mpsc::Sender<pb::ProgressReport>,
}

impl FakeAgent {
    pub async fn join(
        client: Client,
        req: pb::RegisterRequest,
        interval: Duration,
        answer: Answer,
    ) -> Self {
        let mut client = client;
        let node = req.node.clone();
        let ranks = req.ranks.clone();
        let reply = client
            .register(with_deadline(req, REGISTER_DEADLINE))
            .await
            .expect("registered")
            .into_inner();
        let session_id = reply.session_id;
        let (tx, rx) = mpsc::channel(4);
        let sid = session_id.clone();
        let report = move || pb::ProgressReport {
            session_id: sid.clone(),
            ranks: ranks
                .iter()
                .map(|&rank| pb::RankProgress {
                    rank,
                    step: Some(7),
                    last_progress_age_ms: 10,
                })
                .collect(),
            ..pb::ProgressReport::default()
        };
        tx.send(report()).await.expect("first report queued");
        let mut orders = client
            .attach(ReceiverStream::new(rx))
            .await
            .expect("attached")
            .into_inner();
        let ticker = tx.clone();
        let progress = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            loop {
                tick.tick().await;
                if ticker.send(report()).await.is_err() {
                    break;
                }
            }
        });
        let received = Arc::new(Mutex::new(Vec::new()));
        let acks = Arc::new(Mutex::new(Vec::new()));
        let (rec, ack) = (received.clone(), acks.clone());
        let sid = session_id.clone();
        let orders = tokio::spawn(async move {
            while let Some(Ok(o)) = orders.next().await {
                rec.lock().expect("lock").push(o.clone());
                let Some(order::Kind::RollCall(rc)) = o.kind else {
                    continue;
                };
                let (delay, obs) = match &answer {
                    Answer::Now(obs) => (Duration::ZERO, obs.clone()),
                    Answer::After(d, obs) => (*d, obs.clone()),
                    Answer::Never => continue,
                };
                let mut client = client.clone();
                let ack = ack.clone();
                let session_id = sid.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let r = client
                        .report_roll_call(with_deadline(
                            pb::RollCallReport {
                                session_id,
                                roll_call_id: rc.roll_call_id,
                                observations_json: encode_observations(&obs),
                            },
                            Duration::from_millis(rc.deadline_ms.into())
                                .max(Duration::from_secs(5)),
                        ))
                        .await
                        .map(|r| r.into_inner().accepted);
                    ack.lock().expect("lock").push(r);
                });
            }
        });
        Self {
            node,
            session_id,
            progress: Some(progress),
            orders,
            received,
            acks,
            _reports: tx,
        }
    }

    /// Stops sending progress, keeping the connection open: the agent hangs.
    pub fn fall_silent(&mut self) {
        if let Some(p) = self.progress.take() {
            p.abort();
        }
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        if let Some(p) = self.progress.take() {
            p.abort();
        }
        self.orders.abort();
    }
}

/// Polls `condition` every 50 ms until it holds or `timeout` passes.
pub async fn wait_for(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `f` with tracing captured into a buffer; returns what was logged.
pub async fn with_logs<F: Future>(f: F) -> (F::Output, String) {
    let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || Writer(writer.clone()))
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let out = f.await;
    let text = String::from_utf8_lossy(&buf.lock().expect("lock")).into_owned();
    (out, text)
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `n` fake agents joined to `server`: node `r` has `per_node` ranks, reports progress every `poll`, and answers
/// roll calls as `answer(r)`.
pub async fn join_agents(
    server: &Server,
    n: u32,
    per_node: u32,
    poll: Duration,
    answer: impl Fn(u32) -> Answer,
) -> Vec<FakeAgent> {
    let mut out = Vec::new();
    for r in 0..n {
        let client = server.client(&secret()).await;
        out.push(
            FakeAgent::join(
                client,
                register_request(&fixtures::node_name(r), r, per_node),
                poll,
                answer(r),
            )
            .await,
        );
    }
    out
}
