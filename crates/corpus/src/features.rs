//! Comparable features of one agent trace (contract JSON Lines): what a clean and an injected
//! run of the same task and seed are compared on. Only run-to-run stable facts are kept (no
//! ids, no timestamps, no durations), so the same run gives the same features.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use traces::{Span, StatusCode};

/// The features of one trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceFeatures {
    pub spans: usize,
    /// Spans with status ERROR, by `error.type` (or the span name when it has none), and
    /// spans that record an exception the agent handled (`exception.message` or
    /// `pathfinder.fallback` without status ERROR: a reply it could not parse, a call it
    /// retried another way), as `handled KIND`. Both are errors the trace states outright.
    pub errors: BTreeMap<String, usize>,
    /// Tool names, each agent's (`gen_ai.agent.name`) in start order, agents by name.
    pub tool_calls: Vec<String>,
    pub llm_calls: usize,
    /// Sums of `gen_ai.usage.input_tokens` / `output_tokens` over LLM spans.
    pub input_tokens: i64,
    pub output_tokens: i64,
    /// Distinct `pathfinder.step_index` values.
    pub turns: usize,
    /// The root span's `pathfinder.outcome` (`completed|failed|gave_up|crashed`), or `missing`.
    pub outcome: String,
    pub answer: Option<String>,
    /// Per LLM call: `gen_ai.response.finish_reasons`, as written.
    #[serde(default)]
    pub finish_reasons: Vec<String>,
    /// Per LLM call: `model temperature max_tokens` as requested.
    #[serde(default)]
    pub requests: Vec<String>,
    /// Per tool call: `gen_ai.tool.call.arguments` (the model's text, so stable per script).
    #[serde(default)]
    pub tool_arguments: Vec<String>,
    /// Spans by name: hooks, callbacks and reporters leave spans of their own, and a
    /// deficiency that loses them (P23) shows as names that vanish while LLM and tool spans go
    /// on. Stable from run to run: the agents emit spans deterministically for a script.
    #[serde(default)]
    pub span_names: BTreeMap<String, usize>,
}

impl TraceFeatures {
    pub fn error_count(&self) -> usize {
        self.errors.values().sum()
    }

    /// Reads a trace file through the trace model ([`traces::Span`]); lines that are no
    /// valid span are skipped (the run's trace check reports them).
    pub fn from_file(path: &Path) -> std::io::Result<TraceFeatures> {
        let text = String::from_utf8_lossy(&std::fs::read(path)?).into_owned();
        Ok(TraceFeatures::from_jsonl(&text))
    }

    /// The features of an agent's JSON Lines trace (see [`TraceFeatures::from_spans`]).
    pub fn from_jsonl(text: &str) -> TraceFeatures {
        TraceFeatures::from_spans(&traces::import::spans_lenient(text))
    }

    /// The features of one run's spans, in any order (they are put in each agent's start
    /// order here).
    pub fn from_spans(spans: &[Span]) -> TraceFeatures {
        let mut spans: Vec<&Span> = spans.iter().collect();
        // Each agent's spans in its own start order: agents that work in parallel (research's
        // researchers) interleave differently from run to run, and that order is no behaviour.
        spans.sort_by_cached_key(|s| {
            let agent = s
                .attributes
                .get("gen_ai.agent.name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            (agent, s.start_time_ns.unwrap_or(0))
        });
        let mut f = TraceFeatures {
            spans: spans.len(),
            outcome: "missing".into(),
            ..TraceFeatures::default()
        };
        let mut steps = std::collections::BTreeSet::new();
        for span in spans {
            let attr = |k: &str| span.attributes.get(k);
            let name = span.name.as_str();
            *f.span_names.entry(name.to_owned()).or_insert(0) += 1;
            if let Some(step) = attr("pathfinder.step_index").and_then(Value::as_i64) {
                steps.insert(step);
            }
            let kind = attr("error.type").and_then(Value::as_str).unwrap_or(name);
            if span.status == StatusCode::Error {
                *f.errors.entry(kind.to_owned()).or_insert(0) += 1;
            } else if attr("exception.message").is_some() || attr("pathfinder.fallback").is_some() {
                *f.errors.entry(format!("handled {kind}")).or_insert(0) += 1;
            }
            match attr("gen_ai.operation.name").and_then(Value::as_str) {
                Some("chat") => {
                    f.llm_calls += 1;
                    let text = |k: &str| attr(k).map(scalar).unwrap_or_default();
                    f.finish_reasons
                        .push(text("gen_ai.response.finish_reasons"));
                    f.requests.push(format!(
                        "{} {} {}",
                        text("gen_ai.request.model"),
                        text("gen_ai.request.temperature"),
                        text("gen_ai.request.max_tokens")
                    ));
                    f.input_tokens += attr("gen_ai.usage.input_tokens")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    f.output_tokens += attr("gen_ai.usage.output_tokens")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                }
                Some("execute_tool") => {
                    f.tool_calls.push(
                        attr("gen_ai.tool.name")
                            .and_then(Value::as_str)
                            .unwrap_or("?")
                            .to_owned(),
                    );
                    f.tool_arguments.push(
                        attr("gen_ai.tool.call.arguments")
                            .map(scalar)
                            .unwrap_or_default(),
                    );
                }
                _ => {}
            }
            if name == "agent.run" {
                if let Some(o) = attr("pathfinder.outcome").and_then(Value::as_str) {
                    f.outcome = o.to_owned();
                }
                f.answer = attr("pathfinder.answer")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
            }
        }
        f.turns = steps.len();
        f
    }
}

/// A JSON value as text: strings unquoted, anything else as compact JSON.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// How an injected run's features differ from the clean run's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeatureDiff {
    /// Error kinds whose count grew, with (clean, injected) counts.
    pub errors: BTreeMap<String, (usize, usize)>,
    pub tool_calls_changed: bool,
    pub llm_calls: (usize, usize),
    pub input_tokens: (i64, i64),
    pub output_tokens: (i64, i64),
    pub turns: (usize, usize),
    pub outcome: (String, String),
    pub answer_changed: bool,
    #[serde(default)]
    pub finish_reasons_changed: bool,
    #[serde(default)]
    pub requests_changed: bool,
    #[serde(default)]
    pub tool_arguments_changed: bool,
    /// Span names whose count changed, with (clean, injected) counts.
    #[serde(default)]
    pub span_names: BTreeMap<String, (usize, usize)>,
}

impl FeatureDiff {
    pub fn between(clean: &TraceFeatures, injected: &TraceFeatures) -> FeatureDiff {
        let mut errors = BTreeMap::new();
        for (kind, n) in &injected.errors {
            let before = clean.errors.get(kind).copied().unwrap_or(0);
            if *n > before {
                errors.insert(kind.clone(), (before, *n));
            }
        }
        let mut span_names = BTreeMap::new();
        for name in clean.span_names.keys().chain(injected.span_names.keys()) {
            let before = clean.span_names.get(name).copied().unwrap_or(0);
            let after = injected.span_names.get(name).copied().unwrap_or(0);
            if before != after {
                span_names.insert(name.clone(), (before, after));
            }
        }
        FeatureDiff {
            span_names,
            errors,
            tool_calls_changed: clean.tool_calls != injected.tool_calls,
            llm_calls: (clean.llm_calls, injected.llm_calls),
            input_tokens: (clean.input_tokens, injected.input_tokens),
            output_tokens: (clean.output_tokens, injected.output_tokens),
            turns: (clean.turns, injected.turns),
            outcome: (clean.outcome.clone(), injected.outcome.clone()),
            answer_changed: clean.answer != injected.answer,
            finish_reasons_changed: clean.finish_reasons != injected.finish_reasons,
            requests_changed: clean.requests != injected.requests,
            tool_arguments_changed: clean.tool_arguments != injected.tool_arguments,
        }
    }

    /// The names of the features that differ.
    pub fn differing(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if !self.errors.is_empty() {
            out.push("errors");
        }
        if self.tool_calls_changed {
            out.push("tool_calls");
        }
        if self.llm_calls.0 != self.llm_calls.1 {
            out.push("llm_calls");
        }
        if self.input_tokens.0 != self.input_tokens.1
            || self.output_tokens.0 != self.output_tokens.1
        {
            out.push("tokens");
        }
        if self.turns.0 != self.turns.1 {
            out.push("turns");
        }
        if self.outcome.0 != self.outcome.1 {
            out.push("outcome");
        }
        if self.answer_changed {
            out.push("answer");
        }
        if self.finish_reasons_changed {
            out.push("finish_reasons");
        }
        if self.requests_changed {
            out.push("requests");
        }
        if self.tool_arguments_changed {
            out.push("tool_arguments");
        }
        if !self.span_names.is_empty() {
            out.push("spans");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(name: &str, start: i64, status: &str, attrs: Value) -> String {
        serde_json::json!({
            "trace_id": "t", "span_id": format!("{start}"), "name": name, "kind": "other",
            "start_time_unix_nano": start, "end_time_unix_nano": start + 1,
            "status": {"code": status}, "attributes": attrs,
        })
        .to_string()
    }

    #[test]
    fn features_and_their_difference() {
        let clean = [
            span("agent.run", 0, "OK", serde_json::json!({"pathfinder.outcome": "completed", "pathfinder.answer": "42", "pathfinder.step_index": 0})),
            span("llm.chat", 1, "OK", serde_json::json!({"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 3, "pathfinder.step_index": 0})),
            span("tool", 2, "OK", serde_json::json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search", "pathfinder.step_index": 1})),
        ]
        .join("\n");
        let f = TraceFeatures::from_jsonl(&clean);
        assert_eq!(f.tool_calls, ["search"]);
        assert_eq!(
            (f.llm_calls, f.input_tokens, f.output_tokens, f.turns),
            (1, 10, 3, 2)
        );
        assert_eq!(f.outcome, "completed");
        assert_eq!(FeatureDiff::between(&f, &f).differing(), Vec::<&str>::new());

        let injected = [
            span("agent.run", 0, "ERROR", serde_json::json!({"pathfinder.outcome": "crashed", "error.type": "KeyError", "pathfinder.step_index": 0})),
            span("llm.chat", 1, "OK", serde_json::json!({"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 3, "pathfinder.step_index": 0})),
        ]
        .join("\nnot json\n");
        let g = TraceFeatures::from_jsonl(&injected);
        assert_eq!(g.errors.get("KeyError"), Some(&1));
        let d = FeatureDiff::between(&f, &g);
        assert_eq!(
            d.differing(),
            [
                "errors",
                "tool_calls",
                "turns",
                "outcome",
                "answer",
                "tool_arguments",
                "spans"
            ]
        );
        assert_eq!(d.span_names.get("tool"), Some(&(1, 0)));

        // A failure the agent handled (a fallback, the exception recorded) is an error too.
        let handled = [
            span("agent.run", 0, "OK", serde_json::json!({"pathfinder.outcome": "completed", "pathfinder.answer": "42", "pathfinder.step_index": 0})),
            span("society.specify_task", 1, "OK", serde_json::json!({"pathfinder.fallback": "bare question as plan", "exception.message": "no JSON object", "pathfinder.step_index": 0})),
        ]
        .join("\n");
        let h = TraceFeatures::from_jsonl(&handled);
        assert_eq!(h.errors.get("handled society.specify_task"), Some(&1));
        assert_eq!(h.error_count(), 1);
    }

    #[test]
    fn parallel_agents_interleaving_differently_give_the_same_features() {
        let tool = |agent: &str, start: i64, name: &str| {
            span(
                "tool",
                start,
                "OK",
                serde_json::json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.agent.name": agent, "pathfinder.step_index": 1}),
            )
        };
        // Two researchers at work in parallel: one run has a's search first, the other b's.
        let one = [
            tool("a", 1, "search"),
            tool("b", 2, "read_file"),
            tool("a", 3, "calculator"),
        ]
        .join("\n");
        let two = [
            tool("b", 1, "read_file"),
            tool("a", 2, "search"),
            tool("a", 3, "calculator"),
        ]
        .join("\n");
        let (f, g) = (
            TraceFeatures::from_jsonl(&one),
            TraceFeatures::from_jsonl(&two),
        );
        assert_eq!(f.tool_calls, ["search", "calculator", "read_file"]);
        assert_eq!(FeatureDiff::between(&f, &g).differing(), Vec::<&str>::new());
        // Within one agent, order is still behaviour.
        let swapped = [
            tool("a", 1, "calculator"),
            tool("b", 2, "read_file"),
            tool("a", 3, "search"),
        ]
        .join("\n");
        let h = TraceFeatures::from_jsonl(&swapped);
        assert!(FeatureDiff::between(&f, &h)
            .differing()
            .contains(&"tool_calls"));
    }
}
