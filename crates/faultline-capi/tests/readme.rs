//! The C layer's README, run as written: its `c` example is compiled
//! (inside a `main` that opens a scratch file for its `fd` and `len`) and
//! run against `libfaultline.so`; its `sh` example builds a Umap program
//! with the README's own `cc` line (a program of `tests/c/` in place of
//! `my_umap_program.c`, this build's libraries in place of
//! `target/release`) and runs it with the README's environment. Needs
//! userfaultfd and `cc`.

mod harness;

use std::path::Path;
use std::process::Command;

fn readme() -> String {
    std::fs::read_to_string(harness::capi_dir().join("README.md")).expect("the C layer's README")
}

/// The fenced blocks of language `lang`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(&fence) {
        rest = &rest[i + fence.len()..];
        let end = rest.find("```").expect("the block closes");
        out.push(rest[..end].to_string());
        rest = &rest[end..];
    }
    out
}

#[test]
fn the_c_example_compiles_and_runs() {
    harness::require_userfaultfd();
    let examples = blocks(&readme(), "c");
    assert_eq!(examples.len(), 1, "the README's C examples");
    let dir = harness::Scratch::new("readme-c");
    // Includes go to the top; the rest runs inside main with `fd` and `len`.
    let (includes, body): (Vec<&str>, Vec<&str>) =
        examples[0].lines().partition(|l| l.starts_with("#include"));
    let src = format!(
        "#include <fcntl.h>\n#include <stdbool.h>\n#include <stddef.h>\n{}\n\
         int main(int argc, char **argv) {{\n\
         \x20   if (argc < 2) return 2;\n\
         \x20   int fd = open(argv[1], O_RDWR);\n\
         \x20   if (fd < 0) return 3;\n\
         \x20   size_t len = 4u << 20;\n\
         {}\n\
         \x20   (void)p;\n\
         \x20   return 0;\n}}\n",
        includes.join("\n"),
        body.join("\n")
    );
    std::fs::write(dir.0.join("readme_example.c"), src).expect("write the example");
    let exe = harness::compile_file(&dir.0.join("readme_example.c"), "faultline", &dir.0);
    let data = dir.0.join("data");
    std::fs::write(&data, vec![7u8; 4 << 20]).expect("the example's file");
    harness::run(&exe, &[data.to_str().expect("utf-8 path")], &[]);
}

#[test]
fn the_umap_build_line_builds_and_runs_a_umap_program() {
    harness::require_userfaultfd();
    let sh = blocks(&readme(), "sh");
    let cc_block = sh
        .iter()
        .find(|b| b.contains("my_umap_program.c"))
        .expect("the README's Umap build block");
    let dir = harness::Scratch::new("readme-umap");
    harness::build_libraries();
    let lib = harness::lib_dir();
    let program = harness::capi_dir().join("tests/c/random_reader.c");
    // The README's lines, joined where they continue, with the paths of
    // this build and checkout.
    let text = cc_block.replace("\\\n", " ");
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let compile = lines.next().expect("the cc line");
    let run = lines.next().expect("the run line");
    let subst = |l: &str| {
        l.replace("my_umap_program.c", program.to_str().expect("utf-8"))
            .replace(
                "-o my_umap_program",
                &format!("-o {}/my_umap_program", dir.0.display()),
            )
            .replace(
                "./my_umap_program",
                &format!("{}/my_umap_program", dir.0.display()),
            )
            .replace("target/release", lib.to_str().expect("utf-8"))
            .replace(
                "crates/faultline-capi/include",
                harness::capi_dir().join("include").to_str().expect("utf-8"),
            )
    };
    let status = Command::new("sh")
        .arg("-c")
        .arg(subst(compile))
        .status()
        .expect("sh");
    assert!(
        status.success(),
        "the README's cc line failed: {}",
        subst(compile)
    );
    // random_reader takes its data directory, MiB and reads.
    let run = format!("{} {} 16 2000", subst(run), dir.0.display());
    let out = Command::new("sh").arg("-c").arg(&run).output().expect("sh");
    assert!(
        out.status.success(),
        "the README's run line failed: {run}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(Path::new(&format!("{}/my_umap_program", dir.0.display())).exists());
}
