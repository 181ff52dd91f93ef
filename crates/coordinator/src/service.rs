//! The gRPC face of the coordinator: each call checked (token by the interceptor, then session and version) and
//! turned into a change of the in-memory state.

use hangwatch_rpc::pb::coordinator_server::{self, CoordinatorServer};
use hangwatch_rpc::pb::{self};
use hangwatch_rpc::{CheckToken, Refusal, RefusalKind, MAX_MESSAGE_BYTES};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

use crate::{membership::new_session_id, now, requests, Attached, Coordinator, ORDER_QUEUE};

pub(crate) struct Service {
    coordinator: Coordinator,
}

pub(crate) fn server(
    coordinator: Coordinator,
) -> InterceptedService<CoordinatorServer<Service>, CheckToken> {
    let check = CheckToken::new(coordinator.shared.config.secret.token().clone());
    let server = CoordinatorServer::new(Service { coordinator })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    InterceptedService::new(server, check)
}

fn unknown_session(session_id: &str) -> Status {
    let shown: String = session_id.chars().take(40).collect();
    Refusal::new(
        RefusalKind::UnknownSession,
        format!("session {shown:?} is not known to this coordinator (it restarted, or the node registered again): register again"),
    )
    .to_status()
}

fn millis(ms: u32) -> u32 {
    ms.max(1)
}

#[tonic::async_trait]
impl coordinator_server::Coordinator for Service {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterReply>, Status> {
        let peer = request.remote_addr();
        let r = request.into_inner();
        let registration = requests::registration(r);
        let node = registration.node.clone();
        let config = &self.coordinator.shared.config;
        let session_id = new_session_id().map_err(|e| {
            tracing::error!(%node, error = %e, "no random bytes for a session id");
            Status::unavailable(format!(
                "the coordinator could not draw a session id from the OS's random source: {e}"
            ))
        })?;
        let result = {
            let mut st = self.coordinator.state();
            let result = st.membership.register(registration, now(), session_id);
            if result.is_ok() {
                // A new session's order stream is opened by its own Attach.
                st.attached.remove(&node);
            }
            result
        };
        match result {
            Ok(session_id) => {
                tracing::info!(%node, ?peer, "node registered");
                Ok(Response::new(pb::RegisterReply {
                    protocol_version: hangwatch_rpc::PROTOCOL_VERSION,
                    session_id,
                    progress_interval_ms: millis(
                        u32::try_from(config.progress_interval.as_millis()).unwrap_or(u32::MAX),
                    ),
                    silence_ms: millis(
                        u32::try_from(config.silence.as_millis()).unwrap_or(u32::MAX),
                    ),
                }))
            }
            Err(refusal) => {
                tracing::warn!(%node, ?peer, kind = ?refusal.kind, reason = %refusal, "registration refused");
                Err(refusal.to_status())
            }
        }
    }

    type AttachStream = ReceiverStream<Result<pb::Order, Status>>;

    async fn attach(
        &self,
        request: Request<Streaming<pb::ProgressReport>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let mut inbound = request.into_inner();
        let silence = self.coordinator.shared.config.silence;
        // The first report names the session; an agent sends one as soon as it attaches.
        let first = match tokio::time::timeout(silence, inbound.next()).await {
            Ok(Some(Ok(report))) => report,
            Ok(Some(Err(status))) => return Err(status),
            Ok(None) => {
                return Err(Refusal::new(
                    RefusalKind::BadRequest,
                    "attach stream closed before its first progress report",
                )
                .to_status())
            }
            Err(_) => {
                return Err(Status::deadline_exceeded(format!(
                    "no progress report within {:.1}s of attaching: an agent sends one at once",
                    silence.as_secs_f64()
                )))
            }
        };
        let session_id = first.session_id.clone();
        let (tx, rx) = mpsc::channel(ORDER_QUEUE);
        let node = {
            let mut st = self.coordinator.state();
            let node = st
                .membership
                .heard(
                    &session_id,
                    now(),
                    Some(requests::node_report(&first, now())),
                )
                .ok_or_else(|| unknown_session(&session_id))?
                .to_string();
            st.attached.insert(
                node.clone(),
                Attached {
                    session_id: session_id.clone(),
                    orders: tx,
                },
            );
            node
        };
        tracing::debug!(%node, "agent attached");
        let coordinator = self.coordinator.clone();
        let mut closing = coordinator.shared.closing.subscribe();
        tokio::spawn(async move {
            loop {
                let item = tokio::select! {
                    item = inbound.next() => item,
                    _ = closing.wait_for(|c| *c) => None,
                };
                let Some(item) = item else { break };
                match item {
                    Ok(report) if report.session_id == session_id => {
                        let mut st = coordinator.state();
                        if st
                            .membership
                            .heard(
                                &session_id,
                                now(),
                                Some(requests::node_report(&report, now())),
                            )
                            .is_none()
                        {
                            break;
                        }
                    }
                    Ok(_) => {
                        tracing::warn!(%node, "progress for another session on this stream; closing it");
                        break;
                    }
                    Err(status) => {
                        tracing::debug!(%node, %status, "progress stream failed");
                        break;
                    }
                }
            }
            let mut st = coordinator.state();
            if st
                .attached
                .get(&node)
                .is_some_and(|a| a.session_id == session_id)
            {
                st.attached.remove(&node);
            }
            tracing::info!(%node, "agent detached");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn report_roll_call(
        &self,
        request: Request<pb::RollCallReport>,
    ) -> Result<Response<pb::RollCallAck>, Status> {
        let r = request.into_inner();
        let (node, open) = {
            let mut st = self.coordinator.state();
            let node = st
                .membership
                .heard(&r.session_id, now(), None)
                .ok_or_else(|| unknown_session(&r.session_id))?
                .to_string();
            let open = st.roll_calls.contains_key(&r.roll_call_id);
            (node, open)
        };
        if !open {
            tracing::info!(%node, roll_call = r.roll_call_id, "late or unknown roll-call answer ignored");
            return Ok(Response::new(pb::RollCallAck { accepted: false }));
        }
        // The session says which node this is; the payload's names (its own, each process's) must not move ranks
        // to another node.
        let answer = requests::roll_call_answer(&node, &r.observations_json).map_err(|e| {
            tracing::warn!(%node, roll_call = r.roll_call_id, error = %e, "unreadable roll-call answer");
            Refusal::new(RefusalKind::BadRequest, format!("node {node}: {e}")).to_status()
        })?;
        if answer.named_another_node {
            tracing::warn!(%node, "roll-call answer names another node; using the session's");
        }
        // Decoded outside the lock; queued under it, once per node.
        let accepted = self
            .coordinator
            .state()
            .roll_calls
            .get_mut(&r.roll_call_id)
            .is_some_and(|inbox| inbox.take(&node, answer.observations));
        if !accepted {
            tracing::info!(%node, roll_call = r.roll_call_id, "roll-call answer not taken (a second answer, or the roll call ended)");
        }
        Ok(Response::new(pb::RollCallAck { accepted }))
    }
}
