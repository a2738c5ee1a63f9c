//! Labelled multi-agent chat logs built from a corpus: each injected trace in which two or more
//! agents speak becomes a log in the Who&When format (`history` of `{role, name, content}`, with
//! `mistake_agent` and `mistake_step`), so that blame detectors can be scored on logs whose
//! decisive turn is known rather than annotated: it is where the injected run first departs from
//! the clean run of the same task and seed (`departure`).
//!
//! Mapping: the task is turn 0 (`human`); then every model call and tool call in trace order —
//! a model call is its agent's message (its output, or its error when the call failed), a tool
//! call is a code-execution turn of the calling agent written as AutoGen writes them
//! (`exitcode: 0 (execution succeeded)\nCode output: …`, a non-zero code when the call failed), so
//! the importer reads it as a tool span. The mistake is the first turn at or after the departing
//! span, and its agent. Traces whose departure is in token counts alone (invisible in a chat
//! log) or whose turns come from one agent are left out, and counted.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use traces::{Span, SpanKind, StatusCode};

use crate::clean_twin::Departure;
use crate::error::CorpusError;
use crate::record::Record;

/// What an export wrote and left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Exported {
    pub written: usize,
    /// Records of other splits.
    pub other_split: usize,
    /// Records without a departure, or departing in token counts or length only.
    pub no_visible_departure: usize,
    /// Logs whose turns come from fewer than two agents.
    pub single_agent: usize,
}

/// What a log says about its origin.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub task: &'a str,
    pub agent: &'a str,
    pub deficiency: &'a str,
    pub template: &'a str,
}

/// One chat log for an injected trace's spans (in trace order), or why not.
pub fn chat_log(
    origin: Origin<'_>,
    departure: Option<&Departure>,
    spans: &[Span],
    question: &str,
) -> Result<Value, Skip> {
    let departure = departure
        .filter(|d| d.by == "behaviour")
        .ok_or(Skip::NoVisibleDeparture)?;
    let mut history = vec![json!({"role": "user", "name": "human", "content": question})];
    let mut mistake: Option<(usize, String)> = None;
    let mut agents = std::collections::BTreeSet::new();
    for (seq, span) in spans.iter().enumerate() {
        let Some(content) = turn_content(span) else {
            continue;
        };
        let agent = span
            .agent_name
            .clone()
            .unwrap_or_else(|| "agent".to_string());
        if mistake.is_none() && seq >= departure.seq {
            mistake = Some((history.len(), agent.clone()));
        }
        agents.insert(agent.clone());
        history.push(json!({"role": "assistant", "name": agent, "content": content}));
    }
    if agents.len() < 2 {
        return Err(Skip::SingleAgent);
    }
    let (step, agent) = mistake.ok_or(Skip::NoVisibleDeparture)?;
    Ok(json!({
        "question": question,
        "question_ID": origin.task,
        "framework": origin.agent,
        "history": history,
        "mistake_agent": agent,
        "mistake_step": step.to_string(),
        "mistake_reason": format!(
            "{} planted by {}: the injected run first departs from the clean run here",
            origin.deficiency, origin.template
        ),
    }))
}

/// Why a record made no log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    NoVisibleDeparture,
    SingleAgent,
}

/// A model or tool call as a chat turn; `None` for other spans.
fn turn_content(span: &Span) -> Option<String> {
    let failed = span.status == StatusCode::Error;
    let error = || {
        format!(
            "{}: {}",
            span.error_type.as_deref().unwrap_or("Error"),
            span.error_message
                .as_deref()
                .or(span.status_message.as_deref())
                .unwrap_or("")
        )
    };
    match span.kind {
        SpanKind::Llm if failed => Some(error()),
        SpanKind::Llm => Some(span.output.clone().unwrap_or_default()),
        SpanKind::Tool => {
            let name = span.tool_name.as_deref().unwrap_or(&span.name);
            let args = span.tool_arguments.as_deref().unwrap_or("");
            Some(if failed {
                format!(
                    "exitcode: 1 (execution failed)\nCode output: {name}({args}) raised {}",
                    error()
                )
            } else {
                format!(
                    "exitcode: 0 (execution succeeded)\nCode output: {name}({args}) returned {}",
                    span.output.as_deref().unwrap_or("")
                )
            })
        }
        _ => None,
    }
}

/// Writes one log per eligible record of `corpus`/corpus.jsonl (of `split` when given) into
/// `out` as `TRACE_ID.json`.
pub fn export(corpus: &Path, out: &Path, split: Option<&str>) -> Result<Exported, CorpusError> {
    export_where(corpus, out, |record| {
        split.is_none_or(|s| s == record.split)
    })
}

/// [`export`] of the records `keep` accepts (the others count as `other_split`): a split less
/// some frameworks, for a blamer trained without them.
pub fn export_where(
    corpus: &Path,
    out: &Path,
    keep: impl Fn(&Record) -> bool,
) -> Result<Exported, CorpusError> {
    let io = |path: PathBuf| move |source| CorpusError::Io { path, source };
    let records_path = corpus.join("corpus.jsonl");
    let text = std::fs::read_to_string(&records_path).map_err(io(records_path.clone()))?;
    let db = corpus.join("store.sqlite");
    let store = traces::Store::open_read_only(&db).map_err(|source| CorpusError::Store {
        path: db.clone(),
        source,
    })?;
    std::fs::create_dir_all(out).map_err(io(out.to_owned()))?;
    let mut done = Exported::default();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let record: Record = serde_json::from_str(line)
            .map_err(|e| CorpusError::Plan(format!("{}:{}: {e}", records_path.display(), i + 1)))?;
        if !keep(&record) {
            done.other_split += 1;
            continue;
        }
        let spans = store
            .spans(&record.trace_id)
            .map_err(|source| CorpusError::Store {
                path: db.clone(),
                source,
            })?;
        let question = spans
            .iter()
            .find(|s| s.parent_span_id.is_none() && s.input.is_some())
            .and_then(|s| s.input.clone())
            .unwrap_or_else(|| format!("task {}", record.manifest.task));
        let m = &record.manifest;
        let origin = Origin {
            task: &m.task,
            agent: &m.agent,
            deficiency: &m.deficiency,
            template: &m.template,
        };
        match chat_log(origin, record.departure.as_ref(), &spans, &question) {
            Ok(log) => {
                let path = out.join(format!("{}.json", record.trace_id));
                let body = serde_json::to_string_pretty(&log)
                    .map_err(|e| CorpusError::Plan(format!("{}: {e}", path.display())))?;
                std::fs::write(&path, body).map_err(io(path.clone()))?;
                done.written += 1;
            }
            Err(Skip::NoVisibleDeparture) => done.no_visible_departure += 1,
            Err(Skip::SingleAgent) => done.single_agent += 1,
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(id: u8, kind: SpanKind, agent: &str, output: &str) -> Span {
        let mut s = Span::new("t", format!("{id:016x}"), "s", kind);
        s.agent_name = Some(agent.into());
        s.output = Some(output.into());
        s
    }

    const ORIGIN: Origin<'static> = Origin {
        task: "gaia-001",
        agent: "roleplay",
        deficiency: "P3",
        template: "roleplay/P3-v.toml",
    };

    #[test]
    fn the_mistake_is_the_first_turn_at_or_after_the_departing_span() {
        let mut failed = span(4, SpanKind::Tool, "Analyst", "");
        failed.status = StatusCode::Error;
        failed.error_type = Some("ValueError".into());
        failed.error_message = Some("bad unit".into());
        failed.tool_name = Some("calculator".into());
        let spans = vec![
            span(1, SpanKind::Agent, "Lead", ""),
            span(2, SpanKind::Llm, "Lead", "Look up the table."),
            span(3, SpanKind::Chain, "Analyst", ""),
            failed,
            span(5, SpanKind::Llm, "Analyst", "The answer is 12."),
        ];
        let departure = Departure {
            seq: 2,
            span: format!("{:016x}", 3),
            step: Some(1),
            agent: Some("Analyst".into()),
            by: "behaviour".into(),
        };
        let log = chat_log(ORIGIN, Some(&departure), &spans, "Q?").unwrap();
        let history = log["history"].as_array().unwrap();
        assert_eq!(history.len(), 4, "{log}");
        assert_eq!(history[0]["name"], "human");
        assert_eq!(log["mistake_step"], "2");
        assert_eq!(log["mistake_agent"], "Analyst");
        assert!(history[2]["content"]
            .as_str()
            .unwrap()
            .starts_with("exitcode: 1 (execution failed)"));
        // Token-only departures and one-agent logs make none.
        let tokens = Departure {
            by: "tokens".into(),
            ..departure.clone()
        };
        assert_eq!(
            chat_log(ORIGIN, Some(&tokens), &spans, "Q?").unwrap_err(),
            Skip::NoVisibleDeparture
        );
        assert_eq!(
            chat_log(ORIGIN, None, &spans, "Q?").unwrap_err(),
            Skip::NoVisibleDeparture
        );
        let solo: Vec<Span> = spans
            .iter()
            .cloned()
            .map(|mut s| {
                s.agent_name = Some("Lead".into());
                s
            })
            .collect();
        assert_eq!(
            chat_log(ORIGIN, Some(&departure), &solo, "Q?").unwrap_err(),
            Skip::SingleAgent
        );
    }
}
