//! The `query_history` tool: timestamped question → answer pairs of this investigation (or of
//! the whole run, when the caller shares one history between episodes). Every tool call the
//! main agent or a subagent makes is recorded (the call as the question, its observation as the
//! answer, clipped), and so is every delegated task with its summary.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// How much of an answer is kept (the history is for recall, not for re-reading raw output).
pub const ANSWER_CHARS: usize = 600;
/// Most entries one lookup returns.
pub const MAX_RESULTS: usize = 5;

/// One remembered exchange.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub unix_ms: u64,
    /// The investigated trace (matters when the history is shared across a run).
    pub trace_id: String,
    /// `main` or `subagent N`.
    pub agent: String,
    pub question: String,
    pub answer: String,
}

/// A thread-safe question → answer log.
#[derive(Debug, Default)]
pub struct QueryHistory {
    entries: Mutex<Vec<Entry>>,
}

impl QueryHistory {
    pub fn new() -> QueryHistory {
        QueryHistory::default()
    }

    pub fn record(&self, trace_id: &str, agent: &str, question: &str, answer: &str) {
        let entry = Entry {
            unix_ms: now_ms(),
            trace_id: trace_id.to_string(),
            agent: agent.to_string(),
            question: question.to_string(),
            answer: clip(answer, ANSWER_CHARS),
        };
        if let Ok(mut e) = self.entries.lock() {
            e.push(entry);
        }
    }

    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries most similar to `question` (shared words), newest first among equals, within
    /// `window` of now; when `trace_id` is given, only that investigation's entries.
    pub fn lookup(
        &self,
        question: &str,
        window: Option<Duration>,
        trace_id: Option<&str>,
    ) -> Vec<Entry> {
        let wanted = words(question);
        let now = now_ms();
        let entries = match self.entries.lock() {
            Ok(e) => e.clone(),
            Err(_) => return Vec::new(),
        };
        let mut scored: Vec<(f64, usize, Entry)> = entries
            .into_iter()
            .enumerate()
            .filter(|(_, e)| trace_id.is_none_or(|t| e.trace_id == t))
            .filter(|(_, e)| {
                window.is_none_or(|w| now.saturating_sub(e.unix_ms) <= w.as_millis() as u64)
            })
            .filter_map(|(i, e)| {
                let have = words(&format!("{} {}", e.question, e.answer));
                let shared = wanted.iter().filter(|w| have.contains(w)).count();
                (shared > 0).then(|| (shared as f64 / wanted.len().max(1) as f64, i, e))
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
        scored
            .into_iter()
            .take(MAX_RESULTS)
            .map(|(_, _, e)| e)
            .collect()
    }
}

/// Renders lookup results as the tool's observation.
pub fn render(entries: &[Entry], question: &str) -> String {
    if entries.is_empty() {
        return format!("no earlier question matches `{question}`; run a query instead");
    }
    let mut out = String::new();
    for e in entries {
        out.push_str(&format!(
            "[{} {}] Q: {}\nA: {}\n",
            clock(e.unix_ms),
            e.agent,
            e.question,
            e.answer
        ));
    }
    out
}

fn words(text: &str) -> Vec<String> {
    let mut w: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| w.len() >= 2)
        .map(str::to_lowercase)
        .filter(|w| {
            !matches!(
                w.as_str(),
                "the" | "and" | "from" | "select" | "where" | "of" | "in" | "by" | "to" | "is"
            )
        })
        .collect();
    w.sort();
    w.dedup();
    w
}

fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max).collect();
    s.push_str(" …");
    s
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `HH:MM:SS` (UTC) of a Unix time in milliseconds.
pub fn clock(unix_ms: u64) -> String {
    let s = (unix_ms / 1000) % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_ranks_by_shared_words_and_filters_by_trace() {
        let h = QueryHistory::new();
        h.record(
            "t1",
            "main",
            "sql: SELECT tool_name, errors FROM trace_tools",
            "search 3 errors",
        );
        h.record("t1", "subagent 1", "bash: jq .name spans.jsonl", "llm.chat");
        h.record(
            "t2",
            "main",
            "sql: SELECT tool_name FROM trace_tools",
            "other trace",
        );
        let found = h.lookup("errors by tool_name", None, Some("t1"));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].answer, "search 3 errors");
        assert_eq!(h.lookup("tool_name", None, None).len(), 2);
        assert!(h.lookup("nothing matches", None, None).is_empty());
        assert!(render(&found, "q").contains("] Q: sql: SELECT"));
    }

    #[test]
    fn clock_formats_utc() {
        assert_eq!(clock(3_600_000 + 61_000), "01:01:01");
    }
}
