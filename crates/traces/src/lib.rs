//! Pathfinder's trace store.
//!
//! Agents of any framework leave traces; the Detector investigates them with SQL. This crate
//! turns OTLP/JSON, the agents' JSON Lines and multi-agent chat logs into one span model
//! ([`Span`]), stores them in SQLite ([`Store`], schema in `SCHEMA.md`), keeps ground truth in
//! a separate `labels` table ([`Label`]), describes a store for a prompt
//! ([`schema::discover`]) and exports one trace as the files a shell tool reads
//! ([`Store::export_trace`]).
//!
//! Invariants: an import is one transaction (a rejected input leaves the store unchanged);
//! trace ids are unique per store; nothing outside the `labels` table (and so nothing
//! [`schema::discover`] or [`Store::export_trace`] produce) contains ground truth.

pub mod assemble;
pub mod conventions;
mod error;
pub mod import;
mod label;
pub mod queries;
pub mod redact;
pub mod schema;
mod span;
mod store;

pub use error::{Error, Result};
pub use import::{Format, ImportOptions, ImportReport};
pub use label::{Label, Truth};
pub use span::{Span, SpanKind, StatusCode};
pub use store::{ExportedTrace, Store, EVENTS_VIEW_SQL, SCHEMA_SQL, SCHEMA_VERSION};
