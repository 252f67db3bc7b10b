//! No import circle in the workspace: within each crate, the top-level modules (the
//! files and folders of `src/`) depend on one another only one way. A path
//! `crate::x::...` (or a name the crate root re-exports from `x`) in module `m` is an
//! arrow from `m` to `x`; comments and test code (`#[cfg(test)]` modules, inline or in
//! files of their own) are left out. The arrows must not close a loop.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate's source: each file's path under `src/` (with `/`) and its text.
type Sources = BTreeMap<String, String>;

/// The text without comment lines and `#[cfg(test)]` modules written inline.
fn without_tests(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut kept = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        let inline_test_mod = line.starts_with("#[cfg(test)]")
            && lines.get(i + 1).is_some_and(|next| {
                let next = next.trim();
                (next.starts_with("mod ") || next.starts_with("pub mod ")) && next.ends_with('{')
            });
        if inline_test_mod {
            let mut depth = 0i64;
            let mut j = i + 1;
            while j < lines.len() {
                depth += lines[j].matches('{').count() as i64;
                depth -= lines[j].matches('}').count() as i64;
                if depth <= 0 {
                    break;
                }
                j += 1;
            }
            i = j + 1;
            continue;
        }
        if !line.starts_with("//") {
            kept.push(lines[i]);
        }
        i += 1;
    }
    kept.join("\n")
}

/// The files of modules declared `#[cfg(test)] mod name;`: `name.rs` and `name/`
/// beside or under the declaring file.
fn test_module_paths(sources: &Sources) -> Vec<String> {
    let mut paths = Vec::new();
    for (path, text) in sources {
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for pair in lines.windows(2) {
            let Some(name) = pair[1]
                .strip_prefix("mod ")
                .or_else(|| pair[1].strip_prefix("pub(crate) mod "))
                .and_then(|rest| rest.strip_suffix(';'))
            else {
                continue;
            };
            if !pair[0].starts_with("#[cfg(test)]") {
                continue;
            }
            let dir = match path.rsplit_once('/') {
                Some((dir, "mod.rs")) => format!("{dir}/"),
                Some((dir, file)) => format!("{dir}/{}/", file.trim_end_matches(".rs")),
                None if path == "lib.rs" || path == "main.rs" => String::new(),
                None => format!("{}/", path.trim_end_matches(".rs")),
            };
            paths.push(format!("{dir}{name}.rs"));
            paths.push(format!("{dir}{name}/"));
        }
    }
    paths
}

/// The names the crate root re-exports (`pub use x::{a, b};`, `pub use x::a;`), each
/// with the module it comes from.
fn reexports(root: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let mut rest = root;
    while let Some(at) = rest.find("pub use ") {
        rest = &rest[at + "pub use ".len()..];
        let end = rest.find(';').unwrap_or(rest.len());
        let item = &rest[..end];
        if let Some((module, names_part)) = item.split_once("::") {
            let module = module.trim();
            for name in names_part
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .filter(|n| !n.is_empty() && *n != "as" && *n != "self")
            {
                names.insert(name.to_owned(), module.to_owned());
            }
        }
    }
    names
}

/// The arrows between the top-level modules of one crate.
fn arrows(sources: &Sources) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<String> = sources
        .keys()
        .filter_map(|p| match p.split_once('/') {
            Some((dir, _)) => Some(dir.to_owned()),
            None => p
                .strip_suffix(".rs")
                .filter(|m| *m != "lib" && *m != "main")
                .map(str::to_owned),
        })
        .collect();
    let root = ["lib.rs", "main.rs"]
        .iter()
        .filter_map(|r| sources.get(*r))
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("\n");
    let reexported = reexports(&root);
    let tests = test_module_paths(sources);
    let mut arrows: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in sources {
        if tests
            .iter()
            .any(|t| path == t || (t.ends_with('/') && path.starts_with(t)))
        {
            continue;
        }
        let from = match path.split_once('/') {
            Some((dir, _)) => dir.to_owned(),
            None => match path.strip_suffix(".rs") {
                Some("lib" | "main") | None => continue,
                Some(m) => m.to_owned(),
            },
        };
        let code = without_tests(text);
        let mut rest = code.as_str();
        while let Some(at) = rest.find("crate::") {
            let macro_path = rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c == '$' || c.is_alphanumeric() || c == '_');
            rest = &rest[at + "crate::".len()..];
            if macro_path {
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let to = if modules.contains(&name) {
                Some(name)
            } else {
                reexported.get(&name).cloned()
            };
            if let Some(to) = to.filter(|to| *to != from && modules.contains(to)) {
                arrows.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    arrows
}

/// A loop of arrows, as the modules along it (the first again at the end), if any.
fn a_loop(arrows: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        arrows: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|m| m == at) {
            let mut found = path[start..].to_vec();
            found.push(at.to_owned());
            return Some(found);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at.to_owned());
        for next in arrows.get(at).into_iter().flatten() {
            if let Some(found) = visit(next, arrows, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(at.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    arrows
        .keys()
        .find_map(|m| visit(m, arrows, &mut Vec::new(), &mut done))
}

fn read_sources(src: &Path) -> Sources {
    fn walk(dir: &Path, src: &Path, out: &mut Sources) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{} cannot be read: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, src, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(src)
                    .expect("under src")
                    .to_string_lossy()
                    .replace('\\', "/");
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{} cannot be read: {e}", path.display()));
                out.insert(rel, text);
            }
        }
    }
    let mut out = Sources::new();
    walk(src, src, &mut out);
    out
}

#[test]
fn no_crate_of_the_workspace_has_an_import_circle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    let mut circles = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&crates)
        .expect("the crates folder")
        .map(|e| e.expect("a directory entry").path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    dirs.sort();
    for src in dirs {
        let sources = read_sources(&src);
        checked += 1;
        if let Some(circle) = a_loop(&arrows(&sources)) {
            circles.push(format!("{}: {}", src.display(), circle.join(" -> ")));
        }
    }
    assert!(
        checked >= 10,
        "only {checked} crates found under {}",
        crates.display()
    );
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

fn sources(files: &[(&str, &str)]) -> Sources {
    files
        .iter()
        .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
        .collect()
}

#[test]
fn a_circle_is_found_through_paths_and_root_reexports_but_not_through_tests() {
    let looped = sources(&[
        ("lib.rs", "mod a;\nmod b;\npub use b::Thing;\n"),
        ("a.rs", "use crate::Thing;\n"),
        ("b/mod.rs", "mod c;\n"),
        ("b/c.rs", "pub fn f() -> crate::a::X { todo!() }\n"),
    ]);
    assert_eq!(
        a_loop(&arrows(&looped)),
        Some(vec!["a".to_owned(), "b".to_owned(), "a".to_owned()])
    );
    let tests_only = sources(&[
        ("lib.rs", "mod a;\nmod b;\n#[cfg(test)]\nmod t;\n"),
        ("a.rs", "// crate::b::f is not a use\nuse crate::b::f;\n"),
        (
            "b.rs",
            "pub fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::a::g;\n}\n",
        ),
        ("t.rs", "use crate::a::g;\nuse crate::b::f;\n"),
    ]);
    let found = arrows(&tests_only);
    assert_eq!(a_loop(&found), None);
    assert_eq!(found.get("a").map(|s| s.len()), Some(1), "{found:?}");
}
