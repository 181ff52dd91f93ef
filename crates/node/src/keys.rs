//! One verdict for a step on several nodes: the node service of the step's first node hosts its coordinator (its
//! watcher runs `run --host-coordinator`), the others' watchers join it, and the services agree on the
//! coordinator's secret and port through MUNGE (`hangwatch_slurm::munge`), so no file has to be shared.
//!
//! The first node's service makes a step's key on first need (its own step seen, or another node asking) and
//! answers other nodes' services from a listener thread of its own; a service on another node asks in a worker
//! thread and reports back over a channel. The service's loop never waits for either.

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hangwatch_agent::human::say;
use hangwatch_slurm::munge::{self, KeyGrant, KeyRequest, Munge, SECRET_BYTES};
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

/// The keys of the steps whose coordinator this node hosts, made on first need.
#[derive(Debug, Default)]
pub struct HostedKeys {
    keys: Mutex<HashMap<(String, String), KeyGrant>>,
}

impl HostedKeys {
    /// The key of step `job.step`: its secret (random) and its coordinator's port (free when chosen).
    pub fn for_step(&self, job: &str, step: &str) -> std::io::Result<KeyGrant> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(grant) = keys.get(&(job.to_string(), step.to_string())) {
            return Ok(grant.clone());
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
        keys.insert((job.to_string(), step.to_string()), grant.clone());
        Ok(grant)
    }

    /// Step `job.step` ended here: its key is not given out again.
    pub fn forget(&self, job: &str, step: &str) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.remove(&(job.to_string(), step.to_string()));
    }
}

/// Answers other nodes' services on `listener`, each request in a thread of its own, until the process ends.
pub fn serve(listener: TcpListener, keys: Arc<HostedKeys>, munge: Munge) -> std::io::Result<()> {
    let answering = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("hw-node-keys".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if answering.fetch_add(1, Ordering::SeqCst) >= ANSWERING_AT_MOST {
                    answering.fetch_sub(1, Ordering::SeqCst);
                    continue;
                }
                let (keys, munge, done) =
                    (Arc::clone(&keys), munge.clone(), Arc::clone(&answering));
                let peer = stream.peer_addr().ok();
                let spawned = std::thread::Builder::new()
                    .name("hw-node-key".into())
                    .spawn(move || {
                        let answered =
                            munge::answer(stream, &munge, |r| keys.for_step(&r.job, &r.step).ok());
                        let line = match answered {
                            Ok(r) => format!(
                                "hangwatch node: gave {}'s service the key of step {}.{}",
                                r.node, r.job, r.step
                            ),
                            Err(e) => format!(
                                "hangwatch node: warning: refused a key request from {}: {e}",
                                peer.map_or("?".into(), |p| p.to_string())
                            ),
                        };
                        say(line);
                        done.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    answering.fetch_sub(1, Ordering::SeqCst);
                }
            }
        })?;
    Ok(())
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
    let grant = keys.for_step(&step.job_id, &step.step)?;
    let node = step.node.as_deref().unwrap_or("node");
    Ok(Joining {
        coordinator: format!("127.0.0.1:{}", grant.port),
        host: true,
        nnodes,
        node_rank: 0,
        token_file: write_token(&settings.token_dir, &grant, node)?,
    })
}

/// Asks the first node's service for the step's key, in a worker, and sends back how this node's watcher joins
/// (or why it cannot: then this node decides alone).
pub fn ask_in_background<K: Send + 'static>(
    key: K,
    step: &StepOnNode,
    first: &str,
    node_rank: u32,
    settings: &PeerSettings,
    report: Sender<(K, Result<Joining, String>)>,
) {
    let request = KeyRequest {
        job: step.job_id.clone(),
        step: step.step.clone(),
        node: step.node.clone().unwrap_or_default(),
    };
    let nnodes = u32::try_from(step.nodes.len()).unwrap_or(u32::MAX);
    let (first, settings) = (first.to_string(), settings.clone());
    let spawned = std::thread::Builder::new()
        .name("hw-node-ask".into())
        .spawn(move || {
            let began = Instant::now();
            let result = loop {
                let tried = settings.address_of(&first).and_then(|addr| {
                    munge::ask(addr, &settings.munge, &request)
                        .map(|grant| (addr, grant))
                        .map_err(|e| e.to_string())
                });
                match tried {
                    Ok((addr, grant)) => {
                        break write_token(&settings.token_dir, &grant, &request.node)
                            .map(|token_file| Joining {
                                coordinator: SocketAddr::new(addr.ip(), grant.port).to_string(),
                                host: false,
                                nnodes,
                                node_rank,
                                token_file,
                            })
                            .map_err(|e| format!("cannot write the token file: {e}"));
                    }
                    Err(e) if began.elapsed() >= ASK_FOR => {
                        break Err(format!("{first}'s service gave no key: {e}"))
                    }
                    Err(_) => std::thread::sleep(ASK_EVERY),
                }
            };
            let _ = report.send((key, result));
        });
    if let Err(e) = spawned {
        say(format!(
            "hangwatch node: warning: cannot start a thread to ask for a key: {e}"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_steps_key_is_made_once_and_forgotten_with_the_step() {
        let keys = HostedKeys::default();
        let a = keys.for_step("41", "0").expect("key");
        assert_eq!(keys.for_step("41", "0").expect("again"), a);
        assert_ne!(
            keys.for_step("41", "1").expect("another step").secret,
            a.secret
        );
        keys.forget("41", "0");
        assert_ne!(keys.for_step("41", "0").expect("anew").secret, a.secret);
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
            nodes: vec!["n1".into(), "n2".into()],
            node_index: Some(0),
            ranks: Vec::new(),
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
