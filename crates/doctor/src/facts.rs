//! The facts `doctor` judges, and how they are read: the process's own rights from `/proc/self/status`, sysctls
//! from `/proc/sys`, the environment variables PyTorch and DeepSpeed read, and the mount of each directory
//! hangwatch uses — decided from the mount table only, so a frozen network filesystem can never block it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

use hangwatch_proc::{parse_mountinfo, parse_status, MountTable};
use serde::{Deserialize, Serialize};

use crate::slurm_conf::{
    classify_script, resolve, ConfLine, FileBatch, FileText, PrologScript, UnreadFile,
    MAX_INCLUDE_DEPTH,
};

/// The environment variables that change whether a hang is reported or ended by PyTorch or DeepSpeed. Only
/// variables these libraries really read, plus `NCCL_TIMEOUT`, which people set believing it does something.
pub const RELEVANT_ENV: &[&str] = &[
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_BLOCKING_WAIT",
    "TORCH_NCCL_ENABLE_MONITORING",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
    "DEEPSPEED_TIMEOUT",
    "NCCL_TIMEOUT",
];

/// A sysctl as read from its file under `/proc/sys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "value")]
pub enum SysctlValue {
    Value(i64),
    /// The file does not exist: the kernel was built without the feature (or, for Yama, without the module).
    Missing,
    /// It exists but could not be read or parsed (the reason).
    Unreadable(String),
}

impl SysctlValue {
    pub fn value(&self) -> Option<i64> {
        match self {
            SysctlValue::Value(v) => Some(*v),
            _ => None,
        }
    }
}

/// The sysctls that decide what the kernel reports about a hang and what hangwatch may read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sysctls {
    /// `kernel.yama.ptrace_scope`: 0 same user, 1 descendants only, 2 CAP_SYS_PTRACE only, 3 nobody.
    pub ptrace_scope: SysctlValue,
    /// `kernel.dmesg_restrict`: 1 = the kernel log needs CAP_SYSLOG.
    pub dmesg_restrict: SysctlValue,
    /// `kernel.kptr_restrict`: hides kernel addresses; stacks and wchan are read as symbol names, so it does not
    /// blind hangwatch. Kept for the record.
    pub kptr_restrict: SysctlValue,
    /// `kernel.hung_task_timeout_secs`: 0 = detector off; missing = not built into this kernel.
    pub hung_task_timeout_secs: SysctlValue,
    /// `kernel.hung_task_panic`: 1 = a hung task panics the node.
    pub hung_task_panic: SysctlValue,
    /// `kernel.hung_task_warnings`: reports left until the next boot (-1 unlimited, 0 exhausted).
    pub hung_task_warnings: SysctlValue,
    /// `net.unix.max_dgram_qlen`: the queue length of the heartbeat socket.
    pub max_dgram_qlen: SysctlValue,
}

/// The effective capabilities that matter to hangwatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// `CapEff` as the kernel prints it.
    pub effective: u64,
    /// CAP_SYS_PTRACE: read any process's memory (Python stacks) whatever `ptrace_scope` 1-2 and its owner.
    pub sys_ptrace: bool,
    /// CAP_SYS_ADMIN: `/proc/PID/stack` (kernel stacks) is readable only with it.
    pub sys_admin: bool,
    /// CAP_SYSLOG: the kernel log despite `dmesg_restrict`.
    pub syslog: bool,
}

impl Capabilities {
    const CAP_SYS_PTRACE: u32 = 19;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_SYSLOG: u32 = 34;

    pub fn from_effective(effective: u64) -> Self {
        let has = |cap: u32| effective & (1u64 << cap) != 0;
        Capabilities {
            effective,
            sys_ptrace: has(Self::CAP_SYS_PTRACE),
            sys_admin: has(Self::CAP_SYS_ADMIN),
            syslog: has(Self::CAP_SYSLOG),
        }
    }
}

/// Whether a file could be opened for reading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "error")]
pub enum Access {
    Readable,
    Denied,
    Missing,
    Failed(String),
}

/// What a directory is to hangwatch; decides how much its mount matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathRole {
    /// Where the evidence of a hang is written (`--report-dir`, or the per-user report root).
    ReportDir,
    /// Where what outlives a run on this node is kept (the verdict history).
    StateDir,
    /// The directory of the job's `--log-file`.
    LogDir,
    /// The hangwatch executable: its helper children are started from it during a hang.
    Binary,
    /// The current directory, which hangwatch and the job inherit.
    CurrentDir,
}

impl PathRole {
    pub fn describe(self) -> &'static str {
        match self {
            PathRole::ReportDir => "the report directory",
            PathRole::StateDir => "the state directory",
            PathRole::LogDir => "the log file's directory",
            PathRole::Binary => "the hangwatch binary",
            PathRole::CurrentDir => "the current directory",
        }
    }
}

/// The mount that holds a path, from the mount table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountFact {
    pub mount_point: String,
    pub fstype: String,
    pub source: String,
    /// Network-shared or served by a user-space daemon (FUSE): it can stop answering while the node is fine.
    pub remote: bool,
}

/// One directory hangwatch uses and the mount that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathFact {
    pub role: PathRole,
    /// Absolute, `.` and `..` removed lexically (symlinks are not followed: that would touch the filesystem).
    pub path: String,
    /// `None` when the mount table could not be read.
    pub mount: Option<MountFact>,
}

/// Everything `doctor` judges, as plain data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFacts {
    /// Effective uid; `None` when `/proc/self/status` could not be read.
    pub euid: Option<u32>,
    pub capabilities: Option<Capabilities>,
    /// Whether hangwatch runs in a pid namespace other than the node's (a container); `None` when unknown.
    #[serde(default)]
    pub in_container: Option<bool>,
    pub sysctls: Sysctls,
    /// Whether `/dev/kmsg` (the live kernel log) opens for reading.
    pub kmsg: Access,
    /// The variables of [`RELEVANT_ENV`] that are set, with their values.
    pub env: BTreeMap<String, String>,
    pub paths: Vec<PathFact>,
    /// What could not be read, for the record (the checks that depend on it say "unknown").
    pub issues: Vec<String>,
    /// The node service and its TaskProlog: gathered by `hangwatch doctor` alone ([`NodeServiceFacts::gather`]),
    /// never at `run`'s start; `None` where nothing shows the service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_service: Option<NodeServiceFacts>,
}

/// The node service (`hangwatch node`) on this node, and the Slurm TaskProlog that gives its watchers the ranks'
/// beats and Flight Recorder (docs/node-service.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeServiceFacts {
    /// What shows the service here (its bootstrap under /run/hangwatch-node, its unit enabled, `[node]` settings).
    pub signs: Vec<String>,
    /// The slurm.conf read; `None` when none could be.
    pub slurm_conf: Option<String>,
    /// How its path was found (`$SLURM_CONF`, `scontrol show config`, Slurm's default, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_conf_from: Option<String>,
    /// Where slurm.conf was looked for in vain, and why (when none was read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slurm_conf_unread: Vec<UnreadFile>,
    /// The TaskProlog in force.
    pub task_prolog: Option<ConfLine>,
    /// `TaskProlog=` lines commented out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commented: Vec<ConfLine>,
    /// Included files that were not read (a TaskProlog set there is unknown).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub includes_unread: Vec<UnreadFile>,
    /// What the TaskProlog's script is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<PrologScript>,
}

impl NodeServiceFacts {
    /// Reads slurm.conf from the first of `candidates` (path, how it was found) that `read` returns, the files it
    /// includes, and the TaskProlog's script. `read` reads a batch of files; every file here may be on a network
    /// filesystem, so the caller's reader is a child under a deadline (`hangwatch_config::read_files`).
    pub fn gather(
        signs: Vec<String>,
        candidates: &[(PathBuf, String)],
        read: &mut dyn FnMut(&[PathBuf]) -> FileBatch,
    ) -> NodeServiceFacts {
        let mut facts = NodeServiceFacts {
            signs,
            slurm_conf: None,
            slurm_conf_from: None,
            slurm_conf_unread: Vec::new(),
            task_prolog: None,
            commented: Vec::new(),
            includes_unread: Vec::new(),
            script: None,
        };
        let mut texts = BTreeMap::new();
        let mut read_into = |paths: &[PathBuf], texts: &mut BTreeMap<PathBuf, FileText>| {
            let mut answers = read(paths);
            for path in paths {
                let found = match answers.iter().position(|(p, _)| p == path) {
                    Some(i) => answers.swap_remove(i).1,
                    None => FileText::Unreadable("the reader did not answer for it".into()),
                };
                texts.insert(path.clone(), found);
            }
        };
        let paths: Vec<PathBuf> = candidates.iter().map(|(p, _)| p.clone()).collect();
        read_into(&paths, &mut texts);
        let Some((main, from)) = candidates
            .iter()
            .find(|(p, _)| matches!(texts.get(p), Some(FileText::Text(_))))
        else {
            facts.slurm_conf_unread = candidates
                .iter()
                .map(|(path, from)| UnreadFile {
                    path: path.display().to_string(),
                    why: match texts.get(path) {
                        Some(FileText::Unreadable(why)) => format!("{from}: {why}"),
                        _ => format!("{from}: does not exist"),
                    },
                })
                .collect();
            return facts;
        };
        facts.slurm_conf = Some(main.display().to_string());
        facts.slurm_conf_from = Some(from.clone());
        let mut resolved = resolve(main, &texts);
        for _ in 0..=MAX_INCLUDE_DEPTH {
            if resolved.wanted.is_empty() {
                break;
            }
            read_into(&resolved.wanted, &mut texts);
            resolved = resolve(main, &texts);
        }
        facts.commented = resolved.commented;
        facts.includes_unread = resolved.unread;
        if let Some(line) = &resolved.task_prolog {
            let script = PathBuf::from(&line.value);
            read_into(std::slice::from_ref(&script), &mut texts);
            let found = texts
                .get(&script)
                .cloned()
                .unwrap_or(FileText::Unreadable("not read".into()));
            facts.script = Some(classify_script(&line.value, &found));
        }
        facts.task_prolog = resolved.task_prolog;
        facts
    }
}

/// Where [`HostFacts::gather`] reads from; every root can point at a test tree.
#[derive(Debug, Clone)]
pub struct GatherOptions {
    /// The /proc tree (`/proc`): `self/status`, `self/mountinfo`, `self/exe`, `self/cwd` are read.
    pub proc_root: PathBuf,
    /// The sysctl tree (`/proc/sys`).
    pub sys_root: PathBuf,
    /// The live kernel log device (`/dev/kmsg`); it is opened and closed, never read.
    pub kmsg: PathBuf,
    /// The environment (only [`RELEVANT_ENV`] is looked at).
    pub env: HashMap<String, String>,
    /// Directories to place on their mounts. The binary (`self/exe`) and the current directory (`self/cwd`) are
    /// added from the proc root; relative paths are taken from that current directory.
    pub paths: Vec<(PathRole, PathBuf)>,
}

impl GatherOptions {
    /// This host: `/proc`, `/proc/sys`, `/dev/kmsg` and the process environment.
    pub fn host(paths: Vec<(PathRole, PathBuf)>) -> Self {
        GatherOptions {
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/proc/sys"),
            kmsg: PathBuf::from("/dev/kmsg"),
            env: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .filter(|(k, _)| RELEVANT_ENV.contains(&k.as_str()))
                .collect(),
            paths,
        }
    }
}

impl HostFacts {
    /// Reads the facts: a dozen small files under /proc, one open of the kernel log device, the mount table. It
    /// never stats, opens or lists a path given in `paths` (one may be on a frozen mount); symlinks under
    /// /proc are only `readlink`ed.
    pub fn gather(options: &GatherOptions) -> HostFacts {
        let mut issues = Vec::new();
        let self_dir = options.proc_root.join("self");
        let status = match std::fs::read_to_string(self_dir.join("status")) {
            Ok(text) => match parse_status(&text) {
                Ok(status) => Some(status),
                Err(e) => {
                    issues.push(format!("{}: {e}", self_dir.join("status").display()));
                    None
                }
            },
            Err(e) => {
                issues.push(format!(
                    "cannot read {}: {e}",
                    self_dir.join("status").display()
                ));
                None
            }
        };
        let euid = status.as_ref().and_then(|s| s.euid);
        let capabilities = status
            .as_ref()
            .and_then(|s| s.cap_eff)
            .map(Capabilities::from_effective);

        let sysctl = |name: &str| read_sysctl(&options.sys_root, name);
        let sysctls = Sysctls {
            ptrace_scope: sysctl("kernel/yama/ptrace_scope"),
            dmesg_restrict: sysctl("kernel/dmesg_restrict"),
            kptr_restrict: sysctl("kernel/kptr_restrict"),
            hung_task_timeout_secs: sysctl("kernel/hung_task_timeout_secs"),
            hung_task_panic: sysctl("kernel/hung_task_panic"),
            hung_task_warnings: sysctl("kernel/hung_task_warnings"),
            max_dgram_qlen: sysctl("net/unix/max_dgram_qlen"),
        };

        let kmsg = match std::fs::File::open(&options.kmsg) {
            Ok(_) => Access::Readable,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Access::Denied,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Access::Missing,
            Err(e) => Access::Failed(e.to_string()),
        };

        let env = RELEVANT_ENV
            .iter()
            .filter_map(|name| Some((name.to_string(), options.env.get(*name)?.clone())))
            .collect();

        let table = match std::fs::read_to_string(self_dir.join("mountinfo")) {
            Ok(text) => match parse_mountinfo(&text) {
                Ok(table) => Some(table),
                Err(e) => {
                    issues.push(format!("{}: {e}", self_dir.join("mountinfo").display()));
                    None
                }
            },
            Err(e) => {
                issues.push(format!(
                    "cannot read {}: {e}",
                    self_dir.join("mountinfo").display()
                ));
                None
            }
        };
        let link = |name: &str| std::fs::read_link(self_dir.join(name)).ok();
        let cwd = link("cwd");
        let mut wanted = options.paths.clone();
        match link("exe") {
            Some(exe) => wanted.push((PathRole::Binary, exe)),
            None => issues.push(format!(
                "cannot readlink {}",
                self_dir.join("exe").display()
            )),
        }
        match &cwd {
            Some(dir) => wanted.push((PathRole::CurrentDir, dir.clone())),
            None => issues.push(format!(
                "cannot readlink {}",
                self_dir.join("cwd").display()
            )),
        }
        let paths = wanted
            .into_iter()
            .filter_map(|(role, path)| {
                let path = absolute(&path, cwd.as_deref())?;
                Some(PathFact {
                    role,
                    mount: table.as_ref().and_then(|t| mount_of(t, &path)),
                    path,
                })
            })
            .collect();

        HostFacts {
            euid,
            capabilities,
            in_container: std::fs::read_link(self_dir.join("ns").join("pid"))
                .ok()
                .map(|link| !hangwatch_proc::is_initial_pid_namespace(&link.to_string_lossy())),
            sysctls,
            kmsg,
            env,
            paths,
            issues,
            node_service: None,
        }
    }
}

fn read_sysctl(root: &Path, name: &str) -> SysctlValue {
    match std::fs::read_to_string(root.join(name)) {
        Ok(text) => match text.trim().parse() {
            Ok(value) => SysctlValue::Value(value),
            Err(_) => SysctlValue::Unreadable(format!("not a number: {:?}", text.trim())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => SysctlValue::Missing,
        Err(e) => SysctlValue::Unreadable(e.to_string()),
    }
}

fn mount_of(table: &MountTable, path: &str) -> Option<MountFact> {
    table.containing(path).map(|m| MountFact {
        mount_point: m.mount_point.clone(),
        fstype: m.fstype.clone(),
        source: m.source.clone(),
        remote: m.is_remote(),
    })
}

/// `path` made absolute against `cwd` and cleaned of `.` and `..` by its text alone. `None` when it is relative
/// and the current directory is unknown.
fn absolute(path: &Path, cwd: Option<&Path>) -> Option<String> {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd?.join(path)
    };
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for component in joined.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let mut out = String::new();
    for part in parts {
        out.push('/');
        out.push_str(&part.to_string_lossy());
    }
    if out.is_empty() {
        out.push('/');
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake /proc (with `sys/`) as a non-root user without capabilities would see it, and a /shared NFS mount.
    fn fake_proc() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let write = |rel: &str, text: &str| {
            let path = root.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "self/status",
            "Name:\thangwatch\nState:\tR (running)\nUid:\t1000\t1000\t1000\t1000\n\
             CapPrm:\t0000000000000000\nCapEff:\t0000000000080000\n",
        );
        write(
            "self/mountinfo",
            "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
             60 27 0:55 / /shared rw,relatime - nfs4 server:/export rw,vers=4.2\n\
             61 27 0:56 / /var/tmp rw,relatime - xfs /dev/nvme0n1 rw\n",
        );
        std::os::unix::fs::symlink("/shared/venv/bin/hangwatch", root.join("self/exe")).unwrap();
        std::os::unix::fs::symlink("/shared/u/project", root.join("self/cwd")).unwrap();
        write("sys/kernel/dmesg_restrict", "1\n");
        write("sys/kernel/kptr_restrict", "1\n");
        write("sys/kernel/hung_task_timeout_secs", "0\n");
        write("sys/kernel/hung_task_panic", "0\n");
        write("sys/kernel/hung_task_warnings", "0\n");
        write("sys/net/unix/max_dgram_qlen", "10\n");
        write("sys/kernel/yama/ptrace_scope", "garbage\n");
        dir
    }

    fn options(root: &Path) -> GatherOptions {
        GatherOptions {
            proc_root: root.to_path_buf(),
            sys_root: root.join("sys"),
            kmsg: root.join("no-kmsg"),
            env: HashMap::from([
                ("TORCH_NCCL_ASYNC_ERROR_HANDLING".into(), "0".into()),
                ("PATH".into(), "/usr/bin".into()),
            ]),
            paths: vec![
                (
                    PathRole::ReportDir,
                    PathBuf::from("/var/tmp/hangwatch-1000"),
                ),
                (PathRole::LogDir, PathBuf::from("logs/../out/./today")),
            ],
        }
    }

    #[test]
    fn gathers_a_fake_tree() {
        let tree = fake_proc();
        let facts = HostFacts::gather(&options(tree.path()));
        assert_eq!(facts.euid, Some(1000));
        let caps = facts.capabilities.unwrap();
        assert!(caps.sys_ptrace && !caps.sys_admin && !caps.syslog);
        assert_eq!(facts.sysctls.dmesg_restrict, SysctlValue::Value(1));
        assert_eq!(facts.sysctls.hung_task_timeout_secs, SysctlValue::Value(0));
        assert_eq!(facts.sysctls.hung_task_warnings, SysctlValue::Value(0));
        assert_eq!(facts.sysctls.max_dgram_qlen, SysctlValue::Value(10));
        assert!(matches!(
            facts.sysctls.ptrace_scope,
            SysctlValue::Unreadable(_)
        ));
        assert_eq!(facts.kmsg, Access::Missing);
        assert_eq!(
            facts.env,
            BTreeMap::from([("TORCH_NCCL_ASYNC_ERROR_HANDLING".into(), "0".into())])
        );
        let at = |role| facts.paths.iter().find(|p| p.role == role).unwrap();
        assert_eq!(
            at(PathRole::ReportDir).mount.as_ref().unwrap().fstype,
            "xfs"
        );
        let log = at(PathRole::LogDir);
        assert_eq!(log.path, "/shared/u/project/out/today");
        assert!(log.mount.as_ref().unwrap().remote);
        let binary = at(PathRole::Binary);
        assert_eq!(binary.path, "/shared/venv/bin/hangwatch");
        assert_eq!(binary.mount.as_ref().unwrap().mount_point, "/shared");
        assert_eq!(at(PathRole::CurrentDir).path, "/shared/u/project");
        assert!(facts.issues.is_empty(), "{:?}", facts.issues);
    }

    #[test]
    fn missing_files_are_missing_not_errors() {
        let tree = tempfile::tempdir().unwrap();
        let facts = HostFacts::gather(&options(tree.path()));
        assert_eq!(facts.euid, None);
        assert_eq!(facts.sysctls.hung_task_timeout_secs, SysctlValue::Missing);
        assert_eq!(facts.sysctls.ptrace_scope, SysctlValue::Missing);
        assert!(facts.paths.iter().all(|p| p.mount.is_none()));
        assert!(
            facts.paths.iter().all(|p| p.role != PathRole::LogDir),
            "a relative path without a known current directory is left out"
        );
        assert!(facts.issues.iter().any(|i| i.contains("mountinfo")));
    }

    #[test]
    fn kmsg_is_opened_not_read() {
        let tree = fake_proc();
        let kmsg = tree.path().join("kmsg");
        std::fs::write(&kmsg, "").unwrap();
        let mut opts = options(tree.path());
        opts.kmsg = kmsg.clone();
        assert_eq!(HostFacts::gather(&opts).kmsg, Access::Readable);
    }

    #[test]
    fn paths_are_cleaned_by_text() {
        let cwd = Path::new("/home/u");
        assert_eq!(
            absolute(Path::new("a/./b/../c"), Some(cwd)).unwrap(),
            "/home/u/a/c"
        );
        assert_eq!(absolute(Path::new("/../.."), None).unwrap(), "/");
        assert_eq!(absolute(Path::new("/x//y/"), None).unwrap(), "/x/y");
        assert_eq!(absolute(Path::new("rel"), None), None);
    }
}
