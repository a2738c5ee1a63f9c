//! `agents`: Pathfinder's target agents as data and as runnable programs.
//!
//! Loads `agents/NAME/agent.toml` manifests and validates them against the component
//! vocabulary, loads the task suites, materialises an agent's git repository from its final
//! tree and its `history/` of fix patches (with git2, never the git binary), and runs one agent
//! on one task locally against the scripted LLM server, judging the result. See
//! `agents/CONTRACT.md` for the contract all of this implements.

pub mod answers;
pub mod history;
pub mod judge;
pub mod local;
pub mod manifest;
pub mod patch;
pub mod process;
pub mod python;
pub mod run;
pub mod tasks;
pub mod vendor;
pub mod workspace;

pub use history::{materialize, Materialized, Series};
pub use llmserve::error_chain;
pub use local::{run_suite, run_task, Endpoint, Llm, LocalOptions, SuiteReport};
pub use manifest::{AgentManifest, Site, TaskSuite};
pub use run::{AgentCommand, RunOutcome, RunSpec};
pub use tasks::{GaiaTask, SweTask, Task};
pub use workspace::{Agent, Workspace};
