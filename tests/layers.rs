//! In each crate of the workspace (the core and the tools; the tools depend on the core and
//! never the other way, which cargo enforces), the top-level modules form no import
//! circle: each file's `crate::<module>` paths
//! (outside comments and its `#[cfg(test)]` tail) are edges between the module it lies in
//! and the module it names, and the graph of those edges must have no cycle. A circle
//! (the configuration importing an actor for a constant, say) fails here, naming the files
//! and lines of every edge in it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module → module it imports → where.
type Edges = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn rust_files(folder: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(folder).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
}

/// The top-level module of `path` (relative to `src`): its first component, without `.rs`.
fn module_of(relative: &Path) -> String {
    let first = relative.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

fn edges(source: &Path) -> Edges {
    let mut files = Vec::new();
    rust_files(source, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|file| module_of(file.strip_prefix(source).unwrap()))
        .collect();
    let mut edges = Edges::new();
    for file in &files {
        let relative = file.strip_prefix(source).unwrap();
        let name = relative.file_name().unwrap().to_string_lossy();
        if name.starts_with("tests")
            || relative
                .components()
                .any(|part| part.as_os_str() == "tests")
        {
            continue;
        }
        let from = module_of(relative);
        let text = std::fs::read_to_string(file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        for (number, line) in code.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for (at, _) in line.match_indices("crate::") {
                let rest = &line[at + "crate::".len()..];
                let to: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if to != from && modules.contains(&to) {
                    let place = format!("{}:{}", file.display(), number + 1);
                    edges
                        .entry(from.clone())
                        .or_default()
                        .entry(to)
                        .or_default()
                        .push(place);
                }
            }
        }
    }
    edges
}

/// A cycle through `start`, if the graph has one: the modules in order.
fn cycle_from(edges: &Edges, start: &str) -> Option<Vec<String>> {
    let mut path = vec![start.to_string()];
    let mut seen = BTreeSet::new();
    fn walk(
        edges: &Edges,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        let last = path.last().unwrap().clone();
        for next in edges
            .get(&last)
            .into_iter()
            .flat_map(|targets| targets.keys())
        {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(edges, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    walk(edges, start, &mut path, &mut seen).then_some(path)
}

#[test]
fn the_top_level_modules_form_no_import_circle() {
    // Each crate, with an edge the scan must find in it (else it scanned nothing).
    for (crate_source, from, to) in [
        ("crates/core/src", "actors", "directory"),
        ("crates/tools/src", "bench", "workload"),
    ] {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(crate_source);
        let edges = edges(&source);
        assert!(
            edges
                .get(from)
                .is_some_and(|targets| targets.contains_key(to)),
            "the scan of {crate_source} found no edge {from} -> {to}: {edges:#?}"
        );
        for start in edges.keys() {
            if let Some(cycle) = cycle_from(&edges, start) {
                let mut report = format!(
                    "import circle in {crate_source}: {} -> {start}\n",
                    cycle.join(" -> ")
                );
                for (from, to) in cycle.iter().zip(cycle.iter().skip(1).chain([start])) {
                    report.push_str(&format!("  {from} -> {to}: {:?}\n", edges[from][to]));
                }
                panic!("{report}");
            }
        }
    }
}
