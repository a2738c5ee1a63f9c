//! The seam between the HTTP surface and whatever produces completions.

use crate::api::{ApiError, ChatRequest, Completion};

/// What the server knows about a request besides its body.
#[derive(Debug, Clone, Default)]
pub struct RequestContext {
    /// The `X-Pathfinder-Script` header, if sent.
    pub script_key: Option<String>,
}

/// Produces one completion for a validated request.
///
/// The server validates the request and checks the context window before calling
/// [`ChatBackend::complete`], and applies `max_tokens` and `stop` afterwards, so a backend only
/// decides *what* the model says. It must be deterministic in the request, `seed` included,
/// for scripted runs to be reproducible.
pub trait ChatBackend: Send + Sync + 'static {
    /// A short name for logs and `/health` (`scripted`, `model`).
    fn name(&self) -> &str;

    /// The model ids listed by `GET /v1/models`.
    fn models(&self) -> Vec<String>;

    /// The completion for `request`; errors are sent to the client as they are.
    fn complete(&self, request: &ChatRequest, ctx: &RequestContext)
        -> Result<Completion, ApiError>;
}
