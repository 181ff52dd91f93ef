//! The agent's link to its job's coordinator: joins it, streams the node's progress and stall tier (~1 Hz,
//! coalesced), turns the coordinator's orders into events for the supervision loop and carries roll-call answers
//! back. When the coordinator goes away the link says so and keeps trying to rejoin, while the loop decides on
//! its own; a restarted coordinator gets the node back by this rejoin.
//!
//! The link runs on its own thread with a small tokio runtime: nothing in it can hold the supervision loop, and
//! the loop only ever touches a mutex held for microseconds.

use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hangwatch_model::{NodeObservations, StallTier, Verdict};
use hangwatch_rpc::pb::{self, order};
use hangwatch_rpc::{
    connect, encode_observations, with_deadline, ConnectError, JobSecret, ProgressCoalescer,
    Refusal, DEFAULT_PROGRESS_INTERVAL, PROTOCOL_VERSION, REGISTER_DEADLINE,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::events::Event;
pub use crate::events::LinkEvent;

/// Where the coordinator is and who this node is.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// `HOST:PORT` of the coordinator.
    pub addr: String,
    /// The job's token and link key (with the job's id).
    pub secret: JobSecret,
    /// This node's name (its hostname).
    pub node: String,
    pub node_rank: u32,
    /// The global ranks this node runs (empty when they are found later, below a launcher).
    pub ranks: Vec<u32>,
}

struct Shared {
    coalescer: ProgressCoalescer,
    stall: (StallTier, Duration),
    fs_stuck: bool,
    /// Set when the job ended on this node: the agent's exit code, and how each rank ended.
    leaving: Option<i32>,
    exits: Vec<pb::RankExit>,
}

/// Where roll-call answers go; cheap to clone into a roll-call worker.
#[derive(Clone)]
pub struct Answers {
    tx: mpsc::UnboundedSender<(u64, NodeObservations)>,
}

impl Answers {
    /// Sends this node's observations as the answer to roll call `roll_call_id` (queued; the link sends it).
    pub fn answer(&self, roll_call_id: u64, observations: NodeObservations) {
        let _ = self.tx.send((roll_call_id, observations));
    }
}

/// The running link.
pub struct Link {
    shared: Arc<Mutex<Shared>>,
    answers: Answers,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

/// How long a departing agent waits for its goodbye to reach the coordinator.
const GOODBYE_WAIT: Duration = Duration::from_secs(1);
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The deadline of a roll-call answer's call.
const ANSWER_DEADLINE: Duration = Duration::from_secs(5);
/// Between two attempts to join: doubling from the first, up to the last.
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(3);

impl Link {
    /// Starts the link's thread; it reports to the loop through `events`.
    pub fn start(config: LinkConfig, events: SyncSender<Event>) -> std::io::Result<Link> {
        let shared = Arc::new(Mutex::new(Shared {
            coalescer: ProgressCoalescer::new(DEFAULT_PROGRESS_INTERVAL, config.ranks.clone()),
            stall: (StallTier::Healthy, Duration::ZERO),
            fs_stuck: false,
            leaving: None,
            exits: Vec::new(),
        }));
        let (answers_tx, answers_rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let link_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("hw-link".into())
            .spawn(move || {
                let worker = LinkWorker {
                    config,
                    shared: link_shared,
                    events,
                    answers: answers_rx,
                    stop: stop_rx,
                    started: Instant::now(),
                };
                runtime.block_on(worker.run());
            })?;
        Ok(Link {
            shared,
            answers: Answers { tx: answers_tx },
            stop,
            thread: Some(thread),
        })
    }

    fn shared(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// A rank made progress (a step, a beat, a line) at `at`.
    pub fn progress(&self, rank: u32, step: Option<u64>, at: Instant) {
        self.shared().coalescer.progress(rank, step, at);
    }

    /// What the node's detector says now, and whether its fast path holds.
    pub fn stall(&self, tier: StallTier, stalled_for: Duration, fs_stuck: bool) {
        let mut shared = self.shared();
        shared.stall = (tier, stalled_for);
        shared.fs_stuck = fs_stuck;
    }

    pub fn answers(&self) -> Answers {
        self.answers.clone()
    }

    /// The job ended on this node: says goodbye to the coordinator with how each rank ended (so that its
    /// silence is not taken for a lost node, and its ranks count as exited), and stops, waiting at most about a
    /// second.
    pub fn leave(mut self, exit_code: i32, exits: Vec<pb::RankExit>) {
        {
            let mut shared = self.shared();
            shared.leaving = Some(exit_code);
            shared.exits = exits;
        }
        self.stop.send_replace(true);
        if let Some(thread) = self.thread.take() {
            let until = Instant::now() + GOODBYE_WAIT + Duration::from_millis(500);
            while !thread.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // Plain data: a panic elsewhere leaves nothing half-done worth refusing.
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How one session ended.
enum SessionEnd {
    /// The agent is leaving (goodbye said, or nobody to say it to).
    Left,
    /// Joined, then lost.
    Lost(String),
    /// Could not join: no connection, or refused.
    NotJoined { why: String, refused: Refused },
}

/// Whether a failed join is worth telling the loop about (retrying will not fix it; people must).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    No,
    ByTheCoordinator,
    NotTheJobsKey,
}

impl Refused {
    fn by_coordinator(refused: bool) -> Self {
        if refused {
            Self::ByTheCoordinator
        } else {
            Self::No
        }
    }
}

struct LinkWorker {
    config: LinkConfig,
    shared: Arc<Mutex<Shared>>,
    events: SyncSender<Event>,
    answers: mpsc::UnboundedReceiver<(u64, NodeObservations)>,
    stop: watch::Receiver<bool>,
    started: Instant,
}

impl LinkWorker {
    fn tell(&self, event: LinkEvent) {
        let _ = self.events.send(Event::Link(event));
    }

    async fn run(mut self) {
        let mut joined_before = false;
        let mut retry = RETRY_FIRST;
        let mut last_failure: Option<String> = None;
        loop {
            if *self.stop.borrow() {
                return;
            }
            match self.session(joined_before).await {
                SessionEnd::Left => return,
                SessionEnd::Lost(why) => {
                    joined_before = true;
                    retry = RETRY_FIRST;
                    last_failure = None;
                    tracing::warn!(coordinator = %self.config.addr, reason = %why, "lost the coordinator");
                    self.tell(LinkEvent::Lost { why });
                }
                SessionEnd::NotJoined { why, refused } => {
                    // Said once per reason: a coordinator that is not up yet is retried quietly.
                    if last_failure.as_deref() != Some(why.as_str()) {
                        tracing::warn!(coordinator = %self.config.addr, reason = %why, refused = ?refused, "could not join the coordinator");
                        match refused {
                            Refused::No => {}
                            Refused::ByTheCoordinator => {
                                self.tell(LinkEvent::Refused { why: why.clone() })
                            }
                            Refused::NotTheJobsKey => {
                                self.tell(LinkEvent::NotTheJobs { why: why.clone() })
                            }
                        }
                        last_failure = Some(why);
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(retry) => {}
                _ = self.stop.wait_for(|s| *s) => return,
            }
            retry = (retry * 2).min(RETRY_MAX);
        }
    }

    fn report(&self, session_id: &str, force: bool) -> Option<pb::ProgressReport> {
        report(&self.shared, self.started, session_id, force)
    }

    async fn session(&mut self, joined_before: bool) -> SessionEnd {
        let addr = self.config.addr.clone();
        let mut client = match connect(&addr, &self.config.secret, CONNECT_TIMEOUT).await {
            Ok(c) => c,
            Err(e) => {
                // Whatever holds the port without the job's key is refused, and said so (it may be a squatter).
                let refused = if matches!(e, ConnectError::NotTheJobs { .. }) {
                    Refused::NotTheJobsKey
                } else {
                    Refused::No
                };
                return SessionEnd::NotJoined {
                    why: hangwatch_model::error_chain(&e),
                    refused,
                };
            }
        };
        let register = pb::RegisterRequest {
            protocol_version: PROTOCOL_VERSION,
            job_id: self.config.secret.job_id().to_string(),
            node: self.config.node.clone(),
            node_rank: self.config.node_rank,
            ranks: self.config.ranks.clone(),
        };
        let reply = match client
            .register(with_deadline(register, REGISTER_DEADLINE))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(status) => {
                // A wrong token is a refusal too: retrying will not fix it, people must.
                let refused = Refused::by_coordinator(
                    Refusal::from_status(&status).is_some()
                        || status.code() == tonic::Code::Unauthenticated,
                );
                return SessionEnd::NotJoined {
                    why: format!("{} ({:?})", status.message(), status.code()),
                    refused,
                };
            }
        };
        let session_id = reply.session_id;
        let (out_tx, out_rx) = mpsc::channel::<pb::ProgressReport>(8);
        if let Some(first) = self.report(&session_id, true) {
            let _ = out_tx.try_send(first);
        }
        // The stream lives as long as the session, but opening it is bounded like any call: a coordinator that
        // accepted the connection and then stopped must not hold the link forever.
        let attached = tokio::time::timeout(
            REGISTER_DEADLINE,
            client.attach(ReceiverStream::new(out_rx)),
        )
        .await;
        let mut inbound = match attached {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(status)) => {
                return SessionEnd::NotJoined {
                    why: format!("attach refused: {} ({:?})", status.message(), status.code()),
                    refused: Refused::by_coordinator(Refusal::from_status(&status).is_some()),
                }
            }
            Err(_) => {
                return SessionEnd::NotJoined {
                    why: format!(
                        "the coordinator did not open the session within {:.0}s",
                        REGISTER_DEADLINE.as_secs_f64()
                    ),
                    refused: Refused::No,
                }
            }
        };
        tracing::info!(coordinator = %addr, %session_id, rejoined = joined_before, "joined the coordinator");
        self.tell(LinkEvent::Joined {
            session_id: session_id.clone(),
            rejoined: joined_before,
        });
        let shared = Arc::clone(&self.shared);
        let started = self.started;
        let events = self.events.clone();
        let mut ticker = tokio::time::interval(Duration::from_millis(100));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    if let Some(report) = report(&shared, started, &session_id, false) {
                        // A full queue means the coordinator is not reading: the next report carries the latest.
                        let _ = out_tx.try_send(report);
                    }
                }
                order = inbound.message() => match order {
                    Ok(Some(order)) => dispatch(&events, order),
                    Ok(None) => return SessionEnd::Lost("the coordinator closed the session".into()),
                    Err(status) => return SessionEnd::Lost(format!("{} ({:?})", status.message(), status.code())),
                },
                Some((roll_call_id, mut observations)) = self.answers.recv() => {
                    // The coordinator decides from each rank's telling thread; every thread stays in this node's
                    // evidence.
                    hangwatch_diagnosis::answer::fold_idle_threads(&mut observations);
                    let mut client = client.clone();
                    let request = pb::RollCallReport {
                        session_id: session_id.clone(),
                        roll_call_id,
                        observations_json: encode_observations(&observations),
                    };
                    // Sent from a task: a slow answer must not hold the progress reports.
                    tokio::spawn(async move {
                        match client.report_roll_call(with_deadline(request, ANSWER_DEADLINE)).await {
                            Ok(ack) if ack.get_ref().accepted => tracing::debug!(roll_call_id, "roll-call answer accepted"),
                            Ok(_) => tracing::info!(roll_call_id, "roll-call answer came too late to be used"),
                            Err(status) => tracing::warn!(roll_call_id, %status, "could not send the roll-call answer"),
                        }
                    });
                }
                _ = self.stop.wait_for(|s| *s) => {
                    if let Some(goodbye) = report(&shared, started, &session_id, true) {
                        let _ = out_tx.try_send(goodbye);
                    }
                    drop(out_tx);
                    // The coordinator ends our order stream once it has read the goodbye and our stream's end.
                    let _ = tokio::time::timeout(GOODBYE_WAIT, async {
                        while let Ok(Some(_)) = inbound.message().await {}
                    })
                    .await;
                    return SessionEnd::Left;
                }
            }
        }
    }
}

/// Turns an order into an event for the supervision loop.
fn dispatch(events: &SyncSender<Event>, order: pb::Order) {
    let tell = |event: LinkEvent| {
        let _ = events.send(Event::Link(event));
    };
    {
        match order.kind {
            Some(order::Kind::RollCall(r)) => {
                tracing::info!(
                    roll_call = r.roll_call_id,
                    "roll call ordered by the coordinator"
                );
                tell(LinkEvent::RollCallOrdered {
                    roll_call_id: r.roll_call_id,
                    deadline: Duration::from_millis(u64::from(r.deadline_ms)),
                    probe_mounts: r.probe_mounts,
                });
            }
            Some(order::Kind::Terminate(t)) => {
                let verdict = if t.verdict_json.is_empty() {
                    None
                } else {
                    match serde_json::from_slice::<Verdict>(&t.verdict_json) {
                        Ok(v) => Some(Box::new(v)),
                        Err(e) => {
                            tracing::warn!(error = %e, "the terminate order's verdict is unreadable; ending the job with its reason only");
                            None
                        }
                    }
                };
                tracing::info!(reason = %t.reason, "termination ordered by the coordinator");
                tell(LinkEvent::TerminateOrdered {
                    reason: t.reason,
                    verdict,
                });
            }
            None => tracing::warn!(
                order = order.order_id,
                "an order of a kind this agent does not know; ignored"
            ),
        }
    }
}

/// The progress report due now (or forced: a first report, a goodbye), with the node's stall tier.
fn report(
    shared: &Mutex<Shared>,
    started: Instant,
    session_id: &str,
    force: bool,
) -> Option<pb::ProgressReport> {
    let mut shared = lock(shared);
    let now = Instant::now();
    let mut report = shared.coalescer.due(session_id, now, started);
    if report.is_none() && force {
        // A goodbye or the first report goes out whatever the interval says.
        report = Some(pb::ProgressReport {
            session_id: session_id.to_string(),
            ..pb::ProgressReport::default()
        });
    }
    let mut report = report?;
    let (tier, stalled_for) = shared.stall;
    report.stall = hangwatch_rpc::stall_tier_to_wire(tier) as i32;
    report.stalled_for_ms = u64::try_from(stalled_for.as_millis()).unwrap_or(u64::MAX);
    report.fs_stuck = shared.fs_stuck;
    if let Some(code) = shared.leaving {
        report.leaving = true;
        report.exit_code = Some(code);
        report.exits = shared.exits.clone();
    }
    Some(report)
}
