//! A rank's record of its collectives, as PyTorch's Flight Recorder keeps it: per process group, how far the rank
//! got and its last collectives. Read from the recorder's JSON dump (`_dump_fr_trace_json`); what the missing-rank
//! analysis in `hangwatch-diagnosis` works from, and what it finds (the verdict's `collectives`).
//!
//! Only what the analysis needs is kept. The dump's `pg_config` is not: PyTorch 2.15 keys it by an empty name and
//! keeps only the last group made, so a group's members are the ranks that report it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ranks_words;

/// One rank's Flight Recorder, reduced to what the analysis reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectiveRecord {
    /// The global rank whose recorder this is.
    pub rank: u32,
    /// Its process groups, by name (`"0"` is the default group).
    pub groups: Vec<GroupRecord>,
}

/// One process group as one rank saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// PyTorch's name of the group (`"0"`, `"1"`, ...).
    pub name: String,
    /// The sequence number of the last collective the rank issued in this group.
    pub last_enqueued: Option<u64>,
    /// The last one it saw start (NCCL); gloo does not say.
    pub last_started: Option<u64>,
    /// The last one it saw complete. gloo finds completions late: a rank past a barrier may still say an earlier
    /// number, so the analysis leans on `last_enqueued`.
    pub last_completed: Option<u64>,
    /// Its last collectives in this group, oldest first.
    pub entries: Vec<CollectiveEntry>,
}

/// One collective a rank issued.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectiveEntry {
    /// Its sequence number in its group: the n-th collective of the group on every rank.
    pub seq: u64,
    /// `all_reduce`, `barrier`, `all_gather`, ... (the backend's prefix taken off).
    pub op: String,
    /// `gloo`, `nccl`, ...
    pub backend: Option<String>,
    pub input_sizes: Vec<Vec<u64>>,
    /// PyTorch's type names as the recorder writes them (`Float`, `BFloat16`).
    pub input_dtypes: Vec<String>,
    pub state: CollectiveState,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveState {
    #[default]
    Scheduled,
    Started,
    Completed,
}

impl CollectiveEntry {
    /// `[20000] float32`, `[3, 4] bfloat16`; several inputs separated by `; `, none as `no tensors`.
    pub fn shape_text(&self) -> String {
        if self.input_sizes.is_empty() {
            return "no tensors".into();
        }
        self.input_sizes
            .iter()
            .enumerate()
            .map(|(i, size)| {
                let dims: Vec<String> = size.iter().map(u64::to_string).collect();
                let dtype = self.input_dtypes.get(i).map(|d| dtype_name(d));
                match dtype {
                    Some(d) => format!("[{}] {d}", dims.join(", ")),
                    None => format!("[{}]", dims.join(", ")),
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// torch's name for the recorder's (c10's) scalar type name, where they differ.
fn dtype_name(c10: &str) -> &str {
    match c10 {
        "Float" => "float32",
        "Double" => "float64",
        "Half" => "float16",
        "BFloat16" => "bfloat16",
        "Long" => "int64",
        "Int" => "int32",
        "Short" => "int16",
        "Char" => "int8",
        "Byte" => "uint8",
        "Bool" => "bool",
        other => other,
    }
}

/// What the records of one roll call say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectiveAnalysis {
    pub findings: Vec<CollectiveFinding>,
    /// Ranks asked for their record that gave none (busy holding the GIL, in D, not using torch.distributed):
    /// what they last issued is unknown, and no finding accuses or clears them.
    pub unanswered: Vec<u32>,
}

/// A collective as the analysis names it: its group, number, kind and inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectiveCall {
    /// The process group's name (`"0"` is the default group).
    pub group: String,
    pub seq: u64,
    /// `all_reduce`, `barrier`, ...; `None` where no record kept that collective.
    pub op: Option<String>,
    /// `[20000] float32`, as [`CollectiveEntry::shape_text`] writes it.
    pub shape: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CollectiveFinding {
    /// `missing` never issued `call`; `waiting` did and wait in it.
    NeverJoined {
        call: CollectiveCall,
        missing: Vec<u32>,
        waiting: Vec<u32>,
    },
    /// At `usual.seq`, `odd` issued `odd_call` where `usual_ranks` issued `usual`.
    Mismatch {
        usual: CollectiveCall,
        usual_ranks: Vec<u32>,
        odd_call: CollectiveCall,
        odd: Vec<u32>,
    },
    /// Every rank that answered issued `call`; it has not completed on `not_completed`.
    AllIn {
        call: CollectiveCall,
        ranks: Vec<u32>,
        not_completed: Vec<u32>,
    },
}

impl CollectiveFinding {
    /// The ranks this finding points at: those that never joined or entered something else. None for "all in".
    pub fn culprits(&self) -> &[u32] {
        match self {
            CollectiveFinding::NeverJoined { missing, .. } => missing,
            CollectiveFinding::Mismatch { odd, .. } => odd,
            CollectiveFinding::AllIn { .. } => &[],
        }
    }

    /// One sentence: "rank 3 never joined all_reduce #1234 of process group 0 (`[20000]` float32); ranks 0-2, 4-7
    /// wait in it".
    pub fn sentence(&self) -> String {
        match self {
            CollectiveFinding::NeverJoined {
                call,
                missing,
                waiting,
            } => format!(
                "{} never joined {}; {} {} in it",
                ranks_words(missing),
                call_text(call, true),
                ranks_words(waiting),
                if waiting.len() == 1 { "waits" } else { "wait" }
            ),
            CollectiveFinding::Mismatch {
                usual,
                usual_ranks,
                odd_call,
                odd,
            } => format!(
                "{} entered {} where {} entered {}",
                ranks_words(odd),
                call_text(odd_call, true),
                ranks_words(usual_ranks),
                call_text(usual, false)
            ),
            CollectiveFinding::AllIn {
                call,
                ranks,
                not_completed,
            } => format!(
                "{} issued {}; it has not completed on {}",
                ranks_words(ranks),
                call_text(call, true),
                ranks_words(not_completed)
            ),
        }
    }
}

/// `all_reduce #1234 of process group 0 ([20000] float32)`; the group left out where the sentence named it.
fn call_text(call: &CollectiveCall, with_group: bool) -> String {
    let mut text = format!(
        "{} #{}",
        call.op.as_deref().unwrap_or("collective"),
        call.seq
    );
    if with_group {
        text.push_str(&format!(" of process group {}", call.group));
    }
    if let Some(shape) = &call.shape {
        text.push_str(&format!(" ({shape})"));
    }
    text
}

/// The Flight Recorder dump could not be read.
#[derive(Debug, thiserror::Error)]
#[error("not a Flight Recorder dump: {0}")]
pub struct FlightRecorderError(String);

/// The parts of the recorder's JSON dump that are read (PyTorch 2.x, dump version `2.x`).
#[derive(Deserialize)]
struct Dump {
    #[serde(default)]
    entries: Vec<DumpEntry>,
    #[serde(default)]
    pg_status: BTreeMap<String, DumpStatus>,
}

#[derive(Deserialize)]
struct DumpEntry {
    collective_seq_id: u64,
    #[serde(default)]
    is_p2p: bool,
    /// `[name, description]`.
    #[serde(default)]
    process_group: Vec<String>,
    #[serde(default)]
    profiling_name: String,
    #[serde(default)]
    input_sizes: Vec<Vec<u64>>,
    #[serde(default)]
    input_dtypes: Vec<String>,
    #[serde(default)]
    state: String,
}

/// The recorder's JSON writes these numbers as strings, its pickle as integers; `-1` for none.
#[derive(Deserialize)]
struct DumpStatus {
    #[serde(default)]
    last_enqueued_collective: Option<SequenceNumber>,
    #[serde(default)]
    last_started_collective: Option<SequenceNumber>,
    #[serde(default)]
    last_completed_collective: Option<SequenceNumber>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SequenceNumber {
    Number(i64),
    Text(String),
}

fn sequence_number(number: Option<&SequenceNumber>) -> Option<u64> {
    let n = match number? {
        SequenceNumber::Number(n) => *n,
        SequenceNumber::Text(text) => text.trim().parse::<i64>().ok()?,
    };
    u64::try_from(n).ok()
}

/// At most this many bytes of a dump file are decoded (a job's own file could be anything).
pub const MAX_FLIGHT_RECORDER_DUMP_BYTES: usize = 64 << 20;

impl CollectiveRecord {
    /// Reads rank `rank`'s dump (`torch._C._distributed_c10d._dump_fr_trace_json()`). Point-to-point operations
    /// are left out: they are numbered apart and pair two ranks, not a group. The last `keep` collectives of each
    /// group are kept.
    pub fn from_flight_recorder_json(
        rank: u32,
        json: &[u8],
        keep: usize,
    ) -> Result<CollectiveRecord, FlightRecorderError> {
        let dump: Dump =
            serde_json::from_slice(json).map_err(|e| FlightRecorderError(e.to_string()))?;
        Ok(Self::from_dump(rank, dump, keep))
    }

    /// Reads a dump the job wrote itself (`<TORCH_FR_DUMP_TEMP_FILE><rank>`, written by torch after its own
    /// collective timeout): the same content as [`CollectiveRecord::from_flight_recorder_json`], pickled. Only
    /// plain values are decoded (a pickle naming a class or a function is refused, never run).
    pub fn from_flight_recorder_pickle(
        rank: u32,
        pickle: &[u8],
        keep: usize,
    ) -> Result<CollectiveRecord, FlightRecorderError> {
        if pickle.len() > MAX_FLIGHT_RECORDER_DUMP_BYTES {
            return Err(FlightRecorderError(format!(
                "{} bytes, more than the {MAX_FLIGHT_RECORDER_DUMP_BYTES} read",
                pickle.len()
            )));
        }
        let dump: Dump = serde_pickle::from_slice(pickle, serde_pickle::DeOptions::new())
            .map_err(|e| FlightRecorderError(e.to_string()))?;
        Ok(Self::from_dump(rank, dump, keep))
    }

    fn from_dump(rank: u32, dump: Dump, keep: usize) -> CollectiveRecord {
        let mut groups: BTreeMap<String, GroupRecord> = dump
            .pg_status
            .iter()
            .map(|(name, status)| {
                let group = GroupRecord {
                    name: name.clone(),
                    last_enqueued: sequence_number(status.last_enqueued_collective.as_ref()),
                    last_started: sequence_number(status.last_started_collective.as_ref()),
                    last_completed: sequence_number(status.last_completed_collective.as_ref()),
                    entries: Vec::new(),
                };
                (name.clone(), group)
            })
            .collect();
        for entry in dump.entries.into_iter().filter(|e| !e.is_p2p) {
            let Some(name) = entry.process_group.first() else {
                continue;
            };
            let (backend, op) = match entry.profiling_name.split_once(':') {
                Some((backend, op)) => (Some(backend.to_string()), op.to_string()),
                None => (None, entry.profiling_name.clone()),
            };
            let state = match entry.state.as_str() {
                "started" => CollectiveState::Started,
                "completed" => CollectiveState::Completed,
                _ => CollectiveState::Scheduled,
            };
            let group = groups.entry(name.clone()).or_insert_with(|| GroupRecord {
                name: name.clone(),
                ..GroupRecord::default()
            });
            group.entries.push(CollectiveEntry {
                seq: entry.collective_seq_id,
                op,
                backend,
                input_sizes: entry.input_sizes,
                input_dtypes: entry.input_dtypes,
                state,
            });
        }
        let groups = groups
            .into_values()
            .map(|mut g| {
                g.entries.sort_by_key(|e| e.seq);
                let extra = g.entries.len().saturating_sub(keep);
                g.entries.drain(..extra);
                g
            })
            .collect();
        CollectiveRecord { rank, groups }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank 1 of three (gloo, PyTorch 2.15), abridged: two all_reduces, then an all_gather where the others
    /// all_reduce.
    const DUMP: &str = r#"{"version": "2.10", "comm_lib_version": "", "nccl_comm_state": {},
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}},
        "pg_status": {"0": {"last_enqueued_collective": "6", "last_started_collective": "-1",
                            "last_completed_collective": "5"}},
        "entries": [
          {"collective_seq_id": 6, "p2p_seq_id": 0, "is_p2p": false, "process_group": ["0", "default_pg"],
           "profiling_name": "gloo:all_gather", "input_sizes": [[4]], "input_dtypes": ["Float"],
           "output_sizes": [[3, 4]], "state": "scheduled", "timeout_ms": 1800000},
          {"collective_seq_id": 4, "is_p2p": false, "process_group": ["0", "default_pg"],
           "profiling_name": "gloo:all_reduce", "input_sizes": [[20000]], "input_dtypes": ["Float"],
           "state": "completed"},
          {"collective_seq_id": 0, "p2p_seq_id": 1, "is_p2p": true, "process_group": ["0", "default_pg"],
           "profiling_name": "gloo:send", "input_sizes": [[2]], "input_dtypes": ["Long"], "state": "scheduled"},
          {"collective_seq_id": 3, "is_p2p": false, "process_group": ["0", "default_pg"],
           "profiling_name": "gloo:all_reduce", "input_sizes": [[20000]], "input_dtypes": ["Float"],
           "state": "completed"}
        ]}"#;

    #[test]
    fn a_dump_gives_each_group_its_progress_and_last_collectives_in_order() {
        let record = CollectiveRecord::from_flight_recorder_json(1, DUMP.as_bytes(), 2).unwrap();
        assert_eq!(record.rank, 1);
        assert_eq!(record.groups.len(), 1);
        let group = &record.groups[0];
        assert_eq!(group.name, "0");
        assert_eq!(group.last_enqueued, Some(6));
        // -1: none.
        assert_eq!(group.last_started, None);
        assert_eq!(group.last_completed, Some(5));
        // The send is point-to-point; only the last two collectives are kept, oldest first.
        let seqs: Vec<(u64, &str)> = group
            .entries
            .iter()
            .map(|e| (e.seq, e.op.as_str()))
            .collect();
        assert_eq!(seqs, [(4, "all_reduce"), (6, "all_gather")]);
        assert_eq!(group.entries[1].backend.as_deref(), Some("gloo"));
        assert_eq!(group.entries[1].shape_text(), "[4] float32");
        assert_eq!(group.entries[0].state, CollectiveState::Completed);
    }

    #[test]
    fn what_is_not_a_dump_is_an_error_that_says_why() {
        let err =
            CollectiveRecord::from_flight_recorder_json(0, b"{\"entries\": 3}", 8).unwrap_err();
        assert!(
            err.to_string().starts_with("not a Flight Recorder dump: "),
            "{err}"
        );
        assert!(CollectiveRecord::from_flight_recorder_json(0, b"", 8).is_err());
    }

    #[test]
    fn shapes_read_as_torch_names_them() {
        let entry = CollectiveEntry {
            input_sizes: vec![vec![3, 4], vec![]],
            input_dtypes: vec!["BFloat16".into(), "QInt8".into()],
            ..CollectiveEntry::default()
        };
        assert_eq!(entry.shape_text(), "[3, 4] bfloat16; [] QInt8");
        assert_eq!(CollectiveEntry::default().shape_text(), "no tensors");
    }
}
