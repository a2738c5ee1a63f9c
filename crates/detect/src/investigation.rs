//! The episode protocol every policy plays: the system prompt, one call per turn, an
//! observation per call (malformed calls included), subagents run concurrently on tokio, and a
//! turn limit and token budget that end runaway episodes. Each episode yields a [`Transcript`].

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::action::{self, Action};
use crate::env::{Actor, Config, Investigation, Observation, Status};
use crate::error::{Error, Result};
use crate::prompt::{system_prompt, PromptInput};
use crate::query_history::QueryHistory;
use crate::transcript::{now_ns, Outcome, Transcript, TurnRecord};

/// What a policy sees when it acts.
pub struct View<'a> {
    pub role: Actor,
    pub trace_id: &'a str,
    pub task: Option<&'a str>,
    pub chatlog: bool,
    pub system_prompt: &'a str,
    /// Earlier turns with their observations, oldest first.
    pub turns: &'a [TurnRecord],
    pub turns_left: usize,
    pub tokens_left: usize,
    /// A healthy run of the same agent to compare with, when the run was given references.
    pub reference: Option<&'a crate::env::Reference>,
}

/// A Detector policy: a learned model, a baseline or a scripted investigator. It writes the
/// text of one turn at a time (see [`crate::action`] for the format).
pub trait Policy: Send {
    fn name(&self) -> String;
    /// The next turn's text. An `Err` ends the episode (the policy itself failed, e.g. its
    /// model server is down); malformed text is not an error, it gets an observation.
    fn act(&mut self, view: &View<'_>) -> std::result::Result<String, String>;
    /// A fresh policy for a subagent with its own context.
    fn subagent(&self, task: &str) -> std::result::Result<Box<dyn Policy>, String>;
    /// Tokens of `text` as this policy's model counts them; the default approximates BPE
    /// tokenizers at four characters per token.
    fn count_tokens(&self, text: &str) -> usize {
        approx_tokens(text)
    }
}

/// Four characters per token, rounded up: close to GPT-style BPE on English and code.
pub fn approx_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4)
}

/// Runs investigations over one store with one configuration.
pub struct Detector {
    store_path: PathBuf,
    config: Config,
    catalog: Arc<taxonomy::Catalog>,
    run_history: Option<Arc<QueryHistory>>,
    runtime: tokio::runtime::Runtime,
}

impl Detector {
    /// `share_history`: one query history across every investigation of this detector (the
    /// paper's run-wide cache); otherwise each investigation starts empty.
    pub fn new(
        store_path: impl Into<PathBuf>,
        config: Config,
        share_history: bool,
    ) -> Result<Detector> {
        let catalog = taxonomy::Catalog::embedded().map_err(|e| Error::Catalog(e.to_string()))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .map_err(|e| Error::Runtime(e.to_string()))?;
        Ok(Detector {
            store_path: store_path.into(),
            config,
            catalog: Arc::new(catalog),
            run_history: share_history.then(|| Arc::new(QueryHistory::new())),
            runtime,
        })
    }

    pub fn catalog(&self) -> &taxonomy::Catalog {
        &self.catalog
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Prepares the investigation of `trace_id` (export, discovery, sandbox).
    pub fn prepare(&self, trace_id: &str) -> Result<Arc<Investigation>> {
        Ok(Arc::new(Investigation::prepare(
            &self.store_path,
            trace_id,
            self.config.clone(),
            Arc::clone(&self.catalog),
            self.run_history.clone(),
        )?))
    }

    /// Plays one whole episode of `policy` on `trace_id`.
    pub fn investigate(&self, trace_id: &str, policy: Box<dyn Policy>) -> Result<Transcript> {
        let inv = self.prepare(trace_id)?;
        self.runtime.block_on(run_episode(inv, policy))
    }
}

/// Plays a main-agent episode on a prepared investigation (needs a multi-threaded runtime).
pub async fn run_episode(inv: Arc<Investigation>, policy: Box<dyn Policy>) -> Result<Transcript> {
    let counter = Arc::new(AtomicUsize::new(0));
    run_agent(inv, Actor::Main, None, policy, counter).await
}

type AgentFuture = Pin<Box<dyn Future<Output = Result<Transcript>> + Send>>;

fn run_agent(
    inv: Arc<Investigation>,
    role: Actor,
    task: Option<String>,
    mut policy: Box<dyn Policy>,
    subagents: Arc<AtomicUsize>,
) -> AgentFuture {
    Box::pin(async move {
        let tools = inv.tools(role)?;
        let cfg = inv.config();
        let (max_turns, budget) = match role {
            Actor::Main => (cfg.main_max_turns, cfg.main_token_budget),
            Actor::Subagent(_) => (cfg.subagent_max_turns, cfg.subagent_token_budget),
        };
        let prompt = system_prompt(&PromptInput {
            trace_id: inv.trace_id(),
            role,
            task: task.as_deref(),
            chatlog: inv.is_chatlog(),
            schema: inv.schema(),
            ablations: cfg.ablations,
            output_chars: cfg.output_chars(role),
            max_turns,
            catalog: inv.catalog(),
        });
        let started = now_ns();
        let prompt_tokens = policy.count_tokens(&prompt);
        let mut total = prompt_tokens;
        let mut turns: Vec<TurnRecord> = Vec::new();
        let outcome = loop {
            if turns.len() >= max_turns {
                break Outcome::TurnLimit;
            }
            if total >= budget {
                break Outcome::TokenBudget;
            }
            let turn_start = now_ns();
            let text = {
                let view = View {
                    role,
                    trace_id: inv.trace_id(),
                    task: task.as_deref(),
                    chatlog: inv.is_chatlog(),
                    system_prompt: &prompt,
                    turns: &turns,
                    turns_left: max_turns - turns.len(),
                    tokens_left: budget - total,
                    reference: inv.reference(),
                };
                blocking(|| policy.act(&view))
            };
            let acted = now_ns();
            let text = match text {
                Ok(t) => t,
                Err(message) => break Outcome::PolicyError { message },
            };
            let action_tokens = policy.count_tokens(&text);
            total += action_tokens;
            let mut record = TurnRecord {
                index: turns.len(),
                started_unix_ns: turn_start,
                acted_unix_ns: acted,
                ended_unix_ns: acted,
                text: text.clone(),
                thought: String::new(),
                action: None,
                observation: Observation::new("", Status::Ok),
                action_tokens,
                observation_tokens: 0,
                subagents: Vec::new(),
            };
            let mut finished: Option<Outcome> = None;
            let observation = match action::parse(&text) {
                Err(e) => Observation::new(
                    format!("{e}\nWrite one line such as `sql: SELECT ...`, `bash: PIPELINE` or `answer: ID COMPONENT | EVIDENCE`."),
                    Status::Malformed,
                ),
                Ok(turn) => {
                    record.thought = turn.thought;
                    record.action = Some(turn.action.clone());
                    match turn.action {
                        Action::Answer { text } => match role {
                            Actor::Subagent(_) => {
                                finished = Some(Outcome::Summary { text });
                                Observation::new("summary returned to the main agent", Status::Ok)
                            }
                            Actor::Main => match action::parse_verdict(&text, inv.catalog()) {
                                Ok(verdict) => {
                                    finished = Some(Outcome::Answered { verdict });
                                    Observation::new("verdict recorded; the investigation is over", Status::Ok)
                                }
                                Err(reason) => Observation::new(format!("answer refused: {reason}"), Status::Malformed),
                            },
                        },
                        Action::Delegate { tasks } => {
                            if role != Actor::Main {
                                Observation::new("delegate refused: subagents cannot delegate; investigate yourself", Status::Refused)
                            } else if cfg.ablations.no_subagents {
                                Observation::new("delegate refused: subagents are disabled in this run", Status::Refused)
                            } else {
                                let policies = tasks
                                    .iter()
                                    .map(|t| policy.subagent(t))
                                    .collect::<std::result::Result<Vec<_>, _>>()
                                    .map_err(|message| Error::Policy { policy: policy.name(), message })?;
                                let (obs, transcripts) = delegate(&inv, tasks, policies, &subagents).await?;
                                record.subagents = transcripts;
                                obs
                            }
                        }
                        other => blocking(|| tools.execute(&other)),
                    }
                }
            };
            record.ended_unix_ns = now_ns();
            record.observation_tokens = policy.count_tokens(&observation.text);
            total += record.observation_tokens;
            record.observation = observation;
            turns.push(record);
            if let Some(outcome) = finished {
                break outcome;
            }
        };
        Ok(Transcript {
            episode_id: crate::transcript::fresh_id(),
            investigated_trace: inv.trace_id().to_string(),
            role,
            task,
            policy: policy.name(),
            system_prompt: prompt,
            started_unix_ns: started,
            ended_unix_ns: now_ns(),
            prompt_tokens,
            total_tokens: total,
            turns,
            outcome,
        })
    })
}

/// Starts one subagent per task, concurrently, and gathers their summaries.
async fn delegate(
    inv: &Arc<Investigation>,
    tasks: Vec<String>,
    policies: Vec<Box<dyn Policy>>,
    counter: &Arc<AtomicUsize>,
) -> Result<(Observation, Vec<Transcript>)> {
    let started = Instant::now();
    let mut handles = Vec::new();
    for (task, policy) in tasks.iter().zip(policies) {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        handles.push(tokio::spawn(run_agent(
            Arc::clone(inv),
            Actor::Subagent(n),
            Some(task.clone()),
            policy,
            Arc::clone(counter),
        )));
    }
    let mut transcripts = Vec::new();
    let mut text = String::new();
    for (task, handle) in tasks.iter().zip(handles) {
        let t = handle
            .await
            .map_err(|e| Error::Runtime(format!("subagent task failed: {e}")))??;
        let label = t.role.label();
        let summary = match &t.outcome {
            Outcome::Summary { text } => text.clone(),
            other => format!("(stopped without a summary: {})", other.describe()),
        };
        inv.history().record(
            inv.trace_id(),
            &label,
            &format!("delegate: {task}"),
            &summary,
        );
        text.push_str(&format!("{label} ({task}): {summary}\n"));
        transcripts.push(t);
    }
    tracing::debug!(
        tasks = tasks.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "subagents done"
    );
    Ok((
        Observation::new(text.trim_end().to_string(), Status::Ok),
        transcripts,
    ))
}

/// Runs blocking work (a policy's model call, SQLite, a sandboxed pipeline) without stalling
/// other agents' tasks on a multi-threaded runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
