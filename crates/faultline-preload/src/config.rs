//! The preload's settings, read once per process from the environment:
//!
//! | variable | meaning |
//! |---|---|
//! | `FAULTLINE_FILES` | colon-separated glob patterns of absolute paths; a file mapping whose file matches is served by faultline. Unset or empty: the library does nothing |
//! | `FAULTLINE_BUDGET` | the memory budget: bytes, or a number with `K`, `M` or `G` (binary units); default faultline's |
//! | `FAULTLINE_WORKERS` | fault workers; default faultline's |
//! | `FAULTLINE_FAULT_MODE` | `workers` (default) or `in-thread`: faults served by the faulting thread (faster; a `read(2)` or other system call into a page not yet mapped fails with `EFAULT` instead of being served) |
//! | `FAULTLINE_PRIVATE_DIR` | the overlay directory of private writable mappings (`private_file.rs`; default `/var/tmp`) |
//! | `FAULTLINE_ANON_MIN` | a size: private anonymous mappings at least this large are served too (`anonymous.rs`); unset: none |
//! | `FAULTLINE_STORE` | where served anonymous mappings' evicted pages go: `redis://host:port/` (a Redis server), or unset for an overlay file in `FAULTLINE_PRIVATE_DIR` |
//! | `FAULTLINE_PRELOAD_REPORT` | non-empty: one line of counts on stderr at exit |
//! | `FAULTLINE_LOG` | a `tracing` filter for faultline's warnings on stderr (default `warn`) |
//!
//! A setting that cannot be read is one line on stderr, and the program
//! runs on the kernel's mmap. Invariant: read once (a `OnceLock`). Locks:
//! none.

use glob::{MatchOptions, Pattern};
use std::path::Path;
use std::sync::OnceLock;

/// What the environment asks for.
#[derive(Debug)]
pub(crate) struct Settings {
    files: Vec<Pattern>,
    pub(crate) budget: Option<usize>,
    pub(crate) workers: Option<usize>,
    /// Faults served by the faulting thread (`FAULTLINE_FAULT_MODE=in-thread`).
    pub(crate) in_thread: bool,
    pub(crate) report: bool,
    /// Private anonymous mappings at least this large are served.
    pub(crate) anon_min: Option<usize>,
    /// Where their evicted pages go.
    pub(crate) anon_store: AnonStore,
}

/// Where served anonymous mappings' evicted pages go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AnonStore {
    /// An overlay file of each mapping's own (`FAULTLINE_PRIVATE_DIR`).
    Overlay,
    /// A Redis server.
    Redis(String),
}

/// A setting that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum ConfigError {
    #[error("FAULTLINE_BUDGET={0:?} is not a size (bytes, or a number with K, M or G)")]
    Budget(String),
    #[error("FAULTLINE_WORKERS={0:?} is not a positive number")]
    Workers(String),
    #[error("FAULTLINE_FILES pattern {pattern:?} is not a glob pattern: {why}")]
    Pattern { pattern: String, why: String },
    #[error("FAULTLINE_FILES pattern {0:?} is not an absolute path")]
    Relative(String),
    #[error("FAULTLINE_FAULT_MODE={0:?} is neither `workers` nor `in-thread`")]
    FaultMode(String),
    #[error("FAULTLINE_ANON_MIN={0:?} is not a size (bytes, or a number with K, M or G)")]
    AnonMin(String),
    #[error("FAULTLINE_STORE={0:?} is not a store (redis://host:port/)")]
    Store(String),
}

/// Paths match component by component: `*` never crosses a `/`.
const MATCHING: MatchOptions = MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

impl Settings {
    /// Reads the settings from `var` (the environment, or a test's map);
    /// `Ok(None)` when neither `FAULTLINE_FILES` nor `FAULTLINE_ANON_MIN`
    /// is set.
    pub(crate) fn read(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Settings>, ConfigError> {
        let anon_min = match var("FAULTLINE_ANON_MIN").filter(|b| !b.trim().is_empty()) {
            Some(b) => Some(parse_size(&b).ok_or(ConfigError::AnonMin(b))?),
            None => None,
        };
        let files = var("FAULTLINE_FILES").filter(|f| !f.trim().is_empty());
        if files.is_none() && anon_min.is_none() {
            return Ok(None);
        }
        let files = files.unwrap_or_default();
        let anon_store = match var("FAULTLINE_STORE").filter(|s| !s.trim().is_empty()) {
            Some(s) if s.trim().starts_with("redis://") => AnonStore::Redis(s.trim().to_string()),
            Some(s) => return Err(ConfigError::Store(s)),
            None => AnonStore::Overlay,
        };
        let mut patterns = Vec::new();
        for p in files.split(':').map(str::trim).filter(|p| !p.is_empty()) {
            if !p.starts_with('/') {
                return Err(ConfigError::Relative(p.into()));
            }
            patterns.push(Pattern::new(p).map_err(|e| ConfigError::Pattern {
                pattern: p.into(),
                why: e.msg.into(),
            })?);
        }
        let budget = match var("FAULTLINE_BUDGET").filter(|b| !b.trim().is_empty()) {
            Some(b) => Some(parse_size(&b).ok_or(ConfigError::Budget(b))?),
            None => None,
        };
        let workers = match var("FAULTLINE_WORKERS").filter(|w| !w.trim().is_empty()) {
            Some(w) => Some(
                w.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(ConfigError::Workers(w))?,
            ),
            None => None,
        };
        let in_thread = match var("FAULTLINE_FAULT_MODE").as_deref().map(str::trim) {
            None | Some("") | Some("workers") => false,
            Some("in-thread") => true,
            Some(other) => return Err(ConfigError::FaultMode(other.into())),
        };
        Ok(Some(Settings {
            files: patterns,
            budget,
            workers,
            report: var("FAULTLINE_PRELOAD_REPORT").is_some_and(|r| !r.is_empty()),
            in_thread,
            anon_min,
            anon_store,
        }))
    }

    /// Whether a mapping of the file at `path` is served.
    pub(crate) fn serves(&self, path: &Path) -> bool {
        if path.starts_with(faultline::published::STATS_DIR) {
            return false;
        }
        self.files
            .iter()
            .any(|p| p.matches_path_with(path, MATCHING))
    }
}

/// `"64M"` → 64 MiB; bytes, or a number with `K`, `M`, `G` (optionally
/// followed by `iB` or `B`).
pub(crate) fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last()? {
        'K' | 'k' => (&t[..t.len() - 1], 10),
        'M' | 'm' => (&t[..t.len() - 1], 20),
        'G' | 'g' => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: usize = digits.trim().parse().ok()?;
    n.checked_mul(1usize << shift).filter(|&b| b > 0)
}

static SETTINGS: OnceLock<Option<Settings>> = OnceLock::new();

/// The process's settings; `None` when the library is off (unset, or a
/// setting that cannot be used: said once on stderr).
pub(crate) fn settings() -> Option<&'static Settings> {
    SETTINGS
        .get_or_init(|| match Settings::read(|k| std::env::var(k).ok()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("faultline-preload: {e}; file mappings go to the kernel");
                None
            }
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(pairs: &[(&str, &str)]) -> Result<Option<Settings>, ConfigError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::read(|k| m.get(k).cloned())
    }

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("2g"), Some(2 << 30));
        assert_eq!(parse_size("16K"), Some(16 << 10));
        assert_eq!(parse_size("0"), None);
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn unset_files_turn_the_library_off() {
        assert!(read(&[]).expect("no error").is_none());
        assert!(read(&[("FAULTLINE_FILES", " ")])
            .expect("no error")
            .is_none());
    }

    #[test]
    fn patterns_match_whole_components() {
        let s = read(&[("FAULTLINE_FILES", "/data/*.db:/srv/x/**/*.mdb")])
            .expect("valid")
            .expect("on");
        assert!(s.serves(Path::new("/data/big.db")));
        assert!(!s.serves(Path::new("/data/sub/big.db")));
        assert!(s.serves(Path::new("/srv/x/a/b/data.mdb")));
        assert!(!s.serves(Path::new("/data/big.db-journal")));
    }

    #[test]
    fn bad_settings_are_named() {
        assert_eq!(
            read(&[("FAULTLINE_FILES", "data/*.db")]).err(),
            Some(ConfigError::Relative("data/*.db".into()))
        );
        assert_eq!(
            read(&[("FAULTLINE_FILES", "/d/*"), ("FAULTLINE_BUDGET", "big")]).err(),
            Some(ConfigError::Budget("big".into()))
        );
        assert_eq!(
            read(&[("FAULTLINE_FILES", "/d/*"), ("FAULTLINE_WORKERS", "0")]).err(),
            Some(ConfigError::Workers("0".into()))
        );
        assert!(matches!(
            read(&[("FAULTLINE_FILES", "/d/[")]).err(),
            Some(ConfigError::Pattern { .. })
        ));
        assert_eq!(
            read(&[("FAULTLINE_ANON_MIN", "some")]).err(),
            Some(ConfigError::AnonMin("some".into()))
        );
        assert_eq!(
            read(&[
                ("FAULTLINE_ANON_MIN", "64M"),
                ("FAULTLINE_STORE", "memcached://x")
            ])
            .err(),
            Some(ConfigError::Store("memcached://x".into()))
        );
    }

    #[test]
    fn fault_modes_are_named() {
        let on = |m: &str| read(&[("FAULTLINE_FILES", "/d/*"), ("FAULTLINE_FAULT_MODE", m)]);
        assert!(!on("workers").expect("valid").expect("on").in_thread);
        assert!(on("in-thread").expect("valid").expect("on").in_thread);
        assert_eq!(
            on("fast").err(),
            Some(ConfigError::FaultMode("fast".into()))
        );
    }

    #[test]
    fn anonymous_mappings_alone_turn_the_library_on() {
        let s = read(&[("FAULTLINE_ANON_MIN", "64M")])
            .expect("valid")
            .expect("on");
        assert_eq!(s.anon_min, Some(64 << 20));
        assert_eq!(s.anon_store, AnonStore::Overlay);
        assert!(!s.serves(Path::new("/data/big.db")));
        let r = read(&[
            ("FAULTLINE_ANON_MIN", "1M"),
            ("FAULTLINE_STORE", "redis://127.0.0.1:6379/"),
        ])
        .expect("valid")
        .expect("on");
        assert_eq!(
            r.anon_store,
            AnonStore::Redis("redis://127.0.0.1:6379/".into())
        );
    }
}
