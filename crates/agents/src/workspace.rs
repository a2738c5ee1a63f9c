//! The `agents/` directory: agents, tasks, corpus and scripts, by their contract paths.

use std::path::{Path, PathBuf};

use taxonomy::Catalog;

use crate::history::{HistoryError, Series};
use crate::manifest::{AgentManifest, ManifestError};
use crate::tasks::{self, Task, TaskError};

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("{path}: not an agents directory (no CONTRACT.md); pass --agents-dir or run from the repository root")]
    NotAgentsDir { path: PathBuf },
    #[error("no agent {name:?} in {dir} (known: {known})")]
    UnknownAgent {
        name: String,
        dir: PathBuf,
        known: String,
    },
    // Boxed: these are large, and this error travels up through every runner.
    #[error(transparent)]
    Manifest(Box<ManifestError>),
    #[error(transparent)]
    History(Box<HistoryError>),
    #[error(transparent)]
    Task(Box<TaskError>),
    #[error("{path}: cannot read")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl From<ManifestError> for WorkspaceError {
    fn from(err: ManifestError) -> WorkspaceError {
        WorkspaceError::Manifest(Box::new(err))
    }
}

impl From<HistoryError> for WorkspaceError {
    fn from(err: HistoryError) -> WorkspaceError {
        WorkspaceError::History(Box::new(err))
    }
}

impl From<TaskError> for WorkspaceError {
    fn from(err: TaskError) -> WorkspaceError {
        WorkspaceError::Task(Box::new(err))
    }
}

/// `agents/` on disk.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
}

/// An agent loaded and validated: its manifest and its fix series.
#[derive(Debug, Clone)]
pub struct Agent {
    pub name: String,
    pub dir: PathBuf,
    pub manifest: AgentManifest,
    pub series: Series,
}

impl Agent {
    /// The installed dependencies of an agent built on a third-party framework
    /// ([`crate::vendor`]), which its runs need on `PYTHONPATH`; `None` for a standard-library
    /// agent.
    pub fn python_site(&self) -> Option<PathBuf> {
        self.manifest
            .python
            .as_ref()
            .map(|_| self.dir.join(crate::vendor::SITE_DIR))
    }
}

impl Workspace {
    /// Opens `root`, which must hold `CONTRACT.md`.
    pub fn open(root: &Path) -> Result<Workspace, WorkspaceError> {
        if !root.join("CONTRACT.md").is_file() {
            return Err(WorkspaceError::NotAgentsDir {
                path: root.to_owned(),
            });
        }
        // Absolute, because agents run with their repository as working directory.
        let root = root.canonicalize().map_err(|source| WorkspaceError::Io {
            path: root.to_owned(),
            source,
        })?;
        Ok(Workspace { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn tasks_dir(&self) -> PathBuf {
        self.root.join("tasks")
    }

    pub fn corpus_dir(&self) -> PathBuf {
        self.root.join("tasks/corpus")
    }

    pub fn scripts_dir(&self) -> PathBuf {
        self.root.join("tasks/scripts")
    }

    /// Names of the directories that hold an `agent.toml`, sorted.
    pub fn agent_names(&self) -> Result<Vec<String>, WorkspaceError> {
        let entries = std::fs::read_dir(&self.root).map_err(|source| WorkspaceError::Io {
            path: self.root.clone(),
            source,
        })?;
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().join("agent.toml").is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Loads and validates one agent.
    pub fn agent(&self, name: &str, catalog: &Catalog) -> Result<Agent, WorkspaceError> {
        let known = self.agent_names()?;
        if !known.iter().any(|k| k == name) {
            return Err(WorkspaceError::UnknownAgent {
                name: name.to_owned(),
                dir: self.root.clone(),
                known: known.join(", "),
            });
        }
        let dir = self.root.join(name);
        let manifest = AgentManifest::load(&dir, catalog)?;
        let series = Series::load(&dir.join("history"), catalog)?;
        Ok(Agent {
            name: name.to_owned(),
            dir,
            manifest,
            series,
        })
    }

    /// One task of the agent's suite.
    pub fn task(&self, agent: &Agent, id: &str) -> Result<Task, WorkspaceError> {
        Ok(tasks::load_task(
            &self.tasks_dir(),
            agent.manifest.task_suite,
            id,
        )?)
    }

    /// The agent's whole suite.
    pub fn suite(&self, agent: &Agent) -> Result<Vec<Task>, WorkspaceError> {
        Ok(tasks::load_suite(
            &self.tasks_dir(),
            agent.manifest.task_suite,
        )?)
    }
}
