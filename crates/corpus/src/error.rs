//! The corpus crate's one error type, and the helper that names the file an I/O error was about.

use std::path::{Path, PathBuf};

use runner::EpisodeError;

#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Workspace(#[from] agents::workspace::WorkspaceError),
    #[error(transparent)]
    Run(#[from] agents::run::RunError),
    #[error(transparent)]
    Executor(#[from] runner::ExecutorError),
    #[error(transparent)]
    Episode(#[from] EpisodeError),
    #[error("--llm: {0}")]
    Llm(String),
    #[error(transparent)]
    History(#[from] agents::history::HistoryError),
    #[error("{0}")]
    Template(#[from] taxonomy::Problem),
    #[error("trace store {path}")]
    Store {
        path: PathBuf,
        #[source]
        source: traces::Error,
    },
    #[error("{0}")]
    Plan(String),
    #[error("{path}: Parquet export, {what}")]
    Parquet {
        path: PathBuf,
        what: String,
        #[source]
        source: parquet::errors::ParquetError,
    },
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CorpusError + '_ {
    move |source| CorpusError::Io {
        path: path.to_owned(),
        source,
    }
}
