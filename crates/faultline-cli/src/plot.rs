//! Figures of the experiments: `faultline bench <name> --plot FILE.png` and
//! `faultline plot BENCH.json -o FILE.png` draw each experiment's rows the
//! way its seed shows them (lines against a swept parameter, or grouped
//! bars), with `plotters`' bitmap backend: PNG, [`WIDTH`] x [`HEIGHT`]
//! pixels. Text uses a TrueType font found on the machine at run time
//! (DejaVu Sans or Liberation Sans, else whatever `fc-match sans` names).

use anyhow::{anyhow, bail, Context};
use plotters::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Size of every figure, in pixels.
pub const WIDTH: u32 = 1280;
/// Size of every figure, in pixels.
pub const HEIGHT: u32 = 720;

#[derive(Debug, Clone, clap::Args)]
pub struct PlotOpts {
    /// A report saved from `faultline bench <name> --json`.
    pub json: PathBuf,
    /// The PNG file to write.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

/// One panel of a figure.
enum Panel {
    /// `y` against the swept `x`, one line per series.
    Lines {
        filter: fn(&Value) -> bool,
        x: &'static str,
        log_x: bool,
        y: &'static str,
        series: &'static [&'static str],
        x_label: &'static str,
        y_label: &'static str,
    },
    /// Grouped bars: one group per category, one bar per series, with a
    /// whisker up to `whisker` if given.
    Bars {
        filter: fn(&Value) -> bool,
        category: &'static [&'static str],
        series: &'static [&'static str],
        y: &'static str,
        whisker: Option<&'static str>,
        y_label: &'static str,
    },
}

fn any(_: &Value) -> bool {
    true
}

/// The panels of experiment `bench`'s figure and its title.
fn figure(bench: &str) -> Option<(&'static str, Vec<Panel>)> {
    Some(match bench {
        "clear-order" => (
            "anon-w-seq: fill order",
            vec![Panel::Bars {
                filter: any,
                category: &["order"],
                series: &["writers", "pressure"],
                y: "gb_per_s",
                whisker: None,
                y_label: "GB/s written (median)",
            }],
        ),
        "alloc" => (
            "frame allocator: cost per page",
            vec![Panel::Lines {
                filter: |r| r["kind"] == "alloc",
                x: "batch",
                log_x: true,
                y: "total_ns",
                series: &["mode", "threads"],
                x_label: "batch (frames, log scale)",
                y_label: "ns per page (alloc + free)",
            }],
        ),
        "lookup" => (
            "region lookup per cache",
            vec![
                Panel::Bars {
                    filter: any,
                    category: &["trace"],
                    series: &["cache"],
                    y: "ns_per_lookup",
                    whisker: None,
                    y_label: "ns per lookup",
                },
                Panel::Bars {
                    filter: any,
                    category: &["trace"],
                    series: &["cache"],
                    y: "hit_rate",
                    whisker: None,
                    y_label: "hit rate (fraction)",
                },
            ],
        ),
        "parallel-fault" => (
            "parallel faults on 2 MiB pages",
            vec![Panel::Lines {
                filter: any,
                x: "threads",
                log_x: false,
                y: "seconds",
                series: &["locks", "store_latency_us"],
                x_label: "threads",
                y_label: "seconds to fault the region (median)",
            }],
        ),
        "migrate" => (
            "migration between pools",
            vec![Panel::Lines {
                filter: |r| r.get("gb_per_s").is_some(),
                x: "threads",
                log_x: false,
                y: "gb_per_s",
                series: &["case", "copy"],
                x_label: "copy threads",
                y_label: "GB/s (median)",
            }],
        ),
        "fault" => (
            "first-touch fault latency",
            vec![Panel::Bars {
                filter: any,
                category: &["page", "access"],
                series: &["system", "mode"],
                y: "median_us",
                whisker: Some("p99_us"),
                y_label: "µs per fault (bar: p50, whisker: p99)",
            }],
        ),
        "out-of-core" => (
            "out-of-core: file 4x the memory",
            vec![Panel::Bars {
                filter: any,
                category: &["pattern"],
                series: &["system", "hint", "io", "mode"],
                y: "ops_per_s",
                whisker: None,
                y_label: "page operations per second",
            }],
        ),
        "far-memory" => (
            "far memory: a set 4x the budget",
            vec![Panel::Bars {
                filter: |r| r["system"] != "redis-raw",
                category: &["pattern"],
                series: &["system"],
                y: "ops_per_s",
                whisker: None,
                y_label: "page operations per second",
            }],
        ),
        "demo" => (
            "faultline demo",
            vec![Panel::Lines {
                filter: any,
                x: "t_s",
                log_x: false,
                y: "ops_per_s",
                series: &["phase"],
                x_label: "time (s)",
                y_label: "operations per second",
            }],
        ),
        _ => return None,
    })
}

/// `faultline plot BENCH.json -o FILE.png`.
pub fn run_file(o: &PlotOpts) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&o.json)
        .with_context(|| format!("reading {}", o.json.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", o.json.display()))?;
    draw(&v, &o.output)?;
    eprintln!("figure written to {}", o.output.display());
    Ok(())
}

/// A TrueType font of the machine, loaded once and registered with plotters
/// as `sans-serif`.
fn font() -> anyhow::Result<()> {
    static FONT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    FONT.get_or_init(|| {
        let mut candidates: Vec<PathBuf> = [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
            "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        if let Ok(out) = std::process::Command::new("fc-match")
            .args(["-f", "%{file}", "sans"])
            .output()
        {
            candidates.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
        }
        for path in candidates
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "ttf"))
        {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err("no TrueType font found (install fonts-dejavu-core)".into())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// A series or category label: the fields' values, numbers as `name=value`,
/// a true flag as its name (empty and `-` values left out, a value equal
/// to the one before once).
fn label(row: &Value, keys: &[&str]) -> String {
    let mut parts: Vec<String> = Vec::new();
    for k in keys {
        let part = match row.get(*k) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Bool(true)) => (*k).to_string(),
            Some(Value::Bool(false) | Value::Null) | None => continue,
            Some(v) => format!("{k}={v}"),
        };
        if !part.is_empty() && part != "-" && parts.last() != Some(&part) {
            parts.push(part);
        }
    }
    parts.join(" ")
}

/// Labels in first-seen order.
fn distinct(rows: &[&Value], keys: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in rows {
        let l = label(r, keys);
        if !out.contains(&l) {
            out.push(l);
        }
    }
    out
}

fn num(row: &Value, key: &str) -> Option<f64> {
    row.get(key)?.as_f64().filter(|v| v.is_finite())
}

/// Draws report `v` (a `faultline bench --json` object) into `file`.
pub fn draw(v: &Value, file: &Path) -> anyhow::Result<()> {
    let bench = v["bench"]
        .as_str()
        .ok_or_else(|| anyhow!("not a bench report: no \"bench\""))?;
    let (what, panels) = figure(bench).ok_or_else(|| anyhow!("no figure for bench {bench:?}"))?;
    let rows: Vec<&Value> = v["rows"]
        .as_array()
        .map(|r| r.iter().collect())
        .unwrap_or_default();
    if rows.is_empty() {
        bail!("the report has no rows");
    }
    font()?;
    let m = &v["machine"];
    let title = format!(
        "{what} — {}, {} CPUs, Linux {}",
        m["cpu"].as_str().unwrap_or("?"),
        m["cpus"],
        m["kernel"].as_str().unwrap_or("?")
    );
    let root = BitMapBackend::new(file, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&title, ("sans-serif", 22))?;
    let areas = root.split_evenly((1, panels.len()));
    for (panel, area) in panels.iter().zip(areas.iter()) {
        match panel {
            Panel::Lines {
                filter,
                x,
                log_x,
                y,
                series,
                x_label,
                y_label,
            } => {
                let rows: Vec<&Value> = rows.iter().copied().filter(|r| filter(r)).collect();
                lines(area, &rows, (x, *log_x, x_label), (y, y_label), series)?;
            }
            Panel::Bars {
                filter,
                category,
                series,
                y,
                whisker,
                y_label,
            } => {
                let rows: Vec<&Value> = rows.iter().copied().filter(|r| filter(r)).collect();
                bars(area, &rows, category, series, (y, *whisker, y_label))?;
            }
        }
    }
    root.present()?;
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn lines(
    area: &Area,
    rows: &[&Value],
    (x, log_x, x_label): (&str, bool, &str),
    (y, y_label): (&str, &str),
    series: &[&str],
) -> anyhow::Result<()> {
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| Some((num(r, x)?, num(r, y)?)))
        .collect();
    if pts.is_empty() {
        bail!("no rows with {x} and {y}");
    }
    let (x0, x1) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.0), a.1.max(p.0)));
    let y1 = pts.iter().fold(0f64, |a, p| a.max(p.1)) * 1.1;
    let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
    let y1 = if y1 > 0.0 { y1 } else { 1.0 };
    let mut b = ChartBuilder::on(area);
    b.margin(12).x_label_area_size(40).y_label_area_size(70);
    let names = distinct(rows, series);
    macro_rules! body {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .draw()?;
            for (i, name) in names.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                let mut p: Vec<(f64, f64)> = rows
                    .iter()
                    .filter(|r| label(r, series) == *name)
                    .filter_map(|r| Some((num(r, x)?, num(r, y)?)))
                    .collect();
                p.sort_by(|a, b| a.0.total_cmp(&b.0));
                chart
                    .draw_series(LineSeries::new(p.clone(), color.stroke_width(2)))?
                    .label(name.clone())
                    .legend(move |(lx, ly)| {
                        PathElement::new(vec![(lx, ly), (lx + 20, ly)], color.stroke_width(2))
                    });
                chart.draw_series(p.iter().map(|&q| Circle::new(q, 3, color.filled())))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .label_font(("sans-serif", 13))
                .draw()?;
        }};
    }
    if log_x {
        body!(b.build_cartesian_2d((x0.max(1e-9)..x1).log_scale(), 0f64..y1)?);
    } else {
        body!(b.build_cartesian_2d(x0..x1, 0f64..y1)?);
    }
    Ok(())
}

fn bars(
    area: &Area,
    rows: &[&Value],
    category: &[&str],
    series: &[&str],
    (y, whisker, y_label): (&str, Option<&str>, &str),
) -> anyhow::Result<()> {
    let cats = distinct(rows, category);
    let names = distinct(rows, series);
    let top = rows
        .iter()
        .filter_map(|r| Some(num(r, y)?.max(whisker.and_then(|w| num(r, w)).unwrap_or(0.0))))
        .fold(0f64, f64::max);
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };
    // Bars more than two orders of magnitude apart (the kernel's 1 µs
    // fault beside a 150 µs one) go on a log axis, or the small ones
    // vanish: values are drawn as their log10, labelled as themselves.
    let least = rows
        .iter()
        .filter_map(|r| num(r, y))
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let log = least.is_finite() && top / least > 100.0;
    let floor = if log { least / 2.0 } else { 0.0 };
    let at = move |v: f64| if log { v.max(floor).log10() } else { v };
    let y_label = if log {
        format!("{y_label} (log scale)")
    } else {
        y_label.to_string()
    };
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..cats.len() as f64, at(floor)..at(top))?;
    let cat_names = cats.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(cats.len() * 2 + 1)
        .x_label_formatter(&|v| {
            let i = v.floor() as usize;
            if (v - v.floor() - 0.5).abs() < 0.01 {
                cat_names.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| {
            let v = if log { 10f64.powf(*v) } else { *v };
            if v >= 100.0 {
                format!("{v:.0}")
            } else if v >= 1.0 {
                format!("{v:.1}")
            } else {
                format!("{v:.2}")
            }
        })
        .y_desc(y_label)
        .draw()?;
    let width = 0.8 / names.len().max(1) as f64;
    for (si, name) in names.iter().enumerate() {
        let color = Palette99::pick(si).to_rgba();
        let mut rects = Vec::new();
        let mut whiskers = Vec::new();
        for (ci, cat) in cats.iter().enumerate() {
            let Some(r) = rows
                .iter()
                .find(|r| label(r, category) == *cat && label(r, series) == *name)
            else {
                continue;
            };
            let Some(v) = num(r, y) else { continue };
            let x0 = ci as f64 + 0.1 + si as f64 * width;
            rects.push(Rectangle::new(
                [(x0, at(floor)), (x0 + width * 0.9, at(v))],
                color.filled(),
            ));
            if let Some(w) = whisker.and_then(|w| num(r, w)) {
                let mid = x0 + width * 0.45;
                whiskers.push(PathElement::new(
                    vec![(mid, at(v)), (mid, at(w))],
                    BLACK.stroke_width(2),
                ));
                whiskers.push(PathElement::new(
                    vec![(mid - width * 0.2, at(w)), (mid + width * 0.2, at(w))],
                    BLACK.stroke_width(2),
                ));
            }
        }
        chart
            .draw_series(rects)?
            .label(name.clone())
            .legend(move |(lx, ly)| {
                Rectangle::new([(lx, ly - 5), (lx + 15, ly + 5)], color.filled())
            });
        chart.draw_series(whiskers)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}
