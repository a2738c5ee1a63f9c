//! `llmserve`: the OpenAI-compatible chat-completions server that Pathfinder's agents call.
//!
//! One HTTP surface (`POST /v1/chat/completions`, `GET /v1/models`, `GET /health`), JSON or
//! server-sent events, on TCP loopback or a Unix socket, in front of a [`ChatBackend`]:
//!
//! - [`ScriptedBackend`] replays each task's solution path from `agents/tasks/scripts/` with
//!   seeded surface variation, so runs are reproducible on CPU and only an injected deficiency
//!   makes a run diverge (see `agents/CONTRACT.md`, "Scripts").
//! - [`ModelBackend`] is the extension point for a locally served model; it refuses to start
//!   until `crates/model` can generate text.
//!
//! Everything a real provider checks before generating (parameter ranges, `tool_choice`,
//! `response_format`, tool schemas, message ordering, the context window) is checked here,
//! independent of the backend, so agents meet the same errors they would meet in production.

pub mod api;
pub mod backend;
pub mod limits;
pub mod model_backend;
pub mod rng;
pub mod script;
pub mod script_departure;
pub mod scripted;
pub mod server;
pub mod sse;
pub mod tokenizer;
pub mod validate;

pub use api::{ApiError, ChatRequest, Completion, FinishReason, ToolCallOut, Usage};
pub use backend::{ChatBackend, RequestContext};
pub use model_backend::ModelBackend;
pub use script::{Script, ScriptError, ScriptKey, ScriptStore, Step};
pub use scripted::ScriptedBackend;
pub use server::{BackgroundServer, Listen, ServeError, ServerConfig};

/// The context window every request is checked against, in approximate tokens.
pub const CONTEXT_WINDOW: usize = 8192;

/// The model name the scripted backend answers to (any name is accepted; this one is listed).
pub const SCRIPTED_MODEL: &str = "pathfinder-scripted";

/// The header that names the script, `NAME/TASK_ID/CONVERSATION`.
pub const SCRIPT_HEADER: &str = "x-pathfinder-script";

/// An error and its causes on one line (`outer: inner: innermost`), for messages that must be
/// complete on their own (HTTP error bodies, log lines).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}
