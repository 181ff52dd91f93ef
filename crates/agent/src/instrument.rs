//! The zero-code instrumentation `run` gives the ranks it starts: a directory, first on their `PYTHONPATH`, holding
//! hangwatch's bootstrap (`sitecustomize.py`: chains to the job's own, then hooks torch, the HF Trainer, Lightning
//! and accelerate as the job imports them) and a copy of the Python client it loads, the same version as this
//! binary. Nothing is imported in a rank that does not import those frameworks (docs/inside-evidence.md).

use std::path::{Path, PathBuf};

/// Every file of the bootstrap directory, by its path there. The client's package is carried whole
/// (`bootstrap_carries_the_whole_client` checks it against python/src/hangwatch).
pub const BOOTSTRAP_FILES: &[(&str, &str)] = &[
    (
        "sitecustomize.py",
        include_str!("../../../python/bootstrap/sitecustomize.py"),
    ),
    (
        "hangwatch/__init__.py",
        include_str!("../../../python/src/hangwatch/__init__.py"),
    ),
    (
        "hangwatch/_auto.py",
        include_str!("../../../python/src/hangwatch/_auto.py"),
    ),
    (
        "hangwatch/_client.py",
        include_str!("../../../python/src/hangwatch/_client.py"),
    ),
    (
        "hangwatch/_flight.py",
        include_str!("../../../python/src/hangwatch/_flight.py"),
    ),
    (
        "hangwatch/_logging.py",
        include_str!("../../../python/src/hangwatch/_logging.py"),
    ),
    (
        "hangwatch/_phase.py",
        include_str!("../../../python/src/hangwatch/_phase.py"),
    ),
    (
        "hangwatch/_rank.py",
        include_str!("../../../python/src/hangwatch/_rank.py"),
    ),
    (
        "hangwatch/_version.py",
        include_str!("../../../python/src/hangwatch/_version.py"),
    ),
    (
        "hangwatch/py.typed",
        include_str!("../../../python/src/hangwatch/py.typed"),
    ),
    (
        "hangwatch/integrations/__init__.py",
        include_str!("../../../python/src/hangwatch/integrations/__init__.py"),
    ),
    (
        "hangwatch/integrations/_lightning_hooks.py",
        include_str!("../../../python/src/hangwatch/integrations/_lightning_hooks.py"),
    ),
    (
        "hangwatch/integrations/_phases.py",
        include_str!("../../../python/src/hangwatch/integrations/_phases.py"),
    ),
    (
        "hangwatch/integrations/accelerate.py",
        include_str!("../../../python/src/hangwatch/integrations/accelerate.py"),
    ),
    (
        "hangwatch/integrations/lightning.py",
        include_str!("../../../python/src/hangwatch/integrations/lightning.py"),
    ),
    (
        "hangwatch/integrations/pytorch_lightning.py",
        include_str!("../../../python/src/hangwatch/integrations/pytorch_lightning.py"),
    ),
    (
        "hangwatch/integrations/transformers.py",
        include_str!("../../../python/src/hangwatch/integrations/transformers.py"),
    ),
];

/// Writes the bootstrap into `dir` (created; it must be node-local and private: `run`'s runtime directory) and
/// returns it.
pub fn write_bootstrap(dir: &Path) -> std::io::Result<PathBuf> {
    for (name, text) in BOOTSTRAP_FILES {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, text)?;
    }
    Ok(dir.to_path_buf())
}

/// `PYTHONPATH` with `dir` first, before what the job had (`existing`).
pub fn python_path_with(dir: &Path, existing: Option<&std::ffi::OsStr>) -> std::ffi::OsString {
    let mut value = dir.as_os_str().to_owned();
    if let Some(rest) = existing.filter(|e| !e.is_empty()) {
        value.push(":");
        value.push(rest);
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_carries_the_whole_client() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/src");
        let mut on_disk = Vec::new();
        let mut stack = vec![root.join("hangwatch")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("python/src/hangwatch") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    if path.file_name().is_some_and(|n| n != "__pycache__") {
                        stack.push(path);
                    }
                } else if path.extension().is_some_and(|e| e == "py" || e == "typed") {
                    let relative = path.strip_prefix(&root).expect("below root");
                    on_disk.push(relative.to_string_lossy().into_owned());
                }
            }
        }
        on_disk.sort();
        let mut carried: Vec<String> = BOOTSTRAP_FILES
            .iter()
            .map(|(name, _)| name.to_string())
            .filter(|n| n.starts_with("hangwatch/"))
            .collect();
        carried.sort();
        assert_eq!(
            carried, on_disk,
            "instrument.rs must carry every file of the client"
        );
    }

    #[test]
    fn the_bootstrap_goes_first_and_keeps_the_jobs_path() {
        let dir = Path::new("/run/hw/python");
        assert_eq!(python_path_with(dir, None), "/run/hw/python");
        assert_eq!(python_path_with(dir, Some("".as_ref())), "/run/hw/python");
        assert_eq!(
            python_path_with(dir, Some("/job/lib:/x".as_ref())),
            "/run/hw/python:/job/lib:/x"
        );
    }

    #[test]
    fn written_bootstrap_has_every_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = write_bootstrap(&tmp.path().join("python")).expect("written");
        for (name, text) in BOOTSTRAP_FILES {
            assert_eq!(
                &std::fs::read_to_string(dir.join(name)).expect("read"),
                text
            );
        }
    }
}
