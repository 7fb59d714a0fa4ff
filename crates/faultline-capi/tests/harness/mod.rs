//! Builds the C test programs in `tests/c/` with the system's `cc` against
//! this workspace's `libfaultline.so` / `libumap.so` and runs them, each in
//! a scratch directory of its own. Shared by the two packages' tests
//! (`#[path]`-included); nothing here is global.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory cargo put this build's libraries in (the test binary runs
/// from `<target>/<profile>/deps`, the libraries are one level up).
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("<target>/<profile>")
        .to_path_buf()
}

/// `crates/faultline-capi`.
pub fn capi_dir() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    if here.ends_with("umap") {
        here.parent().expect("crates/faultline-capi").to_path_buf()
    } else {
        here.to_path_buf()
    }
}

/// A scratch directory for one test, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("faultline-capi-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Fails the test with the reason if this process cannot use userfaultfd
/// (the C programs would fail less clearly).
pub fn require_userfaultfd() {
    let ok = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
        .is_ok();
    assert!(
        ok,
        "this test needs userfaultfd: run as root or with read-write access to /dev/userfaultfd"
    );
}

/// Builds the C libraries (`cargo test` builds a package's library only
/// when its tests can link it, which they cannot a `cdylib`): the same
/// profile and target directory as this test binary.
pub fn build_libraries() {
    let target = lib_dir().parent().expect("<target>").to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "-q",
        "-p",
        "faultline-capi",
        "-p",
        "faultline-umap",
    ])
    .env("CARGO_TARGET_DIR", &target)
    .current_dir(capi_dir());
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("run cargo build for the C libraries");
    assert!(
        status.success(),
        "cargo build of libfaultline.so / libumap.so failed"
    );
}

/// Compiles `tests/c/<name>.c` into `out`, linked with `-l<lib>` (built
/// first).
pub fn compile(name: &str, lib: &str, out: &Path) -> PathBuf {
    compile_file(
        &capi_dir().join("tests/c").join(format!("{name}.c")),
        lib,
        out,
    )
}

/// Compiles the C file `src` into `out` (named after it), linked with
/// `-l<lib>` (built first).
pub fn compile_file(src: &Path, lib: &str, out: &Path) -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(build_libraries);
    let name = src.file_stem().expect("a C file").to_string_lossy();
    let exe = out.join(&*name);
    let status = Command::new("cc")
        .args([
            "-std=gnu11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
        ])
        .arg("-I")
        .arg(capi_dir().join("include"))
        .arg("-o")
        .arg(&exe)
        .arg(src)
        .arg("-L")
        .arg(lib_dir())
        .arg(format!("-l{lib}"))
        .status()
        .expect("this test needs a C compiler: `cc` not found");
    assert!(status.success(), "cc {} failed", src.display());
    exe
}

/// Runs `exe` with `args` and `env`, the libraries on `LD_LIBRARY_PATH`;
/// fails the test with the program's output unless it exits 0, or if it
/// left a stats file of its managers behind (`/dev/shm/faultline/<pid>-*`).
pub fn run(exe: &Path, args: &[&str], env: &[(&str, String)]) -> String {
    let child = Command::new(exe)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("LD_LIBRARY_PATH", lib_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the C program");
    let pid = child.id();
    let out = child.wait_with_output().expect("the C program's output");
    let left: Vec<String> = std::fs::read_dir("/dev/shm/faultline")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{pid}-")))
        .collect();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{} {args:?} with {env:?} failed ({}):\n{text}",
        exe.display(),
        out.status
    );
    assert!(
        left.is_empty(),
        "{} left its stats files behind: /dev/shm/faultline/{left:?}",
        exe.display()
    );
    text
}
