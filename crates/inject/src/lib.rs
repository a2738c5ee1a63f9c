//! `inject`: the Injector engine — everything the Injector does except choosing.
//!
//! Loads and validates injection templates (`deficiencies/templates/`, data, not code),
//! applies them to a materialised agent repository with git2 (template, removal and
//! history-revert strategies), checks free-form diffs proposed by a model, commits each
//! injection on `inject/KEY` and writes the bug artifact with its ground-truth location.
//! Depends only on `taxonomy` and `agents`; it never runs an agent (that is `corpus`'s job).

pub mod artifact;
pub mod coverage;
pub mod engine;
pub mod python;
pub mod template;

pub use artifact::{inject_diff, inject_template, load_agent, Artifact};
pub use coverage::{check_templates, Checked, Coverage};
pub use engine::{apply_diff, apply_template, InjectError, Injection, Location, Options};
pub use template::{load_dir, Edit, Strategy, Template};
