//! The architecture, checked: every module of `src/` imports only from
//! modules below it in [`LAYERS`] (no cycles, no upward imports), the page
//! move ioctl is called from one module, no source file is over 500 lines
//! before its tests and no function over 80 lines without a reason written
//! beside it (in this crate and in `faultline-sys`). Reads the source tree;
//! needs nothing else.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The top-level modules of `src/`, lowest layer first. A module may name
/// (`crate::x`) only modules before it.
const LAYERS: &[&str] = &[
    "sync",
    "kick",
    "memops",
    "dirty",
    "config",
    "store",
    "frame",
    "error",
    "exclusive",
    "objects",
    "locks",
    "nesting",
    "own_discards",
    "drop_rechecks",
    "rereads",
    "stats",
    "region",
    "copyjob",
    "core",
    "pagemove",
    "fill",
    "writeback",
    "discard",
    "budget",
    "overhead",
    "publish",
    "reclaim",
    "migrate",
    "fault",
    "api",
];

/// The only module that may call `move_pages` (`UFFDIO_MOVE`).
const MOVER: &str = "pagemove";

const MAX_FILE_LINES: usize = 500;
const MAX_FN_LINES: usize = 80;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read src dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`None` for `lib.rs` and files
/// outside this crate).
fn module_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src()).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.trim_end_matches(".rs").to_string();
    (name != "lib").then_some(name)
}

/// The code of `text` without comments (line and doc comments) and string
/// literals, so that only real paths are seen.
fn code_only(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut kept = String::new();
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if !in_str && c == '/' && chars.get(i + 1) == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' {
                in_str = !in_str;
            } else if !in_str {
                kept.push(c);
            }
            prev = c;
            i += 1;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// The top-level modules named by `crate::` paths in `code`, including
/// grouped imports (`use crate::{a::X, b};`).
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        let name = ident(&group[j..]);
                        if !name.is_empty() {
                            refs.insert(name);
                        }
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(after);
            if !name.is_empty() {
                refs.insert(name);
            }
        }
        rest = &rest[i + "crate::".len()..];
    }
    refs
}

#[test]
fn imports_point_down_the_layers() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut bad = Vec::new();
    for f in &files {
        let Some(m) = module_of(f) else { continue };
        let Some(mine) = rank(&m) else {
            bad.push(format!("{}: module `{m}` is not in LAYERS", f.display()));
            continue;
        };
        let code = code_only(&std::fs::read_to_string(f).expect("read"));
        for r in crate_refs(&code) {
            match rank(&r) {
                Some(theirs) if theirs < mine || r == m => {}
                Some(_) => bad.push(format!(
                    "{}: `{m}` imports `{r}`, a higher layer",
                    f.display()
                )),
                // Items re-exported at the crate root (crate::FaultError):
                // fine only if they are not a way around the layers, so
                // name the module instead.
                None => bad.push(format!(
                    "{}: `crate::{r}` names a root re-export; import it from its module",
                    f.display()
                )),
            }
        }
    }
    assert!(bad.is_empty(), "layer violations:\n{}", bad.join("\n"));
}

#[test]
fn only_pagemove_moves_pages() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let bad: Vec<String> = files
        .iter()
        .filter(|f| module_of(f).as_deref() != Some(MOVER))
        .filter(|f| code_only(&std::fs::read_to_string(f).expect("read")).contains(".move_pages("))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        bad.is_empty(),
        "UFFDIO_MOVE called outside {MOVER}: {bad:?}"
    );
}

#[test]
fn files_and_functions_stay_short() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    rust_files(&src().join("../../faultline-sys/src"), &mut files);
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        let body = lines
            .iter()
            .position(|l| l.trim() == "#[cfg(test)]" || l.starts_with("#[cfg(all(test,"))
            .unwrap_or(lines.len());
        if body > MAX_FILE_LINES {
            bad.push(format!("{}: {body} lines before its tests", f.display()));
        }
        bad.extend(long_functions(&lines[..body], f));
    }
    assert!(bad.is_empty(), "too long:\n{}", bad.join("\n"));
}

/// Functions of more than [`MAX_FN_LINES`] lines in `lines`, unless a
/// `// long:` comment just above the signature says why.
fn long_functions(lines: &[&str], f: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let is_fn = [
            "fn ",
            "pub fn ",
            "pub(crate) fn ",
            "pub(super) fn ",
            "unsafe fn ",
        ]
        .iter()
        .chain(
            [
                "pub unsafe fn ",
                "pub(crate) unsafe fn ",
                "const fn ",
                "pub const fn ",
            ]
            .iter(),
        )
        .any(|p| t.starts_with(p));
        if !is_fn || t.ends_with(';') {
            continue;
        }
        let indent = l.len() - t.len();
        let close = " ".repeat(indent) + "}";
        let Some(len) = lines[i..].iter().position(|x| *x == close) else {
            continue;
        };
        let reasoned = lines[i.saturating_sub(3)..i]
            .iter()
            .any(|x| x.trim_start().starts_with("// long:"));
        if len + 1 > MAX_FN_LINES && !reasoned {
            bad.push(format!(
                "{}:{}: {} lines: {}",
                f.display(),
                i + 1,
                len + 1,
                t
            ));
        }
    }
    bad
}

#[test]
fn the_checker_sees_grouped_and_plain_imports() {
    let code = code_only(
        "use crate::{core::Core, frame::{Frame, Pool}};\n\
         // use crate::api;\n\
         let x = crate::stats::Stats::new(); let s = \"crate::fault\";\n",
    );
    let refs: Vec<String> = crate_refs(&code).into_iter().collect();
    assert_eq!(refs, ["core", "frame", "stats"]);
}

/// Inside each folder module (`fault/`, `frame/`, ...), the files import
/// one another without a cycle: `super::x` and `crate::<folder>::x` paths
/// (outside comments) are the edges; `mod.rs`, the folder's shared
/// vocabulary, is not a node.
#[test]
fn folders_have_no_import_cycles() {
    let mut cycles = Vec::new();
    let mut folders: Vec<PathBuf> = std::fs::read_dir(src())
        .expect("read src")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_dir())
        .collect();
    folders.sort();
    for dir in folders {
        let folder = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
            .expect("read folder")
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            .filter_map(|p| {
                let stem = p.file_stem()?.to_str()?.to_string();
                (stem != "mod")
                    .then(|| (stem, code_only(&std::fs::read_to_string(&p).expect("read"))))
            })
            .collect();
        files.sort();
        let names: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
        let edges: Vec<Vec<usize>> = files
            .iter()
            .map(|(me, code)| {
                names
                    .iter()
                    .enumerate()
                    .filter(|(_, other)| *other != me)
                    .filter(|(_, other)| {
                        [
                            format!("super::{other}"),
                            format!("crate::{folder}::{other}"),
                        ]
                        .iter()
                        .any(|p| {
                            code.match_indices(p.as_str()).any(|(i, _)| {
                                !code[i + p.len()..]
                                    .starts_with(|c: char| c.is_alphanumeric() || c == '_')
                            })
                        })
                    })
                    .map(|(j, _)| j)
                    .collect()
            })
            .collect();
        // Depth-first search for a back edge.
        fn visit(
            n: usize,
            edges: &[Vec<usize>],
            state: &mut [u8],
            path: &mut Vec<usize>,
        ) -> Option<Vec<usize>> {
            state[n] = 1;
            path.push(n);
            for &m in &edges[n] {
                if state[m] == 1 {
                    let at = path.iter().position(|&x| x == m).unwrap_or(0);
                    let mut cycle = path[at..].to_vec();
                    cycle.push(m);
                    return Some(cycle);
                }
                if state[m] == 0 {
                    if let Some(c) = visit(m, edges, state, path) {
                        return Some(c);
                    }
                }
            }
            path.pop();
            state[n] = 2;
            None
        }
        let mut state = vec![0u8; names.len()];
        for n in 0..names.len() {
            if state[n] == 0 {
                if let Some(c) = visit(n, &edges, &mut state, &mut Vec::new()) {
                    let c: Vec<&str> = c.iter().map(|&i| names[i].as_str()).collect();
                    cycles.push(format!("{folder}/: {}", c.join(" -> ")));
                }
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "import cycles inside folders:\n{}",
        cycles.join("\n")
    );
}
