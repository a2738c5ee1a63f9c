//! `baselines`: the one-prompt detectors `pathfinder eval` compares the trained Detector with
//! (paper §6, Table 5). Both show the bare base model the trace as text in a single prompt,
//! with the catalog of deficiency types, and take its one reply, decoded under the answer-only
//! action grammar (`policy::baseline`), as the verdict — always a valid `ID COMPONENT`:
//!
//! - [`zero_shot`]: the whole trace, one line per span ([`render`]), cut to the prompt budget;
//! - [`rag`]: only the trace's [`RAG_K`] chunks of span lines that all-MiniLM-L6-v2
//!   (`retrieve`) ranks closest to [`RAG_QUERY`], in trace order.
//!
//! They are scored through `eval::store_eval::run_policies`, like every other detector.
//!
//! Invariants: reads only the trace's spans (never labels: those reach `eval`'s scoring only);
//! writes nothing; one model call per trace, greedy, so the same model, embedder and store give
//! the same verdicts; depends on `traces`, `detect`, `eval`, `policy`, `retrieve`, `model` and
//! `taxonomy`.

pub mod render;

pub use render::{render_span, render_spans};

use std::path::Path;
use std::sync::{Arc, Mutex};

use detect::{Ablations, Config, Transcript};
use eval::metrics::Case;
use eval::store_eval::{self, Labelled};
use policy::baseline::{self, BaselineOptions, OnePromptDetector};
use policy::{ActionGrammar, PolicyModel, SharedModel};

/// What can go wrong in a baseline run.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    #[error("rag retrieval: {0}")]
    Retrieve(#[from] retrieve::RetrieveError),
    #[error(transparent)]
    Eval(#[from] eval::Error),
    #[error("deficiency catalog: {0}")]
    Catalog(String),
}

pub type Result<T> = std::result::Result<T, BaselineError>;

/// The RAG baseline's query: what the telling spans of a failing trace talk about.
pub const RAG_QUERY: &str = "error: a tool call, an LLM call or the agent's own code failed, raised an exception, timed out, retried in a loop or returned a wrong result";
/// Chunks the RAG baseline puts in its prompt.
pub const RAG_K: usize = 5;
/// Characters of one chunk of span lines: about all-MiniLM-L6-v2's 128-token window, so the
/// embedding sees the whole chunk.
pub const RAG_CHUNK_CHARS: usize = 400;

/// The episode settings of a one-prompt baseline: one turn, no delegation or history (it
/// calls no tool at all; the grammar allows only `answer:`).
pub fn config() -> Config {
    Config {
        main_max_turns: 1,
        ablations: Ablations {
            no_subagents: true,
            no_history: true,
            ..Ablations::default()
        },
        ..Config::default()
    }
}

/// The RAG baseline's view of a trace: its [`RAG_K`] chunks (of [`RAG_CHUNK_CHARS`]) most
/// similar to `query` (an embedding of [`RAG_QUERY`]), in trace order, separated by `[…]`.
pub fn retrieved(embedder: &retrieve::Embedder, query: &[f32], lines: &[String]) -> Result<String> {
    let chunks = retrieve::chunk_lines(lines, RAG_CHUNK_CHARS);
    let texts: Vec<&str> = chunks.iter().map(String::as_str).collect();
    let vectors = embedder.embed(&texts)?;
    let mut chosen = retrieve::top_k(query, &vectors, RAG_K);
    chosen.sort_unstable();
    Ok(chosen
        .into_iter()
        .map(|i| chunks[i].as_str())
        .collect::<Vec<_>>()
        .join("\n[…]\n"))
}

/// Investigates `traces` of the store `db` with the zero-shot baseline over `pm` (the bare
/// base model: no adapter is activated). `on_done` sees each case as it is scored, with its
/// one-turn transcript (the HTML pages show it).
pub fn zero_shot(
    db: &Path,
    traces: &[Labelled],
    pm: PolicyModel,
    options: &BaselineOptions,
    on_done: impl FnMut(&Case, &Transcript),
) -> Result<Vec<Case>> {
    one_prompt(
        db,
        traces,
        pm,
        options,
        "zero-shot",
        |lines| Ok(lines.join("\n")),
        on_done,
    )
}

/// Investigates `traces` with the RAG baseline: `embedder` picks what `pm` reads.
pub fn rag(
    db: &Path,
    traces: &[Labelled],
    pm: PolicyModel,
    embedder: &retrieve::Embedder,
    options: &BaselineOptions,
    on_done: impl FnMut(&Case, &Transcript),
) -> Result<Vec<Case>> {
    let query = embedder.embed(&[RAG_QUERY])?.pop().ok_or_else(|| {
        retrieve::RetrieveError::Tokenizer("the embedder returned no vector for the query".into())
    })?;
    one_prompt(
        db,
        traces,
        pm,
        options,
        "rag",
        |lines| retrieved(embedder, &query, lines),
        on_done,
    )
}

/// A one-prompt baseline named `name`: `context` turns a trace's rendered span lines into what
/// the prompt shows.
fn one_prompt(
    db: &Path,
    traces: &[Labelled],
    pm: PolicyModel,
    options: &BaselineOptions,
    name: &str,
    mut context: impl FnMut(&[String]) -> Result<String>,
    on_done: impl FnMut(&Case, &Transcript),
) -> Result<Vec<Case>> {
    let catalog =
        taxonomy::Catalog::embedded().map_err(|e| BaselineError::Catalog(e.to_string()))?;
    let grammar = Arc::new(ActionGrammar::new(
        &pm.tokenizer,
        &catalog,
        &baseline::ANSWER_ONLY,
    )?);
    // The reply always has room for the longest valid verdict and some evidence.
    let options = BaselineOptions {
        max_answer_tokens: options.max_answer_tokens.max(grammar.answer_budget(8)),
        ..options.clone()
    };
    let system: Arc<str> = baseline::system_prompt(&catalog).into();
    // A budget the fixed prompt already exceeds fails here, not as a policy error per trace.
    if let Some(first) = traces.first() {
        baseline::trace_budget(&pm, &system, &first.trace_id, &options)?;
    }
    let shared: SharedModel = Arc::new(Mutex::new(pm));
    let prefix: baseline::PrefixCache = Arc::new(Mutex::new(None));
    let store = traces::Store::open_read_only(db).map_err(|e| eval::Error::Store {
        path: db.to_path_buf(),
        cause: Box::new(e),
    })?;
    let cases = store_eval::run_policies_transcribed(
        db,
        traces,
        config(),
        |t| {
            let spans = store.spans(&t.trace_id).map_err(|e| {
                eval::Error::Detector(format!(
                    "{}: reading the spans of trace {}: {e}",
                    db.display(),
                    t.trace_id
                ))
            })?;
            let lines = render_spans(&spans, options.field_chars);
            let text = context(&lines)
                .map_err(|e| eval::Error::Detector(format!("{name}: trace {}: {e}", t.trace_id)))?;
            Ok(Box::new(
                OnePromptDetector::new(
                    Arc::clone(&shared),
                    Arc::clone(&grammar),
                    options.clone(),
                    name,
                    Arc::clone(&system),
                    text,
                )
                .with_prefix_cache(Arc::clone(&prefix)),
            ))
        },
        on_done,
    )?;
    Ok(cases)
}
