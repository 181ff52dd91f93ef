//! A rank blocked in a page fault on a memory-mapped file (a dataset, a checkpoint, its own code on a network
//! filesystem): whether a thread is in one, the files it may be faulting on, the mounts to probe for it, and, with
//! the probes' answers, the file named or the candidates.
//!
//! The faulting address is not readable from outside. The instruction pointer is (`/proc/PID/task/TID/syscall`):
//! a fault on code lies in the page being loaded, so it names the file; a fault on data is named by elimination:
//! the process's mapped files on the filesystem the kernel stack names (FUSE, NFS, Lustre, GPFS, ...), narrowed to
//! the mounts that do not answer their probe.

use hangwatch_kmsg::{FaultAccess as StackAccess, Filesystem, Frame};
use hangwatch_model::{
    FaultAccess, FaultFound, FileRef, MappedFile, PageFault, ProbeResult, ProcessObservation,
    SyscallObservation, ThreadObservation,
};

/// At most this many mounts are probed for one fault (each probe is a child process).
pub const MAX_FAULT_MOUNTS: usize = 8;

/// A thread in a page fault, before the probes: what the stack and the mappings say.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub access: FaultAccess,
    /// The filesystem the kernel stack names, if it names one (a fault waiting on a locked page names none).
    pub stack_fs: Option<Filesystem>,
    /// The user instruction pointer of the faulting thread.
    pub pc: Option<u64>,
    /// The mapped files it may be faulting on: those on the stack's filesystem when it names one (all when none of
    /// them is), else every mapped file.
    pub candidates: Vec<MappedFile>,
    /// Why the mappings are not known (not read, or the read did not return).
    pub unreadable: Option<String>,
}

/// Whether a thread is blocked in a page fault: its kernel stack says so; without a stack (not root), it sleeps
/// on a filesystem outside any system call.
pub fn in_page_fault(thread: &ThreadObservation) -> Option<FaultAccess> {
    if !matches!(thread.state, 'D' | 'S') {
        return None;
    }
    match thread.kernel_stack.as_deref() {
        Some(stack) if !stack.is_empty() => {
            let frames: Vec<Frame> = stack.iter().map(|f| Frame::from_display(f)).collect();
            hangwatch_kmsg::page_fault(&frames).map(|a| match a {
                StackAccess::Read => FaultAccess::Read,
                StackAccess::Write => FaultAccess::Write,
            })
        }
        _ => {
            let outside = matches!(
                thread.syscall,
                Some(SyscallObservation::NotInSyscall { .. })
            );
            let fs_wait = thread
                .wchan
                .as_deref()
                .is_some_and(hangwatch_kernel::filesystem::is_wait_frame);
            (outside && (thread.state == 'D' || fs_wait)).then_some(FaultAccess::Read)
        }
    }
}

/// Whether the roll call should read this process's mappings: one of its threads is in a page fault.
pub fn wants_mappings(process: &ProcessObservation) -> bool {
    !process.exited && process.threads.iter().any(|t| in_page_fault(t).is_some())
}

/// The fault of `thread` of `process`, if it is in one.
pub fn fault_of(process: &ProcessObservation, thread: &ThreadObservation) -> Option<Fault> {
    let access = in_page_fault(thread)?;
    let stack_fs = thread.kernel_stack.as_deref().and_then(|stack| {
        let frames: Vec<Frame> = stack.iter().map(|f| Frame::from_display(f)).collect();
        hangwatch_kmsg::stack::analyze(&frames).filesystem
    });
    let pc = match thread.syscall {
        Some(SyscallObservation::NotInSyscall { pc }) => pc,
        _ => None,
    };
    let (files, unreadable): (&[MappedFile], Option<String>) = match &process.mapped_files {
        Some(m) => (&m.files, m.unreadable.clone()),
        None => (&[], Some("its memory map was not read".to_string())),
    };
    let on_stack_fs: Vec<MappedFile> = stack_fs
        .map(|fs| {
            files
                .iter()
                .filter(|f| {
                    f.file
                        .fstype
                        .as_deref()
                        .is_some_and(|t| fs.matches_fstype(t))
                })
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let candidates = if on_stack_fs.is_empty() {
        files.to_vec()
    } else {
        on_stack_fs
    };
    Some(Fault {
        access,
        stack_fs,
        pc,
        candidates,
        unreadable,
    })
}

impl Fault {
    /// The mounts to probe to tell which candidates wait on a filesystem that does not answer.
    pub fn mounts(&self) -> Vec<String> {
        self.candidate_files()
            .into_iter()
            .filter_map(|f| f.mount.clone())
            .collect()
    }

    /// One candidate file per filesystem (at most [`MAX_FAULT_MOUNTS`]): what to probe, as the process sees it.
    pub fn candidate_files(&self) -> Vec<&FileRef> {
        let mut out: Vec<&FileRef> = Vec::new();
        for f in self.candidates.iter().map(|c| &c.file) {
            let Some(key) = f.filesystem_key() else {
                continue;
            };
            if !out.iter().any(|o| o.filesystem_key() == Some(key)) && out.len() < MAX_FAULT_MOUNTS
            {
                out.push(f);
            }
        }
        out
    }

    /// The file named, given the probes of the process's node: the candidate that holds the instruction pointer
    /// (a fault on code), else the only candidate on a mount that does not answer (or, when the stack names the
    /// filesystem, that was not probed), else those candidates.
    pub fn resolve(&self, probes: &[ProbeResult]) -> (PageFault, Option<FileRef>) {
        let answer = |f: &MappedFile| {
            let key = f.file.filesystem_key()?;
            probes
                .iter()
                .find(|p| p.filesystem_key() == Some(key))
                .and_then(|p| p.responsive)
        };
        let mut stuck: Vec<&MappedFile> = self
            .candidates
            .iter()
            .filter(|f| answer(f) == Some(false))
            .collect();
        if stuck.is_empty() && self.stack_fs.is_some() {
            stuck = self
                .candidates
                .iter()
                .filter(|f| answer(f).is_none())
                .collect();
        }
        let at_pc = self
            .pc
            .and_then(|pc| stuck.iter().find(|f| f.holds(pc)).copied());
        stuck.sort_by(|a, b| a.file.path.cmp(&b.file.path));
        let (found_by, named): (FaultFound, Vec<&MappedFile>) = match (at_pc, stuck.as_slice()) {
            (Some(f), _) => (FaultFound::InstructionPointer, vec![f]),
            (None, [one]) => (FaultFound::OnlyMapping, vec![*one]),
            (None, []) => (FaultFound::NotFound, Vec::new()),
            (None, many) => (FaultFound::Candidates, many.to_vec()),
        };
        let file = match found_by {
            FaultFound::InstructionPointer | FaultFound::OnlyMapping => {
                named.first().map(|f| f.file.clone())
            }
            _ => None,
        };
        let fault = PageFault {
            access: self.access,
            found_by,
            code: !named.is_empty() && named.iter().all(|f| f.code),
            candidates: named.iter().map(|f| f.file.clone()).collect(),
            unreadable: self.unreadable.clone(),
        };
        (fault, file)
    }
}

/// The mount and filesystem type all of a fault's candidates share, when they share one.
pub fn shared_mount(fault: &PageFault) -> Option<(String, Option<String>)> {
    shared_file(fault).and_then(|f| Some((f.mount.clone()?, f.fstype.clone())))
}

/// A candidate standing for all of them when they share one mount (its path is one of several).
pub fn shared_file(fault: &PageFault) -> Option<&FileRef> {
    let first = fault.candidates.first()?;
    let key = first.filesystem_key()?;
    fault
        .candidates
        .iter()
        .all(|c| c.mount == first.mount && c.filesystem_key() == Some(key))
        .then_some(first)
}

/// "reading a memory-mapped file" / "writing to a memory-mapped file", with "(code: ...)" for code.
pub fn fault_words(fault: &PageFault) -> String {
    let verb = match fault.access {
        FaultAccess::Read => "reading a memory-mapped file",
        FaultAccess::Write => "writing to a memory-mapped file",
    };
    let code = if fault.code {
        " (code: the program or a shared library)"
    } else {
        ""
    };
    format!("{verb}{code}")
}

/// Where the fault is, after [`fault_words`]: " /data/x.arrow", " on /data (one of 3 files it maps there: a, b,
/// c)", or why no file is named.
pub fn fault_place(fault: &PageFault) -> String {
    const SHOWN: usize = 3;
    match fault.found_by {
        FaultFound::InstructionPointer | FaultFound::OnlyMapping => fault
            .candidates
            .first()
            .map(|c| format!(" {}", c.path))
            .unwrap_or_default(),
        FaultFound::Candidates => {
            let n = fault.candidates.len();
            let more = if n > SHOWN {
                format!(", ... {} more", n - SHOWN)
            } else {
                String::new()
            };
            match shared_mount(fault) {
                Some((mount, _)) => {
                    let names: Vec<&str> = fault
                        .candidates
                        .iter()
                        .take(SHOWN)
                        .map(|c| {
                            c.path
                                .strip_prefix(&mount)
                                .map_or(c.path.as_str(), |r| r.trim_start_matches('/'))
                        })
                        .collect();
                    format!(
                        " on {mount} (one of {n} candidates it maps there: {}{more})",
                        names.join(", ")
                    )
                }
                None => {
                    let names: Vec<&str> = fault
                        .candidates
                        .iter()
                        .take(SHOWN)
                        .map(|c| c.path.as_str())
                        .collect();
                    format!(" (one of {n} candidates: {}{more})", names.join(", "))
                }
            }
        }
        FaultFound::NotFound => match &fault.unreadable {
            Some(why) => format!(" (which one is not known: {why})"),
            None => {
                " (which one is not known: no file it maps is on a filesystem that does not answer)"
                    .to_string()
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::MappedFiles;

    fn thread(state: char, stack: &[&str], pc: Option<u64>) -> ThreadObservation {
        ThreadObservation {
            tid: 7,
            state,
            kernel_stack: Some(stack.iter().map(|s| s.to_string()).collect()),
            syscall: Some(SyscallObservation::NotInSyscall { pc }),
            ..Default::default()
        }
    }

    fn mapped(path: &str, mount: &str, fstype: &str, range: (u64, u64), code: bool) -> MappedFile {
        MappedFile {
            file: FileRef {
                filesystem: None,
                path: path.into(),
                mount: Some(mount.into()),
                fstype: Some(fstype.into()),
                source: None,
            },
            ranges: vec![range],
            code,
        }
    }

    fn process(files: Vec<MappedFile>) -> ProcessObservation {
        ProcessObservation {
            pid: 42,
            mapped_files: Some(MappedFiles {
                files,
                unreadable: None,
            }),
            ..Default::default()
        }
    }

    fn probe(mount: &str, responsive: bool) -> ProbeResult {
        ProbeResult {
            filesystem: None,
            path: mount.into(),
            mount: Some(mount.into()),
            fstype: None,
            source: None,
            responsive: Some(responsive),
            elapsed_ms: 0,
            detail: String::new(),
            steps: Vec::new(),
        }
    }

    const FUSE_FAULT: &[&str] = &[
        "request_wait_answer [fuse]",
        "fuse_read_folio [fuse]",
        "filemap_fault",
        "__do_fault",
        "handle_mm_fault",
        "exc_page_fault",
    ];
    const LOCKED_PAGE: &[&str] = &["folio_wait_bit_common", "filemap_fault", "exc_page_fault"];

    fn libs() -> Vec<MappedFile> {
        vec![
            mapped("/usr/bin/python3", "/", "ext4", (0x1000, 0x9000), true),
            mapped("/usr/lib/libc.so.6", "/", "ext4", (0x10000, 0x20000), true),
        ]
    }

    #[test]
    fn the_only_file_mapped_on_the_filesystem_the_stack_names_is_the_one() {
        let mut files = libs();
        files.push(mapped(
            "/mnt/d/train.bin",
            "/mnt/d",
            "fuse.bindfs",
            (0x40000, 0x80000),
            false,
        ));
        let p = process(files);
        let t = thread('S', FUSE_FAULT, Some(0x10100));
        assert!(wants_mappings(&ProcessObservation {
            threads: vec![t.clone()],
            ..Default::default()
        }));
        let fault = fault_of(&p, &t).expect("a fault");
        assert_eq!(fault.stack_fs, Some(Filesystem::Fuse));
        assert_eq!(fault.mounts(), ["/mnt/d"], "only the FUSE mount is probed");
        let (pf, file) = fault.resolve(&[probe("/mnt/d", false)]);
        assert_eq!(pf.found_by, FaultFound::OnlyMapping);
        assert_eq!(file.map(|f| f.path).as_deref(), Some("/mnt/d/train.bin"));
        assert!(
            !pf.code,
            "the instruction pointer is in libc, which is not a candidate"
        );
        assert_eq!(fault_words(&pf), "reading a memory-mapped file");
        assert_eq!(fault_place(&pf), " /mnt/d/train.bin");
    }

    #[test]
    fn a_fault_on_a_locked_page_names_no_filesystem_and_the_probes_narrow_it() {
        let mut files = libs();
        files.push(mapped(
            "/data/a.arrow",
            "/data",
            "nfs4",
            (0x40000, 0x50000),
            false,
        ));
        files.push(mapped(
            "/data/b.arrow",
            "/data",
            "nfs4",
            (0x50000, 0x60000),
            false,
        ));
        files.push(mapped(
            "/data/c.arrow",
            "/data",
            "nfs4",
            (0x60000, 0x70000),
            false,
        ));
        files.push(mapped(
            "/data/d.arrow",
            "/data",
            "nfs4",
            (0x70000, 0x80000),
            false,
        ));
        let p = process(files);
        let fault = fault_of(&p, &thread('D', LOCKED_PAGE, None)).expect("a fault");
        assert_eq!(fault.stack_fs, None);
        assert_eq!(
            fault.mounts(),
            ["/", "/data"],
            "every mount it maps files from"
        );
        let (pf, file) = fault.resolve(&[probe("/", true), probe("/data", false)]);
        assert_eq!(pf.found_by, FaultFound::Candidates);
        assert!(file.is_none(), "no one file is named");
        assert_eq!(
            shared_mount(&pf),
            Some(("/data".to_string(), Some("nfs4".to_string())))
        );
        assert_eq!(
            fault_place(&pf),
            " on /data (one of 4 candidates it maps there: a.arrow, b.arrow, c.arrow, ... 1 more)"
        );
        let (pf, _) = fault.resolve(&[probe("/", true), probe("/data", true)]);
        assert_eq!(
            pf.found_by,
            FaultFound::NotFound,
            "every mount answers: nothing is named"
        );
    }

    #[test]
    fn the_instruction_pointer_names_code_on_a_stopped_filesystem() {
        let mut files = libs();
        files.push(mapped(
            "/gpfs/venv/lib/libtorch.so",
            "/gpfs",
            "gpfs",
            (0x100000, 0x900000),
            true,
        ));
        files.push(mapped(
            "/gpfs/venv/lib/libc10.so",
            "/gpfs",
            "gpfs",
            (0x900000, 0x990000),
            true,
        ));
        let p = process(files);
        let fault = fault_of(&p, &thread('D', LOCKED_PAGE, Some(0x200010))).expect("a fault");
        let (pf, file) = fault.resolve(&[probe("/", true), probe("/gpfs", false)]);
        assert_eq!(pf.found_by, FaultFound::InstructionPointer);
        assert_eq!(
            file.map(|f| f.path).as_deref(),
            Some("/gpfs/venv/lib/libtorch.so")
        );
        assert!(pf.code);
        assert_eq!(
            fault_words(&pf),
            "reading a memory-mapped file (code: the program or a shared library)"
        );
    }

    #[test]
    fn without_a_stack_a_filesystem_sleep_outside_a_call_is_a_fault_and_unread_maps_say_why() {
        let t = ThreadObservation {
            tid: 7,
            state: 'S',
            wchan: Some("request_wait_answer".into()),
            syscall: Some(SyscallObservation::NotInSyscall { pc: None }),
            ..Default::default()
        };
        assert_eq!(in_page_fault(&t), Some(FaultAccess::Read));
        let asleep = ThreadObservation {
            wchan: Some("futex_wait_queue".into()),
            ..t.clone()
        };
        assert_eq!(in_page_fault(&asleep), None);
        let p = ProcessObservation {
            mapped_files: Some(MappedFiles {
                files: Vec::new(),
                unreadable: Some("the read of /proc/42/maps did not return within 1.0s".into()),
            }),
            ..Default::default()
        };
        let (pf, file) = fault_of(&p, &t).expect("a fault").resolve(&[]);
        assert!(file.is_none());
        assert_eq!(pf.found_by, FaultFound::NotFound);
        assert_eq!(
            fault_place(&pf),
            " (which one is not known: the read of /proc/42/maps did not return within 1.0s)"
        );
    }

    #[test]
    fn a_write_fault_says_writing() {
        let frozen = [
            "percpu_rwsem_wait",
            "ext4_page_mkwrite",
            "do_page_mkwrite",
            "do_shared_fault",
            "exc_page_fault",
        ];
        assert_eq!(
            in_page_fault(&thread('D', &frozen, None)),
            Some(FaultAccess::Write)
        );
    }
}
