//! External traces: a directory of labelled multi-agent chat logs (the Who&When format) is
//! imported into a temporary store, and a blame baseline names the responsible agent and step
//! of each log.
//!
//! Detectors: `expert` (the scripted investigator's blame probes over the log imported as a
//! trace, `detect::policies`), a trained checkpoint (through [`evaluate_with`]), and the
//! baseline `first-error`, a non-learned heuristic: walk the turns in order (skipping
//! the human's task statement) and find the first turn that failed — a code-execution turn
//! with a non-zero exit code, or a turn whose text carries an error or failure word. A failed
//! code execution is blamed on the agent turn before it (the one that wrote the code); any
//! other failing turn is blamed on its own agent. A log with no failing turn is blamed on its
//! first agent turn, since in such logs the decisive mistake is usually an early plan or
//! claim. It reads the turns directly and makes no tool calls.

use std::path::{Path, PathBuf};

use traces::{Span, SpanKind, StatusCode};

use crate::error::{Error, Result};
use crate::metrics::BlameCase;

/// The blame detectors implemented.
pub const BLAME_DETECTORS: &[&str] = &["first-error", "expert"];

/// Words that mark a failing turn (matched case-insensitively on word boundaries).
const FAILURE_WORDS: &[&str] = &[
    "error",
    "errors",
    "exception",
    "traceback",
    "failed",
    "failure",
    "fails",
    "unable",
    "cannot",
    "incorrect",
    "invalid",
];

/// Agents that state the task rather than act on it.
fn is_task_giver(span: &Span) -> bool {
    let agent = span.agent_name.as_deref().unwrap_or_default();
    agent.eq_ignore_ascii_case("human")
        || (span.step == Some(0)
            && span
                .attributes
                .get("chat.role")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|r| r == "user" || r == "human")
            && span.attributes.get("chat.name").is_none())
}

/// A code-execution turn (the importer marks AutoGen's `exitcode:` turns as tool spans).
fn is_execution(span: &Span) -> bool {
    span.kind == SpanKind::Tool
}

fn has_failure_word(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| FAILURE_WORDS.iter().any(|f| w.eq_ignore_ascii_case(f)))
}

fn failed(span: &Span) -> bool {
    span.status == StatusCode::Error || span.output.as_deref().is_some_and(has_failure_word)
}

/// The first-error baseline on one log's turns (in step order). `None` only for a log with no
/// agent turn at all.
pub fn first_error(turns: &[Span]) -> Option<(String, i64)> {
    let acting: Vec<&Span> = turns.iter().filter(|s| !is_task_giver(s)).collect();
    let blame = |s: &Span| Some((s.agent_name.clone()?, s.step?));
    for (i, span) in acting.iter().enumerate() {
        if !failed(span) {
            continue;
        }
        if is_execution(span) {
            if let Some(author) = acting[..i].iter().rev().find(|s| !is_execution(s)) {
                return blame(author);
            }
        }
        return blame(span);
    }
    acting
        .iter()
        .find(|s| !is_execution(s))
        .and_then(|s| blame(s))
}

/// The `.json` files of `dir` and its subdirectories, sorted by path.
pub fn log_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let entries = std::fs::read_dir(&d).map_err(|cause| Error::Io {
            path: d.clone(),
            cause,
        })?;
        for entry in entries {
            let entry = entry.map_err(|cause| Error::Io {
                path: d.clone(),
                cause,
            })?;
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                files.push(path);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(Error::Nothing {
            path: dir.to_path_buf(),
            reason: "no .json chat logs in this directory".into(),
        });
    }
    Ok(files)
}

/// Chat logs imported into a scratch store, with the labelled ones listed.
pub struct Imported {
    /// Holds the store; removed when dropped.
    _scratch: tempfile::TempDir,
    pub db: PathBuf,
    /// Labelled logs in file order: trace id, source file, label.
    pub logs: Vec<(String, String, traces::Label)>,
}

/// Imports every log under `dir` into a scratch store. Logs without a label are skipped; a log
/// that does not parse stops the run with the importer's error (file and JSON path).
pub fn import(dir: &Path) -> Result<Imported> {
    let files = log_files(dir)?;
    let scratch = tempfile::tempdir().map_err(|cause| Error::Io {
        path: std::env::temp_dir(),
        cause,
    })?;
    let db = scratch.path().join("chatlogs.sqlite");
    let store_err = |source| Error::Store {
        path: db.clone(),
        cause: Box::new(source),
    };
    let mut store = traces::Store::open(&db).map_err(store_err)?;
    let mut logs = Vec::new();
    for file in &files {
        let report = store
            .import_file(file, traces::Format::Chatlog)
            .map_err(|cause| Error::Import {
                cause: Box::new(cause),
            })?;
        for trace_id in &report.trace_ids {
            if let Some(label) = store
                .labels(trace_id)
                .map_err(store_err)?
                .into_iter()
                .find(|l| l.truth.agent.is_some() || l.truth.step.is_some())
            {
                logs.push((trace_id.clone(), file.display().to_string(), label));
            }
        }
    }
    if logs.is_empty() {
        return Err(Error::Nothing {
            path: dir.to_path_buf(),
            reason: format!(
                "none of its {} chat logs carries mistake_agent or mistake_step",
                files.len()
            ),
        });
    }
    Ok(Imported {
        _scratch: scratch,
        db,
        logs,
    })
}

/// Blames each labelled log under `dir` with a built-in detector: `first-error` (no tool
/// calls), or `expert` (its blame probes, then `answer: agent NAME step N`).
pub fn evaluate(
    dir: &Path,
    detector: &str,
    on_done: impl FnMut(&BlameCase),
) -> Result<Vec<BlameCase>> {
    if !BLAME_DETECTORS.contains(&detector) {
        return Err(Error::Detector(format!(
            "`{detector}` cannot blame chat logs; chat-log detectors: {}, or a checkpoint",
            BLAME_DETECTORS.join(", ")
        )));
    }
    let imported = import(dir)?;
    if detector == "first-error" {
        return first_error_cases(&imported, on_done);
    }
    evaluate_with(
        &imported,
        detect::Config::default(),
        |_| detect::policies::by_name(detector).map_err(Error::Detector),
        |_, _| {},
        on_done,
    )
}

impl Imported {
    /// A log's turns in step order.
    fn turns(&self, store: &traces::Store, trace_id: &str) -> Result<Vec<Span>> {
        let mut turns = store.spans(trace_id).map_err(|source| Error::Store {
            path: self.db.clone(),
            cause: Box::new(source),
        })?;
        turns.sort_by_key(|s| s.step);
        Ok(turns)
    }

    fn store(&self) -> Result<traces::Store> {
        traces::Store::open_read_only(&self.db).map_err(|source| Error::Store {
            path: self.db.clone(),
            cause: Box::new(source),
        })
    }
}

/// A log's case: its label and what was predicted.
fn case(
    (trace_id, source, label): &(String, String, traces::Label),
    predicted: Option<detect::Verdict>,
) -> BlameCase {
    BlameCase {
        trace_id: trace_id.clone(),
        source: source.clone(),
        truth: label.truth.clone(),
        predicted,
    }
}

fn first_error_cases(
    imported: &Imported,
    mut on_done: impl FnMut(&BlameCase),
) -> Result<Vec<BlameCase>> {
    let store = imported.store()?;
    let mut cases = Vec::new();
    for log in &imported.logs {
        let turns = imported.turns(&store, &log.0)?;
        let blamed = first_error(&turns).map(|(agent, step)| detect::Verdict::Blame {
            agent,
            step,
            evidence: "the first failed turn (its author for a failed execution)".into(),
        });
        let case = case(log, blamed);
        on_done(&case);
        cases.push(case);
    }
    Ok(cases)
}

/// Investigates each imported log with a fresh policy from `make_policy` (the Detector's tools
/// over the log imported as a trace) and reads its blame: `answer: agent NAME step N`, or a
/// deficiency answer `@step N` (blamed on the agent of that turn). No answer is a miss.
pub fn evaluate_with(
    imported: &Imported,
    config: detect::Config,
    mut make_policy: impl FnMut(&str) -> Result<Box<dyn detect::Policy>>,
    mut on_transcript: impl FnMut(&BlameCase, &detect::Transcript),
    mut on_done: impl FnMut(&BlameCase),
) -> Result<Vec<BlameCase>> {
    let detector = detect::Detector::new(imported.db.clone(), config, false)
        .map_err(|e| Error::Detector(format!("starting the detector: {e}")))?;
    let store = imported.store()?;
    let mut cases = Vec::new();
    for log in &imported.logs {
        let trace_id = &log.0;
        let policy = make_policy(trace_id)?;
        let transcript = detector
            .investigate(trace_id, policy)
            .map_err(|cause| Error::Detect {
                trace_id: trace_id.clone(),
                cause: Box::new(cause),
            })?;
        // A deficiency answer at a step blames that step's agent.
        let predicted = match transcript.verdict() {
            Some(v @ detect::Verdict::Blame { .. }) => Some(v.clone()),
            Some(detect::Verdict::Deficiency {
                step: Some(step),
                evidence,
                ..
            }) => store
                .agent_at_step(trace_id, *step)
                .map_err(|source| Error::Store {
                    path: imported.db.clone(),
                    cause: Box::new(source),
                })?
                .map(|agent| detect::Verdict::Blame {
                    agent,
                    step: *step,
                    evidence: evidence.clone(),
                }),
            _ => None,
        };
        let case = case(log, predicted);
        on_transcript(&case, &transcript);
        on_done(&case);
        cases.push(case);
    }
    Ok(cases)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(step: i64, agent: &str, text: &str, kind: SpanKind, status: StatusCode) -> Span {
        let mut s = Span::new("t", format!("{:016x}", step + 1), "chat.turn", kind);
        s.step = Some(step);
        s.agent_name = Some(agent.into());
        s.output = Some(text.into());
        s.status = status;
        s
    }

    #[test]
    fn failed_execution_is_blamed_on_the_code_author() {
        let turns = vec![
            turn(
                0,
                "human",
                "Why does this error?",
                SpanKind::Agent,
                StatusCode::Unset,
            ),
            turn(
                1,
                "Coder",
                "Here is the code",
                SpanKind::Agent,
                StatusCode::Unset,
            ),
            turn(
                2,
                "Computer_terminal",
                "exitcode: 1",
                SpanKind::Tool,
                StatusCode::Error,
            ),
            turn(
                3,
                "Checker",
                "There was an error",
                SpanKind::Agent,
                StatusCode::Unset,
            ),
        ];
        assert_eq!(first_error(&turns), Some(("Coder".into(), 1)));
    }

    #[test]
    fn failure_words_blame_their_own_turn_and_clean_logs_the_first_agent() {
        let turns = vec![
            turn(
                0,
                "Planner",
                "plan: search",
                SpanKind::Agent,
                StatusCode::Unset,
            ),
            turn(
                1,
                "Searcher",
                "Unable to open the page",
                SpanKind::Agent,
                StatusCode::Unset,
            ),
        ];
        assert_eq!(first_error(&turns), Some(("Searcher".into(), 1)));
        // "terrorism" holds "error" but not as a word.
        let clean = vec![
            turn(
                0,
                "Planner",
                "about terrorism",
                SpanKind::Agent,
                StatusCode::Unset,
            ),
            turn(1, "Searcher", "done", SpanKind::Agent, StatusCode::Unset),
        ];
        assert_eq!(first_error(&clean), Some(("Planner".into(), 0)));
        assert_eq!(first_error(&[]), None);
    }

    #[test]
    fn unknown_detectors_and_empty_directories_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = evaluate(dir.path(), "keyword", |_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("first-error, expert"), "{err}");
        let err = evaluate(dir.path(), "first-error", |_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("no .json chat logs"), "{err}");
    }
}
