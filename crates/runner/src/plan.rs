//! From "agent NAME on tasks T with seeds S" to episode specs: the agent's repository (the
//! clean agent materialised, or an injected artifact), one run directory per episode.

use std::path::{Path, PathBuf};

use agents::run::RunSpec;
use agents::{Agent, Task, Workspace};

use crate::spec::{EpisodeSpec, Limits};

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Workspace(#[from] agents::workspace::WorkspaceError),
    #[error("cannot materialise agent {agent}: {reason}")]
    Materialise { agent: String, reason: String },
    #[error("--artifact {path}: {reason}")]
    Artifact { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Output { path: PathBuf, reason: String },
}

/// The agent repository episodes run: `artifact` if given (checked to hold the agent's
/// package), else the clean agent materialised into `out/repo`.
pub fn agent_repo(
    agent: &Agent,
    artifact: Option<&Path>,
    out: &Path,
) -> Result<PathBuf, PlanError> {
    if let Some(dir) = artifact {
        let bad = |reason: String| PlanError::Artifact {
            path: dir.to_owned(),
            reason,
        };
        let dir = std::fs::canonicalize(dir).map_err(|e| bad(e.to_string()))?;
        let main = dir.join(&agent.manifest.package).join("__main__.py");
        if !main.is_file() {
            return Err(bad(format!(
                "not a repository of agent {} (no {}/__main__.py)",
                agent.name, agent.manifest.package
            )));
        }
        return Ok(dir);
    }
    let repo = out.join("repo");
    if repo.exists() {
        std::fs::remove_dir_all(&repo).map_err(|e| PlanError::Output {
            path: repo.clone(),
            reason: format!("cannot replace the previous materialisation: {e}"),
        })?;
    }
    agents::local::materialize(agent, &repo).map_err(|e| PlanError::Materialise {
        agent: agent.name.clone(),
        reason: e.to_string(),
    })?;
    Ok(repo)
}

/// One episode per (task, seed), in `out/runs/TASK-sSEED/`.
#[allow(clippy::too_many_arguments)]
pub fn episode_specs(
    workspace: &Workspace,
    agent: &Agent,
    tasks: &[Task],
    seeds: &[u64],
    repo_dir: &Path,
    out: &Path,
    llm_socket: &Path,
    model: &str,
    limits: &Limits,
) -> Vec<EpisodeSpec> {
    let mut specs = Vec::new();
    for task in tasks {
        for &seed in seeds {
            let id = format!("{}-{}-s{seed}", agent.name, task.id());
            let run = RunSpec {
                model: model.to_owned(),
                python_site: agent.python_site(),
                ..RunSpec::new(
                    agent.name.clone(),
                    agent.manifest.package.clone(),
                    task.clone(),
                    seed,
                    repo_dir,
                    out.join("runs").join(format!("{}-s{seed}", task.id())),
                    workspace.corpus_dir(),
                )
            };
            specs.push(EpisodeSpec::new(
                id,
                run,
                llm_socket.to_owned(),
                limits.clone(),
            ));
        }
    }
    specs
}
