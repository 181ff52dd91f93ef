//! What an agent that holds the job's key can send the coordinator, through the same decoding the service uses:
//! a sequence of frames (kind byte, 2-byte length, protobuf bytes) of Register, progress and roll-call answer
//! messages, applied to one membership in order. Nothing may panic, and the membership must stay consistent.
#![no_main]

use std::time::{Duration, Instant};

use hangwatch_coordinator::requests::{node_report, registration, roll_call_answer};
use hangwatch_coordinator::Membership;
use hangwatch_rpc::pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let mut membership = Membership::new(Some("job".into()), Some(4), Duration::from_secs(5));
    let start = Instant::now();
    let mut sessions: Vec<String> = Vec::new();
    let mut rest = data;
    let mut tick = 0u64;
    while rest.len() >= 3 {
        let kind = rest[0];
        let len = usize::from(u16::from_le_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        let (frame, after) = rest[3..].split_at(len);
        rest = after;
        tick += 1;
        let now = start + Duration::from_millis(tick * 300);
        match kind % 3 {
            0 => {
                let Ok(request) = pb::RegisterRequest::decode(frame) else {
                    continue;
                };
                if let Ok(id) = membership.register(registration(request), now, format!("s{tick:032x}")) {
                    sessions.push(id);
                }
            }
            1 => {
                let Ok(mut report) = pb::ProgressReport::decode(frame) else {
                    continue;
                };
                // Most reports speak for a session that exists, as an agent's would.
                if let Some(id) = sessions.get(usize::from(kind / 3) % sessions.len().max(1)) {
                    if kind & 0x80 == 0 {
                        report.session_id = id.clone();
                    }
                }
                let _ = membership.heard(&report.session_id, now, Some(node_report(&report, now)));
            }
            _ => {
                let Ok(report) = pb::RollCallReport::decode(frame) else {
                    continue;
                };
                if let Ok(answer) = roll_call_answer("n1", &report.observations_json) {
                    assert!(answer
                        .observations
                        .processes()
                        .all(|p| p.node.as_deref() == Some("n1")));
                }
            }
        }
        let _ = membership.unreachable(now);
    }
    assert!(membership.members().count() <= 4, "never more nodes than --nnodes");
});
