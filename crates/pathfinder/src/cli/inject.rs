//! `pathfinder inject`: plant one deficiency by hand (from a template or a free-form diff) and
//! show which (type, agent) cells the templates cover.

use std::path::PathBuf;

use agents::Workspace;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use inject::{template, Artifact, Coverage, Options};
use taxonomy::Catalog;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct InjectArgs {
    /// The agents directory (holding CONTRACT.md and the agents).
    #[arg(long, global = true, value_name = "DIR", default_value = "agents")]
    agents_dir: PathBuf,
    /// The templates directory (AGENT/ID-VARIANT.toml).
    #[arg(
        long,
        global = true,
        value_name = "DIR",
        default_value = "deficiencies/templates"
    )]
    templates_dir: PathBuf,
    /// The Python interpreter used to check that edited code still parses.
    #[arg(long, global = true, default_value = "python3")]
    python: String,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    one: OneArgs,
}

/// One injection from a template.
#[derive(Debug, Args)]
struct OneArgs {
    /// The agent to inject into.
    #[arg(long)]
    agent: Option<String>,
    /// The deficiency type (catalog id, e.g. P16).
    #[arg(long = "type", value_name = "ID")]
    deficiency: Option<String>,
    /// The template's variant (default: the first, by name, that matches).
    #[arg(long)]
    variant: Option<String>,
    /// Only templates that edit this site, FILE:FUNCTION (e.g. toolcaller/llm.py:StreamAssembler.feed).
    #[arg(long, value_name = "FILE:FUNCTION")]
    site: Option<String>,
    /// The artifact directory to create (must not exist or be empty).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print the injection as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the type × agent table of templates on disk and list the empty cells.
    Coverage {
        /// Also apply every template to its agent and report the ones that do not apply.
        #[arg(long)]
        check: bool,
    },
    /// Apply a free-form unified diff (paths relative to the agent root) and write the artifact.
    ApplyDiff {
        #[arg(long)]
        agent: String,
        /// The diff file (`-` for standard input).
        #[arg(long, value_name = "FILE")]
        diff: PathBuf,
        /// The deficiency type the diff claims to plant (written to deficiency_type).
        #[arg(long = "type", value_name = "ID")]
        deficiency: Option<String>,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

fn catalog() -> Result<Catalog> {
    Catalog::embedded().context("the built-in deficiency catalog is invalid")
}

pub fn run(args: InjectArgs) -> Result<()> {
    let workspace = Workspace::open(&args.agents_dir)?;
    let catalog = catalog()?;
    let options = Options::new(args.python.clone());
    match args.command {
        Some(Command::Coverage { check }) => {
            coverage(&workspace, &catalog, &args.templates_dir, check, &options)
        }
        Some(Command::ApplyDiff {
            agent,
            diff,
            deficiency,
            out,
            json,
        }) => {
            let text = if diff.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading the diff from stdin")?
            } else {
                std::fs::read_to_string(&diff)
                    .with_context(|| format!("{}: cannot read", diff.display()))?
            };
            if let Some(id) = &deficiency {
                if catalog.get(id).is_none() {
                    bail!("--type {id:?} is not a catalog id (P1–P27, C1–C23)");
                }
            }
            let deficiency = deficiency.map(|id| catalog.get(&id).expect("checked").id.clone());
            let agent = inject::load_agent(&workspace, &agent, &catalog)?;
            let art = inject::inject_diff(
                &agent,
                &text,
                deficiency.as_deref(),
                &catalog,
                &out,
                &options,
            )?;
            report(&art, json)
        }
        None => one(
            &workspace,
            &catalog,
            &args.templates_dir,
            args.one,
            &options,
        ),
    }
}

fn one(
    workspace: &Workspace,
    catalog: &Catalog,
    templates_dir: &std::path::Path,
    args: OneArgs,
    options: &Options,
) -> Result<()> {
    let (Some(agent_name), Some(id), Some(out)) = (&args.agent, &args.deficiency, &args.out) else {
        bail!("give --agent, --type and --out (or a subcommand: coverage, apply-diff)");
    };
    let agent = inject::load_agent(workspace, agent_name, catalog)?;
    let all = template::load_for(templates_dir, &agent.name, id, catalog)?;
    let found = all.len();
    let site = match &args.site {
        None => None,
        Some(s) => Some(
            s.rsplit_once(':')
                .with_context(|| format!("--site {s:?} is not FILE:FUNCTION"))?,
        ),
    };
    let chosen = all
        .into_iter()
        .filter(|t| args.variant.as_ref().is_none_or(|v| &t.variant == v))
        .find(|t| site.is_none_or(|(file, function)| t.is_at_site(file, function)));
    let Some(t) = chosen else {
        bail!(
            "no template for {id} on {} in {}{}{} ({found} for the type on that agent)",
            agent.name,
            templates_dir.join(&agent.name).display(),
            args.variant
                .as_ref()
                .map(|v| format!(" with variant {v:?}"))
                .unwrap_or_default(),
            args.site
                .as_ref()
                .map(|s| format!(" at site {s}"))
                .unwrap_or_default(),
        );
    };
    let art = inject::inject_template(&agent, &t, catalog, out, options)?;
    report(&art, args.json)
}

fn report(art: &Artifact, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(art)?);
        return Ok(());
    }
    let i = &art.injection;
    let loc = &i.location;
    println!(
        "{}: {} ({}) on {}, branch {} at {}",
        art.dir.display(),
        i.key,
        i.strategy,
        art.agent,
        i.branch,
        &i.commit[..10]
    );
    println!(
        "location: {}:{}-{} in {} [{}]",
        loc.file,
        loc.line_start,
        loc.line_end,
        loc.function.as_deref().unwrap_or("(module level)"),
        loc.component.as_deref().unwrap_or("no declared site")
    );
    for e in &i.syntax_errors {
        println!("warning: the injected code does not parse: {e}");
    }
    Ok(())
}

fn coverage(
    workspace: &Workspace,
    catalog: &Catalog,
    dir: &std::path::Path,
    check: bool,
    options: &Options,
) -> Result<()> {
    let templates = inject::load_dir(dir, catalog).map_err(|problems| {
        anyhow::anyhow!(
            "{} template problem{}:\n{}",
            problems.len(),
            if problems.len() == 1 { "" } else { "s" },
            problems
                .iter()
                .map(|p| format!("  - {p}"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    })?;
    let agents = workspace.agent_names()?;
    let strays: Vec<String> = templates
        .iter()
        .filter(|t| !agents.contains(&t.agent))
        .map(|t| t.path.display().to_string())
        .collect();
    if !strays.is_empty() {
        bail!(
            "templates for agents not in {}: {}",
            workspace.root().display(),
            strays.join(", ")
        );
    }
    let cov = Coverage::new(catalog, &agents, &templates);
    print!("{}", cov.render());
    let total = cov.types.len() * cov.agents.len();
    println!(
        "{} templates; {}/{} (type, agent) cells covered",
        templates.len(),
        cov.filled_cells(),
        total
    );
    let empty = cov.empty_cells();
    for agent in &agents {
        let missing: Vec<&str> = empty
            .iter()
            .filter(|(_, a)| a == agent)
            .map(|(t, _)| t.as_str())
            .collect();
        if !missing.is_empty() {
            println!(
                "empty for {agent} ({}): {}",
                missing.len(),
                missing.join(" ")
            );
        }
    }
    if check {
        let scratch = tempfile::tempdir().context("creating a scratch directory")?;
        let bar = ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} applying {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(format!("{} templates", templates.len()));
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        let checked =
            inject::check_templates(workspace, catalog, &templates, scratch.path(), options);
        bar.finish_and_clear();
        let failed: Vec<String> = checked
            .iter()
            .filter_map(|c| c.result.as_ref().err().map(|e| format!("  - {e}")))
            .collect();
        println!(
            "check: {}/{} templates apply cleanly",
            checked.len() - failed.len(),
            checked.len()
        );
        if !failed.is_empty() {
            bail!(
                "{} templates do not apply:\n{}",
                failed.len(),
                failed.join("\n")
            );
        }
    }
    Ok(())
}
