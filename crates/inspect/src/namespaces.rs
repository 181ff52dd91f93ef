//! Each rank's own view of files and mounts: which processes live in a mount namespace other than hangwatch's (a
//! container), the filesystem identity of every file they use, and the probe targets for their mounts, probed in
//! their namespace. Reads only `/proc/PID/ns/mnt` (a link) and `/proc/PID/mountinfo`, which never block.

use std::collections::HashMap;
use std::sync::Arc;

use hangwatch_diagnosis::MountToProbe;
use hangwatch_model::{FileRef, PidView, ProcessObservation, SyscallObservation};
use hangwatch_proc::{filesystem_id, Mount, MountTable, ProcFs};

use crate::probe::{MountRef, ProbeTarget};

/// The mount tables a roll call needs: hangwatch's own, and each observed process's when its namespace differs.
#[derive(Debug, Default)]
pub struct MountViews {
    own: Option<Arc<MountTable>>,
    /// pid → (in another namespace, its namespace's table, shared by its processes); a process whose namespace
    /// could not be read is taken as hangwatch's (what it was before namespaces were looked at).
    views: HashMap<i32, (bool, Option<Arc<MountTable>>)>,
}

impl MountViews {
    /// Reads the namespaces of `observations` (one table per namespace).
    pub fn read(procfs: &ProcFs, observations: &[ProcessObservation]) -> Self {
        let own_pid = std::process::id() as i32;
        let own_ns = procfs.mount_namespace(own_pid).ok();
        let own = procfs.mountinfo(own_pid).ok().map(Arc::new);
        let mut by_ns: HashMap<String, Option<Arc<MountTable>>> = HashMap::new();
        let mut views = HashMap::new();
        for o in observations.iter().filter(|o| !o.exited) {
            let Ok(ns) = procfs.mount_namespace(o.pid) else {
                continue;
            };
            let other = own_ns.as_ref().is_some_and(|own| *own != ns);
            let table = if other {
                by_ns
                    .entry(ns)
                    .or_insert_with(|| procfs.mountinfo(o.pid).ok().map(Arc::new))
                    .clone()
            } else {
                own.clone()
            };
            views.insert(o.pid, (other, table));
        }
        MountViews { own, views }
    }

    /// Marks the processes that live in another mount namespace and names the filesystem of every file they
    /// use.
    pub fn identify(&self, observations: &mut [ProcessObservation]) {
        for o in observations.iter_mut() {
            let Some((other, table)) = self.views.get(&o.pid) else {
                continue;
            };
            o.other_mount_namespace = *other;
            for t in &mut o.threads {
                if let Some(SyscallObservation::InSyscall {
                    file: Some(file), ..
                }) = &mut t.syscall
                {
                    self.identify_file(file, table.as_deref(), *other);
                }
            }
            for mapped in o.mapped_files.iter_mut().flat_map(|m| m.files.iter_mut()) {
                self.identify_file(&mut mapped.file, table.as_deref(), *other);
            }
        }
    }

    fn identify_file(&self, file: &mut FileRef, table: Option<&MountTable>, other: bool) {
        let Some(mount) = file.mount.as_deref().and_then(|m| visible_mount(table?, m)) else {
            return;
        };
        file.filesystem = Some(Box::new(filesystem_id(mount, self.own.as_deref(), other)));
    }

    /// The probe target of a mount a stuck process uses, in that process's namespace.
    pub fn target(&self, wanted: &MountToProbe) -> ProbeTarget {
        ProbeTarget {
            path: wanted.mount.clone(),
            in_root_of: wanted.other_namespace.then_some(wanted.pid),
            mount: match (&wanted.fstype, &wanted.source) {
                (Some(fstype), Some(source)) => Some(MountRef {
                    mount: wanted.mount.clone(),
                    fstype: fstype.clone(),
                    source: source.clone(),
                }),
                _ => None,
            },
            filesystem: wanted.filesystem.clone(),
        }
    }

    /// The probe target of `mount` as the ranks see it (the coordinator's probe round names mounts as the
    /// culprit's ranks saw them): in the namespace of the first process that has such a mount point, else in
    /// hangwatch's own.
    pub fn target_for_mount(&self, mount: &str, pids: &[i32]) -> ProbeTarget {
        for pid in pids {
            if let Some((true, Some(table))) = self.views.get(pid) {
                if let Some(m) = visible_mount(table, mount) {
                    return self.target_of(*pid, m, true);
                }
            }
        }
        match self.own.as_ref().and_then(|t| visible_mount(t, mount)) {
            Some(m) => self.target_of(std::process::id() as i32, m, false),
            None => ProbeTarget::own(mount),
        }
    }

    /// The writable data mounts that `pid` sees, as probe targets in its namespace (a superblock waiter).
    pub fn writable_targets(&self, pid: i32) -> Vec<ProbeTarget> {
        let Some((other, Some(table))) = self.views.get(&pid) else {
            return Vec::new();
        };
        table
            .writable_data_mounts()
            .into_iter()
            .map(|m| self.target_of(pid, m, *other))
            .collect()
    }

    fn target_of(&self, pid: i32, m: &Mount, other: bool) -> ProbeTarget {
        ProbeTarget {
            path: m.mount_point.clone(),
            in_root_of: other.then_some(pid),
            mount: Some(MountRef {
                mount: m.mount_point.clone(),
                fstype: m.fstype.clone(),
                source: m.source.clone(),
            }),
            filesystem: Some(filesystem_id(m, self.own.as_deref(), other)),
        }
    }
}

/// The mount visible at `mount_point` (the last one mounted there).
fn visible_mount<'a>(table: &'a MountTable, mount_point: &str) -> Option<&'a Mount> {
    table
        .mounts
        .iter()
        .rev()
        .find(|m| m.mount_point == mount_point)
}

/// Whose pids hangwatch sees: the node's when it runs in the initial pid namespace, a container's otherwise.
/// `None` when its own namespace cannot be read.
pub fn own_pid_view(procfs: &ProcFs) -> Option<PidView> {
    let link = procfs.pid_namespace(std::process::id() as i32).ok()?;
    Some(if hangwatch_proc::is_initial_pid_namespace(&link) {
        PidView::Host
    } else {
        PidView::Container
    })
}

/// Whether two targets probe the same filesystem (one probe is enough).
pub fn same_filesystem(a: &ProbeTarget, b: &ProbeTarget) -> bool {
    match (&a.filesystem, &b.filesystem) {
        (Some(x), Some(y)) => x.key == y.key,
        _ => a.path == b.path && a.in_root_of == b.in_root_of,
    }
}
