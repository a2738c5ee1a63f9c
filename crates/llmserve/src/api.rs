//! The wire types of the chat-completions API and its error shape.
//!
//! Requests are kept close to JSON (`serde_json::Value` for the polymorphic fields) because
//! validation must report *what* is wrong with a field, which a strict typed parse cannot.

use serde::Deserialize;
use serde_json::{json, Map, Value};

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with a status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {kind}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `server_error`, …
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<String>,
}

impl ApiError {
    /// A 400 `invalid_request_error` about `param`.
    pub fn invalid(param: impl Into<Option<String>>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.into(),
            code: None,
        }
    }

    pub fn with_code(mut self, code: &str) -> ApiError {
        self.code = Some(code.to_owned());
        self
    }

    pub fn not_found(message: impl Into<String>, code: &str) -> ApiError {
        ApiError {
            status: 404,
            message: message.into(),
            kind: "not_found_error",
            param: None,
            code: Some(code.to_owned()),
        }
    }

    pub fn server(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The JSON body sent to the client.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// Request fields the server understands; anything else is rejected like the real API does.
const KNOWN_FIELDS: &[&str] = &[
    "model",
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "seed",
    "stop",
    "user",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "metadata",
    "store",
];

/// One message of the prompt.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Value>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// The text of `content`: a string, or the concatenated `text` parts of a part array.
    pub fn text(&self) -> String {
        match &self.content {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        }
    }
}

/// A chat-completions request after JSON parsing (not yet validated; see [`crate::validate`]).
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub n: Option<i64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<Value>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub response_format: Option<Value>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Option<Value>,
}

impl ChatRequest {
    /// Parses a request body, reporting the byte position of malformed JSON and rejecting
    /// unknown fields by name.
    pub fn parse(body: &[u8]) -> Result<ChatRequest, ApiError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::invalid(
                None,
                format!(
                    "We could not parse the JSON body of your request: {} (line {}, column {}).",
                    e,
                    e.line(),
                    e.column()
                ),
            )
            .with_code("invalid_json")
        })?;
        let Value::Object(map) = &value else {
            return Err(ApiError::invalid(
                None,
                "The request body must be a JSON object.",
            ));
        };
        check_known_fields(map)?;
        for required in ["model", "messages"] {
            if !map.contains_key(required) {
                return Err(ApiError::invalid(
                    Some(required.to_owned()),
                    format!("Missing required parameter: '{required}'."),
                )
                .with_code("missing_required_parameter"));
            }
        }
        serde_json::from_value(value).map_err(|e| {
            ApiError::invalid(None, format!("Invalid request body: {e}.")).with_code("invalid_type")
        })
    }

    pub fn streaming(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// `stream_options.include_usage`.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// The completion budget: `max_completion_tokens`, else `max_tokens`.
    pub fn completion_limit(&self) -> Option<usize> {
        self.max_completion_tokens
            .or(self.max_tokens)
            .map(|n| n.max(0) as usize)
    }

    /// The names of the offered tools.
    pub fn tool_names(&self) -> Vec<String> {
        self.tools
            .iter()
            .flatten()
            .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
            .map(str::to_owned)
            .collect()
    }

    /// Whether the request allows the model to call tools at all.
    pub fn tools_allowed(&self) -> bool {
        let offered = self.tools.as_ref().is_some_and(|t| !t.is_empty());
        offered && self.tool_choice.as_ref().and_then(Value::as_str) != Some("none")
    }

    /// The stop sequences, if any.
    pub fn stop_sequences(&self) -> Vec<String> {
        match &self.stop {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// What the prompt says after the model's last reply: the tool results, or the
    /// observation a text-command agent sends as a user message, joined by newlines. `None`
    /// before the model's first reply.
    pub fn last_observation(&self) -> Option<String> {
        let last_reply = self.messages.iter().rposition(|m| m.role == "assistant")?;
        let texts: Vec<String> = self.messages[last_reply + 1..]
            .iter()
            .filter(|m| m.role == "tool" || m.role == "user")
            .map(Message::text)
            .collect();
        Some(texts.join("\n"))
    }

    /// The number of assistant messages already in the prompt: the script step to play.
    pub fn assistant_turns(&self) -> usize {
        self.messages
            .iter()
            .filter(|m| m.role == "assistant")
            .count()
    }

    /// Where the conversation's task was sent again: the number of assistant messages after
    /// the last user message that repeats the first one word for word, when the model had
    /// replied before it. `None` when the task was sent once (or is empty).
    pub fn turns_since_task_repeated(&self) -> Option<usize> {
        let first = self.messages.iter().position(|m| m.role == "user")?;
        let task = self.messages[first].text();
        if task.trim().is_empty() {
            return None;
        }
        let again = self
            .messages
            .iter()
            .enumerate()
            .skip(first + 1)
            .rfind(|(_, m)| m.role == "user" && m.text() == task)?
            .0;
        let replied = self.messages[first..again]
            .iter()
            .any(|m| m.role == "assistant");
        replied.then(|| {
            self.messages[again..]
                .iter()
                .filter(|m| m.role == "assistant")
                .count()
        })
    }
}

fn check_known_fields(map: &Map<String, Value>) -> Result<(), ApiError> {
    for key in map.keys() {
        if !KNOWN_FIELDS.contains(&key.as_str()) {
            return Err(ApiError::invalid(
                Some(key.clone()),
                format!("Unrecognized request argument supplied: {key}"),
            )
            .with_code("unknown_parameter"));
        }
    }
    Ok(())
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// One tool call in a completion; `arguments` is JSON text (possibly cut short by `length`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallOut {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// What a backend produced for one request, before rendering as JSON or SSE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCallOut>,
    pub finish_reason: FinishReason,
    /// Seeds the surface variation of the rendering (chunk lengths, keep-alives).
    pub variation_seed: u64,
    /// A streamed rendering breaks off halfway: no finish reason, no usage, no `[DONE]`.
    pub cut_stream: bool,
}

/// Token usage as the server counted it (see [`crate::tokenizer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }
}

/// Identity of one response: `id`, `created`, `model`.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// The non-streaming response body.
pub fn completion_json(meta: &ResponseMeta, completion: &Completion, usage: Usage) -> Value {
    let mut message = json!({"role": "assistant", "content": completion.content});
    if !completion.tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(
            completion
                .tool_calls
                .iter()
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect(),
        );
    }
    json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": completion.finish_reason.as_str(),
        }],
        "usage": usage.to_json(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_json_reports_position() {
        let err = ChatRequest::parse(b"{\"model\": \"x\",\n \"messages\": [}").unwrap_err();
        assert_eq!(err.status, 400);
        assert!(err.message.contains("line 2"), "{}", err.message);
        assert_eq!(err.code.as_deref(), Some("invalid_json"));
    }

    #[test]
    fn unknown_field_is_named() {
        let err = ChatRequest::parse(br#"{"model":"m","messages":[],"temprature":1}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("temprature"));
    }

    #[test]
    fn missing_messages_is_named() {
        let err = ChatRequest::parse(br#"{"model":"m"}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages"));
    }

    #[test]
    fn assistant_turns_counts_assistant_messages() {
        let req = ChatRequest::parse(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"},
            {"role":"assistant","content":"a"},{"role":"user","content":"b"}]}"#,
        )
        .unwrap();
        assert_eq!(req.assistant_turns(), 1);
    }
}
