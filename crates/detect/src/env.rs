//! One investigation's environment: the trace under investigation exported read-only into a
//! private episode directory, schema discovery for the prompt, the query history, and the
//! tools each agent (main or subagent) calls. Never writes the store: SQL goes through
//! [`SqlTool`]'s guarded connection, export and discovery through a read-only
//! [`traces::Store`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::action::Action;
use crate::error::{Error, Result};
use crate::query_history::{self, QueryHistory};
use crate::sandbox::{Exit, Sandbox, SandboxLimits};
use crate::sql::{SqlLimits, SqlRefusal, SqlTool};

/// The Detector's tools that can be switched off (the paper's Table 7 ablations).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ablations {
    pub no_sql: bool,
    pub no_shell: bool,
    pub no_subagents: bool,
    pub no_schema: bool,
    pub no_history: bool,
}

/// Who is acting: the main agent or the n-th subagent (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Actor {
    Main,
    Subagent(usize),
}

impl Actor {
    pub fn label(self) -> String {
        match self {
            Actor::Main => "main".to_string(),
            Actor::Subagent(n) => format!("subagent {n}"),
        }
    }
}

/// Limits and switches of an investigation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Tool output shown to the main agent, in characters (paper: 10K).
    pub main_output_chars: usize,
    /// Tool output shown to a subagent (paper: 100K).
    pub subagent_output_chars: usize,
    pub main_max_turns: usize,
    pub subagent_max_turns: usize,
    /// Tokens (prompt, calls and observations) after which an episode is stopped.
    pub main_token_budget: usize,
    pub subagent_token_budget: usize,
    /// Characters of schema discovery in the system prompt.
    pub schema_chars: usize,
    pub sql: SqlLimits,
    pub sandbox: SandboxLimits,
    pub ablations: Ablations,
    /// Traces of the store known to be healthy (a user's good runs). When given, each
    /// investigation is handed the one most like the trace under investigation (see
    /// [`Reference`]) to compare with; never the trace itself.
    pub references: Option<Arc<References>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            main_output_chars: 10_000,
            subagent_output_chars: 100_000,
            main_max_turns: 24,
            subagent_max_turns: 12,
            main_token_budget: 60_000,
            subagent_token_budget: 120_000,
            schema_chars: 6_000,
            sql: SqlLimits::default(),
            sandbox: SandboxLimits::default(),
            ablations: Ablations::default(),
            references: None,
        }
    }
}

impl Config {
    pub fn output_chars(&self, role: Actor) -> usize {
        match role {
            Actor::Main => self.main_output_chars,
            Actor::Subagent(_) => self.subagent_output_chars,
        }
    }
}

/// How a tool call went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// A guard refused the call (parser, authorizer, allowlist, disabled tool).
    Refused,
    /// The call ran and failed (SQL error, non-zero exit, timeout).
    Failed,
    /// The turn's text was not a well-formed call.
    Malformed,
}

/// What a policy reads back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    pub text: String,
    pub status: Status,
    /// Characters the tool produced before the output cap, when it cut them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_from: Option<usize>,
}

impl Observation {
    pub fn new(text: impl Into<String>, status: Status) -> Observation {
        Observation {
            text: text.into(),
            status,
            cut_from: None,
        }
    }
}

/// Files every episode directory holds.
pub const TRACE_FILE: &str = "trace.json";
pub const SPANS_FILE: &str = "spans.jsonl";

/// Everything the agents of one investigation share.
pub struct Investigation {
    store_path: PathBuf,
    trace_id: String,
    chatlog: bool,
    schema: Option<String>,
    config: Config,
    catalog: Arc<taxonomy::Catalog>,
    history: Arc<QueryHistory>,
    history_shared: bool,
    sandbox: std::result::Result<Sandbox, String>,
    episode_dir: tempfile::TempDir,
    reference: Option<Reference>,
}

/// A healthy run to compare the trace under investigation with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub trace_id: String,
    /// A run of the same task (the stores' `task` column agrees, or the first model request
    /// is the same), not only of the same agent.
    pub same_task: bool,
}

/// A run's framework, task and first model request: what makes two runs comparable.
type RunIdentity = (Option<String>, Option<String>, Option<String>);

/// Healthy runs of one store to compare with. Their identities are read from the store once,
/// at the first investigation, not once per investigation.
#[derive(Debug, Default)]
pub struct References {
    ids: Vec<String>,
    identities: std::sync::OnceLock<Vec<(String, RunIdentity)>>,
}

impl References {
    pub fn new(ids: Vec<String>) -> References {
        References {
            ids,
            identities: std::sync::OnceLock::new(),
        }
    }

    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    fn identities(
        &self,
        read: &mut impl FnMut(&str) -> rusqlite::Result<Option<RunIdentity>>,
    ) -> rusqlite::Result<&[(String, RunIdentity)]> {
        if self.identities.get().is_none() {
            let mut known = Vec::with_capacity(self.ids.len());
            for id in &self.ids {
                if let Some(identity) = read(id)? {
                    known.push((id.clone(), identity));
                }
            }
            // Two investigations may race to fill it; both read the same store.
            let _ = self.identities.set(known);
        }
        Ok(self.identities.get().map_or(&[], Vec::as_slice))
    }
}

impl PartialEq for References {
    fn eq(&self, other: &References) -> bool {
        self.ids == other.ids
    }
}

impl Eq for References {}

/// The reference for `trace_id` among `references`: a run of the same framework and task if
/// there is one, else of the same framework; the smallest id among equals, so the choice is
/// reproducible. `None` when no reference shares the framework.
pub fn choose_reference(
    conn: &rusqlite::Connection,
    trace_id: &str,
    references: &References,
) -> rusqlite::Result<Option<Reference>> {
    let mut about = conn.prepare_cached(
        "SELECT framework, task, (SELECT input FROM spans s WHERE s.trace_id = t.trace_id AND s.kind = 'llm' ORDER BY seq LIMIT 1) \
         FROM traces t WHERE trace_id = ?1",
    )?;
    let mut read = |id: &str| -> rusqlite::Result<Option<RunIdentity>> {
        let mut rows = about.query([id])?;
        rows.next()?
            .map(|r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .transpose()
    };
    let Some((framework, task, first_request)) = read(trace_id)? else {
        return Ok(None);
    };
    let mut best: Option<(bool, &String)> = None;
    for (candidate, (f, t, first)) in references.identities(&mut read)? {
        if candidate == trace_id || *f != framework {
            continue;
        }
        let same_task =
            (task.is_some() && *t == task) || (first_request.is_some() && *first == first_request);
        let better = match best {
            None => true,
            Some((b_same, b_id)) => {
                (same_task, std::cmp::Reverse(candidate)) > (b_same, std::cmp::Reverse(b_id))
            }
        };
        if better {
            best = Some((same_task, candidate));
        }
    }
    Ok(best.map(|(same_task, id)| Reference {
        trace_id: id.clone(),
        same_task,
    }))
}

impl Investigation {
    /// Exports `trace_id` from the store at `store_path` into a fresh episode directory,
    /// discovers the schema and sets up the sandbox. `shared_history`: a run-wide history
    /// (else a fresh one for this investigation).
    pub fn prepare(
        store_path: &Path,
        trace_id: &str,
        config: Config,
        catalog: Arc<taxonomy::Catalog>,
        shared_history: Option<Arc<QueryHistory>>,
    ) -> Result<Investigation> {
        let store_err = |source| Error::Store {
            path: store_path.to_path_buf(),
            source,
        };
        let store = traces::Store::open_read_only(store_path).map_err(store_err)?;
        let trace = match store.trace_json(trace_id) {
            Ok(t) => t,
            Err(traces::Error::UnknownTrace(_)) => {
                return Err(Error::UnknownTrace {
                    path: store_path.to_path_buf(),
                    trace_id: trace_id.to_string(),
                })
            }
            Err(e) => return Err(store_err(e)),
        };
        let chatlog = trace.get("source_format").and_then(|v| v.as_str()) == Some("chatlog");
        let episode_dir = tempfile::Builder::new()
            .prefix("pathfinder-episode-")
            .tempdir()
            .map_err(|e| Error::EpisodeDir(e.to_string()))?;
        let staging = episode_dir.path().join(".export");
        let exported = store.export_trace(trace_id, &staging).map_err(store_err)?;
        let move_in = |from: &Path, name: &str| {
            std::fs::rename(from, episode_dir.path().join(name))
                .map_err(|e| Error::EpisodeDir(format!("{}: {e}", from.display())))
        };
        move_in(&exported.trace_json, TRACE_FILE)?;
        move_in(&exported.spans_jsonl, SPANS_FILE)?;
        std::fs::remove_dir_all(&staging).map_err(|e| Error::EpisodeDir(e.to_string()))?;
        let schema = if config.ablations.no_schema {
            None
        } else {
            Some(
                traces::schema::discover(store.connection(), config.schema_chars)
                    .map_err(store_err)?,
            )
        };
        let sandbox = if config.ablations.no_shell {
            Err("the bash tool is disabled in this run".to_string())
        } else {
            Sandbox::new(episode_dir.path(), config.sandbox).map_err(|e| e.to_string())
        };
        // An ablation is asked for; only a sandbox that cannot start deserves a warning.
        if let (Err(reason), false) = (&sandbox, config.ablations.no_shell) {
            warn_once(reason);
        }
        let reference = match &config.references {
            Some(refs) => choose_reference(store.connection(), trace_id, refs)
                .map_err(|e| store_err(traces::Error::Sqlite(e)))?,
            None => None,
        };
        let history_shared = shared_history.is_some();
        Ok(Investigation {
            store_path: store_path.to_path_buf(),
            trace_id: trace_id.to_string(),
            chatlog,
            schema,
            config,
            catalog,
            history: shared_history.unwrap_or_default(),
            history_shared,
            sandbox,
            episode_dir,
            reference,
        })
    }

    /// The healthy run this investigation may compare with, when references were given.
    pub fn reference(&self) -> Option<&Reference> {
        self.reference.as_ref()
    }

    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }
    pub fn store_path(&self) -> &Path {
        &self.store_path
    }
    /// Whether the trace is a multi-agent chat log (answers may name agent and step).
    pub fn is_chatlog(&self) -> bool {
        self.chatlog
    }
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }
    pub fn config(&self) -> &Config {
        &self.config
    }
    pub fn catalog(&self) -> &taxonomy::Catalog {
        &self.catalog
    }
    pub fn history(&self) -> &QueryHistory {
        &self.history
    }
    pub fn episode_dir(&self) -> &Path {
        self.episode_dir.path()
    }
    /// The sandbox, or why the bash tool cannot run.
    pub fn sandbox(&self) -> std::result::Result<&Sandbox, &str> {
        self.sandbox.as_ref().map_err(String::as_str)
    }

    /// The tools of one agent: its own SQL connection, the shared sandbox and history.
    pub fn tools(self: &Arc<Self>, role: Actor) -> Result<AgentTools> {
        let sql = if self.config.ablations.no_sql {
            None
        } else {
            let mut limits = self.config.sql;
            if let Actor::Subagent(_) = role {
                limits.rows *= 10;
                limits.cell_chars *= 10;
            }
            Some(SqlTool::open(&self.store_path, limits)?)
        };
        Ok(AgentTools {
            inv: Arc::clone(self),
            role,
            sql,
        })
    }
}

/// One agent's tools.
pub struct AgentTools {
    inv: Arc<Investigation>,
    role: Actor,
    sql: Option<SqlTool>,
}

impl AgentTools {
    pub fn role(&self) -> Actor {
        self.role
    }

    /// Runs a `sql`, `bash` or `history` call (delegation and answers belong to the episode).
    /// Records the exchange in the query history and applies the role's output cap.
    pub fn execute(&self, action: &Action) -> Observation {
        let obs = match action {
            Action::Sql { query } => self.sql(query),
            Action::Bash { pipeline } => self.bash(pipeline),
            Action::History { question, window } => {
                if self.inv.config.ablations.no_history {
                    Observation::new("the history tool is disabled in this run", Status::Refused)
                } else {
                    let scope = (!self.inv.history_shared).then_some(self.inv.trace_id.as_str());
                    let found = self.inv.history.lookup(question, *window, scope);
                    Observation::new(query_history::render(&found, question), Status::Ok)
                }
            }
            Action::Delegate { .. } | Action::Answer { .. } => Observation::new(
                "delegate and answer are handled by the episode, not a tool",
                Status::Refused,
            ),
        };
        let obs = cap(obs, self.inv.config.output_chars(self.role), self.role);
        if matches!(action, Action::Sql { .. } | Action::Bash { .. }) {
            self.inv.history.record(
                &self.inv.trace_id,
                &self.role.label(),
                &action.render(),
                &obs.text,
            );
        }
        obs
    }

    fn sql(&self, query: &str) -> Observation {
        let Some(sql) = &self.sql else {
            return Observation::new("the sql tool is disabled in this run", Status::Refused);
        };
        match sql.run(query) {
            Ok(table) => Observation::new(table, Status::Ok),
            Err(e @ SqlRefusal::Refused(_)) => {
                Observation::new(format!("sql {e}"), Status::Refused)
            }
            Err(e) => Observation::new(format!("sql {e}"), Status::Failed),
        }
    }

    fn bash(&self, text: &str) -> Observation {
        let sandbox = match self.inv.sandbox() {
            Ok(s) => s,
            Err(reason) => {
                return Observation::new(format!("bash refused: {reason}"), Status::Refused)
            }
        };
        let pipeline = match crate::shell::parse(text) {
            Ok(p) => p,
            Err(e) => return Observation::new(format!("bash {e}"), Status::Refused),
        };
        let stages: Vec<Vec<String>> = pipeline.stages.iter().map(harden).collect();
        let mut sandbox = sandbox.clone();
        sandbox.set_stdout_bytes(self.inv.config.output_chars(self.role) * 4 + 4);
        let out = match sandbox.run(&stages) {
            Ok(out) => out,
            Err(e) => return Observation::new(format!("bash refused: {e}"), Status::Refused),
        };
        render_run(&out, &pipeline, sandbox.limits())
    }
}

/// Tool-level hardening on top of the sandbox: GNU awk and sed in their own sandbox modes
/// (no `system()`, command pipes, file redirection, `e`/`r`/`w`).
pub fn harden(stage: &crate::shell::Stage) -> Vec<String> {
    let mut argv = vec![stage.program.clone()];
    if matches!(stage.program.as_str(), "awk" | "sed") {
        argv.push("--sandbox".to_string());
    }
    argv.extend(stage.args.iter().cloned());
    argv
}

/// The observation of a pipeline run: stdout, then notes on stderr, exit status, timeout.
pub fn render_run(
    out: &crate::sandbox::RunOutput,
    pipeline: &crate::shell::Pipeline,
    limits: &SandboxLimits,
) -> Observation {
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut status = Status::Ok;
    let mut notes = Vec::new();
    if out.timed_out {
        status = Status::Failed;
        notes.push(format!(
            "[stopped: the pipeline ran past the {:?} wall-clock limit and was killed]",
            limits.wall
        ));
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr = stderr.trim();
    if !stderr.is_empty() && !out.stdout_cut {
        notes.push(format!("[stderr] {stderr}"));
    }
    for (exit, stage) in out.exits.iter().zip(&pipeline.stages) {
        match exit {
            Exit::Code(0) | Exit::Killed => {}
            // grep's 1 means "no match", not a failure.
            Exit::Code(1) if stage.program == "grep" => {}
            Exit::Code(code) => {
                status = Status::Failed;
                notes.push(format!("[{} exited with status {code}]", stage.program));
            }
            Exit::Signal(sig) => {
                status = Status::Failed;
                let why = match *sig {
                    libc::SIGXCPU => " (CPU time limit)",
                    libc::SIGXFSZ => " (file size limit)",
                    libc::SIGSEGV | libc::SIGABRT => {
                        " (crashed; the memory limit may be the cause)"
                    }
                    _ => "",
                };
                notes.push(format!("[{} killed by signal {sig}{why}]", stage.program));
            }
        }
    }
    if text.is_empty() && notes.is_empty() {
        text = "(no output)".to_string();
    }
    let mut obs = Observation::new(text, status);
    if out.stdout_cut {
        obs.cut_from = Some(usize::MAX);
    }
    for note in notes {
        if !obs.text.is_empty() && !obs.text.ends_with('\n') {
            obs.text.push('\n');
        }
        obs.text.push_str(&note);
    }
    obs
}

/// Cuts an observation to `limit` characters with a note; the main agent's note suggests
/// delegating (paper §3.3's asymmetric limits).
pub fn cap(mut obs: Observation, limit: usize, role: Actor) -> Observation {
    let total = obs.text.chars().count();
    let pipeline_cut = obs.cut_from.is_some();
    if total <= limit && !pipeline_cut {
        return obs;
    }
    let kept: String = obs.text.chars().take(limit).collect();
    let shown = kept.chars().count();
    let of = if pipeline_cut {
        "more than".to_string()
    } else {
        format!("{total}")
    };
    let hint = match role {
        Actor::Main => "narrow it (WHERE, LIMIT, head, grep), or hand the deep-dive to a subagent with `delegate: TASK` (subagents see up to 100,000 characters)",
        Actor::Subagent(_) => "narrow it (WHERE, LIMIT, head, grep) or aggregate",
    };
    obs.text = format!("{kept}\n[output cut: showed {shown} of {of} characters; {hint}]");
    obs.cut_from = Some(if pipeline_cut { shown } else { total });
    obs
}

/// Warns that the bash tool is unavailable, once per process and reason: every investigation
/// opens its own sandbox, and a missing bubblewrap would otherwise be said for each of them.
fn warn_once(reason: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if !said.iter().any(|r| r == reason) {
        said.push(reason.to_owned());
        tracing::warn!(
            "bash tool unavailable: {reason} (said once; every investigation runs without it)"
        );
    }
}
