//! docs/architecture.md lists each crate with the crates of ours it depends on; this keeps that list true to the
//! Cargo.toml files (a new crate or dependency must be written there too, and the layers read again).

use std::collections::BTreeMap;
use std::path::Path;

type Graph = BTreeMap<String, Vec<String>>;

/// The `hangwatch-*` entries of each crate's `[dependencies]` table.
fn graph_from_manifests(crates: &Path) -> Graph {
    let mut graph = Graph::new();
    for entry in std::fs::read_dir(crates).expect("crates/") {
        let dir = entry.expect("entry").path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a crate directory's name")
            .to_string();
        let mut in_dependencies = false;
        let mut deps = Vec::new();
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                in_dependencies = line == "[dependencies]";
                continue;
            }
            if in_dependencies {
                if let Some(rest) = line.strip_prefix("hangwatch-") {
                    let dep: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
                        .collect();
                    deps.push(dep);
                }
            }
        }
        deps.sort();
        graph.insert(name, deps);
    }
    graph
}

/// The block between the crate-graph markers of docs/architecture.md: `crate: dep dep ...` per line.
fn graph_from_doc(doc: &str) -> Graph {
    let block = doc
        .split("<!-- crate-graph:begin -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- crate-graph:end -->").next())
        .expect("docs/architecture.md has the crate-graph markers");
    block
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(name, deps)| {
            let mut deps: Vec<String> = deps.split_whitespace().map(str::to_string).collect();
            deps.sort();
            (name.trim().to_string(), deps)
        })
        .collect()
}

#[test]
fn the_crate_graph_in_docs_architecture_is_the_one_in_the_manifests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifests = graph_from_manifests(&root.join("crates"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("the doc");
    let documented = graph_from_doc(&doc);
    assert!(manifests.len() > 10, "found the crates: {manifests:?}");
    for (name, deps) in &manifests {
        assert_eq!(
            documented.get(name),
            Some(deps),
            "docs/architecture.md's line for `{name}` must be `{name}: {}`",
            deps.join(" ")
        );
    }
    for name in documented.keys() {
        assert!(
            manifests.contains_key(name),
            "docs/architecture.md lists `{name}`, which is not a crate"
        );
    }
}
