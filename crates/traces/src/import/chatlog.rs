//! Multi-agent chat logs (the Who&When format): `{"history": [{role, name?, content}], …}` with
//! optional labels `mistake_agent`, `mistake_step`, `mistake_reason`.
//!
//! Mapping (documented in SCHEMA.md):
//! - the trace id is the first 32 hex digits of the SHA-256 of the file, so re-importing the
//!   same log is detected as a duplicate;
//! - turn *i* becomes span `{i+1:016x}` with `step = i`, no parent and no times;
//! - the agent is `name`, or else `role` without a trailing parenthetical (Magentic-One writes
//!   `Orchestrator (thought)`, `Orchestrator (-> WebSurfer)`); raw `role`/`name` stay in the
//!   attributes as `chat.role`/`chat.name`;
//! - a turn whose content starts with `exitcode: N` (AutoGen's code executor) is a tool span
//!   `code_execution`, status ERROR with error type `exitcode N` when N ≠ 0, OK otherwise;
//!   every other turn is an `agent` span named `chat.turn` whose output is the content;
//! - `mistake_*` and `ground_truth` go to the `labels` table; the remaining top-level fields
//!   (question, level, is_correct, system prompts, …) become trace attributes.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::{describe_json_error, Batch, Located, TraceMeta};
use crate::conventions::value_int;
use crate::error::{Error, Result};
use crate::label::Label;
use crate::span::{Span, SpanKind, StatusCode};

/// Top-level fields that are ground truth, not observations.
const LABEL_FIELDS: &[&str] = &[
    "mistake_agent",
    "mistake_step",
    "mistake_reason",
    "ground_truth",
];

pub(super) fn parse(source: &str, text: &str) -> Result<Batch> {
    let doc: Value = serde_json::from_str(text).map_err(|err| {
        let (at, message) = describe_json_error(&err);
        Error::malformed(source, at, message)
    })?;
    let bad = |at: &str, reason: String| Error::malformed(source, at, reason);
    let root = doc.as_object().ok_or_else(|| {
        bad(
            "document",
            "expected a JSON object with a `history` list".into(),
        )
    })?;
    let history = root
        .get("history")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("history", "missing or not a list of turns".into()))?;
    let trace_id = content_id(text);

    let mut batch = Batch::default();
    for (step, turn) in history.iter().enumerate() {
        let at = format!("history[{step}]");
        let turn = turn
            .as_object()
            .ok_or_else(|| bad(&at, "expected an object {role, name?, content}".into()))?;
        let role = turn
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(&format!("{at}.role"), "missing or not a string".into()))?;
        let name = match turn.get("name") {
            None | Some(Value::Null) => None,
            Some(Value::String(n)) if n.trim().is_empty() => None,
            Some(Value::String(n)) => Some(n.as_str()),
            Some(other) => {
                return Err(bad(
                    &format!("{at}.name"),
                    format!("expected a string, got {other}"),
                ))
            }
        };
        let content = match turn.get("content") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => Some(c.clone()),
            // Multi-part content (lists of text/image parts) is kept as JSON text.
            Some(other) => Some(other.to_string()),
        };
        let agent = name
            .map(str::to_string)
            .unwrap_or_else(|| agent_from_role(role));
        let mut span = Span::new(
            trace_id.clone(),
            format!("{:016x}", step + 1),
            "chat.turn",
            SpanKind::Agent,
        );
        span.step = Some(step as i64);
        span.agent_name = Some(agent);
        span.attributes
            .insert("chat.role".into(), Value::from(role));
        if let Some(n) = name {
            span.attributes.insert("chat.name".into(), Value::from(n));
        }
        if let Some(code) = content.as_deref().and_then(exit_code) {
            span.kind = SpanKind::Tool;
            span.name = "code_execution".into();
            span.tool_name = Some("code_execution".into());
            if code == 0 {
                span.status = StatusCode::Ok;
            } else {
                span.status = StatusCode::Error;
                span.error_type = Some(format!("exitcode {code}"));
                span.error_message = content
                    .as_deref()
                    .and_then(|c| c.lines().next())
                    .map(str::to_string);
            }
        }
        span.output = content;
        batch.spans.push(Located::new(span, at));
    }

    let mut attributes = Map::new();
    for (key, value) in root {
        if key != "history" && !LABEL_FIELDS.contains(&key.as_str()) {
            attributes.insert(key.clone(), value.clone());
        }
    }
    let task = ["question_ID", "question_id", "task_id", "question"]
        .iter()
        .find_map(|k| root.get(*k).and_then(Value::as_str))
        .map(str::to_string);
    let framework = root
        .get("framework")
        .and_then(Value::as_str)
        .map(str::to_string);
    batch.meta.insert(
        trace_id.clone(),
        TraceMeta {
            attributes,
            task,
            framework,
        },
    );

    if LABEL_FIELDS.iter().any(|k| root.contains_key(*k)) {
        let mut label = Label::new(trace_id);
        label.truth.agent = root
            .get("mistake_agent")
            .and_then(Value::as_str)
            .map(str::to_string);
        label.reason = root
            .get("mistake_reason")
            .and_then(Value::as_str)
            .map(str::to_string);
        label.truth.step = match root.get("mistake_step") {
            None | Some(Value::Null) => None,
            Some(raw) => Some(value_int(raw).filter(|s| *s >= 0).ok_or_else(|| {
                bad(
                    "mistake_step",
                    format!("expected a non-negative step index, got {raw}"),
                )
            })?),
        };
        if let Some(step) = label.truth.step {
            if step as usize >= history.len() {
                batch.warnings.push(format!(
                    "mistake_step {step} is past the last turn ({} turns)",
                    history.len()
                ));
            }
        }
        let source: Map<String, Value> = LABEL_FIELDS
            .iter()
            .filter_map(|k| root.get(*k).map(|v| (k.to_string(), v.clone())))
            .collect();
        label.source = Value::Object(source);
        batch.labels.push(label);
    }
    Ok(batch)
}

/// 32 hex digits of SHA-256 over the file's bytes.
fn content_id(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// `Orchestrator (thought)` → `Orchestrator`; `WebSurfer` → `WebSurfer`.
fn agent_from_role(role: &str) -> String {
    let trimmed = role.trim();
    match trimmed.find(" (") {
        Some(i) if trimmed.ends_with(')') && i > 0 => trimmed[..i].to_string(),
        _ => trimmed.to_string(),
    }
}

/// AutoGen's code-executor result header: `exitcode: 124 (execution failed)`.
fn exit_code(content: &str) -> Option<i64> {
    let rest = content.trim_start().strip_prefix("exitcode:")?;
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_and_exit_codes() {
        assert_eq!(
            agent_from_role("Orchestrator (-> WebSurfer)"),
            "Orchestrator"
        );
        assert_eq!(agent_from_role("human"), "human");
        assert_eq!(
            exit_code("exitcode: 124 (execution failed)\nCode output: "),
            Some(124)
        );
        assert_eq!(exit_code("There is no code"), None);
    }

    #[test]
    fn turns_become_spans_and_labels_are_split_off() {
        let log = r#"{"question": "q?", "ground_truth": "8", "mistake_agent": "B", "mistake_step": "1",
            "mistake_reason": "wrong", "history": [
            {"role": "assistant", "name": "A", "content": "plan"},
            {"role": "user", "name": "Computer_terminal", "content": "exitcode: 1 (execution failed)\nboom"},
            {"role": "Orchestrator (thought)", "content": "next"}]}"#;
        let batch = parse("c.json", log).unwrap();
        assert_eq!(batch.spans.len(), 3);
        let tool = &batch.spans[1].span;
        assert_eq!(
            (tool.kind, tool.status),
            (SpanKind::Tool, StatusCode::Error)
        );
        assert_eq!(tool.error_type.as_deref(), Some("exitcode 1"));
        assert_eq!(
            batch.spans[2].span.agent_name.as_deref(),
            Some("Orchestrator")
        );
        let label = &batch.labels[0];
        assert_eq!(
            (label.truth.agent.as_deref(), label.truth.step),
            (Some("B"), Some(1))
        );
        let meta = &batch.meta[&tool.trace_id];
        assert!(
            meta.attributes.contains_key("question")
                && !meta.attributes.contains_key("ground_truth")
        );
    }

    #[test]
    fn bad_turns_and_labels_are_errors() {
        let err = parse("c.json", r#"{"history": [{"content": "x"}]}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "c.json: history[0].role: missing or not a string");
        let err = parse("c.json", r#"{"history": [], "mistake_step": "two"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mistake_step") && err.contains("\"two\""),
            "{err}"
        );
    }
}
