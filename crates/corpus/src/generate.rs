//! Corpus generation: plan episodes (agent × type × task, [`crate::planning`]), run clean and
//! injected agents in the runner's sandbox and validate each episode ([`crate::injection`]), and
//! publish the labelled corpus ([`crate::publish`]). This file drives the three over a plan; it
//! re-exports their types so that `corpus::generate::X` names them all.
//!
//! Layout of `OUT/`:
//!
//! ```text
//! OUT/plan.json                        the options and the planned episodes (checked on resume)
//! OUT/clean/AGENT/repo/                the agent's clean repository (materialised once)
//! OUT/clean/AGENT/runs/TASK/           the clean run of TASK (complete when outcome.json exists)
//! OUT/episodes/DIR/artifact/           the bug artifact (repo, diff, type, signature, location)
//! OUT/episodes/DIR/run/                the injected run (trace.jsonl, outcome.json, …)
//! OUT/episodes/DIR/manifest.json       written last, atomically: the episode is complete
//!
//! DIR is an opaque digest of the episode id ([`episode_dir_name`]): the injected agent runs
//! inside it, so its name reaches stack traces and import paths, and a readable
//! `AGENT.TYPE.VARIANT.TASK` would hand the Detector its answer.
//! OUT/ledger.jsonl                     per episode: its part of the digest, a hash of its features
//! OUT/store.sqlite                     validated injected traces with their labels
//! OUT/corpus.jsonl                     one record per validated episode, with its split
//! OUT/splits/{train,val,test}.jsonl    the same records by split
//! OUT/corpus.parquet, OUT/splits/*.parquet   the same records as Parquet (see `parquet`)
//! OUT/report.json                      pass rate per type and why episodes failed
//! OUT/digest                           sha256 of the labels and verdicts (`publish::canonical`)
//! ```
//!
//! Resume: an episode whose manifest exists is never redone; a directory without one is an
//! interrupted episode and is redone from scratch. The store, the exports, the splits and the
//! digest are rebuilt from the manifests at the end of every complete run (each under a
//! temporary name, then renamed), so an interrupted and resumed run publishes the same corpus
//! as an uninterrupted one. The digest covers each episode's labels and verdicts, not what
//! timing decides (trace ids, limits, measured feature counts; `publish::canonical`), so it is
//! the same for any `-j`, load or machine.
//!
//! Shards: with `--shard I/N` OUT holds part I's episodes and clean runs beside the plan (which
//! names the part) and nothing is published; [`crate::merge`] joins the N parts into one OUT
//! and publishes it as the whole run would.

use std::path::Path;

use agents::Workspace;
use serde::Serialize;
use taxonomy::Catalog;

use crate::error::io;
pub use crate::error::CorpusError;
pub use crate::injection::{
    episode_dir_name, manifest_path, EpisodeRunner, Manifest, RunSummary, TOKEN_COUNT_COMPONENT,
};
pub use crate::planning::{plan, GenerateOptions, Plan, Planned, Shard, Uncovered};
pub(crate) use crate::publish::publish;
pub use crate::publish::{
    assign_splits, clean_trace_path, HealthyRecord, Record, Report, SandboxCost, TypeReport,
};

/// How a generation ended.
#[derive(Debug, Clone, Serialize)]
pub enum Finish {
    /// Stopped by `max_episodes`; run again to resume.
    Interrupted {
        completed: usize,
        remaining: usize,
    },
    Complete(Box<Report>),
    /// A shard's part is complete; `corpus merge` publishes the corpus from all parts.
    Shard {
        shard: Shard,
        episodes: usize,
        valid: usize,
        /// Episodes in the whole plan.
        of: usize,
    },
}

/// Runs (or resumes) a generation into `out`. `on_episode(done, total, manifest)` is called
/// after each episode, including those found complete from an earlier run.
pub fn generate(
    workspace: &Workspace,
    catalog: &Catalog,
    options: &GenerateOptions,
    out: &Path,
    on_episode: impl FnMut(usize, usize, &Manifest) + Send,
) -> Result<Finish, CorpusError> {
    let out = &std::path::absolute(out).map_err(io(out))?;
    std::fs::create_dir_all(out).map_err(io(out))?;
    let planned = plan(workspace, catalog, options)?;
    planned.claim(out, || {
        format!(
            "{} holds a generation with other options or templates; use another --out to start a new corpus",
            out.display()
        )
    })?;
    if let Some(h) = &options.holdout_agent {
        if !options.agents.contains(h) {
            return Err(CorpusError::Plan(format!(
                "--holdout-agent {h} is not one of the generated agents ({})",
                options.agents.join(", ")
            )));
        }
    }

    // A shard runs its part of the plan and publishes nothing: `corpus merge` publishes the
    // whole from every part.
    let part: Vec<Planned>;
    let episodes = match options.shard {
        Some(shard) => {
            part = shard
                .select(&planned.episodes)
                .into_iter()
                .map(|i| planned.episodes[i].clone())
                .collect();
            &part
        }
        None => &planned.episodes,
    };
    let runner = EpisodeRunner::new(workspace, catalog, options, out)?;
    let slots = runner.resume(episodes, options.max_episodes, on_episode)?;
    let remaining = slots.iter().filter(|m| m.is_none()).count();
    if remaining > 0 {
        return Ok(Finish::Interrupted {
            completed: slots.len() - remaining,
            remaining,
        });
    }
    if let Some(shard) = options.shard {
        return Ok(Finish::Shard {
            shard,
            episodes: slots.len(),
            valid: slots
                .iter()
                .flatten()
                .filter(|m| m.validation.valid)
                .count(),
            of: planned.episodes.len(),
        });
    }
    let manifests: Vec<Manifest> = slots.into_iter().flatten().collect();
    let report = publish(out, &planned, &manifests)?;
    Ok(Finish::Complete(Box::new(report)))
}
