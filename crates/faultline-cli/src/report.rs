//! Benchmark reports: summaries of samples, the machine description, the
//! human table and the `--json` object (README, "Benchmarks").

use serde::Serialize;
use serde_json::{json, Value};

/// Median and spread of a set of samples.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// Summarizes `samples` (sorted in place). Empty input gives all zeros.
    pub fn of(samples: &mut [f64]) -> Summary {
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        if n == 0 {
            return Summary {
                n,
                median: 0.0,
                p10: 0.0,
                p90: 0.0,
                p99: 0.0,
                min: 0.0,
                max: 0.0,
            };
        }
        let q = |f: f64| samples[((n - 1) as f64 * f).round() as usize];
        Summary {
            n,
            median: q(0.5),
            p10: q(0.1),
            p90: q(0.9),
            p99: q(0.99),
            min: samples[0],
            max: samples[n - 1],
        }
    }
}

/// What the machine is, for the JSON header.
pub fn machine() -> Value {
    json!({
        "cpus": faultline_sys::host::online_cpus(),
        "cpu": faultline_sys::host::cpu_model(),
        "kernel": faultline_sys::host::kernel_release(),
        "memory_bytes": faultline_sys::host::physical_memory(),
        "thp": format!("{:?}", faultline_sys::host::thp_mode()),
        "cgroup": faultline_sys::cgroup::Hierarchy::find()
            .map_or_else(|e| e.to_string(), |h| h.version().to_string()),
    })
}

/// A finished benchmark: rows for JSON, and a table for people.
pub struct Report {
    pub bench: &'static str,
    pub config: Value,
    pub rows: Vec<Value>,
    pub headers: Vec<&'static str>,
    pub table: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn new(bench: &'static str, headers: Vec<&'static str>) -> Report {
        Report {
            bench,
            config: Value::Null,
            rows: Vec::new(),
            headers,
            table: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// The `--json` object.
    pub fn json(&self) -> Value {
        json!({
            "bench": self.bench,
            "machine": machine(),
            "config": self.config,
            "rows": self.rows,
            "notes": self.notes,
        })
    }

    /// Prints the JSON object (one line) or the table with its notes.
    pub fn print(&self, as_json: bool) -> anyhow::Result<()> {
        if as_json {
            println!("{}", serde_json::to_string(&self.json())?);
            return Ok(());
        }
        println!("{}", render_table(&self.headers, &self.table));
        for n in &self.notes {
            println!("{n}");
        }
        Ok(())
    }
}

/// Renders rows under headers, columns padded to their widest cell.
pub fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < width.len() {
                width[i] = width[i].max(c.len());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:>w$}", w = width[i]))
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    out.push_str(
        &width
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  "),
    );
    for r in rows {
        out.push('\n');
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_quantiles() {
        let mut v: Vec<f64> = (1..=101).rev().map(f64::from).collect();
        let s = Summary::of(&mut v);
        assert_eq!((s.n, s.median, s.min, s.max), (101, 51.0, 1.0, 101.0));
        assert_eq!((s.p10, s.p90, s.p99), (11.0, 91.0, 100.0));
        assert_eq!(Summary::of(&mut []).n, 0);
    }

    #[test]
    fn table_aligns() {
        let t = render_table(&["a", "bbb"], &[vec!["10".into(), "2".into()]]);
        assert_eq!(t, " a  bbb\n--  ---\n10    2");
    }
}
