//! PNG charts for the project's reports: line charts of a training run's metrics over steps
//! (`pathfinder report`) and bar charts of detectors' accuracies with confidence intervals
//! (`pathfinder eval --out`).
//!
//! Drawing is plotters' bitmap backend; text is rendered with ab_glyph from a TrueType font
//! found on the machine (see [`font_path`]), so no system font library is linked. Each chart
//! is rendered in memory, encoded with `png` and written to `PATH.partial`, then renamed: a
//! crash leaves the old chart or none, never half of one.
//!
//! Invariants: knows nothing of training or detectors (series and bars in, PNG out); writes
//! only the file it is asked to write.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

/// Width and height of every chart, in pixels.
pub const SIZE: (u32, u32) = (960, 540);

#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("no TrueType font to draw text with: {0}")]
    Font(String),
    #[error("chart {path}: {reason}")]
    Data { path: PathBuf, reason: String },
    #[error("drawing {path}: {reason}")]
    Draw { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T, E = ChartError> = std::result::Result<T, E>;

/// One line of a line chart: `(x, y)` points in the order drawn. Points with a non-finite
/// coordinate are skipped, so a metric missing at some steps leaves a gap-free line through
/// the steps that have it.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Fixed y bounds (an accuracy's 0 to 1); `None` fits the data.
    pub y_range: Option<(f64, f64)>,
    /// Single points drawn as black triangles with a legend entry each (the held-out figure
    /// after the warm start alone, on curves that go on with PPO).
    pub marks: Vec<Mark>,
}

/// A marked point of a line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub name: String,
    pub point: (f64, f64),
}

/// One bar with an optional interval drawn as a whisker (e.g. a bootstrap 95% CI).
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub interval: Option<(f64, f64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    pub title: String,
    pub y_label: String,
    pub bars: Vec<Bar>,
    /// The y axis; `None` fits it to the bars and whiskers (from zero).
    pub y_range: Option<(f64, f64)>,
}

/// Where the font comes from: `$PATHFINDER_FONT` if set, else the first of a few common
/// sans-serif faces, else any `.ttf` under `/usr/share/fonts`. Debian's `fonts-dejavu-core`
/// provides the first candidate.
pub fn font_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("PATHFINDER_FONT") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(ChartError::Font(format!(
                "PATHFINDER_FONT names {}, which is not a file",
                p.display()
            )))
        };
    }
    const CANDIDATES: &[&str] = &[
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/Library/Fonts/Arial.ttf",
        "/System/Library/Fonts/Supplemental/Arial.ttf",
    ];
    if let Some(p) = CANDIDATES.iter().map(PathBuf::from).find(|p| p.is_file()) {
        return Ok(p);
    }
    let mut stack = vec![PathBuf::from("/usr/share/fonts")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
                return Ok(p);
            }
        }
    }
    Err(ChartError::Font(
        "none of the usual faces is installed and /usr/share/fonts holds no .ttf; install \
         fonts-dejavu-core or set PATHFINDER_FONT to a .ttf file"
            .into(),
    ))
}

/// Registers the font with plotters once per process.
fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let path = font_path().map_err(|e| e.to_string())?;
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| {
                format!(
                    "{} is not a TrueType font plotters can read",
                    path.display()
                )
            })
        })
        .clone()
        .map_err(ChartError::Font)
}

/// A colour per series, distinguishable in print.
fn colour(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    PALETTE[i % PALETTE.len()]
}

/// An x axis of steps: from the first step, to the last plus 5% of the span (at least one
/// step, so that a single evaluation at step 0 does not draw an axis from −1 to 1).
fn steps_axis(lo: f64, hi: f64) -> (f64, f64) {
    let span = (hi - lo).max(1.0);
    (lo, lo + span * 1.05)
}

/// `[lo, hi]` padded by 5% (or by 1 when the range is a single value).
fn padded(lo: f64, hi: f64) -> (f64, f64) {
    if hi - lo < 1e-12 {
        (lo - 1.0, hi + 1.0)
    } else {
        let pad = 0.05 * (hi - lo);
        (lo - pad, hi + pad)
    }
}

fn draw_error(path: &Path) -> impl Fn(String) -> ChartError + '_ {
    move |reason| ChartError::Draw {
        path: path.to_owned(),
        reason,
    }
}

/// Draws `chart` to `path` as a PNG.
pub fn line_chart(path: &Path, chart: &LineChart) -> Result<()> {
    let series: Vec<(&str, Vec<(f64, f64)>)> = chart
        .series
        .iter()
        .map(|s| {
            let pts = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            (s.name.as_str(), pts)
        })
        .collect();
    let marks: Vec<&Mark> = chart
        .marks
        .iter()
        .filter(|m| m.point.0.is_finite() && m.point.1.is_finite())
        .collect();
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .chain(marks.iter().map(|m| m.point))
        .collect();
    if all.is_empty() {
        return Err(ChartError::Data {
            path: path.to_owned(),
            reason: format!("\"{}\" has no finite points to draw", chart.title),
        });
    }
    ensure_font()?;
    let fold = |f: fn(f64, f64) -> f64, init: f64, pick: fn(&(f64, f64)) -> f64| {
        all.iter().map(pick).fold(init, f)
    };
    let x = steps_axis(
        fold(f64::min, f64::INFINITY, |p| p.0),
        fold(f64::max, f64::NEG_INFINITY, |p| p.0),
    );
    let y = chart.y_range.unwrap_or_else(|| {
        padded(
            fold(f64::min, f64::INFINITY, |p| p.1),
            fold(f64::max, f64::NEG_INFINITY, |p| p.1),
        )
    });
    let err = draw_error(path);
    let mut pixels = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
        let mut ctx = ChartBuilder::on(&root)
            .caption(&chart.title, ("sans-serif", 26))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(x.0..x.1, y.0..y.1)
            .map_err(|e| err(e.to_string()))?;
        ctx.configure_mesh()
            .x_desc(&chart.x_label)
            .y_desc(&chart.y_label)
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .draw()
            .map_err(|e| err(e.to_string()))?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let c = colour(i);
            ctx.draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                .map_err(|e| err(e.to_string()))?
                .label(*name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
            ctx.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))
                .map_err(|e| err(e.to_string()))?;
        }
        for mark in &marks {
            ctx.draw_series(std::iter::once(TriangleMarker::new(
                mark.point,
                8,
                BLACK.filled(),
            )))
            .map_err(|e| err(e.to_string()))?
            .label(mark.name.as_str())
            .legend(|(x, y)| TriangleMarker::new((x + 10, y), 6, BLACK.filled()));
        }
        // Every series and mark is named in the legend, a single one too.
        ctx.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 16))
            .draw()
            .map_err(|e| err(e.to_string()))?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    write_png(path, &pixels)
}

/// Draws `chart` to `path` as a PNG: one bar per entry, labelled below, with its interval as
/// a whisker.
pub fn bar_chart(path: &Path, chart: &BarChart) -> Result<()> {
    if chart.bars.is_empty() {
        return Err(ChartError::Data {
            path: path.to_owned(),
            reason: format!("\"{}\" has no bars", chart.title),
        });
    }
    if let Some(b) = chart.bars.iter().find(|b| {
        !b.value.is_finite()
            || b.interval
                .is_some_and(|(l, h)| !l.is_finite() || !h.is_finite())
    }) {
        return Err(ChartError::Data {
            path: path.to_owned(),
            reason: format!(
                "bar \"{}\" has a value that is not a finite number",
                b.label
            ),
        });
    }
    ensure_font()?;
    let (y0, y1) = chart.y_range.unwrap_or_else(|| {
        let top = chart
            .bars
            .iter()
            .map(|b| b.interval.map_or(b.value, |(_, h)| h.max(b.value)))
            .fold(0.0, f64::max);
        let bottom = chart
            .bars
            .iter()
            .map(|b| b.interval.map_or(b.value, |(l, _)| l.min(b.value)))
            .fold(0.0, f64::min);
        padded(bottom, top)
    });
    let n = chart.bars.len();
    let err = draw_error(path);
    let mut pixels = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
        let mut ctx = ChartBuilder::on(&root)
            .caption(&chart.title, ("sans-serif", 26))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d((0..n).into_segmented(), y0..y1)
            .map_err(|e| err(e.to_string()))?;
        let labels: Vec<String> = chart.bars.iter().map(|b| b.label.clone()).collect();
        ctx.configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                    labels.get(*i).cloned().unwrap_or_default()
                }
                SegmentValue::Last => String::new(),
            })
            .y_desc(&chart.y_label)
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .draw()
            .map_err(|e| err(e.to_string()))?;
        ctx.draw_series(chart.bars.iter().enumerate().map(|(i, b)| {
            let mut r = Rectangle::new(
                [
                    (SegmentValue::Exact(i), b.value.min(0.0)),
                    (SegmentValue::Exact(i + 1), b.value.max(0.0)),
                ],
                colour(i).filled(),
            );
            r.set_margin(0, 0, 18, 18);
            r
        }))
        .map_err(|e| err(e.to_string()))?;
        ctx.draw_series(chart.bars.iter().enumerate().filter_map(|(i, b)| {
            b.interval.map(|(lo, hi)| {
                PathElement::new(
                    [
                        (SegmentValue::CenterOf(i), lo),
                        (SegmentValue::CenterOf(i), hi),
                    ],
                    BLACK.stroke_width(2),
                )
            })
        }))
        .map_err(|e| err(e.to_string()))?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    write_png(path, &pixels)
}

/// Encodes RGB `pixels` of [`SIZE`] and writes them to `path` through `path.partial`.
fn write_png(path: &Path, pixels: &[u8]) -> Result<()> {
    let io = |p: &Path| {
        let p = p.to_owned();
        move |source| ChartError::Io { path: p, source }
    };
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, SIZE.0, SIZE.1);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(|e| ChartError::Draw {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        w.write_image_data(pixels).map_err(|e| ChartError::Draw {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, &bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(path: &Path) -> (png::OutputInfo, Vec<u8>) {
        let dec = png::Decoder::new(std::fs::File::open(path).unwrap());
        let mut reader = dec.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        buf.truncate(info.buffer_size());
        (info, buf)
    }

    /// Pixels of exactly this colour.
    fn count(buf: &[u8], c: RGBColor) -> usize {
        buf.chunks(3).filter(|p| p == &[c.0, c.1, c.2]).count()
    }

    #[test]
    fn line_chart_draws_each_series_in_its_colour() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reward.png");
        let chart = LineChart {
            title: "reward".into(),
            x_label: "step".into(),
            y_label: "mean reward".into(),
            y_range: None,
            marks: vec![Mark {
                name: "after the warm start".into(),
                point: (0.0, 0.3),
            }],
            series: vec![
                Series {
                    name: "injector".into(),
                    points: vec![(0.0, 0.1), (1.0, 0.4), (2.0, f64::NAN), (3.0, 0.2)],
                },
                Series {
                    name: "detector".into(),
                    points: vec![(0.0, -0.5), (1.0, 0.0), (2.0, 0.3)],
                },
            ],
        };
        line_chart(&path, &chart).unwrap();
        let (info, buf) = decode(&path);
        assert_eq!((info.width, info.height), SIZE);
        assert!(count(&buf, colour(0)) > 100, "first series not drawn");
        assert!(count(&buf, colour(1)) > 100, "second series not drawn");
        assert!(count(&buf, BLACK) > 50, "the mark (and the axes) not drawn");
        assert!(!dir.path().join("reward.png.partial").exists());
    }

    #[test]
    fn a_single_step_draws_its_axis_from_that_step() {
        assert_eq!(steps_axis(0.0, 0.0), (0.0, 1.05));
        assert_eq!(steps_axis(1.0, 4.0), (1.0, 1.0 + 3.0 * 1.05));
    }

    #[test]
    fn bar_chart_draws_bars_and_refuses_bad_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acc.png");
        let mut chart = BarChart {
            title: "detection accuracy".into(),
            y_label: "accuracy".into(),
            bars: vec![
                Bar {
                    label: "keyword".into(),
                    value: 0.2,
                    interval: Some((0.1, 0.3)),
                },
                Bar {
                    label: "expert".into(),
                    value: 0.6,
                    interval: None,
                },
            ],
            y_range: Some((0.0, 1.0)),
        };
        bar_chart(&path, &chart).unwrap();
        let (_, buf) = decode(&path);
        assert!(count(&buf, colour(0)) > 1000, "first bar not drawn");
        assert!(count(&buf, colour(1)) > 1000, "second bar not drawn");
        chart.bars[1].value = f64::NAN;
        let e = bar_chart(&path, &chart).unwrap_err().to_string();
        assert!(e.contains("expert") && e.contains("acc.png"), "{e}");
    }

    #[test]
    fn empty_charts_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kl.png");
        let chart = LineChart {
            title: "KL to the base model".into(),
            x_label: "step".into(),
            y_label: "nats".into(),
            y_range: None,
            marks: Vec::new(),
            series: vec![Series {
                name: "kl".into(),
                points: vec![(0.0, f64::NAN)],
            }],
        };
        let e = line_chart(&path, &chart).unwrap_err().to_string();
        assert!(e.contains("KL to the base model"), "{e}");
        assert!(!path.exists());
    }
}
