//! `pathfinder agents`: list, validate, materialise and run the target agents locally.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agents::local::{self, Llm, LocalOptions};
use agents::{Agent, RunOutcome, Workspace};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use taxonomy::Catalog;

#[derive(Debug, Args)]
pub struct AgentsArgs {
    /// The agents directory (holding CONTRACT.md, the agents and tasks/).
    #[arg(long, global = true, value_name = "DIR", default_value = "agents")]
    agents_dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the agents, their suites and how much of the component vocabulary they cover.
    List,
    /// Validate every agent's manifest and fix series, and that every task of its suite has a
    /// script.
    Validate,
    /// Build an agent's git repository (initial import plus fix commits) in DIR.
    Materialize {
        #[arg(long)]
        agent: String,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Fetch, check and unpack the pinned framework of an agent built on one (its `[python]`
    /// lock): the framework's packages into the agent directory, its dependencies into
    /// AGENT/.site. Needs `pip` and PyPI; runs never fetch anything.
    Vendor {
        #[arg(long)]
        agent: String,
        /// The Python whose pip downloads and installs the wheels.
        #[arg(long, default_value = "python3")]
        python: String,
    },
    /// Run an agent on one task and judge the result.
    Run {
        #[arg(long)]
        agent: String,
        #[arg(long, value_name = "ID")]
        task: String,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Run an agent on every task of its suite and print the success rate.
    Suite {
        #[arg(long)]
        agent: String,
        /// Where the agent runs: plain processes on this machine (host; the clean agent only),
        /// a fresh container per task with no network (docker), the bubblewrap sandbox (local),
        /// or Docker when an engine answers (auto).
        #[arg(long, value_enum, default_value_t = SuiteBackend::Host)]
        backend: SuiteBackend,
        #[command(flatten)]
        run: RunArgs,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SuiteBackend {
    Host,
    Auto,
    Docker,
    Local,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The run's seed (sent as the requests' `seed`).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The run directory (default: runs/AGENT/TASK-sSEED, or runs/AGENT/suite-sSEED).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Replace the run directory if it holds a previous run.
    #[arg(long)]
    force: bool,
    /// Use this OpenAI-compatible endpoint (http://HOST:PORT or unix:/path) instead of the
    /// in-process scripted server.
    #[arg(long, value_name = "URL")]
    llm: Option<String>,
    /// The model name to request.
    #[arg(long, default_value = agents::run::DEFAULT_MODEL)]
    model: String,
    /// The Python interpreter.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Wall-clock limit of one agent run, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    timeout: u64,
}

impl RunArgs {
    fn options(&self) -> LocalOptions {
        LocalOptions {
            llm: match &self.llm {
                Some(url) => Llm::External(url.clone()),
                None => Llm::Scripted,
            },
            python: self.python.clone(),
            model: self.model.clone(),
            timeout: Duration::from_secs(self.timeout),
            test_timeout: Duration::from_secs(self.timeout),
            replace: self.force,
        }
    }
}

fn catalog() -> Result<Catalog> {
    Catalog::embedded().context("the built-in deficiency catalog is invalid")
}

fn load(workspace: &Workspace, name: &str, catalog: &Catalog) -> Result<Agent> {
    workspace
        .agent(name, catalog)
        .with_context(|| format!("cannot load agent {name:?}"))
}

pub fn run(args: AgentsArgs) -> Result<()> {
    let workspace = Workspace::open(&args.agents_dir)?;
    let catalog = catalog()?;
    match args.command {
        Command::List => list(&workspace, &catalog),
        Command::Vendor { agent, python } => {
            let dir = workspace.root().join(&agent);
            if !dir.join("agent.toml").is_file() {
                anyhow::bail!("no agent {agent:?} in {}", workspace.root().display());
            }
            let Some(lock) = agents::vendor::lock_of(&dir)? else {
                println!("{agent}: no [python] lock in its agent.toml; nothing to vendor");
                return Ok(());
            };
            let done = agents::vendor::vendor(&dir, &lock, &python)
                .with_context(|| format!("cannot vendor {agent}"))?;
            println!(
                "{agent}: {} wheels checked ({} downloaded); {} unpacked into the agent; dependencies in {}",
                done.wheels,
                done.downloaded,
                done.packages.join(", "),
                done.site.display()
            );
            Ok(())
        }
        Command::Validate => validate(&workspace, &catalog),
        Command::Materialize { agent, out } => {
            let agent = load(&workspace, &agent, &catalog)?;
            let m = local::materialize(&agent, &out)?;
            println!(
                "{}: initial import {} + {} fix commit{}, HEAD {}",
                out.display(),
                short(m.initial_commit),
                m.fix_commits.len(),
                if m.fix_commits.len() == 1 { "" } else { "s" },
                short(m.head)
            );
            for (oid, message) in &m.fix_commits {
                println!("  {} {}", short(*oid), message.lines().next().unwrap_or(""));
            }
            Ok(())
        }
        Command::Run { agent, task, run } => {
            let agent = load(&workspace, &agent, &catalog)?;
            let task = workspace.task(&agent, &task)?;
            let out = run.out.clone().unwrap_or_else(|| {
                Path::new("runs")
                    .join(&agent.name)
                    .join(format!("{}-s{}", task.id(), run.seed))
            });
            let outcome =
                local::run_task(&workspace, &agent, &task, run.seed, &out, &run.options())?;
            print_outcome(&outcome);
            Ok(())
        }
        Command::Suite {
            agent,
            backend,
            run,
        } if backend != SuiteBackend::Host => {
            sandboxed_suite(&args.agents_dir, &catalog, &agent, backend, &run)
        }
        Command::Suite { agent, run, .. } => {
            let agent = load(&workspace, &agent, &catalog)?;
            let out = run.out.clone().unwrap_or_else(|| {
                Path::new("runs")
                    .join(&agent.name)
                    .join(format!("suite-s{}", run.seed))
            });
            let total = workspace.suite(&agent)?.len() as u64;
            let bar = ProgressBar::new(total).with_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            let mut succeeded = 0;
            let report = local::run_suite(
                &workspace,
                &agent,
                run.seed,
                &out,
                &run.options(),
                |_, _, o| {
                    if o.success {
                        succeeded += 1;
                    } else {
                        bar.println(format!("FAIL {}: {}", o.task_id, o.judgement.reason));
                    }
                    bar.set_message(format!("{succeeded} solved"));
                    bar.inc(1);
                },
            )?;
            bar.finish_and_clear();
            println!(
                "{}: {}/{} tasks solved ({:.1}%), seed {}; runs in {}",
                report.agent,
                report.succeeded,
                report.total,
                100.0 * report.success_rate(),
                report.seed,
                out.display()
            );
            Ok(())
        }
    }
}

/// The suite in the runner's sandboxes: one fresh container (or bubblewrap sandbox) per task.
fn sandboxed_suite(
    agents_dir: &Path,
    catalog: &Catalog,
    agent: &str,
    backend: SuiteBackend,
    run: &RunArgs,
) -> Result<()> {
    let out = run.out.clone().unwrap_or_else(|| {
        Path::new("runs")
            .join(agent)
            .join(format!("suite-s{}-sandboxed", run.seed))
    });
    let request = runner::RunRequest {
        agents_dir: agents_dir.to_owned(),
        agent: agent.to_owned(),
        tasks: runner::TaskSelection::All,
        seeds: vec![run.seed],
        artifact: None,
        backend: match backend {
            SuiteBackend::Docker => runner::BackendChoice::Docker,
            SuiteBackend::Local => runner::BackendChoice::Local,
            SuiteBackend::Auto | SuiteBackend::Host => runner::BackendChoice::Auto,
        },
        llm: match &run.llm {
            Some(url) => runner::LlmChoice::parse(url)?,
            None => runner::LlmChoice::Scripted,
        },
        model: run.model.clone(),
        out: out.clone(),
        concurrency: runner::default_jobs(),
        limits: runner::Limits {
            timeout: Duration::from_secs(run.timeout),
            test_timeout: Duration::from_secs(run.timeout),
            ..runner::Limits::default()
        },
        recipe: PathBuf::from("infra/base-image.toml"),
        apt_root: PathBuf::from("/etc/apt"),
    };
    let report = runner::run_blocking(&request, catalog, &|m| eprintln!("runner: {m}"))?;
    for o in report.outcomes.iter().filter(|o| !o.run.success) {
        println!("FAIL {}: {}", o.run.task_id, o.run.judgement.reason);
    }
    println!(
        "{agent}: {}/{} tasks solved ({:.1}%) on {}, seed {}; {} contained; runs in {}",
        report.succeeded,
        report.episodes,
        100.0 * report.succeeded as f64 / report.episodes.max(1) as f64,
        report.backend,
        run.seed,
        report.contained,
        out.display()
    );
    if report.interrupted {
        anyhow::bail!("interrupted; every sandbox was removed");
    }
    if !report.errors.is_empty() {
        anyhow::bail!(
            "{} tasks could not be run: {}",
            report.errors.len(),
            report.errors.join("; ")
        );
    }
    Ok(())
}

fn short(oid: impl std::fmt::Display) -> String {
    oid.to_string().chars().take(10).collect()
}

fn print_outcome(o: &RunOutcome) {
    println!("trace: {} ({} spans)", o.trace.display(), o.collected.spans);
    for p in &o.collected.trace_problems {
        println!("  trace problem: {p}");
    }
    if let Some(r) = &o.collected.result {
        println!(
            "result: status {}, {} steps, answer {:?}",
            r.status, r.steps, r.answer
        );
    }
    println!(
        "{}: {} ({})",
        o.task_id,
        if o.success { "SUCCESS" } else { "FAILURE" },
        o.judgement.reason
    );
    println!("run directory: {}", o.out_dir.display());
}

fn list(workspace: &Workspace, catalog: &Catalog) -> Result<()> {
    for name in workspace.agent_names()? {
        match workspace.agent(&name, catalog) {
            Ok(agent) => {
                let covered = agent.manifest.covered_components();
                let tasks = workspace.suite(&agent).map(|t| t.len());
                println!(
                    "{:<12} {:<5} {:>3} tasks  {:>2} sites  {:>2}/{} components  {} fix commits  ({})",
                    name,
                    agent.manifest.task_suite.as_str(),
                    tasks.map_or("?".into(), |n| n.to_string()),
                    agent.manifest.sites.len(),
                    covered.len(),
                    catalog.components().len(),
                    agent.series.commits.len(),
                    agent.manifest.framework_style
                );
            }
            Err(e) => println!("{name:<12} INVALID: {}", agents::error_chain(&e)),
        }
    }
    Ok(())
}

fn validate(workspace: &Workspace, catalog: &Catalog) -> Result<()> {
    let mut failures = 0;
    for name in workspace.agent_names()? {
        let agent = match workspace.agent(&name, catalog) {
            Ok(a) => a,
            Err(e) => {
                println!("{name}: {}", agents::error_chain(&e));
                failures += 1;
                continue;
            }
        };
        let tasks = match workspace.suite(&agent) {
            Ok(t) => t,
            Err(e) => {
                println!("{name}: {}", agents::error_chain(&e));
                failures += 1;
                continue;
            }
        };
        let store = llmserve::ScriptStore::new(workspace.scripts_dir());
        let mut missing = Vec::new();
        for task in &tasks {
            if let Err(e) = store.script(&name, task.id()) {
                missing.push(agents::error_chain(&e));
            }
        }
        let tmp = tempfile::tempdir().context("cannot create a temporary directory")?;
        if let Err(e) = local::materialize(&agent, &tmp.path().join("repo")) {
            println!("{name}: {}", agents::error_chain(&e));
            failures += 1;
        }
        if missing.is_empty() {
            println!(
                "{name}: ok ({} sites, {} fix commits, {} tasks with scripts)",
                agent.manifest.sites.len(),
                agent.series.commits.len(),
                tasks.len()
            );
        } else {
            failures += 1;
            for m in missing {
                println!("{name}: {m}");
            }
        }
    }
    if failures > 0 {
        anyhow::bail!("{failures} problem(s) found");
    }
    Ok(())
}
