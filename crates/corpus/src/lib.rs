//! `corpus`: consistency validation of injections and generation of labelled trace corpora.
//!
//! Sits after `inject`, `agents`, `traces` and `detect` in the data flow: it runs clean and
//! injected agents (the `agents` crate's local run path against the in-process scripted LLM),
//! compares their traces on stable features, asks the keyword baseline whether it names the
//! type, and publishes validated episodes as a store, manifests, splits, JSON Lines and Parquet.

pub mod chatlogs;
pub mod clean_twin;
pub mod confusability;
pub mod error;
pub mod features;
mod files;
pub mod generate;
pub mod injection;
pub mod merge;
pub mod non_trivial;
pub mod parquet;
pub mod planning;
pub mod publish;
pub mod record;
pub mod sweep;
pub mod validate;

pub use confusability::Confusability;
pub use features::{FeatureDiff, TraceFeatures};
pub use generate::{
    clean_trace_path, episode_dir_name, generate, manifest_path, plan, CorpusError, EpisodeRunner,
    Finish, GenerateOptions, Manifest, Planned, Report, RunSummary, Shard,
};
pub use merge::merge;
pub use validate::{Check, NonTriviality, Validation};
