//! `pathfinder report RUN…`: a training run's report (Markdown) and PNG charts of its
//! metrics, written to `RUN/report/`; with several runs, a comparison of them as well.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use charts::{LineChart, Mark, Series};
use clap::Args;
use rl::report::{self, RunLog};
use rl::run_log::StepMetrics;

use super::write_atomically;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run names (directories under RUNS_DIR) or paths to run directories.
    #[arg(required = true, value_name = "RUN")]
    runs: Vec<String>,
    #[arg(long, value_name = "DIR", default_value = "checkpoints")]
    runs_dir: PathBuf,
    /// Where the comparison of several runs goes [default: RUNS_DIR/report].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

pub fn run(args: ReportArgs) -> Result<()> {
    let mut logs = Vec::new();
    for name in &args.runs {
        let dir = resolve(&args.runs_dir, name)?;
        let log = RunLog::read(&dir)?;
        if log.steps.is_empty() && log.evals.is_empty() {
            bail!(
                "{}: no metrics.jsonl or eval.jsonl (not a run directory, or nothing logged yet)",
                dir.display()
            );
        }
        let out = dir.join("report");
        let files = write_run(&out, &log)?;
        println!(
            "{}: report.md and {} charts in {}",
            log.name,
            files.len(),
            out.display()
        );
        logs.push(log);
    }
    if logs.len() > 1 {
        let out = args.out.unwrap_or_else(|| args.runs_dir.join("report"));
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let md = report::comparison_markdown(&logs);
        write_atomically(&out.join("comparison.md"), md.as_bytes())?;
        let series = logs
            .iter()
            .map(|l| Series {
                name: l.name.clone(),
                points: l
                    .evals
                    .iter()
                    .map(|e| (e.step as f64, e.detection_accuracy))
                    .collect(),
            })
            .collect();
        let chart = LineChart {
            title: "Held-out detection accuracy by run".into(),
            x_label: "PPO step (0 = after the warm start)".into(),
            y_label: "detection accuracy".into(),
            series,
            y_range: Some((0.0, 1.0)),
            marks: logs
                .iter()
                .filter_map(|l| warm_start_mark(l, &format!("{}: SFT only", l.name)))
                .collect(),
        };
        if let Err(e) = charts::line_chart(&out.join("held_out.png"), &chart) {
            eprintln!("held-out chart skipped: {e}");
        }
        print!("{md}");
        println!("comparison: {}", out.display());
    } else if let Some(log) = logs.first() {
        print!("{}", report::markdown(log));
    }
    Ok(())
}

/// A run name under `runs_dir`, or a path to a run directory.
fn resolve(runs_dir: &Path, name: &str) -> Result<PathBuf> {
    let under = runs_dir.join(name);
    if under.is_dir() {
        return Ok(under);
    }
    let path = PathBuf::from(name);
    if path.is_dir() {
        return Ok(path);
    }
    bail!(
        "run {name}: neither {} nor {} is a directory",
        under.display(),
        path.display()
    )
}

/// The held-out detection after the warm start alone (the step-0 evaluation), to mark on
/// curves that go on with PPO.
fn warm_start_mark(log: &RunLog, name: &str) -> Option<Mark> {
    log.evals.iter().find(|e| e.step == 0).map(|e| Mark {
        name: name.into(),
        point: (0.0, e.detection_accuracy),
    })
}

/// A metric of the PPO steps as a series (steps that lack it are left out).
fn series(log: &RunLog, name: &str, f: impl Fn(&StepMetrics) -> Option<f64>) -> Series {
    Series {
        name: name.into(),
        points: log
            .ppo_steps()
            .filter_map(|m| f(m).map(|v| (m.step as f64, v)))
            .collect(),
    }
}

/// The charts of one run, by file name. A chart whose metrics were never logged is left out.
fn run_charts(log: &RunLog) -> Vec<(&'static str, LineChart)> {
    let line = |title: &str, y: &str, series: Vec<Series>| LineChart {
        title: format!("{title} — {}", log.name),
        x_label: "PPO step".into(),
        y_label: y.into(),
        series,
        y_range: None,
        marks: Vec::new(),
    };
    let held_out = Series {
        name: "held-out detection".into(),
        points: log
            .evals
            .iter()
            .map(|e| (e.step as f64, e.detection_accuracy))
            .collect(),
    };
    let warm = |name: &str, f: fn(&StepMetrics) -> Option<f64>| Series {
        name: name.into(),
        points: log
            .steps
            .iter()
            .filter(|m| m.phase == "sft")
            .enumerate()
            .filter_map(|(i, m)| f(m).map(|v| ((i + 1) as f64, v)))
            .collect(),
    };
    let sft = warm("SFT loss", |m| m.sft_loss);
    // The warm start is where the adapter first leaves the base: its KL starts at zero.
    let sft_kl = warm("KL to the base", |m| m.kl);
    let mut all = vec![
        (
            "reward.png",
            line(
                "Reward by role",
                "mean reward",
                vec![
                    series(log, "injector", |m| m.reward_injector),
                    series(log, "detector", |m| m.reward_detector),
                    series(log, "joint", |m| m.reward_joint),
                    series(log, "review (higher-order)", |m| m.reward_review),
                ],
            ),
        ),
        (
            "accuracy.png",
            LineChart {
                y_range: Some((0.0, 1.0)),
                marks: warm_start_mark(log, "held-out, SFT only (step 0)")
                    .into_iter()
                    .collect(),
                ..line(
                    "Detection and localisation",
                    "accuracy",
                    vec![
                        series(log, "detection (training)", |m| m.detection_accuracy),
                        series(log, "localisation (training)", |m| m.localisation_accuracy),
                        held_out,
                    ],
                )
            },
        ),
        (
            "diversity.png",
            line(
                "Injection diversity",
                "types / nats",
                vec![
                    series(log, "unique types", |m| {
                        m.injection_unique_types.map(|v| v as f64)
                    }),
                    series(log, "type entropy (nats)", |m| m.injection_entropy),
                ],
            ),
        ),
        (
            "query_depth.png",
            line(
                "Query depth",
                "tool calls per investigation",
                vec![series(log, "query depth", |m| m.query_depth)],
            ),
        ),
        (
            "kl.png",
            line(
                "KL to the base model",
                "nats per token",
                vec![series(log, "KL", |m| m.kl)],
            ),
        ),
        (
            "ppo.png",
            line(
                "PPO diagnostics",
                "value",
                vec![
                    series(log, "clip fraction", |m| m.clip_fraction),
                    series(log, "value loss", |m| m.value_loss),
                    series(log, "policy entropy", |m| m.entropy),
                ],
            ),
        ),
        (
            "throughput.png",
            line(
                "Throughput",
                "per minute / per second",
                vec![
                    series(log, "episodes/min", |m| m.episodes_per_min),
                    series(log, "tokens/s", |m| m.tokens_per_s),
                ],
            ),
        ),
    ];
    all.push((
        "sft_loss.png",
        LineChart {
            title: format!("Warm start — {}", log.name),
            x_label: "update".into(),
            y_label: "nats per token".into(),
            series: vec![sft, sft_kl],
            y_range: None,
            marks: Vec::new(),
        },
    ));
    all.into_iter()
        .map(|(f, mut c)| {
            c.series.retain(|s| !s.points.is_empty());
            (f, c)
        })
        .filter(|(_, c)| !c.series.is_empty())
        .collect()
}

/// Writes `report.md` and the charts into `out`; returns the chart files written.
fn write_run(out: &Path, log: &RunLog) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut written = Vec::new();
    let mut md = report::markdown(log);
    let charts = run_charts(log);
    if !charts.is_empty() {
        md.push_str("\n## Charts\n\n");
    }
    for (file, chart) in charts {
        let path = out.join(file);
        charts::line_chart(&path, &chart)?;
        md.push_str(&format!("![{}]({file})\n", chart.title));
        written.push(path);
    }
    write_atomically(&out.join("report.md"), md.as_bytes())?;
    Ok(written)
}
