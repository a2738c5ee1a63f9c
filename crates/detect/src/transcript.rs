//! Episode transcripts: every turn's text, parsed call, observation, timings and token counts,
//! with subagents' transcripts nested under the turn that started them. Serialisable as JSON,
//! and convertible to and from [`traces::Span`]s so an episode can be imported into a trace
//! store (the self-play trainer turns failed investigations into training examples) and read
//! back without loss.
//!
//! Span layout (one trace per episode, trace id = `episode_id`):
//! - `detect.episode` (kind agent, root) or `detect.subagent` (under its delegate call):
//!   input = system prompt, output = the verdict or summary, status ERROR when the episode
//!   ended without one.
//! - `detect.turn` (kind llm) per turn: output = the policy's text, output_tokens.
//! - `detect.tool.<tool>` (kind tool) or `detect.malformed` (kind other) under each turn:
//!   tool_arguments = the call, output = the observation, status ERROR unless the call went
//!   through.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use traces::{Span, SpanKind, StatusCode};

use crate::action::{Action, Verdict};
use crate::env::{Actor, Observation, Status};
use crate::error::{Error, Result};

/// How an episode ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    Answered {
        verdict: Verdict,
    },
    /// A subagent's final summary.
    Summary {
        text: String,
    },
    TurnLimit,
    TokenBudget,
    PolicyError {
        message: String,
    },
}

impl Outcome {
    pub fn describe(&self) -> String {
        match self {
            Outcome::Answered { verdict } => verdict.render(),
            Outcome::Summary { text } => format!("summary: {text}"),
            Outcome::TurnLimit => "turn limit reached".into(),
            Outcome::TokenBudget => "token budget exhausted".into(),
            Outcome::PolicyError { message } => format!("policy failed: {message}"),
        }
    }
}

/// One turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub index: usize,
    pub started_unix_ns: i64,
    /// When the policy's text was ready (policy time = acted − started).
    pub acted_unix_ns: i64,
    /// When the observation was ready (tool time = ended − acted).
    pub ended_unix_ns: i64,
    /// What the policy wrote.
    pub text: String,
    pub thought: String,
    /// The parsed call; `None` when the text was malformed.
    pub action: Option<Action>,
    pub observation: Observation,
    pub action_tokens: usize,
    pub observation_tokens: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subagents: Vec<Transcript>,
}

/// One episode of one agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transcript {
    /// 32 hex digits; the trace id when imported.
    pub episode_id: String,
    pub investigated_trace: String,
    pub role: Actor,
    pub task: Option<String>,
    pub policy: String,
    pub system_prompt: String,
    pub started_unix_ns: i64,
    pub ended_unix_ns: i64,
    pub prompt_tokens: usize,
    /// Prompt, calls and observations.
    pub total_tokens: usize,
    pub turns: Vec<TurnRecord>,
    pub outcome: Outcome,
}

impl Transcript {
    pub fn verdict(&self) -> Option<&Verdict> {
        match &self.outcome {
            Outcome::Answered { verdict } => Some(verdict),
            _ => None,
        }
    }

    /// The verdict when it names a deficiency (or `none`); a blame answer names no type, so
    /// detection scores and rewards read it as no answer.
    pub fn deficiency_verdict(&self) -> Option<&Verdict> {
        self.verdict().filter(|v| v.deficiency_id().is_some())
    }

    /// Human-readable rendering of the whole investigation (the CLI's `--transcript`).
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_into(&mut out, "");
        out
    }

    fn render_into(&self, out: &mut String, indent: &str) {
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "{indent}== {} ({}) on trace {}{}",
            self.role.label(),
            self.policy,
            self.investigated_trace,
            self.task
                .as_deref()
                .map(|t| format!(": {t}"))
                .unwrap_or_default()
        );
        for t in &self.turns {
            let ms = (t.ended_unix_ns - t.acted_unix_ns) as f64 / 1e6;
            let _ = writeln!(
                out,
                "{indent}-- turn {} ({} + {} tokens, tool {ms:.1} ms)",
                t.index + 1,
                t.action_tokens,
                t.observation_tokens
            );
            for line in t.text.lines() {
                let _ = writeln!(out, "{indent}> {line}");
            }
            for s in &t.subagents {
                s.render_into(out, &format!("{indent}    "));
            }
            for line in t.observation.text.lines() {
                let _ = writeln!(out, "{indent}  {line}");
            }
        }
        let _ = writeln!(
            out,
            "{indent}== outcome: {} ({} tokens)",
            self.outcome.describe(),
            self.total_tokens
        );
    }

    /// The episode as spans of one trace (see the module docs for the layout).
    pub fn to_spans(&self) -> Vec<Span> {
        let mut spans = Vec::new();
        let mut next = 0u32;
        self.push_spans(&self.episode_id, None, &mut next, &mut spans);
        spans
    }

    fn push_spans(
        &self,
        trace_id: &str,
        parent: Option<String>,
        next: &mut u32,
        spans: &mut Vec<Span>,
    ) {
        let root_id = next_id(next);
        let name = if parent.is_none() {
            "detect.episode"
        } else {
            "detect.subagent"
        };
        let mut root = Span::new(trace_id, root_id.clone(), name, SpanKind::Agent);
        root.parent_span_id = parent;
        root.start_time_ns = Some(self.started_unix_ns);
        root.end_time_ns = Some(self.ended_unix_ns);
        let ok = matches!(
            self.outcome,
            Outcome::Answered { .. } | Outcome::Summary { .. }
        );
        root.status = if ok {
            StatusCode::Ok
        } else {
            StatusCode::Error
        };
        if !ok {
            root.status_message = Some(self.outcome.describe());
        }
        root.input = Some(self.system_prompt.clone());
        root.output = Some(self.outcome.describe());
        root.input_tokens = Some(self.prompt_tokens as i64);
        root.agent_name = Some(self.role.label());
        root.attributes = attrs(&[
            ("pathfinder.framework", json!("pathfinder-detect")),
            ("pathfinder.task_id", json!(self.investigated_trace)),
            (
                "pathfinder.outcome",
                json!(if ok { "completed" } else { "failed" }),
            ),
            ("pathfinder.answer", json!(self.outcome.describe())),
            ("pathfinder.detect.episode_id", json!(self.episode_id)),
            (
                "pathfinder.detect.role",
                serde_json::to_value(self.role).unwrap_or(Value::Null),
            ),
            ("pathfinder.detect.task", json!(self.task)),
            ("pathfinder.detect.policy", json!(self.policy)),
            ("pathfinder.detect.total_tokens", json!(self.total_tokens)),
            (
                "pathfinder.detect.outcome",
                serde_json::to_value(&self.outcome).unwrap_or(Value::Null),
            ),
        ]);
        spans.push(root);
        for t in &self.turns {
            let turn_id = next_id(next);
            let mut turn = Span::new(trace_id, turn_id.clone(), "detect.turn", SpanKind::Llm);
            turn.parent_span_id = Some(root_id.clone());
            turn.start_time_ns = Some(t.started_unix_ns);
            turn.end_time_ns = Some(t.acted_unix_ns);
            turn.status = StatusCode::Ok;
            turn.output = Some(t.text.clone());
            turn.output_tokens = Some(t.action_tokens as i64);
            turn.model = Some(self.policy.clone());
            turn.agent_name = Some(self.role.label());
            turn.step = Some(t.index as i64);
            turn.attributes = attrs(&[
                ("pathfinder.step_index", json!(t.index)),
                ("pathfinder.detect.thought", json!(t.thought)),
            ]);
            spans.push(turn);
            let tool_id = next_id(next);
            let (name, kind) = match &t.action {
                Some(a) => (format!("detect.tool.{}", a.tool()), SpanKind::Tool),
                None => ("detect.malformed".to_string(), SpanKind::Other),
            };
            let mut tool = Span::new(trace_id, tool_id.clone(), name, kind);
            tool.parent_span_id = Some(turn_id);
            tool.start_time_ns = Some(t.acted_unix_ns);
            tool.end_time_ns = Some(t.ended_unix_ns);
            tool.status = if t.observation.status == Status::Ok {
                StatusCode::Ok
            } else {
                StatusCode::Error
            };
            if t.observation.status != Status::Ok {
                tool.status_message = Some(format!("{:?}", t.observation.status).to_lowercase());
            }
            tool.tool_name = t.action.as_ref().map(|a| a.tool().to_string());
            tool.tool_arguments = t.action.as_ref().map(|a| a.render());
            tool.output = Some(t.observation.text.clone());
            tool.output_tokens = Some(t.observation_tokens as i64);
            tool.agent_name = Some(self.role.label());
            tool.step = Some(t.index as i64);
            tool.attributes = attrs(&[
                ("pathfinder.step_index", json!(t.index)),
                (
                    "pathfinder.detect.action",
                    serde_json::to_value(&t.action).unwrap_or(Value::Null),
                ),
                (
                    "pathfinder.detect.status",
                    serde_json::to_value(t.observation.status).unwrap_or(Value::Null),
                ),
                ("pathfinder.detect.cut_from", json!(t.observation.cut_from)),
            ]);
            spans.push(tool);
            for sub in &t.subagents {
                sub.push_spans(trace_id, Some(tool_id.clone()), next, spans);
            }
        }
    }

    /// Rebuilds a transcript from the spans [`Transcript::to_spans`] wrote (for instance read
    /// back from a store with [`traces::Store::spans`]).
    pub fn from_spans(spans: &[Span]) -> Result<Transcript> {
        let mut children: HashMap<Option<&str>, Vec<&Span>> = HashMap::new();
        for s in spans {
            children
                .entry(s.parent_span_id.as_deref())
                .or_default()
                .push(s);
        }
        let roots: Vec<&Span> = children.get(&None).cloned().unwrap_or_default();
        let [root] = roots.as_slice() else {
            return Err(Error::Transcript(format!(
                "expected one root span, found {}",
                roots.len()
            )));
        };
        if root.name != "detect.episode" {
            return Err(Error::Transcript(format!(
                "root span `{}` is not a detect.episode",
                root.name
            )));
        }
        rebuild(root, &children)
    }
}

fn rebuild(root: &Span, children: &HashMap<Option<&str>, Vec<&Span>>) -> Result<Transcript> {
    let bad =
        |what: &str| Error::Transcript(format!("span {} ({}): {what}", root.span_id, root.name));
    let get = |key: &str| root.attributes.get(key).cloned().unwrap_or(Value::Null);
    let parse = |key: &str| -> Result<Value> {
        let v = get(key);
        if v.is_null() && key != "pathfinder.detect.task" {
            return Err(bad(&format!("missing attribute {key}")));
        }
        Ok(v)
    };
    let mut turns_spans: Vec<&Span> = children
        .get(&Some(root.span_id.as_str()))
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.name == "detect.turn")
        .collect();
    turns_spans.sort_by_key(|s| s.step);
    let mut turns = Vec::new();
    for turn in turns_spans {
        let tbad = |what: &str| Error::Transcript(format!("turn span {}: {what}", turn.span_id));
        let tool = children
            .get(&Some(turn.span_id.as_str()))
            .and_then(|c| c.first().copied())
            .ok_or_else(|| tbad("no tool span under it"))?;
        let action: Option<Action> = serde_json::from_value(
            tool.attributes
                .get("pathfinder.detect.action")
                .cloned()
                .unwrap_or(Value::Null),
        )
        .map_err(|e| tbad(&format!("action: {e}")))?;
        let status: Status = serde_json::from_value(
            tool.attributes
                .get("pathfinder.detect.status")
                .cloned()
                .unwrap_or(Value::Null),
        )
        .map_err(|e| tbad(&format!("status: {e}")))?;
        let cut_from: Option<usize> = serde_json::from_value(
            tool.attributes
                .get("pathfinder.detect.cut_from")
                .cloned()
                .unwrap_or(Value::Null),
        )
        .map_err(|e| tbad(&format!("cut_from: {e}")))?;
        let mut subagents = Vec::new();
        for sub in children
            .get(&Some(tool.span_id.as_str()))
            .cloned()
            .unwrap_or_default()
        {
            if sub.name == "detect.subagent" {
                subagents.push(rebuild(sub, children)?);
            }
        }
        subagents.sort_by_key(|t| match t.role {
            Actor::Subagent(n) => n,
            Actor::Main => 0,
        });
        turns.push(TurnRecord {
            index: turn.step.unwrap_or(0) as usize,
            started_unix_ns: turn.start_time_ns.unwrap_or(0),
            acted_unix_ns: turn.end_time_ns.unwrap_or(0),
            ended_unix_ns: tool.end_time_ns.unwrap_or(0),
            text: turn.output.clone().unwrap_or_default(),
            thought: turn
                .attributes
                .get("pathfinder.detect.thought")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            action,
            observation: Observation {
                text: tool.output.clone().unwrap_or_default(),
                status,
                cut_from,
            },
            action_tokens: turn.output_tokens.unwrap_or(0) as usize,
            observation_tokens: tool.output_tokens.unwrap_or(0) as usize,
            subagents,
        });
    }
    Ok(Transcript {
        episode_id: decode(root, parse("pathfinder.detect.episode_id")?, "episode_id")?,
        investigated_trace: decode(root, parse("pathfinder.task_id")?, "task_id")?,
        role: decode(root, parse("pathfinder.detect.role")?, "role")?,
        task: decode(root, get("pathfinder.detect.task"), "task")?,
        policy: decode(root, parse("pathfinder.detect.policy")?, "policy")?,
        system_prompt: root.input.clone().unwrap_or_default(),
        started_unix_ns: root.start_time_ns.unwrap_or(0),
        ended_unix_ns: root.end_time_ns.unwrap_or(0),
        prompt_tokens: root.input_tokens.unwrap_or(0) as usize,
        total_tokens: decode(
            root,
            parse("pathfinder.detect.total_tokens")?,
            "total_tokens",
        )?,
        turns,
        outcome: decode(root, parse("pathfinder.detect.outcome")?, "outcome")?,
    })
}

fn next_id(next: &mut u32) -> String {
    *next += 1;
    format!("{:016x}", *next as u64)
}

fn decode<T: serde::de::DeserializeOwned>(root: &Span, v: Value, key: &str) -> Result<T> {
    serde_json::from_value(v).map_err(|e| {
        Error::Transcript(format!("span {} ({}): {key}: {e}", root.span_id, root.name))
    })
}

fn attrs(items: &[(&str, Value)]) -> Map<String, Value> {
    items
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// 32 hex digits, unique per call within a process and very likely across processes.
pub fn fresh_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut a = std::collections::hash_map::RandomState::new().build_hasher();
    a.write_u64(n);
    a.write_i64(now_ns());
    a.write_u32(std::process::id());
    let mut b = std::collections::hash_map::RandomState::new().build_hasher();
    b.write_u64(a.finish());
    b.write_u64(n);
    format!("{:016x}{:016x}", a.finish(), b.finish())
}
