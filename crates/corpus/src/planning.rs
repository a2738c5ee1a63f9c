//! Planning a corpus: which (agent, type, variant, task) episodes a generation runs, chosen
//! from the templates with seeded, order-independent choices (`OUT/plan.json`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use agents::Workspace;
use inject::{template, Template};
use runner::ExecutorOptions;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use taxonomy::Catalog;

use crate::generate::CorpusError;

/// What to generate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GenerateOptions {
    pub agents: Vec<String>,
    /// Catalog ids, canonical spelling.
    pub types: Vec<String>,
    /// Tasks per (agent, type).
    pub tasks: usize,
    pub seed: u64,
    /// An agent whose episodes all go to the test split.
    pub holdout_agent: Option<String>,
    pub templates_dir: PathBuf,
    /// Run the keyword baseline for non-triviality.
    pub keyword: bool,
    #[serde(skip)]
    pub python: String,
    /// Wall-clock limit of one agent run.
    #[serde(skip)]
    pub timeout: Duration,
    /// Stop after this many newly completed episodes (an interruption on purpose).
    #[serde(skip)]
    pub max_episodes: Option<usize>,
    /// An OpenAI-compatible endpoint (a real model: vLLM, llama.cpp, `pathfinder serve`) that
    /// drives the agents instead of the in-process scripted model. Part of the plan: a corpus
    /// is made by one model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<String>,
    /// Where and how many at once agents run (the runner's backends; never a plain process).
    /// Not part of the plan: a corpus is the same whichever sandbox made it.
    #[serde(skip)]
    pub isolation: ExecutorOptions,
}

/// One planned episode.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Planned {
    /// `AGENT.TYPE.VARIANT.TASK`.
    pub id: String,
    pub agent: String,
    pub deficiency: String,
    pub variant: String,
    pub task: String,
}

/// A (type, agent) pair with no template: nothing could be planned for it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Uncovered {
    pub agent: String,
    pub deficiency: String,
}

/// `OUT/plan.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Plan {
    pub options: GenerateOptions,
    pub episodes: Vec<Planned>,
    pub uncovered: Vec<Uncovered>,
}

/// A stable 64-bit hash of `parts` (sha256), for seeded, order-independent choices.
pub(crate) fn stable_hash(parts: &[&str]) -> u64 {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
}

/// The task ids of agent `name`'s suite, in suite order.
pub(crate) fn suite_ids(
    workspace: &Workspace,
    catalog: &Catalog,
    name: &str,
) -> Result<Vec<String>, CorpusError> {
    let agent = workspace.agent(name, catalog)?;
    Ok(workspace
        .suite(&agent)?
        .iter()
        .map(|t| t.id().to_owned())
        .collect())
}

/// Plans the episodes: for each agent and type with templates, `tasks` tasks of the agent's
/// suite (those the templates name first, then the rest in seeded order), each with the
/// template that names it or a seeded choice among the type's templates.
pub fn plan(
    workspace: &Workspace,
    catalog: &Catalog,
    options: &GenerateOptions,
) -> Result<Plan, CorpusError> {
    let mut episodes = Vec::new();
    let mut uncovered = Vec::new();
    let seed = options.seed.to_string();
    for name in &options.agents {
        let suite = suite_ids(workspace, catalog, name)?;
        for ty in &options.types {
            let templates = template::load_for(&options.templates_dir, name, ty, catalog)?;
            if templates.is_empty() {
                uncovered.push(Uncovered {
                    agent: name.clone(),
                    deficiency: ty.clone(),
                });
                continue;
            }
            let named: BTreeSet<&str> = templates
                .iter()
                .flat_map(|t| t.tasks.iter().map(String::as_str))
                .collect();
            let mut rest: Vec<&String> = suite
                .iter()
                .filter(|t| !named.contains(t.as_str()))
                .collect();
            rest.sort_by_key(|t| stable_hash(&[&seed, name, ty, t]));
            let mut first: Vec<&String> = suite
                .iter()
                .filter(|t| named.contains(t.as_str()))
                .collect();
            first.sort_by_key(|t| stable_hash(&[&seed, name, ty, t]));
            for task in first.into_iter().chain(rest).take(options.tasks) {
                let naming: Vec<&Template> = templates
                    .iter()
                    .filter(|t| t.tasks.iter().any(|x| x == task))
                    .collect();
                let pool: Vec<&Template> = if naming.is_empty() {
                    templates.iter().collect()
                } else {
                    naming
                };
                let pick = pool[(stable_hash(&[&seed, "variant", name, ty, task])
                    % pool.len() as u64) as usize];
                episodes.push(Planned {
                    id: format!("{name}.{ty}.{}.{task}", pick.variant),
                    agent: name.clone(),
                    deficiency: ty.clone(),
                    variant: pick.variant.clone(),
                    task: task.clone(),
                });
            }
        }
    }
    Ok(Plan {
        options: options.clone(),
        episodes,
        uncovered,
    })
}
