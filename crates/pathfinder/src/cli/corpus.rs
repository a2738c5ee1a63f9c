//! `pathfinder corpus generate`: run clean and injected agents, validate each injection and
//! publish a labelled, split trace corpus (resumable); `corpus sweep`: where each template
//! manifests; `corpus chatlogs`: blame sets.

use std::path::PathBuf;
use std::time::Duration;

use agents::Workspace;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use corpus::{Finish, GenerateOptions};
use indicatif::{ProgressBar, ProgressStyle};
use runner::ExecutorOptions;

use crate::cli::run::BackendArg;
use taxonomy::Catalog;

#[derive(Debug, Args)]
pub struct CorpusArgs {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate (or resume) a corpus in OUT.
    Generate(GenerateArgs),
    /// Join the parts of a sharded generation (`generate --shard I/N`, each in its own
    /// directory) into one corpus in OUT: the same store, splits, exports and digest as the
    /// unsharded run of the plan.
    Merge(MergeArgs),
    /// Write the corpus's multi-agent injected traces as labelled chat logs (Who&When format),
    /// the decisive turn being where the injected run first departs from its clean run: a blame
    /// set for `pathfinder eval --chatlog`.
    Chatlogs(ChatlogsArgs),
    /// Run every template of the chosen (agent, type) pairs on up to N tasks of its agent's
    /// suite and report where each one validates; `--write` puts that evidence in the
    /// templates' `tasks` lists, which the corpus planner tries first.
    Sweep(SweepArgs),
}

#[derive(Debug, Args)]
struct SweepArgs {
    #[command(flatten)]
    episodes: EpisodeArgs,
    /// Tasks per template: its listed tasks first, then the rest of the suite in order.
    #[arg(long, default_value_t = 14)]
    tasks: usize,
    /// Only the (agent, type) pairs with a failed episode in this generated corpus.
    #[arg(long, value_name = "CORPUS")]
    failed_in: Option<PathBuf>,
    /// The sweep's directory; one run before with the same seed, templates and model is a
    /// cache: episodes already run there are not run again.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Replace each swept template's `tasks` list by the tasks it validated on (a template
    /// that validated nowhere gets an empty list).
    #[arg(long)]
    write: bool,
}

/// What every episode-running command takes: which agents and types, where the agents and
/// templates are, how an agent runs and which model drives it.
#[derive(Debug, Args)]
struct EpisodeArgs {
    /// Agents, comma-separated (default: every agent in the agents directory).
    #[arg(long, value_delimiter = ',')]
    agents: Vec<String>,
    /// Deficiency types, comma-separated catalog ids (default: all 50).
    #[arg(long, value_delimiter = ',')]
    types: Vec<String>,
    #[arg(long, value_name = "DIR", default_value = "agents")]
    agents_dir: PathBuf,
    #[arg(long, value_name = "DIR", default_value = "deficiencies/templates")]
    templates_dir: PathBuf,
    /// The interpreter that checks injected code's syntax (agents run on the sandbox's own
    /// python3).
    #[arg(long, default_value = "python3")]
    python: String,
    /// Wall-clock limit of a clean run, in seconds. An injected run gets ten times as long as
    /// its clean run took, at least 10 s and at most this (a deadlock costs seconds, not the
    /// whole limit).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    timeout: u64,
    /// Drive the agents with this OpenAI-compatible endpoint (http://HOST:PORT or unix:/path;
    /// a real model served by vLLM or llama.cpp) instead of the scripted model. Clean runs are
    /// judged by each task's checker as always; a task the model fails clean gives no baseline.
    #[arg(long, value_name = "URL")]
    llm: Option<String>,
    /// Where agents run: a fresh container per run (docker), the bubblewrap sandbox (local),
    /// or Docker when an engine answers and the sandbox otherwise (auto). Never a plain
    /// process: the code the Injector changed runs there.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// Episodes running at once (default: the number of cores).
    #[arg(long, short = 'j', value_name = "N")]
    jobs: Option<usize>,
    /// The base image recipe (Docker).
    #[arg(long, value_name = "FILE", default_value = "infra/base-image.toml")]
    recipe: PathBuf,
    /// Where the apt configuration naming the Debian archive lives (Docker image builds).
    #[arg(long, value_name = "DIR", default_value = "/etc/apt")]
    apt_root: PathBuf,
}

impl EpisodeArgs {
    /// The workspace, the catalog and generation options for `tasks` tasks and `seed`.
    fn open(&self, tasks: usize, seed: u64) -> Result<(Workspace, Catalog, GenerateOptions)> {
        let workspace = Workspace::open(&self.agents_dir)?;
        let catalog = Catalog::embedded().context("the built-in deficiency catalog is invalid")?;
        let agents = if self.agents.is_empty() {
            workspace.agent_names()?
        } else {
            self.agents.clone()
        };
        if tasks == 0 {
            bail!("--tasks must be at least 1");
        }
        let templates_dir = std::path::absolute(&self.templates_dir)
            .with_context(|| format!("{}", self.templates_dir.display()))?;
        let options = GenerateOptions {
            agents,
            types: type_ids(&catalog, &self.types)?,
            tasks,
            seed,
            holdout_agent: None,
            templates_dir,
            keyword: true,
            python: self.python.clone(),
            timeout: Duration::from_secs(self.timeout),
            max_episodes: None,
            llm: self.llm.clone(),
            isolation: ExecutorOptions {
                backend: self.backend.choice(),
                recipe: std::path::absolute(&self.recipe)
                    .with_context(|| format!("{}", self.recipe.display()))?,
                apt_root: self.apt_root.clone(),
                jobs: self.jobs.unwrap_or_else(runner::default_jobs).max(1),
                exit_on_interrupt: true,
            },
            shard: None,
        };
        Ok((workspace, catalog, options))
    }
}

#[derive(Debug, Args)]
struct ChatlogsArgs {
    /// A generated corpus (with corpus.jsonl and store.sqlite).
    #[arg(long, value_name = "DIR")]
    corpus: PathBuf,
    /// Where the logs go, one TRACE_ID.json each.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Only this split's traces (train, val or test).
    #[arg(long)]
    split: Option<String>,
}

fn chatlogs(args: ChatlogsArgs) -> Result<()> {
    if let Some(s) = &args.split {
        if !["train", "val", "test"].contains(&s.as_str()) {
            bail!("--split {s:?}: expected train, val or test");
        }
    }
    let done = corpus::chatlogs::export(&args.corpus, &args.out, args.split.as_deref())
        .with_context(|| format!("exporting chat logs from {}", args.corpus.display()))?;
    println!(
        "{} chat logs written to {}; left out: {} of other splits, {} without a departure visible in a chat log (none, or in token counts or length only), {} with fewer than two agents",
        done.written,
        args.out.display(),
        done.other_split,
        done.no_visible_departure,
        done.single_agent
    );
    Ok(())
}

#[derive(Debug, Args)]
struct GenerateArgs {
    #[command(flatten)]
    episodes: EpisodeArgs,
    /// Tasks per (agent, type).
    #[arg(long, default_value_t = 3)]
    tasks: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The corpus directory; an existing one with the same options is resumed.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Put every episode of this agent in the test split.
    #[arg(long, value_name = "NAME")]
    holdout_agent: Option<String>,
    /// Stop after this many newly completed episodes (run again to resume).
    #[arg(long, value_name = "N")]
    max_episodes: Option<usize>,
    /// Skip the keyword-baseline non-triviality check.
    #[arg(long)]
    no_keyword: bool,
    /// Run only part I of N of the plan (e.g. 2/8: one array task of a cluster job), into its
    /// own OUT; `corpus merge` joins the parts. Resumable like a whole run.
    #[arg(long, value_name = "I/N")]
    shard: Option<corpus::Shard>,
}

#[derive(Debug, Args)]
struct MergeArgs {
    /// The shard directories, every part of one `--shard I/N` split, in any order.
    #[arg(required = true, value_name = "SHARD_DIR")]
    shards: Vec<PathBuf>,
    /// The merged corpus's directory (new, or an interrupted merge of the same shards).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

pub fn run(args: CorpusArgs) -> Result<()> {
    match args.command {
        Command::Generate(g) => generate(g),
        Command::Merge(m) => merge(m),
        Command::Chatlogs(c) => chatlogs(c),
        Command::Sweep(s) => sweep(s),
    }
}

/// A progress bar over episodes with the count of valid ones so far.
struct Progress {
    bar: ProgressBar,
    valid: usize,
}

impl Progress {
    fn new() -> Progress {
        let bar = ProgressBar::new(0).with_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Progress { bar, valid: 0 }
    }

    fn episode(&mut self, done: usize, total: usize, m: &corpus::Manifest) {
        self.bar.set_length(total as u64);
        self.bar.set_position(done as u64);
        if m.validation.valid {
            self.valid += 1;
        }
        self.bar
            .set_message(format!("{} valid; {}", self.valid, m.id));
    }
}

/// Catalog ids in canonical spelling (all 50 when `given` is empty).
fn type_ids(catalog: &Catalog, given: &[String]) -> Result<Vec<String>> {
    if given.is_empty() {
        return Ok(catalog
            .deficiencies()
            .iter()
            .map(|d| d.id.clone())
            .collect());
    }
    let mut ids = Vec::new();
    for t in given {
        match catalog.get(t) {
            Some(d) => ids.push(d.id.clone()),
            None => bail!("--types: {t:?} is not a catalog id (P1–P27, C1–C23)"),
        }
    }
    Ok(ids)
}

fn sweep(args: SweepArgs) -> Result<()> {
    let only = match &args.failed_in {
        Some(dir) => Some(
            corpus::sweep::failed_pairs(dir)
                .with_context(|| format!("reading the episodes of {}", dir.display()))?,
        ),
        None => None,
    };
    let (workspace, catalog, mut options) = args.episodes.open(args.tasks, 0)?;
    // Non-triviality is for corpora; a sweep only asks where a template validates.
    options.keyword = false;
    let templates_dir = options.templates_dir.clone();
    let mut progress = Progress::new();
    let result = corpus::sweep::sweep(
        &workspace,
        &catalog,
        &options,
        only.as_ref(),
        &args.out,
        |done, total, m| progress.episode(done, total, m),
    )?;
    progress.bar.finish_and_clear();
    let (episodes, valid) = result.totals();
    println!(
        "{}: {valid}/{episodes} episodes valid over {} templates (sweep.json)",
        args.out.display(),
        result.templates.len()
    );
    for t in &result.templates {
        let failures: Vec<String> = t.failures.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!(
            "  {:<40} {}/{} valid: {}{}",
            t.template,
            t.valid.len(),
            t.tried.len(),
            t.valid.join(" "),
            if failures.is_empty() {
                String::new()
            } else {
                format!(
                    " (failed: {}; token counts only {})",
                    failures.join(", "),
                    t.token_only
                )
            }
        );
    }
    if args.write {
        let changed = corpus::sweep::write_task_lists(&result, &templates_dir, &catalog)?;
        for c in &changed {
            println!(
                "  wrote {}: tasks {:?} -> {:?}",
                c.path.display(),
                c.before,
                c.after
            );
        }
        println!("{} templates' task lists rewritten", changed.len());
    }
    Ok(())
}

fn generate(args: GenerateArgs) -> Result<()> {
    let (workspace, catalog, mut options) = args.episodes.open(args.tasks, args.seed)?;
    options.holdout_agent = args.holdout_agent.clone();
    options.keyword = !args.no_keyword;
    options.max_episodes = args.max_episodes;
    options.shard = args.shard;
    let mut progress = Progress::new();
    let finish = corpus::generate(
        &workspace,
        &catalog,
        &options,
        &args.out,
        |done, total, m| progress.episode(done, total, m),
    )?;
    progress.bar.finish_and_clear();
    match finish {
        Finish::Interrupted {
            completed,
            remaining,
        } => {
            println!(
                "stopped after --max-episodes: {completed} episodes complete, {remaining} remaining; run the same command again to resume"
            );
        }
        Finish::Shard {
            shard,
            episodes,
            valid,
            of,
        } => {
            println!(
                "{}: shard {shard} complete, {valid}/{episodes} episodes valid ({episodes} of the plan's {of}); `pathfinder corpus merge` joins it with the other parts",
                args.out.display()
            );
        }
        Finish::Complete(report) => print_report(&args.out, &report),
    }
    Ok(())
}

fn merge(args: MergeArgs) -> Result<()> {
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} episodes merged")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = corpus::merge(&args.shards, &args.out, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .with_context(|| {
        format!(
            "merging {} shards into {}",
            args.shards.len(),
            args.out.display()
        )
    })?;
    bar.finish_and_clear();
    print_report(&args.out, &report);
    Ok(())
}

/// What a complete generation or merge prints: pass rates per type, sandbox costs, how far
/// types are told apart, the digest.
fn print_report(out: &std::path::Path, report: &corpus::Report) {
    println!(
        "{}: {}/{} episodes valid ({:.1}%); splits train {} / val {} / test {}",
        out.display(),
        report.valid,
        report.episodes,
        100.0 * report.pass_rate,
        report.splits.get("train").unwrap_or(&0),
        report.splits.get("val").unwrap_or(&0),
        report.splits.get("test").unwrap_or(&0),
    );
    for (ty, t) in &report.per_type {
        let failures: Vec<String> = t.failures.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!(
            "  {ty:<4} {}/{} valid{}{}",
            t.valid,
            t.episodes,
            if t.token_only > 0 {
                format!(", {} token counts only", t.token_only)
            } else {
                String::new()
            },
            if failures.is_empty() {
                String::new()
            } else {
                format!(" (failed: {})", failures.join(", "))
            }
        );
    }
    for cost in &report.sandbox {
        println!(
            "sandbox: {} ran {} agent runs; overhead per run p50 {:.0} ms, p90 {:.0} ms (the agent itself p50 {:.0} ms)",
            cost.backend,
            cost.runs,
            cost.overhead_p50_ms,
            cost.overhead_p90_ms,
            cost.agent_p50_ms
        );
    }
    if !report.uncovered.is_empty() {
        println!(
            "  no template for {} (type, agent) pairs (see report.json)",
            report.uncovered.len()
        );
    }
    let table = &report.confusability;
    println!(
        "types told apart: {}/{} same-agent, same-task type pairs ({:.1}%) leave traces that differ in more than token counts; {} type pairs never differ where they meet (report.json, `confusability`)",
        table.differing,
        table.pairs,
        100.0 * table.share_differing(),
        table.never_apart.len()
    );
    println!(
        "keyword baseline named {}/{} valid episodes; digest {}",
        report.keyword_named, report.keyword_ran, report.digest
    );
}
