//! The framework-neutral span model every importer produces and the store keeps.
//!
//! One [`Span`] is one unit of agent work (an LLM call, a tool call, an agent turn, …). The
//! named fields are what analysts query most; `attributes` keeps everything the producer wrote,
//! so no information is lost when a convention is not mapped.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What kind of work a span represents (OpenInference's span kinds, reduced to the six the
/// Detector reasons about).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpanKind {
    Agent,
    Llm,
    Tool,
    Chain,
    Retriever,
    Other,
}

impl SpanKind {
    pub const ALL: [SpanKind; 6] = [
        SpanKind::Agent,
        SpanKind::Llm,
        SpanKind::Tool,
        SpanKind::Chain,
        SpanKind::Retriever,
        SpanKind::Other,
    ];

    /// The lowercase name stored in the `spans.kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            SpanKind::Agent => "agent",
            SpanKind::Llm => "llm",
            SpanKind::Tool => "tool",
            SpanKind::Chain => "chain",
            SpanKind::Retriever => "retriever",
            SpanKind::Other => "other",
        }
    }
}

impl fmt::Display for SpanKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SpanKind {
    type Err = String;

    /// Case-insensitive; unknown names are an error (not `other`) so typos surface.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        SpanKind::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(text))
            .ok_or_else(|| {
                format!("unknown span kind `{text}`; expected agent, llm, tool, chain, retriever or other")
            })
    }
}

/// The span's outcome, as in OpenTelemetry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "UPPERCASE")]
pub enum StatusCode {
    #[default]
    Unset,
    Ok,
    Error,
}

impl StatusCode {
    /// The uppercase name stored in the `spans.status_code` column.
    pub fn as_str(self) -> &'static str {
        match self {
            StatusCode::Unset => "UNSET",
            StatusCode::Ok => "OK",
            StatusCode::Error => "ERROR",
        }
    }

    /// Accepts `OK`/`ERROR`/`UNSET` in any case, with or without OTLP's `STATUS_CODE_` prefix.
    pub fn parse(text: &str) -> Option<StatusCode> {
        let upper = text.to_ascii_uppercase();
        match upper.strip_prefix("STATUS_CODE_").unwrap_or(&upper) {
            "UNSET" | "" => Some(StatusCode::Unset),
            "OK" => Some(StatusCode::Ok),
            "ERROR" => Some(StatusCode::Error),
            _ => None,
        }
    }
}

impl fmt::Display for StatusCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One span. Times are nanoseconds since the Unix epoch; chat-log turns have none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    #[serde(default)]
    pub parent_span_id: Option<String>,
    pub name: String,
    pub kind: SpanKind,
    #[serde(default)]
    pub start_time_ns: Option<i64>,
    #[serde(default)]
    pub end_time_ns: Option<i64>,
    #[serde(default)]
    pub status: StatusCode,
    #[serde(default)]
    pub status_message: Option<String>,
    #[serde(default)]
    pub error_type: Option<String>,
    #[serde(default)]
    pub error_message: Option<String>,
    #[serde(default)]
    pub input: Option<String>,
    #[serde(default)]
    pub output: Option<String>,
    #[serde(default)]
    pub input_tokens: Option<i64>,
    #[serde(default)]
    pub output_tokens: Option<i64>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub tool_name: Option<String>,
    #[serde(default)]
    pub tool_arguments: Option<String>,
    #[serde(default)]
    pub code_filepath: Option<String>,
    #[serde(default)]
    pub code_function: Option<String>,
    #[serde(default)]
    pub code_lineno: Option<i64>,
    #[serde(default)]
    pub agent_name: Option<String>,
    #[serde(default)]
    pub step: Option<i64>,
    /// Everything the producer wrote, as a JSON object (OTLP attribute unions are flattened to
    /// plain JSON values).
    #[serde(default)]
    pub attributes: Map<String, Value>,
    /// Timed events (OTLP span events such as `exception`), each `{name, time_unix_nano,
    /// attributes}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Value>,
}

impl Span {
    /// A span with only its identity set; importers fill the rest.
    pub fn new(
        trace_id: impl Into<String>,
        span_id: impl Into<String>,
        name: impl Into<String>,
        kind: SpanKind,
    ) -> Span {
        Span {
            trace_id: trace_id.into(),
            span_id: span_id.into(),
            parent_span_id: None,
            name: name.into(),
            kind,
            start_time_ns: None,
            end_time_ns: None,
            status: StatusCode::Unset,
            status_message: None,
            error_type: None,
            error_message: None,
            input: None,
            output: None,
            input_tokens: None,
            output_tokens: None,
            model: None,
            tool_name: None,
            tool_arguments: None,
            code_filepath: None,
            code_function: None,
            code_lineno: None,
            agent_name: None,
            step: None,
            attributes: Map::new(),
            events: Vec::new(),
        }
    }

    /// Whether the span counts as failed: status ERROR or an error type recorded.
    pub fn is_error(&self) -> bool {
        self.status == StatusCode::Error || self.error_type.is_some()
    }

    /// End minus start, when both are known and ordered.
    pub fn duration_ns(&self) -> Option<i64> {
        match (self.start_time_ns, self.end_time_ns) {
            (Some(s), Some(e)) => e.checked_sub(s),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_parses_case_insensitively_and_rejects_unknown() {
        assert_eq!("LLM".parse::<SpanKind>(), Ok(SpanKind::Llm));
        assert!("llmm".parse::<SpanKind>().unwrap_err().contains("llmm"));
    }

    #[test]
    fn status_accepts_otlp_prefix() {
        assert_eq!(
            StatusCode::parse("STATUS_CODE_ERROR"),
            Some(StatusCode::Error)
        );
        assert_eq!(StatusCode::parse("ok"), Some(StatusCode::Ok));
        assert_eq!(StatusCode::parse("bad"), None);
    }

    #[test]
    fn span_round_trips_through_serde() {
        let mut span = Span::new("t", "s", "llm.chat", SpanKind::Llm);
        span.input_tokens = Some(3);
        span.attributes.insert("k".into(), Value::from(1));
        let text = serde_json::to_string(&span).unwrap();
        assert_eq!(serde_json::from_str::<Span>(&text).unwrap(), span);
    }
}
