//! A whole `pathfinder run`: load the agent and its tasks, pick the backend, start the LLM
//! endpoint, run the batch with a progress bar and signal handling, write `summary.json`.
//! Blocking, with its own runtime, so that callers need no async.

use std::path::PathBuf;
use std::sync::Arc;

use agents::{Task, Workspace};
use serde::Serialize;
use taxonomy::Catalog;

use crate::backend::{Backend, BackendChoice, BackendError, ImageInputs};
use crate::batch::{progress_bar, run_batch_interruptible};
use crate::endpoint::{EndpointError, LlmChoice, LlmEndpoint};
use crate::plan::{self, PlanError};
use crate::spec::{EpisodeError, EpisodeOutcome, Limits};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Workspace(#[from] agents::workspace::WorkspaceError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("{path}: {reason}")]
    Output { path: PathBuf, reason: String },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("nothing to run: {0}")]
    Empty(String),
}

/// Which tasks of the agent's suite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskSelection {
    Ids(Vec<String>),
    All,
}

#[derive(Debug, Clone)]
pub struct RunRequest {
    pub agents_dir: PathBuf,
    pub agent: String,
    pub tasks: TaskSelection,
    pub seeds: Vec<u64>,
    /// An injected repository; `None` runs the clean agent.
    pub artifact: Option<PathBuf>,
    pub backend: BackendChoice,
    pub llm: LlmChoice,
    pub model: String,
    pub out: PathBuf,
    pub concurrency: usize,
    pub limits: Limits,
    pub recipe: PathBuf,
    pub apt_root: PathBuf,
}

/// What `summary.json` holds.
#[derive(Debug, Serialize)]
pub struct SessionReport {
    pub agent: String,
    pub backend: String,
    pub isolation: String,
    pub llm: String,
    pub repo: PathBuf,
    pub episodes: usize,
    pub succeeded: usize,
    pub contained: usize,
    pub errors: Vec<String>,
    pub interrupted: bool,
    pub outcomes: Vec<EpisodeOutcome>,
    #[serde(skip)]
    pub summary_path: PathBuf,
}

/// Runs the request; `notice` gets one-line messages (backend choice, image builds).
pub fn run_blocking(
    request: &RunRequest,
    catalog: &Catalog,
    notice: &(dyn Fn(&str) + Sync),
) -> Result<SessionReport, SessionError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .map_err(SessionError::Runtime)?;
    runtime.block_on(run(request, catalog, notice))
}

async fn run(
    request: &RunRequest,
    catalog: &Catalog,
    notice: &(dyn Fn(&str) + Sync),
) -> Result<SessionReport, SessionError> {
    let workspace = Workspace::open(&request.agents_dir)?;
    let agent = workspace.agent(&request.agent, catalog)?;
    let tasks: Vec<Task> = match &request.tasks {
        TaskSelection::All => workspace.suite(&agent)?,
        TaskSelection::Ids(ids) => ids
            .iter()
            .map(|id| workspace.task(&agent, id))
            .collect::<Result<_, _>>()?,
    };
    if tasks.is_empty() || request.seeds.is_empty() {
        return Err(SessionError::Empty("no tasks or no seeds selected".into()));
    }
    std::fs::create_dir_all(&request.out).map_err(|e| SessionError::Output {
        path: request.out.clone(),
        reason: e.to_string(),
    })?;
    let out = std::fs::canonicalize(&request.out).map_err(|e| SessionError::Output {
        path: request.out.clone(),
        reason: e.to_string(),
    })?;
    let inputs = ImageInputs {
        recipe: &request.recipe,
        apt_root: &request.apt_root,
    };
    let backend = Arc::new(Backend::select(request.backend, &inputs, notice).await?);
    let repo = plan::agent_repo(&agent, request.artifact.as_deref(), &out)?;
    let endpoint = LlmEndpoint::start(&workspace, &request.llm).await?;
    let specs = plan::episode_specs(
        &workspace,
        &agent,
        &tasks,
        &request.seeds,
        &repo,
        &out,
        endpoint.socket(),
        &request.model,
        &request.limits,
    );
    let n = specs.len();
    let report =
        run_batch_interruptible(backend.clone(), specs, request.concurrency, progress_bar(n)).await;
    let mut outcomes = Vec::new();
    let mut errors = Vec::new();
    for result in report.outcomes {
        match result {
            Ok(o) => outcomes.push(o),
            Err(EpisodeError::Cancelled { .. }) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    let session = SessionReport {
        agent: agent.name.clone(),
        backend: backend.name().into(),
        isolation: backend.isolation(),
        llm: endpoint.describe().to_owned(),
        repo,
        episodes: n,
        succeeded: outcomes.iter().filter(|o| o.run.success).count(),
        contained: outcomes
            .iter()
            .filter(|o| o.containment.contained_something())
            .count(),
        errors,
        interrupted: report.interrupted,
        outcomes,
        summary_path: out.join("summary.json"),
    };
    let json = serde_json::to_string_pretty(&session).expect("a report serialises");
    agents::run::write_atomic(&session.summary_path, json.as_bytes()).map_err(|e| {
        SessionError::Output {
            path: session.summary_path.clone(),
            reason: e.to_string(),
        }
    })?;
    Ok(session)
}
