//! What a [`RunConfig`] is when a caller says nothing else: the two facts every run must give (what to start,
//! where its evidence goes), and the loop's usual timings for the rest. The struct itself is in `supervise.rs`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hangwatch_alert::Alerter;
use hangwatch_diagnosis::{DetectorConfig, OnHang};

use crate::launch::LaunchSpec;
use crate::supervise::RunConfig;

impl RunConfig {
    /// Starts `launch` and keeps the evidence in `report_dir` (node-local, private, opened by the caller); the
    /// job is ended on a hang, its output mirrored unprefixed, no alerts, no history, no coordinator, no metrics.
    /// The timings are `hangwatch run`'s: SIGTERM -> SIGKILL after 10 s, a survivor of SIGKILL unkillable after
    /// 3 s, a tick of 200 ms, a failed rank a hang after 30 s, the fast path after 15 s.
    pub fn new(launch: LaunchSpec, report_dir: PathBuf) -> Self {
        Self {
            launch,
            detector: DetectorConfig::default(),
            on_hang: OnHang::Abort,
            grace: Duration::from_secs(10),
            kill_wait: Duration::from_secs(3),
            report_dir,
            console: Some(false),
            prefix: false,
            sink: None,
            tick: Duration::from_millis(200),
            // Shorter than `dump`'s 300 ms: by the time `run` takes a roll call the detector has seen seconds
            // without progress; the window only tells threads that spin from threads that sleep. Processes the
            // tick sampler read while the job stalled wait no window: their first sample is that one.
            window: Duration::from_millis(100),
            stack_timeout: Duration::from_secs(1),
            probe_timeout: Duration::from_secs(2),
            node: None,
            job_id: None,
            alerter: Arc::new(Alerter::none()),
            history_db: None,
            history_fleet: None,
            failed_rank_grace: Duration::from_secs(30),
            fs_stall: Duration::from_secs(15),
            coordinator: None,
            metrics: None,
            instrument: true,
            kernel_log: None,
            keep_kernel_log: false,
        }
    }
}
