//! `runner`: runs agents in isolation, because the agents it runs were changed on purpose.
//!
//! - [`image`]: the agent base image, built offline with debootstrap from the archive this
//!   machine's apt uses (recipes in `infra/`, see [`recipe`] and [`apt`]), imported through
//!   bollard, cached under the hash of its inputs.
//! - [`docker`]: one fresh container per command of an episode: network mode none (the LLM is
//!   a bind-mounted Unix socket), read-only root, the run directory as the only writable
//!   mount, memory/CPU/pids limits, a deadline, and removal on every path including ctrl-C.
//! - [`local`]: the same contract in a sandboxed subprocess (bubblewrap, unshare, cgroups,
//!   rlimits — whatever the machine allows) when no engine answers.
//! - [`episode`]: one agent on one task, judged and recorded; [`batch`]: many at once,
//!   bounded, with a progress bar and interruption handling.
//! - [`executor`]: the same, blocking, for corpus generation and the trainer's live episodes:
//!   one backend and endpoint per run, episodes from several threads, interruption that
//!   removes every sandbox before the process ends.
//! - [`audit`]: the in-sandbox monitor that lets a run report blocked network attempts.
//!
//! Depends on `agents` (command lines, run layout, result collection, judging) and
//! `llmserve` (through `agents`, the scripted server); never on the trace store.

pub mod apt;
pub mod audit;
pub mod backend;
pub mod batch;
pub mod cancel;
pub mod docker;
pub mod endpoint;
pub mod episode;
pub mod executor;
pub mod image;
pub mod local;
pub mod plan;
pub mod recipe;
pub mod session;
pub mod spec;

pub use backend::{Backend, BackendChoice, BackendError, ImageInputs};
pub use batch::{progress_bar, run_batch, run_batch_interruptible, BatchReport};
pub use cancel::Cancel;
pub use endpoint::{LlmChoice, LlmEndpoint};
pub use episode::run_episode;
pub use executor::{default_jobs, Executor, ExecutorError, ExecutorOptions};
pub use recipe::ImageRecipe;
pub use session::{run_blocking, RunRequest, SessionError, SessionReport, TaskSelection};
pub use spec::{Containment, EpisodeError, EpisodeOutcome, EpisodeSpec, Limits, Timing};
