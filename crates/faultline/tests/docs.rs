//! The documents, checked: every source file of `crates/faultline/src` is
//! named in the map of `docs/design.md` (a maintainer finds every module
//! there), and no document of the repository links outside it (a user has
//! only the repository): every relative Markdown link resolves to a file
//! or folder inside the repository, and none points into `../shared`.
//! Reads the source tree; needs nothing else.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if p.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "node_modules" {
                files(&p, ext, out);
            }
        } else if name.ends_with(ext) {
            out.push(p);
        }
    }
}

/// The map: the first fenced block after "## Map" in docs/design.md.
fn design_map() -> String {
    let design = std::fs::read_to_string(repo().join("docs/design.md")).expect("docs/design.md");
    let at = design.find("## Map").expect("a \"## Map\" section");
    let rest = &design[at..];
    let open = rest.find("```").expect("the map's code block");
    let body = &rest[open + 3..];
    let close = body.find("```").expect("the map's block closes");
    body[..close].to_string()
}

#[test]
fn every_module_is_in_the_design_map() {
    let map = design_map();
    let src = repo().join("crates/faultline/src");
    let mut rs = Vec::new();
    files(&src, ".rs", &mut rs);
    let mut missing = Vec::new();
    for f in rs {
        let rel = f.strip_prefix(&src).expect("under src");
        let stem = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = match (stem.as_str(), rel.parent()) {
            ("lib", _) => continue,
            // A folder module is named by its folder (`fault/`, `redis/`).
            ("mod", Some(dir)) => format!(
                "{}/",
                dir.file_name()
                    .map(|d| d.to_string_lossy().into_owned())
                    .unwrap_or_default()
            ),
            _ => format!("{stem}.rs"),
        };
        if !map.contains(&name) {
            missing.push(rel.display().to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "not in docs/design.md's map: {missing:?}"
    );
}

#[test]
fn no_document_links_outside_the_repository() {
    let root = repo();
    let mut md = Vec::new();
    files(&root, ".md", &mut md);
    assert!(md.len() >= 3, "found the documents: {md:?}");
    let mut bad = Vec::new();
    for f in &md {
        let text = std::fs::read_to_string(f).expect("a document");
        let dir = f.parent().expect("a folder");
        for (n, line) in text.lines().enumerate() {
            let at = format!("{}:{}", f.strip_prefix(&root).unwrap_or(f).display(), n + 1);
            if line.contains("../shared") {
                bad.push(format!("{at}: names ../shared"));
            }
            // Markdown links: ](target)
            let mut rest = line;
            while let Some(i) = rest.find("](") {
                rest = &rest[i + 2..];
                let Some(end) = rest.find(')') else { break };
                let target = rest[..end].split('#').next().unwrap_or("").trim();
                rest = &rest[end..];
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let resolved = dir.join(target);
                match resolved.canonicalize() {
                    Ok(p) if p.starts_with(&root) => {}
                    Ok(p) => bad.push(format!(
                        "{at}: {target} is outside the repository ({})",
                        p.display()
                    )),
                    Err(_) => bad.push(format!("{at}: {target} does not exist")),
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "links out of the repository:\n{}",
        bad.join("\n")
    );
}

/// The fenced blocks of language `lang` in `text`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    text.split(&fence)
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .map(str::to_string)
        .collect()
}

/// The READMEs' shell blocks run somewhere: the two commands at the top of
/// the README (and the C layer's build line) are run by CI as written; the
/// Python build block is the Python README's, which CI runs as written; the
/// `faultline stat` block runs in `faultline-cli`'s tests, the C layer's
/// Umap build line in `faultline-capi`'s (`tests/readme.rs`), and every
/// block of the preload library's README in `faultline-preload`'s
/// (`tests/readme.rs`, which runs them all).
#[test]
fn every_readme_shell_block_is_run() {
    let root = repo();
    let ci = std::fs::read_to_string(root.join(".ci/run")).expect(".ci/run");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let py =
        std::fs::read_to_string(root.join("crates/faultline-py/README.md")).expect("py README");
    let capi =
        std::fs::read_to_string(root.join("crates/faultline-capi/README.md")).expect("C README");
    let top = &blocks(&readme, "sh")[0];
    let commands: Vec<&str> = top
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(
        commands.len(),
        2,
        "the README opens with two commands: {top}"
    );
    for c in &commands {
        assert!(ci.contains(c), ".ci/run does not run the README's `{c}`");
    }
    let py_block = &blocks(&py, "sh")[0];
    assert!(ci.contains("crates/faultline-py/README.md") && ci.contains("py-readme.sh"));
    let readme_py = blocks(&readme, "sh")
        .into_iter()
        .find(|b| b.contains("maturin"))
        .expect("the README's Python build block");
    assert_eq!(&readme_py, py_block, "the two Python build blocks differ");
    for b in blocks(&readme, "sh") {
        let known = b == *top || b == readme_py || b.contains("faultline stat");
        assert!(known, "a README shell block no test runs:\n{b}");
    }
    for b in blocks(&capi, "sh") {
        let known = b.contains("my_umap_program.c")
            || b.lines().next().is_some_and(|l| ci.contains(l.trim()));
        assert!(known, "a C README shell block no test runs:\n{b}");
    }
    let others: Vec<String> = blocks(&py, "sh").into_iter().skip(1).collect();
    assert!(
        others.is_empty(),
        "Python README shell blocks no test runs: {others:?}"
    );
    let preload_test =
        std::fs::read_to_string(root.join("crates/faultline-preload/tests/readme.rs"))
            .expect("the preload README's test");
    assert!(
        preload_test.contains("include_str!") || preload_test.contains("\"README.md\""),
        "crates/faultline-preload/tests/readme.rs no longer reads the preload README"
    );
}
