//! The bug artifact: one directory per injection.
//!
//! ```text
//! OUT/repo/                     the agent's repository, checked out on inject/KEY
//! OUT/deficiency_inject.diff    the unified diff (git2) from the base to the injected tree
//! OUT/deficiency_type           the catalog id (absent for an untyped free-form diff)
//! OUT/trace_signature           the catalog's trace signature for that id
//! OUT/location.json             the ground-truth Location
//! OUT/injection.json            everything about the injection (strategy, commits, edits)
//! ```
//!
//! The directory is built beside OUT under a temporary name and renamed into place at the end,
//! so OUT either holds a complete artifact or does not exist.

use std::path::{Path, PathBuf};

use agents::{Agent, Workspace};
use git2::Repository;
use serde::Serialize;
use taxonomy::Catalog;

use crate::engine::{self, InjectError, Injection, Options};
use crate::template::Template;

/// File names inside an artifact directory.
pub const DIFF_FILE: &str = "deficiency_inject.diff";
pub const TYPE_FILE: &str = "deficiency_type";
pub const SIGNATURE_FILE: &str = "trace_signature";
pub const LOCATION_FILE: &str = "location.json";
pub const INJECTION_FILE: &str = "injection.json";
pub const REPO_DIR: &str = "repo";

/// A written artifact.
#[derive(Debug, Clone, Serialize)]
pub struct Artifact {
    pub dir: PathBuf,
    pub agent: String,
    /// The template file, when the injection came from one.
    pub template: Option<PathBuf>,
    pub injection: Injection,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InjectError + '_ {
    move |source| InjectError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Claims `out` (absent or empty) and returns the temporary sibling to build in.
fn staging_dir(out: &Path) -> Result<PathBuf, InjectError> {
    let out_err = |reason: String| InjectError::Output {
        path: out.to_owned(),
        reason,
    };
    if out.exists() {
        let empty = std::fs::read_dir(out)
            .map_err(|e| out_err(e.to_string()))?
            .next()
            .is_none();
        if !empty {
            return Err(out_err("exists and is not empty".into()));
        }
        std::fs::remove_dir(out).map_err(|e| out_err(e.to_string()))?;
    }
    let name = out
        .file_name()
        .ok_or_else(|| out_err("has no final component".into()))?;
    let staging = out.with_file_name(format!(".{}.partial", name.to_string_lossy()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io(&staging))?;
    }
    if let Some(parent) = staging.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    Ok(staging)
}

fn materialize(agent: &Agent, repo_dir: &Path) -> Result<Repository, InjectError> {
    agents::history::materialize(&agent.name, &agent.dir, &agent.series, repo_dir)
        .map_err(|e| InjectError::History(Box::new(e)))?;
    Repository::open(repo_dir).map_err(|source| InjectError::Git {
        context: format!("opening {}", repo_dir.display()),
        source,
    })
}

fn write_files(
    dir: &Path,
    injection: &Injection,
    catalog: &Catalog,
    agent: &str,
    template: Option<&Template>,
) -> Result<(), InjectError> {
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(io(&path))
    };
    write(DIFF_FILE, injection.diff.as_bytes())?;
    if let Some(def) = injection
        .deficiency
        .as_deref()
        .and_then(|id| catalog.get(id))
    {
        write(TYPE_FILE, format!("{}\n", def.id).as_bytes())?;
        write(
            SIGNATURE_FILE,
            format!("{}\n", def.trace_signature.trim()).as_bytes(),
        )?;
    }
    let location = serde_json::to_string_pretty(&injection.location).expect("serialises");
    write(LOCATION_FILE, format!("{location}\n").as_bytes())?;
    let meta = serde_json::json!({
        "agent": agent,
        "template": template.map(|t| t.path.display().to_string()),
        "description": template.map(|t| t.description.trim().to_owned()),
        "tasks": template.map(|t| t.tasks.clone()).unwrap_or_default(),
        "injection": injection,
    });
    let meta = serde_json::to_string_pretty(&meta).expect("serialises");
    write(INJECTION_FILE, format!("{meta}\n").as_bytes())
}

fn finish_artifact(staging: &Path, out: &Path) -> Result<PathBuf, InjectError> {
    std::fs::rename(staging, out).map_err(io(out))?;
    Ok(out.to_owned())
}

/// Materialises `agent` into `out/repo`, applies `template` and writes the artifact.
pub fn inject_template(
    agent: &Agent,
    template: &Template,
    catalog: &Catalog,
    out: &Path,
    options: &Options,
) -> Result<Artifact, InjectError> {
    if template.agent != agent.name {
        return Err(InjectError::Output {
            path: template.path.clone(),
            reason: format!("the template is for {}, not {}", template.agent, agent.name),
        });
    }
    let staging = staging_dir(out)?;
    let result = (|| {
        let repo = materialize(agent, &staging.join(REPO_DIR))?;
        let injection = engine::apply_template(&repo, template, options)?;
        write_files(&staging, &injection, catalog, &agent.name, Some(template))?;
        Ok(injection)
    })();
    match result {
        Ok(injection) => Ok(Artifact {
            dir: finish_artifact(&staging, out)?,
            agent: agent.name.clone(),
            template: Some(template.path.clone()),
            injection,
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

/// Materialises `agent` into `out/repo`, applies a free-form diff and writes the artifact.
pub fn inject_diff(
    agent: &Agent,
    diff_text: &str,
    deficiency: Option<&str>,
    catalog: &Catalog,
    out: &Path,
    options: &Options,
) -> Result<Artifact, InjectError> {
    let staging = staging_dir(out)?;
    let result = (|| {
        let repo = materialize(agent, &staging.join(REPO_DIR))?;
        let injection =
            engine::apply_diff(&repo, diff_text, deficiency, &agent.manifest.sites, options)?;
        write_files(&staging, &injection, catalog, &agent.name, None)?;
        Ok(injection)
    })();
    match result {
        Ok(injection) => Ok(Artifact {
            dir: finish_artifact(&staging, out)?,
            agent: agent.name.clone(),
            template: None,
            injection,
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

/// Loads an agent from the workspace, mapping the error.
pub fn load_agent(
    workspace: &Workspace,
    name: &str,
    catalog: &Catalog,
) -> Result<Agent, InjectError> {
    workspace
        .agent(name, catalog)
        .map_err(|e| InjectError::Workspace(Box::new(e)))
}
