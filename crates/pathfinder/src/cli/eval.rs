//! `pathfinder eval`: score a detector on a labelled store (detection, localisation, tool
//! calls, per category, confusion) or a blame baseline on labelled chat logs (agent, exact
//! step, step within ±k), every figure with a bootstrap confidence interval.

use std::path::{Path, PathBuf};

use ::eval::report::{self, ChatlogReport, StoreReport};
use ::eval::{chatlog, metrics, store_eval, Bootstrap};
use anyhow::{bail, Context, Result};
use clap::Args;
use detect::Ablations;
use indicatif::{ProgressBar, ProgressStyle};

use super::detect::AblationArgs;

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
    /// Table 8: evaluate only the traces this agent produced (the label's `source.agent`), for
    /// a detector trained without it.
    #[arg(long, requires = "db", value_name = "NAME")]
    pub holdout_agent: Option<String>,
    /// A directory of labelled multi-agent chat logs (Who&When format), searched recursively.
    #[arg(long, value_name = "DIR")]
    pub chatlog: Option<PathBuf>,
    /// keyword or expert for --db (a comma-separated list compares them side by side, e.g.
    /// keyword,expert); first-error for --chatlog. Defaults to expert / first-error.
    #[arg(long)]
    pub detector: Option<String>,
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
    /// Also write report.md and report.json into this directory.
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
    let (markdown, json) = match (&args.db, &args.chatlog) {
        (Some(db), None) => run_store(db, &args, bootstrap)?,
        (None, Some(dir)) => run_chatlog(dir, &args, bootstrap)?,
        _ => bail!("give exactly one of --db and --chatlog"),
    };
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_atomically(&dir.join("report.md"), markdown.as_bytes())?;
        write_atomically(&dir.join("report.json"), json.as_bytes())?;
        eprintln!("wrote {0}/report.md and {0}/report.json", dir.display());
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

fn run_store(db: &Path, args: &EvalArgs, bootstrap: Bootstrap) -> Result<(String, String)> {
    let detectors: Vec<String> = args
        .detector
        .as_deref()
        .unwrap_or("expert")
        .split(',')
        .map(|d| d.trim().to_string())
        .filter(|d| !d.is_empty())
        .collect();
    if detectors.is_empty() {
        bail!("--detector names no detector");
    }
    for d in &detectors {
        if !store_eval::DETECTORS.contains(&d.as_str()) {
            bail!(
                "unknown detector `{d}` for --db; expected {} (zero-shot, RAG and trained-checkpoint detectors are not implemented yet)",
                store_eval::DETECTORS.join(", ")
            );
        }
    }
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
    let mut traces = store_eval::labelled_traces(db, only.as_deref())?;
    if let Some(agent) = &args.holdout_agent {
        traces = store_eval::held_out(traces, agent, db)?;
    }
    if traces.is_empty() {
        bail!(
            "{}: no trace carries a deficiency label; nothing to evaluate",
            db.display()
        );
    }
    let catalog = taxonomy::Catalog::embedded().context("loading the deficiency catalog")?;
    let bar = progress(
        traces.len() * detectors.len() * settings.len(),
        "investigating",
    );
    let mut reports = Vec::new();
    for detector in &detectors {
        for (ablations, ablation_names) in &settings {
            let options = store_eval::RunOptions {
                detector: detector.clone(),
                ablations: *ablations,
            };
            let cases = store_eval::run(db, &traces, &options, |case| {
                bar.set_message(format!("{detector} {}", case.trace_id));
                bar.inc(1);
            });
            let cases = match cases {
                Ok(cases) => cases,
                Err(err) => {
                    bar.finish_and_clear();
                    return Err(err.into());
                }
            };
            reports.push(StoreReport {
                store: db.display().to_string(),
                holdout_agent: args.holdout_agent.clone(),
                split: args.split.as_ref().map(|p| p.display().to_string()),
                detector: detector.clone(),
                ablations: ablation_names.clone(),
                bootstrap,
                summary: metrics::summarise(&cases, &catalog, &bootstrap),
                cases,
            });
        }
    }
    bar.finish_and_clear();
    if let [report] = reports.as_slice() {
        return Ok((
            report::store_markdown(report),
            serde_json::to_string_pretty(report)?,
        ));
    }
    let mut markdown = report::comparison_markdown(&reports);
    for r in &reports {
        markdown.push('\n');
        markdown.push_str(&report::store_markdown(r));
    }
    let json = serde_json::to_string_pretty(&serde_json::json!({ "runs": reports }))?;
    Ok((markdown, json))
}

/// The ablation switches, in Table 7's order.
const SWITCHES: [&str; 5] = [
    "no-sql",
    "no-shell",
    "no-subagents",
    "no-schema",
    "no-history",
];

fn run_chatlog(dir: &Path, args: &EvalArgs, bootstrap: Bootstrap) -> Result<(String, String)> {
    if args.split.is_some() {
        bail!("--split applies to --db stores, not to --chatlog directories");
    }
    let (_, ablation_names) = ablations(&args.ablations);
    if !ablation_names.is_empty() {
        bail!(
            "the ablation switches ({}) turn off Detector tools; the chat-log baseline uses none, so they do not apply to --chatlog",
            ablation_names.join(", ")
        );
    }
    let detector = args
        .detector
        .clone()
        .unwrap_or_else(|| "first-error".into());
    let files = chatlog::log_files(dir)?;
    let bar = progress(files.len(), "blaming");
    let cases = chatlog::evaluate(dir, &detector, |_| bar.inc(1));
    bar.finish_and_clear();
    let cases = cases?;
    let report = ChatlogReport {
        directory: dir.display().to_string(),
        detector,
        bootstrap,
        summary: metrics::summarise_blame(&cases, args.tolerance.unwrap_or(1), &bootstrap),
        cases,
    };
    Ok((
        report::chatlog_markdown(&report),
        serde_json::to_string_pretty(&report)?,
    ))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}
