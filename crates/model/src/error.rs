//! Errors of the model crate: every variant names the file, field or tensor at fault.

use std::path::PathBuf;

/// Everything that can go wrong while loading, running or training a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A tensor operation failed (shape mismatch, unsupported dtype on this device, ...).
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON file (config.json, adapter_config.json, ...) is malformed.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A configuration field is missing or has an unusable value.
    #[error("{origin}: field `{field}`: {reason}")]
    Config {
        origin: String,
        field: String,
        reason: String,
    },
    /// A weight the architecture needs is absent or has the wrong shape.
    #[error("{origin}: tensor `{name}`: {reason}")]
    Weight {
        origin: String,
        name: String,
        reason: String,
    },
    /// The tokenizer could not be built or failed on some input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be rendered.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A named adapter does not exist, already exists, or does not fit the model.
    #[error("adapter `{name}`: {reason}")]
    Adapter { name: String, reason: String },
    /// The caller passed arguments that cannot work (empty batch, mismatched shapes, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Fetching a model into the cache failed.
    #[error("fetch {model}: {reason}")]
    Fetch { model: String, reason: String },
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn config(
        origin: impl Into<String>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        ModelError::Config {
            origin: origin.into(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn weight(
        origin: impl Into<String>,
        name: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        ModelError::Weight {
            origin: origin.into(),
            name: name.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn adapter(name: impl Into<String>, reason: impl Into<String>) -> Self {
        ModelError::Adapter {
            name: name.into(),
            reason: reason.into(),
        }
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
