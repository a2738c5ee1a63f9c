//! Planning a corpus: which (agent, type, variant, task) episodes a generation runs, chosen
//! from the templates with seeded, order-independent choices (`OUT/plan.json`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agents::Workspace;
use inject::{template, Template};
use runner::ExecutorOptions;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use taxonomy::Catalog;

use crate::error::{io, CorpusError};
use crate::files::{to_json, write_atomic};

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
    /// Wall-clock limit of a clean run, and the most an injected run gets (its own limit is
    /// learnt from its clean run: `episode::injected_timeout`).
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
    /// Run only this part of the plan (`--shard I/N`); `corpus merge` joins the parts. Written
    /// in a shard's plan.json (so a resumed shard is the same part), absent from a whole run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
}

/// Part `index` (1-based) of `count` of a plan.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;

    /// `I/N` with 1 ≤ I ≤ N.
    fn from_str(s: &str) -> Result<Shard, String> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: expected I/N, e.g. 1/4"))?;
        let parse = |x: &str| {
            x.trim()
                .parse::<usize>()
                .map_err(|e| format!("{s:?}: {x:?} is not a count ({e})"))
        };
        let (index, count) = (parse(i)?, parse(n)?);
        if count == 0 || index == 0 || index > count {
            return Err(format!(
                "{s:?}: I must be between 1 and N, and N at least 1"
            ));
        }
        Ok(Shard { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// The positions in `episodes` of this shard's part. Episodes of one (agent, task) share a
    /// clean run, so they stay together: the groups, largest first (ties in plan order), each go
    /// to the part with the fewest episodes so far (ties to the lowest index). A function of
    /// the plan alone, so every machine computes the same parts, and the parts of `count`
    /// cover the plan exactly once.
    pub fn select(&self, episodes: &[Planned]) -> Vec<usize> {
        let mut groups: Vec<(&str, &str, Vec<usize>)> = Vec::new();
        for (i, ep) in episodes.iter().enumerate() {
            match groups
                .iter_mut()
                .find(|(a, t, _)| *a == ep.agent && *t == ep.task)
            {
                Some((_, _, members)) => members.push(i),
                None => groups.push((&ep.agent, &ep.task, vec![i])),
            }
        }
        // Stable: equal sizes keep plan order.
        groups.sort_by_key(|(_, _, members)| std::cmp::Reverse(members.len()));
        let mut load = vec![0usize; self.count];
        let mut mine = Vec::new();
        for (_, _, members) in groups {
            let part = (0..self.count)
                .min_by_key(|&p| (load[p], p))
                .expect("count ≥ 1");
            load[part] += members.len();
            if part + 1 == self.index {
                mine.extend(members);
            }
        }
        mine.sort_unstable();
        mine
    }
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

impl Plan {
    /// Writes this plan as `out/plan.json`, or, when `out` holds one already (a run or a merge
    /// being resumed), checks that it is this plan, compared as written; `refusal` is the error
    /// when it is not. Run-time knobs (timeout, interpreter, `--max-episodes`) are not written,
    /// so they may change between attempts.
    pub(crate) fn claim(
        &self,
        out: &Path,
        refusal: impl FnOnce() -> String,
    ) -> Result<(), CorpusError> {
        let path = out.join("plan.json");
        if !path.exists() {
            return write_atomic(&path, to_json(self).as_bytes());
        }
        let text = std::fs::read_to_string(&path).map_err(io(&path))?;
        let previous: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| CorpusError::Plan(format!("{}: {e}", path.display())))?;
        if previous != serde_json::to_value(self).expect("serialises") {
            return Err(CorpusError::Plan(refusal()));
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::{Planned, Shard};

    fn plan(pairs: &[(&str, &str, usize)]) -> Vec<Planned> {
        let mut eps = Vec::new();
        for (agent, task, n) in pairs {
            for k in 0..*n {
                eps.push(Planned {
                    id: format!("{agent}.P{k}.v.{task}"),
                    agent: agent.to_string(),
                    deficiency: format!("P{k}"),
                    variant: "v".into(),
                    task: task.to_string(),
                });
            }
        }
        eps
    }

    #[test]
    fn parts_cover_the_plan_once_keep_clean_runs_together_and_balance() {
        let eps = plan(&[
            ("a", "t1", 5),
            ("a", "t2", 3),
            ("b", "t1", 4),
            ("b", "t3", 1),
            ("c", "t1", 2),
        ]);
        for count in 1..=6 {
            let parts: Vec<Vec<usize>> = (1..=count)
                .map(|index| Shard { index, count }.select(&eps))
                .collect();
            let mut all: Vec<usize> = parts.iter().flatten().copied().collect();
            all.sort_unstable();
            assert_eq!(all, (0..eps.len()).collect::<Vec<_>>(), "count {count}");
            for (p, part) in parts.iter().enumerate() {
                for &i in part {
                    let owner = parts
                        .iter()
                        .position(|q| {
                            q.iter().any(|&j| {
                                eps[j].agent == eps[i].agent && eps[j].task == eps[i].task
                            })
                        })
                        .unwrap();
                    assert_eq!(owner, p, "one (agent, task) in one part");
                }
            }
        }
        // 15 episodes in groups of 5, 4, 3, 2, 1 over two parts: 5+2+1 and 4+3, or similar.
        let sizes: Vec<usize> = (1..=2)
            .map(|index| Shard { index, count: 2 }.select(&eps).len())
            .collect();
        assert!(sizes[0].abs_diff(sizes[1]) <= 1, "{sizes:?}");
    }

    #[test]
    fn shard_parses_i_of_n_and_refuses_the_rest() {
        assert_eq!("2/4".parse::<Shard>(), Ok(Shard { index: 2, count: 4 }));
        for bad in ["0/2", "3/2", "1/0", "2", "a/b", ""] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }
}
