//! Before the loop: the event channel and its sources (signals, the heartbeat socket in a private node-local
//! directory, the beat slots, the coordinator link), the job launched and its output drained, the sampler, the
//! detector and the policy: a [`Supervisor`] ready to run.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::heartbeat::HeartbeatSocket;
use crate::sources::SignalThread;

/// What outlives the loop until the run's very end.
pub(super) struct Wiring {
    signals: SignalThread,
    socket: HeartbeatSocket,
    runtime: tempfile::TempDir,
    /// Rank output streams not drained to their end yet.
    open_streams: Arc<AtomicU64>,
}

impl Wiring {
    /// Whether a rank's output is still being drained.
    pub(super) fn streams_open(&self) -> bool {
        self.open_streams.load(Ordering::SeqCst) > 0
    }

    /// Stops the signal thread, then removes the heartbeat socket and its private directory.
    pub(super) fn close(self) {
        self.signals.close();
        drop(self.socket);
        drop(self.runtime);
    }
}

impl Supervisor {
    /// Sets up everything the loop listens to and launches the job.
    pub(super) fn start(
        config: RunConfig,
    ) -> Result<(Supervisor, Receiver<Event>, Wiring), RunError> {
        let (tx, rx) = sync_channel::<Event>(EVENT_CAPACITY);
        let signals = install_signals(tx.clone()).map_err(RunError::Signals)?;
        // The socket lives in a private node-local directory, never in the report directory: a report directory on a
        // filesystem that froze would block its bind, and its unlink at exit (in D, hangwatch could not exit).
        let runtime = runtime_dir().map_err(|source| RunError::Socket {
            path: std::env::temp_dir(),
            source,
        })?;
        let socket_path = config
            .launch
            .beat_socket
            .clone()
            .unwrap_or_else(|| runtime.path().join("hb.sock"));
        let board = Arc::new(ProgressBoard::new());
        let members = Arc::new(JobMembers::new());
        let heartbeat = HeartbeatContext {
            events: tx.clone(),
            board: Arc::clone(&board),
            members: Arc::clone(&members),
            sink: config.sink.clone(),
        };
        let socket = crate::heartbeat::start(&socket_path, heartbeat).map_err(|source| {
            RunError::Socket {
                path: socket_path.clone(),
                source,
            }
        })?;
        let mut launch_spec = config.launch.clone();
        if launch_spec.beat_socket.is_some() {
            // The ranks of a job hangwatch did not start run as their owner: the socket is theirs to send to.
            if let Some(&first) = launch_spec.attach.first() {
                let owner = ProcFs::new("/proc").status(first).ok().and_then(|s| s.euid);
                if let Err(e) = owner.map_or(Ok(()), |uid| {
                    nix::unistd::chown(socket.path(), Some(nix::unistd::Uid::from_raw(uid)), None)
                }) {
                    tracing::warn!(error = %e, "cannot hand the heartbeat socket to the job's owner: its ranks cannot beat");
                }
            }
        }
        launch_spec.socket = Some(socket.path().to_path_buf());
        // A container client (`podman run ...`): it is told to write its container's id into the private
        // directory, where the finder reads it (crate::container).
        let container_client = (launch_spec.attach.is_empty() && launch_spec.nproc.is_none())
            .then(|| {
                crate::container::client_command(
                    &launch_spec.command,
                    &runtime.path().join("container.id"),
                )
            })
            .flatten();
        if let Some(client) = &container_client {
            launch_spec.command = client.command.clone();
        }
        // Beats without a system call: a slot per local rank in the same private directory.
        let beat_slots = crate::beats::BeatSlots::create(&runtime.path().join("beats"))
            .map_err(
                |e| tracing::warn!(error = %e, "no shared-memory beat slots: ranks beat by datagram"),
            )
            .ok();
        launch_spec.beats = beat_slots.as_ref().map(|b| b.path().to_path_buf());
        // The bootstrap in the same private node-local directory, written before the job starts (nothing of the
        // job's filesystems is touched); a job hangwatch only watches keeps the environment it has.
        if config.instrument && launch_spec.attach.is_empty() {
            launch_spec.python_bootstrap =
                crate::instrument::write_bootstrap(&runtime.path().join("python"))
                    .map_err(|e| tracing::warn!(error = %e, "no zero-code instrumentation: the bootstrap could not be written"))
                    .ok();
        }
        let mut kernel_log = KernelLog::follow();
        let procfs = hangwatch_proc::ProcFs::new("/proc");
        let attached_uids: Vec<Option<u32>> = launch_spec
            .attach
            .iter()
            .map(|&pid| procfs.status(pid).ok().and_then(|s| s.euid))
            .collect();
        kernel_log.keeping = crate::kernel_log::KernelLogKeeping::decide(
            config.kernel_log,
            config.keep_kernel_log,
            nix::unistd::geteuid().as_raw(),
            &attached_uids,
        );
        let console = config.console.map(Console::start);
        let tails = Arc::new(Tails::new(200));
        let open_streams = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let program = hangwatch_child::self_exe().unwrap_or_else(|_| PathBuf::from("hangwatch"));
        let attached = !launch_spec.attach.is_empty();
        // The reaper ends the job if hangwatch dies: never for a job hangwatch only watches.
        let reaper = (!attached)
            .then(|| {
                Reaper::start(&program)
                    .map_err(|e| {
                        tracing::warn!(error = %e, "cannot start the job reaper: if hangwatch is killed, processes of the job below its ranks may outlive it")
                    })
                    .ok()
            })
            .flatten();
        // Stack readers prepared while the job is healthy, so that a roll call reads only the stacks.
        let stack_readers = PreparedStacks::start(
            program.clone(),
            hangwatch_inspect::pystack::default_parallelism(),
        )
        .map_err(
            |e| tracing::warn!(error = %e, "no prepared stack readers: roll calls read stacks cold"),
        )
        .ok();
        let mut drains = Drains::start(DrainContext {
            board: Arc::clone(&board),
            sink: config.sink.clone(),
            console: console.clone(),
            tails: Arc::clone(&tails),
            prefix: config.prefix,
            open_streams: Arc::clone(&open_streams),
        })
        .map_err(RunError::Drains)?;
        let start = Instant::now();
        let launched = if attached {
            Vec::new()
        } else {
            launch(&launch_spec)?
        };
        for l in &launched {
            members.register_live(l.pid, l.rank);
        }
        let container = crate::container::Shared::default();
        if let (Some(client), Some(first)) = (container_client, launched.first()) {
            let runtime_name = client.runtime.as_str();
            say(format!(
                "hangwatch: the job is a {runtime_name} client: its ranks are found in the container it starts (by the id it writes to {})",
                client.cidfile.display()
            ));
            let events = tx.clone();
            let report = move |found| {
                let _ = events.send(Event::Container(found));
            };
            if let Err(e) =
                crate::container::spawn_finder(client, first.pid, container.clone(), report)
            {
                tracing::warn!(error = %e, "cannot start the thread that finds the job's container");
                say(format!("hangwatch: warning: cannot look for the job's container ({e}): only its {runtime_name} client is watched"));
            }
        }
        let tree_mode = launch_spec.nproc.is_none() || attached;
        let procfs = ProcFs::new("/proc");
        let mut procs = Vec::new();
        for Launched {
            child,
            pid,
            rank,
            stdout,
            stderr,
        } in launched
        {
            if let Some(out) = stdout {
                drains.drain(out, rank, Stream::Stdout);
            }
            if let Some(err) = stderr {
                drains.drain(err, rank, Stream::Stderr);
            }
            procs.push(JobProc {
                waited: Some(wait_in_background(child)),
                pid,
                pgid: pid,
                start: procfs.stat(pid).ok().map(|s| s.starttime),
                rank,
                // `--nproc` gives each rank its RANK.
                rank_source: rank.map(|_| RankSource::EnvRank),
                exit: None,
                exited_at: None,
                discovered: false,
                identity: crate::death::RankIdentity::read(&procfs, pid),
            });
        }
        // Every stream is added: the drain thread ends with the last one.
        drop(drains);
        // Watched, not started: no exit status to wait for (their end is seen in /proc), no output owned.
        for &pid in &launch_spec.attach {
            let stat = procfs.stat(pid).map_err(|e| RunError::Attach {
                pid,
                reason: e.to_string(),
            })?;
            members.register_live(pid, None);
            procs.push(JobProc {
                waited: None,
                pid,
                pgid: crate::sampler::group_led_by_job(
                    stat.pgrp,
                    launch_spec.attach.iter().copied(),
                ),
                start: Some(stat.starttime),
                rank: None,
                rank_source: None,
                exit: None,
                exited_at: None,
                discovered: false,
                identity: crate::death::RankIdentity::read(&procfs, pid),
            });
        }
        let prober = Prober::new()
            .map_err(|e| tracing::warn!(error = %e, "filesystem probes unavailable"))
            .ok();
        let link = match config.coordinator.clone() {
            Some(link_config) => {
                let addr = link_config.addr.clone();
                match Link::start(link_config, tx.clone()) {
                    Ok(link) => Some(link),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the coordinator link");
                        say(format!("hangwatch: error: cannot start the link to the coordinator at {addr} ({e}); this node decides alone"));
                        None
                    }
                }
            }
            None => None,
        };
        let witnesses =
            crate::death::Witnesses::of_this_node(kernel_log.clone(), Arc::clone(&tails));
        let detector = Detector::new(config.detector.clone(), Duration::ZERO);
        let policy = policy_of(&config);
        let sampler = Sampler::new(SamplerParts {
            procs,
            tree_mode,
            attached,
            prober,
            members: Arc::clone(&members),
            events: tx.clone(),
            reaper,
            stack_readers,
            node_rank: config.coordinator.as_ref().map(|c| c.node_rank),
        });
        let workers = Box::new(Threads {
            events: tx.clone(),
            program: program.clone(),
            report_dir: config.report_dir.clone(),
            container,
        });
        let sup = Supervisor {
            config,
            workers,
            sampler,
            detector,
            policy,
            start,
            kernel_log,
            tails,
            console,
            events: tx,
            board,
            members,
            last_verdict: None,
            bundle: None,
            termination: None,
            heartbeats: Arc::clone(&socket.stats),
            program,
            last_step: None,
            link,
            beat_slots,
            last_slot_look: None,
            own_events: VecDeque::new(),
            linked: false,
            ordered_observations: None,
            ordered_verdict: None,
            timeline: crate::timeline::TimelineRecorder::new(unix_time_of(start)),
            witnesses,
            collectives: Some(Arc::clone(&socket.collectives)),
            recorded: Default::default(),
            stall_log: Default::default(),
            kept_thresholds: None,
            late: None,
        };
        let wiring = Wiring {
            signals,
            socket,
            runtime,
            open_streams,
        };
        Ok((sup, rx, wiring))
    }
}
