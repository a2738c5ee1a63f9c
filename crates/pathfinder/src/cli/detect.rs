//! `pathfinder detect`: run a Detector policy on one trace, or one tool call exactly as the
//! Detector would make it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::write_atomically;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use detect::{Ablations, Action, Actor, Config, Detector, Status};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DetectArgs {
    #[command(subcommand)]
    pub command: Option<DetectCommand>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum DetectCommand {
    /// Run one sql or bash call as the Detector would and print its observation; a refused or
    /// failed call exits non-zero.
    Tool(ToolArgs),
}

/// Investigate one trace with a policy.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The trace store (SQLite).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// The trace to investigate.
    #[arg(long)]
    pub trace: Option<String>,
    /// keyword (the keyword baseline), expert (the scripted investigator) or checkpoint:DIR
    /// (a trained Detector with a decision head, checkpoints/RUN/step-N; on a multi-agent chat
    /// log, its learned blamer when the run trained one).
    #[arg(long, default_value = "expert")]
    pub policy: String,
    /// A checkpoint's operating point: a file written by `pathfinder calibrate`, or `none`
    /// [default: the checkpoint's calibration.json when it has one].
    #[arg(long, value_name = "FILE|none")]
    pub calibration: Option<PathBuf>,
    /// Print the whole investigation (every call and observation).
    #[arg(long)]
    pub transcript: bool,
    /// Also write the transcript as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub transcript_json: Option<PathBuf>,
    /// Also write a self-contained HTML page of the trace and the investigation to this file:
    /// the span tree, every turn, the verdict and the span it blames.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Import the episode as a trace into this (writable) store, e.g. for self-play training.
    #[arg(long, value_name = "DB")]
    pub save_episode: Option<PathBuf>,
    #[command(flatten)]
    pub ablations: AblationArgs,
}

/// The paper's Table 7 ablations.
#[derive(Debug, Args)]
pub struct AblationArgs {
    #[arg(long)]
    pub no_sql: bool,
    #[arg(long)]
    pub no_shell: bool,
    #[arg(long)]
    pub no_subagents: bool,
    #[arg(long)]
    pub no_schema: bool,
    #[arg(long)]
    pub no_history: bool,
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("call").required(true).args(["sql", "bash"]))]
pub struct ToolArgs {
    #[arg(long)]
    pub db: PathBuf,
    #[arg(long)]
    pub trace: String,
    /// One SELECT statement.
    #[arg(long)]
    pub sql: Option<String>,
    /// One pipeline over trace.json and spans.jsonl.
    #[arg(long)]
    pub bash: Option<String>,
    /// Use a subagent's output limit (100,000 characters) instead of the main agent's.
    #[arg(long)]
    pub subagent: bool,
}

pub fn run(args: DetectArgs) -> Result<()> {
    match args.command {
        Some(DetectCommand::Tool(tool)) => run_tool(tool),
        None => run_policy(args.run),
    }
}

fn run_policy(args: RunArgs) -> Result<()> {
    let (Some(db), Some(trace)) = (args.db.as_ref(), args.trace.as_ref()) else {
        bail!("pathfinder detect needs --db PATH and --trace ID (or the `tool` subcommand)");
    };
    let a = &args.ablations;
    let config = Config {
        ablations: Ablations {
            no_sql: a.no_sql,
            no_shell: a.no_shell,
            no_subagents: a.no_subagents,
            no_schema: a.no_schema,
            no_history: a.no_history,
        },
        ..Config::default()
    };
    let (policy, config) = match args.policy.strip_prefix("checkpoint:") {
        Some(dir) => {
            let choice = super::eval_models::CalibrationChoice::parse(args.calibration.as_deref());
            let trained =
                super::eval_models::load_checkpoint(Path::new(dir))?.calibrated(&choice)?;
            // Which operating point decides, on stderr beside the verdict.
            eprintln!("{}", trained.describe());
            trained.head_policy()?
        }
        None if args.calibration.is_some() => {
            bail!("--calibration applies to a checkpoint policy (--policy checkpoint:DIR)")
        }
        None => (
            detect::policies::by_name(&args.policy).map_err(anyhow::Error::msg)?,
            config,
        ),
    };
    let detector = Detector::new(db, config, false)?;
    let transcript = detector
        .investigate(trace, policy)
        .with_context(|| format!("investigating trace {trace} in {}", db.display()))?;
    if args.transcript {
        print!("{}", transcript.render());
    }
    if let Some(path) = &args.transcript_json {
        let text = serde_json::to_string_pretty(&transcript)?;
        write_atomically(path, text.as_bytes())?;
    }
    if let Some(path) = &args.html {
        let store = traces::Store::open_read_only(db)
            .with_context(|| format!("opening {}", db.display()))?;
        let spans = store
            .spans(trace)
            .with_context(|| format!("reading the spans of trace {trace}"))?;
        let catalog = taxonomy::Catalog::embedded().context("loading the deficiency catalog")?;
        let answers = [view::Answer::from_transcript(
            args.policy.clone(),
            transcript.clone(),
        )];
        let page = view::trace_page(&view::TracePage {
            trace_id: trace,
            spans: &spans,
            answers: &answers,
            catalog: &catalog,
            label: None,
            index_href: None,
        });
        write_atomically(path, page.as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(store) = &args.save_episode {
        let mut store =
            traces::Store::open(store).with_context(|| format!("opening {}", store.display()))?;
        let report = store.import_spans(
            transcript.to_spans(),
            &format!("detect:{}", transcript.policy),
        )?;
        eprintln!(
            "saved the episode as trace {} ({} spans)",
            transcript.episode_id, report.spans
        );
    }
    match transcript.verdict() {
        Some(verdict) => {
            println!("{}", verdict.render().trim_start_matches("answer: "));
            Ok(())
        }
        None => bail!("no verdict: {}", transcript.outcome.describe()),
    }
}

fn run_tool(args: ToolArgs) -> Result<()> {
    let detector = Detector::new(&args.db, Config::default(), false)?;
    let inv = detector.prepare(&args.trace)?;
    let role = if args.subagent {
        Actor::Subagent(1)
    } else {
        Actor::Main
    };
    let tools = Arc::clone(&inv).tools(role)?;
    let action = match (args.sql, args.bash) {
        (Some(query), None) => Action::Sql { query },
        (None, Some(pipeline)) => Action::Bash { pipeline },
        _ => bail!("give exactly one of --sql and --bash"),
    };
    let obs = tools.execute(&action);
    match obs.status {
        Status::Ok => {
            print!("{}", obs.text);
            if !obs.text.ends_with('\n') {
                println!();
            }
            Ok(())
        }
        _ => bail!("{}", obs.text),
    }
}
