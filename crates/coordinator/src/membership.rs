//! Who is in the job and who is still heard from: registration rules (version, job, duplicates, late joins) and
//! liveness after a silence. Pure: `now` is an argument, no clock, no I/O.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hangwatch_rpc::{Refusal, RefusalKind, PROTOCOL_VERSION};

/// What an agent asks to register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub protocol_version: u32,
    pub job_id: String,
    pub node: String,
    pub node_rank: u32,
    pub ranks: Vec<u32>,
}

/// The latest progress an agent reported for one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankProgress {
    pub rank: u32,
    pub step: Option<u64>,
    /// How old the rank's last progress was when the report arrived.
    pub age: Duration,
    pub reported_at: Instant,
}

/// One registered node.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub node: String,
    pub node_rank: u32,
    pub ranks: Vec<u32>,
    pub session_id: String,
    pub registered_at: Instant,
    pub last_heard: Instant,
    pub progress: Vec<RankProgress>,
    /// What the node's own stall detector said last.
    pub stall: NodeStall,
    /// The job ended on this node (with the agent's exit code): its silence is not unreachability.
    pub left: Option<Option<i32>>,
    /// How the node's ranks ended, as its agent said when it left.
    pub exits: Vec<RankExit>,
}

/// How one rank of a node that left ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankExit {
    pub rank: u32,
    pub pid: i32,
    pub exit_code: Option<i32>,
    pub exited_at_unix_s: Option<f64>,
}

/// A node's stall tier, by its own detector (which sees every beat, phase and output line of its ranks).
pub use hangwatch_model::StallTier;

/// A node's stall as it reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeStall {
    pub tier: StallTier,
    pub stalled_for: Duration,
    /// The node's fast path holds (a rank stuck on its filesystem, or stopped, while the node stalls).
    pub fs_stuck: bool,
}

/// One progress report of a node, as the membership keeps it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeReport {
    pub ranks: Vec<RankProgress>,
    pub stall: NodeStall,
    /// `Some(exit code)` when the job ended on the node.
    pub leaving: Option<Option<i32>>,
    /// With `leaving`: how its ranks ended.
    pub exits: Vec<RankExit>,
}

/// Whether a node is still heard from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Live,
    /// The job ended on the node and its agent said goodbye.
    Left,
    /// Nothing heard for `silent_for`, at least the configured silence: the node is `node_unreachable`.
    Unreachable {
        silent_for: Duration,
    },
}

/// A new session id: 128 bits from the operating system's random source, as 32 lowercase hex digits. A session
/// id names a registration in every later call; one that could be guessed (a counter, a clock) would let a peer
/// that holds the job token speak for another node.
pub fn new_session_id() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The longest node name accepted: a DNS name's limit.
pub const MAX_NODE_NAME: usize = 253;

/// A node name is a hostname's characters (`[A-Za-z0-9._-]`, at most [`MAX_NODE_NAME`]): it is printed in
/// verdicts, alerts and Slurm hostlists (`--exclude`, drains), where a comma, a bracket or a space would name other
/// nodes than the one that registered.
pub fn check_node_name(node: &str) -> Result<(), Refusal> {
    if node.is_empty() {
        return Err(Refusal::new(
            RefusalKind::BadRequest,
            "registration without a node name: the agent sends its hostname",
        ));
    }
    let bad: Vec<char> = node
        .chars()
        .filter(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        .collect();
    if !bad.is_empty() || node.len() > MAX_NODE_NAME {
        let shown: String = node.chars().take(64).collect();
        return Err(Refusal::new(
            RefusalKind::BadRequest,
            format!(
                "node name {shown:?} is not a hostname: a node name has at most {MAX_NODE_NAME} letters, digits, '.', '_' or '-'{}; set the agent's node name (--node-name, or the hostname) to one",
                if bad.is_empty() {
                    String::new()
                } else {
                    format!(" (it has {:?})", bad.iter().collect::<String>())
                }
            ),
        ));
    }
    Ok(())
}

/// The nodes of one job.
#[derive(Debug)]
pub struct Membership {
    job_id: Option<String>,
    expected_nodes: Option<usize>,
    silence: Duration,
    nodes: BTreeMap<String, Member>,
}

impl Membership {
    /// `job_id: None` takes the job of the first registration. `expected_nodes: Some(n)` closes the job once `n`
    /// nodes have registered.
    pub fn new(job_id: Option<String>, expected_nodes: Option<usize>, silence: Duration) -> Self {
        Self {
            job_id,
            expected_nodes,
            silence,
            nodes: BTreeMap::new(),
        }
    }

    pub fn job_id(&self) -> Option<&str> {
        self.job_id.as_deref()
    }

    /// Admits a node under the new session id `session_id` (the caller draws it: [`new_session_id`]) and returns
    /// it, or says why not. A node that registers again after it went silent (an agent restart, a healed link)
    /// replaces its old session.
    pub fn register(
        &mut self,
        r: Registration,
        now: Instant,
        session_id: String,
    ) -> Result<String, Refusal> {
        if r.protocol_version != PROTOCOL_VERSION {
            return Err(Refusal::new(
                RefusalKind::VersionMismatch,
                format!(
                    "node {:?} speaks coordinator protocol {}, this coordinator speaks {}: run the same hangwatch version on every node",
                    r.node, r.protocol_version, PROTOCOL_VERSION
                ),
            ));
        }
        check_node_name(&r.node)?;
        if let Some(job) = &self.job_id {
            if *job != r.job_id {
                return Err(Refusal::new(
                    RefusalKind::OtherJob,
                    format!(
                        "node {} belongs to job {:?}, this coordinator serves job {job:?}: check --coordinator and the token file",
                        r.node, r.job_id
                    ),
                ));
            }
        }
        if let Some(old) = self.nodes.get(&r.node) {
            if self.is_live(old, now) {
                return Err(Refusal::new(
                    RefusalKind::DuplicateNode,
                    format!(
                        "node {} is already registered (node rank {}, heard from {:.1}s ago): is a second agent running on it, or do two nodes share a hostname?",
                        r.node,
                        old.node_rank,
                        now.saturating_duration_since(old.last_heard).as_secs_f64()
                    ),
                ));
            }
        } else {
            if let Some(other) = self
                .nodes
                .values()
                .find(|m| m.node_rank == r.node_rank && self.is_live(m, now))
            {
                return Err(Refusal::new(
                    RefusalKind::DuplicateNode,
                    format!(
                        "node rank {} is already taken by node {}; node {} must use another --node-rank",
                        r.node_rank, other.node, r.node
                    ),
                ));
            }
            if let Some(expected) = self.expected_nodes {
                if self.nodes.len() >= expected {
                    return Err(Refusal::new(
                        RefusalKind::JobComplete,
                        format!(
                            "job {:?} is complete: its {expected} nodes have registered ({}); node {} is not one of them (late join): check --nnodes",
                            r.job_id,
                            self.nodes.keys().cloned().collect::<Vec<_>>().join(", "),
                            r.node
                        ),
                    ));
                }
            }
        }
        self.job_id.get_or_insert_with(|| r.job_id.clone());
        self.nodes.insert(
            r.node.clone(),
            Member {
                node: r.node,
                node_rank: r.node_rank,
                ranks: r.ranks,
                session_id: session_id.clone(),
                registered_at: now,
                last_heard: now,
                progress: Vec::new(),
                stall: NodeStall::default(),
                left: None,
                exits: Vec::new(),
            },
        );
        Ok(session_id)
    }

    /// The node of a current session.
    pub fn node_of(&self, session_id: &str) -> Option<&Member> {
        self.nodes.values().find(|m| m.session_id == session_id)
    }

    /// A sign of life from `session_id` at `now`, with the progress it reported (if any). Returns the node, or
    /// `None` for a session that is not current (replaced, or from before a restart).
    pub fn heard(
        &mut self,
        session_id: &str,
        now: Instant,
        report: Option<NodeReport>,
    ) -> Option<&str> {
        let member = self
            .nodes
            .values_mut()
            .find(|m| m.session_id == session_id)?;
        member.last_heard = member.last_heard.max(now);
        if let Some(r) = report {
            member.progress = r.ranks;
            member.stall = r.stall;
            if r.leaving.is_some() {
                member.left = r.leaving;
                member.exits = r.exits;
            }
        }
        Some(&member.node)
    }

    fn is_live(&self, m: &Member, now: Instant) -> bool {
        m.left.is_none() && now.saturating_duration_since(m.last_heard) < self.silence
    }

    /// Whether every node of the job has joined and then left (the job is over everywhere). Without a known node
    /// count: every node that joined has left.
    pub fn all_left(&self) -> bool {
        let joined = self.nodes.len();
        joined > 0
            && self.expected_nodes.is_none_or(|n| joined >= n)
            && self.nodes.values().all(|m| m.left.is_some())
    }

    /// Whether any node still in the job says its fast path holds.
    pub fn any_fs_stuck(&self) -> bool {
        self.nodes
            .values()
            .any(|m| m.left.is_none() && m.stall.fs_stuck)
    }

    /// The worst stall among the nodes still in the job (live or not: a silent node's last word stands).
    pub fn worst_stall(&self) -> NodeStall {
        self.nodes
            .values()
            .filter(|m| m.left.is_none())
            .map(|m| m.stall)
            .max_by_key(|s| (s.tier, s.stalled_for))
            .unwrap_or_default()
    }

    /// Every node's liveness at `now`, by node name.
    pub fn liveness(&self, now: Instant) -> Vec<(&str, Liveness)> {
        self.nodes
            .values()
            .map(|m| {
                let silent_for = now.saturating_duration_since(m.last_heard);
                let l = if m.left.is_some() {
                    Liveness::Left
                } else if silent_for < self.silence {
                    Liveness::Live
                } else {
                    Liveness::Unreachable { silent_for }
                };
                (m.node.as_str(), l)
            })
            .collect()
    }

    /// The nodes that are `node_unreachable` at `now`.
    pub fn unreachable(&self, now: Instant) -> Vec<String> {
        self.liveness(now)
            .into_iter()
            .filter(|(_, l)| matches!(l, Liveness::Unreachable { .. }))
            .map(|(n, _)| n.to_string())
            .collect()
    }

    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.nodes.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SILENCE: Duration = Duration::from_secs(5);

    fn sid() -> String {
        new_session_id().expect("the OS gives random bytes")
    }

    fn reg(node: &str, node_rank: u32) -> Registration {
        Registration {
            protocol_version: PROTOCOL_VERSION,
            job_id: "job-42".into(),
            node: node.into(),
            node_rank,
            ranks: vec![node_rank * 8, node_rank * 8 + 1],
        }
    }

    fn refused(m: &mut Membership, r: Registration, now: Instant) -> Refusal {
        m.register(r, now, sid()).expect_err("refused")
    }

    #[test]
    fn a_node_that_falls_silent_becomes_unreachable_after_the_silence_and_live_again_when_heard() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut m = Membership::new(None, None, SILENCE);
        let s1 = m.register(reg("n1", 0), t0, sid()).expect("n1");
        let s2 = m.register(reg("n2", 1), t0, sid()).expect("n2");
        assert_ne!(s1, s2);
        for ms in (1000..=10_000).step_by(1000) {
            m.heard(&s1, at(ms), None).expect("current session");
        }
        assert!(m.unreachable(at(4999)).is_empty());
        assert_eq!(m.unreachable(at(5000)), vec!["n2".to_string()]);
        assert_eq!(
            m.liveness(at(7000)),
            vec![
                ("n1", Liveness::Live),
                (
                    "n2",
                    Liveness::Unreachable {
                        silent_for: Duration::from_secs(7)
                    }
                )
            ]
        );
        assert_eq!(m.heard(&s2, at(8000), None), Some("n2"));
        assert!(m.unreachable(at(8000)).is_empty());
        assert_eq!(m.heard("999", at(8000), None), None, "an unknown session");
        // A late sign of life does not move the clock back.
        m.heard(&s1, at(9000), None);
        assert!(m.unreachable(at(14_999)).iter().all(|n| n != "n1"));
    }

    #[test]
    fn duplicates_other_jobs_other_versions_and_late_joins_are_refused_with_what_to_do() {
        let t0 = Instant::now();
        let mut m = Membership::new(Some("job-42".into()), Some(2), SILENCE);
        m.register(reg("n1", 0), t0, sid()).expect("n1");

        let r = refused(&mut m, reg("n1", 0), t0);
        assert_eq!(r.kind, RefusalKind::DuplicateNode);
        assert!(
            r.message.contains("node n1 is already registered"),
            "{}",
            r.message
        );
        let r = refused(&mut m, reg("n9", 0), t0);
        assert_eq!(r.kind, RefusalKind::DuplicateNode);
        assert!(r
            .message
            .contains("node rank 0 is already taken by node n1"));

        let mut other = reg("n2", 1);
        other.job_id = "job-7".into();
        assert_eq!(refused(&mut m, other, t0).kind, RefusalKind::OtherJob);
        let mut old = reg("n2", 1);
        old.protocol_version = PROTOCOL_VERSION + 1;
        let r = refused(&mut m, old, t0);
        assert_eq!(r.kind, RefusalKind::VersionMismatch);
        assert!(
            r.message.contains("same hangwatch version"),
            "{}",
            r.message
        );
        assert_eq!(
            refused(&mut m, reg("", 1), t0).kind,
            RefusalKind::BadRequest
        );

        m.register(reg("n2", 1), t0, sid())
            .expect("n2 completes the job");
        let r = refused(&mut m, reg("n3", 2), t0);
        assert_eq!(r.kind, RefusalKind::JobComplete);
        assert!(
            r.message.contains("its 2 nodes have registered (n1, n2)"),
            "{}",
            r.message
        );
        assert_eq!(m.members().count(), 2, "refusals change nothing");
    }

    #[test]
    fn a_node_name_that_is_not_a_hostname_is_refused_with_the_rule() {
        let t0 = Instant::now();
        let mut m = Membership::new(None, None, SILENCE);
        for bad in ["n[1-8]", "n1,n7", "n 1", "n1\n", "n/1", "ñ1"] {
            let r = refused(&mut m, reg(bad, 0), t0);
            assert_eq!(r.kind, RefusalKind::BadRequest, "{bad:?}");
            assert!(r.message.contains("is not a hostname"), "{}", r.message);
            assert!(
                r.message.contains("letters, digits, '.', '_' or '-'"),
                "{}",
                r.message
            );
        }
        let r = refused(&mut m, reg(&"n".repeat(MAX_NODE_NAME + 1), 0), t0);
        assert_eq!(r.kind, RefusalKind::BadRequest);
        assert_eq!(m.members().count(), 0, "refusals change nothing");
        for good in ["n1", "gpu-a100.rack_7.example.org", "N1"] {
            let mut m = Membership::new(None, None, SILENCE);
            m.register(reg(good, 0), t0, sid()).expect(good);
        }
    }

    #[test]
    fn session_ids_are_128_random_bits_in_hex() {
        let ids: Vec<String> = (0..64).map(|_| sid()).collect();
        for id in &ids {
            assert_eq!(id.len(), 32, "{id}");
            assert!(
                id.chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
                "{id}"
            );
        }
        let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "no two alike");
    }

    #[test]
    fn a_silent_node_may_register_again_and_replaces_its_old_session() {
        let t0 = Instant::now();
        let mut m = Membership::new(None, Some(1), SILENCE);
        let old = m.register(reg("n1", 0), t0, sid()).expect("n1");
        let later = t0 + SILENCE;
        let new = m
            .register(reg("n1", 0), later, sid())
            .expect("rejoin after silence");
        assert_ne!(old, new);
        assert_eq!(m.heard(&old, later, None), None, "the old session is gone");
        assert_eq!(m.node_of(&new).map(|n| n.node.as_str()), Some("n1"));
        assert_eq!(
            m.job_id(),
            Some("job-42"),
            "the first registration names the job"
        );
    }
}
