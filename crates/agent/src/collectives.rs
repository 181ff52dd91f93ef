//! Asking the ranks for their Flight Recorder at a roll call: where each rank's client listens, the requests, and
//! the answers that came back in time.
//!
//! A rank's client binds its socket to an abstract address; once `torch.distributed` is initialized its thread
//! says `hw1 listen collectives` from it and waits for requests (python/src/hangwatch/_flight.py).
//! The agent sends `hw1 dump-collectives <n>` from the heartbeat socket, the one address a client's connected
//! socket takes datagrams from, and the heartbeat receiver files the answers here. A roll call asks, reads /proc
//! meanwhile, then takes what arrived by its deadline: a rank whose main thread holds the GIL never answers, and is
//! never waited for past it.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use nix::sys::socket::{self, MsgFlags, UnixAddr};

use crate::wire::collectives_request;

/// The most answers kept for one request: one per rank of this node, with room.
const MAX_ANSWERS: usize = 4096;

/// Where the ranks' clients listen, and the answers to the open request.
pub struct CollectivesDesk {
    /// The heartbeat socket (a second descriptor of it): clients take datagrams from its address alone.
    socket: UnixDatagram,
    state: Mutex<DeskState>,
    answered: Condvar,
}

#[derive(Default)]
struct DeskState {
    /// By pid: the address a rank's client listens on.
    listening: HashMap<i32, UnixAddr>,
    last_request: u64,
    /// The request being answered, and the answers so far by pid.
    open: Option<u64>,
    answers: HashMap<i32, Vec<u8>>,
}

/// A request sent: its number and the processes it went to.
#[derive(Debug, Clone)]
pub struct Asked {
    pub request: u64,
    pub pids: Vec<i32>,
}

impl CollectivesDesk {
    pub fn new(socket: UnixDatagram) -> Self {
        Self {
            socket,
            state: Mutex::new(DeskState::default()),
            answered: Condvar::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, DeskState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Process `pid`'s client listens at `address` (its datagrams come from there); an unnamed address (a client
    /// that does not bind) cannot be asked.
    pub fn listening(&self, pid: i32, address: UnixAddr) {
        if address.path().is_none() && address.as_abstract().is_none() {
            return;
        }
        self.state().listening.insert(pid, address);
    }

    /// Files an answer from `pid` to `request` (a late answer to an earlier request is dropped).
    pub fn answer(&self, pid: i32, request: u64, json: Vec<u8>) {
        let mut state = self.state();
        if state.open != Some(request) || state.answers.len() >= MAX_ANSWERS {
            return;
        }
        state.answers.insert(pid, json);
        self.answered.notify_all();
    }

    /// Asks each of `pids` whose client listens for its Flight Recorder (one datagram each, never waiting: a
    /// client whose queue is full is not asked). Opens a new request; answers to an older one are dropped.
    pub fn ask(&self, pids: &[i32]) -> Asked {
        let mut state = self.state();
        state.listening.retain(|pid, _| pids.contains(pid));
        state.last_request += 1;
        let request = state.last_request;
        state.open = Some(request);
        state.answers.clear();
        let message = collectives_request(request);
        let asked = pids
            .iter()
            .copied()
            .filter(|pid| {
                state.listening.get(pid).is_some_and(|address| {
                    socket::sendto(
                        self.socket.as_raw_fd(),
                        &message,
                        address,
                        MsgFlags::MSG_DONTWAIT,
                    )
                    .map_err(|e| tracing::debug!(pid, error = %e, "could not ask a rank for its collectives"))
                    .is_ok()
                })
            })
            .collect();
        Asked {
            request,
            pids: asked,
        }
    }

    /// The answers to `asked` once every process answered, or what arrived by `deadline`; closes the request.
    pub fn collect(&self, asked: &Asked, deadline: Instant) -> HashMap<i32, Vec<u8>> {
        let mut state = self.state();
        loop {
            if state.open != Some(asked.request) {
                return HashMap::new();
            }
            if asked.pids.iter().all(|p| state.answers.contains_key(p)) {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            state = self
                .answered
                .wait_timeout(state, deadline - now)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        state.open = None;
        std::mem::take(&mut state.answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A desk on a bound socket, and a client socket bound to an abstract address and connected to it.
    fn desk_and_client(dir: &std::path::Path) -> (CollectivesDesk, UnixDatagram, UnixAddr) {
        let agent = UnixDatagram::bind(dir.join("agent.sock")).unwrap();
        let client = UnixDatagram::unbound().unwrap();
        // Linux's autobind: an empty address names the socket with an abstract address of the kernel's choosing.
        socket::bind(client.as_raw_fd(), &UnixAddr::new_unnamed()).unwrap();
        client.connect(dir.join("agent.sock")).unwrap();
        let address: UnixAddr = socket::getsockname(client.as_raw_fd()).unwrap();
        (CollectivesDesk::new(agent), client, address)
    }

    #[test]
    fn a_listening_rank_is_asked_and_its_answer_collected() {
        let dir = tempfile::tempdir().unwrap();
        let (desk, client, address) = desk_and_client(dir.path());
        desk.listening(10, address);
        let asked = desk.ask(&[10, 11]);
        // Only the rank whose client listens is asked.
        assert_eq!(asked.pids, [10]);
        let mut buf = [0u8; 64];
        let n = client.recv(&mut buf).unwrap();
        assert_eq!(
            &buf[..n],
            format!("hw1 dump-collectives {}", asked.request).as_bytes()
        );
        desk.answer(10, asked.request, b"{}".to_vec());
        let answers = desk.collect(&asked, Instant::now() + Duration::from_secs(5));
        assert_eq!(answers.get(&10).map(Vec::as_slice), Some(&b"{}"[..]));
    }

    #[test]
    fn a_rank_that_does_not_answer_is_not_waited_for_past_the_deadline_and_late_answers_are_dropped(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (desk, _client, address) = desk_and_client(dir.path());
        desk.listening(10, address);
        let asked = desk.ask(&[10]);
        let started = Instant::now();
        assert!(desk
            .collect(&asked, Instant::now() + Duration::from_millis(200))
            .is_empty());
        assert!(started.elapsed() < Duration::from_secs(5));
        // The request is closed: its late answer goes nowhere, nor does one to another request.
        desk.answer(10, asked.request, b"{}".to_vec());
        let next = desk.ask(&[10]);
        desk.answer(10, asked.request, b"{}".to_vec());
        assert!(desk
            .collect(&next, Instant::now() + Duration::from_millis(50))
            .is_empty());
    }

    #[test]
    fn a_client_without_an_address_cannot_be_asked() {
        let dir = tempfile::tempdir().unwrap();
        let (desk, _client, _) = desk_and_client(dir.path());
        desk.listening(10, UnixAddr::new_unnamed());
        assert!(desk.ask(&[10]).pids.is_empty());
    }
}
