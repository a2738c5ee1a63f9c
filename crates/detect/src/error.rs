//! Errors that stop an investigation before or outside its episode. Problems inside an episode
//! (refused queries, malformed calls) are observations, never errors.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("trace store {path}: {source}")]
    Store {
        path: PathBuf,
        #[source]
        source: traces::Error,
    },
    #[error("trace {trace_id} is not in the store {path}")]
    UnknownTrace { path: PathBuf, trace_id: String },
    #[error(transparent)]
    SqlOpen(#[from] crate::sql::SqlOpenError),
    #[error("episode directory: {0}")]
    EpisodeDir(String),
    #[error("deficiency catalog: {0}")]
    Catalog(String),
    #[error("policy {policy}: {message}")]
    Policy { policy: String, message: String },
    #[error("transcript: {0}")]
    Transcript(String),
    #[error("async runtime: {0}")]
    Runtime(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
