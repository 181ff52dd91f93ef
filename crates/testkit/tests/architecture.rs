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

/// A crate's modules (by path: `commands::run`) and the modules of the same crate each one names outside its tests.
fn module_graph(src: &Path) -> Graph {
    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir)
            .expect("a source directory")
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    files(src, &mut paths);
    let module_of = |path: &Path| -> String {
        let rel = path
            .strip_prefix(src)
            .expect("under src")
            .with_extension("");
        let parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .filter(|p| p != "mod" && p != "lib" && p != "main")
            .collect();
        parts.join("::")
    };
    let modules: Vec<String> = paths.iter().map(|p| module_of(p)).collect();
    let mut graph = Graph::new();
    for (path, module) in paths.iter().zip(&modules) {
        let text = std::fs::read_to_string(path).expect("a source file");
        // Tests may use anything of their crate; comments name modules without importing them.
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let parent: Vec<&str> = module.split("::").collect();
        let parent = parent[..parent.len().saturating_sub(1)].join("::");
        let mut named = Vec::new();
        for (prefix, base) in [("crate::", String::new()), ("super::", parent)] {
            for piece in code.split(prefix).skip(1) {
                let segments: Vec<&str> = piece
                    .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .next()
                    .unwrap_or_default()
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .collect();
                // The longest module path the reference starts with.
                let target = (1..=segments.len()).rev().find_map(|n| {
                    let mut full: Vec<&str> = base.split("::").filter(|s| !s.is_empty()).collect();
                    full.extend(&segments[..n]);
                    let full = full.join("::");
                    modules.contains(&full).then_some(full)
                });
                if let Some(target) = target.filter(|t| t != module && !t.is_empty()) {
                    named.push(target);
                }
            }
        }
        named.sort();
        named.dedup();
        graph.insert(module.clone(), named);
    }
    graph
}

/// The modules of `graph` that lie on a circle of imports, each circle once.
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    // Two modules are on one circle when each reaches the other.
    let reaches = |from: &str| -> std::collections::BTreeSet<String> {
        let mut seen = std::collections::BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, std::collections::BTreeSet<String>> =
        graph.keys().map(|m| (m, reaches(m))).collect();
    let mut found: Vec<Vec<String>> = Vec::new();
    for m in graph.keys() {
        if !reach[m].contains(m) || found.iter().any(|c| c.contains(m)) {
            continue;
        }
        let circle: Vec<String> = graph
            .keys()
            .filter(|o| reach[m].contains(*o) && reach[*o].contains(m))
            .cloned()
            .collect();
        found.push(circle);
    }
    found
}

#[test]
fn no_crate_has_a_circle_of_module_imports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut knots = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .flatten()
    {
        let src = entry.path().join("src");
        if !src.is_dir() {
            continue;
        }
        let graph = module_graph(&src);
        checked += graph.len();
        for circle in circles(&graph) {
            knots.push(format!(
                "{}: {}",
                entry.file_name().to_string_lossy(),
                circle.join(" <-> ")
            ));
        }
    }
    assert!(checked > 100, "read {checked} modules");
    knots.sort();
    assert!(
        knots.is_empty(),
        "modules that import each other (move what both need into one of them or a third):\n{}",
        knots.join("\n")
    );
}

#[test]
fn the_circle_finder_finds_a_circle_and_only_it() {
    let graph: Graph = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
        ("e", vec![]),
    ]
    .into_iter()
    .map(|(m, deps)| {
        (
            m.to_string(),
            deps.into_iter().map(str::to_string).collect(),
        )
    })
    .collect();
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
}
