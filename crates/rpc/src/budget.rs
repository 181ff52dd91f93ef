//! Who may start a TLS handshake with the coordinator now: a cap on handshakes in flight, shared fairly among the
//! addresses that want one, with a slot kept for every address that has proven the job's key before. Pure: the
//! accept loop (crate::accept) asks before each handshake and says when one ends and when a peer proved the key.
//!
//! ```text
//!  connection from ip ──► known and nothing in flight? ── yes ──► admitted while any slot is free
//!                                  │ no
//!                                  ▼
//!  free = MAX_HANDSHAKES − in flight − slots kept for idle known addresses (at most MAX_RESERVED_FOR_KNOWN)
//!  share = max(1, min(MAX_HANDSHAKES_PER_ADDRESS, free / addresses in flight, this one included))
//!  admitted when free > 0 and ip has fewer than `share` in flight
//! ```
//!
//! So a new address always gets one slot while any is free, a busy one is held back more the fuller it gets, and a
//! flood from strangers on any number of addresses never takes the last slot from a node of the job. Known means
//! it completed a handshake with the job's key: that cannot be faked, whereas anything a peer says before could.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// Handshakes in flight at once, all peers together. Beyond it a new connection is closed at once (an agent
/// retries within seconds); those already joined are not affected.
pub const MAX_HANDSHAKES: usize = 1024;

/// Handshakes in flight from one address when slots are plenty; fewer as they run out. One node's agent needs one.
pub const MAX_HANDSHAKES_PER_ADDRESS: usize = 64;

/// Slots kept at most for known addresses with nothing in flight: the rest stays open to addresses never seen,
/// among them a node's first join.
pub const MAX_RESERVED_FOR_KNOWN: usize = MAX_HANDSHAKES / 2;

/// Addresses remembered as known at most (a job's nodes, which are far fewer); later ones are not remembered.
pub const MAX_KNOWN_ADDRESSES: usize = 16_384;

/// The answer to a connection that wants to start a handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Go ahead; report the end with [`HandshakeBudget::finished`].
    Admitted,
    /// No slot is free for this address (the rest are in flight or kept for known nodes).
    Full,
    /// This address already holds its share of the free slots.
    OverShare { share: usize },
}

impl Admission {
    /// Why a refused connection was refused, for the log.
    pub fn reason(self) -> &'static str {
        match self {
            Admission::Admitted => "admitted",
            Admission::Full => {
                "every handshake slot is in flight or kept for the job's known nodes"
            }
            Admission::OverShare { .. } => {
                "its address holds its share of the handshakes in flight"
            }
        }
    }
}

/// Handshakes in flight, per address, and the addresses known to hold the job's key.
#[derive(Debug, Default)]
pub struct HandshakeBudget {
    in_flight: usize,
    by_address: HashMap<IpAddr, usize>,
    known: HashSet<IpAddr>,
    /// Known addresses with at least one handshake in flight (the others each have a slot kept).
    known_in_flight: usize,
}

impl HandshakeBudget {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a connection from `ip` may start a handshake now; when admitted, its slot is taken.
    pub fn admit(&mut self, ip: IpAddr) -> Admission {
        let mine = self.by_address.get(&ip).copied().unwrap_or(0);
        let known = self.known.contains(&ip);
        let admission = if known && mine == 0 {
            if self.in_flight < MAX_HANDSHAKES {
                Admission::Admitted
            } else {
                Admission::Full
            }
        } else {
            let kept = (self.known.len() - self.known_in_flight).min(MAX_RESERVED_FOR_KNOWN);
            let free = MAX_HANDSHAKES.saturating_sub(self.in_flight + kept);
            let addresses = self.by_address.len() + usize::from(mine == 0);
            let share = (free / addresses).clamp(1, MAX_HANDSHAKES_PER_ADDRESS);
            if free == 0 {
                Admission::Full
            } else if mine >= share {
                Admission::OverShare { share }
            } else {
                Admission::Admitted
            }
        };
        if admission == Admission::Admitted {
            if known && mine == 0 {
                self.known_in_flight += 1;
            }
            *self.by_address.entry(ip).or_default() += 1;
            self.in_flight += 1;
        }
        admission
    }

    /// A handshake admitted for `ip` ended (proven, failed or timed out): its slot is free.
    pub fn finished(&mut self, ip: IpAddr) {
        let Some(mine) = self.by_address.get_mut(&ip) else {
            return;
        };
        *mine -= 1;
        self.in_flight -= 1;
        if *mine == 0 {
            self.by_address.remove(&ip);
            if self.known.contains(&ip) {
                self.known_in_flight -= 1;
            }
        }
    }

    /// A peer at `ip` proved the job's key: from now on a slot is kept for it.
    pub fn proved(&mut self, ip: IpAddr) {
        if self.known.len() >= MAX_KNOWN_ADDRESSES || !self.known.insert(ip) {
            return;
        }
        if self.by_address.contains_key(&ip) {
            self.known_in_flight += 1;
        }
    }

    /// Handshakes in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u32) -> IpAddr {
        IpAddr::from((0x0a00_0000 + n).to_be_bytes())
    }

    /// Each of `addresses` asks `times` times, round after round (`interleaved`) or one address after another.
    fn flood(budget: &mut HandshakeBudget, addresses: &[IpAddr], times: usize, interleaved: bool) {
        if interleaved {
            for _ in 0..times {
                for &a in addresses {
                    budget.admit(a);
                }
            }
        } else {
            for &a in addresses {
                for _ in 0..times {
                    budget.admit(a);
                }
            }
        }
    }

    fn check_invariants(budget: &HandshakeBudget) {
        assert!(budget.in_flight <= MAX_HANDSHAKES);
        assert_eq!(budget.by_address.values().sum::<usize>(), budget.in_flight);
        assert!(budget.by_address.values().all(|&n| n > 0));
        assert_eq!(
            budget.known_in_flight,
            budget
                .by_address
                .keys()
                .filter(|a| budget.known.contains(a))
                .count()
        );
    }

    #[test]
    fn one_address_alone_gets_its_64_and_a_slot_given_back_is_free_again() {
        let mut budget = HandshakeBudget::new();
        let (stranger, agent) = (ip(9), ip(2));
        let taken = (0..1000)
            .filter(|_| budget.admit(stranger) == Admission::Admitted)
            .count();
        assert_eq!(taken, MAX_HANDSHAKES_PER_ADDRESS);
        assert_eq!(
            budget.admit(stranger),
            Admission::OverShare {
                share: MAX_HANDSHAKES_PER_ADDRESS
            }
        );
        assert_eq!(
            budget.admit(agent),
            Admission::Admitted,
            "another node still gets a slot"
        );
        budget.finished(stranger);
        assert_eq!(budget.admit(stranger), Admission::Admitted);
        for _ in 0..MAX_HANDSHAKES_PER_ADDRESS {
            budget.finished(stranger);
        }
        budget.finished(agent);
        budget.finished(agent);
        assert_eq!(budget.in_flight(), 0);
        assert!(budget.by_address.is_empty());
    }

    #[test]
    fn a_flood_from_16_addresses_leaves_room_for_a_17th_known_and_a_17th_new_one() {
        for interleaved in [false, true] {
            let mut budget = HandshakeBudget::new();
            let node = ip(100);
            budget.admit(node);
            budget.proved(node);
            budget.finished(node);
            let strangers: Vec<IpAddr> = (1..=16).map(ip).collect();
            flood(&mut budget, &strangers, 64, interleaved);
            check_invariants(&budget);
            assert!(
                budget.in_flight() < MAX_HANDSHAKES,
                "{}",
                budget.in_flight()
            );
            assert_eq!(
                budget.admit(node),
                Admission::Admitted,
                "interleaved: {interleaved}"
            );
            assert_eq!(
                budget.admit(ip(17)),
                Admission::Admitted,
                "interleaved: {interleaved}"
            );
            check_invariants(&budget);
        }
    }

    #[test]
    fn strangers_on_any_number_of_addresses_never_take_a_known_nodes_last_slot() {
        let mut budget = HandshakeBudget::new();
        let nodes: Vec<IpAddr> = (5000..5100).map(ip).collect();
        for &n in &nodes {
            budget.admit(n);
            budget.proved(n);
            budget.finished(n);
        }
        let strangers: Vec<IpAddr> = (1..=4000).map(ip).collect();
        flood(&mut budget, &strangers, 3, true);
        check_invariants(&budget);
        assert_eq!(budget.in_flight(), MAX_HANDSHAKES - nodes.len());
        assert_eq!(budget.admit(ip(4001)), Admission::Full);
        for &n in &nodes {
            assert_eq!(budget.admit(n), Admission::Admitted);
        }
        assert_eq!(budget.in_flight(), MAX_HANDSHAKES);
        assert_eq!(
            budget.admit(nodes[0]),
            Admission::Full,
            "the cap holds for everyone"
        );
        check_invariants(&budget);
    }

    #[test]
    fn the_slots_kept_for_known_nodes_are_bounded_so_new_nodes_can_still_join() {
        let mut budget = HandshakeBudget::new();
        for n in 0..2000 {
            budget.admit(ip(n));
            budget.proved(ip(n));
            budget.finished(ip(n));
        }
        let newcomers: Vec<IpAddr> = (10_000..11_000).map(ip).collect();
        flood(&mut budget, &newcomers, 1, true);
        assert_eq!(budget.in_flight(), MAX_HANDSHAKES - MAX_RESERVED_FOR_KNOWN);
        check_invariants(&budget);
    }

    #[test]
    fn the_share_shrinks_as_more_addresses_are_in_flight() {
        let mut budget = HandshakeBudget::new();
        let got: Vec<usize> = (1..=40)
            .map(|n| {
                (0..MAX_HANDSHAKES_PER_ADDRESS)
                    .filter(|_| budget.admit(ip(n)) == Admission::Admitted)
                    .count()
            })
            .collect();
        assert_eq!(
            &got[..8],
            &[MAX_HANDSHAKES_PER_ADDRESS; 8],
            "plenty: {got:?}"
        );
        assert!(got.windows(2).all(|w| w[0] >= w[1]), "{got:?}");
        assert!(
            got.iter().all(|&n| n >= 1),
            "every address got one: {got:?}"
        );
        assert!(got[39] < got[8], "{got:?}");
        assert_eq!(budget.in_flight(), got.iter().sum::<usize>());
        check_invariants(&budget);
    }

    #[test]
    fn a_known_address_that_proves_again_or_mid_flight_keeps_the_counts_right() {
        let mut budget = HandshakeBudget::new();
        let a = ip(1);
        budget.admit(a);
        budget.admit(a);
        budget.proved(a);
        check_invariants(&budget);
        budget.proved(a);
        budget.finished(a);
        check_invariants(&budget);
        budget.finished(a);
        budget.finished(a);
        check_invariants(&budget);
        assert_eq!(budget.in_flight(), 0);
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let who = ip(u32::try_from(seed % 40).unwrap_or(0));
            match (seed >> 8) % 4 {
                0 | 1 => {
                    budget.admit(who);
                }
                2 => budget.finished(who),
                _ => budget.proved(who),
            }
            check_invariants(&budget);
        }
    }
}
