//! The `model` backend: serving a locally loaded causal LM.
//!
//! This is an extension point, not an implementation. Generating text needs the decoder and
//! tokenizer of `crates/model`, which does not yet expose generation; until it does,
//! constructing this backend fails with [`ModelUnavailable`] so that `pathfinder serve
//! --backend model` says so plainly instead of answering requests with made-up text.
//!
//! To implement it: load the model and tokenizer in [`ModelBackend::new`], render the chat
//! messages (and tool definitions) with the model's chat template, sample with the request's
//! `temperature`, `top_p` and `seed`, parse tool calls from the generated text, and return a
//! [`crate::Completion`] from [`crate::ChatBackend::complete`]. Validation, the context window,
//! `max_tokens`, usage and SSE rendering are already done by the server around it.

use std::path::PathBuf;

use crate::api::{ApiError, ChatRequest, Completion};
use crate::backend::{ChatBackend, RequestContext};

/// The reason the model backend cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the model backend needs crates/model, not yet available (asked to load {weights:?})")]
pub struct ModelUnavailable {
    pub weights: Option<PathBuf>,
}

/// A backend that would generate with a local model; see the module documentation.
#[derive(Debug)]
pub struct ModelBackend {
    model_id: String,
}

impl ModelBackend {
    /// Always fails today: see [`ModelUnavailable`].
    pub fn new(weights: Option<PathBuf>) -> Result<ModelBackend, ModelUnavailable> {
        Err(ModelUnavailable { weights })
    }
}

impl ChatBackend for ModelBackend {
    fn name(&self) -> &str {
        "model"
    }

    fn models(&self) -> Vec<String> {
        vec![self.model_id.clone()]
    }

    fn complete(&self, _: &ChatRequest, _: &RequestContext) -> Result<Completion, ApiError> {
        Err(ApiError::server(
            501,
            "the model backend needs crates/model, not yet available",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_to_start_with_a_clear_reason() {
        let err = ModelBackend::new(None).unwrap_err();
        assert!(err.to_string().contains("needs crates/model"));
    }
}
