//! What Slurm tells a job step about where it runs: the node count and this node's rank, this node's name, the
//! first node of the job (MASTER_ADDR) and ports derived from the job id. Pure: the environment is passed in.

/// Where this agent sits in a multi-node job, as the scheduler says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub nnodes: u32,
    pub node_rank: u32,
}

impl Placement {
    /// Inside an srun step (`SLURM_STEP_ID` set) one agent runs per node of the step: the step's node count and this
    /// node's id. A batch script (no step id) runs on the allocation's first node alone: counting the allocation's
    /// nodes there (`SLURM_NNODES`) would make WORLD_SIZE larger than the ranks started, and the job would wait
    /// forever for ranks that never come.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Self {
        let number = |key: &str| get(key).and_then(|v| v.trim().parse::<u32>().ok());
        if get("SLURM_STEP_ID").is_none() {
            return Self {
                nnodes: 1,
                node_rank: 0,
            };
        }
        Self {
            nnodes: number("SLURM_STEP_NUM_NODES")
                .or_else(|| number("SLURM_NNODES"))
                .unwrap_or(1)
                .max(1),
            node_rank: number("SLURM_NODEID").unwrap_or(0),
        }
    }
}

/// This node's name: the one Slurm gave the step's node (`SLURMD_NODENAME`: several emulated nodes can share a
/// host), else the hostname.
pub fn node_name(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    get("SLURMD_NODENAME")
        .filter(|n| !n.trim().is_empty())
        .map(|n| n.trim().to_string())
        .or_else(hangwatch_inspect::rollcall::hostname)
}

/// The first node of the step (`SLURM_STEP_NODELIST`) or of the job (`SLURM_JOB_NODELIST`): node rank 0, where
/// MASTER_ADDR points and the coordinator is hosted.
pub fn first_node(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    get("SLURM_STEP_NODELIST")
        .or_else(|| get("SLURM_JOB_NODELIST"))
        .and_then(|list| first_host(&list))
}

/// The first host of a Slurm host list (`n[01-04,10],gpu7` -> `n01`), as `scontrol show hostnames` would list it
/// first.
pub fn first_host(list: &str) -> Option<String> {
    expand_hosts(list).into_iter().next()
}

/// At most this many names come out of one host list (a typo like `n[1-99999999]` must not eat the memory).
pub const MAX_HOSTS: usize = 100_000;
/// A host list longer than this is not read at all (Slurm's own lists for 100,000 nodes are far shorter).
pub const MAX_HOST_LIST_BYTES: usize = 1 << 20;

/// Every host of a Slurm host list (`n[01-03,10],gpu7` -> `n01 n02 n03 n10 gpu7`), as `scontrol show hostnames`
/// lists them. Written here because the syntax needs no more than this, and the alternative is running scontrol
/// (which may not answer). One bracket group per entry; an entry that does not parse is left out, and so is a
/// name longer than a host name may be ([`crate::ids::MAX_NODE_NAME`]): the list may be a job's text, and
/// `n[<128 KiB of zeros>-99999]` must cost what its length does, not 100,000 padded copies of it.
pub fn expand_hosts(list: &str) -> Vec<String> {
    let mut hosts = Vec::new();
    if list.len() > MAX_HOST_LIST_BYTES {
        return hosts;
    }
    for entry in split_outside_brackets(list.trim()) {
        let entry = entry.trim();
        match (entry.find('['), entry.find(']')) {
            (None, None) if !entry.is_empty() && entry.len() <= crate::ids::MAX_NODE_NAME => {
                if hosts.len() >= MAX_HOSTS {
                    return hosts;
                }
                hosts.push(entry.to_string());
            }
            (Some(open), Some(close)) if open < close => {
                let (prefix, suffix) = (&entry[..open], &entry[close + 1..]);
                for item in entry[open + 1..close].split(',') {
                    let (from, to) = item.split_once('-').unwrap_or((item, item));
                    let (from, to) = (from.trim(), to.trim());
                    let (Ok(a), Ok(b)) = (from.parse::<u64>(), to.parse::<u64>()) else {
                        continue;
                    };
                    let width = from.len();
                    let fixed = prefix.len() + suffix.len();
                    if fixed + width.max(b.to_string().len()) > crate::ids::MAX_NODE_NAME {
                        continue;
                    }
                    for n in a..=b {
                        if hosts.len() >= MAX_HOSTS {
                            return hosts;
                        }
                        hosts.push(format!("{prefix}{n:0width$}{suffix}"));
                    }
                }
            }
            _ => {}
        }
    }
    hosts
}

/// The entries of a host list: split at commas outside brackets.
fn split_outside_brackets(list: &str) -> Vec<&str> {
    let mut entries = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                entries.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    entries.push(&list[start..]);
    entries
}

/// The job's id as Slurm gives it.
pub fn job_id(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    get("SLURM_JOB_ID")
        .or_else(|| get("SLURM_JOBID"))
        .filter(|j| !j.trim().is_empty())
}

/// The job's id as each node (and the coordinator) works it out alone: the one given, else Slurm's, else `job`.
/// Every end must agree: with the token it makes the link's key.
pub fn job_id_or_default(given: Option<&str>, get: impl Fn(&str) -> Option<String>) -> String {
    given
        .map(str::to_string)
        .or_else(|| job_id(get))
        .unwrap_or_else(|| "job".into())
}

/// MASTER_PORT of a Slurm job: derived from its id, so that every node computes the same one without talking,
/// and two jobs sharing a node rarely collide (20000..39998, even; the coordinator takes the next port).
pub fn job_port(job_id: &str) -> Option<u16> {
    let id: u64 = job_id.trim().split(['_', '.']).next()?.parse().ok()?;
    u16::try_from(20_000 + (id % 10_000) * 2).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (*v).to_string())
        }
    }

    #[test]
    fn a_batch_script_of_a_multi_node_allocation_is_one_node() {
        // What `sbatch -N2` gives the batch script (seen on a real Slurm): no step id.
        let batch = [
            ("SLURM_NNODES", "2"),
            ("SLURM_JOB_NUM_NODES", "2"),
            ("SLURM_NODEID", "0"),
            ("SLURM_PROCID", "0"),
        ];
        assert_eq!(
            Placement::from_env(env(&batch)),
            Placement {
                nnodes: 1,
                node_rank: 0
            },
            "WORLD_SIZE must count the ranks this one agent starts"
        );
    }

    #[test]
    fn an_srun_step_has_one_agent_per_node_of_the_step() {
        let step = [
            ("SLURM_NNODES", "4"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_STEP_NUM_NODES", "2"),
            ("SLURM_NODEID", "1"),
        ];
        assert_eq!(
            Placement::from_env(env(&step)),
            Placement {
                nnodes: 2,
                node_rank: 1
            }
        );
        assert_eq!(
            Placement::from_env(env(&[])),
            Placement {
                nnodes: 1,
                node_rank: 0
            },
            "outside Slurm: one node"
        );
    }

    #[test]
    fn the_first_host_of_a_slurm_host_list() {
        for (list, first) in [
            ("n1", Some("n1")),
            ("n[1-3]", Some("n1")),
            ("gpu[001-004,010],cpu7", Some("gpu001")),
            ("a5,b[1-2]", Some("a5")),
            ("rack[3,5]-n", Some("rack3-n")),
            ("n[x-y]", None),
            ("n[1-2", None),
            ("", None),
        ] {
            assert_eq!(first_host(list).as_deref(), first, "{list:?}");
        }
        assert_eq!(
            first_node(env(&[
                ("SLURM_JOB_NODELIST", "n[2-3]"),
                ("SLURM_STEP_NODELIST", "n3")
            ]))
            .as_deref(),
            Some("n3"),
            "the step's nodes first"
        );
    }

    #[test]
    fn every_host_of_a_slurm_host_list() {
        assert_eq!(
            expand_hosts("gpu[001-003,010],cpu7,rack[3,5]-n"),
            vec!["gpu001", "gpu002", "gpu003", "gpu010", "cpu7", "rack3-n", "rack5-n"]
        );
        assert!(expand_hosts("").is_empty());
        assert_eq!(expand_hosts("n[1-2,x],m[1-2"), vec!["n1", "n2"]);
        assert_eq!(expand_hosts("n[1-999999999]").len(), MAX_HOSTS);
    }

    #[test]
    fn a_host_list_costs_what_its_length_does() {
        // The finding: zeros pad every name to the width of the range's start.
        let padded = format!("n[{}-99999]", "0".repeat(128 * 1024));
        assert!(expand_hosts(&padded).is_empty());
        assert!(
            expand_hosts(&"n".repeat(300)).is_empty(),
            "longer than a host name"
        );
        let huge = "n1,".repeat(MAX_HOST_LIST_BYTES / 3 + 1);
        assert!(expand_hosts(&huge).is_empty(), "over 1 MB: not read");
        let names: usize = expand_hosts("n[1-999999999]").iter().map(String::len).sum();
        assert!(names < 1_000_000, "100,000 short names: {names} bytes");
    }

    #[test]
    fn ports_and_names_from_the_job() {
        assert_eq!(job_port("4242"), Some(20_000 + 4242 * 2));
        assert_eq!(
            job_port("123456_7"),
            Some(20_000 + 3456 * 2),
            "an array job"
        );
        assert_eq!(job_port("nope"), None);
        assert_eq!(
            job_port("19999").map(|p| p + 1),
            Some(39_999),
            "the coordinator's port fits too"
        );
        assert_eq!(
            node_name(env(&[("SLURMD_NODENAME", "n2")])).as_deref(),
            Some("n2")
        );
        assert_eq!(
            job_id(env(&[("SLURM_JOB_ID", "77")])).as_deref(),
            Some("77")
        );
    }
}
