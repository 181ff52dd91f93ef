//! One verdict for a step on several nodes: the node service of the step's first node hosts its coordinator (its
//! watcher runs `run --host-coordinator`), the others' watchers join it, and the services agree on the
//! coordinator's secret and port through MUNGE (`hangwatch_slurm::munge`), so no file has to be shared.
//!
//! The first node's service makes a step's key on first need (its own step seen, or another node asking) and
//! answers other nodes' services from a listener thread of its own; a service on another node asks in a worker
//! thread and reports back over a channel. The service's loop never waits for either.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hangwatch_agent::human::say;
use hangwatch_slurm::ids::{JobId, NodeName, StepId};
use hangwatch_slurm::munge::{self, KeyGrant, KeyRequest, Munge, SECRET_BYTES};
use hangwatch_slurm::records;
use hangwatch_slurm::steps::StepOnNode;

/// How long a service keeps asking the first node's service (which may start later, or be restarting).
const ASK_FOR: Duration = Duration::from_secs(30);
const ASK_EVERY: Duration = Duration::from_secs(2);
/// At most this many requests are answered at once: a flood of connections costs threads, not the service.
const ANSWERING_AT_MOST: usize = 32;

/// Where the services of a node's steps meet (from `hangwatch node`'s options).
#[derive(Debug, Clone)]
pub struct PeerSettings {
    /// The port other nodes' services ask this one on (and this one asks theirs on, unless `peers` says).
    pub port: u16,
    /// Where to ask a node's service, by node name, where its name and `port` would not do (several emulated
    /// nodes on one machine, a management network).
    pub peers: BTreeMap<String, String>,
    pub munge: Munge,
    /// Where token files are written for the watchers: node-local, root only.
    pub token_dir: PathBuf,
}

impl PeerSettings {
    /// Where node `node`'s service listens.
    fn address_of(&self, node: &str) -> Result<SocketAddr, String> {
        let text = self
            .peers
            .get(node)
            .cloned()
            .unwrap_or_else(|| format!("{node}:{}", self.port));
        // Name resolution may block: this runs in a worker, never in the loop.
        text.to_socket_addrs()
            .map_err(|e| format!("cannot resolve {text}: {e}"))?
            .next()
            .ok_or_else(|| format!("{text} resolves to no address"))
    }
}

/// How a step's watcher joins its coordinator (the flags of `run`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joining {
    pub coordinator: String,
    pub host: bool,
    pub nnodes: u32,
    pub node_rank: u32,
    pub token_file: PathBuf,
}

impl Joining {
    pub fn run_args(&self) -> Vec<String> {
        let mut args = vec![
            "--coordinator".to_string(),
            self.coordinator.clone(),
            "--token-file".to_string(),
            self.token_file.display().to_string(),
            "--nnodes".to_string(),
            self.nnodes.to_string(),
            "--node-rank".to_string(),
            self.node_rank.to_string(),
        ];
        if self.host {
            args.push("--host-coordinator".to_string());
        }
        args
    }
}

/// The keys of the steps whose coordinator this node hosts: made when this node's own step is found and Slurm
/// listed its nodes, given only to those nodes' services, forgotten when this node's step ends. Nothing another
/// node asks for creates one.
#[derive(Debug, Default)]
pub struct HostedKeys {
    keys: Mutex<HashMap<(String, String), Hosted>>,
}

#[derive(Debug, Clone)]
struct Hosted {
    grant: KeyGrant,
    /// The step's nodes as Slurm listed them: the only services that may have its key.
    nodes: Vec<String>,
}

/// Why a key request was not answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyRefusal {
    #[error("this node hosts no coordinator for step {0} (not its first node, not started here yet, or ended)")]
    NotHosted(String),
    #[error("Slurm does not list node {node} among step {step}'s nodes")]
    NotAmongNodes { step: String, node: String },
}

impl HostedKeys {
    /// The key of step `job.step` whose nodes Slurm lists as `nodes`: its secret (random) and its coordinator's
    /// port (free when chosen), made once.
    pub fn for_step(&self, job: &str, step: &str, nodes: &[String]) -> std::io::Result<KeyGrant> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hosted) = keys.get(&(job.to_string(), step.to_string())) {
            return Ok(hosted.grant.clone());
        }
        let mut secret = [0u8; SECRET_BYTES];
        getrandom::fill(&mut secret).map_err(std::io::Error::other)?;
        let port = TcpListener::bind(("0.0.0.0", 0))?.local_addr()?.port();
        let grant = KeyGrant {
            job: job.to_string(),
            step: step.to_string(),
            port,
            secret,
        };
        keys.insert(
            (job.to_string(), step.to_string()),
            Hosted {
                grant: grant.clone(),
                nodes: nodes.to_vec(),
            },
        );
        Ok(grant)
    }

    /// The key another node's service asked for: only an existing one, and only for a node Slurm listed.
    pub fn granted(&self, request: &KeyRequest) -> Result<KeyGrant, KeyRefusal> {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let step = format!("{}.{}", request.job, request.step);
        let hosted = keys
            .get(&(request.job.clone(), request.step.clone()))
            .ok_or_else(|| KeyRefusal::NotHosted(step.clone()))?;
        if !hosted.nodes.contains(&request.node) {
            return Err(KeyRefusal::NotAmongNodes {
                step,
                node: request.node.clone(),
            });
        }
        Ok(hosted.grant.clone())
    }

    /// Step `job.step` ended here: its key is not given out again.
    pub fn forget(&self, job: &str, step: &str) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.remove(&(job.to_string(), step.to_string()));
    }
}

/// At most this many requests from one address are answered at once: one peer cannot take every answering slot.
const ANSWERING_PER_PEER: usize = 4;

/// Answers other nodes' services on `listener`, each request in a thread of its own, until the process ends.
pub fn serve(listener: TcpListener, keys: Arc<HostedKeys>, munge: Munge) -> std::io::Result<()> {
    let answering = Arc::new(AtomicUsize::new(0));
    let per_peer: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    std::thread::Builder::new()
        .name("hw-node-keys".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let Ok(peer) = stream.peer_addr() else {
                    continue;
                };
                if !take_slot(&answering, &per_peer, peer.ip()) {
                    continue;
                }
                let (keys, munge, done, peers) = (
                    Arc::clone(&keys),
                    munge.clone(),
                    Arc::clone(&answering),
                    Arc::clone(&per_peer),
                );
                let spawned = std::thread::Builder::new()
                    .name("hw-node-key".into())
                    .spawn(move || {
                        let mut refusal = None;
                        let answered = munge::answer(stream, &munge, |r| {
                            keys.granted(r).map_err(|e| refusal = Some(e)).ok()
                        });
                        let line = match (answered, refusal) {
                            (Ok(r), None) => format!(
                                "hangwatch node: gave {}'s service the key of step {}.{}",
                                r.node, r.job, r.step
                            ),
                            (Ok(r), Some(why)) => format!(
                                "hangwatch node: refused {}'s service the key of step {}.{}: {why}",
                                r.node, r.job, r.step
                            ),
                            (Err(e), _) => format!(
                                "hangwatch node: warning: refused a key request from {peer}: {e}"
                            ),
                        };
                        say(line);
                        give_slot(&done, &peers, peer.ip());
                    });
                if spawned.is_err() {
                    give_slot(&answering, &per_peer, peer.ip());
                }
            }
        })?;
    Ok(())
}

/// Takes an answering slot for `peer` if one is free overall and for it.
fn take_slot(all: &AtomicUsize, per_peer: &Mutex<HashMap<IpAddr, usize>>, peer: IpAddr) -> bool {
    let mut counts = per_peer.lock().unwrap_or_else(|e| e.into_inner());
    let mine = counts.entry(peer).or_default();
    if *mine >= ANSWERING_PER_PEER || all.load(Ordering::SeqCst) >= ANSWERING_AT_MOST {
        return false;
    }
    *mine += 1;
    all.fetch_add(1, Ordering::SeqCst);
    true
}

fn give_slot(all: &AtomicUsize, per_peer: &Mutex<HashMap<IpAddr, usize>>, peer: IpAddr) {
    let mut counts = per_peer.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(mine) = counts.get_mut(&peer) {
        *mine = mine.saturating_sub(1);
        if *mine == 0 {
            counts.remove(&peer);
        }
    }
    all.fetch_sub(1, Ordering::SeqCst);
}

/// The token file of a step's watcher on `node`: the secret, root only (a private directory, mode 0600, no symlink
/// followed), node-local.
fn write_token(dir: &Path, grant: &KeyGrant, node: &str) -> std::io::Result<PathBuf> {
    let name = token_name(&grant.job, &grant.step, node);
    hangwatch_safefs::PrivateDir::open_or_create(dir)
        .and_then(|d| d.write(&name, grant.token().as_bytes()))
        .map_err(std::io::Error::other)
}

/// The token file's name for step `job.step`'s watcher on `node` (several emulated nodes may share the directory).
fn token_name(job: &str, step: &str, node: &str) -> String {
    format!("{job}.{step}@{node}.token")
}

/// How the first node's watcher hosts the step's coordinator.
pub fn hosting(
    step: &StepOnNode,
    nnodes: u32,
    keys: &HostedKeys,
    settings: &PeerSettings,
) -> std::io::Result<Joining> {
    let grant = keys.for_step(&step.job_id, &step.step, &step.nodes)?;
    let node = step.node.as_deref().unwrap_or("node");
    Ok(Joining {
        coordinator: format!("127.0.0.1:{}", grant.port),
        host: true,
        nnodes,
        node_rank: 0,
        token_file: write_token(&settings.token_dir, &grant, node)?,
    })
}

/// How a step that may span nodes is watched, decided in a worker that reports back (the service's loop never
/// waits): Slurm is asked for the step's nodes and owner (never the tasks' environment); on one node, it is
/// watched alone (`Ok(None)`); on its first node, this node hosts its coordinator; elsewhere, the first node's
/// service is asked for the key. `Err`: why this node decides alone.
pub fn agree_in_background<K: Send + 'static>(
    key: K,
    step: &StepOnNode,
    keys: &Arc<HostedKeys>,
    settings: &PeerSettings,
    report: Sender<(K, Result<Option<Joining>, String>)>,
) {
    let (step, keys, settings) = (step.clone(), Arc::clone(keys), settings.clone());
    let spawned = std::thread::Builder::new()
        .name("hw-node-agree".into())
        .spawn(move || {
            let result = agree(step, &keys, &settings);
            let _ = report.send((key, result));
        });
    if let Err(e) = spawned {
        say(format!(
            "hangwatch node: warning: cannot start a thread to agree on a step's coordinator: {e}"
        ));
    }
}

fn agree(
    step: StepOnNode,
    keys: &HostedKeys,
    settings: &PeerSettings,
) -> Result<Option<Joining>, String> {
    let job = JobId::parse(&step.job_id).map_err(|e| e.to_string())?;
    let step_id = StepId::parse(&step.step).map_err(|e| e.to_string())?;
    let node =
        NodeName::parse(step.node.as_deref().unwrap_or_default()).map_err(|e| e.to_string())?;
    let uid = step.uid.ok_or("the owner of its tasks is unknown")?;
    let record = records::ask_step(&job, &step_id).map_err(|e| e.to_string())?;
    records::step_runs_here(&record, uid, &node).map_err(|e| e.to_string())?;
    let step = step.with_nodes(record.nodes);
    let Some((first, node_rank)) = step.spans_nodes() else {
        return Ok(None);
    };
    let nnodes = u32::try_from(step.nodes.len()).unwrap_or(u32::MAX);
    if first == node.as_str() {
        return hosting(&step, nnodes, keys, settings)
            .map(Some)
            .map_err(|e| format!("cannot host its coordinator: {e}"));
    }
    let request = KeyRequest {
        job: job.to_string(),
        step: step_id.to_string(),
        node: node.to_string(),
    };
    let began = Instant::now();
    loop {
        let tried = settings.address_of(first).and_then(|addr| {
            munge::ask(addr, &settings.munge, &request)
                .map(|grant| (addr, grant))
                .map_err(|e| e.to_string())
        });
        match tried {
            Ok((addr, grant)) => {
                return write_token(&settings.token_dir, &grant, &request.node)
                    .map(|token_file| {
                        Some(Joining {
                            coordinator: SocketAddr::new(addr.ip(), grant.port).to_string(),
                            host: false,
                            nnodes,
                            node_rank,
                            token_file,
                        })
                    })
                    .map_err(|e| format!("cannot write the token file: {e}"));
            }
            Err(e) if began.elapsed() >= ASK_FOR => {
                return Err(format!("{first}'s service gave no key: {e}"))
            }
            Err(_) => std::thread::sleep(ASK_EVERY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_steps_key_is_made_once_and_forgotten_with_the_step() {
        let keys = HostedKeys::default();
        let nodes = ["n1".to_string(), "n2".to_string()];
        let a = keys.for_step("41", "0", &nodes).expect("key");
        assert_eq!(keys.for_step("41", "0", &nodes).expect("again"), a);
        assert_ne!(
            keys.for_step("41", "1", &nodes)
                .expect("another step")
                .secret,
            a.secret
        );
        keys.forget("41", "0");
        assert_ne!(
            keys.for_step("41", "0", &nodes).expect("anew").secret,
            a.secret
        );
    }

    #[test]
    fn a_key_goes_only_to_the_nodes_slurm_listed_and_no_request_makes_one() {
        let keys = HostedKeys::default();
        let ask = |job: &str, node: &str| KeyRequest {
            job: job.into(),
            step: "0".into(),
            node: node.into(),
        };
        assert_eq!(
            keys.granted(&ask("41", "n2")),
            Err(KeyRefusal::NotHosted("41.0".into())),
            "a request creates nothing"
        );
        assert!(keys.granted(&ask("41", "n2")).is_err(), "still nothing");
        let grant = keys
            .for_step("41", "0", &["n1".into(), "n2".into()])
            .expect("hosted");
        assert_eq!(keys.granted(&ask("41", "n2")), Ok(grant));
        assert_eq!(
            keys.granted(&ask("41", "n3")),
            Err(KeyRefusal::NotAmongNodes {
                step: "41.0".into(),
                node: "n3".into()
            })
        );
        assert!(
            keys.granted(&ask("42", "n2")).is_err(),
            "another job's step"
        );
    }

    #[test]
    fn one_peer_cannot_take_every_answering_slot() {
        let all = AtomicUsize::new(0);
        let per_peer = Mutex::new(HashMap::new());
        let (a, b): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        for _ in 0..ANSWERING_PER_PEER {
            assert!(take_slot(&all, &per_peer, a));
        }
        assert!(!take_slot(&all, &per_peer, a), "a's share is used");
        assert!(take_slot(&all, &per_peer, b), "b still gets in");
        give_slot(&all, &per_peer, a);
        assert!(take_slot(&all, &per_peer, a));
        assert_eq!(all.load(Ordering::SeqCst), ANSWERING_PER_PEER + 1);
    }

    #[test]
    fn the_host_joins_on_loopback_and_its_token_file_is_root_only() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let settings = PeerSettings {
            port: 17_830,
            peers: BTreeMap::new(),
            munge: Munge::default(),
            token_dir: tmp.path().join("tokens"),
        };
        let step = StepOnNode {
            job_id: "41".into(),
            step: "0".into(),
            node: Some("n1".into()),
            uid: None,
            slurmstepd: 1,
            tasks: vec![2],
            tasks_expected: None,
            may_span_nodes: true,
            nodes: vec!["n1".into(), "n2".into()],
            node_index: Some(0),
            ranks: Vec::new(),
            disbelieved: Vec::new(),
        };
        let joining = hosting(&step, 2, &HostedKeys::default(), &settings).expect("hosting");
        assert!(joining.host && joining.coordinator.starts_with("127.0.0.1:"));
        assert_eq!(
            joining.token_file,
            settings.token_dir.join(token_name("41", "0", "n1"))
        );
        let mode = std::fs::metadata(&joining.token_file)
            .expect("token file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let args = joining.run_args();
        assert!(args.ends_with(&["--host-coordinator".to_string()]));
        assert!(args.windows(2).any(|w| w == ["--nnodes", "2"]));
    }

    #[test]
    fn a_nodes_service_is_found_by_the_peers_table_else_by_its_name() {
        let settings = PeerSettings {
            port: 17_830,
            peers: BTreeMap::from([("n1".to_string(), "127.0.0.1:17901".to_string())]),
            munge: Munge::default(),
            token_dir: PathBuf::from("/nonexistent"),
        };
        assert_eq!(
            settings.address_of("n1"),
            Ok(SocketAddr::from(([127, 0, 0, 1], 17_901)))
        );
        assert_eq!(
            settings.address_of("localhost").map(|a| a.port()),
            Ok(17_830)
        );
        assert!(settings.address_of("no such node.invalid").is_err());
    }
}
