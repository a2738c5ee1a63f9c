//! The Detector's environment (paper §3.3–3.4): the tools a Detector policy investigates a
//! trace with, the episode protocol it plays, and two non-learned policies.
//!
//! - [`sql`]: one SELECT at a time on a guarded read-only connection to the trace store.
//! - [`shell`] + [`sandbox`]: allowlisted pipelines over the exported trace files, parsed here
//!   and run in bubblewrap sandboxes (no shell, no network, read-only files, rlimits).
//! - [`query_history`]: the query history; [`investigation`]: turns, subagents, limits; [`transcript`]:
//!   what an episode leaves, convertible to trace spans.
//! - [`action`]: the one text format every policy writes.
//! - [`probes`]: named SQL measurements whose rows are their own compact digest.
//! - [`policies`]: `keyword` (the paper's keyword baseline) and `expert` (a scripted
//!   investigator).
//!
//! Invariants: nothing here writes the trace store (SQL through a read-only, `query_only`,
//! authorizer-guarded connection; export through `traces::Store::open_read_only`); nothing runs
//! a pipeline outside the sandbox; ground truth (the `labels` table) is unreachable from every
//! tool. Transcripts are imported only by an explicit call with a writable store.

pub mod action;
pub mod env;
mod error;
pub mod investigation;
pub mod policies;
pub mod probes;
pub mod prompt;
pub mod query_history;
pub mod sandbox;
pub mod shell;
pub mod sql;
pub mod synthetic;
pub mod transcript;

pub use action::{Action, CodeLocation, Verdict};
pub use env::{
    Ablations, Actor, Config, Investigation, Observation, Reference, References, Status,
};
pub use error::{Error, Result};
pub use investigation::{Detector, Policy, View};
pub use transcript::{Outcome, Transcript, TurnRecord};
