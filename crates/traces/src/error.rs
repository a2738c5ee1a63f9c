//! Errors of the trace store. Every malformed-input error names where (file and line, byte
//! offset or JSON path) and why, so a user can fix the producer.

use std::path::PathBuf;

/// Anything that can go wrong while importing, storing or exporting traces.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Input that cannot be imported. `input` is the file (or `<spans>` for in-memory input),
    /// `at` the line, byte offset or JSON path inside it.
    #[error("{input}: {at}: {reason}")]
    Malformed {
        input: String,
        at: String,
        reason: String,
    },

    /// Trace ids are unique per store; a second import of the same trace is refused whole.
    #[error("{input}: trace {trace_id} is already in the store (imported from {existing}); trace ids are unique per store, so nothing of this input was imported")]
    DuplicateTrace {
        input: String,
        trace_id: String,
        existing: String,
    },

    #[error("trace {0} is not in the store")]
    UnknownTrace(String),

    #[error("cannot detect the format of {path}: {reason}; pass --format otlp|jsonl|chatlog")]
    UnknownFormat { path: PathBuf, reason: String },

    #[error("{path}: store schema version {found}, this build reads version {expected}")]
    SchemaVersion {
        path: PathBuf,
        found: String,
        expected: String,
    },

    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),

    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    pub(crate) fn malformed(
        input: &str,
        at: impl Into<String>,
        reason: impl Into<String>,
    ) -> Error {
        Error::Malformed {
            input: input.to_string(),
            at: at.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
