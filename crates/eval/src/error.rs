//! Errors that stop an evaluation. Each names the file (and line) or trace at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // Causes are printed in the message, not chained, so `{:#}` does not repeat them.
    #[error("trace store {path}: {cause}")]
    Store {
        path: PathBuf,
        cause: Box<traces::Error>,
    },
    /// A chat log the importer refused; its error names the file and the JSON path.
    #[error("chat log not imported: {cause}")]
    Import { cause: Box<traces::Error> },
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("split file {path}: line {line}: {reason}")]
    Split {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("investigating trace {trace_id}: {cause}")]
    Detect {
        trace_id: String,
        cause: Box<detect::Error>,
    },
    #[error("label file {path}: line {line}: {reason}")]
    Labels {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("detector: {0}")]
    Detector(String),
    #[error("deficiency catalog: {0}")]
    Catalog(String),
    #[error("{path}: no labelled traces to evaluate ({reason})")]
    Nothing { path: PathBuf, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
