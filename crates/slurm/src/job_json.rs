//! A Slurm job as Slurm's JSON describes it (`scontrol --json show job`, Slurm 23.02+; `squeue --json`, 21.08+)
//! and the `sbatch` options that submit it again as it was asked for. Pure: parsing and option building only;
//! `requeue.rs` runs the commands.
//!
//! The JSON's shape moved between Slurm versions: a number is plain (`30`, or `null` when unset) up to 22.05 and an
//! object (`{"set":true,"infinite":false,"number":30}`) from 23.02; `shared` is a string (`"none"`) up to 22.05 and
//! a list from 23.02, where `exclusive` and `oversubscribe` join it; per-TRES fields say `gres:gpu:8` up to 22.05
//! and `gres/gpu:8` from 23.02. Every field here takes each shape, and one that is missing is unset.

use serde::{Deserialize, Deserializer};

/// The most a 32-bit Slurm number is: `INFINITE`; one less is `NO_VAL` (unset). Older Slurm prints them plain.
const SLURM_INFINITE: i64 = 0xffff_ffff;
const SLURM_NO_VAL: i64 = 0xffff_fffe;
/// The same for 16-bit fields (sockets, cores, threads, tasks per core/socket).
const SLURM_NO_VAL16: u64 = 0xfffe;

/// The document both commands print: `{"jobs": [...], ...}`.
#[derive(Debug, Deserialize)]
struct JobsDocument {
    #[serde(default)]
    jobs: Vec<JsonJob>,
}

/// A number as any Slurm version prints it.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
enum RawNumber {
    Plain(i64),
    Object {
        #[serde(default)]
        set: bool,
        #[serde(default)]
        infinite: bool,
        #[serde(default)]
        number: i64,
    },
    /// A shape no version printed so far: unset, rather than the whole job unreadable.
    Other(serde::de::IgnoredAny),
}

/// What a Slurm number means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Number {
    Unset,
    Infinite,
    Value(i64),
}

impl Number {
    fn from_raw(raw: Option<RawNumber>) -> Self {
        match raw {
            None => Number::Unset,
            Some(RawNumber::Plain(SLURM_INFINITE)) => Number::Infinite,
            Some(RawNumber::Plain(SLURM_NO_VAL)) => Number::Unset,
            Some(RawNumber::Plain(n)) => Number::Value(n),
            Some(RawNumber::Object { set: false, .. }) => Number::Unset,
            Some(RawNumber::Object { infinite: true, .. }) => Number::Infinite,
            Some(RawNumber::Object { number, .. }) => Number::Value(number),
            Some(RawNumber::Other(_)) => Number::Unset,
        }
    }

    /// A positive value, the only kind most options take (0 means "not asked for" in Slurm's counts).
    fn positive(self) -> Option<u64> {
        match self {
            Number::Value(n) if n > 0 => u64::try_from(n).ok(),
            _ => None,
        }
    }
}

/// A flag or list of flags: a string up to 22.05, a list of strings from 23.02 (`mail_type`, `shared`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Words {
    One(String),
    Many(Vec<String>),
    Bool(bool),
    Other(serde::de::IgnoredAny),
}

impl Words {
    fn words(&self) -> Vec<String> {
        match self {
            Words::One(s) => s
                .split(',')
                .map(|w| w.trim().to_string())
                .filter(|w| !w.is_empty())
                .collect(),
            Words::Many(v) => v.iter().map(|w| w.trim().to_string()).collect(),
            Words::Bool(true) => vec!["true".into()],
            Words::Bool(false) | Words::Other(_) => Vec::new(),
        }
    }
}

/// A yes/no as any version prints it (a boolean, a number, or `"true"`).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
enum Flag {
    Bool(bool),
    Number(i64),
    Text(FlagText),
    Other(serde::de::IgnoredAny),
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum FlagText {
    True,
    False,
    Yes,
    No,
}

impl Flag {
    fn on(self) -> bool {
        matches!(
            self,
            Flag::Bool(true) | Flag::Text(FlagText::True | FlagText::Yes)
        ) || matches!(self, Flag::Number(n) if n != 0)
    }
}

/// A string field: `null`, a number or an unexpected shape read as text (or nothing), so that one odd field does
/// not make the whole job unreadable.
#[derive(Debug, Clone, Default)]
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Number(i64),
            Other(serde::de::IgnoredAny),
        }
        Ok(Text(match Raw::deserialize(d)? {
            Raw::Text(s) => s,
            Raw::Number(n) => n.to_string(),
            Raw::Other(_) => String::new(),
        }))
    }
}

impl std::ops::Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// The fields of one job that the next attempt's options come from (docs/requeue.md lists them). Anything missing
/// is unset; fields not read here are ignored.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct JsonJob {
    job_id: Option<u64>,
    name: Text,
    partition: Text,
    account: Text,
    qos: Text,
    wckey: Text,
    licenses: Text,
    features: Text,
    prefer: Text,
    cluster_features: Text,
    batch_features: Text,
    resv_name: Text,
    dependency: Text,
    excluded_nodes: Text,
    required_nodes: Text,
    comment: Text,
    container: Text,
    network: Text,
    standard_output: Text,
    standard_error: Text,
    standard_input: Text,
    current_working_directory: Text,
    mail_user: Text,
    user_name: Text,
    batch_host: Text,
    mail_type: Option<Words>,
    shared: Option<Words>,
    exclusive: Option<Words>,
    oversubscribe: Option<Flag>,
    requeue: Option<Flag>,
    contiguous: Option<Flag>,
    reboot: Option<Flag>,
    tres_per_job: Text,
    tres_per_node: Text,
    tres_per_task: Text,
    tres_per_socket: Text,
    cpus_per_tres: Text,
    memory_per_tres: Text,
    tres_bind: Text,
    tres_freq: Text,
    array_job_id: Option<RawNumber>,
    array_task_id: Option<RawNumber>,
    het_job_id: Option<RawNumber>,
    node_count: Option<RawNumber>,
    tasks: Option<RawNumber>,
    tasks_per_node: Option<RawNumber>,
    tasks_per_core: Option<RawNumber>,
    tasks_per_socket: Option<RawNumber>,
    cpus_per_task: Option<RawNumber>,
    threads_per_core: Option<RawNumber>,
    cores_per_socket: Option<RawNumber>,
    sockets_per_node: Option<RawNumber>,
    memory_per_node: Option<RawNumber>,
    memory_per_cpu: Option<RawNumber>,
    minimum_tmp_disk_per_node: Option<RawNumber>,
    time_limit: Option<RawNumber>,
    time_minimum: Option<RawNumber>,
    nice: Option<RawNumber>,
}

/// Why a JSON document gave no job.
#[derive(Debug, thiserror::Error)]
pub enum JobJsonError {
    #[error("not Slurm's job JSON: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("job {0} is not in Slurm's answer")]
    Missing(String),
}

/// One job, read from Slurm's JSON: what the next attempt is submitted like.
#[derive(Debug, Clone)]
pub struct SlurmJobJson {
    job: JsonJob,
}

impl SlurmJobJson {
    /// Job `id` out of a document of `scontrol --json show job` or `squeue --json` (which, up to 22.05, lists every
    /// job whatever it was asked for).
    pub fn parse(text: &str, id: &str) -> Result<Self, JobJsonError> {
        let doc: JobsDocument = serde_json::from_str(text)?;
        let wanted: Option<u64> = id.trim().parse().ok();
        doc.jobs
            .into_iter()
            .find(|j| j.job_id.is_some() && j.job_id == wanted)
            .map(|job| Self { job })
            .ok_or_else(|| JobJsonError::Missing(id.to_string()))
    }

    pub fn comment(&self) -> &str {
        &self.job.comment
    }

    /// The nodes this job was submitted without.
    pub fn excluded(&self) -> Vec<String> {
        crate::step::expand_hosts(&self.job.excluded_nodes)
    }

    /// Whether this Slurm's JSON has no mail settings (22.05 prints neither `mail_type` nor `mail_user`): they
    /// are then taken from `scontrol show job` ([`SlurmJobJson::with_mail`]).
    pub fn lacks_mail(&self) -> bool {
        self.job.mail_type.is_none() && self.job.mail_user.is_empty()
    }

    /// The mail settings as `scontrol show job` prints them (`MailUser=a@b MailType=END,FAIL`).
    pub fn with_mail(mut self, user: Option<&str>, types: Option<&str>) -> Self {
        if let Some(user) = user {
            self.job.mail_user = Text(user.to_string());
        }
        if let Some(types) = types {
            self.job.mail_type = Some(Words::One(types.to_string()));
        }
        self
    }

    /// A part of a heterogeneous job: only this part's options can be read, the others are lost.
    pub fn is_heterogeneous(&self) -> bool {
        Number::from_raw(self.job.het_job_id).positive().is_some()
    }

    /// The `sbatch` options that ask for what this job asked for (table in docs/requeue.md), without the nodes in
    /// `excluded` (they leave `--nodelist`; `--exclude` is the caller's). The comment, `--open-mode` and
    /// `--exclude` are the caller's.
    pub fn options(&self, excluded: &[String]) -> Vec<String> {
        let j = &self.job;
        let mut out = Vec::new();
        let mut text = |flag: &str, value: &str| {
            let value = value.trim();
            if !value.is_empty() && value != "(null)" {
                out.push(format!("{flag}={value}"));
            }
        };
        text("--job-name", &j.name);
        text("--partition", &j.partition);
        text("--account", &j.account);
        text("--qos", &j.qos);
        text("--wckey", &j.wckey);
        text("--licenses", &j.licenses);
        text("--constraint", &j.features);
        text("--prefer", &j.prefer);
        text("--cluster-constraint", &j.cluster_features);
        text("--batch", &j.batch_features);
        text("--reservation", &j.resv_name);
        text("--dependency", &pending_dependencies(&j.dependency));
        text("--container", &j.container);
        text("--network", &j.network);
        text("--chdir", &j.current_working_directory);
        text("--output", &self.output_file(&j.standard_output, true));
        text("--error", &self.output_file(&j.standard_error, false));
        if &*j.standard_input != "/dev/null" {
            text("--input", &j.standard_input);
        }
        text("--mail-user", &j.mail_user);
        let mail: Vec<String> = j.mail_type.as_ref().map(Words::words).unwrap_or_default();
        let mail: Vec<String> = mail.into_iter().filter(|m| m != "NONE").collect();
        text("--mail-type", &mail.join(","));
        let required: Vec<String> = crate::step::expand_hosts(&j.required_nodes)
            .into_iter()
            .filter(|n| !excluded.contains(n))
            .collect();
        text("--nodelist", &required.join(","));
        text("--gres", &gres_list(&j.tres_per_node).join(","));
        text("--gpus", &gpu_value(&j.tres_per_job).unwrap_or_default());
        text(
            "--gpus-per-task",
            &gpu_value(&j.tres_per_task).unwrap_or_default(),
        );
        text(
            "--gpus-per-socket",
            &gpu_value(&j.tres_per_socket).unwrap_or_default(),
        );
        text(
            "--cpus-per-gpu",
            &gpu_value(&j.cpus_per_tres).unwrap_or_default(),
        );
        if let Some(mb) = gpu_value(&j.memory_per_tres) {
            text("--mem-per-gpu", &format!("{mb}M"));
        }
        text("--gpu-bind", &gpu_value(&j.tres_bind).unwrap_or_default());
        text("--gpu-freq", &gpu_value(&j.tres_freq).unwrap_or_default());

        let mut count = |flag: &str, raw: Option<RawNumber>, limit: u64| {
            if let Some(n) = Number::from_raw(raw).positive().filter(|n| *n < limit) {
                out.push(format!("{flag}={n}"));
            }
        };
        count("--nodes", j.node_count, u64::MAX);
        count("--ntasks", j.tasks, u64::MAX);
        count("--ntasks-per-node", j.tasks_per_node, u64::MAX);
        count("--ntasks-per-core", j.tasks_per_core, SLURM_NO_VAL16);
        count("--ntasks-per-socket", j.tasks_per_socket, SLURM_NO_VAL16);
        count("--cpus-per-task", j.cpus_per_task, SLURM_NO_VAL16);
        count("--threads-per-core", j.threads_per_core, SLURM_NO_VAL16);
        count("--cores-per-socket", j.cores_per_socket, SLURM_NO_VAL16);
        count("--sockets-per-node", j.sockets_per_node, SLURM_NO_VAL16);
        // Minutes; an unlimited job asked for no limit (the partition's applies again).
        count("--time", j.time_limit, u64::MAX);
        count("--time-min", j.time_minimum, u64::MAX);
        if let (Number::Value(task), Some(_)) = (
            Number::from_raw(j.array_task_id),
            Number::from_raw(j.array_job_id).positive(),
        ) {
            // Only the task that hung runs again, with its own index (SLURM_ARRAY_TASK_ID), not the whole array.
            out.push(format!("--array={task}"));
        }
        // Megabytes; 0 ("all of the node's memory") is also what some versions print for "not asked", so it is
        // left to the script's #SBATCH lines.
        if let Some(mb) = Number::from_raw(j.memory_per_node).positive() {
            out.push(format!("--mem={mb}M"));
        }
        if let Some(mb) = Number::from_raw(j.memory_per_cpu).positive() {
            out.push(format!("--mem-per-cpu={mb}M"));
        }
        if let Some(mb) = Number::from_raw(j.minimum_tmp_disk_per_node).positive() {
            out.push(format!("--tmp={mb}M"));
        }
        if let Number::Value(n) = Number::from_raw(j.nice) {
            if n != 0 {
                out.push(format!("--nice={n}"));
            }
        }
        out.extend(sharing(j));
        let on = |f: Option<Flag>| f.is_some_and(Flag::on);
        if on(j.contiguous) {
            out.push("--contiguous".into());
        }
        if on(j.reboot) {
            out.push("--reboot".into());
        }
        match j.requeue {
            Some(Flag::Other(_)) | None => {}
            Some(f) if f.on() => out.push("--requeue".into()),
            // Asked not to be requeued: the next attempt asks the same, whatever the cluster's default.
            Some(_) => out.push("--no-requeue".into()),
        }
        out
    }
}

impl SlurmJobJson {
    /// The file this job writes its output (or error) to, as a path the next attempt can append to: Slurm's
    /// JSON gives the pattern as asked (`o-%j.out`, empty for the default `slurm-%j.out`), and the next attempt has
    /// another job id, so the pattern is filled in with this job's values. An empty error file stays empty (it is
    /// the output file).
    fn output_file(&self, pattern: &str, is_output: bool) -> String {
        let j = &self.job;
        let array = Number::from_raw(j.array_job_id).positive().is_some();
        let pattern = match pattern.trim() {
            // No directory to put Slurm's default in: Slurm's default it is.
            "" if !is_output || j.current_working_directory.is_empty() => return String::new(),
            "" if array => "slurm-%A_%a.out",
            "" => "slurm-%j.out",
            p => p,
        };
        let number = |raw: Option<RawNumber>| match Number::from_raw(raw) {
            Number::Value(n) => n.to_string(),
            _ => String::new(),
        };
        let job_id = j.job_id.map(|n| n.to_string()).unwrap_or_default();
        let array_job = if array {
            number(j.array_job_id)
        } else {
            job_id.clone()
        };
        let task = if array {
            number(j.array_task_id)
        } else {
            "4294967294".to_string()
        };
        let node = j
            .batch_host
            .split('.')
            .next()
            .unwrap_or_default()
            .to_string();
        let mut out = String::new();
        let mut chars = pattern.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let mut width = String::new();
            while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                width.push(*d);
                chars.next();
            }
            let value = match chars.next() {
                Some('%') => "%".to_string(),
                Some('A') => array_job.clone(),
                Some('a') => task.clone(),
                Some('j' | 'J') => job_id.clone(),
                Some('x') => j.name.to_string(),
                Some('u') => j.user_name.to_string(),
                Some('N') => node.clone(),
                Some('n' | 't') => "0".to_string(),
                Some('s') => "batch".to_string(),
                Some(other) => format!("%{width}{other}"),
                None => "%".to_string(),
            };
            let width: usize = width.parse().unwrap_or(0);
            out.push_str(&format!("{value:0>width$}"));
        }
        if out.starts_with('/') || j.current_working_directory.is_empty() {
            out
        } else {
            format!(
                "{}/{out}",
                j.current_working_directory.trim_end_matches('/')
            )
        }
    }
}

/// `--exclusive[=user|mcs]` or `--oversubscribe`, from `shared` (a string up to 22.05: `none` is exclusive) or
/// `shared`/`exclusive`/`oversubscribe` (from 23.02).
fn sharing(j: &JsonJob) -> Option<String> {
    let mut words: Vec<String> = Vec::new();
    for w in [&j.shared, &j.exclusive].into_iter().flatten() {
        words.extend(w.words().into_iter().map(|s| s.to_ascii_lowercase()));
    }
    let has = |w: &str| words.iter().any(|x| x == w);
    if has("user") {
        Some("--exclusive=user".into())
    } else if has("mcs") {
        Some("--exclusive=mcs".into())
    } else if has("topo") {
        Some("--exclusive=topo".into())
    } else if has("none") || has("true") || has("exclusive") {
        Some("--exclusive".into())
    } else if has("oversubscribe") || has("yes") || j.oversubscribe.is_some_and(Flag::on) {
        Some("--oversubscribe".into())
    } else {
        None
    }
}

/// The dependencies still to wait for, without Slurm's status notes (`afterok:12(unfulfilled)`): those already
/// met are gone from the list by the time a job runs.
fn pending_dependencies(dependency: &str) -> String {
    let mut out = String::new();
    let mut skip = false;
    for c in dependency.trim().chars() {
        match c {
            '(' => skip = true,
            ')' => skip = false,
            _ if !skip => out.push(c),
            _ => {}
        }
    }
    if out == "(null)" {
        String::new()
    } else {
        out
    }
}

/// The entries of a per-TRES field without their `gres:`/`gres/` prefix: `gres:gpu:8,gres/shard:2` ->
/// `gpu:8 shard:2`.
fn gres_list(field: &str) -> Vec<String> {
    field
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty() && *e != "(null)")
        .map(|e| {
            e.strip_prefix("gres:")
                .or_else(|| e.strip_prefix("gres/"))
                .unwrap_or(e)
                .to_string()
        })
        .collect()
}

/// The GPU entry's value of a per-TRES field, as the `--gpus*` options take it: `gres:gpu:a100:2` -> `a100:2`,
/// `gres/gpu:4` -> `4`.
fn gpu_value(field: &str) -> Option<String> {
    gres_list(field)
        .into_iter()
        .find_map(|e| e.strip_prefix("gpu:").map(str::to_string))
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `squeue --json` recorded on the test cluster (Slurm 22.05.8; origin in `tests/fixtures/README.md`):
    /// job 5 is task 3 of array job 4, submitted with `-J "train job" --array=3,5 -N1 --ntasks-per-node=1
    /// --exclusive --constraint='fast&ib' --mem-per-cpu=100M --reservation=hwres --time=00:30:00 --requeue
    /// --nice=5 --exclude=n3 --comment='my run' -o /tmp/rqj/a-%A_%a.out`; the document lists every job.
    const SQUEUE_22_05: &str = include_str!("../tests/fixtures/squeue-json-slurm-22.05.8.json");

    /// The same job as Slurm 23.02+ prints it: numbers as objects, `shared` as a list, `exclusive`, `mail_type` as
    /// a list, `gres/` TRES. Written after the data_parser's shape (no 23.02 cluster here), with GPUs added.
    const SCONTROL_23: &str = include_str!("../tests/fixtures/scontrol-json-slurm-23-shape.json");

    #[test]
    fn a_recorded_22_05_job_keeps_every_option_it_was_submitted_with() {
        let job = SlurmJobJson::parse(SQUEUE_22_05, "5").expect("job 5 in the recording");
        assert_eq!(job.comment(), "my run");
        assert_eq!(job.excluded(), vec!["n3"]);
        assert!(!job.is_heterogeneous());
        assert_eq!(
            job.options(&[]),
            [
                "--job-name=train job",
                "--partition=debug",
                "--constraint=fast&ib",
                "--reservation=hwres",
                "--chdir=/tmp/rqj",
                "--output=/tmp/rqj/a-4_3.out",
                "--nodes=1",
                "--ntasks=1",
                "--ntasks-per-node=1",
                "--time=30",
                "--array=3",
                "--mem-per-cpu=100M",
                "--nice=5",
                "--exclusive",
                "--requeue",
            ]
        );
    }

    #[test]
    fn recorded_gpu_requests_are_kept() {
        let json = include_str!("../tests/fixtures/squeue-json-slurm-22.05.8-gpus.json");
        let per_node = SlurmJobJson::parse(json, "1").expect("job 1").options(&[]);
        assert!(per_node.iter().any(|o| o == "--gres=gpu:2"), "{per_node:?}");
        let per_job = SlurmJobJson::parse(json, "2").expect("job 2").options(&[]);
        for expected in [
            "--gpus=1",
            "--gpus-per-task=1",
            "--cpus-per-gpu=1",
            "--mem-per-gpu=100M",
        ] {
            assert!(
                per_job.iter().any(|o| o == expected),
                "{expected} not in {per_job:?}"
            );
        }
    }

    #[test]
    fn the_newer_shape_with_objects_lists_and_gpus_gives_the_same_options() {
        let job = SlurmJobJson::parse(SCONTROL_23, "5").expect("job 5");
        let options = job.options(&["n2".to_string()]);
        for expected in [
            "--job-name=train job",
            "--constraint=fast&ib",
            "--reservation=hwres",
            "--dependency=afterok:3",
            "--mail-user=a@b",
            "--mail-type=END,FAIL",
            "--nodelist=n1",
            "--gres=gpu:8",
            "--gpus=a100:16",
            "--gpus-per-task=1",
            "--cpus-per-gpu=4",
            "--mem-per-gpu=20000M",
            "--nodes=2",
            "--ntasks-per-node=8",
            "--cpus-per-task=4",
            "--time=30",
            "--array=3",
            "--mem-per-cpu=100M",
            "--exclusive",
            "--requeue",
        ] {
            assert!(
                options.iter().any(|o| o == expected),
                "{expected} not in {options:#?}"
            );
        }
        assert!(
            !options
                .iter()
                .any(|o| o.starts_with("--time-min") || o.starts_with("--mem=")),
            "unset numbers ({{\"set\": false}}) make no option: {options:#?}"
        );
    }

    #[test]
    fn numbers_in_every_shape() {
        let n = |json: &str| Number::from_raw(serde_json::from_str(json).expect("number"));
        assert_eq!(n("30"), Number::Value(30));
        assert_eq!(n("null"), Number::Unset);
        assert_eq!(n("4294967294"), Number::Unset);
        assert_eq!(n("4294967295"), Number::Infinite);
        assert_eq!(
            n(r#"{"set":true,"infinite":false,"number":30}"#),
            Number::Value(30)
        );
        assert_eq!(
            n(r#"{"set":false,"infinite":false,"number":0}"#),
            Number::Unset
        );
        assert_eq!(
            n(r#"{"set":true,"infinite":true,"number":0}"#),
            Number::Infinite
        );
    }

    #[test]
    fn sharing_in_every_shape() {
        let with = |json: &str| {
            let job: JsonJob = serde_json::from_str(json).expect("job");
            sharing(&job)
        };
        assert_eq!(with(r#"{"shared":"none"}"#).as_deref(), Some("--exclusive"));
        assert_eq!(
            with(r#"{"shared":"user"}"#).as_deref(),
            Some("--exclusive=user")
        );
        assert_eq!(with(r#"{"shared":null}"#), None);
        assert_eq!(
            with(r#"{"shared":[],"exclusive":["true"]}"#).as_deref(),
            Some("--exclusive")
        );
        assert_eq!(
            with(r#"{"shared":["oversubscribe"]}"#).as_deref(),
            Some("--oversubscribe")
        );
        assert_eq!(
            with(r#"{"shared":[],"exclusive":[],"oversubscribe":true}"#).as_deref(),
            Some("--oversubscribe")
        );
        assert_eq!(with(r#"{"shared":[],"exclusive":false}"#), None);
    }

    #[test]
    fn dependencies_lose_their_status_notes_and_gpus_their_prefix() {
        assert_eq!(
            pending_dependencies("afterok:12(unfulfilled),afterany:13(unfulfilled)"),
            "afterok:12,afterany:13"
        );
        assert_eq!(pending_dependencies("singleton(unfulfilled)"), "singleton");
        assert_eq!(pending_dependencies(""), "");
        assert_eq!(gres_list("gres:gpu:8,gres/shard:2"), ["gpu:8", "shard:2"]);
        assert_eq!(gpu_value("gres/gpu:a100:2").as_deref(), Some("a100:2"));
        assert_eq!(gpu_value("gres:shard:2"), None);
    }

    #[test]
    fn nulls_and_shapes_never_seen_make_a_field_unset_not_the_job_unreadable() {
        let text = r#"{"jobs":[{"job_id":9,"name":null,"partition":"gpu","comment":{"job":"x"},
            "features":["a"],"time_limit":"soon","requeue":{"x":1},"shared":{"y":2},"nice":null,
            "tasks":7}]}"#;
        let job = SlurmJobJson::parse(text, "9").expect("job 9");
        assert_eq!(job.options(&[]), ["--partition=gpu", "--ntasks=7"]);
        assert_eq!(job.comment(), "");
    }

    #[test]
    fn output_patterns_name_this_jobs_files_so_the_next_attempt_appends_to_them() {
        let job = |json: &str| SlurmJobJson::parse(json, "12").expect("job 12");
        let output = |json: &str| {
            job(json)
                .options(&[])
                .into_iter()
                .filter(|o| o.starts_with("--output=") || o.starts_with("--error="))
                .collect::<Vec<_>>()
        };
        // Slurm's default (an empty field), as scontrol show job prints it.
        assert_eq!(
            output(
                r#"{"jobs":[{"job_id":12,"current_working_directory":"/home/u","standard_output":""}]}"#
            ),
            ["--output=/home/u/slurm-12.out"]
        );
        assert_eq!(
            output(
                r#"{"jobs":[{"job_id":12,"array_job_id":10,"array_task_id":2,
                    "current_working_directory":"/home/u/","standard_output":""}]}"#
            ),
            ["--output=/home/u/slurm-10_2.out"]
        );
        assert_eq!(
            output(
                r#"{"jobs":[{"job_id":12,"name":"train","user_name":"ann","batch_host":"n4.cluster",
                    "current_working_directory":"/w","standard_output":"logs/%x-%j-%u-%N-%5j-%%.out",
                    "standard_error":"/e/%j.err"}]}"#
            ),
            [
                "--output=/w/logs/train-12-ann-n4-00012-%.out",
                "--error=/e/12.err"
            ]
        );
    }

    #[test]
    fn mail_settings_missing_from_22_05s_json_come_from_the_text() {
        let job = SlurmJobJson::parse(SQUEUE_22_05, "5").expect("job 5");
        assert!(job.lacks_mail());
        let options = job.with_mail(Some("a@b"), Some("END,FAIL")).options(&[]);
        assert!(
            options.iter().any(|o| o == "--mail-user=a@b"),
            "{options:?}"
        );
        assert!(
            options.iter().any(|o| o == "--mail-type=END,FAIL"),
            "{options:?}"
        );
        assert!(!SlurmJobJson::parse(SCONTROL_23, "5")
            .expect("job 5")
            .lacks_mail());
    }

    #[test]
    fn a_job_not_in_the_answer_or_not_json_is_an_error() {
        assert!(matches!(
            SlurmJobJson::parse(SQUEUE_22_05, "99"),
            Err(JobJsonError::Missing(_))
        ));
        assert!(matches!(
            SlurmJobJson::parse("scontrol: error", "5"),
            Err(JobJsonError::Parse(_))
        ));
        // A required node that is now excluded leaves the node list.
        let job: JsonJob =
            serde_json::from_str(r#"{"job_id":1,"required_nodes":"n[1-2]"}"#).expect("job");
        let options = SlurmJobJson { job }.options(&["n2".to_string()]);
        assert_eq!(options, ["--nodelist=n1"]);
    }
}
