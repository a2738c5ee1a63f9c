//! `pathfinder`: the command line over every Pathfinder crate. Each subcommand lives in its
//! own module under `cli/`; this file only parses arguments and dispatches.

mod cli;

use clap::{Parser, Subcommand};

/// Train and run agent-trace debuggers by adversarial self-play.
#[derive(Debug, Parser)]
#[command(name = "pathfinder", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inspect and validate the deficiency catalog (P1–P27, C1–C23).
    #[command(subcommand)]
    Taxonomy(cli::taxonomy::Command),
    /// Serve the OpenAI-compatible chat-completions API the agents call (scripted or model).
    Serve(cli::serve::ServeArgs),
    /// Investigate a trace with a Detector policy, or run one Detector tool call.
    Detect(cli::detect::DetectArgs),
    /// List, validate, materialise and run the target agents locally.
    Agents(cli::agents::AgentsArgs),
    /// Fetch model weights into the local cache and chat with a model.
    #[command(subcommand)]
    Model(cli::model::Command),
    /// Import traces into a SQLite store, describe a store for a prompt, export one trace.
    #[command(subcommand)]
    Traces(cli::traces::Command),
    /// Run an agent (clean or injected) on tasks in isolation: a fresh container per episode,
    /// or the local sandbox when no Docker engine answers.
    Run(cli::run::RunArgs),
    /// Plant a deficiency into an agent (template or free-form diff) and show template coverage.
    Inject(cli::inject::InjectArgs),
    /// Generate a labelled corpus: clean and injected runs, validation, store, splits.
    Corpus(cli::corpus::CorpusArgs),
    /// Score a detector on a labelled store, or a blame baseline on labelled chat logs, with
    /// bootstrap confidence intervals.
    Eval(cli::eval::EvalArgs),
    /// Set a checkpoint's operating point on your own healthy runs (a conformal threshold that
    /// bounds the false-positive rate on runs like them), saved beside the checkpoint.
    Calibrate(cli::calibrate::CalibrateArgs),
    /// Receive OpenTelemetry traces (OTLP/HTTP) as agents export them, diagnose each trace
    /// when it ends, and serve the verdicts (live page, JSON, gen_ai.evaluation.result events).
    Collect(cli::collect::CollectArgs),
    /// Self-play training: warm start on expert demonstrations, then PPO on the Injector and
    /// Detector adapters, with checkpoints and held-out evaluation.
    Train(cli::train::TrainArgs),
    /// A training run's report: Markdown (SFT only against SFT + PPO, Table 9) and PNG charts
    /// of its metrics in RUN/report/; several runs are also compared.
    Report(cli::report::ReportArgs),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PATHFINDER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Taxonomy(cmd) => cli::taxonomy::run(cmd),
        Command::Serve(args) => cli::serve::run(args),
        Command::Detect(args) => cli::detect::run(args),
        Command::Agents(args) => cli::agents::run(args),
        Command::Model(cmd) => cli::model::run(cmd),
        Command::Traces(cmd) => cli::traces::run(cmd),
        Command::Run(args) => cli::run::run(args),
        Command::Inject(args) => cli::inject::run(args),
        Command::Corpus(args) => cli::corpus::run(args),
        Command::Eval(args) => cli::eval::run(args),
        Command::Calibrate(args) => cli::calibrate::run(args),
        Command::Collect(args) => cli::collect::run(args),
        Command::Train(args) => cli::train::run(args),
        Command::Report(args) => cli::report::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
