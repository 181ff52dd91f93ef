//! The multi-node coordinator (docs/coordinator-protocol.md): agents register, stream progress and take orders;
//! it knows who is unreachable, orders a roll call from every agent in parallel under a deadline and merges the
//! answers into one verdict, and runs the job's policy over it (`supervise`). State lives in memory only.

pub mod hosted;
pub mod membership;
pub mod policy;
pub mod requests;
mod service;

use std::collections::{BTreeMap, HashMap};

use prost::bytes::Bytes;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hangwatch_diagnosis::{decide, is_conclusive_for_job, ActivityRule, DecideOptions, OnHang};
use hangwatch_model::{NodeObservations, Verdict};
use hangwatch_rpc::pb::{self, order};
use hangwatch_rpc::{JobSecret, DEFAULT_PROGRESS_INTERVAL};
use tokio::sync::mpsc;

pub use membership::{
    Liveness, Member, Membership, NodeReport, NodeStall, RankExit, RankProgress, Registration,
    StallTier,
};
pub use policy::{JobAction, JobInput, JobNotice, JobPolicy, JobTrigger, JobView};

/// How the coordinator runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The job's token and link key; its job id is the only job this coordinator serves.
    pub secret: JobSecret,
    /// The job's node count (`--nnodes`): once that many have registered, a new node is a late join.
    pub expected_nodes: Option<usize>,
    /// After this much silence a node is `node_unreachable`.
    pub silence: Duration,
    /// How often agents are asked to report progress.
    pub progress_interval: Duration,
}

impl Config {
    /// Defaults: progress every second, unreachable after 5 s of silence (five missed reports).
    pub fn new(secret: JobSecret) -> Self {
        Self {
            secret,
            expected_nodes: None,
            silence: Duration::from_secs(5),
            progress_interval: DEFAULT_PROGRESS_INTERVAL,
        }
    }
}

/// The coordinator could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the coordinator's gRPC server failed")]
    Transport(#[source] tonic::transport::Error),
}

/// What one roll call found.
#[derive(Debug, Clone)]
pub struct RollCallOutcome {
    /// The job-wide verdict, nodes that did not answer named in it (`nodes_not_seen`).
    pub verdict: Verdict,
    /// The nodes that answered in time, by name.
    pub answered: Vec<String>,
    /// The nodes ordered to answer that did not in time (or could not be ordered: no open session).
    pub not_answered: Vec<String>,
    /// Those of `not_answered` still heard from when the roll call ended (their progress reports kept coming):
    /// they answered late, loaded rather than unreachable (the verdict's `nodes_late`).
    pub answered_late: Vec<String>,
    /// The observations that came back, in node-name order (for each node's evidence bundle).
    pub observations: Vec<NodeObservations>,
}

/// How long the second round of a roll call (every node probes the blocking mount) may take at most.
const PROBE_ROUND_DEADLINE: Duration = Duration::from_secs(6);

/// What one round of a roll call brought back.
struct Round {
    /// The answers, in node-name order.
    observations: Vec<NodeObservations>,
    /// Nodes that left the job: their ranks count as exited.
    departed: Vec<NodeObservations>,
    expected: Vec<String>,
    not_answered: Vec<String>,
    /// Nodes that did not answer in time but were still heard from at the deadline.
    answered_late: Vec<String>,
}

impl Round {
    fn answered(&self) -> Vec<String> {
        self.observations
            .iter()
            .filter_map(|o| o.node.clone())
            .collect()
    }

    fn decide(&mut self, stalled_for: Option<Duration>) -> Verdict {
        let answered = self.observations.len();
        self.observations.extend(self.departed.iter().cloned());
        let verdict = decide(
            &self.observations,
            &DecideOptions {
                stalled_for_s: stalled_for.map(|d| d.as_secs_f64()),
                expected_nodes: self.expected.clone(),
                answered_late: self.answered_late.clone(),
            },
        );
        self.observations.truncate(answered);
        verdict
    }

    /// The probes of a later round, added to each node's answer where it had none of that mount.
    fn add_probes(&mut self, later: Vec<NodeObservations>) {
        for answer in later {
            let Some(mine) = self.observations.iter_mut().find(|o| o.node == answer.node) else {
                continue;
            };
            for probe in answer.probes {
                if !mine.probes.iter().any(|p| p.mount == probe.mount) {
                    mine.probes.push(probe);
                }
            }
        }
    }
}

/// An open order stream to one agent.
struct Attached {
    session_id: String,
    orders: mpsc::Sender<Result<pb::Order, tonic::Status>>,
}

struct State {
    membership: Membership,
    /// By node name.
    attached: HashMap<String, Attached>,
    /// Roll calls in progress, by id: where their answers go.
    roll_calls: HashMap<u64, RollCallInbox>,
}

/// Where one roll call's answers go: one per node that was asked, so the queue is bounded by the job's size and
/// a node that answers twice cannot crowd out the others.
struct RollCallInbox {
    answers: mpsc::Sender<(String, NodeObservations)>,
    asked: std::collections::HashSet<String>,
    answered: std::collections::HashSet<String>,
}

impl RollCallInbox {
    /// Queues `node`'s answer; `false` when it was not asked, answered already, or the roll call is over.
    fn take(&mut self, node: &str, observations: NodeObservations) -> bool {
        if !self.asked.contains(node) || !self.answered.insert(node.to_string()) {
            return false;
        }
        self.answers
            .try_send((node.to_string(), observations))
            .is_ok()
    }
}

struct Shared {
    config: Config,
    state: Mutex<State>,
    next_id: AtomicU64,
    /// Set when the server shuts down: progress readers let go of their streams.
    closing: tokio::sync::watch::Sender<bool>,
}

/// A handle on one coordinator; clones share it.
#[derive(Clone)]
pub struct Coordinator {
    shared: Arc<Shared>,
}

/// Job events waiting for whoever prints, keeps and alerts them (`supervise`'s `events`): a few per node and
/// per verdict; a consumer that falls this far behind loses events rather than stopping the policy.
pub const JOB_EVENT_QUEUE: usize = 4096;

/// Orders waiting in an agent's stream before the coordinator stops queueing more (the agent is not reading).
const ORDER_QUEUE: usize = 16;

impl Coordinator {
    pub fn new(config: Config) -> Self {
        let membership = Membership::new(
            Some(config.secret.job_id().to_string()),
            config.expected_nodes,
            config.silence,
        );
        Self {
            shared: Arc::new(Shared {
                config,
                state: Mutex::new(State {
                    membership,
                    attached: HashMap::new(),
                    roll_calls: HashMap::new(),
                }),
                next_id: AtomicU64::new(1),
                closing: tokio::sync::watch::Sender::new(false),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn next_id(&self) -> u64 {
        self.shared.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Serves agents on `listener` until `shutdown` completes.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServeError> {
        let svc = service::server(self.clone());
        // Only peers that proved the job's key reach the gRPC server (hangwatch_rpc::accept_link).
        let incoming = hangwatch_rpc::accept_link(listener, self.shared.config.secret.key());
        // Ending every order stream lets the graceful shutdown finish while agents are still attached.
        let shutdown = async move {
            shutdown.await;
            self.state().attached.clear();
            self.shared.closing.send_replace(true);
        };
        tonic::transport::Server::builder()
            // A dead agent's connection is noticed by a failed ping, not kept forever.
            .http2_keepalive_interval(Some(Duration::from_secs(5)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(ServeError::Transport)
    }

    /// The registered nodes, by name.
    pub fn members(&self) -> Vec<Member> {
        self.state().membership.members().cloned().collect()
    }

    /// The nodes that are `node_unreachable` now (silent for at least the configured silence).
    pub fn unreachable_nodes(&self) -> Vec<String> {
        self.state().membership.unreachable(now())
    }

    /// Orders a roll call from every registered agent at once, waits for the answers up to `deadline`, and
    /// merges them into one verdict. Nodes that did not answer in time are named in it as not seen; the call
    /// returns at the deadline whatever the agents do.
    pub async fn roll_call(&self, deadline: Duration) -> RollCallOutcome {
        self.roll_call_stalled(deadline, None).await
    }

    /// [`Coordinator::roll_call`] of a job that made no progress for `stalled_for`. When the verdict blames a
    /// mount that some nodes did not probe (no rank of theirs uses it), a second round asks every node to probe
    /// it, so that the verdict can tell a storage incident from the culprit's node (`hangwatch_diagnosis::scope`).
    pub async fn roll_call_stalled(
        &self,
        deadline: Duration,
        stalled_for: Option<Duration>,
    ) -> RollCallOutcome {
        let mut round = self.collect(deadline, Vec::new()).await;
        let mut verdict = round.decide(stalled_for);
        let mounts =
            hangwatch_diagnosis::scope::mounts_to_probe_everywhere(&verdict, &round.answered());
        if !mounts.is_empty() {
            tracing::info!(mounts = ?mounts, "asking every node to probe the blocking mount");
            let second = self
                .collect(deadline.min(PROBE_ROUND_DEADLINE), mounts)
                .await;
            round.add_probes(second.observations);
            verdict = round.decide(stalled_for);
        }
        let answered = round.answered();
        RollCallOutcome {
            verdict,
            answered,
            not_answered: round.not_answered,
            answered_late: round.answered_late,
            observations: round.observations,
        }
    }

    /// One round of a roll call: the order to every node still in the job, their answers until `deadline`.
    async fn collect(&self, deadline: Duration, probe_mounts: Vec<String>) -> Round {
        let id = self.next_id();
        let until = tokio::time::Instant::now() + deadline;
        let order = pb::Order {
            order_id: id,
            kind: Some(order::Kind::RollCall(pb::RollCallOrder {
                roll_call_id: id,
                deadline_ms: u32::try_from(deadline.as_millis()).unwrap_or(u32::MAX),
                probe_mounts,
            })),
        };
        let (expected, departed, mut waiting, mut rx) = {
            let mut st = self.state();
            // A node that left is not asked: its agent said how its ranks ended, and they count as exited.
            let departed: Vec<NodeObservations> = st
                .membership
                .members()
                .filter(|m| m.left.is_some())
                .map(departed_observations)
                .collect();
            let expected: Vec<String> = st
                .membership
                .members()
                .filter(|m| m.left.is_none())
                .map(|m| m.node.clone())
                .collect();
            let (tx, rx) = mpsc::channel(expected.len().max(1));
            st.roll_calls.insert(
                id,
                RollCallInbox {
                    answers: tx,
                    asked: expected.iter().cloned().collect(),
                    answered: Default::default(),
                },
            );
            let mut waiting = 0usize;
            for node in &expected {
                match st.attached.get(node) {
                    Some(a) => match a.orders.try_send(Ok(order.clone())) {
                        Ok(()) => waiting += 1,
                        Err(e) => tracing::warn!(%node, error = %e, "could not order a roll call"),
                    },
                    None => tracing::warn!(%node, "no open session to order a roll call"),
                }
            }
            (expected, departed, waiting, rx)
        };
        tracing::info!(
            roll_call = id,
            nodes = expected.len(),
            ordered = waiting,
            deadline_ms = deadline.as_millis() as u64,
            "roll call ordered"
        );
        let mut observations = BTreeMap::new();
        while waiting > 0 {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some((node, obs))) => {
                    if observations.insert(node, obs).is_none() {
                        waiting -= 1;
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        let not_answered: Vec<String> = expected
            .iter()
            .filter(|n| !observations.contains_key(*n))
            .cloned()
            .collect();
        // A node whose progress still arrives is loaded, not lost: its silence, not a missed deadline, is what
        // makes a node unreachable.
        let answered_late: Vec<String> = {
            let mut st = self.state();
            st.roll_calls.remove(&id);
            let unreachable = st.membership.unreachable(now());
            not_answered
                .iter()
                .filter(|n| !unreachable.contains(n))
                .cloned()
                .collect()
        };
        if !not_answered.is_empty() {
            tracing::warn!(roll_call = id, nodes = ?not_answered, late = ?answered_late, "nodes did not answer the roll call in time");
        }
        Round {
            // Moved, not cloned: at 1,250 nodes the observations are over 100 MiB.
            observations: observations.into_values().collect(),
            departed,
            expected,
            not_answered,
            answered_late,
        }
    }

    /// Orders every attached agent to end its ranks; returns the nodes the order was queued for. Each node gets
    /// the job-wide verdict with the rows of `ranks` that are its own or a culprit's ([`verdict_for_node`]).
    pub fn terminate(&self, reason: &str, verdict: Option<&Verdict>) -> Vec<String> {
        // The orders are made outside the lock: at 1,250 nodes encoding them takes most of a second, during which
        // progress reports and roll-call answers must still be taken.
        let attached: Vec<(String, mpsc::Sender<Result<pb::Order, tonic::Status>>)> = self
            .state()
            .attached
            .iter()
            .map(|(node, a)| (node.clone(), a.orders.clone()))
            .collect();
        let shell = verdict.map(Verdict::without_ranks);
        // Nodes that get the same rows get the same bytes, encoded once: at 1,250 nodes most get only the
        // culprits' rows, and a copy per node was over 80 MB.
        let mut encoded: HashMap<Vec<usize>, Bytes> = HashMap::new();
        attached
            .into_iter()
            .filter(|(node, orders)| {
                let verdict_json = match (verdict, &shell) {
                    (Some(full), Some(shell)) => encoded
                        .entry(rows_for_node(full, node))
                        .or_insert_with_key(|rows| encode_for_node(full, shell, rows))
                        .clone(),
                    _ => Bytes::new(),
                };
                let order = pb::Order {
                    order_id: self.next_id(),
                    kind: Some(order::Kind::Terminate(pb::TerminateOrder {
                        reason: reason.into(),
                        verdict_json,
                    })),
                };
                match orders.try_send(Ok(order)) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(%node, error = %e, "could not order termination");
                        false
                    }
                }
            })
            .map(|(node, _)| node)
            .collect()
    }
}

/// The job-wide verdict as node `node` receives it: everything but the roll-call table, of which it keeps its own
/// ranks and the culprits'. The whole table of a 10,000-rank job is over 100 MiB; the coordinator keeps it.
pub fn verdict_for_node(full: &Verdict, node: &str) -> Verdict {
    let mut v = full.without_ranks();
    v.ranks = rows_for_node(full, node)
        .into_iter()
        .map(|i| full.ranks[i].clone())
        .collect();
    v
}

/// Which rows of the roll-call table node `node` keeps: its own ranks' and the culprits', by index.
fn rows_for_node(full: &Verdict, node: &str) -> Vec<usize> {
    let culprit = |r: &hangwatch_model::RankReport| {
        full.culprits
            .iter()
            .any(|c| c.node == r.at.node && c.rank.is_some() && c.rank == r.at.rank)
    };
    full.ranks
        .iter()
        .enumerate()
        .filter(|(_, r)| r.at.node.as_deref() == Some(node) || culprit(r))
        .map(|(i, _)| i)
        .collect()
}

/// [`verdict_for_node`] as the terminate order carries it (`rows` from [`rows_for_node`]), kept well inside the
/// message limit: a table still too large (thousands of ranks on one node) is left out, and the verdict says so.
fn encode_for_node(full: &Verdict, shell: &Verdict, rows: &[usize]) -> Bytes {
    let mut v = shell.clone();
    v.ranks = rows.iter().map(|&i| full.ranks[i].clone()).collect();
    let bytes = serde_json::to_vec(&v).unwrap_or_default();
    if bytes.len() <= hangwatch_rpc::MAX_MESSAGE_BYTES / 2 {
        return bytes.into();
    }
    v.ranks.clear();
    v.warnings.push(format!(
        "this node's rows of the roll-call table were left out ({} bytes); the coordinator's verdict has them",
        bytes.len()
    ));
    serde_json::to_vec(&v).unwrap_or_default().into()
}

/// What a node that left stands for in a roll call: its ranks, exited as its agent said.
fn departed_observations(m: &Member) -> NodeObservations {
    let mut o = NodeObservations::new(Some(m.node.clone()), 0);
    o.ranks = m
        .exits
        .iter()
        .map(|e| hangwatch_model::ProcessObservation {
            pid: e.pid,
            rank: Some(e.rank),
            node: Some(m.node.clone()),
            exited: true,
            exit_code: e.exit_code,
            exited_at_unix_s: e.exited_at_unix_s,
            ..Default::default()
        })
        .collect();
    o
}

/// How the coordinator runs the job's policy.
#[derive(Debug, Clone)]
pub struct SuperviseOptions {
    pub on_hang: OnHang,
    /// How often the membership's view is fed to the policy.
    pub tick: Duration,
    /// How long the agents have to answer a roll call.
    pub roll_call_deadline: Duration,
    /// How long ranks seen computing without progress hold the hard tier back.
    pub activity: ActivityRule,
}

impl Default for SuperviseOptions {
    /// End hung jobs; look every 250 ms; 8 s for a roll call (an agent's own budget: two /proc samples, Python
    /// stacks under a deadline, filesystem probes under a deadline).
    fn default() -> Self {
        Self {
            on_hang: OnHang::Abort,
            tick: Duration::from_millis(250),
            roll_call_deadline: Duration::from_secs(8),
            activity: ActivityRule::until(Duration::from_secs(30 * 60)),
        }
    }
}

/// What the coordinator tells the program that runs it, for people (it prints nothing itself).
#[derive(Debug, Clone)]
pub enum JobEvent {
    Joined {
        node: String,
        node_rank: u32,
        ranks: Vec<u32>,
    },
    Left {
        node: String,
        exit_code: Option<i32>,
    },
    Unreachable {
        nodes: Vec<String>,
        silence: Duration,
    },
    Reachable {
        nodes: Vec<String>,
    },
    ProgressResumed,
    RollCallOrdered {
        trigger: JobTrigger,
        stalled_for: Duration,
        nodes: usize,
    },
    Verdict {
        trigger: JobTrigger,
        verdict: Box<Verdict>,
        not_answered: Vec<String>,
        took: Duration,
    },
    Terminating {
        nodes: Vec<String>,
    },
    /// No progress, but the last roll call saw the ranks compute (its verdict): the job is not ended for it
    /// until `max_stall` or until the work stops. Once per stall.
    Computing {
        stalled_for: Duration,
        verdict: Box<Verdict>,
        max_stall: Option<Duration>,
    },
    /// The ranks that computed without progress stopped: the job is ended.
    WorkStopped,
    /// `--max-stall` passed while the ranks computed.
    MaxStallPassed {
        stalled_for: Duration,
    },
}

/// How the coordinator's work for a job ended.
#[derive(Debug, Clone, Default)]
pub struct JobEnding {
    /// The coordinator ordered the job ended.
    pub terminated: bool,
    /// The last roll call's verdict, if any.
    pub verdict: Option<Verdict>,
}

impl Coordinator {
    /// The job's view now: the worst node's stall, the silent nodes, whether everyone left.
    pub fn view(&self) -> JobView {
        let st = self.state();
        JobView {
            stall: st.membership.worst_stall().tier,
            fs_stuck: st.membership.any_fs_stuck(),
            unreachable: st.membership.unreachable(now()).into_iter().collect(),
            all_left: st.membership.all_left(),
            stalled_for: st.membership.worst_stall().stalled_for,
        }
    }

    /// Runs the job's policy until every node has left: ticks feed it the membership's view, roll calls run as
    /// tasks that report back, and the termination is ordered with the verdict. Never waits on an agent: a roll
    /// call is bounded by its deadline, orders are queued.
    pub async fn supervise(
        &self,
        options: SuperviseOptions,
        events: mpsc::Sender<JobEvent>,
    ) -> JobEnding {
        let started = tokio::time::Instant::now();
        let mut policy = JobPolicy::new(options.on_hang, options.activity);
        let (done_tx, mut done_rx) =
            mpsc::unbounded_channel::<(JobTrigger, RollCallOutcome, Duration)>();
        let mut ticker = tokio::time::interval(options.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen: BTreeMap<String, bool> = BTreeMap::new();
        let mut ending = JobEnding::default();
        // The policy never waits on whoever prints, keeps or alerts: a full queue drops the event, said once.
        let dropped = AtomicU64::new(0);
        let emit = |e: JobEvent| {
            if events.try_send(e).is_err() && dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(
                    "job events are not being taken: dropping them (the policy goes on)"
                );
            }
        };
        loop {
            let input = tokio::select! {
                _ = ticker.tick() => {
                    for m in self.members() {
                        // What was said about the node last: `Some(left)`; a change is said again.
                        let left = m.left.is_some();
                        let before = seen.insert(m.node.clone(), left);
                        if before.is_none() || before == Some(true) && !left {
                            emit(JobEvent::Joined { node: m.node.clone(), node_rank: m.node_rank, ranks: m.ranks.clone() });
                        }
                        if left && before != Some(true) {
                            emit(JobEvent::Left { node: m.node.clone(), exit_code: m.left.flatten() });
                        }
                    }
                    JobInput::Tick(self.view())
                }
                Some((trigger, outcome, took)) = done_rx.recv() => {
                    let conclusive = hangwatch_diagnosis::acts_on(
                        &outcome.verdict,
                        trigger == JobTrigger::FsStall,
                        is_conclusive_for_job,
                    );
                    emit(JobEvent::Verdict {
                        trigger,
                        verdict: Box::new(outcome.verdict.clone()),
                        not_answered: outcome.not_answered.clone(),
                        took,
                    });
                    let active = outcome.verdict.activity.is_some();
                    ending.verdict = Some(outcome.verdict);
                    JobInput::RollCallDone { trigger, conclusive, active }
                }
            };
            let elapsed = started.elapsed();
            for action in policy.handle(input, elapsed) {
                match action {
                    JobAction::Announce(JobNotice::Unreachable(nodes)) => {
                        emit(JobEvent::Unreachable {
                            nodes,
                            silence: self.shared.config.silence,
                        })
                    }
                    JobAction::Announce(JobNotice::Reachable(nodes)) => {
                        emit(JobEvent::Reachable { nodes })
                    }
                    JobAction::Announce(JobNotice::ProgressResumed) => {
                        emit(JobEvent::ProgressResumed)
                    }
                    JobAction::Announce(JobNotice::Computing) => emit(JobEvent::Computing {
                        stalled_for: self.state().membership.worst_stall().stalled_for,
                        verdict: Box::new(ending.verdict.clone().unwrap_or_else(|| {
                            Verdict::unknown("the ranks compute without progress")
                        })),
                        max_stall: options.activity.max_stall,
                    }),
                    JobAction::Announce(JobNotice::WorkStopped) => emit(JobEvent::WorkStopped),
                    JobAction::Announce(JobNotice::MaxStallPassed) => {
                        emit(JobEvent::MaxStallPassed {
                            stalled_for: self.state().membership.worst_stall().stalled_for,
                        })
                    }
                    JobAction::RollCall(trigger) => {
                        let stalled_for = self.state().membership.worst_stall().stalled_for;
                        emit(JobEvent::RollCallOrdered {
                            trigger,
                            stalled_for,
                            nodes: self.state().membership.members().count(),
                        });
                        let coordinator = self.clone();
                        let done = done_tx.clone();
                        let deadline = options.roll_call_deadline;
                        tokio::spawn(async move {
                            let t0 = tokio::time::Instant::now();
                            let stalled =
                                (trigger != JobTrigger::NodeUnreachable).then_some(stalled_for);
                            let outcome = coordinator.roll_call_stalled(deadline, stalled).await;
                            let _ = done.send((trigger, outcome, t0.elapsed()));
                        });
                    }
                    JobAction::Terminate => {
                        let reason = ending
                            .verdict
                            .as_ref()
                            .map_or_else(|| "the job is hung".to_string(), |v| v.summary.clone());
                        // Off the runtime's threads: encoding the orders of a large job takes a while.
                        let coordinator = self.clone();
                        let verdict = ending.verdict.clone();
                        let nodes = tokio::task::spawn_blocking(move || {
                            coordinator.terminate(&reason, verdict.as_ref())
                        })
                        .await
                        .unwrap_or_default();
                        ending.terminated = true;
                        emit(JobEvent::Terminating { nodes });
                    }
                    JobAction::Finish => return ending,
                }
            }
        }
    }
}

/// The coordinator's clock: tokio's, so that tests with paused time move it.
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Serves `config`'s job on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    Coordinator::new(config).serve(listener, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::{Culprit, RankPlace, RankReport};

    #[test]
    fn a_roll_call_takes_one_answer_per_node_asked_and_no_more_than_the_job_has_nodes() {
        let (tx, mut rx) = mpsc::channel(2);
        let mut inbox = RollCallInbox {
            answers: tx,
            asked: ["n1".to_string(), "n2".to_string()].into(),
            answered: Default::default(),
        };
        let obs = |n: &str| NodeObservations::new(Some(n.into()), 100);
        assert!(inbox.take("n1", obs("n1")));
        assert!(
            !inbox.take("n1", obs("n1")),
            "a second answer is not queued"
        );
        assert!(!inbox.take("n9", obs("n9")), "a node that was not asked");
        assert!(inbox.take("n2", obs("n2")), "the other node still gets in");
        let mut got = Vec::new();
        while let Ok((node, _)) = rx.try_recv() {
            got.push(node);
        }
        assert_eq!(got, ["n1", "n2"]);
    }

    fn place(rank: u32, node: &str) -> RankPlace {
        RankPlace {
            rank: Some(rank),
            node: Some(node.into()),
            pid: 100 + rank as i32,
            state: "S".into(),
            ..RankPlace::default()
        }
    }

    #[test]
    fn each_node_gets_the_whole_story_with_its_own_rows_and_the_culprits() {
        let mut full = Verdict::unknown("rank 0 on n1 is in D");
        for (rank, node) in [(0, "n1"), (1, "n1"), (2, "n2"), (3, "n2"), (4, "n3")] {
            full.ranks.push(RankReport {
                at: place(rank, node),
                cpu_ms_during_sample: None,
                threads: Vec::new(),
                threads_folded: 0,
                workers: Vec::new(),
            });
        }
        full.culprits.push(Culprit {
            at: place(0, "n1"),
            tid: None,
            killable: Some(false),
            kernel_stack: None,
            reason: None,
            worker: None,
            exit_code: None,
            death: None,
            thread_name: None,
            page_fault: None,
            lock_wait: None,
            threads: Vec::new(),
            deadlock: None,
            waits_on_peer: None,
        });
        let rows = |v: &Verdict| v.ranks.iter().filter_map(|r| r.rank).collect::<Vec<_>>();
        let n2 = verdict_for_node(&full, "n2");
        assert_eq!(rows(&n2), vec![0, 2, 3], "the culprit's row and its own");
        assert_eq!(n2.summary, full.summary);
        assert_eq!(n2.culprits, full.culprits);
        assert_eq!(rows(&verdict_for_node(&full, "n1")), vec![0, 1]);
        assert_eq!(rows(&verdict_for_node(&full, "n9")), vec![0]);

        let shell = full.without_ranks();
        let decoded: Verdict =
            serde_json::from_slice(&encode_for_node(&full, &shell, &rows_for_node(&full, "n3")))
                .expect("JSON");
        assert_eq!(rows(&decoded), vec![0, 4]);
    }
}
