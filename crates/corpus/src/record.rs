//! One published record of a corpus: what `corpus.jsonl`, the split files, the Parquet exports
//! and the chat logs are made of. Its own module so that the exports need not reach into
//! publishing, which calls them.

use serde::{Deserialize, Serialize};

use crate::injection::Manifest;

/// A published corpus record (`corpus.jsonl`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    pub split: String,
    pub trace_id: String,
    #[serde(flatten)]
    pub manifest: Manifest,
    /// Where the injected run first departs from the clean run (also the store label's `step`
    /// and `agent`). Derived from the two traces at publishing, so outside the digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub departure: Option<crate::clean_twin::Departure>,
}
