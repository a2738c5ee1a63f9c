//! Evaluation (paper §6): how well a Detector names and places the deficiency in labelled
//! traces, and how well a blame baseline finds the responsible agent and step in labelled
//! multi-agent chat logs.
//!
//! - [`bootstrap`]: seeded percentile bootstrap confidence intervals.
//! - [`metrics`]: pure functions from per-trace cases to the paper's figures (detection,
//!   localisation, tool calls, per category, confusion; agent and step accuracy).
//! - [`store_eval`]: runs a Detector policy over every labelled trace of a store (or a split).
//! - [`classifier`]: the non-LM reference, a linear reader of the probe digests fitted on a
//!   train split.
//! - [`nearest`]: the second non-LM reference, the k train traces whose digests are most
//!   similar vote on the answer.
//! - [`chatlog`]: imports a directory of chat logs into a temporary store and runs the
//!   first-error blame baseline on each.
//! - [`report`]: the Markdown report.
//!
//! Invariants: metrics and reports do no I/O; nothing here writes a store it did not create
//! (the store under evaluation is opened read-only); labels are read only to score answers,
//! never shown to a detector.

pub mod bootstrap;
pub mod chatlog;
pub mod classifier;
mod error;
pub mod metrics;
pub mod nearest;
pub mod report;
pub mod store_eval;

pub use bootstrap::{Bootstrap, Estimate};
pub use error::{Error, Result};
