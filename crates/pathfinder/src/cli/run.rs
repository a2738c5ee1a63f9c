//! `pathfinder run`: run an agent (clean, or an injected artifact) on tasks in isolation —
//! one fresh container per episode, or the local sandbox when no Docker engine answers.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use runner::{BackendChoice, Limits, LlmChoice, RunRequest, TaskSelection};
use taxonomy::Catalog;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// Docker if an engine answers, else the local sandbox (with a notice).
    Auto,
    Docker,
    Local,
}

impl BackendArg {
    pub fn choice(self) -> BackendChoice {
        match self {
            BackendArg::Auto => BackendChoice::Auto,
            BackendArg::Docker => BackendChoice::Docker,
            BackendArg::Local => BackendChoice::Local,
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The agent (a directory of --agents-dir with an agent.toml).
    #[arg(long)]
    agent: String,
    /// A task of the agent's suite; repeat for several.
    #[arg(
        long = "task",
        value_name = "ID",
        required_unless_present = "all_tasks"
    )]
    tasks: Vec<String>,
    /// Every task of the agent's suite.
    #[arg(long, conflicts_with = "tasks")]
    all_tasks: bool,
    /// Run this repository (an injected agent) instead of the clean agent.
    #[arg(long, value_name = "DIR")]
    artifact: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// `scripted` (the in-process scripted server), http://HOST:PORT or unix:/path.
    #[arg(long, value_name = "URL|scripted", default_value = "scripted")]
    llm: String,
    /// The model name to request.
    #[arg(long, default_value = "pathfinder-scripted")]
    model: String,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Episodes per task, with seeds SEED, SEED+1, ...
    #[arg(long, default_value_t = 1)]
    repeat: u64,
    /// Episodes running at once.
    #[arg(long, short = 'j', default_value_t = 2)]
    concurrency: usize,
    /// Where the run goes (default: runs/AGENT/isolated); episodes in OUT/runs/TASK-sSEED/.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Wall-clock limit of one agent run, in seconds (then the sandbox is killed).
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    timeout: u64,
    /// Memory limit per episode, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    memory: u64,
    /// CPU share per episode, in cores (Docker only).
    #[arg(long, default_value_t = 1.0)]
    cpus: f64,
    /// Processes and threads per episode.
    #[arg(long, default_value_t = 128)]
    pids: u32,
    /// The agents directory.
    #[arg(long, value_name = "DIR", default_value = "agents")]
    agents_dir: PathBuf,
    /// The base image recipe.
    #[arg(long, value_name = "FILE", default_value = "infra/base-image.toml")]
    recipe: PathBuf,
    /// Where the apt configuration naming the Debian archive lives.
    #[arg(long, value_name = "DIR", default_value = "/etc/apt")]
    apt_root: PathBuf,
}

pub fn run(args: RunArgs) -> Result<()> {
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    if !(args.cpus > 0.0 && args.cpus.is_finite()) {
        bail!("--cpus must be a positive number of cores");
    }
    if args.timeout == 0 {
        bail!("--timeout must be at least 1 second");
    }
    let llm = LlmChoice::parse(&args.llm)?;
    let catalog = Catalog::embedded().context("the built-in deficiency catalog is invalid")?;
    let request = RunRequest {
        out: args
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("runs").join(&args.agent).join("isolated")),
        agents_dir: args.agents_dir,
        agent: args.agent,
        tasks: if args.all_tasks {
            TaskSelection::All
        } else {
            TaskSelection::Ids(args.tasks)
        },
        seeds: (args.seed..args.seed + args.repeat).collect(),
        artifact: args.artifact,
        backend: args.backend.choice(),
        llm,
        model: args.model,
        concurrency: args.concurrency,
        limits: Limits {
            memory_bytes: args.memory << 20,
            cpus: args.cpus,
            pids: args.pids,
            timeout: Duration::from_secs(args.timeout),
            test_timeout: Duration::from_secs(args.timeout),
            ..Limits::default()
        },
        recipe: args.recipe,
        apt_root: args.apt_root,
    };
    let report = runner::run_blocking(&request, &catalog, &|m| eprintln!("runner: {m}"))?;
    for o in &report.outcomes {
        println!("trace: {}", o.run.trace.display());
    }
    println!(
        "{} episodes on {}: {} succeeded, {} contained, {} errors; summary: {}",
        report.episodes,
        report.backend,
        report.succeeded,
        report.contained,
        report.errors.len(),
        report.summary_path.display()
    );
    for e in &report.errors {
        eprintln!("error: {e}");
    }
    if report.interrupted {
        bail!(
            "interrupted: {} of {} episodes finished; every sandbox was removed",
            report.outcomes.len(),
            report.episodes
        );
    }
    if !report.errors.is_empty() {
        bail!("{} episodes could not be run", report.errors.len());
    }
    Ok(())
}
