//! What a job can write that hangwatch's root service reads: Slurm host lists, a step daemon's title, names in
//! Slurm's grammar, `squeue`'s lines, and a task's environment. The first byte picks which. None may panic, a host
//! list costs at most what its bounds say, a name that parses is safe as a file name, and a task's environment
//! never changes its step's job, step or node.
#![no_main]

use std::collections::HashMap;

use hangwatch_proc::{parse_environ, RankEnv};
use hangwatch_slurm::ids::{parse_step_daemon_title, JobId, NodeName, StepId, MAX_NODE_NAME};
use hangwatch_slurm::records::{parse_job, parse_step};
use hangwatch_slurm::step::{expand_hosts, MAX_HOSTS};
use hangwatch_slurm::steps::{steps_on_node, DaemonFacts, ProcessRow};
use libfuzzer_sys::fuzz_target;

fn safe_as_a_file_name(name: &str) {
    assert!(!name.is_empty() && !name.contains('/') && name != "." && name != "..");
    assert!(!name.starts_with('-'), "{name:?} would read as an option");
    assert!(!name.chars().any(char::is_control));
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    match which % 5 {
        0 => {
            let hosts = expand_hosts(&text);
            assert!(hosts.len() <= MAX_HOSTS);
            assert!(hosts.iter().all(|h| h.len() <= MAX_NODE_NAME));
        }
        1 => {
            let words: Vec<String> = text.split('\0').map(str::to_string).collect();
            if let Some((job, step)) = parse_step_daemon_title(&words) {
                safe_as_a_file_name(job.as_str());
                safe_as_a_file_name(step.as_str());
            }
        }
        2 => {
            for name in [
                JobId::parse(&text).map(|j| j.to_string()),
                StepId::parse(&text).map(|s| s.to_string()),
                NodeName::parse(&text).map(|n| n.to_string()),
            ]
            .into_iter()
            .flatten()
            {
                safe_as_a_file_name(&name);
            }
        }
        3 => {
            let _ = parse_job(&text);
            if let (Ok(job), Ok(step)) = (JobId::parse("7"), StepId::parse("0")) {
                let _ = parse_step(&text, &job, &step);
            }
        }
        _ => {
            // A task's whole environment, forged at will: the step stays its daemon's.
            let said = RankEnv::from_environ(&parse_environ(rest)).slurm;
            let (Ok(job), Ok(step), Ok(node)) =
                (JobId::parse("7"), StepId::parse("0"), NodeName::parse("n1"))
            else {
                return;
            };
            let rows = [
                ProcessRow { pid: 1, ppid: 0, comm: "slurmstepd".into(), uid: Some(0) },
                ProcessRow { pid: 2, ppid: 1, comm: "python3".into(), uid: Some(1000) },
            ];
            let daemons = HashMap::from([(1, DaemonFacts { job, step, node })]);
            let steps = steps_on_node(&rows, &daemons, &HashMap::from([(2, said)]), None);
            assert_eq!(steps.len(), 1);
            assert_eq!(
                (steps[0].name().as_str(), steps[0].node.as_deref()),
                ("7.0", Some("n1"))
            );
        }
    }
});
