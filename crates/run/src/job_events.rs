//! The coordinator's events for people, shared by `hangwatch coordinator` and the coordinator an agent hosts
//! (`run --host-coordinator`): each said in words, alerted, counted in the metrics, its verdict kept.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hangwatch_agent::human::say;
use hangwatch_agent::render::{rank_ranges, verdict_text};
use hangwatch_coordinator::hosted::{HostError, HostedCoordinator};
use hangwatch_coordinator::{Config, Coordinator, JobEvent, SuperviseOptions};
use hangwatch_metrics::{CoordinatorMetrics, Exposition, NodeSeen, NodeState};
use tokio::sync::mpsc;

/// The coordinator's lines start with this.
pub const WHO: &str = "hangwatch coordinator";

/// Says the error the coordinator's server ended on, if it did.
pub fn say_server_error(stopped: Result<(), hangwatch_coordinator::ServeError>) {
    if let Err(e) = stopped {
        say(format!(
            "{WHO}: error: {}",
            hangwatch_model::error_chain(&e)
        ));
    }
}

/// Says every event of the coordinator, each line starting with `who`, and keeps each verdict in `keep` (when
/// given) through the abandonable writer: the coordinator never blocks on a directory.
pub async fn say_events(
    mut events: mpsc::Receiver<JobEvent>,
    who: &'static str,
    keep: Option<PathBuf>,
    alerts: JobAlerts,
    metrics: Arc<CoordinatorMetrics>,
) {
    let program = hangwatch_child::self_exe().unwrap_or_else(|_| PathBuf::from("hangwatch"));
    let mut last_verdict = None;
    while let Some(event) = events.recv().await {
        say(format!("{who}: {}", describe(&event)));
        alerts.on_event(&event, &mut last_verdict);
        match &event {
            JobEvent::RollCallOrdered { .. } => metrics.roll_call(),
            JobEvent::Verdict { verdict, .. } => metrics.verdict(verdict.kind),
            _ => {}
        }
        if let (JobEvent::Verdict { verdict, .. }, Some(dir)) = (&event, &keep) {
            let files = hangwatch_agent::evidence::verdict_files(verdict);
            let (program, dir) = (program.clone(), dir.clone());
            let written = tokio::task::spawn_blocking(move || {
                hangwatch_agent::evidence::write_abandonable(
                    &program,
                    &dir,
                    &files,
                    Duration::from_secs(5),
                )
                .map(|()| dir)
            })
            .await;
            match written {
                Ok(Ok(dir)) => {
                    say(format!("{who}: verdict kept in {}", dir.display()));
                }
                Ok(Err(e)) => {
                    say(format!(
                        "{who}: warning: the verdict could not be kept: {e}"
                    ));
                }
                Err(e) => tracing::warn!(error = %e, "the verdict writer failed"),
            }
        }
    }
}

/// The job's alerts, sent by the coordinator (one per job, not one per node): suspected with each verdict, acted
/// when it orders the job ended.
pub struct JobAlerts {
    pub alerter: std::sync::Arc<hangwatch_alert::Alerter>,
    pub job: Option<String>,
    /// Where the verdict is kept: `HOST:DIR`.
    pub evidence: String,
}

impl JobAlerts {
    fn on_event(&self, event: &JobEvent, last_verdict: &mut Option<hangwatch_model::Verdict>) {
        use hangwatch_alert::{Alert, Stage};
        let alert = match event {
            JobEvent::Verdict { verdict, .. } => {
                *last_verdict = Some(verdict.without_ranks());
                // Ranks that compute are no hang: the policy says once that it holds back (Computing).
                if verdict.activity.is_some() {
                    return;
                }
                Alert::new(Stage::Suspected, verdict, hangwatch_model::unix_now())
            }
            JobEvent::Computing { verdict, .. } => {
                Alert::new(Stage::Computing, verdict, hangwatch_model::unix_now())
            }
            JobEvent::Terminating { nodes } => {
                let Some(mut verdict) = last_verdict.clone() else {
                    return;
                };
                verdict.actions.push(hangwatch_model::ActionRecord {
                    action: "terminate".into(),
                    ranks: Vec::new(),
                    ok: true,
                    detail: Some(format!(
                        "ordered every node to end its ranks ({})",
                        nodes.join(", ")
                    )),
                    outcomes: Vec::new(),
                });
                Alert::new(Stage::Acted, &verdict, hangwatch_model::unix_now())
            }
            _ => return,
        };
        let mut alert = alert;
        alert.job = self.job.clone();
        alert.node = Some(this_host());
        alert.evidence = Some(self.evidence.clone());
        self.alerter.send(&alert);
    }
}

/// This machine's name, for alerts.
pub fn this_host() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "coordinator".into())
}

/// One event in words.
pub fn describe(event: &JobEvent) -> String {
    match event {
        JobEvent::Joined {
            node,
            node_rank,
            ranks,
        } => format!(
            "node {node} joined (node rank {node_rank}{})",
            if ranks.is_empty() {
                String::new()
            } else {
                format!(", ranks {}", rank_ranges(ranks))
            }
        ),
        JobEvent::Left { node, exit_code } => match exit_code {
            Some(code) => format!("node {node} left (its agent exits {code})"),
            None => format!("node {node} left"),
        },
        JobEvent::Unreachable { nodes, silence } => format!(
            "node_unreachable: {} sent nothing for {:.0}s (agent killed, node down, or link cut); its ranks are not a hang by themselves",
            nodes.join(", "),
            silence.as_secs_f64()
        ),
        JobEvent::Reachable { nodes } => format!("{} heard from again", nodes.join(", ")),
        JobEvent::ProgressResumed => "progress resumed".into(),
        JobEvent::RollCallOrdered {
            trigger,
            stalled_for,
            nodes,
        } => format!(
            "no progress for {:.1}s ({}): roll call of {nodes} node(s)",
            stalled_for.as_secs_f64(),
            trigger.describe()
        ),
        JobEvent::Verdict {
            verdict,
            not_answered,
            took,
            ..
        } => {
            let mut text = format!(
                "verdict in {:.2}s{}:\n{}",
                took.as_secs_f64(),
                if not_answered.is_empty() {
                    String::new()
                } else {
                    format!(" (no answer from {})", not_answered.join(", "))
                },
                verdict_text(verdict)
            );
            while text.ends_with('\n') {
                text.pop();
            }
            text
        }
        JobEvent::Terminating { nodes } => format!(
            "ending the job: ordered every node to end its ranks ({})",
            nodes.join(", ")
        ),
        JobEvent::Computing {
            stalled_for,
            verdict,
            max_stall,
        } => hangwatch_agent::render::computing_text(
            *stalled_for,
            verdict.activity.as_ref(),
            *max_stall,
        ),
        JobEvent::WorkStopped => hangwatch_agent::render::WORK_STOPPED_TEXT.into(),
        JobEvent::MaxStallPassed { stalled_for } => {
            hangwatch_agent::render::max_stall_text(*stalled_for)
        }
    }
}

/// The coordinator's metrics, with the membership read at each scrape (the counters are fed from the events).
pub fn exposition(
    coordinator: &Coordinator,
    metrics: &Arc<CoordinatorMetrics>,
    expected_nodes: Option<usize>,
) -> Arc<dyn Exposition> {
    let coordinator = coordinator.clone();
    let metrics = Arc::clone(metrics);
    Arc::new(move || {
        let unreachable = coordinator.unreachable_nodes();
        let members = coordinator.members();
        metrics.set_nodes(
            expected_nodes,
            members.iter().map(|m| NodeSeen {
                node: &m.node,
                state: if m.left.is_some() {
                    NodeState::Left
                } else if unreachable.contains(&m.node) {
                    NodeState::Unreachable
                } else {
                    NodeState::Joined
                },
                silent_for: m.last_heard.elapsed(),
            }),
        );
        metrics.encode()
    })
}

/// The coordinator an agent hosts (`run --host-coordinator` on node rank 0), its events said like the
/// `hangwatch coordinator`'s and counted in its own metrics.
pub struct Hosted {
    coordinator: HostedCoordinator,
    metrics: Arc<CoordinatorMetrics>,
    expected_nodes: Option<usize>,
}

impl Hosted {
    /// Binds `listen` now (so that a taken port is known before the job starts) and serves in the background.
    pub fn start(
        listen: SocketAddr,
        config: Config,
        options: SuperviseOptions,
        alerts: JobAlerts,
    ) -> Result<Self, HostError> {
        let expected_nodes = config.expected_nodes;
        let metrics = Arc::new(CoordinatorMetrics::new(Some(config.secret.job_id())));
        let said = Arc::clone(&metrics);
        // The hosting agent's evidence holds the job's verdict already: none is kept apart.
        let coordinator = HostedCoordinator::start(listen, config, options, move |events| {
            say_events(events, WHO, None, alerts, said)
        })?;
        say(format!(
            "{WHO}: hosted by this agent, listening on {listen}"
        ));
        Ok(Self {
            coordinator,
            metrics,
            expected_nodes,
        })
    }

    /// The coordinator's metrics, brought up to date at each scrape (served with the agent's by `run --metrics`).
    pub fn metrics(&self) -> Arc<dyn Exposition> {
        exposition(
            self.coordinator.coordinator(),
            &self.metrics,
            self.expected_nodes,
        )
    }

    /// This node's job is over: keep serving (at most `wait`) until every other node has left or gone silent, so
    /// that the last orders reach them, then stop.
    pub fn finish(self, wait: Duration) {
        say_server_error(self.coordinator.finish(wait));
    }
}
