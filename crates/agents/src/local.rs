//! The local run path: materialise the agent, start the scripted server in-process on a Unix
//! socket (or use an external endpoint), run one task or the whole suite.
//!
//! Run directories: a single run writes `OUT/repo/` (the materialised agent), `OUT/pycache/`
//! (its bytecode, kept out of the repository) and the files of [`crate::run::RunLayout`]
//! directly in `OUT/`; a suite writes `OUT/repo/`, `OUT/pycache/`, `OUT/runs/TASK_ID/` per
//! task and `OUT/summary.json`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use llmserve::{BackgroundServer, Listen, ScriptStore, ScriptedBackend, ServerConfig};
use serde::Serialize;

use crate::history::{self, HistoryError, Materialized};
use crate::run::{self, RunError, RunOutcome, RunSpec};
use crate::tasks::Task;
use crate::workspace::{Agent, Workspace, WorkspaceError};

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("cannot start the scripted LLM server")]
    Serve(#[from] llmserve::ServeError),
    #[error("{path}: {reason}")]
    Output { path: PathBuf, reason: String },
}

/// Which endpoint the agent calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Llm {
    /// The scripted backend, served in-process on a private Unix socket.
    Scripted,
    /// Any OpenAI-compatible endpoint (`http://HOST:PORT` or `unix:/path`).
    External(String),
}

/// Knobs of a local run.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    pub llm: Llm,
    pub python: String,
    pub model: String,
    pub timeout: Duration,
    pub test_timeout: Duration,
    /// Replace an existing run directory (only one that holds a previous run).
    pub replace: bool,
}

impl Default for LocalOptions {
    fn default() -> LocalOptions {
        LocalOptions {
            llm: Llm::Scripted,
            python: "python3".into(),
            model: run::DEFAULT_MODEL.into(),
            timeout: Duration::from_secs(120),
            test_timeout: Duration::from_secs(120),
            replace: false,
        }
    }
}

/// An endpoint for the duration of a run or suite; stops the in-process server when dropped.
pub struct Endpoint {
    url: String,
    server: Option<BackgroundServer>,
    scripted: Option<Arc<ScriptedBackend>>,
    // Declared after `server` so the socket directory outlives the server.
    _socket_dir: Option<tempfile::TempDir>,
}

impl Endpoint {
    /// Starts the scripted server on a socket in a fresh temporary directory (socket paths are
    /// limited to ~100 bytes, so it cannot live in an arbitrary run directory).
    pub fn start(workspace: &Workspace, llm: &Llm) -> Result<Endpoint, LocalError> {
        match llm {
            Llm::External(url) => Ok(Endpoint {
                url: url.clone(),
                server: None,
                scripted: None,
                _socket_dir: None,
            }),
            Llm::Scripted => {
                let dir = tempfile::Builder::new()
                    .prefix("pf-llm-")
                    .tempdir()
                    .map_err(|e| LocalError::Output {
                        path: std::env::temp_dir(),
                        reason: format!("cannot create a socket directory: {e}"),
                    })?;
                let backend = Arc::new(ScriptedBackend::new(ScriptStore::new(
                    workspace.scripts_dir(),
                )));
                let server = BackgroundServer::start(
                    ServerConfig::new(Listen::Unix(dir.path().join("llm.sock"))),
                    backend.clone(),
                )?;
                Ok(Endpoint {
                    url: server.url().to_owned(),
                    server: Some(server),
                    scripted: Some(backend),
                    _socket_dir: Some(dir),
                })
            }
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn is_in_process(&self) -> bool {
        self.server.is_some()
    }

    /// The scripted model's departures from its scripts so far (see
    /// `llmserve::departure`); empty for an external endpoint.
    pub fn departures(&self) -> Vec<String> {
        self.scripted
            .as_ref()
            .map(|b| b.departures())
            .unwrap_or_default()
    }
}

/// Makes `out` ready to receive a run: absent, empty, or (with `replace`) a previous run's
/// directory, which is removed.
fn claim_out_dir(out: &Path, replace: bool) -> Result<PathBuf, LocalError> {
    // Absolute, because agents run with their repository as working directory.
    let out = &std::path::absolute(out).map_err(|e| LocalError::Output {
        path: out.to_owned(),
        reason: e.to_string(),
    })?;
    let err = |reason: String| LocalError::Output {
        path: out.to_owned(),
        reason,
    };
    if out.exists() {
        let empty = std::fs::read_dir(out)
            .map_err(|e| err(e.to_string()))?
            .next()
            .is_none();
        if !empty {
            let previous_run = out.join("repo/.git").exists()
                && (out.join("outcome.json").exists()
                    || out.join("summary.json").exists()
                    || out.join("runs").exists()
                    || out.join("task.json").exists());
            if !replace {
                return Err(err(
                    "exists and is not empty (pass --force to replace a previous run, or another --out)"
                        .into(),
                ));
            }
            if !previous_run {
                return Err(err(
                    "exists and does not look like a previous run directory; refusing to delete it"
                        .into(),
                ));
            }
            std::fs::remove_dir_all(out).map_err(|e| err(e.to_string()))?;
        }
    }
    std::fs::create_dir_all(out).map_err(|e| err(e.to_string()))?;
    Ok(out.to_owned())
}

/// Materialises `agent` into `out` (see [`history::materialize`]).
pub fn materialize(agent: &Agent, out: &Path) -> Result<Materialized, LocalError> {
    Ok(history::materialize(
        &agent.name,
        &agent.dir,
        &agent.series,
        out,
    )?)
}

/// What the runs of one invocation share: the agent, its materialised repository and the
/// endpoint.
struct Prepared<'a> {
    workspace: &'a Workspace,
    agent: &'a Agent,
    repo: PathBuf,
    endpoint: Endpoint,
    options: &'a LocalOptions,
}

impl Prepared<'_> {
    fn spec(&self, task: &Task, seed: u64, out_dir: &Path) -> RunSpec {
        RunSpec {
            llm_url: self.endpoint.url().to_owned(),
            model: self.options.model.clone(),
            python: self.options.python.clone(),
            timeout: self.options.timeout,
            test_timeout: self.options.test_timeout,
            pycache_dir: self.repo.parent().map(|p| p.join("pycache")),
            python_site: self.agent.python_site(),
            ..RunSpec::new(
                self.agent.name.clone(),
                self.agent.manifest.package.clone(),
                task.clone(),
                seed,
                self.repo.clone(),
                out_dir,
                self.workspace.corpus_dir(),
            )
        }
    }
}

fn prepare<'a>(
    workspace: &'a Workspace,
    agent: &'a Agent,
    out: &Path,
    options: &'a LocalOptions,
) -> Result<Prepared<'a>, LocalError> {
    let repo = out.join("repo");
    materialize(agent, &repo)?;
    let endpoint = Endpoint::start(workspace, &options.llm)?;
    Ok(Prepared {
        workspace,
        agent,
        repo,
        endpoint,
        options,
    })
}

/// Runs `agent` on `task` with `seed`, writing the run into `out`.
pub fn run_task(
    workspace: &Workspace,
    agent: &Agent,
    task: &Task,
    seed: u64,
    out: &Path,
    options: &LocalOptions,
) -> Result<RunOutcome, LocalError> {
    let out = &claim_out_dir(out, options.replace)?;
    let prepared = prepare(workspace, agent, out, options)?;
    Ok(run::run(&prepared.spec(task, seed, out))?)
}

/// The result of a whole suite.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteReport {
    pub agent: String,
    pub seed: u64,
    pub total: usize,
    pub succeeded: usize,
    pub outcomes: Vec<RunOutcome>,
}

impl SuiteReport {
    /// Successes over tasks, in [0, 1].
    pub fn success_rate(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.succeeded as f64 / self.total as f64
        }
    }
}

/// Runs `agent` on every task of its suite, one after the other, against one endpoint and one
/// materialised repository. `on_done` is called after each task (for progress reporting).
pub fn run_suite(
    workspace: &Workspace,
    agent: &Agent,
    seed: u64,
    out: &Path,
    options: &LocalOptions,
    mut on_done: impl FnMut(usize, usize, &RunOutcome),
) -> Result<SuiteReport, LocalError> {
    let tasks = workspace.suite(agent)?;
    let out = &claim_out_dir(out, options.replace)?;
    let prepared = prepare(workspace, agent, out, options)?;
    let mut outcomes = Vec::with_capacity(tasks.len());
    for (i, task) in tasks.iter().enumerate() {
        let run_dir = out.join("runs").join(task.id());
        let outcome = run::run(&prepared.spec(task, seed, &run_dir))?;
        on_done(i + 1, tasks.len(), &outcome);
        outcomes.push(outcome);
    }
    let report = SuiteReport {
        agent: agent.name.clone(),
        seed,
        total: outcomes.len(),
        succeeded: outcomes.iter().filter(|o| o.success).count(),
        outcomes,
    };
    let json = serde_json::to_string_pretty(&report).expect("a report serialises");
    run::write_atomic(&out.join("summary.json"), json.as_bytes())?;
    Ok(report)
}
