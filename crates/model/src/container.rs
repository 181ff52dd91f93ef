//! The container a job runs in when the command `run` started is a container client (`docker run`, `podman run`,
//! `nerdctl run`): which one, as its runtime knows it, and how it ended.

use serde::{Deserialize, Serialize};

/// A container the job's ranks run in, as its runtime recorded it (`inspect`), found through the container id
/// file the client wrote (docs/containers.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRef {
    /// The client's program: `docker`, `podman`, `nerdctl`.
    pub runtime: String,
    /// The full container id.
    pub id: String,
    /// Its name, without Docker's leading `/`.
    #[serde(default)]
    pub name: Option<String>,
    /// The image as the run asked for it (`localhost/train:3`), else its id.
    #[serde(default)]
    pub image: Option<String>,
    /// The container's first process as the node numbers it (the ranks run below it).
    #[serde(default)]
    pub host_pid: Option<i32>,
    /// The run asked for `--rm`: the container is removed once it exits.
    #[serde(default)]
    pub auto_remove: bool,
    /// How hangwatch ended it; absent while it was not ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<ContainerEnded>,
}

/// What ending a container through its runtime came to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerEnded {
    /// The container still ran after `kill` with SIGKILL and the kill wait: processes of it are unkillable
    /// (in D); the runtime removes it when they end, where `--rm` was asked.
    pub still_running: bool,
    /// The container's exit code as its runtime recorded it; `null` when it was gone before it could be read or
    /// still runs.
    pub exit_code: Option<i32>,
    /// The client's own exit code (`128 + signal` when a signal ended it); `null` while it runs.
    pub client_exit_code: Option<i32>,
    /// hangwatch removed it (`rm`, for `--rm`), or found it removed already.
    pub removed: bool,
    /// What did not work: a runtime call that failed or passed its deadline, in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl ContainerRef {
    /// The id as people see it: its first 12 characters.
    pub fn short_id(&self) -> &str {
        self.id.get(..12).unwrap_or(&self.id)
    }

    /// "podman container 38ade5ba25ba (localhost/train:3)".
    pub fn words(&self) -> String {
        match &self.image {
            Some(image) => format!("{} container {} ({image})", self.runtime, self.short_id()),
            None => format!("{} container {}", self.runtime, self.short_id()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_is_named_by_its_short_id_and_image() {
        let c = ContainerRef {
            runtime: "podman".into(),
            id: "38ade5ba25bacd3cae66a663a5a2cf12c9cdf814f9b8aaa07cea0e6d278c8935".into(),
            image: Some("localhost/train:3".into()),
            ..ContainerRef::default()
        };
        assert_eq!(
            c.words(),
            "podman container 38ade5ba25ba (localhost/train:3)"
        );
        let short = ContainerRef {
            id: "abc".into(),
            ..c
        };
        assert_eq!(short.short_id(), "abc");
    }
}
