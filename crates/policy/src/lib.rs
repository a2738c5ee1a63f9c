//! `policy`: the two learned policies of self-play, as code that turns a model with LoRA
//! adapters into choices, and records exactly which tokens it produced so that training can
//! score them again.
//!
//! - [`chat`]: conversations built token by token in ChatML, so the prompt of every turn is a
//!   prefix of the whole episode and one forward pass scores all of a policy's replies.
//! - [`grammar`]: token tries and the Detector's action grammar (constrained decoding), so a
//!   small model always writes a well-formed call and a valid answer.
//! - [`detector`]: [`LearnedDetector`], a `detect::Policy` over a shared [`PolicyModel`].
//! - [`batched_decoding`]: [`TurnBatcher`], several learned investigations decoded together, a row each
//!   in one KV cache.
//! - [`injector`]: the Injector's choice among the engine's valid injections.
//! - [`decision`]: the Detector's answer as one whole choice: the probe battery's digests
//!   read by the model, then a softmax head over the types (and `none`) and the components.
//! - [`calibration`]: the head's operating point set on a user's own healthy runs (a
//!   conformal threshold on its deficiency score).
//! - [`frame`]: a framework's typical head input, which a framed head reads every trace of
//!   that framework relative to.
//! - [`demonstration`]: an expert transcript rewritten as the learned Detector's conversation
//!   (supervised warm start).
//! - [`prompt`]: the short prompts a 135M-parameter model can be trained on.
//! - [`blame`]: a model's blame on a multi-agent chat log: the expert's per-turn measurements,
//!   then one choice among the log's turns.
//! - [`blame_head`]: the learned blamer, a conditional-logit head over each acting turn's
//!   measurements (fitted and trained by `rl::blame`), as a `detect::Policy`.
//! - [`baseline`]: the one-prompt Detector of the zero-shot and RAG baselines (the bare base
//!   model reads the trace as text and answers once, under the answer-only grammar).
//!
//! Invariants: never writes files; runs models only through `model`'s generation API; the
//! tokens a [`Conversation`] holds are exactly those the model saw and produced (no
//! re-tokenisation of generated text); depends on `model`, `detect` and `taxonomy`.

pub mod baseline;
pub mod batched_decoding;
pub mod blame;
pub mod blame_head;
pub mod calibration;
pub mod chat;
pub mod decision;
pub mod demonstration;
pub mod detector;
pub mod frame;
pub mod grammar;
pub mod injector;
pub mod policy_model;
pub mod prompt;

pub use batched_decoding::TurnBatcher;
pub use chat::{ChatFormat, Conversation};
pub use demonstration::{demonstration, DemoAnswer};
pub use detector::{investigate_many, DetectorOptions, LearnedDetector};
pub use grammar::{ActionGrammar, ChoiceGrammar, TokenTrie};
pub use injector::{
    choose_injection, injector_grammar, write_diff, write_diffs, DiffRequest, InjectionOption,
    InjectorChoice,
};
pub use policy_model::{PolicyModel, SharedModel};

/// What can go wrong in a policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Model(#[from] model::ModelError),
    /// The model's chat template is not one these policies can build turn by turn.
    #[error("chat format: {0}")]
    ChatFormat(String),
    /// A grammar could not be built (e.g. an empty set of choices).
    #[error("grammar: {0}")]
    Grammar(String),
    /// A prompt that cannot fit its budget (the one-prompt baselines).
    #[error("prompt: {0}")]
    Prompt(String),
    /// A decision head or calibration file that cannot be read or written.
    #[error("decision head: {0}")]
    Io(String),
    /// A calibration that cannot be set (no healthy runs, a rate out of range).
    #[error("calibration: {0}")]
    Calibration(String),
    /// A batch of investigations decoded together failed, or a row was used after leaving.
    #[error("batched decoding: {0}")]
    Batch(String),
}

pub type Result<T> = std::result::Result<T, PolicyError>;
